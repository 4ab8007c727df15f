/* cuda_ops_check.c: op parity and op timing of the CUDA backend against the
 * CPU reference, run on a GPU machine by tools/gpu-test.sh (not built by
 * the Makefile: it needs a GPU, and tests never silently skip).
 *
 * Every op runs on fresh random inputs on both backends; GPU outputs are
 * poisoned with NaN before each run; the error is max|gpu - cpu| / max|cpu|
 * over the output (NaN never passes). Shapes include the real ones (rows 1,
 * 16, 64; H 2048/4096; I 6144/12288; vocab 151936; head_dim 128 with 32:4
 * and 32:8 heads; contexts 1..4097 with causal/window/none masks and ring
 * page tables). Then each op is timed at the real shapes with CUDA events
 * (median of 20 after warm-up, L2 flushed between samples) and the achieved
 * GB/s = bytes that must move / time is printed.
 *
 * Usage: cuda_ops_check [--small] [--no-perf] [--only SECTION,...] [--profile TEXT]
 *   --small: small shapes only, no timing (for compute-sanitizer runs);
 *   --only: these sections of checks only (k_sections lists them);
 *   --profile: one more call of each timed op whose "op shape" contains
 *     TEXT (or one of TEXT's '|'-separated parts), between cuProfilerStart
 *     and cuProfilerStop, so that `ncu --profile-from-start off` sees
 *     exactly those kernels. */
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"
#include "core/dtype.h"
#include "core/levers.h"
#include "spec/sampler.h"

static dflash_backend *g_cpu, *g_gpu;
static int g_small, g_perf = 1;

/* --only: the sections of checks to run (comma-separated names of
 * k_sections), NULL for all. */
static const char *g_only;
static const char k_sections[] =
    "errors,embed,add_rmsnorm,elementwise,linear,norm,recurrent,attention,copy,moe,argmax,sample";

/* Whether `name` is one of the comma-separated names in `list`. */
static int in_list(const char *list, const char *name, size_t len)
{
    for (const char *p = list; *p;) {
        const char *c = strchr(p, ',');
        const size_t n = c ? (size_t)(c - p) : strlen(p);
        if (n == len && strncmp(p, name, len) == 0)
            return 1;
        p += n + (c != NULL);
    }
    return 0;
}

static int section(const char *name) { return !g_only || in_list(g_only, name, strlen(name)); }

/* Whether every name of --only's list is a section. */
static int sections_known(const char *only)
{
    for (const char *p = only; *p;) {
        const char *c = strchr(p, ',');
        const size_t n = c ? (size_t)(c - p) : strlen(p);
        if (!in_list(k_sections, p, n))
            return 0;
        p += n + (c != NULL);
    }
    return 1;
}

/* ---- infrastructure ----------------------------------------------------- */

static void die(const char *what)
{
    fprintf(stderr, "cuda_ops_check: %s: %s\n", what, dflash_last_error());
    exit(2);
}
#define MUST(expr)                  \
    do {                            \
        if ((expr) != DFLASH_OK)    \
            die(#expr);             \
    } while (0)

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void)
{
    g_rng ^= g_rng >> 12;
    g_rng ^= g_rng << 25;
    g_rng ^= g_rng >> 27;
    return g_rng * 0x2545f4914f6cdd1dull;
}
static float frand(void) { return (float)((double)(rnd() >> 11) / 9007199254740992.0 * 2.0 - 1.0); }
static int irand(int n) { return (int)(rnd() % (uint64_t)n); }

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "cuda_ops_check: out of host memory (%zu bytes)\n", n);
        exit(2);
    }
    return p;
}

static float *rand_f32(size_t n, float amp)
{
    float *p = xmalloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        p[i] = frand() * amp;
    return p;
}

/* Device buffers of the current case, freed together by gpu_reset(). */
static void *g_dev[4096];
static int g_ndev;

static void *gpu_alloc(size_t bytes)
{
    void *p;
    MUST(g_gpu->ops->alloc(g_gpu, bytes, &p));
    if (g_ndev == 4096) {
        fprintf(stderr, "cuda_ops_check: too many buffers in one case\n");
        exit(2);
    }
    g_dev[g_ndev++] = p;
    return p;
}

static void *gpu_copy(const void *h, size_t bytes)
{
    void *d = gpu_alloc(bytes);
    MUST(g_gpu->ops->upload(g_gpu, d, h, bytes));
    return d;
}

/* An output buffer filled with NaN, so an element the kernel never writes
 * cannot pass. */
static float *gpu_poison(size_t n)
{
    float *h = xmalloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        h[i] = NAN;
    float *d = gpu_copy(h, n * sizeof(float));
    free(h);
    return d;
}

static void gpu_get(void *h, const void *d, size_t bytes) { MUST(g_gpu->ops->download(g_gpu, h, d, bytes)); }

static void gpu_reset(void)
{
    for (int i = 0; i < g_ndev; i++)
        g_gpu->ops->free(g_gpu, g_dev[i]);
    g_ndev = 0;
}

/* A weight [rows, cols] of dtype dt with random content (fp8: random
 * positive scales); host copy in *h, device copy in *d. */
typedef struct wpair {
    dflash_weight h, d;
    void *hdata;
    float *hscales;
} wpair;

static void make_weight(wpair *w, dflash_dtype dt, int64_t rows, int64_t cols, float amp)
{
    size_t n = (size_t)(rows * cols), es = dflash_dtype_size(dt);
    w->hdata = xmalloc(n * es);
    w->hscales = NULL;
    for (size_t i = 0; i < n; i++) {
        float v = frand() * amp;
        switch (dt) {
        case DFLASH_DTYPE_BF16: ((uint16_t *)w->hdata)[i] = dflash_f32_to_bf16(v); break;
        case DFLASH_DTYPE_F16: {
            /* f32 -> f16 by hand for |v| < 1: exact enough for a test input. */
            float a = fabsf(v);
            uint16_t s = v < 0 ? 0x8000 : 0;
            uint16_t h = 0;
            if (a >= 6.103515625e-05f) {
                int e;
                float m = frexpf(a, &e); /* a = m * 2^e, m in [0.5, 1) */
                h = (uint16_t)(((e - 1 + 15) << 10) | ((uint16_t)((m * 2.0f - 1.0f) * 1024.0f) & 0x3ff));
            }
            ((uint16_t *)w->hdata)[i] = s | h;
            break;
        }
        case DFLASH_DTYPE_F8_E4M3: ((uint8_t *)w->hdata)[i] = (uint8_t)(rnd() & 0xff); break;
        default: ((float *)w->hdata)[i] = v;
        }
    }
    if (dt == DFLASH_DTYPE_F8_E4M3) {
        /* Avoid the NaN codes (0x7f, 0xff) in random weights: a NaN weight
         * makes a whole output NaN on both sides and tests nothing. */
        for (size_t i = 0; i < n; i++)
            if ((((uint8_t *)w->hdata)[i] & 0x7f) == 0x7f)
                ((uint8_t *)w->hdata)[i] ^= 1;
        w->hscales = xmalloc((size_t)rows * sizeof(float));
        for (int64_t r = 0; r < rows; r++)
            w->hscales[r] = amp / 448.0f * (0.5f + 0.5f * fabsf(frand()));
    }
    w->h = (dflash_weight){ dt, rows, cols, w->hdata, w->hscales, "test" };
    w->d = w->h;
    w->d.data = gpu_copy(w->hdata, n * es);
    w->d.scales = w->hscales ? gpu_copy(w->hscales, (size_t)rows * sizeof(float)) : NULL;
}

static void free_weight(wpair *w)
{
    free(w->hdata);
    free(w->hscales);
}

/* ---- results ------------------------------------------------------------ */

typedef struct result {
    char op[64], shape[112];
    double err, tol;
    int pass;
} result;
#define MAX_RESULTS 4096
static result g_res[MAX_RESULTS];
static int g_nres;

typedef struct perf {
    char op[24], shape[112];
    double us, gbs;
} perf;
static perf g_perf_rows[512];
static int g_nperf;

/* max|g - c| / max|c|; NaN or Inf where the CPU has a number: infinite. */
static double rel_err(const float *g, const float *c, size_t n)
{
    double maxd = 0.0, maxc = 0.0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(c[i]) || isnan(g[i])) {
            if (!(isnan(c[i]) && isnan(g[i])))
                return INFINITY;
            continue;
        }
        double d = fabs((double)g[i] - (double)c[i]);
        if (!(d <= 1e300))
            return INFINITY;
        if (d > maxd)
            maxd = d;
        if (fabs(c[i]) > maxc)
            maxc = fabs(c[i]);
    }
    return maxc > 0 ? maxd / maxc : maxd;
}

static void record(const char *op, const char *shape, double err, double tol)
{
    if (g_nres == MAX_RESULTS) { /* never silently: a result past the table would go unseen */
        fprintf(stderr, "cuda_ops_check: more than %d results; raise MAX_RESULTS\n", MAX_RESULTS);
        exit(2);
    }
    result *r = &g_res[g_nres++];
    snprintf(r->op, sizeof r->op, "%s", op);
    snprintf(r->shape, sizeof r->shape, "%s", shape);
    r->err = err;
    r->tol = tol;
    r->pass = err <= tol; /* NaN and Inf fail */
    printf("%-4s %-12s %-64s err %.3g (tol %.0e)\n", r->pass ? "ok" : "FAIL", op, shape, err, tol);
    fflush(stdout);
}

static void check_f32(const char *op, const char *shape, const float *gdev, const float *cref, size_t n, double tol)
{
    float *g = xmalloc(n * sizeof(float));
    gpu_get(g, gdev, n * sizeof(float));
    record(op, shape, rel_err(g, cref, n), tol);
    free(g);
}

/* Byte-exact comparison of a device buffer with a host one. */
static void check_exact(const char *op, const char *shape, const void *gdev, const void *cref, size_t bytes)
{
    unsigned char *g = xmalloc(bytes);
    gpu_get(g, gdev, bytes);
    size_t bad = 0;
    for (size_t i = 0; i < bytes; i++)
        bad += g[i] != ((const unsigned char *)cref)[i];
    record(op, shape, bad ? INFINITY : 0.0, 0.0);
    free(g);
}

/* ---- timing ------------------------------------------------------------- */

typedef dflash_status (*run_fn)(void *arg);

static float *g_flush; /* 256 MiB, bigger than any L2 */
static const size_t k_flush_n = 64u << 20;

