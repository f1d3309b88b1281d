"""Model sources: how each `spec.model.source` puts weights where `flotilla-server --model` finds them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from flotilla_operator.types import ModelSource

MODELS_DIR = "/models"
DOWNLOAD_DIR = f"{MODELS_DIR}/model"
# The server image ships the `hf` CLI (huggingface_hub), so the download needs no second image.
DOWNLOAD_COMMAND = ("hf", "download")
INIT_SECURITY = {
    "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True, "runAsNonRoot": True,
    "capabilities": {"drop": ["ALL"]},
}


@dataclass(frozen=True)
class SourceRender:
    model_arg: str  # the value of --model
    volumes: list[dict[str, Any]] = field(default_factory=list)
    mounts: list[dict[str, Any]] = field(default_factory=list)  # into the server container
    init_containers: list[dict[str, Any]] = field(default_factory=list)
    startup_budget_s: int = 300  # how long loading may take before the startup probe gives up


def _join(base: str, sub: str) -> str:
    sub = sub.strip("/")
    return f"{base}/{sub}" if sub else base


def _is_gguf(path: str) -> bool:
    return path.endswith(".gguf")


def render_source(source: ModelSource, server_image: str) -> SourceRender:
    if source.builtin is not None:
        return SourceRender(model_arg=source.builtin, startup_budget_s=120)
    if source.pvc is not None:
        volume = {"name": "model", "persistentVolumeClaim": {"claimName": source.pvc.claim_name, "readOnly": True}}
        mount = {"name": "model", "mountPath": MODELS_DIR, "readOnly": True}
        return SourceRender(_join(MODELS_DIR, source.pvc.path), [volume], [mount], startup_budget_s=900)
    volume = {"name": "model", "emptyDir": {}}
    mount = {"name": "model", "mountPath": MODELS_DIR, "readOnly": True}
    init_mount = {"name": "model", "mountPath": MODELS_DIR}
    tmp_mount = {"name": "tmp", "mountPath": "/tmp"}
    if source.huggingface is not None:
        hf = source.huggingface
        # the server image sets HF_HUB_OFFLINE=1 (the server never downloads); the download must undo it
        env: list[dict[str, Any]] = [{"name": "HF_HOME", "value": "/tmp/hf"}, {"name": "HF_HUB_OFFLINE", "value": "0"}]
        if hf.token_secret is not None:
            env.append({"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {
                "name": hf.token_secret.name, "key": hf.token_secret.key}}})
        # with `file`, only that file is fetched (`hf download REPO FILE`), and --model names it
        files = [hf.file] if hf.file else []
        init = {
            "name": "download-model", "image": server_image,
            "command": [*DOWNLOAD_COMMAND, hf.repo, *files, "--revision", hf.revision, "--local-dir", DOWNLOAD_DIR],
            "env": env, "volumeMounts": [init_mount, tmp_mount], "securityContext": dict(INIT_SECURITY),
        }
        model_arg = _join(DOWNLOAD_DIR, hf.file) if hf.file else DOWNLOAD_DIR
        return SourceRender(model_arg, [volume], [mount], [init], startup_budget_s=900)
    if source.image is not None:
        # Copied by an init container rather than mounted as an image volume: works on every
        # Kubernetes version (image volumes need 1.31+ and a feature gate before 1.33).
        # A `.gguf` file keeps its name (the server reads the file type from it) next to where a directory goes.
        path = _join("", source.image.path)
        target = _join(MODELS_DIR, path.rsplit("/", 1)[-1]) if _is_gguf(path) else DOWNLOAD_DIR
        init = {
            "name": "copy-model", "image": source.image.reference,
            "command": ["cp", "-R", path, target],
            "volumeMounts": [init_mount], "securityContext": dict(INIT_SECURITY),
        }
        return SourceRender(target, [volume], [mount], [init], startup_budget_s=900)
    raise ValueError("model.source must set exactly one of huggingface, pvc, image or builtin")
