/* serve_api.c: the OpenAI wire format of `dflash serve`: request bodies of
 * /v1/completions and /v1/chat/completions parsed into jobs (every field
 * checked, an error naming it), and the JSON of responses, stream chunks
 * and errors. See serve.h. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/serve.h"

void serve_job_free(serve_job *j)
{
    if (!j)
        return;
    for (size_t i = 0; i < j->n_msgs; i++)
        free((char *)j->msgs[i].content);
    free(j->msgs);
    free(j->prompt_text);
    free(j->prompt_ids);
    for (int i = 0; i < j->n_stop; i++)
        free(j->stop[i]);
    free(j->ids);
    free(j->text);
    free(j);
}

/* Field errors: the message and the offending field, for a 400. */
typedef struct perr {
    char *msg;
    size_t cap;
    const char **param;
} perr;

static int bad(perr *e, const char *param, const char *fmt, const char *detail)
{
    snprintf(e->msg, e->cap, fmt, param, detail ? detail : "");
    *e->param = param;
    return 0;
}

/* ", got <what x is>" for an error message: a number or literal as
 * written, a string quoted (cut at 40 bytes), else its JSON type. */
static const char *got(json_t *x, char *buf, size_t cap)
{
    if (json_is_integer(x))
        snprintf(buf, cap, ", got %lld", (long long)json_integer_value(x));
    else if (json_is_real(x))
        snprintf(buf, cap, ", got %g", json_real_value(x));
    else if (json_is_string(x))
        snprintf(buf, cap, ", got the string \"%.40s%s\"", json_string_value(x),
                 strlen(json_string_value(x)) > 40 ? "..." : "");
    else
        snprintf(buf, cap, ", got %s", json_is_boolean(x) ? (json_is_true(x) ? "true" : "false")
                                       : json_is_array(x) ? "an array"
                                       : json_is_object(x) ? "an object"
                                                           : "null");
    return buf;
}

/* A number field in [lo, hi] (absent: *v unchanged). */
static int get_num(json_t *o, const char *k, double lo, double hi, double *v, perr *e)
{
    json_t *x = json_object_get(o, k);
    char what[80];
    if (!x || json_is_null(x))
        return 1;
    if (!json_is_number(x))
        return bad(e, k, "'%s' must be a number%s", got(x, what, sizeof what));
    double d = json_number_value(x);
    if (!(d >= lo && d <= hi)) {
        char range[80];
        snprintf(range, sizeof range, " in [%g, %g], got %g", lo, hi, d);
        return bad(e, k, "'%s' must be a number%s", range);
    }
    *v = d;
    return 1;
}

/* An integer field in [lo, hi] (absent: *v unchanged); a whole number
 * written with a decimal point (10.0, as some clients write every number)
 * counts. */
static int get_int(json_t *o, const char *k, long long lo, long long hi, long long *v, perr *e)
{
    json_t *x = json_object_get(o, k);
    if (!x || json_is_null(x))
        return 1;
    const double r = json_is_real(x) ? json_real_value(x) : 0;
    const int whole = json_is_integer(x) || (json_is_real(x) && r == floor(r) && r >= -9e18 && r <= 9e18);
    const long long i = json_is_integer(x) ? (long long)json_integer_value(x) : whole ? (long long)r : 0;
    if (!whole || i < lo || i > hi) {
        char range[160], what[80];
        snprintf(range, sizeof range, " from %lld to %lld%s", lo, hi, got(x, what, sizeof what));
        return bad(e, k, "'%s' must be an integer%s", range);
    }
    *v = i;
    return 1;
}

/* A boolean field k of o, named `name` in errors (absent: *v unchanged). */
static int get_bool_as(json_t *o, const char *k, const char *name, int *v, perr *e)
{
    json_t *x = json_object_get(o, k);
    char what[80];
    if (!x || json_is_null(x))
        return 1;
    if (!json_is_boolean(x))
        return bad(e, name, "'%s' must be true or false%s", got(x, what, sizeof what));
    *v = json_is_true(x);
    return 1;
}

