/* cpu_ops.c: the reference definition of every backend op, in plain C.
 *
 * Written for clarity first. Two properties matter beyond the math:
 * - every output element is computed by one thread in a fixed order, so a
 *   row's result never depends on how many rows share the call (what makes
 *   speculative output bit-identical to plain decoding);
 * - f32 accumulation everywhere; weights are widened element by element. */
#include "backend/cpu/cpu_internal.h"

#include <math.h>
#include <string.h>

/* Below this many multiply-adds an op runs on one thread: waking a team
 * costs more than the work (and oversubscribed machines spin). Results do
 * not depend on the choice: each element is still computed in one order. */
#define PAR_MIN_WORK (1 << 21)

/* Widen n weight elements of row `r` into dst (f32). */
static void weight_row_f32(const dflash_weight *w, int64_t r, float *dst)
{
    const int64_t n = w->cols;
    switch (w->dtype) {
    case DFLASH_DTYPE_BF16: {
        const uint16_t *src = (const uint16_t *)w->data + r * n;
        for (int64_t i = 0; i < n; i++)
            dst[i] = dflash_bf16_to_f32(src[i]);
        break;
    }
    case DFLASH_DTYPE_F16: {
        const uint16_t *src = (const uint16_t *)w->data + r * n;
        for (int64_t i = 0; i < n; i++)
            dst[i] = dflash_f16_to_f32(src[i]);
        break;
    }
    case DFLASH_DTYPE_F32:
        memcpy(dst, (const float *)w->data + r * n, (size_t)n * sizeof(float));
        break;
    case DFLASH_DTYPE_F8_E4M3: {
        const uint8_t *src = (const uint8_t *)w->data + r * n;
        for (int64_t i = 0; i < n; i++)
            dst[i] = dflash_fp8e4m3_to_f32(src[i]);
        break;
    }
    default:
        memset(dst, 0, (size_t)n * sizeof(float));
    }
}

static int weight_dtype_ok(const dflash_weight *w)
{
    return w->dtype == DFLASH_DTYPE_BF16 || w->dtype == DFLASH_DTYPE_F16 || w->dtype == DFLASH_DTYPE_F32 ||
           (w->dtype == DFLASH_DTYPE_F8_E4M3 && w->scales);
}

static dflash_status check_weight(const dflash_weight *w, const char *op)
{
    if (!weight_dtype_ok(w))
        return dflash_fail(DFLASH_ERR_UNSUPPORTED, "cpu %s: weight %s has dtype %s%s", op,
                           w->name ? w->name : "?", dflash_dtype_name(w->dtype),
                           w->dtype == DFLASH_DTYPE_F8_E4M3 ? " without scales" : "");
    return DFLASH_OK;
}

/* Dot product with 8 interleaved partial sums: a fixed summation order
 * (independent of any batch size) that the compiler can still vectorize. */
static float dot_f32(const float *a, const float *b, int64_t n)
{
    float acc[8] = { 0 };
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++)
            acc[j] += a[i + j] * b[i + j];
    for (; i < n; i++)
        acc[i & 7] += a[i] * b[i];
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

/* dot_f32 of a and the bf16 row w, widening on the fly in the same lane
 * order: bit-identical to widening the row first (the widening is exact),
 * without a pass over a row buffer. */
static float dot_bf16(const float *a, const uint16_t *w, int64_t n)
{
    float acc[8] = { 0 };
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++)
            acc[j] += a[i + j] * dflash_bf16_to_f32(w[i + j]);
    for (; i < n; i++)
        acc[i & 7] += a[i] * dflash_bf16_to_f32(w[i]);
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

static dflash_status cpu_embed(dflash_backend *be, const dflash_weight *table, const int32_t *ids, int n,
                               float *out)
{
    (void)be;
    DFLASH_TRY(check_weight(table, "embed"));
    for (int i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= table->rows)
            return dflash_fail(DFLASH_ERR_INVALID_ARG, "embed: token id %d outside the vocabulary [0, %lld)",
                               ids[i], (long long)table->rows);
    }
#pragma omp parallel for schedule(static) if ((int64_t)n * table->cols > PAR_MIN_WORK)
    for (int i = 0; i < n; i++)
        weight_row_f32(table, ids[i], out + (int64_t)i * table->cols);
    return DFLASH_OK;
}

