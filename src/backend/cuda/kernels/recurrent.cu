/* recurrent.cu: the recurrent-state primitives of a linear-attention layer
 * (a Qwen3.5's Gated DeltaNet), each walking a sequence's rows in order
 * and keeping what later rows need in the sequence's record, laid out by
 * absolute position (backend.h, dflash_rec_args; an entry of
 * DFLASH_REC_INFO_LEN ints per sequence: row0, n_rows, pos0, rec):
 * conv_silu (causal depthwise convolution over the inputs by position,
 * then SiLU) and delta_rule (the gated delta rule in its chunked form).
 *
 * Each thread owns what it updates: a channel (conv_silu), a value column
 * of one head's chunk state and row updates (delta_rule), so a record is
 * read and written by the same call with no race. Sums run in the CPU
 * reference's order, the L2 norms' sums of squares in a tree; products
 * may fuse into fmas, so results agree with the CPU within rounding, and
 * with themselves bit for bit however a sequence's rows are split into
 * calls. */
#include "common.cuh"

#if !defined(DFLASH_REC_INFO_LEN) || !defined(DFLASH_CONV_MAX_KERNEL) || !defined(DFLASH_REC_ROWS) || \
    !defined(DFLASH_REC_CHUNK) || !defined(DFLASH_REC_CHUNK_STATES)
#error "compile with -DDFLASH_REC_INFO_LEN=... -DDFLASH_CONV_MAX_KERNEL=... -DDFLASH_REC_ROWS=... (cuda_compile.c passes them)"
#endif

#define REC_MAX_KERNEL DFLASH_CONV_MAX_KERNEL
#define REC_ROWS DFLASH_REC_ROWS
#define REC_CHUNK DFLASH_REC_CHUNK
static_assert(REC_ROWS % REC_CHUNK == 0, "a chunk's rows are contiguous in the record's ring");

/* grid (channel blocks, sequences), block 128: one channel per thread.
 * The window of earlier inputs stays in registers; each row's input is
 * written to the record's slot for its position. */
extern "C" __global__ void dflash_conv_silu(const int *info, float *state, i64 rec_stride, const float *x,
                                            const void *w, int wdt, int channels, int kernel, float *out)
{
    pdl_trigger();
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= channels)
        return;
    const int hist = kernel - 1;
    float wc[REC_MAX_KERNEL], win[REC_MAX_KERNEL];
#pragma unroll
    for (int i = 0; i < REC_MAX_KERNEL; i++)
        wc[i] = i < kernel ? load_elem(w, wdt, (i64)c * kernel + i) : 0.0f;
    pdl_wait();
    const int *f = info + blockIdx.y * DFLASH_REC_INFO_LEN;
    const int row0 = f[0], rows = f[1], pos0 = f[2];
    float *ring = state + f[3] * rec_stride;
    /* win[i]: the input at position pos0 - hist + i (nothing before 0) */
#pragma unroll
    for (int i = 0; i < REC_MAX_KERNEL - 1; i++) {
        const int pi = pos0 - hist + i;
        win[i] = i < hist && pi >= 0 ? ring[(i64)(pi % REC_ROWS) * channels + c] : 0.0f;
    }
    for (int t = 0; t < rows; t++) {
        const int p = pos0 + t;
        const float xt = x[(i64)(row0 + t) * channels + c];
        ring[(i64)(p % REC_ROWS) * channels + c] = xt;
        float acc = 0.0f;
#pragma unroll
        for (int i = 0; i < REC_MAX_KERNEL - 1; i++)
            if (i < hist && p - hist + i >= 0)
                acc += wc[i] * win[i];
#pragma unroll
        for (int i = 0; i < REC_MAX_KERNEL; i++) /* a static index keeps wc in registers */
            if (i == hist)
                acc += wc[i] * xt;
        out[(i64)(row0 + t) * channels + c] = acc / (1.0f + expf(-acc));
#pragma unroll
        for (int i = 0; i < REC_MAX_KERNEL - 2; i++)
            if (i + 1 < hist)
                win[i] = win[i + 1];
        if (hist) {
#pragma unroll
            for (int i = 0; i < REC_MAX_KERNEL - 1; i++)
                if (i == hist - 1)
                    win[i] = xt;
        }
    }
}

#define REC_MAX_DK 128
#define KS_STRIDE (REC_MAX_DK + 1) /* a padded row: thread s reading row s hits its own bank */

/* block_sum of two values at once (the same tree for each, one pair of
 * barriers): scratch [2][32]. */
