#!/usr/bin/env bash
# The GPU check: one script, six stages, JSON after each stage (so a run that is cut off keeps what it measured).
#
#   bash bench/gpu/run.sh [OUT]        # or: make gpu-check
#
# OUT: the results folder ($OUT when set, as on the device machine; else the argument; else
# bench/gpu/results/<UTC date and time>, or bench/results/gpu-check-<...> for the CPU path). With a visible GPU the stages run at full size (~1B draft and ~8B
# target in bf16, the shipped pair for the lossless checks); without one, or with GPU_CHECK_SMALL=1, they run
# their CPU path (tiny shapes, seconds), which the test suite runs too. Wheels in .whl/ (bench/gpu/wheels.sh
# downloads them) are installed into a private folder first, for machines that lack the gRPC packages.
# Each stage has its own time limit, the whole run GPU_CHECK_TOTAL seconds (default 480); stages.json records
# each stage's exit status and seconds.
set -uo pipefail

cd "$(dirname "$0")/../.." || exit 2
ROOT=$PWD
PY=${PYTHON:-python3}
STARTED=$(date +%s)

if compgen -G ".whl/*.whl" >/dev/null; then
    SITE=${STARSD_WHEEL_SITE:-/tmp/starsd-wheels}
    if ! "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl \
        >"$OUT/pip.log" 2>&1; then
        echo "installing .whl/ failed; see $OUT/pip.log" >&2
    fi
    export PYTHONPATH="$SITE:$ROOT:$ROOT/operator${PYTHONPATH:+:$PYTHONPATH}"
else
    export PYTHONPATH="$ROOT:$ROOT/operator${PYTHONPATH:+:$PYTHONPATH}"
fi
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1

SMALL=()
DEFAULT_OUT=bench/gpu/results/$(date -u +%Y%m%d-%H%M%S)  # tracked: a GPU run's results are committed
if [[ ${GPU_CHECK_SMALL:-0} == 1 ]] || ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    SMALL=(--small)
    DEFAULT_OUT=bench/results/gpu-check-$(date -u +%Y%m%d-%H%M%S)  # git-ignored: the CPU path's are not
fi
OUT=${OUT:-${1:-$DEFAULT_OUT}}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
echo "gpu check -> $OUT (${SMALL[*]:-full size})" >&2

STAGES_JSON="$OUT/stages.json"
echo "[]" >"$STAGES_JSON"

# The whole run ends by STARTED + TOTAL: a stage's limit shrinks to what is left (keeping RESERVE seconds for the
# profile stage), and a stage with under 10 seconds left is skipped.
# GPU_CHECK_LIMIT_SCALE multiplies every stage's limit (a slow, shared CPU runs the small path for minutes).
TOTAL=${GPU_CHECK_TOTAL:-480}
SCALE=${GPU_CHECK_LIMIT_SCALE:-1}
RESERVE=30

# stage NAME LIMIT_SECONDS [extra arguments]: run one stage under its own limit, log it, record how it ended.
stage() {
    local name=$1 limit=$2
    shift 2
    local begin rc left reserve=$RESERVE
    limit=$((limit * SCALE))
    begin=$(date +%s)
    [[ $name == profile ]] && reserve=0
    left=$((STARTED + TOTAL - begin - reserve))
    ((limit > left)) && limit=$left
    if ((limit < 10)); then
        echo "== $name skipped: the run's $TOTAL s are spent" >&2
        limit=0
    fi
    echo "== $name (limit ${limit} s)" >&2
    rc=125
    if ((limit > 0)); then
        timeout -k 20 "$limit" "$PY" -m starsd.bench.gpu_check "$name" --out "$OUT" "${SMALL[@]}" "$@" \
            >"$OUT/$name.out" 2>"$OUT/$name.log"
        rc=$?
    fi
    [[ -f "$OUT/$name.log" ]] && tail -n 3 "$OUT/$name.log" >&2
    "$PY" - "$STAGES_JSON" "$name" "$rc" "$(($(date +%s) - begin))" <<'EOF'
import json, sys
path, name, rc, seconds = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
stages = json.load(open(path))
stages.append({"stage": name, "exit_status": rc, "timed_out": rc in (124, 137), "skipped": rc == 125,
               "seconds": seconds})
json.dump(stages, open(path, "w"), indent=2)
EOF
    echo "   $name: exit $rc after $(($(date +%s) - begin)) s" >&2
}

stage preflight 40
stage correctness 120
stage step 180 --budget "${GPU_CHECK_STEP_BUDGET:-120}"
stage star 90
stage smoke 90
stage profile 30
echo "gpu check done in $(($(date +%s) - STARTED)) s: $OUT/summary.json" >&2
cat "$OUT/summary.json" 2>/dev/null
