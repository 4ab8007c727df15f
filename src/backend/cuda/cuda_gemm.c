/* cuda_gemm.c: the CUDA launchers of the linear ops: linear, linear_group
 * (q/k/v in one launch, gate/up with SwiGLU), linear_argmax (LM head and
 * argmax without writing logits) and linear_experts (a MoE layer's experts
 * in one launch), on the tensor-core kernels where the weights allow
 * (gemm.cu, or gemm_wide.cu from DFLASH_CUDA_GEMM_WIDE rows, 65 by
 * default: the same bits), else on the general linear.cu kernel. Owns the
 * choice of split-K, of the kernel and its tile, and the GEMM's
 * workspaces. */
#include <string.h>

#include "backend/cuda/cuda_internal.h"
#include "core/levers.h"

/* Mirrors struct gemm_args in kernels/gemm_mma.cuh (passed by value). */
typedef struct gemm_args {
    const void *w[DFLASH_GROUP_MAX_W]; /* GM_MAX_W */
    const float *scales[DFLASH_GROUP_MAX_W];
    float *out[DFLASH_GROUP_MAX_W];
    int64_t n[DFLASH_GROUP_MAX_W];
    int64_t blocks[DFLASH_GROUP_MAX_W];
    const float *x;
    int64_t k;
    float *ws;
    int *counters;
    float *am_val;
    int *am_idx;
    int *am_bad;
    const float *gate;
    const int32_t *x_rows;
    const float *sum_src;
    const int32_t *sum_idx;
    const float *sum_w;
    int m, n_w, split, mode, store, sum_k;
    int share_sum;
} gemm_args;
_Static_assert(sizeof(gemm_args) == 288, "gemm_args must match kernels/gemm_mma.cuh");

/* Mirrors struct gemm_group_args in kernels/gemm.cu. */
typedef struct gemm_group_args {
    gemm_args base;
    const void *const *wtab;
    const float *const *stab;
    const int32_t *first;
    int n_experts, tile_rows, blocks_per_tile;
    int chain;
} gemm_group_args;
_Static_assert(sizeof(gemm_group_args) == 328, "gemm_group_args must match kernels/gemm.cu");

/* gemm_mma.cuh's GM_* modes */
enum { GEMM_STORE = 0, GEMM_SWIGLU = 1, GEMM_ARGMAX = 2, GEMM_GATED_ADD = 3, GEMM_PARTIALS = 4 };
#define GEMM_RB 128   /* weight rows per block (gemm_mma.cuh GM_RB) */
#define GEMM_MAX_M 64 /* activation rows per launch */
#define GEMM_MAX_SPLIT 16 /* at most 16: gemm.cu's count word has 16 bits for shares left to the last slice */

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
    return cuda_launch(c, vec ? k[t].v : k[t].s, (unsigned)blocks, 1, 256, args);
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

/* Split-K factor for `rb` row blocks and K of k_steps 16-byte loads per
 * thread group. A block of one slice streams its weights a chunk (L_REF
 * loads per thread) ahead of use, so its time is about one memory round
 * trip per chunk; every slice beyond the first adds a round trip for its
 * partial sums (store, fence, arrival count) per wave and one for the
 * last block's reduction, whose loads are all in flight at once. With
 * waves(S) = ceil(rb S / resident blocks), the estimate is
 *     waves(S) * (chunks(S) + [S > 1]) + [S > 1]
 * round trips, and the smallest S of the lowest estimate wins (any S up
 * to GEMM_MAX_SPLIT: filling the resident slots matters more than equal
 * slices). A function of the shape and the device only, never of the row
 * count: a row's sums do not depend on the batch it is in.
 * DFLASH_CUDA_GEMM_SPLIT=S uses that S instead (or the most K allows),
 * for measurements. */
static int gemm_split(const cuda_ctx *c, int64_t rb, int64_t k_steps)
{
    enum { L_REF = 4 }; /* loads per chunk at 16 rows (gemm.cu GM_LOADS) */
    const int64_t slots = 2LL * c->sm_count; /* two blocks of 8 warps per SM (launch bounds) */
    int best = 1;
    int64_t best_cost = 0;
    for (int S = 1; S <= GEMM_MAX_SPLIT; S++) {
        if (S > 1 && k_steps / S < 1)
            break;
        const int64_t waves = (rb * S + slots - 1) / slots, per = (k_steps + S - 1) / S;
        const int64_t cost = waves * ((per + L_REF - 1) / L_REF + (S > 1)) + (S > 1);
        if (c->gemm_split > 0 ? S <= c->gemm_split : (S == 1 || cost < best_cost)) {
            best = S;
            best_cost = cost;
        }
    }
    return best;
}

