"""Start-up cost of the collector: compiling the eBPF program with clang vs loading it from the cache.

Each run is a fresh process that does what `ingero-mcp trace` does before it records: Tracer._compile
(compile or cache hit, maps, tracepoint programs loaded and attached) and attach_library on the
stand-in libcudart/libcuda of tests/standin (the tracer's default probes: one layer per logical call,
launches entry-only; each entry program loaded through the verifier; no probe-cost calibration). Reported per \
run: CPU seconds and wall seconds of those two steps, and
where the time went, exclusive of nested steps: reading the cache file, creating the maps (on a
hit; a compile creates them inside libbcc), loading programs (the kernel verifier), attaching
(symbol lookup, perf events, tracefs), the rest (clang + BCC's rewriter + map creation on a
compile; fd patching, library discovery and Python on a hit). Then the stop's detach of every probe and
tracepoint (Tracer._detach), the uprobes as uprobe_multi links where the kernel has them ('hit') or as
perf events ('hit-perf', INGERO_UPROBE_LINKS=0, the path for kernels before 6.6). Medians of --runs.

    sudo .venv/bin/python bench/bench_startup.py --runs 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "standin"))

PHASES = ("read cache", "create maps", "load programs", "attach", "other")


def child(mode: str, cache: str, libs: list[str]) -> dict[str, Any]:
    """One start in this process; the numbers as a dict."""
    from ingero_mcp.collector import bpfcache, uprobelink
    from ingero_mcp.collector.bccload import import_bcc
    from ingero_mcp.collector.discovery import resolve_library
    from ingero_mcp.collector.tracer import TraceOptions, Tracer

    bcc = import_bcc()
    spent = dict.fromkeys(PHASES, 0.0)
    stack: list[float] = []  # time spent in nested timed calls, per open call

    def timed(phase: str, fn: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            stack.append(0.0)
            try:
                return fn(*args, **kwargs)
            finally:
                nested = stack.pop()
                dt = time.perf_counter() - t0
                spent[phase] += dt - nested
                if stack:
                    stack[-1] += dt
        return wrapper

    cached = bpfcache._cached_class(bcc)
    bpfcache._read = timed("read cache", bpfcache._read)
    lib = bcc.libbcc.lib
    lib.bcc_create_map = timed("create maps", lib.bcc_create_map)  # the cache's call (BCC's own is in C)
    for cls in (bcc.BPF, cached):
        if "load_func" in vars(cls):
            cls.load_func = timed("load programs", vars(cls)["load_func"])
    for name in ("attach_tracepoint", "attach_uprobe", "attach_uretprobe"):
        setattr(bcc.BPF, name, timed("attach", getattr(bcc.BPF, name)))
    bcc.BPF._check_path_symbol = staticmethod(timed("attach", bcc.BPF._check_path_symbol))  # symbol lookup
    lib.bpf_attach_uprobe = timed("attach", lib.bpf_attach_uprobe)  # the tracer's own _uprobe calls it directly
    uprobelink.link_uprobe = timed("attach", uprobelink.link_uprobe)
    if mode == "hit-perf":
        os.environ["INGERO_UPROBE_LINKS"] = "0"

    os.environ["XDG_CACHE_HOME"] = cache
    with tempfile.TemporaryDirectory() as tmp:
        # no probe-cost calibration: it runs a measuring process (~0.5 s or more), the same either way
        tracer = Tracer(TraceOptions(db=Path(tmp) / "unused.duckdb", bpf_cache=mode != "compile", calibrate=False),
                        log=open(os.devnull, "w"))  # noqa: SIM115
        c0, w0 = time.process_time(), time.perf_counter()
        tracer._compile()
        c1, w1 = time.process_time(), time.perf_counter()
        for path in libs:
            lib = resolve_library(path)
            assert lib is not None, path
            tracer.attach_library(lib, forced=True)
        c2, w2 = time.process_time(), time.perf_counter()
        probes, links = len(tracer.uprobe_links) + len(tracer.bpf.uprobe_fds), len(tracer.uprobe_links)
        status = tracer.bpf_status
        tracer._detach()
        w3 = time.perf_counter()
        tracer.bpf.cleanup()
    spent["other"] = (w2 - w0) - sum(spent.values())
    return {"mode": mode, "status": status, "probes": probes, "links": links, "compile_cpu_s": c1 - c0,
            "compile_wall_s": w1 - w0, "cpu_s": c2 - c0, "wall_s": w2 - w0, **{f"{k} s": v for k, v in spent.items()},
            "detach_wall_s": w3 - w2}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--child", choices=("compile", "hit", "hit-perf", "fill"), help=argparse.SUPPRESS)
    ap.add_argument("--cache", default="", help=argparse.SUPPRESS)
    ap.add_argument("--lib", action="append", default=[], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.cache, args.lib)))
        return

    from harness import build_standin

    with tempfile.TemporaryDirectory() as tmp:
        standin = build_standin(Path(tmp) / "standin")
        cache = str(Path(tmp) / "xdg")
        libs = [a for p in (standin.cudart, standin.cuda) for a in ("--lib", str(p))]

        def run(mode: str) -> dict[str, Any]:
            out = subprocess.run([sys.executable, __file__, "--child", mode, "--cache", cache, *libs],
                                 capture_output=True, text=True, check=True)
            return json.loads(out.stdout.strip().splitlines()[-1])

        fill = run("fill")
        assert fill["status"].endswith("cached"), fill
        results: dict[str, list[dict[str, Any]]] = {"compile": [], "hit": [], "hit-perf": []}
        for _ in range(args.runs):  # interleaved: the shared machine's load hits both alike
            for mode in results:
                results[mode].append(run(mode))
                assert results[mode][-1]["status"] == ("compiled" if mode == "compile" else "cache hit"), results[mode]
    load = os.getloadavg()
    print(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; medians of {args.runs} runs, seconds; "
          f"{results['hit'][0]['probes']} uprobes attached ({results['hit'][0]['links']} as links on a hit)")
    keys = ["compile_cpu_s", "compile_wall_s", "cpu_s", "wall_s", *(f"{k} s" for k in PHASES), "detach_wall_s"]
    print(f"{'':10}" + "".join(f"{k:>16}" for k in keys))
    for mode, rows in results.items():
        print(f"{mode:10}" + "".join(f"{statistics.median(r[k] for r in rows):16.3f}" for k in keys))
    if args.json:
        args.json.write_text(json.dumps({"loadavg": load, "runs": results}, indent=1))


if __name__ == "__main__":
    main()
