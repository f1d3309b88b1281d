"""The CPU accounting the priorities benchmark prints beside each arm: real processes, read from /proc."""

import os
import subprocess
import sys
import time

from flotilla_server.bench.cpu_use import cores_used, cpu_s, descendants, snapshot


def test_a_busy_child_is_found_and_its_cpu_counted():
    child = subprocess.Popen([sys.executable, "-c", "import time\nend = time.time() + 1.0\nwhile time.time() < end: pass"])
    try:
        start = time.perf_counter()
        before = snapshot({"child": [child.pid]})
        assert child.pid in descendants(os.getpid())
        time.sleep(0.6)
        used = cores_used(before, snapshot({"child": [child.pid]}), time.perf_counter() - start)
        assert 0.3 < used["child"] <= 1.05, used  # a spinning process uses about one core
    finally:
        child.wait()
    assert cpu_s(child.pid) is None  # reaped: gone, and a snapshot counts it as nothing
    assert snapshot({"gone": [child.pid], "none": []}) == {"gone": 0, "none": 0}


def test_no_interval_gives_no_figures():
    assert cores_used({"a": 1.0}, {"a": 2.0}, 0.0) == {}
