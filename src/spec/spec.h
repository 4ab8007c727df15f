/* spec.h: the speculative decoding loop (and plain decoding, which is the
 * same loop with no drafts): prefill with taps, propose, verify, accept,
 * roll the target back, tell the proposer what was accepted. */
#ifndef DFLASH_SPEC_SPEC_H
#define DFLASH_SPEC_SPEC_H

#include <stdint.h>

#include "draft/proposer.h"
#include "spec/sampler.h"
#include "spec/width.h"
#include "target/qwen3.h"

#define DFLASH_MAX_BLOCK 64

typedef struct dflash_gen_opts {
    int n_new;               /* tokens to generate at most */
    int block_size;          /* 0: the proposer's; capped by it */
    /* 1: each step drafts the number of tokens (0..block_size - 1) with
     * the most expected tokens per second (width.h); 0: always
     * block_size - 1. Output is the same either way. */
    int width_auto;
    const int32_t *stop_ids; /* generation ends after emitting one of these */
    int n_stop;
    /* Stop strings (the engine's): given the committed output
     * out[0..n_out) and the tokens cand[0..n) about to follow it, the
     * 1-based index of the first candidate whose text completes a stop
     * string, else 0; generation ends after that token, and the caches
     * hold nothing past it. NULL: none. */
    int (*stop_text)(void *user, const int32_t *out, int n_out, const int32_t *cand, int n);
    void *stop_user;
    /* Called after each speculative step: pos, the position of the step's
     * first row (the token before the drafts); the k drafts proposed; how
     * many the target accepted; the token it chose after them (the bonus).
     * NULL: none. */
    void (*on_step)(void *user, int32_t pos, const int32_t *drafts, int k, int accepted, int32_t next);
    void *step_user;
    /* Called with the tokens committed by each step, in order (streaming).
     * A status other than DFLASH_OK ends generation with that status (the
     * tokens so far stay in `out`): a consumer that cannot take more, such
     * as a failed write, stops the work at once. */
    dflash_status (*on_tokens)(void *user, const int32_t *ids, int n);
    void *user;
    /* Token choice; the default (temperature 0, no penalty) is greedy and
     * keeps the argmax path. Otherwise drafts are accepted by speculative
     * sampling (sampler.h): each verified row's token drawn where the
     * logits are (under penalties too, from counts the backend keeps), or
     * row by row on the host (DFLASH_HOST_SAMPLING=1, or a backend without
     * count_tokens). */
    dflash_sampler_opts sampler;
    /* Ids the sequence held before `prompt` (a chat's earlier turns and
     * answers), for the repetition penalty: sampling then penalizes what
     * plain decoding of the whole conversation would. It counts a token
     * once whatever its number, so the history may overlap the prompt.
     * Read only when sampling; NULL / 0: none. */
    const int32_t *history;
    int n_history;
} dflash_gen_opts;

void dflash_gen_default_opts(dflash_gen_opts *o);

typedef struct dflash_gen_stats {
    int n_prompt, n_generated, n_steps;
    int stopped;                               /* a stop token ended it */
    double mean_accept;                        /* tau: tokens committed per verify step */
    int64_t accept_hist[DFLASH_MAX_BLOCK + 1]; /* [k]: steps that committed k tokens */
    int64_t pos_tried[DFLASH_MAX_BLOCK];       /* [i]: steps that drafted position i + 1 */
    int64_t pos_accepted[DFLASH_MAX_BLOCK];    /* [i]: ... and accepted it */
    int64_t width_hist[DFLASH_MAX_BLOCK];      /* [k]: steps that drafted k tokens */
    double prefill_ms, draft_ms, verify_ms, total_ms;
    double observe_ms;                         /* the proposer taking in accepted rows (after_verify) */
    double tokens_per_s;                       /* generated tokens / (total - prefill) */
} dflash_gen_stats;

/* Generate up to o->n_new tokens after `prompt` into out[] (caller-sized
 * n_new); *n_out tokens were written. `seq` is a target sequence and
 * `pstate` a state of `p` that has seen exactly the same committed rows:
 * both empty for a new sequence, or left by an earlier call to continue it
 * (then `prompt` must start with that call's last output token, which was
 * emitted but not yet run through the target). p == NULL decodes plainly.
 * On an error return, too, both hold the same rows and *n_out counts the
 * tokens they hold plus the unverified last one; when the error came from
 * the proposer taking in rows it had been sent late (steps that drafted
 * nothing), on_tokens may already have streamed a few tokens past *n_out.
 * Greedy: the output equals plain greedy decoding exactly.
 * Sampled: every token follows the target's filtered distribution, with or
 * without a proposer; a seed reproduces the output exactly. */
dflash_status dflash_spec_generate(dflash_qwen3 *target, dflash_kv_seq *seq, dflash_proposer *p, void *pstate,
                                   const int32_t *prompt, int n_prompt, const dflash_gen_opts *o, int32_t *out,
                                   int *n_out, dflash_gen_stats *stats);

