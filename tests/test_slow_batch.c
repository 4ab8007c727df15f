/* test_slow_batch.c: batch invariance of the pieces a many-sequence engine
 * steps together. Three sequences of different lengths run through one
 * target forward give, row for row, the same logits and tap rows (bit for
 * bit) as each sequence run alone, on a prefill and on a later verify-sized
 * step over the cached rows; and one DFlash propose over the three gives
 * each the drafts it gets alone, before and after an after_verify that
 * hands all three their accepted rows in one call. Then the loop built on
 * them: dflash_spec_generate_many gives every sequence the output
 * dflash_spec_generate gives it alone (greedy, seeded sampling, a
 * repetition penalty, a stop token, a budget of one token), with the
 * drafter and without, with more rows than one forward takes; and with
 * sequences joining between steps and one cancelled midway (its output a
 * prefix of its own, its caches consistent). All of it on a Qwen3 target
 * and again on a Qwen3-MoE and on a Qwen3.5 hybrid. */
#include "harness.h"

#include <stdlib.h>
#include <string.h>

#include "draft/dflash_head.h"
#include "fixture.h"
#include "spec/spec.h"
#include "spec/spec_internal.h"
#include "step_log.h"

#define N_SEQ 3
#define MAX_ROWS 64

static dflash_backend *be;
static dflash_qwen3 *g_t;
static dflash_head *g_h;
static const int k_prompt_len[N_SEQ] = { 7, 13, 5 };
static const int k_step_len = 4; /* rows per sequence of the second forward */

static void tokens_for(int q, int n, int first, int32_t *out)
{
    for (int i = 0; i < n; i++)
        out[i] = (int32_t)(((first + i) * 37 + q * 101 + 11) % g_t->cfg.vocab_size);
}

/* Logits [n, V] and taps [n, tap_cols] of a forward, copied to the host. */
typedef struct rows_out {
    float *logits, *taps;
} rows_out;

static int64_t tap_cols(void)
{
    const int *layers;
    return (int64_t)g_h->proposer.ops->tap_layers(&g_h->proposer, &layers) * g_t->cfg.hidden_size;
}

/* One forward of rows of `n_seqs` sequences: seq q contributes n[q] rows
 * (tokens tok[q], positions from its cache length). Outputs row-major in
 * the order given, into o (host, allocated here). */
static void forward(dflash_kv_seq **seqs, int n_seqs, const int *n, int32_t *const *tok, rows_out *o)
{
    int32_t tokens[MAX_ROWS], pos[MAX_ROWS], row_seq[MAX_ROWS], rows[MAX_ROWS];
    int r = 0;
    for (int q = 0; q < n_seqs; q++)
        for (int i = 0; i < n[q]; i++, r++) {
            tokens[r] = tok[q][i];
            pos[r] = seqs[q]->len + i;
            row_seq[r] = q;
            rows[r] = r;
        }
    const int *layers;
    int n_taps = g_h->proposer.ops->tap_layers(&g_h->proposer, &layers);
    dflash_qwen3_batch b = { .n_rows = r, .tokens = tokens, .positions = pos, .row_seq = row_seq,
                             .n_seqs = n_seqs, .seqs = seqs, .n_logit_rows = r, .logit_rows = rows,
                             .n_taps = n_taps, .tap_layers = layers };
    float *logits = NULL, *taps = NULL;
    const size_t V = (size_t)g_t->cfg.vocab_size, T = (size_t)tap_cols();
    o->logits = malloc((size_t)r * V * sizeof(float));
    o->taps = malloc((size_t)r * T * sizeof(float));
    CHECK_OK(dflash_qwen3_forward(g_t, &b, &logits, &taps));
    CHECK_OK(be->ops->download(be, o->logits, logits, (size_t)r * V * sizeof(float)));
    CHECK_OK(be->ops->download(be, o->taps, taps, (size_t)r * T * sizeof(float)));
}

