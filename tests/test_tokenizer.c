/* test_tokenizer.c: unit tests of src/io/tokenizer and src/io/chat on the
 * tiny committed tokenizer (tests/data/tokenizer/tiny/tokenizer.json): ids
 * 0..255 are the 256 byte symbols in byte order, 256..273 the merges in
 * rank order, 274..278 added tokens. Expected ids below are worked out by
 * hand from those merges. The real Qwen3 tokenizer is exercised by
 * test_slow_tokenizer_qwen3.c. */
#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <utf8proc.h>

#include "core/status.h"
#include "harness.h"

#include "tokenizer_check.h"
#include "io/chat.h"
#include "io/tokenizer.h"

static char g_tiny_path[512];

static dflash_tokenizer *load_tiny(void)
{
    dflash_tokenizer *t = NULL;
    CHECK_OK(dflash_tokenizer_load(g_tiny_path, &t));
    return t;
}

static json_t *tiny_json(void)
{
    json_error_t e;
    json_t *j = json_load_file(g_tiny_path, 0, &e);
    CHECKF(j != NULL, "%s: %s", g_tiny_path, e.text);
    return j;
}

/* The tiny tokenizer with ByteLevel(use_regex=true) as its only
 * pre-tokenizer, so text is split by the GPT-2 regex. */
static json_t *tiny_json_gpt2_regex(void)
{
    json_t *j = tiny_json();
    if (j)
        json_object_set_new(j, "pre_tokenizer",
                            json_pack("{s:s,s:b,s:b,s:b}", "type", "ByteLevel", "add_prefix_space", 0,
                                      "trim_offsets", 1, "use_regex", 1));
    return j;
}

/* Load a modified tiny tokenizer from memory; takes ownership of j. */
static dflash_status load_json(json_t *j, dflash_tokenizer **t)
{
    char *s = json_dumps(j, 0);
    json_decref(j);
    dflash_status st = dflash_tokenizer_load_memory(s, strlen(s), "variant.json", t);
    free(s);
    return st;
}

/* Encode and compare with the expected ids. */
static int enc_eq(dflash_tokenizer *t, const char *text, size_t len, const int32_t *want, size_t nw)
{
    int32_t *ids = NULL;
    size_t n = 0;
    dflash_status st = dflash_tokenizer_encode(t, text, len, &ids, &n);
    int ok = st == DFLASH_OK && n == nw && (n == 0 || !memcmp(ids, want, n * sizeof *ids));
    if (!ok) {
        fprintf(stderr, "  encode(\"%.*s\") = [", (int)len, text);
        for (size_t i = 0; i < n; i++)
            fprintf(stderr, "%s%d", i ? ", " : "", ids[i]);
        fprintf(stderr, "] (%s)\n", dflash_last_error());
    }
    free(ids);
    return ok;
}
#define ENC_EQ(t, s, ...)                                                                  \
    do {                                                                                   \
        const int32_t w_[] = { __VA_ARGS__ };                                              \
        CHECK(enc_eq((t), (s), strlen(s), w_, sizeof w_ / sizeof w_[0]));                  \
    } while (0)

static int dec_eq(dflash_tokenizer *t, const int32_t *ids, size_t n, uint32_t flags,
                  const char *want, size_t wl)
{
    char *out = NULL;
    size_t len = 0;
    dflash_status st = dflash_tokenizer_decode(t, ids, n, flags, &out, &len);
    int ok = st == DFLASH_OK && len == wl && !memcmp(out, want, wl) && out[len] == 0;
    if (!ok)
        fprintf(stderr, "  decode gave \"%.*s\" (%zu bytes; %s)\n", (int)len, out ? out : "", len,
                dflash_last_error());
    free(out);
    return ok;
}
#define DEC_EQ(t, flags, want, ...)                                                        \
    do {                                                                                   \
        const int32_t i_[] = { __VA_ARGS__ };                                              \
        CHECK(dec_eq((t), i_, sizeof i_ / sizeof i_[0], (flags), (want), sizeof(want) - 1)); \
    } while (0)

static int valid_utf8(const char *s, size_t n)
{
    utf8proc_int32_t c;
    for (size_t i = 0; i < n;) {
        utf8proc_ssize_t r = utf8proc_iterate((const utf8proc_uint8_t *)s + i, (utf8proc_ssize_t)(n - i), &c);
        if (r <= 0)
            return 0;
        i += (size_t)r;
    }
    return 1;
}

static void test_load_and_lookup(void)
{
    dflash_tokenizer *t = load_tiny();
    if (!t)
        return;
    CHECK(dflash_tokenizer_vocab_size(t) == 279);
    CHECK(dflash_tokenizer_token_id(t, "<|im_end|>") == 276);
    CHECK(dflash_tokenizer_token_id(t, "<think>") == 277);
    CHECK(dflash_tokenizer_token_id(t, "Ġworld") == 269);
    CHECK(dflash_tokenizer_token_id(t, "A") == 'A');
    CHECK(dflash_tokenizer_token_id(t, "nope") == -1);
    CHECK(dflash_tokenizer_is_special(t, 276) == 1);
    CHECK(dflash_tokenizer_is_special(t, 277) == 0);
    CHECK(dflash_tokenizer_is_special(t, 5) == 0);
    CHECK(dflash_tokenizer_is_special(t, 99999) == 0);
    dflash_tokenizer_free(t);

    /* a folder holding tokenizer.json loads the same */
    char dir[512];
    snprintf(dir, sizeof dir, "%s/tokenizer/tiny", test_data_dir());
    CHECK_OK(dflash_tokenizer_load(dir, &t));
    dflash_tokenizer_free(t);
    CHECK_FAILS(dflash_tokenizer_load("/nonexistent/tok.json", &t), DFLASH_ERR_IO,
                "/nonexistent/tok.json");
    CHECK(t == NULL);
}

