/* test_graph.c: the graph cache's policy (backend/graph.h) against a fake
 * backend that really records and replays: an op enqueued while capturing
 * is stored instead of run, a replay runs the stored ops. The model
 * forwards that use the cache are checked on the GPU (their graphs against
 * their eager runs and the CPU). */
#include <stdint.h>
#include <stdlib.h>

#include "backend/graph.h"
#include "core/levers.h"
#include "core/status.h"
#include "harness.h"

/* The fake backend: one kind of op, "add v to the counter", recorded
 * while capturing. */
#define MAX_OPS 8
typedef struct fake_graph {
    int ops[MAX_OPS], n;
    uint64_t gen;
} fake_graph;

typedef struct fake {
    int counter;
    int capturing, fail_next_capture;
    fake_graph *rec;
    uint64_t gen; /* workspace generation: a graph from another is stale */
    int begins, ends, launches, frees, live;
} fake;

static fake g_fake;

static dflash_status fake_capture_begin(dflash_backend *be)
{
    (void)be;
    g_fake.begins++;
    g_fake.capturing = 1;
    g_fake.rec = calloc(1, sizeof *g_fake.rec);
    return DFLASH_OK;
}

static dflash_status fake_capture_end(dflash_backend *be, void **graph)
{
    (void)be;
    g_fake.ends++;
    g_fake.capturing = 0;
    *graph = NULL;
    if (g_fake.fail_next_capture) {
        g_fake.fail_next_capture--;
        free(g_fake.rec);
        return dflash_fail(DFLASH_ERR_BACKEND, "fake: capture failed");
    }
    g_fake.rec->gen = g_fake.gen;
    *graph = g_fake.rec;
    g_fake.live++;
    return DFLASH_OK;
}

static dflash_status fake_graph_launch(dflash_backend *be, void *graph, int *stale)
{
    (void)be;
    fake_graph *g = graph;
    *stale = g->gen != g_fake.gen;
    if (*stale)
        return DFLASH_OK;
    g_fake.launches++;
    for (int i = 0; i < g->n; i++)
        g_fake.counter += g->ops[i];
    return DFLASH_OK;
}

static void fake_graph_free(dflash_backend *be, void *graph)
{
    (void)be;
    g_fake.frees++;
    g_fake.live--;
    free(graph);
}

static const dflash_backend_ops k_fake_ops = {
    .name = "fake-graphs",
    .capture_begin = fake_capture_begin,
    .capture_end = fake_capture_end,
    .graph_launch = fake_graph_launch,
    .graph_free = fake_graph_free,
};
static const dflash_backend_ops k_plain_ops = { .name = "no-graphs" };

/* The op: run now, or recorded while capturing. */
static void fake_add(int v)
{
    if (g_fake.capturing)
        g_fake.rec->ops[g_fake.rec->n++] = v;
    else
        g_fake.counter += v;
}

typedef struct job {
    int a, b; /* two ops: add a, add b */
    int calls;
} job;

static dflash_status enqueue(void *self)
{
    job *j = self;
    j->calls++;
    fake_add(j->a);
    fake_add(j->b);
    return DFLASH_OK;
}

static void reset(void) { memset(&g_fake, 0, sizeof g_fake); }

/* n calls of key with job j. */
static void run_n(dflash_graph_cache *c, const int32_t *key, int key_len, job *j, int n)
{
    for (int i = 0; i < n; i++)
        CHECK_OK(dflash_graph_run(c, key, key_len, enqueue, j));
}

/* Eager the first DFLASH_GRAPH_EAGER calls, captured (and launched) at
 * the next, replayed after; each call adds a + b exactly once; one
 * capture per key. */