/* The rows of sequence q in a batched output equal its rows alone. */
static void check_rows(const rows_out *all, int off, const rows_out *one, int n, int q, const char *what)
{
    const size_t V = (size_t)g_t->cfg.vocab_size, T = (size_t)tap_cols();
    CHECKF(!memcmp(all->logits + (size_t)off * V, one->logits, (size_t)n * V * sizeof(float)),
           "%s: seq %d: logits differ from the sequence run alone", what, q);
    CHECKF(!memcmp(all->taps + (size_t)off * T, one->taps, (size_t)n * T * sizeof(float)),
           "%s: seq %d: tap rows differ from the sequence run alone", what, q);
}

static void rows_free(rows_out *o)
{
    free(o->logits);
    free(o->taps);
}

static void test_target_and_proposer(void)
{
    dflash_kv_seq alone[N_SEQ], both[N_SEQ], *pa[N_SEQ], *pb[N_SEQ];
    void *st_alone[N_SEQ], *st_both[N_SEQ];
    int32_t prompt[N_SEQ][16], step[N_SEQ][8], *pp[N_SEQ], *ps[N_SEQ];
    int n_step[N_SEQ];
    rows_out one[N_SEQ], all;
    for (int q = 0; q < N_SEQ; q++) {
        tokens_for(q, k_prompt_len[q], 0, prompt[q]);
        tokens_for(q, k_step_len, 50, step[q]);
        pp[q] = prompt[q];
        ps[q] = step[q];
        n_step[q] = k_step_len;
        CHECK_OK(dflash_qwen3_seq_init(g_t, &alone[q]));
        CHECK_OK(dflash_qwen3_seq_init(g_t, &both[q]));
        pa[q] = &alone[q];
        pb[q] = &both[q];
        CHECK_OK(g_h->proposer.ops->alloc_state(&g_h->proposer, 100, &st_alone[q]));
        CHECK_OK(g_h->proposer.ops->alloc_state(&g_h->proposer, 100, &st_both[q]));
    }
    const int64_t T = tap_cols();

    /* prefill: each alone, then all three in one forward */
    forward(pb, N_SEQ, k_prompt_len, pp, &all);
    for (int q = 0, off = 0; q < N_SEQ; off += k_prompt_len[q], q++) {
        forward(&pa[q], 1, &k_prompt_len[q], &pp[q], &one[q]);
        check_rows(&all, off, &one[q], k_prompt_len[q], q, "prefill");
        CHECK(both[q].len == alone[q].len && alone[q].len == k_prompt_len[q]);
        /* the drafter takes the prompt rows (taps from the alone run: they
         * were just checked equal) */
        dflash_ctx_rows r = { prompt[q], k_prompt_len[q], 0, one[q].taps, T };
        CHECK_OK(g_h->proposer.ops->begin(&g_h->proposer, st_alone[q], &r));
        CHECK_OK(g_h->proposer.ops->begin(&g_h->proposer, st_both[q], &r));
    }

    /* proposes: one over three sequences, and each alone */
    const int nd = g_h->block_size - 1;
    int32_t last[N_SEQ], posn[N_SEQ], d_all[N_SEQ * 16], d_one[16];
    for (int pass = 0; pass < 2; pass++) {
        for (int q = 0; q < N_SEQ; q++) {
            last[q] = step[q][0];
            posn[q] = alone[q].len;
        }
        CHECK_OK(g_h->proposer.ops->propose(&g_h->proposer, st_both, N_SEQ, last, posn, nd, d_all));
        for (int q = 0; q < N_SEQ; q++) {
            CHECK_OK(g_h->proposer.ops->propose(&g_h->proposer, &st_alone[q], 1, &last[q], &posn[q], nd, d_one));
            CHECKF(!memcmp(d_all + q * nd, d_one, (size_t)nd * sizeof(int32_t)),
                   "pass %d: seq %d: drafts of the 3-sequence propose differ from its own", pass, q);
        }
        if (pass == 1)
            break;

        /* a verify-sized step over the cached rows, batched and alone */
        rows_out all2, one2[N_SEQ];
        forward(pb, N_SEQ, n_step, ps, &all2);
        for (int q = 0, off = 0; q < N_SEQ; off += k_step_len, q++) {
            forward(&pa[q], 1, &n_step[q], &ps[q], &one2[q]);
            check_rows(&all2, off, &one2[q], k_step_len, q, "verify step");
        }
        /* "accepted": q + 1 rows of sequence q; the caches roll back to
         * them, and the drafter gets them in one call for all three */
        dflash_ctx_rows acc[N_SEQ];
        for (int q = 0; q < N_SEQ; q++) {
            int32_t keep = k_prompt_len[q] + q + 1;
            dflash_kv_seq_truncate(&alone[q], keep);
            dflash_kv_seq_truncate(&both[q], keep);
            acc[q] = (dflash_ctx_rows){ step[q], q + 1, k_prompt_len[q], one2[q].taps, T };
            CHECK_OK(g_h->proposer.ops->after_verify(&g_h->proposer, &st_alone[q], 1, &acc[q]));
            step[q][0] = step[q][q + 1]; /* the next step's last token */
        }
        CHECK_OK(g_h->proposer.ops->after_verify(&g_h->proposer, st_both, N_SEQ, acc));
        rows_free(&all2);
        for (int q = 0; q < N_SEQ; q++)
            rows_free(&one2[q]);
    }

    rows_free(&all);
    for (int q = 0; q < N_SEQ; q++) {
        rows_free(&one[q]);
        g_h->proposer.ops->free_state(&g_h->proposer, st_alone[q]);
        g_h->proposer.ops->free_state(&g_h->proposer, st_both[q]);
        dflash_qwen3_seq_free(g_t, &alone[q]);
        dflash_qwen3_seq_free(g_t, &both[q]);
    }
}

