/* attention_tc.cu: paged attention on tensor cores over bf16 KV pages, for
 * head_dim 16, 32, 64, 128 or 256: decode (1 row), verify (B rows,
 * causal), the drafter's block (extra keys, no mask or causal + window).
 *
 * One block per (sequence, KV head, group of key splits, query chunk). A
 * sequence's keys are numbered u = 0..T-1: its paged positions [lo, hi)
 * then its extra rows; splits are fixed runs of that numbering
 * (AT_SPLIT keys up to key AT_LONG_FROM, AT_LONG_SPLIT keys after it:
 * fixed by the key's number, never by the call, and longer where a
 * context is long, so a long context's partials stay fewer) and tiles
 * fixed runs of keys inside a split. Block y of a grid of Y walks its
 * share of the splits (at_walk_of) one after the other, its tile copies
 * running on from one split into the next: each split's partials are
 * computed exactly as by a block of its own, so Y (chosen per call from
 * the device's occupancy: at long contexts one wave of blocks, each
 * walking several splits, instead of many waves of short blocks) never
 * changes a bit. All query vectors of the block (the
 * sequence's rows x the query heads of this KV head, up to 128) share each
 * K/V tile, which is copied once into shared memory (cp.async, two
 * stages). Each warp owns 16 query vectors: S = Q K^T and O += P V on
 * mma.m16n8k16, with an online softmax in f32 between them.
 *
 * Head_dim 256 (a Qwen3.5's gated attention) would need twice the
 * registers of 128 (a warp's queries and outputs), so there two warps share
 * 16 query vectors, each holding half of the dimensions: each computes its
 * half of the scores, they add the halves through shared memory (the same
 * sum in both), run the same softmax, and each accumulates its half of O.
 * Tiles are 16 keys there (shared memory for two stages and the halves).
 *
 * Accuracy: K and V are bf16 (the pool's values; extra keys are rounded
 * to bf16 as they would be when stored); Q is f32 split into bf16 hi + lo,
 * so the scores are f32-accurate (they go through exp); max and sums are
 * f32 as in the CPU reference, the exponentials 2^x of scores scaled into
 * log2 units (one ex2 each, ~2^-22 relative). The softmax weights P enter
 * P V as bf16 (as in FlashAttention), and the normalizer sums those rounded
 * weights, so the output is an exactly normalized average whose weights
 * are within 2^-9 relative of the CPU's: the output agrees with the CPU's
 * to ~1e-3 relative, the order of bf16 KV's own rounding.
 *
 * Batch independence: masks are applied per (query, key), never by moving
 * the key range, so a query row sees the same tiles and splits whether it
 * runs alone (decode) or with the rest of its block (verify): keys it must
 * not see contribute exact zeros. With one split the block writes the
 * output; with several it writes partials (m, l, unnormalized O) that
 * dflash_attn_combine merges in split order. A split that a query row
 * cannot see at all leaves m = -inf, l = 0, O = 0, which the merge adds as
 * exact zeros, so one split or several give the same bits. */
#include "norm_rope.cuh"

#define AT_TILE 32 /* keys per tile; halved where two warps share queries */
#define AT_SPLIT 128       /* keys per split among the first AT_LONG_FROM */
#define AT_LONG_FROM 4096  /* a multiple of AT_SPLIT and of AT_LONG_SPLIT */
#define AT_LONG_SPLIT 256  /* keys per split from there on */
#define AT_SHORT_SPLITS (AT_LONG_FROM / AT_SPLIT)
#define AT_LONG_W (AT_LONG_SPLIT / AT_SPLIT) /* a long split's keys, in short splits */
#define AT_ROOM 32 /* short splits whose page-table entries a block keeps (AT_PAGE_SLOTS) */

/* Splits of T keys, where split s begins and how long it is, the split of
 * key u: the one numbering of keys into splits (the merge's too). */
__forceinline__ int at_n_splits(int T)
{
    return T <= AT_LONG_FROM ? (T + AT_SPLIT - 1) / AT_SPLIT
                             : AT_SHORT_SPLITS + (T - AT_LONG_FROM + AT_LONG_SPLIT - 1) / AT_LONG_SPLIT;
}
__forceinline__ int at_split_begin(int s)
{
    return s < AT_SHORT_SPLITS ? s * AT_SPLIT : AT_LONG_FROM + (s - AT_SHORT_SPLITS) * AT_LONG_SPLIT;
}
__forceinline__ int at_split_len(int s) { return s < AT_SHORT_SPLITS ? AT_SPLIT : AT_LONG_SPLIT; }
__forceinline__ int at_split_of(int u)
{
    return u < AT_LONG_FROM ? u / AT_SPLIT : AT_SHORT_SPLITS + (u - AT_LONG_FROM) / AT_LONG_SPLIT;
}

/* The splits block y of a grid of Y walks, for a sequence of T keys: the
 * long ones round robin (long split l in block l % Y) and one run of
 * short ones, sized so that every block gets about the same keys. Loads
 * count in units of AT_SPLIT keys, a sequence's last split by the keys it
 * has (so a verify or a drafter's block just past AT_LONG_FROM is dealt as
 * many blocks as before). With c = max(ceil(units / Y), the most any
 * block's long splits hold), a block's short run fills what its long
 * splits leave of c; the runs follow each other in block order. A fixed
 * number of blocks, each walking its splits in turn, ends when its most
 * loaded block does: dealing mixed-length splits round robin would give
 * some blocks a long split on top of their share of short ones. Which
 * block computes a split never changes its bits. cuda_attention.c's
 * tc_walk_width repeats c's formula. */
