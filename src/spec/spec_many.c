/* spec_many.c: the speculative loop over many sequences at once (see
 * dflash_spec_batch and dflash_spec_generate_many in spec.h): sequences
 * join with their prefill and leave when done, between steps. The steps
 * are spec.c's, numbered
 * the same; what changes is that PROPOSE and VERIFY run once for a group
 * of sequences and ACCEPT .. OBSERVE once per sequence of the group:
 *
 *   1 PREFILL   each sequence alone, in chunks spread over the steps
 *               after it joins (a row budget per step, oldest first)
 *   then per step, per group of sequences generating:
 *   2 PROPOSE   one call per distinct draft count k (all sequences share
 *               it unless some are near their budget)
 *   3 VERIFY    one target forward over every sequence's block
 *   4-6         per sequence: accept, commit, roll its cache back
 *   7 OBSERVE   one after_verify over the group's accepted rows, after a
 *               step that drafted; after one that drafted nothing the
 *               rows wait and go over in one call before the next propose
 *               (as spec.c's), when a block's worth waits, or when the
 *               sequence ends
 *
 * A group holds sequences of one kind (greedy: argmax rows only;
 * sampling: logits rows, drawn from where they are or sent to the host,
 * spec_internal.h's spec_sampling) whose blocks fit the target's rows
 * and sequence slots. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "spec/spec.h"
#include "spec/spec_internal.h"
#include "spec/width.h"

/* The loop's own state of one item. */
typedef struct many_seq {
    dflash_spec_item *it;
    int sampled;
    spec_sampling ss;  /* when sampled */
    int32_t cur;       /* the unverified last token */
    int prefilled;     /* prompt rows run so far; the sequence generates once all have */
    int done;
    int32_t s;         /* position of cur in this step */
    int k;             /* drafts this step */
    int a;             /* of them accepted */
    int in_step;       /* took part in this step */
    int row0;          /* its first row in the group's forward */
    double t_join;
    int32_t block[DFLASH_MAX_BLOCK];
    /* Committed rows the proposer has not taken yet (steps that drafted
     * nothing): tokens from position pend_pos0, their taps in pend_taps. A
     * call for many rows reads the drafter's weights once, and a step that
     * drafts nothing then costs what plain decoding does; the proposer's
     * results do not depend on how rows are grouped, so only time changes. */
    int32_t pend[DFLASH_MAX_BLOCK];
    int n_pend;
    int32_t pend_pos0;
    float *pend_taps; /* backend [B, tap_cols], from the first wait; NULL without taps */
    int32_t len0;     /* the target cache's rows when it joined */
    char accept_err[256]; /* its sampled acceptance's error message, taken on a worker thread */
} many_seq;

struct dflash_spec_batch {
    dflash_qwen3 *t;
    dflash_proposer *p;
    int B, n_taps;
    const int *taps;
    int64_t tap_cols;
    int32_t *best; /* host [max_rows] */
    dflash_sample_row *draw; /* host [max_rows]: a verify's rows to draw (made once, not per verify) */
    int n, cap;    /* sequences joined and generating */
    many_seq *ms;  /* [cap] */
    int width_auto; /* each step's width from wm, else B - 1 */
    const int *widths; /* tests: step i's width widths[i % n_widths] */
    int n_widths;
    long steps;
    dflash_width wm;
};

/* Emitted tokens: stored, streamed; a stop (`stopped`: a stop token or
 * string the commit found), the budget or a consumer that takes no more
 * (on_tokens not DFLASH_OK) ends the sequence, not the step: the others
 * go on. */
static dflash_status emit(many_seq *m, const int32_t *toks, int n, int stopped)
{
    dflash_spec_item *it = m->it;
    memcpy(it->out + it->n_out, toks, (size_t)n * sizeof(int32_t));
    it->n_out += n;
    if (stopped)
        it->stats.stopped = m->done = 1;
    if (it->n_out >= it->opts.n_new)
        m->done = 1;
    m->cur = toks[n - 1];
    if (it->opts.on_tokens && it->opts.on_tokens(it->opts.user, toks, n) != DFLASH_OK)
        it->stats.stopped = m->done = 1;
    return DFLASH_OK;
}

