/* gdn.c: see gdn.h. Owns the Gated DeltaNet forward of a Qwen3.5
 * linear-attention layer, built from the backend's primitives. */
#include "target/gdn.h"

#include "core/rope.h"

static int64_t key_cols(const dflash_model_config *c)
{
    return (int64_t)c->linear_num_key_heads * c->linear_key_head_dim;
}

static int64_t value_cols(const dflash_model_config *c)
{
    return (int64_t)c->linear_num_value_heads * c->linear_value_head_dim;
}

int64_t qwen3_gdn_channels(const dflash_model_config *c) { return 2 * key_cols(c) + value_cols(c); }

dflash_status qwen3_gdn_bufs_alloc(dflash_backend *be, const dflash_model_config *c, int rows, qwen3_gdn_bufs *b)
{
    const size_t R = (size_t)rows, C = (size_t)qwen3_gdn_channels(c), Vd = (size_t)value_cols(c),
                 Hv = (size_t)c->linear_num_value_heads;
    *b = (qwen3_gdn_bufs){ 0 };
    struct { float **p; size_t n; } f[] = {
        { &b->qkv, R * C }, { &b->y, R * C }, { &b->z, R * Vd }, { &b->o, R * Vd }, { &b->a, R * Hv }, { &b->b, R * Hv },
    };
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
        DFLASH_TRY(dflash_be_alloc_f32(be, f[i].n, f[i].p));
    return DFLASH_OK;
}

void qwen3_gdn_bufs_free(dflash_backend *be, qwen3_gdn_bufs *b)
{
    void *p[] = { b->qkv, b->y, b->z, b->o, b->a, b->b };
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++)
        if (p[i])
            be->ops->free(be, p[i]);
    *b = (qwen3_gdn_bufs){ 0 };
}

dflash_status qwen3_gdn_project(dflash_backend *be, const qwen3_gdn *w, const qwen3_gdn_bufs *b, const float *xn,
                                int n)
{
    /* all four read xn: one launch where the backend groups */
    const dflash_weight in[4] = { w->in_qkv, w->in_z, w->in_b, w->in_a };
    float *const out[4] = { b->qkv, b->z, b->b, b->a };
    return dflash_be_linear_group(be, xn, n, in, 4, out, DFLASH_ACT_NONE);
}

dflash_status qwen3_gdn_recur(dflash_backend *be, const dflash_model_config *c, const qwen3_gdn *w,
                              const dflash_rec_args *conv, const dflash_rec_args *delta, const float *qkv,
                              const float *a, const float *b, int n, float *y, float *o)
{
    DFLASH_TRY(be->ops->conv_silu(be, conv, qkv, &w->conv, n, (int)qwen3_gdn_channels(c), c->linear_conv_kernel, y));
    const dflash_delta_args d = {
        .n_rows = n, .n_k_heads = c->linear_num_key_heads, .n_v_heads = c->linear_num_value_heads,
        .k_dim = c->linear_key_head_dim, .v_dim = c->linear_value_head_dim, .y = y, .a = a, .b = b,
        .A_log = &w->A_log, .dt_bias = &w->dt_bias, .out = o,
    };
    return be->ops->delta_rule(be, delta, &d);
}

dflash_status qwen3_gdn_gate_norm(dflash_backend *be, const dflash_model_config *c, const qwen3_gdn *w,
                                  const qwen3_gdn_bufs *b, const int32_t *pos, int n)
{
    /* transformers' gated norm: w * rmsnorm(o) first, then times silu(z) */
    return dflash_be_norm_gate(be, b->o, &w->norm, b->z, pos, n, c->linear_num_value_heads, c->linear_value_head_dim,
                               c->rms_norm_eps);
}
