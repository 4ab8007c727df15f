/* layer_probe.cu: can a layer's weights stream while its dependent chain
 * (attention, norms, hand-offs) runs, the question behind a persistent
 * layer kernel.
 *
 * A forward today costs about its chain with empty GEMM loops plus its
 * weights at the copy rate (docs/perf-notes.md, "What a forward costs
 * without its GEMMs' bytes or loops"): the GEMM loops stream at the copy
 * rate, and nothing streams while the rest runs. This probe plays a
 * layer's shape with no arithmetic: four weight streams (q/k/v, o,
 * gate/up, down of bf16) between phases that read nothing and only take
 * time (attention with its merge, the two norms), a call's layers over
 * distinct weights, at the seed drafter's geometry (16 rows) and at
 * Qwen3-8B's (decode), these ways:
 *
 *   kernels   a kernel per phase, chained by programmatic dependent launch
 *             in one CUDA graph (the backend's way: every kernel lets the
 *             next launch as it starts): a stream kernel's blocks, two an
 *             SM, each hold 16 KB of loads in registers and request the
 *             next 16 KB before using them (the GEMM's chunk at one row),
 *             the first before the dependency wait; a time phase is a
 *             kernel that waits for its input, then spins. The attention
 *             phase's kernel takes a whole SM a block (its shared memory),
 *             as the real one does with its registers (a GEMM block needs
 *             32 K of them, more than attention leaves), so no stream
 *             block sits beside it.
 *   k+L2 N    the same, each time phase's blocks first asking L2 for the
 *             next streams' first N MB (bulk prefetches after the wait,
 *             less what an earlier phase asked for): DRAM fills L2 while
 *             the chain runs, and the next stream kernels read L2.
 *   ring      one kernel for all layers, a block per SM: a producer warp
 *             copies the block's share of every stream, phase after phase,
 *             into a ring of 10 16 KB shared-memory slots (bulk copies
 *             completing on mbarriers) while 8 consumer warps play the
 *             phases in order, each phase ended by a grid barrier (a
 *             counter and a generation word). "ah" (ahead): the producer
 *             runs as far ahead as the ring allows, through the time
 *             phases and barriers; "in" (in step): it starts a phase's
 *             copies only once the consumers have entered that phase (the
 *             same kernel without the overlap); "+L2": ahead, and asking
 *             L2 for its next chunks up to 32 MB over the SMs beyond the
 *             ring. Its shared memory keeps a second block off an SM. Its
 *             time phases need nothing beside the ring, where a real
 *             attention phase would need its registers and shared memory
 *             too: what this way gains is an upper bound.
 *
 * Prints us per layer for each way, beside the layer's bytes at the copy
 * rate of the same run and the time phases' nominal sum; with the time
 * phases at the backend's measured lengths, at zero (streams and
 * hand-offs alone), and without the streams (the chain alone, as each way
 * runs it). First, what a prefetch does alone: 16-48 MB read cold, read
 * after a kernel asked L2 for them (bulk or a line at a time; that
 * kernel's time beside it) and read right after a read. Each timed call
 * follows a 50 us spin on the same stream, so the events time the GPU's
 * work, not the launch's submission.
 *
 * A measurement tool, not part of the library: built by nvcc on the GPU
 * machine (tools/gpu-test.sh, GPU_TEST_PROBE=1 or =layer), runtime API. */
#include <cstdint>

#include "probe.cuh"

#define THREADS 256        /* a stream kernel's block; the layer kernel's consumers */
#define SLOT 16384         /* a ring slot, and a stream kernel block's chunk (THREADS x 4 x 16 B) */
#define UNIT 4096          /* a block's share is a multiple of this (THREADS x 16 B) */
#define MAX_PHASES 64
#define ATT_SMEM (227 * 1024) /* the attention stand-in's shared memory: the SM's whole (no other block fits) */

enum { PH_STREAM, PH_TIME };

