"""flotilla-server's flags: every one documented, every one settable from FLOTILLA_*, bad values explained."""

from __future__ import annotations

from dataclasses import fields

import pytest
from flotilla_contract.flags import SERVER_FLAGS
from flotilla_server.cli import build_parser, env_var, parse_bytes, parse_settings
from flotilla_server.http.settings import ServerSettings

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
    (["--block-size", "12"], {}, "block_size must be a power of two"),
    (["--dtype", "int8"], {}, "dtype must be one of"),
    (["--kv-cache-memory", "lots"], {}, "not a size"),
    ([], {"FLOTILLA_MAX_NUM_SEQS": "many"}, "FLOTILLA_MAX_NUM_SEQS='many'"),
])
def test_bad_values_exit_with_a_message(argv, env, message, capsys):
    with pytest.raises(SystemExit) as exc:
        parse_settings(argv, env)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err
