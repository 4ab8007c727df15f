/* cmd_serve.c: `dflash serve`: options, opening the engine and the
 * tokenizer, starting the scheduler and the HTTP server, and the orderly
 * exit on SIGTERM or SIGINT (stop accepting, let running requests finish
 * for a bounded time, exit 0). See serve.h for the parts. */
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <utf8proc.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/serve.h"

/* s is non-empty and valid UTF-8 */
static int utf8_text(const char *s)
{
    const utf8proc_ssize_t n = (utf8proc_ssize_t)strlen(s);
    utf8proc_int32_t cp;
    for (utf8proc_ssize_t i = 0; i < n;) {
        const utf8proc_ssize_t r = utf8proc_iterate((const utf8proc_uint8_t *)s + i, n - i, &cp);
        if (r <= 0)
            return 0;
        i += r;
    }
    return n > 0;
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: dflash serve -m TARGET_DIR [-d DRAFT_DIR | --draft ngram] [options]\n"
            "\n"
            "An OpenAI-compatible HTTP server. Requests are stepped together (continuous\n"
            "batching): every step runs one drafter propose and one target verify over all\n"
            "running requests, and each request's output is what it would get alone.\n"
            "\n"
            "Endpoints: POST /v1/chat/completions (messages, max_tokens or\n"
            "max_completion_tokens, temperature, top_p, top_k, min_p, repetition_penalty,\n"
            "frequency_penalty, presence_penalty, seed, stop, stream,\n"
            "stream_options.include_usage, ignore_eos, chat_template_kwargs.enable_thinking;\n"
            "n must be 1), POST /v1/completions\n"
            "(prompt: a string or token ids; the same fields), GET /v1/models,\n"
            "GET /v1/models/{id}, GET /health, GET /metrics (Prometheus text); HEAD\n"
            "wherever GET. Responses carry usage and \"dflash\":\n"
            "{\"mean_accept\", \"steps\"}: tokens committed per target step.\n"
            "\n"
            "server:\n"
            "  --host H               address to listen on (default 127.0.0.1)\n"
            "  --port P               TCP port (default 8000)\n"
            "  --api-key KEY          require 'Authorization: Bearer KEY' on /v1/*\n"
            "  --served-model-name N  the model id clients name (default: the target folder's\n"
            "                         name)\n"
            "  --max-sessions N       requests generating at once (default 8)\n"
            "  --max-queue N          requests waiting beyond those (default 64); more get 429\n"
            "  --kv-pages N           KV pages of 16 positions the running requests share\n"
            "                         (default: room for --max-sessions requests of --max-ctx\n"
            "                         positions); a request that does not fit yet waits, one\n"
            "                         larger than all of them gets 400\n"
            "  --max-body-bytes N     largest request body (default 1048576); larger get 413\n"
            "  --client-timeout S     seconds a client may take to send its request, or stay\n"
            "                         idle between requests, before its connection is closed\n"
            "                         (default 30; 0 = no limit). Not while its request runs\n"
            "  -h, --help             this text\n"
            "\n"
            "The options below are generate's; the sampling ones are defaults that a\n"
            "request's own fields override.\n"
            "\n");
    cli_engine_usage(f);
    fprintf(f,
            "\n"
            "Context: --max-ctx (default 4096, at most the model's unless\n"
            "--allow-long-context) bounds prompt + max_tokens of every request; without\n"
            "max_tokens a request may use all of it.\n"
            "Drafting: by default each step drafts the cost-aware width, the number of\n"
            "drafts with the most expected tokens per second per request at the current\n"
            "number of requests (0 when speculation does not pay); --block-size B drafts\n"
            "B - 1 every step. --ctx-cap bounds the drafter's context window.\n"
            "SIGTERM or SIGINT: no new requests, running ones get up to 30 s to finish,\n"
            "exit 0.\n");
}

typedef struct serve_args {
    cli_engine_args e;
    const char *host, *api_key, *name;
    int port, max_sessions, max_queue, max_body, kv_pages, client_timeout;
} serve_args;

