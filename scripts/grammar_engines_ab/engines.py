"""The tokenizer both libraries share (SmolLM2's, built from its GGUF by Flotilla's own builder) and the two
grammar engines, xgrammar and llguidance, behind one small interface so every section drives them the same
way; the libraries, torch and transformers are imported only when an engine or the tokenizer is built.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .measure import now

# ----------------------------------------------------------------------------------------------------------
# the tokenizer

class Tok:
    """SmolLM2's tokenizer as Flotilla builds it from the GGUF, and the transformers view both libraries take."""

    def __init__(self, gguf: Path) -> None:
        from flotilla_server.model.gguf_file import GGUFModel
        from flotilla_server.model.gguf_tokenizer import tokenizer_from_gguf
        from transformers import PreTrainedTokenizerFast

        t0 = now()
        self.flotilla = tokenizer_from_gguf(GGUFModel(gguf))
        self.build_s = now() - t0
        self.hf_raw = self.flotilla._tok  # tokenizers.Tokenizer
        sp = self.flotilla.special_tokens
        self.hf = PreTrainedTokenizerFast(tokenizer_object=self.hf_raw, **{k: v for k, v in sp.items() if v})
        self.vocab_size = self.flotilla.vocab_size
        eos = sorted(self.flotilla.eos_token_ids)
        self.eos = eos[0]
        self.eos_ids = eos

    def encode(self, text: str) -> list[int]:
        return self.flotilla.encode(text, add_special_tokens=False)

    def decode(self, ids: list[int]) -> str:
        return self.hf_raw.decode(ids, skip_special_tokens=True)

    def token_texts(self) -> list[str]:
        return [self.hf_raw.decode([i], skip_special_tokens=False) for i in range(self.vocab_size)]


# ----------------------------------------------------------------------------------------------------------
# the two libraries behind one interface

class Engine:
    name = ""

    def __init__(self, tok: Tok, compile_threads: int) -> None:
        self.tok = tok
        self.V = tok.vocab_size
        self.compile_threads = compile_threads

    # compile: a fresh "cache" (compiler) per cold measurement; compile() through one cache is cached
    def new_cache(self) -> Any: ...
    def compile(self, cache: Any, schema: dict[str, Any] | None) -> Any: ...
    def matcher(self, compiled: Any) -> Any: ...
    def alloc(self, rows: int) -> Any: ...
    def fill(self, m: Any, bitmask: Any, row: int) -> None: ...
    def batch_filler(self, threads: int) -> Callable[[list[Any], Any], None]: ...
    def accept(self, m: Any, token: int) -> bool: ...
    def apply(self, logits: Any, bitmask: Any) -> None: ...
    def terminated(self, m: Any) -> bool: ...
    def rollback(self, m: Any, n: int) -> None: ...
    def fork(self, m: Any) -> Any: ...
    def error(self, m: Any) -> str | None: return None


class XGrammar(Engine):
    name = "xgrammar"

    strict_mode = True  # xgrammar's default: properties not listed are refused unless additionalProperties says

    def __init__(self, tok: Tok, compile_threads: int) -> None:
        super().__init__(tok, compile_threads)
        import xgrammar as xgr
        self.xgr = xgr
        t0 = now()
        self.info = xgr.TokenizerInfo.from_huggingface(tok.hf, vocab_size=self.V, stop_token_ids=tok.eos_ids)
        self.info_s = now() - t0
        self._batch: dict[int, Any] = {}

    def new_cache(self) -> Any:
        return self.xgr.GrammarCompiler(self.info, max_threads=self.compile_threads, cache_enabled=True)

    def compile(self, cache: Any, schema: dict[str, Any] | None) -> Any:
        if schema is None:  # not compile_builtin_json_grammar(): that one also takes a top-level array
            return cache.compile_json_schema('{"type": "object"}', any_whitespace=True, strict_mode=False)
        return cache.compile_json_schema(json.dumps(schema), any_whitespace=True, strict_mode=self.strict_mode)

    def matcher(self, compiled: Any) -> Any:
        return self.xgr.GrammarMatcher(compiled)

    def alloc(self, rows: int) -> Any:
        return self.xgr.allocate_token_bitmask(rows, self.V)

    def fill(self, m: Any, bitmask: Any, row: int) -> None:
        m.fill_next_token_bitmask(bitmask, row)

    def batch_filler(self, threads: int) -> Callable[[list[Any], Any], None]:
        bm = self._batch.setdefault(threads, self.xgr.BatchGrammarMatcher(threads))
        return lambda ms, bitmask: bm.batch_fill_next_token_bitmask(ms, bitmask)

    def accept(self, m: Any, token: int) -> bool:
        return bool(m.accept_token(token))

    def apply(self, logits: Any, bitmask: Any) -> None:
        self.xgr.apply_token_bitmask_inplace(logits, bitmask)

    def terminated(self, m: Any) -> bool:
        return bool(m.is_terminated())

    def rollback(self, m: Any, n: int) -> None:
        m.rollback(n)

    def fork(self, m: Any) -> Any:
        if hasattr(m, "fork"):
            return m.fork()
        raise NotImplementedError("GrammarMatcher has no fork()")


