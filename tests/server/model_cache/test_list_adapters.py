"""LoRA adapter lines in the model list file (`NAME=SOURCE base=BASE`): the shared grammar round-trips,
refuses each bad line naming it, and the server folds each adapter onto its base's spec."""

from __future__ import annotations

import re

import pytest
from flotilla_contract.model_list import ListEntry, format_model_list, parse_model_list
from flotilla_server.model_cache.specs import ModelSpec, fold, merge, parse_list, parse_spec
from hypothesis import given
from hypothesis import strategies as st

_NAMES = st.sampled_from(["a", "b", "llama-3", "org/m:v1"])
_MODEL_SOURCES = st.sampled_from(["tiny", "/models/x", "/m/a.gguf"])
_ADAPTER_SOURCES = st.sampled_from(["/adapters/legal", "/a/b=c"])


@st.composite
def _lists(draw) -> list[ListEntry]:
    """A valid list: models (each maybe quantized), then adapters on them, shuffled."""
    models = draw(st.lists(st.tuples(_NAMES, _MODEL_SOURCES, st.none() | st.sampled_from(["none", "gguf"])),
                           unique_by=lambda t: t[0], max_size=3))
    entries = [ListEntry(n, s, q) for n, s, q in models]
    if models:
        count = draw(st.integers(0, 3))
        for i in range(count):
            entries.append(ListEntry(f"adapter-{i}", draw(_ADAPTER_SOURCES), None, draw(st.sampled_from(models))[0]))
    return draw(st.permutations(entries))


@given(_lists())
def test_a_list_with_adapters_round_trips_through_the_strict_parser(entries):
    text = format_model_list(entries)
    assert parse_model_list(text, "models") == entries
    assert [e.line() for e in parse_model_list(text, "models")] == text.splitlines()


@pytest.mark.parametrize("line", ["x=/ad/x base=m", "x=/ad/x  base=m", "x = /ad/x base=m"])
def test_an_adapter_line_names_its_base(line):
    assert parse_model_list(f"m=/models/m quantization=none\n{line}\n", "f")[1] == ListEntry("x", "/ad/x", None, "m")


def test_fields_come_in_any_order_each_once():
    assert parse_model_list("m=/m/m quantization=gguf\n", "f") == [ListEntry("m", "/m/m", "gguf")]
    with pytest.raises(ValueError, match=re.escape("'base=m' follows source '/ad/x'")):
        parse_model_list("m=/m/m\nx=/ad/x base=m base=m\n", "f")


@pytest.mark.parametrize(("text", "message"), [
    ("m=/m/m\nx=/ad/x base=n\n", "f line 2: adapter 'x' names base 'n', which no line lists"),
    ("m=/m/m\nx=/ad/x base=m\ny=/ad/y base=x\n", "f line 3: adapter 'y' names base 'x', which is itself an adapter "
                                                 "(f line 2)"),
    ("m=/m/m\nx=/ad/x base=m\nx=/ad/y base=m\n", "f line 3: 'x' is given twice, as '/ad/x base=m' and "
                                                 "'/ad/y base=m' (first on f line 2): give each name once"),
    ("m=/m/m\nn=/m/n\nn=/ad/n base=m\n", "f line 3: 'n' is given twice, as '/m/n' and '/ad/n base=m' (first on f "
                                         "line 2): an adapter has a model's name"),
    ("m=/m/m\nx=/ad/x base=m quantization=none\n", "f line 2: adapter 'x' (base=m) has quantization=none: an "
                                                   "adapter's factors follow its base's dtype"),
    ("m=/m/m\nx=/ad/x quantization=none base=m\n", "f line 2: adapter 'x' (base=m) has quantization=none"),
    ("m=/m/m\nx=tiny base=m\n", "f line 2: adapter 'x': source 'tiny' is not a PEFT adapter directory's absolute"),
    ("m=/m/m\nx=ad/x base=m\n", "f line 2: source 'ad/x' is neither 'tiny' nor an absolute path"),
    ("m=/m/m\nx=/ad/x base=x\n", "f line 2: adapter 'x' names itself as its base"),
    ("m=/m/m\nx=/ad/x base=a\tb\n", "f line 2: base name 'a\\tb' must start with a letter or digit"),
    ("m=/m/m\nx=/ad/x base=-m\n", "f line 2: base name '-m' must start with a letter or digit"),
    ("m=/m/m\nx=/ad/x lora=m\n", "f line 2: 'lora=m' follows source '/ad/x': an entry is NAME=SOURCE, then at most "
                                 "quantization=VALUE, or base=BASE for an adapter"),
])
def test_a_bad_adapter_line_refuses_the_file_naming_the_line(text, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        parse_model_list(text, "f")
    with pytest.raises(ValueError, match=re.escape(message.replace("f line", "models line"))):
        parse_list(text, "models")


def test_the_writer_refuses_what_the_server_would():
    with pytest.raises(ValueError, match="which no line lists"):
        format_model_list([ListEntry("x", "/ad/x", None, "m")])
    with pytest.raises(ValueError, match="has quantization=none"):
        format_model_list([ListEntry("m", "/m/m"), ListEntry("x", "/ad/x", "none", "m")])


def test_adapters_fold_onto_their_base_in_list_order():
    specs = parse_list("m=/m/m\nx=/ad/x base=m\nn=tiny\ny=/ad/y base=m\n", "f")
    assert fold(specs) == (ModelSpec("m", "/m/m", adapters=(("x", "/ad/x"), ("y", "/ad/y"))), ModelSpec("n", "tiny"))
    assert fold(specs)[0].weights == ("/m/m", None)


def test_a_flags_adapter_may_name_a_base_the_file_lists_and_nothing_else():
    flag = parse_spec("x=ad/x base=m")  # a flag's source may be relative, as a model's
    assert flag == ModelSpec("x", "ad/x", base="m")
    assert fold(merge([flag], parse_list("m=/m/m\n", "f"))) == (ModelSpec("m", "/m/m", adapters=(("x", "ad/x"),)),)
    with pytest.raises(ValueError, match="adapter 'x' names base 'm', which is not a model given"):
        fold((flag,))
    with pytest.raises(ValueError, match="adapter 'y' names base 'x', which is an adapter"):
        fold((ModelSpec("m", "tiny"), flag, ModelSpec("y", "/ad/y", base="x")))
