/* cmd_chat.c: `dflash chat`: an interactive conversation in the model's chat
 * format (Qwen3 or Llama 3), one session of the library engine
 * (include/dflash.h). The session keeps the target's KV cache and the
 * drafter's context across turns: each turn starts it with only its new
 * tokens (the user's message and the assistant prefix), and the engine
 * runs the previous answer's last, still unverified token before them. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/engine.h"
#include "core/file.h"
#include "io/chat.h"

/* The conversation's limit in positions when --max-ctx is not given (the
 * model's context length when that is smaller). */
#define CHAT_DEFAULT_MAX_CTX 4096
/* One message line; far more text than a context of 32k tokens holds. */
#define CHAT_LINE_MAX_BYTES ((size_t)1 << 20)

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
    fprintf(f, "\nThe context (--max-ctx, default %d, or the model's context length when that is\n"
               "smaller) bounds the whole conversation; when the next turn (message + -n) would\n"
               "not fit, chat says so and ends. A message line may hold at most %zu bytes.\n",
            CHAT_DEFAULT_MAX_CTX, CHAT_LINE_MAX_BYTES);
}

typedef struct chat_args {
    cli_engine_args e;
    const char *system;
    int n_new, think, quiet;
    dflash_chat_opts co; /* the model's format, --think */
} chat_args;

