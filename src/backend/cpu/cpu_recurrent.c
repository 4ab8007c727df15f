/* cpu_recurrent.c: the CPU reference of the recurrent-state primitives of
 * a linear-attention layer (a Qwen3.5's Gated DeltaNet): the causal
 * depthwise convolution over a sequence's inputs by position (conv_silu)
 * and the gated delta rule in its chunked form (delta_rule), each walking
 * a sequence's rows in order and keeping what later rows need in its
 * record (backend.h). Every sum runs in index order and nothing is fused
 * into an fma (ISO C mode does not contract), so the result of a row
 * depends only on the record and that row: running rows one call at a
 * time gives the bits of running them in one call, which keeps
 * speculative decoding identical to plain decoding over a recurrent
 * state. */
#include <math.h>
#include <string.h>

#include "backend/cpu/cpu_internal.h"

enum { MAX_KERNEL = DFLASH_CONV_MAX_KERNEL, ROWS = DFLASH_REC_ROWS, CHUNK = DFLASH_REC_CHUNK,
       STATES = DFLASH_REC_CHUNK_STATES };

/* The entries themselves (on the CPU they can be read before running). */
static dflash_status check_info(const dflash_rec_args *r, int n, const char *op)
{
    for (int q = 0; q < r->n_seqs; q++) {
        const int32_t *f = r->info + (size_t)q * DFLASH_REC_INFO_LEN;
        if (f[0] < 0 || f[1] < 0 || f[0] + f[1] > n || f[2] < 0 || f[3] < 0)
            return dflash_fail(DFLASH_ERR_INVALID_ARG, "%s: sequence %d has rows [%d, +%d) of %d at position %d, "
                               "record %d", op, q, f[0], f[1], n, f[2], f[3]);
    }
    return DFLASH_OK;
}

static float silu(float x) { return x / (1.0f + expf(-x)); }

