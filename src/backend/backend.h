/* backend.h: the compute contract between the model code and a backend.
 *
 * A backend is a table of function pointers (dflash_backend_ops) next to its
 * own context, ggml-backend style. Model code (target, drafter) is written
 * once against this table. Two tiers: primitives, each defined by the CPU
 * backend (src/backend/cpu), the reference any other backend must agree
 * with within rounding; and stages (optional entries) that a backend may
 * fuse, which backend.c composes from the primitives when it does not.
 * Activations are f32 row-major [rows, cols]; weights are dflash_weight
 * (bf16/f16/f32, or fp8 e4m3 with per-row f32 scales). Every pointer an op
 * takes lives in the backend's memory (the CPU backend: host). Ops are
 * ordered on one stream; `sync` waits for all of them. Every op computes a
 * row's result independently of the other rows of the call. */
#ifndef DFLASH_BACKEND_H
#define DFLASH_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "core/dtype.h"
#include "core/rope.h"
#include "core/status.h"

/* A weight matrix [rows, cols] (a vector is rows = 1). For fp8 weights,
 * `scales` [rows] multiplies each row: W[r, c] = fp8(data[r, c]) * scales[r]. */
typedef struct dflash_weight {
    dflash_dtype dtype;
    int64_t rows, cols;
    const void *data;     /* backend memory */
    const float *scales;  /* backend memory, fp8 only, else NULL */
    const char *name;     /* tensor name, for messages */
} dflash_weight;

/* A paged KV pool: n_pages pages of DFLASH_KV_PAGE positions; each page
 * holds K and V of every layer, head-major so that one head's positions of
 * a page are contiguous:
 *   [n_pages][n_layers][2 (K, V)][n_kv_heads][DFLASH_KV_PAGE][head_dim]
 * elements of `dtype`: F32, or BF16 (rounded to nearest even when written;
 * what the GPU uses, and what the CPU can use to be its bit-level
 * reference). K is stored after RoPE. */
#define DFLASH_KV_PAGE 16
typedef struct dflash_kv_layout {
    int n_pages, n_layers, n_kv_heads, head_dim;
    dflash_dtype dtype;
    void *data; /* backend memory */
} dflash_kv_layout;

/* Per-sequence view used by kv_write and attention, one int32 record of
 * DFLASH_SEQ_INFO_LEN fields per sequence of the batch:
 *   [0] lo, [1] hi: the paged key positions [lo, hi) this sequence may see
 *   [2] extra_off, [3] n_extra: rows of k_extra/v_extra that belong to it
 *   [4] extra_pos0: absolute position of its first extra row
 *   [5] row0, [6] n_rows: its query rows in the batch (rows are
 *       sequence-major)
 * Page tables: `page_tables + seq * pt_len` maps logical page
 * (pos / PAGE) % pt_len to a pool page; the modulo makes a bounded window a
 * ring (a sequence that sees at most (pt_len - 1) * PAGE positions). */
#define DFLASH_SEQ_INFO_LEN 7

/* Where a stage stores its rows' K and V in the paged pool: kv_write's
 * arguments but the rows' k and positions, which the stage has. */
typedef struct dflash_kv_dest {
    const dflash_kv_layout *kv;
    int layer;
    const int32_t *page_tables;
    int pt_len;
    const int32_t *row_seq;
    const float *v; /* [n, n_kv_heads * head_dim] */
} dflash_kv_dest;

/* A layer's attention input after its norm (qkv_norm_rope_store): q, k,
 * v = x W^T for w[0..2] (the q, k and v weights, of n_q_heads,
 * n_kv_heads and n_kv_heads heads of head_dim); q and k then normed with
 * q_norm and k_norm (both, or neither) and rotated at pos; with dst
 * (whose v must be this v), the rows' K and V stored in its pool. */
typedef struct dflash_qkv_args {
    const float *x;
    int n;
    const dflash_weight *w;
    float *q, *k, *v;
    const dflash_weight *q_norm, *k_norm;
    int n_q_heads, n_kv_heads, head_dim;
    const int32_t *pos;
    float eps;
    const dflash_rope *rope;
    const dflash_kv_dest *dst;
} dflash_qkv_args;

/* Attention over each row's visible keys: its sequence's paged positions
 * [lo, hi), then its extra rows (the drafter's block keys, in backend
 * memory, f32; with a BF16 pool they are rounded to bf16 as they would be
 * when stored). A key is visible unless a mask hides it. */