/* The argmax partials of `rows` activation rows over `rb` row blocks,
 * for the GEMM's argmax epilogue and dflash_argmax_finish. */
static dflash_status argmax_reserve(cuda_ctx *c, gemm_args *ga, int64_t rows, int64_t rb)
{
    DFLASH_TRY(cuda_buf_reserve(c, &c->am_val, (size_t)(rows * rb) * sizeof(float), 0));
    DFLASH_TRY(cuda_buf_reserve(c, &c->am_idx, (size_t)(rows * rb) * sizeof(int), 0));
    DFLASH_TRY(cuda_buf_reserve(c, &c->am_bad, (size_t)rows * sizeof(int), 1)); /* zero between calls */
    ga->am_val = HPTR(c->am_val.p);
    ga->am_idx = HPTR(c->am_idx.p);
    ga->am_bad = HPTR(c->am_bad.p);
    return DFLASH_OK;
}

static dflash_status argmax_finish(cuda_ctx *c, gemm_args *ga, int rows, int64_t rb, int32_t *ids)
{
    int nb = (int)rb;
    void *fargs[] = { &ga->am_val, &ga->am_idx, &ga->am_bad, &nb, &ids };
    return cuda_launch(c, DFK_ARGMAX_FINISH, (unsigned)rows, 1, 256, fargs);
}

/* The tile of activation rows gemm_wide.cu takes for n rows of `rb` row
 * blocks. The bf16 kernels run one block per SM, so a launch takes about
 * ceil(blocks / SMs) waves, each as long as one block: on the H200 a
 * block of 128 rows takes ~1.7x one of 64 (95 against 56 us per 4096 of
 * k), so 128 wins where it needs fewer waves than 10/17 of 64's (blocks
 * count padded rows, so padding is priced in). 32 when 64-row blocks would
 * leave more than half of the SMs idle. A tile the device lacks the
 * shared memory for steps down; 0 when no kernel fits it. The tile changes
 * no result bit, only the speed. */
static int wide_tile(const cuda_ctx *c, int n, int64_t rb, int fp8)
{
    static const dflash_cuda_kernel_id k_bf16[3] = { DFK_GEMM_WIDE_BF16_32, DFK_GEMM_WIDE_BF16_64,
                                                     DFK_GEMM_WIDE_BF16_128 };
    static const dflash_cuda_kernel_id k_fp8[3] = { DFK_GEMM_WIDE_FP8_32, DFK_GEMM_WIDE_FP8_64, DFK_GEMM_WIDE_FP8_128 };
    const int64_t sm = c->sm_count, b64 = rb * ((n + 63) / 64), b128 = rb * ((n + 127) / 128);
    int i = 0; /* tile 32 << i */
    if (b64 >= (sm - sm / 8) / 2)
        i = (b128 + sm - 1) / sm * 17 < (b64 + sm - 1) / sm * 10 ? 2 : 1;
    if (c->gemm_tile)
        i = c->gemm_tile == 128 ? 2 : c->gemm_tile == 64 ? 1 : 0;
    for (int j = i; j >= 0; j--)
        if (cuda_kernel_fits(c, fp8 ? k_fp8[j] : k_bf16[j]))
            return 32 << j;
    for (int j = i + 1; j < 3; j++)
        if (cuda_kernel_fits(c, fp8 ? k_fp8[j] : k_bf16[j]))
            return 32 << j;
    return 0;
}

/* gemm_wide.cu over all n rows in tiles of mt: x split into hi/lo, then
 * one launch. */
