/* qwen35_state.h: the recurrent state of a Qwen3.5 hybrid target's
 * sequences (its linear-attention layers' convolution windows and delta
 * rule states) and how it follows a sequence's length across forwards,
 * taking back rejected rows the way a KV cache does by truncation.
 *
 * Each sequence holds a record: two state slots per linear-attention layer
 * (`cur`, the state at the record's `len`, and the other) and the last
 * forward's inputs to the recurrence (the rows' qkv projections, a and b)
 * for up to `keep` rows. A forward of rows at positions p0 .. p0 + n - 1
 * reads cur and writes the state after its last row into the other slot;
 * when n exceeds `keep` it also writes the state after its first n - keep
 * rows into cur (those rows can no longer be taken back) and keeps the
 * last `keep` rows' inputs. The next forward of the sequence starts where
 * the caller's length says (the caller truncates after rejecting rows):
 *   - at the end of the last forward: the other slot becomes cur (the
 *     plain decoding and prefill case, no extra work);
 *   - inside its kept rows: cur is advanced over the kept rows up to that
 *     position by the very primitives the forward ran (same bits), an
 *     extra pass over at most `keep` rows per linear-attention layer;
 *   - at cur's position: nothing to do;
 *   - at position 0: the state starts from zeros.
 * Anything else (taking back more than the kept rows) is refused.
 *
 * Memory per record: 2 x (conv window + delta state) per linear layer,
 * plus keep x (qkv + a + b) per linear layer, all f32. */
#ifndef DFLASH_TARGET_QWEN35_STATE_H
#define DFLASH_TARGET_QWEN35_STATE_H

#include "backend/backend.h"
#include "io/hf_config.h"
#include "target/qwen3_layer.h"

typedef struct qwen35_rec {
    int used;
    int cur;         /* 0 or 1: the slot holding the state at len */
    int zero;        /* cur holds nothing yet: the state at len is all zeros (len 0) */
    int broken;      /* a forward failed after it started writing states: only position 0 may follow */
    int32_t len;     /* the position cur's state is at */
    int32_t n_kept;  /* rows len .. len + n_kept - 1 have their inputs kept; the other slot is past them all */
} qwen35_rec;

typedef struct qwen35_state {
    int n_lin, n_recs, keep;
    int lin_of[DFLASH_MAX_LAYERS];  /* layer -> its index among the linear-attention layers, or -1 */
    int64_t channels, n_v_heads;    /* C and Hv of a layer */
    int64_t conv_size, delta_size;  /* floats of one slot of one layer */
    float *conv, *delta;            /* backend: linear layer l's slot s at (l * 2 * n_recs + s) * size */
    float *kept_qkv, *kept_a, *kept_b; /* backend: record r, linear layer l: [keep, C or Hv] rows */
    int32_t *info;                  /* backend [(n_recs + 1) * DFLASH_REC_INFO_LEN]: the forward's, then one
                                       for advancing */
    qwen35_rec *recs;               /* host [n_recs] */
    /* the forward in progress (host): per sequence of the batch */
    int n_batch, max_seq_rows;
    int *b_rec;
    int32_t *b_info;                /* [n_recs * DFLASH_REC_INFO_LEN] */
} qwen35_state;

/* n_recs: sequences that may hold state at once; max_rows: rows of one
 * forward (keep is min(max_rows, 65): a verify of the longest block). */
dflash_status qwen35_state_init(qwen35_state *s, dflash_backend *be, const dflash_model_config *c, int n_recs,
                                int max_rows);
void qwen35_state_free(qwen35_state *s, dflash_backend *be);

/* A free record (*id >= 0), or DFLASH_ERR_KV_FULL naming the limit. */
dflash_status qwen35_state_acquire(qwen35_state *s, int *id);
void qwen35_state_release(qwen35_state *s, int id);

/* Before a forward: brings each sequence's record to the position of its
 * first row (advancing over kept rows where needed: layers and bufs are
 * the model's, bufs as scratch) and uploads the forward's records.
 * recs[q], p0[q], row0[q], rows[q] per sequence q of the batch. */
dflash_status qwen35_state_begin(qwen35_state *s, dflash_backend *be, const dflash_model_config *c,
                                 const qwen3_layer *layers, const qwen3_bufs *bufs, int n_seqs, const int *recs,
                                 const int32_t *p0, const int32_t *row0, const int32_t *rows);
/* Linear-attention layer `li` of the forward: b->delta = the mixer's
 * output for the rows of b->xn, the states advanced, the rows kept. */
dflash_status qwen35_state_layer(qwen35_state *s, dflash_backend *be, const dflash_model_config *c,
                                 const qwen3_layer *l, int li, const qwen3_bufs *b, int n);
/* After a forward that succeeded. */
void qwen35_state_end(qwen35_state *s);

#endif
