"""The sections on what a grammar costs before the first token: library import and tokenizer set-up, the
compile of the realistic schemas (cold, cached, first mask, whole sequence), and the pathological schemas
compiled in a spawned worker process that is killed past --compile-timeout; the worker's entry point lives
here, so the child process finds it by this module's package path.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import multiprocessing as mp
import subprocess
import sys
from pathlib import Path
from typing import Any

from .edge_schemas import PATHOLOGICAL, huge_enum
from .engines import ENGINES, Engine, Tok
from .measure import captured_stderr, gil_probe, med, now, pkg_version, round_orders, short
from .schemas import ALL_GRAMMARS, INSTANCES, JSON_OBJECT, SCHEMAS

SETUP_IMPORTS = {
    "xgrammar": "import xgrammar",
    "llguidance": "import llguidance",
    "llguidance.torch": "import llguidance, llguidance.torch",
}


def sec_setup(args: argparse.Namespace, libs: tuple[str, ...], tok: Tok, engines: dict[str, Engine]) -> dict[str, Any]:
    """Import time of each library in a fresh interpreter, with torch already imported (as in the server) and
    alone; which heavy modules the import drags in; the tokenizer info built once per tokenizer."""
    mods = {k: v for k, v in SETUP_IMPORTS.items() if k.split(".")[0] in libs}
    res: dict[str, Any] = {m: {"with_torch": [], "alone": []} for m in mods}
    probe = "; import sys; print(*[int(m in sys.modules) for m in ('torch', 'triton', 'transformers', 'pydantic')])"
    for _, m in round_orders(tuple(mods), args.rounds):
        for key, pre in (("with_torch", "import torch; "), ("alone", "")):
            code = pre + "import time; t = time.perf_counter(); " + mods[m] + "; print(time.perf_counter() - t)" + probe
            out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
            lines = out.stdout.strip().splitlines()
            res[m][key].append(float(lines[-2]))
            if key == "alone":
                flags = lines[-1].split()
                res[m]["drags_in"] = [n for n, f in zip(("torch", "triton", "transformers", "pydantic"), flags,
                                                        strict=True) if f == "1"]
    for m in mods:
        res[m]["import_with_torch_loaded_s"] = med(res[m].pop("with_torch"))
        res[m]["import_alone_s"] = med(res[m].pop("alone"))
    for lib in libs:
        res[lib]["tokenizer_info_s"] = engines[lib].info_s
        res[lib]["version"] = pkg_version(lib)
    res["tokenizer_build_s"] = tok.build_s
    print("\n## setup (import in a fresh interpreter, median of rounds; tokenizer info built once per tokenizer)")
    print(f"{'import':<18} {'with torch loaded s':>20} {'alone s':>8}  drags in")
    for m in mods:
        r = res[m]
        print(f"{m:<18} {r['import_with_torch_loaded_s']:>20.3f} {r['import_alone_s']:>8.3f}  {', '.join(r['drags_in'])}")
    for lib in libs:
        print(f"{lib} {res[lib]['version']}: tokenizer info {res[lib]['tokenizer_info_s']:.2f} s")
    return res


def first_mask(eng: Engine, compiled: Any) -> float:
    bm = eng.alloc(1)
    t0 = now()
    m = eng.matcher(compiled)
    eng.fill(m, bm, 0)
    return now() - t0


def sec_compile(args: argparse.Namespace, libs: tuple[str, ...], tok: Tok, engines: dict[str, Engine]) -> dict[str, Any]:
    """Cold: a fresh compiler/cache, then the compile; cached: the same request again through that cache.
    first_mask: matcher from the compiled grammar and its first bitmask (llguidance builds lexer states lazily,
    so part of its compile shows here); seq: fresh compile + every mask along the instance's tokens."""
    raw: dict[str, dict[str, dict[str, list[float]]]] = {
        lib: {g: {k: [] for k in ("cold_ms", "cached_ms", "first_mask_cold_ms", "first_mask_cached_ms",
                                  "seq_cold_ms", "seq_warm_ms")} for g in ALL_GRAMMARS} for lib in libs}
    errors: dict[str, dict[str, str]] = {lib: {} for lib in libs}
    for _, lib in round_orders(libs, args.rounds):
        eng = engines[lib]
        for g in ALL_GRAMMARS:
            schema = None if g == JSON_OBJECT else SCHEMAS[g]
            toks = [*tok.encode(json.dumps(INSTANCES[g])), tok.eos]
            try:
                gc.collect()
                cache = eng.new_cache()
                t0 = now()
                cg = eng.compile(cache, schema)
                raw[lib][g]["cold_ms"].append((now() - t0) * 1e3)
                raw[lib][g]["first_mask_cold_ms"].append(first_mask(eng, cg) * 1e3)
                if hasattr(cg, "memory_size_bytes"):
                    raw[lib][g].setdefault("compiled_MB", []).append(cg.memory_size_bytes / 1e6)
                t0 = now()
                cg2 = eng.compile(cache, schema)
                raw[lib][g]["cached_ms"].append((now() - t0) * 1e3)
                raw[lib][g]["first_mask_cached_ms"].append(first_mask(eng, cg2) * 1e3)
                for key, fresh in (("seq_cold_ms", True), ("seq_warm_ms", False)):
                    c = eng.new_cache() if fresh else cache
                    bm = eng.alloc(1)
                    t0 = now()
                    m = eng.matcher(eng.compile(c, schema))
                    for t in toks:
                        eng.fill(m, bm, 0)
                        if not eng.accept(m, t):
                            raise RuntimeError(f"token {t} of the valid instance refused")
                    raw[lib][g][key].append((now() - t0) * 1e3)
            except Exception as e:
                errors[lib][g] = short(f"{type(e).__name__}: {e}")
    res: dict[str, Any] = {lib: {g: {k: med(v) for k, v in raw[lib][g].items()} for g in ALL_GRAMMARS} for lib in libs}
    for lib in libs:
        for g in ALL_GRAMMARS:
            res[lib][g]["tokens"] = len(tok.encode(json.dumps(INSTANCES[g]))) + 1
        if errors[lib]:
            res[lib]["errors"] = errors[lib]
    # does a compile on a thread leave the GIL to the other threads (the engine loop)?
    for _, lib in round_orders(libs, 1):
        eng = engines[lib]
        big = huge_enum(10000)

        def work(eng: Engine = eng, big: dict[str, Any] = big) -> None:
            for s in (*SCHEMAS.values(), big):
                eng.compile(eng.new_cache(), s)
        res[lib]["compile_on_thread_gil"] = gil_probe(work)
    print("\n## compile on a thread: share of a Python counting loop's speed the main thread keeps "
          "(1.0 = GIL released, ~0 = held)")
    for lib in libs:
        print(f"  {lib}: {res[lib]['compile_on_thread_gil']}")
    print("\n## compile, ms (median of rounds; cold = fresh compiler, cached = same request again)")
    print(f"{'grammar':<15} {'lib':<11} {'cold':>8} {'cached':>8} {'1st mask cold':>14} {'1st mask cached':>16} "
          f"{'seq cold':>9} {'seq warm':>9} {'tokens':>6} {'MB':>6}")
    for g in ALL_GRAMMARS:
        for lib in libs:
            r = res[lib][g]
            print(f"{g:<15} {lib:<11} {r['cold_ms']:>8.2f} {r['cached_ms']:>8.3f} {r['first_mask_cold_ms']:>14.3f} "
                  f"{r['first_mask_cached_ms']:>16.3f} {r['seq_cold_ms']:>9.2f} {r['seq_warm_ms']:>9.2f} {r['tokens']:>6} "
                  f"{r.get('compiled_MB', float('nan')):>6.2f}")
    for lib in libs:
        for g, e in errors[lib].items():
            print(f"  ! {lib} {g}: {e}")
    return res


