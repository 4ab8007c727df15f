/* cuda_backend.c: the CUDA backend: device, primary context and one stream;
 * memory (cuMemAlloc, copies ordered on the stream); kernel modules (from
 * the disk cache or NVRTC); and one launcher per op that checks arguments
 * as the CPU reference does, picks the grid and launches on the stream.
 * Kernels report data errors (bad token id, KV block outside the pool)
 * through mapped host memory, read at the next sync or download. */
#include "backend/cuda/cuda_backend.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_compile.h"
#include "backend/cuda/cuda_loader.h"

/* The kernels take dflash_dtype values as their DT_* codes (common.cuh). */
_Static_assert(DFLASH_DTYPE_F32 == 1 && DFLASH_DTYPE_F16 == 2 && DFLASH_DTYPE_BF16 == 3 &&
                   DFLASH_DTYPE_F8_E4M3 == 4,
               "kernels/common.cuh DT_* codes must match dflash_dtype");

#define MAX_MODULES 16
#define MAX_ROPE_TABLES 4

typedef struct rope_table {
    double theta;
    int head_dim;
    CUdeviceptr data; /* f32 [head_dim / 2] */
} rope_table;

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
    /* Kernel error report: the device word decides which report wins, the
     * details land in mapped host memory [code, a, b, c]. */
    CUdeviceptr err_flag;
    int *err_host;
    CUdeviceptr err_host_dev;
    /* Weights copied by weight_from_host, freed with the backend. */
    CUdeviceptr *owned;
    size_t n_owned, cap_owned;
    rope_table rope[MAX_ROPE_TABLES];
    int n_rope;
    CUevent ev[2]; /* timer start, stop (tools only) */
    /* Attention partials of key splits (attention_tc.cu), grown on demand. */
    CUdeviceptr part_o, part_ml;
    size_t part_cap; /* floats in part_o */
    char desc[192];
} cuda_ctx;

/* Mirrors struct gemm_args in kernels/gemm.cu (passed by value). */
typedef struct gemm_args {
    const void *w[3];
    const float *scales[3];
    float *out[3];
    int64_t n[3];
    int64_t tiles[3];
    const float *x;
    int64_t k;
    int m, n_w, split, mode;
} gemm_args;
_Static_assert(sizeof(gemm_args) == 152, "gemm_args must match kernels/gemm.cu");

/* Mirrors struct attn_tc_args in kernels/attention_tc.cu. */
typedef struct attn_tc_args {
    const float *q;
    float *out;
    const int32_t *q_pos, *seq_info;
    const void *pool;
    const int32_t *block_tables;
    const float *k_extra, *v_extra;
    void *part_o, *part_ml, *eflag, *ehost;
    float scale;
    int n_blocks, n_layers, layer, bt_len;
    int n_rows, n_heads, n_kv_heads, causal, window, compute_warps;
} attn_tc_args;
_Static_assert(sizeof(attn_tc_args) == 144, "attn_tc_args must match kernels/attention_tc.cu");

/* Keys per split and query vectors per block of attention_tc.cu. */
#define ATTN_TC_SPLIT 128
#define ATTN_TC_QV 128

#define CTX(be) ((cuda_ctx *)(be)->ctx)
#define DPTR(p) ((CUdeviceptr)(uintptr_t)(p))

static const dflash_backend_ops k_cuda_ops;

/* The primary context is current on whichever thread calls in (an engine
 * may move between threads, one at a time). */
static dflash_status enter(cuda_ctx *c) { return DFLASH_CU(&c->cu, cuCtxSetCurrent(c->ctx)); }

/* ---- errors reported by kernels ---------------------------------------- */

/* Called after the stream is synchronized. */
static dflash_status check_kernel_errors(cuda_ctx *c)
{
    volatile int *h = c->err_host;
    const int code = h[0];
    if (code == 0)
        return DFLASH_OK;
    const int a = h[1], b = h[2], v = h[3];
    h[0] = h[1] = h[2] = h[3] = 0;
    DFLASH_TRY(DFLASH_CU(&c->cu, cuMemsetD32Async(c->err_flag, 0, 1, c->stream)));
    switch (code) {
    case 1:
        return dflash_fail(DFLASH_ERR_INVALID_ARG, "embed: token id %d outside the vocabulary [0, %d) (row %d)", b,
                           v, a);
    case 2:
        return dflash_fail(DFLASH_ERR_INVALID_ARG, "kv_write: position %d maps to block %d (pool has %d)", a, b, v);
    case 3:
        return dflash_fail(DFLASH_ERR_INVALID_ARG, "attention: key position %d maps to block %d (pool has %d)", a,
                           b, v);
    default:
        return dflash_fail(DFLASH_ERR_BACKEND, "cuda: kernel reported unknown error %d (%d, %d, %d)", code, a, b,
                           v);
    }
}

/* ---- memory ------------------------------------------------------------- */

static void forget_owned(cuda_ctx *c, CUdeviceptr p)
{
    for (size_t i = 0; i < c->n_owned; i++)
        if (c->owned[i] == p) {
            c->owned[i] = c->owned[--c->n_owned];
            return;
        }
}

static void cuda_destroy(dflash_backend *be)
{
    cuda_ctx *c = CTX(be);
    if (c->ctx) {
        /* Teardown: report nothing, release everything that was made. */
        c->cu.cuCtxSetCurrent(c->ctx);
        if (c->stream)
            c->cu.cuStreamSynchronize(c->stream);
        for (size_t i = 0; i < c->n_owned; i++)
            c->cu.cuMemFree(c->owned[i]);
        for (int i = 0; i < c->n_rope; i++)
            c->cu.cuMemFree(c->rope[i].data);
        if (c->part_o)
            c->cu.cuMemFree(c->part_o);
        if (c->part_ml)
            c->cu.cuMemFree(c->part_ml);
        if (c->err_flag)
            c->cu.cuMemFree(c->err_flag);
        if (c->err_host)
            c->cu.cuMemFreeHost(c->err_host);
        for (int i = 0; i < c->n_mods; i++)
            c->cu.cuModuleUnload(c->mods[i]);
        for (int i = 0; i < 2; i++)
            if (c->ev[i])
                c->cu.cuEventDestroy(c->ev[i]);
        if (c->stream)
            c->cu.cuStreamDestroy(c->stream);
    }
    if (c->ctx_retained)
        c->cu.cuDevicePrimaryCtxRelease(c->dev);
    free(c->owned);
    dflash_nvrtc_api_unload(&c->nv);
    dflash_cuda_api_unload(&c->cu);
    free(c);
    free(be);
}

