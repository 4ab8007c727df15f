/* test_slow_spec.c: the decisive property. Greedy speculative output equals
 * greedy plain output token for token, for every fixture pair, block size,
 * context cap (including prompts longer than the cap) and drafter weight
 * precision, with a fixed width and the cost-aware one, and for the n-gram
 * proposer through the same contract; seeded sampling gives plain
 * sampling's tokens too. */
#include "harness.h"


#include "draft/dflash_head.h"
#include "draft/ngram.h"
#include "fixture.h"
#include "oracle_proposer.h"
#include "spec/spec.h"

static dflash_backend *be;

static void run(dflash_qwen3 *t, dflash_proposer *p, const int32_t *prompt, int n_prompt, int n_new, int block,
                int32_t *out, int *n_out, dflash_gen_stats *st)
{
    CHECK_OK(oracle_generate(t, p, prompt, n_prompt, n_new, block, 1.0, out, n_out, st));
}

/* The target in `dir` with room for 400 positions (max_rows 0: the
 * default); NULL, with a failed check, if it does not load. */
static dflash_qwen3 *load_target(const char *dir, int max_rows)
{
    dflash_qwen3_opts to;
    dflash_qwen3_default_opts(&to);
    to.max_ctx = 400;
    if (max_rows)
        to.max_rows = max_rows;
    dflash_qwen3 *t = NULL;
    CHECK_OK(dflash_qwen3_load(dir, be, &to, &t));
    return t;
}

static void prompt_for(int V, int n, int seed, int32_t *out)
{
    /* A prompt with repeats, so n-gram lookups find matches. */
    for (int i = 0; i < n; i++)
        out[i] = (int32_t)(((i % 7) * 31 + seed * 17 + (i / 21)) % V);
}

static void test_dflash_equals_plain(void)
{
    const char *drafters[] = { "d1_sharded", "d2_tied", "d3_sliding", "d4_llama", "d5_yarn", "d6_moe" };
    const int blocks[] = { 2, 4, 8, 16 }, caps[] = { 0, 3, 16, 37 };
    for (size_t k = 0; k < sizeof drafters / sizeof drafters[0]; k++) {
        char tdir[512], ddir[512];
        int have = fx_drafter_target(drafters[k], tdir, sizeof tdir);
        CHECKF(have, "%s: meta.json with a target", drafters[k]);
        if (!have)
            continue;
        fx_path(ddir, sizeof ddir, "dflash", drafters[k]);
        dflash_qwen3 *t = load_target(tdir, 32); /* 32 rows: prompts of 50 prefill in two chunks */
        if (!t)
            continue;
        int32_t prompt[50], plain[80], out[80];
        int n_plain, n_out;
        dflash_gen_stats st;
        for (int seed = 0; seed < 2; seed++) {
            prompt_for(t->cfg.vocab_size, 50, seed, prompt);
            run(t, NULL, prompt, 50, 80, 0, plain, &n_plain, &st);
            CHECK(n_plain == 80);
            for (size_t bi = 0; bi < sizeof blocks / sizeof blocks[0]; bi++)
                for (size_t ci = 0; ci < sizeof caps / sizeof caps[0]; ci++)
                    for (int quant = 0; quant < 2; quant++) {
                        if (quant && (bi != 3 || ci != 0))
                            continue; /* fp8: one configuration is enough */
                        dflash_head_opts ho;
                        dflash_head_default_opts(&ho);
                        ho.max_ctx = 400;
                        ho.ctx_cap = caps[ci];
                        ho.block_size = blocks[bi];
                        ho.quant = quant;
                        dflash_head *h = NULL;
                        CHECK_OK(dflash_head_load(ddir, t, &ho, &h));
                        if (!h)
                            continue;
                        run(t, &h->proposer, prompt, 50, 80, blocks[bi], out, &n_out, &st);
                        CHECKF(n_out == n_plain && memcmp(out, plain, sizeof plain) == 0,
                               "%s block %d cap %d quant %d seed %d: speculative output differs", drafters[k],
                               blocks[bi], caps[ci], quant, seed);
                        dflash_head_free(h);
                    }
        }
        dflash_qwen3_free(t);
    }
}

/* The n-gram proposer at `block` on prompt[40] (120 new tokens): its
 * output must equal plain[] (label names the case); its stats in *st. */
