/* tokenizer.c: Hugging Face tokenizer.json byte-level BPE (see tokenizer.h
 * for what is supported). Owns: parsing tokenizer.json with jansson into
 * flat tables (id -> token bytes, token string -> id hash, (id, id) -> merge
 * hash), the encode pipeline (UTF-8 repair -> added-token split -> NFC ->
 * regex pre-split -> BPE per word with a small word cache), decode with the
 * ByteLevel rule, and the streaming decoder.
 *
 * Performance shape: everything is sized once at load (no rehashing, no
 * O(n^2)); encode allocates only when a buffer grows or a non-ASCII segment
 * is normalized. BPE runs on byte ids directly: the byte-to-unicode mapping
 * is only needed at load (to read vocab keys) and for ignore_merges. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "io/tokenizer.h"

#include "core/file.h"

#include <errno.h>
#include <jansson.h>
#include <pcre2.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <utf8proc.h>

#include "core/status.h"

/* ---- small helpers -------------------------------------------------------- */

/* Ids above this are refused: ids index flat arrays, and a hostile file must
 * not make us allocate gigabytes. Real vocabularies are below 300k. */
#define MAX_ID (1 << 24)
#define MAX_STEPS 8
#define MAX_TMPL_IDS 8 /* special tokens a post-processor template adds on each side */
/* Word cache: direct-mapped; words up to CACHE_WORD bytes giving up to
 * CACHE_IDS ids. Most pre-split words are short, so this catches nearly all
 * repeats in real text at ~1 MiB. */
#define CACHE_SLOTS 16384
#define CACHE_WORD 30
#define CACHE_IDS 8

static const char k_gpt2_regex[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

static uint64_t hash_bytes(const void *p, size_t n)
{
    /* FNV-1a, then a final mix so low bits are usable as a table index. */
    const unsigned char *s = p;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ s[i]) * 1099511628211ull;
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    return h;
}

static uint64_t mix64(uint64_t x)
{
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    x ^= x >> 31;
    return x;
}

static size_t pow2_at_least(size_t n)
{
    size_t c = 16;
    while (c < n)
        c <<= 1;
    return c;
}

/* Classify the UTF-8 at s[0..n) (n >= 1). >0: a complete valid character of
 * that many bytes. <0: invalid; -k is the length of the maximal subpart to
 * replace by one U+FFFD (Unicode's "substitution of maximal subparts", which
 * is what Rust's String::from_utf8_lossy, and so HF decode, does). 0: a
 * valid but incomplete prefix running to the end of the buffer. */
static int utf8_step(const unsigned char *s, size_t n)
{
    unsigned c = s[0];
    if (c < 0x80)
        return 1;
    int need;
    unsigned lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF)
        need = 1;
    else if (c == 0xE0)
        need = 2, lo = 0xA0;
    else if (c >= 0xE1 && c <= 0xEC)
        need = 2;
    else if (c == 0xED)
        need = 2, hi = 0x9F; /* no surrogates */
    else if (c >= 0xEE && c <= 0xEF)
        need = 2;
    else if (c == 0xF0)
        need = 3, lo = 0x90;
    else if (c >= 0xF1 && c <= 0xF3)
        need = 3;
    else if (c == 0xF4)
        need = 3, hi = 0x8F; /* nothing above U+10FFFF */
    else
        return -1;
    for (int i = 1; i <= need; i++) {
        if ((size_t)i >= n)
            return 0;
        if (s[i] < lo || s[i] > hi)
            return -i;
        lo = 0x80, hi = 0xBF;
    }
    return need + 1;
}

static const char k_fffd[3] = { (char)0xEF, (char)0xBF, (char)0xBD };

/* Growable byte buffer. */
typedef struct {
    char *p;
    size_t n, cap;
} buf;

static bool buf_reserve(buf *b, size_t extra)
{
    if (b->n + extra + 1 <= b->cap)
        return true;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < b->n + extra + 1)
        cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p)
        return false;
    b->p = p, b->cap = cap;
    return true;
}

static bool buf_add(buf *b, const void *s, size_t n)
{
    if (!buf_reserve(b, n))
        return false;
    if (n)
        memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
    return true;
}

/* Append s[0..n) to out with invalid UTF-8 replaced; returns how many bytes
 * of s were consumed: all of them, unless final is false and s ends in a
 * valid incomplete sequence, which is left for the caller to hold. */
static bool utf8_lossy_append(buf *out, const char *s, size_t n, bool final, size_t *consumed)
{
    if (n == 0) { /* s may be NULL then, and NULL + 0 is undefined */
        *consumed = 0;
        return buf_add(out, "", 0); /* still NUL-terminated */
    }
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0, run = 0; /* run: start of the pending valid stretch */
    while (i < n) {
        int r = utf8_step(u + i, n - i);
        if (r > 0) {
            i += (size_t)r;
            continue;
        }
        if (!buf_add(out, s + run, i - run))
            return false;
        if (r == 0) {
            if (!final) {
                *consumed = i;
                return true;
            }
            r = -(int)(n - i);
        }
        if (!buf_add(out, k_fffd, 3))
            return false;
        i += (size_t)-r;
        run = i;
    }
    if (!buf_add(out, s + run, i - run))
        return false;
    *consumed = n;
    return true;
}

/* Rust's char::is_whitespace (the White_Space property), used by the
 * lstrip/rstrip flags of added tokens. */
static bool is_white_space(utf8proc_int32_t c)
{
    return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
           c == 0x205F || c == 0x3000;
}

/* ---- the tokenizer ------------------------------------------------------- */

enum { ID_PRESENT = 1, ID_SPECIAL = 2, ID_ADDED = 4 };

typedef struct {
    char *content; /* raw for normalized=false, NFC'd for normalized=true */
    size_t len;
    int32_t id;
    bool lstrip, rstrip, normalized;
} added_token;

typedef struct {
    pcre2_code *re;
    bool removed; /* behavior Removed (else Isolated) */
    bool invert;
} split_step;

typedef struct {
    uint32_t hash;
    uint8_t wlen, nids;
    char word[CACHE_WORD];
    int32_t ids[CACHE_IDS];
} cache_slot;

typedef struct {
    uint32_t rank;
    int32_t pos;
} heap_item;

struct dflash_tokenizer {
    char *label;
    int32_t n_ids; /* max id + 1 */

    /* id -> bytes it decodes to, and id -> its spelling in the file (vocab
     * key or added content) for token_id(). Offsets index the arenas. */
    uint32_t *dec_off, *key_off; /* [n_ids + 1] */
    char *dec_bytes, *key_bytes;
    uint8_t *id_flags; /* [n_ids] ID_* */

    /* spelling -> id, open addressing, -1 = empty */
    int32_t *vhash;
    size_t vmask;

    /* (left id, right id) -> merge rank and merged id */
    uint64_t *mkey;
    uint32_t *mrank;
    int32_t *mnew;
    size_t mmask;
    size_t n_merges;

    int32_t byte_id[256]; /* vocab id of each single byte's symbol, -1 if none */
    int32_t unk_id;
    bool fuse_unk, ignore_merges;

    /* added tokens; by_first[b] lists indices whose content starts with byte
     * b, longest first, ending with -1 */
    added_token *added;
    size_t n_added;
    int32_t *by_first_pool;
    int32_t by_first[256]; /* start index into by_first_pool, -1 if none */
    bool any_normalized, any_raw;

    bool nfc;
    split_step steps[MAX_STEPS];
    int n_steps;

    /* post_processor TemplateProcessing, single template: the special ids
     * before and after the text (Llama 3: <|begin_of_text|> before) */
    int32_t tmpl_pre[MAX_TMPL_IDS], tmpl_post[MAX_TMPL_IDS];
    int n_tmpl_pre, n_tmpl_post;

    /* encode scratch */
    pcre2_match_data *md;
    pcre2_match_context *mctx;
    pcre2_jit_stack *jit_stack;
    cache_slot *cache;
    int32_t *sym, *prev, *next;
    heap_item *heap;
    size_t scratch_cap;
    buf mapped; /* ignore_merges: the word in its vocab spelling */
    /* encode output */
    int32_t *out;
    size_t out_n, out_cap;
    dflash_status err;
};

/* GPT-2 bytes_to_unicode: printable Latin-1 bytes map to themselves, the
 * other 68 bytes to U+0100.. in byte order, so every byte has a visible
 * character and vocab keys are valid UTF-8. */
static void byte_unicode_tables(uint32_t byte_to_cp[256], int16_t cp_to_byte[324])
{
    for (int i = 0; i < 324; i++)
        cp_to_byte[i] = -1;
    int n = 0;
    for (int b = 0; b < 256; b++) {
        bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
        byte_to_cp[b] = printable ? (uint32_t)b : (uint32_t)(256 + n++);
        cp_to_byte[byte_to_cp[b]] = (int16_t)b;
    }
}

static int32_t vocab_find(const dflash_tokenizer *t, const char *s, size_t n)
{
    if (!t->vhash)
        return -1;
    for (size_t i = hash_bytes(s, n) & t->vmask;; i = (i + 1) & t->vmask) {
        int32_t id = t->vhash[i];
        if (id < 0)
            return -1;
        size_t kn = t->key_off[id + 1] - t->key_off[id];
        if (kn == n && !memcmp(t->key_bytes + t->key_off[id], s, n))
            return id;
    }
}

