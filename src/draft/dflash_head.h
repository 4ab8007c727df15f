/* dflash_head.h: BlockDiffusionDraftHead, the DFlash block-diffusion draft
 * head (arXiv 2602.06036), implementing the DraftProposer contract.
 *
 * A small Qwen3-style transformer drafts a whole block in ONE forward: rows
 * [last token, MASK x (B-1)] attend bidirectionally to each other and to
 * context K/V built from hidden states tapped out of the target (fc ->
 * hidden_norm -> each layer's k/v projection). It has no embedding or LM
 * head of its own: the target's are shared, not copied. Names follow the
 * description this head was built from (docs/design.md lists them):
 * dflash_layer, dflash_proposer_state, dflash_scratch, dflash_kernels,
 * enum dflash_quantization, dflash_ctx_cap. */
#ifndef DFLASH_DRAFT_DFLASH_HEAD_H
#define DFLASH_DRAFT_DFLASH_HEAD_H

#include "draft/proposer.h"
#include "kv/kv_pool.h"
#include "target/qwen3.h"

/* Drafter-side weight precision (the KV cache stays f32 or bf16, never
 * fp8: fp8 drafter KV is known to destroy acceptance). */
enum dflash_quantization {
    DFLASH_QUANT_BF16 = 0,     /* the checkpoint's weights as they are */
    DFLASH_QUANT_FP8_WEIGHTS,  /* linear weights in fp8 e4m3 with per-row f32 scales */
};

/* One drafter layer: a Qwen3 layer (the checkpoint's bf16 weights, always
 * present) plus optional fp8 copies of its projections with per-row
 * scales (lin_fp8[i].data NULL when not quantized). */
typedef struct dflash_layer {
    qwen3_layer w;
    dflash_weight lin_fp8[QWEN3_LIN_COUNT];
    int sliding;  /* layer_types[i] == "sliding_attention": causal + window */
} dflash_layer;

/* Per-sequence state: the drafter's context K/V of every layer in one paged
 * cache with ONE page table shared by all layers (same shape per layer). */
typedef struct dflash_proposer_state {
    dflash_kv_seq kv;  /* kv.len = committed positions s; kv.lo = first visible */
    int budget;
} dflash_proposer_state;

/* Per-step buffers, sized at load. R = rows per call (max_seqs * B, and the
 * largest context chunk); the block's own K/V live in b.k / b.v and are
 * never kept. */
typedef struct dflash_scratch {
    qwen3_bufs b;         /* layer activations [R, ...] */
    float *z;             /* [R, H] context features: fc(taps) */
    float *hsel;          /* [R, H] rows sent to the LM head */
    float *logits;        /* [R, V] */
    int32_t *argmax;      /* [R] the drafts */
    /* a call's ids, positions (b.pos), row_seq, sel, per-sequence records
     * and page tables: filled on the host, uploaded once per call */
    dflash_fwd_inputs in;
    /* the block forward's and the context pass's ops by shape, where the
     * backend captures */
    dflash_graph_cache graphs;
} dflash_scratch;

/* Backend kernels resolved once when the head is built. The CPU backend
 * runs the generic ops and resolves none; a GPU backend fills `handles`. */
typedef struct dflash_kernels {
    const char *backend;
    int n_resolved;
    void *handles;
} dflash_kernels;

typedef struct dflash_head_opts {
    int max_seqs;        /* sequences per propose */
    int max_ctx;         /* longest sequence (positions) */
    int ctx_cap;         /* -1: dflash_ctx_cap(); 0: unbounded; else positions */
    int kv_pages;       /* 0: enough for max_seqs sequences */
    int block_size;      /* 0: the checkpoint's */
    int quant;           /* -1: from the levers; else enum dflash_quantization */
    dflash_dtype kv_dtype; /* KV pool dtype; DFLASH_DTYPE_INVALID: the backend's (f32 CPU, bf16 GPU) */
} dflash_head_opts;

void dflash_head_default_opts(dflash_head_opts *o);

typedef struct dflash_head {
    dflash_model_config cfg;
    dflash_head_opts opts;
    enum dflash_quantization quant;
    dflash_st *st;
    dflash_backend *be;
    dflash_weight fc;          /* [H, K*Ht] */
    dflash_weight hidden_norm; /* [H] */
    dflash_weight norm;        /* [H] final norm */
    dflash_layer *layers;      /* [L] */
    dflash_weight embed;       /* the target's [V, H] (shared) */
    dflash_weight lm_head;     /* the target's [V, H] (shared) */
    int block_size;
    int ctx_cap;               /* 0 = unbounded */
    int pt_len;                /* page table (ring) length per sequence */
    int max_rows;
    int last_rows;             /* rows of logits from the last propose */
    int keep_logits;           /* materialize the block's logits (tests, tools); else LM head + argmax fused */
    dflash_kv_pool kv;
    dflash_kernels kernels;
    dflash_scratch s;
    dflash_proposer proposer;  /* ->self == this head */
} dflash_head;

/* The drafter context window bound, in positions: DFLASH_CTX_CAP (default
 * 4096; 0 = no cap). The drafter keeps and attends to the most recent cap
 * committed positions; older pages go back to the pool. */
int dflash_ctx_cap(void);

/* Load a DFlash drafter folder and bind it to `target` (whose embedding and
 * LM head it shares, and whose geometry it is checked against). */
dflash_status dflash_head_load(const char *dir, dflash_qwen3 *target, const dflash_head_opts *opts,
                               dflash_head **out);
/* The same from a parsed config and an open tensor set. `st` belongs to the
 * head from this call on, also when it fails (what backs it must outlive
 * the head); `label` names the drafter in messages (e.g. its folder). */
dflash_status dflash_head_load_st(const dflash_model_config *cfg, dflash_st *st, const char *label,
                                  dflash_qwen3 *target, const dflash_head_opts *opts, dflash_head **out);
void dflash_head_free(dflash_head *h);

/* Block-forward logits of the last propose ([rows, V] with rows = n_seqs *
 * n_drafts, sequence-major, backend memory) when h->keep_logits was set
 * before it (tests and tools; the decode loop leaves it 0 so the LM head
 * and argmax run fused), else NULL. */
const float *dflash_head_last_logits(const dflash_head *h);

#endif
