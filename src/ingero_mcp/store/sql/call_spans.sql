-- call_spans: call_span_rows (the time each thread spent inside CUDA calls, as disjoint spans) with what each span
-- was for, call_class. The columns and how the rows are made: call_span_rows.sql.
-- Needs: call_span_rows.
--   call_class         'sync' (synchronise calls, and copies under 1 MiB: loss.item() and the like wait
--                      for the stream's queued work, their own transfer is negligible), 'copy_pinned',
--                      'copy_pageable', 'copy' (pinned or not unknown), 'alloc' (device or host memory allocated,
--                      freed, registered), 'launch_first' (the process's first launch of that kernel), 'launch',
--                      'other'
CREATE OR REPLACE TEMP VIEW call_spans AS
SELECT pid, tid, start_ns, end_ns, calls, before_ns, op, bytes, memcpy_kind, host_pinned, kernel_handle,
       CASE WHEN contains(op, 'ynchronize') THEN 'sync'
            WHEN contains(op, 'emcpy') AND coalesce(bytes, 0) < 1048576 THEN 'sync'
            WHEN contains(op, 'emcpy') AND host_pinned THEN 'copy_pinned'
            WHEN contains(op, 'emcpy') AND NOT host_pinned THEN 'copy_pageable'
            WHEN contains(op, 'emcpy') THEN 'copy'
            WHEN contains(op, 'lloc') OR contains(op, 'Free') OR contains(op, 'egister') THEN 'alloc'
            WHEN contains(op, 'aunch') AND first_launch THEN 'launch_first'
            WHEN contains(op, 'aunch') THEN 'launch'
            ELSE 'other' END AS call_class
FROM call_span_rows;
