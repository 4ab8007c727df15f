/* weight_bind.c: see weight_bind.h. */
#include "backend/weight_bind.h"

#include <stdint.h>

dflash_status dflash_weight_bind(dflash_backend *be, const dflash_st *st, const char *name, int64_t rows,
                                 int64_t cols, dflash_weight *out)
{
    const dflash_tensor_info *t;
    int64_t shape[2] = { rows ? rows : cols, cols };
    DFLASH_TRY(dflash_st_get(st, name, DFLASH_DTYPE_INVALID, rows ? 2 : 1, shape, &t));
    if (t->dtype != DFLASH_DTYPE_BF16 && t->dtype != DFLASH_DTYPE_F16 && t->dtype != DFLASH_DTYPE_F32)
        return dflash_fail(DFLASH_ERR_UNSUPPORTED, "%s: tensor '%s' has dtype %s, expected BF16, F16 or F32",
                           t->file, name, dflash_dtype_name(t->dtype));
    /* Safetensors writers pad the header to 8 bytes; a file that does not
     * would hand us misaligned elements. */
    if ((uintptr_t)t->data % dflash_dtype_size(t->dtype) != 0)
        return dflash_fail(DFLASH_ERR_FORMAT, "%s: tensor '%s' data is not aligned to its %zu-byte elements",
                           t->file, name, dflash_dtype_size(t->dtype));
    *out = (dflash_weight){ t->dtype, rows ? rows : 1, cols, NULL, NULL, t->name };
    return be->ops->weight_from_host(be, out, t->data, NULL);
}
