"""OpenMP defaults (engine/openmp_env.py): set where the environment is silent, never over a user's value."""

from __future__ import annotations

from flotilla_server.engine.cpu_quota import usable_cpus
from flotilla_server.engine.openmp_env import SPIN_COUNT, set_openmp_defaults


def test_defaults_fill_an_empty_environment() -> None:
    env: dict[str, str] = {}
    assert set_openmp_defaults(env, leave_a_core=True)  # the count is the default: the engine may lower it
    assert env == {"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": str(SPIN_COUNT),
                   "OMP_NUM_THREADS": str(max(1, usable_cpus() - 1))}


def test_the_users_values_win_and_the_bench_keeps_its_own_thread_count() -> None:
    env = {"OMP_WAIT_POLICY": "ACTIVE", "GOMP_SPINCOUNT": "0"}
    assert not set_openmp_defaults(env, leave_a_core=False)
    assert env == {"OMP_WAIT_POLICY": "ACTIVE", "GOMP_SPINCOUNT": "0"}


def test_a_thread_count_the_user_set_is_kept_and_not_measured() -> None:
    env = {"OMP_NUM_THREADS": "6"}
    assert not set_openmp_defaults(env, leave_a_core=True)
    assert env["OMP_NUM_THREADS"] == "6"
