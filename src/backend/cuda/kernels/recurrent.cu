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

/* conv_silu's rows for a kernel size KS known at compile time (a
 * Qwen3.5's 4): inputs in groups of CONV_GROUP rows, all of a group's
 * requested before any is used (a row's own arithmetic is a few
 * instructions, so a load at its turn leaves every row waiting for memory:
 * a verify's 16 rows become one round trip, not 16). The same sums as the
 * general loop below. */
#define CONV_GROUP 16
template <int KS>
__forceinline__ void conv_rows_fixed(const float *x, float *ring, float *out, int channels, int c, int row0,
                                     int rows, int pos0, const float *wc_all)
{
    float wc[KS], win[KS - 1];
#pragma unroll
    for (int i = 0; i < KS; i++)
        wc[i] = wc_all[i];
#pragma unroll
    for (int i = 0; i < KS - 1; i++) {
        const int pi = pos0 - (KS - 1) + i;
        win[i] = pi >= 0 ? ring[(i64)(pi % REC_ROWS) * channels + c] : 0.0f;
    }
    for (int t0 = 0; t0 < rows; t0 += CONV_GROUP) {
        float xg[CONV_GROUP];
#pragma unroll
        for (int k = 0; k < CONV_GROUP; k++)
            xg[k] = t0 + k < rows ? x[(i64)(row0 + t0 + k) * channels + c] : 0.0f;
#pragma unroll
        for (int k = 0; k < CONV_GROUP; k++) {
            if (t0 + k >= rows)
                break;
            const int p = pos0 + t0 + k;
            const float xt = xg[k];
            ring[(i64)(p % REC_ROWS) * channels + c] = xt;
            float acc = 0.0f;
#pragma unroll
            for (int i = 0; i < KS - 1; i++)
                if (p - (KS - 1) + i >= 0)
                    acc += wc[i] * win[i];
            acc += wc[KS - 1] * xt;
            out[(i64)(row0 + t0 + k) * channels + c] = acc / (1.0f + expf(-acc));
#pragma unroll
            for (int i = 0; i < KS - 2; i++)
                win[i] = win[i + 1];
            win[KS - 2] = xt;
        }
    }
}

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
    if (kernel == 4) {
        conv_rows_fixed<4>(x, ring, out, channels, c, row0, rows, pos0, wc);
        return;
    }
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
#define KS_STRIDE (REC_MAX_DK + 1) /* a padded row */
#define DR_COLS 32                 /* value columns of one head a block owns */
#define DR_PARTS 8                 /* threads sharing a column, each every 8th state row */
#define DR_THREADS (DR_COLS * DR_PARTS)
#define DR_WARPS (DR_THREADS / 32)
#define DR_ROWS_PER (REC_MAX_DK / DR_PARTS) /* state rows a thread holds */
#define DR_LANE (REC_MAX_DK / 32)           /* elements of a k_dim row a lane holds */
#define DR_DS_STRIDE (DR_COLS + 4)          /* a warp's (part, column) pairs on 32 banks */
#define DR_WIN 16                           /* rows of each sequence one launch takes */
#define DR_S_PER (REC_CHUNK / DR_WARPS)     /* chunk rows a warp takes in the dot products */
#define DR_STAGE 16                         /* k rows of 128 in ck and cq together */
static_assert(DR_PARTS * (DR_DS_STRIDE % 32) == 32, "ds reads of a warp conflict-free");
static_assert(DR_COLS == 32, "a warp's lanes load a window row's values of the block's columns");
static_assert(REC_CHUNK % DR_WARPS == 0 && DR_WIN % DR_WARPS == 0, "rows spread evenly over the warps");
static_assert(DR_STAGE * REC_MAX_DK == 2 * DR_WIN * REC_CHUNK && REC_CHUNK % DR_STAGE == 0 &&
                  DR_STAGE * REC_MAX_DK % DR_THREADS == 0,
              "a chunk-end stage of k rows fills ck and cq");
static_assert(REC_CHUNK - 1 + DR_WIN <= REC_ROWS, "a launch's row slots never wrap onto the chunk rows it reads");

/* Lane l's elements l + 32 m of a k_dim row (0 past k_dim). */
template <bool FULL> __forceinline__ void dr_row(float (&r)[DR_LANE], const float *src, int dk)
{
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int m = 0; m < DR_LANE; m++)
        r[m] = FULL || lane + 32 * m < dk ? src[lane + 32 * m] : 0.0f;
}

