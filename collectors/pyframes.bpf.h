// Python frames from the interpreter's own state (BCC C, pasted into ingero.bpf.c in place of
// `#include "pyframes.bpf.h"`; it needs only BCC's helpers and defines everything else it uses).
//
// CPython is built without frame pointers, so a native unwind stops at _PyEval_EvalFrameDefault.
// Instead, as eBPF profilers do, py_stack() walks the interpreter's frame chain in the thread's
// user memory: PyThreadState -> current frame -> previous -> ..., reading each frame's code object.
// Userspace (collector/pyframes.py) writes, per traced CPython process, the address of _PyRuntime
// and the struct offsets of its version (3.11, 3.12, 3.13) into `py_procs`.
//
// Maps:
//  - py_procs:   tgid -> struct py_cfg (runtime address + offsets); absent: not a walkable CPython.
//  - py_tstates: tid -> the thread's PyThreadState* (0: none found, retried after a back-off that starts at
//                PY_MISS_RETRY_MIN_NS and doubles per miss, PY_MISS_RETRY_MAX_SHIFT times at most: a new
//                thread that switched out before CPython stored its native id is named within milliseconds,
//                and a native thread with no state costs a walk a second), so the list walk runs once per
//                thread, not at every switch.
//  - py_stacks:  stack id -> the code-object pointers of the stack, innermost first.
//  - py_codes:   (tgid, code pointer) -> function name (co_qualname), file
//                (co_filename) and co_firstlineno (the line of the `def`, not the line executing).
//                Stored once per code object: strings are copied raw (latin-1 / UCS-2 / UCS-4 units,
//                `kind` bytes each) and decoded in userspace, so non-ASCII names are exact unless cut:
//                a name keeps its first PY_NAME_LEN bytes, a file its last PY_FILE_LEN bytes.
//                A code object freed and another allocated at the same address keeps the first name.
//  - py_counters: per-CPU counts (PYC_*), so misses are seen, not silent.
// A stack keeps its innermost PY_MAX_FRAMES frames read, entry (shim) frames of 3.12+ included as
// PY_SHIM slots; deeper frames are not read (flag `truncated`), and the id hashes only the slots
// kept, so two stacks differing only deeper than that share an id.
// Memory (hash maps are preallocated; memlock measured): py_codes 7.9 MB, py_stacks 5.5 MB, py_tstates
// 3.1 MB, py_procs 0.5 MB.

#ifndef PY_MAX_FRAMES
#define PY_MAX_FRAMES 32
#endif
#ifndef PY_MAX_THREADS
#define PY_MAX_THREADS 128      // thread states looked at per lookup (the list is newest first)
#endif
#ifndef PY_STACK_ENTRIES
#define PY_STACK_ENTRIES 16384
#endif
#ifndef PY_CODE_ENTRIES
#define PY_CODE_ENTRIES 16384
#endif
#define PY_NAME_LEN 128
#define PY_FILE_LEN 256
#define PY_FRAME_WIN 72         // bytes read per frame: code, previous and owner lie within them (3.11-3.13)
#define PY_TS_WIN 128           // bytes read from a cached thread state: its frame pointer and native tid
#define PY_MISS_RETRY_MIN_NS 1000000ULL     // 1 ms
#define PY_MISS_RETRY_MAX_SHIFT 10          // 1 ms << 10: ~1 s
#define PY_NO_OFF 0xffff
#define PY_SHIM 1               // the slot of an entry frame (0: no frame)
#define PY_OWNED_BY_CSTACK 3    // 3.12+: an entry (shim) frame of the C stack, not Python code

#define PYC_CALLS 0             // py_stack calls for a configured process
#define PYC_NO_TSTATE 1         // the thread has no PyThreadState (or it could not be read)
#define PYC_NO_FRAME 2          // a thread state but no frame (idle thread, or a read fault)
#define PYC_STACK_FULL 3        // py_stacks full: the id was returned but its frames were not stored
#define PYC_CODE_FULL 4         // py_codes full or a code object's strings unreadable
#define PYC_TRUNCATED 5         // stacks cut at PY_MAX_FRAMES
#define PYC_WALKS 6             // thread-state list walks (cache misses)
#define PYC_N 8

