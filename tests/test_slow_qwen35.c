/* test_slow_qwen35.c: the CPU Qwen3.5 hybrid target (Gated DeltaNet
 * linear attention and gated full attention; dense and MoE with a shared
 * expert, in the multimodal folder layout and text-only with the shared
 * expert as wide as the routed ones, i.e. run as one of them) against Hugging Face
 * transformers (fixtures from tools/fixtures/make_qwen35.py: logits and
 * every layer's output over 80 tokens, greedy tokens), and the properties
 * speculative decoding over a recurrent state rests on: a row's result
 * does not depend on how rows are split into forwards (one prefill, chunks,
 * a verify, one-row decodes: the same bits), a truncation inside the last
 * forward's rows resumes exactly where a run that never went past it
 * would be, and speculative output equals plain output, with a DFlash
 * drafter and with oracles whose drafts are all right, all wrong, or right
 * for the first few of each block. */
#include "harness.h"

#include "draft/dflash_head.h"
#include "fixture.h"
#include "oracle_proposer.h"
#include "spec/spec.h"
#include "target_check.h"

static const char *const k_models[] = { "q35_dense", "q35_moe_mm", "q35_moe_text" };
/* Relative L2 error allowed against transformers' f32 outputs. Both run
 * the chunked form of the delta rule (chunks of 64), with other
 * summation orders (observed differences ~5e-6); a real mistake (a
 * missing 1 + w, a wrong gate, a RoPE slip) is 1e-3 or more. */
#define TOL 1e-5
#define T_MAX 96
static dflash_backend *be;

static dflash_status load(const char *name, int max_rows, int max_seqs, dflash_qwen3 **m)
{
    char rel[96];
    snprintf(rel, sizeof rel, "qwen35/%s", name);
    return tc_load(be, rel, max_rows, max_seqs, m);
}

/* The fixture's expectations of model k (made by transformers; these
 * have no second computation to cross-check). */
static dflash_st *open_expected(size_t k)
{
    char rel[96];
    snprintf(rel, sizeof rel, "qwen35/%s", k_models[k]);
    return tc_open_expected(rel, 0);
}

/* 80 tokens in one forward (past the first chunk of the delta rule). */
static void test_logits_and_layers_match_hf(void)
{
    for (size_t k = 0; k < sizeof k_models / sizeof k_models[0]; k++) {
        dflash_qwen3 *m = NULL;
        CHECK_OK(load(k_models[k], T_MAX, 1, &m));
        dflash_st *ex = open_expected(k);
        if (m && ex)
            tc_check_hf_outputs(m, ex, k_models[k], T_MAX, TOL);
        /* the text fixture's shared expert (as wide as the routed ones)
         * runs joined to them on every sparse layer, the multimodal
         * one's (wider) apart: both paths are the ones checked here */
        const int want_joined = !strcmp(k_models[k], "q35_moe_text");
        for (int l = 0; m && l < m->cfg.num_hidden_layers; l++)
            if (m->layers[l].moe.experts)
                CHECKF(m->layers[l].moe.shared_joined == want_joined, "%s layer %d: shared expert joined %d",
                       k_models[k], l, m->layers[l].moe.shared_joined);
        dflash_qwen3_free(m);
        dflash_st_close(ex);
    }
}

static void test_greedy_matches_hf(void)
{
    for (size_t k = 0; k < sizeof k_models / sizeof k_models[0]; k++) {
        dflash_qwen3 *m = NULL;
        CHECK_OK(load(k_models[k], 64, 1, &m));
        dflash_st *ex = open_expected(k);
        if (m && ex)
            tc_check_hf_greedy(m, ex, k_models[k]);
        dflash_qwen3_free(m);
        dflash_st_close(ex);
    }
}

/* However the rows are split into forwards (one prefill of 50, chunks of
 * 7, a 16-row verify, one-row decodes, a prefill longer than the rows a
 * forward keeps for taking back), every row's logits and taps are the same
 * bits; and truncating inside a forward's rows then going on gives the
 * rows a run that stopped there gives. */
