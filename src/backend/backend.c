/* backend.c: backend-independent helpers over the ops table, and the
 * default composition of each stage from the primitives (what a backend
 * without a fused version runs, and what a fused version must equal). */
#include "backend/backend.h"

static const char *wname(const dflash_weight *w) { return w->name ? w->name : "?"; }

void dflash_backend_destroy(dflash_backend *be)
{
    if (be)
        be->ops->destroy(be);
}

dflash_status dflash_be_alloc_f32(dflash_backend *be, size_t count, float **out)
{
    return be->ops->alloc(be, count * sizeof(float), (void **)out);
}

dflash_status dflash_be_alloc_i32(dflash_backend *be, size_t count, int32_t **out)
{
    return be->ops->alloc(be, count * sizeof(int32_t), (void **)out);
}

dflash_status dflash_be_linear_group(dflash_backend *be, const float *x, int n, const dflash_weight *w, int n_w,
                                     float *const *out, enum dflash_act act)
{
    if (n_w < 1 || n_w > DFLASH_GROUP_MAX_W || (act == DFLASH_ACT_SWIGLU && n_w != 2))
        return dflash_fail(DFLASH_ERR_INVALID_ARG, "linear_group: %d weights with activation %d (1..%d; SwiGLU: 2)",
                           n_w, (int)act, DFLASH_GROUP_MAX_W);
    for (int i = 1; i < n_w; i++)
        if (w[i].cols != w[0].cols || (act == DFLASH_ACT_SWIGLU && w[i].rows != w[0].rows))
            return dflash_fail(DFLASH_ERR_SHAPE, "linear_group: weight %s is [%lld, %lld], %s is [%lld, %lld]",
                               w[i].name ? w[i].name : "?", (long long)w[i].rows, (long long)w[i].cols,
                               w[0].name ? w[0].name : "?", (long long)w[0].rows, (long long)w[0].cols);
    if (be->ops->linear_group)
        return be->ops->linear_group(be, x, n, w, n_w, out, act);
    for (int i = 0; i < n_w; i++)
        DFLASH_TRY(be->ops->linear(be, x, n, &w[i], out[i]));
    if (act == DFLASH_ACT_SWIGLU)
        return be->ops->swiglu(be, out[0], out[1], (size_t)n * (size_t)w[0].rows, out[0]);
    return DFLASH_OK;
}

dflash_status dflash_be_linear_argmax(dflash_backend *be, const float *x, int n, const dflash_weight *w, float *logits,
                                      int32_t *ids)
{
    if (w->rows > 0x7fffffff)
        return dflash_fail(DFLASH_ERR_INVALID_ARG, "linear_argmax: weight %s has %lld rows", w->name ? w->name : "?",
                           (long long)w->rows);
    if (be->ops->linear_argmax)
        return be->ops->linear_argmax(be, x, n, w, logits, ids);
    DFLASH_TRY(be->ops->linear(be, x, n, w, logits));
    return be->ops->argmax(be, logits, n, (int)w->rows, ids);
}

dflash_status dflash_be_linear_gated_add_composed(dflash_backend *be, const float *x, int n, const dflash_weight *w,
                                                  const float *gate, float *tmp, float *out, const dflash_gather *sum)
{
    if (sum)
        DFLASH_TRY(be->ops->gather_sum(be, out, sum->src, sum->idx, sum->w, n, sum->k, w->rows));
    DFLASH_TRY(be->ops->linear(be, x, n, w, tmp));
    DFLASH_TRY(be->ops->sigmoid_mul(be, tmp, gate, n, w->rows, 1));
    return be->ops->add(be, out, tmp, (size_t)n * (size_t)w->rows);
}

dflash_status dflash_be_linear_gated_add(dflash_backend *be, const float *x, int n, const dflash_weight *w,
                                         const float *gate, float *tmp, float *out, const dflash_gather *sum)
{
    if (sum && sum->k < 1)
        return dflash_fail(DFLASH_ERR_INVALID_ARG, "linear_gated_add: a routed sum of %d terms a row (at least 1)",
                           sum->k);
    if (be->ops->linear_gated_add)
        return be->ops->linear_gated_add(be, x, n, w, gate, tmp, out, sum);
    return dflash_be_linear_gated_add_composed(be, x, n, w, gate, tmp, out, sum);
}

