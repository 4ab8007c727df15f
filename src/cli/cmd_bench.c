/* cmd_bench.c: `dflash bench`: time the forwards speculative decoding is made
 * of, at published geometries, against a memory-bandwidth floor measured in
 * the same run. It owns the presets, the random-weight models
 * (bf16 safetensors images built in memory, configs built as JSON text), the
 * bandwidth measurement, the timing loop and the report (table or JSON).
 *
 * What is timed, per context length:
 *   propose  one drafter propose of B-1 drafts (block forward, LM head,
 *            argmax, drafts downloaded) over `ctx` committed context rows;
 *   verify   one 16-row target forward with the greedy token of all 16 rows
 *            (LM head + argmax, as the decode loop runs it);
 *   decode   one 1-row target forward with its greedy token;
 *   step     (a preset with a drafter and a target) one whole speculative
 *            step: propose, the block's verify with the drafter's taps,
 *            the drafter taking the block's rows into its context;
 *   with --sessions, each for N sequences in one call (a propose over N,
 *            a verify of N x 16 rows, a decode of N rows), what one step
 *            of N sessions stepped together costs.
 * Each call sees the same state: a propose keeps nothing, and the target's
 * KV is truncated back to `ctx` after each timed call (untimed).
 *
 * Floor = bytes the call must move (weights read once, the context's K/V
 * read once in the pool's dtype: f32 on the CPU, bf16 on the GPU) / the
 * bandwidth measured here (bytes read + written): on the GPU the better of
 * the driver's device copy and the backend's own copy op, on the CPU the
 * copy op. */
#include <jansson.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_backend.h"
#include "backend/graph.h"
#include "cli/args.h"
#include "cli/bench_model.h"
#include "cli/commands.h"
#include "core/levers.h"
#include "draft/dflash_head.h"
#include "spec/spec_internal.h"

#define BENCH_WARMUP 3
/* on the GPU a shape's first calls run eagerly, the later ones replay its
 * captured graph (backend/graph.h): warm-up past the capture */
#define BENCH_WARMUP_GPU (DFLASH_GRAPH_EAGER + 3)
#define BENCH_MAX_REPS 1000
#define BENCH_MAX_CTX 16      /* context lengths per run */
#define BENCH_VERIFY_ROWS 16   /* default verify width */
#define BENCH_MAX_ROWS 64      /* verify widths up to this */
#define BENCH_MAX_WIDTHS 16
#define BENCH_MAX_SESS 8       /* session counts per run */
#define BENCH_MAX_SESSIONS 64  /* sequences in one forward at most */
#define BENCH_MAX_BLOCK 256    /* drafts per propose at most */
#define BENCH_BW_REPS 5

/* ---- presets ------------------------------------------------------------ */

#define SEED_DRAFTER .drafter = 1, .d = { 8, 2048, 32, 4, 128, 6144 }, .block = 16, .target_layers = 40, .n_taps = 5, \
                     .taps = { 1, 10, 19, 28, 37 }
/* Qwen3.5-35B-A3B (Qwen3.6-35B-A3B, the seed drafter's target, has the
 * same architecture): 40 layers, every 4th gated full attention */
#define QWEN36_TARGET .target = 1, .t = { 40, 2048, 16, 2, 256, 0 }, .experts = 256, .topk = 8, .moe_inter = 512, \
                      .hy = { 16, 32, 128, 128, 4, 512 }

static const bench_preset k_presets[] = {
    { .name = "seed-drafter", .vocab = 151936, SEED_DRAFTER },
    { .name = "qwen3-8b-drafter", .vocab = 151936, .drafter = 1, .d = { 5, 4096, 32, 8, 128, 12288 }, .block = 16,
      .target_layers = 36, .n_taps = 5, .taps = { 1, 9, 17, 25, 33 } },
    { .name = "qwen3-8b-target", .vocab = 151936, .target = 1, .t = { 36, 4096, 32, 8, 128, 12288 } },
    { .name = "llama31-8b-target", .vocab = 128256, .target = 1, .t = { 32, 4096, 32, 8, 128, 14336 }, .llama = 1 },
    /* Qwen3-30B-A3B (Qwen3-Coder-30B-A3B has the same geometry) */
    { .name = "qwen3-30b-a3b-target", .vocab = 151936, .target = 1, .t = { 48, 2048, 32, 4, 128, 6144 },
      .experts = 128, .topk = 8, .moe_inter = 768 },
    { .name = "qwen36-35b-a3b-target", .vocab = 248320, QWEN36_TARGET },
    /* the seed's own pair: its drafter and its target, each timed */
    { .name = "seed-pair", .vocab = 248320, SEED_DRAFTER, QWEN36_TARGET },
    /* The embedded pair's geometry (models/qwen3-pystd and its drafter). */
    { .name = "pystd", .vocab = 4096, .drafter = 1, .d = { 5, 256, 4, 2, 64, 768 }, .block = 16,
      .target_layers = 6, .n_taps = 3, .taps = { 1, 3, 5 }, .target = 1, .t = { 6, 256, 4, 2, 64, 768 },
      .tied = 1 },
    /* A few MB: both benches' code paths in seconds on a 2-core CPU (tests). */
    { .name = "tiny", .vocab = 512, .drafter = 1, .d = { 2, 64, 4, 2, 16, 128 }, .block = 8, .target_layers = 4,
      .n_taps = 2, .taps = { 1, 2 }, .target = 1, .t = { 4, 64, 4, 2, 16, 128 } },
    { .name = "tiny-llama", .vocab = 512, .target = 1, .t = { 4, 64, 4, 2, 16, 128 }, .llama = 1 },
    { .name = "tiny-moe", .vocab = 512, .target = 1, .t = { 4, 64, 4, 2, 16, 128 }, .experts = 8, .topk = 2,
      .moe_inter = 32 },
    { .name = "tiny-q35", .vocab = 512, .target = 1, .t = { 4, 64, 4, 2, 16, 0 }, .experts = 8, .topk = 2,
      .moe_inter = 32, .hy = { 2, 4, 16, 8, 4, 48 } },
};

static const bench_preset *find_preset(const char *name)
{
    for (size_t i = 0; i < sizeof k_presets / sizeof k_presets[0]; i++)
        if (!strcmp(k_presets[i].name, name))
            return &k_presets[i];
    return NULL;
}

/* ---- arguments ---------------------------------------------------------- */

typedef struct bench_args {
    const bench_preset *preset;
    const char *device;
    int reps, json, n_ctx, fp8, n_rows;
    int ctx[BENCH_MAX_CTX]; /* ascending, distinct; n_ctx 0: the defaults */
    int rows[BENCH_MAX_WIDTHS]; /* verify widths; n_rows 0: 16 */
    int n_sess, sess[BENCH_MAX_SESS]; /* --sessions: sequences per forward */
    const char *profile;   /* --profile as given (for the CPU's "ignored" message) */
    int sample;            /* --sample: verify and decode rows draw their tokens by these options */
    int penalties;         /* --penalties: so's penalties are on too */
    dflash_sampler_opts so;
    unsigned profile_mask; /* bit i: the row k_profile_rows[i] is profiled */
} bench_args;

