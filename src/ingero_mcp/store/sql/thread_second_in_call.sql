-- thread_second_in_call: thread_second_spans with the time each piece spent inside the thread's CUDA calls.
-- Needs: thread_second_spans, call_spans.
--   inside_ns          of [a, b), the time inside CUDA calls
-- How: the in-call time up to each boundary of a piece, one ASOF join of the distinct boundaries against call_spans
-- (before_ns + least(t, end_ns) - start_ns of the last span starting at or before t). analysis/derive.py computes
-- the same values from the spans in memory where it makes the views' rows.
CREATE OR REPLACE TEMP VIEW thread_second_in_call AS
WITH bounds AS (
    SELECT pid, tid, a AS t FROM thread_second_spans UNION SELECT pid, tid, b FROM thread_second_spans
),
in_call AS (
    SELECT x.pid, x.tid, x.t, coalesce(c.before_ns + least(x.t, c.end_ns) - c.start_ns, 0) AS in_ns
    FROM bounds x ASOF LEFT JOIN call_spans c ON x.pid = c.pid AND x.tid = c.tid AND c.start_ns <= x.t
)
SELECT s.*, ib.in_ns - ia.in_ns AS inside_ns
FROM thread_second_spans s JOIN in_call ia ON s.pid = ia.pid AND s.tid = ia.tid AND s.a = ia.t
                           JOIN in_call ib ON s.pid = ib.pid AND s.tid = ib.tid AND s.b = ib.t;
