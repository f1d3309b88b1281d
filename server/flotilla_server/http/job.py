"""Job: one validated generation request, as the routes hand it to `generation.generate`."""

from __future__ import annotations

from dataclasses import dataclass

from flotilla_server.engine.sampling_params import SamplingParams
from flotilla_server.http.tool_calls import ReplyReader


@dataclass(frozen=True)
class Job:
    chat: bool  # chat.completion shapes, else text_completion
    request_id: str
    prompts: list[list[int]]  # token ids; params.n choices of each, choice index = prompt number x n + j
    params: SamplingParams
    stream: bool
    include_usage: bool = False  # stream_options.include_usage: a last chunk with the usage and no choices
    echo_texts: list[str] | None = None  # completions echo: each prompt's text, which starts its choices' text
    # chat with tools: each choice's reply is read for calls (http/tool_calls.py) by this parser, keeping at most
    # max_tool_calls of them (parallel_tool_calls false: 1)
    tool_parser: str | None = None
    max_tool_calls: int | None = None

    @property
    def num_choices(self) -> int:
        return len(self.prompts) * self.params.n

    @property
    def num_prompt_tokens(self) -> int:
        return sum(map(len, self.prompts))

    def tool_reader(self) -> ReplyReader | None:
        """A new reader of one choice's tool calls; None when calls are not read."""
        return ReplyReader(self.tool_parser, self.max_tool_calls) if self.tool_parser is not None else None

    def echo(self, index: int) -> str:
        """The text choice `index` starts with: its prompt's, with echo; else none."""
        return self.echo_texts[index // self.params.n] if self.echo_texts is not None else ""
