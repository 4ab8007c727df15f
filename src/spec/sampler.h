/* sampler.h: token sampling on host f32 logits rows, and the acceptance
 * rule of speculative sampling.
 *
 * Owns: the sampler options (temperature, top-k, top-p, min-p, repetition
 * penalty, seed), a seeded portable RNG (xoshiro256** seeded through
 * splitmix64: same seed, same stream on every machine), the function that
 * turns a logits row into the filtered, normalized distribution, inverse-CDF
 * sampling from it, and the general accept/resample step of speculative
 * sampling (min(1, p/q) acceptance, residual max(0, p - q) on rejection).
 *
 * Filters run in the order Hugging Face transformers applies them by default
 * (GenerationMixin._get_logits_processor: the repetition penalty processor
 * comes before the sampling warpers, which are appended as temperature,
 * top-k, top-p, min-p):
 *   1 repetition penalty  over tokens already in the sequence (prompt and
 *                         generated): logit > 0 divided by the penalty, else
 *                         multiplied (RepetitionPenaltyLogitsProcessor)
 *     frequency and       OpenAI's, over the tokens generated so far (not the
 *     presence penalties  prompt, as vLLM counts them): logit -= frequency x
 *                         the token's count, then -= presence if it occurs;
 *                         the penalties run in double, and a penalized logit
 *                         is rounded to f32 (a finite one past f32's range
 *                         to its largest; the device draws the same way)
 *   2 temperature         logits / T
 *   3 top-k               keep logits >= the k-th largest (ties kept)
 *   4 top-p               sort descending; drop a token when the probability
 *                         mass of it and every smaller token is <= 1 - top_p
 *                         (the most likely token always stays)
 *   5 min-p               drop tokens whose probability < min_p * the largest
 * then softmax over the survivors. Probabilities and sums are computed in
 * double, always in the same order, so a seed reproduces a run exactly.
 *
 * Temperature 0 means greedy. With no penalty the loop never comes here (it
 * takes the argmax path that downloads only ids); with one the
 * "distribution" is a point mass on the argmax of the penalized logits
 * (lowest index on ties, like the backend's argmax). */
#ifndef DFLASH_SPEC_SAMPLER_H
#define DFLASH_SPEC_SAMPLER_H

#include <stdint.h>

#include "core/status.h"

/* How a draft is accepted. Anything but EXACT breaks the guarantee that the
 * output follows the target's distribution: the other values exist only so
 * the statistical test can prove it detects a wrong rule (test-only). */
typedef enum dflash_accept_rule {
    DFLASH_ACCEPT_EXACT = 0,   /* accept with min(1, p/q): the correct rule */
    DFLASH_ACCEPT_TEST_SQRT,   /* test-only, wrong: accept with sqrt(p/q) */
    DFLASH_ACCEPT_TEST_ALWAYS, /* test-only, wrong: accept every draft */
} dflash_accept_rule;

typedef struct dflash_sampler_opts {
    double temperature; /* 0: greedy (default) */
    int top_k;          /* 0: off */
    double top_p;       /* 1: off; in (0, 1] */
    double min_p;       /* 0: off; in [0, 1] */
    double rep_penalty; /* 1: off; > 0 */
    double frequency_penalty; /* 0: off; in [-2, 2] */
    double presence_penalty;  /* 0: off; in [-2, 2] */
    uint64_t seed;
    dflash_accept_rule accept_rule; /* test-only hook; leave EXACT */
} dflash_sampler_opts;

/* Greedy: temperature 0, every filter off, seed 0. */
void dflash_sampler_default_opts(dflash_sampler_opts *o);
/* Values out of range are DFLASH_ERR_INVALID_ARG naming the option. */
dflash_status dflash_sampler_check_opts(const dflash_sampler_opts *o);
/* True when any penalty is on: a row then depends on the tokens before it
 * (the host sampler's seen and count; the loop's counts on the backend). */
int dflash_sampler_has_penalty(const dflash_sampler_opts *o);
/* True when decoding is plain argmax (temperature 0, no penalty): the loop
 * then needs no logits on the host. */
int dflash_sampler_is_greedy(const dflash_sampler_opts *o);