/* N values' sums over the warp at once (N a power of 2, <= 32): at each
 * butterfly level a lane keeps half of the values it still holds and
 * sends the other half to its partner, so N sums cost about N shuffles
 * instead of 5 N, in independent chains. The sum of value v ends in the
 * lanes l with l >> (5 - log2 N) == v; each level adds the same pair of
 * partials as warp_sum, so every sum has warp_sum's bits. */
template <int N> __forceinline__ float dr_sum_many(float (&p)[N])
{
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int o = 16, n = N; o > 0; o >>= 1, n = n > 1 ? n / 2 : 1) {
        if (n > 1) {
            const bool hi = lane & o;
#pragma unroll
            for (int i = 0; i < n / 2; i++) {
                const float send = hi ? p[i] : p[i + n / 2], keep = hi ? p[i + n / 2] : p[i];
                p[i] = keep + __shfl_xor_sync(0xffffffffu, send, o);
            }
        } else {
            p[0] += __shfl_xor_sync(0xffffffffu, p[0], o);
        }
    }
    return p[0];
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

/* A chunk-end stage: this thread's DR_SV of the k rows s0 .. s0 +
 * DR_STAGE - 1 (those below E) from the record, all requested at once. */
#define DR_SV (DR_STAGE * REC_MAX_DK / DR_THREADS)
template <bool FULL>
__forceinline__ void dr_stage_load(float (&sv)[DR_SV], const float *slots, i64 slot_stride, int c0, int s0, int E,
                                   int dk)
{
#pragma unroll
    for (int i = 0; i < DR_SV; i++) {
        const int el = threadIdx.x + DR_THREADS * i, s = s0 + el / REC_MAX_DK, d = el % REC_MAX_DK;
        sv[i] = s < E && (FULL || d < dk) ? slots[((c0 + s) % REC_ROWS) * slot_stride + d] : 0.0f;
    }
}

/* Phase 2's dot products of a warp's first R chunk rows s = warp + 8 r
 * (k rows in kr, zero past nb) with every segment row t in ta..tb-1 (n0:
 * chunk row of window row 0): ck[t][s] = e^(G_t - G_s) k_s . k_t, cq the
 * same with q_t, for s <= t's chunk row. A dot: each lane's products
 * (elements lane + 32 m, m in order), then warp_sum's tree. */
template <int R, bool FULL>
__forceinline__ void dr_chunk_dots(const float (&kr)[DR_S_PER][DR_LANE], const float *kw, const float *qw,
                                   const float *Gs, float (*ck)[REC_CHUNK], float (*cq)[REC_CHUNK], int ta, int tb,
                                   int n0, int nb, int dk)
{
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    /* value v of the 2 R: row r = v / 2, k (v even) or q; lane l ends with v = l >> sh */
    constexpr int sh = R == 2 ? 3 : R == 4 ? 2 : 1;
    static_assert(2 * R == 32 >> sh, "R is 2, 4 or 8");
    const int v = lane >> sh, s = warp + (v >> 1) * DR_WARPS;
    for (int t = ta; t < tb; t++) {
        float xk[DR_LANE], xq[DR_LANE], p[2 * R];
        dr_row<FULL>(xk, kw + t * KS_STRIDE, dk);
        dr_row<FULL>(xq, qw + t * KS_STRIDE, dk);
#pragma unroll
        for (int r = 0; r < R; r++) {
            p[2 * r] = p[2 * r + 1] = 0.0f;
#pragma unroll
            for (int m = 0; m < DR_LANE; m++) {
                p[2 * r] = __fmaf_rn(kr[r][m], xk[m], p[2 * r]);
                p[2 * r + 1] = __fmaf_rn(kr[r][m], xq[m], p[2 * r + 1]);
            }
        }
        const float dot = dr_sum_many<2 * R>(p);
        const int n = n0 + t;
        if ((lane & ((1 << sh) - 1)) == 0 && s <= nb && s <= n) {
            const float ex = expf(Gs[n] - Gs[s]);
            if (v & 1)
                cq[t][s] = __fmul_rn(ex, dot);
            else
                ck[t][s] = __fmul_rn(ex, dot);
        }
    }
}