struct phase {
    int kind;
    long long off;    /* PH_STREAM: the weights' offset in the buffer */
    long long per;    /* PH_STREAM: bytes a block reads (a multiple of UNIT) */
    long long len;    /* PH_STREAM: the matrix's bytes */
    long long ns;     /* PH_TIME: how long it takes */
    int blocks;       /* kernels way, PH_TIME: its grid */
    long long pf_off; /* kernels way, PH_TIME: bytes it asks L2 for, after its wait */
    long long pf_len;
};

struct plan {
    phase ph[MAX_PHASES];
    int n;
};

__device__ __forceinline__ unsigned long long now_ns()
{
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

__device__ __forceinline__ void spin_ns(long long ns)
{
    const unsigned long long t0 = now_ns();
    while ((long long)(now_ns() - t0) < ns)
        ;
}

/* a ring smaller than this would let a second block onto an SM */
#define LAYER_SMEM_MIN (120 * 1024)

__device__ __forceinline__ void pdl_trigger() { asm volatile("griddepcontrol.launch_dependents;"); }
__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }

/* kernels way: block b reads [off + b per, + per) in 16-byte loads, four a
 * thread in flight and four more requested before those are used (the
 * GEMM's register chunk at one row), the first four before the wait. */
__global__ void __launch_bounds__(THREADS) k_stream(const char *buf, long long off, long long per, unsigned *sink)
{
    extern __shared__ char unused[]; /* a stream block cannot sit beside the attention stand-in */
    const char *p = buf + off + blockIdx.x * per + threadIdx.x * 16;
    const long long loads = per / UNIT; /* 16-byte loads per thread */
    unsigned acc = 0;
    uint4 cur[4], nxt[4];
    pdl_trigger();
#pragma unroll
    for (int u = 0; u < 4; u++)
        cur[u] = u < loads ? ld_stream(p + (long long)u * UNIT) : make_uint4(0, 0, 0, 0);
    pdl_wait();
    for (long long i = 0; i < loads; i += 4) {
#pragma unroll
        for (int u = 0; u < 4; u++)
            nxt[u] = i + 4 + u < loads ? ld_stream(p + (i + 4 + u) * UNIT) : make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int u = 0; u < 4; u++)
            acc ^= fold(cur[u]);
#pragma unroll
        for (int u = 0; u < 4; u++)
            cur[u] = nxt[u];
    }
    if (acc == 0x9e3779b9u + (unsigned)unused[0])
        *sink = acc;
}

/* the work a timed call follows, so that its start event fires late */
__global__ void k_idle(long long ns) { spin_ns(ns); }

/* Asks L2 for [p, + bytes): one bulk prefetch (the copy engine's), or
 * (line) a prefetch instruction a 128-byte line (the load path's). */
__device__ __forceinline__ void prefetch_l2(const char *p, unsigned bytes, int line)
{
    if (!line) {
        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(bytes) : "memory");
        return;
    }
    for (unsigned o = 0; o < bytes; o += 128)
        asm volatile("prefetch.global.L2 [%0];" ::"l"(p + o) : "memory");
}

/* A time phase; with pf_len, its blocks first ask L2 for [pf, + pf_len)
 * in SLOT requests spread over them (what a latency-bound kernel such as
 * attention could do for the next GEMMs' weights while DRAM idles). */
__global__ void __launch_bounds__(THREADS) k_time(long long ns, unsigned *sink, const char *pf, long long pf_len,
                                                  int line)
{
    extern __shared__ char held[];
    pdl_trigger();
    pdl_wait();
    for (long long o = ((long long)blockIdx.x * THREADS + threadIdx.x) * SLOT; o < pf_len;
         o += (long long)gridDim.x * THREADS * SLOT)
        prefetch_l2(pf + o, (unsigned)(pf_len - o < SLOT ? pf_len - o : SLOT), line);
    spin_ns(ns);
    if (threadIdx.x == 0 && ns < 0)
        *sink = (unsigned)held[0];
}

