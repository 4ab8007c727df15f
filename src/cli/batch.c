/* batch.c: `dflash generate --batch FILE` (see batch.h). Each non-empty
 * line is a JSON object: "prompt" (text, encoded as -p encodes it, or as
 * a chat message with --chat) or "prompt_ids", and optionally, named as
 * in the OpenAI API, "max_tokens", "temperature", "top_p", "top_k",
 * "min_p", "seed"; the command line gives the defaults. Every line is a
 * session of one library engine (include/dflash.h), all stepped together;
 * each output is what the same prompt and options give alone. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/args.h"
#include "cli/batch.h"
#include "core/file.h"
#include "dflash.h"
#include "io/chat.h"

/* One line of the file. */
typedef struct batch_line {
    int line_no;
    int32_t *ids;
    size_t n_ids;
    int text; /* the prompt was text */
    dflash_sampler_opts sampler; /* the command line's options, then the line's */
    int max_tokens;
    dflash_session *session;
} batch_line;

typedef struct batch_run {
    const cli_batch_args *a;
    const char *label; /* the file, for messages */
    cli_engine e;      /* the tokenizer (and the stop ids it adds) only */
    dflash_engine *engine;
    dflash_chat_opts co;
    batch_line *lines;
    int n;
} batch_run;

/* A number field in [lo, hi]; integer fields must be whole. */
static dflash_status num_field(const batch_run *r, const batch_line *l, json_t *v, const char *key, double lo,
                               double hi, int whole, double *out)
{
    if (!json_is_number(v))
        return dflash_fail(DFLASH_ERR_INVALID_ARG, "%s:%d: \"%s\" must be a number, not %s", r->label, l->line_no,
                           key, json_is_string(v) ? "a string" : "this");
    double d = json_number_value(v);
    if (!(d >= lo && d <= hi) || (whole && d != (double)(long long)d))
        return dflash_fail(DFLASH_ERR_INVALID_ARG, "%s:%d: \"%s\" is %g; expected %s in [%g, %g]", r->label,
                           l->line_no, key, d, whole ? "an integer" : "a number", lo, hi);
    *out = d;
    return DFLASH_OK;
}

/* max_tokens and the sampling fields; anything else is refused by name. */
static dflash_status option_field(const batch_run *r, batch_line *l, const char *key, json_t *v,
                                  dflash_sampler_opts *so)
{
    double d;
    if (!strcmp(key, "max_tokens")) {
        DFLASH_TRY(num_field(r, l, v, key, 0, 1 << 24, 1, &d));
        l->max_tokens = (int)d;
    } else if (!strcmp(key, "temperature")) {
        DFLASH_TRY(num_field(r, l, v, key, 0, 1e6, 0, &so->temperature));
    } else if (!strcmp(key, "top_p")) {
        DFLASH_TRY(num_field(r, l, v, key, 0, 1, 0, &so->top_p));
    } else if (!strcmp(key, "min_p")) {
        DFLASH_TRY(num_field(r, l, v, key, 0, 1, 0, &so->min_p));
    } else if (!strcmp(key, "top_k")) {
        DFLASH_TRY(num_field(r, l, v, key, 0, 1 << 30, 1, &d));
        so->top_k = (int)d;
    } else if (!strcmp(key, "seed")) {
        DFLASH_TRY(num_field(r, l, v, key, 0, 9007199254740992.0, 1, &d)); /* 2^53: exact in JSON numbers */
        so->seed = (uint64_t)d;
    } else {
        return dflash_fail(DFLASH_ERR_INVALID_ARG,
                           "%s:%d: unknown field \"%s\" (known: prompt, prompt_ids, max_tokens, temperature, "
                           "top_p, top_k, min_p, seed)",
                           r->label, l->line_no, key);
    }
    return DFLASH_OK;
}

static dflash_status prompt_ids(const batch_run *r, batch_line *l, json_t *arr)
{
    size_t n = json_array_size(arr);
    if (!json_is_array(arr) || n == 0)
        return dflash_fail(DFLASH_ERR_INVALID_ARG, "%s:%d: \"prompt_ids\" must be a non-empty array of token ids",
                           r->label, l->line_no);
    if (!(l->ids = malloc(n * sizeof *l->ids)))
        return dflash_fail(DFLASH_ERR_OOM, "%s:%d: out of memory for %zu ids", r->label, l->line_no, n);
    for (size_t i = 0; i < n; i++) {
        json_t *v = json_array_get(arr, i);
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > INT32_MAX)
            return dflash_fail(DFLASH_ERR_INVALID_ARG, "%s:%d: prompt_ids[%zu] is not a token id", r->label,
                               l->line_no, i);
        l->ids[i] = (int32_t)json_integer_value(v);
    }
    l->n_ids = n;
    return DFLASH_OK;
}

