/* cpu_gemm.c: the CPU linear (out[n, rows(w)] = x[n, cols(w)] . w^T), with
 * SIMD kernels chosen at run time and one summation order for all of them.
 *
 * The order (the definition every kernel reproduces bit for bit): output
 * (i, c) keeps 8 partial sums; lane j accumulates x[i][k] * w[c][k] for the
 * k = j (mod 8), in ascending k, each step one fused multiply-add (fmaf);
 * the lanes are then added as ((0+1)+(2+3))+((4+5)+(6+7)) and the result
 * multiplied by the row's scale (fp8 weights; 1 otherwise). The order
 * depends only on K, never on how many rows share the call or which rows
 * a thread holds: that is what keeps speculative output (16-row verify)
 * bit-identical to plain decoding (1-row decode). Weight widening (bf16,
 * f16, fp8 to f32) is exact, so where it happens does not matter.
 *
 * Kernels: portable C (fmaf; fast where the compiler has a hardware fma),
 * AVX2+FMA (one 8-lane register is exactly the 8 partial sums), and
 * AVX-512 (two output columns per 16-lane register, so again 8 lanes per
 * output). The fast ones work on register tiles of up to 4 rows x 3
 * columns (AVX2) or 8 rows x 6 columns (AVX-512), reading each weight
 * once per tile for all its rows: a 16-row call costs far less than 16
 * one-row calls. Output columns are cut into chunks the pool's threads
 * take (cpu_pool.c), each walked in cache-sized pieces whose weights stay
 * in L2 while every row tile passes over them. */
#include "backend/cpu/cpu_internal.h"
#include "core/levers.h"

#include <math.h>
#include <pthread.h>
#include <string.h>
#include <stdatomic.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define GEMM_X86 1
#else
#define GEMM_X86 0
#endif

/* From this many multiply-adds on, a call is shared among the pool's
 * threads (cpu_pool.c); below, handing it over costs more than it saves. */
#define GEMM_PAR_MIN (1 << 16)
/* Weight bytes per thread chunk: about half of a 1 MiB L2. */
#define GEMM_CHUNK_BYTES (384 * 1024)

static float lanes_sum(const float l[8])
{
    return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
}

/* fp8 e4m3 has 256 codes: widening is a table lookup (the decoder's
 * ldexpf per element made fp8 weights ~15x slower to widen than bf16). */
static float g_fp8_f32[256];
static pthread_once_t g_fp8_once = PTHREAD_ONCE_INIT;

static void fp8_table_init(void)
{
    for (int b = 0; b < 256; b++)
        g_fp8_f32[b] = dflash_fp8e4m3_to_f32((uint8_t)b);
}

/* Row r of w widened to f32 (exact) into dst [w->cols]; shared with
 * cpu_ops.c (embeddings, norm weights). */
void dflash_cpu_weight_row(const dflash_weight *w, int64_t r, float *dst)
{
    const int64_t n = w->cols;
    switch (w->dtype) {
    case DFLASH_DTYPE_BF16: {
        const uint16_t *s = (const uint16_t *)w->data + r * n;
        for (int64_t i = 0; i < n; i++)
            dst[i] = dflash_bf16_to_f32(s[i]);
        break;
    }
    case DFLASH_DTYPE_F16: {
        const uint16_t *s = (const uint16_t *)w->data + r * n;
        for (int64_t i = 0; i < n; i++)
            dst[i] = dflash_f16_to_f32(s[i]);
        break;
    }
    case DFLASH_DTYPE_F8_E4M3: {
        const uint8_t *s = (const uint8_t *)w->data + r * n;
        pthread_once(&g_fp8_once, fp8_table_init);
        for (int64_t i = 0; i < n; i++)
            dst[i] = g_fp8_f32[s[i]];
        break;
    }
    case DFLASH_DTYPE_F32:
        memcpy(dst, (const float *)w->data + r * n, (size_t)n * sizeof(float));
        break;
    default: /* callers check dtypes first */
        memset(dst, 0, (size_t)n * sizeof(float));
    }
}

