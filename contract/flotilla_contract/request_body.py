"""What a request body must be, in one wording for flotilla-server and flotilla-gateway.

Both refuse a bad body before anything else reads it: 413 over the size limit, 400 when it is not a UTF-8
JSON object. A client then sees one API whichever of the two refused it, so the messages live here once.
"""

from __future__ import annotations

import json


def too_large_message(max_body_bytes: int) -> str:
    return (f"Request body is larger than {max_body_bytes} bytes: shorten the prompt or messages "
            "(the server's --max-body-bytes sets the limit).")


def body_problem(raw: bytes) -> str | None:
    """Why `raw` is not a JSON object, saying what to send instead; None when it is one."""
    if not raw:
        return "Request body is empty: send a JSON object, e.g. {\"model\": ..., \"prompt\": ...}."
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        return f"Request body is not valid UTF-8 (byte {e.start}): encode the JSON body as UTF-8."
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        return f"Request body is not valid JSON ({e.msg} at line {e.lineno} column {e.colno}): send a JSON object."
    if not isinstance(value, dict):
        return f"Request body must be a JSON object, not a {type(value).__name__}: wrap the fields in {{...}}."
    return None
