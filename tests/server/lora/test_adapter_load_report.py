"""The load report's adapter fields (flotilla_contract.load.ServerLoad; http/load_report.py), which the gateway
routes adapter requests by: on a real engine loop following a list file, the adapters served, resident and
refused, and the free slots, move as adapters load, are pinned by a running sequence, are evicted, and as a
list line or an adapter's load is refused and then fixed; a pool's report sums its loaded bases' slots and
names the adapter of a skipped entry; a server without adapters reports none."""

from __future__ import annotations

import math
import time

import pytest
from flotilla_contract.load import AdapterServed
from flotilla_server.engine.config import EngineConfig
from flotilla_server.engine.core import EngineCore
from flotilla_server.engine.loop import EngineLoop
from flotilla_server.engine.messages import AddRequest, EngineOptions
from flotilla_server.engine.outputs import EngineStats
from flotilla_server.engine.sampling_params import SamplingParams
from flotilla_server.http.load_report import adapter_slots_free, pool_load, server_load
from flotilla_server.model import load_model
from flotilla_server.model_cache.membership import ListStatus, Skipped
from flotilla_server.model_cache.status import ModelStatus

from tests.support.hf_models import make_hf_model_dir, random_prompts
from tests.support.lora_adapters import make_lora_adapter

PROMPT = random_prompts([9], seed=3)[0]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora-load-report")
    base = make_hf_model_dir("llama", root / "base")
    adapters = {name: make_lora_adapter(base, root / name, rank=4, seed=seed) for name, seed in (("a", 1), ("b", 2))}
    return load_model(str(base), "float32", "cpu"), adapters, root


READ_DEADLINE_S = 60.0


class Followed:
    """An engine loop following a list file, and its latest stats as the HTTP side sees them."""

    def __init__(self, models, file) -> None:
        config = EngineConfig(model="unused", num_kv_blocks=64, max_lora_rank=16, max_loras=1,
                              lora_list_file=str(file))
        self.loop = EngineLoop(EngineCore(config, loaded=models[0]), EngineOptions(served_model_name="base"))
        self.max_loras = self.loop.info(0).max_loras
        self.stats: EngineStats | None = None

    def turns(self, n: int = 1) -> None:
        for _ in range(n):
            update = self.loop.turn(lambda _: False)
            if update is not None:
                self.stats = update.stats

    def report(self):
        assert self.stats is not None
        return server_load(stats=self.stats, queued=0, queue_capacity=8, accepting=True, model_name="base",
                           max_loras=self.max_loras)

    def reread(self) -> None:
        """The list file's next check is due now (it is every LIST_POLL_S), and so is the failed loads' retry."""
        self.loop.adapters._next_check_s = -math.inf
        self.loop.adapters._retry_s = -math.inf
        self.turns()  # reads the file and starts the reads it asks for
        # a deadline, not a count of turns: an idle turn takes microseconds, a read on a loaded machine longer
        deadline_s = time.monotonic() + READ_DEADLINE_S
        while self.loop.adapters.busy:
            assert time.monotonic() < deadline_s, f"the adapters' reads took over {READ_DEADLINE_S} s"
            time.sleep(0.005)
            self.turns()
        self.turns(2)

    def generate(self, rid: str, adapter: str, max_tokens: int) -> None:
        self.loop.apply(AddRequest(rid, PROMPT, SamplingParams(max_tokens=max_tokens, temperature=0.0,
                                                               ignore_eos=True, lora=adapter)))

    def finish(self) -> None:
        for _ in range(200):
            self.turns()
            if not self.loop.has_work():
                self.turns()
                return
        raise AssertionError("the engine did not finish")


