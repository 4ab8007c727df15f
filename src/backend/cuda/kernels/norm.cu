/* norm.cu: add_rmsnorm (residual add fused with RMSNorm, one block per row;
 * also with the added delta a gathered weighted sum: gather_add_rmsnorm,
 * or a split-K GEMM's partials: split_add_rmsnorm, a cluster a row),
 * norm_rope (per-head RMSNorm then NeoX RoPE, whole or partial, one warp
 * per (row, head); for q and k together, optionally storing K and V into
 * the KV pages) and norm_gate (per-head RMSNorm times silu of a gate: a
 * Gated DeltaNet layer's output norm).
 * Arithmetic follows cpu_ops.c expression by expression; only the order of
 * the sum of squares differs (a tree instead of a running sum). */
#include "norm_rope.cuh"

/* grid n, block 32..512 with dim <= PER * blockDim: if delta,
 * x += delta (written back); then out = w * (x * inv),
 * inv = 1 / sqrt(mean(x^2) + eps). A thread holds its PER elements
 * j = threadIdx.x + i * blockDim.x in registers and requests all of them
 * (the weights before waiting on the previous kernel: they are never
 * written) before using any, so the kernel costs a few memory round trips,
 * not one per element. The sum of squares runs in the same order as a
 * strided loop would.
 * GATHER: the delta is not read but computed, as gather_sum computes it
 * (elementwise.cu): the sum over terms t < k, in t order from 0, of
 * gw[t] * src[idx[t] row], each product rounded before the add; AR_TERMS
 * terms' rows requested together. The same bits as gather_sum into a
 * buffer and this kernel reading it. */
#define AR_PER 16
#define AR_TERMS 6
template <bool GATHER, int PER>
__forceinline__ void add_rmsnorm_row(float *x, const float *delta, const float *src, const int *idx, const float *gw,
                                     int k, const void *w, int wdt, int dim, float eps, float *out)
{
    __shared__ float scratch[32];
    const int bd = blockDim.x;
    pdl_trigger();
    float wv[PER], v[PER], d[PER];
#pragma unroll
    for (int i = 0; i < PER; i++) {
        const int j = threadIdx.x + i * bd;
        wv[i] = j < dim ? load_elem(w, wdt, j) : 0.0f;
    }
    pdl_wait();
    float *xr = x + (i64)blockIdx.x * dim;
    const float *dr = delta ? delta + (i64)blockIdx.x * dim : 0;
#pragma unroll
    for (int i = 0; i < PER; i++) {
        const int j = threadIdx.x + i * bd;
        v[i] = j < dim ? xr[j] : 0.0f;
        d[i] = j < dim && dr && !GATHER ? dr[j] : 0.0f;
    }
    if (GATHER) {
        const int *ix = idx + (i64)blockIdx.x * k;
        const float *wr = gw + (i64)blockIdx.x * k;
        for (int t0 = 0; t0 < k; t0 += AR_TERMS) {
            float tw[AR_TERMS], g[AR_TERMS][PER];
#pragma unroll
            for (int u = 0; u < AR_TERMS; u++) {
                const bool in = t0 + u < k;
                tw[u] = in ? wr[t0 + u] : 0.0f;
                const float *row = src + (in ? (i64)ix[t0 + u] * dim : 0);
#pragma unroll
                for (int i = 0; i < PER; i++) {
                    const int j = threadIdx.x + i * bd;
                    g[u][i] = in && j < dim ? row[j] : 0.0f;
                }
            }
#pragma unroll
            for (int u = 0; u < AR_TERMS; u++)
#pragma unroll
                for (int i = 0; i < PER; i++)
                    if (t0 + u < k)
                        d[i] = __fadd_rn(d[i], __fmul_rn(tw[u], g[u][i]));
        }
    }
    float ss = 0.0f;
#pragma unroll
    for (int i = 0; i < PER; i++) {
        const int j = threadIdx.x + i * bd;
        if (j >= dim)
            continue;
        if (dr || GATHER) {
            v[i] += d[i];
            xr[j] = v[i];
        }
        ss += v[i] * v[i];
    }
    ss = block_sum(ss, scratch);
    const float inv = 1.0f / sqrtf(ss / (float)dim + eps);
    float *o = out + (i64)blockIdx.x * dim;
#pragma unroll
    for (int i = 0; i < PER; i++) {
        const int j = threadIdx.x + i * bd;
        if (j < dim)
            o[j] = wv[i] * (v[i] * inv);
    }
}

