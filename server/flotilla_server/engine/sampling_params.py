"""Per-request generation settings, validated once, shared by the engine and the HTTP layer.

Torch-free so that request validation can happen before anything touches the engine.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from flotilla_contract.classes import BATCH, DEFAULT_REQUEST_CLASS, NO_TENANT, REQUEST_CLASSES

DEFAULT_MAX_TOKENS = 16  # OpenAI's default when a request names none
MAX_LOGPROBS = 20  # most alternatives per token (OpenAI's top_logprobs bound; vLLM's default max_logprobs)
MAX_N = 128  # most choices per prompt (OpenAI's bound on n)
# Below this temperature sampling is greedy: dividing logits by a tinier one overflows to inf and NaN.
GREEDY_BELOW_TEMPERATURE = 1e-5


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = DEFAULT_MAX_TOKENS  # most tokens to generate
    temperature: float = 1.0  # below GREEDY_BELOW_TEMPERATURE (and 0) means greedy
    top_p: float = 1.0  # nucleus mass kept, in (0, 1]
    top_k: int = 0  # 0 means no top-k cut
    seed: int | None = None  # a seed makes the request's samples reproducible
    stop: tuple[str, ...] = field(default_factory=tuple)  # generation ends before any of these strings
    ignore_eos: bool = False  # keep generating past EOS (benchmarks)
    presence_penalty: float = 0.0  # OpenAI's, in [-2, 2]; see engine/penalties.py
    frequency_penalty: float = 0.0  # OpenAI's, in [-2, 2]
    repetition_penalty: float = 1.0  # vLLM's, > 0; 1 changes nothing
    min_p: float = 0.0  # vLLM's: drop tokens less likely than min_p x the likeliest, in [0, 1]
    cache_salt: str | None = None  # prefix-cache tenant: requests with different salts never share KV blocks
    n: int = 1  # choices per prompt: forks of one prefill that share the prompt's blocks
    logprobs: int | None = None  # None: none; k: each sampled token's raw logprob and the k likeliest (0..20)
    prefix_key: str | None = None  # the gateway's name for the prompt's prefix (engine/prefix_keys.py)
    # who waits for it (docs/serving.md, "Priorities and tenants"): its class, its tenant, and vLLM's
    # `priority` within them (lower is more urgent)
    request_class: str = DEFAULT_REQUEST_CLASS
    tenant: str = NO_TENANT
    priority: int = 0
    # llguidance grammar text (flotilla_server/grammar): every token is sampled through its mask, and the reply
    # ends ("stop") when the grammar is complete; None: unconstrained
    grammar: str | None = None
    # the LoRA adapter (a --lora name) every token of the request is computed with; None: the base model
    lora: str | None = None
    # False: this request never proposes draft tokens when the server speculates (engine/speculative.py)
    speculative: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        else:
            object.__setattr__(self, "stop", tuple(self.stop))
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if not 0.0 <= self.temperature <= 100.0:
            raise ValueError(f"temperature must be in [0, 100], got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 disables it), got {self.top_k}")
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2.0 <= getattr(self, name) <= 2.0:
                raise ValueError(f"{name} must be in [-2, 2], got {getattr(self, name)}")
        if not 0.0 < self.repetition_penalty <= 100.0:
            raise ValueError(f"repetition_penalty must be in (0, 100] (1 disables it), got {self.repetition_penalty}")
        if not 0.0 <= self.min_p <= 1.0:
            raise ValueError(f"min_p must be in [0, 1] (0 disables it), got {self.min_p}")
        if not 1 <= self.n <= MAX_N:
            raise ValueError(f"n must be in [1, {MAX_N}], got {self.n}")
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_LOGPROBS:
            raise ValueError(f"logprobs must be in [0, {MAX_LOGPROBS}], got {self.logprobs}")
        if self.request_class not in REQUEST_CLASSES:
            raise ValueError(f"the request class must be one of {', '.join(REQUEST_CLASSES)}, got {self.request_class!r}")
        if any(not s for s in self.stop):
            raise ValueError("stop strings must be non-empty")

    @property
    def has_penalties(self) -> bool:
        return self.presence_penalty != 0.0 or self.frequency_penalty != 0.0 or self.repetition_penalty != 1.0

    @property
    def is_batch(self) -> bool:
        return self.request_class == BATCH

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_BELOW_TEMPERATURE or self.top_k == 1
