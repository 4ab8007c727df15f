/* simple.c: the smallest program on dflash's public API (include/dflash.h
 * only): open an engine on a target and a drafter, generate a continuation
 * of a prompt, print the text and the statistics.
 *
 *   simple TARGET_DIR [DRAFTER_DIR|ngram|-] [PROMPT]
 *
 * With "-" (or no second argument) it decodes plainly. */
#include <stdio.h>
#include <stdlib.h>

#include "dflash.h"

static int fail(const char *what)
{
    fprintf(stderr, "simple: %s: %s\n", what, dflash_last_error());
    return 1;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: simple TARGET_DIR [DRAFTER_DIR|ngram|-] [PROMPT]\n");
        return 2;
    }
    dflash_engine_opts eo;
    dflash_engine_default_opts(&eo);
    eo.model_dir = argv[1];
    eo.draft = argc > 2 && argv[2][0] != '-' ? argv[2] : NULL;
    eo.max_sessions = 1;
    eo.max_ctx = 1024;
    dflash_engine *e;
    if (dflash_engine_open(&eo, &e) != DFLASH_OK)
        return fail("open");
    dflash_session_opts so;
    dflash_session_default_opts(&so);
    so.max_tokens = 64;
    dflash_session *s;
    int rc = 0;
    if (dflash_session_new(e, &so, &s) != DFLASH_OK) {
        dflash_engine_close(e);
        return fail("session");
    }
    const char *prompt = argc > 3 ? argv[3] : "def add(a, b):\n";
    int active = 0;
    dflash_status st = dflash_session_start_text(s, prompt);
    for (active = st == DFLASH_OK; st == DFLASH_OK && active;)
        st = dflash_engine_step(e, &active);
    char *text = NULL;
    if (st == DFLASH_OK)
        st = dflash_session_text(s, &text);
    if (st == DFLASH_OK) {
        dflash_session_stats ss;
        dflash_session_stats_get(s, &ss);
        printf("%s%s\n", prompt, text);
        printf("[%d prompt + %d generated tokens in %d steps; tau %.2f; %.1f ms, prefill %.1f ms; %.1f tokens/s]\n",
               ss.prompt_tokens, ss.generated_tokens, ss.steps, ss.mean_accept, ss.total_ms, ss.prefill_ms,
               ss.tokens_per_s);
    } else {
        rc = fail("generate");
    }
    free(text);
    dflash_session_free(s);
    dflash_engine_close(e);
    return rc;
}
