/* norm_rope.cuh: a (row, head) vector's per-head RMSNorm and RoPE in a
 * warp's registers, its sum from a split-K GEMM's partials, and a k head's
 * K and V stored into the pages: norm.cu's q/k norm + RoPE launch runs
 * them, and attention_tc.cu runs the same functions before a decode's
 * attention (the same bits either way). */
#ifndef DFLASH_NORM_ROPE_CUH
#define DFLASH_NORM_ROPE_CUH

#include "common.cuh"

/* x[i] (i < PER) = element j = first + i * step (j < dim; else 0) of a
 * split-K GEMM's output whose sum was left to the caller, as gemm.cu's
 * epilogue computes it: the slices' partials at src + s * stride + j
 * added to 0.0f in slice order, then times scale[j] (fp8 row scales; NULL:
 * none), rounded apart as the GEMM's stored output is. B slices' loads
 * are requested together. */
template <int PER, int B>
__forceinline__ void split_sum(const float *src, i64 stride, int slices, const float *scale, int first, int step,
                               int dim, float *x)
{
#pragma unroll
    for (int i = 0; i < PER; i++)
        x[i] = 0.0f;
    for (int s0 = 0; s0 < slices; s0 += B) {
        float g[B][PER];
#pragma unroll
        for (int u = 0; u < B; u++)
#pragma unroll
            for (int i = 0; i < PER; i++) {
                const int j = first + i * step;
                g[u][i] = s0 + u < slices && j < dim ? __ldcg(src + (s0 + u) * stride + j) : 0.0f;
            }
#pragma unroll
        for (int u = 0; u < B; u++)
#pragma unroll
            for (int i = 0; i < PER; i++)
                if (s0 + u < slices)
                    x[i] += g[u][i];
    }
    if (scale)
#pragma unroll
        for (int i = 0; i < PER; i++) {
            const int j = first + i * step;
            if (j < dim)
                x[i] = __fmul_rn(x[i], scale[j]);
        }
}

/* Where a (row, head) vector comes from when a split-K GEMM left its sum
 * to this kernel (linear_qkv_norm_rope_store in cuda_gemm.c): `slices`
 * partials of element j at src + s * stride + j, added to 0.0f in slice
 * order, then times scale[j] (fp8 weights' row scales; NULL: none): the
 * bits gemm.cu's epilogue would have stored. src NULL: the vector is
 * where it is. */
struct head_src {
    const float *src, *scale;
    i64 stride;
    int slices;
};

/* x[i] = element lane + 32 i of the vector (i < PER), 32 loads a lane in
 * flight. */
template <int PER> __forceinline__ void head_sum(const head_src &hs, float *x)
{
    split_sum<PER, PER >= 8 ? 4 : 8>(hs.src, hs.stride, hs.slices, hs.scale, threadIdx.x & 31, 32, 32 * PER, x);
}

/* The same for head_dim = 32 PER, PER even (64, 128, 192, 256), with the
 * vector in registers: lane holds elements j = lane + 32 i, and the RoPE
 * partner j + head_dim / 2 of each of its first PER / 2 is its own element
 * i + PER / 2, so the rotation needs no exchange between lanes and the
 * vector is read once and written once. Everything but the vector is
 * ready before the wait on the previous kernel (nr_consts): the norm
 * weights and frequencies are never written, and the row's position is a
 * forward input (uploaded before the forward's first kernel, which no
 * kernel of it overlaps), so its cosines and sines are computed while the
 * GEMM before still runs. Same operations in the same order as
 * norm_rope_warp: the same bits. */
template <int PER> struct nr_consts {
    float nw[PER], cs[PER / 2], sn[PER / 2];
};

template <int PER>
__forceinline__ nr_consts<PER> nr_load(const void *norm, int ndt, const float *inv_freq, float p, float attn)
{
    const int lane = threadIdx.x & 31;
    nr_consts<PER> c;
#pragma unroll
    for (int i = 0; i < PER; i++)
        c.nw[i] = norm ? load_elem(norm, ndt, lane + 32 * i) : 1.0f;
#pragma unroll
    for (int i = 0; i < PER / 2; i++) {
        const float ang = p * inv_freq[lane + 32 * i];
        c.cs[i] = cosf(ang) * attn;
        c.sn[i] = sinf(ang) * attn;
    }
    return c;
}

/* x (this lane's elements) normed and rotated by c's angles, in place. */
template <int PER> __forceinline__ void nr_math(float *x, const nr_consts<PER> &c, bool norm, float eps)
{
    if (norm) {
        float ss = 0.0f;
#pragma unroll
        for (int i = 0; i < PER; i++)
            ss += x[i] * x[i];
        ss = warp_sum(ss);
        const float inv = 1.0f / sqrtf(ss / (float)(32 * PER) + eps);
#pragma unroll
        for (int i = 0; i < PER; i++)
            x[i] = c.nw[i] * (x[i] * inv);
    }
#pragma unroll
    for (int i = 0; i < PER / 2; i++) {
        const float a = x[i], b = x[i + PER / 2];
        x[i] = a * c.cs[i] - b * c.sn[i];
        x[i + PER / 2] = b * c.cs[i] + a * c.sn[i];
    }
}

template <int PER>
__forceinline__ void norm_rope_regs(float *v, const head_src &hs, const void *norm, int ndt, const int *pos_of_row,
                                    float eps, const float *inv_freq, float attn)
{
    const int lane = threadIdx.x & 31;
    const nr_consts<PER> c = nr_load<PER>(norm, ndt, inv_freq, (float)*pos_of_row, attn);
    pdl_wait();
    float x[PER];
    if (hs.src)
        head_sum<PER>(hs, x);
    else
#pragma unroll
        for (int i = 0; i < PER; i++)
            x[i] = v[lane + 32 * i];
    nr_math<PER>(x, c, norm != nullptr, eps);
#pragma unroll
    for (int i = 0; i < PER; i++)
        v[lane + 32 * i] = x[i];
}

