"""Structured output: JSON schemas and tool calls made into llguidance grammars, checked before they run.

Torch-free, so the HTTP layer checks and compiles a request's grammar before it queues; the engine turns the
same grammar text into per-sequence matchers and token masks (engine/grammar_book.py, engine/grammar_mask.py).
docs/serving.md, "Structured output", says what is enforced and why llguidance.
"""
