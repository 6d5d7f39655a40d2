/* Workload for the collector tests and benchmark: calls the stand-in CUDA libraries a known number
 * of times, forks children that allocate memory, or burns a CPU (a competing "hog").
 *
 *   workload mix N SPIN_NS SLEEP_NS CHILDREN CHILD_MB   every probed op, N iterations, plus 10
 *                                                         cudaLaunchKernel from a second thread
 *   workload rate N                                       N back-to-back cudaLaunchKernel calls
 *   workload hog                                          spin forever (comm "standin-hog")
 *
 * Env: WL_CPU=n pins to CPU n; WL_FIFO=1 runs SCHED_FIFO (no CFS task can preempt it);
 * WL_WAIT=1 prints "ready" and waits for a line on stdin before working. */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
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

static int rate(long n) {
    standin_rt_config(0, 0);
    dim3 g = {1, 1, 1}, b = {32, 1, 1};
    long t0 = now_ns();
    for (long i = 0; i < n; i++) cudaLaunchKernel((void *)rate, g, b, NULL, 0, S(i & 3));
    long t1 = now_ns();
    printf("calls %ld ns %ld\n", n, t1 - t0);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: workload mix|rate|hog ...\n");
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
    if (strcmp(argv[1], "rate") == 0 && argc >= 3)
        return rate(atol(argv[2]));
    fprintf(stderr, "bad arguments\n");
    return 2;
}
