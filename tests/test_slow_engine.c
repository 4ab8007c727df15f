/* test_slow_engine.c: the public engine and session API (include/dflash.h)
 * on the embedded pair. Three sessions started together (a text prompt, an
 * id prompt, a seeded sampling one) and stepped with dflash_engine_step
 * each give what plain decoding of their prompt gives alone (the library's
 * one-sequence loop, no drafter); a second start continues a session as
 * decoding the whole conversation does, also after a start that did not
 * fit failed; a session cannot start while it runs, and an engine holds at
 * most max_sessions; a session whose token callback refuses more stops
 * alone, keeping its tokens, while the others run to the end; with the
 * cost-aware width every session still gives its plain output; with a
 * small KV pool sessions wait for pages and join as others finish or are
 * freed, idle caches give way and their sessions still continue exactly,
 * a start that could never fit fails at once, and one whose pages are held
 * by a session waiting behind it stops with its reason; a long prompt
 * joins over several steps while another session keeps generating; a
 * session's own stop ids end it; 32 sessions of different lengths,
 * greedy and sampled, each give their plain output alone; a sampled
 * session continued gives what sampling the whole conversation does. */
#include "harness.h"

#include <stdlib.h>
#include <string.h>

#include "dflash.h"
#include "io/tokenizer.h"
#include "spec/spec.h"

#define TARGET "models/qwen3-pystd"
#define N_NEW 40

static dflash_backend *g_be;
static dflash_qwen3 *g_plain; /* the oracle: the target alone */
static dflash_tokenizer *g_tok;

/* Plain decoding of ids alone, stopping at the model's end of text unless
 * the options ignore it. */
static int plain_run(const int32_t *ids, int n, const dflash_session_opts *so, int32_t *out)
{
    dflash_gen_opts go;
    dflash_gen_default_opts(&go);
    go.n_new = so->max_tokens;
    go.sampler.temperature = so->temperature;
    go.sampler.top_k = so->top_k;
    go.sampler.top_p = so->top_p;
    go.sampler.min_p = so->min_p;
    go.sampler.rep_penalty = so->rep_penalty;
    go.sampler.frequency_penalty = so->frequency_penalty;
    go.sampler.presence_penalty = so->presence_penalty;
    go.sampler.seed = so->seed;
    int32_t eos = 4094; /* <|endoftext|> of the embedded tokenizer */
    go.stop_ids = &eos;
    go.n_stop = so->ignore_eos ? 0 : 1;
    dflash_kv_seq seq;
    dflash_gen_stats st;
    int n_out = 0;
    CHECK_OK(dflash_qwen3_seq_init(g_plain, &seq));
    CHECK_OK(dflash_spec_generate(g_plain, &seq, NULL, NULL, ids, n, &go, out, &n_out, &st));
    dflash_qwen3_seq_free(g_plain, &seq);
    return n_out;
}

static int same_output(const dflash_session *s, const int32_t *want, int n_want)
{
    const int32_t *ids;
    size_t n;
    dflash_session_output(s, &ids, &n);
    return (int)n == n_want && !memcmp(ids, want, n * sizeof *ids);
}

/* The embedded pair's engine options, with room for n sessions. */
static dflash_engine_opts pair_opts(int n)
{
    dflash_engine_opts eo;
    dflash_engine_default_opts(&eo);
    eo.model_dir = TARGET;
    eo.draft = "models/qwen3-pystd-dflash";
    eo.max_sessions = n;
    eo.max_ctx = 512;
    return eo;
}

