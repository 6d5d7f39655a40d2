// ingero-mcp collector: CUDA uprobes + scheduler / memory / process tracepoints (BCC C).
//
// What this program keeps in the kernel, and why:
//  - `traced`: the tgids whose CUDA calls and scheduler intervals are recorded as rows. Userspace
//    seeds it (--pid, or processes found mapping libcudart/libcuda); task_newtask adds the children
//    of traced processes, so DataLoader workers are followed from their first instruction.
//  - `tstate`: per traced thread, monotonic counters (preempted ns, blocked ns, switches, pages)
//    updated at sched_switch / sched_wakeup / mm_page_alloc, plus a small stack of CUDA calls in
//    flight. A call's attribution is the counters' delta between its entry and its return, so nested
//    calls (cudaMemcpy -> cuMemcpy*) each get their own exact numbers without per-call map updates.
//  - `agg`: exact per (pid, 1 s bucket) counts of sched_switch (with the on-CPU time of the slices
//    that ended) and mm_page_alloc (with bytes) for EVERY process.
//  - `counters`: per-CPU totals of events seen and of records that could not be stored (ring full,
//    map full, call stack too deep), so nothing is lost silently.
// Records go to three BPF ring buffers with fixed-size records that userspace reads in bulk via
// mmap (no per-event callback). Submits do not wake the reader; it drains on a timer.
//
// The loader appends one small entry function per CUDA symbol (see collector/ops.py) that calls
// one of the SHAPE_* helpers below with the op id; all symbols share one return probe.

#include <uapi/linux/ptrace.h>

#define MAX_DEPTH 4
#define COMM_LEN 16
#define FILENAME_LEN 128
#define PAGE_BYTES 4096ULL
#define CLONE_THREAD_FLAG 0x00010000ULL

// counters (per-CPU array indices); mirrored in collector/records.py
#define C_CUDA_SEEN 0
#define C_CUDA_DROP 1
#define C_CUDA_DEPTH 2
#define C_CUDA_ORPHAN 3
#define C_SCHED_SEEN 4
#define C_SCHED_DROP 5
#define C_PROC_SEEN 6
#define C_PROC_DROP 7
#define C_AGG_DROP_SWITCH 8
#define C_SWITCH_TOTAL 9
#define C_PAGE_TOTAL 10
#define C_TSTATE_FULL 11
#define C_WAKEUP_SEEN 12
#define C_AGG_DROP_PAGE 13
#define N_COUNTERS 16

// event flags
#define F_BYTES 1
#define F_STREAM 2
#define F_REC_ALLOC 4   // on success, remember *aux -> bytes (cudaMalloc / cuMemAlloc)

// proc event kinds
#define P_FORK 1
#define P_EXEC 2
#define P_EXIT 3
#define P_OOM 4

// agg kinds
#define A_SWITCH 1
#define A_PAGE 2

struct frame {
    u64 ts;
    u64 sp;
    u64 bytes;
    u64 stream;
    u64 aux;
    u64 pre0;
    u64 blk0;
    u64 pgb0;
    u32 sw0;
    u32 pg0;
    u16 op;
    u8 kind;
    u8 flags;
    u32 pad;
};

struct tstate {
    u64 pre_ns;        // runnable but not running: preempted at switch-out, or woken and waiting
    u64 blk_ns;        // sleeping: switch-out (not runnable) until the wakeup
    u64 pg_bytes;
    u32 switches;
    u32 pages;
    u64 off_ts;        // switched out at (0: on CPU)
    u64 wake_ts;       // woken at, since the last switch-out (0: not yet)
    u32 preemptor_pid; // task that got the CPU at switch-out
    u32 cpu;
    char preemptor_comm[COMM_LEN];
    u32 tgid;
    u8 off_state;      // 1 preempted, 2 blocked
    u8 depth;
    u16 pad;
    struct frame fr[MAX_DEPTH];
};

struct cuda_ev {
    u64 ts;
    u64 dur;
    u64 bytes;
    u64 stream;
    u64 pre_ns;
    u64 blk_ns;
    u64 pg_bytes;
    u32 pid;
    u32 tid;
    u32 switches;
    u32 pages;
    s32 ret;
    u16 op;
    u8 kind;
    u8 flags;
};

