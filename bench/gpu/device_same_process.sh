#!/bin/bash
# The always-on collector's cost on the H200, inside one process per workload (bench/gpu/same_process.py):
# blocks of the same workload process, traced and untraced, interleaved; the workload on WORKLOAD_CPUS,
# the collector on COLLECTOR_CPUS. Carry DEVICE_DIR (default .device2: bcc-bundle.tar.xz, setup-bcc.sh).
#   PAIRS=8 WORKLOADS=launch,train,seed bash bench/gpu/device_same_process.sh
# VARIANTS="default far:cpus=12-15 decoy:decoy" runs those traced variants (same_process.py --variant);
# BPF_STATS=1 has the kernel time every eBPF program run (kernel.bpf_stats_enabled) for the whole call.
# A feeder variant ("feed:feeder=20000:args=--max-overhead+off": the collector traces only a stand-in process launching
# 20,000 a second on FEEDER_CPUS, the job's record load without its traps) needs the stand-in built here first:
#   sh tests/standin/build.sh .device2/standin
# Everything comes back in one file, $OUT/same-process-<tag>.tar.xz.
set -u
D=${DEVICE_DIR:-.device2}
T0=$(date +%s)
eval "$(bash $D/setup-bcc.sh $D/bcc-bundle.tar.xz)"
export PYTHONPATH=$PWD/src:${PYTHONPATH:-} PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore
export WORKLOAD_CPUS=${WORKLOAD_CPUS:-4} COLLECTOR_CPUS=${COLLECTOR_CPUS:-0-1}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader
echo "setup $(( $(date +%s) - T0 )) s"
# A warm machine keeps what an earlier call left: a collector or workload outliving its timeout, and segment
# folders the collector refuses to record over. Start clean.
pkill -INT -f 'ingero_mcp.cli|_discover = lambda' 2>/dev/null; pkill -f 'workloads.py blocks' 2>/dev/null; sleep 2
pkill -KILL -f 'ingero_mcp.cli|_discover = lambda' 2>/dev/null; rm -rf /tmp/ingero-same-process
W=/tmp/same-process-${SAME_TAG:-run}; mkdir -p $W
{ lscpu; echo; cat /proc/cmdline; grep -r . /sys/devices/system/cpu/vulnerabilities/ 2>/dev/null
  for c in 0 1 4 12; do echo "cpu$c siblings $(cat /sys/devices/system/cpu/cpu$c/topology/thread_siblings_list 2>/dev/null)"; done
  cat /proc/sys/kernel/perf_event_paranoid; ls /sys/bus/event_source/devices/; nvidia-smi topo -m; } > $W/host.txt 2>&1
[ "${BPF_STATS:-0}" = 1 ] && sysctl -w kernel.bpf_stats_enabled=1
# Huge pages behind the workload's code and heap, every 3 s (a uprobe rewrites a page of the library's text: does the
# process lose a huge-page mapping of it when traced?).
grep -r . /sys/kernel/mm/transparent_hugepage/ > $W/thp-settings.txt 2>&1
( while sleep 3; do p=$(pgrep -f 'workloads.py blocks' | head -1)
    [ -n "$p" ] && echo "$(date +%s.%N) $(grep -E 'Rss|PmdMapped|HugePages' /proc/$p/smaps_rollup | tr -s ' ' | tr '\n' ' ')"
  done >> $W/smaps.log 2>/dev/null ) </dev/null >/dev/null 2>&1 &
SAMPLER=$!
variants=()
for v in ${VARIANTS:-}; do variants+=(--variant "$v"); done
sizes=()
for s in ${SIZES:-launch=500000 train=1500 seed=1000000}; do sizes+=(--size "$s"); done
TAG=${SAME_TAG:-run}
timeout ${SAME_TIMEOUT:-500} python3 bench/gpu/same_process.py "$W" --pairs ${PAIRS:-8} \
  --workloads ${WORKLOADS:-launch,train,seed} "${sizes[@]}" "${variants[@]}" 2>&1 | tee "$W/same-process-run.log" | tail -40
pkill -INT -f 'ingero_mcp.cli|_discover = lambda' 2>/dev/null  # a collector that outlived the timeout
kill $SAMPLER 2>/dev/null
cp /tmp/ingero-same-process/*.log "$W/" 2>/dev/null
tar -C /tmp -cJf "$OUT/same-process-$TAG.tar.xz" "same-process-$TAG"
echo "total $(( $(date +%s) - T0 )) s"
ls -la "$OUT"