static void test_sessions(void)
{
    dflash_engine_opts eo = pair_opts(3);
    dflash_engine *e = NULL;
    /* a folder that is not there is named */
    eo.model_dir = "/nonexistent/model";
    CHECK(dflash_engine_open(&eo, &e) != DFLASH_OK && e == NULL);
    CHECKF(strstr(dflash_last_error(), "/nonexistent/model") != NULL, "message: %s", dflash_last_error());
    eo.model_dir = TARGET;
    CHECK_OK(dflash_engine_open(&eo, &e));
    if (!e)
        return;
    CHECK(dflash_engine_max_ctx(e) == 512);
    CHECKF(dflash_engine_vocab_size(e) == g_plain->cfg.vocab_size && dflash_engine_block_size(e) == 16,
           "vocabulary %d (want %d), block %d (want the drafter's 16)", dflash_engine_vocab_size(e),
           g_plain->cfg.vocab_size, dflash_engine_block_size(e));
    const char *text = "def walk_files(root):\n    \"\"\"Yield the paths under root.\"\"\"\n";
    int32_t ids2[] = { 1, 2, 3, 4, 5, 6, 7 }, *ids1 = NULL;
    size_t n1 = 0;
    CHECK_OK(dflash_tokenizer_encode_special(g_tok, text, strlen(text), &ids1, &n1));
    dflash_session_opts so[3];
    dflash_session *s[3] = { 0 };
    for (int i = 0; i < 3; i++) {
        dflash_session_default_opts(&so[i]);
        so[i].max_tokens = N_NEW;
        CHECK_OK(dflash_session_new(e, &so[i], &s[i]));
    }
    so[2].temperature = 0.8, so[2].top_k = 40, so[2].seed = 11;
    dflash_session_free(s[2]);
    CHECK_OK(dflash_session_new(e, &so[2], &s[2]));
    dflash_session *extra = NULL;
    CHECK_FAILS(dflash_session_new(e, &so[0], &extra), DFLASH_ERR_INVALID_ARG, "max_sessions");
    if (!s[0] || !s[1] || !s[2])
        goto done;
    CHECK_OK(dflash_session_start_text(s[0], text));
    CHECK_OK(dflash_session_start_ids(s[1], ids2, 7));
    CHECK_OK(dflash_session_start_text(s[2], text));
    CHECK_FAILS(dflash_session_start_ids(s[1], ids2, 7), DFLASH_ERR_INVALID_ARG, "still generating");
    int active = 1, steps = 0;
    while (active && steps++ < 200)
        CHECK_OK(dflash_engine_step(e, &active));
    int32_t want[N_NEW];
    int nw = plain_run(ids1, (int)n1, &so[0], want);
    CHECKF(!dflash_session_running(s[0]) && same_output(s[0], want, nw), "text session differs from plain");
    nw = plain_run(ids2, 7, &so[1], want);
    CHECK(same_output(s[1], want, nw));
    nw = plain_run(ids1, (int)n1, &so[2], want);
    CHECKF(same_output(s[2], want, nw), "sampled session differs from plain sampling");
    char *out_text = NULL;
    CHECK_OK(dflash_session_text(s[0], &out_text));
    CHECK(out_text && strlen(out_text) > 0);
    free(out_text);

    /* a second start continues session 1: the whole conversation decoded plainly */
    const int32_t *o1;
    size_t no1;
    dflash_session_output(s[1], &o1, &no1);
    int32_t whole[7 + N_NEW + 5], more[] = { 9, 8, 7, 6, 5 };
    memcpy(whole, ids2, sizeof ids2);
    memcpy(whole + 7, o1, no1 * sizeof *o1);
    memcpy(whole + 7 + no1, more, sizeof more);
    int n_whole = 7 + (int)no1 + 5;
    /* a start that cannot fit fails and changes nothing: the next one
     * still continues from the same place */
    int32_t *too_long = calloc(600, sizeof *too_long);
    CHECK(too_long != NULL);
    if (too_long)
        CHECK_FAILS(dflash_session_start_ids(s[1], too_long, 600), DFLASH_ERR_INVALID_ARG, "context limit");
    free(too_long);
    CHECK_OK(dflash_session_start_ids(s[1], more, 5));
    for (active = 1, steps = 0; active && steps++ < 200;)
        CHECK_OK(dflash_engine_step(e, &active));
    nw = plain_run(whole, n_whole, &so[1], want);
    CHECKF(same_output(s[1], want, nw), "continued session differs from the whole conversation decoded plainly");
    dflash_session_stats st;
    dflash_session_stats_get(s[1], &st);
    CHECK(st.prompt_tokens == 6 && st.generated_tokens == nw && st.steps > 0 && st.mean_accept >= 1.0);
    int64_t widths = 0;
    for (int k = 0; k <= DFLASH_STATS_POSITIONS; k++)
        widths += st.width_hist[k];
    CHECKF(widths == st.steps && !st.stopped, "width histogram %lld over %d steps, stopped %d", (long long)widths,
           st.steps, st.stopped);
    CHECKF(st.prefill_ms > 0 && st.verify_ms > 0 && st.draft_ms > 0 && st.total_ms >= st.prefill_ms + st.verify_ms &&
               st.tokens_per_s > 0,
           "times: prefill %g, draft %g, verify %g, total %g ms, %g tokens/s", st.prefill_ms, st.draft_ms, st.verify_ms,
           st.total_ms, st.tokens_per_s);
done:
    for (int i = 0; i < 3; i++)
        dflash_session_free(s[i]);
    free(ids1);
    dflash_engine_close(e);
}

/* on_tokens that takes tokens until it holds at least `limit`, then
 * refuses more. */
typedef struct take_some {
    int limit, got;
} take_some;

static dflash_status take_until(void *user, const int32_t *ids, int n)
{
    (void)ids;
    take_some *t = user;
    t->got += n;
    return t->got >= t->limit ? DFLASH_ERR_IO : DFLASH_OK;
}

static void test_callback_stops_one(void)
{
    dflash_engine_opts eo = pair_opts(2);
    dflash_engine *e = NULL;
    eo.ctx_cap = -2;
    CHECK_FAILS(dflash_engine_open(&eo, &e), DFLASH_ERR_INVALID_ARG, "ctx_cap");
    eo.ctx_cap = 16; /* a drafter window shorter than the prompts: drafts change, outputs do not */
    CHECK_OK(dflash_engine_open(&eo, &e));
    if (!e)
        return;
    const char *text = "import os\n\n\ndef main():\n";
    int32_t *ids = NULL;
    size_t n = 0;
    CHECK_OK(dflash_tokenizer_encode_special(g_tok, text, strlen(text), &ids, &n));
    take_some t = { .limit = 3 };
    dflash_session_opts so[2];
    dflash_session *s[2] = { 0 };
    for (int i = 0; i < 2; i++) {
        dflash_session_default_opts(&so[i]);
        so[i].max_tokens = N_NEW;
        so[i].ignore_eos = 1;
    }
    so[0].on_tokens = take_until;
    so[0].user = &t;
    for (int i = 0; i < 2; i++) {
        CHECK_OK(dflash_session_new(e, &so[i], &s[i]));
        if (s[i])
            CHECK_OK(dflash_session_start_ids(s[i], ids, n));
    }
    int active = 1, steps = 0;
    while (active && steps++ < 200)
        CHECK_OK(dflash_engine_step(e, &active));
    int32_t want[N_NEW];
    int nw = plain_run(ids, (int)n, &so[1], want);
    CHECKF(nw == N_NEW && same_output(s[1], want, nw), "the other session did not run to its end (%d tokens)", nw);
    const int32_t *o0;
    size_t n0;
    dflash_session_output(s[0], &o0, &n0);
    CHECKF(n0 >= 3 && n0 < N_NEW && (int)n0 == t.got && !memcmp(o0, want, n0 * sizeof *o0),
           "the refusing session holds %zu tokens (callback saw %d), want a prefix of at least 3", n0, t.got);
    for (int i = 0; i < 2; i++)
        dflash_session_free(s[i]);
    free(ids);
    dflash_engine_close(e);
}

