"""Collector overhead on a real GPU: each workload run traced and untraced, interleaved, several times.

Run on the GPU host (see bench/gpu/device_run.sh). For each repetition and workload it runs the
pair in alternating order (untraced first on even reps, traced first on odd ones) so that drift
(clocks, page cache) does not favour one side. A traced run starts `ingero-mcp trace` with the
CUDA libraries forced (so the workload is traced from its first call), waits until the collector
says it is recording, runs the workload, stops the collector with SIGINT, and reads what it
recorded from its Parquet segments: CUDA calls stored, events lost, the collector's own CPU time.

    python3 bench/gpu/run_overhead.py OUTDIR [--reps 3]
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pyarrow.dataset as ds

HERE = Path(__file__).resolve().parent
WORKLOADS: list[tuple[str, int]] = [("idle", 5), ("launch", 200_000), ("train", 300), ("seed", 2_000_000)]


def cuda_libs() -> list[str]:
    """The libcudart that torch loads and the driver's libcuda, as real files (or $CUDA_LIBS, colon-separated:
    a dry run against the stand-ins)."""
    if os.environ.get("CUDA_LIBS"):
        return os.environ["CUDA_LIBS"].split(":")
    import torch  # noqa: F401 - loads the libraries so their paths resolve

    found: list[str] = []
    for pattern in ("/opt/torch/.venv/lib/python3*/site-packages/nvidia/cu13/lib/libcudart.so.13",
                    f"{os.path.dirname(sys.executable)}/../lib/python3*/site-packages/nvidia/cu*/lib/libcudart.so.*"):
        hits = sorted(glob.glob(pattern))
        if hits:
            found.append(os.path.realpath(hits[0]))
            break
    drivers = sorted(p for p in glob.glob("/usr/local/nvidia/lib64/libcuda.so.*") if not os.path.islink(p))
    drivers = drivers or sorted(glob.glob("/usr/lib/x86_64-linux-gnu/libcuda.so.*"))
    if drivers:
        found.append(os.path.realpath(drivers[-1]))
    return found


# CPU pinning (env): the workload and the collector on separate CPUs, so what is measured is the probes'
# cost on the workload's own threads, not two processes competing for one CPU.
WORKLOAD_CPUS = os.environ.get("WORKLOAD_CPUS")
COLLECTOR_CPUS = os.environ.get("COLLECTOR_CPUS")
COLLECTOR_ARGS = os.environ.get("COLLECTOR_ARGS", "").split()


def _pin(cpus: str | None) -> list[str]:
    return ["taskset", "-c", cpus] if cpus else []


def run_workload(name: str, size: int) -> dict:
    proc = subprocess.run([*_pin(WORKLOAD_CPUS), sys.executable, str(HERE / "workloads.py"), name, str(size)],
                          capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        raise RuntimeError(f"workload {name} failed: {proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# The collector with library discovery turned off: it probes only its --cuda-lib files (a bench's decoy copies)
# while --pid still gives the workload's threads their scheduler records.
_NO_DISCOVERY = ("import sys; from ingero_mcp.collector.tracer import Tracer; Tracer._discover = lambda self: None; "
                 "from ingero_mcp.cli import main; sys.exit(main())")


def start_collector(db: Path, libs: list[str], log: Path, cpus: str | None = None,
                    args: list[str] | None = None, *, discover: bool = True) -> subprocess.Popen:
    """`ingero-mcp trace` on `cpus` with `args` (default: $COLLECTOR_CPUS, $COLLECTOR_ARGS), once it is recording;
    discover=False probes only `libs`, not the libraries the traced processes map."""
    entry = ["-m", "ingero_mcp.cli"] if discover else ["-c", _NO_DISCOVERY]
    cmd = [*_pin(cpus or COLLECTOR_CPUS), sys.executable, *entry, "trace", "--db", str(db), "--quiet",
           *(COLLECTOR_ARGS if args is None else args)]
    for lib in libs:
        cmd += ["--cuda-lib", lib]
    fh = log.open("w")
    proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if "recording to" in log.read_text():
            return proc
        if proc.poll() is not None:
            raise RuntimeError(f"collector exited early:\n{log.read_text()[-3000:]}")
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"collector not ready after 180 s:\n{log.read_text()[-3000:]}")


def stop_collector(proc: subprocess.Popen) -> float:
    """SIGINT, wait, and return the collector's CPU seconds (user + system)."""
    proc.send_signal(signal.SIGINT)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            proc.returncode = os.waitstatus_to_exitcode(status)
            return usage.ru_utime + usage.ru_stime
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError("collector did not stop within 120 s of SIGINT")


