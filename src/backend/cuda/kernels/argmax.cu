/* argmax.cu: per row, the index of the largest value, lowest index on ties,
 * with the CPU reference's semantics: -1 when the row holds a NaN or +inf
 * or nothing above -inf (logits with no usable number). One block per row. */
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
    int bi = AM_NONE_IDX, bad = 0;
    if (vec) {
        const float4 *r4 = (const float4 *)r;
        for (int t = threadIdx.x; t < cols / 4; t += AM_THREADS) {
            const float4 v = r4[t];
            bad |= am_unusable(v.x) | am_unusable(v.y) | am_unusable(v.z) | am_unusable(v.w);
            am_take(bv, bi, v.x, 4 * t);
            am_take(bv, bi, v.y, 4 * t + 1);
            am_take(bv, bi, v.z, 4 * t + 2);
            am_take(bv, bi, v.w, 4 * t + 3);
        }
    } else {
        for (int t = threadIdx.x; t < cols; t += AM_THREADS) {
            bad |= am_unusable(r[t]);
            am_take(bv, bi, r[t], t);
        }
    }
    bad = __syncthreads_or(bad);
    block_argmax(bv, bi, sv, si);
    if (threadIdx.x == 0)
        out[blockIdx.x] = bad || !(bv > -__int_as_float(0x7f800000)) ? -1 : bi;
}
