/* Workload for the collector tests and benchmark: calls the stand-in CUDA libraries a known number
 * of times, forks children that allocate memory, or burns a CPU (a competing "hog").
 *
 *   workload mix N SPIN_NS SLEEP_NS CHILDREN CHILD_MB   every probed op, N iterations, plus 10
 *                                                         cudaLaunchKernel from a second thread
 *   workload rate N [driver [SECONDS]]                    N back-to-back cudaLaunchKernel calls (driver:
 *                                                         cuLaunchKernel; SECONDS: for that long instead)
 *   workload pace PER_SECOND SECONDS                      cuLaunchKernel at a job's pace: PER_SECOND / 1000
 *                                                         back to back every millisecond, for SECONDS; prints
 *                                                         "calls N ns WALL paced P" (see pace() below)
 *   workload hog                                          spin forever (comm "standin-hog")
 *   workload v2 SLEEPER_CPU SPIN_CPU                      what schema v2 records (see v2() below); prints
 *                                                         "tid NAME TID", "func NAME ADDR" and "pinned ..."
 *
 * Env: WL_CPU=n pins to CPU n; WL_FIFO=1 runs SCHED_FIFO (no CFS task can preempt it);
 * WL_WAIT=1 prints "ready" and waits for a line on stdin before working; WL_MARKS=FILE (rate): the wall clock
 * every 1024 launches, written to FILE (see rate() below). */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

typedef struct { unsigned x, y, z; } dim3;
typedef unsigned long long CUdeviceptr;
typedef struct {
    unsigned gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes;
    void *hStream;
    void *attrs;
    unsigned numAttrs;
} CUlaunchConfig;

int cudaLaunchKernel(const void *, dim3, dim3, void **, size_t, void *);
int cudaMemcpy(void *, const void *, size_t, int);
int cudaMemcpyAsync(void *, const void *, size_t, int, void *);
int cudaMalloc(void **, size_t);
int cudaFree(void *);
int cudaHostAlloc(void **, size_t, unsigned);
int cudaFreeHost(void *);
int cudaHostRegister(void *, size_t, unsigned);
int cudaHostUnregister(void *);
int cuMemAllocHost_v2(void **, size_t);
int cuMemFreeHost(void *);
int cuMemcpyHtoD_v2(CUdeviceptr, const void *, size_t);
int cudaStreamSynchronize(void *);
int cudaDeviceSynchronize(void);
int cudaEventSynchronize(void *);
int cuLaunchKernel(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void *, void **, void **);
int cuLaunchKernelEx(const CUlaunchConfig *, void *, void **, void **);
int cuMemcpyHtoDAsync_v2(CUdeviceptr, const void *, size_t, void *);
int cuMemcpyDtoHAsync_v2(void *, CUdeviceptr, size_t, void *);
int cuMemcpyDtoDAsync_v2(CUdeviceptr, CUdeviceptr, size_t, void *);
int cuMemcpyAsync(CUdeviceptr, CUdeviceptr, size_t, void *);
int cuMemAlloc_v2(CUdeviceptr *, size_t);
int cuMemFree_v2(CUdeviceptr);
int cuStreamSynchronize(void *);
int cuCtxSynchronize(void);
void standin_rt_config(long, long);
void standin_drv_config(long, long);

#define S(x) ((void *)(unsigned long)(x))
#define SIDE_CALLS 10

static long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000000L + ts.tv_nsec;
}

static long wall_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return ts.tv_sec * 1000000000L + ts.tv_nsec;
}

static void setup(void) {
    const char *cpu = getenv("WL_CPU");
    if (cpu && *cpu) {
        cpu_set_t set;
        CPU_ZERO(&set);
        CPU_SET(atoi(cpu), &set);
        if (sched_setaffinity(0, sizeof(set), &set) != 0) perror("sched_setaffinity");
    }
    const char *fifo = getenv("WL_FIFO");
    if (fifo && *fifo == '1') {
        struct sched_param p = {.sched_priority = 10};
        if (sched_setscheduler(0, SCHED_FIFO, &p) != 0) perror("sched_setscheduler");
    }
    const char *wait = getenv("WL_WAIT");
    if (wait && *wait == '1') {
        printf("ready %d\n", getpid());
        fflush(stdout);
        char line[64];
        if (!fgets(line, sizeof line, stdin)) exit(3);
    }
}

