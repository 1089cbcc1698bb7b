#!/usr/bin/env bash
# Build the OCI image from Debian packages and requirements.lock, then start it and check it serves:
#   bash image/image-check.sh          (as root; .ci/run runs it)
# Output in build/image/: oci/ (OCI layout, tag = project version), trainer-metrics.oci.tar, report.json.
# Push it with skopeo, e.g. `skopeo copy oci:build/image/oci:0.1.0 docker://registry.example.com/trainer-metrics:0.1.0`.
set -euo pipefail
cd "$(dirname "$0")/.."

# Debian's tools: mmdebstrap (root filesystem), umoci (OCI image), crun (OCI runtime; check.py falls back to
# chroot where it cannot run). Installed here so that a fresh machine needs nothing by hand.
missing=()
for tool in mmdebstrap umoci crun; do command -v "$tool" >/dev/null || missing+=("$tool"); done
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