static void test_encode_hand_checked(void)
{
    dflash_tokenizer *t = load_tiny();
    if (!t)
        return;
    /* Hello: ll(5) -> He(6) -> Hell(7) -> Hello(8); " world": Ġw(9), or(10),
     * Ġwor(11), ld(12), Ġworld(13). */
    ENC_EQ(t, "Hello world", 264, 269);
    /* " the": Ġt(0) then he(1) then Ġthe(2); "  " before " b" is one
     * regex piece (\s+(?!\S)) merged by ĠĠ(14). */
    ENC_EQ(t, " the in a   b", 258, 32, 259, 260, 270, 32, 98);
    /* 8 spaces at the end: one piece, ĠĠ x4 then ĠĠĠĠ x2 (equal ranks merge
     * leftmost first) */
    ENC_EQ(t, "x        ", 'x', 271, 271);
    /* \n\n\n: one piece; ĊĊ(16) then a lone Ċ */
    ENC_EQ(t, "\n\n\n", 272, '\n');
    /* the empty string and lone bytes */
    CHECK(enc_eq(t, "", 0, NULL, 0));
    ENC_EQ(t, "a", 'a');
    /* NUL is an ordinary character (byte 0 maps to id 0) */
    CHECK(enc_eq(t, "a\0b", 3, (const int32_t[]){ 'a', 0, 'b' }, 3));
    dflash_tokenizer_free(t);
}

static void test_encode_added_tokens(void)
{
    dflash_tokenizer *t = load_tiny();
    if (!t)
        return;
    ENC_EQ(t, "<|im_start|>user\nHello<|im_end|>", 275, 'u', 's', 273, '\n', 264, 276);
    ENC_EQ(t, "x<think>y</think>", 'x', 277, 'y', 278);
    /* adjacent, and a partial that is not a token */
    ENC_EQ(t, "<|im_end|><|im_end|>", 276, 276);
    ENC_EQ(t, "<|im_end|", '<', '|', 'i', 'm', '_', 'e', 'n', 'd', '|');
    /* no whitespace is eaten around tokens whose lstrip/rstrip are false */
    ENC_EQ(t, " <think> ", 32, 277, 32);
    dflash_tokenizer_free(t);

    /* leftmost-longest among overlapping contents; lstrip/rstrip; a
     * normalized=true token matched after NFC */
    json_t *j = tiny_json();
    json_t *add = json_object_get(j, "added_tokens");
    json_array_append_new(add, json_pack("{s:i,s:s,s:b,s:b,s:b,s:b,s:b}", "id", 279, "content",
                                         "<th", "special", 0, "lstrip", 0, "rstrip", 0,
                                         "normalized", 0, "single_word", 0));
    json_array_append_new(add, json_pack("{s:i,s:s,s:b,s:b,s:b,s:b,s:b}", "id", 280, "content",
                                         "[S]", "special", 1, "lstrip", 1, "rstrip", 1,
                                         "normalized", 0, "single_word", 0));
    json_array_append_new(add, json_pack("{s:i,s:s,s:b,s:b,s:b,s:b,s:b}", "id", 281, "content",
                                         "cafe\xcc\x81", "special", 0, "lstrip", 0, "rstrip", 0,
                                         "normalized", 1, "single_word", 0));
    CHECK_OK(load_json(j, &t));
    if (!t)
        return;
    ENC_EQ(t, "<think><th", 277, 279);
    ENC_EQ(t, "a \t [S]\n b", 'a', 280, 'b');
    /* both spellings of "café" are the normalized token */
    ENC_EQ(t, "caf\xc3\xa9!", 281, '!');
    ENC_EQ(t, "cafe\xcc\x81", 281);
    DEC_EQ(t, 0, "a[S]b", 'a', 280, 'b');
    dflash_tokenizer_free(t);
}

static void test_encode_nfc_and_invalid_utf8(void)
{
    dflash_tokenizer *t = load_tiny();
    if (!t)
        return;
    /* e + U+0301 composes to é (C3 A9); tiny ids are bytes */
    ENC_EQ(t, "e\xcc\x81", 0xC3, 0xA9);
    /* Hangul jamo L V T compose to one syllable: U+1100 U+1161 U+11A8 -> U+AC01 (EA B0 81) */
    ENC_EQ(t, "\xe1\x84\x80\xe1\x85\xa1\xe1\x86\xa8", 0xEA, 0xB0, 0x81);
    /* Invalid UTF-8 becomes U+FFFD (EF BF BD) per maximal subpart:
     * a lone FF; a truncated E2 82 before 'A'; F0 80 is two subparts. */
    ENC_EQ(t, "\xff", 0xEF, 0xBF, 0xBD);
    ENC_EQ(t, "\xe2\x82" "A", 0xEF, 0xBF, 0xBD, 'A');
    ENC_EQ(t, "\xf0\x80", 0xEF, 0xBF, 0xBD, 0xEF, 0xBF, 0xBD);
    /* a surrogate encoded in UTF-8 (ED A0 80) is three subparts */
    ENC_EQ(t, "\xed\xa0\x80", 0xEF, 0xBF, 0xBD, 0xEF, 0xBF, 0xBD, 0xEF, 0xBF, 0xBD);
    dflash_tokenizer_free(t);
}

