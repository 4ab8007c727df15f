/* common.cuh: what every dflash kernel shares: fixed-width types, the dtype
 * codes (the values of dflash_dtype in src/core/dtype.h), element decoding
 * (bf16, f16, fp8 e4m3 -> f32, written by hand because NVRTC programs here
 * include no headers), warp/block reductions, programmatic dependent
 * launch, cp.async, and the device-side error report read back by the
 * host at the next sync.
 *
 * Compiled by NVRTC with -default-device, so plain functions are device
 * functions. */
#pragma once

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef long long i64;

/* dflash_dtype values (src/core/dtype.h). */
#define DT_F32 1
#define DT_F16 2
#define DT_BF16 3
#define DT_F8 4

/* DFLASH_KV_PAGE (positions per KV page), DFLASH_SEQ_INFO_LEN (fields
 * per sequence in seq_info) and DFLASH_ROUTE_MAX_EXPERTS (the most
 * experts a MoE layer routes over) come from backend.h as -D options. */
#if !defined(DFLASH_KV_PAGE) || !defined(DFLASH_SEQ_INFO_LEN) || !defined(DFLASH_ROUTE_MAX_EXPERTS)
#error "compile with -DDFLASH_KV_PAGE=... -DDFLASH_SEQ_INFO_LEN=... -DDFLASH_ROUTE_MAX_EXPERTS=... (cuda_compile.c passes them)"
#endif

/* Error codes a kernel can report (decoded in cuda_backend.c). */
#define ERR_EMBED_ID 1
#define ERR_KV_WRITE_PAGE 2
#define ERR_ATTN_PAGE 3
#define ERR_ATTN_KEYS 4 /* a sequence with more keys than the call's bound */

__forceinline__ float bf16_to_f32(u32 h) { return __uint_as_float(h << 16); }

/* Round to the nearest bf16 (even on ties), returned as f32. */
__forceinline__ float round_bf16(float f)
{
    u16 h;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return bf16_to_f32(h);
}

__forceinline__ float f16_to_f32(u16 h)
{
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

/* e4m3fn: the 7 magnitude bits placed at the top of an f32 exponent and
 * mantissa give 2^(e-127) (1 + m/8), or an f32 subnormal when e = 0; one exact
 * scale by 2^120 moves both to e4m3's bias of 7. Needs denormals kept (no
 * --ftz), which is NVRTC's default. Only S.1111.111 is NaN. */
__forceinline__ float fp8_to_f32(u32 b)
{
    u32 mag = b & 0x7fu;
    float v = __uint_as_float(mag << 20) * 1.329227995784916e36f; /* 2^120 */
    if (mag == 0x7fu)
        v = __uint_as_float(0x7fc00000u);
    return (b & 0x80u) ? -v : v;
}

/* Element i of a weight of dtype dt, widened to f32. */
__forceinline__ float load_elem(const void *p, int dt, i64 i)
{
    switch (dt) {
    case DT_BF16: return bf16_to_f32(((const u16 *)p)[i]);
    case DT_F16: return f16_to_f32(((const u16 *)p)[i]);
    case DT_F8: return fp8_to_f32(((const u8 *)p)[i]);
    default: return ((const float *)p)[i];
    }
}

__forceinline__ float warp_sum(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* Inclusive prefix sum over the warp's lanes (lane l gets lanes 0..l). */
__forceinline__ int warp_incl_sum(int v)
{
    const int lane = threadIdx.x & 31;
    for (int o = 1; o < 32; o <<= 1) {
        const int u = __shfl_up_sync(0xffffffffu, v, o);
        if (lane >= o)
            v += u;
    }
    return v;
}

__forceinline__ float warp_max(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* Sum over the block (blockDim.x a multiple of 32, at most 1024); every
 * thread gets the result. `scratch` holds 32 floats; the fixed tree makes
 * the result depend only on the block size, not on timing. */
__forceinline__ float block_sum(float v, float *scratch)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads(); /* scratch may still be read by a previous call */
    if (lane == 0)
        scratch[warp] = v;
    __syncthreads();
    v = lane < nw ? scratch[lane] : 0.0f;
    return warp_sum(v);
}

__forceinline__ float block_max(float v, float *scratch)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0)
        scratch[warp] = v;
    __syncthreads();
    v = lane < nw ? scratch[lane] : -__int_as_float(0x7f800000);
    return warp_max(v);
}

/* Argmax candidates (value, index) with the CPU scan's rules: the larger
 * value wins, the lower index on ties, NaN never wins over a number. The
 * empty candidate is (NaN, INT_MAX). */
#define AM_NONE_IDX 0x7fffffff
__forceinline__ bool am_better(float a, int ia, float b, int ib)
{
    const bool na = a != a, nb = b != b;
    if (na || nb)
        return !na ? true : (nb && ia < ib);
    return a > b || (a == b && ia < ib);
}

/* A logit no token can be decoded from: NaN or +inf. */
__forceinline__ int am_unusable(float v) { return v != v || v == __int_as_float(0x7f800000); }

