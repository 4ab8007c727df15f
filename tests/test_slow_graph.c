/* test_slow_graph.c: forwards replayed from captured graphs give what
 * running them does. A test backend over the CPU records the ops enqueued
 * while capturing (their arguments copied, nothing run) and a replay runs
 * the recorded ops on whatever device memory holds then, as a CUDA graph
 * does; uploads, downloads and syncs are refused while capturing, as on
 * the GPU. So a host value a forward's ops read that its graph key misses
 * (a replay with another shape's arguments), or a wait inside the ops a
 * graph holds, shows here on the CPU, bit for bit against the plain CPU
 * backend. */
#include <stdlib.h>

#include "harness.h"

#include "backend/cpu/cpu_internal.h"
#include "backend/graph.h"
#include "draft/dflash_head.h"
#include "fixture.h"
#include "oracle_proposer.h"

static dflash_backend *be; /* the plain CPU backend */

/* ---- the recording backend ---------------------------------------------- */

enum { OP_EMBED, OP_ADD_RMSNORM, OP_ADD, OP_ADD_BIAS, OP_LINEAR, OP_NORM_ROPE, OP_SWIGLU, OP_KV_WRITE,
       OP_ATTENTION, OP_COPY_ROWS, OP_GATHER_SUM, OP_SIGMOID_MUL, OP_ARGMAX, OP_CONV_SILU, OP_DELTA_RULE,
       OP_MOE_ROUTE, OP_LINEAR_EXPERTS };

typedef struct rec_op {
    int op;
    const void *in[5];
    void *out[2];
    int64_t n[4];
    float f;
    /* an op's weight by value: callers may pass a weight that lives on
     * their stack (a group's weights gathered for one call), which a GPU
     * launch reads once, when it is enqueued */
    dflash_weight w;
    int has_w;
    dflash_attn_args attn;
    dflash_rec_args rec;
    dflash_delta_args delta;
    dflash_route_args route;
    dflash_experts_args experts;
} rec_op;

typedef struct rec_graph {
    rec_op *ops;
    int n, cap;
} rec_graph;

static struct {
    int capturing, refused;
    rec_graph *g;
    int captures, launches, replayed_ops, failed;
} G;

static rec_op *record(int op)
{
    rec_graph *g = G.g;
    if (g->n == g->cap) {
        int cap = g->cap ? 2 * g->cap : 64;
        rec_op *p = realloc(g->ops, (size_t)cap * sizeof *p);
        if (!p)
            return NULL;
        g->ops = p;
        g->cap = cap;
    }
    rec_op *r = &g->ops[g->n++];
    memset(r, 0, sizeof *r);
    r->op = op;
    return r;
}

#define CPU dflash_cpu_ops_table

static void keep_w(rec_op *r, const dflash_weight *w)
{
    r->has_w = w != NULL;
    if (w)
        r->w = *w;
}
static const dflash_weight *rw(const rec_op *r) { return r->has_w ? &r->w : NULL; }

/* Every wrapper: recorded while capturing (out of memory: a failed op),
 * else the CPU op. */
#define RECORD_OR_RUN(OP, FILL, CALL)                                                                  \
    do {                                                                                               \
        if (G.capturing) {                                                                             \
            rec_op *r = record(OP);                                                                    \
            if (!r)                                                                                    \
                return dflash_fail(DFLASH_ERR_OOM, "recording backend: out of memory");                \
            FILL;                                                                                      \
            return DFLASH_OK;                                                                          \
        }                                                                                              \
        return CALL;                                                                                   \
    } while (0)

