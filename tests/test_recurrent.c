/* test_recurrent.c: the recurrent-state primitives (conv_silu and the
 * chunked delta_rule, backend.h) under the rule a hybrid target follows
 * between forwards: the next call of a sequence starts at 0 or anywhere in
 * [max(p0, end - DFLASH_REC_BACK), end] after a call of rows [p0, end).
 * Random walks of two sequences per call (calls of 1 to 319 rows, so
 * calls longer than the rows a record keeps and calls over several chunk
 * starts; rows later taken back filled with other inputs; restarts at 0 on
 * records holding an earlier walk; fresh records poisoned with NaN) must
 * give, for every row that stays, the bits of one call over all positions
 * from 0. The chunked form is also held against the token-by-token
 * recurrence computed here in double. */
#include "harness.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"

static dflash_backend *be;

static uint64_t rng = 88172645463325252ull;
static uint32_t rnd(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 11);
}
static float frnd(float lo, float hi) { return lo + (hi - lo) * (float)(rnd() & 0xffffff) / (float)0x1000000; }

typedef struct geom {
    int Hk, Hv, dk, dv, K;
} geom;

enum { L = 700, SEQS = 2, RECS = 3 };

/* One layer's weights, the true inputs of two sequences at every
 * position, and their outputs from one call each from position 0. */
typedef struct world {
    geom g;
    int C, Vd;
    float *cw, *alog, *dtb;
    dflash_weight W, A, D;
    int64_t csz, dsz;
    float *crec, *drec; /* RECS records of each */
    float *x[SEQS], *y[SEQS], *a[SEQS], *b[SEQS];
    float *ref_c[SEQS], *ref_d[SEQS];
} world;

static float *fill(size_t n, float lo, float hi)
{
    float *p = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        p[i] = frnd(lo, hi);
    return p;
}

static void poison(world *w)
{
    memset(w->crec, 0xff, (size_t)(w->csz * RECS) * sizeof(float));
    memset(w->drec, 0xff, (size_t)(w->dsz * RECS) * sizeof(float));
}

/* n rows from position p0 of sequence q's record rec: x, y, a, b at row
 * i of the buffers; outputs into oc, od. */
static void call(world *w, int n_seqs, const int32_t *info, int n, const float *x, const float *y, const float *a,
                 const float *b, float *oc, float *od)
{
    int most = 0;
    for (int q = 0; q < n_seqs; q++)
        most = info[q * DFLASH_REC_INFO_LEN + 1] > most ? info[q * DFLASH_REC_INFO_LEN + 1] : most;
    dflash_rec_args rc = { n_seqs, most, info, w->crec, w->csz }, rd = { n_seqs, most, info, w->drec, w->dsz };
    const geom g = w->g;
    CHECK_OK(be->ops->conv_silu(be, &rc, x, &w->W, n, w->C, g.K, oc));
    dflash_delta_args da = { n, g.Hk, g.Hv, g.dk, g.dv, y, a, b, &w->A, &w->D, od };
    CHECK_OK(be->ops->delta_rule(be, &rd, &da));
}

static void world_make(world *w, geom g)
{
    memset(w, 0, sizeof *w);
    w->g = g;
    w->C = 2 * g.Hk * g.dk + g.Hv * g.dv, w->Vd = g.Hv * g.dv;
    w->cw = fill((size_t)w->C * g.K, -1, 1), w->alog = fill((size_t)g.Hv, -1.5f, 1.5f);
    w->dtb = fill((size_t)g.Hv, -1, 1);
    w->W = (dflash_weight){ DFLASH_DTYPE_F32, w->C, g.K, w->cw, NULL, "conv" };
    w->A = (dflash_weight){ DFLASH_DTYPE_F32, 1, g.Hv, w->alog, NULL, "A_log" };
    w->D = (dflash_weight){ DFLASH_DTYPE_F32, 1, g.Hv, w->dtb, NULL, "dt_bias" };
    w->csz = dflash_conv_rec_size(w->C), w->dsz = dflash_delta_rec_size(g.Hv, g.dk, g.dv);
    w->crec = malloc((size_t)(w->csz * RECS) * sizeof(float));
    w->drec = malloc((size_t)(w->dsz * RECS) * sizeof(float));
    for (int q = 0; q < SEQS; q++) {
        w->x[q] = fill((size_t)L * w->C, -2, 2), w->y[q] = fill((size_t)L * w->C, -2, 2);
        w->a[q] = fill((size_t)L * g.Hv, -4, 3), w->b[q] = fill((size_t)L * g.Hv, -3, 3);
        w->ref_c[q] = malloc((size_t)L * w->C * sizeof(float));
        w->ref_d[q] = malloc((size_t)L * w->Vd * sizeof(float));
        poison(w);
        const int32_t info[DFLASH_REC_INFO_LEN] = { 0, L, 0, q };
        call(w, 1, info, L, w->x[q], w->y[q], w->a[q], w->b[q], w->ref_c[q], w->ref_d[q]);
    }
}

