"""The engine's grammars: one pristine matcher per grammar text, built off the loop thread, copied per sequence.

The HTTP side has proved that each grammar compiles within the limit (grammar/compile_gate.py); here it is
built again, since llguidance's matchers cannot cross a process boundary. A build runs on this book's threads
(llguidance releases the GIL while it compiles), so the steps of every other request go on meanwhile; the
request waits outside the admission queue until its grammar is ready (engine/loop.py). Built matchers are
kept in an LRU by grammar text; every sequence (each choice of `n`) gets its own `deep_copy` (~30 µs), whose
state survives preemption with the sequence.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from flotilla_server.grammar.tokenizer_info import GrammarTokenizer, new_matcher

log = logging.getLogger("flotilla.engine")

DEFAULT_BOOK_SIZE = 512
BUILD_THREADS = 2
BUILD_NICENESS = 10  # as the HTTP side's probes (grammar/probe_worker.py): a build loses the cores to the steps


def _lower_priority() -> None:
    """Linux gives each thread its own nice value: a build thread yields to the engine's own threads."""
    with contextlib.suppress(OSError, AttributeError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), BUILD_NICENESS)


class GrammarBook:
    def __init__(self, tokenizer: GrammarTokenizer, size: int = DEFAULT_BOOK_SIZE,
                 threads: int = BUILD_THREADS) -> None:
        self._info = tokenizer
        self._size = size
        self._lock = threading.Lock()  # the loop thread asks; the build threads answer
        self._tokenizer: Any = None  # llguidance.LLTokenizer, built by the first build
        self._built: OrderedDict[str, Any] = OrderedDict()  # grammar -> pristine LLMatcher
        self._building: dict[str, Future[Any]] = {}
        self._threads = threads
        self._pool: ThreadPoolExecutor | None = None  # started by the first grammar
        self.builds = 0  # tests: grammars built (a rebuild after eviction counts again)

    def ready(self, grammar: str) -> bool:
        """True once `grammar`'s matcher is built (or failed: `new_matcher` then raises); else starts its
        build if none runs, and returns False."""
        with self._lock:
            if grammar in self._built:
                self._built.move_to_end(grammar)
                return True
            future = self._building.get(grammar)
            if future is None:
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(self._threads, thread_name_prefix="grammar-build",
                                                    initializer=_lower_priority)
                self._building[grammar] = self._pool.submit(self._build, grammar)
                return False
        return future.done()

    def wait(self, grammar: str) -> None:
        """Block until `grammar` is built (the synchronous engine API: EngineCore.add_request)."""
        if not self.ready(grammar):
            with self._lock:
                future = self._building.get(grammar)
            if future is not None:
                future.result()

    def _build(self, grammar: str) -> Any:
        with self._lock:
            tokenizer = self._tokenizer
        if tokenizer is None:
            built = self._info.build()
            with self._lock:
                if self._tokenizer is None:
                    self._tokenizer = built
                tokenizer = self._tokenizer
        matcher = new_matcher(tokenizer, grammar)
        with self._lock:
            self.builds += 1
            self._building.pop(grammar, None)
            self._built[grammar] = matcher
            while len(self._built) > self._size:
                self._built.popitem(last=False)
        return matcher

    def new_matcher(self, grammar: str) -> Any:
        """A sequence's own matcher in the start state; ValueError with llguidance's message if the grammar
        does not compile (the HTTP side's probe let it through: a different limit, or a bug)."""
        self.wait(grammar)
        with self._lock:
            pristine = self._built.get(grammar)
        if pristine is None:  # evicted between ready() and now
            pristine = self._build(grammar)
        if pristine.is_error():
            raise ValueError(f"the grammar does not compile: {pristine.get_error()}")
        return pristine.deep_copy()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