struct sched_ev {
    u64 off_ts;
    u64 on_ts;
    u64 wake_ts;
    u32 pid;
    u32 tid;
    u32 preemptor_pid;
    u32 cpu;
    char preemptor_comm[COMM_LEN];
    u8 state;
    u8 pad[7];
};

struct proc_ev {
    u64 ts;
    u32 kind;
    u32 pid;
    u32 tid;
    u32 child;
    s32 exit_code;
    u32 flags;         // 1: exit_code valid, 2: process is traced
    char comm[COMM_LEN];
    char filename[FILENAME_LEN];
};

struct agg_key {
    u32 pid;
    u32 sec;
    u32 kind;
    u32 pad;
};

struct alloc_key {
    u32 pid;
    u32 pad;
    u64 ptr;
};

struct agg_val {
    u64 count;
    u64 sum;
    char comm[COMM_LEN];
};

BPF_HASH(traced, u32, u8, 65536);
BPF_HASH(tstate, u32, struct tstate, 16384);
BPF_PERCPU_ARRAY(zero_state, struct tstate, 1);
BPF_HASH(agg, struct agg_key, struct agg_val, AGG_ENTRIES);
BPF_HASH(allocs, struct alloc_key, u64, 65536);
BPF_HASH(exit_codes, u32, s32, 16384);
BPF_PERCPU_ARRAY(counters, u64, N_COUNTERS);
BPF_PERCPU_ARRAY(cpu_in, u64, 1);   // when the task now on this CPU was switched in
BPF_ARRAY(config, u64, 4);   // [0]: trace every process that calls CUDA (no --pid)

BPF_RINGBUF_OUTPUT(cuda_events, CUDA_RB_PAGES);
BPF_RINGBUF_OUTPUT(sched_events, SCHED_RB_PAGES);
BPF_RINGBUF_OUTPUT(proc_events, PROC_RB_PAGES);

static __always_inline void count(int idx) {
    u64 *c = counters.lookup(&idx);
    if (c)
        (*c)++;
}

static __always_inline struct tstate *get_state(u32 tid, u32 tgid) {
    struct tstate *st = tstate.lookup(&tid);
    if (st)
        return st;
    int z = 0;
    struct tstate *init = zero_state.lookup(&z);
    if (!init)
        return 0;
    init->tgid = tgid;
    if (tstate.insert(&tid, init) != 0) {
        st = tstate.lookup(&tid);   // raced with another CPU, or full
        if (!st)
            count(C_TSTATE_FULL);
        return st;
    }
    return tstate.lookup(&tid);
}

static __always_inline void agg_add(u32 pid, u64 now, u32 kind, u64 sum, int drop_idx) {
    struct agg_key k = {};
    k.pid = pid;
    k.sec = now / 1000000000ULL;
    k.kind = kind;
    struct agg_val *v = agg.lookup(&k);
    if (!v) {
        struct agg_val z = {};
        bpf_get_current_comm(&z.comm, sizeof(z.comm));
        agg.insert(&k, &z);
        v = agg.lookup(&k);
        if (!v) {
            count(drop_idx);
            return;
        }
    }
    __sync_fetch_and_add(&v->count, 1);
    if (sum)
        __sync_fetch_and_add(&v->sum, sum);
}

// ---- CUDA calls ---------------------------------------------------------------------------

static __always_inline int enter(struct pt_regs *ctx, u16 op, u64 bytes, u64 stream, u64 aux,
                                 u8 kind, u8 flags) {
    u64 pt = bpf_get_current_pid_tgid();
    u32 tgid = pt >> 32;
    u32 tid = (u32)pt;
    // A thread with state belongs to a traced process (states are made only for those, and
    // deleted when the thread exits): one lookup on the hot path.
    struct tstate *st = tstate.lookup(&tid);
    if (!st) {
        if (!traced.lookup(&tgid)) {
            int k0 = 0;
            u64 *all = config.lookup(&k0);
            if (!all || !*all)
                return 0;
            u8 one = 1;
            traced.update(&tgid, &one);
        }
        st = get_state(tid, tgid);
        if (!st)
            return 0;
    }
    u32 d = st->depth;
    if (d >= MAX_DEPTH) {
        count(C_CUDA_DEPTH);
        return 0;
    }
    struct frame *f = &st->fr[d & (MAX_DEPTH - 1)];
    f->sp = PT_REGS_SP(ctx);
    f->bytes = bytes;
    f->stream = stream;
    f->aux = aux;
    f->pre0 = st->pre_ns;
    f->blk0 = st->blk_ns;
    f->pgb0 = st->pg_bytes;
    f->sw0 = st->switches;
    f->pg0 = st->pages;
    f->op = op;
    f->kind = kind;
    f->flags = flags;
    st->depth = d + 1;
    f->ts = bpf_ktime_get_ns();
    return 0;
}