extern "C" __global__ void dflash_add_rmsnorm(float *x, const float *delta, const void *w, int wdt, int dim,
                                              float eps, float *out)
{
    add_rmsnorm_row<false, AR_PER>(x, delta, nullptr, nullptr, nullptr, 0, w, wdt, dim, eps, out);
}

/* The same with the delta of row i the weighted sum of its k gathered
 * rows of src (gather_add_rmsnorm in backend.h): idx, gw [n * k]. Launched
 * with dflash_add_rmsnorm's block (so each element has the same thread and
 * the sum of squares the same order), which is at most 512 threads of
 * AR_SMALL_PER elements for dim <= 4096: the limit the registers of
 * its launch bounds set. */
#define AR_SMALL_PER 8
extern "C" __global__ void __launch_bounds__(512)
    dflash_gather_add_rmsnorm(float *x, const float *src, const int *idx, const float *gw, int k, const void *w, int wdt,
                              int dim, float eps, float *out)
{
    add_rmsnorm_row<true, AR_SMALL_PER>(x, nullptr, src, idx, gw, k, w, wdt, dim, eps, out);
}

/* The same with the delta of row r a split-K GEMM's output whose sum it
 * left here (linear_add_rmsnorm in cuda_gemm.c): `slices` partials of row
 * r at ws + s * stride + r * ld, `scales` its fp8 row scales (or NULL),
 * added as split_sum adds them. A row's partials are many bytes (16
 * slices of 2048 columns: 128 KB), too many for one SM to read quickly,
 * so a cluster of AR_CLUSTER blocks takes a row: block b sums element
 * chunk b (the elements dflash_add_rmsnorm's thread t holds as its b-th,
 * t + b * blockDim), writes x and stores the sums into block 0's shared
 * memory, and block 0 then norms the row exactly as dflash_add_rmsnorm
 * does (each element on the same thread, the same order of the sum of
 * squares): the same bits as the GEMM storing its output and
 * dflash_add_rmsnorm reading it. dflash_add_rmsnorm's block, dim <= 4096;
 * one block a row where the device has no clusters. */
#if __CUDA_ARCH__ >= 900
#define AR_CLUSTER 8 /* the host launches 8 blocks a row where clusters exist (cuda_backend.c) */
#define AR_CLUSTER_DIMS __cluster_dims__(AR_CLUSTER, 1, 1)
#else
#define AR_CLUSTER 1
#define AR_CLUSTER_DIMS
#endif
#define AR_SMALL_MAX_DIM (AR_SMALL_PER * 512)

/* v into element j of block 0's vs (this block's own where there are no
 * clusters) */
__forceinline__ void ar_put_leader(float *vs, int j, float v)
{
#if __CUDA_ARCH__ >= 900
    u32 a = (u32)__cvta_generic_to_shared(vs + j), r;
    asm volatile("mapa.shared::cluster.u32 %0, %1, 0;" : "=r"(r) : "r"(a));
    asm volatile("st.shared::cluster.f32 [%0], %1;" ::"r"(r), "f"(v) : "memory");
#else
    vs[j] = v;
#endif
}

extern "C" __global__ void AR_CLUSTER_DIMS __launch_bounds__(512)
    dflash_split_add_rmsnorm(float *x, const float *ws, int slices, i64 stride, i64 ld, const float *scales,
                             const void *w, int wdt, int dim, float eps, float *out)
{
    constexpr int MINE = AR_SMALL_PER / AR_CLUSTER; /* elements a thread sums */
    __shared__ float vs[AR_SMALL_MAX_DIM];
    __shared__ float scratch[32];
    const int bd = blockDim.x, b = (int)(blockIdx.x % AR_CLUSTER);
    const i64 r = blockIdx.x / AR_CLUSTER;
    STAMP_BEGIN
    pdl_trigger();
    float wv[AR_SMALL_PER];
#pragma unroll
    for (int i = 0; i < AR_SMALL_PER; i++) {
        const int j = threadIdx.x + i * bd;
        wv[i] = b == 0 && j < dim ? load_elem(w, wdt, j) : 0.0f;
    }
    cluster_sync(); /* every block of the cluster running: block 0's vs may be written */
    STAMP(1);
    pdl_wait();
    STAMP(2);
    float *xr = x + r * dim;
    const int first = threadIdx.x + b * bd, step = AR_CLUSTER * bd;
    float v[MINE], d[MINE];
#pragma unroll
    for (int k = 0; k < MINE; k++) {
        const int j = first + k * step;
        v[k] = j < dim ? xr[j] : 0.0f;
    }
    /* all slices at once in a cluster; 4 at a time where one block sums a row (registers) */
    split_sum<MINE, MINE == 1 ? 16 : 4>(ws + r * ld, stride, slices, scales, first, step, dim, d);
#pragma unroll
    for (int k = 0; k < MINE; k++) {
        const int j = first + k * step;
        if (j < dim) {
            v[k] += d[k];
            xr[j] = v[k];
            ar_put_leader(vs, j, v[k]);
        }
    }
    STAMP(3);
    cluster_sync(); /* block 0 sees the row's sums */
    STAMP(4);
    if (b != 0) {
        STAMP_END(STAMP_K_SPLIT_NORM, b);
        return;
    }
    float u[AR_SMALL_PER], ss = 0.0f;
#pragma unroll
    for (int i = 0; i < AR_SMALL_PER; i++) {
        const int j = threadIdx.x + i * bd;
        u[i] = j < dim ? vs[j] : 0.0f;
        if (j < dim)
            ss += u[i] * u[i];
    }
    ss = block_sum(ss, scratch);
    const float inv = 1.0f / sqrtf(ss / (float)dim + eps);
    float *o = out + r * dim;
#pragma unroll
    for (int i = 0; i < AR_SMALL_PER; i++) {
        const int j = threadIdx.x + i * bd;
        if (j < dim)
            o[j] = wv[i] * (u[i] * inv);
    }
    STAMP_END(STAMP_K_SPLIT_NORM, b);
}