static void test_row_splits_and_rollback(void)
{
    enum { P = 50, B = 16 };
    for (size_t k = 0; k < sizeof k_models / sizeof k_models[0]; k++) {
        dflash_qwen3 *m = NULL;
        CHECK_OK(load(k_models[k], 64, 2, &m));
        if (!m)
            continue;
        const int V = m->cfg.vocab_size, L = m->cfg.num_hidden_layers, H = m->cfg.hidden_size;
        int taps[2] = { 0, L - 1 };
        int32_t toks[P + B];
        for (int i = 0; i < P + B; i++)
            toks[i] = (i * 37 + 5) % V;
        static float ref_logits[(P + B) * 512], ref_taps[(P + B) * 2 * 64];
        CHECK(V <= 512 && H <= 64);
        dflash_kv_seq a, b;
        float *logits, *tp;
        CHECK_OK(dflash_qwen3_seq_init(m, &a));
        CHECK_OK(dflash_qwen3_seq_init(m, &b));
        /* a: the prompt in one forward, the block as a verify */
        CHECK_OK(tc_run_rows(m, &a, toks, P, 1, 2, taps, &logits, &tp));
        memcpy(ref_logits, logits, (size_t)P * V * sizeof(float));
        memcpy(ref_taps, tp, (size_t)P * 2 * H * sizeof(float));
        CHECK_OK(tc_run_rows(m, &a, toks + P, B, 1, 2, taps, &logits, &tp));
        memcpy(ref_logits + (size_t)P * V, logits, (size_t)B * V * sizeof(float));
        memcpy(ref_taps + (size_t)P * 2 * H, tp, (size_t)B * 2 * H * sizeof(float));
        /* b: chunks of 7, then one row at a time */
        int same = 1;
        for (int i = 0; i < P + B;) {
            const int n = i < P ? (P - i < 7 ? P - i : 7) : 1;
            CHECK_OK(tc_run_rows(m, &b, toks + i, n, 1, 2, taps, &logits, &tp));
            same &= memcmp(logits, ref_logits + (size_t)i * V, (size_t)n * V * sizeof(float)) == 0;
            same &= memcmp(tp, ref_taps + (size_t)i * 2 * H, (size_t)n * 2 * H * sizeof(float)) == 0;
            i += n;
        }
        CHECKF(same, "%s: rows split differently give different bits", k_models[k]);
        /* rollbacks of a: keep 5 of the verify's rows and go on, then none */
        dflash_kv_seq_truncate(&a, P + 5);
        CHECK_OK(tc_run_rows(m, &a, toks + P + 5, B - 5, 1, 0, NULL, &logits, NULL));
        CHECKF(memcmp(logits, ref_logits + (size_t)(P + 5) * V, (size_t)(B - 5) * V * sizeof(float)) == 0,
               "%s: resumed inside the kept rows, the rows differ", k_models[k]);
        dflash_kv_seq_truncate(&a, P + 5);
        CHECK_OK(tc_run_rows(m, &a, toks + P + 5, 3, 1, 0, NULL, &logits, NULL));
        CHECK(memcmp(logits, ref_logits + (size_t)(P + 5) * V, (size_t)3 * V * sizeof(float)) == 0);
        /* further back than the last forward's rows: refused */
        dflash_kv_seq_truncate(&a, 2);
        CHECK_FAILS(tc_run_rows(m, &a, toks + 2, 1, 1, 0, NULL, &logits, NULL), DFLASH_ERR_INVALID_ARG,
                    "recurrent state can resume only at");
        /* back to the start: a fresh state, the same rows again */
        dflash_kv_seq_truncate(&a, 0);
        CHECK_OK(tc_run_rows(m, &a, toks, 9, 1, 0, NULL, &logits, NULL));
        CHECK(memcmp(logits, ref_logits, (size_t)9 * V * sizeof(float)) == 0);
        dflash_qwen3_seq_free(m, &a);
        dflash_qwen3_seq_free(m, &b);
        dflash_qwen3_free(m);
    }
}

/* Model `name` (max_rows T_MAX, two sequences) with two fresh sequences
 * a and b on it, and toks[i] = (i * mul + add) % vocabulary for i < n;
 * NULL when it does not load. */
static dflash_qwen3 *two_fresh(const char *name, int32_t *toks, int n, int mul, int add, dflash_kv_seq *a,
                               dflash_kv_seq *b)
{
    dflash_qwen3 *m = NULL;
    CHECK_OK(load(name, T_MAX, 2, &m));
    if (!m)
        return NULL;
    for (int i = 0; i < n; i++)
        toks[i] = (i * mul + add) % m->cfg.vocab_size;
    CHECK_OK(dflash_qwen3_seq_init(m, a));
    CHECK_OK(dflash_qwen3_seq_init(m, b));
    return m;
}

