"""Fair admission's pure decisions (issue 18): a table per rule, and properties on a simulated engine.

Every bound asserted below is derived from the rules in engine/fair_admission.py, in the test's docstring.
Hypothesis runs derandomized (the same examples on every run, no example database), so a property either
always holds or always fails.

Notation: a class or queue with weight w has stride 1/w and pass P, and F = P + 1/w is its pass after its
next admission; the lowest F goes first. V is the virtual time, the highest pass admitted from. Two facts
used below, from rule 2, while every waiting queue is eligible and nothing is refused ahead of an
admission: a waiting queue has V < F <= V + 2/w (the admitted one had the lowest F, and P was lifted to V
or is an admitted pass plus one stride); and F only grows, by exactly 1/w per admission of its own.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from fractions import Fraction

import pytest
from flotilla_contract.classes import BATCH, INTERACTIVE, REQUEST_CLASSES
from flotilla_server.engine.admission_policy import AdmissionPolicy
from flotilla_server.engine.fair_admission import FairAdmissionPolicy, FairnessConfig
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

WEIGHTS = {INTERACTIVE: 8.0, BATCH: 1.0}
TENANTS = ("a", "b", "c")
weights = st.sampled_from([1, 2, 3, 8, 0.5, 1.5, 0.3])  # 3 and 0.3: strides that no float holds exactly


def derandomized(max_examples: int):
    return settings(derandomize=True, database=None, deadline=None, max_examples=max_examples,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@dataclass(frozen=True)
class Req:
    rid: int
    request_class: str = INTERACTIVE
    tenant: str = ""
    priority: int = 0
    num_slots: int = 1
    num_blocks: int = 0
    duration_rounds: int = 1


@dataclass
class Engine:
    """Slots and KV blocks as plain ints: an admitted request runs `duration_rounds` rounds, then frees
    them."""

    num_slots: int
    num_blocks: int = 10**9
    running: dict[Req, int] = field(default_factory=dict)  # -> rounds left

    def free_slots(self) -> int:
        return self.num_slots - sum(r.num_slots for r in self.running)

    def batch_slots(self) -> int:
        return sum(r.num_slots for r in self.running if r.request_class == BATCH)

    def running_by_tenant(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for r in self.running:
            counts[r.tenant] = counts.get(r.tenant, 0) + 1
        return counts

    def finish_round(self) -> None:
        for r in list(self.running):
            self.running[r] -= 1
            if self.running[r] == 0:
                del self.running[r]

    def try_admit(self, r: Req) -> bool:
        blocks = self.num_blocks - sum(x.num_blocks for x in self.running)
        if r.num_slots > self.free_slots() or r.num_blocks > blocks:
            return False
        self.running[r] = r.duration_rounds
        return True


def policy(**config) -> FairAdmissionPolicy[Req]:
    return FairAdmissionPolicy(FairnessConfig(**{"class_weights": WEIGHTS, **config}))


def push(p: FairAdmissionPolicy[Req], *reqs: Req) -> None:
    for r in reqs:
        p.push(r, request_class=r.request_class, tenant=r.tenant, priority=r.priority, num_slots=r.num_slots)


def admit_limited(p: FairAdmissionPolicy[Req], limit: int, *, free_slots: int = 10**6,
                  running_by_tenant: dict[str, int] | None = None, batch_slots: int | None = None) -> list[Req]:
    """One round in which the engine takes `limit` requests, then refuses every other."""
    left = [limit]

    def try_admit(_: Req) -> bool:
        left[0] -= 1
        return left[0] >= 0

    return p.admit_round(try_admit, free_slots=free_slots, running_by_tenant=running_by_tenant or {},
                         batch_slots=batch_slots)


def ids(reqs: list[Req]) -> list[int]:
    return [r.rid for r in reqs]


def recording(engine: Engine, log: list[tuple[int, bool]]) -> Callable[[Req], bool]:
    def try_admit(r: Req) -> bool:
        log.append((r.rid, engine.try_admit(r)))
        return log[-1][1]

    return try_admit


def checking(engine: Engine, waiting: set[Req], *, cap: int | None, reserve: int) -> Callable[[Req], bool]:
    """The engine's try_admit, asserting rule 5, the tenant cap and the reserve at every call."""
    refused: set[Req] = set()

    def try_admit(r: Req) -> bool:
        assert r in waiting and r not in refused, "asked twice in one round, or not waiting"
        by_tenant = engine.running_by_tenant()
        if not engine.try_admit(r):
            refused.add(r)
            return False
        assert cap is None or by_tenant.get(r.tenant, 0) < cap, "a tenant over its cap"
        assert engine.batch_slots() <= engine.num_slots - reserve, "batch work took the reserve"
        return True

    return try_admit


