"""natural_manager_dict_counters (natural, nothing staged): a training loop that keeps its shared run state in a
multiprocessing.Manager() dict and list, as teams do to let a monitor process follow the run: the zoo's MLP
(512-2048-2048-2048-10, batch 4096, fp32 without TF32, fused AdamW, batches on the GPU) whose every step reads
state["stop"] (has the monitor asked to stop?), increments state["step"] and state["samples"] (a read and a write each)
and appends the loss (loss.item(), a float) to a managed list: 6 proxy accesses a step, each a round trip over a Unix
socket to the manager's server process (a child the Manager forked, serving each client connection on a thread of its
own). A monitor child process (multiprocessing.Process, started by the job; OS name run_monitor) polls state["step"]
every 10 ms and, every 50 steps, reads the whole loss list (list(losses)) and writes a moving average of the last 100
losses to state["loss_ma"]. Both children are started before CUDA is initialised (fork) and inherit the job's CPUs 2-3;
20 s.

The script measures itself: the steps per second; the main thread's time queueing the step, in loss.item() and in the
proxy accesses (wall, and its CPU clock there by thread_time: what pickling and the socket cost it; the rest is its wait
for the manager's replies), the accesses per second; the main thread's time on a CPU and waiting for one
(/proc/thread-self/schedstat) over the run; the process's minor page faults and the device allocator's cudaMalloc
calls; a step's GPU time queued (common.gpu_seconds_queued), so that the GPU's busy share is known; and the manager's
and the monitor's CPU time and run-queue wait over the run (their tasks' schedstat), the monitor's whole-list reads.
Truth `manager` and `monitor` name the children (pid, tids, comm)."""

import multiprocessing
import os
import resource
import threading
import time

from common import Scenario, Trainer, comm_of, gpu_seconds_queued, set_thread_name, tids_of

BATCH, EVERY = 4096, 50


def monitor(state, losses) -> None:
    """The monitor: every 50 steps the whole loss list, its moving average back into the shared state."""
    set_thread_name("run_monitor")
    last = 0
    while not state["stop"]:
        step = state["step"]
        if step >= last + EVERY:
            values = list(losses)
            recent = values[-100:]
            state["loss_ma"] = sum(recent) / max(len(recent), 1)
            state["monitor_reads"] += 1
            last = step
        else:
            time.sleep(0.01)


