/* attention.cu: paged attention with extra keys, causal/window masks, GQA,
 * over f32 or bf16 pages and any head_dim up to 512: the general path
 * (attention_tc.cu is the fast one for bf16 pages and head_dim 16..128).
 *
 * One block of 128 threads per (row, head); grid (n_rows, n_heads). The
 * visible keys are the paged positions [lo, hi) (through the ring page
 * table) then the extra rows, each range first clipped by the masks (the
 * same key set as the CPU's per-key tests). Keys are taken in tiles of 128:
 * thread t scores key t of the tile (its own K row, 16-byte loads), the
 * block finds the tile max and the sum of exponentials, and each thread
 * then accumulates its head dimensions over the tile's V rows (coalesced).
 * Online softmax across tiles in f32, as in the reference. With bf16
 * pages the extra keys are rounded to bf16 as they are read, as the CPU
 * reference does. head_dim <= 512 (4 dims per thread). */
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
                                    int *eflag, int *ehost)
{
    pdl_trigger();
    pdl_wait();
    __shared__ float qs[AT_MAX_D];
    __shared__ float ps[AT_TILE];
    __shared__ const void *vp[AT_TILE];
    __shared__ bool vx[AT_TILE];
    __shared__ float scratch[32];

    const int i = blockIdx.x, h = blockIdx.y, tid = threadIdx.x;
    const int kvh = h / (n_heads / n_kv_heads);
    const i64 kv_row = (i64)n_kv_heads * D;
    const int seq = row_seq[i];
    const int *si = seq_info + (i64)seq * DFLASH_SEQ_INFO_LEN;
    const int qp = q_pos[i];

    const float *qr = q + ((i64)i * n_heads + h) * D;
    for (int d = tid; d < D; d += AT_THREADS)
        qs[d] = qr[d];

    /* Clip both key ranges by the masks: causal keeps key_pos <= qp, the
     * window keeps key_pos > qp - window. 64-bit to stay clear of overflow. */
    i64 lo = si[0], hi = si[1];
    const i64 pos0 = si[4];
    i64 elo = 0, ehi = si[3];
    if (causal) {
        hi = hi < (i64)qp + 1 ? hi : (i64)qp + 1;
        ehi = ehi < (i64)qp + 1 - pos0 ? ehi : (i64)qp + 1 - pos0;
    }
    if (window > 0) {
        const i64 first = (i64)qp - window + 1;
        lo = lo > first ? lo : first;
        elo = elo > first - pos0 ? elo : first - pos0;
    }
    const i64 n_paged = hi > lo ? hi - lo : 0;
    const i64 n_extra = (ehi > elo && k_extra) ? ehi - elo : 0;
    const i64 total = n_paged + n_extra;
    const i64 head_page = DFLASH_KV_PAGE * (i64)D; /* one head's positions of a page */

    float m = -__int_as_float(0x7f800000), l = 0.0f;
    float acc[AT_ACC];
#pragma unroll
    for (int a = 0; a < AT_ACC; a++)
        acc[a] = 0.0f;
    __syncthreads();

    for (i64 base = 0; base < total; base += AT_TILE) {
        const i64 u = base + tid;
        float s = -__int_as_float(0x7f800000);
        const void *kr = 0, *vr = 0;
        bool extra = false;
        if (u < total) {
            if (u < n_paged) {
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
            } else {
                const i64 row = si[2] + elo + (u - n_paged);
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
        }
        vp[tid] = kr ? vr : 0;
        vx[tid] = extra;
        const float tmax = block_max(s, scratch);
        const float m_new = fmaxf(m, tmax);
        /* All keys so far masked or missing: nothing to add yet. */
        if (m_new == -__int_as_float(0x7f800000)) {
            __syncthreads();
            continue;
        }
        const float p = kr ? expf(s - m_new) : 0.0f;
        const float corr = expf(m - m_new); /* 0 on the first tile (m = -inf) */
        ps[tid] = p;
        const float psum = block_sum(p, scratch); /* also orders ps/vp writes before the reads below */
        l = l * corr + psum;
        m = m_new;
        const int n_tile = total - base < AT_TILE ? (int)(total - base) : AT_TILE;
#pragma unroll
        for (int a = 0; a < AT_ACC; a++)
            acc[a] *= corr;
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
        __syncthreads(); /* ps and vp are rewritten by the next tile */
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
        int *eflag, int *ehost)                                                                               \
    {                                                                                                         \
        attention_body<P>(q, out, q_pos, row_seq, seq_info, pool, n_pages, n_layers, layer, page_tables,     \
                          pt_len, k_extra, v_extra, n_heads, n_kv_heads, D, scale, causal, window, vec, eflag, \
                          ehost);                                                                             \
    }

ATTENTION_KERNEL(f32, float)
ATTENTION_KERNEL(bf16, u16)
