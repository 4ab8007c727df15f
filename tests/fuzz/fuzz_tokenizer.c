/* fuzz_tokenizer.c: libFuzzer target for encode/decode. Loads the tiny test
 * tokenizer once (tests/data/tokenizer/tiny, or $DFLASH_TEST_DATA/...) and
 * encodes each input as text. Inputs need not be valid UTF-8: encode
 * replaces invalid sequences by U+FFFD (documented in tokenizer.h), so it
 * must always succeed. Checked: decode(encode(x)) is valid UTF-8; when x
 * is valid UTF-8 it is x with the text between added tokens in NFC (each
 * run of other tokens decodes to NFC text; with no added token that is
 * NFC(x) itself) and its NFC equals NFC(x); the streaming decoder's chunks
 * concatenate to the same text. Added tokens are split off before the
 * text is normalized, as in Hugging Face tokenizers, so in "</think>" +
 * U+0338 the '>' and the combining mark stay apart where NFC of the whole
 * would join them into U+226F. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "io/tokenizer.h"

static dflash_tokenizer *g_tok;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    const char *d = getenv("DFLASH_TEST_DATA");
    char path[1024];
    snprintf(path, sizeof path, "%s/tokenizer/tiny/tokenizer.json", d ? d : "tests/data");
    if (dflash_tokenizer_load(path, &g_tok) != DFLASH_OK) {
        fprintf(stderr, "fuzz_tokenizer: %s\n", dflash_last_error());
        abort();
    }
    return 0;
}

/* NFC of s[0..n) into a malloc'd buffer; its length, or < 0 */
static utf8proc_ssize_t nfc_of(const void *s, size_t n, utf8proc_uint8_t **out)
{
    *out = NULL;
    return utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, out, UTF8PROC_STABLE | UTF8PROC_COMPOSE);
}

/* Is out the decode of ids with every run of non-added tokens in NFC
 * (added tokens as they decode)? */
static int runs_in_nfc(const int32_t *ids, size_t n, const char *out, size_t len)
{
    size_t at = 0;
    for (size_t i = 0; i < n;) {
        size_t j = i + 1;
        const int added = dflash_tokenizer_is_added(g_tok, ids[i]);
        while (!added && j < n && !dflash_tokenizer_is_added(g_tok, ids[j]))
            j++;
        char *piece;
        size_t pl;
        if (dflash_tokenizer_decode(g_tok, ids + i, j - i, 0, &piece, &pl) != DFLASH_OK)
            return 0;
        utf8proc_uint8_t *nfc = NULL;
        const utf8proc_ssize_t nl = added ? (utf8proc_ssize_t)pl : nfc_of(piece, pl, &nfc);
        const void *want = added ? (const void *)piece : (const void *)nfc;
        const int ok = nl >= 0 && at + (size_t)nl <= len && !memcmp(out + at, want, (size_t)nl);
        at += ok ? (size_t)nl : 0;
        free(nfc);
        free(piece);
        if (!ok)
            return 0;
        i = j;
    }
    return at == len;
}

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

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    int32_t *ids;
    size_t n;
    if (dflash_tokenizer_encode(g_tok, (const char *)data, size, &ids, &n) != DFLASH_OK)
        __builtin_trap();
    char *out;
    size_t len;
    if (dflash_tokenizer_decode(g_tok, ids, n, 0, &out, &len) != DFLASH_OK || !valid_utf8(out, len))
        __builtin_trap();
    if (valid_utf8((const char *)data, size)) {
        utf8proc_uint8_t *nfc, *nfc_out;
        const utf8proc_ssize_t nl = nfc_of(data, size, &nfc), ol = nfc_of(out, len, &nfc_out);
        if (nl < 0 || ol != nl || memcmp(nfc, nfc_out, (size_t)nl) || !runs_in_nfc(ids, n, out, len))
            __builtin_trap();
        free(nfc);
        free(nfc_out);
    }
    dflash_detok_stream *s;
    if (dflash_detok_stream_new(g_tok, size & 1 ? DFLASH_DECODE_SKIP_SPECIAL : 0, &s))
        __builtin_trap();
    char *full;
    size_t fl, got = 0;
    if (dflash_tokenizer_decode(g_tok, ids, n, size & 1 ? DFLASH_DECODE_SKIP_SPECIAL : 0, &full, &fl))
        __builtin_trap();
    for (size_t i = 0; i <= n; i++) {
        const char *txt;
        size_t tl;
        dflash_status st = i < n ? dflash_detok_stream_push(s, ids[i], &txt, &tl)
                                 : dflash_detok_stream_finish(s, &txt, &tl);
        if (st || got + tl > fl || memcmp(full + got, txt, tl) || !valid_utf8(txt, tl))
            __builtin_trap();
        got += tl;
    }
    if (got != fl)
        __builtin_trap();
    dflash_detok_stream_free(s);
    free(full);
    free(out);
    free(ids);
    return 0;
}
