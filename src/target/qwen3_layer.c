/* qwen3_layer.c: see qwen3_layer.h. Owns the Qwen3 layer (binding and its
 * two halves of the forward; a Llama layer is the same without q_norm and
 * k_norm) and the checkpoint layout of targets and drafters, including which
 * unused tensors are tolerated. */
#include "target/qwen3_layer.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "target/qwen35.h"

dflash_status qwen3_layer_bind(dflash_binder *b, const char *prefix, const dflash_model_config *c, int sparse,
                               qwen3_layer *l)
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
    enum { FIRST_LIN = 4 }; /* spec[FIRST_LIN + k] is lin[k] */
    char name[200];
    *l = (qwen3_layer){ 0 };
    for (int k = 0; k < QWEN3_LIN_COUNT; k++) { /* "<prefix>self_attn.q_proj.bias", ... */
        if (!(k <= QWEN3_LIN_O ? c->attention_bias : c->mlp_bias && !sparse))
            continue;
        const char *suffix = spec[FIRST_LIN + k].suffix;
        snprintf(name, sizeof name, "%s%.*sbias", prefix, (int)(strlen(suffix) - strlen("weight")), suffix);
        DFLASH_TRY(dflash_bind(b, name, 0, spec[FIRST_LIN + k].rows, &l->bias[k]));
    }
    for (size_t k = 0; k < sizeof spec / sizeof spec[0]; k++) {
        if ((spec[k].w == &l->q_norm || spec[k].w == &l->k_norm) && !dflash_config_qk_norm(c))
            continue; /* a Llama layer: no per-head q/k norm */
        if (sparse && (spec[k].w == &l->lin[QWEN3_LIN_GATE] || spec[k].w == &l->lin[QWEN3_LIN_UP] ||
                       spec[k].w == &l->lin[QWEN3_LIN_DOWN]))
            continue; /* the experts replace the dense MLP */
        snprintf(name, sizeof name, "%s%s", prefix, spec[k].suffix);
        DFLASH_TRY(dflash_bind(b, name, spec[k].rows, spec[k].cols, spec[k].w));
    }
    return sparse ? qwen3_moe_bind(b, prefix, c, &l->moe) : DFLASH_OK;
}

void qwen3_layers_free(qwen3_layer *layers, int n, dflash_backend *be)
{
    for (int i = 0; layers && i < n; i++)
        qwen3_moe_release(&layers[i].moe, be);
    free(layers);
}

/* ---- checkpoint layout ------------------------------------------------- */

/* Layer tensors are "<layer prefix><i>.<suffix>". */
static const char *ckpt_layer_prefix(const dflash_model_config *c)
{
    return c->is_dflash ? "layers." : "model.layers.";
}

static dflash_status ckpt_bind_tensors(dflash_binder *b, const dflash_model_config *c, qwen3_checkpoint *w)
{
    const int64_t H = c->hidden_size, V = c->vocab_size;
    if (c->is_dflash) {
        /* No embedding or LM head: the drafter uses its target's. */
        DFLASH_TRY(dflash_bind(b, "fc.weight", H, (int64_t)c->n_target_layer_ids * H, &w->fc));
        DFLASH_TRY(dflash_bind(b, "hidden_norm.weight", 0, H, &w->hidden_norm));
        DFLASH_TRY(dflash_bind(b, "norm.weight", 0, H, &w->final_norm));
    } else {
        DFLASH_TRY(dflash_bind(b, "model.embed_tokens.weight", V, H, &w->embed));
        DFLASH_TRY(dflash_bind(b, "model.norm.weight", 0, H, &w->final_norm));
        if (c->tie_word_embeddings) {
            w->lm_head = w->embed;
        } else {
            if (!dflash_st_find(b->st, "lm_head.weight"))
                return dflash_fail(DFLASH_ERR_NOT_FOUND,
                                   "%s: tensor 'lm_head.weight' not found and tie_word_embeddings is false",
                                   dflash_st_path(b->st));
            DFLASH_TRY(dflash_bind(b, "lm_head.weight", V, H, &w->lm_head));
        }
    }
    char prefix[64];
    for (int i = 0; i < c->num_hidden_layers; i++) {
        snprintf(prefix, sizeof prefix, "%s%d.", ckpt_layer_prefix(c), i);
        DFLASH_TRY(qwen3_layer_bind(b, prefix, c, !c->is_dflash && c->layer_moe[i], &w->layers[i]));
    }
    return DFLASH_OK;
}

