/* attention.cu: paged attention with extra keys, causal/window masks, GQA.
 *
 * One block of 128 threads per (row, head); grid (n_rows, n_heads). The
 * visible keys are the paged positions [lo, hi) (through the ring block
 * table) then the extra rows, each range first clipped by the masks (the
 * same key set as the CPU's per-key tests). Keys are taken in tiles of 128:
 * thread t scores key t of the tile (its own K row, 16-byte loads), the
 * block finds the tile max and the sum of exponentials, and each thread
 * then accumulates its head dimensions over the tile's V rows (coalesced).
 * Online softmax across tiles in f32, as in the reference.
 * head_dim <= 512 (4 dims per thread). */
#include "common.cuh"

#define AT_THREADS 128
#define AT_TILE 128
#define AT_MAX_D 512
#define AT_ACC (AT_MAX_D / AT_THREADS)

extern "C" __global__ void __launch_bounds__(AT_THREADS)
    dflash_attention(const float *q, float *out, const int *q_pos, const int *row_seq, const int *seq_info,
                     const float *pool, int n_blocks, int n_layers, int layer, const int *block_tables, int bt_len,
                     const float *k_extra, const float *v_extra, int n_heads, int n_kv_heads, int D, float scale,
                     int causal, int window, int vec, int *eflag, int *ehost)
{
    __shared__ float qs[AT_MAX_D];
    __shared__ float ps[AT_TILE];
    __shared__ const float *vp[AT_TILE];
    __shared__ float scratch[32];

    const int i = blockIdx.x, h = blockIdx.y, tid = threadIdx.x;
    const int kvh = h / (n_heads / n_kv_heads);
    const i64 kv_row = (i64)n_kv_heads * D;
    const int seq = row_seq[i];
    const int *si = seq_info + (i64)seq * 5;
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
    const i64 layer_stride = 2 * 16 * kv_row; /* K and V of one layer in one block */

    float m = -__int_as_float(0x7f800000), l = 0.0f;
    float acc[AT_ACC];
#pragma unroll
    for (int a = 0; a < AT_ACC; a++)
        acc[a] = 0.0f;
    __syncthreads();

    for (i64 base = 0; base < total; base += AT_TILE) {
        const i64 u = base + tid;
        float s = -__int_as_float(0x7f800000);
        const float *kr = 0, *vr = 0;
        if (u < total) {
            if (u < n_paged) {
                const i64 kp = lo + u;
                const int blk = block_tables[(i64)seq * bt_len + (kp / 16) % bt_len];
                if (blk < 0 || blk >= n_blocks) {
                    report_error(eflag, ehost, ERR_ATTN_BLOCK, (int)kp, blk, n_blocks);
                } else {
                    const float *lb = pool + ((i64)blk * n_layers + layer) * layer_stride;
                    kr = lb + (kp % 16) * kv_row + (i64)kvh * D;
                    vr = kr + 16 * kv_row;
                }
            } else {
                const i64 row = si[2] + elo + (u - n_paged);
                kr = k_extra + row * kv_row + (i64)kvh * D;
                vr = v_extra + row * kv_row + (i64)kvh * D;
            }
            if (kr) {
                float dot = 0.0f;
                if (vec) {
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
                    for (int d = 0; d < D; d++)
                        dot += qs[d] * kr[d];
                }
                s = dot * scale;
            }
        }
        vp[tid] = kr ? vr : 0;
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
            const float *v = vp[j];
            if (v) {
#pragma unroll
                for (int a = 0; a < AT_ACC; a++) {
                    const int d = tid + a * AT_THREADS;
                    if (d < D)
                        acc[a] += pj * v[d];
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
