"""The agreement rule between a real replica timeline and a simulated one, on hand-made timelines."""

from flotilla_sim.agreement import compare, scale_moments

CYCLE = [(1.0, 1), (3.0, 3), (5.0, 3), (7.0, 3), (9.0, 2), (11.0, 1), (13.0, 1)]


def _with(timeline, **changes):
    """`timeline` with the replicas at the given tick times (t1=..., t3=...) replaced."""
    replaced = {float(k[1:]): v for k, v in changes.items()}
    return [(t, replaced.get(t, n)) for t, n in timeline]


def test_moments_are_the_first_rise_above_the_start_and_the_first_fall_below_the_peak():
    assert scale_moments(CYCLE, initial=1) == {"up": 3.0, "down": 9.0}
    assert scale_moments([(2.0, 1), (4.0, 0), (6.0, 0)], initial=1) == {"up": None, "down": 4.0}
    # a timeline whose first tick already scaled still has its moment there
    assert scale_moments([(2.0, 3), (4.0, 3)], initial=1) == {"up": 2.0, "down": None}


def test_identical_timelines_agree():
    agreement = compare(CYCLE, CYCLE, initial=1, interval_s=2.0)
    assert agreement.ok and agreement.problems() == []
    assert "agree" in agreement.table()


def test_one_off_at_a_tick_agrees_two_off_does_not():
    assert compare(CYCLE, _with(CYCLE, t9=3), initial=1, interval_s=2.0).ok
    two_off = compare(CYCLE, _with(CYCLE, t13=3), initial=1, interval_s=2.0)  # back up after both scaled down
    assert not two_off.ok
    assert two_off.problems()[0] == "t=13.0s: real 1, simulated 3"
    assert "<-- off by more than 1" in two_off.table()


def test_a_scale_by_two_a_tick_later_agrees_between_the_moments_only():
    """One decision from 3 to 1, taken a tick later in the simulation: the tick between differs by 2, and the
    moments agree, so that tick is excused; a late scale-up by 2 likewise; moments too far apart are not."""
    real = [(1.0, 3), (3.0, 3), (5.0, 1), (7.0, 1)]
    late = [(1.0, 3), (3.0, 3), (5.0, 3), (7.0, 1)]
    assert compare(real, late, initial=3, interval_s=2.0).ok
    assert compare(late, real, initial=3, interval_s=2.0).ok
    assert compare(CYCLE, _with(CYCLE, t3=1), initial=1, interval_s=2.0).ok  # scaled up at 5, not 3
    assert compare(real, late, initial=3, interval_s=0.5).problems() == [
        "t=5.0s: real 1, simulated 3", "scale-down: real at 5.0s, simulated at 7.0s (more than 1s apart)"]


def test_moments_may_differ_by_two_intervals_not_more():
    real = [(1.0, 1), (3.0, 3), (5.0, 3), (7.0, 3), (9.0, 2), (11.0, 2), (13.0, 2), (15.0, 1)]
    two_late = _with(real, t9=3, t11=3)  # scale-down at 13 instead of 9: two intervals of 2 s
    assert compare(real, two_late, initial=1, interval_s=2.0).ok
    assert compare(real, two_late, initial=1, interval_s=1.5).problems() == [
        "scale-down: real at 9.0s, simulated at 13.0s (more than 3s apart)"]


def test_a_moment_in_one_timeline_only_disagrees():
    never_down = _with(CYCLE, t9=3, t11=3, t13=3)
    problems = compare(CYCLE, never_down, initial=1, interval_s=2.0).problems()
    assert any(p.startswith("scale-down: real at 9.0, simulated at None") for p in problems)


def test_the_scale_down_counts_from_the_lower_peak():
    """A real peak one replica above the simulated one (within the tolerance) and its step back are not the
    scale-down: both are measured as the first fall below 3 (the clean-clone CI run's timelines)."""
    real = [(1.0, 3), (3.0, 4), (5.0, 4), (7.0, 3), (9.0, 3), (11.0, 1), (13.0, 1)]
    sim = [(1.0, 3), (3.0, 3), (5.0, 3), (7.0, 3), (9.0, 3), (11.0, 3), (13.0, 1)]
    agreement = compare(real, sim, initial=1, interval_s=2.0)
    assert agreement.real_moments == {"up": 1.0, "down": 11.0}
    assert agreement.sim_moments == {"up": 1.0, "down": 13.0}
    assert agreement.ok, agreement.table()
    # alone, a timeline's scale-down is the first fall below its own peak
    assert scale_moments(real, initial=1)["down"] == 7.0
    # a simulated scale-down three intervals after the real one still disagrees
    late = [(1.0, 3), (3.0, 3), (5.0, 3), (7.0, 3), (9.0, 3), (11.0, 3), (13.0, 3), (15.0, 3), (17.0, 1)]
    real_longer = [*real, (15.0, 1), (17.0, 1)]
    assert compare(real_longer, late, initial=1, interval_s=2.0).problems()[-1] == (
        "scale-down: real at 11.0s, simulated at 17.0s (more than 4s apart)")