__forceinline__ void am_take(float &bv, int &bi, float v, int i)
{
    if (am_better(v, i, bv, bi)) {
        bv = v;
        bi = i;
    }
}

/* The best candidate of the warp, in every lane. */
__forceinline__ void warp_argmax(float &bv, int &bi)
{
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        am_take(bv, bi, ov, oi);
    }
}

/* The best candidate of the block (blockDim.x a multiple of 32), valid in
 * warp 0; sv/si hold 32 entries. */
__forceinline__ void block_argmax(float &bv, int &bi, float *sv, int *si)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    warp_argmax(bv, bi);
    if (lane == 0) {
        sv[warp] = bv;
        si[warp] = bi;
    }
    __syncthreads();
    if (warp == 0) {
        bv = lane < nw ? sv[lane] : __int_as_float(0x7fc00000);
        bi = lane < nw ? si[lane] : AM_NONE_IDX;
        warp_argmax(bv, bi);
    }
}

/* Programmatic dependent launch (sm_90): the backend launches every
 * kernel allowed to start while the previous one is still running.
 * pdl_trigger lets the next kernel launch (it waits for this one's
 * completion before reading anything); pdl_wait blocks until the previous
 * kernel has finished and its writes are visible. Every kernel calls
 * pdl_wait before it reads or writes data another kernel touches; only
 * reads of weights (never written while kernels run) may come before. */
__forceinline__ void pdl_trigger()
{
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;");
#endif
}

__forceinline__ void pdl_wait()
{
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

/* A barrier of every thread of the cluster's blocks (sm_90+; of the
 * block where there are no clusters): what each wrote before, shared
 * memory of another block included, is seen by all after. */
__forceinline__ void cluster_sync()
{
#if __CUDA_ARCH__ >= 900
    asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
#else
    __syncthreads();
#endif
}

/* *p += v at device scope, returning the old value: a release of every
 * write ordered before it (a barrier orders the block's) and an acquire
 * of the writes released by the atomics before it on p. */
__forceinline__ int atom_add_acq_rel(int *p, int v)
{
    int old;
    asm volatile("atom.acq_rel.gpu.global.add.s32 %0, [%1], %2;" : "=r"(old) : "l"(p), "r"(v) : "memory");
    return old;
}

/* A flag word at device scope: an acquire load (what was released before
 * the value it reads is visible after it) and a release store. */
__forceinline__ int ld_acquire(const int *p)
{
    int v;
    asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

__forceinline__ void st_release(int *p, int v)
{
    asm volatile("st.release.gpu.global.b32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

/* Asynchronous 16-byte copies global -> shared (cp.async, sm_80+), in
 * groups: commit closes a group, cp_async_wait<N> waits until at most N
 * groups are still in flight. */
__forceinline__ u32 smem_addr(const void *p) { return (u32)__cvta_generic_to_shared(p); }

/* dst: a shared-window address (smem_addr) */
__forceinline__ void cp_async16_s(u32 dst, const void *src)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src));
}

__forceinline__ void cp_async16(void *dst, const void *src) { cp_async16_s(smem_addr(dst), src); }

__forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;"); }

template <int N> __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N)); }

/* Two f32 -> one bf16x2 register, `lo_elem` in the low half (round to
 * nearest even, as dflash_f32_to_bf16). */
__forceinline__ u32 pack_bf16(float lo_elem, float hi_elem)
{
    u32 r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi_elem), "f"(lo_elem));
    return r;
}

/* c += A B on the tensor cores: m16n8k16, bf16 in, f32 accumulate; a0..a3
 * the A fragment (16 x 16), b0, b1 the B fragment (16 x 8), c the lane's
 * four accumulators. */
__forceinline__ void mma_bf16(float *c, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1)
{
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/* KV pages (backend.h's layout [n_pages][n_layers][2][n_kv_heads]
 * [DFLASH_KV_PAGE][head_dim]): the pool block of position p of the
 * sequence *seq (its page table a ring of pt_len entries; -1 for p < 0),
 * where a head's K or V row of that position begins there, and one
 * element of such a row stored, f32 or rounded to bf16.
 * kv_write and the q/k norm's store share them: the same bits. */
__forceinline__ int kv_page_of(const int *page_tables, int pt_len, const int *seq, int p)
{
    return p >= 0 ? page_tables[(i64)*seq * pt_len + (p / DFLASH_KV_PAGE) % pt_len] : -1;
}

/* Where position p's row of KV head kh begins in pool block blk: its K
 * (which 0) or V (1) of `layer`, head_dim elements from there. */
__forceinline__ i64 kv_row_at(int blk, int n_layers, int layer, int which, int n_kv_heads, int kh, int p, int head_dim)
{
    return (((((i64)blk * n_layers + layer) * 2 + which) * n_kv_heads + kh) * DFLASH_KV_PAGE + p % DFLASH_KV_PAGE) *
           head_dim;
}

__forceinline__ void kv_store_elem(void *pool, int bf16, i64 at, float v)
{
    if (bf16) {
        u16 h;
        asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(v));
        ((u16 *)pool)[at] = h;
    } else {
        ((float *)pool)[at] = v;
    }
}

