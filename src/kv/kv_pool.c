/* kv_pool.c: block allocation for the paged KV cache (see kv_pool.h). */
#include "kv/kv_pool.h"

#include <stdlib.h>

dflash_status dflash_kv_pool_init(dflash_kv_pool *pool, dflash_backend *be, int n_blocks, int n_layers,
                                  int n_kv_heads, int head_dim, dflash_dtype dtype)
{
    *pool = (dflash_kv_pool){ 0 };
    if (n_blocks <= 0 || n_layers <= 0 || n_kv_heads <= 0 || head_dim <= 0)
        return dflash_fail(DFLASH_ERR_INVALID_ARG, "kv pool: bad geometry (%d blocks, %d layers, %d x %d)",
                           n_blocks, n_layers, n_kv_heads, head_dim);
    if (dtype == DFLASH_DTYPE_INVALID)
        dtype = be->ops->kv_dtype;
    if (dtype != DFLASH_DTYPE_F32 && dtype != DFLASH_DTYPE_BF16)
        return dflash_fail(DFLASH_ERR_UNSUPPORTED, "kv pool: dtype %s (F32 or BF16)", dflash_dtype_name(dtype));
    pool->be = be;
    pool->layout = (dflash_kv_layout){ n_blocks, n_layers, n_kv_heads, head_dim, dtype, NULL };
    size_t bytes = (size_t)n_blocks * n_layers * 2 * DFLASH_KV_BLOCK * n_kv_heads * head_dim * dflash_dtype_size(dtype);
    pool->free_list = malloc((size_t)n_blocks * sizeof(int32_t));
    if (!pool->free_list)
        return dflash_fail(DFLASH_ERR_OOM, "kv pool: out of memory");
    dflash_status s = be->ops->alloc(be, bytes, &pool->layout.data);
    if (s != DFLASH_OK) {
        free(pool->free_list);
        pool->free_list = NULL;
        return dflash_fail_prefix(s, "kv pool of %d blocks (%zu bytes): ", n_blocks, bytes);
    }
    /* Stack order: block 0 is handed out first. */
    for (int i = 0; i < n_blocks; i++)
        pool->free_list[i] = n_blocks - 1 - i;
    pool->n_free = n_blocks;
    return DFLASH_OK;
}

void dflash_kv_pool_free(dflash_kv_pool *pool)
{
    if (pool->layout.data)
        pool->be->ops->free(pool->be, pool->layout.data);
    free(pool->free_list);
    *pool = (dflash_kv_pool){ 0 };
}

dflash_status dflash_kv_seq_init(dflash_kv_seq *seq, int bt_len)
{
    *seq = (dflash_kv_seq){ 0 };
    if (bt_len <= 0)
        return dflash_fail(DFLASH_ERR_INVALID_ARG, "kv sequence: block table length %d", bt_len);
    seq->table = malloc((size_t)bt_len * sizeof(int32_t));
    if (!seq->table)
        return dflash_fail(DFLASH_ERR_OOM, "kv sequence: out of memory");
    for (int i = 0; i < bt_len; i++)
        seq->table[i] = -1;
    seq->bt_len = bt_len;
    return DFLASH_OK;
}

void dflash_kv_seq_free(dflash_kv_pool *pool, dflash_kv_seq *seq)
{
    if (!seq->table)
        return;
    dflash_kv_seq_release(pool, seq);
    free(seq->table);
    *seq = (dflash_kv_seq){ 0 };
}

void dflash_kv_seq_release(dflash_kv_pool *pool, dflash_kv_seq *seq)
{
    for (int i = 0; i < seq->bt_len; i++)
        if (seq->table[i] >= 0) {
            pool->free_list[pool->n_free++] = seq->table[i];
            seq->table[i] = -1;
        }
    seq->lo = seq->len = seq->alloc_end = 0;
}

int dflash_kv_seq_blocks(const dflash_kv_seq *seq)
{
    int n = 0;
    for (int i = 0; i < seq->bt_len; i++)
        n += seq->table[i] >= 0;
    return n;
}

