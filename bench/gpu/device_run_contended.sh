#!/bin/bash
# Second call on the GPU host: the seed benchmark confined to 4 CPUs (taskset), as on a small
# cloud instance, untraced then traced (the collector on the other CPUs), for investigations/;
# then more overhead repetitions of the idle, training-like and seed workloads.
# Carry: .device/bcc-bundle.tar.xz .device/setup-bcc.sh .device/small .device/seed_benchmark.py
set -u
eval "$(bash .device/setup-bcc.sh .device/bcc-bundle.tar.xz)"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .device/small/wheels/*.whl
export PYTHONPATH=$PWD/src:/tmp/site:$PYTHONPATH PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore
ncpu=$(nproc); echo "CPUs: $ncpu"
libs=$(python3 -c "import sys; sys.path.insert(0,'bench/gpu'); import run_overhead as r; print(' '.join('--cuda-lib '+l for l in r.cuda_libs()))")
taskset -c 0-3 python3 .device/seed_benchmark.py 2>&1 | tee $OUT/seed4-untraced.txt
rm -rf /tmp/seed4.duckdb*
taskset -c 4-$((ncpu-1)) python3 -m ingero_mcp.cli trace --db /tmp/seed4.duckdb --quiet $libs > $OUT/seed4-collector.log 2>&1 &
cpid=$!
for i in $(seq 1 600); do grep -q "recording to" $OUT/seed4-collector.log && break; sleep 0.2; done
taskset -c 0-3 python3 .device/seed_benchmark.py 2>&1 | tee $OUT/seed4-traced.txt
kill -INT $cpid; wait $cpid
tail -3 $OUT/seed4-collector.log
tar -C /tmp -cf $OUT/seed4-trace.tar seed4.duckdb.segments
timeout 300 python3 bench/gpu/run_overhead.py $OUT --reps ${REPS:-3} --workloads idle,train,seed 2>&1 | tail -12 | tee $OUT/overhead2.log
ls -la $OUT
