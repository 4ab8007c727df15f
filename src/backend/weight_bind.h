/* weight_bind.h: bind a checkpoint tensor to a dflash_weight, checking its
 * shape and dtype once at load, naming the file and tensor on failure. */
#ifndef DFLASH_BACKEND_WEIGHT_BIND_H
#define DFLASH_BACKEND_WEIGHT_BIND_H

#include "backend/backend.h"
#include "io/safetensors.h"

/* rows == 0 binds a vector of `cols` elements (shape [cols]); otherwise a
 * matrix [rows, cols]. Accepts BF16, F16 and F32 tensors. */
dflash_status dflash_weight_bind(dflash_backend *be, const dflash_st *st, const char *name, int64_t rows,
                                 int64_t cols, dflash_weight *out);

#endif
