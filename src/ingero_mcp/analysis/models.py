"""What the analysis returns: pydantic models that the CLI and the MCP server render as they are.

Every number here can be recomputed with SQL over the store; `Evidence.sql` carries the query.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from ingero_mcp.analysis.stack_models import (  # noqa: F401 - served by the facade with the other models
    FindingFrames,
    FoldedStack,
    Frame,
    FrameShare,
    StackProfile,
    StacksResult,
)

Severity = Literal["HIGH", "MEDIUM", "LOW"]
SEVERITY_RANK: dict[str, int] = {"HIGH": 0, "MEDIUM": 1, "LOW": 2}  # the one order of severities, most severe first

# The parts of a feeding thread's time a finding reads, and how the prose names them.
PARTS = ("cpu_wait", "sleep_outside", "io", "gpu_wait", "run_inside", "run_outside", "unknown")

PART_LABEL = {
    "cpu_wait": "waiting for a CPU", "sleep_outside": "sleeping outside CUDA calls", "io": "in IO sleep (D state)",
    "gpu_wait": "asleep in CUDA calls (waiting for the GPU)", "run_inside": "on the CPU inside CUDA calls",
    "run_outside": "running outside CUDA calls (its own code)", "unknown": "off-CPU (split not recorded)",
}


class TimeWindow(BaseModel):
    """A closed interval of trace time, ns since the epoch."""

    start_ns: int
    end_ns: int

    @property
    def duration_ns(self) -> int:
        """Length of the window (0 if inverted)."""
        return max(0, self.end_ns - self.start_ns)


class OpStats(BaseModel):
    """One CUDA runtime/driver operation over the window; percentiles are exact over its rows."""

    op: str
    api: str
    count: int = Field(description="calls stored as rows in the window")
    total_count: int | None = Field(None, description="calls counted, where a sample was stored (imports)")
    total_ns: int | None = Field(description="time in the calls with a duration; None: every call entry-only (unknown)")
    share_of_span: float | None = Field(description="total_ns / trace span (can exceed 1 with many threads); "
                                                    "None: unknown")
    p50_ns: int | None = None
    p95_ns: int | None = None
    p99_ns: int | None = None
    max_ns: int | None = None
    min_ns: int | None = None
    mean_ns: float | None = None
    entry_only: int = Field(0, description="calls probed entry-only (duration_ns NULL: v4 kernel launches): counted, "
                            "but not in the durations; all of them: the percentiles are unknown")
    bytes_total: int | None = None
    from_sample: bool = False
    lower_bound: bool = Field(False, description="total_count / total_ns are lower bounds: some bucket had "
                              "no aggregate, counted fewer calls than its stored rows, or reached outside the window")
    contradicted_buckets: int = Field(0, description="aggregate buckets that counted fewer calls than the rows "
                                                     "stored in them")
    aggregate_count: int | None = Field(None, description="what the aggregates alone counted (before reconciling "
                                                          "with the rows)")
    nested: int = Field(0, description="calls that started inside another call of their thread (a runtime "
                        "call's driver call, both API layers probed): one logical call, counted in the outer "
                        "one's time too")


class HostTotal(BaseModel):
    """A host event counted in the kernel (host_aggregates): exact totals over the window."""

    source: str
    op: str
    count: int
    pids: int = Field(description="distinct pids (or task ids) with events")
    sum_duration_ns: int | None = None
    sum_bytes: int | None = None


class TraceStats(BaseModel):
    """Per-operation statistics over a window, plus the host event totals."""

    window: TimeWindow
    ops: list[OpStats]
    calls: int
    pids: list[int]
    host: list[HostTotal] = []
    sampled: bool = Field(False, description="cuda_calls holds a sample (Ingero import): counts from aggregates")
    notes: list[str] = []


class ProcessOp(BaseModel):
    """One CUDA op of one process: exact duration statistics over the window."""

    op: str
    count: int
    total_ns: int | None = Field(description="None: every call entry-only (its duration unknown)")
    p50_ns: int | None = None
    p99_ns: int | None = None
    max_ns: int | None = None
    entry_only: int = Field(0, description="calls probed entry-only (duration_ns NULL), not in the durations")


class ProcessBreakdown(BaseModel):
    """One process: its CUDA ops, scheduler and memory numbers, parent and children."""

    pid: int
    ppid: int | None = None
    comm: str | None = None
    cmdline: str | None = None
    ops: list[ProcessOp] = []
    context_switches: int = 0
    off_cpu_ns: int | None = Field(0,
                                   description="off-CPU time from sched_intervals rows; None: not recorded (unknown)")
    preempted_ns: int | None = None
    blocked_ns: int | None = None
    worst_stall_ns: int | None = None
    worst_stall_ts_ns: int | None = None
    page_allocs: int | None = Field(0, description="None: no page allocation recorded for it (unknown, not zero)")
    page_alloc_bytes: int | None = 0
    children: list[int] = []
    exit_ns: int | None = None
    counts_from: Literal["rows", "aggregates", "none"] = "rows"
    on_cpu_ns: int | None = Field(None, description="on-CPU time from the collector's sched_switch aggregates (None: "
                                                    "not recorded)")
    worst_stall_tid: int | None = None
    worst_stall_thread: str | None = Field(None, description="the stalled thread's name where recorded")
    worst_stall_role: str | None = Field(None, description="what the stalled thread does: main / CUDA-calling / helper")
    is_collector: bool = Field(False, description="this project's own collector (left out of rankings by default)")
    switches_lower_bound: bool = Field(False,
                                       description="context_switches is a lower bound (aggregates fewer than rows)")
    known_from: list[str] = Field([], description="imported tables that are the only source of this process "
                                                  "(e.g. block I/O)")


class Evidence(BaseModel):
    """One fact a chain rests on, with the SQL that recomputes it."""

    name: str
    value: float | int | str
    unit: str = ""
    sql: str | None = None


class TimelineEntry(BaseModel):
    """One thing that happened at a moment (a call, a scheduler interval, a process event, a snapshot)."""

    ts_ns: int
    pid: int | None = None
    tid: int | None = None
    kind: str
    description: str
    duration_ns: int | None = None


class Culprit(BaseModel):
    """A task named as (part of) a cause: who held the CPU, who woke the thread, who used the GPU."""

    pid: int | None = None
    tids: list[int] = []
    comm: str | None = None
    relation: str = Field("", description="to the job: 'same process', 'child process', 'other process', "
                                          "'kernel', 'interrupt'")
    ns: int = Field(0, description="the time this culprit accounts for (wait behind it, sleep it ended, GPU time)")


class CausalChain(BaseModel):
    """A symptom tied to its evidence, root cause and fixes; origin says who found it.

    Chains from the time accounting carry `seconds_lost` (the feeding time the cause explains), the
    window it was seen in and the culprits; op-level chains name the CUDA op in `op`.
    """

    id: str
    origin: Literal["ingero-mcp", "ingero"] = "ingero-mcp"
    op: str
    severity: Severity
    summary: str
    root_cause: str
    explanation: str
    seconds_lost: float | None = Field(None, description="feeding time the cause explains (s)")
    window: TimeWindow | None = None
    culprits: list[Culprit] = []
    count: int | None = None
    p50_ns: int | None = None
    p99_ns: int | None = None
    max_ns: int | None = None
    tail_ratio: float | None = None
    pids: list[int] = []
    evidence: list[Evidence] = []
    recommendations: list[str] = []
    timeline: list[TimelineEntry] = []
    store_check: str | None = Field(None, description="imported chains: what the store's rows show of the chain's "
                                    "p99 and of its cause, where they contradict it, or why it could not be checked")
    from_sample: bool = False
    frames: FindingFrames | None = Field(None, exclude_if=lambda v: v is None, description="the code behind it: top "
                                         "frames and stacks (left out: the store has no stacks, or none for this one)")


class Snapshot(BaseModel):
    """The host at one moment (one row of snapshots, or a mean over a downsampled step)."""

    ts_ns: int
    cpu_percent: float | None = None
    procs_running: int | None = None
    load1: float | None = None
    mem_used_percent: float | None = None
    mem_available_bytes: int | None = None
    swap_used_bytes: int | None = None
    gpu_util_percent: float | None = None
    gpu_mem_used_bytes: int | None = None


class SystemContext(BaseModel):
    """The host over a window: snapshots within a point budget, and the window's extremes."""

    window: TimeWindow
    points: list[Snapshot]
    downsampled_from: int | None = None
    cpu_percent_max: float | None = None
    cpu_percent_mean: float | None = None
    mem_used_percent_max: float | None = None
    swap_used_bytes_max: int | None = None
    gpu_util_percent_mean: float | None = None


