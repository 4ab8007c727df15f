/* weight_bind.c: see weight_bind.h. */
#include "backend/weight_bind.h"

#include <stdint.h>
#include <stdlib.h>

dflash_status dflash_binder_init(dflash_binder *b, dflash_backend *be, const dflash_st *st)
{
    size_t n = dflash_st_count(st);
    *b = (dflash_binder){ be, st, calloc(n ? n : 1, 1), 0 };
    if (!b->used)
        return dflash_fail(DFLASH_ERR_OOM, "%s: out of memory", dflash_st_path(st));
    return DFLASH_OK;
}

void dflash_binder_free(dflash_binder *b)
{
    free(b->used);
    b->used = NULL;
}

/* Tensor `name` of exactly shape[0 .. ndim) and dtype BF16, F16 or F32 (the
 * dtypes a weight is bound from), counted as used. */
static dflash_status take(dflash_binder *b, const char *name, int ndim, const int64_t *shape,
                          const dflash_tensor_info **out)
{
    const dflash_tensor_info *t;
    DFLASH_TRY(dflash_st_get(b->st, name, DFLASH_DTYPE_INVALID, ndim, shape, &t));
    if (t->dtype != DFLASH_DTYPE_BF16 && t->dtype != DFLASH_DTYPE_F16 && t->dtype != DFLASH_DTYPE_F32)
        return dflash_fail(DFLASH_ERR_UNSUPPORTED, "%s: tensor '%s' has dtype %s, expected BF16, F16 or F32",
                           t->file, name, dflash_dtype_name(t->dtype));
    b->used[dflash_st_index_of(b->st, t)] = 1;
    b->n_params += t->numel;
    *out = t;
    return DFLASH_OK;
}

dflash_status dflash_bind(dflash_binder *b, const char *name, int64_t rows, int64_t cols, dflash_weight *out)
{
    const dflash_tensor_info *t;
    const int64_t shape[2] = { rows ? rows : cols, cols };
    DFLASH_TRY(take(b, name, rows ? 2 : 1, shape, &t));
    /* dflash_tensor_info.data is aligned to the element size (safetensors.h),
     * so the elements can be read as uint16_t / float here and on upload. */
    *out = (dflash_weight){ t->dtype, rows ? rows : 1, cols, t->data, NULL, t->name };
    return b->be ? b->be->ops->weight_from_host(b->be, out, t->data, NULL) : DFLASH_OK;
}

dflash_status dflash_bind_stack(dflash_binder *b, const char *name, int64_t n, int parts, int64_t rows, int64_t cols,
                                dflash_weight *out)
{
    const dflash_tensor_info *t;
    const int64_t shape[3] = { n, parts * rows, cols };
    DFLASH_TRY(take(b, name, 3, shape, &t));
    const size_t part_bytes = (size_t)(rows * cols) * dflash_dtype_size(t->dtype);
    for (int64_t i = 0; i < n * parts; i++) {
        const void *data = (const char *)t->data + (size_t)i * part_bytes;
        out[i] = (dflash_weight){ t->dtype, rows, cols, data, NULL, t->name };
        if (b->be)
            DFLASH_TRY(b->be->ops->weight_from_host(b->be, &out[i], data, NULL));
    }
    return DFLASH_OK;
}

dflash_status dflash_bind_as(dflash_binder *b, const char *name, int ndim, const int64_t *shape, int64_t rows,
                             int64_t cols, dflash_weight *out)
{
    const dflash_tensor_info *t;
    DFLASH_TRY(take(b, name, ndim, shape, &t));
    if (rows * cols != t->numel)
        return dflash_fail(DFLASH_ERR_SHAPE, "%s: tensor '%s' has %lld elements, bound as [%lld, %lld]", t->file,
                           name, (long long)t->numel, (long long)rows, (long long)cols);
    *out = (dflash_weight){ t->dtype, rows, cols, t->data, NULL, t->name };
    return b->be ? b->be->ops->weight_from_host(b->be, out, t->data, NULL) : DFLASH_OK;
}

dflash_status dflash_bind_shifted(dflash_binder *b, const char *name, int64_t n, float *host, dflash_weight *out)
{
    const dflash_tensor_info *t;
    DFLASH_TRY(take(b, name, 1, &n, &t));
    for (int64_t i = 0; i < n; i++) {
        float w;
        if (t->dtype == DFLASH_DTYPE_F32)
            w = ((const float *)t->data)[i];
        else if (t->dtype == DFLASH_DTYPE_BF16)
            w = dflash_bf16_to_f32(((const uint16_t *)t->data)[i]);
        else
            w = dflash_f16_to_f32(((const uint16_t *)t->data)[i]);
        host[i] = 1.0f + w; /* as transformers: in f32, after widening */
    }
    *out = (dflash_weight){ DFLASH_DTYPE_F32, 1, n, host, NULL, t->name };
    return b->be ? b->be->ops->weight_from_host(b->be, out, host, NULL) : DFLASH_OK;
}

size_t dflash_binder_unused(const dflash_binder *b, const char **names, size_t max)
{
    size_t n = 0;
    for (size_t i = 0; i < dflash_st_count(b->st); i++) {
        if (b->used[i])
            continue;
        if (n < max)
            names[n] = dflash_st_at(b->st, i)->name;
        n++;
    }
    return n;
}
