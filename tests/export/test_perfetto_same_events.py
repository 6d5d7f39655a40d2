"""Issue 20: the compact Perfetto export carries the same events as the exporter before it.

`timeline_golden.json` holds, per shipped store, a digest of the timeline decoded with
`perfetto_decode.timeline`: per track (by what it is: kind, pid, tid, name), every slice (name, start,
duration, args, flows, depth), instant and counter point, as trace_processor's sorter and slice stack
make them. The causal chains' tracks are left out (they follow the analysis, not the exporter). The
same digest of today's export must match: same tracks, names, timestamps, durations, args.

The chain of trust: main's exporter at 46e05ab (absolute timestamps, no per-track sequences, inline
string args) wrote the first digests; c178279's exporter matched them in full, and its digests without
the state tracks' "running" slices are the ones held now. Since then a state track holds only what the
store holds, the off-CPU spans (a gap between them: the thread ran), and a launch's kernel is its
`kernel_key` as an interned string (read back as the number by `call_args`).
"""

from __future__ import annotations

import hashlib
import json
import lzma
import shutil
from pathlib import Path

import pytest
from paths import REPO
from perfetto_decode import decode, timeline

from ingero_mcp.cli import main
from ingero_mcp.export import calls_apart

GOLDEN = json.loads((Path(__file__).parent / "timeline_golden.json").read_text())


def digest(path: Path, running: bool = True) -> dict:
    """The timeline's digest; running=False: without the "running" slices of the state tracks."""
    rows = {k: v if running else [r for r in v if r[:2] != ("slice", "running")]
            for k, v in timeline(decode(path)).items() if "causal chains" not in repr(k)}
    return {"sha256": hashlib.sha256(repr(sorted(rows.items(), key=repr)).encode()).hexdigest(),
            "tracks": len(rows), "rows": sum(map(len, rows.values()))}


@pytest.mark.parametrize("apart", [False, True], ids=["here", "calls-apart"])
@pytest.mark.parametrize("store", sorted(GOLDEN))
def test_same_events_as_before(store: str, apart: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same digest whether the calls are encoded in this process or by a second one (calls_apart: a large
    store's, here forced on)."""
    monkeypatch.setattr(calls_apart, "APART_FROM", 0 if apart else 10**12)
    children: list[int] = []
    finish = calls_apart.CallsApart.finish
    monkeypatch.setattr(calls_apart.CallsApart, "finish", lambda self, *a: (children.append(self.process.pid),
                                                                            finish(self, *a))[1])
    src = REPO / "investigations" / store
    db = tmp_path / "store.duckdb"
    if store.startswith("zoo/"):
        with lzma.open(f"{src}.duckdb.xz") as fin, db.open("wb") as fout:
            shutil.copyfileobj(fin, fout)
    else:
        shutil.copyfile(f"{src}.duckdb", db)
    out = tmp_path / "run.pftrace"
    assert main(["export", "--db", str(db), "-o", str(out)]) == 0
    assert len(children) == int(apart)
    assert digest(out, running=False) == GOLDEN[store]
    assert digest(out) == GOLDEN[store], "no running slices: a gap between a thread's states is its running"