# --- tables -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("config", "message"), [
    ({"class_weights": {INTERACTIVE: 1}},
     "class_weights must weigh exactly interactive, batch: no weight for 'batch'"),
    ({"class_weights": {**WEIGHTS, "bulk": 1}}, "class_weights must weigh exactly .*: 'bulk' is not a class"),
    ({"class_weights": {INTERACTIVE: 0, BATCH: 1}}, r"class_weights\['interactive'\] must be a finite"),
    ({"class_weights": {INTERACTIVE: 1, BATCH: math.nan}}, r"class_weights\['batch'\] must be a finite"),
    ({"class_weights": {INTERACTIVE: math.inf, BATCH: 1}}, r"class_weights\['interactive'\] must be"),
    ({"tenant_weights": {"acme": -1}}, r"tenant_weights\['acme'\] must be a finite number > 0, got -1"),
    ({"max_overtakes": -1}, "max_overtakes must be an integer >= 0"),
    ({"aging_admissions": 1.5}, "aging_admissions must be an integer >= 0, got 1.5"),
    ({"tenant_max_running": 0}, r"tenant_max_running must be an integer >= 1 or None \(no cap\), got 0"),
    ({"tenant_fairness": "yes"}, "tenant_fairness must be True or False"),
])
def test_config_errors_name_the_field_and_what_to_change(config, message):
    with pytest.raises(ValueError, match=message):
        FairnessConfig(**{"class_weights": WEIGHTS, **config})


def test_config_copies_and_freezes_its_weights():
    tenant_weights = {"acme": 2.0}
    config = FairnessConfig(class_weights=dict(WEIGHTS), tenant_weights=tenant_weights)
    tenant_weights["acme"] = 9.0
    assert config.tenant_weights == {"acme": 2.0}
    with pytest.raises(TypeError):
        config.class_weights[BATCH] = 5.0  # type: ignore[index]


def test_push_rejects_an_unknown_class_a_duplicate_and_zero_slots():
    p = policy()
    with pytest.raises(ValueError, match="request class 'bulk' is not one of interactive, batch"):
        p.push(Req(0), request_class="bulk", tenant="", priority=0, num_slots=1)
    with pytest.raises(ValueError, match="request class 'bulk'"):
        p.has_waiting("bulk")
    push(p, Req(0))
    with pytest.raises(ValueError, match="already queued"):
        push(p, Req(0))
    with pytest.raises(ValueError, match="num_slots must be >= 1"):
        p.push(Req(1), request_class=INTERACTIVE, tenant="", priority=0, num_slots=0)
    assert len(p) == 1


def test_remove_waiting_by_class_and_has_waiting():
    p = policy(tenant_fairness=True)
    assert p.waiting_by_class() == dict.fromkeys(REQUEST_CLASSES, 0)
    push(p, Req(0), Req(1, BATCH, "a"), Req(2, BATCH, "b"))
    assert p.waiting_by_class() == {INTERACTIVE: 1, BATCH: 2} and p.has_waiting(INTERACTIVE)
    assert p.remove(Req(0)) and not p.remove(Req(0))
    assert p.waiting_by_class() == {INTERACTIVE: 0, BATCH: 2} and not p.has_waiting(INTERACTIVE)
    assert sorted(ids(list(p))) == [1, 2] and len(p) == 2
    assert ids(p.admit_round(lambda _: True, free_slots=9, running_by_tenant={})) == [1, 2]
    assert not p.has_waiting(BATCH) and len(p) == 0


