/* engine.c: see engine.h. */
#include "cli/engine.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/args.h"
#include "core/file.h"
#include "core/log.h"
#include "draft/dflash_head.h"
#include "engine/open.h"
#include "io/chat.h"
#include "io/hf_config.h"

void cli_engine_args_init(cli_engine_args *a)
{
    memset(a, 0, sizeof *a);
    a->ctx_cap = -1;
    a->quant = -1;
    a->device = "cpu";
    dflash_sampler_default_opts(&a->sampler);
}

void cli_engine_usage(FILE *f)
{
    fprintf(f,
            "model and drafting:\n"
            "  -m, --model DIR        target checkpoint folder: Qwen3, Qwen3-MoE, Llama, Qwen3.5 or\n"
            "                         Qwen3.5-MoE (config.json +\n"
            "                         safetensors)\n"
            "  -d, --draft DIR|ngram  DFlash drafter folder, or 'ngram' for prompt-lookup drafting;\n"
            "                         without it, plain decoding\n"
            "  --tokenizer PATH       tokenizer.json or its folder (default: the model folder)\n"
            "  --block-size B|auto    tokens per speculative step (last token + B-1 drafts),\n"
            "                         at most the drafter's block_size (ngram: 16, up to 64). auto\n"
            "                         (the default): each step drafts 0..block_size-1 tokens,\n"
            "                         as many as maximise expected tokens per second from the\n"
            "                         verify and draft times and acceptance measured so far;\n"
            "                         the output is the same, only the speed differs\n"
            "  --ctx-cap N            drafter context window in positions, 0 = none\n"
            "                         (default: DFLASH_CTX_CAP, else 4096)\n"
            "  --drafter-quant Q      bf16 (default) or fp8: drafter weights in fp8 e4m3 with\n"
            "                         per-row scales (also DFLASH_DRAFTER_FP8=1)\n"
            "  --max-ctx N            longest sequence in positions (prompt + output; in chat, the\n"
            "                         whole conversation); the KV cache holds it plus 64 positions.\n"
            "                         At most the model's context length (max_position_embeddings)\n"
            "  --allow-long-context   let a sequence go past the model's context length\n"
            "                         (max_position_embeddings), which is refused otherwise;\n"
            "                         prints a warning when it does\n"
            "  --ignore-eos           do not stop at the model's end-of-sequence tokens\n"
            "  --device D             cpu (default), cuda, or auto (cuda when a GPU is usable, else\n"
            "                         cpu); which one is used, and why, is printed on stderr.\n"
            "                         KV pages are f32 on the CPU, bf16 on the GPU.\n"
            "sampling (default: greedy):\n"
            "  --temp T               temperature; 0 = greedy\n"
            "  --top-k K              keep the K most likely tokens; 0 = off\n"
            "  --top-p P              nucleus: keep the most likely tokens holding mass P; 1 = off\n"
            "  --min-p P              drop tokens below P x the top probability; 0 = off\n"
            "  --rep-penalty R        repetition penalty over this call's prompt and output\n"
            "                         (HF semantics); 1 = off\n"
            "  --frequency-penalty F  subtract F x a token's count among the generated tokens\n"
            "                         from its logit (OpenAI semantics); in [-2, 2], 0 = off\n"
            "  --presence-penalty P   subtract P from the logit of a token already generated;\n"
            "                         in [-2, 2], 0 = off\n"
            "  --seed S               RNG seed, a decimal integer (default 0); the same seed gives\n"
            "                         the same output, with or without a drafter, at any block size\n"
            "                         (each token is drawn with a uniform keyed by seed and position)\n");
}

