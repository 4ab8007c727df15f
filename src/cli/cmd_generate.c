/* cmd_generate.c: `dflash generate`: one prompt (token ids, text, or a chat
 * message) through a session of the library engine (include/dflash.h),
 * speculative or plain; streams text or prints ids, or one JSON object
 * with statistics. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/args.h"
#include "cli/batch.h"
#include "cli/commands.h"
#include "cli/engine.h"
#include "core/file.h"
#include "io/chat.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: dflash generate -m TARGET_DIR [-d DRAFT_DIR | --draft ngram]\n"
            "                       (-p TEXT | --prompt-ids IDS) [options]\n"
            "\n"
            "Generate text (on the CPU unless --device says otherwise). With a drafter,\n"
            "speculative decoding whose output is exactly what the target alone produces\n"
            "(greedy), or follows the target's own distribution (sampling); without one,\n"
            "plain autoregressive decoding.\n"
            "\n"
            "prompt and output:\n"
            "  -p, --prompt TEXT      prompt text (tokenized with the model's tokenizer.json, with\n"
            "                         the special tokens its post-processor adds, such as Llama 3's\n"
            "                         <|begin_of_text|>);\n"
            "                         '-' reads it from stdin (at most %zu MiB). The output text is\n"
            "                         streamed.\n"
            "  --chat                 wrap TEXT as a user message in the model's chat format (Qwen3\n"
            "                         or Llama 3, from its chat_template or tokenizer)\n"
            "  --system TEXT          system message (with --chat)\n"
            "  --think                leave Qwen3 thinking on (default: the empty think block)\n"
            "  --prompt-ids IDS       prompt token ids, comma-separated; output is ids\n"
            "  --batch FILE           many prompts generated together, stepped as one batch: one\n"
            "                         JSON object per line ('-': stdin) with \"prompt\" (text, as -p)\n"
            "                         or \"prompt_ids\", and optionally \"max_tokens\", \"temperature\",\n"
            "                         \"top_p\", \"top_k\", \"min_p\", \"seed\" (the options below are\n"
            "                         the defaults). Prints one JSON line per input line, in order\n"
            "                         ({\"line\",\"prompt_ids\",\"output_ids\",\"text\"?,\"stats\"}), and\n"
            "                         the total generated tokens/s on stderr. Each output is what\n"
            "                         its prompt gives alone. Drafting: one cost-aware width per\n"
            "                         step for the whole batch, or with --block-size B, B - 1\n"
            "                         drafts every step\n"
            "  -n, --n-new N          tokens to generate at most (default 64); prompt + N must fit\n"
            "                         the model's context length (see --allow-long-context)\n"
            "  --json                 print one JSON object {\"prompt_ids\",\"output_ids\",[\"text\",]\"stats\"}\n"
            "  --trace FILE           write one JSON line per step: {\"pos\",\"drafts\",\"accepted\",\"next\"}\n"
            "  -h, --help             this text\n"
            "\n",
            DFLASH_STREAM_MAX_BYTES >> 20);
    cli_engine_usage(f);
    fprintf(f,
            "\n"
            "Generation stops after n tokens or at an end-of-sequence token (which is\n"
            "included in the ids, not in the text). Statistics go to stderr: tau is the mean\n"
            "number of tokens committed per target forward (1 without a drafter).\n");
}

typedef struct gen_args {
    cli_engine_args e;
    const char *text, *system, *trace, *batch;
    int32_t *prompt;
    int n_prompt, n_new, json, chat, think;
    dflash_chat_opts chat_opts; /* with --chat: the model's format */
} gen_args;