static int parse(int argc, char **argv, chat_args *a)
{
    memset(a, 0, sizeof *a);
    cli_engine_args_init(&a->e);
    a->n_new = 512;
    for (int i = 1; i < argc; i++) {
        const char *o = argv[i], *v;
        int r = cli_engine_parse_or_help(argc, argv, &i, &a->e, "chat", usage);
        if (r < 0)
            return 0;
        if (r > 0)
            continue;
        if (!strcmp(o, "--system")) {
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
    return 1;
}

/* The ids of one turn. First turn: the whole rendered conversation so far.
 * Later turns (the session runs the last answer's final token, emitted
 * but not yet run, before them): the end-of-turn marker if the answer was
 * cut by the budget, then the format's turn separator ("\n" for Qwen3) and
 * the rendered user message with the assistant prefix. */
static dflash_status turn_ids(const chat_args *a, dflash_tokenizer *tok, int first, int32_t last, int stopped,
                              const char *msg, int32_t **ids, size_t *n)
{
    dflash_chat_opts co = a->co;
    co.continuing = !first;
    dflash_chat_msg msgs[2];
    size_t nm = 0;
    if (first && a->system)
        msgs[nm++] = (dflash_chat_msg){ DFLASH_CHAT_SYSTEM, a->system };
    msgs[nm++] = (dflash_chat_msg){ DFLASH_CHAT_USER, msg };
    if (first)
        return dflash_chat_encode(tok, msgs, nm, &co, ids, n);
    const char *sep = dflash_chat_turn_separator(co.format);
    size_t n_sep = strlen(sep);
    char *text, *joined;
    size_t len;
    int32_t *body;
    size_t n_body;
    DFLASH_TRY(dflash_chat_render(msgs, nm, &co, &text, &len));
    joined = malloc(n_sep + len + 1);
    if (!joined) {
        free(text);
        return dflash_fail(DFLASH_ERR_OOM, "chat: out of memory");
    }
    memcpy(joined, sep, n_sep);
    memcpy(joined + n_sep, text, len + 1);
    free(text);
    dflash_status s = dflash_tokenizer_encode(tok, joined, n_sep + len, &body, &n_body);
    free(joined);
    DFLASH_TRY(s);
    int32_t eot = dflash_tokenizer_token_id(tok, dflash_chat_end_of_turn(co.format));
    /* The turn is closed already only if the answer ended on the marker. */
    int extra = (stopped && last == eot) || eot < 0 ? 0 : 1;
    *ids = malloc((n_body + 1) * sizeof(int32_t));
    if (!*ids) {
        free(body);
        return dflash_fail(DFLASH_ERR_OOM, "chat: out of memory");
    }
    if (extra)
        (*ids)[0] = eot;
    memcpy(*ids + extra, body, n_body * sizeof(int32_t));
    *n = n_body + (size_t)extra;
    free(body);
    return DFLASH_OK;
}

/* What a conversation carries from turn to turn. */
typedef struct chat_state {
    cli_engine e; /* the tokenizer and the stop ids the command line adds */
    dflash_engine *engine;
    dflash_session *session; /* the conversation: its cache, history and sampling */
    cli_engine_plan plan;
    cli_streamer sm;
    long long positions; /* the conversation so far: every turn's ids and answer */
    int first, stopped;
    int32_t last; /* the last answer's final token, emitted but not yet run */
} chat_state;

/* The positions this turn may reach against the conversation's limit; the
 * message states exactly the sum it checks. */
static dflash_status check_turn_fits(const chat_args *a, const chat_state *c, size_t n_ids)
{
    long long after = c->positions + (long long)n_ids + a->n_new;
    if (after <= c->plan.limit)
        return DFLASH_OK;
    return dflash_fail(DFLASH_ERR_INVALID_ARG, "this turn would bring the conversation to %lld positions (%lld so "
                       "far + %zu for this message + -n %d), past %s; start a new chat, lower -n, or %s", after,
                       c->positions, n_ids, a->n_new, c->plan.limit_desc, cli_engine_limit_hint(&c->plan));
}

/* One user message: its ids, the fit check, the answer streamed to stdout. */
static dflash_status chat_turn(const chat_args *a, chat_state *c, const char *msg)
{
    int32_t *ids = NULL;
    size_t n_ids = 0;
    DFLASH_TRY(turn_ids(a, c->e.tok, c->first, c->last, c->stopped, msg, &ids, &n_ids));
    dflash_status s = check_turn_fits(a, c, n_ids);
    if (s == DFLASH_OK) {
        dflash_detok_stream_reset(c->sm.ds);
        s = cli_session_run(c->engine, c->session, ids, n_ids);
    }
    free(ids);
    if (s == DFLASH_OK && c->sm.status != DFLASH_OK)
        s = c->sm.status;
    const int32_t *out;
    size_t n_out;
    dflash_session_output(c->session, &out, &n_out);
    dflash_gen_stats st;
    cli_session_stats(c->session, &st);
    c->positions += (long long)n_ids + (long long)n_out;
    const char *piece;
    size_t len;
    if (s == DFLASH_OK && (s = dflash_detok_stream_finish(c->sm.ds, &piece, &len)) == DFLASH_OK) {
        fwrite(piece, 1, len, stdout);
        fputc('\n', stdout);
        s = cli_check_output(stdout, "standard output");
        if (s == DFLASH_OK && !a->quiet)
            cli_print_stats_line(stderr, &st);
    }
    c->first = 0;
    c->stopped = st.stopped;
    c->last = n_out > 0 ? out[n_out - 1] : c->last;
    return s;
}

/* Limits, tokenizer, the engine with the conversation's session, and the
 * detokenizer stream. */
static dflash_status chat_open(chat_args *a, chat_state *c)
{
    DFLASH_TRY(cli_engine_plan_load(&a->e, CHAT_DEFAULT_MAX_CTX, &c->plan));
    if ((long long)a->n_new + 1 > c->plan.limit)
        return dflash_fail(DFLASH_ERR_INVALID_ARG, "-n %d leaves no room for a message within %s; lower -n or %s",
                           a->n_new, c->plan.limit_desc, cli_engine_limit_hint(&c->plan));
    cli_engine_warn_long(&a->e, &c->plan, c->plan.limit);
    DFLASH_TRY(cli_engine_load_tokenizer(&c->e, &a->e));
    DFLASH_TRY(cli_engine_chat_opts(&a->e, c->e.tok, a->think, &a->co));
    DFLASH_TRY(cli_engine_lib_stops(&c->e, &a->e, &a->co));
    DFLASH_TRY(dflash_detok_stream_new(c->e.tok, DFLASH_DECODE_SKIP_SPECIAL, &c->sm.ds));
    /* The engine's limit is the conversation's (it keeps one block more). */
    DFLASH_TRY(cli_engine_open_lib(&a->e, 1, c->plan.limit, 0, &c->engine));
    dflash_session_opts so;
    cli_session_opts(&c->e, &a->e, &a->e.sampler, a->n_new, &so);
    so.on_tokens = cli_streamer_on_tokens;
    so.user = &c->sm;
    return dflash_session_new(c->engine, &so, &c->session);
}

/* Messages, one per line, until EOF; every line is bounded. */
static dflash_status chat_loop(const chat_args *a, chat_state *c)
{
    int interactive = isatty(0);
    for (;;) {
        if (interactive)
            fputs("> ", stderr);
        char *line;
        size_t got;
        int eof;
        DFLASH_TRY(dflash_read_bounded(stdin, "standard input", CHAT_LINE_MAX_BYTES, "a chat message", '\n', &line,
                                       &got, &eof));
        while (got > 0 && line[got - 1] == '\r')
            line[--got] = 0;
        dflash_status s = got > 0 ? chat_turn(a, c, line) : DFLASH_OK;
        free(line);
        if (s != DFLASH_OK || eof)
            return s;
    }
}

int dflash_cmd_chat(int argc, char **argv)
{
    chat_args a;
    if (!parse(argc, argv, &a))
        return 2;
    /* Checked first: the models would load only to find nothing to read. */
    if (cli_std_fd_closed(0)) {
        fprintf(stderr, "dflash chat: standard input is closed; chat reads one message per line from it\n");
        return 1;
    }
    chat_state c;
    memset(&c, 0, sizeof c);
    c.first = c.stopped = 1;
    c.last = -1;
    dflash_status s = chat_open(&a, &c);
    if (s == DFLASH_OK)
        s = chat_loop(&a, &c);
    if (s == DFLASH_OK)
        s = cli_close_output(stdout, "standard output");
    if (s != DFLASH_OK)
        fprintf(stderr, "dflash chat: %s\n", dflash_last_error());
    dflash_session_free(c.session);
    dflash_engine_close(c.engine);
    dflash_detok_stream_free(c.sm.ds);
    cli_engine_close(&c.e);
    return s == DFLASH_OK ? 0 : 1;
}
