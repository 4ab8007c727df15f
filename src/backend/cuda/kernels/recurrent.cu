/* recurrent.cu: the recurrent-state primitives of a linear-attention layer
 * (a Qwen3.5's Gated DeltaNet), each walking a sequence's rows in order
 * from its state slot: conv_silu (causal depthwise convolution with its
 * rolling window, then SiLU) and delta_rule (the gated delta rule). Per
 * sequence a record of DFLASH_REC_INFO_LEN ints (backend.h): row0, n_rows,
 * slot_in (-1: zeros), slot_out, snap, slot_snap.
 *
 * Each thread owns what it updates: a channel's window (conv_silu), a
 * value column of one head's state (delta_rule), so a slot may be read and
 * written by the same call with no race. The convolution's and the state's
 * sums run in the CPU reference's order, the L2 norms' sums of squares in a
 * tree; products may fuse into fmas, so results agree with the CPU within
 * rounding, and with themselves bit for bit however a sequence's rows are
 * split into calls. */
#include "common.cuh"

#if !defined(DFLASH_REC_INFO_LEN) || !defined(DFLASH_CONV_MAX_KERNEL)
#error "compile with -DDFLASH_REC_INFO_LEN=... -DDFLASH_CONV_MAX_KERNEL=... (cuda_compile.c passes them)"
#endif

#define REC_MAX_KERNEL DFLASH_CONV_MAX_KERNEL

/* grid (channel blocks, sequences), block 128: one channel per thread. */
extern "C" __global__ void dflash_conv_silu(const int *info, float *state, i64 slot_stride, const float *x,
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
    const int row0 = f[0], rows = f[1], snap = f[4];
    const float *w_in = f[2] < 0 ? 0 : state + f[2] * slot_stride;
    float *w_out = state + f[3] * slot_stride, *w_snap = state + f[5] * slot_stride;
#pragma unroll
    for (int i = 0; i < REC_MAX_KERNEL - 1; i++)
        win[i] = i < hist && w_in ? w_in[(i64)i * channels + c] : 0.0f;
    for (int t = 0; t < rows; t++) {
        const float xt = x[(i64)(row0 + t) * channels + c];
        float acc = 0.0f;
#pragma unroll
        for (int i = 0; i < REC_MAX_KERNEL - 1; i++)
            if (i < hist)
                acc += wc[i] * win[i];
        acc += wc[hist] * xt;
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
        if (t + 1 == snap)
#pragma unroll
            for (int i = 0; i < REC_MAX_KERNEL - 1; i++)
                if (i < hist)
                    w_snap[(i64)i * channels + c] = win[i];
    }
#pragma unroll
    for (int i = 0; i < REC_MAX_KERNEL - 1; i++)
        if (i < hist)
            w_out[(i64)i * channels + c] = win[i];
}

#define REC_MAX_DK 128

/* The sum of squares of v[0..dim) over the block (every thread gets it),
 * in a tree: scratch [32]. */
__forceinline__ float block_sumsq(const float *v, int dim, float *scratch)
{
    float ss = 0.0f;
    for (int i = threadIdx.x; i < dim; i += blockDim.x)
        ss += v[i] * v[i];
    ss = block_sum(ss, scratch);
    return ss;
}

/* grid (value heads, sequences), block: a multiple of 32 covering both
 * k_dim (<= REC_MAX_DK) and v_dim (<= 256). Thread e holds column e of the
 * head's state S [k_dim, v_dim] for all of the sequence's rows. */
extern "C" __global__ void __launch_bounds__(256) dflash_delta_rule(const int *info, float *state, i64 slot_stride, const float *y,
                                             const float *a_in, const float *b_in, const void *A_log, int adt,
                                             const void *dt_bias, int ddt, int n_k_heads, int n_v_heads, int dk,
                                             int dv, float *out)
{
    __shared__ float qn[REC_MAX_DK], kn[REC_MAX_DK], scratch[32];
    pdl_trigger();
    const int j = blockIdx.x, e = threadIdx.x, h = j / (n_v_heads / n_k_heads);
    const float neg_a = -expf(load_elem(A_log, adt, j)), bias = load_elem(dt_bias, ddt, j);
    pdl_wait();
    const int *f = info + blockIdx.y * DFLASH_REC_INFO_LEN;
    const int row0 = f[0], rows = f[1], snap = f[4];
    const i64 head = (i64)dk * dv, Kd = (i64)n_k_heads * dk, C = 2 * Kd + (i64)n_v_heads * dv;
    const float *s_in = f[2] < 0 ? 0 : state + f[2] * slot_stride + j * head;
    float *s_out = state + f[3] * slot_stride + j * head, *s_snap = state + f[5] * slot_stride + j * head;
    const bool col = e < dv;
    float S[REC_MAX_DK];
#pragma unroll
    for (int d = 0; d < REC_MAX_DK; d++)
        S[d] = col && d < dk && s_in ? s_in[(i64)d * dv + e] : 0.0f;
    const float scale = 1.0f / sqrtf((float)dk);
    for (int t = 0; t < rows; t++) {
        const i64 i = row0 + t;
        const float *yr = y + i * C;
        /* q and k of key head h, each over its L2 norm; q also times dk^-1/2 */
        const float q_inv = 1.0f / sqrtf(block_sumsq(yr + (i64)h * dk, dk, scratch) + 1e-6f);
        const float k_inv = 1.0f / sqrtf(block_sumsq(yr + Kd + (i64)h * dk, dk, scratch) + 1e-6f);
        for (int d = threadIdx.x; d < dk; d += blockDim.x) {
            qn[d] = yr[(i64)h * dk + d] * q_inv * scale;
            kn[d] = yr[Kd + (i64)h * dk + d] * k_inv;
        }
        __syncthreads();
        const float beta = 1.0f / (1.0f + expf(-b_in[i * n_v_heads + j]));
        const float xa = a_in[i * n_v_heads + j] + bias;
        const float decay = expf(neg_a * (xa > 20.0f ? xa : log1pf(expf(xa))));
        if (col) {
            const float v = yr[2 * Kd + (i64)j * dv + e];
            float kv = 0.0f;
#pragma unroll
            for (int d = 0; d < REC_MAX_DK; d++)
                if (d < dk) {
                    S[d] *= decay;
                    kv += S[d] * kn[d];
                }
            const float delta = (v - kv) * beta;
            float o = 0.0f;
#pragma unroll
            for (int d = 0; d < REC_MAX_DK; d++)
                if (d < dk) {
                    S[d] += kn[d] * delta;
                    o += S[d] * qn[d];
                }
            out[i * n_v_heads * dv + (i64)j * dv + e] = o;
            if (t + 1 == snap)
#pragma unroll
                for (int d = 0; d < REC_MAX_DK; d++)
                    if (d < dk)
                        s_snap[(i64)d * dv + e] = S[d];
        }
        __syncthreads(); /* qn and kn are rewritten by the next row */
    }
    if (col)
#pragma unroll
        for (int d = 0; d < REC_MAX_DK; d++)
            if (d < dk)
                s_out[(i64)d * dv + e] = S[d];
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
