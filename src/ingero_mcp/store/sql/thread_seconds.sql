-- thread_seconds: where each second of each traced thread went (feeder_time_per_second).
-- Needs: thread_state, call_spans, sessions (the trace's first second starts at the earliest session start).
-- One row per (pid, tid, second k since the trace start), over the part of the second in which the
-- thread was seen (its first event to its last). The parts sum to wall_ns exactly:
--   wall_ns = run_outside_ns + run_inside_ns + sleep_inside_ns + sleep_outside_ns
--           + cpu_wait_inside_ns + cpu_wait_outside_ns + off_cpu_unknown_ns
--   run_outside_ns      on a CPU, not in a CUDA call: Python, data preparation, the framework
--   run_inside_ns       on a CPU inside CUDA calls: launch cost, CPU-staged copies, spin-waits
--   sleep_inside_ns     asleep inside CUDA calls: waiting for the GPU (or a driver lock)
--   sleep_outside_ns    asleep outside CUDA calls: on another thread, a lock or the GIL, a queue, IO
--                       (of which sleep_io_ns uninterruptible: usually disk IO)
--   cpu_wait_*_ns       runnable but not running: the CPU was held by another task
--   off_cpu_unknown_ns  off-CPU, split not recorded
--   calls, work_calls   CUDA calls started in the second; work_calls: launches, copies and memsets. Where the
--                       collector's governor detached the launch probes for part of the second (probe_gaps of the
--                       process's session, v4), the launches seen are scaled by the covered share of the thread's
--                       second (an estimate, rounded); with no coverage at all work_calls is NULL (unknown, not 0).
--                       calls counts the rows seen.
CREATE OR REPLACE TEMP VIEW thread_seconds AS
WITH origin AS (
    SELECT min(started_ns) AS t0 FROM sessions
),
life AS (
    SELECT pid, tid, min(lo) AS first_ns, max(hi) AS last_ns FROM (
        SELECT pid, tid, min(ts_ns) AS lo, max(ts_ns + greatest(duration_ns, 0)) AS hi FROM cuda_calls GROUP BY ALL
        UNION ALL
        SELECT pid, tid, min(start_ns), max(end_ns) FROM thread_state GROUP BY ALL
    ) GROUP BY ALL
),
secs AS (
    SELECT pid, tid, k, greatest(first_ns, t0 + k * 1000000000) AS a, least(last_ns, t0 + (k + 1) * 1000000000) AS b
    FROM (SELECT l.*, o.t0, unnest(range((l.first_ns - o.t0) // 1000000000, (l.last_ns - o.t0) // 1000000000 + 1)) AS k
          FROM life l, origin o)
),
pieces AS (
    SELECT pid, tid, state, sleep_state, k,
           greatest(start_ns, t0 + k * 1000000000) AS a, least(end_ns, t0 + (k + 1) * 1000000000) AS b
    FROM (SELECT st.*, o.t0,
                 unnest(range((st.start_ns - o.t0) // 1000000000, (st.end_ns - 1 - o.t0) // 1000000000 + 1)) AS k
          FROM thread_state st, origin o WHERE st.end_ns > st.start_ns)
),
-- The in-call time up to each boundary of a second or a state piece: one ASOF join of the distinct boundaries
-- against call_spans (each join sorts the spans; four joins sorted them four times).
bounds AS (
    SELECT pid, tid, a AS t FROM secs UNION SELECT pid, tid, b FROM secs
    UNION SELECT pid, tid, a FROM pieces UNION SELECT pid, tid, b FROM pieces
),
in_call AS (
    SELECT x.pid, x.tid, x.t, coalesce(c.before_ns + least(x.t, c.end_ns) - c.start_ns, 0) AS in_ns
    FROM bounds x ASOF LEFT JOIN call_spans c ON x.pid = c.pid AND x.tid = c.tid AND c.start_ns <= x.t
),
secs_inb AS (
    SELECT s.*, ib.in_ns - ia.in_ns AS in_call_ns
    FROM secs s JOIN in_call ia ON s.pid = ia.pid AND s.tid = ia.tid AND s.a = ia.t
                JOIN in_call ib ON s.pid = ib.pid AND s.tid = ib.tid AND s.b = ib.t
),
pieces_inb AS (
    SELECT p.*, ib.in_ns - ia.in_ns AS inside_ns
    FROM pieces p JOIN in_call ia ON p.pid = ia.pid AND p.tid = ia.tid AND p.a = ia.t
                  JOIN in_call ib ON p.pid = ib.pid AND p.tid = ib.tid AND p.b = ib.t
),
off AS (
    SELECT pid, tid, k,
           sum(inside_ns) FILTER (WHERE state = 'sleeping') AS sleep_in,
           sum(b - a - inside_ns) FILTER (WHERE state = 'sleeping') AS sleep_out,
           sum(b - a - inside_ns) FILTER (WHERE state = 'sleeping' AND sleep_state = 'D') AS sleep_io,
           sum(inside_ns) FILTER (WHERE state = 'cpu_wait') AS wait_in,
           sum(b - a - inside_ns) FILTER (WHERE state = 'cpu_wait') AS wait_out,
           sum(inside_ns) FILTER (WHERE state = 'off_cpu') AS unk_in,
           sum(b - a) FILTER (WHERE state = 'off_cpu') AS unk
    FROM pieces_inb GROUP BY ALL
),
calls AS (
    SELECT c.pid, c.tid, (c.ts_ns - o.t0) // 1000000000 AS k, count(*) AS calls,
           count(*) FILTER (WHERE contains(c.op, 'aunch')) AS launches,
           count(*) FILTER (WHERE contains(c.op, 'emcpy') OR contains(c.op, 'emset')) AS other_work
    FROM cuda_calls c, origin o GROUP BY ALL
),
-- The launch probes' gaps (v4; none before): per process, those of the sessions it made CUDA calls in.
launch_gaps AS (
    SELECT DISTINCT p.pid, g.start_ns, g.end_ns
    FROM probe_gaps g JOIN (SELECT DISTINCT session_id, pid FROM cuda_calls) p USING (session_id)
    WHERE g.probes = 'launch' AND g.end_ns > g.start_ns
),
gap_cover AS (
    SELECT s.pid, s.tid, s.k, sum(least(g.end_ns, s.b) - greatest(g.start_ns, s.a)) AS gap_ns
    FROM secs s JOIN launch_gaps g ON g.pid = s.pid AND g.start_ns < s.b AND g.end_ns > s.a
    GROUP BY ALL
)
SELECT s.pid, s.tid, s.k, s.a AS start_ns, s.b - s.a AS wall_ns,
       s.b - s.a - s.in_call_ns - coalesce(o.sleep_out, 0) - coalesce(o.wait_out, 0)
           - (coalesce(o.unk, 0) - coalesce(o.unk_in, 0)) AS run_outside_ns,
       s.in_call_ns - coalesce(o.sleep_in, 0) - coalesce(o.wait_in, 0) - coalesce(o.unk_in, 0) AS run_inside_ns,
       coalesce(o.sleep_in, 0) AS sleep_inside_ns,
       coalesce(o.sleep_out, 0) AS sleep_outside_ns,
       coalesce(o.sleep_io, 0) AS sleep_io_ns,
       coalesce(o.wait_in, 0) AS cpu_wait_inside_ns,
       coalesce(o.wait_out, 0) AS cpu_wait_outside_ns,
       coalesce(o.unk, 0) AS off_cpu_unknown_ns,
       s.in_call_ns AS in_call_ns,
       coalesce(c.calls, 0) AS calls,
       CASE WHEN coalesce(g.gap_ns, 0) <= 0 THEN coalesce(c.launches, 0) + coalesce(c.other_work, 0)
            WHEN g.gap_ns < s.b - s.a
            THEN round(coalesce(c.launches, 0) * (s.b - s.a) / (s.b - s.a - g.gap_ns))::BIGINT + coalesce(c.other_work, 0)
       END AS work_calls
FROM secs_inb s
LEFT JOIN off o USING (pid, tid, k)
LEFT JOIN calls c USING (pid, tid, k)
LEFT JOIN gap_cover g USING (pid, tid, k)
WHERE s.b > s.a;