struct py_cfg {
    u64 runtime;         // address of _PyRuntime in the process
    u16 interp_head;     // _PyRuntimeState.interpreters.head
    u16 threads_head;    // PyInterpreterState.threads.head
    u16 ts_next;         // PyThreadState.next
    u16 ts_tid;          // PyThreadState.native_thread_id
    u16 ts_frame;        // PyThreadState.cframe (3.11, 3.12) or .current_frame (3.13)
    u16 ts_win;          // start of the PY_TS_WIN window read from a thread state (<= ts_frame, ts_tid)
    u16 cframe_frame;    // _PyCFrame.current_frame; PY_NO_OFF: ts_frame points at the frame itself
    u16 f_code;          // _PyInterpreterFrame.f_code / f_executable
    u16 f_previous;      // _PyInterpreterFrame.previous
    u16 f_owner;         // _PyInterpreterFrame.owner; PY_NO_OFF: no C-stack entry frames (3.11)
    u16 co_name;         // PyCodeObject.co_qualname (3.11+)
    u16 co_filename;
    u16 co_firstlineno;
    u16 str_ascii;       // data offset of a compact ASCII str (sizeof(PyASCIIObject))
    u16 str_compact;     // data offset of a compact non-ASCII str (sizeof(PyCompactUnicodeObject))
    u16 pad;
    u64 ns_dev;          // the process's PID namespace (nsfs dev, inode) when it is not the host's: its
    u64 ns_ino;          // thread states hold the namespace's thread ids; 0: the host's
};

struct py_tstate_v {
    u64 tstate;          // PyThreadState*, 0: none found
    u64 miss_ts;         // when none was found (retried after the back-off)
    u32 tgid;            // the process the tid belonged to (tids are reused)
    u32 misses;          // walks in a row that found no state (the back-off's exponent)
};

struct py_stack_v {
    u32 tgid;
    u16 depth;
    u8 truncated;
    u8 pad;
    u64 code[PY_MAX_FRAMES];
};

struct py_code_key {
    u32 tgid;
    u32 pad;
    u64 code;
};

struct py_code_v {
    s32 firstlineno;
    u16 name_len;        // bytes stored in name
    u16 file_len;
    u8 name_kind;        // 1: latin-1 (ASCII), 2: UCS-2, 4: UCS-4; 0: unreadable
    u8 file_kind;
    u8 name_cut;         // the name was longer: its head is kept
    u8 file_cut;         // the file was longer: its tail is kept
    char name[PY_NAME_LEN];
    char file[PY_FILE_LEN];
};

struct py_scratch_t {
    u8 win[PY_TS_WIN];
    struct py_stack_v st;
    struct py_code_v code;
};

BPF_HASH(py_procs, u32, struct py_cfg, 4096);
BPF_TABLE("lru_hash", u32, struct py_tstate_v, py_tstates, 32768);
BPF_HASH(py_stacks, u64, struct py_stack_v, PY_STACK_ENTRIES);
BPF_HASH(py_codes, struct py_code_key, struct py_code_v, PY_CODE_ENTRIES);
BPF_PERCPU_ARRAY(py_scratch, struct py_scratch_t, 1);
BPF_PERCPU_ARRAY(py_counters, u64, PYC_N);

static __always_inline void py_count(int idx) {
    u64 *c = py_counters.lookup(&idx);
    if (c)
        (*c)++;
}

static __always_inline u64 py_read_ptr(u64 addr) {
    u64 v = 0;
    if (bpf_probe_read_user(&v, sizeof(v), (void *)addr) != 0)
        return 0;
    return v;
}

// A u64 at a config offset inside a window read into the scratch (the offset is checked, so the
// verifier knows the access stays inside the buffer).
static __always_inline u64 py_win_u64(u8 *win, u32 off, u32 size) {
    u64 v = 0;
    if (off > size - 8)
        return 0;
    __builtin_memcpy(&v, win + off, 8);
    return v;
}