/* A group's drafts left in backend memory by one propose_dev (every
 * sequence drafting k, dflash_spec_dev_drafts): the verify reads them
 * there; they come back into host, then each block. */
typedef struct group_drafts {
    const int32_t *dev; /* NULL: the drafts are in the blocks already */
    int k;
    int32_t *pos; /* [ng]: each sequence's propose position (with dev) */
} group_drafts;

/* 2 PROPOSE for the group g[0..ng): one call per distinct k; when one k
 * covers the whole group and its sequences may, the drafts stay in
 * backend memory (gd). */
static dflash_status propose_group(dflash_spec_batch *r, const int *g, int ng, group_drafts *gd)
{
    void *states[ng];
    int32_t last[ng], drafts[ng * DFLASH_MAX_BLOCK];
    int ids = 1;
    for (int j = 0; j < ng; j++)
        ids &= !r->ms[g[j]].sampled || r->ms[g[j]].ss.ids;
    gd->dev = NULL;
    for (int k = 1; k < r->B; k++) {
        int n = 0;
        for (int j = 0; j < ng; j++)
            if (r->ms[g[j]].k == k) {
                states[n] = r->ms[g[j]].it->pstate;
                last[n] = r->ms[g[j]].cur;
                gd->pos[n++] = r->ms[g[j]].s;
            }
        if (n == 0)
            continue;
        const int dev = n == ng && ids && dflash_spec_dev_drafts(r->p, NULL);
        DFLASH_TRY(dflash_spec_propose(r->p, states, n, last, gd->pos, k, dev, drafts, &gd->dev));
        gd->k = k;
        for (int j = 0, q = 0; j < ng; j++)
            if (r->ms[g[j]].k == k)
                memcpy(r->ms[g[j]].block + 1, drafts + (q++) * k, (size_t)k * sizeof(int32_t));
    }
    return DFLASH_OK;
}

/* 3 VERIFY the group's blocks in one forward; greedy rows' argmax and
 * sampling rows' drawn tokens (spec_sampling's ids) into r->best, other
 * sampling rows' logits into each sequence's buffer. */