typedef struct dflash_attn_args {
    int n_rows, n_heads, n_kv_heads, head_dim;
    float scale;
    const float *q;           /* [n_rows, n_heads * head_dim] */
    float *out;               /* [n_rows, n_heads * head_dim] */
    const int32_t *q_pos;     /* [n_rows] absolute positions */
    const int32_t *row_seq;   /* [n_rows] sequence index in the batch */
    const int32_t *seq_info;  /* [n_seqs * DFLASH_SEQ_INFO_LEN] */
    const dflash_kv_layout *kv; int layer;
    const int32_t *page_tables; int pt_len;
    const float *k_extra, *v_extra; /* [*, n_kv_heads * head_dim] or NULL */
    int causal;               /* key visible only if key_pos <= q_pos */
    int window;               /* > 0: also q_pos - key_pos < window */
    /* Bounds a device backend sizes its grid by (seq_info lives in backend
     * memory): sequences in the batch, the most rows of one sequence, and
     * at least the most keys one sequence has (hi - lo + n_extra). */
    int n_seqs, max_seq_rows, max_keys;
} dflash_attn_args;

/* The recurrent state of a linear-attention layer (a Qwen3.5's Gated
 * DeltaNet) lives in per-sequence records laid out by absolute position,
 * so that taking back rows needs no work: a call only says where a
 * sequence's rows start. Record r of a layer is rec_stride floats at
 * state + r * rec_stride, in backend memory; conv_silu and delta_rule
 * walk each sequence's rows in order. One int32 entry of
 * DFLASH_REC_INFO_LEN fields per sequence of the call:
 *   [0] row0, [1] n_rows: its rows (sequence-major)
 *   [2] pos0: the position of its first row; what the calls for earlier
 *       positions wrote into the record is read back (position 0: a
 *       sequence's start, nothing is read)
 *   [3] rec: its record
 * Sequences of one call must use distinct records. A call may start at
 * any position p that is at most DFLASH_REC_BACK rows before the end of
 * the record's last call and not before that call's first row: those
 * positions' inputs are still in the record (a verify of the longest
 * block, 64 rows: spec.h's DFLASH_MAX_BLOCK, can be taken back whole). */
#define DFLASH_REC_INFO_LEN 4
#define DFLASH_REC_BACK 65
/* Rows of inputs a record keeps, by position modulo DFLASH_REC_ROWS (the
 * rows a resumed call's chunk and convolution window reach back to). */
#define DFLASH_REC_ROWS 128
/* delta_rule's chunk: rows [64 j, 64 j + 64) of a sequence; a record keeps
 * the state at the start of the last DFLASH_REC_CHUNK_STATES chunks. */
#define DFLASH_REC_CHUNK 64
#define DFLASH_REC_CHUNK_STATES 3
/* The widest causal convolution conv_silu takes (its taps live in
 * registers on the GPU). */
#define DFLASH_CONV_MAX_KERNEL 16
typedef struct dflash_rec_args {
    int n_seqs, max_seq_rows; /* max_seq_rows: the most rows one sequence has in the call */
    const int32_t *info;      /* [n_seqs * DFLASH_REC_INFO_LEN] */
    float *state;
    int64_t rec_stride;       /* at least dflash_conv_rec_size / dflash_delta_rec_size */
} dflash_rec_args;

/* Floats of one record: conv_silu's, the last DFLASH_REC_ROWS inputs
 * [DFLASH_REC_ROWS, channels]; delta_rule's, the chunk-start states
 * [DFLASH_REC_CHUNK_STATES][n_v_heads][k_dim][v_dim] then per row slot and
 * value head the row's normalised k [k_dim], its update d [v_dim] and its
 * cumulative decay exponent G (see dflash_delta_args). */
static inline int64_t dflash_conv_rec_size(int64_t channels) { return DFLASH_REC_ROWS * channels; }
static inline int64_t dflash_delta_rec_size(int64_t n_v_heads, int64_t k_dim, int64_t v_dim)
{
    return n_v_heads * (DFLASH_REC_CHUNK_STATES * k_dim * v_dim + DFLASH_REC_ROWS * (k_dim + v_dim + 1));
}

