/* dflash_head.c: the DFlash draft head: loading and checking a drafter
 * against its target, the context path (taps -> fc -> hidden_norm -> every
 * layer's K/V in the paged cache), the block forward (one propose), and the
 * DraftProposer table that exposes them. */
#include "draft/dflash_head.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/levers.h"

int dflash_ctx_cap(void) { return dflash_levers_get()->ctx_cap; }

void dflash_head_default_opts(dflash_head_opts *o)
{
    o->max_seqs = 1;
    o->max_ctx = 4096;
    o->ctx_cap = -1;
    o->kv_pages = 0;
    o->block_size = 0;
    o->quant = -1;
    o->kv_dtype = DFLASH_DTYPE_INVALID;
}

/* ---- loading ---------------------------------------------------------- */

static dflash_status check_against_target(const dflash_head *h, const char *dir, const dflash_qwen3 *t)
{
    const dflash_model_config *c = &h->cfg, *tc = &t->cfg;
    if (c->hidden_size != tc->hidden_size)
        return dflash_fail(DFLASH_ERR_SHAPE, "%s: drafter hidden_size %d != target hidden_size %d (the drafter "
                           "runs on the target's embedding)", dir, c->hidden_size, tc->hidden_size);
    if (c->vocab_size != tc->vocab_size)
        return dflash_fail(DFLASH_ERR_SHAPE, "%s: drafter vocab_size %d != target vocab_size %d", dir,
                           c->vocab_size, tc->vocab_size);
    if (c->num_target_layers != tc->num_hidden_layers)
        return dflash_fail(DFLASH_ERR_SHAPE, "%s: num_target_layers %d != the target's num_hidden_layers %d", dir,
                           c->num_target_layers, tc->num_hidden_layers);
    for (int i = 0; i < c->n_target_layer_ids; i++)
        if (c->target_layer_ids[i] < 0 || c->target_layer_ids[i] >= tc->num_hidden_layers)
            return dflash_fail(DFLASH_ERR_SHAPE, "%s: dflash_config.target_layer_ids[%d] = %d is not a layer of "
                               "the target (0..%d)", dir, i, c->target_layer_ids[i], tc->num_hidden_layers - 1);
    if (c->mask_token_id < 0 || c->mask_token_id >= tc->vocab_size)
        return dflash_fail(DFLASH_ERR_SHAPE, "%s: dflash_config.mask_token_id %d is outside the target "
                           "vocabulary [0, %d)", dir, c->mask_token_id, tc->vocab_size);
    for (int i = 0; i < c->num_hidden_layers; i++)
        if (c->layer_sliding[i] && c->sliding_window <= 0)
            return dflash_fail(DFLASH_ERR_FORMAT, "%s: layer %d is sliding_attention but sliding_window is %d",
                               dir, i, c->sliding_window);
    return DFLASH_OK;
}

/* Binds through the checkpoint layout loading and `dflash info` share. */
static dflash_status bind_weights(dflash_head *h)
{
    const dflash_model_config *c = &h->cfg;
    h->layers = calloc((size_t)c->num_hidden_layers, sizeof *h->layers);
    qwen3_checkpoint w = { .layers = calloc((size_t)c->num_hidden_layers, sizeof *w.layers) };
    dflash_binder b = { 0 };
    dflash_status s = h->layers && w.layers ? dflash_binder_init(&b, h->be, h->st)
                                            : dflash_fail(DFLASH_ERR_OOM, "dflash head: out of memory");
    if (s == DFLASH_OK)
        s = qwen3_checkpoint_bind(&b, c, &w);
    if (s == DFLASH_OK) {
        h->fc = w.fc;
        h->hidden_norm = w.hidden_norm;
        h->norm = w.final_norm;
        for (int i = 0; i < c->num_hidden_layers; i++) {
            h->layers[i].w = w.layers[i];
            h->layers[i].sliding = c->layer_sliding[i];
        }
    }
    dflash_binder_free(&b);
    free(w.layers);
    return s;
}

