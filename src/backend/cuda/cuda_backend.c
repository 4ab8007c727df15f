/* cuda_backend.c: the CUDA backend: device, primary context and one stream;
 * memory (cuMemAlloc, copies ordered on the stream, workspaces); kernel
 * modules (from the disk cache or NVRTC); the ops table, with the launchers
 * of the small ops here (the linear ops are in cuda_gemm.c, KV writes and
 * attention in cuda_attention.c). Each launcher checks arguments as the
 * CPU reference does, picks the grid and launches on the stream.
 * Kernels report data errors (bad token id, KV page outside the pool)
 * through mapped host memory, read at the next sync or download. */
#include "backend/cuda/cuda_backend.h"

#include <dlfcn.h>
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_internal.h"
#include "core/levers.h"

/* The kernels take dflash_dtype values as their DT_* codes (common.cuh). */
_Static_assert(DFLASH_DTYPE_F32 == 1 && DFLASH_DTYPE_F16 == 2 && DFLASH_DTYPE_BF16 == 3 &&
                   DFLASH_DTYPE_F8_E4M3 == 4,
               "kernels/common.cuh DT_* codes must match dflash_dtype");

static const dflash_backend_ops k_cuda_ops;

/* ---- launching ---------------------------------------------------------- */

/* With programmatic dependent launch a kernel may start while the previous
 * one in the stream finishes: each kernel streams what it can (weights)
 * and waits (griddepcontrol.wait, kernels/common.cuh) before touching
 * anything the previous one wrote. That hides each launch's ramp-up. */
dflash_status cuda_launch3(cuda_ctx *c, dflash_cuda_kernel_id k, unsigned gx, unsigned gy, unsigned gz,
                           unsigned block, void **args)
{
    dflash_status s;
    const int smem = dflash_cuda_kernels[k].dyn_smem;
    if (c->pdl) {
        dflash_cu_launch_attr attr;
        memset(&attr, 0, sizeof attr);
        attr.id = DFLASH_CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
        attr.value.value = 1;
        dflash_cu_launch_config cfg = { gx, gy, gz, block, 1, 1, (unsigned)smem, c->stream, &attr, 1 };
        s = DFLASH_CU(&c->cu, cuLaunchKernelEx(&cfg, c->fn[k], args, NULL));
    } else {
        s = DFLASH_CU(&c->cu,
                      cuLaunchKernel(c->fn[k], gx, gy, gz, block, 1, 1, (unsigned)smem, c->stream, args, NULL));
    }
    if (s != DFLASH_OK)
        return dflash_fail_prefix(s, "cuda kernel %s (grid %u x %u x %u, block %u): ", dflash_cuda_kernels[k].name,
                                  gx, gy, gz, block);
    c->count.launches++;
    return DFLASH_OK;
}

static int weight_dtype_ok(const dflash_weight *w)
{
    return w->dtype == DFLASH_DTYPE_BF16 || w->dtype == DFLASH_DTYPE_F16 || w->dtype == DFLASH_DTYPE_F32 ||
           (w->dtype == DFLASH_DTYPE_F8_E4M3 && w->scales);
}

dflash_status cuda_check_weight(const dflash_weight *w, const char *op)
{
    if (!weight_dtype_ok(w))
        return dflash_fail(DFLASH_ERR_UNSUPPORTED, "cuda %s: weight %s has dtype %s%s", op, w->name ? w->name : "?",
                           dflash_dtype_name(w->dtype), w->dtype == DFLASH_DTYPE_F8_E4M3 ? " without scales" : "");
    return DFLASH_OK;
}

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
        return dflash_fail(DFLASH_ERR_INVALID_ARG, "kv_write: position %d maps to page %d (pool has %d)", a, b, v);
    case 3:
        return dflash_fail(DFLASH_ERR_INVALID_ARG, "attention: key position %d maps to page %d (pool has %d)", a,
                           b, v);
    case 4:
        return dflash_fail(DFLASH_ERR_INVALID_ARG,
                           "attention: sequence %d has %d keys, past the call's bound on the keys (max_keys; its "
                           "grid sized for %d key splits)", a, b, v);
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

/* A stamps build (DFLASH_CUDA_STAMPS=FILE): every module's block stamp
 * records (common.cuh), appended to FILE as raw 64-bit words, and a line
 * on stderr. Teardown of a measurement run: a failure is reported, not returned. */
static void write_stamps(cuda_ctx *c)
{
    enum { WORDS = 11 }; /* a record's words: common.cuh's STAMP_N */
    const char *path = getenv("DFLASH_CUDA_STAMPS");
    if (!path || !path[0])
        return;
    FILE *f = fopen(path, "ab");
    if (!f) {
        fprintf(stderr, "dflash: stamps: %s cannot be opened: %s\n", path, strerror(errno));
        return;
    }
    size_t total = 0, dropped = 0;
    for (int i = 0; i < c->n_mods; i++) {
        CUdeviceptr words = 0, count = 0;
        size_t bytes = 0, count_bytes = 0;
        unsigned n = 0;
        if (c->cu.cuModuleGetGlobal(&words, &bytes, c->mods[i], "dflash_stamps") != 0 ||
            c->cu.cuModuleGetGlobal(&count, &count_bytes, c->mods[i], "dflash_stamp_count") != 0 ||
            c->cu.cuMemcpyDtoHAsync(&n, count, sizeof n, c->stream) != 0 || c->cu.cuStreamSynchronize(c->stream) != 0)
            continue;
        const size_t cap = bytes / (WORDS * sizeof(uint64_t)), keep = n < cap ? n : cap;
        uint64_t *buf = malloc(keep * WORDS * sizeof(uint64_t) + 1);
        if (buf && c->cu.cuMemcpyDtoHAsync(buf, words, keep * WORDS * sizeof(uint64_t), c->stream) == 0 &&
            c->cu.cuStreamSynchronize(c->stream) == 0 && fwrite(buf, sizeof(uint64_t), keep * WORDS, f) == keep * WORDS) {
            total += keep;
            dropped += n - keep;
        }
        free(buf);
    }
    if (fclose(f) != 0)
        fprintf(stderr, "dflash: stamps: %s: write error\n", path);
    fprintf(stderr, "dflash: stamps: %zu block records to %s, %zu older ones overwritten\n", total, path, dropped);
}

