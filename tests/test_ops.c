/* test_ops.c: the CPU reference ops against naive double-precision
 * recomputations on random inputs (attention over pages + extra keys with
 * every mask mode, linear in every weight dtype, norms, RoPE, the weighted
 * row sum of a MoE layer and its summation order, a shared expert's gated
 * add, a Gated DeltaNet's gated norm), the MoE routing's
 * choices (with a shared expert too), a shared expert joined to the
 * routed ones against the same run apart, and the row-independence
 * property the speculative loop relies on. */
#include "harness.h"

#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "target/moe.h"

static dflash_backend *be;
static unsigned rng = 12345;

static float frand(void)
{
    rng = rng * 1103515245u + 12345u;
    return ((rng >> 8) & 0xffff) / 32768.0f - 1.0f;
}

/* p[i] = base + amp * frand() for i < n */
static void fill(float *p, int n, float base, float amp)
{
    for (int i = 0; i < n; i++)
        p[i] = base + amp * frand();
}

/* bytes of backend memory, zeroed (a KV pool) */
static void *zeroed(size_t bytes)
{
    void *p = NULL;
    CHECK_OK(be->ops->alloc(be, bytes, &p));
    if (p)
        memset(p, 0, bytes);
    return p;
}

static double rel_err(const float *a, const double *ref, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        if (a[i] != a[i])
            return INFINITY; /* NaN never passes */
        num += (a[i] - ref[i]) * (a[i] - ref[i]);
        den += ref[i] * ref[i];
    }
    return sqrt(num / (den > 0 ? den : 1));
}

static void test_linear_dtypes(void)
{
    enum { N = 5, IN = 37, OUT = 11 };
    float x[N * IN], w32[OUT * IN], out[N * OUT];
    uint16_t wb[OUT * IN];
    uint8_t w8[OUT * IN];
    float scales[OUT];
    double ref[N * OUT];
    for (int i = 0; i < N * IN; i++)
        x[i] = frand();
    for (int r = 0; r < OUT; r++) {
        scales[r] = 0.01f * (r + 1);
        for (int c = 0; c < IN; c++) {
            w32[r * IN + c] = frand();
            wb[r * IN + c] = dflash_f32_to_bf16(w32[r * IN + c]);
            w8[r * IN + c] = dflash_f32_to_fp8e4m3(w32[r * IN + c] * 100);
        }
    }
    const struct { dflash_dtype t; const void *d; const float *s; } cases[] = {
        { DFLASH_DTYPE_F32, w32, NULL }, { DFLASH_DTYPE_BF16, wb, NULL }, { DFLASH_DTYPE_F8_E4M3, w8, scales } };
    for (size_t k = 0; k < 3; k++) {
        dflash_weight w = { cases[k].t, OUT, IN, cases[k].d, cases[k].s, "w" };
        for (int i = 0; i < N; i++)
            for (int r = 0; r < OUT; r++) {
                double acc = 0;
                for (int c = 0; c < IN; c++) {
                    double wv = cases[k].t == DFLASH_DTYPE_F32    ? w32[r * IN + c]
                                : cases[k].t == DFLASH_DTYPE_BF16 ? dflash_bf16_to_f32(wb[r * IN + c])
                                                                  : dflash_fp8e4m3_to_f32(w8[r * IN + c]) * scales[r];
                    acc += x[i * IN + c] * wv;
                }
                ref[i * OUT + r] = acc;
            }
        for (int i = 0; i < N * OUT; i++)
            out[i] = NAN; /* poison */
        CHECK_OK(be->ops->linear(be, x, N, &w, out));
        double e = rel_err(out, ref, N * OUT);
        CHECKF(e < 1e-6, "dtype %s rel err %g", dflash_dtype_name(cases[k].t), e);
    }
    dflash_weight bad = { DFLASH_DTYPE_F8_E4M3, OUT, IN, w8, NULL, "proj" };
    CHECK_FAILS(be->ops->linear(be, x, N, &bad, out), DFLASH_ERR_UNSUPPORTED, "proj");
}

static void test_rmsnorm_and_rope(void)
{
    enum { N = 3, HEADS = 2, D = 8 };
    float x[N * HEADS * D], x0[N * HEADS * D], nw[D];
    int32_t pos[N] = { 0, 7, 300 };
    for (int i = 0; i < N * HEADS * D; i++)
        x0[i] = x[i] = frand();
    for (int i = 0; i < D; i++)
        nw[i] = 1.0f + 0.1f * frand();
    dflash_weight w = { DFLASH_DTYPE_F32, 1, D, nw, NULL, "qn" };
    dflash_rope rope;
    CHECK_OK(dflash_rope_default(10000.0, D, &rope));
    CHECK_OK(be->ops->norm_rope(be, x, &w, pos, N, HEADS, D, 1e-6f, &rope));
    double ref[N * HEADS * D];
    for (int i = 0; i < N; i++)
        for (int h = 0; h < HEADS; h++) {
            const float *v = x0 + (i * HEADS + h) * D;
            double ss = 0, n[D];
            for (int j = 0; j < D; j++)
                ss += (double)v[j] * v[j];
            for (int j = 0; j < D; j++)
                n[j] = nw[j] * v[j] / sqrt(ss / D + 1e-6);
            for (int j = 0; j < D / 2; j++) {
                double ang = pos[i] * pow(10000.0, -2.0 * j / D);
                ref[(i * HEADS + h) * D + j] = n[j] * cos(ang) - n[j + D / 2] * sin(ang);
                ref[(i * HEADS + h) * D + j + D / 2] = n[j + D / 2] * cos(ang) + n[j] * sin(ang);
            }
        }
    double e = rel_err(x, ref, N * HEADS * D);
    CHECKF(e < 1e-5, "rel err %g", e);
}

/* Dense reference attention for one sequence: keys at explicit positions. */
static void ref_attention(int n, int Hq, int Hkv, int D, const float *q, const int32_t *qpos, int nk,
                          const float *k, const float *v, const int32_t *kpos, int causal, int window, double *out)
{
    for (int i = 0; i < n; i++)
        for (int h = 0; h < Hq; h++) {
            int kh = h / (Hq / Hkv);
            double m = -INFINITY, s[nk];
            for (int t = 0; t < nk; t++) {
                int vis = !(causal && kpos[t] > qpos[i]) && !(window > 0 && qpos[i] - kpos[t] >= window);
                double d = 0;
                for (int j = 0; j < D; j++)
                    d += (double)q[(i * Hq + h) * D + j] * k[(t * Hkv + kh) * D + j];
                s[t] = vis ? d / sqrt(D) : -INFINITY;
                if (s[t] > m)
                    m = s[t];
            }
            double l = 0;
            for (int t = 0; t < nk; t++)
                l += s[t] == -INFINITY ? 0 : exp(s[t] - m);
            for (int j = 0; j < D; j++) {
                double acc = 0;
                for (int t = 0; t < nk; t++)
                    if (s[t] != -INFINITY)
                        acc += exp(s[t] - m) / l * v[(t * Hkv + kh) * D + j];
                out[(i * Hq + h) * D + j] = acc;
            }
        }
}

/* bf16: the pool keeps bf16 and extra keys are rounded to it, so the
 * reference sees every key and value rounded. */