class Timeline(BaseModel):
    """Entries of a window in time order; `truncated` when more than the limit fell in it."""

    window: TimeWindow
    entries: list[TimelineEntry]
    truncated: bool = False
    total_in_window: int = 0


class SourceStats(BaseModel):
    """Events seen, stored, lost and aggregated by one collector source over a session."""

    source: str
    events_seen: int
    events_stored: int
    events_lost: int
    events_aggregated: int = 0


class SessionInfo(BaseModel):
    """One recording (or imported node / demo): host, GPU, collector and its sources."""

    session_id: int
    source: str
    host: str | None = None
    kernel: str | None = None
    cpu_count: int | None = None
    memory_bytes: int | None = None
    gpu_model: str | None = None
    gpu_driver: str | None = None
    cuda_runtime_version: str | None = None
    collector_version: str | None = None
    collector_flags: str | None = None
    attached: str | None = None
    started_ns: int
    stopped_ns: int | None = None
    sources: list[SourceStats] = []


class TableCoverage(BaseModel):
    """Whether a table holds every event (complete) or a sample."""

    table_name: str
    complete: bool
    note: str | None = None


class ProbeCost(BaseModel):
    """The added wall time per probe hit, measured when the collector started (probe_costs)."""

    probe: str = Field(description="'entry' (uprobe only), 'entry_return' (uprobe + uretprobe), or 'sched_interval' "
                       "(what the scheduler tracepoints add to one off-CPU interval of a traced thread)")
    cost_ns: float | None = None
    method: str | None = None


