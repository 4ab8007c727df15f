/* test_kv.c: the paged KV pool: allocation, ring tables, truncate, window
 * drop, exhaustion that leaves every sequence intact. */
#include "harness.h"

#include "kv/kv_pool.h"

static dflash_backend *be;

static int live_blocks(const dflash_kv_seq *s)
{
    int n = 0;
    for (int i = 0; i < s->pt_len; i++)
        n += s->table[i] >= 0;
    return n;
}

static void test_reserve_and_free(void)
{
    dflash_kv_pool pool;
    dflash_kv_seq a, b;
    CHECK_OK(dflash_kv_pool_init(&pool, be, 8, 2, 2, 4, DFLASH_DTYPE_F32));
    CHECK_OK(dflash_kv_seq_init(&a, 8));
    CHECK_OK(dflash_kv_seq_init(&b, 8));
    CHECK_OK(dflash_kv_seq_reserve(&pool, &a, 1));
    CHECK(live_blocks(&a) == 1 && pool.n_free == 7);
    CHECK_OK(dflash_kv_seq_reserve(&pool, &a, 16)); /* same block */
    CHECK(live_blocks(&a) == 1);
    CHECK_OK(dflash_kv_seq_reserve(&pool, &a, 17));
    CHECK(live_blocks(&a) == 2 && pool.n_free == 6);
    CHECK_OK(dflash_kv_seq_reserve(&pool, &b, 40));
    CHECK(live_blocks(&b) == 3 && pool.n_free == 3);
    /* distinct blocks across sequences */
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 3; j++)
            CHECK(a.table[i] != b.table[j]);
    dflash_kv_seq_free(&pool, &a);
    CHECK(pool.n_free == 5);
    dflash_kv_seq_free(&pool, &b);
    CHECK(pool.n_free == 8);
    dflash_kv_pool_free(&pool);
}

static void test_exhaustion_leaves_state(void)
{
    dflash_kv_pool pool;
    dflash_kv_seq a, b;
    CHECK_OK(dflash_kv_pool_init(&pool, be, 4, 1, 1, 2, DFLASH_DTYPE_F32));
    CHECK_OK(dflash_kv_seq_init(&a, 16));
    CHECK_OK(dflash_kv_seq_init(&b, 16));
    CHECK_OK(dflash_kv_seq_reserve(&pool, &a, 48));
    a.len = 48;
    int32_t before[16];
    memcpy(before, a.table, sizeof before);
    CHECK_FAILS(dflash_kv_seq_reserve(&pool, &b, 33), DFLASH_ERR_KV_FULL, "kv pool exhausted");
    CHECK(live_blocks(&b) == 0 && pool.n_free == 1);
    CHECK(memcmp(before, a.table, sizeof before) == 0 && a.len == 48);
    CHECK_OK(dflash_kv_seq_reserve(&pool, &b, 16));
    dflash_kv_seq_free(&pool, &a);
    dflash_kv_seq_free(&pool, &b);
    CHECK(pool.n_free == 4);
    dflash_kv_pool_free(&pool);
}

static void test_truncate_moves_length(void)
{
    dflash_kv_pool pool;
    dflash_kv_seq a;
    CHECK_OK(dflash_kv_pool_init(&pool, be, 4, 1, 1, 2, DFLASH_DTYPE_F32));
    CHECK_OK(dflash_kv_seq_init(&a, 4));
    CHECK_OK(dflash_kv_seq_reserve(&pool, &a, 40));
    a.len = 40;
    dflash_kv_seq_truncate(&a, 20);
    CHECK(a.len == 20 && live_blocks(&a) == 3); /* blocks kept for reuse */
    dflash_kv_seq_truncate(&a, 30);              /* never grows */
    CHECK(a.len == 20);
    dflash_kv_seq_free(&pool, &a);
    dflash_kv_pool_free(&pool);
}

/* A window of 20 positions over a ring of 3 slots and a pool of 3 blocks,
 * slid 140 times. The table is read only through its contract (a
 * position's block is table[(pos / BLOCK) % pt_len]); what must hold is
 * checked against a shadow of what the test saw, not against a restated
 * formula: every position of the window has a pool block; different
 * blocks of the window have different pool blocks; a block keeps its pool
 * block (so its K/V stay where they were written) for as long as it is in
 * the window; the ring holds exactly the window's blocks and the rest of
 * the pool is free. */