dflash_status dflash_cpu_conv_silu(dflash_backend *be, const dflash_rec_args *r, const float *x,
                                   const dflash_weight *w, int n, int channels, int kernel, float *out)
{
    (void)be;
    DFLASH_TRY(dflash_be_check_conv(w, channels, kernel));
    DFLASH_TRY(dflash_be_check_rec(r, dflash_conv_rec_size(channels), "conv_silu"));
    DFLASH_TRY(check_info(r, n, "conv_silu"));
    for (int q = 0; q < r->n_seqs; q++) {
        const int32_t *f = r->info + (size_t)q * DFLASH_REC_INFO_LEN;
        const int row0 = f[0], rows = f[1], pos0 = f[2];
        float *ring = r->state + f[3] * r->rec_stride; /* [ROWS, channels] by position */
#pragma omp parallel for schedule(static) if ((int64_t)rows * channels * kernel > (1 << 20))
        for (int c = 0; c < channels; c++) {
            float wc[MAX_KERNEL];
            dflash_cpu_weight_row(w, c, wc);
            for (int t = 0; t < rows; t++) {
                const int p = pos0 + t;
                ring[(int64_t)(p % ROWS) * channels + c] = x[(int64_t)(row0 + t) * channels + c];
                float acc = 0.0f;
                for (int i = 0; i < kernel; i++) {
                    const int pi = p - kernel + 1 + i;
                    if (pi < 0)
                        continue;
                    const float prod = wc[i] * ring[(int64_t)(pi % ROWS) * channels + c];
                    acc += prod;
                }
                out[(int64_t)(row0 + t) * channels + c] = silu(acc);
            }
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

static float dot(const float *a, const float *b, int n)
{
    float s = 0.0f;
    for (int i = 0; i < n; i++) {
        const float p = a[i] * b[i];
        s += p;
    }
    return s;
}

/* One value head's view of a record: chunk-start states and row slots. */
typedef struct head_rec {
    float *states;      /* [STATES] states [dk, dv], stride `state_stride` */
    int64_t state_stride;
    float *rows;        /* row slot s at rows + s * row_stride: k [dk], d [dv], G */
    int64_t row_stride;
    int dk, dv;
} head_rec;

static head_rec head_at(float *rec, int j, int Hv, int dk, int dv)
{
    const int64_t head = (int64_t)dk * dv, slot = (int64_t)dk + dv + 1;
    return (head_rec){ rec + j * head, Hv * head, rec + STATES * Hv * head + j * slot, Hv * slot, dk, dv };
}

static float *state_of(const head_rec *h, int chunk) { return h->states + (chunk % STATES) * h->state_stride; }
static float *row_of(const head_rec *h, int p) { return h->rows + (p % ROWS) * h->row_stride; }

/* The row at position p of value head h: its k, d and G into its slot,
 * its output into o. S: the chunk's start state. Loops run over value
 * columns innermost (they vectorise); each column's sums keep their order. */
static void delta_row(const head_rec *h, const float *S, int p, const float *qn, const float *kn, const float *v,
                      float beta, float g, float *o)
{
    const int dk = h->dk, dv = h->dv, c0 = p - p % CHUNK, n = p - c0;
    float *me = row_of(h, p), *d = me + dk;
    const float G = (p == c0 ? 0.0f : row_of(h, p - 1)[dk + dv]) + g, eG = expf(G);
    memcpy(me, kn, (size_t)dk * sizeof(float));
    me[dk + dv] = G;
    float ck[CHUNK], cq[CHUNK]; /* exp(G - G_s) times k_s . k and k_s . q, s = c0 .. p */
    for (int s = 0; s <= n; s++) {
        const float *rs = row_of(h, c0 + s), ex = expf(G - rs[dk + dv]);
        ck[s] = ex * dot(rs, kn, dk);
        cq[s] = ex * dot(rs, qn, dk);
    }
    float u[dv], sq[dv], w[dv];
    for (int e = 0; e < dv; e++)
        u[e] = sq[e] = w[e] = 0.0f;
    for (int i = 0; i < dk; i++) { /* S_c^T k and S_c^T q, in i order */
        const float *Si = S + (int64_t)i * dv;
        for (int e = 0; e < dv; e++) {
            const float pk = Si[e] * kn[i], pq = Si[e] * qn[i];
            u[e] += pk;
            sq[e] += pq;
        }
    }
    for (int s = 0; s < n; s++) { /* the chunk's earlier updates, in s order */
        const float *ds = row_of(h, c0 + s) + dk;
        for (int e = 0; e < dv; e++) {
            const float prod = ck[s] * ds[e];
            w[e] += prod;
        }
    }
    for (int e = 0; e < dv; e++) {
        const float eu = eG * u[e];
        d[e] = ((v[e] - eu) - w[e]) * beta;
        o[e] = eG * sq[e];
    }
    for (int s = 0; s <= n; s++) {
        const float *ds = row_of(h, c0 + s) + dk;
        for (int e = 0; e < dv; e++) {
            const float prod = cq[s] * ds[e];
            o[e] += prod;
        }
    }
}

/* The state at the start of the chunk after the one ending at p. */
static void delta_chunk_end(const head_rec *h, const float *S, int p, float *next)
{
    const int dk = h->dk, dv = h->dv, c0 = p - p % CHUNK;
    const float G = row_of(h, p)[dk + dv], eG = expf(G);
    float ex[CHUNK];
    for (int s = c0; s <= p; s++)
        ex[s - c0] = expf(G - row_of(h, s)[dk + dv]);
    for (int i = 0; i < dk; i++) {
        float *ni = next + (int64_t)i * dv;
        for (int e = 0; e < dv; e++)
            ni[e] = eG * S[(int64_t)i * dv + e];
        for (int s = c0; s <= p; s++) {
            const float *rs = row_of(h, s), a = ex[s - c0] * rs[i];
            for (int e = 0; e < dv; e++) {
                const float prod = a * rs[dk + e];
                ni[e] += prod;
            }
        }
    }
}

dflash_status dflash_cpu_delta_rule(dflash_backend *be, const dflash_rec_args *r, const dflash_delta_args *a)
{
    (void)be;
    DFLASH_TRY(dflash_be_check_delta(a, 0, 0));
    const int Hk = a->n_k_heads, Hv = a->n_v_heads, dk = a->k_dim, dv = a->v_dim;
    DFLASH_TRY(dflash_be_check_rec(r, dflash_delta_rec_size(Hv, dk, dv), "delta_rule"));
    DFLASH_TRY(check_info(r, a->n_rows, "delta_rule"));
    float A_log[Hv], dt_bias[Hv];
    dflash_cpu_weight_row(&(dflash_weight){ a->A_log->dtype, 1, Hv, a->A_log->data, NULL, NULL }, 0, A_log);
    dflash_cpu_weight_row(&(dflash_weight){ a->dt_bias->dtype, 1, Hv, a->dt_bias->data, NULL, NULL }, 0, dt_bias);
    const int64_t Kd = (int64_t)Hk * dk, C = 2 * Kd + (int64_t)Hv * dv, head = (int64_t)dk * dv;
    const float scale = 1.0f / sqrtf((float)dk);
    for (int q = 0; q < r->n_seqs; q++) {
        const int32_t *f = r->info + (size_t)q * DFLASH_REC_INFO_LEN;
        const int row0 = f[0], rows = f[1], pos0 = f[2];
        float *rec = r->state + f[3] * r->rec_stride;
#pragma omp parallel for schedule(static) if ((int64_t)rows * Hv * head > (1 << 18))
        for (int j = 0; j < Hv; j++) {
            const int hk = j / (Hv / Hk);
            const head_rec h = head_at(rec, j, Hv, dk, dv);
            const float neg_a = -expf(A_log[j]);
            float qn[dk], kn[dk];
            for (int t = 0; t < rows; t++) {
                const int p = pos0 + t, chunk = p / CHUNK;
                float *S = state_of(&h, chunk);
                if (p == 0) /* a sequence's start: its first chunk starts from zeros */
                    memset(S, 0, (size_t)head * sizeof(float));
                const int64_t i = row0 + t;
                const float *y = a->y + i * C;
                l2norm(y + (int64_t)hk * dk, dk, scale, qn);
                l2norm(y + Kd + (int64_t)hk * dk, dk, 1.0f, kn);
                const float beta = 1.0f / (1.0f + expf(-a->b[i * Hv + j]));
                const float g = neg_a * softplus(a->a[i * Hv + j] + dt_bias[j]);
                delta_row(&h, S, p, qn, kn, y + 2 * Kd + (int64_t)j * dv, beta, g, a->out + i * Hv * dv + (int64_t)j * dv);
                if ((p + 1) % CHUNK == 0)
                    delta_chunk_end(&h, S, p, state_of(&h, chunk + 1));
            }
        }
    }
    return DFLASH_OK;
}