class ProcessTracingCost(BaseModel):
    """One traced process: the time the probes added to it (tracing_cost), estimated."""

    pid: int
    comm: str | None = None
    added_ns: int = Field(description="sum(tracing_cost.added_ns): hits x per-hit cost")
    wall_ns: int = Field(description="the span of its tracing_cost periods (first start to last end)")
    share: float | None = Field(None, description="added_ns / wall_ns")
    entry_hits: int = 0
    entry_return_hits: int = 0
    launch_coverage: float | None = Field(None, description="share of wall_ns not in probe_gaps (launches recorded)")
    off_cpu_intervals: int = Field(0, description="sched_intervals rows of its threads: each switch paid the scheduler "
                                   "tracepoints")
    sched_added_ns: int | None = Field(None, description="off_cpu_intervals x the measured cost per interval "
                                       "(probe_costs 'sched_interval'); None: that cost was not measured")
    page_allocs: int = Field(0, description="its page allocations (host_aggregates 'mm_page_alloc'): each paid the "
                             "page-allocation tracepoint")
    page_added_ns: int | None = Field(None, description="page_allocs x the measured cost per page (probe_costs "
                                      "'page_alloc'); None: that cost was not measured")
    sql: str = ""


class BpfProgramTime(BaseModel):
    """One eBPF program's runs and run time as the kernel measured them (kernel.bpf_stats_enabled=1 while recording)."""

    program: str
    runs: int
    run_time_ns: int


class TracingCost(BaseModel):
    """What tracing cost (schema v4 stores; None before): estimated added time, per process and for the session."""

    added_ns: int | None = Field(None, description="the CUDA probes' estimated added time (tracing_cost), every traced "
                                 "process together")
    wall_ns: int | None = Field(None, description="the sessions' wall time (stop - start)")
    share: float | None = Field(None, description="added_ns / wall_ns (every traced process's added time together)")
    off_cpu_intervals: int = Field(0, description="every traced thread's off-CPU intervals (sched_intervals rows)")
    sched_added_ns: int | None = Field(None, description="off_cpu_intervals x the measured cost per interval; None: "
                                       "not measured in a session that had intervals (unknown, not zero)")
    page_allocs: int = Field(0, description="the traced processes' page allocations (host_aggregates 'mm_page_alloc')")
    page_added_ns: int | None = Field(None, description="page_allocs x the measured cost per page; None: not measured "
                                      "in a session that had page allocations (unknown, not zero)")
    samples: int = Field(0, exclude_if=lambda v: v == 0, description="traced threads' on-CPU stack samples (v6)")
    sample_added_ns: int | None = Field(None, exclude_if=lambda v: v is None, description="samples x the cost per "
                                        "sample (probe_costs 'stack_sample'); None: no samples, or cost unknown")
    total_share: float | None = Field(None, description="the four estimates' sum / wall_ns; None if one is")
    launch_coverage: float | None = Field(None, description="share of the sessions' time not in probe_gaps")
    entry_only_launches: int = Field(0, description="launch rows without a duration (probed entry-only)")
    probe_costs: list[ProbeCost] = []
    processes: list[ProcessTracingCost] = []
    collector_cpu_s: float | None = Field(None, description="the collector's own CPU time (sessions.notes), start-up "
                                          "included: not in the estimate; None: not recorded")
    collector_cpu_recording_s: float | None = Field(None, description="the part of collector_cpu_s spent "
                                                    "after start-up (recording and stopping), on the machine the job "
                                                    "ran on; None: not recorded")
    bpf_programs: list[BpfProgramTime] | None = Field(None, description="each eBPF program's runs and kernel run time, "
                                                      "all CPUs, measured by the kernel (the scheduler and memory "
                                                      "tracepoints included, the uprobe traps around the "
                                                      "programs not); None: not measured "
                                                      "(kernel.bpf_stats_enabled was 0)")
    sql: dict[str, str] = Field({}, description="the queries that recompute the session's numbers")


