"""Job: one validated generation request, as the routes hand it to `generation.generate`."""

from __future__ import annotations

from dataclasses import dataclass

from flotilla_server.engine.sampling_params import SamplingParams


@dataclass(frozen=True)
class Job:
    chat: bool  # chat.completion shapes, else text_completion
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    stream: bool
    include_usage: bool = False  # stream_options.include_usage: a last chunk with the usage and no choices
