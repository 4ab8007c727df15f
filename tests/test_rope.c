/* test_rope.c: RoPE against transformers. Each folder of tests/data/rope
 * (made by tools/fixtures/make_rope.py with transformers 5.17) holds a
 * config.json in a published form (default, linear, llama3, yarn with
 * its optional keys) and what transformers computed from it: the inverse
 * frequencies, the attention scaling, and a rotation of random vectors at
 * positions up to 100000. Here the project's loader parses the same file,
 * core/rope.c builds its table, and the CPU op rotates the same vectors. */
#include "harness.h"

#include <dirent.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "fixture.h"
#include "io/hf_config.h"

static dflash_backend *be;

/* Distance in units in the last place between two finite floats of one sign. */
static int64_t ulps(float a, float b)
{
    int32_t ia, ib;
    memcpy(&ia, &a, 4);
    memcpy(&ib, &b, 4);
    return llabs((int64_t)ia - (int64_t)ib);
}

/* Checks one fixture; returns its RoPE kind (-1 if its config did not load). */
static int check_case(const char *name)
{
    char dir[512], path[600];
    fx_path(dir, sizeof dir, "rope", name);
    dflash_model_config c;
    const dflash_status loaded = dflash_config_load(dir, &c);
    CHECKF(loaded == DFLASH_OK, "%s: %s", name, dflash_last_error());
    if (loaded != DFLASH_OK)
        return -1;
    snprintf(path, sizeof path, "%s/expected.safetensors", dir);
    fx_check_provenance(path, "producer");
    dflash_st *st = NULL;
    CHECK_OK(dflash_st_open(path, &st));
    if (!st)
        return -1;
    int64_t n_inv = 0, n_pos = 0, n_x = 0;
    const float *inv = fx_f32(st, "inv_freq", &n_inv), *attn = fx_f32(st, "attention_scaling", NULL);
    const float *x = fx_f32(st, "x", &n_x), *rotated = fx_f32(st, "rotated", NULL);
    const int32_t *pos = fx_i32(st, "positions", &n_pos);
    if (!inv || !attn || !x || !rotated || !pos) {
        dflash_st_close(st);
        return -1;
    }
    CHECKF(n_inv == c.rope_freq.n_pairs, "%s: %lld frequencies expected, table has %d", name, (long long)n_inv,
           c.rope_freq.n_pairs);
    int64_t worst = 0;
    int at = 0;
    for (int j = 0; j < c.rope_freq.n_pairs && j < n_inv; j++)
        if (ulps(c.rope_freq.inv_freq[j], inv[j]) > worst) {
            worst = ulps(c.rope_freq.inv_freq[j], inv[j]);
            at = j;
        }
    /* powf may round differently from torch's pow by an ulp; the rest of
     * the arithmetic is transformers' own */
    CHECKF(worst <= 1, "%s: inv_freq[%d] = %.9g, transformers %.9g (%lld ulps)", name, at,
           c.rope_freq.inv_freq[at], inv[at], (long long)worst);
    CHECKF(c.rope_freq.attn_factor == attn[0], "%s: attention factor %.9g, transformers %.9g", name,
           c.rope_freq.attn_factor, attn[0]);
    /* The rotation with the table transformers made (the op itself) and with
     * ours (equal unless an inv_freq differs by its ulp, which moves the
     * angle at position 1e5 by up to ~1e5 ulps of the frequency). */
    const int D = c.head_dim, heads = (int)(n_x / (n_pos * D));
    float *y = malloc((size_t)n_x * sizeof(float));
    memcpy(y, x, (size_t)n_x * sizeof(float));
    dflash_rope theirs = c.rope_freq;
    memcpy(theirs.inv_freq, inv, (size_t)n_inv * sizeof(float));
    theirs.attn_factor = attn[0];
    CHECK_OK(be->ops->norm_rope(be, y, NULL, pos, (int)n_pos, heads, D, 1e-6f, &theirs));
    double err = 0;
    for (int64_t i = 0; i < n_x; i++)
        err = fmax(err, fabs((double)y[i] - rotated[i]) / (1.0 + fabs(rotated[i])));
    CHECKF(err < 2e-6, "%s: rotation with transformers' table differs by %.3g (relative)", name, err);
    memcpy(y, x, (size_t)n_x * sizeof(float));
    CHECK_OK(be->ops->norm_rope(be, y, NULL, pos, (int)n_pos, heads, D, 1e-6f, &c.rope_freq));
    double err_ours = 0;
    for (int64_t i = 0; i < n_x; i++)
        err_ours = fmax(err_ours, fabs((double)y[i] - rotated[i]) / (1.0 + fabs(rotated[i])));
    CHECKF(worst > 0 || err_ours == err, "%s: same table, different rotation", name);
    CHECKF(err_ours < 1e-5, "%s: rotation with our table differs by %.3g (relative)", name, err_ours);
    printf("# %-22s %-8s theta %-8g attn %.6f  inv_freq max %lld ulp  rotation err %.2g (ours %.2g)\n", name,
           dflash_rope_kind_name(c.rope.kind), c.rope.theta, c.rope_freq.attn_factor, (long long)worst, err,
           err_ours);
    free(y);
    dflash_st_close(st);
    return (int)c.rope.kind;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static void test_transformers_cases(void)
{
    char dir[512];
    fx_path(dir, sizeof dir, "rope", NULL);
    DIR *d = opendir(dir);
    CHECKF(d != NULL, "no fixture folder %s", dir);
    if (!d)
        return;
    char *names[64];
    int n = 0;
    for (struct dirent *e; (e = readdir(d)) && n < 64;)
        if (e->d_name[0] != '.')
            names[n++] = strdup(e->d_name);
    closedir(d);
    qsort(names, (size_t)n, sizeof names[0], cmp_str);
    CHECKF(n >= 10, "%d RoPE fixtures in %s, expected the 12 make_rope.py writes", n, dir);
    int kinds[4] = { 0 };
    for (int i = 0; i < n; i++) {
        const int kind = check_case(names[i]);
        if (kind >= 0)
            kinds[kind]++;
        free(names[i]);
    }
    CHECKF(kinds[DFLASH_ROPE_DEFAULT] && kinds[DFLASH_ROPE_LINEAR] && kinds[DFLASH_ROPE_LLAMA3] &&
               kinds[DFLASH_ROPE_YARN] >= 4,
           "fixtures cover default %d, linear %d, llama3 %d, yarn %d", kinds[0], kinds[1], kinds[2], kinds[3]);
}

/* Domain errors name the field. */
static void test_bad_params(void)
{
    dflash_rope r;
    dflash_rope_params p = { .kind = DFLASH_ROPE_LLAMA3, .theta = 5e5, .factor = 8, .low_freq_factor = 4,
                             .high_freq_factor = 1, .original_max_pos = 8192 };
    CHECK_FAILS(dflash_rope_init(&p, 128, &r), DFLASH_ERR_FORMAT, "expected 0 < low < high");
    p = (dflash_rope_params){ .kind = DFLASH_ROPE_YARN, .theta = 1e6, .factor = 4 };
    CHECK_FAILS(dflash_rope_init(&p, 128, &r), DFLASH_ERR_FORMAT, "original_max_position_embeddings = 0");
    p = (dflash_rope_params){ .kind = DFLASH_ROPE_DEFAULT, .theta = 1e4 };
    CHECK_FAILS(dflash_rope_init(&p, 7, &r), DFLASH_ERR_UNSUPPORTED, "head_dim 7 is odd");
    CHECK_FAILS(dflash_rope_init(&p, 1024, &r), DFLASH_ERR_UNSUPPORTED, "head_dim 1024, expected 2..512");
    CHECK_OK(dflash_rope_init(&p, 4, &r));
    float x[4] = { 1, 2, 3, 4 };
    int32_t pos = 1;
    CHECK_FAILS(be->ops->norm_rope(be, x, NULL, &pos, 1, 1, 2, 1e-6f, &r), DFLASH_ERR_SHAPE,
                "RoPE table of 2 dimension pairs for head_dim 2");
    /* a table of fewer pairs rotates the first dimensions only (a partial
     * rotation): pair (0, 1) turns by pos * inv_freq[0] = 1 radian, 2 and 3
     * stay */
    CHECK_OK(dflash_rope_init(&p, 2, &r));
    CHECK_OK(be->ops->norm_rope(be, x, NULL, &pos, 1, 1, 4, 1e-6f, &r));
    CHECKF(fabsf(x[0] - (cosf(1) - 2 * sinf(1))) < 1e-6f && fabsf(x[1] - (2 * cosf(1) + sinf(1))) < 1e-6f &&
               x[2] == 3 && x[3] == 4,
           "partial rotation: %g %g %g %g", x[0], x[1], x[2], x[3]);
}

int main(void)
{
    dflash_backend_cpu_create(&be);
    RUN(test_transformers_cases);
    RUN(test_bad_params);
    dflash_backend_destroy(be);
    TEST_END();
}
