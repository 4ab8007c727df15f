/* test_slow_engine.c: the public engine and session API (include/dflash.h)
 * on the embedded pair. Three sessions started together (a text prompt, an
 * id prompt, a seeded sampling one) and stepped with dflash_engine_step
 * each give what plain decoding of their prompt gives alone (the library's
 * one-sequence loop, no drafter); a second start continues a session as
 * decoding the whole conversation does, also after a start that did not
 * fit failed; a session cannot start while it runs, and an engine holds at
 * most max_sessions; a session whose token callback refuses more stops
 * alone, keeping its tokens, while the others run to the end; with the
 * cost-aware width every session still gives its plain output. */
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
    }
    dflash_tokenizer_free(g_tok);
    dflash_qwen3_free(g_plain);
    dflash_backend_destroy(g_be);
    TEST_END();
}