static dflash_status prompt_text(batch_run *r, batch_line *l, const char *text)
{
    const cli_batch_args *a = r->a;
    if (!r->e.tok)
        DFLASH_TRY(cli_engine_load_tokenizer(&r->e, a->e));
    l->text = 1;
    return cli_engine_encode_prompt(r->e.tok, text, strlen(text), a->system, a->chat ? &r->co : NULL, &l->ids,
                                    &l->n_ids);
}

/* One line's object into l (options start from the command line's). */
static dflash_status parse_line(batch_run *r, batch_line *l, const char *text, size_t len)
{
    json_error_t je;
    json_t *j = json_loadb(text, len, 0, &je);
    if (!json_is_object(j)) {
        json_decref(j);
        return dflash_fail(DFLASH_ERR_FORMAT, "%s:%d: %s", r->label, l->line_no,
                           j ? "not a JSON object" : je.text);
    }
    dflash_status s = DFLASH_OK;
    const char *key;
    json_t *v, *prompt = NULL, *ids = NULL;
    dflash_sampler_opts *so = &l->sampler;
    json_object_foreach(j, key, v)
    {
        if (!strcmp(key, "prompt"))
            prompt = v;
        else if (!strcmp(key, "prompt_ids"))
            ids = v;
        else
            s = option_field(r, l, key, v, so);
        if (s != DFLASH_OK)
            break;
    }
    if (s == DFLASH_OK && !prompt == !ids)
        s = dflash_fail(DFLASH_ERR_INVALID_ARG, "%s:%d: give exactly one of \"prompt\" and \"prompt_ids\"", r->label,
                        l->line_no);
    if (s == DFLASH_OK && prompt && !json_is_string(prompt))
        s = dflash_fail(DFLASH_ERR_INVALID_ARG, "%s:%d: \"prompt\" must be a string", r->label, l->line_no);
    if (s == DFLASH_OK)
        s = prompt ? prompt_text(r, l, json_string_value(prompt)) : prompt_ids(r, l, ids);
    if (s == DFLASH_OK && l->n_ids == 0)
        s = dflash_fail(DFLASH_ERR_INVALID_ARG, "%s:%d: the prompt encodes to no tokens", r->label, l->line_no);
    if (s == DFLASH_OK)
        s = dflash_sampler_check_opts(so);
    if (s != DFLASH_OK && s != DFLASH_ERR_OOM && !strstr(dflash_last_error(), r->label))
        s = dflash_fail_prefix(s, "%s:%d: ", r->label, l->line_no);
    json_decref(j);
    return s;
}

static dflash_status read_lines(batch_run *r)
{
    char *data;
    size_t len;
    if (!strcmp(r->a->path, "-"))
        DFLASH_TRY(dflash_read_stream(stdin, "standard input", &data, &len));
    else
        DFLASH_TRY(dflash_read_file(r->a->path, DFLASH_STREAM_MAX_BYTES, &data, &len));
    int cap = 0, line_no = 0;
    dflash_status s = DFLASH_OK;
    for (size_t i = 0; i < len && s == DFLASH_OK;) {
        size_t e = i;
        while (e < len && data[e] != '\n')
            e++;
        line_no++;
        size_t k = i;
        while (k < e && (data[k] == ' ' || data[k] == '\t' || data[k] == '\r'))
            k++;
        if (k < e) {
            if (r->n == cap) {
                cap = cap ? 2 * cap : 16;
                batch_line *p = realloc(r->lines, (size_t)cap * sizeof *p);
                if (!p) {
                    s = dflash_fail(DFLASH_ERR_OOM, "%s: out of memory for %d lines", r->label, cap);
                    break;
                }
                r->lines = p;
            }
            batch_line *l = &r->lines[r->n++];
            memset(l, 0, sizeof *l);
            l->line_no = line_no;
            l->sampler = r->a->e->sampler;
            l->max_tokens = r->a->n_new;
            s = parse_line(r, l, data + i, e - i);
        }
        i = e + 1;
    }
    free(data);
    if (s == DFLASH_OK && r->n == 0)
        s = dflash_fail(DFLASH_ERR_INVALID_ARG, "%s: no prompts (one JSON object per line)", r->label);
    return s;
}

/* One engine with a session per line, at most `longest` positions each;
 * every prompt id within its vocabulary. */
static dflash_status open_engine(batch_run *r, long long longest)
{
    DFLASH_TRY(cli_engine_open_lib(r->a->e, r->n, (int)longest, 0, &r->engine));
    const int V = dflash_engine_vocab_size(r->engine);
    for (int i = 0; i < r->n; i++)
        for (size_t k = 0; k < r->lines[i].n_ids; k++)
            if (r->lines[i].ids[k] >= V)
                return dflash_fail(DFLASH_ERR_INVALID_ARG, "%s:%d: prompt_ids[%zu] = %d is outside the model's "
                                   "vocabulary [0, %d)", r->label, r->lines[i].line_no, k, r->lines[i].ids[k], V);
    return DFLASH_OK;
}

