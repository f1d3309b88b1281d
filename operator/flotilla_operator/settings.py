"""The operator's settings, parsed once by the CLI and handed to every handler through kopf's memo."""

from __future__ import annotations

from dataclasses import dataclass, field

from flotilla_operator.types import DEFAULT_SERVER_IMAGE

DEFAULT_OPERATOR_IMAGE = "ghcr.io/flotilla-dev/flotilla-operator:0.1.0"


@dataclass(frozen=True)
class OperatorSettings:
    namespaces: tuple[str, ...] = ()  # empty with all_namespaces True: cluster-wide
    all_namespaces: bool = False
    prometheus_url: str = "http://prometheus-operated.monitoring.svc:9090"
    default_image: str = DEFAULT_SERVER_IMAGE
    peering: str | None = None  # None with standalone True: no peering at all
    standalone: bool = True
    priority: int | None = None  # kopf peering priority; None: a random one drawn at start, so replicas never tie
    peering_lifetime_s: int = 20  # a replica silent this long is dead: the standby takes over
    verbose: bool = False
    health_port: int = 8081
    metrics_port: int = 8080
    autoscale_interval_s: float = 15.0
    drift_interval_s: float = 60.0
    tier_moves_per_hour: int = 20  # adaptive models' moves that may start in any hour, fleet-wide
    extra: dict[str, str] = field(default_factory=dict)  # free-form knobs for tests and plug-ins

    def __post_init__(self) -> None:
        if not self.all_namespaces and not self.namespaces:
            raise ValueError("give --namespace NAME (repeatable) or --all-namespaces")
        if self.all_namespaces and self.namespaces:
            raise ValueError("--namespace and --all-namespaces exclude each other; pick one")
        if self.autoscale_interval_s <= 0 or self.drift_interval_s <= 0:
            raise ValueError("--autoscale-interval-s and --drift-interval-s must be > 0")
        if self.tier_moves_per_hour < 1:
            raise ValueError("--tier-moves-per-hour must be >= 1")
        if not self.standalone and not self.peering:
            raise ValueError("give --peering NAME or --standalone")
        if self.peering_lifetime_s < 5:
            raise ValueError("--peering-lifetime-s must be >= 5: kopf renews it 5 to 10 s before it lapses")
