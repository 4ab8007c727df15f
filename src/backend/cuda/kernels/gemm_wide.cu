/* gemm_wide.cu: out = x W^T for many activation rows (verify of many
 * sessions at once, long prefill chunks) on tensor cores, in one launch,
 * with the very bits gemm.cu gives each row (gemm_mma.cuh says which
 * operations an output goes through; this kernel keeps them in order).
 *
 * Why a second kernel. gemm.cu keeps every activation row of the call in
 * each block and streams weights through registers, a chunk ahead: right
 * for 1-16 rows, where the weights' bytes are the cost. With hundreds of
 * rows the mma are the cost, and every instruction beside them counts.
 * Here:
 *  - the operands swap roles: activations are the mma's A operand (16
 *    rows), weights its B operand (8 rows). Each output is the same dot
 *    product of the same k slots, only the tile is transposed. B wants two
 *    registers of one weight row, which one 16-byte load gives (no
 *    register moves); A wants rows g and g + 8 interleaved, which the
 *    activation split writes directly (below), so one 16-byte load is one
 *    A fragment;
 *  - the activations are split into bf16 hi/lo once per call
 *    (dflash_gemm_split_x, gemm.cu's split4), already in fragment order:
 *    for each 16 rows and k16 step, the 32 lanes' hi fragments, then
 *    their lo fragments;
 *  - a block is 128 weight rows x MT activation rows (MT 32, 64 or 128, a
 *    tile of the call's rows), 8 warps: 4 x 2 of 32 weight rows (four B
 *    fragments) x MT / 2 activation rows (MT / 32 A fragments), or for
 *    MT 128, 2 x 4 of 64 weight rows x 32 activation rows (each fragment
 *    read from shared memory feeds more mma: a third fewer shared-memory
 *    bytes per mma);
 *  - weights and activations stream into shared memory through a ring of
 *    GW_STAGES stages of 64 k (cp.async), GW_STAGES - 1 of them in flight
 *    while one is multiplied; weight rows are swizzled against bank
 *    conflicts, activation fragments are read as the 32 lanes' 512
 *    contiguous bytes;
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
#define GW_KC 64 /* k per stage: four k16 steps */

/* Physical k of the first of the four activations lane quad t gives k16
 * step s (gemm_mma.cuh's operand order: the weight row's 16 bytes a lane
 * loads hold k16 steps 2 (bf16) or 4 (fp8) in a row). */
__forceinline__ i64 gw_k_of(int fp8, i64 s, int t)
{
    return fp8 ? 64 * (s >> 2) + 16 * t + 4 * (s & 3) : 32 * (s >> 1) + 8 * t + 4 * (s & 1);
}

/* x [m, k] f32 (16-byte aligned, k % 32 == 0, fp8: % 64) -> xs, the A
 * fragments of every 16 rows (m_pad of them, rows past m zero) and k16
 * step s: xs[((r16 * (k / 16) + s) * 2 + hl) * 32 + lane], hl 0 for hi, 1
 * for lo, lane = 4 g + t holding {rows g, g + 8} x {k, k + 1}, then
 * {k + 2, k + 3}, k = gw_k_of(s, t): the mma's {a0, a1, a2, a3}. */
extern "C" __global__ void __launch_bounds__(256) dflash_gemm_split_x(const float *x, uint4 *xs, int m, int m_pad,
                                                                       i64 k, int fp8)
{
    pdl_trigger();
    pdl_wait();
    const i64 s16 = k / 16, items = (i64)(m_pad / 16) * s16 * 32;
    for (i64 e = (i64)blockIdx.x * blockDim.x + threadIdx.x; e < items; e += (i64)gridDim.x * blockDim.x) {
        const int lane = (int)(e & 31), g = lane >> 2, t = lane & 3;
        const i64 rest = e >> 5, s = rest % s16, r0 = rest / s16 * 16 + g, kk = gw_k_of(fp8, s, t);
        const float4 z = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        const float4 v0 = r0 < m ? *(const float4 *)(x + r0 * k + kk) : z;
        const float4 v1 = r0 + 8 < m ? *(const float4 *)(x + (r0 + 8) * k + kk) : z;
        const uint4 p0 = split4(v0), p1 = split4(v1);
        xs[rest * 64 + lane] = make_uint4(p0.x, p1.x, p0.y, p1.y);
        xs[rest * 64 + 32 + lane] = make_uint4(p0.z, p1.z, p0.w, p1.w);
    }
}

/* Shared memory of one kernel (cuda_compile.c computes the same): the stage
 * ring, reused by the epilogue's [GM_RB][MT + 1] totals. */