/* Element i of a checkpoint tensor (BF16, F16 or F32) as f32. */
static float host_elem(dflash_dtype dt, const void *host, size_t i)
{
    return dt == DFLASH_DTYPE_BF16  ? dflash_bf16_to_f32(((const uint16_t *)host)[i])
           : dt == DFLASH_DTYPE_F16 ? dflash_f16_to_f32(((const uint16_t *)host)[i])
                                    : ((const float *)host)[i];
}

/* Per-row fp8 e4m3 copy of a weight: scale[r] = max|W[r,:]| / 448, so each
 * row uses the format's whole range. Computed once at load, on the host,
 * from the checkpoint mapping (w->data may be device memory). A NaN or
 * infinite weight is refused here, named: its row has no usable scale (an
 * infinite maximum would turn the whole row into NaN codes). */
static dflash_status quantize_fp8(dflash_backend *be, const dflash_st *st, const dflash_weight *w, dflash_weight *q)
{
    const int64_t rows = w->rows, cols = w->cols;
    const dflash_tensor_info *t = dflash_st_find(st, w->name);
    if (!t)
        return dflash_fail(DFLASH_ERR_NOT_FOUND, "fp8 quantization: tensor %s not found", w->name);
    const void *host = t->data;
    uint8_t *bytes = malloc((size_t)(rows * cols));
    float *scales = malloc((size_t)rows * sizeof(float));
    if (!bytes || !scales) {
        free(bytes);
        free(scales);
        return dflash_fail(DFLASH_ERR_OOM, "fp8 quantization of %s: out of memory", w->name);
    }
    int64_t first_bad = -1; /* the first non-finite element, row-major */
#pragma omp parallel for schedule(static) if (rows * cols > (1 << 20))
    for (int64_t r = 0; r < rows; r++) {
        float row[cols], amax = 0.0f;
        for (int64_t k = 0; k < cols; k++) {
            size_t idx = (size_t)(r * cols + k);
            float v = host_elem(w->dtype, host, idx);
            if (!isfinite(v)) {
#pragma omp critical(fp8_bad)
                if (first_bad < 0 || (int64_t)idx < first_bad)
                    first_bad = (int64_t)idx;
                v = 0.0f;
            }
            row[k] = v;
            amax = fmaxf(amax, fabsf(v));
        }
        scales[r] = amax > 0.0f ? amax / 448.0f : 1.0f;
        for (int64_t k = 0; k < cols; k++)
            bytes[r * cols + k] = dflash_f32_to_fp8e4m3(row[k] / scales[r]);
    }
    if (first_bad >= 0) {
        const float v = host_elem(w->dtype, host, (size_t)first_bad);
        free(bytes);
        free(scales);
        return dflash_fail(DFLASH_ERR_NUMERIC, "fp8 quantization of %s: element [%lld, %lld] is %s (weights must be "
                           "finite)", w->name, (long long)(first_bad / cols), (long long)(first_bad % cols),
                           isnan(v) ? "NaN" : v > 0 ? "+inf" : "-inf");
    }
    void *dbytes = NULL, *dscales = NULL;
    dflash_status s = be->ops->alloc(be, (size_t)(rows * cols), &dbytes);
    if (s == DFLASH_OK)
        s = be->ops->alloc(be, (size_t)rows * sizeof(float), &dscales);
    if (s == DFLASH_OK)
        s = be->ops->upload(be, dbytes, bytes, (size_t)(rows * cols));
    if (s == DFLASH_OK)
        s = be->ops->upload(be, dscales, scales, (size_t)rows * sizeof(float));
    if (s == DFLASH_OK) {
        *q = (dflash_weight){ DFLASH_DTYPE_F8_E4M3, rows, cols, dbytes, dscales, w->name };
    } else {
        if (dbytes)
            be->ops->free(be, dbytes);
        if (dscales)
            be->ops->free(be, dscales);
    }
    free(bytes);
    free(scales);
    return s;
}

static dflash_status quantize_layers(dflash_head *h)
{
    for (int i = 0; i < h->cfg.num_hidden_layers; i++)
        for (int k = 0; k < QWEN3_LIN_COUNT; k++)
            DFLASH_TRY(quantize_fp8(h->be, h->st, &h->layers[i].w.lin[k], &h->layers[i].lin_fp8[k]));
    return DFLASH_OK;
}

