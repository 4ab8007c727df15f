/* gemm.cu: out = x W^T for few activation rows (decode 1, verify and
 * propose 16, prefill chunks up to 64) on tensor cores, reading every weight
 * byte from memory once whatever the row count.
 *
 * The product is computed transposed, out^T = W x^T, with
 * mma.m16n8k16 (bf16 in, f32 accumulate): the A operand is 16 weight rows,
 * the B operand 8 activation rows, so one activation row pays for 8.
 *
 * Exactness. Activations are f32 and the CPU reference multiplies them in
 * f32, so each one is split into two bf16 numbers, hi = bf16(x) and
 * lo = bf16(x - hi), and both are multiplied: x is represented to ~2^-17
 * relative, the weights (bf16, or fp8 e4m3 widened exactly) are exact, and
 * the products accumulate in f32. The result agrees with the CPU within f32
 * rounding of a different summation order.
 *
 * Layout of the work. A block is 8 warps over 128 weight rows (16 each) and
 * one K slice; the blocks of a row block's S slices (split-K) write
 * partial sums to a workspace and the last one to arrive adds them in
 * slice order (a counter per row block), then runs the epilogue. Weights
 * stream from DRAM straight into registers, a chunk ahead of use. The
 * block's activation rows are split into hi/lo once per chunk into shared
 * memory, where all 8 warps read them: activations cost L2 traffic of
 * M / 64 of the weights' (M rows), not a re-read per warp.
 *
 * Operand order. Inside one mma the order of the k index is free (a dot
 * product does not care), so each thread loads 16 contiguous bytes of a
 * weight row and both operands use the same permutation: lane (g, t) holds
 * physical k = k0 + 8t + {0..3} of rows g and g+8 in the slots the
 * instruction calls k = {2t, 2t+1, 2t+8, 2t+9}, and k0 + 8t + {4..7} for the
 * next k16 step (fp8: 16 bytes, four steps).
 *
 * Batch independence. S depends only on the matrix shape and the device,
 * never on the number of activation rows, and every activation row is an
 * independent column of the mma: a row's result does not change with the
 * batch it shares (speculative output stays bit-identical to plain).
 *
 * Epilogues: store (up to three weights with the same K share a launch,
 * each with its own output: q, k, v); SwiGLU (two weights, gate and up:
 * a block takes 64 rows of each and writes silu(gate) * up); argmax (the
 * best column of each activation row within the block, for
 * dflash_argmax_finish; the outputs themselves are stored only on request). */
#include "common.cuh"

#define GM_THREADS 256
#define GM_WARPS 8
#define GM_RB 128 /* weight rows per block (SwiGLU: 64 of gate and 64 of up) */
#define GM_MAX_W 3
#define GM_SPLIT_BATCH 16 /* split-K partials (a float4 each) a thread requests together */
/* 16-byte weight loads per weight row per thread per chunk (a chunk is
 * loaded while the previous one is multiplied). */
#define GM_LOADS(FP8, NT) ((NT) >= 8 ? ((FP8) ? 1 : 2) : (NT) >= 4 || (FP8) ? 2 : 4)

#define GM_STORE 0
#define GM_SWIGLU 1
#define GM_ARGMAX 2

/* cuda_gemm.c mirrors this layout. */
struct gemm_args {
    const void *w[GM_MAX_W];       /* [n[i], k] bf16 or fp8 */
    const float *scales[GM_MAX_W]; /* fp8: [n[i]] per-row scales */
    float *out[GM_MAX_W];          /* [m, n[i]] */
    i64 n[GM_MAX_W];
    i64 blocks[GM_MAX_W];          /* row blocks of each weight */
    const float *x;                /* [m, k] */
    i64 k;
    float *ws;                     /* split > 1: partials [split][m][columns, see gm_ws_off] */
    int *counters;                 /* split > 1: [row blocks], zero between calls */
    float *am_val;                 /* argmax: [m][row blocks] best value */
    int *am_idx;                   /* argmax: [m][row blocks] its column */
    int *am_bad;                   /* argmax: [m] the row holds a NaN or +inf (reset by the finish) */
    int m, n_w, split, mode, store;
};
static_assert(sizeof(gemm_args) == 200, "mirrored by gemm_args in cuda_gemm.c");

/* Two f32 -> one bf16x2 register, `lo_elem` in the low half (round to
 * nearest even, as dflash_f32_to_bf16). */
__forceinline__ u32 pack_bf16(float lo_elem, float hi_elem)
{
    u32 r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi_elem), "f"(lo_elem));
    return r;
}

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

