/* qwen35.h: the checkpoint layout of a Qwen3.5 hybrid target (config
 * family DFLASH_FAMILY_QWEN35 / _MOE): every tensor its text model holds,
 * by name and shape, in the text-only layout ("model.*") and in the
 * published multimodal one ("model.language_model.*"; the vision tower's
 * "model.visual.*" and the multi-token-prediction head's "mtp.*" are not
 * part of the text model and are counted, not used).
 *
 * Per layer: input_layernorm, post_attention_layernorm; a linear-attention
 * layer's linear_attn.{in_proj_qkv, in_proj_z, in_proj_b, in_proj_a,
 * conv1d [C, 1, K], dt_bias, A_log, norm, out_proj}; a full-attention
 * layer's self_attn.{q_proj [2 x heads x head_dim: each head's query rows,
 * then its gate rows], k_proj, v_proj, o_proj, q_norm, k_norm}; the MLP:
 * dense gate/up/down, or a router, experts (one tensor each or stacked)
 * and a shared expert with its sigmoid gate.
 *
 * Only the check exists: loading such a target stops after it (its Gated
 * DeltaNet layers are not run yet), so `dflash info` describes a folder
 * with the very checks a load would make. */
#ifndef DFLASH_TARGET_QWEN35_H
#define DFLASH_TARGET_QWEN35_H

#include "io/hf_config.h"
#include "io/safetensors.h"

/* What the check found outside the text model. */
typedef struct qwen35_extra {
    int vision_tensors; /* model.visual.* */
    int mtp_tensors;    /* mtp.* */
    int64_t n_params;   /* elements of the text model's tensors */
} qwen35_extra;

/* Fails naming the first tensor that is missing or of the wrong shape, or
 * the text-model-looking tensors nothing accounts for. */
dflash_status qwen35_checkpoint_check(const dflash_model_config *c, const dflash_st *st, qwen35_extra *extra);

#endif
