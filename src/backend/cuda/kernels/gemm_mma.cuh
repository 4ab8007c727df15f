/* gemm_mma.cuh: what the two tensor-core GEMMs (gemm.cu for up to 64
 * activation rows, gemm_wide.cu for more) share, and must share for their
 * results to be the same bits: the argument block, the activation split,
 * the mma and its operand order, the streaming weight load and the
 * epilogue.
 *
 * The product is computed transposed, out^T = W x^T, with
 * mma.m16n8k16 (bf16 in, f32 accumulate): the A operand is 16 weight rows,
 * the B operand 8 activation rows, so one activation row pays for 8.
 * gemm_wide.cu swaps the two (activations A, weights B): the same k slots
 * and products for every output, only the tile transposed.
 *
 * Exactness. Activations are f32 and the CPU reference multiplies them in
 * f32, so each one is split into two bf16 numbers, hi = bf16(x) and
 * lo = bf16(x - hi), and both are multiplied: x is represented to ~2^-17
 * relative, the weights (bf16, or fp8 e4m3 widened exactly) are exact, and
 * the products accumulate in f32. The result agrees with the CPU within f32
 * rounding of a different summation order.
 *
 * Operand order. Inside one mma the order of the k index is free (a dot
 * product does not care), so each thread loads 16 contiguous bytes of a
 * weight row and both operands use the same permutation: lane (g, t) holds
 * physical k = k0 + 8t + {0..3} of rows g and g+8 in the slots the
 * instruction calls k = {2t, 2t+1, 2t+8, 2t+9}, and k0 + 8t + {4..7} for the
 * next k16 step (fp8: 16 bytes, four steps).
 *
 * Batch independence. An output (weight row, activation row) is the same
 * sequence of operations in both kernels, whatever rows share the call:
 * K cut into S slices of ceil(steps / S) k32 steps (k64 for fp8), S a
 * function of the matrix shape and the device only (cuda_gemm.c); within a
 * slice, from zero, for each 32-wide step (fp8: 64) in order, the k16 steps
 * in order, each as mma(hi) then mma(lo); the slices' sums then added to
 * 0.0f in slice order (S = 1: the one sum as it is); fp8 scale, SwiGLU or
 * store last (gm_emit4). Every activation row is an independent column of
 * the mma, so a row's result does not change with the batch it shares
 * (speculative output stays bit-identical to plain). */
#pragma once

#include "common.cuh"

#define GM_THREADS 256
#define GM_WARPS 8
#define GM_RB 128 /* weight rows per block (SwiGLU: 64 of gate and 64 of up) */
#define GM_MAX_W 4

