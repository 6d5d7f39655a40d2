"""Checks zoo ground-truth files: every field there, the cause from the vocabulary, the window and
baseline inside the run and apart, the culprits each scenario must (or must not) name and whose
process they belong to, the extra fields some owe (episodes inside the window, the cgroup record,
the decoys), the step bins adding up. Prints one line per file; exits 1 if any file is wrong.

    python3 bench/gpu/zoo/check_truth.py /tmp/zoo-smoke/*.truth.json
"""

from __future__ import annotations

import json
import sys

CAUSES = {"cpu_contention", "own_workers_cpu", "gpu_shared", "gil_contention", "pageable_copies", "allocator_churn",
          "host_bound_prep", "lazy_module_loading", "disk_io", "page_faults", "lock_contention", "launch_bound",
          "slow_consumer", "cpu_throttled", "network_wait", "input_bound", "python_gc", "excess_sync",
          "own_threads_cpu", "timed_sleep", "subprocess_wait", "file_lock", "stopped_by_signal",
          "lock_held_over_io", "pinning_churn", "straggler", "memory_throttled", "signal_storm", "ipc_lock",
          "gpu_bound", "none", "natural"}
KEYS = {"scenario", "cause", "description", "feeder", "culprits", "window_ns", "baseline_ns", "cpus", "steps",
        "throughput_ratio", "torch", "notes"}
# scenario -> (culprit comm expected, None: any; at least how many); scenarios not listed must name none
CULPRITS = {"cpu_hog": ("hogd", 3), "workers_oversub": ("pt_data_worker", 8), "gpu_shared": ("gpuhog", 1),
            "gil_holder": ("gil_spin", 1), "lock_holder": ("lock_holder", 1), "slow_pipe_reader": ("logsink", 1),
            "slow_data_server": ("datasrv", 1), "late_cpu_hog": ("hogd", 3), "tiny_model_gil": ("gil_spin", 1),
            "slow_workers": ("pt_data_worker", 2), "queue_producer": ("producer", 1), "rt_neighbor": ("rtmon", 1),
            "omp_oversub": (None, 1), "producer_thread": ("batch_prod", 1), "tcp_metrics_sink": ("metricsd", 1),
            "workers_disk_reads": ("pt_data_worker", 2), "shell_out_per_step": (None, 1),
            "flock_shared_cache": ("cachelockd", 1), "profiler_sigstop": ("pyspyd", 1),
            "respawned_workers": ("pt_data_worker", 4), "lock_over_fsync": ("ckpt_saver", 1),
            "pin_thread_starved": ("hogd", 3), "logging_lock_pipe": ("logsink", 1), "affinity_narrowed": (None, 1),
            "json_gil_thread": ("ckpt_meta", 1), "gloo_straggler": ("peer_rank1", 1),
            "threadpool_pure_python": ("prep_pool", 1), "workers_cpu_hogged": ("hogd", 4),
            "lock_convoy": ("metric_w", 1), "blas_threads_in_workers": ("pt_data_worker", 2),
            "gil_pool": ("py_task", 1), "spin_wait_producer": ("batch_spin", 1),
            "mp_poll_producer": ("mp_prod", 1), "signal_storm": ("sigstorm", 1),
            "condvar_timeout_producer": ("batch_cv", 1), "busy_spin_consumer": ("batch_bz", 1),
            "niced_trainer_neighbor": ("indexer", 1), "queue_timeout_producer": ("batch_qt", 1),
            "event_sleepy_producer": ("batch_ev", 1), "future_pool_sleepy": ("fetch_pool", 1),
            "future_pool_busy": ("fetch_busy", 1), "cond_producer_starved": ("hogd", 3),
            "process_pool_sleepy": ("fetch_proc", 2), "pipe_producer_child": ("pipeprod", 1),
            "mp_lock_holder": ("shmlockd", 1), "select_poll_producer": ("batch_sel", 1),
            "socket_chain_backend": ("hogd", 3), "train_thread_hogged": ("hogd", 3),
            "socket_server_gil": ("srv_spin", 1), "polled_wait_cpu_hog": ("hogd", 3),
            "train_thread_nosync_hogged": ("hogd", 3)}
# culprits that are threads of the feeder's own process
SAME_PROCESS = {"gil_holder", "lock_holder", "tiny_model_gil", "omp_oversub", "producer_thread", "lock_over_fsync",
                "affinity_narrowed", "json_gil_thread", "threadpool_pure_python",
                "lock_convoy", "gil_pool", "spin_wait_producer",
                "condvar_timeout_producer", "busy_spin_consumer", "queue_timeout_producer",
                "event_sleepy_producer", "future_pool_sleepy", "future_pool_busy", "select_poll_producer"}
# scenario -> extra fields its truth must carry
EXTRA = {"checkpoint_fsync": ("episodes_ns",), "gc_pause": ("episodes_ns",), "eval_pass": ("episodes_ns",),
         "cgroup_quota": ("cgroup",), "workers_quota": ("cgroup",), "memcg_high_throttle": ("cgroup",),
         "decoy_hog": ("decoys",)}


