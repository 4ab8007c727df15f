/* cuda_loader.h: the CUDA driver API and NVRTC, reached through dlopen.
 *
 * Owns the few driver/NVRTC types and constants dflash uses (declared here,
 * ABI-stable values, so the library builds without CUDA headers and one
 * binary runs with or without a GPU), the two tables of entry points, and the
 * checking macros: every call goes through DFLASH_CU / DFLASH_NVRTC, which
 * turn a failure into DFLASH_ERR_BACKEND with the statement, file, line and
 * the driver's own error name and text. */
#ifndef DFLASH_BACKEND_CUDA_LOADER_H
#define DFLASH_BACKEND_CUDA_LOADER_H

#include <stddef.h>

#include "core/status.h"

/* Driver API types (cuda.h spells them the same way). */
typedef int CUresult; /* CUDA_SUCCESS = 0 */
typedef int CUdevice;
typedef unsigned long long CUdeviceptr; /* 64-bit on every platform we build for */
typedef struct CUctx_st *CUcontext;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef struct CUstream_st *CUstream;
typedef struct CUevent_st *CUevent;
typedef struct CUgraph_st *CUgraph;
typedef struct CUgraphExec_st *CUgraphExec;

enum {
    DFLASH_CUDA_SUCCESS = 0,
    DFLASH_CU_ATTR_MULTIPROCESSOR_COUNT = 16,
    DFLASH_CU_ATTR_CC_MAJOR = 75,
    DFLASH_CU_ATTR_CC_MINOR = 76,
    DFLASH_CU_ATTR_MAX_SMEM_PER_BLOCK_OPTIN = 97,
    DFLASH_CU_STREAM_NON_BLOCKING = 1,
    DFLASH_CU_EVENT_DEFAULT = 0,
    DFLASH_CU_MEMHOSTALLOC_DEVICEMAP = 2,
    DFLASH_CU_STREAM_CAPTURE_MODE_RELAXED = 2,
};

/* cuLaunchKernelEx's configuration (cuda.h's CUlaunchConfig and
 * CUlaunchAttribute, same layout). */
typedef struct dflash_cu_launch_attr {
    int id;
    char pad[4];
    union {
        char raw[64];
        void *align;
        int value; /* programmaticStreamSerializationAllowed */
    } value;
} dflash_cu_launch_attr;
typedef struct dflash_cu_launch_config {
    unsigned grid_x, grid_y, grid_z, block_x, block_y, block_z, shared_bytes;
    CUstream stream;
    dflash_cu_launch_attr *attrs;
    unsigned n_attrs;
} dflash_cu_launch_config;
enum { DFLASH_CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION = 6 };
enum { DFLASH_CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8 };

/* NVRTC types. */
typedef int nvrtcResult; /* NVRTC_SUCCESS = 0 */
typedef struct _nvrtcProgram *nvrtcProgram;

/* Driver entry points; members are named without the _v2 suffix that the
 * loader resolves where the driver exports one. */
typedef struct dflash_cuda_api {
    void *lib;
    CUresult (*cuInit)(unsigned flags);
    CUresult (*cuDriverGetVersion)(int *v);
    CUresult (*cuGetErrorName)(CUresult e, const char **s);
    CUresult (*cuGetErrorString)(CUresult e, const char **s);
    CUresult (*cuDeviceGetCount)(int *n);
    CUresult (*cuDeviceGet)(CUdevice *d, int ordinal);
    CUresult (*cuDeviceGetName)(char *name, int len, CUdevice d);
    CUresult (*cuDeviceGetAttribute)(int *v, int attr, CUdevice d);
    CUresult (*cuDevicePrimaryCtxRetain)(CUcontext *c, CUdevice d);
    CUresult (*cuDevicePrimaryCtxRelease)(CUdevice d);
    CUresult (*cuCtxSetCurrent)(CUcontext c);
    CUresult (*cuStreamCreate)(CUstream *s, unsigned flags);
    CUresult (*cuStreamDestroy)(CUstream s);
    CUresult (*cuStreamSynchronize)(CUstream s);
    CUresult (*cuMemAlloc)(CUdeviceptr *p, size_t bytes);
    CUresult (*cuMemFree)(CUdeviceptr p);
    CUresult (*cuMemGetInfo)(size_t *free_b, size_t *total_b);
    CUresult (*cuMemHostAlloc)(void **p, size_t bytes, unsigned flags);
    CUresult (*cuMemFreeHost)(void *p);
    CUresult (*cuMemHostGetDevicePointer)(CUdeviceptr *d, void *p, unsigned flags);
    CUresult (*cuMemcpyHtoDAsync)(CUdeviceptr dst, const void *src, size_t bytes, CUstream s);
    CUresult (*cuMemcpyDtoHAsync)(void *dst, CUdeviceptr src, size_t bytes, CUstream s);
    CUresult (*cuMemcpyDtoDAsync)(CUdeviceptr dst, CUdeviceptr src, size_t bytes, CUstream s);
    CUresult (*cuMemsetD32Async)(CUdeviceptr dst, unsigned v, size_t count, CUstream s);
    CUresult (*cuModuleLoadData)(CUmodule *m, const void *image);
    CUresult (*cuModuleUnload)(CUmodule m);
    CUresult (*cuModuleGetFunction)(CUfunction *f, CUmodule m, const char *name);
    CUresult (*cuModuleGetGlobal)(CUdeviceptr *p, size_t *bytes, CUmodule m, const char *name);
    CUresult (*cuLaunchKernel)(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                               unsigned bz, unsigned smem, CUstream s, void **params, void **extra);
    CUresult (*cuLaunchKernelEx)(const dflash_cu_launch_config *config, CUfunction f, void **params, void **extra);
    CUresult (*cuFuncSetAttribute)(CUfunction f, int attr, int value);
    CUresult (*cuOccupancyMaxActiveBlocksPerMultiprocessor)(int *blocks, CUfunction f, int block_size,
                                                            size_t dyn_smem);
    CUresult (*cuEventCreate)(CUevent *e, unsigned flags);
    CUresult (*cuEventDestroy)(CUevent e);
    CUresult (*cuEventRecord)(CUevent e, CUstream s);
    CUresult (*cuEventSynchronize)(CUevent e);
    CUresult (*cuEventElapsedTime)(float *ms, CUevent a, CUevent b);
    CUresult (*cuStreamBeginCapture)(CUstream s, int mode);
    CUresult (*cuStreamEndCapture)(CUstream s, CUgraph *g);
    CUresult (*cuGraphInstantiateWithFlags)(CUgraphExec *e, CUgraph g, unsigned long long flags);
    CUresult (*cuGraphLaunch)(CUgraphExec e, CUstream s);
    CUresult (*cuGraphExecDestroy)(CUgraphExec e);
    CUresult (*cuGraphDestroy)(CUgraph g);
} dflash_cuda_api;

