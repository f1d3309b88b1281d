"""Adapter status policy: the pods' load reports in, `status.adapters` and a Degraded problem out.

Pure (docs/operator.md, "Adapters"). `pod_adapters` reads one pod's report (LOAD_PATH, flotilla_contract.load)
into the small `PodAdapters` the rest works on; `adapter_counts` says how many ready pods serve each adapter of
the spec and how many hold it in a slot; `refused_problem` turns the adapters the servers refused (a bad list
line, an adapter that does not fit its base) into one Problem naming each adapter and the model, with the
server's reason. The callers (reconciler.write_status, pool_residency) only fetch the reports.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from flotilla_contract.load import ServerLoad

from flotilla_operator.status import Problem

ADAPTER_REFUSED = "AdapterRefused"
MAX_MESSAGE_CHARS = 600


@dataclass(frozen=True)
class PodAdapters:
    """What one pod says of its adapters."""

    ready: bool  # the server takes new requests
    served: frozenset[str] = frozenset()  # adapters a request may name now
    resident: frozenset[str] = frozenset()  # adapters in a slot now
    refused: tuple[tuple[str, str], ...] = ()  # (adapter, the server's reason), in the server's order


def pod_adapters(report: ServerLoad) -> PodAdapters:
    """One pod's adapters from its load report.

    WIRING: the report's adapter fields (`adapters`, `adapters_resident`, `adapters_refused`,
    flotilla_contract.load) are read here and nowhere else; getattr keeps an older contract (without them)
    reading as a server that serves no adapter.
    """
    served = frozenset(a.name for a in getattr(report, "adapters", None) or ())
    resident = frozenset(getattr(report, "adapters_resident", None) or ())
    refused = tuple((r.name, r.error) for r in getattr(report, "adapters_refused", None) or ())
    return PodAdapters(report.ready, served, resident, refused)


def pods_adapters(reports: Mapping[str, ServerLoad | None]) -> dict[str, PodAdapters | None]:
    return {pod: (pod_adapters(report) if report is not None else None) for pod, report in reports.items()}


def adapter_counts(names: Iterable[str], pods: Mapping[str, PodAdapters | None]) -> list[dict[str, int | str]]:
    """`status.adapters`: for each adapter name (spec order), the ready pods serving it and those holding it in a
    slot. A pod without a report, or not ready, serves nothing as far as status is concerned."""
    ready = [p for p in pods.values() if p is not None and p.ready]
    return [{"name": name, "pods": sum(name in p.served for p in ready),
             "resident": sum(name in p.resident for p in ready)} for name in names]


def refused_problem(names: Iterable[str], model: str, pods: Mapping[str, PodAdapters | None]) -> Problem | None:
    """One Problem for the adapters of `names` that pods refused: `adapter 'x' of model 'm' is refused by
    2/3 pods (pod-a): <the server's reason>`, adapters in spec order; None when no pod refused any.

    A pod's refusal counts whether or not it is ready: a refused adapter is refused wherever it is listed."""
    wanted = list(dict.fromkeys(names))
    reporting = {pod: p for pod, p in sorted(pods.items()) if p is not None}
    parts = []
    for name in wanted:
        refusing = [(pod, error) for pod, p in reporting.items() for who, error in p.refused if who == name]
        if not refusing:
            continue
        first_pod, first_error = refusing[0]
        count = len({pod for pod, _ in refusing})
        parts.append(f"adapter {name!r} of model {model!r} is refused by {count}/{len(reporting)} pods "
                     f"({first_pod}): {first_error}")
    if not parts:
        return None
    message = "; ".join(parts) + "; fix the adapter (it must be a PEFT LoRA of this base model) or remove it from spec.adapters"
    if len(message) > MAX_MESSAGE_CHARS:
        message = message[:MAX_MESSAGE_CHARS - 1] + "…"
    return Problem(ADAPTER_REFUSED, message)
