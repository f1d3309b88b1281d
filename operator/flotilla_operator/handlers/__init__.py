"""kopf handlers. Each module here defines `register(registry, settings)`, called once at start-up.

Registration is explicit (not at import) because intervals come from command-line flags, and so
tests can run several operators with different settings in one process. To add a module, import
it and append it to MODULES.
"""

from __future__ import annotations

import kopf

from flotilla_operator.handlers import autoscale, peering, pool, pool_autoscale, reconcile, tiering
from flotilla_operator.settings import OperatorSettings

MODULES = [reconcile, pool, autoscale, pool_autoscale, tiering, peering]


def register_all(registry: kopf.OperatorRegistry, settings: OperatorSettings) -> None:
    for module in MODULES:
        module.register(registry, settings)