static void two_free(dflash_qwen3 *m, dflash_kv_seq *a, dflash_kv_seq *b)
{
    dflash_qwen3_seq_free(m, a);
    dflash_qwen3_seq_free(m, b);
    dflash_qwen3_free(m);
}

/* A prefill of more rows than can be taken back (90 of 65): its last 65
 * rows can still be taken back, and the result is the one-row result. */
static void test_long_forward_keeps_its_tail(void)
{
    enum { N = 90 };
    int32_t toks[N];
    dflash_kv_seq a, b;
    dflash_qwen3 *m = two_fresh("q35_dense", toks, N, 11, 3, &a, &b);
    if (!m)
        return;
    const int V = m->cfg.vocab_size;
    static float ref[N * 512];
    float *logits;
    CHECK_OK(tc_run_rows(m, &b, toks, 40, 1, 0, NULL, &logits, NULL));
    memcpy(ref, logits, (size_t)40 * V * sizeof(float));
    CHECK_OK(tc_run_rows(m, &b, toks + 40, N - 40, 1, 0, NULL, &logits, NULL));
    memcpy(ref + (size_t)40 * V, logits, (size_t)(N - 40) * V * sizeof(float));
    CHECK_OK(tc_run_rows(m, &a, toks, N, 1, 0, NULL, &logits, NULL));
    CHECK(memcmp(logits, ref, (size_t)N * V * sizeof(float)) == 0);
    /* 90 rows, 65 kept: positions 25..90 can resume, 24 cannot */
    dflash_kv_seq_truncate(&a, 30);
    CHECK_OK(tc_run_rows(m, &a, toks + 30, 4, 1, 0, NULL, &logits, NULL));
    CHECK(memcmp(logits, ref + (size_t)30 * V, (size_t)4 * V * sizeof(float)) == 0);
    dflash_kv_seq_truncate(&a, 24);
    CHECK_FAILS(tc_run_rows(m, &a, toks + 24, 1, 1, 0, NULL, &logits, NULL), DFLASH_ERR_INVALID_ARG,
                "can resume only at 30..34");
    two_free(m, &a, &b);
}

/* 250 rows, past the rows a record keeps by position (128) and the chunk
 * states it keeps (3 of 64 rows): forwards of 90, 90 and 70 rows give the
 * bits of a 20-row prefill and one-row decodes, and taking back the last
 * 64 rows (to 186: its chunk started at 128, the next starts at 192)
 * resumes exactly. */
static void test_long_sequence_reuses_records(void)
{
    enum { N = 250 };
    int32_t toks[N];
    dflash_kv_seq a, b;
    dflash_qwen3 *m = two_fresh("q35_moe_mm", toks, N, 37, 11, &a, &b);
    if (!m)
        return;
    const int V = m->cfg.vocab_size;
    static float ref[N * 512];
    float *logits;
    for (int i = 0; i < N; i += 90) {
        const int n = N - i < 90 ? N - i : 90;
        CHECK_OK(tc_run_rows(m, &a, toks + i, n, 1, 0, NULL, &logits, NULL));
        if (logits)
            memcpy(ref + (size_t)i * V, logits, (size_t)n * V * sizeof(float));
    }
    int same = 1;
    for (int i = 0; i < N && same;) {
        const int n = i ? 1 : 20;
        CHECK_OK(tc_run_rows(m, &b, toks + i, n, 1, 0, NULL, &logits, NULL));
        same = logits && memcmp(logits, ref + (size_t)i * V, (size_t)n * V * sizeof(float)) == 0;
        i += n;
    }
    CHECKF(same, "250 rows: one-row decodes differ from forwards of 90");
    dflash_kv_seq_truncate(&a, 186);
    CHECK_OK(tc_run_rows(m, &a, toks + 186, 64, 1, 0, NULL, &logits, NULL));
    CHECK(logits && memcmp(logits, ref + (size_t)186 * V, (size_t)64 * V * sizeof(float)) == 0);
    two_free(m, &a, &b);
}

/* A fresh sequence forwards toks[0..n), is taken back to `back` and
 * forwards `more` rows from there: their logits into out. */
static void alone_rows(dflash_qwen3 *m, const int32_t *toks, int n, int back, int more, float *out)
{
    dflash_kv_seq q;
    float *logits = NULL;
    CHECK_OK(dflash_qwen3_seq_init(m, &q));
    CHECK_OK(tc_run_rows(m, &q, toks, n, 0, 0, NULL, &logits, NULL));
    dflash_kv_seq_truncate(&q, back);
    CHECK_OK(tc_run_rows(m, &q, toks + back, more, 1, 0, NULL, &logits, NULL));
    if (logits)
        memcpy(out, logits, (size_t)more * m->cfg.vocab_size * sizeof(float));
    dflash_qwen3_seq_free(m, &q);
}

