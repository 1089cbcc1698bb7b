#!/usr/bin/env bash
# Build the OCI image from Debian packages and requirements.lock, start it against a simulated cluster
# outside it and check it serves; then build the Dockerfile without a daemon and check it makes the same image:
#   bash image/image-check.sh          (as root; .ci/run runs it; IMAGE_CHECK_DOCKERFILE=0 skips the last part)
# Output in build/image/: oci/ (OCI layout, tag = project version), trainer-metrics.oci.tar, report.json,
# dockerfile-oci/ (the Dockerfile's image). Push with skopeo, e.g.
# `skopeo copy oci:build/image/oci:0.1.0 docker://registry.example.com/trainer-metrics:0.1.0`.
set -euo pipefail
cd "$(dirname "$0")/.."

# Debian's tools: mmdebstrap (root filesystem), umoci (OCI image), crun (OCI runtime; check.py falls back to
# chroot where it cannot run), ip (the check's network namespace), buildah (the Dockerfile, no daemon).
# Installed here so that a fresh machine needs nothing by hand.
declare -A package=([mmdebstrap]=mmdebstrap [umoci]=umoci [crun]=crun [ip]=iproute2 [nsenter]=util-linux)
if [ "${IMAGE_CHECK_DOCKERFILE:-1}" != 0 ]; then package[buildah]=buildah; fi
missing=()
for tool in "${!package[@]}"; do command -v "$tool" >/dev/null || missing+=("${package[$tool]}"); done
if [ "${#missing[@]}" -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  else
    echo "image-check: ${missing[*]} missing and cannot be installed (need root + apt-get)" >&2
    exit 1
  fi
fi

python3 image/build.py "$@"
python3 image/check.py
if [ "${IMAGE_CHECK_DOCKERFILE:-1}" != 0 ]; then
  python3 image/dockerfile_check.py
fi