static void test_width_auto(void)
{
    dflash_engine_opts eo = pair_opts(3);
    eo.width_auto = 1;
    eo.max_ctx = 1 << 20; /* past the model's: the model's context length bounds it */
    dflash_engine *e = NULL;
    CHECK_OK(dflash_engine_open(&eo, &e));
    if (!e)
        return;
    CHECK(dflash_engine_max_ctx(e) == g_plain->cfg.max_position_embeddings);
    {
        /* past the model's context length only when asked */
        dflash_engine_opts lo = pair_opts(1);
        lo.max_ctx = g_plain->cfg.max_position_embeddings + 512;
        lo.long_context = 1;
        dflash_engine *le = NULL;
        CHECK_OK(dflash_engine_open(&lo, &le));
        CHECK(le && dflash_engine_max_ctx(le) == lo.max_ctx);
        dflash_engine_close(le);
    }
    const char *texts[3] = { "class Node:\n    def __init__(self):\n", "import json\n\n\ndef load(path):\n",
                             "def parse_args(argv):\n" };
    int32_t *ids[3] = { 0 };
    size_t n[3] = { 0 };
    dflash_session_opts so[3];
    dflash_session *s[3] = { 0 };
    for (int i = 0; i < 3; i++) {
        CHECK_OK(dflash_tokenizer_encode_special(g_tok, texts[i], strlen(texts[i]), &ids[i], &n[i]));
        dflash_session_default_opts(&so[i]);
        so[i].max_tokens = N_NEW;
        if (i == 2)
            so[i].temperature = 0.7, so[i].top_k = 20, so[i].seed = 5;
        CHECK_OK(dflash_session_new(e, &so[i], &s[i]));
        if (s[i])
            CHECK_OK(dflash_session_start_ids(s[i], ids[i], n[i]));
    }
    int active = 1, steps = 0;
    while (active && steps++ < 400)
        CHECK_OK(dflash_engine_step(e, &active));
    for (int i = 0; i < 3; i++) {
        int32_t want[N_NEW];
        int nw = plain_run(ids[i], (int)n[i], &so[i], want);
        CHECKF(s[i] && same_output(s[i], want, nw), "session %d with the auto width differs from plain", i);
        dflash_session_free(s[i]);
        free(ids[i]);
    }
    dflash_engine_close(e);
}

/* Output so far of a session. */
static size_t n_output(const dflash_session *s)
{
    const int32_t *ids;
    size_t n;
    dflash_session_output(s, &ids, &n);
    return n;
}

/* One session's whole conversation (history, then the carried last
 * token and `more`) decoded plainly must equal what it generated. */
static void check_continued(const dflash_session *s, const int32_t *hist, int n_hist, const int32_t *more, int n_more,
                            const dflash_session_opts *so, const char *what)
{
    int32_t whole[256], want[N_NEW];
    memcpy(whole, hist, (size_t)n_hist * sizeof *hist);
    memcpy(whole + n_hist, more, (size_t)n_more * sizeof *more);
    int nw = plain_run(whole, n_hist + n_more, so, want);
    CHECKF(same_output(s, want, nw), "%s differs from its whole conversation decoded plainly", what);
}

/* Pages a start reaching `positions` needs. */
static int pages(int positions) { return (positions + 15) / 16; }

/* KV admission with a pool that holds the first two starts and one page
 * more (a start reaches prompt + 40 new + 16 positions): the third waits
 * and joins when an idle cache is given up; sessions continue exactly,
 * also one whose cache was given up; a start waits behind a running one
 * and joins when that one is freed mid-run; one that could never fit
 * fails at once. Every output equals plain decoding's. */