static void test_decode(void)
{
    dflash_tokenizer *t = load_tiny();
    if (!t)
        return;
    DEC_EQ(t, 0, "Hello world", 264, 269);
    DEC_EQ(t, 0, "<|im_start|>x<think>", 275, 'x', 277);
    /* skip-special drops <|..|> tokens but keeps <think> (not special) */
    DEC_EQ(t, DFLASH_DECODE_SKIP_SPECIAL, "x<think>", 275, 'x', 277, 274);
    /* lossy: an incomplete sequence at the end, invalid bytes, surrogates */
    DEC_EQ(t, 0, "\xef\xbf\xbd", 0xE2, 0x82);
    DEC_EQ(t, 0, "\xef\xbf\xbd" "A", 0xE2, 0x82, 'A');
    DEC_EQ(t, 0, "\xef\xbf\xbd\xef\xbf\xbd", 0xF0, 0x80);
    DEC_EQ(t, 0, "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd", 0xED, 0xA0, 0x80);
    DEC_EQ(t, 0, "\xe4\xb8\xad", 0xE4, 0xB8, 0xAD);
    /* an incomplete sequence cut by a special token */
    DEC_EQ(t, 0, "\xef\xbf\xbd<|im_end|>", 0xE4, 0xB8, 276);
    DEC_EQ(t, DFLASH_DECODE_SKIP_SPECIAL, "\xe4\xb8\xad", 0xE4, 0xB8, 276, 0xAD);
    char *out;
    size_t len;
    CHECK_FAILS(dflash_tokenizer_decode(t, (const int32_t[]){ 1, 279 }, 2, 0, &out, &len),
                DFLASH_ERR_INVALID_ARG, "279");
    CHECK_FAILS(dflash_tokenizer_decode(t, (const int32_t[]){ -1 }, 1, 0, &out, &len),
                DFLASH_ERR_INVALID_ARG, "-1");
    CHECK_OK(dflash_tokenizer_decode(t, NULL, 0, 0, &out, &len));
    CHECK(len == 0 && out && out[0] == 0);
    free(out);
    dflash_tokenizer_free(t);
}

static void test_stream_basic(void)
{
    dflash_tokenizer *t = load_tiny();
    if (!t)
        return;
    dflash_detok_stream *s;
    CHECK_OK(dflash_detok_stream_new(t, 0, &s));
    const char *txt;
    size_t len;
    CHECK_OK(dflash_detok_stream_push(s, 0xE4, &txt, &len));
    CHECK(len == 0);
    CHECK_OK(dflash_detok_stream_push(s, 0xB8, &txt, &len));
    CHECK(len == 0);
    CHECK_OK(dflash_detok_stream_push(s, 0xAD, &txt, &len));
    CHECK(len == 3 && !memcmp(txt, "\xe4\xb8\xad", 3));
    CHECK_OK(dflash_detok_stream_push(s, 264, &txt, &len));
    CHECK(len == 5 && !memcmp(txt, "Hello", 5));
    /* a held prefix proven invalid by the next byte is emitted as U+FFFD */
    CHECK_OK(dflash_detok_stream_push(s, 0xE4, &txt, &len));
    CHECK(len == 0);
    CHECK_OK(dflash_detok_stream_push(s, 'a', &txt, &len));
    CHECK(len == 4 && !memcmp(txt, "\xef\xbf\xbd" "a", 4));
    /* finish flushes a held incomplete sequence */
    CHECK_OK(dflash_detok_stream_push(s, 0xF0, &txt, &len));
    CHECK(len == 0);
    CHECK_OK(dflash_detok_stream_finish(s, &txt, &len));
    CHECK(len == 3 && !memcmp(txt, "\xef\xbf\xbd", 3));
    CHECK_OK(dflash_detok_stream_finish(s, &txt, &len));
    CHECK(len == 0);
    CHECK_FAILS(dflash_detok_stream_push(s, 5000, &txt, &len), DFLASH_ERR_INVALID_ARG, "5000");
    dflash_detok_stream_reset(s);
    dflash_detok_stream_free(s);
    dflash_tokenizer_free(t);
}

/* Random id sequences, biased to bytes >= 0x80 so that partial, invalid and
 * valid multi-byte sequences all occur: every chunk is valid UTF-8, and the
 * chunks concatenate to the full decode. */
static void test_stream_random(void)
{
    dflash_tokenizer *t = load_tiny();
    if (!t)
        return;
    uint64_t rng = 12345;
    int bad = 0;
    for (int iter = 0; iter < 2000 && !bad; iter++) {
        int32_t ids[24];
        size_t n = (size_t)(iter % 24);
        for (size_t i = 0; i < n; i++) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            uint32_t r = (uint32_t)(rng >> 33);
            ids[i] = (r % 4 == 0) ? (int32_t)(r / 4 % 279) : (int32_t)(0x80 + (r / 4) % 0x78);
        }
        uint32_t flags = iter & 1 ? DFLASH_DECODE_SKIP_SPECIAL : 0;
        char *full;
        size_t full_len;
        CHECK_OK(dflash_tokenizer_decode(t, ids, n, flags, &full, &full_len));
        dflash_detok_stream *s;
        CHECK_OK(dflash_detok_stream_new(t, flags, &s));
        char cat[24 * 16 * 3 + 16];
        size_t cl = 0;
        for (size_t i = 0; i <= n; i++) {
            const char *txt;
            size_t len;
            if (i < n)
                CHECK_OK(dflash_detok_stream_push(s, ids[i], &txt, &len));
            else
                CHECK_OK(dflash_detok_stream_finish(s, &txt, &len));
            if (!valid_utf8(txt, len))
                bad = 1;
            memcpy(cat + cl, txt, len);
            cl += len;
        }
        if (cl != full_len || memcmp(cat, full, cl))
            bad = 1;
        CHECK(valid_utf8(full, full_len));
        dflash_detok_stream_free(s);
        free(full);
    }
    CHECK(!bad);
    dflash_tokenizer_free(t);
}