static dflash_status cuda_alloc(dflash_backend *be, size_t bytes, void **out)
{
    cuda_ctx *c = CTX(be);
    DFLASH_TRY(enter(c));
    CUdeviceptr p = 0;
    /* Whole 256-byte units, like the CPU's cache lines: a zero-byte request
     * still yields a distinct pointer. */
    size_t n = bytes ? (bytes + 255) / 256 * 256 : 256;
    dflash_status s = DFLASH_CU(&c->cu, cuMemAlloc(&p, n));
    if (s != DFLASH_OK)
        return dflash_fail_prefix(s, "cuda: allocating %zu bytes: ", bytes);
    *out = (void *)(uintptr_t)p;
    return DFLASH_OK;
}

static void cuda_free(dflash_backend *be, void *p)
{
    cuda_ctx *c = CTX(be);
    if (!p)
        return;
    c->cu.cuCtxSetCurrent(c->ctx);
    forget_owned(c, DPTR(p));
    /* cuMemFree waits for work in flight that may still use the buffer. */
    c->cu.cuMemFree(DPTR(p));
}

/* Pageable sources are staged by the driver before the call returns, so the
 * caller may reuse `src` at once; the copy stays ordered with the ops. */
static dflash_status cuda_upload(dflash_backend *be, void *dst, const void *src, size_t bytes)
{
    cuda_ctx *c = CTX(be);
    if (!bytes)
        return DFLASH_OK;
    DFLASH_TRY(enter(c));
    return DFLASH_CU(&c->cu, cuMemcpyHtoDAsync(DPTR(dst), src, bytes, c->stream));
}

static dflash_status cuda_sync(dflash_backend *be)
{
    cuda_ctx *c = CTX(be);
    DFLASH_TRY(enter(c));
    DFLASH_TRY(DFLASH_CU(&c->cu, cuStreamSynchronize(c->stream)));
    return check_kernel_errors(c);
}

static dflash_status cuda_download(dflash_backend *be, void *dst, const void *src, size_t bytes)
{
    cuda_ctx *c = CTX(be);
    DFLASH_TRY(enter(c));
    if (bytes)
        DFLASH_TRY(DFLASH_CU(&c->cu, cuMemcpyDtoHAsync(dst, DPTR(src), bytes, c->stream)));
    DFLASH_TRY(DFLASH_CU(&c->cu, cuStreamSynchronize(c->stream)));
    return check_kernel_errors(c);
}

static dflash_status own(cuda_ctx *c, CUdeviceptr p)
{
    if (c->n_owned == c->cap_owned) {
        size_t cap = c->cap_owned ? c->cap_owned * 2 : 64;
        CUdeviceptr *o = realloc(c->owned, cap * sizeof *o);
        if (!o)
            return dflash_fail(DFLASH_ERR_OOM, "cuda: out of memory");
        c->owned = o;
        c->cap_owned = cap;
    }
    c->owned[c->n_owned++] = p;
    return DFLASH_OK;
}

static dflash_status cuda_weight_from_host(dflash_backend *be, dflash_weight *w, const void *host_data,
                                           const float *host_scales)
{
    cuda_ctx *c = CTX(be);
    const size_t es = dflash_dtype_size(w->dtype);
    if (!es || w->rows < 0 || w->cols < 0)
        return dflash_fail(DFLASH_ERR_INVALID_ARG, "cuda: weight %s has dtype %s and shape [%lld, %lld]",
                           w->name ? w->name : "?", dflash_dtype_name(w->dtype), (long long)w->rows,
                           (long long)w->cols);
    if (w->dtype == DFLASH_DTYPE_F8_E4M3 && !host_scales)
        return dflash_fail(DFLASH_ERR_INVALID_ARG, "cuda: fp8 weight %s without scales", w->name ? w->name : "?");
    const size_t bytes = (size_t)w->rows * (size_t)w->cols * es;
    void *d = NULL, *sc = NULL;
    dflash_status s = cuda_alloc(be, bytes, &d);
    if (s == DFLASH_OK)
        s = own(c, DPTR(d));
    if (s == DFLASH_OK)
        s = cuda_upload(be, d, host_data, bytes);
    if (s == DFLASH_OK && host_scales) {
        s = cuda_alloc(be, (size_t)w->rows * sizeof(float), &sc);
        if (s == DFLASH_OK)
            s = own(c, DPTR(sc));
        if (s == DFLASH_OK)
            s = cuda_upload(be, sc, host_scales, (size_t)w->rows * sizeof(float));
    }
    if (s != DFLASH_OK) {
        cuda_free(be, d);
        cuda_free(be, sc);
        return dflash_fail_prefix(s, "weight %s: ", w->name ? w->name : "?");
    }
    w->data = d;
    w->scales = sc;
    return DFLASH_OK;
}

/* ---- launching ---------------------------------------------------------- */

static dflash_status launch3(cuda_ctx *c, dflash_cuda_kernel_id k, unsigned gx, unsigned gy, unsigned gz,
                             unsigned block, void **args)
{
    dflash_status s = DFLASH_CU(&c->cu, cuLaunchKernel(c->fn[k], gx, gy, gz, block, 1, 1, 0, c->stream, args, NULL));
    if (s != DFLASH_OK)
        return dflash_fail_prefix(s, "cuda kernel %s (grid %u x %u x %u, block %u): ", dflash_cuda_kernels[k].name,
                                  gx, gy, gz, block);
    return DFLASH_OK;
}