def test_priority_then_ticket_within_a_queue():
    p = policy(aging_admissions=100)
    push(p, *(Req(i, priority=prio) for i, prio in enumerate([3, 1, 2, 1, 0])))
    assert ids(p.admit_round(lambda _: True, free_slots=9, running_by_tenant={})) == [4, 1, 3, 2, 0]


def test_aging_lets_a_passed_entry_go_first():
    p = policy(aging_admissions=2)
    push(p, Req(0, priority=5), *(Req(i, priority=0) for i in (1, 2, 3)))
    assert [ids(admit_limited(p, 1)) for _ in range(4)] == [[1], [2], [0], [3]]  # passed twice, then first


def test_class_weights_interleave_eight_to_one():
    p = policy()
    push(p, *(Req(i) for i in range(16)), Req(100, BATCH), Req(101, BATCH))
    assert ids(p.admit_round(lambda _: True, free_slots=99, running_by_tenant={})) == [
        *range(8), 100, *range(8, 16), 101]


def test_ties_go_to_interactive_then_to_the_tenant_name():
    p = policy(class_weights={INTERACTIVE: 1, BATCH: 1}, tenant_fairness=True)
    push(p, Req(0, INTERACTIVE, "b"), Req(1, BATCH, "a"), Req(2, INTERACTIVE, "a"))
    assert ids(p.admit_round(lambda _: True, free_slots=9, running_by_tenant={})) == [2, 1, 0]


def test_the_reserve_keeps_batch_out_and_skips_it_without_blocking():
    p = policy(class_weights={INTERACTIVE: 1, BATCH: 1}, max_overtakes=0)
    push(p, Req(0, BATCH), Req(1, BATCH), Req(2))
    # room for one batch slot: interactive 2, then batch 0; batch 1 would take the reserve
    assert ids(p.admit_round(lambda _: True, free_slots=4, running_by_tenant={}, batch_slots=1)) == [2, 0]
    push(p, Req(3), Req(4))
    # interactive work takes the last slots; the skipped batch head reserves nothing, even with K = 0
    assert ids(p.admit_round(lambda _: True, free_slots=2, running_by_tenant={}, batch_slots=0)) == [3, 4]
    assert ids(p.admit_round(lambda _: True, free_slots=3, running_by_tenant={}, batch_slots=1)) == [1]
    push(p, Req(5, BATCH, num_slots=2))  # room for batch, but fewer free slots than it needs
    assert ids(p.admit_round(lambda _: True, free_slots=1, running_by_tenant={}, batch_slots=5)) == []


def test_tenant_cap_skips_the_tenant_and_counts_this_rounds_admissions():
    p = policy(tenant_fairness=True, tenant_max_running=1, max_overtakes=0)
    push(p, Req(0, tenant="a"), Req(1, tenant="a"), Req(2, tenant="b"))
    tried: list[int] = []

    def try_admit(r: Req) -> bool:
        tried.append(r.rid)
        return True

    assert ids(p.admit_round(try_admit, free_slots=9, running_by_tenant={"a": 1})) == [2]
    assert tried == [2]  # a capped tenant is not even asked
    assert ids(p.admit_round(try_admit, free_slots=9, running_by_tenant={})) == [0]  # 0 brings a to its cap
    assert ids(p.admit_round(try_admit, free_slots=9, running_by_tenant={})) == [1]


def test_caps_and_tenants_count_only_with_tenant_fairness():
    p = policy(tenant_fairness=False, tenant_max_running=1, tenant_weights={"a": 100})
    push(p, Req(0, tenant="b"), Req(1, tenant="a"), Req(2, tenant="a"))
    assert ids(p.admit_round(lambda _: True, free_slots=9, running_by_tenant={"a": 5})) == [0, 1, 2]


