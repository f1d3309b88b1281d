"""The CPU accounting the priorities benchmark prints beside each arm: real processes, read from /proc."""

import os
import subprocess
import sys
import time

from flotilla_server.bench.cpu_use import cores_used, cpu_s, descendants, snapshot

# spins until it has used 0.5 CPU-seconds of its own, says so, then waits to be told to exit
_SPIN = ("import sys, time\nwhile time.process_time() < 0.5: pass\nprint('spun', flush=True)\nsys.stdin.read()")


def test_a_busy_child_is_found_and_its_cpu_counted():
    """The child's own CPU-seconds are counted, however long a busy machine takes to give them to it (a bound on
    cores used, 0.3 of a core over 0.6 s, failed with three test workers on two cores)."""
    child = subprocess.Popen([sys.executable, "-c", _SPIN], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        start = time.perf_counter()
        before = snapshot({"child": [child.pid]})
        assert child.pid in descendants(os.getpid())
        assert child.stdout.readline() == "spun\n"
        seconds = time.perf_counter() - start
        used = cores_used(before, snapshot({"child": [child.pid]}), seconds)
        spun_s = used["child"] * seconds  # its start-up before `before` is not in it
        assert 0.3 < spun_s <= 0.6, (used, seconds)
        assert used["child"] <= 1.05, used  # one thread uses at most one core
    finally:
        child.communicate("")
    assert cpu_s(child.pid) is None  # reaped: gone, and a snapshot counts it as nothing
    assert snapshot({"gone": [child.pid], "none": []}) == {"gone": 0, "none": 0}


def test_no_interval_gives_no_figures():
    assert cores_used({"a": 1.0}, {"a": 2.0}, 0.0) == {}