static dflash_status launch(cuda_ctx *c, dflash_cuda_kernel_id k, unsigned gx, unsigned gy, unsigned block,
                            void **args)
{
    return launch3(c, k, gx, gy, 1, block, args);
}

static int aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

static unsigned cdiv(int64_t a, int64_t b) { return (unsigned)((a + b - 1) / b); }

/* Threads for a per-row loop over `len` elements: about 8 per thread,
 * a multiple of 32, at most `max`. */
static unsigned row_threads(int64_t len, unsigned max)
{
    int64_t t = (len + 7) / 8;
    t = (t + 31) / 32 * 32;
    if (t < 32)
        t = 32;
    return t > max ? max : (unsigned)t;
}

static int weight_dtype_ok(const dflash_weight *w)
{
    return w->dtype == DFLASH_DTYPE_BF16 || w->dtype == DFLASH_DTYPE_F16 || w->dtype == DFLASH_DTYPE_F32 ||
           (w->dtype == DFLASH_DTYPE_F8_E4M3 && w->scales);
}

static dflash_status check_weight(const dflash_weight *w, const char *op)
{
    if (!weight_dtype_ok(w))
        return dflash_fail(DFLASH_ERR_UNSUPPORTED, "cuda %s: weight %s has dtype %s%s", op, w->name ? w->name : "?",
                           dflash_dtype_name(w->dtype), w->dtype == DFLASH_DTYPE_F8_E4M3 ? " without scales" : "");
    return DFLASH_OK;
}

/* ---- ops ---------------------------------------------------------------- */

static dflash_status cuda_embed(dflash_backend *be, const dflash_weight *table, const int32_t *ids, int n,
                                float *out)
{
    cuda_ctx *c = CTX(be);
    DFLASH_TRY(check_weight(table, "embed"));
    if (n <= 0)
        return DFLASH_OK;
    DFLASH_TRY(enter(c));
    int dt = (int)table->dtype;
    int64_t rows = table->rows, cols = table->cols;
    void *args[] = { (void *)&table->data, &dt, &rows, &cols, (void *)&ids, &out, &c->err_flag, &c->err_host_dev };
    unsigned chunks = cdiv(cols, 256 * 4);
    return launch(c, DFK_EMBED, (unsigned)n, chunks ? chunks : 1, 256, args);
}

static dflash_status cuda_add_rmsnorm(dflash_backend *be, float *x, const float *delta, const dflash_weight *w,
                                      int n, int dim, float eps, float *out)
{
    cuda_ctx *c = CTX(be);
    DFLASH_TRY(check_weight(w, "rmsnorm"));
    if (w->rows * w->cols != dim)
        return dflash_fail(DFLASH_ERR_SHAPE, "rmsnorm: weight %s has %lld elements, rows have %d",
                           w->name ? w->name : "?", (long long)(w->rows * w->cols), dim);
    if (n <= 0)
        return DFLASH_OK;
    DFLASH_TRY(enter(c));
    int wdt = (int)w->dtype;
    void *args[] = { &x, (void *)&delta, (void *)&w->data, &wdt, &dim, &eps, &out };
    return launch(c, DFK_ADD_RMSNORM, (unsigned)n, 1, row_threads(dim, 1024), args);
}

/* Elementwise launches: enough blocks to fill the GPU a few times over; the
 * kernels stride over the rest. */
static unsigned elem_blocks(cuda_ctx *c, int64_t work)
{
    int64_t b = (work + 255) / 256, cap = (int64_t)c->sm_count * 8;
    if (b > cap)
        b = cap;
    return b < 1 ? 1 : (unsigned)b;
}

static dflash_status cuda_add(dflash_backend *be, float *x, const float *delta, size_t count)
{
    cuda_ctx *c = CTX(be);
    if (!count)
        return DFLASH_OK;
    DFLASH_TRY(enter(c));
    int vec = count % 4 == 0 && aligned16(x) && aligned16(delta);
    int64_t n = (int64_t)count;
    void *args[] = { &x, (void *)&delta, &n, &vec };
    return launch(c, DFK_ADD, elem_blocks(c, vec ? n / 4 : n), 1, 256, args);
}

/* The general linear (linear.cu): any dtype, K and alignment. */
static dflash_status linear_simt(cuda_ctx *c, const float *x, int n, const dflash_weight *w, float *out)
{
    static const struct {
        dflash_dtype dt;
        int vec_elems; /* elements per 16-byte load */
        dflash_cuda_kernel_id v, s;
    } k[] = {
        { DFLASH_DTYPE_BF16, 8, DFK_LINEAR_BF16_V, DFK_LINEAR_BF16_S },
        { DFLASH_DTYPE_F16, 8, DFK_LINEAR_F16_V, DFK_LINEAR_F16_S },
        { DFLASH_DTYPE_F32, 4, DFK_LINEAR_F32_V, DFK_LINEAR_F32_S },
        { DFLASH_DTYPE_F8_E4M3, 16, DFK_LINEAR_FP8_V, DFK_LINEAR_FP8_S },
    };
    size_t t = 0;
    while (k[t].dt != w->dtype)
        t++;
    int64_t N = w->rows, K = w->cols;
    /* K = 0 needs no special case: every output is an empty sum, 0. */
    int vec = K % k[t].vec_elems == 0 && aligned16(w->data) && aligned16(x);
    int M = n;
    void *args[] = { (void *)&w->data, (void *)&w->scales, (void *)&x, &out, &M, &N, &K };
    /* LIN_COLS = 4 output columns and LIN_ROWS = 8 rows per block, 1-D grid
     * (linear.cu). */
    int64_t blocks = (int64_t)cdiv(N, 4) * cdiv(n, 8);
    if (blocks > 0x7fffffff)
        return dflash_fail(DFLASH_ERR_UNSUPPORTED, "cuda linear: %lld x %lld weight with %d rows is too large",
                           (long long)N, (long long)K, n);
    return launch(c, vec ? k[t].v : k[t].s, (unsigned)blocks, 1, 256, args);
}

