/* test_cpu_gemm.c: the CPU linear's kernels. The summation order is
 * written out here once more, independently of cpu_gemm.c, and every
 * kernel set this machine runs (portable, AVX2, AVX-512) must reproduce it
 * bit for bit, for every weight dtype, row count 1..17, and shapes with
 * tails in K (not a multiple of 8) and in the columns (not a multiple of
 * the register tile); results must also be close to a double-precision
 * product, and large calls (threaded) must agree with small ones. The
 * pool that shares calls among threads runs each chunk exactly once. */
#include "harness.h"

#include "backend/cpu/cpu_internal.h"
#include "core/dtype.h"
#include "core/levers.h"

static unsigned rng = 777;

static float frand(void)
{
    rng = rng * 1103515245u + 12345u;
    return ((rng >> 8) & 0xffff) / 32768.0f - 1.0f;
}

typedef struct wset {
    dflash_weight w;
    void *data;
    float *scales;
    float *wf; /* the widened weights, exact */
} wset;

static void make_weight(wset *s, dflash_dtype dt, int N, int K)
{
    const size_t n = (size_t)N * (size_t)K;
    s->wf = malloc(n * sizeof(float));
    s->data = malloc(n * 4);
    s->scales = NULL;
    for (size_t i = 0; i < n; i++) {
        float v = frand();
        switch (dt) {
        case DFLASH_DTYPE_BF16:
            ((uint16_t *)s->data)[i] = dflash_f32_to_bf16(v);
            s->wf[i] = dflash_bf16_to_f32(((uint16_t *)s->data)[i]);
            break;
        case DFLASH_DTYPE_F16:
            /* sign, exponent 13..16 (magnitudes 1/4..4), random mantissa */
            ((uint16_t *)s->data)[i] = (uint16_t)((v < 0 ? 0x8000u : 0u) | ((13u + (rng >> 20) % 4u) << 10) |
                                                  ((rng >> 4) & 0x3ffu));
            s->wf[i] = dflash_f16_to_f32(((uint16_t *)s->data)[i]);
            break;
        case DFLASH_DTYPE_F8_E4M3:
            ((uint8_t *)s->data)[i] = dflash_f32_to_fp8e4m3(v * 200.0f);
            s->wf[i] = dflash_fp8e4m3_to_f32(((uint8_t *)s->data)[i]);
            break;
        default:
            ((float *)s->data)[i] = v;
            s->wf[i] = v;
        }
    }
    if (dt == DFLASH_DTYPE_F8_E4M3) {
        s->scales = malloc((size_t)N * sizeof(float));
        for (int c = 0; c < N; c++)
            s->scales[c] = 0.004f + 0.001f * (float)(c % 5);
    }
    s->w = (dflash_weight){ dt, N, K, s->data, s->scales, "w" };
}

static void free_weight(wset *s)
{
    free(s->data);
    free(s->scales);
    free(s->wf);
}

/* The definition, written out: 8 lanes, lane k % 8 gets fmaf(x, w, lane)
 * in ascending k, lanes summed ((0+1)+(2+3))+((4+5)+(6+7)), times scale. */
static float definition(const float *x, const float *w, int K, float scale)
{
    float l[8] = { 0 };
    for (int k = 0; k < K; k++)
        l[k % 8] = fmaf(x[k], w[k], l[k % 8]);
    return (((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]))) * scale;
}

static void check_shape(dflash_dtype dt, int N, int K, int n_max, int *checked_isas)
{
    wset s;
    make_weight(&s, dt, N, K);
    float *x = malloc((size_t)n_max * K * sizeof(float));
    float *out = malloc((size_t)n_max * N * sizeof(float));
    float *want = malloc((size_t)n_max * N * sizeof(float));
    for (int i = 0; i < n_max * K; i++)
        x[i] = frand();
    double err = 0, ref_sq = 0;
    for (int i = 0; i < n_max; i++)
        for (int c = 0; c < N; c++) {
            float sc = s.scales ? s.scales[c] : 1.0f;
            want[(size_t)i * N + c] = definition(x + (size_t)i * K, s.wf + (size_t)c * K, K, sc);
            double d = 0;
            for (int k = 0; k < K; k++)
                d += (double)x[(size_t)i * K + k] * s.wf[(size_t)c * K + k];
            d *= sc;
            err += (want[(size_t)i * N + c] - d) * (want[(size_t)i * N + c] - d);
            ref_sq += d * d;
        }
    CHECKF(sqrt(err / (ref_sq > 0 ? ref_sq : 1)) < 1e-6, "%s N %d K %d: the definition is %g from double",
           dflash_dtype_name(dt), N, K, sqrt(err / (ref_sq > 0 ? ref_sq : 1)));
    for (int isa = 0; isa <= (int)dflash_cpu_isa_best(); isa++) {
        checked_isas[isa] = 1;
        for (int n = 1; n <= n_max; n++) {
            CHECK_OK(dflash_cpu_gemm((dflash_cpu_isa)isa, x, n, &s.w, out));
            CHECKF(memcmp(out, want, (size_t)n * N * sizeof(float)) == 0, "%s %s N %d K %d rows %d: not bit-exact",
                   dflash_cpu_isa_name((dflash_cpu_isa)isa), dflash_dtype_name(dt), N, K, n);
        }
    }
    free(x);
    free(out);
    free(want);
    free_weight(&s);
}

