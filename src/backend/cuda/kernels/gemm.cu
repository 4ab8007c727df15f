/* gemm.cu: out = x W^T for few activation rows (decode 1, verify and
 * propose 16, prefill chunks up to 64) on tensor cores, reading every weight
 * byte from memory once whatever the row count.
 *
 * The product is computed transposed, out^T = W x^T, with
 * mma.m16n8k16 (bf16 in, f32 accumulate): the A operand is 16 weight rows,
 * the B operand 8 activation rows, so one row pays for 8 and 16 rows for 16
 * (not 16 weight rows per activation row as a 16-row-high tile would).
 *
 * Exactness. Activations are f32 and the CPU reference multiplies them in
 * f32, so each one is split into two bf16 numbers, hi = bf16(x) and
 * lo = bf16(x - hi), and both are multiplied: x is represented to ~2^-17
 * relative, the weights (bf16, or fp8 e4m3 widened exactly) are exact, and
 * the products accumulate in f32. The result agrees with the CPU within f32
 * rounding of a different summation order.
 *
 * No shared memory for operands: the order of the k index inside one mma is
 * free (a dot product does not care), so each thread loads 16 contiguous
 * bytes of a weight row and of an activation row and both operands use the
 * same permutation: lane (g, t) holds physical k = k0 + 8t + {0..3} of rows
 * g and g+8 in the slots the instruction calls k = {2t, 2t+1, 2t+8, 2t+9},
 * and k0 + 8t + {4..7} for the next k16 step (fp8: 16 bytes, four steps).
 * Weights stream straight from DRAM into registers, a chunk ahead of use;
 * activation rows are small and come from L1/L2.
 *
 * Work split. A warp job is 16 weight rows x one K range; the S jobs of a
 * 16-row tile (split-K, S in 1..8) sit in one block and are summed in a
 * fixed order in shared memory. S depends only on the matrix shape and the
 * device, never on the number of activation rows, and every activation row
 * is an independent column of the mma: a row's result does not change with
 * the batch it shares (speculative output stays bit-identical to plain).
 *
 * Up to three weights with the same K share one launch (q, k, v), each with
 * its own output; or two (gate, up) whose outputs combine as
 * silu(gate) * up in the epilogue. */
#include "common.cuh"

#define GM_THREADS 256
#define GM_WARPS 8
/* 16-byte loads per weight row per thread per chunk (a chunk is loaded
 * while the previous one is multiplied): 4 while registers allow it (fp8
 * needs more of them to widen its weights). */
#define GM_LOADS(FP8, NT) ((NT) >= 8 ? ((FP8) ? 1 : 2) : ((FP8) && (NT) >= 4 ? 2 : 4))
#define GM_MAX_W 3

#define GM_STORE 0
#define GM_SWIGLU 1

/* cuda_backend.c mirrors this layout. */
struct gemm_args {
    const void *w[GM_MAX_W];       /* [n[i], k] bf16 or fp8 */
    const float *scales[GM_MAX_W]; /* fp8: [n[i]] per-row scales */
    float *out[GM_MAX_W];          /* [m, n[i]] */
    i64 n[GM_MAX_W];
    i64 tiles[GM_MAX_W];           /* ceil(n[i] / 16) */
    const float *x;                /* [m, k] */
    i64 k;
    int m, n_w, split, mode;
};
static_assert(sizeof(gemm_args) == 152, "mirrored by gemm_args in cuda_backend.c");

/* Two f32 -> one bf16x2 register, `lo_elem` in the low half (round to
 * nearest even, as dflash_f32_to_bf16). */
__forceinline__ u32 pack_bf16(float lo_elem, float hi_elem)
{
    u32 r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi_elem), "f"(lo_elem));
    return r;
}

/* The bf16 hi/lo split of four consecutive activations: hi[0] holds (a, b),
 * hi[1] (c, d); lo the remainders. */
__forceinline__ void split4(float4 v, u32 *hi, u32 *lo)
{
    hi[0] = pack_bf16(v.x, v.y);
    hi[1] = pack_bf16(v.z, v.w);
    lo[0] = pack_bf16(v.x - __uint_as_float(hi[0] << 16), v.y - __uint_as_float(hi[0] & 0xffff0000u));
    lo[1] = pack_bf16(v.z - __uint_as_float(hi[1] << 16), v.w - __uint_as_float(hi[1] & 0xffff0000u));
}