/* A Gated DeltaNet's recurrence (delta_rule) over rows of y = [q | k | v]
 * (n_k_heads * k_dim, n_k_heads * k_dim, n_v_heads * v_dim columns, the
 * causal convolution's output). Per row and value head j (key head
 * h = j / (n_v_heads / n_k_heads)):
 *   q, k = the row's key head h of q and k, each times
 *          1 / sqrt(sum of squares + 1e-6); q also times 1 / sqrt(k_dim)
 *   beta = sigmoid(b[j]); g = -exp(A_log[j]) * softplus(a[j] + dt_bias[j])
 * The token-by-token recurrence is S *= exp(g); d = beta * (v - S^T k);
 * S += k d^T; out = S^T q. It is computed in its chunked form, exactly
 * equal in real arithmetic: for a row at position t of the chunk starting
 * at c (a multiple of DFLASH_REC_CHUNK), with S_c the state at c, G_t the
 * sum of g over rows c..t and k_s, d_s, G_s those of the chunk's earlier
 * rows s (in s order):
 *   d_t   = ((v - exp(G_t) * S_c^T k) - sum_s exp(G_t - G_s) (k_s . k) d_s) * beta
 *   out_t = exp(G_t) * S_c^T q + sum over s <= t of exp(G_t - G_s) (k_s . q) d_s
 *   S_{c+64} = exp(G_{c+63}) S_c + sum over the chunk of exp(G_{c+63} - G_s) k_s d_s^T
 * A row's result depends on S_c and the chunk's rows up to it only, never
 * on how rows are split into calls; the record holds S_c and each row's
 * (k, d, G). As in transformers' chunked form, exp(G_t - G_s) comes from
 * running f32 sums: a chunk whose decays add up to a large |G| loses
 * ~ulp(|G|) in those exponents. */
typedef struct dflash_delta_args {
    int n_rows, n_k_heads, n_v_heads, k_dim, v_dim;
    const float *y;                       /* [n_rows, 2 * n_k_heads * k_dim + n_v_heads * v_dim] */
    const float *a, *b;                   /* [n_rows, n_v_heads] */
    const dflash_weight *A_log, *dt_bias; /* [n_v_heads] */
    float *out;                           /* [n_rows, n_v_heads * v_dim] */
} dflash_delta_args;

/* Activation applied by linear_group to its two outputs. */
enum dflash_act {
    DFLASH_ACT_NONE = 0,
    DFLASH_ACT_SWIGLU, /* out[0] = silu(x W[0]^T) * (x W[1]^T) */
};

/* The most weights one linear_group takes (a Gated DeltaNet layer's four
 * input projections). */
#define DFLASH_GROUP_MAX_W 4

/* The arguments of a gather_sum (src [.., cols] rows by idx [n * k], each
 * times w [n * k], k terms a row), for a stage that adds one in front of
 * its own result. */
typedef struct dflash_gather {
    const float *src;
    const int32_t *idx;
    const float *w;
    int k;
} dflash_gather;

/* The routing of a MoE layer (moe_route): for each of n rows, softmax of
 * its router logits in f32, the k most probable experts (lowest index
 * first on ties), their probabilities divided by their sum (taken in
 * descending order) when norm_topk_prob; with shared_logit, one more
 * entry per row: the shared expert, numbered n_experts, weighted
 * sigmoid(shared_logit[r]) as sigmoid_mul computes it (a shared expert
 * of the routed experts' shape then runs in the same launches as they
 * do). Then the rows grouped by expert, so that each expert's rows are
 * contiguous and its weights read once. A row has kr = k + (shared_logit
 * != NULL) entries and there are ne = n_experts + (shared_logit != NULL)
 * experts to group by. Every array in backend memory. */
#define DFLASH_ROUTE_MAX_EXPERTS 1024
typedef struct dflash_route_args {
    int n, n_experts, k, norm_topk_prob;
    const float *logits;       /* [n, n_experts] */
    const float *shared_logit; /* [n], or NULL: no shared expert */
    int32_t *expert;           /* [n * kr]: row r's j-th expert, ascending in j (the shared one last) */
    float *prob;               /* [n * kr]: its weight */
    int32_t *first;            /* [ne + 1]: expert e's gathered rows are first[e] .. first[e + 1] - 1, its
                                  rows in ascending order (first[ne] = n * kr) */
    int32_t *src;              /* [n * kr]: the row each gathered row comes from */
    int32_t *slot;             /* [n * kr]: the gathered row of row r's j-th expert, at r * kr + j */
} dflash_route_args;

/* A MoE layer's experts through one projection (linear_experts): gathered
 * rows x [rows, cols] grouped as a dflash_route_args' `first` says, each
 * group times its own expert's weights, out[i][g] = x[g] W_e[i]^T for
 * gathered row g of expert e; act SWIGLU (n_w = 2): out[0] = silu(x W_e[0]^T)
 * * (x W_e[1]^T), out[1] unused. Each row's result is what linear_group
 * gives that row alone with its expert's weights. */
