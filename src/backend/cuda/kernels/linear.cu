/* linear.cu: out[n, N] = x[n, K] * W[N, K]^T for few rows (decode, verify,
 * propose: n <= 64), weight-streaming.
 *
 * 1-D grid of ceil(N / COLS) * ceil(n / ROWS) blocks, 256 threads. A block
 * owns COLS weight rows (output columns) and ROWS activation rows; its
 * threads stride over K, each loading 16 bytes of every owned weight row per
 * step (COLS loads in flight), then the block reduces its partial sums in a
 * fixed tree. The row tile is the fastest-varying block index, so the blocks
 * that share a weight slice run together and all but the first read it from
 * L2.
 * The summation order of an output depends only on K, never on n, so a
 * row's result does not change with the batch it shares (as on the CPU).
 * fp8 weights multiply the finished dot product by the row's scale, as the
 * CPU reference does. */
#include "common.cuh"

#define LIN_THREADS 256
#define LIN_COLS 4
#define LIN_ROWS 8

/* Decode the 16 bytes at byte offset `byte_off` of weight row `row` into E
 * floats (E = 8 for 16-bit types, 16 for fp8, 4 for f32). */
template <int DT, int E> __forceinline__ void load16(const void *W, i64 elem_off, float *dst)
{
    const uint4 raw = *(const uint4 *)((const u8 *)W + elem_off * (DT == DT_F8 ? 1 : (DT == DT_F32 ? 4 : 2)));
    const u32 w[4] = { raw.x, raw.y, raw.z, raw.w };
#pragma unroll
    for (int q = 0; q < 4; q++) {
        if (DT == DT_F32) {
            dst[q] = __uint_as_float(w[q]);
        } else if (DT == DT_BF16) {
            dst[2 * q] = __uint_as_float(w[q] << 16);
            dst[2 * q + 1] = __uint_as_float(w[q] & 0xffff0000u);
        } else if (DT == DT_F16) {
            dst[2 * q] = f16_to_f32((u16)(w[q] & 0xffffu));
            dst[2 * q + 1] = f16_to_f32((u16)(w[q] >> 16));
        } else {
#pragma unroll
            for (int b = 0; b < 4; b++)
                dst[4 * q + b] = fp8_to_f32((w[q] >> (8 * b)) & 0xffu);
        }
    }
}

template <int DT, bool VEC>
__forceinline__ void linear_body(const void *W, const float *scales, const float *x, float *out, int M, i64 N,
                                 i64 K)
{
    pdl_trigger();
    pdl_wait();
    __shared__ float red[LIN_THREADS / 32][LIN_ROWS * LIN_COLS];
    const int tiles = (M + LIN_ROWS - 1) / LIN_ROWS;
    const i64 c0 = (i64)(blockIdx.x / tiles) * LIN_COLS;
    const int m0 = (int)(blockIdx.x % tiles) * LIN_ROWS;
    const int rows = M - m0 < LIN_ROWS ? M - m0 : LIN_ROWS;
    float acc[LIN_ROWS][LIN_COLS];
#pragma unroll
    for (int r = 0; r < LIN_ROWS; r++)
#pragma unroll
        for (int c = 0; c < LIN_COLS; c++)
            acc[r][c] = 0.0f;

    if (VEC) {
        constexpr int E = DT == DT_F8 ? 16 : (DT == DT_F32 ? 4 : 8);
        for (i64 k = (i64)threadIdx.x * E; k < K; k += (i64)LIN_THREADS * E) {
            float w[LIN_COLS][E];
#pragma unroll
            for (int c = 0; c < LIN_COLS; c++) {
                if (c0 + c < N) {
                    load16<DT, E>(W, (c0 + c) * K + k, w[c]);
                } else {
#pragma unroll
                    for (int e = 0; e < E; e++)
                        w[c][e] = 0.0f;
                }
            }
#pragma unroll
            for (int r = 0; r < LIN_ROWS; r++) {
                if (r < rows) {
                    const float4 *xr = (const float4 *)(x + (i64)(m0 + r) * K + k);
#pragma unroll
                    for (int e4 = 0; e4 < E / 4; e4++) {
                        const float4 xv = xr[e4];
#pragma unroll
                        for (int c = 0; c < LIN_COLS; c++) {
                            acc[r][c] += xv.x * w[c][4 * e4];
                            acc[r][c] += xv.y * w[c][4 * e4 + 1];
                            acc[r][c] += xv.z * w[c][4 * e4 + 2];
                            acc[r][c] += xv.w * w[c][4 * e4 + 3];
                        }
                    }
                }
            }
        }
    } else {
        for (i64 k = threadIdx.x; k < K; k += LIN_THREADS) {
            float w[LIN_COLS];
#pragma unroll
            for (int c = 0; c < LIN_COLS; c++)
                w[c] = c0 + c < N ? load_elem(W, DT, (c0 + c) * K + k) : 0.0f;
#pragma unroll
            for (int r = 0; r < LIN_ROWS; r++) {
                if (r < rows) {
                    const float xv = x[(i64)(m0 + r) * K + k];
#pragma unroll
                    for (int c = 0; c < LIN_COLS; c++)
                        acc[r][c] += xv * w[c];
                }
            }
        }
    }

    /* Reduce: each warp in a shuffle tree, then the warps' sums in order. */
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int r = 0; r < LIN_ROWS; r++) {
        if (r < rows) {
#pragma unroll
            for (int c = 0; c < LIN_COLS; c++) {
                const float s = warp_sum(acc[r][c]);
                if (lane == 0)
                    red[warp][r * LIN_COLS + c] = s;
            }
        }
    }
    __syncthreads();
    if (threadIdx.x < LIN_ROWS * LIN_COLS) {
        const int r = threadIdx.x / LIN_COLS, c = threadIdx.x % LIN_COLS;
        if (r < rows && c0 + c < N) {
            float s = 0.0f;
#pragma unroll
            for (int wi = 0; wi < LIN_THREADS / 32; wi++)
                s += red[wi][threadIdx.x];
            if (DT == DT_F8)
                s *= scales[c0 + c];
            out[(i64)(m0 + r) * N + c0 + c] = s;
        }
    }
}

/* _v: vector path (K a multiple of the 16-byte element count, W and x rows
 * 16-byte aligned); _s: scalar path for anything else. */
#define LINEAR_KERNELS(name, DT)                                                                              \
    extern "C" __global__ void __launch_bounds__(LIN_THREADS) dflash_linear_##name##_v(                       \
        const void *W, const float *scales, const float *x, float *out, int M, i64 N, i64 K)                  \
    {                                                                                                         \
        linear_body<DT, true>(W, scales, x, out, M, N, K);                                                    \
    }                                                                                                         \
    extern "C" __global__ void __launch_bounds__(LIN_THREADS) dflash_linear_##name##_s(                       \
        const void *W, const float *scales, const float *x, float *out, int M, i64 N, i64 K)                  \
    {                                                                                                         \
        linear_body<DT, false>(W, scales, x, out, M, N, K);                                                   \
    }

LINEAR_KERNELS(bf16, DT_BF16)
LINEAR_KERNELS(f16, DT_F16)
LINEAR_KERNELS(f32, DT_F32)
LINEAR_KERNELS(fp8, DT_F8)
