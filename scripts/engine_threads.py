"""The engine's start-up thread-count measurement (engine/thread_count.py) for one model, from a chosen
starting count, as many times as asked: what `flotilla-server` logs at start-up on a machine with more cores.

Why: on this 2-core development machine the server's default count is 1, which leaves nothing to measure.
Starting above the cores shows the measurement finding the oversubscribed counts slower; on a many-core
machine, run it with the default start to see what the server would keep.

    .venv/bin/python scripts/engine_threads.py --threads 4            # tiny, 64 rows, three times
    .venv/bin/python scripts/engine_threads.py --model PATH.gguf --threads 4
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from flotilla_server.engine.cpu_quota import usable_cpus
from flotilla_server.engine.openmp_env import set_openmp_defaults


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny", help="what flotilla-server --model takes (default: tiny)")
    parser.add_argument("--threads", type=int, default=max(1, usable_cpus() - 1),
                        help="the count to start from (default: the server's, the usable CPUs less one)")
    parser.add_argument("--max-num-seqs", type=int, default=64, help="the decode step's rows (default: 64)")
    parser.add_argument("--max-model-len", type=int, default=512)
    parser.add_argument("--repeat", type=int, default=3, help="measurements, one log line each (default: 3)")
    args = parser.parse_args(argv)
    if args.threads < 2:
        parser.error(f"--threads {args.threads}: the engine measures only from 2 threads up")
    os.environ.pop("OMP_NUM_THREADS", None)
    set_openmp_defaults(leave_a_core=False)  # the server's waiting policy; the count is --threads
    import torch
    from flotilla_server.engine.config import EngineConfig
    from flotilla_server.engine.core import EngineCore

    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)
    logging.getLogger("flotilla_server.model.loader").setLevel(logging.ERROR)  # tiny's demonstration warning
    engine = EngineCore(EngineConfig(model=args.model, max_num_seqs=args.max_num_seqs,
                                     max_model_len=args.max_model_len))
    for _ in range(args.repeat):
        torch.set_num_threads(args.threads)
        engine.measure_threads()
    return 0


if __name__ == "__main__":
    sys.exit(main())
