/* spec.c: the speculative loop as a numbered state machine:
 *
 *   1 PREFILL   target runs the prompt in chunks (with taps); the proposer
 *               receives each chunk as context; t_N = argmax of the last row
 *               (sampled: drawn from its filtered distribution with the
 *               uniform of its position, sampler.h)
 *   2 PROPOSE   k = block size - 1, or the cost-aware width (width.h);
 *               drafts d_1..d_k for the block [t_s, MASK...] at positions s..
 *   3 VERIFY    target runs [t_s, d_1..d_k] at s..s+k with taps
 *   4 ACCEPT    greedy: a = leading run of d_i == argmax(row i-1);
 *               bonus = argmax(row a)
 *               sampled: for i = 1..k draw x_i from p_{i-1} (the filtered
 *               distribution of row i-1) with the uniform of position
 *               s+i (every row at once where the logits are, or row by
 *               row on the host: spec_internal.h's spec_sampling);
 *               accept d_i iff x_i == d_i; the bonus is the first
 *               x_i that differs, or x_{k+1} from p_k. The drafts are a
 *               point mass, so this is speculative sampling's rule
 *               (accept with p(d), else draw from the residual) and the
 *               tokens are exactly plain sampling's (temperature 0 with
 *               a penalty runs here too: p is then a point mass on the
 *               penalized argmax; under penalties row i counts d_1..d_i
 *               as generated, which holds whenever the row is used)
 *   5 COMMIT    choose d_1..d_a, bonus (stop tokens and the budget cut it
 *               short); they are emitted once 6 and 7 succeeded
 *   6 ROLLBACK  target KV length moves back to s+a+1 (rejected rows are
 *               simply overwritten later); s+c if a stop token or the
 *               budget cut the step to c emitted tokens
 *   7 OBSERVE   proposer gets the same rows s.. (tokens + taps); after a
 *               step with k = 0 they may wait and go over in one call
 *               with later ones, before the next propose and at the end
 *               at the latest; s = the new length; goto 2
 *
 * Invariant after a return, and between steps but for rows waiting in
 * spec_pending: the target cache and the proposer hold the prompt and
 * every emitted token except the last, which is the unverified t_s of the
 * next step. So a later call can continue the
 * sequence with a new prompt that starts with that token.
 *
 * With no proposer k = 0 and the same steps are plain decoding (greedy, or
 * sampling each token from its filtered distribution with the uniform of
 * its position). So for a given seed the output is the same with or
 * without a proposer, and whatever k each step chose. */
#include "spec/spec.h"
#include "spec/spec_internal.h"

#include "core/levers.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

void dflash_gen_default_opts(dflash_gen_opts *o)
{
    memset(o, 0, sizeof *o);
    o->n_new = 64;
    dflash_sampler_default_opts(&o->sampler);
}

double dflash_spec_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

int dflash_spec_is_stop(const dflash_gen_opts *o, int32_t t)
{
    for (int i = 0; i < o->n_stop; i++)
        if (o->stop_ids[i] == t)
            return 1;
    return 0;
}

/* Run rows [tokens, positions start..] of the single sequence through the
 * target; a token for each of the rows in logit_rows into ids_out: the
 * argmax (greedy, ss NULL), or drawn where the logits are (ss->ids). Host
 * sampling (ss without ids): the whole logits rows [n_logit, V] are
 * downloaded into ss->logits instead. dev_drafts: the rows after the
 * first take their tokens from these (propose_dev's, n - 1 of them),
 * which come back beside the ids into drafts_out. drafted: the rows after
 * the first are drafts, which a penalty counts as generated in the rows
 * after them (read where the forward holds its rows' tokens); 0 for a
 * prompt's rows. */
static dflash_status target_rows(dflash_qwen3 *t, dflash_kv_seq *seq, const int32_t *tokens, int n,
                                 const int *taps, int n_taps, int n_logit, const int32_t *logit_rows,
                                 int32_t *ids_out, spec_sampling *ss, float **taps_out, const int32_t *dev_drafts,
                                 int32_t *drafts_out, int drafted)
{
    int32_t positions[t->opts.max_rows], row_seq[t->opts.max_rows];
    const int32_t pos0 = seq->len;
    for (int i = 0; i < n; i++) {
        positions[i] = pos0 + i;
        row_seq[i] = 0;
    }
    dflash_qwen3_batch b = { .n_rows = n, .tokens = tokens, .positions = positions, .row_seq = row_seq,
                             .n_seqs = 1, .seqs = &seq, .n_logit_rows = n_logit, .logit_rows = logit_rows,
                             .n_taps = n_taps, .tap_layers = taps, .argmax_only = !ss,
                             .dev_tokens = dev_drafts, .dev_n = 1, .dev_cols = n - 1, .dev_row0 = 1,
                             .dev_row_stride = n - 1 };
    float *logits;
    dflash_backend *be = t->be;
    DFLASH_TRY(dflash_spec_mark(be, dev_drafts, 0));
    DFLASH_TRY(dflash_qwen3_forward(t, &b, &logits, taps_out));
    const int V = t->cfg.vocab_size;
    if (n_logit > 0 && ss && !ss->ids)
        return be->ops->download(be, ss->logits, logits, (size_t)n_logit * (size_t)V * sizeof(float));
    if (n_logit > 0 && ss) { /* row logit_rows[i] predicts the position after it */
        dflash_sample_row rows[n_logit];
        for (int i = 0; i < n_logit; i++)
            rows[i] =
                dflash_spec_sample_row(ss, pos0 + logit_rows[i] + 1, t->s.in.ids + 1, drafted ? logit_rows[i] : 0);
        DFLASH_TRY(
            dflash_spec_sample_rows(be, logits, n_logit, V, rows, t->s.best, &ss->smp, ss->logits, ss->host_counts));
    }
    DFLASH_TRY(dflash_spec_mark(be, dev_drafts, 1));
    return n_logit > 0 ? dflash_spec_fetch(t, n_logit, dev_drafts, n - 1, ids_out, drafts_out) : DFLASH_OK;
}