typedef struct dflash_nvrtc_api {
    void *lib;
    char path[256]; /* what was loaded, for messages */
    nvrtcResult (*nvrtcVersion)(int *major, int *minor);
    const char *(*nvrtcGetErrorString)(nvrtcResult r);
    nvrtcResult (*nvrtcCreateProgram)(nvrtcProgram *p, const char *src, const char *name, int n_headers,
                                      const char *const *headers, const char *const *include_names);
    nvrtcResult (*nvrtcCompileProgram)(nvrtcProgram p, int n_opts, const char *const *opts);
    nvrtcResult (*nvrtcGetProgramLogSize)(nvrtcProgram p, size_t *n);
    nvrtcResult (*nvrtcGetProgramLog)(nvrtcProgram p, char *log);
    nvrtcResult (*nvrtcGetCUBINSize)(nvrtcProgram p, size_t *n);
    nvrtcResult (*nvrtcGetCUBIN)(nvrtcProgram p, char *cubin);
    nvrtcResult (*nvrtcDestroyProgram)(nvrtcProgram *p);
} dflash_nvrtc_api;

/* Load libcuda.so.1 and resolve every entry point. Fails with
 * DFLASH_ERR_BACKEND "no NVIDIA driver (libcuda.so.1 not found: ...)" or
 * naming the missing symbol; the table is zeroed on failure. */
dflash_status dflash_cuda_api_load(dflash_cuda_api *api);
/* Forget the table; the library itself stays mapped (see the .c). */
void dflash_cuda_api_unload(dflash_cuda_api *api);

/* Load NVRTC (libnvrtc.so.13, .so.12, .so, then under /usr/local/cuda/lib64);
 * the message on failure says what to install. */
dflash_status dflash_nvrtc_api_load(dflash_nvrtc_api *api);
void dflash_nvrtc_api_unload(dflash_nvrtc_api *api);

/* The reporting behind the macros: DFLASH_OK when r == 0, else
 * DFLASH_ERR_BACKEND with "<stmt> failed at file:line: NAME (text)". */
dflash_status dflash_cu_check(const dflash_cuda_api *api, CUresult r, const char *stmt, const char *file,
                              int line);
dflash_status dflash_nvrtc_check(const dflash_nvrtc_api *api, nvrtcResult r, const char *stmt, const char *file,
                                 int line);
/* "CUDA_ERROR_NO_DEVICE (no CUDA-capable device is detected)" into buf. */
const char *dflash_cu_error_text(const dflash_cuda_api *api, CUresult r, char *buf, size_t len);

/* Checked calls: `DFLASH_TRY(DFLASH_CU(api, cuMemAlloc(&p, n)));` evaluates
 * api->cuMemAlloc(&p, n) and reports a failure with the statement text. */
#define DFLASH_CU(api, call) dflash_cu_check((api), (api)->call, #call, __FILE__, __LINE__)
#define DFLASH_NVRTC(api, call) dflash_nvrtc_check((api), (api)->call, #call, __FILE__, __LINE__)

#endif
