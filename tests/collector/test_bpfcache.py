"""The compiled-program cache (collector/bpfcache.py), for real: a cache hit must record what a compile records.

Same requirements and stand-ins as tests/collector/test_collector.py (root, BCC, kernel headers, tracefs). The
collector runs get their own cache directory through XDG_CACHE_HOME; the in-process tests pass one.
"""

from __future__ import annotations

import base64
import json
import os
import struct
from pathlib import Path
from typing import Any

import pytest
from harness import StandIn, Workload, build_standin, mix_expected, record, require_ebpf

pytestmark = pytest.mark.ebpf

N, CHILDREN = 30, 1


@pytest.fixture(scope="module")
def standin(tmp_path_factory: pytest.TempPathFactory) -> StandIn:
    """The stand-in libcudart.so.13 / libcuda.so.1 and the workload."""
    require_ebpf()
    return build_standin(tmp_path_factory.mktemp("standin"))


def _record(standin: StandIn, db: Path) -> dict[str, Any]:
    """One `ingero-mcp trace --pid` of `workload mix N` with one child: what the store holds, and what it said."""
    from ingero_mcp.store import open_store

    w = Workload(standin, "mix", str(N), "0", "0", str(CHILDREN), "1")
    collector = record(db, [w])
    con = open_store(db)
    try:
        q = lambda sql, *p: con.execute(sql, list(p)).fetchall()  # noqa: E731
        child = q("SELECT pid FROM processes WHERE ppid = ?", w.pid)
        return {
            "parent_ops": dict(q("SELECT op, count(*) FROM cuda_calls WHERE pid = ? GROUP BY op", w.pid)),
            "child_ops": dict(q("SELECT op, count(*) FROM cuda_calls WHERE pid = ? GROUP BY op", child[0][0]))
            if child else None,
            "sched_rows": q("SELECT count(*) FROM sched_intervals WHERE pid = ?", w.pid)[0][0],
            "switches": q("SELECT sum(count) FROM host_aggregates WHERE op = 'sched_switch' AND pid = ?", w.pid)[0][0],
            "exit_code": q("SELECT exit_code FROM processes WHERE pid = ?", w.pid)[0][0],
            "notes": json.loads(q("SELECT notes FROM sessions")[0][0]),
            "stderr": collector.output(),
        }
    finally:
        con.close()


