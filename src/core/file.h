/* file.h: reading a whole file, a whole stream or one line of a stream into
 * memory (config.json, tokenizer.json, a prompt on stdin, a chat message).
 * Every read has a stated byte limit, so no input grows a buffer without
 * bound; files are opened without blocking, so a FIFO or a device where a
 * file should be is refused by name instead of hanging. Buffers are malloc'd
 * and NUL-terminated; the length excludes the NUL. */
#ifndef DFLASH_CORE_FILE_H
#define DFLASH_CORE_FILE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "core/status.h"

/* The limit of dflash_read_stream (a prompt read from a stream). */
#define DFLASH_STREAM_MAX_BYTES ((size_t)64 << 20)

/* The one bounded reader. Reads `f` until EOF (delim < 0) or through the
 * next `delim` byte (consumed, not stored). More than max_bytes fails with
 * "LABEL: more than MAX bytes (the limit for WHAT)"; a read error names
 * `label` (a closed stream is called closed). *at_eof (may be NULL): the
 * stream ended before a delimiter; with *len == 0 there was nothing left. */
dflash_status dflash_read_bounded(FILE *f, const char *label, size_t max_bytes, const char *what, int delim,
                                  char **data, size_t *len, int *at_eof);
/* Everything until EOF, at most DFLASH_STREAM_MAX_BYTES; `label` names the
 * stream in messages. */
dflash_status dflash_read_stream(FILE *f, const char *label, char **data, size_t *len);
/* Open `path` for reading only if it is a regular file (never blocking on
 * a FIFO): *fd is then a plain blocking descriptor and *size its length.
 * Missing: DFLASH_ERR_NOT_FOUND; a FIFO, device, socket or directory:
 * DFLASH_ERR_IO naming what it is. */
dflash_status dflash_open_regular(const char *path, int *fd, uint64_t *size);
/* A regular file of at most max_bytes (missing file: DFLASH_ERR_NOT_FOUND;
 * a FIFO, device, socket or directory: DFLASH_ERR_IO naming what it is). */
dflash_status dflash_read_file(const char *path, size_t max_bytes, char **data, size_t *len);

#endif
