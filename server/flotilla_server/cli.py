"""The `flotilla-server` command: flags (each with a FLOTILLA_* environment fallback) into one settings object.

The operator renders pod arguments from these flag names; keep them stable.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields

from flotilla_server import config as defaults

_QUANTITY = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*(Ki|Mi|Gi|Ti|K|M|G|T|k)?B?\s*$")
_UNITS = {None: 1, "K": 10**3, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12,
          "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}


def parse_bytes(text: str) -> int:
    """'8Gi', '512Mi', '2G', '1048576' → bytes; raises ValueError that says what to write."""
    m = _QUANTITY.match(text)
    if not m:
        raise ValueError(f"{text!r} is not a size: write bytes, or a number with Ki, Mi, Gi, K, M or G (e.g. 8Gi)")
    return int(float(m.group(1)) * _UNITS[m.group(2)])


def _size_flag(text: str) -> int:
    try:
        return parse_bytes(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


@dataclass(frozen=True)
class ServerSettings:
    model: str = "tiny"
    served_model_name: str | None = None
    host: str = "0.0.0.0"
    port: int = 8000
    max_num_seqs: int = defaults.DEFAULT_MAX_NUM_SEQS
    max_num_batched_tokens: int = defaults.DEFAULT_MAX_NUM_BATCHED_TOKENS
    prefill_chunk: int = defaults.DEFAULT_PREFILL_CHUNK
    block_size: int = defaults.DEFAULT_BLOCK_SIZE
    num_kv_blocks: int | None = None
    kv_cache_memory_bytes: int | None = None
    max_model_len: int | None = None
    queue_depth_per_slot: int = defaults.DEFAULT_QUEUE_DEPTH_PER_SLOT
    queue_timeout_s: float = defaults.DEFAULT_QUEUE_TIMEOUT_S
    drain_timeout_s: float = defaults.DEFAULT_DRAIN_TIMEOUT_S
    dtype: str = "float32"
    device: str = "cpu"
    max_body_bytes: int = 4 * 1024 * 1024
    log_level: str = "info"

    def __post_init__(self) -> None:
        if not 0 < self.port < 65536:
            raise ValueError(f"--port must be in 1..65535, got {self.port}")
        if self.queue_depth_per_slot < 0:
            raise ValueError(f"--queue-depth-per-slot must be >= 0, got {self.queue_depth_per_slot}")
        if self.queue_timeout_s <= 0:
            raise ValueError(f"--queue-timeout-s must be > 0, got {self.queue_timeout_s}")
        if self.drain_timeout_s < 0:
            raise ValueError(f"--drain-timeout-s must be >= 0, got {self.drain_timeout_s}")
        if self.max_body_bytes < 1024:
            raise ValueError(f"--max-body-bytes must be >= 1024, got {self.max_body_bytes}")

    def engine_config(self) -> defaults.EngineConfig:
        return defaults.EngineConfig(
            model=self.model, max_num_seqs=self.max_num_seqs, max_num_batched_tokens=self.max_num_batched_tokens,
            prefill_chunk=self.prefill_chunk, block_size=self.block_size, num_kv_blocks=self.num_kv_blocks,
            kv_cache_memory_bytes=self.kv_cache_memory_bytes, max_model_len=self.max_model_len,
            dtype=self.dtype, device=self.device,
        )


# (flag, settings field, type, help); the environment variable is FLOTILLA_ + the flag, upper-cased (env_var)
_FLAGS: list[tuple[str, str, object, str]] = [
    ("--model", "model", str, "A Hugging Face model directory, or 'tiny' (the built-in DEMONSTRATION model)."),
    ("--served-model-name", "served_model_name", str, "Name clients send as `model`; default: the model's name."),
    ("--host", "host", str, "Address to listen on."),
    ("--port", "port", int, "TCP port to listen on."),
    ("--max-num-seqs", "max_num_seqs", int, "Slots: sequences the engine runs at once."),
    ("--max-num-batched-tokens", "max_num_batched_tokens", int, "Token budget of one engine step."),
    ("--prefill-chunk", "prefill_chunk", int, "Longest prefill piece of one sequence in one step."),
    ("--block-size", "block_size", int, "KV-cache positions per block (a power of two)."),
    ("--num-kv-blocks", "num_kv_blocks", int, "KV-cache pool size in blocks (overrides --kv-cache-memory)."),
    ("--kv-cache-memory", "kv_cache_memory_bytes", _size_flag,
     "KV-cache pool size in bytes, e.g. 8Gi; default: enough for every slot at --max-model-len."),
    ("--max-model-len", "max_model_len", int, "Context limit (prompt + output tokens); default: the model's."),
    ("--queue-depth-per-slot", "queue_depth_per_slot", int,
     "Admission queue depth per slot; the queue holds this × --max-num-seqs before answering 429."),
    ("--queue-timeout-s", "queue_timeout_s", float, "Longest wait in the admission queue before 429, seconds."),
    ("--drain-timeout-s", "drain_timeout_s", float,
     "On SIGTERM, how long in-flight requests may take to finish before the process exits, seconds."),
    ("--dtype", "dtype", str, f"Weights and KV-cache dtype: {', '.join(defaults.DTYPES)}."),
    ("--device", "device", str, "cpu or cuda[:N]."),
    ("--max-body-bytes", "max_body_bytes", _size_flag, "Largest request body accepted; larger gets 413."),
    ("--log-level", "log_level", str, "debug, info, warning or error."),
]


def env_var(flag: str) -> str:
    """--kv-cache-memory → FLOTILLA_KV_CACHE_MEMORY: the variable is named after the flag users see."""
    return "FLOTILLA_" + flag.removeprefix("--").upper().replace("-", "_")


def _default_note(value: object) -> str:
    return "" if value is None else f"; default {value}"  # an unset default is described in the text


def build_parser(environ: Mapping[str, str] | None = None) -> argparse.ArgumentParser:
    environ = os.environ if environ is None else environ
    base = ServerSettings()
    parser = argparse.ArgumentParser(
        prog="flotilla-server",
        description="OpenAI-compatible LLM server with continuous batching, bounded admission and SSE streaming. "
        "Every flag can also be set from the environment variable shown with it.",
    )
    for flag, name, kind, text in _FLAGS:
        env = env_var(flag)
        default = getattr(base, name)
        if env in environ:
            try:
                default = kind(environ[env])  # type: ignore[operator]
            except (ValueError, argparse.ArgumentTypeError) as e:
                parser.error(f"{env}={environ[env]!r}: {e}")
        parser.add_argument(flag, dest=name, type=kind, default=default, metavar=env.removeprefix("FLOTILLA_"),
                            help=f"{text} [env {env}{_default_note(getattr(base, name))}]")
    return parser


def parse_settings(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> ServerSettings:
    parser = build_parser(environ)
    args = parser.parse_args(argv)
    values = {f.name: getattr(args, f.name) for f in fields(ServerSettings)}
    try:
        settings = ServerSettings(**values)
        settings.engine_config()  # checks the engine's own invariants now, with the flag names in view
    except ValueError as e:
        parser.error(str(e))
    return settings


def main(argv: Sequence[str] | None = None) -> int:
    settings = parse_settings(argv)
    # Before torch loads OpenMP: threads that spin while waiting burn the CPU a co-tenant (or a pod's CPU
    # quota) needs; measured on a shared 2-core box, a 64-sequence decode step took 0.9 s spinning vs 9 ms
    # passive. An operator who owns the cores can still set OMP_WAIT_POLICY=ACTIVE.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    # One core is left to the event loop (HTTP, SSE): on 2 cores, torch on both made 64 streaming clients
    # 25 % slower (3.9k against 5.1k output tokens/s on tiny), the engine and the loop fighting for a core.
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, len(os.sched_getaffinity(0)) - 1)))
    from flotilla_server.serve import serve  # heavy imports (torch) only once the flags are valid

    return serve(settings)


if __name__ == "__main__":
    sys.exit(main())
