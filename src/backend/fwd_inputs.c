/* fwd_inputs.c: a forward's integer inputs in one block, one upload
 * (fwd_inputs.h). */
#include "backend/fwd_inputs.h"

#include <stdlib.h>

/* Where the parts start for R rows and S sequences, in int32 elements:
 * four row arrays, the records, the second records, the page tables;
 * then the end. */
enum { PART_SEQ_INFO = 4, PART_REC_INFO, PART_TABLES, PART_END };
static size_t part_at(const dflash_fwd_inputs *in, size_t R, size_t S, int part)
{
    size_t at = (size_t)(part < PART_SEQ_INFO ? part : PART_SEQ_INFO) * R;
    if (part > PART_SEQ_INFO)
        at += S * DFLASH_SEQ_INFO_LEN;
    if (part > PART_REC_INFO)
        at += S * (size_t)in->rec_len;
    if (part > PART_TABLES)
        at += S * (size_t)in->pt_len;
    return at;
}

/* The views into one of the two copies (dev or host) for R rows and S
 * sequences. */
static void set_views(const dflash_fwd_inputs *in, size_t R, size_t S, int32_t *base, int32_t **ids,
                      int32_t **pos, int32_t **row_seq, int32_t **sel, int32_t **seq_info, int32_t **rec_info,
                      int32_t **page_tables)
{
    *ids = base;
    *pos = base + part_at(in, R, S, 1);
    *row_seq = base + part_at(in, R, S, 2);
    *sel = base + part_at(in, R, S, 3);
    *seq_info = base + part_at(in, R, S, PART_SEQ_INFO);
    *rec_info = in->rec_len > 0 ? base + part_at(in, R, S, PART_REC_INFO) : NULL;
    *page_tables = base + part_at(in, R, S, PART_TABLES);
}

dflash_status dflash_fwd_inputs_alloc(dflash_backend *be, int rows, int seqs, int pt_len, int rec_len,
                                      dflash_fwd_inputs *in)
{
    *in = (dflash_fwd_inputs){ .rows = rows, .seqs = seqs, .pt_len = pt_len, .rec_len = rec_len };
    if (rows <= 0 || seqs <= 0 || pt_len <= 0 || rec_len < 0)
        return dflash_fail(DFLASH_ERR_INVALID_ARG,
                           "forward inputs: %d rows, %d sequences, page tables of %d, records of %d", rows, seqs,
                           pt_len, rec_len);
    const size_t n = part_at(in, (size_t)rows, (size_t)seqs, PART_END);
    DFLASH_TRY(dflash_be_alloc_i32(be, n, &in->dev));
    in->host = calloc(n, sizeof(int32_t));
    if (!in->host)
        return dflash_fail(DFLASH_ERR_OOM, "forward inputs: out of memory for a %zu-byte host mirror",
                           n * sizeof(int32_t));
    return dflash_fwd_inputs_begin(in, rows, seqs);
}

void dflash_fwd_inputs_free(dflash_backend *be, dflash_fwd_inputs *in)
{
    if (in->dev)
        be->ops->free(be, in->dev);
    free(in->host);
    *in = (dflash_fwd_inputs){ 0 };
}

dflash_status dflash_fwd_inputs_begin(dflash_fwd_inputs *in, int n_rows, int n_seqs)
{
    if (n_rows < 0 || n_rows > in->rows || n_seqs < 0 || n_seqs > in->seqs)
        return dflash_fail(DFLASH_ERR_INVALID_ARG, "forward inputs: %d rows and %d sequences (room for %d and %d)",
                           n_rows, n_seqs, in->rows, in->seqs);
    in->n_rows = n_rows;
    in->n_seqs = n_seqs;
    const size_t R = (size_t)n_rows, S = (size_t)n_seqs;
    set_views(in, R, S, in->dev, &in->ids, &in->pos, &in->row_seq, &in->sel, &in->seq_info, &in->rec_info,
              &in->page_tables);
    set_views(in, R, S, in->host, &in->h_ids, &in->h_pos, &in->h_row_seq, &in->h_sel, &in->h_seq_info,
              &in->h_rec_info, &in->h_page_tables);
    return DFLASH_OK;
}

dflash_status dflash_fwd_inputs_upload(dflash_backend *be, const dflash_fwd_inputs *in)
{
    const size_t n = part_at(in, (size_t)in->n_rows, (size_t)in->n_seqs, PART_END);
    return be->ops->upload(be, in->dev, in->host, n * sizeof(int32_t));
}
