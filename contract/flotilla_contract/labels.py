"""Kubernetes label and annotation keys, and child names, that the operator writes and the gateway and dashboards
read."""

NAME_LABEL = "app.kubernetes.io/name"
INSTANCE_LABEL = "app.kubernetes.io/instance"
COMPONENT_LABEL = "app.kubernetes.io/component"
PART_OF_LABEL = "app.kubernetes.io/part-of"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
VERSION_LABEL = "app.kubernetes.io/version"
MODEL_LABEL = "flotilla.dev/model"  # the served model name, for Prometheus relabelling and dashboards
POOL_LABEL = "flotilla.dev/pool"  # node label and taint key of Flotilla's node pools
SERVICE_NAME_LABEL = "kubernetes.io/service-name"  # EndpointSlice → Service, set by Kubernetes

SERVER_APP_NAME = "flotilla-server"  # value of NAME_LABEL on every model pod
WOKEN_AT_ANNOTATION = "flotilla.dev/woken-at"  # RFC 3339 time a gateway woke a model (or a ModelPool) from zero

TENANT_HEADER = "X-Flotilla-Tenant"
CLASS_HEADER = "X-Flotilla-Class"
MODEL_POOL_LABEL = "flotilla.dev/model-pool"  # on a ModelPool's pods: the pool's name (its scrape's `pool` label)


def pool_child_name(pool: str) -> str:
    """A ModelPool's Deployment and Service are `NAME-pool`, so a pool and an InferenceModel of the same name never
    share a child; the gateway finds the pool's pods by this Service's EndpointSlices."""
    return f"{pool}-pool"
