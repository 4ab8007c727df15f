/* stream_probe.cu: how an SM must issue its loads to stream a read-only
 * buffer at the DRAM rate, the question behind the GEMM's main loop (every
 * weight byte read once, in contiguous runs per thread block).
 *
 * Each kernel gives thread block b one contiguous range of the buffer, as a
 * GEMM gives a block its weight rows, and reads it with one discipline:
 *   reg U      each thread keeps U 16-byte loads in flight in registers,
 *              the next U requested before the current U are used (the
 *              GEMM's scheme today, U = 8 at 16 rows);
 *   cp.async   a ring of STAGES shared-memory stages of SB bytes filled by
 *              cp.async.cg (16 bytes per thread per copy), STAGES - 1 ahead;
 *   bulk       the same ring filled by one thread with cp.async.bulk (the
 *              TMA's 1-D copy) completing on an mbarrier per stage.
 * A stage or a load is "used" by xor-ing it into a register, so the time is
 * the stream's. Prints GB/s (bytes read / kernel time, median of 7 after a
 * warm-up) for a 1 GiB buffer and for the sizes of the drafter's and the
 * 8B target's matrices, with 1-4 blocks per SM, and the driver's
 * device-to-device copy (bytes read + written) for reference.
 *
 * A measurement tool, not part of the library: built by nvcc on the GPU
 * machine (tools/gpu-test.sh, GPU_TEST_PROBE=1), runtime API. */
#include <cstdint>

#include "probe.cuh"

#define THREADS 256

/* Block b reads bytes [b * per, (b + 1) * per); per is a multiple of
 * THREADS * 16 * U. */
template <int U> __global__ void __launch_bounds__(THREADS) k_reg(const char *buf, size_t per, unsigned *sink)
{
    const char *p = buf + blockIdx.x * per + threadIdx.x * 16;
    const size_t step = (size_t)THREADS * 16 * U, n = per / step;
    unsigned acc = 0;
    uint4 cur[U], nxt[U];
#pragma unroll
    for (int u = 0; u < U; u++)
        cur[u] = ld_stream(p + u * THREADS * 16);
    for (size_t i = 0; i < n; i++) {
        const bool more = i + 1 < n;
#pragma unroll
        for (int u = 0; u < U; u++)
            nxt[u] = more ? ld_stream(p + (i + 1) * step + u * THREADS * 16) : make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int u = 0; u < U; u++)
            acc ^= fold(cur[u]);
#pragma unroll
        for (int u = 0; u < U; u++)
            cur[u] = nxt[u];
    }
    if (acc == 0x9e3779b9u)
        *sink = acc;
}

/* cp.async ring: stage s of the block's range goes to ring slot s % STAGES. */
template <int STAGES> __global__ void __launch_bounds__(THREADS) k_cpasync(const char *buf, size_t per, int sb,
                                                                           unsigned *sink)
{
    extern __shared__ __align__(128) char ring[];
    const char *base = buf + blockIdx.x * per;
    const int n = (int)(per / sb), copies = sb / (THREADS * 16);
    auto issue = [&](int s) {
        if (s < n)
            for (int c = 0; c < copies; c++) {
                const int off = (c * THREADS + threadIdx.x) * 16;
                asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem_u32(ring + (s % STAGES) * sb + off)),
                             "l"(base + (size_t)s * sb + off));
            }
        asm volatile("cp.async.commit_group;");
    };
    for (int s = 0; s < STAGES - 1; s++)
        issue(s);
    unsigned acc = 0;
    for (int s = 0; s < n; s++) {
        issue(s + STAGES - 1);
        asm volatile("cp.async.wait_group %0;" ::"n"(STAGES - 1));
        __syncthreads();
        for (int c = 0; c < copies; c++)
            acc ^= fold(*(const uint4 *)(ring + (s % STAGES) * sb + (c * THREADS + threadIdx.x) * 16));
        __syncthreads();
    }
    if (acc == 0x9e3779b9u)
        *sink = acc;
}

/* Bulk-copy ring: thread 0 asks the copy engine for whole stages; each
 * stage's mbarrier completes when its bytes have landed. */
template <int STAGES> __global__ void __launch_bounds__(THREADS) k_bulk(const char *buf, size_t per, int sb,
                                                                        unsigned *sink)
{
    extern __shared__ __align__(128) char ring[];
    __shared__ __align__(8) unsigned long long bar[STAGES];
    const char *base = buf + blockIdx.x * per;
    const int n = (int)(per / sb), copies = sb / (THREADS * 16);
    if (threadIdx.x == 0) {
        for (int i = 0; i < STAGES; i++)
            asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_u32(&bar[i])));
        asm volatile("fence.mbarrier_init.release.cluster;");
    }
    __syncthreads();
    auto issue = [&](int s) {
        if (threadIdx.x == 0 && s < n) {
            const unsigned b = smem_u32(&bar[s % STAGES]);
            asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(b), "r"(sb));
            asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                             smem_u32(ring + (s % STAGES) * sb)),
                         "l"(base + (size_t)s * sb), "r"(sb), "r"(b)
                         : "memory");
        }
    };
    for (int s = 0; s < STAGES; s++)
        issue(s);
    unsigned acc = 0;
    for (int s = 0; s < n; s++) {
        const unsigned b = smem_u32(&bar[s % STAGES]), phase = (s / STAGES) & 1;
        mbar_wait(b, phase);
        for (int c = 0; c < copies; c++)
            acc ^= fold(*(const uint4 *)(ring + (s % STAGES) * sb + (c * THREADS + threadIdx.x) * 16));
        __syncthreads(); /* every thread is done with the slot before it is refilled */
        issue(s + STAGES);
    }
    if (acc == 0x9e3779b9u)
        *sink = acc;
}

