/* cuda_recurrent.c: the CUDA launchers of the linear-attention primitives
 * (kernels/recurrent.cu): conv_silu, delta_rule and sigmoid_mul, with the
 * CPU reference's argument checks. */
#include "backend/cuda/cuda_internal.h"

/* recurrent.cu's bounds: REC_MAX_DK (the state column a thread holds) and
 * its launch bound of 256 threads, one per value column */
enum { REC_MAX_KERNEL = 16, REC_MAX_DK = 128, REC_MAX_DV = 256 };

dflash_status cuda_conv_silu(dflash_backend *be, const dflash_rec_args *r, const float *x, const dflash_weight *w,
                             int n, int channels, int kernel, float *out)
{
    cuda_ctx *c = CTX(be);
    DFLASH_TRY(cuda_check_weight(w, "conv_silu"));
    if (kernel < 1 || kernel > REC_MAX_KERNEL || w->rows != channels || w->cols != kernel || w->scales)
        return dflash_fail(DFLASH_ERR_SHAPE, "conv_silu: weight %s is [%lld, %lld]%s for %d channels of kernel %d "
                           "(1..%d)", w->name ? w->name : "?", (long long)w->rows, (long long)w->cols,
                           w->scales ? " with scales" : "", channels, kernel, REC_MAX_KERNEL);
    if (n <= 0 || r->n_seqs <= 0 || channels <= 0)
        return DFLASH_OK;
    DFLASH_TRY(cuda_enter(c));
    int wdt = (int)w->dtype;
    int64_t stride = r->slot_stride;
    void *args[] = { (void *)&r->info, (void *)&r->state, &stride, (void *)&x, (void *)&w->data, &wdt, &channels,
                     &kernel, &out };
    return cuda_launch(c, DFK_CONV_SILU, cdiv(channels, 128), (unsigned)r->n_seqs, 128, args);
}

dflash_status cuda_delta_rule(dflash_backend *be, const dflash_rec_args *r, const dflash_delta_args *a)
{
    cuda_ctx *c = CTX(be);
    int Hk = a->n_k_heads, Hv = a->n_v_heads, dk = a->k_dim, dv = a->v_dim;
    if (Hk <= 0 || Hv <= 0 || Hv % Hk || dk <= 0 || dk > REC_MAX_DK || dv <= 0 || dv > REC_MAX_DV ||
        a->A_log->rows * a->A_log->cols != Hv || a->dt_bias->rows * a->dt_bias->cols != Hv || a->A_log->scales ||
        a->dt_bias->scales)
        return dflash_fail(DFLASH_ERR_SHAPE, "delta_rule: %d key heads of %d (at most %d), %d value heads of %d (at "
                           "most %d), A_log %s and dt_bias %s of %lld and %lld elements", Hk, dk, REC_MAX_DK, Hv, dv,
                           REC_MAX_DV,
                           a->A_log->name ? a->A_log->name : "?", a->dt_bias->name ? a->dt_bias->name : "?",
                           (long long)(a->A_log->rows * a->A_log->cols),
                           (long long)(a->dt_bias->rows * a->dt_bias->cols));
    if (a->n_rows <= 0 || r->n_seqs <= 0)
        return DFLASH_OK;
    DFLASH_TRY(cuda_enter(c));
    int adt = (int)a->A_log->dtype, ddt = (int)a->dt_bias->dtype;
    int64_t stride = r->slot_stride;
    const int wide = dk > dv ? dk : dv;
    void *args[] = { (void *)&r->info, (void *)&r->state, &stride, (void *)&a->y, (void *)&a->a, (void *)&a->b,
                     (void *)&a->A_log->data, &adt, (void *)&a->dt_bias->data, &ddt, &Hk, &Hv, &dk, &dv,
                     (void *)&a->out };
    return cuda_launch(c, DFK_DELTA_RULE, (unsigned)Hv, (unsigned)r->n_seqs, cdiv(wide, 32) * 32, args);
}

dflash_status cuda_sigmoid_mul(dflash_backend *be, float *x, const float *g, int n, int64_t cols, int64_t g_cols)
{
    cuda_ctx *c = CTX(be);
    if (g_cols != 1 && g_cols != cols)
        return dflash_fail(DFLASH_ERR_SHAPE, "sigmoid_mul: %lld gate columns for %lld columns", (long long)g_cols,
                           (long long)cols);
    if (n <= 0 || cols <= 0)
        return DFLASH_OK;
    DFLASH_TRY(cuda_enter(c));
    int64_t rows = n;
    unsigned blocks = cdiv(rows * cols, 256);
    if (blocks > 65535)
        blocks = 65535;
    void *args[] = { &x, (void *)&g, &rows, &cols, &g_cols };
    return cuda_launch(c, DFK_SIGMOID_MUL, blocks, 1, 256, args);
}