/* Can gemm.cu take these weights (same dtype and K, bf16 with K % 32 == 0
 * or fp8 with K % 64 == 0, 16-byte aligned) and x? */
static int gemm_ok(const float *x, const dflash_weight *w, int n_w)
{
    const int64_t K = w[0].cols;
    const int fp8 = w[0].dtype == DFLASH_DTYPE_F8_E4M3;
    if (!(w[0].dtype == DFLASH_DTYPE_BF16 || fp8) || K <= 0 || K % (fp8 ? 64 : 32) != 0 || !aligned16(x))
        return 0;
    for (int i = 0; i < n_w; i++)
        if (w[i].dtype != w[0].dtype || w[i].cols != K || !aligned16(w[i].data) || w[i].rows <= 0 ||
            (fp8 && !w[i].scales))
            return 0;
    return 1;
}

/* Split-K factor: enough warps for two blocks of eight per SM, at least one
 * chunk of weight loads per slice. A function of the shape and the device
 * only, never of the row count, so a row's sums never depend on its batch. */
static int gemm_split(const cuda_ctx *c, int64_t tiles, int per_tile, int64_t k_steps)
{
    const int64_t want = 16LL * c->sm_count;
    int S = 1;
    while (2 * S * per_tile <= 8 && tiles * per_tile * S < want && k_steps / (2 * S) >= 4)
        S *= 2;
    return S;
}

/* out[i] = x W[i]^T (or the SwiGLU pair) on tensor cores, in launches of at
 * most 64 rows (each row's result is the same in any of them). */
static dflash_status gemm_launch(cuda_ctx *c, const float *x, int n, const dflash_weight *w, int n_w,
                                 float *const *out, enum dflash_act act)
{
    static const dflash_cuda_kernel_id k_bf16[4] = { DFK_GEMM_BF16_1, DFK_GEMM_BF16_2, DFK_GEMM_BF16_4,
                                                     DFK_GEMM_BF16_8 };
    static const dflash_cuda_kernel_id k_fp8[4] = { DFK_GEMM_FP8_1, DFK_GEMM_FP8_2, DFK_GEMM_FP8_4, DFK_GEMM_FP8_8 };
    const int fp8 = w[0].dtype == DFLASH_DTYPE_F8_E4M3, swiglu = act == DFLASH_ACT_SWIGLU;
    gemm_args ga;
    memset(&ga, 0, sizeof ga);
    int64_t tiles = 0;
    for (int i = 0; i < n_w; i++) {
        ga.w[i] = w[i].data;
        ga.scales[i] = w[i].scales;
        ga.n[i] = w[i].rows;
        ga.tiles[i] = (w[i].rows + 15) / 16;
        tiles += ga.tiles[i];
    }
    if (swiglu)
        tiles = ga.tiles[0];
    ga.k = w[0].cols;
    ga.n_w = n_w;
    ga.mode = swiglu;
    const int per_tile = swiglu ? 2 : 1;
    ga.split = gemm_split(c, tiles, per_tile, ga.k / (fp8 ? 64 : 32));
    const int64_t tiles_per_block = 8 / (per_tile * ga.split);
    const int64_t blocks = (tiles + tiles_per_block - 1) / tiles_per_block;
    if (blocks > 0x7fffffff)
        return dflash_fail(DFLASH_ERR_UNSUPPORTED, "cuda linear: %lld output tiles", (long long)tiles);
    for (int r0 = 0; r0 < n; r0 += 64) {
        const int m = n - r0 < 64 ? n - r0 : 64;
        const int t = m <= 8 ? 0 : m <= 16 ? 1 : m <= 32 ? 2 : 3;
        ga.m = m;
        ga.x = x + (int64_t)r0 * ga.k;
        for (int i = 0; i < n_w; i++)
            ga.out[i] = out[i] + (int64_t)r0 * w[i].rows;
        void *args[] = { &ga };
        DFLASH_TRY(launch(c, fp8 ? k_fp8[t] : k_bf16[t], (unsigned)blocks, 1, 256, args));
    }
    return DFLASH_OK;
}

static dflash_status cuda_linear(dflash_backend *be, const float *x, int n, const dflash_weight *w, float *out)
{
    cuda_ctx *c = CTX(be);
    DFLASH_TRY(check_weight(w, "linear"));
    if (n <= 0 || w->rows <= 0)
        return DFLASH_OK;
    DFLASH_TRY(enter(c));
    if (gemm_ok(x, w, 1))
        return gemm_launch(c, x, n, w, 1, &out, DFLASH_ACT_NONE);
    return linear_simt(c, x, n, w, out);
}

static dflash_status cuda_linear_group(dflash_backend *be, const float *x, int n, const dflash_weight *w, int n_w,
                                       float *const *out, enum dflash_act act)
{
    cuda_ctx *c = CTX(be);
    for (int i = 0; i < n_w; i++)
        DFLASH_TRY(check_weight(&w[i], "linear"));
    if (n <= 0)
        return DFLASH_OK;
    DFLASH_TRY(enter(c));
    if (gemm_ok(x, w, n_w))
        return gemm_launch(c, x, n, w, n_w, out, act);
    for (int i = 0; i < n_w; i++)
        if (w[i].rows > 0)
            DFLASH_TRY(linear_simt(c, x, n, &w[i], out[i]));
    if (act == DFLASH_ACT_SWIGLU)
        return be->ops->swiglu(be, out[0], out[1], (size_t)n * (size_t)w[0].rows, out[0]);
    return DFLASH_OK;
}

