/* tokenizer_check.h: checks both tokenizer tests run (the tiny committed
 * tokenizer and the real Qwen3 one). Header-only, for tests. */
#ifndef DFLASH_TESTS_TOKENIZER_CHECK_H
#define DFLASH_TESTS_TOKENIZER_CHECK_H

#include <jansson.h>
#include <utf8proc.h>

#include "io/tokenizer.h"

/* decode(encode(x)) == NFC(x) for every string of the JSON array. */
static inline void check_round_trip(dflash_tokenizer *tok, const json_t *texts)
{
    size_t i;
    json_t *v;
    json_array_foreach(texts, i, v)
    {
        const char *s = json_string_value(v);
        size_t sl = json_string_length(v);
        utf8proc_uint8_t *nfc = NULL;
        utf8proc_ssize_t nl = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)sl, &nfc,
                                           UTF8PROC_STABLE | UTF8PROC_COMPOSE);
        int32_t *ids = NULL;
        size_t n = 0;
        char *out = NULL;
        size_t ol = 0;
        CHECK_OK(dflash_tokenizer_encode(tok, s, sl, &ids, &n));
        CHECK_OK(dflash_tokenizer_decode(tok, ids, n, 0, &out, &ol));
        CHECKF(nl >= 0 && ol == (size_t)nl && out && !memcmp(out, nfc, ol), "text %zu: \"%.60s\"", i, s);
        free(nfc);
        free(out);
        free(ids);
    }
}

#endif
