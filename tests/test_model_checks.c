/* test_model_checks.c: what loading a checkpoint folder checks beyond each
 * tensor's shape, on tiny checkpoints written here (testmodel.h) or the
 * committed ones: tensors nothing binds are refused (layers beyond
 * num_hidden_layers, a bias), except a tied model's lm_head.weight and
 * rotary inv_freq buffers; `dflash info` fails with the very message
 * loading gives; another architecture is refused by name; a file given
 * where the folder is expected is named; a header that leaves the data
 * misaligned loads and computes the same logits; a Qwen3-MoE config that
 * does not match its experts is named; every committed checkpoint still
 * passes. */
#include "harness.h"

#include <jansson.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "draft/dflash_head.h"
#include "fixture.h"
#include "target/qwen3_layer.h"
#include "testmodel.h"

static dflash_backend *be;

/* ---- helpers ------------------------------------------------------------ */

/* Set (or, with value NULL, delete) top-level `key` of dir/config.json. */
static int edit_config(const char *dir, const char *key, json_t *value)
{
    char path[512];
    snprintf(path, sizeof path, "%s/config.json", dir);
    json_t *j = json_load_file(path, 0, NULL);
    if (!j) {
        json_decref(value);
        return 0;
    }
    if (value)
        json_object_set_new(j, key, value);
    else
        json_object_del(j, key);
    int ok = json_dump_file(j, path, JSON_INDENT(1)) == 0;
    json_decref(j);
    return ok;
}

/* A saved tiny target in a fresh folder (dir[64]); `extra` names one more
 * [1, 4] tensor to store, or NULL. */
static int save_model(char *dir, int layers, int tied, const char *extra)
{
    testmodel_geom g;
    testmodel_default_geom(&g);
    g.layers = layers;
    g.tied = tied;
    testmodel m;
    if (!testmodel_build(&m, &g))
        return 0;
    uint64_t rng = 7;
    int ok = testmodel_tmpdir(dir);
    /* A tied build leaves the slot an lm_head would take free. */
    if (ok && extra)
        ok = tied && testmodel_add(&m, extra, 1, 4, 1, 0.1f, &rng);
    ok = ok && testmodel_save(&m, dir);
    testmodel_free(&m);
    return ok;
}

/* The load's status; the message is kept in msg. */
static dflash_status try_load(const char *dir, char *msg, size_t cap)
{
    dflash_qwen3 *t = NULL;
    dflash_status s = dflash_qwen3_load(dir, be, NULL, &t);
    snprintf(msg, cap, "%s", s == DFLASH_OK ? "" : dflash_last_error());
    dflash_qwen3_free(t);
    return s;
}

/* What `dflash info` checks, as a library call. */
static dflash_status try_check(const char *dir, char *msg, size_t cap)
{
    dflash_model_config c;
    dflash_st *st = NULL;
    dflash_status s = dflash_config_load(dir, &c);
    if (s == DFLASH_OK)
        s = dflash_st_open(dir, &st);
    if (s == DFLASH_OK)
        s = qwen3_checkpoint_check(&c, st);
    snprintf(msg, cap, "%s", s == DFLASH_OK ? "" : dflash_last_error());
    dflash_st_close(st);
    return s;
}