// The PyThreadState whose native_thread_id is tid (in the process's PID namespace): walk
// _PyRuntime.interpreters.head -> threads.head -> next (the newest interpreter only, the main one
// unless subinterpreters exist). Works for threads not holding the GIL.
static __always_inline u64 py_find_tstate(struct py_cfg *cfg, u32 tid) {
    py_count(PYC_WALKS);
    u64 interp = py_read_ptr(cfg->runtime + cfg->interp_head);
    if (!interp)
        return 0;
    u64 ts = py_read_ptr(interp + cfg->threads_head);
    for (int i = 0; i < PY_MAX_THREADS; i++) {
        if (!ts)
            return 0;
        u64 ntid = py_read_ptr(ts + cfg->ts_tid);
        if ((u32)ntid == tid && (ntid >> 32) == 0)
            return ts;
        ts = py_read_ptr(ts + cfg->ts_next);
    }
    return 0;
}

// The thread's PyThreadState*, from the per-tid cache (checked against the tid it names: a cached
// state whose thread has gone, its tid reused, is looked up again).
static __always_inline u64 py_thread_state(struct py_cfg *cfg, u32 tgid, u32 tid, u32 ntid_want, u8 *win,
                                           u64 *frame_ptr) {
    struct py_tstate_v *c = py_tstates.lookup(&tid);
    u64 now = 0;
    u32 misses = 0;
    if (c && c->tgid == tgid) {
        if (!c->tstate) {
            now = bpf_ktime_get_ns();
            misses = c->misses;
            u32 shift = misses < PY_MISS_RETRY_MAX_SHIFT ? misses : PY_MISS_RETRY_MAX_SHIFT;
            if (now - c->miss_ts < (PY_MISS_RETRY_MIN_NS << shift))
                return 0;
        } else if (bpf_probe_read_user(win, PY_TS_WIN, (void *)(c->tstate + cfg->ts_win)) == 0) {
            u64 ntid = py_win_u64(win, (u32)cfg->ts_tid - cfg->ts_win, PY_TS_WIN);
            if (ntid == ntid_want) {
                *frame_ptr = py_win_u64(win, (u32)cfg->ts_frame - cfg->ts_win, PY_TS_WIN);
                return c->tstate;
            }
        }
    }
    struct py_tstate_v v = {};
    v.tgid = tgid;
    v.tstate = py_find_tstate(cfg, ntid_want);
    if (!v.tstate) {
        v.miss_ts = now ? now : bpf_ktime_get_ns();
        v.misses = misses + 1;
    }
    py_tstates.update(&tid, &v);
    if (v.tstate)
        *frame_ptr = py_read_ptr(v.tstate + cfg->ts_frame);
    return v.tstate;
}

// Copy a compact str object's characters (raw code units) into dst; returns the bytes stored.
// `tail`: a longer string keeps its last `max` bytes (file paths), else its first (names).
static __always_inline u32 py_read_str(struct py_cfg *cfg, u64 obj, char *dst, u32 max, u8 *kind, u8 *cut,
                                       int tail) {
    struct {
        s64 length;
        s64 hash;
        u32 state;
        u32 pad;
    } h = {};
    *kind = 0;
    *cut = 0;
    if (!obj || bpf_probe_read_user(&h, sizeof(h), (void *)(obj + 16)) != 0)
        return 0;
    u32 k = (h.state >> 2) & 7;
    u32 compact = (h.state >> 5) & 1;
    u32 ascii = (h.state >> 6) & 1;
    if (!compact || (k != 1 && k != 2 && k != 4) || h.length < 0 || h.length > 0x100000)
        return 0;
    u64 data = obj + (ascii ? cfg->str_ascii : cfg->str_compact);
    u64 bytes = (u64)h.length * k;
    u32 n = bytes;
    if (bytes > max) {
        *cut = 1;
        n = max;
        if (tail)
            data += bytes - max;
    }
    if (n > max)
        n = max;
    if (n && bpf_probe_read_user(dst, n, (void *)data) != 0)
        return 0;
    *kind = k;
    return n;
}

// Store a code object's name, file and first line once per (process, code object).
static __always_inline void py_store_code(struct py_cfg *cfg, u32 tgid, u64 code, struct py_code_v *cv) {
    struct py_code_key key = {};
    key.tgid = tgid;
    key.code = code;
    if (py_codes.lookup(&key))
        return;
    s32 line = 0;
    bpf_probe_read_user(&line, sizeof(line), (void *)(code + cfg->co_firstlineno));
    cv->firstlineno = line;
    cv->name_len = py_read_str(cfg, py_read_ptr(code + cfg->co_name), cv->name, PY_NAME_LEN, &cv->name_kind,
                               &cv->name_cut, 0);
    cv->file_len = py_read_str(cfg, py_read_ptr(code + cfg->co_filename), cv->file, PY_FILE_LEN, &cv->file_kind,
                               &cv->file_cut, 1);
    if (!cv->name_kind || (py_codes.insert(&key, cv) != 0 && !py_codes.lookup(&key)))   // not lost to a race
        py_count(PYC_CODE_FULL);
}

