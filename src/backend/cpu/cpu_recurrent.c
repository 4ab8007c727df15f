/* cpu_recurrent.c: the CPU reference of the recurrent-state primitives of
 * a linear-attention layer (a Qwen3.5's Gated DeltaNet): the causal
 * depthwise convolution with its rolling window (conv_silu) and the gated
 * delta rule (delta_rule), each walking a sequence's rows in order from
 * its state slot. Every sum runs in index order and nothing is fused into
 * an fma (ISO C mode does not contract), so the result of a row depends
 * only on the state and that row: running rows one call at a time gives
 * the bits of running them in one call, which keeps speculative decoding
 * identical to plain decoding over a recurrent state. */
#include <math.h>
#include <string.h>

#include "backend/cpu/cpu_internal.h"

enum { MAX_KERNEL = DFLASH_CONV_MAX_KERNEL };

/* Sequence q's record of a call: its rows and the slots it reads (NULL:
 * zeros), writes at the end and after `snap` rows. */
typedef struct rec_seq {
    int row0, rows, snap;
    const float *in;
    float *out, *at_snap;
} rec_seq;

static rec_seq rec_at(const dflash_rec_args *r, int q)
{
    const int32_t *f = r->info + (size_t)q * DFLASH_REC_INFO_LEN;
    return (rec_seq){ f[0], f[1], f[4], f[2] < 0 ? NULL : r->state + f[2] * r->slot_stride,
                      r->state + f[3] * r->slot_stride, r->state + f[5] * r->slot_stride };
}

/* The records themselves (on the CPU they can be read before running). */
static dflash_status check_rec(const dflash_rec_args *r, int n, const char *op)
{
    for (int q = 0; q < r->n_seqs; q++) {
        const int32_t *f = r->info + (size_t)q * DFLASH_REC_INFO_LEN;
        if (f[0] < 0 || f[1] < 0 || f[0] + f[1] > n || f[2] < -1 || f[3] < 0 || f[4] < 0 ||
            (f[4] > 0 && (f[4] >= f[1] || f[5] < 0 || f[5] == f[3])))
            return dflash_fail(DFLASH_ERR_INVALID_ARG, "%s: sequence %d has rows [%d, +%d) of %d, slots %d -> %d, "
                               "snap %d into %d", op, q, f[0], f[1], n, f[2], f[3], f[4], f[5]);
    }
    return DFLASH_OK;
}

static float silu(float x) { return x / (1.0f + expf(-x)); }

dflash_status dflash_cpu_conv_silu(dflash_backend *be, const dflash_rec_args *r, const float *x,
                                   const dflash_weight *w, int n, int channels, int kernel, float *out)
{
    (void)be;
    DFLASH_TRY(dflash_be_check_conv(w, channels, kernel));
    DFLASH_TRY(check_rec(r, n, "conv_silu"));
    const int hist = kernel - 1;
    for (int q = 0; q < r->n_seqs; q++) {
        const rec_seq sq = rec_at(r, q);
        const int row0 = sq.row0, rows = sq.rows, snap = sq.snap;
        const float *w_in = sq.in;
        float *w_out = sq.out, *w_snap = sq.at_snap;
#pragma omp parallel for schedule(static) if ((int64_t)rows * channels * kernel > (1 << 20))
        for (int c = 0; c < channels; c++) {
            float wc[MAX_KERNEL], win[MAX_KERNEL];
            dflash_cpu_weight_row(w, c, wc);
            for (int i = 0; i < hist; i++)
                win[i] = w_in ? w_in[(int64_t)i * channels + c] : 0.0f;
            for (int t = 0; t < rows; t++) {
                const float xt = x[(int64_t)(row0 + t) * channels + c];
                float acc = 0.0f;
                for (int i = 0; i < hist; i++) {
                    const float p = wc[i] * win[i];
                    acc += p;
                }
                const float p = wc[hist] * xt;
                acc += p;
                out[(int64_t)(row0 + t) * channels + c] = silu(acc);
                for (int i = 0; i + 1 < hist; i++)
                    win[i] = win[i + 1];
                if (hist)
                    win[hist - 1] = xt;
                if (t + 1 == snap)
                    for (int i = 0; i < hist; i++)
                        w_snap[(int64_t)i * channels + c] = win[i];
            }
            for (int i = 0; i < hist; i++)
                w_out[(int64_t)i * channels + c] = win[i];
        }
    }
    return DFLASH_OK;
}

