-- call_spans_kept: call_spans' rows read from a v9 store (schemas/v9.sql), which keeps in acct_call_spans only the
-- spans that are not simply one call: every span of a thread whose calls nested or overlapped (a span of several
-- calls) and the process's first launches. A span of a thread whose calls never overlapped is that call (start_ns
-- its ts_ns, end_ns ts_ns + duration_ns, calls 1, its op, bytes, memcpy_kind, host_pinned, kernel_handle; not a
-- first launch, those are kept): read from cuda_calls, not stored twice.
-- Needs: cuda_calls, acct_call_spans (finished by v9: views.KEPT_SINCE), call_class.
-- How: the timed calls (entry-only calls have no span) of threads with no span of several calls, less the kept first
-- launches (matched by thread, start and kernel handle: two calls of one thread starting together both launching
-- the same kernel cannot be told apart, as in call_span_rows.sql), with the kept spans. before_ns is NULL in both
-- (store/views.py RECOMPUTED computes it where it is read).
CREATE OR REPLACE TEMP VIEW call_spans_kept AS
SELECT pid, tid, start_ns, end_ns, calls, before_ns, op, bytes, memcpy_kind, host_pinned, kernel_handle, call_class
FROM acct_call_spans
UNION ALL
SELECT c.pid, c.tid, c.ts_ns, c.ts_ns + greatest(c.duration_ns, 0), 1, NULL, c.op, c.bytes, c.memcpy_kind,
       c.host_pinned, c.kernel_handle, call_class(c.op, c.bytes, c.host_pinned, FALSE)
FROM cuda_calls c
ANTI JOIN (SELECT DISTINCT pid, tid FROM acct_call_spans WHERE calls > 1) n ON c.pid = n.pid AND c.tid = n.tid
ANTI JOIN (SELECT pid, tid, start_ns, kernel_handle FROM acct_call_spans WHERE calls = 1) f
    ON c.pid = f.pid AND c.tid = f.tid AND c.ts_ns = f.start_ns AND c.kernel_handle = f.kernel_handle
WHERE c.duration_ns IS NOT NULL;
