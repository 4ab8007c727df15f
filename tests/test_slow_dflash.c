/* test_slow_dflash.c: the CPU DFlash draft head against the project's
 * independent PyTorch implementation of the algorithm (fixtures from
 * tools/fixtures/make_dflash.py): target taps, context K/V of every layer,
 * block logits and drafts with and without a context cap, and whole greedy
 * speculative runs step by step. Also: bad drafter folders fail clearly. */
#include "harness.h"

#include <jansson.h>
#include <unistd.h>

#include "draft/dflash_head.h"
#include "fixture.h"
#include "spec/spec.h"
#include "step_log.h"

static const char *k_drafters[] = { "d1_sharded", "d2_tied", "d3_sliding", "d4_llama", "d5_yarn", "d6_moe" };
/* Relative L2 error allowed against the reference's f32 outputs: observed
 * 4e-7..1e-6, so 1e-5 leaves a margin of ten. */
#define TOL 1e-5
static dflash_backend *be;

typedef struct pair {
    dflash_qwen3 *t;
    dflash_head *h;
    dflash_st *ex;
} pair;

static int open_pair(const char *drafter, int cap, int quant, pair *p)
{
    char tdir[512], ddir[512], ex[512];
    memset(p, 0, sizeof *p);
    CHECKF(fx_drafter_target(drafter, tdir, sizeof tdir), "%s: meta.json with a target", drafter);
    dflash_qwen3_opts to;
    dflash_qwen3_default_opts(&to);
    to.max_ctx = 256;
    CHECK_OK(dflash_qwen3_load(tdir, be, &to, &p->t));
    if (!p->t)
        return 0;
    dflash_head_opts ho;
    dflash_head_default_opts(&ho);
    ho.max_ctx = 256;
    ho.ctx_cap = cap;
    ho.quant = quant;
    CHECK_OK(dflash_head_load(fx_path(ddir, sizeof ddir, "dflash", drafter), p->t, &ho, &p->h));
    snprintf(ex, sizeof ex, "%s/dflash/%s/expected.safetensors", test_data_dir(), drafter);
    fx_check_provenance(ex, "target_by");
    CHECK_OK(dflash_st_open(ex, &p->ex));
    return p->h && p->ex;
}

static void close_pair(pair *p)
{
    dflash_head_free(p->h);
    dflash_qwen3_free(p->t);
    dflash_st_close(p->ex);
}

/* Prefill the target on `prompt` with the drafter's taps, feed the drafter. */
static void prefill(pair *p, dflash_kv_seq *seq, void *state, const int32_t *prompt, int n, float *taps_copy)
{
    const int *taps;
    int n_taps = p->h->proposer.ops->tap_layers(&p->h->proposer, &taps);
    int32_t pos[256], rs[256];
    for (int i = 0; i < n; i++) {
        pos[i] = i;
        rs[i] = 0;
    }
    dflash_qwen3_batch b = { .n_rows = n, .tokens = prompt, .positions = pos, .row_seq = rs, .n_seqs = 1,
                             .seqs = &seq, .n_taps = n_taps, .tap_layers = taps };
    float *logits, *tap_rows = NULL;
    CHECK_OK(dflash_qwen3_forward(p->t, &b, &logits, &tap_rows));
    if (!tap_rows)
        return;
    int64_t stride = (int64_t)n_taps * p->t->cfg.hidden_size;
    if (taps_copy)
        memcpy(taps_copy, tap_rows, (size_t)(n * stride) * sizeof(float));
    dflash_ctx_rows rows = { prompt, n, 0, tap_rows, stride };
    CHECK_OK(p->h->proposer.ops->begin(&p->h->proposer, state, &rows));
}

/* K (which 0) or V (1) of `pos` in layer `layer` of a drafter state (CPU
 * memory, f32 pool) as one row of n_kv_heads * head_dim values in `out`. */