typedef void (*launch_fn)(int grid, int smem, const char *buf, size_t per, int sb, unsigned *sink);

template <int U> static void run_reg(int g, int, const char *b, size_t per, int, unsigned *s)
{
    k_reg<U><<<g, THREADS>>>(b, per, s);
}
template <int ST> static void run_cp(int g, int smem, const char *b, size_t per, int sb, unsigned *s)
{
    k_cpasync<ST><<<g, THREADS, smem>>>(b, per, sb, s);
}
template <int ST> static void run_bulk(int g, int smem, const char *b, size_t per, int sb, unsigned *s)
{
    k_bulk<ST><<<g, THREADS, smem>>>(b, per, sb, s);
}

struct variant {
    const char *name;
    launch_fn fn;
    const void *kernel;
    int stages, sb; /* ring: stages x stage bytes (0 for reg) */
    int unit;       /* bytes a block reads per step */
};

int main(void)
{
    int dev = 0, sms = 0;
    CK(cudaSetDevice(dev));
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, dev));
    const size_t big = (size_t)1 << 30;
    char *buf, *dst;
    unsigned *sink;
    CK(cudaMalloc(&buf, big));
    CK(cudaMalloc(&dst, big));
    CK(cudaMalloc(&sink, 4));
    CK(cudaMemset(buf, 1, big));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));

    std::vector<float> t;
    for (int r = 0; r < 8; r++) {
        CK(cudaEventRecord(e0));
        CK(cudaMemcpy(dst, buf, big, cudaMemcpyDeviceToDevice));
        CK(cudaEventRecord(e1));
        CK(cudaEventSynchronize(e1));
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        if (r)
            t.push_back(ms);
    }
    printf("stream_probe: %s, %d SMs; driver copy of 1 GiB: %.0f GB/s (read + written)\n", prop.name, sms,
           2.0 * big / (median(t) * 1e6));

    const variant vs[] = {
        { "reg U=2", run_reg<2>, (const void *)k_reg<2>, 0, 0, THREADS * 16 * 2 },
        { "reg U=4", run_reg<4>, (const void *)k_reg<4>, 0, 0, THREADS * 16 * 4 },
        { "reg U=8", run_reg<8>, (const void *)k_reg<8>, 0, 0, THREADS * 16 * 8 },
        { "reg U=16", run_reg<16>, (const void *)k_reg<16>, 0, 0, THREADS * 16 * 16 },
        { "cp.async 2 x 16K", run_cp<2>, (const void *)k_cpasync<2>, 2, 16384, 16384 },
        { "cp.async 4 x 16K", run_cp<4>, (const void *)k_cpasync<4>, 4, 16384, 16384 },
        { "cp.async 4 x 32K", run_cp<4>, (const void *)k_cpasync<4>, 4, 32768, 32768 },
        { "cp.async 8 x 16K", run_cp<8>, (const void *)k_cpasync<8>, 8, 16384, 16384 },
        { "bulk 2 x 32K", run_bulk<2>, (const void *)k_bulk<2>, 2, 32768, 32768 },
        { "bulk 4 x 16K", run_bulk<4>, (const void *)k_bulk<4>, 4, 16384, 16384 },
        { "bulk 4 x 32K", run_bulk<4>, (const void *)k_bulk<4>, 4, 32768, 32768 },
        { "bulk 3 x 64K", run_bulk<3>, (const void *)k_bulk<3>, 3, 65536, 65536 },
    };
    /* the buffer sizes: 1 GiB; the LM head (622 MB); an 8B layer's gate/up
     * (201 MB) and q/k/v (50 MB); the seed drafter's q/k/v (21 MB) and o (17 MB) */
    const size_t sizes[] = { big, 622u << 20, 201u << 20, 50u << 20, 21u << 20, 17u << 20 };
    printf("%-18s %4s %9s %10s", "discipline", "bps", "KB/SM", "smem/blk");
    for (size_t z : sizes)
        printf(" %8zuMB", z >> 20);
    printf("   (GB/s read)\n");
    for (const variant &v : vs) {
        const int smem = v.stages * v.sb;
        if (smem > 48 * 1024)
            CK(cudaFuncSetAttribute(v.kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
        for (int bps = 1; bps <= 4; bps *= 2) {
            int fit = 0;
            CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&fit, v.kernel, THREADS, smem));
            if (fit < bps)
                continue;
            const int grid = sms * bps;
            /* bytes in flight per SM: reg keeps U..2U loads per thread, a ring STAGES - 1 stages */
            const double kb = v.stages ? bps * (v.stages - 1) * v.sb / 1024.0 : bps * 2.0 * v.unit / 1024.0;
            printf("%-18s %4d %9.0f %10d", v.name, bps, kb, smem);
            for (size_t z : sizes) {
                size_t per = z / grid / v.unit * v.unit;
                if (per == 0) {
                    printf(" %10s", "-");
                    continue;
                }
                std::vector<float> ts;
                for (int r = 0; r < 8; r++) {
                    CK(cudaEventRecord(e0));
                    v.fn(grid, smem, buf, per, v.sb, sink);
                    CK(cudaEventRecord(e1));
                    CK(cudaEventSynchronize(e1));
                    CK(cudaGetLastError());
                    float ms;
                    CK(cudaEventElapsedTime(&ms, e0, e1));
                    if (r)
                        ts.push_back(ms);
                }
                printf(" %10.0f", (double)per * grid / (median(ts) * 1e6));
            }
            printf("\n");
        }
    }
    return 0;
}