/* decode(encode(x)) == NFC(x) for every text of the golden set. */
static void test_round_trip_texts(void)
{
    dflash_tokenizer *t = load_tiny();
    char path[512];
    snprintf(path, sizeof path, "%s/tokenizer/texts.json", test_data_dir());
    json_error_t e;
    json_t *texts = json_load_file(path, JSON_ALLOW_NUL, &e);
    CHECKF(json_is_array(texts) && json_array_size(texts) >= 60, "%s: %s", path, e.text);
    if (!t || !texts) {
        dflash_tokenizer_free(t);
        json_decref(texts);
        return;
    }
    check_round_trip(t, texts);
    json_decref(texts);
    dflash_tokenizer_free(t);
}

static void test_long_inputs(void)
{
    dflash_tokenizer *t = load_tiny();
    if (!t)
        return;
    size_t n = 200000;
    char *s = malloc(n);
    const char *fill[] = { " ", "a", "\n", "\xe4\xb8\xad" };
    for (int k = 0; k < 4; k++) {
        size_t fl = strlen(fill[k]), len = n / fl * fl;
        for (size_t i = 0; i < len; i += fl)
            memcpy(s + i, fill[k], fl);
        int32_t *ids;
        size_t m;
        char *out;
        size_t ol;
        CHECK_OK(dflash_tokenizer_encode(t, s, len, &ids, &m));
        CHECK_OK(dflash_tokenizer_decode(t, ids, m, 0, &out, &ol));
        CHECKF(ol == len && !memcmp(out, s, len), "fill %d", k);
        if (k == 0) /* spaces merge to ĠĠĠĠ */
            CHECK(m == len / 4 && ids[0] == 271);
        free(ids);
        free(out);
    }
    free(s);
    dflash_tokenizer_free(t);
}

static void test_merges_as_pairs(void)
{
    json_t *j = tiny_json();
    if (!j)
        return;
    json_t *merges = json_object_get(json_object_get(j, "model"), "merges"), *pairs = json_array();
    size_t i;
    json_t *m;
    json_array_foreach(merges, i, m)
    {
        const char *s = json_string_value(m), *sp = strchr(s, ' ');
        json_array_append_new(pairs, json_pack("[s#s]", s, (int)(sp - s), sp + 1));
    }
    json_object_set_new(json_object_get(j, "model"), "merges", pairs);
    dflash_tokenizer *t = NULL;
    CHECK_OK(load_json(j, &t));
    if (t) {
        ENC_EQ(t, "Hello world", 264, 269);
        ENC_EQ(t, " the in a   b", 258, 32, 259, 260, 270, 32, 98);
    }
    dflash_tokenizer_free(t);
}

static void test_bytelevel_use_regex(void)
{
    /* ByteLevel alone with use_regex=true splits with the GPT-2 regex. */
    json_t *j = tiny_json_gpt2_regex();
    if (!j)
        return;
    dflash_tokenizer *t = NULL;
    CHECK_OK(load_json(j, &t));
    if (t) {
        ENC_EQ(t, "Hello world", 264, 269);
        /* GPT-2 regex: " ?\p{N}+" keeps digits together, unlike Qwen's \p{N} */
        ENC_EQ(t, "a 12", 'a', 32, '1', '2');
    }
    dflash_tokenizer_free(t);
}

/* Each unsupported or malformed feature fails with a message naming it and
 * the file ("variant.json"). */
static void expect_fail(const char *section, json_t *value, dflash_status code, const char *needle)
{
    json_t *j = tiny_json();
    if (!j)
        return;
    if (!strcmp(section, "model.type"))
        json_object_set_new(json_object_get(j, "model"), "type", value);
    else if (!strcmp(section, "model.byte_fallback"))
        json_object_set_new(json_object_get(j, "model"), "byte_fallback", value);
    else if (!strcmp(section, "model.merges+"))
        json_array_append_new(json_object_get(json_object_get(j, "model"), "merges"), value);
    else if (!strcmp(section, "added_tokens+"))
        json_array_append_new(json_object_get(j, "added_tokens"), value);
    else
        json_object_set_new(j, section, value);
    dflash_tokenizer *t = NULL;
    dflash_status st = load_json(j, &t);
    CHECKF(st == code, "%s: got %s (%s)", section, dflash_status_name(st), dflash_last_error());
    CHECKF(strstr(dflash_last_error(), needle) && strstr(dflash_last_error(), "variant.json"),
           "%s: message \"%s\" lacks \"%s\" or the file name", section, dflash_last_error(), needle);
    CHECK(t == NULL);
    dflash_tokenizer_free(t);
}