static const float *kv_row(const dflash_head *h, const dflash_proposer_state *st, int layer, int which, int pos,
                           float *out)
{
    const dflash_kv_layout *kv = &h->kv.layout;
    const int D = kv->head_dim;
    int blk = st->kv.table[(pos / DFLASH_KV_PAGE) % st->kv.pt_len];
    for (int hd = 0; hd < kv->n_kv_heads; hd++) {
        int64_t page = (((int64_t)blk * kv->n_layers + layer) * 2 + which) * kv->n_kv_heads + hd;
        memcpy(out + hd * D, (const float *)kv->data + (page * DFLASH_KV_PAGE + pos % DFLASH_KV_PAGE) * D,
               (size_t)D * sizeof(float));
    }
    return out;
}

static void test_context_kv_and_block(void)
{
    for (size_t k = 0; k < sizeof k_drafters / sizeof k_drafters[0]; k++) {
        for (int capped = 0; capped < 2; capped++) {
            pair p;
            if (!open_pair(k_drafters[k], capped ? 7 : 0, 0, &p)) {
                close_pair(&p);
                continue;
            }
            int64_t T = 0;
            const int32_t *prompt = fx_i32(p.ex, "prompt_ids", &T);
            const dflash_tensor_info *taps_t = fx_tensor(p.ex, "taps");
            CHECKF(prompt && taps_t && T > 0 && T <= 64, "%s: prompt_ids of %lld tokens, want 1..64",
                   k_drafters[k], (long long)T);
            if (!prompt || !taps_t || T <= 0 || T > 64) {
                close_pair(&p);
                continue;
            }
            dflash_kv_seq seq;
            void *state;
            static float taps[64 * 64 * 16];
            CHECK_OK(dflash_qwen3_seq_init(p.t, &seq));
            CHECK_OK(p.h->proposer.ops->alloc_state(&p.h->proposer, 200, &state));
            prefill(&p, &seq, state, prompt, (int)T, taps);
            double e = fx_rel_err(taps, taps_t->data, (size_t)taps_t->numel);
            CHECKF(e < TOL, "%s taps rel err %g", k_drafters[k], e);
            const dflash_model_config *c = &p.h->cfg;
            const int row = c->num_key_value_heads * c->head_dim;
            dflash_proposer_state *st = state;
            for (int l = 0; !capped && l < c->num_hidden_layers; l++)
                for (int which = 0; which < 2; which++) {
                    char name[32];
                    snprintf(name, sizeof name, "ctx_%c.%d", which ? 'v' : 'k', l);
                    const float *want = fx_f32(p.ex, name, NULL);
                    if (!want)
                        continue;
                    static float got[64 * 1024];
                    for (int t = 0; t < T; t++)
                        kv_row(p.h, st, l, which, t, got + (size_t)t * row);
                    double ekv = fx_rel_err(got, want, (size_t)T * row);
                    CHECKF(ekv < TOL, "%s %s rel err %g", k_drafters[k], name, ekv);
                }
            if (capped)
                CHECK(st->kv.lo == T - 7);
            /* the block at s = T */
            const int32_t *last = fx_i32(p.ex, "block_last", NULL);
            const float *want = fx_f32(p.ex, capped ? "block_logits_cap" : "block_logits", NULL);
            const int32_t *want_d = fx_i32(p.ex, capped ? "block_drafts_cap" : "block_drafts", NULL);
            int32_t s = (int32_t)T, drafts[64];
            int nd = p.h->block_size - 1;
            if (last && want && want_d) {
                int32_t fused[64];
                CHECK_OK(p.h->proposer.ops->propose(&p.h->proposer, &state, 1, last, &s, nd, fused));
                p.h->keep_logits = 1;
                CHECK_OK(p.h->proposer.ops->propose(&p.h->proposer, &state, 1, last, &s, nd, drafts));
                CHECK(memcmp(fused, drafts, (size_t)nd * sizeof(int32_t)) == 0); /* fused LM head + argmax */
                double eb = fx_rel_err(dflash_head_last_logits(p.h), want, (size_t)nd * c->vocab_size);
                p.h->keep_logits = 0;
                printf("  %s cap %d: block logits rel err %.2e\n", k_drafters[k], capped ? 7 : 0, eb);
                CHECKF(eb < TOL, "%s block logits rel err %g", k_drafters[k], eb);
                CHECKF(memcmp(drafts, want_d, (size_t)nd * sizeof(int32_t)) == 0, "%s drafts differ", k_drafters[k]);
            }
            p.h->proposer.ops->free_state(&p.h->proposer, state);
            dflash_qwen3_seq_free(p.t, &seq);
            close_pair(&p);
        }
    }
}