static void test_eager_then_capture_then_replay(void)
{
    reset();
    dflash_backend be = { &k_fake_ops, NULL };
    dflash_graph_cache c;
    dflash_graph_cache_init(&c, &be);
    CHECK(c.on);
    job j = { 3, 4, 0 };
    const int32_t key[] = { 16, 1, 256 };
    for (int call = 1; call <= DFLASH_GRAPH_EAGER + 4; call++) {
        CHECK_OK(dflash_graph_run(&c, key, 3, enqueue, &j));
        CHECKF(g_fake.counter == 7 * call, "call %d: counter %d", call, g_fake.counter);
        CHECKF(g_fake.begins == (call > DFLASH_GRAPH_EAGER), "call %d: %d captures", call, g_fake.begins);
    }
    CHECK(j.calls == DFLASH_GRAPH_EAGER + 1); /* the eager runs and the capture */
    CHECK(g_fake.begins == 1 && g_fake.ends == 1 && c.captures == 1);
    CHECK(g_fake.launches == 4);
    /* another key: its own graph; the first still replays */
    job k = { 10, 20, 0 };
    const int32_t key2[] = { 16, 1, 512 };
    run_n(&c, key2, 3, &k, DFLASH_GRAPH_EAGER + 2);
    CHECK(k.calls == DFLASH_GRAPH_EAGER + 1 && g_fake.begins == 2);
    const int counter = g_fake.counter;
    CHECK_OK(dflash_graph_run(&c, key, 3, enqueue, &j));
    CHECK(j.calls == DFLASH_GRAPH_EAGER + 1 && g_fake.counter == counter + 7);
    dflash_graph_cache_free(&c);
    CHECK(g_fake.live == 0 && g_fake.frees == 2);
}

/* A workspace that moved makes the graph stale: that call runs eagerly,
 * the next captures afresh. */
static void test_stale_graph_recaptured(void)
{
    reset();
    dflash_backend be = { &k_fake_ops, NULL };
    dflash_graph_cache c;
    dflash_graph_cache_init(&c, &be);
    job j = { 1, 1, 0 };
    const int32_t key[] = { 1 };
    const int E = DFLASH_GRAPH_EAGER;
    run_n(&c, key, 1, &j, E + 2);
    CHECK(j.calls == E + 1 && g_fake.launches == 2);
    g_fake.gen++;
    CHECK_OK(dflash_graph_run(&c, key, 1, enqueue, &j)); /* stale: freed, eager */
    CHECK(j.calls == E + 2 && g_fake.frees == 1 && g_fake.counter == 2 * (E + 3));
    CHECK_OK(dflash_graph_run(&c, key, 1, enqueue, &j)); /* captured again */
    CHECK(j.calls == E + 3 && g_fake.begins == 2 && g_fake.launches == 3 && g_fake.counter == 2 * (E + 4));
    dflash_graph_cache_free(&c);
    CHECK(g_fake.live == 0);
}

/* A failed capture leaves the call eager (its ops run once, not twice or
 * never); after two failures the key stays eager without trying again. */
static void test_failed_capture_stays_eager(void)
{
    reset();
    dflash_backend be = { &k_fake_ops, NULL };
    dflash_graph_cache c;
    dflash_graph_cache_init(&c, &be);
    job j = { 5, 0, 0 };
    const int32_t key[] = { 2, 2 };
    g_fake.fail_next_capture = 2;
    const int E = DFLASH_GRAPH_EAGER;
    for (int call = 1; call <= E + 4; call++) {
        CHECK_OK(dflash_graph_run(&c, key, 2, enqueue, &j));
        CHECKF(g_fake.counter == 5 * call, "call %d: counter %d", call, g_fake.counter);
    }
    CHECK(g_fake.begins == 2 && g_fake.launches == 0 && g_fake.live == 0 && c.captures == 0);
    /* E eager; capture fails + eager, twice; eager, eager */
    CHECK(j.calls == E + 6);
    dflash_graph_cache_free(&c);
}

/* A full cache gives up its least recently used graph; keys longer than
 * the cache's are refused. */