static dflash_status verify_group(dflash_spec_batch *r, const int *g, int ng, int sampled, float **taps_out,
                                  const group_drafts *gd, int32_t *drafts)
{
    const int max_rows = r->t->opts.max_rows;
    int32_t tokens[max_rows], pos[max_rows], row_seq[max_rows], rows[max_rows];
    dflash_kv_seq *seqs[ng];
    int n = 0;
    for (int j = 0; j < ng; j++) {
        many_seq *m = &r->ms[g[j]];
        seqs[j] = m->it->seq;
        m->row0 = n;
        for (int i = 0; i <= m->k; i++, n++) {
            tokens[n] = m->block[i];
            pos[n] = m->s + i;
            row_seq[n] = j;
            rows[n] = n;
        }
    }
    dflash_qwen3_batch b = { .n_rows = n, .tokens = tokens, .positions = pos, .row_seq = row_seq, .n_seqs = ng,
                             .seqs = seqs, .n_logit_rows = n, .logit_rows = rows, .n_taps = r->n_taps,
                             .tap_layers = r->taps, .argmax_only = !sampled, .dev_tokens = gd->dev,
                             .dev_n = ng, .dev_cols = gd->k, .dev_row0 = 1, .dev_row_stride = gd->k + 1 };
    float *logits;
    dflash_backend *be = r->t->be;
    DFLASH_TRY(dflash_spec_mark(be, gd->dev, 0));
    DFLASH_TRY(dflash_qwen3_forward(r->t, &b, &logits, taps_out));
    if (!sampled) {
        DFLASH_TRY(dflash_spec_mark(be, gd->dev, 1));
        return dflash_spec_fetch(r->t, n, gd->dev, ng * gd->k, r->best, drafts);
    }
    /* sequences drawing by ids: every row drawn in one call (the others'
     * rows by argmax, unused), the ids into r->best; the others' logits
     * to the host */
    const int V = r->t->cfg.vocab_size;
    dflash_sample_row *draw = r->draw;
    const int32_t *drafts_at = r->t->s.in.ids; /* the forward's row tokens: a penalty reads the drafts there */
    spec_sampling *scratch = NULL;
    for (int j = 0; j < ng; j++) {
        many_seq *m = &r->ms[g[j]];
        /* the scratch: any drawing sequence's, one with room for counts if any has */
        if (m->ss.ids && (!scratch || (!scratch->host_counts && m->ss.host_counts)))
            scratch = &m->ss;
        for (int i = 0; i <= m->k; i++)
            draw[m->row0 + i] = m->ss.ids ? dflash_spec_sample_row(&m->ss, m->s + 1 + i, drafts_at + m->row0 + 1, i)
                                          : (dflash_sample_row){ .top_p = 1.0, .rep_penalty = 1.0 };
    }
    if (scratch) {
        DFLASH_TRY(dflash_spec_sample_rows(be, logits, n, V, draw, r->t->s.best, &scratch->smp, scratch->logits,
                                           scratch->host_counts));
        DFLASH_TRY(dflash_spec_mark(be, gd->dev, 1));
        DFLASH_TRY(dflash_spec_fetch(r->t, n, gd->dev, ng * gd->k, r->best, drafts));
    }
    for (int j = 0; j < ng; j++) {
        many_seq *m = &r->ms[g[j]];
        if (!m->ss.ids)
            DFLASH_TRY(be->ops->download(be, m->ss.logits, logits + (size_t)m->row0 * V,
                                         (size_t)(m->k + 1) * V * sizeof(float)));
    }
    return DFLASH_OK;
}

/* The waiting rows of the sequences g[0..ng) that have any go to the
 * proposer in one call; its time is added to *ms (when given) and to
 * those sequences' observe time. */
static dflash_status flush_pending(dflash_spec_batch *r, const int *g, int ng, double *ms)
{
    void *states[ng];
    dflash_ctx_rows rows[ng];
    int n = 0;
    for (int j = 0; j < ng; j++) {
        many_seq *m = &r->ms[g[j]];
        if (m->n_pend == 0)
            continue;
        states[n] = m->it->pstate;
        rows[n++] = (dflash_ctx_rows){ m->pend, m->n_pend, m->pend_pos0, m->pend_taps, r->tap_cols };
    }
    if (n == 0)
        return DFLASH_OK;
    const double t0 = dflash_spec_now_ms();
    dflash_status s = r->p->ops->after_verify(r->p, states, n, rows);
    const double dt = dflash_spec_now_ms() - t0;
    if (ms)
        *ms += dt;
    for (int j = 0; j < ng; j++) {
        many_seq *m = &r->ms[g[j]];
        if (m->n_pend)
            m->it->stats.observe_ms += dt;
        m->n_pend = 0;
    }
    return s;
}

/* Step 7 for a sequence that drafted nothing: its committed rows wait,
 * taps copied out of the forward's (the next forward overwrites them). */
static dflash_status pend_rows(dflash_spec_batch *r, many_seq *m, const dflash_ctx_rows *rows)
{
    if (m->n_pend == 0)
        m->pend_pos0 = rows->pos0;
    memcpy(m->pend + m->n_pend, rows->tokens, (size_t)rows->n * sizeof(int32_t));
    if (r->tap_cols) {
        dflash_backend *be = r->t->be;
        if (!m->pend_taps) /* at the first wait: a fixed width never needs it */
            DFLASH_TRY(dflash_be_alloc_f32(be, (size_t)r->B * (size_t)r->tap_cols, &m->pend_taps));
        DFLASH_TRY(be->ops->copy_rows(be, m->pend_taps + (int64_t)m->n_pend * r->tap_cols, r->tap_cols, rows->taps,
                                      r->tap_cols, NULL, rows->n, r->tap_cols));
    }
    m->n_pend += rows->n;
    return DFLASH_OK;
}

