/* test_slow_accept.c: acceptance itself, not only losslessness. A proposer
 * that drafts the target's own continuation must see every draft accepted
 * (a == k at every step), for every block size, greedy and with a
 * repetition penalty (whose history must take in accepted drafts); its
 * mirror, drafting tokens the target never picks, must see none accepted;
 * both must still produce exactly the plain output. */
#include "harness.h"

#include "fixture.h"
#include "oracle_proposer.h"

#define N_NEW 60
#define N_PROMPT 24

static dflash_backend *be;

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
    int32_t expect[N_PROMPT + N_NEW];
    for (int i = 0; i < N_PROMPT; i++)
        expect[i] = (int32_t)((i * 37 + 5) % V);
    for (int pen = 0; pen < 2; pen++) {
        const double penalty = pen ? 1.3 : 1.0;
        dflash_gen_stats st;
        int n_plain = 0;
        CHECK_OK(oracle_generate(t, NULL, expect, N_PROMPT, N_NEW, 0, penalty, expect + N_PROMPT, &n_plain, &st));
        CHECKF(n_plain == N_NEW, "%s: plain run of %d tokens", name, n_plain);
        for (int block = 2; block <= 16; block++)
            for (int mirror = 0; mirror < 2; mirror++) {
                char msg[256];
                CHECKF(oracle_check(t, expect, N_PROMPT, N_NEW, block, penalty, mirror, msg, sizeof msg),
                       "%s penalty %.1f: %s", name, penalty, msg);
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
