/* engine.c: the public engine and session API of include/dflash.h, on the
 * batched loop (dflash_spec_batch in spec/spec.h). The engine owns the
 * backend, the target with KV room for max_sessions sequences, the
 * proposer, the tokenizer (when the model folder has one) and the
 * end-of-sequence ids; a session owns its target sequence, its proposer
 * state and what it has generated, and carries what its cache holds from
 * one start to the next so a later start continues it. */
#include <stdlib.h>
#include <string.h>

#include "core/idbuf.h"
#include "core/status.h"
#include "draft/dflash_head.h"
#include "engine/open.h"
#include "io/hf_config.h"
#include "io/tokenizer.h"
#include "spec/spec.h"

#define ENGINE_MAX_STOP 16

struct dflash_engine {
    dflash_backend *be;
    dflash_qwen3 *target;
    dflash_proposer *prop;     /* NULL: plain decoding */
    dflash_tokenizer *tok;     /* NULL when the model folder has none */
    int32_t stop_ids[ENGINE_MAX_STOP];
    int n_stop;
    dflash_spec_batch *batch;     /* the sessions generating; a session runs while it is in it */
    int max_sessions, n_sessions; /* sessions that exist */
    int max_ctx;                  /* positions a session may hold: min(max_ctx, the model's) */
};

struct dflash_session {
    dflash_engine *e;
    dflash_session_opts o;
    dflash_kv_seq seq;
    void *pstate;
    dflash_spec_item item;
    int started;
    int32_t *prompt; /* this start's prompt: the unverified last token, then the new ids */
    int32_t *out;    /* [max_tokens] */
    /* every id the cache holds before this start's prompt: the history the
     * repetition penalty counts */
    dflash_idbuf held;
    /* after a start completed: its rows went into `held` (absorbed), and
     * its last token (carry_tok, when carry) opens the next prompt */
    int absorbed, carry;
    int32_t carry_tok;
};

void dflash_engine_default_opts(dflash_engine_opts *o)
{
    memset(o, 0, sizeof *o);
    o->device = "cpu";
    o->max_sessions = 8;
    o->max_ctx = 4096;
}

void dflash_session_default_opts(dflash_session_opts *o)
{
    memset(o, 0, sizeof *o);
    o->max_tokens = 256;
    o->top_p = 1.0;
    o->rep_penalty = 1.0;
}

static dflash_status engine_load(dflash_engine *e, const dflash_engine_opts *o)
{
    DFLASH_TRY(dflash_open_backend(o->device, "engine: device cuda: ", &e->be));
    dflash_model_config cfg;
    DFLASH_TRY(dflash_config_load(o->model_dir, &cfg));
    int block = DFLASH_MAX_BLOCK; /* KV room for the widest step a drafter may take */
    dflash_qwen3_opts to;
    dflash_qwen3_default_opts(&to);
    const int model_ctx = cfg.max_position_embeddings > 0 ? cfg.max_position_embeddings : o->max_ctx;
    e->max_ctx = o->max_ctx < model_ctx ? o->max_ctx : model_ctx;
    to.max_ctx = e->max_ctx + block;
    to.max_seqs = o->max_sessions;
    DFLASH_TRY(dflash_qwen3_load(o->model_dir, e->be, &to, &e->target));
    if (o->draft)
        DFLASH_TRY(dflash_open_proposer(o->draft, e->target, o->block_size, -1,
                                        o->drafter_fp8 ? DFLASH_QUANT_FP8_WEIGHTS : DFLASH_QUANT_BF16, &e->prop));
    /* text in and out, and the tokenizer's end-of-sequence ids, when the
     * folder has a tokenizer; ids alone work without one */
    if (dflash_tokenizer_load(o->model_dir, &e->tok) != DFLASH_OK)
        e->tok = NULL;
    /* a folder whose tokenizer files name no end of sequence still has
     * the config's ids */
    (void)dflash_open_stop_ids(e->target, o->model_dir, e->tok, e->stop_ids, ENGINE_MAX_STOP, &e->n_stop);
    e->max_sessions = o->max_sessions;
    DFLASH_TRY(dflash_spec_batch_new(e->target, e->prop, o->block_size, o->max_sessions, &e->batch));
    dflash_spec_batch_set_width_auto(e->batch, o->width_auto);
    return DFLASH_OK;
}

