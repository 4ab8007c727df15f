/* serve_sched.c: the scheduler thread of `dflash serve`. It alone touches
 * the engine and the tokenizer: it admits queued jobs as sessions free up
 * (encoding the prompt, checking it fits), steps every running session
 * together (continuous batching), turns each job's new tokens into text
 * (cut at a stop string, held back while the end could still become one
 * or is an unfinished UTF-8 character), and frees a session when its job
 * ends or its client leaves. See serve.h. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/args.h"
#include "cli/serve.h"
#include "core/status.h"

void serve_job_release(serve_job *j)
{
    if (--j->refs == 0)
        serve_job_free(j);
}

int serve_submit(serve_ctx *c, serve_job *j)
{
    pthread_mutex_lock(&c->mu);
    /* room: max_sessions generating plus max_queue waiting (a job passes
     * through the queue even when a session is free) */
    if (c->shutting_down || c->n_queued + c->n_running >= c->max_sessions + c->max_queue) {
        int status = c->shutting_down ? 503 : 429;
        c->m.req_rejected++;
        pthread_mutex_unlock(&c->mu);
        return status;
    }
    j->refs++; /* the scheduler's */
    j->state = JOB_QUEUED;
    j->next = NULL;
    if (c->queue_tail)
        c->queue_tail->next = j;
    else
        c->queue_head = j;
    c->queue_tail = j;
    c->n_queued++;
    pthread_cond_signal(&c->work);
    pthread_mutex_unlock(&c->mu);
    return 0;
}

/* ---- text: decoded ids, stop strings, what may be sent ---------------- */

/* Bytes at the end of s[0..n) that are not yet a whole character: an
 * unfinished UTF-8 sequence, or U+FFFD, which a byte-level decoder writes
 * for one (the next token may complete it). */
static size_t unfinished_tail(const char *s, size_t n)
{
    if (n >= 3 && (unsigned char)s[n - 3] == 0xef && (unsigned char)s[n - 2] == 0xbf &&
        (unsigned char)s[n - 1] == 0xbd)
        return 3;
    for (size_t k = 1; k <= 3 && k <= n; k++) {
        unsigned char b = (unsigned char)s[n - k];
        if ((b & 0xc0) != 0x80) { /* a lead byte (or ASCII): is its sequence complete? */
            size_t need = b >= 0xf0 ? 4 : b >= 0xe0 ? 3 : b >= 0xc0 ? 2 : 1;
            return need > k ? k : 0;
        }
    }
    return 0;
}

/* The longest k < len(stop) with the text ending in stop's first k bytes. */
static size_t stop_prefix_tail(const char *s, size_t n, const char *stop)
{
    size_t m = strlen(stop);
    for (size_t k = m - 1 < n ? m - 1 : n; k > 0; k--)
        if (memcmp(s + n - k, stop, k) == 0)
            return k;
    return 0;
}

/* After new ids: re-decode, cut at the first stop string, and set what
 * may be sent. Lock held. */
static void update_text(serve_ctx *c, serve_job *j)
{
    char *text = NULL;
    size_t len = 0;
    if (dflash_tokenizer_decode(c->tok, j->ids, j->n_ids, DFLASH_DECODE_SKIP_SPECIAL, &text, &len) != DFLASH_OK)
        return; /* keep the last good text */
    free(j->text);
    j->text = text;
    j->text_len = len;
    size_t cut = len;
    for (int i = 0; i < j->n_stop; i++) {
        const char *hit = memmem(text, len, j->stop[i], strlen(j->stop[i]));
        if (hit && (size_t)(hit - text) < cut)
            cut = (size_t)(hit - text);
    }
    if (cut < len) {
        j->text_len = cut;
        j->text[cut] = 0;
        j->stop_hit = 1;
        j->safe_len = cut;
        return;
    }
    size_t hold = unfinished_tail(text, len);
    for (int i = 0; i < j->n_stop; i++) {
        size_t k = stop_prefix_tail(text, len, j->stop[i]);
        if (k > hold)
            hold = k;
    }
    if (len - hold > j->safe_len)
        j->safe_len = len - hold;
}

const double serve_ttft_bounds[SERVE_TTFT_BUCKETS] = { 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60 };
const double serve_tpot_bounds[SERVE_TPOT_BUCKETS] = { 0.001, 0.0025, 0.005, 0.01, 0.025,
                                                        0.05,  0.1,    0.25,  0.5,  1 };

/* The histogram bucket of v: the first bound at or above it, else n (+Inf). */
static int bucket(const double *bounds, int n, double v)
{
    int b = 0;
    while (b < n && v > bounds[b])
        b++;
    return b;
}

/* The callback's context: the job and the server. */
typedef struct tok_ctx {
    serve_ctx *c;
    serve_job *j;
} tok_ctx;

/* The session's token callback (scheduler thread, inside a step or a
 * start): ids join the job, its text is brought up to date, waiting
 * connections wake. A non-OK return stops this session only. */
