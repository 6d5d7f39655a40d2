#!/bin/bash
# The always-on collector's cost on the H200, inside one process per workload (bench/gpu/same_process.py):
# blocks of the same workload process, traced and untraced, interleaved; the workload on WORKLOAD_CPUS,
# the collector on COLLECTOR_CPUS. Carry DEVICE_DIR (default .device2: bcc-bundle.tar.xz, setup-bcc.sh).
#   PAIRS=8 WORKLOADS=launch,train,seed bash bench/gpu/device_same_process.sh
# Everything comes back in one file, $OUT/same-process-<tag>.tar.xz.
set -u
D=${DEVICE_DIR:-.device2}
T0=$(date +%s)
eval "$(bash $D/setup-bcc.sh $D/bcc-bundle.tar.xz)"
export PYTHONPATH=$PWD/src:${PYTHONPATH:-} PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore
export WORKLOAD_CPUS=${WORKLOAD_CPUS:-4} COLLECTOR_CPUS=${COLLECTOR_CPUS:-0-1}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader
echo "setup $(( $(date +%s) - T0 )) s"
sizes=()
for s in ${SIZES:-launch=500000 train=1500 seed=1000000}; do sizes+=(--size "$s"); done
TAG=${SAME_TAG:-run}
W=/tmp/same-process-$TAG; mkdir -p $W
timeout ${SAME_TIMEOUT:-500} python3 bench/gpu/same_process.py "$W" --pairs ${PAIRS:-8} \
  --workloads ${WORKLOADS:-launch,train,seed} "${sizes[@]}" 2>&1 | tee "$W/same-process-run.log" | tail -40
cp /tmp/ingero-same-process/*.log "$W/" 2>/dev/null
tar -C /tmp -cJf "$OUT/same-process-$TAG.tar.xz" "same-process-$TAG"
echo "total $(( $(date +%s) - T0 )) s"
ls -la "$OUT"
