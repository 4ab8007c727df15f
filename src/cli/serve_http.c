/* serve_http.c: the HTTP side of `dflash serve` on libmicrohttpd, one thread
 * per connection: routing, the API key, body limits, OpenAI error objects,
 * waiting on a job (and noticing a client that left), Server-Sent Events
 * for streams, and the Prometheus text of /metrics. See serve.h. */
#include <microhttpd.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "cli/args.h"
#include "cli/serve.h"
#include "core/status.h"

struct serve_http {
    struct MHD_Daemon *d;
    serve_ctx *c;
};

/* One request: its body as it arrives. */
typedef struct req {
    char *body;
    size_t len, cap;
    int too_large;
} req;

/* text (freed here); allow: the methods an Allow header names, or NULL */
static enum MHD_Result send_text_allow(struct MHD_Connection *conn, unsigned status, const char *type, char *text,
                                       const char *allow)
{
    if (!text)
        return MHD_NO;
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(text), text, MHD_RESPMEM_MUST_FREE);
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    if (allow)
        MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, allow);
    enum MHD_Result ret = MHD_queue_response(conn, status, r);
    MHD_destroy_response(r);
    return ret;
}

static enum MHD_Result send_text(struct MHD_Connection *conn, unsigned status, const char *type, char *text)
{
    return send_text_allow(conn, status, type, text, NULL);
}

static enum MHD_Result send_error_allow(struct MHD_Connection *conn, unsigned status, const char *msg,
                                        const char *param, const char *allow)
{
    const char *type = status == 401 ? "authentication_error"
                       : status == 404 ? "not_found_error"
                       : status == 429 || status == 503 ? "server_overloaded"
                       : status >= 500 ? "server_error" : "invalid_request_error";
    return send_text_allow(conn, status, "application/json", serve_error_json(msg, type, param, NULL), allow);
}

static enum MHD_Result send_error(struct MHD_Connection *conn, unsigned status, const char *msg, const char *param)
{
    return send_error_allow(conn, status, msg, param, NULL);
}

/* Did the client close its end? (Nothing to read and EOF.) */
static int client_gone(struct MHD_Connection *conn)
{
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci)
        return 0;
    char b;
    return recv(ci->connect_fd, &b, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
}

/* Wait (lock held) until the job leaves `state`, waking every 200 ms to
 * look for a client that left; 0 when it did (the job is then cancelled). */
static int wait_past(serve_ctx *c, serve_job *j, serve_state state, struct MHD_Connection *conn)
{
    while (j->state == state) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 200000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&c->progress, &c->mu, &ts);
        if (j->state == state && client_gone(conn)) {
            j->cancelled = 1;
            pthread_cond_signal(&c->work);
            return 0;
        }
    }
    return 1;
}

/* ---- streaming ---------------------------------------------------------- */

typedef struct stream {
    serve_ctx *c;
    serve_job *j;
    size_t sent;          /* bytes of the job's text sent */
    int role_sent, final_sent, usage_sent, done_sent;
    char *pending;        /* an event not yet fully handed to MHD */
    size_t pend_len, pend_off;
} stream;

/* The next event of the stream (lock held), or NULL at its end. Blocks
 * until there is one; after a second with nothing, a comment line, whose
 * write tells a client that left from one that waits. */
static char *next_event(stream *s)
{
    serve_ctx *c = s->c;
    serve_job *j = s->j;
    for (;;) {
        if (j->chat && !s->role_sent) {
            s->role_sent = 1;
            return serve_chunk_sse(c, j, NULL, 0, 0, 0);
        }
        if (j->safe_len > s->sent) {
            char *e = serve_chunk_sse(c, j, j->text + s->sent, j->safe_len - s->sent, 0, 0);
            s->sent = j->safe_len;
            return e;
        }
        if (j->state == JOB_DONE) {
            if (j->http_status && !s->final_sent) { /* failed after the stream began */
                s->final_sent = s->usage_sent = 1;
                char *err = serve_error_json(j->error, "server_error", NULL, NULL);
                char *e = err ? malloc(strlen(err) + 9) : NULL;
                if (e)
                    snprintf(e, strlen(err) + 9, "data: %s\n\n", err);
                free(err);
                return e;
            }
            if (!s->final_sent) {
                s->final_sent = 1;
                return serve_chunk_sse(c, j, NULL, 0, 1, 0);
            }
            if (j->include_usage && !s->usage_sent) {
                s->usage_sent = 1;
                return serve_chunk_sse(c, j, NULL, 0, 0, 1);
            }
            if (!s->done_sent) {
                s->done_sent = 1;
                return strdup("data: [DONE]\n\n");
            }
            return NULL;
        }
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_sec += 1;
        if (pthread_cond_timedwait(&c->progress, &c->mu, &ts) != 0 && j->state != JOB_DONE &&
            j->safe_len == s->sent)
            return strdup(": waiting\n\n");
    }
}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    (void)pos;
    stream *s = cls;
    if (s->pend_off == s->pend_len) {
        free(s->pending);
        pthread_mutex_lock(&s->c->mu);
        s->pending = next_event(s);
        pthread_mutex_unlock(&s->c->mu);
        if (!s->pending)
            return MHD_CONTENT_READER_END_OF_STREAM;
        s->pend_len = strlen(s->pending);
        s->pend_off = 0;
    }
    size_t n = s->pend_len - s->pend_off < max ? s->pend_len - s->pend_off : max;
    memcpy(buf, s->pending + s->pend_off, n);
    s->pend_off += n;
    return (ssize_t)n;
}

