/* qwen35.c: see qwen35.h. Owns the Qwen3.5 hybrid's checkpoint layout: the
 * names and shapes of its text model's tensors in both layouts, and which
 * other tensors a folder may hold. */
#include "target/qwen35.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/weight_bind.h"

/* One tensor "<base><name>" of the given shape. */
static dflash_status need(dflash_binder *b, const char *base, const char *name, int ndim, int64_t d0, int64_t d1,
                          int64_t d2)
{
    char full[256];
    const int64_t shape[3] = { d0, d1, d2 };
    snprintf(full, sizeof full, "%s%s", base, name);
    return dflash_bind_check(b, full, ndim, shape);
}

static dflash_status check_linear_attn(dflash_binder *b, const char *p, const dflash_model_config *c)
{
    const int64_t H = c->hidden_size, Kd = (int64_t)c->linear_num_key_heads * c->linear_key_head_dim,
                  Hv = c->linear_num_value_heads, Vd = Hv * c->linear_value_head_dim, C = 2 * Kd + Vd;
    DFLASH_TRY(need(b, p, "linear_attn.in_proj_qkv.weight", 2, C, H, 0));
    DFLASH_TRY(need(b, p, "linear_attn.in_proj_z.weight", 2, Vd, H, 0));
    DFLASH_TRY(need(b, p, "linear_attn.in_proj_b.weight", 2, Hv, H, 0));
    DFLASH_TRY(need(b, p, "linear_attn.in_proj_a.weight", 2, Hv, H, 0));
    DFLASH_TRY(need(b, p, "linear_attn.conv1d.weight", 3, C, 1, c->linear_conv_kernel));
    DFLASH_TRY(need(b, p, "linear_attn.dt_bias", 1, Hv, 0, 0));
    DFLASH_TRY(need(b, p, "linear_attn.A_log", 1, Hv, 0, 0));
    DFLASH_TRY(need(b, p, "linear_attn.norm.weight", 1, c->linear_value_head_dim, 0, 0));
    return need(b, p, "linear_attn.out_proj.weight", 2, H, Vd, 0);
}

static dflash_status check_full_attn(dflash_binder *b, const char *p, const dflash_model_config *c)
{
    const int64_t H = c->hidden_size, D = c->head_dim, QD = (int64_t)c->num_attention_heads * D,
                  KD = (int64_t)c->num_key_value_heads * D;
    const struct {
        const char *name;
        int64_t rows, cols;
    } proj[] = { { "q_proj", 2 * QD, H }, { "k_proj", KD, H }, { "v_proj", KD, H }, { "o_proj", H, QD } };
    char name[64];
    for (size_t i = 0; i < sizeof proj / sizeof proj[0]; i++) {
        snprintf(name, sizeof name, "self_attn.%s.weight", proj[i].name);
        DFLASH_TRY(need(b, p, name, 2, proj[i].rows, proj[i].cols, 0));
        if (c->attention_bias) {
            snprintf(name, sizeof name, "self_attn.%s.bias", proj[i].name);
            DFLASH_TRY(need(b, p, name, 1, proj[i].rows, 0, 0));
        }
    }
    DFLASH_TRY(need(b, p, "self_attn.q_norm.weight", 1, D, 0, 0));
    return need(b, p, "self_attn.k_norm.weight", 1, D, 0, 0);
}

/* gate/up [I, H], down [H, I] under "<p><mlp>" */
static dflash_status check_swiglu(dflash_binder *b, const char *p, const char *mlp, int64_t H, int64_t I)
{
    char name[160];
    snprintf(name, sizeof name, "%sgate_proj.weight", mlp);
    DFLASH_TRY(need(b, p, name, 2, I, H, 0));
    snprintf(name, sizeof name, "%sup_proj.weight", mlp);
    DFLASH_TRY(need(b, p, name, 2, I, H, 0));
    snprintf(name, sizeof name, "%sdown_proj.weight", mlp);
    return need(b, p, name, 2, H, I, 0);
}

static dflash_status check_moe(dflash_binder *b, const char *p, const dflash_model_config *c)
{
    const int64_t H = c->hidden_size, E = c->num_experts, Im = c->moe_intermediate_size;
    char name[256];
    DFLASH_TRY(need(b, p, "mlp.gate.weight", 2, E, H, 0));
    snprintf(name, sizeof name, "%smlp.experts.gate_up_proj", p);
    if (dflash_st_find(b->st, name)) { /* stacked, gate rows first */
        DFLASH_TRY(need(b, p, "mlp.experts.gate_up_proj", 3, E, 2 * Im, H));
        DFLASH_TRY(need(b, p, "mlp.experts.down_proj", 3, E, H, Im));
    } else {
        for (int e = 0; e < E; e++) {
            char mlp[64];
            snprintf(mlp, sizeof mlp, "mlp.experts.%d.", e);
            DFLASH_TRY(check_swiglu(b, p, mlp, H, Im));
        }
    }
    DFLASH_TRY(check_swiglu(b, p, "mlp.shared_expert.", H, c->shared_expert_intermediate_size));
    return need(b, p, "mlp.shared_expert_gate.weight", 2, 1, H, 0);
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

dflash_status qwen35_checkpoint_check(const dflash_model_config *c, const dflash_st *st, qwen35_extra *extra)
{
    *extra = (qwen35_extra){ 0 };
    dflash_binder b;
    DFLASH_TRY(dflash_binder_init(&b, NULL, st));
    const char *base = c->multimodal ? "model.language_model." : "model.";
    const int64_t H = c->hidden_size, V = c->vocab_size;
    char p[96];
    dflash_status s = need(&b, base, "embed_tokens.weight", 2, V, H, 0);
    if (s == DFLASH_OK)
        s = need(&b, base, "norm.weight", 1, H, 0, 0);
    if (s == DFLASH_OK && (!c->tie_word_embeddings || dflash_st_find(st, "lm_head.weight")))
        s = need(&b, "", "lm_head.weight", 2, V, H, 0);
    for (int i = 0; s == DFLASH_OK && i < c->num_hidden_layers; i++) {
        snprintf(p, sizeof p, "%slayers.%d.", base, i);
        s = need(&b, p, "input_layernorm.weight", 1, H, 0, 0);
        if (s == DFLASH_OK)
            s = need(&b, p, "post_attention_layernorm.weight", 1, H, 0, 0);
        if (s == DFLASH_OK)
            s = c->layer_linear[i] ? check_linear_attn(&b, p, c) : check_full_attn(&b, p, c);
        if (s == DFLASH_OK)
            s = c->family == DFLASH_FAMILY_QWEN35_MOE ? check_moe(&b, p, c)
                                                     : check_swiglu(&b, p, "mlp.", H, c->intermediate_size);
    }
    if (s == DFLASH_OK)
        s = account_unused(&b, c, extra);
    extra->n_params = b.n_params;
    dflash_binder_free(&b);
    return s;
}