static void world_free(world *w)
{
    for (int q = 0; q < SEQS; q++)
        free(w->x[q]), free(w->y[q]), free(w->a[q]), free(w->b[q]), free(w->ref_c[q]), free(w->ref_d[q]);
    free(w->cw), free(w->alog), free(w->dtb), free(w->crec), free(w->drec);
}

/* Sequence 0's reference outputs against the token-by-token recurrence
 * in double: the largest absolute difference, and the largest output. */
static void recurrence_error(const world *w, double *worst, double *largest)
{
    const geom g = w->g;
    const int Kd = g.Hk * g.dk;
    double *S = calloc((size_t)g.Hv * g.dk * g.dv, sizeof(double)), q[128], k[128];
    *worst = 0, *largest = 0;
    for (int t = 0; t < L; t++) {
        const float *y = w->y[0] + (size_t)t * w->C;
        for (int j = 0; j < g.Hv; j++) {
            const int h = j / (g.Hv / g.Hk);
            double sq = 0, sk = 0;
            for (int i = 0; i < g.dk; i++) {
                sq += (double)y[h * g.dk + i] * y[h * g.dk + i];
                sk += (double)y[Kd + h * g.dk + i] * y[Kd + h * g.dk + i];
            }
            for (int i = 0; i < g.dk; i++) {
                q[i] = y[h * g.dk + i] / sqrt(sq + 1e-6) / sqrt((double)g.dk);
                k[i] = y[Kd + h * g.dk + i] / sqrt(sk + 1e-6);
            }
            const double beta = 1 / (1 + exp(-(double)w->b[0][t * g.Hv + j]));
            const double xa = (double)w->a[0][t * g.Hv + j] + w->dtb[j];
            const double decay = exp(-exp((double)w->alog[j]) * (xa > 20 ? xa : log1p(exp(xa))));
            double *Sj = S + (size_t)j * g.dk * g.dv;
            for (int i = 0; i < g.dk * g.dv; i++)
                Sj[i] *= decay;
            for (int e = 0; e < g.dv; e++) {
                double u = 0;
                for (int i = 0; i < g.dk; i++)
                    u += Sj[i * g.dv + e] * k[i];
                const double d = beta * (y[2 * Kd + j * g.dv + e] - u);
                for (int i = 0; i < g.dk; i++)
                    Sj[i * g.dv + e] += k[i] * d;
            }
            for (int e = 0; e < g.dv; e++) {
                double o = 0;
                for (int i = 0; i < g.dk; i++)
                    o += Sj[i * g.dv + e] * q[i];
                *worst = fmax(*worst, fabs(o - w->ref_d[0][(size_t)t * w->Vd + j * g.dv + e]));
                *largest = fmax(*largest, fabs(o));
            }
        }
    }
    free(S);
}

/* A call length: single rows, verify-sized, about a chunk, or long. */
static int draw_length(void)
{
    switch (rnd() % 6) {
    case 0: return 1;
    case 1: return 1 + (int)(rnd() % 17);
    case 2: return 60 + (int)(rnd() % 8);
    case 3: return 1 + (int)(rnd() % DFLASH_REC_BACK);
    case 4: return 120 + (int)(rnd() % 200);
    default: return 1 + (int)(rnd() % 130);
    }
}

/* `walks` random walks of 40 calls over two sequences; returns the rows
 * compared, or -1 at the first that differs. */
