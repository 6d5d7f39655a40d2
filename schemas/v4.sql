-- ingero-mcp trace store, schema version 4: applied on top of v3.sql.
--
-- Why v4: what tracing cost the job, and which calls it did not see in full (the always-on mode).
-- Kernel launches are probed entry-only by default (a return probe is a second trap per launch and
-- a launch's duration is rarely the evidence), and an overhead governor may detach the launch probes
-- for part of each period to keep the estimated cost under --max-overhead. Stores written before v4
-- have none of this: every call complete, no gaps, cost not estimated (the tables are empty).

-- NULL duration: the call was probed entry-only (its end was not seen); cpu_wait_ns, sleep_ns,
-- off_cpu_ns, context_switches, page_allocs, page_alloc_bytes and return_code are NULL with it.
ALTER TABLE cuda_calls ALTER COLUMN duration_ns DROP NOT NULL;

-- When a group of probes was detached by the governor: calls of those ops made then are not rows.
-- Outside these gaps (and while the library was attached) every call of the group is a row. The
-- analysis scales counts of the group by the covered share of each second, and says so.
CREATE TABLE IF NOT EXISTS probe_gaps (
    session_id  INTEGER NOT NULL,
    probes      VARCHAR NOT NULL,  -- 'launch': every kernel and graph launch probe (cu*LaunchKernel*, *GraphLaunch)
    start_ns    BIGINT  NOT NULL,  -- detached at
    end_ns      BIGINT  NOT NULL,  -- attached again at (or the recording's stop)
    duty        DOUBLE             -- share of each governor period the group was attached, when this gap was made
);

-- The added time per probe hit, measured when the collector started, on this machine: a calibration
-- process calls the probed symbol with and without the probe (interleaved, medians).
CREATE TABLE IF NOT EXISTS probe_costs (
    session_id  INTEGER NOT NULL,
    probe       VARCHAR NOT NULL,  -- 'entry' (uprobe only), 'entry_return' (uprobe + uretprobe), or
                                   -- 'sched_interval' (per off-CPU interval of a traced thread), or
                                   -- 'page_alloc' (per page a traced thread allocates)
    cost_ns     DOUBLE,            -- added wall time per hit (NULL: could not be measured)
    method      VARCHAR,           -- e.g. 'calibrated: cuLaunchKernel in libcuda.so.1, 3 x 50000 calls'
    site        VARCHAR            -- the probe site's first instruction, e.g. 'push %rbp (55)'
);

-- Per traced process and governor period (about a second): probe hits and the estimated time they
-- added to the process (hits x probe_costs). Scheduler and memory tracepoints are not counted here.
CREATE TABLE IF NOT EXISTS tracing_cost (
    session_id         INTEGER NOT NULL,
    pid                INTEGER NOT NULL,
    start_ns           BIGINT  NOT NULL,
    end_ns             BIGINT  NOT NULL,
    entry_hits         BIGINT,          -- entry-only probe hits (launches seen)
    entry_return_hits  BIGINT,          -- entry + return probe hits (complete calls)
    added_ns           BIGINT,          -- estimated added time: entry_hits x entry cost + entry_return_hits x its cost
    launch_duty        DOUBLE           -- share of the period the launch probes were attached
);