#define GM_STORE 0
#define GM_SWIGLU 1
#define GM_ARGMAX 2
#define GM_GATED_ADD 3 /* out[0] += sigmoid(gate[row]) * the product (a MoE's shared expert); with sum_k,
                          out[0] is first the weighted sum of sum_k rows of sum_src (the routed experts') */
#define GM_PARTIALS 4   /* split > 1: the slices' partials in ws, summed by the next kernel (gemm.cu) */

/* cuda_gemm.c mirrors this layout. */
struct gemm_args {
    const void *w[GM_MAX_W];       /* [n[i], k] bf16 or fp8 */
    const float *scales[GM_MAX_W]; /* fp8: [n[i]] per-row scales */
    float *out[GM_MAX_W];          /* [m, n[i]] */
    i64 n[GM_MAX_W];
    i64 blocks[GM_MAX_W];          /* row blocks of each weight */
    const float *x;                /* [m, k] */
    i64 k;
    float *ws;                     /* gemm.cu, split > 1: partials [split][m][columns, see gm_ws_off];
                                      gemm_wide.cu: x split into hi/lo A fragments (dflash_gemm_split_x) */
    int *counters;                 /* gemm.cu, split > 1: [row blocks], zero between calls */
    float *am_val;                 /* argmax: [m][row blocks] best value */
    int *am_idx;                   /* argmax: [m][row blocks] its column */
    int *am_bad;                   /* argmax: [m] the row holds a NaN or +inf (reset by the finish) */
    const float *gate;             /* gated add: [m] gate logits */
    const int *x_rows;             /* gemm.cu, or NULL: activation row r is x's row x_rows[r] (gathered rows) */
    const float *sum_src;          /* gated add, sum_k > 0: [.., n[0]] rows, ... */
    const int *sum_idx;            /* ... row m's terms sum_idx[m sum_k ..] of them ... */
    const float *sum_w;            /* ... times sum_w[m sum_k ..] (gather_sum's arguments) */
    int m, n_w, split, mode, store, sum_k;
    int share_sum;                 /* gemm.cu, split > 1: 0, or the slices of a row block add its partials
                                      together, a slice waiting at most this many cycles for the others
                                      (not with argmax) */
};
static_assert(sizeof(gemm_args) == 288, "mirrored by gemm_args in cuda_gemm.c");

/* The bf16 hi/lo split of four consecutive activations as one 16-byte B
 * fragment source: {hi(a, b), hi(c, d), lo(a, b), lo(c, d)}. */
__forceinline__ uint4 split4(float4 v)
{
    uint4 r;
    r.x = pack_bf16(v.x, v.y);
    r.y = pack_bf16(v.z, v.w);
    r.z = pack_bf16(v.x - __uint_as_float(r.x << 16), v.y - __uint_as_float(r.x & 0xffff0000u));
    r.w = pack_bf16(v.z - __uint_as_float(r.y << 16), v.w - __uint_as_float(r.y & 0xffff0000u));
    return r;
}

/* Two fp8 e4m3 (low byte first) -> bf16x2, exactly: e4m3 -> f16 is exact
 * and every e4m3 value is a normal f16 and a normal bf16. */
__forceinline__ u32 fp8x2_to_bf16x2(u32 two)
{
    u32 h;
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h) : "h"((u16)two));
    return pack_bf16(f16_to_f32((u16)(h & 0xffffu)), f16_to_f32((u16)(h >> 16)));
}

/* Weights are read once: keep them out of L1 and ask L2 for whole 256-byte
 * lines (each thread group reads a row's 256 contiguous bytes per chunk). */
__forceinline__ uint4 load_stream(const void *p)
{
    uint4 r;
    asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "l"(p));
    return r;
}

__forceinline__ float gm_silu_mul(float g, float u) { return g / (1.0f + expf(-g)) * u; }

/* The end of four adjacent outputs col4..col4+3 of activation row m, their
 * final sums in y0 (SwiGLU: gate in y0, up in y1) and live[j] saying
 * which exist: fp8 row scales, then silu(gate) * up, the gated add or the
 * store (when asked), and in argmax mode the row's candidate (bv, bi) and
 * its unusable-number flag. The gated add rounds as the composition it
 * replaces does (gather_sum's products and sums in term order, then
 * sigmoid_mul's product, then add's sum; never fused). */
template <int FP8>
__forceinline__ void gm_emit4(const gemm_args &a, int seg, bool swiglu, i64 m, i64 col4, const bool *live, float *y0,
                              float *y1, float &bv, int &bi)
{
#pragma unroll
    for (int j = 0; j < 4; j++) {
        if (!live[j])
            continue;
        const i64 col = col4 + j;
        if (FP8) {
            y0[j] *= a.scales[swiglu ? 0 : seg][col];
            if (swiglu)
                y1[j] *= a.scales[1][col];
        }
        if (swiglu) {
            a.out[0][m * a.n[0] + col] = gm_silu_mul(y0[j], y1[j]);
        } else if (a.mode == GM_GATED_ADD) {
            float *o = a.out[0] + m * a.n[0] + col;
            float base = 0.0f;
            if (a.sum_k > 0) {
                for (int t = 0; t < a.sum_k; t++) {
                    const i64 at = m * a.sum_k + t;
                    base = __fadd_rn(base, __fmul_rn(a.sum_w[at], a.sum_src[(i64)a.sum_idx[at] * a.n[0] + col]));
                }
            } else {
                base = *o;
            }
            *o = __fadd_rn(base, __fmul_rn(y0[j], 1.0f / (1.0f + expf(-a.gate[m]))));
        } else if (a.store)
            a.out[seg][m * a.n[seg] + col] = y0[j];
        if (a.mode == GM_ARGMAX) {
            am_take(bv, bi, y0[j], (int)col);
            if (am_unusable(y0[j]))
                a.am_bad[m] = 1;
        }
    }
}
