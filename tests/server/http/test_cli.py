"""flotilla-server's flags: every one documented, every one settable from FLOTILLA_*, bad values explained."""

from __future__ import annotations

from dataclasses import fields

import pytest
from flotilla_contract.flags import SERVER_FLAGS
from flotilla_server.cli import build_parser, env_var, parse_bytes, parse_settings
from flotilla_server.http.settings import ServerSettings

from tests.support.ports import free_port

ISSUE_FLAGS = ["--model", "--served-model-name", "--host", "--port", "--max-num-seqs", "--max-num-batched-tokens",
               "--prefill-chunk", "--block-size", "--num-kv-blocks", "--kv-cache-memory", "--max-model-len",
               "--queue-depth-per-slot", "--queue-timeout-s", "--drain-timeout-s", "--dtype", "--device"]


def test_every_issue_flag_exists_with_help_and_env_var():
    help_text = build_parser({}).format_help()
    for flag in ISSUE_FLAGS:
        assert flag in help_text
    for flag in SERVER_FLAGS:
        assert flag.help and env_var(flag.flag) in help_text
    assert env_var("--kv-cache-memory") == "FLOTILLA_KV_CACHE_MEMORY"


def test_defaults():
    s = parse_settings([], {})
    assert (s.model, s.port, s.queue_depth_per_slot, s.queue_timeout_s) == ("tiny", 8000, 8, 30.0)


@pytest.mark.parametrize(("argv", "measured"), [
    ([], True),  # one model on the CPU, on the default count
    (["--device", "cuda"], False),
    (["--model", "a=tiny", "--model", "b=tiny"], False),  # multi-model: each engine gets its share
])
def test_one_model_on_the_cpu_measures_its_default_thread_count(argv, measured):
    s = parse_settings(argv, {})
    assert s.engine_options(measure_threads=True).measure_threads is measured
    assert s.engine_options().measure_threads is False  # a count the user set (OMP_NUM_THREADS)


@pytest.mark.parametrize(("argv", "graphs"), [
    ([], False),  # the CPU never captures
    (["--device", "cuda"], True),  # auto: one model on a GPU replays its decode steps
    (["--device", "cuda:1", "--cuda-graphs", "off"], False),
    (["--device", "cuda", "--model", "a=tiny", "--model", "b=tiny"], False),  # auto: not in multi-model mode
    (["--device", "cuda", "--model", "a=tiny", "--cuda-graphs", "on"], True),
])
def test_cuda_graphs_default_to_one_model_on_a_gpu(argv, graphs):
    assert parse_settings(argv, {}).engine_config().cuda_graphs is graphs


def test_settings_and_the_contract_table_name_the_same_fields_and_defaults():
    assert [f.name for f in fields(ServerSettings)] == [flag.dest for flag in SERVER_FLAGS]
    base = ServerSettings()
    for flag in SERVER_FLAGS:
        assert getattr(base, flag.dest) == flag.default, flag.flag
    parsed = parse_settings([], {})
    assert parsed == base


def test_env_fallback_and_flag_precedence():
    env = {"FLOTILLA_MAX_NUM_SEQS": "4", "FLOTILLA_QUEUE_TIMEOUT_S": "2.5", "FLOTILLA_KV_CACHE_MEMORY": "1Gi",
           "FLOTILLA_PORT": "9000"}
    s = parse_settings(["--port", "9100"], env)
    assert s.max_num_seqs == 4 and s.queue_timeout_s == 2.5 and s.kv_cache_memory_bytes == 2**30
    assert s.port == 9100


@pytest.mark.parametrize(("text", "expected"), [("1048576", 2**20), ("8Gi", 8 * 2**30), ("512Mi", 512 * 2**20),
                                                ("2G", 2 * 10**9), ("1.5Ki", 1536)])
def test_parse_bytes(text, expected):
    assert parse_bytes(text) == expected


