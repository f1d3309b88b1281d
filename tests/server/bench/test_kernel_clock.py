"""The kernel clock of `flotilla-bench modes` times the server, not the client: a late answer counts, an
answer the client reads late does not. Against a real socket server on a thread."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator

import pytest
from flotilla_server.bench.kernel_clock import UNANSWERED, HealthPoller, NoAnswer, burst, post, probe

ANSWER = (b"HTTP/1.1 429 Too Many Requests\r\ncontent-type: application/json\r\nconnection: close\r\n"
          b"content-length: 50\r\n\r\n" + b'{"error": {"code": "queue_full", "message": "x"}}'.ljust(50))


@contextlib.contextmanager
def answering_server(delay_s: float, answer_every: int = 1) -> Iterator[int]:
    """Answers each request's headers with ANSWER after `delay_s`, or, but for every `answer_every`-th
    connection, closes it unanswered; yields its port."""
    listener = socket.create_server(("127.0.0.1", 0), backlog=256)
    stop = threading.Event()

    def answer(conn: socket.socket, answered: bool) -> None:
        with conn:
            data = b""
            while b"\r\n\r\n" not in data:
                data += conn.recv(4096)
            time.sleep(delay_s)
            if answered:
                conn.sendall(ANSWER)

    def accept() -> None:
        listener.settimeout(0.1)
        accepted = 0
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                conn, _ = listener.accept()
                accepted += 1
                threading.Thread(target=answer, args=(conn, accepted % answer_every == 0), daemon=True).start()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        stop.set()
        thread.join()
        listener.close()


def test_a_late_answer_is_timed_late() -> None:
    with answering_server(delay_s=0.2) as port:
        answers = burst(port, post("/v1/completions", {"model": "m"}), 20)
    assert [(a.status, a.error_code) for a in answers] == [(429, "queue_full")] * 20
    assert all(0.2 <= a.latency_s < 1.0 for a in answers), [a.latency_s for a in answers]


@pytest.mark.serial  # a 0.3 s bound on answers a local server sends at once: a busy machine delays the sending
def test_an_answer_read_late_is_timed_when_it_arrived(monkeypatch: pytest.MonkeyPatch) -> None:
    original = socket.socket.recvmsg

    def slow_reader(self: socket.socket, *args: int) -> tuple:
        time.sleep(0.05)  # the client is busy before each read: 20 reads or more, 1 s or more
        return original(self, *args)

    monkeypatch.setattr(socket.socket, "recvmsg", slow_reader)
    with answering_server(delay_s=0.0) as port:
        answers = burst(port, post("/v1/completions", {"model": "m"}), 20)
    assert max(a.latency_s for a in answers) < 0.3, [a.latency_s for a in answers]


def test_an_answer_the_kernel_did_not_stamp_is_timed_when_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """Linux leaves data unstamped while it switches its stamps on: such an answer is timed, late, not lost."""
    original = socket.socket.recvmsg

    def unstamped(self: socket.socket, *args: int) -> tuple:
        time.sleep(0.05)  # read late: its latency then includes this
        data, _, flags, address = original(self, *args)
        return data, [], flags, address

    monkeypatch.setattr(socket.socket, "recvmsg", unstamped)
    with answering_server(delay_s=0.0) as port:
        assert 0.05 <= probe(port) < 1.0


def test_the_health_poller_measures_from_its_own_process() -> None:
    with answering_server(delay_s=0.05) as port:
        assert 0.05 <= probe(port) < 1.0
        with HealthPoller(port) as poller:
            time.sleep(0.3)
    assert len(poller.latencies_s) >= 2
    assert all(0.05 <= s < 1.0 for s in poller.latencies_s)


def test_a_poll_closed_unanswered_is_counted_apart_and_the_polling_goes_on() -> None:
    with answering_server(delay_s=0.01, answer_every=2) as port:  # connections 1, 3, 5, ... closed unanswered
        with pytest.raises(NoAnswer):
            probe(port)
        with HealthPoller(port) as poller:
            time.sleep(0.4)
    assert poller.unanswered >= 2 and len(poller.latencies_s) >= 2
    assert abs(poller.unanswered - len(poller.latencies_s)) <= 1
    assert all(0.01 <= s < 1.0 for s in poller.latencies_s)


def test_a_burst_request_closed_unanswered_is_marked_so_and_the_rest_are_timed() -> None:
    with answering_server(delay_s=0.01, answer_every=2) as port:
        answers = burst(port, post("/v1/completions", {"model": "m"}), 10)
    assert sorted(a.status for a in answers) == [UNANSWERED] * 5 + [429] * 5
    assert all(0.01 <= a.latency_s < 1.0 for a in answers if a.status == 429)