static dflash_status gemm_wide_launch(cuda_ctx *c, gemm_args *ga, int n, int64_t rb, int fp8, int mt, int32_t *ids)
{
    const int64_t blocks = rb * ((n + mt - 1) / mt);
    if (blocks > 0x7fffffff)
        return dflash_fail(DFLASH_ERR_UNSUPPORTED, "cuda linear: %lld row blocks x %d rows", (long long)rb, n);
    ga->m = n;
    if (ga->mode == GEMM_ARGMAX)
        DFLASH_TRY(argmax_reserve(c, ga, n, rb));
    /* x split into bf16 hi/lo once, in mma fragment order, rows padded to
     * the tile (the padding zero), for every block to copy */
    int m_pad = (n + mt - 1) / mt * mt, fp8_arg = fp8;
    int64_t items = (int64_t)m_pad * ga->k / 8; /* an item: one lane's hi and lo fragments of 16 rows x a k16 step */
    DFLASH_TRY(cuda_buf_reserve(c, &c->gemm_xs, (size_t)m_pad * (size_t)ga->k * 4, 0));
    ga->ws = HPTR(c->gemm_xs.p);
    const int64_t split_blocks = (items + 255) / 256 < 8LL * c->sm_count ? (items + 255) / 256 : 8LL * c->sm_count;
    void *sargs[] = { (void *)&ga->x, &ga->ws, &n, &m_pad, &ga->k, &fp8_arg };
    DFLASH_TRY(cuda_launch(c, DFK_GEMM_SPLIT_X, (unsigned)split_blocks, 1, 256, sargs));
    const int ti = mt == 128 ? 2 : mt == 64 ? 1 : 0;
    const dflash_cuda_kernel_id k = (fp8 ? DFK_GEMM_WIDE_FP8_32 : DFK_GEMM_WIDE_BF16_32) + ti;
    void *args[] = { ga };
    DFLASH_TRY(cuda_launch(c, k, (unsigned)blocks, 1, 256, args));
    return ga->mode == GEMM_ARGMAX ? argmax_finish(c, ga, n, rb, ids) : DFLASH_OK;
}

/* The tensor-core launch of out[i] = x W[i]^T (or the SwiGLU pair, or the
 * row argmax into ids, or out[0] += sigmoid(gate) * x W^T, out[0] first set
 * to the gather_sum `sum` where given): from
 * c->gemm_wide rows one launch of gemm_wide.cu (where the device has its
 * shared memory), else launches of gemm.cu of at most GEMM_MAX_M rows
 * (each row's result is the same bits in any of them). */