static long walk(world *w, int walks)
{
    const geom g = w->g;
    const int C = w->C, Vd = w->Vd, Hv = g.Hv;
    float *xb = malloc((size_t)SEQS * L * C * sizeof(float)), *yb = malloc((size_t)SEQS * L * C * sizeof(float));
    float *ab = malloc((size_t)SEQS * L * Hv * sizeof(float)), *bb = malloc((size_t)SEQS * L * Hv * sizeof(float));
    float *oc = malloc((size_t)SEQS * L * C * sizeof(float)), *od = malloc((size_t)SEQS * L * Vd * sizeof(float));
    long compared = 0;
    for (int v = 0; v < walks && compared >= 0; v++) {
        if (v % 4 == 0)
            poison(w); /* else the records of the last walk, restarted at 0 */
        /* per sequence: the last call [p0, end), rows below `good` hold the true inputs */
        int p0[SEQS] = { 0 }, end[SEQS] = { 0 }, good[SEQS] = { 0 };
        const int rec[SEQS] = { 1 + (v & 1), 2 - (v & 1) };
        for (int step = 0; step < 40 && compared >= 0; step++) {
            int32_t info[SEQS * DFLASH_REC_INFO_LEN];
            int row0 = 0, keep[SEQS];
            for (int q = 0; q < SEQS; q++) {
                const int lo = p0[q] > end[q] - DFLASH_REC_BACK ? p0[q] : end[q] - DFLASH_REC_BACK;
                const int hi = end[q] < good[q] ? end[q] : good[q];
                const int start = step == 0 || rnd() % 12 == 0 || hi < lo ? 0 : lo + (int)(rnd() % (unsigned)(hi - lo + 1));
                int n = draw_length();
                if (start + n > L)
                    n = L - start;
                /* the last rows of a call (at most DFLASH_REC_BACK) may get other inputs: taken back later */
                const int other = n > 0 && rnd() % 3 == 0 ? 1 + (int)(rnd() % (unsigned)(n < DFLASH_REC_BACK ? n : DFLASH_REC_BACK)) : 0;
                keep[q] = n - other;
                for (int t = 0; t < n; t++) {
                    const size_t r = (size_t)(row0 + t), p = (size_t)(start + t);
                    const int true_row = t < keep[q];
                    for (int c = 0; c < C; c++) {
                        xb[r * C + c] = true_row ? w->x[q][p * C + c] : frnd(-3, 3);
                        yb[r * C + c] = true_row ? w->y[q][p * C + c] : frnd(-3, 3);
                    }
                    for (int j = 0; j < Hv; j++) {
                        ab[r * Hv + j] = true_row ? w->a[q][p * Hv + j] : frnd(-4, 3);
                        bb[r * Hv + j] = true_row ? w->b[q][p * Hv + j] : frnd(-3, 3);
                    }
                }
                int32_t *f = info + q * DFLASH_REC_INFO_LEN;
                f[0] = row0, f[1] = n, f[2] = start, f[3] = rec[q];
                row0 += n;
                p0[q] = start, end[q] = start + n, good[q] = start + keep[q];
            }
            call(w, SEQS, info, row0, xb, yb, ab, bb, oc, od);
            for (int q = 0; q < SEQS && compared >= 0; q++) {
                const int r0 = info[q * DFLASH_REC_INFO_LEN];
                for (int t = 0; t < keep[q]; t++) {
                    const size_t p = (size_t)(p0[q] + t);
                    if (memcmp(oc + (size_t)(r0 + t) * C, w->ref_c[q] + p * C, (size_t)C * sizeof(float)) ||
                        memcmp(od + (size_t)(r0 + t) * Vd, w->ref_d[q] + p * Vd, (size_t)Vd * sizeof(float))) {
                        CHECKF(0, "walk %d call %d sequence %d: the row at %zu (call [%d, %d)) differs", v, step, q, p,
                               p0[q], end[q]);
                        compared = -1;
                        break;
                    }
                    compared++;
                }
            }
        }
    }
    free(xb), free(yb), free(ab), free(bb), free(oc), free(od);
    return compared;
}

static void run(geom g, int walks)
{
    world w;
    world_make(&w, g);
    double worst, largest;
    recurrence_error(&w, &worst, &largest);
    CHECKF(worst < 1e-4 * fmax(largest, 1.0), "k %dx%d v %dx%d: the chunked form is %g from the recurrence (outputs "
           "up to %g)", g.Hk, g.dk, g.Hv, g.dv, worst, largest);
    const long compared = walk(&w, walks);
    printf("  k %dx%d v %dx%d conv %d: %.2g from the recurrence in double; %ld rows equal bit for bit\n", g.Hk, g.dk,
           g.Hv, g.dv, g.K, worst, compared);
    world_free(&w);
}

static void test_walks(void)
{
    run((geom){ 2, 4, 16, 8, 4 }, 40);  /* the fixtures' geometry */
    run((geom){ 1, 2, 8, 20, 4 }, 40);  /* v wider than k */
    run((geom){ 1, 1, 1, 1, 1 }, 40);   /* the smallest, no window */
    run((geom){ 2, 2, 32, 32, 16 }, 8); /* the widest window */
}

int main(void)
{
    dflash_backend_cpu_create(&be);
    RUN(test_walks);
    dflash_backend_destroy(be);
    TEST_END();
}
