/* test_slow_accept.c: acceptance itself, not only losslessness. A proposer
 * that drafts the target's own continuation must see every draft accepted
 * (a == k at every step), for every block size, greedy and with
 * penalties (repetition; frequency and presence, whose counts must take
 * in accepted drafts), one sequence or several stepped together; its
 * mirror, drafting tokens the target never picks, must see none accepted;
 * both must still produce exactly the plain output. A step cut short by
 * the budget must leave the caches ready for a continuing call. */
#include "harness.h"

#include "fixture.h"
#include "oracle_proposer.h"

#define N_NEW 60
#define N_PROMPT 24

static dflash_backend *be;

/* The oracle over SEQS copies of the prompt stepped together
 * (dflash_spec_generate_many: each row of a penalized block reads the
 * drafts before it where the batch's forward holds them): every output
 * equal to plain, every draft accepted. */
static void check_batch(dflash_qwen3 *t, const char *name, const int32_t *expect, int block,
                        const dflash_sampler_opts *pen)
{
    enum { SEQS = 3 };
    oracle o;
    oracle_init(&o, expect, N_PROMPT + N_NEW, t->cfg.vocab_size, block, 0);
    dflash_kv_seq seqs[SEQS];
    void *states[SEQS] = { 0 };
    int32_t out[SEQS][N_NEW];
    dflash_spec_item items[SEQS];
    for (int i = 0; i < SEQS; i++) {
        CHECK_OK(dflash_qwen3_seq_init(t, &seqs[i]));
        CHECK_OK(o.proposer.ops->alloc_state(&o.proposer, N_PROMPT + N_NEW + block, &states[i]));
        items[i] = (dflash_spec_item){ .seq = &seqs[i], .pstate = states[i], .prompt = expect,
                                       .n_prompt = N_PROMPT, .out = out[i] };
        dflash_gen_default_opts(&items[i].opts);
        items[i].opts.n_new = N_NEW;
        items[i].opts.sampler = *pen;
    }
    CHECK_OK(dflash_spec_generate_many(t, &o.proposer, items, SEQS, block, 0));
    for (int i = 0; i < SEQS; i++) {
        int64_t tried = 0, accepted = 0;
        for (int j = 0; j < block - 1; j++) {
            tried += items[i].stats.pos_tried[j];
            accepted += items[i].stats.pos_accepted[j];
        }
        CHECKF(items[i].n_out == N_NEW && !memcmp(out[i], expect + N_PROMPT, sizeof out[i]),
               "%s penalties %.1f / %.1f / %.1f, block %d, batch item %d: output differs from plain", name,
               pen->rep_penalty, pen->frequency_penalty, pen->presence_penalty, block, i);
        CHECKF(tried > 0 && accepted == tried, "%s block %d, batch item %d: %lld of %lld drafts accepted", name,
               block, i, (long long)accepted, (long long)tried);
        o.proposer.ops->free_state(&o.proposer, states[i]);
        dflash_qwen3_seq_free(t, &seqs[i]);
    }
}

static void check_model(const char *family, const char *name)
{
    char dir[512];
    dflash_qwen3_opts to;
    dflash_qwen3_default_opts(&to);
    to.max_ctx = 256;
    to.max_seqs = 3;
    to.kv_pages = 3 * 256 / DFLASH_KV_PAGE; /* check_batch's sequences */
    dflash_qwen3 *t = NULL;
    CHECK_OK(dflash_qwen3_load(fx_path(dir, sizeof dir, family, name), be, &to, &t));
    if (!t)
        return;
    const int V = t->cfg.vocab_size;
    int32_t expect[N_PROMPT + N_NEW];
    for (int i = 0; i < N_PROMPT; i++)
        expect[i] = (int32_t)((i * 37 + 5) % V);
    for (int k = 0; k < 3; k++) {
        dflash_sampler_opts pen;
        dflash_sampler_default_opts(&pen);
        pen.rep_penalty = k == 1 ? 1.3 : 1.0;
        pen.frequency_penalty = k == 2 ? 0.6 : 0.0;
        pen.presence_penalty = k == 2 ? 0.4 : 0.0;
        dflash_gen_stats st;
        int n_plain = 0;
        CHECK_OK(oracle_generate_pen(t, NULL, expect, N_PROMPT, N_NEW, 0, &pen, expect + N_PROMPT, &n_plain, &st));
        CHECKF(n_plain == N_NEW, "%s: plain run of %d tokens", name, n_plain);
        for (int block = 2; block <= 16; block++)
            for (int mirror = 0; mirror < 2; mirror++) {
                char msg[256];
                CHECKF(oracle_check(t, expect, N_PROMPT, N_NEW, block, &pen, mirror, msg, sizeof msg),
                       "%s penalties %.1f / %.1f / %.1f: %s", name, pen.rep_penalty, pen.frequency_penalty,
                       pen.presence_penalty, msg);
            }
        check_batch(t, name, expect, 4, &pen);
        check_batch(t, name, expect, 16, &pen);
    }
    dflash_qwen3_free(t);
}