/* Whole greedy speculative runs, step by step, against the reference. */
static void test_spec_runs_match_reference(void)
{
    for (size_t k = 0; k < sizeof k_drafters / sizeof k_drafters[0]; k++) {
        const int caps[2] = { 0, 5 };
        for (int ci = 0; ci < 2; ci++) {
            pair p;
            if (!open_pair(k_drafters[k], caps[ci], 0, &p)) {
                close_pair(&p);
                continue;
            }
            char name[64];
            int64_t P = 0, N = 0, S = 0;
            const int32_t *prompt = fx_i32(p.ex, "spec_prompt", &P);
            snprintf(name, sizeof name, "spec_out.cap%d", caps[ci]);
            const int32_t *want = fx_i32(p.ex, name, &N);
            snprintf(name, sizeof name, "spec_steps.cap%d", caps[ci]);
            const int32_t *steps = fx_i32(p.ex, name, &S);
            const int32_t *plain = fx_i32(p.ex, "greedy_plain", NULL);
            CHECKF(prompt && want && steps && plain && N > 0 && N <= 64, "%s: spec_out of %lld tokens, want 1..64",
                   k_drafters[k], (long long)N);
            if (!prompt || !want || !steps || !plain || N <= 0 || N > 64) {
                close_pair(&p);
                continue;
            }
            dflash_kv_seq seq;
            void *state;
            int32_t out[64];
            int n_out = 0;
            static step_log log;
            memset(&log, 0, sizeof log);
            dflash_gen_opts go;
            dflash_gen_stats st;
            dflash_gen_default_opts(&go);
            go.n_new = (int)N;
            go.on_step = step_log_add;
            go.step_user = &log;
            CHECK_OK(dflash_qwen3_seq_init(p.t, &seq));
            CHECK_OK(p.h->proposer.ops->alloc_state(&p.h->proposer, 200, &state));
            CHECK_OK(dflash_spec_generate(p.t, &seq, &p.h->proposer, state, prompt, (int)P, &go, out, &n_out, &st));
            CHECK(n_out == N);
            CHECKF(memcmp(out, want, (size_t)N * sizeof(int32_t)) == 0, "%s cap %d: output differs", k_drafters[k],
                   caps[ci]);
            CHECKF(memcmp(out, plain, (size_t)N * sizeof(int32_t)) == 0, "%s: output differs from plain", k_drafters[k]);
            /* steps: rows of (s, a, drafts[B-1] padded with -1) */
            const int B = p.h->block_size, width = 2 + B - 1, n_steps = (int)(S / width);
            CHECKF(st.n_steps == n_steps, "%s cap %d: %d steps, reference %d", k_drafters[k], caps[ci], st.n_steps,
                   n_steps);
            /* every step the loop reported against the reference's row: a
             * missing step or a short drafts list is a failure, not a
             * shorter check */
            CHECKF(log.n == n_steps, "%s cap %d: %d steps reported, %d steps", k_drafters[k], caps[ci], log.n, n_steps);
            for (int i = 0; i < log.n && i < n_steps; i++)
                CHECKF(step_log_matches(&log, i, steps + (size_t)i * width, B - 1),
                       "%s cap %d step %d: pos %d, %d drafts, %d accepted differ from the reference's", k_drafters[k],
                       caps[ci], i, log.steps[i].pos, log.steps[i].k, log.steps[i].accepted);
            p.h->proposer.ops->free_state(&p.h->proposer, state);
            dflash_qwen3_seq_free(p.t, &seq);
            close_pair(&p);
        }
    }
}