def traced(db: Path, libs: list[str], run: Callable[[], dict], cpus: str | None = None,
           args: list[str] | None = None, *, discover: bool = True) -> dict:
    """`run` (a workload, or one block of it) under a collector started before it and stopped after it; its
    result with what the collector stored and the estimate for its timed window. The log: db's name + .log."""
    collector = start_collector(db, libs, db.with_suffix(".log"), cpus, args, discover=discover)
    try:
        before, programs, switches = _cpu_s(collector.pid), _bpf_programs(collector.pid), _switches(collector.pid)
        entry = run()
        entry["collector_cpu_during_s"] = _cpu_s(collector.pid) - before  # its own load while the job ran
        entry["collector_switches_during"] = _switches(collector.pid) - switches  # its wake-ups, about
        after = _bpf_programs(collector.pid)
        entry["bpf_runs_during"] = {tag: [after[tag][0] - cnt, after[tag][1] - ns]
                                    for tag, (cnt, ns) in programs.items()
                                    if tag in after and after[tag][0] > cnt}
    finally:
        cpu_s = stop_collector(collector)
    entry["collector_cpu_s"] = cpu_s
    entry.update(recorded(db, entry))
    entry["estimated_added_s"] = estimated_in(entry)
    return entry


def _bpf_programs(pid: int) -> dict[str, tuple[int, int]]:
    """The runs and run time (ns) of each eBPF program a process holds, by tag (/proc/PID/fdinfo; the times
    only with kernel.bpf_stats_enabled=1). The collector's notes name each tag (bpf_run_stats)."""
    from ingero_mcp.collector.tracer import bpf_prog_info

    programs = {}  # by id: one program may be held by more than one fd, counted once
    for fd in os.listdir(f"/proc/{pid}/fdinfo"):
        info = bpf_prog_info(Path(f"/proc/{pid}/fdinfo/{fd}"))
        if info:
            programs[info["id"] or fd] = info
    out: dict[str, tuple[int, int]] = {}
    for info in programs.values():
        cnt, ns = out.get(info["tag"], (0, 0))
        out[info["tag"]] = (cnt + info["run_cnt"], ns + info["run_time_ns"])
    return out


