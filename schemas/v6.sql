-- ingero-mcp trace store, schema version 6: applied on top of v5.sql.
--
-- Why v6: name the code. v5 said what a thread waited in (its kernel stack as it went to sleep) but
-- not which of its own functions it was running or blocked in. v6 keeps user stacks (native frames,
-- with the Python interpreter's own frames merged in where it could walk them) at the same
-- switch-outs, and low-rate on-CPU samples of the traced threads with both stacks. Stores written
-- before v6 have none of this (NULL, empty tables): unknown, not zero.

-- The user stack of a traced thread as it left the CPU to sleep, as an id into `stacks` (kind 'user'
-- or 'python'). NULL: a preemption, not recorded (before v6, or stacks turned off), or not taken.
ALTER TABLE sched_intervals ADD COLUMN ustack_id BIGINT;

-- Each frame's module, source file and line, beside `frames` (the function names), innermost first;
-- an element is NULL where it is unknown. Kernel stacks written by v5 have these columns NULL and
-- keep 'function [module]' in `frames`. kind: 'kernel'; 'user' (native frames only); 'python' (a user
-- stack whose interpreter frames were replaced by the Python functions they ran: module NULL, file
-- the source file, line the first line of the function's definition).
ALTER TABLE stacks ADD COLUMN modules VARCHAR[];
ALTER TABLE stacks ADD COLUMN files VARCHAR[];
ALTER TABLE stacks ADD COLUMN lines INTEGER[];

-- On-CPU samples of traced threads, taken at a fixed rate per CPU and kept for traced threads only
-- (stack_sources.sample_hz). One sample stands for 1/sample_hz s of the thread on a CPU.
CREATE TABLE IF NOT EXISTS stack_samples (
    session_id  INTEGER NOT NULL,
    ts_ns       BIGINT  NOT NULL,
    pid         INTEGER NOT NULL,
    tid         INTEGER NOT NULL,
    cpu         INTEGER,
    kstack_id   BIGINT,           -- the kernel stack when the sample fell in the kernel (NULL: in user space, or not taken)
    ustack_id   BIGINT            -- the user stack (NULL: not taken)
);

-- How each traced process's stacks were taken: whether its Python frames were walked, whether its
-- native stacks go past the leaf (frame pointers), and why not where they could not be.
CREATE TABLE IF NOT EXISTS stack_sources (
    session_id      INTEGER NOT NULL,
    pid             INTEGER NOT NULL,
    python          VARCHAR,          -- the interpreter's version ('3.12') when the process runs CPython, else NULL
    python_frames   BOOLEAN NOT NULL, -- TRUE: Python frames are merged into this process's user stacks
    frame_pointers  BOOLEAN,          -- TRUE: its native user stacks unwind past the leaf; NULL: not known
    sample_hz       INTEGER NOT NULL, -- on-CPU samples per second per CPU (0: sampling off)
    note            VARCHAR           -- what was missing and why, in words (NULL: nothing)
);
