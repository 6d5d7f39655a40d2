"""Which analysis modules `explain`'s connection visits, in order (issue 22: each at most once or twice).

A visit is an entry into an analysis module, by a call that receives the connection, from another module; `_sql` and
`answers` (the query runners every module uses) are left out. Prints the visits, the modules, the returns (visits to
a module already left) and the sequence.

    .venv/bin/python bench/module_visits.py investigations/h200-seed-benchmark.duckdb
"""

from __future__ import annotations

import collections
import sys
from types import FrameType
from typing import Any


def main() -> int:
    from ingero_mcp.analysis import diagnose
    from ingero_mcp.store import open_store

    con = open_store(sys.argv[1])
    seq: list[str] = []

    def profile(frame: FrameType, event: str, _arg: Any) -> None:
        if event != "call":
            return
        module = str(frame.f_globals.get("__name__", ""))
        if not module.startswith("ingero_mcp.analysis.") or module.endswith(("._sql", ".answers")):
            return
        if any(value is con for value in frame.f_locals.values()):
            short = module.removeprefix("ingero_mcp.analysis.")
            if not seq or seq[-1] != short:
                seq.append(short)

    sys.setprofile(profile)
    diagnose(con)
    sys.setprofile(None)
    count = collections.Counter(seq)
    print(f"{len(seq)} visits to {len(count)} modules, {len(seq) - len(count)} returns; "
          f"visited more than twice: {', '.join(f'{m} {n}' for m, n in count.most_common() if n > 2) or 'none'}")
    try:
        print(" -> ".join(seq))
    except BrokenPipeError:  # `| head -1`
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