#define N_ITEMS 5
#define MAX_NEW 40

/* Item i's prompt and options; `stop` (-1: none) ends it early. */
static void item_setup(int i, int32_t *prompt, int *n_prompt, dflash_gen_opts *o, int32_t *stop)
{
    static const int len[N_ITEMS] = { 7, 13, 5, 20, 9 }, n_new[N_ITEMS] = { 30, 17, 1, 25, MAX_NEW };
    *n_prompt = len[i];
    tokens_for(i, len[i], 3, prompt);
    dflash_gen_default_opts(o);
    o->n_new = n_new[i];
    if (i == 1) { /* sampling, seeded */
        o->sampler.temperature = 0.9;
        o->sampler.top_k = 40;
        o->sampler.seed = 1000 + (uint64_t)i;
    }
    if (i == 3) { /* greedy under every penalty: each row reads the drafts before it */
        o->sampler.rep_penalty = 1.3;
        o->sampler.frequency_penalty = 0.5;
        o->sampler.presence_penalty = 0.3;
    }
    if (*stop >= 0) {
        o->stop_ids = stop;
        o->n_stop = 1;
    }
}

/* Item i alone (dflash_spec_generate, the same block at a fixed width):
 * its output, prompt length, steps and first-position drafts tried. */
static void alone_run(dflash_proposer *p, int i, int32_t *prompt, int32_t *stop, int32_t *out, int *n_out,
                      dflash_gen_opts *o, int *n_prompt, dflash_gen_stats *st)
{
    item_setup(i, prompt, n_prompt, o, stop);
    o->block_size = g_h->block_size;
    dflash_kv_seq sq;
    void *ps = NULL;
    CHECK_OK(dflash_qwen3_seq_init(g_t, &sq));
    if (p)
        CHECK_OK(p->ops->alloc_state(p, 100, &ps));
    CHECK_OK(dflash_spec_generate(g_t, &sq, p, ps, prompt, *n_prompt, o, out, n_out, st));
    if (p)
        p->ops->free_state(p, ps);
    dflash_qwen3_seq_free(g_t, &sq);
}

