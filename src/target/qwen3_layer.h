/* qwen3_layer.h: one Qwen3 decoder layer, shared by the target and the
 * DFlash drafter (same pre-norm block; they differ only in where attention
 * keys come from, so attention itself is left to the caller); a Llama
 * target's layer is the same block without the q/k norms. And the
 * checkpoint layout both are bound from (qwen3_checkpoint_bind: the one
 * place that says which tensors a target or drafter checkpoint holds):
 *
 *   attn_in:      x += the previous layer's output (pending); xn = rmsnorm(x);
 *                 q,k,v = proj(xn); q,k = rope(qk_norm(q,k))   (Llama:
 *                 rope(q,k); without biases one stage: qkv_norm_rope_store)
 * (every projection plus its bias where the config has them)
 *   (caller)      attn = attention(q, keys...)
 *   attn_out_mlp: x += o(attn); xn = rmsnorm(x) (one stage:
 *                 linear_add_rmsnorm, delta its scratch);
 *                 delta = down(silu(gate(xn)) * up(xn))   (added by the next
 *                 layer's attn_in or the final norm, which also runs
 *                 down itself where it can: qwen3_layer_defers_down,
 *                 gate then holds its input); on a Qwen3-MoE
 *                 layer with a sparse MLP, moe(xn) (target/moe.h): in
 *                 delta, or, where it defers, left as its weighted sum of
 *                 the experts' rows in b->moe for the next norm to add
 *                 (qwen3_layer_norm_in); delta is then not written
 *
 * A Qwen3.5 hybrid's layers reuse the MLP half (qwen3_layer_ffn); their
 * mixers are its gated attention (target/qwen35.h) or a Gated DeltaNet
 * (target/gdn.h), and the checkpoint layout is qwen35.c's.
 */
#ifndef DFLASH_TARGET_QWEN3_LAYER_H
#define DFLASH_TARGET_QWEN3_LAYER_H

#include "backend/backend.h"
#include "backend/weight_bind.h"
#include "io/hf_config.h"
#include "io/safetensors.h"
#include "target/gdn.h"
#include "target/moe.h"

enum { QWEN3_LIN_Q, QWEN3_LIN_K, QWEN3_LIN_V, QWEN3_LIN_O, QWEN3_LIN_GATE, QWEN3_LIN_UP, QWEN3_LIN_DOWN,
       QWEN3_LIN_COUNT };

typedef struct qwen3_layer {
    dflash_weight input_norm, post_norm;   /* [H] */
    dflash_weight q_norm, k_norm;          /* [D]; unbound (no data) without q/k norms (dflash_config_qk_norm) */
    dflash_weight lin[QWEN3_LIN_COUNT];    /* q [Hq*D, H], k/v [Hkv*D, H], o [H, Hq*D],
                                              gate/up [I, H], down [H, I] (unbound on a sparse layer) */
    dflash_weight bias[QWEN3_LIN_COUNT];   /* each projection's [rows], bound with attention_bias (q, k, v,
                                              o) and mlp_bias (gate, up, down), else unbound */
    qwen3_moe moe;                         /* a sparse MLP: moe.experts != NULL */
    qwen3_gdn gdn;                         /* a Qwen3.5 linear-attention layer: its mixer instead of q..o
                                              (gdn.out.data != NULL) */
} qwen3_layer;

/* Activation buffers of a layer, [R, ...] with R rows at most. */
typedef struct qwen3_bufs {
    float *x;      /* [R, H] residual stream */
    float *xn;     /* [R, H] normed input of the current sub-block */
    float *q;      /* [R, Hq*D] */
    float *k, *v;  /* [R, Hkv*D] */
    float *attn;   /* [R, Hq*D] */
    float *delta;  /* [R, H] pending residual update */
    float *gate;   /* [R, I] */
    float *up;     /* [R, I] */
    int32_t *pos;  /* [R] absolute positions: the owner's forward inputs (not allocated here) */
    qwen3_moe_bufs moe; /* a Qwen3-MoE model's sparse MLP scratch (else unallocated) */
    /* a Qwen3.5 hybrid's (else unallocated): */
    float *qg;          /* [R, 2 * Hq*D] a gated attention's q_proj output: per head its query (copied
                           to q), then its gate (read in place by qwen35_attn_gate) */
    qwen3_gdn_bufs gdn; /* the linear-attention layers' scratch */
} qwen3_bufs;

/* Bind "<prefix>input_layernorm.weight", "<prefix>self_attn.q_proj.weight",
 * ... with shape checks; `sparse`: the MLP is a MoE's (moe.h). */
dflash_status qwen3_layer_bind(dflash_binder *b, const char *prefix, const dflash_model_config *c, int sparse,
                               qwen3_layer *l);
/* Frees what binding allocated for layers[0 .. n) (the experts tables),
 * then the array itself. */
void qwen3_layers_free(qwen3_layer *layers, int n, dflash_backend *be);

