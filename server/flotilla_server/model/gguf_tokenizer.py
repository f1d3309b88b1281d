"""tokenizer_from_gguf: the tokenizer and chat template stored in a GGUF's metadata.

Two kinds of vocabulary (`tokenizer.ggml.model`) are built, each as `transformers`' GGUF reader builds it:

- `gpt2`, byte-level BPE: the vocabulary (already in GPT-2's byte-to-unicode spelling), its merges, the type
  of each token and the *name* of the pre-tokenizer its merges were learned with (`tokenizer.ggml.pre`), not
  the pre-tokenizer itself. llama.cpp maps each name to split rules in its own source; PRE_TOKENIZERS below
  repeats that mapping for the names this loader knows. A name not listed is refused: splitting text
  differently from training silently degrades every answer, so it is never guessed.
- `llama`, SentencePiece (Llama 2, Mistral v0.1): pieces spelled with "▁" for a space, a score per piece and
  `<0xXX>` byte pieces for what the pieces do not cover. Like transformers (LlamaTokenizer), it runs as BPE
  whose merges are recovered from the scores, with byte fallback, and a "▁" prepended to the text.
"""

from __future__ import annotations

from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers, processors
from tokenizers import Tokenizer as HFTokenizer

from .config import UnsupportedModelError
from .gguf_file import GGUFModel
from .tokenizer import Tokenizer

_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# Qwen2's (and Qwen2.5's, Qwen3's): Llama 3's rule but every digit alone (llama.cpp's LLAMA_VOCAB_PRE_TYPE_QWEN2;
# like llama.cpp and transformers' GGUF reader, no NFC normalizer, which Qwen's own tokenizer.json adds)
_QWEN2_SPLIT = _LLAMA3_SPLIT.replace(r"\p{N}{1,3}", r"\p{N}")


def _gpt2() -> list[pre_tokenizers.PreTokenizer]:
    return [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)]


def _smollm() -> list[pre_tokenizers.PreTokenizer]:
    """llama.cpp's "smollm": every digit alone, then GPT-2's split (as SmolLM's tokenizer.json)."""
    return [pre_tokenizers.Digits(individual_digits=True), *_gpt2()]


def _split_then_bytes(rule: str) -> list[pre_tokenizers.PreTokenizer]:
    return [pre_tokenizers.Split(Regex(rule), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]


def _llama3() -> list[pre_tokenizers.PreTokenizer]:
    return _split_then_bytes(_LLAMA3_SPLIT)


def _qwen2() -> list[pre_tokenizers.PreTokenizer]:
    return _split_then_bytes(_QWEN2_SPLIT)


# tokenizer.ggml.pre -> the pre-tokenizer its vocabulary was trained with (as in llama.cpp)
PRE_TOKENIZERS = {"gpt-2": _gpt2, "smollm": _smollm, "llama-bpe": _llama3, "qwen2": _qwen2}


# llama.cpp's token types (LLAMA_TOKEN_TYPE_*), which are SentencePiece's piece types
CONTROL, USER_DEFINED = 3, 4
KINDS = ("gpt2", "llama")  # tokenizer.ggml.model values this loader builds
SPACE = "\u2581"  # "▁", SentencePiece's spelling of a space


def tokenizer_from_gguf(gg: GGUFModel) -> Tokenizer:
    """Raises UnsupportedModelError naming a tokenizer model or pre-tokenizer this loader cannot build."""
    kind = gg.field("tokenizer.ggml.model")
    if kind not in KINDS:
        raise UnsupportedModelError(
            f"{gg.path.name}: GGUF tokenizer model {kind!r} is not supported: Flotilla builds byte-level BPE "
            "('gpt2') and SentencePiece ('llama') tokenizers from GGUF metadata; use the model's Hugging Face "
            "directory instead"
        )
    tokens: list[str] = list(gg.field("tokenizer.ggml.tokens"))
    types = list(gg.field("tokenizer.ggml.token_type") or [1] * len(tokens))
    tok = _byte_level_bpe(gg, tokens) if kind == "gpt2" else _sentencepiece(gg, tokens)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t, kind in zip(tokens, types, strict=True) if kind == CONTROL])
    tok.add_tokens([AddedToken(t, special=False, normalized=False)  # matched whole, as llama.cpp does
                    for t, kind in zip(tokens, types, strict=True) if kind == USER_DEFINED])

    special = {}
    for key, field in (("bos_token", "bos_token_id"), ("eos_token", "eos_token_id"),
                       ("unk_token", "unknown_token_id"), ("pad_token", "padding_token_id")):
        token_id = gg.field(f"tokenizer.ggml.{field}")
        if token_id is not None and 0 <= int(token_id) < len(tokens):
            special[key] = tokens[int(token_id)]
    if kind == "llama":  # transformers makes every named token special (matched whole, skipped on decode)
        tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in special.values()])
    # a SentencePiece file without the flag gets BOS, as in llama.cpp and transformers
    add_bos = bool(gg.field("tokenizer.ggml.add_bos_token", kind == "llama")) and "bos_token" in special
    add_eos = bool(gg.field("tokenizer.ggml.add_eos_token", False)) and "eos_token" in special
    if add_bos or add_eos:
        tok.post_processor = _template(tok, special.get("bos_token") if add_bos else None,
                                       special.get("eos_token") if add_eos else None)
    return Tokenizer(tok, gg.field("tokenizer.chat_template"), special)