static void ngram_equals_plain(dflash_qwen3 *t, const int32_t *prompt, const int32_t *plain, int n_plain, int block,
                               const char *label, dflash_gen_stats *st)
{
    int32_t out[120];
    int n_out;
    dflash_proposer *p = NULL;
    memset(st, 0, sizeof *st);
    CHECK_OK(dflash_ngram_create(block, 1, 3, &p));
    if (!p)
        return;
    run(t, p, prompt, 40, 120, block, out, &n_out, st);
    CHECKF(n_out == n_plain && memcmp(out, plain, (size_t)n_plain * sizeof *out) == 0, "%s ngram block %d differs",
           label, block);
    printf("  %s ngram block %d: tau %.2f over %d steps\n", label, block, st->mean_accept, st->n_steps);
    dflash_proposer_destroy(p);
}

static void test_ngram_equals_plain_and_accepts(void)
{
    char tdir[512];
    dflash_qwen3 *t = load_target(fx_path(tdir, sizeof tdir, "qwen3", "gqa_tied"), 0);
    if (!t)
        return;
    int32_t prompt[40], plain[120];
    int n_plain;
    dflash_gen_stats st;
    prompt_for(t->cfg.vocab_size, 40, 3, prompt);
    run(t, NULL, prompt, 40, 120, 0, plain, &n_plain, &st);
    /* Acceptance on this fixed prompt, measured (1.63, 2.38, 2.90, 3.13):
     * floors just below, so a loop that accepts less fails here. */
    static const double floors[] = { 1.6, 2.3, 2.85, 3.05 };
    for (int block = 2, bi = 0; block <= 16; block *= 2, bi++) {
        ngram_equals_plain(t, prompt, plain, n_plain, block, "gqa_tied", &st);
        CHECKF(st.mean_accept >= floors[bi], "ngram block %d: tau %.2f below %.2f", block, st.mean_accept,
               floors[bi]);
    }
    dflash_qwen3_free(t);
}

/* The other targets (a Llama with Llama 3.1's RoPE, a Qwen3 with YaRN,
 * a Llama and a Qwen3 with projection biases, two Qwen3-MoE): speculative
 * output equals plain output, with the n-gram proposer. */
static void test_other_targets_equal_plain(void)
{
    static const char *const targets[][2] = { { "llama", "llama31_gqa" }, { "qwen3", "yarn_tied" },
                                              { "llama", "llama_bias" },      { "qwen3", "qwen3_bias" },
                                              { "qwen3_moe", "moe_experts" }, { "qwen3_moe", "moe_stacked" } };
    for (size_t k = 0; k < sizeof targets / sizeof targets[0]; k++) {
        char tdir[512];
        dflash_qwen3 *t = load_target(fx_path(tdir, sizeof tdir, targets[k][0], targets[k][1]), 0);
        if (!t)
            continue;
        int32_t prompt[40], plain[120];
        int n_plain;
        dflash_gen_stats st;
        prompt_for(t->cfg.vocab_size, 40, 5, prompt);
        run(t, NULL, prompt, 40, 120, 0, plain, &n_plain, &st);
        for (int block = 4; block <= 16; block *= 4) {
            ngram_equals_plain(t, prompt, plain, n_plain, block, targets[k][1], &st);
            /* measured 2.1-14.9 on these prompts: a loop that stopped
             * accepting (tau 1) would still give plain's output */
            CHECKF(st.mean_accept >= 1.8, "%s ngram block %d: tau %.2f below 1.8", targets[k][1], block,
                   st.mean_accept);
        }
        dflash_qwen3_free(t);
    }
}

/* A DFlash drafter on a Qwen3-MoE target (the d2_tied drafter fits the
 * moe_experts geometry: hidden 96, vocabulary 640, 3 target layers):
 * speculative output equals plain output at several block sizes, context
 * caps and the cost-aware width. Rows of a verify are routed to experts
 * independently of each other, so this holds bit for bit. That drafter was
 * made for another target and is never right here (tau 1): the accepting
 * paths on these targets are the n-gram cases above. (d6_moe, a drafter
 * fixture of moe_stacked, runs in the fixture-pair tests.) */