static void check_attention(int causal, int window, int lo, dflash_dtype kv_dt, const int HQ, const int HKV)
{
    enum { D = 8, CTX = 37, NB = 5, B = 6, BT = 4 };
    const int row = HKV * D;
    dflash_kv_layout kv = { 8, 2, HKV, D, kv_dt, NULL };
    CHECK_OK(be->ops->alloc(be, (size_t)8 * 2 * 2 * DFLASH_KV_PAGE * row * dflash_dtype_size(kv_dt), &kv.data));
    /* Ring table of 4 slots over blocks 0..2 of positions (ctx 37 -> 3 blocks). */
    int32_t table[BT] = { 5, 2, 7, -1 };
    float kc[CTX * row], vc[CTX * row], kb[B * row], vb[B * row], q[B * HQ * D], out[B * HQ * D];
    int32_t ctx_pos[CTX], qpos[B], row_seq[B] = { 0 };
    for (int i = 0; i < CTX * row; i++) {
        kc[i] = frand();
        vc[i] = frand();
    }
    for (int i = 0; i < B * row; i++) {
        kb[i] = frand();
        vb[i] = frand();
    }
    for (int i = 0; i < B * HQ * D; i++)
        q[i] = frand();
    for (int i = 0; i < CTX; i++)
        ctx_pos[i] = i;
    for (int i = 0; i < B; i++)
        qpos[i] = CTX + i;
    int32_t zero_seq[CTX];
    memset(zero_seq, 0, sizeof zero_seq);
    CHECK_OK(be->ops->kv_write(be, &kv, 1, table, BT, zero_seq, ctx_pos, kc, vc, CTX));
    int32_t info[DFLASH_SEQ_INFO_LEN] = { lo, CTX, 0, B, CTX, 0, B };
    dflash_attn_args a = { .n_rows = B, .n_heads = HQ, .n_kv_heads = HKV, .head_dim = D,
                           .scale = 1.0f / sqrtf(D), .q = q, .out = out, .q_pos = qpos, .row_seq = row_seq,
                           .seq_info = info, .kv = &kv, .layer = 1, .page_tables = table, .pt_len = BT,
                           .k_extra = kb, .v_extra = vb, .causal = causal, .window = window };
    for (int i = 0; i < B * HQ * D; i++)
        out[i] = NAN;
    CHECK_OK(be->ops->attention(be, &a));
    /* dense keys: context [lo, CTX) then the block */
    int nk = CTX - lo + B;
    float k[nk * row], v[nk * row];
    int32_t kpos[nk];
    memcpy(k, kc + lo * row, (size_t)(CTX - lo) * row * sizeof(float));
    memcpy(v, vc + lo * row, (size_t)(CTX - lo) * row * sizeof(float));
    memcpy(k + (CTX - lo) * row, kb, sizeof kb);
    memcpy(v + (CTX - lo) * row, vb, sizeof vb);
    for (int t = 0; t < nk; t++)
        kpos[t] = lo + t;
    if (kv_dt == DFLASH_DTYPE_BF16)
        for (int i = 0; i < nk * row; i++) {
            k[i] = dflash_round_bf16(k[i]);
            v[i] = dflash_round_bf16(v[i]);
        }
    double ref[B * HQ * D];
    ref_attention(B, HQ, HKV, D, q, qpos, nk, k, v, kpos, causal, window, ref);
    double e = rel_err(out, ref, B * HQ * D);
    CHECKF(e < 1e-5, "causal %d window %d lo %d %s: rel err %g", causal, window, lo, dflash_dtype_name(kv_dt), e);
    /* Each row alone (its query, its position; the same keys) gives the
     * bits it got among all B rows. */
    for (int i = 0; i < B; i++) {
        float one[HQ * D];
        dflash_attn_args a1 = a;
        a1.n_rows = 1;
        a1.q = q + i * HQ * D;
        a1.q_pos = &qpos[i];
        a1.out = one;
        CHECK_OK(be->ops->attention(be, &a1));
        CHECKF(memcmp(one, out + i * HQ * D, sizeof one) == 0, "causal %d window %d lo %d %s: row %d differs alone",
               causal, window, lo, dflash_dtype_name(kv_dt), i);
    }
    be->ops->free(be, kv.data);
}

static void test_attention_modes(void)
{
    for (int b = 0; b < 2; b++) {
        dflash_dtype dt = b ? DFLASH_DTYPE_BF16 : DFLASH_DTYPE_F32;
        check_attention(0, 0, 0, dt, 4, 2);  /* drafter full layer: bidirectional */
        check_attention(1, 0, 0, dt, 4, 2);  /* causal */
        check_attention(1, 5, 0, dt, 4, 2);  /* sliding layer */
        check_attention(0, 0, 20, dt, 4, 2); /* context window cut mid-block */
    }
    /* More query heads per kv head than one CPU task holds (16): 20:1
     * (multi-query) and 36:2, split into head chunks. */
    check_attention(1, 0, 0, DFLASH_DTYPE_F32, 20, 1);
    check_attention(0, 0, 0, DFLASH_DTYPE_BF16, 36, 2);
}

/* qk_norm_rope_store: what the stage leaves (q, k, the pool) is exactly
 * what qk_norm_rope (or norm_rope on k alone) and then kv_write leave, in
 * both pool dtypes; without a destination the pool is not touched. */
static void test_qk_norm_rope_store(void)
{
    enum { N = 3, HQ = 4, HKV = 2, D = 8, BT = 2, NP = 4, NL = 2 };
    const int row = HKV * D;
    int32_t pos[N] = { 0, 17, 18 }, row_seq[N] = { 0, 0, 0 }, table[BT] = { 3, 1 };
    float q0[N * HQ * D], k0[N * row], v[N * row], qn[D], kn[D];
    fill(q0, N * HQ * D, 0.0f, 1.0f);
    fill(k0, N * row, 0.0f, 1.0f);
    fill(v, N * row, 0.0f, 1.0f);
    fill(qn, D, 1.0f, 0.1f);
    fill(kn, D, 1.0f, 0.1f);
    dflash_weight wq = { DFLASH_DTYPE_F32, 1, D, qn, NULL, "qn" }, wk = { DFLASH_DTYPE_F32, 1, D, kn, NULL, "kn" };
    dflash_rope rope;
    CHECK_OK(dflash_rope_default(10000.0, D, &rope));
    for (int bf = 0; bf < 2; bf++)
        for (int hq = 0; hq <= HQ; hq += HQ) {
            const dflash_dtype dt = bf ? DFLASH_DTYPE_BF16 : DFLASH_DTYPE_F32;
            const size_t pool_bytes = (size_t)NP * NL * 2 * row * DFLASH_KV_PAGE * dflash_dtype_size(dt);
            dflash_kv_layout kv_a = { NP, NL, HKV, D, dt, zeroed(pool_bytes) }, kv_b = kv_a;
            kv_b.data = zeroed(pool_bytes);
            float qa[N * HQ * D], ka[N * row], qb[N * HQ * D], kb[N * row];
            memcpy(qa, q0, sizeof qa);
            memcpy(qb, q0, sizeof qb);
            memcpy(ka, k0, sizeof ka);
            memcpy(kb, k0, sizeof kb);
            const dflash_kv_dest dst = { &kv_a, 1, table, BT, row_seq, v };
            CHECK_OK(dflash_be_qk_norm_rope_store(be, hq ? qa : NULL, hq ? &wq : NULL, hq, ka, &wk, HKV, pos, N, D,
                                                  1e-6f, &rope, &dst));
            if (hq)
                CHECK_OK(dflash_be_qk_norm_rope(be, qb, &wq, hq, kb, &wk, HKV, pos, N, D, 1e-6f, &rope));
            else
                CHECK_OK(be->ops->norm_rope(be, kb, &wk, pos, N, HKV, D, 1e-6f, &rope));
            CHECK_OK(be->ops->kv_write(be, &kv_b, 1, table, BT, row_seq, pos, kb, v, N));
            CHECKF(memcmp(ka, kb, sizeof ka) == 0 && memcmp(qa, qb, sizeof qa) == 0, "%s, %d q heads: q or k differ",
                   dflash_dtype_name(dt), hq);
            CHECKF(memcmp(kv_a.data, kv_b.data, pool_bytes) == 0, "%s, %d q heads: pools differ",
                   dflash_dtype_name(dt), hq);
            /* the rotation moved k, so the pool holds k as the stage left it */
            CHECK(memcmp(ka, k0, sizeof ka) != 0);
            /* no destination: the pool untouched */
            memset(kv_a.data, 0, pool_bytes);
            memcpy(qa, q0, sizeof qa);
            memcpy(ka, k0, sizeof ka);
            CHECK_OK(dflash_be_qk_norm_rope_store(be, qa, &wq, HQ, ka, &wk, HKV, pos, N, D, 1e-6f, &rope, NULL));
            const unsigned char *pa = kv_a.data;
            size_t nonzero = 0;
            for (size_t i = 0; i < pool_bytes; i++)
                nonzero += pa[i] != 0;
            CHECKF(nonzero == 0, "%s: no destination, yet %zu pool bytes written", dflash_dtype_name(dt), nonzero);
            be->ops->free(be, kv_a.data);
            be->ops->free(be, kv_b.data);
        }
}

/* A small layer's q/k/v stage inputs (f32 weights, q/k norms, RoPE) and
 * two zeroed pools, for the stage tests; the weights point into it, so it
 * is set up in place and not copied. */
enum { QF_N = 3, QF_K = 12, QF_HQ = 4, QF_HKV = 2, QF_D = 8, QF_BT = 2, QF_NP = 4, QF_NL = 2, QF_ROW = QF_HKV * QF_D };
typedef struct qkv_fixture {
    float x[QF_N * QF_K], wq[QF_HQ * QF_D * QF_K], wk[QF_ROW * QF_K], wv[QF_ROW * QF_K], qn[QF_D], kn[QF_D];
    dflash_weight w[3], nq, nk;
    dflash_rope rope;
    size_t pool_bytes;
    dflash_kv_layout kv_a, kv_b;
} qkv_fixture;

