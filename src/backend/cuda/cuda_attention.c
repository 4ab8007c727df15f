/* cuda_attention.c: the CUDA launchers of kv_write and attention: page
 * writes (f32 or bf16 pages), the tensor-core kernel for bf16 pages with
 * its key-split partials and their merge, and the general kernel for
 * everything else (f32 pages, other head sizes). */
#include <string.h>

#include "backend/cuda/cuda_internal.h"
#include "core/levers.h"

/* Mirrors struct attn_tc_args in kernels/attention_tc.cu. */
typedef struct attn_tc_args {
    const float *q;
    float *out;
    const int32_t *q_pos, *seq_info;
    const void *pool;
    const int32_t *page_tables;
    const float *k_extra, *v_extra;
    void *part_o, *part_ml, *eflag, *ehost;
    float scale;
    int n_pages, n_layers, layer, pt_len;
    int n_rows, n_heads, n_kv_heads, causal, window, compute_warps;
    int max_splits;
    cuda_attn_fuse fu;
} attn_tc_args;
_Static_assert(sizeof(attn_tc_args) == 344, "attn_tc_args must match kernels/attention_tc.cu");

/* Keys per split (attention.cu's and attention_tc.cu's AT_SPLIT; the
 * tensor-core kernel's splits from key ATTN_TC_LONG_FROM on are
 * ATTN_TC_LONG_SPLIT long), query vectors per block of attention_tc.cu
 * (halved where two warps share a query tile). */
#define ATTN_TC_SPLIT 128
#define ATTN_TC_LONG_FROM 4096
#define ATTN_TC_LONG_SPLIT 256
#define ATTN_TC_QV 128
#define ATTN_TC_MAX_SPLITS 2048 /* attention_tc.cu AT_MAX_SPLITS, the merge's */
/* The most keys a block walks, in units of ATTN_TC_SPLIT. attention_tc.cu
 * keeps 32 short splits' page-table entries a block (AT_PAGE_SLOTS, 288);
 * a walk of c units takes at most 9c + 8 of them, since a sequence's last
 * split counts by its keys (one unit for up to 128) but takes a long
 * split's 17 entries. Room for 31 units keeps one sequence whose bound is
 * up to 130944 keys (33 blocks x 31 units; 8 KV heads) in one wave of
 * 4-warp blocks. */
#define ATTN_TC_ROOM 31
/* A call of one query tile (at most 16 query vectors a sequence and KV
 * head, as a decode's) whose blocks walk this many units or more at four
 * warps takes blocks of two warps: past the one that computes, the warps
 * only issue tile copies, and an SM holds more of the smaller blocks
 * (registers bound it). Measured on the H200 for the 8B decode (head_dim
 * 128, 8 KV heads; docs/perf-notes.md): two warps win at ctx 32768 and
 * up and lose at ctx 16384, whose bound on the keys (a graph's bucket,
 * 24576) walks 6 units. */
#define ATTN_TC_FEW_WARPS_WALK 7

/* Splits of `keys` keys in the tensor-core kernel's numbering (its
 * at_n_splits). */
static int tc_splits(int keys)
{
    if (keys <= ATTN_TC_LONG_FROM)
        return (keys + ATTN_TC_SPLIT - 1) / ATTN_TC_SPLIT;
    return ATTN_TC_LONG_FROM / ATTN_TC_SPLIT + (keys - ATTN_TC_LONG_FROM + ATTN_TC_LONG_SPLIT - 1) / ATTN_TC_LONG_SPLIT;
}

/* The most keys, in units of ATTN_TC_SPLIT, any of gy blocks walks
 * for a sequence of `keys` keys (attention_tc.cu's at_walk_of: c). It
 * grows with the keys, so the call's bound on them bounds every
 * sequence's walks. */
