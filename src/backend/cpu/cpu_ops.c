/* cpu_ops.c: the reference definition of every backend op but the linear
 * (cpu_gemm.c), in C.
 *
 * Two properties matter beyond the math:
 * - every output element is computed by one thread in a fixed order, so a
 *   row's result never depends on how many rows share the call (what makes
 *   speculative output bit-identical to plain decoding);
 * - f32 accumulation everywhere; weights are widened exactly to f32. */
#include "backend/cpu/cpu_internal.h"

#include <math.h>
#include <stdatomic.h>
#include <string.h>

/* Below this many multiply-adds an op runs on one thread: waking a team
 * costs more than the work (and oversubscribed machines spin). Results do
 * not depend on the choice: each element is still computed in one order. */
#define PAR_MIN_WORK (1 << 21)

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
 * (independent of any batch size) that the compiler can still vectorize.
 * Always inlined, so attention's clones get it in their own instruction
 * set. */
static inline __attribute__((always_inline)) float dot_f32(const float *a, const float *b, int64_t n)
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
        dflash_cpu_weight_row(table, ids[i], out + (int64_t)i * table->cols);
    return DFLASH_OK;
}

static dflash_status cpu_add_bias(dflash_backend *be, float *x, const dflash_weight *b, int n, int cols)
{
    (void)be;
    DFLASH_TRY(check_weight(b, "bias"));
    DFLASH_TRY(dflash_be_check_bias(b, cols));
    float bf[cols];
    dflash_cpu_weight_row(&(dflash_weight){ b->dtype, 1, cols, b->data, NULL, NULL }, 0, bf);
    for (int i = 0; i < n; i++)
        for (int j = 0; j < cols; j++)
            x[(int64_t)i * cols + j] += bf[j];
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
    dflash_cpu_weight_row(&(dflash_weight){ w->dtype, 1, dim, w->data, NULL, NULL }, 0, wf);
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
    return dflash_cpu_gemm(dflash_cpu_isa_active(), x, n, w, out);
}