/* Record the first error of this stream's work: the device word `flag`
 * decides which report wins; the details go to mapped host memory, which the
 * host reads after its next synchronization (no copy on the normal path). */
__forceinline__ void report_error(int *flag, int *host, int code, int a, int b, int c)
{
    if (atomicCAS(flag, 0, code) == 0) {
        volatile int *h = host;
        h[1] = a;
        h[2] = b;
        h[3] = c;
        __threadfence_system();
        h[0] = code;
    }
}

/* Block stamps, compiled in only with -DDFLASH_STAMPS (the backend adds it
 * when DFLASH_CUDA_STAMPS names a file, and appends every module's records
 * there at exit; tools/cuda/block_stamps.py reads them): when a block
 * entered, passed its phases and ended, as the GPU ran a graph. One record
 * of STAMP_N words a block, written by thread 0 (its phases are thread
 * 0's; with STAMP_WARPS_*, by the block's last warp to end): [0] a GEMM's
 * weight rows n[0] | k << 32, or 0 for another kernel; [1] a GEMM's split
 * | m << 8 | weights << 16 | mode << 24 | last << 31, or another kernel's
 * STAMP_K_* code | its detail << 8; the linear block index << 32 in both;
 * [2] the SM; [3] %globaltimer at entry and [4] at the end (ns, one clock
 * for the GPU); [5] clock64 at entry and [6..10] at phases 1..5 (0: not
 * reached; SM cycles, finer than the timer's steps). A stamps build
 * changes nothing but the timing. */
#define STAMP_N 11
#define STAMP_K_ATTENTION 1  /* detail: query vectors of the block's sequence */
#define STAMP_K_MERGE 2      /* detail: splits */
#define STAMP_K_SPLIT_NORM 3 /* detail: the block's index in its cluster */
#define STAMP_K_QK_NORM 4    /* detail: heads a row (q + k) */
#ifdef DFLASH_STAMPS
#define STAMP_CAP (1 << 21)
__device__ unsigned long long dflash_stamps[STAMP_CAP * STAMP_N];
__device__ unsigned int dflash_stamp_count;
__forceinline__ unsigned long long stamp_timer()
{
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
/* rec[0], rec[1] filled by the caller; thread 0 only */
__forceinline__ void stamp_write(unsigned long long *rec)
{
    rec[4] = stamp_timer();
    u32 sm;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    rec[2] = sm;
    rec[1] |= (unsigned long long)(blockIdx.x + gridDim.x * (blockIdx.y + (unsigned long long)gridDim.y * blockIdx.z))
              << 32;
    /* a ring: a long run keeps its last STAMP_CAP records (its timed
     * calls), not the warm-up's */
    const unsigned int r = atomicAdd(&dflash_stamp_count, 1u) % STAMP_CAP;
#pragma unroll
    for (int i = 0; i < STAMP_N; i++)
        dflash_stamps[(unsigned long long)r * STAMP_N + i] = rec[i];
}
#define STAMP_BEGIN                                                                                           \
    unsigned long long stamp[STAMP_N] = {};                                                                   \
    if (threadIdx.x == 0) {                                                                                   \
        stamp[3] = stamp_timer();                                                                             \
        stamp[5] = clock64();                                                                                 \
    }
#define STAMP(i) (threadIdx.x == 0 ? (void)(stamp[5 + (i)] = clock64()) : (void)0)
/* the end of a kernel that is not a GEMM */
#define STAMP_END(kind, detail)                                                                               \
    do {                                                                                                      \
        if (threadIdx.x == 0) {                                                                               \
            stamp[1] = (unsigned long long)(kind) | (unsigned long long)(u32)(detail) << 8;                    \
            stamp_write(stamp);                                                                               \
        }                                                                                                     \
    } while (0)
/* A kernel whose warps end apart (each its own work): entry by thread 0,
 * the end by the last warp to finish, no phases. */
#define STAMP_WARPS_BEGIN                                                                                     \
    __shared__ unsigned long long stamp_entry;                                                                \
    __shared__ unsigned int stamp_done;                                                                       \
    if (threadIdx.x == 0) {                                                                                   \
        stamp_entry = stamp_timer();                                                                          \
        stamp_done = 0;                                                                                       \
    }                                                                                                         \
    __syncthreads();
#define STAMP_WARPS_END(kind, detail)                                                                         \
    do {                                                                                                      \
        __syncwarp();                                                                                         \
        if ((threadIdx.x & 31) == 0 && atomicAdd(&stamp_done, 1u) == (blockDim.x >> 5) - 1) {                 \
            unsigned long long rec[STAMP_N] = {};                                                             \
            rec[1] = (unsigned long long)(kind) | (unsigned long long)(u32)(detail) << 8;                      \
            rec[3] = stamp_entry;                                                                             \
            stamp_write(rec);                                                                                 \
        }                                                                                                     \
    } while (0)
#else
#define STAMP_BEGIN
#define STAMP(i) ((void)0)
#define STAMP_END(kind, detail) ((void)0)
#define STAMP_WARPS_BEGIN
#define STAMP_WARPS_END(kind, detail) ((void)0)
#endif