static int get_bool(json_t *o, const char *k, int *v, perr *e) { return get_bool_as(o, k, k, v, e); }

/* A boolean field k of an optional object field obj ({"obj": {"k": true}};
 * either absent: *v unchanged); errors name it "obj.k" (path). */
static int get_sub_bool(json_t *o, const char *obj, const char *k, const char *path, int *v, perr *e)
{
    json_t *x = json_object_get(o, obj);
    char what[80];
    if (!x || json_is_null(x))
        return 1;
    if (!json_is_object(x))
        return bad(e, obj, "'%s' must be an object%s", got(x, what, sizeof what));
    return get_bool_as(x, k, path, v, e);
}

/* A message's content: a string, or an array of {"type": "text", "text"}
 * parts (joined). */
static char *content_text(json_t *c)
{
    if (json_is_string(c))
        return strdup(json_string_value(c));
    if (!json_is_array(c))
        return NULL;
    size_t len = 0, i;
    json_t *part;
    json_array_foreach(c, i, part) {
        json_t *t = json_object_get(part, "text");
        if (!json_is_object(part) || !json_is_string(json_object_get(part, "type")) ||
            strcmp(json_string_value(json_object_get(part, "type")), "text") != 0 || !json_is_string(t))
            return NULL;
        len += strlen(json_string_value(t));
    }
    char *s = malloc(len + 1);
    if (!s)
        return NULL;
    s[0] = 0;
    json_array_foreach(c, i, part) strcat(s, json_string_value(json_object_get(part, "text")));
    return s;
}

static int parse_messages(json_t *root, serve_job *j, perr *e)
{
    json_t *m = json_object_get(root, "messages");
    if (!json_is_array(m) || json_array_size(m) == 0)
        return bad(e, "messages", "'%s' must be a non-empty array of {role, content}%s", NULL);
    j->msgs = calloc(json_array_size(m), sizeof *j->msgs);
    if (!j->msgs)
        return bad(e, "messages", "'%s': out of memory%s", NULL);
    size_t i;
    json_t *msg;
    json_array_foreach(m, i, msg) {
        const char *role = json_string_value(json_object_get(msg, "role"));
        static const struct { const char *name; dflash_chat_role role; } roles[] = {
            { "system", DFLASH_CHAT_SYSTEM }, { "developer", DFLASH_CHAT_SYSTEM },
            { "user", DFLASH_CHAT_USER }, { "assistant", DFLASH_CHAT_ASSISTANT },
        };
        size_t r = 0;
        while (role && r < sizeof roles / sizeof roles[0] && strcmp(role, roles[r].name) != 0)
            r++;
        char where[160], what[80];
        if (!role || r == sizeof roles / sizeof roles[0]) {
            json_t *rv = json_object_get(msg, "role");
            snprintf(where, sizeof where, "[%zu].role must be system, developer, user or assistant%s", i,
                     !json_is_object(msg) ? ", got a message that is not an object"
                     : rv                  ? got(rv, what, sizeof what)
                                           : ", got none");
            return bad(e, "messages", "'%s'%s", where);
        }
        char *text = content_text(json_object_get(msg, "content"));
        if (!text) {
            json_t *cv = json_object_get(msg, "content");
            snprintf(where, sizeof where, "[%zu].content must be a string or an array of text parts%s", i,
                     cv ? got(cv, what, sizeof what) : ", got none");
            return bad(e, "messages", "'%s'%s", where);
        }
        j->msgs[j->n_msgs].role = roles[r].role;
        j->msgs[j->n_msgs++].content = text;
    }
    return 1;
}