def test_the_report_follows_loads_pins_evictions_and_refusals(models, tmp_path):
    _, adapters, root = models
    file = tmp_path / "loras"
    file.write_text(f"a={adapters['a']}\n")
    engine = Followed(models, file)
    engine.generate("1", "a", max_tokens=8)
    engine.turns()
    load = engine.report()
    assert load.adapters == [AdapterServed(name="a", base="base")] and load.adapters_resident == ["a"]
    assert (load.max_loras, load.adapter_slots_free) == (1, 0)  # its one slot is pinned by the running sequence
    assert (load.models[0].max_loras, load.models[0].adapter_slots_free) == (1, 0) and load.adapters_refused == []
    engine.finish()
    assert (engine.report().adapters_resident, engine.report().adapter_slots_free) == (["a"], 1)

    file.write_text(f"a={adapters['a']}\nb={adapters['b']}\nnot a line\nc={root / 'missing'}\n")
    engine.reread()
    load = engine.report()
    assert [s.name for s in load.adapters] == ["a", "b"]
    refused = {r.name: r.error for r in load.adapters_refused}
    assert set(refused) == {"not a line", "c"}
    assert refused["not a line"].startswith(f"--lora-list-file {file} line 3: ")
    assert "adapter_config.json" in refused["c"]

    engine.generate("2", "b", max_tokens=2)
    engine.finish()
    assert engine.report().adapters_resident == ["b"] and engine.stats.adapter_evictions == 1  # a gave b the slot

    file.write_text(f"b={adapters['b']}\n")
    engine.reread()
    load = engine.report()
    assert [s.name for s in load.adapters] == ["b"] and load.adapters_refused == []
    engine.loop.close()


@pytest.mark.parametrize(("resident", "running", "waiting", "free"), [
    ((), (), (), 4),
    (("a", "b"), (), (), 4),  # resident but idle: evictable, so free
    (("a", "b"), ("a",), (), 3),
    (("a", "b"), ("a",), ("b", "c"), 2),  # c waits for a slot it does not hold yet
    (("a", "b", "c", "d"), ("a", "b"), ("c", "d"), 0),
])
def test_free_slots_are_those_no_running_or_waiting_sequence_pins(resident, running, waiting, free):
    stats = EngineStats(0, 0, 4, 0, 16, 0, adapters_resident=resident, adapters_running=running,
                        adapters_waiting=waiting)
    assert adapter_slots_free(4, stats) == free
    assert adapter_slots_free(0, stats) == 0


def test_a_server_without_adapters_reports_none():
    load = server_load(stats=EngineStats(0, 0, 4, 0, 16, 0), queued=0, queue_capacity=8, accepting=True,
                       model_name="m")
    assert (load.adapters, load.adapters_resident, load.max_loras, load.adapter_slots_free, load.adapters_refused) \
        == ([], [], 0, 0, [])


def status(name: str, state: str) -> ModelStatus:
    return ModelStatus(name=name, state=state, memory_bytes=0, footprint_bytes=10, users=0, idle_s=None)


def test_a_pool_sums_its_loaded_bases_slots_and_names_a_skipped_adapter():
    loaded = EngineStats(0, 1, 4, 0, 16, 0, adapters_resident=("legal", "support"), adapters_running=("legal",))
    rows = [(status("llama", "loaded"), loaded, 0), (status("qwen", "available"), None, 0)]
    skipped = (Skipped("qwen", "/m/qwen", "adapter 'code': /a/code/adapter_model.safetensors not found: ..."),
               Skipped("gone", "/m/gone", "config.json not found"))
    load = pool_load(accepting=True, models=rows, queue_capacity=8, budget_bytes=100, used_bytes=10,
                     model_list=ListStatus("/list", 0, None, skipped),
                     adapters=[("legal", "llama"), ("support", "llama"), ("sql", "qwen")],
                     max_loras={"llama": 2})
    assert [(s.name, s.base) for s in load.adapters] == [("legal", "llama"), ("support", "llama"), ("sql", "qwen")]
    assert load.adapters_resident == ["legal", "support"]
    assert (load.max_loras, load.adapter_slots_free) == (2, 1)
    assert [(m.name, m.max_loras, m.adapter_slots_free) for m in load.models] == [("llama", 2, 1), ("qwen", 0, 0)]
    assert [(r.name, r.error.startswith("adapter 'code'")) for r in load.adapters_refused] == [("code", True)]
