/* cuda_compile.h: the kernel set and how it becomes machine code: the table
 * of kernels (file and extern "C" name) the backend resolves, NVRTC
 * compilation of one embedded source for an arch, and the on-disk CUBIN
 * cache ($XDG_CACHE_HOME/dflash or ~/.cache/dflash, keyed by a hash of the
 * sources, arch, NVRTC version and options). Needs no GPU: the NVRTC test
 * uses it on machines without one. */
#ifndef DFLASH_BACKEND_CUDA_COMPILE_H
#define DFLASH_BACKEND_CUDA_COMPILE_H

#include <stddef.h>

#include "backend/cuda/cuda_loader.h"
#include "backend/cuda/kernels_src.h"

typedef enum dflash_cuda_kernel_id {
    DFK_EMBED,
    DFK_ADD,
    DFK_ADD_BIAS,
    DFK_SWIGLU,
    DFK_COPY_ROWS,
    DFK_COPY_IDS,
    DFK_GATHER_SUM,
    DFK_KV_WRITE,
    DFK_ADD_RMSNORM,
    DFK_GATHER_ADD_RMSNORM,
    DFK_SPLIT_ADD_RMSNORM,
    DFK_NORM_ROPE,
    DFK_NORM_GATE,
    DFK_QK_NORM_ROPE,
    DFK_LINEAR_BF16_V,
    DFK_LINEAR_BF16_S,
    DFK_LINEAR_F16_V,
    DFK_LINEAR_F16_S,
    DFK_LINEAR_F32_V,
    DFK_LINEAR_F32_S,
    DFK_LINEAR_FP8_V,
    DFK_LINEAR_FP8_S,
    DFK_GEMM_BF16_1, /* gemm.cu: tensor-core linear, activation tiles of 8 rows x 1, 2, 4, 8 */
    DFK_GEMM_BF16_2,
    DFK_GEMM_BF16_4,
    DFK_GEMM_BF16_8,
    DFK_GEMM_FP8_1,
    DFK_GEMM_FP8_2,
    DFK_GEMM_FP8_4,
    DFK_GEMM_FP8_8,
    DFK_GEMM_GROUP_BF16_1, /* gemm.cu: a MoE layer's experts (linear_experts), the same tiles */
    DFK_GEMM_GROUP_BF16_2,
    DFK_GEMM_GROUP_BF16_4,
    DFK_GEMM_GROUP_BF16_8,
    DFK_GEMM_GROUP_FP8_1,
    DFK_GEMM_GROUP_FP8_2,
    DFK_GEMM_GROUP_FP8_4,
    DFK_GEMM_GROUP_FP8_8,
    DFK_GEMM_WIDE_BF16_32, /* gemm_wide.cu: the same for many rows, tiles of 32, 64 or 128 rows */
    DFK_GEMM_WIDE_BF16_64,
    DFK_GEMM_WIDE_BF16_128,
    DFK_GEMM_WIDE_FP8_32,
    DFK_GEMM_WIDE_FP8_64,
    DFK_GEMM_WIDE_FP8_128,
    DFK_GEMM_SPLIT_X, /* gemm_wide.cu: its activations split into bf16 hi/lo */
    DFK_ATTENTION_F32, /* attention.cu: any head_dim, f32 or bf16 pages */
    DFK_ATTENTION_BF16,
    DFK_ATTENTION_TC_16, /* attention_tc.cu: bf16 pages, head_dim 16..256 */
    DFK_ATTENTION_TC_32,
    DFK_ATTENTION_TC_64,
    DFK_ATTENTION_TC_128,
    DFK_ATTENTION_TC_256, /* two warps per query tile, each half of the dimensions */
    DFK_ATTN_COMBINE,     /* key splits merged, head_dim <= 128 */
    DFK_ATTN_COMBINE_512, /* the same, head_dim <= 512 */
    DFK_ARGMAX,
    DFK_ARGMAX_FINISH, /* gemm.cu: the fused LM head + argmax's last step */
    DFK_CONV_SILU, /* recurrent.cu: a linear-attention layer's primitives */
    DFK_DELTA_RULE,
    DFK_DELTA_RULE_FULL, /* the same for k_dim == 128, bound tests compiled away */
    DFK_SIGMOID_MUL,
    DFK_MOE_ROUTE, /* moe.cu: a MoE layer's routing and grouping */
    DFK_MOE_ROUTE_WIDE, /* the same for more than 256 experts */
    DFK_SAMPLE_ROWS, /* sample.cu: a token drawn per logits row */
    DFK_PENALIZE_ROWS, /* its rows under their penalties */
    DFK_COUNT_TOKENS,  /* the penalties' token counts */
    DFK_COUNT
} dflash_cuda_kernel_id;

typedef struct dflash_cuda_kernel_info {
    const char *file; /* source under src/backend/cuda/kernels/ */
    const char *name; /* extern "C" symbol */
    int dyn_smem;     /* bytes of dynamic shared memory every launch gets (the kernel's own formula) */
} dflash_cuda_kernel_info;

extern const dflash_cuda_kernel_info dflash_cuda_kernels[DFK_COUNT];

/* "sm_90a" for compute capability 9.0 (the arch-specific target that
 * unlocks wgmma/setmaxnreg), "sm_<major><minor>" otherwise. */
void dflash_cuda_arch_name(int major, int minor, char *buf, size_t len);

/* The embedded source named `file` (NULL if none). */
const dflash_cuda_src *dflash_cuda_src_find(const char *file);

/* Compile one embedded source for `arch`. On success *cubin (malloc'd,
 * *size bytes) and *log (malloc'd, "" when the compiler said nothing). On a
 * compile error: DFLASH_ERR_BACKEND with the log in the message. */
dflash_status dflash_cuda_compile(const dflash_nvrtc_api *nv, const dflash_cuda_src *src, const char *arch,
                                  void **cubin, size_t *size, char **log);

/* The CUBIN for `src` on `arch`: from the disk cache when a valid entry
 * exists, else compiled (printing `*announced` once per process-visible
 * set: "dflash: compiling CUDA kernels for <arch> (first run only)...") and
 * stored. A corrupt or unwritable cache only warns and compiles. */
dflash_status dflash_cuda_cubin_get(const dflash_nvrtc_api *nv, const dflash_cuda_src *src, const char *arch,
                                    int *announced, void **cubin, size_t *size);

/* Whether DFLASH_CUDA_STAMPS is set: the kernels are then compiled with
 * gemm.cu's phase stamps (a measurement build, cached apart). */
int dflash_cuda_stamps_on(void);

/* DFLASH_CUDA_GEMM_SKIP: 1..7, the kernels are then compiled with gemm.cu's
 * GM_SKIP, parts of the GEMM's work taken away (a measurement build, wrong
 * results, cached apart); 0 unset or 0; -1 any other value (no skip). */
int dflash_cuda_gemm_skip(void);

#endif