static int tc_walk_width(int keys, int gy)
{
    const int w = ATTN_TC_LONG_SPLIT / ATTN_TC_SPLIT, n = keys > 0 ? tc_splits(keys) : 1;
    const int shorts = n < ATTN_TC_LONG_FROM / ATTN_TC_SPLIT ? n : ATTN_TC_LONG_FROM / ATTN_TC_SPLIT;
    const int longs = n - shorts, units = keys > ATTN_TC_SPLIT ? (keys + ATTN_TC_SPLIT - 1) / ATTN_TC_SPLIT : 1;
    const int w_last =
        longs > 0 ? (keys - ATTN_TC_LONG_FROM - (longs - 1) * ATTN_TC_LONG_SPLIT + ATTN_TC_SPLIT - 1) / ATTN_TC_SPLIT
                  : 0;
    const int q = longs / gy, r = longs % gy;
    const int c_long = longs == 0 ? 0
                       : r >= 2   ? w * (q + 1)
                       : r == 1   ? w * q + w_last
                                  : w * q - (gy == 1 ? w - w_last : 0);
    const int c_keys = (units + gy - 1) / gy;
    return c_keys > c_long ? c_keys : c_long;
}

dflash_status cuda_check_kv(const dflash_kv_layout *kv, int layer, const char *op)
{
    if (kv->dtype != DFLASH_DTYPE_F32 && kv->dtype != DFLASH_DTYPE_BF16)
        return dflash_fail(DFLASH_ERR_UNSUPPORTED, "cuda %s: KV pool dtype %s (F32 or BF16)", op,
                           dflash_dtype_name(kv->dtype));
    if (layer < 0 || layer >= kv->n_layers)
        return dflash_fail(DFLASH_ERR_INVALID_ARG, "cuda %s: layer %d outside the pool's %d layers", op, layer,
                           kv->n_layers);
    return DFLASH_OK;
}

dflash_status cuda_check_kv_store(const dflash_kv_layout *kv, int layer, int pt_len, const char *op)
{
    DFLASH_TRY(cuda_check_kv(kv, layer, op));
    if (pt_len <= 0)
        return dflash_fail(DFLASH_ERR_INVALID_ARG, "cuda %s: page table length %d", op, pt_len);
    return DFLASH_OK;
}

dflash_status cuda_kv_write(dflash_backend *be, const dflash_kv_layout *kv, int layer,
                                   const int32_t *page_tables, int pt_len, const int32_t *row_seq,
                                   const int32_t *pos, const float *k, const float *v, int n)
{
    cuda_ctx *c = CTX(be);
    DFLASH_TRY(cuda_check_kv_store(kv, layer, pt_len, "kv_write"));
    if (n <= 0)
        return DFLASH_OK;
    DFLASH_TRY(cuda_enter(c));
    int bf16 = kv->dtype == DFLASH_DTYPE_BF16, n_pages = kv->n_pages, n_layers = kv->n_layers;
    int n_kv_heads = kv->n_kv_heads, head_dim = kv->head_dim;
    void *args[] = { (void *)&kv->data, &bf16, &n_pages, &n_layers, &layer, &n_kv_heads, &head_dim,
                     (void *)&page_tables, &pt_len, (void *)&row_seq, (void *)&pos, (void *)&k, (void *)&v,
                     &c->err_flag, &c->err_host_dev };
    return cuda_launch(c, DFK_KV_WRITE, (unsigned)n, 2, row_threads((int64_t)n_kv_heads * head_dim, 256), args);
}

/* Room for the partials of `splits` key splits of every (row, head). */
static dflash_status part_reserve(cuda_ctx *c, int splits, int n_rows, int n_heads, int D)
{
    const size_t units = (size_t)splits * n_rows * n_heads;
    DFLASH_TRY(cuda_buf_reserve(c, &c->part_o, units * D * sizeof(float), 0));
    return cuda_buf_reserve(c, &c->part_ml, units * 2 * sizeof(float), 0);
}

/* Merge the key splits' partials of rows whose sequence has several;
 * long_splits: the tensor-core kernel's numbering, else splits of
 * ATTN_TC_SPLIT keys (the general kernel's); max_splits: the partials'
 * room (part_reserve's splits). */
static dflash_status combine_splits(cuda_ctx *c, const dflash_attn_args *a, int long_splits, int max_splits)
{
    int n_rows = a->n_rows, n_heads = a->n_heads, has_extra = a->k_extra != NULL, D = a->head_dim;
    void *cargs[] = { &c->part_o.p, &c->part_ml.p, (void *)&a->out, (void *)&a->row_seq, (void *)&a->seq_info,
                      &n_rows, &n_heads, &has_extra, &D, &long_splits, &max_splits };
    return cuda_launch(c, D <= 128 ? DFK_ATTN_COMBINE : DFK_ATTN_COMBINE_512, (unsigned)n_rows, (unsigned)n_heads, 256,
                       cargs);
}