__forceinline__ float2 block_sum2(float a, float b, float *scratch)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    a = warp_sum(a);
    b = warp_sum(b);
    __syncthreads(); /* scratch may still be read by a previous call */
    if (lane == 0) {
        scratch[warp] = a;
        scratch[32 + warp] = b;
    }
    __syncthreads();
    a = lane < nw ? scratch[lane] : 0.0f;
    b = lane < nw ? scratch[32 + lane] : 0.0f;
    return make_float2(warp_sum(a), warp_sum(b));
}

/* grid (value heads, sequences), block: a multiple of 32 covering k_dim
 * (<= REC_MAX_DK), v_dim (<= 256) and the chunk's rows. Thread e holds
 * column e of the head's chunk-start state S [k_dim, v_dim] and owns
 * column e of every row's update d (read back from the record, where only
 * it writes); the chunk's normalised k rows and cumulative decays sit in
 * shared memory (35 KB: the updates there too would need more than the
 * 48 KB a launch gets without opting in, and opting in measured slower:
 * the SM changes its shared memory carveout around each launch). Record
 * layout: backend.h, dflash_delta_rec_size. */
extern "C" __global__ void __launch_bounds__(256) dflash_delta_rule(const int *info, float *state, i64 rec_stride,
                                             const float *y, const float *a_in, const float *b_in, const void *A_log,
                                             int adt, const void *dt_bias, int ddt, int n_k_heads, int n_v_heads,
                                             int dk, int dv, float *out)
{
    __shared__ float ks[REC_CHUNK * KS_STRIDE]; /* row c0 + s at s * KS_STRIDE */
    __shared__ float qn[REC_MAX_DK], kn[REC_MAX_DK], Gs[REC_CHUNK], ck[REC_CHUNK], cq[REC_CHUNK], scratch[64];
    pdl_trigger();
    const int j = blockIdx.x, e = threadIdx.x, h = j / (n_v_heads / n_k_heads);
    const float neg_a = -expf(load_elem(A_log, adt, j)), bias = load_elem(dt_bias, ddt, j);
    pdl_wait();
    const int *f = info + blockIdx.y * DFLASH_REC_INFO_LEN;
    const int row0 = f[0], rows = f[1], pos0 = f[2];
    const i64 head = (i64)dk * dv, slot = (i64)dk + dv + 1, Kd = (i64)n_k_heads * dk, C = 2 * Kd + (i64)n_v_heads * dv;
    float *rec = state + f[3] * rec_stride;
    float *states = rec + j * head;                                        /* chunk m at (m % STATES) * Hv * head */
    float *slots = rec + DFLASH_REC_CHUNK_STATES * n_v_heads * head + j * slot; /* row p at (p % ROWS) * Hv * slot */
    const i64 state_stride = n_v_heads * head, slot_stride = n_v_heads * slot;
    const bool col = e < dv;
    int c0 = pos0 - pos0 % REC_CHUNK;
    float S[REC_MAX_DK];
#pragma unroll
    for (int d = 0; d < REC_MAX_DK; d++)
        S[d] = col && d < dk && c0 > 0
                   ? states[(c0 / REC_CHUNK % DFLASH_REC_CHUNK_STATES) * state_stride + (i64)d * dv + e]
                   : 0.0f;
    for (int i = threadIdx.x; i < (pos0 - c0) * dk; i += blockDim.x) {
        const int s = i / dk, d = i - s * dk;
        ks[s * KS_STRIDE + d] = slots[((c0 + s) % REC_ROWS) * slot_stride + d];
    }
    for (int s = threadIdx.x; s < pos0 - c0; s += blockDim.x)
        Gs[s] = slots[((c0 + s) % REC_ROWS) * slot_stride + dk + dv];
    const float scale = 1.0f / sqrtf((float)dk);
    for (int t = 0; t < rows; t++) {
        const int p = pos0 + t, n = p - c0;
        const i64 i = row0 + t;
        float *me = slots + (p % REC_ROWS) * slot_stride;
        const float *yr = y + i * C;
        if (p == 0 && col) /* the CPU writes the first chunk's (zero) start state too */
            for (int d = 0; d < dk; d++)
                states[(i64)d * dv + e] = 0.0f;
        /* The row's inputs requested together (thread d holds q[d] and
         * k[d]: the block covers dk); then q and k of key head h, each
         * over its L2 norm (both sums in one reduction), q also times
         * dk^-1/2. */
        const bool kd_own = threadIdx.x < dk;
        const float qv = kd_own ? yr[(i64)h * dk + threadIdx.x] : 0.0f;
        const float kv = kd_own ? yr[Kd + (i64)h * dk + threadIdx.x] : 0.0f;
        const float vv = col ? yr[2 * Kd + (i64)j * dv + e] : 0.0f;
        const float b_raw = b_in[i * n_v_heads + j], xa = a_in[i * n_v_heads + j] + bias;
        const float2 ss = block_sum2(qv * qv, kv * kv, scratch);
        const float q_inv = 1.0f / sqrtf(ss.x + 1e-6f), k_inv = 1.0f / sqrtf(ss.y + 1e-6f);
        const float beta = 1.0f / (1.0f + expf(-b_raw));
        const float g = neg_a * (xa > 20.0f ? xa : log1pf(expf(xa)));
        const float G = (n == 0 ? 0.0f : Gs[n - 1]) + g, eG = expf(G);
        if (kd_own) {
            const int d = threadIdx.x;
            const float kd = kv * k_inv;
            qn[d] = qv * q_inv * scale;
            kn[d] = kd;
            ks[n * KS_STRIDE + d] = kd;
            me[d] = kd;
        }
        if (threadIdx.x == 0) {
            Gs[n] = G;
            me[dk + dv] = G;
        }
        __syncthreads();
        /* thread s: exp(G - G_s) times k_s . k and k_s . q, in d order */
        if (threadIdx.x <= n) {
            const int s = threadIdx.x;
            const float ex = expf(G - Gs[s]);
            float kk = 0.0f, kq = 0.0f;
            for (int d = 0; d < dk; d++) {
                kk += ks[s * KS_STRIDE + d] * kn[d];
                kq += ks[s * KS_STRIDE + d] * qn[d];
            }
            ck[s] = ex * kk;
            cq[s] = ex * kq;
        }
        __syncthreads();
        if (col) {
            float u = 0.0f, sq = 0.0f;
#pragma unroll
            for (int d = 0; d < REC_MAX_DK; d++)
                if (d < dk) {
                    u += S[d] * kn[d];
                    sq += S[d] * qn[d];
                }
            /* the chunk's earlier updates, each read once for both sums
             * (in s order each); a chunk never wraps in the record's ring */
            float w = 0.0f, acc = eG * sq;
            const float *ds = slots + (i64)(c0 % REC_ROWS) * slot_stride + dk + e;
#pragma unroll 8
            for (int s = 0; s < n; s++) {
                const float d_s = ds[(i64)s * slot_stride];
                w += ck[s] * d_s;
                acc += cq[s] * d_s;
            }
            const float eu = eG * u, upd = ((vv - eu) - w) * beta;
            me[dk + e] = upd;
            acc += cq[n] * upd;
            out[i * n_v_heads * dv + (i64)j * dv + e] = acc;
        }
        if (n == REC_CHUNK - 1) { /* the next chunk's start state */
            __syncthreads();
            if (threadIdx.x < REC_CHUNK)
                ck[threadIdx.x] = expf(G - Gs[threadIdx.x]);
            __syncthreads();
            if (col) {
#pragma unroll
                for (int d = 0; d < REC_MAX_DK; d++)
                    S[d] *= eG;
                for (int s = 0; s < REC_CHUNK; s++) {
                    const float ds = slots[((c0 + s) % REC_ROWS) * slot_stride + dk + e], ex = ck[s];
#pragma unroll
                    for (int d = 0; d < REC_MAX_DK; d++)
                        if (d < dk)
                            S[d] += ex * ks[s * KS_STRIDE + d] * ds;
                }
                float *next = states + ((p + 1) / REC_CHUNK % DFLASH_REC_CHUNK_STATES) * state_stride;
#pragma unroll
                for (int d = 0; d < REC_MAX_DK; d++)
                    if (d < dk)
                        next[(i64)d * dv + e] = S[d];
            }
            c0 += REC_CHUNK;
        }
        __syncthreads(); /* qn, kn, ks, Gs, ck and cq are rewritten by the next row */
    }
}

/* x[i, c] *= sigmoid(g[i * g_cols + (g_cols == 1 ? 0 : c)]) over n * cols */
extern "C" __global__ void dflash_sigmoid_mul(float *x, const float *g, i64 n, i64 cols, i64 g_cols)
{
    pdl_trigger();
    pdl_wait();
    const i64 stride = (i64)gridDim.x * blockDim.x;
    for (i64 t = (i64)blockIdx.x * blockDim.x + threadIdx.x; t < n * cols; t += stride) {
        const i64 i = t / cols, c = t - i * cols;
        const float gv = g[i * g_cols + (g_cols == 1 ? 0 : c)];
        x[t] *= 1.0f / (1.0f + expf(-gv));
    }
}