static void test_dflash_on_moe_equals_plain(void)
{
    char tdir[512], ddir[512];
    dflash_qwen3 *t = load_target(fx_path(tdir, sizeof tdir, "qwen3_moe", "moe_experts"), 32);
    if (!t)
        return;
    fx_path(ddir, sizeof ddir, "dflash", "d2_tied");
    int32_t prompt[50], plain[80], out[80];
    int n_plain, n_out;
    dflash_gen_stats st;
    prompt_for(t->cfg.vocab_size, 50, 3, prompt);
    run(t, NULL, prompt, 50, 80, 0, plain, &n_plain, &st);
    CHECK(n_plain == 80);
    static const int blocks[] = { 2, 8, 8, 0 }, caps[] = { 0, 0, 5, 0 }; /* block 0: the cost-aware width */
    for (size_t i = 0; i < sizeof blocks / sizeof blocks[0]; i++) {
        dflash_head_opts ho;
        dflash_head_default_opts(&ho);
        ho.max_ctx = 400;
        ho.ctx_cap = caps[i];
        if (blocks[i])
            ho.block_size = blocks[i];
        dflash_head *h = NULL;
        CHECK_OK(dflash_head_load(ddir, t, &ho, &h));
        if (!h)
            continue;
        if (blocks[i]) {
            run(t, &h->proposer, prompt, 50, 80, blocks[i], out, &n_out, &st);
        } else {
            dflash_gen_opts go;
            dflash_gen_default_opts(&go);
            go.n_new = 80;
            go.width_auto = 1;
            CHECK_OK(generate_fresh(t, &h->proposer, prompt, 50, &go, out, &n_out, &st));
        }
        CHECKF(n_out == n_plain && memcmp(out, plain, sizeof plain) == 0,
               "moe_experts + d2_tied block %d cap %d: speculative output differs", blocks[i], caps[i]);
        printf("  moe_experts + d2_tied block %d cap %d: tau %.2f over %d steps\n", blocks[i], caps[i],
               st.mean_accept, st.n_steps);
        dflash_head_free(h);
    }
    dflash_qwen3_free(t);
}

/* Stop tokens end the output at the stop token in both modes alike. */
static void test_stop_tokens(void)
{
    char tdir[512];
    dflash_qwen3 *t = NULL;
    CHECK_OK(dflash_qwen3_load(fx_path(tdir, sizeof tdir, "qwen3", "gqa_tied"), be, NULL, &t));
    if (!t)
        return;
    int32_t prompt[20], plain[60], out[60];
    int n_plain, n_out;
    dflash_gen_stats st;
    prompt_for(t->cfg.vocab_size, 20, 5, prompt);
    run(t, NULL, prompt, 20, 60, 0, plain, &n_plain, &st);
    int32_t stop = plain[17];
    int first = 0;
    while (plain[first] != stop)
        first++;
    dflash_proposer *p = NULL;
    CHECK_OK(dflash_ngram_create(8, 1, 3, &p));
    for (int with = 0; with < 2 && p; with++) {
        dflash_kv_seq seq;
        void *state = NULL;
        dflash_gen_opts go;
        dflash_gen_default_opts(&go);
        go.n_new = 60;
        go.stop_ids = &stop;
        go.n_stop = 1;
        CHECK_OK(dflash_qwen3_seq_init(t, &seq));
        if (with)
            CHECK_OK(p->ops->alloc_state(p, 200, &state));
        CHECK_OK(dflash_spec_generate(t, &seq, with ? p : NULL, state, prompt, 20, &go, out, &n_out, &st));
        CHECK(n_out == first + 1 && st.stopped && memcmp(out, plain, (size_t)n_out * sizeof(int32_t)) == 0);
        if (with)
            p->ops->free_state(p, state);
        dflash_qwen3_seq_free(t, &seq);
    }
    dflash_proposer_destroy(p);
    dflash_qwen3_free(t);
}

/* The gqa_tied target (contexts up to 400) and the d2_tied drafter made
 * with `ho` (NULL: the defaults with max_ctx 400). 1 with both loaded;
 * else 0 with nothing left loaded. */
static int load_tied_pair(const dflash_head_opts *ho, dflash_qwen3 **t, dflash_head **h)
{
    char tdir[512], ddir[512];
    dflash_head_opts dho;
    dflash_head_default_opts(&dho);
    dho.max_ctx = 400;
    *h = NULL;
    *t = load_target(fx_path(tdir, sizeof tdir, "qwen3", "gqa_tied"), 0);
    if (*t)
        CHECK_OK(dflash_head_load(fx_path(ddir, sizeof ddir, "dflash", "d2_tied"), *t, ho ? ho : &dho, h));
    if (!*h) {
        dflash_qwen3_free(*t);
        *t = NULL;
        return 0;
    }
    return 1;
}

/* A second call continues the sequence (a chat turn): its output equals
 * plain decoding of the whole conversation from scratch, and a stop token
 * in the first call leaves both caches consistent. With a repetition
 * penalty the second call is given the first's ids as its history, so it
 * penalizes what the fresh run over the whole conversation does. */