/* 4-7 for one group after its verify; *observe_ms gets the time 7 took. */
static dflash_status accept_group(dflash_spec_batch *r, const int *g, int ng, const float *tap_rows,
                                  double draft_ms, double verify_ms, double *observe_ms)
{
    const int V = r->t->cfg.vocab_size;
    dflash_ctx_rows acc[ng];
    int n_emit_of[ng], stopped_of[ng];
    /* 4 for sequences sampling on the host first, on every thread: each has its own
     * sampler and logits, and its host work (a filtered distribution of
     * the vocabulary per verified position) is most of a sampled step's
     * time. A thread's error message is kept for the loop after it, which
     * reports the first failing sampling sequence in group order. */
    int a_of[ng], any_sampled = 0;
    int32_t bonus_of[ng];
    dflash_status st_of[ng];
    for (int j = 0; j < ng; j++)
        any_sampled += r->ms[g[j]].sampled && !r->ms[g[j]].ss.ids;
#pragma omp parallel for schedule(dynamic) if (any_sampled > 1)
    for (int j = 0; j < ng; j++) {
        many_seq *m = &r->ms[g[j]];
        st_of[j] = DFLASH_OK;
        if (!m->sampled || m->ss.ids)
            continue;
        st_of[j] = dflash_spec_accept_sampled(&m->ss, r->t, m->s, m->it->stats.n_steps + 1, m->block, m->k, V,
                                              &a_of[j], &bonus_of[j]);
        if (st_of[j] != DFLASH_OK)
            snprintf(m->accept_err, sizeof m->accept_err, "%s", dflash_last_error());
    }
    for (int j = 0; j < ng; j++)
        if (st_of[j] != DFLASH_OK)
            return dflash_fail(st_of[j], "%s", r->ms[g[j]].accept_err);
    for (int j = 0; j < ng; j++) {
        many_seq *m = &r->ms[g[j]];
        dflash_spec_item *it = m->it;
        dflash_gen_stats *st = &it->stats;
        int a = 0;
        int32_t bonus;
        if (m->sampled && !m->ss.ids) {
            a = a_of[j];
            bonus = bonus_of[j];
        } else {
            const int32_t *gr = r->best + m->row0;
            DFLASH_TRY(dflash_spec_check_greedy(r->t, gr, m->k + 1, m->s + 1, st->n_steps + 1));
            while (a < m->k && m->block[a + 1] == gr[a])
                a++;
            bonus = gr[a];
            if (m->sampled)
                DFLASH_TRY(dflash_spec_count_step(&m->ss, m->block, a, bonus));
        }
        m->a = a;
        if (it->opts.on_step)
            it->opts.on_step(it->opts.step_user, m->s, m->block + 1, m->k, a, bonus);
        /* 5 COMMIT: d_1..d_a, bonus, cut by a stop token, a stop string or the budget */
        int32_t emitted[DFLASH_MAX_BLOCK];
        int stopped;
        const int n_emit = dflash_spec_commit(&it->opts, it->out, it->n_out, m->block, a, bonus, emitted, &stopped);
        stopped_of[j] = stopped;
        /* 6 ROLLBACK to t_s and every emitted token but the last */
        dflash_kv_seq_truncate(it->seq, m->s + n_emit);
        acc[j] = (dflash_ctx_rows){ m->block, n_emit, m->s, tap_rows ? tap_rows + m->row0 * r->tap_cols : NULL,
                                    r->tap_cols };
        n_emit_of[j] = n_emit;
        /* block[0..n_emit) are the rows the caches now hold; block[1..]
         * becomes the emitted tokens (equal but for the bonus at the end) */
        memcpy(m->block + 1, emitted, (size_t)n_emit * sizeof(int32_t));
        st->n_steps++;
        st->width_hist[m->k]++;
        st->accept_hist[n_emit]++;
        for (int i = 0; i < m->k; i++) {
            st->pos_tried[i]++;
            st->pos_accepted[i] += i < a;
        }
        st->draft_ms += draft_ms;
        st->verify_ms += verify_ms;
    }
    /* 7 OBSERVE: the rows each cache now holds. Those of sequences that
     * drafted go over at once, in one call (their waiting rows went before
     * the propose); those of sequences that drafted nothing wait, after
     * the rows already waiting go over if a block's worth would not fit. */
    *observe_ms = 0;
    if (r->p) {
        int full[ng], nf = 0;
        for (int j = 0; j < ng; j++)
            if (r->ms[g[j]].k == 0 && r->ms[g[j]].n_pend + n_emit_of[j] > r->B)
                full[nf++] = g[j];
        if (nf)
            DFLASH_TRY(flush_pending(r, full, nf, observe_ms));
        const double t0 = dflash_spec_now_ms();
        void *states[ng];
        dflash_ctx_rows now[ng];
        int n_now = 0;
        for (int j = 0; j < ng; j++) {
            many_seq *m = &r->ms[g[j]];
            if (m->k > 0) {
                states[n_now] = m->it->pstate;
                now[n_now++] = acc[j];
            } else {
                DFLASH_TRY(pend_rows(r, m, &acc[j]));
            }
        }
        if (n_now)
            DFLASH_TRY(r->p->ops->after_verify(r->p, states, n_now, now));
        const double dt = dflash_spec_now_ms() - t0;
        *observe_ms += dt;
        for (int j = 0; j < ng; j++)
            r->ms[g[j]].it->stats.observe_ms += dt;
    }
    int ended[ng], ne = 0;
    for (int j = 0; j < ng; j++) {
        DFLASH_TRY(emit(&r->ms[g[j]], r->ms[g[j]].block + 1, n_emit_of[j], stopped_of[j]));
        if (r->ms[g[j]].done)
            ended[ne++] = g[j];
    }
    /* a sequence that ends hands over what waits: a later start continues
     * it from caches that agree */
    if (r->p && ne)
        DFLASH_TRY(flush_pending(r, ended, ne, observe_ms));
    return DFLASH_OK;
}

