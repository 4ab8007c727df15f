/* cmd_generate.c: `dflash generate`: load a target (and optionally a
 * drafter), run the speculative (or plain) loop on a prompt, print the ids
 * or a JSON object with statistics. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "draft/dflash_head.h"
#include "draft/ngram.h"
#include "spec/spec.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: dflash generate -m TARGET_DIR [-d DRAFT_DIR | --draft ngram] --prompt-ids IDS [options]\n"
            "\n"
            "Generation on the CPU, greedy by default. With a drafter, speculative decoding whose\n"
            "output is exactly the target's own greedy output (or, when sampling, follows the\n"
            "target's own distribution); without one, plain autoregressive decoding.\n"
            "\n"
            "options:\n"
            "  -m, --model DIR        Qwen3 target checkpoint folder (config.json + safetensors)\n"
            "  -d, --draft DIR|ngram  DFlash drafter folder, or 'ngram' for prompt-lookup drafting\n"
            "  --block-size B         tokens per speculative step (last token + B-1 drafts);\n"
            "                         default: the drafter's block_size (16 for ngram)\n"
            "  --ctx-cap N            drafter context window in positions, 0 = none\n"
            "                         (default: DFLASH_CTX_CAP, else 4096)\n"
            "  --drafter-quant Q      bf16 (default) or fp8: drafter weights in fp8 e4m3 with\n"
            "                         per-row scales (also DFLASH_DRAFTER_FP8=1)\n"
            "  --prompt-ids IDS       prompt token ids, comma-separated (e.g. 1,2,3)\n"
            "  -n, --n-new N          tokens to generate (default 64)\n"
            "  --max-ctx N            longest sequence the KV cache holds (default: prompt + n + 64)\n"
            "  --temp T               sampling temperature; 0 = greedy (default 0)\n"
            "  --top-k K              keep the K most likely tokens; 0 = off (default)\n"
            "  --top-p P              nucleus: keep the most likely tokens holding mass P; 1 = off (default)\n"
            "  --min-p P              drop tokens below P x the top probability; 0 = off (default)\n"
            "  --rep-penalty R        repetition penalty over tokens already in the sequence\n"
            "                         (HF semantics); 1 = off (default)\n"
            "  --seed S               RNG seed for sampling (default 0); the same seed gives the same output\n"
            "  --json                 print one JSON object {\"prompt_ids\",\"output_ids\",\"stats\"}\n"
            "  --trace FILE           write one JSON line per step: {\"pos\",\"drafts\",\"accepted\",\"next\"}\n"
            "  -h, --help             this text\n"
            "\n"
            "Without --json the generated ids are printed space-separated on one line and\n"
            "a statistics line goes to stderr.\n");
}

typedef struct gen_args {
    const char *model, *draft, *trace;
    int32_t *prompt;
    int n_prompt, n_new, max_ctx, json, block_size, ctx_cap, quant;
    dflash_sampler_opts sampler;
} gen_args;

/* A whole-string unsigned 64-bit seed (decimal or 0x hex). */
static int parse_seed(const char *opt, const char *v, uint64_t *out)
{
    char *end;
    errno = 0;
    unsigned long long x = strtoull(v, &end, 0);
    if (errno || end == v || *end || v[0] == '-') {
        fprintf(stderr, "dflash generate: %s expects an unsigned 64-bit integer, got '%s'\n", opt, v);
        return 0;
    }
    *out = (uint64_t)x;
    return 1;
}