static void test_kv_admission(void)
{
    const char *texts[4] = { "def add(a, b):\n", "import sys\n", "class Stack:\n", "def main():\n" };
    int32_t *ids[4] = { 0 };
    size_t n[4] = { 0 };
    int need[4];
    for (int i = 0; i < 4; i++) {
        CHECK_OK(dflash_tokenizer_encode_special(g_tok, texts[i], strlen(texts[i]), &ids[i], &n[i]));
        need[i] = pages((int)n[i] + N_NEW + 16);
    }
    const int pool = need[0] + need[1] + 1;
    /* a continuation reaches the history (prompt + 39 tokens), the
     * carried last token, 5 more ids, 40 new and a block */
    for (int i = 0; i < 3; i++)
        CHECK(pages((int)n[i] + N_NEW + 5 + N_NEW + 16) <= pool);
    CHECK(need[2] > 1 && need[3] > 1);
    dflash_engine_opts eo = pair_opts(5);
    eo.kv_pages = pool;
    dflash_engine *e = NULL;
    CHECK_OK(dflash_engine_open(&eo, &e));
    dflash_session_opts so;
    dflash_session_default_opts(&so);
    so.max_tokens = N_NEW;
    so.ignore_eos = 1;
    dflash_session *s[4] = { 0 };
    for (int i = 0; i < 4 && e; i++)
        CHECK_OK(dflash_session_new(e, &so, &s[i]));
    for (int i = 0; i < 4; i++)
        if (!s[i] || !ids[i])
            goto done;
    for (int i = 0; i < 3; i++)
        CHECK_OK(dflash_session_start_ids(s[i], ids[i], n[i]));
    for (int i = 0; i < 3; i++)
        CHECK(dflash_session_running(s[i]) && n_output(s[i]) == 0);
    int active = 1, steps = 0, waited = 0;
    CHECK_OK(dflash_engine_step(e, &active));
    CHECKF(n_output(s[0]) >= 1 && n_output(s[1]) >= 1, "the first two run from the first step");
    CHECKF(dflash_session_running(s[2]) && n_output(s[2]) == 0, "the third waits for pages");
    while (active && steps++ < 400) {
        const int room = !dflash_session_running(s[0]) || !dflash_session_running(s[1]);
        const size_t before = n_output(s[2]);
        CHECK_OK(dflash_engine_step(e, &active));
        if (before == 0 && n_output(s[2]) > 0)
            CHECKF(room, "the third joined while both others still ran");
        waited += n_output(s[2]) == 0;
    }
    CHECKF(waited >= 1, "the third never waited");
    for (int i = 0; i < 3; i++) {
        int32_t want[N_NEW];
        int nw = plain_run(ids[i], (int)n[i], &so, want);
        CHECKF(nw == N_NEW && same_output(s[i], want, nw), "session %d differs from plain decoding", i);
    }

    /* each continues in turn: admitting the third gave up an idle cache,
     * so at least one continuation runs its whole history again (its
     * prompt counts it), and every one continues exactly */
    int evicted = 0;
    for (int i = 0; i < 3; i++) {
        int32_t hist[128], more[] = { 9, 8, 7, 6, 5 };
        const int32_t *o;
        size_t no;
        dflash_session_output(s[i], &o, &no);
        memcpy(hist, ids[i], n[i] * sizeof *hist);
        memcpy(hist + n[i], o, no * sizeof *o);
        const int n_hist = (int)(n[i] + no);
        CHECK_OK(dflash_session_start_ids(s[i], more, 5));
        for (active = 1, steps = 0; active && steps++ < 400;)
            CHECK_OK(dflash_engine_step(e, &active));
        check_continued(s[i], hist, n_hist, more, 5, &so, "a continued session");
        dflash_session_stats st;
        dflash_session_stats_get(s[i], &st);
        CHECK(st.prompt_tokens == 6 || st.prompt_tokens == n_hist + 5);
        evicted += st.prompt_tokens == n_hist + 5;
    }
    CHECKF(evicted >= 1, "no continuation ran from a cache that was given up");

    /* a start that leaves one page free holds the pool: a fresh start
     * waits behind it and joins once it is freed mid-run */
    dflash_session_opts hold = so;
    hold.max_tokens = 16 * (pool - 1) - 16 - (int)n[0];
    dflash_session *h = NULL;
    CHECK_OK(dflash_session_new(e, &hold, &h));
    if (!h)
        goto done;
    CHECK_OK(dflash_session_start_ids(h, ids[0], n[0]));
    CHECK_OK(dflash_session_start_ids(s[3], ids[3], n[3]));
    CHECK_OK(dflash_engine_step(e, &active));
    CHECKF(dflash_session_running(h) && n_output(h) >= 1, "the large start runs from the first step");
    CHECKF(dflash_session_running(s[3]) && n_output(s[3]) == 0, "the fresh start waits behind it");
    CHECK_OK(dflash_engine_step(e, &active));
    CHECKF(n_output(s[3]) == 0 && n_output(h) > 1, "still waiting while the large one runs");
    dflash_session_free(h);
    for (active = 1, steps = 0; active && steps++ < 400;)
        CHECK_OK(dflash_engine_step(e, &active));
    int32_t want[N_NEW];
    int nw = plain_run(ids[3], (int)n[3], &so, want);
    CHECKF(same_output(s[3], want, nw), "the session that waited for a freed one differs from plain decoding");
    /* more than the whole pool: at once, naming the pages */
    dflash_session_opts big = so;
    big.max_tokens = 200;
    dflash_session *b = NULL;
    CHECK_OK(dflash_session_new(e, &big, &b));
    if (b)
        CHECK_FAILS(dflash_session_start_ids(b, ids[1], n[1]), DFLASH_ERR_KV_FULL, "kv_pages");
    dflash_session_free(b);
done:
    for (int i = 0; i < 4; i++) {
        dflash_session_free(s[i]);
        free(ids[i]);
    }
    dflash_engine_close(e);
}

/* A start that needs the whole pool waits behind a running one; a
 * session that finished meanwhile continues and queues behind it, keeping
 * its cache for that start. When the running one is done, the pages the
 * first needs are held by the one waiting behind it: the first stops
 * with DFLASH_ERR_KV_FULL (dflash_session_error says why) and the second
 * joins and continues exactly. */
