/* qwen3.c: the target (Qwen3, Llama, Qwen3-MoE or a Qwen3.5 hybrid): load
 * (bind every tensor by name with shape checks, refuse tensors nothing
 * uses, size scratch, KV and a hybrid's recurrent state once) and the
 * batched forward with taps. */
#include "target/qwen3.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "target/qwen35.h"

void dflash_qwen3_default_opts(dflash_qwen3_opts *o)
{
    o->max_rows = 64;
    o->max_seqs = 1;
    o->kv_pages = 0; /* 0: max_seqs * pages of max_ctx */
    o->max_ctx = 4096;
    o->kv_dtype = DFLASH_DTYPE_INVALID;
}

/* Binds through the checkpoint layout loading and `dflash info` share. */
static dflash_status bind_weights(dflash_qwen3 *m)
{
    const dflash_model_config *c = &m->cfg;
    m->layers = calloc((size_t)c->num_hidden_layers, sizeof *m->layers);
    if (!m->layers)
        return dflash_fail(DFLASH_ERR_OOM, "qwen3: out of memory");
    qwen3_checkpoint w = { .layers = m->layers };
    dflash_binder b;
    DFLASH_TRY(dflash_binder_init(&b, m->be, m->st));
    dflash_status s = qwen3_checkpoint_bind(&b, c, &w);
    m->norm_host = w.norm_host;
    m->embed = w.embed;
    m->final_norm = w.final_norm;
    m->lm_head = w.lm_head;
    m->n_params = b.n_params;
    dflash_binder_free(&b);
    return s;
}

static dflash_status alloc_scratch(dflash_qwen3 *m)
{
    const dflash_model_config *c = &m->cfg;
    const size_t R = (size_t)m->opts.max_rows, S = (size_t)m->opts.max_seqs, H = (size_t)c->hidden_size;
    qwen3_scratch *s = &m->s;
    DFLASH_TRY(qwen3_bufs_alloc(m->be, c, m->opts.max_rows, &s->b));
    DFLASH_TRY(dflash_be_alloc_f32(m->be, R * (size_t)c->vocab_size, &s->logits));
    DFLASH_TRY(dflash_be_alloc_f32(m->be, R * DFLASH_MAX_TAPS * H, &s->taps));
    DFLASH_TRY(dflash_be_alloc_f32(m->be, R * H, &s->hsel));
    DFLASH_TRY(dflash_be_alloc_i32(m->be, 2 * R, &s->best));
    dflash_graph_cache_init(&s->graphs, m->be);
    /* a hybrid's recurrent-state entries go up with the rest */
    return dflash_fwd_inputs_alloc(m->be, (int)R, (int)S, m->pt_len, m->rec ? DFLASH_REC_INFO_LEN : 0, &s->in);
}

static void free_scratch(dflash_qwen3 *m)
{
    qwen3_scratch *s = &m->s;
    dflash_graph_cache_free(&s->graphs); /* before the buffers its graphs use */
    qwen3_bufs_free(m->be, &s->b);
    void *p[] = { s->logits, s->taps, s->hsel, s->best };
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++)
        if (p[i])
            m->be->ops->free(m->be, p[i]);
    dflash_fwd_inputs_free(m->be, &s->in);
}

/* A Qwen3.5 hybrid needs the linear-attention primitives. */
static dflash_status check_hybrid_backend(const dflash_model_config *c, const dflash_backend *be, const char *label)
{
    if (!be->ops->conv_silu || !be->ops->delta_rule || !be->ops->sigmoid_mul)
        return dflash_fail(DFLASH_ERR_UNSUPPORTED, "%s: a %s target needs the linear-attention primitives (conv_silu, "
                           "delta_rule, sigmoid_mul), which the %s backend does not have", label,
                           dflash_family_name(c->family), be->ops->name);
    return DFLASH_OK;
}