/* grid (value heads x column blocks of DR_COLS, sequences), block
 * DR_THREADS: thread (c, part) = (tid / 8, tid % 8) holds the rows d =
 * 8 i + part of column e = block's first + c of the head's chunk-start
 * state S [k_dim, v_dim] (16 registers); a head's 128 columns are 4
 * blocks. A launch takes DR_WIN rows of each sequence's call (rows t0 ..;
 * the launcher walks the windows), in segments of one chunk each:
 *
 * 1. a warp per row: q and k over their L2 norms into shared memory, the
 *    decay exponent and beta; one thread then sums the decays in row
 *    order (G);
 * 2. everything that depends only on the inputs: a warp per chunk row s
 *    takes k_s . k_t and k_s . q_t for every segment row t after it
 *    (times exp(G_t - G_s)), all of a warp's rows for one t reduced
 *    together (dr_chunk_dots); each column's thread group S^T k_t,
 *    S^T q_t;
 * 3. the recurrence itself, row after row without a barrier: a column's
 *    update sums its earlier updates (thread part has rows s = part mod
 *    8, written by itself), three shuffles, the update and the output.
 *
 * At a chunk's last row the next start state, from the chunk's k rows:
 * the window's from shared memory, an earlier launch's from the record,
 * 16 at a time through ck and cq's space (one round trip a stage, not
 * one a row; room for all 64 would take dynamic shared memory beyond the
 * static 48 KB, and a larger shared-memory carveout than the kernels
 * around this one use). Every sum has a fixed order (explicit
 * roundings), so a row's bits do not depend on the rows that share its
 * call or its window. A window's k rows are read from
 * shared memory, earlier rows' from the record, which only an earlier
 * launch wrote: one launch's writes never race another block's reads.
 * FULL: k_dim == REC_MAX_DK, every bound test compiled away. Record
 * layout: backend.h, dflash_delta_rec_size. */
