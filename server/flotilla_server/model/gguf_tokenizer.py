"""tokenizer_from_gguf: the byte-level BPE tokenizer and chat template stored in a GGUF's metadata.

A GGUF carries its vocabulary (`tokenizer.ggml.tokens`, already in GPT-2's byte-to-unicode
spelling), its merges, the type of each token (3 = control, i.e. special) and the *name* of the
pre-tokenizer its merges were learned with (`tokenizer.ggml.pre`), not the pre-tokenizer itself.
llama.cpp maps each name to split rules in its own source; PRE_TOKENIZERS below repeats that mapping
for the names this loader knows. A name not listed is refused: splitting text differently from
training silently degrades every answer, so it is never guessed.
"""

from __future__ import annotations

from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers, processors
from tokenizers import Tokenizer as HFTokenizer

from .config import UnsupportedModelError
from .gguf_file import GGUFModel
from .tokenizer import Tokenizer

CONTROL = 3  # llama.cpp's LLAMA_TOKEN_TYPE_CONTROL
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


def tokenizer_from_gguf(gg: GGUFModel) -> Tokenizer:
    """Raises UnsupportedModelError naming a tokenizer model or pre-tokenizer this loader cannot build."""
    kind = gg.field("tokenizer.ggml.model")
    if kind != "gpt2":
        raise UnsupportedModelError(
            f"{gg.path.name}: GGUF tokenizer model {kind!r} is not supported: Flotilla builds byte-level "
            "BPE ('gpt2') tokenizers from GGUF metadata; use the model's Hugging Face directory instead"
        )
    pre = gg.field("tokenizer.ggml.pre", "default")
    if pre not in PRE_TOKENIZERS:
        raise UnsupportedModelError(
            f"{gg.path.name}: GGUF pre-tokenizer {pre!r} is not known to Flotilla (known: "
            f"{', '.join(sorted(PRE_TOKENIZERS))}); use the model's Hugging Face directory instead"
        )
    tokens: list[str] = list(gg.field("tokenizer.ggml.tokens"))
    merges = [tuple(m.split(" ", 1)) for m in gg.field("tokenizer.ggml.merges", [])]
    types = gg.field("tokenizer.ggml.token_type") or [1] * len(tokens)
    vocab = {token: i for i, token in enumerate(tokens)}
    tok = HFTokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence(PRE_TOKENIZERS[pre]())
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t, kind in zip(tokens, types, strict=True) if kind == CONTROL])

    special = {}
    for key, field in (("bos_token", "bos_token_id"), ("eos_token", "eos_token_id"),
                       ("unk_token", "unknown_token_id"), ("pad_token", "padding_token_id")):
        token_id = gg.field(f"tokenizer.ggml.{field}")
        if token_id is not None and 0 <= int(token_id) < len(tokens):
            special[key] = tokens[int(token_id)]
    if gg.field("tokenizer.ggml.add_bos_token", False) and "bos_token" in special:
        bos = special["bos_token"]
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, vocab[bos])]
        )
    return Tokenizer(tok, gg.field("tokenizer.chat_template"), special)
