"""flotilla-bench speculative's workload: the shipped passage, the edit prompt, the copy check (pure)."""

from __future__ import annotations

import pytest
from flotilla_server.bench import speculative_workload as w


def test_the_passage_is_shipped_public_domain_and_the_edit_prompt_ends_with_its_first_words() -> None:
    source = w.passage()
    assert source["license"] == "public domain" and 350 <= len(source["text"].split()) <= 450
    prompt = w.edit_prompt(source["text"])
    assert prompt.startswith(source["text"]) and w.EDIT_INSTRUCTION in prompt
    assert prompt.endswith(" ".join(source["text"].split()[:w.FIRST_WORDS]))
    assert len(w.equality_completions(source["text"])) == 10 and len(w.EQUALITY_CHATS) == 10


@pytest.mark.parametrize(("output", "expected"), [
    (list(range(20)), 1.0),  # a copy
    (list(range(100, 120)), 0.0),  # nothing shared
    (list(range(10)) + list(range(100, 110)), 3 / 13),  # 3 of the 13 8-grams are the passage's
    (list(range(5)), 0.0),  # shorter than one 8-gram
])
def test_shared_ngrams(output, expected) -> None:
    assert w.shared_ngrams(output, list(range(50))) == pytest.approx(expected)


def test_only_the_first_checked_tokens_count() -> None:
    output = list(range(300)) + [999] * 100
    assert w.shared_ngrams(output, list(range(300))) == 1.0
