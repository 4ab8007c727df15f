/* bench_model.c: see bench_model.h. Owns the random-weight checkpoints of
 * `dflash bench`: seeded noise, the safetensors image writer, the tensors
 * of each target and drafter layout, and their config.json text. */
#include "cli/bench_model.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"

/* ---- random numbers ----------------------------------------------------- */

uint64_t bench_splitmix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* xorshift64: fast enough to write GBs of weights in seconds. */
static inline uint64_t xorshift64(uint64_t *s)
{
    uint64_t x = *s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *s = x;
}

/* Uniform in [-1, 1) from the high 32 bits. */
static inline float uniform_pm1(uint64_t *s) { return (float)(int32_t)(uint32_t)(xorshift64(s) >> 32) * 0x1p-31f; }

void bench_fill_f32(float *x, size_t n, uint64_t seed, float amp)
{
    uint64_t s = bench_splitmix64(seed) | 1;
    for (size_t i = 0; i < n; i++)
        x[i] = amp * uniform_pm1(&s);
}

/* ---- random-weight safetensors images ----------------------------------- */

dflash_status bench_img_add(bench_image *im, const char *prefix, const char *name, int64_t rows, int64_t cols,
                            float center, float amp)
{
    if (im->n == im->cap) {
        int cap = im->cap ? 2 * im->cap : 64;
        img_tensor *t = realloc(im->t, (size_t)cap * sizeof *t);
        if (!t)
            return dflash_fail(DFLASH_ERR_OOM, "out of memory");
        im->t = t;
        im->cap = cap;
    }
    img_tensor *t = &im->t[im->n++];
    snprintf(t->name, sizeof t->name, "%s%s", prefix, name);
    t->lead = 0;
    t->rows = rows;
    t->cols = cols;
    t->center = center;
    t->amp = amp;
    return DFLASH_OK;
}

/* Tensor "<prefix><name>" [lead, rows, cols]. */
static dflash_status img_add3(bench_image *im, const char *prefix, const char *name, int64_t lead, int64_t rows,
                              int64_t cols, float center, float amp)
{
    DFLASH_TRY(bench_img_add(im, prefix, name, rows, cols, center, amp));
    im->t[im->n - 1].lead = lead;
    return DFLASH_OK;
}

/* The tensors qwen3_layer_bind reads, under `prefix` (a Llama layer: no
 * q/k norms; a MoE layer: a router and each expert's three projections). */
dflash_status bench_img_add_layer(bench_image *im, const char *prefix, const bench_geom *g, int llama,
                                  const bench_preset *p)
{
    const int64_t H = g->hidden, D = g->head_dim, QD = (int64_t)g->heads * D, KD = (int64_t)g->kv_heads * D,
                  I = g->inter;
    DFLASH_TRY(bench_img_add(im, prefix, "input_layernorm.weight", 0, H, 1, NORM_AMP));
    DFLASH_TRY(bench_img_add(im, prefix, "post_attention_layernorm.weight", 0, H, 1, NORM_AMP));
    if (!llama) {
        DFLASH_TRY(bench_img_add(im, prefix, "self_attn.q_norm.weight", 0, D, 1, NORM_AMP));
        DFLASH_TRY(bench_img_add(im, prefix, "self_attn.k_norm.weight", 0, D, 1, NORM_AMP));
    }
    DFLASH_TRY(bench_img_add(im, prefix, "self_attn.q_proj.weight", QD, H, 0, W_AMP));
    DFLASH_TRY(bench_img_add(im, prefix, "self_attn.k_proj.weight", KD, H, 0, W_AMP));
    DFLASH_TRY(bench_img_add(im, prefix, "self_attn.v_proj.weight", KD, H, 0, W_AMP));
    DFLASH_TRY(bench_img_add(im, prefix, "self_attn.o_proj.weight", H, QD, 0, W_AMP));
    if (p && p->experts) {
        char name[96];
        DFLASH_TRY(bench_img_add(im, prefix, "mlp.gate.weight", p->experts, H, 0, W_AMP));
        for (int e = 0; e < p->experts; e++) {
            static const char *const proj[] = { "gate_proj", "up_proj", "down_proj" };
            for (int k = 0; k < 3; k++) {
                snprintf(name, sizeof name, "mlp.experts.%d.%s.weight", e, proj[k]);
                DFLASH_TRY(bench_img_add(im, prefix, name, k == 2 ? H : p->moe_inter, k == 2 ? p->moe_inter : H, 0,
                                   W_AMP));
            }
        }
        return DFLASH_OK;
    }
    DFLASH_TRY(bench_img_add(im, prefix, "mlp.gate_proj.weight", I, H, 0, W_AMP));
    DFLASH_TRY(bench_img_add(im, prefix, "mlp.up_proj.weight", I, H, 0, W_AMP));
    return bench_img_add(im, prefix, "mlp.down_proj.weight", H, I, 0, W_AMP);
}

