-- thread_seconds: where each second of each traced thread went (feeder_time_per_second).
-- Needs: thread_second_in_call (the seconds and state pieces of each thread, with their in-call time), cuda_calls,
-- sessions, probe_gaps.
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
secs_inb AS (
    SELECT pid, tid, k, a, b, inside_ns AS in_call_ns FROM thread_second_in_call WHERE state IS NULL
),
pieces_inb AS (
    SELECT pid, tid, state, sleep_state, k, a, b, inside_ns FROM thread_second_in_call WHERE state IS NOT NULL
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
    FROM secs_inb s JOIN launch_gaps g ON g.pid = s.pid AND g.start_ns < s.b AND g.end_ns > s.a
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