/* The stream is over, or its client left: a job still running is
 * cancelled (its session and pages are freed after the current step). */
static void stream_free(void *cls)
{
    stream *s = cls;
    pthread_mutex_lock(&s->c->mu);
    if (s->j->state != JOB_DONE) {
        s->j->cancelled = 1;
        pthread_cond_signal(&s->c->work);
    }
    serve_job_release(s->j);
    pthread_mutex_unlock(&s->c->mu);
    free(s->pending);
    free(s);
}

/* ---- the generation endpoints ------------------------------------------ */

static enum MHD_Result generate(serve_ctx *c, struct MHD_Connection *conn, int chat, const req *rq)
{
    char err[600];
    const char *param = NULL;
    serve_job *j = serve_job_from_json(c, chat, rq->body ? rq->body : "", rq->len, err, sizeof err, &param);
    if (!j) {
        pthread_mutex_lock(&c->mu);
        c->m.req_error++;
        pthread_mutex_unlock(&c->mu);
        return send_error(conn, param && !strcmp(param, "model") ? 404 : 400, err, param);
    }
    static unsigned long long counter;
    snprintf(j->id, sizeof j->id, "%s-%llx%llx", chat ? "chatcmpl" : "cmpl", (unsigned long long)time(NULL),
             __atomic_add_fetch(&counter, 1, __ATOMIC_RELAXED));
    j->created = (long long)time(NULL);
    j->t_arrive = cli_now_s();
    if (chat && !c->chat_ok) {
        serve_job_free(j);
        return send_error(conn, 400, c->chat_err, "messages");
    }
    const int status = serve_submit(c, j);
    if (status) {
        serve_job_free(j);
        return send_error(conn, status, status == 429 ? "the request queue is full; retry later"
                                                      : "the server is shutting down", NULL);
    }
    pthread_mutex_lock(&c->mu);
    /* the stream's headers go out once the job has a session (or failed) */
    if (!wait_past(c, j, JOB_QUEUED, conn) || (!j->stream && !wait_past(c, j, JOB_RUNNING, conn))) {
        serve_job_release(j);
        pthread_mutex_unlock(&c->mu);
        return MHD_NO; /* the client left */
    }
    if (j->http_status) {
        char msg[sizeof j->error];
        const int st = j->http_status;
        const char *param = st != 400 ? NULL : j->error_param ? j->error_param : chat ? "messages" : "prompt";
        snprintf(msg, sizeof msg, "%s", j->error);
        serve_job_release(j);
        pthread_mutex_unlock(&c->mu);
        return send_error(conn, (unsigned)st, msg, param);
    }
    if (!j->stream) {
        char *body = serve_response_json(c, j);
        serve_job_release(j);
        pthread_mutex_unlock(&c->mu);
        return send_text(conn, 200, "application/json", body);
    }
    pthread_mutex_unlock(&c->mu);
    stream *s = calloc(1, sizeof *s);
    if (!s) {
        pthread_mutex_lock(&c->mu);
        j->cancelled = 1;
        serve_job_release(j);
        pthread_mutex_unlock(&c->mu);
        return MHD_NO;
    }
    s->c = c;
    s->j = j; /* the connection's reference moves to the stream */
    struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, stream_read, s, stream_free);
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
    MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    enum MHD_Result ret = MHD_queue_response(conn, 200, r);
    MHD_destroy_response(r);
    return ret;
}

/* ---- the other endpoints ------------------------------------------------ */