static dflash_status gemm_launch(cuda_ctx *c, const float *x, int n, const dflash_weight *w, int n_w,
                                 float *const *out, int mode, const float *gate, const dflash_gather *sum,
                                 int32_t *ids)
{
    static const dflash_cuda_kernel_id k_bf16[4] = { DFK_GEMM_BF16_1, DFK_GEMM_BF16_2, DFK_GEMM_BF16_4,
                                                     DFK_GEMM_BF16_8 };
    static const dflash_cuda_kernel_id k_fp8[4] = { DFK_GEMM_FP8_1, DFK_GEMM_FP8_2, DFK_GEMM_FP8_4, DFK_GEMM_FP8_8 };
    const int fp8 = w[0].dtype == DFLASH_DTYPE_F8_E4M3;
    gemm_args ga;
    memset(&ga, 0, sizeof ga);
    int64_t rb = 0, n_ws = 0; /* n_ws: a workspace row, each weight's columns from a multiple of 4 */
    for (int i = 0; i < n_w; i++) {
        ga.w[i] = w[i].data;
        ga.scales[i] = w[i].scales;
        ga.n[i] = w[i].rows;
        ga.blocks[i] = (w[i].rows + GEMM_RB - 1) / GEMM_RB;
        rb += ga.blocks[i];
        n_ws += (w[i].rows + 3) / 4 * 4;
    }
    if (mode == GEMM_SWIGLU)
        rb = (w[0].rows + GEMM_RB / 2 - 1) / (GEMM_RB / 2); /* 64 gate + 64 up rows a block */
    ga.k = w[0].cols;
    ga.n_w = n_w;
    ga.mode = mode;
    ga.store = mode != GEMM_ARGMAX || out[0] != NULL;
    const int64_t k_steps = ga.k / (fp8 ? 64 : 32);
    ga.split = gemm_split(c, rb, k_steps);
    ga.x = x;
    ga.gate = gate;
    if (sum) {
        ga.sum_src = sum->src;
        ga.sum_idx = sum->idx;
        ga.sum_w = sum->w;
        ga.sum_k = sum->k;
    }
    for (int i = 0; i < n_w; i++)
        ga.out[i] = out[i];
    const int mt = n >= c->gemm_wide ? wide_tile(c, n, rb, fp8) : 0;
    if (mt)
        return gemm_wide_launch(c, &ga, n, rb, fp8, mt, ids);
    const int64_t blocks = rb * ga.split;
    if (blocks > 0x7fffffff || rb > 0x7fffffff / GEMM_MAX_M)
        return dflash_fail(DFLASH_ERR_UNSUPPORTED, "cuda linear: %lld row blocks", (long long)rb);
    const int m_max = n < GEMM_MAX_M ? n : GEMM_MAX_M;
    /* The slices of a row block add its partials together (each an S-th
     * of the outputs) when every block of the launch can be resident at
     * once (two a SM by the kernel's launch bounds): a slice then waits
     * for its row block's other slices, which are all running or about
     * to (the next kernel cannot take their slots first: it launches
     * once every block of this one has started). Should another stream
     * hold slots, a slice stops waiting after SHARE_WAIT cycles and
     * leaves its share to the last slice. Only where the last slice
     * alone would take two or more passes over its 256 threads (more
     * than 8 rows; SwiGLU's half-width outputs: more than 16): with one
     * pass, waiting costs more than it saves (measured: 1-row decode
     * 3% slower). Not with argmax, whose epilogue reduces a row's 128
     * columns in one warp. */
    enum { SHARE_WAIT = 100000 }; /* ~50 us; a propose's slices arrive within ~3 us of each other */
    const int share_ok = c->gemm_share_sum && ga.split > 1 && mode != GEMM_ARGMAX && mode != GEMM_PARTIALS &&
                         blocks <= 2LL * c->sm_count;
    const int out_quads = mode == GEMM_SWIGLU ? GEMM_RB / 2 / 4 : GEMM_RB / 4; /* a row's outputs, 4 a thread */
    if (ga.split > 1) {
        DFLASH_TRY(cuda_buf_reserve(c, &c->gemm_ws, (size_t)ga.split * m_max * n_ws * sizeof(float), 0));
        DFLASH_TRY(cuda_buf_reserve(c, &c->gemm_cnt, (size_t)rb * sizeof(int), 1));
        ga.ws = HPTR(c->gemm_ws.p);
        ga.counters = HPTR(c->gemm_cnt.p);
    }
    if (mode == GEMM_ARGMAX)
        DFLASH_TRY(argmax_reserve(c, &ga, m_max, rb));
    for (int r0 = 0; r0 < n; r0 += GEMM_MAX_M) {
        const int m = n - r0 < GEMM_MAX_M ? n - r0 : GEMM_MAX_M;
        const int t = m <= 8 ? 0 : m <= 16 ? 1 : m <= 32 ? 2 : 3;
        ga.m = m;
        ga.share_sum = !share_ok || m * out_quads <= 256 ? 0 : c->gemm_share_sum == 2 ? 1 : SHARE_WAIT;
        ga.x = x + (int64_t)r0 * ga.k;
        ga.gate = gate ? gate + r0 : NULL;
        if (sum) { /* the launch's rows' terms; src is indexed by them */
            ga.sum_idx = sum->idx + (int64_t)r0 * sum->k;
            ga.sum_w = sum->w + (int64_t)r0 * sum->k;
        }
        for (int i = 0; i < n_w; i++)
            ga.out[i] = out[i] ? out[i] + (int64_t)r0 * w[i].rows : NULL;
        void *args[] = { &ga };
        DFLASH_TRY(cuda_launch(c, fp8 ? k_fp8[t] : k_bf16[t], (unsigned)blocks, 1, 256, args));
        if (mode == GEMM_ARGMAX)
            DFLASH_TRY(argmax_finish(c, &ga, m, rb, ids + r0));
    }
    return DFLASH_OK;
}

dflash_status cuda_linear(dflash_backend *be, const float *x, int n, const dflash_weight *w, float *out)
{
    cuda_ctx *c = CTX(be);
    DFLASH_TRY(cuda_check_weight(w, "linear"));
    if (n <= 0 || w->rows <= 0)
        return DFLASH_OK;
    DFLASH_TRY(cuda_enter(c));
    if (gemm_ok(x, w, 1))
        return gemm_launch(c, x, n, w, 1, &out, GEMM_STORE, NULL, NULL, NULL);
    return linear_simt(c, x, n, w, out);
}

