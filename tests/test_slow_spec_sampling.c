/* test_slow_spec_sampling.c: speculative sampling keeps the target's
 * distribution, statistically, and a wrong acceptance rule is caught.
 *
 * Three experiments, each a target, a proposer, a prompt and sampler
 * settings whose drafts are accepted often (asserted: 15% to 85%), so both
 * the accept and the reject/resample paths run many times:
 *   - own: a tiny Qwen3 the test writes itself (tests/testmodel.h), V = 32,
 *     whose LM head is built from the embedding so that after token t the
 *     likely next tokens are t+1..t+8 (mod V), t+1 the likeliest; the
 *     layers are random and weak, so the distribution still depends on the
 *     context. The prompt is the cycle 8, 9, ..., 31, 0, ..., 7, so the
 *     n-gram proposer always finds the sampled token earlier and drafts its
 *     successors. Temperature 1, top-k 8.
 *   - penalty: the same kind of model, but t itself is nearly as likely
 *     after t as t+1, the prompt is 16..31 (half the vocabulary), the
 *     successor proposer (tests/oracle_proposer.h) drafts t+1, t+2, and
 *     penalties are on (repetition 1.5, frequency 0.5, presence 0.3).
 *     Whether an accepted draft t2 is in the penalties' counts decides how
 *     likely t3 = t2 is, so a loop that forgets accepted drafts there
 *     samples a visibly different joint.
 *   - dflash: the embedded trained pair (models/qwen3-pystd and its DFlash
 *     drafter) on a short Python prompt, temperature 1, top-k 8; no plain
 *     runs (the other two check the harness), to keep its time down.
 * Each run generates 3 tokens: t1 from the prefill row (plain sampling), t2
 * and t3 from ONE speculative step with 2 drafts (block 3), so tokens 2 and
 * 3 go through accept / reject / resample / bonus. The statistic is over
 * the joint (t1, t2, t3), which conditions everything properly: the exact
 * joint p(t1) p(t2 | t1) p(t3 | t1, t2) is computed from the target's
 * logits on every prefix (the filtered, penalised distributions of
 * dflash_sampler_probs, checked by hand in test_sampler.c).
 *
 * Method: Pearson chi-square. Cells whose expected count is >= 10 are bins
 * of their own; the remaining possible cells are pooled into one bin (folded
 * into the smallest bin if the pool itself expects < 10). Cells outside the
 * exact support must never occur. Tests:
 *   (a) speculative vs plain sampling: two-sample homogeneity statistic
 *       sum (a - b)^2 / (a + b) over bins (equal sample sizes), df = bins - 1;
 *   (b) speculative vs exact: goodness of fit, df = bins - 1;
 *   (c) plain vs exact (a check of the harness itself).
 * Critical value: the upper 1e-6 quantile of chi-square(df) by the
 * Wilson-Hilferty approximation (z = 4.7534). False-failure rate: about
 * 1e-6 per comparison (the seeds are fixed, so the outcome is
 * deterministic; the rate is that of an arbitrary seed).
 * Negative controls (kept in the suite), for every experiment: the same
 * goodness-of-fit test on runs with the test-only rules
 * DFLASH_ACCEPT_TEST_SQRT (accept with sqrt(p)) and
 * DFLASH_ACCEPT_TEST_ALWAYS MUST fail.
 *
 * Cells are indexed by each token's slot in the support of its row (at
 * most K tokens survive top-k 8, ties included), so the same code serves any
 * vocabulary. */
#include "harness.h"

#include <omp.h>
#include <sys/stat.h>
#include <time.h>

#include "core/levers.h"
#include "draft/dflash_head.h"
#include "draft/ngram.h"
#include "io/tokenizer.h"
#include "oracle_proposer.h"
#include "spec/spec.h"
#include "testmodel.h"

enum { V_OWN = 32, NP_MAX = 32, N_NEW = 3, K = 12, CELLS = K * K * K, MIN_EXPECTED = 10 };
enum { N_RUNS = 12000, N_NEG = 4000, N_DFLASH = 3000, N_DFLASH_NEG = 1000 };
#define Z_1E6 4.7534 /* upper 1e-6 quantile of N(0, 1) */