static bool merge_find(const dflash_tokenizer *t, int32_t a, int32_t b, uint32_t *rank,
                       int32_t *id)
{
    uint64_t k = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    for (size_t i = mix64(k) & t->mmask;; i = (i + 1) & t->mmask) {
        if (t->mkey[i] == UINT64_MAX)
            return false;
        if (t->mkey[i] == k) {
            *rank = t->mrank[i];
            *id = t->mnew[i];
            return true;
        }
    }
}

void dflash_tokenizer_free(dflash_tokenizer *t)
{
    if (!t)
        return;
    free(t->label);
    free(t->dec_off);
    free(t->key_off);
    free(t->dec_bytes);
    free(t->key_bytes);
    free(t->id_flags);
    free(t->vhash);
    free(t->mkey);
    free(t->mrank);
    free(t->mnew);
    for (size_t i = 0; i < t->n_added; i++)
        free(t->added[i].content);
    free(t->added);
    free(t->by_first_pool);
    for (int i = 0; i < t->n_steps; i++)
        pcre2_code_free(t->steps[i].re);
    pcre2_match_data_free(t->md);
    pcre2_match_context_free(t->mctx);
    pcre2_jit_stack_free(t->jit_stack);
    free(t->cache);
    free(t->sym);
    free(t->prev);
    free(t->next);
    free(t->heap);
    free(t->mapped.p);
    free(t->out);
    free(t);
}

/* ---- loading -------------------------------------------------------------- */

static const char *type_of(const json_t *o)
{
    const char *s = json_string_value(json_object_get(o, "type"));
    return s ? s : "(none)";
}

/* Optional boolean field; absent or null gives def. */
static dflash_status get_bool(const json_t *o, const char *key, bool def, bool *out,
                              const char *label, const char *where)
{
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) {
        *out = def;
        return DFLASH_OK;
    }
    if (!json_is_boolean(v))
        return dflash_fail(DFLASH_ERR_FORMAT, "%s: %s.%s is not a boolean", label, where, key);
    *out = json_is_true(v);
    return DFLASH_OK;
}

/* ---- the Split regex in Oniguruma's dialect ------------------------------ *
 * Hugging Face compiles the pre-tokenizer regex with Oniguruma; we compile it
 * with PCRE2 (UTF + UCP). Escapes that both accept but read differently
 * would change the split silently, so these are rewritten into explicit
 * classes with Oniguruma's meaning before PCRE2 sees the pattern:
 *   \s \S, [:space:] [:^space:]  White_Space (PCRE2 adds U+180E MONGOLIAN
 *                                VOWEL SEPARATOR, which Unicode dropped)
 *   \h \H                        hex digit (PCRE2: horizontal space)
 *   \v                           U+000B only (PCRE2: vertical space)
 *   \V \Q \E                     the letter itself (PCRE2: not vertical
 *                                space; quoting)
 * Each is written as class items: bare inside a class ([^\s] stays one
 * negated class), wrapped in [...] outside one. Negations are explicit
 * complements, so they also work inside a negated class.
 * Still read differently, and left alone because the byte-level BPE
 * tokenizers this file supports do not use them: \w, \b and POSIX classes
 * other than [:space:] on some non-ASCII characters (combining marks,
 * connector punctuation), a bare \x, and ^ $ (Oniguruma: at every line).
 * Escapes that only one engine knows fail to compile, loudly. */

/* Growth bound: the longest item list is ~180 bytes for a 2-byte escape. A
 * tokenizer.json regex is a few hundred bytes; this refuses absurd ones
 * before they cost memory. */
#define MAX_REWRITTEN_PATTERN (1u << 20)

static const char k_ws_items[] = "\\x{9}-\\x{D}\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}"
                                 "\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}";
static const char k_not_ws_items[] = "\\x{0}-\\x{8}\\x{E}-\\x{1F}\\x{21}-\\x{84}\\x{86}-\\x{9F}"
                                     "\\x{A1}-\\x{167F}\\x{1681}-\\x{1FFF}\\x{200B}-\\x{2027}"
                                     "\\x{202A}-\\x{202E}\\x{2030}-\\x{205E}\\x{2060}-\\x{2FFF}"
                                     "\\x{3001}-\\x{10FFFF}";
static const char k_hex_items[] = "0-9A-Fa-f";
static const char k_not_hex_items[] =
    "\\x{0}-\\x{2F}\\x{3A}-\\x{40}\\x{47}-\\x{60}\\x{67}-\\x{10FFFF}";

/* The class items Oniguruma gives escape letter c, or NULL when PCRE2 agrees. */
static const char *onig_escape_items(char c)
{
    switch (c) {
    case 's': return k_ws_items;
    case 'S': return k_not_ws_items;
    case 'h': return k_hex_items;
    case 'H': return k_not_hex_items;
    case 'v': return "\\x{B}";
    case 'V': return "V";
    case 'Q': return "Q";
    case 'E': return "E";
    default: return NULL;
    }
}

/* At p[i] == '[' inside a class: the length of a POSIX class "[:name:]" or
 * "[:^name:]" there (0 if none), and in *items the rewrite of the ones whose
 * meaning differs (else NULL). */
static size_t onig_posix_class(const char *p, size_t n, size_t i, const char **items)
{
    *items = NULL;
    size_t j = i + 2;
    if (j < n && p[j] == '^')
        j++;
    while (j < n && ((p[j] >= 'a' && p[j] <= 'z') || (p[j] >= 'A' && p[j] <= 'Z')))
        j++;
    if (j + 1 >= n || p[j] != ':' || p[j + 1] != ']')
        return 0;
    size_t len = j + 2 - i;
    if (len == sizeof "[:space:]" - 1 && !memcmp(p + i, "[:space:]", len))
        *items = k_ws_items;
    else if (len == sizeof "[:^space:]" - 1 && !memcmp(p + i, "[:^space:]", len))
        *items = k_not_ws_items;
    return len;
}

/* Rewrite p[0..n) into out (see above). Tracks only what decides how an
 * escape is read: backslash pairs (so "\\s" stays a backslash and an s),
 * (?#...) comments, and whether we are inside a class (where a ']' right
 * after '[' or '[^' is literal). */
static bool onig_compat_pattern(const char *p, size_t n, buf *out)
{
    bool in_class = false;
    size_t class_body = 0; /* index of the first char of the class body */
    size_t i = 0;
    while (i < n) {
        char c = p[i];
        size_t len = 1;
        const char *items = NULL;
        if (c == '\\' && i + 1 < n) {
            items = onig_escape_items(p[i + 1]);
            len = 2;
        } else if (in_class && c == '[' && i + 1 < n && p[i + 1] == ':') {
            size_t pl = onig_posix_class(p, n, i, &items);
            len = pl ? pl : 1;
        } else if (in_class && c == ']' && i > class_body) {
            in_class = false;
        } else if (!in_class && c == '[') {
            in_class = true;
            class_body = i + 1;
            if (class_body < n && p[class_body] == '^')
                class_body++;
        } else if (!in_class && c == '(' && n - i >= 3 && p[i + 1] == '?' && p[i + 2] == '#') {
            const char *e = memchr(p + i, ')', n - i);
            len = e ? (size_t)(e + 1 - (p + i)) : n - i;
        }
        bool ok;
        if (items && in_class)
            ok = buf_add(out, items, strlen(items));
        else if (items)
            ok = buf_add(out, "[", 1) && buf_add(out, items, strlen(items)) && buf_add(out, "]", 1);
        else
            ok = buf_add(out, p + i, len);
        if (!ok || out->n > MAX_REWRITTEN_PATTERN)
            return false;
        i += len;
    }
    return buf_add(out, "", 0); /* an empty pattern still gets a buffer */
}