@pytest.mark.parametrize(("argv", "env", "message"), [
    (["--port", "0"], {}, "--port must be in 1..65535"),
    (["--queue-timeout-s", "0"], {}, "--queue-timeout-s must be > 0"),
    (["--block-size", "12"], {}, "error: --block-size must be a power of two, got 12"),
    ([], {"FLOTILLA_BLOCK_SIZE": "3"}, "error: FLOTILLA_BLOCK_SIZE must be a power of two, got 3"),
    (["--block-size", "4"], {"FLOTILLA_BLOCK_SIZE": "3"}, "prefill"),  # the flag wins; no error of the variable's
    (["--dtype", "int8"], {}, "error: --dtype must be one of"),
    ([], {"FLOTILLA_DTYPE": "int8"}, "error: FLOTILLA_DTYPE must be one of"),
    (["--device", "tpu"], {}, "error: --device must be 'cpu' or 'cuda[:N]'"),
    (["--cuda-graphs", "on"], {}, "error: --cuda-graphs on needs --device cuda"),
    (["--max-num-seqs", "0"], {}, "error: --max-num-seqs must be >= 1"),
    (["--max-num-batched-tokens", "8"], {}, "error: --max-num-batched-tokens must be >= --prefill-chunk"),
    (["--log-level", "loud"], {}, "error: --log-level must be one of debug, info, warning, error, got 'loud'"),
    ([], {"FLOTILLA_PORT": "0"}, "error: FLOTILLA_PORT must be in 1..65535"),
    (["--served-model-name", " "], {}, "error: --served-model-name is empty"),
    (["--kv-cache-memory", "lots"], {}, "not a size"),
    ([], {"FLOTILLA_MAX_NUM_SEQS": "many"}, "FLOTILLA_MAX_NUM_SEQS='many'"),
    (["--http-processes", "0"], {}, "error: --http-processes must be >= 1, got 0"),
    (["--queue-depth-per-slot", "0"], {}, "error: --queue-depth-per-slot must be >= 1, got 0"),
    (["--http-processes", "2", "--engine-mode", "inprocess"], {}, "--http-processes 2 needs --engine-mode process"),
    (["--http-processes", "2", "--model", "a=tiny"], {}, "--http-processes 2 serves one model"),
    (["--http-processes", "3", "--max-num-seqs", "2", "--queue-depth-per-slot", "1"], {},
     "--http-processes 3 needs a queue place for each HTTP process, for batch requests too: the queue holds 2"),
])
def test_bad_values_exit_with_a_message(argv, env, message, capsys):
    if message == "prefill":  # the flag's valid value wins over the variable's bad one
        assert parse_settings(argv, env).block_size == 4
        return
    with pytest.raises(SystemExit) as exc:
        parse_settings(argv, env)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert message in err
    assert err.count("\n") == 1, err  # one line: no usage block


@pytest.mark.parametrize(("argv", "message"), [
    (["--model", "/nonexistent"], "error: --model '/nonexistent' is neither 'tiny', a directory nor a .gguf file"),
    (["--device", "cuda:99"], "error: --device 'cuda:99' is not available"),
    (["--max-model-len", "999999"], "error: --max-model-len 999999 is outside the model's context of 1..2048"),
    (["--num-kv-blocks", "4", "--max-model-len", "100"], "--max-model-len 100 does not fit: the KV pool (--num-kv-blocks) holds 64 tokens"),
    (["--kv-cache-memory", "64Ti"], "error: --kv-cache-memory: a KV cache of"),
    (["--host", "999.1.1.1"], "error: --host '999.1.1.1' is not an address this machine can listen on"),
])
def test_values_only_loading_can_refuse_exit_2_in_one_line(argv, message, capsys):
    from flotilla_server.cli import main

    assert main([*argv, "--port", str(free_port())]) == 2
    err = capsys.readouterr().err
    assert message in err
    assert "Traceback" not in err and err.count("\n") == 1, err


def test_a_port_in_use_is_refused_before_the_model_loads(capsys):
    import socket

    from flotilla_server.cli import main

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        assert main(["--host", "127.0.0.1", "--port", str(port)]) == 2
    err = capsys.readouterr().err
    assert f"error: --port {port} on 127.0.0.1 cannot be listened on" in err and "DEMONSTRATION" not in err