static void test_full_cache_and_bad_key(void)
{
    reset();
    dflash_backend be = { &k_fake_ops, NULL };
    dflash_graph_cache c;
    dflash_graph_cache_init(&c, &be);
    job j = { 1, 0, 0 };
    for (int32_t k = 0; k < DFLASH_GRAPH_CACHE + 1; k++) {
        run_n(&c, &k, 1, &j, DFLASH_GRAPH_EAGER + 1);
        if (k == 0) /* keep key 0 recent: key 1 is then the oldest */
            continue;
        const int32_t k0 = 0;
        CHECK_OK(dflash_graph_run(&c, &k0, 1, enqueue, &j));
    }
    CHECK(c.n == DFLASH_GRAPH_CACHE);
    CHECK(g_fake.live == DFLASH_GRAPH_CACHE && g_fake.frees == 1);
    const int before = j.calls;
    const int32_t k0 = 0, k1 = 1;
    CHECK_OK(dflash_graph_run(&c, &k0, 1, enqueue, &j)); /* still there: replayed */
    CHECK(j.calls == before);
    CHECK_OK(dflash_graph_run(&c, &k1, 1, enqueue, &j)); /* evicted: eager again */
    CHECK(j.calls == before + 1);
    int32_t big[DFLASH_GRAPH_KEY_LEN + 1] = { 0 };
    CHECK_FAILS(dflash_graph_run(&c, big, DFLASH_GRAPH_KEY_LEN + 1, enqueue, &j), DFLASH_ERR_INVALID_ARG,
                "a key of 25 fields");
    dflash_graph_cache_free(&c);
    CHECK(g_fake.live == 0);
}

/* No capture ops, or DFLASH_CUDA_GRAPHS=0: always eager, lengths not
 * bucketed. */
static void test_off(void)
{
    reset();
    dflash_backend plain = { &k_plain_ops, NULL }, be = { &k_fake_ops, NULL };
    dflash_graph_cache c;
    dflash_graph_cache_init(&c, &plain);
    job j = { 1, 2, 0 };
    const int32_t key[] = { 7 };
    run_n(&c, key, 1, &j, DFLASH_GRAPH_EAGER + 3);
    CHECK(!c.on && j.calls == DFLASH_GRAPH_EAGER + 3 && g_fake.counter == 3 * (DFLASH_GRAPH_EAGER + 3));
    CHECK(dflash_graph_keys_bucket(&c, 300, 100000) == 300);
    dflash_graph_cache_free(&c);
    setenv("DFLASH_CUDA_GRAPHS", "0", 1);
    dflash_levers_reload();
    dflash_graph_cache_init(&c, &be);
    unsetenv("DFLASH_CUDA_GRAPHS");
    dflash_levers_reload();
    run_n(&c, key, 1, &j, DFLASH_GRAPH_EAGER + 3);
    CHECK(!c.on && j.calls == 2 * (DFLASH_GRAPH_EAGER + 3) && g_fake.begins == 0);
    dflash_graph_cache_free(&c);
}

/* The buckets: powers of two from 256 to 8192, then multiples of 8192,
 * never past the cap nor below the keys. */
static void test_keys_bucket(void)
{
    dflash_backend be = { &k_fake_ops, NULL };
    dflash_graph_cache c;
    dflash_graph_cache_init(&c, &be);
    const int cases[][3] = { { 0, 1 << 20, 256 },      { 1, 1 << 20, 256 },       { 256, 1 << 20, 256 },
                             { 257, 1 << 20, 512 },    { 4112, 1 << 20, 8192 },   { 8192, 1 << 20, 8192 },
                             { 8193, 1 << 20, 16384 }, { 40000, 1 << 20, 40960 }, { 300, 400, 400 },
                             { 300, 100, 300 } };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const int got = dflash_graph_keys_bucket(&c, cases[i][0], cases[i][1]);
        CHECKF(got == cases[i][2], "keys %d cap %d: %d, want %d", cases[i][0], cases[i][1], got, cases[i][2]);
    }
    dflash_graph_cache_free(&c);
}

int main(void)
{
    RUN(test_eager_then_capture_then_replay);
    RUN(test_stale_graph_recaptured);
    RUN(test_failed_capture_stays_eager);
    RUN(test_full_cache_and_bad_key);
    RUN(test_off);
    RUN(test_keys_bucket);
    TEST_END();
}
