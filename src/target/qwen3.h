/* qwen3.h: the target model (Qwen3; a Llama: the same stack without the
 * q/k norms; a Qwen3-MoE: sparse MLPs, target/moe.h; a Qwen3.5 hybrid:
 * linear-attention layers with a recurrent state per sequence and gated
 * attention, target/qwen35.h): weights bound by name
 * from a Hugging Face
 * checkpoint, a forward over a batch of rows (prefill chunks, one-token
 * decode, multi-row verify) that returns logits for requested rows and the
 * hidden-state taps a DFlash drafter needs.
 *
 * A row's result never depends on which other rows share the forward: a
 * 16-row verify equals 16 one-row decodes bit for bit. */
#ifndef DFLASH_TARGET_QWEN3_H
#define DFLASH_TARGET_QWEN3_H

#include <stdint.h>

#include "backend/backend.h"
#include "backend/fwd_inputs.h"
#include "backend/graph.h"
#include "io/hf_config.h"
#include "io/safetensors.h"
#include "kv/kv_pool.h"
#include "target/qwen35_state.h"
#include "target/qwen3_layer.h"

typedef struct dflash_qwen3_opts {
    int max_rows;      /* rows per forward call (prefill is chunked by the caller) */
    int max_seqs;      /* sequences per batch */
    int kv_pages;     /* pool size in pages of DFLASH_KV_PAGE positions */
    int max_ctx;       /* longest sequence, in positions */
    dflash_dtype kv_dtype; /* KV pool dtype; DFLASH_DTYPE_INVALID: the backend's (f32 CPU, bf16 GPU) */
} dflash_qwen3_opts;

void dflash_qwen3_default_opts(dflash_qwen3_opts *o);

/* Scratch for one forward, sized at load: nothing allocates per call. */
typedef struct qwen3_scratch {
    qwen3_bufs b;                   /* layer activations [R, ...] */
    float *logits;                  /* [R, V] */
    float *taps;                    /* [R, DFLASH_MAX_TAPS * H] */
    float *hsel;                    /* [R, H] rows gathered for the LM head */
    int32_t *best;                  /* [2R]: the logit rows' argmax (greedy) or drawn tokens, then room for
                                       a step's drafts copied beside them (one download brings both) */
    dflash_fwd_inputs in;           /* ids, positions (b.pos), row_seq, sel, records, page tables */
    dflash_graph_cache graphs;      /* the forward's ops by shape, where the backend captures */
} qwen3_scratch;

typedef struct dflash_qwen3 {
    dflash_model_config cfg;
    dflash_qwen3_opts opts;
    dflash_st *st;          /* the checkpoint mapping (weights point into it on the CPU) */
    dflash_backend *be;
    dflash_weight embed;    /* [V, H] */
    dflash_weight final_norm; /* [H] */
    dflash_weight lm_head;  /* [V, H], the embedding when tied */
    qwen3_layer *layers;    /* [L] */
    dflash_kv_pool kv;      /* pages for the attention layers (a hybrid's linear-attention layers have none) */
    int kv_layer[DFLASH_MAX_LAYERS]; /* layer -> its layer in the pool */
    qwen35_state *rec;      /* a Qwen3.5 hybrid's recurrent state, else NULL */
    float *norm_host;       /* a Qwen3.5's norm weights as 1 + w (qwen3_checkpoint.norm_host) */
    int pt_len;             /* page table length of every sequence */
    qwen3_scratch s;
    int64_t n_params;
} dflash_qwen3;

/* One forward's input. Rows are sequence-major; row i belongs to
 * seqs[row_seq[i]] at absolute position positions[i]. */
typedef struct dflash_qwen3_batch {
    int n_rows;
    const int32_t *tokens;     /* host [n_rows] */
    const int32_t *positions;  /* host [n_rows] */
    const int32_t *row_seq;    /* host [n_rows] */
    int n_seqs;
    dflash_kv_seq **seqs;      /* [n_seqs] */
    int n_logit_rows;          /* rows whose logits are wanted */
    const int32_t *logit_rows; /* host [n_logit_rows] */
    int n_taps;                /* target layers to tap (0: none) */
    const int *tap_layers;     /* [n_taps] */
    int argmax_only;           /* 1: the logit rows' argmax into m->s.best (LM head and
                                  argmax fused where the backend can), no logits */
    /* Tokens already in backend memory (a proposer's drafts, never
     * brought to the host): when set, row dev_row0 + i * dev_row_stride + c
     * takes dev_tokens[i * dev_cols + c] (i < dev_n, c < dev_cols), and
     * tokens[] holds any id of the vocabulary there. */
    const int32_t *dev_tokens;
    int dev_n, dev_cols, dev_row0, dev_row_stride;
} dflash_qwen3_batch;

/* Load a Qwen3 folder (config.json + safetensors). */
dflash_status dflash_qwen3_load(const char *dir, dflash_backend *be, const dflash_qwen3_opts *opts,
                                dflash_qwen3 **out);
/* The same from a parsed config and an open tensor set (for instance an
 * in-memory image built by `dflash bench`). `st` belongs to the model from
 * this call on, also when it fails; on the CPU backend the weights point
 * into it, so whatever backs the set must outlive the model. Messages name
 * dflash_st_path(st). */
dflash_status dflash_qwen3_load_st(const dflash_model_config *cfg, dflash_st *st, dflash_backend *be,
                                   const dflash_qwen3_opts *opts, dflash_qwen3 **out);
void dflash_qwen3_free(dflash_qwen3 *m);

dflash_status dflash_qwen3_seq_init(dflash_qwen3 *m, dflash_kv_seq *seq);
void dflash_qwen3_seq_free(dflash_qwen3 *m, dflash_kv_seq *seq);

/* Run the batch. On success the KV of every row is stored, each seq's len
 * covers its rows, and (in backend memory, valid until the next forward):
 *   *logits = [n_logit_rows, V] (NULL with argmax_only: m->s.best
 *   [n_logit_rows] holds each row's argmax), *taps = [n_rows, n_taps * H]
 *   (NULL if none), m->s.in.ids [n_rows] the rows' tokens (dev_tokens'
 *   among them). */
dflash_status dflash_qwen3_forward(dflash_qwen3 *m, const dflash_qwen3_batch *b, float **logits, float **taps);

#endif