/* One step of every sequence, group by group, at one width: B - 1 drafts,
 * or the cost-aware width's choice for the whole batch (fewer for a
 * sequence near its budget). With the width model, what the step did
 * feeds it back. */
static dflash_status step_groups(dflash_spec_batch *r)
{
    const int n = r->n, max_rows = r->t->opts.max_rows, max_seqs = r->t->opts.max_seqs;
    int g[n > 0 ? n : 1];
    int width = !r->p ? 0 : r->width_auto ? dflash_width_choose(&r->wm, r->B - 1) : r->B - 1;
    if (r->p && r->n_widths) {
        width = r->widths[r->steps % r->n_widths];
        width = width < 0 ? 0 : width > r->B - 1 ? r->B - 1 : width;
    }
    r->steps++;
    double propose_ms = 0, verify_ms = 0, observe_ms = 0;
    for (int i = 0; i < n; i++)
        r->ms[i].in_step = 0;
    for (int sampled = 0; sampled < 2; sampled++) {
        int ng = 0, rows = 0;
        for (int i = 0; i <= n; i++) {
            many_seq *m = i < n ? &r->ms[i] : NULL;
            int take = m && !m->done && m->prefilled == m->it->n_prompt && m->sampled == sampled;
            int need = 0;
            if (take) {
                int left = m->it->opts.n_new - m->it->n_out;
                m->k = width < left ? width : left;
                m->s = m->it->seq->len;
                m->block[0] = m->cur;
                m->a = 0;
                m->in_step = 1;
                need = m->k + 1;
            }
            /* run the group when the next sequence would not fit, or at the end */
            if (ng > 0 && (i == n || (take && (rows + need > max_rows || ng == max_seqs)))) {
                /* 2 PROPOSE, after the rows still waiting go over (their
                 * time is the sequences' observe; as in spec.c, the width
                 * model charges a drafting step only its own rows' hand-over) */
                if (r->p && width > 0)
                    DFLASH_TRY(flush_pending(r, g, ng, NULL));
                double t0 = dflash_spec_now_ms();
                int32_t gpos[max_seqs];
                group_drafts gd = { .pos = gpos };
                if (r->p && width > 0)
                    DFLASH_TRY(propose_group(r, g, ng, &gd));
                double t1 = dflash_spec_now_ms();
                float *tap_rows = NULL;
                int32_t drafts[max_rows];
                dflash_status vs = verify_group(r, g, ng, sampled, &tap_rows, &gd, drafts);
                if (gd.dev) {
                    vs = dflash_spec_dev_status(r->t->be, r->p, vs, gd.dev, drafts, ng, gd.pos, gd.k);
                    for (int j = 0; vs == DFLASH_OK && j < ng; j++)
                        memcpy(r->ms[g[j]].block + 1, drafts + j * gd.k, (size_t)gd.k * sizeof(int32_t));
                }
                DFLASH_TRY(vs);
                double draft_ms = t1 - t0, group_verify_ms = dflash_spec_now_ms() - t1;
                dflash_spec_split_ms(r->t->be, gd.dev, &group_verify_ms, &draft_ms);
                double obs = 0;
                DFLASH_TRY(accept_group(r, g, ng, tap_rows, draft_ms, group_verify_ms, &obs));
                propose_ms += draft_ms;
                verify_ms += group_verify_ms;
                observe_ms += obs;
                ng = rows = 0;
            }
            if (take) {
                g[ng++] = i;
                rows += need;
            }
        }
    }
    if (r->width_auto && r->p) {
        int ks[n > 0 ? n : 1], as[n > 0 ? n : 1], m = 0;
        for (int i = 0; i < n; i++)
            if (r->ms[i].in_step) {
                ks[m] = r->ms[i].k;
                as[m++] = r->ms[i].a;
            }
        /* a drafting step hands its rows to the drafter at once, a cost of
         * drafting, so it goes with the propose (a step that drafted
         * nothing leaves them waiting), as in spec.c */
        if (m > 0)
            dflash_width_observe_many(&r->wm, ks, as, m, width, verify_ms, propose_ms + observe_ms);
    }
    return DFLASH_OK;
}