static void usage(FILE *f)
{
    fprintf(f,
            "usage: dflash bench [--preset P] [--ctx LIST] [--rows LIST] [--sessions LIST]\n"
            "                    [--reps N] [--device D] [--drafter-quant Q] [--json]\n"
            "                    [--sample T,K,P [--penalties R,F,P]] [--profile LIST]\n"
            "\n"
            "Time one drafter propose and the target's verify and decode forwards (and,\n"
            "for a preset with both, one whole speculative step: propose, verify of the\n"
            "block with the drafter's taps, the drafter taking the block's rows) at a\n"
            "published geometry, on random bf16 weights built in memory (several GB for\n"
            "the real presets; progress on stderr), against the floor: the bytes the call\n"
            "must move (weights read once + the context's K/V in the pool's dtype: f32 on\n"
            "the CPU, bf16 on the GPU) over the memory bandwidth measured in the same run\n"
            "(GPU: the faster of the driver's device copy and the backend's copy op).\n"
            "\n"
            "  --preset P     seed-drafter (default): 8 layers, H 2048, I 6144, 32:4 x 128,\n"
            "                   vocab 151936, block 16, taps [1,10,19,28,37] of 40 layers\n"
            "                 qwen3-8b-drafter: 5 layers, H 4096, I 12288, 32:8 x 128,\n"
            "                   vocab 151936, block 16, taps [1,9,17,25,33] of 36 layers\n"
            "                 qwen3-8b-target: 36 layers, H 4096, I 12288, 32:8 x 128,\n"
            "                   vocab 151936, untied LM head\n"
            "                 llama31-8b-target: Llama 3.1 8B: 32 layers, H 4096, I 14336,\n"
            "                   32:8 x 128, vocab 128256, untied LM head, llama3 RoPE\n"
            "                 qwen3-30b-a3b-target: Qwen3-30B-A3B (a Qwen3-MoE): 48 layers,\n"
            "                   H 2048, 32:4 x 128, 128 experts of I 768, 8 per token,\n"
            "                   vocab 151936 (61 GB of weights; its floor counts the\n"
            "                   experts the call's rows were routed to, read once each)\n"
            "                 qwen36-35b-a3b-target: Qwen3.5/3.6-35B-A3B (a Qwen3.5-MoE hybrid): 40\n"
            "                   layers, 30 Gated DeltaNet (16 key heads x 128, 32 value heads x 128)\n"
            "                   and 10 gated attention (16:2 x 256), H 2048, 256 experts of I 512,\n"
            "                   8 per token, a shared expert of I 512, vocab 248320 (70 GB of\n"
            "                   weights; its floor adds each sequence's delta-rule state, read once,\n"
            "                   and each row's record, written once)\n"
            "                 seed-pair: the seed drafter (as seed-drafter, vocab 248320) and its\n"
            "                   target (as qwen36-35b-a3b-target), each timed, then whole steps\n"
            "                 pystd: the embedded pair (models/qwen3-pystd and its drafter):\n"
            "                   6 + 5 layers, H 256, I 768, 4:2 x 64, vocab 4096, block 16\n"
            "                 tiny: a few MB (drafter and target), for tests; tiny-llama,\n"
            "                   tiny-moe, tiny-q35: its target as a Llama, as a Qwen3-MoE, as a\n"
            "                   Qwen3.5-MoE hybrid\n"
            "  --ctx LIST     context lengths, comma-separated (default 1024,4096 for a\n"
            "                 drafter, 1,1024,4096 for a target)\n"
            "  --rows LIST    verify widths in rows, comma-separated (default 16, at most %d):\n"
            "                 what a step of k drafts costs the target (k + 1 rows)\n"
            "  --sessions LIST  also N sequences in one call, each at the context length\n"
            "                 (comma-separated, each 2..%d): the drafter's propose for N\n"
            "                 sequences (N x block rows); the target's decode of N rows and\n"
            "                 verify of N x the widths (verify / decode at N is the tokens\n"
            "                 per session a step must commit for speculation to pay, the\n"
            "                 propose not counted)\n"
            "  --reps N       timed calls per row after %d warm-up calls (%d on the GPU,\n"
            "                 past the capture of each shape's CUDA graph; default 20);\n"
            "                 the median and the minimum are reported\n"
            "  --device D     cpu (default), cuda, or auto (cuda when a GPU is usable)\n"
            "  --drafter-quant Q  bf16 (default) or fp8: the drafter's projection weights in\n"
            "                 fp8 e4m3 with per-row scales (the LM head stays bf16)\n"
            "  --json         print one JSON object instead of the table\n"
            "  --profile LIST (cuda) the first timed call of each row named in LIST\n"
            "                 (comma-separated: propose, verify, decode, step) between\n"
            "                 cuProfilerStart and cuProfilerStop,\n"
            "                 for `ncu --profile-from-start off`: every kernel of those\n"
            "                 calls and nothing else (building weights is not profiled)\n"
            "  --sample T,K,P  verify and decode rows draw each row's token by temperature\n"
            "                 T, top-k K (0: off) and top-p P instead of the argmax: the\n"
            "                 logits written, then drawn on the device (CUDA), or downloaded\n"
            "                 and drawn on the host, one row after another\n"
            "                 (DFLASH_HOST_SAMPLING=1 on the GPU, always on the CPU)\n"
            "  --penalties R,F,P  with --sample: repetition R, frequency F and presence P\n"
            "                 penalties too, over the context's tokens (the prompt), 64\n"
            "                 generated ones and, for each row, the rows before it in its\n"
            "                 block (as drafts)\n"
            "  -h, --help     this text\n"
            "\n"
            "Rows: propose (drafter, B-1 drafts incl. LM head and argmax), verify (target,\n"
            "16 rows or --rows, the greedy token of each: LM head + argmax), decode (target,\n"
            "1 row).\n"
            "Times are per call: CUDA events on the GPU, the monotonic clock around call +\n"
            "sync on the CPU. On the GPU each row also gives, per call, the kernel launches,\n"
            "the host waits for the device and the host-to-device copies.\n",
            BENCH_MAX_ROWS, BENCH_MAX_SESSIONS, BENCH_WARMUP, BENCH_WARMUP_GPU);
}

/* --profile's names: the rows a call can be profiled in. */
static const char *const k_profile_rows[] = { "propose", "verify", "decode", "step" };

/* The index of the row named by p[0 .. n) in k_profile_rows, or -1. */
static int profile_row(const char *p, size_t n)
{
    for (size_t i = 0; i < sizeof k_profile_rows / sizeof k_profile_rows[0]; i++)
        if (n == strlen(k_profile_rows[i]) && !strncmp(p, k_profile_rows[i], n))
            return (int)i;
    return -1;
}

static int cmp_int(const void *a, const void *b) { return (*(const int *)a > *(const int *)b) - (*(const int *)a < *(const int *)b); }

static int parse_ctx(const char *opt, const char *v, bench_args *a)
{
    int32_t *ids;
    int n;
    if (!cli_parse_list(opt, v, 1, 1 << 20, "context lengths", &ids, &n))
        return 0;
    a->n_ctx = 0;
    for (int i = 0; i < n; i++) {
        if (a->n_ctx == BENCH_MAX_CTX) {
            fprintf(stderr, "dflash bench: %s takes at most %d context lengths, got '%s'\n", opt, BENCH_MAX_CTX, v);
            free(ids);
            return 0;
        }
        a->ctx[a->n_ctx++] = ids[i];
    }
    free(ids);
    /* Ascending: each model's context is then extended, never rebuilt. */
    qsort(a->ctx, (size_t)a->n_ctx, sizeof a->ctx[0], cmp_int);
    int k = 0;
    for (int i = 0; i < a->n_ctx; i++)
        if (k == 0 || a->ctx[i] != a->ctx[k - 1])
            a->ctx[k++] = a->ctx[i];
    a->n_ctx = k;
    return 1;
}

static int parse(int argc, char **argv, bench_args *a)
{
    memset(a, 0, sizeof *a);
    a->preset = &k_presets[0];
    a->device = "cpu";
    a->reps = 20;
    double pen_r = 1.0, pen_f = 0.0, pen_p = 0.0; /* --penalties, given before or after --sample */
    for (int i = 1; i < argc; i++) {
        const char *o = argv[i], *v;
        if (!strcmp(o, "-h") || !strcmp(o, "--help")) {
            usage(stdout);
            exit(cli_finish_stdout(0));
        } else if (!strcmp(o, "--preset")) {
            if (!(v = cli_value(argc, argv, &i)))
                return 0;
            if (!(a->preset = find_preset(v))) {
                fprintf(stderr, "dflash bench: unknown preset '%s' (seed-drafter, qwen3-8b-drafter, "
                                "qwen3-8b-target, llama31-8b-target, qwen3-30b-a3b-target, qwen36-35b-a3b-target, "
                                "seed-pair, pystd, tiny, tiny-llama, tiny-moe, tiny-q35)\n", v);
                return 0;
            }
        } else if (!strcmp(o, "--ctx")) {
            if (!(v = cli_value(argc, argv, &i)) || !parse_ctx(o, v, a))
                return 0;
        } else if (!strcmp(o, "--rows")) {
            int32_t *ids;
            int n;
            if (!(v = cli_value(argc, argv, &i)) || !cli_parse_list(o, v, 1, BENCH_MAX_ROWS, "row counts", &ids, &n))
                return 0;
            if (n > BENCH_MAX_WIDTHS) {
                fprintf(stderr, "dflash bench: %s takes at most %d widths, got %d\n", o, BENCH_MAX_WIDTHS, n);
                free(ids);
                return 0;
            }
            for (a->n_rows = 0; a->n_rows < n; a->n_rows++)
                a->rows[a->n_rows] = ids[a->n_rows];
            free(ids);
        } else if (!strcmp(o, "--sessions")) {
            int32_t *ids;
            int n;
            if (!(v = cli_value(argc, argv, &i)) ||
                !cli_parse_list(o, v, 2, BENCH_MAX_SESSIONS, "session counts", &ids, &n))
                return 0;
            if (n > BENCH_MAX_SESS) {
                fprintf(stderr, "dflash bench: %s takes at most %d counts, got %d\n", o, BENCH_MAX_SESS, n);
                free(ids);
                return 0;
            }
            for (a->n_sess = 0; a->n_sess < n; a->n_sess++)
                a->sess[a->n_sess] = ids[a->n_sess];
            free(ids);
        } else if (!strcmp(o, "--reps")) {
            if (!(v = cli_value(argc, argv, &i)) || !cli_parse_int(o, v, 1, BENCH_MAX_REPS, &a->reps))
                return 0;
        } else if (!strcmp(o, "--device")) {
            if (!(v = cli_value(argc, argv, &i)))
                return 0;
            if (strcmp(v, "cpu") && strcmp(v, "cuda") && strcmp(v, "auto")) {
                fprintf(stderr, "dflash bench: --device expects cpu, cuda or auto, got '%s'\n", v);
                return 0;
            }
            a->device = v;
        } else if (!strcmp(o, "--drafter-quant")) {
            if (!(v = cli_value(argc, argv, &i)))
                return 0;
            if (strcmp(v, "bf16") && strcmp(v, "fp8")) {
                fprintf(stderr, "dflash bench: --drafter-quant expects bf16 or fp8, got '%s'\n", v);
                return 0;
            }
            a->fp8 = !strcmp(v, "fp8");
        } else if (!strcmp(o, "--sample")) {
            if (!(v = cli_value(argc, argv, &i)))
                return 0;
            dflash_sampler_default_opts(&a->so);
            char tail[8];
            if (sscanf(v, "%lf,%d,%lf%7s", &a->so.temperature, &a->so.top_k, &a->so.top_p, tail) != 3 ||
                !(a->so.temperature > 0)) {
                fprintf(stderr, "dflash bench: --sample expects T,K,P with T > 0 (e.g. 0.6,20,0.95), got '%s'\n",
                        v);
                return 0;
            }
            if (dflash_sampler_check_opts(&a->so) != DFLASH_OK) {
                fprintf(stderr, "dflash bench: --sample %s: %s\n", v, dflash_last_error());
                return 0;
            }
            a->sample = 1;
        } else if (!strcmp(o, "--penalties")) {
            if (!(v = cli_value(argc, argv, &i)))
                return 0;
            char tail[8];
            double r, f, p;
            if (sscanf(v, "%lf,%lf,%lf%7s", &r, &f, &p, tail) != 3) {
                fprintf(stderr, "dflash bench: --penalties expects R,F,P (e.g. 1.1,0.5,0.3), got '%s'\n", v);
                return 0;
            }
            pen_r = r, pen_f = f, pen_p = p;
            a->penalties = 1;
        } else if (!strcmp(o, "--json")) {
            a->json = 1;
        } else if (!strcmp(o, "--profile")) {
            if (!(v = cli_value(argc, argv, &i)))
                return 0;
            a->profile_mask = 0;
            for (const char *p = v; *p;) {
                const size_t n = strcspn(p, ",");
                const int row = profile_row(p, n);
                if (row < 0) {
                    fprintf(stderr, "dflash bench: --profile expects propose, verify, decode or step (comma-separated), "
                                    "got '%s'\n", v);
                    return 0;
                }
                a->profile_mask |= 1u << row;
                p += n + (p[n] == ',');
            }
            a->profile = v;
        } else {
            fprintf(stderr, "dflash bench: unknown option '%s' (see --help)\n", o);
            return 0;
        }
    }
    if (a->penalties) {
        if (!a->sample) {
            fprintf(stderr, "dflash bench: --penalties needs --sample\n");
            return 0;
        }
        a->so.rep_penalty = pen_r;
        a->so.frequency_penalty = pen_f;
        a->so.presence_penalty = pen_p;
        if (dflash_sampler_check_opts(&a->so) != DFLASH_OK) {
            fprintf(stderr, "dflash bench: --penalties %g,%g,%g: %s\n", pen_r, pen_f, pen_p, dflash_last_error());
            return 0;
        }
    }
    return 1;
}


