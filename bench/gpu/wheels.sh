#!/usr/bin/env bash
# Download the wheels a GPU machine without network needs for the GPU check into .whl/ (git-ignored; carry it
# along with the working tree). The versions are the lock's, for CPython 3.12 on x86-64 Linux; run.sh installs
# them into a private folder when .whl/ exists. Needs network and pip here, not there.
#
#   bash bench/gpu/wheels.sh [PYTHON_VERSION]      # default 3.12
set -euo pipefail

cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
VERSION=${1:-3.12}
# What the draft and target servers import that such a machine lacked: gRPC and its health service, protobuf
# (the generated stubs check both versions at import).
PACKAGES=(grpcio grpcio-health-checking protobuf)

pins=()
for name in "${PACKAGES[@]}"; do
    pin=$(grep -E "^${name}==" requirements.lock | sed -E 's/[[:space:]].*//')
    [[ -n $pin ]] || { echo "requirements.lock pins no $name" >&2; exit 2; }
    pins+=("$pin")
done
mkdir -p .whl
"$PY" -m pip download --no-deps --only-binary=:all: --python-version "$VERSION" --implementation cp \
    --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
    --dest .whl "${pins[@]}"
ls -la .whl
