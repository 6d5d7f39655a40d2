// ingero-mcp collector: CUDA uprobes + scheduler / memory / process tracepoints (BCC C).
//
// What this program keeps in the kernel, and why:
//  - `traced`: the tgids whose CUDA calls and scheduler intervals are recorded as rows. Userspace
//    seeds it (--pid, or processes found mapping libcudart/libcuda); task_newtask adds the children
//    of traced processes, so DataLoader workers are followed from their first instruction.
//  - `tstate`: per traced thread, monotonic counters (CPU-wait ns, sleep ns, switches, pages)
//    updated at sched_switch / sched_waking / mm_page_alloc, the off-CPU interval in progress
//    (switch-out time, state, first holder, waker, syscall), plus a small stack of CUDA calls in
//    flight. A call's attribution is the counters' delta between its entry and its return, so nested
//    calls (cudaMemcpy -> cuMemcpy*) each get their own exact numbers without per-call map updates.
//  - `agg`: exact per (pid, tid, cpu, 1 s bucket) counts of sched_switch (with the on-CPU time of
//    the slices that ended) and per (pid, 1 s bucket) mm_page_alloc (with bytes), for EVERY task.
//  - `irq_depth`: per-CPU interrupt nesting (hardirq, softirq, hrtimer expiry), so a wakeup made
//    from interrupt context is flagged as such (its "waker" is merely the interrupted task).
//  - `pending_holder`: per CPU, the traced thread that just left it and the tid that took it; at the
//    next switch on that CPU the taker is `current`, which gives its tgid for free.
//  - `counters`: per-CPU totals of events seen and of records that could not be stored (ring full,
//    map full, call stack too deep), so nothing is lost silently.
// Records go to three BPF ring buffers with fixed-size records that userspace reads in bulk via
// mmap (no per-event callback). Submits do not wake the reader; it drains on a timer.
//
// The loader appends one small entry function per CUDA symbol (see collector/ops.py) that calls
// one of the SHAPE_* helpers below with the op id; all symbols share one return probe. Launch
// symbols also get an entry-only variant (op id | OP_ENTRY_ONLY) that records the call at entry.

#include <uapi/linux/ptrace.h>
#include <uapi/linux/bpf_perf_event.h>

#define MAX_DEPTH 4
#define COMM_LEN 16
#define FILENAME_LEN 128
#define PAGE_BYTES 4096ULL
#define CLONE_THREAD_FLAG 0x00010000ULL
#define WAKE_RACE_NS 1000000ULL
// Kernel stacks at a switch-out into sleep: the innermost KSTACK_DEPTH frames say what a thread
// waited in (a pipe, a socket, a disk, fsync, a futex, a timer), deduplicated in a stack map.
#ifndef KSTACK_DEPTH
#define KSTACK_DEPTH 16
#endif
#ifndef KSTACK_ENTRIES
#define KSTACK_ENTRIES 8192
#endif
// User stacks, taken where the kernel stack is (a switch-out into sleep) and at on-CPU samples: the
// innermost USTACK_DEPTH frames, walked by the kernel through frame pointers (code built without
// them stops at the leaf). Userspace symbolises them while the process lives (collector/ustacks.py).
#ifndef USTACK_DEPTH
#define USTACK_DEPTH 32
#endif
#ifndef USTACK_ENTRIES
#define USTACK_ENTRIES 32768
#endif
#define EFAULT_ 14   // bpf_get_stackid's -EFAULT: no stack there (a sample in user mode, a kernel thread)

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
#define C_WAKE_IRQ 14
#define C_KSTACK_LOST 15   // a switch-out whose kernel stack could not be taken (a hash collision, a fault)
#define C_USTACK_LOST 16   // a user stack that could not be stored (a hash collision in the stack map)
#define C_SAMPLE_SEEN 17   // on-CPU samples of traced threads
#define C_SAMPLE_DROP 18   // ... lost: the sample ring was full
#define N_COUNTERS 19

// event flags
#define F_BYTES 1
#define F_STREAM 2
#define F_REC_ALLOC 4   // on success, remember *aux -> bytes (cudaMalloc / cuMemAlloc)
#define F_HANDLE 8      // handle: the kernel / graph exec launched
#define F_HOSTPTR 16    // hptr: the host address of a copy, or a host range's base
#define F_REC_HOST 32   // on success, hptr := *aux (host allocations return their pointer)
#define F_NORET 64      // entry-only probe: emitted at entry, the call's end is not seen (dur 0, no split)

// An op id with this bit is probed entry-only (the generated o_<symbol> functions): kernel launches,
// whose evidence is when, where, which kernel and how often, not a return probe's extra trap.
#define OP_ENTRY_ONLY 0x8000

// off-CPU states (sched_ev.state, tstate.off_state); names in collector/records.py
#define S_PREEMPTED 1
#define S_SLEEPING 2
#define S_UNINTERRUPTIBLE 3
#define S_NEW 4
#define S_OTHER 5

