-- v10: sched_intervals' off_cpu_ns, sleep_ns and cpu_wait_ns are computed from the interval's moments (generated
-- columns: DuckDB computes them as they are read, nothing is stored). Every collector row and every row of the 96
-- stores this project had recorded, imported or generated held exactly these values (checked before the change).
-- Why: at 10M events they were 23.6 MB of a 181 MB store (2.4 B/event) holding what off_ns, on_ns, wakeup_ns and
-- prev_state already say. Writers still give the three columns; the store checks them against these rules and
-- refuses rows that disagree (store/schema.py, insert_sql), so nothing is lost unseen.
-- stopped_ns is the one new fact stored: when the recording stopped with the thread still off-CPU (on_ns NULL), the
-- end of what off_cpu_ns counts; NULL on every other row. preemptor_pid and last_holder_pid are their threads' tids
-- where the numbers are the same (a process's main thread, or a tgid not seen): the pid is stored only where not
-- (at 10M events: 7.9 of the 7.9 MB they took; in the H200 zoo's stores 9-100% of the rows were the same number).
-- The rules, by prev_state:
--   'preempted', 'new': runnable from off_ns, no sleep; waited for a CPU until on_ns (or the stop)
--   'blocked' (v1's rows only): asleep until the wakeup when seen, else until on_ns; then waited for a CPU
--   any other state: asleep until wakeup_ns, then waited for a CPU until on_ns (or the stop); a wakeup not seen
--     leaves both unknown (NULL), unless the stop found it still asleep: asleep until the stop
CREATE TABLE sched_intervals_v10 (
    session_id         INTEGER NOT NULL,
    pid                INTEGER NOT NULL,
    tid                INTEGER NOT NULL,
    off_ns             BIGINT  NOT NULL,
    on_ns              BIGINT,             -- NULL if still off-CPU when the trace ended (then stopped_ns)
    off_cpu_ns         BIGINT GENERATED ALWAYS AS (coalesce(on_ns, stopped_ns) - off_ns) VIRTUAL,
    prev_state         VARCHAR NOT NULL,
    preemptor_pid      INTEGER GENERATED ALWAYS AS (coalesce(preemptor_pid_if_other, preemptor_tid)) VIRTUAL,
    preemptor_comm     VARCHAR,
    cpu                INTEGER,
    wakeup_ns          BIGINT,
    sleep_ns           BIGINT GENERATED ALWAYS AS (CASE
        WHEN prev_state IN ('preempted', 'new') THEN 0
        WHEN prev_state = 'blocked' THEN coalesce(wakeup_ns, on_ns) - off_ns
        WHEN wakeup_ns IS NOT NULL THEN wakeup_ns - off_ns
        WHEN on_ns IS NULL THEN stopped_ns - off_ns END) VIRTUAL,
    cpu_wait_ns        BIGINT GENERATED ALWAYS AS (CASE
        WHEN prev_state IN ('preempted', 'new') THEN coalesce(on_ns, stopped_ns) - off_ns
        WHEN wakeup_ns IS NOT NULL THEN coalesce(on_ns, stopped_ns) - wakeup_ns
        WHEN on_ns IS NULL AND prev_state <> 'blocked' THEN stopped_ns - stopped_ns END) VIRTUAL,
    preemptor_tid      INTEGER,
    on_cpu             INTEGER,
    last_holder_pid    INTEGER GENERATED ALWAYS AS (coalesce(last_holder_pid_if_other, last_holder_tid)) VIRTUAL,
    last_holder_tid    INTEGER,
    last_holder_comm   VARCHAR,
    waker_pid          INTEGER,
    waker_tid          INTEGER,
    waker_comm         VARCHAR,
    waker_context      VARCHAR,
    syscall            VARCHAR,
    kstack_id          BIGINT,
    ustack_id          BIGINT,
    stopped_ns         BIGINT,             -- on_ns NULL: when the recording stopped (off_cpu_ns runs to it)
    preemptor_pid_if_other   INTEGER,      -- preemptor_pid where it is not preemptor_tid (NULL: the same number)
    last_holder_pid_if_other INTEGER       -- last_holder_pid where it is not last_holder_tid
);
INSERT INTO sched_intervals_v10 BY NAME
    SELECT * EXCLUDE (off_cpu_ns, sleep_ns, cpu_wait_ns, preemptor_pid, last_holder_pid),
        CASE WHEN on_ns IS NULL THEN off_ns + off_cpu_ns END AS stopped_ns,
        CASE WHEN preemptor_pid IS DISTINCT FROM preemptor_tid THEN preemptor_pid END AS preemptor_pid_if_other,
        CASE WHEN last_holder_pid IS DISTINCT FROM last_holder_tid THEN last_holder_pid END AS last_holder_pid_if_other
    FROM sched_intervals;
DROP TABLE sched_intervals;
ALTER TABLE sched_intervals_v10 RENAME TO sched_intervals;

-- cuda_calls.kernel_handle (the launched function's address) is computed from kernel_key, the same number stored as
-- text: DuckDB keeps a text column's distinct values once per segment (dictionary compression) and an integer
-- column's not, and a job launches a few dozen kernels millions of times. At 10M events: 15.7 -> 6.3 MB.
CREATE TABLE cuda_calls_v10 (
    session_id          INTEGER NOT NULL,
    ts_ns               BIGINT  NOT NULL,
    duration_ns         BIGINT,
    pid                 INTEGER NOT NULL,
    tid                 INTEGER NOT NULL,
    api                 VARCHAR NOT NULL,
    op                  VARCHAR NOT NULL,
    bytes               BIGINT,
    memcpy_kind         VARCHAR,
    stream              UBIGINT,
    return_code         INTEGER,
    off_cpu_ns          BIGINT,
    cpu_wait_ns         BIGINT,
    sleep_ns            BIGINT,
    context_switches    INTEGER,
    page_allocs         INTEGER,
    page_alloc_bytes    BIGINT,
    gpu_id              INTEGER,
    kernel_handle       UBIGINT GENERATED ALWAYS AS (CAST(kernel_key AS UBIGINT)) VIRTUAL,
    host_ptr            UBIGINT,
    host_pinned         BOOLEAN,
    kernel_key          VARCHAR            -- launches: kernel_handle in decimal (NULL: none)
);
INSERT INTO cuda_calls_v10 BY NAME
    SELECT * EXCLUDE (kernel_handle), CAST(kernel_handle AS VARCHAR) AS kernel_key FROM cuda_calls;
DROP TABLE cuda_calls;
ALTER TABLE cuda_calls_v10 RENAME TO cuda_calls;

-- acct_thread_sleeps.dur_ns (a sleep's length) is computed from its start and end: 2.1 MB at 10M events.
CREATE TABLE acct_thread_sleeps_v10 (
    pid INTEGER, tid INTEGER,
    sleep_state VARCHAR,       -- 'S' or 'D'
    start_ns BIGINT, end_ns BIGINT, dur_ns BIGINT GENERATED ALWAYS AS (end_ns - start_ns) VIRTUAL,
    cpu INTEGER,
    waker_pid INTEGER, waker_tid INTEGER, waker_comm VARCHAR, waker_context VARCHAR, syscall VARCHAR,
    inside_ns HUGEINT          -- the part of the sleep inside the thread's CUDA calls (0: outside every call)
);
INSERT INTO acct_thread_sleeps_v10 BY NAME SELECT * EXCLUDE (dur_ns) FROM acct_thread_sleeps;
DROP TABLE acct_thread_sleeps;
ALTER TABLE acct_thread_sleeps_v10 RENAME TO acct_thread_sleeps;
