-- thread_state: every off-CPU moment of a traced thread, one row per state span.
-- Needs: sched_intervals (v2 columns; v1 stores get them from the reader's compatibility views).
--   state        'sleeping'  switch-out -> wakeup: waiting on something (the GPU in the driver, a lock,
--                            a queue, IO); sleep_state says S (interruptible) or D (uninterruptible: IO)
--                'cpu_wait'  runnable but not running: after a preemption, a wakeup or the thread's
--                            creation, until switch-in; the CPU was held by someone else
--                'off_cpu'   off-CPU, split unknown (the wakeup was not seen, or a v1 'blocked' row
--                            without a wakeup time)
--   start_ns, end_ns, dur_ns  the span; an interval still open when the trace ended is closed at the
--                            session's stop (or left out when the session has no stop)
--   cpu          the CPU it waited on (cpu_wait: where it came back; sleeping: where it left)
--   waker_*, syscall, holder_* as recorded for the interval (NULL: not recorded)
CREATE OR REPLACE TEMP VIEW thread_state AS
WITH stop AS (
    SELECT max(stopped_ns) AS stop_ns FROM sessions
),
iv AS (
    SELECT i.pid, i.tid, i.off_ns,
           coalesce(i.on_ns, CASE WHEN stop.stop_ns > i.off_ns THEN stop.stop_ns END) AS on_ns,
           i.on_ns IS NULL AS still_off,
           i.prev_state, i.sleep_ns, i.cpu_wait_ns, i.wakeup_ns, i.cpu, coalesce(i.on_cpu, i.cpu) AS wait_cpu,
           i.waker_pid, i.waker_tid, i.waker_comm, i.waker_context, i.syscall,
           i.preemptor_pid, i.preemptor_tid, i.preemptor_comm,
           i.last_holder_pid, i.last_holder_tid, i.last_holder_comm
    FROM sched_intervals i, stop
)
SELECT pid, tid, 'sleeping' AS state,
       CASE prev_state WHEN 'sleeping' THEN 'S' WHEN 'uninterruptible' THEN 'D' END AS sleep_state,
       off_ns AS start_ns, off_ns + sleep_ns AS end_ns, sleep_ns AS dur_ns, cpu,
       waker_pid, waker_tid, waker_comm, waker_context, syscall,
       NULL::INTEGER AS first_holder_pid, NULL::INTEGER AS first_holder_tid, NULL::VARCHAR AS first_holder_comm,
       NULL::INTEGER AS last_holder_pid, NULL::INTEGER AS last_holder_tid, NULL::VARCHAR AS last_holder_comm
FROM iv WHERE on_ns IS NOT NULL AND NOT still_off AND sleep_ns > 0 AND cpu_wait_ns IS NOT NULL
UNION ALL
SELECT pid, tid, 'cpu_wait', NULL, on_ns - cpu_wait_ns, on_ns, cpu_wait_ns, wait_cpu,
       waker_pid, waker_tid, waker_comm, waker_context, NULL,
       CASE WHEN prev_state = 'preempted' THEN preemptor_pid END,
       CASE WHEN prev_state = 'preempted' THEN preemptor_tid END,
       CASE WHEN prev_state = 'preempted' THEN preemptor_comm END,
       last_holder_pid, last_holder_tid, last_holder_comm
FROM iv WHERE on_ns IS NOT NULL AND NOT still_off AND cpu_wait_ns > 0 AND sleep_ns IS NOT NULL
UNION ALL
-- A thread still off-CPU at the end: sleeping if it went to sleep, waiting if it was preempted.
SELECT pid, tid, CASE WHEN prev_state = 'preempted' THEN 'cpu_wait' ELSE 'sleeping' END,
       CASE prev_state WHEN 'sleeping' THEN 'S' WHEN 'uninterruptible' THEN 'D' END,
       off_ns, on_ns, on_ns - off_ns, cpu, NULL, NULL, NULL, NULL, syscall,
       NULL, NULL, NULL, NULL, NULL, NULL
FROM iv WHERE still_off AND on_ns IS NOT NULL
UNION ALL
SELECT pid, tid, 'off_cpu', NULL, off_ns, on_ns, on_ns - off_ns, cpu,
       waker_pid, waker_tid, waker_comm, waker_context, syscall,
       NULL, NULL, NULL, NULL, NULL, NULL
FROM iv WHERE on_ns IS NOT NULL AND NOT still_off AND (sleep_ns IS NULL OR cpu_wait_ns IS NULL) AND on_ns > off_ns;
