/* attention.cu: paged attention with extra keys, causal/window masks, GQA,
 * over f32 or bf16 pages and any head_dim up to 512: the general path
 * (attention_tc.cu is the fast one for bf16 pages and head_dim 16..256).
 *
 * A sequence's keys are numbered u: its paged positions [lo, hi) (through
 * the ring page table), then its extra rows; they are split into tiles of
 * 128 (AT_TILE, equal to attention_tc.cu's AT_SPLIT, which
 * dflash_attn_combine splits by). One block of 128 threads per (row, head,
 * tile); grid (n_rows, n_heads, tiles of the longest sequence). Thread t
 * scores key t of the tile if the masks leave it visible (the same key set
 * as the CPU's per-key tests), the block finds the tile's max and sum of
 * exponentials, and each thread accumulates its head dimensions over the
 * tile's V rows (coalesced), in f32. A sequence of one tile writes the
 * output; of several, each block writes its partial (m, l, unnormalized
 * O) and dflash_attn_combine merges them in tile order. A tile a row
 * cannot see gives m = -inf, l = 0, O = 0, which the merge adds as exact
 * zeros: a row gets the same bits alone (decode) or in a longer verify.
 * With bf16 pages the extra keys are rounded to bf16 as they are read, as
 * the CPU reference does. head_dim <= 512 (4 dims per thread). */
#include "common.cuh"

#define AT_THREADS 128
#define AT_TILE 128
#define AT_MAX_D 512
#define AT_ACC (AT_MAX_D / AT_THREADS)

/* Key or value element d of a row: from a page of type P (float or u16
 * bf16) or, for extra rows (f32), rounded to the pages' type. */
template <typename P> __forceinline__ float kv_elem(const void *row, bool extra, int d)
{
    if (extra) {
        const float v = ((const float *)row)[d];
        return sizeof(P) == 2 ? round_bf16(v) : v;
    }
    return sizeof(P) == 2 ? bf16_to_f32(((const u16 *)row)[d]) : ((const float *)row)[d];
}