struct at_walk {
    int S, Y, y;  /* the sequence's short splits, the blocks, this block */
    int s_lo, ns; /* its short splits s_lo .. s_lo + ns - 1 */
    int nl;       /* its long splits S + y, S + y + Y, ... (nl of them) */
};
__forceinline__ at_walk at_walk_of(int T, int y, int Y)
{
    const int n = T > 0 ? at_n_splits(T) : 1;
    const int S = n < AT_SHORT_SPLITS ? n : AT_SHORT_SPLITS, L = n - S;
    const int units = T > AT_SPLIT ? (T + AT_SPLIT - 1) / AT_SPLIT : 1;
    /* the last long split's units, and the block holding it */
    const int w_last = L > 0 ? (T - at_split_begin(n - 1) + AT_SPLIT - 1) / AT_SPLIT : 0;
    const int short_by = AT_LONG_W - w_last, last = L > 0 ? (L - 1) % Y : -1;
    const int q = L / Y, r = L % Y;
    const int c_long = L == 0 ? 0
                       : r >= 2 ? AT_LONG_W * (q + 1)
                       : r == 1 ? AT_LONG_W * q + w_last
                                : AT_LONG_W * q - (Y == 1 ? short_by : 0);
    const int c_keys = (units + Y - 1) / Y, c = c_keys > c_long ? c_keys : c_long;
    const int nl = q + (y < r ? 1 : 0);
    const int longs = AT_LONG_W * nl - (y == last ? short_by : 0);
    /* the short room of the blocks before y */
    const int before = y * c - (AT_LONG_W * (y * q + (y < r ? y : r)) - (last >= 0 && last < y ? short_by : 0));
    const int lo = before < S ? before : S, hi = before + c - longs < S ? before + c - longs : S;
    return { S, Y, y, lo, hi > lo ? hi - lo : 0, nl };
}
/* the walk's k-th split: its short ones first */
__forceinline__ int at_walk_split(const at_walk &w, int k)
{
    return k < w.ns ? w.s_lo + k : w.S + w.y + (k - w.ns) * w.Y;
}
__forceinline__ bool at_walk_has(const at_walk &w, int s)
{
    return s < w.S ? s >= w.s_lo && s < w.s_lo + w.ns : (s - w.S) % w.Y == w.y && (s - w.S) / w.Y < w.nl;
}
#define AT_QV 128 /* query vectors per block; halved where two warps share them */
#define AT_KP_MAX 0x7fffffff /* key-position bounds that never hide a key */
#define AT_KP_MIN (-0x7fffffff - 1)

/* A decode's q/k norm + RoPE + K/V store run by attention itself (fused
 * != 0; cuda_backend.c's qkv_attention stage, one row a sequence): each
 * block sums its query heads' q from the q/k/v GEMM's split-K partials
 * and norms and rotates them into shared memory, and the block whose
 * split holds the row's own key does the same for the row's k (into k)
 * and v (into parts.v) and stores both into the pages, all with the
 * functions of dflash_qk_norm_rope (norm_rope.cuh): the same bits as that
 * launch followed by attention. cuda_internal.h mirrors this layout. */
struct attn_fuse {
    const void *qnorm, *knorm; /* per-head norm weights (ndt), or both null: RoPE alone */
    const float *inv_freq;     /* the RoPE table */
    float *k;                  /* [n_rows, n_kv_heads, D]: the rows' k, normed and rotated */
    float eps, attn;
    int ndt, fused;
    qk_store st;
    qk_parts parts;
};
static_assert(sizeof(attn_fuse) == 200, "mirrored by cuda_attn_fuse in cuda_internal.h");
#define AT_FUSED_QV 8 /* query vectors a block can norm and rotate itself */

/* cuda_attention.c mirrors this layout. */
struct attn_tc_args {
    const float *q;           /* [n_rows, n_heads, D] */
    float *out;               /* [n_rows, n_heads, D] */
    const int *q_pos;         /* [n_rows] */
    const int *seq_info;      /* [n_seqs, DFLASH_SEQ_INFO_LEN] */
    const u16 *pool;          /* bf16 [n_pages][n_layers][2][n_kv_heads][DFLASH_KV_PAGE][D] */
    const int *page_tables;  /* [n_seqs, pt_len] */
    const float *k_extra, *v_extra; /* [*, n_kv_heads * D] or null */
    float *part_o;            /* [max_splits, n_rows, n_heads, D] */
    float *part_ml;           /* [max_splits, n_rows, n_heads, 2] */
    int *eflag, *ehost;
    float scale;
    int n_pages, n_layers, layer, pt_len;
    int n_rows, n_heads, n_kv_heads, causal, window, compute_warps;
    int max_splits; /* splits of the call's bound on the keys: part_o's room */
    attn_fuse fu;
};
static_assert(sizeof(attn_tc_args) == 344, "mirrored by attn_tc_args in cuda_attention.c");

