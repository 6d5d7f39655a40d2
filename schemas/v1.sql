-- ingero-mcp trace store, schema version 1.
-- The one place the store's tables are written. Units are in the column names:
-- *_ns are nanoseconds (timestamps: ns since the Unix epoch, wall clock), *_bytes are bytes.
-- Every table carries session_id so that several recordings can live in one file.

CREATE TABLE IF NOT EXISTS schema_version (
    version        INTEGER NOT NULL,
    applied_ns     BIGINT  NOT NULL
);

-- One row per recording (or per imported database / generated demo).
CREATE TABLE IF NOT EXISTS sessions (
    session_id            INTEGER NOT NULL,
    source                VARCHAR NOT NULL,   -- 'collector', 'ingero-import', 'demo:<scenario>'
    host                  VARCHAR,
    kernel                VARCHAR,
    os_release            VARCHAR,
    cpu_model             VARCHAR,
    cpu_count             INTEGER,
    memory_bytes          BIGINT,
    gpu_model             VARCHAR,
    gpu_driver            VARCHAR,
    cuda_runtime_version  VARCHAR,
    python_version        VARCHAR,
    collector_version     VARCHAR,
    collector_flags       VARCHAR,            -- JSON object: the command line options
    attached              VARCHAR,            -- JSON: libraries and symbols attached / not attached
    started_ns            BIGINT NOT NULL,
    stopped_ns            BIGINT,             -- NULL while recording
    notes                 VARCHAR
);

-- Which tables hold every event (complete) and which hold a sample (the totals then live in
-- host_aggregates). Readers must say which numbers are exact and which come from a sample.
CREATE TABLE IF NOT EXISTS table_coverage (
    session_id   INTEGER NOT NULL,
    table_name   VARCHAR NOT NULL,
    complete     BOOLEAN NOT NULL,
    note         VARCHAR
);

CREATE TABLE IF NOT EXISTS processes (
    session_id      INTEGER NOT NULL,
    pid             INTEGER NOT NULL,
    ppid            INTEGER,
    comm            VARCHAR,
    cmdline         VARCHAR,
    first_seen_ns   BIGINT,
    last_seen_ns    BIGINT,
    exit_ns         BIGINT,
    exit_code       INTEGER,
    traced          BOOLEAN               -- its CUDA calls and host events are recorded as rows
);

-- Every CUDA runtime / driver call of a traced process, with what happened to the calling
-- thread while the call was in flight (per-call attribution, measured in the kernel).
CREATE TABLE IF NOT EXISTS cuda_calls (
    session_id          INTEGER NOT NULL,
    ts_ns               BIGINT  NOT NULL,  -- call entry
    duration_ns         BIGINT  NOT NULL,  -- entry to return
    pid                 INTEGER NOT NULL,
    tid                 INTEGER NOT NULL,
    api                 VARCHAR NOT NULL,  -- 'runtime' (libcudart) or 'driver' (libcuda)
    op                  VARCHAR NOT NULL,  -- symbol name, e.g. 'cudaMemcpyAsync', 'cuLaunchKernel'
    bytes               BIGINT,            -- memcpy / malloc size
    memcpy_kind         VARCHAR,           -- 'H2H', 'H2D', 'D2H', 'D2D', 'default'
    stream              UBIGINT,
    return_code         INTEGER,
    off_cpu_ns          BIGINT,            -- thread off-CPU during the call (NULL: not measured)
    preempted_ns        BIGINT,            -- of which runnable but not running (CPU contention)
    blocked_ns          BIGINT,            -- of which sleeping (waiting on GPU, lock, IO)
    context_switches    INTEGER,
    page_allocs         INTEGER,           -- pages allocated by the thread during the call
    page_alloc_bytes    BIGINT,
    gpu_id              INTEGER
);

