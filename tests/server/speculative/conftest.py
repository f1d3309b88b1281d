"""Engines for the speculative-decoding tests: a small random llama (a real forward pass, tokens that wander) and
the builtin `tiny` model, each with and without `--speculative ngram` on the same weights."""

from __future__ import annotations

import pytest
from flotilla_server.engine.config import EngineConfig
from flotilla_server.engine.core import EngineCore
from flotilla_server.model import LoadedModel, load_model

from tests.support.hf_models import make_hf_model_dir


@pytest.fixture(scope="session")
def llama(tmp_path_factory) -> LoadedModel:
    return load_model(str(make_hf_model_dir("llama", tmp_path_factory.mktemp("spec-llama"))), "float32", "cpu")


@pytest.fixture(scope="session")
def tiny() -> LoadedModel:
    return load_model("tiny", "float32", "cpu")


def engine(loaded: LoadedModel, k: int | None = None, **config) -> EngineCore:
    """An engine on `loaded`; k: speculating with k draft tokens, None: not speculating."""
    spec = {} if k is None else {"speculative": "ngram", "speculative_tokens": k}
    return EngineCore(EngineConfig(model="unused", small_step_threads=0, **spec, **config), loaded=loaded)
