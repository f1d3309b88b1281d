"""The command line: `python -m scripts.grammar_engines_ab` parses the arguments, builds the tokenizer and
the engines, runs the chosen sections in order and writes the result file after each; the help text is
the package's docstring, and nothing heavy is imported before the arguments are checked.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from . import __doc__ as ABOUT
from .behaviour_sections import sec_coverage, sec_lifecycle, sec_smoke
from .compile_sections import sec_compile, sec_pathological, sec_setup
from .engines import ENGINES, Tok
from .mask_sections import sec_apply, sec_fill, sec_overlap
from .measure import cpu_info, now, pkg_version
from .schemas import INSTANCES, JSON_OBJECT, SCHEMAS

LIBS = ("xgrammar", "llguidance")
SECTIONS = ("setup", "compile", "pathological", "fill", "overlap", "apply", "smoke", "lifecycle", "coverage")
DEFAULT_GGUF = Path.home() / ".cache/flotilla/models/SmolLM2-135M-Instruct.Q4_1.gguf"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.grammar_engines_ab",
                                     description=ABOUT.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=ABOUT.split("\n\n", 1)[1])
    parser.add_argument("--gguf", type=Path, default=DEFAULT_GGUF, help=f"the tokenizer's GGUF (default: {DEFAULT_GGUF})")
    parser.add_argument("--libs", default=",".join(LIBS), help="comma-separated, of: " + ", ".join(LIBS))
    parser.add_argument("--sections", default=",".join(SECTIONS), help="comma-separated, of: " + ", ".join(SECTIONS))
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds; figures are medians (default: 3)")
    parser.add_argument("--batch-sizes", default="1,16,64", help="mask-fill batches (default: 1,16,64)")
    parser.add_argument("--overlap-batch-sizes", default="16,64", help="batches of the overlap test (default: 16,64)")
    parser.add_argument("--steps", type=int, default=64, help="timed fill steps per round (default: 64)")
    parser.add_argument("--overlap-steps", type=int, default=20, help="timed steps per variant of the overlap test")
    parser.add_argument("--compile-threads", type=int, default=1,
                        help="xgrammar GrammarCompiler max_threads (default: 1; llguidance compiles on one)")
    parser.add_argument("--compile-timeout", type=float, default=20.0,
                        help="seconds before a pathological compile's worker is killed (default: 20)")
    parser.add_argument("--smoke-seeds", type=int, default=8)
    parser.add_argument("--smoke-max-tokens", type=int, default=1000)
    parser.add_argument("--json", type=Path, default=Path("grammar_engines_ab.json"), help="the result file")
    args = parser.parse_args(argv)
    libs = tuple(x for x in args.libs.split(",") if x)
    sections = [x for x in args.sections.split(",") if x]
    for x in libs:
        if x not in LIBS:
            parser.error(f"--libs: unknown {x!r}")
    for x in sections:
        if x not in SECTIONS:
            parser.error(f"--sections: unknown {x!r}")
    args.batch_sizes = [int(x) for x in args.batch_sizes.split(",")]
    args.overlap_batch_sizes = [int(x) for x in args.overlap_batch_sizes.split(",")]
    if not args.gguf.is_file():
        parser.error(f"--gguf {args.gguf}: no such file (scripts/fetch_smollm2.py fetches it)")

    for g, inst in INSTANCES.items():
        import jsonschema
        jsonschema.validate(inst, {"type": "object"} if g == JSON_OBJECT else SCHEMAS[g])

    import torch
    torch.set_num_threads(1)
    tok = Tok(args.gguf)
    engines = {lib: ENGINES[lib](tok, args.compile_threads) for lib in libs}
    result: dict[str, Any] = {
        "meta": {"cpu": cpu_info(), "python": sys.version.split()[0], "torch": torch.__version__,
                 "versions": {p: pkg_version(p) for p in ("xgrammar", "llguidance", "transformers", "tokenizers",
                                                          "torch", "triton")},
                 "tokenizer": {"gguf": str(args.gguf), "vocab_size": tok.vocab_size, "eos": tok.eos_ids},
                 "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
                 "started": time.strftime("%Y-%m-%d %H:%M:%S %Z")},
    }
    cpu = result["meta"]["cpu"]
    print(f"CPU: {cpu.get('model_name')} ({cpu.get('nproc')} cores; avx2 {cpu.get('avx2')}, avx512f "
          f"{cpu.get('avx512f')}); " + ", ".join(f"{k} {v}" for k, v in result["meta"]["versions"].items()))
    fns = {"setup": sec_setup, "compile": sec_compile, "pathological": sec_pathological, "fill": sec_fill,
           "overlap": sec_overlap, "apply": sec_apply, "smoke": sec_smoke, "lifecycle": sec_lifecycle,
           "coverage": sec_coverage}
    for s in sections:
        t0 = now()
        try:
            result[s] = fns[s](args, libs, tok, engines)
        except Exception as e:
            traceback.print_exc()
            result[s] = {"error": f"{type(e).__name__}: {e}"}
        result.setdefault("section_seconds", {})[s] = round(now() - t0, 1)
        args.json.write_text(json.dumps(result, indent=1, default=str))
    print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