static int parse(int argc, char **argv, gen_args *a)
{
    memset(a, 0, sizeof *a);
    a->n_new = 64;
    a->ctx_cap = -1;
    a->quant = -1;
    dflash_sampler_default_opts(&a->sampler);
    for (int i = 1; i < argc; i++) {
        const char *o = argv[i], *v;
        if (!strcmp(o, "-h") || !strcmp(o, "--help")) {
            usage(stdout);
            exit(0);
        } else if (!strcmp(o, "-m") || !strcmp(o, "--model")) {
            if (!(a->model = cli_value(argc, argv, &i)))
                return 0;
        } else if (!strcmp(o, "-d") || !strcmp(o, "--draft")) {
            if (!(a->draft = cli_value(argc, argv, &i)))
                return 0;
        } else if (!strcmp(o, "--block-size")) {
            if (!(v = cli_value(argc, argv, &i)) || !cli_parse_int(o, v, 2, DFLASH_MAX_BLOCK, &a->block_size))
                return 0;
        } else if (!strcmp(o, "--ctx-cap")) {
            if (!(v = cli_value(argc, argv, &i)) || !cli_parse_int(o, v, 0, 1 << 30, &a->ctx_cap))
                return 0;
        } else if (!strcmp(o, "--drafter-quant")) {
            if (!(v = cli_value(argc, argv, &i)))
                return 0;
            if (!strcmp(v, "bf16")) {
                a->quant = DFLASH_QUANT_BF16;
            } else if (!strcmp(v, "fp8")) {
                a->quant = DFLASH_QUANT_FP8_WEIGHTS;
            } else {
                fprintf(stderr, "dflash generate: --drafter-quant expects bf16 or fp8, got '%s'\n", v);
                return 0;
            }
        } else if (!strcmp(o, "--prompt-ids")) {
            if (!(v = cli_value(argc, argv, &i)) || !cli_parse_ids(o, v, &a->prompt, &a->n_prompt))
                return 0;
        } else if (!strcmp(o, "-n") || !strcmp(o, "--n-new")) {
            if (!(v = cli_value(argc, argv, &i)) || !cli_parse_int(o, v, 0, 1 << 24, &a->n_new))
                return 0;
        } else if (!strcmp(o, "--max-ctx")) {
            if (!(v = cli_value(argc, argv, &i)) || !cli_parse_int(o, v, 1, 1 << 24, &a->max_ctx))
                return 0;
        } else if (!strcmp(o, "--temp")) {
            if (!(v = cli_value(argc, argv, &i)) || !cli_parse_double(o, v, 0, 1e6, &a->sampler.temperature))
                return 0;
        } else if (!strcmp(o, "--top-k")) {
            if (!(v = cli_value(argc, argv, &i)) || !cli_parse_int(o, v, 0, 1 << 30, &a->sampler.top_k))
                return 0;
        } else if (!strcmp(o, "--top-p")) {
            if (!(v = cli_value(argc, argv, &i)) || !cli_parse_double(o, v, 1e-9, 1, &a->sampler.top_p))
                return 0;
        } else if (!strcmp(o, "--min-p")) {
            if (!(v = cli_value(argc, argv, &i)) || !cli_parse_double(o, v, 0, 1, &a->sampler.min_p))
                return 0;
        } else if (!strcmp(o, "--rep-penalty")) {
            if (!(v = cli_value(argc, argv, &i)) || !cli_parse_double(o, v, 1e-6, 1e6, &a->sampler.rep_penalty))
                return 0;
        } else if (!strcmp(o, "--seed")) {
            if (!(v = cli_value(argc, argv, &i)) || !parse_seed(o, v, &a->sampler.seed))
                return 0;
        } else if (!strcmp(o, "--json")) {
            a->json = 1;
        } else if (!strcmp(o, "--trace")) {
            if (!(a->trace = cli_value(argc, argv, &i)))
                return 0;
        } else {
            fprintf(stderr, "dflash generate: unknown option '%s' (see --help)\n", o);
            return 0;
        }
    }
    if (!a->model || !a->prompt) {
        fprintf(stderr, "dflash generate: -m and --prompt-ids are required (see --help)\n");
        return 0;
    }
    return 1;
}

static void print_json(const gen_args *a, const int32_t *out, int n_out, const dflash_gen_stats *st)
{
    printf("{\"prompt_ids\":");
    cli_print_ids(stdout, a->prompt, a->n_prompt);
    printf(",\"output_ids\":");
    cli_print_ids(stdout, out, n_out);
    printf(",\"stats\":{\"seed\":%llu,\"n_prompt\":%d,\"n_generated\":%d,\"steps\":%d,\"mean_accept\":%.4f,\"accept_hist\":[",
           (unsigned long long)a->sampler.seed, st->n_prompt, st->n_generated, st->n_steps, st->mean_accept);
    int top = 1;
    for (int i = 1; i <= DFLASH_MAX_BLOCK; i++)
        if (st->accept_hist[i])
            top = i;
    for (int i = 1; i <= top; i++)
        printf("%s%lld", i > 1 ? "," : "", (long long)st->accept_hist[i]);
    printf("],\"accept_per_pos\":[");
    for (int i = 0; i < DFLASH_MAX_BLOCK && st->pos_tried[i]; i++)
        printf("%s%.4f", i ? "," : "", (double)st->pos_accepted[i] / (double)st->pos_tried[i]);
    printf("],\"prefill_ms\":%.3f,\"draft_ms\":%.3f,\"verify_ms\":%.3f,\"total_ms\":%.3f,\"tokens_per_s\":%.2f,"
           "\"stopped\":%s}}\n",
           st->prefill_ms, st->draft_ms, st->verify_ms, st->total_ms, st->tokens_per_s,
           st->stopped ? "true" : "false");
}

