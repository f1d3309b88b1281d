"""API keys: the keys file, 401 for a missing or wrong key, 403 for a model outside the tenant's list."""

from __future__ import annotations

from pathlib import Path

import pytest
from flotilla_gateway.errors import GatewayError
from flotilla_gateway.keys import Tenant, authenticate, authorize, load_keys


def test_load_keys(tmp_path: Path) -> None:
    path = tmp_path / "keys.yaml"
    path.write_text("sk-a: {tenant: team-a, models: [tiny]}\nsk-b: {tenant: ops}\n")
    assert load_keys(path) == {"sk-a": Tenant("team-a", frozenset({"tiny"})), "sk-b": Tenant("ops", None)}
    path.write_text('{"sk-a": {"tenant": "team-a"}}')  # JSON is YAML
    assert load_keys(path) == {"sk-a": Tenant("team-a", None)}


@pytest.mark.parametrize(("text", "problem"), [
    ("", "must map each key"),
    ("sk-a: {models: [tiny]}", "needs a `tenant`"),
    ("sk-a: {tenant: t, models: tiny}", "must be a list"),
    ("sk-a: [", "cannot read"),
])
def test_bad_keys_files_say_what_to_fix(tmp_path: Path, text: str, problem: str) -> None:
    path = tmp_path / "keys.yaml"
    path.write_text(text)
    with pytest.raises(ValueError, match=problem):
        load_keys(path)


KEYS = {"sk-a": Tenant("team-a", frozenset({"tiny"})), "sk-b": Tenant("ops", None)}


@pytest.mark.parametrize("header", [None, "", "Bearer ", "Basic sk-a", "Bearer sk-c", "sk-a"])
def test_401(header: str | None) -> None:
    with pytest.raises(GatewayError) as caught:
        authenticate(KEYS, header)
    assert caught.value.status == 401 and caught.value.code == "invalid_api_key"


def test_authorize() -> None:
    assert authenticate(KEYS, "Bearer sk-a") == KEYS["sk-a"]
    authorize(KEYS["sk-a"], "tiny")
    authorize(KEYS["sk-b"], "anything")
    with pytest.raises(GatewayError) as caught:
        authorize(KEYS["sk-a"], "llama")
    assert caught.value.status == 403 and "tiny" in caught.value.message


def test_a_key_may_name_the_class_of_its_requests(tmp_path):
    path = tmp_path / "keys.yaml"
    path.write_text("sk-e: {tenant: evals, class: batch}\n")
    assert load_keys(path) == {"sk-e": Tenant("evals", None, "batch")}
    path.write_text("sk-e: {tenant: evals, class: bulk}\n")
    with pytest.raises(ValueError, match="`class` of tenant 'evals' must be one of interactive, batch"):
        load_keys(path)