static void test_generate_many_equals_alone(void)
{
    /* plain, the drafter at the full block, the drafter at the batch's
     * cost-aware width (the same outputs; its steps may differ) */
    for (int mode = 0; mode < 3; mode++) {
        dflash_proposer *p = mode ? &g_h->proposer : NULL;
        const int width_auto = mode == 2;
        int32_t prompt[N_ITEMS][32], alone[N_ITEMS][MAX_NEW], out[N_ITEMS][MAX_NEW], stop[N_ITEMS];
        int n_alone[N_ITEMS], steps_alone[N_ITEMS];
        int64_t tried_alone[N_ITEMS];
        dflash_spec_item items[N_ITEMS];
        dflash_kv_seq seqs[N_ITEMS];
        void *states[N_ITEMS] = { 0 };
        for (int i = 0; i < N_ITEMS; i++) {
            stop[i] = -1;
            dflash_gen_opts o;
            dflash_gen_stats st;
            int np;
            if (i == 0) { /* stop at its 12th token alone */
                alone_run(NULL, i, prompt[i], &stop[i], alone[i], &n_alone[i], &o, &np, &st);
                stop[i] = alone[i][11];
            }
            alone_run(p, i, prompt[i], &stop[i], alone[i], &n_alone[i], &o, &np, &st);
            steps_alone[i] = st.n_steps;
            tried_alone[i] = st.pos_tried[0];
            /* the item of the batched run */
            CHECK_OK(dflash_qwen3_seq_init(g_t, &seqs[i]));
            if (p)
                CHECK_OK(p->ops->alloc_state(p, 100, &states[i]));
            items[i] = (dflash_spec_item){ .seq = &seqs[i], .pstate = states[i], .prompt = prompt[i],
                                           .n_prompt = np, .opts = o, .out = out[i] };
        }
        CHECK_OK(dflash_spec_generate_many(g_t, p, items, N_ITEMS, 0, width_auto));
        for (int i = 0; i < N_ITEMS; i++) {
            CHECKF(items[i].n_out == n_alone[i] && !memcmp(out[i], alone[i], (size_t)n_alone[i] * sizeof(int32_t)),
                   "%s: sequence %d: %d tokens together, %d alone, or they differ", p ? "drafter" : "plain", i,
                   items[i].n_out, n_alone[i]);
            /* at the full block the same drafts were proposed and
             * accepted: the same steps */
            CHECKF(width_auto || (items[i].stats.n_steps == steps_alone[i] &&
                                  items[i].stats.pos_tried[0] == tried_alone[i]),
                   "sequence %d: %d steps together, %d alone", i, items[i].stats.n_steps, steps_alone[i]);
            /* the cache holds the prompt and every token but the last */
            CHECK(seqs[i].len == items[i].n_prompt + items[i].n_out - 1);
            if (p)
                p->ops->free_state(p, states[i]);
            dflash_qwen3_seq_free(g_t, &seqs[i]);
        }
        CHECK(items[0].stats.stopped && items[0].n_out == 12 && items[2].n_out == 1);
        CHECK(p ? tried_alone[4] > 0 : tried_alone[4] == 0);
        if (width_auto) { /* the model chose widths other than the full block */
            int64_t full = 0, steps = 0;
            for (int i = 0; i < N_ITEMS; i++) {
                full += items[i].stats.width_hist[g_h->proposer.ops->block_size(&g_h->proposer) - 1];
                steps += items[i].stats.n_steps;
            }
            CHECKF(full < steps, "the auto width drafted the full block in all %lld steps", (long long)steps);
        }
    }
}

/* Item i alone (its output into alone[], via alone_run), then as a batch
 * item with fresh caches, its steps reported into `log` when given. */