# --- compile in a worker process (bounded by killing it) ---------------------------------------------------

def _worker(conn: Any, lib: str, gguf: str, compile_threads: int, paths: list[str]) -> None:
    sys.path[:0] = paths
    t0 = now()
    tok = Tok(Path(gguf))
    eng = ENGINES[lib](tok, compile_threads)
    conn.send(("ready", now() - t0))
    while True:
        msg = conn.recv()
        if msg is None:
            return
        schema = json.loads(msg)
        t0 = now()
        try:
            with captured_stderr() as err:
                cg = eng.compile(eng.new_cache(), schema)
                compile_s = now() - t0
                first = first_mask(eng, cg)
            payload_len = None
            ser_s = None
            if lib == "xgrammar" and hasattr(cg, "serialize_json"):
                t1 = now()
                payload_len = len(cg.serialize_json())
                ser_s = now() - t1
            conn.send(("ok", compile_s, first, payload_len, ser_s, short(err["text"], 300)))
        except Exception as e:
            conn.send(("error", now() - t0, short(f"{type(e).__name__}: {e}", 300)))


class CompileWorker:
    """One worker process holding the library and tokenizer; a compile past the limit kills it."""

    def __init__(self, lib: str, args: argparse.Namespace) -> None:
        ctx = mp.get_context("spawn")
        self.parent, child = ctx.Pipe()
        t0 = now()
        self.proc = ctx.Process(target=_worker, args=(child, lib, str(args.gguf), args.compile_threads, sys.path[:3]),
                                daemon=True)
        self.proc.start()
        _, ready_s = self.parent.recv()
        self.start_s = now() - t0
        self.ready_s = ready_s

    def compile(self, schema: dict[str, Any], timeout: float) -> dict[str, Any]:
        t0 = now()
        self.parent.send(json.dumps(schema))
        if self.parent.poll(timeout):
            r = self.parent.recv()
            wall = now() - t0
            if r[0] == "ok":
                return {"status": "ok", "compile_s": r[1], "first_mask_s": r[2], "serialized_bytes": r[3],
                        "serialize_s": r[4], "roundtrip_s": wall, "stderr": r[5]}
            return {"status": "error", "compile_s": r[1], "error": r[2], "roundtrip_s": wall}
        t1 = now()
        self.proc.kill()
        self.proc.join()
        return {"status": "killed", "compile_s": None, "killed_after_s": now() - t0, "kill_s": now() - t1,
                "exitcode": self.proc.exitcode}

    def close(self) -> None:
        if self.proc.is_alive():
            self.parent.send(None)
            self.proc.join(5)
            if self.proc.is_alive():
                self.proc.kill()
                self.proc.join()


