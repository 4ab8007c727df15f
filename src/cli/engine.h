/* engine.h: what `dflash generate` and `dflash chat` share: the model and
 * drafting options, their parsing and --help text, and opening everything
 * they name (backend, target, proposer and its state, tokenizer, stop ids). */
#ifndef DFLASH_CLI_ENGINE_H
#define DFLASH_CLI_ENGINE_H

#include <stdio.h>

#include "draft/proposer.h"
#include "io/tokenizer.h"
#include "spec/spec.h"

typedef struct cli_engine_args {
    const char *model, *draft, *tokenizer;
    const char *device; /* "cpu" (default), "cuda" or "auto" */
    int block_size, ctx_cap, quant, max_ctx, ignore_eos;
    dflash_sampler_opts sampler;
} cli_engine_args;

typedef struct cli_engine {
    dflash_backend *be;
    dflash_qwen3 *target;
    dflash_kv_seq seq;
    dflash_proposer *prop; /* NULL: plain decoding */
    void *pstate;
    dflash_tokenizer *tok; /* NULL unless text was asked for */
    int32_t stop_ids[16];
    int n_stop;
} cli_engine;

void cli_engine_args_init(cli_engine_args *a);
/* If argv[*i] is an engine option, consume it (and its value): returns 1;
 * 0 if it is not one; -1 after printing an error. */
int cli_engine_parse(int argc, char **argv, int *i, cli_engine_args *a, const char *cmd);
void cli_engine_usage(FILE *f);

/* Start an engine with only its tokenizer (--tokenizer, else the model
 * folder), so a text prompt can be measured before the models are sized. */
dflash_status cli_engine_load_tokenizer(cli_engine *e, const cli_engine_args *a);
/* Open the models the arguments name; max_ctx: longest sequence (used when
 * the user gave no --max-ctx). `e` is zeroed or holds only a tokenizer.
 * Stop ids: the model's EOS ids (config.json, plus tokenizer_config /
 * generation_config when a tokenizer is loaded) unless --ignore-eos. */
dflash_status cli_engine_open(cli_engine *e, const cli_engine_args *a, int max_ctx);
void cli_engine_close(cli_engine *e);
/* Generation options from the arguments (sampler, block size, stop ids). */
void cli_engine_gen_opts(const cli_engine *e, const cli_engine_args *a, dflash_gen_opts *go);

/* Streams decoded text to stdout as the loop commits tokens (an
 * on_tokens callback; never splits a UTF-8 sequence). */
typedef struct cli_streamer {
    dflash_detok_stream *ds;
    dflash_status status; /* the first failure, if any */
} cli_streamer;
void cli_streamer_on_tokens(void *user, const int32_t *ids, int n);

/* One line of statistics, for stderr. */
void cli_print_stats_line(FILE *f, const dflash_gen_stats *st);
/* The "stats" JSON object. */
void cli_print_stats_json(FILE *f, const dflash_gen_stats *st, uint64_t seed);

#endif
