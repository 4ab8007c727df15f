/* dflash.h: the public API of dflash, a C11 library for DFlash speculative
 * decoding (block-diffusion drafter + Qwen3 target).
 *
 * Conventions: every function that can fail returns dflash_status (0 = ok);
 * on failure dflash_last_error() holds a message naming the file, tensor,
 * field, expected and actual value. Handles are opaque. Options structs come
 * with *_default_opts() so new fields never break callers. */
#ifndef DFLASH_H
#define DFLASH_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum dflash_status {
    DFLASH_OK = 0,
    DFLASH_ERR_INVALID_ARG = 1, /* caller passed something out of contract */
    DFLASH_ERR_IO = 2,          /* open/read/mmap failed */
    DFLASH_ERR_FORMAT = 3,      /* file content malformed */
    DFLASH_ERR_UNSUPPORTED = 4, /* well-formed but not supported */
    DFLASH_ERR_NOT_FOUND = 5,   /* missing tensor, field or file */
    DFLASH_ERR_SHAPE = 6,       /* shape or dtype mismatch */
    DFLASH_ERR_OOM = 7,         /* host allocation failed */
    DFLASH_ERR_KV_FULL = 8,     /* KV page pool exhausted */
    DFLASH_ERR_BACKEND = 9,     /* backend (driver, compiler) failure */
    DFLASH_ERR_NUMERIC = 10,    /* a model produced no usable numbers (NaN, inf) */
} dflash_status;

/* Message of the last failure on this thread ("" if none). */
const char *dflash_last_error(void);
/* Short stable name of a status code, e.g. "DFLASH_ERR_SHAPE". */
const char *dflash_status_name(dflash_status s);

/* ---- engine and sessions ------------------------------------------------
 *
 * An engine holds one target model, optionally a drafter, and the KV caches
 * of up to max_sessions sessions. A session is one token sequence: start it
 * with a prompt, and every dflash_engine_step advances all started sessions
 * by one speculative step together (one drafter propose, one target verify
 * over all their rows). A session's output is the same whether it runs
 * alone or with others. Starting a session that has generated before
 * continues it (a chat's next turn): the new ids follow what it holds.
 *
 *     dflash_engine *e; dflash_session *s;
 *     dflash_engine_opts eo; dflash_engine_default_opts(&eo);
 *     eo.model_dir = "models/qwen3-pystd"; eo.draft = "models/qwen3-pystd-dflash";
 *     dflash_engine_open(&eo, &e);
 *     dflash_session_opts so; dflash_session_default_opts(&so);
 *     dflash_session_new(e, &so, &s);
 *     dflash_session_start_text(s, "def add(a, b):");
 *     for (int active = 1; active;) dflash_engine_step(e, &active);
 *     char *text; dflash_session_text(s, &text);
 */
typedef struct dflash_engine dflash_engine;
typedef struct dflash_session dflash_session;

typedef struct dflash_engine_opts {
    const char *model_dir; /* target checkpoint folder (config.json, safetensors, tokenizer.json) */
    const char *draft;     /* DFlash drafter folder, "ngram" (prompt lookup), or NULL: plain decoding */
    const char *device;    /* "cpu" (default), "cuda", or "auto" (CUDA when usable) */
    int max_sessions;      /* sessions started at once (default 8) */
    int max_ctx;           /* positions per session, prompt + output (default 4096; at most the model's) */
    int long_context;      /* 1: max_ctx may pass the model's context length (past what it was trained on) */
    int block_size;        /* tokens per step, last token + drafts (0: the drafter's) */
    /* 1: each step drafts the cost-aware width instead of the whole block:
     * the draft count (up to block_size - 1) with the most expected tokens
     * per second per session at the current number of sessions, learned
     * from the steps' own times and acceptance. Outputs are the same. */
    int width_auto;
    /* 1: drafter weights in fp8 e4m3 with per-row scales; 0: bf16; -1
     * (default): fp8 when DFLASH_DRAFTER_FP8=1, else bf16 */
    int drafter_fp8;
    /* the drafter's context window in positions, 0 = none; -1 (default):
     * DFLASH_CTX_CAP, else 4096 */
    int ctx_cap;
    /* KV pages (16 positions each, every layer) the target's pool holds for
     * all sessions together; 0 (default): room for max_sessions sessions of
     * max_ctx positions. A start reserves what its session can reach (its
     * cache, prompt, max_tokens and one block) and fails with
     * DFLASH_ERR_KV_FULL only if that is more than the whole pool; if it is
     * more than is free, the session waits (dflash_session_running says 1,
     * it has no tokens yet) and joins at a later dflash_engine_step, oldest
     * first, as others finish or are freed. A finished session's cache is
     * kept for its next start until a waiting one needs the pages; its next
     * start then runs its whole history again, with the same result. */
    int kv_pages;
} dflash_engine_opts;