/* One sequence of dflash_spec_generate_many. */
typedef struct dflash_spec_item {
    dflash_kv_seq *seq;     /* as for dflash_spec_generate: empty, or continued */
    void *pstate;           /* its state of the call's proposer (unused without one) */
    const int32_t *prompt;
    int n_prompt;
    /* n_new, stop ids and strings, sampler, history, on_tokens / user,
     * on_step / step_user; block_size and width_auto are not read (the
     * call's block size applies, at the batch's width: the full block, or
     * its cost-aware width). Here on_tokens returning other than DFLASH_OK
     * ends this sequence (done, stats.stopped) and the others go on. */
    dflash_gen_opts opts;
    int32_t *out;           /* [opts.n_new] */
    int n_out;              /* written: tokens generated */
    dflash_gen_stats stats; /* written; draft and verify times are the shared steps' */
    /* written: why the sequence left before its end (its prefill failed
     * in a step), DFLASH_OK otherwise, and the message */
    dflash_status status;
    char error[256];
} dflash_spec_item;

/* Many sequences stepped together, joining and leaving between steps
 * (what dflash_spec_generate_many runs, for callers that add sequences as
 * they come). Created with room for max_seqs sequences, at most the
 * target's max_seqs and the proposer's. */
typedef struct dflash_spec_batch dflash_spec_batch;
dflash_status dflash_spec_batch_new(dflash_qwen3 *target, dflash_proposer *p, int block_size, int max_seqs,
                                    dflash_spec_batch **out);
/* `it` joins: its prompt runs through the target in the following steps,
 * at most the target's max_rows rows per step over all joining sequences
 * (oldest first), so a long prompt does not stall the others; the step
 * that runs its last rows emits its first token, and later steps
 * generate. It must stay valid until it leaves: when it is done (budget,
 * stop token: its stats are then final), removed, or its prefill failed
 * (it->status). A sequence done by its first token leaves at once. */
dflash_status dflash_spec_batch_add(dflash_spec_batch *b, dflash_spec_item *it);
/* What dflash_spec_batch_add checks before it prefills (the context limit
 * among them), without adding. */
dflash_status dflash_spec_batch_check(const dflash_spec_batch *b, const dflash_spec_item *it);
/* The batch's block size (last token + drafts): a step writes K/V up to
 * this many positions past a sequence's committed tokens. */
int dflash_spec_batch_block(const dflash_spec_batch *b);
/* on: every step drafts the batch's cost-aware width (width.h: the most
 * expected tokens per second per sequence at this batch size, learned as
 * the steps run; a sequence near its budget drafts fewer), else the full
 * block. The output is the same either way. Starts a new width model. */
void dflash_spec_batch_set_width_auto(dflash_spec_batch *b, int on);
/* Tests: step i drafts widths[i % n] (capped by the block and each
 * sequence's budget) instead of either; n = 0 undoes it. The array must
 * outlive the batch's steps. */
void dflash_spec_batch_set_widths(dflash_spec_batch *b, const int *widths, int n);
/* One step: prompt rows of joining sequences, then one speculative step
 * of every generating one; *n_active: how many still take part. A failed
 * prefill ends that sequence alone (it->status); any other error makes
 * every sequence leave, and their caches may then disagree (the target's
 * may hold rows of the failed step, the proposer's may lack rows of
 * earlier steps that drafted nothing): such a sequence can be freed or
 * run again from its history, not continued. */
dflash_status dflash_spec_batch_step(dflash_spec_batch *b, int *n_active);
/* 1 while `it` takes part (added, not yet done or removed). */
int dflash_spec_batch_has(const dflash_spec_batch *b, const dflash_spec_item *it);
/* `it` leaves before it is done (a cancelled request); its cache and
 * proposer state hold the rows so far, consistent, for the caller to free
 * or continue. Committed rows the proposer had not taken yet (steps that
 * drafted nothing) go over first; if that fails (the status returned),
 * the target's cache and it->n_out go back to where the proposer's rows
 * end. */
dflash_status dflash_spec_batch_remove(dflash_spec_batch *b, const dflash_spec_item *it);
/* `it` leaves as it is, rows waiting for the proposer dropped: for a
 * caller that frees its caches next. */
void dflash_spec_batch_drop(dflash_spec_batch *b, const dflash_spec_item *it);
void dflash_spec_batch_free(dflash_spec_batch *b);

/* Generate for n sequences together: their prompts run in the first
 * steps (a forward's rows per step, oldest first; a sequence generates
 * once its prompt has run), and every step
 * runs one propose per distinct draft count and one target verify over
 * the rows of all sequences still generating (in groups within the
 * target's max_rows and max_seqs; greedy and sampling sequences in
 * separate groups), and each sequence accepts, stops and streams on its
 * own. Every step drafts min(width, tokens left), width = block - 1, or
 * with width_auto the batch's cost-aware width (dflash_spec_batch_set_width_auto).
 * block_size: 0 = the proposer's (capped by it); p == NULL decodes plainly. The proposer must
 * take as many sequences per call as the target's max_seqs.
 * Each sequence's output equals what dflash_spec_generate gives it alone
 * (greedy, and sampling with its seed): the target's and the drafter's
 * forwards compute every row independently of the others in the batch.
 * On an error the sequences may hold rows of the failed step: free them. */
dflash_status dflash_spec_generate_many(dflash_qwen3 *target, dflash_proposer *p, dflash_spec_item *items, int n,
                                        int block_size, int width_auto);

#endif
