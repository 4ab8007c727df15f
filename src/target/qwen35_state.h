/* qwen35_state.h: the recurrent state of a Qwen3.5 hybrid target's
 * sequences (its linear-attention layers' convolution inputs and delta
 * rule records) and how it follows a sequence's length across forwards,
 * taking back rejected rows the way a KV cache does by truncation.
 *
 * Each sequence holds a record per linear-attention layer, laid out by
 * absolute position (backend.h, dflash_rec_args): its last
 * DFLASH_REC_ROWS convolution inputs, the delta rule's state at the start
 * of its last DFLASH_REC_CHUNK_STATES chunks of DFLASH_REC_CHUNK rows and
 * each recent row's k, update and decay. A row's result depends only on
 * the record and the row, so the next forward may start at any position
 * from which the record can still be read: after a forward of rows
 * p0 .. p0 + n - 1, at max(p0, p0 + n - DFLASH_REC_BACK) .. p0 + n (the
 * caller truncates after rejecting rows), or at 0. Nothing is replayed
 * or copied to take rows back; a start anywhere else is refused.
 *
 * Memory per record and linear layer, all f32: DFLASH_REC_ROWS x (C +
 * Hv x (k_dim + v_dim + 1)) + DFLASH_REC_CHUNK_STATES x Hv x k_dim x v_dim. */
#ifndef DFLASH_TARGET_QWEN35_STATE_H
#define DFLASH_TARGET_QWEN35_STATE_H

#include "backend/backend.h"
#include "io/hf_config.h"
#include "target/qwen3_layer.h"

typedef struct qwen35_rec {
    int used;
    int broken;      /* a forward failed after it started writing records: only position 0 may follow */
    int32_t lo, hi;  /* besides 0, the positions the next forward may start at */
} qwen35_rec;

typedef struct qwen35_state {
    int n_lin, n_recs;
    int lin_of[DFLASH_MAX_LAYERS];  /* layer -> its index among the linear-attention layers, or -1 */
    int64_t conv_size, delta_size;  /* floats of one record of one layer */
    int64_t state_floats, row_floats; /* of a layer: one chunk-start state; what a row writes (input, k, d, G) */
    float *conv, *delta;            /* backend: linear layer l's record r at (l * n_recs + r) * size */
    int32_t *info;                  /* backend [n_batch * DFLASH_REC_INFO_LEN]: the forward's entries,
                                       in the owner's forward inputs (set by it before each forward) */
    qwen35_rec *recs;               /* host [n_recs] */
    /* the forward in progress (host): per sequence of the batch */
    int n_batch, max_seq_rows;
    int *b_rec;
    int32_t *b_info;                /* [n_batch * DFLASH_REC_INFO_LEN]: their host mirror, likewise */
} qwen35_state;

/* n_recs: sequences that may hold state at once. */
dflash_status qwen35_state_init(qwen35_state *s, dflash_backend *be, const dflash_model_config *c, int n_recs);
void qwen35_state_free(qwen35_state *s, dflash_backend *be);

/* A free record (*id >= 0), or DFLASH_ERR_KV_FULL naming the limit. */
dflash_status qwen35_state_acquire(qwen35_state *s, int *id);
void qwen35_state_release(qwen35_state *s, int id);

/* Before a forward: checks that each sequence's record can resume at the
 * position of its first row and writes the forward's entries into b_info
 * (the owner uploads them with the rest of its forward inputs).
 * recs[q], p0[q], row0[q], rows[q] per sequence q of the batch. */
dflash_status qwen35_state_begin(qwen35_state *s, int n_seqs, const int *recs, const int32_t *p0,
                                 const int32_t *row0, const int32_t *rows);
/* Linear-attention layer `li` of the forward: the mixer's output for the
 * rows of b->xn before its out projection in b->gdn.o
 * (qwen3_gdn_gate_norm), the records written. */
dflash_status qwen35_state_layer(qwen35_state *s, dflash_backend *be, const dflash_model_config *c,
                                 const qwen3_layer *l, int li, const qwen3_bufs *b, int n);
/* After a forward that succeeded. */
void qwen35_state_end(qwen35_state *s);

#endif