static dflash_status make_proposer(const gen_args *a, dflash_qwen3 *target, dflash_proposer **out)
{
    if (!strcmp(a->draft, "ngram"))
        return dflash_ngram_create(a->block_size ? a->block_size : 16, 1, 3, out);
    dflash_head_opts ho;
    dflash_head_default_opts(&ho);
    ho.max_ctx = target->opts.max_ctx;
    ho.ctx_cap = a->ctx_cap;
    ho.block_size = a->block_size;
    ho.quant = a->quant;
    dflash_head *h;
    DFLASH_TRY(dflash_head_load(a->draft, target, &ho, &h));
    *out = &h->proposer;
    return DFLASH_OK;
}

int dflash_cmd_generate(int argc, char **argv)
{
    gen_args a;
    if (!parse(argc, argv, &a)) {
        free(a.prompt);
        return 2;
    }
    int rc = 1;
    dflash_backend *be = NULL;
    dflash_qwen3 *target = NULL;
    dflash_kv_seq seq = { 0 };
    int32_t *out = malloc(((size_t)a.n_new + 1) * sizeof *out);
    FILE *trace = NULL;
    dflash_status s = out ? dflash_backend_cpu_create(&be) : dflash_fail(DFLASH_ERR_OOM, "out of memory");
    if (s == DFLASH_OK) {
        dflash_qwen3_opts topts;
        dflash_qwen3_default_opts(&topts);
        topts.max_ctx = a.max_ctx ? a.max_ctx : a.n_prompt + a.n_new + 64;
        s = dflash_qwen3_load(a.model, be, &topts, &target);
    }
    if (s == DFLASH_OK)
        s = dflash_qwen3_seq_init(target, &seq);
    dflash_proposer *prop = NULL;
    void *pstate = NULL;
    if (s == DFLASH_OK && a.draft)
        s = make_proposer(&a, target, &prop);
    if (s == DFLASH_OK && prop)
        s = prop->ops->alloc_state(prop, a.n_prompt + a.n_new + DFLASH_MAX_BLOCK, &pstate);
    if (s == DFLASH_OK && a.trace && !(trace = fopen(a.trace, "w")))
        s = dflash_fail(DFLASH_ERR_IO, "cannot open trace file %s", a.trace);
    if (s == DFLASH_OK) {
        dflash_gen_opts go;
        dflash_gen_default_opts(&go);
        go.n_new = a.n_new;
        go.trace = trace;
        go.block_size = a.block_size;
        go.sampler = a.sampler;
        dflash_gen_stats st;
        int n_out = 0;
        s = dflash_spec_generate(target, &seq, prop, pstate, a.prompt, a.n_prompt, &go, out, &n_out, &st);
        if (s == DFLASH_OK) {
            if (a.json) {
                print_json(&a, out, n_out, &st);
            } else {
                for (int i = 0; i < n_out; i++)
                    printf("%s%d", i ? " " : "", out[i]);
                printf("\n");
                fprintf(stderr, "[%d prompt + %d generated tokens, %d steps, tau %.2f, %.1f tokens/s]\n",
                        st.n_prompt, st.n_generated, st.n_steps, st.mean_accept, st.tokens_per_s);
            }
            rc = 0;
        }
    }
    if (s != DFLASH_OK)
        fprintf(stderr, "dflash generate: %s\n", dflash_last_error());
    if (trace)
        fclose(trace);
    if (prop && pstate)
        prop->ops->free_state(prop, pstate);
    dflash_proposer_destroy(prop);
    if (target)
        dflash_qwen3_seq_free(target, &seq);
    dflash_qwen3_free(target);
    dflash_backend_destroy(be);
    free(out);
    free(a.prompt);
    return rc;
}