dflash_status dflash_engine_open(const dflash_engine_opts *o, dflash_engine **out)
{
    *out = NULL;
    if (!o || !o->model_dir)
        return dflash_fail(DFLASH_ERR_INVALID_ARG, "engine: no model_dir given");
    if (o->max_sessions <= 0 || o->max_ctx <= 0 || o->block_size < 0)
        return dflash_fail(DFLASH_ERR_INVALID_ARG, "engine: max_sessions %d, max_ctx %d, block_size %d (want > 0, > 0, "
                           ">= 0)", o->max_sessions, o->max_ctx, o->block_size);
    dflash_engine *e = calloc(1, sizeof *e);
    if (!e)
        return dflash_fail(DFLASH_ERR_OOM, "engine: out of memory");
    dflash_status s = engine_load(e, o);
    if (s != DFLASH_OK) {
        dflash_engine_close(e);
        return s;
    }
    *out = e;
    return DFLASH_OK;
}

void dflash_engine_close(dflash_engine *e)
{
    if (!e)
        return;
    dflash_spec_batch_free(e->batch);
    dflash_proposer_destroy(e->prop);
    dflash_qwen3_free(e->target);
    dflash_tokenizer_free(e->tok);
    dflash_backend_destroy(e->be);
    free(e);
}

/* The loop's sampler options from a session's. */
static dflash_sampler_opts session_sampler(const dflash_session_opts *o)
{
    return (dflash_sampler_opts){ .temperature = o->temperature, .top_k = o->top_k, .top_p = o->top_p,
                                  .min_p = o->min_p, .rep_penalty = o->rep_penalty, .seed = o->seed };
}

dflash_status dflash_session_new(dflash_engine *e, const dflash_session_opts *o, dflash_session **out)
{
    *out = NULL;
    if (!e || !o || o->max_tokens < 0)
        return dflash_fail(DFLASH_ERR_INVALID_ARG, "session: no engine or options, or max_tokens < 0");
    if (e->n_sessions == e->max_sessions)
        return dflash_fail(DFLASH_ERR_INVALID_ARG, "session: the engine already has its %d sessions (max_sessions)",
                           e->max_sessions);
    const dflash_sampler_opts so = session_sampler(o);
    DFLASH_TRY(dflash_sampler_check_opts(&so));
    dflash_session *s = calloc(1, sizeof *s);
    if (!s || !(s->out = malloc(((size_t)o->max_tokens + 1) * sizeof *s->out))) {
        free(s);
        return dflash_fail(DFLASH_ERR_OOM, "session: out of memory for %d output ids", o->max_tokens);
    }
    s->e = e;
    s->o = *o;
    dflash_status st = dflash_qwen3_seq_init(e->target, &s->seq);
    if (st == DFLASH_OK && e->prop)
        st = e->prop->ops->alloc_state(e->prop, e->target->opts.max_ctx, &s->pstate);
    if (st != DFLASH_OK) {
        if (s->seq.table)
            dflash_qwen3_seq_free(e->target, &s->seq);
        free(s->out);
        free(s);
        return st;
    }
    e->n_sessions++;
    *out = s;
    return DFLASH_OK;
}

void dflash_session_free(dflash_session *s)
{
    if (!s)
        return;
    dflash_engine *e = s->e;
    dflash_spec_batch_remove(e->batch, &s->item); /* nothing when it is not generating */
    if (s->pstate)
        e->prop->ops->free_state(e->prop, s->pstate);
    dflash_qwen3_seq_free(e->target, &s->seq);
    e->n_sessions--;
    free(s->prompt);
    free(s->out);
    dflash_idbuf_free(&s->held);
    free(s);
}

