/* fixture.h: reading the expected outputs that tools/fixtures wrote with
 * Hugging Face transformers / PyTorch (expected.safetensors beside each
 * checkpoint), and comparing against them. Header-only, for tests. */
#ifndef DFLASH_TESTS_FIXTURE_H
#define DFLASH_TESTS_FIXTURE_H

#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/safetensors.h"

/* Path "<test data>/<a>/<b>" into buf. */
static inline const char *fx_path(char *buf, size_t n, const char *a, const char *b)
{
    snprintf(buf, n, "%s/%s%s%s", test_data_dir(), a, b ? "/" : "", b ? b : "");
    return buf;
}

/* The target folder a drafter fixture names in its meta.json (a Qwen3
 * fixture's name, or "<family>/<name>"); 0 if none. */
static inline int fx_drafter_target(const char *drafter, char *out, size_t n)
{
    char path[512];
    snprintf(path, sizeof path, "%s/dflash/%s/meta.json", test_data_dir(), drafter);
    json_error_t err;
    json_t *j = json_load_file(path, 0, &err);
    const char *t = j ? json_string_value(json_object_get(j, "target")) : NULL;
    if (t && strchr(t, '/')) /* "<family>/<name>" */
        snprintf(out, n, "%s/%s", test_data_dir(), t);
    else if (t) /* a Qwen3 target's name */
        snprintf(out, n, "%s/qwen3/%s", test_data_dir(), t);
    json_decref(j);
    return t != NULL;
}

/* A named F32 / I32 tensor of an expected file (NULL, with a failed CHECK, if absent). */
static inline const float *fx_f32(const dflash_st *st, const char *name, int64_t *numel)
{
    const dflash_tensor_info *t = dflash_st_find(st, name);
    CHECKF(t && t->dtype == DFLASH_DTYPE_F32, "fixture tensor %s (F32) missing", name);
    if (!t || t->dtype != DFLASH_DTYPE_F32)
        return NULL;
    if (numel)
        *numel = t->numel;
    return t->data;
}

static inline const int32_t *fx_i32(const dflash_st *st, const char *name, int64_t *numel)
{
    const dflash_tensor_info *t = dflash_st_find(st, name);
    CHECKF(t && t->dtype == DFLASH_DTYPE_I32, "fixture tensor %s (I32) missing", name);
    if (!t || t->dtype != DFLASH_DTYPE_I32)
        return NULL;
    if (numel)
        *numel = t->numel;
    return t->data;
}

static inline const dflash_tensor_info *fx_tensor(const dflash_st *st, const char *name)
{
    const dflash_tensor_info *t = dflash_st_find(st, name);
    CHECKF(t != NULL, "fixture tensor %s missing", name);
    return t;
}

/* The __metadata__ of a safetensors file (a new reference; NULL if none). */
static inline json_t *fx_metadata(const char *path)
{
    FILE *f = fopen(path, "rb");
    unsigned char len8[8];
    json_t *h = NULL;
    if (f && fread(len8, 1, 8, f) == 8) {
        uint64_t n = 0;
        for (int i = 7; i >= 0; i--)
            n = n << 8 | len8[i];
        char *text = n < (1u << 24) ? malloc(n) : NULL;
        json_error_t err;
        if (text && fread(text, 1, n, f) == n)
            h = json_loadb(text, n, 0, &err);
        free(text);
    }
    if (f)
        fclose(f);
    json_t *meta = json_incref(json_object_get(h, "__metadata__"));
    json_decref(h);
    return meta;
}

/* The provenance an expected file records in its safetensors
 * __metadata__: `by_key` (the producer of the expected values) must name
 * Hugging Face transformers. A fixture made by a fallback fails the case. */
static inline void fx_check_producer(const char *path, const char *by_key)
{
    json_t *meta = fx_metadata(path);
    const char *by = json_string_value(json_object_get(meta, by_key));
    CHECKF(by && strncmp(by, "transformers ", 13) == 0, "%s: __metadata__ %s is '%s', want 'transformers <version>'",
           path, by_key, by ? by : "(absent)");
    json_decref(meta);
}

/* ... and "crosscheck" must be "ok" (the independent second computation,
 * or the safetensors library's re-read, agreed): a fixture never checked
 * fails the case. */
static inline void fx_check_provenance(const char *path, const char *by_key)
{
    fx_check_producer(path, by_key);
    json_t *meta = fx_metadata(path);
    const char *cc = json_string_value(json_object_get(meta, "crosscheck"));
    CHECKF(cc && strcmp(cc, "ok") == 0, "%s: __metadata__ crosscheck is '%s', want 'ok'", path, cc ? cc : "(absent)");
    json_decref(meta);
}

/* ||a - b|| / ||b||; NaN anywhere gives infinity. */
static inline double fx_rel_err(const float *a, const float *b, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(a[i]) || isnan(b[i]))
            return INFINITY;
        double d = (double)a[i] - b[i];
        num += d * d;
        den += (double)b[i] * b[i];
    }
    return sqrt(num / (den > 0 ? den : 1e-30));
}

#endif
