-- thread_sleeps: every sleep of a traced thread (thread_state's 'sleeping' rows) with the time it spent inside
-- CUDA calls: who ended a thread's sleeps outside calls (accounting.wakers_sql) is a filter on inside_ns = 0.
-- Needs: thread_state, call_spans.
--   pid, tid, sleep_state, start_ns, end_ns, dur_ns, cpu, waker_*, syscall   as in thread_state
--   inside_ns          the part of the sleep inside the thread's CUDA calls (0: the sleep was outside every call)
-- How: the in-call time up to each sleep's start and end, one ASOF join of the distinct moments against call_spans
-- (before_ns + least(t, end_ns) - start_ns of the last span starting at or before t), as thread_seconds does.
CREATE OR REPLACE TEMP VIEW thread_sleeps AS
WITH s AS (
    SELECT pid, tid, sleep_state, start_ns, end_ns, dur_ns, cpu, waker_pid, waker_tid, waker_comm, waker_context, syscall
    FROM thread_state WHERE state = 'sleeping'
),
m AS (
    SELECT pid, tid, start_ns AS t FROM s UNION SELECT pid, tid, end_ns FROM s
),
in_call AS (
    SELECT m.pid, m.tid, m.t, coalesce(c.before_ns + least(m.t, c.end_ns) - c.start_ns, 0) AS in_ns
    FROM m ASOF LEFT JOIN call_spans c ON m.pid = c.pid AND m.tid = c.tid AND c.start_ns <= m.t
),
s_inb AS (
    SELECT s.*, ie.in_ns - ia.in_ns AS inside_ns
    FROM s JOIN in_call ia ON s.pid = ia.pid AND s.tid = ia.tid AND s.start_ns = ia.t
           JOIN in_call ie ON s.pid = ie.pid AND s.tid = ie.tid AND s.end_ns = ie.t
)
SELECT pid, tid, sleep_state, start_ns, end_ns, dur_ns, cpu, waker_pid, waker_tid, waker_comm, waker_context, syscall,
       inside_ns
FROM s_inb;
