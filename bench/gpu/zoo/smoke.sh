#!/bin/bash
# Smoke test of the zoo without a GPU: every scenario (or those named) with --device cpu --scale 0.15
# (short phases, CPU tensors, the same code paths), one at a time, then a check of each truth file:
# complete, window inside the run, culprits alive-looking, the extra fields each scenario owes.
#   bash bench/gpu/zoo/smoke.sh [PYTHON [SCENARIO...]]   PYTHON: one with torch and numpy (default python3)
set -u
cd "$(dirname "$0")/../../.."
PY=${1:-python3}
shift $(( $# > 0 ? 1 : 0 ))
OUT=${ZOO_SMOKE_OUT:-/tmp/zoo-smoke}
rm -rf "$OUT"; mkdir -p "$OUT"
names=("$@")
if [ ${#names[@]} = 0 ]; then
  for f in bench/gpu/zoo/*.py; do
    name=$(basename "$f" .py)
    case $name in common|chain|pack|fold|check_truth|table|timing) continue ;; esac  # not scenarios
    names+=("$name")
  done
fi
fail=0
for name in "${names[@]}"; do
  start=$(date +%s)
  if timeout 120 "$PY" "bench/gpu/zoo/$name.py" --device cpu --scale 0.15 --truth "$OUT/$name.truth.json" \
      > "$OUT/$name.log" 2>&1; then
    echo "ran   $name ($(( $(date +%s) - start )) s)"
  else
    echo "FAIL  $name (rc $?):"; tail -5 "$OUT/$name.log"; fail=1
  fi
done
"$PY" bench/gpu/zoo/check_truth.py "$OUT"/*.truth.json || fail=1
exit $fail
