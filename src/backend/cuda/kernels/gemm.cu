/* gemm.cu: out = x W^T for few activation rows (decode 1, verify and
 * propose 16, prefill chunks up to 64) on tensor cores, reading every weight
 * byte from memory once whatever the row count. The arithmetic each output
 * goes through (bf16 hi/lo activations, the operand order, split-K in slice
 * order) is gemm_mma.cuh's; gemm_wide.cu computes the same bits for more
 * rows.
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
 * Epilogues (gm_emit4): store (up to three weights with the same K share a
 * launch, each with its own output: q, k, v); SwiGLU (two weights, gate
 * and up: a block takes 64 rows of each and writes silu(gate) * up);
 * argmax (the best column of each activation row within the block, for
 * dflash_argmax_finish; the outputs themselves are stored only on
 * request). Or none (partials, split > 1): every slice stores its
 * partials and ends, and the next kernel adds them as it reads them
 * (norm.cu's split_add_rmsnorm and qk_norm_rope), so the arrival
 * count, the wait and the last slice's pass over the partials leave the
 * GEMM. */
#include "gemm_mma.cuh"

/* split-K partials (a float4 each) a thread requests together; 8 where the
 * next work item's chunk is held in registers meanwhile */
#define GM_SPLIT_BATCH 16
#define GM_SPLIT_BATCH_CHAIN 8
/* 16-byte weight loads per weight row per thread per chunk (a chunk is
 * loaded while the previous one is multiplied). */
#define GM_LOADS(FP8, NT) ((NT) >= 8 ? ((FP8) ? 1 : 2) : (NT) >= 4 || (FP8) ? 2 : 4)

/* Phase stamps (common.cuh's block stamps): each block of an unchained
 * call records when it passed the dependency wait (1), had its first
 * activations staged (2), left the chunk loop (3), learned whether it is
 * the last slice (4) and ended its epilogue (5). */
#ifdef DFLASH_STAMPS
#define GM_STAMP_WRITE(last)                                                                                  \
    do {                                                                                                      \
        if (threadIdx.x == 0) {                                                                               \
            stamp[0] = (unsigned long long)a.n[0] | (unsigned long long)a.k << 32;                            \
            stamp[1] = (unsigned long long)a.split | (unsigned long long)a.m << 8 |                           \
                       (unsigned long long)a.n_w << 16 | (unsigned long long)a.mode << 24 |                   \
                       (unsigned long long)((last) ? 1 : 0) << 31;                                            \
            stamp_write(stamp);                                                                               \
        }                                                                                                     \
    } while (0)
#else
#define GM_STAMP_WRITE(last) ((void)0)
#endif

/* A measurement build (DFLASH_CUDA_GEMM_SKIP, cuda_compile.c): with
 * GM_SKIP defined, bit 1 stages zeros for the activations, bit 2 holds
 * zeros for the weights, bit 4 skips the chunk loop. The results are wrong
 * by design; what a forward then takes says what the skipped work costs.
 * Each test also reads a.k, so the compiler keeps the code it guards (the
 * release build's instructions, less the skipped loads or loop). */
#ifdef GM_SKIP
#define GM_SKIPS(bit) ((GM_SKIP & (bit)) && a.k > 0)
#else
#define GM_SKIPS(bit) false
#endif

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

/* Where weight `seg`'s columns start in a workspace row: every weight
 * before it rounded up to 4 columns (n_w: the row's length). */
__forceinline__ i64 gm_ws_off(const gemm_args &a, int seg)
{
    i64 off = 0;
    for (int i = 0; i < seg; i++)
        off += (a.n[i] + 3) & ~(i64)3;
    return off;
}

/* A row block's split-K count word: arrivals in the low 8 bits; with
 * share_sum, bit 8 + s set by slice s when it left its share of the sums
 * to the last slice (GEMM_MAX_SPLIT <= 16 slices). */
#define GM_ARRIVALS 0xff

/* Where a block's work item `bid` (row block bid / split, slice bid %
 * split) lies, for this thread: its weight (segment), row block within it,
 * slice and chunk range, and the start of the two weight rows it loads. */
