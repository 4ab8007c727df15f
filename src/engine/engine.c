/* engine.c: the public engine and session API of include/dflash.h, on the
 * batched loop (dflash_spec_batch in spec/spec.h). The engine owns the
 * backend, the target and its KV page pool, the proposer, the tokenizer
 * (when the model folder has one) and the end-of-sequence ids; a session
 * owns its target sequence, its proposer state and what it has generated,
 * and carries what its cache holds from one start to the next so a later
 * start continues it.
 *
 * KV admission. A start reserves the pages its sequence can reach (what
 * the cache holds, the prompt, max_tokens and one block past them): a
 * session that runs never runs out of pages, and never takes any from
 * another. A start that does not fit waits in a queue (oldest first) and
 * joins at a later dflash_engine_step, once sessions that finished or
 * were freed left room. A finished session keeps its cache for its next
 * start while nobody waits; when someone does, idle caches are given up,
 * least recently used first, and such a session's next start runs its
 * whole history through the target again (the same tokens: results do not
 * depend on how rows are grouped). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

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
    int kv_pages, reserved;       /* the target's pool, and the pages sessions have reserved or hold */
    dflash_session **all;         /* [max_sessions]: every session */
    dflash_session **queue;       /* [max_sessions]: started sessions waiting for pages, oldest first */
    int n_queue;
    long clock;                   /* steps and starts, for least-recently-used order */
};

struct dflash_session {
    dflash_engine *e;
    dflash_session_opts o;
    /* what ends its generation: the model's ids (unless ignore_eos), then its own */
    int32_t stops[ENGINE_MAX_STOP + DFLASH_MAX_STOP_IDS];
    int n_stops;
    /* its stop strings (copies), the longest one's bytes, and whether one
     * ended the current start */
    char stop_str[DFLASH_MAX_STOP_STRINGS][DFLASH_MAX_STOP_LEN + 1];
    int n_stop_str, stop_max, stop_hit;
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
    /* pages: reserved while it runs or waits to (need: what the waiting
     * start reserves), else held by its cache; in_batch: admitted and not
     * yet seen to leave; evicted: the cache was given up (or a start
     * failed), `held` is the whole history and the next start runs it
     * again; hist_in_prompt: ids of `held` this start's prompt begins with
     * (a start after an eviction), which absorbing it must not repeat */
    int pages, need, waiting, in_batch, evicted;
    size_t hist_in_prompt;
    int reset_pending; /* the proposer's reset failed (out of memory): the next start retries it */
    long used;
    /* a start that stopped before generating (it could not join, or its
     * prefill failed): why (dflash_session_error) */
    dflash_status join_status;
    char join_error[256];
};

