/* fuzz_tokenizer_json.c: libFuzzer target for the tokenizer.json loader.
 * Any input must either load or fail with a status; what loads must encode
 * and decode a fixed text without crashing. Seeds (tests/fuzz/corpus/
 * tokenizer_json) are small valid and near-valid files. */
#include <stdint.h>
#include <stdlib.h>

#include "io/tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    dflash_tokenizer *t = NULL;
    if (dflash_tokenizer_load_memory((const char *)data, size, "fuzz.json", &t) != DFLASH_OK) {
        if (t)
            __builtin_trap();
        return 0;
    }
    static const char text[] = "Hello world <|im_start|> e\xcc\x81 \xe4\xb8\xad  12\n\n\xff";
    int32_t *ids;
    size_t n;
    if (dflash_tokenizer_encode(t, text, sizeof text - 1, &ids, &n) == DFLASH_OK) {
        char *out;
        size_t len;
        if (dflash_tokenizer_decode(t, ids, n, 0, &out, &len) == DFLASH_OK)
            free(out);
        free(ids);
    }
    dflash_tokenizer_free(t);
    return 0;
}
