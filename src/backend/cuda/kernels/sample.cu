/* sample.cu: one token drawn per row of logits on the device, by the host
 * sampler's rules (src/spec/sampler.c: temperature, top-k, top-p, min-p,
 * then an inverse-CDF draw with the uniform of the row's position), so a
 * sampled step downloads token ids instead of [rows, V] f32 logits and
 * filters no vocabulary on the host. One block per row.
 *
 * What differs from the host, and why it does not matter:
 *   - exp() is CUDA's double exp (within 1 ulp), sums run in a fixed
 *     parallel order: probabilities agree with the host's to ~1e-15;
 *   - top-p weighs each token's probability in integer units of 2^-44 of
 *     the top token's: a deterministic sum in any order (an atomic add of
 *     integers), off from the exact mass by at most V * 2^-44 ~ 1e-8 of
 *     it, below the f32 rounding of the rule as transformers computes it.
 * A token at an edge may fall the other way, as rounding anywhere would
 * have it; the result depends only on the row and its arguments (not on
 * timing or the other rows), so a seed reproduces a run exactly.
 *
 * Order of the vocabulary (top-k's k-th largest, top-p's dropped tail):
 * descending logit, ascending index on ties, the host's order (dividing
 * by the temperature in double keeps f32 logits distinct and in order). */
#include "common.cuh"

#define SMP_THREADS 1024

