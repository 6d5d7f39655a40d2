"""Issue 20's last figure: the first MCP call on a live 10M-event recording, without and with its checkpoint.

A live copy of a finished store (bench_mcp.make_live_copy: a schema-only file and 100k-row Parquet segments, its
writer left unclosed) is served by `ingero-mcp mcp` over stdio (issue20.McpChild); `get_causal_chains` is called as
soon as the tools are listed, then every `--every` s for `--calls` calls, each printed with its time and whether it
came from the checkpoint (its note). Then the checkpoint is written by the child the collector runs
(`python -m ingero_mcp.store.checkpoint`: wall, CPU, peak RSS) and the same is measured again.

    .venv/bin/python bench/live_first_call.py --store10m /tmp/10m.duckdb        # ~3 min at 10M events
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_mcp import make_live_copy  # noqa: E402
from issue20 import CLI, McpChild, load  # noqa: E402

from ingero_mcp.store.checkpoint import checkpoint_dir  # noqa: E402


def serve(live: Path, calls: int, every: float) -> dict[str, object]:
    """Spawn the server, list its tools, call get_causal_chains at once and then every `every` s."""
    child = McpChild(live)
    try:
        init = child.initialize()
        seen = []
        for i in range(calls):
            if i:
                time.sleep(every)
            t0 = time.perf_counter()
            got = child.request("tools/call", {"name": "get_causal_chains", "arguments": {}})
            took = time.perf_counter() - t0
            notes = got["result"].get("structuredContent", {}).get("notes", [])
            seen.append({"at_s": round(time.perf_counter() - child.t0, 2), "took_s": round(took, 3),
                         "from_checkpoint": any("recording's checkpoint" in n for n in notes)})
    finally:
        child.close()
    return {"listed_s": round(init["listed_s"], 2), "calls": seen}


def timed_child(cmd: list[str]) -> dict[str, float]:
    """Run `cmd` to its end: wall s, CPU s, and peak RSS as the child's own VmHWM, polled (wait4's ru_maxrss starts
    from this process's RSS at the fork, and this one holds a 10M store's worth of Arrow after making the copy)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    status_file, peak_kb = Path(f"/proc/{proc.pid}/status"), 0
    while True:
        try:
            peak_kb = max(peak_kb, *(int(line.split()[1]) for line in status_file.read_text().splitlines()
                                     if line.startswith("VmHWM:")))
        except (OSError, ValueError, TypeError):
            pass
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)  # the CPU of this child alone
        if pid:
            break
        time.sleep(0.05)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}: {proc.stderr.read().decode()[-2000:]}")
    return {"wall_s": wall, "cpu_s": usage.ru_utime + usage.ru_stime, "rss_mb": peak_kb / 1024}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--store10m", type=Path, required=True, help="a finished store to copy as a live recording")
    parser.add_argument("--calls", type=int, default=6)
    parser.add_argument("--every", type=float, default=5.0)
    args = parser.parse_args()
    out: dict[str, object] = {"load_before": load()}
    work = Path("/tmp/ingero-live-first")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    base = work / "store.duckdb"
    shutil.copyfile(args.store10m, base)
    live = make_live_copy(base)
    out["without_checkpoint"] = serve(live, args.calls, args.every)
    made = timed_child([CLI[0], "-m", "ingero_mcp.store.checkpoint", str(live),
                        "ingero_mcp.cli.trace:_store_accounting"])
    checkpoint: dict[str, float] = {k: round(v, 2) for k, v in made.items()}
    checkpoint["bytes"] = sum(f.stat().st_size for f in checkpoint_dir(live).glob("*.duckdb"))
    out["checkpoint"] = checkpoint
    out["with_checkpoint"] = serve(live, args.calls, args.every)
    out["load_after"] = load()
    print(json.dumps(out, indent=1))
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
