/* moe.cu: a MoE layer's routing on the device (dflash_route_args in
 * backend.h): one block of 1024 threads does the whole call, so the
 * grouping that needs every row's choice runs after a block barrier, not
 * a second launch or a host round trip.
 *
 * Per row (one warp each): softmax of the router logits, the lanes holding
 * experts lane, lane + 32, ... in registers (the row is read once, every
 * load in flight together: the routing is a chain of latencies, not
 * bytes); a bit per expert marks the taken ones; the k largest
 * probabilities one at a time by warp reduction (the lower expert on ties,
 * as the CPU; a NaN never beats a number), each kept by lane j (more than
 * 32: written out by lane 0), then renormalised by their sum in the order
 * taken and placed in expert order (lane j at its rank; beyond 32, lane 0
 * sorts them in memory). The softmax's sum is a warp reduction, so a
 * probability may differ from the CPU's by rounding; a row's result
 * depends on its logits only.
 *
 * A shared expert (shared_logit) is one more entry at the end of each row,
 * written by the row's lane 0 after the routed ones: expert E, weight
 * sigmoid(shared_logit[r]) as the gated add computes it; from there on it
 * is an expert like the others (E + 1 to group by, k + 1 entries a row).
 *
 * Grouping: thread e counts the entries of expert e, a block scan (within
 * warps by shuffles, then over the warps' totals) gives first[], and each
 * entry is placed in row order. Up to 64 rows (decode, verify), a row
 * takes an expert at most once, so expert e's rows are a 64-bit mask in
 * shared memory (set by atomic or, whose result does not depend on the
 * order): its count is the mask's popcount and an entry's place among its
 * expert's entries the popcount of the rows below it; every entry is
 * handled by one thread, once. Beyond that, thread e walks all the entries
 * (staged in shared memory, by the rows themselves when they fit one
 * chunk, and read four at a time), once to count and once to place.
 *
 * Where the router's split-K GEMM left its sum to this launch (ws set:
 * linear_moe_route in cuda_backend.c), the block first sums the partials
 * into the logits [n, E] and the shared expert's gate sh_out [n] as the
 * GEMM's epilogue would (split_sum), then routes as above: the same bits
 * as the GEMM followed by the routing, without the GEMM's arrival, wait
 * and last pass. */
#include "common.cuh"
#include "norm_rope.cuh"

#define MR_THREADS 1024
#define MR_CHUNK 4096 /* entries staged in shared memory at a time (a multiple of 4) */
#define MR_SUM_PER 4  /* router partials' elements a thread sums at once */
/* A row's experts a lane holds: up to 256 experts (Qwen3-MoE's 128,
 * Qwen3.5's 256), or up to the most the stage allows (1024, where the
 * registers of 1024-thread blocks run out and values spill to L1). */
#define MR_PER_LANE_NARROW 8
#define MR_PER_LANE_WIDE (DFLASH_ROUTE_MAX_EXPERTS / 32)
static_assert(MR_THREADS >= DFLASH_ROUTE_MAX_EXPERTS, "a thread per expert");
static_assert(DFLASH_ROUTE_MAX_EXPERTS % 32 == 0 && MR_PER_LANE_WIDE <= 32, "the taken experts are a 32-bit mask");

/* (v, i) beats (bv, bi): larger, or equal at a lower expert; NaN counts as
 * -inf, so it is taken only when nothing else is left. */
__forceinline__ bool mr_better(float v, int i, float bv, int bi)
{
    const float a = v != v ? -__int_as_float(0x7f800000) : v, b = bv != bv ? -__int_as_float(0x7f800000) : bv;
    return bi < 0 || a > b || (a == b && i < bi);
}

/* Row r by one warp: expert[r k ..], prob[r k ..]; E <= 32 PL. With k <=
 * 32 and `staged`, its experts also go to staged[0 .. k) (the grouping's
 * shared-memory copy). */
