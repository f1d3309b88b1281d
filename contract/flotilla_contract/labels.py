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
# On every server pod: the Gateway API Inference Extension's endpoint picker reads a pod's metrics by the names of
# its engine type, and flotilla-server exports vLLM's (docs/inference-gateway.md). Both keys: the inference
# extension's, and llm-d's, which its newer endpoint pickers read first.
GIE_ENGINE_TYPE_LABEL = "inference.networking.k8s.io/engine-type"
LLMD_ENGINE_TYPE_LABEL = "llm-d.ai/engine-type"
ENGINE_TYPE = "vllm"
ENGINE_TYPE_LABELS = {GIE_ENGINE_TYPE_LABEL: ENGINE_TYPE, LLMD_ENGINE_TYPE_LABEL: ENGINE_TYPE}


def pool_child_name(pool: str) -> str:
    """A ModelPool's Deployment and Service are `NAME-pool`, so a pool and an InferenceModel of the same name never
    share a child; the gateway finds the pool's pods by this Service's EndpointSlices."""
    return f"{pool}-pool"
