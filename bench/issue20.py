"""Issue 20's "done when" figures in one run, each as processes, beside the issue's targets and "before" figures.

Every timing is a fresh `python -m ingero_mcp.cli ...` process (this interpreter, this PYTHONPATH): wall seconds
(median of --repeats) and the child's CPU seconds (user + system, from wait4 or /proc: less moved by other
processes' load than wall time on the shared 2-core machine). The load average is printed before and after.

    .venv/bin/python bench/issue20.py                                  # all, on /tmp/10m-base.duckdb (~2-3 min)
    .venv/bin/python bench/issue20.py --skip-10m --skip-ingest         # start-up only (~15 s)
    .venv/bin/python bench/issue20.py --store10m run.duckdb --skip-export
    .venv/bin/python bench/issue20.py --make-10m                       # generate the 10M store first (+40-120 s)

Figures: explain on the bundled trace (README's quickstart store); `mcp` spawn to its reply to `initialize`;
explain --json on the 10M store; get_causal_chains over stdio on the 10M store (the first call, then the median
of the calls after it); the 10M store's bytes per event (events: cuda_calls + sched_intervals rows); export of
the 10M store (seconds, peak RSS, bytes per event of the .pftrace); finishing a copy of it again (store_derived:
seconds, peak RSS); ingest rows/s (bench_store.py's mixed tables through TraceWriter, --ingest-rows). The 10M
store is opened read-only; nothing is written beside it (the copy and the export go to a temp folder)."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
BUNDLED = REPO / "investigations" / "h200-seed-benchmark.duckdb"  # README's quickstart
CLI = [sys.executable, "-m", "ingero_mcp.cli"]
DATALOADER_EVENTS_PER_SCALE = 127_486  # as bench_store.py

# (figure, "before" = before the accounting, "now" when the issue was filed, target), from issue 20's table
ISSUE: dict[str, tuple[str, str, str]] = {
    "explain_bundled": ("0.85 s", "1.39 s", "<= 0.5 s"),
    "mcp_first_reply": ("0.86 s", "1.22 s", "<= 0.6 s"),
    "explain_json_10m": ("1.45-1.69 s", "2.40-3.01 s", "<= 1.0 s"),
    "mcp_chains_10m": ("0.83 s", "4.1-5.3 s", "<= 0.5 s after the 1st"),
    "store_bytes_per_event": ("10.0 B", "38.4 B", "<= 14 B"),
    "finish_10m": ("-", "13.0 s, 3.1 GB", "<= 4 s, <= 1 GB"),
    "export_10m": ("-", "19.7 s, 947 MB, 95 B/ev", "<= 6 s, <= 40 B/ev"),
    "ingest": ("2.5-3.3M rows/s", "1.9-2.9M rows/s", ">= 2.5M rows/s"),
}


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f} {five:.2f} {fifteen:.2f}"


def run_timed(cmd: list[str], stdout: Any = subprocess.DEVNULL) -> dict[str, float]:
    """Run `cmd` to its end: wall s, the child's CPU s and peak RSS (wait4's rusage of that child alone)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=stdout, stderr=subprocess.PIPE)
    _pid, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}: {err[-2000:]}")
    return {"wall_s": wall, "cpu_s": usage.ru_utime + usage.ru_stime, "rss_mb": usage.ru_maxrss / 1024}