dflash_status dflash_be_norm_gate_composed(dflash_backend *be, float *x, const dflash_weight *norm, const float *z,
                                           const int32_t *pos, int n, int n_heads, int head_dim, float eps)
{
    static const dflash_rope no_rotation = { .n_pairs = 0, .attn_factor = 1.0f };
    DFLASH_TRY(be->ops->norm_rope(be, x, norm, pos, n, n_heads, head_dim, eps, &no_rotation));
    return be->ops->swiglu(be, z, x, (size_t)n * (size_t)n_heads * (size_t)head_dim, x);
}

dflash_status dflash_be_norm_gate(dflash_backend *be, float *x, const dflash_weight *norm, const float *z,
                                  const int32_t *pos, int n, int n_heads, int head_dim, float eps)
{
    if (be->ops->norm_gate)
        return be->ops->norm_gate(be, x, norm, z, pos, n, n_heads, head_dim, eps);
    return dflash_be_norm_gate_composed(be, x, norm, z, pos, n, n_heads, head_dim, eps);
}

dflash_status dflash_be_gather_add_rmsnorm_composed(dflash_backend *be, float *x, const dflash_gather *sum,
                                                    float *delta, const dflash_weight *w, int n, int dim, float eps,
                                                    float *out)
{
    DFLASH_TRY(be->ops->gather_sum(be, delta, sum->src, sum->idx, sum->w, n, sum->k, dim));
    return be->ops->add_rmsnorm(be, x, delta, w, n, dim, eps, out);
}

dflash_status dflash_be_gather_add_rmsnorm(dflash_backend *be, float *x, const dflash_gather *sum, float *delta,
                                           const dflash_weight *w, int n, int dim, float eps, float *out)
{
    if (sum->k < 1)
        return dflash_fail(DFLASH_ERR_INVALID_ARG, "gather_add_rmsnorm: a weighted sum of %d terms a row (at least 1)",
                           sum->k);
    if (be->ops->gather_add_rmsnorm)
        return be->ops->gather_add_rmsnorm(be, x, sum, delta, w, n, dim, eps, out);
    return dflash_be_gather_add_rmsnorm_composed(be, x, sum, delta, w, n, dim, eps, out);
}

dflash_status dflash_be_linear_add_rmsnorm_composed(dflash_backend *be, const float *in, int n,
                                                    const dflash_weight *W, float *x, float *delta,
                                                    const dflash_weight *w, int dim, float eps, float *out)
{
    DFLASH_TRY(be->ops->linear(be, in, n, W, delta));
    return be->ops->add_rmsnorm(be, x, delta, w, n, dim, eps, out);
}

dflash_status dflash_be_linear_add_rmsnorm(dflash_backend *be, const float *in, int n, const dflash_weight *W, float *x,
                                           float *delta, const dflash_weight *w, int dim, float eps, float *out)
{
    if (W->rows != dim)
        return dflash_fail(DFLASH_ERR_SHAPE, "linear_add_rmsnorm: weight %s has %lld rows, the residual stream %d",
                           wname(W), (long long)W->rows, dim);
    if (be->ops->linear_add_rmsnorm)
        return be->ops->linear_add_rmsnorm(be, in, n, W, x, delta, w, dim, eps, out);
    return dflash_be_linear_add_rmsnorm_composed(be, in, n, W, x, delta, w, dim, eps, out);
}

dflash_status dflash_be_check_rope(const dflash_rope *rope, int head_dim)
{
    if (!rope || rope->n_pairs < 0 || rope->n_pairs * 2 > head_dim)
        return dflash_fail(DFLASH_ERR_SHAPE, "norm_rope: RoPE table of %d dimension pairs for head_dim %d",
                           rope ? rope->n_pairs : 0, head_dim);
    return DFLASH_OK;
}

/* Whether one launch can norm q and k: both norms of one dtype, or
 * neither (RoPE alone); with no q heads, k's alone. */
