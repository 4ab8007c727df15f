/* test_nonfinite.c: logits with no usable number (NaN, +inf, every value
 * -inf) are reported, never decoded into tokens: the argmax op's -1, the
 * fused LM head + argmax, and the loop's DFLASH_ERR_NUMERIC naming the
 * model and the position, greedy and sampled, plain and speculative, for
 * the target and for the drafter, and for a Qwen3-MoE whose router goes
 * NaN. */
#include "harness.h"

#include <jansson.h>
#include <math.h>

#include "core/levers.h"
#include "draft/dflash_head.h"
#include "draft/ngram.h"
#include "fixture.h"
#include "spec/spec.h"
#include "testmodel.h"

static dflash_backend *be;

static void test_argmax_unusable_rows(void)
{
    enum { C = 5 };
    const float rows[][C] = {
        { 1, 3, 3, 2, -1 },                                   /* ties: the lower index */
        { 1, NAN, 3, 2, -1 },                                 /* NaN anywhere */
        { NAN, 1, 2, 3, 4 },                                  /* NaN first */
        { 1, 2, INFINITY, 0, 0 },                             /* +inf */
        { -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY }, /* nothing above -inf */
        { -INFINITY, -5, -INFINITY, -7, -INFINITY },          /* masked values are fine */
    };
    const int32_t want[] = { 1, -1, -1, -1, -1, 1 };
    int32_t out[6];
    CHECK_OK(be->ops->argmax(be, &rows[0][0], 6, C, out));
    for (int i = 0; i < 6; i++)
        CHECKF(out[i] == want[i], "row %d: %d, want %d", i, out[i], want[i]);
}

/* The LM head stage on a weight with one NaN row: every row's argmax is -1. */
static void test_linear_argmax_nan_weight(void)
{
    enum { N = 9, K = 8, M = 3 };
    uint16_t w[N * K];
    float x[M * K], logits[M * N];
    for (int i = 0; i < N * K; i++)
        w[i] = dflash_f32_to_bf16(0.1f * (float)((i * 7) % 11 - 5));
    for (int i = 0; i < M * K; i++)
        x[i] = 0.25f * (float)(i % 5);
    dflash_weight wt = { DFLASH_DTYPE_BF16, N, K, w, NULL, "w" };
    int32_t ids[M];
    CHECK_OK(dflash_be_linear_argmax(be, x, M, &wt, logits, ids));
    for (int i = 0; i < M; i++)
        CHECK(ids[i] >= 0);
    w[4 * K + 2] = 0x7fc0; /* NaN */
    CHECK_OK(dflash_be_linear_argmax(be, x, M, &wt, logits, ids));
    for (int i = 0; i < M; i++)
        CHECKF(ids[i] == -1, "row %d: %d", i, ids[i]);
}

/* DFLASH_HOST_SAMPLING: sampled rows drawn on the host (1) or by ids (0). */
static void host_sampling(int on)
{
    if (on)
        setenv("DFLASH_HOST_SAMPLING", "1", 1);
    else
        unsetenv("DFLASH_HOST_SAMPLING");
    dflash_levers_reload();
}

/* Generation from target t (loaded from `dir`) in every loop path
 * (greedy, sampled by drawn ids, sampled on the host with a repetition
 * penalty (DFLASH_HOST_SAMPLING=1), by drawn ids with one; plain and with
 * the n-gram proposer) fails with DFLASH_ERR_NUMERIC naming `dir` and the
 * position, emitting nothing. */
static void expect_numeric_everywhere(dflash_qwen3 *t, const char *dir)
{
    const int32_t prompt[] = { 3, 9, 3, 9, 3, 9, 3 };
    for (int mode = 0; mode < 8; mode++) {
        const int sampled = mode % 4, spec = mode / 4;
        host_sampling(sampled == 2);
        dflash_kv_seq seq;
        dflash_proposer *p = NULL;
        void *ps = NULL;
        CHECK_OK(dflash_qwen3_seq_init(t, &seq));
        if (spec) {
            CHECK_OK(dflash_ngram_create(4, 1, 3, &p));
            CHECK_OK(p->ops->alloc_state(p, 200, &ps));
        }
        dflash_gen_opts go;
        dflash_gen_default_opts(&go);
        go.n_new = 8;
        if (sampled)
            go.sampler.temperature = 0.8;
        if (sampled >= 2)
            go.sampler.rep_penalty = 1.1;
        int32_t out[8];
        int n_out = 0;
        dflash_gen_stats st;
        dflash_status s = dflash_spec_generate(t, &seq, p, ps, prompt, 7, &go, out, &n_out, &st);
        CHECKF(s == DFLASH_ERR_NUMERIC, "mode %d: %s (%s)", mode, dflash_status_name(s), dflash_last_error());
        CHECKF(strstr(dflash_last_error(), dir) && strstr(dflash_last_error(), "position 7"),
               "mode %d message: %s", mode, dflash_last_error());
        CHECKF(n_out == 0, "mode %d emitted %d tokens", mode, n_out);
        if (p) {
            p->ops->free_state(p, ps);
            dflash_proposer_destroy(p);
        }
        host_sampling(0);
        dflash_qwen3_seq_free(t, &seq);
    }
}