static dflash_status r_embed(dflash_backend *b, const dflash_weight *t, const int32_t *ids, int n, float *out)
{
    RECORD_OR_RUN(OP_EMBED, (keep_w(r, t), r->in[1] = ids, r->n[0] = n, r->out[0] = out),
                  CPU.embed(b, t, ids, n, out));
}
static dflash_status r_add_rmsnorm(dflash_backend *b, float *x, const float *d, const dflash_weight *w, int n, int dim,
                                   float eps, float *out)
{
    RECORD_OR_RUN(OP_ADD_RMSNORM,
                  (r->out[0] = x, r->in[0] = d, keep_w(r, w), r->n[0] = n, r->n[1] = dim, r->f = eps, r->out[1] = out),
                  CPU.add_rmsnorm(b, x, d, w, n, dim, eps, out));
}
static dflash_status r_add(dflash_backend *b, float *x, const float *d, size_t count)
{
    RECORD_OR_RUN(OP_ADD, (r->out[0] = x, r->in[0] = d, r->n[0] = (int64_t)count), CPU.add(b, x, d, count));
}
static dflash_status r_add_bias(dflash_backend *b, float *x, const dflash_weight *w, int n, int cols)
{
    RECORD_OR_RUN(OP_ADD_BIAS, (r->out[0] = x, keep_w(r, w), r->n[0] = n, r->n[1] = cols),
                  CPU.add_bias(b, x, w, n, cols));
}
static dflash_status r_linear(dflash_backend *b, const float *x, int n, const dflash_weight *w, float *out)
{
    RECORD_OR_RUN(OP_LINEAR, (r->in[0] = x, r->n[0] = n, keep_w(r, w), r->out[0] = out), CPU.linear(b, x, n, w, out));
}
static dflash_status r_norm_rope(dflash_backend *b, float *x, const dflash_weight *norm, const int32_t *pos, int n,
                                 int heads, int hd, float eps, const dflash_rope *rope)
{
    RECORD_OR_RUN(OP_NORM_ROPE,
                  (r->out[0] = x, keep_w(r, norm), r->in[1] = pos, r->n[0] = n, r->n[1] = heads, r->n[2] = hd,
                   r->f = eps, r->in[2] = rope),
                  CPU.norm_rope(b, x, norm, pos, n, heads, hd, eps, rope));
}
static dflash_status r_swiglu(dflash_backend *b, const float *gate, const float *up, size_t count, float *out)
{
    RECORD_OR_RUN(OP_SWIGLU, (r->in[0] = gate, r->in[1] = up, r->n[0] = (int64_t)count, r->out[0] = out),
                  CPU.swiglu(b, gate, up, count, out));
}
static dflash_status r_kv_write(dflash_backend *b, const dflash_kv_layout *kv, int layer, const int32_t *pt,
                                int pt_len, const int32_t *row_seq, const int32_t *pos, const float *k, const float *v,
                                int n)
{
    RECORD_OR_RUN(OP_KV_WRITE,
                  (r->in[0] = kv, r->n[0] = layer, r->in[1] = pt, r->n[1] = pt_len, r->in[2] = row_seq,
                   r->in[3] = pos, r->in[4] = k, r->out[0] = (void *)v, r->n[2] = n),
                  CPU.kv_write(b, kv, layer, pt, pt_len, row_seq, pos, k, v, n));
}
static dflash_status r_attention(dflash_backend *b, const dflash_attn_args *a)
{
    RECORD_OR_RUN(OP_ATTENTION, (r->attn = *a), CPU.attention(b, a));
}
static dflash_status r_copy_rows(dflash_backend *b, float *dst, int64_t ds, const float *src, int64_t ss,
                                 const int32_t *idx, int n, int64_t cols)
{
    RECORD_OR_RUN(OP_COPY_ROWS,
                  (r->out[0] = dst, r->n[0] = ds, r->in[0] = src, r->n[1] = ss, r->in[1] = idx, r->n[2] = n,
                   r->n[3] = cols),
                  CPU.copy_rows(b, dst, ds, src, ss, idx, n, cols));
}
static dflash_status r_gather_sum(dflash_backend *b, float *out, const float *src, const int32_t *idx, const float *w,
                                  int n, int k, int64_t cols)
{
    RECORD_OR_RUN(OP_GATHER_SUM,
                  (r->out[0] = out, r->in[0] = src, r->in[1] = idx, r->in[2] = w, r->n[0] = n, r->n[1] = k,
                   r->n[2] = cols),
                  CPU.gather_sum(b, out, src, idx, w, n, k, cols));
}
static dflash_status r_sigmoid_mul(dflash_backend *b, float *x, const float *g, int n, int64_t cols, int64_t g_cols)
{
    RECORD_OR_RUN(OP_SIGMOID_MUL, (r->out[0] = x, r->in[0] = g, r->n[0] = n, r->n[1] = cols, r->n[2] = g_cols),
                  CPU.sigmoid_mul(b, x, g, n, cols, g_cols));
}
static dflash_status r_argmax(dflash_backend *b, const float *x, int n, int cols, int32_t *out)
{
    RECORD_OR_RUN(OP_ARGMAX, (r->in[0] = x, r->n[0] = n, r->n[1] = cols, r->out[0] = out),
                  CPU.argmax(b, x, n, cols, out));
}

/* A hybrid's recurrent ops and a MoE's routing and experts: each one
 * launch on the GPU, reading the records' entries, the routing's logits
 * and the experts' groups (first[]) from device memory when it runs. */
