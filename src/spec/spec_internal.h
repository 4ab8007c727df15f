/* spec_internal.h: what the one-sequence loop (spec.c) and the
 * many-sequence loop (spec_many.c) share: the prefill, the acceptance rule
 * for sampling, stop tokens, the checks on the target's numbers. Not part of
 * the library's surface. */
#ifndef DFLASH_SPEC_SPEC_INTERNAL_H
#define DFLASH_SPEC_SPEC_INTERNAL_H

#include "spec/spec.h"

/* Sampling state sized before the loop: the sampler and room for the
 * logits rows of one verify. NULL members on the greedy path.
 *
 * Two ways to a sampled token. `ids` (the exact rule; no penalty, or a
 * backend that keeps the penalties' counts, count_tokens): each verified
 * row's token is drawn where the logits are (dflash_spec_sample_rows: the
 * backend's sample_rows, or the host sampler on rows it downloads) and
 * only ids come back; a draft is accepted iff it equals its row's token,
 * as on the greedy path. Under penalties row i is drawn as if the drafts
 * before it were accepted (they count as generated): it is used only if
 * they were. Otherwise the logits rows come to the host and
 * dflash_spec_accept_sampled draws row by row (a penalty sees each
 * accepted draft before the next row). Both draw a position's token with
 * that position's uniform: the same tokens up to rounding. */
typedef struct spec_sampling {
    dflash_sampler smp;
    float *logits;   /* host [B, V]; with ids [1, V], the composition's row */
    int ids;
    int32_t *counts; /* with ids and a penalty: the sequence's token counts, backend [V] (count_tokens) */
    int32_t *host_counts; /* their host copy [V] where the backend has no sample_rows */
    dflash_backend *be;
} spec_sampling;

double dflash_spec_now_ms(void);
int dflash_spec_is_stop(const dflash_gen_opts *o, int32_t t);
/* Greedy ids of -1 (logits with no usable number) become an error naming
 * the model, the position of the first row and the step (0 = prefill). */
dflash_status dflash_spec_check_greedy(const dflash_qwen3 *t, const int32_t *ids, int n, int32_t pos, int step);
/* The sampler's probabilities of one logits row (errors name model, position, step). */
dflash_status dflash_spec_sampled_probs(dflash_sampler *smp, const dflash_qwen3 *t, const float *logits,
                                       double *probs, int32_t pos, int step);
/* 4 ACCEPT, sampled, over the k drafts block[1..k] with the verify's
 * logits rows ss->logits [k+1, V]: the accepted count and the bonus. */
dflash_status dflash_spec_accept_sampled(spec_sampling *ss, const dflash_qwen3 *t, int32_t s, int step,
                                        const int32_t *block, int k, int V, int *a_out, int32_t *bonus);
/* A row's arguments for dflash_spec_sample_rows: ss's options, the
 * position the row predicts and, under penalties, ss's counts and
 * gen[0..n_gen) (backend memory: the verify forward's row tokens,
 * dflash_qwen3's s.in.ids): the tokens before the row that count as
 * generated without being in the counts yet (the drafts before it). */
dflash_sample_row dflash_spec_sample_row(const spec_sampling *ss, int64_t pos, const int32_t *gen, int n_gen);
/* The same from options alone, penalties off. */
dflash_sample_row dflash_spec_sample_row_opts(const dflash_sampler_opts *o, int64_t pos);
/* The row [V] (host memory) under r's penalties, as sample_rows applies
 * them, from host copies of r->counts (counts [V]) and of r->gen (gen
 * [r->n_gen], added to the counts as generated). */
void dflash_spec_penalize_row(float *row, int V, const int32_t *counts, const dflash_sample_row *r,
                              const int32_t *gen);
/* Tokens generated (committed) join ss's counts on the backend (no-op
 * without them); _step: a step's, the accepted drafts block[1..a] and
 * the bonus. */
dflash_status dflash_spec_count_generated(spec_sampling *ss, const int32_t *ids, int n);
dflash_status dflash_spec_count_step(spec_sampling *ss, const int32_t *block, int a, int32_t bonus);
/* The token the host sampler draws from one logits row by r (s: a sampler
 * of the row's vocabulary; its options are left as they were), or -1 when
 * the row has no usable number. */
int32_t dflash_spec_draw_row(dflash_sampler *s, const float *logits, const dflash_sample_row *r);
/* ids[i] (backend memory) = the token of logits row i [n, V] drawn by
 * rows[i]: the backend's sample_rows, or rows downloaded one at a time
 * into host_row [V] and drawn by dflash_spec_draw_row with `scratch`, a
 * penalized row after dflash_spec_penalize_row with its counts brought
 * into host_counts [V] (NULL where no row has penalties). */
dflash_status dflash_spec_sample_rows(dflash_backend *be, const float *logits, int n, int V,
                                      const dflash_sample_row *rows, int32_t *ids, dflash_sampler *scratch,
                                      float *host_row, int32_t *host_counts);
/* Whether a step's drafts may stay in backend memory (the proposer's
 * propose_dev) for the verify to read where they are: the step's tokens
 * come back as ids (greedy, or drawn where the logits are, ss->ids), so
 * one download brings the tokens and the drafts together (one wait for
 * the device a step; penalized rows read the drafts before them there
 * too). Not with DFLASH_HOST_DRAFTS=1. */
