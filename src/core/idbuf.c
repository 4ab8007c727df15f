/* idbuf.c: see idbuf.h. */
#include "core/idbuf.h"

#include <stdlib.h>
#include <string.h>

dflash_status dflash_idbuf_push(dflash_idbuf *b, const int32_t *ids, size_t n, const char *what)
{
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n)
            cap *= 2;
        int32_t *p = realloc(b->ids, cap * sizeof *p);
        if (!p)
            return dflash_fail(DFLASH_ERR_OOM, "%s: out of memory for %zu ids", what, b->n + n);
        b->ids = p;
        b->cap = cap;
    }
    if (n)
        memcpy(b->ids + b->n, ids, n * sizeof *ids);
    b->n += n;
    return DFLASH_OK;
}

void dflash_idbuf_free(dflash_idbuf *b)
{
    free(b->ids);
    memset(b, 0, sizeof *b);
}