static void child(int mb) {
    void *p[3];
    for (int k = 0; k < 3; k++) cudaMalloc(&p[k], 1 << 20);
    size_t n = (size_t)mb << 20;
    volatile char *mem = malloc(n);  /* volatile: the compiler must not elide the touching */
    for (size_t off = 0; mem && off < n; off += 4096) mem[off] = 7;
    for (int k = 0; k < 3; k++) cudaFree(p[k]);
    usleep(50000);
    _exit(7);
}

/* A second thread: its calls carry its own tid, and its exit must not leave kernel state behind. */
static void *side_thread(void *arg) {
    (void)arg;
    dim3 g = {1, 1, 1}, b = {32, 1, 1};
    for (int i = 0; i < SIDE_CALLS; i++) cudaLaunchKernel((void *)side_thread, g, b, NULL, 0, S(0x6000));
    return NULL;
}

static int mix(long n, long spin, long sleep_ns, int children, int child_mb) {
    standin_rt_config(spin, sleep_ns);
    standin_drv_config(spin, sleep_ns);
    static char host[16384], dev[16384];
    dim3 g = {1, 1, 1}, b = {32, 1, 1};
    for (int c = 0; c < children; c++) {
        pid_t pid = fork();
        if (pid == 0) child(child_mb);
    }
    if (n > 0) {
        pthread_t t;
        pthread_create(&t, NULL, side_thread, NULL);
        pthread_join(t, NULL);
    }
    for (long i = 0; i < n; i++) {
        cudaLaunchKernel((void *)mix, g, b, NULL, 0, S(0x1000 + i % 4));
        cudaMemcpy(dev, host, 1000 + i, (int)(i % 5));
        cudaMemcpyAsync(dev, host, 2000 + i, 1, S(0x2000));
        void *p;
        cudaMalloc(&p, 4096 * (i + 1));
        cudaFree(p);
        cudaStreamSynchronize(S(0x1000));
        cuLaunchKernel((void *)mix, 1, 1, 1, 32, 1, 1, 0, S(0x3000 + i % 2), NULL, NULL);
        CUlaunchConfig cfg = {1, 1, 1, 32, 1, 1, 0, S(0x4000), NULL, 0};
        cuLaunchKernelEx(&cfg, (void *)mix, NULL, NULL);
        cuMemcpyHtoDAsync_v2((CUdeviceptr)dev, host, 5000 + i, S(0x5000));
        cuMemcpyDtoHAsync_v2(host, (CUdeviceptr)dev, 6000 + i, S(0x5000));
        cuMemcpyDtoDAsync_v2((CUdeviceptr)dev, (CUdeviceptr)dev, 7000 + i, S(0x5000));
        cuMemcpyAsync((CUdeviceptr)dev, (CUdeviceptr)host, 8000 + i, S(0x5000));
        CUdeviceptr d;
        cuMemAlloc_v2(&d, 8192 * (i + 1));
        cuMemFree_v2(d);
        cuStreamSynchronize(S(0x3000));
        cuCtxSynchronize();
        cudaDeviceSynchronize();
        cudaEventSynchronize(NULL);
        if (i % 10 == 0) {
            void *h;
            if (cudaHostAlloc(&h, 1 << 20, 0) == 0) cudaFreeHost(h);
        }
    }
    int status, failed = 0;
    while (wait(&status) > 0)
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 7) failed = 1;
    return failed;
}

/* ---- v2: threads, wakers, CPU holders, renames, syscalls, kernel identity, pinned copies ---- */

static int tid(void) { return (int)syscall(SYS_gettid); }

static void pin(int cpu) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    if (sched_setaffinity(0, sizeof(set), &set) != 0) perror("sched_setaffinity");
}

static void say(const char *what, const char *name, long value) {
    printf("%s %s %ld\n", what, name, value);
    fflush(stdout);
}

static void spin_for(long ns) {
    long end = now_ns() + ns;
    while (now_ns() < end) {}
}

static void kernel_a(void) {}
static void kernel_b(void) {}

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static int turn = 0, done = 0;
static int sleeper_cpu = 1, spin_cpu = 0;
#define ROUNDS 20

/* Sleeps on a condition variable (futex) on a CPU kept busy by a hog: each wakeup is followed by
 * a wait for that CPU. Renamed with prctl first. */
static void *sleeper(void *arg) {
    (void)arg;
    prctl(PR_SET_NAME, "v2-sleeper");
    pin(sleeper_cpu);
    say("tid", "sleeper", tid());
    pthread_mutex_lock(&mu);
    for (int r = 1; r <= ROUNDS; r++) {
        while (turn < r) pthread_cond_wait(&cv, &mu);
    }
    done = 1;
    pthread_mutex_unlock(&mu);
    return NULL;
}

