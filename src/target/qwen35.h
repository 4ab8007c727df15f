/* qwen35.h: the Qwen3.5 hybrid target (config family DFLASH_FAMILY_QWEN35
 * / _MOE): its checkpoint layout, bound into the target's layers, and its
 * gated full attention.
 *
 * The layout: every tensor of the text model, in the text-only layout
 * ("model.*") and in the published multimodal one
 * ("model.language_model.*"; the vision tower's "model.visual.*" and the
 * multi-token-prediction head's "mtp.*" are not part of the text model and
 * are counted, not used). Per layer: input_layernorm,
 * post_attention_layernorm; a linear-attention layer's linear_attn.{
 * in_proj_qkv, in_proj_z, in_proj_b, in_proj_a, conv1d [C, 1, K], dt_bias,
 * A_log, norm, out_proj} (target/gdn.h); a full-attention layer's
 * self_attn.{q_proj [2 x heads x head_dim: each head's query rows, then
 * its gate rows], k_proj, v_proj, o_proj, q_norm, k_norm}; the MLP: dense
 * gate/up/down, or a router, experts (one tensor each or stacked) and a
 * shared expert with its sigmoid gate (target/moe.h).
 *
 * The decoder, final and q/k RMSNorms store their weight centred on zero
 * and apply 1 + w (bound as that f32 vector); the linear attention's gated
 * norm applies its weight as stored.
 *
 * Gated full attention: q_proj gives each head's query and gate; the
 * query and key take their (1 + w) RMSNorm, then RoPE on the first
 * rotary_dim dimensions of each head; the attention output is multiplied
 * by sigmoid(gate) before o_proj. */
#ifndef DFLASH_TARGET_QWEN35_H
#define DFLASH_TARGET_QWEN35_H

#include "io/hf_config.h"
#include "io/safetensors.h"
#include "target/qwen3_layer.h"

/* What the check found outside the text model. */
typedef struct qwen35_extra {
    int vision_tensors; /* model.visual.* */
    int mtp_tensors;    /* mtp.* */
    int64_t n_params;   /* elements of the text model's tensors */
} qwen35_extra;

/* Binds every tensor of the text model into w (w->layers: the caller's
 * [num_hidden_layers], zeroed; w->norm_host is allocated here, the
 * caller frees it), then fails naming the first few tensors nothing
 * accounts for. */
dflash_status qwen35_checkpoint_bind(dflash_binder *b, const dflash_model_config *c, qwen3_checkpoint *w,
                                     qwen35_extra *extra);
/* The same checks without a backend (`dflash info`). */
dflash_status qwen35_checkpoint_check(const dflash_model_config *c, const dflash_st *st, qwen35_extra *extra);

/* A gated full-attention layer's input half: x += the previous layer's
 * output (prev: qwen3_layer_norm_in's); xn = rmsnorm(x); b->qg (queries
 * and gates), k, v from the projections, the queries copied to q; q and k
 * normed and partly rotated, and K and V stored at dst (as
 * qwen3_layer_attn_in's). */
dflash_status qwen35_attn_in(dflash_backend *be, const dflash_model_config *c, const qwen3_layer *l,
                             const qwen3_bufs *b, int n, qwen3_prev prev, const dflash_kv_dest *dst);
/* attn [n, heads * head_dim] *= sigmoid(the gates in b->qg, which
 * qwen35_attn_in left there) */
dflash_status qwen35_attn_gate(dflash_backend *be, const dflash_model_config *c, const qwen3_bufs *b, int n);

#endif
