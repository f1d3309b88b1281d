"""The compile gate: a request's grammar compiles within a time limit, or the request gets a 400; no other waits.

vLLM #54003: one deeply nested schema compiled for an unbounded time and stalled every request behind it.
Here a grammar is compiled first by a probe process (probe_worker.py) under `timeout_s`:

- past the limit the probe is killed, freeing its core, and the request is refused naming the limit; the
  grammar is remembered, and refused at once when it comes again;
- an outcome (compiled, or llguidance's error) is kept in an LRU keyed by the grammar text, so a repeated
  schema costs nothing, and concurrent requests for one new grammar wait for the same probe;
- at most `max_concurrent` probes run at once (one process each, started when first needed).

Only the request that brought the grammar waits for it: everything here is awaited on the event loop, and
the probes are processes. One gate per model (its tokenizer).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import struct
import sys
import time
from collections import OrderedDict
from dataclasses import asdict, dataclass
from typing import Protocol

from flotilla_contract.flags import DEFAULT_GRAMMAR_COMPILE_TIMEOUT_S, DEFAULT_MAX_GRAMMAR_COMPILES

from flotilla_server.grammar.probe_worker import frame
from flotilla_server.grammar.tokenizer_info import GrammarTokenizer

log = logging.getLogger("flotilla.grammar")

DEFAULT_CACHE_SIZE = 512  # grammars whose outcome is kept
PROBE_START_TIMEOUT_S = 60.0  # a probe process's start (Python and the tokenizer): not the compile's limit

COMPILED, INVALID, TIMED_OUT = "compiled", "invalid", "timeout"  # a compile's outcome (metrics label)


class GrammarRefused(Exception):
    """The grammar cannot be used: llguidance's message (an unsupported keyword, a grammar too large) or the
    time limit; a 400."""

    def __init__(self, message: str, timed_out: bool) -> None:
        super().__init__(message)
        self.timed_out = timed_out


@dataclass(frozen=True)
class CompileLimits:
    """Checked where the flags are read (http/settings.py)."""

    timeout_s: float = DEFAULT_GRAMMAR_COMPILE_TIMEOUT_S
    max_concurrent: int = DEFAULT_MAX_GRAMMAR_COMPILES
    cache_size: int = DEFAULT_CACHE_SIZE


class _Probe:
    """One probe process and its pipes."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc

    async def ask(self, payload: object) -> dict:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(frame(payload))
        await self.proc.stdin.drain()
        (size,) = struct.unpack(">I", await self.proc.stdout.readexactly(4))
        return json.loads(await self.proc.stdout.readexactly(size))

    async def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()
        await self.proc.wait()


class CompileMetrics(Protocol):
    """What the server counts (http/metrics.py)."""

    def grammar_lookup(self, hit: bool) -> None: ...  # hit: the outcome was known, or a probe already ran for it

    def grammar_compiled(self, outcome: str, seconds: float) -> None: ...  # one probe


class _NoMetrics:
    def grammar_lookup(self, hit: bool) -> None:
        pass

    def grammar_compiled(self, outcome: str, seconds: float) -> None:
        pass


class CompileGate:
    def __init__(self, tokenizer: GrammarTokenizer, limits: CompileLimits | None = None,
                 metrics: CompileMetrics | None = None) -> None:
        self.tokenizer = tokenizer
        self.limits = limits or CompileLimits()
        self._metrics = metrics or _NoMetrics()
        self._outcomes: OrderedDict[str, tuple[str, str | None]] = OrderedDict()  # grammar -> (outcome, error)
        self._pending: dict[str, asyncio.Future[tuple[str, str | None]]] = {}
        self._slots: asyncio.Semaphore | None = None  # made on the loop that first uses it
        self._idle: list[_Probe] = []
        self._busy: set[_Probe] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self.probes_started = 0  # tests: processes started, killed ones included
        self._closed = False

    async def check(self, grammar: str) -> None:
        """Return once `grammar` is known to compile within the limit; else raise GrammarRefused."""
        known = self._outcomes.get(grammar)
        pending = self._pending.get(grammar)
        self._metrics.grammar_lookup(hit=known is not None or pending is not None)
        if known is not None:
            self._outcomes.move_to_end(grammar)
        else:
            if pending is None:
                pending = self._pending[grammar] = asyncio.get_running_loop().create_future()
                task = asyncio.ensure_future(self._compile(grammar, pending))
                self._tasks.add(task)  # held until done: the loop keeps only weak references to tasks
                task.add_done_callback(self._tasks.discard)
            known = await asyncio.shield(pending)
        outcome, error = known
        if outcome == TIMED_OUT:
            raise GrammarRefused(f"the grammar took longer to compile than this server's limit of "
                                 f"{self.limits.timeout_s:g} s (--grammar-compile-timeout-s): simplify the schema",
                                 timed_out=True)
        if outcome == INVALID:
            raise GrammarRefused(f"the grammar cannot be enforced: {error}", timed_out=False)

    async def _compile(self, grammar: str, done: asyncio.Future[tuple[str, str | None]]) -> None:
        try:
            result = await self._probe(grammar)
        except Exception as e:  # a probe that could not start or died: this request fails, the next retries
            log.exception("grammar probe failed")
            self._pending.pop(grammar, None)
            done.set_exception(e)
            return
        self._outcomes[grammar] = result
        while len(self._outcomes) > self.limits.cache_size:
            self._outcomes.popitem(last=False)
        self._pending.pop(grammar, None)
        done.set_result(result)

    async def _probe(self, grammar: str) -> tuple[str, str | None]:
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.limits.max_concurrent)
        async with self._slots:
            probe = self._idle.pop() if self._idle else await self._start()
            self._busy.add(probe)
            start = time.perf_counter()
            try:
                answer = await asyncio.wait_for(probe.ask({"grammar": grammar}), self.limits.timeout_s)
            except TimeoutError:
                self._busy.discard(probe)
                await probe.kill()
                seconds = time.perf_counter() - start
                log.warning("a grammar compile passed the %g s limit after %.2f s: its probe was killed",
                            self.limits.timeout_s, seconds)
                self._metrics.grammar_compiled(TIMED_OUT, seconds)
                return TIMED_OUT, None
            except BaseException:
                self._busy.discard(probe)
                await probe.kill()
                raise
            self._busy.discard(probe)
            seconds = time.perf_counter() - start
            if self._closed:
                await probe.kill()
            else:
                self._idle.append(probe)
            error = answer["error"]
            outcome = COMPILED if error is None else INVALID
            self._metrics.grammar_compiled(outcome, seconds)
            return outcome, error

    async def _start(self) -> _Probe:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "flotilla_server.grammar.probe_worker",
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)
        probe = _Probe(proc)
        self.probes_started += 1
        try:
            setup = {**asdict(self.tokenizer), "eos_token_ids": list(self.tokenizer.eos_token_ids)}
            await asyncio.wait_for(probe.ask(setup), PROBE_START_TIMEOUT_S)
        except BaseException:
            await probe.kill()
            raise
        return probe

    @property
    def num_probes(self) -> int:
        """Probe processes alive now (idle or compiling)."""
        return len(self._idle) + len(self._busy)

    async def close(self) -> None:
        """Stop every probe process (server shutdown)."""
        self._closed = True
        probes, self._idle = [*self._idle, *self._busy], []
        self._busy.clear()
        for probe in probes:
            await probe.kill()