/* One Prometheus histogram from per-bucket counts (the last: +Inf). */
static void put_histogram(char *t, size_t cap, int *n, const char *name, const double *bounds, int nb,
                          const unsigned long long *hist, double sum, unsigned long long count)
{
    unsigned long long cum = 0;
    for (int b = 0; b <= nb && *n > 0 && (size_t)*n < cap; b++) {
        cum += hist[b];
        char le[32];
        if (b < nb)
            snprintf(le, sizeof le, "%g", bounds[b]);
        else
            snprintf(le, sizeof le, "+Inf");
        *n += snprintf(t + *n, cap - (size_t)*n, "%s_bucket{le=\"%s\"} %llu\n", name, le, cum);
    }
    if (*n > 0 && (size_t)*n < cap)
        *n += snprintf(t + *n, cap - (size_t)*n, "%s_sum %.6f\n%s_count %llu\n", name, sum, name, count);
}

static char *metrics_text(serve_ctx *c)
{
    size_t cap = 16384;
    char *t = malloc(cap);
    if (!t)
        return NULL;
    pthread_mutex_lock(&c->mu);
    const serve_metrics *m = &c->m;
    int n = snprintf(t, cap,
                     "# HELP dflash_requests_total Generation requests by outcome.\n"
                     "# TYPE dflash_requests_total counter\n"
                     "dflash_requests_total{outcome=\"ok\"} %llu\n"
                     "dflash_requests_total{outcome=\"error\"} %llu\n"
                     "dflash_requests_total{outcome=\"cancelled\"} %llu\n"
                     "dflash_requests_total{outcome=\"rejected\"} %llu\n"
                     "# HELP dflash_queue_length Requests waiting for a session.\n"
                     "# TYPE dflash_queue_length gauge\ndflash_queue_length %d\n"
                     "# HELP dflash_running_sessions Sessions generating.\n"
                     "# TYPE dflash_running_sessions gauge\ndflash_running_sessions %d\n"
                     "# HELP dflash_kv_pages KV pages of 16 positions the requests share (--kv-pages).\n"
                     "# TYPE dflash_kv_pages gauge\ndflash_kv_pages %d\n"
                     "# HELP dflash_kv_pages_reserved KV pages reserved by running requests, after the last step.\n"
                     "# TYPE dflash_kv_pages_reserved gauge\ndflash_kv_pages_reserved %d\n"
                     "# HELP dflash_sessions_waiting_for_pages Running requests whose start waits for KV pages.\n"
                     "# TYPE dflash_sessions_waiting_for_pages gauge\ndflash_sessions_waiting_for_pages %d\n"
                     "# HELP dflash_prompt_tokens_total Prompt tokens of admitted requests.\n"
                     "# TYPE dflash_prompt_tokens_total counter\ndflash_prompt_tokens_total %llu\n"
                     "# HELP dflash_generated_tokens_total Tokens generated (committed by the target).\n"
                     "# TYPE dflash_generated_tokens_total counter\ndflash_generated_tokens_total %llu\n"
                     "# HELP dflash_spec_steps_total Speculative steps (one target verify each) of finished "
                     "requests; generated / steps is the mean acceptance length.\n"
                     "# TYPE dflash_spec_steps_total counter\ndflash_spec_steps_total %llu\n"
                     "# HELP dflash_time_to_first_token_seconds From arrival to the first token.\n"
                     "# TYPE dflash_time_to_first_token_seconds histogram\n",
                     m->req_ok, m->req_error, m->req_cancelled, m->req_rejected, c->n_queued, c->n_running,
                     m->kv_pages, m->kv_reserved, m->kv_waiting, m->prompt_tokens, m->generated_tokens, m->steps);
/* append while there is room (the text is far below cap) */
#define PUT(...) (n > 0 && (size_t)n < cap ? n += snprintf(t + n, cap - (size_t)n, __VA_ARGS__) : 0)
    put_histogram(t, cap, &n, "dflash_time_to_first_token_seconds", serve_ttft_bounds, SERVE_TTFT_BUCKETS,
                  m->ttft_hist, m->ttft_sum, m->ttft_count);
    PUT("# HELP dflash_time_per_output_token_seconds Per request: from the first token to the last, over the "
        "tokens after the first.\n# TYPE dflash_time_per_output_token_seconds histogram\n");
    put_histogram(t, cap, &n, "dflash_time_per_output_token_seconds", serve_tpot_bounds, SERVE_TPOT_BUCKETS,
                  m->tpot_hist, m->tpot_sum, m->tpot_count);
    /* the speculative counters users ask for */
    PUT("# HELP dflash_spec_drafted_tokens_total Draft tokens proposed (finished requests).\n"
        "# TYPE dflash_spec_drafted_tokens_total counter\ndflash_spec_drafted_tokens_total %llu\n"
        "# HELP dflash_spec_accepted_tokens_total Draft tokens the target accepted.\n"
        "# TYPE dflash_spec_accepted_tokens_total counter\ndflash_spec_accepted_tokens_total %llu\n"
        "# HELP dflash_spec_acceptance_length Tokens a step committed (accepted drafts + 1).\n"
        "# TYPE dflash_spec_acceptance_length histogram\n",
        m->drafted, m->accepted);
    /* buckets and positions up to the engine's block: what a step can do */
    const int B = c->block < 1 ? 1 : c->block > DFLASH_STATS_POSITIONS ? DFLASH_STATS_POSITIONS : c->block;
    unsigned long long steps = 0, committed = 0;
    for (int k = 0; k <= DFLASH_STATS_POSITIONS; k++) {
        steps += m->commit_hist[k];
        committed += m->commit_hist[k] * (unsigned long long)k;
        if (k < B)
            PUT("dflash_spec_acceptance_length_bucket{le=\"%d\"} %llu\n", k, steps);
    }
    PUT("dflash_spec_acceptance_length_bucket{le=\"+Inf\"} %llu\ndflash_spec_acceptance_length_sum %llu\n"
        "dflash_spec_acceptance_length_count %llu\n"
        "# HELP dflash_spec_position_drafted_total Steps that drafted position N.\n"
        "# TYPE dflash_spec_position_drafted_total counter\n",
        steps, committed, steps);
    for (int i = 0; i < B - 1; i++)
        PUT("dflash_spec_position_drafted_total{position=\"%d\"} %llu\n", i + 1, m->pos_tried[i]);
    PUT("# HELP dflash_spec_position_accepted_total Steps that accepted the draft at position N.\n"
        "# TYPE dflash_spec_position_accepted_total counter\n");
    for (int i = 0; i < B - 1; i++)
        PUT("dflash_spec_position_accepted_total{position=\"%d\"} %llu\n", i + 1, m->pos_accepted[i]);
#undef PUT
    pthread_mutex_unlock(&c->mu);
    return t;
}