class DataQuality(BaseModel):
    """Rows of one kind that the accounting cannot take as they are (counted; the accounting mends what they break)."""

    what: str
    count: int
    sql: str


class TraceInfo(BaseModel):
    """What a trace store holds: sessions, window, coverage, row counts, whether it is live."""

    sessions: list[SessionInfo]
    window: TimeWindow | None
    coverage: list[TableCoverage]
    row_counts: dict[str, int]
    live: bool = False
    tracing: TracingCost | None = Field(None, description="the estimated tracing cost and how launches were recorded "
                                        "(v4 stores); None: not recorded (stores before v4)")
    data_quality: list[DataQuality] = Field([], description="damaged rows by kind (overlapping or inverted intervals, "
                                            "negative durations); empty: none found")


class Account(BaseModel):
    """Where a thread's wall time went over a span; the parts sum to wall_ns exactly."""

    wall_ns: int = 0
    run_outside_ns: int = Field(0, description="on a CPU outside CUDA calls: Python, data preparation")
    run_inside_ns: int = Field(0, description="on a CPU inside CUDA calls: launch cost, CPU-staged copies, spin-waits")
    sleep_inside_ns: int = Field(0, description="asleep inside CUDA calls: waiting for the GPU (or a driver lock)")
    sleep_outside_ns: int = Field(0, description="asleep outside CUDA calls: another thread, a lock, a queue, IO")
    sleep_io_ns: int = Field(0, description="of sleep_outside_ns, uninterruptible (D): usually IO")
    cpu_wait_inside_ns: int = Field(0, description="runnable inside CUDA calls, the CPU held by another task")
    cpu_wait_outside_ns: int = Field(0, description="runnable outside CUDA calls, the CPU held by another task")
    off_cpu_unknown_ns: int = Field(0, description="off-CPU, split not recorded")
    in_call_ns: int = 0
    work_calls: int = Field(0, description="launches, copies and memsets started")
    iterations: float | None = Field(None, description="the process's iterations in the span (progress.py: the gaps "
                                     "between its marker calls, spread over their time); None: no marker found")

    @property
    def cpu_wait_ns(self) -> int:
        """Waiting for a CPU, inside and outside CUDA calls."""
        return self.cpu_wait_inside_ns + self.cpu_wait_outside_ns

    def share(self, part: str) -> float:
        """One part as a fraction of wall time."""
        value = self.cpu_wait_ns if part == "cpu_wait_ns" else getattr(self, part)
        return value / self.wall_ns if self.wall_ns else 0.0


class SecondAccount(Account):
    """One second (since the trace start) of one thread."""

    k: int
    start_ns: int
    gpu_util_percent: float | None = None
    idle_ns: int = Field(0, description="of sleep_outside_ns: idle, waiting for input with nothing queued "
                                        "(accounting.idle_sql)")


class ThreadAccount(BaseModel):
    """A thread that feeds the GPU (or that one waits on): its time over the window, whole and per second."""

    pid: int
    tid: int
    comm: str | None = None
    process_comm: str | None = None
    role: str = Field(description="'feeder' (issues CUDA work) or 'waited-on' (woke a feeder's sleeps)")
    total: Account
    seconds: list[SecondAccount] = []
    idle_ns: int = Field(0, description="of its sleep outside CUDA calls, the time it was idle: waiting for input (an "
                                        "interrupt ended the wait) after a synchronising call, nothing "
                                        "queued on the GPU (accounting.idle_sql); not lost feeding time")

    @property
    def busy_ns(self) -> int:
        """The feeding time: wall time less idle time."""
        return self.total.wall_ns - self.idle_ns


