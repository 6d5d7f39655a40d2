/* Stand-in libcudart.so.13: the real runtime API symbol names and signatures, each call taking a
 * controlled time. Copies go through the stand-in libcuda like the real runtime's do, so nested
 * runtime -> driver calls are exercised; launches, allocations and syncs stay in the runtime.
 * Built with -DSTANDIN_NO_DRIVER it has no libcuda beneath it at all (copies stay in it too): a
 * runtime whose calls no driver symbol sees. */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include "standin.h"

typedef int cudaError_t;
typedef struct { unsigned x, y, z; } dim3;
typedef void *cudaStream_t;
typedef void *cudaEvent_t;
typedef unsigned long long CUdeviceptr;
typedef void *CUstream;
enum cudaMemcpyKind { cudaMemcpyHostToHost = 0, cudaMemcpyHostToDevice = 1, cudaMemcpyDeviceToHost = 2,
                      cudaMemcpyDeviceToDevice = 3, cudaMemcpyDefault = 4 };

#ifndef STANDIN_NO_DRIVER
int cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n);
int cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n);
int cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, size_t n);
int cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t n);
#endif

static long spin_ns = 0, sleep_ns = 0;

void standin_rt_config(long spin, long sleep) { spin_ns = spin; sleep_ns = sleep; }

cudaError_t cudaLaunchKernel(const void *func, dim3 grid, dim3 block, void **args, size_t shared,
                             cudaStream_t stream) {
    (void)func; (void)grid; (void)block; (void)args; (void)shared; (void)stream;
    standin_spin(spin_ns);
    return 0;
}

static cudaError_t copy(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind) {
    standin_spin(spin_ns);
#ifdef STANDIN_NO_DRIVER
    (void)dst; (void)src; (void)n; (void)kind;
    return 0;
#else
    switch (kind) {
    case cudaMemcpyHostToDevice: return cuMemcpyHtoD_v2((CUdeviceptr)dst, src, n);
    case cudaMemcpyDeviceToHost: return cuMemcpyDtoH_v2(dst, (CUdeviceptr)src, n);
    case cudaMemcpyDeviceToDevice: return cuMemcpyDtoD_v2((CUdeviceptr)dst, (CUdeviceptr)src, n);
    case cudaMemcpyDefault: return cuMemcpy((CUdeviceptr)dst, (CUdeviceptr)src, n);
    default: return 0;
    }
#endif
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind) {
    return copy(dst, src, n, kind);
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind, cudaStream_t s) {
    (void)s;
    return copy(dst, src, n, kind);
}

static unsigned long long next_dev = 0x7f0000000000ULL;

cudaError_t cudaMalloc(void **ptr, size_t size) {
    standin_spin(spin_ns);
    if (!ptr) return 1;
    *ptr = (void *)next_dev;
    next_dev += (size + 0xfff) & ~0xfffULL;
    return 0;
}

cudaError_t cudaFree(void *ptr) { (void)ptr; standin_spin(spin_ns); return 0; }

/* Pinned host memory is allocated and touched, so the call allocates pages. */
cudaError_t cudaHostAlloc(void **ptr, size_t size, unsigned flags) {
    (void)flags;
    void *p = malloc(size);
    if (!p) return 2;
    memset(p, 1, size);
    *ptr = p;
    return 0;
}

cudaError_t cudaFreeHost(void *ptr) { free(ptr); return 0; }
cudaError_t cudaMallocHost(void **ptr, size_t size) { return cudaHostAlloc(ptr, size, 0); }
/* Registering pins an existing range; the stand-in only has to accept the call. */
cudaError_t cudaHostRegister(void *ptr, size_t size, unsigned flags) { (void)size; (void)flags; return ptr ? 0 : 1; }
cudaError_t cudaHostUnregister(void *ptr) { return ptr ? 0 : 1; }

cudaError_t cudaStreamSynchronize(cudaStream_t s) { (void)s; standin_sleep(sleep_ns); return 0; }
cudaError_t cudaDeviceSynchronize(void) { standin_sleep(sleep_ns); return 0; }
/* A NULL event is an invalid handle, as in the real runtime: the error code must be recorded. */
cudaError_t cudaEventSynchronize(cudaEvent_t e) { standin_sleep(sleep_ns); return e ? 0 : 400; }
