/* elementwise.cu: the memory-moving ops: embed (table row gather, widened to
 * f32), add, add_bias, swiglu, copy_rows, copy_ids, gather_sum (a weighted sum of gathered
 * rows) and kv_write (rows into paged KV pages).
 * Each is a straight copy or a per-element function, so they match the CPU
 * reference exactly (swiglu within expf's rounding). */
#include "common.cuh"

/* grid (n, column chunks): out[i, c] = table[ids[i], c]. An id outside the
 * table is reported and its row left unwritten. */
extern "C" __global__ void dflash_embed(const void *table, int dt, i64 rows, i64 cols, const int *ids, float *out,
                                        int *eflag, int *ehost)
{
    pdl_trigger();
    pdl_wait();
    const int i = blockIdx.x;
    const int id = ids[i];
    if (id < 0 || id >= rows) {
        if (threadIdx.x == 0 && blockIdx.y == 0)
            report_error(eflag, ehost, ERR_EMBED_ID, i, id, (int)rows);
        return;
    }
    for (i64 c = (i64)blockIdx.y * blockDim.x + threadIdx.x; c < cols; c += (i64)gridDim.y * blockDim.x)
        out[(i64)i * cols + c] = load_elem(table, dt, (i64)id * cols + c);
}

/* x += delta; vec: count % 4 == 0 and both 16-byte aligned. */
extern "C" __global__ void dflash_add(float *x, const float *delta, i64 count, int vec)
{
    pdl_trigger();
    pdl_wait();
    const i64 stride = (i64)gridDim.x * blockDim.x;
    i64 t = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (vec) {
        float4 *x4 = (float4 *)x;
        const float4 *d4 = (const float4 *)delta;
        for (; t < count / 4; t += stride) {
            float4 a = x4[t], b = d4[t];
            a.x += b.x;
            a.y += b.y;
            a.z += b.z;
            a.w += b.w;
            x4[t] = a;
        }
    } else {
        for (; t < count; t += stride)
            x[t] += delta[t];
    }
}

/* grid (n, column chunks): x[i, c] += b[c] (b widened from its dtype). */
extern "C" __global__ void dflash_add_bias(float *x, const void *b, int dt, i64 cols)
{
    pdl_trigger();
    pdl_wait();
    const i64 i = blockIdx.x;
    for (i64 c = (i64)blockIdx.y * blockDim.x + threadIdx.x; c < cols; c += (i64)gridDim.y * blockDim.x)
        x[i * cols + c] += load_elem(b, dt, c);
}

__forceinline__ float silu_mul(float g, float u) { return g / (1.0f + expf(-g)) * u; }

/* out = silu(gate) * up */
extern "C" __global__ void dflash_swiglu(const float *gate, const float *up, i64 count, float *out, int vec)
{
    pdl_trigger();
    pdl_wait();
    const i64 stride = (i64)gridDim.x * blockDim.x;
    i64 t = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (vec) {
        for (; t < count / 4; t += stride) {
            float4 g = ((const float4 *)gate)[t], u = ((const float4 *)up)[t], o;
            o.x = silu_mul(g.x, u.x);
            o.y = silu_mul(g.y, u.y);
            o.z = silu_mul(g.z, u.z);
            o.w = silu_mul(g.w, u.w);
            ((float4 *)out)[t] = o;
        }
    } else {
        for (; t < count; t += stride)
            out[t] = silu_mul(gate[t], up[t]);
    }
}

/* grid (n, column chunks): dst[i * dst_stride + c] = src[idx[i] * src_stride + c];
 * vec: cols and both strides multiples of 4, both 16-byte aligned. */