static int ends_with(const char *s, const char *tail)
{
    size_t a = strlen(s), b = strlen(tail);
    return a >= b && strcmp(s + a - b, tail) == 0;
}

/* Unused tensors that are accepted, because transformers ignores them as
 * well, so the model run is the one transformers runs:
 * - lm_head.weight of a tied target (some exporters store the head anyway):
 *   transformers ties the head to the embedding after loading, so the
 *   stored copy never counts. Said at info level, since a file whose copy
 *   differs from the embedding may mean tie_word_embeddings is wrong.
 * - rotary_emb.inv_freq buffers (older exporters saved them): derived from
 *   rope_theta and head_dim, recomputed by transformers and skipped on
 *   load. Accepted silently (debug level).
 * Anything else is refused by the caller: config.json would not describe
 * what the file holds (fewer layers than stored, biases, another model's
 * parts), and ignoring it would run a different model than the file's. */
static void ckpt_tolerate(dflash_binder *b, const dflash_model_config *c)
{
    for (size_t i = 0; i < dflash_st_count(b->st); i++) {
        const char *name = dflash_st_at(b->st, i)->name;
        if (b->used[i])
            continue;
        if (!c->is_dflash && c->tie_word_embeddings && strcmp(name, "lm_head.weight") == 0) {
            dflash_log(DFLASH_LOG_INFO, "%s: tensor 'lm_head.weight' is not used: tie_word_embeddings is true, so "
                       "the LM head is model.embed_tokens.weight (as in transformers)", dflash_st_path(b->st));
            b->used[i] = 1;
        } else if (ends_with(name, "rotary_emb.inv_freq")) {
            dflash_log(DFLASH_LOG_DEBUG, "%s: tensor '%s' is not used: RoPE frequencies come from the config",
                       dflash_st_path(b->st), name);
            b->used[i] = 1;
        }
    }
}

/* The highest layer index among unused tensors at or past num_hidden_layers,
 * or -1: the commonest cause, a num_hidden_layers smaller than the file's. */
static int ckpt_extra_layer(const dflash_model_config *c, const char **names, size_t n)
{
    const char *prefix = ckpt_layer_prefix(c);
    size_t k = strlen(prefix);
    int top = -1;
    for (size_t i = 0; i < n; i++) {
        if (strncmp(names[i], prefix, k) != 0)
            continue;
        char *end;
        long id = strtol(names[i] + k, &end, 10);
        if (end != names[i] + k && *end == '.' && id >= c->num_hidden_layers && id > top && id < 1000000)
            top = (int)id;
    }
    return top;
}

/* The likely cause of unused tensors `names[0..n)`, for the message. */
static void ckpt_unused_cause(const dflash_binder *b, const dflash_model_config *c, const char **names, size_t n,
                              char *why, size_t cap)
{
    int extra = ckpt_extra_layer(c, names, n);
    int own_head = c->is_dflash && (dflash_st_find(b->st, "lm_head.weight") ||
                                    dflash_st_find(b->st, "embed_tokens.weight") ||
                                    dflash_st_find(b->st, "model.embed_tokens.weight"));
    if (extra >= 0)
        snprintf(why, cap, "the file holds layers up to %d but num_hidden_layers is %d: config.json does not "
                 "match the weights", extra, c->num_hidden_layers);
    else if (own_head)
        snprintf(why, cap, "a DFlash drafter uses its target's embedding and LM head and has none of its own");
    else
        snprintf(why, cap, "config.json does not describe these weights (another architecture, or an option it "
                 "leaves off, such as attention_bias)");
}

