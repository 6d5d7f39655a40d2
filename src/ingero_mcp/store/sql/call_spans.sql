-- call_spans: call_span_rows (the time each thread spent inside CUDA calls, as disjoint spans) with what each span
-- was for, call_class (the macro of call_class.sql). The columns and how the rows are made: call_span_rows.sql.
-- Needs: call_span_rows, call_class.
CREATE OR REPLACE TEMP VIEW call_spans AS
SELECT pid, tid, start_ns, end_ns, calls, before_ns, op, bytes, memcpy_kind, host_pinned, kernel_handle,
       call_class(op, bytes, host_pinned, first_launch) AS call_class
FROM call_span_rows;
