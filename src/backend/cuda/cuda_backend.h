/* cuda_backend.h: the CUDA backend (driver API + NVRTC-compiled kernels,
 * all reached through dlopen, so a binary without a GPU still links and
 * runs). Implements every op of backend.h on device memory. */
#ifndef DFLASH_BACKEND_CUDA_BACKEND_H
#define DFLASH_BACKEND_CUDA_BACKEND_H

#include "backend/backend.h"

/* Create a backend on CUDA device `device` (0 = first). Fails with
 * DFLASH_ERR_BACKEND and a message saying exactly why when there is no
 * usable GPU ("no NVIDIA driver (libcuda.so.1 not found: ...)",
 * "cuInit failed: CUDA_ERROR_NO_DEVICE (...)", ...), or when NVRTC is
 * missing or a kernel does not compile. The first run on a device arch
 * compiles the kernels (a few seconds) and caches them on disk.
 *
 * Errors found inside kernels (a token id outside the table, a KV position
 * whose block is outside the pool) cannot stop the op that found them: the
 * offending row is not written and the next sync or download returns
 * DFLASH_ERR_INVALID_ARG with the same message as the CPU backend. */
dflash_status dflash_backend_cuda_create(int device, dflash_backend **out);

/* For tools (tools/cuda/cuda_ops_check.c): time work on the backend's
 * stream with CUDA events. timer_start records the start event; timer_stop
 * records the stop event, waits for it and returns the milliseconds between
 * them. Not for the decode loop (timer_stop synchronizes). */
dflash_status dflash_cuda_timer_start(dflash_backend *be);
dflash_status dflash_cuda_timer_stop(dflash_backend *be, float *ms);
/* For tools: a device-to-device copy by the driver (the copy engine's
 * bandwidth, the ceiling a memory-bound kernel is measured against),
 * ordered on the backend's stream. */
dflash_status dflash_cuda_copy(dflash_backend *be, void *dst, const void *src, size_t bytes);
/* For tools: the driver's profiler switch (cuProfilerStart / Stop) after
 * the stream's work is done, so `ncu --profile-from-start off` sees
 * exactly the kernels launched between on = 1 and on = 0. */
dflash_status dflash_cuda_profile(dflash_backend *be, int on);
/* "NVIDIA H200 (sm_90a, 132 SMs)" */
const char *dflash_cuda_device_desc(dflash_backend *be);

#endif
