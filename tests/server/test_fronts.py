"""The parent of several HTTP processes (flotilla_server/fronts.py) notices a failed one whenever it failed,
even before the parent began to watch, and stops the others: a server left with some of its HTTP processes
would serve on, degraded, instead of exiting 1 for Kubernetes to restart it. Against real processes."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import threading
import time

from flotilla_server.fronts import Fronts


def test_a_process_that_failed_before_the_watch_began_stops_the_others() -> None:
    ctx = mp.get_context("spawn")
    failed = ctx.Process(target=os._exit, args=(3,))
    serving = ctx.Process(target=time.sleep, args=(60,))
    failed.start()
    failed.join()  # reaped before the watch: no sentinel of it will ever wake a wait
    serving.start()
    fronts = Fronts([failed, serving])
    watcher = threading.Thread(target=fronts.watch, daemon=True)
    try:
        watcher.start()
        watcher.join(20)
        assert not watcher.is_alive(), "the parent waited on the live process and never saw the failed one"
        assert fronts.failed
        assert serving.exitcode == -signal.SIGTERM
    finally:
        if serving.exitcode is None:
            serving.kill()
            serving.join()


def test_a_process_that_fails_while_watched_stops_the_others() -> None:
    ctx = mp.get_context("spawn")
    failing = ctx.Process(target=os._exit, args=(3,))
    serving = ctx.Process(target=time.sleep, args=(60,))
    serving.start()
    failing.start()  # it exits once its interpreter is up, while the parent waits
    fronts = Fronts([failing, serving])
    watcher = threading.Thread(target=fronts.watch, daemon=True)
    try:
        watcher.start()
        watcher.join(20)
        assert not watcher.is_alive()
        assert fronts.failed and failing.exitcode == 3
        assert serving.exitcode == -signal.SIGTERM
    finally:
        for p in (failing, serving):
            if p.exitcode is None:
                p.kill()
                p.join()


def test_processes_that_all_exit_0_end_the_watch_without_failure() -> None:
    ctx = mp.get_context("spawn")
    processes = [ctx.Process(target=time.sleep, args=(0.2,)) for _ in range(2)]
    for p in processes:
        p.start()
    fronts = Fronts(processes)
    fronts.watch()
    assert not fronts.failed
    assert [p.exitcode for p in processes] == [0, 0]
