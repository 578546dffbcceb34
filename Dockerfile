# flowerbed on Flower's official SuperExec image: the process that runs the ServerApp and the
# ClientApps in a 1.42 deployment (--isolation process). SuperLink and SuperNodes use the official
# flwr/superlink and flwr/supernode images unchanged.
ARG FLWR_VERSION=1.42.0
FROM flwr/superexec:${FLWR_VERSION}

# torch first and pinned: the CPU build keeps the image small when a CPU wheel index is configured
# (pass --build-arg PIP_EXTRA_INDEX_URL=...); from the default index it is the larger CUDA build.
ARG TORCH_SPEC="torch==2.13.0"
ARG PIP_EXTRA_INDEX_URL=""
ENV PIP_EXTRA_INDEX_URL=${PIP_EXTRA_INDEX_URL} \
    FLWR_TELEMETRY_ENABLED=0 \
    FLWR_DISABLE_UPDATE_CHECK=1
RUN python -m pip install --no-cache-dir "${TORCH_SPEC}"

WORKDIR /app
COPY --chown=app:app pyproject.toml README.md ./
COPY --chown=app:app apps ./apps
COPY --chown=app:app server ./server
COPY --chown=app:app strategies ./strategies
COPY --chown=app:app attacks ./attacks
COPY --chown=app:app clients ./clients
COPY --chown=app:app configs ./configs
RUN python -m pip install --no-cache-dir .
