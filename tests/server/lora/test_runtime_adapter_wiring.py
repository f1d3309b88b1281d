"""The runtime adapter flags and their wiring: `--lora-dir` and `--lora-list-file` checked at start with the
flag named; an adapter call's answer goes back to the HTTP process that asked while every one hears of the
adapters served (engine/front_inbox.py); the client answers calls and ends a request whose adapter was
unloaded before it reached the engine as an unknown model's; a bad list line refuses the start in one line
naming it."""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import subprocess
import sys

import pytest
from flotilla_server.cli import parse_settings
from flotilla_server.engine.client import EngineClient
from flotilla_server.engine.front_inbox import FrontInbox
from flotilla_server.engine.messages import (
    ADAPTER_NOT_SERVED,
    NOT_SERVED_PREFIX,
    AdapterReply,
    EngineInfo,
    EngineUpdate,
    LoadAdapter,
)
from flotilla_server.engine.outputs import EngineStats
from flotilla_server.engine.sampling_params import SamplingParams
from flotilla_server.http.refusals import abort_message

from tests.server.http.server_process import REPO
from tests.support.hf_models import make_hf_model_dir


def refusal(argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as exc:
        parse_settings(argv, {})
    assert exc.value.code == 2
    return capsys.readouterr().err.strip().splitlines()[-1]


def test_the_flags_are_checked_at_start_naming_them(tmp_path, capsys):
    assert "--lora-dir" in refusal(["--lora-dir", str(tmp_path / "missing")], capsys)
    assert "multi-model mode" in refusal(["--model", "a=tiny", "--lora-dir", str(tmp_path)], capsys)
    assert "multi-model mode" in refusal(["--model", "a=tiny", "--lora-list-file", str(tmp_path / "f")], capsys)
    settings = parse_settings(["--lora-dir", str(tmp_path), "--lora-dir", "/tmp", "--device", "cuda"], {})
    config = settings.engine_config()
    assert settings.lora_dirs == (str(tmp_path), "/tmp") and config.lora_runtime_loads and config.serves_adapters
    assert not config.cuda_graphs  # auto: a captured step cannot follow each row's adapter
    listed = parse_settings(["--lora-list-file", str(tmp_path / "f")], {}).engine_config()
    assert listed.lora_list_file == str(tmp_path / "f") and not listed.lora_runtime_loads


def test_an_adapter_call_is_answered_to_its_caller_and_the_adapters_served_reach_every_http_process():
    pipes = [mp.Pipe() for _ in range(2)]
    inbox = FrontInbox([engine_end for _, engine_end in pipes])
    pipes[1][0].send(LoadAdapter("call-1", "a", "/lora/a"))
    assert inbox.wait(5) and inbox.get() == LoadAdapter("call-1", "a", "/lora/a")
    stats = EngineStats(0, 0, 4, 0, 16, 0, adapters_served=("a",))
    inbox.send(EngineUpdate(stats, adapter_replies=[AdapterReply("call-1", 200, "Success")]))
    first, second = (front.recv() for front, _ in pipes)
    assert first.adapter_replies == [] and second.adapter_replies == [AdapterReply("call-1", 200, "Success")]
    assert first.stats.adapters_served == second.stats.adapters_served == ("a",)
    for front, engine_end in pipes:
        front.close()
        engine_end.close()


def test_a_bad_list_line_refuses_the_start_in_one_line_naming_it(tmp_path):
    base = make_hf_model_dir("llama", tmp_path / "base")
    file = tmp_path / "loras"
    file.write_text("# adapters\nok=/adapters/ok\nthis is not a line\n")
    done = subprocess.run([sys.executable, "-m", "flotilla_server.cli", "--model", str(base), "--engine-mode",
                           "inprocess", "--lora-list-file", str(file)], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    last = done.stderr.strip().splitlines()[-1]
    assert done.returncode == 2, done.stderr
    assert last.startswith(f"flotilla-server: error: --lora-list-file {file} line 3: "), last


class _Backend:
    """Starts nothing: the test plays the engine's updates itself."""

    def __init__(self) -> None:
        self.sent: list = []

    def start(self, on_update, on_death) -> EngineInfo:
        return EngineInfo("m", None, 384, 64, 4, 16, 16, adapters=("a",), max_loras=2)

    def send(self, message) -> None:
        self.sent.append(message)

    def close(self, timeout_s: float) -> None:
        pass


async def test_a_request_whose_adapter_was_unloaded_before_it_reached_the_engine_ends_as_model_not_found():
    backend = _Backend()
    client = EngineClient(backend)
    client.start()
    assert client.stats().adapters_served == ("a",)  # served from the start, before any update
    loop = asyncio.get_running_loop()
    stream = client.submit("r1", [1, 2, 3], SamplingParams(max_tokens=2, lora="a"), loop)
    refusal = f"{NOT_SERVED_PREFIX}'a' is not served here (adapters: )"
    client._on_update(EngineUpdate(EngineStats(0, 0, 4, 0, 16, 0), refused=[("r1", refusal)]))
    events = [e async for e in stream]
    assert events[-1].abort_reason == ADAPTER_NOT_SERVED
    assert abort_message(ADAPTER_NOT_SERVED)[1] == "model_not_found"
    call = asyncio.ensure_future(client.adapter_call(LoadAdapter("c1", "b", "/lora/b")))
    await asyncio.sleep(0)
    assert backend.sent[-1] == LoadAdapter("c1", "b", "/lora/b") and not call.done()
    client._on_update(EngineUpdate(EngineStats(0, 0, 4, 0, 16, 0, adapters_served=("b",)),
                                   adapter_replies=[AdapterReply("c1", 200, "Success")]))
    assert (await call).status == 200 and client.stats().adapters_served == ("b",)
    waiting = asyncio.ensure_future(client.adapter_call(LoadAdapter("c2", "c", "/lora/c")))
    await asyncio.sleep(0)
    client._on_death("the engine process exited")  # a caller never waits for a dead engine
    assert (await waiting).status == 503