static void test_unsupported_features(void)
{
    expect_fail("model.type", json_string("WordPiece"), DFLASH_ERR_UNSUPPORTED, "WordPiece");
    expect_fail("model.byte_fallback", json_true(), DFLASH_ERR_UNSUPPORTED, "byte_fallback");
    expect_fail("normalizer", json_pack("{s:s}", "type", "NFKC"), DFLASH_ERR_UNSUPPORTED, "NFKC");
    expect_fail("normalizer",
                json_pack("{s:s,s:[{s:s},{s:s}]}", "type", "Sequence", "normalizers", "type",
                          "NFC", "type", "Lowercase"),
                DFLASH_ERR_UNSUPPORTED, "Lowercase");
    expect_fail("pre_tokenizer", json_pack("{s:s}", "type", "Whitespace"), DFLASH_ERR_UNSUPPORTED,
                "Whitespace");
    expect_fail("pre_tokenizer",
                json_pack("{s:s,s:b,s:b,s:b}", "type", "ByteLevel", "add_prefix_space", 1,
                          "trim_offsets", 0, "use_regex", 0),
                DFLASH_ERR_UNSUPPORTED, "add_prefix_space");
    expect_fail("pre_tokenizer",
                json_pack("{s:s,s:{s:s},s:s,s:b}", "type", "Split", "pattern", "Regex", "\\s+",
                          "behavior", "Contiguous", "invert", 0),
                DFLASH_ERR_UNSUPPORTED, "Contiguous");
    expect_fail("pre_tokenizer",
                json_pack("{s:s,s:{s:s},s:s,s:b}", "type", "Split", "pattern", "Regex", "(\\p{L",
                          "behavior", "Isolated", "invert", 0),
                DFLASH_ERR_FORMAT, "does not compile");
    expect_fail("decoder", json_pack("{s:s}", "type", "WordPiece"), DFLASH_ERR_UNSUPPORTED,
                "WordPiece");
    expect_fail("decoder", json_null(), DFLASH_ERR_UNSUPPORTED, "decoder");
    expect_fail("added_tokens+",
                json_pack("{s:i,s:s,s:b,s:b,s:b,s:b,s:b}", "id", 300, "content", "<x>", "special",
                          1, "lstrip", 0, "rstrip", 0, "normalized", 0, "single_word", 1),
                DFLASH_ERR_UNSUPPORTED, "single_word");
    expect_fail("model.merges+", json_string("q zz"), DFLASH_ERR_FORMAT, "merges[18]");
    expect_fail("model.merges+", json_string("abc"), DFLASH_ERR_FORMAT, "merges[18]");
    expect_fail("model", json_string("x"), DFLASH_ERR_FORMAT, "model");

    dflash_tokenizer *t = NULL;
    CHECK_FAILS(dflash_tokenizer_load_memory("{\"model\": ", 10, "broken.json", &t),
                DFLASH_ERR_FORMAT, "broken.json");
    CHECK_FAILS(dflash_tokenizer_load_memory("[]", 2, "arr.json", &t), DFLASH_ERR_FORMAT,
                "arr.json");
}

/* Two added_tokens entries sharing an id, or a content, are refused with a
 * message naming both entries (HF would keep one of them silently). */
static void test_added_tokens_unique(void)
{
    struct {
        int id;
        const char *content, *needle1, *needle2;
    } cases[] = {
        /* tiny's added_tokens[2] is <|im_end|> (276), [3] is <think> (277) */
        { 276, "<x>", "added_tokens[2] (\"<|im_end|>\") and added_tokens[5] (\"<x>\")", "id 276" },
        { 279, "<think>", "added_tokens[3] (id 277) and added_tokens[5] (id 279)", "\"<think>\"" },
        { 277, "<think>", "added_tokens[3] (\"<think>\") and added_tokens[5]", "id 277" },
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        json_t *j = tiny_json();
        if (!j)
            return;
        json_array_append_new(json_object_get(j, "added_tokens"),
                              json_pack("{s:i,s:s,s:b}", "id", cases[k].id, "content",
                                        cases[k].content, "special", 1));
        dflash_tokenizer *t = NULL;
        CHECK_FAILS(load_json(j, &t), DFLASH_ERR_FORMAT, cases[k].needle1);
        CHECKF(strstr(dflash_last_error(), cases[k].needle2) &&
                   strstr(dflash_last_error(), "variant.json"),
               "case %zu: %s", k, dflash_last_error());
        CHECK(t == NULL);
        dflash_tokenizer_free(t);
    }
    /* distinct ids and contents still load, also an added token that
     * repeats a vocab entry's id and spelling (as <unk>-style files do) */
    json_t *j = tiny_json();
    if (!j)
        return;
    json_array_append_new(json_object_get(j, "added_tokens"),
                          json_pack("{s:i,s:s,s:b}", "id", 'A', "content", "A", "special", 0));
    json_array_append_new(json_object_get(j, "added_tokens"),
                          json_pack("{s:i,s:s,s:b}", "id", 279, "content", "<y>", "special", 1));
    dflash_tokenizer *t = NULL;
    CHECK_OK(load_json(j, &t));
    dflash_tokenizer_free(t);
}

/* post_processor: TemplateProcessing (Llama 3's form, alone or in a
 * Sequence) adds its special tokens in encode_special only; a template
 * whose token is not in its special_tokens table or not in the vocabulary,
 * or another kind of processor, is refused. tiny's <|im_end|> is 276. */
