"""`tiny`: the embedded DEMONSTRATION model, built in-process with no download.

It exists so that `make run`, the tests and the benchmarks have a model everywhere. Its weights are
seeded random numbers, so its output is not meaningful text; everything that shows it (model name,
description, a warning on load) says so. Building it is deterministic and takes well under a second.
"""

from __future__ import annotations

import functools
from collections import Counter
from itertools import pairwise

import torch
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers, processors

from .config import ModelConfig
from .llama import DecoderModel
from .tokenizer import Tokenizer

TINY_NAME = "tiny"
TINY_DESCRIPTION = (
    "tiny: a DEMONSTRATION model with seeded random weights, built in-process; its output is not "
    "meaningful text. Pass --model with a Hugging Face directory to serve a real model."
)
TINY_SEED = 0
BOS, EOS, IM_START, IM_END = "<s>", "</s>", "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = (BOS, EOS, IM_START, IM_END)
NUM_MERGES = 124  # 256 bytes + 124 merges + 4 special tokens = 384

CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('role must be system, user or assistant, got ' + message['role']) }}"
    "{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

_CORPUS = """
Flotilla runs fleets of language model servers. Each server batches requests continuously: a new
request joins the running batch at the next step, and a finished one leaves it at once. The key and
value cache is paged into blocks of sixteen positions, so memory is taken as the answer grows, and
the scheduler preempts the newest sequence when the pool runs dry. The operator reads the queue depth
from Prometheus and scales the replicas up when requests wait, and down when the servers are idle.
This is a demonstration model: its weights are random, and the text it writes has no meaning.
The quick brown fox jumps over the lazy dog. Hello, world! What is the weather like today?
"""

TINY_CONFIG = ModelConfig(
    model_type="llama",
    vocab_size=256 + NUM_MERGES + len(SPECIAL_TOKENS),
    hidden_size=256,
    intermediate_size=688,
    num_layers=4,
    num_heads=8,
    num_kv_heads=2,
    head_dim=32,
    max_position_embeddings=2048,
    rms_norm_eps=1e-5,
    rope_theta=10000.0,
    tie_word_embeddings=True,
    bos_token_id=256 + NUM_MERGES,
    eos_token_ids=(256 + NUM_MERGES + 1, 256 + NUM_MERGES + 3),
)


def build_byte_bpe(corpus: str = _CORPUS, num_merges: int = NUM_MERGES,
                   special_tokens: tuple[str, ...] = SPECIAL_TOKENS, bos: str | None = BOS) -> HFTokenizer:
    """A byte-level BPE of 256 + `num_merges` tokens whose merges are learned deterministically from
    `corpus` (ties broken by the pair's text), so the same arguments always give the same tokenizer.
    Special tokens take the ids after that; `bos`, if given, is prepended by the post-processor."""
    vocab, merges = _learn_merges(corpus, num_merges)
    tok = HFTokenizer(models.BPE(vocab=dict(vocab), merges=list(merges)))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(list(special_tokens))
    if bos is not None:
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, tok.token_to_id(bos))]
        )
    return tok


@functools.cache  # 0.2-0.9 s of Python per build; a multi-model server's forkserver learns them once
def _learn_merges(corpus: str, num_merges: int) -> tuple[tuple[tuple[str, int], ...], tuple[tuple[str, str], ...]]:
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {ch: i for i, ch in enumerate(alphabet)}
    pre = pre_tokenizers.ByteLevel(add_prefix_space=False)
    words = Counter(tuple(w) for w, _ in pre.pre_tokenize_str(corpus))
    merges: list[tuple[str, str]] = []
    while len(vocab) < len(alphabet) + num_merges:
        pairs: Counter[tuple[str, str]] = Counter()
        for word, count in words.items():
            for pair in pairwise(word):
                pairs[pair] += count
        if not pairs:
            break
        best = min(pairs, key=lambda p: (-pairs[p], p))
        merges.append(best)
        vocab.setdefault(best[0] + best[1], len(vocab))  # two merge paths may spell the same token
        words = Counter({_merge(word, best): c for word, c in words.items()})
    return tuple(vocab.items()), tuple(merges)


def _merge(word: tuple[str, ...], pair: tuple[str, str]) -> tuple[str, ...]:
    out: list[str] = []
    i = 0
    while i < len(word):
        if i + 1 < len(word) and (word[i], word[i + 1]) == pair:
            out.append(word[i] + word[i + 1])
            i += 2
        else:
            out.append(word[i])
            i += 1
    return tuple(out)


def build_tiny_tokenizer() -> Tokenizer:
    tok = build_byte_bpe()
    assert tok.get_vocab_size() == TINY_CONFIG.vocab_size, "tiny vocab must match TINY_CONFIG"
    return Tokenizer(tok, CHAT_TEMPLATE, {"bos_token": BOS, "eos_token": EOS}, TINY_CONFIG.eos_token_ids)


def build_tiny_model(dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu") -> DecoderModel:
    """Seeded weights: N(0, 0.02) for matrices and embeddings, ones for norms."""
    gen = torch.Generator().manual_seed(TINY_SEED)
    model = DecoderModel(TINY_CONFIG)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            elif name.endswith(".bias"):
                p.zero_()
            else:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.02)
    return model.to(device=device, dtype=dtype).eval()