static dflash_status r_conv_silu(dflash_backend *b, const dflash_rec_args *ra, const float *x, const dflash_weight *w,
                                 int n, int channels, int kernel, float *out)
{
    RECORD_OR_RUN(OP_CONV_SILU,
                  (r->rec = *ra, r->in[0] = x, keep_w(r, w), r->n[0] = n, r->n[1] = channels, r->n[2] = kernel,
                   r->out[0] = out),
                  CPU.conv_silu(b, ra, x, w, n, channels, kernel, out));
}
static dflash_status r_delta_rule(dflash_backend *b, const dflash_rec_args *ra, const dflash_delta_args *a)
{
    RECORD_OR_RUN(OP_DELTA_RULE, (r->rec = *ra, r->delta = *a), CPU.delta_rule(b, ra, a));
}
static dflash_status r_moe_route(dflash_backend *b, const dflash_route_args *a)
{
    RECORD_OR_RUN(OP_MOE_ROUTE, (r->route = *a), CPU.moe_route(b, a));
}
static dflash_status r_linear_experts(dflash_backend *b, const dflash_experts_args *a)
{
    RECORD_OR_RUN(OP_LINEAR_EXPERTS, (r->experts = *a), CPU.linear_experts(b, a));
}

static dflash_status replay_op(dflash_backend *b, const rec_op *r)
{
    switch (r->op) {
    case OP_EMBED:
        return CPU.embed(b, rw(r), r->in[1], (int)r->n[0], r->out[0]);
    case OP_ADD_RMSNORM:
        return CPU.add_rmsnorm(b, r->out[0], r->in[0], rw(r), (int)r->n[0], (int)r->n[1], r->f, r->out[1]);
    case OP_ADD:
        return CPU.add(b, r->out[0], r->in[0], (size_t)r->n[0]);
    case OP_ADD_BIAS:
        return CPU.add_bias(b, r->out[0], rw(r), (int)r->n[0], (int)r->n[1]);
    case OP_LINEAR:
        return CPU.linear(b, r->in[0], (int)r->n[0], rw(r), r->out[0]);
    case OP_NORM_ROPE:
        return CPU.norm_rope(b, r->out[0], rw(r), r->in[1], (int)r->n[0], (int)r->n[1], (int)r->n[2], r->f,
                             r->in[2]);
    case OP_SWIGLU:
        return CPU.swiglu(b, r->in[0], r->in[1], (size_t)r->n[0], r->out[0]);
    case OP_KV_WRITE:
        return CPU.kv_write(b, r->in[0], (int)r->n[0], r->in[1], (int)r->n[1], r->in[2], r->in[3], r->in[4],
                            r->out[0], (int)r->n[2]);
    case OP_ATTENTION:
        return CPU.attention(b, &r->attn);
    case OP_COPY_ROWS:
        return CPU.copy_rows(b, r->out[0], r->n[0], r->in[0], r->n[1], r->in[1], (int)r->n[2], r->n[3]);
    case OP_GATHER_SUM:
        return CPU.gather_sum(b, r->out[0], r->in[0], r->in[1], r->in[2], (int)r->n[0], (int)r->n[1], r->n[2]);
    case OP_SIGMOID_MUL:
        return CPU.sigmoid_mul(b, r->out[0], r->in[0], (int)r->n[0], r->n[1], r->n[2]);
    case OP_ARGMAX:
        return CPU.argmax(b, r->in[0], (int)r->n[0], (int)r->n[1], r->out[0]);
    case OP_CONV_SILU:
        return CPU.conv_silu(b, &r->rec, r->in[0], rw(r), (int)r->n[0], (int)r->n[1], (int)r->n[2], r->out[0]);
    case OP_DELTA_RULE:
        return CPU.delta_rule(b, &r->rec, &r->delta);
    case OP_MOE_ROUTE:
        return CPU.moe_route(b, &r->route);
    case OP_LINEAR_EXPERTS:
        return CPU.linear_experts(b, &r->experts);
    }
    return dflash_fail(DFLASH_ERR_INVALID_ARG, "recording backend: op %d", r->op);
}

/* What a graph cannot hold, refused while capturing. */
static dflash_status refuse(const char *what)
{
    G.refused++;
    return dflash_fail(DFLASH_ERR_BACKEND, "recording backend: %s while capturing", what);
}
static dflash_status r_upload(dflash_backend *b, void *dst, const void *src, size_t n)
{
    return G.capturing ? refuse("upload") : CPU.upload(b, dst, src, n);
}
static dflash_status r_download(dflash_backend *b, void *dst, const void *src, size_t n)
{
    return G.capturing ? refuse("download") : CPU.download(b, dst, src, n);
}
static dflash_status r_sync(dflash_backend *b) { return G.capturing ? refuse("sync") : CPU.sync(b); }