/* One target + proposer + prompt + sampler setting, with the exact joint
 * distribution of the first three generated tokens over support slots. */
typedef struct experiment {
    dflash_backend *be;
    dflash_qwen3 *target;
    dflash_proposer *prop;
    void *pstate;
    int block;                  /* block size of the speculative runs */
    int32_t prompt[NP_MAX];
    int np, V;
    dflash_sampler_opts so;
    int32_t s1[K], s2[K][K], s3[K][K][K]; /* support tokens, -1 past the end */
    double exact[CELLS];
} experiment;

typedef struct tally {
    int64_t count[CELLS];
    int64_t impossible;         /* draws outside the exact support */
    int64_t tried, accepted;    /* drafts */
} tally;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* ---- the self-written model ------------------------------------------------ */

/* lm_head[j] = sum_d c[d] E[j - d0 - d] / H: logit_j after token t is
 * about c[j - t - d0] (the embedding rows are nearly orthogonal). */
static int write_model(const char *dir, const float c[8], int d0)
{
    testmodel m;
    testmodel_geom g;
    testmodel_default_geom(&g);
    g.vocab = V_OWN;
    g.hidden = 64;
    g.std = 0.05f;
    g.seed = 2024;
    if (!testmodel_build(&m, &g))
        return 0;
    const float *E = testmodel_find(&m, "model.embed_tokens.weight");
    float *W = testmodel_find(&m, "lm_head.weight");
    for (int j = 0; j < V_OWN; j++)
        for (int h = 0; h < g.hidden; h++) {
            double s = 0;
            for (int d = 0; d < 8; d++)
                s += c[d] * E[(size_t)((j - d0 - d + 2 * V_OWN) % V_OWN) * g.hidden + h];
            W[(size_t)j * g.hidden + h] = (float)(s / g.hidden);
        }
    int ok = testmodel_save(&m, dir);
    testmodel_free(&m);
    return ok;
}

/* ---- the exact distribution --------------------------------------------------- */

/* The filtered distribution after tokens[0..n) (one forward, last row). */
static int row_probs(experiment *x, dflash_sampler *smp, float *host, const int32_t *tokens, int n, double *probs)
{
    dflash_kv_seq seq = { 0 };
    int32_t pos[NP_MAX + N_NEW], rs[NP_MAX + N_NEW], last = n - 1;
    for (int i = 0; i < n; i++) {
        pos[i] = i;
        rs[i] = 0;
    }
    dflash_kv_seq *sp = &seq;
    dflash_qwen3_batch b = { .n_rows = n, .tokens = tokens, .positions = pos, .row_seq = rs, .n_seqs = 1,
                             .seqs = &sp, .n_logit_rows = 1, .logit_rows = &last };
    float *logits, *taps;
    dflash_status s = dflash_qwen3_seq_init(x->target, &seq);
    if (s == DFLASH_OK)
        s = dflash_qwen3_forward(x->target, &b, &logits, &taps);
    if (s == DFLASH_OK)
        s = x->be->ops->download(x->be, host, logits, (size_t)x->V * sizeof(float));
    dflash_qwen3_seq_free(x->target, &seq);
    if (s == DFLASH_OK) {
        dflash_sampler_reset(smp, 0);
        /* the penalties' counts, were they on: the prompt, then the output */
        dflash_sampler_observe(smp, tokens, x->np);
        dflash_sampler_observe_output(smp, tokens + x->np, n - x->np);
        s = dflash_sampler_probs(smp, host, probs);
    }
    CHECK_OK(s);
    return s == DFLASH_OK;
}

/* support slots of probs into sup[K] (ascending token order); 0 if > K */
static int support(const double *probs, int V, int32_t *sup)
{
    int n = 0;
    for (int j = 0; j < V; j++)
        if (probs[j] > 0) {
            if (n == K)
                return 0;
            sup[n++] = j;
        }
    for (int i = n; i < K; i++)
        sup[i] = -1;
    return 1;
}

/* exact[(i1 K + i2) K + i3] = p(t1) p(t2 | t1) p(t3 | t1 t2), t_k the i_k-th
 * support token of its row */
