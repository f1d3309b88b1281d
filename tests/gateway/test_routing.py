"""routing.choose as a table and as properties: the saturation filter, least-load, and prefix routing (holders
first, cold keys spread over the caches, all within CHWBL's load bound)."""

from __future__ import annotations

import collections

import pytest
from flotilla_gateway.routing import (
    KEY_CHARS,
    STALE_AFTER_S,
    PodView,
    candidates,
    choose,
    default_policy,
    is_saturated,
    load_bound,
    prefix_key_name,
    retry_has_room,
    routing_key,
)
from hypothesis import given, settings
from hypothesis import strategies as st


def pod(address: str, in_flight: int = 0, waiting: int = 0, kv: float = 0.1, age: float | None = 0.1,
        capacity: int = 16) -> PodView:
    return PodView(address, in_flight=in_flight, waiting=waiting, running=0, slots=4, queue_capacity=capacity,
                   kv_usage=kv, load_age_s=age)


@pytest.mark.parametrize(("view", "saturated"), [
    (pod("a"), False),
    (pod("a", age=None), True),  # never read
    (pod("a", age=STALE_AFTER_S + 0.01), True),  # stale figures mean saturated
    (pod("a", age=STALE_AFTER_S), False),
    (pod("a", waiting=16), True),  # admission queue full
    (pod("a", waiting=15), False),
    (pod("a", kv=0.99), True),  # KV cache full
    (pod("a", in_flight=100), False),  # the gateway's own count is load, not saturation
    (PodView("a", slots=4, queue_capacity=16, load_age_s=0.1, accepting=False), True),  # draining
])
def test_saturation(view: PodView, saturated: bool) -> None:
    assert is_saturated(view) is saturated


@pytest.mark.parametrize(("pods", "expected"), [
    ([], None),
    ([pod("a", in_flight=3), pod("b", in_flight=1), pod("c", in_flight=2)], "b"),
    ([pod("a", in_flight=1, waiting=5), pod("b", in_flight=3)], "b"),  # the server's count when higher
    ([pod("a", in_flight=4, waiting=1), pod("b", in_flight=3, waiting=2)], "b"),  # the gateway's when higher
    ([pod("a", in_flight=1, kv=0.5), pod("b", in_flight=1, kv=0.2)], "b"),  # tie: lower KV usage
    ([pod("a"), pod("b")], "a"),  # full tie: by address, so replicas agree
    ([pod("a", age=None), pod("b", in_flight=9)], "b"),  # stale a is filtered out, though idler
    ([pod("a", age=None, in_flight=2), pod("b", age=5.0, in_flight=1)], "b"),  # all saturated: all count
    ([pod("a", waiting=16), pod("b", in_flight=30)], "b"),
])
def test_least_load_table(pods: list[PodView], expected: str | None) -> None:
    chosen = choose(pods, "key", "least-load")
    assert (chosen.address if chosen else None) == expected


@pytest.mark.parametrize(("endpoint", "configured", "expected"), [
    ("chat", None, "prefix"), ("completions", None, "least-load"),
    ("chat", "least-load", "least-load"), ("completions", "prefix", "prefix"),
    ("chat", "round-robin", "prefix"),  # unknown values fall back to the default
])
def test_default_policy(endpoint: str, configured: str | None, expected: str) -> None:
    assert default_policy(endpoint, configured) == expected


