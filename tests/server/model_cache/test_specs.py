"""Model specs: `--model NAME=SOURCE`, the model list file (re-read when it changes), and the CLI's rules for
multi-model mode."""

from __future__ import annotations

import os
import re

import pytest
from flotilla_server.cli import model_specs, parse_settings
from flotilla_server.model_cache.specs import ModelListFile, ModelSpec, merge, parse_list, parse_spec


@pytest.mark.parametrize(("text", "spec"), [
    ("tiny=tiny", ModelSpec("tiny", "tiny")),
    (" llama = /models/llama-3 ", ModelSpec("llama", "/models/llama-3")),
    ("org/model:v1=/m=odd", ModelSpec("org/model:v1", "/m=odd")),  # the first '=' splits
    ("smol=/m/smol.gguf quantization=none", ModelSpec("smol", "/m/smol.gguf", "none")),  # over --quantization
    ("smol = /m/smol.gguf  quantization=gguf", ModelSpec("smol", "/m/smol.gguf", "gguf")),
])
def test_parse_spec(text, spec):
    assert parse_spec(text) == spec


@pytest.mark.parametrize(("text", "message"), [
    ("tiny", "is not NAME=SOURCE"),
    ("a=", "is not NAME=SOURCE"),
    ("=tiny", "is not NAME=SOURCE"),
    ("two words=tiny", "must start with a letter or digit"),
    ("a=/m/a dtype=bfloat16", "'dtype=bfloat16' follows source '/m/a': an entry is NAME=SOURCE, then at most "
                              "quantization=VALUE"),
    ("a=/m/a quantization=int4", "quantization 'int4' is not one of none, gguf"),
    ("a=/m/a quantization=none quantization=gguf", "'quantization=none' follows source '/m/a'"),
])
def test_parse_spec_says_what_to_write(text, message):
    with pytest.raises(ValueError, match=message):
        parse_spec(text)


def test_a_flag_takes_a_relative_path_as_single_model_mode_does():
    assert parse_spec("a=models/a") == ModelSpec("a", "models/a")


def test_list_skips_comments_and_blank_lines_and_names_the_bad_line():
    assert parse_list("# pool\n\na=tiny\n  b=/m/b\n", "f") == (ModelSpec("a", "tiny"), ModelSpec("b", "/m/b"))
    with pytest.raises(ValueError, match="f line 2"):
        parse_list("a=tiny\noops\n", "f")