/* Two sequences in one forward, one longer than the rows that can be
 * taken back and one short, then each taken back and continued together:
 * every row equals the same sequence run alone. */
static void test_two_sequences_in_one_forward(void)
{
    enum { NA = 80, NB = 6, MORE = 3 };
    dflash_qwen3 *m = NULL;
    CHECK_OK(load("q35_moe_mm", T_MAX, 4, &m));
    if (!m)
        return;
    const int V = m->cfg.vocab_size;
    int32_t ta[NA + MORE], tb[NB + MORE];
    for (int i = 0; i < NA + MORE; i++)
        ta[i] = (i * 29 + 7) % V;
    for (int i = 0; i < NB + MORE; i++)
        tb[i] = (i * 53 + 2) % V;
    /* alone: a's 80 rows, then (taken back to 70) 3 more; b's 6, then (back to 4) 3 more */
    static float alone_a[MORE * 512], alone_b[MORE * 512], both[2 * MORE * 512];
    alone_rows(m, ta, NA, 70, MORE, alone_a);
    alone_rows(m, tb, NB, 4, MORE, alone_b);
    dflash_kv_seq a, b;
    float *logits;
    /* together */
    CHECK_OK(dflash_qwen3_seq_init(m, &a));
    CHECK_OK(dflash_qwen3_seq_init(m, &b));
    dflash_kv_seq *seqs[2] = { &a, &b };
    int32_t tok[NA + NB], pos[NA + NB], rs[NA + NB], sel[2 * MORE];
    for (int i = 0; i < NA + NB; i++) {
        tok[i] = i < NA ? ta[i] : tb[i - NA];
        pos[i] = i < NA ? i : i - NA;
        rs[i] = i >= NA;
    }
    dflash_qwen3_batch bt = { .n_rows = NA + NB, .tokens = tok, .positions = pos, .row_seq = rs, .n_seqs = 2,
                              .seqs = seqs };
    CHECK_OK(dflash_qwen3_forward(m, &bt, &logits, NULL));
    dflash_kv_seq_truncate(&a, 70);
    dflash_kv_seq_truncate(&b, 4);
    for (int i = 0; i < 2 * MORE; i++) {
        tok[i] = i < MORE ? ta[70 + i] : tb[4 + i - MORE];
        pos[i] = i < MORE ? 70 + i : 4 + i - MORE;
        rs[i] = i >= MORE;
        sel[i] = i;
    }
    dflash_qwen3_batch b2 = { .n_rows = 2 * MORE, .tokens = tok, .positions = pos, .row_seq = rs, .n_seqs = 2,
                              .seqs = seqs, .n_logit_rows = 2 * MORE, .logit_rows = sel };
    CHECK_OK(dflash_qwen3_forward(m, &b2, &logits, NULL));
    if (logits)
        memcpy(both, logits, (size_t)2 * MORE * V * sizeof(float));
    CHECK(memcmp(both, alone_a, (size_t)MORE * V * sizeof(float)) == 0);
    CHECK(memcmp(both + (size_t)MORE * V, alone_b, (size_t)MORE * V * sizeof(float)) == 0);
    dflash_qwen3_seq_free(m, &a);
    dflash_qwen3_seq_free(m, &b);
    dflash_qwen3_free(m);
}

/* Speculative output equals plain output: a DFlash drafter (d6_moe's
 * weights: hidden 64, vocabulary 512, taps 1 and 3, which fit these
 * targets) at several block sizes and context caps, and the oracle and
 * its mirror (every draft accepted; none). */
