"""`flotilla-bench`: one console script, one subcommand per benchmark, each module imported lazily.

A benchmark module exposes `add_arguments(parser)` and `run(args) -> int`; only the chosen one is
imported, so `flotilla-bench online` never loads torch and `offline` never loads the HTTP client.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from flotilla_server.engine.openmp_env import set_openmp_defaults

COMMANDS = {
    "offline": ("flotilla_server.bench.offline",
                "engine throughput (no HTTP) in five modes: continuous, static, static_unpadded, sequential, "
                "transformers"),
    "online": ("flotilla_server.bench.online",
               "load an OpenAI-compatible server and report latencies (TTFT, TPOT, ITL, E2E) and goodput"),
    "prefix": ("flotilla_server.bench.prefix", "prefix caching on and off on repeated system prompts"),
    "steps": ("flotilla_server.bench.step_profile",
              "where a decode step's time goes (schedule, inputs, forward parts, sampling, detokenization) "
              "at batch 1, 8 and 64"),
    "modes": ("flotilla_server.bench.engine_modes", "the engine in its own process against on a thread, over HTTP"),
    "structured": ("flotilla_server.bench.structured",
                   "JSON-schema streams against unconstrained ones (tokens/s), the token mask's share of a step at "
                   "batch 1, 16 and 64, and 200 constrained requests checked for validity"),
    "priorities": ("flotilla_server.bench.priorities",
                   "request classes and tenant caps under load: interactive chat beside a batch flood, batch "
                   "throughput and weighted share, one tenant flooding beside another"),
    "llamacpp": ("flotilla_server.bench.llama_compare",
                 "Flotilla against llama.cpp's own llama-server on the same GGUF file: streamed tokens/s at 1 and 16 "
                 "clients, as the machine runs and with the AVX2 paths forced"),
    "speculative": ("flotilla_server.bench.speculative",
                    "speculative decoding by prompt lookup (--speculative ngram) against none on SmolLM2 at 1 client: "
                    "an edit task that copies a passage, free writing, and greedy equality on 20 prompts"),
    "coldload": ("flotilla_server.bench.cold_loads",
                 "a pool server's cold load of SmolLM2 over HTTP: TTFT of a request that finds it unloaded, from "
                 "disk (page cache dropped) against parked, with each load's phases"),
    "moe": ("flotilla_server.bench.moe",
            "a random Qwen3-MoE-shaped mixture of experts against a dense Llama of the same total parameters, on the "
            "engine in-process: tokens/s at 1 and 16 concurrent sequences, as the machine runs and with AVX2 forced"),
    "lora": ("flotilla_server.bench.lora",
             "8 LoRA adapters of rank 16 on llama-100m in one server: streamed tokens/s with every request on a "
             "different adapter against every request on the base model, and the adapters' memory against 8 "
             "copies of the model"),
}
DESCRIPTION = ("Benchmarks of flotilla-server: `offline` drives the engine directly, `online` any "
               "OpenAI-compatible server over HTTP. Figures and how they were recorded: docs/benchmarks.md.")


class _DefaultsShown(argparse.HelpFormatter):
    """Appends each option's default to its help, unless it has none or the help already says it."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if action.option_strings and action.default not in (None, False, argparse.SUPPRESS) and "default" not in text:
            text += " (default: %(default)s)"
        return text


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    set_openmp_defaults(leave_a_core=False)  # before torch loads OpenMP; the bench's threads are --threads
    parser = argparse.ArgumentParser(prog="flotilla-bench", description=DESCRIPTION)
    sub = parser.add_subparsers(dest="command", required=True, metavar="{" + ",".join(COMMANDS) + "}")
    chosen = next((a for a in argv if not a.startswith("-")), None)
    for name, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text,
                           formatter_class=_DefaultsShown)
        if name == chosen:
            importlib.import_module(module).add_arguments(p)
    args = parser.parse_args(argv)
    return importlib.import_module(COMMANDS[args.command][0]).run(args)


if __name__ == "__main__":
    sys.exit(main())