static void test_kv_blocked_behind(void)
{
    const char *texts[3] = { "def add(a, b):\n", "import sys\n", "class Stack:\n" };
    int32_t *ids[3] = { 0 };
    size_t n[3] = { 0 };
    for (int i = 0; i < 3; i++)
        CHECK_OK(dflash_tokenizer_encode_special(g_tok, texts[i], strlen(texts[i]), &ids[i], &n[i]));
    dflash_session_opts so[3];
    for (int i = 0; i < 3; i++) {
        dflash_session_default_opts(&so[i]);
        so[i].ignore_eos = 1;
    }
    so[0].max_tokens = N_NEW; /* runs long */
    so[1].max_tokens = 8;     /* done soon, then continues */
    const int pool = pages((int)n[0] + N_NEW + 16) + pages((int)n[1] + 8 + 5 + 8 + 16);
    so[2].max_tokens = 16 * pool - 16 - (int)n[2]; /* the whole pool */
    dflash_engine_opts eo = pair_opts(3);
    eo.kv_pages = pool;
    dflash_engine *e = NULL;
    CHECK_OK(dflash_engine_open(&eo, &e));
    dflash_session *s[3] = { 0 };
    for (int i = 0; i < 3 && e; i++)
        CHECK_OK(dflash_session_new(e, &so[i], &s[i]));
    if (!s[0] || !s[1] || !s[2])
        goto done;
    CHECK_OK(dflash_session_start_ids(s[0], ids[0], n[0]));
    CHECK_OK(dflash_session_start_ids(s[1], ids[1], n[1]));
    CHECK_OK(dflash_session_start_ids(s[2], ids[2], n[2]));
    CHECKF(n_output(s[2]) == 0 && dflash_session_running(s[2]), "the start needing the whole pool waits");
    int active = 1, steps = 0;
    while (dflash_session_running(s[1]) && steps++ < 100)
        CHECK_OK(dflash_engine_step(e, &active));
    CHECKF(dflash_session_running(s[0]), "the long one still runs when the short one is done");
    int32_t hist[64], more[] = { 9, 8, 7, 6, 5 };
    const int32_t *o;
    size_t no;
    dflash_session_output(s[1], &o, &no);
    memcpy(hist, ids[1], n[1] * sizeof *hist);
    memcpy(hist + n[1], o, no * sizeof *o);
    CHECK_OK(dflash_session_start_ids(s[1], more, 5));
    CHECK_OK(dflash_engine_step(e, &active));
    CHECKF(n_output(s[1]) == 0 || !dflash_session_running(s[0]), "the continuation queues behind the waiting start");
    for (active = 1, steps = 0; active && steps++ < 400;)
        CHECK_OK(dflash_engine_step(e, &active));
    const char *msg = NULL;
    CHECK(dflash_session_error(s[2], &msg) == DFLASH_ERR_KV_FULL && !dflash_session_running(s[2]));
    CHECKF(msg && strstr(msg, "waiting behind"), "message: %s", msg ? msg : "(none)");
    CHECK(n_output(s[2]) == 0);
    check_continued(s[1], hist, (int)(n[1] + no), more, 5, &so[1], "the continuation that waited");
    CHECK(dflash_session_error(s[1], &msg) == DFLASH_OK && msg && !*msg);
done:
    for (int i = 0; i < 3; i++) {
        dflash_session_free(s[i]);
        free(ids[i]);
    }
    dflash_engine_close(e);
}

/* A long prompt joins while another session runs: its rows go through the
 * target a forward's worth (64 rows) per step, and the running session
 * gets tokens in every one of those steps; both equal plain decoding. */
static void test_chunked_prefill(void)
{
    dflash_engine_opts eo = pair_opts(2);
    dflash_engine *e = NULL;
    CHECK_OK(dflash_engine_open(&eo, &e));
    if (!e)
        return;
    const char *text = "import os\n\n\ndef main():\n";
    int32_t *ids = NULL, long_ids[300];
    size_t n = 0;
    CHECK_OK(dflash_tokenizer_encode_special(g_tok, text, strlen(text), &ids, &n));
    for (int i = 0; i < 300; i++)
        long_ids[i] = 100 + (i * 37) % 3000; /* 300 rows: 5 steps of 64 */
    dflash_session_opts so;
    dflash_session_default_opts(&so);
    so.max_tokens = N_NEW;
    so.ignore_eos = 1;
    dflash_session *a = NULL, *b = NULL;
    CHECK_OK(dflash_session_new(e, &so, &a));
    CHECK_OK(dflash_session_new(e, &so, &b));
    if (!a || !b || !ids)
        goto done;
    CHECK_OK(dflash_session_start_ids(a, ids, n));
    int active = 1;
    CHECK_OK(dflash_engine_step(e, &active));
    CHECK_OK(dflash_session_start_ids(b, long_ids, 300));
    int steps_joining = 0, a_grew = 1;
    while (n_output(b) == 0 && steps_joining < 10) {
        const size_t before = n_output(a);
        CHECK_OK(dflash_engine_step(e, &active));
        a_grew &= n_output(a) > before || !dflash_session_running(a);
        steps_joining++;
    }
    CHECKF(steps_joining == 5, "the 300-row prompt took %d steps to join, want 5 (64 rows per step)", steps_joining);
    CHECKF(a_grew, "the running session stalled while the long prompt joined");
    for (int steps = 0; active && steps++ < 400;)
        CHECK_OK(dflash_engine_step(e, &active));
    int32_t want[N_NEW];
    int nw = plain_run(ids, (int)n, &so, want);
    CHECKF(same_output(a, want, nw), "the running session differs from plain decoding");
    nw = plain_run(long_ids, 300, &so, want);
    CHECKF(same_output(b, want, nw), "the long prompt's session differs from plain decoding");
done:
    dflash_session_free(a);
    dflash_session_free(b);
    free(ids);
    dflash_engine_close(e);
}

/* A session's own stop ids end it at that token (emitted), on top of the
 * model's; ids outside the vocabulary are refused. */
