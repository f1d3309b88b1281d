"""SentencePiece GGUF vocabularies (`tokenizer.ggml.model` = `llama`, model/gguf_tokenizer.py): 2,000 strings
(unicode, whitespace runs, digits, code, emoji, special and user-defined tokens) tokenize and decode as
transformers' tokenizer built from the same file (`gguf_file=`), with a vocabulary trained in the test by
`sentencepiece` (BPE, byte fallback), written as llama.cpp's converter writes it: pieces, scores, types.
"""

from __future__ import annotations

import io
import random
from pathlib import Path

import numpy as np
import pytest
import sentencepiece as spm
from flotilla_server.model import load_model
from flotilla_server.model.config import UnsupportedModelError
from gguf import GGUFWriter

from .gguf_files import LAYERS, TEMPLATE
from .test_gguf_tokenizer_qwen2 import PIECES, random_text

CONTROL_SYMBOLS = ["<|im_start|>", "<|im_end|>"]
USER_SYMBOLS = ["<think>"]
# what tells a SentencePiece tokenizer apart: leading and doubled spaces, the pieces' own "▁", its named tokens
SPM_PIECES = [" ", "  lead", "▁", "▁▁x", "<s>", "</s>", "<unk>", "<think>", " <think> ", "<|im_start|> user",
              "\x00", "\u200b", "ﬁ", "Ⅻ"]
HIDDEN, FFN, HEADS = 64, 64, 4


def spm_text(rng: random.Random) -> str:
    text = random_text(rng)
    for _ in range(rng.randint(0, 2)):
        at = rng.randint(0, len(text))
        text = text[:at] + rng.choice(SPM_PIECES) + text[at:]
    return text


@pytest.fixture(scope="module")
def texts() -> list[str]:
    rng = random.Random(40)
    return [spm_text(rng) for _ in range(2000)]


@pytest.fixture(scope="module")
def vocab(texts: list[str]) -> tuple[list[str], list[float], list[int]]:
    return trained_pieces(texts)


def trained_pieces(texts: list[str]) -> tuple[list[str], list[float], list[int]]:
    """(pieces, scores, types) of a SentencePiece BPE model trained on the texts, as convert_hf_to_gguf.py
    reads them; a piece's type is SentencePiece's own (1 normal, 2 unknown, 3 control, 4 user-defined, 6 byte)."""
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(texts[:400] + PIECES * 200), model_writer=model, model_type="bpe", vocab_size=1000,
        byte_fallback=True, character_coverage=0.98, normalization_rule_name="identity",
        remove_extra_whitespaces=False, allow_whitespace_only_pieces=True, split_digits=True,
        control_symbols=CONTROL_SYMBOLS, user_defined_symbols=USER_SYMBOLS, minloglevel=2)
    sp = spm.SentencePieceProcessor(model_proto=model.getvalue())
    pieces = [sp.id_to_piece(i) for i in range(sp.get_piece_size())]
    types = [2 if sp.is_unknown(i) else 3 if sp.is_control(i) else 6 if sp.is_byte(i)
             else 4 if pieces[i] in USER_SYMBOLS else 1 for i in range(len(pieces))]
    return pieces, [sp.get_score(i) for i in range(len(pieces))], types


def write_spm_gguf(path: Path, pieces: list[str], scores: list[float] | None, types: list[int],
                   **fields: bool) -> Path:
    """A tiny random Llama GGUF (float32) carrying the SentencePiece vocabulary (`scores` None: none written);
    `fields`: boolean metadata."""
    rng = np.random.default_rng(0)
    w = GGUFWriter(str(path), "llama")
    w.add_block_count(LAYERS)
    w.add_context_length(512)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(FFN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(HEADS)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_vocab_size(len(pieces))
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(pieces)
    if scores is not None:
        w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_unk_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    w.add_chat_template(TEMPLATE)
    for key, value in fields.items():
        w.add_bool(key, value)

    def tensor(name: str, *shape: int, centre: float = 0.0) -> None:
        w.add_tensor(name, (centre + rng.normal(0, 0.08, shape)).astype(np.float32))

    tensor("token_embd.weight", len(pieces), HIDDEN)
    for i in range(LAYERS):
        for part, rows, cols in (("attn_q", HIDDEN, HIDDEN), ("attn_k", HIDDEN, HIDDEN), ("attn_v", HIDDEN, HIDDEN),
                                 ("attn_output", HIDDEN, HIDDEN), ("ffn_gate", FFN, HIDDEN),
                                 ("ffn_up", FFN, HIDDEN), ("ffn_down", HIDDEN, FFN)):
            tensor(f"blk.{i}.{part}.weight", rows, cols)
        tensor(f"blk.{i}.attn_norm.weight", HIDDEN, centre=1.0)
        tensor(f"blk.{i}.ffn_norm.weight", HIDDEN, centre=1.0)
    tensor("output_norm.weight", HIDDEN, centre=1.0)
    tensor("output.weight", len(pieces), HIDDEN)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_sentencepiece_vocabulary_equals_transformers_on_2000_strings(tmp_path: Path, texts: list[str],
                                                                     vocab: tuple) -> None:
    from transformers import AutoTokenizer

    pieces, scores, types = vocab
    assert {1, 2, 3, 4, 6} <= set(types), "normal, unknown, control, user-defined and byte pieces"
    path = write_spm_gguf(tmp_path / "spm.gguf", pieces, scores, types)
    ours = load_model(str(path)).tokenizer
    reference = AutoTokenizer.from_pretrained(str(tmp_path), gguf_file=path.name)
    assert ours.encode("hi") == reference.encode("hi") and ours.encode("hi")[0] == 1, "BOS first"
    unseen = ours.encode("\u0378", add_special_tokens=False)  # U+0378, unassigned: its UTF-8 bytes CD B8
    assert [pieces[i] for i in unseen] == ["▁", "<0xCD>", "<0xB8>"] and ours.decode(unseen) == "\u0378"
    for text in texts:
        got = ours.encode(text)
        assert got == reference.encode(text), text
        assert ours.decode(got, skip_special_tokens=False) == reference.decode(got, skip_special_tokens=False), text
        assert ours.decode(got) == reference.decode(got, skip_special_tokens=True), text


def test_prefix_space_follows_the_file(tmp_path: Path, vocab: tuple) -> None:
    pieces, scores, types = vocab
    with_prefix = load_model(str(write_spm_gguf(tmp_path / "a.gguf", pieces, scores, types))).tokenizer
    without = load_model(str(write_spm_gguf(tmp_path / "b.gguf", pieces, scores, types,
                                            **{"tokenizer.ggml.add_space_prefix": False}))).tokenizer
    ids = with_prefix.encode("hello", add_special_tokens=False)
    assert with_prefix.decode(ids) == "hello" and pieces[ids[0]].startswith("▁")
    ids = without.encode("hello", add_special_tokens=False)
    assert without.decode(ids) == "hello" and not pieces[ids[0]].startswith("▁")


def test_a_sentencepiece_vocabulary_without_scores_is_refused(tmp_path: Path, vocab: tuple) -> None:
    pieces, _, types = vocab
    path = write_spm_gguf(tmp_path / "m.gguf", pieces, None, types)
    with pytest.raises(UnsupportedModelError, match=r"m\.gguf: its SentencePiece vocabulary has no score"):
        load_model(str(path))