def _switches(pid: int) -> int:
    """Context switches of all a process's threads so far (voluntary ones are its wake-ups from sleep)."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            text = Path(f"/proc/{pid}/task/{tid}/status").read_text()
        except OSError:
            continue
        total += sum(int(line.split()[1]) for line in text.splitlines() if "ctxt_switches:" in line)
    return total


def _cpu_s(pid: int) -> float:
    """A process's CPU seconds so far, all its threads (user + system, /proc/PID/stat)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def recorded(db: Path, window: dict | None = None) -> dict:
    """Rows and losses the collector stored, read from its segments (or the folded file). With `window`
    (a workload's result: t0_ns, t1_ns, pid), also the probe hits inside it: that process's entry-only
    and complete rows timed within the window (what tracing_cost counts, per second)."""
    seg = Path(f"{db}.segments")
    out: dict = {}
    if window and seg.is_dir() and (seg / "cuda_calls").is_dir():
        import pyarrow.compute as pc

        calls = ds.dataset(str(seg / "cuda_calls"), format="parquet").to_table(columns=["ts_ns", "duration_ns", "pid"])
        inside = pc.and_(pc.and_(pc.greater_equal(calls["ts_ns"], window["t0_ns"]),
                                 pc.less(calls["ts_ns"], window["t1_ns"])),
                         pc.equal(calls["pid"], window.get("pid", -1)))
        hit = calls.filter(inside)
        out["window_entry_hits"] = hit["duration_ns"].null_count
        out["window_entry_return_hits"] = hit.num_rows - hit["duration_ns"].null_count
        if (seg / "host_aggregates").is_dir():  # the process's page allocations (it idles outside its blocks)
            agg = ds.dataset(str(seg / "host_aggregates"), format="parquet").to_table(columns=["pid", "op", "count"])
            mine = agg.filter(pc.and_(pc.equal(agg["pid"], window.get("pid", -1)),
                                      pc.equal(agg["op"], "mm_page_alloc")))
            out["window_page_allocs"] = int(pc.sum(mine["count"]).as_py() or 0)
        if (seg / "sched_intervals").is_dir():
            off = ds.dataset(str(seg / "sched_intervals"), format="parquet").to_table(columns=["pid", "off_ns"])
            out["window_off_cpu_intervals"] = off.filter(pc.and_(pc.and_(
                pc.greater_equal(off["off_ns"], window["t0_ns"]), pc.less(off["off_ns"], window["t1_ns"])),
                pc.equal(off["pid"], window.get("pid", -1)))).num_rows
    if not seg.is_dir() and db.exists():  # folded: DuckDB is installed here (a dry run off the GPU host)
        import duckdb

        con = duckdb.connect(str(db), read_only=True)
        ops = dict(con.execute("SELECT op, count(*) FROM cuda_calls GROUP BY op").fetchall())
        lost = con.execute("SELECT coalesce(sum(events_lost), 0) FROM collector_stats").fetchall()[0][0]
        out = {"cuda_calls": sum(ops.values()), "ops": ops, "lost": int(lost)}
        out["tracing_cost"] = con.execute("SELECT pid, start_ns, end_ns, entry_hits, entry_return_hits, "
                                          "added_ns, launch_duty FROM tracing_cost").to_arrow_table().to_pylist()
        out["probe_costs"] = con.execute("SELECT * FROM probe_costs").to_arrow_table().to_pylist()
        for (notes,) in con.execute("SELECT notes FROM sessions").fetchall():
            stats = (json.loads(notes or "{}") or {}).get("bpf_run_stats") or {}
            out["bpf_names"] = {v["tag"]: k for k, v in stats.items()}
        gaps = con.execute("SELECT start_ns, end_ns FROM probe_gaps ORDER BY 1").fetchall()
        out["probe_gaps"] = {"n": len(gaps), "s": sum(b - a for a, b in gaps) / 1e9, "gaps": [list(g) for g in gaps]}
        if window:
            out["window_entry_hits"], out["window_entry_return_hits"] = con.execute(
                "SELECT count(*) FILTER (duration_ns IS NULL), count(*) FILTER (duration_ns IS NOT NULL) "
                "FROM cuda_calls WHERE ts_ns >= ? AND ts_ns < ? AND pid = ?",
                [window["t0_ns"], window["t1_ns"], window.get("pid", -1)]).fetchone()
            out["window_page_allocs"] = con.execute(
                "SELECT coalesce(sum(count), 0) FROM host_aggregates WHERE pid = ? AND op = 'mm_page_alloc'",
                [window.get("pid", -1)]).fetchone()[0]
            out["window_off_cpu_intervals"] = con.execute(
                "SELECT count(*) FROM sched_intervals WHERE off_ns >= ? AND off_ns < ? AND pid = ?",
                [window["t0_ns"], window["t1_ns"], window.get("pid", -1)]).fetchone()[0]
        con.close()
        return out
    calls = seg / "cuda_calls"
    if calls.is_dir():
        table = ds.dataset(str(calls), format="parquet").to_table(columns=["op"])
        out["cuda_calls"] = table.num_rows
        ops: dict[str, int] = {}
        for op in table.column("op").to_pylist():
            ops[op] = ops.get(op, 0) + 1
        out["ops"] = ops
    cost = seg / "tracing_cost"
    if cost.is_dir():
        out["tracing_cost"] = ds.dataset(str(cost), format="parquet").to_table(
            columns=["pid", "start_ns", "end_ns", "entry_hits", "entry_return_hits",
                     "added_ns", "launch_duty"]).to_pylist()
    for name in ("probe_costs", "probe_gaps"):
        if (seg / name).is_dir():
            rows = ds.dataset(str(seg / name), format="parquet").to_table().to_pylist()
            out[name] = rows if name == "probe_costs" else {"n": len(rows),
                                                            "s": sum(r["end_ns"] - r["start_ns"] for r in rows) / 1e9,
                                                            "gaps": [[r["start_ns"], r["end_ns"]] for r in rows]}
    sessions = seg / "sessions"
    if sessions.is_dir():  # the collector's notes: each eBPF program's tag and name (with bpf_stats_enabled)
        for notes in (ds.dataset(str(sessions), format="parquet").to_table(columns=["notes"]).column("notes")
                      .to_pylist()):
            stats = (json.loads(notes or "{}") or {}).get("bpf_run_stats") or {}
            out["bpf_names"] = {v["tag"]: k for k, v in stats.items()}
    stats = seg / "collector_stats"
    if stats.is_dir():
        rows = ds.dataset(str(stats), format="parquet").to_table().to_pylist()
        out["lost"] = sum(r["events_lost"] for r in rows)
        out["sources"] = {r["source"]: {k: r[k] for k in ("events_seen", "events_stored", "events_lost")} for r in rows}
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("outdir", type=Path)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--workloads", default=",".join(name for name, _ in WORKLOADS),
                        help="comma-separated subset of: " + ", ".join(name for name, _ in WORKLOADS))
    parser.add_argument("--size", action="append", default=[], metavar="NAME=N",
                        help="override a workload's size, e.g. train=3000 (steps)")
    args = parser.parse_args()
    chosen = set(args.workloads.split(","))
    sizes = dict(item.split("=") for item in args.size)
    WORKLOADS[:] = [(name, int(sizes.get(name, size))) for name, size in WORKLOADS if name in chosen]
    args.outdir.mkdir(parents=True, exist_ok=True)
    work = Path("/tmp/ingero-overhead")
    work.mkdir(exist_ok=True)
    libs = cuda_libs()
    print(f"CUDA libraries: {libs}", flush=True)
    runs: list[dict] = []
    for rep in range(args.reps):
        for name, size in WORKLOADS:
            order = ("untraced", "traced") if rep % 2 == 0 else ("traced", "untraced")
            for mode in order:
                entry: dict = {"rep": rep, "workload": name, "mode": mode}
                if mode == "untraced":
                    entry.update(run_workload(name, size))
                else:
                    entry.update(traced(work / f"{name}-{rep}.duckdb", libs,
                                        lambda name=name, size=size: run_workload(name, size)))
                runs.append(entry)
                # written after every run: a call killed at its time limit still leaves what finished
                (args.outdir / "overhead.json").write_text(json.dumps({"libs": libs, "runs": runs}, indent=1))
                print(json.dumps({k: v for k, v in entry.items()
                                  if k not in ("ops", "sources", "tracing_cost", "marks")}), flush=True)
    summary = summarise(runs)
    (args.outdir / "overhead.json").write_text(json.dumps({"libs": libs, "runs": runs, "summary": summary}, indent=1))
    for row in summary:
        if row["added_ns_per_launch"] is not None:
            print(f"launch loop: {row['added_ns_per_launch']:.0f} ns added per traced kernel launch (median per-call "
                  "time, traced - untraced)")
    print("\nworkload   untraced median s   traced median s   slowdown (median / mean)   untraced spread   calls traced"
          "   added ns/call   collector CPU s   lost")
    for row in summary:
        print(f"{row['workload']:9s}  {row['untraced_s']:17.3f}  {row['traced_s']:16.3f}  "
              f"{row['slowdown_pct']:8.2f}% / {row['slowdown_mean_pct']:6.2f}%  {row['untraced_spread_pct']:14.1f}%"
              f"  {row['calls_traced']:13d}  {row['added_ns_per_call']:14.0f}  {row['collector_cpu_s']:15.2f}  "
              f"{row['lost']:5d}")
    print("\nworkload   measured added s (median traced - median untraced)   stored estimate s (median)")
    for row in summary:
        est = row["estimated_added_s"]
        print(f"{row['workload']:9s}  {row['measured_added_s']:52.3f}   {est if est is None else round(est, 3)}")
    return 0


