"""`flotilla-gateway`: parse the flags, then serve the gateway with uvicorn until SIGTERM.

On SIGTERM (or Ctrl-C) readiness turns false at once, but the gateway keeps routing new requests for
--drain-delay-s, the time endpoints take to drop it everywhere (a Service still sends it traffic meanwhile);
then held requests get 503 with Retry-After, uvicorn stops accepting connections and lets streams in flight
finish for up to --drain-timeout-s. A second signal skips the delay. A file it cannot
start with (the keys, the upstream key) stops it with one line on stderr and exit 2.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Callable
from types import FrameType
from typing import Any

import uvicorn
from flotilla_contract.flags import DEFAULT_MAX_BODY_BYTES
from flotilla_contract.sizes import parse_bytes

from flotilla_gateway.access_log import configure
from flotilla_gateway.app import DEFAULT_KEYS_RELOAD_INTERVAL_S, Gateway, GatewaySettings
from flotilla_gateway.ejection import EjectionPolicy
from flotilla_gateway.failover import RetryPolicy
from flotilla_gateway.keys import read_upstream_key
from flotilla_gateway.keys_file import KeysFile
from flotilla_gateway.load_board import DEFAULT_POLL_INTERVAL_S

DEFAULT_PORT = 8080
DEFAULT_DRAIN_TIMEOUT_S = 30.0
DEFAULT_DRAIN_DELAY_S = 5.0
USAGE_EXIT = 2  # what argparse exits with: the command line, or a file it names, needs a change


def _bounded(convert: Callable[[str], float], minimum: float, strict: bool, what: str) -> Callable[[str], Any]:
    """An argparse type: `convert(text)`, above `minimum` (`strict`) or at least it, else a one-line error."""
    def parse(text: str) -> Any:
        try:
            value = convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None
        if not (value > minimum if strict else value >= minimum):  # NaN fails both
            raise argparse.ArgumentTypeError(f"{text!r} is not {what}")
        return value
    return parse


_seconds = _bounded(float, 0, True, "a number of seconds above 0")
_non_negative_seconds = _bounded(float, 0, False, "a number of seconds >= 0")
_count = _bounded(int, 0, False, "a whole number >= 0")
_at_least_one = _bounded(int, 1, False, "a whole number >= 1")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="flotilla-gateway",
        description="One OpenAI endpoint for a Flotilla fleet: routes on `model`, holds requests while a model "
                    "scales from zero, balances by load or prompt prefix (docs/gateway.md).")
    p.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG"),
                   help="kubeconfig file to reach the Kubernetes API (default: $KUBECONFIG, then ~/.kube/config).")
    p.add_argument("--in-cluster", action="store_true",
                   help="Use the pod's service account instead of a kubeconfig (what the chart sets).")
    p.add_argument("-n", "--namespace", action="append", dest="namespaces", metavar="NAMESPACE",
                   help="Watch InferenceModels in this namespace; repeat for several (default: all namespaces).")
    p.add_argument("--host", default="0.0.0.0", help="Address to listen on.")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help="TCP port to listen on.")
    p.add_argument("--api-keys-file", metavar="PATH",
                   help="YAML/JSON file mapping each API key to {tenant, models, class} (a mounted Secret), "
                        "parsed strictly: `models` is required, [\"*\"] for every model. When set, every "
                        "request needs 'Authorization: Bearer <key>'.")
    p.add_argument("--api-keys-reload-interval-s", type=_seconds, default=DEFAULT_KEYS_RELOAD_INTERVAL_S,
                   metavar="S",
                   help="How often the keys file is read again, seconds; a changed file takes effect, a refused "
                        "one keeps the last good keys (docs/gateway.md, \"API keys\"). Default: %(default)s.")
    p.add_argument("--rate-limit-replicas", type=_at_least_one, default=1, metavar="N",
                   help="Each gateway replica enforces 1/N of every key's requestsPerMinute and tokensPerMinute: "
                        "set N to the number of gateway replicas behind the Service (docs/gateway.md, \"Rate "
                        "limits\"). Default: %(default)s (each replica enforces the whole limit).")
    p.add_argument("--salt-cache-by-tenant", action=argparse.BooleanOptionalAction, default=True,
                   help="With API keys, set every request's cache_salt to its tenant, so tenants never share "
                        "prefix-cache blocks (a client's own cache_salt is always replaced). Default: on.")
    p.add_argument("--upstream-api-key-file", metavar="PATH",
                   default=os.environ.get("FLOTILLA_UPSTREAM_API_KEY_FILE"),
                   help="File holding the key the servers were started with (flotilla-server --api-key, a mounted "
                        "Secret); sent to every pod as 'Authorization: Bearer <key>' "
                        "(default: $FLOTILLA_UPSTREAM_API_KEY_FILE, else none).")
    p.add_argument("--poll-interval-s", type=float, default=DEFAULT_POLL_INTERVAL_S,
                   help="How often each pod's load report is read, seconds.")
    p.add_argument("--max-body-bytes", type=parse_bytes, default=DEFAULT_MAX_BODY_BYTES,
                   help="Largest request body accepted, e.g. 4Mi; larger gets 413.")
    p.add_argument("--connect-timeout-s", type=float, default=5.0,
                   help="Longest wait to connect to a pod before trying another, seconds.")
    p.add_argument("--max-retries", type=_count, default=RetryPolicy.max_retries, metavar="N",
                   help="Retries of a request on another pod before its first byte reaches the client (connect "
                        "errors, a connection dropped before the first byte, 502, 503, a pod gone from the "
                        "endpoints, a 429 when another pod has room); 0 turns retrying off. Default: %(default)s.")
    p.add_argument("--retry-deadline-s", type=_seconds, default=RetryPolicy.deadline_s, metavar="S",
                   help="No retry starts later than this after the request arrived, seconds. "
                        "Default: %(default)s.")
    p.add_argument("--eject-after-failures", type=_at_least_one, default=EjectionPolicy.consecutive_failures,
                   metavar="N", help="Failures in a row (connect errors, 502, a connection dropped) that take a pod "
                   "out of rotation (never more than half of a model's pods). Default: %(default)s.")
    p.add_argument("--eject-base-s", type=_seconds, default=EjectionPolicy.base_ejection_s, metavar="S",
                   help="A pod's cool-down out of rotation, times its ejections so far, capped at 300 s. "
                        "Default: %(default)s.")
    p.add_argument("--drain-delay-s", type=_non_negative_seconds, default=DEFAULT_DRAIN_DELAY_S, metavar="S",
                   help="On SIGTERM, how long the gateway keeps routing new requests after its readiness turns "
                        "false, while endpoints drop it; 0 refuses them at once. Default: %(default)s.")
    p.add_argument("--drain-timeout-s", type=float, default=DEFAULT_DRAIN_TIMEOUT_S,
                   help="On SIGTERM, how long streams in flight may take to finish, seconds.")
    p.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    return p


class _Server(uvicorn.Server):
    """uvicorn, plus: the first signal turns readiness false and, after the drain delay, refuses held and new
    requests before connections drain; a second signal stops at once."""

    def __init__(self, config: uvicorn.Config, gateway: Gateway, drain_delay_s: float) -> None:
        super().__init__(config)
        self.gateway = gateway
        self.drain_delay_s = drain_delay_s

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        # runs on the main thread, the event loop's: signals are delivered there
        if self.gateway.stopping or self.drain_delay_s <= 0:
            self._stop(sig, frame)
            return
        self.gateway.stopping = True  # readiness false; requests still routed until the delay ends
        loop = asyncio.get_event_loop()
        loop.call_soon_threadsafe(loop.call_later, self.drain_delay_s, self._stop, sig, frame)

    def _stop(self, sig: int, frame: FrameType | None) -> None:
        if not self.should_exit:
            self.gateway.drain()
            super().handle_exit(sig, frame)


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    try:
        keys = KeysFile(args.api_keys_file) if args.api_keys_file else None
        upstream_key = read_upstream_key(args.upstream_api_key_file) if args.upstream_api_key_file else None
    except ValueError as error:  # its message is one line that says what to change
        print(f"flotilla-gateway: {error}", file=sys.stderr)
        sys.exit(USAGE_EXIT)
    configure(args.log_level)
    try:
        retry = RetryPolicy(args.max_retries, args.retry_deadline_s)
        ejection = EjectionPolicy(args.eject_after_failures, args.eject_base_s)
    except ValueError as error:
        print(f"flotilla-gateway: {error}", file=sys.stderr)
        sys.exit(USAGE_EXIT)
    settings = GatewaySettings(namespaces=args.namespaces, kubeconfig=args.kubeconfig, in_cluster=args.in_cluster,
                               keys=keys, keys_reload_interval_s=args.api_keys_reload_interval_s,
                               rate_limit_replicas=args.rate_limit_replicas,
                               poll_interval_s=args.poll_interval_s, max_body_bytes=args.max_body_bytes,
                               connect_timeout_s=args.connect_timeout_s, salt_by_tenant=args.salt_cache_by_tenant,
                               retry=retry, ejection=ejection,
                               upstream_api_key=upstream_key)
    gateway = Gateway(settings)
    config = uvicorn.Config(gateway.app(), host=args.host, port=args.port, log_level=args.log_level,
                            access_log=False, timeout_graceful_shutdown=int(args.drain_timeout_s),
                            lifespan="on")
    _Server(config, gateway, args.drain_delay_s).run()


if __name__ == "__main__":
    main()
