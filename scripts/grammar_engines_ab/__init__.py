"""A/B of the two grammar engines for structured output, xgrammar and llguidance, on this machine.

Why: the structured-output feature (JSON schemas, tools) needs a grammar engine from a maintained library;
docs/serving.md says which one Flotilla uses and why. This script is the measurement behind that choice,
kept so it can be rerun when either library, the CPU or the tokenizer changes. Both libraries run in the
same process on the same tokenizer (SmolLM2-135M-Instruct's, built from its GGUF by Flotilla's own
`tokenizer_from_gguf`), their runs interleaved, each figure the median of --rounds rounds.

It measures: compile time (six realistic schemas and `json_object`, cold and cached), pathological schemas
(deep nesting, huge enums) compiled in a worker process that is killed past --compile-timeout, the per-step
token-bitmask fill for batches of mixed grammars (a Python loop and each library's batch API), the fill on a
thread while the main thread runs a forward-pass-shaped torch loop (does the library release the GIL), the
bitmask applied to float32 logits, a correctness smoke (random logits + mask, output validated with
jsonschema), EOS / rollback / fork behaviour, and JSON Schema keyword coverage.

It needs a scratch venv with both libraries (not the project's: xgrammar is not a Flotilla dependency) and
Flotilla's server package on the path (it imports only the GGUF tokenizer builder). torch goes in first and
alone, so the CPU build on disk is the one taken; xgrammar goes in with --no-deps, since its Linux x86-64
metadata requires triton (a 286 MB wheel, 1 GB installed) that nothing here uses. About 12 minutes on 2 cores,
run from the repository root:

    python3 -m venv /tmp/gram-venv
    /tmp/gram-venv/bin/pip install torch==2.13.0
    /tmp/gram-venv/bin/pip install -c constraints.txt transformers tokenizers gguf jsonschema numpy llguidance==1.9.1
    /tmp/gram-venv/bin/pip install -c constraints.txt --no-deps xgrammar==0.2.8 apache-tvm-ffi==0.1.15.post2
    PYTHONPATH=server:contract /tmp/gram-venv/bin/python -m scripts.grammar_engines_ab --json /tmp/grammar_ab.json
    PYTHONPATH=server:contract /tmp/gram-venv/bin/python -m scripts.grammar_engines_ab --sections compile,fill --rounds 5
"""