static dflash_status cpu_add_rmsnorm(dflash_backend *be, float *x, const float *delta, const dflash_weight *w,
                                     int n, int dim, float eps, float *out)
{
    (void)be;
    DFLASH_TRY(check_weight(w, "rmsnorm"));
    if (w->rows * w->cols != dim)
        return dflash_fail(DFLASH_ERR_SHAPE, "rmsnorm: weight %s has %lld elements, rows have %d",
                           w->name ? w->name : "?", (long long)(w->rows * w->cols), dim);
    float wf[dim];
    weight_row_f32(&(dflash_weight){ w->dtype, 1, dim, w->data, NULL, NULL }, 0, wf);
#pragma omp parallel for schedule(static) if ((int64_t)n * dim > PAR_MIN_WORK)
    for (int i = 0; i < n; i++) {
        float *xr = x + (int64_t)i * dim;
        if (delta)
            for (int j = 0; j < dim; j++)
                xr[j] += delta[(int64_t)i * dim + j];
        float ss = 0.0f;
        for (int j = 0; j < dim; j++)
            ss += xr[j] * xr[j];
        float inv = 1.0f / sqrtf(ss / (float)dim + eps);
        for (int j = 0; j < dim; j++)
            out[(int64_t)i * dim + j] = wf[j] * (xr[j] * inv);
    }
    return DFLASH_OK;
}

static dflash_status cpu_add(dflash_backend *be, float *x, const float *delta, size_t count)
{
    (void)be;
    for (size_t i = 0; i < count; i++)
        x[i] += delta[i];
    return DFLASH_OK;
}

static dflash_status cpu_linear(dflash_backend *be, const float *x, int n, const dflash_weight *w, float *out)
{
    (void)be;
    DFLASH_TRY(check_weight(w, "linear"));
    const int64_t in = w->cols, outc = w->rows;
    if (n == 1 && w->dtype == DFLASH_DTYPE_BF16) {
        /* One-row decode: read each bf16 weight once, no row buffer. */
#pragma omp parallel for schedule(static) if (in * outc > PAR_MIN_WORK)
        for (int64_t c = 0; c < outc; c++)
            out[c] = dot_bf16(x, (const uint16_t *)w->data + c * in, in);
        return DFLASH_OK;
    }
    /* Parallel over output columns: each thread widens one weight row once
     * and reuses it for every input row. */
#pragma omp parallel if (n * in * outc > PAR_MIN_WORK)
    {
        float wrow[in]; /* one widened weight row per thread, on its stack */
#pragma omp for schedule(static)
        for (int64_t c = 0; c < outc; c++) {
            weight_row_f32(w, c, wrow);
            float s = w->dtype == DFLASH_DTYPE_F8_E4M3 ? w->scales[c] : 1.0f;
            for (int i = 0; i < n; i++)
                out[(int64_t)i * outc + c] = dot_f32(x + (int64_t)i * in, wrow, in) * s;
        }
    }
    return DFLASH_OK;
}

static dflash_status cpu_norm_rope(dflash_backend *be, float *x, const dflash_weight *norm, const int32_t *pos,
                                   int n, int n_heads, int head_dim, float eps, double theta, double pos_scale)
{
    (void)be;
    const int half = head_dim / 2;
    float nw[head_dim], inv_freq[half];
    if (norm) {
        DFLASH_TRY(check_weight(norm, "q/k norm"));
        weight_row_f32(&(dflash_weight){ norm->dtype, 1, head_dim, norm->data, NULL, NULL }, 0, nw);
    }
    /* As Hugging Face computes it: in f32, theta^(2j/D) then its inverse. */
    for (int j = 0; j < half; j++)
        inv_freq[j] = 1.0f / powf((float)theta, (float)(2 * j) / (float)head_dim);
#pragma omp parallel for schedule(static) if ((int64_t)n * n_heads * head_dim > PAR_MIN_WORK)
    for (int i = 0; i < n; i++) {
        float p = (float)((double)pos[i] / pos_scale);
        for (int h = 0; h < n_heads; h++) {
            float *v = x + ((int64_t)i * n_heads + h) * head_dim;
            if (norm) {
                float ss = 0.0f;
                for (int j = 0; j < head_dim; j++)
                    ss += v[j] * v[j];
                float inv = 1.0f / sqrtf(ss / (float)head_dim + eps);
                for (int j = 0; j < head_dim; j++)
                    v[j] = nw[j] * (v[j] * inv);
            }
            for (int j = 0; j < half; j++) {
                float ang = p * inv_freq[j];
                float c = cosf(ang), s = sinf(ang);
                float a = v[j], b = v[j + half];
                v[j] = a * c - b * s;
                v[j + half] = b * c + a * s;
            }
        }
    }
    return DFLASH_OK;
}