// waker context
#define W_TASK 1
#define W_IRQ 2
#define W_SOFTIRQ 3

// sched_ev.flags
#define SF_PREEMPTOR_TGID 1   // preemptor_pid is the first holder's tgid (else its tid, as v1)

// proc event kinds
#define P_FORK 1
#define P_EXEC 2
#define P_EXIT 3
#define P_OOM 4
#define P_THREAD 5
#define P_RENAME 6
#define P_TEXIT 7   // a thread (not the last) of a traced process exited: ends its threads row only

// agg kinds
#define A_SWITCH 1
#define A_PAGE 2

struct frame {
    u64 ts;
    u64 sp;
    u64 bytes;
    u64 stream;
    u64 aux;
    u64 handle;
    u64 hptr;
    u64 wait0;
    u64 sleep0;
    u64 pgb0;
    u32 sw0;
    u32 pg0;
    u16 op;
    u8 kind;
    u8 flags;
    u32 pad;
};

struct tstate {
    u64 wait_ns;       // runnable but not running: preempted at switch-out, or woken (created) and waiting
    u64 sleep_ns;      // sleeping: switch-out (not runnable) until the wakeup (whole interval if unseen)
    u64 pg_bytes;
    u32 switches;
    u32 pages;
    u64 off_ts;        // switched out (or created) at (0: on CPU)
    u64 wake_ts;       // woken at, since the last switch-out (0: not yet)
    u32 preemptor_tid; // first holder: the task that got the CPU at switch-out
    u32 preemptor_pid; // its tgid once seen leaving that CPU (sflags), else its tid
    u32 cpu;
    u32 tgid;
    char preemptor_comm[COMM_LEN];
    u32 waker_pid;
    u32 waker_tid;
    char waker_comm[COMM_LEN];
    s32 syscall;       // syscall number at switch-out, -1: not in a syscall / unknown
    s32 kstack;        // kstacks id of the kernel stack at switch-out, < 0: not taken
    s32 ustack;        // ustacks id of the user stack at switch-out, < 0: not taken
    u32 pad0;
    u64 py;            // the Python stack's id at switch-out (pyframes.bpf.h), 0: none
    u8 off_state;      // S_*
    u8 depth;
    u8 waker_ctx;      // W_*, 0: no wakeup seen
    u8 sflags;         // SF_*
    struct frame fr[MAX_DEPTH];
};

struct cuda_ev {
    u64 ts;
    u64 dur;
    u64 bytes;
    u64 stream;
    u64 handle;
    u64 host_ptr;
    u64 wait_ns;
    u64 sleep_ns;
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
    u64 wake_ts;        // wakeup (or creation) seen at; 0: none seen
    u32 pid;
    u32 tid;
    u32 preemptor_pid;
    u32 preemptor_tid;
    u32 cpu;            // the CPU it left
    u32 on_cpu;         // the CPU it came back on
    u32 holder_pid;     // last holder: the task that left on_cpu as it came back
    u32 holder_tid;
    u32 waker_pid;
    u32 waker_tid;
    s32 syscall;
    char preemptor_comm[COMM_LEN];
    char holder_comm[COMM_LEN];
    char waker_comm[COMM_LEN];
    u8 state;
    u8 waker_ctx;
    u8 flags;
    u8 pad;
    s32 kstack;         // kstacks id of the kernel stack at switch-out, < 0: not taken
    s32 ustack;         // ustacks id of the user stack at switch-out, < 0: not taken
    u64 py;             // the Python stack's id at switch-out, 0: none
};

// An on-CPU sample of a traced thread (the perf event program, --stack-hz per CPU).
struct sample_ev {
    u64 ts;
    u64 py;             // the Python stack's id, 0: none
    u32 pid;
    u32 tid;
    u32 cpu;
    s32 kstack;         // kstacks id when the sample fell in the kernel, < 0: in user space (or lost)
    s32 ustack;         // ustacks id, < 0: not taken
    u32 pad;
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
    char filename[FILENAME_LEN];   // exec: the program; rename: the old name
};

struct agg_key {
    u32 pid;
    u32 tid;           // A_SWITCH: the thread (0 with pid 0: that CPU's idle task); A_PAGE: 0
    u32 sec;
    u16 cpu;           // A_SWITCH: the CPU the slices ran on; A_PAGE: AGG_NO_CPU
    u16 kind;
};
#define AGG_NO_CPU 0xffff

struct irq_depth_t {
    s32 hard;
    s32 soft;
    s32 timer;
    s32 pad;
};