static int parse_prompt(json_t *root, serve_job *j, perr *e)
{
    json_t *p = json_object_get(root, "prompt");
    if (json_is_array(p) && json_array_size(p) == 1 && json_is_string(json_array_get(p, 0)))
        p = json_array_get(p, 0); /* one prompt in a list */
    if (json_is_string(p)) {
        if (!*json_string_value(p))
            return bad(e, "prompt", "'%s' is empty%s", NULL);
        j->prompt_text = strdup(json_string_value(p));
        return j->prompt_text ? 1 : bad(e, "prompt", "'%s': out of memory%s", NULL);
    }
    if (!json_is_array(p) || json_array_size(p) == 0)
        return bad(e, "prompt", "'%s' must be a string or a non-empty array of token ids%s", NULL);
    j->n_prompt = json_array_size(p);
    j->prompt_ids = malloc(j->n_prompt * sizeof *j->prompt_ids);
    if (!j->prompt_ids)
        return bad(e, "prompt", "'%s': out of memory%s", NULL);
    size_t i;
    json_t *x;
    json_array_foreach(p, i, x) {
        if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) > INT32_MAX)
            return bad(e, "prompt", "'%s' must be a string or an array of token ids (one prompt: a list of "
                       "prompts is not supported)%s", NULL);
        j->prompt_ids[i] = (int32_t)json_integer_value(x);
    }
    return 1;
}

static int parse_stop(json_t *root, serve_job *j, perr *e)
{
    json_t *s = json_object_get(root, "stop");
    if (!s || json_is_null(s))
        return 1;
    json_t *one = json_is_string(s) ? s : NULL;
    size_t n = one ? 1 : json_is_array(s) ? json_array_size(s) : (size_t)-1;
    if (n == (size_t)-1 || n > SERVE_MAX_STOP_STRINGS)
        return bad(e, "stop", "'%s' must be a string or an array of at most 8 strings%s", NULL);
    for (size_t i = 0; i < n; i++) {
        json_t *x = one ? one : json_array_get(s, i);
        if (!json_is_string(x) || !*json_string_value(x))
            return bad(e, "stop", "'%s': every stop sequence must be a non-empty string%s", NULL);
        if (!(j->stop[j->n_stop] = strdup(json_string_value(x))))
            return bad(e, "stop", "'%s': out of memory%s", NULL);
        j->n_stop++;
    }
    return 1;
}

/* Fields dflash does not implement: refused rather than ignored, so a
 * client never gets something other than what it asked for; values that
 * ask for nothing pass (no tools, plain text, logprobs false). */
static int refuse_unsupported(json_t *root, perr *e)
{
    static const char *const absent[] = { "logit_bias", "suffix", "top_logprobs" }; /* null, {}, "" or 0 */
    for (size_t i = 0; i < sizeof absent / sizeof absent[0]; i++) {
        json_t *x = json_object_get(root, absent[i]);
        if (x && !json_is_null(x) && !(json_is_object(x) && json_object_size(x) == 0) &&
            !(json_is_string(x) && !*json_string_value(x)) && !(json_is_number(x) && json_number_value(x) == 0))
            return bad(e, absent[i], "'%s' is not supported%s", NULL);
    }
    json_t *echo = json_object_get(root, "echo"), *best = json_object_get(root, "best_of");
    if (echo && !json_is_null(echo) && !json_is_false(echo))
        return bad(e, "echo", "'%s' is not supported%s", NULL);
    if (best && !json_is_null(best) && !(json_is_number(best) && json_number_value(best) == 1))
        return bad(e, "best_of", "'%s' is not supported (only 1)%s", NULL);
    json_t *rf = json_object_get(root, "response_format"), *rft = json_object_get(rf, "type");
    if (rf && !json_is_null(rf) && !(json_is_string(rft) && !strcmp(json_string_value(rft), "text")))
        return bad(e, "response_format", "'%s' is not supported (only {\"type\": \"text\"})%s", NULL);
    json_t *tc = json_object_get(root, "tool_choice");
    if (tc && !json_is_null(tc) &&
        !(json_is_string(tc) && (!strcmp(json_string_value(tc), "none") || !strcmp(json_string_value(tc), "auto"))))
        return bad(e, "tool_choice", "'%s' is not supported (tools are not)%s", NULL);
    json_t *lp = json_object_get(root, "logprobs");
    if (lp && !json_is_null(lp) && !json_is_false(lp))
        return bad(e, "logprobs", "'%s' is not supported%s", NULL);
    json_t *tools = json_object_get(root, "tools");
    if (tools && !json_is_null(tools) && !(json_is_array(tools) && json_array_size(tools) == 0))
        return bad(e, "tools", "'%s' is not supported%s", NULL);
    return 1;
}

