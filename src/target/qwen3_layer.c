/* qwen3_layer.c: see qwen3_layer.h. */
#include "target/qwen3_layer.h"

#include <math.h>
#include <stdio.h>

#include "backend/weight_bind.h"

dflash_status qwen3_layer_bind(dflash_backend *be, const dflash_st *st, const char *prefix,
                               const dflash_model_config *c, qwen3_layer *l, int64_t *n_params)
{
    const int64_t H = c->hidden_size, D = c->head_dim, Hq = c->num_attention_heads,
                  Hkv = c->num_key_value_heads, I = c->intermediate_size;
    const struct {
        const char *suffix;
        dflash_weight *w;
        int64_t rows, cols;
    } spec[] = {
        { "input_layernorm.weight", &l->input_norm, 0, H },
        { "post_attention_layernorm.weight", &l->post_norm, 0, H },
        { "self_attn.q_norm.weight", &l->q_norm, 0, D },
        { "self_attn.k_norm.weight", &l->k_norm, 0, D },
        { "self_attn.q_proj.weight", &l->lin[QWEN3_LIN_Q], Hq * D, H },
        { "self_attn.k_proj.weight", &l->lin[QWEN3_LIN_K], Hkv * D, H },
        { "self_attn.v_proj.weight", &l->lin[QWEN3_LIN_V], Hkv * D, H },
        { "self_attn.o_proj.weight", &l->lin[QWEN3_LIN_O], H, Hq * D },
        { "mlp.gate_proj.weight", &l->lin[QWEN3_LIN_GATE], I, H },
        { "mlp.up_proj.weight", &l->lin[QWEN3_LIN_UP], I, H },
        { "mlp.down_proj.weight", &l->lin[QWEN3_LIN_DOWN], H, I },
    };
    char name[200];
    for (size_t k = 0; k < sizeof spec / sizeof spec[0]; k++) {
        snprintf(name, sizeof name, "%s%s", prefix, spec[k].suffix);
        DFLASH_TRY(dflash_weight_bind(be, st, name, spec[k].rows, spec[k].cols, spec[k].w));
        *n_params += spec[k].w->rows * spec[k].w->cols;
    }
    return DFLASH_OK;
}

dflash_status qwen3_bufs_alloc(dflash_backend *be, const dflash_model_config *c, int rows, qwen3_bufs *b)
{
    const size_t R = (size_t)rows, H = (size_t)c->hidden_size,
                 QD = (size_t)c->num_attention_heads * c->head_dim,
                 KD = (size_t)c->num_key_value_heads * c->head_dim, I = (size_t)c->intermediate_size;
    *b = (qwen3_bufs){ 0 };
    struct { float **p; size_t n; } f[] = {
        { &b->x, R * H }, { &b->xn, R * H }, { &b->q, R * QD }, { &b->k, R * KD }, { &b->v, R * KD },
        { &b->attn, R * QD }, { &b->delta, R * H }, { &b->gate, R * I }, { &b->up, R * I },
    };
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
        DFLASH_TRY(dflash_be_alloc_f32(be, f[i].n, f[i].p));
    return dflash_be_alloc_i32(be, R, &b->pos);
}

void qwen3_bufs_free(dflash_backend *be, qwen3_bufs *b)
{
    void *p[] = { b->x, b->xn, b->q, b->k, b->v, b->attn, b->delta, b->gate, b->up, b->pos };
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++)
        if (p[i])
            be->ops->free(be, p[i]);
    *b = (qwen3_bufs){ 0 };
}

dflash_status qwen3_layer_attn_in(dflash_backend *be, const dflash_model_config *c, const qwen3_layer *l,
                                  const dflash_weight *lin, const qwen3_bufs *b, int n, int add_delta)
{
    const dflash_backend_ops *o = be->ops;
    DFLASH_TRY(o->add_rmsnorm(be, b->x, add_delta ? b->delta : NULL, &l->input_norm, n, c->hidden_size,
                              c->rms_norm_eps, b->xn));
    float *const qkv[3] = { b->q, b->k, b->v };
    DFLASH_TRY(dflash_be_linear_group(be, b->xn, n, &lin[QWEN3_LIN_Q], 3, qkv, DFLASH_ACT_NONE));
    return dflash_be_qk_norm_rope(be, b->q, &l->q_norm, c->num_attention_heads, b->k, &l->k_norm,
                                  c->num_key_value_heads, b->pos, n, c->head_dim, c->rms_norm_eps, c->rope_theta,
                                  c->rope_scaling_factor);
}

dflash_status qwen3_layer_attn_out_mlp(dflash_backend *be, const dflash_model_config *c, const qwen3_layer *l,
                                       const dflash_weight *lin, const qwen3_bufs *b, int n)
{
    const dflash_backend_ops *o = be->ops;
    DFLASH_TRY(o->linear(be, b->attn, n, &lin[QWEN3_LIN_O], b->delta));
    DFLASH_TRY(o->add_rmsnorm(be, b->x, b->delta, &l->post_norm, n, c->hidden_size, c->rms_norm_eps, b->xn));
    /* gate = silu(gate(xn)) * up(xn) (up is scratch) */
    float *const gu[2] = { b->gate, b->up };
    DFLASH_TRY(dflash_be_linear_group(be, b->xn, n, &lin[QWEN3_LIN_GATE], 2, gu, DFLASH_ACT_SWIGLU));
    return o->linear(be, b->gate, n, &lin[QWEN3_LIN_DOWN], b->delta);
}

dflash_attn_args qwen3_attn_args(const dflash_model_config *c, const qwen3_bufs *b, int n)
{
    return (dflash_attn_args){
        .n_rows = n, .n_heads = c->num_attention_heads, .n_kv_heads = c->num_key_value_heads,
        .head_dim = c->head_dim, .scale = 1.0f / sqrtf((float)c->head_dim), .q = b->q, .out = b->attn,
        .q_pos = b->pos,
    };
}