/* A budget that ends a step part-way through its accepted block (the
 * oracle accepts everything, so the last step commits fewer tokens than it
 * verified), then a second call that continues the sequence (a chat
 * turn): the caches must hold exactly the committed tokens, so the second
 * call still has every draft accepted and equals plain decoding. */
static void test_continue_after_a_cut_step(void)
{
    enum { N1 = 10, N_TURN = 12, N2 = 20, BLOCK = 4 };
    char dir[512];
    dflash_qwen3_opts to;
    dflash_qwen3_default_opts(&to);
    to.max_ctx = 256;
    dflash_qwen3 *t = NULL;
    CHECK_OK(dflash_qwen3_load(fx_path(dir, sizeof dir, "qwen3", "gqa_tied"), be, &to, &t));
    if (!t)
        return;
    const int V = t->cfg.vocab_size;
    /* expect: prompt, turn 1's output but its last token, turn 2 (that
     * unverified token first), turn 2's output: the whole conversation */
    int32_t expect[N_PROMPT + N1 + N_TURN + N2], out1[N1], out2[N2];
    int n = 0, n1 = 0, n2 = 0;
    dflash_gen_stats st;
    for (int i = 0; i < N_PROMPT; i++)
        expect[i] = (int32_t)((i * 37 + 5) % V);
    CHECK_OK(oracle_generate(t, NULL, expect, N_PROMPT, N1, 0, 1.0, out1, &n1, &st));
    memcpy(expect + N_PROMPT, out1, (N1 - 1) * sizeof *out1);
    int32_t *turn = expect + N_PROMPT + N1 - 1;
    turn[0] = out1[N1 - 1];
    for (int i = 1; i < N_TURN; i++)
        turn[i] = (int32_t)((i * 53 + 11) % V);
    const int n_whole = N_PROMPT + N1 - 1 + N_TURN;
    CHECK_OK(oracle_generate(t, NULL, expect, n_whole, N2, 0, 1.0, expect + n_whole, &n, &st));
    CHECK(n1 == N1 && n == N2);

    oracle o;
    oracle_init(&o, expect, n_whole + N2, V, BLOCK, 0);
    dflash_kv_seq seq;
    void *state = NULL;
    dflash_gen_opts go;
    dflash_gen_default_opts(&go);
    go.block_size = BLOCK;
    CHECK_OK(dflash_qwen3_seq_init(t, &seq));
    CHECK_OK(o.proposer.ops->alloc_state(&o.proposer, n_whole + N2 + BLOCK, &state));
    go.n_new = N1;
    CHECK_OK(dflash_spec_generate(t, &seq, &o.proposer, state, expect, N_PROMPT, &go, out1, &n1, &st));
    CHECKF(n1 == N1 && memcmp(out1, expect + N_PROMPT, (N1 - 1) * sizeof *out1) == 0 && out1[N1 - 1] == turn[0],
           "turn 1 differs from plain");
    CHECKF(seq.len == N_PROMPT + N1 - 1, "after turn 1 the target cache holds %d positions, want %d", seq.len,
           N_PROMPT + N1 - 1);
    go.n_new = N2;
    CHECK_OK(dflash_spec_generate(t, &seq, &o.proposer, state, turn, N_TURN, &go, out2, &n2, &st));
    CHECKF(n2 == N2 && memcmp(out2, expect + n_whole, sizeof out2) == 0, "turn 2 differs from plain");
    int64_t tried = 0, accepted = 0;
    for (int i = 0; i < BLOCK - 1; i++) {
        tried += st.pos_tried[i];
        accepted += st.pos_accepted[i];
    }
    CHECKF(tried > 0 && accepted == tried, "turn 2: %lld of %lld drafts accepted", (long long)accepted,
           (long long)tried);
    o.proposer.ops->free_state(&o.proposer, state);
    dflash_qwen3_seq_free(t, &seq);
    dflash_qwen3_free(t);
}

static void test_oracle_accepts_everything(void)
{
    check_model("qwen3", "gqa_tied");
    check_model("qwen3", "mha_untied");
    check_model("qwen3_moe", "moe_experts");
}

int main(void)
{
    CHECK_OK(dflash_backend_cpu_create(&be));
    RUN(test_oracle_accepts_everything);
    RUN(test_continue_after_a_cut_step);
    dflash_backend_destroy(be);
    TEST_END();
}