static dflash_status job_on_tokens(void *user, const int32_t *ids, int n)
{
    tok_ctx *t = user;
    serve_ctx *c = t->c;
    serve_job *j = t->j;
    pthread_mutex_lock(&c->mu);
    if (n > 0)
        j->t_last = cli_now_s();
    if (!j->t_first && n > 0) {
        j->t_first = j->t_last;
        const double ttft = j->t_first - j->t_arrive;
        c->m.ttft_hist[bucket(serve_ttft_bounds, SERVE_TTFT_BUCKETS, ttft)]++;
        c->m.ttft_sum += ttft;
        c->m.ttft_count++;
    }
    for (int i = 0; i < n && !j->stop_hit && !j->cancelled; i++) {
        if (j->n_ids == j->cap_ids) {
            size_t cap = j->cap_ids ? 2 * j->cap_ids : 64;
            int32_t *g = realloc(j->ids, cap * sizeof *g);
            if (!g)
                break;
            j->ids = g;
            j->cap_ids = cap;
        }
        j->ids[j->n_ids++] = ids[i];
        if (j->chat && ids[i] == c->end_of_turn) {
            j->stop_hit = 1; /* the end of the assistant's turn */
            break;
        }
        update_text(c, j);
    }
    const int stop = j->stop_hit || j->cancelled;
    pthread_cond_broadcast(&c->progress);
    pthread_mutex_unlock(&c->mu);
    return stop ? DFLASH_ERR_IO : DFLASH_OK;
}

/* ---- admission and the end of a job ---------------------------------- */

static void fail_job(serve_ctx *c, serve_job *j, int status, const char *msg)
{
    j->http_status = status;
    snprintf(j->error, sizeof j->error, "%s", msg);
    j->state = JOB_DONE;
    c->m.req_error++;
}

/* Lock held; the job holds a session on success. The lock is released
 * around the prompt's encoding and the session's start (its prompt runs
 * in the following engine steps, its tokens come through the callback). */
static void admit(serve_ctx *c, serve_job *j, tok_ctx *tc)
{
    if (j->cancelled) {
        j->state = JOB_DONE;
        c->m.req_cancelled++;
        return;
    }
    pthread_mutex_unlock(&c->mu);
    dflash_status s = DFLASH_OK;
    int status = 400;
    if (j->chat) {
        dflash_chat_opts co = dflash_chat_default_opts();
        co.format = c->chat_format;
        co.thinking = j->thinking;
        free(j->prompt_ids);
        j->prompt_ids = NULL;
        s = dflash_chat_encode(c->tok, j->msgs, j->n_msgs, &co, &j->prompt_ids, &j->n_prompt);
    } else if (j->prompt_text) {
        s = dflash_tokenizer_encode_special(c->tok, j->prompt_text, strlen(j->prompt_text), &j->prompt_ids,
                                           &j->n_prompt);
    }
    char msg[sizeof j->error] = "";
    if (s != DFLASH_OK) {
        snprintf(msg, sizeof msg, "the prompt could not be encoded: %s", dflash_last_error());
    } else if (j->n_prompt == 0) {
        snprintf(msg, sizeof msg, "the prompt encodes to no tokens");
    } else if ((long long)j->n_prompt + (j->max_tokens ? j->max_tokens : 1) > c->max_ctx) {
        if (j->max_tokens && (long long)j->n_prompt < c->max_ctx) { /* the prompt fits: max_tokens is too many */
            snprintf(msg, sizeof msg, "this server's context length is %d tokens and the prompt has %zu, so "
                     "max_tokens may be at most %lld, got %d", c->max_ctx, j->n_prompt,
                     (long long)c->max_ctx - (long long)j->n_prompt, j->max_tokens);
            j->error_param = "max_tokens";
        } else {
            snprintf(msg, sizeof msg, "this server's context length is %d tokens and the prompt has %zu, "
                     "leaving no room for a token to generate", c->max_ctx, j->n_prompt);
        }
    } else {
        j->so.max_tokens = j->max_tokens ? j->max_tokens : c->max_ctx - (int)j->n_prompt;
        tc->c = c;
        tc->j = j;
        j->so.on_tokens = job_on_tokens;
        j->so.user = tc;
        s = dflash_session_new(c->engine, &j->so, &j->session);
        if (s == DFLASH_OK)
            s = dflash_session_start_ids(j->session, j->prompt_ids, j->n_prompt);
        if (s != DFLASH_OK) {
            status = s == DFLASH_ERR_INVALID_ARG || s == DFLASH_ERR_KV_FULL ? 400 : 500;
            snprintf(msg, sizeof msg, "%s", dflash_last_error());
        }
    }
    pthread_mutex_lock(&c->mu);
    j->prompt_tokens = (int)j->n_prompt;
    if (msg[0]) {
        if (j->session)
            dflash_session_free(j->session);
        j->session = NULL;
        fail_job(c, j, status, msg);
        return;
    }
    j->state = JOB_RUNNING;
    c->m.prompt_tokens += j->n_prompt;
}

/* The job's generation is over (done, stopped, cancelled or failed):
 * final text and numbers, the session freed. Lock held. */
