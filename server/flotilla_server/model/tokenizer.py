"""Tokenizer: `tokenizer.json` through `tokenizers`, the chat template through sandboxed jinja2.

It reproduces what transformers does with the same files: `encode` runs the tokenizer's own
post-processor (which adds BOS where the model expects it), and `apply_chat_template` renders the
template with the variables transformers provides (`messages`, `add_generation_prompt`,
`bos_token`, `eos_token`, `raise_exception`, ...). A rendered chat prompt already holds its special
tokens, so encode it with `add_special_tokens=False` (as transformers does).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from functools import cached_property
from pathlib import Path
from typing import Any

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer as HFTokenizer

from .config import token_ids


class ChatTemplateError(ValueError):
    """The chat template refused the messages (its `raise_exception`) or failed to render."""


class Tokenizer:
    def __init__(
        self,
        tokenizer: HFTokenizer,
        chat_template: str | None = None,
        special_tokens: Mapping[str, str | None] | None = None,
        eos_token_ids: Iterable[int] = (),
    ) -> None:
        self._tok = tokenizer
        self.chat_template = chat_template
        self.special_tokens = dict(special_tokens or {})  # bos_token, eos_token, ... -> text
        eos = set(eos_token_ids)
        eos_text = self.special_tokens.get("eos_token")
        if eos_text is not None and (eos_id := tokenizer.token_to_id(eos_text)) is not None:
            eos.add(eos_id)
        self.eos_token_ids: frozenset[int] = frozenset(eos)

    @classmethod
    def from_dir(cls, path: str | Path, extra_eos_token_ids: Iterable[int] = ()) -> Tokenizer:
        """Reads `tokenizer.json`, `tokenizer_config.json` (special tokens, chat template) and the
        EOS ids of `generation_config.json`; `chat_template.jinja` overrides the config's template."""
        path = Path(path)
        tok_file = path / "tokenizer.json"
        if not tok_file.is_file():
            raise FileNotFoundError(
                f"{tok_file} not found: Flotilla needs a fast tokenizer file; save one with "
                "`AutoTokenizer.from_pretrained(...).save_pretrained(dir)`"
            )
        config = _read_json(path / "tokenizer_config.json")
        template = config.get("chat_template")
        if isinstance(template, list):  # named templates: take "default"
            template = next((t["template"] for t in template if t.get("name") == "default"), None)
        if (path / "chat_template.jinja").is_file():
            template = (path / "chat_template.jinja").read_text()
        # absent tokens stay undefined in the template (as in transformers), not the string "None"
        special = {
            key: text
            for key in ("bos_token", "eos_token", "unk_token", "pad_token")
            if (text := _token_text(config.get(key))) is not None
        }
        eos = set(extra_eos_token_ids)
        eos.update(token_ids(_read_json(path / "generation_config.json").get("eos_token_id")))
        return cls(HFTokenizer.from_file(str(tok_file)), template, special, eos)

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self._tok.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def to_json(self) -> str:
        """The tokenizer as `tokenizer.json` text (what llguidance builds its token tables from)."""
        return self._tok.to_str()

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def apply_chat_template(
        self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True, **kwargs: Any
    ) -> str:
        """Renders the messages; raises ChatTemplateError with the template's own message."""
        if self._template is None:
            raise ChatTemplateError(
                "this model has no chat template: use /v1/completions, or add `chat_template` to "
                "tokenizer_config.json"
            )
        try:
            return self._template.render(
                messages=[dict(m) for m in messages],
                add_generation_prompt=add_generation_prompt,
                **self.special_tokens,
                **kwargs,
            )
        except ChatTemplateError:
            raise
        except jinja2.TemplateError as e:
            raise ChatTemplateError(f"chat template failed: {e}") from e

    @cached_property
    def _template(self) -> jinja2.Template | None:
        if self.chat_template is None:
            return None
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        return env.from_string(self.chat_template)


def _raise(message: str) -> None:
    raise ChatTemplateError(message)


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None,
            sort_keys: bool = False) -> str:
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _token_text(value: Any) -> str | None:
    """A special token as tokenizer_config.json writes it: a string or an AddedToken dict."""
    if isinstance(value, dict):
        return value.get("content")
    return value


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    with path.open() as f:
        return json.load(f)