class LLGuidance(Engine):
    name = "llguidance"

    def __init__(self, tok: Tok, compile_threads: int) -> None:
        super().__init__(tok, compile_threads)
        import llguidance
        import llguidance.torch
        self.llg = llguidance
        t0 = now()
        # from the tokenizer.json text, as Flotilla holds it: no transformers (llguidance.hf needs it)
        self.lltok = llguidance.LLTokenizer(tok.hf_raw.to_str(), n_vocab=self.V, eos_token=tok.eos)
        self.info_s = now() - t0
        self._exec: dict[int, Any] = {}

    def grammar(self, schema: dict[str, Any] | None) -> str:
        s = {"type": "object"} if schema is None else schema
        return self.llg.LLMatcher.grammar_from_json_schema(
            json.dumps(s), defaults={"whitespace_flexible": True})

    def new_cache(self) -> dict[str, Any]:
        return {}

    def compile(self, cache: dict[str, Any], schema: dict[str, Any] | None) -> Any:
        """The grammar text, its matcher built (parsing, lexer spec); Flotilla would cache a pristine matcher
        and deep_copy() it per request, which is what the cached path measures."""
        key = json.dumps(schema, sort_keys=True)
        if key in cache:
            return cache[key]
        m = self.llg.LLMatcher(self.lltok, self.grammar(schema), log_level=1)
        if m.is_error():
            raise ValueError(m.get_error())
        warnings = m.get_grammar_warnings() if hasattr(m, "get_grammar_warnings") else []
        if warnings:
            print("llguidance grammar warnings: " + "; ".join(warnings), file=sys.stderr)
        cache[key] = m
        return m

    def matcher(self, compiled: Any) -> Any:
        return compiled.deep_copy()

    def alloc(self, rows: int) -> Any:
        return self.llg.torch.allocate_token_bitmask(rows, self.V)

    def fill(self, m: Any, bitmask: Any, row: int) -> None:
        self.llg.torch.fill_next_token_bitmask(m, bitmask, row)

    def batch_filler(self, threads: int) -> Callable[[list[Any], Any], None]:
        ex = self._exec.setdefault(threads, self.llg.LLExecutor(num_threads=threads))
        par = self.llg.torch.fill_next_token_bitmask_par

        def fill(ms: list[Any], bitmask: Any) -> None:
            par(ex, [(m, i) for i, m in enumerate(ms)], bitmask)
        return fill

    def accept(self, m: Any, token: int) -> bool:
        return bool(m.consume_token(token))

    def apply(self, logits: Any, bitmask: Any) -> None:
        self.llg.torch.apply_token_bitmask_inplace(logits, bitmask)

    def terminated(self, m: Any) -> bool:
        return bool(m.is_stopped())

    def rollback(self, m: Any, n: int) -> None:
        m.rollback(n)

    def fork(self, m: Any) -> Any:
        return m.deep_copy()

    def error(self, m: Any) -> str | None:
        return m.get_error() if m.is_error() else None


ENGINES: dict[str, type[Engine]] = {"xgrammar": XGrammar, "llguidance": LLGuidance}