/* Make a copy of a drafter folder whose config.json is edited by `edit`. */
static void bad_folder(const char *drafter, void (*edit)(json_t *), char *dir_out)
{
    char src[512], cfg[600], link_src[600], link_dst[600];
    fx_path(src, sizeof src, "dflash", drafter);
    strcpy(dir_out, "/tmp/dflash_bad_XXXXXX");
    CHECK(mkdtemp(dir_out) != NULL);
    snprintf(cfg, sizeof cfg, "%s/config.json", src);
    json_error_t err;
    json_t *j = json_load_file(cfg, 0, &err);
    CHECK(j != NULL);
    if (!j)
        return;
    edit(j);
    snprintf(cfg, sizeof cfg, "%s/config.json", dir_out);
    json_dump_file(j, cfg, JSON_INDENT(1));
    json_decref(j);
    char *real = realpath(src, NULL);
    snprintf(link_src, sizeof link_src, "%s/model.safetensors", real);
    snprintf(link_dst, sizeof link_dst, "%s/model.safetensors", dir_out);
    CHECK(symlink(link_src, link_dst) == 0);
    free(real);
}

static void rm_folder(const char *dir)
{
    char p[600];
    snprintf(p, sizeof p, "%s/config.json", dir);
    unlink(p);
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    unlink(p);
    rmdir(dir);
}

static void edit_no_dflash_config(json_t *j)
{
    json_object_del(j, "dflash_config");
    json_object_set_new(j, "architectures", json_pack("[s]", "Qwen3ForCausalLM"));
}
static void edit_extra_tap(json_t *j)
{
    json_object_set_new(json_object_get(j, "dflash_config"), "target_layer_ids", json_pack("[i,i,i]", 0, 1, 2));
}
static void edit_tap_range(json_t *j)
{
    json_object_set_new(json_object_get(j, "dflash_config"), "target_layer_ids", json_pack("[i,i]", 0, 3));
}
static void edit_mask(json_t *j)
{
    json_object_set_new(json_object_get(j, "dflash_config"), "mask_token_id",
                        json_integer(json_integer_value(json_object_get(j, "vocab_size"))));
}

static void test_bad_drafter_folders(void)
{
    /* d2_tied: target gqa_tied (3 layers), taps [0, 2] */
    char tdir[512], dir[64];
    dflash_qwen3 *t = NULL;
    dflash_head *h = NULL;
    CHECK(fx_drafter_target("d2_tied", tdir, sizeof tdir));
    CHECK_OK(dflash_qwen3_load(tdir, be, NULL, &t));
    if (!t)
        return;
    const struct { void (*edit)(json_t *); dflash_status code; const char *needle; } cases[] = {
        { edit_no_dflash_config, DFLASH_ERR_FORMAT, "not a DFlash drafter" },
        { edit_extra_tap, DFLASH_ERR_SHAPE, "fc.weight" },
        { edit_tap_range, DFLASH_ERR_FORMAT, "target_layer_ids" },
        { edit_mask, DFLASH_ERR_FORMAT, "mask_token_id" },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        bad_folder("d2_tied", cases[i].edit, dir);
        CHECK_FAILS(dflash_head_load(dir, t, NULL, &h), cases[i].code, cases[i].needle);
        CHECK(h == NULL);
        rm_folder(dir);
    }
    dflash_qwen3_free(t);
}

/* fp8 weights (per-row scales) stay close to the bf16 drafter: block logits
 * within a few percent; exactness of the output is test_slow_spec's job. */
static void edit_causal(json_t *j) { json_object_set_new(j, "is_causal", json_true()); }
static void edit_not_causal(json_t *j) { json_object_set_new(j, "is_causal", json_false()); }

