/* probe.cuh: what the GPU probes (stream_probe.cu, handoff_probe.cu,
 * layer_probe.cu) share: the check of a runtime call, the median of
 * samples, the load and use of a streamed 16-byte vector, and the wait on
 * a shared-memory mbarrier. Measurement tools built by nvcc on the GPU
 * machine, not part of the library. */
#ifndef DFLASH_TOOLS_CUDA_PROBE_CUH
#define DFLASH_TOOLS_CUDA_PROBE_CUH

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include <cuda_runtime.h>

/* a failed runtime call ends the probe, naming the call and its line */
#define CK(x)                                                                                  \
    do {                                                                                       \
        cudaError_t e_ = (x);                                                                  \
        if (e_ != cudaSuccess) {                                                               \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
            exit(1);                                                                           \
        }                                                                                      \
    } while (0)

static inline float median(std::vector<float> v)
{
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

/* 16 bytes of a read-once stream: not kept in L1, L2 asked for 256 bytes */
__device__ __forceinline__ uint4 ld_stream(const void *p)
{
    uint4 r;
    asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "l"(p));
    return r;
}

/* A loaded vector used (xor-ed into a word). volatile, so it stays after
 * the loads issued before it in the source (the compiler would otherwise
 * use a value first and request the next ones after it, halving what is
 * in flight). */
__device__ __forceinline__ unsigned fold(uint4 v)
{
    unsigned r;
    asm volatile("{ .reg .b32 t; xor.b32 t, %1, %2; xor.b32 t, t, %3; xor.b32 %0, t, %4; }"
                 : "=r"(r)
                 : "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w));
    return r;
}

__device__ __forceinline__ unsigned smem_u32(const void *p) { return (unsigned)__cvta_generic_to_shared(p); }

/* until the mbarrier at shared address bar completes the phase of this parity */
__device__ __forceinline__ void mbar_wait(unsigned bar, unsigned parity)
{
    unsigned done = 0;
    while (!done)
        asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                     : "=r"(done)
                     : "r"(bar), "r"(parity)
                     : "memory");
}

#endif