int on_return(struct pt_regs *ctx) {
    u64 now = bpf_ktime_get_ns();
    u64 pt = bpf_get_current_pid_tgid();
    u32 tid = (u32)pt;
    struct tstate *st = tstate.lookup(&tid);
    if (!st)
        return 0;
    u64 sp = PT_REGS_SP(ctx);
#pragma unroll
    for (int i = 0; i < MAX_DEPTH; i++) {
        u32 d = st->depth;
        if (d == 0)
            return 0;
        struct frame *f = &st->fr[(d - 1) & (MAX_DEPTH - 1)];
        if (f->sp + 8 < sp) {
            // a deeper call that never returned (longjmp, exception): drop its frame
            st->depth = d - 1;
            count(C_CUDA_ORPHAN);
            continue;
        }
        if (f->sp + 8 > sp)
            return 0;   // a call deeper than any recorded frame (entry not recorded)
        st->depth = d - 1;
        count(C_CUDA_SEEN);
        s32 ret = (s32)PT_REGS_RC(ctx);
        if ((f->flags & F_REC_ALLOC) && ret == 0 && f->aux) {
            struct alloc_key ak = {};
            ak.pid = pt >> 32;
            bpf_probe_read_user(&ak.ptr, sizeof(ak.ptr), (void *)f->aux);
            u64 size = f->bytes;
            if (ak.ptr)
                allocs.update(&ak, &size);
        }
        struct cuda_ev *ev = cuda_events.ringbuf_reserve(sizeof(struct cuda_ev));
        if (!ev) {
            count(C_CUDA_DROP);
            return 0;
        }
        ev->ts = f->ts;
        ev->dur = now - f->ts;
        ev->bytes = f->bytes;
        ev->stream = f->stream;
        ev->pre_ns = st->pre_ns - f->pre0;
        ev->blk_ns = st->blk_ns - f->blk0;
        ev->pg_bytes = st->pg_bytes - f->pgb0;
        ev->pid = pt >> 32;
        ev->tid = tid;
        ev->switches = st->switches - f->sw0;
        ev->pages = st->pages - f->pg0;
        ev->ret = ret;
        ev->op = f->op;
        ev->kind = f->kind;
        ev->flags = f->flags & (F_BYTES | F_STREAM);
        cuda_events.ringbuf_submit(ev, BPF_RB_NO_WAKEUP);
        return 0;
    }
    return 0;
}

// Argument shapes (x86-64 SysV). `kind` is stored as cudaMemcpyKind + 1 (0: not a copy).
static __always_inline u64 stack_arg(struct pt_regs *ctx, int slot) {
    // At function entry *sp is the return address; stack argument n (0-based) is at sp + 8 + 8n.
    u64 v = 0;
    bpf_probe_read_user(&v, sizeof(v), (void *)(PT_REGS_SP(ctx) + 8 + 8 * slot));
    return v;
}

static __always_inline u64 free_size(u64 ptr, u8 *flags) {
    struct alloc_key ak = {};
    ak.pid = bpf_get_current_pid_tgid() >> 32;
    ak.ptr = ptr;
    u64 *size = allocs.lookup(&ak);
    if (!size)
        return 0;
    u64 s = *size;
    allocs.delete(&ak);
    *flags |= F_BYTES;
    return s;
}

