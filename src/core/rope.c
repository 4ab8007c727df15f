/* rope.c: the RoPE frequency tables (see rope.h). Each kind follows the
 * order of operations of transformers' own function, with the precision
 * of each step: its tensor steps are f32 (a Python number meeting an f32
 * tensor is rounded to f32 first), its steps on Python numbers double. */
#include "core/rope.h"

#include <math.h>
#include <stddef.h>

const char *dflash_rope_kind_name(dflash_rope_kind kind)
{
    switch (kind) {
    case DFLASH_ROPE_DEFAULT: return "default";
    case DFLASH_ROPE_LINEAR: return "linear";
    case DFLASH_ROPE_LLAMA3: return "llama3";
    case DFLASH_ROPE_YARN: return "yarn";
    }
    return "?";
}

/* theta^(2j / dim) in f32, the frequencies' common start. */
static float pos_freq(double theta, int j, int dim)
{
    return powf((float)theta, (float)(2 * j) / (float)dim);
}

static void llama3(const dflash_rope_params *p, dflash_rope *r)
{
    const double low_wavelen = p->original_max_pos / p->low_freq_factor;
    const double high_wavelen = p->original_max_pos / p->high_freq_factor;
    const float factor = (float)p->factor;
    for (int j = 0; j < r->n_pairs; j++) {
        const float inv = r->inv_freq[j];
        const float wavelen = (float)(2 * M_PI) / inv;
        const float scaled = wavelen > (float)low_wavelen ? inv / factor : inv;
        const float smooth = ((float)p->original_max_pos / wavelen - (float)p->low_freq_factor) /
                             (float)(p->high_freq_factor - p->low_freq_factor);
        const float smoothed = (1.0f - smooth) * scaled / factor + smooth * scaled;
        const int medium = !(wavelen < (float)high_wavelen) && !(wavelen > (float)low_wavelen);
        r->inv_freq[j] = medium ? smoothed : scaled;
    }
}

/* YaRN's attention scale for a context stretched `scale` times. */
static double yarn_mscale(double scale, double mscale)
{
    return scale <= 1 ? 1.0 : 0.1 * mscale * log(scale) + 1.0;
}

/* The dimension (of `dim`) whose wavelength turns `rotations` times over
 * the original context. */
static double yarn_correction_dim(double rotations, int dim, double theta, double max_pos)
{
    return (dim * log(max_pos / (rotations * 2 * M_PI))) / (2 * log(theta));
}

static void yarn(const dflash_rope_params *p, int dim, dflash_rope *r)
{
    double attn = p->attention_factor;
    if (attn == 0)
        attn = p->mscale != 0 && p->mscale_all_dim != 0
                   ? yarn_mscale(p->factor, p->mscale) / yarn_mscale(p->factor, p->mscale_all_dim)
                   : yarn_mscale(p->factor, 1);
    r->attn_factor = (float)attn;
    const double beta_fast = p->beta_fast != 0 ? p->beta_fast : 32, beta_slow = p->beta_slow != 0 ? p->beta_slow : 1;
    double lo = yarn_correction_dim(beta_fast, dim, p->theta, p->original_max_pos);
    double hi = yarn_correction_dim(beta_slow, dim, p->theta, p->original_max_pos);
    if (p->truncate) {
        lo = floor(lo);
        hi = ceil(hi);
    }
    lo = lo > 0 ? lo : 0;
    hi = hi < dim - 1 ? hi : dim - 1;
    if (lo == hi)
        hi += 0.001; /* a ramp of zero width */
    const float factor = (float)p->factor;
    for (int j = 0; j < r->n_pairs; j++) {
        float ramp = ((float)j - (float)lo) / (float)(hi - lo);
        ramp = ramp < 0.0f ? 0.0f : ramp > 1.0f ? 1.0f : ramp;
        const float extrap_w = 1.0f - ramp;
        const float f = pos_freq(p->theta, j, dim);
        const float extrap = 1.0f / f, interp = 1.0f / (factor * f);
        r->inv_freq[j] = interp * (1.0f - extrap_w) + extrap * extrap_w;
    }
}

dflash_status dflash_rope_init(const dflash_rope_params *p, int head_dim, dflash_rope *out)
{
    if (head_dim % 2 != 0)
        return dflash_fail(DFLASH_ERR_UNSUPPORTED, "rope: head_dim %d is odd; RoPE needs an even head_dim", head_dim);
    if (head_dim < 2 || head_dim / 2 > DFLASH_ROPE_MAX_PAIRS)
        return dflash_fail(DFLASH_ERR_UNSUPPORTED, "rope: head_dim %d, expected 2..%d", head_dim,
                           2 * DFLASH_ROPE_MAX_PAIRS);
    if (!(p->theta > 0))
        return dflash_fail(DFLASH_ERR_FORMAT, "rope: rope_theta = %g, expected > 0", p->theta);
    if (p->kind != DFLASH_ROPE_DEFAULT && !(p->factor > 0))
        return dflash_fail(DFLASH_ERR_FORMAT, "rope %s: factor = %g, expected > 0", dflash_rope_kind_name(p->kind),
                           p->factor);
    if ((p->kind == DFLASH_ROPE_LLAMA3 || p->kind == DFLASH_ROPE_YARN) && !(p->original_max_pos > 0))
        return dflash_fail(DFLASH_ERR_FORMAT, "rope %s: original_max_position_embeddings = %g, expected > 0",
                           dflash_rope_kind_name(p->kind), p->original_max_pos);
    if (p->kind == DFLASH_ROPE_LLAMA3 && !(p->low_freq_factor > 0 && p->high_freq_factor > p->low_freq_factor))
        return dflash_fail(DFLASH_ERR_FORMAT,
                           "rope llama3: low_freq_factor = %g, high_freq_factor = %g, expected 0 < low < high",
                           p->low_freq_factor, p->high_freq_factor);
    if (p->kind == DFLASH_ROPE_YARN && (p->attention_factor < 0 || p->beta_fast < 0 || p->beta_slow < 0))
        return dflash_fail(DFLASH_ERR_FORMAT, "rope yarn: attention_factor %g, beta_fast %g, beta_slow %g: expected >= 0",
                           p->attention_factor, p->beta_fast, p->beta_slow);
    out->n_pairs = head_dim / 2;
    out->attn_factor = 1.0f;
    for (int j = 0; j < out->n_pairs; j++)
        out->inv_freq[j] = 1.0f / pos_freq(p->theta, j, head_dim);
    switch (p->kind) {
    case DFLASH_ROPE_DEFAULT: break;
    case DFLASH_ROPE_LINEAR:
        for (int j = 0; j < out->n_pairs; j++)
            out->inv_freq[j] /= (float)p->factor;
        break;
    case DFLASH_ROPE_LLAMA3: llama3(p, out); break;
    case DFLASH_ROPE_YARN: yarn(p, head_dim, out); break;
    }
    return DFLASH_OK;
}

dflash_status dflash_rope_default(double theta, int head_dim, dflash_rope *out)
{
    const dflash_rope_params p = { .kind = DFLASH_ROPE_DEFAULT, .theta = theta };
    return dflash_rope_init(&p, head_dim, out);
}
