/* graph.h: a model's forward replayed from a captured device graph.
 *
 * On a GPU each kernel launch costs the host a few microseconds and the
 * device a gap between kernels; a forward of a few hundred small kernels
 * loses a few percent of its time there (a tiny model, most of it). A
 * backend that can capture its queue records the ops of one forward once
 * and replays them with one launch.
 *
 * A replay runs the same kernels with the same arguments: what may change
 * between replays is the contents of device memory (the forward's inputs,
 * uploaded before each replay; the KV pages), never an address or a host
 * value an op was called with. So a model keys each graph by every host
 * value its enqueued ops depend on (rows, sequences, the attention grid's
 * bounds, ...), and sizes what would otherwise follow the context length
 * (attention's key splits) from a bucket (dflash_graph_keys_bucket): the
 * kernels read the true lengths from device memory and skip the rest.
 *
 * A shape runs eagerly its first DFLASH_GRAPH_EAGER calls (the first
 * sizes the backend's workspaces), is captured and replayed at the next,
 * replayed after. Capturing costs the host one to two times what
 * launching the ops does (recording them, then instantiating the graph;
 * measured 0.1-0.4 ms for a small model's forward, 1.5-1.7 ms for an 8B
 * one's): shapes seen only a few times (a prompt's prefill chunks) never
 * pay it. A capture that fails (a workspace had to grow, an op waits for
 * the device) leaves that call eager; a shape that fails twice stays
 * eager. DFLASH_CUDA_GRAPHS=0 in the environment turns graphs off. */
#ifndef DFLASH_BACKEND_GRAPH_H
#define DFLASH_BACKEND_GRAPH_H

#include <stdint.h>

#include "backend/backend.h"

#define DFLASH_GRAPH_KEY_LEN 24 /* int32 fields of a shape key */
#define DFLASH_GRAPH_CACHE 256  /* graphs kept per model; the least recently used goes */
#define DFLASH_GRAPH_EAGER 7    /* calls of a shape run eagerly before it is captured */

typedef struct dflash_graph_entry {
    int32_t key[DFLASH_GRAPH_KEY_LEN];
    uint32_t hash; /* of key: a lookup compares this first */
    void *graph;   /* the backend's graph, or NULL: not captured yet */
    int runs;      /* its eager calls so far (counted up to DFLASH_GRAPH_EAGER) */
    int failed;    /* captures that failed */
    uint64_t used; /* the cache's clock at the last call */
} dflash_graph_entry;

typedef struct dflash_graph_cache {
    dflash_backend *be;
    int on; /* the backend captures and DFLASH_CUDA_GRAPHS is not 0 */
    int n;
    uint64_t clock;
    int captures;     /* graphs captured so far (for benchmarks) */
    double capture_s; /* host seconds spent capturing them */
    dflash_graph_entry e[DFLASH_GRAPH_CACHE];
} dflash_graph_cache;

void dflash_graph_cache_init(dflash_graph_cache *c, dflash_backend *be);
void dflash_graph_cache_free(dflash_graph_cache *c);

/* Run enqueue(self), which must only enqueue ops on c->be (no waits for the
 * device, no host state changed: a failed capture runs it again), for the
 * shape `key` (key_len <= DFLASH_GRAPH_KEY_LEN fields; every host value the
 * ops depend on): eagerly, or from the shape's graph as said above. With
 * graphs off, just enqueue(self). */
dflash_status dflash_graph_run(dflash_graph_cache *c, const int32_t *key, int key_len,
                               dflash_status (*enqueue)(void *self), void *self);

/* The key count attention's grid is sized by when graphs are on: `keys`
 * rounded up to a power of two from 256 up to 8192, then to a multiple of
 * 8192, at most `cap` (the most keys a sequence can have; at least keys).
 * With graphs off, keys itself. */
int dflash_graph_keys_bucket(const dflash_graph_cache *c, int keys, int cap);

#endif
