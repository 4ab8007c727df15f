/* bench_model.h: the random-weight models of `dflash bench`: the preset
 * geometries, bf16 safetensors images built in memory (every tensor a
 * checkpoint of the geometry holds, filled with seeded uniform noise), and
 * the config.json text that describes them. */
#ifndef DFLASH_CLI_BENCH_MODEL_H
#define DFLASH_CLI_BENCH_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"
#include "io/hf_config.h"
#include "io/safetensors.h"

#define BENCH_PROGRESS_BYTES (256u << 20) /* images above this report progress */

typedef struct bench_geom {
    int layers, hidden, heads, kv_heads, head_dim, inter;
} bench_geom;

/* A Qwen3.5 hybrid's linear attention (3 of every 4 layers; the 4th is
 * gated full attention with RoPE on a quarter of each head) and its MoE's
 * shared expert. */
typedef struct bench_hybrid {
    int k_heads, v_heads, k_dim, v_dim, conv, shared_inter;
} bench_hybrid;

typedef struct bench_preset {
    const char *name;
    int vocab;
    int drafter;            /* time a drafter propose with geometry d */
    bench_geom d;
    int block, target_layers, n_taps, taps[8];
    int target;             /* time the target's verify and decode with geometry t */
    bench_geom t;
    int tied;               /* the target's LM head is its embedding */
    int llama;              /* the target is a Llama (no q/k norms, Llama 3.1's RoPE) */
    int experts, topk, moe_inter; /* experts > 0: a Qwen3-MoE target, every MLP sparse, top-k renormalised */
    bench_hybrid hy;        /* hy.v_heads > 0: the MoE target is a Qwen3.5-MoE hybrid */
} bench_preset;

/* Seeded numbers: a hash of x, and n floats uniform in [-amp, amp). */
uint64_t bench_splitmix64(uint64_t x);
void bench_fill_f32(float *x, size_t n, uint64_t seed, float amp);

/* One bf16 tensor of an image: values center + amp * u, u uniform in
 * [-1, 1). Shape [lead, rows, cols] (lead 0: [rows, cols]; rows 0 too:
 * a vector [cols]). */
typedef struct img_tensor {
    char name[96];
    int64_t lead, rows, cols;
    float center, amp;
    size_t off; /* in the data region */
} img_tensor;

typedef struct bench_image {
    img_tensor *t;
    int n, cap;
    uint8_t *buf; /* the whole file image: 8-byte header length, header, data */
    size_t len, data_off;
} bench_image;

/* Projections: std 0.02 (amp 0.02 * sqrt(3)), as Qwen3's initializer;
 * norms near 1, so activations keep a sane scale through every layer. */
#define W_AMP 0.0346f
#define NORM_AMP 0.1f

/* Tensor "<prefix><name>" [rows, cols] (rows 0: [cols]). */
dflash_status bench_img_add(bench_image *im, const char *prefix, const char *name, int64_t rows, int64_t cols,
                            float center, float amp);
/* The tensors of one Qwen3 / Llama / Qwen3-MoE layer (p: the MoE preset,
 * or NULL), as qwen3_layer_bind reads them. */
dflash_status bench_img_add_layer(bench_image *im, const char *prefix, const bench_geom *g, int llama,
                                  const bench_preset *p);
/* Lay out, write the header, fill the data (`what` names it in progress
 * lines and errors). */
dflash_status bench_img_build(bench_image *im, const char *what, uint64_t seed);
void bench_img_free(bench_image *im);
/* Parse a config and open the image as a tensor set. */
dflash_status bench_img_open(const bench_image *im, const char *json, const char *label, dflash_model_config *cfg,
                             dflash_st **st);

/* config.json text of a target (a Qwen3, a Llama 3.1 when `llama`, a
 * Qwen3-MoE or Qwen3.5-MoE hybrid when moe != NULL), or (drafter != NULL)
 * of that preset's DFlash drafter. */
void bench_config_json(char *buf, size_t cap, const bench_geom *g, int vocab, int tied, int llama,
                       const bench_preset *moe, const bench_preset *drafter);
/* A target image: embedding, final norm, LM head unless tied, layers (a
 * Qwen3-MoE's or a hybrid's when moe != NULL). */
dflash_status bench_target_image(bench_image *im, const bench_geom *g, int vocab, int tied, int llama,
                                 const bench_preset *moe, const char *what, uint64_t seed);

#endif