static int exact_joint(experiment *x)
{
    dflash_sampler smp;
    if (dflash_sampler_init(&smp, x->V, &x->so) != DFLASH_OK)
        return 0;
    int32_t toks[NP_MAX + 2];
    double *p = malloc(3 * (size_t)x->V * sizeof *p);
    float *host = malloc((size_t)x->V * sizeof *host);
    double *p1 = p, *p2 = p + x->V, *p3 = p + 2 * x->V;
    memcpy(toks, x->prompt, (size_t)x->np * sizeof *toks);
    memset(x->exact, 0, sizeof x->exact);
    int ok = p && host && row_probs(x, &smp, host, toks, x->np, p1) && support(p1, x->V, x->s1);
    for (int a = 0; ok && a < K && x->s1[a] >= 0; a++) {
        toks[x->np] = x->s1[a];
        ok = row_probs(x, &smp, host, toks, x->np + 1, p2) && support(p2, x->V, x->s2[a]);
        for (int b = 0; ok && b < K && x->s2[a][b] >= 0; b++) {
            toks[x->np + 1] = x->s2[a][b];
            ok = row_probs(x, &smp, host, toks, x->np + 2, p3) && support(p3, x->V, x->s3[a][b]);
            for (int c = 0; ok && c < K && x->s3[a][b][c] >= 0; c++)
                x->exact[(a * K + b) * K + c] = p1[x->s1[a]] * p2[x->s2[a][b]] * p3[x->s3[a][b][c]];
        }
    }
    if (ok) {
        printf("  p(t1 | prompt):");
        for (int a = 0; a < K && x->s1[a] >= 0; a++)
            printf(" %d:%.3f", x->s1[a], p1[x->s1[a]]);
        printf("\n");
    }
    free(p);
    free(host);
    dflash_sampler_free(&smp);
    return ok;
}

static int slot(const int32_t *sup, int32_t t)
{
    for (int i = 0; i < K && sup[i] >= 0; i++)
        if (sup[i] == t)
            return i;
    return -1;
}

/* cell of a generated triple, -1 outside the support */
static int cell_of(const experiment *x, const int32_t *out)
{
    int a = slot(x->s1, out[0]);
    int b = a < 0 ? -1 : slot(x->s2[a], out[1]);
    int c = b < 0 ? -1 : slot(x->s3[a][b], out[2]);
    return c < 0 ? -1 : (a * K + b) * K + c;
}

/* ---- sampling runs ------------------------------------------------------- */

static int run_many(experiment *x, int spec, dflash_accept_rule rule, uint64_t seed0, int n_runs, tally *t)
{
    memset(t, 0, sizeof *t);
    dflash_kv_seq seq = { 0 };
    if (dflash_qwen3_seq_init(x->target, &seq) != DFLASH_OK)
        return 0;
    dflash_gen_opts o;
    dflash_gen_default_opts(&o);
    o.n_new = N_NEW;
    o.block_size = x->block;
    o.sampler = x->so;
    o.sampler.accept_rule = rule;
    dflash_proposer *p = spec ? x->prop : NULL;
    int ok = 1;
    for (int r = 0; ok && r < n_runs; r++) {
        int32_t out[N_NEW];
        int n = 0;
        dflash_gen_stats st;
        o.sampler.seed = seed0 + (uint64_t)r;
        dflash_kv_seq_truncate(&seq, 0);
        dflash_status s = p ? p->ops->reset(p, x->pstate) : DFLASH_OK;
        if (s == DFLASH_OK)
            s = dflash_spec_generate(x->target, &seq, p, p ? x->pstate : NULL, x->prompt, x->np, &o, out, &n, &st);
        CHECK_OK(s);
        ok = s == DFLASH_OK && n == N_NEW;
        if (!ok)
            break;
        int c = cell_of(x, out);
        if (c < 0)
            t->impossible++;
        else
            t->count[c]++;
        for (int i = 0; i < DFLASH_MAX_BLOCK; i++) {
            t->tried += st.pos_tried[i];
            t->accepted += st.pos_accepted[i];
        }
    }
    dflash_qwen3_seq_free(x->target, &seq);
    return ok;
}

/* ---- chi-square ------------------------------------------------------------ */

