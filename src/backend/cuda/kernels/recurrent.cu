/* recurrent.cu: the recurrent-state primitives of a linear-attention layer
 * (a Qwen3.5's Gated DeltaNet), each walking a sequence's rows in order
 * and keeping what later rows need in the sequence's record, laid out by
 * absolute position (backend.h, dflash_rec_args; an entry of
 * DFLASH_REC_INFO_LEN ints per sequence: row0, n_rows, pos0, rec):
 * conv_silu (causal depthwise convolution over the inputs by position,
 * then SiLU) and delta_rule (the gated delta rule in its chunked form).
 *
 * Each thread owns what it updates: a channel (conv_silu), every 8th
 * state row of a value column of one head's chunk state (delta_rule; one
 * of a column's 8 threads writes its row updates), so a record is read
 * and written by the same call with no race. conv_silu sums in the CPU
 * reference's order with products free to fuse into fmas; delta_rule's
 * sums have orders of their own, every rounding explicit. Results agree
 * with the CPU within rounding, and with themselves bit for bit however a
 * sequence's rows are split into calls. */
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
#define KS_STRIDE (REC_MAX_DK + 1) /* a padded row: a warp reading one row's 32 lanes hits 32 banks */
#define DR_COLS 32                 /* value columns of one head a block owns */
#define DR_PARTS 8                 /* threads sharing a column, each every 8th state row */
#define DR_THREADS (DR_COLS * DR_PARTS)
#define DR_WARPS (DR_THREADS / 32)
#define DR_ROWS_PER (REC_MAX_DK / DR_PARTS) /* state rows a thread holds */
#define DR_LANE (REC_MAX_DK / 32)           /* q and k elements a lane holds */
#define DR_DS_STRIDE (DR_COLS + 4)          /* a warp's (part, column) pairs on 32 banks */
static_assert(DR_PARTS * (DR_DS_STRIDE % 32) == 32, "ds reads of a warp conflict-free");
static_assert(REC_MAX_DK <= DR_THREADS, "a thread per element of q and k");

/* One row's inputs, requested a row ahead: lane l holds q and k elements
 * l + 32 m (every warp the whole row: the norms need no barrier), v of
 * the thread's column, the raw a and b of the head. */
struct dr_row {
    float q[DR_LANE], k[DR_LANE], v, a, b;
};

template <bool FULL>
__forceinline__ void dr_load(dr_row &r, const float *yr, const float *a_in, const float *b_in, i64 i, int h, int j,
                             int e, int dk, int dv, int n_v_heads, i64 Kd)
{
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int m = 0; m < DR_LANE; m++) {
        const int d = lane + 32 * m;
        r.q[m] = FULL || d < dk ? yr[(i64)h * dk + d] : 0.0f;
        r.k[m] = FULL || d < dk ? yr[Kd + (i64)h * dk + d] : 0.0f;
    }
    r.v = e < dv ? yr[2 * Kd + (i64)j * dv + e] : 0.0f;
    r.a = a_in[i * n_v_heads + j];
    r.b = b_in[i * n_v_heads + j];
}

/* Sum of a value over the DR_PARTS threads of a column (adjacent lanes):
 * every one of them gets the same bits (each level adds a commutative
 * pair). */
__forceinline__ float dr_part_sum(float x)
{
#pragma unroll
    for (int o = 1; o < DR_PARTS; o <<= 1)
        x = __fadd_rn(x, __shfl_xor_sync(0xffffffffu, x, o));
    return x;
}

