"""Which OpenAI request fields this server honours, accepts and ignores, or refuses (docs/serving.md, "Field policy").

Every field of the pinned `openai` SDK's request types gets one treatment, so that a client sending what
OpenAI accepts is never refused for a field that changes nothing here, and never silently gets an answer
that ignored a field that would have changed it:

- supported: declared on the pydantic schema (`schemas.py`) and honoured;
- ignored: accepted with a debug log line, because it changes nothing here (`metadata`, `store`, ...);
- refused: a 400 naming the feature, because it would change the output and is not built here. A refused
  field carrying its neutral value (`functions: []`, `best_of: 1`, ...) changes nothing, so it is
  accepted like an ignored one: many clients send those defaults on every request.

Our own fields (`top_k`, `min_p`, `repetition_penalty`, `ignore_eos`, `cache_salt`, `priority`,
`flotilla_class`, `speculative`) are listed apart. Any other field gets a 400 naming it.
A test walks the SDK's types, so a field a newer SDK adds fails it until someone classifies it here.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("flotilla.server")

SUPPORTED_COMMON = frozenset(
    {"model", "max_tokens", "temperature", "top_p", "seed", "stop", "stream", "stream_options", "user",
     "frequency_penalty", "presence_penalty", "n", "logprobs"}
)
SUPPORTED = {
    "completions": SUPPORTED_COMMON | {"prompt", "echo"},
    "chat": SUPPORTED_COMMON | {"messages", "max_completion_tokens", "top_logprobs", "response_format", "tools",
                                "tool_choice", "parallel_tool_calls"},
}
# beyond OpenAI's API: vLLM's names, and the request class (docs/serving.md, "Priorities and tenants")
OURS = frozenset({"top_k", "min_p", "repetition_penalty", "ignore_eos", "cache_salt", "priority", "flotilla_class",
                  "speculative"})
# OpenAI fields one endpoint takes beyond the SDK's types for it: vLLM's completions take response_format too
OURS_BY_ENDPOINT = {"completions": frozenset({"response_format"}), "chat": frozenset()}

# accepted and dropped: routing hints, storage and billing options of OpenAI's own platform
IGNORED = {
    "completions": frozenset(),
    "chat": frozenset({
        "metadata", "store", "service_tier", "safety_identifier", "prediction",
        "prompt_cache_key", "prompt_cache_retention", "prompt_cache_options",
    }),
}


def _none(v: Any) -> bool:
    return v is None


def _none_or(*neutral: Any) -> Callable[[Any], bool]:
    return lambda v: v is None or v in neutral


def _empty(v: Any) -> bool:
    return v is None or v == [] or v == {}


@dataclass(frozen=True)
class Refused:
    feature: str  # what the field asks for, in the words of the 400
    is_neutral: Callable[[Any], bool]  # a value that changes nothing is accepted


_SHARED_REFUSED = {
    "logit_bias": Refused("token biasing (logit_bias)", _empty),
}
REFUSED = {
    "completions": {
        **_SHARED_REFUSED,
        "best_of": Refused("best_of (several candidates per choice)", _none_or(1)),
        "suffix": Refused("insertion after a suffix (suffix)", _none_or("")),
    },
    "chat": {
        **_SHARED_REFUSED,
        # the legacy forms of tools: send `tools` and `tool_choice` instead (docs/serving.md, "Tool calling")
        "functions": Refused("legacy function calling (functions; send tools)", _empty),
        "function_call": Refused("legacy function calling (function_call; send tool_choice)", _none_or("none", "auto")),
        "audio": Refused("audio output (audio)", _none),
        "modalities": Refused("output modalities other than text (modalities)", _none_or(["text"])),
        "reasoning_effort": Refused("reasoning effort (reasoning_effort)", _none),
        "verbosity": Refused("verbosity", _none_or("medium")),
        "web_search_options": Refused("web search (web_search_options)", _none),
        "moderation": Refused("moderation", _none),
    },
}


class FieldRefused(ValueError):
    """A field the policy refuses; its message names the feature and says what to change."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def apply_policy(endpoint: str, body: Mapping[str, Any]) -> dict[str, Any]:
    """The body without its ignored fields (and neutral refused ones); raises FieldRefused for the rest."""
    supported = SUPPORTED[endpoint] | OURS | OURS_BY_ENDPOINT[endpoint]
    kept: dict[str, Any] = {}
    for name, value in body.items():
        if name in supported:
            kept[name] = value
        elif name in IGNORED[endpoint]:
            log.debug("ignoring %s=%r: it changes nothing on this server", name, value)
        elif name in REFUSED[endpoint]:
            rule = REFUSED[endpoint][name]
            if not rule.is_neutral(value):
                raise FieldRefused(name, f"{rule.feature} is not supported by this server: remove {name} "
                                         "or send its default, and retry")
            log.debug("ignoring %s=%r: its neutral value", name, value)
        else:
            raise FieldRefused(name, f"unknown field {name!r}: this server does not know it; remove it and retry "
                                     "(see docs/serving.md, 'Field policy')")
    return kept
