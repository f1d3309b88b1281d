"""The context a server advertises is the one it serves: capped by the pool, never silently by the model."""

from __future__ import annotations

import pytest
from flotilla_server.engine.config import EngineConfig
from flotilla_server.engine.core import cap_to_pool, resolve_max_model_len


def test_unset_limit_is_the_models_and_an_explicit_one_over_it_is_refused():
    assert resolve_max_model_len(EngineConfig(), 2048) == 2048
    assert resolve_max_model_len(EngineConfig(max_model_len=100), 2048) == 100
    with pytest.raises(ValueError, match=r"max_model_len 999999 is outside the model.s context of 1\.\.2048"):
        resolve_max_model_len(EngineConfig(max_model_len=999999), 2048)


def test_a_small_pool_lowers_an_unset_limit_with_a_warning_and_refuses_an_explicit_one(caplog):
    assert cap_to_pool(EngineConfig(num_kv_blocks=4), 2048, num_blocks=4) == 64
    assert "context limited to 64 tokens" in caplog.text
    assert cap_to_pool(EngineConfig(num_kv_blocks=200), 2048, num_blocks=200) == 2048
    with pytest.raises(ValueError, match="needs 7 KV blocks for one sequence but the pool has 4"):
        cap_to_pool(EngineConfig(num_kv_blocks=4, max_model_len=100), 100, num_blocks=4)


def test_the_engine_serves_and_refuses_at_the_limit_it_reports():
    from flotilla_server.engine.core import EngineCore

    core = EngineCore(EngineConfig(num_kv_blocks=4, max_num_seqs=2, max_num_batched_tokens=64, prefill_chunk=32))
    assert core.max_model_len == 64
    assert core.check_feasible(60, 4) is None
    assert "over the model's context of 64" in core.check_feasible(100, 1)
