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
    cpu                INTEGER,
    wakeup_ns          BIGINT              -- blocked: when it was woken; runnable (waiting for a CPU) from then to on_ns
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
    node              VARCHAR,
    notes             VARCHAR              -- how the numbers were made, where the origin's columns do not say
);

-- ============================================================================================
-- Imported from other tools, kept verbatim
-- What another tool's trace holds beyond the tables above, so that an import loses nothing.
-- Rows here are the origin's own values (ids, raw arguments); the tables above hold the same
-- facts mapped to this store's meaning where a mapping exists. `origin` names the tool ('ingero').
-- ============================================================================================

-- Every event row of an imported trace as the origin stored it, whether or not it was also
-- mapped to cuda_calls / sched_intervals / process_events (mapped_to says where, NULL: only here).
CREATE TABLE IF NOT EXISTS imported_events (
    session_id     INTEGER NOT NULL,
    origin         VARCHAR NOT NULL,
    event_id       VARCHAR NOT NULL,   -- the origin's id (Ingero 0.8: integer; 0.9: '{node}:{seq}')
    ts_ns          BIGINT  NOT NULL,
    duration_ns    BIGINT,
    pid            INTEGER,
    tid            INTEGER,
    source         VARCHAR,            -- the origin's source name, e.g. 'CUDA', 'HOST', 'DRIVER', 'IO'
    op             VARCHAR,            -- the origin's op name, e.g. 'sched_switch', 'block_read'
    source_id      INTEGER,            -- the origin's numeric codes, as stored
    op_id          INTEGER,
    gpu_id         INTEGER,
    arg0           BIGINT,             -- raw, meaning depends on op (Ingero: bytes, pointer, ...)
    arg1           BIGINT,
    ret_code       BIGINT,
    stack_hash     BIGINT,             -- -> imported_stacks.stack_hash (0: no stack)
    stack_ips      VARCHAR,
    cgroup_id      BIGINT,             -- -> imported_rows of table 'cgroup_metadata'
    node           VARCHAR,            -- multi-node traces (Ingero >= 0.9)
    rank           INTEGER,
    local_rank     INTEGER,
    world_size     INTEGER,
    mapped_to      VARCHAR             -- 'cuda_calls', 'sched_intervals', 'process_events' or NULL
);

-- Call stacks, deduplicated by the origin's hash.
CREATE TABLE IF NOT EXISTS imported_stacks (
    session_id     INTEGER NOT NULL,
    origin         VARCHAR NOT NULL,
    stack_hash     BIGINT  NOT NULL,
    ips            VARCHAR,            -- JSON array of hex instruction pointers
    frames         VARCHAR             -- JSON array of resolved frames, as the origin wrote them
);

-- Any other row of an imported trace (catalogues, metadata, per-cgroup statistics, the origin's
-- own session and process-name rows), one JSON object per row, keyed by the origin's table name.
-- Query with DuckDB's JSON operators: row_json ->> 'container_id'.
CREATE TABLE IF NOT EXISTS imported_rows (
    session_id     INTEGER NOT NULL,
    origin         VARCHAR NOT NULL,
    table_name     VARCHAR NOT NULL,   -- the origin's table, e.g. 'cgroup_metadata', 'schema_info'
    row_number     BIGINT  NOT NULL,   -- order within the origin's table (its rowid order)
    row_json       VARCHAR NOT NULL
);
