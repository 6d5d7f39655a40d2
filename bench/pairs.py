"""Issue 20's process figures for two source trees, interleaved: a git revision (`--base`) against this checkout.

The shared 2-core machine's speed moves by 2x from one session to the next and by 30 % within minutes, so a figure
read alone says little; one taken from both trees in turn (base, this, base, this, ...) says what a change did. Each
run is a fresh process (this interpreter, PYTHONPATH set to the tree's `src`): wall seconds and the child's CPU
seconds (`issue20.run_timed`), medians printed with their ratio this/base.

    .venv/bin/python bench/pairs.py --base HEAD~1                          # start-ups only (~30 s)
    .venv/bin/python bench/pairs.py --base main --store10m /tmp/10m.duckdb --figures all
    .venv/bin/python bench/pairs.py --base 1a9ee67 --figures explain_bundled,mcp_first_reply

Figures: explain_bundled (each tree's own quickstart store), mcp_first_reply (spawn to the reply to `initialize`),
explain_json_10m, finish_10m (a copy of the 10M store finished again), export_10m (with bytes per event). The base
tree is a detached `git worktree` in a temp folder, removed at the end; a revision older than the 10M store's
schema cannot read it (its figures then fail with the base's own error).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from issue20 import CLI, REPO, McpChild, events_and_bytes, load, run_timed

BUNDLED = Path("investigations") / "h200-seed-benchmark.duckdb"  # relative to each tree
FINISH = ("import sys, duckdb; from ingero_mcp.analysis.derive import store_derived; "
          "store_derived(duckdb.connect(sys.argv[1]))")
START_UPS = ("explain_bundled", "mcp_first_reply")
ALL = (*START_UPS, "explain_json_10m", "finish_10m", "export_10m")


def in_tree(tree: Path) -> None:
    """Children spawned from now on import `ingero_mcp` from `tree`."""
    os.environ["PYTHONPATH"] = str(tree / "src")


def figure(name: str, tree: Path, store: Path | None, tmp: Path) -> dict[str, float]:
    """One run of `name` from `tree`."""
    in_tree(tree)
    if name == "explain_bundled":
        return run_timed([*CLI, "explain", "--db", str(tree / BUNDLED)])
    if name == "mcp_first_reply":
        child = McpChild(tree / BUNDLED)
        try:
            got = child.initialize()
        finally:
            child.close()
        return got
    assert store is not None
    if name == "explain_json_10m":
        return run_timed([*CLI, "explain", "--json", "--db", str(store)])
    if name == "finish_10m":
        copy = tmp / "finish.duckdb"
        shutil.copyfile(store, copy)
        try:
            return run_timed([sys.executable, "-c", FINISH, str(copy)])
        finally:
            copy.unlink()
    if name == "export_10m":
        out = tmp / "export.pftrace"
        got = run_timed([*CLI, "export", "--db", str(store), "-o", str(out)])
        got["b_per_event"] = out.stat().st_size / events_and_bytes(store)[0]
        out.unlink()
        return got
    raise ValueError(f"unknown figure {name}")


def paired(name: str, base: Path, store: Path | None, tmp: Path, n: int) -> dict[str, list[dict[str, float]]]:
    """`n` runs of `name` from each tree, alternating (base first)."""
    runs: dict[str, list[dict[str, float]]] = {"base": [], "this": []}
    for _ in range(n):
        runs["base"].append(figure(name, base, store, tmp))
        runs["this"].append(figure(name, REPO, store, tmp))
    return runs


def row(name: str, runs: dict[str, list[dict[str, float]]]) -> str:
    def med(side: str, key: str) -> float:
        return statistics.median(r[key] for r in runs[side])

    base, this = med("base", "wall_s"), med("this", "wall_s")
    text = (f"{name:<20}{base:>9.3f} s{this:>9.3f} s{this / base:>8.2f}x   CPU {med('base', 'cpu_s'):.2f} -> "
            f"{med('this', 'cpu_s'):.2f} s; walls {[round(r['wall_s'], 2) for r in runs['base']]} / "
            f"{[round(r['wall_s'], 2) for r in runs['this']]}")
    if "b_per_event" in runs["this"][0]:
        text += f"; {runs['base'][0]['b_per_event']:.1f} -> {runs['this'][0]['b_per_event']:.1f} B/event"
    return text


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", required=True, help="the git revision to compare this checkout with (e.g. HEAD~1)")
    ap.add_argument("--figures", default=",".join(START_UPS),
                    help=f"comma-separated, or 'all' (default: the start-ups); of: {', '.join(ALL)}")
    ap.add_argument("--store10m", type=Path, help="the 10M-event store (for the 10M figures)")
    ap.add_argument("--pairs", type=int, default=5, help="runs of each figure from each tree (default 5)")
    args = ap.parse_args()
    names = list(ALL) if args.figures == "all" else [f.strip() for f in args.figures.split(",") if f.strip()]
    unknown = [f for f in names if f not in ALL]
    if unknown:
        ap.error(f"unknown figure(s): {', '.join(unknown)} (known: {', '.join(ALL)})")
    if any(f not in START_UPS for f in names) and (args.store10m is None or not args.store10m.exists()):
        ap.error("the 10M figures need --store10m, an existing store")
    keep = os.environ.get("PYTHONPATH")
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)  # both trees' bytecode cached, as an installed package's is
    with tempfile.TemporaryDirectory(prefix="pairs-") as tmpd:
        tmp = Path(tmpd)
        base = tmp / "base"
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", "-q", str(base), args.base], check=True)
        try:
            for tree in (base, REPO):  # bytecode compiled before the first timing, not in it
                subprocess.run([sys.executable, "-m", "compileall", "-q", str(tree / "src")], check=True)
            rev = subprocess.run(["git", "-C", str(base), "log", "-1", "--format=%h %s"], check=True,
                                 capture_output=True, text=True).stdout.strip()
            print(f"base {rev}\nthis {REPO} (its working tree)\nload average {load()} (before); "
                  f"medians of {args.pairs} pairs\n\n{'figure':<20}{'base':>11}{'this':>11}{'ratio':>9}", flush=True)
            for name in names:
                print(row(name, paired(name, base, args.store10m, tmp, args.pairs)), flush=True)
            print(f"\nload average {load()} (after)")
        finally:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(base)], check=False)
            if keep is None:
                os.environ.pop("PYTHONPATH", None)
            else:
                os.environ["PYTHONPATH"] = keep
    return 0


if __name__ == "__main__":
    sys.exit(main())