/* The projection weights a layer runs with. */
static const dflash_weight *layer_lin(const dflash_head *h, const dflash_layer *l)
{
    return h->quant == DFLASH_QUANT_FP8_WEIGHTS ? l->lin_fp8 : l->w.lin;
}

/* Layer li's predecessor for its input norm (the final norm: li = the
 * layer count). */
static qwen3_prev prev_of(const dflash_head *h, int li)
{
    if (li == 0)
        return qwen3_prev_layer(NULL);
    return (qwen3_prev){ &h->layers[li - 1].w, layer_lin(h, &h->layers[li - 1]) };
}

static dflash_status alloc_scratch(dflash_head *h)
{
    const size_t R = (size_t)h->max_rows, S = (size_t)h->opts.max_seqs, H = (size_t)h->cfg.hidden_size;
    dflash_scratch *s = &h->s;
    DFLASH_TRY(qwen3_bufs_alloc(h->be, &h->cfg, h->max_rows, &s->b));
    DFLASH_TRY(dflash_be_alloc_f32(h->be, R * H, &s->z));
    DFLASH_TRY(dflash_be_alloc_f32(h->be, R * H, &s->hsel));
    DFLASH_TRY(dflash_be_alloc_f32(h->be, R * (size_t)h->cfg.vocab_size, &s->logits));
    DFLASH_TRY(dflash_be_alloc_i32(h->be, R, &s->argmax));
    dflash_graph_cache_init(&s->graphs, h->be);
    return dflash_fwd_inputs_alloc(h->be, (int)R, (int)S, h->pt_len, 0, &s->in);
}

static void free_scratch(dflash_head *h)
{
    dflash_scratch *s = &h->s;
    dflash_graph_cache_free(&s->graphs); /* before the buffers its graphs use */
    qwen3_bufs_free(h->be, &s->b);
    void *p[] = { s->z, s->hsel, s->logits, s->argmax };
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++)
        if (p[i])
            h->be->ops->free(h->be, p[i]);
    dflash_fwd_inputs_free(h->be, &s->in);
}

static const dflash_proposer_ops k_dflash_ops;

dflash_status dflash_head_load_st(const dflash_model_config *cfg, dflash_st *st, const char *label,
                                  dflash_qwen3 *target, const dflash_head_opts *opts, dflash_head **out)
{
    *out = NULL;
    dflash_head *h = calloc(1, sizeof *h);
    if (!h) {
        dflash_st_close(st); /* ours from the call on, also on failure */
        return dflash_fail(DFLASH_ERR_OOM, "dflash head: out of memory");
    }
    h->st = st;
    h->cfg = *cfg;
    h->be = target->be;
    if (opts)
        h->opts = *opts;
    else
        dflash_head_default_opts(&h->opts);
    h->proposer = (dflash_proposer){ &k_dflash_ops, h };
    h->kernels = (dflash_kernels){ h->be->ops->name, 0, NULL }; /* generic ops: nothing to resolve */
    dflash_status s = DFLASH_OK;
    if (h->opts.max_seqs <= 0 || h->opts.max_ctx <= 0 || h->opts.kv_pages < 0)
        s = dflash_fail(DFLASH_ERR_INVALID_ARG, "%s: drafter options max_seqs %d, max_ctx %d, kv_pages %d", label,
                        h->opts.max_seqs, h->opts.max_ctx, h->opts.kv_pages);
    if (s == DFLASH_OK && !h->cfg.is_dflash)
        s = dflash_fail(DFLASH_ERR_FORMAT, "%s: not a DFlash drafter (architectures[0] is '%s' and there is no "
                        "dflash_config)", label, h->cfg.architecture);
    if (s == DFLASH_OK)
        s = check_against_target(h, label, target);
    if (s == DFLASH_OK) {
        h->block_size = h->opts.block_size > 0 && h->opts.block_size < h->cfg.block_size ? h->opts.block_size
                                                                                         : h->cfg.block_size;
        h->ctx_cap = h->opts.ctx_cap >= 0 ? h->opts.ctx_cap : dflash_ctx_cap();
        int quant = h->opts.quant >= 0 ? h->opts.quant : dflash_levers_get()->drafter_fp8;
        h->quant = quant ? DFLASH_QUANT_FP8_WEIGHTS : DFLASH_QUANT_BF16;
        /* With a cap the ring holds the window plus the block it straddles. */
        int full = (h->opts.max_ctx + DFLASH_KV_PAGE - 1) / DFLASH_KV_PAGE;
        int ring = (h->ctx_cap + DFLASH_KV_PAGE - 1) / DFLASH_KV_PAGE + 1;
        h->pt_len = h->ctx_cap > 0 && ring < full ? ring : full;
        h->max_rows = h->opts.max_seqs * h->block_size;
        if (h->max_rows < target->opts.max_rows)
            h->max_rows = target->opts.max_rows;
        h->embed = target->embed;
        h->lm_head = target->lm_head;
        s = bind_weights(h);
    }
    if (s == DFLASH_OK && h->quant == DFLASH_QUANT_FP8_WEIGHTS && (s = quantize_layers(h)) != DFLASH_OK)
        dflash_fail_prefix(s, "%s: ", label);
    if (s == DFLASH_OK) {
        int pages = h->opts.kv_pages > 0 ? h->opts.kv_pages : h->opts.max_seqs * h->pt_len;
        s = dflash_kv_pool_init(&h->kv, h->be, pages, h->cfg.num_hidden_layers, h->cfg.num_key_value_heads,
                                h->cfg.head_dim, h->opts.kv_dtype);
    }
    if (s == DFLASH_OK)
        s = alloc_scratch(h);
    if (s != DFLASH_OK) {
        dflash_head_free(h);
        return s;
    }
    *out = h;
    return DFLASH_OK;
}