if __name__ == "__main__":
    sc = Scenario("natural_manager_dict_counters", "natural", "the MLP keeping its run state in a "
                  "multiprocessing.Manager() dict and list (stop flag, counters, every loss via .item()) read by a "
                  "monitor process every 50 steps: 6 proxy round trips to the manager a step, 20 s, nothing staged",
                  job_cpus=[2, 3], control=True)
    manager = multiprocessing.Manager()  # before CUDA: the server process is forked
    state = manager.dict(stop=False, step=0, samples=0, loss_ma=None, monitor_reads=0)
    losses = manager.list()
    mon = multiprocessing.Process(target=monitor, args=(state, losses), name="run_monitor", daemon=True)
    mon.start()
    mgr_pid = manager._process.pid
    tr = Trainer(sc, batch=BATCH)
    torch = tr.torch
    model, opt, loss_fn = tr.model, tr.opt, tr.loss_fn
    own = {"steps": 0, "issue_s": 0.0, "item_s": 0.0, "proxy_s": 0.0, "proxy_cpu_s": 0.0, "accesses": 0,
           "stopped_early": 0}

    def step() -> None:
        t0 = time.perf_counter()
        i = tr.i
        tr.i += 1
        x, y = tr.xs[i % len(tr.xs)], tr.ys[i % len(tr.ys)]
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        t1 = time.perf_counter()
        v = loss.item()
        t2, c2 = time.perf_counter(), time.thread_time()
        if state["stop"]:
            own["stopped_early"] += 1
        state["step"] += 1
        state["samples"] += tr.batch
        losses.append(v)
        t3 = time.perf_counter()
        own["issue_s"] += t1 - t0
        own["item_s"] += t2 - t1
        own["proxy_s"] += t3 - t2
        own["proxy_cpu_s"] += time.thread_time() - c2
        own["accesses"] += 6
        own["steps"] += 1

    def schedstat(path: str) -> tuple[float, float] | None:
        try:
            with open(path) as fh:
                run, wait = fh.read().split()[:2]
            return int(run) / 1e9, int(wait) / 1e9
        except (OSError, ValueError):
            return None

    def process_schedstat(pid: int) -> dict[int, tuple[float, float]]:
        got = {t: schedstat(f"/proc/{pid}/task/{t}/schedstat") for t in tids_of(pid)}
        return {t: s for t, s in got.items() if s}

    def delta(a: dict, b: dict, k: int) -> float:
        return round(sum(v[k] - (a.get(t) or (0.0, 0.0))[k] for t, v in b.items()), 4)

    def mallocs() -> int:
        return int(torch.cuda.memory_stats().get("segment.all.allocated", 0)) if sc.cuda else 0

    try:
        for _ in range(100):  # warm-up: the allocator, the monitor's first reads
            step()
        tr.sync()
        gpu_step_s = None
        if sc.cuda:
            def work(_) -> None:
                """One step's GPU work (forward, backward, the optimiser), nothing read back."""
                loss_fn(model(tr.xs[0]), tr.ys[0]).backward()
                opt.step()
                opt.zero_grad(set_to_none=True)

            runs = sorted(r for r in (gpu_seconds_queued(torch, work) for _ in range(5)) if r is not None)
            gpu_step_s = runs[len(runs) // 2] if runs else None
        warm_end = time.perf_counter() + 2.0 * sc.scale  # the spin kernels well before the run
        while time.perf_counter() < warm_end:
            step()
        tr.sync()
        for k in own:
            own[k] = 0 if isinstance(own[k], int) else 0.0
        reads0 = state["monitor_reads"]
        mgr0, mon0 = process_schedstat(mgr_pid), process_schedstat(mon.pid)
        main0 = schedstat("/proc/thread-self/schedstat")
        f0, m0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, mallocs()
        b0 = sc.mark("baseline")
        t = time.perf_counter()
        sc.run_for(10.0 * sc.scale, step)
        mid = sc.mark("half")
        sc.run_for(10.0 * sc.scale, step)
        tr.sync()
        b1 = sc.mark("end")
        wall = time.perf_counter() - t
        main1 = schedstat("/proc/thread-self/schedstat")
        f1, m1 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, mallocs()
        mgr1, mon1 = process_schedstat(mgr_pid), process_schedstat(mon.pid)
        reads = state["monitor_reads"] - reads0
        list_len = len(losses)
        mgr_tids, mon_tids = sorted(set(mgr0) | set(mgr1)), sorted(set(mon0) | set(mon1))
        mgr_comm, mon_comm = comm_of(mgr_pid), comm_of(mon.pid)
        state["stop"] = True
        mon.join(5)
        mon_alive = mon.is_alive()
    finally:
        if mon.is_alive():
            mon.terminate()
            mon.join(5)
        manager.shutdown()

    n = own["steps"]

    def share(v: float | None) -> float | None:
        return round(v / wall, 4) if v is not None else None

    main_run = round(main1[0] - main0[0], 4) if main0 and main1 else None
    main_wait = round(main1[1] - main0[1], 4) if main0 and main1 else None
    main_asleep = max(0.0, wall - (main_run or 0.0) - (main_wait or 0.0))
    gpu_busy = n * gpu_step_s if gpu_step_s is not None else None
    proxy_off = max(0.0, own["proxy_s"] - own["proxy_cpu_s"])
    mgr_run, mgr_wait = delta(mgr0, mgr1, 0), delta(mgr0, mgr1, 1)
    mon_run, mon_wait = delta(mon0, mon1, 0), delta(mon0, mon1, 1)
    sc.extra["manager"] = {"pid": mgr_pid, "tids": mgr_tids or [mgr_pid], "comm": mgr_comm}
    sc.extra["monitor"] = {"pid": mon.pid, "tids": mon_tids or [mon.pid], "comm": mon_comm or "run_monitor",
                           "alive_at_end": mon_alive}
    sc.extra["self"] = {**{k: round(v, 4) for k, v in own.items()}, "wall_s": round(wall, 4),
                        "steps_per_s": round(n / wall, 2), "accesses_per_s": round(own["accesses"] / wall, 1),
                        "step_ms_mean": round(wall / max(n, 1) * 1e3, 4),
                        "access_us_mean": round(own["proxy_s"] / max(own["accesses"], 1) * 1e6, 2),
                        "issue_share": share(own["issue_s"]), "item_share": share(own["item_s"]),
                        "proxy_share": share(own["proxy_s"]), "proxy_cpu_share": share(own["proxy_cpu_s"]),
                        "proxy_off_cpu_s": round(proxy_off, 4), "proxy_off_cpu_share": share(proxy_off),
                        "main_run_s": main_run, "main_cpu_share": share(main_run),
                        "main_cpu_wait_s": main_wait, "main_cpu_wait_share": share(main_wait),
                        "main_asleep_s": round(main_asleep, 4), "main_asleep_share": share(main_asleep),
                        "minor_faults_per_s": round((f1 - f0) / wall, 1),
                        "cuda_mallocs_per_s": round((m1 - m0) / wall, 3),
                        "gpu_step_ms": round(gpu_step_s * 1e3, 4) if gpu_step_s is not None else None,
                        "gpu_busy_s": round(gpu_busy, 4) if gpu_busy is not None else None,
                        "gpu_busy_share": share(gpu_busy),
                        "manager_pid": mgr_pid, "manager_run_s": mgr_run, "manager_cpu_share": share(mgr_run),
                        "manager_cpu_wait_s": mgr_wait, "manager_cpu_wait_share": share(mgr_wait),
                        "monitor_pid": mon.pid, "monitor_run_s": mon_run, "monitor_cpu_share": share(mon_run),
                        "monitor_cpu_wait_s": mon_wait, "monitor_cpu_wait_share": share(mon_wait),
                        "monitor_list_reads": reads, "loss_list_len": list_len, "batch": tr.batch,
                        "main_tid": threading.get_native_id(), "pid": os.getpid()}
    if not sc.cuda:
        sc.note("the MLP shrunk on the CPU: no GPU timings, no allocator counters.")
    sc.note(f"natural: measured by the script: {n} steps ({n / wall:.1f}/s) in {wall:.2f} s: {own['issue_s']:.2f} s "
            f"queueing the steps, {own['item_s']:.2f} s in .item(), {own['proxy_s']:.2f} s in {own['accesses']} proxy "
            f"accesses ({own['proxy_cpu_s']:.2f} s of the main thread's CPU in them); the main thread ran "
            f"{main_run} s, waited for a CPU {main_wait} s; the manager (pid {mgr_pid}) ran {mgr_run:.2f} s, the "
            f"monitor (pid {mon.pid}) {mon_run:.2f} s ({reads} whole-list reads); "
            + (f"a step's kernels take {gpu_step_s * 1e3:.2f} ms of GPU time queued (GPU busy {gpu_busy / wall:.0%} "
               "of the run)." if gpu_busy is not None else "no GPU timings (no CUDA)."))
    sc.write_truth(baseline=(b0, b1), window=None, ratio_spans=((b0, mid), (mid, b1)))