struct pending_t {
    u32 waiter;        // traced tid that just left this CPU (0: none)
    u32 holder;        // the tid that took the CPU
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

struct kstack_t {
    u64 ip[KSTACK_DEPTH];
};

struct ustack_t {
    u64 ip[USTACK_DEPTH];
};

BPF_HASH(traced, u32, u8, 65536);
BPF_HASH(tstate, u32, struct tstate, 16384);
BPF_PERCPU_ARRAY(zero_state, struct tstate, 1);
BPF_HASH(agg, struct agg_key, struct agg_val, AGG_ENTRIES);
BPF_HASH(allocs, struct alloc_key, u64, 65536);
BPF_HASH(exit_codes, u32, s32, 16384);
BPF_PERCPU_ARRAY(counters, u64, N_COUNTERS);
BPF_PERCPU_ARRAY(cpu_in, u64, 1);   // when the task now on this CPU was switched in
BPF_PERCPU_ARRAY(irq_depth, struct irq_depth_t, 1);
BPF_PERCPU_ARRAY(pending_holder, struct pending_t, 1);
BPF_ARRAY(config, u64, 4);   // [0]: trace every process that calls CUDA (no --pid); [1]: irq depth armed

BPF_TABLE("stacktrace", int, struct kstack_t, kstacks, KSTACK_ENTRIES);
BPF_TABLE("stacktrace", int, struct ustack_t, ustacks, USTACK_ENTRIES);
BPF_RINGBUF_OUTPUT(sample_events, SAMPLE_RB_PAGES);
BPF_RINGBUF_OUTPUT(cuda_events, CUDA_RB_PAGES);
BPF_RINGBUF_OUTPUT(sched_events, SCHED_RB_PAGES);
BPF_RINGBUF_OUTPUT(proc_events, PROC_RB_PAGES);

static __always_inline void count(int idx) {
    u64 *c = counters.lookup(&idx);
    if (c)
        (*c)++;
}

// The Python walker (its maps and py_stack(tgid, tid)): the loader puts collectors/pyframes.bpf.h in place of
// this line before compiling, so the compiled program's cache key covers it.
#include "pyframes.bpf.h"

static __always_inline struct tstate *get_state(u32 tid, u32 tgid) {
    struct tstate *st = tstate.lookup(&tid);
    if (st)
        return st;
    int z = 0;
    struct tstate *init = zero_state.lookup(&z);
    if (!init)
        return 0;
    init->tgid = tgid;
    init->kstack = -1;
    init->ustack = -1;
    if (tstate.insert(&tid, init) != 0) {
        st = tstate.lookup(&tid);   // raced with another CPU, or full
        if (!st)
            count(C_TSTATE_FULL);
        return st;
    }
    return tstate.lookup(&tid);
}

static __always_inline void agg_add(u32 pid, u32 tid, u16 cpu, u64 now, u16 kind, u64 sum, int drop_idx) {
    struct agg_key k = {};
    k.pid = pid;
    k.tid = tid;
    k.sec = now / 1000000000ULL;
    k.cpu = cpu;
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

// One call record into the CUDA ring (entry-only launches at entry, every other call at its return):
// the counters are what happened to the thread during the call (0 for an entry-only record).
static __always_inline void emit_call(u64 ts, u64 dur, u64 bytes, u64 stream, u64 handle, u64 hptr,
                                      u64 wait_ns, u64 sleep_ns, u64 pg_bytes, u32 pid, u32 tid,
                                      u32 switches, u32 pages, s32 ret, u16 op, u8 kind, u8 flags) {
    struct cuda_ev *ev = cuda_events.ringbuf_reserve(sizeof(struct cuda_ev));
    if (!ev) {
        count(C_CUDA_DROP);
        return;
    }
    ev->ts = ts;
    ev->dur = dur;
    ev->bytes = bytes;
    ev->stream = stream;
    ev->handle = handle;
    ev->host_ptr = hptr;
    ev->wait_ns = wait_ns;
    ev->sleep_ns = sleep_ns;
    ev->pg_bytes = pg_bytes;
    ev->pid = pid;
    ev->tid = tid;
    ev->switches = switches;
    ev->pages = pages;
    ev->ret = ret;
    ev->op = op;
    ev->kind = kind;
    ev->flags = flags;
    cuda_events.ringbuf_submit(ev, BPF_RB_NO_WAKEUP);
}

static __always_inline int enter_h(struct pt_regs *ctx, u16 op, u64 bytes, u64 stream, u64 aux,
                                   u8 kind, u8 flags, u64 handle, u64 hptr) {
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
    if (op & OP_ENTRY_ONLY) {
        // one record now: no frame, no return probe (a constant after inlining: no branch at run time)
        emit_call(bpf_ktime_get_ns(), 0, bytes, stream, handle, hptr, 0, 0, 0, tgid, tid, 0, 0, 0,
                  op & ~OP_ENTRY_ONLY, kind, (flags & (F_BYTES | F_STREAM | F_HANDLE | F_HOSTPTR)) | F_NORET);
        count(C_CUDA_SEEN);
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
    f->handle = handle;
    f->hptr = hptr;
    f->wait0 = st->wait_ns;
    f->sleep0 = st->sleep_ns;
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

static __always_inline int enter(struct pt_regs *ctx, u16 op, u64 bytes, u64 stream, u64 aux,
                                 u8 kind, u8 flags) {
    return enter_h(ctx, op, bytes, stream, aux, kind, flags, 0, 0);
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
        u64 hptr = f->hptr;
        u8 flags = f->flags;
        if ((flags & F_REC_HOST) && ret == 0 && f->aux) {
            bpf_probe_read_user(&hptr, sizeof(hptr), (void *)f->aux);
            flags |= F_HOSTPTR;
        }
        emit_call(f->ts, now - f->ts, f->bytes, f->stream, f->handle, hptr, st->wait_ns - f->wait0,
                  st->sleep_ns - f->sleep0, st->pg_bytes - f->pgb0, pt >> 32, tid, st->switches - f->sw0,
                  st->pages - f->pg0, ret, f->op, f->kind, flags & (F_BYTES | F_STREAM | F_HANDLE | F_HOSTPTR));
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
// cudaGraphLaunch(graphExec, stream) / cuGraphLaunch(hGraphExec, hStream): the handle is the graph exec
static __always_inline int SHAPE_stream2(struct pt_regs *ctx, u16 op) {
    return enter_h(ctx, op, 0, PT_REGS_PARM2(ctx), 0, 0, F_STREAM | F_HANDLE, PT_REGS_PARM1(ctx), 0);
}
// The host side of a copy of kind k (cudaMemcpyKind + 1): H2D reads src, D2H writes dst.
static __always_inline u64 host_side(u8 k, u64 dst, u64 src, u8 *flags) {
    // Both loaded from ctx before choosing: the verifier refuses a load through a ctx pointer
    // the compiler would otherwise pick between the two register slots.
    asm volatile("" : "+r"(dst), "+r"(src));
    if (k == 2) {
        *flags |= F_HOSTPTR;
        return src;
    }
    if (k == 3) {
        *flags |= F_HOSTPTR;
        return dst;
    }
    return 0;
}
// cudaMemcpy(dst, src, count, kind)
static __always_inline int SHAPE_rt_memcpy(struct pt_regs *ctx, u16 op) {
    u64 k = PT_REGS_PARM4(ctx);
    u8 kind = k < 5 ? k + 1 : 0;
    u8 flags = F_BYTES;
    u64 h = host_side(kind, PT_REGS_PARM1(ctx), PT_REGS_PARM2(ctx), &flags);
    return enter_h(ctx, op, PT_REGS_PARM3(ctx), 0, 0, kind, flags, 0, h);
}
// cudaMemcpyAsync(dst, src, count, kind, stream)
static __always_inline int SHAPE_rt_memcpy_async(struct pt_regs *ctx, u16 op) {
    u64 k = PT_REGS_PARM4(ctx);
    u8 kind = k < 5 ? k + 1 : 0;
    u8 flags = F_BYTES | F_STREAM;
    u64 h = host_side(kind, PT_REGS_PARM1(ctx), PT_REGS_PARM2(ctx), &flags);
    return enter_h(ctx, op, PT_REGS_PARM3(ctx), PT_REGS_PARM5(ctx), 0, kind, flags, 0, h);
}
// cudaMalloc(void **ptr, size) / cuMemAlloc_v2(CUdeviceptr *ptr, size)
static __always_inline int SHAPE_malloc(struct pt_regs *ctx, u16 op) {
    return enter(ctx, op, PT_REGS_PARM2(ctx), 0, PT_REGS_PARM1(ctx), 0, F_BYTES | F_REC_ALLOC);
}
// cudaHostAlloc(void **ptr, size, flags) / cuMemHostAlloc(void **pp, size, flags) /
// cudaMallocHost(void **ptr, size) / cuMemAllocHost_v2(void **pp, size): the pointer returned -> hptr
static __always_inline int SHAPE_hostalloc(struct pt_regs *ctx, u16 op) {
    return enter(ctx, op, PT_REGS_PARM2(ctx), 0, PT_REGS_PARM1(ctx), 0, F_BYTES | F_REC_HOST);
}
// cudaHostRegister(ptr, size, flags) / cuMemHostRegister_v2(p, size, flags)
static __always_inline int SHAPE_hostreg(struct pt_regs *ctx, u16 op) {
    return enter_h(ctx, op, PT_REGS_PARM2(ctx), 0, 0, 0, F_BYTES | F_HOSTPTR, 0, PT_REGS_PARM1(ctx));
}
// cudaHostUnregister(ptr) / cudaFreeHost(ptr) / cuMemHostUnregister(p) / cuMemFreeHost(p)
static __always_inline int SHAPE_hostptr1(struct pt_regs *ctx, u16 op) {
    return enter_h(ctx, op, 0, 0, 0, 0, F_HOSTPTR, 0, PT_REGS_PARM1(ctx));
}
// cudaFree(void *ptr) / cuMemFree_v2(CUdeviceptr): the size remembered at allocation, if seen
static __always_inline int SHAPE_free(struct pt_regs *ctx, u16 op) {
    u8 flags = 0;
    u64 size = free_size(PT_REGS_PARM1(ctx), &flags);
    return enter(ctx, op, size, 0, 0, 0, flags);
}
// cudaLaunchKernel(func, dim3 grid (2 regs), dim3 block (2 regs), args, sharedMem, stream)
static __always_inline int SHAPE_rt_launch(struct pt_regs *ctx, u16 op) {
    return enter_h(ctx, op, 0, stack_arg(ctx, 1), 0, 0, F_STREAM | F_HANDLE, PT_REGS_PARM1(ctx), 0);
}
// cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shared, hStream, params, extra)
static __always_inline int SHAPE_drv_launch(struct pt_regs *ctx, u16 op) {
    return enter_h(ctx, op, 0, stack_arg(ctx, 2), 0, 0, F_STREAM | F_HANDLE, PT_REGS_PARM1(ctx), 0);
}
// cuLaunchKernelEx(const CUlaunchConfig *config, f, params, extra): hStream at offset 32;
// cudaLaunchKernelExC(const cudaLaunchConfig_t *config, func, args) has the same two first args
static __always_inline int SHAPE_drv_launch_ex(struct pt_regs *ctx, u16 op) {
    u64 stream = 0;
    u64 cfg = PT_REGS_PARM1(ctx);
    if (cfg)
        bpf_probe_read_user(&stream, sizeof(stream), (void *)(cfg + 32));
    return enter_h(ctx, op, 0, stream, 0, 0, F_STREAM | F_HANDLE, PT_REGS_PARM2(ctx), 0);
}
// cuMemcpy{HtoD,DtoH,DtoD}_v2(dst, src, bytes), cuMemcpy(dst, src, bytes)
static __always_inline int SHAPE_drv_memcpy(struct pt_regs *ctx, u16 op, u8 kind) {
    u8 flags = F_BYTES;
    u64 h = host_side(kind, PT_REGS_PARM1(ctx), PT_REGS_PARM2(ctx), &flags);
    return enter_h(ctx, op, PT_REGS_PARM3(ctx), 0, 0, kind, flags, 0, h);
}
// cuMemcpy*Async(dst, src, bytes, stream)
static __always_inline int SHAPE_drv_memcpy_async(struct pt_regs *ctx, u16 op, u8 kind) {
    u8 flags = F_BYTES | F_STREAM;
    u64 h = host_side(kind, PT_REGS_PARM1(ctx), PT_REGS_PARM2(ctx), &flags);
    return enter_h(ctx, op, PT_REGS_PARM3(ctx), PT_REGS_PARM4(ctx), 0, kind, flags, 0, h);
}

// ---- scheduler -----------------------------------------------------------------------------

// The system call a thread is in, from the registers saved at kernel entry (pt_regs is a stable
// layout, unlike task_struct: BCC compiles against the distribution's headers, not the running
// kernel's). Entry through `syscall` saved rcx == ip and r11 == flags; an interrupt or a page
// fault (whose orig_ax is a vector or an error code, not a syscall number) does not.
static __always_inline s32 current_syscall(void) {
#ifdef HAVE_TASK_PT_REGS
    struct pt_regs r = {};
    struct pt_regs *regs = (struct pt_regs *)bpf_task_pt_regs(bpf_get_current_task_btf());
    if (!regs || bpf_probe_read_kernel(&r, sizeof(r), regs))
        return -1;
    if ((r.cs & 3) != 3 || r.cx != r.ip || r.r11 != r.flags)
        return -1;
    return (s32)r.orig_ax;
#else
    return -1;
#endif
}

static __always_inline u8 wake_context(void) {
    int z = 0;
    struct irq_depth_t *d = irq_depth.lookup(&z);
    if (!d)
        return W_TASK;
    if (d->hard > 0)
        return W_IRQ;
    if (d->soft > 0)
        return W_SOFTIRQ;
    if (d->timer > 0)
        return W_IRQ;   // an hrtimer expiring in hardirq (the softirq ones are counted above)
    return W_TASK;
}

static __always_inline void note_waker(struct tstate *st, u64 now) {
    u64 pt = bpf_get_current_pid_tgid();
    st->wake_ts = now;
    st->waker_pid = pt >> 32;
    st->waker_tid = (u32)pt;
    bpf_get_current_comm(&st->waker_comm, COMM_LEN);
    st->waker_ctx = wake_context();
    if (st->waker_ctx != W_TASK)
        count(C_WAKE_IRQ);
}

TRACEPOINT_PROBE(sched, sched_switch) {
    u64 now = bpf_ktime_get_ns();
    u64 pt = bpf_get_current_pid_tgid();
    u32 prev_tgid = pt >> 32;
    u32 prev_tid = args->prev_pid;
    u32 cpu = bpf_get_smp_processor_id();
    count(C_SWITCH_TOTAL);
    // on-CPU time of the slice that ends now, credited to the outgoing thread on this CPU (pid 0: idle)
    int z = 0;
    u64 oncpu = 0;
    u64 *tin = cpu_in.lookup(&z);
    if (tin) {
        if (*tin)
            oncpu = now - *tin;
        *tin = now;
    }
    agg_add(prev_tgid, prev_tid, (u16)cpu, now, A_SWITCH, oncpu, C_AGG_DROP_SWITCH);

    // The task leaving now took this CPU from a traced thread at the previous switch here: its
    // tgid is known now (current), so the first holder gets a pid, not only a tid.
    struct pending_t *pend = pending_holder.lookup(&z);
    if (pend && pend->waiter) {
        u32 w = pend->waiter;
        pend->waiter = 0;
        struct tstate *ws = tstate.lookup(&w);
        if (ws && ws->off_ts && ws->preemptor_tid == prev_tid && !(ws->sflags & SF_PREEMPTOR_TGID)) {
            ws->preemptor_pid = prev_tgid;
            ws->sflags |= SF_PREEMPTOR_TGID;
        }
    }

    long prev_state = args->prev_state;
    u32 next_tid = args->next_pid;
    if (prev_state & 0x30) {
        // EXIT_DEAD / EXIT_ZOMBIE: the thread's last switch-out, after sched_process_exit
        // deleted its state; do not make a new one (it would leak).
        tstate.delete(&prev_tid);
    } else if (prev_tid != 0 && traced.lookup(&prev_tgid)) {
        struct tstate *st = get_state(prev_tid, prev_tgid);
        if (st) {
            long s = prev_state & 0xff;
            st->switches++;
            st->off_ts = now;
            if (s != 0 && st->waker_ctx && st->wake_ts && now - st->wake_ts < WAKE_RACE_NS) {
                // woken while still going to sleep (sched_waking ran just before this switch-out,
                // the thread had already set its sleeping state): runnable from the switch-out on,
                // and the waker is known. A waking older than WAKE_RACE_NS is stale, not this sleep's.
                st->wake_ts = now;
            } else {
                st->wake_ts = 0;
                st->waker_ctx = 0;
            }
            // TASK_RUNNING (0) or the "preempted" report value (TASK_REPORT_MAX, low byte 0);
            // 0x80 is TASK_REPORT_IDLE (an idle kthread's wait), a sleep, not disk IO
            if (s == 0)
                st->off_state = S_PREEMPTED;
            else if (s == 0x1 || s == 0x80)
                st->off_state = S_SLEEPING;
            else if (s == 0x2)
                st->off_state = S_UNINTERRUPTIBLE;
            else
                st->off_state = S_OTHER;
            st->preemptor_tid = next_tid;
            st->preemptor_pid = next_tid;
            st->sflags = next_tid == 0 ? SF_PREEMPTOR_TGID : 0;   // the idle task: pid 0
            bpf_probe_read_kernel(&st->preemptor_comm, COMM_LEN, args->next_comm);
            st->cpu = cpu;
            st->syscall = current_syscall();
            // Only a thread going to sleep: what it waits in is the question (a preempted thread waits
            // for a CPU, and the walk costs ~0.5-1 us on the H200). No BPF_F_REUSE_STACKID: an id, once
            // given, always names the same stack (userspace reads each id once); a different stack
            // hashing to a taken slot is counted, not stored.
            // The user stack (and the Python one) only where the kernel stack is taken: what the thread's own
            // code was blocked in; -EFAULT: no user stack (not counted as lost).
            st->kstack = -1;
            st->ustack = -1;
            st->py = 0;
            if (s != 0) {
                st->kstack = kstacks.get_stackid(args, 0);
                if (st->kstack < 0)
                    count(C_KSTACK_LOST);
                st->ustack = ustacks.get_stackid(args, BPF_F_USER_STACK);
                if (st->ustack < 0 && st->ustack != -EFAULT_)
                    count(C_USTACK_LOST);
                st->py = py_stack(prev_tgid, prev_tid);
            }
            if (pend && next_tid != 0) {
                pend->waiter = prev_tid;
                pend->holder = next_tid;
            }
        }
    }

    if (next_tid == 0)
        return 0;
    struct tstate *nt = tstate.lookup(&next_tid);
    if (!nt || !nt->off_ts)
        return 0;
    u64 off = nt->off_ts;
    u64 wake = nt->wake_ts;
    u8 state = nt->off_state;
    int woke = wake >= off && wake <= now && nt->waker_ctx;
    if (state == S_PREEMPTED || state == S_NEW) {
        nt->wait_ns += now - off;
    } else if (woke) {
        nt->sleep_ns += wake - off;
        nt->wait_ns += now - wake;
    } else {
        nt->sleep_ns += now - off;   // wakeup not seen: the call's split counts it all as sleep
    }
    nt->off_ts = 0;
    u8 wctx = nt->waker_ctx;
    nt->waker_ctx = 0;   // on CPU: the next waking is the next sleep's (or one racing its switch-out)
    nt->wake_ts = 0;
    count(C_SCHED_SEEN);
    struct sched_ev *ev = sched_events.ringbuf_reserve(sizeof(struct sched_ev));
    if (!ev) {
        count(C_SCHED_DROP);
        return 0;
    }
    ev->off_ts = off;
    ev->on_ts = now;
    ev->wake_ts = (state != S_PREEMPTED && woke) ? wake : 0;
    ev->pid = nt->tgid;
    ev->tid = next_tid;
    ev->preemptor_pid = nt->preemptor_pid;
    ev->preemptor_tid = nt->preemptor_tid;
    ev->cpu = nt->cpu;
    ev->on_cpu = cpu;
    ev->holder_pid = prev_tgid;
    ev->holder_tid = prev_tid;
    ev->waker_pid = nt->waker_pid;
    ev->waker_tid = nt->waker_tid;
    ev->syscall = nt->syscall;
    __builtin_memcpy(ev->preemptor_comm, nt->preemptor_comm, COMM_LEN);
    bpf_probe_read_kernel(&ev->holder_comm, COMM_LEN, args->prev_comm);
    __builtin_memcpy(ev->waker_comm, nt->waker_comm, COMM_LEN);
    ev->state = state;
    ev->waker_ctx = (state != S_PREEMPTED && woke) ? wctx : 0;
    ev->flags = nt->sflags;
    ev->pad = 0;
    ev->kstack = nt->kstack;
    ev->ustack = nt->ustack;
    ev->py = nt->py;
    sched_events.ringbuf_submit(ev, BPF_RB_NO_WAKEUP);
    return 0;
}

// On-CPU samples: a software CPU-clock perf event per CPU (--stack-hz) runs this in the interrupted task's
// context; only threads of traced processes are kept. Its kernel stack when it was in the kernel (-EFAULT: in user
// space), its user stack, its Python stack. Loaded as a perf_event program (collector/bpfcache.py: `perf_`).
int perf_sample(struct bpf_perf_event_data *ctx) {
    u64 pt = bpf_get_current_pid_tgid();
    u32 tgid = pt >> 32;
    u32 tid = (u32)pt;
    if (tid == 0 || !traced.lookup(&tgid))
        return 0;
    count(C_SAMPLE_SEEN);
    struct sample_ev *ev = sample_events.ringbuf_reserve(sizeof(struct sample_ev));
    if (!ev) {
        count(C_SAMPLE_DROP);
        return 0;
    }
    ev->ts = bpf_ktime_get_ns();
    ev->pid = tgid;
    ev->tid = tid;
    ev->cpu = bpf_get_smp_processor_id();
    ev->kstack = kstacks.get_stackid(&ctx->regs, 0);
    if (ev->kstack < 0 && ev->kstack != -EFAULT_)
        count(C_KSTACK_LOST);
    ev->ustack = ustacks.get_stackid(&ctx->regs, BPF_F_USER_STACK);
    if (ev->ustack < 0 && ev->ustack != -EFAULT_)
        count(C_USTACK_LOST);
    ev->py = py_stack(tgid, tid);
    ev->pad = 0;
    sample_events.ringbuf_submit(ev, BPF_RB_NO_WAKEUP);
    return 0;
}

// sched_waking runs in the waker's context (current = the waker), where sched_wakeup may run on
// the wakee's CPU with someone else current.
TRACEPOINT_PROBE(sched, sched_waking) {
    u32 tid = args->pid;
    struct tstate *st = tstate.lookup(&tid);
    if (!st || st->waker_ctx)
        return 0;
    // off_ts == 0: woken on its way to sleep, before its switch-out (which then keeps this waker)
    if (!st->off_ts || (st->off_state != S_PREEMPTED && st->off_state != S_NEW)) {
        note_waker(st, bpf_ktime_get_ns());
        count(C_WAKEUP_SEEN);
    }
    return 0;
}

// A new thread (or child process) of a traced process is runnable from its creation: its first
// wait for a CPU starts now. current = the creator.
TRACEPOINT_PROBE(sched, sched_wakeup_new) {
    u32 tid = args->pid;
    struct tstate *st = tstate.lookup(&tid);
    if (!st || st->off_ts || st->switches)
        return 0;
    u64 now = bpf_ktime_get_ns();
    st->off_ts = now;
    st->off_state = S_NEW;
    st->preemptor_tid = 0;
    st->preemptor_pid = 0;
    st->sflags = 0;
    st->preemptor_comm[0] = 0;
    st->cpu = args->target_cpu;
    st->syscall = -1;
    st->kstack = -1;
    st->ustack = -1;
    st->py = 0;
    note_waker(st, now);
    return 0;
}

// Interrupt nesting per CPU, for waker_context. Entries count only once userspace has armed them
// (config[1], set after every probe is attached): an entry seen before its exit probe was attached
// would leave that CPU's depth stuck above 0, while an exit without its entry is ignored (never < 0).
static __always_inline struct irq_depth_t *irq_armed(void) {
    int one = 1;
    u64 *armed = config.lookup(&one);
    if (!armed || !*armed)
        return 0;
    int z = 0;
    return irq_depth.lookup(&z);
}
TRACEPOINT_PROBE(irq, irq_handler_exit) {
    int z = 0;
    struct irq_depth_t *d = irq_depth.lookup(&z);
    if (d && d->hard > 0)
        d->hard--;
    return 0;
}
TRACEPOINT_PROBE(irq, softirq_exit) {
    int z = 0;
    struct irq_depth_t *d = irq_depth.lookup(&z);
    if (d && d->soft > 0)
        d->soft--;
    return 0;
}
TRACEPOINT_PROBE(irq, irq_handler_entry) {
    struct irq_depth_t *d = irq_armed();
    if (d)
        d->hard++;
    return 0;
}
TRACEPOINT_PROBE(irq, softirq_entry) {
    struct irq_depth_t *d = irq_armed();
    if (d)
        d->soft++;
    return 0;
}
#ifdef HAVE_HRTIMER
// Timer interrupts (the local APIC timer) do not pass through irq_handler_entry; the hrtimer
// callbacks they run (a nanosleep's expiry, a futex timeout) are what wake sleepers from them.
TRACEPOINT_PROBE(timer, hrtimer_expire_exit) {
    int z = 0;
    struct irq_depth_t *d = irq_depth.lookup(&z);
    if (d && d->timer > 0)
        d->timer--;
    return 0;
}
TRACEPOINT_PROBE(timer, hrtimer_expire_entry) {
    struct irq_depth_t *d = irq_armed();
    if (d)
        d->timer++;
    return 0;
}
#endif

TRACEPOINT_PROBE(kmem, mm_page_alloc) {
    u64 now = bpf_ktime_get_ns();
    u64 pt = bpf_get_current_pid_tgid();
    u32 tid = (u32)pt;
    u64 bytes = PAGE_BYTES << (args->order & 31);
    count(C_PAGE_TOTAL);
    agg_add(pt >> 32, 0, AGG_NO_CPU, now, A_PAGE, bytes, C_AGG_DROP_PAGE);
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
    u64 pt = bpf_get_current_pid_tgid();
    u32 ptgid = pt >> 32;
    u32 child = args->pid;
    if (args->clone_flags & CLONE_THREAD_FLAG) {
        // A new thread of a traced process: its state now, so sched_wakeup_new starts its first wait.
        if (!traced.lookup(&ptgid))
            return 0;
        get_state(child, ptgid);
        struct proc_ev *tev = proc_reserve();
        if (!tev)
            return 0;
        tev->ts = bpf_ktime_get_ns();
        tev->kind = P_THREAD;
        tev->pid = ptgid;
        tev->tid = child;
        tev->child = 0;
        tev->exit_code = 0;
        tev->flags = 2;
        bpf_probe_read_kernel(&tev->comm, COMM_LEN, args->comm);
        tev->filename[0] = 0;
        proc_events.ringbuf_submit(tev, 0);
        return 0;
    }
    u32 flags = 0;
    if (traced.lookup(&ptgid)) {
        u8 one = 1;
        traced.update(&child, &one);
        get_state(child, child);
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

// A thread's name changed (prctl(PR_SET_NAME), a write to /proc/<tid>/comm, exec).
TRACEPOINT_PROBE(task, task_rename) {
    u64 pt = bpf_get_current_pid_tgid();
#ifdef HAVE_RENAME_PID
    u32 tid = args->pid;
#else
    u32 tid = (u32)pt;   // newer kernels dropped the field: the task renamed is current
#endif
    u32 tgid = pt >> 32;
    if (tid != (u32)pt) {
        struct tstate *st = tstate.lookup(&tid);   // renamed by another task: known if traced
        if (!st)
            return 0;
        tgid = st->tgid;
    }
    if (!traced.lookup(&tgid))
        return 0;
    struct proc_ev *ev = proc_reserve();
    if (!ev)
        return 0;
    ev->ts = bpf_ktime_get_ns();
    ev->kind = P_RENAME;
    ev->pid = tgid;
    ev->tid = tid;
    ev->child = 0;
    ev->exit_code = 0;
    ev->flags = 2;
    // the names as strings: the tracepoint's copies are not zero-padded after the NUL
    __builtin_memset(ev->comm, 0, COMM_LEN);
    __builtin_memset(ev->filename, 0, FILENAME_LEN);
    bpf_probe_read_kernel_str(&ev->comm, COMM_LEN, args->newcomm);
    bpf_probe_read_kernel_str(&ev->filename, COMM_LEN, args->oldcomm);
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
    int last = args->group_dead;
#else
    int last = tid == tgid;
#endif
    if (!last) {
        if (!traced.lookup(&tgid))
            return 0;
        struct proc_ev *tev = proc_reserve();
        if (!tev)
            return 0;
        tev->ts = bpf_ktime_get_ns();
        tev->kind = P_TEXIT;
        tev->pid = tgid;
        tev->tid = tid;
        tev->child = 0;
        tev->exit_code = 0;
        tev->flags = 2;
        bpf_get_current_comm(&tev->comm, COMM_LEN);
        tev->filename[0] = 0;
        proc_events.ringbuf_submit(tev, 0);
        return 0;
    }
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