/* The general attention kernel: one block per (row, head, key split of
 * ATTN_TC_SPLIT keys: attention.cu's tile), then the merge. */
static dflash_status attention_simt(cuda_ctx *c, const dflash_attn_args *a)
{
    const void *pool = a->kv ? a->kv->data : NULL;
    int n_pages = a->kv ? a->kv->n_pages : 0, n_layers = a->kv ? a->kv->n_layers : 1;
    int layer = a->layer, pt_len = a->pt_len > 0 ? a->pt_len : 1;
    int n_heads = a->n_heads, n_kv_heads = a->n_kv_heads, D = a->head_dim, causal = a->causal, window = a->window;
    float scale = a->scale;
    int vec = D % 4 == 0 && aligned16(pool) && aligned16(a->k_extra);
    const int splits = a->max_keys > 0 ? (a->max_keys + ATTN_TC_SPLIT - 1) / ATTN_TC_SPLIT : 1;
    if (splits > ATTN_TC_MAX_SPLITS)
        return dflash_fail(DFLASH_ERR_UNSUPPORTED, "cuda attention: %d keys (at most %d)", a->max_keys,
                           ATTN_TC_MAX_SPLITS * ATTN_TC_SPLIT);
    if (splits > 1)
        DFLASH_TRY(part_reserve(c, splits, a->n_rows, a->n_heads, D));
    void *args[] = { (void *)&a->q, (void *)&a->out, (void *)&a->q_pos, (void *)&a->row_seq, (void *)&a->seq_info,
                     (void *)&pool, &n_pages, &n_layers, &layer, (void *)&a->page_tables, &pt_len,
                     (void *)&a->k_extra, (void *)&a->v_extra, &n_heads, &n_kv_heads, &D, &scale, &causal,
                     &window, &vec, &c->part_o.p, &c->part_ml.p, &c->err_flag, &c->err_host_dev };
    const int bf16 = a->kv && a->kv->dtype == DFLASH_DTYPE_BF16;
    DFLASH_TRY(cuda_launch3(c, bf16 ? DFK_ATTENTION_BF16 : DFK_ATTENTION_F32, (unsigned)a->n_rows,
                            (unsigned)a->n_heads, (unsigned)splits, 128, args));
    return splits > 1 ? combine_splits(c, a, 0, splits) : DFLASH_OK;
}

/* Where one wave of blocks cannot hold walks that fit the page-table
 * room, the blocks run in waves, and a grid of y_fit blocks a sequence
 * (the fewest that fit) can leave a last wave nearly empty while it takes
 * as long as a full one. Of the grids from y_fit up, this returns the one
 * of least k * (c + 1): k waves of `slots` blocks, a walk of c units, 1
 * for a block's start and end; of grids as good in as many waves, the
 * most blocks (the waves filled: shorter walks at no cost). At most one
 * pass over the splits. */
static int tc_fewest_waves(int keys, int y_fit, int splits, int64_t others, int64_t slots)
{
    int best_y = y_fit;
    int64_t best = -1, best_k = 0;
    for (int y = y_fit; y <= splits; y++) {
        const int64_t k = (others * y + slots - 1) / slots;
        if (best >= 0 && 2 * k >= best)
            break; /* c + 1 >= 2: no grid of more waves can win */
        const int64_t cost = k * (tc_walk_width(keys, y) + 1);
        if (best < 0 || cost < best || (cost == best && k == best_k))
            best = cost, best_k = k, best_y = y;
    }
    return best_y;
}