typedef struct dflash_experts_args {
    int n_experts, n_w;
    const dflash_weight *w; /* host: expert e's i-th weight at w[e * w_stride + i]; weight i of every expert
                               has one dtype and shape */
    int w_stride;
    const void *const *data;    /* backend [n_w * n_experts]: the same weights' data pointers, i-major (what a
                                   device backend reads), or NULL where the backend does not need them */
    const float *const *scales; /* backend [n_w * n_experts]: their fp8 row scales, or NULL */
    int per_row;                /* experts each source row is routed to (a device backend sizes its work by it;
                                   a hint: a shared expert every row takes may be left out) */
    const float *x;             /* [rows, cols]; with x_rows, scratch of that size */
    /* or NULL: gathered row g is x_src's row x_rows[g] (a route's src), which
     * the composition copies into x first and a fused backend reads where
     * it is */
    const float *x_src;
    const int32_t *x_rows;
    int rows, max_rows;         /* rows: first[n_experts]; max_rows: at least the most rows one expert has */
    const int32_t *first;       /* [n_experts + 1] */
    float *out[2];              /* [rows, W_e[i].rows] */
    enum dflash_act act;
} dflash_experts_args;

/* The most generated tokens a sample row's penalties add to its
 * sequence's counts (spec.h's DFLASH_MAX_BLOCK: a block's drafts). */
#define DFLASH_SAMPLE_GEN_MAX 64

/* One row of sample_rows: the sampler's options (spec/sampler.h), and the
 * sequence position whose uniform draws the row's token. temperature 0:
 * the argmax (of the penalized logits).
 *
 * Penalties (counts NULL: none): the row's logits are penalized first as
 * the host sampler does it (dflash_sampler_probs: in double, the result
 * rounded to f32) from its sequence's token counts on the device, counts
 * [V]: -1 not in the sequence, 0 in it but never generated (the prompt),
 * k > 0 generated k times (count_tokens keeps them), plus gen[0..n_gen)
 * (backend memory, n_gen <= DFLASH_SAMPLE_GEN_MAX): tokens generated
 * before this row that counts does not hold yet (the drafts before it in
 * its block, read where the verify's forward holds its rows' tokens, so
 * they never visit the host first: the row matters only if they are
 * accepted). */
typedef struct dflash_sample_row {
    double temperature, top_p, min_p;
    int32_t top_k, n_gen;
    uint64_t seed;
    int64_t pos;
    double rep_penalty, frequency_penalty, presence_penalty;
    const int32_t *counts;
    const int32_t *gen;
} dflash_sample_row;

typedef struct dflash_backend dflash_backend;

/* Slots of the mark op. */
#define DFLASH_BACKEND_MARKS 2

/* What a backend has done since it was created, for benchmarks: kernel
 * launches, host waits for the device (sync, and the sync a download
 * implies), host-to-device copies and their bytes, device-to-host copies. */
typedef struct dflash_backend_counters {
    int64_t launches, syncs, uploads, upload_bytes, downloads;
} dflash_backend_counters;

