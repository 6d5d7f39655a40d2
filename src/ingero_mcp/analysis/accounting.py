"""Time accounting: where every second of the threads that feed the GPU went, and the phases of a job.

The threads that feed the GPU are the threads that start CUDA work (launches, copies, memsets); the
threads they wait on are those that woke them from their sleeps outside CUDA calls. For each, the
`thread_seconds` view (sql/thread_seconds.sql) splits every second into running outside or inside
CUDA calls, sleeping inside or outside them, waiting for a CPU, and off-CPU of unknown kind; the parts
sum to the wall time, which `check_sums` asserts. Phases come from the feeding process's work rate
per second: where it falls to two thirds of its healthy rate or less for two seconds or more, that stretch
is a slow phase, compared with the healthy baseline by the chains (causes/).

Stalls shorter than that (a 1 s allocator refill every 5 s, another GPU user's 0.6 s bursts) are found where the
per-second rate deviates: those seconds alone are read again in sub-second bins from cuda_calls (episodes.py), and
the runs of low bins that cost something are short slow episodes; repeated (or one big) they make one 'recurrent'
phase per process, with their count, period and the work lost, which the chains contrast with the baseline as they
do a slow phase. Idle time (`idle_sql`: a wait for input ended by an interrupt, nothing queued on the GPU) is kept
apart: an idle server's sleep between requests is not lost feeding time.
"""

from __future__ import annotations

import threading
from bisect import bisect_left
from collections import OrderedDict, defaultdict

import duckdb

from ingero_mcp.analysis._sql import TIMEOUT_WAITS, rows, table_complete
from ingero_mcp.analysis.answers import shared_rows
from ingero_mcp.analysis.models import Account, Accounting, Phase, Progress, SecondAccount, ThreadAccount, TimeWindow
from ingero_mcp.analysis.launches import launch_coverage_sql, launch_recording
from ingero_mcp.analysis.episodes import HEALTHY_FRACTION, recurrent, repeated
from ingero_mcp.analysis.progress import progress_of
from ingero_mcp.analysis.derive import materialize_seconds
from ingero_mcp.store.views import SECONDS_TABLE, reads_made_rows

SECOND_NS = 1_000_000_000
MAX_PROCESSES = 4  # feeding processes accounted, by CUDA work
MIN_FEEDER_SHARE = 0.05  # a thread with less of its process's work calls is not a feeder (unless the only one)
MIN_WAITED_SHARE = 0.05  # a waker that ended less of a feeder's outside sleep is not followed
SLOW_FACTOR = 1.5  # a second is slow when the work rate fell to 1/SLOW_FACTOR of the healthy rate or less
MIN_PHASE_S = 2  # shortest phase, seconds
FULL_SECOND = 0.9  # seconds with less wall than this (first, last) do not decide phases
PARTS = ("run_outside_ns", "run_inside_ns", "sleep_inside_ns", "sleep_outside_ns", "cpu_wait_inside_ns",
         "cpu_wait_outside_ns", "off_cpu_unknown_ns")
_COLUMNS = ("wall_ns",) + PARTS + ("sleep_io_ns", "in_call_ns", "work_calls")


def origin_ns(con: duckdb.DuckDBPyConnection) -> int | None:
    """The start of the trace's second 0 (the earliest session start)."""
    got = rows(con, "SELECT min(started_ns) FROM sessions")[0][0]
    return None if got is None else int(got)


def seconds_in(window: TimeWindow | None, t0: int) -> str:
    """Predicate on thread_seconds.k: the seconds that overlap the window."""
    if window is None:
        return "TRUE"
    lo = (window.start_ns - t0) // SECOND_NS
    hi = (window.end_ns - 1 - t0) // SECOND_NS  # the end is exclusive: a window to +20 s ends in second 19
    return f"k BETWEEN {int(lo)} AND {int(hi)}"


# Per process that used CUDA and exited within the trace: the end of its last CUDA call and its exit.
WOUND_DOWN_SQL = ("SELECT c.pid, max(c.ts_ns + coalesce(c.duration_ns, 0))::BIGINT AS last_ns, any_value(p.exit_ns) "
                  "AS exit_ns FROM cuda_calls c JOIN (SELECT pid, max(exit_ns) AS exit_ns FROM processes WHERE exit_ns "
                  "IS NOT NULL GROUP BY pid) p USING (pid) GROUP BY c.pid ORDER BY c.pid")


