/* cmd_chat.c: `dflash chat`: an interactive conversation in the Qwen3 chat
 * format. The target's KV cache and the drafter's context persist across
 * turns: each turn runs only its new tokens (the previous answer's last,
 * still unverified token, then the user's message and the assistant prefix). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/engine.h"
#include "io/chat.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: dflash chat -m TARGET_DIR [-d DRAFT_DIR | --draft ngram] [options]\n"
            "\n"
            "Interactive chat: one user message per line on stdin (EOF ends it); each answer\n"
            "is streamed to stdout, statistics to stderr. The conversation and its KV cache\n"
            "are kept across turns, so earlier turns are never recomputed.\n"
            "\n"
            "chat options:\n"
            "  --system TEXT          system message for the conversation\n"
            "  --think                leave Qwen3 thinking on (default: the empty think block)\n"
            "  -n, --n-new N          tokens per answer at most (default 512)\n"
            "  --quiet                no statistics line after each answer\n"
            "  -h, --help             this text\n"
            "\n");
    cli_engine_usage(f);
    fprintf(f, "\nThe context (--max-ctx, default 4096) bounds the whole conversation; when the\n"
               "next turn would not fit, chat says so and ends.\n");
}

typedef struct chat_args {
    cli_engine_args e;
    const char *system;
    int n_new, think, quiet;
} chat_args;

static int parse(int argc, char **argv, chat_args *a)
{
    memset(a, 0, sizeof *a);
    cli_engine_args_init(&a->e);
    a->n_new = 512;
    for (int i = 1; i < argc; i++) {
        const char *o = argv[i], *v;
        int r = cli_engine_parse(argc, argv, &i, &a->e, "chat");
        if (r < 0)
            return 0;
        if (r > 0)
            continue;
        if (!strcmp(o, "-h") || !strcmp(o, "--help")) {
            usage(stdout);
            exit(0);
        } else if (!strcmp(o, "--system")) {
            if (!(a->system = cli_value(argc, argv, &i)))
                return 0;
        } else if (!strcmp(o, "--think")) {
            a->think = 1;
        } else if (!strcmp(o, "--quiet")) {
            a->quiet = 1;
        } else if (!strcmp(o, "-n") || !strcmp(o, "--n-new")) {
            if (!(v = cli_value(argc, argv, &i)) || !cli_parse_int(o, v, 1, 1 << 24, &a->n_new))
                return 0;
        } else {
            fprintf(stderr, "dflash chat: unknown option '%s' (see --help)\n", o);
            return 0;
        }
    }
    if (!a->e.model) {
        fprintf(stderr, "dflash chat: -m is required (see --help)\n");
        return 0;
    }
    if (!a->e.max_ctx)
        a->e.max_ctx = 4096;
    return 1;
}

/* The ids of one turn. First turn: the whole rendered conversation so far.
 * Later turns: the last answer's final token (emitted, not yet run), the
 * end-of-turn marker if the answer was cut by the budget, then "\n" and the
 * rendered user message with the assistant prefix. */
static dflash_status turn_ids(const chat_args *a, dflash_tokenizer *tok, int first, int32_t last, int stopped,
                              const char *msg, int32_t **ids, size_t *n)
{
    dflash_chat_opts co = dflash_chat_default_opts();
    co.thinking = a->think;
    dflash_chat_msg msgs[2];
    size_t nm = 0;
    if (first && a->system)
        msgs[nm++] = (dflash_chat_msg){ DFLASH_CHAT_SYSTEM, a->system };
    msgs[nm++] = (dflash_chat_msg){ DFLASH_CHAT_USER, msg };
    if (first)
        return dflash_chat_encode(tok, msgs, nm, &co, ids, n);
    char *text, *with_nl;
    size_t len;
    int32_t *body;
    size_t n_body;
    DFLASH_TRY(dflash_chat_render(msgs, nm, &co, &text, &len));
    with_nl = malloc(len + 2);
    if (!with_nl) {
        free(text);
        return dflash_fail(DFLASH_ERR_OOM, "chat: out of memory");
    }
    with_nl[0] = '\n';
    memcpy(with_nl + 1, text, len + 1);
    free(text);
    dflash_status s = dflash_tokenizer_encode(tok, with_nl, len + 1, &body, &n_body);
    free(with_nl);
    DFLASH_TRY(s);
    int32_t im_end = dflash_tokenizer_token_id(tok, "<|im_end|>");
    /* The turn is closed already only if the answer ended on <|im_end|>. */
    int extra = (stopped && last == im_end) || im_end < 0 ? 1 : 2;
    *ids = malloc((n_body + 2) * sizeof(int32_t));
    if (!*ids) {
        free(body);
        return dflash_fail(DFLASH_ERR_OOM, "chat: out of memory");
    }
    (*ids)[0] = last;
    if (extra == 2)
        (*ids)[1] = im_end;
    memcpy(*ids + extra, body, n_body * sizeof(int32_t));
    *n = n_body + (size_t)extra;
    free(body);
    return DFLASH_OK;
}