typedef struct dflash_backend_ops {
    const char *name;
    dflash_dtype kv_dtype; /* the KV pool dtype a model gets unless it asks */
    void (*destroy)(dflash_backend *be);
    /* memory */
    dflash_status (*alloc)(dflash_backend *be, size_t bytes, void **out);
    void (*free)(dflash_backend *be, void *p);
    dflash_status (*upload)(dflash_backend *be, void *dst, const void *src, size_t bytes);
    dflash_status (*download)(dflash_backend *be, void *dst, const void *src, size_t bytes);
    dflash_status (*sync)(dflash_backend *be);
    /* Optional (NULL where ops run as they are called, as on the CPU:
     * there the host's clock times them): how long the device took
     * between two points of the stream, without waiting at either.
     * mark records when the device gets there (slot <
     * DFLASH_BACKEND_MARKS); mark_ms gives the milliseconds between two
     * marks once a sync or download followed both. A loop that waits
     * once a step tells its verify from its propose by them. */
    dflash_status (*mark)(dflash_backend *be, int slot);
    dflash_status (*mark_ms)(dflash_backend *be, int from, int to, double *ms);
    /* Make a checkpoint tensor usable as a weight: the CPU backend points at
     * the mapping, a device backend copies it once. */
    dflash_status (*weight_from_host)(dflash_backend *be, dflash_weight *w, const void *host_data,
                                      const float *host_scales);

    /* ops */
    /* out[i, :] = table[ids[i], :] as f32 */
    dflash_status (*embed)(dflash_backend *be, const dflash_weight *table, const int32_t *ids, int n,
                           float *out);
    /* if delta: x += delta (x is the residual stream, updated in place);
     * then out = x / sqrt(mean(x^2) + eps) * w, row by row over `dim`. */
    dflash_status (*add_rmsnorm)(dflash_backend *be, float *x, const float *delta, const dflash_weight *w,
                                 int n, int dim, float eps, float *out);
    /* x += delta over n * dim elements */
    dflash_status (*add)(dflash_backend *be, float *x, const float *delta, size_t count);
    /* x[i, c] += b[c] for i < n, c < cols (b: a BF16, F16 or F32 vector of
     * cols elements, widened to f32): a projection's bias. */
    dflash_status (*add_bias)(dflash_backend *be, float *x, const dflash_weight *b, int n, int cols);
    /* out[n, W.rows] = x[n, W.cols] * W^T, f32 accumulation */
    dflash_status (*linear)(dflash_backend *be, const float *x, int n, const dflash_weight *w, float *out);
    /* In place on x [n, n_heads, head_dim]: optional per-head RMSNorm with
     * `norm` [head_dim] (NULL: none), then NeoX RoPE over the first
     * 2 * rope->n_pairs dimensions (all of them, or a partial rotation;
     * n_pairs 0: none): pairs (j, j + n_pairs) turn by angle
     * (float)pos[i] * rope->inv_freq[j], with cos and sin times
     * rope->attn_factor; core/rope.h computes the table. */
    dflash_status (*norm_rope)(dflash_backend *be, float *x, const dflash_weight *norm, const int32_t *pos,
                               int n, int n_heads, int head_dim, float eps, const dflash_rope *rope);
    /* out = silu(gate) * up over count elements */
    dflash_status (*swiglu)(dflash_backend *be, const float *gate, const float *up, size_t count,
                            float *out);
    /* Store rows' K and V [n, n_kv_heads * head_dim] at (row_seq, pos), in
     * the pool's dtype. */
    dflash_status (*kv_write)(dflash_backend *be, const dflash_kv_layout *kv, int layer,
                              const int32_t *page_tables, int pt_len, const int32_t *row_seq,
                              const int32_t *pos, const float *k, const float *v, int n);
    dflash_status (*attention)(dflash_backend *be, const dflash_attn_args *a);
    /* x[i, c] *= sigmoid(g[i * g_cols + (g_cols == 1 ? 0 : c)]) for i < n,
     * c < cols; g_cols is 1 (one gate per row) or at least cols (an output
     * gate: the first cols of each g_cols, e.g. gates interleaved with the
     * queries they came with). */
    dflash_status (*sigmoid_mul)(dflash_backend *be, float *x, const float *g, int n, int64_t cols, int64_t g_cols);
    /* Causal depthwise convolution then SiLU over each sequence's rows of
     * x [n, channels]: out[t, c] = silu(sum over i < kernel of w[c, i] *
     * x'[p - kernel + 1 + i, c]), in i order, for the row at position p,
     * where x' holds the sequence's inputs by position (0 before position
     * 0); each row's input is written into its record (see
     * dflash_rec_args). w: [channels, kernel]. */
    dflash_status (*conv_silu)(dflash_backend *be, const dflash_rec_args *r, const float *x, const dflash_weight *w,
                               int n, int channels, int kernel, float *out);
    /* The recurrence of dflash_delta_args over each sequence's rows, its
     * state in the records of `r`. */
    dflash_status (*delta_rule)(dflash_backend *be, const dflash_rec_args *r, const dflash_delta_args *a);
    /* dst[i * dst_stride + c] = src[idx[i] * src_stride + c] for c < cols;
     * idx NULL means idx[i] = i. */
    dflash_status (*copy_rows)(dflash_backend *be, float *dst, int64_t dst_stride, const float *src,
                               int64_t src_stride, const int32_t *idx, int n, int64_t cols);
    /* dst[i * dst_stride + c] = src[i * src_stride + c] for i < n, c < cols:
     * token ids one op wrote and the next reads (a proposer's drafts into
     * the rows a verify embeds), without a trip through the host. */
    dflash_status (*copy_ids)(dflash_backend *be, int32_t *dst, int64_t dst_stride, const int32_t *src,
                              int64_t src_stride, int n, int cols);
    /* out[i, c] = the sum over j < k, in j order, of w[i * k + j] *
     * src[idx[i * k + j] * cols + c], for c < cols: each product rounded
     * to f32 before it is added (no fused multiply-add), so every backend
     * gets the same bits (a MoE layer's weighted sum of its experts). */
    dflash_status (*gather_sum)(dflash_backend *be, float *out, const float *src, const int32_t *idx, const float *w,
                                int n, int k, int64_t cols);
    /* out[i] = index of the largest of x[i, 0..cols) (lowest index on ties);
     * -1 when the row holds a NaN or +inf or nothing above -inf: logits with
     * no usable number, which the caller reports instead of decoding a
     * token from them. */
    dflash_status (*argmax)(dflash_backend *be, const float *x, int n, int cols, int32_t *out);

    /* stages: optional; NULL means dflash_be_* below composes them from
     * the ops above, which stay the definition of the result. */
    /* out[i] = x W[i]^T for i < n_w (1..DFLASH_GROUP_MAX_W weights of equal
     * cols, e.g. q, k, v); act SWIGLU (n_w = 2): out[0] = silu(x W[0]^T) *
     * (x W[1]^T), out[1] is scratch. */
    dflash_status (*linear_group)(dflash_backend *be, const float *x, int n, const dflash_weight *w, int n_w,
                                  float *const *out, enum dflash_act act);
    /* q [n, n_q_heads, head_dim] and k [n, n_kv_heads, head_dim] in place,
     * each as norm_rope does it (q with q_norm, k with k_norm: both of
     * one dtype, or both NULL for RoPE alone). */
    dflash_status (*qk_norm_rope)(dflash_backend *be, float *q, const dflash_weight *q_norm, int n_q_heads, float *k,
                                  const dflash_weight *k_norm, int n_kv_heads, const int32_t *pos, int n,
                                  int head_dim, float eps, const dflash_rope *rope);
    /* qk_norm_rope (n_q_heads may be 0: k alone, q and q_norm unused),
     * then kv_write of the rows' k as it leaves and of dst->v at their
     * positions: the two ops' results, in one pass. */
    dflash_status (*qk_norm_rope_store)(dflash_backend *be, float *q, const dflash_weight *q_norm, int n_q_heads,
                                        float *k, const dflash_weight *k_norm, int n_kv_heads, const int32_t *pos,
                                        int n, int head_dim, float eps, const dflash_rope *rope,
                                        const dflash_kv_dest *dst);
    /* ids[i] = argmax over columns of row i of x W^T (argmax's rules, -1
     * included);
     * logits [n, W.rows] is scratch, its content afterwards unspecified
     * (a fused backend never writes it). */
    dflash_status (*linear_argmax)(dflash_backend *be, const float *x, int n, const dflash_weight *w, float *logits,
                                   int32_t *ids);
    /* out [n, W.rows] += sigmoid(gate[i]) * (x W^T) row i (a Qwen3.5-MoE's
     * shared expert: its down projection, its gate and the residual add);
     * tmp [n, W.rows] is scratch, its content afterwards unspecified. With
     * `sum` (or NULL), out is first set to gather_sum of sum's rows (the
     * layer's routed experts, which the same epilogue can add). The
     * composition: gather_sum into out, linear into tmp, sigmoid_mul, add. */
    dflash_status (*linear_gated_add)(dflash_backend *be, const float *x, int n, const dflash_weight *w,
                                      const float *gate, float *tmp, float *out, const dflash_gather *sum);
    /* x [n, n_heads, head_dim] := silu(z) * RMSNorm_head(x) * norm (a Gated
     * DeltaNet layer's output norm); the composition: norm_rope without
     * rotation (pos: the rows' positions, which it never needs), then
     * swiglu(z, x). */
    dflash_status (*norm_gate)(dflash_backend *be, float *x, const dflash_weight *norm, const float *z,
                               const int32_t *pos, int n, int n_heads, int head_dim, float eps);
    /* add_rmsnorm whose delta is the gather_sum of sum's rows (a MoE
     * layer's weighted sum of its experts, added to the residual stream
     * with the next norm); delta [n, dim] is scratch, its content
     * afterwards unspecified. The composition: gather_sum into delta,
     * add_rmsnorm. */
    dflash_status (*gather_add_rmsnorm)(dflash_backend *be, float *x, const dflash_gather *sum, float *delta,
                                        const dflash_weight *w, int n, int dim, float eps, float *out);
    /* add_rmsnorm whose delta is in W^T (in [n, W.cols]; W.rows = dim):
     * a layer's output projection added to the residual stream with the
     * next norm; delta [n, dim] is scratch, its content afterwards
     * unspecified. The composition: linear into delta, add_rmsnorm. */
    dflash_status (*linear_add_rmsnorm)(dflash_backend *be, const float *in, int n, const dflash_weight *W, float *x,
                                        float *delta, const dflash_weight *w, int dim, float eps, float *out);
    /* dflash_qkv_args; the composition: linear_group of the three
     * weights, then qk_norm_rope_store (dflash_be_qk_norm_rope_store's). */
    dflash_status (*qkv_norm_rope_store)(dflash_backend *be, const dflash_qkv_args *a);
    /* qkv_norm_rope_store (q, with dst) and then the attention a over its
     * rows, pool and layer: optional, called through
     * dflash_be_qkv_attention, whose composition is the two in turn. q's
     * content afterwards is unspecified (a backend may keep it on chip);
     * k, v and the pages are as the stage leaves them. */
    dflash_status (*qkv_attention)(dflash_backend *be, const dflash_qkv_args *q, const dflash_attn_args *a);

    /* A MoE layer's routing and its experts' projections (see
     * dflash_route_args and dflash_experts_args). */
    dflash_status (*moe_route)(dflash_backend *be, const dflash_route_args *r);
    dflash_status (*linear_experts)(dflash_backend *be, const dflash_experts_args *a);
    /* The router's projection and the routing (dflash_be_linear_moe_route):
     * optional; the composition is linear (linear_group with the shared
     * expert's gate), then moe_route. */
    dflash_status (*linear_moe_route)(dflash_backend *be, const float *x, int n, const dflash_weight *w, int n_w,
                                      float *const *out, const dflash_route_args *r);

    /* Sampling on the device: optional; NULL where the caller's host
     * sampler draws from downloaded logits (dflash_spec_sample_rows,
     * src/spec, composes that). ids[i] = the token drawn from row i
     * of logits [n, V] by rows[i] (host memory) with the host sampler's
     * rules, or -1 when the row holds a NaN or +inf or nothing above
     * -inf (argmax's rule). */
    dflash_status (*sample_rows)(dflash_backend *be, const float *logits, int n, int V, const dflash_sample_row *rows,
                                 int32_t *ids);
    /* The token counts of sample_rows' penalties: optional, NULL where
     * sequences with a penalty draw on the host. counts [V] (backend
     * memory) learns ids[0..n) (host memory; ids outside [0, V) are
     * skipped): generated != 0: each adds one to its token's count (-1
     * counts as 0); else (a prompt) a token at -1 goes to 0. ids NULL:
     * every count is set to -1 (n = V). */
    dflash_status (*count_tokens)(dflash_backend *be, int32_t *counts, int V, const int32_t *ids, int n,
                                  int generated);

    /* diagnostics: optional; NULL where nothing is counted (the CPU) */
    void (*counters)(dflash_backend *be, dflash_backend_counters *out);

    /* Graphs (backend/graph.h): optional; NULL where ops always run as
     * called (the CPU). Between capture_begin and capture_end the ops run
     * nothing but are recorded; an op that cannot be (an upload, a
     * download or sync, a workspace that has to grow) fails, and then
     * capture_end fails too and leaves the queue as before. graph_launch
     * replays a recording: the same ops, arguments and addresses; *stale
     * = 1 and nothing launched when a workspace it uses has moved since. */
    dflash_status (*capture_begin)(dflash_backend *be);
    dflash_status (*capture_end)(dflash_backend *be, void **graph);
    dflash_status (*graph_launch)(dflash_backend *be, void *graph, int *stale);
    void (*graph_free)(dflash_backend *be, void *graph);
} dflash_backend_ops;

