/* test_chat_checks.c: what src/io/chat refuses or falls back to before a
 * conversation runs. The chat format's markup (<|im_start|>, <|im_end|>,
 * <think>, </think>) must be single added tokens of the tokenizer, or
 * encoding a chat fails naming the token and the tokenizer file; and the
 * end-of-sequence ids come from tokenizer_config.json, generation_config.json
 * or, failing those, config.json, the only one a minimal model folder has.
 * The format (Qwen3, Llama 3) comes from tokenizer_config.json's
 * chat_template, else from the tokenizer's markup; templates dflash does
 * not render are refused naming the file. Tokenizers are variants of tests/data/tokenizer/tiny (ids 0..255 are
 * bytes; 275 <|im_start|>, 276 <|im_end|>, 277 <think>, 278 </think>). */
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/status.h"
#include "harness.h"

#include "io/chat.h"
#include "io/tokenizer.h"

static char g_tiny_path[512];

/* The tiny tokenizer with added token `drop` left out (NULL: none), and
 * `vocab_key` (if any) added to the vocab as an ordinary token. */
static dflash_tokenizer *tiny_variant(const char *drop, const char *vocab_key)
{
    json_error_t e;
    json_t *j = json_load_file(g_tiny_path, 0, &e);
    CHECKF(j != NULL, "%s: %s", g_tiny_path, e.text);
    if (!j)
        return NULL;
    json_t *added = json_object_get(j, "added_tokens");
    for (size_t i = 0; drop && i < json_array_size(added); i++)
        if (!strcmp(json_string_value(json_object_get(json_array_get(added, i), "content")), drop))
            json_array_remove(added, i--);
    if (vocab_key)
        json_object_set_new(json_object_get(json_object_get(j, "model"), "vocab"), vocab_key,
                            json_integer(300));
    char *s = json_dumps(j, 0);
    json_decref(j);
    dflash_tokenizer *t = NULL;
    CHECK_OK(dflash_tokenizer_load_memory(s, strlen(s), "variant.json", &t));
    free(s);
    return t;
}

/* The check fails naming the token and the file; encoding still works
 * (the markup becomes plain text, as transformers would encode it). */
static void expect_chat_refused(dflash_tokenizer *t, const dflash_chat_opts *o, const char *token)
{
    char quoted[64];
    snprintf(quoted, sizeof quoted, "\"%s\"", token);
    CHECK_FAILS(dflash_chat_check_tokenizer(t, o), DFLASH_ERR_UNSUPPORTED, quoted);
    CHECKF(strstr(dflash_last_error(), dflash_tokenizer_label(t)) != NULL, "message: %s",
           dflash_last_error());
    dflash_chat_msg m[] = { { DFLASH_CHAT_USER, "Hi" } };
    int32_t *ids = NULL;
    size_t n = 0;
    CHECK_OK(dflash_chat_encode(t, m, 1, o, &ids, &n));
    CHECK(ids != NULL && n > 0);
    free(ids);
    CHECK_FAILS(dflash_chat_check_tokenizer(t, o), DFLASH_ERR_UNSUPPORTED, quoted);
}

static void test_markup_tokens_required(void)
{
    dflash_chat_opts think = dflash_chat_default_opts();
    think.thinking = 1;
    const char *markup[] = { "<|im_start|>", "<|im_end|>", "<think>", "</think>" };
    for (int k = 0; k < 4; k++) {
        dflash_tokenizer *t = tiny_variant(markup[k], NULL);
        if (!t)
            continue;
        expect_chat_refused(t, NULL, markup[k]);
        /* with thinking on no think block is rendered, so only the turn
         * markers are needed */
        if (k < 2)
            expect_chat_refused(t, &think, markup[k]);
        else
            CHECK_OK(dflash_chat_check_tokenizer(t, &think));
        dflash_tokenizer_free(t);
    }
    /* an ordinary vocab entry spelled "<|im_end|>" is not enough: the
     * pre-tokenizer would still split the text of it */
    dflash_tokenizer *t = tiny_variant("<|im_end|>", "<|im_end|>");
    if (t) {
        expect_chat_refused(t, NULL, "<|im_end|>");
        CHECK(strstr(dflash_last_error(), "added_tokens") != NULL);
        dflash_tokenizer_free(t);
    }
    /* the complete tiny tokenizer passes and encodes the markup as ids */
    t = tiny_variant(NULL, NULL);
    if (t) {
        CHECK_OK(dflash_chat_check_tokenizer(t, NULL));
        dflash_chat_msg m[] = { { DFLASH_CHAT_USER, "Hi" } };
        int32_t *ids = NULL;
        size_t n = 0;
        CHECK_OK(dflash_chat_encode(t, m, 1, NULL, &ids, &n));
        CHECK(n > 2 && ids && ids[0] == 275 && ids[7] == 276);
        free(ids);
        dflash_tokenizer_free(t);
    }
}

