"""API keys: the keys file's strict schema (a typo never widens access), 401 for a missing or wrong key, 403
for a model outside the tenant's list."""

from __future__ import annotations

from pathlib import Path

import flotilla_gateway.keys
import pytest
from flotilla_gateway.errors import GatewayError
from flotilla_gateway.keys import Tenant, authenticate, authorize, load_keys, parse_keys

ROOT = Path(__file__).resolve().parents[2]
EVERY = frozenset({"*"})


def test_load_keys(tmp_path: Path) -> None:
    path = tmp_path / "keys.yaml"
    path.write_text('sk-a: {tenant: team-a, models: [tiny]}\nsk-b: {tenant: ops, models: ["*"]}\n'
                    "sk-c: {tenant: evals, models: [], class: batch}\n")
    assert load_keys(path) == {"sk-a": Tenant("team-a", frozenset({"tiny"})), "sk-b": Tenant("ops", EVERY),
                               "sk-c": Tenant("evals", frozenset(), "batch")}
    path.write_text('{"sk-a": {"tenant": "team-a", "models": ["*"]}}')  # JSON is YAML
    assert load_keys(path) == {"sk-a": Tenant("team-a", EVERY)}


def test_the_documented_keys_files_load() -> None:
    section = (ROOT / "docs/gateway.md").read_text().split("## API keys", 1)[1]
    documented = section.split("```yaml\n", 1)[1].split("```", 1)[0]
    docstring = (flotilla_gateway.keys.__doc__ or "").split("YAML or JSON:\n\n", 1)[1].split("\n\n", 1)[0]
    for text in (documented, docstring):
        keys = parse_keys(text.encode(), "the docs")
        assert keys["sk-ops-456"] == Tenant("ops", EVERY)
        assert keys["sk-evals-789"] == Tenant("evals", frozenset({"tiny"}), "batch")


# Each refused file, and a part of the one line that says what to change.
REFUSED = {
    "the `model` typo": ("sk-x: {tenant: t, model: [tiny]}", "unknown field `model` (did you mean `models`?)"),
    "an unknown field": ("sk-x: {tenant: t, models: [tiny], colour: red}", "unknown field `colour`; the fields"),
    "an empty entry": ("sk-x:\n", "key sk-x… has an empty entry"),
    "an empty mapping": ("sk-x: {}\n", "key sk-x… has an empty entry"),
    "no models": ("sk-x: {tenant: t}", 'has no `models`: list the models it may use, or write models: ["*"]'),
    "* with names": ('sk-x: {tenant: t, models: ["*", tiny]}', 'mixes "*" with names'),
    "a pattern": ('sk-x: {tenant: t, models: ["llama-*"]}', "names are not patterns"),
    "* as text": ('sk-x: {tenant: t, models: "*"}', "`models` must be a list of model names"),
    "a model name that is a number": ("sk-x: {tenant: t, models: [7]}", "`models` must be a list"),
    "a null models": ("sk-x: {tenant: t, models: }", "`models` must be a list"),
    "no tenant": ("sk-x: {models: [tiny]}", "`tenant` must be a name (text), got None"),
    "a tenant that is a number": ("sk-x: {tenant: 5, models: [tiny]}", "`tenant` must be a name (text), got 5"),
    "an entry that is text": ("sk-x: team-a", "the entry must be {tenant: NAME"),
    "a key that is a number": ("12345: {tenant: t, models: [tiny]}", "a key is not text (YAML reads it as int)"),
    "a key with a space": ("'sk x': {tenant: t, models: [tiny]}", "is empty or holds a space"),
    "a key written twice": ('sk-x: {tenant: a, models: [tiny]}\nsk-x: {tenant: b, models: ["*"]}',
                            "the key sk-x… is written twice (line 2)"),
    "a field written twice": ("sk-x: {tenant: a, models: [tiny], models: [big]}", "the field `models` is written"),
    "a null class": ("sk-x: {tenant: t, models: [tiny], class: }", "`class` must be one of interactive, batch"),
    "an unknown class": ("sk-x: {tenant: t, models: [tiny], class: bulk}", "got 'bulk'"),
    "an empty file": ("", "is empty: map each API key"),
    "a list": ("- sk-x", "must map each API key to"),
    "broken YAML": ("sk-secret-key-x: [", "is not valid YAML: while parsing a flow node"),
}


@pytest.mark.parametrize(("text", "problem"), REFUSED.values(), ids=REFUSED.keys())
def test_a_keys_file_off_the_schema_is_refused_in_one_line(text: str, problem: str) -> None:
    with pytest.raises(ValueError) as caught:
        parse_keys(text.encode(), "keys.yaml")
    message = str(caught.value)
    assert problem in message and message.startswith("the keys file keys.yaml")
    assert "\n" not in message
    assert "secret" not in message  # a key is named by its first four characters only, even in YAML's errors


def test_a_file_that_is_not_there_or_not_text(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"cannot read the keys file .*: check --api-keys-file"):
        load_keys(tmp_path / "missing.yaml")
    (tmp_path / "keys.yaml").write_bytes(b"\xff\xfe")
    with pytest.raises(ValueError, match="is not UTF-8 text"):
        load_keys(tmp_path / "keys.yaml")


KEYS = {"sk-a": Tenant("team-a", frozenset({"tiny"})), "sk-b": Tenant("ops", EVERY),
        "sk-c": Tenant("parked", frozenset())}


@pytest.mark.parametrize("header", [None, "", "Bearer ", "Basic sk-a", "Bearer sk-d", "sk-a"])
def test_401(header: str | None) -> None:
    with pytest.raises(GatewayError) as caught:
        authenticate(KEYS, header)
    assert caught.value.status == 401 and caught.value.code == "invalid_api_key"


@pytest.mark.parametrize(("key", "model", "allowed"), [
    ("sk-a", "tiny", True), ("sk-a", "llama", False), ("sk-a", "*", False),
    ("sk-b", "anything", True), ("sk-c", "tiny", False),
])
def test_authorize(key: str, model: str, allowed: bool) -> None:
    tenant = authenticate(KEYS, f"Bearer {key}")
    assert tenant == KEYS[key]
    if allowed:
        authorize(tenant, model)
        return
    with pytest.raises(GatewayError) as caught:
        authorize(tenant, model)
    assert caught.value.status == 403 and caught.value.code == "model_not_allowed"
    assert ("allows tiny" if key == "sk-a" else "allows none") in caught.value.message
