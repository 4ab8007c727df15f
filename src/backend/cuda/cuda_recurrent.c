/* cuda_recurrent.c: the CUDA launchers of the linear-attention primitives
 * (kernels/recurrent.cu): conv_silu, delta_rule and sigmoid_mul, after the
 * argument checks every backend makes (backend.c). */
#include "backend/cuda/cuda_internal.h"

/* recurrent.cu's bounds: REC_MAX_DK (the state column a thread holds) and
 * its launch bound of 256 threads, one per value column; at least one
 * thread per row of a chunk */
enum { REC_MAX_DK = 128, REC_MAX_DV = 256 };

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
    DFLASH_TRY(cuda_enter(c));
    int adt = (int)a->A_log->dtype, ddt = (int)a->dt_bias->dtype;
    int64_t stride = r->rec_stride;
    int wide = dk > dv ? dk : dv;
    if (wide < DFLASH_REC_CHUNK)
        wide = DFLASH_REC_CHUNK;
    void *args[] = { (void *)&r->info, (void *)&r->state, &stride, (void *)&a->y, (void *)&a->a, (void *)&a->b,
                     (void *)&a->A_log->data, &adt, (void *)&a->dt_bias->data, &ddt, &Hk, &Hv, &dk, &dv,
                     (void *)&a->out };
    return cuda_launch(c, DFK_DELTA_RULE, (unsigned)Hv, (unsigned)r->n_seqs, cdiv(wide, 32) * 32, args);
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