/* The default tiny test model, changed by `poison`, saved into a new
 * temporary dir and loaded; NULL, with dir removed, when that fails. */
static dflash_qwen3 *load_poisoned(char dir[64], void (*poison)(testmodel *m, const testmodel_geom *g))
{
    testmodel_geom g;
    testmodel_default_geom(&g);
    testmodel m;
    if (!testmodel_build(&m, &g)) {
        CHECK(0);
        return NULL;
    }
    if (!testmodel_tmpdir(dir)) {
        CHECK(0);
        testmodel_free(&m);
        return NULL;
    }
    dflash_qwen3 *t = NULL;
    poison(&m, &g);
    CHECK(testmodel_save(&m, dir));
    testmodel_free(&m);
    CHECK_OK(dflash_qwen3_load(dir, be, NULL, &t));
    if (!t)
        testmodel_rmdir(dir);
    return t;
}

static void nan_final_norm(testmodel *m, const testmodel_geom *g)
{
    (void)g;
    testmodel_find(m, "model.norm.weight")[3] = NAN;
}

/* every embedding row NaN but those of tokens 3 and 9 */
static void nan_embeddings_but_3_9(testmodel *m, const testmodel_geom *g)
{
    float *emb = testmodel_find(m, "model.embed_tokens.weight");
    for (int v = 0; v < g->vocab; v++)
        if (v != 3 && v != 9)
            emb[(size_t)v * g->hidden] = NAN;
}

/* A tiny target whose final norm is NaN, generated from every loop path. */
static void test_loop_reports_target(void)
{
    char dir[64];
    dflash_qwen3 *t = load_poisoned(dir, nan_final_norm);
    if (!t)
        return;
    expect_numeric_everywhere(t, dir);
    dflash_qwen3_free(t);
    testmodel_rmdir(dir);
}

/* Sequences stepped together whose sampled acceptance meets NaN logits
 * after the prompt (every embedding row but the prompt's two tokens is
 * NaN, so the first sampled token that is neither poisons the next
 * verify): sampling on the host (DFLASH_HOST_SAMPLING=1, with a
 * repetition penalty), the batch's sampling sequences accept on worker
 * threads, and the error that comes back must still name the model and
 * the position, not be a message left over on the calling thread;
 * drawing by ids (with a penalty, and without) their tokens are drawn in
 * one call, and the same holds. */
static void test_batch_sampled_reports_target(void)
{
    char dir[64];
    dflash_qwen3 *t = load_poisoned(dir, nan_embeddings_but_3_9);
    if (!t)
        return;
    enum { N = 3 };
    const int32_t prompt[] = { 3, 9, 3, 9, 3, 9, 3 };
    for (int mode = 2; mode >= 0; mode--) {
        host_sampling(mode == 2);
        dflash_kv_seq seqs[N];
        dflash_spec_item items[N];
        int32_t out[N][16];
        for (int i = 0; i < N; i++) {
            CHECK_OK(dflash_qwen3_seq_init(t, &seqs[i]));
            dflash_gen_opts o;
            dflash_gen_default_opts(&o);
            o.n_new = 16;
            o.sampler.temperature = 1.0;
            o.sampler.rep_penalty = mode ? 1.05 : 1.0;
            o.sampler.seed = 40 + (uint64_t)i;
            items[i] =
                (dflash_spec_item){ .seq = &seqs[i], .prompt = prompt, .n_prompt = 7, .opts = o, .out = out[i] };
        }
        dflash_fail(DFLASH_ERR_IO, "a stale message");
        const dflash_status s = dflash_spec_generate_many(t, NULL, items, N, 0, 0);
        CHECKF(s == DFLASH_ERR_NUMERIC, "mode %d: %s (%s)", mode, dflash_status_name(s), dflash_last_error());
        CHECKF(strstr(dflash_last_error(), dir) && strstr(dflash_last_error(), "position"), "mode %d message: %s",
               mode, dflash_last_error());
        for (int i = 0; i < N; i++)
            dflash_qwen3_seq_free(t, &seqs[i]);
        host_sampling(0);
    }
    dflash_qwen3_free(t);
    testmodel_rmdir(dir);
}

