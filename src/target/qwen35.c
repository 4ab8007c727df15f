/* qwen35.c: see qwen35.h. Owns the Qwen3.5 hybrid's checkpoint layout (the
 * names and shapes of its text model's tensors in both layouts, bound into
 * the target's layers, and which other tensors a folder may hold) and its
 * gated full attention. */
#include "target/qwen35.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Binding state: the binder, the config, and the next free floats of the
 * shifted norms' host copy. */
typedef struct q35_bind {
    dflash_binder *b;
    const dflash_model_config *c;
    float *norm_next;
} q35_bind;

static dflash_status bind(q35_bind *q, const char *p, const char *name, int64_t rows, int64_t cols,
                          dflash_weight *out)
{
    char full[256];
    snprintf(full, sizeof full, "%s%s", p, name);
    return dflash_bind(q->b, full, rows, cols, out);
}

/* A Qwen3.5 RMSNorm's weight, stored centred on zero and applied as 1 + w. */
static dflash_status bind_norm(q35_bind *q, const char *p, const char *name, int64_t n, dflash_weight *out)
{
    char full[256];
    snprintf(full, sizeof full, "%s%s", p, name);
    DFLASH_TRY(dflash_bind_shifted(q->b, full, n, q->norm_next, out));
    q->norm_next += n;
    return DFLASH_OK;
}

static dflash_status bind_linear_attn(q35_bind *q, const char *p, qwen3_gdn *g)
{
    const dflash_model_config *c = q->c;
    const int64_t H = c->hidden_size, Kd = (int64_t)c->linear_num_key_heads * c->linear_key_head_dim,
                  Hv = c->linear_num_value_heads, Vd = Hv * c->linear_value_head_dim, C = 2 * Kd + Vd,
                  K = c->linear_conv_kernel;
    DFLASH_TRY(bind(q, p, "linear_attn.in_proj_qkv.weight", C, H, &g->in_qkv));
    DFLASH_TRY(bind(q, p, "linear_attn.in_proj_z.weight", Vd, H, &g->in_z));
    DFLASH_TRY(bind(q, p, "linear_attn.in_proj_b.weight", Hv, H, &g->in_b));
    DFLASH_TRY(bind(q, p, "linear_attn.in_proj_a.weight", Hv, H, &g->in_a));
    char name[256];
    snprintf(name, sizeof name, "%slinear_attn.conv1d.weight", p);
    const int64_t conv_shape[3] = { C, 1, K };
    DFLASH_TRY(dflash_bind_as(q->b, name, 3, conv_shape, C, K, &g->conv));
    DFLASH_TRY(bind(q, p, "linear_attn.dt_bias", 0, Hv, &g->dt_bias));
    DFLASH_TRY(bind(q, p, "linear_attn.A_log", 0, Hv, &g->A_log));
    DFLASH_TRY(bind(q, p, "linear_attn.norm.weight", 0, c->linear_value_head_dim, &g->norm));
    return bind(q, p, "linear_attn.out_proj.weight", H, Vd, &g->out);
}

/* q_proj holds 2 x heads x head_dim rows: each head's query rows, then its
 * gate rows. */
static dflash_status bind_full_attn(q35_bind *q, const char *p, qwen3_layer *l)
{
    const dflash_model_config *c = q->c;
    const int64_t H = c->hidden_size, D = c->head_dim, QD = (int64_t)c->num_attention_heads * D,
                  KD = (int64_t)c->num_key_value_heads * D;
    const struct {
        const char *name;
        int64_t rows, cols;
    } proj[] = { { "q_proj", 2 * QD, H }, { "k_proj", KD, H }, { "v_proj", KD, H }, { "o_proj", H, QD } };
    char name[64];
    for (int i = 0; i < 4; i++) { /* QWEN3_LIN_Q .. QWEN3_LIN_O */
        snprintf(name, sizeof name, "self_attn.%s.weight", proj[i].name);
        DFLASH_TRY(bind(q, p, name, proj[i].rows, proj[i].cols, &l->lin[QWEN3_LIN_Q + i]));
        if (c->attention_bias) {
            snprintf(name, sizeof name, "self_attn.%s.bias", proj[i].name);
            DFLASH_TRY(bind(q, p, name, 0, proj[i].rows, &l->bias[QWEN3_LIN_Q + i]));
        }
    }
    DFLASH_TRY(bind_norm(q, p, "self_attn.q_norm.weight", D, &l->q_norm));
    return bind_norm(q, p, "self_attn.k_norm.weight", D, &l->k_norm);
}

/* Floats of every shifted norm weight. */
static size_t norm_floats(const dflash_model_config *c)
{
    size_t n = (size_t)c->hidden_size * (2 * (size_t)c->num_hidden_layers + 1);
    for (int i = 0; i < c->num_hidden_layers; i++)
        if (!c->layer_linear[i])
            n += 2 * (size_t)c->head_dim;
    return n;
}

static int starts_with(const char *s, const char *head) { return strncmp(s, head, strlen(head)) == 0; }

/* The tensors outside the text model are counted; anything else unused
 * is refused, naming the first few. */
