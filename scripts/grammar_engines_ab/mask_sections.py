"""The sections on the per-step cost of a grammar during decoding: the token-bitmask fill for a batch of mixed
grammars (a Python loop and each library's batch call), the fill on a thread while the main thread runs a
forward-pass-shaped torch loop (does the library release the GIL), and the bitmask applied to the logits.
"""

from __future__ import annotations

import argparse
import json
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from .engines import Engine, Tok
from .measure import gil_probe, med, now, pct, popcount_rows, round_orders
from .schemas import ALL_GRAMMARS, INSTANCES, JSON_OBJECT, SCHEMAS

# --- per-step mask fill ------------------------------------------------------------------------------------

class Batch:
    """B sequences, sequence i on grammar i % 7, each walking its instance's tokens (then EOS) from a
    staggered start; a finished sequence restarts with a fresh matcher from the cache."""

    def __init__(self, eng: Engine, tok: Tok, cache: Any, rows: int) -> None:
        self.eng = eng
        self.compiled = {g: eng.compile(cache, None if g == JSON_OBJECT else SCHEMAS[g]) for g in ALL_GRAMMARS}
        self.streams = {g: [*tok.encode(json.dumps(INSTANCES[g])), tok.eos] for g in ALL_GRAMMARS}
        self.grammar = [ALL_GRAMMARS[i % len(ALL_GRAMMARS)] for i in range(rows)]
        self.pos = [0] * rows
        self.ms = [eng.matcher(self.compiled[g]) for g in self.grammar]
        for i in range(rows):  # stagger
            start = (i * 11) % (len(self.streams[self.grammar[i]]) - 1)
            for t in self.streams[self.grammar[i]][:start]:
                assert eng.accept(self.ms[i], t)
            self.pos[i] = start

    def accept_all(self) -> None:
        eng = self.eng
        for i, m in enumerate(self.ms):
            stream = self.streams[self.grammar[i]]
            if not eng.accept(m, stream[self.pos[i]]):
                raise RuntimeError(f"{eng.name}: row {i} ({self.grammar[i]}) refused token {self.pos[i]}")
            self.pos[i] += 1
            if self.pos[i] == len(stream):
                self.ms[i] = eng.matcher(self.compiled[self.grammar[i]])
                self.pos[i] = 0


def fill_steps(eng: Engine, batch: Batch, mode: str, steps: int) -> tuple[list[float], list[float], list[float]]:
    """Per step: fill the batch's bitmask (timed), accept each row's next token (timed apart)."""
    bm = eng.alloc(len(batch.ms))
    filler = None
    if mode.startswith("batch"):
        filler = eng.batch_filler(int(mode[5:]))
    fill_t, acc_t, allowed = [], [], []
    for _ in range(steps):
        t0 = now()
        if filler is None:
            for i, m in enumerate(batch.ms):
                eng.fill(m, bm, i)
        else:
            filler(batch.ms, bm)
        t1 = now()
        batch.accept_all()
        t2 = now()
        fill_t.append(t1 - t0)
        acc_t.append(t2 - t1)
    allowed.append(float(popcount_rows(bm).float().mean()))
    return fill_t, acc_t, allowed