int cli_engine_parse(int argc, char **argv, int *i, cli_engine_args *a, const char *cmd)
{
    const char *o = argv[*i], *v;
#define VALUE() if (!(v = cli_value(argc, argv, i))) return -1
    if (!strcmp(o, "-m") || !strcmp(o, "--model")) {
        VALUE();
        a->model = v;
    } else if (!strcmp(o, "-d") || !strcmp(o, "--draft")) {
        VALUE();
        a->draft = v;
    } else if (!strcmp(o, "--tokenizer")) {
        VALUE();
        a->tokenizer = v;
    } else if (!strcmp(o, "--block-size")) {
        VALUE();
        if (!strcmp(v, "auto")) {
            a->block_size = 0;
            a->block_fixed = 0;
            return 1;
        }
        a->block_fixed = 1;
        return cli_parse_int_or(o, v, "auto", 2, DFLASH_MAX_BLOCK, &a->block_size) ? 1 : -1;
    } else if (!strcmp(o, "--ctx-cap")) {
        VALUE();
        return cli_parse_int(o, v, 0, 1 << 30, &a->ctx_cap) ? 1 : -1;
    } else if (!strcmp(o, "--max-ctx")) {
        VALUE();
        return cli_parse_int(o, v, 1, 1 << 24, &a->max_ctx) ? 1 : -1;
    } else if (!strcmp(o, "--drafter-quant")) {
        VALUE();
        if (!strcmp(v, "bf16") || !strcmp(v, "fp8")) {
            a->quant = !strcmp(v, "fp8") ? DFLASH_QUANT_FP8_WEIGHTS : DFLASH_QUANT_BF16;
        } else {
            fprintf(stderr, "dflash %s: --drafter-quant expects bf16 or fp8, got '%s'\n", cmd, v);
            return -1;
        }
    } else if (!strcmp(o, "--device")) {
        VALUE();
        if (strcmp(v, "cpu") && strcmp(v, "cuda") && strcmp(v, "auto")) {
            fprintf(stderr, "dflash %s: --device expects cpu, cuda or auto, got '%s'\n", cmd, v);
            return -1;
        }
        a->device = v;
    } else if (!strcmp(o, "--ignore-eos")) {
        a->ignore_eos = 1;
    } else if (!strcmp(o, "--allow-long-context")) {
        a->allow_long_ctx = 1;
    } else if (!strcmp(o, "--temp")) {
        VALUE();
        return cli_parse_double(o, v, 0, 1e6, &a->sampler.temperature) ? 1 : -1;
    } else if (!strcmp(o, "--top-k")) {
        VALUE();
        return cli_parse_int(o, v, 0, 1 << 30, &a->sampler.top_k) ? 1 : -1;
    } else if (!strcmp(o, "--top-p")) {
        VALUE();
        return cli_parse_double(o, v, 1e-9, 1, &a->sampler.top_p) ? 1 : -1;
    } else if (!strcmp(o, "--min-p")) {
        VALUE();
        return cli_parse_double(o, v, 0, 1, &a->sampler.min_p) ? 1 : -1;
    } else if (!strcmp(o, "--rep-penalty")) {
        VALUE();
        return cli_parse_double(o, v, 1e-6, 1e6, &a->sampler.rep_penalty) ? 1 : -1;
    } else if (!strcmp(o, "--frequency-penalty")) {
        VALUE();
        return cli_parse_double(o, v, -2, 2, &a->sampler.frequency_penalty) ? 1 : -1;
    } else if (!strcmp(o, "--presence-penalty")) {
        VALUE();
        return cli_parse_double(o, v, -2, 2, &a->sampler.presence_penalty) ? 1 : -1;
    } else if (!strcmp(o, "--seed")) {
        VALUE();
        return cli_parse_u64(o, v, &a->sampler.seed) ? 1 : -1;
    } else {
        return 0;
    }
#undef VALUE
    return 1;
}

int cli_engine_parse_or_help(int argc, char **argv, int *i, cli_engine_args *a, const char *cmd,
                             void (*usage)(FILE *))
{
    if (!strcmp(argv[*i], "-h") || !strcmp(argv[*i], "--help")) {
        usage(stdout);
        exit(cli_finish_stdout(0));
    }
    return cli_engine_parse(argc, argv, i, a, cmd);
}

/* --block-size against the drafter's block (0: no drafter). */
static dflash_status check_block_option(const cli_engine_args *a, int drafter_block)
{
    if (a->block_size && !a->draft)
        return dflash_fail(DFLASH_ERR_INVALID_ARG, "--block-size %d needs a drafter (-d DIR or --draft ngram)",
                           a->block_size);
    if (a->block_size > drafter_block)
        return dflash_fail(DFLASH_ERR_INVALID_ARG, "--block-size %d exceeds the drafter's block_size %d (%s)",
                           a->block_size, drafter_block, a->draft);
    return DFLASH_OK;
}

/* --block-size against the drafter the arguments name (its config.json's
 * block), before anything loads. */
static dflash_status plan_block(const cli_engine_args *a)
{
    int block, own;
    DFLASH_TRY(dflash_open_block(a->draft, a->block_size, &block, &own));
    /* the n-gram proposer takes any --block-size (at most DFLASH_MAX_BLOCK:
     * the parser's bound) */
    return a->draft && !strcmp(a->draft, "ngram") ? DFLASH_OK : check_block_option(a, own);
}