static void cuda_destroy(dflash_backend *be)
{
    cuda_ctx *c = CTX(be);
    if (c->ctx) {
        /* Teardown: report nothing, release everything that was made. */
        c->cu.cuCtxSetCurrent(c->ctx);
        if (c->stream)
            c->cu.cuStreamSynchronize(c->stream);
        write_stamps(c);
        for (size_t i = 0; i < c->n_owned; i++)
            c->cu.cuMemFree(c->owned[i]);
        for (int i = 0; i < c->n_rope; i++)
            c->cu.cuMemFree(c->rope[i].data);
        free(c->rope);
        cuda_buf *bufs[] = { &c->part_o, &c->part_ml, &c->gemm_ws, &c->gemm_cnt, &c->am_val, &c->am_idx, &c->am_bad,
                             &c->gemm_xs, &c->smp_rows, &c->smp_e, &c->smp_hist, &c->smp_pen, &c->smp_ids };
        for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
            cuda_buf_free(c, bufs[i]);
        if (c->err_flag)
            c->cu.cuMemFree(c->err_flag);
        if (c->err_host)
            c->cu.cuMemFreeHost(c->err_host);
        for (int i = 0; i < c->n_mods; i++)
            c->cu.cuModuleUnload(c->mods[i]);
        for (int i = 0; i < 2; i++)
            if (c->ev[i])
                c->cu.cuEventDestroy(c->ev[i]);
        for (int i = 0; i < DFLASH_BACKEND_MARKS; i++)
            if (c->marks[i])
                c->cu.cuEventDestroy(c->marks[i]);
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
    DFLASH_TRY(cuda_enter(c));
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

/* What a graph cannot hold: copies from pageable memory, waits for the
 * device, workspaces that move. */
static dflash_status refuse_while_capturing(const cuda_ctx *c, const char *what)
{
    return c->capturing ? dflash_fail(DFLASH_ERR_BACKEND, "cuda %s while capturing a graph", what) : DFLASH_OK;
}

/* Pageable sources are staged by the driver before the call returns, so the
 * caller may reuse `src` at once; the copy stays ordered with the ops. A
 * graph cannot hold a copy from pageable memory: refused while capturing. */
static dflash_status cuda_upload(dflash_backend *be, void *dst, const void *src, size_t bytes)
{
    cuda_ctx *c = CTX(be);
    if (!bytes)
        return DFLASH_OK;
    DFLASH_TRY(refuse_while_capturing(c, "upload"));
    DFLASH_TRY(cuda_enter(c));
    c->count.uploads++;
    c->count.upload_bytes += (int64_t)bytes;
    return DFLASH_CU(&c->cu, cuMemcpyHtoDAsync(DPTR(dst), src, bytes, c->stream));
}

static dflash_status cuda_mark(dflash_backend *be, int slot)
{
    cuda_ctx *c = CTX(be);
    if (slot < 0 || slot >= DFLASH_BACKEND_MARKS)
        return dflash_fail(DFLASH_ERR_INVALID_ARG, "cuda mark: slot %d (0..%d)", slot, DFLASH_BACKEND_MARKS - 1);
    DFLASH_TRY(refuse_while_capturing(c, "mark"));
    DFLASH_TRY(cuda_enter(c));
    return DFLASH_CU(&c->cu, cuEventRecord(c->marks[slot], c->stream));
}

static dflash_status cuda_mark_ms(dflash_backend *be, int from, int to, double *ms)
{
    cuda_ctx *c = CTX(be);
    if (from < 0 || from >= DFLASH_BACKEND_MARKS || to < 0 || to >= DFLASH_BACKEND_MARKS)
        return dflash_fail(DFLASH_ERR_INVALID_ARG, "cuda mark: slots %d, %d (0..%d)", from, to,
                           DFLASH_BACKEND_MARKS - 1);
    DFLASH_TRY(cuda_enter(c));
    float f = 0;
    DFLASH_TRY(DFLASH_CU(&c->cu, cuEventElapsedTime(&f, c->marks[from], c->marks[to])));
    *ms = f;
    return DFLASH_OK;
}

static dflash_status cuda_sync(dflash_backend *be)
{
    cuda_ctx *c = CTX(be);
    DFLASH_TRY(refuse_while_capturing(c, "sync"));
    DFLASH_TRY(cuda_enter(c));
    c->count.syncs++;
    DFLASH_TRY(DFLASH_CU(&c->cu, cuStreamSynchronize(c->stream)));
    return check_kernel_errors(c);
}

static dflash_status cuda_download(dflash_backend *be, void *dst, const void *src, size_t bytes)
{
    cuda_ctx *c = CTX(be);
    DFLASH_TRY(refuse_while_capturing(c, "download"));
    DFLASH_TRY(cuda_enter(c));
    c->count.downloads++;
    c->count.syncs++;
    if (bytes)
        DFLASH_TRY(DFLASH_CU(&c->cu, cuMemcpyDtoHAsync(dst, DPTR(src), bytes, c->stream)));
    DFLASH_TRY(DFLASH_CU(&c->cu, cuStreamSynchronize(c->stream)));
    return check_kernel_errors(c);
}

dflash_status cuda_buf_reserve(cuda_ctx *c, cuda_buf *b, size_t bytes, int zero)
{
    if (bytes <= b->bytes)
        return DFLASH_OK;
    DFLASH_TRY(refuse_while_capturing(c, "workspace growth"));
    /* Work in flight may still use the old buffer; graphs captured with it
     * are stale from now on. */
    DFLASH_TRY(DFLASH_CU(&c->cu, cuStreamSynchronize(c->stream)));
    c->ws_gen++;
    cuda_buf_free(c, b);
    size_t n = (bytes + 255) / 256 * 256;
    dflash_status s = DFLASH_CU(&c->cu, cuMemAlloc(&b->p, n));
    if (s != DFLASH_OK) {
        b->p = 0;
        return dflash_fail_prefix(s, "cuda: workspace of %zu bytes: ", bytes);
    }
    if (zero)
        DFLASH_TRY(DFLASH_CU(&c->cu, cuMemsetD32Async(b->p, 0, n / 4, c->stream)));
    b->bytes = n;
    return DFLASH_OK;
}

void cuda_buf_free(cuda_ctx *c, cuda_buf *b)
{
    if (b->p)
        c->cu.cuMemFree(b->p);
    b->p = 0;
    b->bytes = 0;
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

/* ---- ops ---------------------------------------------------------------- */

static dflash_status cuda_embed(dflash_backend *be, const dflash_weight *table, const int32_t *ids, int n,
                                float *out)
{
    cuda_ctx *c = CTX(be);
    DFLASH_TRY(cuda_check_weight(table, "embed"));
    if (n <= 0)
        return DFLASH_OK;
    DFLASH_TRY(cuda_enter(c));
    int dt = (int)table->dtype;
    int64_t rows = table->rows, cols = table->cols;
    void *args[] = { (void *)&table->data, &dt, &rows, &cols, (void *)&ids, &out, &c->err_flag, &c->err_host_dev };
    unsigned chunks = cdiv(cols, 256 * 4);
    return cuda_launch(c, DFK_EMBED, (unsigned)n, chunks ? chunks : 1, 256, args);
}

/* norm.cu's add_rmsnorm: AR_PER (16) elements a thread, at most 512
 * threads (its ~92 registers a thread do not fit 1024 threads in an SM's
 * 64K registers). */
enum { RMS_MAX_THREADS = 512, RMS_MAX_DIM = 16 * RMS_MAX_THREADS };
/* its twins with a computed delta (gathered, or split-K partials):
 * AR_SMALL_PER (8) elements a thread */
enum { RMS_SMALL_MAX_DIM = 8 * RMS_MAX_THREADS };

/* An RMSNorm's weight fits rows of dim, and norm.cu takes such rows. */
static dflash_status check_rmsnorm(const dflash_weight *w, int dim)
{
    DFLASH_TRY(cuda_check_weight(w, "rmsnorm"));
    if (w->rows * w->cols != dim)
        return dflash_fail(DFLASH_ERR_SHAPE, "rmsnorm: weight %s has %lld elements, rows have %d",
                           w->name ? w->name : "?", (long long)(w->rows * w->cols), dim);
    if (dim > RMS_MAX_DIM)
        return dflash_fail(DFLASH_ERR_UNSUPPORTED, "cuda rmsnorm: rows of %d elements (at most %d)", dim, RMS_MAX_DIM);
    return DFLASH_OK;
}

static dflash_status cuda_add_rmsnorm(dflash_backend *be, float *x, const float *delta, const dflash_weight *w,
                                      int n, int dim, float eps, float *out)
{
    cuda_ctx *c = CTX(be);
    DFLASH_TRY(check_rmsnorm(w, dim));
    if (n <= 0)
        return DFLASH_OK;
    DFLASH_TRY(cuda_enter(c));
    int wdt = (int)w->dtype;
    void *args[] = { &x, (void *)&delta, (void *)&w->data, &wdt, &dim, &eps, &out };
    return cuda_launch(c, DFK_ADD_RMSNORM, (unsigned)n, 1, row_threads(dim, RMS_MAX_THREADS), args);
}

/* add_rmsnorm with a gathered delta, in one launch where the row fits the
 * kernel's block (norm.cu: dim <= RMS_SMALL_MAX_DIM), else composed. */
static dflash_status cuda_gather_add_rmsnorm(dflash_backend *be, float *x, const dflash_gather *sum, float *delta,
                                             const dflash_weight *w, int n, int dim, float eps, float *out)
{
    cuda_ctx *c = CTX(be);
    if (dim > RMS_SMALL_MAX_DIM)
        return dflash_be_gather_add_rmsnorm_composed(be, x, sum, delta, w, n, dim, eps, out);
    DFLASH_TRY(check_rmsnorm(w, dim));
    if (n <= 0)
        return DFLASH_OK;
    DFLASH_TRY(cuda_enter(c));
    int wdt = (int)w->dtype, k = sum->k;
    void *args[] = { &x, (void *)&sum->src, (void *)&sum->idx, (void *)&sum->w, &k, (void *)&w->data, &wdt, &dim, &eps,
                     &out };
    return cuda_launch(c, DFK_GATHER_ADD_RMSNORM, (unsigned)n, 1, row_threads(dim, RMS_MAX_THREADS), args);
}

/* x += in W^T with the next norm: the GEMM leaves its split-K sum to the
 * norm's launch where it can (cuda_gemm_partials; then norm.cu's
 * split_add_rmsnorm, rows of at most RMS_SMALL_MAX_DIM, a cluster of 8
 * blocks a row where clusters exist), which removes the GEMM's arrival
 * count, wait and last pass over the partials; else the composition. The
 * same bits either way. */
static dflash_status cuda_linear_add_rmsnorm(dflash_backend *be, const float *in, int n, const dflash_weight *W,
                                             float *x, float *delta, const dflash_weight *w, int dim, float eps,
                                             float *out)
{
    cuda_ctx *c = CTX(be);
    DFLASH_TRY(check_rmsnorm(w, dim));
    cuda_partials p = { 0 };
    if (dim <= RMS_SMALL_MAX_DIM)
        DFLASH_TRY(cuda_gemm_partials(c, in, n, W, 1, &p));
    if (!p.slices)
        return dflash_be_linear_add_rmsnorm_composed(be, in, n, W, x, delta, w, dim, eps, out);
    const float *scales = W->dtype == DFLASH_DTYPE_F8_E4M3 ? W->scales : NULL;
    int wdt = (int)w->dtype;
    void *args[] = { &x, (void *)&p.ws, &p.slices, &p.stride, &p.ld, (void *)&scales, (void *)&w->data, &wdt, &dim,
                     &eps, &out };
    const unsigned blocks = (unsigned)n * (c->clusters ? 8u : 1u); /* norm.cu's AR_CLUSTER */
    return cuda_launch(c, DFK_SPLIT_ADD_RMSNORM, blocks, 1, row_threads(dim, RMS_MAX_THREADS), args);
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
    DFLASH_TRY(cuda_enter(c));
    int vec = count % 4 == 0 && aligned16(x) && aligned16(delta);
    int64_t n = (int64_t)count;
    void *args[] = { &x, (void *)&delta, &n, &vec };
    return cuda_launch(c, DFK_ADD, elem_blocks(c, vec ? n / 4 : n), 1, 256, args);
}

static dflash_status cuda_add_bias(dflash_backend *be, float *x, const dflash_weight *b, int n, int cols)
{
    cuda_ctx *c = CTX(be);
    DFLASH_TRY(cuda_check_weight(b, "bias"));
    DFLASH_TRY(dflash_be_check_bias(b, cols));
    if (n <= 0 || cols <= 0)
        return DFLASH_OK;
    DFLASH_TRY(cuda_enter(c));
    int dt = (int)b->dtype;
    int64_t n_cols = cols;
    unsigned chunks = cdiv(n_cols, 256 * 4);
    if (chunks > 65535)
        chunks = 65535;
    void *args[] = { &x, (void *)&b->data, &dt, &n_cols };
    return cuda_launch(c, DFK_ADD_BIAS, (unsigned)n, chunks, 256, args);
}

/* The device copy of a RoPE table (computed on the host by core/rope.c,
 * the same table the CPU rotates with, so both see the same angles). Kept
 * per distinct table for the backend's life: target and drafter may
 * differ, and one backend may serve many models in turn. */
static dflash_status rope_table_get(cuda_ctx *c, const dflash_rope *rope, CUdeviceptr *out)
{
    const size_t bytes = (size_t)(rope->n_pairs ? rope->n_pairs : 1) * sizeof(float); /* 0 pairs: no rotation */
    for (int i = 0; i < c->n_rope; i++)
        if (c->rope[i].host.n_pairs == rope->n_pairs && memcmp(c->rope[i].host.inv_freq, rope->inv_freq, bytes) == 0) {
            *out = c->rope[i].data;
            return DFLASH_OK;
        }
    if (c->n_rope == c->cap_rope) {
        const int cap = c->cap_rope ? 2 * c->cap_rope : 4;
        rope_table *grown = realloc(c->rope, (size_t)cap * sizeof *grown);
        if (!grown)
            return dflash_fail(DFLASH_ERR_OOM, "cuda norm_rope: out of memory for %d RoPE tables", cap);
        c->rope = grown;
        c->cap_rope = cap;
    }
    CUdeviceptr d = 0;
    DFLASH_TRY(DFLASH_CU(&c->cu, cuMemAlloc(&d, bytes)));
    rope_table *t = &c->rope[c->n_rope];
    t->host = *rope;
    /* from the table's own copy: the upload is asynchronous */
    dflash_status s = DFLASH_CU(&c->cu, cuMemcpyHtoDAsync(d, t->host.inv_freq, bytes, c->stream));
    if (s != DFLASH_OK) {
        c->cu.cuMemFree(d);
        return s;
    }
    t->data = d;
    c->n_rope++;
    *out = d;
    return DFLASH_OK;
}

static dflash_status check_head_norm(const dflash_weight *norm, int head_dim)
{
    if (!norm)
        return DFLASH_OK;
    DFLASH_TRY(cuda_check_weight(norm, "q/k norm"));
    if (norm->rows * norm->cols < head_dim)
        return dflash_fail(DFLASH_ERR_SHAPE, "norm_rope: norm %s has %lld elements, head_dim is %d",
                           norm->name ? norm->name : "?", (long long)(norm->rows * norm->cols), head_dim);
    return DFLASH_OK;
}

static dflash_status cuda_norm_rope(dflash_backend *be, float *x, const dflash_weight *norm, const int32_t *pos,
                                    int n, int n_heads, int head_dim, float eps, const dflash_rope *rope)
{
    cuda_ctx *c = CTX(be);
    DFLASH_TRY(dflash_be_check_rope(rope, head_dim));
    DFLASH_TRY(check_head_norm(norm, head_dim));
    if (n <= 0 || n_heads <= 0 || head_dim <= 0)
        return DFLASH_OK;
    DFLASH_TRY(cuda_enter(c));
    CUdeviceptr inv_freq;
    DFLASH_TRY(rope_table_get(c, rope, &inv_freq));
    const void *nd = norm ? norm->data : NULL;
    int ndt = norm ? (int)norm->dtype : 0;
    float attn = rope->attn_factor;
    int half = rope->n_pairs;
    void *args[] = { &x, (void *)&nd, &ndt, (void *)&pos, &n, &n_heads, &head_dim, &half, &eps, &inv_freq, &attn };
    /* 4 warps per block, one (row, head) per warp. */
    return cuda_launch(c, DFK_NORM_ROPE, cdiv((int64_t)n * n_heads, 4), 1, 128, args);
}

/* One warp per (row, head) in registers (norm.cu, head_dim a multiple of
 * 32 up to 256); other sizes take the composition (norm_rope, swiglu). */
static dflash_status cuda_norm_gate(dflash_backend *be, float *x, const dflash_weight *norm, const float *z,
                                    const int32_t *pos, int n, int n_heads, int head_dim, float eps)
{
    cuda_ctx *c = CTX(be);
    DFLASH_TRY(check_head_norm(norm, head_dim));
    if (n <= 0 || n_heads <= 0 || head_dim <= 0)
        return DFLASH_OK;
    if (!norm || head_dim % 32 != 0 || head_dim > 256)
        return dflash_be_norm_gate_composed(be, x, norm, z, pos, n, n_heads, head_dim, eps);
    DFLASH_TRY(cuda_enter(c));
    int ndt = (int)norm->dtype;
    void *args[] = { &x, (void *)&norm->data, &ndt, (void *)&z, &n, &n_heads, &head_dim, &eps };
    return cuda_launch(c, DFK_NORM_GATE, cdiv((int64_t)n * n_heads, 4), 1, 128, args);
}

/* q and k in one launch (n_q_heads may be 0: k alone); with st->pool the
 * k heads' warps also store K and V; with parts->ws, q, k and v are read
 * from the q/k/v GEMM's split-K partials. */
static dflash_status qk_norm_rope_launch(dflash_backend *be, float *q, const dflash_weight *q_norm, int n_q_heads,
                                         float *k, const dflash_weight *k_norm, int n_kv_heads, const int32_t *pos,
                                         int n, int head_dim, float eps, const dflash_rope *rope, qk_store *st,
                                         qk_parts *parts)
{
    cuda_ctx *c = CTX(be);
    DFLASH_TRY(dflash_be_check_rope(rope, head_dim));
    DFLASH_TRY(check_head_norm(n_q_heads > 0 ? q_norm : NULL, head_dim));
    DFLASH_TRY(check_head_norm(k_norm, head_dim));
    if (n <= 0 || n_q_heads + n_kv_heads <= 0 || head_dim <= 0)
        return DFLASH_OK;
    DFLASH_TRY(cuda_enter(c));
    CUdeviceptr inv_freq;
    DFLASH_TRY(rope_table_get(c, rope, &inv_freq));
    /* one dtype for both norms (dflash_be_qk_norm_rope's rule); none: RoPE alone */
    int ndt = k_norm ? (int)k_norm->dtype : 0;
    float attn = rope->attn_factor;
    int half = rope->n_pairs;
    const void *qn = n_q_heads > 0 && q_norm ? q_norm->data : NULL, *kn = k_norm ? k_norm->data : NULL;
    void *args[] = { &q, (void *)&qn, &k, (void *)&kn, &ndt, (void *)&pos, &n, &n_q_heads, &n_kv_heads,
                     &head_dim, &half, &eps, &inv_freq, &attn, st, parts };
    return cuda_launch(c, DFK_QK_NORM_ROPE, cdiv((int64_t)n * (n_q_heads + n_kv_heads), 4), 1, 128, args);
}

static dflash_status cuda_qk_norm_rope(dflash_backend *be, float *q, const dflash_weight *q_norm, int n_q_heads,
                                       float *k, const dflash_weight *k_norm, int n_kv_heads, const int32_t *pos,
                                       int n, int head_dim, float eps, const dflash_rope *rope)
{
    qk_store none = { 0 };
    qk_parts here = { 0 };
    return qk_norm_rope_launch(be, q, q_norm, n_q_heads, k, k_norm, n_kv_heads, pos, n, head_dim, eps, rope, &none,
                               &here);
}

/* The K/V store of a stage at dst: the pool's checks, then where its
 * kernel writes. */
static dflash_status qk_store_at(cuda_ctx *c, const dflash_kv_dest *dst, int n_kv_heads, int head_dim, const char *op,
                                 qk_store *st)
{
    const dflash_kv_layout *kv = dst->kv;
    DFLASH_TRY(cuda_check_kv_store(kv, dst->layer, dst->pt_len, op));
    if (kv->n_kv_heads != n_kv_heads || kv->head_dim != head_dim)
        return dflash_fail(DFLASH_ERR_SHAPE, "cuda %s: pool has %d x %d kv heads, rows %d x %d", op, kv->n_kv_heads,
                           kv->head_dim, n_kv_heads, head_dim);
    *st = (qk_store){ .pool = kv->data, .page_tables = dst->page_tables, .row_seq = dst->row_seq, .v = dst->v,
                      .eflag = (void *)(uintptr_t)c->err_flag, .ehost = (void *)(uintptr_t)c->err_host_dev,
                      .bf16 = kv->dtype == DFLASH_DTYPE_BF16, .n_pages = kv->n_pages, .n_layers = kv->n_layers,
                      .layer = dst->layer, .pt_len = dst->pt_len };
    return DFLASH_OK;
}

static dflash_status cuda_qk_norm_rope_store(dflash_backend *be, float *q, const dflash_weight *q_norm,
                                             int n_q_heads, float *k, const dflash_weight *k_norm, int n_kv_heads,
                                             const int32_t *pos, int n, int head_dim, float eps,
                                             const dflash_rope *rope, const dflash_kv_dest *dst)
{
    qk_store st;
    DFLASH_TRY(qk_store_at(CTX(be), dst, n_kv_heads, head_dim, "qk_norm_rope_store", &st));
    qk_parts here = { 0 };
    return qk_norm_rope_launch(be, q, q_norm, n_q_heads, k, k_norm, n_kv_heads, pos, n, head_dim, eps, rope, &st,
                               &here);
}

/* Where a q/k/v stage's kernel finds q, k and v: the GEMM's split-K
 * partials p (slice order, fp8 scales after), v written to a->v. */
static qk_parts qk_parts_of(const cuda_partials *p, const dflash_qkv_args *a)
{
    qk_parts parts = { .ws = p->ws, .v = a->v, .stride = p->stride, .ld = p->ld, .off_k = p->off[1],
                       .off_v = p->off[2], .slices = p->slices };
    for (int i = 0; i < 3 && a->w[0].dtype == DFLASH_DTYPE_F8_E4M3; i++)
        parts.scales[i] = a->w[i].scales;
    return parts;
}

/* The q/k/v GEMM leaves its split-K sum to the norm + RoPE launch where
 * it can (cuda_gemm_partials), which then reads q, k and v from the
 * partials (one hand-off less: no arrival count, wait or last pass in
 * the GEMM); else the composition. The same bits either way. */
static dflash_status cuda_qkv_norm_rope_store(dflash_backend *be, const dflash_qkv_args *a)
{
    cuda_ctx *c = CTX(be);
    qk_store st = { 0 };
    if (a->dst)
        DFLASH_TRY(qk_store_at(c, a->dst, a->n_kv_heads, a->head_dim, "qkv_norm_rope_store", &st));
    DFLASH_TRY(dflash_be_check_rope(a->rope, a->head_dim));
    cuda_partials p;
    DFLASH_TRY(cuda_gemm_partials(c, a->x, a->n, a->w, 3, &p));
    if (!p.slices)
        return dflash_be_qkv_norm_rope_store_composed(be, a);
    qk_parts parts = qk_parts_of(&p, a);
    return qk_norm_rope_launch(be, a->q, a->q_norm, a->n_q_heads, a->k, a->k_norm, a->n_kv_heads, a->pos, a->n,
                               a->head_dim, a->eps, a->rope, &st, &parts);
}

/* A decode (one row a sequence) whose q/k/v GEMM leaves its split-K sum
 * to the next launch runs the q/k norm + RoPE + K/V store inside its
 * attention launch (attention_tc.cu's attn_fuse): one launch less a
 * layer, the same bits as the stage's launch followed by attention. The
 * kernel holds a block's query vectors (at most 8: the query heads of a
 * KV head) on chip; head_dim 128, a BF16 pool, no extra keys. Anything
 * else: the stage, then attention. */
static dflash_status cuda_qkv_attention(dflash_backend *be, const dflash_qkv_args *q, const dflash_attn_args *a)
{
    cuda_ctx *c = CTX(be);
    const dflash_rope *rope = q->rope;
    const int fits = c->qk_attention && q->dst && a->kv == q->dst->kv && a->kv->dtype == DFLASH_DTYPE_BF16 &&
                     a->layer == q->dst->layer && a->page_tables == q->dst->page_tables &&
                     a->row_seq == q->dst->row_seq && a->q == q->q && a->q_pos == q->pos && a->n_rows == q->n &&
                     a->n_seqs == a->n_rows && a->max_seq_rows == 1 && a->n_heads == q->n_q_heads &&
                     a->n_kv_heads == q->n_kv_heads && a->head_dim == q->head_dim && q->head_dim == 128 &&
                     a->n_kv_heads > 0 && a->n_heads % a->n_kv_heads == 0 && a->n_heads / a->n_kv_heads <= 8 &&
                     !a->k_extra && 2 * rope->n_pairs == q->head_dim;
    if (!fits) {
        DFLASH_TRY(cuda_qkv_norm_rope_store(be, q));
        return cuda_attention(be, a);
    }
    qk_store st;
    DFLASH_TRY(qk_store_at(c, q->dst, q->n_kv_heads, q->head_dim, "qkv_attention", &st));
    DFLASH_TRY(dflash_be_check_rope(rope, q->head_dim));
    DFLASH_TRY(check_head_norm(q->q_norm, q->head_dim));
    DFLASH_TRY(check_head_norm(q->k_norm, q->head_dim));
    cuda_partials p;
    DFLASH_TRY(cuda_gemm_partials(c, q->x, q->n, q->w, 3, &p));
    if (!p.slices) {
        DFLASH_TRY(dflash_be_qkv_norm_rope_store_composed(be, q));
        return cuda_attention(be, a);
    }
    DFLASH_TRY(cuda_enter(c));
    CUdeviceptr inv_freq;
    DFLASH_TRY(rope_table_get(c, rope, &inv_freq));
    cuda_attn_fuse f = {
        .qnorm = q->q_norm ? q->q_norm->data : NULL, .knorm = q->k_norm ? q->k_norm->data : NULL,
        .inv_freq = HPTR(inv_freq), .k = q->k, .eps = q->eps, .attn = rope->attn_factor,
        .ndt = q->k_norm ? (int)q->k_norm->dtype : 0, .fused = 1, .st = st, .parts = qk_parts_of(&p, q),
    };
    return cuda_attention_fused(be, a, &f);
}

static dflash_status cuda_swiglu(dflash_backend *be, const float *gate, const float *up, size_t count, float *out)
{
    cuda_ctx *c = CTX(be);
    if (!count)
        return DFLASH_OK;
    DFLASH_TRY(cuda_enter(c));
    int vec = count % 4 == 0 && aligned16(gate) && aligned16(up) && aligned16(out);
    int64_t n = (int64_t)count;
    void *args[] = { (void *)&gate, (void *)&up, &n, &out, &vec };
    return cuda_launch(c, DFK_SWIGLU, elem_blocks(c, vec ? n / 4 : n), 1, 256, args);
}

static dflash_status cuda_copy_rows(dflash_backend *be, float *dst, int64_t dst_stride, const float *src,
                                    int64_t src_stride, const int32_t *idx, int n, int64_t cols)
{
    cuda_ctx *c = CTX(be);
    if (n <= 0 || cols <= 0)
        return DFLASH_OK;
    DFLASH_TRY(cuda_enter(c));
    int vec = cols % 4 == 0 && dst_stride % 4 == 0 && src_stride % 4 == 0 && aligned16(dst) && aligned16(src);
    unsigned chunks = cdiv(vec ? cols / 4 : cols, 256 * 4);
    if (chunks > 65535)
        chunks = 65535;
    void *args[] = { &dst, &dst_stride, (void *)&src, &src_stride, (void *)&idx, &cols, &vec };
    return cuda_launch(c, DFK_COPY_ROWS, (unsigned)n, chunks, 256, args);
}

static dflash_status cuda_copy_ids(dflash_backend *be, int32_t *dst, int64_t dst_stride, const int32_t *src,
                                   int64_t src_stride, int n, int cols)
{
    cuda_ctx *c = CTX(be);
    if (n <= 0 || cols <= 0)
        return DFLASH_OK;
    DFLASH_TRY(cuda_enter(c));
    void *args[] = { &dst, &dst_stride, (void *)&src, &src_stride, &n, &cols };
    return cuda_launch(c, DFK_COPY_IDS, cdiv((int64_t)n * cols, 256), 1, 256, args);
}

static dflash_status cuda_gather_sum(dflash_backend *be, float *out, const float *src, const int32_t *idx,
                                     const float *w, int n, int k, int64_t cols)
{
    cuda_ctx *c = CTX(be);
    if (n <= 0 || cols <= 0)
        return DFLASH_OK;
    DFLASH_TRY(cuda_enter(c));
    unsigned chunks = cdiv(cols, 256); /* a column per thread */
    if (chunks > 65535)
        chunks = 65535;
    void *args[] = { &out, (void *)&src, (void *)&idx, (void *)&w, &k, &cols };
    return cuda_launch(c, DFK_GATHER_SUM, (unsigned)n, chunks, 256, args);
}

/* A MoE layer's routing (moe.cu): one block for the whole call; with
 * rp.ws, the router's logits summed from its GEMM's partials first. */
static dflash_status route_launch(cuda_ctx *c, const dflash_route_args *r, const route_parts *rp)
{
    DFLASH_TRY(cuda_enter(c));
    int n = r->n, E = r->n_experts, k = r->k, norm = r->norm_topk_prob;
    void *args[] = { (void *)&r->logits, (void *)&r->shared_logit, &n, &E, &k, &norm, (void *)&r->expert,
                     (void *)&r->prob, (void *)&r->first, (void *)&r->src, (void *)&r->slot, (void *)rp };
    return cuda_launch(c, E <= 256 ? DFK_MOE_ROUTE : DFK_MOE_ROUTE_WIDE, 1, 1, 1024, args);
}

static dflash_status cuda_moe_route(dflash_backend *be, const dflash_route_args *r)
{
    const route_parts none = { 0 };
    return route_launch(CTX(be), r, &none);
}

/* The router's GEMM leaves its split-K sum to the routing's launch where
 * it can (cuda_gemm_partials), which adds the partials as the GEMM's
 * epilogue would before it routes: the GEMM's arrival count, wait and
 * last pass go, the bits stay the composition's. Only for calls of up to
 * DFLASH_CUDA_ROUTE_SUM_ROWS rows (default 1, a decode): the routing is
 * one block, and summing 2-16 rows' partials there cost more than the
 * GEMM's own last pass, spread over its blocks (docs/perf-notes.md). */
static dflash_status cuda_linear_moe_route(dflash_backend *be, const float *x, int n, const dflash_weight *w, int n_w,
                                           float *const *out, const dflash_route_args *r)
{
    cuda_ctx *c = CTX(be);
    cuda_partials p = { 0 };
    if (n <= dflash_levers_get()->cuda_route_sum_rows)
        DFLASH_TRY(cuda_gemm_partials(c, x, n, w, n_w, &p));
    if (!p.slices)
        return dflash_be_linear_moe_route_composed(be, x, n, w, n_w, out, r);
    const route_parts rp = {
        .ws = p.ws, .stride = p.stride, .ld = p.ld, .off_sh = n_w > 1 ? p.off[1] : 0, .slices = p.slices,
        .sh_out = n_w > 1 ? out[1] : NULL,
        .scale_r = w[0].dtype == DFLASH_DTYPE_F8_E4M3 ? w[0].scales : NULL,
        .scale_s = n_w > 1 && w[1].dtype == DFLASH_DTYPE_F8_E4M3 ? w[1].scales : NULL,
    };
    return route_launch(c, r, &rp);
}

static dflash_status cuda_argmax(dflash_backend *be, const float *x, int n, int cols, int32_t *out)
{
    cuda_ctx *c = CTX(be);
    if (n <= 0)
        return DFLASH_OK;
    DFLASH_TRY(cuda_enter(c));
    int vec = cols % 4 == 0 && aligned16(x);
    void *args[] = { (void *)&x, &cols, &out, &vec };
    return cuda_launch(c, DFK_ARGMAX, (unsigned)n, 1, 1024, args);
}

/* sample.cu: the rows' arguments go up with the call (an upload, so not
 * inside a graph); a cluster of 8 blocks a row (one block before
 * sm_90); each row's x and
 * exp(x - m) [V] doubles and its histograms and partials are its
 * workspace. Where a row has penalties, a launch first writes every row
 * of the chunk under its penalties (dflash_penalize_rows) and the draw
 * reads those. */
_Static_assert(sizeof(dflash_sample_row) == 88, "mirrored by sample.cu's sample_row");
#define SAMPLE_WS_ROW (4 * 1024 + 4 * 8 * 8) /* sample.cu's WS_ROW (for clusters of 8), in u64 */
/* Rows drawn per launch: the workspace holds [rows, V] doubles (156 MB
 * for 128 rows of Qwen3's 151936), so the verify rows of many sessions
 * (512 for 32 blocks of 16) go in launches of at most this many. */
#define SAMPLE_ROWS_PER_LAUNCH 128
static dflash_status cuda_sample_rows(dflash_backend *be, const float *logits, int n, int V,
                                      const dflash_sample_row *rows, int32_t *ids)
{
    cuda_ctx *c = CTX(be);
    if (n <= 0)
        return DFLASH_OK;
    DFLASH_TRY(cuda_enter(c));
    const int per = n < SAMPLE_ROWS_PER_LAUNCH ? n : SAMPLE_ROWS_PER_LAUNCH;
    DFLASH_TRY(cuda_buf_reserve(c, &c->smp_rows, (size_t)n * sizeof *rows, 0));
    DFLASH_TRY(cuda_buf_reserve(c, &c->smp_e, (size_t)per * (size_t)V * sizeof(double), 0));
    DFLASH_TRY(cuda_buf_reserve(c, &c->smp_hist, (size_t)per * SAMPLE_WS_ROW * sizeof(uint64_t), 0));
    int pen = 0;
    for (int i = 0; i < n; i++)
        pen |= rows[i].counts != NULL;
    if (pen)
        DFLASH_TRY(cuda_buf_reserve(c, &c->smp_pen, (size_t)per * (size_t)V * sizeof(float), 0));
    DFLASH_TRY(cuda_upload(be, HPTR(c->smp_rows.p), rows, (size_t)n * sizeof *rows));
    for (int r0 = 0; r0 < n; r0 += per) {
        const int m = n - r0 < per ? n - r0 : per;
        const float *lg = logits + (size_t)r0 * (size_t)V;
        CUdeviceptr rw = c->smp_rows.p + (size_t)r0 * sizeof *rows;
        int32_t *out = ids + r0;
        if (pen) {
            /* about four blocks of 256 threads an SM over the chunk's rows */
            const unsigned per_row = (unsigned)((4 * c->sm_count + m - 1) / m), span = (unsigned)((V + 255) / 256);
            const unsigned bx = span < per_row ? span : per_row;
            void *pargs[] = { (void *)&lg, &V, &rw, &c->smp_pen.p };
            DFLASH_TRY(cuda_launch(c, DFK_PENALIZE_ROWS, bx, (unsigned)m, 256, pargs));
            lg = HPTR(c->smp_pen.p);
        }
        void *args[] = { (void *)&lg, &V, &rw, &c->smp_e.p, &c->smp_hist.p, &out };
        /* sample.cu's SMP_CLUSTER: 8 blocks a row where clusters exist (sm_90+), else 1 */
        DFLASH_TRY(cuda_launch(c, DFK_SAMPLE_ROWS, (unsigned)m * (c->clusters ? 8u : 1u), 1, 1024, args));
    }
    return DFLASH_OK;
}

/* sample.cu's dflash_count_tokens; ids NULL: every count -1. The ids go
 * up with the call (an upload, so not inside a graph), in pieces of a
 * fixed size: a buffer that grew would wait for the stream and send every
 * captured graph to be captured again. */
#define COUNT_TOKENS_PIECE 4096
static dflash_status cuda_count_tokens(dflash_backend *be, int32_t *counts, int V, const int32_t *ids, int n,
                                       int generated)
{
    cuda_ctx *c = CTX(be);
    DFLASH_TRY(cuda_enter(c));
    if (!ids)
        return DFLASH_CU(&c->cu, cuMemsetD32Async(DPTR(counts), 0xffffffffu, (size_t)V, c->stream));
    if (n <= 0)
        return DFLASH_OK;
    DFLASH_TRY(cuda_buf_reserve(c, &c->smp_ids, COUNT_TOKENS_PIECE * sizeof *ids, 0));
    for (int i0 = 0; i0 < n; i0 += COUNT_TOKENS_PIECE) {
        int m = n - i0 < COUNT_TOKENS_PIECE ? n - i0 : COUNT_TOKENS_PIECE;
        DFLASH_TRY(cuda_upload(be, HPTR(c->smp_ids.p), ids + i0, (size_t)m * sizeof *ids));
        void *args[] = { &counts, &V, &c->smp_ids.p, &m, &generated };
        DFLASH_TRY(cuda_launch(c, DFK_COUNT_TOKENS, (unsigned)((m + 255) / 256), 1, 256, args));
    }
    return DFLASH_OK;
}

/* Benchmarks read these around a call (dflash bench). */
static void cuda_counters(dflash_backend *be, dflash_backend_counters *out) { *out = CTX(be)->count; }

static const dflash_backend_ops k_cuda_ops = {
    .name = "cuda",
    .kv_dtype = DFLASH_DTYPE_BF16, /* half the bytes; the tensor-core attention reads it */
    .destroy = cuda_destroy,
    .alloc = cuda_alloc,
    .free = cuda_free,
    .upload = cuda_upload,
    .download = cuda_download,
    .sync = cuda_sync,
    .mark = cuda_mark,
    .mark_ms = cuda_mark_ms,
    .weight_from_host = cuda_weight_from_host,
    .embed = cuda_embed,
    .add_rmsnorm = cuda_add_rmsnorm,
    .add = cuda_add,
    .add_bias = cuda_add_bias,
    .linear = cuda_linear,
    .norm_rope = cuda_norm_rope,
    .swiglu = cuda_swiglu,
    .kv_write = cuda_kv_write,
    .attention = cuda_attention,
    .copy_rows = cuda_copy_rows,
    .copy_ids = cuda_copy_ids,
    .gather_sum = cuda_gather_sum,
    .sigmoid_mul = cuda_sigmoid_mul,
    .conv_silu = cuda_conv_silu,
    .delta_rule = cuda_delta_rule,
    .argmax = cuda_argmax,
    .sample_rows = cuda_sample_rows,
    .count_tokens = cuda_count_tokens,
    .linear_group = cuda_linear_group,
    .linear_argmax = cuda_linear_argmax,
    .linear_gated_add = cuda_linear_gated_add,
    .norm_gate = cuda_norm_gate,
    .gather_add_rmsnorm = cuda_gather_add_rmsnorm,
    .linear_add_rmsnorm = cuda_linear_add_rmsnorm,
    .qkv_norm_rope_store = cuda_qkv_norm_rope_store,
    .qkv_attention = cuda_qkv_attention,
    .moe_route = cuda_moe_route,
    .linear_moe_route = cuda_linear_moe_route,
    .linear_experts = cuda_linear_experts,
    .counters = cuda_counters,
    .capture_begin = cuda_capture_begin,
    .capture_end = cuda_capture_end,
    .graph_launch = cuda_graph_launch,
    .graph_free = cuda_graph_free,
    .qk_norm_rope = cuda_qk_norm_rope,
    .qk_norm_rope_store = cuda_qk_norm_rope_store,
};

/* ---- tools -------------------------------------------------------------- */

dflash_status dflash_cuda_timer_start(dflash_backend *be)
{
    cuda_ctx *c = CTX(be);
    if (be->ops != &k_cuda_ops)
        return dflash_fail(DFLASH_ERR_INVALID_ARG, "cuda timer: not a CUDA backend");
    DFLASH_TRY(cuda_enter(c));
    return DFLASH_CU(&c->cu, cuEventRecord(c->ev[0], c->stream));
}

dflash_status dflash_cuda_timer_stop(dflash_backend *be, float *ms)
{
    cuda_ctx *c = CTX(be);
    if (be->ops != &k_cuda_ops)
        return dflash_fail(DFLASH_ERR_INVALID_ARG, "cuda timer: not a CUDA backend");
    DFLASH_TRY(cuda_enter(c));
    DFLASH_TRY(DFLASH_CU(&c->cu, cuEventRecord(c->ev[1], c->stream)));
    DFLASH_TRY(DFLASH_CU(&c->cu, cuEventSynchronize(c->ev[1])));
    DFLASH_TRY(DFLASH_CU(&c->cu, cuEventElapsedTime(ms, c->ev[0], c->ev[1])));
    return check_kernel_errors(c);
}

dflash_status dflash_cuda_profile(dflash_backend *be, int on)
{
    cuda_ctx *c = CTX(be);
    if (be->ops != &k_cuda_ops)
        return dflash_fail(DFLASH_ERR_INVALID_ARG, "cuda profile: not a CUDA backend");
    /* not in the loader's table: only profiling runs need it */
    CUresult (*fn)(void) = (CUresult(*)(void))(uintptr_t)dlsym(c->cu.lib, on ? "cuProfilerStart" : "cuProfilerStop");
    if (!fn)
        return dflash_fail(DFLASH_ERR_BACKEND, "cuda profile: the driver has no %s",
                           on ? "cuProfilerStart" : "cuProfilerStop");
    DFLASH_TRY(cuda_enter(c));
    DFLASH_TRY(DFLASH_CU(&c->cu, cuStreamSynchronize(c->stream)));
    return dflash_cu_check(&c->cu, fn(), on ? "cuProfilerStart()" : "cuProfilerStop()", __FILE__, __LINE__);
}

dflash_status dflash_cuda_copy(dflash_backend *be, void *dst, const void *src, size_t bytes)
{
    cuda_ctx *c = CTX(be);
    if (be->ops != &k_cuda_ops)
        return dflash_fail(DFLASH_ERR_INVALID_ARG, "cuda copy: not a CUDA backend");
    DFLASH_TRY(cuda_enter(c));
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
                /* more than the default 48 KB of dynamic shared memory is an
                 * opt-in; a kernel that needs more than the device has is
                 * left unused (cuda_kernel_fits) */
                if (s == DFLASH_OK && dflash_cuda_kernels[k].dyn_smem > 0 && cuda_kernel_fits(c, (dflash_cuda_kernel_id)k))
                    s = DFLASH_CU(&c->cu, cuFuncSetAttribute(c->fn[k],
                                                             DFLASH_CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                                             dflash_cuda_kernels[k].dyn_smem));
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
    DFLASH_TRY(DFLASH_CU(cu, cuDeviceGetAttribute(&c->smem_optin, DFLASH_CU_ATTR_MAX_SMEM_PER_BLOCK_OPTIN, c->dev)));
    dflash_cuda_arch_name(major, minor, c->arch, sizeof c->arch);
    /* The primary context: the one the runtime API and other libraries in
     * the process share, so buffers can be handed across. */
    DFLASH_TRY(DFLASH_CU(cu, cuDevicePrimaryCtxRetain(&c->ctx, c->dev)));
    c->ctx_retained = 1;
    DFLASH_TRY(cuda_enter(c));
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
    for (int i = 0; i < DFLASH_BACKEND_MARKS; i++)
        DFLASH_TRY(DFLASH_CU(cu, cuEventCreate(&c->marks[i], DFLASH_CU_EVENT_DEFAULT)));
    /* A diagnosis switch: the kernels are correct either way. */
    c->pdl = major >= 9 && dflash_levers_get()->cuda_pdl;
    c->clusters = major >= 9;
    c->gemm_split = dflash_levers_get()->cuda_gemm_split;
    c->gemm_share_sum = dflash_levers_get()->cuda_gemm_share_sum;
    c->gemm_defer_sum = dflash_levers_get()->cuda_gemm_defer_sum;
    c->qk_attention = dflash_levers_get()->cuda_qk_attention;
    c->gemm_wide = dflash_levers_get()->cuda_gemm_wide;
    c->gemm_tile = dflash_levers_get()->cuda_gemm_tile;
    const int skip = dflash_cuda_gemm_skip();
    char skip_note[96] = "";
    if (skip < 0)
        fprintf(stderr, "dflash: ignoring DFLASH_CUDA_GEMM_SKIP='%s' (expected 1..7)\n",
                getenv("DFLASH_CUDA_GEMM_SKIP"));
    if (skip > 0) {
        snprintf(skip_note, sizeof skip_note, ", GEMM work skipped (DFLASH_CUDA_GEMM_SKIP=%d): results wrong", skip);
        fprintf(stderr, "dflash: DFLASH_CUDA_GEMM_SKIP=%d: a measurement build, every GEMM's results are wrong\n",
                skip);
    }
    snprintf(c->desc, sizeof c->desc, "%s (%s, %d SMs%s%s)", c->dev_name, c->arch, c->sm_count,
             c->pdl ? "" : ", PDL off", skip_note);
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