/* One JSON line per input line, in order. */
static dflash_status print_lines(batch_run *r, long long *generated)
{
    for (int i = 0; i < r->n; i++) {
        batch_line *l = &r->lines[i];
        const int32_t *out;
        size_t n_out;
        dflash_session_output(l->session, &out, &n_out);
        *generated += (long long)n_out;
        printf("{\"line\":%d,\"prompt_ids\":", l->line_no);
        cli_print_ids(stdout, l->ids, (int)l->n_ids);
        printf(",\"output_ids\":");
        cli_print_ids(stdout, out, (int)n_out);
        if (l->text) {
            char *text;
            size_t len;
            DFLASH_TRY(dflash_tokenizer_decode(r->e.tok, out, n_out, DFLASH_DECODE_SKIP_SPECIAL, &text, &len));
            printf(",\"text\":");
            cli_print_json_string(stdout, text, len);
            free(text);
        }
        dflash_gen_stats st;
        cli_session_stats(l->session, &st);
        printf(",\"stats\":");
        cli_print_stats_json(stdout, &st, l->sampler.seed);
        printf("}\n");
    }
    return DFLASH_OK;
}

/* Open the engine for all lines, then run them together. */
static dflash_status run_lines(batch_run *r, double *secs)
{
    const cli_batch_args *a = r->a;
    cli_engine_plan plan;
    DFLASH_TRY(cli_engine_plan_load(a->e, 0, &plan));
    long long longest = 0, prompt = 0;
    for (int i = 0; i < r->n; i++) {
        batch_line *l = &r->lines[i];
        long long need = (long long)l->n_ids + l->max_tokens;
        if (need > plan.limit)
            return dflash_fail(DFLASH_ERR_INVALID_ARG, "%s:%d: the prompt (%zu tokens) + max_tokens %d exceed %s; %s",
                               r->label, l->line_no, l->n_ids, l->max_tokens, plan.limit_desc,
                               cli_engine_limit_hint(&plan));
        longest = need > longest ? need : longest;
        prompt += (long long)l->n_ids;
    }
    cli_engine_warn_long(a->e, &plan, longest);
    DFLASH_TRY(cli_engine_lib_stops(&r->e, a->e, a->chat ? &r->co : NULL));
    DFLASH_TRY(open_engine(r, longest));
    for (int i = 0; i < r->n; i++) {
        batch_line *l = &r->lines[i];
        dflash_session_opts so;
        cli_session_opts(&r->e, a->e, &l->sampler, l->max_tokens, &so);
        DFLASH_TRY(dflash_session_new(r->engine, &so, &l->session));
        DFLASH_TRY(dflash_session_start_ids(l->session, l->ids, l->n_ids));
    }
    double t0 = cli_now_s();
    for (int active = 1; active;)
        DFLASH_TRY(dflash_engine_step(r->engine, &active));
    *secs = cli_now_s() - t0;
    for (int i = 0; i < r->n; i++) {
        const char *msg;
        dflash_status s = dflash_session_error(r->lines[i].session, &msg);
        if (s != DFLASH_OK)
            return dflash_fail(s, "%s:%d: %s", r->label, r->lines[i].line_no, msg);
    }
    long long gen = 0;
    DFLASH_TRY(print_lines(r, &gen));
    fprintf(stderr, "[batch: %d sequences, %lld prompt + %lld generated tokens in %.3f s; %.1f generated "
            "tokens/s]\n", r->n, prompt, gen, *secs, *secs > 0 ? gen / *secs : 0.0);
    return DFLASH_OK;
}

dflash_status cli_generate_batch(const cli_batch_args *a)
{
    batch_run r = { .a = a, .label = strcmp(a->path, "-") ? a->path : "standard input" };
    dflash_status s = DFLASH_OK;
    if (a->chat) {
        s = cli_engine_load_tokenizer(&r.e, a->e);
        if (s == DFLASH_OK)
            s = cli_engine_chat_opts(a->e, r.e.tok, a->think, &r.co);
    }
    if (s == DFLASH_OK)
        s = read_lines(&r);
    double secs = 0;
    if (s == DFLASH_OK)
        s = run_lines(&r, &secs);
    for (int i = 0; i < r.n; i++) {
        dflash_session_free(r.lines[i].session);
        free(r.lines[i].ids);
    }
    dflash_engine_close(r.engine);
    free(r.lines);
    cli_engine_close(&r.e);
    return s;
}