dflash_status dflash_head_load(const char *dir, dflash_qwen3 *target, const dflash_head_opts *opts,
                               dflash_head **out)
{
    *out = NULL;
    dflash_model_config cfg;
    dflash_st *st;
    DFLASH_TRY(dflash_config_check_folder(dir, "-d"));
    DFLASH_TRY(dflash_config_load(dir, &cfg));
    DFLASH_TRY(dflash_st_open(dir, &st));
    return dflash_head_load_st(&cfg, st, dir, target, opts, out);
}

void dflash_head_free(dflash_head *h)
{
    if (!h)
        return;
    free_scratch(h);
    if (h->kv.free_list)
        dflash_kv_pool_free(&h->kv);
    for (int i = 0; h->layers && i < h->cfg.num_hidden_layers; i++)
        for (int k = 0; k < QWEN3_LIN_COUNT; k++) {
            dflash_weight *q = &h->layers[i].lin_fp8[k];
            if (q->data)
                h->be->ops->free(h->be, (void *)q->data);
            if (q->scales)
                h->be->ops->free(h->be, (void *)q->scales);
        }
    free(h->layers);
    dflash_st_close(h->st);
    free(h);
}

const float *dflash_head_last_logits(const dflash_head *h) { return h->keep_logits ? h->s.logits : NULL; }

/* ---- the context path ------------------------------------------------- */

/* Append committed rows [pos0, pos0 + n) of one sequence: only the rows the
 * window keeps are projected, and whole pages that fall out of the window
 * go back to the pool first. */
/* The checks of one sequence's context rows. */
static dflash_status ctx_check(const dflash_head *h, const dflash_proposer_state *st, const dflash_ctx_rows *r)
{
    if (r->pos0 != st->kv.len)
        return dflash_fail(DFLASH_ERR_INVALID_ARG, "dflash head: context rows start at position %d, expected %d",
                           r->pos0, st->kv.len);
    if (r->n <= 0)
        return DFLASH_OK;
    if (r->n > h->max_rows)
        return dflash_fail(DFLASH_ERR_INVALID_ARG, "dflash head: %d context rows at once (at most %d)", r->n,
                           h->max_rows);
    if (!r->taps || r->taps_stride != h->fc.cols)
        return dflash_fail(DFLASH_ERR_INVALID_ARG, "dflash head: context rows need taps of %lld values per row, "
                           "got %lld", (long long)h->fc.cols, (long long)(r->taps ? r->taps_stride : 0));
    if (r->pos0 + r->n > st->budget)
        return dflash_fail(DFLASH_ERR_INVALID_ARG, "dflash head: position %d past the state's budget of %d",
                           r->pos0 + r->n - 1, st->budget);
    return DFLASH_OK;
}

