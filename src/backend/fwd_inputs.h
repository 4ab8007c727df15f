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
    int rec_len;            /* int32s of a second per-sequence record (a hybrid's recurrent state), or 0 */
    int n_rows, n_seqs;     /* the shape dflash_fwd_inputs_begin laid out */
    int32_t *dev;           /* the backend block */
    int32_t *host;          /* its mirror */
    /* Views into dev, and the same offsets into host (h_ prefix), packed
     * for the shape: [n_rows] each of ids, pos, row_seq, sel; then the
     * attention records [n_seqs * DFLASH_SEQ_INFO_LEN], the second records
     * [n_seqs * rec_len] (NULL without), the page tables [n_seqs * pt_len]. */
    int32_t *ids, *pos, *row_seq, *sel, *seq_info, *rec_info, *page_tables;
    int32_t *h_ids, *h_pos, *h_row_seq, *h_sel, *h_seq_info, *h_rec_info, *h_page_tables;
} dflash_fwd_inputs;

/* Capacities must be positive (rec_len may be 0); the views start laid
 * out for the capacities. Free with dflash_fwd_inputs_free (also after a
 * failure here). */
dflash_status dflash_fwd_inputs_alloc(dflash_backend *be, int rows, int seqs, int pt_len, int rec_len,
                                      dflash_fwd_inputs *in);
void dflash_fwd_inputs_free(dflash_backend *be, dflash_fwd_inputs *in);

/* Lay the views out for a forward of at most n_rows rows and n_seqs
 * sequences (within the capacities), each part right after the one
 * before, so that the upload sends only what such a forward uses. The
 * views move with the shape: read them after this call. */
dflash_status dflash_fwd_inputs_begin(dflash_fwd_inputs *in, int n_rows, int n_seqs);

/* One upload of the mirror as begin laid it out (a row array's slots past
 * the rows a forward filled are sent but never read). */
dflash_status dflash_fwd_inputs_upload(dflash_backend *be, const dflash_fwd_inputs *in);

#endif