static dflash_status cpu_swiglu(dflash_backend *be, const float *gate, const float *up, size_t count, float *out)
{
    (void)be;
#pragma omp parallel for schedule(static) if (count > PAR_MIN_WORK)
    for (size_t i = 0; i < count; i++) {
        float g = gate[i];
        out[i] = g / (1.0f + expf(-g)) * up[i];
    }
    return DFLASH_OK;
}

static int kv_dtype_ok(const dflash_kv_layout *kv)
{
    return kv->dtype == DFLASH_DTYPE_F32 || kv->dtype == DFLASH_DTYPE_BF16;
}

/* Element index of K (which = 0) or V (1) of head `head`, dimension 0, at
 * `pos` in pool block `block` (layout in backend.h). */
static int64_t kv_index(const dflash_kv_layout *kv, int block, int layer, int which, int head, int pos)
{
    int64_t page = (((int64_t)block * kv->n_layers + layer) * 2 + which) * kv->n_kv_heads + head;
    return (page * DFLASH_KV_BLOCK + pos % DFLASH_KV_BLOCK) * kv->head_dim;
}

static dflash_status cpu_kv_write(dflash_backend *be, const dflash_kv_layout *kv, int layer,
                                  const int32_t *block_tables, int bt_len, const int32_t *row_seq,
                                  const int32_t *pos, const float *k, const float *v, int n)
{
    (void)be;
    if (!kv_dtype_ok(kv))
        return dflash_fail(DFLASH_ERR_UNSUPPORTED, "kv_write: KV pool dtype %s (F32 or BF16)",
                           dflash_dtype_name(kv->dtype));
    const int D = kv->head_dim;
    const int64_t row = (int64_t)kv->n_kv_heads * D;
    for (int i = 0; i < n; i++) {
        int blk = block_tables[(int64_t)row_seq[i] * bt_len + (pos[i] / DFLASH_KV_BLOCK) % bt_len];
        if (blk < 0 || blk >= kv->n_blocks)
            return dflash_fail(DFLASH_ERR_INVALID_ARG, "kv_write: position %d maps to block %d (pool has %d)",
                               pos[i], blk, kv->n_blocks);
        for (int which = 0; which < 2; which++) {
            const float *src = (which ? v : k) + i * row;
            for (int h = 0; h < kv->n_kv_heads; h++) {
                int64_t at = kv_index(kv, blk, layer, which, h, pos[i]);
                for (int d = 0; d < D; d++) {
                    float x = src[h * D + d];
                    if (kv->dtype == DFLASH_DTYPE_BF16)
                        ((uint16_t *)kv->data)[at + d] = dflash_f32_to_bf16(x);
                    else
                        ((float *)kv->data)[at + d] = x;
                }
            }
        }
    }
    return DFLASH_OK;
}

/* One key or value row as f32: from the pool in its dtype, or an extra row
 * (f32) rounded to the pool's dtype, as it would be if it were stored. */
static const float *kv_row_f32(dflash_dtype dt, const void *src, int pooled, int D, float *buf)
{
    if (dt != DFLASH_DTYPE_BF16)
        return src;
    for (int d = 0; d < D; d++)
        buf[d] = pooled ? dflash_bf16_to_f32(((const uint16_t *)src)[d]) : dflash_round_bf16(((const float *)src)[d]);
    return buf;
}

/* One (row, head): online softmax over the visible keys, paged keys first
 * (ascending position), then the extra keys (ascending). */