/* Fails naming the first few unused tensors, how many there are, and why. */
static dflash_status ckpt_refuse_unused(const dflash_binder *b, const dflash_model_config *c)
{
    enum { SHOWN = 4 };
    size_t n_all = dflash_st_count(b->st);
    const char **names = malloc((n_all ? n_all : 1) * sizeof *names);
    if (!names)
        return dflash_fail(DFLASH_ERR_OOM, "%s: out of memory", dflash_st_path(b->st));
    size_t n = dflash_binder_unused(b, names, n_all);
    char list[600], why[200];
    size_t len = 0;
    for (size_t i = 0; i < n && i < SHOWN && len < sizeof list; i++)
        len += (size_t)snprintf(list + len, sizeof list - len, "%s'%s'", i ? ", " : "", names[i]);
    if (n > SHOWN && len < sizeof list)
        snprintf(list + len, sizeof list - len, " and %zu more", n - SHOWN);
    ckpt_unused_cause(b, c, names, n, why, sizeof why);
    free(names);
    return dflash_fail(DFLASH_ERR_FORMAT, "%s: %zu tensor%s of the checkpoint %s not used by this %d-layer %s%s: %s; %s",
                       dflash_st_path(b->st), n, n == 1 ? "" : "s", n == 1 ? "is" : "are", c->num_hidden_layers,
                       c->is_dflash ? "DFlash drafter" : dflash_family_name(c->family), c->is_dflash ? "" : " target",
                       list, why);
}

dflash_status qwen3_checkpoint_bind(dflash_binder *b, const dflash_model_config *c, qwen3_checkpoint *w)
{
    if (dflash_family_is_qwen35(c->family)) {
        qwen35_extra extra;
        return qwen35_checkpoint_bind(b, c, w, &extra);
    }
    /* an odd head_dim never gets here: the config's RoPE table refuses it */
    DFLASH_TRY(ckpt_bind_tensors(b, c, w));
    ckpt_tolerate(b, c);
    if (dflash_binder_unused(b, NULL, 0) > 0)
        return ckpt_refuse_unused(b, c);
    return DFLASH_OK;
}

dflash_status qwen3_checkpoint_check(const dflash_model_config *c, const dflash_st *st)
{
    if (dflash_family_is_qwen35(c->family)) {
        qwen35_extra extra;
        return qwen35_checkpoint_check(c, st, &extra);
    }
    qwen3_checkpoint w = { .layers = calloc((size_t)c->num_hidden_layers + 1, sizeof *w.layers) };
    dflash_binder b;
    dflash_status s = w.layers ? dflash_binder_init(&b, NULL, st)
                               : dflash_fail(DFLASH_ERR_OOM, "%s: out of memory", dflash_st_path(st));
    if (s == DFLASH_OK) {
        s = qwen3_checkpoint_bind(&b, c, &w);
        dflash_binder_free(&b);
    }
    qwen3_layers_free(w.layers, c->num_hidden_layers, NULL);
    return s;
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
    if (dflash_family_is_qwen35(c->family) && !c->is_dflash) {
        DFLASH_TRY(dflash_be_alloc_f32(be, R * 2 * QD, &b->qg));
        DFLASH_TRY(qwen3_gdn_bufs_alloc(be, c, rows, &b->gdn));
    }
    return c->num_experts ? qwen3_moe_bufs_alloc(be, c, rows, &b->moe) : DFLASH_OK;
}

