# flowerbed on Flower's official SuperExec image: the process that runs the ServerApp and the
# ClientApps in a 1.42 deployment (--isolation process). SuperLink and SuperNodes use the official
# flwr/superlink and flwr/supernode images unchanged.
#
# Wheels in docker/wheels/ are preferred over the index (docker/build-images.sh puts the CPU torch
# build and every dependency there, so the build needs no network); without them pip uses the
# index, where torch==2.13.0 is the larger CUDA build unless PIP_EXTRA_INDEX_URL names a CPU index.
ARG FLWR_VERSION=1.42.0
FROM flwr/superexec:${FLWR_VERSION}

ARG TORCH_SPEC="torch==2.13.0"
ARG PIP_EXTRA_INDEX_URL=""
# /app/plugins is on PYTHONPATH: docker-compose.yml mounts $FLOWERBED_PLUGINS there, so plug-in
# packages installed with `pip install --target` (entry points included) and plug-in modules
# reach the ServerApp and every ClientApp without rebuilding the image (docs/contributing.md)
ENV FLWR_TELEMETRY_ENABLED=0 \
    FLWR_DISABLE_UPDATE_CHECK=1 \
    FLOWERBED_WORKSPACE=/app/runs \
    PYTHONPATH=/app/plugins

COPY --chown=app:app docker/wheels/ /tmp/wheels/
COPY --chown=app:app docker/build-ca/ /tmp/build-ca/
RUN set -eu; \
    if [ -f /tmp/build-ca/ca-certificates.crt ]; then export PIP_CERT=/tmp/build-ca/ca-certificates.crt; fi; \
    PIP_EXTRA_INDEX_URL="${PIP_EXTRA_INDEX_URL}" python -m pip install --no-cache-dir \
        --disable-pip-version-check --find-links /tmp/wheels "${TORCH_SPEC}"

RUN mkdir -p /app/src
WORKDIR /app/src
COPY --chown=app:app pyproject.toml README.md ./
COPY --chown=app:app apps ./apps
COPY --chown=app:app server ./server
COPY --chown=app:app strategies ./strategies
COPY --chown=app:app attacks ./attacks
COPY --chown=app:app clients ./clients
COPY --chown=app:app configs ./configs
RUN set -eu; \
    if [ -f /tmp/build-ca/ca-certificates.crt ]; then export PIP_CERT=/tmp/build-ca/ca-certificates.crt; fi; \
    PIP_EXTRA_INDEX_URL="${PIP_EXTRA_INDEX_URL}" python -m pip install --no-cache-dir \
        --disable-pip-version-check --find-links /tmp/wheels . ; \
    cd /app; rm -rf /app/src /tmp/build-ca; \
    mkdir -p /app/runs /app/certs /app/keys /app/plugins; \
    flowerbed list experiments | grep -q quickstart
WORKDIR /app