static size_t img_numel(const img_tensor *t)
{
    return (size_t)(t->lead ? t->lead : 1) * (size_t)(t->rows ? t->rows : 1) * (size_t)t->cols;
}

static void fill_bf16(uint16_t *x, size_t n, uint64_t seed, float center, float amp)
{
    uint64_t s = bench_splitmix64(seed) | 1;
    for (size_t i = 0; i < n; i++)
        x[i] = dflash_f32_to_bf16(center + amp * uniform_pm1(&s));
}

/* Lay out, write the header, fill the data. Chunks are seeded by (seed,
 * tensor, chunk), so the image does not depend on the thread count or on
 * which thread fills which chunk. */
dflash_status bench_img_build(bench_image *im, const char *what, uint64_t seed)
{
    json_t *hdr = json_object();
    size_t off = 0;
    int ok = hdr != NULL;
    for (int i = 0; ok && i < im->n; i++) {
        img_tensor *t = &im->t[i];
        size_t bytes = img_numel(t) * 2;
        t->off = off;
        json_t *shape = t->lead ? json_pack("[III]", (json_int_t)t->lead, (json_int_t)t->rows, (json_int_t)t->cols)
                        : t->rows ? json_pack("[II]", (json_int_t)t->rows, (json_int_t)t->cols)
                                : json_pack("[I]", (json_int_t)t->cols);
        json_t *e = shape ? json_pack("{s:s, s:o, s:[II]}", "dtype", "BF16", "shape", shape, "data_offsets",
                                      (json_int_t)off, (json_int_t)(off + bytes))
                          : NULL;
        ok = e && json_object_set_new(hdr, t->name, e) == 0;
        off += bytes;
    }
    char *text = ok ? json_dumps(hdr, JSON_COMPACT) : NULL;
    json_decref(hdr);
    if (!text)
        return dflash_fail(DFLASH_ERR_OOM, "out of memory building a safetensors header");
    /* Pad the header with spaces so the data starts 8-byte aligned, as
     * safetensors writers do (bf16 elements must be aligned). */
    size_t hlen = strlen(text), hpad = (hlen + 7) / 8 * 8;
    im->data_off = 8 + hpad;
    im->len = im->data_off + off;
    im->buf = malloc(im->len);
    if (!im->buf) {
        free(text);
        return dflash_fail(DFLASH_ERR_OOM, "cannot allocate %.2f GB for the %s weights", im->len / 1e9, what);
    }
    for (int b = 0; b < 8; b++)
        im->buf[b] = (uint8_t)((uint64_t)hpad >> (8 * b));
    memcpy(im->buf + 8, text, hlen);
    memset(im->buf + 8 + hlen, ' ', hpad - hlen);
    free(text);

    /* Every tensor's chunks in one list (a MoE's thousands of experts
     * are one or two chunks each), filled a tenth of the bytes at a time
     * by all threads, progress shown after each tenth. */
    const size_t chunk = (size_t)1 << 20;
    int64_t *first = malloc(((size_t)im->n + 1) * sizeof *first); /* tensor i's first chunk in the list */
    if (!first)
        return dflash_fail(DFLASH_ERR_OOM, "out of memory");
    first[0] = 0;
    for (int i = 0; i < im->n; i++)
        first[i + 1] = first[i] + (int64_t)((img_numel(&im->t[i]) + chunk - 1) / chunk);
    const int64_t total = first[im->n];
    const int progress = off > BENCH_PROGRESS_BYTES, steps = progress ? 10 : 1;
    if (progress)
        fprintf(stderr, "dflash bench: %s: writing %.2f GB of random bf16 weights\n", what, off / 1e9);
    for (int step = 0, i0 = 0; step < steps; step++) {
        const int64_t lo = total * step / steps, hi = total * (step + 1) / steps;
#pragma omp parallel for schedule(dynamic, 4)
        for (int64_t g = lo; g < hi; g++) {
            int a = 0, b = im->n - 1; /* the tensor holding chunk g: first[a] <= g < first[a + 1] */
            while (a < b) {
                const int m = (a + b + 1) / 2;
                if (first[m] <= g)
                    a = m;
                else
                    b = m - 1;
            }
            const img_tensor *t = &im->t[a];
            const size_t n = img_numel(t), c = (size_t)(g - first[a]), from = c * chunk;
            const uint64_t tseed = bench_splitmix64(seed ^ ((uint64_t)a << 40));
            fill_bf16((uint16_t *)(im->buf + im->data_off + t->off) + from, n - from < chunk ? n - from : chunk,
                      tseed + (uint64_t)c, t->center, t->amp);
        }
        while (i0 < im->n && first[i0 + 1] <= hi)
            i0++; /* tensors done */
        if (progress)
            fprintf(stderr, "dflash bench: %s: %.2f / %.2f GB\n", what,
                    (i0 < im->n ? im->t[i0].off : off) / 1e9, off / 1e9);
    }
    free(first);
    return DFLASH_OK;
}

