"""The on-CPU stack samples (schema v6) as Perfetto callstack samples: their SQL and their interned stacks.

Each `stack_samples` row becomes a `PerfSample` (pid, tid, cpu, callstack_iid) at its ts_ns, which
trace_processor files in its `perf_sample` table on the thread; each distinct (kernel, user) stack
pair becomes an interned `Callstack` whose `Frame`s carry the function (`function_names`), the
module (a `Mapping` named by `mapping_paths`), the source file (`source_paths`) and line. Perfetto
lists a callstack's frames outermost first; the store keeps them innermost first.
"""

from __future__ import annotations

from collections.abc import Iterator

import duckdb
from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

from ingero_mcp.export import events as ev

KIND = {"kernel": pb.Frame.KIND_KERNEL, "user": pb.Frame.KIND_NATIVE}


def samples_sql(scope: ev.Scope) -> str:
    """The samples in scope, in time order, each with the number of the (kernel, user) stack pair it shows."""
    return f"""
        SELECT ts_ns, pid, tid, cpu,
               CASE WHEN kstack_id IS NULL AND ustack_id IS NULL THEN NULL
                    ELSE dense_rank() OVER (ORDER BY session_id, kstack_id, ustack_id) END AS callstack
        FROM stack_samples {scope.moments()} ORDER BY ts_ns"""


def stacks_sql(scope: ev.Scope) -> str:
    """The stack pairs the samples in scope show (numbered as `samples_sql` numbers them), with both stacks' frames:
    kind, function, module, file and line per frame, innermost first."""
    return f"""
        WITH pairs AS (
            SELECT DISTINCT session_id, kstack_id, ustack_id FROM stack_samples {scope.moments()}
        ), numbered AS (
            SELECT *, dense_rank() OVER (ORDER BY session_id, kstack_id, ustack_id) AS callstack FROM pairs
        )
        SELECT n.callstack, k.kind, k.frames, k.modules, k.files, k.lines,
               u.kind, u.frames, u.modules, u.files, u.lines
        FROM numbered n
        LEFT JOIN stacks k ON k.session_id = n.session_id AND k.stack_id = n.kstack_id
        LEFT JOIN stacks u ON u.session_id = n.session_id AND u.stack_id = n.ustack_id
        WHERE n.kstack_id IS NOT NULL OR n.ustack_id IS NOT NULL
        QUALIFY row_number() OVER (PARTITION BY n.callstack) = 1
        ORDER BY n.callstack"""


def _frames(kind: str | None, frames: list | None, modules: list | None, files: list | None,
            lines: list | None) -> Iterator[tuple]:
    """One stack's frames, outermost first: (kind, function, module, file, line)."""
    frames = frames or []
    n = len(frames)

    def pick(column: list | None, i: int) -> object:
        return column[i] if column is not None and i < len(column) else None

    for i in reversed(range(n)):
        module, file = pick(modules, i), pick(files, i)
        frame_kind = KIND.get(kind or "", pb.Frame.KIND_UNKNOWN)
        if kind == "python":
            frame_kind = pb.Frame.KIND_INTERPRETED if module is None and file is not None else pb.Frame.KIND_NATIVE
        yield (frame_kind, ev.label(frames[i], 300), None if module is None else ev.label(module, 300),
               None if file is None else ev.label(file, 300), pick(lines, i))


class Interner:
    """The interned stacks of one sequence: strings, mappings, frames and callstacks, each given an iid once."""

    def __init__(self) -> None:
        self.tables: dict[str, dict] = {"function_names": {}, "mapping_paths": {}, "source_paths": {},
                                        "mappings": {}, "frames": {}}
        self.data = pb.InternedData()

    def _iid(self, table: str, key: object) -> tuple[int, bool]:
        ids = self.tables[table]
        if key in ids:
            return ids[key], False
        ids[key] = len(ids) + 1
        return ids[key], True

    def _string(self, table: str, text: str) -> int:
        iid, new = self._iid(table, text)
        if new:
            getattr(self.data, table).add(iid=iid, str=text.encode())
        return iid

    def frame(self, kind: int, function: str, module: str | None, file: str | None, line: int | None) -> int:
        iid, new = self._iid("frames", (kind, function, module, file, line))
        if new:
            f = self.data.frames.add(iid=iid, function_name_id=self._string("function_names", function), kind=kind)
            if module is not None:
                f.mapping_id, fresh = self._iid("mappings", module)
                if fresh:
                    self.data.mappings.add(iid=f.mapping_id,
                                           path_string_ids=[self._string("mapping_paths", module)])
            if file is not None:
                f.source_path_iid = self._string("source_paths", file)
            if line is not None:
                f.line_number = int(line)
        return iid

    def callstack(self, iid: int, kernel: tuple, user: tuple) -> None:
        """Callstack `iid`: the user stack's frames from the outermost, then the kernel's."""
        frames = [self.frame(*f) for f in (*_frames(*user), *_frames(*kernel))]
        self.data.callstacks.add(iid=iid, frame_ids=frames)


def interned_stacks(con: duckdb.DuckDBPyConnection, scope: ev.Scope) -> pb.InternedData:
    """Every stack pair the samples in scope show, interned (iid = `samples_sql`'s callstack number)."""
    interner = Interner()
    for row in ev.batches_flat(con, stacks_sql(scope)):
        interner.callstack(int(row[0]), row[1:6], row[6:11])
    return interner.data
