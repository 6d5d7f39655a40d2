"""Packs the zoo's per-scenario archives (WORK/NAME.tar.xz) into at most 7 files OUT/zoo-<k>.tar of
at most 15 MiB each (first fit, largest first), and writes OUT/zoo-summary.txt: the driver's log,
each archive's size and which file holds it, and LOUDLY any archive that did not fit. An archive
larger than one file is cut into NAME.tar.xz.partNN pieces (fold.py joins them).

    python3 bench/gpu/zoo/pack.py /tmp/zoo $OUT --log /tmp/zoo/driver.log
"""

from __future__ import annotations

import argparse
import tarfile
from pathlib import Path

MIB = 1 << 20


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("work", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--log", type=Path)
    parser.add_argument("--max-files", type=int, default=7)
    parser.add_argument("--max-mib", type=float, default=15.0)
    args = parser.parse_args()
    limit = int(args.max_mib * MIB) - 64 * 1024  # tar headers and padding
    for arc in list(args.work.glob("*.tar.xz")):
        if arc.stat().st_size > limit:  # too big for one file: cut in parts (fold.py joins NAME.tar.xz.partNN)
            data = arc.read_bytes()
            step = limit - 4096
            for i in range(0, len(data), step):
                (args.work / f"{arc.name}.part{i // step:02d}").write_bytes(data[i:i + step])
            print(f"{arc.name}: {len(data) / MIB:.2f} MiB, cut into {(len(data) + step - 1) // step} parts")
            arc.unlink()
    archives = sorted([*args.work.glob("*.tar.xz"), *args.work.glob("*.tar.xz.part*")],
                      key=lambda p: p.stat().st_size, reverse=True)
    bins: list[list[Path]] = []
    sizes: list[int] = []
    left: list[Path] = []
    for arc in archives:
        size = arc.stat().st_size + 1024
        for k, used in enumerate(sizes):
            if used + size <= limit:
                bins[k].append(arc)
                sizes[k] += size
                break
        else:
            if size <= limit and len(bins) < args.max_files:
                bins.append([arc])
                sizes.append(size)
            else:
                left.append(arc)
    args.out.mkdir(parents=True, exist_ok=True)
    for old in args.out.glob("zoo-*.tar"):  # packed again after every scenario: no stale file stays
        old.unlink()
    lines = []
    for k, members in enumerate(bins, 1):
        target = args.out / f"zoo-{k}.tar"
        with tarfile.open(target, "w") as tar:
            for arc in members:
                tar.add(arc, arcname=arc.name)
        lines.append(f"{target.name}: {target.stat().st_size / MIB:.2f} MiB: "
                     + ", ".join(f"{a.name} ({a.stat().st_size / MIB:.2f} MiB)" for a in members))
    for arc in left:
        lines.append(f"!!! NOT PACKED: {arc.name} ({arc.stat().st_size / MIB:.2f} MiB) did not fit "
                     f"({args.max_files} files of {args.max_mib} MiB): record it again alone or shorter !!!")
    if not archives:
        lines.append("!!! no scenario archive at all !!!")
    text = ""
    if args.log and args.log.exists():
        text += args.log.read_text() + "\n"
    text += "\n".join(lines) + "\n"
    (args.out / "zoo-summary.txt").write_text(text)
    print("\n".join(lines))
    return 1 if left else 0


if __name__ == "__main__":
    raise SystemExit(main())
