/* sample.cu: one token drawn per row of logits on the device, by the host
 * sampler's rules (src/spec/sampler.c: temperature, top-k, top-p, min-p,
 * then an inverse-CDF draw with the uniform of the row's position), so a
 * sampled step downloads token ids instead of [rows, V] f32 logits and
 * filters no vocabulary on the host. A row is split over a cluster of 8
 * blocks of 1024 threads (each a slice of the vocabulary, on its own SM:
 * one SM walking a row pass after pass took ~0.2-0.4 ms); what the blocks
 * combine (maxima, counts, histograms, sums) goes through the row's
 * workspace in L2 between cluster barriers, each block combining the
 * eight partials in rank order, so all of them reach the same decisions.
 *
 * The scaled logits x = logit / T and exp(x - m) are the host's, in double
 * (CUDA's exp within 1 ulp). Top-p and the draw weigh each token in
 * integer units of 2^-44 of the top token's weight: integer sums are exact
 * in any order, so every prefix the draw needs is exact and the result
 * depends only on the row and its arguments. A token's weight is off by
 * under 2^-44 of the top token's (a token lighter than that cannot be
 * drawn: under 6e-14 of the mass each); a token at a filter's edge or at
 * the draw's boundary may fall the other way than on the host, as
 * rounding anywhere would have it.
 *
 * Order of the vocabulary (top-k's k-th largest, top-p's dropped tail):
 * descending logit, ascending index on ties, the host's order (dividing
 * f32 logits by the temperature in double keeps them distinct and in
 * order). Both searches narrow a range of the logits' order keys through
 * histograms of 1024 bins spanning the range (the shift that makes it fit),
 * so the tokens spread over many bins and the adds seldom collide. */
#include "common.cuh"

#if __CUDA_ARCH__ >= 900
#define SMP_CLUSTER 8 /* the host launches 8 blocks a row where clusters exist (cuda_backend.c) */
#define SMP_CLUSTER_DIMS __cluster_dims__(SMP_CLUSTER, 1, 1)
#else
#define SMP_CLUSTER 1
#define SMP_CLUSTER_DIMS
#endif
#define SMP_THREADS 1024
#define SMP_BINS 1024 /* one per thread */
#define SMP_BATCH 4   /* loads a thread issues before using them: a pass is bound by L2 latency */

typedef unsigned long long u64;

/* dflash_sample_row (backend.h), field for field. */
struct sample_row {
    double temperature, top_p, min_p;
    int top_k, n_gen;
    u64 seed;
    long long pos;
    double rep_penalty, frequency_penalty, presence_penalty;
    const int *counts, *gen;
};
static_assert(sizeof(sample_row) == 88, "mirrors dflash_sample_row in backend.h");