static void test_stop_ids(void)
{
    dflash_engine_opts eo = pair_opts(1);
    dflash_engine *e = NULL;
    CHECK_OK(dflash_engine_open(&eo, &e));
    if (!e)
        return;
    const char *text = "def main():\n";
    int32_t *ids = NULL;
    size_t n = 0;
    CHECK_OK(dflash_tokenizer_encode_special(g_tok, text, strlen(text), &ids, &n));
    dflash_session_opts so;
    dflash_session_default_opts(&so);
    so.max_tokens = N_NEW;
    so.ignore_eos = 1;
    int32_t want[N_NEW];
    int nw = plain_run(ids, (int)n, &so, want);
    /* the first token from the fourth on that did not come before */
    int cut = -1;
    for (int i = 3; i < nw && cut < 0; i++) {
        int seen = 0;
        for (int j = 0; j < i; j++)
            seen |= want[j] == want[i];
        if (!seen)
            cut = i;
    }
    CHECK(cut > 0);
    dflash_session *s = NULL;
    int32_t bad = 1 << 20;
    so.stop_ids = &bad;
    so.n_stop_ids = 1;
    CHECK_FAILS(dflash_session_new(e, &so, &s), DFLASH_ERR_INVALID_ARG, "stop id");
    int32_t stop = cut > 0 ? want[cut] : 0;
    so.stop_ids = &stop;
    CHECK_OK(dflash_session_new(e, &so, &s));
    if (s && cut > 0) {
        CHECK_OK(dflash_session_start_ids(s, ids, n));
        for (int active = 1, steps = 0; active && steps++ < 200;)
            CHECK_OK(dflash_engine_step(e, &active));
        CHECKF(same_output(s, want, cut + 1), "the session did not stop at its stop id (token %d)", cut);
        dflash_session_stats st;
        dflash_session_stats_get(s, &st);
        CHECK(st.stopped);
    }
    dflash_session_free(s);
    free(ids);
    dflash_engine_close(e);
}

/* Token counts of each step, from on_tokens. */
typedef struct step_log {
    int n, ends[N_NEW + 1]; /* ends[i]: tokens out after call i */
} step_log;

static dflash_status log_step(void *user, const int32_t *ids, int n)
{
    (void)ids;
    step_log *l = user;
    if (l->n < N_NEW)
        l->ends[l->n + 1] = l->ends[l->n] + n, l->n++;
    return DFLASH_OK;
}

/* Run `ids` in a fresh session of e with options so to the end. */
static dflash_session *run_session(dflash_engine *e, const dflash_session_opts *so, const int32_t *ids, size_t n)
{
    dflash_session *s = NULL;
    CHECK_OK(dflash_session_new(e, so, &s));
    if (!s)
        return NULL;
    CHECK_OK(dflash_session_start_ids(s, ids, n));
    int active = 1, steps = 0;
    while (active && steps++ < 200)
        CHECK_OK(dflash_engine_step(e, &active));
    return s;
}

/* Session i of the many-sessions test: its prompt (3..39 ids) and its
 * options (greedy or sampled with its own seed and filters, a repetition
 * penalty on some, budgets of 5..40, a few ignoring the end of text). */
#define MANY 32
static int many_setup(int i, int32_t *ids, dflash_session_opts *so)
{
    const int n = 3 + (i * 7) % 37;
    for (int j = 0; j < n; j++)
        ids[j] = 1 + (int32_t)((i * 131 + j * 17 + j * j) % 4000);
    dflash_session_default_opts(so);
    so->max_tokens = 5 + (i * 11) % 36;
    so->ignore_eos = i % 5 == 4;
    if (i % 2) {
        so->temperature = 0.6 + 0.1 * (i % 4);
        so->seed = 100 + (uint64_t)i;
        if (i % 4 == 1)
            so->top_k = 40;
        else
            so->top_p = 0.9;
    }
    if (i % 3 == 0)
        so->rep_penalty = 1.2;
    if (i % 3 == 1) {
        so->frequency_penalty = 0.5;
        so->presence_penalty = 0.3;
    }
    return n;
}

/* 32 sessions of different lengths, greedy and sampled, stepped together
 * (the drafter at the batch's cost-aware width): each gives what plain
 * decoding of its prompt gives alone. */
static void test_many_sessions_equal_alone(void)
{
    dflash_engine_opts eo = pair_opts(MANY);
    eo.width_auto = 1;
    dflash_engine *e = NULL;
    CHECK_OK(dflash_engine_open(&eo, &e));
    if (!e)
        return;
    static int32_t ids[MANY][40];
    int n[MANY];
    dflash_session_opts so[MANY];
    dflash_session *s[MANY] = { 0 };
    for (int i = 0; i < MANY; i++) {
        n[i] = many_setup(i, ids[i], &so[i]);
        CHECK_OK(dflash_session_new(e, &so[i], &s[i]));
        if (s[i])
            CHECK_OK(dflash_session_start_ids(s[i], ids[i], (size_t)n[i]));
    }
    int active = 1, steps = 0;
    while (active && steps++ < 400)
        CHECK_OK(dflash_engine_step(e, &active));
    int differ = 0, sampled = 0;
    for (int i = 0; i < MANY; i++) {
        int32_t want[N_NEW];
        int nw = plain_run(ids[i], n[i], &so[i], want);
        if (!s[i] || !same_output(s[i], want, nw)) {
            differ++;
            printf("  session %d (%s) differs from its plain decoding alone\n", i,
                   so[i].temperature > 0 ? "sampled" : "greedy");
        }
        sampled += so[i].temperature > 0;
        dflash_session_free(s[i]);
    }
    CHECKF(differ == 0 && sampled == MANY / 2, "%d of %d sessions differ", differ, MANY);
    dflash_engine_close(e);
}

