/* kernel_trace.c: every kernel's start and end on the GPU, as the device
 * ran it, for a program that does not know it is traced: a shared library
 * loaded with LD_PRELOAD that turns on CUPTI's kernel activity records
 * (one record per kernel, graph nodes included) when the program starts
 * and writes them when it exits. Nsight Compute times each kernel alone
 * and cold; this shows the kernels of a replayed CUDA graph as they
 * overlap under programmatic dependent launch, which is where a forward's
 * time goes.
 *
 * Built on the GPU machine by tools/gpu-test.sh (GPU_TEST_TRACE) against
 * that machine's cupti_activity.h; KREC names its kernel record struct
 * (the versioned CUpti_ActivityKernelN: only the leading fields are
 * read, which every version shares).
 *
 *   gcc -shared -fPIC -DKREC=CUpti_ActivityKernel10 -I$CUDA/include \
 *       -o libkernel_trace.so tools/cuda/kernel_trace.c -L$CUDA/lib64 -lcupti
 *   DFLASH_KERNEL_TRACE=trace.csv LD_PRELOAD=./libkernel_trace.so dflash bench ...
 *
 * Output (DFLASH_KERNEL_TRACE, default standard error): one CSV line per
 * kernel in start order, "start_ns,end_ns,graph_id,node_id,name" (graph
 * and node 0 for a kernel launched outside a graph);
 * tools/cuda/kernel_trace.py summarises it. */
#include <cupti.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef KREC
#error "KREC: the CUpti_ActivityKernelN struct of this CUPTI (see the header comment)"
#endif

#define TRACE_BUF (8u << 20)

typedef struct kernel_rec {
    uint64_t start, end, node;
    uint32_t graph;
    char name[96];
} kernel_rec;

static kernel_rec *g_recs;
static size_t g_n, g_cap;
static size_t g_dropped;

static void CUPTIAPI buffer_requested(uint8_t **buffer, size_t *size, size_t *max_records)
{
    *buffer = aligned_alloc(8, TRACE_BUF);
    *size = *buffer ? TRACE_BUF : 0;
    *max_records = 0;
}

static void keep(const KREC *k)
{
    if (g_n == g_cap) {
        size_t cap = g_cap ? 2 * g_cap : 4096;
        kernel_rec *r = realloc(g_recs, cap * sizeof *r);
        if (!r) {
            g_dropped++;
            return;
        }
        g_recs = r;
        g_cap = cap;
    }
    kernel_rec *r = &g_recs[g_n++];
    r->start = k->start;
    r->end = k->end;
    r->graph = k->graphId;
    r->node = k->graphNodeId;
    snprintf(r->name, sizeof r->name, "%s", k->name ? k->name : "?");
}

static void CUPTIAPI buffer_completed(CUcontext ctx, uint32_t stream, uint8_t *buffer, size_t size, size_t valid)
{
    (void)size;
    CUpti_Activity *rec = NULL;
    while (cuptiActivityGetNextRecord(buffer, valid, &rec) == CUPTI_SUCCESS)
        if (rec->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL || rec->kind == CUPTI_ACTIVITY_KIND_KERNEL)
            keep((const KREC *)rec);
    size_t dropped = 0;
    if (cuptiActivityGetNumDroppedRecords(ctx, stream, &dropped) == CUPTI_SUCCESS)
        g_dropped += dropped;
    free(buffer);
}

static int by_start(const void *a, const void *b)
{
    const kernel_rec *x = a, *y = b;
    return x->start < y->start ? -1 : x->start > y->start;
}

static void report(const char *what, CUptiResult r)
{
    const char *s = NULL;
    cuptiGetResultString(r, &s);
    fprintf(stderr, "kernel_trace: %s: %s\n", what, s ? s : "?");
}

static void __attribute__((destructor)) trace_end(void)
{
    CUptiResult r = cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    if (r != CUPTI_SUCCESS)
        report("cuptiActivityFlushAll", r);
    qsort(g_recs, g_n, sizeof *g_recs, by_start);
    const char *path = getenv("DFLASH_KERNEL_TRACE");
    FILE *f = path && *path ? fopen(path, "w") : stderr;
    if (!f) {
        fprintf(stderr, "kernel_trace: %s: cannot be written\n", path);
        return;
    }
    fprintf(f, "start_ns,end_ns,graph_id,node_id,name\n");
    for (size_t i = 0; i < g_n; i++)
        fprintf(f, "%llu,%llu,%u,%llu,%s\n", (unsigned long long)g_recs[i].start, (unsigned long long)g_recs[i].end,
                g_recs[i].graph, (unsigned long long)g_recs[i].node, g_recs[i].name);
    if (f != stderr && fclose(f) != 0)
        fprintf(stderr, "kernel_trace: %s: write error\n", path);
    fprintf(stderr, "kernel_trace: %zu kernels%s%s, %zu records dropped\n", g_n, f != stderr ? " to " : "",
            f != stderr ? path : "", g_dropped);
    free(g_recs);
}

static void __attribute__((constructor)) trace_begin(void)
{
    CUptiResult r = cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed);
    if (r == CUPTI_SUCCESS)
        r = cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
    if (r != CUPTI_SUCCESS)
        report("enabling kernel records", r);
}
