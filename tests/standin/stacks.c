/* A stand-in training loop whose functions have known names, built with frame pointers
 * (-fno-omit-frame-pointer): the collector's user stacks must name them.
 *
 *   stacks STEPS    STEPS x train_step_standin: build_batch_standin (on CPU, ~10 ms), a cudaLaunchKernel,
 *                   and every 4th step write_checkpoint_standin (write + fsync, then a 5 ms nanosleep: asleep)
 *
 * Prints "ready" and waits for a line on stdin before working (as workload does with WL_WAIT=1). */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

typedef struct { unsigned x, y, z; } dim3;
int cudaLaunchKernel(const void *, dim3, dim3, void **, size_t, void *);

static long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000000L + ts.tv_nsec;
}

/* noinline and a use of the result: each keeps its own frame, so the walk passes through it */
__attribute__((noinline)) unsigned long build_batch_standin(long ns) {
    volatile unsigned long x = 0;
    long end = now_ns() + ns;
    while (now_ns() < end)
        for (int i = 0; i < 1000; i++)
            x += i;
    return x;
}

/* the blocking calls go through this helper: a frame-pointer walk from inside libc (no frame of its own)
 * starts at the helper's frame, so the caller named in the test is the one above it */
__attribute__((noinline)) int sync_file_standin(int fd, long sleep_ns) {
    int rc = fsync(fd);
    struct timespec ts = {0, sleep_ns};
    nanosleep(&ts, NULL);
    return rc;
}

__attribute__((noinline)) int write_checkpoint_standin(int fd, int step) {
    char buf[4096];
    for (size_t i = 0; i < sizeof(buf); i++)
        buf[i] = (char)(step + i);
    if (pwrite(fd, buf, sizeof(buf), 0) != (ssize_t)sizeof(buf))
        return -1;
    return sync_file_standin(fd, 5000000L);
}

__attribute__((noinline)) int train_step_standin(int step, int fd) {
    unsigned long x = build_batch_standin(10000000L);
    dim3 one = {1, 1, 1};
    int rc = cudaLaunchKernel((const void *)train_step_standin, one, one, NULL, 0, NULL);
    if (step % 4 == 3)
        rc |= write_checkpoint_standin(fd, step);
    return rc + (int)(x & 0);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: stacks STEPS\n");
        return 2;
    }
    char path[] = "/tmp/standin-ckpt-XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0)
        return 1;
    unlink(path);
    printf("ready\n");
    fflush(stdout);
    char line[16];
    if (!fgets(line, sizeof(line), stdin))
        return 1;
    int steps = atoi(argv[1]), rc = 0;
    for (int s = 0; s < steps; s++)
        rc |= train_step_standin(s, fd);
    close(fd);
    printf("steps %d\n", steps);
    return rc != 0;
}