/* Shared-memory row strides in 32-bit words. K rows are read 16 bytes per
 * lane (8 keys x 4 lanes per phase): a stride of 16 words mod 32 keeps the
 * two keys of a phase on different banks. V rows are read by ldmatrix
 * (8 rows of 16 bytes per phase): 4 words mod 32 spreads them. */
template <int D> struct at_geom {
    static constexpr int KW = D / 2 + ((16 - D / 2) % 32 + 32) % 32;
    static constexpr int VW = D / 2 + ((4 - D / 2) % 32 + 32) % 32;
};

/* hi = bf16(a, b), lo = bf16 of what hi misses. */
__forceinline__ void at_split(float a, float b, u32 &hi, u32 &lo)
{
    hi = pack_bf16(a, b);
    lo = pack_bf16(a - __uint_as_float(hi << 16), b - __uint_as_float(hi & 0xffff0000u));
}

/* 2^x, one MUFU.EX2 (relative error ~2^-22, far below the bf16
 * rounding of the weights it makes); 2^-inf = 0. */
__forceinline__ float at_exp2(float x)
{
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

/* Page-table entries a split can touch: n keys span at most
 * n / DFLASH_KV_PAGE + 1 pages. */
#define AT_PAGES (AT_SPLIT / DFLASH_KV_PAGE + 1)
#define AT_LONG_PAGES (AT_LONG_SPLIT / DFLASH_KV_PAGE + 1)
/* A block's splits' table entries, read once into shared memory: room
 * for AT_ROOM short splits, a long one taking AT_LONG_W short ones' room
 * or less. A walk's units (at_walk_of's c) count a sequence's last split
 * by its keys, one unit for up to AT_SPLIT keys, while it takes a long
 * split's entries: cuda_attention.c's grid keeps c at most AT_ROOM - 1. */
#define AT_PAGE_SLOTS (AT_ROOM * AT_PAGES)
static_assert(AT_LONG_PAGES <= AT_LONG_W * AT_PAGES, "a long split's entries fit its short splits' room");

/* Eight f32 values rounded to bf16 into 16 bytes of shared memory. */
__forceinline__ void at_store_bf16(u32 *dst, const float *src)
{
    const float4 v0 = *(const float4 *)src, v1 = *(const float4 *)(src + 4);
    *(uint4 *)dst = make_uint4(pack_bf16(v0.x, v0.y), pack_bf16(v0.z, v0.w), pack_bf16(v1.x, v1.y),
                               pack_bf16(v1.z, v1.w));
}

/* Stage TILE keys [u0, u0 + TILE) of the sequence into ks/vs: paged
 * keys by cp.async from the split's pages (page p_first + i: its K rows
 * of this layer and KV head at page_k[i], V rows v_off further, null for
 * a table entry outside the pool, pages[i]; both read once per block, so
 * the copies issue back to back instead of each waiting on a table
 * read), extra keys converted from f32, keys past `u_end` as zeros
 * (their scores are masked; zero V keeps 0 * V exact). A thread copies
 * one 16-byte chunk (ch) of a key's K row and the same chunk of its V
 * row, for keys threadIdx.x / CH, then every blockDim.x / CH further:
 * everything but the page lookup is the same for every tile. */
template <int D, int TILE>
__forceinline__ void at_load_tile(const attn_tc_args &a, u32 *ks, u32 *vs, const u16 *const *page_k,
                                  const int *pages, i64 v_off, int p_first, int kvh, int lo, int n_paged,
                                  int extra_off, int u0, int u_end)
{
    constexpr unsigned CH = D / 8; /* 16-byte chunks per key row */
    const unsigned ch = threadIdx.x % CH, keys_per_pass = blockDim.x / CH;
    for (unsigned key = threadIdx.x / CH; key < (unsigned)TILE; key += keys_per_pass) {
        u32 *kd = ks + key * at_geom<D>::KW + ch * 4, *vd = vs + key * at_geom<D>::VW + ch * 4;
        const int u = u0 + (int)key;
        if (u < u_end && u < n_paged) {
            const unsigned pos = (unsigned)(lo + u), pi = pos / DFLASH_KV_PAGE - (unsigned)p_first;
            const u16 *k = page_k[pi];
            if (k) {
                k += (pos % DFLASH_KV_PAGE) * D + ch * 8;
                cp_async16(kd, k);
                cp_async16(vd, k + v_off);
                continue;
            }
            if (ch == 0)
                report_error(a.eflag, a.ehost, ERR_ATTN_PAGE, (int)pos, pages[pi], a.n_pages);
        } else if (u < u_end) {
            const i64 off = ((i64)(extra_off + u - n_paged) * a.n_kv_heads + kvh) * D + ch * 8;
            at_store_bf16(kd, a.k_extra + off);
            at_store_bf16(vd, a.v_extra + off);
            continue;
        }
        *(uint4 *)kd = make_uint4(0, 0, 0, 0);
        *(uint4 *)vd = make_uint4(0, 0, 0, 0);
    }
}

/* The fused decode's work before attention (attn_fuse; head_dim 128, one
 * row a sequence): unit u < nq is query vector qv0 + u (into qs [nq][D]),
 * unit nq, where this block's split holds the row's own key (kv_here),
 * the row's k and v of KV head kvh. A warp takes units warp, warp +
 * warps, ...; each unit's function finds what it can before waiting on
 * the launch before (norm_rope.cuh), as dflash_qk_norm_rope's warps do. */
__forceinline__ void at_fused_qk(const attn_tc_args &a, float *qs, int kvh, int qv0, int nq, int G, int row0,
                                 bool kv_here)
{
    constexpr int D = 128, PER = D / 32;
    const attn_fuse &f = a.fu;
    const qk_parts &pa = f.parts;
    const int warps = blockDim.x >> 5, units = nq + (kv_here ? 1 : 0), hkv = a.n_kv_heads;
    for (int u = threadIdx.x >> 5; u < units; u += warps) {
        if (u < nq) {
            const int qv = qv0 + u, i = row0 + qv / G, h = kvh * G + qv % G;
            const head_src hs = { pa.ws + i * pa.ld + (i64)h * D, pa.scales[0] ? pa.scales[0] + (i64)h * D : nullptr,
                                  pa.stride, pa.slices };
            norm_rope_regs<PER>(qs + u * D, hs, f.qnorm, f.ndt, a.q_pos + i, f.eps, f.inv_freq, f.attn);
        } else {
            const i64 kv = (i64)row0 * hkv + kvh;
            const head_src hs = { pa.ws + row0 * pa.ld + pa.off_k + (i64)kvh * D,
                                  pa.scales[1] ? pa.scales[1] + (i64)kvh * D : nullptr, pa.stride, pa.slices };
            const head_src vs = { pa.ws + row0 * pa.ld + pa.off_v + (i64)kvh * D,
                                  pa.scales[2] ? pa.scales[2] + (i64)kvh * D : nullptr, pa.stride, pa.slices };
            kv_head_regs<PER>(f.k + kv * D, hs, vs, pa.v + kv * D, nullptr, f.knorm, f.ndt, a.q_pos, row0, f.eps,
                              f.inv_freq, f.attn, f.st, kvh, hkv);
        }
    }
}

/* NH: warps sharing a tile of 16 query vectors (1, or 2 with D / 2
 * dimensions each). */
template <int D, int NH> __forceinline__ void attention_tc_body(const attn_tc_args &a)
{
    STAMP_BEGIN
    pdl_trigger();
    constexpr int DH = D / NH;                    /* dimensions a warp holds */
    constexpr int TILE = AT_TILE / NH;            /* keys per tile */
    constexpr int DC = DH / 32 > 0 ? DH / 32 : 1; /* 32-dim chunks of a query row (D = 16: one half chunk) */
    constexpr int NK = TILE / 8;                  /* key n-tiles of S */
    constexpr int ND = DH / 8;                    /* dim n-tiles of O */
    __shared__ __align__(16) u32 ks[2][TILE * at_geom<D>::KW];
    __shared__ __align__(16) u32 vs[2][TILE * at_geom<D>::VW];
    __shared__ int pages[AT_PAGE_SLOTS];
    __shared__ const u16 *page_k[AT_PAGE_SLOTS];
    /* NH = 2: each warp's half of the scores, [warp][element][lane] */
    __shared__ float xch[NH > 1 ? 8 * NK * 4 * 32 : 1];

    const int G = a.n_heads / a.n_kv_heads;
    const int seq = blockIdx.x / a.n_kv_heads, kvh = blockIdx.x % a.n_kv_heads;
    const int *si = a.seq_info + (i64)seq * DFLASH_SEQ_INFO_LEN;
    const int lo = si[0], n_paged = si[1] > si[0] ? si[1] - si[0] : 0;
    const int extra_off = si[2], n_extra = a.k_extra ? si[3] : 0, pos0 = si[4], row0 = si[5], n_rows = si[6];
    const int T = n_paged + n_extra, n_splits = at_n_splits(T);
    const int QV = n_rows * G, qv0 = blockIdx.z * (AT_QV / NH);
    if (n_splits > a.max_splits) { /* its partials would land past part_o's room */
        if (blockIdx.y == 0 && blockIdx.z == 0 && kvh == 0 && threadIdx.x == 0)
            report_error(a.eflag, a.ehost, ERR_ATTN_KEYS, seq, T, a.max_splits);
        return;
    }
    /* This block's walk (one split without keys when T = 0), its first
     * n_short splits short. The launcher's grid keeps their table entries
     * within AT_PAGE_SLOTS for any sequence within the call's bound (those
     * past it returned above); the loop below only keeps the tables safe
     * if that ever failed. */
    const at_walk walk = at_walk_of(T, blockIdx.y, gridDim.y);
    const int n_short = walk.ns;
    /* split k's first table entry in the block's tables */
    const auto entries_before = [&](int k) {
        return k <= n_short ? k * AT_PAGES : n_short * AT_PAGES + (k - n_short) * AT_LONG_PAGES;
    };
    int n_mine = walk.ns + walk.nl;
    while (entries_before(n_mine) > AT_PAGE_SLOTS)
        n_mine--;
    if (n_mine == 0 || qv0 >= QV)
        return;
    const auto split_begin = [&](int k) { return at_split_begin(at_walk_split(walk, k)); };
    const auto split_end = [&](int k) {
        const int e = split_begin(k) + at_split_len(at_walk_split(walk, k));
        return e < T ? e : T;
    };

    /* The table entries of each split's paged keys, read once. The
     * sequence records and page tables come with the forward's inputs,
     * uploaded before its first kernel, so they are read before waiting
     * for the kernel before this one (which writes q and this forward's
     * K/V rows: everything below the wait). */
    const i64 v_off = (i64)a.n_kv_heads * DFLASH_KV_PAGE * D; /* a page's V rows after its K rows */
    for (int i = threadIdx.x; i < entries_before(n_mine); i += blockDim.x) {
        const int k = i < n_short * AT_PAGES ? i / AT_PAGES : n_short + (i - n_short * AT_PAGES) / AT_LONG_PAGES;
        const int ub = split_begin(k), ue = split_end(k);
        const int last_u = (ue < n_paged ? ue : n_paged) - 1; /* the split's last paged key */
        const int pg = (lo + ub) / DFLASH_KV_PAGE + (i - entries_before(k));
        const int blk = last_u >= ub && pg <= (lo + last_u) / DFLASH_KV_PAGE
                            ? a.page_tables[(i64)seq * a.pt_len + pg % a.pt_len]
                            : -1;
        pages[i] = blk;
        page_k[i] = (unsigned)blk < (unsigned)a.n_pages
                        ? a.pool + kv_row_at(blk, a.n_layers, a.layer, 0, a.n_kv_heads, kvh, 0, D)
                        : nullptr;
    }

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int qt = warp / NH, half = warp % NH; /* the warp's query tile, its half of the dimensions */
    const int dim0 = half * DH;
    const bool computes = warp < a.compute_warps;
    /* This lane's two query vectors: rows g and g + 8 of the warp's tile;
     * their positions are forward inputs too. */
    int orow[2], ohead[2], khi[2], klo[2]; /* row r sees key positions kp with klo < kp <= khi */
    bool qok[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int qv = qv0 + qt * 16 + g + 8 * r;
        qok[r] = computes && qv < QV;
        orow[r] = row0 + (qok[r] ? qv / G : 0);
        ohead[r] = kvh * G + (qok[r] ? qv % G : 0);
        const int qpos = qok[r] ? a.q_pos[orow[r]] : 0;
        khi[r] = !qok[r] ? AT_KP_MIN : a.causal ? qpos : AT_KP_MAX;
        klo[r] = a.window > 0 ? qpos - a.window : AT_KP_MIN;
    }
    /* The fused decode (attn_fuse): this block's q, normed and rotated by
     * it, in qs; the row's K and V stored into its page by the block whose
     * split holds that key, before any of the block's tiles is copied. */
    __shared__ __align__(16) float qs[D == 128 && NH == 1 ? AT_FUSED_QV * D : 4];
    bool fused = false;
    if constexpr (D == 128 && NH == 1) {
        fused = a.fu.fused != 0;
        if (fused) {
            const int u_row = a.q_pos[row0] - lo; /* the row's own key (a forward input) */
            at_fused_qk(a, qs, kvh, qv0, QV - qv0 < AT_FUSED_QV ? QV - qv0 : AT_FUSED_QV, G, row0,
                        u_row >= 0 && u_row < n_paged && at_walk_has(walk, at_split_of(u_row)));
        }
    }
    pdl_wait();
    if (fused) {
        __threadfence_block(); /* the page stores, before other threads' copies read them */
        __syncthreads();
    }
    STAMP(1);

    u32 qh[2][DC][4], ql[2][DC][4];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const float *qr = fused ? qs + (qt * 16 + g + 8 * r) * D : a.q + ((i64)orow[r] * a.n_heads + ohead[r]) * D;
#pragma unroll
        for (int c = 0; c < DC; c++) {
            /* D = 16: lanes t = 0, 1 take dims 8t..8t+7; t = 2, 3 hold zeros */
            const int d0 = dim0 + 32 * c + 8 * t;
            const bool in = qok[r] && d0 < D;
            const float4 v0 = in ? *(const float4 *)(qr + d0) : make_float4(0, 0, 0, 0);
            const float4 v1 = in ? *(const float4 *)(qr + d0 + 4) : make_float4(0, 0, 0, 0);
            at_split(v0.x, v0.y, qh[r][c][0], ql[r][c][0]);
            at_split(v0.z, v0.w, qh[r][c][1], ql[r][c][1]);
            at_split(v1.x, v1.y, qh[r][c][2], ql[r][c][2]);
            at_split(v1.z, v1.w, qh[r][c][3], ql[r][c][3]);
        }
    }

    const float NEG = -__int_as_float(0x7f800000);
    /* scores in log2 units: exp(x) = 2^(x log2 e), one ex2 each */
    const float scale2 = a.scale * 1.4426950408889634f;
    float m[2], l[2], o[ND][4];

    /* The block's tiles as one run of steps, split by split, the copies
     * of the next step (kn's tile tn) in flight while a step computes. */
    const auto tiles_of = [&](int k) { return n_splits > 0 ? (split_end(k) - split_begin(k) + TILE - 1) / TILE : 0; };
    int kn = 0, tn = 0;
    const auto load_next = [&](int stage) {
        const int ub = split_begin(kn), e = entries_before(kn);
        at_load_tile<D, TILE>(a, ks[stage], vs[stage], page_k + e, pages + e, v_off, (lo + ub) / DFLASH_KV_PAGE,
                              kvh, lo, n_paged, extra_off, ub + tn * TILE, split_end(kn));
        cp_async_commit();
        if (++tn == tiles_of(kn))
            tn = 0, kn++;
    };

    STAMP(2);
    __syncthreads();
    if (tiles_of(0) > 0)
        load_next(0);
    else
        kn = n_mine; /* no keys: nothing to copy */
    for (int j = 0, k = 0; k < n_mine; k++) {
        const int u_end = split_end(k), j0 = j, j_end = j + tiles_of(k);
        m[0] = m[1] = NEG;
        l[0] = l[1] = 0.0f;
#pragma unroll
        for (int n = 0; n < ND; n++)
            o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
        for (; j < j_end; j++) {
            const int cur = j & 1, u0 = split_begin(k) + (j - j0) * TILE;
            if (kn < n_mine) {
                load_next(cur ^ 1);
                cp_async_wait<1>();
            } else {
                cp_async_wait<0>();
            }
            __syncthreads();
            if (j < 2)
                STAMP(3 + j);
            float s[NK][4];
            if (computes) {
                /* S = Q K^T: key n-tile n holds keys u0 + 8n + g for this lane's B. */
                /* hi and lo parts in separate accumulators: two short chains
                 * of dependent mma instead of one long one */
                float sl[NK][4];
#pragma unroll
                for (int n = 0; n < NK; n++) {
                    s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
                    sl[n][0] = sl[n][1] = sl[n][2] = sl[n][3] = 0.0f;
                    const u32 *kr = ks[cur] + (8 * n + g) * at_geom<D>::KW;
#pragma unroll
                    for (int c = 0; c < DC; c++) {
                        const int d0 = dim0 + 32 * c + 8 * t;
                        const uint4 kb = d0 < D ? *(const uint4 *)(kr + d0 / 2) : make_uint4(0, 0, 0, 0);
                        mma_bf16(s[n], qh[0][c][0], qh[1][c][0], qh[0][c][1], qh[1][c][1], kb.x, kb.y);
                        mma_bf16(sl[n], ql[0][c][0], ql[1][c][0], ql[0][c][1], ql[1][c][1], kb.x, kb.y);
                        mma_bf16(s[n], qh[0][c][2], qh[1][c][2], qh[0][c][3], qh[1][c][3], kb.z, kb.w);
                        mma_bf16(sl[n], ql[0][c][2], ql[1][c][2], ql[0][c][3], ql[1][c][3], kb.z, kb.w);
                    }
#pragma unroll
                    for (int e = 0; e < 4; e++)
                        s[n][e] += sl[n][e];
                }
                if (NH > 1) /* this warp's half of the scores, for its partner */
#pragma unroll
                    for (int n = 0; n < NK; n++)
#pragma unroll
                        for (int e = 0; e < 4; e++)
                            xch[(warp * NK * 4 + n * 4 + e) * 32 + lane] = s[n][e];
            }
            if (NH > 1)
                __syncthreads(); /* every warp: the halves written */
            if (computes) {
                if (NH > 1) /* the halves added (a + b == b + a: both warps hold the same sums) */
#pragma unroll
                    for (int n = 0; n < NK; n++)
#pragma unroll
                        for (int e = 0; e < 4; e++)
                            s[n][e] += xch[((warp ^ 1) * NK * 4 + n * 4 + e) * 32 + lane];
                /* Scale (into log2 units) and mask: element e of tile n is
                 * (query r = e / 2, key u0 + 8n + 2t + e % 2). */
                float mx[2] = { NEG, NEG };
#pragma unroll
                for (int n = 0; n < NK; n++)
#pragma unroll
                    for (int j = 0; j < 2; j++) {
                        const int u = u0 + 8 * n + 2 * t + j;
                        const int kp = u < n_paged ? lo + u : pos0 + (u - n_paged);
                        const bool key_in = u < u_end;
#pragma unroll
                        for (int r = 0; r < 2; r++) {
                            const int e = 2 * r + j;
                            const bool vis = key_in && kp <= khi[r] && kp > klo[r];
                            s[n][e] = vis ? s[n][e] * scale2 : NEG;
                            mx[r] = fmaxf(mx[r], s[n][e]);
                        }
                    }
                float corr[2];
#pragma unroll
                for (int r = 0; r < 2; r++) {
                    mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
                    mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
                    const float mn = fmaxf(m[r], mx[r]);
                    corr[r] = m[r] == NEG ? 0.0f : at_exp2(m[r] - mn);
                    m[r] = mn;
                }
                float psum[2] = { 0.0f, 0.0f };
#pragma unroll
                for (int n = 0; n < NK; n++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        const int r = e >> 1;
                        /* P enters the mma as bf16: round it here, so the
                         * normalizer sums the very weights used */
                        const float p = m[r] == NEG ? 0.0f : round_bf16(at_exp2(s[n][e] - m[r]));
                        s[n][e] = p;
                        psum[r] += p;
                    }
#pragma unroll
                for (int r = 0; r < 2; r++) {
                    psum[r] += __shfl_xor_sync(0xffffffffu, psum[r], 1);
                    psum[r] += __shfl_xor_sync(0xffffffffu, psum[r], 2);
                    l[r] = l[r] * corr[r] + psum[r];
                }
#pragma unroll
                for (int n = 0; n < ND; n++) {
                    o[n][0] *= corr[0];
                    o[n][1] *= corr[0];
                    o[n][2] *= corr[1];
                    o[n][3] *= corr[1];
                }
                /* O += P V, 16 keys per step; V^T fragments by ldmatrix.trans. */
#pragma unroll
                for (int kk = 0; kk < TILE / 16; kk++) {
                    u32 ph[4]; /* exact: the weights are bf16 values already */
                    ph[0] = pack_bf16(s[2 * kk][0], s[2 * kk][1]);
                    ph[1] = pack_bf16(s[2 * kk][2], s[2 * kk][3]);
                    ph[2] = pack_bf16(s[2 * kk + 1][0], s[2 * kk + 1][1]);
                    ph[3] = pack_bf16(s[2 * kk + 1][2], s[2 * kk + 1][3]);
#pragma unroll
                    for (int n = 0; n < ND; n += 2) {
                        /* lanes 0-7: keys 0-7, dims 8n..; 8-15: keys 8-15; 16-31: dims 8(n+1).. */
                        const int key = 16 * kk + (lane & 15), dn = n + (lane >> 4) < ND ? n + (lane >> 4) : n;
                        const u32 addr = smem_addr(vs[cur] + key * at_geom<D>::VW + (half * ND + dn) * 4);
                        u32 b0, b1, b2, b3;
                        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                                     : "=r"(b0), "=r"(b1), "=r"(b2), "=r"(b3)
                                     : "r"(addr));
                        mma_bf16(o[n], ph[0], ph[1], ph[2], ph[3], b0, b1);
                        if (n + 1 < ND)
                            mma_bf16(o[n + 1], ph[0], ph[1], ph[2], ph[3], b2, b3);
                    }
                }
            }
            __syncthreads(); /* the next load overwrites this stage */
        }
        if (!computes)
            continue;
        /* O fragment n: (query r = e / 2, dims 8n + 2t + e % 2). */
        if (n_splits <= 1) {
#pragma unroll
            for (int r = 0; r < 2; r++) {
                if (!qok[r])
                    continue;
                const float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
                float *op = a.out + ((i64)orow[r] * a.n_heads + ohead[r]) * D + dim0;
#pragma unroll
                for (int n = 0; n < ND; n++)
                    *(float2 *)(op + 8 * n + 2 * t) = make_float2(o[n][2 * r] * inv, o[n][2 * r + 1] * inv);
            }
        } else {
#pragma unroll
            for (int r = 0; r < 2; r++) {
                if (!qok[r])
                    continue;
                const i64 unit = ((i64)at_walk_split(walk, k) * a.n_rows + orow[r]) * a.n_heads + ohead[r];
                float *op = a.part_o + unit * D + dim0;
#pragma unroll
                for (int n = 0; n < ND; n++)
                    *(float2 *)(op + 8 * n + 2 * t) = make_float2(o[n][2 * r], o[n][2 * r + 1]);
                if (t == 0 && half == 0) /* m back in natural-log units, as the merge takes it */
                    *(float2 *)(a.part_ml + unit * 2) = make_float2(m[r] * 0.6931471805599453f, l[r]);
            }
        }
    }
    STAMP(5);
    STAMP_END(STAMP_K_ATTENTION, QV);
}