void dflash_engine_default_opts(dflash_engine_opts *o)
{
    memset(o, 0, sizeof *o);
    o->device = "cpu";
    o->max_sessions = 8;
    o->max_ctx = 4096;
    o->ctx_cap = -1;
    o->drafter_fp8 = -1;
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
    DFLASH_TRY(dflash_open_backend(o->device, "device cuda: ", &e->be));
    dflash_model_config cfg;
    DFLASH_TRY(dflash_config_load(o->model_dir, &cfg));
    int block = DFLASH_MAX_BLOCK; /* KV room for the widest step a drafter may take */
    dflash_qwen3_opts to;
    dflash_qwen3_default_opts(&to);
    const int model_ctx = cfg.max_position_embeddings > 0 ? cfg.max_position_embeddings : o->max_ctx;
    e->max_ctx = o->max_ctx < model_ctx || o->long_context ? o->max_ctx : model_ctx;
    to.max_ctx = e->max_ctx + block;
    to.max_seqs = o->max_sessions;
    /* a step of every session in one forward (a drafter folder that
     * cannot be read here is reported when the proposer loads) */
    int per, own;
    if (dflash_open_block(o->draft, o->block_size, &per, &own) != DFLASH_OK)
        per = 16;
    to.max_rows = dflash_open_target_rows(o->max_sessions, per);
    to.kv_pages = o->kv_pages;
    DFLASH_TRY(dflash_qwen3_load(o->model_dir, e->be, &to, &e->target));
    /* -1: the proposer asks DFLASH_DRAFTER_FP8 */
    const int quant = o->drafter_fp8 < 0 ? -1 : o->drafter_fp8 ? DFLASH_QUANT_FP8_WEIGHTS : DFLASH_QUANT_BF16;
    if (o->draft)
        DFLASH_TRY(dflash_open_proposer(o->draft, e->target, o->block_size, o->ctx_cap, quant, &e->prop));
    /* text in and out, and the tokenizer's end-of-sequence ids, when the
     * folder has a tokenizer; ids alone work without one */
    if (dflash_tokenizer_load(o->model_dir, &e->tok) != DFLASH_OK)
        e->tok = NULL;
    /* a folder whose tokenizer files name no end of sequence still has
     * the config's ids */
    (void)dflash_open_stop_ids(e->target, o->model_dir, e->tok, e->stop_ids, ENGINE_MAX_STOP, &e->n_stop);
    e->max_sessions = o->max_sessions;
    e->kv_pages = e->target->kv.layout.n_pages;
    e->all = calloc((size_t)o->max_sessions, sizeof *e->all);
    e->queue = calloc((size_t)o->max_sessions, sizeof *e->queue);
    if (!e->all || !e->queue)
        return dflash_fail(DFLASH_ERR_OOM, "engine: out of memory for %d sessions", o->max_sessions);
    DFLASH_TRY(dflash_spec_batch_new(e->target, e->prop, o->block_size, o->max_sessions, &e->batch));
    dflash_spec_batch_set_width_auto(e->batch, o->width_auto);
    return DFLASH_OK;
}

dflash_status dflash_engine_open(const dflash_engine_opts *o, dflash_engine **out)
{
    *out = NULL;
    if (!o || !o->model_dir)
        return dflash_fail(DFLASH_ERR_INVALID_ARG, "engine: no model_dir given");
    if (o->max_sessions <= 0 || o->max_ctx <= 0 || o->block_size < 0 || o->kv_pages < 0 || o->ctx_cap < -1)
        return dflash_fail(DFLASH_ERR_INVALID_ARG,
                           "engine: max_sessions %d, max_ctx %d, block_size %d, kv_pages %d, ctx_cap %d (want > 0, > 0, "
                           ">= 0, >= 0, >= -1)",
                           o->max_sessions, o->max_ctx, o->block_size, o->kv_pages, o->ctx_cap);
    if (o->drafter_fp8 < -1 || o->drafter_fp8 > 1)
        return dflash_fail(DFLASH_ERR_INVALID_ARG, "engine: drafter_fp8 %d (want -1, 0 or 1)", o->drafter_fp8);
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
    free(e->all);
    free(e->queue);
    free(e);
}

/* The loop's sampler options from a session's. */
static dflash_sampler_opts session_sampler(const dflash_session_opts *o)
{
    return (dflash_sampler_opts){ .temperature = o->temperature, .top_k = o->top_k, .top_p = o->top_p,
                                  .min_p = o->min_p, .rep_penalty = o->rep_penalty,
                                  .frequency_penalty = o->frequency_penalty, .presence_penalty = o->presence_penalty,
                                  .seed = o->seed };
}

/* The first place in text[0..len) where one of the session's stop strings
 * begins, or NULL. */
static const char *first_stop(const dflash_session *s, const char *text, size_t len)
{
    const char *best = NULL;
    for (int i = 0; i < s->n_stop_str; i++) {
        const char *hit = memmem(text, len, s->stop_str[i], strlen(s->stop_str[i]));
        if (hit && (!best || hit < best))
            best = hit;
    }
    return best;
}

/* A token that adds bytes to the decoded text (not special, and an id the
 * tokenizer has: the model's vocabulary may be larger than its). */
static int adds_text(const dflash_tokenizer *tok, int32_t id)
{
    return dflash_tokenizer_has_id(tok, id) && !dflash_tokenizer_is_special(tok, id);
}

