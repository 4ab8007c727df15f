/* moe.c: see moe.h. Owns the Qwen3-MoE sparse MLP: binding its router,
 * experts (per-expert tensors or transformers 5's stacked ones) and shared
 * expert (and the SwiGLU binder a Qwen3.5 dense layer's MLP uses too), the
 * experts' pointer tables a device backend reads, and the forward built
 * from the backend's MoE stages and primitives. */
#include "target/moe.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- binding ------------------------------------------------------------ */

dflash_status qwen3_bind_swiglu(dflash_binder *b, const char *stem, int64_t H, int64_t I, dflash_weight *w)
{
    static const char *const proj[QWEN3_MOE_PARTS] = { "gate_proj", "up_proj", "down_proj" };
    char name[256];
    for (int p = 0; p < QWEN3_MOE_PARTS; p++) {
        snprintf(name, sizeof name, "%s%s.weight", stem, proj[p]);
        DFLASH_TRY(dflash_bind(b, name, p == QWEN3_MOE_DOWN ? H : I, p == QWEN3_MOE_DOWN ? I : H, &w[p]));
    }
    return DFLASH_OK;
}

static dflash_status bind_per_expert(dflash_binder *b, const char *prefix, const dflash_model_config *c,
                                     dflash_weight *w)
{
    char stem[224];
    for (int e = 0; e < c->num_experts; e++) {
        snprintf(stem, sizeof stem, "%smlp.experts.%d.", prefix, e);
        DFLASH_TRY(qwen3_bind_swiglu(b, stem, c->hidden_size, c->moe_intermediate_size, &w[e * QWEN3_MOE_PARTS]));
    }
    return DFLASH_OK;
}

static dflash_status bind_stacked(dflash_binder *b, const char *prefix, const dflash_model_config *c,
                                  dflash_weight *w)
{
    const int E = c->num_experts;
    const int64_t H = c->hidden_size, I = c->moe_intermediate_size;
    dflash_weight *tmp = malloc((size_t)E * 2 * sizeof *tmp);
    if (!tmp)
        return dflash_fail(DFLASH_ERR_OOM, "%s: out of memory for %d experts' weights", dflash_st_path(b->st), E);
    char name[256];
    snprintf(name, sizeof name, "%smlp.experts.gate_up_proj", prefix);
    dflash_status s = dflash_bind_stack(b, name, E, 2, I, H, tmp);
    for (int e = 0; s == DFLASH_OK && e < E; e++) {
        w[e * QWEN3_MOE_PARTS + QWEN3_MOE_GATE] = tmp[2 * e];
        w[e * QWEN3_MOE_PARTS + QWEN3_MOE_UP] = tmp[2 * e + 1];
    }
    snprintf(name, sizeof name, "%smlp.experts.down_proj", prefix);
    if (s == DFLASH_OK)
        s = dflash_bind_stack(b, name, E, 1, H, I, tmp);
    for (int e = 0; s == DFLASH_OK && e < E; e++)
        w[e * QWEN3_MOE_PARTS + QWEN3_MOE_DOWN] = tmp[e];
    free(tmp);
    return s;
}

_Static_assert(DFLASH_MAX_EXPERTS <= DFLASH_ROUTE_MAX_EXPERTS, "a configured MoE must be routable");

/* The experts' data (and fp8 scale) pointers, part-major, in backend
 * memory: what linear_experts on a device reads to find expert e's
 * weights. */
