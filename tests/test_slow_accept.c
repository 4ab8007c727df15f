/* test_slow_accept.c: acceptance itself, not only losslessness. A proposer
 * that drafts the target's own continuation must see every draft accepted
 * (a == k at every step), for every block size, greedy and with a
 * repetition penalty (whose history must take in accepted drafts); its
 * mirror, drafting tokens the target never picks, must see none accepted;
 * both must still produce exactly the plain output. */
#include "harness.h"

#include "fixture.h"
#include "oracle_proposer.h"
#include "spec/spec.h"

#define N_NEW 60
#define N_PROMPT 24

static dflash_backend *be;

static int generate(dflash_qwen3 *t, dflash_proposer *p, const int32_t *prompt, int block, double penalty,
                    int32_t *out, dflash_gen_stats *st)
{
    dflash_kv_seq seq;
    void *state = NULL;
    int n_out = 0;
    dflash_gen_opts go;
    dflash_gen_default_opts(&go);
    go.n_new = N_NEW;
    go.block_size = block;
    go.sampler.rep_penalty = penalty;
    CHECK_OK(dflash_qwen3_seq_init(t, &seq));
    if (p)
        CHECK_OK(p->ops->alloc_state(p, N_PROMPT + N_NEW + DFLASH_MAX_BLOCK, &state));
    CHECK_OK(dflash_spec_generate(t, &seq, p, state, prompt, N_PROMPT, &go, out, &n_out, st));
    if (p)
        p->ops->free_state(p, state);
    dflash_qwen3_seq_free(t, &seq);
    return n_out;
}

static void check_model(const char *name)
{
    char dir[512];
    dflash_qwen3_opts to;
    dflash_qwen3_default_opts(&to);
    to.max_ctx = 256;
    dflash_qwen3 *t = NULL;
    CHECK_OK(dflash_qwen3_load(fx_path(dir, sizeof dir, "qwen3", name), be, &to, &t));
    if (!t)
        return;
    const int V = t->cfg.vocab_size;
    int32_t prompt[N_PROMPT], expect[N_PROMPT + N_NEW], out[N_NEW];
    for (int i = 0; i < N_PROMPT; i++)
        prompt[i] = (int32_t)((i * 37 + 5) % V);
    dflash_gen_stats st;
    for (int pen = 0; pen < 2; pen++) {
        const double penalty = pen ? 1.3 : 1.0;
        memcpy(expect, prompt, sizeof prompt);
        int n_plain = generate(t, NULL, prompt, 0, penalty, expect + N_PROMPT, &st);
        CHECKF(n_plain == N_NEW, "%s: plain run of %d tokens", name, n_plain);
        for (int block = 2; block <= 16; block++)
            for (int mirror = 0; mirror < 2; mirror++) {
                oracle o;
                oracle_init(&o, expect, N_PROMPT + N_NEW, V, block, mirror);
                int n = generate(t, &o.proposer, prompt, block, penalty, out, &st);
                CHECKF(n == N_NEW && memcmp(out, expect + N_PROMPT, sizeof out) == 0,
                       "%s penalty %.1f block %d %s: output differs from plain", name, penalty, block,
                       o.proposer.ops->name(&o.proposer));
                int64_t tried = 0, accepted = 0;
                for (int i = 0; i < block - 1; i++) {
                    tried += st.pos_tried[i];
                    accepted += st.pos_accepted[i];
                }
                CHECKF(tried > 0 && accepted == (mirror ? 0 : tried),
                       "%s penalty %.1f block %d %s: %lld of %lld drafts accepted", name, penalty, block,
                       o.proposer.ops->name(&o.proposer), (long long)accepted, (long long)tried);
                /* the oracle commits a whole block per step; its mirror one token */
                const int steps = mirror ? N_NEW - 1 : (N_NEW - 1 + block - 1) / block;
                CHECKF(st.n_steps == steps, "%s penalty %.1f block %d %s: %d steps, want %d", name, penalty, block,
                       o.proposer.ops->name(&o.proposer), st.n_steps, steps);
            }
    }
    dflash_qwen3_free(t);
}

static void test_oracle_accepts_everything(void)
{
    check_model("gqa_tied");
    check_model("mha_untied");
}

int main(void)
{
    CHECK_OK(dflash_backend_cpu_create(&be));
    RUN(test_oracle_accepts_everything);
    dflash_backend_destroy(be);
    TEST_END();
}
