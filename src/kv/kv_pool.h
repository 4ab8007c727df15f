/* kv_pool.h: paged KV cache bookkeeping. One pool of fixed-size blocks
 * (DFLASH_KV_BLOCK positions, every layer of the model) per model; per
 * sequence a block table. The table is a ring of bt_len entries indexed by
 * (position / BLOCK) % bt_len, so a sequence with a bounded window reuses
 * slots as old blocks are dropped; a sequence without a window simply has
 * bt_len >= its longest length in blocks. Truncation moves a length; blocks
 * stay allocated and are overwritten. Exhaustion is an error that leaves
 * the sequence as it was. */
#ifndef DFLASH_KV_POOL_H
#define DFLASH_KV_POOL_H

#include <stdint.h>

#include "backend/backend.h"

typedef struct dflash_kv_pool {
    dflash_backend *be;
    dflash_kv_layout layout; /* layout.data: the blocks, in backend memory */
    int32_t *free_list;      /* host [n_blocks]; a stack of free block ids */
    int n_free;
} dflash_kv_pool;

typedef struct dflash_kv_seq {
    int32_t *table;    /* host [bt_len]: pool block per ring slot, -1 = none */
    int bt_len;
    int32_t lo;        /* first stored position (> 0 once a window dropped blocks) */
    int32_t len;       /* positions [lo, len) hold valid K/V */
    int32_t alloc_end; /* blocks cover positions [lo rounded down, alloc_end) */
} dflash_kv_seq;

/* dtype: F32 or BF16; DFLASH_DTYPE_INVALID takes the backend's kv_dtype. */
dflash_status dflash_kv_pool_init(dflash_kv_pool *pool, dflash_backend *be, int n_blocks, int n_layers,
                                  int n_kv_heads, int head_dim, dflash_dtype dtype);
void dflash_kv_pool_free(dflash_kv_pool *pool);

dflash_status dflash_kv_seq_init(dflash_kv_seq *seq, int bt_len);
/* Return every block to the pool and free the table. */
void dflash_kv_seq_free(dflash_kv_pool *pool, dflash_kv_seq *seq);
/* Return every block to the pool; the sequence stays, empty. */
void dflash_kv_seq_release(dflash_kv_pool *pool, dflash_kv_seq *seq);
/* Blocks the sequence holds. */
int dflash_kv_seq_blocks(const dflash_kv_seq *seq);
/* Allocate blocks so positions up to new_end - 1 can be written. Fails with
 * DFLASH_ERR_KV_FULL (pool empty) or DFLASH_ERR_INVALID_ARG (the live range
 * would not fit the ring); the sequence is unchanged on failure. */
dflash_status dflash_kv_seq_reserve(dflash_kv_pool *pool, dflash_kv_seq *seq, int32_t new_end);
/* Forget positions >= len (rollback after a rejected draft). */
void dflash_kv_seq_truncate(dflash_kv_seq *seq, int32_t len);
/* Release whole blocks below new_lo (a sliding window moved). */
void dflash_kv_seq_drop_before(dflash_kv_pool *pool, dflash_kv_seq *seq, int32_t new_lo);
/* Move a window: drop below new_lo, then reserve up to new_end, as one step
 * that either succeeds or leaves the sequence and the pool unchanged (the
 * blocks the drop would free count toward what the reserve needs). */
dflash_status dflash_kv_seq_slide(dflash_kv_pool *pool, dflash_kv_seq *seq, int32_t new_lo, int32_t new_end);

#endif
