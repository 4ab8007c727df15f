/* test_slow_qwen3.c: the CPU target against Hugging Face transformers
 * (fixtures from tools/fixtures/make_qwen3.py: logits, every layer's output,
 * greedy tokens; three Qwen3 geometries, a Qwen3 with YaRN RoPE and a Llama
 * with Llama 3.1's RoPE, both configs in the published rope_scaling form,
 * a Llama with attention and MLP biases, a Qwen3 with attention biases,
 * and two Qwen3-MoE: experts one tensor each with a dense layer, and
 * stacked experts on every second layer),
 * plus the row-independence property: a 16-row verify
 * equals 16 one-row decodes bit for bit, and chunked prefill equals one
 * forward. */
#include "harness.h"

#include "fixture.h"
#include "spec/spec.h"
#include "target_check.h"

/* <family>/<name> under the test data */
static const char *k_models[] = { "qwen3/mha_untied", "qwen3/gqa_tied", "qwen3/gqa_sharded", "qwen3/yarn_tied",
                                  "llama/llama31_gqa", "llama/llama_bias", "qwen3/qwen3_bias",
                                  "qwen3_moe/moe_experts", "qwen3_moe/moe_stacked" };
/* Relative L2 error allowed against transformers' f32 outputs: the errors
 * observed are 4e-7..1e-6 (summation order), so 1e-5 leaves a margin of
 * ten while a real mistake (a wrong eps, a missing norm, a RoPE slip) is
 * 1e-3 or more. */
#define TOL 1e-5
static dflash_backend *be;

static dflash_status load(const char *name, int max_rows, dflash_qwen3 **m)
{
    return tc_load(be, name, max_rows, 2, m);
}

/* The fixture's expectations of model k. */
static dflash_st *open_expected(size_t k) { return tc_open_expected(k_models[k], 1); }

static void test_logits_and_layers_match_hf(void)
{
    for (size_t k = 0; k < sizeof k_models / sizeof k_models[0]; k++) {
        dflash_qwen3 *m = NULL;
        CHECK_OK(load(k_models[k], 64, &m));
        dflash_st *ex = open_expected(k);
        if (m && ex)
            tc_check_hf_outputs(m, ex, k_models[k], 64, TOL);
        dflash_qwen3_free(m);
        dflash_st_close(ex);
    }
}

static void test_greedy_matches_hf(void)
{
    for (size_t k = 0; k < sizeof k_models / sizeof k_models[0]; k++) {
        dflash_qwen3 *m = NULL;
        CHECK_OK(load(k_models[k], 64, &m));
        dflash_st *ex = open_expected(k);
        if (m && ex)
            tc_check_hf_greedy(m, ex, k_models[k]);
        dflash_qwen3_free(m);
        dflash_st_close(ex);
    }
}

/* A 16-row verify equals 16 one-row decodes, bit for bit (logits and taps). */
static void test_verify_equals_decodes(void)
{
    for (size_t k = 0; k < sizeof k_models / sizeof k_models[0]; k++) {
        dflash_qwen3 *m = NULL;
        CHECK_OK(load(k_models[k], 64, &m));
        if (!m)
            continue;
        const int V = m->cfg.vocab_size, L = m->cfg.num_hidden_layers, H = m->cfg.hidden_size;
        int taps[2] = { 0, L - 1 };
        int32_t prompt[11], block[16];
        for (int i = 0; i < 11; i++)
            prompt[i] = (i * 37 + 5) % V;
        for (int i = 0; i < 16; i++)
            block[i] = (i * 101 + 7) % V;
        dflash_kv_seq a, b;
        float *logits, *tp;
        static float verify_logits[16 * 1024], verify_taps[16 * 2 * 256];
        CHECK_OK(dflash_qwen3_seq_init(m, &a));
        CHECK_OK(dflash_qwen3_seq_init(m, &b));
        CHECK_OK(tc_run_rows(m, &a, prompt, 11, 0, 0, NULL, &logits, NULL));
        CHECK_OK(tc_run_rows(m, &a, block, 16, 1, 2, taps, &logits, &tp));
        memcpy(verify_logits, logits, (size_t)16 * V * sizeof(float));
        memcpy(verify_taps, tp, (size_t)16 * 2 * H * sizeof(float));
        /* b: prompt fed in two chunks, then the block one row at a time */
        CHECK_OK(tc_run_rows(m, &b, prompt, 4, 0, 0, NULL, &logits, NULL));
        CHECK_OK(tc_run_rows(m, &b, prompt + 4, 7, 0, 0, NULL, &logits, NULL));
        int same = 1;
        for (int i = 0; i < 16; i++) {
            CHECK_OK(tc_run_rows(m, &b, block + i, 1, 1, 2, taps, &logits, &tp));
            same &= memcmp(logits, verify_logits + (size_t)i * V, (size_t)V * sizeof(float)) == 0;
            same &= memcmp(tp, verify_taps + (size_t)i * 2 * H, (size_t)2 * H * sizeof(float)) == 0;
        }
        CHECKF(same, "%s: verify rows differ from one-row decodes", k_models[k]);
        /* rollback: truncate, re-run the tail rows, same logits again */
        dflash_kv_seq_truncate(&a, 11 + 5);
        CHECK_OK(tc_run_rows(m, &a, block + 5, 11, 1, 0, NULL, &logits, NULL));
        CHECK(memcmp(logits, verify_logits + (size_t)5 * V, (size_t)11 * V * sizeof(float)) == 0);
        dflash_qwen3_seq_free(m, &a);
        dflash_qwen3_seq_free(m, &b);
        dflash_qwen3_free(m);
    }
}