static void test_kernels_match_the_definition(void)
{
    const dflash_dtype dts[] = { DFLASH_DTYPE_BF16, DFLASH_DTYPE_F32, DFLASH_DTYPE_F16, DFLASH_DTYPE_F8_E4M3 };
    const int shapes[][2] = { { 1, 1 }, { 7, 13 }, { 13, 64 }, { 6, 100 }, { 25, 256 }, { 3, 777 } };
    int checked[3] = { 0 };
    for (size_t d = 0; d < sizeof dts / sizeof dts[0]; d++)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
            check_shape(dts[d], shapes[s][0], shapes[s][1], 17, checked);
    printf("  kernel sets compared with the definition:%s%s%s (best here: %s)\n", checked[0] ? " portable" : "",
           checked[1] ? " avx2" : "", checked[2] ? " avx512" : "", dflash_cpu_isa_name(dflash_cpu_isa_best()));
    CHECK(checked[0]);
}

/* Calls big enough to be split among threads and into cache chunks give
 * each row the bits a 1-row call gives. */
static void test_threaded_calls_are_row_independent(void)
{
    enum { N = 1100, K = 520, ROWS = 16 };
    wset s;
    make_weight(&s, DFLASH_DTYPE_BF16, N, K);
    float *x = malloc((size_t)ROWS * K * sizeof(float)), *all = malloc((size_t)ROWS * N * sizeof(float));
    float one[N];
    for (int i = 0; i < ROWS * K; i++)
        x[i] = frand();
    for (int isa = 0; isa <= (int)dflash_cpu_isa_best(); isa++) {
        CHECK_OK(dflash_cpu_gemm((dflash_cpu_isa)isa, x, ROWS, &s.w, all));
        for (int i = 0; i < ROWS; i++) {
            CHECK_OK(dflash_cpu_gemm((dflash_cpu_isa)isa, x + (size_t)i * K, 1, &s.w, one));
            CHECKF(memcmp(one, all + (size_t)i * N, sizeof one) == 0, "%s row %d differs alone",
                   dflash_cpu_isa_name((dflash_cpu_isa)isa), i);
        }
    }
    free(x);
    free(all);
    free_weight(&s);
}

/* The pool runs every chunk of every job exactly once, job after job
 * (the linear's calls come back to back). */
typedef struct count_job {
    int hits[64];
} count_job;

static void count_chunk(void *ctx, int i)
{
    __atomic_fetch_add(&((count_job *)ctx)->hits[i], 1, __ATOMIC_RELAXED);
}

static void test_pool_runs_each_chunk_once(void)
{
    printf("  pool threads: %d\n", dflash_cpu_pool_threads());
    int bad = 0;
    for (int job = 0; job < 20000; job++) {
        count_job c;
        memset(&c, 0, sizeof c);
        const int n = 1 + job % 64;
        dflash_cpu_pool_run(count_chunk, &c, n);
        for (int i = 0; i < 64; i++)
            bad += c.hits[i] != (i < n);
    }
    CHECKF(bad == 0, "%d chunks run other than once", bad);
}

/* DFLASH_CPU_ISA asks for less than the best; a bad value is ignored (with
 * a warning), as is asking for more than the machine has. */
static void test_isa_lever(void)
{
    CHECK(!strcmp(dflash_cpu_isa_name(DFLASH_CPU_ISA_PORTABLE), "portable"));
    CHECK(!strcmp(dflash_cpu_isa_name(DFLASH_CPU_ISA_AVX512), "avx512"));
    setenv("DFLASH_CPU_ISA", "Portable", 1);
    dflash_levers_reload();
    CHECK(dflash_cpu_isa_active() == DFLASH_CPU_ISA_PORTABLE);
    setenv("DFLASH_CPU_ISA", "avx1024", 1);
    dflash_levers_reload();
    CHECK(dflash_cpu_isa_active() == dflash_cpu_isa_best());
    setenv("DFLASH_CPU_ISA", "avx512", 1);
    dflash_levers_reload();
    CHECK(dflash_cpu_isa_active() == dflash_cpu_isa_best()); /* never above the best */
    unsetenv("DFLASH_CPU_ISA");
    dflash_levers_reload();
    CHECK(dflash_cpu_isa_active() == dflash_cpu_isa_best());
}

int main(void)
{
    RUN(test_kernels_match_the_definition);
    RUN(test_threaded_calls_are_row_independent);
    RUN(test_pool_runs_each_chunk_once);
    RUN(test_isa_lever);
    TEST_END();
}
