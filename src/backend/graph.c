/* graph.c: the per-model cache of captured forwards (see graph.h). */
#include "backend/graph.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/levers.h"

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

void dflash_graph_cache_init(dflash_graph_cache *c, dflash_backend *be)
{
    memset(c, 0, sizeof *c);
    c->be = be;
    c->on = be->ops->capture_begin != NULL && dflash_levers_get()->cuda_graphs;
}

static void entry_clear(dflash_graph_cache *c, dflash_graph_entry *e)
{
    if (e->graph)
        c->be->ops->graph_free(c->be, e->graph);
    memset(e, 0, sizeof *e);
}

void dflash_graph_cache_free(dflash_graph_cache *c)
{
    if (!c->be)
        return;
    for (int i = 0; i < c->n; i++)
        entry_clear(c, &c->e[i]);
    c->n = 0;
}

/* FNV-1a over the key's fields. */
static uint32_t key_hash(const int32_t *key)
{
    uint32_t h = 2166136261u;
    for (int i = 0; i < DFLASH_GRAPH_KEY_LEN; i++)
        h = (h ^ (uint32_t)key[i]) * 16777619u;
    return h;
}

/* The entry of `key` (zero-padded to the full length), a fresh one in the
 * least recently used slot when the cache is full. */
static dflash_graph_entry *entry_for(dflash_graph_cache *c, const int32_t *key)
{
    const uint32_t h = key_hash(key);
    for (int i = 0; i < c->n; i++)
        if (c->e[i].hash == h && !memcmp(c->e[i].key, key, sizeof c->e[i].key))
            return &c->e[i];
    dflash_graph_entry *e = &c->e[c->n < DFLASH_GRAPH_CACHE ? c->n++ : 0];
    if (c->n == DFLASH_GRAPH_CACHE)
        for (int i = 0; i < c->n; i++)
            if (c->e[i].used < e->used)
                e = &c->e[i];
    entry_clear(c, e);
    memcpy(e->key, key, sizeof e->key);
    e->hash = h;
    return e;
}

/* Record enqueue's ops into e->graph; on failure the queue is as before
 * and e->graph stays NULL. */
static void capture(dflash_graph_cache *c, dflash_graph_entry *e, dflash_status (*enqueue)(void *), void *self)
{
    const dflash_backend_ops *o = c->be->ops;
    const double t0 = now_s();
    if (o->capture_begin(c->be) != DFLASH_OK) {
        e->failed++;
        return;
    }
    dflash_status s = enqueue(self);
    void *g = NULL;
    dflash_status se = o->capture_end(c->be, &g); /* closes the capture whatever happened */
    if (s != DFLASH_OK || se != DFLASH_OK) {
        if (g)
            o->graph_free(c->be, g);
        e->failed++;
        return;
    }
    e->graph = g;
    c->captures++;
    c->capture_s += now_s() - t0;
}

dflash_status dflash_graph_run(dflash_graph_cache *c, const int32_t *key, int key_len,
                               dflash_status (*enqueue)(void *self), void *self)
{
    if (!c->on)
        return enqueue(self);
    if (key_len < 0 || key_len > DFLASH_GRAPH_KEY_LEN)
        return dflash_fail(DFLASH_ERR_INVALID_ARG, "graph: a key of %d fields (at most %d)", key_len,
                           DFLASH_GRAPH_KEY_LEN);
    int32_t k[DFLASH_GRAPH_KEY_LEN] = { 0 };
    memcpy(k, key, (size_t)key_len * sizeof *k);
    dflash_graph_entry *e = entry_for(c, k);
    e->used = ++c->clock;
    if (e->runs < DFLASH_GRAPH_EAGER || e->failed >= 2) {
        e->runs += e->runs < DFLASH_GRAPH_EAGER; /* no count to overflow in a server's lifetime */
        return enqueue(self);
    }
    if (!e->graph)
        capture(c, e, enqueue, self);
    if (e->graph) {
        int stale = 0;
        DFLASH_TRY(c->be->ops->graph_launch(c->be, e->graph, &stale));
        if (!stale)
            return DFLASH_OK;
        /* a workspace moved since the capture: run eagerly now (the call
         * sizes it again) and capture afresh next time */
        c->be->ops->graph_free(c->be, e->graph);
        e->graph = NULL;
    }
    return enqueue(self);
}

int dflash_graph_keys_bucket(const dflash_graph_cache *c, int keys, int cap)
{
    if (!c->on)
        return keys;
    int b = 256;
    while (b < keys && b < 8192)
        b *= 2;
    if (b < keys)
        b = (keys + 8191) / 8192 * 8192;
    if (b > cap)
        b = cap;
    return b > keys ? b : keys;
}