#define ATTN_TC_KERNEL(D, NH)                                                                                 \
    extern "C" __global__ void __launch_bounds__(256, 1) dflash_attention_tc_##D(const attn_tc_args a)       \
    {                                                                                                         \
        attention_tc_body<D, NH>(a);                                                                          \
    }

ATTN_TC_KERNEL(16, 1)
ATTN_TC_KERNEL(32, 1)
ATTN_TC_KERNEL(64, 1)
ATTN_TC_KERNEL(128, 1)
ATTN_TC_KERNEL(256, 2)

/* Merge the partials of rows whose sequence has more than one split:
 * out = sum_s w_s O_s / sum_s w_s l_s, w_s = exp(m_s - max m) (0 for a
 * split the row cannot see). grid (n_rows, n_heads), 256 threads: the
 * split weights go to shared memory in one pass; then warp w sums the
 * splits s = w, w + 8, ... (blockDim.x = 256) of every dimension (a lane owns D / 32 of them,
 * independent loads in flight), and the eight warp sums and the
 * denominator are added in a fixed order. Splits a row cannot see add
 * exact zeros, so one split or several give the same bits. long_splits:
 * the partials come from the tensor-core kernel (at_n_splits' numbering),
 * else from attention.cu (AT_SPLIT keys each); max_splits: the splits
 * the partials have room for (a sequence with more was reported by the
 * attention kernel, which wrote none of them). */