static void attend_one(const dflash_attn_args *a, int i, int h, float *acc)
{
    const int D = a->head_dim, group = a->n_heads / a->n_kv_heads, kvh = h / group;
    const int64_t kv_row = (int64_t)a->n_kv_heads * D;
    const dflash_dtype kdt = a->kv ? a->kv->dtype : DFLASH_DTYPE_F32; /* no pool: extra keys only */
    const size_t es = dflash_dtype_size(kdt);
    const float *q = a->q + ((int64_t)i * a->n_heads + h) * D;
    const int32_t *si = a->seq_info + (int64_t)a->row_seq[i] * DFLASH_SEQ_INFO_LEN;
    const int qp = a->q_pos[i];
    float m = -INFINITY, l = 0.0f, kbuf[D], vbuf[D];
    memset(acc, 0, (size_t)D * sizeof(float));
    for (int pass = 0; pass < 2; pass++) {
        int lo = pass == 0 ? si[0] : 0, hi = pass == 0 ? si[1] : si[3];
        for (int t = lo; t < hi; t++) {
            int kp = pass == 0 ? t : si[4] + t;
            if (a->causal && kp > qp)
                continue;
            if (a->window > 0 && qp - kp >= a->window)
                continue;
            const float *k, *v;
            if (pass == 0) {
                int blk = a->block_tables[(int64_t)a->row_seq[i] * a->bt_len + (kp / DFLASH_KV_BLOCK) % a->bt_len];
                const char *base = a->kv->data;
                k = kv_row_f32(kdt, base + kv_index(a->kv, blk, a->layer, 0, kvh, kp) * es, 1, D, kbuf);
                v = kv_row_f32(kdt, base + kv_index(a->kv, blk, a->layer, 1, kvh, kp) * es, 1, D, vbuf);
            } else {
                k = kv_row_f32(kdt, a->k_extra + (si[2] + t) * kv_row + kvh * D, 0, D, kbuf);
                v = kv_row_f32(kdt, a->v_extra + (si[2] + t) * kv_row + kvh * D, 0, D, vbuf);
            }
            float s = dot_f32(q, k, D) * a->scale;
            float m_new = s > m ? s : m;
            float corr = expf(m - m_new), p = expf(s - m_new);
            l = l * corr + p;
            for (int d = 0; d < D; d++)
                acc[d] = acc[d] * corr + p * v[d];
            m = m_new;
        }
    }
    float inv = l > 0.0f ? 1.0f / l : 0.0f;
    for (int d = 0; d < D; d++)
        acc[d] *= inv;
}

static dflash_status cpu_attention(dflash_backend *be, const dflash_attn_args *a)
{
    (void)be;
    if (a->n_heads % a->n_kv_heads != 0)
        return dflash_fail(DFLASH_ERR_INVALID_ARG, "attention: %d heads not a multiple of %d kv heads",
                           a->n_heads, a->n_kv_heads);
    if (a->kv && !kv_dtype_ok(a->kv))
        return dflash_fail(DFLASH_ERR_UNSUPPORTED, "attention: KV pool dtype %s (F32 or BF16)",
                           dflash_dtype_name(a->kv->dtype));
    /* Work: rows x heads x visible keys x head_dim (keys bounded by hi). */
    int64_t keys = 0;
    for (int i = 0; i < a->n_rows; i++) {
        const int32_t *si = a->seq_info + (int64_t)a->row_seq[i] * DFLASH_SEQ_INFO_LEN;
        keys += si[1] - si[0] + si[3];
    }
#pragma omp parallel for collapse(2) schedule(static) if (keys * a->n_heads * a->head_dim > PAR_MIN_WORK)
    for (int i = 0; i < a->n_rows; i++)
        for (int h = 0; h < a->n_heads; h++)
            attend_one(a, i, h, a->out + ((int64_t)i * a->n_heads + h) * a->head_dim);
    return DFLASH_OK;
}

static dflash_status cpu_copy_rows(dflash_backend *be, float *dst, int64_t dst_stride, const float *src,
                                   int64_t src_stride, const int32_t *idx, int n, int64_t cols)
{
    (void)be;
    for (int i = 0; i < n; i++)
        memcpy(dst + i * dst_stride, src + (int64_t)(idx ? idx[i] : i) * src_stride, (size_t)cols * sizeof(float));
    return DFLASH_OK;
}

static dflash_status cpu_argmax(dflash_backend *be, const float *x, int n, int cols, int32_t *out)
{
    (void)be;
    for (int i = 0; i < n; i++) {
        const float *r = x + (int64_t)i * cols;
        int best = 0, bad = cols <= 0;
        for (int j = 0; j < cols; j++) {
            bad |= isnan(r[j]) || r[j] == INFINITY;
            if (r[j] > r[best])
                best = j;
        }
        out[i] = bad || !(r[best] > -INFINITY) ? -1 : best;
    }
    return DFLASH_OK;
}

const dflash_backend_ops dflash_cpu_ops_table = {
    .name = "cpu",
    .kv_dtype = DFLASH_DTYPE_F32, /* exact against f32 references */
    .destroy = cpu_destroy,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .upload = cpu_copy,
    .download = cpu_copy,
    .sync = cpu_sync,
    .weight_from_host = cpu_weight_from_host,
    .embed = cpu_embed,
    .add_rmsnorm = cpu_add_rmsnorm,
    .add = cpu_add,
    .linear = cpu_linear,
    .norm_rope = cpu_norm_rope,
    .swiglu = cpu_swiglu,
    .kv_write = cpu_kv_write,
    .attention = cpu_attention,
    .copy_rows = cpu_copy_rows,
    .argmax = cpu_argmax,
};