def test_a_blocked_head_is_overtaken_k_times_across_queues_then_reserves_capacity():
    p = policy(tenant_fairness=True, max_overtakes=2)
    big, small = Req(0, tenant="a", num_blocks=9), [Req(i, tenant="b") for i in (1, 2, 3)]
    push(p, big, *small)
    tried: list[int] = []

    def engine(fits_big: bool):
        def try_admit(r: Req) -> bool:
            tried.append(r.rid)
            return fits_big or r is not big
        return try_admit

    assert ids(p.admit_round(engine(False), free_slots=9, running_by_tenant={})) == [1, 2]
    assert ids(p.admit_round(engine(False), free_slots=9, running_by_tenant={})) == []  # 3 would fit
    assert ids(p.admit_round(engine(True), free_slots=9, running_by_tenant={})) == [0, 3]
    assert tried == [0, 1, 2, 0, 0, 3]


def test_each_admission_overtakes_every_head_refused_before_it_in_the_round():
    p = policy(tenant_fairness=True, max_overtakes=2)
    push(p, Req(0, tenant="a", num_blocks=1), Req(1, tenant="b", num_blocks=1))
    push(p, *(Req(i, tenant="c") for i in (2, 3, 4)))

    def fits(*rids: int):
        return lambda r: r.num_blocks == 0 or r.rid in rids

    assert ids(p.admit_round(fits(), free_slots=9, running_by_tenant={})) == [2, 3]  # 0 and 1 overtaken twice
    assert ids(p.admit_round(fits(0), free_slots=9, running_by_tenant={})) == [0]  # then 1 holds: 4 waits
    assert ids(p.admit_round(fits(1), free_slots=9, running_by_tenant={})) == [1, 4]


def test_a_reserving_head_holds_even_while_its_tenant_is_capped():
    p = policy(tenant_fairness=True, tenant_max_running=1, max_overtakes=0)
    push(p, Req(0, tenant="a"), Req(1, tenant="b"))
    assert admit_limited(p, 0) == []  # 0 refused with K = 0: it reserves capacity at once
    assert admit_limited(p, 9, running_by_tenant={"a": 1}) == []  # 1 would fit; 0's tenant drains first
    assert ids(admit_limited(p, 9)) == [0, 1]


def test_the_window_behind_a_blocked_head_is_k_entries_tried_once_each():
    p = policy(max_overtakes=2)
    reqs = [Req(i) for i in range(5)]
    push(p, *reqs)
    tried: list[int] = []

    def try_admit(r: Req) -> bool:
        tried.append(r.rid)
        return r.rid == 2

    assert ids(p.admit_round(try_admit, free_slots=9, running_by_tenant={})) == [2]
    assert tried == [0, 1, 2]  # 3 is outside the window; nobody is asked twice


def test_a_fifo_head_overtaken_k_times_holds_as_in_admission_policy():
    engines = Engine(4, 5), Engine(4, 5)
    fair, fifo = policy(max_overtakes=1), AdmissionPolicy(depth=9, max_overtakes=1)
    for e in engines:
        e.running[Req(99, num_blocks=1, duration_rounds=9)] = 9
    for r in (Req(0, num_blocks=5), Req(1, num_blocks=1), Req(2, num_blocks=1)):
        push(fair, r)
        fifo.push(r)
    calls: tuple[list, list] = ([], [])
    for _ in range(2):
        assert fair.admit_round(recording(engines[0], calls[0]), free_slots=3, running_by_tenant={}) == (
            fifo.admit_round(recording(engines[1], calls[1])))
    assert calls[0] == calls[1] == [(0, False), (1, True), (0, False)]  # 2 would fit; 0 holds


# --- properties -------------------------------------------------------------------------------------------

# a request: class, tenant, priority, slots, blocks, rounds it runs
arrival = st.tuples(st.sampled_from(REQUEST_CLASSES), st.sampled_from(TENANTS), st.integers(-2, 2),
                    st.integers(1, 4), st.integers(1, 8), st.integers(1, 3))
rounds_of = st.lists(st.tuples(st.lists(arrival, max_size=4), st.none() | st.integers(0, 99)),
                     min_size=1, max_size=20)  # per round: arrivals, and which waiter gives up


backlogged_rounds = st.lists(  # more arrivals than the engine takes: heads block, and are overtaken
    st.tuples(st.lists(arrival, min_size=1, max_size=6), st.none() | st.integers(0, 99)),
    min_size=4, max_size=30)