/* Does the text of out[0..n_out) ++ cand[0..n) hold a stop string near
 * its end? Decodes the tail from the token that leaves, before the last
 * token, at least as many tokens that add text (a byte or more each) as
 * the longest stop string has bytes, plus 4 for a split UTF-8 character
 * at the start (it decodes to U+FFFD, which no stop string holds), so
 * every occurrence that ends in the last token is seen; an earlier one
 * would have stopped the session already. */
static int tail_has_stop(dflash_session *s, const int32_t *out, int n_out, const int32_t *cand, int n)
{
    const dflash_tokenizer *tok = s->e->tok;
    const int total = n_out + n;
    int first = total - 1, counted = 0; /* the window is [first, total) */
    while (first > 0 && counted < s->stop_max + 4) {
        first--;
        counted += adds_text(tok, first < n_out ? out[first] : cand[first - n_out]);
    }
    /* the window fits on the stack unless special tokens crowd it */
    int32_t local[2 * DFLASH_MAX_STOP_LEN], *ids = local;
    if (total - first > (int)(sizeof local / sizeof *local) && !(ids = malloc((size_t)(total - first) * sizeof *ids)))
        return 0; /* out of memory: this token is not checked (the next one finds the stop, one token late) */
    int take = 0;
    for (int k = first; k < total; k++) {
        const int32_t id = k < n_out ? out[k] : cand[k - n_out];
        if (dflash_tokenizer_has_id(tok, id))
            ids[take++] = id;
    }
    char *text = NULL;
    size_t len = 0;
    const dflash_status st = dflash_tokenizer_decode(tok, ids, (size_t)take, DFLASH_DECODE_SKIP_SPECIAL, &text, &len);
    if (ids != local)
        free(ids);
    const int hit = st == DFLASH_OK && first_stop(s, text, len) != NULL;
    free(text);
    return hit;
}

/* A stop string must be valid UTF-8 without U+FFFD: the decoded text
 * holds no other kind of bytes, and U+FFFD stands for bytes cut apart. */
static int stop_string_ok(const char *str)
{
    const size_t n = strlen(str);
    for (size_t i = 0; i < n;) {
        utf8proc_int32_t cp;
        const utf8proc_ssize_t r = utf8proc_iterate((const utf8proc_uint8_t *)str + i, (utf8proc_ssize_t)(n - i), &cp);
        if (r <= 0 || cp == 0xFFFD)
            return 0;
        i += (size_t)r;
    }
    return 1;
}

/* dflash_gen_opts.stop_text: the first candidate that completes a stop
 * string (1-based), else 0; remembered for dflash_session_text. */