static json_t *template_processor(const char *name, int id)
{
    return json_pack("{s:s,s:[{s:{s:s,s:i}},{s:{s:s,s:i}}],s:{s:{s:s,s:[i],s:[s]}}}", "type", "TemplateProcessing",
                     "single", "SpecialToken", "id", "<|im_end|>", "type_id", 0, "Sequence", "id", "A", "type_id", 0,
                     "special_tokens", name, "id", name, "ids", id, "tokens", name);
}

static void test_post_processor(void)
{
    json_t *j = tiny_json();
    if (!j)
        return;
    json_object_set_new(j, "post_processor", json_pack("{s:s,s:[{s:s},o]}", "type", "Sequence", "processors", "type",
                                                       "ByteLevel", template_processor("<|im_end|>", 276)));
    dflash_tokenizer *t = NULL;
    CHECK_OK(load_json(j, &t));
    int32_t *ids = NULL, *sp = NULL;
    size_t n = 0, n_sp = 0;
    CHECK_OK(dflash_tokenizer_encode(t, "ab", 2, &ids, &n));
    CHECK_OK(dflash_tokenizer_encode_special(t, "ab", 2, &sp, &n_sp));
    CHECKF(n_sp == n + 1 && sp && sp[0] == 276 && (n == 0 || !memcmp(sp + 1, ids, n * sizeof *ids)),
           "encode_special: %zu ids (plain %zu)", n_sp, n);
    free(ids);
    free(sp);
    CHECK_OK(dflash_tokenizer_encode_special(t, "", 0, &sp, &n_sp)); /* an empty text still gets them */
    CHECK(n_sp == 1 && sp && sp[0] == 276);
    free(sp);
    dflash_tokenizer_free(t);

    j = tiny_json();
    json_object_set_new(j, "post_processor", template_processor("<bos>", 276));
    CHECK_FAILS(load_json(j, &t), DFLASH_ERR_FORMAT, "'single' item 0 is neither a sequence nor a special token");
    j = tiny_json();
    json_object_set_new(j, "post_processor", template_processor("<|im_end|>", 99999));
    CHECK_FAILS(load_json(j, &t), DFLASH_ERR_FORMAT, "post_processor special token id 99999 is not in the vocabulary");
    j = tiny_json();
    json_object_set_new(j, "post_processor", json_pack("{s:s}", "type", "RobertaProcessing"));
    CHECK_FAILS(load_json(j, &t), DFLASH_ERR_UNSUPPORTED, "post_processor type 'RobertaProcessing' is not supported");
    CHECK(t == NULL);
}

/* GPT-2's byte-to-unicode spelling of raw bytes (as vocab keys are written);
 * out has room for 2n + 1 bytes. */
static void byte_level_spelling(const char *s, size_t n, char *out)
{
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        int b = (unsigned char)s[i], cp = b, extra = 0;
        bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
        if (!printable) {
            for (int c = 0; c < b; c++)
                extra += !((c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || c >= 0xAE);
            cp = 256 + extra;
        }
        o += (size_t)utf8proc_encode_char(cp, (utf8proc_uint8_t *)out + o);
    }
    out[o] = 0;
}

/* The pre-tokenizer's split of text is exactly pieces[0..np): encoded with
 * a tiny variant whose vocab holds every expected piece whole and which
 * has ignore_merges (a word that is a token is that one id), each piece
 * must come out as its own id. A different split gives byte ids instead.
 * pattern: a Split regex to use (Isolated, then ByteLevel), or NULL for
 * tiny's own pre-tokenizer, the Qwen3 regex. */
static int split_is(const char *pattern, const char *text, const char *const *pieces, size_t np)
{
    json_t *j = tiny_json();
    if (!j)
        return 0;
    json_t *model = json_object_get(j, "model"), *vocab = json_object_get(model, "vocab");
    json_object_set_new(model, "ignore_merges", json_true());
    if (pattern)
        json_object_set_new(
            j, "pre_tokenizer",
            json_pack("{s:s,s:[{s:s,s:{s:s},s:s,s:b},{s:s,s:b,s:b,s:b}]}", "type", "Sequence",
                      "pretokenizers", "type", "Split", "pattern", "Regex", pattern, "behavior",
                      "Isolated", "invert", 0, "type", "ByteLevel", "add_prefix_space", 0,
                      "trim_offsets", 0, "use_regex", 0));
    int32_t want[16];
    for (size_t k = 0; k < np && k < 16; k++) {
        char sp[128];
        byte_level_spelling(pieces[k], strlen(pieces[k]), sp);
        json_t *have = json_object_get(vocab, sp);
        want[k] = have ? (int32_t)json_integer_value(have) : 300 + (int32_t)k;
        if (!have)
            json_object_set_new(vocab, sp, json_integer(want[k]));
    }
    dflash_tokenizer *t = NULL;
    dflash_status st = load_json(j, &t);
    CHECKF(st == DFLASH_OK, "pattern %s: %s", pattern ? pattern : "(tiny)", dflash_last_error());
    int ok = st == DFLASH_OK && np <= 16 && enc_eq(t, text, strlen(text), want, np);
    if (!ok)
        fprintf(stderr, "  split of \"%s\" by %s is not the expected %zu pieces\n", text,
                pattern ? pattern : "the Qwen3 regex", np);
    dflash_tokenizer_free(t);
    return ok;
}
#define SPLIT_IS(pattern, text, ...)                                                       \
    do {                                                                                   \
        const char *const p_[] = { __VA_ARGS__ };                                          \
        CHECK(split_is((pattern), (text), p_, sizeof p_ / sizeof p_[0]));                  \
    } while (0)