dflash_status dflash_spec_mark(dflash_backend *be, const int32_t *dev_drafts, int slot)
{
    return dev_drafts && be->ops->mark ? be->ops->mark(be, slot) : DFLASH_OK;
}

void dflash_spec_split_ms(dflash_backend *be, const int32_t *dev_drafts, double *verify_ms, double *propose_ms)
{
    double v;
    if (!dev_drafts || !be->ops->mark_ms || be->ops->mark_ms(be, 0, 1, &v) != DFLASH_OK || v > *verify_ms)
        return;
    *propose_ms += *verify_ms - v;
    *verify_ms = v;
}

int dflash_spec_dev_drafts(const dflash_proposer *p, const spec_sampling *ss)
{
    return p && p->ops->propose_dev && (!ss || ss->ids) && !dflash_levers_get()->host_drafts;
}

dflash_status dflash_spec_propose(dflash_proposer *p, void **states, int n, const int32_t *last,
                                  const int32_t *positions, int k, int dev, int32_t *drafts,
                                  const int32_t **dev_drafts)
{
    *dev_drafts = NULL;
    if (!dev)
        return p->ops->propose(p, states, n, last, positions, k, drafts);
    memset(drafts, 0, (size_t)n * (size_t)k * sizeof(int32_t));
    return p->ops->propose_dev(p, states, n, last, positions, k, dev_drafts);
}

dflash_status dflash_spec_fetch(dflash_qwen3 *t, int n, const int32_t *dev_drafts, int nd, int32_t *ids,
                                int32_t *drafts)
{
    dflash_backend *be = t->be;
    if (!dev_drafts)
        return be->ops->download(be, ids, t->s.best, (size_t)n * sizeof(int32_t));
    /* s->best has room for the drafts after the n tokens (n + nd <= 2R) */
    int32_t got[2 * t->opts.max_rows];
    DFLASH_TRY(be->ops->copy_ids(be, t->s.best + n, nd, dev_drafts, nd, 1, nd));
    DFLASH_TRY(be->ops->download(be, got, t->s.best, (size_t)(n + nd) * sizeof(int32_t)));
    memcpy(ids, got, (size_t)n * sizeof(int32_t));
    memcpy(drafts, got + n, (size_t)nd * sizeof(int32_t));
    return DFLASH_OK;
}

dflash_status dflash_spec_dev_status(dflash_backend *be, const dflash_proposer *p, dflash_status vs,
                                     const int32_t *dev_drafts, int32_t *drafts, int n_seqs,
                                     const int32_t *positions, int k)
{
    if (vs != DFLASH_OK &&
        be->ops->download(be, drafts, dev_drafts, (size_t)n_seqs * (size_t)k * sizeof(int32_t)) != DFLASH_OK)
        return vs;
    dflash_status cs = p->ops->check_drafts(p, drafts, n_seqs, positions, k);
    return cs != DFLASH_OK ? cs : vs;
}

_Static_assert(DFLASH_MAX_BLOCK <= DFLASH_SAMPLE_GEN_MAX, "a row's drafts before it are at most DFLASH_SAMPLE_GEN_MAX");

dflash_sample_row dflash_spec_sample_row_opts(const dflash_sampler_opts *o, int64_t pos)
{
    return (dflash_sample_row){ .temperature = o->temperature, .top_p = o->top_p, .min_p = o->min_p,
                                .top_k = o->top_k, .seed = o->seed, .pos = pos, .rep_penalty = 1.0 };
}