-- Scheduler intervals of traced threads: switched out at off_ns, back on CPU at on_ns.
CREATE TABLE IF NOT EXISTS sched_intervals (
    session_id         INTEGER NOT NULL,
    pid                INTEGER NOT NULL,
    tid                INTEGER NOT NULL,
    off_ns             BIGINT  NOT NULL,
    on_ns              BIGINT,             -- NULL if still off-CPU when the trace ended
    off_cpu_ns         BIGINT,
    prev_state         VARCHAR NOT NULL,   -- 'preempted' (runnable) or 'blocked' (sleeping)
    preemptor_pid      INTEGER,            -- task that took the CPU at switch-out
    preemptor_comm     VARCHAR,
    cpu                INTEGER
);

-- Host events counted in the kernel per (pid, time bucket), exact counts. Covers everything on
-- the host (not only traced processes), so "who else was using the CPUs" is answerable.
CREATE TABLE IF NOT EXISTS host_aggregates (
    session_id          INTEGER NOT NULL,
    bucket_start_ns     BIGINT  NOT NULL,
    bucket_ns           BIGINT  NOT NULL,  -- bucket width
    pid                 INTEGER NOT NULL,
    comm                VARCHAR,
    source              VARCHAR NOT NULL,  -- 'sched', 'mm', 'cuda', 'driver', ...
    op                  VARCHAR NOT NULL,  -- 'sched_switch', 'mm_page_alloc', 'cudaMemcpy', ...
    count               BIGINT  NOT NULL,  -- exact number of events
    stored              BIGINT  NOT NULL DEFAULT 0, -- of which stored as rows elsewhere
    sum_duration_ns     BIGINT,
    min_duration_ns     BIGINT,
    max_duration_ns     BIGINT,
    sum_bytes           BIGINT
);

CREATE TABLE IF NOT EXISTS process_events (
    session_id     INTEGER NOT NULL,
    ts_ns          BIGINT  NOT NULL,
    event          VARCHAR NOT NULL,       -- 'fork', 'exec', 'exit', 'oom_kill'
    pid            INTEGER NOT NULL,       -- the process the event is about (parent for fork)
    tid            INTEGER,
    child_pid      INTEGER,                -- fork: the new process
    comm           VARCHAR,
    filename       VARCHAR,                -- exec: the program
    exit_code      INTEGER
);

-- One row a second: the host at that moment.
CREATE TABLE IF NOT EXISTS snapshots (
    session_id            INTEGER NOT NULL,
    ts_ns                 BIGINT  NOT NULL,
    cpu_percent           DOUBLE,
    cpu_count             INTEGER,
    procs_running         INTEGER,
    load1                 DOUBLE,
    mem_total_bytes       BIGINT,
    mem_available_bytes   BIGINT,
    mem_used_percent      DOUBLE,
    swap_used_bytes       BIGINT,
    gpu_util_percent      DOUBLE,
    gpu_mem_used_bytes    BIGINT,
    gpu_mem_total_bytes   BIGINT
);

-- Events seen / stored / lost per source over the whole session (lost: perf buffer overruns).
CREATE TABLE IF NOT EXISTS collector_stats (
    session_id       INTEGER NOT NULL,
    source           VARCHAR NOT NULL,
    events_seen      BIGINT  NOT NULL,
    events_stored    BIGINT  NOT NULL,
    events_lost      BIGINT  NOT NULL,
    events_aggregated BIGINT NOT NULL DEFAULT 0
);

-- Causal chains found by another tool and imported as they were (Ingero's own analysis).
-- ingero-mcp's own chains are computed at read time by the analysis, never stored.
CREATE TABLE IF NOT EXISTS imported_chains (
    session_id        INTEGER NOT NULL,
    origin            VARCHAR NOT NULL,    -- 'ingero'
    chain_id          VARCHAR NOT NULL,
    detected_ns       BIGINT,
    severity          VARCHAR,
    summary           VARCHAR,
    root_cause        VARCHAR,
    explanation       VARCHAR,
    recommendations   VARCHAR,             -- JSON array of strings
    op                VARCHAR,
    p99_ns            BIGINT,
    p50_ns            BIGINT,
    tail_ratio        DOUBLE,
    timeline          VARCHAR,             -- JSON, as the origin wrote it
    node              VARCHAR
);
