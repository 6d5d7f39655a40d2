#!/bin/bash
# The always-on collector's cost on the H200 (issue 10): the default mode (one probe layer, entry-only
# launches, the governor at its default 2 %) traced vs untraced, interleaved pairs, workloads on CPUs
# 4-15 and the collector on CPUs 0-1 (bench/gpu/run_overhead.py). Also the stored estimate of added time
# (tracing_cost) next to the measured slowdown, and each traced run's collector log (probe costs here).
# Carry DEVICE_DIR (default .device2: bcc-bundle.tar.xz, setup-bcc.sh).
#   REPS=5 WORKLOADS=launch,train SIZES="launch=1000000 train=3000" bash bench/gpu/device_overhead_v3.sh
set -u
D=${DEVICE_DIR:-.device2}
T0=$(date +%s)
eval "$(bash $D/setup-bcc.sh $D/bcc-bundle.tar.xz)"
export PYTHONPATH=$PWD/src:${PYTHONPATH:-} PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore
export WORKLOAD_CPUS=${WORKLOAD_CPUS:-4-15} COLLECTOR_CPUS=${COLLECTOR_CPUS:-0-1}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
echo "setup $(( $(date +%s) - T0 )) s"
sizes=()
for s in ${SIZES:-launch=1000000 train=3000}; do sizes+=(--size "$s"); done
# Everything in one file, $OUT/overhead-<tag>.tar.xz (the device call returns at most 8 files).
TAG=${OVERHEAD_TAG:-run}
W=/tmp/overhead-$TAG; mkdir -p $W
timeout ${OVERHEAD_TIMEOUT:-540} python3 bench/gpu/run_overhead.py "$W" --reps ${REPS:-5} \
  --workloads ${WORKLOADS:-launch,train} "${sizes[@]}" 2>&1 | tee "$W/overhead-run.log" | tail -30
cp /tmp/ingero-overhead/*.log "$W/" 2>/dev/null
tar -C /tmp -cJf "$OUT/overhead-$TAG.tar.xz" "overhead-$TAG"
echo "total $(( $(date +%s) - T0 )) s"
ls -la "$OUT"