static float row_scale(const dflash_weight *w, int64_t c)
{
    return w->dtype == DFLASH_DTYPE_F8_E4M3 ? w->scales[c] : 1.0f;
}

/* ---- portable: the definition, written out ---- */

static void gemm_portable(const float *x, int n, const dflash_weight *w, float *out, int64_t c0, int64_t c1,
                          float *wr)
{
    const int64_t K = w->cols, N = w->rows;
    for (int64_t c = c0; c < c1; c++) {
        dflash_cpu_weight_row(w, c, wr);
        for (int i = 0; i < n; i++) {
            const float *xr = x + (int64_t)i * K;
            float l[8] = { 0 };
            for (int64_t k = 0; k < K; k++)
                l[k & 7] = fmaf(xr[k], wr[k], l[k & 7]);
            out[(int64_t)i * N + c] = lanes_sum(l) * row_scale(w, c);
        }
    }
}

#if GEMM_X86

/* A register tile: R rows of x (row stride ldx floats) against C weight
 * rows, f32 (bf16 == 0) or bf16 (bf16 == 1), row stride ldw elements; K
 * common. Results go to out[r * ldo + c] times scale[c]. Always inlined
 * with constant R, C, bf16, so the accumulators live in registers. */
#define TILE_ATTR static inline __attribute__((always_inline, target("avx2,fma")))

TILE_ATTR __m256 avx2_load_w(const void *w, int64_t at, int bf16)
{
    if (bf16) {
        __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)w + at));
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
    return _mm256_loadu_ps((const float *)w + at);
}

TILE_ATTR float w_at(const void *w, int64_t at, int bf16)
{
    return bf16 ? dflash_bf16_to_f32(((const uint16_t *)w)[at]) : ((const float *)w)[at];
}

TILE_ATTR void avx2_tile(const int R, const int C, const int bf16, const float *x, int64_t ldx, const void *w,
                         int64_t ldw, int64_t K, float *out, int64_t ldo, const float *scale)
{
    __m256 acc[4][3];
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++)
            acc[r][c] = _mm256_setzero_ps();
    int64_t k = 0;
    for (; k + 8 <= K; k += 8) {
        __m256 wv[3];
        for (int c = 0; c < C; c++)
            wv[c] = avx2_load_w(w, c * ldw + k, bf16);
        for (int r = 0; r < R; r++) {
            __m256 xv = _mm256_loadu_ps(x + r * ldx + k);
            for (int c = 0; c < C; c++)
                acc[r][c] = _mm256_fmadd_ps(xv, wv[c], acc[r][c]);
        }
    }
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) {
            float l[8];
            _mm256_storeu_ps(l, acc[r][c]);
            for (int64_t t = k; t < K; t++)
                l[t & 7] = fmaf(x[r * ldx + t], w_at(w, c * ldw + t, bf16), l[t & 7]);
            out[r * ldo + c] = lanes_sum(l) * scale[c];
        }
}

/* Dispatch a runtime (R <= 4, C <= 3) to its inlined instance. */
#define AVX2_CASE(R_, C_)                                                                                        \
    case (R_) * 4 + (C_):                                                                                        \
        if (bf16)                                                                                                \
            avx2_tile(R_, C_, 1, x, ldx, w, ldw, K, out, ldo, scale);                                            \
        else                                                                                                     \
            avx2_tile(R_, C_, 0, x, ldx, w, ldw, K, out, ldo, scale);                                            \
        break;

__attribute__((target("avx2,fma"))) static void avx2_tile_any(int R, int C, int bf16, const float *x,
                                                               int64_t ldx, const void *w, int64_t ldw, int64_t K,
                                                               float *out, int64_t ldo, const float *scale)
{
    switch (R * 4 + C) {
        AVX2_CASE(1, 1) AVX2_CASE(1, 2) AVX2_CASE(1, 3)
        AVX2_CASE(2, 1) AVX2_CASE(2, 2) AVX2_CASE(2, 3)
        AVX2_CASE(3, 1) AVX2_CASE(3, 2) AVX2_CASE(3, 3)
        AVX2_CASE(4, 1) AVX2_CASE(4, 2) AVX2_CASE(4, 3)
    default:
        break;
    }
}

