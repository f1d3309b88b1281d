"""Job: one validated generation request, as the routes hand it to `generation.generate`."""

from __future__ import annotations

from dataclasses import dataclass

from flotilla_server.engine.sampling_params import SamplingParams


@dataclass(frozen=True)
class Job:
    chat: bool  # chat.completion shapes, else text_completion
    request_id: str
    prompts: list[list[int]]  # token ids; params.n choices of each, choice index = prompt number x n + j
    params: SamplingParams
    stream: bool
    include_usage: bool = False  # stream_options.include_usage: a last chunk with the usage and no choices
    echo_texts: list[str] | None = None  # completions echo: each prompt's text, which starts its choices' text

    @property
    def num_choices(self) -> int:
        return len(self.prompts) * self.params.n

    @property
    def num_prompt_tokens(self) -> int:
        return sum(map(len, self.prompts))

    def echo(self, index: int) -> str:
        """The text choice `index` starts with: its prompt's, with echo; else none."""
        return self.echo_texts[index // self.params.n] if self.echo_texts is not None else ""
