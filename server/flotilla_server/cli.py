"""The `flotilla-server` command: flags (each with a FLOTILLA_* environment fallback) into one settings object,
then the engine and the HTTP server.

The flags are flotilla_contract.flags.SERVER_FLAGS, the table the operator renders pod arguments from, so
a flag's name, default and help are written once (docs/architecture.md, "Layers"). This module is the top
layer: it alone wires the engine (torch) to the HTTP layer (torch-free).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import fields

from flotilla_contract.flags import FLAGS_BY_NAME, MULTI_MODEL_REFUSED_FLAGS, SERVER_FLAGS, Flag, env_var
from flotilla_contract.one_line_parser import OneLineParser
from flotilla_contract.sizes import parse_bytes

from flotilla_server.cli_errors import (
    check_device,
    check_listen,
    given_on_command_line,
    name_sources,
)
from flotilla_server.engine.openmp_env import set_openmp_defaults
from flotilla_server.http.settings import ServerSettings

__all__ = ["ServerSettings", "build_parser", "env_var", "main", "parse_bytes", "parse_settings"]


def _size_flag(text: str) -> int:
    try:
        return parse_bytes(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


_PARSERS: dict[str, Callable[[str], object]] = {"str": str, "int": int, "float": float, "bytes": _size_flag}


def _default_note(flag: Flag) -> str:
    return "" if flag.default is None else f"; default {flag.default}"  # an unset default is described in the text


def _default_key(flag: Flag) -> str:
    return f"_default_{flag.dest}"


def build_parser(environ: Mapping[str, str] | None = None) -> argparse.ArgumentParser:
    environ = os.environ if environ is None else environ
    parser = OneLineParser(
        prog="flotilla-server",
        description="OpenAI-compatible LLM server with continuous batching, bounded admission and SSE streaming. "
        "Every flag can also be set from the environment variable shown with it.",
    )
    for flag in SERVER_FLAGS:
        kind = _PARSERS[flag.kind]
        default = flag.default
        if flag.env in environ:
            try:
                default = kind(environ[flag.env])
            except (ValueError, argparse.ArgumentTypeError) as e:
                parser.error(f"{flag.env}={environ[flag.env]!r}: {e}")
        if flag.repeatable:  # argparse appends to a default list: keep the default apart (in parse_settings)
            parser.set_defaults(**{_default_key(flag): default})
            default, extra = None, {"action": "append"}
        else:
            extra = {}
        parser.add_argument(flag.flag, dest=flag.dest, type=kind, default=default, **extra,
                            metavar=flag.env.removeprefix("FLOTILLA_"),
                            help=f"{flag.help} [env {flag.env}{_default_note(flag)}]".replace("%", "%%"))
    return parser


def parse_settings(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> ServerSettings:
    environ = os.environ if environ is None else environ
    parser = build_parser(environ)
    args = parser.parse_args(argv)
    values = {f.name: getattr(args, f.name) for f in fields(ServerSettings)}
    for flag in SERVER_FLAGS:  # a repeated flag: one value stays a value, several become a tuple
        if not flag.repeatable:
            continue
        value = values[flag.dest]
        if value is None and flag.dest == "model" and values["model_list_file"] is not None:
            values[flag.dest] = ()  # the list file names every model; the default 'tiny' is not one of them
        elif value is None:
            values[flag.dest] = getattr(args, _default_key(flag))
        else:
            values[flag.dest] = value[0] if len(value) == 1 else tuple(value)
    try:
        settings = ServerSettings(**values)
        settings.engine_config()  # checks the engine's own invariants now, with the flag names in view
        if settings.multi_model:
            _refuse_in_multi_model(parser, sys.argv[1:] if argv is None else argv,
                                   os.environ if environ is None else environ)
            model_specs(settings)  # names and sources are checked now, with the flag in view
    except ValueError as e:
        parser.error(name_sources(str(e), given_on_command_line(argv), environ))
    return settings


def _refuse(message: str, argv: Sequence[str] | None) -> int:
    """A value that passed the flags but not the model or the machine: one line naming its source, exit 2."""
    argv = sys.argv[1:] if argv is None else argv
    print(f"flotilla-server: error: {name_sources(message, given_on_command_line(argv), os.environ)}",
          file=sys.stderr)
    return 2


def main(argv: Sequence[str] | None = None) -> int:
    settings = parse_settings(argv)
    default_threads = set_openmp_defaults(leave_a_core=True)  # before torch loads OpenMP
    # heavy imports (torch) only once the flags are valid
    from flotilla_server.engine.client import EngineStartError
    from flotilla_server.engine.factory import build_engine
    from flotilla_server.http.serve import configure_logging, serve, served_model

    configure_logging(settings)
    try:
        check_listen(settings.host, settings.port)
        check_device(settings.device)
        if settings.multi_model:
            return _main_multi_model(settings)
        if settings.http_processes > 1:
            return _main_fronts(settings, default_threads)
        # the loader and the engine raise these, saying what to change, for a model or size that cannot serve
        engine, info = build_engine(settings.engine_config(), settings.engine_mode,  # type: ignore[arg-type]
                                    settings.engine_options(measure_threads=default_threads))
    except (EngineStartError, ValueError, FileNotFoundError) as e:
        return _refuse(str(e), argv)
    model = served_model(settings, info)
    if model.name in model.adapters:  # the model's own name is known only now (its directory's, by default)
        engine.shutdown()
        flag = "--lora" if any(name == model.name for name, _ in settings.lora_specs) else "--lora-list-file"
        return _refuse(f"{flag}'s adapter {model.name!r} has the served model's name: a request naming it would "
                       "be ambiguous; rename the adapter", argv)
    if settings.engine_mode == "process":
        print(f"flotilla-server: the engine runs in process {info.pid}", flush=True)
    return serve(settings, engine, model)


def _main_fronts(settings: ServerSettings, default_threads: bool) -> int:
    """One engine process, settings.http_processes HTTP processes (flotilla_server/fronts.py)."""
    from flotilla_server.engine.backends import spawn_engine
    from flotilla_server.fronts import serve_fronts

    engine = spawn_engine(settings.engine_config(), settings.engine_options(measure_threads=default_threads),
                          fronts=settings.http_processes)
    return serve_fronts(settings, engine)


def _main_multi_model(settings: ServerSettings) -> int:
    from flotilla_server.http.pool_serve import serve_pool
    from flotilla_server.model_cache.budget import default_budget_bytes
    from flotilla_server.model_cache.cache import ModelCache
    from flotilla_server.model_cache.engine_processes import EngineProcesses
    from flotilla_server.model_cache.parking import ParkingConfig

    # each model's engine in its own process (--engine-mode process) or on a thread of this one (inprocess)
    budget = settings.memory_budget_bytes or default_budget_bytes(settings.device)
    # parking is on by default on CPU only: on a GPU each parked process keeps a CUDA context outside the budget
    default_parked = budget if settings.device == "cpu" else 0
    parked_bytes = default_parked if settings.parked_memory_bytes is None else settings.parked_memory_bytes
    engines = EngineProcesses(settings.engine_config(), settings.engine_mode, settings.engine_options(),
                              parking=ParkingConfig(parked_bytes, settings.max_parked_models, settings.parked_dir))
    cache = ModelCache(engines, model_specs(settings), budget, settings.min_residency_s, settings.model_list_file,
                       skip_unreadable_at_start=settings.unreadable_model_at_start == "skip")
    return serve_pool(settings, cache)


def model_specs(settings: ServerSettings) -> tuple:
    """The --model NAME=SOURCE flags as specs; the list file's join them in the cache."""
    from flotilla_server.model_cache.specs import merge, parse_spec

    return merge([parse_spec(m) for m in settings.models])


def _refuse_in_multi_model(parser: argparse.ArgumentParser, argv: Sequence[str], environ: Mapping[str, str]) -> None:
    """Flags that size one model's memory from the device contradict a shared budget: refuse them."""
    for name in MULTI_MODEL_REFUSED_FLAGS:
        flag = FLAGS_BY_NAME.get(name)
        if flag is None:
            continue
        given = any(a == name or a.startswith(name + "=") for a in argv) or flag.env in environ
        if given:
            parser.error(f"{name} is refused in multi-model mode: every model's KV pool is fixed "
                         "(--kv-cache-memory) and --memory-budget bounds all models together; drop it")


if __name__ == "__main__":
    sys.exit(main())