/* The embedded demo model is not a chat model: its tokenizer has no chat
 * markup, so the check names the first missing marker and the file. */
static void test_demo_tokenizer_flagged(void)
{
    dflash_tokenizer *t = NULL;
    CHECK_OK(dflash_tokenizer_load("models/qwen3-pystd", &t));
    if (!t)
        return;
    expect_chat_refused(t, NULL, "<|im_start|>");
    CHECK(strstr(dflash_last_error(), "models/qwen3-pystd/tokenizer.json") != NULL);
    dflash_tokenizer_free(t);
}

/* The EOS ids of dir are exactly want[0..nw). */
static int eos_is(const char *dir, const dflash_tokenizer *t, const int32_t *want, size_t nw)
{
    int32_t ids[DFLASH_CHAT_MAX_EOS];
    size_t n = 0;
    dflash_status st = dflash_chat_eos_ids(dir, t, ids, DFLASH_CHAT_MAX_EOS, &n);
    int ok = st == DFLASH_OK && n == nw && !memcmp(ids, want, n * sizeof *ids);
    if (!ok) {
        fprintf(stderr, "  eos ids [");
        for (size_t i = 0; i < n; i++)
            fprintf(stderr, "%s%d", i ? ", " : "", ids[i]);
        fprintf(stderr, "] (%s)\n", st ? dflash_last_error() : "ok");
    }
    return ok;
}
#define EOS_IS(dir, t, ...)                                                                \
    do {                                                                                   \
        const int32_t w_[] = { __VA_ARGS__ };                                              \
        CHECK(eos_is((dir), (t), w_, sizeof w_ / sizeof w_[0]));                           \
    } while (0)

static void test_eos_from_config_json(void)
{
    dflash_tokenizer *t = tiny_variant(NULL, NULL);
    if (!t)
        return;
    char dir[] = "/tmp/dflash_chat_checks_XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    int32_t ids[DFLASH_CHAT_MAX_EOS];
    size_t n;

    /* config.json alone, as a minimal model folder has it: int or list */
    test_write_file(dir, "config.json", "{\"vocab_size\": 279, \"eos_token_id\": 274}");
    EOS_IS(dir, t, 274);
    test_write_file(dir, "config.json", "{\"eos_token_id\": [276, 274, 276]}");
    EOS_IS(dir, t, 276, 274);
    /* tokenizer_config.json first, config.json as the generation fallback */
    test_write_file(dir, "tokenizer_config.json", "{\"eos_token\": \"<|im_end|>\"}");
    test_write_file(dir, "config.json", "{\"eos_token_id\": 274}");
    EOS_IS(dir, t, 276, 274);
    /* HF's unbounded model_max_length (1e30 as an integer) does not stop
     * the file from being read */
    test_write_file(dir, "tokenizer_config.json",
                    "{\"model_max_length\": 1000000000000000019884624838656, \"eos_token\": \"<|im_end|>\"}");
    EOS_IS(dir, t, 276, 274);
    /* generation_config.json naming ids wins over config.json; naming
     * none (null) falls back to it */
    test_remove_file(dir, "tokenizer_config.json");
    test_write_file(dir, "generation_config.json", "{\"eos_token_id\": 276}");
    EOS_IS(dir, t, 276);
    test_write_file(dir, "generation_config.json", "{\"eos_token_id\": null}");
    EOS_IS(dir, t, 274);
    /* a malformed fallback is an error naming the file */
    test_remove_file(dir, "generation_config.json");
    test_write_file(dir, "config.json", "{\"eos_token_id\": \"</s>\"}");
    CHECK_FAILS(dflash_chat_eos_ids(dir, t, ids, DFLASH_CHAT_MAX_EOS, &n), DFLASH_ERR_FORMAT,
                "config.json: eos_token_id is neither");

    /* the same in the file ids come from: they are read as whole numbers */
    test_write_file(dir, "config.json", "{\"max\": 1000000000000000019884624838656, \"eos_token_id\": [274, 276]}");
    EOS_IS(dir, t, 274, 276);
    test_write_file(dir, "config.json", "{\"max\": 1000000000000000019884624838656, \"eos_token_id\": [274.5]}");
    CHECK_FAILS(dflash_chat_eos_ids(dir, t, ids, DFLASH_CHAT_MAX_EOS, &n), DFLASH_ERR_FORMAT,
                "eos_token_id[0] is not an integer");

    /* no source names an id: the message lists what each file said */
    test_write_file(dir, "config.json", "{\"vocab_size\": 279}");
    CHECK_FAILS(dflash_chat_eos_ids(dir, t, ids, DFLASH_CHAT_MAX_EOS, &n), DFLASH_ERR_NOT_FOUND,
                "tokenizer_config.json (absent), generation_config.json (absent) and "
                "config.json (no eos_token_id)");
    CHECK(strstr(dflash_last_error(), dir) != NULL);
    test_write_file(dir, "config.json", "{\"eos_token_id\": []}");
    test_write_file(dir, "tokenizer_config.json", "{\"eos_token\": null}");
    CHECK_FAILS(dflash_chat_eos_ids(dir, t, ids, DFLASH_CHAT_MAX_EOS, &n), DFLASH_ERR_NOT_FOUND,
                "tokenizer_config.json (no eos_token), generation_config.json (absent) and "
                "config.json (eos_token_id is empty)");
    test_remove_file(dir, "config.json");
    test_remove_file(dir, "tokenizer_config.json");
    CHECK_FAILS(dflash_chat_eos_ids(dir, t, ids, DFLASH_CHAT_MAX_EOS, &n), DFLASH_ERR_NOT_FOUND,
                "config.json (absent)");
    rmdir(dir);
    dflash_tokenizer_free(t);
}