static dflash_status add_regex_step(dflash_tokenizer *t, const char *pat, size_t n, bool literal,
                                    bool removed, bool invert, const char *label)
{
    if (t->n_steps == MAX_STEPS)
        return dflash_fail(DFLASH_ERR_UNSUPPORTED, "%s: more than %d pre-tokenizer splits",
                           label, MAX_STEPS);
    buf onig = { 0 };
    if (!literal && !onig_compat_pattern(pat, n, &onig)) {
        free(onig.p);
        return onig.n > MAX_REWRITTEN_PATTERN
                   ? dflash_fail(DFLASH_ERR_UNSUPPORTED,
                                 "%s: pre_tokenizer Split pattern of %zu bytes is too long once "
                                 "its \\s-style escapes are spelled out (more than %u bytes)",
                                 label, n, MAX_REWRITTEN_PATTERN)
                   : dflash_fail(DFLASH_ERR_OOM, "%s: out of memory", label);
    }
    int ec;
    PCRE2_SIZE eo;
    uint32_t opt = PCRE2_UTF | PCRE2_UCP | (literal ? PCRE2_LITERAL : 0);
    pcre2_code *re = literal ? pcre2_compile((PCRE2_SPTR)pat, n, opt, &ec, &eo, NULL)
                             : pcre2_compile((PCRE2_SPTR)onig.p, onig.n, opt, &ec, &eo, NULL);
    free(onig.p);
    if (!re && !literal) {
        /* Report the error against the pattern as the file spells it; if
         * only the rewritten one fails, say so. */
        int ec_rewritten = ec;
        pcre2_code *orig = pcre2_compile((PCRE2_SPTR)pat, n, opt, &ec, &eo, NULL);
        if (orig) {
            pcre2_code_free(orig);
            PCRE2_UCHAR msg[160];
            pcre2_get_error_message(ec_rewritten, msg, sizeof msg);
            return dflash_fail(DFLASH_ERR_UNSUPPORTED,
                               "%s: pre_tokenizer Split pattern does not compile once its "
                               "\\s-style escapes are spelled out as Oniguruma reads them: %s",
                               label, (const char *)msg);
        }
    }
    if (!re) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(ec, msg, sizeof msg);
        return dflash_fail(DFLASH_ERR_FORMAT,
                           "%s: pre_tokenizer Split pattern does not compile at offset %zu: %s",
                           label, (size_t)eo, (const char *)msg);
    }
    /* JIT is an optimisation only: if unavailable, the interpreter is used. */
    (void)pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);
    split_step *s = &t->steps[t->n_steps++];
    s->re = re;
    s->removed = removed;
    s->invert = invert;
    return DFLASH_OK;
}

/* A section parser: normalizer, pre_tokenizer, decoder or post_processor. */
typedef dflash_status (*section_fn)(dflash_tokenizer *t, const json_t *o, const char *label, int depth);

/* A section of type Sequence: every entry of its list `key` through `fn`,
 * one level deeper (callers stop nesting at 4). `what` names the section
 * in messages; `need_entries`: an empty list is an error too. */
static dflash_status parse_sequence(dflash_tokenizer *t, const json_t *o, const char *what, const char *key,
                                    int need_entries, section_fn fn, const char *label, int depth)
{
    json_t *arr = json_object_get(o, key);
    if (!json_is_array(arr) || (need_entries && json_array_size(arr) == 0))
        return dflash_fail(DFLASH_ERR_FORMAT, "%s: %s Sequence lacks '%s'", label, what, key);
    size_t i;
    json_t *e;
    json_array_foreach(arr, i, e) DFLASH_TRY(fn(t, e, label, depth + 1));
    return DFLASH_OK;
}

static dflash_status parse_normalizer(dflash_tokenizer *t, const json_t *n, const char *label,
                                      int depth)
{
    if (!n || json_is_null(n))
        return DFLASH_OK;
    const char *type = type_of(n);
    if (!strcmp(type, "NFC")) {
        t->nfc = true;
        return DFLASH_OK;
    }
    if (!strcmp(type, "Sequence") && depth < 4)
        return parse_sequence(t, n, "normalizer", "normalizers", 0, parse_normalizer, label, depth);
    return dflash_fail(DFLASH_ERR_UNSUPPORTED,
                       "%s: normalizer type '%s' is not supported (only NFC or a Sequence of NFC)",
                       label, type);
}

static dflash_status parse_pre_tokenizer(dflash_tokenizer *t, const json_t *p, const char *label,
                                         int depth)
{
    if (!p || json_is_null(p))
        return DFLASH_OK;
    const char *type = type_of(p);
    if (!strcmp(type, "Sequence") && depth < 4)
        return parse_sequence(t, p, "pre_tokenizer", "pretokenizers", 0, parse_pre_tokenizer, label, depth);
    if (!strcmp(type, "ByteLevel")) {
        bool aps, use_regex = true;
        json_t *a = json_object_get(p, "add_prefix_space");
        if (!json_is_boolean(a))
            return dflash_fail(DFLASH_ERR_FORMAT,
                               "%s: pre_tokenizer ByteLevel lacks boolean add_prefix_space", label);
        aps = json_is_true(a);
        if (aps)
            return dflash_fail(DFLASH_ERR_UNSUPPORTED,
                               "%s: pre_tokenizer ByteLevel with add_prefix_space=true is not "
                               "supported",
                               label);
        /* HF's default for a missing use_regex is true. */
        DFLASH_TRY(get_bool(p, "use_regex", true, &use_regex, label, "pre_tokenizer.ByteLevel"));
        if (use_regex)
            DFLASH_TRY(add_regex_step(t, k_gpt2_regex, sizeof k_gpt2_regex - 1, false, false,
                                      false, label));
        /* The byte mapping itself is implicit: BPE works on byte ids. */
        return DFLASH_OK;
    }
    if (!strcmp(type, "Split")) {
        json_t *pat = json_object_get(p, "pattern");
        json_t *rx = json_object_get(pat, "Regex"), *lit = json_object_get(pat, "String");
        json_t *ps = rx ? rx : lit;
        if (!json_is_string(ps))
            return dflash_fail(DFLASH_ERR_FORMAT,
                               "%s: pre_tokenizer Split pattern is neither {\"Regex\": ..} nor "
                               "{\"String\": ..}",
                               label);
        const char *beh = json_string_value(json_object_get(p, "behavior"));
        if (!beh)
            return dflash_fail(DFLASH_ERR_FORMAT, "%s: pre_tokenizer Split lacks 'behavior'",
                               label);
        bool removed;
        if (!strcmp(beh, "Isolated"))
            removed = false;
        else if (!strcmp(beh, "Removed"))
            removed = true;
        else
            return dflash_fail(DFLASH_ERR_UNSUPPORTED,
                               "%s: pre_tokenizer Split behavior '%s' is not supported (Isolated, "
                               "Removed)",
                               label, beh);
        bool invert = false;
        DFLASH_TRY(get_bool(p, "invert", false, &invert, label, "pre_tokenizer.Split"));
        return add_regex_step(t, json_string_value(ps), json_string_length(ps), !rx, removed,
                              invert, label);
    }
    return dflash_fail(DFLASH_ERR_UNSUPPORTED,
                       "%s: pre_tokenizer type '%s' is not supported (Split, ByteLevel, Sequence)",
                       label, type);
}

static dflash_status parse_decoder(dflash_tokenizer *t, const json_t *d, const char *label, int depth)
{
    if (!d || json_is_null(d))
        return dflash_fail(DFLASH_ERR_UNSUPPORTED,
                           "%s: no decoder given; only the ByteLevel decoder is supported", label);
    const char *type = type_of(d);
    if (!strcmp(type, "ByteLevel"))
        return DFLASH_OK;
    if (!strcmp(type, "Sequence") && depth < 4)
        return parse_sequence(t, d, "decoder", "decoders", 1, parse_decoder, label, depth);
    return dflash_fail(DFLASH_ERR_UNSUPPORTED,
                       "%s: decoder type '%s' is not supported (only ByteLevel)", label, type);
}

/* TemplateProcessing's `single` template: special tokens around the one
 * sequence "A" (a pair template is never used: there is one text). Their
 * ids come from the processor's own special_tokens table, as HF reads them. */
static dflash_status parse_template(dflash_tokenizer *t, const json_t *p, const char *label)
{
    const json_t *single = json_object_get(p, "single"), *specials = json_object_get(p, "special_tokens");
    if (!json_is_array(single))
        return dflash_fail(DFLASH_ERR_FORMAT, "%s: post_processor TemplateProcessing lacks a 'single' list", label);
    if (t->n_tmpl_pre || t->n_tmpl_post)
        return dflash_fail(DFLASH_ERR_UNSUPPORTED, "%s: more than one post_processor TemplateProcessing", label);
    int seen_a = 0;
    size_t i;
    json_t *item;
    json_array_foreach(single, i, item)
    {
        const json_t *seq = json_object_get(item, "Sequence"), *sp = json_object_get(item, "SpecialToken");
        if (seq) {
            const char *id = json_string_value(json_object_get(seq, "id"));
            if (!id || strcmp(id, "A") != 0 || seen_a)
                return dflash_fail(DFLASH_ERR_UNSUPPORTED, "%s: post_processor TemplateProcessing: 'single' "
                                   "item %zu is sequence '%s'; only one sequence, A, is supported", label, i,
                                   id ? id : "?");
            seen_a = 1;
            continue;
        }
        const char *name = json_string_value(json_object_get(sp, "id"));
        const json_t *ids = name ? json_object_get(json_object_get(specials, name), "ids") : NULL;
        if (!json_is_array(ids))
            return dflash_fail(DFLASH_ERR_FORMAT, "%s: post_processor TemplateProcessing: 'single' item %zu is "
                               "neither a sequence nor a special token listed in special_tokens", label, i);
        size_t k;
        json_t *v;
        json_array_foreach(ids, k, v)
        {
            int *n = seen_a ? &t->n_tmpl_post : &t->n_tmpl_pre;
            int32_t *dst = seen_a ? t->tmpl_post : t->tmpl_pre;
            if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= MAX_ID)
                return dflash_fail(DFLASH_ERR_FORMAT, "%s: post_processor special token '%s' has an id outside "
                                   "[0, %d)", label, name, MAX_ID);
            if (*n == MAX_TMPL_IDS)
                return dflash_fail(DFLASH_ERR_UNSUPPORTED, "%s: post_processor TemplateProcessing adds more than "
                                   "%d tokens on a side", label, MAX_TMPL_IDS);
            dst[(*n)++] = (int32_t)json_integer_value(v);
        }
    }
    if (!seen_a)
        return dflash_fail(DFLASH_ERR_FORMAT, "%s: post_processor TemplateProcessing: 'single' has no sequence A",
                           label);
    return DFLASH_OK;
}