def wound_down(con: duckdb.DuckDBPyConnection, t0: int) -> list[tuple[int, int, int]]:
    """(pid, the second of its last CUDA call's end, exit ns) of each process that used CUDA and exited within the
    trace at least a second after that second began: what it did after its GPU work was over (a dataset deleted,
    a final sleep, its shutdown) is no part of feeding the GPU (natural_cold_npy_files' 3 s of rmtree after its
    last step read as a MEDIUM io-wait; natural_text_collate's 5 s sleep swelled its wait on the workers)."""
    out = []
    for pid, last_ns, exit_ns in shared_rows(con, WOUND_DOWN_SQL):
        if last_ns is None or exit_ns is None:
            continue
        last_k = (int(last_ns) - t0) // SECOND_NS
        if int(exit_ns) >= t0 + (last_k + 1) * SECOND_NS:
            out.append((int(pid), last_k, int(exit_ns)))
    return out


def _after_the_gpu_work(gone: list[tuple[int, int, int]]) -> str:
    """The predicate on thread_seconds that leaves out each wound-down process's seconds after its last CUDA call's."""
    return (" AND NOT (" + " OR ".join(f"(pid = {pid} AND k > {last_k})" for pid, last_k, _e in gone) + ")"
            if gone else "")


def wind_down_notes(acc: Accounting) -> list[str]:
    """A note per feeding process whose seconds after its last CUDA call the accounting left out, where they hold a
    whole second or more."""
    if not acc.complete or acc.origin_ns is None:
        return []
    fed = {t.pid for t in acc.threads if t.role == "feeder"}
    t0 = acc.origin_ns
    return [f"pid {pid}: from +{last_k + 1} s (the second after its last CUDA call's) to its exit at "
            f"+{(exit_ns - t0) / 1e9:,.1f} s its threads are not accounted: its GPU work was over (SQL: "
            f"{WOUND_DOWN_SQL})" for pid, last_k, exit_ns in acc.wound_down
            if pid in fed and exit_ns >= t0 + (last_k + 2) * SECOND_NS]  # a second or more: a process's exit is not


def account_sql(where: str, table: str = "thread_seconds") -> str:
    """Per-thread totals of thread_seconds (the SQL behind ThreadAccount.total)."""
    sums = ", ".join(f"sum({c})::BIGINT AS {c}" for c in _COLUMNS)
    return f"SELECT pid, tid, {sums} FROM {table} WHERE {where} GROUP BY pid, tid"


def _account(values: tuple) -> Account:
    return Account(**{c: int(v or 0) for c, v in zip(_COLUMNS, values, strict=True)})


def check_sums(account: Account) -> None:
    """The parts must sum to the wall time and none may be negative (the accounting's invariant; the tests assert it
    on every store they have, the analysis clamps instead: `clamped`)."""
    parts = [getattr(account, p) for p in PARTS]
    if sum(parts) != account.wall_ns or min(parts) < 0:
        raise AssertionError(f"time accounting does not add up: {dict(zip(PARTS, parts, strict=True))} vs wall "
                             f"{account.wall_ns}")


