/* gemm_wide.cu: out = x W^T for many activation rows (verify of many
 * sessions at once, long prefill chunks) on tensor cores, in one launch,
 * with the very bits gemm.cu gives each row (gemm_mma.cuh says which
 * operations an output goes through; this kernel keeps them in order).
 *
 * Why a second kernel. gemm.cu keeps every activation row of the call in
 * each block and streams weights through registers, a chunk ahead: right
 * for 1-16 rows, where the weights' bytes are the cost. With hundreds of
 * rows the mma are the cost, and they wait on loads. Here:
 *  - the activations are split into bf16 hi/lo once per call
 *    (dflash_gemm_split_x, the same split4 as gemm.cu's), so the main loop
 *    only copies;
 *  - a block is 128 weight rows x MT activation rows (MT 32 or 64, a tile
 *    of the call's rows), 8 warps as 4 x 2: a warp owns 32 weight rows
 *    (two A fragments) x MT / 2 activation rows, so each B fragment feeds
 *    four mma;
 *  - weights and activations stream into shared memory through a ring of
 *    GW_STAGES stages of 64 k (cp.async), GW_STAGES - 1 of them in flight
 *    while one is multiplied; rows are swizzled against bank conflicts;
 *  - the tiles of one weight row block are adjacent in the grid, so they
 *    run together and read those weights from DRAM about once.
 *
 * Split-K without a workspace. The S slices of gemm.cu (the same S: it is
 * a function of the shape) are walked in order by the one block: a
 * slice's sum starts from zero in the accumulators and, at the slice's
 * end, is added to a running total that started at 0.0f (S = 1: the total
 * is the sum), the order gemm.cu's last block adds the slices' partials in.
 *
 * Epilogue: the totals go through shared memory to gm_emit4, four
 * adjacent columns of one activation row per thread, as gemm.cu's. */
#include "gemm_mma.cuh"

#define GW_STAGES 4
#define GW_KC 64 /* k per stage */

/* x [m, k] f32 -> xsplit [m, k / 4] uint4: split4 of each four (k % 4 == 0). */
extern "C" __global__ void __launch_bounds__(256) dflash_gemm_split_x(const float4 *x, uint4 *xsplit, i64 n4)
{
    pdl_trigger();
    pdl_wait();
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += (i64)gridDim.x * blockDim.x)
        xsplit[i] = split4(x[i]);
}

/* Shared memory of one kernel (cuda_gemm.c computes the same): the stage
 * ring, reused by the epilogue's [GM_RB][MT + 1] totals. */
template <int FP8, int MT> struct gw_geom {
    static constexpr int KSTEP = FP8 ? 64 : 32;              /* k of one 16-byte weight load per thread group */
    static constexpr int SPS = GW_KC / KSTEP;                /* k steps per stage: bf16 2, fp8 1 */
    static constexpr int WCH = GW_KC * (FP8 ? 1 : 2) / 16;   /* 16-byte chunks of a weight row per stage */
    static constexpr int XCH = GW_KC / 4;                    /* uint4 of an activation row per stage */
    static constexpr int W_BYTES = GM_RB * WCH * 16, X_BYTES = MT * XCH * 16, STAGE = W_BYTES + X_BYTES;
    static constexpr int RED = GM_RB * (MT + 1) * 4;
    static constexpr int SMEM = GW_STAGES * STAGE > RED ? GW_STAGES * STAGE : RED;
};

/* Swizzles: a quarter warp reads rows r, r + 1 (r even) at the same
 * chunks; an odd row's chunks are moved so the two land on other banks
 * (bf16; fp8's activation reads keep a 2-way conflict: lanes t and t + 2
 * share banks). */
template <int WCH> __forceinline__ int gw_wswz(int row, int c) { return WCH == 8 ? c ^ ((row & 1) << 2) : c; }
__forceinline__ int gw_xswz(int row, int c) { return c ^ (row & 1); }