/* AVX-512: a 16-lane register holds the 8 partial sums of two output
 * columns (low half column c, high half column c + 1), against x's 8
 * elements broadcast to both halves. */
#define TILE512_ATTR static inline __attribute__((always_inline, target("avx512f,avx2,fma")))

TILE512_ATTR __m512 avx512_load_w2(const void *w, int64_t at0, int64_t at1, int bf16)
{
    if (bf16) {
        __m128i lo = _mm_loadu_si128((const __m128i *)((const uint16_t *)w + at0));
        __m128i hi = _mm_loadu_si128((const __m128i *)((const uint16_t *)w + at1));
        __m256i h = _mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1);
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
    __m256d lo = _mm256_castps_pd(_mm256_loadu_ps((const float *)w + at0));
    __m256d hi = _mm256_castps_pd(_mm256_loadu_ps((const float *)w + at1));
    return _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castpd256_pd512(lo), hi, 1));
}

/* R (<= 8) rows x C2 (<= 3) column pairs: 24 accumulators of the 32
 * registers. */
TILE512_ATTR void avx512_tile(const int R, const int C2, const int bf16, const float *x, int64_t ldx,
                              const void *w, int64_t ldw, int64_t K, float *out, int64_t ldo, const float *scale)
{
    __m512 acc[8][3];
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C2; c++)
            acc[r][c] = _mm512_setzero_ps();
    int64_t k = 0;
    for (; k + 8 <= K; k += 8) {
        __m512 wv[3];
        for (int c = 0; c < C2; c++)
            wv[c] = avx512_load_w2(w, 2 * c * ldw + k, (2 * c + 1) * ldw + k, bf16);
        for (int r = 0; r < R; r++) {
            __m512 xv = _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_castps_pd(_mm256_loadu_ps(x + r * ldx + k))));
            for (int c = 0; c < C2; c++)
                acc[r][c] = _mm512_fmadd_ps(xv, wv[c], acc[r][c]);
        }
    }
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C2; c++) {
            float l[16];
            _mm512_storeu_ps(l, acc[r][c]);
            for (int h = 0; h < 2; h++) {
                const int64_t col = 2 * c + h;
                for (int64_t t = k; t < K; t++)
                    l[8 * h + (t & 7)] = fmaf(x[r * ldx + t], w_at(w, col * ldw + t, bf16), l[8 * h + (t & 7)]);
                out[r * ldo + col] = lanes_sum(l + 8 * h) * scale[col];
            }
        }
}

#define AVX512_CASE(R_, C2_)                                                                                     \
    case (R_) * 4 + (C2_):                                                                                       \
        if (bf16)                                                                                                \
            avx512_tile(R_, C2_, 1, x, ldx, w, ldw, K, out, ldo, scale);                                         \
        else                                                                                                     \
            avx512_tile(R_, C2_, 0, x, ldx, w, ldw, K, out, ldo, scale);                                         \
        break;

/* C columns (<= 6): pairs through the 16-lane tile, an odd last column
 * through the AVX2 one (same order either way). */
