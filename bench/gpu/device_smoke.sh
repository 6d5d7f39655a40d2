#!/bin/bash
# Short check on the GPU host that the committed collector still records real PyTorch: the seed
# benchmark at 2M samples, traced from its first CUDA call; prints what was stored and lost.
set -u
eval "$(bash .device/setup-bcc.sh .device/bcc-bundle.tar.xz)"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .device/small/wheels/*.whl
export PYTHONPATH=$PWD/src:/tmp/site:$PYTHONPATH PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore
libs=$(python3 -c "import sys; sys.path.insert(0,'bench/gpu'); import run_overhead as r; print(' '.join('--cuda-lib '+l for l in r.cuda_libs()))")
python3 -m ingero_mcp.cli trace --db /tmp/smoke.duckdb --quiet $libs > $OUT/smoke-collector.log 2>&1 &
cpid=$!
for i in $(seq 1 600); do grep -q "recording to" $OUT/smoke-collector.log && break; sleep 0.2; done
python3 .device/seed_benchmark.py 2000000 2>&1 | tee $OUT/smoke-benchmark.txt
kill -INT $cpid; wait $cpid
cat $OUT/smoke-collector.log
tar -C /tmp -cf $OUT/smoke-trace.tar smoke.duckdb.segments