dflash_sample_row dflash_spec_sample_row(const spec_sampling *ss, int64_t pos, const int32_t *gen, int n_gen)
{
    const dflash_sampler_opts *o = &ss->smp.o;
    dflash_sample_row r = dflash_spec_sample_row_opts(o, pos);
    if (ss->counts) {
        r.rep_penalty = o->rep_penalty;
        r.frequency_penalty = o->frequency_penalty;
        r.presence_penalty = o->presence_penalty;
        r.counts = ss->counts;
        r.n_gen = n_gen; /* < DFLASH_MAX_BLOCK <= DFLASH_SAMPLE_GEN_MAX */
        r.gen = gen;
    }
    return r;
}

dflash_status dflash_spec_count_generated(spec_sampling *ss, const int32_t *ids, int n)
{
    if (!ss || !ss->counts || n <= 0)
        return DFLASH_OK;
    return ss->be->ops->count_tokens(ss->be, ss->counts, ss->smp.vocab, ids, n, 1);
}

dflash_status dflash_spec_count_step(spec_sampling *ss, const int32_t *block, int a, int32_t bonus)
{
    if (!ss || !ss->counts)
        return DFLASH_OK;
    int32_t gen[DFLASH_MAX_BLOCK];
    memcpy(gen, block + 1, (size_t)a * sizeof *gen);
    gen[a] = bonus;
    return dflash_spec_count_generated(ss, gen, a + 1);
}

int32_t dflash_spec_draw_row(dflash_sampler *s, const float *logits, const dflash_sample_row *r)
{
    const dflash_sampler_opts keep = s->o;
    s->o.temperature = r->temperature;
    s->o.top_k = r->top_k;
    s->o.top_p = r->top_p;
    s->o.min_p = r->min_p;
    s->o.rep_penalty = 1.0;
    s->o.frequency_penalty = 0.0;
    s->o.presence_penalty = 0.0;
    s->o.seed = r->seed;
    int32_t id = -1;
    if (dflash_sampler_probs(s, logits, s->probs) == DFLASH_OK)
        id = dflash_sampler_sample_at(s, s->probs, r->pos);
    s->o = keep;
    return id;
}

void dflash_spec_penalize_row(float *row, int V, const int32_t *counts, const dflash_sample_row *r,
                              const int32_t *gen)
{
    /* the row's generated tokens: each once, how often, its logit before any penalty */
    int32_t tok[DFLASH_SAMPLE_GEN_MAX], more[DFLASH_SAMPLE_GEN_MAX];
    float orig[DFLASH_SAMPLE_GEN_MAX];
    int m = 0;
    for (int i = 0; i < r->n_gen && i < DFLASH_SAMPLE_GEN_MAX; i++) {
        const int32_t t = gen[i];
        if (t < 0 || t >= V)
            continue;
        int k = 0;
        while (k < m && tok[k] != t)
            k++;
        if (k == m)
            tok[m] = t, more[m] = 0, orig[m++] = row[t];
        more[k]++;
    }
    dflash_sampler_opts o;
    dflash_sampler_default_opts(&o);
    o.rep_penalty = r->rep_penalty;
    o.frequency_penalty = r->frequency_penalty;
    o.presence_penalty = r->presence_penalty;
    for (int j = 0; j < V; j++)
        row[j] = (float)dflash_sampler_penalized(&o, row[j], counts[j]);
    for (int k = 0; k < m; k++)
        row[tok[k]] = (float)dflash_sampler_penalized(&o, orig[k], (counts[tok[k]] > 0 ? counts[tok[k]] : 0) + more[k]);
}

dflash_status dflash_spec_sample_rows(dflash_backend *be, const float *logits, int n, int V,
                                      const dflash_sample_row *rows, int32_t *ids, dflash_sampler *scratch,
                                      float *host_row, int32_t *host_counts)
{
    if (be->ops->sample_rows)
        return be->ops->sample_rows(be, logits, n, V, rows, ids);
    const int32_t *have = NULL; /* whose counts host_counts holds: a sequence's rows come together */
    for (int i = 0; i < n; i++) {
        const dflash_sample_row *r = &rows[i];
        DFLASH_TRY(be->ops->download(be, host_row, logits + (size_t)i * (size_t)V, (size_t)V * sizeof(float)));
        if (r->counts) {
            if (!host_counts)
                return dflash_fail(DFLASH_ERR_INVALID_ARG, "sample rows: row %d has penalties but no host room for "
                                   "its counts", i);
            if (r->counts != have)
                DFLASH_TRY(be->ops->download(be, host_counts, r->counts, (size_t)V * sizeof *host_counts));
            have = r->counts;
            int32_t gen[DFLASH_SAMPLE_GEN_MAX];
            const int n_gen = r->n_gen < DFLASH_SAMPLE_GEN_MAX ? r->n_gen : DFLASH_SAMPLE_GEN_MAX;
            if (n_gen > 0)
                DFLASH_TRY(be->ops->download(be, gen, r->gen, (size_t)n_gen * sizeof *gen));
            dflash_spec_penalize_row(host_row, V, host_counts, r, gen);
        }
        const int32_t id = dflash_spec_draw_row(scratch, host_row, r);
        DFLASH_TRY(be->ops->upload(be, ids + i, &id, sizeof id));
    }
    return DFLASH_OK;
}

