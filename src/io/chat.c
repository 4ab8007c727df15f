/* chat.c: renders the chat formats (Qwen3, Llama 3), finds which one a
 * model uses, checks that a tokenizer has the format's markup tokens, and
 * reads the model's EOS ids (see chat.h). Rendering is plain string
 * building: the templates' only logic that matters for
 * system/user/assistant turns is reproduced here, so no Jinja engine is
 * needed. */
#include "io/chat.h"

#include <errno.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "core/file.h"
#include "core/status.h"

/* tokenizer_config.json can list every added token (a few MB at most). */
#define CHAT_MAX_FILE ((size_t)64 << 20)

dflash_chat_opts dflash_chat_default_opts(void)
{
    dflash_chat_opts o = { .format = DFLASH_CHAT_QWEN3, .thinking = 0, .add_generation_prompt = 1 };
    return o;
}

const char *dflash_chat_end_of_turn(dflash_chat_format f)
{
    return f == DFLASH_CHAT_LLAMA3 ? "<|eot_id|>" : "<|im_end|>";
}

const char *dflash_chat_turn_separator(dflash_chat_format f)
{
    return f == DFLASH_CHAT_LLAMA3 ? "" : "\n";
}

typedef struct {
    char *p;
    size_t n, cap;
    bool oom;
} sbuf;

static void sb_add(sbuf *b, const char *s, size_t n)
{
    if (b->oom)
        return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1)
            cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = true;
            return;
        }
        b->p = p, b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

static void sb_str(sbuf *b, const char *s)
{
    sb_add(b, s, strlen(s));
}

static const char *role_name(dflash_chat_role r)
{
    switch (r) {
    case DFLASH_CHAT_SYSTEM:
        return "system";
    case DFLASH_CHAT_USER:
        return "user";
    case DFLASH_CHAT_ASSISTANT:
        return "assistant";
    }
    return NULL;
}

/* Python's str.isspace() for one code point (what Jinja's trim strips). */
static bool py_space(uint32_t c)
{
    return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f ||
           c == 0x3000;
}

/* The code point of the UTF-8 sequence at s (n bytes available) and its
 * length; a malformed byte is itself (never white space). */
static uint32_t utf8_at(const unsigned char *s, size_t n, size_t *len)
{
    utf8proc_int32_t c;
    utf8proc_ssize_t k = utf8proc_iterate(s, (utf8proc_ssize_t)n, &c);
    if (k <= 0) {
        *len = 1;
        return 0xfffd;
    }
    *len = (size_t)k;
    return (uint32_t)c;
}

/* content without leading and trailing white space: [*b, *b + *n) */
static void py_strip(const char *c, const char **b, size_t *n)
{
    const unsigned char *s = (const unsigned char *)c;
    size_t len = strlen(c), i = 0, l;
    while (i < len && py_space(utf8_at(s + i, len - i, &l)))
        i += l;
    size_t end = len;
    while (end > i) {
        size_t j = end - 1; /* the start of the last code point */
        while (j > i && end - j < 4 && (s[j] & 0xc0) == 0x80)
            j--;
        uint32_t c = utf8_at(s + j, end - j, &l);
        if (j + l != end || !py_space(c))
            break;
        end = j;
    }
    *b = c + i;
    *n = end - i;
}