void qwen3_bufs_free(dflash_backend *be, qwen3_bufs *b)
{
    void *p[] = { b->x, b->xn, b->q, b->k, b->v, b->attn, b->delta, b->gate, b->up, b->qg };
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++)
        if (p[i])
            be->ops->free(be, p[i]);
    qwen3_moe_bufs_free(be, &b->moe);
    qwen3_gdn_bufs_free(be, &b->gdn);
    *b = (qwen3_bufs){ 0 };
}

int qwen3_layer_defers_down(const dflash_model_config *c, const qwen3_layer *l)
{
    return !l->moe.experts && !c->mlp_bias;
}

dflash_status qwen3_layer_norm_in(dflash_backend *be, const dflash_model_config *c, qwen3_prev prev,
                                  const qwen3_bufs *b, const dflash_weight *norm, int n)
{
    const int H = c->hidden_size;
    if (prev.l && qwen3_moe_defers(&prev.l->moe)) {
        const dflash_gather sum = qwen3_moe_sum(c, &prev.l->moe, &b->moe);
        return dflash_be_gather_add_rmsnorm(be, b->x, &sum, b->delta, norm, n, H, c->rms_norm_eps, b->xn);
    }
    if (prev.l && qwen3_layer_defers_down(c, prev.l))
        return dflash_be_linear_add_rmsnorm(be, b->gate, n, &prev.lin[QWEN3_LIN_DOWN], b->x, b->delta, norm, H,
                                            c->rms_norm_eps, b->xn);
    return be->ops->add_rmsnorm(be, b->x, prev.l ? b->delta : NULL, norm, n, H, c->rms_norm_eps, b->xn);
}

/* The q/k/v stage's arguments (a layer without biases). */
static dflash_qkv_args qkv_args(const dflash_model_config *c, const qwen3_layer *l, const dflash_weight *lin,
                                const qwen3_bufs *b, int n, const dflash_kv_dest *dst)
{
    const int qk = dflash_config_qk_norm(c);
    return (dflash_qkv_args){
        .x = b->xn, .n = n, .w = &lin[QWEN3_LIN_Q], .q = b->q, .k = b->k, .v = b->v,
        .q_norm = qk ? &l->q_norm : NULL, .k_norm = qk ? &l->k_norm : NULL, .n_q_heads = c->num_attention_heads,
        .n_kv_heads = c->num_key_value_heads, .head_dim = c->head_dim, .pos = b->pos, .eps = c->rms_norm_eps,
        .rope = &c->rope_freq, .dst = dst,
    };
}

dflash_status qwen3_layer_attn_in(dflash_backend *be, const dflash_model_config *c, const qwen3_layer *l,
                                  const dflash_weight *lin, const qwen3_bufs *b, int n, qwen3_prev prev,
                                  const dflash_kv_dest *dst)
{
    DFLASH_TRY(qwen3_layer_norm_in(be, c, prev, b, &l->input_norm, n));
    const dflash_qkv_args a = qkv_args(c, l, lin, b, n, dst);
    if (!c->attention_bias)
        return dflash_be_qkv_norm_rope_store(be, &a);
    /* the biases go in before the norms: the stage's composition, biases between */
    float *const qkv[3] = { b->q, b->k, b->v };
    DFLASH_TRY(dflash_be_linear_group(be, b->xn, n, a.w, 3, qkv, DFLASH_ACT_NONE));
    for (int k = 0; k < 3; k++)
        DFLASH_TRY(be->ops->add_bias(be, qkv[k], &l->bias[QWEN3_LIN_Q + k], n, (int)lin[QWEN3_LIN_Q + k].rows));
    return dflash_be_qk_norm_rope_store(be, b->q, a.q_norm, a.n_q_heads, b->k, a.k_norm, a.n_kv_heads, b->pos, n,
                                        a.head_dim, a.eps, a.rope, dst);
}

