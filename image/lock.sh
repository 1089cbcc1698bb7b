#!/usr/bin/env bash
# Regenerates the hash-pinned lock files from the ranges in pyproject.toml:
#   requirements.lock       runtime dependencies ([project].dependencies): the image installs exactly these
#   requirements-test.lock  the same pins plus the `test` extra, the simulated cluster's dependencies (sim/pyproject.toml)
#                           and the build backend ([build-system].requires):
#                           .ci/run installs exactly these, then the project itself with --no-deps
# Versions already in a lock file are kept (so a re-run changes nothing); pass --upgrade, or
# --upgrade-package NAME, to move them. Both files are universal (any OS, Python >= 3.11) and carry the
# sha256 of every file PyPI has for each pinned version, so pip --require-hashes refuses anything else.
# uv is used only here, in a throwaway virtualenv, pinned: nothing else in the build needs it.
set -euo pipefail
cd "$(dirname "$0")/.."

UV_VERSION=0.13.9
tool=$(mktemp -d)
trap 'rm -rf "$tool"' EXIT
python3 -m venv "$tool/venv"
"$tool/venv/bin/python" -m pip install -q --disable-pip-version-check "uv==$UV_VERSION"
uv="$tool/venv/bin/uv"

common=(--universal --python-version 3.11 --generate-hashes --quiet
        --custom-compile-command "bash image/lock.sh")

"$uv" pip compile pyproject.toml "${common[@]}" "$@" -o requirements.lock

# The build backend comes from [build-system].requires, read here rather than copied into a second file; the
# runtime lock constrains the test lock so both install the same runtime versions.
python3 -c 'import tomllib; print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["build-system"]["requires"]))' |
  "$uv" pip compile pyproject.toml sim/pyproject.toml --extra test - -c requirements.lock "${common[@]}" "$@" \
    -o requirements-test.lock