static dflash_status check_item(const dflash_spec_batch *r, const dflash_spec_item *it)
{
    if (!it->seq || !it->prompt || !it->out || it->opts.n_new < 0 || (r->p && !it->pstate))
        return dflash_fail(DFLASH_ERR_INVALID_ARG, "batch: a sequence without cache, proposer state, prompt or output");
    return dflash_spec_check_start(r->t, it->seq, it->n_prompt, &it->opts, r->B, "batch");
}

dflash_status dflash_spec_batch_check(const dflash_spec_batch *r, const dflash_spec_item *it)
{
    return check_item(r, it);
}

int dflash_spec_batch_block(const dflash_spec_batch *r)
{
    return r->B;
}

/* The sequence at index i leaves: final statistics, buffers freed; the
 * ones after it move up, so the array stays in join order (prefill_step
 * serves the oldest first). */
static void leave(dflash_spec_batch *r, int i)
{
    many_seq *m = &r->ms[i];
    dflash_gen_stats *st = &m->it->stats;
    st->total_ms = dflash_spec_now_ms() - m->t_join;
    dflash_spec_final_stats(st, m->it->n_out);
    if (m->sampled)
        dflash_spec_sampling_free(&m->ss);
    if (m->pend_taps)
        r->t->be->ops->free(r->t->be, m->pend_taps);
    memmove(&r->ms[i], &r->ms[i + 1], (size_t)(r->n - i - 1) * sizeof *r->ms);
    r->n--;
}