__device__ __forceinline__ unsigned ld_acquire(const unsigned *p)
{
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ void st_release(unsigned *p, unsigned v)
{
    asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

/* Every block's thread 0: bar[0] counts arrivals, bar[GEN] is the
 * generation the last arrival moves on (after resetting the count); 128
 * bytes apart, so the polling does not share a sector with the atomics. */
#define GEN 32
__device__ void grid_barrier(unsigned *bar, unsigned blocks)
{
    const unsigned gen = ld_acquire(&bar[GEN]);
    __threadfence();
    if (atomicAdd(&bar[0], 1u) == blocks - 1) {
        atomicExch(&bar[0], 0u);
        st_release(&bar[GEN], gen + 1);
    } else {
        while (ld_acquire(&bar[GEN]) == gen)
            ;
    }
}

/* layer way: warps 0..7 consume, warp 8's lane 0 produces. full[s]
 * completes when slot s's bytes have landed (one arrival with the byte
 * count, then the copy's bytes); empty[s] when the 8 consumer warps are
 * done with it. Use k of slot s (chunk idx = k R + s) completes phase k of
 * both, so waits go by the parity of k. */
template <int R>
__global__ void __launch_bounds__(THREADS + 32, 1) k_layer(const char *buf, plan pl, int ahead, int la, int line,
                                                           unsigned *bar, unsigned *sink)
{
    extern __shared__ __align__(128) char ring[];
    __shared__ __align__(8) unsigned long long full[R], empty[R];
    __shared__ volatile int entered; /* the phase the consumers are in */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (threadIdx.x == 0) {
        for (int i = 0; i < R; i++) {
            asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_u32(&full[i])));
            asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(&empty[i])), "r"(THREADS / 32));
        }
        asm volatile("fence.mbarrier_init.release.cluster;");
        entered = 0;
    }
    __syncthreads();

    if (warp == THREADS / 32) {
        if (lane != 0)
            return;
        /* la > 0: a second cursor asks L2 for the block's chunks up to la
         * beyond the ring, so a full ring does not leave DRAM idle */
        int pp = 0;
        long long pc = 0, pidx = 0;
        auto prefetch_to = [&](long long upto) {
            while (pidx < upto && pp < pl.n) {
                const phase &q = pl.ph[pp];
                if (q.kind != PH_STREAM || pc * SLOT >= q.per) {
                    pp++;
                    pc = 0;
                    continue;
                }
                prefetch_l2(buf + q.off + blockIdx.x * q.per + pc * SLOT,
                            (unsigned)(q.per - pc * SLOT < SLOT ? q.per - pc * SLOT : SLOT), line);
                pc++;
                pidx++;
            }
        };
        long long idx = 0;
        for (int p = 0; p < pl.n; p++) {
            const phase &ph = pl.ph[p];
            if (ph.kind != PH_STREAM)
                continue;
            if (!ahead)
                while (entered < p)
                    __nanosleep(32);
            const char *src = buf + ph.off + blockIdx.x * ph.per;
            for (long long c = 0; c * SLOT < ph.per; c++, idx++) {
                const int s = (int)(idx % R);
                if (la > 0)
                    prefetch_to(idx + R + la);
                if (idx >= R)
                    mbar_wait(smem_u32(&empty[s]), (unsigned)((idx / R - 1) & 1));
                const unsigned bytes = (unsigned)(ph.per - c * SLOT < SLOT ? ph.per - c * SLOT : SLOT);
                const unsigned f = smem_u32(&full[s]);
                asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(f), "r"(bytes) : "memory");
                asm volatile(
                    "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                        smem_u32(ring + (size_t)s * SLOT)),
                    "l"(__cvta_generic_to_global(src + c * SLOT)), "r"(bytes), "r"(f)
                    : "memory");
            }
        }
        return;
    }

    unsigned acc = 0;
    long long idx = 0;
    for (int p = 0; p < pl.n; p++) {
        const phase &ph = pl.ph[p];
        if (threadIdx.x == 0)
            entered = p;
        if (ph.kind == PH_STREAM) {
            for (long long c = 0; c * SLOT < ph.per; c++, idx++) {
                const int s = (int)(idx % R);
                mbar_wait(smem_u32(&full[s]), (unsigned)((idx / R) & 1));
                const long long bytes = ph.per - c * SLOT < SLOT ? ph.per - c * SLOT : SLOT;
                for (long long o = threadIdx.x * 16; o < bytes; o += THREADS * 16)
                    acc ^= fold(*(const uint4 *)(ring + (size_t)s * SLOT + o));
                __syncwarp();
                if (lane == 0)
                    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_u32(&empty[s])) : "memory");
            }
        } else {
            spin_ns(ph.ns);
        }
        asm volatile("bar.sync 1, %0;" ::"n"(THREADS) : "memory");
        if (threadIdx.x == 0)
            grid_barrier(bar, gridDim.x);
        asm volatile("bar.sync 1, %0;" ::"n"(THREADS) : "memory");
    }
    if (acc == 0x9e3779b9u)
        *sink = acc;
}