int dflash_cmd_chat(int argc, char **argv)
{
    chat_args a;
    if (!parse(argc, argv, &a))
        return 2;
    cli_engine e;
    cli_streamer sm = { NULL, DFLASH_OK };
    int32_t *out = malloc((size_t)a.n_new * sizeof *out);
    dflash_status s = out ? cli_engine_load_tokenizer(&e, &a.e) : dflash_fail(DFLASH_ERR_OOM, "out of memory");
    if (!out)
        memset(&e, 0, sizeof e);
    if (s == DFLASH_OK)
        s = cli_engine_open(&e, &a.e, a.e.max_ctx);
    if (s == DFLASH_OK)
        s = dflash_detok_stream_new(e.tok, DFLASH_DECODE_SKIP_SPECIAL, &sm.ds);
    char *line = NULL;
    size_t cap = 0;
    int first = 1, stopped = 1, interactive = isatty(0);
    int32_t last = -1;
    while (s == DFLASH_OK) {
        if (interactive)
            fputs("> ", stderr);
        ssize_t got = getline(&line, &cap, stdin);
        if (got < 0)
            break;
        while (got > 0 && (line[got - 1] == '\n' || line[got - 1] == '\r'))
            line[--got] = 0;
        if (got == 0)
            continue;
        int32_t *ids = NULL;
        size_t n_ids = 0;
        s = turn_ids(&a, e.tok, first, last, stopped, line, &ids, &n_ids);
        if (s != DFLASH_OK)
            break;
        dflash_gen_opts go;
        cli_engine_gen_opts(&e, &a.e, &go);
        go.n_new = a.n_new;
        go.on_tokens = cli_streamer_on_tokens;
        go.user = &sm;
        if (e.seq.len + (int)n_ids + a.n_new + DFLASH_MAX_BLOCK > e.target->opts.max_ctx) {
            s = dflash_fail(DFLASH_ERR_INVALID_ARG, "the conversation (%d tokens) would outgrow --max-ctx %d; "
                            "start a new chat or raise --max-ctx", e.seq.len + (int)n_ids, e.target->opts.max_ctx);
            free(ids);
            break;
        }
        dflash_gen_stats st = { 0 };
        int n_out = 0;
        dflash_detok_stream_reset(sm.ds);
        s = dflash_spec_generate(e.target, &e.seq, e.prop, e.pstate, ids, (int)n_ids, &go, out, &n_out, &st);
        free(ids);
        if (s == DFLASH_OK && sm.status != DFLASH_OK)
            s = sm.status;
        const char *piece;
        size_t len;
        if (s == DFLASH_OK && (s = dflash_detok_stream_finish(sm.ds, &piece, &len)) == DFLASH_OK) {
            fwrite(piece, 1, len, stdout);
            fputc('\n', stdout);
            fflush(stdout);
            if (!a.quiet)
                cli_print_stats_line(stderr, &st);
        }
        first = 0;
        stopped = st.stopped;
        last = n_out > 0 ? out[n_out - 1] : last;
    }
    if (s != DFLASH_OK)
        fprintf(stderr, "dflash chat: %s\n", dflash_last_error());
    free(line);
    dflash_detok_stream_free(sm.ds);
    cli_engine_close(&e);
    free(out);
    return s == DFLASH_OK ? 0 : 1;
}
