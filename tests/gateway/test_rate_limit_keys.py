"""Rate limits in the keys file: `requestsPerMinute` and `tokensPerMinute` beside a key's models. A malformed
limit refuses the file in one line naming the key and the field: at start (exit 2, no traceback) and on a
reload (the last good keys, and their limits, stay in force)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from flotilla_gateway.cli import main
from flotilla_gateway.keys import Tenant, parse_keys
from flotilla_gateway.keys_file import KeysFile, Reload
from flotilla_gateway.rate_limit import NO_LIMIT, RateLimit

ROOT = Path(__file__).resolve().parents[2]
TINY = frozenset({"tiny"})


def test_limits_sit_beside_the_models() -> None:
    keys = parse_keys(b"sk-a: {tenant: a, models: [tiny], requestsPerMinute: 60, tokensPerMinute: 20000}\n"
                      b"sk-b: {tenant: b, models: [tiny], tokensPerMinute: 5000}\n"
                      b"sk-c: {tenant: c, models: [tiny]}\n", "keys.yaml")
    assert keys["sk-a"] == Tenant("a", TINY, None, RateLimit(60, 20000))
    assert keys["sk-b"].limits == RateLimit(tokens_per_min=5000)
    assert keys["sk-c"].limits == NO_LIMIT  # existing files stay valid, and unlimited
    assert keys["sk-a"].key == "sk-a" and "sk-a" not in repr(keys["sk-a"])  # the buckets' name, never shown


def test_the_documented_limits_load() -> None:
    section = (ROOT / "docs/gateway.md").read_text().split("## Rate limits", 1)[1]
    documented = section.split("```yaml\n", 1)[1].split("```", 1)[0]
    keys = parse_keys(documented.encode(), "the docs")
    assert keys["sk-team-a-123"].limits == RateLimit(600, 200000)


BAD_LIMITS = {
    "negative": ("requestsPerMinute: -5", "`requestsPerMinute` must be a whole number above 0", "got -5"),
    "zero": ("tokensPerMinute: 0", "`tokensPerMinute` must be a whole number above 0", "got 0"),
    "text": ("tokensPerMinute: lots", "`tokensPerMinute` must be", "got 'lots'"),
    "a quoted number": ("requestsPerMinute: '60'", "`requestsPerMinute` must be", "got '60'"),
    "a fraction": ("requestsPerMinute: 1.5", "`requestsPerMinute` must be", "got 1.5"),
    "empty": ("requestsPerMinute: ", "`requestsPerMinute` must be", "got None"),
    "a boolean": ("tokensPerMinute: true", "`tokensPerMinute` must be", "got True"),
    "a typo": ("requestPerMinute: 5", "unknown field `requestPerMinute` (did you mean `requestsPerMinute`?)", ""),
}


@pytest.mark.parametrize(("field", "problem", "got"), BAD_LIMITS.values(), ids=BAD_LIMITS.keys())
def test_a_malformed_limit_is_refused_in_one_line(field: str, problem: str, got: str) -> None:
    with pytest.raises(ValueError) as caught:
        parse_keys(f"sk-secret: {{tenant: t, models: [tiny], {field}}}".encode(), "keys.yaml")
    message = str(caught.value)
    assert message.startswith("the keys file keys.yaml: key sk-s…") and problem in message and got in message
    assert "\n" not in message and "secret" not in message


def test_a_malformed_limit_stops_the_start_with_one_line_and_exit_2(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    keys = tmp_path / "keys.yaml"
    keys.write_text("sk-a: {tenant: t, models: [tiny], tokensPerMinute: -1}\n")
    with pytest.raises(SystemExit) as caught:
        main(["--api-keys-file", str(keys)])
    err = capsys.readouterr().err
    assert caught.value.code == 2 and err.count("\n") == 1
    assert err.startswith(f"flotilla-gateway: the keys file {keys}: key sk-a… (tenant 't'): `tokensPerMinute`")
    # the real process: the same line, and no traceback
    result = subprocess.run([sys.executable, "-m", "flotilla_gateway.cli", "--api-keys-file", str(keys)],
                            capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert result.returncode == 2 and result.stdout == "" and result.stderr == err


def test_a_reload_with_a_malformed_limit_keeps_the_last_good_keys(tmp_path: Path) -> None:
    path = tmp_path / "keys.yaml"
    path.write_text("sk-a: {tenant: a, models: [tiny], requestsPerMinute: 60}\n")
    keys = KeysFile(path)
    good = dict(keys.keys)
    staged = tmp_path / "staged"
    staged.write_text("sk-a: {tenant: a, models: [tiny], requestsPerMinute: 0}\nsk-b: {tenant: b, models: [tiny]}\n")
    os.replace(staged, path)
    assert keys.reload() is Reload.REFUSED and keys.keys == good
    assert keys.keys["sk-a"].limits == RateLimit(requests_per_min=60)
    assert "`requestsPerMinute` must be a whole number above 0" in (keys.refusal or "")
