/* test_spec_sampling_temp0.c: the loop's sampling switches on a tiny model
 * the test writes itself (tests/testmodel.h): temperature 0 is greedy
 * whatever the other sampler options say, speculative greedy equals plain
 * greedy (also with repetition, frequency or presence penalties, whose
 * rows count the drafts before them), and a seed reproduces a sampled run
 * exactly while another seed gives another output (plain and
 * speculative). */
#include "harness.h"

#include "draft/ngram.h"
#include "spec/spec.h"
#include "testmodel.h"

enum { N_NEW = 24 };

static dflash_backend *be;
static dflash_qwen3 *target;
static dflash_proposer *ngram;
static void *nstate;

static const int32_t prompt[] = { 3, 17, 5, 9, 3, 17, 5, 22, 40, 3, 17, 5 };
#define N_PROMPT ((int)(sizeof prompt / sizeof prompt[0]))

/* One generation from a fresh sequence; returns the number of tokens. */
static int gen(int spec, const dflash_sampler_opts *so, int32_t *out, dflash_gen_stats *st)
{
    dflash_kv_seq seq = { 0 };
    dflash_gen_opts o;
    dflash_gen_default_opts(&o);
    o.n_new = N_NEW;
    if (so)
        o.sampler = *so;
    int n = -1;
    dflash_status s = dflash_qwen3_seq_init(target, &seq);
    if (s == DFLASH_OK && spec)
        s = ngram->ops->reset(ngram, nstate);
    if (s == DFLASH_OK)
        s = dflash_spec_generate(target, &seq, spec ? ngram : NULL, spec ? nstate : NULL, prompt, N_PROMPT, &o, out,
                                 &n, st);
    CHECK_OK(s);
    dflash_qwen3_seq_free(target, &seq);
    return s == DFLASH_OK ? n : -1;
}

static int same(const int32_t *a, int na, const int32_t *b, int nb)
{
    return na == nb && na > 0 && memcmp(a, b, (size_t)na * sizeof *a) == 0;
}

static void test_temp0_is_greedy(void)
{
    int32_t plain[N_NEW], spec[N_NEW], other[N_NEW];
    dflash_gen_stats st;
    int np = gen(0, NULL, plain, &st);
    int ns = gen(1, NULL, spec, &st);
    CHECK(np == N_NEW);
    CHECK(same(plain, np, spec, ns));
    printf("  greedy: tau %.2f over %d steps\n", st.mean_accept, st.n_steps);
    /* temperature 0 ignores the filters and the seed: still the argmax path */
    dflash_sampler_opts so;
    dflash_sampler_default_opts(&so);
    so.top_k = 3;
    so.top_p = 0.5;
    so.min_p = 0.3;
    so.seed = 1234;
    CHECK(dflash_sampler_is_greedy(&so));
    int n = gen(1, &so, other, &st);
    CHECK(same(plain, np, other, n));
    n = gen(0, &so, other, &st);
    CHECK(same(plain, np, other, n));
}

static void test_temp0_with_penalty(void)
{
    int32_t greedy[N_NEW], plain[N_NEW], spec[N_NEW];
    dflash_gen_stats st;
    int ng = gen(0, NULL, greedy, &st);
    static const struct { double rep, freq, pres; } pens[] = {
        { 1.5, 0, 0 }, { 1, 0.7, 0 }, { 1, 0, 1.0 }, { 1.2, 0.5, 0.5 }, { 1, -0.5, 0 },
    };
    for (size_t k = 0; k < sizeof pens / sizeof pens[0]; k++) {
        dflash_sampler_opts so;
        dflash_sampler_default_opts(&so);
        so.rep_penalty = pens[k].rep;
        so.frequency_penalty = pens[k].freq;
        so.presence_penalty = pens[k].pres;
        int np = gen(0, &so, plain, &st);
        int ns = gen(1, &so, spec, &st);
        /* speculative greedy under penalties: drafts judged against the
         * penalized argmax of each row, whose counts include the drafts
         * accepted before it */
        CHECKF(same(plain, np, spec, ns), "penalties %g / %g / %g: spec != plain", pens[k].rep, pens[k].freq,
               pens[k].pres);
        CHECKF(!same(plain, np, greedy, ng), "penalties %g / %g / %g changed nothing", pens[k].rep, pens[k].freq,
               pens[k].pres);
        printf("  greedy + penalties %g / %g / %g: tau %.2f\n", pens[k].rep, pens[k].freq, pens[k].pres,
               st.mean_accept);
        /* sampled: each token drawn with its position's uniform, so a seed
         * gives spec == plain under the penalties too */
        so.temperature = 1.0;
        so.seed = 9;
        np = gen(0, &so, plain, &st);
        ns = gen(1, &so, spec, &st);
        CHECKF(same(plain, np, spec, ns), "sampled, penalties %g / %g / %g: spec != plain", pens[k].rep,
               pens[k].freq, pens[k].pres);
    }
}

static void test_seeds(void)
{
    dflash_sampler_opts so;
    dflash_sampler_default_opts(&so);
    so.temperature = 1.0;
    so.top_k = 8;
    for (int spec = 0; spec <= 1; spec++) {
        int32_t a[N_NEW], b[N_NEW], c[N_NEW];
        dflash_gen_stats st;
        so.seed = 5;
        int na = gen(spec, &so, a, &st);
        int nb = gen(spec, &so, b, &st);
        so.seed = 6;
        int nc = gen(spec, &so, c, &st);
        CHECKF(same(a, na, b, nb), "%s: the same seed gave different outputs", spec ? "spec" : "plain");
        CHECKF(!same(a, na, c, nc), "%s: seeds 5 and 6 gave the same output", spec ? "spec" : "plain");
    }
}

int main(void)
{
    char dir[64];
    testmodel m;
    testmodel_geom g;
    testmodel_default_geom(&g);
    g.seed = 11;
    if (!testmodel_tmpdir(dir) || !testmodel_build(&m, &g) || !testmodel_save(&m, dir)) {
        fprintf(stderr, "cannot write the test model\n");
        return 1;
    }
    testmodel_free(&m);
    dflash_qwen3_opts to;
    dflash_qwen3_default_opts(&to);
    to.max_ctx = 128;
    int ok = dflash_backend_cpu_create(&be) == DFLASH_OK && dflash_qwen3_load(dir, be, &to, &target) == DFLASH_OK &&
             dflash_ngram_create(4, 1, 3, &ngram) == DFLASH_OK &&
             ngram->ops->alloc_state(ngram, N_PROMPT + N_NEW + DFLASH_MAX_BLOCK, &nstate) == DFLASH_OK;
    testmodel_rmdir(dir);
    if (!ok) {
        fprintf(stderr, "setup: %s\n", dflash_last_error());
        return 1;
    }
    RUN(test_temp0_is_greedy);
    RUN(test_temp0_with_penalty);
    RUN(test_seeds);
    ngram->ops->free_state(ngram, nstate);
    dflash_proposer_destroy(ngram);
    dflash_qwen3_free(target);
    dflash_backend_destroy(be);
    TEST_END();
}
