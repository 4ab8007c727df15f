/* qwen35_state.c: see qwen35_state.h. Owns the records of a hybrid
 * target's recurrent state: their slots and kept rows, bringing a record
 * to a forward's first position, and the linear-attention layers' part of
 * the forward that reads and writes them. */
#include "target/qwen35_state.h"

#include <stdlib.h>
#include <string.h>

enum { KEEP_MAX = 65 }; /* rows of the longest verify: 64 drafts and the token before them */

dflash_status qwen35_state_init(qwen35_state *s, dflash_backend *be, const dflash_model_config *c, int n_recs,
                                int max_rows)
{
    *s = (qwen35_state){ 0 };
    for (int i = 0; i < c->num_hidden_layers; i++)
        s->lin_of[i] = c->layer_linear[i] ? s->n_lin++ : -1;
    s->n_recs = n_recs;
    s->keep = max_rows < KEEP_MAX ? max_rows : KEEP_MAX;
    s->channels = qwen3_gdn_channels(c);
    s->n_v_heads = c->linear_num_value_heads;
    s->conv_size = (int64_t)(c->linear_conv_kernel - 1) * s->channels;
    s->delta_size = s->n_v_heads * c->linear_key_head_dim * c->linear_value_head_dim;
    const size_t slots = (size_t)s->n_lin * 2 * (size_t)n_recs, kept = (size_t)n_recs * s->n_lin * s->keep;
    DFLASH_TRY(dflash_be_alloc_f32(be, slots * (size_t)(s->conv_size ? s->conv_size : 1), &s->conv));
    DFLASH_TRY(dflash_be_alloc_f32(be, slots * (size_t)s->delta_size, &s->delta));
    DFLASH_TRY(dflash_be_alloc_f32(be, kept * (size_t)s->channels, &s->kept_qkv));
    DFLASH_TRY(dflash_be_alloc_f32(be, kept * (size_t)s->n_v_heads, &s->kept_a));
    DFLASH_TRY(dflash_be_alloc_f32(be, kept * (size_t)s->n_v_heads, &s->kept_b));
    DFLASH_TRY(dflash_be_alloc_i32(be, (size_t)(n_recs + 1) * DFLASH_REC_INFO_LEN, &s->info));
    s->recs = calloc((size_t)n_recs, sizeof *s->recs);
    s->b_rec = calloc((size_t)n_recs, sizeof *s->b_rec);
    s->b_info = calloc((size_t)n_recs * DFLASH_REC_INFO_LEN, sizeof *s->b_info);
    if (!s->recs || !s->b_rec || !s->b_info)
        return dflash_fail(DFLASH_ERR_OOM, "hybrid target: out of memory for %d sequences' state", n_recs);
    return DFLASH_OK;
}

void qwen35_state_free(qwen35_state *s, dflash_backend *be)
{
    void *dev[] = { s->conv, s->delta, s->kept_qkv, s->kept_a, s->kept_b, s->info };
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++)
        if (dev[i])
            be->ops->free(be, dev[i]);
    free(s->recs);
    free(s->b_rec);
    free(s->b_info);
    *s = (qwen35_state){ 0 };
}

