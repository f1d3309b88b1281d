"""The model list as a multi-model server follows it (model_cache/membership.py): what refuses the start,
what a reload keeps, what is counted and shown, and when a skipped entry is tried again."""

from __future__ import annotations

import os
import re

import pytest
from flotilla_server.model_cache.membership import LIST_POLL_S, SKIPPED_RETRY_S, Membership, Skipped
from flotilla_server.model_cache.specs import ModelSpec

A, B = ModelSpec("a", "tiny"), ModelSpec("b", "/m/b")


def write(path, text: str) -> None:
    """A new version of the file: its size or modification time changes, as the kubelet's swap does."""
    path.write_text(text)
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))


def test_a_list_file_that_cannot_be_read_or_parsed_refuses_the_start(tmp_path):
    with pytest.raises(ValueError, match=r"--model-list-file .*missing cannot be read .*No such file"):
        Membership((), str(tmp_path / "missing"))
    (tmp_path / "models").write_text("a=tiny\nb=models/b\n")
    with pytest.raises(ValueError, match="line 2: source 'models/b' is neither 'tiny' nor an absolute path"):
        Membership((), str(tmp_path / "models"))


LISTED_B = "--model-list-file's model b (/m/b): unreadable"
NONE_LEFT = "no model can be served: --model-list-file's model a (tiny): unreadable; " + LISTED_B


@pytest.mark.parametrize(("skip", "flags", "listed", "skipped", "refused"), [
    (False, (A,), "", ["a"], "no model can be served: model a (tiny): unreadable"),
    (False, (A,), "b=/m/b\n", ["b"], LISTED_B),  # by default every source must read
    (False, (), "a=tiny\nb=/m/b\n", ["b"], LISTED_B),
    (False, (), "a=tiny\nb=/m/b\n", ["a", "b"], NONE_LEFT),
    (False, (), "", [], None),  # an empty list (a pool without members): nothing to serve, on purpose
    (True, (A,), "", ["a"], "model a (tiny): unreadable"),  # a flag's source: always refused at start
    (True, (A,), "b=/m/b\n", ["b"], None),  # a pool's pod: one listed entry of two skipped, the flag serves
    (True, (), "a=tiny\nb=/m/b\n", ["b"], None),  # one of two listed: skipped, the other serves
    (True, (), "a=tiny\nb=/m/b\n", ["a", "b"], NONE_LEFT),  # never serving nothing
    (True, (), "", [], None),
])
def test_at_start_every_source_must_read_unless_listed_entries_may_be_skipped(tmp_path, skip, flags, listed,
                                                                              skipped, refused):
    (tmp_path / "models").write_text(listed)
    members = Membership(flags, str(tmp_path / "models"), skip_unreadable_at_start=skip)
    by_name = {s.name: s for s in members.specs}
    bad = [Skipped(name, by_name[name].source, "unreadable") for name in skipped]
    if refused is None:
        members.check_start(bad)
        assert [s.name for s in members.status().skipped] == skipped
    else:
        with pytest.raises(ValueError, match=re.escape(refused)):
            members.check_start(bad)


def test_a_bad_reload_keeps_the_list_before_and_is_counted_once_per_version(tmp_path):
    listing = tmp_path / "models"
    listing.write_text("a=tiny\n")
    members = Membership((), str(listing))
    assert members.specs == (A,) and members.poll(0.0) is None  # read at start; unchanged since
    write(listing, "a=tiny\nb=/m/b dtype=bfloat16\n")
    assert members.poll(LIST_POLL_S) is None and members.specs == (A,)  # refused whole: a stays, b never joins
    assert members.poll(2 * LIST_POLL_S) is None  # the same version: not counted again
    status = members.status()
    assert status.reload_failures == 1 and "line 2: 'dtype=bfloat16' follows source '/m/b'" in status.last_error
    listing.unlink()
    assert members.poll(3 * LIST_POLL_S) is None and members.poll(4 * LIST_POLL_S) is None
    assert members.status().reload_failures == 2 and "No such file" in members.status().last_error
    write(listing, "a=tiny\nb=/m/b\n")
    assert members.poll(5 * LIST_POLL_S) == (A, B)
    assert members.status().last_error is None and members.status().reload_failures == 2


def test_the_file_is_checked_once_a_poll_interval(tmp_path):
    listing = tmp_path / "models"
    listing.write_text("a=tiny\n")
    members = Membership((), str(listing))
    assert members.poll(100.0) is None
    write(listing, "b=/m/b\n")
    assert members.poll(100.0 + LIST_POLL_S / 2) is None  # too soon
    assert members.poll(100.0 + LIST_POLL_S) == (B,)


def test_skipped_entries_are_tried_again_without_a_change_of_the_file(tmp_path):
    listing = tmp_path / "models"
    listing.write_text("a=tiny\nb=/m/b\n")
    members = Membership((), str(listing), skip_unreadable_at_start=True)
    members.check_start([Skipped("b", "/m/b", "not found")])
    assert members.poll(0.0) == (A, B)  # due at once after start
    assert members.poll(LIST_POLL_S) is None  # then once every SKIPPED_RETRY_S
    assert members.poll(SKIPPED_RETRY_S) == (A, B)
    members.record_skipped([])
    assert members.poll(3 * SKIPPED_RETRY_S) is None and members.status().skipped == ()


def test_without_a_list_file_there_is_nothing_to_follow():
    members = Membership((A,), None)
    members.check_start([])
    assert members.poll(0.0, force=True) is None and members.status() is None