void bench_img_free(bench_image *im)
{
    free(im->t);
    free(im->buf);
    memset(im, 0, sizeof *im);
}

/* Parse a config and open the image as a tensor set. */
dflash_status bench_img_open(const bench_image *im, const char *json, const char *label, dflash_model_config *cfg,
                             dflash_st **st)
{
    DFLASH_TRY(dflash_config_parse(json, strlen(json), label, cfg));
    return dflash_st_open_memory(im->buf, im->len, label, st);
}

/* config.json text of a target (a Qwen3, a Llama 3.1 when `llama`, a
 * Qwen3-MoE when moe != NULL), or (drafter != NULL) of that preset's DFlash
 * drafter. */
/* A Qwen3.5-MoE hybrid's config.json: text-only, every 4th layer full
 * attention, RoPE theta 1e7 on a quarter of each head. */
static void hybrid_config_json(char *buf, size_t cap, const bench_geom *g, int vocab, int tied, const bench_preset *p)
{
    snprintf(buf, cap,
             "{\"architectures\":[\"Qwen3_5MoeForCausalLM\"],\"model_type\":\"qwen3_5_moe_text\","
             "\"torch_dtype\":\"bfloat16\",\"hidden_size\":%d,\"num_hidden_layers\":%d,\"num_attention_heads\":%d,"
             "\"num_key_value_heads\":%d,\"head_dim\":%d,\"vocab_size\":%d,\"tie_word_embeddings\":%s,"
             "\"max_position_embeddings\":262144,\"rms_norm_eps\":1e-06,\"full_attention_interval\":4,"
             "\"rope_parameters\":{\"rope_type\":\"default\",\"rope_theta\":10000000.0,\"partial_rotary_factor\":0.25},"
             "\"linear_num_key_heads\":%d,\"linear_num_value_heads\":%d,\"linear_key_head_dim\":%d,"
             "\"linear_value_head_dim\":%d,\"linear_conv_kernel_dim\":%d,\"num_experts\":%d,"
             "\"num_experts_per_tok\":%d,\"moe_intermediate_size\":%d,\"shared_expert_intermediate_size\":%d}",
             g->hidden, g->layers, g->heads, g->kv_heads, g->head_dim, vocab, tied ? "true" : "false", p->hy.k_heads,
             p->hy.v_heads, p->hy.k_dim, p->hy.v_dim, p->hy.conv, p->experts, p->topk, p->moe_inter,
             p->hy.shared_inter);
}