/* Upper 1e-6 quantile of chi-square(df), Wilson-Hilferty. */
static double chi2_crit(int df)
{
    double k = df > 0 ? df : 1, h = 2.0 / (9.0 * k);
    double v = 1.0 - h + Z_1E6 * sqrt(h);
    return k * v * v * v;
}

static int bins[CELLS];
static double bin_p[CELLS];

/* bins[c] for n samples (-1: impossible cell); returns the bin count */
static int make_bins(const double *exact, int64_t n)
{
    int nb = 0;
    for (int c = 0; c < CELLS; c++)
        if (exact[c] > 0 && exact[c] * n >= MIN_EXPECTED) {
            bin_p[nb] = exact[c];
            bins[c] = nb++;
        } else {
            bins[c] = exact[c] > 0 ? -2 : -1; /* -2: pooled */
        }
    double rest = 0;
    for (int c = 0; c < CELLS; c++)
        if (bins[c] == -2)
            rest += exact[c];
    int rest_bin = -1;
    if (rest > 0) {
        if (rest * n >= MIN_EXPECTED || nb == 0) {
            rest_bin = nb;
            bin_p[nb++] = rest;
        } else {
            rest_bin = 0;
            for (int b = 1; b < nb; b++)
                if (bin_p[b] < bin_p[rest_bin])
                    rest_bin = b;
            bin_p[rest_bin] += rest;
        }
    }
    for (int c = 0; c < CELLS; c++)
        if (bins[c] == -2)
            bins[c] = rest_bin;
    return nb;
}

/* Goodness of fit of t against x->exact; 1 when it passes. */
static int fits_exact(const experiment *x, const char *label, const tally *t, int64_t n)
{
    int nb = make_bins(x->exact, n);
    static int64_t obs[CELLS];
    memset(obs, 0, sizeof obs);
    for (int c = 0; c < CELLS; c++)
        if (bins[c] >= 0)
            obs[bins[c]] += t->count[c];
    double stat = 0;
    for (int b = 0; b < nb; b++) {
        double e = bin_p[b] * n;
        stat += (obs[b] - e) * (obs[b] - e) / e;
    }
    double crit = chi2_crit(nb - 1);
    int pass = t->impossible == 0 && stat <= crit;
    printf("  %s vs exact: chi2 %.1f, df %d, critical %.1f (1e-6), impossible draws %lld -> %s\n", label, stat,
           nb - 1, crit, (long long)t->impossible, pass ? "same" : "DIFFERENT");
    return pass;
}

/* Two-sample homogeneity of a and b (n draws each); 1 when it passes. */
static int same_as(const experiment *x, const char *label, const tally *a, const tally *b, int64_t n)
{
    int nb = make_bins(x->exact, n);
    static int64_t oa[CELLS], ob[CELLS];
    memset(oa, 0, sizeof oa);
    memset(ob, 0, sizeof ob);
    for (int c = 0; c < CELLS; c++)
        if (bins[c] >= 0) {
            oa[bins[c]] += a->count[c];
            ob[bins[c]] += b->count[c];
        }
    double stat = 0;
    int used = 0;
    for (int k = 0; k < nb; k++)
        if (oa[k] + ob[k] > 0) {
            stat += (double)(oa[k] - ob[k]) * (double)(oa[k] - ob[k]) / (double)(oa[k] + ob[k]);
            used++;
        }
    double crit = chi2_crit(used - 1);
    int64_t impossible = a->impossible + b->impossible;
    int pass = impossible == 0 && stat <= crit;
    printf("  %s: chi2 %.1f, df %d, critical %.1f (1e-6), impossible draws %lld -> %s\n", label, stat, used - 1, crit,
           (long long)impossible, pass ? "same" : "DIFFERENT");
    return pass;
}

static double accept_rate(const tally *t) { return t->tried ? (double)t->accepted / t->tried : 0; }

/* ---- cases ----------------------------------------------------------------- */

static experiment own, pen, dfx;
static tally spec_t, plain_t, wrong_t;

/* n_runs speculative runs fit the exact joint, with drafts accepted often
 * enough to mean something; with_plain: as many plain runs agree with both
 * (a check of the harness, and a second sample to compare with). */