/* ---- the backend, its clock and its bandwidth --------------------------- */

/* Per call, from the backend's counters; counted 0 where it keeps none
 * (the CPU). */
typedef struct bench_counts {
    int counted;
    double launches, syncs, uploads, upload_bytes;
} bench_counts;

typedef struct bench_row {
    const char *op;
    int seqs, rows, ctx;
    double median_us, min_us, bytes;
    double host_us; /* median host time inside the call (GPU: enqueueing, plus any wait the call makes) */
    bench_counts counts;
} bench_row;

typedef struct bench_run {
    const bench_args *a;
    dflash_backend *be;
    int cuda, warmup;
    char device[160];
    double bw;        /* bytes per second, read + written: what floors divide by */
    double bw_bytes;  /* the copy's size */
    double bw_op;     /* the backend copy op's own bandwidth */
    double bw_driver; /* the driver's device copy (GPU), 0 on the CPU */
    /* per context: propose, verifies, decode, and those of every session count */
    bench_row rows[(BENCH_MAX_WIDTHS + 2) * BENCH_MAX_CTX * (1 + BENCH_MAX_SESS)];
    int n_rows;
} bench_run;

/* --device: cuda must work; auto falls back to the CPU and says why. */
static dflash_status open_backend(bench_run *r)
{
    if (strcmp(r->a->device, "cpu") != 0) {
        dflash_status s = dflash_backend_cuda_create(0, &r->be);
        if (s == DFLASH_OK) {
            r->cuda = 1;
            r->warmup = BENCH_WARMUP_GPU;
            snprintf(r->device, sizeof r->device, "cuda: %s", dflash_cuda_device_desc(r->be));
            return DFLASH_OK;
        }
        if (!strcmp(r->a->device, "cuda"))
            return dflash_fail_prefix(s, "--device cuda: ");
        fprintf(stderr, "dflash bench: device: cpu (no usable GPU: %s)\n", dflash_last_error());
    }
    snprintf(r->device, sizeof r->device, "cpu (%d threads)", omp_get_max_threads());
    r->warmup = BENCH_WARMUP;
    if (r->a->profile)
        fprintf(stderr, "dflash bench: --profile %s ignored: it marks CUDA calls for the CUDA profiler\n",
                r->a->profile);
    return dflash_backend_cpu_create(&r->be);
}

/* One timed region: device events on CUDA (they bracket exactly the work
 * queued in between); on the CPU the clock around the call and a sync. */
static dflash_status clock_start(bench_run *r, double *t0)
{
    if (r->cuda)
        return dflash_cuda_timer_start(r->be);
    DFLASH_TRY(r->be->ops->sync(r->be));
    *t0 = cli_now_s() * 1e6;
    return DFLASH_OK;
}