class Progress(BaseModel):
    """How a process's iterations are counted: the call that recurs once per iteration (progress.py)."""

    pid: int
    op: str
    signature: str = Field(description="'k<handle>' a kernel launched, 'b<bytes>/<kind>' a copy's size, '' the op")
    label: str = Field(description="the marker as said to a person")
    marks: int = Field(description="how many times it was called (iterations + 1)")
    tid: int | None = Field(None, description="the thread that made most of the marks: the one driving the loop")
    median_gap_ns: int = Field(description="the median time between two marks: a typical iteration")
    cover: float = Field(description="share of its span its gaps cover (each capped at 20 x the median gap)")
    sql: str = Field(description="the marks' timestamps")


class Phase(BaseModel):
    """A stretch of seconds in which a process's progress rate stayed healthy (baseline) or fell (slow), or a group
    of slow episodes (recurrent): short stalls found in sub-second bins, and slow phases that recurred alike."""

    pid: int
    kind: Literal["baseline", "slow", "recurrent", "other-work"]  # other-work: iterations stopped, its work did not
    window: TimeWindow = Field(description="the phase; for 'recurrent', first episode's start to the last's end")
    work_rate: float = Field(description="the process's progress per second, in `unit` (in the episodes)")
    unit: str = Field("launches+copies/s", description="'iterations/s' (a marker call counts them, "
                      "Accounting.progress) or 'launches+copies/s' (launches, copies and memsets: the last resort, no "
                      "marker found)")
    slowdown: float | None = Field(None, description="baseline rate / this phase's (slow and recurrent phases)")
    episodes: list[TimeWindow] = Field([], description="recurrent: each slow episode (runs of slow bins or seconds)")
    bin_ns: int | None = Field(None, description="recurrent: the bin the episodes were read in")
    period_s: float | None = Field(None, description="recurrent: mean time from one episode's start to the next's")
    lost_s: float | None = Field(None, description="recurrent: the episodes' work lost, seconds at the healthy rate")
    sql: str | None = Field(None, description="recurrent: the SQL that lists the episodes (start_s, length_s, lost_s)")
    stretches: list[TimeWindow] = Field([], description="recurrent: its episodes that are slow phases (MIN_PHASE_S "
                                        "or longer) that recurred alike; the others are short episodes read in bins")


class ImportedSecond(BaseModel):
    """One second (since the trace start) of an imported thread whose scheduler rows are complete."""

    k: int
    start_ns: int
    accounted_ns: int = Field(description="time of the second its switch rows account for (between its first and last "
                              "row, outside switch-less stretches)")
    off_cpu_ns: int = Field(description="off-CPU time from its rows (sleeping or waiting for a CPU: split not "
                            "recorded)")
    switches: int = Field(description="switch rows whose switch-in fell in the second")


class ImportedThread(BaseModel):
    """An imported thread (Ingero: pid = tid in its scheduler rows): whether its scheduler rows are complete over the
    window, checked against the per-minute counts, and where its time went when they are (imported_accounting.py)."""

    session_id: int
    node: str | None = Field(None, description="its session's host, where the store holds several sessions")
    pid: int
    tid: int
    comm: str | None = None
    process_comm: str | None = None
    feeds_gpu: bool = Field(False, description="the thread of a process with CUDA calls that made them (its main "
                            "thread where it has calls)")
    accountable: bool = Field(False, description="its switch rows are complete over the window (within the bound "
                              "missing_off_cpu_ns) and account for some of its time")
    why_not: str | None = Field(None, description="why its time cannot be accounted (a sample, no counts, no rows)")
    switch_rows: int = Field(0, description="its sched_intervals rows whose switch-in fell in the window")
    switches_counted: int | None = Field(None, description="switches Ingero counted in the minutes overlapping the "
                                         "window (host_aggregates 'sched_switch'); None: no count kept")
    missing_switches: int = Field(0, description="switches counted but not stored as rows, in those minutes")
    missing_off_cpu_ns: int | None = Field(None, description="their off-CPU time (counted sum less the rows' sum); "
                                           "None: unknown")
    span: TimeWindow | None = Field(None, description="from its first switch-out to its last switch-in, in the window")
    accounted_ns: int = Field(0, description="the span less the switch-less stretches (unknown_ns)")
    unknown_ns: int = Field(0, description="stretches of IMPORT_GAP_S or more without a switch row: unknown (ran, or "
                            "Ingero dropped its events uncounted)")
    off_cpu_ns: int = Field(0, description="off-CPU time of its rows in the accounted time; the split into sleeping "
                            "and waiting for a CPU is not recorded")
    on_cpu_ns: int = Field(0, description="accounted time less off-CPU time and missing_off_cpu_ns: a lower bound")
    cuda_rows: int = Field(0, description="its process's CUDA call rows in the minutes overlapping the window")
    cuda_counted: int | None = Field(None, description="its process's CUDA calls counted by Ingero there; None: no "
                                     "count")
    cuda_ns_max: int | None = Field(None, description="its process's time in CUDA calls there (counted sums of both "
                                    "API layers: an upper bound, nested calls counted twice); None: unknown")
    seconds: list[ImportedSecond] = []
    sql: str = Field("", description="the SQL that recomputes its numbers")

    @property
    def on_cpu_share(self) -> float:
        """On-CPU time as a share of its accounted time (a lower bound)."""
        return self.on_cpu_ns / self.accounted_ns if self.accounted_ns else 0.0