/* a == b, in a time that does not depend on where they differ */
static int same_secret(const char *a, const char *b)
{
    const size_t na = strlen(a), nb = strlen(b);
    unsigned char diff = na != nb;
    for (size_t i = 0; i < nb; i++)
        diff |= (unsigned char)(b[i] ^ (i < na ? a[i] : 0));
    return diff == 0;
}

static enum MHD_Result route(serve_ctx *c, struct MHD_Connection *conn, const char *url, const char *method,
                             const req *rq)
{
    /* HEAD wherever GET: the daemon sends the headers alone */
    const int get = !strcmp(method, "GET") || !strcmp(method, "HEAD"), post = !strcmp(method, "POST");
    static const struct {
        const char *path;
        int post; /* the method it takes: POST (1) or GET (0) */
        int v1;   /* under /v1: needs the API key when one is set */
    } routes[] = {
        { "/health", 0, 0 }, { "/metrics", 0, 0 }, { "/v1/models", 0, 1 },
        { "/v1/completions", 1, 1 }, { "/v1/chat/completions", 1, 1 },
        { "/v1/models/", 0, 1 }, /* a prefix: one model, by its id */
    };
    enum { N_ROUTES = sizeof routes / sizeof routes[0], ONE_MODEL = N_ROUTES - 1 };
    size_t k = 0;
    while (k < N_ROUTES && (k == ONE_MODEL ? strncmp(url, routes[k].path, strlen(routes[k].path))
                                           : strcmp(url, routes[k].path)) != 0)
        k++;
    if (k == N_ROUTES) {
        char msg[300];
        snprintf(msg, sizeof msg, "no route %s %.200s", method, url);
        return send_error(conn, 404, msg, NULL);
    }
    if (routes[k].post ? !post : !get) {
        char msg[300];
        snprintf(msg, sizeof msg, "%s %.200s: the route takes %s", method, url, routes[k].post ? "POST" : "GET or HEAD");
        return send_error_allow(conn, 405, msg, NULL, routes[k].post ? "POST" : "GET, HEAD");
    }
    if (routes[k].v1 && c->api_key) {
        const char *auth = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
        if (!auth || strncmp(auth, "Bearer ", 7) != 0 || !same_secret(auth + 7, c->api_key))
            return send_error(conn, 401, "a valid API key is required (Authorization: Bearer KEY)", NULL);
    }
    if (rq->too_large) {
        char msg[120];
        snprintf(msg, sizeof msg, "the request body is larger than %zu bytes", c->max_body);
        return send_error(conn, 413, msg, NULL);
    }
    switch (k) {
    case 0: return send_text(conn, 200, "application/json", strdup("{\"status\":\"ok\"}"));
    case 1: return send_text(conn, 200, "text/plain; version=0.0.4", metrics_text(c));
    case 2: return send_text(conn, 200, "application/json", serve_model_json(c, 1));
    case ONE_MODEL: {
        const char *id = url + strlen(routes[k].path);
        if (strcmp(id, c->model_name) != 0) {
            char msg[400];
            snprintf(msg, sizeof msg, "the model '%.200s' does not exist: this server serves '%s'", id,
                     c->model_name);
            return send_error(conn, 404, msg, "model");
        }
        return send_text(conn, 200, "application/json", serve_model_json(c, 0));
    }
    default: return generate(c, conn, k == 4, rq);
    }
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **con_cls)
{
    (void)version;
    serve_ctx *c = cls;
    req *rq = *con_cls;
    if (!rq) { /* headers only: make room for the body */
        if (!(rq = calloc(1, sizeof *rq)))
            return MHD_NO;
        *con_cls = rq;
        return MHD_YES;
    }
    if (*upload_size) {
        if (!rq->too_large && rq->len + *upload_size > c->max_body) {
            rq->too_large = 1;
        } else if (!rq->too_large) {
            if (rq->len + *upload_size + 1 > rq->cap) {
                size_t cap = (rq->len + *upload_size + 1) * 2;
                char *b = realloc(rq->body, cap);
                if (!b)
                    return MHD_NO;
                rq->body = b;
                rq->cap = cap;
            }
            memcpy(rq->body + rq->len, upload, *upload_size);
            rq->len += *upload_size;
            rq->body[rq->len] = 0;
        }
        *upload_size = 0;
        return MHD_YES;
    }
    /* The request is in: its run may wait and generate for longer than a
     * client may idle, so the timeout stops here (on_completed sets it
     * again for the next request on the connection). */
    MHD_set_connection_option(conn, MHD_CONNECTION_OPTION_TIMEOUT, 0u);
    return route(c, conn, url, method, rq);
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls, enum MHD_RequestTerminationCode toe)
{
    (void)toe;
    const serve_ctx *c = cls;
    MHD_set_connection_option(conn, MHD_CONNECTION_OPTION_TIMEOUT, (unsigned)c->client_timeout);
    req *rq = *con_cls;
    if (rq) {
        free(rq->body);
        free(rq);
    }
    *con_cls = NULL;
}

