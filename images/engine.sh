#!/usr/bin/env bash
# Prints the DOCKER_HOST of a Docker engine that answers (empty: the default socket), starting the private
# one (lib/common.sh) when none does. `make images-test` runs its tests against it.
set -euo pipefail
# shellcheck source=SCRIPTDIR/lib/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/common.sh"
use_engine
printf '%s\n' "${DOCKER_HOST:-}"
