"""The CPUs an engine may use: its cores capped by its container's CPU quota (engine/cpu_quota.py), as a pod
with `resources.cpu: 4` on a 64-core node has them."""

from __future__ import annotations

from pathlib import Path

import pytest
from flotilla_server.engine.cpu_quota import cpus_allowed, quota_cpus
from flotilla_server.engine.openmp_env import set_openmp_defaults


def files(tmp_path: Path, v2: str | None = None, v1: tuple[str, str] | None = None) -> dict:
    v2_path, quota, period = tmp_path / "cpu.max", tmp_path / "cfs_quota_us", tmp_path / "cfs_period_us"
    if v2 is not None:
        v2_path.write_text(v2 + "\n")
    if v1 is not None:
        quota.write_text(v1[0] + "\n")
        period.write_text(v1[1] + "\n")
    return {"v2_cpu_max": v2_path, "v1_quota": (quota, period)}


@pytest.mark.parametrize(("v2", "v1", "expected"), [
    ("400000 100000", None, 4.0),  # resources.cpu: 4
    ("250000 100000", None, 2.5),  # 2500m
    ("50000 100000", None, 0.5),
    ("max 100000", None, None),  # no limit
    ("max 100000", ("200000", "100000"), None),  # a v2 file that says "no limit" is the answer
    (None, ("200000", "100000"), 2.0),  # cgroup v1
    (None, ("-1", "100000"), None),  # v1's "no limit"
    (None, None, None),  # no cgroup files
    ("garbage", None, None),
])
def test_the_quota_is_read_from_cgroup_v2_then_v1(tmp_path: Path, v2: str | None, v1: tuple[str, str] | None,
                                                  expected: float | None) -> None:
    assert quota_cpus(**files(tmp_path, v2, v1)) == expected


@pytest.mark.parametrize(("cores", "quota", "expected"), [
    (64, 4.0, 4),  # the quota, not the node
    (64, 2.5, 2),  # a thread beyond the quota only waits at the barriers
    (64, 0.5, 1),
    (2, 8.0, 2),  # a quota above the cores leaves the cores
    (16, None, 16),
    (0, None, 1),
])
def test_the_cores_are_capped_by_the_quota(cores: int, quota: float | None, expected: int) -> None:
    assert cpus_allowed(cores, quota) == expected


def test_the_server_leaves_a_core_of_its_quota_to_http() -> None:
    env: dict[str, str] = {}
    set_openmp_defaults(env, leave_a_core=True, cpus=cpus_allowed(64, 4.0))
    assert env["OMP_NUM_THREADS"] == "3"
    env = {"OMP_NUM_THREADS": "8"}
    set_openmp_defaults(env, leave_a_core=True, cpus=4)
    assert env["OMP_NUM_THREADS"] == "8"  # the user's value wins