static int session_stop_text(void *user, const int32_t *out, int n_out, const int32_t *cand, int n)
{
    dflash_session *s = user;
    for (int j = 1; j <= n; j++)
        if (tail_has_stop(s, out, n_out, cand, j)) {
            s->stop_hit = 1;
            return j;
        }
    return 0;
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
    if (o->n_stop_ids < 0 || o->n_stop_ids > DFLASH_MAX_STOP_IDS || (o->n_stop_ids && !o->stop_ids))
        return dflash_fail(DFLASH_ERR_INVALID_ARG, "session: %d stop ids (at most %d)", o->n_stop_ids,
                           DFLASH_MAX_STOP_IDS);
    for (int i = 0; i < o->n_stop_ids; i++)
        if (o->stop_ids[i] < 0 || o->stop_ids[i] >= e->target->cfg.vocab_size)
            return dflash_fail(DFLASH_ERR_INVALID_ARG, "session: stop id %d at %d is not a token of the model (0..%d)",
                               o->stop_ids[i], i, e->target->cfg.vocab_size - 1);
    if (o->n_stop_strings < 0 || o->n_stop_strings > DFLASH_MAX_STOP_STRINGS)
        return dflash_fail(DFLASH_ERR_INVALID_ARG, "session: %d stop strings (at most %d)", o->n_stop_strings,
                           DFLASH_MAX_STOP_STRINGS);
    if (o->n_stop_strings && !o->stop_strings)
        return dflash_fail(DFLASH_ERR_INVALID_ARG, "session: n_stop_strings is %d but stop_strings is NULL",
                           o->n_stop_strings);
    for (int i = 0; i < o->n_stop_strings; i++) {
        const size_t len = o->stop_strings[i] ? strlen(o->stop_strings[i]) : 0;
        if (len == 0 || len > DFLASH_MAX_STOP_LEN)
            return dflash_fail(DFLASH_ERR_INVALID_ARG, "session: stop string %d is %s (1 to %d bytes)", i,
                               !o->stop_strings[i] ? "NULL" : len ? "too long" : "empty", DFLASH_MAX_STOP_LEN);
        if (!stop_string_ok(o->stop_strings[i]))
            return dflash_fail(DFLASH_ERR_INVALID_ARG,
                               "session: stop string %d is not valid UTF-8 or holds U+FFFD (output text never does "
                               "except for bytes cut apart)", i);
    }
    if (o->n_stop_strings && !e->tok)
        return dflash_fail(DFLASH_ERR_INVALID_ARG,
                           "session: stop strings need the text of the output, and the engine's model folder has "
                           "no tokenizer.json");
    dflash_session *s = calloc(1, sizeof *s);
    if (!s || !(s->out = malloc(((size_t)o->max_tokens + 1) * sizeof *s->out))) {
        free(s);
        return dflash_fail(DFLASH_ERR_OOM, "session: out of memory for %d output ids", o->max_tokens);
    }
    s->e = e;
    s->o = *o;
    if (!o->ignore_eos)
        for (int i = 0; i < e->n_stop; i++)
            s->stops[s->n_stops++] = e->stop_ids[i];
    for (int i = 0; i < o->n_stop_ids; i++)
        s->stops[s->n_stops++] = o->stop_ids[i];
    for (int i = 0; i < o->n_stop_strings; i++) {
        snprintf(s->stop_str[i], sizeof s->stop_str[i], "%s", o->stop_strings[i]);
        const int len = (int)strlen(s->stop_str[i]);
        s->stop_max = len > s->stop_max ? len : s->stop_max;
    }
    s->n_stop_str = o->n_stop_strings;
    s->o.stop_ids = NULL; /* copied above: the caller's arrays need not outlive the call */
    s->o.stop_strings = NULL;
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
    for (int i = 0; i < e->max_sessions; i++)
        if (!e->all[i]) {
            e->all[i] = s;
            break;
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
    dflash_spec_batch_drop(e->batch, &s->item); /* nothing when it is not generating; its caches go next */
    for (int i = 0; i < e->n_queue; i++)
        if (e->queue[i] == s) {
            memmove(e->queue + i, e->queue + i + 1, (size_t)(e->n_queue - i - 1) * sizeof *e->queue);
            e->n_queue--;
            break;
        }
    for (int i = 0; i < e->max_sessions; i++)
        if (e->all[i] == s)
            e->all[i] = NULL;
    e->reserved -= s->pages;
    if (s->pstate)
        e->prop->ops->free_state(e->prop, s->pstate);
    dflash_qwen3_seq_free(e->target, &s->seq);
    e->n_sessions--;
    free(s->prompt);
    free(s->out);
    dflash_idbuf_free(&s->held);
    free(s);
}

/* What the last start left in the cache joins the history (once, even if
 * the next start fails and is retried); its final token, emitted but never
 * run, opens the next prompt. */
static dflash_status absorb(dflash_session *s)
{
    if (!s->started || s->absorbed)
        return DFLASH_OK;
    DFLASH_TRY(dflash_idbuf_push(&s->held, s->item.prompt + s->hist_in_prompt,
                                 (size_t)s->item.n_prompt - s->hist_in_prompt, "session"));
    s->carry = s->item.n_out > 0;
    if (s->carry) {
        DFLASH_TRY(dflash_idbuf_push(&s->held, s->out, (size_t)s->item.n_out - 1, "session"));
        s->carry_tok = s->out[s->item.n_out - 1];
    }
    s->absorbed = 1;
    return DFLASH_OK;
}

/* Pages a sequence needs to reach `end` positions (its table's length at
 * most: the context limit is checked elsewhere). */
static int pages_for(const dflash_engine *e, int64_t end)
{
    const int64_t p = (end + DFLASH_KV_PAGE - 1) / DFLASH_KV_PAGE;
    return p < e->target->pt_len ? (int)p : e->target->pt_len;
}

/* Drop the session's caches (target and proposer): `held` must be its
 * whole history, which its next start runs again. The target's pages
 * return even when the proposer's reset fails, so both start over. */
static dflash_status drop_cache(dflash_session *s)
{
    dflash_engine *e = s->e;
    dflash_kv_seq_release(&e->target->kv, &s->seq);
    e->reserved -= s->pages;
    s->pages = 0;
    s->evicted = 1;
    dflash_status st = s->pstate ? e->prop->ops->reset(e->prop, s->pstate) : DFLASH_OK;
    s->reset_pending = st != DFLASH_OK;
    return st;
}

/* Give up an idle session's cache: what it holds joins `held` first. */
static dflash_status evict(dflash_session *s)
{
    DFLASH_TRY(absorb(s));
    return drop_cache(s);
}

/* A session other than `s` whose cache could be given up: not running,
 * not waiting, holding pages. */
static int holds_idle_cache(const dflash_session *o, const dflash_session *s)
{
    return o && o != s && !o->in_batch && !o->waiting && o->pages > 0;
}

/* Evict idle caches, least recently used first, until `s` fits with
 * `need` pages; none when even all of them would not make room (the
 * start waits for running sessions instead, and idle ones keep their
 * caches meanwhile). */
static dflash_status evict_until_fits(dflash_engine *e, const dflash_session *s, int need)
{
    int idle = 0;
    for (int i = 0; i < e->max_sessions; i++)
        if (holds_idle_cache(e->all[i], s))
            idle += e->all[i]->pages;
    if (e->reserved - s->pages + need - idle > e->kv_pages)
        return DFLASH_OK;
    while (e->reserved - s->pages + need > e->kv_pages) {
        dflash_session *lru = NULL;
        for (int i = 0; i < e->max_sessions; i++)
            if (holds_idle_cache(e->all[i], s) && (!lru || e->all[i]->used < lru->used))
                lru = e->all[i];
        if (!lru)
            return DFLASH_OK;
        DFLASH_TRY(evict(lru));
    }
    return DFLASH_OK;
}

/* The session's prepared start joins the batch (its prompt runs in the
 * next steps) with its reservation; on failure it is as it was before the
 * start. */
static dflash_status admit(dflash_session *s)
{
    dflash_engine *e = s->e;
    s->waiting = 0;
    DFLASH_TRY(dflash_spec_batch_add(e->batch, &s->item));
    e->reserved += s->need - s->pages;
    s->pages = s->need;
    s->in_batch = 1;
    s->used = ++e->clock;
    s->started = 1;
    s->absorbed = 0;
    s->hist_in_prompt = s->evicted ? s->held.n : 0; /* the prompt carries the whole history */
    s->evicted = 0;
    return DFLASH_OK;
}

/* Sessions that left the batch keep only the pages their caches hold. One
 * that left through a failure (its prompt failed, or the step did) may
 * hold part of a prompt or rows of the failed step: its caches are
 * dropped, and `held` keeps what is known to be right, the history before
 * this start plus, if it generated, this start's prompt and tokens; its
 * next start runs that again. */
static void settle(dflash_engine *e, dflash_status step)
{
    for (int i = 0; i < e->max_sessions; i++) {
        dflash_session *s = e->all[i];
        if (!s || !s->in_batch || dflash_spec_batch_has(e->batch, &s->item))
            continue;
        s->in_batch = 0;
        e->reserved -= s->pages;
        s->pages = dflash_kv_seq_pages(&s->seq);
        e->reserved += s->pages;
        s->used = ++e->clock;
        if (s->item.status == DFLASH_OK && step == DFLASH_OK)
            continue;
        s->join_status = s->item.status != DFLASH_OK ? s->item.status : step;
        snprintf(s->join_error, sizeof s->join_error, "%s",
                 s->item.status != DFLASH_OK ? s->item.error : "the engine step it took part in failed");
        if (s->item.n_out == 0 || absorb(s) != DFLASH_OK)
            s->absorbed = 1; /* nothing of this start joins `held` */
        (void)drop_cache(s); /* a failed proposer reset is retried by the next start */
    }
}

dflash_status dflash_session_start_ids(dflash_session *s, const int32_t *ids, size_t n)
{
    if (!s || (!ids && n))
        return dflash_fail(DFLASH_ERR_INVALID_ARG, "session: no session or ids");
    if (dflash_session_running(s))
        return dflash_fail(DFLASH_ERR_INVALID_ARG, "session: still generating; start it again once it is done");
    dflash_engine *e = s->e;
    const int V = e->target->cfg.vocab_size;
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= V)
            return dflash_fail(DFLASH_ERR_INVALID_ARG, "session: id %d at %zu is not a token of the model (0..%d)",
                               ids[i], i, V - 1);
    if (s->reset_pending) {
        DFLASH_TRY(e->prop->ops->reset(e->prop, s->pstate));
        s->reset_pending = 0;
    }
    DFLASH_TRY(absorb(s));
    s->join_status = DFLASH_OK;
    const int carry = s->carry;
    if (n + (size_t)carry == 0)
        return dflash_fail(DFLASH_ERR_INVALID_ARG, "session: an empty prompt");
    /* after an eviction the prompt is the whole history again */
    const size_t n_hist = s->evicted ? s->held.n : 0;
    int32_t *p = malloc((n_hist + n + 1) * sizeof *p);
    if (!p)
        return dflash_fail(DFLASH_ERR_OOM, "session: out of memory for %zu ids", n_hist + n + 1);
    if (n_hist)
        memcpy(p, s->held.ids, n_hist * sizeof *p);
    if (carry)
        p[n_hist] = s->carry_tok;
    memcpy(p + n_hist + carry, ids, n * sizeof *ids);
    free(s->prompt);
    s->prompt = p;
    dflash_spec_item *it = &s->item;
    memset(it, 0, sizeof *it);
    it->seq = &s->seq;
    it->pstate = s->pstate;
    it->prompt = p;
    it->n_prompt = (int)(n_hist + n) + carry;
    it->out = s->out;
    dflash_gen_default_opts(&it->opts);
    it->opts.n_new = s->o.max_tokens;
    it->opts.sampler = session_sampler(&s->o);
    it->opts.stop_ids = s->stops;
    it->opts.n_stop = s->n_stops;
    it->opts.history = n_hist ? NULL : s->held.ids;
    it->opts.n_history = n_hist ? 0 : (int)s->held.n;
    it->opts.on_tokens = s->o.on_tokens;
    it->opts.user = s->o.user;
    it->opts.on_step = s->o.on_step;
    it->opts.step_user = s->o.step_user;
    s->stop_hit = 0;
    if (s->n_stop_str) {
        it->opts.stop_text = session_stop_text;
        it->opts.stop_user = s;
    }
    DFLASH_TRY(dflash_spec_batch_check(e->batch, it));
    s->need = pages_for(e, (int64_t)s->seq.len + it->n_prompt + it->opts.n_new + dflash_spec_batch_block(e->batch));
    if (s->need > e->kv_pages)
        return dflash_fail(DFLASH_ERR_KV_FULL,
                           "session: %d cached + %d prompt + %d new tokens need %d KV pages of %d positions; the "
                           "engine has %d (kv_pages)",
                           s->seq.len, it->n_prompt, it->opts.n_new, s->need, DFLASH_KV_PAGE, e->kv_pages);
    if (e->n_queue == 0) {
        DFLASH_TRY(evict_until_fits(e, s, s->need));
        if (e->reserved - s->pages + s->need <= e->kv_pages)
            return admit(s);
    }
    s->waiting = 1; /* joins at a later step, after the ones queued before it */
    e->queue[e->n_queue++] = s;
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

int dflash_engine_vocab_size(const dflash_engine *e)
{
    return e->target->cfg.vocab_size;
}

int dflash_engine_block_size(const dflash_engine *e)
{
    return dflash_spec_batch_block(e->batch);
}

void dflash_engine_kv_usage(const dflash_engine *e, int *pages, int *reserved, int *waiting)
{
    *pages = e->kv_pages;
    *reserved = e->reserved;
    *waiting = e->n_queue;
}

/* A waiting start that cannot join leaves the queue with its reason. */
static void join_failed(dflash_session *s, dflash_status st)
{
    s->waiting = 0;
    s->join_status = st;
    snprintf(s->join_error, sizeof s->join_error, "%s", dflash_last_error());
}

/* Waiting sessions join, oldest first, while they fit (idle caches given
 * up for them). A start that fails to join is that session's failure
 * (dflash_session_error); the others go on. */
static void admit_waiting(dflash_engine *e)
{
    while (e->n_queue > 0) {
        dflash_session *h = e->queue[0];
        dflash_status st = evict_until_fits(e, h, h->need);
        if (st == DFLASH_OK && e->reserved - h->pages + h->need > e->kv_pages) {
            int running = 0;
            for (int i = 0; i < e->max_sessions; i++)
                running += e->all[i] && e->all[i]->in_batch;
            if (running)
                return; /* room comes as they finish */
            /* nothing will free pages: the rest is held by sessions
             * waiting behind it, whose caches stay for their starts */
            st = dflash_fail(DFLASH_ERR_KV_FULL,
                             "session: its start needs %d KV pages and %d of the engine's %d are held by the caches of "
                             "sessions waiting behind it; free some sessions (dflash_session_free)",
                             h->need, e->reserved - h->pages, e->kv_pages);
        }
        memmove(e->queue, e->queue + 1, (size_t)(--e->n_queue) * sizeof *e->queue);
        if (st == DFLASH_OK)
            st = admit(h);
        if (st != DFLASH_OK)
            join_failed(h, st);
    }
}

dflash_status dflash_engine_step(dflash_engine *e, int *n_active)
{
    *n_active = 0;
    if (!e)
        return dflash_fail(DFLASH_ERR_INVALID_ARG, "engine step: no engine");
    settle(e, DFLASH_OK);
    admit_waiting(e);
    int running = 0;
    dflash_status s = dflash_spec_batch_step(e->batch, &running);
    settle(e, s);
    *n_active = running + e->n_queue;
    return s;
}

dflash_status dflash_session_error(const dflash_session *s, const char **message)
{
    *message = s->join_status == DFLASH_OK ? "" : s->join_error;
    return s->join_status;
}

int dflash_session_running(const dflash_session *s)
{
    return s && (s->waiting || (s->started && dflash_spec_batch_has(s->e->batch, &s->item)));
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
    DFLASH_TRY(dflash_tokenizer_decode(s->e->tok, s->out, s->started ? (size_t)s->item.n_out : 0,
                                       DFLASH_DECODE_SKIP_SPECIAL, text, &len));
    if (s->stop_hit) {
        const char *cut = first_stop(s, *text, len);
        if (cut)
            (*text)[cut - *text] = 0;
    }
    return DFLASH_OK;
}

void dflash_session_stats_get(const dflash_session *s, dflash_session_stats *out)
{
    const dflash_gen_stats *st = &s->item.stats;
    *out = (dflash_session_stats){ .prompt_tokens = st->n_prompt, .generated_tokens = s->item.n_out,
                                   .steps = st->n_steps, .mean_accept = st->mean_accept,
                                   .total_ms = st->total_ms, .prefill_ms = st->prefill_ms,
                                   .draft_ms = st->draft_ms, .verify_ms = st->verify_ms,
                                   .observe_ms = st->observe_ms, .tokens_per_s = st->tokens_per_s,
                                   .stopped = st->stopped };
    _Static_assert(DFLASH_STATS_POSITIONS == DFLASH_MAX_BLOCK, "the public counts cover every block");
    for (int k = 0; k <= DFLASH_MAX_BLOCK; k++)
        out->commit_hist[k] = st->accept_hist[k];
    for (int i = 0; i < DFLASH_MAX_BLOCK; i++) {
        out->width_hist[i] = st->width_hist[i];
        out->pos_tried[i] = st->pos_tried[i];
        out->pos_accepted[i] = st->pos_accepted[i];
        out->drafted += st->pos_tried[i];
        out->accepted += st->pos_accepted[i];
    }
}