/* Blocks along the key splits of the tensor-core kernel (block y walks
 * its share of the splits, attention_tc.cu's at_walk_of: the same bits
 * however many).
 * A block of one split pays its start (the page table, the queries, the
 * first tiles' round trip) and its end for 128 keys, so where a call has
 * more splits than one wave of blocks holds (long contexts), the blocks
 * that would run in later waves are folded into the first, their tile
 * copies running on across each split's end. `keys` and `splits` come
 * from the call's bound on the keys (a graph's bucket, often twice the real
 * count), so gy is sized by the device, never by that bound: a sequence
 * with fewer splits than gy leaves the blocks past them idle. gy grows
 * until every block's walk fits the kernel's page-table room, in whole
 * waves where one does not hold it (tc_fewest_waves). */
static dflash_status attn_grid_y(cuda_ctx *c, dflash_cuda_kernel_id kid, int ki, unsigned threads, int64_t others,
                                 int keys, int splits, int *gy)
{
    const int lever = dflash_levers_get()->cuda_attn_group; /* splits a block walks, of the bound's */
    int y;
    int64_t slots = 0; /* blocks one wave holds (the lever's grid: not asked) */
    if (lever > 0) {
        y = (splits + lever - 1) / lever;
    } else {
        int *occ = &c->attn_occ[ki][threads / 32 < 8 ? threads / 32 : 8]; /* 1..8 warps */
        if (*occ <= 0) {
            DFLASH_TRY(
                DFLASH_CU(&c->cu, cuOccupancyMaxActiveBlocksPerMultiprocessor(occ, c->fn[kid], (int)threads, 0)));
            if (*occ <= 0)
                *occ = 1;
        }
        slots = (int64_t)c->sm_count * *occ;
        const int64_t want = (slots + others - 1) / others; /* one wave */
        y = want < splits ? (int)want : splits;
    }
    const int y_asked = y;
    while (tc_walk_width(keys, y) > ATTN_TC_ROOM)
        y++; /* ends by y = splits: one short or long split a block */
    if (slots > 0 && y > y_asked)
        y = tc_fewest_waves(keys, y, splits, others, slots);
    *gy = y;
    return DFLASH_OK;
}

/* The tensor-core kernel (bf16 pages, head_dim 16/32/64/128/256), then
 * the merge of key splits when a sequence has more than one; with f, the
 * kernel runs f's q/k norm + RoPE + K/V store first. */
static dflash_status attention_tc(cuda_ctx *c, const dflash_attn_args *a, const cuda_attn_fuse *f)
{
    const int D = a->head_dim, G = a->n_heads / a->n_kv_heads;
    const int halves = D == 256; /* two warps per query tile */
    const int ki = D == 16 ? 0 : D == 32 ? 1 : D == 64 ? 2 : D == 128 ? 3 : 4;
    static const dflash_cuda_kernel_id kids[5] = { DFK_ATTENTION_TC_16, DFK_ATTENTION_TC_32, DFK_ATTENTION_TC_64,
                                                   DFK_ATTENTION_TC_128, DFK_ATTENTION_TC_256 };
    const dflash_cuda_kernel_id kid = kids[ki];
    const int per_block = halves ? ATTN_TC_QV / 2 : ATTN_TC_QV;
    const int64_t qv = (int64_t)a->max_seq_rows * G;
    const int chunks = (int)((qv + per_block - 1) / per_block);
    const int cw = (int)(((qv < per_block ? qv : per_block) + 15) / 16) * (halves ? 2 : 1);
    const int splits = a->max_keys > 0 ? tc_splits(a->max_keys) : 1;
    if (splits > ATTN_TC_MAX_SPLITS || chunks > 65535)
        return dflash_fail(DFLASH_ERR_UNSUPPORTED, "cuda attention: %d keys, %d rows per sequence", a->max_keys,
                           a->max_seq_rows);
    if (splits > 1)
        DFLASH_TRY(part_reserve(c, splits, a->n_rows, a->n_heads, D));
    attn_tc_args t = {
        .q = a->q, .out = a->out, .q_pos = a->q_pos, .seq_info = a->seq_info, .pool = a->kv->data,
        .page_tables = a->page_tables, .k_extra = a->k_extra, .v_extra = a->k_extra ? a->v_extra : NULL,
        .part_o = HPTR(c->part_o.p), .part_ml = HPTR(c->part_ml.p),
        .eflag = (void *)(uintptr_t)c->err_flag, .ehost = (void *)(uintptr_t)c->err_host_dev, .scale = a->scale,
        .n_pages = a->kv->n_pages, .n_layers = a->kv->n_layers, .layer = a->layer,
        .pt_len = a->pt_len > 0 ? a->pt_len : 1, .n_rows = a->n_rows, .n_heads = a->n_heads,
        .n_kv_heads = a->n_kv_heads, .causal = a->causal, .window = a->window, .compute_warps = cw,
        .max_splits = splits,
    };
    if (f)
        t.fu = *f;
    void *args[] = { &t };
    /* Warps past the cw that compute only copy tiles: four by default,
     * two for a one-tile call of long walks, or the lever's count. */
    const int lever = dflash_levers_get()->cuda_attn_min_warps;
    const int64_t others = (int64_t)a->n_seqs * a->n_kv_heads * chunks;
    const int least = lever ? lever : 4;
    unsigned threads = 32u * (unsigned)(cw > least ? cw : least);
    int gy;
    DFLASH_TRY(attn_grid_y(c, kid, ki, threads, others, a->max_keys, splits, &gy));
    if (!lever && cw == 1 && tc_walk_width(a->max_keys, gy) >= ATTN_TC_FEW_WARPS_WALK) {
        threads = 64;
        DFLASH_TRY(attn_grid_y(c, kid, ki, threads, others, a->max_keys, splits, &gy));
    }
    DFLASH_TRY(cuda_launch3(c, kid, (unsigned)(a->n_seqs * a->n_kv_heads), (unsigned)gy, (unsigned)chunks, threads,
                            args));
    return splits > 1 ? combine_splits(c, a, 1, splits) : DFLASH_OK;
}