/* U+180E MONGOLIAN VOWEL SEPARATOR (not White_Space since Unicode 6.3),
 * U+3000 IDEOGRAPHIC SPACE and U+2028 LINE SEPARATOR (both White_Space). */
#define MVS "\xe1\xa0\x8e"
#define IDSP "\xe3\x80\x80"
#define LSEP "\xe2\x80\xa8"

/* \s in the Split regex is Oniguruma's (HF's) \s, Unicode White_Space:
 * U+180E MONGOLIAN VOWEL SEPARATOR is not in it (PCRE2's \s has it). Each
 * expected split follows from the Qwen3 regex read left to right, and was
 * checked against Oniguruma 6.9:
 *   "x \u180e.": at " ", " ?[^\s\p{L}\p{N}]+" takes " \u180e." whole since
 *   U+180E is not \s (PCRE2's \s splits it " ", "\u180e", ".");
 *   "x\u180e  y": U+180E alone by that same branch, then "\s+(?!\S)"
 *   leaves one space for " y" (PCRE2: "\u180e " then " y");
 *   "\u180e\u180e \n": "[^\s..]+" takes both, "\s*[\r\n]+" the rest. */
static void test_split_regex_white_space(void)
{
    SPLIT_IS(NULL, "x " MVS ".", "x", " " MVS ".");
    SPLIT_IS(NULL, "x" MVS "  y", "x", MVS, " ", " y");
    SPLIT_IS(NULL, MVS MVS " \n", MVS MVS, " \n");
    /* real White_Space stays whitespace: U+3000, U+00A0, U+0085; U+200B
     * (a format character) never was */
    SPLIT_IS(NULL, "a" IDSP IDSP "b", "a", IDSP, IDSP "b");
    SPLIT_IS(NULL, "x\xc2\xa0\xc2\x85y", "x", "\xc2\xa0", "\xc2\x85y");
    SPLIT_IS(NULL, "a\xe2\x80\x8b b", "a", "\xe2\x80\x8b", " b");
    /* the GPT-2 regex of ByteLevel(use_regex=true) reads \s the same way */
    json_t *j = tiny_json_gpt2_regex();
    if (!j)
        return;
    json_object_set_new(json_object_get(j, "model"), "ignore_merges", json_true());
    char sp[32];
    byte_level_spelling(" " MVS ".", 5, sp);
    json_object_set_new(json_object_get(json_object_get(j, "model"), "vocab"), sp,
                        json_integer(300));
    dflash_tokenizer *t = NULL;
    CHECK_OK(load_json(j, &t));
    if (t)
        ENC_EQ(t, "x " MVS ".", 'x', 300);
    dflash_tokenizer_free(t);
}

/* The escape rewriting respects the regex's own syntax: an escaped
 * backslash, classes (negated, with a literal ']' first, POSIX names),
 * comments; and the other escapes whose PCRE2 meaning differs from
 * Oniguruma's. Every expected split was checked against Oniguruma 6.9. */
static void test_split_regex_escapes(void)
{
    SPLIT_IS("\\\\s", "a\\sb", "a", "\\s", "b");           /* a backslash, then s */
    SPLIT_IS("[^\\S]+", "a" MVS " " IDSP "b", "a" MVS, " " IDSP, "b");
    SPLIT_IS("\\S+", "a" MVS "b c", "a" MVS "b", " ", "c");
    SPLIT_IS("[[:space:]]+", "a" MVS " " LSEP "b", "a" MVS, " " LSEP, "b");
    SPLIT_IS("[[:^space:]]+", "a" MVS " " LSEP "b", "a" MVS, " " LSEP, "b");
    SPLIT_IS("[[:alpha:]\\s]+", "1ab c" MVS "2", "1", "ab c", MVS "2");
    SPLIT_IS("[]\\s]+", "a] " MVS "b", "a", "] ", MVS "b");
    SPLIT_IS("(?#[)\\s", "a b", "a", " ", "b");
    /* Oniguruma: \h a hex digit, \v U+000B, \V \Q \E the letters */
    SPLIT_IS("\\h+", "xa1g", "x", "a1", "g");
    SPLIT_IS("[\\H]+", "xa1g", "x", "a1", "g");
    SPLIT_IS("\\v", "a\vb\nc", "a", "\v", "b\nc");
    SPLIT_IS("\\Q\\s\\E", "aQ Eb", "a", "Q E", "b");
    SPLIT_IS("\\V+", "aVVb", "a", "VV", "b");

    /* a pattern that only grows past the bound once spelled out is refused */
    size_t n = 8000;
    char *big = malloc(2 * n + 1);
    if (!big)
        return;
    for (size_t i = 0; i < n; i++)
        big[2 * i] = '\\', big[2 * i + 1] = 'S';
    big[2 * n] = 0;
    expect_fail("pre_tokenizer",
                json_pack("{s:s,s:{s:s},s:s,s:b}", "type", "Split", "pattern", "Regex", big,
                          "behavior", "Isolated", "invert", 0),
                DFLASH_ERR_UNSUPPORTED, "too long");
    free(big);
}

