/* cpu_backend.c: the CPU backend's memory side. Backend memory is host
 * memory, so upload/download are copies and weights point straight into the
 * checkpoint's mapping. */
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_internal.h"

dflash_status dflash_backend_cpu_create(dflash_backend **out)
{
    dflash_backend *be = calloc(1, sizeof *be);
    if (!be)
        return dflash_fail(DFLASH_ERR_OOM, "cpu backend: out of memory");
    be->ops = &dflash_cpu_ops_table;
    *out = be;
    return DFLASH_OK;
}

void cpu_destroy(dflash_backend *be) { free(be); }

dflash_status cpu_alloc(dflash_backend *be, size_t bytes, void **out)
{
    (void)be;
    /* 64-byte alignment: whole cache lines per buffer. */
    void *p = NULL;
    if (posix_memalign(&p, 64, bytes ? (bytes + 63) / 64 * 64 : 64) != 0)
        return dflash_fail(DFLASH_ERR_OOM, "cpu backend: cannot allocate %zu bytes", bytes);
    *out = p;
    return DFLASH_OK;
}

void cpu_free(dflash_backend *be, void *p)
{
    (void)be;
    free(p);
}

dflash_status cpu_copy(dflash_backend *be, void *dst, const void *src, size_t bytes)
{
    (void)be;
    if (bytes)
        memmove(dst, src, bytes);
    return DFLASH_OK;
}

dflash_status cpu_sync(dflash_backend *be)
{
    (void)be;
    return DFLASH_OK;
}

dflash_status cpu_weight_from_host(dflash_backend *be, dflash_weight *w, const void *host_data,
                                   const float *host_scales)
{
    (void)be;
    w->data = host_data;
    w->scales = host_scales;
    return DFLASH_OK;
}
