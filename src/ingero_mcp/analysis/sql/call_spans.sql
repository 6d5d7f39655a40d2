-- call_spans: the time each thread spent inside CUDA calls, as disjoint spans (a runtime call and the
-- driver calls nested in it, or overlapping calls, are one span), with what the span was for.
-- Needs: cuda_calls (complete rows; an Ingero import holds a sample and is not accounted).
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
CREATE OR REPLACE TEMP VIEW call_spans AS
WITH c AS (
    SELECT pid, tid, ts_ns AS s, ts_ns + greatest(duration_ns, 0) AS e, op, bytes, memcpy_kind, host_pinned, kernel_handle,
           kernel_handle IS NOT NULL
               AND row_number() OVER (PARTITION BY pid, kernel_handle ORDER BY ts_ns) = 1 AS first_launch
    FROM cuda_calls
),
m AS (
    SELECT *,
           max(e) OVER (PARTITION BY pid, tid ORDER BY s, e ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev_end
    FROM c
),
g AS (
    SELECT *,
           sum(CASE WHEN prev_end IS NULL OR s >= prev_end THEN 1 ELSE 0 END)
               OVER (PARTITION BY pid, tid ORDER BY s, e ROWS UNBOUNDED PRECEDING) AS span_no
    FROM m
),
u AS (
    SELECT pid, tid, span_no, min(s) AS start_ns, max(e) AS end_ns, count(*) AS calls,
           arg_min(op, s) AS op, arg_min(bytes, s) AS bytes, arg_min(memcpy_kind, s) AS memcpy_kind,
           arg_min(host_pinned, s) AS host_pinned, arg_min(kernel_handle, s) AS kernel_handle,
           bool_or(first_launch) AS first_launch
    FROM g GROUP BY ALL
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
