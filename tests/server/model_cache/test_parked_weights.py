"""Parked weights (model/parked_weights.py) and the parked models' rules (model_cache/parked_policy.py), in this
process: a parked model computes the same tokens from a read-only mapping of its parked file, parking it again
writes nothing, the KV pool's memory goes at once, and the bounds and staleness checks decide as documented
(docs/architecture.md, "Parked models")."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from flotilla_server.engine.config import EngineConfig
from flotilla_server.engine.loop import build_loop
from flotilla_server.engine.messages import AddRequest, EngineOptions
from flotilla_server.engine.sampling_params import SamplingParams
from flotilla_server.model import KVCacheTensors, load_model
from flotilla_server.model.parked_weights import SMALL_TENSOR_BYTES, park_to_file, private_anonymous_bytes
from flotilla_server.model_cache.parked_policy import ParkedCost, file_stamp, parked_victims, source_stamp

PROMPT = [5, 17, 42, 99, 3, 250, 7]


def greedy_tokens(loaded, max_tokens: int = 8) -> list[int]:
    loop = build_loop(EngineConfig(kv_cache_memory_bytes=4 * 2**20, dtype="float32"), EngineOptions(), loaded)
    loop.apply(AddRequest("r", PROMPT, SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)))
    tokens: list[int] = []
    while loop.has_work():
        update = loop.turn(lambda _timeout_s: False)
        tokens += [t for out in (update.outputs if update else []) for t in out.token_ids]
    loop.close()
    return tokens


def mapping_of(path: Path) -> tuple[int, int, str]:
    """(start, end, permissions) of this process's mapping of `path`."""
    for line in Path("/proc/self/maps").read_text().splitlines():
        if line.endswith(str(path)):
            span, perms = line.split()[:2]
            start, end = (int(x, 16) for x in span.split("-"))
            return start, end, perms
    raise AssertionError(f"{path} is not mapped")


def test_a_parked_model_computes_the_same_tokens_from_a_read_only_mapping_of_its_file(tmp_path):
    loaded = load_model("tiny", "float32")
    before = greedy_tokens(loaded)
    assert len(before) == 8
    weights = park_to_file(loaded.model, tmp_path / "tiny.parked")
    assert weights.path == str(tmp_path / "tiny.parked") and weights.bytes == os.path.getsize(weights.path)
    start, end, perms = mapping_of(tmp_path / "tiny.parked")
    assert perms.startswith("r-") and "w" not in perms  # a stray write faults instead of copying the page
    large = [t for t in [*loaded.model.parameters(), *loaded.model.buffers()]
             if t.untyped_storage().nbytes() >= SMALL_TENSOR_BYTES]
    assert large and all(start <= t.data_ptr() < end for t in large)  # views and tied weights included
    assert sum(t.numel() * t.element_size() for t in large) <= weights.bytes
    assert greedy_tokens(loaded) == before


def test_parked_again_unchanged_it_stays_in_its_file_and_writes_nothing(tmp_path):
    loaded = load_model("tiny", "float32")
    first = park_to_file(loaded.model, tmp_path / "a.parked")
    stamp = file_stamp(first.path)
    greedy_tokens(loaded)  # it served from the mapping in between
    again = park_to_file(loaded.model, tmp_path / "b.parked")
    assert again == first and not (tmp_path / "b.parked").exists() and file_stamp(first.path) == stamp


def test_releasing_the_kv_pool_frees_its_memory_whoever_holds_it():
    kv = KVCacheTensors.allocate(2, 64, 16, 2, 32, torch.float32, "cpu")
    held = list(kv.k)  # a closed loop's leftovers still hold them
    kv.release()
    assert all(t.untyped_storage().nbytes() == 0 for t in [*held, *kv.v])


def test_private_anonymous_bytes_counts_this_process_heap():
    assert private_anonymous_bytes() > 0
    assert private_anonymous_bytes(2**22 + 12345) == 0  # no such process: unknown


@pytest.mark.parametrize(("parked", "limit", "most", "victims"), [
    ([], 100, 2, []),
    ([("a", 40, 1.0), ("b", 40, 2.0)], 100, 2, []),
    ([("a", 40, 1.0), ("b", 40, 2.0), ("c", 40, 3.0)], 100, 4, ["a"]),  # bytes: the least recently parked go
    ([("b", 10, 2.0), ("a", 10, 1.0), ("c", 10, 3.0)], 100, 2, ["a"]),  # count
    ([("a", 10, 1.0), ("b", 150, 2.0)], 100, 4, ["a", "b"]),  # one alone over the limit goes too
    ([("a", 10, 1.0)], 100, 0, ["a"]),  # 0: nothing stays parked
])
def test_parked_victims_keep_both_bounds_least_recently_parked_first(parked, limit, most, victims):
    assert parked_victims([ParkedCost(*p) for p in parked], limit, most) == victims


def test_the_model_being_loaded_is_never_let_go_to_park_its_victim():
    parked = [ParkedCost("next", 95, 1.0), ParkedCost("victim", 10, 2.0)]
    assert parked_victims(parked, 100, 1, loading="next") == []  # "next" leaves when it wakes, next
    assert parked_victims([*parked, ParkedCost("old", 10, 0.5)], 100, 1, loading="next") == ["old"]


def test_a_source_stamp_changes_with_any_file_the_loader_reads(tmp_path):
    assert source_stamp("tiny") == ()
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF" + bytes(60))
    before = source_stamp(str(gguf))
    os.utime(gguf, ns=(1, 1))
    assert source_stamp(str(gguf)) != before
    model = tmp_path / "hf"
    model.mkdir()
    for name in ("config.json", "tokenizer.json", "model.safetensors"):
        (model / name).write_text("{}")
    (model / "README.md").write_text("not read by the loader")
    before = source_stamp(str(model))
    os.utime(model / "README.md", ns=(1, 1))
    assert source_stamp(str(model)) == before
    (model / "model.safetensors").write_text("{} ")
    assert source_stamp(str(model)) != before
    assert file_stamp(tmp_path / "gone") == ()