static int parse(int argc, char **argv, serve_args *a)
{
    memset(a, 0, sizeof *a);
    cli_engine_args_init(&a->e);
    a->host = "127.0.0.1";
    a->port = 8000;
    a->max_sessions = 8;
    a->max_queue = 64;
    a->max_body = 1 << 20;
    a->client_timeout = 30;
    for (int i = 1; i < argc; i++) {
        const char *o = argv[i], *v;
        int r = cli_engine_parse_or_help(argc, argv, &i, &a->e, "serve", usage);
        if (r < 0)
            return 0;
        if (r > 0)
            continue;
        if (!strcmp(o, "--host")) {
            if (!(a->host = cli_value(argc, argv, &i)))
                return 0;
        } else if (!strcmp(o, "--api-key")) {
            if (!(a->api_key = cli_value(argc, argv, &i)))
                return 0;
        } else if (!strcmp(o, "--served-model-name")) {
            if (!(a->name = cli_value(argc, argv, &i)))
                return 0;
            if (!utf8_text(a->name)) { /* it goes into JSON answers */
                fprintf(stderr, "dflash serve: --served-model-name must be non-empty UTF-8 text, got '%s'\n", a->name);
                return 0;
            }
        } else if (!strcmp(o, "--port")) {
            if (!(v = cli_value(argc, argv, &i)) || !cli_parse_int(o, v, 1, 65535, &a->port))
                return 0;
        } else if (!strcmp(o, "--max-sessions")) {
            if (!(v = cli_value(argc, argv, &i)) || !cli_parse_int(o, v, 1, 1024, &a->max_sessions))
                return 0;
        } else if (!strcmp(o, "--max-queue")) {
            if (!(v = cli_value(argc, argv, &i)) || !cli_parse_int(o, v, 0, 1 << 20, &a->max_queue))
                return 0;
        } else if (!strcmp(o, "--kv-pages")) {
            if (!(v = cli_value(argc, argv, &i)) || !cli_parse_int(o, v, 1, 1 << 30, &a->kv_pages))
                return 0;
        } else if (!strcmp(o, "--client-timeout")) {
            if (!(v = cli_value(argc, argv, &i)) || !cli_parse_int(o, v, 0, 86400, &a->client_timeout))
                return 0;
        } else if (!strcmp(o, "--max-body-bytes")) {
            if (!(v = cli_value(argc, argv, &i)) || !cli_parse_int(o, v, 1024, 1 << 30, &a->max_body))
                return 0;
        } else {
            fprintf(stderr, "dflash serve: unknown option '%s' (see --help)\n", o);
            return 0;
        }
    }
    if (!a->e.model) {
        fprintf(stderr, "dflash serve: -m TARGET_DIR is required (see --help)\n");
        return 0;
    }
    return 1;
}

/* The last path component of dir, without trailing slashes. */
static const char *base_name(const char *dir, char *buf, size_t cap)
{
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/')
        n--;
    size_t s = n;
    while (s > 0 && dir[s - 1] != '/')
        s--;
    snprintf(buf, cap, "%.*s", (int)(n - s), dir + s);
    return buf;
}

/* Model, drafter, tokenizer and chat format; 0 on success. */
static int open_all(const serve_args *a, serve_ctx *c, char *name, size_t name_cap)
{
    const char *tdir = a->e.tokenizer ? a->e.tokenizer : a->e.model;
    if (cli_engine_open_lib(&a->e, a->max_sessions, a->e.max_ctx ? a->e.max_ctx : 4096, a->kv_pages, &c->engine) !=
            DFLASH_OK ||
        dflash_tokenizer_load(tdir, &c->tok) != DFLASH_OK) {
        fprintf(stderr, "dflash serve: %s\n", dflash_last_error());
        return 1;
    }
    c->max_ctx = dflash_engine_max_ctx(c->engine);
    c->block = dflash_engine_block_size(c->engine);
    dflash_engine_kv_usage(c->engine, &c->m.kv_pages, &c->m.kv_reserved, &c->m.kv_waiting);
    c->chat_ok = dflash_chat_format_detect(tdir, c->tok, &c->chat_format) == DFLASH_OK;
    if (!c->chat_ok)
        snprintf(c->chat_err, sizeof c->chat_err,
                 "/v1/chat/completions is not available (send prompts already rendered to /v1/completions): %s",
                 dflash_last_error());
    dflash_chat_opts co = dflash_chat_default_opts();
    co.format = c->chat_format;
    c->end_of_turn = -1;
    if (c->chat_ok && dflash_chat_check_tokenizer(c->tok, &co) == DFLASH_OK)
        c->end_of_turn = dflash_tokenizer_token_id(c->tok, dflash_chat_end_of_turn(c->chat_format));
    c->model_name = a->name ? a->name : base_name(a->e.model, name, name_cap);
    return 0;
}