dflash_status dflash_qwen3_load_st(const dflash_model_config *cfg, dflash_st *st, dflash_backend *be,
                                   const dflash_qwen3_opts *opts, dflash_qwen3 **out)
{
    *out = NULL;
    dflash_qwen3 *m = calloc(1, sizeof *m);
    if (!m) {
        dflash_st_close(st); /* ours from the call on, also on failure */
        return dflash_fail(DFLASH_ERR_OOM, "qwen3: out of memory");
    }
    m->st = st;
    m->be = be;
    m->cfg = *cfg;
    if (opts)
        m->opts = *opts;
    else
        dflash_qwen3_default_opts(&m->opts);
    const char *label = dflash_st_path(st);
    dflash_status s = DFLASH_OK;
    if (m->cfg.is_dflash)
        s = dflash_fail(DFLASH_ERR_UNSUPPORTED, "%s: is a DFlash drafter, not a target model", label);
    if (s == DFLASH_OK && dflash_family_is_qwen35(m->cfg.family))
        s = check_hybrid_backend(&m->cfg, be, label);
    if (s == DFLASH_OK && (m->opts.max_rows <= 0 || m->opts.max_seqs <= 0 || m->opts.max_ctx <= 0))
        s = dflash_fail(DFLASH_ERR_INVALID_ARG, "qwen3: max_rows %d, max_seqs %d and max_ctx %d must be positive",
                        m->opts.max_rows, m->opts.max_seqs, m->opts.max_ctx);
    if (s == DFLASH_OK)
        s = bind_weights(m);
    if (s == DFLASH_OK) {
        int n_kv = 0;
        for (int i = 0; i < m->cfg.num_hidden_layers; i++)
            m->kv_layer[i] = m->cfg.layer_linear[i] ? -1 : n_kv++;
        m->pt_len = (m->opts.max_ctx + DFLASH_KV_PAGE - 1) / DFLASH_KV_PAGE;
        int pages = m->opts.kv_pages > 0 ? m->opts.kv_pages : m->opts.max_seqs * m->pt_len;
        s = dflash_kv_pool_init(&m->kv, be, pages, n_kv, m->cfg.num_key_value_heads, m->cfg.head_dim,
                                m->opts.kv_dtype);
    }
    if (s == DFLASH_OK && dflash_family_is_qwen35(m->cfg.family)) {
        m->rec = calloc(1, sizeof *m->rec);
        s = m->rec ? qwen35_state_init(m->rec, be, &m->cfg, m->opts.max_seqs)
                   : dflash_fail(DFLASH_ERR_OOM, "qwen3: out of memory");
    }
    if (s == DFLASH_OK)
        s = alloc_scratch(m);
    if (s != DFLASH_OK) {
        dflash_qwen3_free(m);
        return s;
    }
    *out = m;
    return DFLASH_OK;
}

dflash_status dflash_qwen3_load(const char *dir, dflash_backend *be, const dflash_qwen3_opts *opts,
                                dflash_qwen3 **out)
{
    *out = NULL;
    dflash_model_config cfg;
    dflash_st *st;
    DFLASH_TRY(dflash_config_check_folder(dir, "-m"));
    DFLASH_TRY(dflash_config_load(dir, &cfg));
    DFLASH_TRY(dflash_st_open(dir, &st));
    return dflash_qwen3_load_st(&cfg, st, be, opts, out);
}

void dflash_qwen3_free(dflash_qwen3 *m)
{
    if (!m)
        return;
    free_scratch(m);
    if (m->kv.free_list)
        dflash_kv_pool_free(&m->kv);
    if (m->rec)
        qwen35_state_free(m->rec, m->be);
    free(m->rec);
    qwen3_layers_free(m->layers, m->cfg.num_hidden_layers, m->be);
    free(m->norm_host);
    dflash_st_close(m->st);
    free(m);
}

dflash_status dflash_qwen3_seq_init(dflash_qwen3 *m, dflash_kv_seq *seq)
{
    DFLASH_TRY(dflash_kv_seq_init(seq, m->pt_len));
    if (!m->rec)
        return DFLASH_OK;
    int id;
    dflash_status s = qwen35_state_acquire(m->rec, &id);
    if (s != DFLASH_OK) {
        dflash_kv_seq_free(&m->kv, seq);
        return s;
    }
    seq->rec = id + 1;
    return DFLASH_OK;
}

void dflash_qwen3_seq_free(dflash_qwen3 *m, dflash_kv_seq *seq)
{
    if (m->rec && seq->rec > 0)
        qwen35_state_release(m->rec, seq->rec - 1);
    seq->rec = 0;
    dflash_kv_seq_free(&m->kv, seq);
}