/* A layer's shape: its four weight streams (q/k/v, o, gate/up, down) and
 * its time phases, as measured in the backend's kernel trace (docs/
 * perf-notes.md): q/k norm + RoPE, attention and its merge as one; the
 * add + RMSNorm after the o and after the down projection. */
struct geometry {
    const char *name;
    long long mats[4];
    double att_us, norm1_us, norm2_us;
    int layers; /* a call's, over distinct weights */
};

/* The geometry's phases (without the streams: `streams` 0, time phases
 * scaled by `times`); a stream's share per block for bps blocks an SM: an
 * SM's share is a multiple of 2 UNIT, so both ways read the same bytes
 * (what the shares add up to). */
static plan layer_plan(const geometry &g, int bps, int sms, double times, int streams, long long *bytes_read)
{
    plan pl;
    pl.n = 0;
    long long off = 0, total = 0;
    auto stream = [&](long long bytes) {
        phase ph = {};
        ph.kind = PH_STREAM;
        ph.off = off;
        ph.per = bytes / sms / (2 * UNIT) * (2 * UNIT) / bps;
        ph.len = bytes;
        if (streams)
            pl.ph[pl.n++] = ph;
        off += bytes;
        total += streams ? ph.per * bps * sms : 0;
    };
    auto timed = [&](double us, int blocks) {
        phase ph = {};
        ph.kind = PH_TIME;
        ph.ns = (long long)(us * times * 1000.0);
        ph.blocks = blocks;
        pl.ph[pl.n++] = ph;
    };
    for (int l = 0; l < g.layers; l++) {
        stream(g.mats[0]);
        timed(g.att_us, sms); /* q/k norm + RoPE, attention, merge */
        stream(g.mats[1]);
        timed(g.norm1_us, 16); /* add + RMSNorm: two clusters of 8 blocks */
        stream(g.mats[2]);
        stream(g.mats[3]);
        timed(g.norm2_us, 16);
    }
    *bytes_read = total;
    return pl;
}

/* Kernels way: each time phase asks L2 for the weights from the next
 * stream's start up to `cap` bytes beyond it, less what an earlier phase
 * already asked for (L2 holds ~50 MB). */
static plan with_prefetch(plan pl, long long cap)
{
    long long asked = 0;
    for (int p = 0; p < pl.n; p++) {
        phase &ph = pl.ph[p];
        if (ph.kind != PH_TIME || cap <= 0)
            continue;
        int q = p + 1;
        while (q < pl.n && pl.ph[q].kind != PH_STREAM)
            q++;
        if (q == pl.n)
            continue;
        long long end = pl.ph[q].off + cap, last = 0;
        for (int r = q; r < pl.n; r++)
            if (pl.ph[r].kind == PH_STREAM)
                last = pl.ph[r].off + pl.ph[r].len;
        end = end < last ? end : last;
        const long long from = pl.ph[q].off > asked ? pl.ph[q].off : asked;
        if (end > from) {
            ph.pf_off = from;
            ph.pf_len = end - from;
            asked = end;
        }
    }
    return pl;
}