template <bool FULL>
__forceinline__ void delta_rule_body(const int *info, float *state, i64 rec_stride, const float *y, const float *a_in,
                                     const float *b_in, const void *A_log, int adt, const void *dt_bias, int ddt,
                                     int n_k_heads, int n_v_heads, int dk, int dv, int t0, float *out)
{
    __shared__ float kw[DR_WIN * KS_STRIDE], qw[DR_WIN * KS_STRIDE]; /* the window's normalised k, q rows */
    /* window row t, chunk row s: ck (k . k), cq (k . q); at a chunk's end, DR_STAGE k rows of 128 */
    __shared__ float ckq[2][DR_WIN][REC_CHUNK];
    float(*ck)[REC_CHUNK] = ckq[0], (*cq)[REC_CHUNK] = ckq[1], *kst = &ckq[0][0][0];
    __shared__ float ds[REC_CHUNK * DR_DS_STRIDE]; /* update of chunk row s, column c at s * stride + c */
    __shared__ float vw[DR_WIN][DR_COLS], ow[DR_WIN][DR_COLS]; /* v, then v - e^G S^T k; e^G S^T q */
    __shared__ float Gs[REC_CHUNK], gw[DR_WIN], bw[DR_WIN];
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
    const int row0 = f[0] + t0, rows = min(f[1] - t0, DR_WIN), pos0 = f[2] + t0;
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
    /* the chunk's rows an earlier launch took: decays, this thread's updates */
    for (int s = tid; s < pos0 - c0; s += DR_THREADS)
        Gs[s] = slots[((c0 + s) % REC_ROWS) * slot_stride + dk + dv];
    {
        float dl[REC_CHUNK / DR_PARTS]; /* all requested before the first is stored */
#pragma unroll
        for (int i = 0; i < REC_CHUNK / DR_PARTS; i++) {
            const int s = part + DR_PARTS * i;
            dl[i] = col && s < pos0 - c0 ? slots[((c0 + s) % REC_ROWS) * slot_stride + dk + e] : 0.0f;
        }
#pragma unroll
        for (int i = 0; i < REC_CHUNK / DR_PARTS; i++) {
            const int s = part + DR_PARTS * i;
            if (col && s < pos0 - c0)
                ds[s * DR_DS_STRIDE + c] = dl[i];
        }
    }

    /* 1. a warp per window row, every row's inputs requested first */
    {
        const float scale = 1.0f / sqrtf((float)dk);
        float q[DR_WIN / DR_WARPS][DR_LANE], k[DR_WIN / DR_WARPS][DR_LANE], v[DR_WIN / DR_WARPS];
#pragma unroll
        for (int r = 0; r < DR_WIN / DR_WARPS; r++) {
            const int t = warp + r * DR_WARPS;
            const float *yr = y + (i64)(row0 + (t < rows ? t : 0)) * C;
            dr_row<FULL>(q[r], yr + (i64)h * dk, dk);
            dr_row<FULL>(k[r], yr + Kd + (i64)h * dk, dk);
            v[r] = cb * DR_COLS + lane < dv ? yr[2 * Kd + (i64)j * dv + cb * DR_COLS + lane] : 0.0f;
        }
#pragma unroll
        for (int r = 0; r < DR_WIN / DR_WARPS; r++) {
            const int t = warp + r * DR_WARPS;
            if (t >= rows)
                break;
            float qq = 0.0f, kk = 0.0f;
#pragma unroll
            for (int m = 0; m < DR_LANE; m++) {
                qq = __fmaf_rn(q[r][m], q[r][m], qq);
                kk = __fmaf_rn(k[r][m], k[r][m], kk);
            }
            qq = warp_sum(qq);
            kk = warp_sum(kk);
            const float q_inv = 1.0f / sqrtf(qq + 1e-6f), k_inv = 1.0f / sqrtf(kk + 1e-6f);
            float *me = slots + ((pos0 + t) % REC_ROWS) * slot_stride;
#pragma unroll
            for (int m = 0; m < DR_LANE; m++) {
                const int d = lane + 32 * m;
                if (FULL || d < dk) {
                    const float kd = __fmul_rn(k[r][m], k_inv);
                    kw[t * KS_STRIDE + d] = kd;
                    qw[t * KS_STRIDE + d] = __fmul_rn(__fmul_rn(q[r][m], q_inv), scale);
                    if (cb == 0)
                        me[d] = kd;
                }
            }
            vw[t][lane] = v[r];
            if (lane == 0) {
                const i64 i = row0 + t;
                const float xa = a_in[i * n_v_heads + j] + bias;
                bw[t] = 1.0f / (1.0f + expf(-b_in[i * n_v_heads + j]));
                gw[t] = neg_a * (xa > 20.0f ? xa : log1pf(expf(xa)));
            }
        }
    }
    __syncthreads();

    for (int ta = 0; ta < rows;) {
        const int na = pos0 + ta - c0, tb = min(rows, ta + REC_CHUNK - na), nb = pos0 + tb - 1 - c0;
        if (tid == 0) /* decays summed in row order, one thread: G's bits do not depend on the window */
            for (int t = ta; t < tb; t++) {
                const int n = pos0 + t - c0;
                const float G = __fadd_rn(n == 0 ? 0.0f : Gs[n - 1], gw[t]);
                Gs[n] = G;
                if (cb == 0)
                    slots[((pos0 + t) % REC_ROWS) * slot_stride + dk + dv] = G;
            }
        __syncthreads();

        /* 2. a warp per chunk row s = warp + 8 r <= nb, every k row requested
         * first; then for each segment row t all of the warp's k_s . k_t and
         * k_s . q_t reduced together. */
        {
            float kr[DR_S_PER][DR_LANE];
#pragma unroll
            for (int r = 0; r < DR_S_PER; r++) {
                const int s = warp + r * DR_WARPS, ts = s + c0 - pos0; /* window row of chunk row s, if any */
                if (s <= nb && ts >= 0) /* shared or global: one address space a load, no generic loads */
                    dr_row<FULL>(kr[r], kw + ts * KS_STRIDE, dk);
                else if (s <= nb)
                    dr_row<FULL>(kr[r], slots + ((c0 + s) % REC_ROWS) * slot_stride, dk);
                else
#pragma unroll
                    for (int m = 0; m < DR_LANE; m++)
                        kr[r][m] = 0.0f;
            }
            if (nb < warp + 2 * DR_WARPS) /* as many rows as the warp has: the dots' cost */
                dr_chunk_dots<2, FULL>(kr, kw, qw, Gs, ck, cq, ta, tb, pos0 - c0, nb, dk);
            else if (nb < warp + 4 * DR_WARPS)
                dr_chunk_dots<4, FULL>(kr, kw, qw, Gs, ck, cq, ta, tb, pos0 - c0, nb, dk);
            else
                dr_chunk_dots<DR_S_PER, FULL>(kr, kw, qw, Gs, ck, cq, ta, tb, pos0 - c0, nb, dk);
        }
        /* each column: the start state's S^T k_t and S^T q_t */
#pragma unroll 4
        for (int t = ta; t < tb; t++) {
            const float eG = expf(Gs[pos0 + t - c0]);
            float u = 0.0f, sq = 0.0f;
#pragma unroll
            for (int ii = 0; ii < DR_ROWS_PER; ii++) {
                const int d = DR_PARTS * ii + part;
                if (FULL || d < dk) {
                    u = __fmaf_rn(S[ii], kw[t * KS_STRIDE + d], u);
                    sq = __fmaf_rn(S[ii], qw[t * KS_STRIDE + d], sq);
                }
            }
            u = dr_part_sum(u);
            sq = dr_part_sum(sq);
            if (part == 0) {
                vw[t][c] = __fsub_rn(vw[t][c], __fmul_rn(eG, u));
                ow[t][c] = __fmul_rn(eG, sq);
            }
        }
        __syncthreads();

        /* 3. the recurrence, row after row */
        for (int t = ta; t < tb; t++) {
            const int n = pos0 + t - c0;
            float w = 0.0f, acc = 0.0f;
            if (col)
                for (int s = part; s < n; s += DR_PARTS) {
                    const float d_s = ds[s * DR_DS_STRIDE + c];
                    w = __fmaf_rn(ck[t][s], d_s, w);
                    acc = __fmaf_rn(cq[t][s], d_s, acc);
                }
            w = dr_part_sum(w);
            acc = dr_part_sum(acc);
            const float upd = __fmul_rn(__fsub_rn(vw[t][c], w), bw[t]);
            if (col) {
                if (part == n % DR_PARTS) /* the thread that reads row n back */
                    ds[n * DR_DS_STRIDE + c] = upd;
                if (part == 0) {
                    const i64 i = row0 + t;
                    slots[((pos0 + t) % REC_ROWS) * slot_stride + dk + e] = upd;
                    out[i * n_v_heads * dv + (i64)j * dv + e] = __fmaf_rn(cq[t][n], upd, __fadd_rn(ow[t][c], acc));
                }
            }
        }

        if (nb == REC_CHUNK - 1) { /* the next chunk's start state */
            /* k_s of the rows an earlier launch took (s < E) come from the
             * record, DR_STAGE rows at a time through kst (ck and cq are
             * free here), the next stage requested while this one is
             * used; the window's rows from kw. */
            const int E = pos0 - c0 > 0 ? pos0 - c0 : 0;
            float sv[DR_SV];
            if (E > 0)
                dr_stage_load<FULL>(sv, slots, slot_stride, c0, 0, E, dk);
            const float G = Gs[REC_CHUNK - 1], eG = expf(G);
#pragma unroll
            for (int ii = 0; ii < DR_ROWS_PER; ii++)
                S[ii] = __fmul_rn(S[ii], eG);
#pragma unroll
            for (int s0 = 0; s0 < REC_CHUNK; s0 += DR_STAGE) {
                if (s0 < E) {        /* the same for the whole block */
                    __syncthreads(); /* every row's update in ds; the last stage's reads done */
#pragma unroll
                    for (int i = 0; i < DR_SV; i++)
                        kst[tid + DR_THREADS * i] = sv[i];
                    __syncthreads();
                    if (s0 + DR_STAGE < E)
                        dr_stage_load<FULL>(sv, slots, slot_stride, c0, s0 + DR_STAGE, E, dk);
                } else if (s0 == 0) {
                    __syncthreads(); /* every row's update in ds */
                }
                if (!col)
                    continue;
                for (int s = s0; s < s0 + DR_STAGE; s++) {
                    const float x = __fmul_rn(expf(G - Gs[s]), ds[s * DR_DS_STRIDE + c]);
                    /* k_s's elements 8 ii + part: the staged record's or the window's */
                    const float *ks = s < E ? kst + (s - s0) * REC_MAX_DK : kw + (s + c0 - pos0) * KS_STRIDE;
                    float kv[DR_ROWS_PER];
#pragma unroll
                    for (int ii = 0; ii < DR_ROWS_PER; ii++) {
                        const int d = DR_PARTS * ii + part;
                        kv[ii] = FULL || d < dk ? ks[d] : 0.0f;
                    }
#pragma unroll
                    for (int ii = 0; ii < DR_ROWS_PER; ii++) {
                        const int d = DR_PARTS * ii + part;
                        if (FULL || d < dk)
                            S[ii] = __fmaf_rn(x, kv[ii], S[ii]);
                    }
                }
            }
            if (col) {
                float *next = states + ((c0 / REC_CHUNK + 1) % DFLASH_REC_CHUNK_STATES) * state_stride;
#pragma unroll
                for (int ii = 0; ii < DR_ROWS_PER; ii++) {
                    const int d = DR_PARTS * ii + part;
                    if (FULL || d < dk)
                        next[(i64)d * dv + e] = S[ii];
                }
            }
            c0 += REC_CHUNK;
            __syncthreads(); /* Gs, ds, ck and cq are the next chunk's from here */
        }
        ta = tb;
    }
}

/* Any k_dim up to REC_MAX_DK, and k_dim == REC_MAX_DK (a Qwen3.5's). */
#define DELTA_RULE_KERNEL(name, FULL)                                                                          \
    extern "C" __global__ void __launch_bounds__(DR_THREADS, 2)                                                \
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