static dflash_status cpu_norm_rope(dflash_backend *be, float *x, const dflash_weight *norm, const int32_t *pos,
                                   int n, int n_heads, int head_dim, float eps, const dflash_rope *rope)
{
    (void)be;
    DFLASH_TRY(dflash_be_check_rope(rope, head_dim));
    const int half = rope->n_pairs;
    const float *inv_freq = rope->inv_freq, attn = rope->attn_factor;
    float nw[head_dim];
    if (norm) {
        DFLASH_TRY(check_weight(norm, "q/k norm"));
        dflash_cpu_weight_row(&(dflash_weight){ norm->dtype, 1, head_dim, norm->data, NULL, NULL }, 0, nw);
    }
#pragma omp parallel for schedule(static) if ((int64_t)n * n_heads * head_dim > PAR_MIN_WORK)
    for (int i = 0; i < n; i++) {
        float p = (float)pos[i]; /* as transformers: position ids as f32 */
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
                float c = cosf(ang) * attn, s = sinf(ang) * attn;
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

static dflash_status cpu_sigmoid_mul(dflash_backend *be, float *x, const float *g, int n, int64_t cols,
                                     int64_t g_cols)
{
    (void)be;
    DFLASH_TRY(dflash_be_check_gate(cols, g_cols));
#pragma omp parallel for schedule(static) if ((int64_t)n * cols > PAR_MIN_WORK)
    for (int i = 0; i < n; i++)
        for (int64_t c = 0; c < cols; c++) {
            const float gv = g[(int64_t)i * g_cols + (g_cols == 1 ? 0 : c)];
            x[(int64_t)i * cols + c] *= 1.0f / (1.0f + expf(-gv));
        }
    return DFLASH_OK;
}

static int kv_dtype_ok(const dflash_kv_layout *kv)
{
    return kv->dtype == DFLASH_DTYPE_F32 || kv->dtype == DFLASH_DTYPE_BF16;
}

/* Element index of K (which = 0) or V (1) of head `head`, dimension 0, at
 * `pos` in pool page `page` (layout in backend.h). */
static inline __attribute__((always_inline)) int64_t kv_index(const dflash_kv_layout *kv, int page, int layer, int which, int head, int pos)
{
    int64_t run = (((int64_t)page * kv->n_layers + layer) * 2 + which) * kv->n_kv_heads + head;
    return (run * DFLASH_KV_PAGE + pos % DFLASH_KV_PAGE) * kv->head_dim;
}

static dflash_status cpu_kv_write(dflash_backend *be, const dflash_kv_layout *kv, int layer,
                                  const int32_t *page_tables, int pt_len, const int32_t *row_seq,
                                  const int32_t *pos, const float *k, const float *v, int n)
{
    (void)be;
    if (!kv_dtype_ok(kv))
        return dflash_fail(DFLASH_ERR_UNSUPPORTED, "kv_write: KV pool dtype %s (F32 or BF16)",
                           dflash_dtype_name(kv->dtype));
    const int D = kv->head_dim;
    const int64_t row = (int64_t)kv->n_kv_heads * D;
    for (int i = 0; i < n; i++) {
        int blk = page_tables[(int64_t)row_seq[i] * pt_len + (pos[i] / DFLASH_KV_PAGE) % pt_len];
        if (blk < 0 || blk >= kv->n_pages)
            return dflash_fail(DFLASH_ERR_INVALID_ARG, "kv_write: position %d maps to page %d (pool has %d)",
                               pos[i], blk, kv->n_pages);
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
static inline __attribute__((always_inline)) const float *kv_row_f32(dflash_dtype dt, const void *src, int pooled, int D, float *buf)
{
    if (dt != DFLASH_DTYPE_BF16)
        return src;
    for (int d = 0; d < D; d++)
        buf[d] = pooled ? dflash_bf16_to_f32(((const uint16_t *)src)[d]) : dflash_round_bf16(((const float *)src)[d]);
    return buf;
}

/* The pool row (K: which 0, V: 1) of kv head kvh at position kp of row
 * i's sequence, in the pool's dtype. */
static inline __attribute__((always_inline)) const char *paged_row(const dflash_attn_args *a, int i, int kp, int which,
                                                                   int kvh)
{
    int blk = a->page_tables[(int64_t)a->row_seq[i] * a->pt_len + (kp / DFLASH_KV_PAGE) % a->pt_len];
    return (const char *)a->kv->data + kv_index(a->kv, blk, a->layer, which, kvh, kp) * dflash_dtype_size(a->kv->dtype);
}

/* Key or value row `which` of kv head kvh at key position kp: paged (pass
 * 0) or extra (pass 1, its index t), as f32 (bf16 rows are widened into
 * buf). */
static inline __attribute__((always_inline)) const float *attn_row(const dflash_attn_args *a, int i, int pass, int t,
                                                                   int kp, int which, int kvh, float *buf)
{
    const int D = a->head_dim;
    const dflash_dtype kdt = a->kv ? a->kv->dtype : DFLASH_DTYPE_F32; /* no pool: extra keys only */
    if (pass == 0)
        return kv_row_f32(kdt, paged_row(a, i, kp, which, kvh), 1, D, buf);
    const int32_t *si = a->seq_info + (int64_t)a->row_seq[i] * DFLASH_SEQ_INFO_LEN;
    const float *src = which ? a->v_extra : a->k_extra;
    return kv_row_f32(kdt, src + (si[2] + t) * (int64_t)a->n_kv_heads * D + kvh * D, 0, D, buf);
}

/* Ask for the paged row of position kp early: rows are contiguous only
 * within a 16-position page, and the hardware prefetcher does not follow
 * a walk onto the next page, so without this every key waits on memory. */
static inline __attribute__((always_inline)) void attn_prefetch(const dflash_attn_args *a, int i, int kp, int which,
                                                                int kvh)
{
    const char *row = paged_row(a, i, kp, which, kvh);
    for (size_t off = 0; off < (size_t)a->head_dim * dflash_dtype_size(a->kv->dtype); off += 64)
        __builtin_prefetch(row + off);
}

/* Queries one attention task handles together: they share every key and
 * value row load. */
#define ATTN_TASK_QUERIES 16
/* Keys ahead that attn_prefetch asks for. */
#define ATTN_PREFETCH 4
/* From this much work (multiply-adds of the scores) on, attention's tasks
 * are shared among the pool's threads. */
#define ATTN_POOL_MIN (1 << 18)

/* A task: rows [r0, r1) of one sequence (consecutive: rows are
 * sequence-major) and query heads h0 .. h0 + nh - 1 of the group of kv
 * head kvh (all of it unless the group has more than ATTN_TASK_QUERIES
 * heads). Per query, softmax in
 * three passes over its visible keys in a fixed order (paged keys by
 * ascending position, then the extra keys): scores (kept in sc) and their
 * maximum; exponentials and their sum; the weighted sum of the values,
 * divided by the sum at the end. A query's result depends only on its own
 * keys in that order, never on which other queries share the task, so a
 * row computes the same bits in a 1-row decode and a 16-row verify.
 * Compiled for several instruction sets (target_clones): without
 * contraction or reassociation the vector code computes exactly what the
 * scalar code does, so every clone gives the same bits. */
__attribute__((target_clones("avx512f", "avx2", "default"))) static void attend_task(const dflash_attn_args *a,
                                                                                     int r0, int r1, int kvh, int h0,
                                                                                     int nh, int max_keys, float *sc)
{
    const int D = a->head_dim, G = a->n_heads / a->n_kv_heads, nq = (r1 - r0) * nh;
    const int32_t *si = a->seq_info + (int64_t)a->row_seq[r0] * DFLASH_SEQ_INFO_LEN;
    float m[ATTN_TASK_QUERIES], l[ATTN_TASK_QUERIES], acc[ATTN_TASK_QUERIES][D], buf[D];
    int n[ATTN_TASK_QUERIES];
    for (int qi = 0; qi < nq; qi++) {
        m[qi] = -INFINITY;
        l[qi] = 0.0f;
        n[qi] = 0;
        memset(acc[qi], 0, (size_t)D * sizeof(float));
    }
    /* query qi: row r0 + qi / nh, head kvh * G + h0 + qi % nh */
#define QROW(qi) (r0 + (qi) / nh)
#define QHEAD(qi) (kvh * G + h0 + (qi) % nh)
#define VISIBLE(qi, kp)                                                                                        \
    (!(a->causal && (kp) > a->q_pos[QROW(qi)]) && !(a->window > 0 && a->q_pos[QROW(qi)] - (kp) >= a->window))
    for (int pass = 0; pass < 2; pass++) {
        int lo = pass == 0 ? si[0] : 0, hi = pass == 0 ? si[1] : si[3];
        for (int t = lo; t < hi; t++) {
            const int kp = pass == 0 ? t : si[4] + t;
            if (pass == 0 && t + ATTN_PREFETCH < hi)
                attn_prefetch(a, r0, kp + ATTN_PREFETCH, 0, kvh);
            const float *k = attn_row(a, r0, pass, t, kp, 0, kvh, buf);
            for (int qi = 0; qi < nq; qi++) {
                if (!VISIBLE(qi, kp))
                    continue;
                const float *q = a->q + ((int64_t)QROW(qi) * a->n_heads + QHEAD(qi)) * D;
                float s = dot_f32(q, k, D) * a->scale;
                sc[(int64_t)qi * max_keys + n[qi]++] = s;
                m[qi] = s > m[qi] ? s : m[qi];
            }
        }
    }
    for (int qi = 0; qi < nq; qi++) {
        float *row = sc + (int64_t)qi * max_keys;
        for (int j = 0; j < n[qi]; j++) {
            row[j] = expf(row[j] - m[qi]);
            l[qi] += row[j];
        }
        n[qi] = 0; /* reused as the read index below */
    }
    for (int pass = 0; pass < 2; pass++) {
        int lo = pass == 0 ? si[0] : 0, hi = pass == 0 ? si[1] : si[3];
        for (int t = lo; t < hi; t++) {
            const int kp = pass == 0 ? t : si[4] + t;
            if (pass == 0 && t + ATTN_PREFETCH < hi)
                attn_prefetch(a, r0, kp + ATTN_PREFETCH, 1, kvh);
            const float *v = attn_row(a, r0, pass, t, kp, 1, kvh, buf);
            for (int qi = 0; qi < nq; qi++) {
                if (!VISIBLE(qi, kp))
                    continue;
                const float p = sc[(int64_t)qi * max_keys + n[qi]++];
                for (int d = 0; d < D; d++)
                    acc[qi][d] += p * v[d];
            }
        }
    }
    for (int qi = 0; qi < nq; qi++) {
        float *out = a->out + ((int64_t)QROW(qi) * a->n_heads + QHEAD(qi)) * D;
        const float inv = l[qi] > 0.0f ? 1.0f / l[qi] : 0.0f; /* no visible key: zeros */
        for (int d = 0; d < D; d++)
            out[d] = acc[qi][d] * inv;
    }
#undef VISIBLE
#undef QHEAD
#undef QROW
}

/* Attention's tasks for the pool (cpu_pool.c): task t is row run t / per_run,
 * then kv head, then head chunk (of `heads` query heads) within the group. */
typedef struct attn_job {
    const dflash_attn_args *a;
    const int *run0;
    int heads, chunks, max_keys; /* query heads per task, head chunks per group */
    atomic_int oom;
} attn_job;

static void attn_chunk(void *ctx, int t)
{
    attn_job *j = ctx;
    const int G = j->a->n_heads / j->a->n_kv_heads, per_run = j->a->n_kv_heads * j->chunks;
    const int r = t / per_run, kvh = t % per_run / j->chunks, h0 = t % j->chunks * j->heads;
    const int nh = G - h0 < j->heads ? G - h0 : j->heads;
    float *sc = dflash_cpu_scratch((size_t)ATTN_TASK_QUERIES * (size_t)j->max_keys);
    if (!sc) {
        atomic_store(&j->oom, 1);
        return;
    }
    attend_task(j->a, j->run0[r], j->run0[r + 1], kvh, h0, nh, j->max_keys, sc);
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
    /* Tasks: runs of consecutive rows of one sequence, times the kv heads,
     * times chunks of a group's query heads, ATTN_TASK_QUERIES queries at
     * most. Work: rows x heads x keys x head_dim; the score buffer holds
     * the most keys one row can see, per query. */
    const int G = a->n_heads / a->n_kv_heads;
    const int heads = G < ATTN_TASK_QUERIES ? G : ATTN_TASK_QUERIES, rows_per_task = ATTN_TASK_QUERIES / heads;
    int n_runs = 0, run0[a->n_rows + 1];
    int64_t keys = 0;
    int max_keys = 1;
    for (int i = 0; i < a->n_rows; i++) {
        const int32_t *si = a->seq_info + (int64_t)a->row_seq[i] * DFLASH_SEQ_INFO_LEN;
        int nk = si[1] - si[0] + si[3];
        keys += nk;
        max_keys = nk > max_keys ? nk : max_keys;
        if (i == 0 || a->row_seq[i] != a->row_seq[i - 1] || i - run0[n_runs - 1] == rows_per_task)
            run0[n_runs++] = i;
    }
    run0[n_runs] = a->n_rows;
    attn_job j = { a, run0, heads, (G + heads - 1) / heads, max_keys, ATOMIC_VAR_INIT(0) };
    const int n_tasks = n_runs * a->n_kv_heads * j.chunks;
    if (keys * a->n_heads * a->head_dim >= ATTN_POOL_MIN)
        dflash_cpu_pool_run(attn_chunk, &j, n_tasks);
    else
        for (int t = 0; t < n_tasks; t++)
            attn_chunk(&j, t);
    if (atomic_load(&j.oom))
        return dflash_fail(DFLASH_ERR_OOM, "attention: out of memory for %d x %d scores", ATTN_TASK_QUERIES,
                           max_keys);
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

static dflash_status cpu_copy_ids(dflash_backend *be, int32_t *dst, int64_t dst_stride, const int32_t *src,
                                  int64_t src_stride, int n, int cols)
{
    (void)be;
    for (int i = 0; i < n; i++)
        memmove(dst + i * dst_stride, src + i * src_stride, (size_t)cols * sizeof(int32_t));
    return DFLASH_OK;
}

static dflash_status cpu_gather_sum(dflash_backend *be, float *out, const float *src, const int32_t *idx, const float *w,
                                    int n, int k, int64_t cols)
{
    (void)be;
    for (int i = 0; i < n; i++) {
        float *o = out + (int64_t)i * cols;
        for (int64_t c = 0; c < cols; c++)
            o[c] = 0.0f;
        for (int j = 0; j < k; j++) {
            const float wj = w[(int64_t)i * k + j], *s = src + (int64_t)idx[(int64_t)i * k + j] * cols;
            /* two roundings: a separate statement, and ISO C mode (-std=c11) does not contract it into an fma */
            for (int64_t c = 0; c < cols; c++) {
                const float p = wj * s[c];
                o[c] += p;
            }
        }
    }
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

static dflash_status cpu_count_tokens(dflash_backend *be, int32_t *counts, int V, const int32_t *ids, int n,
                                      int generated)
{
    (void)be;
    if (!ids) {
        for (int j = 0; j < V; j++)
            counts[j] = -1;
        return DFLASH_OK;
    }
    for (int i = 0; i < n; i++)
        if (ids[i] >= 0 && ids[i] < V)
            counts[ids[i]] = (counts[ids[i]] > 0 ? counts[ids[i]] : 0) + (generated != 0);
    return DFLASH_OK;
}

/* The MoE stages on memory the host reads: no copies, no allocation. */
static dflash_status cpu_moe_route(dflash_backend *be, const dflash_route_args *r)
{
    (void)be;
    dflash_moe_route_rows(r);
    return DFLASH_OK;
}

static dflash_status cpu_linear_experts(dflash_backend *be, const dflash_experts_args *a)
{
    return dflash_be_linear_experts_each(be, a, a->first);
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
    .add_bias = cpu_add_bias,
    .linear = cpu_linear,
    .norm_rope = cpu_norm_rope,
    .swiglu = cpu_swiglu,
    .kv_write = cpu_kv_write,
    .attention = cpu_attention,
    .copy_rows = cpu_copy_rows,
    .copy_ids = cpu_copy_ids,
    .gather_sum = cpu_gather_sum,
    .sigmoid_mul = cpu_sigmoid_mul,
    .conv_silu = dflash_cpu_conv_silu,
    .delta_rule = dflash_cpu_delta_rule,
    .argmax = cpu_argmax,
    .count_tokens = cpu_count_tokens,
    .moe_route = cpu_moe_route,
    .linear_experts = cpu_linear_experts,
};
