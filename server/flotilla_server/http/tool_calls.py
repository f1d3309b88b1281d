"""Tool calls read out of a reply's text as it streams: content, then each call's id and name, then its
arguments in pieces, in OpenAI's delta shape. A whole (non-streamed) reply runs the same parser over its
text, so a streamed call always reassembles to the non-streamed one.

Two formats, picked from the chat template or `--tool-call-parser` (tools.py):

- **hermes** (Hermes, Qwen 2/2.5/3, and the fallback prompt): `<tool_call>{"name": ..., "arguments": {...}}
  </tool_call>` blocks, any text around them being content. Text that may open a block (a suffix of the text
  that is a prefix of `<tool_call>`) is held back until it is known not to;
- **llama3_json** (Llama 3.1+): the whole reply is `{"name": ..., "parameters": {...}}`, several separated by
  `;`. A reply whose first character is `{` is held back until it ends, then read as calls, or as content if
  it is not calls.

A call's arguments are the exact text of its JSON value, streamed as it grows when `name` comes first (as
the constrained grammars write it), else sent whole once the call is closed. Each feed scans only the text it
adds: a streamed reply is read in time linear in its length.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field

HERMES, LLAMA3_JSON = "hermes", "llama3_json"
OPEN, CLOSE = "<tool_call>", "</tool_call>"
_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"(?:arguments|parameters)"\s*:\s*')


@dataclass(frozen=True)
class Content:
    text: str


@dataclass(frozen=True)
class CallStart:
    index: int  # the call's place in the reply's tool_calls
    id: str
    name: str


@dataclass(frozen=True)
class CallArguments:
    index: int
    text: str  # the next piece of the arguments' JSON text


Delta = Content | CallStart | CallArguments


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


class _Structure:
    """Where a JSON text's brackets stand, read on as the text grows: strings (escapes included) are skipped."""

    def __init__(self, start: int = 0) -> None:
        self.pos = start  # where the next read starts: the text before `start` is not JSON
        self.depth = 0
        self._in_string = self._escaped = False

    def read(self, text: str) -> Iterator[tuple[int, str, int]]:
        """(index, character, depth after it) of each new character of `text` outside a JSON string."""
        for i in range(self.pos, len(text)):
            self.pos = i + 1
            c = text[i]
            if self._in_string:
                if self._escaped:
                    self._escaped = False
                elif c == "\\":
                    self._escaped = True
                elif c == '"':
                    self._in_string = False
                continue
            if c == '"':
                self._in_string = True
                continue
            if c in "{[":
                self.depth += 1
            elif c in "}]":
                self.depth -= 1
            yield i, c, self.depth


@dataclass
class _Call:
    """One call being read: its text so far, and what of it was sent."""

    index: int
    text: str = ""
    started: bool = False
    args: _Structure | None = None  # the arguments' value, read from where it starts, once the head is read
    done: bool = False

    def progress(self) -> list[Delta]:
        out: list[Delta] = []
        if not self.started:
            head = _HEAD.match(self.text)
            if head is None or head.end() >= len(self.text) or self.text[head.end()] != "{":
                return out
            self.started, self.args = True, _Structure(head.end())
            out.append(CallStart(self.index, new_call_id(), json.loads(f'"{head.group(1)}"')))
        if self.args is not None and not self.done:
            sent = self.args.pos
            end = next((i + 1 for i, c, depth in self.args.read(self.text) if c in "}]" and depth == 0), None)
            piece = self.text[sent:end if end is not None else len(self.text)]
            if piece:
                out.append(CallArguments(self.index, piece))
            self.done = end is not None
        return out

    def close(self) -> list[Delta] | None:
        """The rest of the call once its text is complete; None if it is not a call (not a JSON object with a
        string `name` and object arguments)."""
        out = self.progress()
        if self.started:
            return out if self.done else None
        try:
            call = json.loads(self.text)
        except ValueError:
            return None
        args = call.get("arguments", call.get("parameters", {})) if isinstance(call, dict) else None
        if not isinstance(call, dict) or not isinstance(call.get("name"), str) or not isinstance(args, dict):
            return None
        self.started = self.done = True
        return [CallStart(self.index, new_call_id(), call["name"]),
                CallArguments(self.index, json.dumps(args, ensure_ascii=False))]