def estimated_in(entry: dict) -> float | None:
    """The stored estimate of added time for the workload's timed window: its hits inside the window
    (recorded(db, window)) times probe_costs, as tracing_cost computes it per second, plus its off-CPU intervals and
    page allocations times theirs, as explain adds them. None: nothing recorded."""
    costs = {c["probe"]: c["cost_ns"] for c in entry.get("probe_costs") or []}
    if "window_entry_hits" not in entry or not costs:
        return None
    return (entry["window_entry_hits"] * costs.get("entry", 0.0)
            + entry["window_entry_return_hits"] * costs.get("entry_return", 0.0)
            + entry.get("window_page_allocs", 0) * (costs.get("page_alloc") or 0.0)
            + entry.get("window_off_cpu_intervals", 0) * (costs.get("sched_interval") or 0.0)) / 1e9


def summarise(runs: list[dict]) -> list[dict]:
    out = []
    for name, _ in WORKLOADS:
        untraced = [r["total"] for r in runs if r["workload"] == name and r["mode"] == "untraced"]
        traced_runs = [r for r in runs if r["workload"] == name and r["mode"] == "traced"]
        traced = [r["total"] for r in traced_runs]
        calls = int(statistics.median([r.get("cuda_calls", 0) for r in traced_runs]))
        u, t = statistics.median(untraced), statistics.median(traced)
        mean_u, mean_t = statistics.mean(untraced), statistics.mean(traced)
        out.append({
            "workload": name, "untraced_s": u, "traced_s": t, "untraced_all": untraced, "traced_all": traced,
            "slowdown_pct": (t / u - 1) * 100, "slowdown_mean_pct": (mean_t / mean_u - 1) * 100,
            "untraced_spread_pct": (max(untraced) - min(untraced)) / u * 100, "calls_traced": calls,
            "added_ns_per_call": (t - u) / calls * 1e9 if calls else 0.0,
            "added_ns_per_launch": (statistics.median([r["per_call_ns"] for r in traced_runs])
                                    - statistics.median([r["per_call_ns"] for r in runs if r["workload"] == name
                                                         and r["mode"] == "untraced"])) if name == "launch" else None,
            "collector_cpu_s": statistics.median([r["collector_cpu_s"] for r in traced_runs]),
            "estimated_added_s": _median_or_none([r.get("estimated_added_s") for r in traced_runs]),
            "measured_added_s": t - u,
            "lost": int(sum(r.get("lost", 0) for r in traced_runs)),
        })
    return out


def _median_or_none(values: list[float | None]) -> float | None:
    got = [v for v in values if v is not None]
    return statistics.median(got) if got else None


if __name__ == "__main__":
    sys.exit(main())