static void test_window_ring(void)
{
    enum { N_BLOCKS = 3, MAX_B = 1100 / DFLASH_KV_PAGE + 1 };
    dflash_kv_pool pool;
    dflash_kv_seq a;
    CHECK_OK(dflash_kv_pool_init(&pool, be, N_BLOCKS, 1, 1, 2, DFLASH_DTYPE_F32));
    CHECK_OK(dflash_kv_seq_init(&a, 3));
    int32_t seen[MAX_B];
    for (int b = 0; b < MAX_B; b++)
        seen[b] = -1;
    int bad = 0;
    for (int32_t end = 5; end < 1000 && !bad; end += 7) {
        int32_t lo = end - 20 > a.lo ? end - 20 : a.lo;
        dflash_kv_seq_drop_before(&pool, &a, lo);
        CHECK_OK(dflash_kv_seq_reserve(&pool, &a, end));
        a.len = end;
        const int b0 = a.lo / DFLASH_KV_PAGE, b1 = (end - 1) / DFLASH_KV_PAGE;
        int32_t used[N_BLOCKS] = { 0 };
        for (int b = b0; b <= b1; b++) {
            int32_t pb = a.table[b % a.pt_len];
            if (pb < 0 || pb >= N_BLOCKS) {
                CHECKF(0, "window [%d, %d): block %d has pool block %d", a.lo, end, b, pb);
                bad = 1;
                break;
            }
            CHECKF(!used[pb]++, "window [%d, %d): pool block %d serves two blocks", a.lo, end, pb);
            CHECKF(seen[b] < 0 || seen[b] == pb, "window [%d, %d): block %d moved from pool block %d to %d", a.lo,
                   end, b, seen[b], pb);
            bad |= used[pb] > 1 || (seen[b] >= 0 && seen[b] != pb);
            seen[b] = pb;
        }
        CHECKF(live_blocks(&a) == b1 - b0 + 1 && pool.n_free == N_BLOCKS - (b1 - b0 + 1),
               "window [%d, %d): %d live slots, %d free, want %d and %d", a.lo, end, live_blocks(&a), pool.n_free,
               b1 - b0 + 1, N_BLOCKS - (b1 - b0 + 1));
    }
    CHECK(a.lo > 900);
    dflash_kv_seq_free(&pool, &a);
    CHECK(pool.n_free == N_BLOCKS);
    dflash_kv_pool_free(&pool);
}

static void test_ring_overflow_is_error(void)
{
    dflash_kv_pool pool;
    dflash_kv_seq a;
    CHECK_OK(dflash_kv_pool_init(&pool, be, 8, 1, 1, 2, DFLASH_DTYPE_F32));
    CHECK_OK(dflash_kv_seq_init(&a, 2));
    CHECK_FAILS(dflash_kv_seq_reserve(&pool, &a, 33), DFLASH_ERR_INVALID_ARG, "page table holds 2");
    CHECK(pool.n_free == 8);
    dflash_kv_seq_free(&pool, &a);
    dflash_kv_pool_free(&pool);
}

/* A window move that cannot get its blocks changes nothing; the blocks the
 * drop frees count toward the reserve. */
static void test_slide_is_atomic(void)
{
    dflash_kv_pool pool;
    dflash_kv_seq a, hog;
    CHECK_OK(dflash_kv_pool_init(&pool, be, 3, 1, 1, 2, DFLASH_DTYPE_F32));
    CHECK_OK(dflash_kv_seq_init(&a, 3));
    CHECK_OK(dflash_kv_seq_init(&hog, 3));
    CHECK_OK(dflash_kv_seq_slide(&pool, &a, 0, 20)); /* 2 blocks */
    a.len = 20;
    CHECK_OK(dflash_kv_seq_reserve(&pool, &hog, 1)); /* pool now empty */
    int32_t before[3];
    memcpy(before, a.table, sizeof before);
    CHECK_FAILS(dflash_kv_seq_slide(&pool, &a, 4, 40), DFLASH_ERR_KV_FULL, "kv pool exhausted");
    CHECK(a.lo == 0 && a.len == 20 && memcmp(before, a.table, sizeof before) == 0 && pool.n_free == 0);
    /* dropping block 0 frees the one block that [16, 40) needs beyond block 1 */
    CHECK_OK(dflash_kv_seq_slide(&pool, &a, 16, 40));
    CHECK(a.lo == 16 && live_blocks(&a) == 2 && pool.n_free == 0);
    dflash_kv_seq_free(&pool, &a);
    dflash_kv_seq_free(&pool, &hog);
    CHECK(pool.n_free == 3);
    dflash_kv_pool_free(&pool);
}

int main(void)
{
    dflash_backend_cpu_create(&be);
    RUN(test_reserve_and_free);
    RUN(test_exhaustion_leaves_state);
    RUN(test_truncate_moves_length);
    RUN(test_window_ring);
    RUN(test_ring_overflow_is_error);
    RUN(test_slide_is_atomic);
    dflash_backend_destroy(be);
    TEST_END();
}
