/* file.h: reading a whole file or stream into memory (config.json,
 * tokenizer.json, a prompt on stdin). Buffers are malloc'd and
 * NUL-terminated; the length excludes the NUL. */
#ifndef DFLASH_CORE_FILE_H
#define DFLASH_CORE_FILE_H

#include <stddef.h>
#include <stdio.h>

#include "core/status.h"

/* Everything until EOF; `label` names the stream in messages. */
dflash_status dflash_read_stream(FILE *f, const char *label, char **data, size_t *len);
/* A regular file of at most max_bytes (missing file: DFLASH_ERR_NOT_FOUND). */
dflash_status dflash_read_file(const char *path, size_t max_bytes, char **data, size_t *len);

#endif
