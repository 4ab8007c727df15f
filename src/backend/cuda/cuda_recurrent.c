/* cuda_recurrent.c: the CUDA launchers of the linear-attention primitives
 * (kernels/recurrent.cu): conv_silu, delta_rule and sigmoid_mul, after the
 * argument checks every backend makes (backend.c). */
#include "backend/cuda/cuda_internal.h"

/* recurrent.cu's bounds: REC_MAX_DK (the state rows a column's threads
 * hold between them) and the value columns it checks; delta_rule's blocks
 * (DR_COLS value columns of one head, DR_THREADS threads) and the rows of
 * each sequence one launch takes (DR_WIN) */
enum { REC_MAX_DK = 128, REC_MAX_DV = 256, DR_COLS = 32, DR_THREADS = 256, DR_WIN = 16 };

dflash_status cuda_conv_silu(dflash_backend *be, const dflash_rec_args *r, const float *x, const dflash_weight *w,
                             int n, int channels, int kernel, float *out)
{
    cuda_ctx *c = CTX(be);
    DFLASH_TRY(cuda_check_weight(w, "conv_silu"));
    DFLASH_TRY(dflash_be_check_conv(w, channels, kernel));
    DFLASH_TRY(dflash_be_check_rec(r, dflash_conv_rec_size(channels), "conv_silu"));
    if (n <= 0 || r->n_seqs <= 0 || channels <= 0)
        return DFLASH_OK;
    DFLASH_TRY(cuda_enter(c));
    int wdt = (int)w->dtype;
    int64_t stride = r->rec_stride;
    void *args[] = { (void *)&r->info, (void *)&r->state, &stride, (void *)&x, (void *)&w->data, &wdt, &channels,
                     &kernel, &out };
    return cuda_launch(c, DFK_CONV_SILU, cdiv(channels, 128), (unsigned)r->n_seqs, 128, args);
}

dflash_status cuda_delta_rule(dflash_backend *be, const dflash_rec_args *r, const dflash_delta_args *a)
{
    cuda_ctx *c = CTX(be);
    DFLASH_TRY(dflash_be_check_delta(a, REC_MAX_DK, REC_MAX_DV));
    int Hk = a->n_k_heads, Hv = a->n_v_heads, dk = a->k_dim, dv = a->v_dim;
    DFLASH_TRY(dflash_be_check_rec(r, dflash_delta_rec_size(Hv, dk, dv), "delta_rule"));
    if (a->n_rows <= 0 || r->n_seqs <= 0)
        return DFLASH_OK;
    if (r->max_seq_rows < 1 || r->max_seq_rows > a->n_rows)
        return dflash_fail(DFLASH_ERR_INVALID_ARG, "delta_rule: max_seq_rows %d for a call of %d rows (the launches "
                           "cover a sequence's rows up to it)", r->max_seq_rows, a->n_rows);
    DFLASH_TRY(cuda_enter(c));
    int adt = (int)a->A_log->dtype, ddt = (int)a->dt_bias->dtype;
    int64_t stride = r->rec_stride;
    /* windows of DR_WIN rows of every sequence, one launch each (a
     * verify or decode is one; recurrent.cu says why a long call is cut) */
    for (int t0 = 0; t0 < r->max_seq_rows; t0 += DR_WIN) {
        void *args[] = { (void *)&r->info, (void *)&r->state, &stride, (void *)&a->y, (void *)&a->a, (void *)&a->b,
                         (void *)&a->A_log->data, &adt, (void *)&a->dt_bias->data, &ddt, &Hk, &Hv, &dk, &dv, &t0,
                         (void *)&a->out };
        DFLASH_TRY(cuda_launch(c, dk == REC_MAX_DK ? DFK_DELTA_RULE_FULL : DFK_DELTA_RULE,
                               (unsigned)Hv * cdiv(dv, DR_COLS), (unsigned)r->n_seqs, DR_THREADS, args));
    }
    return DFLASH_OK;
}

dflash_status cuda_sigmoid_mul(dflash_backend *be, float *x, const float *g, int n, int64_t cols, int64_t g_cols)
{
    cuda_ctx *c = CTX(be);
    DFLASH_TRY(dflash_be_check_gate(cols, g_cols));
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
