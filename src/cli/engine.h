/* engine.h: what `dflash generate`, `chat` and `serve` share: the model,
 * drafting and sampling options, their parsing and --help text, the limits
 * they imply, and opening what they name through the library engine
 * (include/dflash.h) with the tokenizer and stop ids the command line adds. */
#ifndef DFLASH_CLI_ENGINE_H
#define DFLASH_CLI_ENGINE_H

#include <stdio.h>

#include "dflash.h"
#include "io/chat.h"
#include "io/tokenizer.h"
#include "spec/spec.h"

typedef struct cli_engine_args {
    const char *model, *draft, *tokenizer;
    const char *device; /* "cpu" (default), "cuda" or "auto" */
    int block_size, ctx_cap, quant, max_ctx, ignore_eos;
    int block_fixed; /* --block-size B: every step drafts B-1 (default: auto, the cost-aware width) */
    int allow_long_ctx; /* --allow-long-context: go past the model's context length */
    dflash_sampler_opts sampler;
} cli_engine_args;

/* What sizes a run, known before any weights are loaded. */
typedef struct cli_engine_plan {
    int model_ctx; /* the target's max_position_embeddings */
    /* Positions a sequence may use (prompt + output, or a whole chat):
     * --max-ctx and, unless --allow-long-context, the model's context
     * length; INT_MAX when neither bounds it. */
    int limit;
    int limit_is_model;  /* the limit is the model's context length */
    char limit_desc[320]; /* "the model's context length 2048 (...)" or "--max-ctx 200" */
} cli_engine_plan;

/* What the command line keeps beside the library engine: the tokenizer
 * it encodes and decodes with (--tokenizer, else the model's) and the stop
 * ids it adds to the engine's own (cli_engine_lib_stops). */
typedef struct cli_engine {
    dflash_tokenizer *tok; /* NULL unless text was asked for */
    int32_t stop_ids[DFLASH_MAX_STOP_IDS];
    int n_stop;
} cli_engine;

void cli_engine_args_init(cli_engine_args *a);
/* If argv[*i] is an engine option, consume it (and its value): returns 1;
 * 0 if it is not one; -1 after printing an error. */
int cli_engine_parse(int argc, char **argv, int *i, cli_engine_args *a, const char *cmd);
/* cli_engine_parse, and -h / --help: print usage to stdout and exit 0. */
int cli_engine_parse_or_help(int argc, char **argv, int *i, cli_engine_args *a, const char *cmd,
                             void (*usage)(FILE *));
void cli_engine_usage(FILE *f);

/* Load the tokenizer (--tokenizer, else the model folder) into a zeroed e,
 * so a text prompt can be measured before the engine is sized. */
dflash_status cli_engine_load_tokenizer(cli_engine *e, const cli_engine_args *a);
/* Read the target's (and drafter's) config.json and check the block
 * options; dflt_max_ctx: the limit when --max-ctx is not given (0: none).
 * An explicit --max-ctx past the model's context length needs
 * --allow-long-context. */
dflash_status cli_engine_plan_load(const cli_engine_args *a, int dflt_max_ctx, cli_engine_plan *p);
/* The advice that goes with exceeding the plan's limit. */
const char *cli_engine_limit_hint(const cli_engine_plan *p);
/* With --allow-long-context, `positions` past the model's context length
 * print a warning on stderr (once per call). */
void cli_engine_warn_long(const cli_engine_args *a, const cli_engine_plan *p, long long positions);
/* Frees the tokenizer. */
void cli_engine_close(cli_engine *e);
/* The chat options of a run: the format of the model (its tokenizer
 * folder: --tokenizer, else the model's; chat.h) and --think. */
dflash_status cli_engine_chat_opts(const cli_engine_args *a, const dflash_tokenizer *tok, int think,
                                   dflash_chat_opts *co);
/* A -p style prompt as ids: with co, a user message (after `system` when
 * given) rendered in co's chat format; without, as HF's tokenizer(text)
 * encodes it, with the post-processor's special tokens (Llama 3's
 * <|begin_of_text|>; none for Qwen3). *ids is malloc'd. */
dflash_status cli_engine_encode_prompt(dflash_tokenizer *tok, const char *text, size_t len, const char *system,
                                       const dflash_chat_opts *co, int32_t **ids, size_t *n);
/* For a chat prompt (cli_engine_lib_stops calls it): warn (stderr) when
 * the tokenizer lacks the format's markup as added tokens, else add its
 * end-of-turn marker (<|im_end|>, <|eot_id|>) to the stop ids (unless
 * --ignore-eos). */
void cli_engine_chat_prepare(cli_engine *e, const cli_engine_args *a, const dflash_chat_opts *co);

/* ---- through the library engine (include/dflash.h) ----
 * The engine adds the model's end-of-sequence ids itself (unless
 * --ignore-eos); e->stop_ids then holds what the command line adds: the
 * ids the tokenizer in use (--tokenizer, else the model's) names, and for
 * a chat format (co) its end of turn (with the tokenizer warning of
 * cli_engine_chat_prepare). e holds only a tokenizer (or nothing). */
dflash_status cli_engine_lib_stops(cli_engine *e, const cli_engine_args *a, const dflash_chat_opts *co);
/* The engine the arguments name, for max_sessions sessions of at most
 * max_ctx positions each (prompt + output; --allow-long-context lets that
 * pass the model's context length); kv_pages: the shared pool (0: room for
 * every session at max_ctx). The cost-aware width unless --block-size. */
dflash_status cli_engine_open_lib(const cli_engine_args *a, int max_sessions, int max_ctx, int kv_pages,
                                  dflash_engine **out);
/* A session's options: the sampler, max_tokens, --ignore-eos and e's stop
 * ids (the session copies them). */
void cli_session_opts(const cli_engine *e, const cli_engine_args *a, const dflash_sampler_opts *sampler,
                      int max_tokens, dflash_session_opts *so);
/* A session's statistics of its last start, in the form the stats line
 * and the stats JSON print. */
void cli_session_stats(const dflash_session *s, dflash_gen_stats *st);
/* Start s after ids and step the engine until no session is active; a
 * session that failed to join or run is this call's failure. */
dflash_status cli_session_run(dflash_engine *engine, dflash_session *s, const int32_t *ids, size_t n);

/* Streams decoded text to stdout as the loop commits tokens (an
 * on_tokens callback; never splits a UTF-8 sequence). A write error
 * (checked after each flush) is its failure, returned to end generation;
 * nothing is written after it. */
typedef struct cli_streamer {
    dflash_detok_stream *ds;
    dflash_status status; /* the first failure, if any */
} cli_streamer;
dflash_status cli_streamer_on_tokens(void *user, const int32_t *ids, int n);

/* One line of statistics, for stderr. */
void cli_print_stats_line(FILE *f, const dflash_gen_stats *st);
/* The "stats" JSON object. */
void cli_print_stats_json(FILE *f, const dflash_gen_stats *st, uint64_t seed);

#endif
