/* oracle_proposer.h: proposers that know the answer, for tests of the
 * speculative loop's acceptance (header-only).
 *
 * The oracle drafts the target's own continuation, read from a sequence the
 * test computed first by a plain run with the same options: a right loop
 * accepts every draft (a == k at every step). Its mirror drafts, at every
 * position, a token the target does not pick there ((right + 1) % V): a
 * right loop accepts none. A partial oracle is right for the first few
 * drafts of each block only. Both go through the DraftProposer contract like
 * any other proposer, so they also check that contract's bookkeeping
 * (positions, budgets, what after_verify is told).
 *
 * The successor proposer knows nothing of the target: after token t it
 * drafts t+1, t+2, ... (mod V). On a model built to favour t+1 after t
 * its drafts are accepted often but not always, whatever was sampled
 * before, which is what a statistical test of speculative sampling needs. */
#ifndef DFLASH_TESTS_ORACLE_PROPOSER_H
#define DFLASH_TESTS_ORACLE_PROPOSER_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "draft/proposer.h"
#include "spec/spec.h"

typedef struct oracle {
    const int32_t *seq; /* the whole expected sequence: prompt then the plain output;
                           NULL for the successor proposer */
    int n;              /* its length */
    int vocab, block, mirror;
    int right;          /* >= 0: only the first `right` drafts of a block are right (a partial oracle) */
    dflash_proposer proposer;
} oracle;

/* Per-sequence state: how many positions the loop has committed. */
typedef struct oracle_state {
    int32_t len;
} oracle_state;

static inline const char *oracle_name(const dflash_proposer *p)
{
    const oracle *o = p->self;
    return !o->seq ? "successor" : o->mirror ? "anti-oracle" : "oracle";
}

static inline int oracle_block_size(const dflash_proposer *p) { return ((const oracle *)p->self)->block; }

static inline int oracle_tap_layers(const dflash_proposer *p, const int **layers)
{
    (void)p;
    *layers = NULL;
    return 0;
}

static inline dflash_status oracle_alloc_state(dflash_proposer *p, int budget, void **state)
{
    (void)p;
    (void)budget;
    oracle_state *s = calloc(1, sizeof *s);
    *state = s;
    return s ? DFLASH_OK : dflash_fail(DFLASH_ERR_OOM, "oracle: out of memory");
}

static inline void oracle_free_state(dflash_proposer *p, void *state)
{
    (void)p;
    free(state);
}

static inline dflash_status oracle_reset(dflash_proposer *p, void *state)
{
    (void)p;
    ((oracle_state *)state)->len = 0;
    return DFLASH_OK;
}

/* Committed rows must arrive in order and match the expected sequence:
 * anything else is a bug in the loop. */
static inline dflash_status oracle_observe(oracle *o, oracle_state *s, const dflash_ctx_rows *rows)
{
    if (rows->pos0 != s->len)
        return dflash_fail(DFLASH_ERR_INVALID_ARG, "oracle: rows start at %d, %d committed", rows->pos0, s->len);
    for (int i = 0; o->seq && i < rows->n; i++)
        if (rows->pos0 + i >= o->n || rows->tokens[i] != o->seq[rows->pos0 + i])
            return dflash_fail(DFLASH_ERR_INVALID_ARG, "oracle: committed token %d at position %d is not the "
                               "expected one", rows->tokens[i], rows->pos0 + i);
    s->len += rows->n;
    return DFLASH_OK;
}

static inline dflash_status oracle_begin(dflash_proposer *p, void *state, const dflash_ctx_rows *rows)
{
    return oracle_observe(p->self, state, rows);
}

static inline dflash_status oracle_propose(dflash_proposer *p, void **states, int n_seqs, const int32_t *last,
                                           const int32_t *positions, int n_drafts, int32_t *drafts)
{
    oracle *o = p->self;
    for (int q = 0; q < n_seqs; q++) {
        const oracle_state *s = states[q];
        if (!o->seq) {
            if (positions[q] != s->len)
                return dflash_fail(DFLASH_ERR_INVALID_ARG, "successor: propose at %d, %d committed", positions[q],
                                   s->len);
            for (int i = 0; i < n_drafts; i++)
                drafts[q * n_drafts + i] = (last[q] + 1 + i) % o->vocab;
            continue;
        }
        if (positions[q] != s->len || positions[q] >= o->n || last[q] != o->seq[positions[q]])
            return dflash_fail(DFLASH_ERR_INVALID_ARG, "oracle: propose at %d after token %d (%d committed)",
                               positions[q], last[q], s->len);
        for (int i = 0; i < n_drafts; i++) {
            const int at = positions[q] + 1 + i;
            const int32_t right = at < o->n ? o->seq[at] : 0;
            const int wrong = o->mirror || (o->right >= 0 && i >= o->right);
            drafts[q * n_drafts + i] = wrong ? (right + 1) % o->vocab : right;
        }
    }
    return DFLASH_OK;
}

static inline dflash_status oracle_after_verify(dflash_proposer *p, void **states, int n_seqs,
                                                const dflash_ctx_rows *rows)
{
    for (int q = 0; q < n_seqs; q++)
        DFLASH_TRY(oracle_observe(p->self, states[q], &rows[q]));
    return DFLASH_OK;
}

static inline void oracle_destroy(dflash_proposer *p) { (void)p; }

static const dflash_proposer_ops k_oracle_ops = {
    .name = oracle_name,
    .block_size = oracle_block_size,
    .tap_layers = oracle_tap_layers,
    .alloc_state = oracle_alloc_state,
    .free_state = oracle_free_state,
    .reset = oracle_reset,
    .begin = oracle_begin,
    .propose = oracle_propose,
    .after_verify = oracle_after_verify,
    .destroy = oracle_destroy,
};