static void launch_pdl(cudaStream_t st, const void *fn, int grid, int smem, void **args)
{
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.gridDim = dim3(grid);
    cfg.blockDim = dim3(THREADS);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = st;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    CK(cudaLaunchKernelExC(&cfg, fn, args));
}

/* us one launch takes, after a 50 us spin on the stream */
template <typename F> static float time_launch(F launch, cudaStream_t st, cudaEvent_t e0, cudaEvent_t e1)
{
    k_idle<<<1, 32, 0, st>>>(50000);
    CK(cudaEventRecord(e0, st));
    launch();
    CK(cudaEventRecord(e1, st));
    CK(cudaEventSynchronize(e1));
    CK(cudaGetLastError());
    float ms;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    return ms * 1000.0f;
}

/* us a call takes: the median of 10 after 3 (each after the spin) */
template <typename F> static float median_of_calls(F launch, cudaStream_t st, cudaEvent_t e0, cudaEvent_t e1)
{
    std::vector<float> ts;
    for (int r = 0; r < 13; r++) {
        const float us = time_launch(launch, st, e0, e1);
        if (r >= 3)
            ts.push_back(us);
    }
    return median(ts);
}

/* us per replay of the kernels way: one graph of every phase's kernel */
static float run_kernels(const char *buf, const plan &pl, int grid, int line, unsigned *sink, cudaStream_t st,
                         cudaEvent_t e0, cudaEvent_t e1)
{
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    for (int p = 0; p < pl.n; p++) {
        const phase &ph = pl.ph[p];
        if (ph.kind == PH_STREAM) {
            long long off = ph.off, per = ph.per;
            void *args[] = { (void *)&buf, &off, &per, &sink };
            launch_pdl(st, (const void *)k_stream, grid, 1024, args);
        } else {
            long long ns = ph.ns, pf_len = ph.pf_len;
            const char *pf = buf + ph.pf_off;
            void *args[] = { &ns, &sink, &pf, &pf_len, &line };
            launch_pdl(st, (const void *)k_time, ph.blocks, ph.blocks >= grid / 2 ? ATT_SMEM : 0, args);
        }
    }
    CK(cudaStreamEndCapture(st, &g));
    CK(cudaGraphInstantiate(&ge, g, 0));
    const float us = median_of_calls([&] { CK(cudaGraphLaunch(ge, st)); }, st, e0, e1);
    CK(cudaGraphExecDestroy(ge));
    CK(cudaGraphDestroy(g));
    return us;
}