@derandomized(250)
@given(k=st.integers(0, 3), num_slots=st.integers(1, 4), num_blocks=st.integers(2, 8),
       priority=st.integers(-3, 3), aging=st.integers(0, 3), reserve=st.integers(0, 3), w=weights,
       rounds=backlogged_rounds)
def test_unmarked_traffic_is_todays_fifo_try_for_try(k, num_slots, num_blocks, priority, aging, reserve, w,
                                                     rounds):
    """All interactive, one priority, no tenant fairness (tenants, caps and weights given but ignored):
    rule 1 makes one FIFO by ticket (aging orders aged entries by ticket, and with one priority the aged
    ones are the oldest), rule 3 asks every interactive entry, and rule 4 is today's bounded overtaking
    with a window of K. So every call to try_admit, and every admission, equals AdmissionPolicy's."""
    fair = policy(class_weights={INTERACTIVE: w, BATCH: 1}, tenant_weights={"a": 3}, tenant_max_running=1,
                  max_overtakes=k, aging_admissions=aging)
    fifo: AdmissionPolicy[Req] = AdmissionPolicy(depth=sys.maxsize, max_overtakes=k)
    engines, calls = (Engine(num_slots, num_blocks), Engine(num_slots, num_blocks)), ([], [])
    rid = 0
    for t in range(10**4):  # the rounds, then drain
        arrivals, gives_up = rounds[t] if t < len(rounds) else ([], None)
        if t >= len(rounds) and not len(fifo):
            break
        for engine in engines:
            engine.finish_round()
        for _, tenant, _, n, blocks, d in arrivals:
            r = Req(rid, INTERACTIVE, tenant, priority, min(n, num_slots), min(blocks, num_blocks), d)
            rid += 1
            push(fair, r)
            fifo.push(r)
        if gives_up is not None and len(fifo):
            r = list(fifo)[gives_up % len(fifo)]
            assert fair.remove(r) and fifo.remove(r)
        got = fair.admit_round(recording(engines[0], calls[0]), free_slots=engines[0].free_slots(),
                               running_by_tenant=engines[0].running_by_tenant(),
                               batch_slots=max(0, num_slots - reserve))
        assert got == fifo.admit_round(recording(engines[1], calls[1]))
        assert calls[0] == calls[1]
    assert len(fair) == len(fifo) == 0


@derandomized(100)
@given(w_i=weights, w_b=weights, fairness=st.booleans(),
       limits=st.lists(st.integers(0, 6), min_size=1, max_size=30))
def test_class_weights_are_honoured_within_one_admission(w_i, w_b, fairness, limits):
    """Both classes always backlogged, every entry eligible, the engine takes `limit` per round, then
    refuses (so nothing is admitted after a refusal). Rule 2 admits interactive (i) when F_i <= F_b (ties
    to i) and batch (b) when F_b < F_i, so D = F_i - F_b starts at 1/w_i - 1/w_b and stays in
    (-1/w_b, 1/w_i]: an i-admission from D <= 0 ends <= 1/w_i, a b-admission from D > 0 ends > -1/w_b.
    With F_x = (c_x + 1)/w_x after c_x admissions: c_i/w_i - c_b/w_b in (-1/w_i, 1/w_b], i.e. after every
    prefix  -w_b < c_i*w_b - c_b*w_i <= w_i : each class is within one admission of its weighted share."""
    p = policy(class_weights={INTERACTIVE: w_i, BATCH: w_b}, tenant_fairness=fairness)
    counts, rid = {INTERACTIVE: 0, BATCH: 0}, 0
    for limit in limits:
        for c in REQUEST_CLASSES:  # top up: more waiting than one round admits
            while p.waiting_by_class()[c] < 7:
                push(p, Req(rid, c, TENANTS[rid % 3], rid % 5 - 2))
                rid += 1
        for r in admit_limited(p, limit):
            counts[r.request_class] += 1
            gap = counts[INTERACTIVE] * Fraction(w_b) - counts[BATCH] * Fraction(w_i)
            assert -Fraction(w_b) < gap <= Fraction(w_i), counts


