# trace-repro daemon image, used by docker-compose.yml (`trace-repro` service).
#
#   docker build -t trace-repro:local .
#   docker run --rm -v "$PWD/config/trace-repro.toml:/etc/trace-repro/trace-repro.toml:ro" \
#       -e TRACE_REPRO_KAFKA_BOOTSTRAP=... -e TRACE_REPRO_FALKORDB_URL=... trace-repro:local
#
# The configuration file is not baked in: mount it at /etc/trace-repro/trace-repro.toml.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /src
# The whole context (trimmed by .dockerignore) is needed: pyproject.toml, its README and
# the streamer/processors/sinks packages.
COPY . .
RUN pip install . \
    && useradd --system --uid 10001 --create-home --home-dir /home/trace-repro \
        --shell /usr/sbin/nologin trace-repro \
    && mkdir -p /etc/trace-repro

USER trace-repro
WORKDIR /home/trace-repro

# Prometheus /metrics
EXPOSE 9464

ENTRYPOINT ["trace-repro", "run", "--config", "/etc/trace-repro/trace-repro.toml"]