class HermesParser:
    def __init__(self) -> None:
        self._pending = ""  # text not yet sent: a possible start of OPEN, or a call's text
        self._call: _Call | None = None
        self.num_calls = 0

    def feed(self, text: str) -> list[Delta]:
        searched = max(0, len(self._pending) - len(CLOSE) + 1)  # a tag can only end in the new text
        self._pending += text
        out: list[Delta] = []
        while True:
            if self._call is None:
                searched = 0
                at = self._pending.find(OPEN)
                if at < 0:
                    keep = next((k for k in range(min(len(OPEN) - 1, len(self._pending)), 0, -1)
                                 if self._pending.endswith(OPEN[:k])), 0)
                    sent = self._pending[:len(self._pending) - keep]
                    if sent:
                        out.append(Content(sent))
                    self._pending = self._pending[len(sent):]
                    return out
                if at:
                    out.append(Content(self._pending[:at]))
                self._pending = self._pending[at + len(OPEN):]
                self._call = _Call(self.num_calls)
            at = self._pending.find(CLOSE, searched)
            self._call.text = self._pending if at < 0 else self._pending[:at]
            if at < 0:
                out += self._call.progress()
                return out
            closed = self._call.close()
            if closed is None and not self._call.started:  # not a call: the block is content, as written
                closed = [Content(OPEN + self._call.text + CLOSE)]
            else:
                self.num_calls += 1
            out += closed or []
            self._pending, self._call = self._pending[at + len(CLOSE):], None

    def finish(self) -> list[Delta]:
        """The end of the reply: held text is content; a call left open counts if its text is complete."""
        if self._call is None:
            rest, self._pending = self._pending, ""
            return [Content(rest)] if rest else []
        self._call.text = self._pending
        closed = self._call.close()
        if closed is None and not self._call.started:
            closed = [Content(OPEN + self._pending)]  # never a call: its text is content
        elif closed is not None:
            self.num_calls += 1
        self._call, self._pending = None, ""
        return closed or []


class Llama3JsonParser:
    def __init__(self) -> None:
        self._held: str | None = None  # the reply, held while it may be calls
        self._passing = False  # the reply is text: sent as it comes

    def feed(self, text: str) -> list[Delta]:
        if self._passing:
            return [Content(text)] if text else []
        self._held = (self._held or "") + text
        stripped = self._held.lstrip()
        if stripped and not stripped.startswith("{"):
            self._passing, held, self._held = True, self._held, None
            return [Content(held)]
        return []

    def finish(self) -> list[Delta]:
        if self._held is None:
            return []
        held, self._held = self._held, None
        calls: list[Delta] = []
        for i, part in enumerate(_split_top_level(held.strip(), ";")):
            call = _Call(i, text=part)
            closed = call.close()
            if closed is None:
                return [Content(held)]
            calls += closed
        return calls or ([Content(held)] if held else [])


def _split_top_level(text: str, sep: str) -> list[str]:
    """`text` split at `sep` outside JSON strings and brackets."""
    parts, begin = [], 0
    for i, c, depth in _Structure().read(text):
        if c == sep and depth == 0:
            parts.append(text[begin:i])
            begin = i + 1
    parts.append(text[begin:])
    return [p for p in (x.strip() for x in parts) if p]


Parser = HermesParser | Llama3JsonParser


def new_parser(name: str) -> Parser:
    return HermesParser() if name == HERMES else Llama3JsonParser()


@dataclass
class ParsedReply:
    """A whole reply read through a parser: what the non-streamed message carries."""

    content: str | None
    tool_calls: list[dict] = field(default_factory=list)


def collect(deltas: list[Delta]) -> ParsedReply:
    """Deltas joined as a client joins streamed ones: content, and each call's id, name and arguments."""
    content = "".join(d.text for d in deltas if isinstance(d, Content))
    calls: dict[int, dict] = {}
    for d in deltas:
        if isinstance(d, CallStart):
            calls[d.index] = {"id": d.id, "type": "function", "function": {"name": d.name, "arguments": ""}}
        elif isinstance(d, CallArguments):
            calls[d.index]["function"]["arguments"] += d.text
    stripped = content.strip()
    return ParsedReply(stripped if stripped or not calls else None, [calls[i] for i in sorted(calls)])


def parse_whole(name: str, text: str) -> ParsedReply:
    parser = new_parser(name)
    return collect(parser.feed(text) + parser.finish())


class ReplyReader:
    """One choice's reply read for tool calls, as OpenAI's chat deltas: {"content": ...} or {"tool_calls":
    [{"index", "id", "type", "function": {"name", "arguments": ""}}]}, then {"tool_calls": [{"index",
    "function": {"arguments": piece}}]}. Calls past `max_calls` (parallel_tool_calls false) are dropped."""

    def __init__(self, parser: str, max_calls: int | None = None) -> None:
        self._parser = new_parser(parser)
        self._max_calls = max_calls
        self.deltas: list[Delta] = []  # everything read, kept calls only
        self.num_calls = 0

    def _kept(self, deltas: list[Delta]) -> list[Delta]:
        kept = [d for d in deltas if isinstance(d, Content) or self._max_calls is None or d.index < self._max_calls]
        self.num_calls += sum(isinstance(d, CallStart) for d in kept)
        self.deltas += kept
        return kept

    def feed(self, text: str) -> list[dict]:
        return [openai_delta(d) for d in self._kept(self._parser.feed(text))]

    def finish(self) -> list[dict]:
        return [openai_delta(d) for d in self._kept(self._parser.finish())]

    def finish_reason(self, reason: str) -> str:
        """OpenAI's: "tool_calls" when the reply ended on its own with calls made."""
        return "tool_calls" if reason == "stop" and self.num_calls else reason


def openai_delta(d: Delta) -> dict:
    if isinstance(d, Content):
        return {"content": d.text}
    if isinstance(d, CallStart):
        return {"tool_calls": [{"index": d.index, "id": d.id, "type": "function",
                                "function": {"name": d.name, "arguments": ""}}]}
    return {"tool_calls": [{"index": d.index, "function": {"arguments": d.text}}]}