def test_second_start_is_a_cache_hit_and_records_the_same(standin: StandIn, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    cache = tmp_path / "xdg"
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    first = _record(standin, tmp_path / "first.duckdb")
    files = list((cache / "ingero-mcp" / "bpf").glob("*.json"))
    assert len(files) == 1, files
    assert files[0].stat().st_mode & 0o777 == 0o600
    assert "eBPF program compiled, cached" in first["stderr"], first["stderr"]
    assert first["notes"]["bpf_program"] == "compiled, cached"

    second = _record(standin, tmp_path / "second.duckdb")
    assert "eBPF program cache hit" in second["stderr"], second["stderr"]
    assert second["notes"]["bpf_program"] == "cache hit"
    assert list((cache / "ingero-mcp" / "bpf").glob("*.json")) == files

    parent, child, _ = mix_expected(N, CHILDREN)
    for run in (first, second):
        # uprobes/uretprobes (every op), the fork/exit tracepoints (child followed, exit code) and the
        # scheduler tracepoints (intervals of the traced process, host-wide switch counts) all worked
        assert run["parent_ops"] == dict(parent)
        assert run["child_ops"] == dict(child)
        assert run["exit_code"] == 0
        assert run["sched_rows"] > 0 and run["switches"] > 0


def _program() -> tuple[str, list[str]]:
    """The collector's program text and the cflags every kernel gets (the tracer adds HAVE_* ones)."""
    from ingero_mcp.collector import tracer as T

    return T.program_text(), [f"-DCUDA_RB_PAGES={T.CUDA_RB_PAGES}", f"-DSCHED_RB_PAGES={T.SCHED_RB_PAGES}",
                              f"-DPROC_RB_PAGES={T.PROC_RB_PAGES}", f"-DSAMPLE_RB_PAGES={T.SAMPLE_RB_PAGES}",
                              f"-DAGG_ENTRIES={T.AGG_ENTRIES}", "-Wno-macro-redefined"]


def _load(cache: Path, cflags: list[str] | None = None) -> str:
    from ingero_mcp.collector.bccload import import_bcc
    from ingero_mcp.collector.bpfcache import load_bpf
    from ingero_mcp.collector.ustacks import attach_sampler, detach_sampler

    text, base = _program()
    bpf, status = load_bpf(import_bcc(), text, cflags or base, cache_dir=cache)
    try:
        config = bpf["config"]  # a table is usable whichever way the program came
        config[config.Key(2)] = config.Leaf(7)
        assert config[config.Key(2)].value == 7 and len(config) == 4
        assert len(bpf.tracepoint_fds) >= 10
        # the on-CPU sampler: a perf_event program, loaded and attached to one event per CPU either way
        assert attach_sampler(bpf, 49) is None
        assert 1 <= len(next(iter(bpf.open_perf_events.values()))) <= (os.cpu_count() or 1)
        detach_sampler(bpf)
        assert not bpf.open_perf_events
    finally:
        bpf.cleanup()
    return status


def _garbage(entry: dict[str, Any]) -> bytes:
    return b'{"format": 1, "key": "' + entry["key"][:10].encode() + b"\x00\xff not json"


def _verifier_refuses(entry: dict[str, Any]) -> bytes:
    fn = next(f for f in entry["functions"] if f["name"].startswith("tracepoint__"))
    fn["insns"] = base64.b64encode(struct.pack("<BBhi", 0x95, 0, 0, 0)).decode()  # `exit` with R0 never set
    return json.dumps(entry).encode()


def _wrong_key(entry: dict[str, Any]) -> bytes:
    return json.dumps({**entry, "key": "0" * 64}).encode()


@pytest.mark.parametrize(("damage", "why"), [(_garbage, "unreadable: "),
                                             (_verifier_refuses, "Failed to load BPF program tracepoint__"),
                                             (_wrong_key, "not this program's entry")])
def test_damaged_cache_file_means_compile_and_replace(tmp_path: Path, damage: Any, why: str) -> None:
    assert _load(tmp_path) == "compiled, cached"
    (path,) = tmp_path.glob("*.json")
    good = json.loads(path.read_bytes())
    path.write_bytes(damage(json.loads(path.read_bytes())))
    status = _load(tmp_path)
    assert status.startswith(f"cache unusable ({why}") and status.endswith("): compiled, cached"), status
    assert json.loads(path.read_bytes())["functions"] == good["functions"]  # replaced by a good entry
    assert _load(tmp_path) == "cache hit"


def test_changed_cflag_is_another_key(tmp_path: Path) -> None:
    from ingero_mcp.collector.bccload import import_bcc
    from ingero_mcp.collector.bpfcache import cache_key

    text, cflags = _program()
    bcc = import_bcc()
    other = [*cflags, "-DHAVE_OOM"]
    assert cache_key(bcc, text, cflags) != cache_key(bcc, text, other)
    assert cache_key(bcc, text, cflags) == cache_key(bcc, text, list(cflags))
    assert cache_key(bcc, text, cflags) != cache_key(bcc, text + "\n", cflags)
    assert _load(tmp_path, cflags) == "compiled, cached"
    assert _load(tmp_path, other) == "compiled, cached"
    assert {p.stem for p in tmp_path.glob("*.json")} == {cache_key(bcc, text, cflags), cache_key(bcc, text, other)}
    assert _load(tmp_path, other) == "cache hit"


def test_cache_file_writable_by_others_is_not_loaded(tmp_path: Path) -> None:
    assert _load(tmp_path) == "compiled, cached"
    (path,) = tmp_path.glob("*.json")
    path.chmod(0o666)
    status = _load(tmp_path)
    assert status.startswith("cache unusable (") and "writable by others" in status, status
    assert path.stat().st_mode & 0o777 == 0o600  # replaced by a file of this user's only
    assert _load(tmp_path) == "cache hit"
