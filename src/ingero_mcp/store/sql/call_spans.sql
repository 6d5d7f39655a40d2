-- call_spans: the time each thread spent inside CUDA calls, as disjoint spans (a runtime call and the
-- driver calls nested in it, or overlapping calls, are one span), with what the span was for.
-- Needs: cuda_calls (complete rows; an Ingero import holds a sample and is not accounted). A call without a
-- duration (duration_ns NULL: probed entry-only, the v4 collector's default for kernel launches) has no span: its
-- time is counted outside CUDA calls (the thread ran on into the next call), and it marks no first launch.
--   start_ns, end_ns   the span
--   calls              calls that started in it
--   before_ns          time inside calls on this thread before start_ns: the in-call time up to a
--                      moment t is before_ns + least(t, end_ns) - start_ns of the last span starting
--                      at or before t (an ASOF join), so any overlap with the spans costs two lookups
--   op, bytes, memcpy_kind, host_pinned, kernel_handle   of the span's outermost (first) call
--   call_class         'sync' (synchronise calls, and copies under 1 MiB: loss.item() and the like wait
--                      for the stream's queued work, their own transfer is negligible), 'copy_pinned', 'copy_pageable', 'copy' (pinned or not unknown), 'alloc'
--                      (device or host memory allocated, freed, registered), 'launch_first' (the
--                      process's first launch of that kernel), 'launch', 'other'
-- How (one sort of the calls): a call starts a span when it starts at or after the latest end of the thread's
-- calls before it (in start order); a span ends at that running end just before the next span's start (the
-- thread's last end for its last span), and holds the calls from its first to the next span's first. A span holds
-- a process's first launch of a kernel when the running count of first launches (the earliest call with each kernel
-- handle: few rows, found by a grouping) grows between its first call and the next span's. The cumulative sum runs
-- over the spans, which are fewer than the calls.
CREATE OR REPLACE TEMP VIEW call_spans AS
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
       op, bytes, memcpy_kind, host_pinned, kernel_handle,
       CASE WHEN contains(op, 'ynchronize') THEN 'sync'
            WHEN contains(op, 'emcpy') AND coalesce(bytes, 0) < 1048576 THEN 'sync'
            WHEN contains(op, 'emcpy') AND host_pinned THEN 'copy_pinned'
            WHEN contains(op, 'emcpy') AND NOT host_pinned THEN 'copy_pageable'
            WHEN contains(op, 'emcpy') THEN 'copy'
            WHEN contains(op, 'lloc') OR contains(op, 'Free') OR contains(op, 'egister') THEN 'alloc'
            WHEN contains(op, 'aunch') AND first_launch THEN 'launch_first'
            WHEN contains(op, 'aunch') THEN 'launch'
            ELSE 'other' END AS call_class
FROM u;