/* Check the batch and reserve KV for its rows: every sequence's rows are
 * consecutive positions that start at its current length. A failed forward
 * leaves every sequence's length as it was (pages already reserved for a
 * sequence stay with it for its next rows). */
static dflash_status prepare_batch(dflash_qwen3 *m, const dflash_qwen3_batch *b, int32_t *new_len)
{
    const dflash_model_config *c = &m->cfg;
    if (b->n_rows <= 0 || b->n_rows > m->opts.max_rows)
        return dflash_fail(DFLASH_ERR_INVALID_ARG, "qwen3 forward: %d rows (1..%d allowed)", b->n_rows,
                           m->opts.max_rows);
    if (b->n_seqs <= 0 || b->n_seqs > m->opts.max_seqs)
        return dflash_fail(DFLASH_ERR_INVALID_ARG, "qwen3 forward: %d sequences (1..%d allowed)", b->n_seqs,
                           m->opts.max_seqs);
    if (b->n_logit_rows < 0 || b->n_logit_rows > b->n_rows || b->n_taps < 0 || b->n_taps > DFLASH_MAX_TAPS)
        return dflash_fail(DFLASH_ERR_INVALID_ARG, "qwen3 forward: %d logit rows, %d taps", b->n_logit_rows,
                           b->n_taps);
    for (int t = 0; t < b->n_taps; t++)
        if (b->tap_layers[t] < 0 || b->tap_layers[t] >= c->num_hidden_layers)
            return dflash_fail(DFLASH_ERR_INVALID_ARG, "qwen3 forward: tap layer %d outside [0, %d)",
                               b->tap_layers[t], c->num_hidden_layers);
    for (int i = 0; i < b->n_logit_rows; i++)
        if (b->logit_rows[i] < 0 || b->logit_rows[i] >= b->n_rows)
            return dflash_fail(DFLASH_ERR_INVALID_ARG, "qwen3 forward: logit row %d outside [0, %d)",
                               b->logit_rows[i], b->n_rows);
    if (b->dev_tokens && (b->dev_n <= 0 || b->dev_cols <= 0 || b->dev_row0 < 0 || b->dev_row_stride < b->dev_cols ||
                          b->dev_row0 + (int64_t)(b->dev_n - 1) * b->dev_row_stride + b->dev_cols > b->n_rows))
        return dflash_fail(DFLASH_ERR_INVALID_ARG, "qwen3 forward: %d runs of %d device tokens from row %d, %d "
                           "apart, do not fit %d rows", b->dev_n, b->dev_cols, b->dev_row0, b->dev_row_stride,
                           b->n_rows);
    for (int q = 0; q < b->n_seqs; q++)
        new_len[q] = b->seqs[q]->len;
    for (int i = 0; i < b->n_rows; i++) {
        int q = b->row_seq[i];
        if (q < 0 || q >= b->n_seqs || (i > 0 && q < b->row_seq[i - 1]))
            return dflash_fail(DFLASH_ERR_INVALID_ARG, "qwen3 forward: row %d has sequence %d (rows must be "
                               "sequence-major, 0..%d)", i, q, b->n_seqs - 1);
        if (b->tokens[i] < 0 || b->tokens[i] >= c->vocab_size)
            return dflash_fail(DFLASH_ERR_INVALID_ARG, "qwen3 forward: token %d outside the vocabulary [0, %d)",
                               b->tokens[i], c->vocab_size);
        if (b->positions[i] != new_len[q])
            return dflash_fail(DFLASH_ERR_INVALID_ARG,
                               "qwen3 forward: row %d of sequence %d is at position %d, expected %d", i, q,
                               b->positions[i], new_len[q]);
        if (b->positions[i] >= m->opts.max_ctx)
            return dflash_fail(DFLASH_ERR_INVALID_ARG, "qwen3 forward: position %d past max_ctx %d",
                               b->positions[i], m->opts.max_ctx);
        new_len[q]++;
    }
    for (int q = 0; q < b->n_seqs; q++) {
        dflash_status s = dflash_kv_seq_reserve(&m->kv, b->seqs[q], new_len[q]);
        if (s != DFLASH_OK)
            return dflash_fail_prefix(s, "target, sequence %d: ", q);
    }
    return DFLASH_OK;
}

/* A forward's graph key: KEY_FIXED fields (forward_ops), then the taps. */
enum { KEY_FIXED = 7 };

