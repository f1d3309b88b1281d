"""Every shell block of the docs either runs here, as written, or says why it cannot (tests/docs/doc_blocks.py).

An unmarked block runs with bash (-e, -o pipefail) in a scratch directory that links the repository's top-level
entries, with this tree's code first on the path, so a command that works only on the author's machine,
or names a file that moved, fails here.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
from pathlib import Path

import pytest

from tests.docs.doc_blocks import ROOT, Block, shell_blocks
from tests.support.ports import free_port

BLOCKS = shell_blocks()
RUN_BY = re.compile(r"^run by (tests/\S+\.py)$")
# what a block may say instead of running; a block that needs a cluster or docker must say so in these words
REASONS = ("needs a cluster", "needs docker", "not run here: ")
CLUSTER_COMMAND = re.compile(r"\bkubectl\b|\bhelm (install|upgrade|uninstall)\b")
FIXED_PORT = "8435"  # the port the docs' local examples use; a run here takes a free one instead
BLOCK_TIMEOUT_S = 120


def runnable() -> list[Block]:
    return [b for b in BLOCKS if b.marker is None]


def test_the_docs_have_shell_blocks_and_some_run_here():
    assert len(BLOCKS) >= 10 and len(runnable()) >= 1, [b.where for b in BLOCKS]


@pytest.mark.parametrize("block", [b for b in BLOCKS if b.marker is not None], ids=lambda b: b.where)
def test_a_block_not_run_here_says_why(block: Block):
    run_by = RUN_BY.match(block.marker)
    if run_by:
        test_file = ROOT / run_by.group(1)
        assert test_file.is_file(), f"{block.where}: {run_by.group(1)} does not exist"
        assert block.doc.name in test_file.read_text(), f"{block.where}: {run_by.group(1)} never reads {block.doc.name}"
        return
    assert block.marker.startswith(REASONS) and block.marker.rstrip(": "), (
        f"{block.where}: say 'docs-test: needs a cluster', 'needs docker', 'not run here: WHY' or 'run by tests/…'")
    text = "\n".join(block.commands())
    if CLUSTER_COMMAND.search(text) and not re.search(r"--dry-run=client", text):
        assert block.marker == "needs a cluster" or block.marker.startswith(("run by", "not run here")), block.where
    if "docker build" in text:
        assert block.marker == "needs docker", block.where


def sandbox(tmp_path: Path) -> Path:
    """A directory that looks like the repository's root but where written files land in tmp_path."""
    for entry in ROOT.iterdir():
        if entry.name not in (".git",):
            (tmp_path / entry.name).symlink_to(entry)
    return tmp_path


@pytest.mark.parametrize("block", runnable(), ids=lambda b: b.where)
def test_an_unmarked_block_runs_as_written(block: Block, tmp_path: Path):
    script = "\n".join(block.commands()).replace(FIXED_PORT, str(free_port()))
    assert not CLUSTER_COMMAND.search(script), f"{block.where} needs a cluster: mark it 'docs-test: needs a cluster'"
    code_path = os.pathsep.join(str(ROOT / p) for p in ("contract", "server", "operator", "gateway", "."))
    env = {"PATH": f"{ROOT / '.venv' / 'bin'}:{ROOT / '.tools' / 'bin'}:/usr/local/bin:/usr/bin:/bin",
           "HOME": str(tmp_path), "PYTHONPATH": code_path, "LANG": "C.UTF-8"}
    process = subprocess.Popen(["bash", "-eo", "pipefail", "-c", script], cwd=sandbox(tmp_path), env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        output, _ = process.communicate(timeout=BLOCK_TIMEOUT_S)
    finally:
        with _ignore_gone():
            os.killpg(process.pid, signal.SIGKILL)  # what the block left in the background goes with it
    assert process.returncode == 0, f"{block.where} failed (exit {process.returncode}):\n{script}\n---\n{output[-3000:]}"


class _ignore_gone:
    def __enter__(self) -> None:
        return None

    def __exit__(self, kind, value, tb) -> bool:
        return kind is ProcessLookupError