/* The head's two kinds of graphs, the first field of their keys. */
enum { GRAPH_CTX_PASS = 1, GRAPH_BLOCK = 2 };

/* The context pass's ops after fc and the upload, over its m rows: the
 * hidden norm, then each layer's K/V projection, k norm + RoPE and page
 * write. What a graph replays. */
typedef struct ctx_job {
    dflash_head *h;
    int m;
} ctx_job;

static dflash_status ctx_enqueue(void *self)
{
    const ctx_job *j = self;
    dflash_head *h = j->h;
    const dflash_model_config *c = &h->cfg;
    dflash_scratch *s = &h->s;
    const int m = j->m;
    DFLASH_TRY(h->be->ops->add_rmsnorm(h->be, s->z, NULL, &h->hidden_norm, m, c->hidden_size, c->rms_norm_eps,
                                       s->b.xn));
    for (int li = 0; li < c->num_hidden_layers; li++) {
        const dflash_layer *l = &h->layers[li];
        const dflash_weight *lin = layer_lin(h, l);
        float *const kv[2] = { s->b.k, s->b.v };
        DFLASH_TRY(dflash_be_linear_group(h->be, s->b.xn, m, &lin[QWEN3_LIN_K], 2, kv, DFLASH_ACT_NONE));
        /* k normed and rotated, then K and V into the pages */
        const dflash_kv_dest dst = { &h->kv.layout, li, s->in.page_tables, h->pt_len, s->in.row_seq, s->b.v };
        DFLASH_TRY(dflash_be_qk_norm_rope_store(h->be, NULL, NULL, 0, s->b.k, &l->w.k_norm, c->num_key_value_heads,
                                                s->b.pos, m, c->head_dim, c->rms_norm_eps, &c->rope_freq, &dst));
    }
    return DFLASH_OK;
}

/* Context rows of sequences states[0..n) (rows[q] for sequence q, at most
 * max_rows in all) into their drafter caches, in one pass: fc(taps) per
 * sequence into consecutive rows of z, then every layer's K/V projection,
 * k norm + RoPE and page write once over all rows. Every op is row by
 * row, so a row's K/V are the same bits whatever rows share the pass.
 * With a context window, rows that would slide out at once are skipped. */
static dflash_status ctx_append_pass(dflash_head *h, dflash_proposer_state **states, const dflash_ctx_rows *rows,
                                     int n)
{
    const dflash_model_config *c = &h->cfg;
    const dflash_backend_ops *o = h->be->ops;
    dflash_scratch *s = &h->s;
    int m = 0, bound = 0;
    for (int q = 0; q < n; q++)
        bound += rows[q].n > 0 ? rows[q].n : 0;
    DFLASH_TRY(dflash_fwd_inputs_begin(&s->in, bound, n));
    s->b.pos = s->in.pos;
    for (int q = 0; q < n; q++) {
        dflash_proposer_state *st = states[q];
        const dflash_ctx_rows *r = &rows[q];
        if (r->n <= 0) {
            memcpy(s->in.h_page_tables + (size_t)q * h->pt_len, st->kv.table, (size_t)h->pt_len * sizeof(int32_t));
            continue;
        }
        const int32_t end = r->pos0 + r->n;
        int32_t lo = h->ctx_cap > 0 && end - h->ctx_cap > st->kv.lo ? end - h->ctx_cap : st->kv.lo;
        const int first = lo > r->pos0 ? lo - r->pos0 : 0, mq = r->n - first;
        dflash_status sl = dflash_kv_seq_slide(&h->kv, &st->kv, lo, end);
        if (sl != DFLASH_OK)
            return dflash_fail_prefix(sl, "drafter context: ");
        /* z = hidden_norm(fc(taps)); input_layernorm is NOT applied to z. */
        DFLASH_TRY(o->linear(h->be, r->taps + (int64_t)first * r->taps_stride, mq, &h->fc,
                             s->z + (int64_t)m * c->hidden_size));
        for (int i = 0; i < mq; i++) {
            s->in.h_pos[m + i] = r->pos0 + first + i;
            s->in.h_row_seq[m + i] = q;
        }
        memcpy(s->in.h_page_tables + (size_t)q * h->pt_len, st->kv.table, (size_t)h->pt_len * sizeof(int32_t));
        m += mq;
    }
    if (m > 0) {
        DFLASH_TRY(dflash_fwd_inputs_upload(h->be, &s->in));
        /* the key: which pass, the rows (the ops' sizes), the inputs' layout */
        ctx_job j = { h, m };
        const int32_t key[] = { GRAPH_CTX_PASS, m, bound, n };
        DFLASH_TRY(dflash_graph_run(&s->graphs, key, 4, ctx_enqueue, &j));
    }
    for (int q = 0; q < n; q++)
        if (rows[q].n > 0)
            states[q]->kv.len = rows[q].pos0 + rows[q].n;
    return DFLASH_OK;
}