static void spec_matches_target(experiment *x, const char *name, uint64_t seed, int n_runs, int with_plain)
{
    double t0 = now_s();
    CHECK(run_many(x, 1, DFLASH_ACCEPT_EXACT, seed, n_runs, &spec_t));
    double rate = accept_rate(&spec_t);
    printf("  %s: %d speculative runs (%.1f s); drafts accepted %.1f%% (%lld of %lld)\n", name, n_runs,
           now_s() - t0, 100 * rate, (long long)spec_t.accepted, (long long)spec_t.tried);
    /* both paths must run often for the test to tell rules apart */
    CHECKF(rate >= 0.15 && rate <= 0.85, "acceptance %.3f: the test would not exercise both paths", rate);
    CHECK(fits_exact(x, "speculative", &spec_t, n_runs));
    if (with_plain) {
        CHECK(run_many(x, 0, DFLASH_ACCEPT_EXACT, seed + 1000000007ull, n_runs, &plain_t));
        CHECK(same_as(x, "speculative vs plain", &spec_t, &plain_t, n_runs));
        CHECK(fits_exact(x, "plain", &plain_t, n_runs));
    }
}

/* The wrong acceptance rules must fail the goodness-of-fit test. */
static void wrong_rules_are_caught(experiment *x, uint64_t seed, int n_runs)
{
    static const struct { dflash_accept_rule rule; const char *name; } wrong[] = {
        { DFLASH_ACCEPT_TEST_SQRT, "accept with sqrt(p)" },
        { DFLASH_ACCEPT_TEST_ALWAYS, "always accept" },
    };
    for (size_t i = 0; i < sizeof wrong / sizeof wrong[0]; i++) {
        CHECK(run_many(x, 1, wrong[i].rule, seed, n_runs, &wrong_t));
        CHECKF(!fits_exact(x, wrong[i].name, &wrong_t, n_runs), "the wrong rule '%s' passed the test", wrong[i].name);
    }
}

static void test_ngram_spec_matches_target(void) { spec_matches_target(&own, "n-gram", 1, N_RUNS, 1); }
static void test_ngram_wrong_rules_are_caught(void) { wrong_rules_are_caught(&own, 777, N_NEG); }
static void test_penalty_spec_matches_target(void) { spec_matches_target(&pen, "penalties 1.5 / 0.5 / 0.3", 3, N_RUNS, 1); }
static void test_penalty_wrong_rules_are_caught(void) { wrong_rules_are_caught(&pen, 778, N_NEG); }
static void test_dflash_spec_matches_target(void) { spec_matches_target(&dfx, "DFlash pair", 5, N_DFLASH, 0); }
static void test_dflash_wrong_rules_are_caught(void) { wrong_rules_are_caught(&dfx, 9, N_DFLASH_NEG); }

/* Tokens drawn where the logits are (every verified row at once, ids
 * back: the backend's sample_rows or its composition) equal the host's
 * row-by-row draws from downloaded logits (DFLASH_HOST_SAMPLING=1), token
 * for token, under top-k, top-p and min-p together, without penalties
 * and with all three (rows drawn as if the drafts before them were
 * accepted, from the counts the backend keeps): single sequences with the
 * drafter at block 16, and the same sequences stepped together without
 * one (which, drawing each position with its own uniform, also equals the
 * speculative output). */