/* Are the forward's ops replayed from a graph? A hybrid's are: its
 * recurrent ops read the batch's counts (n_seqs, max_seq_rows: in the key)
 * and everything else (each sequence's record, first row, position) from
 * the forward inputs on the device. So are a MoE's: the routing stays on
 * the device and the experts' launch is sized by the rows alone; a
 * backend that must bring the routing back to the host (its experts'
 * weights not in a layout its kernel takes) refuses the download while
 * capturing, and the cache then runs that shape eagerly. Not while a
 * benchmark counts the experts a call routed to (that count is a
 * download of its own). */
static int graphable(const dflash_qwen3 *m, const dflash_qwen3_batch *b)
{
    if (m->cfg.num_experts && m->s.b.moe.tally && m->s.b.moe.tally->on)
        return 0;
    return m->s.graphs.on && b->n_taps <= DFLASH_GRAPH_KEY_LEN - KEY_FIXED;
}

/* The rows, the rows picked for the LM head and the per-sequence records
 * into the forward inputs' host mirror, laid out for this batch (the
 * positions and a hybrid's entries are read through b.pos and m->rec);
 * *bounds gets the attention grid bounds (most rows and keys of one
 * sequence). */
static dflash_status fill_batch(dflash_qwen3 *m, const dflash_qwen3_batch *b, const int32_t *new_len,
                                dflash_attn_args *bounds)
{
    dflash_fwd_inputs *in = &m->s.in;
    DFLASH_TRY(dflash_fwd_inputs_begin(in, b->n_rows, b->n_seqs));
    m->s.b.pos = in->pos;
    if (m->rec) {
        m->rec->info = in->rec_info;
        m->rec->b_info = in->h_rec_info;
    }
    const size_t nr = (size_t)b->n_rows * sizeof(int32_t);
    memcpy(in->h_ids, b->tokens, nr);
    memcpy(in->h_pos, b->positions, nr);
    memcpy(in->h_row_seq, b->row_seq, nr);
    if (b->n_logit_rows > 0)
        memcpy(in->h_sel, b->logit_rows, (size_t)b->n_logit_rows * sizeof(int32_t));
    bounds->n_seqs = b->n_seqs;
    bounds->max_seq_rows = bounds->max_keys = 0;
    for (int q = 0, row0 = 0; q < b->n_seqs; q++) {
        int rows = 0;
        while (row0 + rows < b->n_rows && b->row_seq[row0 + rows] == q)
            rows++;
        /* Every stored position is a candidate key; causal masking bounds
         * what each row sees. */
        const int32_t info[DFLASH_SEQ_INFO_LEN] = { 0, new_len[q], 0, 0, 0, row0, rows };
        memcpy(in->h_seq_info + (size_t)q * DFLASH_SEQ_INFO_LEN, info, sizeof info);
        memcpy(in->h_page_tables + (size_t)q * m->pt_len, b->seqs[q]->table, (size_t)m->pt_len * sizeof(int32_t));
        if (rows > bounds->max_seq_rows)
            bounds->max_seq_rows = rows;
        if (new_len[q] > bounds->max_keys)
            bounds->max_keys = new_len[q];
        row0 += rows;
    }
    /* the attention grid from a bucket of lengths, so one graph serves
     * many steps (the kernels read each sequence's length) */
    if (graphable(m, b))
        bounds->max_keys = dflash_graph_keys_bucket(&m->s.graphs, bounds->max_keys, m->opts.max_ctx);
    return DFLASH_OK;
}

/* After the residual add that completes layer `layer`, copy the rows into
 * the tap slots that ask for it. A tap is always the un-normed residual
 * stream. Note for the last layer: Hugging Face's output_hidden_states[L]
 * is the final-normed state instead, so a drafter trained on that entry
 * and tapping layer L-1 would see different features here (no published
 * drafter taps the last layer). */
static dflash_status capture_taps(dflash_qwen3 *m, const dflash_qwen3_batch *b, int layer)
{
    const int64_t H = m->cfg.hidden_size;
    for (int t = 0; t < b->n_taps; t++)
        if (b->tap_layers[t] == layer)
            DFLASH_TRY(m->be->ops->copy_rows(m->be, m->s.taps + t * H, (int64_t)b->n_taps * H, m->s.b.x, H, NULL,
                                             b->n_rows, H));
    return DFLASH_OK;
}

