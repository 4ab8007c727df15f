/* sample.cu: one token drawn per row of logits on the device, by the host
 * sampler's rules (src/spec/sampler.c: temperature, top-k, top-p, min-p,
 * then an inverse-CDF draw with the uniform of the row's position), so a
 * sampled step downloads token ids instead of [rows, V] f32 logits and
 * filters no vocabulary on the host. One block of 1024 threads a row.
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
 * so the tokens spread over many bins and the shared-memory atomics seldom
 * collide. */
#include "common.cuh"

#define SMP_THREADS 1024
#define SMP_BINS 1024 /* one per thread */
#define SMP_BATCH 4   /* loads a thread issues before using them: a pass is bound by L2 latency */

typedef unsigned long long u64;

/* dflash_sample_row (backend.h), field for field. */
struct sample_row {
    double temperature, top_p, min_p;
    int top_k, pad_;
    u64 seed;
    long long pos;
};

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

extern "C" __global__ void __launch_bounds__(SMP_THREADS)
    dflash_sample_rows(const float *__restrict__ logits, int V, const sample_row *rows, double *__restrict__ e_ws,
                       u64 *hist_ws, int *out)
{
    pdl_trigger();
    pdl_wait();
    u64 *h_mass = hist_ws + (i64)blockIdx.x * SMP_BINS; /* global: see top-p */
    __shared__ u32 h_cnt[SMP_BINS];
    __shared__ u64 sc_u64[32];
    __shared__ u32 sc_u32[32];
    __shared__ float sv[32];
    __shared__ int si[32];
    __shared__ int s_int[4];
    __shared__ u64 s_u64[2];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const float *l = logits + (i64)blockIdx.x * V;
    double *e = e_ws + (i64)blockIdx.x * V;
    const sample_row a = rows[blockIdx.x];
    const double T = a.temperature;
    const double NEG_INF = -__longlong_as_double(0x7ff0000000000000ll);

    /* 1 the first maximum, the row's usability; x = logit / T into the
     * workspace, the count and key range of the finite ones */
    float bv = __int_as_float(0x7fc00000);
    int bi = AM_NONE_IDX, bad = 0, n_fin = 0;
    u32 kmin = 0xffffffffu, kmax = 0;
    for (int j0 = tid; j0 < V; j0 += SMP_BATCH * SMP_THREADS) {
        float vb[SMP_BATCH];
#pragma unroll
        for (int u = 0; u < SMP_BATCH; u++)
            vb[u] = j0 + u * SMP_THREADS < V ? l[j0 + u * SMP_THREADS] : 0.0f;
#pragma unroll
        for (int u = 0; u < SMP_BATCH; u++) {
            const int j = j0 + u * SMP_THREADS;
            const float v = vb[u];
            if (j >= V)
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
    block_argmax(bv, bi, sv, si);
    if (tid == 0) {
        s_int[0] = bi;
        s_int[1] = bad || !(bv > -__int_as_float(0x7f800000)) ? -1 : bi;
    }
    n_fin = (int)smp_block_scan((u32)n_fin, sc_u32); /* syncs: s_int is visible after it */
    n_fin = (int)sc_u32[31];
    const int top = s_int[0];
    if (s_int[1] < 0 || !(T > 0.0)) { /* no usable number; or a point mass (greedy) */
        if (tid == 0)
            out[blockIdx.x] = s_int[1];
        return;
    }
    const double m = (double)l[top] / T;
    if (m == -NEG_INF || m == NEG_INF) { /* the scaling overflowed: its limit is a point mass */
        if (tid == 0)
            out[blockIdx.x] = top;
        return;
    }
    kmin = smp_block_extreme<false>(kmin, sc_u32);
    kmax = smp_block_extreme<true>(kmax, sc_u32);

    /* 2 top-k: the k-th largest scaled logit, counted with multiplicity:
     * the range of keys narrowed by count histograms, walked from the top */
    double kth = NEG_INF;
    if (a.top_k > 0 && a.top_k < n_fin) {
        u32 lo = kmin, hi = kmax, want = (u32)a.top_k;
        for (;;) {
            const int sh = smp_shift(hi - lo);
            h_cnt[tid] = 0;
            __syncthreads();
            /* [lo, hi] lies within the finite x's keys: a logit whose x
             * is -inf (or overflowed to it) has a key under kmin */
            for (int j0 = tid; j0 < V; j0 += SMP_BATCH * SMP_THREADS) {
                u32 kb[SMP_BATCH];
#pragma unroll
                for (int u = 0; u < SMP_BATCH; u++)
                    kb[u] = j0 + u * SMP_THREADS < V ? smp_key(l[j0 + u * SMP_THREADS]) : 0u;
#pragma unroll
                for (int u = 0; u < SMP_BATCH; u++)
                    if (j0 + u * SMP_THREADS < V && kb[u] >= lo && kb[u] <= hi)
                        atomicAdd(&h_cnt[(kb[u] - lo) >> sh], 1u);
            }
            __syncthreads();
            const int b = SMP_BINS - 1 - tid; /* thread 0 takes the top bin */
            const u32 c = h_cnt[b], above = smp_block_scan(c, sc_u32);
            if (above >= want && above - c < want) {
                s_int[2] = b;
                s_int[3] = (int)(want - (above - c));
            }
            __syncthreads();
            lo += (u32)s_int[2] << sh;
            hi = smp_bin_top(lo, hi, sh);
            want = (u32)s_int[3];
            if (sh == 0)
                break;
        }
        kth = (double)smp_key_value(lo) / T;
    }

    /* 3 the survivors' exp(x - m) into the workspace; their total weight;
     * the key range of top-p's candidates (weight > 0, not the top) */
    u64 z = 0;
    u32 plo = 0xffffffffu, phi = 0;
    for (int j0 = tid; j0 < V; j0 += SMP_BATCH * SMP_THREADS) {
        double xb[SMP_BATCH];
        u32 kb[SMP_BATCH];
#pragma unroll
        for (int u = 0; u < SMP_BATCH; u++) {
            const int j = j0 + u * SMP_THREADS;
            xb[u] = j < V ? e[j] : NEG_INF;
            kb[u] = j < V ? smp_key(l[j]) : 0u;
        }
#pragma unroll
        for (int u = 0; u < SMP_BATCH; u++) {
            const int j = j0 + u * SMP_THREADS;
            if (j >= V)
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

    /* 4 top-p: the largest tail of the order (the top token excepted)
     * whose weight is <= (1 - top_p) of the total drops: found by weighed
     * histograms, walked from the bottom. Then a token drops iff its key
     * < cut_key, or == cut_key and its index > cut_idx. */
    smp_keep keep = { l, top, a.top_p < 1.0, 0u, V, a.min_p };
    if (keep.top_p) {
        smp_block_scan(z, sc_u64);
        const u64 cap = (u64)((1.0 - a.top_p) * (double)sc_u64[31]);
        u32 lo = smp_block_extreme<false>(plo, sc_u32), hi = smp_block_extreme<true>(phi, sc_u32);
        u64 below = 0; /* weight of the candidates under [lo, hi] */
        for (; lo <= hi;) {
            const int sh = smp_shift(hi - lo);
            h_cnt[tid] = 0;
            atomicExch(&h_mass[tid], 0ull); /* in L2, where the adds go */
            __syncthreads();
            for (int j0 = tid; j0 < V; j0 += SMP_BATCH * SMP_THREADS) {
                u32 kb[SMP_BATCH];
                double eb[SMP_BATCH];
#pragma unroll
                for (int u = 0; u < SMP_BATCH; u++) {
                    const int j = j0 + u * SMP_THREADS;
                    kb[u] = j < V ? smp_key(l[j]) : 0u;
                    eb[u] = j < V && j != top && kb[u] >= lo && kb[u] <= hi ? e[j] : 0.0;
                }
#pragma unroll
                for (int u = 0; u < SMP_BATCH; u++)
                    if (eb[u] != 0.0) { /* the weight by a fire-and-forget add in L2: 64-bit adds
                                         * in shared memory are compare-and-swap loops */
                        atomicAdd(&h_mass[(kb[u] - lo) >> sh], smp_mass(eb[u]));
                        atomicAdd(&h_cnt[(kb[u] - lo) >> sh], 1u);
                    }
            }
            __syncthreads();
            const u64 mb = atomicAdd(&h_mass[tid], 0ull), upto = below + smp_block_scan(mb, sc_u64);
            if (below + sc_u64[31] <= cap) { /* the whole range fits: it drops with all under it */
                keep.cut_key = hi;
                keep.cut_idx = -1;
                break;
            }
            if (upto > cap && upto - mb <= cap) {
                s_int[2] = tid;
                s_u64[0] = upto - mb;
                s_u64[1] = mb;
            }
            __syncthreads();
            const int b = s_int[2];
            below = s_u64[0];
            lo += (u32)b << sh;
            hi = smp_bin_top(lo, hi, sh);
            if (sh > 0)
                continue;
            /* the edge is inside the tokens of key lo, all of one weight:
             * of them the d of highest index drop */
            const u32 cnt = h_cnt[b];
            const u64 d = (cap - below) / (s_u64[1] / cnt);
            keep.cut_key = lo;
            if (d > 0) { /* the index of rank cnt - d among them: warp chunks in index order */
                const int r = (int)(cnt - d), cw = (V + 1023) / 1024 * 32;
                const int j0 = warp * cw, j1 = min(V, j0 + cw);
                u32 c = 0;
                for (int j = j0 + lane; j < j1; j += 32)
                    c += j != top && e[j] != 0.0 && smp_key(l[j]) == lo;
                c = __reduce_add_sync(0xffffffffu, c);
                const u32 upto_w = smp_block_scan(lane == 0 ? c : 0u, sc_u32);
                const u32 seen = upto_w - (lane == 0 ? c : 0u); /* lane 0: members before this warp's chunk */
                const u32 before = __shfl_sync(0xffffffffu, seen, 0);
                if ((int)before < r && (int)(before + c) >= r) {
                    int got = (int)before;
                    for (int j0l = j0; j0l < j1; j0l += 32) {
                        const int j = j0l + lane;
                        const int mem = j < j1 && j != top && e[j] != 0.0 && smp_key(l[j]) == lo;
                        const unsigned bal = __ballot_sync(0xffffffffu, mem);
                        if (got + __popc(bal) >= r) {
                            const int need = r - got; /* the need-th set lane */
                            unsigned bb = bal;
                            for (int q = 1; q < need; q++)
                                bb &= bb - 1;
                            if (lane == 0)
                                s_int[3] = j0l + __ffs(bb) - 1;
                            break;
                        }
                        got += __popc(bal);
                    }
                }
                __syncthreads();
                keep.cut_idx = s_int[3];
            }
            break;
        }
    }

    /* 5 the kept weights summed over warp chunks in index order; the draw's
     * target u * total; the chunk that holds it walks it 32 at a time */
    __syncthreads();
    const int cw = (V + 1023) / 1024 * 32;
    const int j0 = warp * cw, j1 = min(V, j0 + cw);
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
    const u64 before = __shfl_sync(0xffffffffu, upto - (lane == 0 ? s : 0ull), 0);
    const u64 total = sc_u64[31]; /* > 0: the top token weighs 2^44 */
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
                    out[blockIdx.x] = jb + __ffs(past) - 1;
                break;
            }
            run += __shfl_sync(0xffffffffu, incl, 31);
        }
    }
}