/* inv_freq[j] = 1 / theta^(2j / head_dim), computed on the host with the
 * very expression of the CPU reference so both see the same bits. Kept per
 * (theta, head_dim): target and drafter may differ. */
static dflash_status rope_table_get(cuda_ctx *c, double theta, int head_dim, CUdeviceptr *out)
{
    for (int i = 0; i < c->n_rope; i++)
        if (c->rope[i].theta == theta && c->rope[i].head_dim == head_dim) {
            *out = c->rope[i].data;
            return DFLASH_OK;
        }
    if (c->n_rope == MAX_ROPE_TABLES)
        return dflash_fail(DFLASH_ERR_UNSUPPORTED, "cuda norm_rope: more than %d (theta, head_dim) pairs",
                           MAX_ROPE_TABLES);
    const int half = head_dim / 2;
    float *f = malloc((size_t)(half > 0 ? half : 1) * sizeof(float));
    if (!f)
        return dflash_fail(DFLASH_ERR_OOM, "cuda norm_rope: out of memory");
    for (int j = 0; j < half; j++)
        f[j] = 1.0f / powf((float)theta, (float)(2 * j) / (float)head_dim);
    CUdeviceptr d = 0;
    dflash_status s = DFLASH_CU(&c->cu, cuMemAlloc(&d, (size_t)(half > 0 ? half : 1) * sizeof(float)));
    if (s == DFLASH_OK && half > 0)
        s = DFLASH_CU(&c->cu, cuMemcpyHtoDAsync(d, f, (size_t)half * sizeof(float), c->stream));
    free(f);
    if (s != DFLASH_OK) {
        if (d)
            c->cu.cuMemFree(d);
        return s;
    }
    c->rope[c->n_rope++] = (rope_table){ theta, head_dim, d };
    *out = d;
    return DFLASH_OK;
}

static dflash_status cuda_norm_rope(dflash_backend *be, float *x, const dflash_weight *norm, const int32_t *pos,
                                    int n, int n_heads, int head_dim, float eps, double theta, double pos_scale)
{
    cuda_ctx *c = CTX(be);
    if (norm) {
        DFLASH_TRY(check_weight(norm, "q/k norm"));
        if (norm->rows * norm->cols < head_dim)
            return dflash_fail(DFLASH_ERR_SHAPE, "norm_rope: norm %s has %lld elements, head_dim is %d",
                               norm->name ? norm->name : "?", (long long)(norm->rows * norm->cols), head_dim);
    }
    if (n <= 0 || n_heads <= 0 || head_dim <= 0)
        return DFLASH_OK;
    DFLASH_TRY(enter(c));
    CUdeviceptr inv_freq;
    DFLASH_TRY(rope_table_get(c, theta, head_dim, &inv_freq));
    const void *nd = norm ? norm->data : NULL;
    int ndt = norm ? (int)norm->dtype : 0;
    void *args[] = { &x, (void *)&nd, &ndt, (void *)&pos, &n, &n_heads, &head_dim, &eps, &inv_freq, &pos_scale };
    /* 4 warps per block, one (row, head) per warp. */
    return launch(c, DFK_NORM_ROPE, cdiv((int64_t)n * n_heads, 4), 1, 128, args);
}

static dflash_status cuda_swiglu(dflash_backend *be, const float *gate, const float *up, size_t count, float *out)
{
    cuda_ctx *c = CTX(be);
    if (!count)
        return DFLASH_OK;
    DFLASH_TRY(enter(c));
    int vec = count % 4 == 0 && aligned16(gate) && aligned16(up) && aligned16(out);
    int64_t n = (int64_t)count;
    void *args[] = { (void *)&gate, (void *)&up, &n, &out, &vec };
    return launch(c, DFK_SWIGLU, elem_blocks(c, vec ? n / 4 : n), 1, 256, args);
}

static dflash_status check_kv(const dflash_kv_layout *kv, int layer, const char *op)
{
    if (kv->dtype != DFLASH_DTYPE_F32 && kv->dtype != DFLASH_DTYPE_BF16)
        return dflash_fail(DFLASH_ERR_UNSUPPORTED, "cuda %s: KV pool dtype %s (F32 or BF16)", op,
                           dflash_dtype_name(kv->dtype));
    if (layer < 0 || layer >= kv->n_layers)
        return dflash_fail(DFLASH_ERR_INVALID_ARG, "cuda %s: layer %d outside the pool's %d layers", op, layer,
                           kv->n_layers);
    return DFLASH_OK;
}

static dflash_status cuda_kv_write(dflash_backend *be, const dflash_kv_layout *kv, int layer,
                                   const int32_t *block_tables, int bt_len, const int32_t *row_seq,
                                   const int32_t *pos, const float *k, const float *v, int n)
{
    cuda_ctx *c = CTX(be);
    DFLASH_TRY(check_kv(kv, layer, "kv_write"));
    if (bt_len <= 0)
        return dflash_fail(DFLASH_ERR_INVALID_ARG, "cuda kv_write: block table length %d", bt_len);
    if (n <= 0)
        return DFLASH_OK;
    DFLASH_TRY(enter(c));
    int bf16 = kv->dtype == DFLASH_DTYPE_BF16, n_blocks = kv->n_blocks, n_layers = kv->n_layers;
    int n_kv_heads = kv->n_kv_heads, head_dim = kv->head_dim;
    void *args[] = { (void *)&kv->data, &bf16, &n_blocks, &n_layers, &layer, &n_kv_heads, &head_dim,
                     (void *)&block_tables, &bt_len, (void *)&row_seq, (void *)&pos, (void *)&k, (void *)&v,
                     &c->err_flag, &c->err_host_dev };
    return launch(c, DFK_KV_WRITE, (unsigned)n, 2, row_threads((int64_t)n_kv_heads * head_dim, 256), args);
}