static __always_inline int SHAPE_none(struct pt_regs *ctx, u16 op) {
    return enter(ctx, op, 0, 0, 0, 0, 0);
}
static __always_inline int SHAPE_stream1(struct pt_regs *ctx, u16 op) {
    return enter(ctx, op, 0, PT_REGS_PARM1(ctx), 0, 0, F_STREAM);
}
// cudaGraphLaunch(graphExec, stream) / cuGraphLaunch(hGraphExec, hStream)
static __always_inline int SHAPE_stream2(struct pt_regs *ctx, u16 op) {
    return enter(ctx, op, 0, PT_REGS_PARM2(ctx), 0, 0, F_STREAM);
}
// cudaMemcpy(dst, src, count, kind)
static __always_inline int SHAPE_rt_memcpy(struct pt_regs *ctx, u16 op) {
    u64 k = PT_REGS_PARM4(ctx);
    return enter(ctx, op, PT_REGS_PARM3(ctx), 0, 0, k < 5 ? k + 1 : 0, F_BYTES);
}
// cudaMemcpyAsync(dst, src, count, kind, stream)
static __always_inline int SHAPE_rt_memcpy_async(struct pt_regs *ctx, u16 op) {
    u64 k = PT_REGS_PARM4(ctx);
    return enter(ctx, op, PT_REGS_PARM3(ctx), PT_REGS_PARM5(ctx), 0, k < 5 ? k + 1 : 0,
                 F_BYTES | F_STREAM);
}
// cudaMalloc(void **ptr, size) / cuMemAlloc_v2(CUdeviceptr *ptr, size)
static __always_inline int SHAPE_malloc(struct pt_regs *ctx, u16 op) {
    return enter(ctx, op, PT_REGS_PARM2(ctx), 0, PT_REGS_PARM1(ctx), 0, F_BYTES | F_REC_ALLOC);
}
// cudaHostAlloc(void **ptr, size, flags) / cuMemHostAlloc(void **pp, size, flags)
static __always_inline int SHAPE_hostalloc(struct pt_regs *ctx, u16 op) {
    return enter(ctx, op, PT_REGS_PARM2(ctx), 0, 0, 0, F_BYTES);
}
// cudaFree(void *ptr) / cuMemFree_v2(CUdeviceptr): the size remembered at allocation, if seen
static __always_inline int SHAPE_free(struct pt_regs *ctx, u16 op) {
    u8 flags = 0;
    u64 size = free_size(PT_REGS_PARM1(ctx), &flags);
    return enter(ctx, op, size, 0, 0, 0, flags);
}
// cudaLaunchKernel(func, dim3 grid (2 regs), dim3 block (2 regs), args, sharedMem, stream)
static __always_inline int SHAPE_rt_launch(struct pt_regs *ctx, u16 op) {
    return enter(ctx, op, 0, stack_arg(ctx, 1), 0, 0, F_STREAM);
}
// cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shared, hStream, params, extra)
static __always_inline int SHAPE_drv_launch(struct pt_regs *ctx, u16 op) {
    return enter(ctx, op, 0, stack_arg(ctx, 2), 0, 0, F_STREAM);
}
// cuLaunchKernelEx(const CUlaunchConfig *config, f, params, extra): hStream at offset 32
static __always_inline int SHAPE_drv_launch_ex(struct pt_regs *ctx, u16 op) {
    u64 stream = 0;
    u64 cfg = PT_REGS_PARM1(ctx);
    if (cfg)
        bpf_probe_read_user(&stream, sizeof(stream), (void *)(cfg + 32));
    return enter(ctx, op, 0, stream, 0, 0, F_STREAM);
}
// cuMemcpy{HtoD,DtoH,DtoD}_v2(dst, src, bytes), cuMemcpy(dst, src, bytes)
static __always_inline int SHAPE_drv_memcpy(struct pt_regs *ctx, u16 op, u8 kind) {
    return enter(ctx, op, PT_REGS_PARM3(ctx), 0, 0, kind, F_BYTES);
}
// cuMemcpy*Async(dst, src, bytes, stream)
static __always_inline int SHAPE_drv_memcpy_async(struct pt_regs *ctx, u16 op, u8 kind) {
    return enter(ctx, op, PT_REGS_PARM3(ctx), PT_REGS_PARM4(ctx), 0, kind, F_BYTES | F_STREAM);
}

// ---- scheduler -----------------------------------------------------------------------------