dflash_status dflash_spec_batch_new(dflash_qwen3 *target, dflash_proposer *p, int block_size, int max_seqs,
                                    dflash_spec_batch **out)
{
    *out = NULL;
    int B;
    DFLASH_TRY(dflash_spec_block(target, p, block_size, "batch", &B));
    if (max_seqs <= 0)
        return dflash_fail(DFLASH_ERR_INVALID_ARG, "batch: room for %d sequences", max_seqs);
    dflash_spec_batch *r = calloc(1, sizeof *r);
    if (r) {
        r->ms = calloc((size_t)max_seqs, sizeof *r->ms);
        r->best = malloc((size_t)target->opts.max_rows * sizeof *r->best);
        r->draw = malloc((size_t)target->opts.max_rows * sizeof *r->draw);
    }
    if (!r || !r->ms || !r->best || !r->draw) {
        dflash_spec_batch_free(r);
        return dflash_fail(DFLASH_ERR_OOM, "batch: out of memory for %d sequences", max_seqs);
    }
    r->t = target;
    r->p = p;
    r->B = B;
    r->cap = max_seqs;
    r->n_taps = p ? p->ops->tap_layers(p, &r->taps) : 0;
    r->tap_cols = (int64_t)r->n_taps * target->cfg.hidden_size;
    *out = r;
    return DFLASH_OK;
}

void dflash_spec_batch_set_widths(dflash_spec_batch *r, const int *widths, int n)
{
    r->widths = n > 0 ? widths : NULL;
    r->n_widths = n > 0 ? n : 0;
}

void dflash_spec_batch_set_width_auto(dflash_spec_batch *r, int on)
{
    r->width_auto = on;
    dflash_width_init(&r->wm, r->B - 1);
}

dflash_status dflash_spec_batch_add(dflash_spec_batch *r, dflash_spec_item *it)
{
    if (r->n == r->cap)
        return dflash_fail(DFLASH_ERR_INVALID_ARG, "batch: already %d sequences, its room", r->cap);
    DFLASH_TRY(check_item(r, it));
    memset(&it->stats, 0, sizeof it->stats);
    it->stats.n_prompt = it->n_prompt;
    it->n_out = 0;
    many_seq *m = &r->ms[r->n];
    memset(m, 0, sizeof *m);
    m->it = it;
    m->t_join = dflash_spec_now_ms();
    m->len0 = it->seq->len;
    if (!dflash_sampler_is_greedy(&it->opts.sampler)) {
        DFLASH_TRY(dflash_spec_sampling_init(&m->ss, r->t, &it->opts.sampler, r->B, "batch"));
        m->sampled = 1;
    }
    const dflash_status s = dflash_spec_prefill_begin(&it->opts, m->sampled ? &m->ss : NULL, it->prompt,
                                                      it->n_prompt);
    if (s != DFLASH_OK) {
        if (m->sampled)
            dflash_spec_sampling_free(&m->ss);
        return s;
    }
    r->n++; /* from here on the slot is ours: leave() frees it */
    it->status = DFLASH_OK;
    it->error[0] = 0;
    m->cur = -1;
    return DFLASH_OK;
}

/* 1 PREFILL in this step: up to max_rows prompt rows over the joining
 * sequences, oldest first; a sequence whose last rows ran emits its
 * first token. A failure ends that sequence alone. */
