-- call_span_rows: the time each thread spent inside CUDA calls, as disjoint spans (a runtime call and the
-- driver calls nested in it, or overlapping calls, are one span).
-- Needs: cuda_calls (complete rows; an Ingero import holds a sample and is not accounted). A call without a
-- duration (duration_ns NULL: probed entry-only, the v4 collector's default for kernel launches) has no span: its
-- time is counted outside CUDA calls (the thread ran on into the next call), and it marks no first launch.
--   start_ns, end_ns   the span
--   calls              calls that started in it
--   before_ns          time inside calls on this thread before start_ns: the in-call time up to a
--                      moment t is before_ns + least(t, end_ns) - start_ns of the last span starting
--                      at or before t (an ASOF join), so any overlap with the spans costs two lookups
--   op, bytes, memcpy_kind, host_pinned, kernel_handle   of the span's outermost (first) call
--   first_launch       the span holds the process's first launch of a kernel
-- call_spans adds what the span was for (call_class). analysis/derive.py makes the same rows in one linear pass
-- (analysis/spans.py) where it makes the views' rows.
-- How (one sort of the calls): a call starts a span when it starts at or after the latest end of the thread's
-- calls before it (in start order); a span ends at that running end just before the next span's start (the
-- thread's last end for its last span), and holds the calls from its first to the next span's first. A span holds
-- a process's first launch of a kernel when the running count of first launches (the earliest call with each kernel
-- handle: few rows, found by a grouping) grows between its first call and the next span's. The cumulative sum runs
-- over the spans, which are fewer than the calls.
CREATE OR REPLACE TEMP VIEW call_span_rows AS
WITH timed AS (
    SELECT * FROM cuda_calls WHERE duration_ns IS NOT NULL
),
firsts AS (
    SELECT f.* FROM (SELECT pid, kernel_handle, arg_min(tid, ts_ns) AS tid, min(ts_ns) AS ts_ns, TRUE AS first_launch
                     FROM cuda_calls WHERE kernel_handle IS NOT NULL GROUP BY pid, kernel_handle) f
    SEMI JOIN timed USING (pid, tid, ts_ns, kernel_handle)
),
c AS (
    SELECT pid, tid, ts_ns AS s, ts_ns + greatest(cc.duration_ns, 0) AS e, op, bytes, memcpy_kind, host_pinned, kernel_handle,
           max(ts_ns + greatest(cc.duration_ns, 0)) OVER (w ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev_end,
           row_number() OVER w AS rn,
           count(f.first_launch) OVER (w ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS firsts_before
    FROM timed cc LEFT JOIN firsts f USING (pid, tid, ts_ns, kernel_handle)
    WINDOW w AS (PARTITION BY pid, tid ORDER BY ts_ns, ts_ns + greatest(cc.duration_ns, 0))
),
per_thread AS (
    SELECT pid, tid, max(ts_ns + greatest(duration_ns, 0)) AS last_end, count(*) AS n,
           (SELECT count(*) FROM firsts f WHERE f.pid = cc.pid AND f.tid = cc.tid) AS firsts_n
    FROM timed cc GROUP BY ALL
),
u AS (
    SELECT c.pid, c.tid, c.s AS start_ns,
           coalesce(lead(c.prev_end) OVER t, p.last_end) AS end_ns,
           coalesce(lead(c.rn) OVER t, p.n + 1) - c.rn AS calls,
           coalesce(lead(c.firsts_before) OVER t, p.firsts_n) > c.firsts_before AS first_launch,
           c.op, c.bytes, c.memcpy_kind, c.host_pinned, c.kernel_handle
    FROM c JOIN per_thread p USING (pid, tid)
    WHERE c.prev_end IS NULL OR c.s >= c.prev_end
    WINDOW t AS (PARTITION BY c.pid, c.tid ORDER BY c.rn)
)
SELECT pid, tid, start_ns, end_ns, calls,
       coalesce(sum(end_ns - start_ns) OVER (PARTITION BY pid, tid ORDER BY start_ns
                                             ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0) AS before_ns,
       op, bytes, memcpy_kind, host_pinned, kernel_handle, first_launch
FROM u;
