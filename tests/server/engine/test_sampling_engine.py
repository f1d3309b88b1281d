"""Sampling through the engine: no generator outlives its request, and unseeded requests draw from a seed
chosen per process (fresh engines differ) while a given `seed` reproduces."""

from __future__ import annotations

from flotilla_server.engine.sampling_params import SamplingParams

from .conftest import make_engine, run_to_completion


def test_no_generator_outlives_its_request(hf_model) -> None:
    core = make_engine(hf_model("llama")[1])
    seeded = SamplingParams(max_tokens=30, temperature=0.8, seed=3, ignore_eos=True)
    for rid in ("a", "b", "c"):
        core.add_request(rid, [1, 2, 3, 4], seeded)
    for _ in range(4):
        core.step()
    assert core.runner.num_generators == 3
    core.abort("b")  # between steps, as the engine loop applies every abort
    assert core.runner.num_generators == 2
    while core.has_unfinished():
        core.step()
    assert core.runner.num_generators == 0


def test_fresh_engines_differ_unseeded_and_agree_seeded(hf_model) -> None:
    loaded = hf_model("llama")[1]
    unseeded = SamplingParams(max_tokens=24, temperature=1.0, ignore_eos=True)
    seeded = SamplingParams(max_tokens=24, temperature=1.0, seed=1234, ignore_eos=True)
    runs = [run_to_completion(make_engine(loaded), {"u": ([5, 6, 7], unseeded), "s": ([5, 6, 7], seeded)})
            for _ in range(2)]
    assert runs[0]["s"]["token_ids"] == runs[1]["s"]["token_ids"]
    assert runs[0]["u"]["token_ids"] != runs[1]["u"]["token_ids"]