template <int FP8, int MT> __forceinline__ void gemm_wide_body(const gemm_args &a, unsigned char *smem)
{
    typedef gw_geom<FP8, MT> G;
    constexpr int ESZ = FP8 ? 1 : 2, NT = MT / 16, H = FP8 ? 4 : 2; /* H: k16 steps per 16-byte load */
    constexpr int WI = GM_RB * G::WCH / GM_THREADS, XI = MT * G::XCH / GM_THREADS; /* copies per thread */
    static_assert(WI >= 1 && XI >= 1, "every thread copies");

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int wr = warp & 3, wm = warp >> 2; /* weight rows 32 wr.., activation rows (MT / 2) wm.. */
    const int S = a.split, M = a.m;
    const int n_mt = (M + MT - 1) / MT;
    const i64 rb = blockIdx.x / n_mt;
    const int m0 = (int)(blockIdx.x % n_mt) * MT;
    const bool swiglu = a.mode == GM_SWIGLU;

    /* The block's weight (segment) and row block within it. SwiGLU: rows
     * 0..63 of the tile are gate, 64..127 the same rows of up. */
    int seg = 0;
    i64 rbl = rb;
    if (!swiglu)
        while (seg < a.n_w - 1 && rbl >= a.blocks[seg]) {
            rbl -= a.blocks[seg];
            seg++;
        }
    const int rows_per_block = swiglu ? GM_RB / 2 : GM_RB;
    const i64 K = a.k;
    const int steps = (int)(K / G::KSTEP), per = (steps + S - 1) / S, n_stages = (steps + G::SPS - 1) / G::SPS;

    /* This thread's copies of a stage: WI weight chunks, XI activation
     * chunks; sources past the matrix's rows read its last row (their
     * outputs are never stored), chunks past k are not copied (their k
     * steps are not multiplied). */
    const u32 sbase = smem_addr(smem);
    const u8 *wsrc[WI];
    u32 wdst[WI];
    int wn[WI]; /* stages whose k range holds the chunk */
#pragma unroll
    for (int i = 0; i < WI; i++) {
        const int e = threadIdx.x + i * GM_THREADS, row = e / G::WCH, c = e % G::WCH;
        const int sg = swiglu ? row / 64 : seg;
        const i64 r = rbl * rows_per_block + (swiglu ? row % 64 : row), nr = a.n[sg];
        wsrc[i] = (const u8 *)a.w[sg] + ((r < nr ? r : nr - 1) * K) * ESZ + c * 16;
        wdst[i] = row * G::WCH * 16 + gw_wswz<G::WCH>(row, c) * 16;
        wn[i] = (int)((K - c * 16 / ESZ + GW_KC - 1) / GW_KC);
    }
    const uint4 *xsrc[XI];
    u32 xdst[XI];
    int xn[XI];
#pragma unroll
    for (int i = 0; i < XI; i++) {
        const int e = threadIdx.x + i * GM_THREADS, row = e / G::XCH, c = e % G::XCH;
        const int m = m0 + row < M ? m0 + row : M - 1;
        xsrc[i] = (const uint4 *)a.ws + (i64)m * (K / 4) + c;
        xdst[i] = G::W_BYTES + row * G::XCH * 16 + gw_xswz(row, c) * 16;
        xn[i] = (int)((K - 4 * c + GW_KC - 1) / GW_KC);
    }
    auto copy_w = [&](int st) {
        const u32 base = sbase + (u32)(st % GW_STAGES) * G::STAGE;
#pragma unroll
        for (int i = 0; i < WI; i++)
            if (st < wn[i])
                cp_async16_s(base + wdst[i], wsrc[i] + (i64)st * (GW_KC * ESZ));
    };
    auto copy_x = [&](int st) {
        const u32 base = sbase + (u32)(st % GW_STAGES) * G::STAGE;
#pragma unroll
        for (int i = 0; i < XI; i++)
            if (st < xn[i])
                cp_async16_s(base + xdst[i], xsrc[i] + (i64)st * (GW_KC / 4));
    };

    /* Weights never change while kernels run: the first stages' weights
     * are requested before waiting on the kernel that split x. */
    pdl_trigger();
#pragma unroll
    for (int st = 0; st < GW_STAGES - 1; st++)
        if (st < n_stages)
            copy_w(st);
    pdl_wait();
#pragma unroll
    for (int st = 0; st < GW_STAGES - 1; st++) {
        if (st < n_stages)
            copy_x(st);
        cp_async_commit();
    }

    float acc[2][NT][4], tot[2][NT][4];
#pragma unroll
    for (int f = 0; f < 2; f++)
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                acc[f][j][e] = tot[f][j][e] = 0.0f;

    /* Fragment addresses in a stage, bytes: this lane's A rows
     * 32 wr + g (+ 16 f, + 8) at load u, its B row (MT / 2) wm + g
     * (+ 8 j) at k16 step h (+ 128 per load u for bf16); the swizzles
     * depend on the row's parity, g's. */
    const int par = g & 1;
    u32 a_off[G::SPS], b_off[H];
#pragma unroll
    for (int u = 0; u < G::SPS; u++)
        a_off[u] = (wr * 32 + g) * G::WCH * 16 + gw_wswz<G::WCH>(par, u * 4 + t) * 16;
#pragma unroll
    for (int h = 0; h < H; h++)
        b_off[h] = G::W_BYTES + (wm * (MT / 2) + g) * G::XCH * 16 + ((FP8 ? 4 * t : 2 * t) + (h ^ par)) * 16;
    constexpr int WROW = G::WCH * 16, XROW = G::XCH * 16;

    /* One k step from stage `sp`: per k16 step h, every accumulator's
     * mma(hi), then every one's mma(lo) (each accumulator still sees hi
     * before lo; its two mma are no longer back to back). */
    auto step = [&](const unsigned char *sp, int u) {
        uint4 wa[2], wb[2]; /* this lane's 16 bytes of weight rows g, g + 8 of each A fragment */
#pragma unroll
        for (int f = 0; f < 2; f++) {
            wa[f] = *(const uint4 *)(sp + a_off[u] + f * 16 * WROW);
            wb[f] = *(const uint4 *)(sp + a_off[u] + (f * 16 + 8) * WROW);
        }
#pragma unroll
        for (int h = 0; h < H; h++) {
            u32 A[2][4];
#pragma unroll
            for (int f = 0; f < 2; f++) {
                if (!FP8) {
                    A[f][0] = h ? wa[f].z : wa[f].x;
                    A[f][1] = h ? wb[f].z : wb[f].x;
                    A[f][2] = h ? wa[f].w : wa[f].y;
                    A[f][3] = h ? wb[f].w : wb[f].y;
                } else {
                    const u32 pa = h == 0 ? wa[f].x : h == 1 ? wa[f].y : h == 2 ? wa[f].z : wa[f].w;
                    const u32 pb = h == 0 ? wb[f].x : h == 1 ? wb[f].y : h == 2 ? wb[f].z : wb[f].w;
                    A[f][0] = fp8x2_to_bf16x2(pa);
                    A[f][1] = fp8x2_to_bf16x2(pb);
                    A[f][2] = fp8x2_to_bf16x2(pa >> 16);
                    A[f][3] = fp8x2_to_bf16x2(pb >> 16);
                }
            }
            /* activations k = 8t + 4h (bf16) or 16t + 4h (fp8) of the step */
            uint4 b[NT];
#pragma unroll
            for (int j = 0; j < NT; j++)
                b[j] = *(const uint4 *)(sp + b_off[h] + (FP8 ? 0 : u * 128) + 8 * j * XROW);
#pragma unroll
            for (int j = 0; j < NT; j++)
#pragma unroll
                for (int f = 0; f < 2; f++)
                    mma_bf16(acc[f][j], A[f][0], A[f][1], A[f][2], A[f][3], b[j].x, b[j].y);
#pragma unroll
            for (int j = 0; j < NT; j++)
#pragma unroll
                for (int f = 0; f < 2; f++)
                    mma_bf16(acc[f][j], A[f][0], A[f][1], A[f][2], A[f][3], b[j].z, b[j].w);
        }
    };
    /* slice summed: add it to the total in slice order */
    auto fold = [&]() {
#pragma unroll
        for (int f = 0; f < 2; f++)
#pragma unroll
            for (int j = 0; j < NT; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    tot[f][j][e] = S > 1 ? tot[f][j][e] + acc[f][j][e] : acc[f][j][e];
                    acc[f][j][e] = 0.0f;
                }
    };

    int fold_at = per < steps ? per : steps; /* the k step that ends the current slice */
    for (int st = 0; st < n_stages; st++) {
        cp_async_wait<GW_STAGES - 2>();
        __syncthreads(); /* stage st has landed; stage st - 1's slot is free */
        const int nx = st + GW_STAGES - 1;
        if (nx < n_stages) {
            copy_w(nx);
            copy_x(nx);
        }
        cp_async_commit();
        const unsigned char *sp = smem + (st % GW_STAGES) * G::STAGE;
        const int k0 = st * G::SPS;
        if (k0 + G::SPS < fold_at) {
            /* no slice ends in this stage (the usual case) */
#pragma unroll
            for (int u = 0; u < G::SPS; u++)
                step(sp, u);
        } else {
#pragma unroll
            for (int u = 0; u < G::SPS; u++) {
                if (k0 + u >= steps)
                    break;
                step(sp, u);
                if (k0 + u + 1 == fold_at) {
                    fold();
                    fold_at = fold_at + per < steps ? fold_at + per : steps;
                }
            }
        }
    }
    /* Slices past the last k step add their zero sums, as gemm.cu's last
     * block adds their zero partials (no bits change: a total that started
     * at 0.0f is never -0; kept so both kernels do the same adds). */
    for (int e2 = (steps + per - 1) / per; e2 < S; e2++)
#pragma unroll
        for (int f = 0; f < 2; f++)
#pragma unroll
            for (int j = 0; j < NT; j++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    tot[f][j][e] += 0.0f;
    cp_async_wait<0>();
    __syncthreads(); /* the ring becomes the totals' table */

    /* C fragment f, tile j: (weight row 16f + g / + 8, activation row
     * 8j + 2t, + 1) of the warp's; column c of the block is weight row
     * 32 wr + 16 f + g (+ 8): SwiGLU's gate columns 0..63, up 64..127. */
    constexpr int RW = MT + 1;
    float *red = (float *)smem;
#pragma unroll
    for (int f = 0; f < 2; f++)
#pragma unroll
        for (int j = 0; j < NT; j++) {
            const int c = wr * 32 + f * 16 + g, mm = wm * (MT / 2) + 8 * j + 2 * t;
            red[c * RW + mm] = tot[f][j][0];
            red[c * RW + mm + 1] = tot[f][j][1];
            red[(c + 8) * RW + mm] = tot[f][j][2];
            red[(c + 8) * RW + mm + 1] = tot[f][j][3];
        }
    __syncthreads();

    /* Four adjacent columns of one activation row per thread; without
     * SwiGLU a row's 128 columns are one warp's 32 quads, so its argmax
     * candidate comes out of one warp reduction. */
    const int n_out = swiglu ? GM_RB / 2 : GM_RB, quads = n_out / 4;
    const int items = MT * quads; /* a multiple of 256: every thread has an item each pass */
    const i64 nseg_out = a.n[swiglu ? 0 : seg];
    for (int e = threadIdx.x; e < items; e += GM_THREADS) {
        const int mm = e / quads, c4 = (e % quads) * 4;
        const int m = m0 + mm;
        const bool in = m < M;
        const i64 col4 = rbl * rows_per_block + c4;
        bool live[4];
        float y0[4], y1[4];
#pragma unroll
        for (int j = 0; j < 4; j++) {
            live[j] = in && col4 + j < nseg_out;
            y0[j] = red[(c4 + j) * RW + mm];
            y1[j] = swiglu ? red[(64 + c4 + j) * RW + mm] : 0.0f;
        }
        float bv = __int_as_float(0x7fc00000);
        int bi = AM_NONE_IDX;
        gm_emit4<FP8>(a, seg, swiglu, m, col4, live, y0, y1, bv, bi);
        if (a.mode == GM_ARGMAX) {
            warp_argmax(bv, bi);
            if (in && lane == 0) {
                a.am_val[(i64)m * a.blocks[0] + rb] = bv;
                a.am_idx[(i64)m * a.blocks[0] + rb] = bi;
            }
        }
    }
}

/* One kernel per weight type and activation tile (MT rows); grid: row
 * blocks x ceil(m / MT) tiles, the tiles of a row block adjacent; a.ws
 * holds x split by dflash_gemm_split_x; dynamic shared memory
 * gw_geom<FP8, MT>::SMEM bytes. */
#define GEMM_WIDE_KERNEL(name, FP8, MT)                                                                      \
    extern "C" __global__ void __launch_bounds__(GM_THREADS, 1) dflash_gemm_wide_##name##_##MT(const gemm_args a) \
    {                                                                                                        \
        extern __shared__ __align__(16) unsigned char gw_smem[];                                             \
        gemm_wide_body<FP8, MT>(a, gw_smem);                                                                 \
    }

GEMM_WIDE_KERNEL(bf16, 0, 32)
GEMM_WIDE_KERNEL(bf16, 0, 64)
GEMM_WIDE_KERNEL(fp8, 1, 32)
GEMM_WIDE_KERNEL(fp8, 1, 64)