/* A sampled session continued (a chat's next turn) keeps its sampling: the
 * second start gives what sampling the whole conversation in one start
 * gives, penalties included (the repetition penalty counts what the
 * session holds; frequency and presence count the start's own output,
 * which the whole conversation's one start generates as well). */
static void test_sampled_continuation(void)
{
    dflash_engine_opts eo = pair_opts(1);
    dflash_engine *e = NULL;
    CHECK_OK(dflash_engine_open(&eo, &e));
    if (!e)
        return;
    dflash_session_opts so;
    dflash_session_default_opts(&so);
    so.max_tokens = 20;
    so.temperature = 0.9;
    so.top_k = 50;
    so.rep_penalty = 1.3;
    so.frequency_penalty = 0.4;
    so.presence_penalty = 0.2;
    so.seed = 77;
    so.ignore_eos = 1;
    int32_t first[] = { 754, 677, 198, 476 }, more[] = { 198, 476, 798, 1571, 11 };
    dflash_session *s = run_session(e, &so, first, 4);
    if (!s) {
        dflash_engine_close(e);
        return;
    }
    const int32_t *o1;
    size_t n1;
    dflash_session_output(s, &o1, &n1);
    int32_t whole[4 + 20 + 5];
    memcpy(whole, first, sizeof first);
    memcpy(whole + 4, o1, n1 * sizeof *o1);
    memcpy(whole + 4 + n1, more, sizeof more);
    const int n_whole = 4 + (int)n1 + 5;
    CHECK_OK(dflash_session_start_ids(s, more, 5));
    int active = 1, steps = 0;
    while (active && steps++ < 200)
        CHECK_OK(dflash_engine_step(e, &active));
    int32_t want[N_NEW];
    int nw = plain_run(whole, n_whole, &so, want);
    CHECKF(n1 == 20 && same_output(s, want, nw), "the second turn differs from sampling the whole conversation");
    dflash_session_free(s);
    dflash_engine_close(e);
}

/* Plain decoding's first token whose text (of want[0..t)) holds stop, or 0. */
static int completing_token(const int32_t *want, int nw, const char *stop)
{
    for (int t = 1; t <= nw; t++) {
        char *part = NULL;
        size_t pl;
        CHECK_OK(dflash_tokenizer_decode(g_tok, want, (size_t)t, DFLASH_DECODE_SKIP_SPECIAL, &part, &pl));
        const int hit = part && strstr(part, stop);
        free(part);
        if (hit)
            return t;
    }
    return 0;
}

/* Stop strings: the session stops after the token that completes one --
 * here one inside a speculative step, so drafts accepted past it are
 * dropped from the output and the caches -- its text ends where the string
 * begins, and a later start continues exactly after the kept tokens; the
 * first token can stop it too; malformed stop strings are refused by name. */
