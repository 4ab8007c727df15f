/* kv_pool.c: page allocation for the paged KV cache (see kv_pool.h). */
#include "kv/kv_pool.h"

#include <stdlib.h>

dflash_status dflash_kv_pool_init(dflash_kv_pool *pool, dflash_backend *be, int n_pages, int n_layers,
                                  int n_kv_heads, int head_dim, dflash_dtype dtype)
{
    *pool = (dflash_kv_pool){ 0 };
    if (n_pages <= 0 || n_layers <= 0 || n_kv_heads <= 0 || head_dim <= 0)
        return dflash_fail(DFLASH_ERR_INVALID_ARG, "kv pool: bad geometry (%d pages, %d layers, %d x %d)",
                           n_pages, n_layers, n_kv_heads, head_dim);
    if (dtype == DFLASH_DTYPE_INVALID)
        dtype = be->ops->kv_dtype;
    if (dtype != DFLASH_DTYPE_F32 && dtype != DFLASH_DTYPE_BF16)
        return dflash_fail(DFLASH_ERR_UNSUPPORTED, "kv pool: dtype %s (F32 or BF16)", dflash_dtype_name(dtype));
    pool->be = be;
    pool->layout = (dflash_kv_layout){ n_pages, n_layers, n_kv_heads, head_dim, dtype, NULL };
    size_t bytes = (size_t)n_pages * n_layers * 2 * DFLASH_KV_PAGE * n_kv_heads * head_dim * dflash_dtype_size(dtype);
    pool->free_list = malloc((size_t)n_pages * sizeof(int32_t));
    if (!pool->free_list)
        return dflash_fail(DFLASH_ERR_OOM, "kv pool: out of memory");
    dflash_status s = be->ops->alloc(be, bytes, &pool->layout.data);
    if (s != DFLASH_OK) {
        free(pool->free_list);
        pool->free_list = NULL;
        return dflash_fail_prefix(s, "kv pool of %d pages (%zu bytes): ", n_pages, bytes);
    }
    /* Stack order: page 0 is handed out first. */
    for (int i = 0; i < n_pages; i++)
        pool->free_list[i] = n_pages - 1 - i;
    pool->n_free = n_pages;
    return DFLASH_OK;
}

void dflash_kv_pool_free(dflash_kv_pool *pool)
{
    if (pool->layout.data)
        pool->be->ops->free(pool->be, pool->layout.data);
    free(pool->free_list);
    *pool = (dflash_kv_pool){ 0 };
}

dflash_status dflash_kv_seq_init(dflash_kv_seq *seq, int pt_len)
{
    *seq = (dflash_kv_seq){ 0 };
    if (pt_len <= 0)
        return dflash_fail(DFLASH_ERR_INVALID_ARG, "kv sequence: page table length %d", pt_len);
    seq->table = malloc((size_t)pt_len * sizeof(int32_t));
    if (!seq->table)
        return dflash_fail(DFLASH_ERR_OOM, "kv sequence: out of memory");
    for (int i = 0; i < pt_len; i++)
        seq->table[i] = -1;
    seq->pt_len = pt_len;
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
    for (int i = 0; i < seq->pt_len; i++)
        if (seq->table[i] >= 0) {
            pool->free_list[pool->n_free++] = seq->table[i];
            seq->table[i] = -1;
        }
    seq->lo = seq->len = seq->alloc_end = 0;
}

int dflash_kv_seq_pages(const dflash_kv_seq *seq)
{
    int n = 0;
    for (int i = 0; i < seq->pt_len; i++)
        n += seq->table[i] >= 0;
    return n;
}

dflash_status dflash_kv_seq_reserve(dflash_kv_pool *pool, dflash_kv_seq *seq, int32_t new_end)
{
    const int32_t first_page = seq->lo / DFLASH_KV_PAGE;
    const int32_t need_pages = (new_end + DFLASH_KV_PAGE - 1) / DFLASH_KV_PAGE;
    if (need_pages - first_page > seq->pt_len)
        return dflash_fail(DFLASH_ERR_INVALID_ARG,
                           "kv sequence: positions %d..%d need %d pages, the page table holds %d",
                           seq->lo, new_end - 1, need_pages - first_page, seq->pt_len);
    int32_t have = (seq->alloc_end + DFLASH_KV_PAGE - 1) / DFLASH_KV_PAGE;
    if (have < first_page)
        have = first_page;
    if (need_pages - have > pool->n_free)
        return dflash_fail(DFLASH_ERR_KV_FULL,
                           "kv pool exhausted: %d more pages needed for positions up to %d, %d free of %d",
                           need_pages - have, new_end - 1, pool->n_free, pool->layout.n_pages);
    for (int32_t b = have; b < need_pages; b++)
        seq->table[b % seq->pt_len] = pool->free_list[--pool->n_free];
    if (need_pages * DFLASH_KV_PAGE > seq->alloc_end)
        seq->alloc_end = need_pages * DFLASH_KV_PAGE;
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
    for (int32_t b = seq->lo / DFLASH_KV_PAGE; (b + 1) * DFLASH_KV_PAGE <= new_lo; b++) {
        int32_t *slot = &seq->table[b % seq->pt_len];
        if (b * DFLASH_KV_PAGE < seq->alloc_end && *slot >= 0) {
            pool->free_list[pool->n_free++] = *slot;
            *slot = -1;
        }
    }
    seq->lo = new_lo;
    if (seq->len < new_lo)
        seq->len = new_lo;
    if (seq->alloc_end < new_lo / DFLASH_KV_PAGE * DFLASH_KV_PAGE)
        seq->alloc_end = new_lo / DFLASH_KV_PAGE * DFLASH_KV_PAGE;
}

dflash_status dflash_kv_seq_slide(dflash_kv_pool *pool, dflash_kv_seq *seq, int32_t new_lo, int32_t new_end)
{
    if (new_lo < seq->lo)
        new_lo = seq->lo;
    const int32_t first = new_lo / DFLASH_KV_PAGE, need = (new_end + DFLASH_KV_PAGE - 1) / DFLASH_KV_PAGE;
    if (need - first > seq->pt_len)
        return dflash_fail(DFLASH_ERR_INVALID_ARG,
                           "kv sequence: positions %d..%d need %d pages, the page table holds %d", new_lo,
                           new_end - 1, need - first, seq->pt_len);
    /* Count what the drop frees and what the reserve takes, before either. */
    int freed = 0;
    for (int32_t b = seq->lo / DFLASH_KV_PAGE; (b + 1) * DFLASH_KV_PAGE <= new_lo; b++)
        freed += b * DFLASH_KV_PAGE < seq->alloc_end && seq->table[b % seq->pt_len] >= 0;
    int32_t have = (seq->alloc_end + DFLASH_KV_PAGE - 1) / DFLASH_KV_PAGE;
    if (have < first)
        have = first;
    if (need - have > pool->n_free + freed)
        return dflash_fail(DFLASH_ERR_KV_FULL,
                           "kv pool exhausted: %d more pages needed for positions up to %d, %d free of %d",
                           need - have - freed, new_end - 1, pool->n_free, pool->layout.n_pages);
    dflash_kv_seq_drop_before(pool, seq, new_lo);
    return dflash_kv_seq_reserve(pool, seq, new_end);
}
