-- ingero-mcp trace store, schema version 5: applied on top of v4.sql.
--
-- Why v5: a wait is explained by what the thread waited in and why it could not run. v4 said that a
-- thread slept and who woke it, and the system call it slept in; a `write()` into a full pipe, onto a
-- disk file or into a socket looked the same, and a thread its cgroup's CPU quota held off the CPU
-- looked like one waiting behind other tasks. Stores written before v5 have none of this (NULL, empty
-- tables): unknown, not zero.

-- The kernel stack of a traced thread as it left the CPU to sleep (S or D: what it waited in), as an
-- id into `stacks`. NULL: a preemption (it waited for a CPU, not in anything), not recorded (before
-- v5), or not taken (its slot in the stack map held another stack: sessions.notes kernel_stacks).
ALTER TABLE sched_intervals ADD COLUMN kstack_id BIGINT;

-- Stacks, deduplicated: one row per distinct stack per session. The id is a hash of the frames, so
-- the same stack has the same id in every session recorded by the same kernel build.
CREATE TABLE IF NOT EXISTS stacks (
    session_id  INTEGER   NOT NULL,
    stack_id    BIGINT    NOT NULL,
    kind        VARCHAR   NOT NULL,  -- 'kernel'
    frames      VARCHAR[] NOT NULL   -- innermost first: 'function' or 'function [module]' ('0x...' if unknown)
);

-- The CPU controller of each traced process's cgroup (cgroup v2), sampled once a second: its own
-- cgroup and every ancestor whose cpu.max sets a quota (an ancestor's quota throttles it too).
-- The counters are cumulative, as cpu.stat keeps them; a second's throttling is a difference.
CREATE TABLE IF NOT EXISTS cgroup_samples (
    session_id      INTEGER NOT NULL,
    ts_ns           BIGINT  NOT NULL,
    pid             INTEGER NOT NULL,  -- the traced process in it (or under it) at that moment
    cgroup          VARCHAR NOT NULL,  -- path under the cgroup v2 mount, '/' for the root
    own             BOOLEAN NOT NULL,  -- the process's own cgroup (FALSE: an ancestor with a quota)
    quota_us        BIGINT,            -- cpu.max quota per period; NULL: 'max' (no quota)
    period_us       BIGINT,            -- cpu.max period
    usage_usec      BIGINT,            -- cpu.stat usage_usec
    nr_periods      BIGINT,            -- cpu.stat nr_periods (periods with runnable tasks, under a quota)
    nr_throttled    BIGINT,            -- cpu.stat nr_throttled
    throttled_usec  BIGINT             -- cpu.stat throttled_usec
);