static dflash_status build_tables(dflash_backend *be, const dflash_model_config *c, qwen3_moe *m)
{
    const int ne = c->num_experts + m->shared_joined;
    const size_t n = (size_t)ne * QWEN3_MOE_PARTS;
    const void **data = malloc(n * sizeof *data);
    const float **scales = malloc(n * sizeof *scales);
    int any_scales = 0;
    dflash_status s = data && scales ? DFLASH_OK
                                     : dflash_fail(DFLASH_ERR_OOM, "moe: out of memory for %d experts' tables", ne);
    for (int p = 0; s == DFLASH_OK && p < QWEN3_MOE_PARTS; p++)
        for (int e = 0; e < ne; e++) {
            const dflash_weight *w = &m->experts[e * QWEN3_MOE_PARTS + p];
            data[(size_t)p * ne + e] = w->data;
            scales[(size_t)p * ne + e] = w->scales;
            any_scales |= w->scales != NULL;
        }
    if (s == DFLASH_OK)
        s = be->ops->alloc(be, n * sizeof *data, (void **)&m->ptrs);
    if (s == DFLASH_OK)
        s = be->ops->upload(be, (void *)m->ptrs, data, n * sizeof *data);
    if (s == DFLASH_OK && any_scales)
        s = be->ops->alloc(be, n * sizeof *scales, (void **)&m->scale_ptrs);
    if (s == DFLASH_OK && any_scales)
        s = be->ops->upload(be, (void *)m->scale_ptrs, scales, n * sizeof *scales);
    free(data);
    free((void *)scales);
    return s;
}

static dflash_status bind_experts(dflash_binder *b, const char *prefix, const dflash_model_config *c, qwen3_moe *m)
{
    char name[256];
    *m = (qwen3_moe){ 0 };
    snprintf(name, sizeof name, "%smlp.gate.weight", prefix);
    DFLASH_TRY(dflash_bind(b, name, c->num_experts, c->hidden_size, &m->router));
    /* room for a shared expert joining them */
    m->experts = calloc(((size_t)c->num_experts + 1) * QWEN3_MOE_PARTS, sizeof *m->experts);
    if (!m->experts)
        return dflash_fail(DFLASH_ERR_OOM, "%s: out of memory for %d experts' weights", dflash_st_path(b->st),
                           c->num_experts);
    snprintf(name, sizeof name, "%smlp.experts.gate_up_proj", prefix);
    if (dflash_st_find(b->st, name))
        return bind_stacked(b, prefix, c, m->experts);
    dflash_status s = bind_per_expert(b, prefix, c, m->experts);
    if (s == DFLASH_ERR_NOT_FOUND) /* neither layout: say both were looked for */
        return dflash_fail_prefix(s, "%s: no '%s' either: ", dflash_st_path(b->st), name);
    return s;
}

int qwen3_moe_shared_may_join(const dflash_model_config *c)
{
    return c->shared_expert_intermediate_size == c->moe_intermediate_size &&
           c->num_experts < DFLASH_ROUTE_MAX_EXPERTS;
}

/* The shared expert and its gate; joined to the routed experts as expert
 * E where qwen3_moe_shared_may_join and its weights have their dtype. */
static dflash_status bind_shared(dflash_binder *b, const char *prefix, const dflash_model_config *c, qwen3_moe *m)
{
    char name[224];
    snprintf(name, sizeof name, "%smlp.shared_expert.", prefix);
    DFLASH_TRY(qwen3_bind_swiglu(b, name, c->hidden_size, c->shared_expert_intermediate_size, m->shared));
    snprintf(name, sizeof name, "%smlp.shared_expert_gate.weight", prefix);
    DFLASH_TRY(dflash_bind(b, name, 1, c->hidden_size, &m->shared_gate));
    int same = qwen3_moe_shared_may_join(c);
    for (int p = 0; p < QWEN3_MOE_PARTS; p++)
        same &= m->shared[p].dtype == m->experts[p].dtype;
    if (same)
        memcpy(&m->experts[(size_t)c->num_experts * QWEN3_MOE_PARTS], m->shared, sizeof m->shared);
    m->shared_joined = same;
    return DFLASH_OK;
}

dflash_status qwen3_moe_bind(dflash_binder *b, const char *prefix, const dflash_model_config *c, qwen3_moe *m)
{
    DFLASH_TRY(bind_experts(b, prefix, c, m));
    if (c->shared_expert_intermediate_size > 0)
        DFLASH_TRY(bind_shared(b, prefix, c, m));
    return b->be ? build_tables(b->be, c, m) : DFLASH_OK;
}

