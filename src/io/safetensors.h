/* safetensors.h: read-only access to Hugging Face safetensors checkpoints.
 *
 * A set is one file, or a folder holding either `model.safetensors` or a
 * sharded `model.safetensors.index.json` (+ its shard files). Files are
 * mmapped; headers are parsed with jansson and every offset, size and shape
 * is bounds-checked before any tensor byte is reachable. All failures name
 * the file and, where there is one, the tensor.
 *
 * Tensor data is always aligned to its element size: the format allows a
 * header of any length (and any offsets), which can leave a tensor's bytes
 * misaligned in the mapping; such tensors are copied once, at open, into
 * aligned memory the set owns. */
#ifndef DFLASH_IO_SAFETENSORS_H
#define DFLASH_IO_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "core/dtype.h"
#include "core/status.h"

#define DFLASH_ST_MAX_DIMS 8

typedef struct dflash_tensor_info {
    const char *name;   /* tensor name, as in the header */
    const char *file;   /* path of the file that holds it */
    dflash_dtype dtype;
    int ndim;
    int64_t shape[DFLASH_ST_MAX_DIMS];
    int64_t numel;
    const void *data;   /* aligned to the element size; valid until dflash_st_close */
    size_t nbytes;
} dflash_tensor_info;

typedef struct dflash_st dflash_st;

/* Open a .safetensors file, or a folder (model.safetensors.index.json
 * preferred, else model.safetensors). */
dflash_status dflash_st_open(const char *path, dflash_st **out);
/* Parse an in-memory image of one safetensors file (not copied, except
 * misaligned tensors: `data` must outlive the set). `label` stands for the
 * file name in messages. */
dflash_status dflash_st_open_memory(const void *data, size_t len, const char *label, dflash_st **out);
void dflash_st_close(dflash_st *st);

size_t dflash_st_count(const dflash_st *st);
const dflash_tensor_info *dflash_st_at(const dflash_st *st, size_t i);
/* NULL when absent. */
const dflash_tensor_info *dflash_st_find(const dflash_st *st, const char *name);
/* Position in the table (for dflash_st_at) of `t`, a pointer this set gave. */
size_t dflash_st_index_of(const dflash_st *st, const dflash_tensor_info *t);

/* Find `name` and check it: dtype (DFLASH_DTYPE_INVALID accepts any) and
 * shape (ndim < 0 accepts any). Errors name the set's path, the tensor, and
 * the expected and actual dtype or shape. */
dflash_status dflash_st_get(const dflash_st *st, const char *name, dflash_dtype dtype, int ndim,
                            const int64_t *shape, const dflash_tensor_info **out);

/* Path the set was opened from (for messages). */
const char *dflash_st_path(const dflash_st *st);

#endif
