# trainer-metrics container image.
#   docker build -t trainer-metrics:0.1.0 .
# The builder installs the project into a virtualenv with the README's install step (`pip install .`,
# runtime dependencies only); the final image holds that virtualenv and nothing of the build.

ARG PYTHON_IMAGE=python:3.11-slim

FROM ${PYTHON_IMAGE} AS builder
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH
RUN python -m venv /opt/venv
WORKDIR /src
COPY pyproject.toml README.md ./
COPY app ./app
RUN pip install .

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="trainer-metrics" \
      org.opencontainers.image.description="Prometheus exporter for Kubeflow Trainer objects" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    TRAINER_METRICS_HOST=0.0.0.0 \
    TRAINER_METRICS_PORT=8080 \
    MALLOC_MMAP_THRESHOLD_=33554432 \
    MALLOC_TRIM_THRESHOLD_=134217728
# The two glibc malloc settings keep multi-megabyte scrape bodies in the heap instead of fresh mmap
# pages on every render: page faults cost more than the render itself at large series counts.
COPY --from=builder /opt/venv /opt/venv
# The same uid/gid as the chart's securityContext; no home, no shell needed.
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["trainer-metrics"]
