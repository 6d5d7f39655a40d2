-- call_class: what a span of CUDA calls was for, from its outermost call (a macro: call_spans and the spans a v9
-- store keeps as its calls, call_spans_kept.sql, class them by this one rule).
--   'sync' (synchronise calls, and copies under 1 MiB: loss.item() and the like wait for the stream's queued work,
--   their own transfer is negligible), 'copy_pinned', 'copy_pageable', 'copy' (pinned or not unknown), 'alloc'
--   (device or host memory allocated, freed, registered), 'launch_first' (the process's first launch of that
--   kernel), 'launch', 'other'
CREATE OR REPLACE TEMP MACRO call_class(op, bytes, host_pinned, first_launch) AS
    CASE WHEN contains(op, 'ynchronize') THEN 'sync'
         WHEN contains(op, 'emcpy') AND coalesce(bytes, 0) < 1048576 THEN 'sync'
         WHEN contains(op, 'emcpy') AND host_pinned THEN 'copy_pinned'
         WHEN contains(op, 'emcpy') AND NOT host_pinned THEN 'copy_pageable'
         WHEN contains(op, 'emcpy') THEN 'copy'
         WHEN contains(op, 'lloc') OR contains(op, 'Free') OR contains(op, 'egister') THEN 'alloc'
         WHEN contains(op, 'aunch') AND first_launch THEN 'launch_first'
         WHEN contains(op, 'aunch') THEN 'launch'
         ELSE 'other' END;