dflash_status dflash_kv_seq_reserve(dflash_kv_pool *pool, dflash_kv_seq *seq, int32_t new_end)
{
    const int32_t first_block = seq->lo / DFLASH_KV_BLOCK;
    const int32_t need_blocks = (new_end + DFLASH_KV_BLOCK - 1) / DFLASH_KV_BLOCK;
    if (need_blocks - first_block > seq->bt_len)
        return dflash_fail(DFLASH_ERR_INVALID_ARG,
                           "kv sequence: positions %d..%d need %d blocks, the block table holds %d",
                           seq->lo, new_end - 1, need_blocks - first_block, seq->bt_len);
    int32_t have = (seq->alloc_end + DFLASH_KV_BLOCK - 1) / DFLASH_KV_BLOCK;
    if (have < first_block)
        have = first_block;
    if (need_blocks - have > pool->n_free)
        return dflash_fail(DFLASH_ERR_KV_FULL,
                           "kv pool exhausted: %d more blocks needed for positions up to %d, %d free of %d",
                           need_blocks - have, new_end - 1, pool->n_free, pool->layout.n_blocks);
    for (int32_t b = have; b < need_blocks; b++)
        seq->table[b % seq->bt_len] = pool->free_list[--pool->n_free];
    if (need_blocks * DFLASH_KV_BLOCK > seq->alloc_end)
        seq->alloc_end = need_blocks * DFLASH_KV_BLOCK;
    return DFLASH_OK;
}

void dflash_kv_seq_truncate(dflash_kv_seq *seq, int32_t len)
{
    if (len < seq->len)
        seq->len = len < seq->lo ? seq->lo : len;
}

void dflash_kv_seq_drop_before(dflash_kv_pool *pool, dflash_kv_seq *seq, int32_t new_lo)
{
    if (new_lo <= seq->lo)
        return;
    for (int32_t b = seq->lo / DFLASH_KV_BLOCK; (b + 1) * DFLASH_KV_BLOCK <= new_lo; b++) {
        int32_t *slot = &seq->table[b % seq->bt_len];
        if (b * DFLASH_KV_BLOCK < seq->alloc_end && *slot >= 0) {
            pool->free_list[pool->n_free++] = *slot;
            *slot = -1;
        }
    }
    seq->lo = new_lo;
    if (seq->len < new_lo)
        seq->len = new_lo;
    if (seq->alloc_end < new_lo / DFLASH_KV_BLOCK * DFLASH_KV_BLOCK)
        seq->alloc_end = new_lo / DFLASH_KV_BLOCK * DFLASH_KV_BLOCK;
}

dflash_status dflash_kv_seq_slide(dflash_kv_pool *pool, dflash_kv_seq *seq, int32_t new_lo, int32_t new_end)
{
    if (new_lo < seq->lo)
        new_lo = seq->lo;
    const int32_t first = new_lo / DFLASH_KV_BLOCK, need = (new_end + DFLASH_KV_BLOCK - 1) / DFLASH_KV_BLOCK;
    if (need - first > seq->bt_len)
        return dflash_fail(DFLASH_ERR_INVALID_ARG,
                           "kv sequence: positions %d..%d need %d blocks, the block table holds %d", new_lo,
                           new_end - 1, need - first, seq->bt_len);
    /* Count what the drop frees and what the reserve takes, before either. */
    int freed = 0;
    for (int32_t b = seq->lo / DFLASH_KV_BLOCK; (b + 1) * DFLASH_KV_BLOCK <= new_lo; b++)
        freed += b * DFLASH_KV_BLOCK < seq->alloc_end && seq->table[b % seq->bt_len] >= 0;
    int32_t have = (seq->alloc_end + DFLASH_KV_BLOCK - 1) / DFLASH_KV_BLOCK;
    if (have < first)
        have = first;
    if (need - have > pool->n_free + freed)
        return dflash_fail(DFLASH_ERR_KV_FULL,
                           "kv pool exhausted: %d more blocks needed for positions up to %d, %d free of %d",
                           need - have - freed, new_end - 1, pool->n_free, pool->layout.n_blocks);
    dflash_kv_seq_drop_before(pool, seq, new_lo);
    return dflash_kv_seq_reserve(pool, seq, new_end);
}