/* "DIR/config.json" or the file -m names, for messages. */
static void config_path(const char *model, char *buf, size_t cap)
{
    struct stat sb;
    if (stat(model, &sb) == 0 && S_ISDIR(sb.st_mode))
        snprintf(buf, cap, "%s/config.json", model);
    else
        snprintf(buf, cap, "%s", model);
}

dflash_status cli_engine_plan_load(const cli_engine_args *a, int dflt_max_ctx, cli_engine_plan *p)
{
    memset(p, 0, sizeof *p);
    /* A file given for a folder is named as such before anything reads it. */
    DFLASH_TRY(dflash_config_check_folder(a->model, "-m"));
    if (a->draft && strcmp(a->draft, "ngram") != 0)
        DFLASH_TRY(dflash_config_check_folder(a->draft, "-d"));
    dflash_model_config tc;
    DFLASH_TRY(dflash_config_load(a->model, &tc));
    DFLASH_TRY(plan_block(a));
    p->model_ctx = tc.max_position_embeddings;
    char cfg[256];
    config_path(a->model, cfg, sizeof cfg);
    if (a->max_ctx > p->model_ctx && !a->allow_long_ctx)
        return dflash_fail(DFLASH_ERR_INVALID_ARG, "--max-ctx %d exceeds the model's context length %d "
                           "(max_position_embeddings in %s); lower it or pass --allow-long-context",
                           a->max_ctx, p->model_ctx, cfg);
    int user = a->max_ctx ? a->max_ctx : dflt_max_ctx;
    if (!a->allow_long_ctx && (!user || user >= p->model_ctx)) {
        p->limit = p->model_ctx;
        p->limit_is_model = 1;
        snprintf(p->limit_desc, sizeof p->limit_desc, "the model's context length %d (max_position_embeddings "
                 "in %s)", p->model_ctx, cfg);
    } else if (user) {
        p->limit = user;
        snprintf(p->limit_desc, sizeof p->limit_desc, "%s %d", a->max_ctx ? "--max-ctx" : "the default --max-ctx",
                 user);
    } else {
        p->limit = INT_MAX;
        snprintf(p->limit_desc, sizeof p->limit_desc, "no limit");
    }
    return DFLASH_OK;
}

const char *cli_engine_limit_hint(const cli_engine_plan *p)
{
    return p->limit_is_model ? "pass --allow-long-context to go past it" : "raise --max-ctx";
}

void cli_engine_warn_long(const cli_engine_args *a, const cli_engine_plan *p, long long positions)
{
    if (!a->allow_long_ctx || positions <= p->model_ctx)
        return;
    char cfg[256];
    config_path(a->model, cfg, sizeof cfg);
    fprintf(stderr, "dflash %s: warning: --allow-long-context: up to %lld positions, past the model's context "
            "length %d (max_position_embeddings in %s); the model was not trained there and its output may "
            "degrade\n", cli_command() ? cli_command() : "", positions, p->model_ctx, cfg);
}

dflash_status cli_engine_chat_opts(const cli_engine_args *a, const dflash_tokenizer *tok, int think,
                                   dflash_chat_opts *co)
{
    *co = dflash_chat_default_opts();
    co->thinking = think;
    return dflash_chat_format_detect(a->tokenizer ? a->tokenizer : a->model, tok, &co->format);
}

dflash_status cli_engine_encode_prompt(dflash_tokenizer *tok, const char *text, size_t len, const char *system,
                                       const dflash_chat_opts *co, int32_t **ids, size_t *n)
{
    if (!co)
        return dflash_tokenizer_encode_special(tok, text, len, ids, n);
    dflash_chat_msg msgs[2];
    size_t nm = 0;
    if (system)
        msgs[nm++] = (dflash_chat_msg){ DFLASH_CHAT_SYSTEM, system };
    msgs[nm++] = (dflash_chat_msg){ DFLASH_CHAT_USER, text };
    return dflash_chat_encode(tok, msgs, nm, co, ids, n);
}