/* Context rows of n sequences: checked first, then in passes of at most
 * max_rows rows (and max_seqs sequences). */
static dflash_status ctx_append(dflash_head *h, dflash_proposer_state **states, const dflash_ctx_rows *rows, int n)
{
    for (int q = 0; q < n; q++)
        DFLASH_TRY(ctx_check(h, states[q], &rows[q]));
    for (int q0 = 0, q1; q0 < n; q0 = q1) {
        int total = 0;
        for (q1 = q0; q1 < n && q1 - q0 < h->opts.max_seqs; q1++) { /* each alone fits (ctx_check) */
            const int rn = rows[q1].n > 0 ? rows[q1].n : 0;
            if (total + rn > h->max_rows)
                break;
            total += rn;
        }
        DFLASH_TRY(ctx_append_pass(h, states + q0, rows + q0, q1 - q0));
    }
    return DFLASH_OK;
}

/* ---- the block forward ------------------------------------------------ */

/* The block forward's ops after its inputs are uploaded, up to the drafts
 * in s->argmax: what a graph replays. */
typedef struct block_job {
    dflash_head *h;
    int n_seqs, n_drafts, max_keys;
} block_job;

static dflash_status block_enqueue(void *self)
{
    const block_job *j = self;
    dflash_head *h = j->h;
    const dflash_model_config *c = &h->cfg;
    const dflash_backend_ops *o = h->be->ops;
    dflash_scratch *s = &h->s;
    const dflash_fwd_inputs *in = &s->in;
    const int n_seqs = j->n_seqs, B = j->n_drafts + 1, n = n_seqs * B;
    DFLASH_TRY(o->embed(h->be, &h->embed, in->ids, n, s->b.x));
    for (int li = 0; li < c->num_hidden_layers; li++) {
        const dflash_layer *l = &h->layers[li];
        const dflash_weight *lin = layer_lin(h, l);
        DFLASH_TRY(qwen3_layer_attn_in(h->be, c, &l->w, lin, &s->b, n, prev_of(h, li), NULL));
        dflash_attn_args a = qwen3_attn_args(c, &s->b, n);
        a.row_seq = in->row_seq;
        a.seq_info = in->seq_info;
        a.kv = &h->kv.layout;
        a.layer = li;
        a.page_tables = in->page_tables;
        a.pt_len = h->pt_len;
        a.k_extra = s->b.k;
        a.v_extra = s->b.v;
        a.causal = l->sliding || c->drafter_causal; /* full layers: no mask at all, unless the config says causal */
        a.window = l->sliding ? c->sliding_window : 0;
        a.n_seqs = n_seqs;
        a.max_seq_rows = B;
        a.max_keys = j->max_keys;
        DFLASH_TRY(o->attention(h->be, &a));
        DFLASH_TRY(qwen3_layer_attn_out_mlp(h->be, c, &l->w, lin, &s->b, n));
    }
    DFLASH_TRY(qwen3_layer_norm_in(h->be, c, prev_of(h, c->num_hidden_layers), &s->b, &h->norm, n));
    /* Row j predicts the token at its own position s+j; row 0 is discarded. */
    const int nd = n_seqs * j->n_drafts;
    DFLASH_TRY(o->copy_rows(h->be, s->hsel, c->hidden_size, s->b.xn, c->hidden_size, in->sel, nd, c->hidden_size));
    if (h->keep_logits) {
        DFLASH_TRY(o->linear(h->be, s->hsel, nd, &h->lm_head, s->logits));
        return o->argmax(h->be, s->logits, nd, c->vocab_size, s->argmax);
    }
    return dflash_be_linear_argmax(h->be, s->hsel, nd, &h->lm_head, s->logits, s->argmax);
}