/* v [dim] times 1 / sqrt(sum of squares + 1e-6), then times `scale`
 * (1: no second rounding). */
static void l2norm(const float *v, int dim, float scale, float *out)
{
    float ss = 0.0f;
    for (int i = 0; i < dim; i++)
        ss += v[i] * v[i];
    const float inv = 1.0f / sqrtf(ss + 1e-6f);
    for (int i = 0; i < dim; i++)
        out[i] = scale == 1.0f ? v[i] * inv : v[i] * inv * scale;
}

/* torch's softplus: x past its threshold of 20 is returned as is. */
static float softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

/* One row through value head j's state S [dk, dv]. */
static void delta_step(float *S, const float *qn, const float *kn, const float *v, float beta, float decay, int dk,
                       int dv, float *kv, float *o)
{
    for (int64_t i = 0; i < (int64_t)dk * dv; i++)
        S[i] *= decay;
    for (int e = 0; e < dv; e++)
        kv[e] = 0.0f;
    for (int d = 0; d < dk; d++)
        for (int e = 0; e < dv; e++) {
            const float p = S[(int64_t)d * dv + e] * kn[d];
            kv[e] += p;
        }
    for (int e = 0; e < dv; e++)
        kv[e] = (v[e] - kv[e]) * beta; /* the update d */
    for (int d = 0; d < dk; d++)
        for (int e = 0; e < dv; e++) {
            const float p = kn[d] * kv[e];
            S[(int64_t)d * dv + e] += p;
        }
    for (int e = 0; e < dv; e++)
        o[e] = 0.0f;
    for (int d = 0; d < dk; d++)
        for (int e = 0; e < dv; e++) {
            const float p = S[(int64_t)d * dv + e] * qn[d];
            o[e] += p;
        }
}

dflash_status dflash_cpu_delta_rule(dflash_backend *be, const dflash_rec_args *r, const dflash_delta_args *a)
{
    (void)be;
    DFLASH_TRY(dflash_be_check_delta(a, 0, 0));
    const int Hk = a->n_k_heads, Hv = a->n_v_heads, dk = a->k_dim, dv = a->v_dim;
    DFLASH_TRY(check_rec(r, a->n_rows, "delta_rule"));
    float A_log[Hv], dt_bias[Hv];
    dflash_cpu_weight_row(&(dflash_weight){ a->A_log->dtype, 1, Hv, a->A_log->data, NULL, NULL }, 0, A_log);
    dflash_cpu_weight_row(&(dflash_weight){ a->dt_bias->dtype, 1, Hv, a->dt_bias->data, NULL, NULL }, 0, dt_bias);
    const int64_t Kd = (int64_t)Hk * dk, C = 2 * Kd + (int64_t)Hv * dv, head = (int64_t)dk * dv;
    const float scale = 1.0f / sqrtf((float)dk);
    for (int q = 0; q < r->n_seqs; q++) {
        const rec_seq sq = rec_at(r, q);
        const int row0 = sq.row0, rows = sq.rows, snap = sq.snap;
        const float *s_in = sq.in;
        float *s_out = sq.out, *s_snap = sq.at_snap;
#pragma omp parallel for schedule(static) if ((int64_t)rows * Hv * head > (1 << 18))
        for (int j = 0; j < Hv; j++) {
            const int h = j / (Hv / Hk);
            float *S = s_out + j * head, qn[dk], kn[dk], kv[dv];
            if (!s_in)
                memset(S, 0, (size_t)head * sizeof(float));
            else if (s_out != s_in)
                memcpy(S, s_in + j * head, (size_t)head * sizeof(float));
            const float neg_a = -expf(A_log[j]);
            for (int t = 0; t < rows; t++) {
                const int64_t i = row0 + t;
                const float *y = a->y + i * C;
                l2norm(y + (int64_t)h * dk, dk, scale, qn);
                l2norm(y + Kd + (int64_t)h * dk, dk, 1.0f, kn);
                const float beta = 1.0f / (1.0f + expf(-a->b[i * Hv + j]));
                const float decay = expf(neg_a * softplus(a->a[i * Hv + j] + dt_bias[j]));
                delta_step(S, qn, kn, y + 2 * Kd + (int64_t)j * dv, beta, decay, dk, dv, kv,
                           a->out + i * Hv * dv + (int64_t)j * dv);
                if (t + 1 == snap)
                    memcpy(s_snap + j * head, S, (size_t)head * sizeof(float));
            }
        }
    }
    return DFLASH_OK;
}