def test_routing_key_is_the_start_of_system_prompt_then_first_user_message() -> None:
    body = {"messages": [{"role": "system", "content": "S" * 2000}, {"role": "user", "content": "hello"},
                         {"role": "assistant", "content": "x"}, {"role": "user", "content": "later"}]}
    key = routing_key("m", "chat", body)
    assert key == "m\x00" + "S" * KEY_CHARS
    other_question = {"messages": [body["messages"][0], {"role": "user", "content": "something else"}]}
    assert routing_key("m", "chat", other_question) == key  # a long system prompt: one key per tenant
    later = {"messages": [*body["messages"], {"role": "user", "content": "third"}]}
    assert routing_key("m", "chat", later) == key  # a conversation keeps its key as it grows
    assert routing_key("other", "chat", body) != key
    short = {"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "U" * 2000}]}
    assert routing_key("m", "chat", short) == "m\x00be brief\x00" + "U" * (KEY_CHARS - len("be brief") - 1)
    parts = {"messages": [{"role": "user", "content": [{"type": "text", "text": "hel"}, {"type": "text", "text": "lo"}]}]}
    assert routing_key("m", "chat", parts) == "m\x00\x00hello"


def test_routing_key_of_completions() -> None:
    assert routing_key("m", "completions", {"prompt": "p" * 5000}) == "m\x00" + "p" * KEY_CHARS
    assert routing_key("m", "completions", {"prompt": ["first", "second"]}) == "m\x00first"


def test_prefix_is_sticky_and_spreads_keys() -> None:
    pods = [pod(f"10.0.0.{i}:8000") for i in range(4)]
    chosen = [choose(pods, f"tenant-{k}", "prefix") for k in range(400)]
    assert all(c is not None for c in chosen)
    assert [choose(pods, f"tenant-{k}", "prefix") for k in range(400)] == chosen  # deterministic
    counts = collections.Counter(c.address for c in chosen if c)
    assert len(counts) == 4 and min(counts.values()) > 400 / 4 / 2  # 256 virtual nodes spread keys evenly


def test_prefix_overflows_a_loaded_pod_and_moves_few_keys_when_one_leaves() -> None:
    pods = [pod(f"p{i}") for i in range(3)]
    home = choose(pods, "k", "prefix")
    assert home is not None
    loaded = [pod(p.address, in_flight=10 if p.address == home.address else 0) for p in pods]
    assert choose(loaded, "k", "prefix").address != home.address  # over the bound: next on the ring
    before = {k: choose(pods, f"k{k}", "prefix").address for k in range(300)}
    after = {k: choose(pods[:2], f"k{k}", "prefix").address for k in range(300)}
    moved = [k for k in before if before[k] != after[k]]
    assert all(before[k] == "p2" for k in moved)  # only the leaving pod's keys move


def test_prefix_follows_the_pods_holding_the_key_within_the_bound() -> None:
    pods = [pod(f"p{i}") for i in range(3)]
    home = choose(pods, "k", "prefix")
    other = next(p for p in pods if p != home)
    assert choose(pods, "k", "prefix", frozenset({other.address})) == other  # cached there: not at its home
    busy = [pod(p.address, in_flight=5 if p == home else 2) for p in pods]  # bound: ceil(2 × 10 / 3) = 7
    assert choose(busy, "k", "prefix", frozenset({home.address, other.address})).address == home.address  # first
    over = [pod(p.address, in_flight=12 if p == home else 2) for p in pods]  # bound: ceil(2 × 17 / 3) = 12
    assert choose(over, "k", "prefix", frozenset({home.address, other.address})).address == other.address
    assert choose(over, "k", "prefix", frozenset({home.address})).address != home.address  # no other holder


def test_a_cold_key_goes_to_the_pod_with_the_fewest_active_prefixes() -> None:
    pods = [PodView(f"p{i}", load_age_s=0.1, recent_prefixes=n) for i, n in enumerate((2, 1, 3))]
    assert choose(pods, "k", "prefix").address == "p1"
    full = [PodView(p.address, load_age_s=0.1, recent_prefixes=5, in_flight=9 if p.address == "p1" else 0)
            for p in pods]
    assert choose(full, "k", "prefix") != choose(pods, "k", "prefix")  # p1 over the bound; a tie: the ring


def test_six_cold_keys_split_two_per_pod_on_three_pods() -> None:
    """With each pod's count of active prefixes fed back (as the load board does), keys spread evenly whatever
    their hashes."""
    for trial in range(50):
        counts = {f"p{i}": 0 for i in range(3)}
        for k in range(6):
            views = [PodView(a, load_age_s=0.1, recent_prefixes=n) for a, n in counts.items()]
            counts[choose(views, f"trial-{trial}-tenant-{k}", "prefix").address] += 1
        assert sorted(counts.values()) == [2, 2, 2]


def test_the_prefix_key_name_is_sixteen_hex_digits_and_a_salt_changes_the_key() -> None:
    name = prefix_key_name(routing_key("m", "completions", {"prompt": "p"}))
    assert len(name) == 16 and int(name, 16) >= 0
    assert routing_key("m", "completions", {"prompt": "p", "cache_salt": "a"}) != routing_key(
        "m", "completions", {"prompt": "p", "cache_salt": "b"})


def test_retry_has_room() -> None:
    pods = [pod("a"), pod("b", waiting=16)]
    assert retry_has_room(pods, {"b"})
    assert not retry_has_room(pods, {"a"})  # b is saturated
    assert not retry_has_room(pods, {"a", "b"})


views = st.builds(
    PodView, address=st.sampled_from([f"10.0.0.{i}:8000" for i in range(8)]),
    in_flight=st.integers(0, 50), waiting=st.integers(0, 40), running=st.integers(0, 8), slots=st.integers(1, 8),
    queue_capacity=st.integers(0, 32), kv_usage=st.floats(0, 1),
    load_age_s=st.one_of(st.none(), st.floats(0, 3)), accepting=st.booleans(),
)
pod_lists = st.lists(views, max_size=8, unique_by=lambda p: p.address)


@settings(max_examples=300, deadline=None)
@given(pods=pod_lists, key=st.text(max_size=50), policy=st.sampled_from(["least-load", "prefix"]))
def test_choice_is_a_candidate(pods: list[PodView], key: str, policy: str) -> None:
    chosen = choose(pods, key, policy)  # type: ignore[arg-type]
    if not pods:
        assert chosen is None
        return
    pool = candidates(pods)
    assert chosen in pool
    if any(not is_saturated(p) for p in pods):
        assert not is_saturated(chosen)  # a saturated pod is chosen only when every pod is


@settings(max_examples=300, deadline=None)
@given(pods=pod_lists, key=st.text(max_size=50))
def test_least_load_takes_a_least_loaded_candidate(pods: list[PodView], key: str) -> None:
    chosen = choose(pods, key, "least-load")
    if pods:
        assert chosen.load == min(p.load for p in candidates(pods))


@settings(max_examples=300, deadline=None)
@given(pods=pod_lists, key=st.text(max_size=50), holders=st.sets(st.sampled_from([f"10.0.0.{i}:8000" for i in range(8)])))
def test_prefix_respects_the_load_bound_and_prefers_holders(pods: list[PodView], key: str, holders: set[str]) -> None:
    chosen = choose(pods, key, "prefix", frozenset(holders))
    if pods:
        pool = candidates(pods)
        bound = load_bound(sum(p.load for p in pool), len(pool))
        assert chosen.load + 1 <= bound
        if any(p.address in holders and p.load + 1 <= bound for p in pool):
            assert chosen.address in holders
        assert choose(list(reversed(pods)), key, "prefix", frozenset(holders)) == chosen  # list order: no matter