dflash_status serve_http_start(serve_ctx *c, const char *host, int port, serve_http **out)
{
    *out = NULL;
    struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE }, *ai;
    char port_s[16];
    snprintf(port_s, sizeof port_s, "%d", port);
    int gai = getaddrinfo(host, port_s, &hints, &ai);
    if (gai != 0)
        return dflash_fail(DFLASH_ERR_INVALID_ARG, "serve: --host %s: %s", host, gai_strerror(gai));
    serve_http *h = calloc(1, sizeof *h);
    if (!h) {
        freeaddrinfo(ai);
        return dflash_fail(DFLASH_ERR_OOM, "serve: out of memory");
    }
    h->c = c;
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION | MHD_USE_ITC |
                     MHD_USE_ERROR_LOG | (ai->ai_family == AF_INET6 ? MHD_USE_IPv6 : 0);
    h->d = MHD_start_daemon(flags, (uint16_t)port, NULL, NULL, on_request, c, MHD_OPTION_SOCK_ADDR, ai->ai_addr,
                            MHD_OPTION_NOTIFY_COMPLETED, on_completed, c, MHD_OPTION_CONNECTION_TIMEOUT,
                            (unsigned)c->client_timeout, MHD_OPTION_CONNECTION_LIMIT,
                            (unsigned)(c->max_sessions + c->max_queue + 32), MHD_OPTION_END);
    freeaddrinfo(ai);
    if (!h->d) {
        free(h);
        return dflash_fail(DFLASH_ERR_IO, "serve: could not listen on %s:%d (in use, or not an address of this "
                           "machine?)", host, port);
    }
    *out = h;
    return DFLASH_OK;
}

void serve_http_quiesce(serve_http *h)
{
    if (h && h->d)
        MHD_quiesce_daemon(h->d);
}

void serve_http_stop(serve_http *h)
{
    if (!h)
        return;
    if (h->d)
        MHD_stop_daemon(h->d);
    free(h);
}
