/* idbuf.h: a growable array of token ids (a conversation's history, a
 * session's held rows). */
#ifndef DFLASH_CORE_IDBUF_H
#define DFLASH_CORE_IDBUF_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

typedef struct dflash_idbuf {
    int32_t *ids;
    size_t n, cap;
} dflash_idbuf;

/* Append ids[0..n); DFLASH_ERR_OOM names `what`. */
dflash_status dflash_idbuf_push(dflash_idbuf *b, const int32_t *ids, size_t n, const char *what);
void dflash_idbuf_free(dflash_idbuf *b);

#endif