static dflash_status r_capture_begin(dflash_backend *b)
{
    (void)b;
    if (G.capturing)
        return dflash_fail(DFLASH_ERR_INVALID_ARG, "recording backend: a capture is open");
    G.g = calloc(1, sizeof *G.g);
    if (!G.g)
        return dflash_fail(DFLASH_ERR_OOM, "recording backend: out of memory");
    G.capturing = 1;
    G.refused = 0;
    return DFLASH_OK;
}

static void r_graph_free(dflash_backend *b, void *graph)
{
    (void)b;
    rec_graph *g = graph;
    if (g)
        free(g->ops);
    free(g);
}

static dflash_status r_capture_end(dflash_backend *b, void **graph)
{
    G.capturing = 0;
    *graph = NULL;
    if (G.refused) {
        G.failed++;
        r_graph_free(b, G.g);
        return dflash_fail(DFLASH_ERR_BACKEND, "recording backend: %d ops refused while capturing", G.refused);
    }
    G.captures++;
    *graph = G.g;
    return DFLASH_OK;
}

static dflash_status r_graph_launch(dflash_backend *b, void *graph, int *stale)
{
    const rec_graph *g = graph;
    *stale = 0;
    G.launches++;
    for (int i = 0; i < g->n; i++) {
        G.replayed_ops++;
        DFLASH_TRY(replay_op(b, &g->ops[i]));
    }
    return DFLASH_OK;
}

/* The CPU's ops with the recording ones over them. The CPU backend's
 * context serves both. */
static dflash_backend_ops g_rec_ops;
static dflash_backend g_rec;

static dflash_backend *recording_backend(void)
{
    g_rec_ops = CPU;
    g_rec_ops.name = "cpu-recording";
    g_rec_ops.destroy = NULL; /* the plain backend owns the context */
    g_rec_ops.upload = r_upload;
    g_rec_ops.download = r_download;
    g_rec_ops.sync = r_sync;
    g_rec_ops.embed = r_embed;
    g_rec_ops.add_rmsnorm = r_add_rmsnorm;
    g_rec_ops.add = r_add;
    g_rec_ops.add_bias = r_add_bias;
    g_rec_ops.linear = r_linear;
    g_rec_ops.norm_rope = r_norm_rope;
    g_rec_ops.swiglu = r_swiglu;
    g_rec_ops.kv_write = r_kv_write;
    g_rec_ops.attention = r_attention;
    g_rec_ops.copy_rows = r_copy_rows;
    g_rec_ops.gather_sum = r_gather_sum;
    g_rec_ops.sigmoid_mul = r_sigmoid_mul;
    g_rec_ops.argmax = r_argmax;
    g_rec_ops.conv_silu = r_conv_silu;
    g_rec_ops.delta_rule = r_delta_rule;
    g_rec_ops.moe_route = r_moe_route;
    g_rec_ops.linear_experts = r_linear_experts;
    g_rec_ops.capture_begin = r_capture_begin;
    g_rec_ops.capture_end = r_capture_end;
    g_rec_ops.graph_launch = r_graph_launch;
    g_rec_ops.graph_free = r_graph_free;
    g_rec = (dflash_backend){ &g_rec_ops, be->ctx };
    return &g_rec;
}

/* ---- the checks ----------------------------------------------------------- */

/* One forward of `n` rows of seq on m, for its last n_out rows (argmax_only:
 * their greedy tokens, else their logits), copied out: the recording
 * model's forward must give the plain one's bits. */
