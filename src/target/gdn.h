/* gdn.h: the Gated DeltaNet linear attention of a Qwen3.5 hybrid's
 * linear-attention layers: its weights and scratch, and its forward in
 * three parts (the middle one reads and writes the sequence's records):
 *
 *   project: qkv = in_proj_qkv(xn), z = in_proj_z(xn), b = in_proj_b(xn),
 *            a = in_proj_a(xn)
 *   recur:   y = silu(causal depthwise conv1d of qkv over the inputs by
 *            position); o = the gated delta rule over y, a and b in its
 *            chunked form (backend.h, dflash_delta_args)
 *   output:  o = rmsnorm(o per value head) * norm * silu(z);
 *            out = out_proj(o)
 *
 * recur depends only on the sequence's records and its rows, never on how
 * rows are split into calls (what speculative decoding relies on). */
#ifndef DFLASH_TARGET_GDN_H
#define DFLASH_TARGET_GDN_H

#include "backend/backend.h"
#include "io/hf_config.h"

typedef struct qwen3_gdn {
    dflash_weight in_qkv;        /* [C, H], C = 2 * key heads * key dim + value heads * value dim */
    dflash_weight in_z;          /* [Vd, H], Vd = value heads * value dim */
    dflash_weight in_b, in_a;    /* [Hv, H] */
    dflash_weight conv;          /* [C, kernel] (the checkpoint's [C, 1, kernel]) */
    dflash_weight dt_bias, A_log; /* [Hv] */
    dflash_weight norm;          /* [value dim]: the gated RMSNorm's weight, applied as stored */
    dflash_weight out;           /* [H, Vd] */
} qwen3_gdn;

/* Scratch for R rows. */
typedef struct qwen3_gdn_bufs {
    float *qkv, *y; /* [R, C] */
    float *z, *o;   /* [R, Vd] */
    float *a, *b;   /* [R, Hv] */
} qwen3_gdn_bufs;

/* Channels of the convolution (C) of the config's linear attention. */
int64_t qwen3_gdn_channels(const dflash_model_config *c);

dflash_status qwen3_gdn_bufs_alloc(dflash_backend *be, const dflash_model_config *c, int rows, qwen3_gdn_bufs *b);
void qwen3_gdn_bufs_free(dflash_backend *be, qwen3_gdn_bufs *b);

/* b->qkv, b->z, b->a, b->b of rows xn [n, H]. */
dflash_status qwen3_gdn_project(dflash_backend *be, const qwen3_gdn *w, const qwen3_gdn_bufs *b, const float *xn,
                                int n);
/* y [n, C] and o [n, Vd] of rows (qkv, a, b), the records in conv's and
 * delta's pools (one info for both: the same record index in each). */
dflash_status qwen3_gdn_recur(dflash_backend *be, const dflash_model_config *c, const qwen3_gdn *w,
                              const dflash_rec_args *conv, const dflash_rec_args *delta, const float *qkv,
                              const float *a, const float *b, int n, float *y, float *o);
/* b->o := the gated norm of b->o with b->z, the input of the out
 * projection (w->out, which the caller runs with the residual add and the
 * next norm: linear_add_rmsnorm); pos: any [n] ints in backend memory
 * (the per-head norm takes no rotation). */
dflash_status qwen3_gdn_gate_norm(dflash_backend *be, const dflash_model_config *c, const qwen3_gdn *w,
                                  const qwen3_gdn_bufs *b, const int32_t *pos, int n);

#endif
