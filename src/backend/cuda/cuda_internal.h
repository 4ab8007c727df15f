/* cuda_internal.h: what the files of the CUDA backend share: the backend's
 * context (device, stream, kernels, error report, workspaces), the launch
 * helpers with their checks, and the op entry points each file provides to
 * the ops table in cuda_backend.c. Not a public header. */
#ifndef DFLASH_BACKEND_CUDA_INTERNAL_H
#define DFLASH_BACKEND_CUDA_INTERNAL_H

#include <stdint.h>

#include "backend/backend.h"
#include "backend/cuda/cuda_compile.h"
#include "backend/cuda/cuda_loader.h"

#define MAX_MODULES 16

/* A RoPE table uploaded once: the host table it copies, its device copy. */
typedef struct rope_table {
    dflash_rope host;
    CUdeviceptr data; /* f32 [host.n_pairs] */
} rope_table;

/* A device buffer that grows on demand (workspaces). */
typedef struct cuda_buf {
    CUdeviceptr p;
    size_t bytes;
} cuda_buf;

typedef struct cuda_ctx {
    dflash_cuda_api cu;
    dflash_nvrtc_api nv;
    CUdevice dev;
    CUcontext ctx;
    int ctx_retained;
    CUstream stream;
    CUmodule mods[MAX_MODULES];
    int n_mods;
    CUfunction fn[DFK_COUNT];
    char arch[16];
    char dev_name[128];
    int sm_count;
    int smem_optin; /* dynamic shared memory a block may opt in to; kernels needing more are never launched */
    int pdl; /* launch with programmatic stream serialization (sm_90+, DFLASH_CUDA_PDL=0 turns it off) */
    int clusters; /* thread block clusters (sm_90+): sample.cu splits a row over 8 blocks */
    int gemm_split; /* DFLASH_CUDA_GEMM_SPLIT: 0, or the split-K every GEMM uses */
    int gemm_share_sum; /* DFLASH_CUDA_GEMM_SHARE_SUM: split-K slices add their partials together (gemm.cu) */
    int gemm_defer_sum; /* DFLASH_CUDA_GEMM_DEFER_SUM: cuda_gemm_partials leaves a split sum to the next launch */
    int qk_attention;   /* DFLASH_CUDA_QK_ATTENTION: a decode's q/k norm + RoPE + K/V store inside attention */
    int gemm_wide;  /* DFLASH_CUDA_GEMM_WIDE: calls of this many rows or more take gemm_wide.cu */
    int gemm_tile;  /* DFLASH_CUDA_GEMM_TILE: 0, or gemm_wide.cu's tile (32, 64 or 128 rows) */
    /* Blocks per SM of each tensor-core attention kernel (head size 16,
     * 32, 64, 128, 256) by warps a block, asked of the driver once. */
    int attn_occ[5][9];
    /* Kernel error report: the device word decides which report wins, the
     * details land in mapped host memory [code, a, b, c]. */
    CUdeviceptr err_flag;
    int *err_host;
    CUdeviceptr err_host_dev;
    /* Weights copied by weight_from_host, freed with the backend. */
    CUdeviceptr *owned;
    size_t n_owned, cap_owned;
    rope_table *rope; /* every distinct table seen (models come and go; each is a few hundred bytes) */
    int n_rope, cap_rope;
    CUevent ev[2]; /* timer start, stop (tools only) */
    CUevent marks[DFLASH_BACKEND_MARKS]; /* the mark op's */
    dflash_backend_counters count; /* launches, waits, copies (benchmarks) */
    int capturing;   /* the stream is being captured into a graph (cuda_graph.c) */
    uint64_t ws_gen; /* bumped when a workspace moves: graphs captured before are stale */
    /* Workspaces: attention partials of key splits (attention_tc.cu);
     * split-K partials, arrival counters (kept zero between calls) and
     * argmax partials of the GEMM (gemm.cu); the many-row GEMM's split
     * activations (gemm_wide.cu). */
    cuda_buf part_o, part_ml;
    cuda_buf gemm_ws, gemm_cnt, am_val, am_idx, am_bad;
    cuda_buf gemm_xs; /* gemm_wide.cu's activations split into bf16 hi/lo */
    cuda_buf smp_rows, smp_e, smp_hist; /* sample.cu's row arguments, each row's x / exp(x - m), its histograms */
    cuda_buf smp_pen, smp_ids;          /* penalized rows, count_tokens' ids */
    char desc[192];
} cuda_ctx;