/* Greedy ids of -1: the target's logits held no usable number (NaN or
 * +inf, from broken weights or config values); decoding a token from them
 * would print garbage that looks like output. `pos` is the position the
 * first row predicts; step 0 is the prefill. */
dflash_status dflash_spec_check_greedy(const dflash_qwen3 *t, const int32_t *ids, int n, int32_t pos, int step)
{
    for (int i = 0; i < n; i++)
        if (ids[i] < 0)
            return dflash_fail(DFLASH_ERR_NUMERIC, "%s: the target's logits for position %d (step %d) are not "
                               "finite (NaN or +inf): its weights or config.json give no usable numbers",
                               dflash_st_path(t->st), pos + i, step);
    return DFLASH_OK;
}

/* The sampler's probabilities of one logits row; its non-finite report
 * gains the model, the position and the step. */
dflash_status dflash_spec_sampled_probs(dflash_sampler *smp, const dflash_qwen3 *t, const float *logits,
                                       double *probs, int32_t pos, int step)
{
    dflash_status s = dflash_sampler_probs(smp, logits, probs);
    if (s == DFLASH_ERR_NUMERIC)
        return dflash_fail_prefix(s, "%s: position %d (step %d): ", dflash_st_path(t->st), pos, step);
    return s;
}

/* Committed rows on their way to the proposer. A step that drafted hands
 * them over at once; after a step that drafted nothing (the width model
 * chose plain decoding) they wait and go over in one call before the next
 * propose (or when the buffer is full, or when generation ends): one call
 * for many rows reads the drafter's weights once instead of once per
 * token. The proposer's
 * results do not depend on how rows are grouped (batch invariance), so
 * this changes time, never tokens. */
typedef struct spec_pending {
    int32_t tokens[DFLASH_MAX_BLOCK];
    int n, cap;
    int32_t pos0;
    int32_t cut;      /* -1, or where a failed hand-over cut both caches back */
    int64_t tap_cols; /* n_taps * hidden */
    float *taps;      /* backend [cap, tap_cols], NULL without taps */
} spec_pending;

static dflash_status pending_flush(dflash_kv_seq *seq, dflash_proposer *p, void *pstate, spec_pending *pd,
                                   dflash_gen_stats *st)
{
    if (!p || pd->n == 0)
        return DFLASH_OK;
    double t0 = dflash_spec_now_ms();
    dflash_ctx_rows rows = { pd->tokens, pd->n, pd->pos0, pd->taps, pd->tap_cols };
    dflash_status s = p->ops->after_verify(p, &pstate, 1, &rows);
    st->observe_ms += dflash_spec_now_ms() - t0;
    if (s != DFLASH_OK) { /* both caches end where the proposer's does */
        dflash_kv_seq_truncate(seq, pd->pos0);
        pd->cut = pd->pos0;
    }
    pd->n = 0;
    return s;
}

/* 4 ACCEPT, sampled: speculative sampling over the k drafts in block[1..k]
 * with the verify's logits rows ss->logits [k+1, V]. Returns a and the
 * bonus. Accepted drafts join the sampler's sequence as they pass (the
 * penalties of row i see d_1..d_i, exactly as plain decoding
 * would after emitting them). */
dflash_status dflash_spec_accept_sampled(spec_sampling *ss, const dflash_qwen3 *t, int32_t s, int step,
                                        const int32_t *block, int k, int V, int *a_out, int32_t *bonus)
{
    dflash_sampler *smp = &ss->smp;
    int a = 0;
    for (;; a++) {
        const int32_t pos = s + a + 1; /* the position row a predicts */
        DFLASH_TRY(dflash_spec_sampled_probs(smp, t, ss->logits + (size_t)a * V, smp->probs, pos, step));
        if (smp->o.accept_rule != DFLASH_ACCEPT_EXACT) { /* test-only wrong rules */
            if (a == k) {
                *bonus = dflash_sampler_sample(smp, smp->probs);
                break;
            }
            if (!dflash_sampler_accept(smp, smp->probs, NULL, block[a + 1], bonus))
                break;
        } else {
            /* Drafts of a greedy proposer are a point mass, so the exact
             * rule reduces to: draw the token plain decoding would draw
             * here (same position, same uniform) and accept the draft iff
             * they agree. That accepts with probability p(d), as min(1, p/q)
             * does for q a point mass, and on a mismatch the drawn token
             * is distributed as p without d, renormalized: the residual.
             * So the output is plain sampling's, token for token. */
            *bonus = dflash_sampler_sample_at(smp, smp->probs, pos);
            if (a == k || *bonus != block[a + 1])
                break;
        }
        dflash_sampler_observe_output(smp, &block[a + 1], 1);
    }
    dflash_sampler_observe_output(smp, bonus, 1);
    *a_out = a;
    return DFLASH_OK;
}