dflash_status cuda_linear_group(dflash_backend *be, const float *x, int n, const dflash_weight *w, int n_w,
                                float *const *out, enum dflash_act act)
{
    cuda_ctx *c = CTX(be);
    for (int i = 0; i < n_w; i++)
        DFLASH_TRY(cuda_check_weight(&w[i], "linear"));
    if (n <= 0)
        return DFLASH_OK;
    DFLASH_TRY(cuda_enter(c));
    if (gemm_ok(x, w, n_w))
        return gemm_launch(c, x, n, w, n_w, out, act == DFLASH_ACT_SWIGLU ? GEMM_SWIGLU : GEMM_STORE, NULL, NULL,
                           NULL);
    /* weights that cannot share a launch (dtypes differ, say): each on
     * the best kernel it can take */
    for (int i = 0; i < n_w; i++)
        DFLASH_TRY(cuda_linear(be, x, n, &w[i], out[i]));
    if (act == DFLASH_ACT_SWIGLU)
        return be->ops->swiglu(be, out[0], out[1], (size_t)n * (size_t)w[0].rows, out[0]);
    return DFLASH_OK;
}

dflash_status cuda_linear_argmax(dflash_backend *be, const float *x, int n, const dflash_weight *w, float *logits,
                                 int32_t *ids)
{
    cuda_ctx *c = CTX(be);
    DFLASH_TRY(cuda_check_weight(w, "linear"));
    if (n <= 0)
        return DFLASH_OK;
    if (w->rows <= 0 || w->rows > 0x7fffffff)
        return dflash_fail(DFLASH_ERR_INVALID_ARG, "linear_argmax: weight %s has %lld rows", w->name ? w->name : "?",
                           (long long)w->rows);
    DFLASH_TRY(cuda_enter(c));
    if (gemm_ok(x, w, 1)) {
        float *none = NULL; /* the fused kernel never needs the logits */
        return gemm_launch(c, x, n, w, 1, &none, GEMM_ARGMAX, NULL, NULL, ids);
    }
    DFLASH_TRY(linear_simt(c, x, n, w, logits));
    return be->ops->argmax(be, logits, n, (int)w->rows, ids);
}

/* out += sigmoid(gate) * x W^T in the GEMM's epilogue (one launch for
 * three), with the composition's roundings, the routed sum `sum` written
 * first in the same epilogue (one launch less); the composition itself
 * where the tensor-core kernel cannot take the weight. */
dflash_status cuda_linear_gated_add(dflash_backend *be, const float *x, int n, const dflash_weight *w,
                                    const float *gate, float *tmp, float *out, const dflash_gather *sum)
{
    cuda_ctx *c = CTX(be);
    DFLASH_TRY(cuda_check_weight(w, "linear"));
    if (n <= 0 || w->rows <= 0)
        return DFLASH_OK;
    DFLASH_TRY(cuda_enter(c));
    if (gemm_ok(x, w, 1))
        return gemm_launch(c, x, n, w, 1, &out, GEMM_GATED_ADD, gate, sum, NULL);
    return dflash_be_linear_gated_add_composed(be, x, n, w, gate, tmp, out, sum); /* its linear takes linear_simt */
}

/* For a stage whose next launch adds the GEMM's split-K partials as it
 * reads them (cuda_internal.h). Declines (p->slices = 0, nothing
 * launched) where K is not split (no sum to move), the rows do not fit
 * one gemm.cu launch (its workspace holds one launch's partials), or
 * DFLASH_CUDA_GEMM_DEFER_SUM=0. */
dflash_status cuda_gemm_partials(cuda_ctx *c, const float *x, int n, const dflash_weight *w, int n_w,
                                 cuda_partials *p)
{
    memset(p, 0, sizeof *p);
    for (int i = 0; i < n_w; i++)
        DFLASH_TRY(cuda_check_weight(&w[i], "linear"));
    if (!c->gemm_defer_sum || n <= 0 || n > GEMM_MAX_M || n >= c->gemm_wide || !gemm_ok(x, w, n_w))
        return DFLASH_OK;
    int64_t rb = 0;
    for (int i = 0; i < n_w; i++) {
        p->off[i] = p->ld;
        p->ld += (w[i].rows + 3) / 4 * 4; /* gemm.cu's workspace row: each weight from a multiple of 4 */
        rb += (w[i].rows + GEMM_RB - 1) / GEMM_RB;
    }
    const int split = gemm_split(c, rb, w[0].cols / (w[0].dtype == DFLASH_DTYPE_F8_E4M3 ? 64 : 32));
    if (split < 2)
        return DFLASH_OK;
    DFLASH_TRY(cuda_enter(c));
    float *none[DFLASH_GROUP_MAX_W] = { NULL };
    DFLASH_TRY(gemm_launch(c, x, n, w, n_w, none, GEMM_PARTIALS, NULL, NULL, NULL));
    p->ws = HPTR(c->gemm_ws.p); /* reserved by the launch: slice s of row i at s * n * ld + i * ld */
    p->stride = (int64_t)n * p->ld;
    p->slices = split;
    return DFLASH_OK;
}