/* Copy a file byte for byte. */
static int copy_file(const char *from, const char *to)
{
    FILE *a = fopen(from, "rb"), *b = fopen(to, "wb");
    int ok = a && b;
    char buf[65536];
    size_t n;
    while (ok && (n = fread(buf, 1, sizeof buf, a)) > 0)
        ok = fwrite(buf, 1, n, b) == n;
    if (a)
        fclose(a);
    if (b && fclose(b) != 0)
        ok = 0;
    return ok;
}

/* config.json and model.safetensors of folder `src` into `dir`; the copied
 * model.safetensors' path into weights[cap]. */
static void copy_checkpoint(const char *src, const char *dir, char *weights, size_t cap)
{
    char a[600];
    for (int i = 0; i < 2; i++) {
        const char *f = i ? "model.safetensors" : "config.json";
        snprintf(a, sizeof a, "%s/%s", src, f);
        snprintf(weights, cap, "%s/%s", dir, f);
        CHECK(copy_file(a, weights));
    }
}

/* Overwrite element `at` of bf16 tensor `name` of a safetensors file with NaN. */
static int poison_tensor(const char *path, const char *name, long at)
{
    FILE *f = fopen(path, "r+b");
    if (!f)
        return 0;
    uint8_t n8[8];
    uint64_t len = 0;
    int ok = fread(n8, 1, 8, f) == 8;
    for (int i = 0; i < 8; i++)
        len |= (uint64_t)n8[i] << (8 * i);
    char *hdr = ok && len < (1u << 24) ? malloc(len + 1) : NULL;
    ok = hdr && fread(hdr, 1, len, f) == len;
    json_t *j = NULL;
    if (ok) {
        hdr[len] = 0;
        j = json_loads(hdr, 0, NULL);
    }
    json_t *offs = j ? json_object_get(json_object_get(j, name), "data_offsets") : NULL;
    ok = ok && offs && json_is_integer(json_array_get(offs, 0));
    if (ok) {
        const uint8_t nan_bf16[2] = { 0xc0, 0x7f };
        const uint64_t at_byte = 8 + len + (uint64_t)json_integer_value(json_array_get(offs, 0)) + 2 * (uint64_t)at;
        ok = fseek(f, (long)at_byte, SEEK_SET) == 0 && fwrite(nan_bf16, 1, 2, f) == 2;
    }
    json_decref(j);
    free(hdr);
    return fclose(f) == 0 && ok;
}

/* Fixture checkpoint `group`/`name` copied into a new temporary folder
 * `dir` (char[64]), element `at` of its bf16 tensor `tensor` set to NaN. */
static void poisoned_copy(const char *group, const char *name, const char *tensor, long at, char *dir)
{
    char src[512], weights[600];
    CHECK(testmodel_tmpdir(dir));
    fx_path(src, sizeof src, group, name);
    copy_checkpoint(src, dir, weights, sizeof weights);
    CHECK(poison_tensor(weights, tensor, at));
}

/* Remove a folder poisoned_copy made. */
static void remove_copy(const char *dir)
{
    char a[600];
    for (int i = 0; i < 2; i++) {
        snprintf(a, sizeof a, "%s/%s", dir, i ? "model.safetensors" : "config.json");
        remove(a);
    }
    rmdir(dir);
}

/* A drafter whose final norm is NaN: every draft is -1. Whether the
 * drafts come to the host before the verify (DFLASH_HOST_DRAFTS=1) or the
 * verify reads them where they are (and its own error, a token outside
 * the vocabulary, comes first), the error names the drafter: one
 * sequence, and three stepped together. */
