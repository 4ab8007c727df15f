/* batch.h: `dflash generate --batch FILE`: every prompt of a JSON-lines
 * file generated together (a session of one library engine each), one
 * JSON line out per line in, in input order. */
#ifndef DFLASH_CLI_BATCH_H
#define DFLASH_CLI_BATCH_H

#include "cli/engine.h"

typedef struct cli_batch_args {
    const cli_engine_args *e;
    const char *path;   /* the JSON-lines file, '-' for standard input */
    int n_new;          /* -n: a line's max_tokens when it gives none */
    int chat, think;    /* --chat: each text prompt is a user message */
    const char *system; /* --system, with --chat */
} cli_batch_args;

/* Read, run and print; messages name the file, the line and the field. */
dflash_status cli_generate_batch(const cli_batch_args *a);

#endif
