/* cuda_loader.c: dlopen of libcuda.so.1 and libnvrtc, symbol resolution into
 * the tables of cuda_loader.h, and the error reporting behind DFLASH_CU /
 * DFLASH_NVRTC. Nothing here needs CUDA headers. */
#include "backend/cuda/cuda_loader.h"

_Static_assert(sizeof(dflash_cu_launch_attr) == 72, "CUlaunchAttribute is 72 bytes");

#include <dlfcn.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

/* One entry point: where it goes in the table and the names to try, newest
 * first (the _v2 names are what cuda.h maps the plain names to). */
typedef struct sym_spec {
    size_t offset;
    const char *names[2];
} sym_spec;

#define CU_SYM(member, ...) { offsetof(dflash_cuda_api, member), { __VA_ARGS__ } }
static const sym_spec k_cu_syms[] = {
    CU_SYM(cuInit, "cuInit"),
    CU_SYM(cuDriverGetVersion, "cuDriverGetVersion"),
    CU_SYM(cuGetErrorName, "cuGetErrorName"),
    CU_SYM(cuGetErrorString, "cuGetErrorString"),
    CU_SYM(cuDeviceGetCount, "cuDeviceGetCount"),
    CU_SYM(cuDeviceGet, "cuDeviceGet"),
    CU_SYM(cuDeviceGetName, "cuDeviceGetName"),
    CU_SYM(cuDeviceGetAttribute, "cuDeviceGetAttribute"),
    CU_SYM(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain"),
    CU_SYM(cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2", "cuDevicePrimaryCtxRelease"),
    CU_SYM(cuCtxSetCurrent, "cuCtxSetCurrent"),
    CU_SYM(cuStreamCreate, "cuStreamCreate"),
    CU_SYM(cuStreamDestroy, "cuStreamDestroy_v2", "cuStreamDestroy"),
    CU_SYM(cuStreamSynchronize, "cuStreamSynchronize"),
    CU_SYM(cuMemAlloc, "cuMemAlloc_v2"),
    CU_SYM(cuMemFree, "cuMemFree_v2"),
    CU_SYM(cuMemGetInfo, "cuMemGetInfo_v2"),
    CU_SYM(cuMemHostAlloc, "cuMemHostAlloc"),
    CU_SYM(cuMemFreeHost, "cuMemFreeHost"),
    CU_SYM(cuMemHostGetDevicePointer, "cuMemHostGetDevicePointer_v2"),
    CU_SYM(cuMemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2"),
    CU_SYM(cuMemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2"),
    CU_SYM(cuMemcpyDtoDAsync, "cuMemcpyDtoDAsync_v2"),
    CU_SYM(cuMemsetD32Async, "cuMemsetD32Async"),
    CU_SYM(cuModuleLoadData, "cuModuleLoadData"),
    CU_SYM(cuModuleUnload, "cuModuleUnload"),
    CU_SYM(cuModuleGetFunction, "cuModuleGetFunction"),
    CU_SYM(cuModuleGetGlobal, "cuModuleGetGlobal_v2"),
    CU_SYM(cuLaunchKernel, "cuLaunchKernel"),
    CU_SYM(cuLaunchKernelEx, "cuLaunchKernelEx"),
    CU_SYM(cuFuncSetAttribute, "cuFuncSetAttribute"),
    CU_SYM(cuOccupancyMaxActiveBlocksPerMultiprocessor, "cuOccupancyMaxActiveBlocksPerMultiprocessor"),
    CU_SYM(cuEventCreate, "cuEventCreate"),
    CU_SYM(cuEventDestroy, "cuEventDestroy_v2", "cuEventDestroy"),
    CU_SYM(cuEventRecord, "cuEventRecord"),
    CU_SYM(cuEventSynchronize, "cuEventSynchronize"),
    CU_SYM(cuEventElapsedTime, "cuEventElapsedTime_v2", "cuEventElapsedTime"),
    CU_SYM(cuStreamBeginCapture, "cuStreamBeginCapture_v2"),
    CU_SYM(cuStreamEndCapture, "cuStreamEndCapture"),
    CU_SYM(cuGraphInstantiateWithFlags, "cuGraphInstantiateWithFlags"),
    CU_SYM(cuGraphLaunch, "cuGraphLaunch"),
    CU_SYM(cuGraphExecDestroy, "cuGraphExecDestroy"),
    CU_SYM(cuGraphDestroy, "cuGraphDestroy"),
};

#define NV_SYM(member) { offsetof(dflash_nvrtc_api, member), { #member, NULL } }
static const sym_spec k_nvrtc_syms[] = {
    NV_SYM(nvrtcVersion),           NV_SYM(nvrtcGetErrorString), NV_SYM(nvrtcCreateProgram),
    NV_SYM(nvrtcCompileProgram),    NV_SYM(nvrtcGetProgramLogSize), NV_SYM(nvrtcGetProgramLog),
    NV_SYM(nvrtcGetCUBINSize),      NV_SYM(nvrtcGetCUBIN),       NV_SYM(nvrtcDestroyProgram),
};

/* Resolve every spec into `table`; on a miss return the name not found. */
static const char *resolve(void *lib, void *table, const sym_spec *specs, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        void *p = NULL;
        for (int k = 0; k < 2 && !p && specs[i].names[k]; k++)
            p = dlsym(lib, specs[i].names[k]);
        if (!p)
            return specs[i].names[0];
        /* Function pointers stored through their object representation:
         * POSIX guarantees dlsym results convert this way. */
        memcpy((char *)table + specs[i].offset, &p, sizeof p);
    }
    return NULL;
}

dflash_status dflash_cuda_api_load(dflash_cuda_api *api)
{
    memset(api, 0, sizeof *api);
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        const char *e = dlerror();
        return dflash_fail(DFLASH_ERR_BACKEND, "no NVIDIA driver (libcuda.so.1 not found: %s)", e ? e : "?");
    }
    const char *miss = resolve(lib, api, k_cu_syms, sizeof k_cu_syms / sizeof k_cu_syms[0]);
    if (miss) {
        dlclose(lib);
        memset(api, 0, sizeof *api);
        return dflash_fail(DFLASH_ERR_BACKEND, "libcuda.so.1 lacks %s (NVIDIA driver too old?)", miss);
    }
    api->lib = lib;
    return DFLASH_OK;
}

/* The libraries stay mapped for the life of the process (dlopen again
 * only takes a reference): NVRTC's bundled C++ runtime allocates a pool at
 * load that dlclose would orphan (a leak on every load/unload cycle), and
 * the driver registers exit handlers that must find it still mapped. */
void dflash_cuda_api_unload(dflash_cuda_api *api) { memset(api, 0, sizeof *api); }

dflash_status dflash_nvrtc_api_load(dflash_nvrtc_api *api)
{
    /* Soname first (what ldconfig or LD_LIBRARY_PATH knows), then the
     * toolkit's default location, which often is not on the search path. */
    static const char *const k_names[] = {
        "libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so",
        "/usr/local/cuda/lib64/libnvrtc.so.13", "/usr/local/cuda/lib64/libnvrtc.so.12",
        "/usr/local/cuda/lib64/libnvrtc.so",
    };
    memset(api, 0, sizeof *api);
    void *lib = NULL;
    const char *first_err = NULL;
    char err_copy[256] = "";
    for (size_t i = 0; i < sizeof k_names / sizeof k_names[0] && !lib; i++) {
        lib = dlopen(k_names[i], RTLD_NOW | RTLD_LOCAL);
        if (lib) {
            snprintf(api->path, sizeof api->path, "%s", k_names[i]);
        } else if (!first_err) {
            first_err = dlerror();
            snprintf(err_copy, sizeof err_copy, "%s", first_err ? first_err : "?");
        }
    }
    if (!lib)
        return dflash_fail(DFLASH_ERR_BACKEND,
                           "NVRTC not found (tried libnvrtc.so.13, .so.12, .so and /usr/local/cuda/lib64; "
                           "first error: %s); install the CUDA toolkit's NVRTC (e.g. apt-get install "
                           "cuda-nvrtc-13-0) or add its lib directory to LD_LIBRARY_PATH",
                           err_copy);
    const char *miss = resolve(lib, api, k_nvrtc_syms, sizeof k_nvrtc_syms / sizeof k_nvrtc_syms[0]);
    if (miss) {
        char path[sizeof api->path];
        memcpy(path, api->path, sizeof path);
        dlclose(lib);
        memset(api, 0, sizeof *api);
        return dflash_fail(DFLASH_ERR_BACKEND, "%s lacks %s (NVRTC too old?)", path, miss);
    }
    api->lib = lib;
    return DFLASH_OK;
}

/* Kept mapped, as libcuda is (see dflash_cuda_api_unload). */
void dflash_nvrtc_api_unload(dflash_nvrtc_api *api) { memset(api, 0, sizeof *api); }

const char *dflash_cu_error_text(const dflash_cuda_api *api, CUresult r, char *buf, size_t len)
{
    const char *name = NULL, *text = NULL;
    if (api && api->cuGetErrorName && api->cuGetErrorName(r, &name) != DFLASH_CUDA_SUCCESS)
        name = NULL;
    if (api && api->cuGetErrorString && api->cuGetErrorString(r, &text) != DFLASH_CUDA_SUCCESS)
        text = NULL;
    if (name)
        snprintf(buf, len, "%s (%s)", name, text ? text : "no description");
    else
        snprintf(buf, len, "CUresult %d", r);
    return buf;
}

dflash_status dflash_cu_check(const dflash_cuda_api *api, CUresult r, const char *stmt, const char *file, int line)
{
    if (r == DFLASH_CUDA_SUCCESS)
        return DFLASH_OK;
    char text[256];
    return dflash_fail(DFLASH_ERR_BACKEND, "%s failed at %s:%d: %s", stmt, file, line,
                       dflash_cu_error_text(api, r, text, sizeof text));
}

dflash_status dflash_nvrtc_check(const dflash_nvrtc_api *api, nvrtcResult r, const char *stmt, const char *file,
                                 int line)
{
    if (r == 0)
        return DFLASH_OK;
    const char *text = api && api->nvrtcGetErrorString ? api->nvrtcGetErrorString(r) : NULL;
    return dflash_fail(DFLASH_ERR_BACKEND, "%s failed at %s:%d: %s", stmt, file, line,
                       text ? text : "unknown NVRTC error");
}
