/* dflash.h: the public API of dflash, a C11 library for DFlash speculative
 * decoding (block-diffusion drafter + Qwen3 target).
 *
 * Conventions: every function that can fail returns dflash_status (0 = ok);
 * on failure dflash_last_error() holds a message naming the file, tensor,
 * field, expected and actual value. Handles are opaque. Options structs come
 * with *_default_opts() so new fields never break callers. */
#ifndef DFLASH_H
#define DFLASH_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum dflash_status {
    DFLASH_OK = 0,
    DFLASH_ERR_INVALID_ARG = 1, /* caller passed something out of contract */
    DFLASH_ERR_IO = 2,          /* open/read/mmap failed */
    DFLASH_ERR_FORMAT = 3,      /* file content malformed */
    DFLASH_ERR_UNSUPPORTED = 4, /* well-formed but not supported */
    DFLASH_ERR_NOT_FOUND = 5,   /* missing tensor, field or file */
    DFLASH_ERR_SHAPE = 6,       /* shape or dtype mismatch */
    DFLASH_ERR_OOM = 7,         /* host allocation failed */
    DFLASH_ERR_KV_FULL = 8,     /* KV block pool exhausted */
    DFLASH_ERR_BACKEND = 9,     /* backend (driver, compiler) failure */
    DFLASH_ERR_NUMERIC = 10,    /* a model produced no usable numbers (NaN, inf) */
} dflash_status;

/* Message of the last failure on this thread ("" if none). */
const char *dflash_last_error(void);
/* Short stable name of a status code, e.g. "DFLASH_ERR_SHAPE". */
const char *dflash_status_name(dflash_status s);

#ifdef __cplusplus
}
#endif
#endif
