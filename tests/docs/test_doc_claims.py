"""Claims the docs once made that were not true, each now checked against what it describes."""

from __future__ import annotations

import re

import yaml

from tests.docs.doc_blocks import ROOT, doc_files


def test_no_doc_sends_users_to_a_cli_huggingface_hub_no_longer_ships():
    stale = [str(p.relative_to(ROOT)) for p in doc_files() if "huggingface-cli" in p.read_text()]
    assert stale == [], f"`huggingface-cli` is gone from huggingface_hub; write `hf download`: {stale}"


def test_the_readme_says_alerts_are_opt_in_when_the_chart_leaves_them_off():
    values = yaml.safe_load((ROOT / "charts" / "flotilla" / "values.yaml").read_text())
    readme = (ROOT / "README.md").read_text()
    if not values["prometheusRule"]["enabled"]:
        assert "prometheusRule.enabled" in readme
        assert not re.search(r"installs[^.]*\balerts\b[^.]*with\s+`helm install`", readme)


def test_the_readme_cuda_command_says_to_install_a_cuda_torch_first():
    readme = (ROOT / "README.md").read_text()
    before = readme.split("FLOTILLA_TEST_DEVICE=cuda", 1)[0][-400:]
    assert "CUDA build" in before, "the CPU torch `make` installs cannot run the CUDA tests: say what to install"
    assert "### GPU" in (ROOT / "docs" / "serving.md").read_text()


def test_architecture_names_as_pruned_exactly_the_kinds_the_operator_prunes():
    from flotilla_operator.reconciler import PRUNABLE_KINDS

    text = " ".join((ROOT / "docs" / "architecture.md").read_text().split())
    (sentence,) = re.findall(r"deletes an? ([\w/ ]+?) only when the spec stops asking for it", text)
    named = set(re.split(r"\s*(?:/|,| and | or )\s*", sentence))
    assert named == {kind for _, kind in PRUNABLE_KINDS}, sentence


def test_serving_md_says_stream_options_needs_stream():
    assert "`stream_options.include_usage` (only with `stream: true`; without it, 400)" in (
        ROOT / "docs" / "serving.md").read_text()