void cli_engine_chat_prepare(cli_engine *e, const cli_engine_args *a, const dflash_chat_opts *co)
{
    if (dflash_chat_check_tokenizer(e->tok, co) != DFLASH_OK) {
        fprintf(stderr, "dflash %s: warning: %s; the chat markup goes to the model as plain text\n",
                cli_command() ? cli_command() : "", dflash_last_error());
        return;
    }
    /* A base model's EOS files name only its end of text, but a chat turn
     * ends at the format's end-of-turn marker: stop there too (the check
     * above made it one added token). */
    int32_t id = dflash_tokenizer_token_id(e->tok, dflash_chat_end_of_turn(co->format));
    if (!a->ignore_eos)
        dflash_stop_ids_add(e->stop_ids, (int)(sizeof e->stop_ids / sizeof e->stop_ids[0]), &e->n_stop, id);
}

dflash_status cli_engine_load_tokenizer(cli_engine *e, const cli_engine_args *a)
{
    memset(e, 0, sizeof *e);
    return dflash_tokenizer_load(a->tokenizer ? a->tokenizer : a->model, &e->tok);
}

void cli_engine_close(cli_engine *e)
{
    dflash_tokenizer_free(e->tok);
    memset(e, 0, sizeof *e);
}

dflash_status cli_engine_lib_stops(cli_engine *e, const cli_engine_args *a, const dflash_chat_opts *co)
{
    if (!a->ignore_eos && e->tok) {
        int32_t found[DFLASH_CHAT_MAX_EOS];
        size_t nf = 0;
        DFLASH_TRY(dflash_chat_eos_ids(a->model, e->tok, found, DFLASH_CHAT_MAX_EOS, &nf));
        for (size_t i = 0; i < nf; i++)
            dflash_stop_ids_add(e->stop_ids, (int)(sizeof e->stop_ids / sizeof e->stop_ids[0]), &e->n_stop, found[i]);
    }
    if (co)
        cli_engine_chat_prepare(e, a, co);
    return DFLASH_OK;
}

dflash_status cli_engine_open_lib(const cli_engine_args *a, int max_sessions, int max_ctx, int kv_pages,
                                  dflash_engine **out)
{
    dflash_engine_opts eo;
    dflash_engine_default_opts(&eo);
    eo.model_dir = a->model;
    eo.draft = a->draft;
    eo.device = a->device;
    eo.max_sessions = max_sessions;
    eo.max_ctx = max_ctx;
    eo.long_context = a->allow_long_ctx;
    eo.block_size = a->block_size;
    eo.width_auto = !a->block_fixed;
    eo.drafter_fp8 = a->quant < 0 ? -1 : a->quant == DFLASH_QUANT_FP8_WEIGHTS;
    eo.ctx_cap = a->ctx_cap;
    eo.kv_pages = kv_pages;
    return dflash_engine_open(&eo, out);
}

void cli_session_opts(const cli_engine *e, const cli_engine_args *a, const dflash_sampler_opts *sampler,
                      int max_tokens, dflash_session_opts *so)
{
    dflash_session_default_opts(so);
    so->max_tokens = max_tokens;
    so->temperature = sampler->temperature;
    so->top_k = sampler->top_k;
    so->top_p = sampler->top_p;
    so->min_p = sampler->min_p;
    so->rep_penalty = sampler->rep_penalty;
    so->frequency_penalty = sampler->frequency_penalty;
    so->presence_penalty = sampler->presence_penalty;
    so->seed = sampler->seed;
    so->ignore_eos = a->ignore_eos;
    so->stop_ids = e->stop_ids;
    so->n_stop_ids = e->n_stop;
}

void cli_session_stats(const dflash_session *s, dflash_gen_stats *st)
{
    _Static_assert(DFLASH_STATS_POSITIONS == DFLASH_MAX_BLOCK, "both statistics cover the same positions");
    dflash_session_stats ss;
    dflash_session_stats_get(s, &ss);
    memset(st, 0, sizeof *st);
    st->n_prompt = ss.prompt_tokens;
    st->n_generated = ss.generated_tokens;
    st->n_steps = ss.steps;
    st->stopped = ss.stopped;
    st->mean_accept = ss.mean_accept;
    memcpy(st->accept_hist, ss.commit_hist, sizeof st->accept_hist);
    memcpy(st->pos_tried, ss.pos_tried, sizeof st->pos_tried);
    memcpy(st->pos_accepted, ss.pos_accepted, sizeof st->pos_accepted);
    memcpy(st->width_hist, ss.width_hist, sizeof st->width_hist);
    st->prefill_ms = ss.prefill_ms;
    st->draft_ms = ss.draft_ms;
    st->verify_ms = ss.verify_ms;
    st->observe_ms = ss.observe_ms;
    st->total_ms = ss.total_ms;
    st->tokens_per_s = ss.tokens_per_s;
}