static int parse_fields(serve_ctx *c, json_t *root, serve_job *j, perr *e)
{
    const char *model = json_string_value(json_object_get(root, "model"));
    if (json_object_get(root, "model") && !json_is_null(json_object_get(root, "model")) &&
        (!model || strcmp(model, c->model_name) != 0)) {
        char want[300];
        snprintf(want, sizeof want, ": this server serves '%s'", c->model_name);
        return bad(e, "model", "'%s' names a model that is not served here%s", want);
    }
    long long n = 1, max_tokens = 0, top_k = j->so.top_k, seed = (long long)j->so.seed;
    if (!get_int(root, "n", 1, 1, &n, e) || !refuse_unsupported(root, e))
        return 0;
    if (!get_int(root, "max_tokens", 1, 1 << 30, &max_tokens, e) ||
        !get_int(root, "max_completion_tokens", 1, 1 << 30, &max_tokens, e) ||
        !get_num(root, "temperature", 0, 100, &j->so.temperature, e) ||
        !get_num(root, "top_p", 1e-9, 1, &j->so.top_p, e) || !get_int(root, "top_k", -1, 1 << 30, &top_k, e) ||
        !get_num(root, "min_p", 0, 1, &j->so.min_p, e) ||
        !get_num(root, "repetition_penalty", 1e-6, 100, &j->so.rep_penalty, e) ||
        !get_num(root, "frequency_penalty", -2, 2, &j->so.frequency_penalty, e) ||
        !get_num(root, "presence_penalty", -2, 2, &j->so.presence_penalty, e) ||
        !get_int(root, "seed", -(1LL << 62), 1LL << 62, &seed, e) || !get_bool(root, "stream", &j->stream, e) ||
        !get_bool(root, "ignore_eos", &j->so.ignore_eos, e) || !parse_stop(root, j, e))
        return 0;
    j->max_tokens = (int)max_tokens;
    j->so.top_k = top_k < 0 ? 0 : (int)top_k;
    j->so.seed = (uint64_t)seed;
    return get_sub_bool(root, "stream_options", "include_usage", "stream_options.include_usage", &j->include_usage,
                        e) &&
           get_sub_bool(root, "chat_template_kwargs", "enable_thinking", "chat_template_kwargs.enable_thinking",
                        &j->thinking, e);
}

serve_job *serve_job_from_json(serve_ctx *c, int chat, const char *body, size_t len, char *err, size_t cap,
                               const char **err_param)
{
    perr e = { err, cap, err_param };
    *err_param = NULL;
    json_error_t je;
    json_t *root = json_loadb(body, len, 0, &je);
    if (!root || !json_is_object(root)) {
        snprintf(err, cap, root ? "the request body must be a JSON object"
                                : "the request body is not valid JSON: %s (line %d, column %d)",
                 je.text, je.line, je.column);
        json_decref(root);
        return NULL;
    }
    serve_job *j = calloc(1, sizeof *j);
    if (!j) {
        snprintf(err, cap, "out of memory");
        json_decref(root);
        return NULL;
    }
    j->chat = chat;
    j->so = c->dflt;
    j->refs = 1;
    int ok = parse_fields(c, root, j, &e) && (chat ? parse_messages(root, j, &e) : parse_prompt(root, j, &e));
    json_decref(root);
    if (!ok) {
        serve_job_free(j);
        return NULL;
    }
    return j;
}