/* 1 PREFILL of one sequence: the prompt in chunks of the target's rows,
 * each chunk handed to the proposer as context; *first = the token after
 * the prompt (greedy, or drawn with its position's uniform) when
 * o->n_new > 0. On failure both caches stop at the same row. */
dflash_status dflash_spec_prefill_begin(const dflash_gen_opts *o, spec_sampling *ss, const int32_t *prompt,
                                        int n_prompt)
{
    if (!ss)
        return DFLASH_OK;
    if (!ss->ids) { /* the host sampler's own penalty state; drawing by ids keeps ss->counts instead */
        if (o->history)
            dflash_sampler_observe(&ss->smp, o->history, o->n_history);
        dflash_sampler_observe(&ss->smp, prompt, n_prompt);
        return DFLASH_OK;
    }
    if (!ss->counts)
        return DFLASH_OK;
    dflash_backend *be = ss->be;
    if (o->history)
        DFLASH_TRY(be->ops->count_tokens(be, ss->counts, ss->smp.vocab, o->history, o->n_history, 0));
    return be->ops->count_tokens(be, ss->counts, ss->smp.vocab, prompt, n_prompt, 0);
}

dflash_status dflash_spec_prefill_chunk(dflash_qwen3 *target, dflash_kv_seq *seq, dflash_proposer *p, void *pstate,
                                        const int32_t *rows, int n, int last, spec_sampling *ss, int32_t *cur)
{
    const int *taps = NULL;
    int n_taps = p ? p->ops->tap_layers(p, &taps) : 0;
    int32_t last_row = n - 1;
    float *tap_rows = NULL;
    const int32_t pos0 = seq->len;
    dflash_status s =
        target_rows(target, seq, rows, n, taps, n_taps, last, &last_row, cur, ss, &tap_rows, NULL, NULL, 0);
    if (s != DFLASH_OK) {
        dflash_kv_seq_truncate(seq, pos0); /* the forward may have advanced it before failing */
        return s;
    }
    if (p) {
        dflash_ctx_rows ctx = { rows, n, pos0, tap_rows, (int64_t)n_taps * target->cfg.hidden_size };
        s = p->ops->begin(p, pstate, &ctx);
        if (s != DFLASH_OK)
            dflash_kv_seq_truncate(seq, pos0); /* both caches stop at the same row */
    }
    return s;
}

dflash_status dflash_spec_prefill_finish(dflash_qwen3 *target, const dflash_kv_seq *seq, const dflash_gen_opts *o,
                                         spec_sampling *ss, int32_t *cur)
{
    if ((!ss || ss->ids) && o->n_new > 0) {
        DFLASH_TRY(dflash_spec_check_greedy(target, cur, 1, seq->len, 0));
        DFLASH_TRY(dflash_spec_count_generated(ss, cur, 1));
    }
    if (ss && !ss->ids && o->n_new > 0) {
        DFLASH_TRY(dflash_spec_sampled_probs(&ss->smp, target, ss->logits, ss->smp.probs, seq->len, 0));
        *cur = dflash_sampler_sample_at(&ss->smp, ss->smp.probs, seq->len);
        dflash_sampler_observe_output(&ss->smp, cur, 1);
    }
    return DFLASH_OK;
}

dflash_status dflash_spec_prefill(dflash_qwen3 *target, dflash_kv_seq *seq, dflash_proposer *p, void *pstate,
                                  const int32_t *prompt, int n_prompt, const dflash_gen_opts *o, spec_sampling *ss,
                                  int32_t *first)
{
    const int max_rows = target->opts.max_rows;
    int32_t cur = -1;
    DFLASH_TRY(dflash_spec_prefill_begin(o, ss, prompt, n_prompt));
    for (int done = 0; done < n_prompt;) {
        const int n = n_prompt - done < max_rows ? n_prompt - done : max_rows;
        DFLASH_TRY(dflash_spec_prefill_chunk(target, seq, p, pstate, prompt + done, n, done + n == n_prompt, ss, &cur));
        done += n;
    }
    DFLASH_TRY(dflash_spec_prefill_finish(target, seq, o, ss, &cur));
    *first = cur;
    return DFLASH_OK;
}