/* One (row, head) vector v [head_dim] by one warp: optional RMSNorm with
 * `norm`, then NeoX RoPE at position p over the first 2 * half dimensions
 * (pairs (j, j + half); half = head_dim / 2 rotates all of them), cos and
 * sin times `attn`. inv_freq [half] is the host's table, the one the CPU
 * reference uses, so the angles agree bit for bit before sin/cos. */
__forceinline__ void norm_rope_warp(float *v, const void *norm, int ndt, float p, int head_dim, int half, float eps,
                                    const float *inv_freq, float attn)
{
    const int lane = threadIdx.x & 31;
    if (norm) {
        float ss = 0.0f;
        for (int j = lane; j < head_dim; j += 32)
            ss += v[j] * v[j];
        ss = warp_sum(ss);
        const float inv = 1.0f / sqrtf(ss / (float)head_dim + eps);
        for (int j = lane; j < head_dim; j += 32)
            v[j] = load_elem(norm, ndt, j) * (v[j] * inv);
        __syncwarp(); /* the rotation below reads elements other lanes wrote */
    }
    for (int j = lane; j < half; j += 32) {
        float ang = p * inv_freq[j];
        float c = cosf(ang) * attn, s = sinf(ang) * attn;
        float a = v[j], b = v[j + half];
        v[j] = a * c - b * s;
        v[j + half] = b * c + a * s;
    }
}

template <int PER> __forceinline__ void head_sum_put(const head_src &hs, float *out)
{
    float x[PER];
    head_sum<PER>(hs, x);
#pragma unroll
    for (int i = 0; i < PER; i++)
        out[(threadIdx.x & 31) + 32 * i] = x[i];
}

/* The whole vector [head_dim] into out, by the warp (head_sum's order;
 * one element a lane at a time where head_dim has no register form). */
__forceinline__ void head_sum_store(const head_src &hs, float *out, int head_dim)
{
    switch (head_dim) {
    case 64: head_sum_put<2>(hs, out); return;
    case 128: head_sum_put<4>(hs, out); return;
    case 192: head_sum_put<6>(hs, out); return;
    case 256: head_sum_put<8>(hs, out); return;
    default:
        for (int j = threadIdx.x & 31; j < head_dim; j += 32) {
            float y = 0.0f;
            for (int s = 0; s < hs.slices; s++)
                y += __ldcg(hs.src + s * hs.stride + j);
            out[j] = hs.scale ? __fmul_rn(y, hs.scale[j]) : y;
        }
    }
}

/* norm_rope_regs for this head_dim; false when it has no register form
 * (or the rotation is partial: half < head_dim / 2). */
__forceinline__ bool norm_rope_fast(float *v, const head_src &hs, const void *norm, int ndt, const int *pos_of_row,
                                    int head_dim, int half, float eps, const float *inv_freq, float attn)
{
    if (2 * half != head_dim)
        return false;
    switch (head_dim) {
    case 64: norm_rope_regs<2>(v, hs, norm, ndt, pos_of_row, eps, inv_freq, attn); return true;
    case 128: norm_rope_regs<4>(v, hs, norm, ndt, pos_of_row, eps, inv_freq, attn); return true;
    case 192: norm_rope_regs<6>(v, hs, norm, ndt, pos_of_row, eps, inv_freq, attn); return true;
    case 256: norm_rope_regs<8>(v, hs, norm, ndt, pos_of_row, eps, inv_freq, attn); return true;
    default: return false;
    }
}