static void continue_equals_fresh(double penalty)
{
    dflash_qwen3 *t;
    dflash_head *h;
    if (!load_tied_pair(NULL, &t, &h))
        return;
    int32_t p1[20], first[30], turn2[40], second[30], whole[120], plain[30];
    int n1, n2, np;
    dflash_gen_stats st;
    prompt_for(t->cfg.vocab_size, 20, 7, p1);
    /* stop at the 10th token of the plain continuation */
    CHECK_OK(oracle_generate(t, NULL, p1, 20, 30, 0, penalty, plain, &np, &st));
    int32_t stop = plain[9];
    dflash_kv_seq seq;
    void *state;
    dflash_gen_opts go;
    dflash_gen_default_opts(&go);
    go.n_new = 30;
    go.stop_ids = &stop;
    go.n_stop = 1;
    go.sampler.rep_penalty = penalty;
    CHECK_OK(dflash_qwen3_seq_init(t, &seq));
    CHECK_OK(h->proposer.ops->alloc_state(&h->proposer, 300, &state));
    CHECK_OK(dflash_spec_generate(t, &seq, &h->proposer, state, p1, 20, &go, first, &n1, &st));
    /* turn 2: the unverified last token, then new tokens */
    turn2[0] = first[n1 - 1];
    prompt_for(t->cfg.vocab_size, 39, 9, turn2 + 1);
    go.n_stop = 0;
    int32_t history[50];
    memcpy(history, p1, sizeof p1);
    memcpy(history + 20, first, (size_t)(n1 - 1) * sizeof(int32_t));
    go.history = history;
    go.n_history = 20 + n1 - 1;
    CHECK_OK(dflash_spec_generate(t, &seq, &h->proposer, state, turn2, 40, &go, second, &n2, &st));
    /* the same conversation from scratch, plainly */
    int nw = 0;
    memcpy(whole, p1, sizeof p1);
    nw = 20;
    memcpy(whole + nw, first, (size_t)(n1 - 1) * sizeof(int32_t));
    nw += n1 - 1;
    memcpy(whole + nw, turn2, sizeof turn2);
    nw += 40;
    CHECK_OK(oracle_generate(t, NULL, whole, nw, 30, 0, penalty, plain, &np, &st));
    CHECKF(n2 == 30 && np == 30 && memcmp(second, plain, sizeof plain) == 0, "penalty %g: turn 2 differs from "
           "the whole conversation decoded plainly", penalty);
    CHECK(seq.len == nw + n2 - 1);
    h->proposer.ops->free_state(&h->proposer, state);
    dflash_qwen3_seq_free(t, &seq);
    dflash_head_free(h);
    dflash_qwen3_free(t);
}

static void test_continue_equals_fresh(void)
{
    continue_equals_fresh(1.0);
    continue_equals_fresh(1.5);
}

/* With the auto width, rows of steps that drafted nothing reach the
 * drafter late, in one call. At every return the drafter must still hold
 * exactly the target's rows, and n_out must match them: after a clean run,
 * and after its pool runs dry in such a late call (the error names it; the
 * target is cut back, n_out too). */
static void test_deferred_rows_keep_caches_in_step(void)
{
    for (int blocks = 0; blocks < 2; blocks++) {
        dflash_head_opts ho;
        dflash_head_default_opts(&ho);
        ho.kv_pages = blocks ? 4 : 0; /* 4 pages = 64 positions: runs dry mid-generation */
        dflash_qwen3 *t;
        dflash_head *h;
        if (!load_tied_pair(&ho, &t, &h))
            continue;
        int32_t prompt[20], out[100];
        int n_out = 0;
        prompt_for(t->cfg.vocab_size, 20, 4, prompt);
        dflash_kv_seq seq;
        void *state;
        dflash_gen_opts go;
        dflash_gen_stats st;
        dflash_gen_default_opts(&go);
        go.n_new = 100;
        go.width_auto = 1;
        CHECK_OK(dflash_qwen3_seq_init(t, &seq));
        CHECK_OK(h->proposer.ops->alloc_state(&h->proposer, 200, &state));
        dflash_status s = dflash_spec_generate(t, &seq, &h->proposer, state, prompt, 20, &go, out, &n_out, &st);
        dflash_proposer_state *ps = state;
        if (blocks) {
            CHECK(s == DFLASH_ERR_KV_FULL);
            CHECKF(strstr(dflash_last_error(), "drafter context") != NULL, "message: %s", dflash_last_error());
        } else {
            CHECK_OK(s);
            CHECK(n_out == 100 && seq.len == 20 + 100 - 1);
            CHECKF(st.width_hist[0] > 0, "no step drafted nothing, so no row waited (widths: 0 x %lld)",
                   (long long)st.width_hist[0]);
        }
        CHECKF(seq.len == ps->kv.len, "pages %d: target holds %d rows, drafter %d", ho.kv_pages, seq.len,
               ps->kv.len);
        /* and they hold the prompt and every emitted token but the last, so
         * the sequence could be continued from out[n_out - 1] */
        CHECKF(n_out >= 1 && seq.len == 20 + n_out - 1, "pages %d: %d tokens out, caches hold %d rows",
               ho.kv_pages, n_out, seq.len);
        h->proposer.ops->free_state(&h->proposer, state);
        dflash_qwen3_seq_free(t, &seq);
        dflash_head_free(h);
        dflash_qwen3_free(t);
    }
}