/* Wakes the sleeper every 5 ms (nanosleep between). */
static void *waker(void *arg) {
    (void)arg;
    prctl(PR_SET_NAME, "v2-waker");
    pin(spin_cpu);
    say("tid", "waker", tid());
    struct timespec ts = {0, 5000000};
    for (int r = 1; r <= ROUNDS; r++) {
        nanosleep(&ts, NULL);
        pthread_mutex_lock(&mu);
        turn = r;
        pthread_cond_signal(&cv);
        pthread_mutex_unlock(&mu);
    }
    return NULL;
}

/* Two of these, created SCHED_RR on one CPU: each preempts the other when its time slice ends
 * (100 ms), and no ordinary task of the machine can take the CPU from them in between. They start
 * spinning together: without the barrier the first could hold the CPU its creator was on, and the
 * second start only when the kernel let ordinary tasks run there again (up to ~1 s on 6.12+). */
static pthread_barrier_t spinners_ready;

static void *spinner(void *arg) {
    const char *name = arg;
    prctl(PR_SET_NAME, name);
    say("tid", name, tid());
    pthread_barrier_wait(&spinners_ready);
    spin_for(1000000000L);
    return NULL;
}

static void start_spinner(pthread_t *t, const char *name) {
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(spin_cpu, &set);
    pthread_attr_setaffinity_np(&attr, sizeof(set), &set);
    pthread_attr_setinheritsched(&attr, PTHREAD_EXPLICIT_SCHED);
    pthread_attr_setschedpolicy(&attr, SCHED_RR);
    struct sched_param p = {.sched_priority = 1};
    pthread_attr_setschedparam(&attr, &p);
    if (pthread_create(t, &attr, spinner, (void *)name) != 0) perror("pthread_create");
    pthread_attr_destroy(&attr);
}

static int v2(int s_cpu, int p_cpu) {
    sleeper_cpu = s_cpu;
    spin_cpu = p_cpu;
    standin_rt_config(0, 0);
    standin_drv_config(0, 0);
    prctl(PR_SET_NAME, "v2-main");  /* the main thread's name is the process's */
    say("tid", "main", tid());
    /* kernel identity: two kernels, launched through the runtime and the driver */
    say("func", "a", (long)(unsigned long)kernel_a);
    say("func", "b", (long)(unsigned long)kernel_b);
    dim3 g = {1, 1, 1}, b = {32, 1, 1};
    for (int i = 0; i < 3; i++) cudaLaunchKernel((void *)kernel_a, g, b, NULL, 0, S(0x7000));
    for (int i = 0; i < 3; i++) cudaLaunchKernel((void *)kernel_b, g, b, NULL, 0, S(0x7000));
    for (int i = 0; i < 2; i++) cuLaunchKernel((void *)kernel_a, 1, 1, 1, 32, 1, 1, 0, S(0x7000), NULL, NULL);
    CUlaunchConfig cfg = {1, 1, 1, 32, 1, 1, 0, S(0x7000), NULL, 0};
    for (int i = 0; i < 2; i++) cuLaunchKernelEx(&cfg, (void *)kernel_b, NULL, NULL);
    /* pinned copies, told apart by their sizes: 101, 102, 104, 106 pinned; 103, 105 not */
    static char dev[4096];
    void *h, *p2;
    char *m = malloc(1 << 20);
    cudaHostAlloc(&h, 1 << 20, 0);
    cudaMemcpy(dev, (char *)h + 100, 101, 1);
    cudaMemcpy((char *)h + 200, dev, 102, 2);
    cudaMemcpy(dev, m, 103, 1);
    cudaHostRegister(m, 1 << 20, 0);
    cudaMemcpy(dev, m + 8, 104, 1);
    cudaHostUnregister(m);
    cudaMemcpy(dev, m, 105, 1);
    cudaFreeHost(h);
    cuMemAllocHost_v2(&p2, 4096);
    cuMemcpyHtoD_v2((CUdeviceptr)dev, p2, 106);
    cuMemFreeHost(p2);
    /* a woken thread waiting for a busy CPU; new threads; renames; futex and nanosleep */
    pthread_t t1, t2, t3, t4;
    pthread_create(&t1, NULL, sleeper, NULL);
    usleep(20000);
    pthread_create(&t2, NULL, waker, NULL);
    pthread_join(t2, NULL);
    pthread_join(t1, NULL);
    /* two threads on one CPU */
    pthread_barrier_init(&spinners_ready, NULL, 2);
    start_spinner(&t3, "v2-spin1");
    start_spinner(&t4, "v2-spin2");
    pthread_join(t3, NULL);
    pthread_join(t4, NULL);
    return done ? 0 : 1;
}