/* ---- RNG: xoshiro256**, state seeded by four splitmix64 outputs -------- */
typedef struct dflash_rng {
    uint64_t s[4];
} dflash_rng;

void dflash_rng_seed(dflash_rng *r, uint64_t seed);
uint64_t dflash_rng_next(dflash_rng *r);
/* Uniform in [0, 1): the top 53 bits times 2^-53, exact on every platform. */
double dflash_rng_uniform(dflash_rng *r);

/* ---- sampler ----------------------------------------------------------- */
typedef struct dflash_sampler {
    dflash_sampler_opts o;
    int vocab;
    dflash_rng rng;
    double *probs;  /* [V] the last distribution dflash_sampler_probs wrote (for callers) */
    double *x;      /* [V] processed logits */
    double *resid;  /* [V] residual distribution after a rejection; top-k's heap */
    int32_t *order; /* [V] top-p's partition of the survivors */
    int32_t *cand;  /* [V] the survivors of the filters so far, in index order */
    uint8_t *seen;  /* [V] 1: token occurs in the sequence (repetition penalty) */
    int32_t *count; /* [V] its occurrences among the generated tokens (frequency, presence) */
} dflash_sampler;

/* Check the options, size every buffer for `vocab` (nothing allocates
 * afterwards), seed the RNG. On failure nothing is left allocated. */
dflash_status dflash_sampler_init(dflash_sampler *s, int vocab, const dflash_sampler_opts *o);
void dflash_sampler_free(dflash_sampler *s);

/* Forget the sequence (every penalty's counts) and reseed the RNG. */
void dflash_sampler_reset(dflash_sampler *s, uint64_t seed);
/* Tokens that joined the sequence as its prompt (or an earlier turn's
 * history): the repetition penalty counts them, frequency and presence do
 * not. Ids outside the vocabulary are ignored. */
void dflash_sampler_observe(dflash_sampler *s, const int32_t *ids, int n);
/* Tokens generated (committed): every penalty counts them. */
void dflash_sampler_observe_output(dflash_sampler *s, const int32_t *ids, int n);

/* A logit under o's penalties (step 1 above), c its token's count: -1
 * not in the sequence, 0 in it but never generated, k > 0 generated k
 * times. In double; rounded to f32 where a penalty applied. */
double dflash_sampler_penalized(const dflash_sampler_opts *o, float logit, int32_t c);

/* The filtered distribution of one logits row [V]: probs[V] sums to 1 with
 * zeros for filtered tokens. NaN or +inf logits, or a row with no finite
 * logit, are DFLASH_ERR_INVALID_ARG. */
dflash_status dflash_sampler_probs(dflash_sampler *s, const float *logits, double *probs);

/* Inverse CDF: the first token whose running sum (index order, double)
 * exceeds u * total; only tokens with probs > 0 can come out. u in [0, 1). */
int32_t dflash_sample_cdf(const double *probs, int n, double u);
/* Draw one token from probs [V] with the sampler's RNG stream. */
int32_t dflash_sampler_sample(dflash_sampler *s, const double *probs);
/* The uniform of sequence position `pos`: element pos of a splitmix64
 * stream keyed by the seed, in [0, 1). Drawing every token with the
 * uniform of its position makes the output a function of the seed and the
 * distributions alone: plain and speculative decoding, with any number of
 * drafts per step, produce the same tokens. */
double dflash_sampler_uniform_at(const dflash_sampler *s, int64_t pos);
/* Draw the token at position pos from probs [V] (inverse CDF with the
 * position's uniform). */
int32_t dflash_sampler_sample_at(const dflash_sampler *s, const double *probs, int64_t pos);

/* One position of speculative sampling. p: the target's filtered
 * distribution for this position [V]; q: the proposer's distribution that
 * `draft` was drawn from, or NULL for a greedy proposer (a point mass on
 * draft). Accept with probability min(1, p(d)/q(d)) (o.accept_rule may
 * substitute a test-only wrong rule); returns 1 on acceptance. On rejection
 * returns 0 and *next is drawn from max(0, p - q) renormalized (for a point
 * mass: p with the draft removed). */
int dflash_sampler_accept(dflash_sampler *s, const double *p, const double *q, int32_t draft, int32_t *next);

#endif
