"""The fastest a burst's refusals can go here: an HTTP server that answers every request with a prepared 429
as soon as its headers are parsed (uvicorn's httptools protocol on uvloop, as `flotilla-server`'s door),
in one process or several sharing the port (SO_REUSEPORT), timed by `flotilla-bench modes`' kernel-clocked
burst client: 200 requests at once, the 95th-percentile answer.

Why: it separates what one HTTP process can do from what the server adds. The server's door refuses in
the same protocol callback; what this floor leaves to it is the rest of the event loop's work.

    .venv/bin/python scripts/refusal_floor.py            # 1 process, then 2, interleaved, 12 bursts each
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import socket
import statistics
import time

from flotilla_server.bench.kernel_clock import burst, post
from flotilla_server.http.bounded_protocol import EVENT_LOOP, BoundedHttpProtocol

BODY = b'{"error": {"code": "queue_full"}}'
REFUSAL = (b"HTTP/1.1 429 Too Many Requests\r\ncontent-type: application/json\r\nretry-after: 5\r\n"
           b"connection: close\r\ncontent-length: %d\r\n\r\n%s" % (len(BODY), BODY))


def serve(port: int) -> None:
    import uvicorn
    from flotilla_server.http.door_protocol import _ANSWERED

    class RefuseAll(BoundedHttpProtocol):
        def on_headers_complete(self) -> None:
            self.transport.write(REFUSAL)
            self.transport.close()
            self.cycle = _ANSWERED

    async def app(scope: dict, receive: object, send: object) -> None:  # never reached
        raise AssertionError("every request is refused in the protocol")

    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    listener.bind(("127.0.0.1", port))
    config = uvicorn.Config(app, http=RefuseAll, loop=EVENT_LOOP, log_level="warning", lifespan="off")
    uvicorn.Server(config).run(sockets=[listener])


def p95_ms(port: int, bursts: int, requests: int) -> list[float]:
    request = post("/v1/completions", {"model": "tiny", "prompt": "a crowd", "max_tokens": 64, "stream": True})
    out = []
    for _ in range(bursts):
        latencies = sorted(a.latency_s for a in burst(port, request, requests))
        out.append(latencies[int(0.95 * len(latencies)) - 1] * 1000)
        time.sleep(0.3)
    return out


def run(processes: int, bursts: int, requests: int) -> list[float]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    servers = [mp.get_context("spawn").Process(target=serve, args=(port,), daemon=True) for _ in range(processes)]
    for server in servers:
        server.start()
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        time.sleep(1.0)  # every process listening
        return p95_ms(port, bursts, requests)
    finally:
        for server in servers:
            server.terminate()
            server.join(5)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bursts", type=int, default=12)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=2, help="1 process then 2, this many times")
    args = parser.parse_args()
    for _ in range(args.rounds):
        for processes in (1, 2):
            p95 = run(processes, args.bursts, args.requests)
            print(f"{processes} process(es): median p95 {statistics.median(p95):.1f} ms over {len(p95)} bursts "
                  f"(range {min(p95):.1f}-{max(p95):.1f})", flush=True)


if __name__ == "__main__":
    main()
