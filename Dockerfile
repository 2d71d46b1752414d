# trace-repro daemon image.
#
#   docker build -t trace-repro:0.1.0 --build-arg REVISION="$(git rev-parse HEAD)" .
#   docker run --rm -e TRACE_REPRO_KAFKA_BOOTSTRAP=kafka:9092 -e TRACE_REPRO_FALKORDB_URL=redis://falkordb:6379 \
#       -p 9464:9464 trace-repro:0.1.0
#
# Only the addresses are needed: the image carries the shipped configuration at /etc/trace-repro/trace-repro.toml
# (mount yours over it) and listens on every interface (TRACE_REPRO_HTTP__HOST=0.0.0.0: /metrics, /healthz,
# /readyz on 9464); the daemon's own default stays 127.0.0.1 outside containers. pytest is installed (the `repro`
# extra): the repro worker runs the generated tests with it. It runs as uid 10001, never root.
# The entrypoint is the CLI: `docker run IMAGE config check`, `docker run IMAGE run --stage ingest --workers 2`.
#
# Targets: `daemon` (the default, last) and `shop` (also the sample shop and its traffic generator, for
# docker-compose.yml's demo: `docker build --target shop`).
ARG PYTHON_IMAGE=python:3.11-slim

FROM ${PYTHON_IMAGE} AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY streamer streamer
COPY processors processors
COPY sinks sinks
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

FROM ${PYTHON_IMAGE} AS base
ARG PYTHON_IMAGE
ARG VERSION=0.1.0
ARG REVISION=unknown
ARG CREATED=unknown
LABEL org.opencontainers.image.title="trace-repro" \
      org.opencontainers.image.description="Always-on streaming daemon: cross-trace collisions, regressions and proof-of-fix verdicts from OpenTelemetry and Debezium on Kafka." \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}" \
      org.opencontainers.image.base.name="${PYTHON_IMAGE}"
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    TRACE_REPRO_HTTP__HOST=0.0.0.0
COPY --from=build /wheels /wheels
RUN wheel="$(ls /wheels/trace_repro-*.whl)" \
    && pip install "${wheel}[repro]" \
    && rm -rf /wheels \
    && groupadd --system --gid 10001 trace-repro \
    && useradd --system --uid 10001 --gid 10001 --create-home --home-dir /home/trace-repro \
        --shell /usr/sbin/nologin trace-repro
COPY config/trace-repro.toml /etc/trace-repro/trace-repro.toml
# Numeric, so that Kubernetes' runAsNonRoot can verify it.
USER 10001:10001
WORKDIR /home/trace-repro
EXPOSE 9464
HEALTHCHECK --interval=15s --timeout=5s --start-period=30s --retries=4 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('TRACE_REPRO_HTTP__PORT', '9464'), timeout=3)"]
ENTRYPOINT ["trace-repro"]
CMD ["run", "--config", "/etc/trace-repro/trace-repro.toml"]

# The sample shop (bench/shop) with its OpenTelemetry instrumentation: the demo's workload, and the source the
# demo daemon's repro worker runs the shop's code from (/opt/trace-repro).
FROM base AS shop
USER root
COPY bench/__init__.py /opt/trace-repro/bench/__init__.py
COPY bench/shop /opt/trace-repro/bench/shop
RUN pip install "opentelemetry-sdk>=1.30,<2" "opentelemetry-exporter-otlp-proto-common>=1.30,<2" \
        "opentelemetry-instrumentation-psycopg>=0.66b1,<1"
ENV PYTHONPATH=/opt/trace-repro
USER 10001:10001

FROM base AS daemon