/* The general attention kernel: one block per (row, head). */
static dflash_status attention_simt(cuda_ctx *c, const dflash_attn_args *a)
{
    const void *pool = a->kv ? a->kv->data : NULL;
    int n_blocks = a->kv ? a->kv->n_blocks : 0, n_layers = a->kv ? a->kv->n_layers : 1;
    int layer = a->layer, bt_len = a->bt_len > 0 ? a->bt_len : 1;
    int n_heads = a->n_heads, n_kv_heads = a->n_kv_heads, D = a->head_dim, causal = a->causal, window = a->window;
    float scale = a->scale;
    int vec = D % 4 == 0 && aligned16(pool) && aligned16(a->k_extra);
    void *args[] = { (void *)&a->q, (void *)&a->out, (void *)&a->q_pos, (void *)&a->row_seq, (void *)&a->seq_info,
                     (void *)&pool, &n_blocks, &n_layers, &layer, (void *)&a->block_tables, &bt_len,
                     (void *)&a->k_extra, (void *)&a->v_extra, &n_heads, &n_kv_heads, &D, &scale, &causal,
                     &window, &vec, &c->err_flag, &c->err_host_dev };
    const int bf16 = a->kv && a->kv->dtype == DFLASH_DTYPE_BF16;
    return launch(c, bf16 ? DFK_ATTENTION_BF16 : DFK_ATTENTION_F32, (unsigned)a->n_rows, (unsigned)a->n_heads, 128,
                  args);
}

/* Room for the partials of `splits` key splits of every (row, head). */
static dflash_status part_reserve(cuda_ctx *c, int splits, int n_rows, int n_heads, int D)
{
    const size_t need = (size_t)splits * n_rows * n_heads * D;
    if (need <= c->part_cap)
        return DFLASH_OK;
    /* Work in flight may still read the old buffers. */
    DFLASH_TRY(DFLASH_CU(&c->cu, cuStreamSynchronize(c->stream)));
    if (c->part_o)
        c->cu.cuMemFree(c->part_o);
    if (c->part_ml)
        c->cu.cuMemFree(c->part_ml);
    c->part_o = c->part_ml = 0;
    c->part_cap = 0;
    DFLASH_TRY(DFLASH_CU(&c->cu, cuMemAlloc(&c->part_o, need * sizeof(float))));
    DFLASH_TRY(DFLASH_CU(&c->cu, cuMemAlloc(&c->part_ml, need / D * 2 * sizeof(float))));
    c->part_cap = need;
    return DFLASH_OK;
}

/* The tensor-core kernel (bf16 pages, head_dim 16/32/64/128), then the
 * merge of key splits when a sequence has more than one. */
static dflash_status attention_tc(cuda_ctx *c, const dflash_attn_args *a)
{
    const int D = a->head_dim, G = a->n_heads / a->n_kv_heads;
    const dflash_cuda_kernel_id kid = D == 16 ? DFK_ATTENTION_TC_16 : D == 32 ? DFK_ATTENTION_TC_32
                                      : D == 64 ? DFK_ATTENTION_TC_64 : DFK_ATTENTION_TC_128;
    const int64_t qv = (int64_t)a->max_seq_rows * G;
    const int chunks = (int)((qv + ATTN_TC_QV - 1) / ATTN_TC_QV);
    const int cw = (int)(((qv < ATTN_TC_QV ? qv : ATTN_TC_QV) + 15) / 16);
    const int splits = a->max_keys > 0 ? (a->max_keys + ATTN_TC_SPLIT - 1) / ATTN_TC_SPLIT : 1;
    if (splits > 65535 || chunks > 65535)
        return dflash_fail(DFLASH_ERR_UNSUPPORTED, "cuda attention: %d keys, %d rows per sequence", a->max_keys,
                           a->max_seq_rows);
    if (splits > 1)
        DFLASH_TRY(part_reserve(c, splits, a->n_rows, a->n_heads, D));
    attn_tc_args t = {
        .q = a->q, .out = a->out, .q_pos = a->q_pos, .seq_info = a->seq_info, .pool = a->kv->data,
        .block_tables = a->block_tables, .k_extra = a->k_extra, .v_extra = a->k_extra ? a->v_extra : NULL,
        .part_o = (void *)(uintptr_t)c->part_o, .part_ml = (void *)(uintptr_t)c->part_ml,
        .eflag = (void *)(uintptr_t)c->err_flag, .ehost = (void *)(uintptr_t)c->err_host_dev, .scale = a->scale,
        .n_blocks = a->kv->n_blocks, .n_layers = a->kv->n_layers, .layer = a->layer,
        .bt_len = a->bt_len > 0 ? a->bt_len : 1, .n_rows = a->n_rows, .n_heads = a->n_heads,
        .n_kv_heads = a->n_kv_heads, .causal = a->causal, .window = a->window, .compute_warps = cw,
    };
    void *args[] = { &t };
    const unsigned threads = 32u * (unsigned)(cw > 4 ? cw : 4);
    DFLASH_TRY(launch3(c, kid, (unsigned)(a->n_seqs * a->n_kv_heads), (unsigned)splits, (unsigned)chunks, threads,
                       args));
    if (splits == 1)
        return DFLASH_OK;
    int n_rows = a->n_rows, n_heads = a->n_heads, has_extra = a->k_extra != NULL;
    void *cargs[] = { &c->part_o, &c->part_ml, (void *)&a->out, (void *)&a->row_seq, (void *)&a->seq_info,
                      &n_rows, &n_heads, &has_extra, (void *)&D };
    return launch(c, DFK_ATTN_COMBINE, (unsigned)n_rows, (unsigned)n_heads, (unsigned)((D + 31) / 32 * 32), cargs);
}

