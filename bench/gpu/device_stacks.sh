#!/bin/bash
# Issue 21 on the H200: the code named where the GPU starved. Two parts, one device call each:
#   bash bench/gpu/device_stacks.sh record     the zoo's host-bound, GIL-holder and checkpoint scenarios, and the
#                                              seed benchmark, traced with stacks at the default rate
#                                              ($OUT/zoo-*.tar, $OUT/seed-stacks.tar.xz)
#   bash bench/gpu/device_stacks.sh overhead   the training loop in one process, blocks untraced, traced without
#                                              stacks (--stack-hz 0) and traced with them (default), interleaved
#                                              ($OUT/same-process-stacks.tar.xz)
# Carry .device (bcc-bundle.tar.xz, setup-bcc.sh, seed_benchmark.py). Workloads on CPUs 4-11, the collector on 12-15.
set -u
cd "$(dirname "$0")/../.."
T0=$(date +%s)
mkdir -p "$OUT"
case ${1:-record} in
record)
  ZOO_MAX_FILES=${ZOO_MAX_FILES:-5} ZOO_BUDGET_S=${ZOO_BUDGET_S:-260} DEVICE_DIR=.device OUT=$OUT \
    bash bench/gpu/zoo/device_zoo.sh ${ZOO_SCENARIOS:-host_bound_prep gil_holder checkpoint_fsync} 2>&1 | tail -25
  eval "$(bash .device/setup-bcc.sh .device/bcc-bundle.tar.xz)"
  export PYTHONPATH=$PWD/src:${PYTHONPATH:-} PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore
  libs=$(python3 -c "import sys; sys.path.insert(0,'bench/gpu'); import run_overhead as r; print(' '.join('--cuda-lib '+l for l in r.cuda_libs()))")
  W=/tmp/seed-stacks; rm -rf $W; mkdir -p $W
  taskset -c 12-15 python3 -m ingero_mcp.cli trace --db $W/seed.duckdb --quiet $libs > $W/collector.log 2>&1 &
  cpid=$!
  for i in $(seq 1 900); do grep -q "recording to" $W/collector.log && break; sleep 0.2; done
  echo "seed: collector ready after $(( $(date +%s) - T0 )) s"
  timeout ${SEED_TIMEOUT:-150} taskset -c 4-11 python3 .device/seed_benchmark.py > $W/seed-benchmark.txt 2>&1
  kill -INT $cpid; wait $cpid
  tail -5 $W/collector.log; cat $W/seed-benchmark.txt | tail -5
  tar -C /tmp -cJf "$OUT/seed-stacks.tar.xz" seed-stacks
  ;;
overhead)
  DEVICE_DIR=.device SAME_TAG=stacks WORKLOAD_CPUS=${WORKLOAD_CPUS:-4} COLLECTOR_CPUS=${COLLECTOR_CPUS:-12-15} \
    WORKLOADS=train SIZES="train=${TRAIN_STEPS:-1500}" PAIRS=${PAIRS:-6} SAME_TIMEOUT=${SAME_TIMEOUT:-480} \
    VARIANTS="nostacks:args=--stack-hz+0 stacks" bash bench/gpu/device_same_process.sh
  ;;
esac
echo "device_stacks $1: $(( $(date +%s) - T0 )) s"
ls -la "$OUT"