/* The post-processor runs after encoding: ByteLevel (offsets only) changes
 * no ids; TemplateProcessing adds special tokens around the text when the
 * caller asks for them (dflash_tokenizer_encode_special, HF's
 * add_special_tokens). Other kinds are refused: ignoring one would hand
 * the model prompts without tokens it was trained to see. */
static dflash_status parse_post_processor(dflash_tokenizer *t, const json_t *p, const char *label, int depth)
{
    if (!p || json_is_null(p))
        return DFLASH_OK;
    const char *type = type_of(p);
    if (!strcmp(type, "ByteLevel"))
        return DFLASH_OK;
    if (!strcmp(type, "TemplateProcessing"))
        return parse_template(t, p, label);
    if (!strcmp(type, "Sequence") && depth < 4)
        return parse_sequence(t, p, "post_processor", "processors", 0, parse_post_processor, label, depth);
    return dflash_fail(DFLASH_ERR_UNSUPPORTED,
                       "%s: post_processor type '%s' is not supported (ByteLevel, TemplateProcessing, Sequence)",
                       label, type);
}

/* The bytes a token spelling decodes to under HF's ByteLevel decoder: every
 * character mapped back to its byte, or, if any character is not one of
 * the 256 byte characters, the spelling's own UTF-8 unchanged. */
static size_t spelling_to_bytes(const char *s, size_t n, const int16_t cp_to_byte[324], char *out)
{
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        utf8proc_int32_t cp;
        utf8proc_ssize_t r = utf8proc_iterate((const utf8proc_uint8_t *)s + i, (utf8proc_ssize_t)(n - i), &cp);
        if (r <= 0 || cp < 0 || cp >= 324 || cp_to_byte[cp] < 0) {
            memcpy(out, s, n);
            return n;
        }
        out[o++] = (char)cp_to_byte[cp];
        i += (size_t)r;
    }
    return o;
}

/* Two added_tokens entries may not share an id or a content: HF keeps one
 * of them silently, so the file would mean something other than it says.
 * Entries are validated (integer id, non-empty string content) before this
 * runs. O(n) with two small open-addressing tables of entry indices. */
static dflash_status check_added_unique(const json_t *added, size_t n_added, const char *label)
{
    if (n_added < 2)
        return DFLASH_OK;
    size_t cap = pow2_at_least(2 * n_added + 1), mask = cap - 1;
    size_t *by_id = malloc(cap * sizeof *by_id), *by_content = malloc(cap * sizeof *by_content);
    dflash_status st = DFLASH_OK;
    if (!by_id || !by_content) {
        st = dflash_fail(DFLASH_ERR_OOM, "%s: out of memory", label);
        goto done;
    }
    memset(by_id, 0xff, cap * sizeof *by_id);
    memset(by_content, 0xff, cap * sizeof *by_content);
    for (size_t i = 0; i < n_added; i++) {
        const json_t *a = json_array_get(added, i), *c = json_object_get(a, "content");
        json_int_t id = json_integer_value(json_object_get(a, "id"));
        const char *s = json_string_value(c);
        size_t len = json_string_length(c);
        size_t h = mix64((uint64_t)id) & mask;
        for (; by_id[h] != SIZE_MAX; h = (h + 1) & mask) {
            const json_t *b = json_array_get(added, by_id[h]);
            if (json_integer_value(json_object_get(b, "id")) == id) {
                st = dflash_fail(DFLASH_ERR_FORMAT,
                                 "%s: added_tokens[%zu] (\"%.40s\") and added_tokens[%zu] "
                                 "(\"%.40s\") both have id %lld",
                                 label, by_id[h], json_string_value(json_object_get(b, "content")),
                                 i, s, (long long)id);
                goto done;
            }
        }
        by_id[h] = i;
        for (h = hash_bytes(s, len) & mask; by_content[h] != SIZE_MAX; h = (h + 1) & mask) {
            const json_t *b = json_array_get(added, by_content[h]);
            const json_t *bc = json_object_get(b, "content");
            if (json_string_length(bc) == len && !memcmp(json_string_value(bc), s, len)) {
                st = dflash_fail(DFLASH_ERR_FORMAT,
                                 "%s: added_tokens[%zu] (id %lld) and added_tokens[%zu] (id %lld) "
                                 "both have content \"%.40s\"",
                                 label, by_content[h],
                                 (long long)json_integer_value(json_object_get(b, "id")), i,
                                 (long long)id, s);
                goto done;
            }
        }
        by_content[h] = i;
    }
done:
    free(by_id);
    free(by_content);
    return st;
}

/* Entry of the id table under construction. */
typedef struct {
    const char *key;
    size_t len;
} spelling;

