"""The priorities bench's throughput case in the engine alone: where batch rows go beside a light chat.

Why: over HTTP on a 2-core host the throughput ratio drifts with the host (docs/benchmarks.md, "Priorities
and tenants"); batch tokens per step do not. This drives `EngineCore` directly on tiny with the bench's
shapes (16 slots, 2 reserved; batch requests of 256 tokens kept queued; a 16-token chat every
--interval-s), then prints batch tokens/s and per step, and each kind of step's mean duration and rows:
`full` (decode only), `full+pf` (a prefill beside every row), `lean+pf` (a step that left batch rows out
for an interactive prompt, engine/class_rules.py).

    .venv/bin/python scripts/class_steps.py            # alone, then beside the chat
"""

from __future__ import annotations

import argparse
import itertools
import time

import torch
from flotilla_contract.classes import BATCH
from flotilla_server.engine.config import EngineConfig
from flotilla_server.engine.core import EngineCore
from flotilla_server.engine.sampling_params import SamplingParams

WARMUP_S = 2.0


def run(chat: bool, window_s: float, interval_s: float) -> None:
    core = EngineCore(EngineConfig(model="tiny", max_num_seqs=16, max_model_len=512, interactive_reserve_slots=2,
                                   batch_share_slots=2, seed=1))
    batch_prompt = core.loaded.tokenizer.encode("The log of the night watch, hour by hour:")
    chat_prompt = core.loaded.tokenizer.encode("User: Is the harbour open?\nAssistant:")
    batch_params = SamplingParams(max_tokens=256, ignore_eos=True, request_class=BATCH)
    chat_params = SamplingParams(max_tokens=16, ignore_eos=True)
    ids, live = itertools.count(), set()
    kinds: dict[str, list[tuple[float, int, int]]] = {}
    batch_tokens = steps = 0
    t0 = time.perf_counter()
    next_chat = WARMUP_S
    while (now := time.perf_counter() - t0) < WARMUP_S + window_s:
        while len(live) < 18:  # more than batch's 14 slots: batch work always waits
            rid = f"b{next(ids)}"
            core.add_request(rid, batch_prompt, batch_params)
            live.add(rid)
        if chat and now >= next_chat:
            core.try_admit(f"c{next(ids)}", chat_prompt, chat_params)
            next_chat += interval_s
        outputs = core.step()
        if time.perf_counter() - t0 < WARMUP_S:
            continue
        steps += 1
        for out in outputs:
            if out.request_id.startswith("b"):
                batch_tokens += 1
                if out.finished:
                    live.discard(out.request_id)
        rec = core.last_record
        kind = ("lean" if core.scheduler._lean_last_step else "full") + ("+pf" if rec.num_prefill_tokens else "")
        kinds.setdefault(kind, []).append((rec.duration_s, rec.num_decode_seqs, rec.num_prefill_tokens))
    print(f"{'beside the chat' if chat else 'alone'}: batch {batch_tokens / window_s:,.0f} tokens/s, "
          f"{batch_tokens / steps:.2f} a step; {core.scheduler.preemptions} preemptions")
    for kind, recs in sorted(kinds.items()):
        n = len(recs)
        print(f"  {kind:8} {n:5} steps  {sum(r[0] for r in recs) / n * 1000:6.2f} ms  "
              f"{sum(r[1] for r in recs) / n:5.1f} decode rows  {sum(r[2] for r in recs) / n:5.1f} prompt tokens")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--window-s", type=float, default=15.0, help="Measured seconds of each arm.")
    p.add_argument("--interval-s", type=float, default=0.1, help="Seconds between chat requests.")
    a = p.parse_args()
    torch.set_num_threads(1)  # as the server's engine on 2 cores
    run(False, a.window_s, a.interval_s)
    run(True, a.window_s, a.interval_s)


if __name__ == "__main__":
    main()
