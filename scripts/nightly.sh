#!/usr/bin/env bash
# The nightly job for one pair, exactly as CI runs it: `make nightly PAIR=<id>` (the workflow
# .github/workflows/nightly-gpu.yml calls that make target, so the two cannot drift).
#
#   doctor -> sweep (pre-flight first) -> predict AV from its OFF twin -> report -> GPU
#   estimator check -> compare with the previous night -> summary
#
# Environment:
#   PAIR       pair id (required)
#   SWEEP      sweep id; default: the nightly* sweep whose `pairs` lists PAIR, else "nightly"
#   RESULTS    where the run directory goes (default results/nightly)
#   BASELINE   previous night's run directory, or a directory holding it (e.g. a downloaded
#              artifact); empty or absent: no comparison
#   PORT       vLLM port (default 8000)
#   TOLERANCE  avbench compare's noise floor (default 0.05)
#   AVBENCH    the avbench executable (default .venv/bin/avbench)
#
# Exit code: the sweep's when it is not 0 (1: cells failed; 2: bad input or pre-flight;
# 4: internal error; 130: interrupted), else 1 when compare finds a cell worse beyond noise,
# else doctor's or report's failure, else 1 when the GPU estimator check fails, else 0.
# Compare finding nothing comparable (first night, or the settings changed) is reported, not a
# failure; so is an estimator check that cannot run here (no GPU).
set -uo pipefail

: "${PAIR:?set PAIR=<pair id>}"
AVBENCH=${AVBENCH:-.venv/bin/avbench}
PY=$(dirname "$AVBENCH")/python
RESULTS=${RESULTS:-results/nightly}
PORT=${PORT:-8000}
TOLERANCE=${TOLERANCE:-0.05}
BASELINE=${BASELINE:-}
if [ -z "${SWEEP:-}" ]; then
  SWEEP=$("$PY" -c '
import sys
from avbench.inputs.suite import load_suite
sweeps = load_suite().sweeps
print(next((n for n, s in sweeps.items() if n.startswith("nightly") and sys.argv[1] in s.pairs), "nightly"))
' "$PAIR") || exit 2
fi
summary=${GITHUB_STEP_SUMMARY:-/dev/null}
echo "nightly: pair $PAIR, sweep $SWEEP, results $RESULTS"

"$AVBENCH" doctor --pair "$PAIR" --sweep "$SWEEP" --results "$RESULTS" || exit $?

run_id="$PAIR-$(date -u +%Y%m%d-%H%M%S)"
run="$RESULTS/$run_id"
"$AVBENCH" sweep --pair "$PAIR" --sweep "$SWEEP" --results "$RESULTS" --run-id "$run_id" \
  --port "$PORT" --no-report
sweep_rc=$?
if [ ! -f "$run/manifest.json" ]; then
  echo "nightly: the sweep stopped before creating $run (exit $sweep_rc)" >&2
  exit "$sweep_rc"
fi

# AV predicted from its OFF twin (avbench predict); against the measured AV arm, the error
# per cell lands in $run/predicted_vs_measured.jsonl: each night calibrates the predictor.
"$AVBENCH" predict "$run" --arms av --markdown "$run/prediction.md" ||
  echo "nightly: no AV prediction for $run" >&2

rc=0
"$AVBENCH" report "$run" || rc=$?
{
  echo "# avbench nightly: $PAIR (sweep $SWEEP, exit $sweep_rc)"
  echo
  [ -f "$run/report.md" ] && cat "$run/report.md"
  echo
  [ -f "$run/prediction.md" ] && cat "$run/prediction.md"
  echo
} >>"$summary"

# vLLM's estimator kernels on this machine's GPU against avbench's numpy estimator, with and
# without the refit capture (scripts/gpu_check_estimator.py; exit 2: cannot run here).
check="$run/estimator-check"
"$PY" "$(dirname "$0")/gpu_check_estimator.py" --out "$check" >"$check.log" 2>&1
check_rc=$?
case $check_rc in
  0) echo "nightly: GPU estimator check passed ($check)" | tee -a "$summary" ;;
  2) echo "nightly: GPU estimator check not run here: $(tail -n 1 "$check.log")" | tee -a "$summary" ;;
  *)
    echo "nightly: GPU estimator check FAILED (exit $check_rc): see $check.log" | tee -a "$summary" >&2
    [ "$rc" -eq 0 ] && rc=1
    ;;
esac

# The newest stored run of this pair under BASELINE (run ids start with the pair and a date).
base=""
if [ -n "$BASELINE" ] && [ -d "$BASELINE" ]; then
  base=$(find "$BASELINE" -maxdepth 3 -name manifest.json -path "*/$PAIR-*/manifest.json" \
    -not -path "$run/*" | sort | tail -n 1)
  base=${base%/manifest.json}
fi
if [ -n "$base" ]; then
  "$AVBENCH" compare "$base" "$run" --tolerance "$TOLERANCE" --markdown "$run/compare.md"
  compare_rc=$?
  cat "$run/compare.md" >>"$summary" 2>/dev/null
  case $compare_rc in
    0) ;;
    1) echo "nightly: REGRESSION against $base" >&2; [ "$sweep_rc" -eq 0 ] && sweep_rc=1 ;;
    3) echo "nightly: nothing comparable in $base (first night or settings changed)" >&2 ;;
    *) rc=$compare_rc ;;
  esac
else
  echo "nightly: no previous run of $PAIR under '${BASELINE:-<unset>}': nothing to compare" |
    tee -a "$summary"
fi

if [ "$sweep_rc" -ne 0 ]; then
  exit "$sweep_rc"
fi
exit "$rc"