static dflash_status build(dflash_tokenizer *t, json_t *root)
{
    const char *label = t->label;
    if (!json_is_object(root))
        return dflash_fail(DFLASH_ERR_FORMAT, "%s: top level is not a JSON object", label);

    /* -- model -- */
    json_t *model = json_object_get(root, "model");
    if (!json_is_object(model))
        return dflash_fail(DFLASH_ERR_FORMAT, "%s: no 'model' object", label);
    json_t *mt = json_object_get(model, "type");
    if (mt && !(json_is_string(mt) && !strcmp(json_string_value(mt), "BPE")))
        return dflash_fail(DFLASH_ERR_UNSUPPORTED,
                           "%s: model type '%s' is not supported (only BPE)", label,
                           json_is_string(mt) ? json_string_value(mt) : "(not a string)");
    json_t *vocab = json_object_get(model, "vocab"), *merges = json_object_get(model, "merges");
    if (!json_is_object(vocab))
        return dflash_fail(DFLASH_ERR_FORMAT, "%s: model.vocab is not an object", label);
    if (!json_is_array(merges))
        return dflash_fail(DFLASH_ERR_FORMAT, "%s: model.merges is not an array", label);
    json_t *dropout = json_object_get(model, "dropout");
    if (dropout && !json_is_null(dropout) && !(json_is_number(dropout) && json_number_value(dropout) == 0.0))
        return dflash_fail(DFLASH_ERR_UNSUPPORTED, "%s: BPE dropout is not supported", label);
    const char *opt_str[] = { "continuing_subword_prefix", "end_of_word_suffix" };
    for (int i = 0; i < 2; i++) {
        json_t *v = json_object_get(model, opt_str[i]);
        if (v && !json_is_null(v) && !(json_is_string(v) && json_string_length(v) == 0))
            return dflash_fail(DFLASH_ERR_UNSUPPORTED, "%s: BPE %s is not supported", label,
                               opt_str[i]);
    }
    bool byte_fallback = false;
    DFLASH_TRY(get_bool(model, "byte_fallback", false, &byte_fallback, label, "model"));
    if (byte_fallback)
        return dflash_fail(DFLASH_ERR_UNSUPPORTED, "%s: BPE byte_fallback=true is not supported",
                           label);
    DFLASH_TRY(get_bool(model, "fuse_unk", false, &t->fuse_unk, label, "model"));
    DFLASH_TRY(get_bool(model, "ignore_merges", false, &t->ignore_merges, label, "model"));

    /* -- the other sections: fail on unsupported features before the heavy work -- */
    DFLASH_TRY(parse_normalizer(t, json_object_get(root, "normalizer"), label, 0));
    DFLASH_TRY(parse_pre_tokenizer(t, json_object_get(root, "pre_tokenizer"), label, 0));
    DFLASH_TRY(parse_decoder(t, json_object_get(root, "decoder"), label, 0));
    DFLASH_TRY(parse_post_processor(t, json_object_get(root, "post_processor"), label, 0));

    json_t *added = json_object_get(root, "added_tokens");
    if (added && !json_is_null(added) && !json_is_array(added))
        return dflash_fail(DFLASH_ERR_FORMAT, "%s: added_tokens is not an array", label);
    size_t n_added = json_is_array(added) ? json_array_size(added) : 0;

    /* -- id range -- */
    size_t n_vocab = json_object_size(vocab);
    int64_t max_id = -1;
    const char *key;
    size_t klen;
    json_t *val;
    json_object_keylen_foreach(vocab, key, klen, val)
    {
        if (!json_is_integer(val) || json_integer_value(val) < 0 || json_integer_value(val) >= MAX_ID)
            return dflash_fail(DFLASH_ERR_FORMAT,
                               "%s: model.vocab entry \"%.40s\" has no id in [0, %d)", label, key,
                               MAX_ID);
        if (json_integer_value(val) > max_id)
            max_id = json_integer_value(val);
    }
    for (size_t i = 0; i < n_added; i++) {
        json_t *a = json_array_get(added, i);
        json_t *id = json_object_get(a, "id");
        if (!json_is_object(a) || !json_is_integer(id) || json_integer_value(id) < 0 ||
            json_integer_value(id) >= MAX_ID || !json_is_string(json_object_get(a, "content")) ||
            json_string_length(json_object_get(a, "content")) == 0)
            return dflash_fail(DFLASH_ERR_FORMAT,
                               "%s: added_tokens[%zu] lacks a valid id or non-empty content",
                               label, i);
        if (json_integer_value(id) > max_id)
            max_id = json_integer_value(id);
    }
    DFLASH_TRY(check_added_unique(added, n_added, label));
    if (max_id < 0)
        return dflash_fail(DFLASH_ERR_FORMAT, "%s: the vocabulary is empty", label);
    size_t n_ids = (size_t)max_id + 1;
    t->n_ids = (int32_t)n_ids;

    /* -- id table: spellings from vocab, then added tokens (which win, as in HF) -- */
    spelling *sp = calloc(n_ids, sizeof *sp);
    t->id_flags = calloc(n_ids, 1);
    if (!sp || !t->id_flags) {
        free(sp);
        return dflash_fail(DFLASH_ERR_OOM, "%s: out of memory for %zu ids", label, n_ids);
    }
    dflash_status st = DFLASH_OK;
    size_t key_total = 0;
    json_object_keylen_foreach(vocab, key, klen, val)
    {
        size_t id = (size_t)json_integer_value(val);
        if (t->id_flags[id]) {
            st = dflash_fail(DFLASH_ERR_FORMAT, "%s: model.vocab id %zu is used twice", label, id);
            goto done_sp;
        }
        t->id_flags[id] = ID_PRESENT;
        sp[id].key = key, sp[id].len = klen;
        key_total += klen;
    }
    t->added = calloc(n_added ? n_added : 1, sizeof *t->added);
    if (!t->added) {
        st = dflash_fail(DFLASH_ERR_OOM, "%s: out of memory", label);
        goto done_sp;
    }
    for (size_t i = 0; i < n_added; i++) {
        json_t *a = json_array_get(added, i), *c = json_object_get(a, "content");
        size_t id = (size_t)json_integer_value(json_object_get(a, "id"));
        bool special = false, single_word = false;
        added_token *at = &t->added[t->n_added];
        if ((st = get_bool(a, "special", false, &special, label, "added_tokens[]")) ||
            (st = get_bool(a, "single_word", false, &single_word, label, "added_tokens[]")) ||
            (st = get_bool(a, "lstrip", false, &at->lstrip, label, "added_tokens[]")) ||
            (st = get_bool(a, "rstrip", false, &at->rstrip, label, "added_tokens[]")) ||
            (st = get_bool(a, "normalized", !special, &at->normalized, label, "added_tokens[]")))
            goto done_sp;
        if (single_word) {
            st = dflash_fail(DFLASH_ERR_UNSUPPORTED,
                             "%s: added token \"%.40s\" has single_word=true, which is not "
                             "supported",
                             label, json_string_value(c));
            goto done_sp;
        }
        /* may over-count an id shared with the vocab; harmless */
        key_total += json_string_length(c);
        sp[id].key = json_string_value(c), sp[id].len = json_string_length(c);
        t->id_flags[id] |= ID_PRESENT | ID_ADDED | (special ? ID_SPECIAL : 0);
        if (at->normalized && t->nfc) {
            /* Matching happens on normalized text, so normalize the content. */
            utf8proc_uint8_t *nf = NULL;
            utf8proc_ssize_t nl = utf8proc_map((const utf8proc_uint8_t *)sp[id].key,
                                               (utf8proc_ssize_t)sp[id].len, &nf,
                                               UTF8PROC_STABLE | UTF8PROC_COMPOSE);
            if (nl < 0) {
                st = dflash_fail(DFLASH_ERR_FORMAT, "%s: added_tokens[%zu] is not valid UTF-8",
                                 label, i);
                goto done_sp;
            }
            at->content = (char *)nf, at->len = (size_t)nl;
        } else {
            at->content = malloc(sp[id].len);
            if (!at->content) {
                st = dflash_fail(DFLASH_ERR_OOM, "%s: out of memory", label);
                goto done_sp;
            }
            memcpy(at->content, sp[id].key, sp[id].len);
            at->len = sp[id].len;
        }
        at->id = (int32_t)id;
        if (at->len)
            t->n_added++;
        else
            free(at->content);
        if (at->normalized)
            t->any_normalized = true;
        else
            t->any_raw = true;
    }

    /* -- arenas: spelling and decoded bytes per id (decoded is never longer) -- */
    uint32_t byte_to_cp[256];
    int16_t cp_to_byte[324];
    byte_unicode_tables(byte_to_cp, cp_to_byte);
    if (key_total >= UINT32_MAX) {
        st = dflash_fail(DFLASH_ERR_FORMAT, "%s: vocabulary too large", label);
        goto done_sp;
    }
    t->key_off = malloc((n_ids + 1) * sizeof *t->key_off);
    t->dec_off = malloc((n_ids + 1) * sizeof *t->dec_off);
    t->key_bytes = malloc(key_total + 1);
    t->dec_bytes = malloc(key_total + 1);
    size_t vcap = pow2_at_least(2 * (n_vocab + n_added) + 1);
    t->vhash = malloc(vcap * sizeof *t->vhash);
    if (!t->key_off || !t->dec_off || !t->key_bytes || !t->dec_bytes || !t->vhash) {
        st = dflash_fail(DFLASH_ERR_OOM, "%s: out of memory", label);
        goto done_sp;
    }
    memset(t->vhash, 0xff, vcap * sizeof *t->vhash);
    t->vmask = vcap - 1;
    size_t ko = 0, dofs = 0;
    for (size_t id = 0; id < n_ids; id++) {
        t->key_off[id] = (uint32_t)ko, t->dec_off[id] = (uint32_t)dofs;
        if (!sp[id].key)
            continue;
        memcpy(t->key_bytes + ko, sp[id].key, sp[id].len);
        dofs += spelling_to_bytes(sp[id].key, sp[id].len, cp_to_byte, t->dec_bytes + dofs);
        ko += sp[id].len;
    }
    t->key_off[n_ids] = (uint32_t)ko, t->dec_off[n_ids] = (uint32_t)dofs;
    for (size_t id = 0; id < n_ids; id++) {
        if (!sp[id].key)
            continue;
        /* First spelling wins; an added token whose content equals another
         * id's spelling keeps the lower id, as a lookup would find it first. */
        if (vocab_find(t, sp[id].key, sp[id].len) >= 0)
            continue;
        size_t i = hash_bytes(sp[id].key, sp[id].len) & t->vmask;
        while (t->vhash[i] >= 0)
            i = (i + 1) & t->vmask;
        t->vhash[i] = (int32_t)id;
    }
    /* Added-token spellings take precedence for token_id, as HF's
     * token_to_id asks the added vocabulary first. */
    for (size_t i = 0; i < t->n_added; i++) {
        int32_t id = t->added[i].id;
        int32_t have = vocab_find(t, sp[id].key, sp[id].len);
        if (have >= 0 && have != id) {
            size_t h = hash_bytes(sp[id].key, sp[id].len) & t->vmask;
            while (t->vhash[h] != have)
                h = (h + 1) & t->vmask;
            t->vhash[h] = id;
        }
    }

    /* -- byte symbols -- */
    for (int b = 0; b < 256; b++) {
        char u[4];
        size_t n = (size_t)utf8proc_encode_char((utf8proc_int32_t)byte_to_cp[b], (utf8proc_uint8_t *)u);
        t->byte_id[b] = vocab_find(t, u, n);
    }
    t->unk_id = -1;
    json_t *unk = json_object_get(model, "unk_token");
    if (json_is_string(unk)) {
        t->unk_id = vocab_find(t, json_string_value(unk), json_string_length(unk));
        if (t->unk_id < 0) {
            st = dflash_fail(DFLASH_ERR_FORMAT, "%s: unk_token \"%.40s\" is not in the vocab",
                             label, json_string_value(unk));
            goto done_sp;
        }
    }

    /* -- merges -- */
    size_t n_merges = json_array_size(merges);
    size_t mcap = pow2_at_least(2 * n_merges + 1);
    t->mkey = malloc(mcap * sizeof *t->mkey);
    t->mrank = malloc(mcap * sizeof *t->mrank);
    t->mnew = malloc(mcap * sizeof *t->mnew);
    char *cat = NULL;
    size_t cat_cap = 0;
    if (!t->mkey || !t->mrank || !t->mnew) {
        st = dflash_fail(DFLASH_ERR_OOM, "%s: out of memory for %zu merges", label, n_merges);
        goto done_sp;
    }
    memset(t->mkey, 0xff, mcap * sizeof *t->mkey);
    t->mmask = mcap - 1;
    t->n_merges = n_merges;
    for (size_t r = 0; r < n_merges; r++) {
        json_t *m = json_array_get(merges, r);
        const char *a, *b;
        size_t al, bl;
        if (json_is_string(m)) {
            a = json_string_value(m);
            const char *sp1 = memchr(a, ' ', json_string_length(m));
            if (!sp1 || memchr(sp1 + 1, ' ', json_string_length(m) - (size_t)(sp1 + 1 - a))) {
                st = dflash_fail(DFLASH_ERR_FORMAT,
                                 "%s: model.merges[%zu] \"%.40s\" is not two tokens separated by "
                                 "one space",
                                 label, r, a);
                goto done_merges;
            }
            al = (size_t)(sp1 - a), b = sp1 + 1, bl = json_string_length(m) - al - 1;
        } else if (json_is_array(m) && json_array_size(m) == 2 &&
                   json_is_string(json_array_get(m, 0)) && json_is_string(json_array_get(m, 1))) {
            a = json_string_value(json_array_get(m, 0)), al = json_string_length(json_array_get(m, 0));
            b = json_string_value(json_array_get(m, 1)), bl = json_string_length(json_array_get(m, 1));
        } else {
            st = dflash_fail(DFLASH_ERR_FORMAT,
                             "%s: model.merges[%zu] is neither \"a b\" nor [\"a\", \"b\"]", label, r);
            goto done_merges;
        }
        int32_t ia = vocab_find(t, a, al), ib = vocab_find(t, b, bl);
        if (al + bl > cat_cap) {
            cat_cap = 2 * (al + bl) + 64;
            char *nc = realloc(cat, cat_cap);
            if (!nc) {
                st = dflash_fail(DFLASH_ERR_OOM, "%s: out of memory", label);
                goto done_merges;
            }
            cat = nc;
        }
        memcpy(cat, a, al);
        memcpy(cat + al, b, bl);
        int32_t inew = vocab_find(t, cat, al + bl);
        if (ia < 0 || ib < 0 || inew < 0) {
            st = dflash_fail(DFLASH_ERR_FORMAT,
                             "%s: model.merges[%zu] (\"%.*s\" \"%.*s\") uses a token missing from "
                             "the vocab",
                             label, r, (int)(al < 40 ? al : 40), a, (int)(bl < 40 ? bl : 40), b);
            goto done_merges;
        }
        uint64_t k = ((uint64_t)(uint32_t)ia << 32) | (uint32_t)ib;
        size_t h = mix64(k) & t->mmask;
        while (t->mkey[h] != UINT64_MAX && t->mkey[h] != k)
            h = (h + 1) & t->mmask;
        /* A repeated pair keeps its later rank, as HF's map insert does. */
        t->mkey[h] = k, t->mrank[h] = (uint32_t)r, t->mnew[h] = inew;
    }

    /* -- added-token lookup by first byte, longest first -- */
    {
        size_t counts[256] = { 0 };
        for (size_t i = 0; i < t->n_added; i++)
            counts[(unsigned char)t->added[i].content[0]]++;
        t->by_first_pool = malloc((t->n_added + 256) * sizeof *t->by_first_pool);
        if (!t->by_first_pool) {
            st = dflash_fail(DFLASH_ERR_OOM, "%s: out of memory", label);
            goto done_merges;
        }
        size_t pos = 0;
        for (int b = 0; b < 256; b++) {
            if (!counts[b]) {
                t->by_first[b] = -1;
                continue;
            }
            t->by_first[b] = (int32_t)pos;
            size_t start = pos;
            for (size_t i = 0; i < t->n_added; i++) {
                if ((unsigned char)t->added[i].content[0] != b)
                    continue;
                /* insertion sort by length, descending (buckets are tiny) */
                size_t j = pos++;
                while (j > start && t->added[t->by_first_pool[j - 1]].len < t->added[i].len) {
                    t->by_first_pool[j] = t->by_first_pool[j - 1];
                    j--;
                }
                t->by_first_pool[j] = (int32_t)i;
            }
            t->by_first_pool[pos++] = -1;
        }
    }

    /* -- encode scratch -- */
    t->md = pcre2_match_data_create(4, NULL);
    t->mctx = pcre2_match_context_create(NULL);
    t->jit_stack = pcre2_jit_stack_create(32 * 1024, 4 * 1024 * 1024, NULL);
    t->cache = calloc(CACHE_SLOTS, sizeof *t->cache);
    if (!t->md || !t->mctx || !t->jit_stack || !t->cache) {
        st = dflash_fail(DFLASH_ERR_OOM, "%s: out of memory", label);
        goto done_merges;
    }
    pcre2_jit_stack_assign(t->mctx, NULL, t->jit_stack);

done_merges:
    free(cat);
done_sp:
    free(sp);
    return st;
}

