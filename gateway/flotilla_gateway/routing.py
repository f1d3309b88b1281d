"""Which pod gets a request: a pure decision, `choose(pods, key, policy, holders)` (docs/gateway.md, "Routing").

It reads only the figures handed to it, so several gateway replicas given the same figures make the same
choice without sharing state, and the fleet simulator can import it as it is.

Rules:
- a pod's load is the server's own count of requests (running + waiting: every gateway's and every direct
  client's), or the gateway's in-flight count when that is higher (sent since the last report);
- a pod is saturated when its load figures are stale (older than STALE_AFTER_S, or never seen), it reports
  that it takes no new work (draining), its admission queue is full, or its KV cache is full; saturated
  pods are filtered out unless all are;
- `least-load`: least load, then lowest KV usage;
- `prefix`: a request goes where its prefix is cached, within a load bound. The bound is consistent
  hashing's with bounded loads (CHWBL, KubeAI's PrefixHash): a pod may take a request while its load + 1
  stays within ceil(LOAD_BOUND × the mean load counting this request); with the ceiling the least-loaded
  pod always fits. LOAD_BOUND is 2 where KubeAI's default is 1.25: a hit saves the prompt's prefill, while
  a spill pays it and evicts another prompt from the pod it lands on. At 1.25 a third of the requests of
  six tenants on three pods spilled, and the hit rate stayed near 0.6 (docs/benchmarks.md, "Prefix routing
  through the gateway").
  `holders` are the pods whose prefix cache holds the key (their load reports) or that this gateway just
  sent it to. The first holder within the bound on the key's walk of a hash ring (VIRTUAL_NODES points per
  pod) gets the request: one holder takes a prefix's traffic and a second only its overflow. Otherwise (a
  cold key, or every holder too busy) the pod within the bound with the fewest active prefixes
  (`recent_prefixes`; a prompt still cached but no longer used costs nothing, being the next evicted) gets
  it, ties broken by the walk, so that cold keys spread evenly over the caches instead of by the luck of the
  hash (six keys on three pods split 2-2-2 only 12 % of the time).
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
LOAD_BOUND = 2.0  # KubeAI's PrefixHash uses 1.25; see the module docstring
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
    recent_prefixes: int = 0  # distinct prefix keys this gateway sent it lately (load_board.SENT_GRACE_S)

    @property
    def load(self) -> int:
        return max(self.in_flight, self.running + self.waiting)


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


def choose(pods: list[PodView] | tuple[PodView, ...], key: str, policy: Policy,
           holders: frozenset[str] = frozenset()) -> PodView | None:
    """The pod for a request with routing key `key`; None when there is no pod. `holders`: the addresses
    holding the key's prefix (`prefix` only)."""
    pool = candidates(pods)
    if not pool:
        return None
    if policy == "prefix":
        return _prefix(pool, key, holders)
    return min(pool, key=lambda p: (p.load, p.kv_usage, p.address))


def prefix_key_name(key: str) -> str:
    """The name the servers know a routing key by (flotilla_contract.load.PREFIX_KEY_HEADER): 16 hex digits."""
    return f"{_hash(key):016x}"


def _hash(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "big")


@functools.lru_cache(maxsize=256)
def _ring(addresses: tuple[str, ...]) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """The hash ring of these pods: sorted points and the pod owning each."""
    points = sorted((_hash(f"{address}#{i}"), address) for address in addresses for i in range(VIRTUAL_NODES))
    return tuple(h for h, _ in points), tuple(a for _, a in points)


def _prefix(pool: list[PodView], key: str, holders: frozenset[str]) -> PodView:
    bound = load_bound(sum(p.load for p in pool), len(pool))
    fits = [p for p in pool if p.load + 1 <= bound]  # never empty: the least-loaded pod fits
    walk = ring_walk({p.address for p in pool}, key)
    warm = [p for p in fits if p.address in holders]
    if warm:
        return min(warm, key=lambda p: walk[p.address])
    return min(fits, key=lambda p: (p.recent_prefixes, walk[p.address]))


def ring_walk(addresses: set[str], key: str) -> dict[str, int]:
    """Each pod's place in the walk clockwise from the key's hash on the ring (0: the key's home)."""
    hashes, owners = _ring(tuple(sorted(addresses)))
    start = bisect.bisect_left(hashes, _hash(key)) % len(hashes)
    order: dict[str, int] = {}
    for step in range(len(hashes)):
        order.setdefault(owners[(start + step) % len(hashes)], len(order))
        if len(order) == len(addresses):
            break
    return order


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
    """The prefix key: the model and the request's `cache_salt` if any (its blocks are its salt's alone),
    then the first KEY_CHARS of the system prompt followed by the first user message (chat), or of the prompt
    (completions): the start of what the server will see, so requests sharing a prefix share a key. A system
    prompt of KEY_CHARS or more is the whole key (every request of a tenant lands where its prompt is
    cached); a shorter one lets the first user message in (a conversation keeps its pod as it grows)."""
    salt = body.get("cache_salt")
    if isinstance(salt, str):
        model = f"{model}\x00salt:{salt}"
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