static void batch_item(dflash_proposer *p, int i, int32_t *prompt, int32_t *stop, int32_t *alone, int *n_alone,
                       step_log *log, dflash_kv_seq *seq, void **state, int32_t *out, dflash_spec_item *item)
{
    dflash_gen_opts o;
    dflash_gen_stats st;
    int np;
    alone_run(p, i, prompt, stop, alone, n_alone, &o, &np, &st);
    if (log) {
        memset(log, 0, sizeof *log);
        o.on_step = step_log_add;
        o.step_user = log;
    }
    CHECK_OK(dflash_qwen3_seq_init(g_t, seq));
    CHECK_OK(p->ops->alloc_state(p, 100, state));
    *item = (dflash_spec_item){ .seq = seq, .pstate = *state, .prompt = prompt, .n_prompt = np, .opts = o,
                                .out = out };
}

static void test_join_and_leave(void)
{
    dflash_proposer *p = &g_h->proposer;
    int32_t prompt[N_ITEMS][32], alone[N_ITEMS][MAX_NEW], out[N_ITEMS][MAX_NEW], stop = -1;
    int n_alone[N_ITEMS];
    dflash_spec_item items[N_ITEMS];
    dflash_kv_seq seqs[N_ITEMS];
    void *states[N_ITEMS];
    for (int i = 1; i < N_ITEMS; i++)
        batch_item(p, i, prompt[i], &stop, alone[i], &n_alone[i], NULL, &seqs[i], &states[i], out[i], &items[i]);
    dflash_spec_batch *b;
    CHECK_OK(dflash_spec_batch_new(g_t, p, 0, N_ITEMS, &b));
    if (!b)
        return;
    /* 4 and 3 from the start, 1 joins after 2 steps, 2 (one token) after
     * 3; 3 is cancelled after 4 steps */
    int active = 0;
    CHECK_OK(dflash_spec_batch_add(b, &items[4]));
    CHECK_OK(dflash_spec_batch_add(b, &items[3]));
    for (int step = 0; step < 200; step++) {
        if (step == 2)
            CHECK_OK(dflash_spec_batch_add(b, &items[1]));
        if (step == 3)
            CHECK_OK(dflash_spec_batch_add(b, &items[2]));
        if (step == 4)
            CHECK_OK(dflash_spec_batch_remove(b, &items[3]));
        CHECK_OK(dflash_spec_batch_step(b, &active));
        if (active == 0 && step >= 4)
            break;
    }
    CHECK(active == 0);
    for (int i = 1; i < N_ITEMS; i++) {
        int full = i != 3;
        CHECKF(full ? items[i].n_out == n_alone[i] : items[i].n_out > 1 && items[i].n_out < n_alone[i],
               "sequence %d: %d tokens, %d alone", i, items[i].n_out, n_alone[i]);
        CHECKF(!memcmp(out[i], alone[i], (size_t)items[i].n_out * sizeof(int32_t)),
               "sequence %d: output differs from its own alone", i);
        CHECK(seqs[i].len == items[i].n_prompt + items[i].n_out - 1);
        p->ops->free_state(p, states[i]);
        dflash_qwen3_seq_free(g_t, &seqs[i]);
    }
    dflash_spec_batch_free(b);
}

/* What a fresh drafter state proposes (k drafts after cur at position
 * s) once it took the committed rows full[0..s) in one call: the
 * reference for a state that took them step by step or deferred. */
static void fresh_drafts(dflash_proposer *p, const int32_t *full, int s, int k, int32_t *drafts)
{
    dflash_kv_seq sq;
    void *ps = NULL;
    int32_t unused;
    CHECK_OK(dflash_qwen3_seq_init(g_t, &sq));
    CHECK_OK(p->ops->alloc_state(p, 100, &ps));
    if (ps) {
        for (int done = 0; done < s;) { /* the target takes at most MAX_ROWS rows a call */
            const int n = s - done < MAX_ROWS ? s - done : MAX_ROWS;
            CHECK_OK(dflash_spec_prefill_chunk(g_t, &sq, p, ps, full + done, n, 0, NULL, &unused));
            done += n;
        }
        const int32_t pos = s;
        CHECK_OK(p->ops->propose(p, &ps, 1, &full[s], &pos, k, drafts));
        p->ops->free_state(p, ps);
    }
    dflash_qwen3_seq_free(g_t, &sq);
}