void qwen3_moe_release(qwen3_moe *m, dflash_backend *be)
{
    if (be && m->ptrs)
        be->ops->free(be, (void *)m->ptrs);
    if (be && m->scale_ptrs)
        be->ops->free(be, (void *)m->scale_ptrs);
    free(m->experts);
    m->experts = NULL;
    m->ptrs = NULL;
    m->scale_ptrs = NULL;
}

/* ---- scratch ------------------------------------------------------------ */

dflash_status qwen3_moe_bufs_alloc(dflash_backend *be, const dflash_model_config *c, int rows, qwen3_moe_bufs *b)
{
    const size_t sh = c->shared_expert_intermediate_size > 0, R = (size_t)rows, E = (size_t)c->num_experts,
                 RK = R * ((size_t)c->num_experts_per_tok + sh), H = (size_t)c->hidden_size,
                 I = (size_t)c->moe_intermediate_size;
    *b = (qwen3_moe_bufs){ 0 };
    DFLASH_TRY(dflash_be_alloc_f32(be, R * E, &b->logits));
    DFLASH_TRY(dflash_be_alloc_f32(be, RK * H, &b->xg));
    DFLASH_TRY(dflash_be_alloc_f32(be, RK * H, &b->y));
    DFLASH_TRY(dflash_be_alloc_f32(be, RK * I, &b->gate));
    DFLASH_TRY(dflash_be_alloc_f32(be, RK * I, &b->up));
    DFLASH_TRY(dflash_be_alloc_i32(be, RK, &b->expert));
    DFLASH_TRY(dflash_be_alloc_i32(be, RK, &b->src));
    DFLASH_TRY(dflash_be_alloc_i32(be, RK, &b->slot));
    DFLASH_TRY(dflash_be_alloc_i32(be, E + sh + 1, &b->first));
    DFLASH_TRY(dflash_be_alloc_f32(be, RK, &b->prob));
    if (c->shared_expert_intermediate_size > 0) {
        const size_t Is = (size_t)c->shared_expert_intermediate_size;
        DFLASH_TRY(dflash_be_alloc_f32(be, R * Is, &b->sh_gate));
        DFLASH_TRY(dflash_be_alloc_f32(be, R * Is, &b->sh_up));
        DFLASH_TRY(dflash_be_alloc_f32(be, R * H, &b->sh_out));
        DFLASH_TRY(dflash_be_alloc_f32(be, R, &b->sh_logit));
    }
    b->tally = calloc(1, sizeof *b->tally);
    b->h_first = malloc((E + 1) * sizeof *b->h_first);
    if (!b->tally || !b->h_first)
        return dflash_fail(DFLASH_ERR_OOM, "moe: out of memory for the routing of %d rows", rows);
    return DFLASH_OK;
}

void qwen3_moe_bufs_free(dflash_backend *be, qwen3_moe_bufs *b)
{
    void *dev[] = { b->logits, b->xg,    b->y,    b->gate,    b->up,    b->expert, b->src,
                    b->slot,   b->first, b->prob, b->sh_gate, b->sh_up, b->sh_out, b->sh_logit };
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++)
        if (dev[i])
            be->ops->free(be, dev[i]);
    free(b->tally);
    free(b->h_first);
    *b = (qwen3_moe_bufs){ 0 };
}

/* ---- forward ------------------------------------------------------------ */

/* Adds the experts this forward gave rows to (a benchmark's tally). */
static dflash_status tally_experts(dflash_backend *be, const dflash_model_config *c, const qwen3_moe_bufs *b)
{
    const int E = c->num_experts;
    DFLASH_TRY(be->ops->download(be, b->h_first, b->first, (size_t)(E + 1) * sizeof *b->h_first));
    for (int e = 0; e < E; e++)
        b->tally->experts += b->h_first[e + 1] > b->h_first[e];
    return DFLASH_OK;
}

int qwen3_moe_defers(const qwen3_moe *m) { return m->experts && (!m->shared_gate.data || m->shared_joined); }

dflash_gather qwen3_moe_sum(const dflash_model_config *c, const qwen3_moe *m, const qwen3_moe_bufs *b)
{
    return (dflash_gather){ .src = b->y, .idx = b->slot, .w = b->prob, .k = c->num_experts_per_tok + m->shared_joined };
}