static void test_chat_render(void)
{
    char *txt;
    size_t len;
    dflash_chat_msg one[] = { { DFLASH_CHAT_USER, "Hi" } };
    CHECK_OK(dflash_chat_render(one, 1, NULL, &txt, &len));
    const char *want1 = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n";
    CHECKF(txt && !strcmp(txt, want1) && len == strlen(want1), "got \"%s\"", txt);
    free(txt);

    dflash_chat_opts o = dflash_chat_default_opts();
    o.thinking = 1;
    dflash_chat_msg multi[] = {
        { DFLASH_CHAT_SYSTEM, "Be brief." },
        { DFLASH_CHAT_USER, "Q1" },
        { DFLASH_CHAT_ASSISTANT, "<think>\nhmm\n</think>\n\nA1" },
        { DFLASH_CHAT_USER, "Q2" },
    };
    CHECK_OK(dflash_chat_render(multi, 4, &o, &txt, &len));
    const char *want2 = "<|im_start|>system\nBe brief.<|im_end|>\n"
                        "<|im_start|>user\nQ1<|im_end|>\n"
                        "<|im_start|>assistant\nA1<|im_end|>\n"
                        "<|im_start|>user\nQ2<|im_end|>\n"
                        "<|im_start|>assistant\n";
    CHECKF(txt && !strcmp(txt, want2), "got \"%s\"", txt);
    free(txt);

    o.add_generation_prompt = 0;
    CHECK_OK(dflash_chat_render(NULL, 0, &o, &txt, &len));
    CHECK(txt && len == 0);
    free(txt);
    dflash_chat_msg bad[] = { { (dflash_chat_role)7, "x" } };
    CHECK_FAILS(dflash_chat_render(bad, 1, NULL, &txt, &len), DFLASH_ERR_INVALID_ARG, "role");

    dflash_tokenizer *t = load_tiny();
    if (!t)
        return;
    int32_t *ids;
    size_t n;
    CHECK_OK(dflash_chat_encode(t, one, 1, NULL, &ids, &n));
    const int32_t want_ids[] = { 275, 'u', 's', 273, '\n', 'H', 'i', 276, '\n', 275, 'a', 's', 's',
                                 'i', 's', 't', 'a', 'n', 't', '\n', 277, 272, 278, 272 };
    CHECK(n == sizeof want_ids / sizeof want_ids[0] && !memcmp(ids, want_ids, sizeof want_ids));
    free(ids);
    dflash_tokenizer_free(t);
}

static void test_chat_eos_ids(void)
{
    dflash_tokenizer *t = load_tiny();
    if (!t)
        return;
    char dir[] = "/tmp/dflash_eos_XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    int32_t ids[DFLASH_CHAT_MAX_EOS];
    size_t n;
    CHECK_FAILS(dflash_chat_eos_ids(dir, t, ids, DFLASH_CHAT_MAX_EOS, &n), DFLASH_ERR_NOT_FOUND,
                dir);
    test_write_file(dir, "tokenizer_config.json", "{\"eos_token\": \"<|im_end|>\"}");
    CHECK_OK(dflash_chat_eos_ids(dir, t, ids, DFLASH_CHAT_MAX_EOS, &n));
    CHECK(n == 1 && ids[0] == 276);
    test_write_file(dir, "generation_config.json", "{\"eos_token_id\": [276, 274]}");
    CHECK_OK(dflash_chat_eos_ids(dir, t, ids, DFLASH_CHAT_MAX_EOS, &n));
    CHECK(n == 2 && ids[0] == 276 && ids[1] == 274);
    test_write_file(dir, "generation_config.json", "{\"eos_token_id\": 274}");
    test_write_file(dir, "tokenizer_config.json", "{\"eos_token\": {\"content\": \"<|im_end|>\"}}");
    CHECK_OK(dflash_chat_eos_ids(dir, t, ids, DFLASH_CHAT_MAX_EOS, &n));
    CHECK(n == 2 && ids[0] == 276 && ids[1] == 274);
    CHECK_FAILS(dflash_chat_eos_ids(dir, t, ids, 1, &n), DFLASH_ERR_INVALID_ARG,
                "generation_config.json");
    test_write_file(dir, "tokenizer_config.json", "{\"eos_token\": \"<|nope|>\"}");
    CHECK_FAILS(dflash_chat_eos_ids(dir, t, ids, DFLASH_CHAT_MAX_EOS, &n), DFLASH_ERR_NOT_FOUND,
                "<|nope|>");
    test_write_file(dir, "generation_config.json", "{\"eos_token_id\": ");
    test_remove_file(dir, "tokenizer_config.json");
    CHECK_FAILS(dflash_chat_eos_ids(dir, t, ids, DFLASH_CHAT_MAX_EOS, &n), DFLASH_ERR_FORMAT,
                "generation_config.json");
    test_remove_file(dir, "generation_config.json");
    rmdir(dir);
    dflash_tokenizer_free(t);
}

int main(void)
{
    snprintf(g_tiny_path, sizeof g_tiny_path, "%s/tokenizer/tiny/tokenizer.json", test_data_dir());
    RUN(test_load_and_lookup);
    RUN(test_encode_hand_checked);
    RUN(test_encode_added_tokens);
    RUN(test_encode_nfc_and_invalid_utf8);
    RUN(test_decode);
    RUN(test_stream_basic);
    RUN(test_stream_random);
    RUN(test_round_trip_texts);
    RUN(test_long_inputs);
    RUN(test_merges_as_pairs);
    RUN(test_bytelevel_use_regex);
    RUN(test_unsupported_features);
    RUN(test_added_tokens_unique);
    RUN(test_post_processor);
    RUN(test_split_regex_white_space);
    RUN(test_split_regex_escapes);
    RUN(test_chat_render);
    RUN(test_chat_eos_ids);
    TEST_END();
}