def clamped(account: Account) -> tuple[Account, bool]:
    """An account whose parts add up to its wall time, none negative, and whether it had to be mended. Damaged rows
    (overlapping or inverted intervals of one thread) can leave a part negative: it is set to 0, and the parts are
    scaled to the wall time, so the report stays whole and says it was mended (data_quality_sql counts the rows)."""
    parts = {p: getattr(account, p) for p in PARTS}
    if sum(parts.values()) == account.wall_ns and min(parts.values()) >= 0:
        return account, False
    parts = {p: max(0, v) for p, v in parts.items()}
    total = sum(parts.values())
    if total > account.wall_ns > 0:
        parts = {p: v * account.wall_ns // total for p, v in parts.items()}
    parts["run_outside_ns"] += account.wall_ns - sum(parts.values())  # what is left: running, as the view counts it
    update = {**parts, "sleep_io_ns": min(max(0, account.sleep_io_ns), parts["sleep_outside_ns"])}
    return account.model_copy(update=update), True


def _names(con: duckdb.DuckDBPyConnection) -> tuple[dict[int, str], dict[int, str]]:
    """Thread names (tid -> latest comm) and process names (pid -> comm), from what the store has."""
    threads: dict[int, str] = {}
    procs = {int(p): c for p, c in rows(con, "SELECT pid, comm FROM processes WHERE comm IS NOT NULL")}
    try:
        threads = {int(t): c for t, c in rows(con, "SELECT tid, arg_max(comm, coalesce(last_seen_ns, 0)) FROM threads "
                                                   "WHERE comm IS NOT NULL GROUP BY tid")}
    except duckdb.Error:
        threads = {}
    for pid, comm in procs.items():
        threads.setdefault(pid, comm)
    return threads, procs


def latest_name_sql(tid_col: str, comm_expr: str) -> str:
    """SQL for a thread's latest name (as thread_names has it; the row's own comm where none was recorded), so that
    evidence SQL names a waker as the text does: a spawned worker woke it as python3, named pt_data_worker later."""
    return (f"coalesce((SELECT arg_max(n.comm, coalesce(n.last_seen_ns, 0)) FROM threads n WHERE n.tid = {tid_col} "
            f"AND n.comm IS NOT NULL), {comm_expr})")


def thread_names(con: duckdb.DuckDBPyConnection) -> dict[int, str]:
    """tid -> its latest name (main threads: the process name when no thread name was recorded)."""
    return _names(con)[0]


def unaccountable(con: duckdb.DuckDBPyConnection) -> str | None:
    """Why this store cannot be accounted (a sample of CUDA or scheduler rows, no scheduler rows), or None."""
    if not table_complete(con, "cuda_calls") or not table_complete(con, "sched_intervals"):
        return ("this store holds a sample of the CUDA calls or scheduler rows (an import): time "
                "accounting needs every row, so only per-call statistics and the origin's own chains are shown")
    if not rows(con, "SELECT 1 FROM sched_intervals LIMIT 1"):
        return "no scheduler rows were recorded: where the feeding threads' time went cannot be told"
    return None


def accounting(con: duckdb.DuckDBPyConnection, window: TimeWindow | None = None,
               pids: list[int] | None = None) -> Accounting:
    """The feeding threads' time over the window, whole and per second, and each feeding process's phases."""
    why = unaccountable(con)
    if why:
        from ingero_mcp.analysis import imported_accounting as imported  # an import: its complete threads, accounted

        if table_complete(con, "sched_intervals") and table_complete(con, "cuda_calls") or not imported.applies(con):
            return Accounting(complete=False, note=why)
        from ingero_mcp.analysis.window import window_or_trace

        imp = imported.imported_accounting(con, window_or_trace(con, window), pids)
        return Accounting(complete=False, note=imp.note, imported=imp)
    t0 = origin_ns(con)
    if t0 is None:
        return Accounting(complete=False, note="the store has no session")
    if not reads_made_rows(con):  # the report derives first; a caller of the accounting alone may not have
        materialize_seconds(con)
    gone = wound_down(con, t0)
    in_window = seconds_in(window, t0) + _after_the_gpu_work(gone)
    only = f" AND pid IN ({', '.join(str(int(p)) for p in pids)})" if pids else ""
    totals = {(int(r[0]), int(r[1])): _account(r[2:]) for r in rows(con, account_sql(in_window + only, SECONDS_TABLE))}
    feeders = _feeders(totals)
    waited = _waited_on(con, feeders, totals, window)
    names, procs = _names(con)
    chosen = [(k, "feeder") for k in feeders] + [(k, "waited-on") for k in waited if k not in feeders]
    per_second = _seconds(con, [k for k, _ in chosen], in_window)
    markers, iterations = progress_of(con, list(dict.fromkeys(k[0] for k in feeders)), t0)
    for (pid, _tid), seconds in per_second.items():
        if pid in iterations:
            for s in seconds:
                s.iterations = iterations[pid][s.k][0] if s.k in iterations[pid] else None  # outside the marks
    threads = []
    mended = 0
    for key, role in chosen:
        total, fixed = clamped(totals[key])
        mended += fixed
        seconds = per_second.get(key, [])
        for i, sec in enumerate(seconds):
            seconds[i], fixed = clamped(sec)
            mended += fixed
        idle = 0
        if role == "feeder" and _may_idle(con, key, total, window):
            by_k = {int(k): int(ns) for k, ns in rows(con, idle_sql(key[0], key[1], t0, window))}
            for s in seconds:
                s.idle_ns = min(by_k.get(s.k, 0), s.sleep_outside_ns - s.sleep_io_ns)
            idle = sum(s.idle_ns for s in seconds)
        threads.append(ThreadAccount(pid=key[0], tid=key[1], comm=names.get(key[1]), process_comm=procs.get(key[0]),
                                     role=role, total=total, seconds=seconds, idle_ns=idle))
    phases: list[Phase] = []
    steady_from: dict[int, int] = {}
    for pid in dict.fromkeys(k[0] for k in feeders):
        got, steady = _phases(con, pid, in_window, t0, markers.get(pid), iterations.get(pid))
        phases += got
        if steady is not None:
            steady_from[pid] = steady
    entry_only, coverage = launch_recording(con)
    quality = []
    if mended:
        quality.append(f"{mended} thread accounts (whole windows or seconds) did not add up to their wall "
                       "time and were mended (negative parts set to 0, the rest scaled): the store holds "
                       "overlapping or inverted intervals (counted below)")
    return Accounting(threads=threads, phases=phases, entry_only_launches=entry_only, launch_coverage=coverage,
                      progress=list(markers.values()), steady_from_ns=steady_from, data_quality=quality,
                      origin_ns=t0, thread_names=names, wound_down=gone)



def recording_notes(acc: Accounting) -> list[str]:
    """How the launches were recorded, where it changes what the accounting's numbers mean (v4 stores)."""
    notes = []
    if acc.entry_only_launches:
        notes.append("kernel launches were probed entry-only (duration_ns NULL): the time in them is "
                     "counted as running outside CUDA calls ('run_outside' includes kernel launches)")
    if acc.estimated:
        notes.append(f"the launch probes were attached {100 * (acc.launch_coverage or 0):.1f}% of the time "
                     f"(probe_gaps, SQL: {launch_coverage_sql()}): work_calls and work rates are estimates (launches "
                     "seen, scaled per second by the covered share; seconds without coverage are unknown and left out "
                     "of the phases)")
    return notes


def _feeders(totals: dict[tuple[int, int], Account]) -> list[tuple[int, int]]:
    """Per process (the busiest MAX_PROCESSES by work calls), its threads that start CUDA work."""
    by_pid: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for key, acc in totals.items():
        if acc.work_calls > 0:
            by_pid[key[0]].append(key)
    work = {pid: sum(totals[k].work_calls for k in keys) for pid, keys in by_pid.items()}
    chosen: list[tuple[int, int]] = []
    for pid in sorted(work, key=lambda p: -work[p])[:MAX_PROCESSES]:
        keys = sorted(by_pid[pid], key=lambda k: -totals[k].work_calls)
        chosen += [k for i, k in enumerate(keys) if i == 0 or totals[k].work_calls >= MIN_FEEDER_SHARE * work[pid]]
    return chosen


def wakers_sql(pid: int, tid: int, window: TimeWindow | None, inside: bool = False, io: bool = False) -> str:
    """Who ended a thread's sleeps outside (or inside) CUDA calls in the window, by total sleep ended (each sleep's
    time in the window: one begun long before it, a read() waited in since start-up, counts its part in it only);
    with `io`, its sleeps in D state only (the accounting's IO part)."""
    lo, hi = (window.start_ns, window.end_ns) if window else (-(2**62), 2**62)
    cond = ("> 0" if inside else "= 0") + (" AND sleep_state = 'D'" if io else "")
    # thread_sleeps (sql/thread_sleeps.sql) holds each sleep's in-call time: made once per connection (or stored in a
    # v3 store), where this query's own ASOF join sorted the thread's spans (7.4M at 10M events) on every run.
    # A waker's syscall is the one its sleeps spent the most time in: the longest single sleep (a 10 ms
    # Popen.wait among 4,000 timed futex waits of 2 ms) would name the few, not what the thread waited in.
    return f"""
        WITH s AS (SELECT waker_pid, waker_tid, waker_comm, waker_context, sleep_state, syscall,
                          least(end_ns, {int(hi)}) - greatest(start_ns, {int(lo)}) AS dur_ns
                   FROM thread_sleeps WHERE pid = {int(pid)} AND tid = {int(tid)}
                     AND end_ns > {int(lo)} AND start_ns < {int(hi)} AND inside_ns {cond}),
        c AS (SELECT waker_pid, waker_tid, arg_max(syscall, ns) AS syscall
              FROM (SELECT waker_pid, waker_tid, syscall, sum(dur_ns) AS ns FROM s GROUP BY ALL) GROUP BY ALL)
        SELECT s.waker_pid, s.waker_tid, {latest_name_sql('s.waker_tid', 'min(waker_comm)')} AS waker_comm,
               min(waker_context) AS waker_context, count(*) AS sleeps, sum(dur_ns)::BIGINT AS sleep_ns,
               sum(dur_ns) FILTER (WHERE sleep_state = 'D')::BIGINT AS io_ns, any_value(c.syscall) AS syscall
        FROM s LEFT JOIN c
          ON c.waker_pid IS NOT DISTINCT FROM s.waker_pid AND c.waker_tid IS NOT DISTINCT FROM s.waker_tid
        GROUP BY s.waker_pid, s.waker_tid ORDER BY sleep_ns DESC"""


# waits for input: a server's event loop, a socket read (a timer's sleep, a futex (a lock, the GIL) are not)
INPUT_WAITS = ("epoll_wait", "epoll_pwait", "epoll_pwait2", "poll", "ppoll", "select", "pselect6", "recvfrom",
               "recvmsg", "recvmmsg", "accept", "accept4", "read", "readv")  # TIMEOUT_WAITS among them
# An input wait an interrupt ended: a packet (softirq), or a hard interrupt that was not the wait's own timeout
INPUT_ARRIVED = f"(waker_context = 'softirq' OR (waker_context = 'irq' AND syscall NOT IN {TIMEOUT_WAITS}))"


# A client's wait for the reply to what it sent (its user stack at the switch-out): the program asked and cannot go
# on without the answer, which is no idle server's wait for a request (natural_http_metrics_push's POST per step).
REPLY_FRAMES = r"getresponse|HTTPResponse\.begin|\.read_response|MultiCallable"


def input_ended(pid: int, tid: int, lo: int, hi: int) -> str:
    """INPUT_ARRIVED, and a poll wait's timeouts where input ended such waits of the thread in [lo, hi) too: the ticks
    of an event loop waiting for the network (epoll with a timeout) are its wait for input; a poll wait only its timer
    ever ended is a sleep the program chose (select_rate_limiter's), or one for something that never came. Never a
    wait in a client's request for a reply (REPLY_FRAMES on its user stack)."""
    return (f"({INPUT_ARRIVED} OR (waker_context = 'irq' AND syscall IN {TIMEOUT_WAITS} AND EXISTS (SELECT 1 FROM "
            f"thread_sleeps n WHERE n.pid = {int(pid)} AND n.tid = {int(tid)} AND n.waker_context = 'softirq' AND "
            f"n.syscall IN {TIMEOUT_WAITS} AND n.end_ns > {int(lo)} AND n.start_ns < {int(hi)}))) "
            f"AND start_ns NOT IN (SELECT i.off_ns FROM sched_intervals i JOIN stacks st ON st.stack_id = i.ustack_id "
            f"AND st.session_id = i.session_id WHERE i.pid = {int(pid)} AND i.tid = {int(tid)} "
            f"AND i.on_ns > {int(lo)} AND i.off_ns < {int(hi)} "
            f"AND regexp_matches(array_to_string(st.frames, ' '), '{REPLY_FRAMES}'))")


def idle_sql(pid: int, tid: int, t0: int, window: TimeWindow | None = None) -> str:
    """Per second, a feeding thread's idle time: its sleeps outside CUDA calls (S state) in a wait for input
    (INPUT_WAITS) that input ended (INPUT_ARRIVED: a packet, a device; not another task, nor the wait's own timeout),
    begun after a synchronising call
    (call_spans.call_class 'sync': everything it had queued on the GPU was done). Nothing was queued and the thread
    waited for input: that time is not lost feeding time (an idle server between requests)."""
    lo, hi = (window.start_ns, window.end_ns) if window else (-(2**62), 2**62)
    return " ".join(f"""
        WITH s AS (SELECT start_ns, end_ns FROM thread_sleeps
                   WHERE pid = {int(pid)} AND tid = {int(tid)} AND inside_ns = 0 AND sleep_state = 'S'
                     AND {input_ended(pid, tid, lo, hi)} AND syscall IN {INPUT_WAITS}
                     AND end_ns > {int(lo)} AND start_ns < {int(hi)}),
        c AS (SELECT start_ns, call_class FROM call_spans WHERE pid = {int(pid)} AND tid = {int(tid)}),
        i AS (SELECT greatest(s.start_ns, {int(lo)}) AS a, least(s.end_ns, {int(hi)}) AS b
              FROM s ASOF JOIN c ON c.start_ns <= s.start_ns WHERE c.call_class = 'sync'),
        p AS (SELECT a, b, unnest(range((a - {t0}) // {SECOND_NS}, (b - 1 - {t0}) // {SECOND_NS} + 1)) AS k FROM i)
        SELECT k, sum(least(b, {t0} + (k + 1) * {SECOND_NS}) - greatest(a, {t0} + k * {SECOND_NS}))::BIGINT AS idle_ns
        FROM p GROUP BY k ORDER BY k""".split())


MIN_IDLE_SHARE = 0.01  # idle under this share of a thread's wall is not looked for (nor subtracted)


def _may_idle(con: duckdb.DuckDBPyConnection, key: tuple[int, int], total: Account, window: TimeWindow | None) -> bool:
    """Whether a thread's waits for input that an interrupt ended add up to MIN_IDLE_SHARE of its wall: only then is
    idle_sql (an ASOF join over the thread's call spans) worth its cost."""
    if total.sleep_outside_ns < MIN_IDLE_SHARE * total.wall_ns:
        return False
    lo, hi = (window.start_ns, window.end_ns) if window else (-(2**62), 2**62)
    got = shared_rows(con, f"SELECT sum(least(end_ns, {hi}) - greatest(start_ns, {lo})) FROM thread_sleeps "
                    f"WHERE pid = {int(key[0])} AND tid = {int(key[1])} AND inside_ns = 0 AND sleep_state = 'S' "
                    f"AND {input_ended(key[0], key[1], lo, hi)} AND syscall IN {INPUT_WAITS} "
                    f"AND end_ns > {int(lo)} AND start_ns < {int(hi)}")[0][0]
    return (got or 0) >= MIN_IDLE_SHARE * total.wall_ns


def _waited_on(con: duckdb.DuckDBPyConnection, feeders: list[tuple[int, int]], totals: dict[tuple[int, int], Account],
               window: TimeWindow | None) -> list[tuple[int, int]]:
    """Traced threads that woke a feeder from a good part of its sleeps outside CUDA calls."""
    out: list[tuple[int, int]] = []
    for pid, tid in feeders:
        sleep = totals[(pid, tid)].sleep_outside_ns
        if sleep <= 0:
            continue
        for wpid, wtid, *_rest, sleep_ns, _io, _sc in shared_rows(con, wakers_sql(pid, tid, window)):
            key = (int(wpid), int(wtid)) if wpid is not None and wtid is not None else None
            if key and key in totals and key != (pid, tid) and (sleep_ns or 0) >= MIN_WAITED_SHARE * sleep:
                out.append(key)
    return list(dict.fromkeys(out))


def _seconds(con: duckdb.DuckDBPyConnection, keys: list[tuple[int, int]],
             in_window: str) -> dict[tuple[int, int], list[SecondAccount]]:
    if not keys:
        return {}
    which = " OR ".join(f"(pid = {int(p)} AND tid = {int(t)})" for p, t in keys)
    cols = ", ".join(_COLUMNS)
    util = dict(_gpu_util_per_second(con))
    got: dict[tuple[int, int], list[SecondAccount]] = defaultdict(list)
    for r in shared_rows(con, f"SELECT pid, tid, k, start_ns, {cols} FROM {SECONDS_TABLE} "
                              f"WHERE {in_window} AND ({which}) "
                              "ORDER BY pid, tid, k"):
        values = {c: int(v or 0) for c, v in zip(_COLUMNS, r[4:], strict=True)}
        got[(int(r[0]), int(r[1]))].append(SecondAccount(k=int(r[2]), start_ns=int(r[3]),
                                                         gpu_util_percent=util.get(int(r[2])), **values))
    return got


def gpu_util_sql() -> str:
    """Mean GPU utilisation per second of the trace (NVML snapshots)."""
    return ("SELECT (s.ts_ns - o.t0) // 1000000000 AS k, avg(s.gpu_util_percent) AS gpu_util_percent "
            "FROM snapshots s, (SELECT min(started_ns) AS t0 FROM sessions) o "
            "WHERE s.gpu_util_percent IS NOT NULL GROUP BY ALL")


def _gpu_util_per_second(con: duckdb.DuckDBPyConnection) -> list[tuple[int, float]]:
    return [(int(k), float(u)) for k, u in rows(con, gpu_util_sql())]


def work_rate_sql(pid: int, in_window: str, table: str = "thread_seconds") -> str:
    """A process's CUDA work calls per second, over the seconds in which its busiest thread was seen whole."""
    return f"""
        WITH t AS (SELECT tid FROM {table} WHERE pid = {int(pid)} AND {in_window}
                   GROUP BY tid ORDER BY sum(work_calls) DESC LIMIT 1)
        SELECT s.k, min(s.start_ns) AS start_ns,
               (SELECT CASE WHEN count(*) = count(work_calls) THEN sum(work_calls) END  -- NULL: launches unknown
                FROM {table} a WHERE a.pid = {int(pid)} AND a.k = s.k) AS work_calls,
               max(s.wall_ns) AS wall_ns
        FROM {table} s SEMI JOIN t ON s.tid = t.tid
        WHERE s.pid = {int(pid)} AND {in_window}
        GROUP BY s.k ORDER BY s.k"""


def _phases(con: duckdb.DuckDBPyConnection, pid: int, in_window: str, t0: int, marker: Progress | None = None,
            iterations: dict[int, tuple[float, int]] | None = None) -> tuple[list[Phase], int | None]:
    """Baseline and slow stretches of a process's progress: iterations per second where a marker counts them
    (progress.py), else launches and copies per second (see the module's docstring); and when the process reached its
    steady rate (the end of its start-up: its first healthy second, from its first mark in that second)."""
    every = shared_rows(con, work_rate_sql(pid, in_window, SECONDS_TABLE))
    unit = "launches+copies/s"
    first_mark = None
    if marker is not None and iterations is not None:
        if iterations:
            k0 = min(iterations)
            first_mark = t0 + (k0 + 1) * SECOND_NS - iterations[k0][1]
        # a second's rate is its iterations per ns between the first and the last mark; one with under half a second
        # of that (the trace's edges) is unknown
        unit = "iterations/s"
        every = [(k, start, it * SECOND_NS / seen if seen >= 0.5 * SECOND_NS else None, wall)
                 for k, start, _n, wall in every for it, seen in [iterations.get(int(k), (0.0, 0))]]
    got = [(int(k), int(start), n) for k, start, n, wall in every
           if wall >= FULL_SECOND * SECOND_NS and n is not None]  # n None: unknown (a probe gap; outside the marks)
    if len(got) < 2 * MIN_PHASE_S:
        return [], None
    reference = reference_rate(got)
    if reference <= 0:
        return [], None
    healthy = {k for k, _, n in got if n >= HEALTHY_FRACTION * reference}
    slow = {k for k, _, n in got if n * SLOW_FACTOR <= reference}
    rate = {k: n for k, _, n in got}
    base_rate = sum(rate[k] for k in healthy) / len(healthy)
    phases: list[Phase] = []
    for kind, members in (("baseline", healthy), ("slow", slow)):
        for run in second_runs(sorted(members), allow_gap=1 if kind == "slow" else 0):
            if run[-1] - run[0] + 1 < MIN_PHASE_S:
                continue
            seconds = range(run[0], run[-1] + 1)
            mean = sum(rate.get(k, 0) for k in seconds) / len(seconds)
            window = TimeWindow(start_ns=t0 + run[0] * SECOND_NS, end_ns=t0 + (run[-1] + 1) * SECOND_NS)
            slowdown = (base_rate / mean if mean else float("inf")) if kind == "slow" else None
            phases.append(Phase(pid=pid, kind=kind, window=window, work_rate=round(mean, 3), unit=unit,
                                slowdown=None if slowdown in (None, float("inf")) else round(slowdown, 2)))
    # the job ran at its healthy rate from/until these seconds (a part second counts at its rate per wall time; an
    # iteration rate is per second already)
    seen_healthy = [int(k) for k, _s, n, wall in every if wall >= 0.5 * SECOND_NS
                    and (n or 0) * (1 if first_mark is not None else SECOND_NS / wall) >= HEALTHY_FRACTION * reference]
    steady = None
    if seen_healthy:
        steady = t0 + min(seen_healthy) * SECOND_NS
        steady = max(steady, first_mark) if first_mark is not None else steady
    if sum(1 for k in healthy) < MIN_PHASE_S:
        return [p for p in phases if p.kind == "baseline"], steady
    phases += recurrent(con, pid, t0, got, reference, base_rate, phases, seen_healthy, marker)
    phases = repeated(con, pid, t0, phases, base_rate, steady, marker)
    if not any(p.kind in ("slow", "recurrent") for p in phases):
        return [p for p in phases if p.kind in ("baseline", "other-work")], steady
    return sorted(phases, key=lambda p: p.window.start_ns), steady


def reference_rate(got: list[tuple[int, int, float]]) -> float:
    """The process's healthy rate: the best rate it kept every second for MIN_PHASE_S consecutive seconds (the
    shortest baseline). A job may be slow most of the time (a benchmark of slow settings after a fast one, a loader
    that falls behind after its prefetched batches): a percentile of all seconds would call the slow majority healthy,
    and a one-second burst is not a rate it sustained."""
    rate = {k: n for k, _s, n in got}
    kept = [min(rate[k + i] for i in range(MIN_PHASE_S)) for k in rate
            if all(k + i in rate for i in range(MIN_PHASE_S))]
    if not kept:  # no MIN_PHASE_S consecutive known seconds: the 80th percentile of the seconds' rates
        rates = sorted(rate.values())
        return rates[min(len(rates) - 1, int(0.8 * len(rates)))]
    return max(kept)


def second_runs(ks: list[int], allow_gap: int = 1) -> list[list[int]]:
    """Consecutive runs of second indices, bridging gaps of up to `allow_gap` seconds."""
    runs: list[list[int]] = []
    for k in sorted(ks):
        if runs and k - runs[-1][-1] <= allow_gap + 1:
            runs[-1].append(k)
        else:
            runs.append([k])
    return runs


def sum_seconds(seconds: list[SecondAccount], window: TimeWindow | None = None) -> Account:
    """The total of a thread's seconds whose start lies in the window (all when None); iterations summed over the
    seconds that know them (None when none does)."""
    total = {c: 0 for c in _COLUMNS}
    iterations: float | None = None
    for s in seconds_within(seconds, window):
        for c in _COLUMNS:
            total[c] += getattr(s, c)
        if s.iterations is not None:
            iterations = (iterations or 0.0) + s.iterations
    return Account(**total, iterations=iterations)


# A thread's seconds -> their starts, where they are in order (the chains ask a few seconds of a long trace many
# times): the list is held with them, so its id names it while it is here.
_STARTS: OrderedDict[int, tuple[list[SecondAccount], list[int] | None]] = OrderedDict()
_STARTS_LOCK = threading.Lock()


def seconds_within(seconds: list[SecondAccount], window: TimeWindow | None) -> list[SecondAccount]:
    """The seconds whose start lies in the window (all when None), in their order."""
    if window is None:
        return seconds
    with _STARTS_LOCK:
        known = _STARTS.get(id(seconds))
    if known is None or known[0] is not seconds or (known[1] is not None and len(known[1]) != len(seconds)):
        starts: list[int] | None = [s.start_ns for s in seconds]
        if any(a > b for a, b in zip(starts, starts[1:])):  # type: ignore[index]
            starts = None
        known = (seconds, starts)
        with _STARTS_LOCK:
            _STARTS[id(seconds)] = known
            while len(_STARTS) > 16:
                _STARTS.popitem(last=False)
    starts = known[1]
    if starts is None:
        return [s for s in seconds if window.start_ns <= s.start_ns < window.end_ns]
    return seconds[bisect_left(starts, window.start_ns):bisect_left(starts, window.end_ns)]