/* A hybrid's linear-attention layer: its mixer in place of attention. */
static dflash_status linear_layer_forward(dflash_qwen3 *m, const dflash_qwen3_batch *b, int li)
{
    const qwen3_layer *l = &m->layers[li];
    const qwen3_bufs *bufs = &m->s.b;
    const int n = b->n_rows;
    DFLASH_TRY(qwen3_layer_norm_in(m->be, &m->cfg, qwen3_prev_layer(li > 0 ? l - 1 : NULL), bufs, &l->input_norm, n));
    if (li)
        DFLASH_TRY(capture_taps(m, b, li - 1));
    DFLASH_TRY(qwen35_state_layer(m->rec, m->be, &m->cfg, l, li, bufs, n));
    DFLASH_TRY(dflash_be_linear_add_rmsnorm(m->be, bufs->gdn.o, n, &l->gdn.out, bufs->x, bufs->delta, &l->post_norm,
                                            m->cfg.hidden_size, m->cfg.rms_norm_eps, bufs->xn));
    return qwen3_layer_ffn(m->be, &m->cfg, l, l->lin, bufs, n);
}

static dflash_status layer_forward(dflash_qwen3 *m, const dflash_qwen3_batch *b, const dflash_attn_args *bounds,
                                   int li)
{
    const qwen3_layer *l = &m->layers[li];
    const qwen3_bufs *bufs = &m->s.b;
    const int n = b->n_rows, hybrid = m->rec != NULL;
    if (m->cfg.layer_linear[li])
        return linear_layer_forward(m, b, li);
    /* The previous layer's MLP output is added here, fused with this norm. */
    const qwen3_prev prev = qwen3_prev_layer(li > 0 ? l - 1 : NULL);
    /* the rows' K and V go into the pages as q and k are normed and rotated */
    const dflash_kv_dest dst = { &m->kv.layout, m->kv_layer[li], m->s.in.page_tables, m->pt_len, m->s.in.row_seq,
                                 bufs->v };
    dflash_attn_args a = qwen3_attn_args(&m->cfg, bufs, n);
    a.row_seq = m->s.in.row_seq;
    a.seq_info = m->s.in.seq_info;
    a.kv = &m->kv.layout;
    a.layer = m->kv_layer[li];
    a.page_tables = m->s.in.page_tables;
    a.pt_len = m->pt_len;
    a.causal = 1;
    a.n_seqs = bounds->n_seqs;
    a.max_seq_rows = bounds->max_seq_rows;
    a.max_keys = bounds->max_keys;
    if (hybrid) {
        DFLASH_TRY(qwen35_attn_in(m->be, &m->cfg, l, bufs, n, prev, &dst));
        DFLASH_TRY(m->be->ops->attention(m->be, &a));
        DFLASH_TRY(qwen35_attn_gate(m->be, &m->cfg, bufs, n));
    } else {
        DFLASH_TRY(qwen3_layer_attn(m->be, &m->cfg, l, l->lin, bufs, n, prev, &dst, &a));
    }
    /* the residual stream this layer's input norm left (attention leaves it) */
    if (li)
        DFLASH_TRY(capture_taps(m, b, li - 1));
    return qwen3_layer_attn_out_mlp(m->be, &m->cfg, l, l->lin, bufs, n);
}

/* A hybrid's forward: each sequence's rows (first row, count, position)
 * handed to its record, which refuses a position it cannot resume at. */
static dflash_status rec_begin(dflash_qwen3 *m, const dflash_qwen3_batch *b)
{
    const int S = b->n_seqs;
    int recs[S];
    int32_t p0[S], row0[S], rows[S];
    for (int q = 0; q < S; q++) {
        recs[q] = b->seqs[q]->rec - 1;
        rows[q] = 0;
    }
    for (int i = b->n_rows - 1; i >= 0; i--) { /* sequence-major: the first row of each wins */
        const int q = b->row_seq[i];
        p0[q] = b->positions[i];
        row0[q] = i;
        rows[q]++;
    }
    for (int q = 0; q < S; q++)
        if (!rows[q])
            return dflash_fail(DFLASH_ERR_INVALID_ARG, "qwen3 forward: sequence %d of the batch has no rows (a hybrid "
                               "target's sequences each need at least one)", q);
    return qwen35_state_begin(m->rec, S, recs, p0, row0, rows);
}