static void prefill_step(dflash_spec_batch *r)
{
    int budget = r->t->opts.max_rows;
    for (int i = 0; i < r->n && budget > 0; i++) {
        many_seq *m = &r->ms[i];
        dflash_spec_item *it = m->it;
        const int left = it->n_prompt - m->prefilled;
        if (left == 0 || m->done)
            continue;
        const int n = left < budget ? left : budget, last = n == left;
        const double t0 = dflash_spec_now_ms();
        dflash_status s = dflash_spec_prefill_chunk(r->t, it->seq, r->p, it->pstate, it->prompt + m->prefilled, n, last,
                                                    m->sampled ? &m->ss : NULL, &m->cur);
        budget -= n;
        if (s == DFLASH_OK) {
            m->prefilled += n;
            if (last)
                s = dflash_spec_prefill_finish(r->t, it->seq, &it->opts, m->sampled ? &m->ss : NULL, &m->cur);
        }
        it->stats.prefill_ms += dflash_spec_now_ms() - t0;
        if (s == DFLASH_OK && last && it->opts.n_new > 0)
            s = emit(m, &m->cur, 1, dflash_spec_first_stops(&it->opts, it->out, it->n_out, m->cur));
        if (s != DFLASH_OK) {
            it->status = s;
            snprintf(it->error, sizeof it->error, "%s", dflash_last_error());
        }
        if (s != DFLASH_OK || (last && it->opts.n_new <= 0))
            m->done = 1;
    }
}

dflash_status dflash_spec_batch_step(dflash_spec_batch *r, int *n_active)
{
    prefill_step(r);
    dflash_status s = r->n ? step_groups(r) : DFLASH_OK;
    for (int i = r->n - 1; i >= 0; i--)
        if (r->ms[i].done || s != DFLASH_OK)
            leave(r, i);
    if (s == DFLASH_OK)
        s = r->t->be->ops->sync(r->t->be);
    *n_active = r->n;
    return s;
}

int dflash_spec_batch_has(const dflash_spec_batch *r, const dflash_spec_item *it)
{
    for (int i = 0; i < r->n; i++)
        if (r->ms[i].it == it)
            return 1;
    return 0;
}

void dflash_spec_batch_drop(dflash_spec_batch *r, const dflash_spec_item *it)
{
    for (int i = 0; i < r->n; i++)
        if (r->ms[i].it == it) {
            leave(r, i);
            return;
        }
}

dflash_status dflash_spec_batch_remove(dflash_spec_batch *r, const dflash_spec_item *it)
{
    for (int i = 0; i < r->n; i++)
        if (r->ms[i].it == it) {
            /* the rows still waiting go to the proposer, so both caches
             * agree; if that fails, the target's goes back to where the
             * proposer's rows end, and the output with it (the last token
             * it keeps is the unverified one) */
            many_seq *m = &r->ms[i];
            dflash_status s = r->p ? flush_pending(r, &i, 1, NULL) : DFLASH_OK;
            if (s != DFLASH_OK) {
                dflash_kv_seq_truncate(m->it->seq, m->pend_pos0);
                const int keep = m->pend_pos0 - (m->len0 + m->it->n_prompt) + 1;
                if (keep < m->it->n_out)
                    m->it->n_out = keep;
            }
            leave(r, i);
            return s;
        }
    return DFLASH_OK;
}

void dflash_spec_batch_free(dflash_spec_batch *r)
{
    if (!r)
        return;
    while (r->n > 0)
        leave(r, r->n - 1);
    free(r->ms);
    free(r->best);
    free(r->draw);
    free(r);
}

dflash_status dflash_spec_generate_many(dflash_qwen3 *target, dflash_proposer *p, dflash_spec_item *items, int n,
                                        int block_size, int width_auto)
{
    if (n <= 0 || !items)
        return dflash_fail(DFLASH_ERR_INVALID_ARG, "generate many: %d sequences", n);
    dflash_spec_batch *r;
    DFLASH_TRY(dflash_spec_batch_new(target, p, block_size, n, &r));
    dflash_spec_batch_set_width_auto(r, width_auto);
    dflash_status s = DFLASH_OK;
    for (int i = 0; i < n && s == DFLASH_OK; i++)
        s = dflash_spec_batch_add(r, &items[i]);
    for (int active = r->n; s == DFLASH_OK && active > 0;)
        s = dflash_spec_batch_step(r, &active);
    dflash_spec_batch_free(r);
    for (int i = 0; i < n && s == DFLASH_OK; i++)
        if (items[i].status != DFLASH_OK)
            s = dflash_fail(items[i].status, "%s", items[i].error);
    return s;
}
