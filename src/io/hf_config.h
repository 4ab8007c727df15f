/* hf_config.h: Hugging Face `config.json` of a target model (Qwen3 or
 * Llama) or of a DFlash drafter (a Qwen3 config + block_size,
 * num_target_layers, dflash_config).
 * Unknown or inconsistent values are errors naming the file and the field. */
#ifndef DFLASH_IO_HF_CONFIG_H
#define DFLASH_IO_HF_CONFIG_H

#include <stddef.h>

#include "core/rope.h"
#include "core/status.h"

#define DFLASH_MAX_LAYERS 256
#define DFLASH_MAX_EOS 8
#define DFLASH_MAX_TAPS 64

/* The model families a target can be: all are pre-norm decoder stacks
 * with SwiGLU MLPs and NeoX RoPE; Qwen3 adds a per-head RMSNorm on q and k
 * (q_norm, k_norm); Qwen3-MoE is Qwen3 whose MLP is, on its sparse layers,
 * a router choosing num_experts_per_tok of num_experts SwiGLU experts per
 * token. A DFlash drafter's layers are Qwen3's. */
typedef enum dflash_family {
    DFLASH_FAMILY_QWEN3 = 0, /* Qwen3ForCausalLM, model_type "qwen3" */
    DFLASH_FAMILY_LLAMA,     /* LlamaForCausalLM, model_type "llama" */
    DFLASH_FAMILY_QWEN3_MOE, /* Qwen3MoeForCausalLM, model_type "qwen3_moe" */
    /* Qwen3.5 hybrids: most layers Gated DeltaNet linear attention, every
     * few a gated full attention with a partial RoPE; text-only
     * (Qwen3_5ForCausalLM, "qwen3_5_text") or the multimodal folder
     * (Qwen3_5ForConditionalGeneration, "qwen3_5": the text model under
     * text_config, its weights under model.language_model.); see
     * target/qwen35.h. */
    DFLASH_FAMILY_QWEN35,
    DFLASH_FAMILY_QWEN35_MOE, /* the same with a MoE + shared expert MLP (Qwen3_5Moe*, "qwen3_5_moe[_text]") */
} dflash_family;

static inline int dflash_family_is_qwen35(dflash_family f)
{
    return f == DFLASH_FAMILY_QWEN35 || f == DFLASH_FAMILY_QWEN35_MOE;
}

/* The most experts a MoE layer may have (published Qwen3-MoE: 128). */
#define DFLASH_MAX_EXPERTS 1024

/* "Qwen3", "Llama", "Qwen3-MoE", "Qwen3.5", "Qwen3.5-MoE". */
const char *dflash_family_name(dflash_family f);