@derandomized(100)
@given(request_class=st.sampled_from(REQUEST_CLASSES), tw=st.tuples(weights, weights, weights),
       limits=st.lists(st.integers(0, 6), min_size=1, max_size=30))
def test_tenant_weights_are_honoured_within_one_admission(request_class, tw, limits):
    """Three tenants of one class always backlogged. The argument of the class test holds for every pair
    x before y in name order, whatever the third does (its admissions move neither F_x nor F_y):
    after every prefix  -w_y < c_x*w_y - c_y*w_x <= w_x ."""
    tenant_weights = dict(zip(TENANTS, tw, strict=True))
    p = policy(tenant_fairness=True, tenant_weights=tenant_weights)
    waiting, counts, rid = dict.fromkeys(TENANTS, 0), dict.fromkeys(TENANTS, 0), 0
    for limit in limits:
        for t in TENANTS:
            for _ in range(7 - waiting[t]):
                push(p, Req(rid, request_class, t, rid % 5 - 2))
                rid, waiting[t] = rid + 1, waiting[t] + 1
        for r in admit_limited(p, limit):
            counts[r.tenant] += 1
            waiting[r.tenant] -= 1
            for x, y in (("a", "b"), ("a", "c"), ("b", "c")):
                wx, wy = Fraction(tenant_weights[x]), Fraction(tenant_weights[y])
                assert -wy < counts[x] * wy - counts[y] * wx <= wx, counts


@derandomized(100)
@pytest.mark.parametrize("why", ["class_idle", "class_reserve", "tenant_idle", "tenant_capped"])
@given(w_a=weights, w_b=weights, away=st.lists(st.integers(0, 6), max_size=12),
       back=st.lists(st.integers(0, 6), min_size=1, max_size=12))
def test_a_returning_queue_banks_no_credit(why, w_a, w_b, away, back):
    """Queue a (interactive, or tenant "a") is always backlogged; b (batch, or tenant "b") is away for
    the rounds in `away`: empty, or waiting but skipped by rule 3 (the reserve, or its tenant's cap).
    When b returns its pass is V (lifted on arrival or at each admission it sat out), so F_b is in
    [V + 1/w_b, V + 2/w_b] while F_a is in (V, V + 2/w_a]: D0 = F_a - F_b in (-2/w_b, 2/w_a - 1/w_b].
    As in the weight test D then stays in [min(D0, -1/w_b), max(D0, 1/w_a)], so the admissions after b's
    return, c'_a/w_a - c'_b/w_b = D - D0, lie in [-2/w_a, 1/w_a + 2/w_b): after every prefix
    -2*w_b <= c'_a*w_b - c'_b*w_a < w_b + 2*w_a . Credit banked while away would break the left side."""
    level, reason = why.split("_")
    by_class = level == "class"
    p = policy(class_weights={INTERACTIVE: w_a, BATCH: w_b} if by_class else WEIGHTS,
               tenant_weights={} if by_class else {"a": w_a, "b": w_b}, tenant_fairness=not by_class,
               tenant_max_running=100)
    a, b = ((INTERACTIVE, ""), (BATCH, "")) if by_class else ((INTERACTIVE, "a"), (INTERACTIVE, "b"))
    rid, counts = 0, {a: 0, b: 0}

    def top_up(*queues):
        nonlocal rid
        for q in queues:
            while sum(1 for r in p if (r.request_class, r.tenant) == q) < 7:
                push(p, Req(rid, *q))
                rid += 1

    for limit in away:
        top_up(a) if reason == "idle" else top_up(a, b)
        admit_limited(p, limit, batch_slots=0 if reason == "reserve" else None,  # no room for batch work
                      running_by_tenant={"b": 100} if reason == "capped" else {})
    for limit in back:
        top_up(a, b)
        for r in admit_limited(p, limit):
            counts[(r.request_class, r.tenant)] += 1
            gap = counts[a] * Fraction(w_b) - counts[b] * Fraction(w_a)
            assert -2 * Fraction(w_b) <= gap < Fraction(w_b) + 2 * Fraction(w_a), counts