/* attention, with f (cuda_attention_fused) or without */
static dflash_status attention_run(dflash_backend *be, const dflash_attn_args *a, const cuda_attn_fuse *f)
{
    cuda_ctx *c = CTX(be);
    if (a->n_kv_heads <= 0 || a->n_heads % a->n_kv_heads != 0)
        return dflash_fail(DFLASH_ERR_INVALID_ARG, "attention: %d heads not a multiple of %d kv heads", a->n_heads,
                           a->n_kv_heads);
    if (a->head_dim <= 0 || a->head_dim > 512)
        return dflash_fail(DFLASH_ERR_UNSUPPORTED, "cuda attention: head_dim %d (1..512 supported)", a->head_dim);
    if (a->kv) {
        DFLASH_TRY(cuda_check_kv(a->kv, a->layer, "attention"));
        if (a->kv->n_kv_heads != a->n_kv_heads || a->kv->head_dim != a->head_dim)
            return dflash_fail(DFLASH_ERR_SHAPE, "cuda attention: pool has %d x %d kv heads, args %d x %d",
                               a->kv->n_kv_heads, a->kv->head_dim, a->n_kv_heads, a->head_dim);
    }
    if (a->n_rows <= 0 || a->n_heads <= 0)
        return DFLASH_OK;
    if (a->n_heads > 65535)
        return dflash_fail(DFLASH_ERR_UNSUPPORTED, "cuda attention: %d heads", a->n_heads);
    DFLASH_TRY(cuda_enter(c));
    const int D = a->head_dim;
    const int tc = a->kv && a->kv->dtype == DFLASH_DTYPE_BF16 &&
                   (D == 16 || D == 32 || D == 64 || D == 128 || D == 256) &&
                   a->n_seqs > 0 && a->max_seq_rows > 0 && a->max_keys >= 0 && aligned16(a->q) &&
                   (!a->k_extra || (aligned16(a->k_extra) && aligned16(a->v_extra)));
    if (f && !tc)
        return dflash_fail(DFLASH_ERR_UNSUPPORTED, "cuda attention: a fused decode needs the tensor-core kernel "
                           "(a BF16 pool, aligned rows)");
    return tc ? attention_tc(c, a, f) : attention_simt(c, a);
}

dflash_status cuda_attention(dflash_backend *be, const dflash_attn_args *a)
{
    return attention_run(be, a, NULL);
}

dflash_status cuda_attention_fused(dflash_backend *be, const dflash_attn_args *a, const cuda_attn_fuse *f)
{
    return attention_run(be, a, f);
}