/* dflash_sample_row (backend.h), field for field. */
struct sample_row {
    double temperature, top_p, min_p;
    int top_k, pad_;
    unsigned long long seed;
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
__forceinline__ unsigned long long smp_splitmix(unsigned long long &x)
{
    unsigned long long z = (x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

__forceinline__ double smp_uniform_at(unsigned long long seed, long long pos)
{
    unsigned long long s = seed;
    unsigned long long x = smp_splitmix(s) + (unsigned long long)pos * 0x9e3779b97f4a7c15ull;
    return (double)(smp_splitmix(x) >> 11) * 0x1.0p-53;
}

/* A token's top-p weight: exp(x - m) in units of 2^-44 (the top token
 * weighs 2^44; 2^18 tokens of it stay below 2^63). */
__forceinline__ unsigned long long smp_mass(double e) { return __double2ull_rz(e * 0x1.0p44); }

/* x: a logit divided by the temperature, in double as the host does it. */
__forceinline__ double smp_scaled(float v, double T) { return (double)v / T; }

/* Sum of a per-thread count over the block (exact). */
__forceinline__ int smp_block_count(int v, int *scratch)
{
    v = warp_incl_sum(v);
    v = __shfl_sync(0xffffffffu, v, 31);
    __syncthreads();
    if ((threadIdx.x & 31) == 0)
        scratch[threadIdx.x >> 5] = v;
    __syncthreads();
    int t = 0;
    for (int w = 0; w < (int)(blockDim.x >> 5); w++)
        t += scratch[w];
    return t;
}

extern "C" __global__ void __launch_bounds__(SMP_THREADS)
    dflash_sample_rows(const float *logits, int V, const sample_row *rows, double *e_ws, int *out)
{
    pdl_trigger();
    pdl_wait();
    __shared__ float sv[32];
    __shared__ int si[32];
    __shared__ unsigned long long h_mass[256];
    __shared__ u32 h_cnt[256];
    __shared__ double part[SMP_THREADS + 1]; /* a thread's chunk sum, then the prefix before it */
    __shared__ int s_int[4];
    __shared__ unsigned long long s_u64[2];
    const int tid = threadIdx.x;
    const float *l = logits + (i64)blockIdx.x * V;
    double *e = e_ws + (i64)blockIdx.x * V;
    const sample_row a = rows[blockIdx.x];
    const double T = a.temperature;
    const double NEG_INF = -__longlong_as_double(0x7ff0000000000000ll);

    /* 1 the first maximum, the row's usability, the scaled survivors */
    float bv = __int_as_float(0x7fc00000);
    int bi = AM_NONE_IDX, bad = 0, n_fin = 0;
    for (int j = tid; j < V; j += SMP_THREADS) {
        const float v = l[j];
        bad |= am_unusable(v);
        am_take(bv, bi, v, j);
        n_fin += T > 0.0 && smp_scaled(v, T) != NEG_INF;
    }
    bad = __syncthreads_or(bad);
    block_argmax(bv, bi, sv, si);
    if (tid == 0) {
        s_int[0] = bi;
        s_int[1] = bad || !(bv > -__int_as_float(0x7f800000)) ? -1 : bi;
    }
    n_fin = smp_block_count(n_fin, si); /* syncs: s_int is visible after it */
    const int top = s_int[0];
    if (s_int[1] < 0 || !(T > 0.0)) { /* no usable number; or a point mass (greedy) */
        if (tid == 0)
            out[blockIdx.x] = s_int[1];
        return;
    }
    const double m = smp_scaled(l[top], T);
    if (m == -NEG_INF || m == NEG_INF) { /* the scaling overflowed: its limit is a point mass */
        if (tid == 0)
            out[blockIdx.x] = top;
        return;
    }

    /* 2 top-k: the k-th largest scaled logit, counted with multiplicity,
     * by a radix select over the logits' keys, 8 bits a pass */
    double kth = NEG_INF;
    if (a.top_k > 0 && a.top_k < n_fin) {
        u32 prefix = 0, want = (u32)a.top_k;
        for (int shift = 24; shift >= 0; shift -= 8) {
            for (int b = tid; b < 256; b += SMP_THREADS)
                h_cnt[b] = 0;
            __syncthreads();
            for (int j = tid; j < V; j += SMP_THREADS) {
                const float v = l[j];
                const u32 k = smp_key(v);
                if (smp_scaled(v, T) == NEG_INF || (shift < 24 && (k >> (shift + 8)) != prefix))
                    continue;
                atomicAdd(&h_cnt[(k >> shift) & 255u], 1u);
            }
            __syncthreads();
            if (tid == 0) {
                int b = 255;
                for (; b > 0 && want > h_cnt[b]; b--)
                    want -= h_cnt[b];
                s_int[2] = b;
                s_int[3] = (int)want;
            }
            __syncthreads();
            prefix = (prefix << 8) | (u32)s_int[2];
            want = (u32)s_int[3];
            __syncthreads();
        }
        kth = smp_scaled(smp_key_value(prefix), T);
    }

    /* 3 the survivors' exp(x - m), and their top-p weight */
    unsigned long long z = 0;
    for (int j = tid; j < V; j += SMP_THREADS) {
        const double x = smp_scaled(l[j], T);
        const double ej = x != NEG_INF && x >= kth ? exp(x - m) : 0.0;
        e[j] = ej;
        z += smp_mass(ej);
    }

    /* 4 top-p: the largest tail of the order (the top token excepted)
     * whose weight is <= (1 - top_p) of the total is dropped; found by a
     * radix select over the keys, weighing each bin. Tokens of weight 0
     * (exp underflowed) are dropped either way and left out. The result:
     * a token drops iff its key < cut_key, or == cut_key and its index >
     * cut_idx. */
    const int top_p = a.top_p < 1.0;
    u32 cut_key = 0;
    int cut_idx = V;
    if (top_p) {
        if (tid == 0)
            s_u64[0] = 0;
        __syncthreads();
        atomicAdd(&s_u64[0], z);
        __syncthreads();
        const unsigned long long cap = (unsigned long long)((1.0 - a.top_p) * (double)s_u64[0]);
        unsigned long long below = 0; /* weight of the tokens under the current range */
        u32 prefix = 0;
        int all_fit = 0, shift = 24;
        for (; shift >= 0; shift -= 8) {
            for (int b = tid; b < 256; b += SMP_THREADS) {
                h_cnt[b] = 0;
                h_mass[b] = 0;
            }
            __syncthreads();
            for (int j = tid; j < V; j += SMP_THREADS) {
                const double ej = e[j];
                const u32 k = smp_key(l[j]);
                if (ej == 0.0 || j == top || (shift < 24 && (k >> (shift + 8)) != prefix))
                    continue;
                atomicAdd(&h_mass[(k >> shift) & 255u], smp_mass(ej));
                atomicAdd(&h_cnt[(k >> shift) & 255u], 1u);
            }
            __syncthreads();
            if (tid == 0) {
                unsigned long long acc = below;
                int b = 0;
                for (; b < 256 && acc + h_mass[b] <= cap; b++)
                    acc += h_mass[b];
                s_int[2] = b;
                s_u64[1] = acc;
            }
            __syncthreads();
            const int b = s_int[2];
            below = s_u64[1];
            if (b == 256) { /* the whole range fits: it drops with everything under it */
                all_fit = 1;
                break;
            }
            prefix = (prefix << 8) | (u32)b;
            if (shift == 0) { /* the edge is inside the tokens of key `prefix` */
                const u32 cnt = h_cnt[b];
                const unsigned long long each = h_mass[b] / cnt;
                const unsigned long long d = (cap - below) / each; /* of them the last d drop */
                cut_key = prefix;
                if (d > 0) {
                    /* keep the cnt - d of lowest index: find the index of
                     * rank cnt - d among them (chunks in index order) */
                    const int r = (int)(cnt - d);
                    const int chunk = (V + SMP_THREADS - 1) / SMP_THREADS;
                    const int j0 = tid * chunk, j1 = min(V, j0 + chunk);
                    int c = 0;
                    for (int j = j0; j < j1; j++)
                        c += j != top && e[j] != 0.0 && smp_key(l[j]) == prefix;
                    __syncthreads();
                    part[tid] = (double)c;
                    __syncthreads();
                    if (tid == 0) {
                        double run = 0;
                        for (int t = 0; t < SMP_THREADS; t++) {
                            const double ct = part[t];
                            part[t] = run;
                            run += ct;
                        }
                    }
                    __syncthreads();
                    int seen = (int)part[tid];
                    if (seen < r && seen + c >= r)
                        for (int j = j0; j < j1; j++)
                            if (j != top && e[j] != 0.0 && smp_key(l[j]) == prefix && ++seen == r)
                                s_int[3] = j;
                    __syncthreads();
                    cut_idx = s_int[3];
                }
            }
            __syncthreads();
        }
        if (all_fit) { /* every key up to the top of the range drops */
            const unsigned long long top_of_range =
                shift == 24 ? 0xffffffffull : ((((unsigned long long)prefix + 1) << (shift + 8)) - 1);
            cut_key = (u32)top_of_range;
            cut_idx = -1;
        }
    }

    /* 5 min-p and top-p's drops applied; each thread's contiguous chunk
     * summed in index order (chunks hold other threads' writes of 3) */
    __syncthreads();
    const int chunk = (V + SMP_THREADS - 1) / SMP_THREADS;
    const int j0 = tid * chunk, j1 = min(V, j0 + chunk);
    double s = 0;
    int last = -1;
    for (int j = j0; j < j1; j++) {
        double ej = e[j];
        if (ej == 0.0)
            continue;
        if (top_p && j != top) {
            const u32 k = smp_key(l[j]);
            if (k < cut_key || (k == cut_key && j > cut_idx))
                ej = 0.0;
        }
        if (ej < a.min_p)
            ej = 0.0;
        if (ej == 0.0) {
            e[j] = 0.0;
            continue;
        }
        s += ej;
        last = j;
    }
    __syncthreads();
    part[tid] = s;
    if (tid == 0)
        s_int[2] = -1;
    __syncthreads();
    if (tid == 0) { /* prefix sums in thread order: part[t + 1] == part[t] + the sum of chunk t, exactly */
        double run = 0;
        for (int t = 0; t < SMP_THREADS; t++) {
            const double st = part[t];
            part[t] = run;
            run += st;
        }
        part[SMP_THREADS] = run;
    }
    __syncthreads();

    /* 6 inverse CDF: the first token whose running sum passes u * total;
     * the chunk holding it walks its sums again in the same order, so it
     * passes inside the chunk */
    const double target = smp_uniform_at(a.seed, a.pos) * part[SMP_THREADS];
    if (part[tid] <= target && target < part[tid] + s) {
        double run = 0;
        for (int j = j0; j < j1; j++) {
            const double ej = e[j];
            if (ej == 0.0)
                continue;
            run += ej;
            if (part[tid] + run > target) {
                s_int[2] = j;
                break;
            }
        }
    }
    /* rounding left u * total at or past the end: the last token with mass */
    int hi = last;
    for (int o = 16; o > 0; o >>= 1)
        hi = max(hi, __shfl_xor_sync(0xffffffffu, hi, o));
    __syncthreads();
    if ((tid & 31) == 0)
        si[tid >> 5] = hi;
    __syncthreads();
    if (tid == 0) {
        int ans = s_int[2];
        if (ans < 0)
            for (int w = 0; w < SMP_THREADS / 32; w++)
                ans = max(ans, si[w]);
        out[blockIdx.x] = ans;
    }
}