/* An oracle (mirror 0) or its mirror (1) over seq[0..n) (not copied). */
static inline void oracle_init(oracle *o, const int32_t *seq, int n, int vocab, int block, int mirror)
{
    *o = (oracle){ seq, n, vocab, block, mirror, -1, { &k_oracle_ops, o } };
}

/* An oracle whose drafts are right for the first `right` of each block
 * and wrong after: every step keeps `right` drafts and takes back the
 * rest of its verify. */
static inline void oracle_init_partial(oracle *o, const int32_t *seq, int n, int vocab, int block, int right)
{
    *o = (oracle){ seq, n, vocab, block, 0, right, { &k_oracle_ops, o } };
}

/* The successor proposer (drafts last+1, last+2, ... mod vocab). */
static inline void successor_init(oracle *o, int vocab, int block)
{
    *o = (oracle){ NULL, 0, vocab, block, 0, -1, { &k_oracle_ops, o } };
}

/* One greedy generation of n_new tokens after prompt[0..n_prompt) with
 * proposer p (NULL: plain), block size `block` and repetition penalty
 * `penalty` (1: none); *n_out tokens into out. */
/* Generate on a fresh sequence (and proposer state) with options go. */
static inline dflash_status generate_fresh(dflash_qwen3 *t, dflash_proposer *p, const int32_t *prompt, int n_prompt,
                                           const dflash_gen_opts *go, int32_t *out, int *n_out, dflash_gen_stats *st)
{
    dflash_kv_seq seq;
    void *state = NULL;
    *n_out = 0;
    DFLASH_TRY(dflash_qwen3_seq_init(t, &seq));
    dflash_status s = p ? p->ops->alloc_state(p, n_prompt + go->n_new + DFLASH_MAX_BLOCK, &state) : DFLASH_OK;
    if (s == DFLASH_OK)
        s = dflash_spec_generate(t, &seq, p, state, prompt, n_prompt, go, out, n_out, st);
    if (p && state)
        p->ops->free_state(p, state);
    dflash_qwen3_seq_free(t, &seq);
    return s;
}

/* Greedy, with the penalties of pen (NULL: none). */
static inline dflash_status oracle_generate_pen(dflash_qwen3 *t, dflash_proposer *p, const int32_t *prompt,
                                                int n_prompt, int n_new, int block, const dflash_sampler_opts *pen,
                                                int32_t *out, int *n_out, dflash_gen_stats *st)
{
    dflash_gen_opts go;
    dflash_gen_default_opts(&go);
    go.n_new = n_new;
    go.block_size = block;
    if (pen) {
        go.sampler.rep_penalty = pen->rep_penalty;
        go.sampler.frequency_penalty = pen->frequency_penalty;
        go.sampler.presence_penalty = pen->presence_penalty;
    }
    return generate_fresh(t, p, prompt, n_prompt, &go, out, n_out, st);
}

static inline dflash_status oracle_generate(dflash_qwen3 *t, dflash_proposer *p, const int32_t *prompt, int n_prompt,
                                            int n_new, int block, double penalty, int32_t *out, int *n_out,
                                            dflash_gen_stats *st)
{
    dflash_sampler_opts pen;
    dflash_sampler_default_opts(&pen);
    pen.rep_penalty = penalty;
    return oracle_generate_pen(t, p, prompt, n_prompt, n_new, block, &pen, out, n_out, st);
}

/* With expect[0..n_prompt + n_new) the prompt and the plain output, the
 * oracle (mirror 0) must see every draft accepted and commit a whole block
 * per step; its mirror (1) none, one token per step; both must give the
 * plain output. 1 if so; else 0 with the reason in msg. */
static inline int oracle_check(dflash_qwen3 *t, const int32_t *expect, int n_prompt, int n_new, int block,
                               const dflash_sampler_opts *pen, int mirror, char *msg, size_t cap)
{
    oracle o;
    oracle_init(&o, expect, n_prompt + n_new, t->cfg.vocab_size, block, mirror);
    int32_t *out = malloc((size_t)n_new * sizeof *out);
    int n = 0;
    dflash_gen_stats st;
    memset(&st, 0, sizeof st);
    dflash_status s = out ? oracle_generate_pen(t, &o.proposer, expect, n_prompt, n_new, block, pen, out, &n, &st)
                          : DFLASH_ERR_OOM;
    int64_t tried = 0, accepted = 0;
    for (int i = 0; i < block - 1; i++) {
        tried += st.pos_tried[i];
        accepted += st.pos_accepted[i];
    }
    const int steps = mirror ? n_new - 1 : (n_new - 1 + block - 1) / block;
    const char *name = o.proposer.ops->name(&o.proposer);
    int ok = 0;
    if (s != DFLASH_OK)
        snprintf(msg, cap, "%s block %d: %s", name, block, dflash_last_error());
    else if (n != n_new || memcmp(out, expect + n_prompt, (size_t)n_new * sizeof *out) != 0)
        snprintf(msg, cap, "%s block %d: output differs from plain", name, block);
    else if (tried == 0 || accepted != (mirror ? 0 : tried))
        snprintf(msg, cap, "%s block %d: %lld of %lld drafts accepted", name, block, (long long)accepted,
                 (long long)tried);
    else if (st.n_steps != steps)
        snprintf(msg, cap, "%s block %d: %d steps, want %d", name, block, st.n_steps, steps);
    else
        ok = 1;
    free(out);
    return ok;
}

#endif
