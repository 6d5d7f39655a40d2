#!/bin/bash
# The v2 collector's cost on the H200 (issue 7: "not worse than today's"): the launch loop and the
# training-like loop, traced and untraced, interleaved, 5 pairs each (bench/gpu/run_overhead.py).
# Carry: .device (bcc-bundle.tar.xz, setup-bcc.sh), or another folder named by DEVICE_DIR.
set -u
D=${DEVICE_DIR:-.device}
eval "$(bash $D/setup-bcc.sh $D/bcc-bundle.tar.xz)"
export PYTHONPATH=$PWD/src:${PYTHONPATH:-} PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 480 python3 bench/gpu/run_overhead.py "$OUT" --reps ${REPS:-5} --workloads launch,train 2>&1 | tail -25 | tee "$OUT/overhead-v2.log"
ls -la "$OUT"