/* One forward's ops after its inputs are uploaded: what a graph replays. */
typedef struct forward_job {
    dflash_qwen3 *m;
    const dflash_qwen3_batch *b;
    const dflash_attn_args *bounds;
} forward_job;

static dflash_status forward_enqueue(void *self)
{
    const forward_job *j = self;
    dflash_qwen3 *m = j->m;
    const dflash_qwen3_batch *b = j->b;
    const dflash_model_config *c = &m->cfg;
    const dflash_backend_ops *o = m->be->ops;
    DFLASH_TRY(o->embed(m->be, &m->embed, m->s.in.ids, b->n_rows, m->s.b.x));
    for (int li = 0; li < c->num_hidden_layers; li++)
        DFLASH_TRY(layer_forward(m, b, j->bounds, li));
    const qwen3_prev last = qwen3_prev_layer(&m->layers[c->num_hidden_layers - 1]);
    DFLASH_TRY(qwen3_layer_norm_in(m->be, c, last, &m->s.b, &m->final_norm, b->n_rows));
    DFLASH_TRY(capture_taps(m, b, c->num_hidden_layers - 1));
    if (b->n_logit_rows > 0) {
        DFLASH_TRY(o->copy_rows(m->be, m->s.hsel, c->hidden_size, m->s.b.xn, c->hidden_size, m->s.in.sel,
                                b->n_logit_rows, c->hidden_size));
        if (b->argmax_only)
            DFLASH_TRY(dflash_be_linear_argmax(m->be, m->s.hsel, b->n_logit_rows, &m->lm_head, m->s.logits,
                                               m->s.best));
        else
            DFLASH_TRY(o->linear(m->be, m->s.hsel, b->n_logit_rows, &m->lm_head, m->s.logits));
    }
    return DFLASH_OK;
}

/* The forward's ops, from the graph of its shape where they can be. The
 * key is every host value the ops read: the rows and sequences (the
 * inputs' layout), attention's grid bounds, the LM head's rows and mode,
 * the taps. */
static dflash_status forward_ops(dflash_qwen3 *m, const dflash_qwen3_batch *b, const dflash_attn_args *bounds)
{
    forward_job j = { m, b, bounds };
    if (!graphable(m, b))
        return forward_enqueue(&j);
    int32_t key[DFLASH_GRAPH_KEY_LEN] = { b->n_rows, b->n_seqs, bounds->max_seq_rows, bounds->max_keys,
                                          b->n_logit_rows, b->argmax_only, b->n_taps };
    for (int t = 0; t < b->n_taps; t++)
        key[KEY_FIXED + t] = b->tap_layers[t];
    return dflash_graph_run(&m->s.graphs, key, KEY_FIXED + b->n_taps, forward_enqueue, &j);
}

dflash_status dflash_qwen3_forward(dflash_qwen3 *m, const dflash_qwen3_batch *b, float **logits, float **taps)
{
    int32_t new_len[m->opts.max_seqs];
    *logits = NULL;
    if (taps)
        *taps = NULL;
    dflash_attn_args bounds;
    DFLASH_TRY(prepare_batch(m, b, new_len));
    DFLASH_TRY(fill_batch(m, b, new_len, &bounds));
    if (m->rec)
        DFLASH_TRY(rec_begin(m, b));
    DFLASH_TRY(dflash_fwd_inputs_upload(m->be, &m->s.in));
    if (b->dev_tokens)
        DFLASH_TRY(m->be->ops->copy_ids(m->be, m->s.in.ids + b->dev_row0, b->dev_row_stride, b->dev_tokens,
                                        b->dev_cols, b->dev_n, b->dev_cols));
    DFLASH_TRY(forward_ops(m, b, &bounds));
    if (m->rec)
        qwen35_state_end(m->rec);
    for (int q = 0; q < b->n_seqs; q++)
        b->seqs[q]->len = new_len[q];
    if (b->n_logit_rows > 0 && !b->argmax_only)
        *logits = m->s.logits;
    if (taps && b->n_taps > 0)
        *taps = m->s.taps;
    return DFLASH_OK;
}