/* Unsigned keys in the order of the f32 values they come from. */
__forceinline__ u32 smp_key(float f)
{
    const u32 u = __float_as_uint(f);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__forceinline__ float smp_key_value(u32 k)
{
    return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

/* The host's splitmix64 and dflash_sampler_uniform_at, bit for bit. */
__forceinline__ u64 smp_splitmix(u64 &x)
{
    u64 z = (x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

__forceinline__ double smp_uniform_at(u64 seed, long long pos)
{
    u64 s = seed;
    u64 x = smp_splitmix(s) + (u64)pos * 0x9e3779b97f4a7c15ull;
    return (double)(smp_splitmix(x) >> 11) * 0x1.0p-53;
}

/* A token's weight: exp(x - m) in units of 2^-44 (the top token weighs
 * 2^44; 2^18 tokens of that stay below 2^63). */
__forceinline__ u64 smp_mass(double e) { return __double2ull_rz(e * 0x1.0p44); }

/* The smallest shift that maps a range of width span + 1 into SMP_BINS. */
__forceinline__ int smp_shift(u32 span)
{
    int sh = 0;
    while ((span >> sh) >= SMP_BINS)
        sh++;
    return sh;
}

/* The last key of the bin that starts at lo (shift sh), within hi. */
__forceinline__ u32 smp_bin_top(u32 lo, u32 hi, int sh)
{
    const u64 t = (u64)lo + ((1ull << sh) - 1ull);
    return t < hi ? (u32)t : hi;
}

/* Inclusive prefix sum over the block in thread order (blockDim 1024);
 * scratch holds 32 values; the block's total is left in scratch[31]. A
 * fixed tree: exact for integers. */
template <typename T> __forceinline__ T smp_block_scan(T v, T *scratch)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int o = 1; o < 32; o <<= 1) {
        const T u = __shfl_up_sync(0xffffffffu, v, o);
        if (lane >= o)
            v += u;
    }
    __syncthreads(); /* scratch may still be read by a previous call */
    if (lane == 31)
        scratch[warp] = v;
    __syncthreads();
    if (warp == 0) {
        T w = scratch[lane];
        for (int o = 1; o < 32; o <<= 1) {
            const T u = __shfl_up_sync(0xffffffffu, w, o);
            if (lane >= o)
                w += u;
        }
        scratch[lane] = w;
    }
    __syncthreads();
    return warp ? v + scratch[warp - 1] : v;
}

/* The block's minimum (MAX false) or maximum of v; scratch holds 32. */
template <bool MAX> __forceinline__ u32 smp_block_extreme(u32 v, u32 *scratch)
{
    v = MAX ? __reduce_max_sync(0xffffffffu, v) : __reduce_min_sync(0xffffffffu, v);
    __syncthreads();
    if ((threadIdx.x & 31) == 0)
        scratch[threadIdx.x >> 5] = v;
    __syncthreads();
    const u32 w = scratch[threadIdx.x & 31];
    return MAX ? __reduce_max_sync(0xffffffffu, w) : __reduce_min_sync(0xffffffffu, w);
}

/* What the row keeps of token j after top-p and min-p, as a weight (0:
 * dropped); e: its exp(x - m), 0 for tokens top-k or -inf removed. */
struct smp_keep {
    const float *l;
    int top, top_p;
    u32 cut_key;
    int cut_idx;
    double min_p;
};

__forceinline__ u64 smp_kept_mass(const smp_keep &k, int j, double e)
{
    if (e == 0.0 || e < k.min_p)
        return 0;
    if (k.top_p && j != k.top) {
        const u32 key = smp_key(k.l[j]);
        if (key < k.cut_key || (key == k.cut_key && j > k.cut_idx))
            return 0;
    }
    return smp_mass(e);
}

/* The row's workspace in L2, in u64: count and weight histograms, two
 * of each (a level adds into one while the other is cleared for the
 * next), then each stage's partials [stage][rank][field]. */
#define WS_HM 0
#define WS_HC (2 * SMP_BINS)
#define WS_PART (4 * SMP_BINS)
#define WS_ROW (WS_PART + 4 * SMP_CLUSTER * 8)
enum { ST_FIRST, ST_EXP, ST_TIE, ST_DRAW };

__forceinline__ u32 smp_rank()
{
#if __CUDA_ARCH__ >= 900
    u32 r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    return r;
#else
    return 0;
#endif
}

/* Reads and writes of the workspace go to L2, where the adds land. */
__forceinline__ u64 ws_get(u64 *p) { return atomicAdd(p, 0ull); }
__forceinline__ void ws_set(u64 *p, u64 v) { atomicExch(p, v); }

/* Stage st's partials: thread 0 of each block writes its fields f[0..n)
 * (the block's results), then after a cluster barrier every block reads
 * all eight ranks' into part[rank][field]. */
__forceinline__ void smp_exchange(u64 *ws, int st, u32 rank, const u64 *f, int n, u64 (*part)[8])
{
    if (threadIdx.x == 0)
        for (int i = 0; i < n; i++)
            ws_set(ws + WS_PART + (st * SMP_CLUSTER + rank) * 8 + i, f[i]);
    cluster_sync();
    if (threadIdx.x < SMP_CLUSTER * 8 && (int)(threadIdx.x & 7) < n)
        part[threadIdx.x >> 3][threadIdx.x & 7] = ws_get(ws + WS_PART + st * SMP_CLUSTER * 8 + threadIdx.x);
    __syncthreads();
}

extern "C" __global__ void SMP_CLUSTER_DIMS __launch_bounds__(SMP_THREADS)
    dflash_sample_rows(const float *__restrict__ logits, int V, const sample_row *rows, double *__restrict__ e_ws,
                       u64 *ws_all, int *out)
{
    pdl_trigger();
    pdl_wait();
    __shared__ u64 sc_u64[32];
    __shared__ u32 sc_u32[32];
    __shared__ float sv[32];
    __shared__ int si[32];
    __shared__ int s_int[4];
    __shared__ u64 part[SMP_CLUSTER][8];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int row = blockIdx.x / SMP_CLUSTER;
    const u32 rank = smp_rank();
    const float *l = logits + (i64)row * V;
    double *e = e_ws + (i64)row * V;
    u64 *ws = ws_all + (i64)row * WS_ROW;
    const sample_row a = rows[row];
    const double T = a.temperature;
    const double NEG_INF = -__longlong_as_double(0x7ff0000000000000ll);
    /* this block's slice [s0, s1) of the vocabulary, a multiple of 32 long */
    const int S = (V + SMP_CLUSTER * 32 - 1) / (SMP_CLUSTER * 32) * 32;
    const int s0 = min(V, (int)rank * S), s1 = min(V, s0 + S);

    /* 1 the first maximum, the row's usability; x = logit / T into the
     * workspace, the count and key range of the finite ones; rank 0
     * clears the histograms */
    if (rank == 0)
        for (int i = tid; i < 4 * SMP_BINS; i += SMP_THREADS)
            ws_set(ws + i, 0);
    float bv = __int_as_float(0x7fc00000);
    int bi = AM_NONE_IDX, bad = 0, n_fin = 0;
    u32 kmin = 0xffffffffu, kmax = 0;
    for (int j0 = s0 + tid; j0 < s1; j0 += SMP_BATCH * SMP_THREADS) {
        float vb[SMP_BATCH];
#pragma unroll
        for (int u = 0; u < SMP_BATCH; u++)
            vb[u] = j0 + u * SMP_THREADS < s1 ? l[j0 + u * SMP_THREADS] : 0.0f;
#pragma unroll
        for (int u = 0; u < SMP_BATCH; u++) {
            const int j = j0 + u * SMP_THREADS;
            const float v = vb[u];
            if (j >= s1)
                break;
            bad |= am_unusable(v);
            am_take(bv, bi, v, j);
            if (T > 0.0) {
                const double x = (double)v / T;
                e[j] = x;
                if (x != NEG_INF) {
                    n_fin++;
                    kmin = min(kmin, smp_key(v));
                    kmax = max(kmax, smp_key(v));
                }
            }
        }
    }
    bad = __syncthreads_or(bad);
    block_argmax(bv, bi, sv, si); /* valid in warp 0, which writes the partials */
    smp_block_scan((u32)n_fin, sc_u32);
    n_fin = (int)sc_u32[31];
    kmin = smp_block_extreme<false>(kmin, sc_u32);
    kmax = smp_block_extreme<true>(kmax, sc_u32);
    {
        const u64 f[6] = { (u64)bad, __float_as_uint(bv), (u64)(u32)bi, (u64)n_fin, kmin, kmax };
        smp_exchange(ws, ST_FIRST, rank, f, 6, part);
    }
    bad = 0;
    bv = __int_as_float(0x7fc00000);
    bi = AM_NONE_IDX;
    n_fin = 0;
    kmin = 0xffffffffu;
    kmax = 0;
    for (int q = 0; q < SMP_CLUSTER; q++) {
        bad |= (int)part[q][0];
        am_take(bv, bi, __uint_as_float((u32)part[q][1]), (int)(u32)part[q][2]);
        n_fin += (int)part[q][3];
        kmin = min(kmin, (u32)part[q][4]);
        kmax = max(kmax, (u32)part[q][5]);
    }
    const int top = bi;
    const int none = bad || !(bv > -__int_as_float(0x7f800000));
    if (none || !(T > 0.0)) { /* no usable number; or a point mass (greedy) */
        if (rank == 0 && tid == 0)
            out[row] = none ? -1 : top;
        return;
    }
    const double m = (double)l[top] / T;
    if (m == -NEG_INF || m == NEG_INF) { /* the scaling overflowed: its limit is a point mass */
        if (rank == 0 && tid == 0)
            out[row] = top;
        return;
    }

    /* A histogram level: every block adds its slice's tokens of key in
     * [lo, hi] (weight w(j), or 1 when counting) into bin (key - lo) >> sh
     * of buffer lvl & 1; then all blocks read the whole histogram, bin tid
     * in thread tid, and rank 0 clears the other buffer for the next level. */
    int lvl = 0;

    /* 2 top-k: the k-th largest scaled logit, counted with multiplicity:
     * the range of keys narrowed by count histograms, walked from the top.
     * [lo, hi] lies within the finite x's keys: a logit whose x is -inf
     * (or overflowed to it) has a key under kmin */
    double kth = NEG_INF;
    if (a.top_k > 0 && a.top_k < n_fin) {
        u32 lo = kmin, hi = kmax, want = (u32)a.top_k;
        for (;; lvl++) {
            const int sh = smp_shift(hi - lo);
            u64 *hc = ws + WS_HC + (lvl & 1) * SMP_BINS;
            for (int j0 = s0 + tid; j0 < s1; j0 += SMP_BATCH * SMP_THREADS) {
                u32 kb[SMP_BATCH];
#pragma unroll
                for (int u = 0; u < SMP_BATCH; u++)
                    kb[u] = j0 + u * SMP_THREADS < s1 ? smp_key(l[j0 + u * SMP_THREADS]) : 0u;
#pragma unroll
                for (int u = 0; u < SMP_BATCH; u++)
                    if (j0 + u * SMP_THREADS < s1 && kb[u] >= lo && kb[u] <= hi)
                        atomicAdd(&hc[(kb[u] - lo) >> sh], 1ull);
            }
            cluster_sync();
            const int b = SMP_BINS - 1 - tid; /* thread 0 takes the top bin */
            const u64 c = ws_get(&hc[b]), above = smp_block_scan(c, sc_u64);
            if (rank == 0)
                ws_set(ws + WS_HC + ((lvl + 1) & 1) * SMP_BINS + tid, 0);
            if (above >= want && above - c < want) {
                s_int[2] = b;
                s_int[3] = (int)(want - (above - c));
            }
            cluster_sync(); /* the clearing done before the next level adds; s_int seen */
            lo += (u32)s_int[2] << sh;
            hi = smp_bin_top(lo, hi, sh);
            want = (u32)s_int[3];
            if (sh == 0) {
                lvl++;
                break;
            }
        }
        kth = (double)smp_key_value(lo) / T;
    }

    /* 3 the survivors' exp(x - m) into the workspace; their total weight;
     * the key range of top-p's candidates (weight > 0, not the top) */
    u64 z = 0;
    u32 plo = 0xffffffffu, phi = 0;
    for (int j0 = s0 + tid; j0 < s1; j0 += SMP_BATCH * SMP_THREADS) {
        double xb[SMP_BATCH];
        u32 kb[SMP_BATCH];
#pragma unroll
        for (int u = 0; u < SMP_BATCH; u++) {
            const int j = j0 + u * SMP_THREADS;
            xb[u] = j < s1 ? e[j] : NEG_INF;
            kb[u] = j < s1 ? smp_key(l[j]) : 0u;
        }
#pragma unroll
        for (int u = 0; u < SMP_BATCH; u++) {
            const int j = j0 + u * SMP_THREADS;
            if (j >= s1)
                break;
            const double ej = xb[u] != NEG_INF && xb[u] >= kth ? exp(xb[u] - m) : 0.0;
            e[j] = ej;
            z += smp_mass(ej);
            if (ej != 0.0 && j != top) {
                plo = min(plo, kb[u]);
                phi = max(phi, kb[u]);
            }
        }
    }
    smp_block_scan(z, sc_u64);
    z = sc_u64[31];
    plo = smp_block_extreme<false>(plo, sc_u32);
    phi = smp_block_extreme<true>(phi, sc_u32);
    {
        const u64 f[3] = { z, plo, phi };
        smp_exchange(ws, ST_EXP, rank, f, 3, part);
    }
    z = 0;
    plo = 0xffffffffu;
    phi = 0;
    for (int q = 0; q < SMP_CLUSTER; q++) {
        z += part[q][0];
        plo = min(plo, (u32)part[q][1]);
        phi = max(phi, (u32)part[q][2]);
    }

    /* 4 top-p: the largest tail of the order (the top token excepted)
     * whose weight is <= (1 - top_p) of the total drops: found by weighed
     * histograms, walked from the bottom. Then a token drops iff its key
     * < cut_key, or == cut_key and its index > cut_idx. */
    smp_keep keep = { l, top, a.top_p < 1.0, 0u, V, a.min_p };
    if (keep.top_p) {
        const u64 cap = (u64)((1.0 - a.top_p) * (double)z);
        u32 lo = plo, hi = phi;
        u64 below = 0; /* weight of the candidates under [lo, hi] */
        for (; lo <= hi; lvl++) {
            const int sh = smp_shift(hi - lo);
            u64 *hm = ws + WS_HM + (lvl & 1) * SMP_BINS, *hc = ws + WS_HC + (lvl & 1) * SMP_BINS;
            for (int j0 = s0 + tid; j0 < s1; j0 += SMP_BATCH * SMP_THREADS) {
                u32 kb[SMP_BATCH];
                double eb[SMP_BATCH];
#pragma unroll
                for (int u = 0; u < SMP_BATCH; u++) {
                    const int j = j0 + u * SMP_THREADS;
                    kb[u] = j < s1 ? smp_key(l[j]) : 0u;
                    eb[u] = j < s1 && j != top && kb[u] >= lo && kb[u] <= hi ? e[j] : 0.0;
                }
#pragma unroll
                for (int u = 0; u < SMP_BATCH; u++)
                    if (eb[u] != 0.0) {
                        atomicAdd(&hm[(kb[u] - lo) >> sh], smp_mass(eb[u]));
                        atomicAdd(&hc[(kb[u] - lo) >> sh], 1ull);
                    }
            }
            cluster_sync();
            const u64 mb = ws_get(&hm[tid]), cb = ws_get(&hc[tid]);
            const u64 upto = below + smp_block_scan(mb, sc_u64);
            if (rank == 0) {
                ws_set(ws + WS_HM + ((lvl + 1) & 1) * SMP_BINS + tid, 0);
                ws_set(ws + WS_HC + ((lvl + 1) & 1) * SMP_BINS + tid, 0);
            }
            const int all_fit = below + sc_u64[31] <= cap;
            if (!all_fit && upto > cap && upto - mb <= cap) {
                s_int[2] = tid;
                part[0][0] = upto - mb; /* free until the next exchange */
                part[0][1] = mb;
                part[0][2] = cb;
            }
            cluster_sync();
            if (all_fit) { /* the whole range fits: it drops with all under it */
                keep.cut_key = hi;
                keep.cut_idx = -1;
                break;
            }
            const int b = s_int[2];
            below = part[0][0];
            lo += (u32)b << sh;
            hi = smp_bin_top(lo, hi, sh);
            if (sh > 0)
                continue;
            /* the edge is inside the tokens of key lo, all of one weight:
             * of them the d of highest index drop */
            const u64 cnt = part[0][2], d = (cap - below) / (part[0][1] / cnt);
            keep.cut_key = lo;
            if (d > 0) { /* the index of rank cnt - d among them: warp chunks in index order */
                const u64 r = cnt - d;
                const int cw = (S + 1023) / 1024 * 32;
                const int j0 = s0 + warp * cw, j1 = min(s1, j0 + cw);
                u32 c = 0;
                for (int j = j0 + lane; j < j1; j += 32)
                    c += j != top && e[j] != 0.0 && smp_key(l[j]) == lo;
                c = __reduce_add_sync(0xffffffffu, c);
                const u32 upto_w = smp_block_scan(lane == 0 ? c : 0u, sc_u32);
                const u32 in_block = upto_w - (lane == 0 ? c : 0u);
                {
                    const u64 f[1] = { sc_u32[31] };
                    smp_exchange(ws, ST_TIE, rank, f, 1, part);
                }
                u64 before = __shfl_sync(0xffffffffu, in_block, 0);
                for (u32 q = 0; q < rank; q++)
                    before += part[q][0];
                s_int[3] = -1;
                __syncthreads();
                if (before < r && before + c >= r) {
                    u64 got = before;
                    for (int j0l = j0; j0l < j1; j0l += 32) {
                        const int j = j0l + lane;
                        const int mem = j < j1 && j != top && e[j] != 0.0 && smp_key(l[j]) == lo;
                        const unsigned bal = __ballot_sync(0xffffffffu, mem);
                        if (got + __popc(bal) >= r) {
                            unsigned bb = bal; /* the (r - got)-th set lane */
                            for (u64 q = 1; q < r - got; q++)
                                bb &= bb - 1;
                            if (lane == 0)
                                s_int[3] = j0l + __ffs(bb) - 1;
                            break;
                        }
                        got += __popc(bal);
                    }
                }
                __syncthreads();
                {
                    const u64 f[2] = { sc_u32[31], (u64)(i64)s_int[3] };
                    smp_exchange(ws, ST_TIE, rank, f, 2, part);
                }
                for (int q = 0; q < SMP_CLUSTER; q++)
                    if ((i64)part[q][1] >= 0)
                        keep.cut_idx = (int)(i64)part[q][1];
            }
            break;
        }
    }

    /* 5 the kept weights summed over warp chunks in index order; the draw's
     * target u * total; the chunk that holds it walks it 32 at a time */
    const int cw = (S + 1023) / 1024 * 32;
    const int j0 = s0 + warp * cw, j1 = min(s1, j0 + cw);
    u64 s = 0;
    for (int jb = j0 + lane; jb < j1; jb += SMP_BATCH * 32) {
        double eb[SMP_BATCH];
#pragma unroll
        for (int u = 0; u < SMP_BATCH; u++)
            eb[u] = jb + 32 * u < j1 ? e[jb + 32 * u] : 0.0;
#pragma unroll
        for (int u = 0; u < SMP_BATCH; u++)
            s += smp_kept_mass(keep, jb + 32 * u, eb[u]);
    }
    for (int o = 16; o > 0; o >>= 1)
        s += __shfl_xor_sync(0xffffffffu, s, o);
    const u64 upto = smp_block_scan(lane == 0 ? s : 0ull, sc_u64);
    u64 before = __shfl_sync(0xffffffffu, upto - (lane == 0 ? s : 0ull), 0);
    {
        const u64 f[1] = { sc_u64[31] };
        smp_exchange(ws, ST_DRAW, rank, f, 1, part);
    }
    u64 total = 0; /* > 0: the top token weighs 2^44 */
    for (u32 q = 0; q < SMP_CLUSTER; q++) {
        before += q < rank ? part[q][0] : 0;
        total += part[q][0];
    }
    u64 target = (u64)(smp_uniform_at(a.seed, a.pos) * (double)total);
    if (target >= total)
        target = total - 1;
    if (before <= target && target < before + s) {
        u64 run = before;
        for (int jb = j0; jb < j1; jb += 32) {
            const int j = jb + lane;
            const u64 w = j < j1 ? smp_kept_mass(keep, j, e[j]) : 0ull;
            u64 incl = w;
            for (int o = 1; o < 32; o <<= 1) {
                const u64 u = __shfl_up_sync(0xffffffffu, incl, o);
                if (lane >= o)
                    incl += u;
            }
            const unsigned past = __ballot_sync(0xffffffffu, run + incl > target);
            if (past) {
                if (lane == 0)
                    out[row] = jb + __ffs(past) - 1;
                break;
            }
            run += __shfl_sync(0xffffffffu, incl, 31);
        }
    }
}

/* ---- penalties ----------------------------------------------------------- */

/* A logit under the penalties (dflash_sampler_probs' step 1, bit for bit):
 * c = the token's count (-1: not in the sequence, 0: in it, k > 0:
 * generated k times); the repetition penalty, then frequency and presence,
 * in double without contraction, the result rounded to f32 (a finite
 * logit past f32's range to its largest). */
__forceinline__ float smp_penalized(float v, int c, const sample_row &a)
{
    if (c < 0)
        return v;
    double x = v;
    int changed = 0;
    if (a.rep_penalty != 1.0) {
        x = x < 0 ? __dmul_rn(x, a.rep_penalty) : __ddiv_rn(x, a.rep_penalty);
        changed = 1;
    }
    if (c > 0 && (a.frequency_penalty != 0.0 || a.presence_penalty != 0.0)) {
        x = __dsub_rn(x, __dmul_rn(a.frequency_penalty, (double)c));
        x = __dsub_rn(x, a.presence_penalty);
        changed = 1;
    }
    if (!changed)
        return v;
    const float r = __double2float_rn(x), big = __int_as_float(0x7f7fffff);
    return isinf(r) && !isinf(x) ? (x > 0 ? big : -big) : r;
}

/* out [n, V] = the rows of logits under their penalties (a row without
 * counts copied as it is), for dflash_sample_rows to draw from. Grid:
 * (blocks over the vocabulary, rows). */
extern "C" __global__ void __launch_bounds__(256)
    dflash_penalize_rows(const float *__restrict__ logits, int V, const sample_row *rows, float *__restrict__ out)
{
    pdl_trigger();
    pdl_wait();
    __shared__ int gen[DFLASH_SAMPLE_GEN_MAX];
    const sample_row &a = rows[blockIdx.y];
    const int n_gen = min(max(a.n_gen, 0), DFLASH_SAMPLE_GEN_MAX);
    for (int i = threadIdx.x; i < n_gen; i += blockDim.x)
        gen[i] = a.gen[i]; /* the drafts where the verify's forward holds its rows' tokens */
    __syncthreads();
    const float *l = logits + (i64)blockIdx.y * V;
    float *o = out + (i64)blockIdx.y * V;
    const int *counts = a.counts;
    for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < V; j += gridDim.x * blockDim.x) {
        float v = l[j];
        if (counts) {
            int c = counts[j], more = 0;
            for (int i = 0; i < n_gen; i++)
                more += gen[i] == j;
            if (more)
                c = max(c, 0) + more;
            v = smp_penalized(v, c, a);
        }
        o[j] = v;
    }
}

/* counts [V] learns ids[0..n) (backend.h's count_tokens): generated, one
 * more each (from -1 as from 0); else -1 becomes 0. Atomics, so repeated
 * ids add up in any order. */
extern "C" __global__ void __launch_bounds__(256)
    dflash_count_tokens(int *counts, int V, const int *ids, int n, int generated)
{
    pdl_trigger();
    pdl_wait();
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n)
        return;
    const int t = ids[i];
    if (t < 0 || t >= V)
        return;
    atomicMax(&counts[t], 0);
    if (generated)
        atomicAdd(&counts[t], 1);
}
