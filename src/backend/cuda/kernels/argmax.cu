/* argmax.cu: per row, the index of the largest value, lowest index on ties,
 * with the CPU reference's exact semantics (a left-to-right scan that moves
 * only on a strictly greater value): NaN never becomes the best, except
 * that a NaN in column 0 is never displaced (nothing compares greater than
 * it), so that row's answer is 0. One block per row. */
#include "common.cuh"

#define AM_THREADS 1024

/* Is (a, ia) the better candidate than (b, ib)? NaN loses to any number. */
__forceinline__ bool am_better(float a, int ia, float b, int ib)
{
    const bool na = a != a, nb = b != b;
    if (na || nb)
        return !na ? true : (nb && ia < ib);
    return a > b || (a == b && ia < ib);
}

extern "C" __global__ void __launch_bounds__(AM_THREADS)
    dflash_argmax(const float *x, int cols, int *out, int vec)
{
    pdl_trigger();
    pdl_wait();
    __shared__ float sv[32];
    __shared__ int si[32];
    const float *r = x + (i64)blockIdx.x * cols;
    float bv = __int_as_float(0x7fc00000);
    int bi = 0x7fffffff;
    if (vec) {
        const float4 *r4 = (const float4 *)r;
        for (int t = threadIdx.x; t < cols / 4; t += AM_THREADS) {
            const float4 v = r4[t];
            if (am_better(v.x, 4 * t, bv, bi)) { bv = v.x; bi = 4 * t; }
            if (am_better(v.y, 4 * t + 1, bv, bi)) { bv = v.y; bi = 4 * t + 1; }
            if (am_better(v.z, 4 * t + 2, bv, bi)) { bv = v.z; bi = 4 * t + 2; }
            if (am_better(v.w, 4 * t + 3, bv, bi)) { bv = v.w; bi = 4 * t + 3; }
        }
    } else {
        for (int t = threadIdx.x; t < cols; t += AM_THREADS)
            if (am_better(r[t], t, bv, bi)) {
                bv = r[t];
                bi = t;
            }
    }
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (am_better(ov, oi, bv, bi)) {
            bv = ov;
            bi = oi;
        }
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) {
        sv[warp] = bv;
        si[warp] = bi;
    }
    __syncthreads();
    if (warp == 0) {
        bv = sv[lane];
        bi = si[lane];
        for (int o = 16; o > 0; o >>= 1) {
            const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
            const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (am_better(ov, oi, bv, bi)) {
                bv = ov;
                bi = oi;
            }
        }
        if (lane == 0) {
            const float x0 = r[0];
            out[blockIdx.x] = (x0 != x0 || bi == 0x7fffffff) ? 0 : bi;
        }
    }
}