/* The block forward of n_seqs sequences: their drafts in s->argmax. */
static dflash_status block_forward(dflash_head *h, dflash_proposer_state **states, int n_seqs,
                                   const int32_t *last_tokens, const int32_t *positions, int n_drafts)
{
    const dflash_model_config *c = &h->cfg;
    dflash_scratch *s = &h->s;
    const int B = n_drafts + 1, n = n_seqs * B;
    dflash_fwd_inputs *in = &s->in;
    DFLASH_TRY(dflash_fwd_inputs_begin(in, n, n_seqs));
    s->b.pos = in->pos;
    int max_keys = 0;
    for (int q = 0; q < n_seqs; q++) {
        const dflash_proposer_state *st = states[q];
        if (positions[q] != st->kv.len)
            return dflash_fail(DFLASH_ERR_INVALID_ARG, "dflash head: propose at position %d but sequence %d has "
                               "%d committed positions", positions[q], q, st->kv.len);
        for (int j = 0; j < B; j++) {
            in->h_ids[q * B + j] = j == 0 ? last_tokens[q] : c->mask_token_id;
            in->h_pos[q * B + j] = positions[q] + j;
            in->h_row_seq[q * B + j] = q;
            if (j > 0)
                in->h_sel[q * n_drafts + j - 1] = q * B + j;
        }
        /* Context keys [lo, s) from the pages, then the block's own B rows. */
        const int32_t info[DFLASH_SEQ_INFO_LEN] = { st->kv.lo, st->kv.len, q * B, B, positions[q], q * B, B };
        if (st->kv.len - st->kv.lo + B > max_keys)
            max_keys = st->kv.len - st->kv.lo + B;
        memcpy(in->h_seq_info + (size_t)q * DFLASH_SEQ_INFO_LEN, info, sizeof info);
        memcpy(in->h_page_tables + (size_t)q * h->pt_len, st->kv.table, (size_t)h->pt_len * sizeof(int32_t));
    }
    DFLASH_TRY(dflash_fwd_inputs_upload(h->be, in));
    /* The ops from the graph of their shape where the backend captures
     * (the key: every host value they read); attention's grid from a
     * bucket of lengths, so one graph serves many steps. */
    block_job j = { h, n_seqs, n_drafts,
                    dflash_graph_keys_bucket(&s->graphs, max_keys, h->pt_len * DFLASH_KV_PAGE + B) };
    const int32_t key[] = { GRAPH_BLOCK, n_seqs, n_drafts, j.max_keys, h->keep_logits };
    DFLASH_TRY(dflash_graph_run(&s->graphs, key, 5, block_enqueue, &j));
    h->last_rows = n_seqs * n_drafts;
    return DFLASH_OK;
}

/* ---- the DraftProposer table ------------------------------------------ */

static const char *head_name(const dflash_proposer *p)
{
    (void)p;
    return "dflash";
}

static int head_block_size(const dflash_proposer *p) { return ((const dflash_head *)p->self)->block_size; }

static int head_tap_layers(const dflash_proposer *p, const int **layers)
{
    const dflash_head *h = p->self;
    *layers = h->cfg.target_layer_ids;
    return h->cfg.n_target_layer_ids;
}

static dflash_status head_alloc_state(dflash_proposer *p, int budget_tokens, void **state)
{
    dflash_head *h = p->self;
    if (budget_tokens <= 0 || budget_tokens > h->opts.max_ctx)
        return dflash_fail(DFLASH_ERR_INVALID_ARG, "dflash head: budget of %d tokens (1..%d allowed)",
                           budget_tokens, h->opts.max_ctx);
    dflash_proposer_state *st = calloc(1, sizeof *st);
    if (!st)
        return dflash_fail(DFLASH_ERR_OOM, "dflash head: out of memory");
    dflash_status s = dflash_kv_seq_init(&st->kv, h->pt_len);
    if (s != DFLASH_OK) {
        free(st);
        return s;
    }
    st->budget = budget_tokens;
    *state = st;
    return DFLASH_OK;
}

