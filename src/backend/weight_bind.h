/* weight_bind.h: bind checkpoint tensors to dflash_weights, checking shape
 * and dtype once at load and naming the file and tensor on failure. A
 * binder remembers which of the set's tensors were bound, so that tensors
 * nothing used can be reported instead of silently ignored; without a
 * backend it only checks (what `dflash info` runs), so loading and
 * describing a checkpoint apply the very same checks. */
#ifndef DFLASH_BACKEND_WEIGHT_BIND_H
#define DFLASH_BACKEND_WEIGHT_BIND_H

#include "backend/backend.h"
#include "io/safetensors.h"

typedef struct dflash_binder {
    dflash_backend *be;  /* NULL: check only; weights then point at the host data */
    const dflash_st *st;
    unsigned char *used; /* [dflash_st_count(st)]: 1 once bound */
    int64_t n_params;    /* elements of every tensor bound so far */
} dflash_binder;

/* `be` may be NULL (check only). Free with dflash_binder_free. */
dflash_status dflash_binder_init(dflash_binder *b, dflash_backend *be, const dflash_st *st);
void dflash_binder_free(dflash_binder *b);

/* rows == 0 binds a vector of `cols` elements (shape [cols]); otherwise a
 * matrix [rows, cols]. Accepts BF16, F16 and F32 tensors. */
dflash_status dflash_bind(dflash_binder *b, const char *name, int64_t rows, int64_t cols, dflash_weight *out);

/* A stack of matrices in one tensor of shape [n, parts * rows, cols] (the
 * experts of a MoE layer as transformers 5 stores them, e.g. gate and up
 * joined: parts 2): out[i * parts + p] is rows [p * rows, (p + 1) * rows)
 * of matrix i, each a weight of its own over the tensor's data. */
dflash_status dflash_bind_stack(dflash_binder *b, const char *name, int64_t n, int parts, int64_t rows, int64_t cols,
                                dflash_weight *out);

/* A tensor of exactly shape[0 .. ndim) bound as a [rows, cols] matrix of
 * the same elements (a convolution's [C, 1, K] as [C, K]). */
dflash_status dflash_bind_as(dflash_binder *b, const char *name, int ndim, const int64_t *shape, int64_t rows,
                             int64_t cols, dflash_weight *out);

/* A vector of n elements bound as the F32 vector 1 + w (an RMSNorm whose
 * checkpoint stores its weight centred on zero): host [n] receives the
 * values and must outlive the weight (the CPU backend points at it). */
dflash_status dflash_bind_shifted(dflash_binder *b, const char *name, int64_t n, float *host, dflash_weight *out);

/* Tensors of the set not bound yet, in name order: up to `max` of them into
 * names[], the total count returned. */
size_t dflash_binder_unused(const dflash_binder *b, const char **names, size_t max);

#endif