void bench_config_json(char *buf, size_t cap, const bench_geom *g, int vocab, int tied, int llama,
                       const bench_preset *moe, const bench_preset *drafter)
{
    if (!drafter && moe && moe->hy.v_heads) {
        hybrid_config_json(buf, cap, g, vocab, tied, moe);
        return;
    }
    size_t k = (size_t)snprintf(
        buf, cap,
        "{\"architectures\":[\"%s\"],\"torch_dtype\":\"bfloat16\",\"hidden_size\":%d,\"num_hidden_layers\":%d,"
        "\"num_attention_heads\":%d,\"num_key_value_heads\":%d,\"head_dim\":%d,\"intermediate_size\":%d,"
        "\"vocab_size\":%d,\"tie_word_embeddings\":%s,%s",
        drafter ? "DFlashDraftModel" : llama ? "LlamaForCausalLM" : moe ? "Qwen3MoeForCausalLM" : "Qwen3ForCausalLM",
        g->hidden, g->layers, g->heads, g->kv_heads, g->head_dim, g->inter, vocab, tied ? "true" : "false",
        llama ? "\"max_position_embeddings\":131072,\"rms_norm_eps\":1e-05,\"rope_theta\":500000.0,"
                "\"rope_scaling\":{\"rope_type\":\"llama3\",\"factor\":8.0,\"low_freq_factor\":1.0,"
                "\"high_freq_factor\":4.0,\"original_max_position_embeddings\":8192}"
              : "\"max_position_embeddings\":40960,\"rms_norm_eps\":1e-06,\"rope_theta\":1000000");
    if (moe)
        k += (size_t)snprintf(buf + k, cap - k,
                              ",\"num_experts\":%d,\"num_experts_per_tok\":%d,\"moe_intermediate_size\":%d,"
                              "\"norm_topk_prob\":true",
                              moe->experts, moe->topk, moe->moe_inter);
    if (drafter) {
        k += (size_t)snprintf(buf + k, cap - k,
                              ",\"block_size\":%d,\"num_target_layers\":%d,\"dflash_config\":{\"mask_token_id\":%d,"
                              "\"target_layer_ids\":[",
                              drafter->block, drafter->target_layers, vocab - 1);
        for (int i = 0; i < drafter->n_taps; i++)
            k += (size_t)snprintf(buf + k, cap - k, "%s%d", i ? "," : "", drafter->taps[i]);
        k += (size_t)snprintf(buf + k, cap - k, "]}");
    }
    snprintf(buf + k, cap - k, "}");
}

/* A target image: embedding, final norm, LM head unless tied, layers (a
 * Qwen3-MoE's when moe != NULL). */
/* The tensors of one Qwen3.5-MoE hybrid layer (qwen35.h's layout; the
 * zero-centred norms applied as 1 + w near 0, the gated norm near 1,
 * A_log = log of 1..16, experts stacked). */