static dflash_status spec_loop(dflash_qwen3 *target, dflash_kv_seq *seq, dflash_proposer *p, void *pstate,
                               const int32_t *prompt, int n_prompt, const dflash_gen_opts *o, int B,
                               spec_sampling *ss, spec_pending *pd, int32_t *out, int *n_out, dflash_gen_stats *st)
{
    const int V = target->cfg.vocab_size;
    const int *taps = NULL;
    int n_taps = p ? p->ops->tap_layers(p, &taps) : 0;
    double t0 = dflash_spec_now_ms();
    dflash_width wm;
    dflash_width_init(&wm, B - 1);

    /* 1 PREFILL */
    int32_t cur = -1;
    DFLASH_TRY(dflash_spec_prefill(target, seq, p, pstate, prompt, n_prompt, o, ss, &cur));
    st->prefill_ms = dflash_spec_now_ms() - t0;
    if (o->n_new <= 0)
        return DFLASH_OK;
    const int first_stops = dflash_spec_first_stops(o, out, *n_out, cur);
    out[(*n_out)++] = cur;
    if (o->on_tokens)
        DFLASH_TRY(o->on_tokens(o->user, &cur, 1));
    if (first_stops) {
        st->stopped = 1;
        return DFLASH_OK;
    }

    while (*n_out < o->n_new) {
        const int32_t s = seq->len; /* position of cur, the unverified last token */
        int remaining = o->n_new - *n_out;
        int k = B - 1 < remaining ? B - 1 : remaining; /* drafts this step */
        if (o->width_auto && p)
            k = dflash_width_choose(&wm, k);
        int32_t block[DFLASH_MAX_BLOCK], g[DFLASH_MAX_BLOCK], rows_idx[DFLASH_MAX_BLOCK];
        block[0] = cur;

        /* 2 PROPOSE (the proposer first takes any rows still waiting);
         * the drafts stay where the proposer made them when they can
         * (dflash_spec_dev_drafts): the verify reads them there and they
         * come over with its tokens, so the host waits once a step */
        if (k > 0)
            DFLASH_TRY(pending_flush(seq, p, pstate, pd, st));
        const int32_t *dev = NULL;
        double t1 = dflash_spec_now_ms();
        if (k > 0)
            DFLASH_TRY(dflash_spec_propose(p, &pstate, 1, &cur, &s, k, dflash_spec_dev_drafts(p, ss), block + 1, &dev));
        double t2 = dflash_spec_now_ms();

        /* 3 VERIFY */
        for (int i = 0; i <= k; i++)
            rows_idx[i] = i;
        float *tap_rows = NULL;
        dflash_status cs =
            target_rows(target, seq, block, k + 1, taps, n_taps, k + 1, rows_idx, g, ss, &tap_rows, dev, block + 1, 1);
        if (dev)
            cs = dflash_spec_dev_status(target->be, p, cs, dev, block + 1, 1, &s, k);
        if (cs == DFLASH_OK && (!ss || ss->ids))
            cs = dflash_spec_check_greedy(target, g, k + 1, s + 1, st->n_steps + 1);
        if (cs != DFLASH_OK) {
            dflash_kv_seq_truncate(seq, s); /* the caches stay as they were before the step */
            return cs;
        }
        double draft_ms = t2 - t1, verify_ms = dflash_spec_now_ms() - t2;
        dflash_spec_split_ms(target->be, dev, &verify_ms, &draft_ms);
        st->draft_ms += draft_ms;
        st->verify_ms += verify_ms;

        /* 4 ACCEPT */
        int a = 0;
        int32_t bonus;
        if (ss && !ss->ids) {
            dflash_status as = dflash_spec_accept_sampled(ss, target, s, st->n_steps + 1, block, k, V, &a, &bonus);
            if (as != DFLASH_OK) {
                dflash_kv_seq_truncate(seq, s);
                return as;
            }
        } else {
            while (a < k && block[a + 1] == g[a])
                a++;
            bonus = g[a];
            cs = dflash_spec_count_step(ss, block, a, bonus);
            if (cs != DFLASH_OK) {
                dflash_kv_seq_truncate(seq, s);
                return cs;
            }
        }

        /* 5 COMMIT: d_1..d_a then the bonus, cut by stop tokens or strings and budget
         * (handed out after 7, so a failure there emits nothing) */
        int32_t *emit = out + *n_out;
        int stopped;
        const int n_emit = dflash_spec_commit(o, out, *n_out, block, a, bonus, emit, &stopped);

        /* 6 ROLLBACK: the cache keeps t_s and every emitted token but the
         * last, which becomes the next unverified token. Normally that is
         * s + a + 1; a stop token or the budget can end the run earlier. */
        dflash_kv_seq_truncate(seq, s + n_emit);

        double handover_ms = 0; /* a drafting step's hand-over, a cost of drafting */
        /* 7 OBSERVE: the same rows go to the proposer, so a later call can
         * continue this sequence (a chat's next turn). They join the
         * pending rows (spec_pending), which go over at once after a step
         * that drafted, else later in one call. If a hand-over fails, the
         * target goes back to where the proposer's rows end: both caches
         * stay in step. */
        if (p) {
            if (pd->n + n_emit > pd->cap)
                DFLASH_TRY(pending_flush(seq, p, pstate, pd, st));
            if (pd->n == 0)
                pd->pos0 = s;
            memcpy(pd->tokens + pd->n, block, (size_t)n_emit * sizeof(int32_t));
            dflash_status cs2 = pd->taps ? target->be->ops->copy_rows(target->be, pd->taps + pd->n * pd->tap_cols,
                                                                      pd->tap_cols, tap_rows, pd->tap_cols, NULL,
                                                                      n_emit, pd->tap_cols)
                                         : DFLASH_OK;
            if (cs2 != DFLASH_OK) {
                dflash_kv_seq_truncate(seq, s);
                return cs2;
            }
            pd->n += n_emit;
            if (k > 0) {
                const double t4 = dflash_spec_now_ms();
                DFLASH_TRY(pending_flush(seq, p, pstate, pd, st));
                handover_ms = dflash_spec_now_ms() - t4;
            }
        }

        *n_out += n_emit;
        st->stopped = stopped;
        if (o->on_tokens)
            DFLASH_TRY(o->on_tokens(o->user, emit, n_emit));
        if (o->on_step)
            o->on_step(o->step_user, s, block + 1, k, a, bonus);
        if (o->width_auto && p)
            dflash_width_observe(&wm, k, a, verify_ms, draft_ms + handover_ms);
        st->n_steps++;
        st->width_hist[k]++;
        st->accept_hist[n_emit]++; /* tokens this step committed */
        for (int i = 0; i < k; i++) {
            st->pos_tried[i]++;
            st->pos_accepted[i] += i < a;
        }
        cur = emit[n_emit - 1];
        if (st->stopped)
            break;
    }
    return DFLASH_OK;
}