static void drawn_equals_host(int penalties)
{
    experiment *x = &dfx;
    enum { N = 24, SEQS = 3 };
    dflash_sampler_opts so = x->so;
    so.temperature = 0.9;
    so.top_k = 40;
    so.top_p = 0.9;
    so.min_p = 0.02;
    if (penalties) { /* drawn by ids from the counts count_tokens keeps, against the host's sampler */
        so.rep_penalty = 1.2;
        so.frequency_penalty = 0.5;
        so.presence_penalty = 0.3;
    }
    int32_t one[2][SEQS][N], many[2][SEQS][N];
    int n_one[2][SEQS], n_many[2][SEQS];
    void *ps = NULL;
    CHECK_OK(x->prop->ops->alloc_state(x->prop, 64, &ps));
    if (!ps)
        return;
    for (int host = 0; host < 2; host++) {
        if (host)
            setenv("DFLASH_HOST_SAMPLING", "1", 1);
        dflash_levers_reload();
        dflash_kv_seq seqs[SEQS];
        dflash_spec_item items[SEQS];
        for (int i = 0; i < SEQS; i++) {
            dflash_gen_opts o;
            dflash_gen_default_opts(&o);
            o.n_new = N;
            o.block_size = 16;
            o.sampler = so;
            o.sampler.seed = 70 + (uint64_t)i;
            dflash_gen_stats st;
            CHECK_OK(dflash_qwen3_seq_init(x->target, &seqs[i]));
            CHECK_OK(x->prop->ops->reset(x->prop, ps));
            CHECK_OK(dflash_spec_generate(x->target, &seqs[i], x->prop, ps, x->prompt, x->np, &o, one[host][i],
                                          &n_one[host][i], &st));
            dflash_kv_seq_truncate(&seqs[i], 0);
            items[i] = (dflash_spec_item){ .seq = &seqs[i], .prompt = x->prompt, .n_prompt = x->np, .opts = o,
                                           .out = many[host][i] };
        }
        CHECK_OK(dflash_spec_generate_many(x->target, NULL, items, SEQS, 0, 0));
        for (int i = 0; i < SEQS; i++) {
            n_many[host][i] = items[i].n_out;
            dflash_qwen3_seq_free(x->target, &seqs[i]);
        }
        unsetenv("DFLASH_HOST_SAMPLING");
        dflash_levers_reload();
    }
    x->prop->ops->free_state(x->prop, ps);
    for (int i = 0; i < SEQS; i++) {
        CHECKF(n_one[0][i] == N && n_one[1][i] == N && n_many[0][i] == N && n_many[1][i] == N,
               "sequence %d: %d %d %d %d tokens", i, n_one[0][i], n_one[1][i], n_many[0][i], n_many[1][i]);
        CHECKF(!memcmp(one[0][i], one[1][i], sizeof one[0][i]), "penalties %d, sequence %d: drawn ids != host rows "
               "(spec)", penalties, i);
        CHECKF(!memcmp(many[0][i], many[1][i], sizeof many[0][i]), "penalties %d, sequence %d: drawn ids != host "
               "rows (batch)", penalties, i);
        CHECKF(!memcmp(one[0][i], many[0][i], sizeof one[0][i]), "penalties %d, sequence %d: spec != plain batch",
               penalties, i);
    }
}

static void test_drawn_equals_host(void)
{
    drawn_equals_host(0);
    drawn_equals_host(1);
}

static void close_experiment(experiment *x, dflash_head *h)
{
    if (x->prop && x->pstate)
        x->prop->ops->free_state(x->prop, x->pstate);
    if (h)
        dflash_head_free(h);
    else if (x->prop && strcmp(x->prop->ops->name(x->prop), "successor") != 0)
        dflash_proposer_destroy(x->prop);
    dflash_qwen3_free(x->target);
}

/* A self-written target (offsets c from d0) with its proposer and exact
 * joint; 0 (with the reason printed) on failure. */
static int open_own(experiment *x, dflash_backend *be, const float c[8], int d0, dflash_proposer *prop)
{
    char dir[64];
    dflash_qwen3_opts to;
    dflash_qwen3_default_opts(&to);
    to.max_ctx = 64;
    x->be = be;
    x->V = V_OWN;
    x->block = 3; /* t2, t3 from one step with 2 drafts */
    if (!testmodel_tmpdir(dir) || !write_model(dir, c, d0)) {
        fprintf(stderr, "cannot write the test model\n");
        return 0;
    }
    int ok = dflash_qwen3_load(dir, be, &to, &x->target) == DFLASH_OK;
    testmodel_rmdir(dir);
    x->prop = prop;
    if (ok && !x->prop)
        ok = dflash_ngram_create(x->block, 1, 3, &x->prop) == DFLASH_OK;
    ok = ok && x->prop->ops->alloc_state(x->prop, x->np + N_NEW + x->block, &x->pstate) == DFLASH_OK &&
         exact_joint(x);
    if (!ok)
        fprintf(stderr, "setup: %s\n", dflash_last_error());
    return ok;
}

