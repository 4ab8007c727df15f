/* fwd_inputs.c: a forward's integer inputs in one block, one upload
 * (fwd_inputs.h). */
#include "backend/fwd_inputs.h"

#include <stdlib.h>

/* The offsets of the layout, in int32 elements. */
static size_t off_seq_info(const dflash_fwd_inputs *in) { return 4 * (size_t)in->rows; }
static size_t off_tables(const dflash_fwd_inputs *in)
{
    return off_seq_info(in) + (size_t)in->seqs * DFLASH_SEQ_INFO_LEN;
}

/* The views of one base pointer: ids, pos, row_seq, sel, seq_info,
 * page_tables in that order. */
static void views(const dflash_fwd_inputs *in, int32_t *base, int32_t **v)
{
    for (int i = 0; i < 4; i++)
        v[i] = base + (size_t)i * in->rows;
    v[4] = base + off_seq_info(in);
    v[5] = base + off_tables(in);
}

dflash_status dflash_fwd_inputs_alloc(dflash_backend *be, int rows, int seqs, int pt_len, dflash_fwd_inputs *in)
{
    *in = (dflash_fwd_inputs){ .rows = rows, .seqs = seqs, .pt_len = pt_len };
    if (rows <= 0 || seqs <= 0 || pt_len <= 0)
        return dflash_fail(DFLASH_ERR_INVALID_ARG, "forward inputs: %d rows, %d sequences, page tables of %d", rows,
                           seqs, pt_len);
    const size_t n = off_tables(in) + (size_t)seqs * pt_len;
    DFLASH_TRY(dflash_be_alloc_i32(be, n, &in->dev));
    in->host = calloc(n, sizeof(int32_t));
    if (!in->host)
        return dflash_fail(DFLASH_ERR_OOM, "forward inputs: out of memory for a %zu-byte host mirror",
                           n * sizeof(int32_t));
    int32_t **dv[] = { &in->ids, &in->pos, &in->row_seq, &in->sel, &in->seq_info, &in->page_tables };
    int32_t **hv[] = { &in->h_ids, &in->h_pos, &in->h_row_seq, &in->h_sel, &in->h_seq_info, &in->h_page_tables };
    int32_t *d[6], *h[6];
    views(in, in->dev, d);
    views(in, in->host, h);
    for (int i = 0; i < 6; i++) {
        *dv[i] = d[i];
        *hv[i] = h[i];
    }
    return DFLASH_OK;
}

void dflash_fwd_inputs_free(dflash_backend *be, dflash_fwd_inputs *in)
{
    if (in->dev)
        be->ops->free(be, in->dev);
    free(in->host);
    *in = (dflash_fwd_inputs){ 0 };
}

dflash_status dflash_fwd_inputs_upload(dflash_backend *be, const dflash_fwd_inputs *in, int n_seqs)
{
    if (n_seqs < 0 || n_seqs > in->seqs)
        return dflash_fail(DFLASH_ERR_INVALID_ARG, "forward inputs: %d sequences (capacity %d)", n_seqs, in->seqs);
    const size_t n = off_tables(in) + (size_t)n_seqs * in->pt_len;
    return be->ops->upload(be, in->dev, in->host, n * sizeof(int32_t));
}
