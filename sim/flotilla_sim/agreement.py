"""Does a simulated replica timeline agree with a real one? The rule of the issue's first must-show.

Both timelines are (tick time, replicas after that tick's decision) at the same ticks: the replay
(replay.py) ticks when the real operator did. They agree when
- at every tick the replica counts differ by at most `replicas_tolerance` (1), except between the two
  timelines' moments of one kind when those agree (below): there one side has taken a decision the other
  takes a tick or two later, and a scale by more than the tolerance in one decision differs by more, and
- the scale-up moment (the first tick whose count is above the count both started from) and the
  scale-down moment (the first tick whose count falls below the lower of the two peaks) exist in both or
  in neither, and fall within `moment_tolerance_intervals` (2) autoscaler intervals of each other.
The scale-down is measured from the lower peak because a peak one replica higher is within the tolerance:
the real loop's Prometheus scrapes each server at its own moment, so a request that moves from one server
to another between two scrapes can count twice and add a replica the simulator (one instant per scrape)
does not. Stepping back from that replica is not the scale-down the simulator predicts.
Pure, so the rule is tested on hand-made timelines (tests/sim/test_agreement.py) and the e2e tests
only record and call it.
"""

from __future__ import annotations

from dataclasses import dataclass

Timeline = list[tuple[float, int]]


def peak(timeline: Timeline, initial: int) -> int:
    return max([initial] + [n for _, n in timeline])


def scale_moments(timeline: Timeline, initial: int, level: int | None = None) -> dict[str, float | None]:
    """When a timeline that started at `initial` replicas first scales up (above `initial`), and first
    scales down: the first tick below `level` (default: its own peak) after a count at or above it."""
    level = peak(timeline, initial) if level is None else level
    up = next((t for t, n in timeline if n > initial), None)
    reached = initial >= level
    down = None
    for t, n in timeline:
        if reached and n < level:
            down = t
            break
        reached = reached or n >= level
    return {"up": up, "down": down}


@dataclass(frozen=True)
class Agreement:
    rows: list[tuple[float, int, int]]  # (tick time, real replicas, simulated replicas)
    real_moments: dict[str, float | None]
    sim_moments: dict[str, float | None]
    interval_s: float
    replicas_tolerance: int
    moment_tolerance_intervals: float

    @property
    def limit_s(self) -> float:
        return self.moment_tolerance_intervals * self.interval_s

    def problems(self) -> list[str]:
        limit_s = self.limit_s
        found = [f"t={t:.1f}s: real {real}, simulated {sim}" for t, real, sim in self.rows if self._off(t, real, sim)]
        for kind in ("up", "down"):
            real, sim = self.real_moments[kind], self.sim_moments[kind]
            if (real is None) != (sim is None):
                found.append(f"scale-{kind}: real at {real}, simulated at {sim}")
            elif real is not None and sim is not None and abs(real - sim) > limit_s:
                found.append(f"scale-{kind}: real at {real:.1f}s, simulated at {sim:.1f}s (more than {limit_s:g}s apart)")
        return found

    def _off(self, t: float, real: int, sim: int) -> bool:
        """A tick breaking the replica rule: counts further apart than the tolerance, outside a transition
        (from one timeline's moment to the other's, for moments that agree)."""
        if abs(real - sim) <= self.replicas_tolerance:
            return False
        for kind in ("up", "down"):
            a, b = self.real_moments[kind], self.sim_moments[kind]
            if a is not None and b is not None and abs(a - b) <= self.limit_s and min(a, b) <= t < max(a, b):
                return False
        return True

    @property
    def ok(self) -> bool:
        return not self.problems()

    def table(self, notes: list[str] | None = None) -> str:
        """Both timelines side by side (with a note per tick), the moments, and the verdict."""
        notes = notes or [""] * len(self.rows)
        lines = ["   tick s  real  sim"]
        for (t, real, sim), note in zip(self.rows, notes, strict=True):
            off = f"  <-- off by more than {self.replicas_tolerance}" if self._off(t, real, sim) else ""
            lines.append(f"  {t:7.2f}  {real:4d} {sim:4d}  {note}{off}")
        for kind in ("up", "down"):
            lines.append(f"  scale-{kind}: real {_at(self.real_moments[kind])}, simulated {_at(self.sim_moments[kind])}")
        lines.append("  agree" if self.ok else "  DISAGREE: " + "; ".join(self.problems()))
        return "\n".join(lines)


def _at(time_s: float | None) -> str:
    return "never" if time_s is None else f"{time_s:.1f}s"


def compare(real: Timeline, simulated: Timeline, initial: int, interval_s: float, replicas_tolerance: int = 1,
            moment_tolerance_intervals: float = 2.0) -> Agreement:
    """Pair the two timelines tick by tick (the simulated one replays the real ticks, so times pair up);
    both started from `initial` replicas."""
    if len(real) != len(simulated):
        raise ValueError(f"the timelines must share their ticks: {len(real)} real, {len(simulated)} simulated")
    rows = [(t, r, s) for (t, r), (_, s) in zip(real, simulated, strict=True)]
    level = min(peak(real, initial), peak(simulated, initial))
    return Agreement(rows, scale_moments(real, initial, level), scale_moments(simulated, initial, level), interval_s,
                     replicas_tolerance, moment_tolerance_intervals)
