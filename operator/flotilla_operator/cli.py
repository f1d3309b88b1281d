"""`flotilla-operator`: parse flags, serve /metrics, and run the kopf operator with the handlers.

`flotilla-operator render -f FILE.yaml` prints the children an InferenceModel would get (render.py).
Bare flags, as the image runs it, run the operator: the subcommand is recognised by its first word.
"""

from __future__ import annotations

import argparse
import logging
import sys

from flotilla_operator import render
from flotilla_operator.settings import OperatorSettings
from flotilla_operator.types import DEFAULT_SERVER_IMAGE


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="flotilla-operator",
        formatter_class=lambda prog: argparse.HelpFormatter(prog, width=100),  # stable text for docs
        description="Reconcile InferenceModel resources into fleets of flotilla-server pods. "
        "Logs in with the in-cluster service account, or the standard kubeconfig ($KUBECONFIG, ~/.kube/config; "
        "tokens, token files, client certificates and exec plugins), and logs in again when the API server answers 401.",
        epilog="To see the Deployment, Service, PodDisruptionBudget, NetworkPolicy and ServiceMonitor a model would get, without a "
        "cluster: flotilla-operator render -f FILE.yaml [--service-monitor] (flotilla-operator render --help).",
    )
    scope = parser.add_mutually_exclusive_group()
    scope.add_argument("--namespace", "-n", action="append", default=[], help="watch this namespace (repeatable)")
    scope.add_argument("--all-namespaces", "-A", action="store_true", help="watch every namespace")
    parser.add_argument(
        "--prometheus-url", default="http://prometheus-operated.monitoring.svc:9090",
        help="Prometheus HTTP API the autoscaler queries (default: %(default)s)",
    )
    parser.add_argument(
        "--default-image", default=DEFAULT_SERVER_IMAGE,
        help="flotilla-server image for models that set no spec.image (default: %(default)s)",
    )
    peering = parser.add_mutually_exclusive_group()
    peering.add_argument("--peering", metavar="NAME", help="coordinate with other operator replicas via this KopfPeering")
    peering.add_argument("--standalone", action="store_true", help="run without peering (the default)")
    parser.add_argument(
        "--priority", type=int, default=None,
        help="peering priority of this replica: the highest acts, the others stand by "
        "(default: a random number drawn at start, so that two replicas never tie and freeze)",
    )
    parser.add_argument(
        "--peering-lifetime-s", type=int, default=20,
        help="seconds after its last keep-alive that a silent replica counts as dead and a standby takes over "
        "(default: %(default)s)",
    )
    parser.add_argument("--verbose", "-v", action="store_true", help="log debug messages")
    parser.add_argument("--health-port", type=int, default=8081, help="port of the /healthz liveness endpoint (default: %(default)s)")
    parser.add_argument("--metrics-port", type=int, default=8080, help="port of the Prometheus /metrics endpoint (default: %(default)s)")
    parser.add_argument(
        "--autoscale-interval-s", type=float, default=15.0,
        help="seconds between autoscaler decisions per model (default: %(default)s)",
    )
    parser.add_argument(
        "--drift-interval-s", type=float, default=60.0,
        help="seconds between re-applications of the desired state, which corrects drift (default: %(default)s)",
    )
    parser.add_argument(
        "--tier-moves-per-hour", type=int, default=20,
        help="moves of adaptive models between their pool and dedicated replicas that may start in any hour, "
        "fleet-wide (placement.policy adaptive; default: %(default)s)",
    )
    return parser


def build_render_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="flotilla-operator render",
        formatter_class=lambda prog: argparse.HelpFormatter(prog, width=100),
        description="Print the children an InferenceModel would get (Service, Deployment, PodDisruptionBudget, "
        "NetworkPolicy with spec.networkPolicy.enabled, ServiceMonitor when asked), defaults applied, as multi-document YAML, as `helm template` does. "
        "No cluster is needed.",
    )
    render.add_arguments(parser, DEFAULT_SERVER_IMAGE)
    return parser


def settings_from_args(args: argparse.Namespace) -> OperatorSettings:
    return OperatorSettings(
        namespaces=tuple(args.namespace),
        all_namespaces=args.all_namespaces,
        prometheus_url=args.prometheus_url,
        default_image=args.default_image,
        peering=args.peering,
        standalone=args.peering is None,
        priority=args.priority,
        peering_lifetime_s=args.peering_lifetime_s,
        verbose=args.verbose,
        health_port=args.health_port,
        metrics_port=args.metrics_port,
        autoscale_interval_s=args.autoscale_interval_s,
        drift_interval_s=args.drift_interval_s,
        tier_moves_per_hour=args.tier_moves_per_hour,
    )


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["render"]:
        return render.run(build_render_parser().parse_args(argv[1:]))
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        settings = settings_from_args(args)
    except ValueError as error:
        parser.error(str(error))
    logging.basicConfig(
        level=logging.DEBUG if settings.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    from flotilla_operator import credentials
    from flotilla_operator.runner import run_operator  # kopf and handlers load only when running

    try:
        credentials.login()  # once up front: without a cluster, say so in one line rather than retry forever
    except credentials.NoCredentials as error:
        print(f"flotilla-operator: error: {error}", file=sys.stderr)
        return 2
    run_operator(settings)
    return 0


if __name__ == "__main__":
    sys.exit(main())