static int parse(int argc, char **argv, gen_args *a)
{
    memset(a, 0, sizeof *a);
    cli_engine_args_init(&a->e);
    a->n_new = 64;
    for (int i = 1; i < argc; i++) {
        const char *o = argv[i], *v;
        int r = cli_engine_parse_or_help(argc, argv, &i, &a->e, "generate", usage);
        if (r < 0)
            return 0;
        if (r > 0)
            continue;
        if (!strcmp(o, "-p") || !strcmp(o, "--prompt")) {
            if (!(a->text = cli_value(argc, argv, &i)))
                return 0;
        } else if (!strcmp(o, "--system")) {
            if (!(a->system = cli_value(argc, argv, &i)))
                return 0;
        } else if (!strcmp(o, "--chat")) {
            a->chat = 1;
        } else if (!strcmp(o, "--think")) {
            a->think = 1;
        } else if (!strcmp(o, "--prompt-ids")) {
            if (!(v = cli_value(argc, argv, &i)) || !cli_parse_ids(o, v, &a->prompt, &a->n_prompt))
                return 0;
        } else if (!strcmp(o, "-n") || !strcmp(o, "--n-new")) {
            if (!(v = cli_value(argc, argv, &i)) || !cli_parse_int(o, v, 0, 1 << 24, &a->n_new))
                return 0;
        } else if (!strcmp(o, "--batch")) {
            if (!(a->batch = cli_value(argc, argv, &i)))
                return 0;
        } else if (!strcmp(o, "--json")) {
            a->json = 1;
        } else if (!strcmp(o, "--trace")) {
            if (!(a->trace = cli_value(argc, argv, &i)))
                return 0;
        } else {
            fprintf(stderr, "dflash generate: unknown option '%s' (see --help)\n", o);
            return 0;
        }
    }
    if (a->batch) {
        if (!a->e.model || a->prompt || a->text || a->trace) {
            fprintf(stderr, "dflash generate: --batch needs -m and takes its prompts from the file (no -p, "
                            "--prompt-ids or --trace)\n");
            return 0;
        }
        return 1;
    }
    if (!a->e.model || (!a->prompt == !a->text)) {
        fprintf(stderr, "dflash generate: -m and exactly one of -p/--prompt-ids are required (see --help)\n");
        return 0;
    }
    if ((a->chat || a->system || a->think) && !a->text) {
        fprintf(stderr, "dflash generate: --chat, --system and --think need a text prompt (-p)\n");
        return 0;
    }
    return 1;
}

/* Text prompt -> ids (plain, or rendered as a chat). */
static dflash_status encode_prompt(gen_args *a, dflash_tokenizer *tok)
{
    size_t len = 0, n = 0;
    char *owned = NULL;
    const char *text = a->text;
    if (!strcmp(text, "-")) {
        DFLASH_TRY(dflash_read_bounded(stdin, "standard input", DFLASH_STREAM_MAX_BYTES, "a prompt", -1, &owned,
                                       &len, NULL));
        text = owned;
    } else {
        len = strlen(text);
    }
    dflash_status s = a->chat ? cli_engine_chat_opts(&a->e, tok, a->think, &a->chat_opts) : DFLASH_OK;
    if (s == DFLASH_OK)
        s = cli_engine_encode_prompt(tok, text, len, a->system, a->chat ? &a->chat_opts : NULL, &a->prompt, &n);
    free(owned);
    a->n_prompt = (int)n;
    if (s == DFLASH_OK && n == 0)
        s = dflash_fail(DFLASH_ERR_INVALID_ARG, "the prompt encodes to no tokens");
    return s;
}

/* Prompt + -n against the plan's limit (the model's context length unless
 * --allow-long-context, and --max-ctx), before anything is sized. */
static dflash_status check_fit(const gen_args *a, const cli_engine_plan *p)
{
    long long need = (long long)a->n_prompt + a->n_new;
    if (need > p->limit)
        return dflash_fail(DFLASH_ERR_INVALID_ARG, "the prompt (%d tokens) + -n %d = %lld positions exceed %s; "
                           "shorten the prompt, lower -n, or %s", a->n_prompt, a->n_new, need, p->limit_desc,
                           cli_engine_limit_hint(p));
    cli_engine_warn_long(&a->e, p, need);
    return DFLASH_OK;
}

/* --trace: one JSON line per step. */
static void trace_step(void *user, int32_t pos, const int32_t *drafts, int k, int accepted, int32_t next)
{
    FILE *f = user;
    fprintf(f, "{\"pos\":%d,\"drafts\":[", pos);
    for (int i = 0; i < k; i++)
        fprintf(f, "%s%d", i ? "," : "", drafts[i]);
    fprintf(f, "],\"accepted\":%d,\"next\":%d}\n", accepted, next);
}

/* The prompt through one session of the library engine: text streamed to
 * stdout (a text prompt without --json), steps to --trace. */
static dflash_status run(gen_args *a, cli_engine *e, dflash_engine *engine, dflash_session **session)
{
    FILE *trace = NULL;
    cli_streamer sm = { NULL, DFLASH_OK };
    dflash_session_opts so;
    cli_session_opts(e, &a->e, &a->e.sampler, a->n_new, &so);
    if (a->trace && !(trace = fopen(a->trace, "w")))
        return dflash_fail(DFLASH_ERR_IO, "--trace %s: cannot open: %s", a->trace, strerror(errno));
    if (trace) {
        so.on_step = trace_step;
        so.step_user = trace;
    }
    dflash_status s = DFLASH_OK;
    if (a->text && !a->json) {
        s = dflash_detok_stream_new(e->tok, DFLASH_DECODE_SKIP_SPECIAL, &sm.ds);
        so.on_tokens = cli_streamer_on_tokens;
        so.user = &sm;
    }
    if (s == DFLASH_OK)
        s = dflash_session_new(engine, &so, session);
    if (s == DFLASH_OK)
        s = cli_session_run(engine, *session, a->prompt, (size_t)a->n_prompt);
    if (s == DFLASH_OK && sm.ds) {
        const char *piece;
        size_t len;
        s = sm.status != DFLASH_OK ? sm.status : dflash_detok_stream_finish(sm.ds, &piece, &len);
        if (s == DFLASH_OK) {
            fwrite(piece, 1, len, stdout);
            fputc('\n', stdout);
        }
    }
    dflash_detok_stream_free(sm.ds);
    if (trace) {
        char label[4096];
        snprintf(label, sizeof label, "--trace %s", a->trace);
        dflash_status ts = cli_close_output(trace, label);
        if (s == DFLASH_OK)
            s = ts;
    }
    return s;
}

