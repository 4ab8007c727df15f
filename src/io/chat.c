/* chat.c: renders the Qwen3 chat format and reads the model's EOS ids (see
 * chat.h). Rendering is plain string building: the template's only logic
 * that matters for system/user/assistant turns is reproduced here, so no
 * Jinja engine is needed. */
#include "io/chat.h"

#include <errno.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/status.h"

dflash_chat_opts dflash_chat_default_opts(void)
{
    dflash_chat_opts o = { .thinking = 0, .add_generation_prompt = 1 };
    return o;
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
    FILE *f = fopen(path, "rb");
    if (!f) {
        if (errno == ENOENT)
            return DFLASH_OK;
        return dflash_fail(DFLASH_ERR_IO, "%s: %s", path, strerror(errno));
    }
    json_error_t je;
    *root = json_loadf(f, 0, &je);
    fclose(f);
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

dflash_status dflash_chat_eos_ids(const char *model_dir, const dflash_tokenizer *tok,
                                  int32_t *ids, size_t cap, size_t *n)
{
    *n = 0;
    if (!model_dir || !tok || !ids)
        return dflash_fail(DFLASH_ERR_INVALID_ARG, "chat eos: null argument");
    size_t plen = strlen(model_dir) + 64;
    char *p1 = malloc(plen), *p2 = malloc(plen);
    json_t *tc = NULL, *gc = NULL;
    dflash_status st = DFLASH_OK;
    if (!p1 || !p2) {
        st = dflash_fail(DFLASH_ERR_OOM, "chat eos: out of memory");
        goto done;
    }
    if ((st = load_optional(model_dir, "tokenizer_config.json", p1, plen, &tc)) ||
        (st = load_optional(model_dir, "generation_config.json", p2, plen, &gc)))
        goto done;
    if (!tc && !gc) {
        st = dflash_fail(DFLASH_ERR_NOT_FOUND, "%s: neither tokenizer_config.json nor "
                                               "generation_config.json exists",
                         model_dir);
        goto done;
    }
    if (tc) {
        json_t *e = json_object_get(tc, "eos_token");
        /* Older files spell it {"content": "...", ...}. */
        if (json_is_object(e))
            e = json_object_get(e, "content");
        if (json_is_string(e)) {
            int32_t id = dflash_tokenizer_token_id(tok, json_string_value(e));
            if (id < 0) {
                st = dflash_fail(DFLASH_ERR_NOT_FOUND, "%s: eos_token \"%s\" is not a token of %s",
                                 p1, json_string_value(e), dflash_tokenizer_label(tok));
                goto done;
            }
            if ((st = add_id(ids, cap, n, id, p1)))
                goto done;
        } else if (e && !json_is_null(e)) {
            st = dflash_fail(DFLASH_ERR_FORMAT, "%s: eos_token is neither a string nor an object",
                             p1);
            goto done;
        }
    }
    if (gc) {
        json_t *e = json_object_get(gc, "eos_token_id");
        if (json_is_integer(e)) {
            st = add_id(ids, cap, n, json_integer_value(e), p2);
        } else if (json_is_array(e)) {
            size_t i;
            json_t *v;
            json_array_foreach(e, i, v)
            {
                if (!json_is_integer(v)) {
                    st = dflash_fail(DFLASH_ERR_FORMAT, "%s: eos_token_id[%zu] is not an integer",
                                     p2, i);
                    goto done;
                }
                if ((st = add_id(ids, cap, n, json_integer_value(v), p2)))
                    goto done;
            }
        } else if (e && !json_is_null(e)) {
            st = dflash_fail(DFLASH_ERR_FORMAT, "%s: eos_token_id is neither an int nor a list", p2);
        }
        if (st)
            goto done;
    }
    if (*n == 0)
        st = dflash_fail(DFLASH_ERR_NOT_FOUND, "%s: no eos_token in tokenizer_config.json or "
                                               "eos_token_id in generation_config.json",
                         model_dir);
done:
    json_decref(tc);
    json_decref(gc);
    free(p1);
    free(p2);
    return st;
}