struct gm_item {
    const u8 *pa, *pb;
    i64 rb, rbl, s0, s1;
    int s, seg;
    bool ok_a, ok_b;
};

template <int FP8> __forceinline__ gm_item gm_item_at(const gemm_args &a, i64 bid)
{
    constexpr int KSTEP = FP8 ? 64 : 32, ESZ = FP8 ? 1 : 2;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int S = a.split;
    const bool swiglu = a.mode == GM_SWIGLU;
    gm_item it;
    it.rb = bid / S;
    it.s = (int)(bid % S);
    it.seg = 0;
    it.rbl = it.rb;
    if (!swiglu)
        while (it.seg < a.n_w - 1 && it.rbl >= a.blocks[it.seg]) {
            it.rbl -= a.blocks[it.seg];
            it.seg++;
        }
    const int rows_per_block = swiglu ? GM_RB / 2 : GM_RB;
    const int wseg = swiglu ? warp / 4 : it.seg;
    const i64 row_a = it.rbl * rows_per_block + (swiglu ? warp % 4 : warp) * 16 + g, row_b = row_a + 8;
    const u8 *wbase = (const u8 *)a.w[wseg];
    it.pa = wbase + (row_a * a.k + (i64)t * (KSTEP / 4)) * ESZ;
    it.pb = wbase + (row_b * a.k + (i64)t * (KSTEP / 4)) * ESZ;
    it.ok_a = row_a < a.n[wseg];
    it.ok_b = row_b < a.n[wseg];
    const i64 steps = a.k / KSTEP, per = (steps + S - 1) / S;
    it.s0 = (i64)it.s * per;
    it.s1 = it.s0 + per < steps ? it.s0 + per : steps;
    return it;
}

/* The block's sums before the epilogue, column c of the block (its weight
 * row, 0..127) and activation row m of MP, at red[gm_red<MP>(c, m)]: a
 * warp's 16 columns as [m][16] with rows 20 floats apart and warps
 * 20 MP + 16 apart. A thread then reads four adjacent columns of a row as
 * one float4, and neither those reads (eight quads of one row per
 * quarter warp, two warps' columns) nor the mma fragment's writes (rows
 * 2t, 2t + 1 of columns g, g + 8) meet in a shared-memory bank. */
#define GM_RED_ROW 20
#define GM_RED_BYTES(MP) (GM_WARPS * (GM_RED_ROW * (MP) + 16) * 4)
template <int MP> __forceinline__ int gm_red(int c, int m)
{
    return (c >> 4) * (GM_RED_ROW * MP + 16) + m * GM_RED_ROW + (c & 15);
}

/* Final values, four adjacent columns c4..c4+3 of one activation row
 * per thread: red's sums (one slice, or `summed`: every slice's, added in
 * slice order by the block itself) or every slice's from the workspace,
 * added in slice order; the partials are requested together (below),
 * so a pass costs ceil(H S / B) round trips to L2 (B = GM_SPLIT_BATCH), not
 * one per (slice, column). Without SwiGLU a row's 128 columns are one
 * warp's 32 quads, so its argmax candidate comes out of one warp
 * reduction. share >= 0 (share_sum): this block, slice `share` of the row
 * block, computes only its share of the (row, quad) items, the S slices
 * one contiguous S-th each: one pass of its threads instead of a whole
 * row block's M * quads items in one block. */