static void test_stop_strings(void)
{
    const char *prompt = "def read_config(path):\n    \"\"\"Load the settings.\"\"\"\n";
    int32_t *ids = NULL, want[N_NEW], whole[512];
    size_t n = 0;
    char *full = NULL, *got = NULL;
    dflash_engine *e = NULL;
    dflash_session *s = NULL, *s0 = NULL;
    CHECK_OK(dflash_tokenizer_encode_special(g_tok, prompt, strlen(prompt), &ids, &n));
    dflash_session_opts so;
    dflash_session_default_opts(&so);
    so.max_tokens = N_NEW;
    so.ignore_eos = 1;
    const int nw = plain_run(ids, (int)n, &so, want);
    size_t len = 0;
    CHECK_OK(dflash_tokenizer_decode(g_tok, want, (size_t)nw, DFLASH_DECODE_SKIP_SPECIAL, &full, &len));
    dflash_engine_opts eo = pair_opts(1);
    CHECK_OK(dflash_engine_open(&eo, &e));
    if (!e || !full)
        goto done;

    /* the steps as the drafter takes them without stop strings */
    step_log lg = { 0 };
    so.on_tokens = log_step;
    so.user = &lg;
    s0 = run_session(e, &so, ids, n);
    so.on_tokens = NULL;
    CHECK(s0 && same_output(s0, want, nw));
    dflash_session_free(s0);
    s0 = NULL;
    /* a 5-byte stop string, first found at p, completed by a token that
     * is not the last of its step */
    char stop[6] = { 0 };
    size_t p = len / 3;
    int keep = 0;
    for (; p + 5 <= len && !keep; p++) {
        memcpy(stop, full + p, 5);
        if (memchr(stop, 0, 5) || strstr(full, stop) != full + p)
            continue;
        const int t = completing_token(want, nw, stop);
        int at_end = 0;
        for (int i = 1; i <= lg.n; i++)
            at_end |= lg.ends[i] == t;
        if (t > 1 && !at_end)
            keep = t;
    }
    p--;
    CHECKF(keep > 0, "no stop string ends inside a step (%d steps for %d tokens)", lg.n, nw);
    if (!keep)
        goto done;

    const char *bad[DFLASH_MAX_STOP_STRINGS + 1] = { "a", "b", "c", "d", "e", "f", "g", "h", "i" };
    char too_long[DFLASH_MAX_STOP_LEN + 2];
    memset(too_long, 'x', sizeof too_long - 1);
    too_long[sizeof too_long - 1] = 0;
    const struct {
        const char *const *strs;
        int n;
        const char *why;
    } refused[] = {
        { bad, DFLASH_MAX_STOP_STRINGS + 1, "stop strings (at most" },
        { (const char *const[]){ "" }, 1, "stop string 0 is empty" },
        { (const char *const[]){ "ok", NULL }, 2, "stop string 1 is NULL" },
        { (const char *const[]){ too_long }, 1, "stop string 0 is too long" },
        { (const char *const[]){ "\xff\xfe" }, 1, "not valid UTF-8" },
        { (const char *const[]){ "a\xef\xbf\xbd" }, 1, "U+FFFD" },
        { NULL, 1, "stop_strings is NULL" },
    };
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        so.stop_strings = refused[i].strs;
        so.n_stop_strings = refused[i].n;
        CHECK_FAILS(dflash_session_new(e, &so, &s), DFLASH_ERR_INVALID_ARG, refused[i].why);
    }

    const char *stops[2] = { "\x01never", stop };
    so.stop_strings = stops;
    so.n_stop_strings = 2;
    s = run_session(e, &so, ids, n);
    if (!s)
        goto done;
    CHECKF(same_output(s, want, keep), "output is not plain decoding's first %d tokens", keep);
    CHECK_OK(dflash_session_text(s, &got));
    CHECKF(got && strlen(got) == p && !strncmp(got, full, p), "text '%s', want the first %zu bytes of '%s'",
           got ? got : "", p, full);
    dflash_session_stats st;
    dflash_session_stats_get(s, &st);
    CHECK(st.stopped && st.generated_tokens == keep);

    /* the next start continues after the kept tokens: the whole
     * conversation decoded plainly, up to where the stop string may come
     * again */
    int32_t more[] = { 9, 8, 7 };
    memcpy(whole, ids, n * sizeof *ids);
    memcpy(whole + n, want, (size_t)keep * sizeof *want);
    memcpy(whole + n + keep, more, sizeof more);
    const int nw2 = plain_run(whole, (int)n + keep + 3, &so, want);
    CHECK_OK(dflash_session_start_ids(s, more, 3));
    int active = 1;
    for (int steps = 0; active && steps++ < 200;)
        CHECK_OK(dflash_engine_step(e, &active));
    const int32_t *o2;
    size_t n2;
    dflash_session_output(s, &o2, &n2);
    CHECKF(n2 >= 1 && (int)n2 <= nw2 && !memcmp(o2, want, n2 * sizeof *o2),
           "continued output (%zu tokens) differs from plain decoding of the whole conversation", n2);
    dflash_session_free(s);
    s = NULL;

    /* the first token completes the stop string: it is kept, the text is empty */
    char first_text[DFLASH_MAX_STOP_LEN + 1] = { 0 };
    plain_run(ids, (int)n, &so, want);
    char *t1 = NULL;
    size_t l1 = 0;
    CHECK_OK(dflash_tokenizer_decode(g_tok, want, 1, DFLASH_DECODE_SKIP_SPECIAL, &t1, &l1));
    if (t1 && l1 >= 1 && l1 <= DFLASH_MAX_STOP_LEN)
        memcpy(first_text, t1, l1);
    free(t1);
    CHECK(first_text[0] != 0);
    const char *first_stop[1] = { first_text };
    so.stop_strings = first_stop;
    so.n_stop_strings = 1;
    s = run_session(e, &so, ids, n);
    free(got);
    got = NULL;
    if (s) {
        CHECK(same_output(s, want, 1));
        CHECK_OK(dflash_session_text(s, &got));
        CHECKF(got && got[0] == 0, "text after a first-token stop: '%s'", got ? got : "");
    }
done:
    dflash_session_free(s0);
    dflash_session_free(s);
    dflash_engine_close(e);
    free(ids), free(full), free(got);
}

/* An engine without a drafter commits one token a step. */
static void test_plain_block(void)
{
    dflash_engine_opts eo = pair_opts(2);
    eo.draft = NULL;
    dflash_engine *e = NULL;
    CHECK_OK(dflash_engine_open(&eo, &e));
    if (!e)
        return;
    CHECKF(dflash_engine_block_size(e) == 1 && dflash_engine_vocab_size(e) == g_plain->cfg.vocab_size,
           "plain engine: block %d, vocabulary %d", dflash_engine_block_size(e), dflash_engine_vocab_size(e));
    dflash_engine_close(e);
}

int main(void)
{
    CHECK_OK(dflash_backend_cpu_create(&g_be));
    dflash_qwen3_opts to;
    dflash_qwen3_default_opts(&to);
    to.max_ctx = 512;
    CHECK_OK(dflash_qwen3_load(TARGET, g_be, &to, &g_plain));
    CHECK_OK(dflash_tokenizer_load(TARGET, &g_tok));
    if (g_plain && g_tok) {
        RUN(test_sessions);
        RUN(test_callback_stops_one);
        RUN(test_width_auto);
        RUN(test_kv_admission);
        RUN(test_kv_blocked_behind);
        RUN(test_chunked_prefill);
        RUN(test_stop_ids);
        RUN(test_plain_block);
        RUN(test_stop_strings);
        RUN(test_many_sessions_equal_alone);
        RUN(test_sampled_continuation);
    }
    dflash_tokenizer_free(g_tok);
    dflash_qwen3_free(g_plain);
    dflash_backend_destroy(g_be);
    TEST_END();
}