struct dflash_backend {
    const dflash_backend_ops *ops;
    void *ctx;
};

/* The CPU reference backend (never fails to create unless out of memory). */
dflash_status dflash_backend_cpu_create(dflash_backend **out);
void dflash_backend_destroy(dflash_backend *be);

/* Stage entry points: the backend's fused version when it has one, else
 * the composition of primitives. */
dflash_status dflash_be_linear_group(dflash_backend *be, const float *x, int n, const dflash_weight *w, int n_w,
                                     float *const *out, enum dflash_act act);
/* The argument checks every backend makes (one message each): a bias of
 * cols elements, not fp8; conv_silu's weight [channels, kernel] for a
 * kernel of 1..DFLASH_CONV_MAX_KERNEL; delta_rule's geometry and its
 * [n_v_heads] vectors, with a backend's own bounds on k_dim and v_dim (0:
 * none); sigmoid_mul's gate columns (1 or cols); a record stride of
 * at least `need` floats. */
dflash_status dflash_be_check_bias(const dflash_weight *b, int cols);
dflash_status dflash_be_check_conv(const dflash_weight *w, int channels, int kernel);
dflash_status dflash_be_check_delta(const dflash_delta_args *a, int max_k_dim, int max_v_dim);
dflash_status dflash_be_check_gate(int64_t cols, int64_t g_cols);
dflash_status dflash_be_check_rec(const dflash_rec_args *r, int64_t need, const char *op);
/* The checks every norm_rope makes: a table of at most head_dim / 2 pairs. */
dflash_status dflash_be_check_rope(const dflash_rope *rope, int head_dim);
dflash_status dflash_be_qk_norm_rope(dflash_backend *be, float *q, const dflash_weight *q_norm, int n_q_heads,
                                     float *k, const dflash_weight *k_norm, int n_kv_heads, const int32_t *pos, int n,
                                     int head_dim, float eps, const dflash_rope *rope);