class ImportedAccounting(BaseModel):
    """The time accounting of an import (an Ingero trace): per thread, from its scheduler rows where complete."""

    window: TimeWindow
    threads: list[ImportedThread] = []
    note: str = ""

    @property
    def feeders(self) -> list[ImportedThread]:
        """The threads that fed the GPU, accountable first."""
        return sorted((t for t in self.threads if t.feeds_gpu), key=lambda t: (not t.accountable, -t.accounted_ns))


class Accounting(BaseModel):
    """The time accounting of the feeding threads: the core every chain reads."""

    complete: bool = Field(True, description="False when the store lacks complete CUDA or scheduler rows")
    note: str | None = None
    threads: list[ThreadAccount] = []
    phases: list[Phase] = []
    progress: list[Progress] = Field([], description="per feeding process, the call that marks its iterations (none: "
                                     "phases are read in launches+copies per second)")
    steady_from_ns: dict[int, int] = Field({}, description="per feeding process, when it reached its steady rate: "
                                           "the end of its start-up (its first healthy second, from its first mark)")
    data_quality: list[str] = Field([], description="what the accounting had to mend in the rows (overlapping or "
                                    "inverted intervals), with the SQL that counts them; empty: nothing")
    entry_only_launches: bool = Field(False, description="kernel launches were probed entry-only (v4 "
                                      "default): their time is in run_outside_ns (the thread ran on to its next call), "
                                      "not in CUDA calls")
    launch_coverage: float | None = Field(None, description="share of the traced time the launch probes were attached "
                                          "(not in probe_gaps); None: no gaps, every launch is a row. Below "
                                          "1, work_calls and work rates are estimates: launches seen, scaled per "
                                          "second by the coverage")
    imported: ImportedAccounting | None = Field(None, description="an import (complete is False): the threads whose "
                                                "scheduler rows are complete, accounted from them")

    # What the accounting read on the way, for the chains built on it (not part of the report: excluded from JSON).
    origin_ns: int | None = Field(None, exclude=True, description="the trace's first moment (accounting.origin_ns)")
    thread_names: dict[int, str] = Field({}, exclude=True, description="tid -> its latest name (thread_names)")
    wound_down: list[tuple[int, int, int]] = Field([], exclude=True, description="accounting.wound_down's rows")

    @property
    def run_outside_label(self) -> str:
        """What run_outside_ns holds, said as the store recorded it."""
        return "running outside CUDA calls" + (" (incl. kernel launches, entry-only)"
                                               if self.entry_only_launches else "")

    @property
    def estimated(self) -> bool:
        """Whether the work counts are estimates (launches scaled for the probe gaps)."""
        return self.launch_coverage is not None and self.launch_coverage < 1


class Diagnosis(BaseModel):
    """Where the feeding threads' time went and why: the accounting, the chains built on it and the verdict. The
    report holds the same fields; the MCP tool get_time_accounting serves this alone."""

    accounting: Accounting
    chains: list[CausalChain]
    minor: list[str] = Field([], description="causes explaining under 1% of the feeding time, a line each")
    gpu_util_percent: float | None = Field(None, description="mean GPU utilisation while the job used CUDA")
    verdict: list[str] = Field([], description="the few lines a user reads first")


class Report(BaseModel):
    """The incident report: what `explain --json` prints."""

    window: TimeWindow
    info: TraceInfo
    verdict: list[str] = Field([], description="the few lines a user reads first")
    stats: list[OpStats]
    host: list[HostTotal] = []
    processes: list[ProcessBreakdown]
    chains: list[CausalChain]
    minor: list[str] = Field([], description="causes explaining under 1% of the feeding time, a line each")
    accounting: Accounting | None = None
    notes: list[str] = []
