/* cpu_pool.c: the threads the CPU linear and attention split their work
 * over, and each thread's scratch buffer.
 *
 * Why not OpenMP here: a forward makes ~40 linear calls of 10-500 us each.
 * With OpenMP's passive waiting every call pays a futex wake-up of each
 * worker (tens of us on a VM), more than the work it shares; with active
 * waiting, workers that spin between calls starve the main thread as soon
 * as another process wants a core, and a static split then makes the main
 * thread wait for a preempted worker's whole half.
 *
 * So: the caller cuts the work into chunks (more chunks than threads) and
 * takes chunks itself from a shared counter; workers take chunks from the
 * same counter when they run. A worker that is preempted delays at most
 * the one chunk it holds; a worker that never wakes costs nothing, the
 * caller simply does every chunk. After a job, workers spin for a short
 * while (the next linear of a forward comes within microseconds), then
 * sleep on a condition variable. Which thread computes a chunk never
 * changes its bits: every output is computed whole by one kernel call. */
#include "backend/cpu/cpu_internal.h"
#include "core/levers.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define CPU_RELAX() _mm_pause()
#else
#define CPU_RELAX() ((void)0)
#endif

#define POOL_MAX_WORKERS 63
/* How long a worker spins for the next job before it sleeps. */
#define POOL_SPIN_NS 100000

typedef struct cpu_pool {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int n_workers;
    atomic_uint gen;      /* bumped for every job */
    atomic_int sleeping;  /* workers waiting on cv */
    /* the current job */
    void (*fn)(void *ctx, int chunk);
    void *ctx;
    int n_chunks;
    atomic_int next;      /* next chunk to take */
    atomic_int done;      /* chunks finished */
    /* Handing a job over without a lock: the caller marks the job slot
     * unpublished, waits until no worker is inside it, writes it, publishes
     * it; a worker announces itself (busy) before it looks at `published`
     * and reads the slot only if it is set. With sequentially consistent
     * atomics either the caller sees the worker (and waits for it) or the
     * worker sees the slot unpublished (and leaves it alone). */
    atomic_int busy;
    atomic_int published;
    atomic_flag in_use;
} cpu_pool;

static cpu_pool g_pool = { .in_use = ATOMIC_FLAG_INIT };
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static double now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e9 + ts.tv_nsec;
}

/* The caller waiting for a worker: spin briefly, then give the core away
 * each round (the worker it waits for may need this very core). */
static void wait_a_little(int *spins)
{
    if (++*spins < 2048)
        CPU_RELAX();
    else
        sched_yield();
}

static void take_chunks(cpu_pool *p)
{
    for (;;) {
        int i = atomic_fetch_add(&p->next, 1);
        if (i >= p->n_chunks)
            break;
        p->fn(p->ctx, i);
        atomic_fetch_add(&p->done, 1);
    }
}

static void *worker(void *arg)
{
    cpu_pool *p = arg;
    unsigned seen = atomic_load(&p->gen);
    for (;;) {
        double t0 = now_ns();
        int spins = 0;
        while (atomic_load(&p->gen) == seen) {
            CPU_RELAX();
            if (++spins % 256 == 0 && now_ns() - t0 > POOL_SPIN_NS) {
                pthread_mutex_lock(&p->mu);
                atomic_fetch_add(&p->sleeping, 1);
                while (atomic_load(&p->gen) == seen)
                    pthread_cond_wait(&p->cv, &p->mu);
                atomic_fetch_sub(&p->sleeping, 1);
                pthread_mutex_unlock(&p->mu);
            }
        }
        seen = atomic_load(&p->gen);
        atomic_fetch_add(&p->busy, 1);
        if (atomic_load(&p->published))
            take_chunks(p); /* returns at once if the caller took them all */
        atomic_fetch_sub(&p->busy, 1);
    }
    return NULL;
}

/* Workers: DFLASH_CPU_THREADS - 1; when that is unset, OMP_NUM_THREADS - 1
 * (its first number: the pool stands in for OpenMP here), else one per
 * online core but the caller's. */
static void pool_init(void)
{
    cpu_pool *p = &g_pool;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    long n = dflash_levers_get()->cpu_threads;
    const char *omp = getenv("OMP_NUM_THREADS");
    if (n == 0 && omp && *omp)
        n = strtol(omp, NULL, 10);
    if (n <= 0)
        n = sysconf(_SC_NPROCESSORS_ONLN);
    n = n < 1 ? 0 : n - 1;
    if (n > POOL_MAX_WORKERS)
        n = POOL_MAX_WORKERS;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    for (long i = 0; i < n; i++) {
        pthread_t t;
        if (pthread_create(&t, &attr, worker, p) != 0)
            break; /* fewer workers: the caller does more chunks */
        p->n_workers++;
    }
    pthread_attr_destroy(&attr);
}

int dflash_cpu_pool_threads(void)
{
    pthread_once(&g_once, pool_init);
    return g_pool.n_workers + 1;
}

void dflash_cpu_pool_run(void (*fn)(void *ctx, int chunk), void *ctx, int n_chunks)
{
    pthread_once(&g_once, pool_init);
    cpu_pool *p = &g_pool;
    /* One job at a time: a second caller (another thread of the program)
     * does its chunks itself. */
    if (p->n_workers == 0 || n_chunks <= 1 || atomic_flag_test_and_set(&p->in_use)) {
        for (int i = 0; i < n_chunks; i++)
            fn(ctx, i);
        return;
    }
    int spins = 0;
    atomic_store(&p->published, 0);
    while (atomic_load(&p->busy) > 0) /* a worker still looking at the last job */
        wait_a_little(&spins);
    p->fn = fn;
    p->ctx = ctx;
    p->n_chunks = n_chunks;
    atomic_store(&p->done, 0);
    atomic_store(&p->next, 0);
    atomic_store(&p->published, 1);
    atomic_fetch_add(&p->gen, 1);
    if (atomic_load(&p->sleeping) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->cv);
        pthread_mutex_unlock(&p->mu);
    }
    take_chunks(p);
    spins = 0;
    while (atomic_load(&p->done) < n_chunks) /* chunks a worker still holds */
        wait_a_little(&spins);
    atomic_flag_clear(&p->in_use);
}

/* Per-thread scratch, grown on demand and kept for the thread's life:
 * chunks run on every forward, so they must not allocate each time. A
 * thread-specific key frees it when a thread that used it exits (a
 * server's scheduler thread, say). */
static _Thread_local float *tl_scratch;
static _Thread_local size_t tl_scratch_cap;
static pthread_key_t scratch_key;
static pthread_once_t scratch_once = PTHREAD_ONCE_INIT;

static void scratch_key_make(void) { pthread_key_create(&scratch_key, free); }

float *dflash_cpu_scratch(size_t count)
{
    if (count > tl_scratch_cap) {
        float *p = realloc(tl_scratch, count * sizeof(float));
        if (!p)
            return NULL;
        pthread_once(&scratch_once, scratch_key_make);
        pthread_setspecific(scratch_key, p);
        tl_scratch = p;
        tl_scratch_cap = count;
    }
    return tl_scratch;
}
