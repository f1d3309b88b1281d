"""The pool benchmark's request trace, built from a real one: a window of an Azure LLM inference trace
(2023, CC BY 4.0; Patel et al., "Splitwise", ISCA 2024; sim/flotilla_sim/traces/README.md), thinned,
time-compressed, spread over the benchmark's models by Zipf popularity, and its token counts scaled to the
tiny model's context.

Both arms of the benchmark replay the same list, so every difference between them is the serving layout's.
Pure: no clock, no I/O (the caller reads the trace with `flotilla_sim.workload.read_azure`).

Rules, in order:
- the window [start_s, start_s + window_s) of the trace's own clock (seconds from its first request);
- every `keep_every`-th request of the window (a rate cut that keeps the trace's bursts and lulls);
- arrival times relative to the window's start, divided by `compression`;
- each request's model drawn from `models` with weights 1/rank**zipf_s (seeded);
- prompt and output tokens each divided by `token_divisor`, rounded up (at least 1), then the prompt cut
  so that prompt + output fits `context_tokens`. `fitting_divisor` gives the smallest divisor that fits the
  whole trace's longest request without any cut.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

from flotilla_sim.workload import Trace


@dataclass(frozen=True)
class TraceShape:
    start_s: float = 1200.0  # minute 20 of the trace
    window_s: float = 600.0
    keep_every: int = 16
    compression: float = 4.0
    zipf_s: float = 1.0
    token_divisor: int | None = None  # None: fitting_divisor of the whole trace
    context_tokens: int = 2048  # tiny's max_position_embeddings
    seed: int = 13


@dataclass(frozen=True)
class Request:
    at_s: float  # send time, seconds from the replay's start
    model: str
    prompt_tokens: int
    output_tokens: int


def fitting_divisor(trace: Trace, context_tokens: int) -> int:
    """The smallest integer that, dividing prompt and output tokens, fits every request in the context."""
    longest = int((trace.prompt_tokens + trace.output_tokens).max())
    return max(1, math.ceil(longest / context_tokens))


def scale_tokens(prompt: int, output: int, divisor: int, context_tokens: int) -> tuple[int, int]:
    """Each count divided by `divisor`, rounded up, at least 1; the prompt cut to fit the context."""
    out = min(max(1, math.ceil(output / divisor)), context_tokens - 1)
    return max(1, min(math.ceil(prompt / divisor), context_tokens - out)), out


def zipf_weights(count: int, s: float) -> list[float]:
    return [1.0 / rank**s for rank in range(1, count + 1)]


def build(trace: Trace, models: Sequence[str], shape: TraceShape) -> list[Request]:
    """The benchmark's requests, sorted by send time."""
    divisor = shape.token_divisor or fitting_divisor(trace, shape.context_tokens)
    rng = random.Random(shape.seed)
    weights = zipf_weights(len(models), shape.zipf_s)
    end_s = shape.start_s + shape.window_s
    window = [i for i, t in enumerate(trace.arrival_s) if shape.start_s <= t < end_s][::shape.keep_every]
    out = []
    for i in window:
        prompt, output = scale_tokens(int(trace.prompt_tokens[i]), int(trace.output_tokens[i]), divisor,
                                      shape.context_tokens)
        at_s = (float(trace.arrival_s[i]) - shape.start_s) / shape.compression
        out.append(Request(at_s, rng.choices(models, weights)[0], prompt, output))
    return out