static void test_spec_equals_plain(void)
{
    const int blocks[] = { 2, 4, 16 }, caps[] = { 0, 16 };
    for (size_t k = 0; k < sizeof k_models / sizeof k_models[0]; k++) {
        dflash_qwen3 *t = NULL;
        CHECK_OK(load(k_models[k], 32, 1, &t));
        if (!t)
            continue;
        enum { NP = 40, NN = 60 };
        int32_t seq[NP + NN], out[NN];
        int n_plain = 0, n_out;
        dflash_gen_stats st;
        for (int i = 0; i < NP; i++)
            seq[i] = (int32_t)(((i % 7) * 31 + (i / 21) + 3) % t->cfg.vocab_size);
        CHECK_OK(oracle_generate(t, NULL, seq, NP, NN, 0, 1.0, seq + NP, &n_plain, &st));
        CHECK(n_plain == NN);
        char ddir[512];
        fx_path(ddir, sizeof ddir, "dflash", "d6_moe");
        for (size_t bi = 0; bi < sizeof blocks / sizeof blocks[0]; bi++)
            for (size_t ci = 0; ci < sizeof caps / sizeof caps[0]; ci++) {
                dflash_head_opts ho;
                dflash_head_default_opts(&ho);
                ho.max_ctx = 256;
                ho.ctx_cap = caps[ci];
                ho.block_size = blocks[bi];
                dflash_head *h = NULL;
                CHECK_OK(dflash_head_load(ddir, t, &ho, &h));
                if (!h)
                    continue;
                CHECK_OK(oracle_generate(t, &h->proposer, seq, NP, NN, blocks[bi], 1.0, out, &n_out, &st));
                CHECKF(n_out == NN && memcmp(out, seq + NP, sizeof out) == 0,
                       "%s drafter block %d cap %d: speculative output differs", k_models[k], blocks[bi], caps[ci]);
                dflash_head_free(h);
            }
        /* partly right drafts: every step keeps `right` of 8 drafts and
         * takes the other rows of its verify back */
        for (int right = 1; right < 8; right += 3) {
            oracle po;
            oracle_init_partial(&po, seq, NP + NN, t->cfg.vocab_size, 8, right);
            memset(&st, 0, sizeof st);
            CHECK_OK(oracle_generate(t, &po.proposer, seq, NP, NN, 8, 1.0, out, &n_out, &st));
            CHECKF(n_out == NN && memcmp(out, seq + NP, sizeof out) == 0 && st.pos_accepted[right - 1] > 0 &&
                       st.pos_accepted[right] == 0,
                   "%s partial oracle (%d of 8 right): output differs, or not %d drafts a step accepted", k_models[k],
                   right, right);
        }
        char msg[256];
        for (int mirror = 0; mirror < 2; mirror++)
            for (int block = 4; block <= 16; block *= 4)
                CHECKF(oracle_check(t, seq, NP, NN, block, NULL, mirror, msg, sizeof msg), "%s: %s", k_models[k],
                       msg);
        dflash_qwen3_free(t);
    }
}

/* Records: a target of max_seqs 1 holds one sequence's state at a time. */
static void test_state_records(void)
{
    dflash_qwen3 *m = NULL;
    CHECK_OK(load("q35_dense", 8, 1, &m));
    if (!m)
        return;
    dflash_kv_seq a, b;
    CHECK_OK(dflash_qwen3_seq_init(m, &a));
    CHECK_FAILS(dflash_qwen3_seq_init(m, &b), DFLASH_ERR_KV_FULL, "recurrent states of all 1 sequences it holds");
    dflash_qwen3_seq_free(m, &a);
    CHECK_OK(dflash_qwen3_seq_init(m, &b));
    dflash_qwen3_seq_free(m, &b);
    dflash_qwen3_free(m);
}

/* A backend without the linear-attention primitives is refused by name
 * (here the CPU's ops under another name, one of them missing). */
static void test_backend_without_primitives_refused(void)
{
    char dir[512];
    fx_path(dir, sizeof dir, "qwen35", "q35_dense");
    dflash_backend_ops ops = *be->ops;
    ops.name = "other";
    ops.delta_rule = NULL;
    dflash_backend other = { &ops, be->ctx };
    dflash_qwen3 *m = NULL;
    CHECK_FAILS(dflash_qwen3_load(dir, &other, NULL, &m), DFLASH_ERR_UNSUPPORTED,
                "needs the linear-attention primitives (conv_silu, delta_rule, sigmoid_mul), which the other backend "
                "does not have");
}

int main(void)
{
    dflash_backend_cpu_create(&be);
    RUN(test_logits_and_layers_match_hf);
    RUN(test_greedy_matches_hf);
    RUN(test_row_splits_and_rollback);
    RUN(test_long_forward_keeps_its_tail);
    RUN(test_long_sequence_reuses_records);
    RUN(test_two_sequences_in_one_forward);
    RUN(test_spec_equals_plain);
    RUN(test_state_records);
    RUN(test_backend_without_primitives_refused);
    dflash_backend_destroy(be);
    TEST_END();
}