/* A checkpoint's weights by role. A target binds embed
 * (model.embed_tokens), final_norm (model.norm) and lm_head (the embedding
 * when tied); a drafter binds fc, hidden_norm and final_norm (its `norm`).
 * Both bind layers[0 .. num_hidden_layers), an array the caller owns. */
typedef struct qwen3_checkpoint {
    dflash_weight embed, lm_head, final_norm; /* target (final_norm: both) */
    dflash_weight fc, hidden_norm;            /* drafter */
    qwen3_layer *layers;
    float *norm_host; /* a Qwen3.5's norm weights as 1 + w (the weights point at it on the CPU; owned,
                         free() it after the layers), else NULL */
} qwen3_checkpoint;

/* Binds every tensor a checkpoint of `c` must hold (a Qwen3, Llama or
 * Qwen3-MoE target, or a DFlash drafter when c->is_dflash) with shape and dtype
 * checks, then
 * refuses the tensors nothing bound (naming the first few and the likely
 * cause), except those transformers ignores too (see qwen3_layer.c). */
dflash_status qwen3_checkpoint_bind(dflash_binder *b, const dflash_model_config *c, qwen3_checkpoint *w);
/* qwen3_checkpoint_bind without a backend: the very checks loading runs,
 * for `dflash info`; fails with the message loading would give. */
dflash_status qwen3_checkpoint_check(const dflash_model_config *c, const dflash_st *st);
dflash_status qwen3_bufs_alloc(dflash_backend *be, const dflash_model_config *c, int rows, qwen3_bufs *b);
void qwen3_bufs_free(dflash_backend *be, qwen3_bufs *b);

/* The layer before a norm, as that norm sees it: the layer (NULL: none)
 * and the projection weights it ran with (its lin, or quantized copies). */
typedef struct qwen3_prev {
    const qwen3_layer *l;
    const dflash_weight *lin;
} qwen3_prev;
static inline qwen3_prev qwen3_prev_layer(const qwen3_layer *l) { return (qwen3_prev){ l, l ? l->lin : NULL }; }

/* Does a layer's MLP leave its down projection to the next norm
 * (qwen3_layer_norm_in), which adds it to the residual stream in one
 * stage (linear_add_rmsnorm)? A dense MLP without biases does. */
int qwen3_layer_defers_down(const dflash_model_config *c, const qwen3_layer *l);

/* x += the previous layer's output, then xn = rmsnorm(x) with `norm`.
 * prev: that layer (prev.l NULL: none, x is the embedding), which left
 * its output in b->delta; or its down projection's input in b->gate
 * (qwen3_layer_defers_down), projected here; or, a sparse MLP that
 * defers it (qwen3_moe_defers), as its weighted sum of the experts' rows,
 * added here (delta then scratch). */
dflash_status qwen3_layer_norm_in(dflash_backend *be, const dflash_model_config *c, qwen3_prev prev,
                                  const qwen3_bufs *b, const dflash_weight *norm, int n);
/* lin: the projection weights to use (l->lin, or quantized copies);
 * prev: as qwen3_layer_norm_in's; dst: where the rows' K and V go in the
 * pool, stored as q and k are normed and rotated (NULL: left in b). */
dflash_status qwen3_layer_attn_in(dflash_backend *be, const dflash_model_config *c, const qwen3_layer *l,
                                  const dflash_weight *lin, const qwen3_bufs *b, int n, qwen3_prev prev,
                                  const dflash_kv_dest *dst);
/* qwen3_layer_attn_in with its K/V stored at dst, then attn over them
 * (one stage, dflash_be_qkv_attention, where the layer has no biases);
 * b->q's content afterwards is unspecified. */
dflash_status qwen3_layer_attn(dflash_backend *be, const dflash_model_config *c, const qwen3_layer *l,
                               const dflash_weight *lin, const qwen3_bufs *b, int n, qwen3_prev prev,
                               const dflash_kv_dest *dst, const dflash_attn_args *attn);
dflash_status qwen3_layer_attn_out_mlp(dflash_backend *be, const dflash_model_config *c, const qwen3_layer *l,
                                       const dflash_weight *lin, const qwen3_bufs *b, int n);

/* The MLP half once the mixer's output is in the residual stream and
 * normed into b->xn (what attn_out_mlp runs after o_proj and its norm):
 * delta = mlp(xn), except on a layer that defers its output: a dense MLP
 * without biases (qwen3_layer_defers_down) leaves silu(gate(xn)) *
 * up(xn) in b->gate, a sparse one (qwen3_moe_defers) qwen3_moe_sum of
 * b->moe; delta is then left alone, and only qwen3_layer_norm_in (given
 * this layer as prev) finishes the output. */
dflash_status qwen3_layer_ffn(dflash_backend *be, const dflash_model_config *c, const qwen3_layer *l,
                              const dflash_weight *lin, const qwen3_bufs *b, int n);

/* The attention arguments every Qwen3 layer shares (geometry, q, out, scale). */
dflash_attn_args qwen3_attn_args(const dflash_model_config *c, const qwen3_bufs *b, int n);

#endif