/* grid (value heads x column blocks of DR_COLS, sequences), block
 * DR_THREADS: thread (c, part) = (tid / 8, tid % 8) holds the rows d =
 * 8 i + part of column e = block's first + c of the head's chunk-start
 * state S [k_dim, v_dim] (16 registers), so a row's S^T k is 16 products
 * a thread and three shuffles, and a head's 128 columns are 4 blocks on 4
 * SMs. The chunk's normalised k rows and cumulative decays, and the
 * block's columns of the chunk's row updates, sit in shared memory (45
 * KB): the updates are read from the record only for rows an earlier
 * call wrote. Per row two barriers: after the row's q, k and decay are
 * stored, after the (earlier row, row) dot products, a warp per earlier
 * row (its lanes over k_dim). Every sum has a fixed order (explicit
 * roundings), so a row's bits do not depend on the rows that share its
 * call. A launch takes rows t0 .. t0 + REC_CHUNK - 1 of each sequence's
 * call (the launcher walks the windows): the row slots it writes then
 * never wrap onto the ones another block of the head reads at its start
 * (the chunk's earlier k rows and decays; the ring holds two chunks).
 * FULL: k_dim == REC_MAX_DK, every bound test compiled away. Record
 * layout: backend.h, dflash_delta_rec_size. */
