/* cpu_internal.h: what cpu_backend.c (memory), cpu_ops.c (ops),
 * cpu_recurrent.c (the recurrent-state ops), cpu_gemm.c (the linear's
 * SIMD kernels) and cpu_pool.c (its threads) share. */
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

/* Row r of w widened to f32 (exact) into dst [w->cols]. */
void dflash_cpu_weight_row(const dflash_weight *w, int64_t r, float *dst);

/* Instruction sets the linear has kernels for, in increasing order. All
 * give bit-identical results (cpu_gemm.c defines the summation order). */
typedef enum dflash_cpu_isa {
    DFLASH_CPU_ISA_PORTABLE = 0,
    DFLASH_CPU_ISA_AVX2 = 1,   /* AVX2 + FMA */
    DFLASH_CPU_ISA_AVX512 = 2, /* AVX-512F */
} dflash_cpu_isa;

const char *dflash_cpu_isa_name(dflash_cpu_isa isa);
/* The best set this machine runs. */
dflash_cpu_isa dflash_cpu_isa_best(void);
/* The set the backend uses: the best, or less if DFLASH_CPU_ISA
 * (portable, avx2, avx512) asks for less. */
dflash_cpu_isa dflash_cpu_isa_active(void);
/* out[n, w->rows] = x[n, w->cols] . w^T with the given kernel set (capped
 * at the machine's best); w's dtype must be checked by the caller. */
dflash_status dflash_cpu_gemm(dflash_cpu_isa isa, const float *x, int n, const dflash_weight *w, float *out);

/* The pool (cpu_pool.c): threads in all, the caller included; run
 * fn(ctx, 0..n_chunks-1), each chunk once, on the caller and the workers,
 * returning when all are done. */
int dflash_cpu_pool_threads(void);
void dflash_cpu_pool_run(void (*fn)(void *ctx, int chunk), void *ctx, int n_chunks);
/* The calling thread's scratch of at least `count` floats (NULL when out
 * of memory), valid until its next call on this thread. */
float *dflash_cpu_scratch(size_t count);

/* The recurrent-state primitives (cpu_recurrent.c); see backend.h. */
dflash_status dflash_cpu_conv_silu(dflash_backend *be, const dflash_rec_args *r, const float *x,
                                   const dflash_weight *w, int n, int channels, int kernel, float *out);
dflash_status dflash_cpu_delta_rule(dflash_backend *be, const dflash_rec_args *r, const dflash_delta_args *a);

extern const dflash_backend_ops dflash_cpu_ops_table;

#endif
