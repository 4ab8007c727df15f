/* qwen35_state.c: see qwen35_state.h. Owns the records of a hybrid
 * target's recurrent state: their memory, where each sequence's next
 * forward may start, and the linear-attention layers' part of the forward
 * that reads and writes them. */
#include "target/qwen35_state.h"

#include <stdlib.h>

dflash_status qwen35_state_init(qwen35_state *s, dflash_backend *be, const dflash_model_config *c, int n_recs)
{
    *s = (qwen35_state){ 0 };
    for (int i = 0; i < c->num_hidden_layers; i++)
        s->lin_of[i] = c->layer_linear[i] ? s->n_lin++ : -1;
    s->n_recs = n_recs;
    s->conv_size = dflash_conv_rec_size(qwen3_gdn_channels(c));
    const int64_t Hv = c->linear_num_value_heads, dk = c->linear_key_head_dim, dv = c->linear_value_head_dim;
    s->delta_size = dflash_delta_rec_size(Hv, dk, dv);
    s->state_floats = Hv * dk * dv;
    s->row_floats = qwen3_gdn_channels(c) + Hv * (dk + dv + 1);
    const size_t recs = (size_t)s->n_lin * (size_t)n_recs;
    DFLASH_TRY(dflash_be_alloc_f32(be, recs * (size_t)s->conv_size, &s->conv));
    DFLASH_TRY(dflash_be_alloc_f32(be, recs * (size_t)s->delta_size, &s->delta));
    s->recs = calloc((size_t)n_recs, sizeof *s->recs);
    s->b_rec = calloc((size_t)n_recs, sizeof *s->b_rec);
    if (!s->recs || !s->b_rec)
        return dflash_fail(DFLASH_ERR_OOM, "hybrid target: out of memory for %d sequences' state", n_recs);
    return DFLASH_OK;
}

void qwen35_state_free(qwen35_state *s, dflash_backend *be)
{
    void *dev[] = { s->conv, s->delta };
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++)
        if (dev[i])
            be->ops->free(be, dev[i]);
    free(s->recs);
    free(s->b_rec);
    *s = (qwen35_state){ 0 };
}

dflash_status qwen35_state_acquire(qwen35_state *s, int *id)
{
    for (int r = 0; r < s->n_recs; r++)
        if (!s->recs[r].used) {
            s->recs[r] = (qwen35_rec){ .used = 1 };
            *id = r;
            return DFLASH_OK;
        }
    return dflash_fail(DFLASH_ERR_KV_FULL, "hybrid target: the recurrent states of all %d sequences it holds (its "
                       "max_seqs) are in use", s->n_recs);
}

void qwen35_state_release(qwen35_state *s, int id)
{
    if (id >= 0 && id < s->n_recs)
        s->recs[id].used = 0;
}

/* Whether record `rec` can resume at position p (see qwen35_state.h). */
static dflash_status check_resume(const qwen35_rec *rec, int32_t p)
{
    if (p == 0)
        return DFLASH_OK;
    if (rec->broken)
        return dflash_fail(DFLASH_ERR_INVALID_ARG, "hybrid target: a forward of this sequence failed midway, so its "
                           "recurrent state is lost; it can only start again from position 0 (not %d)", p);
    if (p < rec->lo || p > rec->hi)
        return dflash_fail(DFLASH_ERR_INVALID_ARG, "hybrid target: a forward from position %d, but the sequence's "
                           "recurrent state can resume only at %d..%d (a hybrid target takes back at most the last "
                           "%d rows of a forward)", p, rec->lo, rec->hi, DFLASH_REC_BACK);
    return DFLASH_OK;
}

dflash_status qwen35_state_begin(qwen35_state *s, int n_seqs, const int *recs, const int32_t *p0,
                                 const int32_t *row0, const int32_t *rows)
{
    if (n_seqs > s->n_recs)
        return dflash_fail(DFLASH_ERR_INVALID_ARG, "hybrid target: %d sequences in a forward, %d records", n_seqs,
                           s->n_recs);
    s->n_batch = n_seqs;
    s->max_seq_rows = 0;
    for (int q = 0; q < n_seqs; q++) {
        const int r = recs[q];
        if (r < 0 || r >= s->n_recs || !s->recs[r].used)
            return dflash_fail(DFLASH_ERR_INVALID_ARG, "hybrid target: sequence %d of the batch has no recurrent "
                               "state (not made by dflash_qwen3_seq_init)", q);
        for (int j = 0; j < q; j++)
            if (recs[j] == r)
                return dflash_fail(DFLASH_ERR_INVALID_ARG, "hybrid target: sequences %d and %d of the batch are the "
                                   "same", j, q);
        DFLASH_TRY(check_resume(&s->recs[r], p0[q]));
        int32_t *f = s->b_info + (size_t)q * DFLASH_REC_INFO_LEN;
        f[0] = row0[q], f[1] = rows[q], f[2] = p0[q], f[3] = r;
        s->b_rec[q] = r;
        if (rows[q] > s->max_seq_rows)
            s->max_seq_rows = rows[q];
    }
    for (int q = 0; q < n_seqs; q++)
        s->recs[recs[q]].broken = 1; /* until the forward ends */
    return DFLASH_OK;
}

dflash_status qwen35_state_layer(qwen35_state *s, dflash_backend *be, const dflash_model_config *c,
                                 const qwen3_layer *l, int li, const qwen3_bufs *b, int n)
{
    const qwen3_gdn_bufs *g = &b->gdn;
    const int64_t lin = s->lin_of[li];
    DFLASH_TRY(qwen3_gdn_project(be, &l->gdn, g, b->xn, n));
    const dflash_rec_args conv = { s->n_batch, s->max_seq_rows, s->info, s->conv + lin * s->n_recs * s->conv_size,
                                   s->conv_size };
    const dflash_rec_args delta = { s->n_batch, s->max_seq_rows, s->info,
                                    s->delta + lin * s->n_recs * s->delta_size, s->delta_size };
    DFLASH_TRY(qwen3_gdn_recur(be, c, &l->gdn, &conv, &delta, g->qkv, g->a, g->b, n, g->y, g->o));
    return qwen3_gdn_gate_norm(be, c, &l->gdn, g, b->pos, n);
}

void qwen35_state_end(qwen35_state *s)
{
    for (int q = 0; q < s->n_batch; q++) {
        const int32_t *f = s->b_info + (size_t)q * DFLASH_REC_INFO_LEN;
        qwen35_rec *rec = &s->recs[s->b_rec[q]];
        rec->hi = f[2] + f[1];
        rec->lo = rec->hi - DFLASH_REC_BACK > f[2] ? rec->hi - DFLASH_REC_BACK : f[2];
        rec->broken = 0;
    }
    s->n_batch = 0;
}