static dflash_status cuda_attention(dflash_backend *be, const dflash_attn_args *a)
{
    cuda_ctx *c = CTX(be);
    if (a->n_kv_heads <= 0 || a->n_heads % a->n_kv_heads != 0)
        return dflash_fail(DFLASH_ERR_INVALID_ARG, "attention: %d heads not a multiple of %d kv heads", a->n_heads,
                           a->n_kv_heads);
    if (a->head_dim <= 0 || a->head_dim > 512)
        return dflash_fail(DFLASH_ERR_UNSUPPORTED, "cuda attention: head_dim %d (1..512 supported)", a->head_dim);
    if (a->kv) {
        DFLASH_TRY(check_kv(a->kv, a->layer, "attention"));
        if (a->kv->n_kv_heads != a->n_kv_heads || a->kv->head_dim != a->head_dim)
            return dflash_fail(DFLASH_ERR_SHAPE, "cuda attention: pool has %d x %d kv heads, args %d x %d",
                               a->kv->n_kv_heads, a->kv->head_dim, a->n_kv_heads, a->head_dim);
    }
    if (a->n_rows <= 0 || a->n_heads <= 0)
        return DFLASH_OK;
    if (a->n_heads > 65535)
        return dflash_fail(DFLASH_ERR_UNSUPPORTED, "cuda attention: %d heads", a->n_heads);
    DFLASH_TRY(enter(c));
    const int D = a->head_dim;
    const int tc = a->kv && a->kv->dtype == DFLASH_DTYPE_BF16 && (D == 16 || D == 32 || D == 64 || D == 128) &&
                   a->n_seqs > 0 && a->max_seq_rows > 0 && a->max_keys >= 0 && aligned16(a->q) &&
                   (!a->k_extra || (aligned16(a->k_extra) && aligned16(a->v_extra)));
    return tc ? attention_tc(c, a) : attention_simt(c, a);
}

static dflash_status cuda_copy_rows(dflash_backend *be, float *dst, int64_t dst_stride, const float *src,
                                    int64_t src_stride, const int32_t *idx, int n, int64_t cols)
{
    cuda_ctx *c = CTX(be);
    if (n <= 0 || cols <= 0)
        return DFLASH_OK;
    DFLASH_TRY(enter(c));
    int vec = cols % 4 == 0 && dst_stride % 4 == 0 && src_stride % 4 == 0 && aligned16(dst) && aligned16(src);
    unsigned chunks = cdiv(vec ? cols / 4 : cols, 256 * 4);
    if (chunks > 65535)
        chunks = 65535;
    void *args[] = { &dst, &dst_stride, (void *)&src, &src_stride, (void *)&idx, &cols, &vec };
    return launch(c, DFK_COPY_ROWS, (unsigned)n, chunks, 256, args);
}

static dflash_status cuda_argmax(dflash_backend *be, const float *x, int n, int cols, int32_t *out)
{
    cuda_ctx *c = CTX(be);
    if (n <= 0)
        return DFLASH_OK;
    DFLASH_TRY(enter(c));
    int vec = cols % 4 == 0 && aligned16(x);
    void *args[] = { (void *)&x, &cols, &out, &vec };
    return launch(c, DFK_ARGMAX, (unsigned)n, 1, 1024, args);
}

static const dflash_backend_ops k_cuda_ops = {
    .name = "cuda",
    .kv_dtype = DFLASH_DTYPE_BF16, /* half the bytes; the tensor-core attention reads it */
    .destroy = cuda_destroy,
    .alloc = cuda_alloc,
    .free = cuda_free,
    .upload = cuda_upload,
    .download = cuda_download,
    .sync = cuda_sync,
    .weight_from_host = cuda_weight_from_host,
    .embed = cuda_embed,
    .add_rmsnorm = cuda_add_rmsnorm,
    .add = cuda_add,
    .linear = cuda_linear,
    .norm_rope = cuda_norm_rope,
    .swiglu = cuda_swiglu,
    .kv_write = cuda_kv_write,
    .attention = cuda_attention,
    .copy_rows = cuda_copy_rows,
    .argmax = cuda_argmax,
    .linear_group = cuda_linear_group,
};

/* ---- tools -------------------------------------------------------------- */

dflash_status dflash_cuda_timer_start(dflash_backend *be)
{
    cuda_ctx *c = CTX(be);
    if (be->ops != &k_cuda_ops)
        return dflash_fail(DFLASH_ERR_INVALID_ARG, "cuda timer: not a CUDA backend");
    DFLASH_TRY(enter(c));
    return DFLASH_CU(&c->cu, cuEventRecord(c->ev[0], c->stream));
}

dflash_status dflash_cuda_timer_stop(dflash_backend *be, float *ms)
{
    cuda_ctx *c = CTX(be);
    if (be->ops != &k_cuda_ops)
        return dflash_fail(DFLASH_ERR_INVALID_ARG, "cuda timer: not a CUDA backend");
    DFLASH_TRY(enter(c));
    DFLASH_TRY(DFLASH_CU(&c->cu, cuEventRecord(c->ev[1], c->stream)));
    DFLASH_TRY(DFLASH_CU(&c->cu, cuEventSynchronize(c->ev[1])));
    DFLASH_TRY(DFLASH_CU(&c->cu, cuEventElapsedTime(ms, c->ev[0], c->ev[1])));
    return check_kernel_errors(c);
}

dflash_status dflash_cuda_copy(dflash_backend *be, void *dst, const void *src, size_t bytes)
{
    cuda_ctx *c = CTX(be);
    if (be->ops != &k_cuda_ops)
        return dflash_fail(DFLASH_ERR_INVALID_ARG, "cuda copy: not a CUDA backend");
    DFLASH_TRY(enter(c));
    return DFLASH_CU(&c->cu, cuMemcpyDtoDAsync(DPTR(dst), DPTR(src), bytes, c->stream));
}

const char *dflash_cuda_device_desc(dflash_backend *be)
{
    return be->ops == &k_cuda_ops ? CTX(be)->desc : "not a CUDA backend";
}

/* ---- creation ----------------------------------------------------------- */

