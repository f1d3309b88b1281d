"""The sections on whether the engines behave rather than how fast they are: a correctness smoke (random
logits masked by the grammar, the output validated with jsonschema), EOS / rollback / fork behaviour of a
matcher, and which JSON Schema keywords each engine refuses, enforces or ignores.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from .edge_schemas import COVERAGE
from .engines import Engine, Tok
from .measure import captured_stderr, med, now, popcount_rows, short
from .schemas import ALL_GRAMMARS, INSTANCES, JSON_OBJECT, SCHEMAS

# --- correctness smoke -------------------------------------------------------------------------------------

def sec_smoke(args: argparse.Namespace, libs: tuple[str, ...], tok: Tok, engines: dict[str, Engine]) -> dict[str, Any]:
    """Random logits (closing tokens and EOS nudged up so answers end) masked by the grammar, argmax, accept;
    the text must parse and validate against the schema (jsonschema, formats checked)."""
    import jsonschema
    import torch
    texts = tok.token_texts()
    bias = torch.zeros(tok.vocab_size)
    for i, t in enumerate(texts):
        if any(c in t for c in '"}],'):
            bias[i] = 3.0
        elif t and not t.strip():
            bias[i] = -4.0  # whitespace-only tokens: both grammars allow free whitespace between tokens
    bias[tok.eos] = 6.0
    res: dict[str, Any] = {lib: {} for lib in libs}
    examples: dict[str, dict[str, str]] = {lib: {} for lib in libs}
    for lib in libs:
        eng = engines[lib]
        cache = eng.new_cache()
        for g in ALL_GRAMMARS:
            schema = {"type": "object"} if g == JSON_OBJECT else SCHEMAS[g]
            ok = 0
            fails: list[str] = []
            lengths = []
            for seed in range(args.smoke_seeds):
                gen = torch.Generator().manual_seed(seed)
                m = eng.matcher(eng.compile(cache, None if g == JSON_OBJECT else SCHEMAS[g]))
                bm = eng.alloc(1)
                out: list[int] = []
                ended = False
                for _ in range(args.smoke_max_tokens):
                    eng.fill(m, bm, 0)
                    logits = (torch.randn(tok.vocab_size, generator=gen) + bias).unsqueeze(0)
                    eng.apply(logits, bm)
                    t = int(logits.argmax())
                    if not eng.accept(m, t):
                        fails.append(f"seed {seed}: sampled token {t} refused by accept")
                        break
                    if t in tok.eos_ids:
                        ended = True
                        break
                    out.append(t)
                text = tok.decode(out)
                lengths.append(len(out))
                if not ended:
                    fails.append(f"seed {seed}: no EOS within {args.smoke_max_tokens} tokens")
                    continue
                try:
                    jsonschema.validate(json.loads(text), schema, format_checker=jsonschema.FormatChecker())
                    ok += 1
                    examples[lib].setdefault(g, text[:200])
                except Exception as e:
                    fails.append(f"seed {seed}: {type(e).__name__}: {short(str(e), 120)} in {text[:120]!r}")
            res[lib][g] = {"valid": ok, "runs": args.smoke_seeds, "median_tokens": med(lengths), "failures": fails[:3]}
        res[lib]["examples"] = examples[lib]
    print(f"\n## correctness smoke: random logits + mask, {args.smoke_seeds} seeds per grammar, valid/runs")
    print(f"{'grammar':<15} " + " ".join(f"{lib:>14}" for lib in libs))
    for g in ALL_GRAMMARS:
        print(f"{g:<15} " + " ".join(f"{res[lib][g]['valid']:>8}/{res[lib][g]['runs']:<5}" for lib in libs))
    for lib in libs:
        for g in ALL_GRAMMARS:
            for f in res[lib][g]["failures"]:
                print(f"  ! {lib} {g}: {f}")
        print(f"  {lib} example: {examples[lib].get('tool_call', '')[:160]}")
    return res


# --- EOS, max length, rollback, fork ---------------------------------------------------------------------

def mask_bits(eng: Engine, m: Any) -> Any:
    bm = eng.alloc(1)
    eng.fill(m, bm, 0)
    return bm.clone()


def allowed(bm: Any, token: int) -> bool:
    return bool((int(bm[0, token // 32]) >> (token % 32)) & 1)


def sec_lifecycle(args: argparse.Namespace, libs: tuple[str, ...], tok: Tok, engines: dict[str, Engine]) -> dict[str, Any]:
    import torch
    res: dict[str, Any] = {lib: {} for lib in libs}
    g = "catalogue_item"
    toks = tok.encode(json.dumps(INSTANCES[g]))
    for lib in libs:
        eng = engines[lib]
        r = res[lib]
        cg = eng.compile(eng.new_cache(), SCHEMAS[g])
        m = eng.matcher(cg)
        r["eos_allowed_at_start"] = allowed(mask_bits(eng, m), tok.eos)
        for t in toks[:10]:
            eng.accept(m, t)
        r["eos_allowed_mid_json"] = allowed(mask_bits(eng, m), tok.eos)
        # an invalid token mid-answer: refused? state kept?
        bad = tok.encode("]]]")[0]
        before = mask_bits(eng, m)
        with captured_stderr() as err:
            r["invalid_token_accepted"] = eng.accept(m, bad)
        r["invalid_token_stderr"] = short(err["text"], 200)
        r["error_after_invalid"] = eng.error(m)
        try:
            r["state_kept_after_invalid"] = bool(torch.equal(before, mask_bits(eng, m)))
        except Exception as e:
            r["state_kept_after_invalid"] = f"{type(e).__name__}: {e}"
        # complete answer
        m = eng.matcher(cg)
        for t in toks:
            assert eng.accept(m, t)
        bm = mask_bits(eng, m)
        r["after_complete_json_eos_allowed"] = allowed(bm, tok.eos)
        r["after_complete_json_allowed_count"] = int(popcount_rows(bm)[0])
        r["terminated_before_eos"] = eng.terminated(m)
        if hasattr(m, "is_accepting"):
            r["accepting_before_eos"] = bool(m.is_accepting())
        r["eos_accepted"] = eng.accept(m, tok.eos)
        r["terminated_after_eos"] = eng.terminated(m)
        try:
            bm = mask_bits(eng, m)
            r["mask_after_termination_allowed_count"] = int(popcount_rows(bm)[0])
        except Exception as e:
            r["mask_after_termination_allowed_count"] = f"{type(e).__name__}: {short(str(e))}"
        with captured_stderr():
            try:
                r["token_after_termination_accepted"] = eng.accept(m, toks[0])
            except Exception as e:
                r["token_after_termination_accepted"] = f"{type(e).__name__}: {short(str(e))}"
        # rollback: k tokens, mask, 5 more, rollback 5, same mask? and past EOS
        try:
            m = eng.matcher(cg)
            k = 20
            for t in toks[:k]:
                eng.accept(m, t)
            ref = mask_bits(eng, m)
            for t in toks[k:k + 5]:
                eng.accept(m, t)
            t0 = now()
            eng.rollback(m, 5)
            r["rollback_5_us"] = (now() - t0) * 1e6
            r["rollback_restores_mask"] = bool(torch.equal(ref, mask_bits(eng, m)))
            for t in toks[k:]:
                eng.accept(m, t)
            eng.accept(m, tok.eos)
            eng.rollback(m, 1)
            r["rollback_over_eos_unterminates"] = not eng.terminated(m)
            m = eng.matcher(cg)
            for t in toks:
                eng.accept(m, t)
            t0 = now()
            eng.rollback(m, len(toks))
            r[f"rollback_all_{len(toks)}_us"] = (now() - t0) * 1e6
            r["rollback_all_restores_start"] = bool(torch.equal(mask_bits(eng, m), mask_bits(eng, eng.matcher(cg))))
        except Exception as e:
            r["rollback"] = f"{type(e).__name__}: {short(str(e))}"
        # fork: copy mid-answer; the copy and the original advance independently
        try:
            m = eng.matcher(cg)
            for t in toks[:20]:
                eng.accept(m, t)
            t0 = now()
            f = eng.fork(m)
            r["fork_us"] = (now() - t0) * 1e6
            ref = mask_bits(eng, f)
            for t in toks[20:30]:
                eng.accept(m, t)
            r["fork_independent"] = bool(torch.equal(ref, mask_bits(eng, f)))
            for t in toks[20:]:
                assert eng.accept(f, t)
            r["fork_completes"] = eng.accept(f, tok.eos) and eng.terminated(f)
        except Exception as e:
            r["fork"] = f"{type(e).__name__}: {short(str(e))}"
        # the replay alternative to fork/rollback: a fresh matcher, all tokens again
        t0 = now()
        m = eng.matcher(cg)
        for t in toks:
            eng.accept(m, t)
        r[f"replay_{len(toks)}_tokens_us"] = (now() - t0) * 1e6
        r["matcher_api"] = sorted(a for a in dir(m) if not a.startswith("_"))
        # can the compiled grammar cross a process boundary (compile in a killable worker)?
        import pickle
        for what, obj in (("compiled", cg), ("matcher", m)):
            try:
                t0 = now()
                blob = pickle.dumps(obj)
                pickle.loads(blob)
                r[f"{what}_pickle"] = f"ok, {len(blob)} bytes, {(now() - t0) * 1e3:.1f} ms"
            except Exception as e:
                r[f"{what}_pickle"] = f"{type(e).__name__}: {short(str(e), 80)}"
        if hasattr(cg, "serialize_json"):
            t0 = now()
            blob = cg.serialize_json()
            t1 = now()
            type(cg).deserialize_json(blob, engines[lib].info)
            r["compiled_serialize_json"] = (f"{len(blob)} bytes, serialize {(t1 - t0) * 1e3:.1f} ms, "
                                            f"deserialize {(now() - t1) * 1e3:.1f} ms")
    print("\n## EOS / max length / rollback / fork")
    keys = [k for k in res[libs[0]] if k != "matcher_api"]
    for lib in libs[1:]:
        keys += [k for k in res[lib] if k not in keys and k != "matcher_api"]
    print(f"{'':<42} " + " ".join(f"{lib:>26}" for lib in libs))
    for k in keys:
        cells = []
        for lib in libs:
            v = res[lib].get(k, "")
            cells.append(f"{(f'{v:.1f}' if isinstance(v, float) else short(str(v), 26)):>26}")
        print(f"{k:<42} " + " ".join(cells))
    return res


# --- JSON Schema keyword coverage --------------------------------------------------------------------------

def accepts(eng: Engine, tok: Tok, compiled: Any, value: Any) -> bool:
    m = eng.matcher(compiled)
    with captured_stderr():
        for t in tok.encode(json.dumps(value)):
            if not eng.accept(m, t):
                return False
        return eng.accept(m, tok.eos)


def sec_coverage(args: argparse.Namespace, libs: tuple[str, ...], tok: Tok, engines: dict[str, Engine]) -> dict[str, Any]:
    """Per keyword: refused (compile error), enforced (the violating instance refused, the conforming one
    accepted), ignored (both accepted), or too strict (the conforming one refused); warnings captured."""
    import copy

    import jsonschema
    engines = dict(engines)
    if "xgrammar" in engines:  # also xgrammar with strict_mode=False (extra properties allowed by default)
        lax = copy.copy(engines["xgrammar"])
        lax.strict_mode = False  # type: ignore[attr-defined]
        engines["xgrammar strict_mode=False"] = lax
        libs = (*libs, "xgrammar strict_mode=False")
    res: dict[str, Any] = {lib: {} for lib in libs}
    for kw, schema, good, bad in COVERAGE:
        jsonschema.validate(good, schema)
        for lib in libs:
            eng = engines[lib]
            try:
                with captured_stderr() as err:
                    cg = eng.compile(eng.new_cache(), schema)
            except Exception as e:
                res[lib][kw] = {"outcome": "refused", "message": short(f"{type(e).__name__}: {e}", 220)}
                continue
            g_ok = accepts(eng, tok, cg, good)
            b_ok = accepts(eng, tok, cg, bad) if bad is not None else None
            if not g_ok:
                outcome = "too strict"
            elif bad is None:
                outcome = "accepted"
            else:
                outcome = "ignored" if b_ok else "enforced"
            res[lib][kw] = {"outcome": outcome + (" (warned)" if err["text"] else ""),
                            "message": short(err["text"], 220)}
    print("\n## JSON Schema keyword coverage (refused = compile error; ignored = a violating value got through)")
    print(f"{'keyword':<48} " + " ".join(f"{lib:>27}" for lib in libs))
    for kw, *_ in COVERAGE:
        print(f"{kw:<48} " + " ".join(f"{res[lib][kw]['outcome']:>27}" for lib in libs))
    for lib in libs:
        for kw, r in res[lib].items():
            if r["message"]:
                print(f"  {lib} {kw}: {r['message']}")
    return res
