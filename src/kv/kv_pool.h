/* kv_pool.h: paged KV cache bookkeeping. One pool of fixed-size pages
 * (DFLASH_KV_PAGE positions, every layer of the model) per model; per
 * sequence a page table. The table is a ring of pt_len entries indexed by
 * (position / PAGE) % pt_len, so a sequence with a bounded window reuses
 * slots as old pages are dropped; a sequence without a window simply has
 * pt_len >= its longest length in pages. Truncation moves a length; pages
 * stay allocated and are overwritten. Exhaustion is an error that leaves
 * the sequence as it was. */
#ifndef DFLASH_KV_POOL_H
#define DFLASH_KV_POOL_H

#include <stdint.h>

#include "backend/backend.h"

typedef struct dflash_kv_pool {
    dflash_backend *be;
    dflash_kv_layout layout; /* layout.data: the pages, in backend memory */
    int32_t *free_list;      /* host [n_pages]; a stack of free page ids */
    int n_free;
} dflash_kv_pool;

typedef struct dflash_kv_seq {
    int32_t *table;    /* host [pt_len]: pool page per ring slot, -1 = none */
    int pt_len;
    int32_t lo;        /* first stored position (> 0 once a window dropped pages) */
    int32_t len;       /* positions [lo, len) hold valid K/V */
    int32_t alloc_end; /* pages cover positions [lo rounded down, alloc_end) */
    int32_t rec;       /* a hybrid target's recurrent-state record + 1 (target/qwen35_state.h); 0: none */
} dflash_kv_seq;

/* dtype: F32 or BF16; DFLASH_DTYPE_INVALID takes the backend's kv_dtype. */
dflash_status dflash_kv_pool_init(dflash_kv_pool *pool, dflash_backend *be, int n_pages, int n_layers,
                                  int n_kv_heads, int head_dim, dflash_dtype dtype);
void dflash_kv_pool_free(dflash_kv_pool *pool);

dflash_status dflash_kv_seq_init(dflash_kv_seq *seq, int pt_len);
/* Return every page to the pool and free the table. */
void dflash_kv_seq_free(dflash_kv_pool *pool, dflash_kv_seq *seq);
/* Return every page to the pool; the sequence stays, empty. */
void dflash_kv_seq_release(dflash_kv_pool *pool, dflash_kv_seq *seq);
/* Pages the sequence holds. */
int dflash_kv_seq_pages(const dflash_kv_seq *seq);
/* Allocate pages so positions up to new_end - 1 can be written. Fails with
 * DFLASH_ERR_KV_FULL (pool empty) or DFLASH_ERR_INVALID_ARG (the live range
 * would not fit the ring); the sequence is unchanged on failure. */
dflash_status dflash_kv_seq_reserve(dflash_kv_pool *pool, dflash_kv_seq *seq, int32_t new_end);
/* Forget positions >= len (rollback after a rejected draft). */
void dflash_kv_seq_truncate(dflash_kv_seq *seq, int32_t len);
/* Release whole pages below new_lo (a sliding window moved). */
void dflash_kv_seq_drop_before(dflash_kv_pool *pool, dflash_kv_seq *seq, int32_t new_lo);
/* Move a window: drop below new_lo, then reserve up to new_end, as one step
 * that either succeeds or leaves the sequence and the pool unchanged (the
 * pages the drop would free count toward what the reserve needs). */
dflash_status dflash_kv_seq_slide(dflash_kv_pool *pool, dflash_kv_seq *seq, int32_t new_lo, int32_t new_end);

#endif