/* The cost-aware width (each step drafts 0..B-1 tokens, chosen from
 * measured times) changes nothing in the output: greedy, every fixture
 * drafter and the n-gram proposer. */
static void test_auto_width_equals_plain(void)
{
    const char *drafters[] = { "d1_sharded", "d2_tied", "d3_sliding", "d4_llama", "d5_yarn", "d6_moe" };
    for (size_t k = 0; k <= sizeof drafters / sizeof drafters[0]; k++) {
        const int ngram = k == sizeof drafters / sizeof drafters[0];
        char tdir[512], ddir[512];
        if (ngram)
            fx_path(tdir, sizeof tdir, "qwen3", "gqa_tied");
        else if (!fx_drafter_target(drafters[k], tdir, sizeof tdir)) {
            CHECKF(0, "%s: meta.json with a target", drafters[k]);
            continue;
        }
        dflash_qwen3 *t = load_target(tdir, 0);
        if (!t)
            continue;
        dflash_proposer *p = NULL;
        dflash_head *h = NULL;
        if (ngram) {
            CHECK_OK(dflash_ngram_create(16, 1, 3, &p));
        } else {
            dflash_head_opts ho;
            dflash_head_default_opts(&ho);
            ho.max_ctx = 400;
            CHECK_OK(dflash_head_load(fx_path(ddir, sizeof ddir, "dflash", drafters[k]), t, &ho, &h));
            p = h ? &h->proposer : NULL;
        }
        int32_t prompt[40], plain[100], out[100];
        int n_plain, n_out;
        dflash_gen_stats st;
        dflash_gen_opts go;
        dflash_gen_default_opts(&go);
        go.n_new = 100;
        for (int seed = 0; seed < 2 && p; seed++) {
            prompt_for(t->cfg.vocab_size, 40, seed + 11, prompt);
            CHECK_OK(generate_fresh(t, NULL, prompt, 40, &go, plain, &n_plain, &st));
            go.width_auto = 1;
            CHECK_OK(generate_fresh(t, p, prompt, 40, &go, out, &n_out, &st));
            go.width_auto = 0;
            CHECKF(n_out == n_plain && memcmp(out, plain, (size_t)n_plain * sizeof(int32_t)) == 0,
                   "%s seed %d: auto width output differs from plain", ngram ? "ngram" : drafters[k], seed);
            int widths = 0;
            for (int w = 0; w < DFLASH_MAX_BLOCK; w++)
                widths += st.width_hist[w] > 0;
            CHECKF(widths >= 2, "%s: the auto width tried %d width(s)", ngram ? "ngram" : drafters[k], widths);
        }
        if (ngram)
            dflash_proposer_destroy(p);
        dflash_head_free(h);
        dflash_qwen3_free(t);
    }
}

/* Sampling draws each token with the uniform of its position, so for a
 * seed the speculative output is plain sampling's token for token, at any
 * block size and with the auto width. The oracle (drafting plain's sampled
 * tokens) must then see every draft accepted, its mirror none. */