template <int FP8, int MT> struct gw_geom {
    static constexpr int KSTEP = FP8 ? 64 : 32;              /* k of one 16-byte weight load per lane */
    static constexpr int SPS = GW_KC / KSTEP;                /* weight loads per stage: bf16 2, fp8 1 */
    static constexpr int WCH = GW_KC * (FP8 ? 1 : 2) / 16;   /* 16-byte chunks of a weight row per stage */
    static constexpr int W_BYTES = GM_RB * WCH * 16;
    static constexpr int X_BYTES = MT / 16 * 4 * 1024;       /* per 16 rows: 4 k16 steps x 1 KB of fragments */
    static constexpr int STAGE = W_BYTES + X_BYTES;
    static constexpr int RED = GM_RB * (MT + 1) * 4;
    static constexpr int SMEM = GW_STAGES * STAGE > RED ? GW_STAGES * STAGE : RED;
};

/* Weight rows r, r + 1 (r even) are read at the same chunks by one quarter
 * warp; an odd row's chunks are moved so the two land on other banks
 * (bf16; fp8's quarter warp reads 128 contiguous bytes of two rows' 64). */
template <int WCH> __forceinline__ int gw_wswz(int row, int c) { return WCH == 8 ? c ^ ((row & 1) << 2) : c; }