template <typename P>
__forceinline__ void attention_body(const float *q, float *out, const int *q_pos, const int *row_seq,
                                    const int *seq_info, const P *pool, int n_pages, int n_layers, int layer,
                                    const int *page_tables, int pt_len, const float *k_extra, const float *v_extra,
                                    int n_heads, int n_kv_heads, int D, float scale, int causal, int window, int vec,
                                    float *part_o, float *part_ml, int *eflag, int *ehost)
{
    pdl_trigger();
    pdl_wait();
    __shared__ float qs[AT_MAX_D];
    __shared__ float ps[AT_TILE];
    __shared__ const void *vp[AT_TILE];
    __shared__ bool vx[AT_TILE];
    __shared__ float scratch[32];

    const int i = blockIdx.x, h = blockIdx.y, split = blockIdx.z, tid = threadIdx.x;
    const int kvh = h / (n_heads / n_kv_heads);
    const i64 kv_row = (i64)n_kv_heads * D;
    const int seq = row_seq[i];
    const int *si = seq_info + (i64)seq * DFLASH_SEQ_INFO_LEN;
    const int qp = q_pos[i];
    /* The sequence's keys u = 0..T-1: paged positions [lo, hi), then its
     * extra rows; split s is the tile u in [s AT_TILE, (s + 1) AT_TILE). */
    const i64 lo = si[0], pos0 = si[4];
    const i64 n_paged = si[1] > si[0] ? (i64)si[1] - si[0] : 0, n_extra = k_extra ? si[3] : 0;
    const i64 T = n_paged + n_extra, n_splits = (T + AT_TILE - 1) / AT_TILE;
    if (n_splits > (i64)gridDim.z) { /* splits past the grid, partials past part_o's room */
        if (split == 0 && h == 0 && tid == 0)
            report_error(eflag, ehost, ERR_ATTN_KEYS, seq, (int)T, (int)gridDim.z);
        return;
    }
    if (split >= (n_splits > 0 ? n_splits : 1))
        return; /* the whole block: nothing of this row lies there */

    const float *qr = q + ((i64)i * n_heads + h) * D;
    for (int d = tid; d < D; d += AT_THREADS)
        qs[d] = qr[d];

    /* The visible keys, as u ranges: the masks clip the paged positions and
     * the extra rows (causal keeps key_pos <= qp, the window keeps key_pos >
     * qp - window). 64-bit to stay clear of overflow. */
    i64 plo = lo, phi = lo + n_paged, elo = 0, ehi = n_extra;
    if (causal) {
        phi = phi < (i64)qp + 1 ? phi : (i64)qp + 1;
        ehi = ehi < (i64)qp + 1 - pos0 ? ehi : (i64)qp + 1 - pos0;
    }
    if (window > 0) {
        const i64 first = (i64)qp - window + 1;
        plo = plo > first ? plo : first;
        elo = elo > first - pos0 ? elo : first - pos0;
    }
    const i64 up_lo = plo - lo, up_hi = phi - lo, ue_lo = n_paged + elo, ue_hi = n_paged + ehi;
    const i64 head_page = DFLASH_KV_PAGE * (i64)D; /* one head's positions of a page */

    float m = -__int_as_float(0x7f800000), l = 0.0f;
    float acc[AT_ACC];
#pragma unroll
    for (int a = 0; a < AT_ACC; a++)
        acc[a] = 0.0f;
    __syncthreads();

    const i64 base = (i64)split * AT_TILE;
    /* A tile no key of which is visible adds nothing: skipped (the block
     * agrees, so no barrier is left waiting). */
    const bool any = (up_hi > up_lo && up_lo < base + AT_TILE && up_hi > base) ||
                     (ue_hi > ue_lo && ue_lo < base + AT_TILE && ue_hi > base);
    if (any) {
        const i64 u = base + tid;
        float s = -__int_as_float(0x7f800000);
        const void *kr = 0, *vr = 0;
        bool extra = false;
        if (u >= up_lo && u < up_hi) {
            const i64 kp = lo + u;
            const int blk = page_tables[(i64)seq * pt_len + (kp / DFLASH_KV_PAGE) % pt_len];
            if (blk < 0 || blk >= n_pages) {
                report_error(eflag, ehost, ERR_ATTN_PAGE, (int)kp, blk, n_pages);
            } else {
                /* [n_pages][n_layers][2][n_kv_heads][DFLASH_KV_PAGE][D] */
                const P *hp = pool + (((i64)blk * n_layers + layer) * 2 * n_kv_heads + kvh) * head_page;
                kr = hp + (kp % DFLASH_KV_PAGE) * D;
                vr = hp + (i64)n_kv_heads * head_page + (kp % DFLASH_KV_PAGE) * D;
            }
        } else if (u >= ue_lo && u < ue_hi) {
            const i64 row = si[2] + (u - n_paged);
            kr = k_extra + row * kv_row + (i64)kvh * D;
            vr = v_extra + row * kv_row + (i64)kvh * D;
            extra = true;
        }
        if (kr) {
            float dot = 0.0f;
            if (vec && sizeof(P) == 4 && !extra) {
                const float4 *k4 = (const float4 *)kr;
                float d0 = 0.0f, d1 = 0.0f;
#pragma unroll 4
                for (int d = 0; d < D / 4; d++) {
                    const float4 kv = k4[d];
                    d0 += qs[4 * d] * kv.x + qs[4 * d + 1] * kv.y;
                    d1 += qs[4 * d + 2] * kv.z + qs[4 * d + 3] * kv.w;
                }
                dot = d0 + d1;
            } else {
                float d0 = 0.0f, d1 = 0.0f;
                int d = 0;
                for (; d + 4 <= D; d += 4) {
                    d0 += qs[d] * kv_elem<P>(kr, extra, d) + qs[d + 1] * kv_elem<P>(kr, extra, d + 1);
                    d1 += qs[d + 2] * kv_elem<P>(kr, extra, d + 2) + qs[d + 3] * kv_elem<P>(kr, extra, d + 3);
                }
                dot = d0 + d1;
                for (; d < D; d++)
                    dot += qs[d] * kv_elem<P>(kr, extra, d);
            }
            s = dot * scale;
        }
        vp[tid] = kr ? vr : 0;
        vx[tid] = extra;
        m = block_max(s, scratch);
        /* every key of the tile behind a missing page: nothing to add */
        if (m != -__int_as_float(0x7f800000)) {
            const float p = kr ? expf(s - m) : 0.0f;
            ps[tid] = p;
            l = block_sum(p, scratch); /* also orders ps/vp writes before the reads below */
            const int n_tile = T - base < AT_TILE ? (int)(T - base) : AT_TILE;
#pragma unroll 4
            for (int j = 0; j < n_tile; j++) {
                const float pj = ps[j];
                const void *v = vp[j];
                const bool ve = vx[j];
                if (v) {
#pragma unroll
                    for (int a = 0; a < AT_ACC; a++) {
                        const int d = tid + a * AT_THREADS;
                        if (d < D)
                            acc[a] += pj * kv_elem<P>(v, ve, d);
                    }
                }
            }
        }
    }

    if (n_splits > 1) { /* a partial: dflash_attn_combine merges the splits */
        const i64 unit = ((i64)split * gridDim.x + i) * n_heads + h;
        float *op = part_o + unit * D;
#pragma unroll
        for (int a = 0; a < AT_ACC; a++) {
            const int d = tid + a * AT_THREADS;
            if (d < D)
                op[d] = acc[a];
        }
        if (tid == 0) {
            part_ml[unit * 2] = m;
            part_ml[unit * 2 + 1] = l;
        }
        return;
    }
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
    float *o = out + ((i64)i * n_heads + h) * D;
#pragma unroll
    for (int a = 0; a < AT_ACC; a++) {
        const int d = tid + a * AT_THREADS;
        if (d < D)
            o[d] = acc[a] * inv;
    }
}

#define ATTENTION_KERNEL(name, P)                                                                             \
    extern "C" __global__ void __launch_bounds__(AT_THREADS) dflash_attention_##name(                        \
        const float *q, float *out, const int *q_pos, const int *row_seq, const int *seq_info, const P *pool,  \
        int n_pages, int n_layers, int layer, const int *page_tables, int pt_len, const float *k_extra,      \
        const float *v_extra, int n_heads, int n_kv_heads, int D, float scale, int causal, int window, int vec,\
        float *part_o, float *part_ml, int *eflag, int *ehost)                                                \
    {                                                                                                         \
        attention_body<P>(q, out, q_pos, row_seq, seq_info, pool, n_pages, n_layers, layer, page_tables,     \
                          pt_len, k_extra, v_extra, n_heads, n_kv_heads, D, scale, causal, window, vec, part_o, \
                          part_ml, eflag, ehost);                                                             \
    }

ATTENTION_KERNEL(f32, float)
ATTENTION_KERNEL(bf16, u16)