static void test_format_detect(void)
{
    dflash_tokenizer *qwen = tiny_variant(NULL, NULL), *llama = tiny_variant(NULL, "<|start_header_id|>");
    if (!qwen || !llama)
        goto done;
    char dir[] = "/tmp/dflash_chat_format_XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    dflash_chat_format f;
    /* no tokenizer_config.json, or no template in it: the markup decides */
    CHECK_OK(dflash_chat_format_detect(dir, qwen, &f));
    CHECK(f == DFLASH_CHAT_QWEN3);
    CHECK_OK(dflash_chat_format_detect(dir, llama, &f));
    CHECK(f == DFLASH_CHAT_LLAMA3);
    test_write_file(dir, "tokenizer_config.json", "{\"eos_token\": \"<|im_end|>\"}");
    CHECK_OK(dflash_chat_format_detect(dir, llama, &f));
    CHECK(f == DFLASH_CHAT_LLAMA3);
    /* a template decides over the markup */
    test_write_file(dir, "tokenizer_config.json",
                    "{\"chat_template\": \"{{ '<|im_start|>' + m + '<|im_end|>' }}\"}");
    CHECK_OK(dflash_chat_format_detect(dir, llama, &f));
    CHECK(f == DFLASH_CHAT_QWEN3);
    test_write_file(dir, "tokenizer_config.json",
                    "{\"chat_template\": [{\"name\": \"tool_use\", \"template\": \"x\"}, {\"name\": "
                    "\"default\", \"template\": \"<|start_header_id|>{{ r }}<|end_header_id|>{{ c }}<|eot_id|>\"}]}");
    CHECK_OK(dflash_chat_format_detect(dir, qwen, &f));
    CHECK(f == DFLASH_CHAT_LLAMA3);
    /* Llama 3.1+'s date preamble, and markup of neither format: refused */
    test_write_file(dir, "tokenizer_config.json",
                    "{\"chat_template\": \"<|start_header_id|>system<|end_header_id|>Cutting Knowledge Date: "
                    "December 2023<|eot_id|>\"}");
    CHECK_FAILS(dflash_chat_format_detect(dir, llama, &f), DFLASH_ERR_UNSUPPORTED, "Llama 3.1+ template");
    CHECK(strstr(dflash_last_error(), "tokenizer_config.json") != NULL);
    test_write_file(dir, "tokenizer_config.json", "{\"chat_template\": \"[INST] {{ m }} [/INST]\"}");
    CHECK_FAILS(dflash_chat_format_detect(dir, qwen, &f), DFLASH_ERR_UNSUPPORTED, "neither Qwen3's markup");
    test_write_file(dir, "tokenizer_config.json", "{\"chat_template\": ");
    CHECK_FAILS(dflash_chat_format_detect(dir, qwen, &f), DFLASH_ERR_FORMAT, "tokenizer_config.json");
    test_remove_file(dir, "tokenizer_config.json");
    rmdir(dir);
done:
    dflash_tokenizer_free(qwen);
    dflash_tokenizer_free(llama);
}

int main(void)
{
    snprintf(g_tiny_path, sizeof g_tiny_path, "%s/tokenizer/tiny/tokenizer.json", test_data_dir());
    RUN(test_markup_tokens_required);
    RUN(test_demo_tokenizer_flagged);
    RUN(test_eos_from_config_json);
    RUN(test_format_detect);
    TEST_END();
}
