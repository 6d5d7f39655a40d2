-- ingero-mcp trace store, schema version 3: applied on top of v2.sql (a new store gets all three, in order).
--
-- Why v3: the time accounting's derived tables, computed ONCE when a store is finished (the
-- collector's fold, a demo scenario's end) instead of by every reader connection (at 10M events that
-- rebuilt ~7.4M call spans and every thread-second per `explain`: ~6 s on two cores). They hold exactly
-- the rows of the views src/ingero_mcp/analysis/sql/{thread_state,call_spans,thread_seconds,thread_sleeps}.sql
-- (same columns, types and meaning: the SQL files document them); readers point those views at
-- these tables when acct_meta says they match the store's current rows, and compute the views
-- as before otherwise (v1/v2 stores, live recordings, a store appended to after they were made,
-- an imported sample: the accounting is refused for imports, so nothing is made for them).
--
-- The tables are not trace tables: the writer does not append to them, live segments never hold
-- them, and migrating an older store creates them empty (acct_meta empty: not made).

-- One row when the derived tables were made, with what they were made from: a reader uses them only
-- while the store still holds exactly these counts and session bounds (an append changes them).
CREATE TABLE IF NOT EXISTS acct_meta (
    made_ns             BIGINT NOT NULL,   -- when they were made (wall clock)
    cuda_calls_n        BIGINT NOT NULL,   -- count(*) of cuda_calls then
    sched_intervals_n   BIGINT NOT NULL,   -- count(*) of sched_intervals then
    sessions_n          BIGINT NOT NULL,   -- count(*) of sessions then
    sessions_start_ns   BIGINT,            -- min(started_ns) of sessions then (thread_seconds' origin)
    sessions_stop_ns    BIGINT,            -- max(stopped_ns) of sessions then (closes thread_state's open intervals)
    views_sql_hash      VARCHAR NOT NULL   -- hash of the three view definitions they were made with
);

-- Rows of the thread_state view (sql/thread_state.sql): every off-CPU moment of a traced thread.
CREATE TABLE IF NOT EXISTS acct_thread_state (
    pid INTEGER, tid INTEGER,
    state VARCHAR,             -- 'sleeping', 'cpu_wait', 'off_cpu'
    sleep_state VARCHAR,       -- 'S' or 'D' (sleeping)
    start_ns BIGINT, end_ns BIGINT, dur_ns BIGINT,
    cpu INTEGER,
    waker_pid INTEGER, waker_tid INTEGER, waker_comm VARCHAR, waker_context VARCHAR, syscall VARCHAR,
    first_holder_pid INTEGER, first_holder_tid INTEGER, first_holder_comm VARCHAR,
    last_holder_pid INTEGER, last_holder_tid INTEGER, last_holder_comm VARCHAR
);

-- Rows of the call_spans view (sql/call_spans.sql): time inside CUDA calls as disjoint spans per thread.
CREATE TABLE IF NOT EXISTS acct_call_spans (
    pid INTEGER, tid INTEGER,
    start_ns BIGINT, end_ns BIGINT,
    calls BIGINT,              -- calls that started in the span
    before_ns HUGEINT,         -- in-call time of the thread before start_ns
    op VARCHAR, bytes BIGINT, memcpy_kind VARCHAR, host_pinned BOOLEAN, kernel_handle UBIGINT,  -- of its first call
    call_class VARCHAR         -- 'sync', 'copy_pinned', 'copy_pageable', 'copy', 'alloc', 'launch_first', 'launch', 'other'
);

-- Rows of the thread_seconds view (sql/thread_seconds.sql): where each second of each traced thread went.
CREATE TABLE IF NOT EXISTS acct_thread_seconds (
    pid INTEGER, tid INTEGER,
    k BIGINT,                  -- second since the trace start (min(sessions.started_ns))
    start_ns BIGINT, wall_ns BIGINT,
    run_outside_ns HUGEINT, run_inside_ns HUGEINT, sleep_inside_ns HUGEINT, sleep_outside_ns HUGEINT,
    sleep_io_ns HUGEINT, cpu_wait_inside_ns HUGEINT, cpu_wait_outside_ns HUGEINT, off_cpu_unknown_ns HUGEINT,
    in_call_ns HUGEINT,
    calls BIGINT, work_calls BIGINT
);

-- Rows of the thread_sleeps view (sql/thread_sleeps.sql): every sleep of a traced thread with its in-call time.
CREATE TABLE IF NOT EXISTS acct_thread_sleeps (
    pid INTEGER, tid INTEGER,
    sleep_state VARCHAR,       -- 'S' or 'D'
    start_ns BIGINT, end_ns BIGINT, dur_ns BIGINT,
    cpu INTEGER,
    waker_pid INTEGER, waker_tid INTEGER, waker_comm VARCHAR, waker_context VARCHAR, syscall VARCHAR,
    inside_ns HUGEINT          -- the part of the sleep inside the thread's CUDA calls (0: outside every call)
);