def check(t: dict) -> list[str]:
    bad = [f"missing {k}" for k in sorted(KEYS - t.keys())]
    if bad:
        return bad
    if t["cause"] not in CAUSES:
        bad.append(f"cause {t['cause']!r} not in the vocabulary")
    f = t["feeder"]
    if not (f.get("pid") and f.get("tid") and f.get("comm")):
        bad.append(f"feeder incomplete: {f}")
    steps = t["steps"]
    t0, counts = steps["t0_ns"], steps["counts"]
    end = t0 + len(counts) * steps["bin_ns"]
    if sum(counts) != steps.get("total", sum(counts)) or sum(counts) == 0:
        bad.append(f"step bins add to {sum(counts)}, total {steps.get('total')}")
    b = t["baseline_ns"]
    if not (t0 <= b[0] < b[1] <= end):
        bad.append(f"baseline {b} outside the run [{t0}, {end}]")
    w = t["window_ns"]
    if t["cause"] in ("none", "natural"):  # natural: nothing staged, the script measured itself ("self")
        if w is not None:
            bad.append("a control with a window")
        if t["cause"] == "natural" and not (isinstance(t.get("self"), dict) and t["self"]):
            bad.append("a natural job without its own measures (self)")
    else:
        if not w or not (t0 <= w[0] < w[1] <= end):
            bad.append(f"window {w} outside the run")
        elif not (w[0] >= b[1] or w[1] <= b[0]):
            bad.append("window and baseline overlap")
    bad += check_culprits(t)
    bad += check_extra(t)
    if t["throughput_ratio"] is None:
        bad.append("no throughput_ratio")
    return bad


def check_culprits(t: dict) -> list[str]:
    """The culprits a scenario must name (comm, how many, whose process), or none."""
    bad: list[str] = []
    want = CULPRITS.get(t["scenario"])
    culprits = t["culprits"]
    if want:
        comm, n = want
        names = [c.get("comm") for c in culprits]
        if len(culprits) < n or (comm and any(c != comm for c in names)) or not all(names):
            bad.append(f"culprits {names}: want >= {n} named {comm or 'anything'}")
        for c in culprits:
            if not c.get("pid") or not c.get("tids"):
                bad.append(f"culprit without pid/tids: {c}")
            same = c.get("pid") == t["feeder"].get("pid")
            if same != (t["scenario"] in SAME_PROCESS):
                where = "in" if same else "outside"
                bad.append(f"culprit {c.get('comm')} {c.get('pid')}: {where} the feeder's process")
            if same and t["feeder"].get("tid") in c.get("tids", []):
                bad.append(f"culprit {c.get('comm')}: its tids include the feeder's own")
    elif culprits:
        bad.append(f"culprits {culprits}: this scenario names none")
    return bad


def check_extra(t: dict) -> list[str]:
    """The extra fields: episodes_ns (each inside the window), cgroup (where and what quota), decoys."""
    bad = [f"missing {k}" for k in EXTRA.get(t["scenario"], ()) if k not in t]
    w = t["window_ns"]
    episodes = t.get("episodes_ns")
    if episodes is not None:
        if not episodes:
            bad.append("episodes_ns empty")
        for ep in episodes:
            if not (len(ep) == 2 and ep[0] < ep[1] and w and w[0] <= ep[0] and ep[1] <= w[1]):
                bad.append(f"episode {ep} not inside the window {w}")
    cg = t.get("cgroup")
    if cg is not None:
        limit = "high_bytes" if t["scenario"] == "memcg_high_throttle" else "quota"  # a memory limit, or a CPU quota
        if not isinstance(cg, dict) or not cg.get("path") or "applied" not in cg or (cg["applied"] and limit not in cg):
            bad.append(f"cgroup {cg}: want path, applied, {limit}")
        elif cg["applied"] and limit == "quota" and not (cg.get("cpu_stat_before") and cg.get("cpu_stat_after")):
            bad.append("cgroup applied but no cpu.stat before/after the window")
        elif cg["applied"] and limit == "high_bytes" and not (cg.get("events_before") and cg.get("events_after")):
            bad.append("cgroup applied but no memory.events before/after the window")
        elif not cg["applied"] and "cgroup" not in t["notes"]:
            bad.append("cgroup quota not applied and the notes do not say why")
    for d in t.get("decoys", []):
        if not (d.get("pid") and d.get("tids") and d.get("comm") and d.get("span_ns")):
            bad.append(f"decoy incomplete: {d}")
    return bad


def main(paths: list[str]) -> int:
    failed = 0
    for path in paths:
        t = json.load(open(path))
        bad = check(t)
        failed += bool(bad)
        w = t.get("window_ns")
        span = f"window {(w[1] - w[0]) / 1e9:.2f} s" if w else "no window"
        print(f"{'BAD ' if bad else 'ok  '} {t.get('scenario', path):18s} {t.get('cause', '?'):20s} {span:15s} "
              f"ratio {t.get('throughput_ratio')}  culprits "
              f"{[(c.get('comm'), c.get('pid')) for c in t.get('culprits', [])][:3]}"
              + ("".join(f"\n       {b}" for b in bad)))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
