/* moe.h: the sparse MLP of a Qwen3-MoE layer: its weights (a router and
 * num_experts SwiGLU experts, bound from either checkpoint layout) and its
 * forward over a batch of rows.
 *
 * For each row: router logits = x R^T; softmax over the experts (f32); the
 * num_experts_per_tok most probable experts, their probabilities divided
 * by their sum when norm_topk_prob; out = sum over those experts, in
 * ascending expert order, of p_e * down_e(silu(gate_e(x)) * up_e(x)), then
 * plus the shared expert's output where there is one (Qwen3.5-MoE). This
 * is the order transformers' eager experts path adds them in (index_add per
 * expert, experts ascending; its grouped path sums a row's k outputs in
 * top-k order, which differs by rounding only), and it does not depend on
 * the other rows.
 *
 * The rows are grouped by expert, so each expert's weights are read once
 * per forward however many rows chose it: the backend's moe_route and
 * linear_experts stages (on a GPU both run on the device, with no wait for
 * the host; elsewhere the routing runs on the host). */
#ifndef DFLASH_TARGET_MOE_H
#define DFLASH_TARGET_MOE_H

#include "backend/backend.h"
#include "backend/weight_bind.h"
#include "io/hf_config.h"

enum { QWEN3_MOE_GATE, QWEN3_MOE_UP, QWEN3_MOE_DOWN, QWEN3_MOE_PARTS };

typedef struct qwen3_moe {
    dflash_weight router;   /* [E, H]: mlp.gate.weight */
    dflash_weight *experts; /* [ne * QWEN3_MOE_PARTS]: expert e's gate, up [I, H] and down [H, I] at
                               e * QWEN3_MOE_PARTS; NULL on a dense layer (owned, see qwen3_moe_release) */
    /* A Qwen3.5-MoE's shared expert (shared_gate.data == NULL: none), which
     * every row runs: out += sigmoid(x shared_gate^T) * down(silu(gate(x)) * up(x)). */
    dflash_weight shared[QWEN3_MOE_PARTS]; /* gate, up [Is, H], down [H, Is] */
    dflash_weight shared_gate;             /* [1, H] */
    /* The shared expert has the routed experts' dtype and shape (Is = I):
     * it is also expert E of `experts` and the tables, and runs in the
     * experts' launches as one more entry of every row (moe_route's
     * shared_logit), so ne = E + 1; else ne = E and it runs apart. */
    int shared_joined;
    /* backend [QWEN3_MOE_PARTS * ne]: the experts' data pointers and, with
     * fp8 weights, their scales' (else NULL), part-major (see
     * dflash_experts_args); NULL when bound without a backend */
    const void *const *ptrs;
    const float *const *scale_ptrs;
} qwen3_moe;

/* Scratch of the sparse MLP for R rows (k = num_experts_per_tok). */
typedef struct qwen3_moe_bufs {
    /* kr = k + 1 where the config has a shared expert (the most a joined
     * one takes), else k; ne likewise E + 1 or E */
    float *logits;            /* backend [R, E] router logits */
    float *xg, *y;            /* backend [R * kr, H]: rows gathered by expert, and the experts' outputs */
    float *gate, *up;         /* backend [R * kr, I] */
    int32_t *expert, *src, *slot; /* backend [R * kr]: the routing (dflash_route_args) */
    int32_t *first;               /* backend [ne + 1] */
    float *prob;                  /* backend [R * kr] */
    float *sh_gate, *sh_up;       /* backend [R, Is]: the shared expert's (with shared_expert_intermediate_size) */
    float *sh_out, *sh_logit;     /* backend [R, H] and [R] */
    /* host: while `on`, the experts given rows are added to `experts` over
     * every sparse layer of every forward (a benchmark's floor counts the
     * bytes of these experts only; each layer then waits for its routing) */
    struct qwen3_moe_tally { int on; int64_t experts; } *tally;
    int32_t *h_first;             /* host [E + 1]: the tally's copy of first */
} qwen3_moe_bufs;

/* Binds "<prefix>mlp.gate.weight" and the experts, stored either one
 * tensor per expert and projection ("<prefix>mlp.experts.<e>.gate_proj.weight",
 * the published layout) or stacked ("<prefix>mlp.experts.gate_up_proj"
 * [E, 2I, H], gate rows first, and "<prefix>mlp.experts.down_proj"
 * [E, H, I], as transformers 5 holds them); with
 * shared_expert_intermediate_size, the shared expert
 * ("<prefix>mlp.shared_expert.{gate,up,down}_proj.weight") and its gate
 * ("<prefix>mlp.shared_expert_gate.weight") too. */
dflash_status qwen3_moe_bind(dflash_binder *b, const char *prefix, const dflash_model_config *c, qwen3_moe *m);
/* A SwiGLU MLP's gate, up [I, H] and down [H, I] (an expert, a shared
 * expert, a dense layer's MLP): "<stem>{gate,up,down}_proj.weight" into
 * w[0 .. QWEN3_MOE_PARTS). */
dflash_status qwen3_bind_swiglu(dflash_binder *b, const char *stem, int64_t H, int64_t I, dflash_weight *w);
/* Whether a config's shared expert can run joined to the routed experts
 * (as wide as they are, and room in the routing for one more); it does
 * when its weights also have their dtype. */
int qwen3_moe_shared_may_join(const dflash_model_config *c);
/* be: the backend it was bound with (NULL: bound without one). */
void qwen3_moe_release(qwen3_moe *m, dflash_backend *be);

dflash_status qwen3_moe_bufs_alloc(dflash_backend *be, const dflash_model_config *c, int rows, qwen3_moe_bufs *b);
void qwen3_moe_bufs_free(dflash_backend *be, qwen3_moe_bufs *b);

/* out [n, H] = the sparse MLP of rows x [n, H] (backend memory); where
 * qwen3_moe_defers, out is left alone and the output is qwen3_moe_sum's
 * weighted sum, which the caller adds (with the next norm, in one
 * launch where the backend fuses them). */
dflash_status qwen3_moe_forward(dflash_backend *be, const dflash_model_config *c, const qwen3_moe *m,
                                const qwen3_moe_bufs *b, const float *x, int n, float *out);
/* Whether the layer's output is its last forward's weighted sum of the
 * experts' rows (no shared expert, or one joined to them): every sparse
 * layer but one whose shared expert runs apart; never a dense layer
 * (experts NULL). */
int qwen3_moe_defers(const qwen3_moe *m);
/* That sum, as gather_sum's arguments: row i's kr terms are the experts'
 * outputs for it, weighted by their routing weights. */
dflash_gather qwen3_moe_sum(const dflash_model_config *c, const qwen3_moe *m, const qwen3_moe_bufs *b);

#endif