static void test_loop_reports_drafter(void)
{
    char tdir[512], dir[64];
    poisoned_copy("dflash", "d2_tied", "norm.weight", 0, dir);
    CHECK(fx_drafter_target("d2_tied", tdir, sizeof tdir));
    enum { N = 3 };
    dflash_qwen3 *t = NULL;
    dflash_head *h = NULL;
    dflash_qwen3_opts to;
    dflash_qwen3_default_opts(&to);
    to.max_seqs = N;
    dflash_head_opts ho;
    dflash_head_default_opts(&ho);
    ho.max_seqs = N;
    CHECK_OK(dflash_qwen3_load(tdir, be, &to, &t));
    if (t)
        CHECK_OK(dflash_head_load(dir, t, &ho, &h));
    const int32_t prompt[] = { 5, 6, 7, 8 };
    for (int host = 0; h && host < 2; host++) {
        setenv("DFLASH_HOST_DRAFTS", host ? "1" : "0", 1);
        dflash_levers_reload();
        dflash_kv_seq seqs[N];
        void *ps[N] = { 0 };
        dflash_spec_item items[N];
        int32_t out[N][8];
        for (int i = 0; i < N; i++) {
            CHECK_OK(dflash_qwen3_seq_init(t, &seqs[i]));
            CHECK_OK(h->proposer.ops->alloc_state(&h->proposer, 200, &ps[i]));
            dflash_gen_opts go;
            dflash_gen_default_opts(&go);
            go.n_new = 8;
            items[i] = (dflash_spec_item){ .seq = &seqs[i], .pstate = ps[i], .prompt = prompt, .n_prompt = 4,
                                           .opts = go, .out = out[i] };
        }
        int n_out = 0;
        dflash_gen_stats st;
        dflash_status s =
            dflash_spec_generate(t, &seqs[0], &h->proposer, ps[0], prompt, 4, &items[0].opts, out[0], &n_out, &st);
        CHECKF(s == DFLASH_ERR_NUMERIC, "host %d: %s (%s)", host, dflash_status_name(s), dflash_last_error());
        CHECKF(strstr(dflash_last_error(), dir) && strstr(dflash_last_error(), "drafter"), "host %d message: %s",
               host, dflash_last_error());
        dflash_qwen3_seq_free(t, &seqs[0]);
        CHECK_OK(dflash_qwen3_seq_init(t, &seqs[0]));
        CHECK_OK(h->proposer.ops->reset(&h->proposer, ps[0]));
        s = dflash_spec_generate_many(t, &h->proposer, items, N, 0, 0);
        CHECKF(s == DFLASH_ERR_NUMERIC, "batch, host %d: %s (%s)", host, dflash_status_name(s), dflash_last_error());
        CHECKF(strstr(dflash_last_error(), dir) && strstr(dflash_last_error(), "drafter"),
               "batch, host %d message: %s", host, dflash_last_error());
        for (int i = 0; i < N; i++) {
            h->proposer.ops->free_state(&h->proposer, ps[i]);
            dflash_qwen3_seq_free(t, &seqs[i]);
        }
    }
    unsetenv("DFLASH_HOST_DRAFTS");
    dflash_levers_reload();
    dflash_head_free(h);
    dflash_qwen3_free(t);
    remove_copy(dir);
}

/* A drafter weight holding a NaN loads as bf16 (the NaN would reach the
 * drafts, reported as above) but is refused when quantized to fp8, with
 * the folder, the tensor and the element named. */
static void test_fp8_quant_refuses_nan(void)
{
    char tdir[512], dir[64];
    poisoned_copy("dflash", "d2_tied", "layers.0.mlp.down_proj.weight", 192 + 5, dir); /* [96, 192]: element [1, 5] */
    CHECK(fx_drafter_target("d2_tied", tdir, sizeof tdir));
    dflash_qwen3 *t = NULL;
    CHECK_OK(dflash_qwen3_load(tdir, be, NULL, &t));
    for (int quant = 0; t && quant < 2; quant++) {
        dflash_head_opts ho;
        dflash_head_default_opts(&ho);
        ho.quant = quant ? DFLASH_QUANT_FP8_WEIGHTS : DFLASH_QUANT_BF16;
        dflash_head *h = NULL;
        const dflash_status s = dflash_head_load(dir, t, &ho, &h);
        if (!quant) {
            CHECKF(s == DFLASH_OK && h, "bf16: %s (%s)", dflash_status_name(s), dflash_last_error());
        } else {
            const char *e = dflash_last_error();
            CHECKF(s == DFLASH_ERR_NUMERIC && !h, "fp8: %s (%s)", dflash_status_name(s), e);
            CHECKF(strstr(e, dir) && strstr(e, "layers.0.mlp.down_proj.weight") && strstr(e, "[1, 5]") &&
                       strstr(e, "NaN"),
                   "fp8 message: %s", e);
        }
        dflash_head_free(h);
    }
    dflash_qwen3_free(t);
    remove_copy(dir);
}

/* A Qwen3-MoE whose router holds a NaN: every row's routing probabilities
 * are NaN, the experts chosen anyway (the first k), and the NaN reaches the
 * logits, which every loop path reports; no token comes out. */
static void test_moe_router_nan(void)
{
    char dir[64];
    poisoned_copy("qwen3_moe", "moe_experts", "model.layers.0.mlp.gate.weight", 0, dir);
    dflash_qwen3 *t = NULL;
    CHECK_OK(dflash_qwen3_load(dir, be, NULL, &t));
    if (t)
        expect_numeric_everywhere(t, dir);
    dflash_qwen3_free(t);
    remove_copy(dir);
}

int main(void)
{
    CHECK_OK(dflash_backend_cpu_create(&be));
    RUN(test_argmax_unusable_rows);
    RUN(test_linear_argmax_nan_weight);
    RUN(test_loop_reports_target);
    RUN(test_loop_reports_drafter);
    RUN(test_batch_sampled_reports_target);
    RUN(test_fp8_quant_refuses_nan);
    RUN(test_moe_router_nan);
    dflash_backend_destroy(be);
    TEST_END();
}