typedef struct dflash_model_config {
    char architecture[64]; /* architectures[0], e.g. "Qwen3ForCausalLM" */
    dflash_family family;  /* a drafter's layers are Qwen3's */
    char torch_dtype[16];  /* "bfloat16", ... ("" if absent) */
    int hidden_size;
    int num_hidden_layers;
    int num_attention_heads;
    int num_key_value_heads; /* null: num_attention_heads; absent: only where that is
                                transformers' default, 32 */
    int head_dim;            /* absent: only where hidden_size / num_attention_heads is
                                transformers' default, 128 */
    int intermediate_size;
    int vocab_size;
    int max_position_embeddings;
    float rms_norm_eps;
    /* RoPE: theta (top level or rope_parameters.rope_theta) and the kind
     * with its parameters (rope_scaling, else rope_parameters); rope_freq
     * is the table computed from them for head_dim. */
    dflash_rope_params rope;
    dflash_rope rope_freq;
    int tie_word_embeddings; /* 0/1 */
    /* Biases on the projections: attention_bias (q, k, v and o; a
     * target's, any family) and mlp_bias (gate, up and down; a Llama's:
     * Qwen3's MLP has none, as in transformers). */
    int attention_bias, mlp_bias;
    int bos_token_id;        /* -1 if absent */
    int n_eos;
    int eos_token_ids[DFLASH_MAX_EOS]; /* int or list in the json */
    /* Per-layer attention kind from `layer_types` (all full when absent). */
    unsigned char layer_sliding[DFLASH_MAX_LAYERS];
    int sliding_window;      /* 0 when absent/null */
    /* Qwen3-MoE (0 elsewhere): layer i's MLP is sparse when layer_moe[i]
     * (not in mlp_only_layers, and (i + 1) % decoder_sparse_step == 0),
     * else a dense MLP of intermediate_size. A sparse MLP routes each row
     * to the num_experts_per_tok experts of highest softmax probability
     * (over num_experts, or num_local_experts), their weights renormalised
     * to sum to 1 when norm_topk_prob; each expert is a SwiGLU MLP of
     * moe_intermediate_size. */
    int num_experts;
    int num_experts_per_tok;
    int moe_intermediate_size;
    int norm_topk_prob;
    unsigned char layer_moe[DFLASH_MAX_LAYERS];
    /* Qwen3.5 (0 elsewhere): layer i is Gated DeltaNet linear attention when
     * layer_linear[i] (layer_types "linear_attention", or absent: all but
     * every full_attention_interval-th), else gated full attention over the
     * first rotary_dim dimensions of each head (partial_rotary_factor).
     * The linear attention has linear_num_key_heads key heads of
     * linear_key_head_dim, linear_num_value_heads value heads of
     * linear_value_head_dim, a causal convolution of linear_conv_kernel_dim;
     * the MoE adds a shared expert of shared_expert_intermediate_size. */
    unsigned char layer_linear[DFLASH_MAX_LAYERS];
    int rotary_dim;
    int linear_conv_kernel, linear_key_head_dim, linear_value_head_dim, linear_num_key_heads,
        linear_num_value_heads;
    int shared_expert_intermediate_size;
    int multimodal; /* a *ForConditionalGeneration folder (text_config, model.language_model.*) */

    /* DFlash drafter fields; is_dflash: architectures[0] is "DFlashDraftModel",
     * or there is no architectures and a dflash_config object is present
     * (any architecture but those, Qwen3ForCausalLM and LlamaForCausalLM is
     * refused). */
    int is_dflash;
    int block_size;          /* top level or dflash_config.block_size; default 16 */
    /* is_causal or dflash_config.causal: the block's full-attention layers
     * see only earlier block rows (default: the whole block, bidirectional) */
    int drafter_causal;
    int num_target_layers;   /* required for a drafter */
    int mask_token_id;       /* dflash_config.mask_token_id, required */
    int n_target_layer_ids;
    int target_layer_ids[DFLASH_MAX_TAPS]; /* explicit, or spread evenly */
} dflash_model_config;

/* The layers hold q_norm and k_norm (Qwen3 and Qwen3-MoE targets and
 * drafters; not a Llama). */
static inline int dflash_config_qk_norm(const dflash_model_config *c)
{
    return c->family != DFLASH_FAMILY_LLAMA;
}

/* `path` is a config.json file or a folder holding one. */
dflash_status dflash_config_load(const char *path, dflash_model_config *out);
/* Loaders of a checkpoint folder call this first: when `path` is a file
 * (say DIR/config.json) it fails saying that `who` (e.g. "-m") takes the
 * folder, and which one; a folder or a missing path passes. */
dflash_status dflash_config_check_folder(const char *path, const char *who);
/* Parse JSON text; `label` names the source in messages. */
dflash_status dflash_config_parse(const char *json, size_t len, const char *label, dflash_model_config *out);

/* Default tap layers: n_draft == 1 -> [n_target / 2]; otherwise
 * round(1 + i * (n_target - 4) / (n_draft - 1)) with halves to even. */
void dflash_default_target_layer_ids(int n_target, int n_draft, int *out);

#endif