template <bool FULL>
__forceinline__ void delta_rule_body(const int *info, float *state, i64 rec_stride, const float *y, const float *a_in,
                                     const float *b_in, const void *A_log, int adt, const void *dt_bias, int ddt,
                                     int n_k_heads, int n_v_heads, int dk, int dv, int t0, float *out)
{
    __shared__ float ks[REC_CHUNK * KS_STRIDE];    /* k row of chunk row s at s * KS_STRIDE */
    __shared__ float ds[REC_CHUNK * DR_DS_STRIDE]; /* update of chunk row s, column c at s * stride + c */
    __shared__ float qn[2][REC_MAX_DK], kn[2][REC_MAX_DK]; /* the row's (alternating: a slow thread may
                                                            * still read the previous row's) */
    __shared__ float ck[REC_CHUNK], cq[REC_CHUNK], Gs[REC_CHUNK];
    if (FULL)
        dk = REC_MAX_DK;
    pdl_trigger();
    const int n_cb = (dv + DR_COLS - 1) / DR_COLS, j = blockIdx.x / n_cb, cb = blockIdx.x - j * n_cb;
    const int tid = threadIdx.x, c = tid / DR_PARTS, part = tid % DR_PARTS, warp = tid >> 5, lane = tid & 31;
    const int e = cb * DR_COLS + c, h = j / (n_v_heads / n_k_heads);
    const bool col = e < dv;
    const float neg_a = -expf(load_elem(A_log, adt, j)), bias = load_elem(dt_bias, ddt, j);
    pdl_wait();
    const int *f = info + blockIdx.y * DFLASH_REC_INFO_LEN;
    const int row0 = f[0] + t0, rows = min(f[1] - t0, REC_CHUNK), pos0 = f[2] + t0;
    if (rows <= 0)
        return;
    const i64 head = (i64)dk * dv, slot = (i64)dk + dv + 1, Kd = (i64)n_k_heads * dk, C = 2 * Kd + (i64)n_v_heads * dv;
    float *rec = state + f[3] * rec_stride;
    float *states = rec + j * head;                                        /* chunk m at (m % STATES) * Hv * head */
    float *slots = rec + DFLASH_REC_CHUNK_STATES * n_v_heads * head + j * slot; /* row p at (p % ROWS) * Hv * slot */
    const i64 state_stride = n_v_heads * head, slot_stride = n_v_heads * slot;
    int c0 = pos0 - pos0 % REC_CHUNK;
    float S[DR_ROWS_PER];
#pragma unroll
    for (int i = 0; i < DR_ROWS_PER; i++) {
        const int d = DR_PARTS * i + part;
        const bool in = col && (FULL || d < dk);
        S[i] = in && c0 > 0 ? states[(c0 / REC_CHUNK % DFLASH_REC_CHUNK_STATES) * state_stride + (i64)d * dv + e]
                            : 0.0f;
        if (in && pos0 == 0) /* the CPU writes the first chunk's (zero) start state too */
            states[(i64)d * dv + e] = 0.0f;
    }
    /* the chunk's rows an earlier call took: k rows, decays, updates */
    for (int i = tid; i < (pos0 - c0) * dk; i += DR_THREADS) {
        const int s = i / dk, d = i - s * dk;
        ks[s * KS_STRIDE + d] = slots[((c0 + s) % REC_ROWS) * slot_stride + d];
    }
    for (int s = tid; s < pos0 - c0; s += DR_THREADS)
        Gs[s] = slots[((c0 + s) % REC_ROWS) * slot_stride + dk + dv];
    if (col)
        for (int s = part; s < pos0 - c0; s += DR_PARTS)
            ds[s * DR_DS_STRIDE + c] = slots[((c0 + s) % REC_ROWS) * slot_stride + dk + e];
    const float scale = 1.0f / sqrtf((float)dk);
    dr_row cur, nxt;
    dr_load<FULL>(cur, y + (i64)row0 * C, a_in, b_in, row0, h, j, e, dk, dv, n_v_heads, Kd);
    nxt = cur;
    __syncthreads();
    for (int t = 0; t < rows; t++) {
        const int p = pos0 + t, n = p - c0, buf = t & 1;
        const i64 i = row0 + t;
        float *me = slots + (p % REC_ROWS) * slot_stride;
        if (t + 1 < rows) /* the next row's inputs in flight while this one runs */
            dr_load<FULL>(nxt, y + (i + 1) * C, a_in, b_in, i + 1, h, j, e, dk, dv, n_v_heads, Kd);
        /* q and k over their L2 norms (q also times dk^-1/2): each warp
         * sums the whole row, elements in m order then the lanes' tree */
        float qq = 0.0f, kk = 0.0f;
#pragma unroll
        for (int m = 0; m < DR_LANE; m++) {
            qq = __fmaf_rn(cur.q[m], cur.q[m], qq);
            kk = __fmaf_rn(cur.k[m], cur.k[m], kk);
        }
        qq = warp_sum(qq);
        kk = warp_sum(kk);
        const float q_inv = 1.0f / sqrtf(qq + 1e-6f), k_inv = 1.0f / sqrtf(kk + 1e-6f);
        const float beta = 1.0f / (1.0f + expf(-cur.b)), xa = cur.a + bias;
        const float g = neg_a * (xa > 20.0f ? xa : log1pf(expf(xa)));
        const float G = (n == 0 ? 0.0f : Gs[n - 1]) + g, eG = expf(G);
        if (tid < dk) { /* element tid: this warp's m = warp */
            float qv = 0.0f, kv = 0.0f;
#pragma unroll
            for (int m = 0; m < DR_LANE; m++)
                if (m == warp) {
                    qv = cur.q[m];
                    kv = cur.k[m];
                }
            const float kd = kv * k_inv;
            qn[buf][tid] = qv * q_inv * scale;
            kn[buf][tid] = kd;
            ks[n * KS_STRIDE + tid] = kd;
            if (cb == 0)
                me[tid] = kd;
        }
        if (tid == 0) {
            Gs[n] = G;
            if (cb == 0)
                me[dk + dv] = G;
        }
        __syncthreads();
        /* a warp per earlier row s <= n: exp(G - G_s) times k_s . k and
         * k_s . q, lane l taking elements l + 32 m in m order, then the
         * lanes' tree */
        {
            float kr[DR_LANE], qr[DR_LANE];
#pragma unroll
            for (int m = 0; m < DR_LANE; m++) {
                const int d = lane + 32 * m;
                kr[m] = FULL || d < dk ? kn[buf][d] : 0.0f;
                qr[m] = FULL || d < dk ? qn[buf][d] : 0.0f;
            }
#pragma unroll 2
            for (int s = warp; s <= n; s += DR_WARPS) {
                float pk = 0.0f, pq = 0.0f;
#pragma unroll
                for (int m = 0; m < DR_LANE; m++) {
                    const int d = lane + 32 * m;
                    const float x = FULL || d < dk ? ks[s * KS_STRIDE + d] : 0.0f;
                    pk = __fmaf_rn(x, kr[m], pk);
                    pq = __fmaf_rn(x, qr[m], pq);
                }
                pk = warp_sum(pk);
                pq = warp_sum(pq);
                if (lane == 0) {
                    const float ex = expf(G - Gs[s]);
                    ck[s] = __fmul_rn(ex, pk);
                    cq[s] = __fmul_rn(ex, pq);
                }
            }
        }
        __syncthreads();
        /* column e: the start state's S^T k and S^T q, then the chunk's
         * earlier updates (rows s = part mod 8 here), each summed over
         * the column's 8 threads */
        float u = 0.0f, sq = 0.0f, w = 0.0f, acc = 0.0f;
#pragma unroll
        for (int ii = 0; ii < DR_ROWS_PER; ii++) {
            const int d = DR_PARTS * ii + part;
            if (FULL || d < dk) {
                u = __fmaf_rn(S[ii], kn[buf][d], u);
                sq = __fmaf_rn(S[ii], qn[buf][d], sq);
            }
        }
        if (col)
            for (int s = part; s < n; s += DR_PARTS) {
                const float d_s = ds[s * DR_DS_STRIDE + c];
                w = __fmaf_rn(ck[s], d_s, w);
                acc = __fmaf_rn(cq[s], d_s, acc);
            }
        u = dr_part_sum(u);
        sq = dr_part_sum(sq);
        w = dr_part_sum(w);
        acc = dr_part_sum(acc);
        const float upd = __fmul_rn(__fsub_rn(__fsub_rn(cur.v, __fmul_rn(eG, u)), w), beta);
        if (col) {
            if (part == n % DR_PARTS) /* the thread that reads row n back */
                ds[n * DR_DS_STRIDE + c] = upd;
            if (part == 0) {
                me[dk + e] = upd;
                out[i * n_v_heads * dv + (i64)j * dv + e] =
                    __fmaf_rn(cq[n], upd, __fadd_rn(__fmul_rn(eG, sq), acc));
            }
        }
        if (n == REC_CHUNK - 1) { /* the next chunk's start state */
            __syncthreads();      /* every row's update in ds */
            if (col) {
#pragma unroll
                for (int ii = 0; ii < DR_ROWS_PER; ii++)
                    S[ii] = __fmul_rn(S[ii], eG);
                for (int s = 0; s < REC_CHUNK; s++) {
                    const float x = __fmul_rn(expf(G - Gs[s]), ds[s * DR_DS_STRIDE + c]);
#pragma unroll
                    for (int ii = 0; ii < DR_ROWS_PER; ii++) {
                        const int d = DR_PARTS * ii + part;
                        if (FULL || d < dk)
                            S[ii] = __fmaf_rn(x, ks[s * KS_STRIDE + d], S[ii]);
                    }
                }
                float *next = states + ((p + 1) / REC_CHUNK % DFLASH_REC_CHUNK_STATES) * state_stride;
#pragma unroll
                for (int ii = 0; ii < DR_ROWS_PER; ii++) {
                    const int d = DR_PARTS * ii + part;
                    if (FULL || d < dk)
                        next[(i64)d * dv + e] = S[ii];
                }
            }
            c0 += REC_CHUNK;
            __syncthreads(); /* ks, Gs and ds are the next chunk's from here */
        }
        cur = nxt;
    }
}

/* Any k_dim up to REC_MAX_DK, and k_dim == REC_MAX_DK (a Qwen3.5's). */
#define DELTA_RULE_KERNEL(name, FULL)                                                                          \
    extern "C" __global__ void __launch_bounds__(DR_THREADS)                                                   \
        name(const int *info, float *state, i64 rec_stride, const float *y, const float *a_in, const float *b_in, \
             const void *A_log, int adt, const void *dt_bias, int ddt, int n_k_heads, int n_v_heads, int dk, int dv, \
             int t0, float *out)                                                                               \
    {                                                                                                          \
        delta_rule_body<FULL>(info, state, rec_stride, y, a_in, b_in, A_log, adt, dt_bias, ddt, n_k_heads,     \
                              n_v_heads, dk, dv, t0, out);                                                     \
    }
DELTA_RULE_KERNEL(dflash_delta_rule, false)
DELTA_RULE_KERNEL(dflash_delta_rule_full, true)

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
