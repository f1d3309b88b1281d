"""The pure rules of runtime adapters, on tables: what a load or unload does (engine/adapter_requests.py),
which paths a load may read (http/lora_paths.py), the list file's grammar and change plan
(engine/lora_list.py), and the bounded `adapter` label (http/lora_metrics.py)."""

from __future__ import annotations

import pytest
from flotilla_server.engine.adapter_requests import LoadStep, decide_load, decide_unload
from flotilla_server.engine.lora_list import ListChanges, parse_lora_list, plan_changes, read_at_start
from flotilla_server.http.lora_metrics import OTHER_ADAPTERS, AdapterLabels
from flotilla_server.http.lora_paths import path_problem, resolve

SERVED = {"a": "/lora/a"}
READING = {"b": "/lora/b"}


@pytest.mark.parametrize(("name", "source", "step", "status", "words"), [
    ("c", "/lora/c", LoadStep.START, 200, ""),
    ("a", "/lora/a", LoadStep.ANSWER, 200, "already loaded from /lora/a"),  # idempotent
    ("a", "/lora/other", LoadStep.ANSWER, 409, "already loaded from /lora/a: unload it first"),
    ("b", "/lora/b", LoadStep.JOIN, 200, ""),  # two concurrent loads of one name read it once
    ("b", "/lora/other", LoadStep.ANSWER, 409, "being loaded from /lora/b"),
    ("base", "/lora/c", LoadStep.ANSWER, 400, "the served model's name"),
])
def test_a_load_starts_joins_or_is_answered(name, source, step, status, words):
    decision = decide_load(name, source, SERVED, READING, reserved=("base",))
    assert (decision.step, decision.status) == (step, status)
    assert words in decision.message
    assert decision.param == (None if status == 200 else "lora_name")


@pytest.mark.parametrize(("name", "status", "words"), [
    ("a", 200, "Success: LoRA adapter 'a' removed"),
    ("b", 409, "still loading"),
    ("z", 404, "not loaded here"),
])
def test_an_unload(name, status, words):
    decision = decide_unload(name, SERVED, READING)
    assert decision.status == status and words in decision.message


@pytest.mark.parametrize(("sent", "real", "files", "problem"), [
    ("/lora/a", "/lora/a", ["/lora/a/adapter_config.json"], None),
    ("/lora/team/a", "/lora/team/a", [], None),  # any depth under an allowed directory
    ("/etc/a", "/etc/a", [], "is not under a directory this server loads adapters from (--lora-dir)"),
    ("/lora/link", "/etc/a", [], "/lora/link (really /etc/a) is not under"),  # a symlink out is refused
    ("/lora/../etc", "/etc", [], "is not under"),
    ("/lora", "/lora", [], "is not under"),  # the allowed directory itself holds adapters, is not one
    ("/lorax/a", "/lorax/a", [], "is not under"),  # a prefix of a name is not a parent
    ("lora/a", "lora/a", [], "is relative"),
    ("/lora/a", "/lora/a", ["/etc/passwd"], "a file of the adapter resolves to /etc/passwd"),
])
def test_a_load_reads_only_under_the_allowed_directories(sent, real, files, problem):
    found = path_problem(sent, real, files, ["/lora", "/srv/adapters"])
    assert found is None if problem is None else problem in found


def test_resolve_follows_symlinks_out_of_the_allowed_directory(tmp_path):
    allowed, outside = tmp_path / "allowed", tmp_path / "outside"
    (allowed / "a").mkdir(parents=True)
    (outside / "b").mkdir(parents=True)
    (allowed / "link").symlink_to(outside / "b")
    (outside / "b" / "adapter_model.safetensors").write_bytes(b"")
    (allowed / "a" / "adapter_model.safetensors").symlink_to(outside / "b" / "adapter_model.safetensors")
    assert resolve(str(allowed / "link"), [str(allowed)])[1] is not None
    assert "a file of the adapter resolves to" in resolve(str(allowed / "a"), [str(allowed)])[1]
    (allowed / "a" / "adapter_model.safetensors").unlink()
    assert resolve(str(allowed / "a"), [str(allowed)]) == (str(allowed / "a"), None)


def test_the_list_file_grammar_refuses_each_bad_line_apart():
    text = ("# adapters\n\n  support = /lora/support\nlegal=/lora/legal\nbroken\nx=tiny\ny=relative/path\n"
            "legal=/lora/legal2\nq=/lora/q quantization=int8\n")
    listed = parse_lora_list(text, "list")
    assert listed.entries == {"support": "/lora/support", "legal": "/lora/legal"}
    assert [p.split(":")[0] for p in listed.problems] == [f"list line {n}" for n in (5, 6, 7, 8, 9)]
    assert "listed twice" in listed.problems[3]


@pytest.mark.parametrize(("owned", "listed", "changes"), [
    ({}, {"a": "/a"}, ListChanges((), (("a", "/a"),))),
    ({"a": "/a"}, {}, ListChanges(("a",), ())),
    ({"a": "/a"}, {"a": "/a"}, ListChanges()),
    ({"a": "/a"}, {"a": "/a2"}, ListChanges(("a",), (("a", "/a2"),))),  # a new source: unload, then load
    ({"a": "/a", "b": "/b"}, {"b": "/b", "c": "/c"}, ListChanges(("a",), (("c", "/c"),))),
])
def test_the_list_s_changes(owned, listed, changes):
    assert plan_changes(owned, listed) == changes


def test_at_start_a_bad_line_or_a_name_given_twice_refuses_in_one_line(tmp_path):
    file = tmp_path / "loras"
    file.write_text("a=/lora/a\nnot a line\n")
    with pytest.raises(ValueError, match=rf"^--lora-list-file {file} line 2: "):
        read_at_start(str(file), ())
    file.write_text("a=/lora/a\n")
    with pytest.raises(ValueError, match="lists the adapter 'a', which --lora already serves"):
        read_at_start(str(file), ("a",))
    with pytest.raises(ValueError, match="cannot be read"):
        read_at_start(str(tmp_path / "missing"), ())
    assert read_at_start(str(file), ())[1] == {"a": "/lora/a"}


def test_the_adapter_label_is_bounded():
    label = AdapterLabels(limit=2)
    assert [label(n) for n in ("a", "b", "c", "a", "d", "b")] == ["a", "b", OTHER_ADAPTERS, "a", OTHER_ADAPTERS, "b"]
