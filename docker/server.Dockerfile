# flotilla-server image: the data plane. Build from the repository root:
#   docker build -f docker/server.Dockerfile -t ghcr.io/flotilla-dev/flotilla-server:0.1.0 .
# torch is pinned to 2.13.0 by constraints.txt and taken from the CPU wheel index by default; for GPU
# nodes pass a CUDA index, e.g. --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128.
# Pin the base by digest in your registry mirror: python:3.11.11-slim-bookworm@sha256:<digest>.
ARG PYTHON_IMAGE=python:3.11.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
# g++ builds the native CPU kernels below; it stays in this stage (the runtime stage copies only /opt/flotilla).
RUN apt-get update \
 && apt-get install -y --no-install-recommends g++ \
 && rm -rf /var/lib/apt/lists/*
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
# The native CPU kernels (every source scripts/build_kernels.py lists), written where the installed loader
# looks: kernels/build beside model/native_gemv.py inside /opt/flotilla, which the loader itself names. No
# -march: each kernel picks its AVX-512, AVX2 or plain path at run time, so one image runs on any x86-64 node.
COPY scripts/build_kernels.py ./scripts/
RUN out_dir="$(FLOTILLA_NATIVE_KERNELS=off /opt/flotilla/bin/python -c \
      'from flotilla_server.model.native_gemv import LIBRARY; print(LIBRARY.parent)')" \
 && /opt/flotilla/bin/python scripts/build_kernels.py --strict --out-dir "$out_dir"

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
# The build fails unless the native kernels load here, as the server's user, and agree with torch: the loader
# would only log a warning and fall back to slower one-row products and GGUF block products.
RUN python -c "import torch; from flotilla_server.model import native_gemv as n, quant_blocks as q; \
assert n.gemv_one_row is not None, 'the native CPU kernel did not load: see the warning above'; \
x, w = torch.randn(1, 96), torch.randn(80, 96); \
torch.testing.assert_close(n.gemv_one_row(x, w), x @ w.T, rtol=1e-4, atol=1e-4); \
assert q.active_isa() != 'torch', 'the GGUF block kernel did not load: see the warning above'; \
b = torch.randint(0, 256, (80, 54), dtype=torch.uint8); b.view(80, 3, 18)[..., :2] = torch.tensor([0, 60], dtype=torch.uint8); \
torch.testing.assert_close(q.quant_matmul(x, b, 2), x @ q.dequantize_rows(b, 2).T, rtol=1e-4, atol=1e-4)"
EXPOSE 8000
# The operator passes --model, --port and the engine flags; `tiny` needs no weights.
ENTRYPOINT ["flotilla-server"]
CMD ["--model", "tiny", "--host", "0.0.0.0", "--port", "8000"]