/* block 128 = 4 warps, one (row, head) per warp (the register form where
 * head_dim has one). */
extern "C" __global__ void dflash_norm_rope(float *x, const void *norm, int ndt, const int *pos, int n, int n_heads,
                                            int head_dim, int half, float eps, const float *inv_freq, float attn)
{
    pdl_trigger();
    const i64 unit = (i64)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (unit >= (i64)n * n_heads)
        return; /* touches nothing */
    const int i = (int)(unit / n_heads);
    const head_src here = {};
    if (norm_rope_fast(x + unit * head_dim, here, norm, ndt, pos + i, head_dim, half, eps, inv_freq, attn))
        return;
    pdl_wait();
    norm_rope_warp(x + unit * head_dim, norm, ndt, (float)pos[i], head_dim, half, eps, inv_freq, attn);
}

/* Head kh of row i: its k (kr, as this warp just wrote it) and its v into
 * the page of position p, as dflash_kv_write stores them (the same
 * rounding); a position outside the pool reported, not written. */
__forceinline__ void qk_store_head(const qk_store &st, int i, int kh, int hkv, int p, const float *kr, int head_dim)
{
    const int lane = threadIdx.x & 31;
    const int blk = kv_page_of(st.page_tables, st.pt_len, st.row_seq + i, p);
    if (blk < 0 || blk >= st.n_pages) {
        if (lane == 0)
            report_error(st.eflag, st.ehost, ERR_KV_WRITE_PAGE, p, blk, st.n_pages);
        return;
    }
    __syncwarp(); /* kr's elements as the warp's lanes wrote them */
    for (int which = 0; which < 2; which++) {
        const float *src = which ? st.v + ((i64)i * hkv + kh) * head_dim : kr;
        const i64 dst = kv_row_at(blk, st.n_layers, st.layer, which, hkv, kh, p, head_dim);
        for (int c = lane; c < head_dim; c += 32)
            kv_store_elem(st.pool, st.bf16, dst + c, src[c]);
    }
}

/* q [n, hq, head_dim] and k [n, hkv, head_dim] in one launch, each head as
 * dflash_norm_rope does it (q with qnorm, k with knorm; both null: RoPE
 * alone); with st.pool, each k head's warp then stores that head's K and
 * V as dflash_kv_write would (hq may be 0: k alone). With parts.ws, q, k
 * and v are first summed from the GEMM's partials (v's head by its k
 * head's warp, into parts.v), as they are read. */
