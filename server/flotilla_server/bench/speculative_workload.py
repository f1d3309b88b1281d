"""The requests of `flotilla-bench speculative`: an edit task that copies a shipped passage, free writing, and the
prompts of the greedy-equality check; and the check that the edit task measures copying at all.

Why a completion and not a chat: SmolLM2-135M-Instruct does not copy a passage when asked to in a chat, so the
edit prompt is the passage, the instruction, then the passage's first words again, and the model continues the
copy. Prompt lookup pays only where the output repeats its context; the 8-gram check says whether it does.
"""

from __future__ import annotations

import json
from pathlib import Path

PASSAGE_FILE = Path(__file__).with_name("speculative_passage.json")
# the stated change ("Boston" for "the Manhattoes"): SmolLM2-135M does not make it, and the copy check does not ask
EDIT_INSTRUCTION = ('Now repeat the passage exactly, with one change: write "Boston" wherever it says "the '
                    'Manhattoes". Here is the repeated passage:')
FIRST_WORDS = 6  # of the passage, repeated after the instruction so that the model continues the copy
NGRAM = 8  # the copy check's n-gram, in tokens
CHECKED_TOKENS = 300  # the output tokens the copy check reads
MIN_SHARED = 0.8  # share of those 8-grams that must be the passage's
FREE_PROMPT = "Write a story about a lighthouse keeper who finds a message in a bottle."
EQUALITY_CHATS = (
    FREE_PROMPT,
    "Explain how a bicycle stays upright.",
    "Describe a quiet morning in a small fishing town.",
    "List some reasons people enjoy gardening.",
    "What is the difference between weather and climate?",
    "Write a short poem about the sea.",
    "Give three tips for learning a new language.",
    "Why is the sky blue? Answer in two sentences.",
    "Summarize the plot of a detective story you invent.",
    "Write a recipe for a simple tomato soup.",
)


def passage() -> dict:
    """The shipped public-domain passage: {"title", "author", "published", "license", "note", "text"}."""
    return json.loads(PASSAGE_FILE.read_text())


def edit_prompt(text: str) -> str:
    first = " ".join(text.split()[:FIRST_WORDS])
    return f"{text}\n\n{EDIT_INSTRUCTION}\n\n{first}"


def equality_completions(text: str) -> list[str]:
    """Ten completion prompts: each paragraph of the passage as an edit prompt, then openings to continue."""
    paragraphs = [p for p in text.split("\n\n") if p.strip()]
    prompts = [edit_prompt(p) for p in paragraphs]
    openings = ("Once upon a time, in a village by the mountains,", "The three laws of motion are",
                "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
                "Dear friend,\n\nThank you for your letter.", "The capital of France is Paris. The capital of Italy is",
                "1, 2, 3, 4, 5,", "Step 1: Preheat the oven.", "In the beginning")
    return (prompts + list(openings))[:10]


def shared_ngrams(output_ids: list[int], passage_ids: list[int], n: int = NGRAM,
                  checked_tokens: int = CHECKED_TOKENS) -> float:
    """The share of the n-grams of the output's first `checked_tokens` tokens that are n-grams of the passage."""
    head = output_ids[:checked_tokens]
    grams = [tuple(head[i:i + n]) for i in range(len(head) - n + 1)]
    if not grams:
        return 0.0
    source = {tuple(passage_ids[i:i + n]) for i in range(len(passage_ids) - n + 1)}
    return sum(g in source for g in grams) / len(grams)
