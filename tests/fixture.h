/* fixture.h: reading the expected outputs that tools/fixtures wrote with
 * Hugging Face transformers / PyTorch (expected.safetensors beside each
 * checkpoint), and comparing against them. Header-only, for tests. */
#ifndef DFLASH_TESTS_FIXTURE_H
#define DFLASH_TESTS_FIXTURE_H

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "io/safetensors.h"

/* Path "<test data>/<a>/<b>" into buf. */
static inline const char *fx_path(char *buf, size_t n, const char *a, const char *b)
{
    snprintf(buf, n, "%s/%s%s%s", test_data_dir(), a, b ? "/" : "", b ? b : "");
    return buf;
}

/* The target folder a drafter fixture names in its meta.json; 0 if none. */
static inline int fx_drafter_target(const char *drafter, char *out, size_t n)
{
    char path[512];
    snprintf(path, sizeof path, "%s/dflash/%s/meta.json", test_data_dir(), drafter);
    json_error_t err;
    json_t *j = json_load_file(path, 0, &err);
    const char *t = j ? json_string_value(json_object_get(j, "target")) : NULL;
    if (t)
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
