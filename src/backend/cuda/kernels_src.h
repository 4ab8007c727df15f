/* kernels_src.h: the embedded CUDA kernel sources (kernels_src.c, generated
 * by tools/cuda/embed.sh from src/backend/cuda/kernels/) and the list of
 * kernels each compiled file must define. */
#ifndef DFLASH_BACKEND_CUDA_KERNELS_SRC_H
#define DFLASH_BACKEND_CUDA_KERNELS_SRC_H

typedef struct dflash_cuda_src {
    const char *name; /* file name under src/backend/cuda/kernels/ */
    const char *text;
    int is_header;    /* .cuh: given to every program as an include, not compiled alone */
} dflash_cuda_src;

extern const dflash_cuda_src dflash_cuda_srcs[];
extern const int dflash_cuda_src_count;

#endif