static void test_sampled_equals_plain(void)
{
    dflash_qwen3 *t;
    dflash_head *h;
    if (!load_tied_pair(NULL, &t, &h))
        return;
    enum { NP = 30, NN = 60 };
    int32_t prompt[NP], plain[NN], out[NN], expect[NP + NN];
    int n_plain, n_out;
    dflash_gen_stats st;
    dflash_gen_opts go;
    dflash_gen_default_opts(&go);
    go.n_new = NN;
    go.sampler.temperature = 0.9;
    go.sampler.top_k = 40;
    go.sampler.rep_penalty = 1.1;
    for (uint64_t seed = 1; seed <= 3; seed++) {
        go.sampler.seed = seed;
        prompt_for(t->cfg.vocab_size, NP, (int)seed, prompt);
        CHECK_OK(generate_fresh(t, NULL, prompt, NP, &go, plain, &n_plain, &st));
        CHECK(n_plain == NN);
        const int blocks[] = { 2, 16, 16 };
        for (int b = 0; b < 3; b++) {
            go.block_size = blocks[b];
            go.width_auto = b == 2;
            CHECK_OK(generate_fresh(t, &h->proposer, prompt, NP, &go, out, &n_out, &st));
            CHECKF(n_out == NN && memcmp(out, plain, sizeof plain) == 0,
                   "seed %llu block %d auto %d: sampled speculative output differs from plain sampling",
                   (unsigned long long)seed, blocks[b], go.width_auto);
        }
        go.block_size = 0;
        go.width_auto = 0;
        /* the oracle knows plain's sampled continuation */
        memcpy(expect, prompt, sizeof prompt);
        memcpy(expect + NP, plain, sizeof plain);
        for (int mirror = 0; mirror < 2; mirror++) {
            oracle o;
            oracle_init(&o, expect, NP + NN, t->cfg.vocab_size, 8, mirror);
            CHECK_OK(generate_fresh(t, &o.proposer, prompt, NP, &go, out, &n_out, &st));
            int64_t tried = 0, acc = 0;
            for (int i = 0; i < 7; i++) {
                tried += st.pos_tried[i];
                acc += st.pos_accepted[i];
            }
            CHECKF(n_out == NN && memcmp(out, plain, sizeof plain) == 0, "seed %llu %s: output differs",
                   (unsigned long long)seed, mirror ? "anti-oracle" : "oracle");
            CHECKF(tried > 0 && acc == (mirror ? 0 : tried), "seed %llu %s: %lld of %lld drafts accepted",
                   (unsigned long long)seed, mirror ? "anti-oracle" : "oracle", (long long)acc, (long long)tried);
        }
    }
    dflash_head_free(h);
    dflash_qwen3_free(t);
}

/* The drafter's pool runs dry: the error names the drafter, and the target
 * cache and the drafter's context stay in step (nothing half-appended). */
static void test_drafter_pool_exhaustion(void)
{
    dflash_qwen3 *t;
    dflash_head *h;
    dflash_head_opts ho;
    dflash_head_default_opts(&ho);
    ho.ctx_cap = 16;
    ho.kv_pages = 1;
    if (!load_tied_pair(&ho, &t, &h))
        return;
    int32_t prompt[20], out[8];
    int n_out = 0;
    prompt_for(t->cfg.vocab_size, 20, 1, prompt);
    dflash_kv_seq seq;
    void *state;
    dflash_gen_opts go;
    dflash_gen_stats st;
    dflash_gen_default_opts(&go);
    go.n_new = 8;
    CHECK_OK(dflash_qwen3_seq_init(t, &seq));
    CHECK_OK(h->proposer.ops->alloc_state(&h->proposer, 100, &state));
    CHECK_FAILS(dflash_spec_generate(t, &seq, &h->proposer, state, prompt, 20, &go, out, &n_out, &st),
                DFLASH_ERR_KV_FULL, "drafter context: kv pool exhausted");
    dflash_proposer_state *ps = state;
    CHECKF(seq.len == ps->kv.len, "target holds %d rows, drafter %d", seq.len, ps->kv.len);
    h->proposer.ops->free_state(&h->proposer, state);
    dflash_qwen3_seq_free(t, &seq);
    dflash_head_free(h);
    dflash_qwen3_free(t);
}

int main(void)
{
    dflash_backend_cpu_create(&be);
    RUN(test_dflash_equals_plain);
    RUN(test_ngram_equals_plain_and_accepts);
    RUN(test_other_targets_equal_plain);
    RUN(test_dflash_on_moe_equals_plain);
    RUN(test_stop_tokens);
    RUN(test_continue_equals_fresh);
    RUN(test_drafter_pool_exhaustion);
    RUN(test_auto_width_equals_plain);
    RUN(test_deferred_rows_keep_caches_in_step);
    RUN(test_sampled_equals_plain);
    dflash_backend_destroy(be);
    TEST_END();
}
