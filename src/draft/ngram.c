/* ngram.c: see ngram.h. State = the committed token history (sized by the
 * budget at alloc_state, so nothing allocates while decoding). */
#include "draft/ngram.h"

#include <stdlib.h>
#include <string.h>

typedef struct ngram {
    dflash_proposer p;
    int block_size, min_n, max_n;
} ngram;

typedef struct ngram_state {
    int32_t *hist; /* [cap]: committed tokens, then room for the last token */
    int len, cap;
} ngram_state;

static const char *ng_name(const dflash_proposer *p)
{
    (void)p;
    return "ngram";
}

static int ng_block_size(const dflash_proposer *p) { return ((const ngram *)p->self)->block_size; }

static int ng_tap_layers(const dflash_proposer *p, const int **layers)
{
    (void)p;
    *layers = NULL;
    return 0;
}

static dflash_status ng_alloc_state(dflash_proposer *p, int budget, void **state)
{
    (void)p;
    ngram_state *st = calloc(1, sizeof *st);
    if (st)
        st->hist = malloc(((size_t)budget + 1) * sizeof(int32_t));
    if (!st || !st->hist) {
        if (st)
            free(st);
        return dflash_fail(DFLASH_ERR_OOM, "ngram: out of memory for a budget of %d tokens", budget);
    }
    st->cap = budget + 1;
    *state = st;
    return DFLASH_OK;
}

static void ng_free_state(dflash_proposer *p, void *state)
{
    (void)p;
    ngram_state *st = state;
    if (st)
        free(st->hist);
    free(st);
}

static dflash_status ng_reset(dflash_proposer *p, void *state)
{
    (void)p;
    ((ngram_state *)state)->len = 0;
    return DFLASH_OK;
}

static dflash_status append(ngram_state *st, const dflash_ctx_rows *r)
{
    if (r->pos0 != st->len)
        return dflash_fail(DFLASH_ERR_INVALID_ARG, "ngram: rows start at position %d, expected %d", r->pos0, st->len);
    if (st->len + r->n >= st->cap)
        return dflash_fail(DFLASH_ERR_INVALID_ARG, "ngram: %d tokens exceed the budget of %d", st->len + r->n,
                           st->cap - 1);
    memcpy(st->hist + st->len, r->tokens, (size_t)r->n * sizeof(int32_t));
    st->len += r->n;
    return DFLASH_OK;
}

static dflash_status ng_begin(dflash_proposer *p, void *state, const dflash_ctx_rows *rows)
{
    (void)p;
    return append(state, rows);
}

static dflash_status ng_after_verify(dflash_proposer *p, void **states, int n_seqs, const dflash_ctx_rows *rows)
{
    (void)p;
    for (int q = 0; q < n_seqs; q++)
        DFLASH_TRY(append(states[q], &rows[q]));
    return DFLASH_OK;
}

/* Drafts for one sequence: find the latest earlier match of the last n
 * tokens (longest n first) and copy what followed; pad by repeating. */
static void ng_one(const ngram *g, ngram_state *st, int32_t last, int n_drafts, int32_t *out)
{
    int32_t *h = st->hist;
    int len = st->len + 1;
    h[st->len] = last; /* the slot past the history is scratch */
    int found = -1;
    for (int n = g->max_n; n >= g->min_n && found < 0; n--) {
        if (n >= len)
            continue;
        for (int start = len - n - 1; start >= 0; start--)
            if (memcmp(h + start, h + len - n, (size_t)n * sizeof(int32_t)) == 0) {
                found = start + n;
                break;
            }
    }
    int32_t fill = last;
    for (int i = 0; i < n_drafts; i++) {
        if (found >= 0 && found + i < len)
            fill = h[found + i];
        out[i] = fill;
    }
}

static dflash_status ng_propose(dflash_proposer *p, void **states, int n_seqs, const int32_t *last_tokens,
                                const int32_t *positions, int n_drafts, int32_t *drafts)
{
    const ngram *g = p->self;
    for (int q = 0; q < n_seqs; q++) {
        ngram_state *st = states[q];
        if (positions[q] != st->len)
            return dflash_fail(DFLASH_ERR_INVALID_ARG, "ngram: propose at position %d, history has %d", positions[q],
                               st->len);
        ng_one(g, st, last_tokens[q], n_drafts, drafts + (size_t)q * n_drafts);
    }
    return DFLASH_OK;
}

static void ng_destroy(dflash_proposer *p) { free(p->self); }

static const dflash_proposer_ops k_ngram_ops = {
    .name = ng_name,
    .block_size = ng_block_size,
    .tap_layers = ng_tap_layers,
    .alloc_state = ng_alloc_state,
    .free_state = ng_free_state,
    .reset = ng_reset,
    .begin = ng_begin,
    .propose = ng_propose,
    .after_verify = ng_after_verify,
    .destroy = ng_destroy,
};

dflash_status dflash_ngram_create(int block_size, int min_n, int max_n, dflash_proposer **out)
{
    if (block_size < 2 || min_n < 1 || max_n < min_n)
        return dflash_fail(DFLASH_ERR_INVALID_ARG, "ngram: block size %d, n in [%d, %d]", block_size, min_n, max_n);
    ngram *g = calloc(1, sizeof *g);
    if (!g)
        return dflash_fail(DFLASH_ERR_OOM, "ngram: out of memory");
    *g = (ngram){ { &k_ngram_ops, g }, block_size, min_n, max_n };
    *out = &g->p;
    return DFLASH_OK;
}
