"""The `qwen2` pre-tokenizer of a GGUF's byte-level BPE vocabulary (model/gguf_tokenizer.py): 2,000 strings
(unicode, whitespace runs, digits, code, emoji, special tokens) tokenize as transformers' tokenizer built from the
same file (`gguf_file=`, its own GGUF tokenizer mapping), with a vocabulary trained in the test under Llama 3's
rule (which keeps runs of up to 3 digits), so that its merges join digits too: the qwen2 rule must still split
every digit alone, which is all that tells the two rules apart.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from flotilla_server.model import load_model
from tokenizers import Regex, models, pre_tokenizers, trainers
from tokenizers import Tokenizer as HFTokenizer

from .gguf_files import SPECIAL
from .test_gguf_qwen import write_decoder_gguf

LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")
PIECES = ["the", " quick", "brown", "fox", "Ärger", "naïve", "日本語", "中文", "привет", "مرحبا", "😀", "👩‍💻", "🇫🇷",
          "12345", "3.14159", "2024-05-01", "0x1F", "def f(x):", "return x**2", "{'a': [1, 2]}", "if (a && b) {",
          "    ", "\t", "\n", "\r\n", "  \n\n ", "'s", "'LL", "don't", "I'm", "$100", "#include <stdio.h>", "a\u00a0b",
          "e\u0301", "…", "—", "«»", *SPECIAL]


def random_text(rng: random.Random) -> str:
    parts = []
    for _ in range(rng.randint(1, 12)):
        roll = rng.random()
        if roll < 0.55:
            parts.append(rng.choice(PIECES))
        elif roll < 0.7:
            parts.append(" " * rng.randint(1, 5) + rng.choice(["", "\n", "\t"]) * rng.randint(0, 2))
        elif roll < 0.85:
            parts.append(str(rng.randint(0, 10**rng.randint(1, 9))))
        else:
            parts.append("".join(chr(rng.choice([rng.randint(0x20, 0x7E), rng.randint(0xA0, 0x2FF),
                                                  rng.randint(0x400, 0x4FF), rng.randint(0x4E00, 0x4FFF),
                                                  rng.randint(0x1F300, 0x1F64F)])) for _ in range(rng.randint(1, 6))))
    return "".join(parts)


def trained_vocab(texts: list[str]) -> tuple[list[str], list[int], list[str]]:
    """(tokens, token types, merges) of a byte-level BPE trained under Llama 3's split rule; specials first."""
    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated"),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    trainer = trainers.BpeTrainer(vocab_size=700, special_tokens=SPECIAL, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer)
    vocab = tok.get_vocab()
    tokens = sorted(vocab, key=vocab.get)
    merges = [m if isinstance(m, str) else " ".join(m) for m in json.loads(tok.to_str())["model"]["merges"]]
    return tokens, [3 if t in SPECIAL else 1 for t in tokens], merges


@pytest.fixture(scope="module")
def texts() -> list[str]:
    rng = random.Random(40)
    return [random_text(rng) for _ in range(2000)]


def test_qwen2_pre_tokenizer_equals_transformers_on_2000_strings(tmp_path: Path, texts: list[str]) -> None:
    from transformers import AutoTokenizer

    vocab = trained_vocab(texts)
    path = write_decoder_gguf(tmp_path / "qwen.gguf", "qwen2", hidden=64, ffn=64, qkv_bias=True, pre="qwen2",
                              vocab=vocab)
    ours = load_model(str(path)).tokenizer
    reference = AutoTokenizer.from_pretrained(str(tmp_path), gguf_file=path.name)
    assert any(len(t) > 1 and t.isdigit() for t in vocab[0]), "the vocabulary must merge digits"
    assert len(ours.encode("12345", add_special_tokens=False)) == 5, "qwen2 splits every digit alone"
    for text in texts:
        got = ours.encode(text, add_special_tokens=False)
        assert got == reference.encode(text, add_special_tokens=False), text
        assert ours.decode(got, skip_special_tokens=False) == text
