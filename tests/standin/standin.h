/* Shared by the stand-in CUDA libraries: a controlled amount of CPU work (preemptible, so CPU
 * contention shows up as preempted time) and of sleep (blocked time), set by the workload. */
#ifndef STANDIN_H
#define STANDIN_H
#include <time.h>

static inline long standin_thread_cpu_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec * 1000000000L + ts.tv_nsec;
}

/* Burn `ns` of this thread's CPU time: wall time grows when the thread is preempted. */
static inline void standin_spin(long ns) {
    if (ns <= 0)
        return;
    long end = standin_thread_cpu_ns() + ns;
    while (standin_thread_cpu_ns() < end) {
    }
}

static inline void standin_sleep(long ns) {
    if (ns <= 0)
        return;
    struct timespec ts = {ns / 1000000000L, ns % 1000000000L};
    while (nanosleep(&ts, &ts) != 0) {
    }
}
#endif