__attribute__((target("avx512f,avx2,fma"))) static void avx512_tile_any(int R, int C, int bf16, const float *x,
                                                                         int64_t ldx, const void *w, int64_t ldw,
                                                                         int64_t K, float *out, int64_t ldo,
                                                                         const float *scale)
{
    switch (R * 4 + C / 2) {
        AVX512_CASE(1, 1) AVX512_CASE(1, 2) AVX512_CASE(1, 3)
        AVX512_CASE(2, 1) AVX512_CASE(2, 2) AVX512_CASE(2, 3)
        AVX512_CASE(3, 1) AVX512_CASE(3, 2) AVX512_CASE(3, 3)
        AVX512_CASE(4, 1) AVX512_CASE(4, 2) AVX512_CASE(4, 3)
        AVX512_CASE(5, 1) AVX512_CASE(5, 2) AVX512_CASE(5, 3)
        AVX512_CASE(6, 1) AVX512_CASE(6, 2) AVX512_CASE(6, 3)
        AVX512_CASE(7, 1) AVX512_CASE(7, 2) AVX512_CASE(7, 3)
        AVX512_CASE(8, 1) AVX512_CASE(8, 2) AVX512_CASE(8, 3)
    default:
        break;
    }
    if (C & 1) {
        const int64_t last = C - 1;
        const size_t es = bf16 ? 2 : 4;
        for (int r = 0; r < R; r += 4) /* the AVX2 tile takes 4 rows at most */
            avx2_tile_any(R - r < 4 ? R - r : 4, 1, bf16, x + r * ldx, ldx, (const char *)w + (size_t)(last * ldw) * es,
                          ldw, K, out + r * ldo + last, ldo, scale + last);
    }
}

#endif /* GEMM_X86 */

typedef void (*tile_fn)(int R, int C, int bf16, const float *x, int64_t ldx, const void *w, int64_t ldw,
                        int64_t K, float *out, int64_t ldo, const float *scale);

/* Columns c0..c1 for all rows with a tile kernel: chunks of columns whose
 * weights stay in cache while every row tile (max_r rows) walks them.
 * bf16 and f32 weights are read in place; f16 and fp8 are widened per
 * tile into wbuf ([max_c, K] f32), once for all rows of the tile. */
static void gemm_tiles(tile_fn tile, int max_r, int max_c, const float *x, int n, const dflash_weight *w, float *out,
                       int64_t c0, int64_t c1, int64_t chunk, float *wbuf)
{
    const int64_t K = w->cols, N = w->rows;
    const int in_place = w->dtype == DFLASH_DTYPE_BF16 || w->dtype == DFLASH_DTYPE_F32;
    const int bf16 = w->dtype == DFLASH_DTYPE_BF16;
    const size_t es = dflash_dtype_size(w->dtype);
    float ones[6] = { 1, 1, 1, 1, 1, 1 }, sc[6];
    for (int64_t cc = c0; cc < c1; cc += chunk) {
        const int64_t ce = cc + chunk < c1 ? cc + chunk : c1;
        for (int i = 0; i < n; i += max_r) {
            const int R = n - i < max_r ? n - i : max_r;
            for (int64_t c = cc; c < ce; c += max_c) {
                const int C = ce - c < max_c ? (int)(ce - c) : max_c;
                const float *scale = ones;
                if (w->dtype == DFLASH_DTYPE_F8_E4M3) {
                    for (int j = 0; j < C; j++)
                        sc[j] = w->scales[c + j];
                    scale = sc;
                }
                if (in_place) {
                    tile(R, C, bf16, x + (int64_t)i * K, K, (const char *)w->data + (size_t)(c * K) * es, K, K,
                         out + (int64_t)i * N + c, N, scale);
                } else {
                    for (int j = 0; j < C; j++)
                        dflash_cpu_weight_row(w, c + j, wbuf + j * K);
                    tile(R, C, 0, x + (int64_t)i * K, K, wbuf, K, K, out + (int64_t)i * N + c, N, scale);
                }
            }
        }
    }
}

static dflash_cpu_isa isa_detect(void)
{
#if GEMM_X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        return DFLASH_CPU_ISA_AVX512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        return DFLASH_CPU_ISA_AVX2;
#endif
    return DFLASH_CPU_ISA_PORTABLE;
}

_Static_assert(DFLASH_CPU_ISA_AVX512 + 1 == DFLASH_CPU_ISA_COUNT, "dflash_cpu_isa_names lists every dflash_cpu_isa");

const char *dflash_cpu_isa_name(dflash_cpu_isa isa)
{
    return isa >= 0 && isa < DFLASH_CPU_ISA_COUNT ? dflash_cpu_isa_names[isa] : "?";
}

