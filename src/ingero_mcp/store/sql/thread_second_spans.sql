-- thread_second_spans: the pieces thread_seconds is made of. Per traced thread, one row per second since the trace
-- start over the part of it in which the thread was seen (its first event to its last; state NULL), and one row per
-- piece of each thread_state span within one second (state, sleep_state as there).
-- Needs: thread_state, cuda_calls, sessions (the trace's first second starts at the earliest session start).
--   pid, tid, k        the thread and the second (since the trace start)
--   a, b               the piece: [a, b) in ns
CREATE OR REPLACE TEMP VIEW thread_second_spans AS
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
)
SELECT pid, tid, k, a, b, NULL::VARCHAR AS state, NULL::VARCHAR AS sleep_state FROM secs
UNION ALL
SELECT pid, tid, k, a, b, state, sleep_state FROM pieces;