/* ---- what both loops share (spec_internal.h) ---------------------------- */

dflash_status dflash_spec_block(const dflash_qwen3 *t, const dflash_proposer *p, int block_size, const char *who,
                                int *B)
{
    int b = p ? p->ops->block_size(p) : 1;
    if (p && block_size > 0 && block_size < b)
        b = block_size;
    if (b > DFLASH_MAX_BLOCK || b > t->opts.max_rows)
        return dflash_fail(DFLASH_ERR_INVALID_ARG, "%s: block size %d exceeds the limit %d", who, b,
                           b > DFLASH_MAX_BLOCK ? DFLASH_MAX_BLOCK : t->opts.max_rows);
    *B = b;
    return DFLASH_OK;
}

dflash_status dflash_spec_check_start(const dflash_qwen3 *t, const dflash_kv_seq *seq, int n_prompt,
                                      const dflash_gen_opts *o, int B, const char *who)
{
    if (n_prompt <= 0)
        return dflash_fail(DFLASH_ERR_INVALID_ARG, "%s: the prompt is empty", who);
    if (o->n_history < 0 || (o->n_history > 0 && !o->history))
        return dflash_fail(DFLASH_ERR_INVALID_ARG, "%s: history of %d ids at %p", who, o->n_history,
                           (const void *)o->history);
    if (seq->len + n_prompt + o->n_new + B > t->opts.max_ctx)
        return dflash_fail(DFLASH_ERR_INVALID_ARG,
                           "%s: %d cached + %d prompt + %d new tokens + block %d exceed the context limit %d", who,
                           seq->len, n_prompt, o->n_new, B, t->opts.max_ctx);
    return dflash_sampler_check_opts(&o->sampler);
}

dflash_status dflash_spec_sampling_init(spec_sampling *ss, const dflash_qwen3 *t, const dflash_sampler_opts *so,
                                        int B, const char *who)
{
    const int V = t->cfg.vocab_size;
    dflash_backend *be = t->be;
    DFLASH_TRY(dflash_sampler_init(&ss->smp, V, so));
    ss->be = be;
    ss->counts = ss->host_counts = NULL;
    ss->logits = NULL;
    const int pen = dflash_sampler_has_penalty(so);
    ss->ids = so->accept_rule == DFLASH_ACCEPT_EXACT && !dflash_levers_get()->host_sampling &&
              (!pen || be->ops->count_tokens);
    if (ss->ids && pen) {
        dflash_status s = dflash_be_alloc_i32(be, (size_t)V, &ss->counts);
        if (s == DFLASH_OK)
            s = be->ops->count_tokens(be, ss->counts, V, NULL, V, 0);
        /* drawn by the composition (no sample_rows): the counts come to the host */
        if (s == DFLASH_OK && !be->ops->sample_rows &&
            !(ss->host_counts = malloc((size_t)V * sizeof *ss->host_counts)))
            s = dflash_fail(DFLASH_ERR_OOM, "%s: out of memory for %d counts", who, V);
        if (s != DFLASH_OK) {
            dflash_spec_sampling_free(ss);
            return s;
        }
    }
    /* drawing by ids needs one row at most (dflash_spec_sample_rows
     * without the backend's op), the host path a verify's rows */
    const int rows = ss->ids ? 1 : B;
    ss->logits = malloc((size_t)rows * (size_t)V * sizeof(float));
    if (!ss->logits) {
        dflash_spec_sampling_free(ss);
        return dflash_fail(DFLASH_ERR_OOM, "%s: out of memory for %d logits rows of %d", who, rows, V);
    }
    return DFLASH_OK;
}

