"""Request bodies of the OpenAI-compatible endpoints, validated by pydantic before anything reaches the engine.

Fields beyond the declared ones go through `field_policy.apply_policy` first: ignored ones are dropped,
refused and unknown ones get a 400 naming them, so a client relying on an unsupported option learns it at
once. The ranges follow OpenAI's API reference.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from flotilla_server.engine.sampling_params import MAX_N
from flotilla_server.http.errors import APIError
from flotilla_server.http.field_policy import FieldRefused, apply_policy

MAX_STOP_STRINGS = 4
MAX_PROMPTS = 256  # prompts in one completions request


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    include_usage: bool = False


FUNCTION_NAME = r"^[a-zA-Z0-9_-]{1,64}$"  # OpenAI's rule for a schema's and a function's name


class JSONSchemaSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: Annotated[str, Field(pattern=FUNCTION_NAME)] = Field(
        description="The schema's name (OpenAI's: letters, digits, _ and -, at most 64).")
    description: str | None = None
    json_schema: dict[str, Any] = Field(alias="schema", description="The JSON Schema every reply is valid under.")
    strict: bool | None = Field(default=None, description="Accepted; the schema is enforced either way.")


class TextFormat(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["text"]


class JSONObjectFormat(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["json_object"]


class JSONSchemaFormat(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["json_schema"]
    json_schema: JSONSchemaSpec


ResponseFormat = Annotated[TextFormat | JSONObjectFormat | JSONSchemaFormat, Field(discriminator="type")]


class _SamplingFields(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str = Field(description="The served model name, as GET /v1/models lists it.")
    max_tokens: Annotated[int, Field(ge=1)] | None = Field(
        default=None, description="Most tokens to generate; default 16, bounded by the context left."
    )
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] = Field(default=1.0, description="0 is greedy.")
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] = 1.0
    top_k: Annotated[int, Field(ge=-1)] = Field(default=-1, description="-1 or 0 disables the top-k cut.")
    seed: Annotated[int, Field(ge=0, le=2**63 - 1)] | None = None
    presence_penalty: Annotated[float, Field(ge=-2.0, le=2.0)] | None = None
    frequency_penalty: Annotated[float, Field(ge=-2.0, le=2.0)] | None = None
    repetition_penalty: Annotated[float, Field(gt=0.0, le=100.0)] | None = Field(
        default=None, description="vLLM's: >1 discourages tokens already in the prompt or output; 1 disables it."
    )
    min_p: Annotated[float, Field(ge=0.0, le=1.0)] | None = Field(
        default=None, description="vLLM's: drop tokens less likely than min_p times the likeliest; 0 disables it."
    )
    stop: str | Annotated[list[Annotated[str, Field(min_length=1)]], Field(max_length=MAX_STOP_STRINGS)] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool = False
    user: str | None = None
    cache_salt: Annotated[str, Field(min_length=1)] | None = Field(
        default=None, description="Prefix-cache tenant: requests with different salts never share cached KV blocks."
    )
    n: Annotated[int, Field(ge=1, le=MAX_N)] = Field(
        default=1, description="Choices per prompt; they share the prompt's prefill and KV blocks."
    )
    priority: Annotated[int, Field(ge=-(2**31), le=2**31 - 1)] = Field(
        default=0, description="vLLM's: order within the request's class and tenant; lower is more urgent."
    )
    response_format: ResponseFormat | None = Field(
        default=None, description="text, json_object (any JSON object) or json_schema: the reply follows it, token by "
                                  "token (docs/serving.md, 'Structured output').")
    flotilla_class: Literal["interactive", "batch"] | None = Field(
        default=None, description="interactive (the default) or batch; the X-Flotilla-Class header wins."
    )
    speculative: bool = Field(
        default=True, description="false: this request never proposes draft tokens when the server runs "
                                  "--speculative ngram (docs/serving.md, 'Speculative decoding')."
    )

    @model_validator(mode="after")
    def _stream_options_need_stream(self) -> _SamplingFields:
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options is only allowed with stream=true: set stream to true or drop it")
        if isinstance(self.stop, str) and not self.stop:
            raise ValueError("stop must be a non-empty string or a list of non-empty strings")
        return self

    def stop_strings(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)


def _policy(endpoint: str, data: Any) -> Any:
    if not isinstance(data, dict):
        return data
    try:
        return apply_policy(endpoint, data)
    except FieldRefused as e:  # not a ValueError for pydantic to wrap: the 400 names the field itself
        raise APIError(400, f"{e}.", param=e.field, code="unsupported_field") from None


TokenIds = Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1)]


class CompletionRequest(_SamplingFields):
    prompt: (
        Annotated[str, Field(min_length=1)]
        | TokenIds
        | Annotated[list[Annotated[str, Field(min_length=1)]], Field(min_length=1, max_length=MAX_PROMPTS)]
        | Annotated[list[TokenIds], Field(min_length=1, max_length=MAX_PROMPTS)]
    ) = Field(description="A string, a list of token ids, or a list of either: n choices per prompt, choice index "
                          "= prompt number x n + j.")
    echo: bool = Field(default=False, description="Start each choice's text with its prompt.")
    logprobs: Annotated[int, Field(ge=0)] | None = Field(
        default=None, description="Return each token's raw logprob and those of the `logprobs` likeliest tokens (0-20)."
    )

    @model_validator(mode="before")
    @classmethod
    def _field_policy(cls, data: Any) -> Any:
        return _policy("completions", data)


class TextPart(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["text"]
    text: str


class CalledFunction(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    arguments: str = Field(description="The call's arguments as JSON text, as the model wrote them.")


class ToolCall(BaseModel):
    """A call an earlier assistant message made (conversation history)."""

    model_config = ConfigDict(extra="forbid")
    id: Annotated[str, Field(min_length=1)]
    type: Literal["function"] = "function"
    function: CalledFunction


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = Field(default=None, description="assistant: the calls it made.")
    tool_call_id: str | None = Field(default=None, description="tool: the call this message answers.")

    @model_validator(mode="after")
    def _tool_fields(self) -> ChatMessage:
        if self.tool_calls is not None and self.role != "assistant":
            raise ValueError("tool_calls belongs on an assistant message only")
        if (self.tool_call_id is not None) != (self.role == "tool"):
            raise ValueError("a tool message needs tool_call_id (the id of the call it answers), and only a tool "
                             "message may carry one")
        if self.content is None and not (self.role == "assistant" and self.tool_calls):
            raise ValueError("content is required (it may be null only on an assistant message with tool_calls)")
        return self

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content)


class FunctionSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: Annotated[str, Field(pattern=FUNCTION_NAME)]
    description: str | None = None
    parameters: dict[str, Any] | None = Field(default=None, description="A JSON Schema of type object; none: no "
                                                                         "arguments are described.")
    strict: bool | None = Field(default=None, description="Accepted; required and named calls are enforced either way.")


class ToolSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["function"]
    function: FunctionSpec


class NamedFunction(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str


class NamedToolChoice(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["function"]
    function: NamedFunction


class ChatCompletionRequest(_SamplingFields):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    logprobs: bool | None = Field(default=None, description="Return each output token's raw logprob.")
    top_logprobs: Annotated[int, Field(ge=0)] | None = Field(
        default=None, description="With logprobs: also the top_logprobs likeliest tokens at each position (0-20)."
    )
    tools: list[ToolSpec] | None = Field(default=None, description="Functions the model may call (docs/serving.md, "
                                                                    "'Tool calling').")
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = Field(
        default=None, description="none: no calls; auto (the default with tools): the model decides; required or a "
                                  "named function: the reply is a valid call.")
    parallel_tool_calls: bool | None = Field(default=None, description="Several calls in one reply (default true).")

    @model_validator(mode="before")
    @classmethod
    def _field_policy(cls, data: Any) -> Any:
        return _policy("chat", data)

    @model_validator(mode="after")
    def _one_max(self) -> ChatCompletionRequest:
        if self.max_tokens is not None and self.max_completion_tokens is not None:
            raise ValueError("set max_tokens or max_completion_tokens, not both")
        return self
