# Stand-ins for Flower's official images, for machines that cannot pull from Docker Hub (CI here).
# Same shape as flwr/base: Python venv in /python/venv on PATH, non-root user `app` (uid 49999)
# with HOME=/app and WORKDIR /app, flwr installed; one target per image, with the official
# entrypoints. Built by docker/build-images.sh on a Debian base made with debootstrap:
#   docker build --target superlink -t flwr/superlink:1.42.0 -f docker/standins.Dockerfile .
ARG BASE_IMAGE=flowerbed/debian-base:bookworm
FROM ${BASE_IMAGE} AS base
ARG FLWR_VERSION=1.42.0
COPY docker/build-ca/ /tmp/build-ca/
RUN set -eu; \
    if [ -f /tmp/build-ca/ca-certificates.crt ]; then export PIP_CERT=/tmp/build-ca/ca-certificates.crt; fi; \
    python3 -m venv /python/venv; \
    /python/venv/bin/python -m pip install --no-cache-dir --disable-pip-version-check \
        "flwr==${FLWR_VERSION}"; \
    rm -rf /tmp/build-ca; \
    useradd --uid 49999 --user-group --home-dir /app --no-create-home --shell /usr/sbin/nologin app; \
    mkdir -p /app; chown -R app:app /app /python/venv
ENV PATH=/python/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONIOENCODING=UTF-8 \
    LANG=C.UTF-8 \
    LC_ALL=C.UTF-8 \
    HOME=/app
WORKDIR /app
USER app

FROM base AS superlink
ENTRYPOINT ["flower-superlink"]

FROM base AS superexec
ENTRYPOINT ["flower-superexec"]
