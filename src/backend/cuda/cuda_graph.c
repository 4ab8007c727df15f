/* cuda_graph.c: CUDA graphs of the backend's stream, for tools.
 *
 * A capture records every op enqueued between begin and end (kernels with
 * their arguments, memsets, device copies) into a graph that replays them
 * with one launch. The ops run nothing while captured; uploads are the
 * exception (cuda_upload copies at capture time, since a pageable source
 * cannot be a node), so a replay reads the inputs as they were then. An op
 * that waits for the device (a download, a sync) cannot be captured: the
 * capture fails and the stream is left as it was. */
#include <stdlib.h>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_internal.h"

struct dflash_cuda_graph {
    CUgraphExec exec;
};

static dflash_status check_cuda(dflash_backend *be, const char *what)
{
    if (!cuda_is_backend(be))
        return dflash_fail(DFLASH_ERR_INVALID_ARG, "cuda graph %s: not a CUDA backend", what);
    return DFLASH_OK;
}

dflash_status dflash_cuda_capture_begin(dflash_backend *be)
{
    DFLASH_TRY(check_cuda(be, "capture"));
    cuda_ctx *c = CTX(be);
    if (c->capturing)
        return dflash_fail(DFLASH_ERR_INVALID_ARG, "cuda graph capture: a capture is already open");
    DFLASH_TRY(cuda_enter(c));
    /* Relaxed: the capture-time uploads (cuMemcpyHtoD) are calls the
     * stricter modes refuse while any stream is being captured. */
    DFLASH_TRY(DFLASH_CU(&c->cu, cuStreamBeginCapture(c->stream, DFLASH_CU_STREAM_CAPTURE_MODE_RELAXED)));
    c->capturing = 1;
    return DFLASH_OK;
}

dflash_status dflash_cuda_capture_end(dflash_backend *be, dflash_cuda_graph **out)
{
    *out = NULL;
    DFLASH_TRY(check_cuda(be, "capture"));
    cuda_ctx *c = CTX(be);
    if (!c->capturing)
        return dflash_fail(DFLASH_ERR_INVALID_ARG, "cuda graph capture: no capture is open");
    c->capturing = 0;
    DFLASH_TRY(cuda_enter(c));
    CUgraph g = NULL;
    DFLASH_TRY(DFLASH_CU(&c->cu, cuStreamEndCapture(c->stream, &g)));
    dflash_cuda_graph *cg = calloc(1, sizeof *cg);
    dflash_status s = cg ? DFLASH_OK : dflash_fail(DFLASH_ERR_OOM, "cuda graph: out of memory");
    if (s == DFLASH_OK)
        s = DFLASH_CU(&c->cu, cuGraphInstantiateWithFlags(&cg->exec, g, 0));
    c->cu.cuGraphDestroy(g); /* the instance keeps what it needs */
    if (s != DFLASH_OK) {
        free(cg);
        return s;
    }
    *out = cg;
    return DFLASH_OK;
}

dflash_status dflash_cuda_graph_launch(dflash_backend *be, const dflash_cuda_graph *g)
{
    DFLASH_TRY(check_cuda(be, "launch"));
    cuda_ctx *c = CTX(be);
    DFLASH_TRY(cuda_enter(c));
    return DFLASH_CU(&c->cu, cuGraphLaunch(g->exec, c->stream));
}

void dflash_cuda_graph_free(dflash_backend *be, dflash_cuda_graph *g)
{
    if (!g || !cuda_is_backend(be))
        return;
    cuda_ctx *c = CTX(be);
    c->cu.cuCtxSetCurrent(c->ctx);
    c->cu.cuGraphExecDestroy(g->exec);
    free(g);
}