def _cpu_of(pid: int) -> float:
    """CPU seconds (user + system, all threads) a live process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class McpChild:
    """`ingero-mcp mcp --db DB` spoken to over its stdio with JSON-RPC lines (no SDK on this side)."""

    def __init__(self, db: Path) -> None:
        self.t0 = time.perf_counter()
        self.proc = subprocess.Popen([*CLI, "mcp", "--db", str(db)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL)
        self.next_id = 1

    def request(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        assert self.proc.stdin and self.proc.stdout
        rid = self.next_id
        self.next_id += 1
        self.proc.stdin.write((json.dumps({"jsonrpc": "2.0", "id": rid, "method": method, "params": params})
                               + "\n").encode())
        self.proc.stdin.flush()
        while True:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError(f"the server closed its stdout before answering {method}")
            msg = json.loads(line)
            if msg.get("id") == rid:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg

    def notify(self, method: str) -> None:
        assert self.proc.stdin
        self.proc.stdin.write((json.dumps({"jsonrpc": "2.0", "method": method}) + "\n").encode())
        self.proc.stdin.flush()

    def initialize(self) -> dict[str, float]:
        self.request("initialize", {"protocolVersion": "2025-06-18", "capabilities": {},
                                    "clientInfo": {"name": "issue20", "version": "0"}})
        wall, cpu = time.perf_counter() - self.t0, _cpu_of(self.proc.pid)
        self.notify("notifications/initialized")
        self.request("tools/list", {})  # what a client asks next: the server is of use once this is answered
        return {"wall_s": wall, "cpu_s": cpu, "listed_s": time.perf_counter() - self.t0}

    def call(self, tool: str, args: dict[str, Any]) -> float:
        t0 = time.perf_counter()
        got = self.request("tools/call", {"name": tool, "arguments": args})
        if got["result"].get("isError"):
            raise RuntimeError(f"{tool}: {json.dumps(got['result'])[:500]}")
        return time.perf_counter() - t0

    def close(self) -> None:
        assert self.proc.stdin
        self.proc.stdin.close()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def median_of(runs: list[dict[str, float]]) -> dict[str, float]:
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]}


def events_and_bytes(db: Path) -> tuple[int, int]:
    """(cuda_calls + sched_intervals rows, file bytes) of a store, read-only."""
    import duckdb

    con = duckdb.connect(str(db), read_only=True)
    try:
        n = con.execute("SELECT (SELECT count(*) FROM cuda_calls) + (SELECT count(*) FROM sched_intervals)"
                        ).fetchall()[0][0]
    finally:
        con.close()
    return int(n), db.stat().st_size


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3, help="runs of each timing (medians shown; default 3)")
    ap.add_argument("--store10m", type=Path, default=Path("/tmp/10m-base.duckdb"), help="the 10M-event store")
    ap.add_argument("--make-10m", action="store_true", help="generate the 10M store (dataloader demo) first, in a "
                    "temp folder, timing the generator; --store10m is then not read")
    ap.add_argument("--skip-10m", action="store_true", help="no 10M figures (explain, MCP, size, export)")
    ap.add_argument("--skip-mcp10m", action="store_true", help="no MCP tool calls on the 10M store")
    ap.add_argument("--skip-export", action="store_true", help="no export of the 10M store (~10-20 s)")
    ap.add_argument("--skip-finish", action="store_true", help="no finish of a copy of the 10M store (~10 s)")
    ap.add_argument("--skip-ingest", action="store_true", help="no ingest rows/s (~15 s)")
    ap.add_argument("--ingest-rows", default="10m", help="rows for the ingest figure (default 10m)")
    ap.add_argument("--json", type=Path, help="also write every run here")
    args = ap.parse_args()
    n = args.repeats
    out: dict[str, Any] = {"load_before": os.getloadavg(), "python": sys.executable, "repeats": n}
    now: dict[str, str] = {}
    print(f"load average {load()} (before); {os.cpu_count()} CPUs; medians of {n} processes", flush=True)

    runs = [run_timed([*CLI, "explain", "--db", str(BUNDLED)]) for _ in range(n)]
    out["explain_bundled"] = runs
    m = median_of(runs)
    now["explain_bundled"] = f"{m['wall_s']:.2f} s (CPU {m['cpu_s']:.2f} s)"

    inits = []
    for _ in range(n):
        child = McpChild(BUNDLED)
        inits.append(child.initialize())
        child.close()
    out["mcp_first_reply"] = inits
    m = median_of(inits)
    now["mcp_first_reply"] = (f"{m['wall_s']:.2f} s (CPU {m['cpu_s']:.2f} s); tools listed at "
                              f"{m['listed_s']:.2f} s")

    with tempfile.TemporaryDirectory(prefix="issue20-") as tmpd:
        tmp = Path(tmpd)
        store = args.store10m
        if not args.skip_10m and args.make_10m:
            store = tmp / "d10m.duckdb"
            gen = run_timed([*CLI, "demo", "dataloader", "--db", str(store), "--no-report",
                             "--scale", str(10_000_000 / DATALOADER_EVENTS_PER_SCALE)])
            out["generate_10m"] = gen
            print(f"generated the 10M store: {gen['wall_s']:.1f} s, peak {gen['rss_mb']:.0f} MB "
                  f"(issue: 14 s before, 35.5 s when filed)", flush=True)
        if not args.skip_10m and not store.exists():
            print(f"no 10M store at {store} (--make-10m makes one): 10M figures skipped")
        elif not args.skip_10m:
            events, size = events_and_bytes(store)
            out["store10m"] = {"path": str(store), "events": events, "bytes": size}
            now["store_bytes_per_event"] = f"{size / events:.1f} B ({events / 1e6:.2f}M events, {size / 1e6:.0f} MB)"
            runs = [run_timed([*CLI, "explain", "--json", "--db", str(store)]) for _ in range(n)]
            out["explain_json_10m"] = runs
            m = median_of(runs)
            now["explain_json_10m"] = f"{m['wall_s']:.2f} s (CPU {m['cpu_s']:.2f} s, {m['rss_mb']:.0f} MB)"
            if not args.skip_mcp10m:
                child = McpChild(store)
                try:
                    child.initialize()
                    calls = [child.call("get_causal_chains", {}) for _ in range(n + 1)]
                finally:
                    child.close()
                out["mcp_chains_10m"] = calls
                now["mcp_chains_10m"] = f"{statistics.median(calls[1:]):.2f} s (1st {calls[0]:.2f} s)"
            if not args.skip_finish:
                # a copy finished again: its derived rows and recorded answers made anew (derive.store_derived)
                copy = tmp / "finish.duckdb"
                shutil.copyfile(store, copy)
                code = ("import sys, duckdb; from ingero_mcp.analysis.derive import store_derived; "
                        "store_derived(duckdb.connect(sys.argv[1]))")
                fin = [run_timed([sys.executable, "-c", code, str(copy)]) for _ in range(n)]
                copy.unlink()
                out["finish_10m"] = fin
                m = median_of(fin)
                now["finish_10m"] = f"{m['wall_s']:.1f} s (CPU {m['cpu_s']:.1f} s), peak {m['rss_mb'] / 1024:.2f} GB"
            if not args.skip_export:
                pf = tmp / "export.pftrace"
                ex = run_timed([*CLI, "export", "--db", str(store), "-o", str(pf)])
                ex["bytes"] = pf.stat().st_size
                pf.unlink()
                out["export_10m"] = ex
                now["export_10m"] = (f"{ex['wall_s']:.1f} s, peak {ex['rss_mb']:.0f} MB, "
                                     f"{ex['bytes'] / events:.0f} B/ev")
    if not args.skip_ingest:
        with tempfile.NamedTemporaryFile(suffix=".json") as fh:
            run_timed([sys.executable, str(REPO / "bench" / "bench_store.py"), "--sizes", args.ingest_rows,
                       "--skip-explain", "--json", fh.name])
            ingest = json.loads(Path(fh.name).read_text())["ingest"]
        out["ingest"] = ingest
        rates = {r["kind"]: r["rows_per_s"] for r in ingest}
        now["ingest"] = " / ".join(f"{v / 1e6:.2f}M ({k})" for k, v in rates.items())

    out["load_after"] = os.getloadavg()
    print(f"\n{'figure':<24}{'before':>18}{'when filed':>26}{'target':>26}   now (this run)")
    for key, (before, filed, target) in ISSUE.items():
        print(f"{key:<24}{before:>18}{filed:>26}{target:>26}   {now.get(key, 'skipped')}")
    print(f"\nload average {load()} (after)")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