@derandomized(100)
@given(aging=st.sampled_from([0, 1, 2, 5, 10**9]),
       limits=st.lists(st.integers(0, 4), min_size=1, max_size=20),
       arrivals=st.lists(st.lists(st.integers(-2, 2), max_size=4), min_size=1, max_size=20))
def test_priority_orders_a_queue_and_aging_bounds_how_often_an_entry_is_passed(aging, limits, arrivals):
    """One queue; the engine takes `limit` per round, then refuses (nothing is admitted after a refusal).
    Each admission is the queue's first entry by rule 1. Without aging (A = 10**9) that is the lowest
    (priority, ticket) waiting. With aging, an entry passed by A later-ticket admissions goes before every
    unaged entry, and an older aged entry was waiting when it arrived: so later tickets are admitted ahead
    of an entry at most A times."""
    p = policy(aging_admissions=aging)
    waiting: dict[Req, int] = {}  # -> later-ticket admissions ahead of it
    rid = 0
    for t in range(len(arrivals) + 40):
        for prio in arrivals[t] if t < len(arrivals) else []:
            r = Req(rid, priority=prio)
            rid += 1
            push(p, r)
            waiting[r] = 0
        for r in admit_limited(p, limits[t % len(limits)] if t < len(arrivals) else 4):
            if aging == 10**9:
                assert (r.priority, r.rid) == min((x.priority, x.rid) for x in waiting)
            assert waiting.pop(r) <= aging
            for x in waiting:
                waiting[x] += x.rid < r.rid
    assert not waiting and len(p) == 0


def starvation_bound(config: FairnessConfig, r: Req, ahead: int) -> int:
    """Admissions before r, of which `ahead` were waiting in its queue when it arrived (test below)."""
    own = ahead + config.aging_admissions
    tw = {t: Fraction(config.tenant_weights.get(t, 1.0)) for t in TENANTS}
    m = own + (sum(math.ceil((own + 2) * tw[u] / tw[r.tenant]) for u in TENANTS if u != r.tenant)
               if config.tenant_fairness else 0)
    cw = {c: Fraction(w) for c, w in config.class_weights.items()}
    return m + sum(math.ceil((m + 2) * cw[d] / cw[r.request_class]) for d in REQUEST_CLASSES
                   if d != r.request_class)


@derandomized(150)
@given(w_i=weights, w_b=weights, tw=st.tuples(weights, weights, weights), fairness=st.booleans(),
       k=st.integers(1, 3), aging=st.integers(0, 5), num_slots=st.integers(1, 4), rounds=rounds_of)
def test_no_starvation_every_request_is_admitted_within_a_derived_number_of_admissions(
        w_i, w_b, tw, fairness, k, aging, num_slots, rounds):
    """One slot per request, no reserve, no caps; requests finish within 3 rounds, so capacity keeps
    freeing. The engine refuses only with no slot free, and then nothing more enters that round (no
    blocked head is ever overtaken, K >= 1: nobody reserves), so every admission follows rules 1-2 over
    the waiting queues. For r in class c, queue q, with Q0 entries waiting in q when it arrived:
    - from q, at most Q0 + A others: older ones, and later tickets only until r is aged (rule 1);
    - from another queue u of c (tenant fairness), while q waits: F_u <= F_q <= V + (m_q + 2)/w_q and
      the j-th such admission has F_u > V + j/w_u, so at most ceil((m_q + 2) * w_u/w_q) with m_q = Q0 + A;
    - from the other class d, likewise at most ceil((m + 2) * W_d/W_c), m being all of c's before r.
    V is the virtual time when r arrived. starvation_bound adds these up."""
    config = FairnessConfig(class_weights={INTERACTIVE: w_i, BATCH: w_b}, tenant_fairness=fairness,
                            tenant_weights=dict(zip(TENANTS, tw, strict=True)), max_overtakes=k,
                            aging_admissions=aging)
    p: FairAdmissionPolicy[Req] = FairAdmissionPolicy(config)
    engine = Engine(num_slots)
    waiting: dict[Req, tuple[int, int]] = {}  # -> (admissions so far when it arrived, its bound)
    admissions = rid = 0
    for t in range(len(rounds) + 400):
        arrivals, gives_up = rounds[t] if t < len(rounds) else ([], None)
        engine.finish_round()
        for c, tenant, prio, _, _, d in arrivals:
            r = Req(rid, c, tenant, prio, duration_rounds=d)
            rid += 1
            ahead = sum(1 for x in waiting if x.request_class == c and (x.tenant == tenant or not fairness))
            waiting[r] = (admissions, starvation_bound(config, r, ahead))
            push(p, r)
        if gives_up is not None and waiting:
            r = list(waiting)[gives_up % len(waiting)]
            assert p.remove(r)
            del waiting[r]
        for r in p.admit_round(engine.try_admit, free_slots=engine.free_slots(), running_by_tenant={}):
            arrived_at, bound = waiting.pop(r)
            assert admissions - arrived_at <= bound, (r, admissions - arrived_at, bound)
            admissions += 1
        if t >= len(rounds) and not waiting:
            break
    assert not waiting and len(p) == 0


