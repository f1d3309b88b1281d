"""What a user sees when the server starts: the demonstration model announced once, and no traceback."""

from __future__ import annotations


def test_the_demonstration_warning_is_printed_once(server):
    log = server.log()
    assert log.count("a DEMONSTRATION model") == 1, log[:2000]
    assert "Traceback" not in log


def test_the_docs_page_loads_nothing_from_another_host(server):
    import re

    import httpx

    page = httpx.get(f"{server.base_url}/docs", timeout=30)
    assert page.status_code == 200 and "text/html" in page.headers["content-type"]
    assert re.findall(r"""(?:src|href)=["']?(?:https?:)?//""", page.text) == []  # no CDN script or style
    assert 'fetch("/openapi.json")' in page.text
    assert httpx.get(f"{server.base_url}/openapi.json", timeout=30).json()["paths"]["/v1/completions"]
