"""What a user sees when the server starts: the demonstration model announced once, and no traceback."""

from __future__ import annotations


def test_the_demonstration_warning_is_printed_once(server):
    log = server.log()
    assert log.count("a DEMONSTRATION model") == 1, log[:2000]
    assert "Traceback" not in log
