/* norm.cu: add_rmsnorm (residual add fused with RMSNorm, one block per row)
 * and norm_rope (per-head RMSNorm then NeoX RoPE, one warp per (row, head)).
 * Arithmetic follows cpu_ops.c expression by expression; only the order of
 * the sum of squares differs (a tree instead of a running sum). */
#include "common.cuh"

/* grid n, block 256..1024: if delta, x += delta (written back); then
 * out = w * (x * inv), inv = 1 / sqrt(mean(x^2) + eps). */
extern "C" __global__ void dflash_add_rmsnorm(float *x, const float *delta, const void *w, int wdt, int dim,
                                              float eps, float *out)
{
    pdl_trigger();
    pdl_wait();
    __shared__ float scratch[32];
    float *xr = x + (i64)blockIdx.x * dim;
    const float *dr = delta ? delta + (i64)blockIdx.x * dim : 0;
    float ss = 0.0f;
    for (int j = threadIdx.x; j < dim; j += blockDim.x) {
        float v = xr[j];
        if (dr) {
            v += dr[j];
            xr[j] = v;
        }
        ss += v * v;
    }
    ss = block_sum(ss, scratch);
    const float inv = 1.0f / sqrtf(ss / (float)dim + eps);
    float *o = out + (i64)blockIdx.x * dim;
    for (int j = threadIdx.x; j < dim; j += blockDim.x)
        o[j] = load_elem(w, wdt, j) * (xr[j] * inv);
}

/* One (row, head) vector v [head_dim] by one warp: optional RMSNorm with
 * `norm`, then NeoX RoPE at position p, cos and sin times `attn`.
 * inv_freq [head_dim / 2] is the host's table, the one the CPU reference
 * uses, so the angles agree bit for bit before sin/cos. */
__forceinline__ void norm_rope_warp(float *v, const void *norm, int ndt, float p, int head_dim, float eps,
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
    const int half = head_dim / 2;
    for (int j = lane; j < half; j += 32) {
        float ang = p * inv_freq[j];
        float c = cosf(ang) * attn, s = sinf(ang) * attn;
        float a = v[j], b = v[j + half];
        v[j] = a * c - b * s;
        v[j + half] = b * c + a * s;
    }
}

/* block 128 = 4 warps, one (row, head) per warp. */
extern "C" __global__ void dflash_norm_rope(float *x, const void *norm, int ndt, const int *pos, int n, int n_heads,
                                            int head_dim, float eps, const float *inv_freq, float attn)
{
    pdl_trigger();
    pdl_wait();
    const i64 unit = (i64)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (unit >= (i64)n * n_heads)
        return;
    const int i = (int)(unit / n_heads);
    norm_rope_warp(x + unit * head_dim, norm, ndt, (float)pos[i], head_dim, eps, inv_freq, attn);
}

/* q [n, hq, head_dim] and k [n, hkv, head_dim] in one launch, each head as
 * dflash_norm_rope does it (q with qnorm, k with knorm). */
extern "C" __global__ void dflash_qk_norm_rope(float *q, const void *qnorm, float *k, const void *knorm, int ndt,
                                               const int *pos, int n, int hq, int hkv, int head_dim, float eps,
                                               const float *inv_freq, float attn)
{
    pdl_trigger();
    pdl_wait();
    const i64 unit = (i64)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (unit >= (i64)n * (hq + hkv))
        return;
    const int i = (int)(unit / (hq + hkv)), h = (int)(unit % (hq + hkv));
    const float p = (float)pos[i];
    if (h < hq)
        norm_rope_warp(q + ((i64)i * hq + h) * head_dim, qnorm, ndt, p, head_dim, eps, inv_freq, attn);
    else
        norm_rope_warp(k + ((i64)i * hkv + h - hq) * head_dim, knorm, ndt, p, head_dim, eps, inv_freq, attn);
}