dflash_status cli_session_run(dflash_engine *engine, dflash_session *s, const int32_t *ids, size_t n)
{
    DFLASH_TRY(dflash_session_start_ids(s, ids, n));
    for (int active = 1; active;)
        DFLASH_TRY(dflash_engine_step(engine, &active));
    const char *msg;
    dflash_status st = dflash_session_error(s, &msg);
    return st == DFLASH_OK ? DFLASH_OK : dflash_fail(st, "%s", msg);
}

dflash_status cli_streamer_on_tokens(void *user, const int32_t *ids, int n)
{
    cli_streamer *st = user;
    for (int i = 0; i < n && st->status == DFLASH_OK; i++) {
        const char *piece;
        size_t len;
        st->status = dflash_detok_stream_push(st->ds, ids[i], &piece, &len);
        if (st->status == DFLASH_OK)
            fwrite(piece, 1, len, stdout);
    }
    if (st->status == DFLASH_OK)
        st->status = cli_check_output(stdout, "standard output");
    return st->status;
}

void cli_print_stats_line(FILE *f, const dflash_gen_stats *st)
{
    fprintf(f, "[%d prompt + %d generated tokens in %d steps; tau %.2f tokens/step; %.1f tokens/s; "
               "prefill %.0f ms, draft %.0f ms, verify %.0f ms%s]\n",
            st->n_prompt, st->n_generated, st->n_steps, st->mean_accept, st->tokens_per_s, st->prefill_ms,
            st->draft_ms, st->verify_ms, st->stopped ? "; stopped at end-of-sequence" : "");
    if (st->pos_tried[0]) {
        fprintf(f, "[draft acceptance by position:");
        for (int i = 0; i < DFLASH_MAX_BLOCK && st->pos_tried[i]; i++)
            fprintf(f, " %.2f", (double)st->pos_accepted[i] / (double)st->pos_tried[i]);
        fprintf(f, "]\n");
    }
    if (st->n_steps && st->width_hist[0] < st->n_steps) { /* a proposer drafted */
        fprintf(f, "[drafts per step (steps):");
        for (int k = 0; k < DFLASH_MAX_BLOCK; k++)
            if (st->width_hist[k])
                fprintf(f, " %d (%lld)", k, (long long)st->width_hist[k]);
        fprintf(f, "]\n");
    }
}

void cli_print_stats_json(FILE *f, const dflash_gen_stats *st, uint64_t seed)
{
    fprintf(f, "{\"seed\":%llu,\"n_prompt\":%d,\"n_generated\":%d,\"steps\":%d,\"mean_accept\":%.4f,\"accept_hist\":[",
            (unsigned long long)seed, st->n_prompt, st->n_generated, st->n_steps, st->mean_accept);
    int top = 1;
    for (int i = 1; i <= DFLASH_MAX_BLOCK; i++)
        if (st->accept_hist[i])
            top = i;
    for (int i = 1; i <= top; i++)
        fprintf(f, "%s%lld", i > 1 ? "," : "", (long long)st->accept_hist[i]);
    fprintf(f, "],\"accept_per_pos\":[");
    for (int i = 0; i < DFLASH_MAX_BLOCK && st->pos_tried[i]; i++)
        fprintf(f, "%s%.4f", i ? "," : "", (double)st->pos_accepted[i] / (double)st->pos_tried[i]);
    fprintf(f, "],\"drafts_per_step_hist\":[");
    int kt = 0;
    for (int k = 0; k < DFLASH_MAX_BLOCK; k++)
        if (st->width_hist[k])
            kt = k;
    for (int k = 0; k <= kt; k++)
        fprintf(f, "%s%lld", k ? "," : "", (long long)st->width_hist[k]);
    fprintf(f, "],\"prefill_ms\":%.3f,\"draft_ms\":%.3f,\"verify_ms\":%.3f,\"observe_ms\":%.3f,\"total_ms\":%.3f,\"tokens_per_s\":%.2f,"
               "\"stopped\":%s}",
            st->prefill_ms, st->draft_ms, st->verify_ms, st->observe_ms, st->total_ms, st->tokens_per_s,
            st->stopped ? "true" : "false");
}