static dflash_status render_llama3(sbuf *b, const dflash_chat_msg *msgs, size_t n, const dflash_chat_opts *o)
{
    for (size_t i = 0; i < n; i++) {
        const char *role = role_name(msgs[i].role);
        if (!role)
            return dflash_fail(DFLASH_ERR_INVALID_ARG, "chat: message %zu has unknown role %d", i,
                               (int)msgs[i].role);
        if (i == 0 && !o->continuing)
            sb_str(b, "<|begin_of_text|>");
        const char *c;
        size_t len;
        py_strip(msgs[i].content ? msgs[i].content : "", &c, &len);
        sb_str(b, "<|start_header_id|>");
        sb_str(b, role);
        sb_str(b, "<|end_header_id|>\n\n");
        sb_add(b, c, len);
        sb_str(b, "<|eot_id|>");
    }
    if (o->add_generation_prompt)
        sb_str(b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
    return DFLASH_OK;
}

dflash_status dflash_chat_render(const dflash_chat_msg *msgs, size_t n,
                                 const dflash_chat_opts *opts, char **text, size_t *len)
{
    *text = NULL;
    *len = 0;
    dflash_chat_opts o = opts ? *opts : dflash_chat_default_opts();
    if (!msgs && n)
        return dflash_fail(DFLASH_ERR_INVALID_ARG, "chat: no messages given");
    sbuf b = { 0 };
    sb_add(&b, "", 0); /* an empty conversation still yields a string */
    if (o.format == DFLASH_CHAT_LLAMA3) {
        dflash_status st = render_llama3(&b, msgs, n, &o);
        if (st == DFLASH_OK && !b.oom) {
            *text = b.p;
            *len = b.n;
            return DFLASH_OK;
        }
        free(b.p);
        return st ? st : dflash_fail(DFLASH_ERR_OOM, "chat: out of memory");
    }
    for (size_t i = 0; i < n; i++) {
        const char *c = msgs[i].content ? msgs[i].content : "";
        switch (msgs[i].role) {
        case DFLASH_CHAT_SYSTEM:
            sb_str(&b, "<|im_start|>system\n");
            break;
        case DFLASH_CHAT_USER:
            sb_str(&b, "<|im_start|>user\n");
            break;
        case DFLASH_CHAT_ASSISTANT: {
            sb_str(&b, "<|im_start|>assistant\n");
            /* The template keeps only what follows the reasoning of an
             * earlier turn, without its leading newlines. */
            const char *end = NULL;
            for (const char *p = strstr(c, "</think>"); p; p = strstr(p + 1, "</think>"))
                end = p;
            if (end) {
                c = end + strlen("</think>");
                while (*c == '\n')
                    c++;
            }
            break;
        }
        default:
            free(b.p);
            return dflash_fail(DFLASH_ERR_INVALID_ARG, "chat: message %zu has unknown role %d",
                               i, (int)msgs[i].role);
        }
        sb_str(&b, c);
        sb_str(&b, "<|im_end|>\n");
    }
    if (o.add_generation_prompt) {
        sb_str(&b, "<|im_start|>assistant\n");
        if (!o.thinking)
            sb_str(&b, "<think>\n\n</think>\n\n");
    }
    if (b.oom) {
        free(b.p);
        return dflash_fail(DFLASH_ERR_OOM, "chat: out of memory");
    }
    *text = b.p;
    *len = b.n;
    return DFLASH_OK;
}

/* One piece of markup the renderer writes must reach the model as the single
 * added token it was trained on; as plain text it would be split into
 * pieces, and an end-of-turn token that does not exist can never stop
 * generation. */
static dflash_status check_markup(dflash_tokenizer *tok, const char *fmt, const char *markup, const char *role)
{
    int32_t *ids = NULL;
    size_t n = 0;
    DFLASH_TRY(dflash_tokenizer_encode(tok, markup, strlen(markup), &ids, &n));
    int32_t id = n == 1 ? ids[0] : -1;
    free(ids);
    if (id >= 0 && dflash_tokenizer_is_added(tok, id))
        return DFLASH_OK;
    return dflash_fail(DFLASH_ERR_UNSUPPORTED,
                       "%s: the %s chat format needs \"%s\" (%s) as one of the tokenizer's "
                       "added_tokens, but it is not one (it encodes as %zu plain token%s); this "
                       "tokenizer does not support chat",
                       dflash_tokenizer_label(tok), fmt, markup, role, n, n == 1 ? "" : "s");
}

dflash_status dflash_chat_check_tokenizer(dflash_tokenizer *tok, const dflash_chat_opts *opts)
{
    if (!tok)
        return dflash_fail(DFLASH_ERR_INVALID_ARG, "chat: no tokenizer given");
    dflash_chat_opts o = opts ? *opts : dflash_chat_default_opts();
    if (o.format == DFLASH_CHAT_LLAMA3) {
        DFLASH_TRY(check_markup(tok, "Llama 3", "<|begin_of_text|>", "it opens the conversation"));
        DFLASH_TRY(check_markup(tok, "Llama 3", "<|start_header_id|>", "it opens every turn's header"));
        DFLASH_TRY(check_markup(tok, "Llama 3", "<|end_header_id|>", "it closes every turn's header"));
        return check_markup(tok, "Llama 3", "<|eot_id|>", "it ends every turn");
    }
    DFLASH_TRY(check_markup(tok, "Qwen3", "<|im_start|>", "it opens every turn"));
    DFLASH_TRY(check_markup(tok, "Qwen3", "<|im_end|>", "it ends every turn"));
    if (o.add_generation_prompt && !o.thinking) {
        DFLASH_TRY(check_markup(tok, "Qwen3", "<think>", "the empty think block when thinking is off"));
        DFLASH_TRY(check_markup(tok, "Qwen3", "</think>", "the empty think block when thinking is off"));
    }
    return DFLASH_OK;
}

dflash_status dflash_chat_encode(dflash_tokenizer *tok, const dflash_chat_msg *msgs, size_t n,
                                 const dflash_chat_opts *opts, int32_t **ids, size_t *n_ids)
{
    *ids = NULL;
    *n_ids = 0;
    char *text;
    size_t len;
    DFLASH_TRY(dflash_chat_render(msgs, n, opts, &text, &len));
    dflash_status st = dflash_tokenizer_encode(tok, text, len, ids, n_ids);
    free(text);
    return st;
}

/* Load dir/name; *root = NULL (and OK) when the file does not exist. */
static dflash_status load_optional(const char *dir, const char *name, char *path, size_t cap,
                                   json_t **root)
{
    *root = NULL;
    snprintf(path, cap, "%s/%s", dir, name);
    char *text;
    size_t len;
    dflash_status s = dflash_read_file(path, CHAT_MAX_FILE, &text, &len);
    if (s == DFLASH_ERR_NOT_FOUND)
        return DFLASH_OK;
    DFLASH_TRY(s);
    json_error_t je;
    *root = json_loadb(text, len, 0, &je);
    /* HF writes an unbounded model_max_length as the integer 1e30, past
     * jansson's 64-bit integers: read such a file with every number as a
     * double (the ids read from it are checked to be whole numbers). */
    if (!*root && strstr(je.text, "too big integer"))
        *root = json_loadb(text, len, JSON_DECODE_INT_AS_REAL, &je);
    free(text);
    if (!*root)
        return dflash_fail(DFLASH_ERR_FORMAT, "%s: invalid JSON at line %d: %s", path, je.line,
                           je.text);
    return DFLASH_OK;
}

static dflash_status add_id(int32_t *ids, size_t cap, size_t *n, json_int_t id, const char *path)
{
    if (id < 0 || id > INT32_MAX)
        return dflash_fail(DFLASH_ERR_FORMAT, "%s: eos_token_id %lld is out of range", path,
                           (long long)id);
    for (size_t i = 0; i < *n; i++)
        if (ids[i] == (int32_t)id)
            return DFLASH_OK;
    if (*n == cap)
        return dflash_fail(DFLASH_ERR_INVALID_ARG, "%s: more than %zu EOS ids", path, cap);
    ids[(*n)++] = (int32_t)id;
    return DFLASH_OK;
}

/* tokenizer_config.json's eos_token, a token spelling looked up in tok. */
static dflash_status eos_from_token(const json_t *tc, const char *path, const dflash_tokenizer *tok,
                                    int32_t *ids, size_t cap, size_t *n)
{
    json_t *e = json_object_get(tc, "eos_token");
    /* Older files spell it {"content": "...", ...}. */
    if (json_is_object(e))
        e = json_object_get(e, "content");
    if (json_is_string(e)) {
        int32_t id = dflash_tokenizer_token_id(tok, json_string_value(e));
        if (id < 0)
            return dflash_fail(DFLASH_ERR_NOT_FOUND, "%s: eos_token \"%s\" is not a token of %s",
                               path, json_string_value(e), dflash_tokenizer_label(tok));
        return add_id(ids, cap, n, id, path);
    }
    if (e && !json_is_null(e))
        return dflash_fail(DFLASH_ERR_FORMAT, "%s: eos_token is neither a string nor an object",
                           path);
    return DFLASH_OK;
}

/* An integer, or a double holding a whole number in range (a file read
 * with JSON_DECODE_INT_AS_REAL, see load_optional). */
static bool whole_number(const json_t *v, json_int_t *out)
{
    if (json_is_integer(v)) {
        *out = json_integer_value(v);
        return true;
    }
    double d = json_is_real(v) ? json_real_value(v) : 0.5;
    if (!(d >= -2147483648.0 && d <= 2147483647.0) || d != (double)(long long)d)
        return false;
    *out = (json_int_t)d;
    return true;
}

/* The eos_token_id field (an int or a list of ints) of generation_config.json
 * or config.json; *named counts the ids it lists. */
static dflash_status eos_from_id_field(const json_t *root, const char *path, int32_t *ids,
                                       size_t cap, size_t *n, size_t *named)
{
    *named = 0;
    json_t *e = json_object_get(root, "eos_token_id");
    json_int_t id;
    if (whole_number(e, &id)) {
        *named = 1;
        return add_id(ids, cap, n, id, path);
    }
    if (json_is_array(e)) {
        size_t i;
        json_t *v;
        json_array_foreach(e, i, v)
        {
            if (!whole_number(v, &id))
                return dflash_fail(DFLASH_ERR_FORMAT, "%s: eos_token_id[%zu] is not an integer",
                                   path, i);
            DFLASH_TRY(add_id(ids, cap, n, id, path));
            (*named)++;
        }
        return DFLASH_OK;
    }
    if (e && !json_is_null(e))
        return dflash_fail(DFLASH_ERR_FORMAT, "%s: eos_token_id is neither an int nor a list",
                           path);
    return DFLASH_OK;
}

/* What a file said about field, for the message when no file named an id. */
static void eos_source_state(const json_t *root, const char *field, char *out, size_t cap)
{
    json_t *v = root ? json_object_get(root, field) : NULL;
    if (!root)
        snprintf(out, cap, "absent");
    else if (!v || json_is_null(v))
        snprintf(out, cap, "no %s", field);
    else
        snprintf(out, cap, "%s is empty", field);
}

dflash_status dflash_chat_eos_ids(const char *model_dir, const dflash_tokenizer *tok,
                                  int32_t *ids, size_t cap, size_t *n)
{
    *n = 0;
    if (!model_dir || !tok || !ids)
        return dflash_fail(DFLASH_ERR_INVALID_ARG, "chat eos: null argument");
    size_t plen = strlen(model_dir) + 64;
    char *p1 = malloc(plen), *p2 = malloc(plen), *p3 = malloc(plen);
    json_t *tc = NULL, *gc = NULL, *mc = NULL;
    dflash_status st = DFLASH_OK;
    if (!p1 || !p2 || !p3) {
        st = dflash_fail(DFLASH_ERR_OOM, "chat eos: out of memory");
        goto done;
    }
    if ((st = load_optional(model_dir, "tokenizer_config.json", p1, plen, &tc)) ||
        (st = load_optional(model_dir, "generation_config.json", p2, plen, &gc)))
        goto done;
    if (tc && (st = eos_from_token(tc, p1, tok, ids, cap, n)))
        goto done;
    size_t named = 0;
    if (gc && (st = eos_from_id_field(gc, p2, ids, cap, n, &named)))
        goto done;
    /* config.json's eos_token_id is what HF generation falls back to when
     * generation_config.json names none; a folder holding only config.json,
     * the weights and tokenizer.json is complete. */
    if (named == 0) {
        if ((st = load_optional(model_dir, "config.json", p3, plen, &mc)) ||
            (mc && (st = eos_from_id_field(mc, p3, ids, cap, n, &named))))
            goto done;
    }
    if (*n == 0) {
        char s1[48], s2[48], s3[48];
        eos_source_state(tc, "eos_token", s1, sizeof s1);
        eos_source_state(gc, "eos_token_id", s2, sizeof s2);
        eos_source_state(mc, "eos_token_id", s3, sizeof s3);
        st = dflash_fail(DFLASH_ERR_NOT_FOUND,
                         "%s: no file names an end-of-sequence token; looked at "
                         "tokenizer_config.json (%s), generation_config.json (%s) and "
                         "config.json (%s)",
                         model_dir, s1, s2, s3);
    }
done:
    json_decref(tc);
    json_decref(gc);
    json_decref(mc);
    free(p1);
    free(p2);
    free(p3);
    return st;
}

dflash_status dflash_chat_format_detect(const char *dir, const dflash_tokenizer *tok, dflash_chat_format *fmt)
{
    *fmt = DFLASH_CHAT_QWEN3;
    if (!dir || !tok)
        return dflash_fail(DFLASH_ERR_INVALID_ARG, "chat format: null argument");
    size_t plen = strlen(dir) + 32;
    char *path = malloc(plen);
    if (!path)
        return dflash_fail(DFLASH_ERR_OOM, "chat format: out of memory");
    json_t *tc = NULL;
    dflash_status st = load_optional(dir, "tokenizer_config.json", path, plen, &tc);
    if (st)
        goto done;
    /* a string, or a list of {"name", "template"} of which "default" is used */
    json_t *t = tc ? json_object_get(tc, "chat_template") : NULL;
    if (json_is_array(t)) {
        size_t i;
        json_t *v, *def = NULL;
        json_array_foreach(t, i, v)
        {
            json_t *name = json_object_get(v, "name");
            if (json_is_string(name) && !strcmp(json_string_value(name), "default"))
                def = json_object_get(v, "template");
        }
        t = def;
    }
    const char *tmpl = json_is_string(t) ? json_string_value(t) : NULL;
    if (!tmpl || !*tmpl) {
        /* no template: the tokenizer's markup decides */
        if (dflash_tokenizer_token_id(tok, "<|start_header_id|>") >= 0)
            *fmt = DFLASH_CHAT_LLAMA3;
    } else if (strstr(tmpl, "Cutting Knowledge Date")) {
        st = dflash_fail(DFLASH_ERR_UNSUPPORTED,
                         "%s: chat_template is a Llama 3.1+ template (a system block with a knowledge cutoff "
                         "and today's date, tool calling), which dflash does not render; give the prompt "
                         "already rendered with -p instead of --chat (its special tokens are parsed; "
                         "<|begin_of_text|> is added as the tokenizer says, so leave it out)",
                         path);
    } else if (strstr(tmpl, "<|start_header_id|>") && strstr(tmpl, "<|eot_id|>")) {
        *fmt = DFLASH_CHAT_LLAMA3;
    } else if (!strstr(tmpl, "<|im_start|>") || !strstr(tmpl, "<|im_end|>")) {
        st = dflash_fail(DFLASH_ERR_UNSUPPORTED,
                         "%s: chat_template uses neither Qwen3's markup (<|im_start|>, <|im_end|>) nor "
                         "Llama 3's (<|start_header_id|>, <|eot_id|>), the chat formats dflash renders; give "
                         "the prompt already rendered with -p instead of --chat",
                         path);
    }
done:
    json_decref(tc);
    free(path);
    return st;
}