/* Two fp8 e4m3 (low byte first) -> bf16x2, exactly: e4m3 -> f16 is exact
 * and every e4m3 value is a normal f16 and a normal bf16. */
__forceinline__ u32 fp8x2_to_bf16x2(u32 two)
{
    u32 h;
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h) : "h"((u16)two));
    return pack_bf16(f16_to_f32((u16)(h & 0xffffu)), f16_to_f32((u16)(h >> 16)));
}

__forceinline__ void mma_bf16(float *c, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1)
{
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
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

__forceinline__ float4 load_x4(const float *x, int row, int m, i64 k, i64 off)
{
    return row < m ? *(const float4 *)(x + (i64)row * k + off) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
}

/* One k16 step: acc[j] += A * (hi + lo) of activation tile j, where tile j's
 * four activations of this lane start at x[8j + g][kpos]. One tile at a
 * time keeps few registers live. */
template <int NT>
__forceinline__ void mma_step(float (*acc)[4], u32 a0, u32 a1, u32 a2, u32 a3, const float *x, int m, i64 k,
                              i64 kpos, int g)
{
#pragma unroll
    for (int j = 0; j < NT; j++) {
        u32 hi[2], lo[2];
        split4(load_x4(x, 8 * j + g, m, k, kpos), hi, lo);
        mma_bf16(acc[j], a0, a1, a2, a3, hi[0], hi[1]);
        mma_bf16(acc[j], a0, a1, a2, a3, lo[0], lo[1]);
    }
}

/* 16 bytes of weight rows g (ra) and g+8 (rb) at kpos = k0 + 8t (bf16: two
 * k16 steps) or k0 + 16t (fp8: four), each 4-byte word of the load one
 * step's (row g, row g+8) x (k 2t..2t+1, 2t+8..2t+9) slots. */
template <int FP8, int NT>
__forceinline__ void gemm_step(float (*acc)[4], uint4 ra, uint4 rb, const float *x, int m, i64 k, i64 kpos, int g)
{
    if (!FP8) {
        mma_step<NT>(acc, ra.x, rb.x, ra.y, rb.y, x, m, k, kpos, g);
        mma_step<NT>(acc, ra.z, rb.z, ra.w, rb.w, x, m, k, kpos + 4, g);
    } else {
        const u32 wa[4] = { ra.x, ra.y, ra.z, ra.w }, wb[4] = { rb.x, rb.y, rb.z, rb.w };
#pragma unroll
        for (int q = 0; q < 4; q++)
            mma_step<NT>(acc, fp8x2_to_bf16x2(wa[q]), fp8x2_to_bf16x2(wb[q]), fp8x2_to_bf16x2(wa[q] >> 16),
                         fp8x2_to_bf16x2(wb[q] >> 16), x, m, k, kpos + 4 * q, g);
    }
}

__forceinline__ float gm_silu_mul(float g, float u) { return g / (1.0f + expf(-g)) * u; }

template <int FP8, int NT> __forceinline__ void gemm_body(const gemm_args &a)
{
    constexpr int KSTEP = FP8 ? 64 : 32; /* k covered by one 16-byte load across a thread group */
    constexpr int ESZ = FP8 ? 1 : 2;
    __shared__ float red[GM_WARPS][16][NT * 8];

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int G = a.mode == GM_SWIGLU ? 2 : 1, S = a.split, J = G * S, TB = GM_WARPS / J;
    const i64 n_tiles = a.mode == GM_SWIGLU ? a.tiles[0] : a.tiles[0] + a.tiles[1] + a.tiles[2];

    /* This warp's job: tile, weight (segment) and K slice. */
    const i64 tile_g = (i64)blockIdx.x * TB + warp / J;
    const int r = warp % J, s = r % S;
    int seg = a.mode == GM_SWIGLU ? r / S : 0;
    i64 tile = tile_g;
    if (a.mode != GM_SWIGLU)
        while (seg < a.n_w - 1 && tile >= a.tiles[seg]) {
            tile -= a.tiles[seg];
            seg++;
        }
    const bool valid = tile_g < n_tiles;
    const i64 steps = a.k / KSTEP, per = (steps + S - 1) / S;
    const i64 s0 = (i64)s * per, s1 = s0 + per < steps ? s0 + per : steps;
    const i64 row_a = tile * 16 + g, row_b = row_a + 8, nseg = a.n[seg];
    const u8 *wbase = (const u8 *)a.w[seg];
    const u8 *pa = wbase + (row_a * a.k + (i64)t * (KSTEP / 4)) * ESZ;
    const u8 *pb = wbase + (row_b * a.k + (i64)t * (KSTEP / 4)) * ESZ;
    const bool ok_a = valid && row_a < nseg, ok_b = valid && row_b < nseg;

    float acc[NT][4];
#pragma unroll
    for (int j = 0; j < NT; j++)
        acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;

    if (valid && s0 < s1) {
        const uint4 zero = make_uint4(0, 0, 0, 0);
        constexpr int L = GM_LOADS(FP8, NT);
        uint4 ca[L], cb[L];
#pragma unroll
        for (int u = 0; u < L; u++) {
            const i64 st = s0 + u;
            const i64 off = st * KSTEP * ESZ;
            ca[u] = ok_a && st < s1 ? load_stream(pa + off) : zero;
            cb[u] = ok_b && st < s1 ? load_stream(pb + off) : zero;
        }
        for (i64 c0 = s0; c0 < s1; c0 += L) {
            uint4 na[L], nb[L];
#pragma unroll
            for (int u = 0; u < L; u++) {
                const i64 st = c0 + L + u;
                const i64 off = st * KSTEP * ESZ;
                na[u] = ok_a && st < s1 ? load_stream(pa + off) : zero;
                nb[u] = ok_b && st < s1 ? load_stream(pb + off) : zero;
            }
#pragma unroll
            for (int u = 0; u < L; u++)
                if (c0 + u < s1)
                    gemm_step<FP8, NT>(acc, ca[u], cb[u], a.x, a.m, a.k, (c0 + u) * KSTEP + t * (KSTEP / 4), g);
#pragma unroll
            for (int u = 0; u < L; u++) {
                ca[u] = na[u];
                cb[u] = nb[u];
            }
        }
    }

    /* C fragment: (weight row g / g+8, activation rows 8j + 2t, +1). */
#pragma unroll
    for (int j = 0; j < NT; j++) {
        red[warp][g][8 * j + 2 * t] = acc[j][0];
        red[warp][g][8 * j + 2 * t + 1] = acc[j][1];
        red[warp][g + 8][8 * j + 2 * t] = acc[j][2];
        red[warp][g + 8][8 * j + 2 * t + 1] = acc[j][3];
    }
    __syncthreads();

    /* Epilogue: sum the K slices in order, then store (consecutive threads
     * take consecutive output columns). */
    const int M = a.m;
    for (int e = threadIdx.x; e < TB * 16 * M; e += GM_THREADS) {
        const int tb = e / (16 * M), rem = e % (16 * M), mrow = rem / 16, rr = rem % 16;
        const i64 tg = (i64)blockIdx.x * TB + tb;
        if (tg >= n_tiles)
            continue;
        float y0 = 0.0f, y1 = 0.0f;
        int sg = 0;
        i64 tl = tg;
        if (a.mode != GM_SWIGLU)
            while (sg < a.n_w - 1 && tl >= a.tiles[sg]) {
                tl -= a.tiles[sg];
                sg++;
            }
        const i64 col = tl * 16 + rr;
        if (col >= a.n[sg])
            continue;
        for (int si = 0; si < S; si++)
            y0 += red[tb * J + si][rr][mrow];
        if (FP8)
            y0 *= a.scales[sg][col];
        if (a.mode == GM_SWIGLU) {
            for (int si = 0; si < S; si++)
                y1 += red[tb * J + S + si][rr][mrow];
            if (FP8)
                y1 *= a.scales[1][col];
            a.out[0][(i64)mrow * a.n[0] + col] = gm_silu_mul(y0, y1);
        } else {
            a.out[sg][(i64)mrow * a.n[sg] + col] = y0;
        }
    }
}

/* One kernel per weight type and activation tile count (rows <= 8 NT). */
#define GEMM_KERNEL(name, FP8, NT)                                                                            \
    extern "C" __global__ void __launch_bounds__(GM_THREADS, 2) dflash_gemm_##name##_##NT(const gemm_args a) \
    {                                                                                                         \
        gemm_body<FP8, NT>(a);                                                                                \
    }

GEMM_KERNEL(bf16, 0, 1)
GEMM_KERNEL(bf16, 0, 2)
GEMM_KERNEL(bf16, 0, 4)
GEMM_KERNEL(bf16, 0, 8)
GEMM_KERNEL(fp8, 1, 1)
GEMM_KERNEL(fp8, 1, 2)
GEMM_KERNEL(fp8, 1, 4)
GEMM_KERNEL(fp8, 1, 8)