static dflash_status print_json(const gen_args *a, const cli_engine *e, const int32_t *out, int n_out,
                                const dflash_gen_stats *st)
{
    printf("{\"prompt_ids\":");
    cli_print_ids(stdout, a->prompt, a->n_prompt);
    printf(",\"output_ids\":");
    cli_print_ids(stdout, out, n_out);
    if (a->text) {
        char *text;
        size_t len;
        DFLASH_TRY(dflash_tokenizer_decode(e->tok, out, (size_t)n_out, DFLASH_DECODE_SKIP_SPECIAL, &text, &len));
        printf(",\"text\":");
        cli_print_json_string(stdout, text, len);
        free(text);
    }
    printf(",\"stats\":");
    cli_print_stats_json(stdout, st, a->e.sampler.seed);
    printf("}\n");
    return DFLASH_OK;
}

int dflash_cmd_generate(int argc, char **argv)
{
    gen_args a;
    if (!parse(argc, argv, &a)) {
        free(a.prompt);
        return 2;
    }
    if (a.batch) {
        cli_batch_args ba = { &a.e, a.batch, a.n_new, a.chat, a.think, a.system };
        dflash_status bs = cli_generate_batch(&ba);
        if (bs == DFLASH_OK)
            bs = cli_close_output(stdout, "standard output");
        if (bs != DFLASH_OK)
            fprintf(stderr, "dflash generate: %s\n", dflash_last_error());
        return bs == DFLASH_OK ? 0 : 1;
    }
    cli_engine e;
    memset(&e, 0, sizeof e);
    cli_engine_plan plan;
    dflash_engine *engine = NULL;
    dflash_session *session = NULL;
    dflash_status s = cli_engine_plan_load(&a.e, 0, &plan);
    if (s == DFLASH_OK && a.text)
        s = cli_engine_load_tokenizer(&e, &a.e);
    if (s == DFLASH_OK && a.text)
        s = encode_prompt(&a, e.tok);
    if (s == DFLASH_OK)
        s = check_fit(&a, &plan);
    if (s == DFLASH_OK)
        s = cli_engine_lib_stops(&e, &a.e, a.chat ? &a.chat_opts : NULL);
    /* one session of the prompt and its output */
    if (s == DFLASH_OK)
        s = cli_engine_open_lib(&a.e, 1, a.n_prompt + a.n_new, 0, &engine);
    for (int i = 0; s == DFLASH_OK && i < a.n_prompt; i++)
        if (a.prompt[i] >= dflash_engine_vocab_size(engine))
            s = dflash_fail(DFLASH_ERR_INVALID_ARG, "%s: token %d (position %d) is outside the model's vocabulary "
                            "[0, %d)", a.text ? "the prompt" : "--prompt-ids", a.prompt[i], i,
                            dflash_engine_vocab_size(engine));
    if (s == DFLASH_OK)
        s = run(&a, &e, engine, &session);
    const int32_t *out = NULL;
    size_t n_out = 0;
    dflash_gen_stats st;
    if (s == DFLASH_OK) {
        dflash_session_output(session, &out, &n_out);
        cli_session_stats(session, &st);
    }
    if (s == DFLASH_OK && a.json) {
        s = print_json(&a, &e, out, (int)n_out, &st);
    } else if (s == DFLASH_OK) {
        if (!a.text) {
            for (size_t i = 0; i < n_out; i++)
                printf("%s%d", i ? " " : "", out[i]);
            printf("\n");
        }
        cli_print_stats_line(stderr, &st);
    }
    if (s == DFLASH_OK)
        s = cli_close_output(stdout, "standard output");
    if (s != DFLASH_OK)
        fprintf(stderr, "dflash generate: %s\n", dflash_last_error());
    dflash_session_free(session);
    dflash_engine_close(engine);
    cli_engine_close(&e);
    free(a.prompt);
    return s == DFLASH_OK ? 0 : 1;
}