static dflash_status load_kernels(cuda_ctx *c)
{
    int announced = 0;
    for (int i = 0; i < dflash_cuda_src_count; i++) {
        const dflash_cuda_src *src = &dflash_cuda_srcs[i];
        if (src->is_header)
            continue;
        if (c->n_mods == MAX_MODULES)
            return dflash_fail(DFLASH_ERR_BACKEND, "cuda: more than %d kernel files", MAX_MODULES);
        void *cubin = NULL;
        size_t size = 0;
        DFLASH_TRY(dflash_cuda_cubin_get(&c->nv, src, c->arch, &announced, &cubin, &size));
        dflash_status s = DFLASH_CU(&c->cu, cuModuleLoadData(&c->mods[c->n_mods], cubin));
        free(cubin);
        if (s != DFLASH_OK)
            return dflash_fail_prefix(s, "cuda: loading the CUBIN of %s: ", src->name);
        c->n_mods++;
        for (int k = 0; k < DFK_COUNT; k++)
            if (strcmp(dflash_cuda_kernels[k].file, src->name) == 0) {
                s = DFLASH_CU(&c->cu, cuModuleGetFunction(&c->fn[k], c->mods[c->n_mods - 1],
                                                          dflash_cuda_kernels[k].name));
                if (s != DFLASH_OK)
                    return dflash_fail_prefix(s, "cuda: kernel %s in %s: ", dflash_cuda_kernels[k].name,
                                              src->name);
            }
    }
    for (int k = 0; k < DFK_COUNT; k++)
        if (!c->fn[k])
            return dflash_fail(DFLASH_ERR_BACKEND, "cuda: kernel %s: its file %s is not embedded",
                               dflash_cuda_kernels[k].name, dflash_cuda_kernels[k].file);
    return DFLASH_OK;
}

static dflash_status open_device(cuda_ctx *c, int device)
{
    dflash_cuda_api *cu = &c->cu;
    DFLASH_TRY(dflash_cuda_api_load(cu));
    CUresult r = cu->cuInit(0);
    if (r != DFLASH_CUDA_SUCCESS) {
        char text[256];
        return dflash_fail(DFLASH_ERR_BACKEND, "cuInit failed: %s", dflash_cu_error_text(cu, r, text, sizeof text));
    }
    int count = 0;
    DFLASH_TRY(DFLASH_CU(cu, cuDeviceGetCount(&count)));
    if (count == 0)
        return dflash_fail(DFLASH_ERR_BACKEND, "no CUDA device (the driver reports 0 devices)");
    if (device < 0 || device >= count)
        return dflash_fail(DFLASH_ERR_BACKEND, "CUDA device %d requested, %d present", device, count);
    DFLASH_TRY(DFLASH_CU(cu, cuDeviceGet(&c->dev, device)));
    DFLASH_TRY(DFLASH_CU(cu, cuDeviceGetName(c->dev_name, (int)sizeof c->dev_name, c->dev)));
    int major = 0, minor = 0;
    DFLASH_TRY(DFLASH_CU(cu, cuDeviceGetAttribute(&major, DFLASH_CU_ATTR_CC_MAJOR, c->dev)));
    DFLASH_TRY(DFLASH_CU(cu, cuDeviceGetAttribute(&minor, DFLASH_CU_ATTR_CC_MINOR, c->dev)));
    DFLASH_TRY(DFLASH_CU(cu, cuDeviceGetAttribute(&c->sm_count, DFLASH_CU_ATTR_MULTIPROCESSOR_COUNT, c->dev)));
    dflash_cuda_arch_name(major, minor, c->arch, sizeof c->arch);
    /* The primary context: the one the runtime API and other libraries in
     * the process share, so buffers can be handed across. */
    DFLASH_TRY(DFLASH_CU(cu, cuDevicePrimaryCtxRetain(&c->ctx, c->dev)));
    c->ctx_retained = 1;
    DFLASH_TRY(enter(c));
    DFLASH_TRY(DFLASH_CU(cu, cuStreamCreate(&c->stream, DFLASH_CU_STREAM_NON_BLOCKING)));
    void *h = NULL;
    DFLASH_TRY(DFLASH_CU(cu, cuMemHostAlloc(&h, 4 * sizeof(int), DFLASH_CU_MEMHOSTALLOC_DEVICEMAP)));
    c->err_host = h;
    memset(h, 0, 4 * sizeof(int));
    DFLASH_TRY(DFLASH_CU(cu, cuMemHostGetDevicePointer(&c->err_host_dev, h, 0)));
    DFLASH_TRY(DFLASH_CU(cu, cuMemAlloc(&c->err_flag, sizeof(int))));
    DFLASH_TRY(DFLASH_CU(cu, cuMemsetD32Async(c->err_flag, 0, 1, c->stream)));
    for (int i = 0; i < 2; i++)
        DFLASH_TRY(DFLASH_CU(cu, cuEventCreate(&c->ev[i], DFLASH_CU_EVENT_DEFAULT)));
    snprintf(c->desc, sizeof c->desc, "%s (%s, %d SMs)", c->dev_name, c->arch, c->sm_count);
    DFLASH_TRY(dflash_nvrtc_api_load(&c->nv));
    DFLASH_TRY(load_kernels(c));
    return DFLASH_CU(cu, cuStreamSynchronize(c->stream));
}

dflash_status dflash_backend_cuda_create(int device, dflash_backend **out)
{
    *out = NULL;
    dflash_backend *be = calloc(1, sizeof *be);
    cuda_ctx *c = calloc(1, sizeof *c);
    if (!be || !c) {
        free(be);
        free(c);
        return dflash_fail(DFLASH_ERR_OOM, "cuda backend: out of memory");
    }
    be->ops = &k_cuda_ops;
    be->ctx = c;
    dflash_status s = open_device(c, device);
    if (s != DFLASH_OK) {
        cuda_destroy(be);
        return s;
    }
    *out = be;
    return DFLASH_OK;
}
