"""What slows a workload block besides the probes: the same process's blocks run plain, with the CPUs
the collector would use kept busy (two spinning shells), or with the collector's NVML sampler calls
(every second, from this process). No eBPF: if a block slows here, the collector's probes are not what
slowed it in same_process.py.

    python3 bench/gpu/confounds.py OUTDIR --rounds 4 --workload train --size 1500
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import threading
from pathlib import Path

from run_overhead import COLLECTOR_CPUS
from same_process import Blocks


class Busy:
    """A spinning shell on each CPU of COLLECTOR_CPUS (0-1 unless set)."""

    def __init__(self) -> None:
        cpus = (COLLECTOR_CPUS or "0-1").replace("-", ",").split(",")
        self.procs = [subprocess.Popen(["taskset", "-c", c, "sh", "-c", "while :; do :; done"]) for c in cpus]

    def stop(self) -> None:
        for p in self.procs:
            p.kill()
            p.wait()


class NvmlSampling:
    """The collector's sampler's NVML calls, once a second, in a thread."""

    def __init__(self) -> None:
        from ingero_mcp.collector.sampler import Nvml

        self.nvml, self.done, self.samples = Nvml(), threading.Event(), 0
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while not self.done.wait(1.0):
            self.nvml.sample()
            self.nvml.processes(0)
            self.samples += 1

    def stop(self) -> None:
        self.done.set()
        self.thread.join()


MODES = {"plain": None, "busy_collector_cpus": Busy, "nvml_sampler": NvmlSampling}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("outdir", type=Path)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--workload", default="train")
    parser.add_argument("--size", type=int, default=1500)
    args = parser.parse_args()
    args.outdir.mkdir(parents=True, exist_ok=True)
    names = list(MODES)
    runs: list[dict] = []
    blocks = Blocks(args.workload, args.size)
    try:
        for rnd in range(args.rounds):
            for mode in names[rnd % len(names):] + names[:rnd % len(names)]:  # rotated: no mode always first
                side = MODES[mode]() if MODES[mode] else None
                try:
                    entry = {"round": rnd, "mode": mode, **blocks.run()}
                finally:
                    if side:
                        side.stop()
                runs.append(entry)
                (args.outdir / "confounds.json").write_text(json.dumps({"runs": runs}, indent=1))
                print(json.dumps({k: v for k, v in entry.items() if k != "marks"}), flush=True)
    finally:
        blocks.close()
    print("\nmode                  blocks  median s  all")
    for mode in names:
        got = [r["total"] for r in runs if r["mode"] == mode]
        if got:
            print(f"{mode:20s}  {len(got):6d}  {statistics.median(got):8.3f}  {[round(t, 3) for t in got]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