/* q/k norm and RoPE (q_norm and k_norm, or neither), then, with dst, the
 * rows' K and V into the pool (n_q_heads 0: k alone). */
dflash_status dflash_be_qk_norm_rope_store(dflash_backend *be, float *q, const dflash_weight *q_norm, int n_q_heads,
                                           float *k, const dflash_weight *k_norm, int n_kv_heads,
                                           const int32_t *pos, int n, int head_dim, float eps,
                                           const dflash_rope *rope, const dflash_kv_dest *dst);
dflash_status dflash_be_linear_argmax(dflash_backend *be, const float *x, int n, const dflash_weight *w, float *logits,
                                      int32_t *ids);
dflash_status dflash_be_linear_gated_add(dflash_backend *be, const float *x, int n, const dflash_weight *w,
                                         const float *gate, float *tmp, float *out, const dflash_gather *sum);
dflash_status dflash_be_norm_gate(dflash_backend *be, float *x, const dflash_weight *norm, const float *z,
                                  const int32_t *pos, int n, int n_heads, int head_dim, float eps);
dflash_status dflash_be_gather_add_rmsnorm(dflash_backend *be, float *x, const dflash_gather *sum, float *delta,
                                           const dflash_weight *w, int n, int dim, float eps, float *out);
dflash_status dflash_be_linear_add_rmsnorm(dflash_backend *be, const float *in, int n, const dflash_weight *W, float *x,
                                           float *delta, const dflash_weight *w, int dim, float eps, float *out);