/* Steps that draft nothing leave their rows waiting for the drafter, and
 * the next drafting step hands them over first (or a full block of them
 * goes over at once). With the widths forced to a pattern of plain and
 * drafting steps: every output equals its own alone, every drafting step
 * of every sequence proposes exactly what a fresh drafter state proposes
 * after taking that sequence's committed context in one call, and so does
 * each sequence's state once it is done (what waited went over at its
 * end). A sequence removed after plain steps leaves a drafter state that
 * proposes what a fresh one does. */
static void test_deferred_handover(void)
{
    dflash_proposer *p = &g_h->proposer;
    /* plain and drafting steps; the run of ten plain steps passes the
     * drafter's block of 8 (the waiting rows go over when full) */
    static const int widths[] = { 0, 0, 0, 5, 0, 0, 15, 0, 1, 0, 0, 0, 0, 3, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 4 };
    static int32_t prompt[N_ITEMS][32], alone[N_ITEMS][MAX_NEW], out[N_ITEMS][MAX_NEW], full[MAX_NEW + 32];
    static step_log logs[N_ITEMS];
    int32_t stop = -1, drafts[DFLASH_MAX_BLOCK];
    int n_alone[N_ITEMS];
    dflash_spec_item items[N_ITEMS];
    dflash_kv_seq seqs[N_ITEMS];
    void *states[N_ITEMS];
    for (int phase = 0; phase < 2; phase++) {
        for (int i = 0; i < N_ITEMS; i++)
            batch_item(p, i, prompt[i], &stop, alone[i], &n_alone[i], &logs[i], &seqs[i], &states[i], out[i],
                       &items[i]);
        dflash_spec_batch *b;
        CHECK_OK(dflash_spec_batch_new(g_t, p, 0, N_ITEMS, &b));
        if (!b)
            return;
        static const int plain[] = { 0 };
        dflash_spec_batch_set_widths(b, phase ? plain : widths, phase ? 1 : (int)(sizeof widths / sizeof *widths));
        for (int i = 0; i < N_ITEMS; i++)
            CHECK_OK(dflash_spec_batch_add(b, &items[i]));
        int active = 1;
        for (int step = 0; step < 300 && active; step++) {
            CHECK_OK(dflash_spec_batch_step(b, &active));
            if (phase && step == 6) { /* item 4 leaves with the rows of its plain steps waiting */
                CHECK_OK(dflash_spec_batch_remove(b, &items[4]));
                break;
            }
        }
        int checked = 0;
        for (int i = 0; i < N_ITEMS; i++) {
            const dflash_spec_item *it = &items[i];
            const int n_full = it->n_prompt + it->n_out;
            memcpy(full, it->prompt, (size_t)it->n_prompt * sizeof(int32_t));
            memcpy(full + it->n_prompt, it->out, (size_t)it->n_out * sizeof(int32_t));
            if (phase == 0) {
                CHECKF(it->n_out == n_alone[i] && !memcmp(it->out, alone[i], (size_t)it->n_out * sizeof(int32_t)),
                       "sequence %d: output differs from its own alone", i);
                for (int j = 0; j < logs[i].n && j < STEP_LOG_MAX; j++) {
                    const step_rec *r = &logs[i].steps[j];
                    if (r->k == 0 || r->pos >= n_full)
                        continue;
                    fresh_drafts(p, full, r->pos, r->k, drafts);
                    CHECKF(!memcmp(drafts, r->drafts, (size_t)r->k * sizeof(int32_t)),
                           "sequence %d step %d (position %d, %d drafts): drafts differ from a fresh state's", i, j,
                           r->pos, r->k);
                    checked++;
                }
                /* done: what waited went over at the end, so the next
                 * propose (a continuation's) is a fresh state's */
                const int len = seqs[i].len, k = g_h->block_size - 1;
                int32_t mine[DFLASH_MAX_BLOCK];
                const int32_t pos = len;
                CHECK(len == n_full - 1);
                CHECK_OK(p->ops->propose(p, &states[i], 1, &full[len], &pos, k, mine));
                fresh_drafts(p, full, len, k, drafts);
                CHECKF(!memcmp(drafts, mine, (size_t)k * sizeof(int32_t)),
                       "sequence %d, done: its drafter state proposes other drafts than a fresh one", i);
            } else if (i == 4) {
                /* its state holds full[0..len): the next propose is a fresh state's */
                const int len = seqs[4].len, k = g_h->block_size - 1;
                CHECK(len == it->n_prompt + it->n_out - 1 && it->n_out > 1);
                int32_t mine[DFLASH_MAX_BLOCK];
                const int32_t pos = len;
                CHECK_OK(p->ops->propose(p, &states[4], 1, &full[len], &pos, k, mine));
                fresh_drafts(p, full, len, k, drafts);
                CHECKF(!memcmp(drafts, mine, (size_t)k * sizeof(int32_t)),
                       "removed after plain steps: its drafter state proposes other drafts than a fresh one");
                checked++;
            }
        }
        CHECKF(phase ? checked == 1 : checked >= 10, "phase %d: %d drafting steps checked", phase, checked);
        dflash_spec_batch_free(b);
        for (int i = 0; i < N_ITEMS; i++) {
            p->ops->free_state(p, states[i]);
            dflash_qwen3_seq_free(g_t, &seqs[i]);
        }
    }
}