void dflash_spec_sampling_free(spec_sampling *ss)
{
    if (ss->counts)
        ss->be->ops->free(ss->be, ss->counts);
    ss->counts = NULL;
    free(ss->host_counts);
    ss->host_counts = NULL;
    free(ss->logits);
    ss->logits = NULL;
    dflash_sampler_free(&ss->smp);
}

int dflash_spec_commit(const dflash_gen_opts *o, const int32_t *out, int n_out, const int32_t *block, int a,
                       int32_t bonus, int32_t *emit, int *stopped)
{
    int n_emit = 0;
    *stopped = 0;
    for (int i = 1; i <= a + 1 && n_out + n_emit < o->n_new && !*stopped; i++) {
        emit[n_emit] = i <= a ? block[i] : bonus;
        *stopped = dflash_spec_is_stop(o, emit[n_emit++]);
    }
    const int cut = o->stop_text && n_emit ? o->stop_text(o->stop_user, out, n_out, emit, n_emit) : 0;
    if (cut > 0) {
        n_emit = cut;
        *stopped = 1;
    }
    return n_emit;
}

int dflash_spec_first_stops(const dflash_gen_opts *o, const int32_t *out, int n_out, int32_t first)
{
    /* both asked: a stop string's owner records that it ended the run */
    const int by_text = o->stop_text && o->stop_text(o->stop_user, out, n_out, &first, 1);
    return dflash_spec_is_stop(o, first) || by_text;
}

void dflash_spec_final_stats(dflash_gen_stats *st, int n_out)
{
    st->n_generated = n_out;
    int64_t committed = 0;
    for (int i = 0; i <= DFLASH_MAX_BLOCK; i++)
        committed += st->accept_hist[i] * i;
    st->mean_accept = st->n_steps ? (double)committed / st->n_steps : 0.0;
    const double decode_ms = st->total_ms - st->prefill_ms;
    st->tokens_per_s = decode_ms > 0 ? n_out / (decode_ms / 1e3) : 0.0;
}

/* ---- the one-sequence loop ----------------------------------------------- */

dflash_status dflash_spec_generate(dflash_qwen3 *target, dflash_kv_seq *seq, dflash_proposer *p, void *pstate,
                                   const int32_t *prompt, int n_prompt, const dflash_gen_opts *o, int32_t *out,
                                   int *n_out, dflash_gen_stats *st)
{
    int B;
    DFLASH_TRY(dflash_spec_block(target, p, o->block_size, "generate", &B));
    DFLASH_TRY(dflash_spec_check_start(target, seq, n_prompt, o, B, "generate"));
    memset(st, 0, sizeof *st);
    st->n_prompt = n_prompt;
    *n_out = 0;
    double t0 = dflash_spec_now_ms();

    /* Sampling buffers are sized here, before the loop, so nothing
     * allocates per token; greedy keeps the argmax-only path. */
    spec_sampling ss_store, *ss = NULL;
    if (!dflash_sampler_is_greedy(&o->sampler)) {
        ss = &ss_store;
        DFLASH_TRY(dflash_spec_sampling_init(ss, target, &o->sampler, B, "generate"));
    }
    spec_pending pd = { .cap = B, .cut = -1 };
    if (p) {
        const int *taps;
        pd.tap_cols = (int64_t)p->ops->tap_layers(p, &taps) * target->cfg.hidden_size;
        dflash_status as = pd.tap_cols ? dflash_be_alloc_f32(target->be, (size_t)B * (size_t)pd.tap_cols, &pd.taps)
                                       : DFLASH_OK;
        if (as != DFLASH_OK) {
            if (ss)
                dflash_spec_sampling_free(ss);
            return as;
        }
    }
    const int32_t len0 = seq->len;
    dflash_status s = spec_loop(target, seq, p, pstate, prompt, n_prompt, o, B, ss, &pd, out, n_out, st);
    /* Rows still pending go to the proposer on every way out, so the
     * caches agree when the call returns (the loop's invariant). If such a
     * late hand-over failed (here or before a propose), both caches ended
     * where the proposer's rows end, before tokens already emitted: *n_out
     * shrinks to what they hold (plus the unverified last token), so the
     * sequence can still be continued. */
    dflash_status fs = pending_flush(seq, p, pstate, &pd, st);
    if (pd.cut >= 0) {
        const int keep = pd.cut - (len0 + n_prompt) + 1;
        if (keep < *n_out)
            *n_out = keep;
    }
    if (s == DFLASH_OK)
        s = fs;
    if (pd.taps)
        target->be->ops->free(target->be, pd.taps);
    if (ss)
        dflash_spec_sampling_free(ss);
    DFLASH_TRY(s);

    DFLASH_TRY(target->be->ops->sync(target->be));
    st->total_ms = dflash_spec_now_ms() - t0;
    dflash_spec_final_stats(st, *n_out);
    return DFLASH_OK;
}
