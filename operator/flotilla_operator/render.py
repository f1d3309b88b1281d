"""`flotilla-operator render -f FILE.yaml`: the children an InferenceModel would get, with no cluster.

Like `helm template`, it shows what would be applied before anything is: the Service, the Deployment,
the PodDisruptionBudget (latency-first), the NetworkPolicy (spec.networkPolicy) and, when `--service-monitor` says the Prometheus operator is
installed, the ServiceMonitor, with every default filled in. It uses the same pure builders as the
reconciler (manifests.desired_children), so what it prints is what the operator creates. With no
cluster there is no uid to point at, so the owner references are left out unless the input carries
`metadata.uid` (as `kubectl get -o yaml` output does).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, TextIO

import pydantic
import yaml

from flotilla_operator import types
from flotilla_operator.manifests import Owner, desired_children


class RenderError(Exception):
    """Input that cannot be rendered; the message says what to change."""


def add_arguments(parser: argparse.ArgumentParser, default_image: str) -> None:
    parser.add_argument("-f", "--filename", required=True, metavar="FILE",
                        help="InferenceModel manifest(s), one or more YAML documents; '-' reads stdin")
    parser.add_argument("--service-monitor", action="store_true",
                        help="also render the ServiceMonitor (the operator does when monitoring.coreos.com/v1 is served)")
    parser.add_argument("--default-image", default=default_image,
                        help="flotilla-server image for models that set no spec.image (default: %(default)s)")


def children_of(obj: dict[str, Any], default_image: str, service_monitor: bool) -> list[dict[str, Any]]:
    """The children of one InferenceModel document, defaults applied."""
    if obj.get("apiVersion") != types.API_VERSION or obj.get("kind") != types.KIND:
        raise RenderError(f"expected apiVersion: {types.API_VERSION} and kind: {types.KIND}, "
                          f"got {obj.get('apiVersion')!r} {obj.get('kind')!r}; render takes InferenceModel manifests")
    meta = obj.get("metadata") or {}
    if not meta.get("name"):
        raise RenderError("metadata.name is missing; give the InferenceModel a name")
    try:
        spec = types.parse_spec(obj.get("spec") or {})
    except pydantic.ValidationError as error:
        first = error.errors()[0]
        where = ".".join(map(str, first["loc"]))
        raise RenderError(f"{meta['name']}: spec.{where}: {first['msg']}; fix it and render again") from error
    uid = meta.get("uid")
    owner = Owner(meta["name"], meta.get("namespace") or "default", uid or "", spec)
    children = desired_children(owner, default_image, service_monitor)
    if not uid:
        for child in children:
            child["metadata"].pop("ownerReferences", None)
    return children


def render(text: str, default_image: str, service_monitor: bool) -> list[dict[str, Any]]:
    try:
        documents = [doc for doc in yaml.safe_load_all(text) if doc]
    except yaml.YAMLError as error:
        raise RenderError(f"the file is not valid YAML: {error}") from error
    if not documents:
        raise RenderError("the file holds no YAML document; give an InferenceModel manifest")
    return [child for doc in documents for child in children_of(doc, default_image, service_monitor)]


def run(args: argparse.Namespace, stdout: TextIO = sys.stdout) -> int:
    try:
        text = sys.stdin.read() if args.filename == "-" else Path(args.filename).read_text()
        children = render(text, args.default_image, args.service_monitor)
    except OSError as error:
        print(f"flotilla-operator render: cannot read {args.filename}: {error.strerror}; check the path", file=sys.stderr)
        return 2
    except RenderError as error:
        print(f"flotilla-operator render: {args.filename}: {error}", file=sys.stderr)
        return 2
    stdout.write(yaml.safe_dump_all(children, sort_keys=False, width=120, explicit_start=True))
    return 0