dflash_status dflash_session_start_ids(dflash_session *s, const int32_t *ids, size_t n)
{
    if (!s || (!ids && n))
        return dflash_fail(DFLASH_ERR_INVALID_ARG, "session: no session or ids");
    if (dflash_session_running(s))
        return dflash_fail(DFLASH_ERR_INVALID_ARG, "session: still generating; start it again once it is done");
    const int V = s->e->target->cfg.vocab_size;
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= V)
            return dflash_fail(DFLASH_ERR_INVALID_ARG, "session: id %d at %zu is not a token of the model (0..%d)",
                               ids[i], i, V - 1);
    /* what the last start left in the cache joins the history (once, even
     * if this start fails and is retried); its final token, emitted but
     * never run, opens this prompt */
    if (s->started && !s->absorbed) {
        DFLASH_TRY(dflash_idbuf_push(&s->held, s->item.prompt, (size_t)s->item.n_prompt, "session"));
        s->carry = s->item.n_out > 0;
        if (s->carry) {
            DFLASH_TRY(dflash_idbuf_push(&s->held, s->out, (size_t)s->item.n_out - 1, "session"));
            s->carry_tok = s->out[s->item.n_out - 1];
        }
        s->absorbed = 1;
    }
    const int carry = s->carry;
    if (n + (size_t)carry == 0)
        return dflash_fail(DFLASH_ERR_INVALID_ARG, "session: an empty prompt");
    int32_t *p = malloc((n + 1) * sizeof *p);
    if (!p)
        return dflash_fail(DFLASH_ERR_OOM, "session: out of memory for %zu ids", n + 1);
    if (carry)
        p[0] = s->carry_tok;
    memcpy(p + carry, ids, n * sizeof *ids);
    free(s->prompt);
    s->prompt = p;
    dflash_spec_item *it = &s->item;
    memset(it, 0, sizeof *it);
    it->seq = &s->seq;
    it->pstate = s->pstate;
    it->prompt = p;
    it->n_prompt = (int)n + carry;
    it->out = s->out;
    dflash_gen_default_opts(&it->opts);
    it->opts.n_new = s->o.max_tokens;
    it->opts.sampler = session_sampler(&s->o);
    it->opts.stop_ids = s->o.ignore_eos ? NULL : s->e->stop_ids;
    it->opts.n_stop = s->o.ignore_eos ? 0 : s->e->n_stop;
    it->opts.history = s->held.ids;
    it->opts.n_history = (int)s->held.n;
    it->opts.on_tokens = s->o.on_tokens;
    it->opts.user = s->o.user;
    DFLASH_TRY(dflash_spec_batch_add(s->e->batch, it));
    s->started = 1;
    s->absorbed = 0;
    return DFLASH_OK;
}

dflash_status dflash_session_start_text(dflash_session *s, const char *text)
{
    if (!s || !text)
        return dflash_fail(DFLASH_ERR_INVALID_ARG, "session: no session or text");
    if (!s->e->tok)
        return dflash_fail(DFLASH_ERR_NOT_FOUND, "session: the engine's model folder has no tokenizer.json; start "
                           "with ids");
    int32_t *ids;
    size_t n;
    DFLASH_TRY(dflash_tokenizer_encode_special(s->e->tok, text, strlen(text), &ids, &n));
    dflash_status st = dflash_session_start_ids(s, ids, n);
    free(ids);
    return st;
}

int dflash_engine_max_ctx(const dflash_engine *e)
{
    return e->max_ctx;
}

dflash_status dflash_engine_step(dflash_engine *e, int *n_active)
{
    *n_active = 0;
    if (!e)
        return dflash_fail(DFLASH_ERR_INVALID_ARG, "engine step: no engine");
    return dflash_spec_batch_step(e->batch, n_active);
}

int dflash_session_running(const dflash_session *s)
{
    return s && s->started && dflash_spec_batch_has(s->e->batch, &s->item);
}

void dflash_session_output(const dflash_session *s, const int32_t **ids, size_t *n)
{
    *ids = s->out;
    *n = s->started ? (size_t)s->item.n_out : 0;
}

dflash_status dflash_session_text(const dflash_session *s, char **text)
{
    *text = NULL;
    if (!s->e->tok)
        return dflash_fail(DFLASH_ERR_NOT_FOUND, "session: the engine's model folder has no tokenizer.json");
    size_t len;
    return dflash_tokenizer_decode(s->e->tok, s->out, s->started ? (size_t)s->item.n_out : 0,
                                   DFLASH_DECODE_SKIP_SPECIAL, text, &len);
}

void dflash_session_stats_get(const dflash_session *s, dflash_session_stats *out)
{
    const dflash_gen_stats *st = &s->item.stats;
    *out = (dflash_session_stats){ .prompt_tokens = st->n_prompt, .generated_tokens = s->item.n_out,
                                   .steps = st->n_steps, .mean_accept = st->mean_accept,
                                   .total_ms = st->total_ms };
    const int P = DFLASH_STATS_POSITIONS;
    for (int k = 0; k <= DFLASH_MAX_BLOCK; k++)
        out->commit_hist[k < P ? k : P] += st->accept_hist[k];
    for (int i = 0; i < DFLASH_MAX_BLOCK; i++) {
        out->drafted += st->pos_tried[i];
        out->accepted += st->pos_accepted[i];
        if (i < P) {
            out->pos_tried[i] = st->pos_tried[i];
            out->pos_accepted[i] = st->pos_accepted[i];
        }
    }
}