static int cmp_float(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

/* --profile: the texts ('|'-separated) one of which an op's "op shape"
 * must contain; such an op runs once more between the driver's profiler
 * switches. */
static const char *g_profile;
static int profile_wanted(const char *name)
{
    for (const char *p = g_profile; p && *p;) {
        const char *bar = strchr(p, '|');
        const size_t len = bar ? (size_t)(bar - p) : strlen(p);
        char part[256];
        snprintf(part, sizeof part, "%.*s", (int)(len < sizeof part ? len : sizeof part - 1), p);
        if (part[0] && strstr(name, part))
            return 1;
        p = bar ? bar + 1 : p + len;
    }
    return 0;
}

static void profiled_call(const char *op, const char *shape, run_fn run, void *arg)
{
    char name[256];
    snprintf(name, sizeof name, "%s %s", op, shape);
    if (!profile_wanted(name))
        return;
    MUST(dflash_cuda_profile(g_gpu, 1));
    MUST(run(arg));
    MUST(dflash_cuda_profile(g_gpu, 0));
    printf("profiled: %s\n", name);
}

static void time_op(const char *op, const char *shape, run_fn run, void *arg, double bytes)
{
    if (!g_perf || g_nperf == 512)
        return;
    if (!g_flush) {
        MUST(g_gpu->ops->alloc(g_gpu, k_flush_n * sizeof(float), (void **)&g_flush));
        MUST(g_gpu->ops->add(g_gpu, g_flush, g_flush, 0));
    }
    for (int i = 0; i < 3; i++)
        MUST(run(arg));
    float t[20];
    for (int i = 0; i < 20; i++) {
        /* Evict the op's operands from L2: weights that fit there would
         * otherwise be timed at L2, not HBM, speed. */
        MUST(g_gpu->ops->add(g_gpu, g_flush, g_flush + k_flush_n / 2, k_flush_n / 2));
        MUST(dflash_cuda_timer_start(g_gpu));
        MUST(run(arg));
        MUST(dflash_cuda_timer_stop(g_gpu, &t[i]));
    }
    qsort(t, 20, sizeof t[0], cmp_float);
    profiled_call(op, shape, run, arg);
    perf *p = &g_perf_rows[g_nperf++];
    snprintf(p->op, sizeof p->op, "%s", op);
    snprintf(p->shape, sizeof p->shape, "%s", shape);
    p->us = 0.5 * (t[9] + t[10]) * 1000.0;
    p->gbs = bytes / (p->us * 1e-6) / 1e9;
}

/* ---- embed -------------------------------------------------------------- */

typedef struct embed_arg {
    const dflash_weight *w;
    const int32_t *ids;
    int n;
    float *out;
} embed_arg;
static dflash_status run_embed(void *a_)
{
    embed_arg *a = a_;
    return g_gpu->ops->embed(g_gpu, a->w, a->ids, a->n, a->out);
}

static void case_embed(dflash_dtype dt, int64_t vocab, int64_t H, int n, int timed)
{
    char shape[112];
    snprintf(shape, sizeof shape, "%s vocab %lld x H %lld, %d rows", dflash_dtype_name(dt), (long long)vocab,
             (long long)H, n);
    wpair w;
    make_weight(&w, dt, vocab, H, 1.0f);
    int32_t *ids = xmalloc((size_t)n * sizeof(int32_t));
    for (int i = 0; i < n; i++)
        ids[i] = i == 0 ? (int32_t)(vocab - 1) : irand((int)vocab);
    float *ref = xmalloc((size_t)(n * H) * sizeof(float));
    MUST(g_cpu->ops->embed(g_cpu, &w.h, ids, n, ref));
    int32_t *dids = gpu_copy(ids, (size_t)n * sizeof(int32_t));
    float *dout = gpu_poison((size_t)(n * H));
    MUST(g_gpu->ops->embed(g_gpu, &w.d, dids, n, dout));
    check_f32("embed", shape, dout, ref, (size_t)(n * H), 0.0);
    if (timed) {
        embed_arg a = { &w.d, dids, n, dout };
        time_op("embed", shape, run_embed, &a, (double)n * H * (dflash_dtype_size(dt) + 4));
    }
    free(ids);
    free(ref);
    free_weight(&w);
    gpu_reset();
}

/* ---- add_rmsnorm, add, swiglu ------------------------------------------- */

typedef struct rms_arg {
    float *x;
    const float *delta;
    const dflash_weight *w;
    int n, dim;
    float *out;
} rms_arg;
static dflash_status run_rms(void *a_)
{
    rms_arg *a = a_;
    return g_gpu->ops->add_rmsnorm(g_gpu, a->x, a->delta, a->w, a->n, a->dim, 1e-6f, a->out);
}

static void case_rmsnorm(int n, int dim, int with_delta, int timed)
{
    char shape[112];
    snprintf(shape, sizeof shape, "%d x %d%s", n, dim, with_delta ? " + residual" : "");
    size_t cnt = (size_t)n * dim;
    float *x = rand_f32(cnt, 3.0f), *delta = with_delta ? rand_f32(cnt, 3.0f) : NULL;
    wpair w;
    make_weight(&w, DFLASH_DTYPE_BF16, 1, dim, 2.0f);
    float *dx = gpu_copy(x, cnt * sizeof(float));
    float *dd = delta ? gpu_copy(delta, cnt * sizeof(float)) : NULL;
    float *dout = gpu_poison(cnt), *ref = xmalloc(cnt * sizeof(float));
    MUST(g_cpu->ops->add_rmsnorm(g_cpu, x, delta, &w.h, n, dim, 1e-6f, ref));
    MUST(g_gpu->ops->add_rmsnorm(g_gpu, dx, dd, &w.d, n, dim, 1e-6f, dout));
    check_f32("add_rmsnorm", shape, dout, ref, cnt, 1e-5);
    if (delta) {
        char s2[128];
        snprintf(s2, sizeof s2, "%s (x)", shape);
        check_f32("add_rmsnorm", s2, dx, x, cnt, 0.0);
    }
    if (timed) {
        rms_arg a = { dx, dd, &w.d, n, dim, dout };
        time_op("add_rmsnorm", shape, run_rms, &a, (double)cnt * 4 * (delta ? 4 : 2) + dim * 2.0);
    }
    free(x);
    free(delta);
    free(ref);
    free_weight(&w);
    gpu_reset();
}

/* gather_add_rmsnorm: the GPU's fused launch equal bit for bit to its
 * own composition (gather_sum into a buffer, add_rmsnorm), and both to
 * the CPU's (x exactly: the same weighted sums; the norm within 1e-5).
 * dim > 4096 takes the composition inside the stage. Timed: the fused
 * stage and the two launches it replaces. */
typedef struct garms_arg {
    float *x, *delta, *out;
    const dflash_gather *sum;
    const dflash_weight *w;
    int n, dim, composed;
} garms_arg;
static dflash_status run_garms(void *p)
{
    garms_arg *a = p;
    if (a->composed)
        return dflash_be_gather_add_rmsnorm_composed(g_gpu, a->x, a->sum, a->delta, a->w, a->n, a->dim, 1e-6f,
                                                     a->out);
    return dflash_be_gather_add_rmsnorm(g_gpu, a->x, a->sum, a->delta, a->w, a->n, a->dim, 1e-6f, a->out);
}

static void case_gather_add_rmsnorm(int n, int k, int dim, int src_rows, int timed)
{
    char shape[112];
    snprintf(shape, sizeof shape, "%d x %d, %d terms from %d rows", n, dim, k, src_rows);
    const size_t cnt = (size_t)n * dim, nk = (size_t)n * k, src_n = (size_t)src_rows * dim;
    float *x = rand_f32(cnt, 3.0f), *src = rand_f32(src_n, 1.0f), *gw = rand_f32(nk, 1.0f);
    int32_t *idx = xmalloc(nk * sizeof(int32_t));
    for (size_t i = 0; i < nk; i++)
        idx[i] = irand(src_rows);
    wpair w;
    make_weight(&w, DFLASH_DTYPE_BF16, 1, dim, 2.0f);
    float *delta = xmalloc(cnt * sizeof(float)), *ref = xmalloc(cnt * sizeof(float));
    const dflash_gather hsum = { .src = src, .idx = idx, .w = gw, .k = k };
    float *dx = gpu_copy(x, cnt * sizeof(float)), *dx2 = gpu_copy(x, cnt * sizeof(float));
    const dflash_gather dsum = { .src = gpu_copy(src, src_n * sizeof(float)),
                                 .idx = gpu_copy(idx, nk * sizeof(int32_t)),
                                 .w = gpu_copy(gw, nk * sizeof(float)),
                                 .k = k };
    float *dd = gpu_poison(cnt), *dout = gpu_poison(cnt), *dout2 = gpu_poison(cnt);
    MUST(dflash_be_gather_add_rmsnorm_composed(g_cpu, x, &hsum, delta, &w.h, n, dim, 1e-6f, ref));
    MUST(dflash_be_gather_add_rmsnorm(g_gpu, dx, &dsum, dd, &w.d, n, dim, 1e-6f, dout));
    MUST(dflash_be_gather_add_rmsnorm_composed(g_gpu, dx2, &dsum, dd, &w.d, n, dim, 1e-6f, dout2));
    check_f32("gather_add_rmsnorm", shape, dout, ref, cnt, 1e-5);
    char s2[128];
    snprintf(s2, sizeof s2, "%s (x)", shape);
    check_f32("gather_add_rmsnorm", s2, dx, x, cnt, 0.0);
    float *comp = xmalloc(cnt * sizeof(float));
    gpu_get(comp, dout2, cnt * sizeof(float));
    check_exact("gather_add_rmsnorm == gather_sum, add_rmsnorm", shape, dout, comp, cnt * sizeof(float));
    gpu_get(comp, dx2, cnt * sizeof(float));
    check_exact("gather_add_rmsnorm == gather_sum, add_rmsnorm", s2, dx, comp, cnt * sizeof(float));
    if (timed) {
        garms_arg a = { dx, dd, dout, &dsum, &w.d, n, dim, 0 };
        const double bytes = (double)cnt * 4 * 3 + (double)nk * 4 * dim + dim * 2.0;
        time_op("gather_add_rmsnorm", shape, run_garms, &a, bytes);
        a.composed = 1;
        time_op("gather_sum, add_rmsnorm", shape, run_garms, &a, bytes);
    }
    free(x), free(src), free(gw), free(idx), free(delta), free(ref), free(comp);
    free_weight(&w);
    gpu_reset();
}

/* linear_add_rmsnorm (an output projection added to the residual stream
 * with the next norm): x and the norm bit for bit the GPU's own
 * composition (linear, add_rmsnorm), whether the GEMM leaves its split-K
 * sum to the norm's launch (up to 64 rows, K split, rows of at most 4096)
 * or the stage composes; the CPU's within the GEMM's tolerance. Timed:
 * the stage and the two launches it stands for. */
typedef struct lar_arg {
    const float *in;
    float *x, *delta, *out;
    const dflash_weight *W, *w;
    int n, dim, composed;
} lar_arg;
static dflash_status run_lar(void *p)
{
    lar_arg *a = p;
    if (a->composed)
        return dflash_be_linear_add_rmsnorm_composed(g_gpu, a->in, a->n, a->W, a->x, a->delta, a->w, a->dim, 1e-6f,
                                                     a->out);
    return dflash_be_linear_add_rmsnorm(g_gpu, a->in, a->n, a->W, a->x, a->delta, a->w, a->dim, 1e-6f, a->out);
}

static void case_linear_add_rmsnorm(dflash_dtype dt, int n, int dim, int64_t K, int timed)
{
    char shape[112];
    snprintf(shape, sizeof shape, "%s W %d x %lld, %d rows", dflash_dtype_name(dt), dim, (long long)K, n);
    wpair W, w;
    make_weight(&W, dt, dim, K, 2.0f / sqrtf((float)K));
    make_weight(&w, DFLASH_DTYPE_BF16, 1, dim, 2.0f);
    const size_t cnt = (size_t)n * dim, in_n = (size_t)n * (size_t)K;
    float *in = rand_f32(in_n, 1.0f), *x = rand_f32(cnt, 3.0f);
    float *delta = xmalloc(cnt * sizeof(float)), *ref = xmalloc(cnt * sizeof(float));
    float *comp = xmalloc(cnt * sizeof(float)), *xref = xmalloc(cnt * sizeof(float));
    memcpy(xref, x, cnt * sizeof(float));
    MUST(dflash_be_linear_add_rmsnorm(g_cpu, in, n, &W.h, xref, delta, &w.h, dim, 1e-6f, ref));
    float *din = gpu_copy(in, in_n * sizeof(float));
    float *dx = gpu_copy(x, cnt * sizeof(float)), *dx2 = gpu_copy(x, cnt * sizeof(float));
    float *dd = gpu_poison(cnt), *dout = gpu_poison(cnt), *dout2 = gpu_poison(cnt);
    MUST(dflash_be_linear_add_rmsnorm(g_gpu, din, n, &W.d, dx, dd, &w.d, dim, 1e-6f, dout));
    MUST(dflash_be_linear_add_rmsnorm_composed(g_gpu, din, n, &W.d, dx2, dd, &w.d, dim, 1e-6f, dout2));
    char s2[128];
    snprintf(s2, sizeof s2, "%s (x)", shape);
    check_f32("linear_add_rmsnorm", shape, dout, ref, cnt, 1e-4);
    check_f32("linear_add_rmsnorm", s2, dx, xref, cnt, 1e-5);
    gpu_get(comp, dout2, cnt * sizeof(float));
    check_exact("linear_add_rmsnorm == linear, add_rmsnorm", shape, dout, comp, cnt * sizeof(float));
    gpu_get(comp, dx2, cnt * sizeof(float));
    check_exact("linear_add_rmsnorm == linear, add_rmsnorm", s2, dx, comp, cnt * sizeof(float));
    if (timed) {
        lar_arg a = { din, dx, dd, dout, &W.d, &w.d, n, dim, 0 };
        const double bytes = (double)dim * (double)K * (double)dflash_dtype_size(dt) + (double)cnt * 4 * 3;
        time_op("linear_add_rmsnorm", shape, run_lar, &a, bytes);
        a.composed = 1;
        time_op("linear, add_rmsnorm", shape, run_lar, &a, bytes);
    }
    free(in), free(x), free(delta), free(ref), free(comp), free(xref);
    free_weight(&W);
    free_weight(&w);
    gpu_reset();
}

typedef struct ew_arg {
    float *a;
    const float *b;
    size_t n;
    float *out;
} ew_arg;
static dflash_status run_add(void *p)
{
    ew_arg *a = p;
    return g_gpu->ops->add(g_gpu, a->a, a->b, a->n);
}
static dflash_status run_swiglu(void *p)
{
    ew_arg *a = p;
    return g_gpu->ops->swiglu(g_gpu, a->a, a->b, a->n, a->out);
}

static void case_elementwise(size_t count, size_t offset, int timed)
{
    char shape[112];
    snprintf(shape, sizeof shape, "%zu elements%s", count, offset ? " (unaligned)" : "");
    float *a = rand_f32(count + offset, 8.0f), *b = rand_f32(count + offset, 8.0f);
    float *ref = xmalloc((count + offset) * sizeof(float));
    /* swiglu */
    float *da = gpu_copy(a, (count + offset) * sizeof(float)), *db = gpu_copy(b, (count + offset) * sizeof(float));
    float *dout = gpu_poison(count + offset);
    MUST(g_cpu->ops->swiglu(g_cpu, a + offset, b + offset, count, ref));
    MUST(g_gpu->ops->swiglu(g_gpu, da + offset, db + offset, count, dout + offset));
    check_f32("swiglu", shape, dout + offset, ref, count, 1e-6);
    if (timed) {
        ew_arg e = { da + offset, db + offset, count, dout + offset };
        time_op("swiglu", shape, run_swiglu, &e, 12.0 * count);
    }
    /* add (in place) */
    MUST(g_cpu->ops->add(g_cpu, a + offset, b + offset, count));
    MUST(g_gpu->ops->add(g_gpu, da + offset, db + offset, count));
    check_f32("add", shape, da + offset, a + offset, count, 0.0);
    if (timed) {
        ew_arg e = { da + offset, db + offset, count, NULL };
        time_op("add", shape, run_add, &e, 12.0 * count);
    }
    free(a);
    free(b);
    free(ref);
    gpu_reset();
}

/* add_bias: rows plus a bias vector of each weight dtype, the same bits as
 * the CPU (one f32 add per element). */
static void case_add_bias(dflash_dtype dt, int n, int cols)
{
    char shape[112];
    snprintf(shape, sizeof shape, "%s %d rows x %d", dflash_dtype_name(dt), n, cols);
    float *x = rand_f32((size_t)n * cols, 4.0f);
    float *dx = gpu_copy(x, (size_t)n * cols * sizeof(float));
    wpair b;
    make_weight(&b, dt, 1, cols, 1.0f);
    MUST(g_cpu->ops->add_bias(g_cpu, x, &b.h, n, cols));
    MUST(g_gpu->ops->add_bias(g_gpu, dx, &b.d, n, cols));
    check_f32("add_bias", shape, dx, x, (size_t)n * cols, 0.0);
    free(x);
    free_weight(&b);
    gpu_reset();
}

/* ---- linear ------------------------------------------------------------- */

typedef struct lin_arg {
    const float *x;
    int n;
    const dflash_weight *w;
    float *out;
} lin_arg;
static dflash_status run_linear(void *p)
{
    lin_arg *a = p;
    return g_gpu->ops->linear(g_gpu, a->x, a->n, a->w, a->out);
}

static void case_linear(dflash_dtype dt, int64_t N, int64_t K, const int *rows, int n_rows, int timed,
                        size_t x_offset)
{
    wpair w;
    make_weight(&w, dt, N, K, 1.0f / sqrtf((float)K) * 2.0f);
    int maxn = 0;
    for (int r = 0; r < n_rows; r++)
        maxn = rows[r] > maxn ? rows[r] : maxn;
    float *x = rand_f32((size_t)(maxn * K) + x_offset, 1.0f);
    float *dx = gpu_copy(x, ((size_t)(maxn * K) + x_offset) * sizeof(float));
    float *ref = xmalloc((size_t)(maxn * N) * sizeof(float));
    for (int r = 0; r < n_rows; r++) {
        int n = rows[r];
        char shape[112];
        snprintf(shape, sizeof shape, "%s W %lld x %lld, %d rows%s", dflash_dtype_name(dt), (long long)N,
                 (long long)K, n, x_offset ? " (x unaligned)" : "");
        float *dout = gpu_poison((size_t)(n * N));
        MUST(g_cpu->ops->linear(g_cpu, x + x_offset, n, &w.h, ref));
        MUST(g_gpu->ops->linear(g_gpu, dx + x_offset, n, &w.d, dout));
        check_f32("linear", shape, dout, ref, (size_t)(n * N), 1e-4);
        if (timed) {
            lin_arg a = { dx + x_offset, n, &w.d, dout };
            double bytes = (double)N * K * dflash_dtype_size(dt) + (w.hscales ? N * 4.0 : 0) + 4.0 * n * (K + N);
            time_op("linear", shape, run_linear, &a, bytes);
        }
    }
    free(x);
    free(ref);
    free_weight(&w);
    gpu_reset();
}

/* A row's result must not depend on the rows sharing the call: every row
 * of an n-row linear equals the same row computed alone, bit for bit. */
static void case_linear_invariance(dflash_dtype dt, int64_t N, int64_t K, int n)
{
    char shape[112];
    snprintf(shape, sizeof shape, "%s W %lld x %lld, %d rows vs each alone", dflash_dtype_name(dt), (long long)N,
             (long long)K, n);
    wpair w;
    make_weight(&w, dt, N, K, 1.0f / sqrtf((float)K) * 2.0f);
    float *x = rand_f32((size_t)(n * K), 1.0f);
    float *dx = gpu_copy(x, (size_t)(n * K) * sizeof(float));
    float *dall = gpu_poison((size_t)(n * N)), *done = gpu_poison((size_t)N);
    float *all = xmalloc((size_t)(n * N) * sizeof(float)), *one = xmalloc((size_t)N * sizeof(float));
    MUST(g_gpu->ops->linear(g_gpu, dx, n, &w.d, dall));
    gpu_get(all, dall, (size_t)(n * N) * sizeof(float));
    int bad = 0;
    for (int r = 0; r < n; r++) {
        MUST(g_gpu->ops->linear(g_gpu, dx + (size_t)r * K, 1, &w.d, done));
        gpu_get(one, done, (size_t)N * sizeof(float));
        bad += memcmp(one, all + (size_t)r * N, (size_t)N * sizeof(float)) != 0;
    }
    record("linear rows", shape, bad ? INFINITY : 0.0, 0.0);
    free(x), free(all), free(one);
    free_weight(&w);
    gpu_reset();
}

/* Set (value) or clear (NULL) a lever's environment variable, and re-read
 * the levers. */
static void lever_env(const char *name, const char *value)
{
    if (value)
        setenv(name, value, 1);
    else
        unsetenv(name);
    dflash_levers_reload();
}

/* A second CUDA backend created with one lever set (name=value), the
 * levers restored after. */
static dflash_backend *backend_with(const char *name, const char *value)
{
    lever_env(name, value);
    dflash_backend *be;
    MUST(dflash_backend_cuda_create(0, &be));
    lever_env(name, NULL);
    return be;
}

/* The label of a rows check: "<dtype> <kind> [N0,N1,..] x K, " then
 * `rest` (printf-style). kind: 0 linear, 1 q/k/v group, 2 gate/up +
 * SwiGLU, 3 LM head argmax; returns the weights per call. */
static int rows_shape(char *shape, size_t size, dflash_dtype dt, int kind, const int64_t *N, int64_t K,
                      const char *rest, ...)
{
    static const char *const kinds[] = { "linear", "group", "swiglu", "argmax" };
    const int n_w = kind == 1 ? 3 : kind == 2 ? 2 : 1;
    int len = snprintf(shape, size, "%s %s [", dflash_dtype_name(dt), kinds[kind]);
    for (int i = 0; i < n_w; i++)
        len += snprintf(shape + len, size - (size_t)len, "%s%lld", i ? "," : "", (long long)N[i]);
    len += snprintf(shape + len, size - (size_t)len, "] x %lld, ", (long long)K);
    va_list ap;
    va_start(ap, rest);
    vsnprintf(shape + len, size - (size_t)len, rest, ap);
    va_end(ap);
    return n_w;
}

/* A linear group case's n_w weights [N[i], K] with, for each, two device
 * outputs of rows_a and rows_b rows (poisoned) and host buffers of the
 * same sizes. */
typedef struct group_bufs {
    wpair w[3];
    dflash_weight wd[3];
    float *dev[2][3], *host[2][3];
    int n_w;
} group_bufs;

static void group_bufs_make(group_bufs *g, int n_w, dflash_dtype dt, const int64_t *N, int64_t K, int rows_a,
                            int rows_b)
{
    const int rows[2] = { rows_a, rows_b };
    g->n_w = n_w;
    for (int i = 0; i < n_w; i++) {
        make_weight(&g->w[i], dt, N[i], K, 1.0f / sqrtf((float)K) * 2.0f);
        g->wd[i] = g->w[i].d;
        for (int j = 0; j < 2; j++) {
            g->dev[j][i] = gpu_poison((size_t)(rows[j] * N[i]));
            g->host[j][i] = xmalloc((size_t)(rows[j] * N[i]) * sizeof(float));
        }
    }
}

static void group_bufs_free(group_bufs *g)
{
    for (int i = 0; i < g->n_w; i++) {
        free(g->host[0][i]), free(g->host[1][i]);
        free_weight(&g->w[i]);
    }
}

/* Many rows (gemm_wide.cu from DFLASH_CUDA_GEMM_WIDE rows, 65 by default)
 * must give the bits one row alone gives (gemm.cu): every output of an
 * n-row linear (kind 0), q/k/v group (1), gate/up + SwiGLU (2) or LM head
 * argmax (3) is compared with the same row's call alone, bit for bit. On
 * `be` (the default backend, or one made with another split-K). */
static void case_rows_invariance(dflash_backend *be, const char *tag, dflash_dtype dt, int kind, const int64_t *N,
                                 int64_t K, int n)
{
    const int n_out = kind == 1 ? 3 : 1;
    dflash_backend *keep = g_gpu;
    g_gpu = be;
    char shape[112];
    const int n_w = rows_shape(shape, sizeof shape, dt, kind, N, K, "%d rows vs each alone%s", n, tag);
    group_bufs g;
    group_bufs_make(&g, n_w, dt, N, K, n, 1);
    const dflash_weight *wd = g.wd;
    float **dall = g.dev[0], **done = g.dev[1], **all = g.host[0], **one = g.host[1];
    float *x = rand_f32((size_t)(n * K), 1.0f);
    float *dx = gpu_copy(x, (size_t)(n * K) * sizeof(float));
    int32_t *dids = gpu_alloc((size_t)n * sizeof(int32_t)), *ids = xmalloc((size_t)n * sizeof(int32_t)), id1;
    if (kind == 3) {
        MUST(dflash_be_linear_argmax(g_gpu, dx, n, wd, dall[0], dids));
        gpu_get(ids, dids, (size_t)n * sizeof(int32_t));
    } else {
        MUST(dflash_be_linear_group(g_gpu, dx, n, wd, n_w, dall, kind == 2 ? DFLASH_ACT_SWIGLU : DFLASH_ACT_NONE));
        for (int i = 0; i < n_out; i++)
            gpu_get(all[i], dall[i], (size_t)(n * N[i]) * sizeof(float));
    }
    int bad = 0;
    for (int r = 0; r < n; r++) {
        const float *xr = dx + (size_t)r * K;
        if (kind == 3) {
            MUST(dflash_be_linear_argmax(g_gpu, xr, 1, wd, done[0], dids));
            gpu_get(&id1, dids, sizeof id1);
            bad += id1 != ids[r];
            continue;
        }
        MUST(dflash_be_linear_group(g_gpu, xr, 1, wd, n_w, done, kind == 2 ? DFLASH_ACT_SWIGLU : DFLASH_ACT_NONE));
        for (int i = 0; i < n_out; i++) {
            gpu_get(one[i], done[i], (size_t)N[i] * sizeof(float));
            bad += memcmp(one[i], all[i] + (size_t)r * N[i], (size_t)N[i] * sizeof(float)) != 0;
        }
    }
    record("linear rows", shape, bad ? INFINITY : 0.0, 0.0);
    group_bufs_free(&g);
    free(x), free(ids);
    gpu_reset();
    g_gpu = keep;
}

/* Split-K partials added by every slice of a row block (share_sum, the
 * default where the grid fits the device; on `shared`) against the last
 * slice adding them alone (DFLASH_CUDA_GEMM_SHARE_SUM=0 on `alone`): the
 * same n-row linear group (kind 0 linear, 1 q/k/v, 2 gate/up + SwiGLU),
 * bit for bit. */
static void case_share_sum_bits(dflash_backend *shared, const char *tag, dflash_backend *alone, dflash_dtype dt,
                                int kind, const int64_t *N, int64_t K, int n)
{
    const int n_out = kind == 1 ? 3 : 1;
    const enum dflash_act act = kind == 2 ? DFLASH_ACT_SWIGLU : DFLASH_ACT_NONE;
    char shape[112];
    const int n_w = rows_shape(shape, sizeof shape, dt, kind, N, K, "%d rows, %s vs one block", n, tag);
    group_bufs g;
    group_bufs_make(&g, n_w, dt, N, K, n, n);
    const dflash_weight *wd = g.wd;
    float **d_sh = g.dev[0], **d_one = g.dev[1], **h_sh = g.host[0], **h_one = g.host[1];
    float *x = rand_f32((size_t)(n * K), 1.0f);
    float *dx = gpu_copy(x, (size_t)(n * K) * sizeof(float));
    /* one backend at a time: each has its own stream */
    MUST(dflash_be_linear_group(shared, dx, n, wd, n_w, d_sh, act));
    MUST(shared->ops->sync(shared));
    MUST(dflash_be_linear_group(alone, dx, n, wd, n_w, d_one, act));
    MUST(alone->ops->sync(alone));
    int bad = 0;
    for (int i = 0; i < n_out; i++) {
        gpu_get(h_sh[i], d_sh[i], (size_t)(n * N[i]) * sizeof(float));
        gpu_get(h_one[i], d_one[i], (size_t)(n * N[i]) * sizeof(float));
        bad += memcmp(h_sh[i], h_one[i], (size_t)(n * N[i]) * sizeof(float)) != 0;
    }
    record("linear rows", shape, bad ? INFINITY : 0.0, 0.0);
    group_bufs_free(&g);
    free(x);
    gpu_reset();
}

/* Every fp8 e4m3 code through the tensor-core path: W [16, 256] holds all
 * 256 codes (NaN codes replaced by 0) with scale 1, x one-hot rows, so each
 * output is one decoded weight, compared exactly with the CPU decoder. */
static void case_fp8_codes(void)
{
    enum { N = 16, K = 256, M = 64 };
    uint8_t *codes = xmalloc(N * K);
    float *scales = xmalloc(N * sizeof(float)), *x = xmalloc((size_t)M * K * sizeof(float));
    for (int r = 0; r < N; r++) {
        scales[r] = 1.0f;
        for (int k = 0; k < K; k++) {
            int c = (k + 16 * r) & 255;
            codes[r * K + k] = (c & 0x7f) == 0x7f ? 0 : (uint8_t)c;
        }
    }
    dflash_weight h = { DFLASH_DTYPE_F8_E4M3, N, K, codes, scales, "fp8 codes" }, d = h;
    d.data = gpu_copy(codes, N * K);
    d.scales = gpu_copy(scales, N * sizeof(float));
    float *ref = xmalloc((size_t)M * N * sizeof(float));
    int bad = 0;
    for (int base = 0; base < K; base += M) {
        memset(x, 0, (size_t)M * K * sizeof(float));
        for (int m = 0; m < M; m++)
            x[m * K + base + m] = 1.0f;
        float *dx = gpu_copy(x, (size_t)M * K * sizeof(float)), *dy = gpu_poison((size_t)M * N);
        float *got = xmalloc((size_t)M * N * sizeof(float));
        MUST(g_cpu->ops->linear(g_cpu, x, M, &h, ref));
        MUST(g_gpu->ops->linear(g_gpu, dx, M, &d, dy));
        gpu_get(got, dy, (size_t)M * N * sizeof(float));
        bad += memcmp(got, ref, (size_t)M * N * sizeof(float)) != 0;
        free(got);
    }
    record("linear fp8", "all 256 e4m3 codes, one-hot rows, exact", bad ? INFINITY : 0.0, 0.0);
    free(codes), free(scales), free(x), free(ref);
    gpu_reset();
}

/* linear_group against the CPU's composition (separate linears, then
 * swiglu), and its time for the real q/k/v and gate/up shapes. */
typedef struct group_arg {
    const float *x;
    int n, n_w;
    const dflash_weight *w;
    float *const *out;
    enum dflash_act act;
} group_arg;
static dflash_status run_group(void *p)
{
    group_arg *a = p;
    return dflash_be_linear_group(g_gpu, a->x, a->n, a->w, a->n_w, a->out, a->act);
}

/* dt_last: the last weight's dtype (another than dt: weights that cannot
 * share a launch, each on its own kernel) */
static void case_linear_group_mixed(dflash_dtype dt, dflash_dtype dt_last, int n_w, const int64_t *N, int64_t K,
                                    enum dflash_act act, int n, int timed)
{
    char shape[112];
    int len = snprintf(shape, sizeof shape, "%s%s%s %s [", dflash_dtype_name(dt), dt_last != dt ? "+" : "",
                       dt_last != dt ? dflash_dtype_name(dt_last) : "", act == DFLASH_ACT_SWIGLU ? "swiglu" : "group");
    for (int i = 0; i < n_w; i++)
        len += snprintf(shape + len, sizeof shape - (size_t)len, "%s%lld", i ? "," : "", (long long)N[i]);
    snprintf(shape + len, sizeof shape - (size_t)len, "] x %lld, %d rows", (long long)K, n);
    wpair w[DFLASH_GROUP_MAX_W];
    dflash_weight wh[DFLASH_GROUP_MAX_W], wd[DFLASH_GROUP_MAX_W];
    float *ref[DFLASH_GROUP_MAX_W], *dout[DFLASH_GROUP_MAX_W];
    float *x = rand_f32((size_t)(n * K), 1.0f);
    float *dx = gpu_copy(x, (size_t)(n * K) * sizeof(float));
    double bytes = 4.0 * n * K;
    for (int i = 0; i < n_w; i++) {
        const dflash_dtype d = i == n_w - 1 ? dt_last : dt;
        make_weight(&w[i], d, N[i], K, 1.0f / sqrtf((float)K) * 2.0f);
        wh[i] = w[i].h;
        wd[i] = w[i].d;
        ref[i] = xmalloc((size_t)(n * N[i]) * sizeof(float));
        dout[i] = gpu_poison((size_t)(n * N[i]));
        bytes += (double)N[i] * K * dflash_dtype_size(d) + 4.0 * n * N[i];
    }
    MUST(dflash_be_linear_group(g_cpu, x, n, wh, n_w, ref, act));
    MUST(dflash_be_linear_group(g_gpu, dx, n, wd, n_w, dout, act));
    for (int i = 0; i < (act == DFLASH_ACT_SWIGLU ? 1 : n_w); i++)
        check_f32("linear_group", shape, dout[i], ref[i], (size_t)(n * N[i]), 1e-4);
    if (timed) {
        group_arg a = { dx, n, n_w, wd, dout, act };
        time_op("linear_group", shape, run_group, &a, bytes);
    }
    for (int i = 0; i < n_w; i++) {
        free(ref[i]);
        free_weight(&w[i]);
    }
    free(x);
    gpu_reset();
}

static void case_linear_group(dflash_dtype dt, int n_w, const int64_t *N, int64_t K, enum dflash_act act, int n,
                              int timed)
{
    case_linear_group_mixed(dt, dt, n_w, N, K, act, n, timed);
}

/* linear_gated_add (a MoE's shared expert: down projection, sigmoid gate
 * and residual add in one epilogue; with k > 0 the routed experts' sum of
 * k terms a row written first, in the same epilogue): the same bits as
 * the GPU's own composition of gather_sum, linear, sigmoid_mul and add,
 * and the CPU's within the GEMM's tolerance. More than 64 rows also
 * through gemm.cu's launches of 64 (DFLASH_CUDA_GEMM_WIDE past the row
 * count): the same bits. */
static void case_gated_add(dflash_dtype dt, int n, int64_t N, int64_t K, int k)
{
    char shape[112];
    snprintf(shape, sizeof shape, "%s W %lld x %lld, %d rows, %d routed", dflash_dtype_name(dt), (long long)N,
             (long long)K, n, k);
    wpair w;
    make_weight(&w, dt, N, K, 2.0f / sqrtf((float)K));
    const size_t on = (size_t)n * (size_t)N, nk = (size_t)n * (size_t)k;
    float *x = rand_f32((size_t)n * (size_t)K, 1.0f), *g = rand_f32((size_t)n, 4.0f), *o = rand_f32(on, 1.0f);
    float *ref = xmalloc(on * sizeof(float)), *tmp = xmalloc(on * sizeof(float)), *comp = xmalloc(on * sizeof(float));
    /* the routed terms: each of the n k rows of src used once, in shuffled slots */
    float *src = rand_f32(nk * (size_t)N + 1, 1.0f), *pw = rand_f32(nk + 1, 0.5f);
    int32_t *idx = xmalloc((nk + 1) * sizeof(int32_t));
    for (size_t i = 0; i < nk; i++)
        idx[i] = (int32_t)i;
    for (size_t i = nk; i > 1; i--) {
        const size_t j = (size_t)irand((int)i);
        const int32_t t = idx[i - 1];
        idx[i - 1] = idx[j], idx[j] = t;
    }
    const dflash_gather hsum = { src, idx, pw, k };
    const dflash_gather dsum = { gpu_copy(src, nk * (size_t)N * sizeof(float) + sizeof(float)),
                                 gpu_copy(idx, (nk + 1) * sizeof(int32_t)), gpu_copy(pw, (nk + 1) * sizeof(float)), k };
    memcpy(ref, o, on * sizeof(float));
    MUST(dflash_be_linear_gated_add(g_cpu, x, n, &w.h, g, tmp, ref, k ? &hsum : NULL));
    float *dx = gpu_copy(x, (size_t)n * (size_t)K * sizeof(float)), *dg = gpu_copy(g, (size_t)n * sizeof(float));
    float *dfused = k ? gpu_poison(on) : gpu_copy(o, on * sizeof(float)), *dcomp = gpu_copy(o, on * sizeof(float));
    float *dtmp = gpu_poison(on);
    MUST(dflash_be_linear_gated_add(g_gpu, dx, n, &w.d, dg, dtmp, dfused, k ? &dsum : NULL));
    MUST(dflash_be_linear_gated_add_composed(g_gpu, dx, n, &w.d, dg, dtmp, dcomp, k ? &dsum : NULL));
    gpu_get(comp, dcomp, on * sizeof(float));
    check_exact(k ? "linear_gated_add == gather_sum, linear, sigmoid_mul, add" : "linear_gated_add == linear, sigmoid_mul, add",
                shape, dfused, comp, on * sizeof(float));
    check_f32("linear_gated_add", shape, dfused, ref, on, 1e-4);
    if (n > 64) {
        float *dnarrow = k ? gpu_poison(on) : gpu_copy(o, on * sizeof(float));
        dflash_backend *narrow = backend_with("DFLASH_CUDA_GEMM_WIDE", "100000");
        MUST(dflash_be_linear_gated_add(narrow, dx, n, &w.d, dg, dtmp, dnarrow, k ? &dsum : NULL));
        MUST(narrow->ops->sync(narrow));
        dflash_backend_destroy(narrow);
        check_exact("linear_gated_add in launches of 64 rows", shape, dnarrow, comp, on * sizeof(float));
    }
    free(x);
    free(g);
    free(o);
    free(ref);
    free(tmp);
    free(comp);
    free(src);
    free(pw);
    free(idx);
    free_weight(&w);
    gpu_reset();
}

/* A drafter layer's four weight passes back to back at 16 rows (q/k/v,
 * o, gate/up + SwiGLU, down), as a propose runs them: bytes of all four
 * over their time together. */
typedef struct layer_arg {
    const float *x, *xo, *xd;
    const dflash_weight *w; /* q k v o gate up down */
    float *const *qkv, *const *gu;
    float *o, *down;
    int n;
} layer_arg;
static dflash_status run_layer(void *p)
{
    layer_arg *a = p;
    DFLASH_TRY(dflash_be_linear_group(g_gpu, a->x, a->n, a->w, 3, a->qkv, DFLASH_ACT_NONE));
    DFLASH_TRY(g_gpu->ops->linear(g_gpu, a->xo, a->n, &a->w[3], a->o));
    DFLASH_TRY(dflash_be_linear_group(g_gpu, a->x, a->n, &a->w[4], 2, a->gu, DFLASH_ACT_SWIGLU));
    return g_gpu->ops->linear(g_gpu, a->xd, a->n, &a->w[6], a->down);
}

static void time_layer(dflash_dtype dt, int64_t H, int64_t QD, int64_t KD, int64_t I, int n)
{
    const int64_t rows[7] = { QD, KD, KD, H, I, I, H }, cols[7] = { H, H, H, QD, H, H, I };
    wpair w[7];
    dflash_weight wd[7];
    double bytes = 0;
    for (int i = 0; i < 7; i++) {
        make_weight(&w[i], dt, rows[i], cols[i], 0.02f);
        wd[i] = w[i].d;
        bytes += (double)rows[i] * cols[i] * dflash_dtype_size(dt);
    }
    float *hx = rand_f32((size_t)(n * I), 1.0f);
    float *x = gpu_copy(hx, (size_t)(n * H) * sizeof(float)), *xo = gpu_copy(hx, (size_t)(n * QD) * sizeof(float));
    float *xd = gpu_copy(hx, (size_t)(n * I) * sizeof(float));
    float *q = gpu_poison((size_t)(n * QD)), *k = gpu_poison((size_t)(n * KD)), *v = gpu_poison((size_t)(n * KD));
    float *o = gpu_poison((size_t)(n * H)), *g = gpu_poison((size_t)(n * I)), *u = gpu_poison((size_t)(n * I));
    float *down = gpu_poison((size_t)(n * H));
    float *qkv[3] = { q, k, v }, *gu[2] = { g, u };
    layer_arg a = { x, xo, xd, wd, qkv, gu, o, down, n };
    char shape[112];
    snprintf(shape, sizeof shape, "%s layer H %lld I %lld q/k/v %lld/%lld, %d rows", dflash_dtype_name(dt),
             (long long)H, (long long)I, (long long)QD, (long long)KD, n);
    time_op("layer gemms", shape, run_layer, &a, bytes);
    for (int i = 0; i < 7; i++)
        free_weight(&w[i]);
    free(hx);
    gpu_reset();
}

/* The fused LM head + argmax against the CPU's linear + argmax, ids
 * exact. special 1: two equal weight rows far above the rest (a tie: the
 * lower index wins); special 2: a NaN weight, so every row's logits hold a
 * NaN (the answer is -1: nothing to decode). */
typedef struct lam_arg {
    const float *x;
    int n;
    const dflash_weight *w;
    float *logits;
    int32_t *ids;
} lam_arg;
static dflash_status run_lin_argmax(void *p)
{
    lam_arg *a = p;
    return dflash_be_linear_argmax(g_gpu, a->x, a->n, a->w, a->logits, a->ids);
}

static void case_linear_argmax(dflash_dtype dt, int64_t N, int64_t K, int n, int special, int timed)
{
    char shape[112];
    snprintf(shape, sizeof shape, "%s W %lld x %lld, %d rows%s", dflash_dtype_name(dt), (long long)N, (long long)K,
             n, special == 1 ? ", tied best rows" : special == 2 ? ", a NaN weight" : "");
    float *hw = rand_f32((size_t)(N * K), 0.02f);
    float *x = rand_f32((size_t)(n * K), 1.0f);
    if (special == 1) {
        for (int64_t k = 0; k < K; k++) {
            hw[300 * K + k] = hw[200 * K + k] = 0.06f; /* equal rows, far above the rest for x > 0 */
        }
        for (int64_t i = 0; i < n * K; i++)
            x[i] = fabsf(x[i]) + 0.1f;
    } else if (special == 2) {
        hw[3] = NAN;
    }
    /* the weight in dt (fp8: per-row scales), built from hw */
    wpair w;
    make_weight(&w, dt, N, K, 1.0f);
    if (dt == DFLASH_DTYPE_BF16) {
        for (size_t i = 0; i < (size_t)(N * K); i++)
            ((uint16_t *)w.hdata)[i] = dflash_f32_to_bf16(hw[i]);
        MUST(g_gpu->ops->upload(g_gpu, (void *)w.d.data, w.hdata, (size_t)(N * K) * 2));
    }
    int32_t *ref = xmalloc((size_t)n * sizeof(int32_t)), *got = xmalloc((size_t)n * sizeof(int32_t));
    float *lref = xmalloc((size_t)(n * N) * sizeof(float));
    float *dx = gpu_copy(x, (size_t)(n * K) * sizeof(float)), *dl = gpu_poison((size_t)(n * N));
    int32_t *dids = gpu_alloc((size_t)n * sizeof(int32_t));
    MUST(dflash_be_linear_argmax(g_cpu, x, n, &w.h, lref, ref));
    MUST(dflash_be_linear_argmax(g_gpu, dx, n, &w.d, dl, dids));
    gpu_get(got, dids, (size_t)n * sizeof(int32_t));
    int bad = memcmp(got, ref, (size_t)n * sizeof(int32_t)) != 0;
    if (special == 1)
        bad += dt == DFLASH_DTYPE_BF16 && got[0] != 200;
    if (special == 2)
        for (int i = 0; i < n; i++)
            bad += got[i] != -1;
    if (bad)
        printf("     linear_argmax %s: gpu %d cpu %d (row 0)\n", shape, got[0], ref[0]);
    record("linear_argmax", shape, bad ? INFINITY : 0.0, 0.0);
    if (timed) {
        lam_arg a = { dx, n, &w.d, dl, dids };
        time_op("linear_argmax", shape, run_lin_argmax, &a, (double)N * K * dflash_dtype_size(dt) + 4.0 * n * K);
    }
    free(hw), free(x), free(ref), free(got), free(lref);
    free_weight(&w);
    gpu_reset();
}

/* ---- norm_rope ---------------------------------------------------------- */

typedef struct rope_arg {
    float *x;
    const dflash_weight *norm;
    const int32_t *pos;
    int n, heads, hd;
    const dflash_rope *rope;
} rope_arg;
static dflash_status run_rope(void *p)
{
    rope_arg *a = p;
    return g_gpu->ops->norm_rope(g_gpu, a->x, a->norm, a->pos, a->n, a->heads, a->hd, 1e-6f, a->rope);
}

/* RoPE kinds of the checks: theta, then (kind, factor) with the published
 * parameters of the kind (Llama 3.1's, a Qwen3 YaRN's). */
static dflash_rope make_rope(int hd, double theta, dflash_rope_kind kind, double factor)
{
    dflash_rope_params p = { .kind = kind, .theta = theta, .factor = factor };
    if (kind == DFLASH_ROPE_LLAMA3)
        p.low_freq_factor = 1, p.high_freq_factor = 4, p.original_max_pos = 8192;
    if (kind == DFLASH_ROPE_YARN)
        p.original_max_pos = 32768, p.beta_fast = 32, p.beta_slow = 1, p.truncate = 1;
    dflash_rope r;
    MUST(dflash_rope_init(&p, hd, &r));
    return r;
}

/* norm_gate (a Gated DeltaNet layer's output: silu(z) times the per-head
 * RMSNorm): the same bits as the GPU's own composition (norm_rope without
 * rotation, then swiglu), the CPU's within its tolerance. */
static void case_norm_gate(int n, int heads, int hd)
{
    char shape[112];
    snprintf(shape, sizeof shape, "%d rows x %d heads x %d", n, heads, hd);
    const size_t cnt = (size_t)n * heads * hd;
    float *x = rand_f32(cnt, 2.0f), *z = rand_f32(cnt, 3.0f), *nw = rand_f32((size_t)hd, 1.0f);
    float *ref = xmalloc(cnt * sizeof(float)), *comp = xmalloc(cnt * sizeof(float));
    int32_t *pos = xmalloc((size_t)n * sizeof(int32_t));
    for (int i = 0; i < n; i++)
        pos[i] = 3 * i;
    memcpy(ref, x, cnt * sizeof(float));
    const dflash_weight wh = { DFLASH_DTYPE_F32, 1, hd, nw, NULL, "norm" };
    MUST(dflash_be_norm_gate(g_cpu, ref, &wh, z, pos, n, heads, hd, 1e-6f));
    dflash_weight wd = wh;
    wd.data = gpu_copy(nw, (size_t)hd * sizeof(float));
    float *dx = gpu_copy(x, cnt * sizeof(float)), *dc = gpu_copy(x, cnt * sizeof(float));
    float *dz = gpu_copy(z, cnt * sizeof(float));
    int32_t *dpos = gpu_copy(pos, (size_t)n * sizeof(int32_t));
    MUST(dflash_be_norm_gate(g_gpu, dx, &wd, dz, dpos, n, heads, hd, 1e-6f));
    MUST(dflash_be_norm_gate_composed(g_gpu, dc, &wd, dz, dpos, n, heads, hd, 1e-6f));
    gpu_get(comp, dc, cnt * sizeof(float));
    check_exact("norm_gate == norm_rope, swiglu", shape, dx, comp, cnt * sizeof(float));
    check_f32("norm_gate", shape, dx, ref, cnt, 1e-5);
    free(x);
    free(z);
    free(nw);
    free(ref);
    free(comp);
    free(pos);
    gpu_reset();
}

static void case_norm_rope(int n, int heads, int hd, int with_norm, int max_pos, double theta, dflash_rope_kind kind,
                           double factor, int timed)
{
    char shape[112];
    snprintf(shape, sizeof shape, "%d rows x %d heads x %d%s, pos < %d, %s theta %g x %g", n, heads, hd,
             with_norm ? " + norm" : "", max_pos, dflash_rope_kind_name(kind), theta, factor);
    const dflash_rope rope = make_rope(hd, theta, kind, factor);
    size_t cnt = (size_t)n * heads * hd;
    float *x = rand_f32(cnt, 2.0f);
    int32_t *pos = xmalloc((size_t)n * sizeof(int32_t));
    for (int i = 0; i < n; i++)
        pos[i] = i == 0 ? max_pos - 1 : irand(max_pos);
    wpair w;
    make_weight(&w, DFLASH_DTYPE_BF16, 1, hd, 2.0f);
    float *dx = gpu_copy(x, cnt * sizeof(float));
    int32_t *dpos = gpu_copy(pos, (size_t)n * sizeof(int32_t));
    MUST(g_cpu->ops->norm_rope(g_cpu, x, with_norm ? &w.h : NULL, pos, n, heads, hd, 1e-6f, &rope));
    MUST(g_gpu->ops->norm_rope(g_gpu, dx, with_norm ? &w.d : NULL, dpos, n, heads, hd, 1e-6f, &rope));
    check_f32("norm_rope", shape, dx, x, cnt, 1e-5);
    if (timed) {
        rope_arg a = { dx, with_norm ? &w.d : NULL, dpos, n, heads, hd, &rope };
        time_op("norm_rope", shape, run_rope, &a, 8.0 * cnt);
    }
    free(x);
    free(pos);
    free_weight(&w);
    gpu_reset();
}

/* q and k of a layer in one launch, against the CPU's two norm_rope calls. */
typedef struct qkr_arg {
    float *q, *k;
    const dflash_weight *qn, *kn;
    const int32_t *pos;
    int n, hq, hkv, hd;
    const dflash_rope *rope;
} qkr_arg;
static dflash_status run_qk_rope(void *p)
{
    qkr_arg *a = p;
    return dflash_be_qk_norm_rope(g_gpu, a->q, a->qn, a->hq, a->k, a->kn, a->hkv, a->pos, a->n, a->hd, 1e-6f, a->rope);
}

/* rot: the dimensions rotated (head_dim: all; fewer: a partial rotation, as
 * a Qwen3.5's gated attention does, where the general kernel runs) */
static void case_qk_norm_rope_rot(int n, int hq, int hkv, int hd, int rot, int timed)
{
    char shape[112];
    snprintf(shape, sizeof shape, "%d rows x %d + %d heads x %d, yarn on %d dims", n, hq, hkv, hd, rot);
    const dflash_rope rope = make_rope(rot, 1e6, DFLASH_ROPE_YARN, 4);
    size_t nq = (size_t)n * hq * hd, nk = (size_t)n * hkv * hd;
    float *q = rand_f32(nq, 2.0f), *k = rand_f32(nk, 2.0f);
    int32_t *pos = xmalloc((size_t)n * sizeof(int32_t));
    for (int i = 0; i < n; i++)
        pos[i] = irand(40960);
    wpair qn, kn;
    make_weight(&qn, DFLASH_DTYPE_BF16, 1, hd, 2.0f);
    make_weight(&kn, DFLASH_DTYPE_BF16, 1, hd, 2.0f);
    float *dq = gpu_copy(q, nq * sizeof(float)), *dk = gpu_copy(k, nk * sizeof(float));
    int32_t *dpos = gpu_copy(pos, (size_t)n * sizeof(int32_t));
    MUST(dflash_be_qk_norm_rope(g_cpu, q, &qn.h, hq, k, &kn.h, hkv, pos, n, hd, 1e-6f, &rope));
    MUST(dflash_be_qk_norm_rope(g_gpu, dq, &qn.d, hq, dk, &kn.d, hkv, dpos, n, hd, 1e-6f, &rope));
    check_f32("qk_norm_rope", shape, dq, q, nq, 1e-5);
    check_f32("qk_norm_rope", shape, dk, k, nk, 1e-5);
    if (timed) {
        qkr_arg a = { dq, dk, &qn.d, &kn.d, dpos, n, hq, hkv, hd, &rope };
        time_op("qk_norm_rope", shape, run_qk_rope, &a, 8.0 * (nq + nk));
    }
    free(q), free(k), free(pos);
    free_weight(&qn);
    free_weight(&kn);
    gpu_reset();
}

static void case_qk_norm_rope(int n, int hq, int hkv, int hd, int timed)
{
    case_qk_norm_rope_rot(n, hq, hkv, hd, hd, timed);
}

/* q/k norm + RoPE with the K and V store (dflash_be_qk_norm_rope_store):
 * q, k and the pool bit for bit what the GPU's qk_norm_rope (or norm_rope
 * on k alone, hq 0) and kv_write leave, and q, k (and an f32 pool) within
 * 1e-5 of the CPU's. Rows alternate between two sequences, each with a
 * two-entry ring table; a sequence's positions are distinct modulo its
 * ring (32), so no two rows write the same slot. */
static void case_qk_norm_rope_store(int n, int hq, int hkv, int hd, int rot, dflash_dtype kdt, int normed)
{
    char shape[112];
    snprintf(shape, sizeof shape, "%d rows x %d + %d heads x %d, rope %d dims, %s pages%s", n, hq, hkv, hd, rot,
             dflash_dtype_name(kdt), normed ? "" : ", no norms");
    const dflash_rope rope = make_rope(rot, 1e6, DFLASH_ROPE_YARN, 4);
    enum { NP = 6, NL = 3, BT = 2, layer = 2 };
    const size_t nq = (size_t)n * hq * hd, nk = (size_t)n * hkv * hd;
    const size_t pool_n = (size_t)NP * NL * 2 * hkv * DFLASH_KV_PAGE * hd, pool_bytes = pool_n * dflash_dtype_size(kdt);
    float *q = rand_f32(nq ? nq : 1, 2.0f), *k = rand_f32(nk, 2.0f), *v = rand_f32(nk, 2.0f);
    int32_t *pos = xmalloc((size_t)n * sizeof(int32_t)), *rs = xmalloc((size_t)n * sizeof(int32_t));
    const int32_t table[2 * BT] = { 4, 1, 0, 5 }; /* sequence 0: pages 4, 1; sequence 1: 0, 5 */
    for (int i = 0; i < n; i++) {
        rs[i] = i % 2;
        pos[i] = 64 + (i / 2) * 4 + irand(4); /* pages 4 and 5: ring entries 0 and 1 */
    }
    void *cpu_pool = calloc(1, pool_bytes);
    wpair qn, kn;
    make_weight(&qn, DFLASH_DTYPE_BF16, 1, hd, 2.0f);
    make_weight(&kn, DFLASH_DTYPE_BF16, 1, hd, 2.0f);
    dflash_kv_layout hkv_l = { NP, NL, hkv, hd, kdt, cpu_pool }, fused = hkv_l, composed = hkv_l;
    fused.data = gpu_copy(cpu_pool, pool_bytes); /* zeros */
    composed.data = gpu_copy(cpu_pool, pool_bytes);
    float *dq = gpu_copy(q, (nq ? nq : 1) * sizeof(float)), *dk = gpu_copy(k, nk * sizeof(float));
    float *dq2 = gpu_copy(q, (nq ? nq : 1) * sizeof(float)), *dk2 = gpu_copy(k, nk * sizeof(float));
    float *dv = gpu_copy(v, nk * sizeof(float));
    int32_t *dpos = gpu_copy(pos, (size_t)n * sizeof(int32_t)), *drs = gpu_copy(rs, (size_t)n * sizeof(int32_t));
    int32_t *dtab = gpu_copy(table, sizeof table);
    const dflash_kv_dest gdst = { &fused, layer, dtab, BT, drs, dv }, cdst = { &hkv_l, layer, table, BT, rs, v };
    /* without norms (a Llama): RoPE alone, the stage's kernel still */
    const dflash_weight *gqn = normed ? &qn.d : NULL, *gkn = normed ? &kn.d : NULL;
    MUST(dflash_be_qk_norm_rope_store(g_gpu, dq, gqn, hq, dk, gkn, hkv, dpos, n, hd, 1e-6f, &rope, &gdst));
    if (hq)
        MUST(dflash_be_qk_norm_rope(g_gpu, dq2, gqn, hq, dk2, gkn, hkv, dpos, n, hd, 1e-6f, &rope));
    else
        MUST(g_gpu->ops->norm_rope(g_gpu, dk2, gkn, dpos, n, hkv, hd, 1e-6f, &rope));
    MUST(g_gpu->ops->kv_write(g_gpu, &composed, layer, dtab, BT, drs, dpos, dk2, dv, n));
    MUST(dflash_be_qk_norm_rope_store(g_cpu, q, normed ? &qn.h : NULL, hq, k, normed ? &kn.h : NULL, hkv, pos, n, hd,
                                      1e-6f, &rope, &cdst));
    float *hq2 = xmalloc((nq ? nq : 1) * sizeof(float)), *hk2 = xmalloc(nk * sizeof(float));
    void *hpool = xmalloc(pool_bytes);
    gpu_get(hq2, dq2, (nq ? nq : 1) * sizeof(float));
    gpu_get(hk2, dk2, nk * sizeof(float));
    gpu_get(hpool, composed.data, pool_bytes);
    if (hq)
        check_exact("qk_norm_rope_store q", shape, dq, hq2, nq * sizeof(float));
    check_exact("qk_norm_rope_store k", shape, dk, hk2, nk * sizeof(float));
    check_exact("qk_norm_rope_store pool", shape, fused.data, hpool, pool_bytes);
    if (hq)
        check_f32("qk_norm_rope_store q", shape, dq, q, nq, 1e-5);
    check_f32("qk_norm_rope_store k", shape, dk, k, nk, 1e-5);
    if (kdt == DFLASH_DTYPE_F32)
        check_f32("qk_norm_rope_store pool", shape, fused.data, cpu_pool, pool_n, 1e-5);
    free(q), free(k), free(v), free(pos), free(rs), free(cpu_pool), free(hq2), free(hk2), free(hpool);
    free_weight(&qn);
    free_weight(&kn);
    gpu_reset();
}

/* qkv_norm_rope_store (a layer's q/k/v projections, q/k norms, RoPE and
 * K/V store as one stage): q, k, v and the pool bit for bit the GPU's own
 * composition (linear_group, qk_norm_rope_store), whether the GEMM leaves
 * its split-K sum to the norm + RoPE launch (up to 64 rows, K split) or
 * the stage composes; the CPU's within the GEMM's tolerance (pool: f32
 * pages). dst: with a K/V destination (a target), or none (the drafter's
 * block). Timed: the stage and the launches it stands for. */
typedef struct qkv_run {
    dflash_qkv_args a;
    int composed;
} qkv_run;
static dflash_status run_qkv(void *p)
{
    qkv_run *r = p;
    if (r->composed)
        return dflash_be_qkv_norm_rope_store_composed(g_gpu, &r->a);
    return dflash_be_qkv_norm_rope_store(g_gpu, &r->a);
}

static void case_qkv_norm_rope_store(dflash_dtype wdt, int n, int hq, int hkv, int hd, int64_t K, int dst, int timed)
{
    char shape[128];
    snprintf(shape, sizeof shape, "%s W of %d + 2 x %d heads x %d, K %lld, %d rows%s", dflash_dtype_name(wdt), hq, hkv,
             hd, (long long)K, n, dst ? ", K/V stored" : "");
    const dflash_rope rope = make_rope(hd, 1e6, DFLASH_ROPE_DEFAULT, 1);
    enum { NP = 6, NL = 3, BT = 2, layer = 1 };
    const size_t nx = (size_t)n * K, nq = (size_t)n * hq * hd, nk = (size_t)n * hkv * hd;
    const size_t pool_n = (size_t)NP * NL * 2 * hkv * DFLASH_KV_PAGE * hd, pool_bytes = pool_n * sizeof(float);
    wpair w[3], qn, kn;
    for (int i = 0; i < 3; i++)
        make_weight(&w[i], wdt, (i ? hkv : hq) * (int64_t)hd, K, 2.0f / sqrtf((float)K));
    make_weight(&qn, DFLASH_DTYPE_BF16, 1, hd, 2.0f);
    make_weight(&kn, DFLASH_DTYPE_BF16, 1, hd, 2.0f);
    const dflash_weight hw[3] = { w[0].h, w[1].h, w[2].h }, dw[3] = { w[0].d, w[1].d, w[2].d };
    float *x = rand_f32(nx, 1.0f), *q = xmalloc(nq * sizeof(float)), *k = xmalloc(nk * sizeof(float));
    float *v = xmalloc(nk * sizeof(float));
    int32_t *pos = xmalloc((size_t)n * sizeof(int32_t)), *rs = xmalloc((size_t)n * sizeof(int32_t));
    const int32_t table[2 * BT] = { 4, 1, 0, 5 };
    for (int i = 0; i < n; i++) { /* two sequences, distinct positions of their two pages */
        rs[i] = i % 2;
        pos[i] = 300 + (i / 2) * 2 + irand(2);
    }
    void *cpu_pool = calloc(1, pool_bytes);
    dflash_kv_layout hl = { NP, NL, hkv, hd, DFLASH_DTYPE_F32, cpu_pool }, fl = hl, cl = hl;
    fl.data = gpu_copy(cpu_pool, pool_bytes);
    cl.data = gpu_copy(cpu_pool, pool_bytes);
    float *dx = gpu_copy(x, nx * sizeof(float));
    float *dq = gpu_poison(nq), *dk = gpu_poison(nk), *dv = gpu_poison(nk);
    float *dq2 = gpu_poison(nq), *dk2 = gpu_poison(nk), *dv2 = gpu_poison(nk);
    int32_t *dpos = gpu_copy(pos, (size_t)n * sizeof(int32_t)), *drs = gpu_copy(rs, (size_t)n * sizeof(int32_t));
    int32_t *dtab = gpu_copy(table, sizeof table);
    const dflash_kv_dest hdst = { &hl, layer, table, BT, rs, v }, fdst = { &fl, layer, dtab, BT, drs, dv },
                         cdst = { &cl, layer, dtab, BT, drs, dv2 };
    const dflash_qkv_args ha = { x, n, hw, q, k, v, &qn.h, &kn.h, hq, hkv, hd, pos, 1e-6f, &rope, dst ? &hdst : NULL };
    qkv_run run = { { dx, n, dw, dq, dk, dv, &qn.d, &kn.d, hq, hkv, hd, dpos, 1e-6f, &rope, dst ? &fdst : NULL }, 0 };
    dflash_qkv_args ca = run.a;
    ca.q = dq2, ca.k = dk2, ca.v = dv2, ca.dst = dst ? &cdst : NULL;
    MUST(dflash_be_qkv_norm_rope_store(g_cpu, &ha));
    MUST(dflash_be_qkv_norm_rope_store(g_gpu, &run.a));
    MUST(dflash_be_qkv_norm_rope_store_composed(g_gpu, &ca));
    const struct {
        const char *what;
        const float *got, *comp, *cpu;
        size_t n;
    } out[4] = { { "q", dq, dq2, q, nq }, { "k", dk, dk2, k, nk }, { "v", dv, dv2, v, nk },
                 { "pool", fl.data, cl.data, cpu_pool, dst ? pool_n : 0 } };
    for (int i = 0; i < 4; i++) {
        if (!out[i].n)
            continue;
        char what[64], s2[200];
        snprintf(what, sizeof what, "qkv_norm_rope_store %s", out[i].what);
        snprintf(s2, sizeof s2, "%s == linear_group, qk_norm_rope_store", shape);
        float *h = xmalloc(out[i].n * sizeof(float));
        gpu_get(h, out[i].comp, out[i].n * sizeof(float));
        check_exact(what, s2, out[i].got, h, out[i].n * sizeof(float));
        check_f32(what, shape, out[i].got, out[i].cpu, out[i].n, 1e-4);
        free(h);
    }
    if (timed) {
        const double bytes = (double)(hq + 2 * hkv) * hd * (double)K * (double)dflash_dtype_size(wdt);
        time_op("qkv_norm_rope_store", shape, run_qkv, &run, bytes);
        run.composed = 1;
        time_op("linear_group, qk_norm_rope_store", shape, run_qkv, &run, bytes);
    }
    free(x), free(q), free(k), free(v), free(pos), free(rs), free(cpu_pool);
    for (int i = 0; i < 3; i++)
        free_weight(&w[i]);
    free_weight(&qn);
    free_weight(&kn);
    gpu_reset();
}

/* ---- recurrent state: conv_silu, delta_rule, sigmoid_mul ---------------- */

/* Gated DeltaNet geometry of a case. */
typedef struct gdn_geom {
    int Hk, Hv, dk, dv, K;
} gdn_geom;

/* Inputs of one call of a linear-attention layer: x [n, C], a and b [n, Hv]. */
typedef struct rec_inputs {
    int n;
    float *x, *a, *b;    /* host */
    float *dx, *da, *db; /* device copies */
} rec_inputs;

static rec_inputs rec_inputs_make(int n, int64_t C, int Hv)
{
    rec_inputs in = { n, rand_f32((size_t)n * C, 2.0f), rand_f32((size_t)n * Hv, 2.0f), rand_f32((size_t)n * Hv, 3.0f),
                      NULL, NULL, NULL };
    in.dx = gpu_copy(in.x, (size_t)n * C * sizeof(float));
    in.da = gpu_copy(in.a, (size_t)n * Hv * sizeof(float));
    in.db = gpu_copy(in.b, (size_t)n * Hv * sizeof(float));
    return in;
}

/* Records of one layer on both sides: conv and delta, n_recs each. */
typedef struct rec_pair {
    int64_t conv_sz, delta_sz;
    float *cst, *dst;   /* host */
    float *dcst, *ddst; /* device */
} rec_pair;

/* conv_silu then delta_rule over one call's sequences (entries `info`) on
 * both sides: outputs into y/o (host) and dy/dO (device). */
static void rec_call(gdn_geom g, const rec_pair *r, const int32_t *info, int n_seqs, const rec_inputs *in,
                     const wpair *cw, const wpair *alog, const wpair *dtb, float *y, float *o, float *dy, float *dO)
{
    const int64_t C = 2 * (int64_t)g.Hk * g.dk + (int64_t)g.Hv * g.dv;
    int max_rows = 0;
    for (int q = 0; q < n_seqs; q++)
        max_rows = info[q * DFLASH_REC_INFO_LEN + 1] > max_rows ? info[q * DFLASH_REC_INFO_LEN + 1] : max_rows;
    int32_t *dinfo = gpu_copy(info, (size_t)n_seqs * DFLASH_REC_INFO_LEN * sizeof(int32_t));
    dflash_rec_args hc = { n_seqs, max_rows, info, r->cst, r->conv_sz }, hd = { n_seqs, max_rows, info, r->dst, r->delta_sz };
    dflash_rec_args gc = { n_seqs, max_rows, dinfo, r->dcst, r->conv_sz },
                    gd = { n_seqs, max_rows, dinfo, r->ddst, r->delta_sz };
    dflash_delta_args ha = { in->n, g.Hk, g.Hv, g.dk, g.dv, y, in->a, in->b, &alog->h, &dtb->h, o };
    dflash_delta_args ga = { in->n, g.Hk, g.Hv, g.dk, g.dv, dy, in->da, in->db, &alog->d, &dtb->d, dO };
    if (y) {
        MUST(g_cpu->ops->conv_silu(g_cpu, &hc, in->x, &cw->h, in->n, (int)C, g.K, y));
        MUST(g_cpu->ops->delta_rule(g_cpu, &hd, &ha));
    }
    MUST(g_gpu->ops->conv_silu(g_gpu, &gc, in->dx, &cw->d, in->n, (int)C, g.K, dy));
    MUST(g_gpu->ops->delta_rule(g_gpu, &gd, &ga));
}

/* Entries of a call: sequence q's rows[q] rows from position pos0[q] in record q. */
static int32_t *rec_entries(int n_seqs, const int *rows, const int *pos0)
{
    int32_t *info = xmalloc((size_t)n_seqs * DFLASH_REC_INFO_LEN * sizeof(int32_t));
    for (int q = 0, row0 = 0; q < n_seqs; q++) {
        int32_t *f = info + q * DFLASH_REC_INFO_LEN;
        f[0] = row0, f[1] = rows[q], f[2] = pos0[q], f[3] = q;
        row0 += rows[q];
    }
    return info;
}

/* conv_silu then delta_rule on n_seqs sequences against the CPU: first
 * hist[q] rows from position 0 (long ones cross chunk starts and reuse
 * the records' rows by position), then, after taking back back[q] rows,
 * rows2[q] new rows; outputs and the whole records within 1e-5 after each
 * call. Between them the GPU's own invariance, which speculative decoding
 * on the GPU rests on: sequence 0's rows fed one call per row into a spare
 * record give the bits of the batched call, outputs and record. */
static void case_recurrent(gdn_geom g, int n_seqs, const int *hist, const int *back, const int *rows2)
{
    char shape[112];
    int n1 = 0, n2 = 0, pos0[16], zero[16] = { 0 };
    for (int q = 0; q < n_seqs; q++) {
        n1 += hist[q], n2 += rows2[q];
        pos0[q] = hist[q] - back[q];
    }
    snprintf(shape, sizeof shape, "%d seqs, %d+%d rows, k %dx%d, v %dx%d, conv %d", n_seqs, n1, n2, g.Hk, g.dk, g.Hv,
             g.dv, g.K);
    const int64_t C = 2 * (int64_t)g.Hk * g.dk + (int64_t)g.Hv * g.dv, Vd = (int64_t)g.Hv * g.dv;
    rec_pair r = { dflash_conv_rec_size(C), dflash_delta_rec_size(g.Hv, g.dk, g.dv), NULL, NULL, NULL, NULL };
    const size_t nc = (size_t)((n_seqs + 1) * r.conv_sz), nd = (size_t)((n_seqs + 1) * r.delta_sz);
    r.cst = calloc(nc, sizeof(float)), r.dst = calloc(nd, sizeof(float));
    r.dcst = gpu_copy(r.cst, nc * sizeof(float)), r.ddst = gpu_copy(r.dst, nd * sizeof(float));
    wpair cw, alog, dtb;
    make_weight(&cw, DFLASH_DTYPE_BF16, C, g.K, 0.5f);
    make_weight(&alog, DFLASH_DTYPE_F32, 1, g.Hv, 1.0f);
    make_weight(&dtb, DFLASH_DTYPE_BF16, 1, g.Hv, 1.0f);
    const size_t n_max = (size_t)(n1 > n2 ? n1 : n2);
    float *y = xmalloc(n_max * C * sizeof(float)), *o = xmalloc(n_max * Vd * sizeof(float));
    float *dy = gpu_poison(n_max * C), *dO = gpu_poison(n_max * Vd);
    float *hr_c = xmalloc(nc * sizeof(float)), *hr_d = xmalloc(nd * sizeof(float));

    rec_inputs in1 = rec_inputs_make(n1, C, g.Hv);
    int32_t *info1 = rec_entries(n_seqs, hist, zero);
    rec_call(g, &r, info1, n_seqs, &in1, &cw, &alog, &dtb, y, o, dy, dO);
    check_f32("conv_silu", shape, dy, y, (size_t)n1 * C, 1e-5);
    check_f32("delta_rule", shape, dO, o, (size_t)n1 * Vd, 1e-5);
    check_f32("conv_silu record", shape, r.dcst, r.cst, nc, 1e-5);
    check_f32("delta_rule record", shape, r.ddst, r.dst, nd, 1e-5);

    /* sequence 0 one row per call into record n_seqs */
    const int R0 = hist[0];
    float *y1 = xmalloc((size_t)R0 * C * sizeof(float)), *o1 = xmalloc((size_t)R0 * Vd * sizeof(float));
    gpu_get(y1, dy, (size_t)R0 * C * sizeof(float));
    gpu_get(o1, dO, (size_t)R0 * Vd * sizeof(float));
    float *dy2 = gpu_poison((size_t)R0 * C), *do2 = gpu_poison((size_t)R0 * Vd);
    for (int t = 0; t < R0; t++) {
        const int32_t f[DFLASH_REC_INFO_LEN] = { t, 1, t, n_seqs };
        int32_t *df = gpu_copy(f, sizeof f);
        dflash_rec_args c1 = { 1, 1, df, r.dcst, r.conv_sz }, d1 = { 1, 1, df, r.ddst, r.delta_sz };
        dflash_delta_args a1 = { R0, g.Hk, g.Hv, g.dk, g.dv, dy2, in1.da, in1.db, &alog.d, &dtb.d, do2 };
        MUST(g_gpu->ops->conv_silu(g_gpu, &c1, in1.dx, &cw.d, R0, (int)C, g.K, dy2));
        MUST(g_gpu->ops->delta_rule(g_gpu, &d1, &a1));
    }
    float *y2 = xmalloc((size_t)R0 * C * sizeof(float)), *o2 = xmalloc((size_t)R0 * Vd * sizeof(float));
    gpu_get(y2, dy2, (size_t)R0 * C * sizeof(float));
    gpu_get(o2, do2, (size_t)R0 * Vd * sizeof(float));
    gpu_get(hr_c, r.dcst, nc * sizeof(float));
    gpu_get(hr_d, r.ddst, nd * sizeof(float));
    int same = memcmp(y1, y2, (size_t)R0 * C * sizeof(float)) == 0 && memcmp(o1, o2, (size_t)R0 * Vd * sizeof(float)) == 0;
    same &= memcmp(hr_c, hr_c + n_seqs * r.conv_sz, (size_t)r.conv_sz * sizeof(float)) == 0;
    same &= memcmp(hr_d, hr_d + n_seqs * r.delta_sz, (size_t)r.delta_sz * sizeof(float)) == 0;
    record("rec rows 1 by 1", shape, same ? 0.0 : 1.0, 0.0);

    /* rows taken back, new rows from there */
    rec_inputs in2 = rec_inputs_make(n2, C, g.Hv);
    int32_t *info2 = rec_entries(n_seqs, rows2, pos0);
    rec_call(g, &r, info2, n_seqs, &in2, &cw, &alog, &dtb, y, o, dy, dO);
    check_f32("conv_silu resumed", shape, dy, y, (size_t)n2 * C, 1e-5);
    check_f32("delta_rule resumed", shape, dO, o, (size_t)n2 * Vd, 1e-5);
    /* the spare record was written on the GPU only */
    check_f32("conv_silu record resumed", shape, r.dcst, r.cst, (size_t)(n_seqs * r.conv_sz), 1e-5);
    check_f32("delta_rule record resumed", shape, r.ddst, r.dst, (size_t)(n_seqs * r.delta_sz), 1e-5);

    rec_inputs *ins[2] = { &in1, &in2 };
    for (int i = 0; i < 2; i++)
        free(ins[i]->x), free(ins[i]->a), free(ins[i]->b);
    free(r.cst), free(r.dst), free(hr_c), free(hr_d), free(info1), free(info2), free(y), free(o);
    free(y1), free(o1), free(y2), free(o2);
    free_weight(&cw), free_weight(&alog), free_weight(&dtb);
    gpu_reset();
}

/* One GPU call of conv_silu then delta_rule (time_recurrent's argument). */
typedef struct rec_time_arg {
    gdn_geom g;
    dflash_rec_args c, d;
    const float *x;
    const dflash_weight *cw;
    dflash_delta_args a;
} rec_time_arg;

static dflash_status run_recurrent(void *p)
{
    rec_time_arg *t = p;
    const int64_t C = 2 * (int64_t)t->g.Hk * t->g.dk + (int64_t)t->g.Hv * t->g.dv;
    DFLASH_TRY(g_gpu->ops->conv_silu(g_gpu, &t->c, t->x, t->cw, t->a.n_rows, (int)C, t->g.K, (float *)t->a.y));
    return g_gpu->ops->delta_rule(g_gpu, &t->d, &t->a);
}

/* The time of one sequence's `rows` rows from position pos0 through a
 * linear-attention layer's recurrence; bytes: the chunk-start state read,
 * the rows' records written. */
static void time_recurrent(gdn_geom g, int pos0, int rows)
{
    char shape[112];
    snprintf(shape, sizeof shape, "%d rows at %d, k %dx%d, v %dx%d, conv %d", rows, pos0, g.Hk, g.dk, g.Hv, g.dv, g.K);
    const int64_t C = 2 * (int64_t)g.Hk * g.dk + (int64_t)g.Hv * g.dv, Vd = (int64_t)g.Hv * g.dv;
    const int64_t conv_sz = dflash_conv_rec_size(C), delta_sz = dflash_delta_rec_size(g.Hv, g.dk, g.dv);
    wpair cw, alog, dtb;
    make_weight(&cw, DFLASH_DTYPE_BF16, C, g.K, 0.5f);
    make_weight(&alog, DFLASH_DTYPE_F32, 1, g.Hv, 1.0f);
    make_weight(&dtb, DFLASH_DTYPE_BF16, 1, g.Hv, 1.0f);
    float *h = rand_f32((size_t)rows * C, 2.0f), *hab = rand_f32((size_t)rows * g.Hv, 2.0f);
    float *zc = calloc((size_t)conv_sz, sizeof(float)), *zd = calloc((size_t)delta_sz, sizeof(float));
    const int32_t f[DFLASH_REC_INFO_LEN] = { 0, rows, pos0, 0 };
    int32_t *df = gpu_copy(f, sizeof f);
    rec_time_arg t = { g, { 1, rows, df, gpu_copy(zc, (size_t)conv_sz * sizeof(float)), conv_sz },
                       { 1, rows, df, gpu_copy(zd, (size_t)delta_sz * sizeof(float)), delta_sz },
                       gpu_copy(h, (size_t)rows * C * sizeof(float)), &cw.d,
                       { rows, g.Hk, g.Hv, g.dk, g.dv, gpu_poison((size_t)rows * C),
                         gpu_copy(hab, (size_t)rows * g.Hv * sizeof(float)),
                         gpu_copy(hab, (size_t)rows * g.Hv * sizeof(float)), &alog.d, &dtb.d,
                         gpu_poison((size_t)rows * Vd) } };
    time_op("conv+delta_rule", shape, run_recurrent, &t,
            4.0 * ((double)g.Hv * g.dk * g.dv + (double)rows * (C + g.Hv * (g.dk + g.dv + 1))));
    free(h), free(hab), free(zc), free(zd);
    free_weight(&cw), free_weight(&alog), free_weight(&dtb);
    gpu_reset();
}

/* sigmoid_mul with a gate per element, one per row, and a gate per
 * element from rows of twice the columns (gates interleaved with queries) */
static void case_sigmoid_mul(int n, int64_t cols)
{
    char shape[112];
    for (int kind = 0; kind < 3; kind++) {
        const int64_t g_cols = kind == 1 ? 1 : kind == 2 ? 2 * cols : cols;
        static const char *const names[] = { "per elem", "per row", "per elem, stride 2 cols" };
        snprintf(shape, sizeof shape, "%d rows x %lld, gate %s", n, (long long)cols, names[kind]);
        float *x = rand_f32((size_t)n * cols, 2.0f), *gt = rand_f32((size_t)n * g_cols, 6.0f);
        float *dx = gpu_copy(x, (size_t)n * cols * sizeof(float)), *dg = gpu_copy(gt, (size_t)n * g_cols * sizeof(float));
        MUST(g_cpu->ops->sigmoid_mul(g_cpu, x, gt, n, cols, g_cols));
        MUST(g_gpu->ops->sigmoid_mul(g_gpu, dx, dg, n, cols, g_cols));
        check_f32("sigmoid_mul", shape, dx, x, (size_t)n * cols, 1e-6);
        free(x), free(gt);
        gpu_reset();
    }
}

/* ---- copy_rows, argmax -------------------------------------------------- */

typedef struct copy_arg {
    float *dst;
    int64_t ds;
    const float *src;
    int64_t ss;
    const int32_t *idx;
    int n;
    int64_t cols;
} copy_arg;
static dflash_status run_copy(void *p)
{
    copy_arg *a = p;
    return g_gpu->ops->copy_rows(g_gpu, a->dst, a->ds, a->src, a->ss, a->idx, a->n, a->cols);
}

static void case_copy_rows(int n, int64_t cols, int64_t src_stride, int64_t dst_stride, int with_idx, int timed)
{
    char shape[112];
    snprintf(shape, sizeof shape, "%d rows x %lld cols, strides %lld/%lld%s", n, (long long)cols,
             (long long)src_stride, (long long)dst_stride, with_idx ? ", indexed" : "");
    int src_rows = n + 7;
    size_t src_n = (size_t)(src_rows * src_stride), dst_n = (size_t)(n * dst_stride);
    float *src = rand_f32(src_n, 1.0f), *dst = xmalloc(dst_n * sizeof(float));
    for (size_t i = 0; i < dst_n; i++)
        dst[i] = NAN; /* poisoned on both sides: the gaps between rows must stay NaN */
    int32_t *idx = xmalloc((size_t)n * sizeof(int32_t));
    for (int i = 0; i < n; i++)
        idx[i] = irand(src_rows);
    float *dsrc = gpu_copy(src, src_n * sizeof(float)), *ddst = gpu_poison(dst_n);
    int32_t *didx = gpu_copy(idx, (size_t)n * sizeof(int32_t));
    MUST(g_cpu->ops->copy_rows(g_cpu, dst, dst_stride, src, src_stride, with_idx ? idx : NULL, n, cols));
    MUST(g_gpu->ops->copy_rows(g_gpu, ddst, dst_stride, dsrc, src_stride, with_idx ? didx : NULL, n, cols));
    check_f32("copy_rows", shape, ddst, dst, dst_n, 0.0);
    if (timed) {
        copy_arg a = { ddst, dst_stride, dsrc, src_stride, with_idx ? didx : NULL, n, cols };
        time_op("copy_rows", shape, run_copy, &a, 8.0 * n * cols);
    }
    free(src);
    free(dst);
    free(idx);
    gpu_reset();
}

/* copy_ids (drafts into a verify's rows): the same ints as the CPU, the
 * gaps between the destination's runs untouched (ids below 0 too: a bad
 * draft goes through as it is). */
static void case_copy_ids(int n, int cols, int64_t src_stride, int64_t dst_stride)
{
    char shape[112];
    snprintf(shape, sizeof shape, "%d runs x %d ids, strides %lld/%lld", n, cols, (long long)src_stride,
             (long long)dst_stride);
    const size_t src_n = (size_t)n * (size_t)src_stride, dst_n = (size_t)n * (size_t)dst_stride;
    int32_t *src = xmalloc(src_n * sizeof(int32_t)), *dst = xmalloc(dst_n * sizeof(int32_t));
    for (size_t i = 0; i < src_n; i++)
        src[i] = irand(1 << 20) - 1000;
    for (size_t i = 0; i < dst_n; i++)
        dst[i] = -7;
    int32_t *dsrc = gpu_copy(src, src_n * sizeof(int32_t)), *ddst = gpu_copy(dst, dst_n * sizeof(int32_t));
    MUST(g_cpu->ops->copy_ids(g_cpu, dst, dst_stride, src, src_stride, n, cols));
    MUST(g_gpu->ops->copy_ids(g_gpu, ddst, dst_stride, dsrc, src_stride, n, cols));
    check_exact("copy_ids", shape, ddst, dst, dst_n * sizeof(int32_t));
    free(src);
    free(dst);
    gpu_reset();
}

/* gather_sum (a MoE layer's weighted sum of its experts' rows): the same
 * bits as the CPU, whose contract fixes the order and the roundings. */
static void case_gather_sum(int n, int k, int64_t cols, int src_rows)
{
    char shape[112];
    snprintf(shape, sizeof shape, "%d rows x %d terms x %lld cols from %d", n, k, (long long)cols, src_rows);
    const size_t src_n = (size_t)src_rows * (size_t)cols, out_n = (size_t)n * (size_t)cols, nk = (size_t)n * k;
    float *src = rand_f32(src_n, 1.0f), *w = rand_f32(nk, 1.0f), *out = xmalloc(out_n * sizeof(float));
    int32_t *idx = xmalloc(nk * sizeof(int32_t));
    for (size_t i = 0; i < nk; i++)
        idx[i] = irand(src_rows);
    float *dsrc = gpu_copy(src, src_n * sizeof(float)), *dw = gpu_copy(w, nk * sizeof(float)),
          *dout = gpu_poison(out_n);
    int32_t *didx = gpu_copy(idx, nk * sizeof(int32_t));
    MUST(g_cpu->ops->gather_sum(g_cpu, out, src, idx, w, n, k, cols));
    MUST(g_gpu->ops->gather_sum(g_gpu, dout, dsrc, didx, dw, n, k, cols));
    check_f32("gather_sum", shape, dout, out, out_n, 0.0);
    free(src);
    free(w);
    free(out);
    free(idx);
    gpu_reset();
}

/* A MoE layer on the device: moe_route (experts, src, slot and first
 * exact, weights within rounding of the CPU's softmax sum), linear_experts
 * (SwiGLU over gate/up, then down) against the CPU, and each row's expert
 * outputs equal bit for bit to that row routed and run alone (the grouped
 * GEMM's tiles must not change a row's bits). Timed: the route, both
 * projections in one launch each, and the same through one launch per
 * expert with a wait for first[] (the composition). */
typedef struct moe_arg {
    dflash_route_args r;
    dflash_experts_args gu, dn;
    int each;
} moe_arg;
static dflash_status run_route(void *p) { return dflash_be_moe_route(g_gpu, &((moe_arg *)p)->r); }
static dflash_status run_experts(void *p)
{
    moe_arg *a = p;
    if (a->each) {
        DFLASH_TRY(dflash_be_linear_experts_each(g_gpu, &a->gu, NULL));
        return dflash_be_linear_experts_each(g_gpu, &a->dn, NULL);
    }
    DFLASH_TRY(dflash_be_linear_experts(g_gpu, &a->gu));
    return dflash_be_linear_experts(g_gpu, &a->dn);
}

/* skewed: every row prefers experts 0..k-1 (they get all n rows each, more
 * than a tile sized for the mean holds) */
static void case_moe_routing(dflash_dtype dt, int n, int E, int k, int64_t H, int64_t I, int timed, int skewed)
{
    char shape[112];
    snprintf(shape, sizeof shape, "%s %d rows, %d experts top %d, %lld x %lld%s", dflash_dtype_name(dt), n, E, k,
             (long long)H, (long long)I, skewed ? ", skewed" : "");
    const size_t nk = (size_t)n * k;
    float *logits = rand_f32((size_t)n * E, 3.0f), *x = rand_f32(nk * H, 1.0f);
    for (int r = 0; skewed && r < n; r++)
        for (int e = 0; e < k; e++)
            logits[(size_t)r * E + e] += 20.0f;
    wpair *w = xmalloc((size_t)E * 3 * sizeof *w);
    dflash_weight *wh = xmalloc((size_t)E * 3 * sizeof *wh), *wd = xmalloc((size_t)E * 3 * sizeof *wd);
    const void **ptr = xmalloc((size_t)E * 3 * sizeof *ptr);
    const float **sc = xmalloc((size_t)E * 3 * sizeof *sc);
    for (int e = 0; e < E; e++)
        for (int p = 0; p < 3; p++) {
            make_weight(&w[e * 3 + p], dt, p == 2 ? H : I, p == 2 ? I : H, 2.0f / sqrtf((float)(p == 2 ? I : H)));
            wh[e * 3 + p] = w[e * 3 + p].h;
            wd[e * 3 + p] = w[e * 3 + p].d;
            ptr[(size_t)p * E + e] = wd[e * 3 + p].data;
            sc[(size_t)p * E + e] = wd[e * 3 + p].scales;
        }
    const void *const *dptr = gpu_copy(ptr, (size_t)E * 3 * sizeof *ptr);
    const float *const *dsc = dt == DFLASH_DTYPE_F8_E4M3 ? gpu_copy(sc, (size_t)E * 3 * sizeof *sc) : NULL;

    /* routing */
    int32_t *ints = xmalloc((4 * nk + E + 1) * sizeof *ints);
    float *prob = xmalloc(nk * sizeof *prob);
    dflash_route_args rc = { .n = n, .n_experts = E, .k = k, .norm_topk_prob = 1, .logits = logits,
                             .expert = ints, .src = ints + nk, .slot = ints + 2 * nk, .first = ints + 3 * nk,
                             .prob = prob };
    MUST(dflash_be_moe_route(g_cpu, &rc));
    moe_arg a = { .r = rc };
    a.r.logits = gpu_copy(logits, (size_t)n * E * sizeof(float));
    a.r.expert = gpu_alloc(nk * 4);
    a.r.src = gpu_alloc(nk * 4);
    a.r.slot = gpu_alloc(nk * 4);
    a.r.first = gpu_alloc(((size_t)E + 1) * 4);
    a.r.prob = gpu_poison(nk);
    MUST(dflash_be_moe_route(g_gpu, &a.r));
    check_exact("moe_route experts", shape, a.r.expert, rc.expert, nk * 4);
    check_exact("moe_route first", shape, a.r.first, rc.first, ((size_t)E + 1) * 4);
    check_exact("moe_route src", shape, a.r.src, rc.src, nk * 4);
    check_exact("moe_route slot", shape, a.r.slot, rc.slot, nk * 4);
    check_f32("moe_route prob", shape, a.r.prob, rc.prob, nk, 1e-6);

    /* the experts, over the CPU's grouping (the same as the GPU's, checked above) */
    float *g = xmalloc(nk * I * sizeof(float)), *u = xmalloc(nk * I * sizeof(float)), *y = xmalloc(nk * H * sizeof(float));
    dflash_experts_args ec = { .n_experts = E, .n_w = 2, .w = wh, .w_stride = 3, .per_row = k, .x = x, .rows = (int)nk,
                               .max_rows = n, .first = rc.first, .out = { g, u }, .act = DFLASH_ACT_SWIGLU };
    MUST(dflash_be_linear_experts(g_cpu, &ec));
    dflash_experts_args dc = ec;
    dc.n_w = 1, dc.w = wh + 2, dc.x = g, dc.out[0] = y, dc.out[1] = NULL, dc.act = DFLASH_ACT_NONE;
    MUST(dflash_be_linear_experts(g_cpu, &dc));
    a.gu = ec;
    a.gu.w = wd, a.gu.data = dptr, a.gu.scales = dsc, a.gu.first = a.r.first;
    a.gu.x = gpu_copy(x, nk * H * sizeof(float));
    a.gu.out[0] = gpu_poison(nk * I);
    a.gu.out[1] = gpu_poison(nk * I);
    a.dn = a.gu;
    a.dn.n_w = 1, a.dn.w = wd + 2, a.dn.data = dptr + 2 * E, a.dn.scales = dsc ? dsc + 2 * E : NULL;
    a.dn.x = a.gu.out[0], a.dn.out[0] = gpu_poison(nk * H), a.dn.out[1] = NULL, a.dn.act = DFLASH_ACT_NONE;
    MUST(run_experts(&a));
    check_f32("linear_experts swiglu", shape, a.gu.out[0], g, nk * I, 1e-4);
    check_f32("linear_experts down", shape, a.dn.out[0], y, nk * H, 1e-4);

    /* gate/up reading its rows through the route's src (x_rows) from a
     * source of n rows: the same bits as over the rows gathered first */
    {
        float *xsrc = rand_f32((size_t)n * H, 1.0f), *xgat = xmalloc(nk * H * sizeof(float));
        float *o1 = xmalloc(nk * I * sizeof(float));
        for (size_t r = 0; r < nk; r++)
            memcpy(xgat + r * H, xsrc + (size_t)rc.src[r] * H, H * sizeof(float));
        dflash_experts_args pre = a.gu, via = a.gu;
        pre.x = gpu_copy(xgat, nk * H * sizeof(float));
        pre.out[0] = gpu_poison(nk * I), pre.out[1] = gpu_poison(nk * I);
        MUST(dflash_be_linear_experts(g_gpu, &pre));
        via.x = gpu_alloc(nk * H * sizeof(float)); /* scratch, for a composition */
        via.x_src = gpu_copy(xsrc, (size_t)n * H * sizeof(float));
        via.x_rows = a.r.src;
        via.out[0] = gpu_poison(nk * I), via.out[1] = gpu_poison(nk * I);
        MUST(dflash_be_linear_experts(g_gpu, &via));
        gpu_get(o1, pre.out[0], nk * I * sizeof(float));
        check_exact("linear_experts x_rows == gathered", shape, via.out[0], o1, nk * I * sizeof(float));
        free(xsrc);
        free(xgat);
        free(o1);
    }

    /* blocks chaining up to 8 work items (DFLASH_CUDA_EXPERTS_CHAIN, as
     * many as a tile's items allow; a chain of a row block's every slice
     * adds them in the block) and blocks of one item each (every split
     * through the workspace): the same bits as the default blocks */
    {
        float *g0 = xmalloc(nk * I * sizeof(float)), *y0 = xmalloc(nk * H * sizeof(float));
        gpu_get(g0, a.gu.out[0], nk * I * sizeof(float));
        gpu_get(y0, a.dn.out[0], nk * H * sizeof(float));
        dflash_experts_args gu = a.gu, dn = a.dn;
        /* chains, then every tile size (DFLASH_CUDA_EXPERTS_TILE) */
        static const struct {
            const char *lever, *value, *what;
        } runs[] = {
            { "DFLASH_CUDA_EXPERTS_CHAIN", "8", "chain" }, { "DFLASH_CUDA_EXPERTS_CHAIN", "1", "chain" },
            { "DFLASH_CUDA_EXPERTS_TILE", "8", "tile" },   { "DFLASH_CUDA_EXPERTS_TILE", "16", "tile" },
            { "DFLASH_CUDA_EXPERTS_TILE", "32", "tile" },  { "DFLASH_CUDA_EXPERTS_TILE", "64", "tile" },
        };
        for (size_t i = 0; i < sizeof runs / sizeof runs[0]; i++) {
            gu.out[0] = gpu_poison(nk * I), gu.out[1] = gpu_poison(nk * I);
            dn.x = gu.out[0], dn.out[0] = gpu_poison(nk * H);
            lever_env(runs[i].lever, runs[i].value);
            MUST(dflash_be_linear_experts(g_gpu, &gu));
            MUST(dflash_be_linear_experts(g_gpu, &dn));
            lever_env(runs[i].lever, NULL);
            char op[48];
            snprintf(op, sizeof op, "linear_experts %s %s swiglu", runs[i].what, runs[i].value);
            check_exact(op, shape, gu.out[0], g0, nk * I * sizeof(float));
            snprintf(op, sizeof op, "linear_experts %s %s down", runs[i].what, runs[i].value);
            check_exact(op, shape, dn.out[0], y0, nk * H * sizeof(float));
        }
        free(g0);
        free(y0);
    }

    /* a row alone: routed alone (its gathered rows are its k experts in
     * order), through both projections; the same bits as in the batch */
    float *yb = xmalloc(nk * H * sizeof(float)), *y1 = xmalloc((size_t)k * H * sizeof(float));
    gpu_get(yb, a.dn.out[0], nk * H * sizeof(float));
    size_t bad = 0;
    for (int r = 0; r < n && r < 8; r++) {
        moe_arg one = a;
        one.r.n = 1;
        one.r.logits = (const float *)a.r.logits + (size_t)r * E;
        one.r.expert = gpu_alloc((size_t)k * 4), one.r.src = gpu_alloc((size_t)k * 4);
        one.r.slot = gpu_alloc((size_t)k * 4), one.r.first = gpu_alloc(((size_t)E + 1) * 4);
        one.r.prob = gpu_alloc((size_t)k * 4);
        MUST(dflash_be_moe_route(g_gpu, &one.r));
        float *xr = xmalloc((size_t)k * H * sizeof(float));
        for (int j = 0; j < k; j++)
            memcpy(xr + (size_t)j * H, x + (size_t)rc.slot[r * k + j] * H, (size_t)H * sizeof(float));
        one.gu.x = gpu_copy(xr, (size_t)k * H * sizeof(float));
        one.gu.rows = k, one.gu.max_rows = 1, one.gu.first = one.r.first;
        one.gu.out[0] = gpu_poison((size_t)k * I), one.gu.out[1] = gpu_poison((size_t)k * I);
        one.dn.rows = k, one.dn.max_rows = 1, one.dn.first = one.r.first;
        one.dn.x = one.gu.out[0], one.dn.out[0] = gpu_poison((size_t)k * H);
        MUST(run_experts(&one));
        gpu_get(y1, one.dn.out[0], (size_t)k * H * sizeof(float));
        for (int j = 0; j < k; j++)
            bad += memcmp(y1 + (size_t)j * H, yb + (size_t)rc.slot[r * k + j] * H, (size_t)H * sizeof(float)) != 0;
        free(xr);
    }
    record("linear_experts alone", shape, bad ? INFINITY : 0.0, 0.0);

    if (timed) {
        int32_t *first = rc.first;
        double wbytes = 0;
        for (int e = 0; e < E; e++)
            if (first[e + 1] > first[e])
                for (int p = 0; p < 3; p++)
                    wbytes += (double)wh[e * 3 + p].rows * wh[e * 3 + p].cols * dflash_dtype_size(dt);
        time_op("moe_route", shape, run_route, &a, 4.0 * n * E);
        time_op("linear_experts", shape, run_experts, &a, wbytes);
        a.each = 1;
        time_op("experts, each", shape, run_experts, &a, wbytes);
    }
    for (int i = 0; i < E * 3; i++)
        free_weight(&w[i]);
    free(w), free(wh), free(wd), free(ptr), free(sc), free(ints), free(prob), free(g), free(u), free(y), free(yb);
    free(y1), free(logits), free(x);
    gpu_reset();
}

/* The routing with a shared expert (shared_logit): one more entry a row
 * and one more expert to group by, on the GPU as on the CPU. */
static void case_moe_route_shared(int n, int E, int k)
{
    char shape[112];
    snprintf(shape, sizeof shape, "%d rows, %d experts top %d and a shared one", n, E, k);
    const size_t nk = (size_t)n * (k + 1);
    float *logits = rand_f32((size_t)n * E, 3.0f), *sl = rand_f32((size_t)n, 4.0f);
    int32_t *ints = xmalloc((4 * nk + E + 2) * sizeof *ints);
    float *prob = xmalloc(nk * sizeof *prob);
    dflash_route_args rc = { .n = n, .n_experts = E, .k = k, .norm_topk_prob = 1, .logits = logits,
                             .shared_logit = sl, .expert = ints, .src = ints + nk, .slot = ints + 2 * nk,
                             .first = ints + 3 * nk, .prob = prob };
    MUST(dflash_be_moe_route(g_cpu, &rc));
    dflash_route_args r = rc;
    r.logits = gpu_copy(logits, (size_t)n * E * sizeof(float));
    r.shared_logit = gpu_copy(sl, (size_t)n * sizeof(float));
    r.expert = gpu_alloc(nk * 4), r.src = gpu_alloc(nk * 4), r.slot = gpu_alloc(nk * 4);
    r.first = gpu_alloc(((size_t)E + 2) * 4);
    r.prob = gpu_poison(nk);
    MUST(dflash_be_moe_route(g_gpu, &r));
    check_exact("moe_route experts", shape, r.expert, rc.expert, nk * 4);
    check_exact("moe_route first", shape, r.first, rc.first, ((size_t)E + 2) * 4);
    check_exact("moe_route src", shape, r.src, rc.src, nk * 4);
    check_exact("moe_route slot", shape, r.slot, rc.slot, nk * 4);
    check_f32("moe_route prob", shape, r.prob, rc.prob, nk, 1e-6);
    free(logits), free(sl), free(ints), free(prob);
    gpu_reset();
}

/* The router's projection with the routing (linear_moe_route): the
 * fused stage (the routing adds the GEMM's partials where it can) equal
 * byte for byte to its composition (linear or linear_group, then
 * moe_route), logits, gate and every routing array; the logits within
 * rounding of the CPU's. shared: 0 none, 1 a shared expert joined to the
 * routing, 2 its gate computed but the expert added apart. */
typedef struct lmr_arg {
    const float *x;
    int n, n_w, composed;
    const dflash_weight *w;
    float *out[2];
    dflash_route_args r;
} lmr_arg;
static dflash_status run_lmr(void *p)
{
    lmr_arg *a = p;
    return a->composed ? dflash_be_linear_moe_route_composed(g_gpu, a->x, a->n, a->w, a->n_w, a->out, &a->r)
                       : dflash_be_linear_moe_route(g_gpu, a->x, a->n, a->w, a->n_w, a->out, &a->r);
}

static void case_linear_moe_route(dflash_dtype dt, int n, int E, int k, int64_t H, int shared, int timed)
{
    char shape[112];
    snprintf(shape, sizeof shape, "%s %d rows, router %d x %lld top %d%s", dflash_dtype_name(dt), n, E, (long long)H,
             k, shared == 1 ? ", shared expert" : shared == 2 ? ", shared gate apart" : "");
    const int n_w = shared ? 2 : 1, kr = k + (shared == 1), ne = E + (shared == 1);
    const size_t nk = (size_t)n * kr, ints_n = 3 * nk + ne + 1;
    wpair w[2];
    make_weight(&w[0], dt, E, H, 2.0f / sqrtf((float)H));
    if (shared)
        make_weight(&w[1], dt, 1, H, 2.0f / sqrtf((float)H));
    const dflash_weight wh[2] = { w[0].h, shared ? w[1].h : w[0].h }, wd[2] = { w[0].d, shared ? w[1].d : w[0].d };
    float *x = rand_f32((size_t)n * H, 1.0f), *logits = xmalloc((size_t)n * E * sizeof(float));
    float *sl = xmalloc((size_t)n * sizeof(float)), *prob = xmalloc(nk * sizeof(float));
    int32_t *ints = xmalloc(ints_n * sizeof(int32_t));
    float *const hout[2] = { logits, shared ? sl : NULL };
    dflash_route_args rc = { .n = n, .n_experts = E, .k = k, .norm_topk_prob = 1, .logits = logits,
                             .shared_logit = shared == 1 ? sl : NULL, .expert = ints, .src = ints + nk,
                             .slot = ints + 2 * nk, .first = ints + 3 * nk, .prob = prob };
    MUST(dflash_be_linear_moe_route(g_cpu, x, n, wh, n_w, hout, &rc));
    lmr_arg a[2]; /* the stage, the composition */
    for (int v = 0; v < 2; v++) {
        a[v] = (lmr_arg){ .x = v ? a[0].x : gpu_copy(x, (size_t)n * H * sizeof(float)), .n = n, .n_w = n_w,
                          .composed = v, .w = wd, .out = { gpu_poison((size_t)n * E), shared ? gpu_poison(n) : NULL },
                          .r = rc };
        a[v].r.logits = a[v].out[0];
        a[v].r.shared_logit = shared == 1 ? a[v].out[1] : NULL;
        a[v].r.expert = gpu_alloc(nk * 4), a[v].r.src = gpu_alloc(nk * 4), a[v].r.slot = gpu_alloc(nk * 4);
        a[v].r.first = gpu_alloc(((size_t)ne + 1) * 4);
        a[v].r.prob = gpu_poison(nk);
        MUST(run_lmr(&a[v]));
    }
    check_f32("linear_moe_route logits", shape, a[0].out[0], logits, (size_t)n * E, 1e-4);
    const struct { const char *what; const void *d0, *d1; size_t bytes; } same[] = {
        { "logits", a[0].out[0], a[1].out[0], (size_t)n * E * 4 }, { "gate", a[0].out[1], a[1].out[1], (size_t)n * 4 },
        { "experts", a[0].r.expert, a[1].r.expert, nk * 4 },      { "prob", a[0].r.prob, a[1].r.prob, nk * 4 },
        { "first", a[0].r.first, a[1].r.first, ((size_t)ne + 1) * 4 }, { "src", a[0].r.src, a[1].r.src, nk * 4 },
        { "slot", a[0].r.slot, a[1].r.slot, nk * 4 },
    };
    unsigned char *comp = xmalloc((size_t)n * E * 4);
    for (size_t i = 0; i < sizeof same / sizeof same[0]; i++) {
        if (!same[i].d0)
            continue;
        char op[96];
        snprintf(op, sizeof op, "linear_moe_route %s == composition", same[i].what);
        gpu_get(comp, same[i].d1, same[i].bytes);
        check_exact(op, shape, same[i].d0, comp, same[i].bytes);
    }
    if (timed) {
        const double bytes = (double)(E + (shared != 0)) * (double)H * (double)dflash_dtype_size(dt);
        time_op("linear_moe_route", shape, run_lmr, &a[0], bytes);
        time_op("linear, moe_route", shape, run_lmr, &a[1], bytes);
    }
    free(comp), free(x), free(logits), free(sl), free(prob), free(ints);
    free_weight(&w[0]);
    if (shared)
        free_weight(&w[1]);
    gpu_reset();
}

static void case_moe(dflash_dtype dt, int n, int E, int k, int64_t H, int64_t I, int timed)
{
    case_moe_routing(dt, n, E, k, H, I, timed, 0);
}

/* The driver's device-to-device copy: the ceiling for memory-bound ops. */
typedef struct dcopy_arg {
    void *dst;
    const void *src;
    size_t bytes;
} dcopy_arg;
static dflash_status run_dcopy(void *p)
{
    dcopy_arg *a = p;
    return dflash_cuda_copy(g_gpu, a->dst, a->src, a->bytes);
}

static void time_driver_copy(size_t bytes)
{
    dcopy_arg a = { gpu_alloc(bytes), gpu_alloc(bytes), bytes };
    MUST(g_gpu->ops->copy_rows(g_gpu, a.dst, 0, a.src, 0, NULL, 1, 0)); /* nothing; keeps the stream warm */
    char shape[112];
    snprintf(shape, sizeof shape, "%zu MiB, driver cuMemcpyDtoD", bytes >> 20);
    time_op("copy", shape, run_dcopy, &a, 2.0 * bytes);
    gpu_reset();
}

typedef struct am_arg {
    const float *x;
    int n, cols;
    int32_t *out;
} am_arg;
static dflash_status run_argmax(void *p)
{
    am_arg *a = p;
    return g_gpu->ops->argmax(g_gpu, a->x, a->n, a->cols, a->out);
}

/* special: 0 random; 1 ties and NaN/inf planted in every row. */
static void case_argmax(int n, int cols, int special, int timed)
{
    char shape[112];
    snprintf(shape, sizeof shape, "%d rows x %d%s", n, cols, special ? ", ties/NaN/-inf planted" : "");
    float *x = rand_f32((size_t)n * cols, 10.0f);
    if (special) {
        for (int i = 0; i < n; i++) {
            float *r = x + (size_t)i * cols;
            switch (i % 5) {
            case 0: /* the maximum twice: lowest index wins */
                r[cols / 2] = 100.0f;
                r[cols - 1] = 100.0f;
                break;
            case 1: /* a NaN (here in column 0): -1, nothing to decode */
                r[0] = NAN;
                r[cols / 2] = 100.0f;
                break;
            case 2: /* nothing above -inf: -1 */
                for (int j = 0; j < cols; j++)
                    r[j] = -INFINITY;
                break;
            case 3: /* NaN everywhere but one: -1 */
                for (int j = 0; j < cols; j++)
                    r[j] = NAN;
                r[cols - 2 > 0 ? cols - 2 : 0] = -5.0f;
                break;
            default: /* +0 and -0 tie */
                for (int j = 0; j < cols; j++)
                    r[j] = -1.0f;
                r[cols - 1] = 0.0f;
                r[cols / 2] = -0.0f;
            }
        }
    }
    int32_t *ref = xmalloc((size_t)n * sizeof(int32_t)), *got = xmalloc((size_t)n * sizeof(int32_t));
    float *dx = gpu_copy(x, (size_t)n * cols * sizeof(float));
    int32_t *dout = gpu_alloc((size_t)n * sizeof(int32_t));
    int32_t *poison = xmalloc((size_t)n * sizeof(int32_t));
    for (int i = 0; i < n; i++)
        poison[i] = -12345;
    MUST(g_gpu->ops->upload(g_gpu, dout, poison, (size_t)n * sizeof(int32_t)));
    MUST(g_cpu->ops->argmax(g_cpu, x, n, cols, ref));
    MUST(g_gpu->ops->argmax(g_gpu, dx, n, cols, dout));
    gpu_get(got, dout, (size_t)n * sizeof(int32_t));
    int bad = 0;
    for (int i = 0; i < n; i++)
        if (got[i] != ref[i]) {
            if (bad < 3)
                printf("     argmax row %d: gpu %d, cpu %d\n", i, got[i], ref[i]);
            bad++;
        }
    record("argmax", shape, bad ? INFINITY : 0.0, 0.0);
    if (timed) {
        am_arg a = { dx, n, cols, dout };
        time_op("argmax", shape, run_argmax, &a, 4.0 * n * cols);
    }
    free(x);
    free(ref);
    free(got);
    free(poison);
    gpu_reset();
}

/* ---- sample_rows ------------------------------------------------------- */

/* A logits row of kind `kind` (see case_sample). */
static void sample_fill(float *r, int V, int kind)
{
    switch (kind) {
    case 0: /* peaked: a few tokens far above a noisy floor */
        for (int j = 0; j < V; j++)
            r[j] = 2.0f * frand();
        for (int i = 0; i < 5; i++)
            r[irand(V)] = 10.0f + 1.0f * (float)i;
        break;
    case 1: /* flat: every token nearly as likely */
        for (int j = 0; j < V; j++)
            r[j] = 0.5f * frand();
        break;
    case 2: /* a dozen tokens of weight, the rest far below */
    case 3: /* the same with ties: the top twice, then groups of equal logits */
        for (int j = 0; j < V; j++)
            r[j] = -30.0f + frand();
        for (int i = 0; i < 12; i++)
            r[irand(V)] = kind == 2 ? 2.0f + 2.0f * frand() : i < 2 ? 3.0f : i < 8 ? 2.0f : 1.0f;
        break;
    case 4: /* a third of the tokens at -inf */
        for (int j = 0; j < V; j++)
            r[j] = irand(3) == 0 ? -INFINITY : 3.0f * frand();
        break;
    default: /* no usable number: a NaN, or nothing above -inf */
        for (int j = 0; j < V; j++)
            r[j] = kind == 5 ? frand() : -INFINITY;
        if (kind == 5)
            r[irand(V)] = NAN;
    }
}

typedef struct sample_arg {
    const float *logits;
    int n, V;
    const dflash_sample_row *rows;
    int32_t *ids;
} sample_arg;

static dflash_status run_sample(void *p)
{
    sample_arg *a = p;
    return g_gpu->ops->sample_rows(g_gpu, a->logits, a->n, a->V, a->rows, a->ids);
}

/* R host rows [R, V], each uploaded D times in a row: device [R * D, V]. */
static float *sample_rows_up(const float *x, int R, int D, int V)
{
    float *dx = gpu_alloc((size_t)R * D * V * sizeof(float));
    for (int r = 0; r < R; r++)
        for (int d = 0; d < D; d++)
            MUST(g_gpu->ops->upload(g_gpu, dx + ((size_t)r * D + d) * V, x + (size_t)r * V, (size_t)V * sizeof(float)));
    return dx;
}

/* sample_rows against the host sampler: rows of every kind above (peaked,
 * flat, a dozen tokens, ties, -inf, no usable number), each drawn at D
 * positions under each setting (temperature, top-k, top-p, min-p), every
 * token equal to what the host sampler draws from the same row with the
 * same position's uniform. Timed: 16 rows of the given settings. */
static void case_sample(int V, int D, int timed)
{
    static const struct { double T; int k; double p, minp; } set[] = {
        { 0, 0, 1, 0 },       { 1.0, 0, 1, 0 },    { 0.6, 20, 0.95, 0 }, { 0.8, 0, 0.9, 0 },
        { 1.0, 50, 1, 0 },    { 1.2, 0, 0.5, 0.05 }, { 0.7, 1000, 0.8, 0 }, { 1.0, 0, 1, 0.1 },
        { 1.5, 3, 0.7, 0.2 }, { 1e-30, 0, 1, 0 },  { 0.9, 5, 0.6, 0 },   { 2.0, 0, 0.99, 0 },
    };
    enum { KINDS = 7 };
    const int R = 2 * KINDS, n = R * D;
    float *x = xmalloc((size_t)R * V * sizeof(float));
    for (int r = 0; r < R; r++)
        sample_fill(x + (size_t)r * V, V, r % KINDS);
    float *dx = sample_rows_up(x, R, D, V); /* each row D times on the device */
    int32_t *dids = gpu_alloc((size_t)n * sizeof(int32_t));
    dflash_sample_row *rows = xmalloc((size_t)n * sizeof *rows);
    int32_t *got = xmalloc((size_t)n * sizeof(int32_t));
    dflash_sampler smp;
    dflash_sampler_opts so;
    dflash_sampler_default_opts(&so);
    MUST(dflash_sampler_init(&smp, V, &so));
    for (size_t si = 0; si < sizeof set / sizeof set[0]; si++) {
        char shape[112];
        snprintf(shape, sizeof shape, "%d rows x %d, T %g top-k %d top-p %g min-p %g", n, V, set[si].T, set[si].k,
                 set[si].p, set[si].minp);
        for (int i = 0; i < n; i++)
            rows[i] = (dflash_sample_row){ .temperature = set[si].T, .top_k = set[si].k, .top_p = set[si].p,
                                           .min_p = set[si].minp, .seed = 1000 + si, .pos = 37 * i + 5 };
        int32_t *poison = got;
        for (int i = 0; i < n; i++)
            poison[i] = -12345;
        MUST(g_gpu->ops->upload(g_gpu, dids, poison, (size_t)n * sizeof(int32_t)));
        MUST(g_gpu->ops->sample_rows(g_gpu, dx, n, V, rows, dids));
        gpu_get(got, dids, (size_t)n * sizeof(int32_t));
        int bad = 0;
        for (int r = 0; r < R; r++) {
            const float *xr = x + (size_t)r * V;
            smp.o.temperature = set[si].T;
            smp.o.top_k = set[si].k;
            smp.o.top_p = set[si].p;
            smp.o.min_p = set[si].minp;
            smp.o.seed = rows[0].seed;
            const int usable = dflash_sampler_probs(&smp, xr, smp.probs) == DFLASH_OK;
            for (int d = 0; d < D; d++) {
                const int i = r * D + d;
                const int32_t want = usable ? dflash_sampler_sample_at(&smp, smp.probs, rows[i].pos) : -1;
                if (got[i] != want) {
                    if (bad < 4)
                        printf("     sample_rows %s: row %d (kind %d) pos %lld: gpu %d, cpu %d (p %.3g vs %.3g)\n",
                               shape, r, r % KINDS, (long long)rows[i].pos, got[i], want,
                               got[i] >= 0 && got[i] < V && usable ? smp.probs[got[i]] : -1.0,
                               want >= 0 && usable ? smp.probs[want] : -1.0);
                    bad++;
                }
            }
        }
        record("sample_rows", shape, bad ? INFINITY : 0.0, 0.0);
    }
    dflash_sampler_free(&smp);
    if (timed) {
        static const struct { double T; int k; double p; const char *what; } tset[] = {
            { 0.6, 20, 0.95, "T 0.6 top-k 20 top-p 0.95" },
            { 1.0, 0, 0.9, "T 1 top-p 0.9" },
            { 1.0, 0, 1.0, "T 1" },
        };
        for (size_t ti = 0; ti < sizeof tset / sizeof tset[0]; ti++)
            for (int kind = 0; kind < 2; kind++) { /* peaked, flat: the first D rows of each are one row */
                for (int i = 0; i < 16; i++)
                    rows[i] = (dflash_sample_row){ .temperature = tset[ti].T, .top_k = tset[ti].k,
                                                   .top_p = tset[ti].p, .seed = 7, .pos = i };
                char shape[112];
                snprintf(shape, sizeof shape, "16 rows x %d, %s, %s", V, kind ? "flat" : "peaked", tset[ti].what);
                sample_arg a = { dx + (size_t)kind * D * V, D < 16 ? D : 16, V, rows, dids };
                time_op("sample_rows", shape, run_sample, &a, 4.0 * a.n * V);
            }
    }
    free(x);
    free(rows);
    free(got);
    gpu_reset();
}

/* count_tokens' rule on a host mirror: generated, one more (-1 as 0);
 * else -1 becomes 0. */
static void count_host(int32_t *c, int V, const int32_t *ids, int n, int generated)
{
    for (int i = 0; i < n; i++)
        if (ids[i] >= 0 && ids[i] < V)
            c[ids[i]] = (c[ids[i]] > 0 ? c[ids[i]] : 0) + (generated != 0);
}

/* sample_rows under penalties against the host sampler: two sequences'
 * counts built on the device by count_tokens (a prompt, then generated
 * tokens with repeats, some out of range), equal to the host's mirror;
 * rows of the usable kinds drawn D times each, draw d adding the row's
 * d % 16 likeliest tokens as generated before it (a block's drafts),
 * under repetition, frequency and presence penalties with and without a
 * temperature: every token equal to the host sampler's on the same row
 * with the same counts (seen = count >= 0). */
static void case_sample_penalties(int V, int D)
{
    static const struct { double T; int k; double p, rep, freq, pres; } set[] = {
        { 0, 0, 1, 1.3, 0, 0 },       { 1.0, 0, 1, 1.0, 0.5, 0.3 },   { 0.8, 50, 0.9, 1.2, 0.4, 0.2 },
        { 0.7, 0, 1, 1.0, -0.5, 0 },  { 1.0, 20, 0.95, 1.1, 1.5, 1.0 }, { 0, 0, 1, 1.0, 2.0, 0 },
    };
    enum { KINDS = 5, TOPS = 16 };
    const int R = 2 * KINDS, n = R * D;
    float *x = xmalloc((size_t)R * V * sizeof(float));
    int32_t *top = xmalloc((size_t)R * TOPS * sizeof(int32_t)); /* each row's likeliest tokens */
    for (int r = 0; r < R; r++) {
        float *xr = x + (size_t)r * V;
        sample_fill(xr, V, r % KINDS);
        for (int t = 0; t < TOPS; t++) { /* the t-th largest, by repeated scans */
            int best = -1;
            for (int j = 0; j < V; j++) {
                int taken = 0;
                for (int u = 0; u < t; u++)
                    taken |= top[r * TOPS + u] == j;
                if (!taken && (best < 0 || xr[j] > xr[best]))
                    best = j;
            }
            top[r * TOPS + t] = best;
        }
    }
    /* two sequences' counts: a prompt, then generated tokens (each row's
     * first few top tokens among them, repeated), on the device and here */
    int32_t *hc[2], *dc[2];
    int cbad = 0;
    for (int q = 0; q < 2; q++) {
        hc[q] = xmalloc((size_t)V * sizeof(int32_t));
        dc[q] = gpu_alloc((size_t)V * sizeof(int32_t));
        for (int j = 0; j < V; j++)
            hc[q][j] = -1;
        MUST(g_gpu->ops->count_tokens(g_gpu, dc[q], V, NULL, V, 0));
        int32_t ids[300];
        for (int i = 0; i < 200; i++)
            ids[i] = i % 50 == 7 ? V + i : irand(V); /* some out of range: skipped */
        count_host(hc[q], V, ids, 200, 0);
        MUST(g_gpu->ops->count_tokens(g_gpu, dc[q], V, ids, 200, 0));
        int m = 0;
        for (int r = q; r < R; r += 2)
            for (int t = 0; t < 3; t++)
                for (int rep = 0; rep <= t; rep++)
                    ids[m++] = top[r * TOPS + t];
        for (int i = 0; i < 40; i++)
            ids[m++] = irand(V);
        count_host(hc[q], V, ids, m, 1);
        MUST(g_gpu->ops->count_tokens(g_gpu, dc[q], V, ids, m, 1));
        int32_t *got = xmalloc((size_t)V * sizeof(int32_t));
        gpu_get(got, dc[q], (size_t)V * sizeof(int32_t));
        cbad += memcmp(got, hc[q], (size_t)V * sizeof(int32_t)) != 0;
        free(got);
    }
    char cshape[64];
    snprintf(cshape, sizeof cshape, "2 sequences x %d, 200 prompt + ~90 generated ids", V);
    record("count_tokens", cshape, cbad ? INFINITY : 0.0, 0.0);

    float *dx = sample_rows_up(x, R, D, V);
    int32_t *dids = gpu_alloc((size_t)n * sizeof(int32_t));
    dflash_sample_row *rows = xmalloc((size_t)n * sizeof *rows);
    int32_t *got = xmalloc((size_t)n * sizeof(int32_t)), *cnt = xmalloc((size_t)V * sizeof(int32_t));
    dflash_sampler smp;
    dflash_sampler_opts so;
    dflash_sampler_default_opts(&so);
    MUST(dflash_sampler_init(&smp, V, &so));
    /* draw d of row r: the row's top tokens before it (repeats among
     * them), in device memory as a verify's drafts are */
    int32_t *hgen = xmalloc((size_t)n * TOPS * sizeof(int32_t));
    for (int i = 0; i < n; i++)
        for (int g = 0; g < TOPS; g++)
            hgen[(size_t)i * TOPS + g] = top[(i / D) * TOPS + (g * 5) % TOPS];
    const int32_t *dgen = gpu_copy(hgen, (size_t)n * TOPS * sizeof(int32_t));
    for (size_t si = 0; si < sizeof set / sizeof set[0]; si++) {
        char shape[128];
        snprintf(shape, sizeof shape, "%d rows x %d, T %g top-k %d top-p %g, penalties %g / %g / %g", n, V, set[si].T,
                 set[si].k, set[si].p, set[si].rep, set[si].freq, set[si].pres);
        for (int r = 0; r < R; r++)
            for (int d = 0; d < D; d++) {
                dflash_sample_row *w = &rows[r * D + d];
                *w = (dflash_sample_row){ .temperature = set[si].T, .top_k = set[si].k, .top_p = set[si].p,
                                          .seed = 2000 + si, .pos = 41 * (r * D + d) + 3,
                                          .rep_penalty = set[si].rep, .frequency_penalty = set[si].freq,
                                          .presence_penalty = set[si].pres, .counts = dc[r % 2],
                                          .n_gen = d % TOPS, .gen = dgen + (size_t)(r * D + d) * TOPS };
            }
        MUST(g_gpu->ops->sample_rows(g_gpu, dx, n, V, rows, dids));
        gpu_get(got, dids, (size_t)n * sizeof(int32_t));
        int bad = 0;
        smp.o.temperature = set[si].T;
        smp.o.top_k = set[si].k;
        smp.o.top_p = set[si].p;
        smp.o.seed = rows[0].seed;
        smp.o.rep_penalty = set[si].rep;
        smp.o.frequency_penalty = set[si].freq;
        smp.o.presence_penalty = set[si].pres;
        for (int i = 0; i < n; i++) {
            const int r = i / D;
            memcpy(cnt, hc[r % 2], (size_t)V * sizeof(int32_t));
            count_host(cnt, V, hgen + (size_t)i * TOPS, rows[i].n_gen, 1);
            for (int j = 0; j < V; j++) {
                smp.seen[j] = cnt[j] >= 0;
                smp.count[j] = cnt[j] > 0 ? cnt[j] : 0;
            }
            const int usable = dflash_sampler_probs(&smp, x + (size_t)r * V, smp.probs) == DFLASH_OK;
            const int32_t want = usable ? dflash_sampler_sample_at(&smp, smp.probs, rows[i].pos) : -1;
            if (got[i] != want) {
                if (bad < 4)
                    printf("     sample_rows %s: row %d (kind %d) draw %d: gpu %d, cpu %d\n", shape, r, r % KINDS,
                           i % D, got[i], want);
                bad++;
            }
        }
        record("sample_rows", shape, bad ? INFINITY : 0.0, 0.0);
    }
    dflash_sampler_free(&smp);
    free(hgen);
    free(x);
    free(top);
    free(rows);
    free(got);
    free(cnt);
    free(hc[0]);
    free(hc[1]);
    gpu_reset();
}

/* ---- kv_write + attention ----------------------------------------------- */

typedef enum { MODE_CAUSAL, MODE_WINDOW, MODE_NONE } attn_mode;
static const char *const k_mode_names[] = { "causal", "window", "none" };

typedef struct attn_case {
    int n_seqs, rows_per_seq, ctx; /* ctx: paged positions per sequence end at ctx */
    int n_heads, n_kv_heads, hd;
    attn_mode mode;
    int window;   /* MODE_WINDOW */
    int ring;     /* pt_len shorter than the context: only the last (pt_len - 1) blocks are kept */
    int timed;
    dflash_dtype kv_dt; /* pool dtype (0: F32) */
} attn_case;

typedef struct attn_run_arg {
    dflash_attn_args a;
} attn_run_arg;
/* qkv_attention (a decode's q/k/v stage and its attention as one call):
 * where the CUDA backend runs the q/k norm + RoPE + K/V store inside
 * attention (one row a sequence, head_dim 128), the output, the pages, k
 * and v bit for bit the stage followed by attention on the GPU, one launch
 * fewer, and the CPU's within attention's tolerance. S sequences, each one
 * row at position ctx - 7 s over random bf16 pages (where the GEMM does
 * not split K the call composes, and the launch count says so). Timed:
 * the fused call and the two it stands for ("composed"). */
typedef struct qkva_run {
    dflash_qkv_args q;
    dflash_attn_args a;
    int composed;
} qkva_run;
static dflash_status run_qkva(void *p)
{
    qkva_run *r = p;
    if (!r->composed)
        return dflash_be_qkv_attention(g_gpu, &r->q, &r->a);
    DFLASH_TRY(dflash_be_qkv_norm_rope_store(g_gpu, &r->q));
    return g_gpu->ops->attention(g_gpu, &r->a);
}

static void *rand_pool(size_t n, dflash_dtype dt);

static int64_t gpu_launches(void)
{
    dflash_backend_counters c = { 0 };
    g_gpu->ops->counters(g_gpu, &c);
    return c.launches;
}

static void case_qkv_attention(dflash_dtype wdt, int S, int hq, int hkv, int64_t K, int ctx, int timed)
{
    enum { D = 128, NL = 2, layer = 1 };
    char shape[128];
    snprintf(shape, sizeof shape, "%s W, %d:%d x %d, K %lld, %d seqs x 1 row at %d..", dflash_dtype_name(wdt), hq,
             hkv, D, (long long)K, S, ctx);
    const dflash_rope rope = make_rope(D, 1e6, DFLASH_ROPE_DEFAULT, 1);
    const int pt_len = (ctx + 1 + 15) / 16, n_pages = S * pt_len + 2, row = hkv * D;
    const size_t nx = (size_t)S * K, nq = (size_t)S * hq * D, nk = (size_t)S * row;
    const size_t pool_n = (size_t)n_pages * NL * 2 * DFLASH_KV_PAGE * row, pool_bytes = pool_n * 2;
    wpair w[3], qn, kn;
    for (int i = 0; i < 3; i++)
        make_weight(&w[i], wdt, (int64_t)(i ? hkv : hq) * D, K, 2.0f / sqrtf((float)K));
    make_weight(&qn, DFLASH_DTYPE_BF16, 1, D, 2.0f);
    make_weight(&kn, DFLASH_DTYPE_BF16, 1, D, 2.0f);
    const dflash_weight hw[3] = { w[0].h, w[1].h, w[2].h }, dw[3] = { w[0].d, w[1].d, w[2].d };
    /* each sequence's pages a shuffled share of the pool */
    int32_t *perm = xmalloc((size_t)n_pages * sizeof(int32_t));
    for (int i = 0; i < n_pages; i++)
        perm[i] = i;
    for (int i = n_pages - 1; i > 0; i--) {
        const int j = irand(i + 1);
        const int32_t t = perm[i];
        perm[i] = perm[j], perm[j] = t;
    }
    int32_t *pos = xmalloc((size_t)S * sizeof(int32_t)), *rs = xmalloc((size_t)S * sizeof(int32_t));
    int32_t *info = xmalloc((size_t)S * DFLASH_SEQ_INFO_LEN * sizeof(int32_t));
    int max_keys = 0;
    for (int s = 0; s < S; s++) {
        pos[s] = ctx - 7 * s > 0 ? ctx - 7 * s : 0;
        rs[s] = s;
        const int32_t si[DFLASH_SEQ_INFO_LEN] = { 0, pos[s] + 1, 0, 0, pos[s], s, 1 };
        memcpy(info + (size_t)s * DFLASH_SEQ_INFO_LEN, si, sizeof si);
        max_keys = pos[s] + 1 > max_keys ? pos[s] + 1 : max_keys;
    }
    float *x = rand_f32(nx, 1.0f), *q = xmalloc(nq * sizeof(float)), *k = xmalloc(nk * sizeof(float));
    float *v = xmalloc(nk * sizeof(float)), *out = xmalloc(nq * sizeof(float));
    void *pool = rand_pool(pool_n, DFLASH_DTYPE_BF16);
    dflash_kv_layout hl = { n_pages, NL, hkv, D, DFLASH_DTYPE_BF16, pool }, fl = hl, cl = hl;
    fl.data = gpu_copy(pool, pool_bytes);
    cl.data = gpu_copy(pool, pool_bytes);
    float *dx = gpu_copy(x, nx * sizeof(float));
    int32_t *dpos = gpu_copy(pos, (size_t)S * sizeof(int32_t)), *drs = gpu_copy(rs, (size_t)S * sizeof(int32_t));
    int32_t *dtab = gpu_copy(perm, (size_t)S * pt_len * sizeof(int32_t));
    int32_t *dinfo = gpu_copy(info, (size_t)S * DFLASH_SEQ_INFO_LEN * sizeof(int32_t));
    const dflash_kv_dest hdst = { &hl, layer, perm, pt_len, rs, v };
    const dflash_qkv_args hq_args = { x, S, hw, q, k, v, &qn.h, &kn.h, hq, hkv, D, pos, 1e-6f, &rope, &hdst };
    const dflash_attn_args ha = { .n_rows = S, .n_heads = hq, .n_kv_heads = hkv, .head_dim = D,
                                  .scale = 1.0f / sqrtf((float)D), .q = q, .out = out, .q_pos = pos, .row_seq = rs,
                                  .seq_info = info, .kv = &hl, .layer = layer, .page_tables = perm, .pt_len = pt_len,
                                  .causal = 1, .n_seqs = S, .max_seq_rows = 1, .max_keys = max_keys };
    MUST(dflash_be_qkv_attention(g_cpu, &hq_args, &ha));
    /* the GPU twice: fused (f*), and the stage then attention (c*) */
    qkva_run fr, cr;
    float *fk = gpu_poison(nk), *fv = gpu_poison(nk), *fo = gpu_poison(nq), *fq = gpu_poison(nq);
    float *ck = gpu_poison(nk), *cv = gpu_poison(nk), *co = gpu_poison(nq), *cq = gpu_poison(nq);
    const dflash_kv_dest fdst = { &fl, layer, dtab, pt_len, drs, fv }, cdst = { &cl, layer, dtab, pt_len, drs, cv };
    fr.q = (dflash_qkv_args){ dx, S, dw, fq, fk, fv, &qn.d, &kn.d, hq, hkv, D, dpos, 1e-6f, &rope, &fdst };
    fr.a = ha;
    fr.a.q = fq, fr.a.out = fo, fr.a.q_pos = dpos, fr.a.row_seq = drs, fr.a.seq_info = dinfo, fr.a.kv = &fl;
    fr.a.page_tables = dtab;
    fr.composed = 0;
    cr = fr;
    cr.q.q = cq, cr.q.k = ck, cr.q.v = cv, cr.q.dst = &cdst;
    cr.a.q = cq, cr.a.out = co, cr.a.kv = &cl;
    cr.composed = 1;
    const int64_t l0 = gpu_launches();
    MUST(run_qkva(&fr));
    const int64_t l1 = gpu_launches();
    MUST(run_qkva(&cr));
    const int64_t l2 = gpu_launches();
    char s2[200];
    snprintf(s2, sizeof s2, "%s: %lld launches, composed %lld", shape, (long long)(l1 - l0), (long long)(l2 - l1));
    record("qkv_attention launches", s2, l1 - l0 == l2 - l1 - 1 ? 0.0 : INFINITY, 0.0);
    /* again with blocks of one warp walking three key splits each
     * (DFLASH_CUDA_ATTN_MIN_WARPS=1, DFLASH_CUDA_ATTN_GROUP=3): the
     * warp does the q/k work, the copies and the math; the row's K/V
     * stored by the block whose splits hold its key; into a fresh copy of
     * the pool */
    qkva_run gr = fr;
    dflash_kv_layout gl = hl;
    gl.data = gpu_copy(pool, pool_bytes);
    float *gk = gpu_poison(nk), *gv = gpu_poison(nk), *go = gpu_poison(nq), *gq = gpu_poison(nq);
    const dflash_kv_dest gdst = { &gl, layer, dtab, pt_len, drs, gv };
    gr.q.q = gq, gr.q.k = gk, gr.q.v = gv, gr.q.dst = &gdst;
    gr.a.q = gq, gr.a.out = go, gr.a.kv = &gl;
    lever_env("DFLASH_CUDA_ATTN_GROUP", "3");
    lever_env("DFLASH_CUDA_ATTN_MIN_WARPS", "1");
    MUST(run_qkva(&gr));
    lever_env("DFLASH_CUDA_ATTN_GROUP", NULL);
    lever_env("DFLASH_CUDA_ATTN_MIN_WARPS", NULL);
    const struct {
        const char *what;
        const void *got, *comp;
        size_t bytes;
    } same[8] = { { "out", fo, co, nq * 4 },           { "k", fk, ck, nk * 4 },
                  { "v", fv, cv, nk * 4 },             { "pool", fl.data, cl.data, pool_bytes },
                  { "out, group 3", go, co, nq * 4 },  { "k, group 3", gk, ck, nk * 4 },
                  { "v, group 3", gv, cv, nk * 4 },    { "pool, group 3", gl.data, cl.data, pool_bytes } };
    for (int i = 0; i < 8; i++) {
        char what[64];
        snprintf(what, sizeof what, "qkv_attention %s", same[i].what);
        snprintf(s2, sizeof s2, "%s == stage, attention", shape);
        unsigned char *h = xmalloc(same[i].bytes);
        gpu_get(h, same[i].comp, same[i].bytes);
        check_exact(what, s2, same[i].got, h, same[i].bytes);
        free(h);
    }
    check_f32("qkv_attention out", shape, fo, out, nq, 4e-3);
    check_f32("qkv_attention k", shape, fk, k, nk, 1e-4);
    if (timed) {
        const double bytes = (double)(hq + 2 * hkv) * D * (double)K * (double)dflash_dtype_size(wdt);
        time_op("qkv_attention", shape, run_qkva, &fr, bytes);
        time_op("qkv_attn composed", shape, run_qkva, &cr, bytes);
    }
    free(perm), free(pos), free(rs), free(info), free(x), free(q), free(k), free(v), free(out), free(pool);
    for (int i = 0; i < 3; i++)
        free_weight(&w[i]);
    free_weight(&qn);
    free_weight(&kn);
    gpu_reset();
}

static dflash_status run_attn(void *p) { return g_gpu->ops->attention(g_gpu, &((attn_run_arg *)p)->a); }

typedef struct kvw_arg {
    const dflash_kv_layout *kv;
    const int32_t *bt;
    int pt_len;
    const int32_t *rs, *pos;
    const float *k, *v;
    int n;
} kvw_arg;
static dflash_status run_kvw(void *p)
{
    kvw_arg *a = p;
    return g_gpu->ops->kv_write(g_gpu, a->kv, 1, a->bt, a->pt_len, a->rs, a->pos, a->k, a->v, a->n);
}

/* Random pool content of dtype dt (bf16: random bf16 values). */
static void *rand_pool(size_t n, dflash_dtype dt)
{
    if (dt == DFLASH_DTYPE_F32)
        return rand_f32(n, 1.0f);
    uint16_t *p = xmalloc(n * sizeof(uint16_t));
    for (size_t i = 0; i < n; i++)
        p[i] = dflash_f32_to_bf16(frand());
    return p;
}

static void case_attention(const attn_case *c)
{
    const int S = c->n_seqs, R = c->rows_per_seq, L = c->ctx, D = c->hd, KVH = c->n_kv_heads, H = c->n_heads;
    const int row = KVH * D;
    const dflash_dtype kdt = c->kv_dt ? c->kv_dt : DFLASH_DTYPE_F32;
    const size_t es = dflash_dtype_size(kdt);
    const int need_pages = (L + 15) / 16 + 1;
    const int pt_len = c->ring ? (c->ring < need_pages ? c->ring : need_pages) : need_pages;
    const int lo = c->ring ? (L - (pt_len - 1) * 16 > 0 ? L - (pt_len - 1) * 16 : 0) : 0;
    const int n_layers = 2;
    char shape[112];
    snprintf(shape, sizeof shape, "%s %dx%d rows, ctx %d [%d..), %d:%d x %d, %s%s", kdt == DFLASH_DTYPE_BF16 ? "bf16" : "f32",
             S, R, L, lo, H, KVH, D, k_mode_names[c->mode], c->ring ? " ring" : "");
    if (c->mode == MODE_WINDOW) {
        size_t l = strlen(shape);
        snprintf(shape + l, sizeof shape - l, " (w=%d)", c->window);
    }
    /* Pool: every sequence's blocks, shuffled, plus spare blocks. */
    const int n_pages = S * pt_len + 3;
    int32_t *perm = xmalloc((size_t)n_pages * sizeof(int32_t));
    for (int i = 0; i < n_pages; i++)
        perm[i] = i;
    for (int i = n_pages - 1; i > 0; i--) {
        int j = irand(i + 1);
        int32_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    int32_t *bt = xmalloc((size_t)S * pt_len * sizeof(int32_t));
    for (int i = 0; i < S * pt_len; i++)
        bt[i] = perm[i];
    const size_t pool_n = (size_t)n_pages * n_layers * 2 * 16 * row;
    void *pool = rand_pool(pool_n, kdt); /* same garbage on both sides */
    /* Paged K/V for positions [lo, L) of every sequence, written by kv_write. */
    const int per_seq = L - lo, nw = S * per_seq, nwa = nw > 0 ? nw : 1; /* nwa: never a 0-byte buffer */
    float *k = rand_f32((size_t)nwa * row, 1.0f), *v = rand_f32((size_t)nwa * row, 1.0f);
    int32_t *rs = xmalloc((size_t)nwa * sizeof(int32_t)), *pos = xmalloc((size_t)nwa * sizeof(int32_t));
    for (int s = 0; s < S; s++)
        for (int t = 0; t < per_seq; t++) {
            rs[s * per_seq + t] = s;
            pos[s * per_seq + t] = lo + t;
        }
    dflash_kv_layout hkv = { n_pages, n_layers, KVH, D, kdt, pool };
    dflash_kv_layout dkv = hkv;
    dkv.data = gpu_copy(pool, pool_n * es);
    int32_t *dbt = gpu_copy(bt, (size_t)S * pt_len * sizeof(int32_t));
    int32_t *drs = gpu_copy(rs, (size_t)nwa * sizeof(int32_t));
    int32_t *dpos = gpu_copy(pos, (size_t)nwa * sizeof(int32_t));
    float *dk = gpu_copy(k, (size_t)nwa * row * sizeof(float));
    float *dv = gpu_copy(v, (size_t)nwa * row * sizeof(float));
    MUST(g_cpu->ops->kv_write(g_cpu, &hkv, 1, bt, pt_len, rs, pos, k, v, nw));
    MUST(g_gpu->ops->kv_write(g_gpu, &dkv, 1, dbt, pt_len, drs, dpos, dk, dv, nw));
    char kshape[112];
    snprintf(kshape, sizeof kshape, "%d rows x %d, %d blocks%s", nw, row, n_pages, c->ring ? ", ring" : "");
    check_exact("kv_write", kshape, dkv.data, pool, pool_n * es);
    if (c->timed && nw >= 16) {
        /* The last 16 rows rewritten with their own values: the pool the
         * attention check reads stays as it was. */
        int n16 = 16;
        kvw_arg a = { &dkv,          dbt, pt_len, drs + nw - n16, dpos + nw - n16, dk + (size_t)(nw - n16) * row,
                      dv + (size_t)(nw - n16) * row, n16 };
        snprintf(kshape, sizeof kshape, "%s 16 rows x %d", dflash_dtype_name(kdt), row);
        time_op("kv_write", kshape, run_kvw, &a, 16.0 * row * (8 + 2 * es));
    }
    /* Queries. causal: the last R paged positions (the target's verify);
     * window/none: R extra rows at positions L.. (the drafter's block). */
    const int NR = S * R;
    const int use_extra = c->mode != MODE_CAUSAL;
    float *q = rand_f32((size_t)NR * H * D, 1.0f);
    float *ke = rand_f32((size_t)NR * row, 1.0f), *ve = rand_f32((size_t)NR * row, 1.0f);
    int32_t *qpos = xmalloc((size_t)NR * sizeof(int32_t)), *qseq = xmalloc((size_t)NR * sizeof(int32_t));
    int32_t *info = xmalloc((size_t)S * DFLASH_SEQ_INFO_LEN * sizeof(int32_t));
    for (int s = 0; s < S; s++) {
        int32_t *si = info + s * DFLASH_SEQ_INFO_LEN;
        si[0] = lo;
        si[1] = L;
        si[2] = use_extra ? s * R : 0;
        si[3] = use_extra ? R : 0;
        si[4] = L;
        si[5] = s * R;
        si[6] = R;
        for (int r = 0; r < R; r++) {
            qseq[s * R + r] = s;
            qpos[s * R + r] = use_extra ? L + r : (L - R + r >= lo ? L - R + r : lo);
        }
    }
    float *ref = xmalloc((size_t)NR * H * D * sizeof(float));
    dflash_attn_args ha = { NR, H, KVH, D, 1.0f / sqrtf((float)D), q, ref, qpos, qseq, info, &hkv, 1, bt, pt_len,
                            use_extra ? ke : NULL, use_extra ? ve : NULL, c->mode != MODE_NONE,
                            c->mode == MODE_WINDOW ? c->window : 0, S, R, L - lo + (use_extra ? R : 0) };
    MUST(g_cpu->ops->attention(g_cpu, &ha));
    dflash_attn_args da = ha;
    da.q = gpu_copy(q, (size_t)NR * H * D * sizeof(float));
    da.out = gpu_poison((size_t)NR * H * D);
    da.q_pos = gpu_copy(qpos, (size_t)NR * sizeof(int32_t));
    da.row_seq = gpu_copy(qseq, (size_t)NR * sizeof(int32_t));
    da.seq_info = gpu_copy(info, (size_t)S * DFLASH_SEQ_INFO_LEN * sizeof(int32_t));
    da.kv = &dkv;
    da.page_tables = dbt;
    da.k_extra = use_extra ? gpu_copy(ke, (size_t)NR * row * sizeof(float)) : NULL;
    da.v_extra = use_extra ? gpu_copy(ve, (size_t)NR * row * sizeof(float)) : NULL;
    MUST(g_gpu->ops->attention(g_gpu, &da));
    /* bf16 pages at head_dim 16..128 take the tensor-core kernel, whose
     * softmax weights enter P V as bf16 (attention_tc.cu): ~1e-3 */
    const int tc = kdt == DFLASH_DTYPE_BF16 && (D == 16 || D == 32 || D == 64 || D == 128 || D == 256);
    check_f32("attention", shape, da.out, ref, (size_t)NR * H * D, tc ? 4e-3 : 1e-4);
    if (c->timed) {
        attn_run_arg a = { da };
        /* Bytes that must move: each sequence's visible K/V once (GQA heads
         * share it), plus q and out. */
        int visible = L - lo + (use_extra ? R : 0);
        if (c->mode == MODE_WINDOW && c->window < visible)
            visible = c->window;
        double bytes = (double)S * visible * row * es * 2 + 2.0 * NR * H * D * 4;
        time_op("attention", shape, run_attn, &a, bytes);
    }
    free(perm);
    free(bt);
    free(pool);
    free(k);
    free(v);
    free(rs);
    free(pos);
    free(q);
    free(ke);
    free(ve);
    free(qpos);
    free(qseq);
    free(info);
    free(ref);
    gpu_reset();
}

/* Row r of one sequence's attention call `a` (rows at positions L, L + 1,
 * ...) as a call of its own: one row, the keys up to its position. */
static dflash_attn_args attn_row_alone(const dflash_attn_args *a, int r, int L, float *out)
{
    const int32_t info[DFLASH_SEQ_INFO_LEN] = { 0, L + r + 1, 0, 0, 0, 0, 1 };
    dflash_attn_args b = *a;
    b.n_rows = 1;
    b.q = a->q + (size_t)r * a->n_heads * a->head_dim;
    b.out = out;
    b.q_pos = a->q_pos + r;
    b.seq_info = gpu_copy(info, sizeof info);
    b.max_seq_rows = 1;
    b.max_keys = L + r + 1;
    return b;
}

/* Speculative == plain on the GPU needs a verify row's attention to equal
 * the same row decoded alone: one sequence with L + 16 positions in bf16
 * pages; 16 causal rows at L..L+15 in one call, then each row alone with
 * the keys up to its own position only; bit-identical outputs. */
static void case_attention_invariance(int L, int H, int KVH, int D)
{
    enum { R = 16 };
    const int row = KVH * D, n_pos = L + R, pt_len = (n_pos + 15) / 16, n_pages = pt_len + 2;
    char shape[112];
    snprintf(shape, sizeof shape, "bf16 ctx %d + %d rows, %d:%d x %d: verify vs decode", L, R, H, KVH, D);
    const size_t pool_n = (size_t)n_pages * 2 * 16 * row;
    void *pool = rand_pool(pool_n, DFLASH_DTYPE_BF16);
    int32_t *bt = xmalloc((size_t)pt_len * sizeof(int32_t));
    for (int i = 0; i < pt_len; i++)
        bt[i] = n_pages - 1 - i;
    float *k = rand_f32((size_t)n_pos * row, 1.0f), *v = rand_f32((size_t)n_pos * row, 1.0f);
    float *q = rand_f32((size_t)R * H * D, 1.0f);
    int32_t *pos = xmalloc((size_t)n_pos * sizeof(int32_t)), *rs = xmalloc((size_t)n_pos * sizeof(int32_t));
    for (int i = 0; i < n_pos; i++) {
        pos[i] = i;
        rs[i] = 0;
    }
    dflash_kv_layout kv = { n_pages, 1, KVH, D, DFLASH_DTYPE_BF16, gpu_copy(pool, pool_n * 2) };
    int32_t *dbt = gpu_copy(bt, (size_t)pt_len * sizeof(int32_t)), *dpos = gpu_copy(pos, (size_t)n_pos * 4);
    int32_t *drs = gpu_copy(rs, (size_t)n_pos * 4);
    MUST(g_gpu->ops->kv_write(g_gpu, &kv, 0, dbt, pt_len, drs, dpos,
                              gpu_copy(k, (size_t)n_pos * row * sizeof(float)),
                              gpu_copy(v, (size_t)n_pos * row * sizeof(float)), n_pos));
    float *dq = gpu_copy(q, (size_t)R * H * D * sizeof(float));
    float *dall = gpu_poison((size_t)R * H * D), *done = gpu_poison((size_t)H * D);
    int32_t info[DFLASH_SEQ_INFO_LEN] = { 0, n_pos, 0, 0, 0, 0, R };
    dflash_attn_args a = { R, H, KVH, D, 1.0f / sqrtf((float)D), dq, dall, dpos + L, drs,
                           gpu_copy(info, sizeof info), &kv, 0, dbt, pt_len, NULL, NULL, 1, 0, 1, R, n_pos };
    MUST(g_gpu->ops->attention(g_gpu, &a));
    float *all = xmalloc((size_t)R * H * D * sizeof(float)), *one = xmalloc((size_t)H * D * sizeof(float));
    gpu_get(all, dall, (size_t)R * H * D * sizeof(float));
    int bad = 0;
    for (int r = 0; r < R; r++) {
        dflash_attn_args b = attn_row_alone(&a, r, L, done);
        MUST(g_gpu->ops->attention(g_gpu, &b));
        gpu_get(one, done, (size_t)H * D * sizeof(float));
        bad += memcmp(one, all + (size_t)r * H * D, (size_t)H * D * sizeof(float)) != 0;
    }
    record("attention rows", shape, bad ? INFINITY : 0.0, 0.0);
    /* blocks walking 1, 2, 3, 16 or 24 key splits each
     * (DFLASH_CUDA_ATTN_GROUP; unset, the launcher's own choice above;
     * 16 and 24: walks as long as a block's page-table room allows, at
     * 7681 keys two walks of 31 units): the same bits */
    static const char *const groups[] = { "1", "2", "3", "16", "24" };
    for (int i = 0; i < 5; i++) {
        lever_env("DFLASH_CUDA_ATTN_GROUP", groups[i]);
        dflash_attn_args g = a;
        g.out = gpu_poison((size_t)R * H * D);
        MUST(g_gpu->ops->attention(g_gpu, &g));
        lever_env("DFLASH_CUDA_ATTN_GROUP", NULL);
        char op[48];
        snprintf(op, sizeof op, "attention group %s", groups[i]);
        check_exact(op, shape, g.out, all, (size_t)R * H * D * sizeof(float));
    }
    /* the last row alone (one query tile, the decode's shape) in blocks of
     * 1, 2, 4 or 8 warps (DFLASH_CUDA_ATTN_MIN_WARPS; unset above, the
     * launcher's choice, two warps for long walks): the same bits */
    static const char *const warps[] = { "1", "2", "4", "8" };
    for (int i = 0; i < 4; i++) {
        dflash_attn_args b = attn_row_alone(&a, R - 1, L, gpu_poison((size_t)H * D));
        lever_env("DFLASH_CUDA_ATTN_MIN_WARPS", warps[i]);
        MUST(g_gpu->ops->attention(g_gpu, &b));
        lever_env("DFLASH_CUDA_ATTN_MIN_WARPS", NULL);
        char op[48];
        snprintf(op, sizeof op, "attention %s warps", warps[i]);
        check_exact(op, shape, b.out, all + (size_t)(R - 1) * H * D, (size_t)H * D * sizeof(float));
    }
    free(pool), free(bt), free(k), free(v), free(q), free(pos), free(rs), free(all), free(one);
    gpu_reset();
}

/* ---- error paths and weight_from_host ------------------------------------ */

static void case_errors(void)
{
    /* A bad token id: the op is queued fine, the next sync reports it. */
    wpair w;
    make_weight(&w, DFLASH_DTYPE_BF16, 10, 64, 1.0f);
    int32_t ids[2] = { 3, 10 };
    int32_t *dids = gpu_copy(ids, sizeof ids);
    float *dout = gpu_poison(2 * 64);
    dflash_status s = g_gpu->ops->embed(g_gpu, &w.d, dids, 2, dout);
    if (s == DFLASH_OK)
        s = g_gpu->ops->sync(g_gpu);
    int ok = s == DFLASH_ERR_INVALID_ARG && strstr(dflash_last_error(), "token id 10 outside") != NULL;
    printf("     embed error: %s: %s\n", dflash_status_name(s), dflash_last_error());
    ok = ok && g_gpu->ops->sync(g_gpu) == DFLASH_OK; /* reported once, then clear */
    /* A KV position whose page is outside the pool. */
    dflash_kv_layout kv = { 2, 1, 1, 4, DFLASH_DTYPE_F32, gpu_alloc(2 * 2 * 16 * 4 * sizeof(float)) };
    int32_t bt[2] = { 0, 7 }, rs[1] = { 0 }, pos[1] = { 16 };
    float kv4[4] = { 1, 2, 3, 4 };
    int32_t *dbt = gpu_copy(bt, sizeof bt), *drs = gpu_copy(rs, sizeof rs), *dpos = gpu_copy(pos, sizeof pos);
    float *dk = gpu_copy(kv4, sizeof kv4);
    s = g_gpu->ops->kv_write(g_gpu, &kv, 0, dbt, 2, drs, dpos, dk, dk, 1);
    if (s == DFLASH_OK)
        s = g_gpu->ops->sync(g_gpu);
    printf("     kv_write error: %s: %s\n", dflash_status_name(s), dflash_last_error());
    ok = ok && s == DFLASH_ERR_INVALID_ARG && strstr(dflash_last_error(), "maps to page 7 (pool has 2)") != NULL;
    ok = ok && g_gpu->ops->sync(g_gpu) == DFLASH_OK;
    record("errors", "bad token id, KV page outside the pool", ok ? 0.0 : INFINITY, 0.0);
    free_weight(&w);
    gpu_reset();

    /* A sequence with more keys than the call's bound (300 keys in three
     * splits, max_keys 200: room for two splits' partials, and a merge),
     * the general kernel (f32 pages) and the tensor-core one (bf16):
     * reported, nothing read or written past the partials (memcheck). */
    for (int bf = 0; bf < 2; bf++) {
        enum { T = 300, D = 64, PT = (T + 15) / 16 };
        const dflash_dtype dt = bf ? DFLASH_DTYPE_BF16 : DFLASH_DTYPE_F32;
        dflash_kv_layout pool = { PT, 1, 1, D, dt, gpu_alloc((size_t)PT * 2 * 16 * D * (bf ? 2 : 4)) };
        int32_t tab[PT], info[DFLASH_SEQ_INFO_LEN] = { 0, T, 0, 0, 0, 0, 1 }, qpos[1] = { T - 1 }, seq0[1] = { 0 };
        for (int i = 0; i < PT; i++)
            tab[i] = i;
        dflash_attn_args a = { 1, 1, 1, D, 0.125f, gpu_poison(D), gpu_poison(D), gpu_copy(qpos, sizeof qpos),
                               gpu_copy(seq0, sizeof seq0), gpu_copy(info, sizeof info), &pool, 0,
                               gpu_copy(tab, sizeof tab), PT, NULL, NULL, 1, 0, 1, 1, 200 };
        s = g_gpu->ops->attention(g_gpu, &a);
        if (s == DFLASH_OK)
            s = g_gpu->ops->sync(g_gpu);
        printf("     attention past its bound (%s pages): %s: %s\n", bf ? "bf16" : "f32", dflash_status_name(s),
               dflash_last_error());
        int keys_ok = s == DFLASH_ERR_INVALID_ARG && strstr(dflash_last_error(), "sequence 0 has 300 keys") != NULL;
        keys_ok = keys_ok && g_gpu->ops->sync(g_gpu) == DFLASH_OK;
        record("errors", bf ? "attention: keys past the bound, bf16 pages" : "attention: keys past the bound, f32 pages",
               keys_ok ? 0.0 : INFINITY, 0.0);
        gpu_reset();
    }

    /* weight_from_host: copies once, the backend frees it at destroy. */
    wpair f;
    make_weight(&f, DFLASH_DTYPE_F8_E4M3, 33, 48, 1.0f);
    dflash_weight dw = f.h;
    MUST(g_gpu->ops->weight_from_host(g_gpu, &dw, f.hdata, f.hscales));
    float x[2 * 48], ref[2 * 33];
    for (int i = 0; i < 2 * 48; i++)
        x[i] = frand();
    float *dx = gpu_copy(x, sizeof x), *dy = gpu_poison(2 * 33);
    MUST(g_cpu->ops->linear(g_cpu, x, 2, &f.h, ref));
    MUST(g_gpu->ops->linear(g_gpu, dx, 2, &dw, dy));
    check_f32("weight_from_host", "fp8 33 x 48 + scales, linear 2 rows", dy, ref, 2 * 33, 1e-5);
    free_weight(&f);
    gpu_reset();
}

/* ---- main ----------------------------------------------------------------- */

int main(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--small") == 0)
            g_small = 1;
        else if (strcmp(argv[i], "--no-perf") == 0)
            g_perf = 0;
        else if (strcmp(argv[i], "--only") == 0 && i + 1 < argc)
            g_only = argv[++i];
        else if (strcmp(argv[i], "--profile") == 0 && i + 1 < argc)
            g_profile = argv[++i];
        else {
            fprintf(stderr, "usage: %s [--small] [--no-perf] [--only SECTION,...] [--profile TEXT]\n  sections: %s\n",
                    argv[0],
                    k_sections);
            return 2;
        }
    }
    if (g_only && !sections_known(g_only)) {
        fprintf(stderr, "%s: --only %s: sections are %s\n", argv[0], g_only, k_sections);
        return 2;
    }
    if (g_small)
        g_perf = 0;
    MUST(dflash_backend_cpu_create(&g_cpu));
    MUST(dflash_backend_cuda_create(0, &g_gpu));
    printf("device: %s; mode: %s\n", dflash_cuda_device_desc(g_gpu), g_small ? "small" : "full");

    const int rows_all[] = { 1, 16, 64 }, rows_small[] = { 1, 5, 16 };
    const int *rows = g_small ? rows_small : rows_all;
    const int T = !g_small; /* time the real shapes */

    if (section("errors")) {
        case_errors();
    }

    if (section("embed")) {
        /* embed */
        if (g_small) {
            case_embed(DFLASH_DTYPE_BF16, 1000, 64, 5, 0);
            case_embed(DFLASH_DTYPE_F16, 100, 24, 3, 0);
            case_embed(DFLASH_DTYPE_F32, 100, 24, 3, 0);
            case_embed(DFLASH_DTYPE_F8_E4M3, 100, 24, 3, 0);
        } else {
            for (int r = 0; r < 3; r++) {
                case_embed(DFLASH_DTYPE_BF16, 151936, 2048, rows[r], T && rows[r] == 16);
                case_embed(DFLASH_DTYPE_BF16, 151936, 4096, rows[r], T && rows[r] == 16);
            }
            case_embed(DFLASH_DTYPE_F16, 1000, 4096, 16, 0);
            case_embed(DFLASH_DTYPE_F32, 1000, 2048, 16, 0);
            case_embed(DFLASH_DTYPE_F8_E4M3, 1000, 2048, 16, 0);
        }
    }

    if (section("add_rmsnorm")) {
        /* add_rmsnorm */
        for (int r = 0; r < 3; r++) {
            if (g_small) {
                case_rmsnorm(rows[r], 64, 1, 0);
                case_rmsnorm(rows[r], 100, 0, 0);
            } else {
                case_rmsnorm(rows[r], 2048, 1, T && rows[r] == 16);
                case_rmsnorm(rows[r], 4096, 1, T && rows[r] == 16);
                case_rmsnorm(rows[r], 4096, 0, 0);
                case_rmsnorm(rows[r], 128, 0, 0);
            }
        }
        if (!g_small) /* the widest row the kernel takes (a Llama 70B's) */
            case_rmsnorm(2, 8192, 1, 0);
        /* with a MoE layer's weighted sum as the delta: the 35B-A3B's top
         * 8 + shared at 1 and 16 rows, odd sizes, the most the fused
         * kernel takes, and beyond (composed) */
        case_gather_add_rmsnorm(3, 3, 100, 20, 0);
        case_gather_add_rmsnorm(2, 1, 64, 5, 0);
        if (!g_small) {
            case_gather_add_rmsnorm(1, 9, 2048, 257, T);
            case_gather_add_rmsnorm(16, 9, 2048, 144, T);
            case_gather_add_rmsnorm(5, 8, 4096, 40, 0);
            case_gather_add_rmsnorm(2, 10, 5000, 20, 0);
        }
        /* with an output projection as the delta: the seed drafter's o
         * and down, the 8B's, at 1, 16 and 64 rows (the GEMM's sum left to
         * the norm), 65 rows and rows of 5120 (composed), fp8 weights */
        case_linear_add_rmsnorm(DFLASH_DTYPE_BF16, 3, 256, 512, 0);
        case_linear_add_rmsnorm(DFLASH_DTYPE_F8_E4M3, 5, 128, 1024, 0);
        if (!g_small) {
            const int lr[] = { 1, 16, 64 };
            for (int r = 0; r < 3; r++) {
                case_linear_add_rmsnorm(DFLASH_DTYPE_BF16, lr[r], 2048, 4096, T && lr[r] == 16);
                case_linear_add_rmsnorm(DFLASH_DTYPE_BF16, lr[r], 2048, 6144, T && lr[r] == 16);
                case_linear_add_rmsnorm(DFLASH_DTYPE_F8_E4M3, lr[r], 2048, 4096, 0);
                case_linear_add_rmsnorm(DFLASH_DTYPE_BF16, lr[r], 4096, 4096, T && lr[r] == 1);
                case_linear_add_rmsnorm(DFLASH_DTYPE_BF16, lr[r], 4096, 12288, T && lr[r] == 1);
            }
            case_linear_add_rmsnorm(DFLASH_DTYPE_BF16, 65, 2048, 4096, 0);
            case_linear_add_rmsnorm(DFLASH_DTYPE_BF16, 4, 5120, 4096, 0);
        }
    }

    if (section("elementwise")) {
        /* add, swiglu */
        if (g_small) {
            case_elementwise(1000, 0, 0);
            case_elementwise(333, 1, 0);
            case_add_bias(DFLASH_DTYPE_BF16, 3, 100);
        } else {
            case_elementwise((size_t)16 * 6144, 0, T);
            case_elementwise((size_t)16 * 12288, 0, T);
            case_elementwise((size_t)64 * 12288, 0, 0);
            case_elementwise((size_t)1 * 2048, 0, 0);
            case_elementwise(100003, 3, 0);
            case_add_bias(DFLASH_DTYPE_BF16, 16, 4096);
            case_add_bias(DFLASH_DTYPE_F16, 5, 1000);
            case_add_bias(DFLASH_DTYPE_F32, 64, 14336);
        }
    }

    if (section("linear")) {
        /* linear */
        if (g_small) {
            case_linear(DFLASH_DTYPE_BF16, 72, 256, rows, 3, 0, 0);
            case_linear(DFLASH_DTYPE_F8_E4M3, 40, 512, rows, 3, 0, 0);
            case_linear(DFLASH_DTYPE_F16, 9, 64, rows, 3, 0, 0);
            case_linear(DFLASH_DTYPE_F32, 9, 64, rows, 3, 0, 0);
            case_linear(DFLASH_DTYPE_BF16, 7, 33, rows, 3, 0, 0);  /* scalar path: odd K */
            case_linear(DFLASH_DTYPE_BF16, 7, 64, rows, 3, 0, 1);  /* scalar path: unaligned x */
        } else {
            static const int64_t shapes[][2] = {
                /* seed drafter: H 2048, 32:4 x 128, I 6144, vocab */
                { 4096, 2048 }, { 512, 2048 }, { 2048, 4096 }, { 6144, 2048 }, { 2048, 6144 }, { 151936, 2048 },
                /* Qwen3-8B geometry: H 4096, 32:8 x 128, I 12288 */
                { 1024, 4096 }, { 4096, 4096 }, { 12288, 4096 }, { 4096, 12288 }, { 151936, 4096 },
            };
            for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
                case_linear(DFLASH_DTYPE_BF16, shapes[s][0], shapes[s][1], rows, 3, T, 0);
                case_linear(DFLASH_DTYPE_F8_E4M3, shapes[s][0], shapes[s][1], rows, 3, T, 0);
            }
            case_linear(DFLASH_DTYPE_F16, 2048, 2048, rows, 3, 0, 0);
            case_linear(DFLASH_DTYPE_F32, 512, 2048, rows, 3, 0, 0);
            case_linear(DFLASH_DTYPE_BF16, 1001, 2050, rows, 3, 0, 0); /* scalar path */
            case_linear(DFLASH_DTYPE_F8_E4M3, 1001, 2056, rows, 3, 0, 0);
            case_linear(DFLASH_DTYPE_BF16, 512, 2048, rows, 3, 0, 1);
        }
        { /* many rows (gemm_wide.cu) against the CPU */
            const int wide[] = { g_small ? 70 : 300 };
            case_linear(DFLASH_DTYPE_BF16, g_small ? 72 : 4096, g_small ? 256 : 2048, wide, 1, 0, 0);
            case_linear(DFLASH_DTYPE_F8_E4M3, g_small ? 40 : 2048, g_small ? 512 : 6144, wide, 1, 0, 0);
        }
        case_fp8_codes();
        {
            static const int inv_rows[] = { 16, 64, 100 };
            for (int i = 0; i < (g_small ? 1 : 3); i++) {
                case_linear_invariance(DFLASH_DTYPE_BF16, g_small ? 72 : 4096, g_small ? 256 : 2048, inv_rows[i]);
                case_linear_invariance(DFLASH_DTYPE_F8_E4M3, g_small ? 40 : 2048, g_small ? 512 : 6144, inv_rows[i]);
            }
        }
        /* the many-row kernel against one row alone: every epilogue, both
         * weight types, odd row counts, with the kernel's own tile choice and
         * then with tiles of 128 rows forced; then with 16 slices of 3
         * k-steps, 5 of them past the last step (empty), and an odd count of
         * k32 steps (a last stage half full), also with 128-row tiles */
        {
            const int64_t lin_s[1] = { 200 }, qkv_s[3] = { 136, 40, 40 }, gu_s[2] = { 96, 96 }, head_s[1] = { 1000 };
            const int64_t lin_l[1] = { 4096 }, qkv_l[3] = { 4096, 512, 512 }, gu_l[2] = { 6144, 6144 };
            const int64_t head_l[1] = { 151936 };
            const int nr = g_small ? 70 : 300;
            dflash_backend *t128 = backend_with("DFLASH_CUDA_GEMM_TILE", "128");
            for (int b = 0; b < 2; b++)
                for (int dt = 0; dt < 2; dt++) {
                    dflash_backend *be = b ? t128 : g_gpu;
                    const char *tag = b ? ", tile 128" : "";
                    const dflash_dtype d = dt ? DFLASH_DTYPE_F8_E4M3 : DFLASH_DTYPE_BF16;
                    const int64_t K = g_small ? 256 : 2048;
                    case_rows_invariance(be, tag, d, 0, g_small ? lin_s : lin_l, K, nr);
                    case_rows_invariance(be, tag, d, 1, g_small ? qkv_s : qkv_l, K, g_small ? 65 : 129);
                    case_rows_invariance(be, tag, d, 2, g_small ? gu_s : gu_l, K, nr);
                    case_rows_invariance(be, tag, d, 3, g_small ? head_s : head_l, K, g_small ? 66 : 77);
                }
            dflash_backend_destroy(t128);
            /* the shared split-K sum, waiting (the default) and with every
             * slice but a first-come last leaving its share to the last
             * (the fallback when slices cannot all run at once) */
            dflash_backend *alone = backend_with("DFLASH_CUDA_GEMM_SHARE_SUM", "0");
            dflash_backend *leave = backend_with("DFLASH_CUDA_GEMM_SHARE_SUM", "2");
            for (int dt = 0; dt < 2; dt++) {
                const dflash_dtype d = dt ? DFLASH_DTYPE_F8_E4M3 : DFLASH_DTYPE_BF16;
                const int64_t K = g_small ? 512 : 2048, K2 = g_small ? 1024 : 6144;
                const int64_t o_n[1] = { g_small ? 136 : 2048 };
                /* rows on both sides of where sharing starts: more than 8
                 * (16 with SwiGLU) */
                static const int share_rows[] = { 1, 8, 9, 16, 17, 64 };
                for (int ri = 0; ri < 6; ri++)
                    for (int b = 0; b < 2; b++) {
                        const int r = share_rows[ri];
                        dflash_backend *sh = b ? leave : g_gpu;
                        const char *tag = b ? "shares left to the last" : "shared sum";
                        case_share_sum_bits(sh, tag, alone, d, 1, g_small ? qkv_s : qkv_l, K, r);
                        case_share_sum_bits(sh, tag, alone, d, 2, g_small ? gu_s : gu_l, K, r);
                        case_share_sum_bits(sh, tag, alone, d, 0, o_n, K2, r);
                    }
            }
            dflash_backend_destroy(leave);
            dflash_backend_destroy(alone);
            dflash_backend *s16 = backend_with("DFLASH_CUDA_GEMM_SPLIT", "16");
            const int64_t odd[1] = { 72 }, odd_gu[2] = { 72, 72 };
            case_rows_invariance(s16, ", split 16", DFLASH_DTYPE_BF16, 0, odd, 33 * 32, 100);
            case_rows_invariance(s16, ", split 16", DFLASH_DTYPE_BF16, 2, odd_gu, 33 * 32, 70);
            case_rows_invariance(s16, ", split 16", DFLASH_DTYPE_F8_E4M3, 0, odd, 33 * 64, 100);
            dflash_backend_destroy(s16);
            setenv("DFLASH_CUDA_GEMM_TILE", "128", 1);
            dflash_backend *both = backend_with("DFLASH_CUDA_GEMM_SPLIT", "16");
            lever_env("DFLASH_CUDA_GEMM_TILE", NULL);
            case_rows_invariance(both, ", split 16, tile 128", DFLASH_DTYPE_BF16, 0, odd, 33 * 32, 150);
            case_rows_invariance(both, ", split 16, tile 128", DFLASH_DTYPE_BF16, 2, odd_gu, 33 * 32, 130);
            case_rows_invariance(both, ", split 16, tile 128", DFLASH_DTYPE_F8_E4M3, 0, odd, 33 * 64, 150);
            dflash_backend_destroy(both);
        }
        /* linear_group: q/k/v and gate/up + SwiGLU of the seed drafter and the
         * Qwen3-8B geometry */
        for (int dt = 0; dt < 2; dt++) {
            const dflash_dtype d = dt ? DFLASH_DTYPE_F8_E4M3 : DFLASH_DTYPE_BF16;
            if (g_small) {
                const int64_t qkv[3] = { 64, 32, 32 }, gu[2] = { 96, 96 };
                case_linear_group(d, 3, qkv, 128, DFLASH_ACT_NONE, 5, 0);
                case_linear_group(d, 2, gu, 128, DFLASH_ACT_SWIGLU, 5, 0);
                case_linear_group(d, 3, qkv, 128, DFLASH_ACT_NONE, 70, 0);
            } else {
                const int64_t qkv_s[3] = { 4096, 512, 512 }, gu_s[2] = { 6144, 6144 };
                const int64_t qkv_8[3] = { 4096, 1024, 1024 }, gu_8[2] = { 12288, 12288 };
                for (int r = 0; r < 3; r++) {
                    case_linear_group(d, 3, qkv_s, 2048, DFLASH_ACT_NONE, rows[r], T && rows[r] == 16);
                    case_linear_group(d, 2, gu_s, 2048, DFLASH_ACT_SWIGLU, rows[r], T && rows[r] == 16);
                    case_linear_group(d, 3, qkv_8, 4096, DFLASH_ACT_NONE, rows[r], T && rows[r] != 64);
                    case_linear_group(d, 2, gu_8, 4096, DFLASH_ACT_SWIGLU, rows[r], T && rows[r] != 64);
                }
                case_linear_group(d, 3, qkv_s, 2048, DFLASH_ACT_NONE, 130, 0);
                case_linear_group(d, 2, gu_s, 2048, DFLASH_ACT_SWIGLU, 130, 0);
            }
            /* a shared expert's down projection with its gate and the
             * residual add: 1, 16, 64 rows (gemm.cu), 130 (gemm_wide.cu),
             * and a K the tensor-core kernel does not take */
            const int gated_rows[] = { 1, 16, 64, 130 };
            for (int r = 0; r < 4; r++)
                for (int k = 0; k <= 8; k += 8)
                    case_gated_add(d, gated_rows[r], g_small ? 96 : 2048, g_small ? 128 : 512, k);
            case_gated_add(d, 5, 96, 100, 0);
            case_gated_add(d, 5, 96, 100, 3);
            /* a router and a one-row gate (a MoE's shared expert), also with
             * the gate in f32 (no shared launch: each its own kernel) */
            const int64_t rg[2] = { 64, 1 }, gu2[2] = { 96, 96 };
            case_linear_group(d, 2, rg, 128, DFLASH_ACT_NONE, 5, 0);
            case_linear_group_mixed(d, DFLASH_DTYPE_F32, 2, rg, 128, DFLASH_ACT_NONE, 5, 0);
            case_linear_group_mixed(d, DFLASH_DTYPE_F32, 2, gu2, 128, DFLASH_ACT_SWIGLU, 5, 0);
            /* a Gated DeltaNet layer's four input projections (qkv, z, b, a)
             * in one launch: 1 and 16 rows (gemm.cu), 130 (gemm_wide.cu);
             * the last in f32 (each its own kernel) */
            const int64_t gdn_s[4] = { 320, 128, 4, 4 }, gdn_l[4] = { 8192, 4096, 32, 32 };
            const int gdn_rows[] = { 1, 16, 130 };
            for (int r = 0; r < 3; r++)
                case_linear_group(d, 4, g_small ? gdn_s : gdn_l, g_small ? 128 : 2048, DFLASH_ACT_NONE, gdn_rows[r],
                                  T && gdn_rows[r] == 1);
            case_linear_group_mixed(d, DFLASH_DTYPE_F32, 4, gdn_s, 128, DFLASH_ACT_NONE, 5, 0);
        }
        if (g_small) {
            case_linear_argmax(DFLASH_DTYPE_BF16, 1000, 256, 5, 0, 0);
            case_linear_argmax(DFLASH_DTYPE_BF16, 1000, 256, 5, 1, 0);
            case_linear_argmax(DFLASH_DTYPE_BF16, 1000, 256, 3, 2, 0);
        } else {
            case_linear_argmax(DFLASH_DTYPE_BF16, 151936, 2048, 15, 0, T);
            case_linear_argmax(DFLASH_DTYPE_BF16, 151936, 4096, 16, 0, T);
            case_linear_argmax(DFLASH_DTYPE_BF16, 151936, 4096, 1, 0, T);
            case_linear_argmax(DFLASH_DTYPE_BF16, 151936, 2048, 70, 1, 0);
            case_linear_argmax(DFLASH_DTYPE_BF16, 151936, 2048, 16, 2, 0);
            case_linear_argmax(DFLASH_DTYPE_BF16, 5000, 2048, 16, 1, 0); /* split-K: the last block's epilogue */
            case_linear_argmax(DFLASH_DTYPE_F8_E4M3, 151936, 2048, 15, 0, T);
            case_linear_argmax(DFLASH_DTYPE_BF16, 151936, 4096, 512, 0, T);
            case_linear_argmax(DFLASH_DTYPE_BF16, 151936, 2048, 200, 1, 0);
        }
        if (T) {
            time_layer(DFLASH_DTYPE_BF16, 2048, 4096, 512, 6144, 16);
            time_layer(DFLASH_DTYPE_F8_E4M3, 2048, 4096, 512, 6144, 16);
            time_layer(DFLASH_DTYPE_BF16, 4096, 4096, 1024, 12288, 16);
            time_layer(DFLASH_DTYPE_BF16, 4096, 4096, 1024, 12288, 1);
            /* many sessions: 8 x 16 and 32 x 16 rows */
            time_layer(DFLASH_DTYPE_BF16, 4096, 4096, 1024, 12288, 128);
            time_layer(DFLASH_DTYPE_BF16, 4096, 4096, 1024, 12288, 512);
            time_layer(DFLASH_DTYPE_BF16, 2048, 4096, 512, 6144, 512);
        }
    }

    if (section("norm")) {
        /* norm_rope */
        for (int r = 0; r < 3; r++) {
            if (g_small) {
                case_norm_rope(rows[r], 4, 64, 1, 300, 1e6, DFLASH_ROPE_DEFAULT, 1, 0);
                case_norm_rope(rows[r], 2, 40, 0, 300, 1e4, DFLASH_ROPE_YARN, 8, 0);
            } else {
                case_norm_rope(rows[r], 32, 128, 1, 40960, 1e6, DFLASH_ROPE_DEFAULT, 1, T && rows[r] == 16);
                case_norm_rope(rows[r], 8, 128, 1, 40960, 1e6, DFLASH_ROPE_DEFAULT, 1, 0);
                case_norm_rope(rows[r], 4, 128, 0, 5000, 1e4, DFLASH_ROPE_LINEAR, 4, 0);
                case_norm_rope(rows[r], 8, 128, 1, 131072, 5e5, DFLASH_ROPE_LLAMA3, 8, 0);
                case_norm_rope(rows[r], 4, 128, 1, 131072, 1e6, DFLASH_ROPE_YARN, 4, 0);
            }
        }

        case_qk_norm_rope(g_small ? 5 : 16, g_small ? 4 : 32, g_small ? 2 : 4, g_small ? 64 : 128, T);
        if (!g_small)
            case_qk_norm_rope(1, 32, 8, 128, 0);
        /* the kernel's two paths: in registers (head_dim % 64 == 0, up to
         * 256) and the general one */
        case_qk_norm_rope(3, 4, 2, 256, 0);
        case_qk_norm_rope(3, 4, 2, 32, 0);
        case_qk_norm_rope(2, 3, 1, 96, 0);
        /* partial rotations: a Qwen3.5's gated attention (64 of 256, 4 of 16) */
        case_qk_norm_rope_rot(5, 4, 2, 256, 64, 0);
        case_qk_norm_rope_rot(3, 4, 2, 16, 4, 0);
        /* with the K and V store: both pool dtypes, the register and the
         * general path, k alone (the drafter's context), a partial rotation */
        for (int kd = 0; kd < 2; kd++) {
            const dflash_dtype dt = kd ? DFLASH_DTYPE_BF16 : DFLASH_DTYPE_F32;
            case_qk_norm_rope_store(g_small ? 5 : 16, g_small ? 4 : 32, g_small ? 2 : 8, 128, 128, dt, 1);
            case_qk_norm_rope_store(5, 0, 4, 128, 128, dt, 1);
            case_qk_norm_rope_store(3, 4, 2, 96, 96, dt, 1);
            case_qk_norm_rope_store(4, 4, 2, 256, 64, dt, 1);
            case_qk_norm_rope_store(g_small ? 5 : 16, g_small ? 4 : 32, g_small ? 2 : 8, 128, 128, dt, 0);
            case_qk_norm_rope_store(3, 4, 2, 96, 96, dt, 0);
        }
        /* the q/k/v projections with them: the seed drafter's block (no
         * store) and the 8B's at 1 and 16 rows, fp8, head_dim without a
         * register form, 64 rows (the GEMM's sum left to the norm) and
         * 65 (composed) */
        case_qkv_norm_rope_store(DFLASH_DTYPE_BF16, 3, 4, 2, 64, 512, 1, 0);
        case_qkv_norm_rope_store(DFLASH_DTYPE_F8_E4M3, 4, 2, 1, 96, 1024, 1, 0);
        case_qkv_norm_rope_store(DFLASH_DTYPE_BF16, 5, 2, 2, 256, 512, 0, 0);
        if (!g_small) {
            case_qkv_norm_rope_store(DFLASH_DTYPE_BF16, 16, 32, 4, 128, 2048, 0, T);
            case_qkv_norm_rope_store(DFLASH_DTYPE_F8_E4M3, 16, 32, 4, 128, 2048, 0, 0);
            case_qkv_norm_rope_store(DFLASH_DTYPE_BF16, 1, 32, 8, 128, 4096, 1, T);
            case_qkv_norm_rope_store(DFLASH_DTYPE_BF16, 16, 32, 8, 128, 4096, 1, T);
            case_qkv_norm_rope_store(DFLASH_DTYPE_BF16, 64, 32, 4, 128, 2048, 0, 0);
            case_qkv_norm_rope_store(DFLASH_DTYPE_BF16, 65, 32, 4, 128, 2048, 0, 0);
        }
        /* a Gated DeltaNet's output norm: the 35B-A3B's 32 x 128, the
         * kernel's sizes 32 and 256, and 48 (the composition) */
        case_norm_gate(g_small ? 5 : 16, 32, 128);
        case_norm_gate(3, 4, 32);
        case_norm_gate(3, 2, 256);
        case_norm_gate(2, 3, 48);
    }

    if (section("recurrent")) {
        /* a linear-attention layer's primitives: the fixtures' geometry, then
         * Qwen3.5-MoE's (16 key heads, 32 value heads of 128, conv 4) */
        {
            static const int few[] = { 70, 5, 130, 64 }, few_back[] = { 6, 5, 65, 1 }, few_more[] = { 3, 1, 17, 16 };
            static const int many[] = { 17, 1, 80, 3, 130, 9 }, many_back[] = { 1, 0, 16, 3, 65, 2 },
                             many_more[] = { 16, 1, 16, 17, 17, 1 };
            case_recurrent((gdn_geom){ 2, 4, 16, 8, 4 }, 4, few, few_back, few_more);
            /* value heads wider than the key dim and than one block's 32
             * columns; a convolution of 2 and of 16 (the widest); a key dim
             * of 128 (the delta rule's own instance for it) with a last
             * column block half full, small enough for the sanitizers */
            static const int odd[] = { 70, 3 }, odd_back[] = { 65, 1 }, odd_more[] = { 9, 2 };
            case_recurrent((gdn_geom){ 1, 2, 64, 192, 2 }, 2, odd, odd_back, odd_more);
            case_recurrent((gdn_geom){ 2, 4, 32, 16, 16 }, 2, odd, odd_back, odd_more);
            case_recurrent((gdn_geom){ 1, 2, 128, 48, 4 }, 2, odd, odd_back, odd_more);
            if (!g_small) {
                const gdn_geom q36 = { 16, 32, 128, 128, 4 };
                case_recurrent(q36, 6, many, many_back, many_more);
                time_recurrent(q36, 1024, 1);
                time_recurrent(q36, 1024, 16);
                time_recurrent(q36, 1080, 16);
                time_recurrent(q36, 0, 512);
            }
            case_sigmoid_mul(5, 96);
            if (!g_small)
                case_sigmoid_mul(64, 4096);
        }
    }

    if (section("attention")) {
        /* kv_write + attention, f32 pages (the general kernel) and bf16 pages
         * (the tensor-core kernel where head_dim allows) */
        for (int kd = 0; kd < 2; kd++) {
            const dflash_dtype dt = kd ? DFLASH_DTYPE_BF16 : DFLASH_DTYPE_F32;
            if (g_small) {
                const attn_case cs[] = {
                    { 1, 1, 1, 4, 2, 64, MODE_CAUSAL, 0, 0, 0, dt },   { 1, 5, 37, 4, 2, 64, MODE_CAUSAL, 0, 0, 0, dt },
                    { 2, 3, 20, 4, 1, 32, MODE_NONE, 0, 0, 0, dt },    { 1, 16, 70, 8, 2, 64, MODE_WINDOW, 24, 0, 0, dt },
                    { 1, 4, 70, 4, 2, 64, MODE_WINDOW, 40, 4, 0, dt }, { 1, 3, 50, 2, 1, 18, MODE_NONE, 0, 0, 0, dt },
                    { 1, 2, 0, 4, 2, 64, MODE_NONE, 0, 0, 0, dt },     { 1, 3, 300, 4, 2, 16, MODE_CAUSAL, 0, 0, 0, dt },
                    { 2, 16, 260, 16, 2, 128, MODE_NONE, 0, 0, 0, dt },
                    { 1, 3, 300, 4, 2, 256, MODE_CAUSAL, 0, 0, 0, dt }, /* head_dim 256: the general kernel, 3 splits */
                    { 1, 4, 200, 4, 2, 256, MODE_WINDOW, 40, 4, 0, dt },
                };
                for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++)
                    case_attention(&cs[i]);
            } else {
                static const int ctxs[] = { 1, 17, 1000, 4097 };
                for (int ci = 0; ci < 4; ci++)
                    for (int r = 0; r < 3; r++) {
                        const int L = ctxs[ci], R = rows[r];
                        const int timed = T && L == 4097 && (R == 16 || R == 1);
                        attn_case a;
                        /* target verify: causal over its own paged rows, 32:8 */
                        a = (attn_case){ 1, R < L ? R : L, L, 32, 8, 128, MODE_CAUSAL, 0, 0, timed, dt };
                        case_attention(&a);
                        /* drafter: full layer (none) and sliding layer (window), 32:4 */
                        a = (attn_case){ 1, R, L, 32, 4, 128, MODE_NONE, 0, 0, timed && R == 16, dt };
                        case_attention(&a);
                        a = (attn_case){ 1, R, L, 32, 4, 128, MODE_WINDOW, 2048, 0, 0, dt };
                        case_attention(&a);
                    }
                /* ring tables: a capped drafter context (pt_len 257 = 4096 + a block) */
                attn_case rg[] = {
                    { 1, 16, 6000, 32, 4, 128, MODE_NONE, 0, 257, 0, dt },
                    { 1, 16, 6000, 32, 4, 128, MODE_WINDOW, 2048, 257, 0, dt },
                    { 2, 16, 4097, 32, 8, 128, MODE_CAUSAL, 0, 0, 0, dt },
                    { 2, 16, 300, 32, 4, 128, MODE_WINDOW, 100, 5, 0, dt },
                    { 1, 7, 100, 16, 16, 80, MODE_NONE, 0, 0, 0, dt },
                    { 1, 7, 100, 8, 2, 18, MODE_WINDOW, 50, 0, 0, dt },
                    { 1, 64, 500, 32, 4, 128, MODE_CAUSAL, 0, 0, 0, dt }, /* 512 query vectors: 4 chunks */
                    { 3, 16, 700, 16, 2, 64, MODE_NONE, 0, 0, 0, dt },
                    { 1, 16, 32768, 32, 8, 128, MODE_CAUSAL, 0, 0, T && kd, dt },
                    { 1, 1, 32768, 32, 8, 128, MODE_CAUSAL, 0, 0, T && kd, dt },
                    /* a Qwen3.5's gated attention: head_dim 256, 16:2 (the general kernel) */
                    { 1, 1, 2048, 16, 2, 256, MODE_CAUSAL, 0, 0, T && kd, dt },
                    { 1, 16, 2048, 16, 2, 256, MODE_CAUSAL, 0, 0, T && kd, dt },
                    { 2, 5, 700, 16, 2, 256, MODE_NONE, 0, 0, 0, dt },
                };
                for (size_t i = 0; i < sizeof rg / sizeof rg[0]; i++)
                    case_attention(&rg[i]);
            }
        }
        /* a decode's q/k/v stage and attention as one call */
        if (g_small) {
            /* K large enough that the GEMM leaves its sum to the fused launch */
            case_qkv_attention(DFLASH_DTYPE_BF16, 1, 32, 8, 2048, 37, 0);
            case_qkv_attention(DFLASH_DTYPE_F8_E4M3, 2, 32, 8, 4096, 130, 0);
        } else {
            case_qkv_attention(DFLASH_DTYPE_BF16, 1, 32, 8, 4096, 4095, 1);
            case_qkv_attention(DFLASH_DTYPE_BF16, 4, 32, 8, 4096, 1000, 0);
            case_qkv_attention(DFLASH_DTYPE_BF16, 2, 32, 8, 4096, 0, 0);
            case_qkv_attention(DFLASH_DTYPE_BF16, 3, 32, 4, 2048, 128, 0);
            case_qkv_attention(DFLASH_DTYPE_F8_E4M3, 2, 32, 8, 4096, 4097, 0);
        }
        /* verify rows equal decode rows bit for bit (bf16 pages) */
        if (g_small) {
            case_attention_invariance(37, 4, 2, 64);
            case_attention_invariance(250, 4, 2, 16);
            case_attention_invariance(200, 4, 2, 256);
            case_attention_invariance(4600, 4, 2, 64); /* 128- and 256-key splits, rows across a long split's end */
            case_attention_invariance(5889, 4, 2, 64); /* a last long split of 1 key */
            case_attention_invariance(7681, 4, 2, 64); /* group 24: two walks at the room's edge (31 units) */
        } else {
            static const int ctxs[] = { 1, 100, 127, 128, 129, 1000, 4090, 4600, 5889, 7681, 40000 };
            for (size_t i = 0; i < sizeof ctxs / sizeof ctxs[0]; i++)
                case_attention_invariance(ctxs[i], 32, 8, 128);
            case_attention_invariance(300, 6, 2, 32);
            case_attention_invariance(129, 16, 2, 256);
            case_attention_invariance(1000, 16, 2, 256);
        }
    }

    if (section("copy")) {
        /* copy_rows */
        if (g_small) {
            case_copy_rows(5, 64, 64, 64, 0, 0);
            case_copy_rows(5, 30, 70, 100, 1, 0);
        } else {
            case_copy_rows(16, 2048, 2048, 2048, 1, T);
            case_copy_rows(128, 1 << 20, 1 << 20, 1 << 20, 0, T); /* 512 MiB: the copy kernel's bandwidth */
            if (T)
                time_driver_copy((size_t)512 << 20);
            case_copy_rows(64, 4096, 5 * 4096, 4096, 0, 0);
            case_copy_rows(16, 2048, 2048, 3 * 2048, 0, 0);
            case_copy_rows(3, 1001, 1003, 1001, 1, 0);
        }
        case_copy_ids(1, 15, 15, 16);  /* one sequence's drafts into rows 1..15 */
        case_copy_ids(32, 15, 15, 16); /* 32 sequences' */
        case_copy_ids(3, 300, 301, 700);
        case_gather_sum(5, 2, 96, 10);
        case_gather_sum(3, 10, 200, 50); /* more terms than one batch of 8 */
        case_gather_sum(2, 1, 64, 5);
        if (!g_small)
            case_gather_sum(512, 8, 2048, 4096); /* a 30B-A3B layer's 32 x 16 verify rows */
    }

    if (section("moe")) {
        /* a MoE layer: 1 row, a verify's 16, tiles of 64 rows and more (few
         * experts), fp8, more than 256 experts (the routing's wide kernel:
         * 257, Qwen3.5-397B's 512 top 10, the most the stage allows);
         * timed at Qwen3.5-35B-A3B's experts */
        case_moe(DFLASH_DTYPE_BF16, 1, 16, 4, 256, 128, 0);
        case_moe(DFLASH_DTYPE_BF16, 16, 64, 8, 256, 128, 0);
        case_moe(DFLASH_DTYPE_BF16, 100, 8, 2, 256, 96, 0);
        case_moe(DFLASH_DTYPE_F8_E4M3, 16, 16, 4, 256, 128, 0);
        /* long K: gate/up split 8 ways (slices of any length allowed), so
         * chained blocks take a row block's slices, and the down
         * projection's chains cross row blocks; 1088 leaves a short last
         * chunk */
        {
            const char *slice = getenv("DFLASH_CUDA_EXPERTS_SLICE");
            char *was = slice ? strdup(slice) : NULL; /* a sweep's setting, for the cases after these */
            lever_env("DFLASH_CUDA_EXPERTS_SLICE", "1");
            case_moe(DFLASH_DTYPE_BF16, 16, 16, 4, 1024, 128, 0);
            case_moe(DFLASH_DTYPE_F8_E4M3, 16, 16, 4, 1088, 128, 0);
            lever_env("DFLASH_CUDA_EXPERTS_SLICE", was);
            free(was);
        }
        /* experts with more rows than their tiles (sized for the mean) hold */
        case_moe_routing(DFLASH_DTYPE_BF16, 16, 64, 8, 256, 128, 0, 1);
        case_moe(DFLASH_DTYPE_BF16, 5, 257, 8, 256, 64, 0);
        case_moe(DFLASH_DTYPE_BF16, 40, 512, 10, 256, 64, 0);
        case_moe(DFLASH_DTYPE_BF16, 3, DFLASH_ROUTE_MAX_EXPERTS, 8, 256, 64, 0);
        case_moe(DFLASH_DTYPE_BF16, 3, 64, 40, 256, 64, 0); /* more than 32 taken: the routing's other path */
        case_moe(DFLASH_DTYPE_BF16, 520, 64, 8, 256, 64, 0); /* more entries than one staged chunk (4096) */
        /* a shared expert: decode, verify, more than 64 rows, more than
         * one staged chunk, more than 32 taken, the most experts */
        case_moe_route_shared(1, 256, 8);
        case_moe_route_shared(16, 256, 8);
        case_moe_route_shared(100, 64, 8);
        case_moe_route_shared(460, 64, 8);
        case_moe_route_shared(3, 64, 40);
        case_moe_route_shared(5, DFLASH_ROUTE_MAX_EXPERTS - 1, 8);
        /* the router's projection with the routing: decode, verify, the
         * most rows a split GEMM leaves to it, past that (composed); the
         * fused form for every row count (its default is decodes only) */
        char *was = getenv("DFLASH_CUDA_ROUTE_SUM_ROWS") ? strdup(getenv("DFLASH_CUDA_ROUTE_SUM_ROWS")) : NULL;
        lever_env("DFLASH_CUDA_ROUTE_SUM_ROWS", "64");
        for (int sh = 0; sh < 3; sh++)
            for (size_t i = 0; i < 4; i++) {
                const int rows[4] = { 1, 16, 64, 65 };
                case_linear_moe_route(DFLASH_DTYPE_BF16, rows[i], 256, 8, g_small ? 256 : 2048, sh, 0);
            }
        case_linear_moe_route(DFLASH_DTYPE_F8_E4M3, 16, 256, 8, 2048, 1, 0);
        case_linear_moe_route(DFLASH_DTYPE_F8_E4M3, 1, 128, 8, 2048, 0, 0);
        case_linear_moe_route(DFLASH_DTYPE_BF16, 3, 64, 40, 512, 1, 0); /* more than 32 taken */
        case_linear_moe_route(DFLASH_DTYPE_BF16, 5, 600, 8, 512, 1, 0); /* the wide routing kernel */
        if (!g_small) {
            case_linear_moe_route(DFLASH_DTYPE_BF16, 1, 256, 8, 2048, 1, T);
            case_linear_moe_route(DFLASH_DTYPE_BF16, 16, 256, 8, 2048, 1, T);
        }
        lever_env("DFLASH_CUDA_ROUTE_SUM_ROWS", was);
        free(was);
        if (!g_small) {
            case_moe(DFLASH_DTYPE_BF16, 1, 256, 8, 2048, 512, T);
            case_moe(DFLASH_DTYPE_BF16, 16, 256, 8, 2048, 512, T);
        }
    }

    if (section("argmax")) {
        /* argmax */
        if (g_small) {
            case_argmax(5, 1000, 0, 0);
            case_argmax(10, 997, 1, 0);
        } else {
            for (int r = 0; r < 3; r++)
                case_argmax(rows[r], 151936, 0, T && rows[r] == 16);
            case_argmax(20, 151936, 1, 0);
            case_argmax(20, 151935, 1, 0);
            case_argmax(20, 3, 1, 0);
        }
    }

    if (section("sample")) {
        /* sample_rows */
        if (g_small) { /* one draw a row: racecheck takes ~0.6 s a cluster of 8 blocks */
            case_sample(997, 1, 0);
            case_sample_penalties(997, 1);
        } else {
            case_sample(151936, 16, T);
            case_sample(4096, 64, 0);
            case_sample_penalties(151936, 4);
            case_sample_penalties(4096, 16);
        }
    }

    if (g_flush)
        g_gpu->ops->free(g_gpu, g_flush);
    dflash_backend_destroy(g_gpu);
    dflash_backend_destroy(g_cpu);

    /* Tables last: timings, then parity. */
    if (g_nperf) {
        printf("\n%-12s %-64s %10s %9s\n", "op", "shape (timed)", "us", "GB/s");
        for (int i = 0; i < g_nperf; i++)
            printf("%-12s %-64s %10.2f %9.1f\n", g_perf_rows[i].op, g_perf_rows[i].shape, g_perf_rows[i].us,
                   g_perf_rows[i].gbs);
    }
    int failed = 0;
    printf("\n%-12s %-64s %10s %7s %s\n", "op", "shape", "max err", "tol", "");
    for (int i = 0; i < g_nres; i++) {
        printf("%-12s %-64s %10.3g %7.0e %s\n", g_res[i].op, g_res[i].shape, g_res[i].err, g_res[i].tol,
               g_res[i].pass ? "ok" : "FAIL");
        failed += !g_res[i].pass;
    }
    printf("RESULT %d %d\n", g_nres - failed, failed);
    return failed ? 1 : 0;
}