dflash_status qwen35_state_acquire(qwen35_state *s, int *id)
{
    for (int r = 0; r < s->n_recs; r++)
        if (!s->recs[r].used) {
            s->recs[r] = (qwen35_rec){ .used = 1, .zero = 1 };
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

/* The slot arguments of linear layer `l` over the records at `info`. */
static void layer_args(const qwen35_state *s, int l, const int32_t *info, int n_seqs, int max_rows,
                       dflash_rec_args *conv, dflash_rec_args *delta)
{
    const int64_t slots = 2 * (int64_t)s->n_recs;
    *conv = (dflash_rec_args){ n_seqs, max_rows, info, s->conv + l * slots * s->conv_size, s->conv_size };
    *delta = (dflash_rec_args){ n_seqs, max_rows, info, s->delta + l * slots * s->delta_size, s->delta_size };
}

/* Kept rows of record r, linear layer l: [keep, cols] at base. */
static float *kept_rows(const qwen35_state *s, float *base, int r, int l, int64_t cols)
{
    return base + ((int64_t)r * s->n_lin + l) * s->keep * cols;
}

/* Record r's cur advanced in place over its first k kept rows. */
static dflash_status advance(qwen35_state *s, dflash_backend *be, const dflash_model_config *c,
                             const qwen3_layer *layers, const qwen3_bufs *bufs, int r, int k)
{
    const qwen35_rec *rec = &s->recs[r];
    const int cur = 2 * r + rec->cur;
    const int32_t info[DFLASH_REC_INFO_LEN] = { 0, k, rec->zero ? -1 : cur, cur, 0, 0 };
    int32_t *dev_info = s->info + (size_t)s->n_recs * DFLASH_REC_INFO_LEN;
    DFLASH_TRY(be->ops->upload(be, dev_info, info, sizeof info));
    for (int li = 0; li < c->num_hidden_layers; li++) {
        const int l = s->lin_of[li];
        if (l < 0)
            continue;
        dflash_rec_args conv, delta;
        layer_args(s, l, dev_info, 1, k, &conv, &delta);
        DFLASH_TRY(qwen3_gdn_recur(be, c, &layers[li].gdn, &conv, &delta, kept_rows(s, s->kept_qkv, r, l, s->channels),
                                   kept_rows(s, s->kept_a, r, l, s->n_v_heads),
                                   kept_rows(s, s->kept_b, r, l, s->n_v_heads), k, bufs->gdn.y, bufs->gdn.o));
    }
    return DFLASH_OK;
}

/* Record r brought to position p (see qwen35_state.h). */
static dflash_status reconcile(qwen35_state *s, dflash_backend *be, const dflash_model_config *c,
                               const qwen3_layer *layers, const qwen3_bufs *bufs, int r, int32_t p)
{
    qwen35_rec *rec = &s->recs[r];
    if (p == 0) {
        rec->zero = 1;
        rec->broken = 0;
    } else if (rec->broken) {
        return dflash_fail(DFLASH_ERR_INVALID_ARG, "hybrid target: a forward of this sequence failed midway, so its "
                           "recurrent state is lost; it can only start again from position 0 (not %d)", p);
    } else if (p == rec->len) {
        /* cur is already there */
    } else if (rec->n_kept > 0 && p == rec->len + rec->n_kept) {
        rec->cur ^= 1;
        rec->zero = 0;
    } else if (p > rec->len && p < rec->len + rec->n_kept) {
        rec->broken = 1; /* until every layer has advanced: a failure midway leaves layers apart */
        DFLASH_TRY(advance(s, be, c, layers, bufs, r, p - rec->len));
        rec->broken = 0;
        rec->zero = 0;
    } else {
        return dflash_fail(DFLASH_ERR_INVALID_ARG, "hybrid target: a forward from position %d, but the sequence's "
                           "recurrent state can resume only at %d..%d (a hybrid target takes back at most the last "
                           "%d rows of a forward)", p, rec->len, rec->len + rec->n_kept, s->keep);
    }
    rec->len = p;
    rec->n_kept = 0;
    return DFLASH_OK;
}

dflash_status qwen35_state_begin(qwen35_state *s, dflash_backend *be, const dflash_model_config *c,
                                 const qwen3_layer *layers, const qwen3_bufs *bufs, int n_seqs, const int *recs,
                                 const int32_t *p0, const int32_t *row0, const int32_t *rows)
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
        DFLASH_TRY(reconcile(s, be, c, layers, bufs, r, p0[q]));
        const qwen35_rec *rec = &s->recs[r];
        const int n = rows[q], snap = n > s->keep ? n - s->keep : 0, cur = 2 * r + rec->cur;
        int32_t *f = s->b_info + (size_t)q * DFLASH_REC_INFO_LEN;
        f[0] = row0[q], f[1] = n, f[2] = rec->zero ? -1 : cur, f[3] = 2 * r + (rec->cur ^ 1), f[4] = snap, f[5] = cur;
        s->b_rec[q] = r;
        if (n > s->max_seq_rows)
            s->max_seq_rows = n;
    }
    DFLASH_TRY(be->ops->upload(be, s->info, s->b_info, (size_t)n_seqs * DFLASH_REC_INFO_LEN * sizeof(int32_t)));
    for (int q = 0; q < n_seqs; q++)
        s->recs[recs[q]].broken = 1; /* until the forward ends */
    return DFLASH_OK;
}

dflash_status qwen35_state_layer(qwen35_state *s, dflash_backend *be, const dflash_model_config *c,
                                 const qwen3_layer *l, int li, const qwen3_bufs *b, int n)
{
    const dflash_backend_ops *o = be->ops;
    const qwen3_gdn_bufs *g = &b->gdn;
    const int lin = s->lin_of[li];
    DFLASH_TRY(qwen3_gdn_project(be, &l->gdn, g, b->xn, n));
    for (int q = 0; q < s->n_batch; q++) { /* the rows a later forward may have to replay */
        const int32_t *f = s->b_info + (size_t)q * DFLASH_REC_INFO_LEN;
        const int r = s->b_rec[q], first = f[0] + f[4], kept = f[1] - f[4];
        const int64_t C = s->channels, Hv = s->n_v_heads;
        DFLASH_TRY(o->copy_rows(be, kept_rows(s, s->kept_qkv, r, lin, C), C, g->qkv + first * C, C, NULL, kept, C));
        DFLASH_TRY(o->copy_rows(be, kept_rows(s, s->kept_a, r, lin, Hv), Hv, g->a + first * Hv, Hv, NULL, kept, Hv));
        DFLASH_TRY(o->copy_rows(be, kept_rows(s, s->kept_b, r, lin, Hv), Hv, g->b + first * Hv, Hv, NULL, kept, Hv));
    }
    dflash_rec_args conv, delta;
    layer_args(s, lin, s->info, s->n_batch, s->max_seq_rows, &conv, &delta);
    DFLASH_TRY(qwen3_gdn_recur(be, c, &l->gdn, &conv, &delta, g->qkv, g->a, g->b, n, g->y, g->o));
    return qwen3_gdn_output(be, c, &l->gdn, g, b->pos, n, b->delta);
}

void qwen35_state_end(qwen35_state *s)
{
    for (int q = 0; q < s->n_batch; q++) {
        const int32_t *f = s->b_info + (size_t)q * DFLASH_REC_INFO_LEN;
        qwen35_rec *rec = &s->recs[s->b_rec[q]];
        if (f[4] > 0) { /* cur now holds the state after the first snap rows */
            rec->len += f[4];
            rec->zero = 0;
        }
        rec->n_kept = f[1] - f[4];
        rec->broken = 0;
    }
    s->n_batch = 0;
}