int dflash_cmd_serve(int argc, char **argv)
{
    serve_args a;
    if (!parse(argc, argv, &a))
        return 2;
    serve_ctx c;
    memset(&c, 0, sizeof c);
    pthread_mutex_init(&c.mu, NULL);
    pthread_cond_init(&c.work, NULL);
    pthread_cond_init(&c.progress, NULL);
    c.api_key = a.api_key;
    c.max_sessions = a.max_sessions;
    c.max_queue = a.max_queue;
    c.max_body = (size_t)a.max_body;
    c.client_timeout = a.client_timeout;
    dflash_session_default_opts(&c.dflt);
    c.dflt.temperature = a.e.sampler.temperature;
    c.dflt.top_k = a.e.sampler.top_k;
    c.dflt.top_p = a.e.sampler.top_p;
    c.dflt.min_p = a.e.sampler.min_p;
    c.dflt.rep_penalty = a.e.sampler.rep_penalty;
    c.dflt.frequency_penalty = a.e.sampler.frequency_penalty;
    c.dflt.presence_penalty = a.e.sampler.presence_penalty;
    c.dflt.seed = a.e.sampler.seed;
    c.dflt.ignore_eos = a.e.ignore_eos;
    /* Signals go to the main thread's sigwait: block them before any
     * thread starts, so every thread inherits the mask. */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGINT);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN); /* a client that left is a failed write, not the end of the server */
    char name[256];
    int rc = 1;
    serve_http *h = NULL;
    if (open_all(&a, &c, name, sizeof name) != 0)
        goto out;
    if (serve_sched_start(&c) != DFLASH_OK) {
        fprintf(stderr, "dflash serve: %s\n", dflash_last_error());
        goto out;
    }
    if (serve_http_start(&c, a.host, a.port, &h) != DFLASH_OK) {
        fprintf(stderr, "dflash serve: %s\n", dflash_last_error());
        serve_sched_stop(&c);
        goto out;
    }
    fprintf(stderr, "dflash serve: %s on http://%s:%d (%d sessions, queue %d)%s\n", c.model_name, a.host, a.port,
            a.max_sessions, a.max_queue, c.chat_ok ? "" : "; chat disabled: no chat format");
    int sig = 0;
    sigwait(&sigs, &sig);
    fprintf(stderr, "dflash serve: %s: finishing running requests\n", sig == SIGTERM ? "SIGTERM" : "SIGINT");
    serve_http_quiesce(h);
    pthread_mutex_lock(&c.mu);
    c.shutting_down = 1; /* new requests on open connections get 503 */
    pthread_mutex_unlock(&c.mu);
    for (int waited = 0; waited < 300; waited++) {
        pthread_mutex_lock(&c.mu);
        const int busy = c.n_running + c.n_queued;
        pthread_mutex_unlock(&c.mu);
        if (!busy)
            break;
        usleep(100000);
    }
    serve_http_stop(h); /* closes what is still open; its jobs are cancelled */
    serve_sched_stop(&c);
    rc = 0;
out:
    dflash_tokenizer_free(c.tok);
    dflash_engine_close(c.engine);
    pthread_cond_destroy(&c.progress);
    pthread_cond_destroy(&c.work);
    pthread_mutex_destroy(&c.mu);
    return rc;
}