dflash_status qwen3_layer_attn(dflash_backend *be, const dflash_model_config *c, const qwen3_layer *l,
                               const dflash_weight *lin, const qwen3_bufs *b, int n, qwen3_prev prev,
                               const dflash_kv_dest *dst, const dflash_attn_args *attn)
{
    if (c->attention_bias) {
        DFLASH_TRY(qwen3_layer_attn_in(be, c, l, lin, b, n, prev, dst));
        return be->ops->attention(be, attn);
    }
    DFLASH_TRY(qwen3_layer_norm_in(be, c, prev, b, &l->input_norm, n));
    const dflash_qkv_args a = qkv_args(c, l, lin, b, n, dst);
    return dflash_be_qkv_attention(be, &a, attn);
}

dflash_status qwen3_layer_attn_out_mlp(dflash_backend *be, const dflash_model_config *c, const qwen3_layer *l,
                                       const dflash_weight *lin, const qwen3_bufs *b, int n)
{
    const dflash_backend_ops *o = be->ops;
    if (c->attention_bias) { /* the bias goes in before the residual add */
        DFLASH_TRY(o->linear(be, b->attn, n, &lin[QWEN3_LIN_O], b->delta));
        DFLASH_TRY(o->add_bias(be, b->delta, &l->bias[QWEN3_LIN_O], n, c->hidden_size));
        DFLASH_TRY(o->add_rmsnorm(be, b->x, b->delta, &l->post_norm, n, c->hidden_size, c->rms_norm_eps, b->xn));
        return qwen3_layer_ffn(be, c, l, lin, b, n);
    }
    DFLASH_TRY(dflash_be_linear_add_rmsnorm(be, b->attn, n, &lin[QWEN3_LIN_O], b->x, b->delta, &l->post_norm,
                                            c->hidden_size, c->rms_norm_eps, b->xn));
    return qwen3_layer_ffn(be, c, l, lin, b, n);
}

dflash_status qwen3_layer_ffn(dflash_backend *be, const dflash_model_config *c, const qwen3_layer *l,
                              const dflash_weight *lin, const qwen3_bufs *b, int n)
{
    const dflash_backend_ops *o = be->ops;
    if (l->moe.experts)
        return qwen3_moe_forward(be, c, &l->moe, &b->moe, b->xn, n, b->delta);
    if (c->mlp_bias) { /* the biases go in before the activation, so no fused gate/up */
        const int I = c->intermediate_size;
        DFLASH_TRY(o->linear(be, b->xn, n, &lin[QWEN3_LIN_GATE], b->gate));
        DFLASH_TRY(o->add_bias(be, b->gate, &l->bias[QWEN3_LIN_GATE], n, I));
        DFLASH_TRY(o->linear(be, b->xn, n, &lin[QWEN3_LIN_UP], b->up));
        DFLASH_TRY(o->add_bias(be, b->up, &l->bias[QWEN3_LIN_UP], n, I));
        DFLASH_TRY(o->swiglu(be, b->gate, b->up, (size_t)n * I, b->gate));
        DFLASH_TRY(o->linear(be, b->gate, n, &lin[QWEN3_LIN_DOWN], b->delta));
        return o->add_bias(be, b->delta, &l->bias[QWEN3_LIN_DOWN], n, c->hidden_size);
    }
    /* gate = silu(gate(xn)) * up(xn) (up is scratch); the down projection
     * is the next norm's (qwen3_layer_defers_down) */
    float *const gu[2] = { b->gate, b->up };
    return dflash_be_linear_group(be, b->xn, n, &lin[QWEN3_LIN_GATE], 2, gu, DFLASH_ACT_SWIGLU);
}

dflash_attn_args qwen3_attn_args(const dflash_model_config *c, const qwen3_bufs *b, int n)
{
    return (dflash_attn_args){
        .n_rows = n, .n_heads = c->num_attention_heads, .n_kv_heads = c->num_key_value_heads,
        .head_dim = c->head_dim, .scale = 1.0f / sqrtf((float)c->head_dim), .q = b->q, .out = b->attn,
        .q_pos = b->pos,
    };
}