/* One k16 step: acc[j] += A * (hi + lo) of activation tile j, whose B
 * fragment source for this lane is xs[(8j + g) * XW + idx]. */
template <int NT, int XW>
__forceinline__ void mma_step(float (*acc)[4], u32 a0, u32 a1, u32 a2, u32 a3, const uint4 *xs, int g, int idx)
{
#pragma unroll
    for (int j = 0; j < NT; j++) {
        const uint4 b = xs[(8 * j + g) * XW + idx];
        mma_bf16(acc[j], a0, a1, a2, a3, b.x, b.y);
        mma_bf16(acc[j], a0, a1, a2, a3, b.z, b.w);
    }
}

__forceinline__ float gm_silu_mul(float g, float u) { return g / (1.0f + expf(-g)) * u; }

/* Where weight `seg`'s columns start in a workspace row: every weight
 * before it rounded up to 4 columns (n_w: the row's length). */
__forceinline__ i64 gm_ws_off(const gemm_args &a, int seg)
{
    i64 off = 0;
    for (int i = 0; i < seg; i++)
        off += (a.n[i] + 3) & ~(i64)3;
    return off;
}

template <int FP8, int NT> __forceinline__ void gemm_body(const gemm_args &a)
{
    constexpr int KSTEP = FP8 ? 64 : 32; /* k covered by one 16-byte load across a thread group */
    constexpr int ESZ = FP8 ? 1 : 2;
    constexpr int L = GM_LOADS(FP8, NT);
    constexpr int KC = L * KSTEP;       /* k per chunk */
    constexpr int XW = KC / 4 + 1;      /* uint4 per staged activation row (+1: no bank conflicts) */
    constexpr int MP = NT * 8;          /* activation rows the tiles cover */
    constexpr int XS_BYTES = MP * XW * 16, RED_BYTES = GM_WARPS * 16 * MP * 4;
    constexpr int XV = MP * (KC / 4) / GM_THREADS; /* float4 of a chunk each thread stages */
    __shared__ __align__(16) unsigned char smem[XS_BYTES > RED_BYTES ? XS_BYTES : RED_BYTES];
    __shared__ int is_last;
    uint4 *xs = (uint4 *)smem;
    float(*red)[16][MP] = (float(*)[16][MP])smem;

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int S = a.split, M = a.m;
    const i64 rb = blockIdx.x / S;
    const int s = (int)(blockIdx.x % S);
    const bool swiglu = a.mode == GM_SWIGLU;

    /* This block's weight (segment) and first row; this warp's rows. */
    int seg = 0;
    i64 rbl = rb; /* row block within its segment */
    if (!swiglu)
        while (seg < a.n_w - 1 && rbl >= a.blocks[seg]) {
            rbl -= a.blocks[seg];
            seg++;
        }
    const int rows_per_block = swiglu ? GM_RB / 2 : GM_RB;
    const int wseg = swiglu ? warp / 4 : seg;
    const i64 row_a = rbl * rows_per_block + (swiglu ? warp % 4 : warp) * 16 + g, row_b = row_a + 8;
    const i64 nseg = a.n[wseg];
    const u8 *wbase = (const u8 *)a.w[wseg];
    const u8 *pa = wbase + (row_a * a.k + (i64)t * (KSTEP / 4)) * ESZ;
    const u8 *pb = wbase + (row_b * a.k + (i64)t * (KSTEP / 4)) * ESZ;
    const bool ok_a = row_a < nseg, ok_b = row_b < nseg;

    const i64 steps = a.k / KSTEP, per = (steps + S - 1) / S;
    const i64 s0 = (i64)s * per, s1 = s0 + per < steps ? s0 + per : steps;

    float acc[NT][4];
#pragma unroll
    for (int j = 0; j < NT; j++)
        acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;

    /* Chunk loads: this thread's weights (L x rows g, g+8) and its share of
     * the activations (XV float4: staged element e = threadIdx.x + i * 256
     * is row e / (KC / 4), float4 e % (KC / 4)). */
    const uint4 zero = make_uint4(0, 0, 0, 0);
    uint4 ca[L], cb[L];
    float4 cx[XV];
    auto load_weights = [&](i64 c0, uint4 *wa, uint4 *wb) {
#pragma unroll
        for (int u = 0; u < L; u++) {
            const i64 st = c0 + u, off = st * KSTEP * ESZ;
            wa[u] = ok_a && st < s1 ? load_stream(pa + off) : zero;
            wb[u] = ok_b && st < s1 ? load_stream(pb + off) : zero;
        }
    };
    auto load_x = [&](i64 c0, float4 *xv) {
#pragma unroll
        for (int i = 0; i < XV; i++) {
            const int e = threadIdx.x + i * GM_THREADS, row = e / (KC / 4), q = e % (KC / 4);
            const i64 kk = c0 * KSTEP + 4 * q;
            xv[i] = row < M && kk < s1 * KSTEP ? *(const float4 *)(a.x + (i64)row * a.k + kk)
                                               : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
    };
    /* The first weights stream in while the previous kernel may still be
     * finishing (weights are never written); everything else waits. */
    pdl_trigger();
    if (s0 < s1)
        load_weights(s0, ca, cb);
    pdl_wait();
    if (s0 < s1)
        load_x(s0, cx);
    for (i64 c0 = s0; c0 < s1; c0 += L) {
        /* stage this chunk's activations, split, for all warps */
#pragma unroll
        for (int i = 0; i < XV; i++) {
            const int e = threadIdx.x + i * GM_THREADS;
            xs[(e / (KC / 4)) * XW + e % (KC / 4)] = split4(cx[i]);
        }
        __syncthreads();
        uint4 na[L], nb[L];
        load_weights(c0 + L, na, nb);
        load_x(c0 + L, cx);
#pragma unroll
        for (int u = 0; u < L; u++) {
            if (c0 + u >= s1)
                break;
            if (!FP8) {
                /* bf16: this lane's 8 weights are k = u * 32 + 8t + 0..7 of the chunk */
                const int idx = u * 8 + 2 * t;
                mma_step<NT, XW>(acc, ca[u].x, cb[u].x, ca[u].y, cb[u].y, xs, g, idx);
                mma_step<NT, XW>(acc, ca[u].z, cb[u].z, ca[u].w, cb[u].w, xs, g, idx + 1);
            } else {
                /* fp8: 16 weights, k = u * 64 + 16t + 0..15, four k16 steps */
                const u32 wa[4] = { ca[u].x, ca[u].y, ca[u].z, ca[u].w }, wb[4] = { cb[u].x, cb[u].y, cb[u].z,
                                                                                   cb[u].w };
#pragma unroll
                for (int q = 0; q < 4; q++)
                    mma_step<NT, XW>(acc, fp8x2_to_bf16x2(wa[q]), fp8x2_to_bf16x2(wb[q]),
                                     fp8x2_to_bf16x2(wa[q] >> 16), fp8x2_to_bf16x2(wb[q] >> 16), xs, g,
                                     u * 16 + 4 * t + q);
            }
        }
        __syncthreads(); /* the next chunk overwrites xs */
#pragma unroll
        for (int u = 0; u < L; u++) {
            ca[u] = na[u];
            cb[u] = nb[u];
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

    /* The block's outputs: column c of the block (0..127; SwiGLU: 0..63 for
     * gate, 64..127 for up), activation row m; its column over all
     * weights and within its own. */
    /* Workspace row: each weight's columns from a multiple of 4, so the
     * last block reads four adjacent columns as one float4. */
    const i64 n_ws = gm_ws_off(a, a.n_w);
    if (S > 1) {
        for (int e = threadIdx.x; e < M * GM_RB; e += GM_THREADS) {
            const int m = e / GM_RB, c = e % GM_RB;
            const int sg = swiglu ? c / 64 : seg;
            const i64 col = rbl * rows_per_block + (swiglu ? c % 64 : c);
            if (col < a.n[sg])
                __stcg(a.ws + ((i64)s * M + m) * n_ws + gm_ws_off(a, sg) + col, red[c / 16][c % 16][m]);
        }
        __threadfence();
        __syncthreads();
        if (threadIdx.x == 0) {
            const int prev = atomicAdd(a.counters + rb, 1);
            is_last = prev == S - 1;
            if (is_last)
                a.counters[rb] = 0; /* ready for the next call */
        }
        __syncthreads();
        if (!is_last)
            return;
        __threadfence();
    }
    /* Final values, four adjacent columns c4..c4+3 of one activation row
     * per thread: the block's own sums (one slice) or every slice's,
     * added in slice order; the partials are requested together (below),
     * so a pass costs ceil(H S / GM_SPLIT_BATCH) round trips to L2, not
     * one per (slice, column). Without SwiGLU a row's 128 columns are one
     * warp's 32 quads, so its argmax candidate comes out of one warp
     * reduction. */
    const int n_out = swiglu ? GM_RB / 2 : GM_RB, quads = n_out / 4;
    const int items = M * quads; /* without SwiGLU a multiple of 32: whole warps are in or out */
    const i64 nseg_out = a.n[swiglu ? 0 : seg];
    for (int e0 = 0; e0 < (items + GM_THREADS - 1) / GM_THREADS * GM_THREADS; e0 += GM_THREADS) {
        const int e = e0 + threadIdx.x;
        const bool in = e < items;
        const int m = in ? e / quads : 0, c4 = (e % quads) * 4;
        const i64 col4 = rbl * rows_per_block + c4;
        bool live[4];
        float y0[4], y1[4];
#pragma unroll
        for (int j = 0; j < 4; j++) {
            live[j] = in && col4 + j < nseg_out;
            y0[j] = y1[j] = 0.0f;
        }
        if (S == 1) {
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const int c = c4 + j;
                y0[j] = red[c / 16][c % 16][m];
                if (swiglu)
                    y1[j] = red[4 + c / 16][c % 16][m];
            }
        } else {
            /* Load l of the H * S this thread needs (SwiGLU: gate and
             * up, H = 2) is slice l % S of half l / S; a batch requests
             * GM_SPLIT_BATCH of them (more would spill registers), and each
             * half's slices are added in slice order. Columns past the
             * weight's end are padding, loaded and unused. */
            const int H = swiglu ? 2 : 1, n_loads = H * S;
            const i64 stride = (i64)M * n_ws, row_off = (i64)m * n_ws + col4;
            const float *p0 = a.ws + row_off + gm_ws_off(a, swiglu ? 0 : seg), *p1 = a.ws + row_off + gm_ws_off(a, 1);
            for (int l0 = 0; l0 < n_loads; l0 += GM_SPLIT_BATCH) {
                float4 part[GM_SPLIT_BATCH];
#pragma unroll
                for (int b = 0; b < GM_SPLIT_BATCH; b++) {
                    const int l = l0 + b, h = l >= S, sl = l - h * S;
                    part[b] = l < n_loads && in ? __ldcg((const float4 *)((h ? p1 : p0) + sl * stride))
                                                : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                }
#pragma unroll
                for (int b = 0; b < GM_SPLIT_BATCH; b++) {
                    const int l = l0 + b;
                    if (l >= n_loads)
                        break;
                    if (l < S) {
                        y0[0] += part[b].x;
                        y0[1] += part[b].y;
                        y0[2] += part[b].z;
                        y0[3] += part[b].w;
                    } else {
                        y1[0] += part[b].x;
                        y1[1] += part[b].y;
                        y1[2] += part[b].z;
                        y1[3] += part[b].w;
                    }
                }
            }
        }
        float bv = __int_as_float(0x7fc00000);
        int bi = AM_NONE_IDX;
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
            if (swiglu)
                a.out[0][(i64)m * a.n[0] + col] = gm_silu_mul(y0[j], y1[j]);
            else if (a.store)
                a.out[seg][(i64)m * a.n[seg] + col] = y0[j];
            if (a.mode == GM_ARGMAX) {
                am_take(bv, bi, y0[j], (int)col);
                if (am_unusable(y0[j]))
                    a.am_bad[m] = 1;
            }
        }
        if (a.mode == GM_ARGMAX) {
            warp_argmax(bv, bi);
            if (in && (threadIdx.x & 31) == 0) {
                a.am_val[(i64)m * a.blocks[0] + rb] = bv;
                a.am_idx[(i64)m * a.blocks[0] + rb] = bi;
            }
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

/* grid m: out[r] = the best column of row r over the row blocks' partials
 * (the CPU's tie rule); -1 when the row held a NaN or +inf or nothing above
 * -inf, as the CPU's argmax. */
extern "C" __global__ void __launch_bounds__(256) dflash_argmax_finish(const float *am_val, const int *am_idx,
                                                                       int *am_bad, int n_blocks, int *out)
{
    __shared__ float sv[32];
    __shared__ int si[32];
    pdl_trigger();
    pdl_wait();
    const int r = blockIdx.x;
    float bv = __int_as_float(0x7fc00000);
    int bi = AM_NONE_IDX;
    for (int b = threadIdx.x; b < n_blocks; b += blockDim.x)
        am_take(bv, bi, am_val[(i64)r * n_blocks + b], am_idx[(i64)r * n_blocks + b]);
    block_argmax(bv, bi, sv, si);
    if (threadIdx.x == 0) {
        out[r] = am_bad[r] || !(bv > -__int_as_float(0x7f800000)) ? -1 : bi;
        am_bad[r] = 0; /* ready for the next call */
    }
}