dflash_cpu_isa dflash_cpu_isa_best(void)
{
    /* Threads may race to fill it; all store the same value. */
    static atomic_int best = -1;
    int b = atomic_load_explicit(&best, memory_order_relaxed);
    if (b < 0) {
        b = (int)isa_detect();
        atomic_store_explicit(&best, b, memory_order_relaxed);
    }
    return (dflash_cpu_isa)b;
}

dflash_cpu_isa dflash_cpu_isa_active(void)
{
    const int want = dflash_levers_get()->cpu_isa, best = (int)dflash_cpu_isa_best();
    /* unset, or more than the machine has: the best */
    return (dflash_cpu_isa)(want < 0 || want > best ? best : want);
}

/* One call's work, cut into column chunks for the pool. */
typedef struct gemm_job {
    tile_fn tile;
    int max_r, max_c;
    const float *x;
    int n;
    const dflash_weight *w;
    float *out;
    int need_buf;
    int64_t per; /* columns per chunk, a multiple of max_c */
    atomic_int oom;
} gemm_job;

static void gemm_chunk(void *ctx, int i)
{
    gemm_job *j = ctx;
    const int64_t K = j->w->cols, N = j->w->rows;
    const int64_t c0 = (int64_t)i * j->per, c1 = c0 + j->per < N ? c0 + j->per : N;
    float *wbuf = j->need_buf ? dflash_cpu_scratch((size_t)j->max_c * (size_t)(K > 0 ? K : 1)) : NULL;
    if (j->need_buf && !wbuf) {
        atomic_store(&j->oom, 1);
        return;
    }
    if (!j->tile) {
        gemm_portable(j->x, j->n, j->w, j->out, c0, c1, wbuf);
    } else {
        /* cache chunks: the weights of one stay in L2 while every row tile walks them */
        int64_t chunk = GEMM_CHUNK_BYTES / (K * (int64_t)dflash_dtype_size(j->w->dtype) + 1);
        chunk = chunk < j->max_c ? j->max_c : chunk / j->max_c * j->max_c;
        gemm_tiles(j->tile, j->max_r, j->max_c, j->x, j->n, j->w, j->out, c0, c1, chunk, wbuf);
    }
}

dflash_status dflash_cpu_gemm(dflash_cpu_isa isa, const float *x, int n, const dflash_weight *w, float *out)
{
    const int64_t K = w->cols, N = w->rows;
    if (isa > dflash_cpu_isa_best())
        isa = dflash_cpu_isa_best();
    if (n <= 0 || N <= 0)
        return DFLASH_OK;
    tile_fn tile = NULL;
    int max_r = 1, max_c = 1;
#if GEMM_X86
    if (isa == DFLASH_CPU_ISA_AVX512) {
        tile = avx512_tile_any;
        max_r = 8;
        max_c = 6;
    } else if (isa == DFLASH_CPU_ISA_AVX2) {
        tile = avx2_tile_any;
        max_r = 4;
        max_c = 3;
    }
#endif
    gemm_job j = { tile, max_r, max_c, x, n, w, out, 0, 0, ATOMIC_VAR_INIT(0) };
    /* a widened weight buffer: per row (portable) or per tile (f16, fp8) */
    j.need_buf = !tile || (w->dtype != DFLASH_DTYPE_BF16 && w->dtype != DFLASH_DTYPE_F32);
    /* Column chunks, whole tiles each, a few per thread so that a thread
     * that runs late holds up little (cpu_pool.c). */
    const int64_t tiles = (N + max_c - 1) / max_c;
    int n_chunks = 1;
    if ((int64_t)n * K * N >= GEMM_PAR_MIN) {
        int64_t want = 4 * (int64_t)dflash_cpu_pool_threads();
        n_chunks = (int)(tiles < want ? tiles : want);
    }
    j.per = (tiles + n_chunks - 1) / n_chunks * max_c;
    n_chunks = (int)((N + j.per - 1) / j.per);
    dflash_cpu_pool_run(gemm_chunk, &j, n_chunks);
    if (atomic_load(&j.oom))
        return dflash_fail(DFLASH_ERR_OOM, "cpu linear: out of memory for a %lld-element weight buffer", (long long)K);
    return DFLASH_OK;
}