#define CTX(be) ((cuda_ctx *)(be)->ctx)
#define DPTR(p) ((CUdeviceptr)(uintptr_t)(p))
#define HPTR(d) ((void *)(uintptr_t)(d))

/* The primary context is current on whichever thread calls in (an engine
 * may move between threads, one at a time). */
static inline dflash_status cuda_enter(cuda_ctx *c) { return DFLASH_CU(&c->cu, cuCtxSetCurrent(c->ctx)); }

static inline int aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

static inline unsigned cdiv(int64_t a, int64_t b) { return (unsigned)((a + b - 1) / b); }

/* Threads for a per-row loop over `len` elements: about 8 per thread,
 * a multiple of 32, at most `max`. */
static inline unsigned row_threads(int64_t len, unsigned max)
{
    int64_t t = (len + 7) / 8;
    t = (t + 31) / 32 * 32;
    if (t < 32)
        t = 32;
    return t > max ? max : (unsigned)t;
}

/* Launch kernel k on the backend's stream; a failure names the kernel and
 * the grid. */
dflash_status cuda_launch3(cuda_ctx *c, dflash_cuda_kernel_id k, unsigned gx, unsigned gy, unsigned gz,
                           unsigned block, void **args);
/* Can kernel k run here (its dynamic shared memory fits the device)? */
static inline int cuda_kernel_fits(const cuda_ctx *c, dflash_cuda_kernel_id k)
{
    return dflash_cuda_kernels[k].dyn_smem <= c->smem_optin;
}

static inline dflash_status cuda_launch(cuda_ctx *c, dflash_cuda_kernel_id k, unsigned gx, unsigned gy,
                                        unsigned block, void **args)
{
    return cuda_launch3(c, k, gx, gy, 1, block, args);
}

/* Make `b` at least `bytes` long (contents lost when it grows; waits for
 * work in flight first). `zero`: a new buffer starts zeroed. */
dflash_status cuda_buf_reserve(cuda_ctx *c, cuda_buf *b, size_t bytes, int zero);
void cuda_buf_free(cuda_ctx *c, cuda_buf *b);

/* Same checks as the CPU reference (cpu_ops.c). */
dflash_status cuda_check_weight(const dflash_weight *w, const char *op);

/* cuda_graph.c: the graph ops of backend.h */
dflash_status cuda_capture_begin(dflash_backend *be);
dflash_status cuda_capture_end(dflash_backend *be, void **graph);
dflash_status cuda_graph_launch(dflash_backend *be, void *graph, int *stale);
void cuda_graph_free(dflash_backend *be, void *graph);

/* cuda_recurrent.c */
dflash_status cuda_conv_silu(dflash_backend *be, const dflash_rec_args *r, const float *x, const dflash_weight *w,
                             int n, int channels, int kernel, float *out);
dflash_status cuda_delta_rule(dflash_backend *be, const dflash_rec_args *r, const dflash_delta_args *a);
dflash_status cuda_sigmoid_mul(dflash_backend *be, float *x, const float *g, int n, int64_t cols, int64_t g_cols);

/* cuda_gemm.c */
dflash_status cuda_linear(dflash_backend *be, const float *x, int n, const dflash_weight *w, float *out);
dflash_status cuda_linear_gated_add(dflash_backend *be, const float *x, int n, const dflash_weight *w,
                                    const float *gate, float *tmp, float *out, const dflash_gather *sum);
