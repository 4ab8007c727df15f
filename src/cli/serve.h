/* serve.h: what the parts of `dflash serve` share. A request becomes a job;
 * connection threads (libmicrohttpd, one per connection) create jobs and
 * wait on them, one scheduler thread owns the engine, the tokenizer and
 * every job's generation, and all job state is guarded by one mutex.
 *   serve_api.c    OpenAI request JSON -> job; job -> response JSON
 *   serve_sched.c  the scheduler thread: admission, steps, text, stops
 *   serve_http.c   routes, errors, streaming, metrics text
 *   cmd_serve.c    options, start-up, signals */
#ifndef DFLASH_CLI_SERVE_H
#define DFLASH_CLI_SERVE_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "cli/engine.h"
#include "dflash.h"
#include "io/chat.h"
#include "io/tokenizer.h"

#define SERVE_MAX_STOP_STRINGS 8
#define SERVE_TTFT_BUCKETS 12
#define SERVE_TPOT_BUCKETS 10

typedef enum serve_state {
    JOB_QUEUED,  /* waiting for a session */
    JOB_RUNNING, /* generating */
    JOB_DONE,    /* finished, failed or cancelled: nothing more will come */
} serve_state;

typedef struct serve_job {
    /* set by the connection thread before the job is queued */
    int chat;                 /* /v1/chat/completions (else /v1/completions) */
    int stream, include_usage;
    dflash_chat_msg *msgs;    /* chat: the messages (contents owned) */
    size_t n_msgs;
    int thinking;             /* chat_template_kwargs.enable_thinking */
    char *prompt_text;        /* completions: a text prompt */
    int32_t *prompt_ids;      /* completions: token ids (or the encoded prompt once admitted) */
    size_t n_prompt;
    int max_tokens;           /* 0: what the context leaves */
    dflash_session_opts so;   /* sampling; max_tokens set at admission */
    char *stop[SERVE_MAX_STOP_STRINGS];
    int n_stop;
    char id[40];              /* "cmpl-..." / "chatcmpl-..." */
    long long created;        /* unix seconds */
    double t_arrive;          /* monotonic seconds */
    /* written by the scheduler, read by the connection thread (lock held) */
    serve_state state;
    int cancelled;            /* the client went away: stop and free */
    int http_status;          /* an error found at admission (400 ...), else 0 */
    char error[512];
    const char *error_param;  /* the field a 400 names (a literal), or NULL: the prompt or messages */
    int32_t *ids;             /* generated ids */
    size_t n_ids, cap_ids;
    char *text;               /* their text, cut at a stop string */
    size_t text_len;
    size_t safe_len;          /* bytes of text that can be sent (final once done) */
    int stop_hit;             /* a stop string or the end of the turn ended it */
    const char *finish;       /* "stop" or "length" once done */
    int prompt_tokens, steps;
    double mean_accept, t_first; /* t_first: when the first token came (0: none yet) */
    double t_last;            /* when the latest token came */
    dflash_session *session;
    int refs;                 /* connection + scheduler; freed at 0 */
    struct serve_job *next;   /* queue link */
} serve_job;

typedef struct serve_metrics {
    unsigned long long req_ok, req_error, req_cancelled, req_rejected;
    unsigned long long prompt_tokens, generated_tokens, steps;
    /* the speculative counters of finished requests (dflash_session_stats) */
    unsigned long long drafted, accepted;
    unsigned long long commit_hist[DFLASH_STATS_POSITIONS + 1];
    unsigned long long pos_tried[DFLASH_STATS_POSITIONS], pos_accepted[DFLASH_STATS_POSITIONS];
    unsigned long long ttft_hist[SERVE_TTFT_BUCKETS + 1]; /* cumulative at render time; last = +Inf */
    double ttft_sum;
    unsigned long long ttft_count;
    /* per request: (last token - first token) / (tokens - 1) */
    unsigned long long tpot_hist[SERVE_TPOT_BUCKETS + 1];
    double tpot_sum;
    unsigned long long tpot_count;
    /* the engine's KV pages after the last step (dflash_engine_kv_usage) */
    int kv_pages, kv_reserved, kv_waiting;
} serve_metrics;

typedef struct serve_ctx {
    /* fixed after start-up */
    dflash_engine *engine;
    dflash_tokenizer *tok;
    dflash_chat_format chat_format;
    int chat_ok;         /* the tokenizer's chat format is one dflash renders */
    char chat_err[700];  /* else why /v1/chat/completions is refused */
    int32_t end_of_turn; /* the chat format's end-of-turn id, or -1 */
    const char *model_name;
    const char *api_key; /* NULL: none required */
    int max_sessions, max_queue, max_ctx;
    int block; /* tokens a step commits at most (dflash_engine_block_size): the metrics' positions */
    size_t max_body;
    int client_timeout; /* seconds a client may take to send a request or idle between requests; 0: no limit */
    dflash_session_opts dflt; /* defaults from the command line's sampling options */
    /* guarded by mu */
    pthread_mutex_t mu;
    pthread_cond_t work; /* the scheduler: a job came, or shutting down */
    pthread_cond_t progress; /* connection threads: some job moved */
    serve_job *queue_head, *queue_tail;
    int n_queued, n_running;
    serve_job **running; /* [max_sessions] */
    int shutting_down;
    serve_metrics m;
    pthread_t sched;
} serve_ctx;

/* serve_api.c */
/* Parse a request body into a new job (refs = 1) or fill err (HTTP 400:
 * the message names the field) and return NULL. */
serve_job *serve_job_from_json(serve_ctx *c, int chat, const char *body, size_t len, char *err, size_t cap,
                               const char **err_param);
void serve_job_free(serve_job *j);
/* The non-streamed response body (malloc'd JSON). */
char *serve_response_json(const serve_ctx *c, const serve_job *j);
/* One streamed chunk carrying `delta` (len bytes; may be empty), or the
 * final chunk (finish reason set) or the usage chunk; malloc'd "data: ...\n\n". */
char *serve_chunk_sse(const serve_ctx *c, const serve_job *j, const char *delta, size_t len, int final, int usage);
/* {"error": {...}} (malloc'd). */
char *serve_error_json(const char *message, const char *type, const char *param, const char *code);
/* The served model as an OpenAI model object, or (list) a list holding
 * it (malloc'd JSON). */
char *serve_model_json(const serve_ctx *c, int list);

/* serve_sched.c */
/* The upper bounds (seconds) of the latency histograms' buckets. */
extern const double serve_ttft_bounds[SERVE_TTFT_BUCKETS], serve_tpot_bounds[SERVE_TPOT_BUCKETS];
dflash_status serve_sched_start(serve_ctx *c);
/* Queue a job (takes a reference); 0, or 429 when the queue is full. */
int serve_submit(serve_ctx *c, serve_job *j);
/* Drop a reference (lock held); frees the job at 0. */
void serve_job_release(serve_job *j);
/* Stop accepting; the scheduler finishes what runs and exits. */
void serve_sched_stop(serve_ctx *c);

/* serve_http.c */
typedef struct serve_http serve_http;
dflash_status serve_http_start(serve_ctx *c, const char *host, int port, serve_http **out);
/* Stop accepting connections (in-flight ones go on). */
void serve_http_quiesce(serve_http *h);
void serve_http_stop(serve_http *h);

#endif
