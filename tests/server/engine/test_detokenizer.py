"""Incremental detokenization (never half a character) and stop strings (never emitted, held back)."""

from __future__ import annotations

from flotilla_server.engine.detokenizer import REPLACEMENT_CHAR, IncrementalDetokenizer
from flotilla_server.engine.sampling_params import SamplingParams
from flotilla_server.engine.stopping import find_stop, partial_stop_len, token_finish_reason
from flotilla_server.model.tiny import build_tiny_tokenizer
from hypothesis import given, settings
from hypothesis import strategies as st


class PieceTokenizer:
    """Token i decodes to PIECES[i]: lets a test choose exactly how text splits into tokens."""

    def __init__(self, pieces: list[str]) -> None:
        self.pieces = pieces

    def decode(self, ids: list[int]) -> str:
        return "".join(self.pieces[i] for i in ids)


def feed(detok: IncrementalDetokenizer, ids: list[int]) -> list[str]:
    return [detok.add([i]) for i in ids]


def test_multibyte_text_never_comes_out_half_a_character() -> None:
    tok = build_tiny_tokenizer()
    text = "naïve café — 日本語 and 🚀 rockets, ünïcödé!"
    ids = tok.encode(text, add_special_tokens=False)
    assert len(ids) > len(text) // 2  # byte-level: many characters span several tokens
    prompt = tok.encode("Hello", add_special_tokens=True)
    detok = IncrementalDetokenizer(tok, prompt)
    pieces = feed(detok, ids)
    assert all(REPLACEMENT_CHAR not in p for p in pieces)
    assert "".join(pieces) + detok.flush() == text
    assert sum(1 for p in pieces if p == "") > 0  # some tokens were held back mid-character


TINY_TOKENIZER = build_tiny_tokenizer()


@settings(max_examples=150, deadline=None)
@given(text=st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=60))
def test_the_pieces_add_up_to_the_whole_decode_across_window_moves(text: str) -> None:
    """Byte-level tokens of any text, fed one at a time through windows that move every MAX_WINDOW_TOKENS:
    the pieces are the one-shot decode of the output, never half a character."""
    ids = TINY_TOKENIZER.encode(text, add_special_tokens=False)
    detok = IncrementalDetokenizer(TINY_TOKENIZER, TINY_TOKENIZER.encode("Hi there", add_special_tokens=True))
    pieces = feed(detok, ids)
    assert all(REPLACEMENT_CHAR not in p or REPLACEMENT_CHAR in text for p in pieces)
    assert "".join(pieces) + detok.flush() == TINY_TOKENIZER.decode(ids)


def test_stop_string_is_held_back_then_released_when_it_does_not_match() -> None:
    tok = PieceTokenizer(["x", "a", "b", "c", "q", "ab"])
    detok = IncrementalDetokenizer(tok, [], stop=["abc"])
    assert feed(detok, [0, 1, 2, 4]) == ["x", "", "", "abq"]
    assert not detok.stopped


def test_stop_string_across_tokens_ends_the_text_before_it() -> None:
    tok = PieceTokenizer(["x", "a", "b", "c", "q", "ab", "cd"])
    detok = IncrementalDetokenizer(tok, [], stop=["zz", "abc"])
    assert feed(detok, [0, 5, 6]) == ["x", "", ""]
    assert detok.stopped and detok.text == "x" and detok.flush() == ""
    assert detok.add([0]) == ""


def test_flush_releases_a_held_back_partial_match() -> None:
    detok = IncrementalDetokenizer(PieceTokenizer(["x", "a"]), [], stop=["ab"])
    assert feed(detok, [0, 1]) == ["x", ""]
    assert detok.flush() == "a"


@settings(max_examples=300, deadline=None)
@given(
    pieces=st.lists(st.text(alphabet="abc", min_size=1, max_size=3), min_size=1, max_size=30),
    stops=st.lists(st.text(alphabet="abc", min_size=1, max_size=4), max_size=3),
)
def test_emitted_text_is_the_output_cut_at_the_first_stop(pieces: list[str], stops: list[str]) -> None:
    detok = IncrementalDetokenizer(PieceTokenizer(pieces), [], stop=stops)
    out = "".join(feed(detok, list(range(len(pieces)))))
    out += detok.flush()
    # reference: generation stops after the first token whose text contains a stop string, and the
    # text ends before the earliest match in it (a longer stop that would start earlier is not yet known)
    expected, stopped = "".join(pieces), False
    for n in range(1, len(pieces) + 1):
        text = "".join(pieces[:n])
        hits = [i for i in (text.find(s) for s in stops) if i >= 0]
        if hits:
            expected, stopped = text[: min(hits)], True
            break
    assert out == expected
    assert detok.stopped == stopped


def test_token_finish_reasons() -> None:
    p = SamplingParams(max_tokens=3)
    assert token_finish_reason(5, 1, p, {0}) is None
    assert token_finish_reason(0, 1, p, {0}) == "stop"
    assert token_finish_reason(0, 1, SamplingParams(max_tokens=3, ignore_eos=True), {0}) is None
    assert token_finish_reason(5, 3, p, {0}) == "length"


def test_stop_helpers() -> None:
    assert find_stop("hello world", ["wor", "lo"]) == 3
    assert find_stop("hello world", ["lo"], search_from=6) is None
    assert partial_stop_len("abcab", ["abd", "bx"]) == 2
    assert partial_stop_len("abc", ["x"]) == 0


def test_a_cut_in_the_middle_of_a_character_drops_the_incomplete_tail() -> None:
    tok = build_tiny_tokenizer()
    ids = tok.encode("🚀🚀🚀", add_special_tokens=False)
    assert len(ids) > 3  # byte-level: each rocket spans several tokens
    rocket_ids = len(tok.encode("🚀", add_special_tokens=False))
    for cut in range(1, len(ids)):
        detok = IncrementalDetokenizer(tok, [])
        text = "".join(feed(detok, ids[:cut])) + detok.flush()
        assert text == "🚀" * (cut // rocket_ids), (cut, text)