template <int R>
static float run_layer(const char *buf, const plan &pl, int sms, int ahead, int la, int line, unsigned *bar,
                       unsigned *sink, cudaStream_t st, cudaEvent_t e0, cudaEvent_t e1)
{
    const int smem = R * SLOT > LAYER_SMEM_MIN ? R * SLOT : LAYER_SMEM_MIN;
    CK(cudaFuncSetAttribute((const void *)k_layer<R>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    plan p = pl;
    void *args[] = { (void *)&buf, &p, &ahead, &la, &line, &bar, &sink };
    return median_of_calls(
        [&] {
            CK(cudaLaunchCooperativeKernel((const void *)k_layer<R>, dim3(sms), dim3(THREADS + 32), args, smem, st));
        },
        st, e0, e1);
}


/* What a prefetch alone does: X MB read by the stream kernel cold (after
 * 256 MB of other reads), the same after a kernel asked L2 for them (bulk
 * or a line at a time; that kernel's own time beside it), and read a
 * second time right after a first read (L2 as warm as it gets). */
static void prefetch_alone(const char *buf, long long region, int sms, unsigned *sink, cudaStream_t st, cudaEvent_t e0,
                           cudaEvent_t e1)
{
    const long long MB = 1000000, flush = 256 * MB;
    printf("L2 prefetch alone (median of 10, us): MB, read cold, bulk prefetch, read after it, line prefetch, read "
           "after it, read warm\n");
    for (long long x : { 16 * MB, 32 * MB, 48 * MB }) {
        const long long per = x / (2 * sms) / UNIT * UNIT, fper = flush / (2 * sms) / UNIT * UNIT, zero = 0;
        auto read = [&](long long off, long long pr) { k_stream<<<2 * sms, THREADS, 1024, st>>>(buf, off, pr, sink); };
        auto pf = [&](int line) { k_time<<<sms, THREADS, 0, st>>>(zero, sink, buf + region, 2 * sms * per, line); };
        std::vector<float> cold, pb, rb, pl, rl, warm;
        for (int r = 0; r < 10; r++) {
            read(0, fper);
            cold.push_back(time_launch([&] { read(region, per); }, st, e0, e1));
            read(0, fper);
            pb.push_back(time_launch([&] { pf(0); }, st, e0, e1));
            rb.push_back(time_launch([&] { read(region, per); }, st, e0, e1));
            read(0, fper);
            pl.push_back(time_launch([&] { pf(1); }, st, e0, e1));
            rl.push_back(time_launch([&] { read(region, per); }, st, e0, e1));
            read(0, fper);
            read(region, per);
            warm.push_back(time_launch([&] { read(region, per); }, st, e0, e1));
        }
        printf("%4lld %10.1f %10.1f %10.1f %10.1f %10.1f %10.1f\n", x / MB, median(cold), median(pb), median(rb),
               median(pl), median(rl), median(warm));
    }
}

int main()
{
    /* the time phases: the advances of the backend's kernel trace (seed
     * propose: q/k norm + RoPE 1.7, attention 12.0, merge 3.7, the norms
     * 2.6 and 3.2; Qwen3-8B decode: 5.9, 9.9, 4.5, norms 4.9 and 4.5) */
    static const geometry geoms[] = {
        { "seed drafter layer (16 rows)",
          { 5120LL * 2048 * 2, 2048LL * 4096 * 2, 2LL * 6144 * 2048 * 2, 2048LL * 6144 * 2 },
          17.4, 2.6, 3.2, 8 },
        { "Qwen3-8B layer (decode)",
          { 6144LL * 4096 * 2, 4096LL * 4096 * 2, 2LL * 12288 * 4096 * 2, 4096LL * 12288 * 2 },
          20.3, 4.9, 4.5, 4 },
    };
    int dev = 0, sms = 0;
    CK(cudaSetDevice(dev));
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, dev));
    const size_t size = (size_t)2 << 30, copy = (size_t)1 << 30; /* 4 layers of 385 MB; 8 of 113 */
    char *buf, *dst;
    unsigned *sink, *bar;
    CK(cudaMalloc(&buf, size));
    CK(cudaMalloc(&dst, copy));
    CK(cudaMalloc(&sink, 4));
    CK(cudaMalloc(&bar, 256));
    CK(cudaMemset(buf, 1, size));
    CK(cudaMemset(bar, 0, 256));
    CK(cudaDeviceSynchronize());
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    CK(cudaFuncSetAttribute((const void *)k_time, cudaFuncAttributeMaxDynamicSharedMemorySize, ATT_SMEM));
    /* one carveout for every kernel, so no SM changes its split of shared
     * memory and L1 between two of them */
    CK(cudaFuncSetAttribute((const void *)k_time, cudaFuncAttributePreferredSharedMemoryCarveout, 100));
    CK(cudaFuncSetAttribute((const void *)k_stream, cudaFuncAttributePreferredSharedMemoryCarveout, 100));
    CK(cudaFuncSetAttribute((const void *)k_layer<10>, cudaFuncAttributePreferredSharedMemoryCarveout, 100));

    std::vector<float> t;
    for (int r = 0; r < 8; r++) {
        CK(cudaEventRecord(e0, st));
        CK(cudaMemcpyAsync(dst, buf, copy, cudaMemcpyDeviceToDevice, st));
        CK(cudaEventRecord(e1, st));
        CK(cudaEventSynchronize(e1));
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        if (r)
            t.push_back(ms);
    }
    const double copy_gbs = 2.0 * copy / (median(t) * 1e6);
    const long long MB = 1000000;
    const int la = (int)(32 * MB / sms / SLOT); /* the ring's L2 look-ahead: 32 MB over the SMs */
    printf("layer_probe: %s, %d SMs, L2 %.1f MB; driver copy of 1 GiB: %.0f GB/s (read + written)\n", prop.name, sms,
           prop.l2CacheSize / 1e6, copy_gbs);
    prefetch_alone(buf, size - 64 * MB, sms, sink, st, e0, e1);
    printf("median of 10 calls after 3, us a layer\n");
    for (const geometry &g : geoms) {
        printf("%s: streams q/k/v %.1f, o %.1f, gate/up %.1f, down %.1f MB; %d layers a call\n", g.name,
               g.mats[0] / 1e6, g.mats[1] / 1e6, g.mats[2] / 1e6, g.mats[3] / 1e6, g.layers);
        printf("%-6s %-7s %7s %7s %8s %8s %8s %8s %8s %8s %8s %8s %8s\n", "times", "streams", "bytes", "times",
               "kernels", "k+b 32", "k+l 16", "k+l 32", "k+l 48", "ring in", "ring ah", "ring+b", "ring+l");
        /* the measured time phases with the streams; no time phases; no streams */
        const struct {
            double times;
            int streams;
        } rows[] = { { 1.0, 1 }, { 0.0, 1 }, { 1.0, 0 } };
        for (const auto &row : rows) {
            long long rd_k = 0, rd_l = 0;
            const plan pk = layer_plan(g, 2, sms, row.times, row.streams, &rd_k);
            const plan pl = layer_plan(g, 1, sms, row.times, row.streams, &rd_l);
            const double bytes_us = (double)rd_l / g.layers / (copy_gbs * 1e3),
                         times_us = (g.att_us + g.norm1_us + g.norm2_us) * row.times;
            const float k = run_kernels(buf, pk, 2 * sms, 0, sink, st, e0, e1) / g.layers;
            const float kb = run_kernels(buf, with_prefetch(pk, 32 * MB), 2 * sms, 0, sink, st, e0, e1) / g.layers;
            float kl[3];
            for (int c = 0; c < 3; c++)
                kl[c] = run_kernels(buf, with_prefetch(pk, 16 * MB * (c + 1)), 2 * sms, 1, sink, st, e0, e1) /
                        g.layers;
            const float li = run_layer<10>(buf, pl, sms, 0, 0, 0, bar, sink, st, e0, e1) / g.layers;
            const float la0 = run_layer<10>(buf, pl, sms, 1, 0, 0, bar, sink, st, e0, e1) / g.layers;
            const float lb = run_layer<10>(buf, pl, sms, 1, la, 0, bar, sink, st, e0, e1) / g.layers;
            const float ll = run_layer<10>(buf, pl, sms, 1, la, 1, bar, sink, st, e0, e1) / g.layers;
            printf("%-6.0f %-7s %7.1f %7.1f %8.1f %8.1f %8.1f %8.1f %8.1f %8.1f %8.1f %8.1f %8.1f\n", row.times,
                   row.streams ? "yes" : "no", bytes_us, times_us, k, kb, kl[0], kl[1], kl[2], li, la0, lb, ll);
            if (rd_k != rd_l)
                printf("  (the ways read %lld and %lld bytes: a bug)\n", rd_k, rd_l);
        }
    }
    printf("bytes: a layer's streams at the copy rate (read + written, as the floors); times: the time phases'\n"
           "nominal sum (times 0: none, the streams and hand-offs alone; streams no: the chain alone); kernels: a\n"
           "kernel a phase (PDL, one graph); k+b N / k+l N: the same, each time phase asking L2 for the next\n"
           "streams' first N MB (b: bulk prefetches, l: a prefetch instruction a line); ring in / ah: one kernel,\n"
           "a ring of 10 x 16 KB, copies in step with the phases / ahead through them; ring+b / +l: ahead, and\n"
           "asking L2 for each block's next 32 MB / SMs beyond the ring\n");
    return 0;
}