__forceinline__ void qk_norm_rope_warp(float *q, const void *qnorm, float *k, const void *knorm, int ndt,
                                       const int *pos, int n, int hq, int hkv, int head_dim, int half, float eps,
                                       const float *inv_freq, float attn, const qk_store st, const qk_parts parts)
{
    const i64 unit = (i64)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (unit >= (i64)n * (hq + hkv))
        return; /* touches nothing */
    const int i = (int)(unit / (hq + hkv)), h = (int)(unit % (hq + hkv)), kh = h - hq;
    float *v = h < hq ? q + ((i64)i * hq + h) * head_dim : k + ((i64)i * hkv + kh) * head_dim;
    head_src hs = {};
    if (parts.ws) {
        const i64 col = h < hq ? (i64)h * head_dim : parts.off_k + (i64)kh * head_dim;
        const float *sc = h < hq ? parts.scales[0] : parts.scales[1]; /* not indexed: no copy on the stack */
        hs = { parts.ws + i * parts.ld + col, sc ? sc + (col - (h < hq ? 0 : parts.off_k)) : nullptr, parts.stride,
               parts.slices };
    }
    if (h >= hq && 2 * half == head_dim && (parts.ws || st.pool) &&
        (head_dim == 64 || head_dim == 128 || head_dim == 192 || head_dim == 256)) {
        /* a k head with its v head and store: in registers */
        head_src vs = {};
        float *v_out = nullptr;
        if (parts.ws) {
            vs = { parts.ws + i * parts.ld + parts.off_v + (i64)kh * head_dim,
                   parts.scales[2] ? parts.scales[2] + (i64)kh * head_dim : nullptr, parts.stride, parts.slices };
            v_out = parts.v + ((i64)i * hkv + kh) * head_dim;
        }
        const float *v_in = !parts.ws && st.pool ? st.v + ((i64)i * hkv + kh) * head_dim : nullptr;
        switch (head_dim) {
        case 64: kv_head_regs<2>(v, hs, vs, v_out, v_in, knorm, ndt, pos, i, eps, inv_freq, attn, st, kh, hkv); break;
        case 128: kv_head_regs<4>(v, hs, vs, v_out, v_in, knorm, ndt, pos, i, eps, inv_freq, attn, st, kh, hkv); break;
        case 192: kv_head_regs<6>(v, hs, vs, v_out, v_in, knorm, ndt, pos, i, eps, inv_freq, attn, st, kh, hkv); break;
        default: kv_head_regs<8>(v, hs, vs, v_out, v_in, knorm, ndt, pos, i, eps, inv_freq, attn, st, kh, hkv); break;
        }
        return;
    }
    if (!norm_rope_fast(v, hs, h < hq ? qnorm : knorm, ndt, pos + i, head_dim, half, eps, inv_freq, attn)) {
        pdl_wait();
        if (hs.src) {
            head_sum_store(hs, v, head_dim);
            __syncwarp(); /* norm_rope_warp reads elements other lanes wrote */
        }
        norm_rope_warp(v, h < hq ? qnorm : knorm, ndt, (float)pos[i], head_dim, half, eps, inv_freq, attn);
    }
    if (parts.ws && h >= hq) { /* this k head's v head */
        const i64 col = parts.off_v + (i64)kh * head_dim;
        const head_src vs = { parts.ws + i * parts.ld + col,
                              parts.scales[2] ? parts.scales[2] + (i64)kh * head_dim : nullptr, parts.stride,
                              parts.slices };
        head_sum_store(vs, parts.v + ((i64)i * hkv + kh) * head_dim, head_dim);
    }
    if (st.pool && h >= hq)
        qk_store_head(st, i, kh, hkv, pos[i], v, head_dim);
}

/* The launch: one (row, head) unit a warp (qk_norm_rope_warp); a stamps
 * build records the block's entry and its last warp's end. */
extern "C" __global__ void dflash_qk_norm_rope(float *q, const void *qnorm, float *k, const void *knorm, int ndt,
                                               const int *pos, int n, int hq, int hkv, int head_dim, int half,
                                               float eps, const float *inv_freq, float attn, const qk_store st,
                                               const qk_parts parts)
{
    STAMP_WARPS_BEGIN
    pdl_trigger();
    qk_norm_rope_warp(q, qnorm, k, knorm, ndt, pos, n, hq, hkv, head_dim, half, eps, inv_freq, attn, st, parts);
    STAMP_WARPS_END(STAMP_K_QK_NORM, hq + hkv);
}

/* block 128 = 4 warps, one (row, head) per warp: v = w * (x * inv) as
 * norm_rope's RMSNorm computes it (the same sum of squares, lane by lane
 * then the warp), then x = silu(z) * v as swiglu computes it: the bits of
 * norm_rope (no rotation) followed by swiglu, in one pass. head_dim a
 * multiple of 32, at most 32 NG_PER. */
#define NG_PER 8
extern "C" __global__ void dflash_norm_gate(float *x, const void *norm, int ndt, const float *z, int n, int n_heads,
                                           int head_dim, float eps)
{
    pdl_trigger();
    const i64 unit = (i64)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (unit >= (i64)n * n_heads)
        return; /* touches nothing */
    const int lane = threadIdx.x & 31, per = head_dim / 32;
    float nw[NG_PER], v[NG_PER], g[NG_PER];
#pragma unroll
    for (int i = 0; i < NG_PER; i++)
        nw[i] = i < per ? load_elem(norm, ndt, lane + 32 * i) : 0.0f;
    pdl_wait();
    float *xr = x + unit * head_dim;
    const float *zr = z + unit * head_dim;
#pragma unroll
    for (int i = 0; i < NG_PER; i++) {
        v[i] = i < per ? xr[lane + 32 * i] : 0.0f;
        g[i] = i < per ? zr[lane + 32 * i] : 0.0f;
    }
    float ss = 0.0f;
#pragma unroll
    for (int i = 0; i < NG_PER; i++)
        if (i < per)
            ss += v[i] * v[i];
    ss = warp_sum(ss);
    const float inv = 1.0f / sqrtf(ss / (float)head_dim + eps);
#pragma unroll
    for (int i = 0; i < NG_PER; i++)
        if (i < per) {
            const float nv = nw[i] * (v[i] * inv);
            xr[lane + 32 * i] = g[i] / (1.0f + expf(-g[i])) * nv;
        }
}
