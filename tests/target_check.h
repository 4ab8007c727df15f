/* target_check.h: what the target tests against transformers share
 * (header-only): forwarding rows of one sequence, and comparing a whole
 * prompt's logits and every layer's output, and a greedy generation, with
 * an expected.safetensors made by transformers. */
#ifndef DFLASH_TESTS_TARGET_CHECK_H
#define DFLASH_TESTS_TARGET_CHECK_H

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "fixture.h"
#include "spec/spec.h"
#include "target/qwen3.h"

#define TC_MAX_ROWS 256

/* The target fixture at "<test data>/<rel>" with room for max_rows rows a
 * forward, max_seqs sequences and 256 positions. */
static inline dflash_status tc_load(dflash_backend *be, const char *rel, int max_rows, int max_seqs, dflash_qwen3 **m)
{
    char dir[512];
    dflash_qwen3_opts o;
    dflash_qwen3_default_opts(&o);
    o.max_rows = max_rows;
    o.max_ctx = 256;
    o.max_seqs = max_seqs;
    return dflash_qwen3_load(fx_path(dir, sizeof dir, rel, NULL), be, &o, m);
}

/* The expectations beside the fixture "<test data>/<rel>" (NULL, with a
 * failed check, when they do not open); made by transformers, and
 * cross-checked by a second computation when `crosschecked`. */
static inline dflash_st *tc_open_expected(const char *rel, int crosschecked)
{
    char path[512];
    dflash_st *ex = NULL;
    snprintf(path, sizeof path, "%s/%s/expected.safetensors", test_data_dir(), rel);
    if (crosschecked)
        fx_check_provenance(path, "producer");
    else
        fx_check_producer(path, "producer");
    CHECK_OK(dflash_st_open(path, &ex));
    return ex;
}

/* Forward rows tokens[0..n) of one sequence from its current length
 * (logits of every row when want_logits). */
static inline dflash_status tc_run_rows(dflash_qwen3 *m, dflash_kv_seq *seq, const int32_t *tokens, int n,
                                        int want_logits, int n_taps, const int *taps, float **logits, float **tap_out)
{
    int32_t pos[TC_MAX_ROWS], row_seq[TC_MAX_ROWS], rows[TC_MAX_ROWS];
    if (n > TC_MAX_ROWS)
        return dflash_fail(DFLASH_ERR_INVALID_ARG, "tc_run_rows: %d rows, at most %d", n, TC_MAX_ROWS);
    for (int i = 0; i < n; i++) {
        pos[i] = seq->len + i;
        row_seq[i] = 0;
        rows[i] = i;
    }
    dflash_qwen3_batch b = { .n_rows = n, .tokens = tokens, .positions = pos, .row_seq = row_seq, .n_seqs = 1,
                             .seqs = &seq, .n_logit_rows = want_logits ? n : 0, .logit_rows = rows, .n_taps = n_taps,
                             .tap_layers = taps };
    return dflash_qwen3_forward(m, &b, logits, tap_out);
}

/* input_ids (at most max_T tokens) forwarded in one call, every layer
 * tapped: logits and each layer_out.<l> within relative L2 error `tol` of
 * the fixture's. */
static inline void tc_check_hf_outputs(dflash_qwen3 *m, const dflash_st *ex, const char *label, int max_T, double tol)
{
    int64_t T = 0;
    const int32_t *ids = fx_i32(ex, "input_ids", &T);
    const float *want = fx_f32(ex, "logits", NULL);
    const int L = m->cfg.num_hidden_layers, H = m->cfg.hidden_size, V = m->cfg.vocab_size;
    CHECKF(ids && want && T > 0 && T <= max_T && L <= DFLASH_MAX_TAPS, "%s: input_ids of %lld tokens, want 1..%d",
           label, (long long)T, max_T);
    if (!ids || !want || T <= 0 || T > max_T || L > DFLASH_MAX_TAPS)
        return;
    int taps[DFLASH_MAX_TAPS];
    for (int i = 0; i < L; i++)
        taps[i] = i;
    dflash_kv_seq seq;
    float *logits = NULL, *tap_out = NULL;
    CHECK_OK(dflash_qwen3_seq_init(m, &seq));
    CHECK_OK(tc_run_rows(m, &seq, ids, (int)T, 1, L, taps, &logits, &tap_out));
    if (logits) {
        double e = fx_rel_err(logits, want, (size_t)T * V);
        printf("  %s: logits rel err %.2e\n", label, e);
        CHECKF(e < tol, "%s logits rel err %g", label, e);
    }
    for (int l = 0; tap_out && l < L; l++) {
        char name[64];
        snprintf(name, sizeof name, "layer_out.%d", l);
        const float *hl = fx_f32(ex, name, NULL);
        if (!hl)
            continue;
        /* taps are [T, L*H]: layer l's slice of each row */
        double num = 0, den = 0;
        for (int t = 0; t < T; t++)
            for (int j = 0; j < H; j++) {
                double d = tap_out[(size_t)t * L * H + (size_t)l * H + j] - hl[(size_t)t * H + j];
                num += d * d;
                den += (double)hl[(size_t)t * H + j] * hl[(size_t)t * H + j];
            }
        double e = sqrt(num / den);
        CHECKF(e < tol, "%s layer %d rel err %g", label, l, e);
    }
    dflash_qwen3_seq_free(m, &seq);
}

/* n tokens after prompt by plain greedy decoding on a fresh sequence of m. */
static inline dflash_status tc_greedy(dflash_qwen3 *m, const int32_t *prompt, int n_prompt, int n, int32_t *out,
                                      int *n_out)
{
    dflash_kv_seq seq;
    dflash_gen_opts go;
    dflash_gen_stats st;
    dflash_gen_default_opts(&go);
    go.n_new = n;
    *n_out = 0;
    DFLASH_TRY(dflash_qwen3_seq_init(m, &seq));
    dflash_status s = dflash_spec_generate(m, &seq, NULL, NULL, prompt, n_prompt, &go, out, n_out, &st);
    dflash_qwen3_seq_free(m, &seq);
    return s;
}

/* greedy_ids (at most 64) after greedy_prompt, plain decoding. */
static inline void tc_check_hf_greedy(dflash_qwen3 *m, const dflash_st *ex, const char *label)
{
    int64_t P = 0, N = 0;
    const int32_t *prompt = fx_i32(ex, "greedy_prompt", &P), *want = fx_i32(ex, "greedy_ids", &N);
    CHECKF(prompt && want && N > 0 && N <= 64, "%s: greedy_ids of %lld tokens, want 1..64", label, (long long)N);
    if (!prompt || !want || N <= 0 || N > 64)
        return;
    int32_t out[64];
    int n_out = 0;
    CHECK_OK(tc_greedy(m, prompt, (int)P, (int)N, out, &n_out));
    CHECKF(n_out == N && memcmp(out, want, (size_t)N * sizeof(int32_t)) == 0, "%s greedy tokens differ from HF",
           label);
}

#endif
