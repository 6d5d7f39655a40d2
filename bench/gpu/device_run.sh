#!/bin/bash
# One call on the GPU host: BCC from the carried bundle, the collector's overhead on three workloads
# (traced vs untraced, interleaved), then the seed benchmark traced in full for investigations/.
# Carry: .device/bcc-bundle.tar.xz .device/setup-bcc.sh .device/small (wheels) .device/seed_benchmark.py
set -u
eval "$(bash .device/setup-bcc.sh .device/bcc-bundle.tar.xz)"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .device/small/wheels/*.whl
export PYTHONPATH=$PWD/src:/tmp/site:$PYTHONPATH PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore
nvidia-smi --query-gpu=name,driver_version,utilization.gpu --format=csv,noheader
python3 -m ingero_mcp.cli check 2>&1 | tee $OUT/check.txt
REPS=${REPS:-3}
timeout 420 python3 bench/gpu/run_overhead.py $OUT --reps $REPS 2>&1 | tee $OUT/overhead.log
# The investigation: the full seed benchmark (7M x 100), traced from its first CUDA call.
libs=$(python3 -c "import sys; sys.path.insert(0,'bench/gpu'); import run_overhead as r; print(' '.join('--cuda-lib '+l for l in r.cuda_libs()))")
rm -rf /tmp/seed.duckdb*
python3 -m ingero_mcp.cli trace --db /tmp/seed.duckdb --quiet $libs > $OUT/seed-collector.log 2>&1 &
cpid=$!
for i in $(seq 1 600); do grep -q "recording to" $OUT/seed-collector.log && break; sleep 0.2; done
python3 .device/seed_benchmark.py 2>&1 | tee $OUT/seed-benchmark.txt
kill -INT $cpid; wait $cpid
tail -5 $OUT/seed-collector.log
tar -C /tmp -cf $OUT/seed-trace.tar seed.duckdb.segments $(cd /tmp && ls seed.duckdb 2>/dev/null)
ls -la $OUT
