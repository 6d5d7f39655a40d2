#!/bin/bash
# The zoo, recorded on the GPU host: for each scenario, the collector (CPUs 12-15) records while
# the scenario stages its cause; then each scenario's segments + truth + logs are packed into
# at most 7 files $OUT/zoo-<k>.tar (15 MiB each at most) and $OUT/zoo-summary.txt.
#
#   bash bench/gpu/zoo/device_zoo.sh first        cpu_hog workers_oversub gpu_shared gil_holder pageable_copies alloc_churn lock_holder
#   bash bench/gpu/zoo/device_zoo.sh second       host_bound_prep lazy_loading disk_io healthy_gpu_bound healthy_training page_fault_storm
#   bash bench/gpu/zoo/device_zoo.sh third        microbatch slow_pipe_reader cgroup_quota checkpoint_fsync
#                                                 slow_data_server late_cpu_hog tiny_model_gil
#   bash bench/gpu/zoo/device_zoo.sh fourth       gc_pause slow_workers queue_producer rt_neighbor sync_every_op
#                                                 omp_oversub idle_server decoy_hog fsync_logging
#   bash bench/gpu/zoo/device_zoo.sh fifth        producer_thread tcp_metrics_sink workers_disk_reads workers_quota
#                                                 sleep_in_loop many_small_copies healthy_dataloader
#   bash bench/gpu/zoo/device_zoo.sh sixth        shell_out_per_step flock_shared_cache profiler_sigstop mmap_cold_reads
#                                                 respawned_workers lock_over_fsync eval_pass healthy_heartbeat
#   bash bench/gpu/zoo/device_zoo.sh seventh      pin_thread_starved logging_lock_pipe host_register_per_step
#                                                 affinity_narrowed json_gil_thread healthy_disk_neighbor
#   bash bench/gpu/zoo/device_zoo.sh eighth       gloo_straggler healthy_gloo_pair sqlite_commit_per_step threadpool_pure_python
#   bash bench/gpu/zoo/device_zoo.sh ninth        workers_cpu_hogged lock_convoy blas_threads_in_workers healthy_many_threads
#   bash bench/gpu/zoo/device_zoo.sh tenth        d2h_cpu_copy_per_step gil_pool healthy_prefetch_thread
#   bash bench/gpu/zoo/device_zoo.sh eleventh     spin_wait_producer memcg_high_throttle sigprof_sampler healthy_event_poll
#   bash bench/gpu/zoo/device_zoo.sh twelfth      mp_poll_producer healthy_poll_loop signal_storm
#   bash bench/gpu/zoo/device_zoo.sh thirteenth   condvar_timeout_producer busy_spin_consumer niced_trainer_neighbor
#                                                 healthy_two_trainers
#   bash bench/gpu/zoo/device_zoo.sh fourteenth   queue_timeout_producer event_sleepy_producer healthy_queue_timeout
#   bash bench/gpu/zoo/device_zoo.sh fifteenth    future_pool_sleepy host_prep_busy_logger
#   bash bench/gpu/zoo/device_zoo.sh sixteenth    future_pool_busy cond_producer_starved healthy_cond_decoy_hog
#   bash bench/gpu/zoo/device_zoo.sh seventeenth  process_pool_sleepy healthy_cond_fast_decoy
#   bash bench/gpu/zoo/device_zoo.sh eighteenth   pipe_producer_child select_rate_limiter mp_lock_holder
#                                                 healthy_pipe_producer
#   bash bench/gpu/zoo/device_zoo.sh nineteenth   select_poll_producer healthy_epoll_server
#   bash bench/gpu/zoo/device_zoo.sh twentieth    gpu_work_grows gpu_work_grows_polled socket_chain_backend
#                                                 healthy_socket_chain train_thread_hogged
#   bash bench/gpu/zoo/device_zoo.sh twenty_first socket_server_gil polled_wait_cpu_hog train_thread_nosync_hogged
#   bash bench/gpu/zoo/device_zoo.sh natural      natural_lm_loader natural_eval_ckpt (nothing staged: measured)
#   bash bench/gpu/zoo/device_zoo.sh natural2     natural_accum_workers natural_main_thread_prep
#   bash bench/gpu/zoo/device_zoo.sh natural3     natural_infer_server natural_text_collate natural_metrics_logging
#                                                 natural_rnn_unrolled
#   bash bench/gpu/zoo/device_zoo.sh natural4     natural_generate_decode natural_pinned_workers natural_async_checkpoint
#                                                 natural_cpu_eval_metrics
#   bash bench/gpu/zoo/device_zoo.sh natural5     natural_amp_scaler_loop natural_thread_pool_augment
#                                                 natural_gpu_dataset_fast
#   bash bench/gpu/zoo/device_zoo.sh natural6     natural_two_process_gloo natural_tensorboard_like_logger
#                                                 natural_variable_length_batches
#   bash bench/gpu/zoo/device_zoo.sh natural7     natural_cpu_metrics_omp natural_mp_queue_producer
#                                                 natural_rl_env_loop
#   bash bench/gpu/zoo/device_zoo.sh natural8     natural_two_jobs_one_gpu natural_pinned_alloc_per_step
#                                                 natural_cpu_offload_optimizer
#   bash bench/gpu/zoo/device_zoo.sh natural9     natural_nvidia_smi_logger natural_thread_prefetch_python
#                                                 natural_cold_npy_files
#   bash bench/gpu/zoo/device_zoo.sh natural10    natural_empty_cache_per_step natural_gc_token_corpus
#                                                 natural_pageable_h2d_batches
#   bash bench/gpu/zoo/device_zoo.sh natural11    natural_sqlite_metrics_commit natural_pin_memory_thread
#                                                 natural_cuda_graph_replay
#   bash bench/gpu/zoo/device_zoo.sh natural12    natural_numpy_features_main natural_jsonl_single_worker
#                                                 natural_nonzero_masked_loss
#   bash bench/gpu/zoo/device_zoo.sh natural13    natural_epoch_worker_restart natural_zlib_compressed_shards
#                                                 natural_queue_backpressure
#   bash bench/gpu/zoo/device_zoo.sh natural14    natural_ema_on_cpu natural_profiler_left_on
#                                                 natural_big_batches_shm
#   bash bench/gpu/zoo/device_zoo.sh natural15    natural_gil_stats_thread natural_alloc_fraction_limit
#                                                 natural_omp_threads_oversubscribed
#   bash bench/gpu/zoo/device_zoo.sh natural16    natural_subprocess_eval natural_cpu_neighbor_control
#                                                 natural_per_sample_h2d
#   bash bench/gpu/zoo/device_zoo.sh natural17    natural_grad_norm_per_param natural_spawn_workers_each_epoch
#                                                 natural_sync_torch_save_ckpt
#   bash bench/gpu/zoo/device_zoo.sh natural18    natural_http_metrics_push natural_foreach_off_optimizer
#                                                 natural_stream_prefetcher_thread
#   bash bench/gpu/zoo/device_zoo.sh natural19    natural_save_on_cpu_activations natural_manager_dict_counters
#                                                 natural_inherited_one_cpu
#   bash bench/gpu/zoo/device_zoo.sh natural20    natural_two_thread_serving natural_locked_sample_cache
#                                                 natural_healthy_log_rotation
#   bash bench/gpu/zoo/device_zoo.sh natural21    natural_compile_dynamic_shapes natural_png_snapshots_main_thread
#                                                 natural_compiled_healthy
#   bash bench/gpu/zoo/device_zoo.sh natural22    natural_tensor_str_logging natural_anomaly_mode_left_on
#                                                 natural_healthy_textfile_exporter
#   bash bench/gpu/zoo/device_zoo.sh natural23    natural_word2vec_cpu_negatives natural_triplet_mining_cpu
#                                                 natural_healthy_nanogpt_memmap
#   bash bench/gpu/zoo/device_zoo.sh natural24    natural_bpe_collate_main_thread natural_activation_hist_hooks
#                                                 natural_healthy_gpu_hook_stats
#   bash bench/gpu/zoo/device_zoo.sh natural25    natural_flock_hdf5_workers natural_log_queue_fsync_listener
#                                                 natural_healthy_elastic_timer
#   bash bench/gpu/zoo/device_zoo.sh natural26    natural_manager_dict_sample_cache natural_tensor_from_ndarray_list
#                                                 natural_healthy_simclr_busy_workers
#   bash bench/gpu/zoo/device_zoo.sh natural27    natural_pk_sampler_label_scan natural_glob_in_getitem
#                                                 natural_healthy_async_eval_popen
#   bash bench/gpu/zoo/device_zoo.sh natural28    natural_weighted_sampler_epochs natural_sqlite_unindexed_getitem
#                                                 natural_healthy_pde_producer_process
#   bash bench/gpu/zoo/device_zoo.sh natural29    natural_cudnn_benchmark_multiscale natural_arrow_row_access_main
#                                                 natural_healthy_sleepy_fetch_workers
#   bash bench/gpu/zoo/device_zoo.sh natural30    natural_gzip_seek_getitem natural_epoch_loss_list_stats
#                                                 natural_healthy_niced_shard_prep
#   bash bench/gpu/zoo/device_zoo.sh natural31    natural_registry_lock_export natural_pool_map_augment
#                                                 natural_healthy_shard_verify_thread
#   bash bench/gpu/zoo/device_zoo.sh cpu_hog ...  any scenarios by name
#
# Start no scenario after ZOO_BUDGET_S (450) s; $OUT is re-packed after each scenario. Each scenario's
# line in the summary says where its time went (collector start, the scenario before its first phase,
# its phases, after them, the collector's stop, the packing); packing runs on CPU 0 (ZOO_PACK_CPUS),
# which no scenario uses, while the next scenario's collector starts.
# Run from the repository root; carry DEVICE_DIR (default .device: bcc-bundle.tar.xz, setup-bcc.sh, and small/wheels
# if the collector needs wheels the host lacks: see fetch_wheels.sh). Environment knobs, for a
# CPU-only rehearsal: ZOO_ARGS="--device cpu --scale 0.15", ZOO_COLLECTOR_CPUS=0-1, OUT=/tmp/out.
set -u
cd "$(dirname "$0")/../../.."
ZOO=bench/gpu/zoo
OUT=${OUT:-/tmp/zoo-out}
WORK=${ZOO_WORK:-/tmp/zoo}
CCPUS=${ZOO_COLLECTOR_CPUS:-12-15}
ARGS=${ZOO_ARGS:-}
# ZOO_BUDGET_S (default 450): start no scenario later than this many seconds into the call.
PACK_CPUS=${ZOO_PACK_CPUS:-0}
FIRST="cpu_hog workers_oversub gpu_shared gil_holder pageable_copies alloc_churn lock_holder"
SECOND="host_bound_prep lazy_loading disk_io healthy_gpu_bound healthy_training page_fault_storm"
THIRD="microbatch slow_pipe_reader cgroup_quota checkpoint_fsync slow_data_server late_cpu_hog tiny_model_gil"
FOURTH="gc_pause slow_workers queue_producer rt_neighbor sync_every_op omp_oversub idle_server decoy_hog fsync_logging"
FIFTH="producer_thread tcp_metrics_sink workers_disk_reads workers_quota sleep_in_loop many_small_copies healthy_dataloader"
SIXTH="shell_out_per_step flock_shared_cache profiler_sigstop mmap_cold_reads respawned_workers lock_over_fsync eval_pass healthy_heartbeat"
SEVENTH="pin_thread_starved logging_lock_pipe host_register_per_step affinity_narrowed json_gil_thread healthy_disk_neighbor"
EIGHTH="gloo_straggler healthy_gloo_pair sqlite_commit_per_step threadpool_pure_python"
NINTH="workers_cpu_hogged lock_convoy blas_threads_in_workers healthy_many_threads"
TENTH="d2h_cpu_copy_per_step gil_pool healthy_prefetch_thread"
ELEVENTH="spin_wait_producer memcg_high_throttle sigprof_sampler healthy_event_poll"
TWELFTH="mp_poll_producer healthy_poll_loop signal_storm"
THIRTEENTH="condvar_timeout_producer busy_spin_consumer niced_trainer_neighbor healthy_two_trainers"
FOURTEENTH="queue_timeout_producer event_sleepy_producer healthy_queue_timeout"
FIFTEENTH="future_pool_sleepy host_prep_busy_logger"
SIXTEENTH="future_pool_busy cond_producer_starved healthy_cond_decoy_hog"
SEVENTEENTH="process_pool_sleepy healthy_cond_fast_decoy"
EIGHTEENTH="pipe_producer_child select_rate_limiter mp_lock_holder healthy_pipe_producer"
NINETEENTH="select_poll_producer healthy_epoll_server"
TWENTIETH="gpu_work_grows gpu_work_grows_polled socket_chain_backend healthy_socket_chain train_thread_hogged"
TWENTY_FIRST="socket_server_gil polled_wait_cpu_hog train_thread_nosync_hogged"
NATURAL="natural_lm_loader natural_eval_ckpt"
NATURAL2="natural_accum_workers natural_main_thread_prep"
NATURAL3="natural_infer_server natural_text_collate natural_metrics_logging natural_rnn_unrolled"
NATURAL4="natural_generate_decode natural_pinned_workers natural_async_checkpoint natural_cpu_eval_metrics"
NATURAL5="natural_amp_scaler_loop natural_thread_pool_augment natural_gpu_dataset_fast"
NATURAL6="natural_two_process_gloo natural_tensorboard_like_logger natural_variable_length_batches"
NATURAL7="natural_cpu_metrics_omp natural_mp_queue_producer natural_rl_env_loop"
NATURAL8="natural_two_jobs_one_gpu natural_pinned_alloc_per_step natural_cpu_offload_optimizer"
NATURAL9="natural_nvidia_smi_logger natural_thread_prefetch_python natural_cold_npy_files"
NATURAL10="natural_empty_cache_per_step natural_gc_token_corpus natural_pageable_h2d_batches"
NATURAL11="natural_sqlite_metrics_commit natural_pin_memory_thread natural_cuda_graph_replay"
NATURAL12="natural_numpy_features_main natural_jsonl_single_worker natural_nonzero_masked_loss"
NATURAL13="natural_epoch_worker_restart natural_zlib_compressed_shards natural_queue_backpressure"
NATURAL14="natural_ema_on_cpu natural_profiler_left_on natural_big_batches_shm"
NATURAL15="natural_gil_stats_thread natural_alloc_fraction_limit natural_omp_threads_oversubscribed"
NATURAL16="natural_subprocess_eval natural_cpu_neighbor_control natural_per_sample_h2d"
NATURAL17="natural_grad_norm_per_param natural_spawn_workers_each_epoch natural_sync_torch_save_ckpt"
NATURAL18="natural_http_metrics_push natural_foreach_off_optimizer natural_stream_prefetcher_thread"
NATURAL19="natural_save_on_cpu_activations natural_manager_dict_counters natural_inherited_one_cpu"
NATURAL20="natural_two_thread_serving natural_locked_sample_cache natural_healthy_log_rotation"
NATURAL21="natural_compile_dynamic_shapes natural_png_snapshots_main_thread natural_compiled_healthy"
NATURAL22="natural_tensor_str_logging natural_anomaly_mode_left_on natural_healthy_textfile_exporter"
NATURAL23="natural_word2vec_cpu_negatives natural_triplet_mining_cpu natural_healthy_nanogpt_memmap"
NATURAL24="natural_bpe_collate_main_thread natural_activation_hist_hooks natural_healthy_gpu_hook_stats"
NATURAL25="natural_flock_hdf5_workers natural_log_queue_fsync_listener natural_healthy_elastic_timer"
NATURAL26="natural_manager_dict_sample_cache natural_tensor_from_ndarray_list natural_healthy_simclr_busy_workers"
NATURAL27="natural_pk_sampler_label_scan natural_glob_in_getitem natural_healthy_async_eval_popen"
NATURAL28="natural_weighted_sampler_epochs natural_sqlite_unindexed_getitem natural_healthy_pde_producer_process"
NATURAL29="natural_cudnn_benchmark_multiscale natural_arrow_row_access_main natural_healthy_sleepy_fetch_workers"
NATURAL30="natural_gzip_seek_getitem natural_epoch_loss_list_stats natural_healthy_niced_shard_prep"
NATURAL31="natural_registry_lock_export natural_pool_map_augment natural_healthy_shard_verify_thread"
names=()
for a in "$@"; do
  case $a in
    first) names+=($FIRST) ;;
    second) names+=($SECOND) ;;
    third) names+=($THIRD) ;;
    fourth) names+=($FOURTH) ;;
    fifth) names+=($FIFTH) ;;
    sixth) names+=($SIXTH) ;;
    seventh) names+=($SEVENTH) ;;
    eighth) names+=($EIGHTH) ;;
    ninth) names+=($NINTH) ;;
    tenth) names+=($TENTH) ;;
    eleventh) names+=($ELEVENTH) ;;
    twelfth) names+=($TWELFTH) ;;
    thirteenth) names+=($THIRTEENTH) ;;
    fourteenth) names+=($FOURTEENTH) ;;
    fifteenth) names+=($FIFTEENTH) ;;
    sixteenth) names+=($SIXTEENTH) ;;
    seventeenth) names+=($SEVENTEENTH) ;;
    eighteenth) names+=($EIGHTEENTH) ;;
    nineteenth) names+=($NINETEENTH) ;;
    twentieth) names+=($TWENTIETH) ;;
    twenty_first) names+=($TWENTY_FIRST) ;;
    natural) names+=($NATURAL) ;;
    natural2) names+=($NATURAL2) ;;
    natural3) names+=($NATURAL3) ;;
    natural4) names+=($NATURAL4) ;;
    natural5) names+=($NATURAL5) ;;
    natural6) names+=($NATURAL6) ;;
    natural7) names+=($NATURAL7) ;;
    natural8) names+=($NATURAL8) ;;
    natural9) names+=($NATURAL9) ;;
    natural10) names+=($NATURAL10) ;;
    natural11) names+=($NATURAL11) ;;
    natural12) names+=($NATURAL12) ;;
    natural13) names+=($NATURAL13) ;;
    natural14) names+=($NATURAL14) ;;
    natural15) names+=($NATURAL15) ;;
    natural16) names+=($NATURAL16) ;;
    natural17) names+=($NATURAL17) ;;
    natural18) names+=($NATURAL18) ;;
    natural19) names+=($NATURAL19) ;;
    natural20) names+=($NATURAL20) ;;
    natural21) names+=($NATURAL21) ;;
    natural22) names+=($NATURAL22) ;;
    natural23) names+=($NATURAL23) ;;
    natural24) names+=($NATURAL24) ;;
    natural25) names+=($NATURAL25) ;;
    natural26) names+=($NATURAL26) ;;
    natural27) names+=($NATURAL27) ;;
    natural28) names+=($NATURAL28) ;;
    natural29) names+=($NATURAL29) ;;
    natural30) names+=($NATURAL30) ;;
    natural31) names+=($NATURAL31) ;;
    all) names+=($FIRST $SECOND $THIRD $FOURTH $FIFTH $SIXTH $SEVENTH $EIGHTH $NINTH $TENTH) ;;
    *) names+=("$a") ;;
  esac