def _byte_level_bpe(gg: GGUFModel, tokens: list[str]) -> HFTokenizer:
    pre = gg.field("tokenizer.ggml.pre", "default")
    if pre not in PRE_TOKENIZERS:
        raise UnsupportedModelError(
            f"{gg.path.name}: GGUF pre-tokenizer {pre!r} is not known to Flotilla (known: "
            f"{', '.join(sorted(PRE_TOKENIZERS))}); use the model's Hugging Face directory instead"
        )
    merges = [tuple(m.split(" ", 1)) for m in gg.field("tokenizer.ggml.merges", [])]
    vocab = {token: i for i, token in enumerate(tokens)}
    tok = HFTokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence(PRE_TOKENIZERS[pre]())
    tok.decoder = decoders.ByteLevel()
    return tok


def _sentencepiece(gg: GGUFModel, tokens: list[str]) -> HFTokenizer:
    """transformers' LlamaTokenizer over the file's pieces: BPE with byte fallback, "▁" for spaces and
    before the text's first piece (not after a special token), stripped again by the decoder."""
    vocab = {token: i for i, token in enumerate(tokens)}
    merges = gg.field("tokenizer.ggml.merges")
    if merges is not None:
        merges = [tuple(m.split(" ")) for m in merges]
    elif (scores := gg.field("tokenizer.ggml.scores")) is not None and len(scores) == len(tokens):
        merges = merges_from_scores(vocab, dict(zip(tokens, scores, strict=True)))
    else:
        raise UnsupportedModelError(
            f"{gg.path.name}: its SentencePiece vocabulary has no score per token (tokenizer.ggml.scores), "
            "from which Flotilla orders its merges; use a file converted by llama.cpp's convert_hf_to_gguf.py"
        )
    tok = HFTokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=True, byte_fallback=True))
    # the prefix follows the file (add_dummy_prefix of the SentencePiece model); transformers always adds it
    prefix = bool(gg.field("tokenizer.ggml.add_space_prefix", True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement=SPACE, prepend_scheme="first" if prefix else "never",
                                                 split=False)
    steps = [decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    tok.decoder = decoders.Sequence([*steps, decoders.Strip(content=" ", left=1)] if prefix else steps)
    return tok


def merges_from_scores(vocab: dict[str, int], scores: dict[str, float]) -> list[tuple[str, str]]:
    """Every split of a piece into two pieces, best piece score first (transformers' `generate_merges`):
    BPE applying them in this order joins what SentencePiece's highest-score-first merging joins."""
    merges = []
    for piece, score in scores.items():
        splits = [(piece[:i], piece[i:], score) for i in range(1, len(piece))
                  if piece[:i] in vocab and piece[i:] in vocab]
        merges += sorted(splits, key=lambda m: (vocab[m[0]], vocab[m[1]]))
    merges.sort(key=lambda m: (m[2], len(m[0]), len(m[1])), reverse=True)  # stable: ties keep their order
    return [(left, right) for left, right, _ in merges]


def _template(tok: HFTokenizer, bos: str | None, eos: str | None) -> processors.TemplateProcessing:
    """BOS before and EOS after each sequence, as transformers' `update_post_processor` writes them."""
    head, tail = (f"{bos}:0 " if bos else ""), (f" {eos}:0" if eos else "")
    single = f"{head}$A:0{tail}"
    pair = f"{single}{f' {bos}:1' if bos else ''} $B:1{f' {eos}:1' if eos else ''}"
    return processors.TemplateProcessing(single=single, pair=pair,
                                         special_tokens=[(t, tok.token_to_id(t)) for t in (bos, eos) if t])
