/* fwd_inputs.h: the small integer inputs of one forward pass (token ids,
 * positions, each row's sequence, the rows picked for the LM head, the
 * per-sequence records attention reads and the page tables) in one
 * backend block with a host mirror of the same layout. A forward fills
 * the mirror and sends it with one upload instead of one per array and
 * sequence: each upload costs the host a few microseconds, which is most
 * of the time of a small model's forward on a GPU. */
#ifndef DFLASH_BACKEND_FWD_INPUTS_H
#define DFLASH_BACKEND_FWD_INPUTS_H

#include "backend/backend.h"

typedef struct dflash_fwd_inputs {
    int rows, seqs, pt_len; /* capacities: rows per forward, sequences, page-table entries per sequence */
    int32_t *dev;           /* the backend block */
    int32_t *host;          /* its mirror */
    /* Views into dev, and the same offsets into host (h_ prefix):
     * [rows] each of ids, pos, row_seq, sel; then [seqs * DFLASH_SEQ_INFO_LEN]
     * records, then [seqs * pt_len] page tables. */
    int32_t *ids, *pos, *row_seq, *sel, *seq_info, *page_tables;
    int32_t *h_ids, *h_pos, *h_row_seq, *h_sel, *h_seq_info, *h_page_tables;
} dflash_fwd_inputs;

/* Capacities must be positive. Free with dflash_fwd_inputs_free (also
 * after a failure here). */
dflash_status dflash_fwd_inputs_alloc(dflash_backend *be, int rows, int seqs, int pt_len, dflash_fwd_inputs *in);
void dflash_fwd_inputs_free(dflash_backend *be, dflash_fwd_inputs *in);

/* One upload of the mirror: the row arrays whole (what the forward did
 * not fill is sent but never read) and the records and page tables of
 * sequences 0..n_seqs-1. */
dflash_status dflash_fwd_inputs_upload(dflash_backend *be, const dflash_fwd_inputs *in, int n_seqs);

#endif