dflash_status dflash_tokenizer_load_memory(const char *json, size_t len, const char *label,
                                           dflash_tokenizer **out)
{
    *out = NULL;
    if (!label)
        label = "(memory)";
    if (!json)
        return dflash_fail(DFLASH_ERR_INVALID_ARG, "%s: no JSON given", label);
    json_error_t je;
    json_t *root = json_loadb(json, len, JSON_ALLOW_NUL, &je);
    if (!root)
        return dflash_fail(DFLASH_ERR_FORMAT, "%s: invalid JSON at line %d column %d: %s", label,
                           je.line, je.column, je.text);
    dflash_tokenizer *t = calloc(1, sizeof *t);
    if (!t || !(t->label = strdup(label))) {
        free(t);
        json_decref(root);
        return dflash_fail(DFLASH_ERR_OOM, "%s: out of memory", label);
    }
    dflash_status st = build(t, root);
    json_decref(root);
    /* the template's ids must name tokens of this vocabulary */
    for (int i = 0; st == DFLASH_OK && i < t->n_tmpl_pre + t->n_tmpl_post; i++) {
        const int32_t id = i < t->n_tmpl_pre ? t->tmpl_pre[i] : t->tmpl_post[i - t->n_tmpl_pre];
        if (id >= t->n_ids)
            st = dflash_fail(DFLASH_ERR_FORMAT, "%s: post_processor special token id %d is not in the vocabulary "
                             "(%d ids)", label, id, t->n_ids);
    }
    if (st) {
        dflash_tokenizer_free(t);
        return st;
    }
    *out = t;
    return DFLASH_OK;
}

dflash_status dflash_tokenizer_load(const char *path, dflash_tokenizer **out)
{
    *out = NULL;
    if (!path)
        return dflash_fail(DFLASH_ERR_INVALID_ARG, "tokenizer: no path given");
    struct stat stt;
    if (stat(path, &stt) != 0)
        return dflash_fail(DFLASH_ERR_IO, "%s: %s", path, strerror(errno));
    char *file = NULL;
    if (S_ISDIR(stt.st_mode)) {
        size_t n = strlen(path) + sizeof "/tokenizer.json";
        file = malloc(n);
        if (!file)
            return dflash_fail(DFLASH_ERR_OOM, "%s: out of memory", path);
        snprintf(file, n, "%s/tokenizer.json", path);
    } else if (!(file = strdup(path))) {
        return dflash_fail(DFLASH_ERR_OOM, "%s: out of memory", path);
    }
    /* tokenizer.json of a big model is ~11 MB; 1 GB bounds a corrupt path. */
    char *data = NULL;
    size_t n = 0;
    dflash_status st = dflash_read_file(file, (size_t)1 << 30, &data, &n);
    if (st == DFLASH_OK)
        st = dflash_tokenizer_load_memory(data, n, file, out);
    free(data);
    free(file);
    return st;
}

/* ---- encode -------------------------------------------------------------- */

static bool out_push(dflash_tokenizer *t, int32_t id)
{
    if (t->out_n == t->out_cap) {
        size_t cap = t->out_cap ? t->out_cap * 2 : 256;
        int32_t *p = realloc(t->out, cap * sizeof *p);
        if (!p)
            return false;
        t->out = p, t->out_cap = cap;
    }
    t->out[t->out_n++] = id;
    return true;
}

static bool scratch_reserve(dflash_tokenizer *t, size_t n)
{
    if (n <= t->scratch_cap)
        return true;
    size_t cap = t->scratch_cap ? t->scratch_cap : 64;
    while (cap < n)
        cap *= 2;
    int32_t *a = realloc(t->sym, cap * sizeof *a);
    if (a)
        t->sym = a;
    int32_t *b = realloc(t->prev, cap * sizeof *b);
    if (b)
        t->prev = b;
    int32_t *c = realloc(t->next, cap * sizeof *c);
    if (c)
        t->next = c;
    /* The heap keeps stale entries: n-1 initial pairs plus up to two per
     * merge (at most n-1 merges) is under 3n entries. */
    heap_item *h = realloc(t->heap, 3 * cap * sizeof *h);
    if (h)
        t->heap = h;
    if (!a || !b || !c || !h)
        return false;
    t->scratch_cap = cap;
    return true;
}

static bool heap_less(heap_item x, heap_item y)
{
    return x.rank < y.rank || (x.rank == y.rank && x.pos < y.pos);
}

static void heap_push(heap_item *h, size_t *n, heap_item it)
{
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!heap_less(it, h[p]))
            break;
        h[i] = h[p];
        i = p;
    }
    h[i] = it;
}