static void head_free_state(dflash_proposer *p, void *state)
{
    dflash_head *h = p->self;
    dflash_proposer_state *st = state;
    if (!st)
        return;
    dflash_kv_seq_free(&h->kv, &st->kv);
    free(st);
}

static dflash_status head_reset(dflash_proposer *p, void *state)
{
    dflash_head *h = p->self;
    dflash_proposer_state *st = state;
    int pt_len = st->kv.pt_len;
    dflash_kv_seq_free(&h->kv, &st->kv);
    return dflash_kv_seq_init(&st->kv, pt_len);
}

static dflash_status head_begin(dflash_proposer *p, void *state, const dflash_ctx_rows *rows)
{
    dflash_proposer_state *st = state;
    return ctx_append(p->self, &st, rows, 1);
}

static dflash_status head_propose_dev(dflash_proposer *p, void **states, int n_seqs, const int32_t *last_tokens,
                                      const int32_t *positions, int n_drafts, const int32_t **drafts)
{
    dflash_head *h = p->self;
    if (n_seqs <= 0 || n_seqs > h->opts.max_seqs)
        return dflash_fail(DFLASH_ERR_INVALID_ARG, "dflash head: %d sequences (1..%d allowed)", n_seqs,
                           h->opts.max_seqs);
    if (n_drafts <= 0 || n_drafts > h->block_size - 1)
        return dflash_fail(DFLASH_ERR_INVALID_ARG, "dflash head: %d drafts (1..%d allowed)", n_drafts,
                           h->block_size - 1);
    DFLASH_TRY(block_forward(h, (dflash_proposer_state **)states, n_seqs, last_tokens, positions, n_drafts));
    *drafts = h->s.argmax;
    return DFLASH_OK;
}

/* A draft of -1: its row's logits had no usable number (argmax's answer). */
static dflash_status head_check_drafts(const dflash_proposer *p, const int32_t *drafts, int n_seqs,
                                       const int32_t *positions, int n_drafts)
{
    const dflash_head *h = p->self;
    for (int i = 0; i < n_seqs * n_drafts; i++)
        if (drafts[i] < 0)
            return dflash_fail(DFLASH_ERR_NUMERIC, "%s: the drafter's logits for position %d are not finite (NaN "
                               "or +inf): its weights or config.json give no usable numbers", dflash_st_path(h->st),
                               positions[i / n_drafts] + 1 + i % n_drafts);
    return DFLASH_OK;
}

static dflash_status head_propose(dflash_proposer *p, void **states, int n_seqs, const int32_t *last_tokens,
                                  const int32_t *positions, int n_drafts, int32_t *drafts)
{
    dflash_head *h = p->self;
    const int32_t *dev;
    DFLASH_TRY(head_propose_dev(p, states, n_seqs, last_tokens, positions, n_drafts, &dev));
    DFLASH_TRY(h->be->ops->download(h->be, drafts, dev, (size_t)n_seqs * (size_t)n_drafts * sizeof(int32_t)));
    return head_check_drafts(p, drafts, n_seqs, positions, n_drafts);
}

static dflash_status head_after_verify(dflash_proposer *p, void **states, int n_seqs, const dflash_ctx_rows *rows)
{
    return ctx_append(p->self, (dflash_proposer_state **)states, rows, n_seqs);
}

static void head_destroy(dflash_proposer *p) { dflash_head_free(p->self); }

static const dflash_proposer_ops k_dflash_ops = {
    .name = head_name,
    .block_size = head_block_size,
    .tap_layers = head_tap_layers,
    .alloc_state = head_alloc_state,
    .free_state = head_free_state,
    .reset = head_reset,
    .begin = head_begin,
    .propose = head_propose,
    .propose_dev = head_propose_dev,
    .check_drafts = head_check_drafts,
    .after_verify = head_after_verify,
    .destroy = head_destroy,
};
