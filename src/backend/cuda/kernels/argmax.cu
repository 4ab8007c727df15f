/* argmax.cu: per row, the index of the largest value, lowest index on ties,
 * with the CPU reference's exact semantics (a left-to-right scan that moves
 * only on a strictly greater value): NaN never becomes the best, except
 * that a NaN in column 0 is never displaced (nothing compares greater than
 * it), so that row's answer is 0. One block per row. */
#include "common.cuh"

#define AM_THREADS 1024

extern "C" __global__ void __launch_bounds__(AM_THREADS)
    dflash_argmax(const float *x, int cols, int *out, int vec)
{
    pdl_trigger();
    pdl_wait();
    __shared__ float sv[32];
    __shared__ int si[32];
    const float *r = x + (i64)blockIdx.x * cols;
    float bv = __int_as_float(0x7fc00000);
    int bi = AM_NONE_IDX;
    if (vec) {
        const float4 *r4 = (const float4 *)r;
        for (int t = threadIdx.x; t < cols / 4; t += AM_THREADS) {
            const float4 v = r4[t];
            am_take(bv, bi, v.x, 4 * t);
            am_take(bv, bi, v.y, 4 * t + 1);
            am_take(bv, bi, v.z, 4 * t + 2);
            am_take(bv, bi, v.w, 4 * t + 3);
        }
    } else {
        for (int t = threadIdx.x; t < cols; t += AM_THREADS)
            am_take(bv, bi, r[t], t);
    }
    block_argmax(bv, bi, sv, si);
    if (threadIdx.x == 0) {
        const float x0 = r[0];
        out[blockIdx.x] = (x0 != x0 || bi == AM_NONE_IDX) ? 0 : bi;
    }
}