dflash_status cuda_linear_group(dflash_backend *be, const float *x, int n, const dflash_weight *w, int n_w,
                                float *const *out, enum dflash_act act);
dflash_status cuda_linear_argmax(dflash_backend *be, const float *x, int n, const dflash_weight *w, float *logits,
                                 int32_t *ids);
dflash_status cuda_linear_experts(dflash_backend *be, const dflash_experts_args *a);
/* A GEMM that leaves its split-K sum to the next launch, which adds the
 * partials as it reads them in slice order from 0.0f, then scales them
 * by the fp8 row scales (what gemm.cu's epilogue would have stored, bit
 * for bit): weight i's column j of row r is the sum over s < slices of
 * ws[s * stride + r * ld + off[i] + j]. slices 0: declined, nothing
 * launched (the caller composes: linear, then its op). */
typedef struct cuda_partials {
    const float *ws;
    int64_t stride, ld, off[DFLASH_GROUP_MAX_W];
    int slices;
} cuda_partials;
dflash_status cuda_gemm_partials(cuda_ctx *c, const float *x, int n, const dflash_weight *w, int n_w,
                                 cuda_partials *p);

/* Mirrors struct route_parts in kernels/moe.cu. */
typedef struct route_parts {
    const float *ws;
    int64_t stride, ld, off_sh;
    int32_t slices;
    float *sh_out;
    const float *scale_r, *scale_s;
} route_parts;
_Static_assert(sizeof(route_parts) == 64, "mirrors moe.cu's route_parts");

/* Mirrors struct qk_store in kernels/norm_rope.cuh. */
typedef struct qk_store {
    void *pool;
    const int32_t *page_tables, *row_seq;
    const float *v;
    void *eflag, *ehost;
    int bf16, n_pages, n_layers, layer, pt_len;
} qk_store;
_Static_assert(sizeof(qk_store) == 72, "qk_store must match kernels/norm_rope.cuh");

/* Mirrors struct qk_parts in kernels/norm_rope.cuh. */
typedef struct qk_parts {
    const float *ws;
    const float *scales[3];
    float *v;
    int64_t stride, ld, off_k, off_v;
    int slices;
} qk_parts;
_Static_assert(sizeof(qk_parts) == 80, "qk_parts must match kernels/norm_rope.cuh");

/* attention_tc.cu's attn_fuse: a decode's q/k norm + RoPE + K/V store run
 * by attention itself (cuda_backend.c's qkv_attention). */
typedef struct cuda_attn_fuse {
    const void *qnorm, *knorm;
    const float *inv_freq;
    float *k;
    float eps, attn;
    int ndt, fused;
    qk_store st;
    qk_parts parts;
} cuda_attn_fuse;
_Static_assert(sizeof(cuda_attn_fuse) == 200, "cuda_attn_fuse must match kernels/attention_tc.cu");

/* cuda_attention.c */
/* A pool this backend reads and writes (F32 or BF16), and a layer of it. */
dflash_status cuda_check_kv(const dflash_kv_layout *kv, int layer, const char *op);
/* The same for a stage that stores rows there: also a page table of at
 * least one entry. */
dflash_status cuda_check_kv_store(const dflash_kv_layout *kv, int layer, int pt_len, const char *op);
dflash_status cuda_kv_write(dflash_backend *be, const dflash_kv_layout *kv, int layer, const int32_t *page_tables,
                            int pt_len, const int32_t *row_seq, const int32_t *pos, const float *k, const float *v,
                            int n);
dflash_status cuda_attention(dflash_backend *be, const dflash_attn_args *a);
/* Attention that first runs f's q/k norm + RoPE + K/V store itself (the
 * caller has checked that it can: head_dim 128, a BF16 pool, one row a
 * sequence, at most 8 query heads a KV head, no extra keys). */
dflash_status cuda_attention_fused(dflash_backend *be, const dflash_attn_args *a, const cuda_attn_fuse *f);

#endif