static int forward_same(dflash_qwen3 *m, dflash_kv_seq *s, dflash_qwen3 *ref, dflash_kv_seq *rs, const int32_t *tok,
                        int n, int n_out, int argmax_only, const char *what)
{
    int32_t pos[16], row_seq[16], sel[16];
    for (int i = 0; i < n; i++) {
        pos[i] = s->len + i;
        row_seq[i] = 0;
        sel[i] = n - n_out + i;
    }
    const int V = m->cfg.vocab_size;
    dflash_qwen3_batch b = { .n_rows = n, .tokens = tok, .positions = pos, .row_seq = row_seq, .n_seqs = 1,
                             .seqs = &s, .n_logit_rows = n_out, .logit_rows = sel, .argmax_only = argmax_only };
    float *logits = NULL, *want = NULL;
    static float got[16 * 1024];
    int32_t ids[16], want_ids[16];
    if (dflash_qwen3_forward(m, &b, &logits, NULL) != DFLASH_OK)
        return 0;
    if (argmax_only)
        memcpy(ids, m->s.best, (size_t)n_out * sizeof *ids);
    else if ((size_t)n_out * V <= sizeof got / sizeof got[0])
        memcpy(got, logits, (size_t)n_out * V * sizeof(float));
    else
        return 0;
    b.seqs = &rs;
    if (dflash_qwen3_forward(ref, &b, &want, NULL) != DFLASH_OK)
        return 0;
    if (argmax_only)
        memcpy(want_ids, ref->s.best, (size_t)n_out * sizeof *ids);
    const int same = argmax_only ? !memcmp(ids, want_ids, (size_t)n_out * sizeof *ids)
                                 : !memcmp(got, want, (size_t)n_out * V * sizeof(float));
    CHECKF(same, "%s: the replayed forward differs from the plain one", what);
    return same;
}

/* Decodes and verifies of several widths, each shape many times (its
 * eager calls, its capture, its replays), with rollbacks as a speculative
 * loop makes them, on a Qwen3, a Llama, a Qwen3-MoE and two Qwen3.5
 * hybrids (dense and MoE: their records resume where each forward
 * starts): every forward's output equals the plain backend's bit for bit,
 * and most of them were replays. */
static void test_target_replays_equal_plain(void)
{
    const char *rels[] = { "qwen3/gqa_tied", "llama/llama31_gqa", "qwen3_moe/moe_experts", "qwen35/q35_dense",
                           "qwen35/q35_moe_text" };
    dflash_backend *rb = recording_backend();
    for (size_t k = 0; k < sizeof rels / sizeof rels[0]; k++) {
        char dir[512];
        dflash_qwen3_opts o;
        dflash_qwen3_default_opts(&o);
        o.max_rows = 16;
        o.max_ctx = 400;
        fx_path(dir, sizeof dir, rels[k], NULL);
        dflash_qwen3 *m = NULL, *ref = NULL;
        CHECK_OK(dflash_qwen3_load(dir, rb, &o, &m));
        CHECK_OK(dflash_qwen3_load(dir, be, &o, &ref));
        if (!m || !ref) {
            dflash_qwen3_free(m);
            dflash_qwen3_free(ref);
            continue;
        }
        CHECK(m->s.graphs.on && !ref->s.graphs.on);
        memset(&G, 0, sizeof G);
        dflash_kv_seq s, r;
        CHECK_OK(dflash_qwen3_seq_init(m, &s));
        CHECK_OK(dflash_qwen3_seq_init(ref, &r));
        const int V = m->cfg.vocab_size;
        int32_t tok[16];
        int ok = 1;
        /* 120 steps: a 4-row verify with every row's logits, a 4-row chunk
         * with its last row's logits, a 4-row verify of the greedy tokens
         * and an 8-row one (rolled back after each), then keep 1..3 rows of
         * the last and decode one with its logits: shapes that differ in
         * one value only (the rows; the logit rows; logits or tokens).
         * The context crosses the 256-key bucket (past 256 positions). */
        for (int step = 0; step < 120 && ok; step++) {
            for (int i = 0; i < 16; i++)
                tok[i] = (int32_t)((step * 37 + i * 11 + 5) % V);
            const int32_t at = s.len;
            ok = forward_same(m, &s, ref, &r, tok, 4, 4, 0, rels[k]);
            dflash_kv_seq_truncate(&s, at);
            dflash_kv_seq_truncate(&r, at);
            ok = ok && forward_same(m, &s, ref, &r, tok, 4, 1, 0, rels[k]);
            dflash_kv_seq_truncate(&s, at);
            dflash_kv_seq_truncate(&r, at);
            ok = ok && forward_same(m, &s, ref, &r, tok, 4, 4, 1, rels[k]);
            dflash_kv_seq_truncate(&s, at);
            dflash_kv_seq_truncate(&r, at);
            ok = ok && forward_same(m, &s, ref, &r, tok, 8, 8, 1, rels[k]);
            const int keep = 1 + step % 3;
            dflash_kv_seq_truncate(&s, at + keep);
            dflash_kv_seq_truncate(&r, at + keep);
            ok = ok && forward_same(m, &s, ref, &r, tok + 8, 1, 1, 0, rels[k]);
        }
        CHECKF(ok, "%s: stopped at a difference (or a failed forward: %s)", rels[k], dflash_last_error());
        CHECKF(s.len > 256, "%s: the context reached %d positions", rels[k], s.len);
        /* five shapes at two key buckets: a few captures, most calls replays */
        CHECKF(G.captures >= 10 && G.launches >= 500 && G.failed == 0, "%s: %d captures, %d replays, %d failed",
               rels[k], G.captures, G.launches, G.failed);
        dflash_qwen3_seq_free(m, &s);
        dflash_qwen3_seq_free(ref, &r);
        dflash_qwen3_free(m);
        dflash_qwen3_free(ref);
    }
}