template <int FP8, int MT> __forceinline__ void gemm_wide_body(const gemm_args &a, unsigned char *smem)
{
    typedef gw_geom<FP8, MT> G;
    constexpr int ESZ = FP8 ? 1 : 2, H = FP8 ? 4 : 2; /* H: k16 steps per weight load */
    /* warps: WW along weight rows x WA along activation rows; a warp's
     * tile: JW B fragments (8 weight rows each) x GA A fragments (16 rows) */
    constexpr int WA = MT == 128 ? 4 : 2, WW = GM_WARPS / WA, JW = GM_RB / WW / 8, GA = MT / WA / 16;
    constexpr int WI = GM_RB * G::WCH / GM_THREADS, XI = MT / 16; /* copies per thread */
    static_assert(WI >= 1 && GA >= 1 && G::X_BYTES == XI * GM_THREADS * 16, "every thread copies");

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int wr = warp % WW, wm = warp / WW; /* weight rows 8 JW wr.., activation rows 16 GA wm.. */
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
    const i64 K = a.k, S16 = K / 16;
    const int steps = (int)(K / G::KSTEP), per = (steps + S - 1) / S, n_stages = (steps + G::SPS - 1) / G::SPS;

    /* This thread's copies of a stage: WI weight chunks, XI activation
     * pieces (16 rows each: the 4 KB of a stage's fragments, 16 bytes a
     * thread); weight sources past the matrix's rows read its last row
     * (their outputs are never stored), pieces past k are not copied
     * (their k steps are not multiplied). */
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
    /* piece i: rows m0 + 16 i.., the stage's k16 step threadIdx.x / 64 */
    const uint4 *xsrc = (const uint4 *)a.ws + (i64)(m0 / 16) * S16 * 64 + threadIdx.x;
    const int xn = (int)((S16 - threadIdx.x / 64 + 3) / 4);
    auto copy_w = [&](int st) {
        const u32 base = sbase + (u32)(st % GW_STAGES) * G::STAGE;
#pragma unroll
        for (int i = 0; i < WI; i++)
            if (st < wn[i])
                cp_async16_s(base + wdst[i], wsrc[i] + (i64)st * (GW_KC * ESZ));
    };
    auto copy_x = [&](int st) {
        const u32 base = sbase + (u32)(st % GW_STAGES) * G::STAGE + G::W_BYTES + threadIdx.x * 16;
        if (st < xn)
#pragma unroll
            for (int i = 0; i < XI; i++)
                cp_async16_s(base + i * 4096, xsrc + (i * S16 + (i64)st * 4) * 64);
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

    /* acc[i][j]: activation rows 16 i + g (+ 8) of the warp's x weight
     * rows 8 j + 2 t (+ 1) of the warp's */
    float acc[GA][JW][4], tot[GA][JW][4];
#pragma unroll
    for (int i = 0; i < GA; i++)
#pragma unroll
        for (int j = 0; j < JW; j++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                acc[i][j][e] = tot[i][j][e] = 0.0f;

    /* Fragment addresses in a stage, bytes: this lane's weight row
     * 8 JW wr + g (+ 8 j) at load u (bf16: 64 bytes per k32 step; its
     * swizzle depends on the row's parity, g's), and its A fragments of
     * the warp's first 16 activation rows at k16 step 0 (+ 4 KB per 16
     * rows, + 1 KB per k16 step, + 512 bytes for lo). */
    u32 w_off[G::SPS];
#pragma unroll
    for (int u = 0; u < G::SPS; u++)
        w_off[u] = (wr * JW * 8 + g) * G::WCH * 16 + gw_wswz<G::WCH>(g, u * 4 + t) * 16;
    const u32 x_off = G::W_BYTES + wm * GA * 4096 + lane * 16;
    constexpr int WROW = G::WCH * 16;

    /* One weight load u from stage `sp`: per k16 step h, every
     * accumulator's mma(hi), then every one's mma(lo) (each accumulator
     * still sees hi before lo; its two mma are no longer back to back). */
    auto step = [&](const unsigned char *sp, int u) {
        uint4 wv[JW]; /* this lane's 16 bytes of the warp's weight rows g + 8 j */
#pragma unroll
        for (int j = 0; j < JW; j++)
            wv[j] = *(const uint4 *)(sp + w_off[u] + j * 8 * WROW);
#pragma unroll
        for (int h = 0; h < H; h++) {
            u32 B[JW][2];
#pragma unroll
            for (int j = 0; j < JW; j++) {
                if (!FP8) {
                    B[j][0] = h ? wv[j].z : wv[j].x;
                    B[j][1] = h ? wv[j].w : wv[j].y;
                } else {
                    const u32 p = h == 0 ? wv[j].x : h == 1 ? wv[j].y : h == 2 ? wv[j].z : wv[j].w;
                    B[j][0] = fp8x2_to_bf16x2(p);
                    B[j][1] = fp8x2_to_bf16x2(p >> 16);
                }
            }
            const int q = u * H + h; /* k16 step within the stage */
            uint4 xh[GA], xl[GA];
#pragma unroll
            for (int i = 0; i < GA; i++) {
                xh[i] = *(const uint4 *)(sp + x_off + i * 4096 + q * 1024);
                xl[i] = *(const uint4 *)(sp + x_off + i * 4096 + q * 1024 + 512);
            }
#pragma unroll
            for (int i = 0; i < GA; i++)
#pragma unroll
                for (int j = 0; j < JW; j++)
                    mma_bf16(acc[i][j], xh[i].x, xh[i].y, xh[i].z, xh[i].w, B[j][0], B[j][1]);
#pragma unroll
            for (int i = 0; i < GA; i++)
#pragma unroll
                for (int j = 0; j < JW; j++)
                    mma_bf16(acc[i][j], xl[i].x, xl[i].y, xl[i].z, xl[i].w, B[j][0], B[j][1]);
        }
    };
    /* slice summed: add it to the total in slice order */
    auto fold = [&]() {
#pragma unroll
        for (int i = 0; i < GA; i++)
#pragma unroll
            for (int j = 0; j < JW; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    tot[i][j][e] = S > 1 ? tot[i][j][e] + acc[i][j][e] : acc[i][j][e];
                    acc[i][j][e] = 0.0f;
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
        for (int i = 0; i < GA; i++)
#pragma unroll
            for (int j = 0; j < JW; j++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    tot[i][j][e] += 0.0f;
    cp_async_wait<0>();
    __syncthreads(); /* the ring becomes the totals' table */

    /* C fragment of tile (i, j): (activation row 16 i + g / + 8, weight row
     * 8 j + 2 t, + 1) of the warp's; column c of the block is weight row
     * 8 (JW wr + j) + 2 t (+ 1): SwiGLU's gate columns 0..63, up 64..127. */
    constexpr int RW = MT + 1;
    float *red = (float *)smem;
#pragma unroll
    for (int i = 0; i < GA; i++)
#pragma unroll
        for (int j = 0; j < JW; j++) {
            const int c = (wr * JW + j) * 8 + 2 * t, mm = (wm * GA + i) * 16 + g;
            red[c * RW + mm] = tot[i][j][0];
            red[(c + 1) * RW + mm] = tot[i][j][1];
            red[c * RW + mm + 8] = tot[i][j][2];
            red[(c + 1) * RW + mm + 8] = tot[i][j][3];
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
 * holds x split by dflash_gemm_split_x (rows padded to MT); dynamic shared memory
 * gw_geom<FP8, MT>::SMEM bytes. */
#define GEMM_WIDE_KERNEL(name, FP8, MT)                                                                      \
    extern "C" __global__ void __launch_bounds__(GM_THREADS, 1) dflash_gemm_wide_##name##_##MT(const gemm_args a) \
    {                                                                                                        \
        extern __shared__ __align__(16) unsigned char gw_smem[];                                             \
        gemm_wide_body<FP8, MT>(a, gw_smem);                                                                 \
    }

GEMM_WIDE_KERNEL(bf16, 0, 32)
GEMM_WIDE_KERNEL(bf16, 0, 64)
GEMM_WIDE_KERNEL(bf16, 0, 128)
GEMM_WIDE_KERNEL(fp8, 1, 32)
GEMM_WIDE_KERNEL(fp8, 1, 64)
GEMM_WIDE_KERNEL(fp8, 1, 128)