@pytest.mark.parametrize(("text", "message"), [
    # an unknown field: anything after SOURCE on its line is refused, never ignored
    ("a=/m/a extra\n", "line 1: 'extra' follows source '/m/a'"),
    ("a=tiny # the demo\n", "line 1: '# the demo' follows source 'tiny'"),
    # a wrong type: SOURCE is 'tiny' or an absolute path, and nothing else
    ("a=tiny\nb=Tiny\n", "line 2: source 'Tiny' is neither 'tiny' nor an absolute path"),
    ("a=models/a\n", "source 'models/a' is neither 'tiny' nor an absolute path"),
    ("a=hf://org/model\n", "source 'hf://org/model' is neither"),
    ("a=/m/\x07a\n", "holds a control character"),
    # an empty entry, or a missing field: nothing is implied
    ("=\n", "line 1: '=' is not NAME=SOURCE"),
    ("a=\n", "'a=' is not NAME=SOURCE"),
    ("=/m/a\n", "'=/m/a' is not NAME=SOURCE"),
    ("tiny\n", "'tiny' is not NAME=SOURCE"),  # never read as tiny=tiny
    ("a=tiny\na=/m/a\n", "'a' is given twice"),
    ("a=/m/a.gguf\na=/m/a.gguf quantization=none\n", "'a' is given twice, as '/m/a.gguf' and '/m/a.gguf quantization=none'"),
])
def test_the_list_file_is_parsed_strictly_and_refused_whole(text, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        parse_list(text, "models")


def test_an_empty_list_file_lists_no_model_not_a_default_one():
    assert parse_list("", "f") == () and parse_list("# no members yet\n\n", "f") == ()


def test_a_name_given_twice_must_name_one_source():
    assert merge([ModelSpec("a", "tiny")], [ModelSpec("a", "tiny")]) == (ModelSpec("a", "tiny"),)
    with pytest.raises(ValueError, match="given twice"):
        merge([ModelSpec("a", "tiny")], [ModelSpec("a", "/m")])


def test_list_file_is_reread_only_when_it_changes_including_a_configmap_style_swap(tmp_path):
    # a mounted ConfigMap: the file is a symlink through ..data, which the kubelet swaps to a new directory
    first, second = tmp_path / "v1", tmp_path / "v2"
    first.mkdir()
    second.mkdir()
    (first / "models").write_text("a=tiny\n")
    (second / "models").write_text("a=tiny\nb=tiny\n")
    (tmp_path / "..data").symlink_to(first)
    (tmp_path / "models").symlink_to(tmp_path / "..data" / "models")
    watched = ModelListFile(str(tmp_path / "models"))
    assert watched.read_if_changed() == (ModelSpec("a", "tiny"),)
    assert watched.read_if_changed() is None
    os.replace(_link(tmp_path, second), tmp_path / "..data")
    assert [s.name for s in watched.read_if_changed()] == ["a", "b"]


def _link(tmp_path, target):
    new = tmp_path / "..data_tmp"
    new.symlink_to(target)
    return new


def test_single_model_mode_is_unchanged():
    s = parse_settings(["--model", "/models/x"], {})
    assert (s.model, s.multi_model) == ("/models/x", False)
    assert s.engine_config().model == "/models/x" and s.engine_config().kv_cache_memory_bytes is None


def test_multi_model_mode_from_named_models_or_a_list_file():
    s = parse_settings(["--model", "a=tiny", "--model", "b=/m/b", "--memory-budget", "2Gi"], {})
    assert s.multi_model and model_specs(s) == (ModelSpec("a", "tiny"), ModelSpec("b", "/m/b"))
    assert s.memory_budget_bytes == 2 * 2**30
    assert s.engine_config().kv_cache_memory_bytes == 256 * 2**20  # a fixed pool per model, by default
    listed = parse_settings(["--model-list-file", "/etc/flotilla/models"], {})
    assert listed.multi_model and model_specs(listed) == ()  # 'tiny', the single-model default, is not added


@pytest.mark.parametrize(("argv", "message"), [
    (["--model", "a", "--model", "b"], "need a name each: --model NAME=SOURCE"),
    (["--model", "a=tiny", "--model", "b"], "'b' is not NAME=SOURCE"),
    (["--model", "a=tiny", "--model", "a=/m"], "given twice"),
    (["--model", "a=tiny", "--served-model-name", "x"], "name each model as --model NAME=SOURCE"),
    (["--model", "a=tiny", "--load-timeout-s", "0"], "--load-timeout-s must be > 0"),
    (["--model", "a=tiny", "--min-residency-s", "-1"], "--min-residency-s must be >= 0"),
])
def test_multi_model_flags_refused_with_what_to_change(argv, message, capsys):
    with pytest.raises(SystemExit):
        parse_settings(argv, {})
    assert message in capsys.readouterr().err


def test_device_sized_memory_flags_are_refused_in_multi_model_mode(capsys):
    for argv, environ in ((["--model", "a=tiny", "--gpu-memory-utilization", "0.5"], {}),
                          (["--model", "a=tiny", "--gpu-memory-utilization=0.5"], {}),
                          (["--model", "a=tiny"], {"FLOTILLA_GPU_MEMORY_UTILIZATION": "0.5"})):
        with pytest.raises(SystemExit):
            parse_settings(argv, environ)
        assert "--gpu-memory-utilization is refused in multi-model mode" in capsys.readouterr().err
    single = parse_settings(["--model", "x", "--gpu-memory-utilization", "0.5"], {})
    assert single.gpu_memory_utilization == 0.5  # single: allowed