static void qkv_fixture_init(qkv_fixture *f)
{
    fill(f->x, QF_N * QF_K, 0.0f, 1.0f);
    fill(f->wq, QF_HQ * QF_D * QF_K, 0.0f, 1.0f);
    fill(f->wk, QF_ROW * QF_K, 0.0f, 1.0f);
    fill(f->wv, QF_ROW * QF_K, 0.0f, 1.0f);
    fill(f->qn, QF_D, 1.0f, 0.1f);
    fill(f->kn, QF_D, 1.0f, 0.1f);
    f->w[0] = (dflash_weight){ DFLASH_DTYPE_F32, QF_HQ * QF_D, QF_K, f->wq, NULL, "q_proj" };
    f->w[1] = (dflash_weight){ DFLASH_DTYPE_F32, QF_ROW, QF_K, f->wk, NULL, "k_proj" };
    f->w[2] = (dflash_weight){ DFLASH_DTYPE_F32, QF_ROW, QF_K, f->wv, NULL, "v_proj" };
    f->nq = (dflash_weight){ DFLASH_DTYPE_F32, 1, QF_D, f->qn, NULL, "qn" };
    f->nk = (dflash_weight){ DFLASH_DTYPE_F32, 1, QF_D, f->kn, NULL, "kn" };
    CHECK_OK(dflash_rope_default(10000.0, QF_D, &f->rope));
    f->pool_bytes = (size_t)QF_NP * QF_NL * 2 * QF_ROW * DFLASH_KV_PAGE * sizeof(float);
    f->kv_a = (dflash_kv_layout){ QF_NP, QF_NL, QF_HKV, QF_D, DFLASH_DTYPE_F32, zeroed(f->pool_bytes) };
    f->kv_b = f->kv_a;
    f->kv_b.data = zeroed(f->pool_bytes);
}

static void qkv_fixture_free(qkv_fixture *f)
{
    be->ops->free(be, f->kv_a.data);
    be->ops->free(be, f->kv_b.data);
}

/* qkv_norm_rope_store: q, k, v and the pool exactly what the three
 * linears and qk_norm_rope_store leave; weights whose rows are not the
 * heads', and a K/V destination storing V from another buffer, are
 * refused with messages naming them. */
static void test_qkv_norm_rope_store(void)
{
    qkv_fixture f;
    qkv_fixture_init(&f);
    int32_t pos[QF_N] = { 0, 17, 18 }, row_seq[QF_N] = { 0, 0, 0 }, table[QF_BT] = { 3, 1 };
    float qa[QF_N * QF_HQ * QF_D], ka[QF_N * QF_ROW], va[QF_N * QF_ROW];
    float qb[QF_N * QF_HQ * QF_D], kb[QF_N * QF_ROW], vb[QF_N * QF_ROW];
    const dflash_kv_dest dst_a = { &f.kv_a, 1, table, QF_BT, row_seq, va };
    const dflash_kv_dest dst_b = { &f.kv_b, 1, table, QF_BT, row_seq, vb };
    dflash_qkv_args a = { f.x, QF_N, f.w, qa, ka, va, &f.nq, &f.nk, QF_HQ, QF_HKV, QF_D, pos, 1e-6f, &f.rope, &dst_a };
    CHECK_OK(dflash_be_qkv_norm_rope_store(be, &a));
    CHECK_OK(be->ops->linear(be, f.x, QF_N, &f.w[0], qb));
    CHECK_OK(be->ops->linear(be, f.x, QF_N, &f.w[1], kb));
    CHECK_OK(be->ops->linear(be, f.x, QF_N, &f.w[2], vb));
    CHECK_OK(dflash_be_qk_norm_rope_store(be, qb, &f.nq, QF_HQ, kb, &f.nk, QF_HKV, pos, QF_N, QF_D, 1e-6f, &f.rope,
                                          &dst_b));
    CHECK(memcmp(qa, qb, sizeof qa) == 0 && memcmp(ka, kb, sizeof ka) == 0 && memcmp(va, vb, sizeof va) == 0);
    CHECK(memcmp(f.kv_a.data, f.kv_b.data, f.pool_bytes) == 0);
    a.n_kv_heads = 1;
    CHECK_FAILS(dflash_be_qkv_norm_rope_store(be, &a), DFLASH_ERR_SHAPE,
                "qkv_norm_rope_store: weights q_proj, k_proj, v_proj have 32, 16, 16 rows, the heads 32, 8, 8");
    a.n_kv_heads = QF_HKV;
    a.v = vb;
    CHECK_FAILS(dflash_be_qkv_norm_rope_store(be, &a), DFLASH_ERR_INVALID_ARG,
                "the K/V destination stores V from another buffer than the stage's v");
    qkv_fixture_free(&f);
}

/* qkv_attention: the stage then attention (the CPU's composition), bit for
 * bit; a backend's own op gets the call only with a K/V destination and
 * norms it can join, after the stage's shape checks. */
static int g_qkv_attention;
static dflash_status spy_qkv_attention(dflash_backend *b, const dflash_qkv_args *q, const dflash_attn_args *a)
{
    (void)b;
    g_qkv_attention++;
    DFLASH_TRY(dflash_be_qkv_norm_rope_store(be, q));
    return be->ops->attention(be, a);
}

static void test_qkv_attention(void)
{
    qkv_fixture f;
    qkv_fixture_init(&f);
    int32_t pos[QF_N] = { 16, 17, 18 }, row_seq[QF_N] = { 0, 0, 0 }, table[QF_BT] = { 3, 1 };
    const int32_t info[DFLASH_SEQ_INFO_LEN] = { 0, 19, 0, 0, 16, 0, QF_N };
    float qa[QF_N * QF_HQ * QF_D], ka[QF_N * QF_ROW], va[QF_N * QF_ROW], oa[QF_N * QF_HQ * QF_D];
    float qb[QF_N * QF_HQ * QF_D], kb[QF_N * QF_ROW], vb[QF_N * QF_ROW], ob[QF_N * QF_HQ * QF_D];
    const dflash_kv_dest dst_a = { &f.kv_a, 1, table, QF_BT, row_seq, va };
    const dflash_kv_dest dst_b = { &f.kv_b, 1, table, QF_BT, row_seq, vb };
    dflash_qkv_args q = { f.x, QF_N, f.w, qa, ka, va, &f.nq, &f.nk, QF_HQ, QF_HKV, QF_D, pos, 1e-6f, &f.rope, &dst_a };
    dflash_qkv_args qc = q;
    qc.q = qb, qc.k = kb, qc.v = vb, qc.dst = &dst_b;
    dflash_attn_args a = { .n_rows = QF_N, .n_heads = QF_HQ, .n_kv_heads = QF_HKV, .head_dim = QF_D, .scale = 0.3f,
                           .q = qa, .out = oa, .q_pos = pos, .row_seq = row_seq, .seq_info = info, .kv = &f.kv_a,
                           .layer = 1, .page_tables = table, .pt_len = QF_BT, .causal = 1, .n_seqs = 1,
                           .max_seq_rows = QF_N, .max_keys = 19 };
    dflash_attn_args ac = a;
    ac.q = qb, ac.out = ob, ac.kv = &f.kv_b;
    CHECK_OK(dflash_be_qkv_attention(be, &q, &a));
    CHECK_OK(dflash_be_qkv_norm_rope_store(be, &qc));
    CHECK_OK(be->ops->attention(be, &ac));
    CHECK(memcmp(oa, ob, sizeof oa) == 0 && memcmp(ka, kb, sizeof ka) == 0 && memcmp(va, vb, sizeof va) == 0);
    CHECK(memcmp(f.kv_a.data, f.kv_b.data, f.pool_bytes) == 0);

    dflash_backend_ops ops = *be->ops;
    ops.qkv_attention = spy_qkv_attention;
    dflash_backend spy = { &ops, be->ctx };
    g_qkv_attention = 0;
    CHECK_OK(dflash_be_qkv_attention(&spy, &q, &a));
    CHECK(g_qkv_attention == 1);
    q.dst = NULL; /* nothing to store: the composition */
    CHECK_OK(dflash_be_qkv_attention(&spy, &q, &a));
    CHECK(g_qkv_attention == 1);
    q.dst = &dst_a;
    q.q_norm = NULL; /* a k norm without its q norm: one launch cannot join them */
    CHECK_OK(dflash_be_qkv_attention(&spy, &q, &a));
    CHECK(g_qkv_attention == 1);
    q.q_norm = &f.nq;
    q.n_kv_heads = 1;
    CHECK_FAILS(dflash_be_qkv_attention(&spy, &q, &a), DFLASH_ERR_SHAPE,
                "qkv_norm_rope_store: weights q_proj, k_proj, v_proj have 32, 16, 16 rows, the heads 32, 8, 8");
    CHECK(g_qkv_attention == 1);
    qkv_fixture_free(&f);
}

/* A backend with the fused q/k ops (the CPU has none): each counts its
 * calls and computes what the composition would, on the CPU backend. */
static int g_fused_qk, g_fused_qk_store;
static dflash_status spy_qk_norm_rope(dflash_backend *b, float *q, const dflash_weight *q_norm, int n_q_heads,
                                      float *k, const dflash_weight *k_norm, int n_kv_heads, const int32_t *pos,
                                      int n, int head_dim, float eps, const dflash_rope *rope)
{
    (void)b;
    g_fused_qk++;
    DFLASH_TRY(be->ops->norm_rope(be, q, q_norm, pos, n, n_q_heads, head_dim, eps, rope));
    return be->ops->norm_rope(be, k, k_norm, pos, n, n_kv_heads, head_dim, eps, rope);
}
static dflash_status spy_qk_norm_rope_store(dflash_backend *b, float *q, const dflash_weight *q_norm, int n_q_heads,
                                            float *k, const dflash_weight *k_norm, int n_kv_heads,
                                            const int32_t *pos, int n, int head_dim, float eps,
                                            const dflash_rope *rope, const dflash_kv_dest *dst)
{
    (void)b;
    g_fused_qk_store++;
    return dflash_be_qk_norm_rope_store(be, q, q_norm, n_q_heads, k, k_norm, n_kv_heads, pos, n, head_dim, eps, rope,
                                        dst);
}

