# trainer-metrics container image, for a Docker/BuildKit build:
#   docker build -t trainer-metrics:0.1.0 .
# CI builds the same image without a registry or daemon, from Debian packages (image/build.py), and starts
# it (image/check.py). Both install requirements.lock, so the Python dependencies are the same file for file.
# The builder installs requirements.lock (every file checked against its sha256), then the project with
# --no-deps, into a virtualenv without pip or setuptools of its own; the final image holds that virtualenv
# and nothing of the build.

ARG PYTHON_IMAGE=python:3.11-slim

FROM ${PYTHON_IMAGE} AS builder
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
# pip and setuptools (24 MB) never run in the image: the builder's pip installs into the virtualenv instead.
RUN python -m venv --without-pip /opt/venv
WORKDIR /src
COPY requirements.lock ./
RUN pip --python /opt/venv/bin/python install --require-hashes --only-binary=:all: -r requirements.lock
COPY pyproject.toml README.md ./
COPY app ./app
RUN pip --python /opt/venv/bin/python install --no-deps .

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="trainer-metrics" \
      org.opencontainers.image.description="Prometheus exporter for Kubeflow Trainer objects" \
      org.opencontainers.image.licenses="Apache-2.0"
# Set version, revision and source at build time, e.g.
#   docker build --label org.opencontainers.image.version=0.1.0 \
#     --label org.opencontainers.image.revision="$(git rev-parse HEAD)" --label org.opencontainers.image.source=<url> .
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
EXPOSE 8080 8081
ENTRYPOINT ["trainer-metrics"]