def sec_pathological(args: argparse.Namespace, libs: tuple[str, ...], tok: Tok,
                     engines: dict[str, Engine]) -> dict[str, Any]:
    """Each schema compiled once in a worker process; past --compile-timeout the worker is killed (a new one
    is started for the next). A series stops at its first kill."""
    res: dict[str, Any] = {lib: {} for lib in libs}
    workers: dict[str, CompileWorker] = {}
    for lib in libs:
        workers[lib] = CompileWorker(lib, args)
        res[lib]["worker_start_s"] = workers[lib].start_s
        # the worker path for a realistic schema: compile + first mask + serialize there, and the round trip
        r = workers[lib].compile(SCHEMAS["catalogue_item"], args.compile_timeout)
        res[lib]["worker_roundtrip_catalogue_item"] = r
    stopped: dict[tuple[str, str], bool] = {}
    for family, (make, sizes) in PATHOLOGICAL.items():
        for size in sizes:
            schema = make(size)
            for lib in (libs if size % 2 == 0 else tuple(reversed(libs))):
                if stopped.get((lib, family)):
                    continue
                if not workers[lib].proc.is_alive():
                    workers[lib] = CompileWorker(lib, args)
                r = workers[lib].compile(schema, args.compile_timeout)
                r["schema_bytes"] = len(json.dumps(schema))
                res[lib][f"{family}[{size}]"] = r
                if r["status"] == "killed":
                    stopped[(lib, family)] = True
                    res[lib][f"{family}[{size}]"]["restart_s"] = None
                    t0 = now()
                    workers[lib] = CompileWorker(lib, args)
                    res[lib][f"{family}[{size}]"]["restart_s"] = now() - t0
    for w in workers.values():
        w.close()
    # library-side bounds, if any
    for lib in libs:
        eng = engines[lib]
        notes = []
        if lib == "llguidance":
            lim = getattr(eng.llg, "LLParserLimits", None)
            notes.append(f"LLParserLimits: {lim.__doc__.strip()[:400] if lim and lim.__doc__ else lim}")
        if lib == "xgrammar":
            import inspect
            with contextlib.suppress(TypeError, ValueError):
                notes.append("compile_json_schema" + str(inspect.signature(eng.xgr.GrammarCompiler.compile_json_schema)))
        res[lib]["library_bounds"] = notes
    print(f"\n## pathological schemas (worker process, killed past {args.compile_timeout:.0f} s); "
          "compile s / first mask s / status")
    print(f"{'schema':<24} {'bytes':>8} " + " ".join(f"{lib:>38}" for lib in libs))
    keys = [k for k in res[libs[0]] if "[" in k] + [k for lib in libs[1:] for k in res[lib] if "[" in k]
    seen = []
    for k in keys:
        if k in seen:
            continue
        seen.append(k)
        cells = []
        nbytes = 0
        for lib in libs:
            r = res[lib].get(k)
            if r is None:
                cells.append(f"{'(skipped after a kill)':>38}")
                continue
            nbytes = r.get("schema_bytes", 0)
            if r["status"] == "ok":
                cells.append(f"{r['compile_s']:>12.3f} {r['first_mask_s']:>10.4f} {'ok':>14}")
            elif r["status"] == "error":
                cells.append(f"{r['compile_s']:>12.3f} {'':>10} {'error':>14}")
            else:
                cells.append(f"{'>' + str(args.compile_timeout):>12} {'':>10} {'killed':>14}")
        print(f"{k:<24} {nbytes:>8} " + " ".join(cells))
    for lib in libs:
        for k, r in res[lib].items():
            if isinstance(r, dict) and r.get("status") == "error":
                print(f"  ! {lib} {k}: {r['error']}")
            if isinstance(r, dict) and r.get("status") == "killed":
                print(f"  ! {lib} {k}: killed; SIGKILL to exit {r['kill_s'] * 1e3:.1f} ms, new worker "
                      f"{r.get('restart_s') or float('nan'):.2f} s")
        wr = res[lib]["worker_roundtrip_catalogue_item"]
        print(f"  {lib}: worker start {res[lib]['worker_start_s']:.2f} s; catalogue_item through the worker: {wr}")
    return res
