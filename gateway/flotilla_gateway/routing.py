"""Which pod gets a request: a pure decision, `choose(pods, key, policy)` (docs/gateway.md, "Routing").

It reads only the figures handed to it, so several gateway replicas given the same figures make the same
choice without sharing state, and the fleet simulator can import it as it is.

Rules:
- a pod is saturated when its load figures are stale (older than STALE_AFTER_S, or never seen), it reports
  that it takes no new work (draining), its admission queue is full, or its KV cache is full; saturated
  pods are filtered out unless all are;
- `least-load`: fewest in-flight (the gateway's own count) + waiting (the server's), then lowest KV usage;
- `prefix`: consistent hashing with bounded loads (CHWBL, KubeAI's PrefixHash): VIRTUAL_NODES points per pod
  on a hash ring; walk clockwise from the key's hash to the first pod whose load + 1 stays within
  ceil(LOAD_BOUND × the mean load counting this request). With the ceiling the least-loaded pod always
  fits, so the walk always ends on the ring (Mirrokni, Thorup and Zadimoghaddam's bound).
"""

from __future__ import annotations

import bisect
import functools
import hashlib
import math
from dataclasses import dataclass
from typing import Any, Literal

Policy = Literal["least-load", "prefix"]
POLICIES: tuple[Policy, ...] = ("least-load", "prefix")
STALE_AFTER_S = 1.0
KV_FULL = 0.98  # KV usage at or above this counts as a full cache
VIRTUAL_NODES = 256
LOAD_BOUND = 1.25
KEY_CHARS = 1000  # characters of system prompt and of first user message (or prompt) in a prefix key


@dataclass(frozen=True)
class PodView:
    """One ready pod as the gateway sees it now."""

    address: str  # host:port, unique within a model
    in_flight: int = 0  # requests this gateway has sent to it and not finished
    waiting: int = 0  # the server's admission queue (from its load report)
    running: int = 0
    slots: int = 0
    queue_capacity: int = 0
    kv_usage: float = 0.0
    load_age_s: float | None = None  # seconds since its load report was read; None: never read
    accepting: bool = True  # the report's `ready`: loaded and not draining

    @property
    def load(self) -> int:
        return self.in_flight + self.waiting


def is_saturated(pod: PodView) -> bool:
    if pod.load_age_s is None or pod.load_age_s > STALE_AFTER_S:
        return True  # stale figures: assume the worst
    if not pod.accepting:
        return True
    if pod.queue_capacity > 0 and pod.waiting >= pod.queue_capacity:
        return True
    return pod.kv_usage >= KV_FULL


def candidates(pods: list[PodView] | tuple[PodView, ...]) -> list[PodView]:
    """The pods a policy may choose from: the unsaturated ones, or all when every pod is saturated."""
    fresh = [p for p in pods if not is_saturated(p)]
    return fresh or list(pods)


def choose(pods: list[PodView] | tuple[PodView, ...], key: str, policy: Policy) -> PodView | None:
    """The pod for a request with routing key `key`; None when there is no pod."""
    pool = candidates(pods)
    if not pool:
        return None
    if policy == "prefix":
        return _bounded_hash(pool, key)
    return min(pool, key=lambda p: (p.load, p.kv_usage, p.address))


def _hash(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "big")


@functools.lru_cache(maxsize=256)
def _ring(addresses: tuple[str, ...]) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """The hash ring of these pods: sorted points and the pod owning each."""
    points = sorted((_hash(f"{address}#{i}"), address) for address in addresses for i in range(VIRTUAL_NODES))
    return tuple(h for h, _ in points), tuple(a for _, a in points)


def _bounded_hash(pool: list[PodView], key: str) -> PodView:
    by_address = {p.address: p for p in pool}
    hashes, owners = _ring(tuple(sorted(by_address)))
    total = sum(p.load for p in pool)
    bound = load_bound(total, len(pool))
    start = bisect.bisect_left(hashes, _hash(key)) % len(hashes)
    seen: set[str] = set()
    for step in range(len(hashes)):
        address = owners[(start + step) % len(hashes)]
        if address in seen:
            continue
        seen.add(address)
        if by_address[address].load + 1 <= bound:
            return by_address[address]
    raise AssertionError("no pod within the load bound: the bound's ceiling makes this impossible")


def load_bound(total_load: int, num_pods: int) -> int:
    """The most load a pod may carry after taking one more request."""
    return math.ceil(LOAD_BOUND * (total_load + 1) / num_pods)


def default_policy(endpoint: str, configured: str | None) -> Policy:
    """`spec.routing.policy` when set; otherwise prefix for chat and least-load for completions."""
    if configured in POLICIES:
        return configured  # type: ignore[return-value]
    return "prefix" if endpoint == "chat" else "least-load"


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return ""


def routing_key(model: str, endpoint: str, body: dict[str, Any]) -> str:
    """The prefix key: the model, then the first KEY_CHARS of the system prompt followed by the first user
    message (chat), or of the prompt (completions): the start of what the server will see, so requests
    sharing a prefix share a key. A system prompt of KEY_CHARS or more is the whole key (every request of a
    tenant lands where its prompt is cached); a shorter one lets the first user message in (a conversation
    keeps its pod as it grows)."""
    if endpoint == "chat":
        messages = body.get("messages") if isinstance(body.get("messages"), list) else []
        system = "".join(_text(m.get("content")) for m in messages
                         if isinstance(m, dict) and m.get("role") in ("system", "developer"))
        user = next((_text(m.get("content")) for m in messages if isinstance(m, dict) and m.get("role") == "user"), "")
        start = f"{system}\x00{user}"
        return f"{model}\x00{start[:KEY_CHARS]}"
    prompt = body.get("prompt")
    if isinstance(prompt, list):
        prompt = prompt[0] if prompt else ""
    if not isinstance(prompt, str):
        prompt = str(prompt)
    return f"{model}\x00{prompt[:KEY_CHARS]}"


def retry_has_room(pods: list[PodView] | tuple[PodView, ...], tried: set[str]) -> bool:
    """After a pod's 429: is there an untried pod that is not saturated? Only then is a retry worth it."""
    return any(p.address not in tried and not is_saturated(p) for p in pods)
