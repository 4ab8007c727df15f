/* cuda_graph.c: the graph ops of backend.h on the backend's stream.
 *
 * A capture records every op enqueued between begin and end (kernels with
 * their arguments, memsets, device copies) into a CUDA graph that replays
 * them with one launch; kernels launched with programmatic dependent
 * launch keep that overlap as the graph's programmatic edges. The ops that
 * cannot be recorded refuse while c->capturing is set (cuda_backend.c), so
 * a capture fails cleanly instead of leaving the stream broken. */
#include <stdlib.h>

#include "backend/cuda/cuda_internal.h"

typedef struct cuda_graph {
    CUgraphExec exec;
    uint64_t ws_gen; /* the workspaces' generation it was captured with */
} cuda_graph;

dflash_status cuda_capture_begin(dflash_backend *be)
{
    cuda_ctx *c = CTX(be);
    if (c->capturing)
        return dflash_fail(DFLASH_ERR_INVALID_ARG, "cuda graph capture: a capture is already open");
    DFLASH_TRY(cuda_enter(c));
    /* Relaxed: other threads' unrelated driver calls stay legal meanwhile. */
    DFLASH_TRY(DFLASH_CU(&c->cu, cuStreamBeginCapture(c->stream, DFLASH_CU_STREAM_CAPTURE_MODE_RELAXED)));
    c->capturing = 1;
    return DFLASH_OK;
}

dflash_status cuda_capture_end(dflash_backend *be, void **graph)
{
    cuda_ctx *c = CTX(be);
    *graph = NULL;
    if (!c->capturing)
        return dflash_fail(DFLASH_ERR_INVALID_ARG, "cuda graph capture: no capture is open");
    c->capturing = 0;
    DFLASH_TRY(cuda_enter(c));
    CUgraph g = NULL;
    DFLASH_TRY(DFLASH_CU(&c->cu, cuStreamEndCapture(c->stream, &g)));
    cuda_graph *cg = calloc(1, sizeof *cg);
    dflash_status s = cg ? DFLASH_OK : dflash_fail(DFLASH_ERR_OOM, "cuda graph: out of memory");
    if (s == DFLASH_OK)
        s = DFLASH_CU(&c->cu, cuGraphInstantiateWithFlags(&cg->exec, g, 0));
    c->cu.cuGraphDestroy(g); /* the instance keeps what it needs */
    if (s != DFLASH_OK) {
        free(cg);
        return s;
    }
    cg->ws_gen = c->ws_gen;
    *graph = cg;
    return DFLASH_OK;
}

dflash_status cuda_graph_launch(dflash_backend *be, void *graph, int *stale)
{
    cuda_ctx *c = CTX(be);
    cuda_graph *g = graph;
    *stale = g->ws_gen != c->ws_gen;
    if (*stale)
        return DFLASH_OK;
    DFLASH_TRY(cuda_enter(c));
    DFLASH_TRY(DFLASH_CU(&c->cu, cuGraphLaunch(g->exec, c->stream)));
    c->count.launches++;
    return DFLASH_OK;
}

void cuda_graph_free(dflash_backend *be, void *graph)
{
    cuda_ctx *c = CTX(be);
    cuda_graph *g = graph;
    if (!g)
        return;
    c->cu.cuCtxSetCurrent(c->ctx);
    c->cu.cuGraphExecDestroy(g->exec);
    free(g);
}