static void test_bad_batches(void)
{
    dflash_qwen3 *m = NULL;
    CHECK_OK(load("qwen3/gqa_tied", 8, &m));
    if (!m)
        return;
    dflash_kv_seq seq;
    float *logits;
    CHECK_OK(dflash_qwen3_seq_init(m, &seq));
    int32_t bad_tok[1] = { m->cfg.vocab_size };
    CHECK_FAILS(tc_run_rows(m, &seq, bad_tok, 1, 1, 0, NULL, &logits, NULL), DFLASH_ERR_INVALID_ARG,
                "outside the vocabulary");
    int32_t many[9] = { 0 };
    CHECK_FAILS(tc_run_rows(m, &seq, many, 9, 1, 0, NULL, &logits, NULL), DFLASH_ERR_INVALID_ARG, "9 rows");
    int32_t tok[1] = { 1 }, pos[1] = { 3 }, rs[1] = { 0 }, lr[1] = { 0 };
    dflash_kv_seq *sp = &seq;
    dflash_qwen3_batch b = { .n_rows = 1, .tokens = tok, .positions = pos, .row_seq = rs, .n_seqs = 1, .seqs = &sp,
                             .n_logit_rows = 1, .logit_rows = lr };
    CHECK_FAILS(dflash_qwen3_forward(m, &b, &logits, NULL), DFLASH_ERR_INVALID_ARG, "expected 0");
    CHECK(seq.len == 0);
    dflash_qwen3_seq_free(m, &seq);
    dflash_qwen3_free(m);
}

/* Two sequences share a small pool: the one that runs out gets an error,
 * the other keeps its cache and goes on producing the same logits. */
static void test_pool_exhaustion_isolated(void)
{
    char dir[512];
    dflash_qwen3_opts o;
    dflash_qwen3_default_opts(&o);
    o.max_ctx = 256;
    o.max_seqs = 2;
    o.kv_pages = 3;
    dflash_qwen3 *m = NULL;
    CHECK_OK(dflash_qwen3_load(fx_path(dir, sizeof dir, "qwen3", "gqa_tied"), be, &o, &m));
    if (!m)
        return;
    const int V = m->cfg.vocab_size;
    int32_t toks[40];
    for (int i = 0; i < 40; i++)
        toks[i] = (i * 13 + 1) % V;
    dflash_kv_seq a, b;
    float *logits;
    CHECK_OK(dflash_qwen3_seq_init(m, &a));
    CHECK_OK(dflash_qwen3_seq_init(m, &b));
    CHECK_OK(tc_run_rows(m, &a, toks, 20, 0, 0, NULL, &logits, NULL)); /* 2 blocks */
    CHECK_FAILS(tc_run_rows(m, &b, toks, 40, 0, 0, NULL, &logits, NULL), DFLASH_ERR_KV_FULL, "kv pool exhausted");
    CHECK(b.len == 0 && a.len == 20);
    static float ref[1024];
    CHECK_OK(tc_run_rows(m, &a, toks + 20, 1, 1, 0, NULL, &logits, NULL));
    memcpy(ref, logits, (size_t)V * sizeof(float));
    /* rolled back and re-run, the row is the same */
    dflash_kv_seq_truncate(&a, 20);
    CHECK_OK(tc_run_rows(m, &a, toks + 20, 1, 1, 0, NULL, &logits, NULL));
    CHECK(memcmp(ref, logits, (size_t)V * sizeof(float)) == 0);
    /* the same 21 tokens from scratch in a fresh sequence, on the pages the
     * others held (freed, so the pool has room), give the same row: nothing
     * of the failed sequence or of the freed pages leaks into it */
    dflash_qwen3_seq_free(m, &b);
    dflash_qwen3_seq_free(m, &a);
    dflash_kv_seq c;
    CHECK_OK(dflash_qwen3_seq_init(m, &c));
    CHECK_OK(tc_run_rows(m, &c, toks, 21, 1, 0, NULL, &logits, NULL));
    CHECK(c.len == 21 && memcmp(ref, logits + (size_t)20 * V, (size_t)V * sizeof(float)) == 0);
    dflash_qwen3_seq_free(m, &c);
    dflash_qwen3_free(m);
}