static dflash_status account_unused(dflash_binder *b, const dflash_model_config *c, qwen35_extra *extra)
{
    size_t n_all = dflash_st_count(b->st), shown = 0;
    char list[400] = "";
    size_t len = 0, bad = 0;
    for (size_t i = 0; i < n_all; i++) {
        const char *name = dflash_st_at(b->st, i)->name;
        if (b->used[i])
            continue;
        if (starts_with(name, "model.visual."))
            extra->vision_tensors++;
        else if (starts_with(name, "mtp."))
            extra->mtp_tensors++;
        else if (!(c->tie_word_embeddings && strcmp(name, "lm_head.weight") == 0)) {
            if (shown++ < 3 && len < sizeof list)
                len += (size_t)snprintf(list + len, sizeof list - len, "%s'%s'", bad ? ", " : "", name);
            bad++;
        }
    }
    if (bad)
        return dflash_fail(DFLASH_ERR_FORMAT, "%s: %zu tensor%s of the checkpoint %s not used by this %d-layer %s "
                           "target: %s%s; config.json does not describe these weights", dflash_st_path(b->st), bad,
                           bad == 1 ? "" : "s", bad == 1 ? "is" : "are", c->num_hidden_layers,
                           dflash_family_name(c->family), list, bad > 3 ? " and more" : "");
    return DFLASH_OK;
}

static dflash_status bind_layer(q35_bind *q, const char *p, int i, qwen3_layer *l)
{
    const dflash_model_config *c = q->c;
    const int64_t H = c->hidden_size;
    DFLASH_TRY(bind_norm(q, p, "input_layernorm.weight", H, &l->input_norm));
    DFLASH_TRY(bind_norm(q, p, "post_attention_layernorm.weight", H, &l->post_norm));
    DFLASH_TRY(c->layer_linear[i] ? bind_linear_attn(q, p, &l->gdn) : bind_full_attn(q, p, l));
    if (c->family == DFLASH_FAMILY_QWEN35_MOE)
        return qwen3_moe_bind(q->b, p, c, &l->moe); /* the shared expert too */
    char stem[224];
    snprintf(stem, sizeof stem, "%smlp.", p);
    return qwen3_bind_swiglu(q->b, stem, H, c->intermediate_size, &l->lin[QWEN3_LIN_GATE]);
}

dflash_status qwen35_checkpoint_bind(dflash_binder *b, const dflash_model_config *c, qwen3_checkpoint *w,
                                     qwen35_extra *extra)
{
    *extra = (qwen35_extra){ 0 };
    w->norm_host = malloc(norm_floats(c) * sizeof(float));
    if (!w->norm_host)
        return dflash_fail(DFLASH_ERR_OOM, "%s: out of memory", dflash_st_path(b->st));
    q35_bind q = { b, c, w->norm_host };
    const char *base = c->multimodal ? "model.language_model." : "model.";
    const int64_t H = c->hidden_size, V = c->vocab_size;
    DFLASH_TRY(bind(&q, base, "embed_tokens.weight", V, H, &w->embed));
    DFLASH_TRY(bind_norm(&q, base, "norm.weight", H, &w->final_norm));
    if (c->tie_word_embeddings)
        w->lm_head = w->embed; /* a stored copy is left unused, as transformers does */
    else
        DFLASH_TRY(bind(&q, "", "lm_head.weight", V, H, &w->lm_head));
    char p[96];
    for (int i = 0; i < c->num_hidden_layers; i++) {
        snprintf(p, sizeof p, "%slayers.%d.", base, i);
        DFLASH_TRY(bind_layer(&q, p, i, &w->layers[i]));
    }
    DFLASH_TRY(account_unused(b, c, extra));
    extra->n_params = b->n_params;
    return DFLASH_OK;
}

dflash_status qwen35_checkpoint_check(const dflash_model_config *c, const dflash_st *st, qwen35_extra *extra)
{
    qwen3_checkpoint w = { .layers = calloc((size_t)c->num_hidden_layers + 1, sizeof *w.layers) };
    dflash_binder b;
    dflash_status s = w.layers ? dflash_binder_init(&b, NULL, st)
                               : dflash_fail(DFLASH_ERR_OOM, "%s: out of memory", dflash_st_path(st));
    if (s == DFLASH_OK) {
        s = qwen35_checkpoint_bind(&b, c, &w, extra);
        dflash_binder_free(&b);
    }
    qwen3_layers_free(w.layers, c->num_hidden_layers, NULL);
    free(w.norm_host);
    return s;
}

/* ---- gated full attention ------------------------------------------------ */

dflash_status qwen35_attn_in(dflash_backend *be, const dflash_model_config *c, const qwen3_layer *l,
                             const qwen3_bufs *b, int n, qwen3_prev prev, const dflash_kv_dest *dst)
{
    const dflash_backend_ops *o = be->ops;
    const int D = c->head_dim, Hq = c->num_attention_heads;
    DFLASH_TRY(qwen3_layer_norm_in(be, c, prev, b, &l->input_norm, n));
    float *const qkv[3] = { b->qg, b->k, b->v };
    DFLASH_TRY(dflash_be_linear_group(be, b->xn, n, &l->lin[QWEN3_LIN_Q], 3, qkv, DFLASH_ACT_NONE));
    for (int k = 0; c->attention_bias && k < 3; k++)
        DFLASH_TRY(o->add_bias(be, qkv[k], &l->bias[QWEN3_LIN_Q + k], n, (int)l->lin[QWEN3_LIN_Q + k].rows));
    /* [n * Hq rows of (query D | gate D)] -> q; the gates stay in qg for
     * qwen35_attn_gate */
    DFLASH_TRY(o->copy_rows(be, b->q, D, b->qg, 2 * D, NULL, n * Hq, D));
    return dflash_be_qk_norm_rope_store(be, b->q, &l->q_norm, Hq, b->k, &l->k_norm, c->num_key_value_heads, b->pos,
                                        n, D, c->rms_norm_eps, &c->rope_freq, dst);
}

dflash_status qwen35_attn_gate(dflash_backend *be, const dflash_model_config *c, const qwen3_bufs *b, int n)
{
    /* per (row, head): D outputs times the gates after that head's query in qg */
    const int D = c->head_dim;
    return be->ops->sigmoid_mul(be, b->attn, b->qg + D, n * c->num_attention_heads, D, 2 * D);
}
