/* stage_moe.c: the MoE layer's stages, moe_route, linear_moe_route (the
 * router's projection with the routing) and linear_experts (backend.h):
 * their argument checks, the definition of the routing (what the CPU
 * backend runs in place), and the default composition a backend without
 * its own version runs (the routing on the host between a download and an
 * upload; one linear_group per expert that has rows). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"

/* As transformers computes it, up to rounding (its vectorised softmax may
 * sum in another order): the largest logit subtracted, the exponentials
 * summed in expert order; the k largest probabilities taken one at a time
 * (lowest expert first on ties) and summed in that order; the final order
 * is by expert, the order a layer adds its experts' outputs in. */
void dflash_moe_route_row(const float *logits, int n_experts, int k, int norm_topk_prob, int32_t *experts,
                          float *prob)
{
    float p[DFLASH_ROUTE_MAX_EXPERTS];
    unsigned char taken[DFLASH_ROUTE_MAX_EXPERTS] = { 0 };
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

void dflash_moe_route_rows(const dflash_route_args *r)
{
    const int n = r->n, k = r->k, E = r->n_experts, sh = r->shared_logit != NULL, kr = k + sh, ne = E + sh;
    int32_t cursor[DFLASH_ROUTE_MAX_EXPERTS];
    for (int i = 0; i < n; i++) {
        dflash_moe_route_row(r->logits + (size_t)i * E, E, k, r->norm_topk_prob, r->expert + (size_t)i * kr,
                             r->prob + (size_t)i * kr);
        if (sh) { /* the shared expert, last: sigmoid_mul's arithmetic */
            r->expert[(size_t)i * kr + k] = E;
            r->prob[(size_t)i * kr + k] = 1.0f / (1.0f + expf(-r->shared_logit[i]));
        }
    }
    /* first[] by counting, then each expert's rows in ascending row order */
    memset(r->first, 0, (size_t)(ne + 1) * sizeof *r->first);
    for (int i = 0; i < n * kr; i++)
        r->first[r->expert[i] + 1]++;
    for (int e = 0; e < ne; e++) {
        r->first[e + 1] += r->first[e];
        cursor[e] = r->first[e];
    }
    for (int i = 0; i < n * kr; i++) {
        const int32_t at = cursor[r->expert[i]]++;
        r->src[at] = i / kr;
        r->slot[i] = at;
    }
}

/* The default for a backend whose memory the host cannot read: the
 * routing on host copies between a download and an upload. */
static dflash_status route_on_host(dflash_backend *be, const dflash_route_args *r)
{
    const size_t sh = r->shared_logit != NULL, n = (size_t)r->n, E = (size_t)r->n_experts, ne = E + sh,
                 nk = n * ((size_t)r->k + sh);
    /* the shared expert's logits after the router's */
    float *logits = malloc(n * (E + sh) * sizeof *logits), *prob = malloc(nk * sizeof *prob);
    int32_t *ints = malloc((3 * nk + ne + 1) * sizeof *ints);
    dflash_status s = logits && prob && ints ? DFLASH_OK
                                             : dflash_fail(DFLASH_ERR_OOM, "moe_route: out of memory for %d rows", r->n);
    dflash_route_args h = *r;
    h.logits = logits, h.shared_logit = sh ? logits + n * E : NULL;
    h.prob = prob, h.expert = ints, h.src = ints + nk, h.slot = ints + 2 * nk, h.first = ints + 3 * nk;
    if (s == DFLASH_OK)
        s = be->ops->download(be, logits, r->logits, n * E * sizeof *logits);
    if (s == DFLASH_OK && sh)
        s = be->ops->download(be, logits + n * E, r->shared_logit, n * sizeof *logits);
    if (s == DFLASH_OK) {
        dflash_moe_route_rows(&h);
        const struct { void *dst; const void *host; size_t bytes; } up[] = {
            { r->expert, h.expert, nk * 4 }, { r->prob, h.prob, nk * 4 }, { r->first, h.first, (ne + 1) * 4 },
            { r->src, h.src, nk * 4 },       { r->slot, h.slot, nk * 4 },
        };
        for (size_t i = 0; s == DFLASH_OK && i < sizeof up / sizeof up[0]; i++)
            s = be->ops->upload(be, up[i].dst, up[i].host, up[i].bytes);
    }
    free(logits);
    free(prob);
    free(ints);
    return s;
}

static dflash_status route_check(const dflash_route_args *r)
{
    const int sh = r->shared_logit != NULL;
    if (r->n < 0 || r->n_experts < 1 || r->n_experts + sh > DFLASH_ROUTE_MAX_EXPERTS || r->k < 1 ||
        r->k > r->n_experts)
        return dflash_fail(DFLASH_ERR_INVALID_ARG, "moe_route: %d rows, %d experts%s, %d per row (1..%d experts "
                           "with the shared one, 1..experts per row)", r->n, r->n_experts,
                           sh ? " and a shared one" : "", r->k, DFLASH_ROUTE_MAX_EXPERTS);
    return DFLASH_OK;
}

dflash_status dflash_be_moe_route(dflash_backend *be, const dflash_route_args *r)
{
    DFLASH_TRY(route_check(r));
    if (r->n == 0)
        return DFLASH_OK;
    if (be->ops->moe_route)
        return be->ops->moe_route(be, r);
    return route_on_host(be, r);
}

dflash_status dflash_be_linear_moe_route_composed(dflash_backend *be, const float *x, int n, const dflash_weight *w,
                                                  int n_w, float *const *out, const dflash_route_args *r)
{
    if (n_w == 2)
        DFLASH_TRY(dflash_be_linear_group(be, x, n, w, 2, out, DFLASH_ACT_NONE));
    else
        DFLASH_TRY(be->ops->linear(be, x, n, &w[0], out[0]));
    return dflash_be_moe_route(be, r);
}

dflash_status dflash_be_linear_moe_route(dflash_backend *be, const float *x, int n, const dflash_weight *w, int n_w,
                                         float *const *out, const dflash_route_args *r)
{
    if (n_w < 1 || n_w > 2 || r->n != n || r->logits != out[0] || w[0].rows != r->n_experts ||
        (r->shared_logit && (n_w != 2 || r->shared_logit != out[1])) || (n_w == 2 && (w[1].rows != 1 || !out[1])))
        return dflash_fail(DFLASH_ERR_INVALID_ARG, "linear_moe_route: %d weights (the router's %lld rows for %d "
                           "experts) and a routing of %d rows that does not read their outputs", n_w,
                           (long long)w[0].rows, r->n_experts, r->n);
    DFLASH_TRY(route_check(r));
    if (n == 0)
        return DFLASH_OK;
    if (be->ops->linear_moe_route)
        return be->ops->linear_moe_route(be, x, n, w, n_w, out, r);
    return dflash_be_linear_moe_route_composed(be, x, n, w, n_w, out, r);
}

dflash_status dflash_be_linear_experts(dflash_backend *be, const dflash_experts_args *a)
{
    if (a->n_experts < 1 || a->w_stride < a->n_w || a->n_w < 1 || a->n_w > 2 ||
        (a->act == DFLASH_ACT_SWIGLU) != (a->n_w == 2))
        return dflash_fail(DFLASH_ERR_INVALID_ARG, "linear_experts: %d weights (stride %d) with activation %d",
                           a->n_w, a->w_stride, (int)a->act);
    for (int e = 0; e < a->n_experts; e++)
        for (int i = 0; i < a->n_w; i++) {
            const dflash_weight *w = &a->w[(size_t)e * a->w_stride + i], *w0 = &a->w[i];
            if (w->dtype != w0->dtype || w->rows != w0->rows || w->cols != w0->cols || w->cols != a->w[0].cols)
                return dflash_fail(DFLASH_ERR_SHAPE, "linear_experts: weight %s is %s [%lld, %lld], %s is %s [%lld, %lld]",
                                   w->name ? w->name : "?", dflash_dtype_name(w->dtype), (long long)w->rows,
                                   (long long)w->cols, w0->name ? w0->name : "?", dflash_dtype_name(w0->dtype),
                                   (long long)w0->rows, (long long)w0->cols);
        }
    if (a->rows <= 0)
        return DFLASH_OK;
    if (be->ops->linear_experts)
        return be->ops->linear_experts(be, a);
    return dflash_be_linear_experts_each(be, a, NULL);
}

dflash_status dflash_be_linear_experts_each(dflash_backend *be, const dflash_experts_args *a,
                                            const int32_t *host_first)
{
    int32_t *copy = NULL;
    dflash_status s = DFLASH_OK;
    if (!host_first) {
        copy = malloc((size_t)(a->n_experts + 1) * sizeof *copy);
        s = copy ? be->ops->download(be, copy, a->first, (size_t)(a->n_experts + 1) * sizeof *copy)
                 : dflash_fail(DFLASH_ERR_OOM, "linear_experts: out of memory for %d experts", a->n_experts);
    }
    const int32_t *first = host_first ? host_first : copy;
    const int64_t K = a->w[0].cols;
    if (s == DFLASH_OK && a->x_rows)
        s = be->ops->copy_rows(be, (float *)a->x, K, a->x_src, K, a->x_rows, a->rows, K);
    for (int e = 0; s == DFLASH_OK && e < a->n_experts; e++) {
        const int32_t at = first[e], rows = first[e + 1] - at;
        if (!rows)
            continue;
        const dflash_weight *w = &a->w[(size_t)e * a->w_stride];
        float *out[2] = { a->out[0] + (int64_t)at * w[0].rows, a->n_w > 1 ? a->out[1] + (int64_t)at * w[1].rows : NULL };
        s = dflash_be_linear_group(be, a->x + (int64_t)at * K, rows, w, a->n_w, out, a->act);
    }
    free(copy);
    return s;
}