extern "C" __global__ void dflash_copy_rows(float *dst, i64 dst_stride, const float *src, i64 src_stride,
                                            const int *idx, i64 cols, int vec)
{
    pdl_trigger();
    pdl_wait();
    const int i = blockIdx.x;
    const i64 r = idx ? (i64)idx[i] : (i64)i;
    const float *s = src + r * src_stride;
    float *d = dst + (i64)i * dst_stride;
    const i64 step = (i64)gridDim.y * blockDim.x;
    i64 c = (i64)blockIdx.y * blockDim.x + threadIdx.x;
    if (vec) {
        for (; c < cols / 4; c += step)
            ((float4 *)d)[c] = ((const float4 *)s)[c];
    } else {
        for (; c < cols; c += step)
            d[c] = s[c];
    }
}

/* 1-D grid over n x cols ids: dst[i * dst_stride + c] = src[i * src_stride + c]. */
extern "C" __global__ void dflash_copy_ids(int *dst, i64 dst_stride, const int *src, i64 src_stride, int n, int cols)
{
    pdl_trigger();
    pdl_wait();
    const i64 e = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (e < (i64)n * cols)
        dst[e / cols * dst_stride + e % cols] = src[e / cols * src_stride + e % cols];
}

/* grid (n, column chunks): out[i, c] = sum over j < k, in j order, of
 * w[i * k + j] * src[idx[i * k + j] * cols + c], the product rounded before
 * the add (__fmul_rn / __fadd_rn are never fused), as the CPU computes it.
 * Eight rows' values are requested together before they are added (the
 * sum is a chain of dependent loads otherwise). */
#define GS_BATCH 8
extern "C" __global__ void dflash_gather_sum(float *out, const float *src, const int *idx, const float *w, int k,
                                             i64 cols)
{
    pdl_trigger();
    pdl_wait();
    const int i = blockIdx.x;
    const int *ix = idx + (i64)i * k;
    const float *wi = w + (i64)i * k;
    for (i64 c = (i64)blockIdx.y * blockDim.x + threadIdx.x; c < cols; c += (i64)gridDim.y * blockDim.x) {
        float acc = 0.0f;
        for (int j0 = 0; j0 < k; j0 += GS_BATCH) {
            float v[GS_BATCH], wv[GS_BATCH];
#pragma unroll
            for (int u = 0; u < GS_BATCH; u++) {
                const bool in = j0 + u < k;
                wv[u] = in ? wi[j0 + u] : 0.0f;
                v[u] = in ? src[(i64)ix[j0 + u] * cols + c] : 0.0f;
            }
#pragma unroll
            for (int u = 0; u < GS_BATCH; u++)
                if (j0 + u < k)
                    acc = __fadd_rn(acc, __fmul_rn(wv[u], v[u]));
        }
        out[(i64)i * cols + c] = acc;
    }
}

/* grid (n, 2): row i's K (y = 0) or V (y = 1) into its paged slot, as f32
 * or rounded to bf16 (bf16 != 0). The layout is
 * [n_pages][n_layers][2][n_kv_heads][DFLASH_KV_PAGE][head_dim]
 * (backend.h). A position that maps outside the pool is reported and not
 * written. */
extern "C" __global__ void dflash_kv_write(void *pool, int bf16, int n_pages, int n_layers, int layer,
                                           int n_kv_heads, int head_dim, const int *page_tables, int pt_len,
                                           const int *row_seq, const int *pos, const float *k, const float *v,
                                           int *eflag, int *ehost)
{
    pdl_trigger();
    pdl_wait();
    const int i = blockIdx.x, which = blockIdx.y;
    const int p = pos[i];
    const int blk = kv_page_of(page_tables, pt_len, row_seq + i, p);
    if (blk < 0 || blk >= n_pages) {
        if (threadIdx.x == 0 && which == 0)
            report_error(eflag, ehost, ERR_KV_WRITE_PAGE, p, blk, n_pages);
        return;
    }
    const int row_len = n_kv_heads * head_dim;
    const float *src = (which ? v : k) + (i64)i * row_len;
    for (int c = threadIdx.x; c < row_len; c += blockDim.x) {
        const i64 dst = kv_row_at(blk, n_layers, layer, which, n_kv_heads, c / head_dim, p, head_dim) + c % head_dim;
        kv_store_elem(pool, bf16, dst, src[c]);
    }
}