static json_t *usage_json(const serve_job *j)
{
    return json_pack("{s:i, s:i, s:i}", "prompt_tokens", j->prompt_tokens, "completion_tokens", (int)j->n_ids,
                     "total_tokens", j->prompt_tokens + (int)j->n_ids);
}

/* The envelope every response and chunk shares. */
static json_t *envelope(const serve_ctx *c, const serve_job *j, const char *object)
{
    return json_pack("{s:s, s:s, s:I, s:s}", "id", j->id, "object", object, "created", (json_int_t)j->created,
                     "model", c->model_name);
}

static char *dump(json_t *o)
{
    char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    return s;
}

char *serve_response_json(const serve_ctx *c, const serve_job *j)
{
    json_t *o = envelope(c, j, j->chat ? "chat.completion" : "text_completion");
    json_t *text = json_stringn(j->text ? j->text : "", j->text_len);
    json_t *choice = j->chat ? json_pack("{s:i, s:{s:s, s:o}, s:s}", "index", 0, "message", "role", "assistant",
                                         "content", text, "finish_reason", j->finish ? j->finish : "stop")
                             : json_pack("{s:i, s:o, s:n, s:s}", "index", 0, "text", text, "logprobs",
                                         "finish_reason", j->finish ? j->finish : "stop");
    json_object_set_new(o, "choices", json_pack("[o]", choice));
    json_object_set_new(o, "usage", usage_json(j));
    /* dflash's own: tokens committed per target step (tau) */
    json_object_set_new(o, "dflash", json_pack("{s:f, s:i}", "mean_accept", j->mean_accept, "steps", j->steps));
    return dump(o);
}

char *serve_chunk_sse(const serve_ctx *c, const serve_job *j, const char *delta, size_t len, int final, int usage)
{
    json_t *o = envelope(c, j, j->chat ? "chat.completion.chunk" : "text_completion");
    if (usage) {
        json_object_set_new(o, "choices", json_array());
        json_object_set_new(o, "usage", usage_json(j));
        json_object_set_new(o, "dflash", json_pack("{s:f, s:i}", "mean_accept", j->mean_accept, "steps", j->steps));
    } else {
        json_t *finish = final ? json_string(j->finish ? j->finish : "stop") : json_null();
        json_t *d;
        if (j->chat) {
            d = json_object();
            if (!final) {
                if (!delta) /* the first chunk names the role */
                    json_object_set_new(d, "role", json_string("assistant"));
                json_object_set_new(d, "content", json_stringn(delta ? delta : "", delta ? len : 0));
            }
        } else {
            d = json_stringn(delta ? delta : "", delta ? len : 0);
        }
        json_t *choice = j->chat ? json_pack("{s:i, s:o, s:o}", "index", 0, "delta", d, "finish_reason", finish)
                                 : json_pack("{s:i, s:o, s:n, s:o}", "index", 0, "text", d, "logprobs",
                                             "finish_reason", finish);
        json_object_set_new(o, "choices", json_pack("[o]", choice));
    }
    char *body = dump(o);
    if (!body)
        return NULL;
    size_t n = strlen(body);
    char *sse = malloc(n + 9);
    if (sse)
        snprintf(sse, n + 9, "data: %s\n\n", body);
    free(body);
    return sse;
}

char *serve_model_json(const serve_ctx *c, int list)
{
    json_t *m = json_pack("{s:s, s:s, s:i, s:s, s:i}", "id", c->model_name, "object", "model", "created", 0,
                          "owned_by", "dflash", "max_model_len", c->max_ctx);
    return dump(list && m ? json_pack("{s:s, s:[o]}", "object", "list", "data", m) : m);
}

char *serve_error_json(const char *message, const char *type, const char *param, const char *code)
{
    json_t *e = json_pack("{s:s, s:s, s:o, s:o}", "message", message, "type", type, "param",
                          param ? json_string(param) : json_null(), "code", code ? json_string(code) : json_null());
    return dump(json_pack("{s:o}", "error", e));
}