/* Where dflash_qk_norm_rope also stores the rows' K and V (pool null:
 * nowhere); cuda_internal.h mirrors it. */
struct qk_store {
    void *pool;              /* [n_pages][n_layers][K, V][hkv][DFLASH_KV_PAGE][head_dim], f32 or bf16 */
    const int *page_tables;  /* [n_seqs, pt_len] */
    const int *row_seq;      /* [n] */
    const float *v;          /* [n, hkv, head_dim] */
    int *eflag, *ehost;
    int bf16, n_pages, n_layers, layer, pt_len;
};
static_assert(sizeof(qk_store) == 72, "mirrored by qk_store in cuda_internal.h");

/* Where dflash_qk_norm_rope reads q, k and v when the q/k/v GEMM left its
 * split-K sum to it (ws null: they are in q, k and st.v); cuda_internal.h
 * mirrors it. Row i's partial of slice s of column c (q's, then k's from
 * off_k, then v's from off_v) at ws + s * stride + i * ld + c. v: where
 * v's rows go (st.v, when K and V are stored, is the same buffer). */
struct qk_parts {
    const float *ws;
    const float *scales[3]; /* q, k, v fp8 row scales, or null */
    float *v;
    i64 stride, ld, off_k, off_v;
    int slices;
};
static_assert(sizeof(qk_parts) == 80, "mirrored by qk_parts in cuda_internal.h");

/* A k head's warp in dflash_qk_norm_rope, head_dim = 32 PER: k normed and
 * rotated as norm_rope_regs does it (nr_math: the same bits), its v head
 * summed from the GEMM's partials (vs.src; into v_out) or read where the
 * GEMM stored it (v_in), and both stored into the page as
 * dflash_kv_write stores them (st.pool) from registers. The position,
 * the row's page and the rotation's factors are found before the wait
 * (forward inputs, as in nr_load), and k's and v's partials requested
 * together after it, so the warp pays one round trip to L2 between the
 * wait and its stores. */
template <int PER>
__forceinline__ void kv_head_regs(float *k, const head_src &hs, const head_src &vs, float *v_out, const float *v_in,
                                  const void *norm, int ndt, const int *pos, int i, float eps, const float *inv_freq,
                                  float attn, const qk_store &st, int kh, int hkv)
{
    const int lane = threadIdx.x & 31;
    /* the position, the row's sequence and its page are forward inputs
     * (see nr_consts): found before the wait */
    const int p = pos[i];
    const int blk = st.pool ? kv_page_of(st.page_tables, st.pt_len, st.row_seq + i, p) : 0;
    const nr_consts<PER> c = nr_load<PER>(norm, ndt, inv_freq, (float)p, attn);
    pdl_wait();
    float x[PER], y[PER];
#pragma unroll
    for (int e = 0; e < PER; e++) {
        x[e] = hs.src ? 0.0f : k[lane + 32 * e];
        y[e] = vs.src ? 0.0f : v_in ? v_in[lane + 32 * e] : 0.0f;
    }
    /* split_sum's order (slice order from 0.0f, then the scale), k's and
     * v's loads of a batch in flight together */
    constexpr int B = PER >= 8 ? 2 : 4;
    const int slices = hs.src ? hs.slices : vs.src ? vs.slices : 0;
    for (int s0 = 0; s0 < slices; s0 += B) {
        float gk[B][PER], gv[B][PER];
#pragma unroll
        for (int u = 0; u < B; u++)
#pragma unroll
            for (int e = 0; e < PER; e++) {
                const bool in = s0 + u < slices;
                gk[u][e] = in && hs.src ? __ldcg(hs.src + (s0 + u) * hs.stride + lane + 32 * e) : 0.0f;
                gv[u][e] = in && vs.src ? __ldcg(vs.src + (s0 + u) * vs.stride + lane + 32 * e) : 0.0f;
            }
#pragma unroll
        for (int u = 0; u < B; u++)
#pragma unroll
            for (int e = 0; e < PER; e++)
                if (s0 + u < slices) {
                    if (hs.src)
                        x[e] += gk[u][e];
                    if (vs.src)
                        y[e] += gv[u][e];
                }
    }
#pragma unroll
    for (int e = 0; e < PER; e++) {
        if (hs.src && hs.scale)
            x[e] = __fmul_rn(x[e], hs.scale[lane + 32 * e]);
        if (vs.src && vs.scale)
            y[e] = __fmul_rn(y[e], vs.scale[lane + 32 * e]);
    }
    nr_math<PER>(x, c, norm != nullptr, eps);
#pragma unroll
    for (int e = 0; e < PER; e++) {
        k[lane + 32 * e] = x[e];
        if (vs.src)
            v_out[lane + 32 * e] = y[e];
    }
    if (!st.pool)
        return;
    if (blk < 0 || blk >= st.n_pages) {
        if (lane == 0)
            report_error(st.eflag, st.ehost, ERR_KV_WRITE_PAGE, p, blk, st.n_pages);
        return;
    }
    const i64 dk = kv_row_at(blk, st.n_layers, st.layer, 0, hkv, kh, p, 32 * PER);
    const i64 dv = kv_row_at(blk, st.n_layers, st.layer, 1, hkv, kh, p, 32 * PER);
#pragma unroll
    for (int e = 0; e < PER; e++) {
        kv_store_elem(st.pool, st.bf16, dk + lane + 32 * e, x[e]);
        kv_store_elem(st.pool, st.bf16, dv + lane + 32 * e, y[e]);
    }
}

#endif
