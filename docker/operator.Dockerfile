# flotilla-operator image: the control plane, and the front door (the chart runs `flotilla-gateway` from it).
# Build from the repository root:
#   docker build -f docker/operator.Dockerfile -t ghcr.io/flotilla-dev/flotilla-operator:0.1.0 .
# The operator never loads a model: the distribution's base install is torch-free (torch and the
# model libraries are the `server` extra), so a plain install at the versions in constraints.txt is
# enough, and the build checks that torch stayed out. Pin the base by digest in your registry mirror: python:3.11.11-slim-bookworm@sha256:<digest>.
ARG PYTHON_IMAGE=python:3.11.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/flotilla
WORKDIR /src
COPY constraints.txt pyproject.toml README.md ./
COPY contract ./contract
COPY server ./server
COPY operator ./operator
COPY gateway ./gateway
RUN /opt/flotilla/bin/pip install -c constraints.txt . \
 && /opt/flotilla/bin/flotilla-operator --help >/dev/null \
 && /opt/flotilla/bin/flotilla-gateway --help >/dev/null \
 && /opt/flotilla/bin/python -c "import flotilla_operator.runner, flotilla_operator.render" \
 && ! /opt/flotilla/bin/python -c "import torch" 2>/dev/null

FROM ${PYTHON_IMAGE} AS runtime
RUN groupadd --system --gid 65532 flotilla \
 && useradd --system --uid 65532 --gid 65532 --home-dir /home/flotilla --create-home --shell /usr/sbin/nologin flotilla
COPY --from=build /opt/flotilla /opt/flotilla
ENV PATH=/opt/flotilla/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
USER 65532:65532
WORKDIR /home/flotilla
EXPOSE 8080 8081
ENTRYPOINT ["flotilla-operator"]
CMD ["--all-namespaces", "--standalone"]