static dflash_status clock_stop(bench_run *r, double t0, double *us)
{
    if (r->cuda) {
        float ms;
        DFLASH_TRY(dflash_cuda_timer_stop(r->be, &ms));
        *us = ms * 1e3;
        return DFLASH_OK;
    }
    DFLASH_TRY(r->be->ops->sync(r->be));
    *us = cli_now_s() * 1e6 - t0;
    return DFLASH_OK;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The call to time, and what undoes its effect on the state (untimed). */
typedef struct bench_op {
    dflash_status (*run)(void *self);
    dflash_status (*after)(void *self); /* NULL: nothing to undo */
    void *self;
    const char *name; /* its row's name, for --profile (NULL: never profiled) */
} bench_op;

static double median_of(double *v, int n)
{
    qsort(v, (size_t)n, sizeof v[0], cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* host_us (may be NULL): the median host time spent inside the call; on
 * the GPU, near the device time means the host's launches are the limit. */
static dflash_status time_op(bench_run *r, const bench_op *op, int reps, double *median, double *min, double *host_us,
                             bench_counts *counts)
{
    double us[BENCH_MAX_REPS], hs[BENCH_MAX_REPS];
    dflash_backend_counters c0 = { 0 }, c1 = { 0 };
    const dflash_backend_ops *o = r->be->ops;
    for (int i = -r->warmup; i < reps; i++) {
        if (i == 0 && counts && o->counters)
            o->counters(r->be, &c0);
        const int row = op->name ? profile_row(op->name, strlen(op->name)) : -1;
        const int prof = i == 0 && r->cuda && row >= 0 && (r->a->profile_mask >> row & 1u);
        if (prof)
            DFLASH_TRY(dflash_cuda_profile(r->be, 1));
        double t0 = 0, t;
        DFLASH_TRY(clock_start(r, &t0));
        double h0 = cli_now_s() * 1e6;
        DFLASH_TRY(op->run(op->self));
        double h = cli_now_s() * 1e6 - h0;
        DFLASH_TRY(clock_stop(r, t0, &t));
        if (prof)
            DFLASH_TRY(dflash_cuda_profile(r->be, 0));
        if (op->after)
            DFLASH_TRY(op->after(op->self));
        if (i >= 0) {
            us[i] = t;
            hs[i] = h;
        }
    }
    if (counts) {
        memset(counts, 0, sizeof *counts);
        counts->counted = o->counters != NULL;
    }
    if (counts && counts->counted) {
        o->counters(r->be, &c1);
        counts->launches = (double)(c1.launches - c0.launches) / reps;
        counts->syncs = (double)(c1.syncs - c0.syncs) / reps;
        counts->uploads = (double)(c1.uploads - c0.uploads) / reps;
        counts->upload_bytes = (double)(c1.upload_bytes - c0.upload_bytes) / reps;
    }
    *median = median_of(us, reps);
    *min = us[0]; /* sorted by median_of */
    if (host_us)
        *host_us = median_of(hs, reps);
    return DFLASH_OK;
}

typedef struct copy_op {
    dflash_backend *be;
    float *dst, *src;
    int n;
    int64_t cols;
} copy_op;

static dflash_status copy_run(void *self)
{
    copy_op *c = self;
    return c->be->ops->copy_rows(c->be, c->dst, c->cols, c->src, c->cols, NULL, c->n, c->cols);
}

static dflash_status driver_copy_run(void *self)
{
    copy_op *c = self;
    return dflash_cuda_copy(c->be, c->dst, c->src, (size_t)c->n * (size_t)c->cols * sizeof(float));
}

/* A large copy through the backend's copy_rows op (on the CPU a memcpy per
 * row): the bandwidth the floors divide by, measured on this machine now. */
static dflash_status measure_bandwidth(bench_run *r)
{
    const int64_t cols = 1 << 20; /* 4 MiB rows */
    const int n = r->cuda ? 512 : 64; /* 2 GiB on a GPU, 256 MiB on the CPU: far past the caches */
    const size_t row_bytes = (size_t)cols * sizeof(float);
    copy_op c = { r->be, NULL, NULL, n, cols };
    float *host = malloc(row_bytes);
    dflash_status s = host ? DFLASH_OK : dflash_fail(DFLASH_ERR_OOM, "out of memory");
    if (s == DFLASH_OK)
        s = dflash_be_alloc_f32(r->be, (size_t)n * cols, &c.src);
    if (s == DFLASH_OK)
        s = dflash_be_alloc_f32(r->be, (size_t)n * cols, &c.dst);
    /* Random source rows: never time a copy of zeros or untouched pages. */
    for (int i = 0; s == DFLASH_OK && i < n; i++) {
        bench_fill_f32(host, (size_t)cols, 0xb0b0ull + (uint64_t)i, 1.0f);
        s = r->be->ops->upload(r->be, c.src + (size_t)i * cols, host, row_bytes);
    }
    double med = 0, min = 0, dmed = 0;
    if (s == DFLASH_OK) {
        bench_op op = { copy_run, NULL, &c, NULL };
        /* time_op's warm-up also faults the destination's pages in. */
        s = time_op(r, &op, BENCH_BW_REPS, &med, &min, NULL, NULL);
    }
    if (s == DFLASH_OK && r->cuda) {
        bench_op op = { driver_copy_run, NULL, &c, NULL };
        s = time_op(r, &op, BENCH_BW_REPS, &dmed, &min, NULL, NULL);
    }
    r->bw_bytes = (double)n * (double)row_bytes;
    r->bw_op = med > 0 ? 2 * r->bw_bytes / (med * 1e-6) : 0;
    r->bw_driver = dmed > 0 ? 2 * r->bw_bytes / (dmed * 1e-6) : 0;
    r->bw = r->bw_driver > r->bw_op ? r->bw_driver : r->bw_op;
    if (c.src)
        r->be->ops->free(r->be, c.src);
    if (c.dst)
        r->be->ops->free(r->be, c.dst);
    free(host);
    if (s == DFLASH_OK && r->bw <= 0)
        s = dflash_fail(DFLASH_ERR_BACKEND, "the bandwidth copy took no measurable time");
    return s;
}

static double weight_bytes(const dflash_weight *w)
{
    return (double)w->rows * (double)w->cols * (double)dflash_dtype_size(w->dtype) +
           (w->scales ? (double)w->rows * sizeof(float) : 0);
}

/* The weights a layer reads whatever its rows (a sparse layer's experts
 * are counted per call): norms, projections, a linear-attention mixer, a
 * MoE's router and shared expert. */
static double layer_bytes(const qwen3_layer *l, const dflash_weight *lin)
{
    double b = weight_bytes(&l->input_norm) + weight_bytes(&l->post_norm) + weight_bytes(&l->q_norm) +
               weight_bytes(&l->k_norm);
    for (int k = 0; k < QWEN3_LIN_COUNT; k++)
        b += weight_bytes(&lin[k]);
    const qwen3_gdn *g = &l->gdn;
    const dflash_weight *gw[] = { &g->in_qkv, &g->in_z, &g->in_b, &g->in_a, &g->conv, &g->dt_bias, &g->A_log,
                                  &g->norm, &g->out };
    for (size_t k = 0; k < sizeof gw / sizeof gw[0]; k++)
        b += weight_bytes(gw[k]);
    b += weight_bytes(&l->moe.router) + weight_bytes(&l->moe.shared_gate);
    for (int k = 0; k < QWEN3_MOE_PARTS; k++)
        b += weight_bytes(&l->moe.shared[k]);
    return b;
}

/* K and V of one position in every layer of a pool. */
static double kv_bytes_per_pos(const dflash_kv_layout *kv)
{
    return (double)kv->n_layers * 2 * kv->n_kv_heads * kv->head_dim * (double)dflash_dtype_size(kv->dtype);
}

static void add_row(bench_run *r, const char *op, int seqs, int rows, int ctx, double med, double min, double bytes,
                    double host_us, const bench_counts *counts)
{
    r->rows[r->n_rows++] = (bench_row){ op, seqs, rows, ctx, med, min, bytes, host_us, *counts };
}

static const int *ctx_list(const bench_run *r, int target, int *n)
{
    static const int k_drafter[] = { 1024, 4096 }, k_target[] = { 1, 1024, 4096 };
    if (r->a->n_ctx) {
        *n = r->a->n_ctx;
        return r->a->ctx;
    }
    *n = target ? 3 : 2;
    return target ? k_target : k_drafter;
}

/* ---- the drafter -------------------------------------------------------- */

typedef struct drafter_set {
    bench_image timg, dimg;
    dflash_qwen3 *target;
    dflash_head *head;
    void *states[BENCH_MAX_SESSIONS]; /* one per sequence (--sessions: the most asked) */
    int n_states;
    void *step_state;     /* with a target too: the state a whole step drafts from and appends to */
    int32_t step_len;     /* its context rows */
    float *taps;          /* backend [max_rows, K*H] */
    int32_t *tokens;      /* host [max_rows] */
} drafter_set;

/* One propose over n_seqs sequences, each at position pos. */
typedef struct propose_op {
    dflash_proposer *p;
    void **states;
    int n_seqs, n_drafts;
    int32_t last[BENCH_MAX_SESSIONS], pos[BENCH_MAX_SESSIONS];
    int32_t drafts[BENCH_MAX_SESSIONS * BENCH_MAX_BLOCK];
} propose_op;

static dflash_status propose_run(void *self)
{
    propose_op *o = self;
    return o->p->ops->propose(o->p, o->states, o->n_seqs, o->last, o->pos, o->n_drafts, o->drafts);
}

static dflash_status drafter_open(bench_run *r, drafter_set *d, int max_ctx)
{
    const bench_preset *p = r->a->preset;
    char json[2048], label[96];
    dflash_model_config cfg;
    dflash_st *st;
    /* The drafter uses only its target's embedding, LM head, hidden size,
     * vocabulary and layer count; it never runs the target's layers (the
     * verify rows bench the real target). So its target here has the real
     * layer count but 1 head of head_dim 2 and intermediate_size 1: ~13 H
     * values per layer instead of ~100 MB (40 real layers at H 2048 would be
     * ~4 GB nobody reads). Its LM head is tied: the same V x H bytes. */
    const bench_geom mini = { p->target_layers, p->d.hidden, 1, 1, 2, 1 };
    snprintf(label, sizeof label, "%s target (embedding and LM head only)", p->name);
    DFLASH_TRY(bench_target_image(&d->timg, &mini, p->vocab, 1, 0, NULL, label, 1));
    bench_config_json(json, sizeof json, &mini, p->vocab, 1, 0, NULL, NULL);
    DFLASH_TRY(bench_img_open(&d->timg, json, label, &cfg, &st));
    dflash_qwen3_opts to;
    dflash_qwen3_default_opts(&to);
    to.max_ctx = DFLASH_KV_PAGE; /* never runs: the smallest pool */
    if (r->cuda && d->timg.len > BENCH_PROGRESS_BYTES)
        fprintf(stderr, "dflash bench: %s: copying to the GPU\n", label);
    DFLASH_TRY(dflash_qwen3_load_st(&cfg, st, r->be, &to, &d->target));

    const int64_t H = p->d.hidden;
    snprintf(label, sizeof label, "%s drafter", p->name);
    DFLASH_TRY(bench_img_add(&d->dimg, "", "fc.weight", H, p->n_taps * H, 0, W_AMP));
    DFLASH_TRY(bench_img_add(&d->dimg, "", "hidden_norm.weight", 0, H, 1, NORM_AMP));
    DFLASH_TRY(bench_img_add(&d->dimg, "", "norm.weight", 0, H, 1, NORM_AMP));
    char prefix[64];
    for (int l = 0; l < p->d.layers; l++) {
        snprintf(prefix, sizeof prefix, "layers.%d.", l);
        DFLASH_TRY(bench_img_add_layer(&d->dimg, prefix, &p->d, 0, NULL));
    }
    DFLASH_TRY(bench_img_build(&d->dimg, label, 2));
    bench_config_json(json, sizeof json, &p->d, p->vocab, 1, 0, NULL, p);
    DFLASH_TRY(bench_img_open(&d->dimg, json, label, &cfg, &st));
    d->n_states = 1;
    for (int i = 0; i < r->a->n_sess; i++)
        d->n_states = r->a->sess[i] > d->n_states ? r->a->sess[i] : d->n_states;
    dflash_head_opts ho;
    dflash_head_default_opts(&ho);
    /* a step appends its block on every call (no rollback): room for them */
    ho.max_ctx = max_ctx + p->block * (p->target ? r->warmup + r->a->reps + 2 : 1);
    ho.max_seqs = d->n_states + (p->target ? 1 : 0); /* the step's state too */
    ho.ctx_cap = 0;                /* --ctx says how much context is visible */
    ho.quant = r->a->fp8 ? DFLASH_QUANT_FP8_WEIGHTS : DFLASH_QUANT_BF16; /* only --drafter-quant says */
    if (r->cuda && d->dimg.len > BENCH_PROGRESS_BYTES)
        fprintf(stderr, "dflash bench: %s: copying to the GPU\n", label);
    DFLASH_TRY(dflash_head_load_st(&cfg, st, label, d->target, &ho, &d->head));
    if (d->head->block_size - 1 > BENCH_MAX_BLOCK)
        return dflash_fail(DFLASH_ERR_UNSUPPORTED, "block size %d is over %d", d->head->block_size,
                           BENCH_MAX_BLOCK + 1);
    dflash_proposer *pr = &d->head->proposer;
    for (int i = 0; i < d->n_states; i++)
        DFLASH_TRY(pr->ops->alloc_state(pr, ho.max_ctx, &d->states[i]));
    if (p->target)
        DFLASH_TRY(pr->ops->alloc_state(pr, ho.max_ctx, &d->step_state));

    /* Random tap rows (hidden states of scale ~1), uploaded once and reused
     * for every chunk: the context's values do not change its cost. */
    const size_t R = (size_t)d->head->max_rows, cols = (size_t)d->head->fc.cols;
    float *host = malloc(R * cols * sizeof(float));
    d->tokens = malloc(R * sizeof(int32_t));
    if (!host || !d->tokens) {
        free(host);
        return dflash_fail(DFLASH_ERR_OOM, "out of memory");
    }
    bench_fill_f32(host, R * cols, 3, 1.0f);
    for (size_t i = 0; i < R; i++)
        d->tokens[i] = (int32_t)(bench_splitmix64(i) % (uint64_t)p->vocab);
    dflash_status s = dflash_be_alloc_f32(r->be, R * cols, &d->taps);
    if (s == DFLASH_OK)
        s = r->be->ops->upload(r->be, d->taps, host, R * cols * sizeof(float));
    free(host);
    return s;
}

/* What capturing the shapes' graphs cost (stderr: not part of the table). */
static void report_graphs(const char *who, const dflash_graph_cache *g)
{
    if (g->captures)
        fprintf(stderr, "dflash bench: %s: %d CUDA graph%s captured, %.2f ms of host time each\n", who, g->captures,
                g->captures > 1 ? "s" : "", 1e3 * g->capture_s / g->captures);
}

static void drafter_close(bench_run *r, drafter_set *d)
{
    if (d->head)
        report_graphs("drafter", &d->head->s.graphs);
    for (int i = 0; i < d->n_states; i++)
        if (d->states[i])
            d->head->proposer.ops->free_state(&d->head->proposer, d->states[i]);
    if (d->step_state)
        d->head->proposer.ops->free_state(&d->head->proposer, d->step_state);
    dflash_head_free(d->head);
    dflash_qwen3_free(d->target);
    if (d->taps)
        r->be->ops->free(r->be, d->taps);
    free(d->tokens);
    /* Last: on the CPU the models' weights point into the images. */
    bench_img_free(&d->timg);
    bench_img_free(&d->dimg);
}

/* Context rows appended to `state` (random taps) from *len up to `to`. */
static dflash_status drafter_fill(drafter_set *d, void *state, int32_t *len, int32_t to)
{
    dflash_head *h = d->head;
    while (*len < to) {
        const int n = to - *len < h->max_rows ? to - *len : h->max_rows;
        dflash_ctx_rows rows = { d->tokens, n, *len, d->taps, h->fc.cols };
        DFLASH_TRY(h->proposer.ops->begin(&h->proposer, state, &rows));
        *len += n;
    }
    return DFLASH_OK;
}

/* The drafter's weights a propose reads (not fc: the context is built). */
static double drafter_weights(const dflash_head *h)
{
    double weights = weight_bytes(&h->norm) + weight_bytes(&h->lm_head);
    for (int l = 0; l < h->cfg.num_hidden_layers; l++)
        weights += layer_bytes(&h->layers[l].w, h->quant == DFLASH_QUANT_FP8_WEIGHTS ? h->layers[l].lin_fp8
                                                                                      : h->layers[l].w.lin);
    return weights;
}

/* Bytes a propose over ns sequences at `ctx` moves: weights once, each
 * sequence's B embedding rows and every visible context position's K/V. */
static double propose_bytes(const dflash_head *h, double weights, int ns, int ctx)
{
    return weights + ns * ((double)h->block_size * weight_bytes(&h->embed) / (double)h->embed.rows +
                           (double)ctx * kv_bytes_per_pos(&h->kv.layout));
}

static dflash_status drafter_time(bench_run *r, drafter_set *d, const int *ctx, int n_ctx)
{
    dflash_head *h = d->head;
    dflash_proposer *pr = &h->proposer;
    const double weights = drafter_weights(h);
    int filled = 0;
    const int verbose = d->dimg.len > BENCH_PROGRESS_BYTES;
    propose_op *o = calloc(1, sizeof *o); /* too big for the stack */
    if (!o)
        return dflash_fail(DFLASH_ERR_OOM, "bench: out of memory");
    dflash_status s = DFLASH_OK;
    for (int c = 0; c < n_ctx && s == DFLASH_OK; c++) {
        if (verbose)
            fprintf(stderr, "dflash bench: drafter: building %d context rows%s\n", ctx[c],
                    d->n_states > 1 ? " for each sequence" : "");
        for (int i = 0; i < d->n_states && s == DFLASH_OK; i++) {
            int32_t len = filled;
            s = drafter_fill(d, d->states[i], &len, ctx[c]);
        }
        filled = ctx[c];
        /* one sequence, then each --sessions count in one propose */
        for (int q = 0; q <= r->a->n_sess && s == DFLASH_OK; q++) {
            const int ns = q == 0 ? 1 : r->a->sess[q - 1];
            o->p = pr, o->states = d->states, o->n_seqs = ns, o->n_drafts = h->block_size - 1;
            for (int i = 0; i < ns; i++)
                o->last[i] = d->tokens[i], o->pos[i] = filled;
            bench_op op = { propose_run, NULL, o, "propose" };
            double med, min, host;
            bench_counts counts;
            s = time_op(r, &op, r->a->reps, &med, &min, &host, &counts);
            if (s == DFLASH_OK)
                add_row(r, "propose", ns, ns * h->block_size, filled, med, min, propose_bytes(h, weights, ns, filled),
                        host, &counts);
        }
    }
    free(o);
    return s;
}

/* Open and time the drafter into *d (closed by the caller). */
static dflash_status bench_drafter(bench_run *r, drafter_set *d)
{
    int n_ctx, n_tctx;
    const int *ctx = ctx_list(r, 0, &n_ctx), *tctx = ctx_list(r, 1, &n_tctx);
    const int most = r->a->preset->target && tctx[n_tctx - 1] > ctx[n_ctx - 1] ? tctx[n_tctx - 1] : ctx[n_ctx - 1];
    DFLASH_TRY(drafter_open(r, d, most));
    return drafter_time(r, d, ctx, n_ctx);
}

/* ---- the target --------------------------------------------------------- */

static int32_t random_token(uint64_t i, int vocab) { return (int32_t)(bench_splitmix64(i) % (uint64_t)vocab); }

/* One target forward of `width` rows for each of n_seqs sequences at
 * length ctx (rows sequence-major). */
typedef struct forward_op {
    dflash_qwen3 *m;
    dflash_kv_seq **seqs;
    int n_seqs, width, n;
    int32_t ctx;
    int32_t *tokens, *pos, *row_seq, *logit_rows; /* [n] */
    /* --sample: each row's draw, and for a host draw the sampler, the
     * logits [n, V] and the ids */
    dflash_sample_row *draw;
    int host;
    dflash_sampler smp;
    float *host_logits;
    int32_t *ids;
    /* --penalties: the token counts (backend [V]; a host copy for a host draw) */
    int32_t *counts, *host_counts;
} forward_op;

static void forward_free(forward_op *o)
{
    if (o->counts)
        o->m->be->ops->free(o->m->be, o->counts);
    free(o->host_counts);
    free(o->tokens);
    free(o->draw);
    free(o->host_logits);
    free(o->ids);
    if (o->smp.vocab)
        dflash_sampler_free(&o->smp);
}

/* --penalties: one set of counts for every sequence (their contexts hold
 * the same random tokens, prefill's): the context as the prompt, 64
 * generated tokens; row i of a block counts the block's rows 1..i as
 * generated (drafts before it). */
static dflash_status forward_counts(forward_op *o, const bench_args *a)
{
    const int width = o->width;
    dflash_backend *be = o->m->be;
    const int V = o->m->cfg.vocab_size;
    DFLASH_TRY(dflash_be_alloc_i32(be, (size_t)V, &o->counts));
    DFLASH_TRY(be->ops->count_tokens(be, o->counts, V, NULL, V, 0));
    int32_t ids[256];
    for (int32_t p0 = 0; p0 < o->ctx; p0 += 256) {
        const int n = o->ctx - p0 < 256 ? o->ctx - p0 : 256;
        for (int i = 0; i < n; i++)
            ids[i] = random_token((uint64_t)(p0 + i), V);
        DFLASH_TRY(be->ops->count_tokens(be, o->counts, V, ids, n, 0));
    }
    for (int i = 0; i < 64; i++)
        ids[i] = random_token(7000000u + (uint64_t)i, V);
    DFLASH_TRY(be->ops->count_tokens(be, o->counts, V, ids, 64, 1));
    for (int i = 0; i < o->n; i++) {
        dflash_sample_row *r = &o->draw[i];
        r->rep_penalty = a->so.rep_penalty;
        r->frequency_penalty = a->so.frequency_penalty;
        r->presence_penalty = a->so.presence_penalty;
        r->counts = o->counts;
        r->n_gen = i % width < DFLASH_SAMPLE_GEN_MAX ? i % width : DFLASH_SAMPLE_GEN_MAX;
        r->gen = o->m->s.in.ids + (i - i % width) + 1; /* where each forward holds o->tokens */
    }
    if (!o->host)
        return DFLASH_OK;
    o->host_counts = malloc((size_t)V * sizeof *o->host_counts);
    if (!o->host_counts)
        return dflash_fail(DFLASH_ERR_OOM, "bench: out of memory for %d counts", V);
    return be->ops->download(be, o->host_counts, o->counts, (size_t)V * sizeof *o->host_counts);
}

static dflash_status forward_init(forward_op *o, dflash_qwen3 *m, dflash_kv_seq **seqs, int n_seqs, int width,
                                  int32_t ctx, const bench_args *a)
{
    *o = (forward_op){ .m = m, .seqs = seqs, .n_seqs = n_seqs, .width = width, .n = n_seqs * width, .ctx = ctx };
    const size_t V = (size_t)m->cfg.vocab_size;
    int32_t *buf = malloc((size_t)o->n * 4 * sizeof(int32_t));
    o->tokens = buf;
    if (a->sample) {
        o->host = !m->be->ops->sample_rows || dflash_levers_get()->host_sampling;
        o->draw = malloc((size_t)o->n * sizeof *o->draw);
        o->ids = malloc((size_t)o->n * sizeof *o->ids);
        o->host_logits = malloc((size_t)(o->host ? o->n : 1) * V * sizeof(float));
    }
    if (!buf || (a->sample && (!o->draw || !o->ids || !o->host_logits))) {
        forward_free(o);
        return dflash_fail(DFLASH_ERR_OOM, "bench: out of memory for %d rows", o->n);
    }
    if (a->sample) {
        const dflash_status s = dflash_sampler_init(&o->smp, (int)V, &a->so);
        if (s != DFLASH_OK) {
            forward_free(o);
            return s;
        }
    }
    o->pos = buf + o->n, o->row_seq = buf + 2 * o->n, o->logit_rows = buf + 3 * o->n;
    for (int i = 0; i < o->n; i++) {
        o->pos[i] = ctx + i % width;
        o->tokens[i] = random_token(1000003u + (uint64_t)i, m->cfg.vocab_size);
        o->row_seq[i] = i / width;
        o->logit_rows[i] = i;
        if (o->draw)
            o->draw[i] = dflash_spec_sample_row_opts(&a->so, o->pos[i] + 1);
    }
    if (a->penalties) {
        const dflash_status s = forward_counts(o, a);
        if (s != DFLASH_OK) {
            forward_free(o);
            return s;
        }
    }
    return DFLASH_OK;
}

static dflash_status forward_run(void *self)
{
    forward_op *o = self;
    /* greedy: each row's argmax, no logits (what the decode loop asks);
     * --sample: the logits, then each row's drawn token to the host */
    dflash_qwen3_batch b = { .n_rows = o->n, .tokens = o->tokens, .positions = o->pos, .row_seq = o->row_seq,
                             .n_seqs = o->n_seqs, .seqs = o->seqs, .n_logit_rows = o->n, .logit_rows = o->logit_rows,
                             .argmax_only = !o->draw };
    float *logits;
    DFLASH_TRY(dflash_qwen3_forward(o->m, &b, &logits, NULL));
    if (!o->draw)
        return DFLASH_OK;
    dflash_backend *be = o->m->be;
    const int V = o->m->cfg.vocab_size;
    if (o->host) {
        DFLASH_TRY(be->ops->download(be, o->host_logits, logits, (size_t)o->n * (size_t)V * sizeof(float)));
        for (int i = 0; i < o->n; i++) {
            float *row = o->host_logits + (size_t)i * V;
            if (o->draw[i].counts)
                dflash_spec_penalize_row(row, V, o->host_counts, &o->draw[i], o->tokens + (i - i % o->width) + 1);
            o->ids[i] = dflash_spec_draw_row(&o->smp, row, &o->draw[i]);
        }
        return DFLASH_OK;
    }
    DFLASH_TRY(dflash_spec_sample_rows(be, logits, o->n, V, o->draw, o->m->s.best, &o->smp, o->host_logits,
                                       o->host_counts));
    return be->ops->download(be, o->ids, o->m->s.best, (size_t)o->n * sizeof(int32_t));
}

/* Rollback by moving the length, as the speculative loop does. */
static dflash_status forward_after(void *self)
{
    forward_op *o = self;
    for (int i = 0; i < o->n_seqs; i++)
        dflash_kv_seq_truncate(o->seqs[i], o->ctx);
    return DFLASH_OK;
}

/* Prefill random tokens from seq->len up to `to` (no logits, no taps). */
static dflash_status prefill(dflash_qwen3 *m, dflash_kv_seq *seq, int32_t to)
{
    const int R = m->opts.max_rows;
    int32_t tokens[R], pos[R], row_seq[R];
    while (seq->len < to) {
        int n = to - seq->len < R ? to - seq->len : R;
        for (int i = 0; i < n; i++) {
            pos[i] = seq->len + i;
            tokens[i] = random_token((uint64_t)pos[i], m->cfg.vocab_size);
            row_seq[i] = 0;
        }
        dflash_qwen3_batch b = { .n_rows = n, .tokens = tokens, .positions = pos, .row_seq = row_seq, .n_seqs = 1,
                                 .seqs = &seq };
        float *logits;
        DFLASH_TRY(dflash_qwen3_forward(m, &b, &logits, NULL));
    }
    return DFLASH_OK;
}

/* One expert's three projections (0 without experts); every expert of a
 * bench target has the same size. */
static double expert_bytes(const dflash_qwen3 *m)
{
    for (int l = 0; l < m->cfg.num_hidden_layers; l++)
        if (m->layers[l].moe.experts)
            return weight_bytes(&m->layers[l].moe.experts[0]) + weight_bytes(&m->layers[l].moe.experts[1]) +
                   weight_bytes(&m->layers[l].moe.experts[2]);
    return 0;
}

/* Bytes a forward of `width` rows for each of n_seqs sequences at ctx
 * moves: weights once (of a MoE: the `experts` its rows were routed to),
 * the rows' embeddings, the K/V of every position each sequence's last
 * row sees (its context and rows), a hybrid's delta-rule state read once
 * and each row's record written once. */
static double forward_bytes(const dflash_qwen3 *m, double weights, double experts, int n_seqs, int width, int ctx)
{
    const double embed_row = weight_bytes(&m->embed) / (double)m->embed.rows;
    double bytes = weights + experts * expert_bytes(m) + (double)n_seqs * width * embed_row +
                   (double)n_seqs * (ctx + width) * kv_bytes_per_pos(&m->kv.layout);
    if (m->rec)
        bytes += (double)n_seqs * m->rec->n_lin * (double)(m->rec->state_floats + width * m->rec->row_floats) *
                 sizeof(float);
    return bytes;
}

/* Time one forward of `width` rows per sequence for the first n_seqs of
 * seqs (each at ctx) and add its row. */
/* time_op, then for a MoE the experts its rows were routed to: one more
 * call of op (the same inputs on the same state, so the same routing)
 * counts them, summed over its sparse layers, into *experts (0 for a
 * dense target). */
static dflash_status time_op_experts(bench_run *r, dflash_qwen3 *m, const bench_op *op, double *med, double *min,
                                     double *host, bench_counts *counts, double *experts)
{
    *experts = 0;
    DFLASH_TRY(time_op(r, op, r->a->reps, med, min, host, counts));
    if (!m->cfg.num_experts)
        return DFLASH_OK;
    m->s.b.moe.tally->on = 1;
    m->s.b.moe.tally->experts = 0;
    dflash_status s = op->run(op->self);
    if (s == DFLASH_OK && op->after)
        s = op->after(op->self);
    m->s.b.moe.tally->on = 0;
    *experts = (double)m->s.b.moe.tally->experts;
    return s;
}

static dflash_status time_forward(bench_run *r, dflash_qwen3 *m, dflash_kv_seq **seqs, int n_seqs, int width,
                                  int32_t ctx, double weights, const char *name)
{
    forward_op o;
    DFLASH_TRY(forward_init(&o, m, seqs, n_seqs, width, ctx, r->a));
    bench_op op = { forward_run, forward_after, &o, name };
    double med, min, host;
    bench_counts counts;
    double experts;
    dflash_status s = time_op_experts(r, m, &op, &med, &min, &host, &counts, &experts);
    if (s == DFLASH_OK)
        add_row(r, name, n_seqs, o.n, ctx, med, min, forward_bytes(m, weights, experts, n_seqs, width, ctx), host,
                &counts);
    forward_free(&o);
    return s;
}

/* ---- a whole step: the drafter and the target --------------------------- */

/* One speculative step of one sequence at `ctx`: the drafter proposes B - 1
 * drafts from its context, the target verifies the block (B rows, their
 * greedy tokens to the host with the drafts, the drafter's taps), and the
 * drafter takes all B rows
 * into its context (every draft accepted: the most a step does). The
 * target goes back to ctx after each call; the drafter's context keeps
 * the rows (B more a call, against thousands: its cost barely moves). */
typedef struct step_op {
    drafter_set *d;
    dflash_qwen3 *m;
    dflash_kv_seq *seq;
    int32_t ctx;
    int B, n_taps;
    const int *taps;
    int32_t tokens[BENCH_MAX_BLOCK + 1], pos[BENCH_MAX_BLOCK + 1], row_seq[BENCH_MAX_BLOCK + 1],
        sel[BENCH_MAX_BLOCK + 1];
} step_op;

static dflash_status step_run(void *self)
{
    step_op *o = self;
    dflash_proposer *p = &o->d->head->proposer;
    const int32_t last = o->tokens[0], at = o->d->step_len;
    const int k = o->B - 1;
    /* as in the loops: the drafts stay on the device, the verify reads
     * them there and one download brings them with its tokens */
    const int32_t *dev;
    DFLASH_TRY(dflash_spec_propose(p, &o->d->step_state, 1, &last, &at, k, dflash_spec_dev_drafts(p, NULL),
                                   o->tokens + 1, &dev));
    dflash_kv_seq *sp = o->seq;
    dflash_qwen3_batch b = { .n_rows = o->B, .tokens = o->tokens, .positions = o->pos, .row_seq = o->row_seq,
                             .n_seqs = 1, .seqs = &sp, .n_logit_rows = o->B, .logit_rows = o->sel,
                             .n_taps = o->n_taps, .tap_layers = o->taps, .argmax_only = 1, .dev_tokens = dev,
                             .dev_n = 1, .dev_cols = k, .dev_row0 = 1, .dev_row_stride = k };
    float *logits, *taps;
    DFLASH_TRY(dflash_qwen3_forward(o->m, &b, &logits, &taps));
    int32_t ids[BENCH_MAX_BLOCK + 1];
    dflash_status fs = dflash_spec_fetch(o->m, o->B, dev, k, ids, o->tokens + 1);
    DFLASH_TRY(dev ? dflash_spec_dev_status(o->m->be, p, fs, dev, o->tokens + 1, 1, &at, k) : fs);
    dflash_ctx_rows rows = { o->tokens, o->B, at, taps, (int64_t)o->n_taps * o->m->cfg.hidden_size };
    DFLASH_TRY(p->ops->after_verify(p, &o->d->step_state, 1, &rows));
    o->d->step_len += o->B;
    return DFLASH_OK;
}

static dflash_status step_after(void *self)
{
    step_op *o = self;
    dflash_kv_seq_truncate(o->seq, o->ctx);
    return DFLASH_OK;
}

/* Time a step at ctx (the target's sequence is there) and add its row. */
static dflash_status time_step(bench_run *r, drafter_set *d, dflash_qwen3 *m, dflash_kv_seq *seq, int32_t ctx,
                               double weights)
{
    dflash_head *h = d->head;
    dflash_proposer *p = &h->proposer;
    if (d->step_len > ctx) { /* the last context's steps went past this one: start again */
        DFLASH_TRY(p->ops->reset(p, d->step_state));
        d->step_len = 0;
    }
    DFLASH_TRY(drafter_fill(d, d->step_state, &d->step_len, ctx));
    step_op *o = calloc(1, sizeof *o);
    if (!o)
        return dflash_fail(DFLASH_ERR_OOM, "bench: out of memory");
    *o = (step_op){ .d = d, .m = m, .seq = seq, .ctx = ctx, .B = h->block_size };
    o->n_taps = p->ops->tap_layers(p, &o->taps);
    for (int i = 0; i < o->B; i++) {
        o->pos[i] = ctx + i;
        o->row_seq[i] = 0;
        o->sel[i] = i;
    }
    o->tokens[0] = random_token(7u, m->cfg.vocab_size);
    bench_op op = { step_run, step_after, o, "step" };
    double med, min, host;
    bench_counts counts;
    double experts;
    dflash_status s = time_op_experts(r, m, &op, &med, &min, &host, &counts, &experts);
    /* the propose's bytes, the verify's, and the context update's fc */
    const double bytes = propose_bytes(h, drafter_weights(h), 1, ctx) + weight_bytes(&h->fc) +
                         forward_bytes(m, weights, experts, 1, o->B, ctx);
    if (s == DFLASH_OK)
        add_row(r, "step", 1, o->B, ctx, med, min, bytes, host, &counts);
    free(o);
    return s;
}

/* d: the drafter beside the target (a whole step is timed too), or NULL. */
static dflash_status target_time(bench_run *r, dflash_qwen3 *m, dflash_kv_seq **seqs, int n_seqs, const int *ctx,
                                 int n_ctx, int verbose, drafter_set *d)
{
    double weights = weight_bytes(&m->final_norm) + weight_bytes(&m->lm_head);
    for (int l = 0; l < m->cfg.num_hidden_layers; l++) /* a sparse layer: the router here, experts per call */
        weights += layer_bytes(&m->layers[l], m->layers[l].lin);
    const int n_w = r->a->n_rows ? r->a->n_rows : 1;
    for (int c = 0; c < n_ctx; c++) {
        if (verbose)
            fprintf(stderr, "dflash bench: target: prefilling %d sequence%s to %d tokens\n", n_seqs,
                    n_seqs > 1 ? "s" : "", ctx[c]);
        for (int i = 0; i < n_seqs; i++)
            DFLASH_TRY(prefill(m, seqs[i], ctx[c]));
        /* one sequence, then each --sessions count: verify at each width, then decode */
        for (int q = 0; q <= r->a->n_sess; q++) {
            const int ns = q == 0 ? 1 : r->a->sess[q - 1];
            for (int k = 0; k <= n_w; k++) {
                const int width = k == n_w ? 1 : r->a->n_rows ? r->a->rows[k] : BENCH_VERIFY_ROWS;
                DFLASH_TRY(time_forward(r, m, seqs, ns, width, ctx[c], weights, k == n_w ? "decode" : "verify"));
            }
        }
        if (d)
            DFLASH_TRY(time_step(r, d, m, seqs[0], ctx[c], weights));
    }
    return DFLASH_OK;
}

static dflash_status bench_target(bench_run *r, drafter_set *d)
{
    const bench_preset *p = r->a->preset;
    int n_ctx;
    const int *ctx = ctx_list(r, 1, &n_ctx);
    char json[2048], label[96];
    snprintf(label, sizeof label, "%s target", p->name);
    bench_image im = { 0 };
    dflash_qwen3 *m = NULL;
    /* one sequence, or as many as the largest --sessions count */
    int n_seqs = 1, width = BENCH_VERIFY_ROWS;
    for (int i = 0; i < r->a->n_sess; i++)
        n_seqs = r->a->sess[i] > n_seqs ? r->a->sess[i] : n_seqs;
    for (int i = 0; i < r->a->n_rows; i++)
        width = r->a->rows[i] > width ? r->a->rows[i] : width;
    dflash_kv_seq seq_store[BENCH_MAX_SESSIONS] = { 0 }, *seqs[BENCH_MAX_SESSIONS];
    for (int i = 0; i < n_seqs; i++)
        seqs[i] = &seq_store[i];
    dflash_model_config cfg;
    dflash_st *st;
    const bench_preset *moe = p->experts ? p : NULL;
    bench_config_json(json, sizeof json, &p->t, p->vocab, p->tied, p->llama, moe, NULL);
    dflash_status s = bench_target_image(&im, &p->t, p->vocab, p->tied, p->llama, moe, label, 4);
    if (s == DFLASH_OK)
        s = bench_img_open(&im, json, label, &cfg, &st);
    if (s == DFLASH_OK) {
        dflash_qwen3_opts to;
        dflash_qwen3_default_opts(&to);
        to.max_ctx = ctx[n_ctx - 1] + BENCH_MAX_ROWS;
        to.max_seqs = n_seqs;
        to.max_rows = n_seqs * width > to.max_rows ? n_seqs * width : to.max_rows;
        if (r->cuda && im.len > BENCH_PROGRESS_BYTES)
            fprintf(stderr, "dflash bench: %s: copying to the GPU\n", label);
        s = dflash_qwen3_load_st(&cfg, st, r->be, &to, &m);
    }
    for (int i = 0; i < n_seqs && s == DFLASH_OK; i++)
        s = dflash_qwen3_seq_init(m, seqs[i]);
    if (s == DFLASH_OK)
        s = target_time(r, m, seqs, n_seqs, ctx, n_ctx, im.len > BENCH_PROGRESS_BYTES, d);
    for (int i = 0; i < n_seqs; i++)
        if (m && seqs[i]->table)
            dflash_qwen3_seq_free(m, seqs[i]);
    if (m)
        report_graphs("target", &m->s.graphs);
    dflash_qwen3_free(m);
    bench_img_free(&im); /* last: on the CPU the weights point into it */
    return s;
}

/* ---- the report --------------------------------------------------------- */

static double floor_us(const bench_run *r, const bench_row *w) { return w->bytes / r->bw * 1e6; }

static void describe_preset(FILE *f, const bench_preset *p)
{
    if (p->drafter) {
        fprintf(f, "drafter %d layers, H %d, I %d, %d:%d x %d, block %d, taps [", p->d.layers, p->d.hidden,
                p->d.inter, p->d.heads, p->d.kv_heads, p->d.head_dim, p->block);
        for (int i = 0; i < p->n_taps; i++)
            fprintf(f, "%s%d", i ? "," : "", p->taps[i]);
        fprintf(f, "] of %d; ", p->target_layers);
    }
    if (p->target && p->hy.v_heads)
        fprintf(f, "Qwen3.5-MoE hybrid target %d layers (3 of 4 Gated DeltaNet: %d key heads x %d, %d value heads "
                "x %d, conv %d; every 4th gated attention %d:%d x %d), H %d, %d experts of I %d, %d per token, a "
                "shared expert of I %d, %s LM head; ", p->t.layers, p->hy.k_heads, p->hy.k_dim, p->hy.v_heads,
                p->hy.v_dim, p->hy.conv, p->t.heads, p->t.kv_heads, p->t.head_dim, p->t.hidden, p->experts,
                p->moe_inter, p->topk, p->hy.shared_inter, p->tied ? "tied" : "untied");
    else if (p->target && p->experts)
        fprintf(f, "Qwen3-MoE target %d layers, H %d, %d experts of I %d, %d per token, %d:%d x %d, %s LM head; ",
                p->t.layers, p->t.hidden, p->experts, p->moe_inter, p->topk, p->t.heads, p->t.kv_heads,
                p->t.head_dim, p->tied ? "tied" : "untied");
    else if (p->target)
        fprintf(f, "%s target %d layers, H %d, I %d, %d:%d x %d, %s LM head; ", p->llama ? "Llama" : "Qwen3",
                p->t.layers, p->t.hidden, p->t.inter, p->t.heads, p->t.kv_heads, p->t.head_dim,
                p->tied ? "tied" : "untied");
    fprintf(f, "vocab %d; random bf16 weights", p->vocab);
}

static void print_table(const bench_run *r)
{
    printf("dflash bench: preset %s: ", r->a->preset->name);
    describe_preset(stdout, r->a->preset);
    printf("\ndevice: %s\n", r->device);
    printf("bandwidth: %.1f GB/s (copy of %.0f MiB, bytes read + written, median of %d: backend copy_rows %.1f GB/s",
           r->bw / 1e9, r->bw_bytes / (1 << 20), BENCH_BW_REPS, r->bw_op / 1e9);
    if (r->bw_driver > 0)
        printf(", driver device copy %.1f GB/s", r->bw_driver / 1e9);
    printf(")\n");
    printf("timing: median and min of %d calls after %d warm-up; floor = bytes moved / bandwidth\n"
           "        (weights once, of a MoE only the experts the rows were routed to, + context K/V in the\n"
           "        pool's dtype, + a hybrid's recurrent state read and rows' records written; propose\n"
           "        excludes fc: the context is built);\n"
           "        host_us: host time inside the call (launching; propose also waits for its drafts)\n",
           r->a->reps, r->warmup);
    if (r->a->preset->drafter)
        printf("drafter weights: %s\n", r->a->fp8 ? "fp8 e4m3 + per-row scales (LM head bf16)" : "bf16");
    if (r->a->penalties)
        printf("penalties: repetition %g, frequency %g, presence %g (counts of the context, 64 generated tokens "
               "and the drafts before each row)\n",
               r->a->so.rep_penalty, r->a->so.frequency_penalty, r->a->so.presence_penalty);
    if (r->a->sample)
        printf("verify and decode: each row's token drawn (T %g, top-k %d, top-p %g) %s\n", r->a->so.temperature,
               r->a->so.top_k, r->a->so.top_p,
               r->be->ops->sample_rows && !dflash_levers_get()->host_sampling
                   ? "on the device"
                   : "on the host from downloaded logits, one row after another");
    printf("\n");
    const int counted = r->n_rows && r->rows[0].counts.counted;
    if (counted)
        printf("launches, syncs (host waits), uploads: per call, from the backend's counters\n");
    printf("%-8s %5s %5s %7s %12s %12s %10s %12s %8s %10s", "op", "seqs", "rows", "ctx", "median_us", "min_us", "MB",
           "floor_us", "%floor", "host_us");
    printf(counted ? " %9s %6s %8s\n" : "\n", "launches", "syncs", "uploads");
    for (int i = 0; i < r->n_rows; i++) {
        const bench_row *w = &r->rows[i];
        double fl = floor_us(r, w);
        printf("%-8s %5d %5d %7d %12.1f %12.1f %10.1f %12.1f %7.1f%% %10.1f", w->op, w->seqs, w->rows, w->ctx,
               w->median_us, w->min_us, w->bytes / 1e6, fl, 100 * fl / w->median_us, w->host_us);
        if (w->counts.counted)
            printf(" %9.1f %6.1f %8.1f", w->counts.launches, w->counts.syncs, w->counts.uploads);
        printf("\n");
    }
}

static void print_json(const bench_run *r)
{
    printf("{\"preset\":");
    cli_print_json_string(stdout, r->a->preset->name, strlen(r->a->preset->name));
    printf(",\"device\":");
    cli_print_json_string(stdout, r->device, strlen(r->device));
    printf(",\"bandwidth_gbs\":%.3f,\"bandwidth_copy_op_gbs\":%.3f,\"bandwidth_driver_gbs\":%.3f,"
           "\"bandwidth_bytes\":%.0f,\"drafter_quant\":\"%s\",\"reps\":%d,\"warmup\":%d,",
           r->bw / 1e9, r->bw_op / 1e9, r->bw_driver / 1e9, r->bw_bytes, r->a->fp8 ? "fp8" : "bf16", r->a->reps,
           r->warmup);
    if (r->a->sample)
        printf("\"sample\":{\"temperature\":%g,\"top_k\":%d,\"top_p\":%g,\"repetition_penalty\":%g,"
               "\"frequency_penalty\":%g,\"presence_penalty\":%g,\"on\":\"%s\"},",
               r->a->so.temperature, r->a->so.top_k, r->a->so.top_p, r->a->so.rep_penalty,
               r->a->so.frequency_penalty, r->a->so.presence_penalty,
               r->be->ops->sample_rows && !dflash_levers_get()->host_sampling ? "device" : "host");
    printf("\"rows\":[");
    for (int i = 0; i < r->n_rows; i++) {
        const bench_row *w = &r->rows[i];
        double fl = floor_us(r, w);
        printf("%s{\"op\":\"%s\",\"seqs\":%d,\"rows\":%d,\"ctx\":%d,\"median_us\":%.3f,\"min_us\":%.3f,"
               "\"bytes\":%.0f,\"floor_us\":%.3f,\"floor_pct\":%.3f,\"host_us\":%.3f",
               i ? "," : "", w->op, w->seqs, w->rows, w->ctx, w->median_us, w->min_us, w->bytes, fl, 100 * fl / w->median_us,
               w->host_us);
        if (w->counts.counted)
            printf(",\"launches\":%.2f,\"syncs\":%.2f,\"uploads\":%.2f,\"upload_bytes\":%.0f", w->counts.launches,
                   w->counts.syncs, w->counts.uploads, w->counts.upload_bytes);
        printf("}");
    }
    printf("]}\n");
}

int dflash_cmd_bench(int argc, char **argv)
{
    bench_args a;
    if (!parse(argc, argv, &a))
        return 2;
    bench_run r = { .a = &a };
    dflash_status s = open_backend(&r);
    if (s == DFLASH_OK)
        s = measure_bandwidth(&r);
    /* with both, the drafter stays open for the whole step the target times */
    drafter_set d = { 0 };
    if (s == DFLASH_OK && a.preset->drafter)
        s = bench_drafter(&r, &d);
    if (s == DFLASH_OK && a.preset->target)
        s = bench_target(&r, a.preset->drafter ? &d : NULL);
    if (a.preset->drafter)
        drafter_close(&r, &d);
    if (s == DFLASH_OK) {
        if (a.json)
            print_json(&r);
        else
            print_table(&r);
    } else {
        fprintf(stderr, "dflash bench: %s\n", dflash_last_error());
    }
    dflash_backend_destroy(r.be);
    return s == DFLASH_OK ? cli_finish_stdout(0) : 1;
}