template <int PL>
__forceinline__ void mr_route_row(const float *lr, int E, int k, int norm, int *expert, float *prob, int *staged)
{
    const int lane = threadIdx.x & 31;
    float p[PL]; /* logit, then probability, of expert lane + 32 i */
#pragma unroll
    for (int i = 0; i < PL; i++)
        p[i] = lane + 32 * i < E ? lr[lane + 32 * i] : 0.0f;
    float mx = -__int_as_float(0x7f800000);
#pragma unroll
    for (int i = 0; i < PL; i++)
        if (lane + 32 * i < E)
            mx = fmaxf(mx, p[i]);
    for (int o = 16; o > 0; o >>= 1)
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    float sum = 0.0f;
#pragma unroll
    for (int i = 0; i < PL; i++)
        if (lane + 32 * i < E) {
            p[i] = expf(p[i] - mx);
            sum += p[i];
        }
    sum = warp_sum(sum);
#pragma unroll
    for (int i = 0; i < PL; i++)
        p[i] /= sum;
    u32 taken = 0; /* bit i: expert lane + 32 i */
    float top = 0.0f; /* the same sum, in the same order, in every lane */
    int my_e = -1;    /* k <= 32: lane j keeps the j-th expert taken */
    float my_p = 0.0f;
    for (int j = 0; j < k; j++) {
        float bv = 0.0f;
        int bi = -1;
#pragma unroll
        for (int i = 0; i < PL; i++) {
            const int e = lane + 32 * i;
            if (e < E && !(taken >> i & 1u) && mr_better(p[i], e, bv, bi))
                bv = p[i], bi = e;
        }
        for (int o = 16; o > 0; o >>= 1) {
            const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
            const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (oi >= 0 && mr_better(ov, oi, bv, bi))
                bv = ov, bi = oi;
        }
        if ((bi & 31) == lane)
            taken |= 1u << (bi >> 5);
        top += bv;
        if (k <= 32 && lane == j)
            my_e = bi, my_p = bv;
        else if (k > 32 && lane == 0)
            expert[j] = bi, prob[j] = bv;
    }
    if (k <= 32) {
        /* each lane's entry goes to its rank among the (distinct) experts
         * taken: the order the CPU's sort by expert gives */
        int rank = 0;
        for (int i = 0; i < k; i++)
            rank += __shfl_sync(0xffffffffu, my_e, i) < my_e;
        if (lane < k) {
            expert[rank] = my_e;
            prob[rank] = norm ? my_p / top : my_p;
            if (staged)
                staged[rank] = my_e;
        }
        return;
    }
    if (lane != 0)
        return;
    if (norm)
        for (int j = 0; j < k; j++)
            prob[j] /= top;
    for (int j = 1; j < k; j++) /* insertion sort by expert */
        for (int i = j; i > 0 && expert[i - 1] > expert[i]; i--) {
            const int e = expert[i];
            const float q = prob[i];
            expert[i] = expert[i - 1], prob[i] = prob[i - 1];
            expert[i - 1] = e, prob[i - 1] = q;
        }
}

/* How many of entries [0, nk) (staged chunk by chunk) are expert e; with
 * place, also writes src and slot of each of them, from `at` on. `staged`:
 * the entries are in `stage` already (one chunk). */
__forceinline__ int mr_scan(const int *expert, int nk, int k, int e, bool place, int at, int *src, int *slot,
                            int *stage, bool staged)
{
    int count = 0;
    for (int c0 = 0; c0 < nk; c0 += MR_CHUNK) {
        const int len = nk - c0 < MR_CHUNK ? nk - c0 : MR_CHUNK;
        __syncthreads(); /* the previous chunk is read by everyone */
        for (int i = threadIdx.x; !staged && i < len; i += blockDim.x)
            stage[i] = expert[c0 + i];
        for (int i = len + threadIdx.x; i < (len + 3) / 4 * 4; i += blockDim.x)
            stage[i] = -1;
        __syncthreads();
        for (int i = 0; i < len; i += 4) {
            const int4 q = *(const int4 *)(stage + i);
            const int v[4] = { q.x, q.y, q.z, q.w };
#pragma unroll
            for (int u = 0; u < 4; u++)
                if (v[u] == e) {
                    if (place) {
                        src[at + count] = (c0 + i + u) / k;
                        slot[c0 + i + u] = at + count;
                    }
                    count++;
                }
        }
    }
    return count;
}

/* The router GEMM's partials (see the top): slice s of row r at ws + s *
 * stride + r * ld, the router's rows from column 0, the shared gate's at
 * off_sh; fp8 row scales scale_r [E] and scale_s [1], or NULL. */
struct route_parts {
    const float *ws;
    i64 stride, ld, off_sh;
    int slices;
    float *sh_out;
    const float *scale_r, *scale_s;
};
static_assert(sizeof(route_parts) == 64, "mirrored by route_parts in cuda_internal.h");