/* A causal drafter (is_causal: true) lets block row j see only rows 0..j,
 * so the first 3 drafts of a full block get exactly the logits of a
 * 4-row block; the published bidirectional drafters do not (their rows
 * see the masks after them), which shows the comparison can tell. */
static void test_causal_drafter(void)
{
    for (int causal = 0; causal < 2; causal++) {
        char dir[64], tdir[512];
        bad_folder("d2_tied", causal ? edit_causal : edit_not_causal, dir);
        CHECK(fx_drafter_target("d2_tied", tdir, sizeof tdir));
        pair p = { 0 };
        dflash_qwen3_opts to;
        dflash_qwen3_default_opts(&to);
        to.max_ctx = 256;
        CHECK_OK(dflash_qwen3_load(tdir, be, &to, &p.t));
        dflash_head_opts ho;
        dflash_head_default_opts(&ho);
        ho.max_ctx = 256;
        if (p.t)
            CHECK_OK(dflash_head_load(dir, p.t, &ho, &p.h));
        if (p.h) {
            CHECK(p.h->cfg.drafter_causal == causal);
            int32_t prompt[24], last = 7, s = 24, drafts[64];
            for (int i = 0; i < 24; i++)
                prompt[i] = (int32_t)((i * 13 + 5) % p.t->cfg.vocab_size);
            dflash_kv_seq seq;
            void *state;
            CHECK_OK(dflash_qwen3_seq_init(p.t, &seq));
            CHECK_OK(p.h->proposer.ops->alloc_state(&p.h->proposer, 200, &state));
            prefill(&p, &seq, state, prompt, 24, NULL);
            p.h->keep_logits = 1;
            const size_t V = (size_t)p.t->cfg.vocab_size, nd_short = 3;
            float *wide = malloc(nd_short * V * sizeof(float));
            CHECK_OK(p.h->proposer.ops->propose(&p.h->proposer, &state, 1, &last, &s, p.h->block_size - 1, drafts));
            memcpy(wide, dflash_head_last_logits(p.h), nd_short * V * sizeof(float));
            CHECK_OK(p.h->proposer.ops->propose(&p.h->proposer, &state, 1, &last, &s, (int)nd_short, drafts));
            int same = memcmp(wide, dflash_head_last_logits(p.h), nd_short * V * sizeof(float)) == 0;
            CHECKF(same == causal, "%s drafter: the first 3 rows of a %d-row block %s a 4-row block's",
                   causal ? "causal" : "bidirectional", p.h->block_size, same ? "equal" : "differ from");
            free(wide);
            p.h->proposer.ops->free_state(&p.h->proposer, state);
            dflash_qwen3_seq_free(p.t, &seq);
        }
        dflash_head_free(p.h);
        dflash_qwen3_free(p.t);
        rm_folder(dir);
    }
}

static void test_fp8_weights_close(void)
{
    for (size_t k = 0; k < sizeof k_drafters / sizeof k_drafters[0]; k++) {
        pair p;
        if (!open_pair(k_drafters[k], 0, DFLASH_QUANT_FP8_WEIGHTS, &p)) {
            close_pair(&p);
            continue;
        }
        CHECK(p.h->quant == DFLASH_QUANT_FP8_WEIGHTS && p.h->layers[0].lin_fp8[0].dtype == DFLASH_DTYPE_F8_E4M3);
        int64_t T = 0;
        const int32_t *prompt = fx_i32(p.ex, "prompt_ids", &T);
        const int32_t *last = fx_i32(p.ex, "block_last", NULL);
        const float *want = fx_f32(p.ex, "block_logits", NULL);
        if (!prompt || !last || !want || T > 64) {
            close_pair(&p);
            continue;
        }
        dflash_kv_seq seq;
        void *state;
        int32_t s = (int32_t)T, drafts[64];
        int nd = p.h->block_size - 1;
        CHECK_OK(dflash_qwen3_seq_init(p.t, &seq));
        CHECK_OK(p.h->proposer.ops->alloc_state(&p.h->proposer, 200, &state));
        prefill(&p, &seq, state, prompt, (int)T, NULL);
        p.h->keep_logits = 1;
        CHECK_OK(p.h->proposer.ops->propose(&p.h->proposer, &state, 1, last, &s, nd, drafts));
        double e = fx_rel_err(dflash_head_last_logits(p.h), want, (size_t)nd * p.h->cfg.vocab_size);
        printf("  %s fp8 weights: block logits rel err %.2e\n", k_drafters[k], e);
        CHECKF(e > 1e-6 && e < 0.1, "%s fp8 block logits rel err %g", k_drafters[k], e);
        p.h->proposer.ops->free_state(&p.h->proposer, state);
        dflash_qwen3_seq_free(p.t, &seq);
        close_pair(&p);
    }
}