static heap_item heap_pop(heap_item *h, size_t *n)
{
    heap_item top = h[0], last = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n)
            break;
        if (c + 1 < *n && heap_less(h[c + 1], h[c]))
            c++;
        if (!heap_less(h[c], last))
            break;
        h[i] = h[c];
        i = c;
    }
    if (*n)
        h[i] = last;
    return top;
}

/* Queue the pair starting at symbol i if it has a merge. */
static void queue_pair(dflash_tokenizer *t, size_t *hn, int32_t i)
{
    int32_t j = t->next[i];
    uint32_t rank;
    int32_t nid;
    if (j >= 0 && merge_find(t, t->sym[i], t->sym[j], &rank, &nid))
        heap_push(t->heap, hn, (heap_item){ rank, i });
}

/* BPE on one pre-split word (raw bytes), appending its ids. Symbols are a
 * linked list; candidate pairs sit in a min-heap by (rank, position), and a
 * popped pair is re-validated because earlier merges may have consumed it:
 * O(n log n) per word, so a long run of spaces is no hazard. */
static bool bpe_word(dflash_tokenizer *t, const char *w, size_t n)
{
    if (n == 0)
        return true;
    uint32_t h = (uint32_t)hash_bytes(w, n);
    cache_slot *slot = NULL;
    if (n <= CACHE_WORD) {
        slot = &t->cache[h & (CACHE_SLOTS - 1)];
        if (slot->wlen == n && slot->hash == h && !memcmp(slot->word, w, n)) {
            for (int i = 0; i < slot->nids; i++)
                if (!out_push(t, slot->ids[i]))
                    return false;
            return true;
        }
    }
    size_t first = t->out_n;
    if (t->ignore_merges) {
        /* The whole word, if it is a token, wins over merging. */
        uint32_t b2c[256];
        int16_t c2b[324];
        byte_unicode_tables(b2c, c2b);
        t->mapped.n = 0;
        for (size_t i = 0; i < n; i++) {
            char u[4];
            utf8proc_ssize_t k = utf8proc_encode_char((utf8proc_int32_t)b2c[(unsigned char)w[i]], (utf8proc_uint8_t *)u);
            if (!buf_add(&t->mapped, u, (size_t)k))
                return false;
        }
        int32_t id = vocab_find(t, t->mapped.p, t->mapped.n);
        if (id >= 0)
            return out_push(t, id);
    }
    if (!scratch_reserve(t, n))
        return false;
    int32_t ns = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t id = t->byte_id[(unsigned char)w[i]];
        if (id < 0) {
            /* Not in the vocab: the unk token (fused if asked), or dropped
             * when there is none, as HF's BPE does. */
            if (t->unk_id < 0 || (t->fuse_unk && ns > 0 && t->sym[ns - 1] == t->unk_id))
                continue;
            id = t->unk_id;
        }
        t->sym[ns] = id;
        t->prev[ns] = ns - 1;
        t->next[ns] = ns + 1;
        ns++;
    }
    if (ns == 0)
        return true;
    t->next[ns - 1] = -1;
    size_t hn = 0;
    for (int32_t i = 0; i + 1 < ns; i++)
        queue_pair(t, &hn, i);
    while (hn) {
        heap_item it = heap_pop(t->heap, &hn);
        int32_t i = it.pos, j = t->next[i];
        if (t->sym[i] < 0 || j < 0)
            continue;
        uint32_t rank;
        int32_t nid;
        if (!merge_find(t, t->sym[i], t->sym[j], &rank, &nid) || rank != it.rank)
            continue; /* stale: this pair changed since it was queued */
        t->sym[i] = nid;
        t->sym[j] = -1; /* consumed */
        t->next[i] = t->next[j];
        if (t->next[j] >= 0)
            t->prev[t->next[j]] = i;
        if (t->prev[i] >= 0)
            queue_pair(t, &hn, t->prev[i]);
        queue_pair(t, &hn, i);
    }
    for (int32_t i = 0; i >= 0; i = t->next[i])
        if (!out_push(t, t->sym[i]))
            return false;
    size_t got = t->out_n - first;
    if (slot && got <= CACHE_IDS) {
        slot->hash = h;
        slot->wlen = (uint8_t)n;
        slot->nids = (uint8_t)got;
        memcpy(slot->word, w, n);
        memcpy(slot->ids, t->out + first, got * sizeof *t->out);
    }
    return true;
}

/* Apply pre-tokenizer split step k to s[0..n), then BPE each final piece. */
static bool pretok(dflash_tokenizer *t, int k, const char *s, size_t n)
{
    if (n == 0)
        return true;
    if (k == t->n_steps)
        return bpe_word(t, s, n);
    const split_step *st = &t->steps[k];
    /* Isolated keeps gaps and matches alike; Removed keeps only the gaps
     * (only the matches when inverted). */
    bool keep_gap = !st->removed || !st->invert, keep_match = !st->removed || st->invert;
    size_t pos = 0, gap = 0;
    while (pos <= n) {
        int rc = pcre2_match(st->re, (PCRE2_SPTR)s, n, pos, PCRE2_NO_UTF_CHECK, t->md, t->mctx);
        if (rc == PCRE2_ERROR_NOMATCH)
            break;
        if (rc < 0) {
            PCRE2_UCHAR msg[160];
            pcre2_get_error_message(rc, msg, sizeof msg);
            t->err = dflash_fail(DFLASH_ERR_UNSUPPORTED, "%s: pre-tokenizer regex failed: %s",
                                 t->label, (const char *)msg);
            return false;
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(t->md);
        size_t ms = ov[0], me = ov[1];
        if (keep_gap && ms > gap && !pretok(t, k + 1, s + gap, ms - gap))
            return false;
        if (keep_match && me > ms && !pretok(t, k + 1, s + ms, me - ms))
            return false;
        gap = me;
        if (me > ms) {
            pos = me;
        } else {
            /* An empty match: step one character on, as Oniguruma's
             * find_iter does, so the scan always advances. */
            if (me >= n)
                break;
            int r = utf8_step((const unsigned char *)s + me, n - me);
            pos = me + (size_t)(r > 0 ? r : 1);
        }
    }
    if (keep_gap && n > gap && !pretok(t, k + 1, s + gap, n - gap))
        return false;
    return true;
}

/* One segment between added tokens: normalize, look for normalized added
 * tokens, pre-split, BPE. */
static bool encode_plain(dflash_tokenizer *t, const char *s, size_t n, bool normalized_pass);

static bool encode_normalized(dflash_tokenizer *t, const char *s, size_t n)
{
    if (!t->nfc)
        return encode_plain(t, s, n, true);
    /* ASCII is NFC already; only other text pays for utf8proc. */
    bool ascii = true;
    for (size_t i = 0; i < n && ascii; i++)
        ascii = (unsigned char)s[i] < 0x80;
    if (ascii)
        return encode_plain(t, s, n, true);
    utf8proc_uint8_t *nf = NULL;
    utf8proc_ssize_t nl = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &nf,
                                       UTF8PROC_STABLE | UTF8PROC_COMPOSE);
    if (nl < 0) {
        t->err = dflash_fail(nl == UTF8PROC_ERROR_NOMEM ? DFLASH_ERR_OOM : DFLASH_ERR_INVALID_ARG,
                             "%s: NFC normalization failed: %s", t->label, utf8proc_errmsg(nl));
        return false;
    }
    bool ok = encode_plain(t, (const char *)nf, (size_t)nl, true);
    free(nf);
    return ok;
}

/* Split s[0..n) on added tokens of one kind (raw pass: normalized=false;
 * normalized pass: normalized=true), leftmost-longest, honouring lstrip and
 * rstrip; the text between goes on down the pipeline. */
static bool encode_plain(dflash_tokenizer *t, const char *s, size_t n, bool normalized_pass)
{
    bool any = normalized_pass ? t->any_normalized : t->any_raw;
    size_t start = 0; /* end of the previous added-token match */
    for (size_t p = 0; any && p < n; p++) {
        int32_t b = t->by_first[(unsigned char)s[p]];
        if (b < 0)
            continue;
        const added_token *hit = NULL;
        for (int32_t *c = t->by_first_pool + b; *c >= 0; c++) {
            const added_token *a = &t->added[*c];
            if (a->normalized == normalized_pass && a->len <= n - p &&
                !memcmp(s + p, a->content, a->len)) {
                hit = a;
                break;
            }
        }
        if (!hit)
            continue;
        size_t ms = p, me = p + hit->len;
        if (hit->lstrip) {
            while (ms > start) {
                size_t q = ms - 1;
                while (q > start && ((unsigned char)s[q] & 0xC0) == 0x80)
                    q--;
                utf8proc_int32_t cp;
                if (utf8proc_iterate((const utf8proc_uint8_t *)s + q, (utf8proc_ssize_t)(ms - q), &cp) <= 0 ||
                    !is_white_space(cp))
                    break;
                ms = q;
            }
        }
        if (hit->rstrip) {
            while (me < n) {
                utf8proc_int32_t cp;
                utf8proc_ssize_t r = utf8proc_iterate((const utf8proc_uint8_t *)s + me, (utf8proc_ssize_t)(n - me), &cp);
                if (r <= 0 || !is_white_space(cp))
                    break;
                me += (size_t)r;
            }
        }
        if (ms > start) {
            bool ok = normalized_pass ? pretok(t, 0, s + start, ms - start)
                                      : encode_normalized(t, s + start, ms - start);
            if (!ok)
                return false;
        }
        if (!out_push(t, hit->id))
            return false;
        start = me;
        p = me - 1;
    }
    if (n > start)
        return normalized_pass ? pretok(t, 0, s + start, n - start)
                               : encode_normalized(t, s + start, n - start);
    return true;
}