/* N back-to-back launches through the runtime (cudaLaunchKernel) or, with `driver`, the driver (cuLaunchKernel,
 * the symbol PyTorch's runtime launches enter); with SECONDS > 0, as many as fit in that many seconds, printing
 * the count done. Prints "calls N ns WALL". */
static int rate(long n, int driver, double seconds) {
    standin_rt_config(0, 0);
    standin_drv_config(0, 0);
    dim3 g = {1, 1, 1}, b = {32, 1, 1};
    long t0 = now_ns(), end = t0 + (long)(seconds * 1e9), i = 0;
    /* WL_MARKS=FILE: the wall clock (CLOCK_REALTIME, the store's clock) read after launches 0, 1024, 2048, ...,
     * written there at the end, one a line: exactly 1024 launches begin between two marks. */
    const char *marks_path = getenv("WL_MARKS");
    long *marks = NULL, n_marks = 0, cap = 0;
    for (; seconds > 0 || i < n; i++) {
        if (driver)
            cuLaunchKernel((void *)rate, 1, 1, 1, 32, 1, 1, 0, S(i & 3), NULL, NULL);
        else
            cudaLaunchKernel((void *)rate, g, b, NULL, 0, S(i & 3));
        if ((i & 1023) == 0) {
            if (marks_path) {
                if (n_marks == cap && !(marks = realloc(marks, (cap = cap ? 2 * cap : 4096) * sizeof *marks)))
                    return 1;
                marks[n_marks++] = wall_ns();
            }
            if (seconds > 0 && now_ns() >= end)
                break;
        }
    }
    long t1 = now_ns();
    if (marks_path) {
        FILE *f = fopen(marks_path, "w");
        for (long k = 0; f && k < n_marks; k++)
            fprintf(f, "%ld\n", marks[k]);
        if (!f || fclose(f) != 0)
            return 1;
    }
    printf("calls %ld ns %ld\n", seconds > 0 ? i + 1 : n, t1 - t0);
    return 0;
}

/* cuLaunchKernel at PER_SECOND a second, in a burst every millisecond (a job's pace: the collector records as many
 * calls as from a real loop, without the calls' process being the one timed), for SECONDS. A burst that starts late
 * (the process was preempted) follows the one before at once, to catch up. Prints "calls N ns WALL paced P": P
 * bursts began 0.5 ms or more after the one before (as this process's clock saw them), the rest caught up. */
static int pace(long per_second, double seconds) {
    standin_drv_config(0, 0);
    long per_ms = per_second / 1000 > 0 ? per_second / 1000 : 1, done = 0, paced = 0, last = -1;
    long t0 = now_ns(), end = t0 + (long)(seconds * 1e9), next = t0;
    while (now_ns() < end) {
        long burst = now_ns();
        if (last >= 0 && burst - last >= 500000)
            paced++;
        last = burst;
        for (long k = 0; k < per_ms; k++, done++)
            cuLaunchKernel((void *)pace, 1, 1, 1, 32, 1, 1, 0, S(done & 3), NULL, NULL);
        next += 1000000;
        struct timespec ts = {next / 1000000000L, next % 1000000000L};
        clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL);
    }
    printf("calls %ld ns %ld paced %ld\n", done, now_ns() - t0, paced);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: workload mix|rate|pace|hog ...\n");
        return 2;
    }
    if (strcmp(argv[1], "hog") == 0) {
        prctl(PR_SET_NAME, "standin-hog");
        setup();
        volatile unsigned long x = 0;
        for (;;) x++;
    }
    setup();
    if (strcmp(argv[1], "mix") == 0 && argc >= 7)
        return mix(atol(argv[2]), atol(argv[3]), atol(argv[4]), atoi(argv[5]), atoi(argv[6]));
    if (strcmp(argv[1], "v2") == 0 && argc >= 4)
        return v2(atoi(argv[2]), atoi(argv[3]));
    if (strcmp(argv[1], "rate") == 0 && argc >= 3)
        return rate(atol(argv[2]), argc >= 4 && strcmp(argv[3], "driver") == 0, argc >= 5 ? atof(argv[4]) : 0);
    if (strcmp(argv[1], "pace") == 0 && argc >= 4)
        return pace(atol(argv[2]), atof(argv[3]));
    fprintf(stderr, "bad arguments\n");
    return 2;
}
