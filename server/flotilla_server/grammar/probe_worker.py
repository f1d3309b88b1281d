"""The compile probe: a process that builds a grammar's matcher and its first mask, and says how that went.

llguidance's matchers cannot be pickled, so a process can only prove that a grammar compiles within the time
limit; the engine then builds it again (1-2 ms for the schemas of real APIs). A probe past the limit is
killed, which is what frees its core (compile_gate.py). It runs at a lower CPU priority than the server: a
compile competes with the engine's steps for cores, and should lose. Ends when its stdin closes.

Frames both ways: a 4-byte big-endian length, then that many bytes of JSON. The first frame in is a
GrammarTokenizer's fields; each later one is {"grammar": text}, answered {"error": message or null}.
"""

from __future__ import annotations

import json
import os
import struct
import sys
from typing import Any, BinaryIO

from flotilla_server.grammar.tokenizer_info import GrammarTokenizer, new_matcher

NICENESS = 10
WARM_UP = '{"grammars":[{"json_schema":{"type":"object"}}]}'


def read_frame(stream: BinaryIO) -> Any | None:
    head = stream.read(4)
    if len(head) < 4:
        return None
    (size,) = struct.unpack(">I", head)
    return json.loads(stream.read(size))


def frame(payload: Any) -> bytes:
    body = json.dumps(payload).encode()
    return struct.pack(">I", len(body)) + body


def probe(tokenizer: Any, grammar: str) -> str | None:
    """None if `grammar` compiles and yields its first mask, else llguidance's message."""
    matcher = new_matcher(tokenizer, grammar)
    if not matcher.is_error():
        matcher.compute_bitmask()  # llguidance builds lexer states lazily: the first mask is part of the cost
    return matcher.get_error() if matcher.is_error() else None


def main() -> int:
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    setup = read_frame(stdin)
    if setup is None:
        return 0
    setup["eos_token_ids"] = tuple(setup["eos_token_ids"])
    tokenizer = GrammarTokenizer(**setup).build()
    probe(tokenizer, WARM_UP)  # first-use costs (the token trie's walk) are paid at start, not against the limit
    os.nice(NICENESS)  # after the start, which a request waits for at full priority
    stdout.write(frame({"ready": True}))
    stdout.flush()
    while (request := read_frame(stdin)) is not None:
        stdout.write(frame({"error": probe(tokenizer, request["grammar"])}))
        stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