def sec_fill(args: argparse.Namespace, libs: tuple[str, ...], tok: Tok, engines: dict[str, Engine]) -> dict[str, Any]:
    modes = ["loop", "batch1", "batch2"]
    raw: dict[str, Any] = {lib: {b: {m: {"fill": [], "p90": [], "accept": []} for m in modes}
                                 for b in args.batch_sizes} for lib in libs}
    batches = {}
    for lib in libs:
        cache = engines[lib].new_cache()
        for b in args.batch_sizes:
            batches[(lib, b)] = Batch(engines[lib], tok, cache, b)
            fill_steps(engines[lib], batches[(lib, b)], "loop", 20)  # warm: lazy lexer states, allocations
    for _, lib in round_orders(libs, args.rounds):
        for b in args.batch_sizes:
            for mode in modes:
                f, a, _ = fill_steps(engines[lib], batches[(lib, b)], mode, args.steps)
                raw[lib][b][mode]["fill"].append(med(f) * 1e3)
                raw[lib][b][mode]["p90"].append(pct(f, 90) * 1e3)
                raw[lib][b][mode]["accept"].append(med(a) * 1e3)
    res: dict[str, Any] = {lib: {str(b): {m: {"fill_ms_step": med(raw[lib][b][m]["fill"]),
                                               "fill_ms_step_p90": med(raw[lib][b][m]["p90"]),
                                               "fill_us_per_seq": med(raw[lib][b][m]["fill"]) * 1e3 / b,
                                               "accept_ms_step": med(raw[lib][b][m]["accept"])}
                                           for m in modes} for b in args.batch_sizes} for lib in libs}
    print(f"\n## mask fill per step (batch of mixed grammars, {args.steps} steps a round, median of rounds)")
    print("   loop = a Python loop of per-sequence fills; batchN = the library's batch call on N threads")
    print(f"{'B':>3} {'lib':<11} " + " ".join(f"{m + ' ms (us/seq)':>22}" for m in modes) + f" {'accept ms':>10}")
    for b in args.batch_sizes:
        for lib in libs:
            r = res[lib][str(b)]
            cells = " ".join(f"{r[m]['fill_ms_step']:>10.3f} ({r[m]['fill_us_per_seq']:>8.1f})" for m in modes)
            print(f"{b:>3} {lib:<11} {cells} {r['loop']['accept_ms_step']:>10.3f}")
    return res


# --- fill on a thread while torch runs a forward-pass-shaped loop -----------------------------------------

class FakeForward:
    """SmolLM2-135M's decode-step matmuls for B rows (30 layers of qkv, o, gate+up, down, norms) and the
    49,152-wide logits: about 300 torch ops, each releasing the GIL only inside its kernel."""

    def __init__(self, rows: int, layers: int = 30) -> None:
        import torch
        g = torch.Generator().manual_seed(0)
        h, inter, kv = 576, 1536, 192
        self.x = torch.randn(rows, h, generator=g)
        self.w = [(torch.randn(h, h + 2 * kv, generator=g) * 0.02, torch.randn(h, h, generator=g) * 0.02,
                   torch.randn(h, 2 * inter, generator=g) * 0.02, torch.randn(inter, h, generator=g) * 0.02)
                  for _ in range(layers)]
        self.lm = torch.randn(h, 49152, generator=g) * 0.02

    def __call__(self) -> Any:
        import torch
        x = self.x
        for wqkv, wo, wgu, wd in self.w:
            n = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5)
            qkv = n @ wqkv
            x = x + qkv[:, :576] @ wo
            n = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5)
            gu = n @ wgu
            x = x + (torch.nn.functional.silu(gu[:, :1536]) * gu[:, 1536:]) @ wd
        return x @ self.lm