done
[ ${#names[@]} -gt 0 ] || { echo "usage: $0 first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|thirteenth|fourteenth|fifteenth|sixteenth|seventeenth|eighteenth|nineteenth|twentieth|twenty_first|natural|natural2|natural3|natural4|natural5|natural6|natural7|natural8|natural9|natural10|natural11|natural12|natural13|natural14|natural15|natural16|natural17|natural18|natural19|natural20|natural21|natural22|natural23|natural24|natural25|natural26|natural27|natural28|natural29|natural30|natural31|all|SCENARIO..." >&2; exit 2; }
mkdir -p "$OUT"
rm -rf "$WORK"; mkdir -p "$WORK"
LOG=$WORK/driver.log
T0=$(date +%s)
log() { echo "[zoo +$(( $(date +%s) - T0 ))s] $*" | tee -a "$LOG"; }
clock() { date +%s%3N; }  # ms

D=${DEVICE_DIR:-.device}
if [ -f $D/bcc-bundle.tar.xz ]; then
  eval "$(bash $D/setup-bcc.sh $D/bcc-bundle.tar.xz)"
else
  log "no $D/bcc-bundle.tar.xz: using this machine's BCC"
fi
if ls $D/small/wheels/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $D/small/wheels/*.whl 2>&1 | tail -3
fi
export PYTHONPATH=$PWD/src:/tmp/site:${PYTHONPATH:-} PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore

log "scenarios: ${names[*]} (args: ${ARGS:-none}; collector on CPUs $CCPUS)"
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=name,driver_version,utilization.gpu,memory.used --format=csv,noheader >> "$LOG" 2>&1
else
  log "no nvidia-smi"
fi
python3 -m ingero_mcp.cli check >> "$LOG" 2>&1
python3 -c "import ingero_mcp.collector.tracer" >> "$LOG" 2>&1 || log "LOUD: the collector does not import here (a wheel missing? see fetch_wheels.sh)"
libs=$(python3 -c "import sys; sys.path.insert(0,'bench/gpu'); import run_overhead as r; print(' '.join('--cuda-lib '+l for l in r.cuda_libs()))" 2>>"$LOG")
log "CUDA libraries: ${libs:-none}"
command -v nvidia-smi >/dev/null && nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader >> "$LOG" 2>&1

stop_collector() {  # pid: SIGINT, 60 s to fold/flush, then KILL
  local cpid=$1 i
  kill -INT "$cpid" 2>/dev/null
  for i in $(seq 1 600); do kill -0 "$cpid" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$cpid" 2>/dev/null; then log "collector $cpid still running 60 s after SIGINT: KILL"; kill -KILL "$cpid"; fi
  wait "$cpid" 2>/dev/null
  return $?
}

pack_pid=
pack_one() {  # NAME: its folder as NAME.tar.xz, then $OUT re-packed; in the background on PACK_CPUS
  local name=$1 t=$(clock)
  taskset -c "$PACK_CPUS" sh -c "tar -C '$WORK' -cf - '$name' | xz -6 > '$WORK/$name.tar.xz'" \
    && rm -rf "${WORK:?}/$name"
  taskset -c "$PACK_CPUS" python3 "$ZOO/pack.py" "$WORK" "$OUT" --log "$LOG" --max-files "${ZOO_MAX_FILES:-7}" \
    > /dev/null
  echo "$name $(( $(clock) - t )) ms" >> "$WORK/pack-times"
}
wait_pack() { [ -n "$pack_pid" ] && wait "$pack_pid" 2>/dev/null; pack_pid=; }

run_one() {
  local name=$1 d=$WORK/$1 cpid ready=0 rc crc i t0 t_ready t_launch t_exit t_stopped
  mkdir -p "$d"
  if [ ! -f "$ZOO/$name.py" ]; then log "$name: no such scenario ($ZOO/$name.py)"; return; fi
  t0=$(clock)
  # shellcheck disable=SC2086
  taskset -c "$CCPUS" python3 -m ingero_mcp.cli trace --db "$d/$name.duckdb" --quiet $libs > "$d/collector.log" 2>&1 &
  cpid=$!
  for i in $(seq 1 600); do
    grep -q "recording to" "$d/collector.log" 2>/dev/null && { ready=1; break; }
    kill -0 "$cpid" 2>/dev/null || break
    sleep 0.1
  done
  if [ $ready = 0 ]; then
    log "$name: FAILED: collector not recording after 60 s: $(tail -3 "$d/collector.log" | tr '\n' ' ')"
    stop_collector "$cpid"
    return
  fi
  t_ready=$(clock)
  wait_pack  # the previous scenario's packing ran while this collector started; none runs beside a scenario
  t_launch=$(clock)
  # shellcheck disable=SC2086
  local limit_s=60
  # spawn workers import torch afresh every epoch: ~10 s an epoch under tracing, its warm-up alone ~30 s; a cold
  # inductor compile under tracing may take as long; the weighted sampler's set-up draws 4M indices twice
  case $name in natural_spawn_workers_each_epoch|natural_compile_dynamic_shapes|natural_weighted_sampler_epochs) limit_s=100 ;; esac
  timeout -k 5 $limit_s python3 "$ZOO/$name.py" --truth "$d/$name.truth.json" $ARGS > "$d/scenario.log" 2>&1
  rc=$?
  t_exit=$(clock)
  sleep 1  # the collector's last flush covers the scenario's exit
  stop_collector "$cpid"; crc=$?
  t_stopped=$(clock)
  rm -f /var/tmp/zoo_*  # what a scenario killed by the timeout left behind
  for cgdir in /sys/fs/cgroup/zoo_quota /sys/fs/cgroup/zoo_wquota /sys/fs/cgroup/zoo_mem; do
    [ -d $cgdir ] && rmdir $cgdir 2>/dev/null
  done
  local summary
  summary=$(python3 "$ZOO/timing.py" "$d/$name.truth.json" "$t0" "$t_ready" "$t_launch" "$t_exit" "$t_stopped" \
            2>/dev/null || echo "NO TRUTH")
  log "$name: rc $rc, $summary; collector rc $crc: $(grep -E 'stopped|lost|error' "$d/collector.log" | tail -2 |
    tr '\n' ' ')"
  [ $rc = 0 ] || tail -5 "$d/scenario.log" | sed "s/^/    $name| /" | tee -a "$LOG"
  pack_one "$name" &
  pack_pid=$!
}

# The device call is killed at 10 minutes: no scenario starts after BUDGET s, and what is recorded so
# far is packed into $OUT after every scenario, so a kill still leaves the finished ones there.
BUDGET=${ZOO_BUDGET_S:-450}
for name in "${names[@]}"; do
  if [ $(( $(date +%s) - T0 )) -gt "$BUDGET" ]; then
    log "!!! $name: NOT RUN: ${BUDGET} s budget spent (record it in another call) !!!"
    continue
  fi
  run_one "$name"
done
wait_pack
[ -f "$WORK/pack-times" ] && log "packing (on CPUs $PACK_CPUS, beside the next collector's start):" \
  "$(paste -sd, "$WORK/pack-times")"
log "done; packed:"
python3 "$ZOO/pack.py" "$WORK" "$OUT" --log "$LOG" --max-files "${ZOO_MAX_FILES:-7}"
ls -la "$OUT"