int main(void)
{
    CHECK_OK(dflash_backend_cpu_create(&be));
    /* Each test on a Qwen3 target, then on a Qwen3-MoE of the same
     * geometry (hidden 96, vocabulary 640, 3 layers: the drafter d2_tied
     * fits both), whose rows are routed to experts one by one, then on a
     * Qwen3.5 hybrid (hidden 64, vocabulary 512: d6_moe's drafter fits),
     * whose sequences each carry a recurrent state. */
    static const char *const targets[][3] = { { "qwen3", "gqa_tied", "d2_tied" },
                                              { "qwen3_moe", "moe_experts", "d2_tied" },
                                              { "qwen35", "q35_dense", "d6_moe" } };
    for (size_t k = 0; k < sizeof targets / sizeof targets[0]; k++) {
        char tdir[512], ddir[512];
        dflash_qwen3_opts to;
        dflash_qwen3_default_opts(&to);
        to.max_ctx = 128;
        to.max_rows = MAX_ROWS;
        to.max_seqs = 2 * N_SEQ; /* 6: five items, more rows than MAX_ROWS */
        g_t = NULL;
        g_h = NULL;
        CHECK_OK(dflash_qwen3_load(fx_path(tdir, sizeof tdir, targets[k][0], targets[k][1]), be, &to, &g_t));
        dflash_head_opts ho;
        dflash_head_default_opts(&ho);
        ho.max_ctx = 128;
        ho.max_seqs = 2 * N_SEQ;
        if (g_t)
            CHECK_OK(dflash_head_load(fx_path(ddir, sizeof ddir, "dflash", targets[k][2]), g_t, &ho, &g_h));
        if (g_h) {
            printf("target %s/%s\n", targets[k][0], targets[k][1]);
            RUN(test_target_and_proposer);
            RUN(test_generate_many_equals_alone);
            RUN(test_join_and_leave);
            RUN(test_deferred_handover);
        }
        dflash_head_free(g_h);
        dflash_qwen3_free(g_t);
    }
    dflash_backend_destroy(be);
    TEST_END();
}
