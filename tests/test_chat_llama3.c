/* test_chat_llama3.c: the Llama 3 chat format rendered by src/io/chat.c
 * equals what Jinja2 renders from the template of a published Llama 3.1
 * tokenizer_config.json (tests/data/tokenizer/chat_llama3_golden.json, made
 * by tools/fixtures/chat_golden.py), with and without the generation
 * prompt, on contents with white space Jinja's trim removes and characters
 * it keeps; a continuing rendering (a later chat turn) leaves out
 * <|begin_of_text|>. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "core/status.h"
#include "harness.h"

#include "io/chat.h"

static int role_of(const char *r, dflash_chat_role *out)
{
    static const struct {
        const char *name;
        dflash_chat_role role;
    } k[] = { { "system", DFLASH_CHAT_SYSTEM }, { "user", DFLASH_CHAT_USER }, { "assistant", DFLASH_CHAT_ASSISTANT } };
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++)
        if (!strcmp(r, k[i].name)) {
            *out = k[i].role;
            return 1;
        }
    return 0;
}

static void test_golden(void)
{
    char path[512];
    snprintf(path, sizeof path, "%s/tokenizer/chat_llama3_golden.json", test_data_dir());
    json_error_t e;
    json_t *j = json_load_file(path, 0, &e);
    CHECKF(j != NULL, "%s: %s", path, e.text);
    if (!j)
        return;
    json_t *cases = json_object_get(j, "cases");
    CHECKF(json_array_size(cases) >= 20, "%s: %zu cases", path, json_array_size(cases));
    for (size_t c = 0; c < json_array_size(cases); c++) {
        json_t *cs = json_array_get(cases, c), *jm = json_object_get(cs, "messages");
        dflash_chat_msg msgs[8];
        size_t n = json_array_size(jm);
        CHECK(n <= 8);
        for (size_t i = 0; i < n && i < 8; i++) {
            json_t *m = json_array_get(jm, i);
            CHECK(role_of(json_string_value(json_object_get(m, "role")), &msgs[i].role));
            msgs[i].content = json_string_value(json_object_get(m, "content"));
        }
        dflash_chat_opts o = dflash_chat_default_opts();
        o.format = DFLASH_CHAT_LLAMA3;
        o.add_generation_prompt = json_is_true(json_object_get(cs, "add_generation_prompt"));
        char *text = NULL;
        size_t len = 0;
        CHECK_OK(dflash_chat_render(msgs, n, &o, &text, &len));
        const char *want = json_string_value(json_object_get(cs, "text"));
        CHECKF(text && len == strlen(want) && !strcmp(text, want), "case %zu: got \"%s\", want \"%s\"", c,
               text ? text : "(null)", want);
        /* a later turn: the same messages without the conversation's start */
        free(text);
        o.continuing = 1;
        CHECK_OK(dflash_chat_render(msgs, n, &o, &text, &len));
        const char *bos = "<|begin_of_text|>";
        CHECKF(text && !strncmp(want, bos, strlen(bos)) && !strcmp(text, want + strlen(bos)),
               "case %zu continuing: got \"%s\"", c, text ? text : "(null)");
        free(text);
    }
    json_decref(j);
}

/* Thinking is Qwen3's; the Llama 3 rendering ignores it. A role outside
 * the three is refused, as in the Qwen3 format. */
static void test_options(void)
{
    dflash_chat_msg m[1] = { { DFLASH_CHAT_USER, "hi" } };
    dflash_chat_opts o = dflash_chat_default_opts();
    o.format = DFLASH_CHAT_LLAMA3;
    char *a = NULL, *b = NULL;
    size_t la, lb;
    CHECK_OK(dflash_chat_render(m, 1, &o, &a, &la));
    o.thinking = 1;
    CHECK_OK(dflash_chat_render(m, 1, &o, &b, &lb));
    CHECK(a && b && !strcmp(a, b));
    free(a);
    free(b);
    dflash_chat_msg bad[1] = { { (dflash_chat_role)7, "x" } };
    CHECK_FAILS(dflash_chat_render(bad, 1, &o, &a, &la), DFLASH_ERR_INVALID_ARG, "role");
    CHECK(!strcmp(dflash_chat_end_of_turn(DFLASH_CHAT_LLAMA3), "<|eot_id|>"));
    CHECK(!strcmp(dflash_chat_turn_separator(DFLASH_CHAT_LLAMA3), ""));
    CHECK(!strcmp(dflash_chat_end_of_turn(DFLASH_CHAT_QWEN3), "<|im_end|>"));
}

int main(void)
{
    RUN(test_golden);
    RUN(test_options);
    TEST_END();
}
