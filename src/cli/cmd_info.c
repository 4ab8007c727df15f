/* cmd_info.c: `dflash info DIR`: describe a checkpoint (architecture,
 * geometry, dtypes, parameter count) without building a model, after the
 * very checks loading runs (qwen3_checkpoint_check), so a checkpoint that
 * describes itself here also loads, and one that does not fails with the
 * message loading would give. */
#include <stdio.h>
#include <string.h>

#include "backend/backend.h"
#include "cli/args.h"
#include "cli/commands.h"
#include "io/hf_config.h"
#include "io/safetensors.h"
#include "target/gdn.h"
#include "target/qwen35.h"
#include "target/qwen3_layer.h"

int dflash_cmd_info(int argc, char **argv)
{
    if (argc != 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        FILE *f = argc == 2 ? stdout : stderr;
        fprintf(f, "usage: dflash info DIR\n\n"
                   "Describe a target (Qwen3, Qwen3-MoE, Llama, Qwen3.5, Qwen3.5-MoE) or DFlash\n"
                   "drafter checkpoint folder: architecture, geometry, tensor dtypes and parameter\n"
                   "count, and a hybrid's recurrent state per sequence.\n");
        return argc == 2 ? cli_finish_stdout(0) : 2;
    }
    const char *dir = argv[1];
    dflash_model_config c;
    dflash_st *st = NULL;
    qwen35_extra extra = { 0 };
    if (dflash_config_check_folder(dir, "dflash info") != DFLASH_OK || dflash_config_load(dir, &c) != DFLASH_OK ||
        dflash_st_open(dir, &st) != DFLASH_OK ||
        (dflash_family_is_qwen35(c.family) ? qwen35_checkpoint_check(&c, st, &extra)
                                           : qwen3_checkpoint_check(&c, st)) != DFLASH_OK) {
        fprintf(stderr, "dflash info: %s\n", dflash_last_error());
        dflash_st_close(st);
        return 1;
    }
    int64_t params = 0, by_dtype[8] = { 0 };
    for (size_t i = 0; i < dflash_st_count(st); i++) {
        const dflash_tensor_info *t = dflash_st_at(st, i);
        params += t->numel;
        if ((unsigned)t->dtype < 8)
            by_dtype[t->dtype] += t->numel;
    }
    printf("%s\n  architecture   %s (%s%s)\n", dir, c.architecture[0] ? c.architecture : "(not given)",
           c.is_dflash ? "DFlash drafter" : dflash_family_name(c.family), c.is_dflash ? "" : " target");
    printf("  layers         %d\n  hidden         %d\n  heads          %d (kv %d, head_dim %d)\n",
           c.num_hidden_layers, c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim);
    if (c.intermediate_size)
        printf("  intermediate   %d\n", c.intermediate_size);
    printf("  vocab          %d%s\n", c.vocab_size, c.tie_word_embeddings ? " (tied embeddings)" : "");
    if (dflash_family_is_qwen35(c.family)) {
        int linear = 0;
        for (int i = 0; i < c.num_hidden_layers; i++)
            linear += c.layer_linear[i];
        printf("  layer kinds    %d Gated DeltaNet linear attention (key heads %d x %d, value heads %d x %d, "
               "conv %d), %d gated full attention (RoPE on %d of %d dimensions)\n", linear, c.linear_num_key_heads,
               c.linear_key_head_dim, c.linear_num_value_heads, c.linear_value_head_dim, c.linear_conv_kernel,
               c.num_hidden_layers - linear, c.rotary_dim, c.head_dim);
        /* what each sequence holds besides its KV pages (target/qwen35_state.h) */
        const double rec = (double)dflash_conv_rec_size(qwen3_gdn_channels(&c)) +
                           (double)dflash_delta_rec_size(c.linear_num_value_heads, c.linear_key_head_dim,
                                                         c.linear_value_head_dim);
        printf("  state          %.1f MB per sequence (f32, per linear-attention layer: the last %d rows' inputs "
               "and delta-rule entries, %d chunk-start states)\n", rec * linear * sizeof(float) / 1e6,
               DFLASH_REC_ROWS, DFLASH_REC_CHUNK_STATES);
        if (c.multimodal)
            printf("  layout         multimodal (text_config, model.language_model.*): %d vision and %d mtp "
                   "tensors not used\n", extra.vision_tensors, extra.mtp_tensors);
        else if (extra.mtp_tensors)
            printf("  not used       %d mtp tensors\n", extra.mtp_tensors);
    }
    if (c.num_experts) {
        int sparse = 0;
        for (int i = 0; i < c.num_hidden_layers; i++)
            sparse += c.layer_moe[i];
        printf("  experts        %d, %d active per token%s, %d wide; %d of %d layers sparse", c.num_experts,
               c.num_experts_per_tok, c.norm_topk_prob ? " (weights renormalised)" : "", c.moe_intermediate_size,
               sparse, c.num_hidden_layers);
        if (c.shared_expert_intermediate_size)
            printf("; a shared expert %d wide%s", c.shared_expert_intermediate_size,
                   qwen3_moe_shared_may_join(&c) ? " (as wide as the routed ones: run as one of them)" : "");
        printf("\n");
    }
    const dflash_rope_params *r = &c.rope;
    printf("  rope           %s, theta %g", dflash_rope_kind_name(r->kind), r->theta);
    if (r->kind != DFLASH_ROPE_DEFAULT)
        printf(", factor %g", r->factor);
    if (r->kind == DFLASH_ROPE_LLAMA3)
        printf(", frequency factors low %g high %g", r->low_freq_factor, r->high_freq_factor);
    if (r->kind == DFLASH_ROPE_LLAMA3 || r->kind == DFLASH_ROPE_YARN)
        printf(", original context %g", r->original_max_pos);
    if (r->kind == DFLASH_ROPE_YARN)
        printf(", attention factor %.6g", c.rope_freq.attn_factor);
    printf("\n");
    if (c.is_dflash) {
        printf("  block_size     %d%s\n  mask_token_id  %d\n  target layers  %d, taps [", c.block_size,
               c.drafter_causal ? " (causal inside the block)" : "", c.mask_token_id, c.num_target_layers);
        for (int i = 0; i < c.n_target_layer_ids; i++)
            printf("%s%d", i ? ", " : "", c.target_layer_ids[i]);
        printf("]\n");
    }
    printf("  tensors        %zu, %lld parameters (%.2f M)\n  dtypes        ", dflash_st_count(st),
           (long long)params, params / 1e6);
    for (int d = 0; d < 8; d++)
        if (by_dtype[d])
            printf(" %s %lld", dflash_dtype_name((dflash_dtype)d), (long long)by_dtype[d]);
    printf("\n");
    dflash_st_close(st);
    return cli_finish_stdout(0);
}
