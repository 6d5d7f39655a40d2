/* Stand-in libcuda.so.1: the real driver API symbol names (versioned _v2 where the driver exports
 * them) and signatures, each call taking a controlled time. */
#include <stddef.h>
#include <stdlib.h>
#include "standin.h"

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef void *CUfunction;
typedef void *CUstream;
typedef struct CUlaunchConfig_st {
    unsigned gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes;
    CUstream hStream;
    void *attrs;
    unsigned numAttrs;
} CUlaunchConfig;

static long spin_ns = 0, sleep_ns = 0;

void standin_drv_config(long spin, long sleep) { spin_ns = spin; sleep_ns = sleep; }

CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                        unsigned bz, unsigned shared, CUstream stream, void **params, void **extra) {
    (void)f; (void)gx; (void)gy; (void)gz; (void)bx; (void)by; (void)bz; (void)shared; (void)stream;
    (void)params; (void)extra;
    standin_spin(spin_ns);
    return 0;
}

CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **params, void **extra) {
    (void)config; (void)f; (void)params; (void)extra;
    standin_spin(spin_ns);
    return 0;
}

CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n) { (void)dst; (void)src; (void)n; standin_spin(spin_ns); return 0; }
CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n) { (void)dst; (void)src; (void)n; standin_spin(spin_ns); return 0; }
CUresult cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, size_t n) { (void)dst; (void)src; (void)n; standin_spin(spin_ns); return 0; }
CUresult cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t n) { (void)dst; (void)src; (void)n; standin_spin(spin_ns); return 0; }
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n, CUstream s) { (void)dst; (void)src; (void)n; (void)s; standin_spin(spin_ns); return 0; }
CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t n, CUstream s) { (void)dst; (void)src; (void)n; (void)s; standin_spin(spin_ns); return 0; }
CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s) { (void)dst; (void)src; (void)n; (void)s; standin_spin(spin_ns); return 0; }
CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s) { (void)dst; (void)src; (void)n; (void)s; standin_spin(spin_ns); return 0; }

static CUdeviceptr next_dev = 0x7e0000000000ULL;

CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t size) {
    standin_spin(spin_ns);
    if (!p) return 1;
    *p = next_dev;
    next_dev += (size + 0xfff) & ~0xfffULL;
    return 0;
}

CUresult cuMemFree_v2(CUdeviceptr p) { (void)p; standin_spin(spin_ns); return 0; }
CUresult cuStreamSynchronize(CUstream s) { (void)s; standin_sleep(sleep_ns); return 0; }
CUresult cuCtxSynchronize(void) { standin_sleep(sleep_ns); return 0; }

CUresult cuMemAllocHost_v2(void **pp, size_t size) { *pp = malloc(size); return *pp ? 0 : 2; }
CUresult cuMemFreeHost(void *p) { free(p); return 0; }
CUresult cuMemHostRegister_v2(void *p, size_t size, unsigned flags) { (void)size; (void)flags; return p ? 0 : 1; }
CUresult cuMemHostUnregister(void *p) { return p ? 0 : 1; }