/* Which q/k norms one fused launch takes: both of one dtype, or none
 * (RoPE alone, a Llama), or k's alone without q heads; a lone q norm or
 * two dtypes go through the composition. */
static void test_qk_norm_rope_dispatch(void)
{
    enum { N = 2, HQ = 2, HKV = 1, D = 8, NP = 2, NL = 1 };
    dflash_backend_ops ops = *be->ops;
    ops.qk_norm_rope = spy_qk_norm_rope;
    ops.qk_norm_rope_store = spy_qk_norm_rope_store;
    dflash_backend spy = { &ops, be->ctx };
    int32_t pos[N] = { 3, 4 }, row_seq[N] = { 0, 0 }, table[1] = { 1 };
    float q[N * HQ * D], k[N * HKV * D], v[N * HKV * D], n32[D];
    uint16_t n16[D];
    for (int i = 0; i < D; i++) {
        n32[i] = 1.0f + 0.1f * frand();
        n16[i] = 0x3f80; /* bf16 1.0 */
    }
    for (int i = 0; i < N * HQ * D; i++)
        q[i] = frand();
    for (int i = 0; i < N * HKV * D; i++)
        k[i] = v[i] = frand();
    const dflash_weight w32 = { DFLASH_DTYPE_F32, 1, D, n32, NULL, "n32" };
    const dflash_weight w16 = { DFLASH_DTYPE_BF16, 1, D, n16, NULL, "n16" };
    dflash_rope rope;
    CHECK_OK(dflash_rope_default(10000.0, D, &rope));
    dflash_kv_layout kv = { NP, NL, HKV, D, DFLASH_DTYPE_F32, NULL };
    CHECK_OK(be->ops->alloc(be, (size_t)NP * NL * 2 * HKV * DFLASH_KV_PAGE * D * sizeof(float), &kv.data));
    const dflash_kv_dest dst = { &kv, 0, table, 1, row_seq, v };
    const struct {
        const dflash_weight *qn, *kn;
        int hq, fused;
    } cases[] = {
        { &w32, &w32, HQ, 1 }, { NULL, NULL, HQ, 1 }, { NULL, &w32, 0, 1 }, { NULL, NULL, 0, 1 },
        { &w32, NULL, HQ, 0 }, { NULL, &w32, HQ, 0 }, { &w32, &w16, HQ, 0 },
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
        for (int store = 0; store < 2; store++) {
            g_fused_qk = g_fused_qk_store = 0;
            CHECK_OK(dflash_be_qk_norm_rope_store(&spy, q, cases[c].qn, cases[c].hq, k, cases[c].kn, HKV, pos, N, D,
                                                  1e-6f, &rope, store ? &dst : NULL));
            const int fused = store ? g_fused_qk_store : g_fused_qk;
            CHECKF(fused == cases[c].fused && g_fused_qk + g_fused_qk_store == fused,
                   "case %zu, %s: fused calls %d/%d, expected %d", c, store ? "store" : "no store", g_fused_qk,
                   g_fused_qk_store, cases[c].fused);
        }
    be->ops->free(be, kv.data);
}

/* A row's linear/attention result must not depend on the batch it is in. */
static void test_linear_row_independent(void)
{
    enum { IN = 64, OUT = 33, N = 16 };
    float x[N * IN], out_all[N * OUT], out_one[OUT];
    uint16_t wb[OUT * IN];
    for (int i = 0; i < N * IN; i++)
        x[i] = frand();
    for (int i = 0; i < OUT * IN; i++)
        wb[i] = dflash_f32_to_bf16(frand());
    dflash_weight w = { DFLASH_DTYPE_BF16, OUT, IN, wb, NULL, "w" };
    CHECK_OK(be->ops->linear(be, x, N, &w, out_all));
    for (int i = 0; i < N; i++) {
        CHECK_OK(be->ops->linear(be, x + i * IN, 1, &w, out_one));
        CHECK(memcmp(out_one, out_all + i * OUT, sizeof out_one) == 0);
    }
}

static void test_argmax_ties_low_index(void)
{
    float x[6] = { 1, 3, 3, 2, -1, 3 };
    int32_t out;
    CHECK_OK(be->ops->argmax(be, x, 1, 6, &out));
    CHECK(out == 1);
}

/* gather_sum: random rows against a double recomputation, then the order
 * its contract fixes: ((0 + 1e8) + 1) + -1e8 is 0 in f32, where adding
 * in another order gives 1. */
static void test_gather_sum(void)
{
    enum { N = 5, K = 3, COLS = 37, SRC = 9 };
    float src[SRC * COLS], w[N * K], out[N * COLS];
    int32_t idx[N * K];
    double ref[N * COLS];
    for (int i = 0; i < SRC * COLS; i++)
        src[i] = frand();
    for (int i = 0; i < N * K; i++) {
        w[i] = frand();
        idx[i] = (int32_t)((i * 7 + 3) % SRC);
    }
    CHECK_OK(be->ops->gather_sum(be, out, src, idx, w, N, K, COLS));
    for (int i = 0; i < N; i++)
        for (int c = 0; c < COLS; c++) {
            double a = 0;
            for (int j = 0; j < K; j++)
                a += (double)w[i * K + j] * src[idx[i * K + j] * COLS + c];
            ref[i * COLS + c] = a;
        }
    CHECK(rel_err(out, ref, N * COLS) < 1e-6);
    const float big[3] = { 1e8f, 1.0f, -1e8f }, ones[3] = { 1, 1, 1 };
    const int32_t order[3] = { 0, 1, 2 }, other[3] = { 0, 2, 1 };
    float o = -1;
    CHECK_OK(be->ops->gather_sum(be, &o, big, order, ones, 1, 3, 1));
    CHECKF(o == 0.0f, "in j order the sum is 0, got %g", o);
    CHECK_OK(be->ops->gather_sum(be, &o, big, other, ones, 1, 3, 1));
    CHECKF(o == 1.0f, "in the other order the sum is 1, got %g", o);
}

/* linear_gated_add: out += sigmoid(gate[row]) * x W^T, against a naive
 * double recomputation; each row's own gate. With a routed sum (k terms
 * a row of src) out is that sum first, whatever it held. */
static void check_linear_gated_add(int k)
{
    enum { N = 4, IN = 19, OUT = 7, K_MAX = 3 };
    float x[N * IN], w32[OUT * IN], g[N], out[N * OUT], tmp[N * OUT];
    float src[N * K_MAX * OUT], pw[N * K_MAX];
    int32_t idx[N * K_MAX];
    double ref[N * OUT];
    for (int i = 0; i < N * IN; i++)
        x[i] = frand();
    for (int i = 0; i < OUT * IN; i++)
        w32[i] = frand();
    for (int i = 0; i < N; i++)
        g[i] = 3.0f * frand();
    for (int i = 0; i < N * OUT; i++)
        out[i] = frand();
    for (int i = 0; i < N * K_MAX * OUT; i++)
        src[i] = frand();
    for (int i = 0; i < N * K_MAX; i++) {
        pw[i] = frand();
        idx[i] = (i * 5 + 2) % (N * K_MAX); /* a permutation: 5 is prime to 12 */
    }
    for (int i = 0; i < N; i++)
        for (int r = 0; r < OUT; r++) {
            double acc = 0, base = k ? 0 : out[i * OUT + r];
            for (int c = 0; c < IN; c++)
                acc += (double)x[i * IN + c] * w32[r * IN + c];
            for (int j = 0; j < k; j++)
                base += (double)pw[i * k + j] * src[idx[i * k + j] * OUT + r];
            ref[i * OUT + r] = base + acc / (1.0 + exp(-(double)g[i]));
        }
    const dflash_weight w = { DFLASH_DTYPE_F32, OUT, IN, w32, NULL, "down" };
    const dflash_gather sum = { src, idx, pw, k };
    CHECK_OK(dflash_be_linear_gated_add(be, x, N, &w, g, tmp, out, k ? &sum : NULL));
    const double e = rel_err(out, ref, N * OUT);
    CHECKF(e < 1e-6, "k %d: rel err %g", k, e);
    const dflash_gather none = { src, idx, pw, 0 };
    CHECK_FAILS(dflash_be_linear_gated_add(be, x, N, &w, g, tmp, out, &none), DFLASH_ERR_INVALID_ARG,
                "linear_gated_add: a routed sum of 0 terms a row");
}

static void test_linear_gated_add(void)
{
    check_linear_gated_add(0);
    check_linear_gated_add(3);
}

/* gather_add_rmsnorm: x += the weighted sum of each row's gathered rows,
 * then out = rmsnorm(x) * w, against a naive double recomputation; a sum
 * of no terms is refused. */
static void test_gather_add_rmsnorm(void)
{
    enum { N = 3, D = 37, K = 4, SRC = 9 };
    float x[N * D], src[SRC * D], pw[N * K], nw[D], delta[N * D], out[N * D];
    int32_t idx[N * K];
    double rx[N * D], ro[N * D];
    for (int i = 0; i < N * D; i++)
        x[i] = 2.0f * frand();
    for (int i = 0; i < SRC * D; i++)
        src[i] = frand();
    for (int i = 0; i < N * K; i++) {
        pw[i] = frand();
        idx[i] = (i * 7 + 3) % SRC;
    }
    for (int i = 0; i < D; i++)
        nw[i] = 1.0f + 0.5f * frand();
    for (int i = 0; i < N; i++) {
        double ss = 0;
        for (int c = 0; c < D; c++) {
            double v = x[i * D + c];
            for (int j = 0; j < K; j++)
                v += (double)pw[i * K + j] * src[idx[i * K + j] * D + c];
            rx[i * D + c] = v;
            ss += v * v;
        }
        const double inv = 1.0 / sqrt(ss / D + 1e-6);
        for (int c = 0; c < D; c++)
            ro[i * D + c] = rx[i * D + c] * inv * nw[c];
    }
    const dflash_weight w = { DFLASH_DTYPE_F32, 1, D, nw, NULL, "norm" };
    const dflash_gather sum = { src, idx, pw, K };
    CHECK_OK(dflash_be_gather_add_rmsnorm(be, x, &sum, delta, &w, N, D, 1e-6f, out));
    const double ex = rel_err(x, rx, N * D), eo = rel_err(out, ro, N * D);
    CHECKF(ex < 1e-6 && eo < 1e-6, "rel err x %g, out %g", ex, eo);
    const dflash_gather none = { src, idx, pw, 0 };
    CHECK_FAILS(dflash_be_gather_add_rmsnorm(be, x, &none, delta, &w, N, D, 1e-6f, out), DFLASH_ERR_INVALID_ARG,
                "gather_add_rmsnorm: a weighted sum of 0 terms a row");
}

/* linear_add_rmsnorm: x += in W^T, then out = rmsnorm(x) * w, against a
 * naive double recomputation; a weight whose rows are not the residual
 * stream's width is refused, naming it. */
static void test_linear_add_rmsnorm(void)
{
    enum { N = 3, D = 37, K = 19 };
    float in[N * K], wl[D * K], x[N * D], nw[D], delta[N * D], out[N * D];
    double rx[N * D], ro[N * D];
    fill(in, N * K, 0.0f, 1.0f);
    fill(wl, D * K, 0.0f, 1.0f);
    fill(x, N * D, 0.0f, 2.0f);
    fill(nw, D, 1.0f, 0.5f);
    for (int i = 0; i < N; i++) {
        double ss = 0;
        for (int c = 0; c < D; c++) {
            double v = 0;
            for (int k = 0; k < K; k++)
                v += (double)in[i * K + k] * wl[c * K + k];
            v = x[i * D + c] + (float)v;
            rx[i * D + c] = v;
            ss += v * v;
        }
        const double inv = 1.0 / sqrt(ss / D + 1e-6);
        for (int c = 0; c < D; c++)
            ro[i * D + c] = rx[i * D + c] * inv * nw[c];
    }
    const dflash_weight W = { DFLASH_DTYPE_F32, D, K, wl, NULL, "o_proj" };
    const dflash_weight w = { DFLASH_DTYPE_F32, 1, D, nw, NULL, "norm" };
    CHECK_OK(dflash_be_linear_add_rmsnorm(be, in, N, &W, x, delta, &w, D, 1e-6f, out));
    const double ex = rel_err(x, rx, N * D), eo = rel_err(out, ro, N * D);
    CHECKF(ex < 1e-5 && eo < 1e-5, "rel err x %g, out %g", ex, eo);
    const dflash_weight narrow = { DFLASH_DTYPE_F32, D - 1, K, wl, NULL, "o_proj" };
    CHECK_FAILS(dflash_be_linear_add_rmsnorm(be, in, N, &narrow, x, delta, &w, D, 1e-6f, out), DFLASH_ERR_SHAPE,
                "linear_add_rmsnorm: weight o_proj has 36 rows, the residual stream 37");
}

/* linear_group: each of the most weights a group takes equal to its own
 * linear; one more is refused, saying how many it takes. */
static void test_linear_group(void)
{
    enum { N = 3, IN = 11, G = DFLASH_GROUP_MAX_W, ROWS_MAX = 5 + G };
    float x[N * IN], w32[G][ROWS_MAX * IN], out[G][N * ROWS_MAX], one[N * ROWS_MAX];
    dflash_weight w[G + 1];
    float *outs[G + 1];
    for (int i = 0; i < N * IN; i++)
        x[i] = frand();
    for (int g = 0; g < G; g++) {
        for (int i = 0; i < ROWS_MAX * IN; i++)
            w32[g][i] = frand();
        w[g] = (dflash_weight){ DFLASH_DTYPE_F32, 5 + g, IN, w32[g], NULL, "w" };
        outs[g] = out[g];
    }
    CHECK_OK(dflash_be_linear_group(be, x, N, w, G, outs, DFLASH_ACT_NONE));
    for (int g = 0; g < G; g++) {
        CHECK_OK(be->ops->linear(be, x, N, &w[g], one));
        CHECKF(memcmp(one, out[g], (size_t)N * (size_t)w[g].rows * sizeof(float)) == 0, "weight %d of the group", g);
    }
    w[G] = w[0];
    outs[G] = one;
    CHECK_FAILS(dflash_be_linear_group(be, x, N, w, G + 1, outs, DFLASH_ACT_NONE), DFLASH_ERR_INVALID_ARG,
                "5 weights with activation 0 (1..4");
}

/* sigmoid_mul: a gate per row, a gate per element, and a gate per element
 * from longer rows (a gated attention's gates, interleaved with its
 * queries), each against a direct recomputation. */
static void test_sigmoid_mul(void)
{
    enum { N = 3, COLS = 5 };
    const int64_t g_cols[3] = { 1, COLS, 2 * COLS };
    for (int v = 0; v < 3; v++) {
        float x[N * COLS], want[N * COLS], g[N * 2 * COLS];
        for (int i = 0; i < N * COLS; i++)
            x[i] = frand();
        for (int i = 0; i < N * 2 * COLS; i++)
            g[i] = 4.0f * frand();
        for (int i = 0; i < N; i++)
            for (int c = 0; c < COLS; c++) {
                const float gv = g[i * g_cols[v] + (g_cols[v] == 1 ? 0 : c)];
                want[i * COLS + c] = x[i * COLS + c] * (1.0f / (1.0f + expf(-gv)));
            }
        CHECK_OK(be->ops->sigmoid_mul(be, x, g, N, COLS, g_cols[v]));
        CHECKF(memcmp(x, want, sizeof x) == 0, "gate rows of %lld", (long long)g_cols[v]);
    }
}

/* norm_gate: x := silu(z) * RMSNorm_head(x) * w per (row, head), against
 * a naive double recomputation. */
static void test_norm_gate(void)
{
    enum { N = 3, H = 2, D = 8 };
    float x[N * H * D], z[N * H * D], w32[D];
    double ref[N * H * D];
    const int32_t pos[N] = { 5, 6, 7 };
    for (int i = 0; i < N * H * D; i++) {
        x[i] = frand();
        z[i] = 2.0f * frand();
    }
    for (int j = 0; j < D; j++)
        w32[j] = 1.0f + 0.5f * frand();
    const float eps = 1e-6f;
    for (int u = 0; u < N * H; u++) {
        double ss = 0;
        for (int j = 0; j < D; j++)
            ss += (double)x[u * D + j] * x[u * D + j];
        const double inv = 1.0 / sqrt(ss / D + eps);
        for (int j = 0; j < D; j++) {
            const double zz = z[u * D + j];
            ref[u * D + j] = zz / (1.0 + exp(-zz)) * (w32[j] * (x[u * D + j] * inv));
        }
    }
    const dflash_weight w = { DFLASH_DTYPE_F32, 1, D, w32, NULL, "norm" };
    CHECK_OK(dflash_be_norm_gate(be, x, &w, z, pos, N, H, D, eps));
    const double e = rel_err(x, ref, N * H * D);
    CHECKF(e < 1e-6, "rel err %g", e);
}

/* add_bias: every row gets the bias, widened from each dtype; fp8 is
 * refused. */
static void test_add_bias(void)
{
    float x[2 * 3] = { 1, 2, 3, 4, 5, 6 };
    const float bf[3] = { 0.5f, -1.0f, 2.0f };
    uint16_t bb[3];
    for (int i = 0; i < 3; i++)
        bb[i] = dflash_f32_to_bf16(bf[i]); /* exact in bf16 */
    const dflash_weight b32 = { DFLASH_DTYPE_F32, 1, 3, bf, NULL, "b32" }, b16 = { DFLASH_DTYPE_BF16, 1, 3, bb, NULL,
                                                                                   "b16" };
    CHECK_OK(be->ops->add_bias(be, x, &b32, 2, 3));
    CHECK(x[0] == 1.5f && x[1] == 1.0f && x[2] == 5.0f && x[3] == 4.5f && x[4] == 4.0f && x[5] == 8.0f);
    CHECK_OK(be->ops->add_bias(be, x, &b16, 2, 3));
    CHECK(x[0] == 2.0f && x[2] == 7.0f && x[5] == 10.0f);
    CHECK_FAILS(be->ops->add_bias(be, x, &b32, 2, 4), DFLASH_ERR_SHAPE, "bias: b32 has 3 elements, rows have 4");
    const uint8_t b8[3] = { 0 };
    const float sc = 1;
    const dflash_weight f8 = { DFLASH_DTYPE_F8_E4M3, 1, 3, b8, &sc, "b8" };
    CHECK_FAILS(be->ops->add_bias(be, x, &f8, 2, 3), DFLASH_ERR_UNSUPPORTED, "bias: b8 is fp8");
}

/* The recurrent-state primitives on cases worked out by hand: a width-2
 * convolution reading the inputs of earlier calls by position, also from
 * a position taken back; a 1 x 1 delta rule over 70 rows, across a chunk
 * boundary, against the token-by-token recurrence in double, and equal to
 * itself bit for bit whatever calls the rows are split into and after
 * rows are taken back; their argument checks. */
static void test_recurrent_ops(void)
{
    /* conv: w = {0.5, 1}; x = 2, 3 at positions 0, 1, then 5 at 2, then 7 at 1 again */
    static float ring[DFLASH_REC_ROWS];
    float x[2] = { 2, 3 }, y[2];
    const float wv[2] = { 0.5f, 1.0f };
    const dflash_weight w = { DFLASH_DTYPE_F32, 1, 2, wv, NULL, "conv" };
    int32_t info[DFLASH_REC_INFO_LEN] = { 0, 2, 0, 0 };
    dflash_rec_args r = { 1, 2, info, ring, DFLASH_REC_ROWS };
    CHECK_OK(be->ops->conv_silu(be, &r, x, &w, 2, 1, 2, y));
    const float silu2 = 2.0f / (1.0f + expf(-2.0f)), silu4 = 4.0f / (1.0f + expf(-4.0f));
    CHECKF(y[0] == silu2 && y[1] == silu4, "conv: y %g %g, want %g %g", y[0], y[1], silu2, silu4);
    const float x5 = 5, x7 = 7, silu65 = 6.5f / (1.0f + expf(-6.5f)), silu8 = 8.0f / (1.0f + expf(-8.0f));
    info[1] = 1, info[2] = 2;
    CHECK_OK(be->ops->conv_silu(be, &r, &x5, &w, 1, 1, 2, y));
    CHECKF(y[0] == silu65, "conv at 2: %g, want %g", y[0], silu65);
    info[2] = 1;
    CHECK_OK(be->ops->conv_silu(be, &r, &x7, &w, 1, 1, 2, y));
    CHECKF(y[0] == silu8, "conv at 1 again: %g, want %g", y[0], silu8);

    /* delta rule, one key and one value dimension, 70 rows */
    enum { T = 70 };
    float yd[3 * T], a[T], b[T], o[T], o2[T];
    uint32_t seed = 12345;
    for (int t = 0; t < T; t++) {
        for (int c = 0; c < 3; c++) {
            seed = seed * 1664525u + 1013904223u;
            yd[3 * t + c] = (float)((double)(seed >> 8) / (1 << 24) * 4.0 - 2.0);
        }
        seed = seed * 1664525u + 1013904223u;
        a[t] = (float)((double)(seed >> 8) / (1 << 24) * 2.0 - 2.5);
        seed = seed * 1664525u + 1013904223u;
        b[t] = (float)((double)(seed >> 8) / (1 << 24) * 4.0 - 2.0);
    }
    const float alog = -0.5f, dtb = 0.1f;
    const dflash_weight A = { DFLASH_DTYPE_F32, 1, 1, &alog, NULL, "A_log" },
                        D = { DFLASH_DTYPE_F32, 1, 1, &dtb, NULL, "dt_bias" };
    const int64_t rec_size = dflash_delta_rec_size(1, 1, 1);
    float *rec = calloc((size_t)rec_size, sizeof(float));
    int32_t dinfo[DFLASH_REC_INFO_LEN] = { 0, T, 0, 0 };
    dflash_rec_args rd = { 1, T, dinfo, rec, rec_size };
    dflash_delta_args da = { T, 1, 1, 1, 1, yd, a, b, &A, &D, o };
    CHECK_OK(be->ops->delta_rule(be, &rd, &da));
    double st = 0, worst = 0;
    for (int t = 0; t < T; t++) {
        const double q = yd[3 * t] / sqrt((double)yd[3 * t] * yd[3 * t] + 1e-6),
                     k = yd[3 * t + 1] / sqrt((double)yd[3 * t + 1] * yd[3 * t + 1] + 1e-6), v = yd[3 * t + 2];
        const double beta = 1 / (1 + exp(-b[t])), decay = exp(-exp(alog) * log1p(exp(a[t] + dtb)));
        st *= decay;
        st += k * (beta * (v - st * k));
        worst = fmax(worst, fabs(o[t] - st * q));
    }
    CHECKF(worst < 1e-5, "delta rule vs the recurrence in double: %g", worst);
    /* the same rows in calls of 30, 36 and 4, then one by one: the same bits */
    const int splits[2][4] = { { 30, 36, 4, 0 }, { 1, 1, 1, 1 } };
    for (int v = 0; v < 2; v++) {
        memset(rec, 0xff, (size_t)rec_size * sizeof(float)); /* nothing may be read before it is written */
        int done = 0;
        for (int c = 0; done < T; c++) {
            const int n = splits[v][v ? 0 : c];
            dflash_rec_args rc = { 1, n, (int32_t[DFLASH_REC_INFO_LEN]){ 0, n, done, 0 }, rec, rec_size };
            dflash_delta_args dc = { n, 1, 1, 1, 1, yd + 3 * done, a + done, b + done, &A, &D, o2 + done };
            CHECK_OK(be->ops->delta_rule(be, &rc, &dc));
            done += n;
        }
        CHECKF(!memcmp(o, o2, sizeof o), "delta rule split %d: rows differ from one call", v);
    }
    /* rows 60..69 taken back (across the chunk start at 64), run on others, then again */
    float yx[3 * 10], ox[10];
    for (int i = 0; i < 30; i++)
        yx[i] = -yd[3 * 60 + i];
    dflash_rec_args rb10 = { 1, 10, (int32_t[DFLASH_REC_INFO_LEN]){ 0, 10, 60, 0 }, rec, rec_size };
    dflash_delta_args dx = { 10, 1, 1, 1, 1, yx, a + 60, b + 60, &A, &D, ox };
    CHECK_OK(be->ops->delta_rule(be, &rb10, &dx));
    dflash_delta_args dy = { 10, 1, 1, 1, 1, yd + 3 * 60, a + 60, b + 60, &A, &D, ox };
    CHECK_OK(be->ops->delta_rule(be, &rb10, &dy));
    CHECKF(!memcmp(ox, o + 60, sizeof ox), "delta rule: rows 60..69 again after others differ");

    /* argument checks */
    CHECK_FAILS(be->ops->conv_silu(be, &r, x, &w, 2, 1, 17, y), DFLASH_ERR_SHAPE, "conv_silu: weight conv is [1, 2]");
    const int32_t bad[DFLASH_REC_INFO_LEN] = { 1, 2, 0, 0 }; /* rows past the call's */
    dflash_rec_args rb = { 1, 2, bad, ring, DFLASH_REC_ROWS };
    CHECK_FAILS(be->ops->conv_silu(be, &rb, x, &w, 2, 1, 2, y), DFLASH_ERR_INVALID_ARG,
                "sequence 0 has rows [1, +2) of 2");
    rb.rec_stride = DFLASH_REC_ROWS - 1;
    CHECK_FAILS(be->ops->conv_silu(be, &rb, x, &w, 2, 1, 2, y), DFLASH_ERR_INVALID_ARG,
                "conv_silu: 1 sequences, records of 127 floats where this layer's take 128");
    da.n_k_heads = 2;
    CHECK_FAILS(be->ops->delta_rule(be, &rd, &da), DFLASH_ERR_SHAPE, "delta_rule: 2 key heads of 1");
    CHECK_FAILS(be->ops->sigmoid_mul(be, x, y, 1, 3, 2), DFLASH_ERR_SHAPE, "sigmoid_mul: 2 gate columns for 3");
    free(rec);
}

/* The routing of one row: softmax probabilities, the k largest (the lower
 * expert first on ties), renormalised or not, listed by expert. */
static void test_moe_route(void)
{
    const float logits[4] = { 0.5f, 2.0f, 1.0f, 2.0f };
    double z = exp(-1.5) + 1 + exp(-1.0) + 1;
    int32_t e[3];
    float p[3];
    dflash_moe_route_row(logits, 4, 2, 0, e, p);
    CHECK(e[0] == 1 && e[1] == 3);
    CHECK(fabs(p[0] - 1 / z) < 1e-6 && fabs(p[1] - 1 / z) < 1e-6);
    dflash_moe_route_row(logits, 4, 2, 1, e, p);
    CHECK(e[0] == 1 && e[1] == 3 && fabs(p[0] - 0.5) < 1e-6 && fabs(p[1] - 0.5) < 1e-6);
    dflash_moe_route_row(logits, 4, 3, 1, e, p);
    CHECK(e[0] == 1 && e[1] == 2 && e[2] == 3);
    double top = (2 + exp(-1.0)) / z;
    CHECK(fabs(p[1] - exp(-1.0) / z / top) < 1e-6 && fabs(p[0] - 1 / z / top) < 1e-6);
    /* a tie at the k-th place goes to the lower expert */
    const float tie[4] = { 3.0f, 1.0f, 1.0f, 0.0f };
    dflash_moe_route_row(tie, 4, 2, 0, e, p);
    CHECK(e[0] == 0 && e[1] == 1);
}

/* The routing r computed (n_entries entries, n_first offsets) equals
 * what the default composition (host copies between a download and an
 * upload) gives for the same arguments, bit for bit. */
static void check_route_on_host(const dflash_route_args *r, int n_entries, int n_first)
{
    dflash_backend_ops ops = *be->ops;
    ops.moe_route = NULL;
    dflash_backend plain = { &ops, be->ctx };
    float *prob = malloc((size_t)n_entries * sizeof *prob);
    int32_t *ints = malloc(((size_t)3 * n_entries + n_first) * sizeof *ints);
    dflash_route_args h = *r;
    h.prob = prob, h.expert = ints, h.src = ints + n_entries, h.slot = ints + 2 * n_entries;
    h.first = ints + 3 * n_entries;
    CHECK_OK(dflash_be_moe_route(&plain, &h));
    const size_t bytes = (size_t)n_entries * 4;
    CHECK(!memcmp(r->expert, h.expert, bytes) && !memcmp(r->prob, h.prob, bytes) &&
          !memcmp(r->first, h.first, (size_t)n_first * 4) && !memcmp(r->src, h.src, bytes) &&
          !memcmp(r->slot, h.slot, bytes));
    free(prob);
    free(ints);
}

/* The MoE stages as a backend without its own runs them: rows grouped by
 * expert (each expert's rows ascending, slot pointing back), and each
 * gathered row through its expert's weights equal, bit for bit, to that
 * row alone through linear_group; the argument checks. */
static void test_moe_stages(void)
{
    enum { N = 5, E = 4, K = 2, H = 8, I = 3 };
    float logits[N * E], prob[N * K];
    int32_t expert[N * K], first[E + 1], src[N * K], slot[N * K];
    for (int i = 0; i < N * E; i++)
        logits[i] = frand() * 3;
    const dflash_route_args r = { .n = N, .n_experts = E, .k = K, .norm_topk_prob = 1, .logits = logits,
                                  .expert = expert, .prob = prob, .first = first, .src = src, .slot = slot };
    CHECK_OK(dflash_be_moe_route(be, &r));
    CHECK(first[0] == 0 && first[E] == N * K);
    for (int row = 0; row < N; row++) {
        int32_t e1[K];
        float p1[K];
        dflash_moe_route_row(logits + row * E, E, K, 1, e1, p1);
        for (int j = 0; j < K; j++) {
            const int32_t at = slot[row * K + j];
            CHECK(expert[row * K + j] == e1[j] && prob[row * K + j] == p1[j]);
            CHECK(src[at] == row && at >= first[e1[j]] && at < first[e1[j] + 1]);
        }
    }
    for (int e = 0; e < E; e++)
        for (int at = first[e] + 1; at < first[e + 1]; at++)
            CHECK(src[at - 1] < src[at]);

    /* experts' gate and up with SwiGLU, then down */
    static uint16_t wd[E][3][I * H];
    dflash_weight w[E * 3];
    for (int e = 0; e < E; e++)
        for (int p = 0; p < 3; p++) {
            for (int i = 0; i < I * H; i++)
                wd[e][p][i] = dflash_f32_to_bf16(frand());
            w[e * 3 + p] = (dflash_weight){ DFLASH_DTYPE_BF16, p == 2 ? H : I, p == 2 ? I : H, wd[e][p], NULL, "w" };
        }
    float xg[N * K * H], g[N * K * I], u[N * K * I], y[N * K * H];
    for (int i = 0; i < N * K * H; i++)
        xg[i] = frand();
    dflash_experts_args a = { .n_experts = E, .n_w = 2, .w = w, .w_stride = 3, .per_row = K, .x = xg, .rows = N * K,
                              .max_rows = N, .first = first, .out = { g, u }, .act = DFLASH_ACT_SWIGLU };
    CHECK_OK(dflash_be_linear_experts(be, &a));
    a = (dflash_experts_args){ .n_experts = E, .n_w = 1, .w = w + 2, .w_stride = 3, .per_row = K, .x = g,
                               .rows = N * K, .max_rows = N, .first = first, .out = { y }, .act = DFLASH_ACT_NONE };
    CHECK_OK(dflash_be_linear_experts(be, &a));
    int same = 1;
    for (int e = 0; e < E; e++)
        for (int at = first[e]; at < first[e + 1]; at++) {
            float g1[I], u1[I], y1[H];
            float *const gu[2] = { g1, u1 };
            CHECK_OK(dflash_be_linear_group(be, xg + at * H, 1, &w[e * 3], 2, gu, DFLASH_ACT_SWIGLU));
            CHECK_OK(be->ops->linear(be, g1, 1, &w[e * 3 + 2], y1));
            same &= memcmp(g1, g + at * I, sizeof g1) == 0 && memcmp(y1, y + at * H, sizeof y1) == 0;
        }
    CHECK(same);

    /* the gate/up projection reading its rows from the source rows through
     * src (x_rows) equals the one over rows gathered beforehand */
    float x[N * H], scratch[N * K * H], xs[N * K * H], gs[N * K * I], us[N * K * I], gx[N * K * I], ux[N * K * I];
    for (int i = 0; i < N * H; i++)
        x[i] = frand();
    for (int at = 0; at < N * K; at++)
        memcpy(xs + at * H, x + src[at] * H, H * sizeof(float));
    a = (dflash_experts_args){ .n_experts = E, .n_w = 2, .w = w, .w_stride = 3, .per_row = K, .x = xs, .rows = N * K,
                               .max_rows = N, .first = first, .out = { gx, ux }, .act = DFLASH_ACT_SWIGLU };
    CHECK_OK(dflash_be_linear_experts(be, &a));
    a.x = scratch, a.x_src = x, a.x_rows = src, a.out[0] = gs, a.out[1] = us;
    CHECK_OK(dflash_be_linear_experts(be, &a));
    CHECK(!memcmp(gs, gx, sizeof gs));

    /* the default composition (a backend without the two stages: host
     * copies, per-expert launches) gives the same bits as the CPU's own */
    check_route_on_host(&r, N * K, E + 1);
    dflash_backend_ops ops = *be->ops;
    ops.linear_experts = NULL;
    dflash_backend plain = { &ops, be->ctx };
    float g2[N * K * I], u2[N * K * I], y2[N * K * H];
    dflash_experts_args a2 = { .n_experts = E, .n_w = 2, .w = w, .w_stride = 3, .per_row = K, .x = xg,
                               .rows = N * K, .max_rows = N, .first = first, .out = { g2, u2 },
                               .act = DFLASH_ACT_SWIGLU };
    CHECK_OK(dflash_be_linear_experts(&plain, &a2));
    a2 = (dflash_experts_args){ .n_experts = E, .n_w = 1, .w = w + 2, .w_stride = 3, .per_row = K, .x = g2,
                                .rows = N * K, .max_rows = N, .first = first, .out = { y2 }, .act = DFLASH_ACT_NONE };
    CHECK_OK(dflash_be_linear_experts(&plain, &a2));
    CHECK(!memcmp(g, g2, sizeof g) && !memcmp(y, y2, sizeof y));

    dflash_route_args bad = r;
    bad.k = E + 1;
    CHECK_FAILS(dflash_be_moe_route(be, &bad), DFLASH_ERR_INVALID_ARG, "moe_route: 5 rows, 4 experts, 5 per row");
    w[3 * 3 + 1].rows = I + 1; /* expert 3's up */
    a = (dflash_experts_args){ .n_experts = E, .n_w = 2, .w = w, .w_stride = 3, .per_row = K, .x = xg, .rows = N * K,
                               .max_rows = N, .first = first, .out = { g, u }, .act = DFLASH_ACT_SWIGLU };
    CHECK_FAILS(dflash_be_linear_experts(be, &a), DFLASH_ERR_SHAPE, "weight w is BF16 [4, 8], w is BF16 [3, 8]");
    a.act = DFLASH_ACT_NONE;
    CHECK_FAILS(dflash_be_linear_experts(be, &a), DFLASH_ERR_INVALID_ARG, "2 weights (stride 3) with activation 0");
}

/* A shared expert in the routing (shared_logit): each row's entries are
 * its k routed ones as without it, then expert E weighted by the sigmoid
 * of its logit; expert E's rows are every row, ascending; the default
 * composition (routing on host copies) gives the same bits. */
static void test_moe_route_shared(void)
{
    enum { N = 6, E = 5, K = 2, KR = K + 1 };
    float logits[N * E], sl[N], prob[N * KR], p1[K];
    int32_t expert[N * KR], first[E + 2], src[N * KR], slot[N * KR], e1[K];
    for (int i = 0; i < N * E; i++)
        logits[i] = frand() * 3;
    for (int i = 0; i < N; i++)
        sl[i] = frand() * 4;
    const dflash_route_args r = { .n = N, .n_experts = E, .k = K, .norm_topk_prob = 1, .logits = logits,
                                  .shared_logit = sl, .expert = expert, .prob = prob, .first = first, .src = src,
                                  .slot = slot };
    CHECK_OK(dflash_be_moe_route(be, &r));
    CHECK(first[0] == 0 && first[E] == N * K && first[E + 1] == N * KR);
    for (int row = 0; row < N; row++) {
        dflash_moe_route_row(logits + row * E, E, K, 1, e1, p1);
        for (int j = 0; j < K; j++)
            CHECK(expert[row * KR + j] == e1[j] && prob[row * KR + j] == p1[j]);
        CHECK(expert[row * KR + K] == E && prob[row * KR + K] == 1.0f / (1.0f + expf(-sl[row])));
        CHECK(slot[row * KR + K] == first[E] + row && src[first[E] + row] == row);
        for (int j = 0; j < KR; j++)
            CHECK(src[slot[row * KR + j]] == row);
    }
    check_route_on_host(&r, N * KR, E + 2);
}

/* linear_moe_route: the router's projection (with the shared expert's
 * gate, joined to the routing or not) then the routing, equal to the two
 * in turn; a routing that does not read the projection's outputs is
 * refused. */
static void test_linear_moe_route(void)
{
    enum { N = 4, H = 9, E = 6, K = 2, KR = K + 1 };
    float x[N * H], wr[E * H], wg[H], logits[N * E], sl[N], prob[N * KR], l2[N * E], s2[N], p2[N * KR];
    int32_t ints[4 * N * KR + E + 2], i2[4 * N * KR + E + 2];
    fill(x, N * H, 0.0f, 1.0f);
    fill(wr, E * H, 0.0f, 1.0f);
    fill(wg, H, 0.0f, 1.0f);
    const dflash_weight w[2] = { { DFLASH_DTYPE_F32, E, H, wr, NULL, "router" },
                                 { DFLASH_DTYPE_F32, 1, H, wg, NULL, "shared_gate" } };
    for (int shared = 0; shared < 3; shared++) { /* none, joined, apart */
        const int n_w = shared ? 2 : 1, kr = K + (shared == 1);
        float *const out[2] = { logits, shared ? sl : NULL }, *const out2[2] = { l2, shared ? s2 : NULL };
        dflash_route_args r = { .n = N, .n_experts = E, .k = K, .norm_topk_prob = 1, .logits = logits,
                                .shared_logit = shared == 1 ? sl : NULL, .expert = ints, .prob = prob,
                                .src = ints + N * KR, .slot = ints + 2 * N * KR, .first = ints + 3 * N * KR };
        dflash_route_args r2 = { .n = N, .n_experts = E, .k = K, .norm_topk_prob = 1, .logits = l2,
                                 .shared_logit = shared == 1 ? s2 : NULL, .expert = i2, .prob = p2,
                                 .src = i2 + N * KR, .slot = i2 + 2 * N * KR, .first = i2 + 3 * N * KR };
        memset(ints, 0, sizeof ints), memset(i2, 0, sizeof i2);
        CHECK_OK(dflash_be_linear_moe_route(be, x, N, w, n_w, out, &r));
        if (n_w == 2)
            CHECK_OK(dflash_be_linear_group(be, x, N, w, 2, out2, DFLASH_ACT_NONE));
        else
            CHECK_OK(be->ops->linear(be, x, N, &w[0], l2));
        CHECK_OK(dflash_be_moe_route(be, &r2));
        CHECKF(!memcmp(logits, l2, sizeof logits) && (!shared || !memcmp(sl, s2, sizeof sl)) &&
                   !memcmp(ints, i2, sizeof ints) && !memcmp(prob, p2, (size_t)N * kr * sizeof *prob),
               "shared %d: the stage differs from linear then moe_route", shared);
    }
    dflash_route_args bad = { .n = N, .n_experts = E, .k = K, .logits = l2, .expert = ints, .prob = prob,
                              .src = ints + N * KR, .slot = ints + 2 * N * KR, .first = ints + 3 * N * KR };
    float *const out[2] = { logits, NULL };
    CHECK_FAILS(dflash_be_linear_moe_route(be, x, N, w, 1, out, &bad), DFLASH_ERR_INVALID_ARG,
                "linear_moe_route: 1 weights (the router's 6 rows for 6 experts) and a routing of 4 rows that does "
                "not read their outputs");
}

/* A shared expert of the routed experts' shape joined to them (one more
 * entry of every row, weighted sum over k + 1 terms, left to the caller)
 * gives the same bits as run apart (its own SwiGLU and gated add after the routed sum): the
 * same products and sums in the same order. */
static void test_moe_shared_joined(void)
{
    enum { N = 7, E = 6, K = 2, H = 16, I = 8 };
    dflash_model_config c = { 0 };
    c.hidden_size = H, c.num_experts = E, c.num_experts_per_tok = K, c.moe_intermediate_size = I;
    c.shared_expert_intermediate_size = I, c.norm_topk_prob = 1;
    static uint16_t wd[(E + 1) * 3 + 2][I * H];
    dflash_weight w[(E + 1) * 3 + 2];
    for (int i = 0; i < (E + 1) * 3 + 2; i++) {
        const int down = i < (E + 1) * 3 && i % 3 == 2;
        const int64_t rows = i == (E + 1) * 3 ? E : i == (E + 1) * 3 + 1 ? 1 : down ? H : I;
        const int64_t cols = down ? I : H;
        for (int64_t j = 0; j < rows * cols; j++)
            wd[i][j] = dflash_f32_to_bf16(frand() * 0.5f);
        w[i] = (dflash_weight){ DFLASH_DTYPE_BF16, rows, cols, wd[i], NULL, "w" };
    }
    qwen3_moe m = { .router = w[(E + 1) * 3], .experts = w, .shared_gate = w[(E + 1) * 3 + 1] };
    memcpy(m.shared, &w[E * 3], sizeof m.shared);
    qwen3_moe_bufs b;
    CHECK_OK(qwen3_moe_bufs_alloc(be, &c, N, &b));
    float x[N * H], joined[N * H], apart[N * H];
    for (int i = 0; i < N * H; i++)
        x[i] = frand();
    /* joined, the layer leaves its output as the weighted sum the next
     * norm adds (qwen3_moe_sum): taken here on its own */
    m.shared_joined = 1;
    CHECK(qwen3_moe_defers(&m));
    CHECK_OK(qwen3_moe_forward(be, &c, &m, &b, x, N, NULL));
    const dflash_gather sum = qwen3_moe_sum(&c, &m, &b);
    CHECK(sum.k == K + 1);
    CHECK_OK(be->ops->gather_sum(be, joined, sum.src, sum.idx, sum.w, N, sum.k, H));
    m.shared_joined = 0;
    CHECK(!qwen3_moe_defers(&m));
    CHECK_OK(qwen3_moe_forward(be, &c, &m, &b, x, N, apart));
    CHECK(!memcmp(joined, apart, sizeof joined));
    qwen3_moe_bufs_free(be, &b);
}

int main(void)
{
    dflash_backend_cpu_create(&be);
    RUN(test_linear_dtypes);
    RUN(test_rmsnorm_and_rope);
    RUN(test_attention_modes);
    RUN(test_qk_norm_rope_store);
    RUN(test_qk_norm_rope_dispatch);
    RUN(test_linear_row_independent);
    RUN(test_argmax_ties_low_index);
    RUN(test_gather_sum);
    RUN(test_add_bias);
    RUN(test_linear_gated_add);
    RUN(test_gather_add_rmsnorm);
    RUN(test_linear_add_rmsnorm);
    RUN(test_qkv_norm_rope_store);
    RUN(test_qkv_attention);
    RUN(test_linear_group);
    RUN(test_sigmoid_mul);
    RUN(test_norm_gate);
    RUN(test_recurrent_ops);
    RUN(test_moe_route);
    RUN(test_moe_stages);
    RUN(test_moe_route_shared);
    RUN(test_linear_moe_route);
    RUN(test_moe_shared_joined);
    dflash_backend_destroy(be);
    TEST_END();
}
