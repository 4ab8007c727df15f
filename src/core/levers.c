/* levers.c: see levers.h. Malformed values fall back to the default with a
 * warning on stderr rather than failing: a lever must never break a run. */
#include "core/levers.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <strings.h>

const char *const dflash_cpu_isa_names[DFLASH_CPU_ISA_COUNT] = { "portable", "avx2", "avx512" };

static dflash_levers g_levers;
static int g_loaded;

static int env_int(const char *name, int def, int lo, int hi)
{
    const char *v = getenv(name);
    if (!v || !*v)
        return def;
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || *end || x < lo || x > hi) {
        fprintf(stderr, "dflash: ignoring %s='%s' (expected an integer in [%d, %d]); using %d\n", name, v, lo, hi,
                def);
        return def;
    }
    return (int)x;
}

/* One of names[0..n), case-insensitive, as its index; unset: -1. */
static int env_choice(const char *name, const char *const *names, int n)
{
    const char *v = getenv(name);
    if (!v || !*v)
        return -1;
    for (int i = 0; i < n; i++)
        if (!strcasecmp(v, names[i]))
            return i;
    fprintf(stderr, "dflash: ignoring %s='%s' (expected", name, v);
    for (int i = 0; i < n; i++)
        fprintf(stderr, "%s %s", i ? (i == n - 1 ? " or" : ",") : "", names[i]);
    fprintf(stderr, ")\n");
    return -1;
}

void dflash_levers_reload(void)
{
    g_levers.ctx_cap = env_int("DFLASH_CTX_CAP", 4096, 0, 1 << 30);
    g_levers.drafter_fp8 = env_int("DFLASH_DRAFTER_FP8", env_int("ATLAS_DFLASH_DRAFTER_FP8", 0, 0, 1), 0, 1);
    g_levers.log_level = env_int("DFLASH_LOG", 1, 0, 2);
    g_levers.cuda_pdl = env_int("DFLASH_CUDA_PDL", 1, 0, 1);
    g_levers.cuda_graphs = env_int("DFLASH_CUDA_GRAPHS", 1, 0, 1);
    g_levers.host_sampling = env_int("DFLASH_HOST_SAMPLING", 0, 0, 1);
    g_levers.host_drafts = env_int("DFLASH_HOST_DRAFTS", 0, 0, 1);
    g_levers.cuda_gemm_split = env_int("DFLASH_CUDA_GEMM_SPLIT", 0, 0, 16);
    g_levers.cuda_gemm_share_sum = env_int("DFLASH_CUDA_GEMM_SHARE_SUM", 1, 0, 2);
    g_levers.cuda_gemm_defer_sum = env_int("DFLASH_CUDA_GEMM_DEFER_SUM", 1, 0, 1);
    g_levers.cuda_qk_attention = env_int("DFLASH_CUDA_QK_ATTENTION", 1, 0, 1);
    g_levers.cuda_route_sum_rows = env_int("DFLASH_CUDA_ROUTE_SUM_ROWS", 1, 0, 64);
    g_levers.cuda_attn_group = env_int("DFLASH_CUDA_ATTN_GROUP", 0, 0, 32);
    g_levers.cuda_attn_min_warps = env_int("DFLASH_CUDA_ATTN_MIN_WARPS", 0, 0, 8);
    g_levers.cuda_gemm_wide = env_int("DFLASH_CUDA_GEMM_WIDE", 65, 1, 1 << 30);
    g_levers.cuda_gemm_tile = env_int("DFLASH_CUDA_GEMM_TILE", 0, 0, 128);
    g_levers.cuda_experts_chain = env_int("DFLASH_CUDA_EXPERTS_CHAIN", 0, 0, 8);
    g_levers.cuda_experts_tile = env_int("DFLASH_CUDA_EXPERTS_TILE", 0, 0, 64);
    g_levers.cuda_experts_slice = env_int("DFLASH_CUDA_EXPERTS_SLICE", 0, 0, 1 << 20);
    const int et = g_levers.cuda_experts_tile;
    if (et != 0 && et != 8 && et != 16 && et != 32 && et != 64) {
        fprintf(stderr, "dflash: ignoring DFLASH_CUDA_EXPERTS_TILE='%d' (expected 8, 16, 32 or 64)\n", et);
        g_levers.cuda_experts_tile = 0;
    }
    const int tile = g_levers.cuda_gemm_tile;
    if (tile != 0 && tile != 32 && tile != 64 && tile != 128) {
        fprintf(stderr, "dflash: ignoring DFLASH_CUDA_GEMM_TILE='%d' (expected 32, 64 or 128)\n", tile);
        g_levers.cuda_gemm_tile = 0;
    }
    g_levers.cpu_isa = env_choice("DFLASH_CPU_ISA", dflash_cpu_isa_names, DFLASH_CPU_ISA_COUNT);
    g_levers.cpu_threads = env_int("DFLASH_CPU_THREADS", 0, 0, 1024);
    g_loaded = 1;
}

const dflash_levers *dflash_levers_get(void)
{
    if (!g_loaded)
        dflash_levers_reload();
    return &g_levers;
}