/* Every expert's weights on the tensor-core kernel, and the tables there? */
static int experts_gemm_ok(const dflash_experts_args *a)
{
    const float *x = a->x_rows ? a->x_src : a->x;
    if (!a->data || !aligned16(x))
        return 0;
    for (int i = 0; i < a->n_w; i++)
        if (a->w[i].dtype == DFLASH_DTYPE_F8_E4M3 && !a->scales)
            return 0;
    for (int e = 0; e < a->n_experts; e++)
        if (!gemm_ok(x, &a->w[(size_t)e * a->w_stride], a->n_w))
            return 0;
    return 1;
}

/* Work items per block of the grouped kernel: the most (a power of two
 * up to 8 dividing a tile's items) that still leaves three waves of
 * blocks over the tiles the rows can fill at most (one an expert, as the
 * rows are spread; a single row's few experts get one item a block).
 * Chaining only changes which block computes an item, never its sums, so
 * it may depend on the row count. DFLASH_CUDA_EXPERTS_CHAIN=N takes the
 * most up to N instead (read at each call: the ops check compares). */
static int experts_chain(const cuda_ctx *c, int64_t busy_tiles, int64_t per_tile)
{
    const int64_t want = 3LL * 2 * c->sm_count; /* three waves of two blocks per SM */
    const int lever = dflash_levers_get()->cuda_experts_chain, most = lever > 0 ? lever : 8;
    int chain = 1;
    while (chain * 2 <= most && per_tile % (chain * 2) == 0 &&
           (lever > 0 || busy_tiles * per_tile / (chain * 2) >= want))
        chain *= 2;
    return chain;
}

/* Split-K of the grouped kernel: gemm_split's, but at most k_steps /
 * EXPERTS_SLICE slices (a k-step: 64 bytes of a weight row), so slices
 * of about EXPERTS_SLICE k-steps or more. The round-trip model behind
 * gemm_split counts waves of blocks, and a grouped launch is several
 * waves whatever its split (its blocks are the busy experts' tiles), so
 * what more slices save in wave time they do not save here, while each
 * slice costs its partial sums' round trip; on the 35B-A3B experts the
 * gate/up projection (K 2048) runs faster in 2 slices than in the
 * model's 4 (docs/perf-notes.md). From the shape only, never the row
 * count. DFLASH_CUDA_EXPERTS_SLICE=N takes N instead (tuning). */
enum { EXPERTS_SLICE = 32 };
static int experts_split(const cuda_ctx *c, int64_t rb, int64_t k_steps)
{
    const int split = gemm_split(c, rb, k_steps), lever = dflash_levers_get()->cuda_experts_slice;
    const int64_t least = lever > 0 ? lever : EXPERTS_SLICE, most = k_steps / least > 1 ? k_steps / least : 1;
    return c->gemm_split > 0 || split <= most ? split : (int)most;
}

/* One launch of gemm.cu's grouped kernel over every expert's tiles: tiles
 * of 8 NT rows (NT from the rows a busy expert has on average), at most
 * min(experts, rows) + rows / tile of them, each rb x split work items,
 * `chain` of them a block; the split from the shape and the experts a row
 * activates, never from the row count. */
