"""A fake model server for gateway tests and the overhead benchmark: OpenAI-shaped SSE as fast as it is read.

It speaks just enough of flotilla-server's surface for routing: POST /v1/completions and
/v1/chat/completions (streamed or not; `max_tokens` chunks, each carrying the monotonic time it was sent,
paced by `chunk_interval_s` when set, from the request's arrival), GET /flotilla/v1/load (a ServerLoad), GET /readyz, and for tests
GET /fake/stats and POST /fake/config (answer given statuses first, hold the first byte, set load figures).
Run it alone with `python -m flotilla_gateway.bench.fake_upstream --port 9000`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from flotilla_contract.load import LOAD_PATH, ServerLoad


@dataclass
class FakeState:
    name: str = "fake"
    statuses: list[int] = field(default_factory=list)  # answered (then dropped) before any real response
    drop_before_body: int = 0  # requests whose connection is cut after the headers, before any body byte
    cut_after_chunks: int | None = None  # streams cut after this many chunks (a pod killed mid-answer)
    first_byte_delay_s: float = 0.0
    chunk_interval_s: float = 0.0
    load: dict[str, Any] = field(default_factory=lambda: {"waiting": 0, "slots": 64, "queue_capacity": 512,
                                                         "kv_usage": 0.0})
    load_enabled: bool = True
    requests: int = 0
    running: int = 0
    max_running: int = 0  # the most requests it ever served at once
    disconnects: int = 0
    completed: int = 0
    last_headers: dict[str, str] = field(default_factory=dict)
    last_body: dict[str, Any] = field(default_factory=dict)


STATE = web.AppKey("state", FakeState)


def _chunk(name: str, index: int, chat: bool) -> bytes:
    now_ns = time.monotonic_ns()
    if chat:
        payload = {"id": "c", "object": "chat.completion.chunk", "model": name, "t_ns": now_ns,
                   "choices": [{"index": 0, "delta": {"content": f"t{index} "}, "finish_reason": None}]}
    else:
        payload = {"id": "c", "object": "text_completion", "model": name, "t_ns": now_ns,
                   "choices": [{"index": 0, "text": f"t{index} ", "finish_reason": None}]}
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


async def generate(request: web.Request) -> web.StreamResponse:
    state: FakeState = request.app[STATE]
    body = await request.json()
    state.requests += 1
    state.last_headers, state.last_body = dict(request.headers), body
    if state.statuses:
        status = state.statuses.pop(0)
        return web.json_response({"error": {"message": f"fake {status}", "type": "x", "param": None, "code": None}},
                                 status=status)
    chat = request.path.endswith("chat/completions")
    count = int(body.get("max_tokens") or 16)
    state.running += 1
    state.max_running = max(state.max_running, state.running)
    try:
        if state.first_byte_delay_s:
            await asyncio.sleep(state.first_byte_delay_s)
        if not body.get("stream"):
            text = "".join(f"t{i} " for i in range(count))
            choice = {"index": 0, "message": {"role": "assistant", "content": text}} if chat else {"index": 0, "text": text}
            state.completed += 1
            return web.json_response({"id": "c", "object": "chat.completion" if chat else "text_completion",
                                      "model": state.name, "choices": [{**choice, "finish_reason": "length"}],
                                      "served_by": state.name})
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
                                               "X-Served-By": state.name})
        await response.prepare(request)
        if state.drop_before_body > 0:
            state.drop_before_body -= 1
            return _cut(request, response)
        started_s = time.monotonic()
        for i in range(count):
            if state.cut_after_chunks is not None and i == state.cut_after_chunks:
                return _cut(request, response)
            await response.write(_chunk(state.name, i, chat))
            if state.chunk_interval_s:  # on the answer's own schedule: a late chunk does not delay the next
                await asyncio.sleep(max(0.0, started_s + (i + 1) * state.chunk_interval_s - time.monotonic()))
            else:  # one chunk per stream per turn of the loop, as an engine step sends them
                await asyncio.sleep(0)
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        state.completed += 1
        return response
    except (asyncio.CancelledError, ConnectionResetError):
        state.disconnects += 1
        raise
    finally:
        state.running -= 1


def _cut(request: web.Request, response: web.StreamResponse) -> web.StreamResponse:
    """End the connection mid-answer, as a killed pod does (its socket reset)."""
    if request.transport is not None:
        request.transport.abort()
    return response


async def load(request: web.Request) -> web.Response:
    state: FakeState = request.app[STATE]
    if not state.load_enabled:
        return web.json_response({"error": "no load endpoint"}, status=404)
    report = ServerLoad(ready=True, running=state.running, **state.load)
    return web.Response(body=report.model_dump_json(), content_type="application/json")


async def readyz(_: web.Request) -> web.Response:
    return web.json_response({"status": "ready"})


async def stats(request: web.Request) -> web.Response:
    state: FakeState = request.app[STATE]
    return web.json_response({k: v for k, v in state.__dict__.items()})


async def configure(request: web.Request) -> web.Response:
    state: FakeState = request.app[STATE]
    for key, value in (await request.json()).items():
        setattr(state, key, value)
    return web.json_response({"ok": True})


def make_app(state: FakeState | None = None) -> web.Application:
    app = web.Application(handler_args={"tcp_keepalive": True})
    app[STATE] = state or FakeState()
    app.router.add_post("/v1/completions", generate)
    app.router.add_post("/v1/chat/completions", generate)
    app.router.add_get(LOAD_PATH, load)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/fake/stats", stats)
    app.router.add_post("/fake/config", configure)
    return app


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=9000)
    p.add_argument("--name", default="fake")
    p.add_argument("--chunk-interval-s", type=float, default=0.0)
    args = p.parse_args()
    web.run_app(make_app(FakeState(name=args.name, chunk_interval_s=args.chunk_interval_s)), host=args.host,
                port=args.port, print=None, access_log=None)


if __name__ == "__main__":
    main()