static int qk_norms_join(const dflash_weight *q_norm, int n_q_heads, const dflash_weight *k_norm)
{
    if (n_q_heads == 0)
        return 1;
    return q_norm && k_norm ? q_norm->dtype == k_norm->dtype : !q_norm && !k_norm;
}

dflash_status dflash_be_qk_norm_rope(dflash_backend *be, float *q, const dflash_weight *q_norm, int n_q_heads,
                                     float *k, const dflash_weight *k_norm, int n_kv_heads, const int32_t *pos, int n,
                                     int head_dim, float eps, const dflash_rope *rope)
{
    if (be->ops->qk_norm_rope && qk_norms_join(q_norm, n_q_heads, k_norm))
        return be->ops->qk_norm_rope(be, q, q_norm, n_q_heads, k, k_norm, n_kv_heads, pos, n, head_dim, eps, rope);
    DFLASH_TRY(be->ops->norm_rope(be, q, q_norm, pos, n, n_q_heads, head_dim, eps, rope));
    return be->ops->norm_rope(be, k, k_norm, pos, n, n_kv_heads, head_dim, eps, rope);
}

dflash_status dflash_be_qk_norm_rope_store(dflash_backend *be, float *q, const dflash_weight *q_norm, int n_q_heads,
                                           float *k, const dflash_weight *k_norm, int n_kv_heads,
                                           const int32_t *pos, int n, int head_dim, float eps,
                                           const dflash_rope *rope, const dflash_kv_dest *dst)
{
    if (!dst)
        return dflash_be_qk_norm_rope(be, q, q_norm, n_q_heads, k, k_norm, n_kv_heads, pos, n, head_dim, eps, rope);
    if (be->ops->qk_norm_rope_store && qk_norms_join(q_norm, n_q_heads, k_norm))
        return be->ops->qk_norm_rope_store(be, q, q_norm, n_q_heads, k, k_norm, n_kv_heads, pos, n, head_dim, eps,
                                           rope, dst);
    DFLASH_TRY(dflash_be_qk_norm_rope(be, q, q_norm, n_q_heads, k, k_norm, n_kv_heads, pos, n, head_dim, eps, rope));
    return be->ops->kv_write(be, dst->kv, dst->layer, dst->page_tables, dst->pt_len, dst->row_seq, pos, k, dst->v, n);
}

dflash_status dflash_be_qkv_norm_rope_store_composed(dflash_backend *be, const dflash_qkv_args *a)
{
    float *const out[3] = { a->q, a->k, a->v };
    DFLASH_TRY(dflash_be_linear_group(be, a->x, a->n, a->w, 3, out, DFLASH_ACT_NONE));
    return dflash_be_qk_norm_rope_store(be, a->q, a->q_norm, a->n_q_heads, a->k, a->k_norm, a->n_kv_heads, a->pos,
                                        a->n, a->head_dim, a->eps, a->rope, a->dst);
}

/* The stage's weights fit its heads, and its K/V destination stores its v. */
static dflash_status qkv_check(const dflash_qkv_args *a)
{
    const int64_t hq = (int64_t)a->n_q_heads * a->head_dim, hkv = (int64_t)a->n_kv_heads * a->head_dim;
    const dflash_weight *w = a->w;
    if (w[0].rows != hq || w[1].rows != hkv || w[2].rows != hkv)
        return dflash_fail(DFLASH_ERR_SHAPE, "qkv_norm_rope_store: weights %s, %s, %s have %lld, %lld, %lld rows, "
                           "the heads %lld, %lld, %lld", wname(&w[0]), wname(&w[1]), wname(&w[2]), (long long)w[0].rows,
                           (long long)w[1].rows, (long long)w[2].rows, (long long)hq, (long long)hkv, (long long)hkv);
    if (a->dst && a->dst->v != a->v)
        return dflash_fail(DFLASH_ERR_INVALID_ARG, "qkv_norm_rope_store: the K/V destination stores V from another "
                           "buffer than the stage's v");
    return DFLASH_OK;
}

