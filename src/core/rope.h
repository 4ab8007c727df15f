/* rope.h: rotary position embedding (RoPE) frequencies. A checkpoint's
 * config names a kind (default, linear, llama3, yarn) and its parameters;
 * from them this file computes, once on the host, the table every backend
 * rotates with: inv_freq[j] for the head_dim / 2 dimension pairs and the
 * attention factor that multiplies cos and sin (YaRN's; 1 otherwise).
 *
 * The arithmetic is Hugging Face transformers' (5.x), operation for
 * operation: f32 where it computes on f32 tensors, double where it computes
 * on Python numbers, so the table equals transformers' to the last bit or
 * within an ulp of powf. A rotation at position p then uses
 * angle = (float)p * inv_freq[j], cos and sin times the attention factor. */
#ifndef DFLASH_CORE_ROPE_H
#define DFLASH_CORE_ROPE_H

#include "core/status.h"

typedef enum dflash_rope_kind {
    DFLASH_ROPE_DEFAULT = 0, /* inv_freq[j] = theta^(-2j / head_dim) */
    DFLASH_ROPE_LINEAR,      /* default / factor (positions divided by factor) */
    DFLASH_ROPE_LLAMA3,      /* Llama 3.1: long wavelengths / factor, a smooth band between */
    DFLASH_ROPE_YARN,        /* YaRN: interpolated and extrapolated frequencies blended by a ramp */
} dflash_rope_kind;

/* What config.json says (absent optional values as noted). */
typedef struct dflash_rope_params {
    dflash_rope_kind kind;
    double theta;               /* rope_theta */
    double factor;              /* linear, llama3, yarn */
    double low_freq_factor;     /* llama3 */
    double high_freq_factor;    /* llama3 */
    double original_max_pos;    /* llama3, yarn (yarn: max_position_embeddings when absent) */
    double beta_fast, beta_slow; /* yarn: 32 and 1 when absent */
    double mscale, mscale_all_dim; /* yarn: 0 when absent */
    double attention_factor;    /* yarn: 0 when absent (then derived from factor and mscale) */
    int truncate;               /* yarn: 1 (default) rounds the ramp's ends to whole dimensions */
} dflash_rope_params;

#define DFLASH_ROPE_MAX_PAIRS 256 /* head_dim up to 512 */

/* The table a backend rotates with. */
typedef struct dflash_rope {
    int n_pairs;       /* head_dim / 2 */
    float attn_factor; /* multiplies cos and sin */
    float inv_freq[DFLASH_ROPE_MAX_PAIRS];
} dflash_rope;

/* "default", "linear", "llama3", "yarn". */
const char *dflash_rope_kind_name(dflash_rope_kind kind);

/* Fill `out` for heads of `head_dim` (even, 2..2 * DFLASH_ROPE_MAX_PAIRS).
 * Parameters out of their domain (theta <= 0, factor <= 0, llama3 with
 * high_freq_factor <= low_freq_factor, ...) fail naming the field. */
dflash_status dflash_rope_init(const dflash_rope_params *p, int head_dim, dflash_rope *out);

/* The default table of `theta` (tests and tools). */
dflash_status dflash_rope_default(double theta, int head_dim, dflash_rope *out);

#endif