/* The CPU backend with its uploads counted. */
static int g_uploads;
static dflash_status counting_upload(dflash_backend *b, void *dst, const void *src, size_t bytes)
{
    g_uploads++;
    return be->ops->upload(b, dst, src, bytes);
}

/* A forward sends its inputs (ids, positions, rows' sequences, the logit
 * rows, every sequence's records and page table; a hybrid's recurrent
 * entries too) in one upload, however many sequences it holds, and
 * computes what the plain backend does. */
static void one_upload(const char *rel)
{
    dflash_backend_ops ops = *be->ops;
    ops.upload = counting_upload;
    dflash_backend spy = { &ops, be->ctx };
    dflash_qwen3 *m = NULL, *ref = NULL;
    CHECK_OK(tc_load(&spy, rel, 8, 3, &m));
    CHECK_OK(tc_load(be, rel, 8, 3, &ref));
    if (!m || !ref)
        goto out;
    const int V = m->cfg.vocab_size;
    dflash_kv_seq s[3], r[3], *sp[3], *rp[3];
    for (int q = 0; q < 3; q++) {
        CHECK_OK(dflash_qwen3_seq_init(m, &s[q]));
        CHECK_OK(dflash_qwen3_seq_init(ref, &r[q]));
        sp[q] = &s[q];
        rp[q] = &r[q];
    }
    /* rows: sequence 0 three, 1 one, 2 two; logits of rows 2, 3, 5 */
    const int32_t tok[6] = { 5, 9, 13, 17, 21, 25 }, pos[6] = { 0, 1, 2, 0, 0, 1 }, rs[6] = { 0, 0, 0, 1, 2, 2 };
    const int32_t lr[3] = { 2, 3, 5 };
    dflash_qwen3_batch b = { .n_rows = 6, .tokens = tok, .positions = pos, .row_seq = rs, .n_seqs = 3, .seqs = sp,
                             .n_logit_rows = 3, .logit_rows = lr };
    float *logits = NULL, *want = NULL;
    g_uploads = 0;
    CHECK_OK(dflash_qwen3_forward(m, &b, &logits, NULL));
    CHECKF(g_uploads == 1, "%s: a forward of 3 sequences made %d uploads, not 1", rel, g_uploads);
    static float got[3 * 1024];
    CHECK((size_t)3 * V <= sizeof got / sizeof got[0]);
    if (logits && (size_t)3 * V <= sizeof got / sizeof got[0])
        memcpy(got, logits, (size_t)3 * V * sizeof(float));
    b.seqs = rp;
    CHECK_OK(dflash_qwen3_forward(ref, &b, &want, NULL));
    CHECKF(want && memcmp(got, want, (size_t)3 * V * sizeof(float)) == 0, "%s: logits differ", rel);
    for (int q = 0; q < 3; q++) {
        dflash_qwen3_seq_free(m, &s[q]);
        dflash_qwen3_seq_free(ref, &r[q]);
    }
out:
    dflash_qwen3_free(m);
    dflash_qwen3_free(ref);
}

static void test_one_upload_per_forward(void)
{
    one_upload("qwen3/gqa_tied");
    one_upload("qwen35/q35_dense");
}

int main(void)
{
    dflash_backend_cpu_create(&be);
    RUN(test_logits_and_layers_match_hf);
    RUN(test_greedy_matches_hf);
    RUN(test_verify_equals_decodes);
    RUN(test_bad_batches);
    RUN(test_pool_exhaustion_isolated);
    RUN(test_one_upload_per_forward);
    dflash_backend_destroy(be);
    TEST_END();
}