static dflash_status img_add_hybrid_layer(bench_image *im, const char *prefix, const bench_geom *g, int linear,
                                          const bench_preset *p)
{
    const int64_t H = g->hidden, D = g->head_dim, QD = (int64_t)g->heads * D, KD = (int64_t)g->kv_heads * D,
                  Kd = (int64_t)p->hy.k_heads * p->hy.k_dim, Hv = p->hy.v_heads, Vd = Hv * p->hy.v_dim,
                  C = 2 * Kd + Vd, E = p->experts, I = p->moe_inter, Is = p->hy.shared_inter;
    DFLASH_TRY(bench_img_add(im, prefix, "input_layernorm.weight", 0, H, 0, NORM_AMP));
    DFLASH_TRY(bench_img_add(im, prefix, "post_attention_layernorm.weight", 0, H, 0, NORM_AMP));
    if (linear) {
        DFLASH_TRY(bench_img_add(im, prefix, "linear_attn.in_proj_qkv.weight", C, H, 0, W_AMP));
        DFLASH_TRY(bench_img_add(im, prefix, "linear_attn.in_proj_z.weight", Vd, H, 0, W_AMP));
        DFLASH_TRY(bench_img_add(im, prefix, "linear_attn.in_proj_b.weight", Hv, H, 0, W_AMP));
        DFLASH_TRY(bench_img_add(im, prefix, "linear_attn.in_proj_a.weight", Hv, H, 0, W_AMP));
        DFLASH_TRY(img_add3(im, prefix, "linear_attn.conv1d.weight", C, 1, p->hy.conv, 0, 0.5f));
        DFLASH_TRY(bench_img_add(im, prefix, "linear_attn.dt_bias", 0, Hv, 0, 1.0f));
        DFLASH_TRY(bench_img_add(im, prefix, "linear_attn.A_log", 0, Hv, 1.39f, 1.38f));
        DFLASH_TRY(bench_img_add(im, prefix, "linear_attn.norm.weight", 0, p->hy.v_dim, 1, NORM_AMP));
        DFLASH_TRY(bench_img_add(im, prefix, "linear_attn.out_proj.weight", H, Vd, 0, W_AMP));
    } else {
        DFLASH_TRY(bench_img_add(im, prefix, "self_attn.q_proj.weight", 2 * QD, H, 0, W_AMP));
        DFLASH_TRY(bench_img_add(im, prefix, "self_attn.k_proj.weight", KD, H, 0, W_AMP));
        DFLASH_TRY(bench_img_add(im, prefix, "self_attn.v_proj.weight", KD, H, 0, W_AMP));
        DFLASH_TRY(bench_img_add(im, prefix, "self_attn.o_proj.weight", H, QD, 0, W_AMP));
        DFLASH_TRY(bench_img_add(im, prefix, "self_attn.q_norm.weight", 0, D, 0, NORM_AMP));
        DFLASH_TRY(bench_img_add(im, prefix, "self_attn.k_norm.weight", 0, D, 0, NORM_AMP));
    }
    DFLASH_TRY(bench_img_add(im, prefix, "mlp.gate.weight", E, H, 0, W_AMP));
    DFLASH_TRY(img_add3(im, prefix, "mlp.experts.gate_up_proj", E, 2 * I, H, 0, W_AMP));
    DFLASH_TRY(img_add3(im, prefix, "mlp.experts.down_proj", E, H, I, 0, W_AMP));
    DFLASH_TRY(bench_img_add(im, prefix, "mlp.shared_expert.gate_proj.weight", Is, H, 0, W_AMP));
    DFLASH_TRY(bench_img_add(im, prefix, "mlp.shared_expert.up_proj.weight", Is, H, 0, W_AMP));
    DFLASH_TRY(bench_img_add(im, prefix, "mlp.shared_expert.down_proj.weight", H, Is, 0, W_AMP));
    return bench_img_add(im, prefix, "mlp.shared_expert_gate.weight", 1, H, 0, W_AMP);
}

dflash_status bench_target_image(bench_image *im, const bench_geom *g, int vocab, int tied, int llama,
                                 const bench_preset *moe, const char *what, uint64_t seed)
{
    const int hybrid = moe && moe->hy.v_heads;
    DFLASH_TRY(bench_img_add(im, "", "model.embed_tokens.weight", vocab, g->hidden, 0, W_AMP));
    DFLASH_TRY(bench_img_add(im, "", "model.norm.weight", 0, g->hidden, hybrid ? 0 : 1, NORM_AMP));
    if (!tied)
        DFLASH_TRY(bench_img_add(im, "", "lm_head.weight", vocab, g->hidden, 0, W_AMP));
    char prefix[64];
    for (int l = 0; l < g->layers; l++) {
        snprintf(prefix, sizeof prefix, "model.layers.%d.", l);
        if (hybrid)
            DFLASH_TRY(img_add_hybrid_layer(im, prefix, g, (l + 1) % 4 != 0, moe));
        else
            DFLASH_TRY(bench_img_add_layer(im, prefix, g, llama, moe));
    }
    return bench_img_build(im, what, seed);
}