template <int FP8, int NT, int B>
__forceinline__ void gemm_finish(const gemm_args &a, const gm_item &it, const float *red, i64 n_ws,
                                 bool summed, int share)
{
    const int S = a.split, M = a.m;
    const bool swiglu = a.mode == GM_SWIGLU;
    const int rows_per_block = swiglu ? GM_RB / 2 : GM_RB;
    const int n_out = swiglu ? GM_RB / 2 : GM_RB, quads = n_out / 4;
    const int items = M * quads; /* without SwiGLU a multiple of 32: whole warps are in or out */
    const int per = (items + S - 1) / S, lo = share < 0 ? 0 : share * per;
    const int hi = share < 0 ? items : lo + per < items ? lo + per : items;
    const i64 nseg_out = a.n[swiglu ? 0 : it.seg];
    for (int e0 = lo; e0 < hi; e0 += GM_THREADS) {
        const int e = e0 + threadIdx.x;
        const bool in = e < hi;
        const int m = in ? e / quads : 0, c4 = (e % quads) * 4;
        const i64 col4 = it.rbl * rows_per_block + c4;
        bool live[4];
        float y0[4], y1[4];
#pragma unroll
        for (int j = 0; j < 4; j++) {
            live[j] = in && col4 + j < nseg_out;
            y0[j] = y1[j] = 0.0f;
        }
        if (S == 1 || summed) {
            const float4 r0 = *(const float4 *)&red[gm_red<NT * 8>(c4, m)];
            const float4 r1 = swiglu ? *(const float4 *)&red[gm_red<NT * 8>(64 + c4, m)] : r0;
            y0[0] = r0.x, y0[1] = r0.y, y0[2] = r0.z, y0[3] = r0.w;
            if (swiglu)
                y1[0] = r1.x, y1[1] = r1.y, y1[2] = r1.z, y1[3] = r1.w;
        } else {
            /* Load l of the H * S this thread needs (SwiGLU: gate and
             * up, H = 2) is slice l % S of half l / S; a batch requests
             * B of them (more would spill registers), and each
             * half's slices are added in slice order. A quad past the
             * weight's end is not loaded (the workspace row ends there);
             * the end of a quad that straddles it is padding, loaded and
             * unused. */
            const int H = swiglu ? 2 : 1, n_loads = H * S;
            const i64 stride = (i64)M * n_ws, row_off = (i64)m * n_ws + col4;
            const float *p0 = a.ws + row_off + gm_ws_off(a, swiglu ? 0 : it.seg), *p1 = a.ws + row_off + gm_ws_off(a, 1);
            for (int l0 = 0; l0 < n_loads; l0 += B) {
                float4 part[B];
#pragma unroll
                for (int b = 0; b < B; b++) {
                    const int l = l0 + b, h = l >= S, sl = l - h * S;
                    part[b] = l < n_loads && live[0] ? __ldcg((const float4 *)((h ? p1 : p0) + sl * stride))
                                                : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                }
#pragma unroll
                for (int b = 0; b < B; b++) {
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
        gm_emit4<FP8>(a, it.seg, swiglu, m, col4, live, y0, y1, bv, bi);
        if (a.mode == GM_ARGMAX) {
            warp_argmax(bv, bi);
            if (in && (threadIdx.x & 31) == 0) {
                a.am_val[(i64)m * a.blocks[0] + it.rb] = bv;
                a.am_idx[(i64)m * a.blocks[0] + it.rb] = bi;
            }
        }
    }
}

/* Work items bid .. bid + n_items - 1 of a call, one after the other
 * (n_items > 1 only with CHAIN, the grouped kernel's items of one tile):
 * the next item's first chunk streams in during this one's last chunk and
 * its split-K epilogue, so a block's loads do not stop between items. An
 * item's arithmetic is the same in any block and order. When the items
 * are whole row blocks (every slice of each), the block adds the slices'
 * sums itself, in slice order from 0, as the workspace pass would: no
 * partials through L2, no fence, no arrival counter, the same bits. */
template <int FP8, int NT, bool CHAIN> __forceinline__ void gemm_body(const gemm_args &a, i64 bid, int n_items)
{
    constexpr int KSTEP = FP8 ? 64 : 32; /* k covered by one 16-byte load across a thread group */
    constexpr int ESZ = FP8 ? 1 : 2;
    constexpr int L = GM_LOADS(FP8, NT);
    constexpr int KC = L * KSTEP;       /* k per chunk */
    constexpr int XW = KC / 4 + 1;      /* uint4 per staged activation row (+1: no bank conflicts) */
    constexpr int MP = NT * 8;          /* activation rows the tiles cover */
    constexpr int XS_BYTES = MP * XW * 16, RED_BYTES = GM_RED_BYTES(MP);
    constexpr int XV = MP * (KC / 4) / GM_THREADS; /* float4 of a chunk each thread stages */
    __shared__ __align__(16) unsigned char smem[XS_BYTES > RED_BYTES ? XS_BYTES : RED_BYTES];
    __shared__ int is_last;
    __shared__ int share_mine; /* share_sum: 1 this slice adds its share (the last: the shares left to it) */
    uint4 *xs = (uint4 *)smem;
    float *red = (float *)smem;

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int S = a.split, M = a.m;
    const bool swiglu = a.mode == GM_SWIGLU;
    const int rows_per_block = swiglu ? GM_RB / 2 : GM_RB;
    /* 8-row tiles only: the running sums' registers would push the wider
     * tiles' kernels into spilling (their calls rarely chain a whole row
     * block anyway) */
    const bool summed = CHAIN && NT == 1 && S > 1 && n_items % S == 0 && bid % S == 0;
    /* share_sum: the slices of a row block add its partials together,
     * each an S-th of the outputs, instead of the last one adding them
     * all (2.3 us a pass of 256 outputs, measured in a propose's graph).
     * A slice waits for the others; the host asks for it only where the
     * whole grid fits the device at once, and a slice still leaves its
     * share to the last after share_sum cycles (another stream's kernels
     * may hold the slots). Not in the grouped kernel (several waves). */
    const bool share = !CHAIN && S > 1 && a.share_sum > 0;
    float tot[NT][4]; /* summed: the row block's slices so far */

    /* Chunk loads: this thread's weights (L x rows g, g+8) and its share of
     * the activations (XV float4: staged element e = threadIdx.x + i * 256
     * is row e / (KC / 4), float4 e % (KC / 4)); xr[i] is that row's row
     * of x (-1: past m), read through the gather table once, before the
     * loop, so that no chunk's load waits on another load. */
    const uint4 zero = make_uint4(0, 0, 0, 0);
    uint4 ca[L], cb[L];
    float4 cx[XV];
    int xr[XV];
    auto load_weights = [&](const gm_item &it, i64 c0, uint4 *wa, uint4 *wb) {
#pragma unroll
        for (int u = 0; u < L; u++) {
            const i64 st = c0 + u, off = st * KSTEP * ESZ;
            wa[u] = !GM_SKIPS(2) && it.ok_a && st < it.s1 ? load_stream(it.pa + off) : zero;
            wb[u] = !GM_SKIPS(2) && it.ok_b && st < it.s1 ? load_stream(it.pb + off) : zero;
        }
    };
    auto load_x = [&](const gm_item &it, i64 c0, float4 *xv) {
#pragma unroll
        for (int i = 0; i < XV; i++) {
            const int q = (threadIdx.x + i * GM_THREADS) % (KC / 4);
            const i64 kk = c0 * KSTEP + 4 * q;
            const bool in = !GM_SKIPS(1) && xr[i] >= 0 && kk < it.s1 * KSTEP;
            xv[i] = in ? *(const float4 *)(a.x + (i64)xr[i] * a.k + kk) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
    };

    STAMP_BEGIN
    gm_item cur = gm_item_at<FP8>(a, bid);
    /* The first weights stream in while the previous kernel may still be
     * finishing (weights are never written); everything else waits. */
    pdl_trigger();
    if (cur.s0 < cur.s1)
        load_weights(cur, cur.s0, ca, cb);
    pdl_wait();
    STAMP(1);
#pragma unroll
    for (int i = 0; i < XV; i++) {
        const int row = (threadIdx.x + i * GM_THREADS) / (KC / 4);
        xr[i] = row >= M ? -1 : a.x_rows ? a.x_rows[row] : row;
    }
    if (cur.s0 < cur.s1)
        load_x(cur, cur.s0, cx);

    for (int item = 0; item < (CHAIN ? n_items : 1); item++) {
        const bool more = CHAIN && item + 1 < n_items;
        bool have_next = false; /* the next item's first chunk is in ca, cb, cx */

        float acc[NT][4];
#pragma unroll
        for (int j = 0; j < NT; j++) {
            acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
            if (cur.s == 0)
                tot[j][0] = tot[j][1] = tot[j][2] = tot[j][3] = 0.0f;
        }
        for (i64 c0 = cur.s0; c0 < (GM_SKIPS(4) ? cur.s0 : cur.s1); c0 += L) {
            /* stage this chunk's activations, split, for all warps */
#pragma unroll
            for (int i = 0; i < XV; i++) {
                const int e = threadIdx.x + i * GM_THREADS;
                xs[(e / (KC / 4)) * XW + e % (KC / 4)] = split4(cx[i]);
            }
            __syncthreads();
            if (!CHAIN && c0 == cur.s0)
                STAMP(2);
            uint4 na[L], nb[L];
            const gm_item nxt = more && c0 + L >= cur.s1 ? gm_item_at<FP8>(a, bid + item + 1) : cur;
            if (more && c0 + L >= cur.s1 && nxt.s0 < nxt.s1) {
                load_weights(nxt, nxt.s0, na, nb);
                load_x(nxt, nxt.s0, cx);
                have_next = true;
            } else {
                load_weights(cur, c0 + L, na, nb);
                load_x(cur, c0 + L, cx);
            }
#pragma unroll
            for (int u = 0; u < L; u++) {
                if (c0 + u >= cur.s1)
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

        if (!CHAIN)
            STAMP(3);
        /* The row block's sum: after its last slice (summed), or this
         * item's (the workspace adds the slices). */
        if (summed) {
#pragma unroll
            for (int j = 0; j < NT; j++)
#pragma unroll
                for (int i = 0; i < 4; i++)
                    acc[j][i] = tot[j][i] += acc[j][i];
        }
        if (!summed || cur.s == S - 1) {
            /* C fragment: (weight row g / g+8, activation rows 8j + 2t, +1). */
#pragma unroll
            for (int j = 0; j < NT; j++) {
                const int c = warp * 16 + g, m = 8 * j + 2 * t;
                red[gm_red<MP>(c, m)] = acc[j][0];
                red[gm_red<MP>(c, m + 1)] = acc[j][1];
                red[gm_red<MP>(c + 8, m)] = acc[j][2];
                red[gm_red<MP>(c + 8, m + 1)] = acc[j][3];
            }
            __syncthreads();

            /* The block's outputs: column c of the block (0..127; SwiGLU: 0..63 for
             * gate, 64..127 for up), activation row m; its column over all
             * weights and within its own. */
            /* Workspace row: each weight's columns from a multiple of 4, so the
             * last block reads four adjacent columns as one float4. */
            const i64 n_ws = gm_ws_off(a, a.n_w);
            bool last = true;
            if (S > 1 && !summed) {
                /* Four adjacent columns of a row per thread, a warp a row's
                 * 128 (SwiGLU: 64 of gate, then 64 of up); a quad that
                 * straddles a weight's end stores the workspace row's
                 * padding. */
                const int sg0 = swiglu ? 0 : cur.seg;
                const i64 col0 = cur.rbl * rows_per_block, slice = (i64)cur.s * M * n_ws;
                float *ws0 = a.ws + slice + gm_ws_off(a, sg0), *ws1 = swiglu ? a.ws + slice + gm_ws_off(a, 1) : ws0;
                for (int e = threadIdx.x; e < M * (GM_RB / 4); e += GM_THREADS) {
                    const int m = e / (GM_RB / 4), c4 = e % (GM_RB / 4) * 4;
                    const bool up = swiglu && c4 >= 64;
                    const i64 col = col0 + (up ? c4 - 64 : c4);
                    if (col < a.n[up ? 1 : sg0])
                        __stcg((float4 *)((up ? ws1 : ws0) + m * n_ws + col), *(const float4 *)&red[gm_red<MP>(c4, m)]);
                }
                if (!CHAIN && a.mode == GM_PARTIALS) { /* the sum is the next kernel's */
                    GM_STAMP_WRITE(false);
                    return;
                }
                /* The block's arrival releases its partials (every thread's,
                 * ordered before thread 0's atomic by the barrier), and the
                 * last block's acquires the others' before it reads them. */
                __syncthreads();
                if (threadIdx.x == 0) {
                    int *cnt = a.counters + cur.rb;
                    const int prev = atom_add_acq_rel(cnt, 1);
                    is_last = (prev & GM_ARRIVALS) == S - 1;
                    share_mine = 0;
                    if (is_last) {
                        /* the shares left to it, then the count reset for
                         * the next call with a release: the others wait for
                         * that zero, which carries every slice's partials */
                        share_mine = prev >> 8;
                        st_release(cnt, 0);
                    } else if (share) {
                        /* Wait for the zero; after share_sum cycles leave
                         * this share to the last slice instead (a bit of
                         * the count, set only while the last has not
                         * arrived: it reads the bits with its arrival). */
                        const long long t0 = clock64();
                        for (;;) {
                            const int v = ld_acquire(cnt);
                            if (v == 0) {
                                share_mine = 1;
                                break;
                            }
                            if ((v & GM_ARRIVALS) < S && clock64() - t0 >= a.share_sum &&
                                atomicCAS(cnt, v, v | 1 << (8 + cur.s)) == v)
                                break;
                        }
                    }
                }
                __syncthreads();
                last = is_last;
                if (!CHAIN)
                    STAMP(4);
                if (!CHAIN && !last && !share_mine) {
                    GM_STAMP_WRITE(false);
                    return;
                }
            }
            constexpr int SB = CHAIN ? GM_SPLIT_BATCH_CHAIN : GM_SPLIT_BATCH;
            if (share) {
                /* this slice's share; the last also takes those left to it */
                gemm_finish<FP8, NT, SB>(a, cur, red, n_ws, summed, cur.s);
                for (int sl = 0; last && sl < S; sl++)
                    if (share_mine >> sl & 1)
                        gemm_finish<FP8, NT, SB>(a, cur, red, n_ws, summed, sl);
            } else if (last)
                gemm_finish<FP8, NT, SB>(a, cur, red, n_ws, summed, -1);
            if (!CHAIN) {
                STAMP(5);
                GM_STAMP_WRITE(last);
                return;
            }
            __syncthreads(); /* the next item's staging overwrites red, and is_last */
        }
        if (!more)
            break;
        cur = gm_item_at<FP8>(a, bid + item + 1);
        if (!have_next && cur.s0 < cur.s1) {
            load_weights(cur, cur.s0, ca, cb);
            load_x(cur, cur.s0, cx);
        }
    }
}

/* One kernel per weight type and activation tile count (rows <= 8 NT). */
#define GEMM_KERNEL(name, FP8, NT)                                                                            \
    extern "C" __global__ void __launch_bounds__(GM_THREADS, 2) dflash_gemm_##name##_##NT(const gemm_args a) \
    {                                                                                                         \
        gemm_body<FP8, NT, false>(a, blockIdx.x, 1);                                                          \
    }

/* A MoE layer's experts through one projection (linear_experts in
 * backend.h): gathered rows grouped by expert (first[]), each group cut
 * into tiles of at most 8 NT rows, and each tile gemm_body's work items
 * (row blocks x slices) over its expert's weights, `chain` consecutive
 * items a block. A block finds its tile from first[] (written by the
 * routing kernel, hence after the dependency wait), once for all its
 * items; blocks past the last tile exit. The split and the arithmetic
 * are gemm_body's, so a row's result depends neither on the rows it
 * shares a tile with nor on the chain. */
struct gemm_group_args {
    gemm_args base;           /* x, out: the whole call's; w, scales unused; ws and counters shared by the tiles */
    const void *const *wtab;  /* [n_w * n_experts]: expert e's weight i at i * n_experts + e */
    const float *const *stab; /* the same for fp8 scales, or NULL */
    const int *first;         /* [n_experts + 1] */
    int n_experts, tile_rows, blocks_per_tile;
    int chain; /* consecutive work items of one tile per block (divides blocks_per_tile) */
};
static_assert(sizeof(gemm_group_args) == 328, "mirrored by gemm_group_args in cuda_gemm.c");

/* Tile t of the call: tile[0] its expert (-1: no such tile), tile[1] its
 * first gathered row, tile[2] its rows. Warp 0, first[] in shared memory;
 * lane l counts the tiles of experts l * per .. (l + 1) * per - 1. */
__forceinline__ void gm_find_tile(const int *first, int E, int tm, i64 t, int *tile)
{
    const int lane = threadIdx.x & 31, per = (E + 31) / 32, e0 = lane * per, e1 = e0 + per < E ? e0 + per : E;
    int count = 0;
    for (int e = e0; e < e1; e++)
        count += (first[e + 1] - first[e] + tm - 1) / tm;
    const int incl = warp_incl_sum(count), excl = incl - count;
    if (lane == 31 && t >= incl)
        tile[0] = -1;
    if (t < excl || t >= incl)
        return;
    int tt = (int)(t - excl);
    for (int e = e0; e < e1; e++) {
        const int m = first[e + 1] - first[e], nt = (m + tm - 1) / tm;
        if (tt < nt) {
            tile[0] = e;
            tile[1] = first[e] + tt * tm;
            tile[2] = m - tt * tm < tm ? m - tt * tm : tm;
            return;
        }
        tt -= nt;
    }
}

template <int FP8, int NT> __forceinline__ void gemm_group_body(const gemm_group_args &g)
{
    /* the tile's arguments live in shared memory: a local copy would be
     * indexed by segment at run time, i.e. spilled to the stack */
    __shared__ int s_first[DFLASH_ROUTE_MAX_EXPERTS + 1], tile[3];
    __shared__ int s_rows[8 * NT]; /* x_rows: the tile's rows of x, read while thread 0 reads the tables */
    __shared__ gemm_args a;
    pdl_trigger();
    pdl_wait(); /* first[] and x come from the kernels before */
    for (int e = threadIdx.x; e <= g.n_experts; e += GM_THREADS)
        s_first[e] = g.first[e];
    __syncthreads();
    const i64 item0 = (i64)blockIdx.x * g.chain, t = item0 / g.blocks_per_tile;
    if (threadIdx.x < 32)
        gm_find_tile(s_first, g.n_experts, g.tile_rows, t, tile);
    __syncthreads();
    if (tile[0] < 0)
        return;
    if (g.base.x_rows && threadIdx.x < tile[2])
        s_rows[threadIdx.x] = g.base.x_rows[tile[1] + threadIdx.x];
    if (threadIdx.x == 0) {
        const int e = tile[0];
        const i64 r0 = tile[1];
        a = g.base;
        a.m = tile[2];
        if (g.base.x_rows) /* the tile's rows through the gather table, staged */
            a.x_rows = s_rows;
        else
            a.x = g.base.x + r0 * a.k;
        for (int i = 0; i < a.n_w; i++) {
            a.w[i] = g.wtab[(i64)i * g.n_experts + e];
            a.scales[i] = g.stab ? g.stab[(i64)i * g.n_experts + e] : nullptr;
            a.out[i] = g.base.out[i] ? g.base.out[i] + r0 * a.n[i] : nullptr;
        }
        /* the tile's partials: [split][its rows] from row r0 of a workspace laid out tile after tile */
        a.ws = g.base.ws + (i64)a.split * r0 * gm_ws_off(a, a.n_w);
        a.counters = g.base.counters + t * (g.blocks_per_tile / a.split);
    }
    __syncthreads();
    gemm_body<FP8, NT, true>(a, item0 % g.blocks_per_tile, g.chain);
}

#define GEMM_GROUP_KERNEL(name, FP8, NT)                                                                  \
    extern "C" __global__ void __launch_bounds__(GM_THREADS, 2)                                           \
        dflash_gemm_group_##name##_##NT(const gemm_group_args g)                                          \
    {                                                                                                     \
        gemm_group_body<FP8, NT>(g);                                                                      \
    }

/* Both kinds for each weight type and tile. */
#define GEMM_KERNELS(name, FP8, NT) GEMM_KERNEL(name, FP8, NT) GEMM_GROUP_KERNEL(name, FP8, NT)
GEMM_KERNELS(bf16, 0, 1)
GEMM_KERNELS(bf16, 0, 2)
GEMM_KERNELS(bf16, 0, 4)
GEMM_KERNELS(bf16, 0, 8)
GEMM_KERNELS(fp8, 1, 1)
GEMM_KERNELS(fp8, 1, 2)
GEMM_KERNELS(fp8, 1, 4)
GEMM_KERNELS(fp8, 1, 8)

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
