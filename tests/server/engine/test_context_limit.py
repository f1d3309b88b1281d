"""The context a server advertises is the one it serves: capped by the pool, never silently by the model."""

from __future__ import annotations

import pytest
from flotilla_server.engine.config import EngineConfig
from flotilla_server.engine.core import EngineCore


def test_an_explicit_limit_over_the_models_context_is_refused_not_cut():
    with pytest.raises(ValueError, match=r"--max-model-len 999999 is outside the model.s context of 1\.\.2048"):
        EngineCore(EngineConfig(max_model_len=999999, num_kv_blocks=64))


def test_the_engine_serves_and_refuses_at_the_limit_it_reports():
    core = EngineCore(EngineConfig(num_kv_blocks=4, max_num_seqs=2, max_num_batched_tokens=64, prefill_chunk=32))
    assert core.max_model_len == 64
    assert core.check_feasible(60, 4) is None
    assert "over the model's context of 64" in core.check_feasible(100, 1)
