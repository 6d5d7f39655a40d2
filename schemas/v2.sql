-- ingero-mcp trace store, schema version 2: applied on top of v1.sql (a new store gets both, in order).
--
-- Why v2: every off-CPU moment of a traced thread is explained. v1 kept one "blocked" state for
-- "sleeping, then woken and waiting for a CPU", which hid most CPU contention. v2 splits each
-- off-CPU interval into sleeping (switch-out -> wakeup) and waiting for a CPU (runnable: after a
-- preemption, a wakeup or a thread's creation, until switch-in), names who woke the thread and
-- who held the CPU, keeps thread names as they change, the identity of each launched kernel and
-- whether each host<->device copy used pinned memory.
--
-- Stores written by v1 still open: readers lay v2-shaped views over them, with what v1 did not
-- record as NULL (unknown, never zero).
--
-- Semantics, per off-CPU interval of a traced thread [off_ns, on_ns):
--   off_cpu_ns  = on_ns - off_ns = sleep_ns + cpu_wait_ns
--   sleep_ns    = off_ns -> wakeup_ns for a thread that went to sleep (0 if it was preempted)
--   cpu_wait_ns = wakeup_ns -> on_ns after a wakeup (or the thread's creation), off_ns -> on_ns
--                 after a preemption: runnable, waiting for a CPU
-- Per CUDA call, the same split summed over the intervals of the calling thread that fell inside
-- the call (measured in the kernel between the call's entry and its return).
--
-- As the collector records them (collectors/README.md has the details):
--   * An interval's sleep_ns and cpu_wait_ns are both NULL exactly when it is not 'preempted' or
--     'new' and no wakeup was seen (wakeup_ns NULL): the thread went to sleep before the collector
--     attached. Per call, such an interval counts as sleep, so a call's split always sums to off_cpu_ns.
--   * 'new': wakeup_ns = off_ns = the thread's creation, sleep_ns 0, the waker its creator.
--   * A wakeup that races the switch-out (woken after setting its sleeping state, before leaving
--     the CPU) gives wakeup_ns = off_ns, sleep_ns = 0.
--   * preemptor_pid is the first holder's tgid when it was seen leaving that CPU before the thread
--     came back (nearly always), else its tid (v1's meaning); preemptor_* NULL for 'new'.
--   * v1 stores read through v2 views: 'blocked' intervals keep that state, sleep_ns =
--     coalesce(wakeup_ns, on_ns) - off_ns, cpu_wait_ns = on_ns - wakeup_ns (NULL without a wakeup).

-- ---- CUDA calls: the off-CPU split renamed to what it measures; kernel and host-memory facts --
ALTER TABLE cuda_calls RENAME COLUMN preempted_ns TO cpu_wait_ns;  -- runnable, not running (after a preemption or a wakeup)
ALTER TABLE cuda_calls RENAME COLUMN blocked_ns TO sleep_ns;       -- sleeping (GPU wait in the driver, lock, IO), until woken
ALTER TABLE cuda_calls ADD COLUMN kernel_handle UBIGINT;  -- launches: the function launched (cudaLaunchKernel's func,
                                                          -- cuLaunchKernel's CUfunction): "first launch of this kernel"
ALTER TABLE cuda_calls ADD COLUMN host_ptr UBIGINT;       -- copies: the host-side address (src of H2D, dst of D2H);
                                                          -- host allocs / registers / frees: the host range's base
ALTER TABLE cuda_calls ADD COLUMN host_pinned BOOLEAN;    -- copies H2D/D2H: TRUE inside a pinned range seen
                                                          -- (cudaHostAlloc, cuMemHostAlloc, cudaHostRegister, ...);
                                                          -- FALSE outside every pinned range of a process traced from
                                                          -- its first CUDA call; NULL unknown
                                                          -- (collector: "from its first CUDA call" = it had no
                                                          -- /dev/nvidia* open when tracing of it began, or exec'd since)

-- ---- Scheduler intervals: both halves of every off-CPU interval, the waker and the holders ----
-- prev_state (v2): 'preempted' (runnable at switch-out), 'sleeping' (S: interruptible: futex,
-- poll, a queue, a sleep), 'uninterruptible' (D: usually disk or other IO), 'new' (a thread's first
-- wait, from its creation), 'other' (stopped, traced, ...). v1 stores hold 'blocked' (S or D, not told apart).
ALTER TABLE sched_intervals ADD COLUMN sleep_ns BIGINT;        -- off_ns -> wakeup_ns (0 if preempted); NULL: unknown
ALTER TABLE sched_intervals ADD COLUMN cpu_wait_ns BIGINT;     -- runnable -> on_ns; NULL: unknown (wakeup not seen)
ALTER TABLE sched_intervals ADD COLUMN preemptor_tid INTEGER;  -- first holder: the task switched in when this one left
ALTER TABLE sched_intervals ADD COLUMN on_cpu INTEGER;         -- CPU it came back on (cpu: the one it left)
ALTER TABLE sched_intervals ADD COLUMN last_holder_pid INTEGER;  -- last holder: the task that left on_cpu as it came back
ALTER TABLE sched_intervals ADD COLUMN last_holder_tid INTEGER;
ALTER TABLE sched_intervals ADD COLUMN last_holder_comm VARCHAR;
ALTER TABLE sched_intervals ADD COLUMN waker_pid INTEGER;      -- who woke it (read at sched_waking, in the waker's context)
ALTER TABLE sched_intervals ADD COLUMN waker_tid INTEGER;
ALTER TABLE sched_intervals ADD COLUMN waker_comm VARCHAR;
ALTER TABLE sched_intervals ADD COLUMN waker_context VARCHAR;  -- 'task', 'irq' or 'softirq' (then the waker is the interrupted task)
                                                               -- ('irq' includes hrtimer expiries: a nanosleep's end)
ALTER TABLE sched_intervals ADD COLUMN syscall VARCHAR;        -- the system call it slept in ('futex', 'poll', 'read', 'ioctl'...;
                                                               -- NULL: not in a system call, or unknown)
                                                               -- (x86-64 names of the common blocking calls, else 'syscall_<n>';
                                                               -- also set for a thread preempted inside a system call)

-- ---- Host aggregates: on-CPU time per thread and CPU, so the holders of a wait are an overlap --
ALTER TABLE host_aggregates ADD COLUMN tid INTEGER;   -- sched_switch rows: the thread (NULL: per process)
ALTER TABLE host_aggregates ADD COLUMN cpu INTEGER;   -- sched_switch rows: the CPU the slices ran on (NULL: all)

-- ---- Process events: threads and renames --------------------------------------------------
-- event (v2) adds 'thread' (a new thread in a traced process: tid, comm) and 'rename' (a thread's
-- comm changed: prctl(PR_SET_NAME), /proc/<tid>/comm; comm is the new name, old_comm the old one).
ALTER TABLE process_events ADD COLUMN old_comm VARCHAR;

-- Threads of traced processes and their latest names (rewritten whole per session, like processes).
CREATE TABLE IF NOT EXISTS threads (
    session_id      INTEGER NOT NULL,
    pid             INTEGER NOT NULL,
    tid             INTEGER NOT NULL,
    comm            VARCHAR,           -- the latest name seen
    first_seen_ns   BIGINT,
    last_seen_ns    BIGINT,
    exit_ns         BIGINT
);

-- GPU processes seen by NVML each second (also those not traced: another container's job).
CREATE TABLE IF NOT EXISTS gpu_processes (
    session_id          INTEGER NOT NULL,
    ts_ns               BIGINT  NOT NULL,
    gpu_id              INTEGER NOT NULL,
    pid                 INTEGER NOT NULL,
    used_memory_bytes   BIGINT,
    sm_util_percent     DOUBLE             -- NVML's per-process sample, NULL where the driver gives none
);