@derandomized(200)
@given(fairness=st.booleans(), cap=st.none() | st.integers(1, 2), num_slots=st.integers(1, 4),
       reserve_share=st.integers(0, 3), num_blocks=st.integers(1, 6), k=st.integers(0, 3),
       aging=st.integers(0, 4), w_i=weights, w_b=weights, rounds=rounds_of)
def test_caps_and_reserve_hold_and_nothing_deadlocks(fairness, cap, num_slots, reserve_share, num_blocks, k,
                                                       aging, w_i, w_b, rounds):
    """Everything at once: classes, tenants, priorities, multi-slot requests, blocks, refusals, K and
    caps, on an engine whose requests finish within L = 3 rounds. Asserted at every admission: the tenant
    was under its cap counting what the engine still runs, batch work left the reserve free, and no item
    is asked twice in a round after a refusal (rule 5). Derived: a round that starts on an empty engine
    admits someone (no tenant is at a cap, a reserving head or else the first candidate in fair order
    fits; every request here fits an empty engine, batch ones beside the reserve); so with requests
    waiting, at most L - 1 rounds in a row admit nobody (the engine is empty L rounds after the last
    admission), and the queue drains within L rounds per waiter."""
    reserve = min(reserve_share, num_slots - 1)
    p = policy(class_weights={INTERACTIVE: w_i, BATCH: w_b}, tenant_fairness=fairness, tenant_max_running=cap,
               max_overtakes=k, aging_admissions=aging)
    engine = Engine(num_slots, num_blocks)
    waiting: set[Req] = set()
    idle = rid = 0
    for t in range(10**4):
        arrivals, gives_up = rounds[t] if t < len(rounds) else ([], None)
        if t >= len(rounds) and not waiting:
            break
        assert t < len(rounds) + 3 * (rid + 1), "the queue did not drain within L rounds per waiter"
        engine.finish_round()
        for c, tenant, prio, n, blocks, d in arrivals:
            usable_slots = num_slots - (reserve if c == BATCH else 0)  # every request fits an empty engine
            r = Req(rid, c, tenant, prio, min(n, usable_slots), min(blocks, num_blocks), d)
            rid += 1
            waiting.add(r)
            push(p, r)
        if gives_up is not None and waiting:
            r = sorted(waiting, key=lambda x: x.rid)[gives_up % len(waiting)]
            assert p.remove(r)
            waiting.remove(r)
        was_empty, had_waiting = not engine.running, bool(waiting)
        try_admit = checking(engine, waiting, cap=cap if fairness else None, reserve=reserve)
        admitted = p.admit_round(try_admit, free_slots=engine.free_slots(),
                                 running_by_tenant=engine.running_by_tenant(),
                                 batch_slots=num_slots - reserve - engine.batch_slots())
        assert set(admitted) <= set(engine.running) and len(set(admitted)) == len(admitted)
        waiting -= set(admitted)
        assert set(p) == waiting
        if was_empty and had_waiting:
            assert admitted, "an empty engine admitted nobody"
        idle = 0 if admitted else idle + had_waiting
        assert idle <= 2, "L = 3 rounds passed without an admission"
    assert not waiting and len(p) == 0
