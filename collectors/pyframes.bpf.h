// STUB until the Python walker (wt-pyframes) lands: no CPython thread is known, no Python stack is read.
// The real file defines its maps and py_stack(tgid, tid): 0 if the thread is not a known CPython thread or no frame
// could be read, else a nonzero id of the Python stack (innermost first) stored in a BPF hash map.
// ingero.bpf.c includes it textually: the loader puts this text in place of its #include line.
static __always_inline u64 py_stack(u32 tgid, u32 tid) {
    return 0;
}
