"""Structured output on the HTTP side: a request's response_format becomes the grammar its reply follows,
checked and compiled before the request queues, so every problem is a 400 that names it.

The order a request meets: its schema against the JSON Schema metaschema (grammar/json_schema.py), then the
compile gate (grammar/compile_gate.py: llguidance's refusals, such as an unsupported keyword, and the time
limit). The engine then masks every token with the grammar (engine/grammar_mask.py) and ends the reply,
finish_reason "stop", when the grammar is complete; cut by max_tokens it ends "length", its JSON incomplete.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from flotilla_server.grammar.compile_gate import CompileGate, CompileLimits, CompileMetrics, GrammarRefused
from flotilla_server.grammar.json_schema import ANY_OBJECT, GrammarError, schema_grammar
from flotilla_server.grammar.tokenizer_info import GrammarTokenizer
from flotilla_server.http.errors import APIError
from flotilla_server.http.schemas import JSONObjectFormat, JSONSchemaFormat, _SamplingFields

if TYPE_CHECKING:  # state.py holds a Grammars: a type-only import, no cycle at run time
    from flotilla_server.http.state import ServerState

JSON_OBJECT, JSON_SCHEMA = "json_object", "json_schema"  # what a constrained request asked for (metrics label)


class GrammarSource(Protocol):
    """What the gate needs of the model's tokenizer (flotilla_server.model.tokenizer.Tokenizer)."""

    vocab_size: int
    eos_token_ids: frozenset[int]

    def to_json(self) -> str: ...


@dataclass(frozen=True)
class StructuredSettings:
    limits: CompileLimits = field(default_factory=CompileLimits)
    tool_call_parser: str = "auto"  # flotilla_contract.flags.TOOL_CALL_PARSERS

    @classmethod
    def from_flags(cls, timeout_s: float, max_compiles: int, tool_call_parser: str) -> StructuredSettings:
        return cls(CompileLimits(timeout_s=timeout_s, max_concurrent=max_compiles), tool_call_parser)


@dataclass(frozen=True)
class Constraint:
    """The grammar a request's reply follows, and what asked for it."""

    grammar: str
    kind: str  # JSON_OBJECT, JSON_SCHEMA, or a tool choice (http/tools.py)


def response_format_constraint(body: _SamplingFields) -> Constraint | None:
    """The request's response_format as a grammar; None for text or none. A 400 names the field."""
    fmt = body.response_format
    if fmt is None or not isinstance(fmt, JSONObjectFormat | JSONSchemaFormat):
        return None
    if body.stop_strings():
        raise APIError(400, "stop cannot be combined with a JSON response_format: a stop string inside the JSON "
                            "would cut it short, and the schema already decides where the reply ends; drop stop.",
                       param="stop")
    param = "response_format.json_schema.schema"
    try:
        if isinstance(fmt, JSONSchemaFormat):
            return Constraint(schema_grammar(fmt.json_schema.json_schema, param), JSON_SCHEMA)
        return Constraint(schema_grammar(ANY_OBJECT, "response_format"), JSON_OBJECT)
    except GrammarError as e:
        raise APIError(400, f"{e}.", param=e.param, code="invalid_schema") from None


class Grammars:
    """One model's compile gate, started by its first grammar (its probe processes start with it)."""

    def __init__(self, settings: StructuredSettings, tokenizer: GrammarSource, vocab_size: int,
                 metrics: CompileMetrics) -> None:
        self.settings = settings
        self._tokenizer = tokenizer
        self._vocab_size = vocab_size
        self._metrics = metrics
        self.gate: CompileGate | None = None

    async def check(self, constraint: Constraint, param: str) -> None:
        """Return once the grammar compiles within the limit; else a 400 naming `param`."""
        if self.gate is None:
            tok = self._tokenizer
            info = GrammarTokenizer.of(tok, self._vocab_size, tok.eos_token_ids)
            self.gate = CompileGate(info, self.settings.limits, self._metrics)
        try:
            await self.gate.check(constraint.grammar)
        except GrammarRefused as e:
            code = "grammar_compile_timeout" if e.timed_out else "invalid_schema"
            raise APIError(400, f"{param}: {e}.", param=param, code=code) from None
        except (OSError, EOFError, asyncio.IncompleteReadError, TimeoutError) as e:  # a probe that could not start
            raise APIError(503, f"The grammar compiler is unavailable ({type(e).__name__}): retry; the next request "
                                "starts a new one.", code="grammar_compiler_unavailable",
                           headers={"Retry-After": "1"}) from None

    async def close(self) -> None:
        if self.gate is not None:
            await self.gate.close()


async def constrain(state: ServerState, body: _SamplingFields, tools: Constraint | None = None) -> str | None:
    """The grammar the request's reply follows (its response_format's, or its tool choice's), compiled; None if
    unconstrained. Counted once it compiled."""
    constraint, param = response_format_constraint(body), "response_format"
    if tools is not None:
        if body.stop_strings():
            raise APIError(400, "stop cannot be combined with tool_choice required or a named function: a stop "
                                "string inside a call would cut it short; drop stop.", param="stop")
        constraint, param = tools, "tools"
    if constraint is None:
        return None
    await state.grammars.check(constraint, param)
    state.metrics.constrained_requests.labels(state.served_model_name, constraint.kind).inc()
    return constraint.grammar
