/* proposer.h: the DraftProposer contract. The speculative loop knows nothing
 * about DFlash beyond this table: a proposer turns committed context into
 * draft tokens and is told what the target accepted. A vtable + self, like a
 * backend; per-sequence state is an opaque object the proposer allocates.
 *
 * Context arrives in two ways, both "committed rows": the prompt (begin, in
 * chunks as the target prefills it) and the accepted rows of each verify
 * (after_verify). Each row comes with its token, absolute position and, for
 * proposers that ask for target layers (tap_layers), its tap row: the
 * concatenated outputs of those target layers, in backend memory. Rows of
 * rejected drafts are never passed in. */
#ifndef DFLASH_DRAFT_PROPOSER_H
#define DFLASH_DRAFT_PROPOSER_H

#include <stdint.h>

#include "core/status.h"

typedef struct dflash_proposer dflash_proposer;

/* A run of committed rows for one sequence. */
typedef struct dflash_ctx_rows {
    const int32_t *tokens; /* host [n] */
    int n;
    int32_t pos0;          /* position of tokens[0] */
    const float *taps;     /* backend memory, row i at taps + i * taps_stride; NULL if no taps */
    int64_t taps_stride;
} dflash_ctx_rows;

typedef struct dflash_proposer_ops {
    const char *(*name)(const dflash_proposer *p);
    /* Largest block (last token + drafts) one propose handles. */
    int (*block_size)(const dflash_proposer *p);
    /* Target layers whose outputs the proposer needs; returns the count. */
    int (*tap_layers)(const dflash_proposer *p, const int **layers);
    /* State for one sequence of at most budget_tokens positions. */
    dflash_status (*alloc_state)(dflash_proposer *p, int budget_tokens, void **state);
    void (*free_state)(dflash_proposer *p, void *state);
    /* Forget everything and start a new sequence. */
    dflash_status (*reset)(dflash_proposer *p, void *state);
    /* Prompt context (called once per prefill chunk, in order). */
    dflash_status (*begin)(dflash_proposer *p, void *state, const dflash_ctx_rows *rows);
    /* Draft n_drafts tokens for each of n_seqs sequences whose last committed
     * (sampled, not yet verified) token is last_tokens[i] at positions[i].
     * drafts: host [n_seqs * n_drafts]. n_drafts <= block_size - 1. */
    dflash_status (*propose)(dflash_proposer *p, void **states, int n_seqs, const int32_t *last_tokens,
                             const int32_t *positions, int n_drafts, int32_t *drafts);
    /* Optional (NULL: drafts only come to the host): propose with the
     * drafts left in backend memory, *drafts = [n_seqs * n_drafts], valid
     * until the proposer's next call, so that a verify can read them
     * where they are and one download brings them over with the verify's
     * tokens. A draft there may be -1 (logits with no usable number):
     * the caller hands the downloaded drafts to check_drafts before using
     * them, and before reporting an error of a verify that read them. */
    dflash_status (*propose_dev)(dflash_proposer *p, void **states, int n_seqs, const int32_t *last_tokens,
                                 const int32_t *positions, int n_drafts, const int32_t **drafts);
    /* With propose_dev: DFLASH_OK, or the error a draft of -1 in these
     * host drafts (propose_dev's, same arguments) stands for. */
    dflash_status (*check_drafts)(const dflash_proposer *p, const int32_t *drafts, int n_seqs,
                                  const int32_t *positions, int n_drafts);
    /* Rows accepted by the verify: per sequence, the block's first token and
     * its accepted drafts (n_accepted[i] + 1 rows). */
    dflash_status (*after_verify)(dflash_proposer *p, void **states, int n_seqs, const dflash_ctx_rows *rows);
    void (*destroy)(dflash_proposer *p);
} dflash_proposer_ops;

struct dflash_proposer {
    const dflash_proposer_ops *ops;
    void *self;
};

static inline void dflash_proposer_destroy(dflash_proposer *p)
{
    if (p)
        p->ops->destroy(p);
}

#endif
