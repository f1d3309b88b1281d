# flotilla-server image: the data plane. Build from the repository root:
#   docker build -f docker/server.Dockerfile -t ghcr.io/flotilla-dev/flotilla-server:0.1.0 .
# torch is pinned to 2.13.0 by constraints.txt and taken from the CPU wheel index by default; for GPU
# nodes pass a CUDA index, e.g. --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128.
# Pin the base by digest in your registry mirror: python:3.11.11-slim-bookworm@sha256:<digest>.
ARG PYTHON_IMAGE=python:3.11.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/flotilla
WORKDIR /src
COPY constraints.txt ./
# torch first and alone, from its own index, so the version in constraints.txt is the one installed.
RUN /opt/flotilla/bin/pip install --index-url "${TORCH_INDEX_URL}" -c constraints.txt torch==2.13.0
COPY pyproject.toml README.md ./
COPY contract ./contract
COPY server ./server
COPY operator ./operator
COPY gateway ./gateway
RUN /opt/flotilla/bin/pip install -c constraints.txt '.[server]' \
 && /opt/flotilla/bin/python -c "import torch, flotilla_server; assert torch.__version__.startswith('2.13.0'), torch.__version__"

FROM ${PYTHON_IMAGE} AS runtime
# 65532: the conventional non-root "nonroot" uid; the pod's securityContext runs as it too.
RUN groupadd --system --gid 65532 flotilla \
 && useradd --system --uid 65532 --gid 65532 --home-dir /home/flotilla --create-home --shell /usr/sbin/nologin flotilla
COPY --from=build /opt/flotilla /opt/flotilla
ENV PATH=/opt/flotilla/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HF_HUB_OFFLINE=1
USER 65532:65532
WORKDIR /home/flotilla
EXPOSE 8000
# The operator passes --model, --port and the engine flags; `tiny` needs no weights.
ENTRYPOINT ["flotilla-server"]
CMD ["--model", "tiny", "--host", "0.0.0.0", "--port", "8000"]