void dflash_engine_default_opts(dflash_engine_opts *o);
dflash_status dflash_engine_open(const dflash_engine_opts *o, dflash_engine **out);
/* Frees the engine; its sessions must have been freed. */
void dflash_engine_close(dflash_engine *e);
/* Positions one session may hold, prompt and output together: max_ctx,
 * or the model's context length where that is smaller. */
int dflash_engine_max_ctx(const dflash_engine *e);
/* The target's vocabulary: token ids are 0 .. this - 1. */
int dflash_engine_vocab_size(const dflash_engine *e);
/* Tokens a step commits at most: the last token + drafts (block_size or
 * the drafter's block), 1 for plain decoding. */
int dflash_engine_block_size(const dflash_engine *e);
/* The KV page pool: its pages, those reserved by running or waiting starts
 * or held by idle caches, and the started sessions waiting for pages. Read
 * it from the thread that steps the engine. */
void dflash_engine_kv_usage(const dflash_engine *e, int *pages, int *reserved, int *waiting);

/* Called with the tokens each step commits, in order; a status other than
 * DFLASH_OK stops that session (the tokens so far are kept). */
typedef dflash_status (*dflash_tokens_cb)(void *user, const int32_t *ids, int n);
/* Called after each speculative step of a session: pos is the position of
 * the step's first row (the token before the drafts), drafts[0..n_drafts)
 * what the drafter proposed (none on a plain decoding step), accepted how
 * many of them the target took, next the token it chose after them. */
typedef void (*dflash_step_cb)(void *user, int32_t pos, const int32_t *drafts, int n_drafts, int accepted,
                               int32_t next);

#define DFLASH_MAX_STOP_IDS 16
#define DFLASH_MAX_STOP_STRINGS 8
#define DFLASH_MAX_STOP_LEN 128
typedef struct dflash_session_opts {
    int max_tokens;     /* per start (default 256) */
    double temperature; /* 0: greedy (default) */
    int top_k;          /* 0: off */
    double top_p;       /* 1: off */
    double min_p;       /* 0: off */
    double rep_penalty; /* 1: off; counts everything the session holds */
    /* OpenAI's penalties, 0: off, in [-2, 2]: a logit loses frequency_penalty
     * per occurrence of its token among the tokens this start generated,
     * and presence_penalty once if there is one (the prompt and earlier
     * starts do not count) */
    double frequency_penalty, presence_penalty;
    uint64_t seed;      /* sampling is keyed by the seed and each token's position */
    int ignore_eos;     /* 1: do not stop at the model's end-of-sequence ids */
    /* more ids that end generation (emitted, then the session stops), as a
     * chat format's end of turn; whatever ignore_eos says. At most
     * DFLASH_MAX_STOP_IDS, copied by dflash_session_new. */
    const int32_t *stop_ids;
    int n_stop_ids;
    /* strings that end generation: once the text of a start's output holds
     * one, the session stops after the token that completed it (the
     * caches hold nothing past that token, so a later start continues
     * after it); dflash_session_output keeps that token, and
     * dflash_session_text ends where the first stop string begins. Needs
     * the engine's tokenizer. At most DFLASH_MAX_STOP_STRINGS, each 1 to
     * DFLASH_MAX_STOP_LEN bytes, copied by dflash_session_new. */
    const char *const *stop_strings;
    int n_stop_strings;
    dflash_tokens_cb on_tokens;
    void *user;
    dflash_step_cb on_step; /* NULL: none */
    void *step_user;
} dflash_session_opts;