/* Speculative decoding with a DFlash drafter on the recording backend
 * (the target's verifies, the drafter's block forwards and context passes
 * replayed) gives the plain CPU's greedy output: at a fixed block, with
 * the cost-aware width (many verify widths and draft counts), and with a
 * context window of 3 positions (context passes that skip rows); on
 * dense targets, a Qwen3-MoE and a Qwen3.5-MoE hybrid (d6_moe's taps fit
 * both). */
static void test_spec_with_graphs_equals_plain(void)
{
    const char *drafters[] = { "d2_tied", "d3_sliding", "d6_moe", "d6_moe" };
    const char *targets[] = { NULL, NULL, NULL, "qwen35/q35_moe_text" }; /* NULL: the drafter's own */
    const int blocks[] = { 16, 0, 16 }, caps[] = { 0, 0, 3 }; /* block 0: the cost-aware width */
    dflash_backend *rb = recording_backend();
    for (size_t k = 0; k < sizeof drafters / sizeof drafters[0]; k++) {
        char tdir[512], ddir[512];
        if (targets[k])
            fx_path(tdir, sizeof tdir, targets[k], NULL);
        else if (!fx_drafter_target(drafters[k], tdir, sizeof tdir)) {
            CHECKF(0, "%s: meta.json with a target", drafters[k]);
            continue;
        }
        fx_path(ddir, sizeof ddir, "dflash", drafters[k]);
        dflash_qwen3_opts to;
        dflash_qwen3_default_opts(&to);
        to.max_ctx = 400;
        to.max_rows = 32;
        dflash_qwen3 *plain_t = NULL, *t = NULL;
        CHECK_OK(dflash_qwen3_load(tdir, be, &to, &plain_t));
        CHECK_OK(dflash_qwen3_load(tdir, rb, &to, &t));
        int32_t prompt[50], plain[120], out[120];
        int n_plain = 0, n_out = 0;
        dflash_gen_stats st;
        if (plain_t) {
            for (int i = 0; i < 50; i++)
                prompt[i] = (int32_t)(((i % 7) * 31 + 17 + (i / 21)) % plain_t->cfg.vocab_size);
            CHECK_OK(oracle_generate(plain_t, NULL, prompt, 50, 120, 0, 1.0, plain, &n_plain, &st));
        }
        for (size_t c = 0; c < sizeof blocks / sizeof blocks[0] && plain_t && t; c++) {
            dflash_head_opts ho;
            dflash_head_default_opts(&ho);
            ho.max_ctx = 400;
            ho.ctx_cap = caps[c];
            dflash_head *h = NULL;
            CHECK_OK(dflash_head_load(ddir, t, &ho, &h));
            if (!h)
                continue;
            memset(&G, 0, sizeof G);
            CHECK_OK(oracle_generate(t, &h->proposer, prompt, 50, 120, blocks[c], 1.0, out, &n_out, &st));
            CHECKF(n_out == n_plain && !memcmp(out, plain, (size_t)n_plain * sizeof *out),
                   "%s on %s, block %d cap %d: speculative output with graphs differs from plain", drafters[k],
                   tdir, blocks[c], caps[c]);
            CHECKF(G.launches > 0 && G.failed == 0 && h->s.graphs.captures > 0,
                   "%s on %s, block %d cap %d: %d replays, %d failed captures, %d by the drafter", drafters[k],
                   tdir, blocks[c], caps[c], G.launches, G.failed, h->s.graphs.captures);
            dflash_head_free(h);
        }
        dflash_qwen3_free(t);
        dflash_qwen3_free(plain_t);
    }
}

int main(void)
{
    dflash_backend_cpu_create(&be);
    RUN(test_target_replays_equal_plain);
    RUN(test_spec_with_graphs_equals_plain);
    dflash_backend_destroy(be);
    TEST_END();
}