dflash_status dflash_tokenizer_encode(dflash_tokenizer *t, const char *text, size_t len,
                                      int32_t **ids, size_t *n)
{
    *ids = NULL;
    *n = 0;
    if (!t || (!text && len))
        return dflash_fail(DFLASH_ERR_INVALID_ARG, "tokenizer encode: null argument");
    /* Repair invalid UTF-8 first: PCRE2 and utf8proc need valid input. */
    buf fixed = { 0 };
    const char *s = text;
    for (size_t i = 0; i < len;) {
        int r = utf8_step((const unsigned char *)text + i, len - i);
        if (r > 0) {
            i += (size_t)r;
            continue;
        }
        size_t used;
        if (!utf8_lossy_append(&fixed, text, len, true, &used)) {
            free(fixed.p);
            return dflash_fail(DFLASH_ERR_OOM, "%s: out of memory", t->label);
        }
        s = fixed.p, len = fixed.n;
        break;
    }
    t->out_n = 0;
    t->err = DFLASH_OK;
    bool ok = encode_plain(t, s, len, false);
    free(fixed.p);
    if (!ok)
        return t->err ? t->err : dflash_fail(DFLASH_ERR_OOM, "%s: out of memory", t->label);
    if (t->out_n) {
        int32_t *r = malloc(t->out_n * sizeof *r);
        if (!r)
            return dflash_fail(DFLASH_ERR_OOM, "%s: out of memory", t->label);
        memcpy(r, t->out, t->out_n * sizeof *r);
        *ids = r;
        *n = t->out_n;
    }
    /* Do not keep a huge output buffer alive after one huge input. */
    if (t->out_cap > (1u << 20)) {
        free(t->out);
        t->out = NULL;
        t->out_cap = 0;
    }
    return DFLASH_OK;
}

dflash_status dflash_tokenizer_encode_special(dflash_tokenizer *t, const char *text, size_t len, int32_t **ids,
                                              size_t *n)
{
    DFLASH_TRY(dflash_tokenizer_encode(t, text, len, ids, n));
    const size_t extra = (size_t)(t->n_tmpl_pre + t->n_tmpl_post);
    if (!extra)
        return DFLASH_OK;
    int32_t *r = malloc((*n + extra) * sizeof *r);
    if (!r) {
        free(*ids);
        *ids = NULL;
        *n = 0;
        return dflash_fail(DFLASH_ERR_OOM, "%s: out of memory", t->label);
    }
    memcpy(r, t->tmpl_pre, (size_t)t->n_tmpl_pre * sizeof *r);
    if (*n)
        memcpy(r + t->n_tmpl_pre, *ids, *n * sizeof *r);
    memcpy(r + t->n_tmpl_pre + *n, t->tmpl_post, (size_t)t->n_tmpl_post * sizeof *r);
    free(*ids);
    *ids = r;
    *n += extra;
    return DFLASH_OK;
}

/* ---- decode -------------------------------------------------------------- */

int32_t dflash_tokenizer_vocab_size(const dflash_tokenizer *t)
{
    return t ? t->n_ids : 0;
}

int32_t dflash_tokenizer_token_id(const dflash_tokenizer *t, const char *token)
{
    if (!t || !token)
        return -1;
    return vocab_find(t, token, strlen(token));
}

int dflash_tokenizer_has_id(const dflash_tokenizer *t, int32_t id)
{
    return t && id >= 0 && id < t->n_ids && (t->id_flags[id] & ID_PRESENT) ? 1 : 0;
}

int dflash_tokenizer_is_special(const dflash_tokenizer *t, int32_t id)
{
    return t && id >= 0 && id < t->n_ids && (t->id_flags[id] & ID_SPECIAL) ? 1 : 0;
}

int dflash_tokenizer_is_added(const dflash_tokenizer *t, int32_t id)
{
    return t && id >= 0 && id < t->n_ids && (t->id_flags[id] & ID_ADDED) ? 1 : 0;
}

const char *dflash_tokenizer_label(const dflash_tokenizer *t)
{
    return t ? t->label : "";
}

/* The bytes of one id, or an error for an id that names nothing. NULL *p
 * with *n == 0 means "skip". */
static dflash_status id_bytes(const dflash_tokenizer *t, int32_t id, uint32_t flags,
                              const char **p, size_t *n)
{
    if (id < 0 || id >= t->n_ids || !(t->id_flags[id] & ID_PRESENT))
        return dflash_fail(DFLASH_ERR_INVALID_ARG, "%s: token id %d is not in the vocabulary "
                                                   "(ids 0..%d)",
                           t->label, (int)id, (int)t->n_ids - 1);
    if ((flags & DFLASH_DECODE_SKIP_SPECIAL) && (t->id_flags[id] & ID_SPECIAL)) {
        *p = NULL, *n = 0;
        return DFLASH_OK;
    }
    *p = t->dec_bytes + t->dec_off[id];
    *n = t->dec_off[id + 1] - t->dec_off[id];
    return DFLASH_OK;
}

dflash_status dflash_tokenizer_decode(const dflash_tokenizer *t, const int32_t *ids, size_t n,
                                      uint32_t flags, char **out, size_t *len)
{
    *out = NULL;
    *len = 0;
    if (!t || (!ids && n))
        return dflash_fail(DFLASH_ERR_INVALID_ARG, "tokenizer decode: null argument");
    buf raw = { 0 }, txt = { 0 };
    dflash_status st = DFLASH_OK;
    for (size_t i = 0; i < n; i++) {
        const char *p;
        size_t k;
        if ((st = id_bytes(t, ids[i], flags, &p, &k)))
            goto fail;
        if (!buf_add(&raw, p, k))
            goto oom;
    }
    size_t used;
    if (!buf_reserve(&txt, raw.n) || !utf8_lossy_append(&txt, raw.p, raw.n, true, &used))
        goto oom;
    free(raw.p);
    *out = txt.p;
    *len = txt.n;
    return DFLASH_OK;
oom:
    st = dflash_fail(DFLASH_ERR_OOM, "%s: out of memory", t->label);
fail:
    free(raw.p);
    free(txt.p);
    return st;
}

/* ---- streaming decode ---------------------------------------------------- */

struct dflash_detok_stream {
    const dflash_tokenizer *tok;
    uint32_t flags;
    buf pending; /* bytes not yet emitted: at most an incomplete character
                    between calls */
    buf out;     /* what the last call returned */
};

dflash_status dflash_detok_stream_new(const dflash_tokenizer *tok, uint32_t flags,
                                      dflash_detok_stream **out)
{
    *out = NULL;
    if (!tok)
        return dflash_fail(DFLASH_ERR_INVALID_ARG, "detok stream: no tokenizer");
    dflash_detok_stream *s = calloc(1, sizeof *s);
    if (!s)
        return dflash_fail(DFLASH_ERR_OOM, "detok stream: out of memory");
    s->tok = tok;
    s->flags = flags;
    *out = s;
    return DFLASH_OK;
}

static dflash_status stream_emit(dflash_detok_stream *s, bool final, const char **text,
                                 size_t *len)
{
    size_t used;
    s->out.n = 0;
    if (!buf_reserve(&s->out, s->pending.n) ||
        !utf8_lossy_append(&s->out, s->pending.p ? s->pending.p : "", s->pending.n, final, &used))
        return dflash_fail(DFLASH_ERR_OOM, "detok stream: out of memory");
    if (used && used < s->pending.n)
        memmove(s->pending.p, s->pending.p + used, s->pending.n - used);
    s->pending.n -= used;
    *text = s->out.p ? s->out.p : "";
    *len = s->out.n;
    return DFLASH_OK;
}

dflash_status dflash_detok_stream_push(dflash_detok_stream *s, int32_t id, const char **text,
                                       size_t *len)
{
    *text = "";
    *len = 0;
    const char *p;
    size_t k;
    DFLASH_TRY(id_bytes(s->tok, id, s->flags, &p, &k));
    if (!buf_add(&s->pending, p, k))
        return dflash_fail(DFLASH_ERR_OOM, "detok stream: out of memory");
    return stream_emit(s, false, text, len);
}

dflash_status dflash_detok_stream_finish(dflash_detok_stream *s, const char **text, size_t *len)
{
    return stream_emit(s, true, text, len);
}

void dflash_detok_stream_reset(dflash_detok_stream *s)
{
    if (s)
        s->pending.n = 0;
}

void dflash_detok_stream_free(dflash_detok_stream *s)
{
    if (!s)
        return;
    free(s->pending.p);
    free(s->out.p);
    free(s);
}