/* The embedded pair on a Python prompt. */
static int open_pair(experiment *x, dflash_backend *be, dflash_head **h)
{
    static const char *text = "def add(a, b):\n    return";
    dflash_tokenizer *tok = NULL;
    int32_t *ids = NULL;
    size_t n = 0;
    dflash_qwen3_opts to;
    dflash_qwen3_default_opts(&to);
    to.max_ctx = 64;
    to.max_seqs = 3; /* test_drawn_equals_host's batch */
    dflash_head_opts ho;
    dflash_head_default_opts(&ho);
    ho.max_ctx = to.max_ctx;
    x->be = be;
    x->block = 3;
    int ok = dflash_tokenizer_load("models/qwen3-pystd", &tok) == DFLASH_OK &&
             dflash_tokenizer_encode(tok, text, strlen(text), &ids, &n) == DFLASH_OK && n > 0 && n <= NP_MAX;
    if (ok) {
        memcpy(x->prompt, ids, n * sizeof *ids);
        x->np = (int)n;
    }
    free(ids);
    dflash_tokenizer_free(tok);
    ok = ok && dflash_qwen3_load("models/qwen3-pystd", be, &to, &x->target) == DFLASH_OK &&
         dflash_head_load("models/qwen3-pystd-dflash", x->target, &ho, h) == DFLASH_OK;
    if (ok) {
        x->V = x->target->cfg.vocab_size;
        x->prop = &(*h)->proposer;
        ok = x->prop->ops->alloc_state(x->prop, x->np + N_NEW + x->block, &x->pstate) == DFLASH_OK &&
             exact_joint(x);
    }
    if (!ok)
        fprintf(stderr, "embedded pair setup: %s\n", dflash_last_error());
    return ok;
}

int main(void)
{
    /* One thread: the models are tiny, so threads only add fork/join cost,
     * and on a shared, busy machine spinning OpenMP workers can make the
     * run many times slower. */
    omp_set_num_threads(1);
    dflash_backend *be;
    if (dflash_backend_cpu_create(&be) != DFLASH_OK) {
        fprintf(stderr, "%s\n", dflash_last_error());
        return 1;
    }

    static const float c_own[8] = { 3.0f, 2.2f, 2.0f, 1.8f, 1.6f, 1.5f, 1.4f, 1.3f };
    own.np = NP_MAX;
    for (int i = 0; i < own.np; i++)
        own.prompt[i] = (8 + i) % V_OWN;
    dflash_sampler_default_opts(&own.so);
    own.so.temperature = 1.0;
    own.so.top_k = 8;
    if (open_own(&own, be, c_own, 1, NULL)) {
        RUN(test_ngram_spec_matches_target);
        RUN(test_ngram_wrong_rules_are_caught);
    } else {
        h_failed++;
    }
    close_experiment(&own, NULL);

    /* after t: t+1 (3.0) and t itself (2.8) lead; the penalty decides */
    static const float c_pen[8] = { 2.8f, 3.0f, 2.0f, 1.8f, 1.6f, 1.5f, 1.4f, 1.3f };
    static oracle succ;
    successor_init(&succ, V_OWN, 3);
    pen.np = 16;
    for (int i = 0; i < pen.np; i++)
        pen.prompt[i] = 16 + i;
    dflash_sampler_default_opts(&pen.so);
    pen.so.temperature = 1.0;
    pen.so.top_k = 8;
    pen.so.rep_penalty = 1.5;
    pen.so.frequency_penalty = 0.5;
    pen.so.presence_penalty = 0.3;
    if (open_own(&pen, be, c_pen, 0, &succ.proposer)) {
        RUN(test_penalty_spec_matches_target);
        RUN(test_penalty_wrong_rules_are_caught);
    } else {
        h_failed++;
    }
    close_experiment(&pen, NULL);

    dflash_head *h = NULL;
    dflash_sampler_default_opts(&dfx.so);
    dfx.so.temperature = 1.0;
    dfx.so.top_k = 8;
    if (open_pair(&dfx, be, &h)) {
        RUN(test_dflash_spec_matches_target);
        RUN(test_dflash_wrong_rules_are_caught);
        RUN(test_drawn_equals_host);
    } else {
        h_failed++;
    }
    close_experiment(&dfx, h);
    dflash_backend_destroy(be);
    TEST_END();
}
