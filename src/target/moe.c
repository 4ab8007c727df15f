/* moe.c: see moe.h. Owns the Qwen3-MoE sparse MLP: binding its router and
 * experts (per-expert tensors or transformers 5's stacked ones), the host
 * routing, the grouping of rows by expert and the forward built from the
 * backend's primitives. */
#include "target/moe.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- binding ------------------------------------------------------------ */

static dflash_status bind_per_expert(dflash_binder *b, const char *prefix, const dflash_model_config *c,
                                     dflash_weight *w)
{
    static const char *const proj[QWEN3_MOE_PARTS] = { "gate_proj", "up_proj", "down_proj" };
    const int64_t H = c->hidden_size, I = c->moe_intermediate_size;
    char name[256];
    for (int e = 0; e < c->num_experts; e++)
        for (int p = 0; p < QWEN3_MOE_PARTS; p++) {
            snprintf(name, sizeof name, "%smlp.experts.%d.%s.weight", prefix, e, proj[p]);
            DFLASH_TRY(dflash_bind(b, name, p == QWEN3_MOE_DOWN ? H : I, p == QWEN3_MOE_DOWN ? I : H,
                                   &w[e * QWEN3_MOE_PARTS + p]));
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

dflash_status qwen3_moe_bind(dflash_binder *b, const char *prefix, const dflash_model_config *c, qwen3_moe *m)
{
    char name[256];
    *m = (qwen3_moe){ 0 };
    snprintf(name, sizeof name, "%smlp.gate.weight", prefix);
    DFLASH_TRY(dflash_bind(b, name, c->num_experts, c->hidden_size, &m->router));
    m->experts = calloc((size_t)c->num_experts * QWEN3_MOE_PARTS, sizeof *m->experts);
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

void qwen3_moe_release(qwen3_moe *m)
{
    free(m->experts);
    m->experts = NULL;
}

/* ---- scratch ------------------------------------------------------------ */

dflash_status qwen3_moe_bufs_alloc(dflash_backend *be, const dflash_model_config *c, int rows, qwen3_moe_bufs *b)
{
    const size_t R = (size_t)rows, E = (size_t)c->num_experts, RK = R * (size_t)c->num_experts_per_tok,
                 H = (size_t)c->hidden_size, I = (size_t)c->moe_intermediate_size;
    *b = (qwen3_moe_bufs){ 0 };
    DFLASH_TRY(dflash_be_alloc_f32(be, R * E, &b->logits));
    DFLASH_TRY(dflash_be_alloc_f32(be, RK * H, &b->xg));
    DFLASH_TRY(dflash_be_alloc_f32(be, RK * H, &b->y));
    DFLASH_TRY(dflash_be_alloc_f32(be, RK * I, &b->gate));
    DFLASH_TRY(dflash_be_alloc_f32(be, RK * I, &b->up));
    DFLASH_TRY(dflash_be_alloc_i32(be, RK, &b->src));
    DFLASH_TRY(dflash_be_alloc_i32(be, RK, &b->slot));
    DFLASH_TRY(dflash_be_alloc_f32(be, RK, &b->prob));
    if (c->shared_expert_intermediate_size > 0) {
        const size_t Is = (size_t)c->shared_expert_intermediate_size;
        DFLASH_TRY(dflash_be_alloc_f32(be, R * Is, &b->sh_gate));
        DFLASH_TRY(dflash_be_alloc_f32(be, R * Is, &b->sh_up));
        DFLASH_TRY(dflash_be_alloc_f32(be, R * H, &b->sh_out));
        DFLASH_TRY(dflash_be_alloc_f32(be, R, &b->sh_logit));
    }
    b->h_logits = malloc(R * E * sizeof(float));
    b->h_prob = malloc(RK * sizeof(float));
    b->h_src = malloc(RK * sizeof(int32_t));
    b->h_slot = malloc(RK * sizeof(int32_t));
    b->h_expert = malloc(RK * sizeof(int32_t));
    b->h_first = malloc((2 * E + 1) * sizeof(int32_t)); /* first [E + 1], then a cursor per expert */
    b->experts_run = calloc(1, sizeof(int64_t));
    if (!b->h_logits || !b->h_prob || !b->h_src || !b->h_slot || !b->h_expert || !b->h_first || !b->experts_run)
        return dflash_fail(DFLASH_ERR_OOM, "moe: out of memory for the routing of %d rows", rows);
    return DFLASH_OK;
}

void qwen3_moe_bufs_free(dflash_backend *be, qwen3_moe_bufs *b)
{
    void *dev[] = { b->logits, b->xg, b->y, b->gate, b->up, b->src, b->slot, b->prob, b->sh_gate, b->sh_up,
                    b->sh_out, b->sh_logit };
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++)
        if (dev[i])
            be->ops->free(be, dev[i]);
    void *host[] = { b->h_logits, b->h_prob, b->h_src, b->h_slot, b->h_expert, b->h_first, b->experts_run };
    for (size_t i = 0; i < sizeof host / sizeof host[0]; i++)
        free(host[i]);
    *b = (qwen3_moe_bufs){ 0 };
}

/* ---- routing ------------------------------------------------------------ */

/* As transformers computes it (up to rounding: its vectorised softmax may
 * sum in another order): softmax in f32 (the largest logit subtracted, the
 * exponentials summed in expert order), the k largest probabilities
 * (lowest expert first on ties) in descending order, renormalised by their
 * sum taken in that order; then reordered by expert, the order the
 * experts' outputs are added in. */
void qwen3_moe_route(const float *logits, int n_experts, int k, int norm_topk_prob, int32_t *experts, float *prob)
{
    float p[DFLASH_MAX_EXPERTS];
    unsigned char taken[DFLASH_MAX_EXPERTS] = { 0 };
    float mx = logits[0], sum = 0.0f;
    for (int e = 1; e < n_experts; e++)
        mx = logits[e] > mx ? logits[e] : mx;
    for (int e = 0; e < n_experts; e++) {
        p[e] = expf(logits[e] - mx);
        sum += p[e];
    }
    for (int e = 0; e < n_experts; e++)
        p[e] /= sum;
    float top = 0.0f;
    for (int j = 0; j < k; j++) {
        int best = -1;
        for (int e = 0; e < n_experts; e++)
            if (!taken[e] && (best < 0 || p[e] > p[best]))
                best = e;
        taken[best] = 1;
        experts[j] = best;
        prob[j] = p[best];
        top += p[best];
    }
    if (norm_topk_prob)
        for (int j = 0; j < k; j++)
            prob[j] /= top;
    for (int j = 1; j < k; j++) /* insertion sort by expert: k is small */
        for (int i = j; i > 0 && experts[i - 1] > experts[i]; i--) {
            int32_t e = experts[i];
            float q = prob[i];
            experts[i] = experts[i - 1], prob[i] = prob[i - 1];
            experts[i - 1] = e, prob[i - 1] = q;
        }
}

/* Routes rows [0, n) and groups them: h_first[e] .. h_first[e + 1] are the
 * gathered rows of expert e (its rows in ascending order), h_src their
 * source rows, h_slot[r * k + j] where row r's j-th expert's output lands. */
static void route_and_group(const dflash_model_config *c, const qwen3_moe_bufs *b, int n)
{
    const int E = c->num_experts, k = c->num_experts_per_tok;
    int32_t *first = b->h_first, *cursor = b->h_first + E + 1;
    for (int r = 0; r < n; r++)
        qwen3_moe_route(b->h_logits + (size_t)r * E, E, k, c->norm_topk_prob, b->h_expert + (size_t)r * k,
                        b->h_prob + (size_t)r * k);
    memset(first, 0, (size_t)(E + 1) * sizeof *first);
    for (int i = 0; i < n * k; i++)
        first[b->h_expert[i] + 1]++;
    for (int e = 0; e < E; e++) {
        first[e + 1] += first[e];
        cursor[e] = first[e];
    }
    for (int r = 0; r < n; r++)
        for (int j = 0; j < k; j++) {
            const int32_t at = cursor[b->h_expert[r * k + j]]++;
            b->h_src[at] = r;
            b->h_slot[r * k + j] = at;
        }
}

/* ---- forward ------------------------------------------------------------ */

dflash_status qwen3_moe_forward(dflash_backend *be, const dflash_model_config *c, const qwen3_moe *m,
                                const qwen3_moe_bufs *b, const float *x, int n, float *out)
{
    const dflash_backend_ops *o = be->ops;
    const int E = c->num_experts, k = c->num_experts_per_tok;
    const int64_t H = c->hidden_size, I = c->moe_intermediate_size;
    DFLASH_TRY(o->linear(be, x, n, &m->router, b->logits));
    DFLASH_TRY(o->download(be, b->h_logits, b->logits, (size_t)n * E * sizeof(float)));
    route_and_group(c, b, n);
    const size_t nk = (size_t)n * k;
    DFLASH_TRY(o->upload(be, b->src, b->h_src, nk * sizeof(int32_t)));
    DFLASH_TRY(o->upload(be, b->slot, b->h_slot, nk * sizeof(int32_t)));
    DFLASH_TRY(o->upload(be, b->prob, b->h_prob, nk * sizeof(float)));
    DFLASH_TRY(o->copy_rows(be, b->xg, H, x, H, b->src, (int)nk, H));
    for (int e = 0; e < E; e++) {
        const int32_t at = b->h_first[e], rows = b->h_first[e + 1] - at;
        if (!rows)
            continue;
        ++*b->experts_run;
        const dflash_weight *w = &m->experts[e * QWEN3_MOE_PARTS];
        float *const gu[2] = { b->gate + at * I, b->up + at * I };
        DFLASH_TRY(dflash_be_linear_group(be, b->xg + at * H, rows, &w[QWEN3_MOE_GATE], 2, gu, DFLASH_ACT_SWIGLU));
        DFLASH_TRY(o->linear(be, gu[0], rows, &w[QWEN3_MOE_DOWN], b->y + at * H));
    }
    DFLASH_TRY(o->gather_sum(be, out, b->y, b->slot, b->prob, n, k, H));
    if (!m->shared_gate.data)
        return DFLASH_OK;
    /* transformers adds sigmoid(gate) * shared to the routed sum */
    float *const gu[2] = { b->sh_gate, b->sh_up };
    DFLASH_TRY(dflash_be_linear_group(be, x, n, &m->shared[QWEN3_MOE_GATE], 2, gu, DFLASH_ACT_SWIGLU));
    DFLASH_TRY(o->linear(be, b->sh_gate, n, &m->shared[QWEN3_MOE_DOWN], b->sh_out));
    DFLASH_TRY(o->linear(be, x, n, &m->shared_gate, b->sh_logit));
    DFLASH_TRY(o->sigmoid_mul(be, b->sh_out, b->sh_logit, n, H, 1));
    return o->add(be, out, b->sh_out, (size_t)n * (size_t)H);
}