int dflash_spec_dev_drafts(const dflash_proposer *p, const spec_sampling *ss);
/* 2 PROPOSE for n sequences drafting k each: with `dev` (a caller that
 * passed dflash_spec_dev_drafts) the drafts stay in backend memory, *dev
 * points at them and drafts [n * k] holds 0, a token of the vocabulary
 * until they come; else they come into drafts and *dev is NULL. */
dflash_status dflash_spec_propose(dflash_proposer *p, void **states, int n, const int32_t *last,
                                  const int32_t *positions, int k, int dev, int32_t *drafts,
                                  const int32_t **dev_drafts);
/* The verify's n tokens (t->s.best) into ids and, when dev_drafts is set
 * (propose_dev's, nd of them), the drafts into drafts: one download. */
dflash_status dflash_spec_fetch(dflash_qwen3 *t, int n, const int32_t *dev_drafts, int nd, int32_t *ids,
                                int32_t *drafts);
/* The status of a step whose verify read propose_dev's drafts (vs: the
 * verify's and its fetch's; on DFLASH_OK the drafts are on the host): a
 * bad draft is reported first, as the proposer's error, since a verify's
 * own (a token outside the vocabulary) would be its consequence. After a
 * failed verify the drafts come over here (a failing step's extra wait). */
dflash_status dflash_spec_dev_status(dflash_backend *be, const dflash_proposer *p, dflash_status vs,
                                     const int32_t *dev_drafts, int32_t *drafts, int n_seqs,
                                     const int32_t *positions, int k);
/* A step whose verify reads propose_dev's drafts waits for the device
 * once, after both: the host's clock no longer tells the two apart, and
 * the cost-aware width needs each. dflash_spec_mark(slot 0 before the
 * verify's forward, 1 before its fetch) records the device's marks where
 * the backend has them (dev_drafts set); dflash_spec_split_ms then moves
 * what the verify did not take from *verify_ms (host time since the
 * propose returned) to *propose_ms. Unchanged without marks (ops that run
 * as they are called: the host's times are the device's). */
dflash_status dflash_spec_mark(dflash_backend *be, const int32_t *dev_drafts, int slot);
void dflash_spec_split_ms(dflash_backend *be, const int32_t *dev_drafts, double *verify_ms, double *propose_ms);
/* The block a loop runs: the proposer's (1 without one), capped by
 * block_size > 0; beyond DFLASH_MAX_BLOCK or the target's rows is an
 * error naming `who`. */
dflash_status dflash_spec_block(const dflash_qwen3 *t, const dflash_proposer *p, int block_size, const char *who,
                                int *B);
/* A sequence may start: a prompt, a valid history and sampler, room in the
 * context for cached + prompt + n_new + B rows (errors name `who`). */
dflash_status dflash_spec_check_start(const dflash_qwen3 *t, const dflash_kv_seq *seq, int n_prompt,
                                      const dflash_gen_opts *o, int B, const char *who);
/* Sampling state for verifies of up to B rows (the sampler, host logits);
 * freed by dflash_spec_sampling_free. */
dflash_status dflash_spec_sampling_init(spec_sampling *ss, const dflash_qwen3 *t, const dflash_sampler_opts *so,
                                        int B, const char *who);
void dflash_spec_sampling_free(spec_sampling *ss);
/* 5 COMMIT of one step: d_1..d_a then the bonus into emit[], cut by a stop
 * token or a stop string (*stopped) or the budget (out[0..n_out) already
 * out). Returns the count. */
int dflash_spec_commit(const dflash_gen_opts *o, const int32_t *out, int n_out, const int32_t *block, int a,
                       int32_t bonus, int32_t *emit, int *stopped);
/* Does the first token after the prompt, `first`, end generation (a stop
 * token, or a stop string it completes after out[0..n_out))? */
int dflash_spec_first_stops(const dflash_gen_opts *o, const int32_t *out, int n_out, int32_t first);
/* n_generated, tau and tokens/s from the step counts and the times. */
void dflash_spec_final_stats(dflash_gen_stats *st, int n_out);
/* 1 PREFILL of a prompt, whole (dflash_spec_prefill: chunks of the
 * target's max_rows, then the first token into *first) or in pieces a
 * caller spreads over its steps: begin (the sampler sees the history and
 * the prompt), chunk (rows through the target and the proposer; the last
 * one's final row gives *cur its logits or argmax; a failed chunk leaves
 * both caches where it began), finish (the first token after the prompt
 * into *cur, when the budget wants one). */
dflash_status dflash_spec_prefill(dflash_qwen3 *target, dflash_kv_seq *seq, dflash_proposer *p, void *pstate,
                                  const int32_t *prompt, int n_prompt, const dflash_gen_opts *o, spec_sampling *ss,
                                  int32_t *first);
dflash_status dflash_spec_prefill_begin(const dflash_gen_opts *o, spec_sampling *ss, const int32_t *prompt,
                                        int n_prompt);
dflash_status dflash_spec_prefill_chunk(dflash_qwen3 *target, dflash_kv_seq *seq, dflash_proposer *p, void *pstate,
                                        const int32_t *rows, int n, int last, spec_sampling *ss, int32_t *cur);
dflash_status dflash_spec_prefill_finish(dflash_qwen3 *target, const dflash_kv_seq *seq, const dflash_gen_opts *o,
                                         spec_sampling *ss, int32_t *cur);

#endif