TRACEPOINT_PROBE(sched, sched_switch) {
    u64 now = bpf_ktime_get_ns();
    u64 pt = bpf_get_current_pid_tgid();
    u32 prev_tgid = pt >> 32;
    u32 prev_tid = args->prev_pid;
    count(C_SWITCH_TOTAL);
    // on-CPU time of the slice that ends now, credited to the outgoing task (pid 0: idle time)
    int z = 0;
    u64 oncpu = 0;
    u64 *tin = cpu_in.lookup(&z);
    if (tin) {
        if (*tin)
            oncpu = now - *tin;
        *tin = now;
    }
    agg_add(prev_tgid, now, A_SWITCH, oncpu, C_AGG_DROP_SWITCH);

    long prev_state = args->prev_state;
    if (prev_state & 0x30) {
        // EXIT_DEAD / EXIT_ZOMBIE: the thread's last switch-out, after sched_process_exit
        // deleted its state; do not make a new one (it would leak).
        tstate.delete(&prev_tid);
    } else if (prev_tid != 0 && traced.lookup(&prev_tgid)) {
        struct tstate *st = get_state(prev_tid, prev_tgid);
        if (st) {
            long s = prev_state;
            st->switches++;
            st->off_ts = now;
            st->wake_ts = 0;
            // TASK_RUNNING (0) or the "preempted" report value (TASK_REPORT_MAX, low byte 0)
            st->off_state = ((s & 0xff) == 0) ? 1 : 2;
            st->preemptor_pid = args->next_pid;
            bpf_probe_read_kernel(&st->preemptor_comm, COMM_LEN, args->next_comm);
            st->cpu = bpf_get_smp_processor_id();
        }
    }

    u32 next_tid = args->next_pid;
    if (next_tid == 0)
        return 0;
    struct tstate *nt = tstate.lookup(&next_tid);
    if (!nt || !nt->off_ts)
        return 0;
    u64 off = nt->off_ts;
    u64 wake = nt->wake_ts;
    if (nt->off_state == 1) {
        nt->pre_ns += now - off;
    } else if (wake > off && wake <= now) {
        nt->blk_ns += wake - off;
        nt->pre_ns += now - wake;
    } else {
        nt->blk_ns += now - off;
    }
    nt->off_ts = 0;
    count(C_SCHED_SEEN);
    struct sched_ev *ev = sched_events.ringbuf_reserve(sizeof(struct sched_ev));
    if (!ev) {
        count(C_SCHED_DROP);
        return 0;
    }
    ev->off_ts = off;
    ev->on_ts = now;
    ev->wake_ts = (nt->off_state == 2 && wake > off && wake <= now) ? wake : 0;
    ev->pid = nt->tgid;
    ev->tid = next_tid;
    ev->preemptor_pid = nt->preemptor_pid;
    ev->cpu = nt->cpu;
    __builtin_memcpy(ev->preemptor_comm, nt->preemptor_comm, COMM_LEN);
    ev->state = nt->off_state;
    sched_events.ringbuf_submit(ev, BPF_RB_NO_WAKEUP);
    return 0;
}

TRACEPOINT_PROBE(sched, sched_wakeup) {
    u32 tid = args->pid;
    struct tstate *st = tstate.lookup(&tid);
    if (st && st->off_ts && !st->wake_ts) {
        st->wake_ts = bpf_ktime_get_ns();
        count(C_WAKEUP_SEEN);
    }
    return 0;
}

TRACEPOINT_PROBE(kmem, mm_page_alloc) {
    u64 now = bpf_ktime_get_ns();
    u64 pt = bpf_get_current_pid_tgid();
    u32 tid = (u32)pt;
    u64 bytes = PAGE_BYTES << (args->order & 31);
    count(C_PAGE_TOTAL);
    agg_add(pt >> 32, now, A_PAGE, bytes, C_AGG_DROP_PAGE);
    struct tstate *st = tstate.lookup(&tid);
    if (st) {
        st->pages++;
        st->pg_bytes += bytes;
    }
    return 0;
}

// ---- processes -----------------------------------------------------------------------------

static __always_inline struct proc_ev *proc_reserve(void) {
    count(C_PROC_SEEN);
    struct proc_ev *ev = proc_events.ringbuf_reserve(sizeof(struct proc_ev));
    if (!ev)
        count(C_PROC_DROP);
    return ev;
}