dflash_status cuda_linear_experts(dflash_backend *be, const dflash_experts_args *a)
{
    cuda_ctx *c = CTX(be);
    for (int i = 0; i < a->n_w; i++)
        DFLASH_TRY(cuda_check_weight(&a->w[i], "linear_experts"));
    if (!experts_gemm_ok(a))
        return dflash_be_linear_experts_each(be, a, NULL);
    DFLASH_TRY(cuda_enter(c));
    static const dflash_cuda_kernel_id k_bf16[4] = { DFK_GEMM_GROUP_BF16_1, DFK_GEMM_GROUP_BF16_2,
                                                     DFK_GEMM_GROUP_BF16_4, DFK_GEMM_GROUP_BF16_8 };
    static const dflash_cuda_kernel_id k_fp8[4] = { DFK_GEMM_GROUP_FP8_1, DFK_GEMM_GROUP_FP8_2, DFK_GEMM_GROUP_FP8_4,
                                                    DFK_GEMM_GROUP_FP8_8 };
    const dflash_weight *w = a->w;
    const int fp8 = w[0].dtype == DFLASH_DTYPE_F8_E4M3, swiglu = a->act == DFLASH_ACT_SWIGLU;
    gemm_group_args g;
    memset(&g, 0, sizeof g);
    int64_t n_ws = 0;
    for (int i = 0; i < a->n_w; i++) {
        g.base.n[i] = w[i].rows;
        g.base.blocks[i] = (w[i].rows + GEMM_RB - 1) / GEMM_RB;
        g.base.out[i] = a->out[i];
        n_ws += (w[i].rows + 3) / 4 * 4;
    }
    const int64_t rb = swiglu ? (w[0].rows + GEMM_RB / 2 - 1) / (GEMM_RB / 2) : g.base.blocks[0];
    g.base.k = w[0].cols;
    g.base.n_w = a->n_w;
    g.base.mode = swiglu ? GEMM_SWIGLU : GEMM_STORE;
    g.base.store = 1;
    g.base.x = a->x_rows ? a->x_src : a->x;
    g.base.x_rows = a->x_rows; /* the gate/up projection reads its rows where they are */
    g.base.split = experts_split(c, rb * (a->per_row > 0 ? a->per_row : 1), g.base.k / (fp8 ? 64 : 32));
    /* Tile rows: a tile costs the mma work of all its rows however many
     * it holds, and an expert with more rows than a tile reads its
     * weights once per tile. Routed rows spread over the experts, so the
     * tile is sized for four times the mean rows of a busy expert (room
     * for skewed routing; a 16-row verify of top-8 of 256 has a mean of
     * 1, so 8-row tiles, not 16), never above the most one expert can
     * have. Which rows share a tile does not change any row's sums. */
    const int64_t busy = a->n_experts < a->rows ? a->n_experts : a->rows;
    const int64_t room = busy > 0 ? 4 * ((a->rows + busy - 1) / busy) : 1;
    const int lever = dflash_levers_get()->cuda_experts_tile; /* DFLASH_CUDA_EXPERTS_TILE, for measurement */
    const int64_t want = lever > 0 ? lever : a->max_rows < room ? a->max_rows : room;
    const int t = want <= 8 ? 0 : want <= 16 ? 1 : want <= 32 ? 2 : 3;
    const int tm = 8 << t;
    const int64_t tiles = busy + a->rows / tm; /* sum over experts of ceil(rows_e / tm) is at most this */
    const int64_t per_tile = rb * g.base.split;
    if (tiles * per_tile > 0x7fffffff)
        return dflash_fail(DFLASH_ERR_UNSUPPORTED, "cuda linear_experts: %lld tiles of %lld blocks",
                           (long long)tiles, (long long)per_tile);
    if (g.base.split > 1) {
        DFLASH_TRY(cuda_buf_reserve(c, &c->gemm_ws, (size_t)g.base.split * (size_t)a->rows * (size_t)n_ws * 4, 0));
        DFLASH_TRY(cuda_buf_reserve(c, &c->gemm_cnt, (size_t)(tiles * rb) * sizeof(int), 1));
        g.base.ws = HPTR(c->gemm_ws.p);
        g.base.counters = HPTR(c->gemm_cnt.p);
    }
    g.wtab = a->data;
    g.stab = fp8 ? a->scales : NULL;
    g.first = a->first;
    g.n_experts = a->n_experts;
    g.tile_rows = tm;
    g.blocks_per_tile = (int)per_tile;
    g.chain = experts_chain(c, busy, per_tile);
    void *args[] = { &g };
    return cuda_launch(c, fp8 ? k_fp8[t] : k_bf16[t], (unsigned)(tiles * per_tile / g.chain), 1, 256, args);
}