def sec_overlap(args: argparse.Namespace, libs: tuple[str, ...], tok: Tok, engines: dict[str, Engine]) -> dict[str, Any]:
    """Per step, as the engine would run it: the rows' masks filled on a worker thread while the main
    thread runs the forward pass, joined, applied to the logits, then each row's token accepted.
    Compared with the forward alone, the fill alone and the two one after the other (serial)."""
    import torch
    torch.set_num_threads(1)  # the engine's count on this 2-core machine: the usable cores less one
    res: dict[str, Any] = {lib: {} for lib in libs}
    pool = ThreadPoolExecutor(1)
    ffs = {b: FakeForward(b) for b in args.overlap_batch_sizes}
    raw: dict[tuple[str, int, str], dict[str, list[float]]] = {}
    fill_modes = ("batch1", "loop")
    for lib in libs:
        cache = engines[lib].new_cache()
        for b in args.overlap_batch_sizes:
            for fm in fill_modes:
                raw[(lib, b, fm)] = {"_batch": Batch(engines[lib], tok, cache, b)}  # type: ignore[dict-item]
    for _, lib in round_orders(libs, args.rounds):
        eng = engines[lib]
        for b in args.overlap_batch_sizes:
            ff = ffs[b]
            for fm in fill_modes:
                d = raw[(lib, b, fm)]
                batch: Batch = d["_batch"]  # type: ignore[assignment]
                bm = eng.alloc(b)
                filler = eng.batch_filler(1) if fm == "batch1" else None

                def fill(eng: Engine = eng, batch: Batch = batch, bm: Any = bm, filler: Any = filler) -> float:
                    t0 = now()
                    if filler is None:
                        for i, m in enumerate(batch.ms):
                            eng.fill(m, bm, i)
                    else:
                        filler(batch.ms, bm)
                    return now() - t0

                fwd_alone, fill_alone, serial, piped, fwd_in, fill_in = [], [], [], [], [], []
                for _ in range(3):
                    ff()
                for _ in range(args.overlap_steps):
                    t0 = now()
                    ff()
                    fwd_alone.append(now() - t0)
                for _ in range(args.overlap_steps):
                    fill_alone.append(fill())
                    batch.accept_all()
                for _ in range(args.overlap_steps):
                    t0 = now()
                    logits = ff()
                    fill()
                    eng.apply(logits, bm)
                    logits.argmax(-1)
                    batch.accept_all()
                    serial.append(now() - t0)
                for _ in range(args.overlap_steps):
                    t0 = now()
                    fut = pool.submit(fill)
                    logits = ff()
                    t1 = now()
                    fill_in.append(fut.result())
                    eng.apply(logits, bm)
                    logits.argmax(-1)
                    batch.accept_all()
                    piped.append(now() - t0)
                    fwd_in.append(t1 - t0)
                for k, v in (("forward_alone", fwd_alone), ("fill_alone", fill_alone), ("serial_step", serial),
                             ("pipelined_step", piped), ("forward_in_pipeline", fwd_in),
                             ("fill_in_pipeline", fill_in)):
                    d.setdefault(k, []).append(med(v) * 1e3)  # type: ignore[union-attr]
    pool.shutdown()
    # the GIL directly: the batch's fill repeated on a thread for ~1 s while this thread counts in Python
    for _, lib in round_orders(libs, args.rounds):
        eng = engines[lib]
        for b in args.overlap_batch_sizes:
            for fm in fill_modes:
                d = raw[(lib, b, fm)]
                batch = d["_batch"]  # type: ignore[assignment]
                bm = eng.alloc(b)
                filler = eng.batch_filler(1) if fm == "batch1" else None

                def fill_for_a_second(eng: Engine = eng, batch: Batch = batch, bm: Any = bm,
                                      filler: Any = filler) -> None:
                    end = now() + 1.0
                    while now() < end:
                        if filler is None:
                            for i, m in enumerate(batch.ms):
                                eng.fill(m, bm, i)
                        else:
                            filler(batch.ms, bm)
                d.setdefault("gil_free", []).append(  # type: ignore[union-attr]
                    gil_probe(fill_for_a_second)["main_thread_speed_kept"])
    for (lib, b, fm), d in raw.items():
        d.pop("_batch")
        r = {k: med(v) for k, v in d.items()}  # type: ignore[arg-type]
        r["forward_slowdown"] = r["forward_in_pipeline"] / r["forward_alone"]
        r["fill_slowdown"] = r["fill_in_pipeline"] / r["fill_alone"]
        r["step_saved_ms"] = r["serial_step"] - r["pipelined_step"]
        res[lib][f"{b}/{fm}"] = r
    print("\n## fill on a thread during a forward-shaped torch loop (torch 1 thread), ms per step (median)")
    print("   serial: forward then fill; pipelined: fill on a thread during the forward. gil free: speed a")
    print("   pure-Python loop keeps while the fill runs on a thread nonstop (1.0 = the fill holds no GIL)")
    print(f"{'B/fill':<10} {'lib':<11} {'forward':>8} {'fill':>7} {'serial':>8} {'pipelined':>10} "
          f"{'fwd slow':>9} {'fill on thread':>15} {'gil free':>9}")
    for b in args.overlap_batch_sizes:
        for fm in fill_modes:
            for lib in libs:
                r = res[lib][f"{b}/{fm}"]
                print(f"{str(b) + '/' + fm:<10} {lib:<11} {r['forward_alone']:>8.2f} {r['fill_alone']:>7.3f} "
                      f"{r['serial_step']:>8.2f} {r['pipelined_step']:>10.2f} {r['forward_slowdown']:>9.2f} "
                      f"{r['fill_in_pipeline']:>15.3f} {r['gil_free']:>9.2f}")
    return res