dflash_status dflash_be_qkv_norm_rope_store(dflash_backend *be, const dflash_qkv_args *a)
{
    DFLASH_TRY(qkv_check(a));
    if (be->ops->qkv_norm_rope_store && qk_norms_join(a->q_norm, a->n_q_heads, a->k_norm))
        return be->ops->qkv_norm_rope_store(be, a);
    return dflash_be_qkv_norm_rope_store_composed(be, a);
}

dflash_status dflash_be_qkv_attention(dflash_backend *be, const dflash_qkv_args *q, const dflash_attn_args *a)
{
    if (be->ops->qkv_attention && q->dst && qk_norms_join(q->q_norm, q->n_q_heads, q->k_norm)) {
        DFLASH_TRY(qkv_check(q));
        return be->ops->qkv_attention(be, q, a);
    }
    DFLASH_TRY(dflash_be_qkv_norm_rope_store(be, q));
    return be->ops->attention(be, a);
}

dflash_status dflash_be_check_bias(const dflash_weight *b, int cols)
{
    if (b->dtype == DFLASH_DTYPE_F8_E4M3)
        return dflash_fail(DFLASH_ERR_UNSUPPORTED, "bias: %s is fp8 (BF16, F16 or F32 only)", wname(b));
    if (b->rows * b->cols != cols)
        return dflash_fail(DFLASH_ERR_SHAPE, "bias: %s has %lld elements, rows have %d", wname(b),
                           (long long)(b->rows * b->cols), cols);
    return DFLASH_OK;
}

dflash_status dflash_be_check_conv(const dflash_weight *w, int channels, int kernel)
{
    if (kernel < 1 || kernel > DFLASH_CONV_MAX_KERNEL || w->rows != channels || w->cols != kernel ||
        w->dtype == DFLASH_DTYPE_F8_E4M3)
        return dflash_fail(DFLASH_ERR_SHAPE, "conv_silu: weight %s is [%lld, %lld] %s for %d channels of kernel %d "
                           "(1..%d; BF16, F16 or F32)", wname(w), (long long)w->rows, (long long)w->cols,
                           dflash_dtype_name(w->dtype), channels, kernel, DFLASH_CONV_MAX_KERNEL);
    return DFLASH_OK;
}

dflash_status dflash_be_check_delta(const dflash_delta_args *a, int max_k_dim, int max_v_dim)
{
    const int Hk = a->n_k_heads, Hv = a->n_v_heads, dk = a->k_dim, dv = a->v_dim;
    const int64_t na = a->A_log->rows * a->A_log->cols, nd = a->dt_bias->rows * a->dt_bias->cols;
    if (Hk <= 0 || Hv <= 0 || Hv % Hk || dk <= 0 || (max_k_dim && dk > max_k_dim) || dv <= 0 ||
        (max_v_dim && dv > max_v_dim) || na != Hv || nd != Hv || a->A_log->dtype == DFLASH_DTYPE_F8_E4M3 ||
        a->dt_bias->dtype == DFLASH_DTYPE_F8_E4M3)
        return dflash_fail(DFLASH_ERR_SHAPE, "delta_rule: %d key heads of %d (at most %d), %d value heads of %d (at "
                           "most %d), A_log %s and dt_bias %s of %lld and %lld elements (not fp8)", Hk, dk, max_k_dim,
                           Hv, dv, max_v_dim, wname(a->A_log), wname(a->dt_bias), (long long)na, (long long)nd);
    return DFLASH_OK;
}

dflash_status dflash_be_check_rec(const dflash_rec_args *r, int64_t need, const char *op)
{
    if (r->n_seqs < 0 || r->rec_stride < need)
        return dflash_fail(DFLASH_ERR_INVALID_ARG, "%s: %d sequences, records of %lld floats where this layer's take "
                           "%lld", op, r->n_seqs, (long long)r->rec_stride, (long long)need);
    return DFLASH_OK;
}

dflash_status dflash_be_check_gate(int64_t cols, int64_t g_cols)
{
    if (g_cols != 1 && g_cols < cols)
        return dflash_fail(DFLASH_ERR_SHAPE, "sigmoid_mul: %lld gate columns for %lld columns", (long long)g_cols,
                           (long long)cols);
    return DFLASH_OK;
}