void dflash_session_default_opts(dflash_session_opts *o);
dflash_status dflash_session_new(dflash_engine *e, const dflash_session_opts *o, dflash_session **out);
/* Stops the session if it runs; its KV pages return to the engine. */
void dflash_session_free(dflash_session *s);
/* Start generating after `ids` (or `text`, tokenized as Hugging Face's
 * tokenizer(text) does); the session joins at the next step (its prompt
 * runs in the steps, see dflash_engine_step). A session that
 * is still generating cannot be started (DFLASH_ERR_INVALID_ARG); one that
 * has generated before continues after its output. */
dflash_status dflash_session_start_ids(dflash_session *s, const int32_t *ids, size_t n);
dflash_status dflash_session_start_text(dflash_session *s, const char *text);
/* One step of every started session, after admitting waiting ones that
 * now fit: prompt rows of sessions that joined (at most a forward's rows
 * per step over all of them, oldest first, so a long prompt does not
 * stall the others; a session's first token comes in the step that runs
 * its last prompt rows), then one speculative step of the others.
 * *n_active: sessions generating, joining or waiting. A failure of the
 * step itself stops every session; a session that fails to join or whose
 * prompt fails stops alone (dflash_session_error says why). */
dflash_status dflash_engine_step(dflash_engine *e, int *n_active);
/* Why the last start of a session stopped before generating (its prompt
 * failed in a step, or DFLASH_ERR_KV_FULL: the pages it waited for are
 * held by the caches of sessions waiting behind it), and its message;
 * DFLASH_OK and "" otherwise. */
dflash_status dflash_session_error(const dflash_session *s, const char **message);
/* 1 while the session is generating. */
int dflash_session_running(const dflash_session *s);
/* The tokens generated since the last start (valid until the next start). */
void dflash_session_output(const dflash_session *s, const int32_t **ids, size_t *n);
/* Those tokens as text (special tokens left out), cut before a stop
 * string that ended the start; *text is malloc'd. */
dflash_status dflash_session_text(const dflash_session *s, char **text);

#define DFLASH_STATS_POSITIONS 64 /* the widest block: its draft positions, tokens a step commits */
typedef struct dflash_session_stats {
    int prompt_tokens, generated_tokens, steps;
    double mean_accept; /* tau: tokens committed per step */
    double total_ms;    /* from the start (waiting for pages included) to the end */
    /* its prompt through the target; the steps' propose and verify calls
     * (shared by every session of a step, counted whole for each); the
     * drafter taking in accepted rows */
    double prefill_ms, draft_ms, verify_ms, observe_ms;
    double tokens_per_s; /* generated tokens / (total - prefill) */
    int64_t drafted, accepted; /* draft tokens proposed, and accepted by the target */
    /* [k]: steps that committed k tokens */
    int64_t commit_hist[DFLASH_STATS_POSITIONS + 1];
    /* [i]: steps that drafted position i + 1, and that accepted it */
    int64_t pos_tried[DFLASH_STATS_POSITIONS], pos_accepted[DFLASH_STATS_POSITIONS];
    /* [k]: steps that drafted k tokens; k = 0 is a plain decoding step */
    int64_t width_hist[DFLASH_STATS_POSITIONS + 1];
    int stopped; /* a stop id, a stop string or the token callback ended it before its budget */
} dflash_session_stats;
/* Statistics of the last start (tau and the total time once it is done). */
void dflash_session_stats_get(const dflash_session *s, dflash_session_stats *out);

#ifdef __cplusplus
}
#endif
#endif
