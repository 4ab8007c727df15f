/* cpu_internal.h: what cpu_backend.c (memory) and cpu_ops.c (ops) share. */
#ifndef DFLASH_BACKEND_CPU_INTERNAL_H
#define DFLASH_BACKEND_CPU_INTERNAL_H

#include "backend/backend.h"

void cpu_destroy(dflash_backend *be);
dflash_status cpu_alloc(dflash_backend *be, size_t bytes, void **out);
void cpu_free(dflash_backend *be, void *p);
dflash_status cpu_copy(dflash_backend *be, void *dst, const void *src, size_t bytes);
dflash_status cpu_sync(dflash_backend *be);
dflash_status cpu_weight_from_host(dflash_backend *be, dflash_weight *w, const void *host_data,
                                   const float *host_scales);

extern const dflash_backend_ops dflash_cpu_ops_table;

#endif