TRACEPOINT_PROBE(task, task_newtask) {
    if (args->clone_flags & CLONE_THREAD_FLAG)
        return 0;
    u64 pt = bpf_get_current_pid_tgid();
    u32 ptgid = pt >> 32;
    u32 child = args->pid;
    u32 flags = 0;
    if (traced.lookup(&ptgid)) {
        u8 one = 1;
        traced.update(&child, &one);
        flags = 2;
    }
    struct proc_ev *ev = proc_reserve();
    if (!ev)
        return 0;
    ev->ts = bpf_ktime_get_ns();
    ev->kind = P_FORK;
    ev->pid = ptgid;
    ev->tid = (u32)pt;
    ev->child = child;
    ev->exit_code = 0;
    ev->flags = flags;
    bpf_probe_read_kernel(&ev->comm, COMM_LEN, args->comm);
    ev->filename[0] = 0;
    proc_events.ringbuf_submit(ev, 0);
    return 0;
}

TRACEPOINT_PROBE(sched, sched_process_exec) {
    u64 pt = bpf_get_current_pid_tgid();
    u32 tgid = pt >> 32;
    struct proc_ev *ev = proc_reserve();
    if (!ev)
        return 0;
    ev->ts = bpf_ktime_get_ns();
    ev->kind = P_EXEC;
    ev->pid = tgid;
    ev->tid = (u32)pt;
    ev->child = args->old_pid;
    ev->exit_code = 0;
    ev->flags = traced.lookup(&tgid) ? 2 : 0;
    bpf_get_current_comm(&ev->comm, COMM_LEN);
    unsigned short off = args->data_loc_filename & 0xFFFF;
    bpf_probe_read_kernel_str(&ev->filename, FILENAME_LEN, (char *)args + off);
    proc_events.ringbuf_submit(ev, 0);
    return 0;
}

#ifdef HAVE_EXIT_GROUP
TRACEPOINT_PROBE(syscalls, sys_enter_exit_group) {
    u32 tgid = bpf_get_current_pid_tgid() >> 32;
    s32 code = (s32)args->error_code;
    exit_codes.update(&tgid, &code);
    return 0;
}
#endif

TRACEPOINT_PROBE(sched, sched_process_exit) {
    u64 pt = bpf_get_current_pid_tgid();
    u32 tgid = pt >> 32;
    u32 tid = (u32)pt;
    tstate.delete(&tid);
#ifdef HAVE_GROUP_DEAD
    if (!args->group_dead)
        return 0;
#else
    if (tid != tgid)
        return 0;
#endif
    u32 flags = traced.lookup(&tgid) ? 2 : 0;
    traced.delete(&tgid);
    s32 code = 0;
    s32 *c = exit_codes.lookup(&tgid);
    if (c) {
        code = *c;
        flags |= 1;
        exit_codes.delete(&tgid);
    }
    struct proc_ev *ev = proc_reserve();
    if (!ev)
        return 0;
    ev->ts = bpf_ktime_get_ns();
    ev->kind = P_EXIT;
    ev->pid = tgid;
    ev->tid = tid;
    ev->child = 0;
    ev->exit_code = code;
    ev->flags = flags;
    bpf_get_current_comm(&ev->comm, COMM_LEN);
    ev->filename[0] = 0;
    proc_events.ringbuf_submit(ev, 0);
    return 0;
}

#ifdef HAVE_OOM
TRACEPOINT_PROBE(oom, mark_victim) {
    u32 victim = args->pid;
    struct proc_ev *ev = proc_reserve();
    if (!ev)
        return 0;
    ev->ts = bpf_ktime_get_ns();
    ev->kind = P_OOM;
    ev->pid = victim;
    ev->tid = victim;
    ev->child = 0;
    ev->exit_code = 0;
    ev->flags = traced.lookup(&victim) ? 2 : 0;
    unsigned short off = args->data_loc_comm & 0xFFFF;
    bpf_probe_read_kernel_str(&ev->comm, COMM_LEN, (char *)args + off);
    ev->filename[0] = 0;
    proc_events.ringbuf_submit(ev, 0);
    return 0;
}
#endif
