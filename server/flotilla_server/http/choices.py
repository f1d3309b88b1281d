"""The choices of one answer as the engine's events arrive: each choice's text, finish and logprobs.

Events of several choices (`n`, a list of prompts) interleave in one stream, each naming its choice's
`index`. With echo, a choice's text starts with its prompt's text. Logprobs take the shape of their
endpoint (logprob_shapes.py); a completions choice's `text_offset` counts from the start of its text.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from flotilla_server.engine.outputs import TokenLogprobs
from flotilla_server.engine.stream import TokenEvent
from flotilla_server.http import sse
from flotilla_server.http.job import Job
from flotilla_server.http.logprob_shapes import CompletionLogprobs, TokenTexts, chat_content
from flotilla_server.http.tool_calls import collect


@dataclass
class Choice:
    parts: list[str] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprobs] = field(default_factory=list)
    finish_reason: str | None = None
    num_output_tokens: int = 0


class Choices:
    def __init__(self, job: Job, decode: Any) -> None:
        self.job = job
        self.texts = TokenTexts(decode) if job.params.logprobs is not None else None
        self._streamed: dict[int, CompletionLogprobs] = {}  # completions streaming: each choice's text offset
        self.all = [Choice(parts=[job.echo(i)]) for i in range(job.num_choices)]
        self.num_finished = 0

    @property
    def done(self) -> bool:
        return self.num_finished == len(self.all)

    def on_event(self, event: TokenEvent) -> None:
        """Count an event of one choice (not an abort)."""
        c = self.all[event.index]
        c.num_output_tokens = max(c.num_output_tokens, event.num_output_tokens)
        if event.finish_reason is not None:
            c.finish_reason = event.finish_reason
            self.num_finished += 1

    def collect(self, event: TokenEvent) -> None:
        """Keep an event's text and logprobs for a whole (non-streamed) answer."""
        self.on_event(event)
        c = self.all[event.index]
        c.parts.append(event.text)
        if event.logprobs:
            c.token_ids += event.token_ids
            c.logprobs += event.logprobs

    def usage(self) -> dict[str, int]:
        return sse.usage(self.job.num_prompt_tokens, sum(c.num_output_tokens for c in self.all))

    def chunk_logprobs(self, event: TokenEvent) -> Any:
        """A streamed chunk's logprobs: chat `content` entries, or the completions shape; None if not asked."""
        if self.texts is None or not event.logprobs:
            return None
        if self.job.chat:
            return chat_content(event.token_ids, event.logprobs, self.texts)
        shaper = self._streamed.get(event.index)
        if shaper is None:
            shaper = self._streamed[event.index] = CompletionLogprobs(self.texts, len(self.job.echo(event.index)))
        return shaper.add(event.token_ids, event.logprobs)

    def rendered(self) -> list[dict[str, Any]]:
        """Every choice of a whole answer, in index order."""
        out = []
        for i, c in enumerate(self.all):
            text, reason = "".join(c.parts), c.finish_reason or "abort"
            if self.job.chat:
                content = chat_content(c.token_ids, c.logprobs, self.texts) if self.texts is not None else None
                reader = self.job.tool_reader()
                if reader is None:
                    out.append(sse.chat_choice(i, text, reason, content))
                    continue
                reader.feed(text)  # the streaming reader over the whole text: a stream reassembles to this
                reader.finish()
                parsed = collect(reader.deltas)
                out.append(sse.chat_choice(i, parsed.content, reader.finish_reason(reason), content,
                                           parsed.tool_calls))
            else:
                lp = None
                if self.texts is not None:
                    lp = CompletionLogprobs(self.texts, len(self.job.echo(i))).add(c.token_ids, c.logprobs)
                out.append(sse.completion_choice(i, text, reason, lp))
        return out