/* The CLI's stderr and stdout for `dflash info ARG`; its exit status. */
static int run_info(const char *arg, char *out, size_t cap)
{
    const char *b = getenv("B");
    char bin[256], cmd[1024];
    snprintf(bin, sizeof bin, "%s/dflash", b ? b : "build");
    CHECKF(access(bin, X_OK) == 0, "%s is not built (set B to the build folder)", bin);
    snprintf(cmd, sizeof cmd, "%s info '%s' 2>&1", bin, arg);
    FILE *p = popen(cmd, "r");
    if (!p)
        return -1;
    size_t n = fread(out, 1, cap - 1, p);
    out[n] = 0;
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* ---- unused tensors ----------------------------------------------------- */

static void test_layers_beyond_num_hidden_layers(void)
{
    char dir[64], load_msg[1024], check_msg[1024];
    CHECK(save_model(dir, 3, 0, NULL) && edit_config(dir, "num_hidden_layers", json_integer(1)));
    CHECK_FAILS(try_load(dir, load_msg, sizeof load_msg), DFLASH_ERR_FORMAT,
                ": 22 tensors of the checkpoint are not used by this 1-layer Qwen3 target: "
                "'model.layers.1.input_layernorm.weight', 'model.layers.1.mlp.down_proj.weight', "
                "'model.layers.1.mlp.gate_proj.weight', 'model.layers.1.mlp.up_proj.weight' and 18 more; "
                "the file holds layers up to 2 but num_hidden_layers is 1");
    /* `dflash info` runs the same checks: the same message. */
    CHECK(try_check(dir, check_msg, sizeof check_msg) == DFLASH_ERR_FORMAT);
    CHECKF(strcmp(load_msg, check_msg) == 0, "load: %s\ninfo: %s", load_msg, check_msg);
    testmodel_rmdir(dir);
}

static void test_unknown_tensor_refused(void)
{
    char dir[64], msg[1024];
    CHECK(save_model(dir, 1, 1, "model.layers.0.self_attn.q_proj.bias"));
    CHECK_FAILS(try_load(dir, msg, sizeof msg), DFLASH_ERR_FORMAT,
                "1 tensor of the checkpoint is not used by this 1-layer Qwen3 target: "
                "'model.layers.0.self_attn.q_proj.bias'; config.json does not describe these weights");
    testmodel_rmdir(dir);
}

/* What transformers ignores as well is accepted: a tied model's stored
 * lm_head.weight, rotary inv_freq buffers. */
static void test_tolerated_unused(void)
{
    char dir[64], msg[1024];
    CHECK(save_model(dir, 1, 0, NULL) && edit_config(dir, "tie_word_embeddings", json_true()));
    CHECK_OK(try_load(dir, msg, sizeof msg));
    CHECK_OK(try_check(dir, msg, sizeof msg));
    testmodel_rmdir(dir);
    CHECK(save_model(dir, 1, 1, "model.layers.0.self_attn.rotary_emb.inv_freq"));
    CHECK_OK(try_load(dir, msg, sizeof msg));
    testmodel_rmdir(dir);
    /* An untied model needs its lm_head: not found, as before. */
    CHECK(save_model(dir, 1, 1, NULL) && edit_config(dir, "tie_word_embeddings", json_false()));
    CHECK_FAILS(try_load(dir, msg, sizeof msg), DFLASH_ERR_NOT_FOUND, "'lm_head.weight' not found");
    testmodel_rmdir(dir);
}

/* A drafter whose config says fewer layers than its file holds. */
static void test_drafter_layers_beyond(void)
{
    char src[512], tdir[512], dir[64], from[600], to[600];
    CHECK(testmodel_tmpdir(dir));
    fx_path(src, sizeof src, "dflash", "d2_tied");
    CHECK(fx_drafter_target("d2_tied", tdir, sizeof tdir));
    snprintf(from, sizeof from, "%s/config.json", src);
    snprintf(to, sizeof to, "%s/config.json", dir);
    json_t *j = json_load_file(from, 0, NULL);
    CHECK(j && json_dump_file(j, to, 0) == 0);
    json_decref(j);
    CHECK(edit_config(dir, "num_hidden_layers", json_integer(1)) &&
          edit_config(dir, "layer_types", json_pack("[s]", "full_attention")));
    char *real = realpath(src, NULL);
    snprintf(from, sizeof from, "%s/model.safetensors", real ? real : src);
    free(real);
    snprintf(to, sizeof to, "%s/model.safetensors", dir);
    CHECK(symlink(from, to) == 0);
    dflash_qwen3 *t = NULL;
    dflash_head *h = NULL;
    CHECK_OK(dflash_qwen3_load(tdir, be, NULL, &t));
    if (t)
        CHECK_FAILS(dflash_head_load(dir, t, NULL, &h), DFLASH_ERR_FORMAT,
                    "tensors of the checkpoint are not used by this 1-layer DFlash drafter: "
                    "'layers.1.input_layernorm.weight'");
    CHECK(h == NULL);
    CHECK(strstr(dflash_last_error(), "the file holds layers up to 1 but num_hidden_layers is 1") != NULL);
    dflash_qwen3_free(t);
    testmodel_rmdir(dir);
}

/* ---- info = load -------------------------------------------------------- */

/* Geometries the tensors contradict fail in `dflash info` with the load's
 * message, printed the way generate prints it. */
static void test_info_checks_geometry(void)
{
    static char out[4096];
    char dir[64], load_msg[1024], check_msg[1024], want[1200];
    const struct { const char *key; json_int_t value; } cases[] = {
        { "num_attention_heads", 65536 },
        { "hidden_size", 2147483647 },
        { "intermediate_size", 3 },
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        CHECK(save_model(dir, 1, 1, NULL) && edit_config(dir, cases[k].key, json_integer(cases[k].value)));
        if (!strcmp(cases[k].key, "num_attention_heads"))
            CHECK(edit_config(dir, "num_key_value_heads", json_integer(cases[k].value)));
        CHECKF(try_load(dir, load_msg, sizeof load_msg) == DFLASH_ERR_SHAPE, "%s: %s", cases[k].key, load_msg);
        CHECK(try_check(dir, check_msg, sizeof check_msg) == DFLASH_ERR_SHAPE);
        CHECKF(strcmp(load_msg, check_msg) == 0, "load: %s\ninfo: %s", load_msg, check_msg);
        snprintf(want, sizeof want, "dflash info: %s\n", load_msg);
        CHECKF(run_info(dir, out, sizeof out) == 1 && strcmp(out, want) == 0, "%s: info said %s", cases[k].key, out);
        testmodel_rmdir(dir);
    }
    /* An odd head_dim (RoPE needs pairs) is one of loading's checks too. */
    testmodel_geom g;
    testmodel_default_geom(&g);
    g.head_dim = 7;
    testmodel m;
    CHECK(testmodel_build(&m, &g) && testmodel_tmpdir(dir) && testmodel_save(&m, dir));
    testmodel_free(&m);
    CHECK_FAILS(try_load(dir, load_msg, sizeof load_msg), DFLASH_ERR_UNSUPPORTED, "head_dim 7 is odd");
    CHECK_FAILS(try_check(dir, check_msg, sizeof check_msg), DFLASH_ERR_UNSUPPORTED, "head_dim 7 is odd");
    testmodel_rmdir(dir);
}

/* ---- which model, which path ------------------------------------------- */

static void test_other_architecture_refused(void)
{
    char dir[64], msg[1024];
    static char out[4096];
    CHECK(save_model(dir, 1, 1, NULL) && edit_config(dir, "architectures", json_pack("[s]", "MistralForCausalLM")));
    CHECK_FAILS(try_load(dir, msg, sizeof msg), DFLASH_ERR_UNSUPPORTED,
                "/config.json: architectures[0] is 'MistralForCausalLM'; dflash runs Qwen3ForCausalLM, "
                "Qwen3MoeForCausalLM, LlamaForCausalLM, Qwen3_5ForCausalLM, Qwen3_5MoeForCausalLM (or the Qwen3.5 "
                "ForConditionalGeneration forms) targets and DFlashDraftModel drafters");
    CHECK(run_info(dir, out, sizeof out) == 1 && strstr(out, "architectures[0] is 'MistralForCausalLM'"));
    testmodel_rmdir(dir);
}

static void test_file_given_for_folder(void)
{
    char dir[64], path[128], want[512], tdir[512];
    static char out[4096];
    CHECK(save_model(dir, 1, 1, NULL));
    snprintf(path, sizeof path, "%s/config.json", dir);
    dflash_qwen3 *t = NULL;
    snprintf(want, sizeof want, "%s is a file, but -m takes the checkpoint folder (the one holding config.json "
             "and the *.safetensors files): give %s", path, dir);
    CHECK_FAILS(dflash_qwen3_load(path, be, NULL, &t), DFLASH_ERR_INVALID_ARG, want);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    CHECK_FAILS(dflash_qwen3_load(path, be, NULL, &t), DFLASH_ERR_INVALID_ARG, "-m takes the checkpoint folder");
    CHECK(run_info(path, out, sizeof out) == 1 && strstr(out, "but dflash info takes the checkpoint folder"));
    CHECK(fx_drafter_target("d2_tied", tdir, sizeof tdir));
    CHECK_OK(dflash_qwen3_load(tdir, be, NULL, &t));
    if (t) {
        dflash_head *h = NULL;
        char dpath[600];
        snprintf(dpath, sizeof dpath, "%s/dflash/d2_tied/config.json", test_data_dir());
        CHECK_FAILS(dflash_head_load(dpath, t, NULL, &h), DFLASH_ERR_INVALID_ARG, "-d takes the checkpoint folder");
        dflash_qwen3_free(t);
    }
    testmodel_rmdir(dir);
}

/* ---- misaligned data ---------------------------------------------------- */

/* Rewrite dir/model.safetensors with one more space in its header: every
 * tensor's data then starts at an odd offset of the file. */
static int misalign_file(const char *dir)
{
    char path[512];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    FILE *f = fopen(path, "rb");
    if (!f)
        return 0;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *buf = malloc((size_t)len + 1);
    int ok = buf && fread(buf, 1, (size_t)len, f) == (size_t)len;
    fclose(f);
    uint64_t n = 0;
    for (int i = 7; ok && i >= 0; i--)
        n = (n << 8) | buf[i];
    ok = ok && n + 8 <= (uint64_t)len;
    if (ok) {
        memmove(buf + 8 + n + 1, buf + 8 + n, (size_t)len - 8 - n);
        buf[8 + n] = ' ';
        n++;
        for (int i = 0; i < 8; i++)
            buf[i] = (uint8_t)(n >> (8 * i));
        f = fopen(path, "wb");
        ok = f && fwrite(buf, 1, (size_t)len + 1, f) == (size_t)len + 1;
        if (f)
            ok = fclose(f) == 0 && ok;
    }
    free(buf);
    return ok;
}

/* Logits of 4 rows of a prompt; 1 on success. */
static int logits_of(const char *dir, float *out, size_t n)
{
    dflash_qwen3 *t = NULL;
    CHECK_OK(dflash_qwen3_load(dir, be, NULL, &t));
    if (!t)
        return 0;
    /* Elements are read as uint16_t: every weight must be aligned. */
    const dflash_weight *w[] = { &t->embed, &t->final_norm, &t->lm_head, &t->layers[0].input_norm,
                                 &t->layers[0].lin[QWEN3_LIN_Q], &t->layers[1].lin[QWEN3_LIN_DOWN] };
    for (size_t i = 0; i < sizeof w / sizeof w[0]; i++)
        CHECKF((uintptr_t)w[i]->data % 2 == 0, "weight %s at %p", w[i]->name, w[i]->data);
    dflash_kv_seq seq;
    dflash_kv_seq *seqs[1] = { &seq };
    const int32_t tokens[4] = { 3, 17, 42, 9 }, pos[4] = { 0, 1, 2, 3 }, rs[4] = { 0, 0, 0, 0 },
                  rows[4] = { 0, 1, 2, 3 };
    dflash_qwen3_batch b = { .n_rows = 4, .tokens = tokens, .positions = pos, .row_seq = rs, .n_seqs = 1,
                             .seqs = seqs, .n_logit_rows = 4, .logit_rows = rows };
    float *logits = NULL;
    int ok = dflash_qwen3_seq_init(t, &seq) == DFLASH_OK;
    ok = ok && dflash_qwen3_forward(t, &b, &logits, NULL) == DFLASH_OK && logits;
    CHECKF(ok, "forward: %s", dflash_last_error());
    if (ok)
        memcpy(out, logits, n * sizeof *out);
    dflash_qwen3_seq_free(t, &seq);
    dflash_qwen3_free(t);
    return ok;
}

static void test_misaligned_checkpoint_loads(void)
{
    char dir[64];
    enum { N = 4 * 64 }; /* 4 rows of the default vocabulary */
    static float aligned[N], shifted[N];
    CHECK(save_model(dir, 2, 0, NULL));
    CHECK(logits_of(dir, aligned, N));
    CHECK(misalign_file(dir));
    CHECK(logits_of(dir, shifted, N));
    CHECK(memcmp(aligned, shifted, sizeof aligned) == 0);
    testmodel_rmdir(dir);
}

/* ---- committed checkpoints ---------------------------------------------- */

/* ---- Qwen3-MoE ---------------------------------------------------------- */

/* A committed fixture's config.json and model.safetensors copied into a
 * fresh folder (dir[64]), so its config can be edited. */
static int copy_fixture(char *dir, const char *family, const char *name)
{
    static const char *const files[] = { "config.json", "model.safetensors" };
    char src[600], dst[600], from[512];
    if (!testmodel_tmpdir(dir))
        return 0;
    fx_path(from, sizeof from, family, name);
    int ok = 1;
    for (size_t i = 0; i < 2 && ok; i++) {
        snprintf(src, sizeof src, "%s/%s", from, files[i]);
        snprintf(dst, sizeof dst, "%s/%s", dir, files[i]);
        FILE *in = fopen(src, "rb"), *out = fopen(dst, "wb");
        char buf[1 << 16];
        size_t n;
        ok = in && out;
        while (ok && (n = fread(buf, 1, sizeof buf, in)) > 0)
            ok = fwrite(buf, 1, n, out) == n;
        if (in)
            fclose(in);
        if (out)
            ok = fclose(out) == 0 && ok;
    }
    return ok;
}

/* A Qwen3-MoE config that does not match its experts names the tensor and
 * both shapes, for either expert layout, at load and in `dflash info`. */
static void test_moe_config_mismatch(void)
{
    static const struct {
        const char *name, *key;
        int value;
        dflash_status want;
        const char *msg;
    } cases[] = {
        { "moe_experts", "num_experts", 10, DFLASH_ERR_SHAPE,
          "tensor 'model.layers.0.mlp.gate.weight' has shape [8, 96], expected [10, 96]" },
        { "moe_experts", "moe_intermediate_size", 32, DFLASH_ERR_SHAPE,
          "tensor 'model.layers.0.mlp.experts.0.gate_proj.weight' has shape [64, 96], expected [32, 96]" },
        { "moe_experts", "decoder_sparse_step", 3, DFLASH_ERR_NOT_FOUND,
          "tensor 'model.layers.0.mlp.gate_proj.weight' not found" },
        { "moe_stacked", "moe_intermediate_size", 40, DFLASH_ERR_SHAPE,
          "tensor 'model.layers.1.mlp.experts.gate_up_proj' has shape [6, 96, 64], expected [6, 80, 64]" },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char dir[64], msg[1024];
        static char out[4096];
        CHECK(copy_fixture(dir, "qwen3_moe", cases[i].name) &&
              edit_config(dir, cases[i].key, json_integer(cases[i].value)));
        CHECK_FAILS(try_load(dir, msg, sizeof msg), cases[i].want, cases[i].msg);
        CHECK(run_info(dir, out, sizeof out) == 1);
        CHECKF(strstr(out, cases[i].msg), "dflash info: %s", out);
        testmodel_rmdir(dir);
    }
    /* and `dflash info` on the fixture itself names the family and its experts */
    char dir[512];
    static char out[4096];
    CHECK(run_info(fx_path(dir, sizeof dir, "qwen3_moe", "moe_experts"), out, sizeof out) == 0);
    CHECKF(strstr(out, "Qwen3MoeForCausalLM (Qwen3-MoE target)") &&
               strstr(out, "experts        8, 2 active per token (weights renormalised), 64 wide; 2 of 3 layers "
                           "sparse"),
           "dflash info: %s", out);
}

/* The Qwen3.5 hybrids (made by transformers): every tensor of both
 * layouts is accounted for, `dflash info` describes them, they load, and a
 * config that does not match its weights names the tensor and both
 * shapes. */
static void test_qwen35_checks(void)
{
    static char out[4096];
    char dir[512], msg[1024];
    CHECK(run_info(fx_path(dir, sizeof dir, "qwen35", "q35_dense"), out, sizeof out) == 0);
    CHECKF(strstr(out, "Qwen3_5ForCausalLM (Qwen3.5 target)") &&
               strstr(out, "3 Gated DeltaNet linear attention (key heads 2 x 16, value heads 4 x 8, conv 4), 1 gated "
                           "full attention (RoPE on 4 of 16 dimensions)") &&
               strstr(out, "state          0.3 MB per sequence (f32, per linear-attention layer: the last 128 rows' "
                           "inputs and delta-rule entries, 3 chunk-start states)"),
           "dflash info: %s", out);
    CHECKF(try_load(dir, msg, sizeof msg) == DFLASH_OK, "%s: %s", dir, msg);
    CHECK(run_info(fx_path(dir, sizeof dir, "qwen35", "q35_moe_mm"), out, sizeof out) == 0);
    CHECKF(strstr(out, "(Qwen3.5-MoE target)") &&
               strstr(out, "multimodal (text_config, model.language_model.*): 2 vision and 0 mtp tensors not used") &&
               strstr(out, "experts        8, 2 active per token (weights renormalised), 32 wide; 4 of 4 layers "
                           "sparse; a shared expert 48 wide"),
           "dflash info: %s", out);
    CHECKF(try_load(dir, msg, sizeof msg) == DFLASH_OK, "%s: %s", dir, msg);
    CHECK(run_info(fx_path(dir, sizeof dir, "qwen35", "q35_moe_text"), out, sizeof out) == 0);
    CHECKF(strstr(out, "a shared expert 32 wide (as wide as the routed ones: run as one of them)"),
           "dflash info: %s", out);
    char tmp[64];
    CHECK(copy_fixture(tmp, "qwen35", "q35_dense") && edit_config(tmp, "linear_value_head_dim", json_integer(16)));
    CHECK_FAILS(try_load(tmp, msg, sizeof msg), DFLASH_ERR_SHAPE,
                "tensor 'model.layers.0.linear_attn.in_proj_qkv.weight' has shape [96, 64], expected [128, 64]");
    testmodel_rmdir(tmp);
}

static void test_committed_checkpoints_pass(void)
{
    char dirs[16][512], msg[1024];
    int n = 0;
    const char *qwen3[] = { "gqa_tied", "gqa_sharded", "mha_untied" };
    const char *dflash[] = { "d1_sharded", "d2_tied", "d3_sliding", "d4_llama", "d5_yarn", "d6_moe" };
    for (int i = 0; i < 3; i++)
        fx_path(dirs[n++], sizeof dirs[0], "qwen3", qwen3[i]);
    for (int i = 0; i < 6; i++)
        fx_path(dirs[n++], sizeof dirs[0], "dflash", dflash[i]);
    fx_path(dirs[n++], sizeof dirs[0], "qwen3_moe", "moe_experts");
    fx_path(dirs[n++], sizeof dirs[0], "qwen3_moe", "moe_stacked");
    snprintf(dirs[n++], sizeof dirs[0], "models/qwen3-pystd");
    snprintf(dirs[n++], sizeof dirs[0], "models/qwen3-pystd-dflash");
    for (int i = 0; i < n; i++)
        CHECKF(try_check(dirs[i], msg, sizeof msg) == DFLASH_OK, "%s: %s", dirs[i], msg);
}

int main(void)
{
    CHECK_OK(dflash_backend_cpu_create(&be));
    RUN(test_layers_beyond_num_hidden_layers);
    RUN(test_unknown_tensor_refused);
    RUN(test_tolerated_unused);
    RUN(test_drafter_layers_beyond);
    RUN(test_info_checks_geometry);
    RUN(test_other_architecture_refused);
    RUN(test_file_given_for_folder);
    RUN(test_misaligned_checkpoint_loads);
    RUN(test_moe_config_mismatch);
    RUN(test_qwen35_checks);
    RUN(test_committed_checkpoints_pass);
    dflash_backend_destroy(be);
    TEST_END();
}