template <int PL>
__forceinline__ void moe_route_body(float *logits, const float *shared_logit, int n, int E, int k, int norm,
                                    int *expert, float *prob, int *first, int *src, int *slot, const route_parts &rp)
{
    __shared__ __align__(16) int stage[MR_CHUNK];
    __shared__ int warp_total[MR_THREADS / 32];
    __shared__ unsigned long long rows_of[DFLASH_ROUTE_MAX_EXPERTS]; /* masks: bit r, row r took expert e */
    __shared__ int start[DFLASH_ROUTE_MAX_EXPERTS];                 /* masks: first[e] */
    pdl_trigger();
    pdl_wait();
    if (rp.ws) { /* the logits from the router's partials; the rows read them back after the barrier */
        /* the partials' rows [n, ld] as one run: thread t sums elements
         * t + i * blockDim.x, MR_SUM_PER of them with eight slices' loads
         * of each in flight at once (a few rounds, not a chain of round
         * trips per logit), then keeps the router's (j < E) and the
         * gate's (j == off_sh), each scaled as the GEMM's epilogue scales
         * it */
        const int total = n * (int)rp.ld;
        for (int u0 = threadIdx.x; u0 < total; u0 += MR_SUM_PER * blockDim.x) {
            float v[MR_SUM_PER];
            split_sum<MR_SUM_PER, 8>(rp.ws, rp.stride, rp.slices, nullptr, u0, blockDim.x, total, v);
#pragma unroll
            for (int i = 0; i < MR_SUM_PER; i++) {
                const int u = u0 + i * blockDim.x, r = u / (int)rp.ld, j = u - r * (int)rp.ld;
                if (u >= total)
                    break;
                if (j < E)
                    logits[(i64)r * E + j] = rp.scale_r ? __fmul_rn(v[i], rp.scale_r[j]) : v[i];
                else if (rp.sh_out && j == rp.off_sh)
                    rp.sh_out[r] = rp.scale_s ? __fmul_rn(v[i], rp.scale_s[0]) : v[i];
            }
        }
        __syncthreads();
    }
    /* from here on kr entries a row and ne experts (the shared one too) */
    const int sh = shared_logit != nullptr, kr = k + sh, ne = E + sh;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nk = n * kr;
    /* one chunk of entries, each row's kept in registers: the rows write
     * them to shared memory too, and the grouping never reads them back
     * from global memory */
    const bool staged = nk <= MR_CHUNK && k <= 32, masks = staged && n <= 64;
    const int e = threadIdx.x;
    if (masks && e < ne)
        rows_of[e] = 0;
    for (int r = warp; r < n; r += MR_THREADS / 32) {
        mr_route_row<PL>(logits + (i64)r * E, E, k, norm, expert + (i64)r * kr, prob + (i64)r * kr,
                         staged ? stage + r * kr : nullptr);
        if (sh && lane == 0) {
            expert[(i64)r * kr + k] = E;
            prob[(i64)r * kr + k] = 1.0f / (1.0f + expf(-shared_logit[r]));
            if (staged)
                stage[r * kr + k] = E;
        }
    }
    /* every row's experts are written (mr_scan begins with a barrier) */
    int count;
    if (masks) {
        __syncthreads();
        for (int i = threadIdx.x; i < nk; i += blockDim.x)
            atomicOr(&rows_of[stage[i]], 1ull << (i / kr));
        __syncthreads();
        count = e < ne ? __popcll(rows_of[e]) : 0;
    } else {
        count = mr_scan(expert, nk, kr, e < ne ? e : -2, false, 0, src, slot, stage, staged);
    }
    /* inclusive scan over the experts: within each warp, then the warps'
     * totals (one warp), then each warp's offset */
    int incl = warp_incl_sum(count);
    if (lane == 31)
        warp_total[warp] = incl;
    __syncthreads();
    if (warp == 0) {
        const int t = warp_total[lane];
        warp_total[lane] = warp_incl_sum(t) - t; /* the warps before this one */
    }
    __syncthreads();
    incl += warp_total[warp];
    const int at = incl - count;
    if (e < ne)
        first[e] = at;
    if (e == ne - 1)
        first[ne] = incl;
    if (masks) {
        if (e < ne)
            start[e] = at;
        __syncthreads();
        for (int i = threadIdx.x; i < nk; i += blockDim.x) {
            const int x = stage[i], r = i / kr;
            const int pos = start[x] + __popcll(rows_of[x] & ((1ull << r) - 1));
            src[pos] = r;
            slot[i] = pos;
        }
        return;
    }
    /* a single chunk is still in `stage` from the count */
    mr_scan(expert, nk, kr, e < ne ? e : -2, true, at, src, slot, stage, nk <= MR_CHUNK);
}

extern "C" __global__ void __launch_bounds__(MR_THREADS)
    dflash_moe_route(float *logits, const float *shared_logit, int n, int E, int k, int norm, int *expert,
                     float *prob, int *first, int *src, int *slot, route_parts rp)
{
    moe_route_body<MR_PER_LANE_NARROW>(logits, shared_logit, n, E, k, norm, expert, prob, first, src, slot, rp);
}

extern "C" __global__ void __launch_bounds__(MR_THREADS)
    dflash_moe_route_wide(float *logits, const float *shared_logit, int n, int E, int k, int norm, int *expert,
                          float *prob, int *first, int *src, int *slot, route_parts rp)
{
    moe_route_body<MR_PER_LANE_WIDE>(logits, shared_logit, n, E, k, norm, expert, prob, first, src, slot, rp);
}