#define AT_MAX_SPLITS 2048
#define AC_WARPS 8
#define AC_ML_REGS 2 /* (m, l) pairs a thread keeps in registers */
#define AC_UNROLL 4  /* splits a warp requests together */
template <int QN> /* D <= 32 QN */
__forceinline__ void attn_combine_body(const float *part_o, const float *part_ml, float *out, const int *row_seq,
                                       const int *seq_info, int n_rows, int n_heads, int has_extra, int D,
                                       int long_splits, int max_splits)
{
    __shared__ float w[AT_MAX_SPLITS];
    __shared__ float acc[AC_WARPS][32 * QN];
    __shared__ float scratch[32];
    STAMP_BEGIN
    pdl_trigger();
    /* the rows' sequences and records are forward inputs (uploaded before
     * the forward's first kernel); the partials are the kernel before's */
    const int row = blockIdx.x, h = blockIdx.y, tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int *si = seq_info + (i64)row_seq[row] * DFLASH_SEQ_INFO_LEN;
    const int n_paged = si[1] > si[0] ? si[1] - si[0] : 0;
    const int T = n_paged + (has_extra ? si[3] : 0);
    const int n_splits = long_splits ? at_n_splits(T) : (T + AT_SPLIT - 1) / AT_SPLIT;
    if (n_splits <= 1 || n_splits > max_splits)
        return; /* the attention kernel wrote this row, or reported it */
    pdl_wait();
    STAMP(1);
    const float NEG = -__int_as_float(0x7f800000);
    const i64 stride = (i64)n_rows * n_heads, unit = (i64)row * n_heads + h;
    /* Each thread's (m, l) are read once: the first AC_ML_REGS splits
     * of the thread from registers, any beyond from the partials again. */
    float mx = NEG, ml_m[AC_ML_REGS], ml_l[AC_ML_REGS];
#pragma unroll
    for (int r = 0; r < AC_ML_REGS; r++) {
        const int s = tid + r * (int)blockDim.x;
        const float2 v = s < n_splits ? *(const float2 *)(part_ml + (s * stride + unit) * 2) : make_float2(NEG, 0.0f);
        ml_m[r] = v.x;
        ml_l[r] = v.y;
        mx = fmaxf(mx, v.x);
    }
    for (int s = tid + AC_ML_REGS * (int)blockDim.x; s < n_splits; s += blockDim.x)
        mx = fmaxf(mx, part_ml[(s * stride + unit) * 2]);
    mx = block_max(mx, scratch);
    float den = 0.0f;
#pragma unroll
    for (int r = 0; r < AC_ML_REGS; r++) {
        const int s = tid + r * (int)blockDim.x;
        if (s < n_splits) {
            const float ws = ml_m[r] == NEG ? 0.0f : expf(ml_m[r] - mx);
            w[s] = ws;
            den += ws * ml_l[r];
        }
    }
    for (int s = tid + AC_ML_REGS * (int)blockDim.x; s < n_splits; s += blockDim.x) {
        const float m_s = part_ml[(s * stride + unit) * 2];
        const float ws = m_s == NEG ? 0.0f : expf(m_s - mx);
        w[s] = ws;
        den += ws * part_ml[(s * stride + unit) * 2 + 1];
    }
    den = block_sum(den, scratch); /* also orders the w[] writes before the reads below */
    STAMP(2);
    /* dims lane, lane + 32, ... (D <= 32 QN); AC_UNROLL of the warp's
     * splits requested together, added in split order */
    const int nw = blockDim.x >> 5; /* at most AC_WARPS */
    float num[QN];
#pragma unroll
    for (int q = 0; q < QN; q++)
        num[q] = 0.0f;
    for (int s0 = warp; s0 < n_splits; s0 += nw * AC_UNROLL) {
        float o[AC_UNROLL][QN];
#pragma unroll
        for (int u = 0; u < AC_UNROLL; u++) {
            const int s = s0 + u * nw;
#pragma unroll
            for (int q = 0; q < QN; q++)
                o[u][q] = s < n_splits && lane + 32 * q < D ? part_o[(s * stride + unit) * D + lane + 32 * q] : 0.0f;
        }
#pragma unroll
        for (int u = 0; u < AC_UNROLL; u++) {
            const int s = s0 + u * nw;
            if (s >= n_splits)
                break;
            const float ws = w[s];
#pragma unroll
            for (int q = 0; q < QN; q++)
                if (lane + 32 * q < D)
                    num[q] += ws * o[u][q];
        }
    }
#pragma unroll
    for (int q = 0; q < QN; q++)
        if (lane + 32 * q < D)
            acc[warp][lane + 32 * q] = num[q];
    STAMP(3);
    __syncthreads();
    const float inv = den > 0.0f ? 1.0f / den : 0.0f;
    for (int d = tid; d < D; d += blockDim.x) {
        float v = 0.0f;
        for (int k = 0; k < nw; k++)
            v += acc[k][d];
        out[unit * D + d] = v * inv;
    }
    STAMP_END(STAMP_K_MERGE, n_splits);
}

/* head_dim <= 128, and up to 512 (the tensor-core kernel's 256 and the
 * general kernel's larger ones) */
extern "C" __global__ void __launch_bounds__(AC_WARPS * 32)
    dflash_attn_combine(const float *part_o, const float *part_ml, float *out, const int *row_seq,
                        const int *seq_info, int n_rows, int n_heads, int has_extra, int D, int long_splits,
                        int max_splits)
{
    attn_combine_body<4>(part_o, part_ml, out, row_seq, seq_info, n_rows, n_heads, has_extra, D, long_splits,
                         max_splits);
}

extern "C" __global__ void __launch_bounds__(AC_WARPS * 32)
    dflash_attn_combine_512(const float *part_o, const float *part_ml, float *out, const int *row_seq,
                            const int *seq_info, int n_rows, int n_heads, int has_extra, int D, int long_splits,
                            int max_splits)
{
    attn_combine_body<16>(part_o, part_ml, out, row_seq, seq_info, n_rows, n_heads, has_extra, D, long_splits,
                          max_splits);
}