dflash_status qwen3_moe_forward(dflash_backend *be, const dflash_model_config *c, const qwen3_moe *m,
                                const qwen3_moe_bufs *b, const float *x, int n, float *out)
{
    const int E = c->num_experts, k = c->num_experts_per_tok, joined = m->shared_joined;
    const int ne = E + joined, kr = k + joined;
    /* the router and the shared expert's gate read the same x: one
     * projection, and the routing with it where the backend fuses them */
    const dflash_weight rg[2] = { m->router, m->shared_gate };
    float *const rg_out[2] = { b->logits, b->sh_logit };
    const dflash_route_args r = { .n = n, .n_experts = E, .k = k, .norm_topk_prob = c->norm_topk_prob,
                                  .logits = b->logits, .shared_logit = joined ? b->sh_logit : NULL,
                                  .expert = b->expert, .prob = b->prob, .first = b->first, .src = b->src,
                                  .slot = b->slot };
    DFLASH_TRY(dflash_be_linear_moe_route(be, x, n, rg, m->shared_gate.data ? 2 : 1, rg_out, &r));
    if (b->tally->on)
        DFLASH_TRY(tally_experts(be, c, b));
    /* gate and up with SwiGLU (reading each gathered row from x through
     * src), then down, each over every expert (a joined shared expert
     * too) at once. per_row stays k, the routed experts' count: a device
     * backend sizes its split-K by it, and a joined shared expert's rows
     * are extra work of the same launches, not a reason to split the
     * routed experts' work differently (docs/perf-notes.md) */
    dflash_experts_args ea = { .n_experts = ne, .n_w = 2, .w = &m->experts[QWEN3_MOE_GATE], .w_stride = QWEN3_MOE_PARTS,
                               .data = m->ptrs ? m->ptrs + (size_t)QWEN3_MOE_GATE * ne : NULL,
                               .scales = m->scale_ptrs ? m->scale_ptrs + (size_t)QWEN3_MOE_GATE * ne : NULL,
                               .per_row = k, .x = b->xg, .x_src = x, .x_rows = b->src, .rows = n * kr, .max_rows = n,
                               .first = b->first, .out = { b->gate, b->up }, .act = DFLASH_ACT_SWIGLU };
    DFLASH_TRY(dflash_be_linear_experts(be, &ea));
    ea.n_w = 1;
    ea.w = &m->experts[QWEN3_MOE_DOWN];
    ea.data = m->ptrs ? m->ptrs + (size_t)QWEN3_MOE_DOWN * ne : NULL;
    ea.scales = m->scale_ptrs ? m->scale_ptrs + (size_t)QWEN3_MOE_DOWN * ne : NULL;
    ea.x = b->gate;
    ea.x_src = NULL;
    ea.x_rows = NULL;
    ea.out[0] = b->y;
    ea.out[1] = NULL;
    ea.act = DFLASH_ACT_NONE;
    DFLASH_TRY(dflash_be_linear_experts(be, &ea));
    /* transformers adds sigmoid(gate) * shared to the routed sum: joined,
     * that is the last term of each row's weighted sum (its weight the
     * sigmoid, as sigmoid_mul computes it: the same products and sums in
     * the same order as apart) */
    if (qwen3_moe_defers(m))
        return DFLASH_OK; /* the caller adds qwen3_moe_sum */
    /* apart: the routed sum is written by the shared expert's last stage
     * (a fused backend adds it in the same epilogue), into out */
    float *const gu[2] = { b->sh_gate, b->sh_up };
    DFLASH_TRY(dflash_be_linear_group(be, x, n, &m->shared[QWEN3_MOE_GATE], 2, gu, DFLASH_ACT_SWIGLU));
    const dflash_gather routed = qwen3_moe_sum(c, m, b); /* the routed experts' k terms */
    return dflash_be_linear_gated_add(be, b->sh_gate, n, &m->shared[QWEN3_MOE_DOWN], b->sh_logit, b->sh_out, out,
                                      &routed);
}