static void finish(serve_ctx *c, serve_job *j)
{
    dflash_session_stats st;
    dflash_session_stats_get(j->session, &st);
    j->steps = st.steps;
    j->mean_accept = st.mean_accept;
    j->finish = j->stop_hit || (int)j->n_ids < j->so.max_tokens ? "stop" : "length";
    j->safe_len = j->text_len;
    dflash_session_free(j->session);
    j->session = NULL;
    j->state = JOB_DONE;
    c->m.generated_tokens += j->n_ids;
    c->m.steps += (unsigned long long)st.steps;
    if (j->n_ids > 1) {
        const double tpot = (j->t_last - j->t_first) / (double)(j->n_ids - 1);
        c->m.tpot_hist[bucket(serve_tpot_bounds, SERVE_TPOT_BUCKETS, tpot)]++;
        c->m.tpot_sum += tpot;
        c->m.tpot_count++;
    }
    c->m.drafted += (unsigned long long)st.drafted;
    c->m.accepted += (unsigned long long)st.accepted;
    for (int k = 0; k <= DFLASH_STATS_POSITIONS; k++)
        c->m.commit_hist[k] += (unsigned long long)st.commit_hist[k];
    for (int i = 0; i < DFLASH_STATS_POSITIONS; i++) {
        c->m.pos_tried[i] += (unsigned long long)st.pos_tried[i];
        c->m.pos_accepted[i] += (unsigned long long)st.pos_accepted[i];
    }
    if (j->cancelled)
        c->m.req_cancelled++;
    else
        c->m.req_ok++;
}

static void *sched_main(void *arg)
{
    serve_ctx *c = arg;
    tok_ctx *tcs = calloc((size_t)c->max_sessions, sizeof *tcs);
    pthread_mutex_lock(&c->mu);
    for (;;) {
        /* admit while sessions are free */
        while (c->queue_head && c->n_running < c->max_sessions) {
            serve_job *j = c->queue_head;
            c->queue_head = j->next;
            if (!c->queue_head)
                c->queue_tail = NULL;
            c->n_queued--;
            int slot = 0;
            while (c->running[slot])
                slot++;
            c->running[slot] = j;
            c->n_running++;
            admit(c, j, &tcs[slot]);
            if (j->state == JOB_RUNNING && !dflash_session_running(j->session))
                finish(c, j); /* done by its first token */
            if (j->state == JOB_DONE) {
                c->running[slot] = NULL;
                c->n_running--;
                serve_job_release(j);
            }
            pthread_cond_broadcast(&c->progress);
        }
        if (c->n_running == 0) {
            if (c->shutting_down && !c->queue_head)
                break;
            pthread_cond_wait(&c->work, &c->mu);
            continue;
        }
        pthread_mutex_unlock(&c->mu);
        int active = 0;
        dflash_status s = dflash_engine_step(c->engine, &active);
        char msg[512];
        const char *join_msg = NULL;
        snprintf(msg, sizeof msg, "generation failed: %s", s == DFLASH_OK ? "" : dflash_last_error());
        pthread_mutex_lock(&c->mu);
        for (int i = 0; i < c->max_sessions; i++) {
            serve_job *j = c->running[i];
            if (!j)
                continue;
            if (s != DFLASH_OK) { /* every session left the batch */
                dflash_session_free(j->session);
                j->session = NULL;
                fail_job(c, j, 500, msg);
            } else if (!dflash_session_running(j->session) &&
                       dflash_session_error(j->session, &join_msg) != DFLASH_OK) {
                snprintf(msg, sizeof msg, "generation failed: %s", join_msg);
                dflash_session_free(j->session);
                j->session = NULL;
                fail_job(c, j, 503, msg);
            } else if (!dflash_session_running(j->session) || j->stop_hit || j->cancelled) {
                finish(c, j);
            } else {
                continue;
            }
            c->running[i] = NULL;
            c->n_running--;
            serve_job_release(j);
        }
        dflash_engine_kv_usage(c->engine, &c->m.kv_pages, &c->m.kv_reserved, &c->m.kv_waiting);
        pthread_cond_broadcast(&c->progress);
    }
    pthread_mutex_unlock(&c->mu);
    free(tcs);
    return NULL;
}

dflash_status serve_sched_start(serve_ctx *c)
{
    c->running = calloc((size_t)c->max_sessions, sizeof *c->running);
    if (!c->running)
        return dflash_fail(DFLASH_ERR_OOM, "serve: out of memory");
    if (pthread_create(&c->sched, NULL, sched_main, c) != 0)
        return dflash_fail(DFLASH_ERR_BACKEND, "serve: could not start the scheduler thread");
    return DFLASH_OK;
}

void serve_sched_stop(serve_ctx *c)
{
    pthread_mutex_lock(&c->mu);
    c->shutting_down = 1;
    pthread_cond_broadcast(&c->work);
    pthread_mutex_unlock(&c->mu);
    pthread_join(c->sched, NULL);
    free(c->running);
    c->running = NULL;
}