// The id of the Python stack of thread `tid` of process `tgid` (the current task: its user memory is
// read), or 0: not a configured CPython, no thread state, or no frame read. Innermost first.
static __always_inline u64 py_stack(u32 tgid, u32 tid) {
    struct py_cfg *cfg = py_procs.lookup(&tgid);
    if (!cfg)
        return 0;
    int z = 0;
    struct py_scratch_t *sc = py_scratch.lookup(&z);
    if (!sc)
        return 0;
    py_count(PYC_CALLS);
    u32 ntid = tid;   // the id CPython stored: the thread's id in the process's own PID namespace
    if (cfg->ns_ino) {
        struct bpf_pidns_info ns = {};   // left 0 if the helper fails: no thread state matches 0
        bpf_get_ns_current_pid_tgid(cfg->ns_dev, cfg->ns_ino, &ns, sizeof(ns));
        ntid = ns.pid;
    }
    u64 fp = 0;
    u64 ts = py_thread_state(cfg, tgid, tid, ntid, sc->win, &fp);
    if (!ts) {
        py_count(PYC_NO_TSTATE);
        return 0;
    }
    if (fp && cfg->cframe_frame != PY_NO_OFF)
        fp = py_read_ptr(fp + cfg->cframe_frame);
    // Offsets bounded once, outside the loop; the loop body has no branch that makes paths differ
    // (a slot per frame read, PY_SHIM for an entry frame), so the verifier walks it once per iteration.
    u32 oc = cfg->f_code, op = cfg->f_previous, oo = cfg->f_owner;
    if (oc > PY_FRAME_WIN - 8 || op > PY_FRAME_WIN - 8)
        return 0;
    u32 shim = oo < PY_FRAME_WIN ? PY_OWNED_BY_CSTACK : 0x100;   // 0x100: no byte matches (no owner field)
    oo &= PY_TS_WIN - 1;
    u64 h = 0x9E3779B97F4A7C15ULL ^ tgid;
    u32 depth = 0;
    for (int i = 0; i < PY_MAX_FRAMES; i++) {
        // no early exit: an exit per depth would make the verifier check what follows once per depth
        u64 code = 0;
        if (fp) {
            if (bpf_probe_read_user(sc->win, PY_FRAME_WIN, (void *)fp) == 0) {
                code = *(u64 *)(sc->win + oc);
                if ((u32)sc->win[oo] == shim)
                    code = PY_SHIM;
                fp = *(u64 *)(sc->win + op);
                depth++;
            } else {
                fp = 0;
            }
        }
        sc->st.code[i & (PY_MAX_FRAMES - 1)] = code;
        h = (h ^ code) * 0xff51afd7ed558ccdULL;
        h ^= h >> 33;
    }
    // depth goes through the map value and back: a value the verifier does not track, so the code
    // below is checked once, not once per depth (a branch on a known constant makes it exact)
    sc->st.depth = depth;
    if (!sc->st.depth) {
        py_count(PYC_NO_FRAME);
        return 0;
    }
    // frames left unread: the stack is deeper than PY_MAX_FRAMES slots (entry frames take slots too)
    sc->st.truncated = fp != 0;
    if (fp)
        py_count(PYC_TRUNCATED);
    if (!h)
        h = 1;
    if (!py_stacks.lookup(&h)) {
        // a stack not seen before: store it, and its code objects' names (once per code object)
        sc->st.tgid = tgid;
        for (int i = 0; i < PY_MAX_FRAMES; i++) {
            u64 code = sc->st.code[i & (PY_MAX_FRAMES - 1)];
            if (code > PY_SHIM)
                py_store_code(cfg, tgid, code, &sc->code);
        }
        if (py_stacks.insert(&h, &sc->st) != 0 && !py_stacks.lookup(&h))
            py_count(PYC_STACK_FULL);
    }
    return h;
}
