"""Shared fixtures for the simulator's tests: small synthetic traces, so `make test` grows by seconds."""

from __future__ import annotations

import numpy as np
import pytest
from flotilla_sim.workload import diurnal, synthetic


@pytest.fixture
def small_trace():
    rng = np.random.default_rng(7)
    return synthetic(diurnal(6.0, 900.0, rng, trough=0.5), 3, rng, prompt_tokens=800, output_tokens=120)