/* The CPU backend with its uploads counted (the pair is opened on it). */
static int g_uploads;
static dflash_backend *g_cpu;
static dflash_status counting_upload(dflash_backend *b, void *dst, const void *src, size_t bytes)
{
    g_uploads++;
    return g_cpu->ops->upload(b, dst, src, bytes);
}

/* A drafter call sends its inputs (positions, rows' sequences, ids, the
 * drafted rows, records, page tables) in one upload: a context pass and
 * a block forward each make exactly one. */
static void test_one_upload_per_call(void)
{
    dflash_backend_ops ops = *be->ops;
    ops.upload = counting_upload;
    dflash_backend spy = { &ops, be->ctx };
    g_cpu = be;
    be = &spy;
    pair p;
    const int ok = open_pair("d2_tied", 0, 0, &p);
    be = g_cpu;
    int64_t T = 0;
    const int32_t *prompt = ok ? fx_i32(p.ex, "prompt_ids", &T) : NULL;
    if (prompt && T > 0 && T <= 64) {
        dflash_kv_seq seq, *sp = &seq;
        void *state;
        CHECK_OK(dflash_qwen3_seq_init(p.t, &seq));
        CHECK_OK(p.h->proposer.ops->alloc_state(&p.h->proposer, 200, &state));
        const int *taps;
        const int n_taps = p.h->proposer.ops->tap_layers(&p.h->proposer, &taps);
        int32_t pos[64], rs[64];
        for (int i = 0; i < T; i++)
            pos[i] = i, rs[i] = 0;
        dflash_qwen3_batch b = { .n_rows = (int)T, .tokens = prompt, .positions = pos, .row_seq = rs, .n_seqs = 1,
                                 .seqs = &sp, .n_taps = n_taps, .tap_layers = taps };
        float *logits, *tap_rows = NULL;
        CHECK_OK(dflash_qwen3_forward(p.t, &b, &logits, &tap_rows));
        dflash_ctx_rows rows = { prompt, (int)T, 0, tap_rows, (int64_t)n_taps * p.t->cfg.hidden_size };
        g_uploads = 0;
        CHECK_OK(p.h->proposer.ops->begin(&p.h->proposer, state, &rows));
        CHECKF(g_uploads == 1, "a context pass made %d uploads, not 1", g_uploads);
        int32_t last = prompt[T - 1], at = (int32_t)T, drafts[64];
        g_uploads = 0;
        CHECK_OK(p.h->proposer.ops->propose(&p.h->proposer, &state, 1, &last, &at, p.h->block_size - 1, drafts));
        CHECKF(g_uploads == 1, "a block forward made %d uploads, not 1", g_uploads);
        p.h->proposer.ops->free_state(&p.h->proposer, state);
        dflash_qwen3_seq_free(p.t, &seq);
    }
    close_pair(&p);
}

int main(void)
{
    dflash_backend_cpu_create(&be);
    RUN(test_context_kv_and_block);
    RUN(test_spec_runs_match_reference);
    RUN(test_bad_drafter_folders);
    RUN(test_fp8_weights_close);
    RUN(test_causal_drafter);
    RUN(test_one_upload_per_call);
    dflash_backend_destroy(be);
    TEST_END();
}