dflash_status dflash_be_qkv_norm_rope_store(dflash_backend *be, const dflash_qkv_args *a);
dflash_status dflash_be_qkv_attention(dflash_backend *be, const dflash_qkv_args *q, const dflash_attn_args *a);
/* The compositions those stages stand for (see the ops above): the
 * default, and what a backend runs where its own version declines a case. */
dflash_status dflash_be_linear_gated_add_composed(dflash_backend *be, const float *x, int n, const dflash_weight *w,
                                                  const float *gate, float *tmp, float *out, const dflash_gather *sum);
dflash_status dflash_be_norm_gate_composed(dflash_backend *be, float *x, const dflash_weight *norm, const float *z,
                                           const int32_t *pos, int n, int n_heads, int head_dim, float eps);
dflash_status dflash_be_gather_add_rmsnorm_composed(dflash_backend *be, float *x, const dflash_gather *sum,
                                                    float *delta, const dflash_weight *w, int n, int dim, float eps,
                                                    float *out);
dflash_status dflash_be_qkv_norm_rope_store_composed(dflash_backend *be, const dflash_qkv_args *a);
dflash_status dflash_be_linear_add_rmsnorm_composed(dflash_backend *be, const float *in, int n,
                                                    const dflash_weight *W, float *x, float *delta,
                                                    const dflash_weight *w, int dim, float eps, float *out);

/* MoE stages (stage_moe.c): the default routes on the host (the logits
 * downloaded, the arrays uploaded) and runs linear_group once per expert
 * that has rows. */
dflash_status dflash_be_moe_route(dflash_backend *be, const dflash_route_args *r);
/* out[i] = x [n, w[i].cols] w[i]^T for the router (i = 0) and, with n_w 2,
 * the shared expert's gate, then the routing r of those logits: r->logits
 * must be out[0], and r->shared_logit out[1] or NULL (a shared expert
 * added apart). One launch less where the backend fuses them. */
dflash_status dflash_be_linear_moe_route(dflash_backend *be, const float *x, int n, const dflash_weight *w, int n_w,
                                         float *const *out, const dflash_route_args *r);
dflash_status dflash_be_linear_moe_route_composed(dflash_backend *be, const float *x, int n, const dflash_weight *w,
                                                  int n_w, float *const *out, const dflash_route_args *r);
dflash_status dflash_be_linear_experts(dflash_backend *be, const dflash_experts_args *a);
/* One linear_group per expert with rows: the default linear_experts, and
 * what a backend runs where its own version declines a case. host_first: a
 * copy of a->first the host reads, or NULL to download one. */
dflash_status dflash_be_linear_experts_each(dflash_backend *be, const dflash_experts_args *a,
                                            const int32_t *host_first);
/* The routing of one row as dflash_route_args defines it: logits
 * [n_experts] -> experts [k] ascending and their weights prob [k]. */
void dflash_moe_route_row(const float *logits, int n_experts, int k, int norm_topk_prob, int32_t *experts,
                          float *prob);
/* The whole routing of dflash_route_args, every array in memory the host
 * reads and writes (the CPU backend's moe_route; arguments checked). */
void dflash_moe_route_rows(const dflash_route_args *r);

/* Typed allocation helpers; contents are undefined until written. */
dflash_status dflash_be_alloc_f32(dflash_backend *be, size_t count, float **out);
dflash_status dflash_be_alloc_i32(dflash_backend *be, size_t count, int32_t **out);

#endif