# --- applying the bitmask ----------------------------------------------------------------------------------

def reference_apply(logits: Any, bitmask: Any) -> None:
    """The definition, bit by bit (not timed): the reference the others are compared with."""
    import torch
    V = logits.shape[-1]
    bits = (bitmask.unsqueeze(-1) >> torch.arange(32, dtype=torch.int32)) & 1
    logits.masked_fill_(bits.view(bitmask.shape[0], -1)[:, :V] == 0, float("-inf"))


_BYTE_TO_BIAS: Any = None


def torch_apply(logits: Any, bitmask: Any) -> None:
    """The packed bitmask applied with plain eager torch, no compiler: the int32 words read as bytes
    (little-endian: byte k of word w holds tokens 32w+8k..32w+8k+7), each byte turned into eight additive
    biases (0.0 allowed, -inf refused) by index_select from a 256x8 table, then one add_. (masked_fill_
    and torch.where with a bool mask measured 10x slower on this CPU; what Flotilla can do without either
    library's kernel.)"""
    import torch
    global _BYTE_TO_BIAS
    if _BYTE_TO_BIAS is None:
        bits = (torch.arange(256).unsqueeze(1) >> torch.arange(8)) & 1
        _BYTE_TO_BIAS = torch.zeros(256, 8).masked_fill_(bits == 0, float("-inf"))
    V = logits.shape[-1]
    bias = torch.index_select(_BYTE_TO_BIAS, 0, bitmask.view(torch.uint8).view(-1).long())
    logits.add_(bias.view(bitmask.shape[0], -1)[:, :V])


def sec_apply(args: argparse.Namespace, libs: tuple[str, ...], tok: Tok, engines: dict[str, Engine]) -> dict[str, Any]:
    import torch
    torch.set_num_threads(1)
    V = tok.vocab_size
    res: dict[str, Any] = {}
    names = [*libs, "torch eager (byte table + add_)"]
    for b in args.batch_sizes:
        g = torch.Generator().manual_seed(b)
        base = torch.randn(b, V, generator=g)
        bm = torch.randint(-(2**31), 2**31 - 1, (b, (V + 31) // 32), dtype=torch.int32, generator=g)
        ref = base.clone()
        reference_apply(ref, bm)
        raw: dict[str, list[float]] = {n: [] for n in names}
        same: dict[str, bool] = {}
        first: dict[str, float] = {}
        for n in names:  # the first call (llguidance's apply is torch.compile'd: it compiles here)
            fn = torch_apply if n.startswith("torch") else engines[n].apply
            x = base.clone()
            t0 = now()
            fn(x, bm)
            first[n] = (now() - t0) * 1e3
        for r in range(args.rounds):
            for n in (names if r % 2 == 0 else list(reversed(names))):
                fn = torch_apply if n.startswith("torch") else engines[n].apply
                ts = []
                for _ in range(50):
                    x = base.clone()
                    t0 = now()
                    fn(x, bm)
                    ts.append(now() - t0)
                raw[n].append(med(ts) * 1e6)
                same[n] = bool(torch.equal(x, ref))
        res[str(b)] = {n: {"us": med(raw[n]), "equal_to_torch": same[n], "first_call_ms": first[n]} for n in names}
    print("\n## apply the bitmask to float32 logits [B, 49152], us (median; 1 torch thread); first call ms")
    print(f"{'B':>3} " + " ".join(f"{n:>36}" for n in names))
    for b in args.batch_sizes:
        print(f"{b:>3} " + " ".join(
            f"{res[str(b)][n]['us']:>18.1f} {'same' if res[str(b)][n]['equal_to_torch'] else 'DIFF':>5} "
            f"{res[str(b)][n]['first_call_ms']:>9.1f}ms" for n in names))
    return res
