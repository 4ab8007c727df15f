/* test_config.c: config.json parsing for Qwen3 targets and DFlash drafters:
 * a full config, the rope_parameters form, defaults (and the head_dim /
 * num_key_value_heads ones that differ from transformers', refused),
 * architectures and model_type, every validation error (status and a
 * distinctive piece of the message), eos lists, layer_types, the drafter's
 * explicit and default target_layer_ids, and a file given where a
 * checkpoint folder is expected. Error cases are made by editing one field
 * of a good config with jansson. */
#include <jansson.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/status.h"
#include "harness.h"
#include "io/hf_config.h"

static const char *k_qwen3 =
    "{\"architectures\":[\"Qwen3ForCausalLM\"],\"attention_bias\":false,\"hidden_act\":\"silu\","
    "\"hidden_size\":1024,\"num_hidden_layers\":28,\"num_attention_heads\":16,\"num_key_value_heads\":8,"
    "\"head_dim\":128,\"intermediate_size\":3072,\"vocab_size\":151936,\"max_position_embeddings\":40960,"
    "\"rms_norm_eps\":1e-06,\"rope_theta\":1000000,\"rope_scaling\":null,\"tie_word_embeddings\":true,"
    "\"bos_token_id\":151643,\"eos_token_id\":151645,\"torch_dtype\":\"bfloat16\",\"sliding_window\":null,"
    "\"use_sliding_window\":false,\"max_window_layers\":28,\"model_type\":\"qwen3\"}";

static const char *k_minimal = "{\"hidden_size\":64,\"num_hidden_layers\":2,\"num_attention_heads\":4,"
                               "\"num_key_value_heads\":2,\"head_dim\":32,\"intermediate_size\":128,"
                               "\"vocab_size\":1000}";

static const char *k_drafter =
    "{\"architectures\":[\"DFlashDraftModel\"],\"block_size\":16,"
    "\"dflash_config\":{\"mask_token_id\":151669,\"target_layer_ids\":[1,9,17,25,33]},"
    "\"hidden_size\":4096,\"num_hidden_layers\":5,\"num_attention_heads\":32,\"num_key_value_heads\":8,"
    "\"head_dim\":128,\"intermediate_size\":12288,\"vocab_size\":151936,\"num_target_layers\":36,"
    "\"rms_norm_eps\":1e-06,\"rope_theta\":1000000,\"tie_word_embeddings\":false,\"dtype\":\"bfloat16\","
    "\"eos_token_id\":151645,\"use_sliding_window\":false}";

static dflash_status parse(const char *text, dflash_model_config *c)
{
    return dflash_config_parse(text, strlen(text), "cfg.json", c);
}

/* `base` with top-level keys[i] set to values[i] (JSON text; NULL: the key
 * removed), parsed. */
static dflash_status parse_edits(const char *base, int n, const char *const *keys, const char *const *values,
                                 dflash_model_config *c)
{
    json_t *root = json_loads(base, 0, NULL);
    CHECK(root != NULL);
    if (!root)
        return DFLASH_ERR_INVALID_ARG;
    for (int i = 0; i < n; i++) {
        if (values[i]) {
            json_t *v = json_loads(values[i], JSON_DECODE_ANY, NULL);
            CHECKF(v != NULL, "bad test value %s", values[i]);
            json_object_set_new(root, keys[i], v);
        } else {
            json_object_del(root, keys[i]);
        }
    }
    char *text = json_dumps(root, 0);
    json_decref(root);
    dflash_status s = parse(text, c);
    free(text);
    return s;
}

static dflash_status parse_edit(const char *base, const char *key, const char *value, dflash_model_config *c)
{
    return parse_edits(base, 1, &key, &value, c);
}

/* ---- good configs ------------------------------------------------------ */

static void test_qwen3_full(void)
{
    dflash_model_config c;
    CHECK_OK(parse(k_qwen3, &c));
    CHECK(strcmp(c.architecture, "Qwen3ForCausalLM") == 0);
    CHECK(strcmp(c.torch_dtype, "bfloat16") == 0);
    CHECK(c.hidden_size == 1024 && c.num_hidden_layers == 28);
    CHECK(c.num_attention_heads == 16 && c.num_key_value_heads == 8 && c.head_dim == 128);
    CHECK(c.intermediate_size == 3072 && c.vocab_size == 151936 && c.max_position_embeddings == 40960);
    CHECK(c.rms_norm_eps == 1e-6f && c.rope.theta == 1e6);
    CHECK(c.rope.kind == DFLASH_ROPE_DEFAULT && c.rope_freq.n_pairs == c.head_dim / 2 && c.rope_freq.attn_factor == 1.0f);
    CHECK(c.tie_word_embeddings == 1 && c.bos_token_id == 151643);
    CHECK(c.n_eos == 1 && c.eos_token_ids[0] == 151645);
    CHECK(c.sliding_window == 0 && c.layer_sliding[0] == 0 && c.layer_sliding[27] == 0);
    CHECK(c.is_dflash == 0);
}

static void test_defaults(void)
{
    dflash_model_config c;
    CHECK_OK(parse(k_minimal, &c));
    CHECK(c.num_key_value_heads == 2 && c.head_dim == 32);
    CHECK(c.max_position_embeddings == 32768 && c.rms_norm_eps == 1e-6f && c.rope.theta == 10000.0);
    CHECK(c.rope.kind == DFLASH_ROPE_DEFAULT);
    CHECK(c.tie_word_embeddings == 0 && c.bos_token_id == -1 && c.n_eos == 0);
    CHECK(c.architecture[0] == 0 && c.torch_dtype[0] == 0 && c.sliding_window == 0 && c.is_dflash == 0);
    CHECK_OK(parse_edit(k_qwen3, "bos_token_id", "null", &c));
    CHECK(c.bos_token_id == -1);
    CHECK_OK(parse_edit(k_qwen3, "eos_token_id", "null", &c));
    CHECK(c.n_eos == 0);
    CHECK_OK(parse_edit(k_qwen3, "torch_dtype", NULL, &c));
    CHECK(c.torch_dtype[0] == 0);
}

static void test_rope_parameters(void)
{
    dflash_model_config c;
    const char *newer = "{\"hidden_size\":64,\"num_hidden_layers\":2,\"num_attention_heads\":4,"
                        "\"num_key_value_heads\":4,\"head_dim\":16,"
                        "\"intermediate_size\":128,\"vocab_size\":1000,\"dtype\":\"float16\","
                        "\"rope_parameters\":{\"rope_theta\":5000000.0,\"rope_type\":\"default\"}}";
    CHECK_OK(parse(newer, &c));
    CHECK(c.rope.theta == 5e6 && c.rope.kind == DFLASH_ROPE_DEFAULT);
    CHECK(strcmp(c.torch_dtype, "float16") == 0);
    CHECK_OK(parse_edit(newer, "rope_parameters", "{\"rope_theta\":1e4,\"rope_type\":\"linear\",\"factor\":2}", &c));
    CHECK(c.rope.kind == DFLASH_ROPE_LINEAR && c.rope.factor == 2.0);
    CHECK_OK(parse_edit(newer, "rope_parameters", "{\"rope_theta\":1e4,\"rope_type\":\"yarn\",\"factor\":4}", &c));
    CHECK(c.rope.kind == DFLASH_ROPE_YARN && c.rope.original_max_pos == 32768 && c.rope.truncate == 1);
    CHECK_FAILS(parse_edit(newer, "rope_parameters", "{\"rope_theta\":1e4,\"rope_type\":\"longrope\"}", &c),
                DFLASH_ERR_UNSUPPORTED, "'rope_parameters.rope_type' = \"longrope\"");
    CHECK_FAILS(parse_edit(newer, "rope_parameters", "{\"rope_theta\":1e4,\"rope_type\":\"default\","
                           "\"partial_rotary_factor\":0.5}", &c),
                DFLASH_ERR_UNSUPPORTED, "'rope_parameters.partial_rotary_factor' = 0.5 is not supported");
    CHECK_FAILS(parse_edit(newer, "rope_parameters", "{\"rope_theta\":0}", &c), DFLASH_ERR_FORMAT,
                "'rope_theta' = 0");
    CHECK_FAILS(parse_edit(newer, "rope_parameters", "[1]", &c), DFLASH_ERR_FORMAT,
                "'rope_parameters' is an array");
}

static void test_rope_scaling(void)
{
    dflash_model_config c;
    CHECK_OK(parse_edit(k_qwen3, "rope_scaling", "{\"rope_type\":\"linear\",\"factor\":4.0}", &c));
    CHECK(c.rope.kind == DFLASH_ROPE_LINEAR && c.rope.factor == 4.0);
    CHECK_OK(parse_edit(k_qwen3, "rope_scaling", "{\"type\":\"linear\",\"factor\":2}", &c));
    CHECK(c.rope.kind == DFLASH_ROPE_LINEAR && c.rope.factor == 2.0);
    CHECK_OK(parse_edit(k_qwen3, "rope_scaling", "{\"rope_type\":\"default\"}", &c));
    CHECK(c.rope.kind == DFLASH_ROPE_DEFAULT);
    /* the published forms: Llama 3.1, a Qwen3 YaRN with DeepSeek's mscale keys */
    CHECK_OK(parse_edit(k_qwen3, "rope_scaling", "{\"rope_type\":\"llama3\",\"factor\":8.0,\"low_freq_factor\":1.0,"
                        "\"high_freq_factor\":4.0,\"original_max_position_embeddings\":8192}", &c));
    CHECK(c.rope.kind == DFLASH_ROPE_LLAMA3 && c.rope.factor == 8 && c.rope.low_freq_factor == 1 &&
          c.rope.high_freq_factor == 4 && c.rope.original_max_pos == 8192);
    CHECK_OK(parse_edit(k_qwen3, "rope_scaling", "{\"type\":\"yarn\",\"factor\":40,\"mscale\":0.707,"
                        "\"mscale_all_dim\":0.707,\"beta_fast\":16,\"truncate\":false}", &c));
    CHECK(c.rope.kind == DFLASH_ROPE_YARN && c.rope.mscale == 0.707 && c.rope.mscale_all_dim == 0.707 &&
          c.rope.beta_fast == 16 && c.rope.beta_slow == 1 && c.rope.truncate == 0 &&
          c.rope.original_max_pos == c.max_position_embeddings);
    CHECK_FAILS(parse_edit(k_qwen3, "rope_scaling", "{\"type\":\"dynamic\",\"factor\":2}", &c),
                DFLASH_ERR_UNSUPPORTED, "cfg.json: field 'rope_scaling.type' = \"dynamic\" is not supported");
    CHECK_FAILS(parse_edit(k_qwen3, "rope_scaling", "{\"rope_type\":\"llama3\",\"factor\":8}", &c),
                DFLASH_ERR_FORMAT, "required field 'rope_scaling.low_freq_factor' is missing");
    CHECK_FAILS(parse_edit(k_qwen3, "rope_scaling", "{\"rope_type\":\"llama3\",\"factor\":8,\"low_freq_factor\":4,"
                           "\"high_freq_factor\":1,\"original_max_position_embeddings\":8192}", &c),
                DFLASH_ERR_FORMAT, "'rope_scaling.high_freq_factor' = 1, expected more than low_freq_factor (4)");
    CHECK_FAILS(parse_edit(k_qwen3, "rope_scaling", "{\"rope_type\":\"yarn\",\"factor\":4,\"truncate\":1}", &c),
                DFLASH_ERR_FORMAT, "'rope_scaling.truncate' is an integer, expected a boolean");
    CHECK_FAILS(parse_edit(k_qwen3, "rope_scaling", "{\"rope_type\":\"yarn\",\"factor\":4,\"beta_fast\":-2}", &c),
                DFLASH_ERR_FORMAT, "'rope_scaling.beta_fast' = -2, expected > 0");
    CHECK_FAILS(parse_edit(k_qwen3, "rope_scaling", "{\"rope_type\":\"yarn\",\"factor\":4,"
                           "\"partial_rotary_factor\":0.5}", &c),
                DFLASH_ERR_UNSUPPORTED, "'rope_scaling.partial_rotary_factor' = 0.5 is not supported");
    CHECK_FAILS(parse_edit(k_qwen3, "partial_rotary_factor", "0.25", &c), DFLASH_ERR_UNSUPPORTED,
                "'partial_rotary_factor' = 0.25 is not supported");
    CHECK_FAILS(parse_edit(k_qwen3, "rope_scaling", "{\"rope_type\":\"linear\"}", &c), DFLASH_ERR_FORMAT,
                "required field 'rope_scaling.factor' is missing");
    CHECK_FAILS(parse_edit(k_qwen3, "rope_scaling", "{\"rope_type\":\"linear\",\"factor\":-1}", &c),
                DFLASH_ERR_FORMAT, "'rope_scaling.factor' = -1");
    CHECK_FAILS(parse_edit(k_qwen3, "rope_scaling", "\"linear\"", &c), DFLASH_ERR_FORMAT,
                "'rope_scaling' is a string");
}

static void test_eos_and_bos(void)
{
    dflash_model_config c;
    CHECK_OK(parse_edit(k_qwen3, "eos_token_id", "[151645, 151643]", &c));
    CHECK(c.n_eos == 2 && c.eos_token_ids[0] == 151645 && c.eos_token_ids[1] == 151643);
    CHECK_FAILS(parse_edit(k_qwen3, "eos_token_id", "151936", &c), DFLASH_ERR_FORMAT,
                "'eos_token_id' = 151936 is outside [0, vocab_size 151936)");
    CHECK_FAILS(parse_edit(k_qwen3, "eos_token_id", "[1, -1]", &c), DFLASH_ERR_FORMAT, "'eos_token_id' = -1");
    CHECK_FAILS(parse_edit(k_qwen3, "eos_token_id", "[1, \"2\"]", &c), DFLASH_ERR_FORMAT,
                "'eos_token_id[1]' is a string");
    CHECK_FAILS(parse_edit(k_qwen3, "eos_token_id", "[1,2,3,4,5,6,7,8,9]", &c), DFLASH_ERR_FORMAT,
                "lists 9 ids, at most 8");
    CHECK_FAILS(parse_edit(k_qwen3, "eos_token_id", "\"</s>\"", &c), DFLASH_ERR_FORMAT,
                "'eos_token_id' is a string");
    CHECK_FAILS(parse_edit(k_qwen3, "bos_token_id", "-5", &c), DFLASH_ERR_FORMAT, "'bos_token_id' = -5");
    CHECK_FAILS(parse_edit(k_qwen3, "bos_token_id", "1e3", &c), DFLASH_ERR_FORMAT,
                "'bos_token_id' is a real number, expected an integer");
}

/* ---- validation errors -------------------------------------------------- */

static void test_required_and_types(void)
{
    dflash_model_config c;
    const char *required[] = { "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                               "vocab_size" };
    for (size_t i = 0; i < sizeof required / sizeof required[0]; i++) {
        char want[96];
        snprintf(want, sizeof want, "cfg.json: required field '%s' is missing", required[i]);
        CHECK_FAILS(parse_edit(k_qwen3, required[i], NULL, &c), DFLASH_ERR_FORMAT, want);
    }
    CHECK_FAILS(parse_edit(k_qwen3, "hidden_size", "\"1024\"", &c), DFLASH_ERR_FORMAT,
                "field 'hidden_size' is a string, expected an integer");
    CHECK_FAILS(parse_edit(k_qwen3, "hidden_size", "1024.5", &c), DFLASH_ERR_FORMAT, "'hidden_size' is a real number");
    CHECK_FAILS(parse_edit(k_qwen3, "hidden_size", "4294967296", &c), DFLASH_ERR_FORMAT, "does not fit in an int");
    CHECK_FAILS(parse_edit(k_qwen3, "rms_norm_eps", "\"small\"", &c), DFLASH_ERR_FORMAT,
                "'rms_norm_eps' is a string, expected a number");
    CHECK_FAILS(parse_edit(k_qwen3, "tie_word_embeddings", "1", &c), DFLASH_ERR_FORMAT,
                "'tie_word_embeddings' is an integer, expected a boolean");
    CHECK_FAILS(parse_edit(k_qwen3, "architectures", "\"Qwen3\"", &c), DFLASH_ERR_FORMAT, "'architectures'");
    CHECK_FAILS(parse_edit(k_qwen3, "architectures", "[7]", &c), DFLASH_ERR_FORMAT, "'architectures[0]' is an integer");
    CHECK_FAILS(parse_edit(k_qwen3, "torch_dtype", "16", &c), DFLASH_ERR_FORMAT, "'torch_dtype' is an integer");
}

static void test_bad_values(void)
{
    dflash_model_config c;
    CHECK_FAILS(parse_edit(k_qwen3, "hidden_size", "0", &c), DFLASH_ERR_FORMAT, "'hidden_size' = 0, expected > 0");
    CHECK_FAILS(parse_edit(k_qwen3, "intermediate_size", "-3", &c), DFLASH_ERR_FORMAT, "'intermediate_size' = -3");
    CHECK_FAILS(parse_edit(k_qwen3, "head_dim", "0", &c), DFLASH_ERR_FORMAT, "'head_dim' = 0");
    CHECK_FAILS(parse_edit(k_qwen3, "num_key_value_heads", "5", &c), DFLASH_ERR_FORMAT,
                "num_attention_heads = 16 is not divisible by num_key_value_heads = 5");
    CHECK_FAILS(parse_edit(k_qwen3, "num_hidden_layers", "300", &c), DFLASH_ERR_FORMAT,
                "'num_hidden_layers' = 300, at most 256");
    CHECK_FAILS(parse_edit(k_qwen3, "vocab_size", "0", &c), DFLASH_ERR_FORMAT, "'vocab_size' = 0");
    CHECK_FAILS(parse_edit(k_qwen3, "rms_norm_eps", "0", &c), DFLASH_ERR_FORMAT, "'rms_norm_eps' = 0");
    CHECK_FAILS(parse_edit(k_qwen3, "rms_norm_eps", "-1e-6", &c), DFLASH_ERR_FORMAT, "'rms_norm_eps' = -1e-06");
    CHECK_FAILS(parse_edit(k_qwen3, "rope_theta", "0", &c), DFLASH_ERR_FORMAT, "'rope_theta' = 0");
    CHECK_FAILS(parse_edit(k_qwen3, "max_position_embeddings", "0", &c), DFLASH_ERR_FORMAT,
                "'max_position_embeddings' = 0");
    CHECK_FAILS(parse_edit(k_qwen3, "use_sliding_window", "true", &c), DFLASH_ERR_UNSUPPORTED,
                "'use_sliding_window' = true is not supported for a target model");
}

static void test_bad_json(void)
{
    dflash_model_config c;
    CHECK_FAILS(parse("{\"hidden_size\":", &c), DFLASH_ERR_FORMAT, "cfg.json: not valid JSON");
    CHECK_FAILS(parse("[1]", &c), DFLASH_ERR_FORMAT, "config is an array, expected a JSON object");
    CHECK_FAILS(parse("{\"hidden_size\":1,\"hidden_size\":2}", &c), DFLASH_ERR_FORMAT, "duplicate");
    CHECK_FAILS(dflash_config_parse("", 0, "empty.json", &c), DFLASH_ERR_FORMAT, "empty.json");
}

static void test_layer_types(void)
{
    dflash_model_config c;
    const char *mixed = "[\"full_attention\",\"sliding_attention\"]";
    CHECK_OK(parse_edit(k_minimal, "layer_types", "[\"full_attention\",\"full_attention\"]", &c));
    CHECK(c.layer_sliding[0] == 0 && c.layer_sliding[1] == 0);
    CHECK_FAILS(parse_edit(k_minimal, "layer_types", mixed, &c), DFLASH_ERR_FORMAT,
                "'layer_types[1]' is \"sliding_attention\" but sliding_window is absent");
    char with_window[512];
    snprintf(with_window, sizeof with_window, "%.*s,\"sliding_window\":4096}", (int)strlen(k_minimal) - 1,
             k_minimal);
    CHECK_OK(parse_edit(with_window, "layer_types", mixed, &c));
    CHECK(c.layer_sliding[0] == 0 && c.layer_sliding[1] == 1 && c.sliding_window == 4096);
    CHECK_FAILS(parse_edit(k_minimal, "layer_types", "[\"full_attention\"]", &c), DFLASH_ERR_FORMAT,
                "'layer_types' has 1 entries, num_hidden_layers is 2");
    CHECK_FAILS(parse_edit(k_minimal, "layer_types", "[\"full_attention\",\"chunked_attention\"]", &c),
                DFLASH_ERR_FORMAT, "'layer_types[1]' = \"chunked_attention\"");
    CHECK_FAILS(parse_edit(k_minimal, "layer_types", "[\"full_attention\",3]", &c), DFLASH_ERR_FORMAT,
                "is an integer, expected a string");
    CHECK_FAILS(parse_edit(k_minimal, "sliding_window", "0", &c), DFLASH_ERR_FORMAT, "'sliding_window' = 0");
}

/* ---- defaults transformers does not share ------------------------------- */

/* transformers' Qwen3Config: absent head_dim is 128, absent
 * num_key_value_heads 32, null num_key_value_heads num_attention_heads. */
static void test_head_dim_and_kv_defaults(void)
{
    dflash_model_config c;
    CHECK_FAILS(parse_edit(k_minimal, "head_dim", NULL, &c), DFLASH_ERR_FORMAT,
                "cfg.json: head_dim is missing; transformers' default for Qwen3 (128) differs from hidden_size / "
                "num_attention_heads (16): set it explicitly");
    CHECK_FAILS(parse_edit(k_minimal, "head_dim", "null", &c), DFLASH_ERR_FORMAT, "cfg.json: head_dim is null;");
    CHECK_FAILS(parse_edit(k_qwen3, "head_dim", NULL, &c), DFLASH_ERR_FORMAT, "num_attention_heads (64)");
    json_t *odd = json_loads(k_minimal, 0, NULL);
    json_object_set_new(odd, "num_attention_heads", json_integer(5));
    json_object_set_new(odd, "num_key_value_heads", json_integer(5));
    char *text = json_dumps(odd, 0);
    json_decref(odd);
    CHECK_FAILS(parse_edit(text, "head_dim", NULL, &c), DFLASH_ERR_FORMAT, "num_attention_heads (12.8)");
    free(text);
    /* Where hidden_size / num_attention_heads is 128, both readings agree. */
    CHECK_OK(parse_edit(k_drafter, "head_dim", NULL, &c));
    CHECK(c.head_dim == 128);

    CHECK_FAILS(parse_edit(k_qwen3, "num_key_value_heads", NULL, &c), DFLASH_ERR_FORMAT,
                "cfg.json: num_key_value_heads is missing; transformers' default for Qwen3 (32) differs from "
                "num_attention_heads (16): set it explicitly");
    CHECK_OK(parse_edit(k_qwen3, "num_key_value_heads", "null", &c));
    CHECK(c.num_key_value_heads == 16);
    CHECK_OK(parse_edit(k_drafter, "num_key_value_heads", NULL, &c)); /* 32 heads */
    CHECK(c.num_key_value_heads == 32);
}

/* ---- which model ------------------------------------------------------- */

static void test_architectures(void)
{
    dflash_model_config c;
    CHECK_FAILS(parse_edit(k_qwen3, "architectures", "[\"MistralForCausalLM\"]", &c), DFLASH_ERR_UNSUPPORTED,
                "cfg.json: architectures[0] is 'MistralForCausalLM'; dflash runs Qwen3ForCausalLM, "
                "Qwen3MoeForCausalLM, LlamaForCausalLM, Qwen3_5ForCausalLM, Qwen3_5MoeForCausalLM (or the Qwen3.5 "
                "ForConditionalGeneration forms) targets and DFlashDraftModel drafters");
    CHECK_FAILS(parse_edit(k_qwen3, "architectures", "[\"Qwen2ForCausalLM\"]", &c), DFLASH_ERR_UNSUPPORTED,
                "architectures[0] is 'Qwen2ForCausalLM'");
    CHECK_FAILS(parse_edit(k_qwen3, "architectures", "[\"Qwen2MoeForCausalLM\"]", &c), DFLASH_ERR_UNSUPPORTED,
                "'Qwen2MoeForCausalLM'");
    /* Named before its other fields are judged: a Mistral config may lack head_dim. */
    json_t *other = json_loads(k_qwen3, 0, NULL);
    json_object_del(other, "head_dim");
    json_object_set_new(other, "architectures", json_pack("[s]", "MistralForCausalLM"));
    char *text = json_dumps(other, 0);
    json_decref(other);
    CHECK_FAILS(parse(text, &c), DFLASH_ERR_UNSUPPORTED, "'MistralForCausalLM'");
    free(text);
    /* A drafter is DFlashDraftModel, whatever else it has. */
    CHECK_FAILS(parse_edit(k_drafter, "architectures", "[\"SomethingElse\"]", &c), DFLASH_ERR_UNSUPPORTED,
                "architectures[0] is 'SomethingElse'");
    CHECK_FAILS(parse_edit(k_qwen3, "dflash_config", "{\"mask_token_id\":1}", &c), DFLASH_ERR_FORMAT,
                "architectures[0] is 'Qwen3ForCausalLM' but there is a dflash_config");
    /* No architectures: a target unless there is a dflash_config. */
    CHECK_OK(parse_edit(k_qwen3, "architectures", NULL, &c));
    CHECK(c.is_dflash == 0);
    CHECK_OK(parse_edit(k_qwen3, "architectures", "[]", &c));
    CHECK(c.is_dflash == 0);
    /* model_type, when given, must name the architecture's family. */
    CHECK_OK(parse_edit(k_qwen3, "model_type", "\"qwen3\"", &c));
    CHECK_FAILS(parse_edit(k_qwen3, "model_type", "\"llama\"", &c), DFLASH_ERR_FORMAT,
                "cfg.json: architectures[0] is 'Qwen3ForCausalLM' but model_type is 'llama' (expected 'qwen3')");
    CHECK_FAILS(parse_edit(k_qwen3, "model_type", "\"mistral\"", &c), DFLASH_ERR_UNSUPPORTED,
                "cfg.json: model_type is 'mistral'; dflash runs Qwen3, Qwen3-MoE, Llama, Qwen3.5 and Qwen3.5-MoE "
                "models");
    CHECK_FAILS(parse_edit(k_drafter, "model_type", "\"llama\"", &c), DFLASH_ERR_UNSUPPORTED,
                "a DFlash drafter with model_type 'llama'; its layers are Qwen3's");
    CHECK_FAILS(parse_edit(k_drafter, "model_type", "\"qwen3_moe\"", &c), DFLASH_ERR_UNSUPPORTED, "'qwen3_moe'");
}

/* A Llama-3.1-style config: LlamaConfig's defaults (kv heads = heads,
 * head_dim = hidden / heads, 2048 positions), no q/k norms, llama3 RoPE;
 * projection biases where the config asks for them. */
static void test_llama(void)
{
    static const char *llama =
        "{\"architectures\":[\"LlamaForCausalLM\"],\"model_type\":\"llama\",\"hidden_size\":256,"
        "\"intermediate_size\":512,\"num_hidden_layers\":2,\"num_attention_heads\":8,\"vocab_size\":1000,"
        "\"rms_norm_eps\":1e-05,\"rope_theta\":500000.0,\"rope_scaling\":{\"factor\":8.0,\"low_freq_factor\":1.0,"
        "\"high_freq_factor\":4.0,\"original_max_position_embeddings\":8192,\"rope_type\":\"llama3\"},"
        "\"attention_bias\":false,\"mlp_bias\":false,\"tie_word_embeddings\":false}";
    dflash_model_config c;
    CHECK_OK(parse(llama, &c));
    CHECK(c.family == DFLASH_FAMILY_LLAMA && !dflash_config_qk_norm(&c) && c.is_dflash == 0);
    CHECK(c.num_key_value_heads == 8 && c.head_dim == 32 && c.max_position_embeddings == 2048);
    CHECK(c.rope.kind == DFLASH_ROPE_LLAMA3 && c.rope.original_max_pos == 8192);
    CHECK(strcmp(dflash_family_name(c.family), "Llama") == 0);
    CHECK_OK(parse_edit(llama, "architectures", NULL, &c)); /* model_type alone names it */
    CHECK(c.family == DFLASH_FAMILY_LLAMA && !dflash_config_qk_norm(&c));
    CHECK_OK(parse_edit(llama, "num_key_value_heads", "2", &c));
    CHECK(c.num_key_value_heads == 2);
    CHECK(!c.attention_bias && !c.mlp_bias);
    CHECK_OK(parse_edit(llama, "attention_bias", "true", &c));
    CHECK(c.attention_bias && !c.mlp_bias);
    CHECK_OK(parse_edit(llama, "mlp_bias", "true", &c));
    CHECK(!c.attention_bias && c.mlp_bias);
    /* Qwen3 takes attention_bias; its MLP never has biases (as in transformers) */
    CHECK_OK(parse_edit(k_qwen3, "attention_bias", "true", &c));
    CHECK(c.attention_bias);
    CHECK_OK(parse_edit(k_qwen3, "mlp_bias", "true", &c));
    CHECK(!c.mlp_bias);
    /* a drafter's context K/V has no biases: refused, not run without */
    CHECK_FAILS(parse_edit(k_drafter, "attention_bias", "true", &c), DFLASH_ERR_UNSUPPORTED,
                "field 'attention_bias' = true is not supported for a DFlash drafter");
    CHECK_FAILS(parse_edit(llama, "attention_bias", "1", &c), DFLASH_ERR_FORMAT, "'attention_bias' is");
    CHECK_FAILS(parse_edit(llama, "num_attention_heads", "7", &c), DFLASH_ERR_FORMAT,
                "head_dim is missing and hidden_size 256 is not a multiple of num_attention_heads 7");
    CHECK_OK(parse(k_qwen3, &c));
    CHECK(c.family == DFLASH_FAMILY_QWEN3 && dflash_config_qk_norm(&c));
}

/* Qwen3-30B-A3B's config.json (the published one): 48 sparse layers of
 * 128 experts, 8 per token, renormalised; the expert count under either
 * spelling, Qwen3MoeConfig's defaults where fields are absent, and the
 * sparse-layer rule (mlp_only_layers, decoder_sparse_step). */
static void test_qwen3_moe(void)
{
    static const char *moe =
        "{\"architectures\":[\"Qwen3MoeForCausalLM\"],\"model_type\":\"qwen3_moe\",\"hidden_size\":2048,"
        "\"intermediate_size\":6144,\"num_hidden_layers\":48,\"num_attention_heads\":32,\"num_key_value_heads\":4,"
        "\"head_dim\":128,\"vocab_size\":151936,\"rms_norm_eps\":1e-06,\"rope_theta\":1000000.0,"
        "\"num_experts\":128,\"num_experts_per_tok\":8,\"moe_intermediate_size\":768,\"norm_topk_prob\":true,"
        "\"decoder_sparse_step\":1,\"mlp_only_layers\":[],\"max_position_embeddings\":40960,"
        "\"tie_word_embeddings\":false,\"use_sliding_window\":false,\"sliding_window\":null}";
    dflash_model_config c;
    CHECK_OK(parse(moe, &c));
    CHECK(c.family == DFLASH_FAMILY_QWEN3_MOE && dflash_config_qk_norm(&c) && !c.is_dflash);
    CHECK(strcmp(dflash_family_name(c.family), "Qwen3-MoE") == 0);
    CHECK(c.num_experts == 128 && c.num_experts_per_tok == 8 && c.moe_intermediate_size == 768 && c.norm_topk_prob);
    int sparse = 0;
    for (int i = 0; i < c.num_hidden_layers; i++)
        sparse += c.layer_moe[i];
    CHECK(sparse == 48);
    /* num_local_experts, as transformers 5 writes it; both must agree */
    static const char *const renamed_keys[] = { "num_experts", "num_local_experts" };
    static const char *const renamed[] = { NULL, "64" };
    CHECK_OK(parse_edits(moe, 2, renamed_keys, renamed, &c));
    CHECK(c.num_experts == 64);
    CHECK_OK(parse_edit(moe, "num_local_experts", "128", &c));
    CHECK_FAILS(parse_edit(moe, "num_local_experts", "64", &c), DFLASH_ERR_FORMAT,
                "cfg.json: field 'num_experts' = 128 but 'num_local_experts' = 64");
    /* the defaults: 128 experts, 8 per token, 768 wide, no renormalising */
    static const char *const moe_keys[] = { "num_experts", "num_experts_per_tok", "moe_intermediate_size",
                                            "norm_topk_prob" };
    static const char *const absent[] = { NULL, NULL, NULL, NULL };
    CHECK_OK(parse_edits(moe, 4, moe_keys, absent, &c));
    CHECK(c.num_experts == 128 && c.num_experts_per_tok == 8 && c.moe_intermediate_size == 768 &&
          !c.norm_topk_prob);
    /* Qwen3MoeConfig's own defaults: 4 kv heads, head_dim hidden / heads
     * (not Qwen3's 32 and 128) */
    static const char *const geom_keys[] = { "num_key_value_heads", "head_dim" };
    static const char *const geom_absent[] = { NULL, NULL };
    CHECK_OK(parse_edits(moe, 2, geom_keys, geom_absent, &c));
    CHECK(c.num_key_value_heads == 4 && c.head_dim == 64);
    CHECK_OK(parse_edit(moe, "num_key_value_heads", "null", &c)); /* null: num_attention_heads */
    CHECK(c.num_key_value_heads == 32);
    /* dense layers: listed ones, and those off the sparse step */
    CHECK_OK(parse_edit(moe, "mlp_only_layers", "[0, 47]", &c));
    CHECK(!c.layer_moe[0] && c.layer_moe[1] && c.layer_moe[46] && !c.layer_moe[47]);
    CHECK_OK(parse_edit(moe, "decoder_sparse_step", "2", &c));
    CHECK(!c.layer_moe[0] && c.layer_moe[1] && !c.layer_moe[2] && c.layer_moe[47]);
    CHECK_FAILS(parse_edit(moe, "mlp_only_layers", "[48]", &c), DFLASH_ERR_FORMAT,
                "field 'mlp_only_layers[0]' = 48 is outside [0, num_hidden_layers 48)");
    CHECK_FAILS(parse_edit(moe, "mlp_only_layers", "3", &c), DFLASH_ERR_FORMAT, "field 'mlp_only_layers' is");
    CHECK_FAILS(parse_edit(moe, "num_experts_per_tok", "129", &c), DFLASH_ERR_FORMAT,
                "field 'num_experts_per_tok' = 129, more than the 128 experts (num_experts)");
    CHECK_FAILS(parse_edit(moe, "num_experts", "0", &c), DFLASH_ERR_FORMAT, "field 'num_experts' = 0, expected 1..");
    CHECK_FAILS(parse_edit(moe, "decoder_sparse_step", "0", &c), DFLASH_ERR_FORMAT,
                "field 'decoder_sparse_step' = 0, expected > 0");
    CHECK_FAILS(parse_edit(moe, "model_type", "\"qwen3\"", &c), DFLASH_ERR_FORMAT,
                "architectures[0] is 'Qwen3MoeForCausalLM' but model_type is 'qwen3' (expected 'qwen3_moe')");
    /* a dense Qwen3 has no experts */
    CHECK_OK(parse(k_qwen3, &c));
    CHECK(c.num_experts == 0 && !c.layer_moe[0]);
}

/* A Qwen3.5 hybrid, text-only and in the multimodal layout (the text model
 * under text_config): layer kinds, the linear attention's geometry, the
 * partial RoPE's table over the rotary dimensions only, a MoE with its
 * shared expert; what is left implicit takes transformers' defaults, and
 * a factor below 1 stays refused on the other families. */
static void test_qwen35(void)
{
    static const char *text =
        "{\"architectures\":[\"Qwen3_5ForCausalLM\"],\"model_type\":\"qwen3_5_text\",\"hidden_size\":64,"
        "\"intermediate_size\":128,\"num_hidden_layers\":4,\"num_attention_heads\":4,\"num_key_value_heads\":2,"
        "\"head_dim\":16,\"vocab_size\":512,\"rms_norm_eps\":1e-06,\"linear_conv_kernel_dim\":4,"
        "\"linear_key_head_dim\":16,\"linear_value_head_dim\":8,\"linear_num_key_heads\":2,"
        "\"linear_num_value_heads\":4,\"layer_types\":[\"linear_attention\",\"linear_attention\","
        "\"linear_attention\",\"full_attention\"],\"rope_parameters\":{\"rope_type\":\"default\","
        "\"rope_theta\":10000000.0,\"partial_rotary_factor\":0.25},\"tie_word_embeddings\":false}";
    dflash_model_config c;
    CHECK_OK(parse(text, &c));
    CHECK(c.family == DFLASH_FAMILY_QWEN35 && !c.multimodal && !c.num_experts);
    CHECK(strcmp(dflash_family_name(c.family), "Qwen3.5") == 0);
    CHECK(c.layer_linear[0] && c.layer_linear[2] && !c.layer_linear[3]);
    CHECK(c.linear_num_value_heads == 4 && c.linear_value_head_dim == 8 && c.linear_conv_kernel == 4);
    /* the table covers the 4 rotary dimensions: inv_freq[j] = theta^(-2j/4) */
    CHECK(c.rotary_dim == 4 && c.rope_freq.n_pairs == 2 && c.rope_freq.inv_freq[0] == 1.0f &&
          fabs(c.rope_freq.inv_freq[1] - 1.0 / sqrt(1e7)) < 1e-9);
    /* defaults: layer kinds from full_attention_interval, partial 0.25 */
    static const char *const keys[] = { "layer_types", "rope_parameters", "full_attention_interval" };
    static const char *const vals[] = { NULL, "{\"rope_type\":\"default\",\"rope_theta\":10000.0}", "2" };
    CHECK_OK(parse_edits(text, 3, keys, vals, &c));
    CHECK(c.layer_linear[0] && !c.layer_linear[1] && c.layer_linear[2] && !c.layer_linear[3] && c.rotary_dim == 4);
    CHECK_FAILS(parse_edit(text, "head_dim", NULL, &c), DFLASH_ERR_FORMAT, "head_dim is missing: set it explicitly");
    CHECK_FAILS(parse_edit(text, "linear_num_value_heads", "3", &c), DFLASH_ERR_FORMAT,
                "linear_num_value_heads = 3 is not a multiple of linear_num_key_heads = 2");
    CHECK_FAILS(parse_edit(text, "rope_parameters", "{\"rope_type\":\"default\",\"partial_rotary_factor\":0.1}", &c),
                DFLASH_ERR_FORMAT, "gives 1 rotary dimensions of head_dim 16");
    /* the multimodal folder: the same text model under text_config */
    json_t *mm = json_pack("{s:[s], s:s, s:b, s:{}}", "architectures", "Qwen3_5MoeForConditionalGeneration",
                           "model_type", "qwen3_5_moe", "tie_word_embeddings", 0, "vision_config");
    json_t *t = json_loads(text, 0, NULL);
    json_object_set_new(t, "model_type", json_string("qwen3_5_moe_text"));
    json_object_del(t, "intermediate_size");
    json_object_set_new(t, "num_experts", json_integer(8));
    json_object_set_new(t, "num_experts_per_tok", json_integer(2));
    json_object_set_new(t, "shared_expert_intermediate_size", json_integer(48));
    json_object_set_new(mm, "text_config", t);
    char *mm_text = json_dumps(mm, 0);
    json_decref(mm);
    CHECK_OK(parse(mm_text, &c));
    CHECK(c.family == DFLASH_FAMILY_QWEN35_MOE && c.multimodal && c.hidden_size == 64 && c.intermediate_size == 0);
    CHECK(c.num_experts == 8 && c.num_experts_per_tok == 2 && c.moe_intermediate_size == 512 && c.norm_topk_prob &&
          c.shared_expert_intermediate_size == 48 && c.layer_moe[0] && c.layer_moe[3]);
    CHECK_FAILS(parse_edit(mm_text, "text_config", "3", &c), DFLASH_ERR_FORMAT, "field 'text_config' is");
    free(mm_text);
    /* the other families still refuse a partial rotation */
    CHECK_FAILS(parse_edit(k_qwen3, "partial_rotary_factor", "0.5", &c), DFLASH_ERR_UNSUPPORTED,
                "'partial_rotary_factor' = 0.5 is not supported");
}

/* ---- DFlash drafters ---------------------------------------------------- */

static void test_drafter_explicit(void)
{
    dflash_model_config c;
    CHECK_OK(parse(k_drafter, &c));
    CHECK(c.is_dflash == 1 && c.block_size == 16 && c.num_target_layers == 36 && c.mask_token_id == 151669);
    CHECK(c.n_target_layer_ids == 5 && c.target_layer_ids[0] == 1 && c.target_layer_ids[4] == 33);
    CHECK(strcmp(c.torch_dtype, "bfloat16") == 0);
    /* A drafter may use sliding windows; only targets refuse it. */
    CHECK_OK(parse_edit(k_drafter, "use_sliding_window", "true", &c));
    /* Without architectures, dflash_config marks a drafter. */
    CHECK_OK(parse_edit(k_drafter, "architectures", NULL, &c));
    CHECK(c.is_dflash == 1);
}

static void check_ids(const int *got, const int *want, int n)
{
    for (int i = 0; i < n; i++)
        CHECKF(got[i] == want[i], "id %d: got %d want %d", i, got[i], want[i]);
}

static void test_default_target_layer_ids(void)
{
    /* Expected values computed with Python 3:
     * [int(round(1 + i*(nt-4)/(nd-1))) for i in range(nd)]. */
    int out[DFLASH_MAX_TAPS];
    const int a[] = { 1, 9, 17, 25, 33 };
    dflash_default_target_layer_ids(36, 5, out);
    check_ids(out, a, 5);
    const int b[] = { 1, 6, 11, 16, 22, 27, 32, 37 };
    dflash_default_target_layer_ids(40, 8, out);
    check_ids(out, b, 8);
    dflash_default_target_layer_ids(4, 1, out);
    CHECK(out[0] == 2);
    /* Exact halves go to the even neighbour: 3.5 -> 4, 2.5 -> 2. */
    const int c[] = { 1, 4, 6 };
    dflash_default_target_layer_ids(9, 3, out);
    check_ids(out, c, 3);
    const int d[] = { 1, 2, 4 };
    dflash_default_target_layer_ids(7, 3, out);
    check_ids(out, d, 3);
    const int e[] = { 1, 7, 13, 19, 25 };
    dflash_default_target_layer_ids(28, 5, out);
    check_ids(out, e, 5);

    /* Through the parser when dflash_config has no target_layer_ids. */
    dflash_model_config cfg;
    CHECK_OK(parse_edit(k_drafter, "dflash_config", "{\"mask_token_id\":151669}", &cfg));
    CHECK(cfg.n_target_layer_ids == 5);
    check_ids(cfg.target_layer_ids, a, 5);
}

static void test_drafter_errors(void)
{
    dflash_model_config c;
    CHECK_FAILS(parse_edit(k_drafter, "num_target_layers", NULL, &c), DFLASH_ERR_FORMAT,
                "required field 'num_target_layers' is missing");
    CHECK_FAILS(parse_edit(k_drafter, "num_target_layers", "0", &c), DFLASH_ERR_FORMAT, "'num_target_layers' = 0");
    CHECK_FAILS(parse_edit(k_drafter, "block_size", "1", &c), DFLASH_ERR_FORMAT, "'block_size' = 1, expected 2..64");
    CHECK_FAILS(parse_edit(k_drafter, "block_size", "65", &c), DFLASH_ERR_FORMAT, "'block_size' = 65");
    CHECK_OK(parse_edit(k_drafter, "block_size", NULL, &c));
    CHECK(c.block_size == 16);
    CHECK_FAILS(parse_edit(k_drafter, "dflash_config", "{\"target_layer_ids\":[1]}", &c), DFLASH_ERR_FORMAT,
                "required field 'dflash_config.mask_token_id' is missing");
    CHECK_FAILS(parse_edit(k_drafter, "dflash_config", NULL, &c), DFLASH_ERR_FORMAT, "dflash_config.mask_token_id");
    CHECK_FAILS(parse_edit(k_drafter, "dflash_config", "7", &c), DFLASH_ERR_FORMAT, "'dflash_config' is an integer");
    CHECK_FAILS(parse_edit(k_drafter, "dflash_config", "{\"mask_token_id\":151936}", &c), DFLASH_ERR_FORMAT,
                "'dflash_config.mask_token_id' = 151936 is outside [0, vocab_size 151936)");
    CHECK_FAILS(parse_edit(k_drafter, "dflash_config", "{\"mask_token_id\":1,\"target_layer_ids\":[1,36]}", &c),
                DFLASH_ERR_FORMAT, "dflash_config.target_layer_ids[1] = 36 is outside [0, num_target_layers 36)");
    CHECK_FAILS(parse_edit(k_drafter, "dflash_config", "{\"mask_token_id\":1,\"target_layer_ids\":[]}", &c),
                DFLASH_ERR_FORMAT, "has 0 entries");
    CHECK_FAILS(parse_edit(k_drafter, "dflash_config", "{\"mask_token_id\":1,\"target_layer_ids\":[1.5]}", &c),
                DFLASH_ERR_FORMAT, "'dflash_config.target_layer_ids[0]' is a real number");
}

/* k_drafter with top-level field `top` set to top_value (NULL: removed) and
 * dflash_config replaced by `dcfg`, parsed. */
static dflash_status parse_drafter(const char *top, const char *top_value, const char *dcfg, dflash_model_config *c)
{
    const char *keys[] = { top, "dflash_config" }, *values[] = { top_value, dcfg };
    return parse_edits(k_drafter, 2, keys, values, c);
}

/* The layouts newer drafters use: block_size inside dflash_config, eight
 * taps, causal flags (top-level is_causal or dflash_config.causal). */
static void test_drafter_layouts(void)
{
    dflash_model_config c;
    CHECK_OK(parse_drafter("block_size", NULL,
                           "{\"mask_token_id\":1,\"block_size\":10,\"target_layer_ids\":[1,5,9,13,17,21,25,29]}", &c));
    CHECK(c.block_size == 10 && c.n_target_layer_ids == 8 && c.target_layer_ids[7] == 29 && !c.drafter_causal);
    CHECK_OK(parse_drafter("block_size", "10", "{\"mask_token_id\":1,\"block_size\":10}", &c));
    CHECK(c.block_size == 10);
    CHECK_FAILS(parse_drafter("block_size", "16", "{\"mask_token_id\":1,\"block_size\":8}", &c), DFLASH_ERR_FORMAT,
                "'block_size' = 16 but 'dflash_config.block_size' = 8");
    CHECK_FAILS(parse_drafter("block_size", NULL, "{\"mask_token_id\":1,\"block_size\":1}", &c), DFLASH_ERR_FORMAT,
                "'dflash_config.block_size' = 1, expected 2..64");
    CHECK_OK(parse_drafter("is_causal", "true", "{\"mask_token_id\":1}", &c));
    CHECK(c.drafter_causal == 1);
    CHECK_OK(parse_drafter("is_causal", NULL, "{\"mask_token_id\":1,\"causal\":true}", &c));
    CHECK(c.drafter_causal == 1);
    CHECK_FAILS(parse_drafter("is_causal", "false", "{\"mask_token_id\":1,\"causal\":true}", &c), DFLASH_ERR_FORMAT,
                "'is_causal' = false but 'dflash_config.causal' = true");
    CHECK_FAILS(parse_drafter("is_causal", NULL, "{\"mask_token_id\":1,\"causal\":1}", &c), DFLASH_ERR_FORMAT,
                "'causal' is an integer, expected a boolean");
}

static void test_drafter_top_level_fields_not_read(void)
{
    /* Only dflash_config carries mask_token_id; a top-level copy is named in
     * the error so the writer sees why it was not taken. */
    json_t *root = json_loads(k_drafter, 0, NULL);
    json_object_set_new(root, "dflash_config", json_object());
    json_object_set_new(root, "mask_token_id", json_integer(5));
    char *text = json_dumps(root, 0);
    json_decref(root);
    dflash_model_config c;
    CHECK_FAILS(parse(text, &c), DFLASH_ERR_FORMAT, "a top-level mask_token_id is not read");
    free(text);
}

static void test_drafter_small_target(void)
{
    /* 2 target layers, 2 draft layers: the default spread gives [1, -1]. */
    json_t *root = json_loads(k_drafter, 0, NULL);
    json_object_set_new(root, "num_target_layers", json_integer(2));
    json_object_set_new(root, "num_hidden_layers", json_integer(2));
    json_object_set_new(root, "dflash_config", json_pack("{s:i}", "mask_token_id", 3));
    char *text = json_dumps(root, 0);
    json_decref(root);
    dflash_model_config c;
    CHECK_FAILS(parse(text, &c), DFLASH_ERR_FORMAT, "default target_layer_ids[1] = -1 is outside");
    free(text);
}

/* ---- files -------------------------------------------------------------- */

static void test_load_file_and_folder(void)
{
    char dir[] = "/tmp/dflash-cfg-XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    char path[256];
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    if (f) {
        fputs(k_drafter, f);
        fclose(f);
    }
    dflash_model_config c;
    CHECK_OK(dflash_config_load(path, &c));
    CHECK(c.is_dflash && c.hidden_size == 4096);
    CHECK_OK(dflash_config_load(dir, &c));
    CHECK(c.num_target_layers == 36);
    unlink(path);
    CHECK_FAILS(dflash_config_load(dir, &c), DFLASH_ERR_NOT_FOUND, "config.json: cannot open: No such file");
    rmdir(dir);
}

/* A checkpoint's loaders take its folder: a file there is named, with the
 * folder to give instead. */
static void test_folder_check(void)
{
    char dir[] = "/tmp/dflash-cfg-XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    char path[256], want[512];
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    if (f)
        fclose(f);
    CHECK_OK(dflash_config_check_folder(dir, "-m"));
    CHECK_OK(dflash_config_check_folder("/nonexistent/folder", "-m")); /* left to whatever opens it */
    snprintf(want, sizeof want, "%s is a file, but -m takes the checkpoint folder (the one holding config.json and "
             "the *.safetensors files): give %s", path, dir);
    CHECK_FAILS(dflash_config_check_folder(path, "-m"), DFLASH_ERR_INVALID_ARG, want);
    unlink(path);
    rmdir(dir);
}

int main(void)
{
    RUN(test_qwen3_full);
    RUN(test_defaults);
    RUN(test_rope_parameters);
    RUN(test_llama);
    RUN(test_rope_scaling);
    RUN(test_eos_and_bos);
    RUN(test_required_and_types);
    RUN(test_bad_values);
    RUN(test_bad_json);
    RUN(test_layer_types);
    RUN(test_head_dim_and_kv_defaults);
    RUN(test_architectures);
    RUN(test_drafter_explicit);
    RUN(test_default_target_layer_ids);
    RUN(test_drafter_errors);
    RUN(test_qwen3_moe);
    RUN(test_qwen35);
    RUN(test_drafter_top_level_fields_not_read);
    RUN(test_drafter_layouts);
    RUN(test_drafter_small_target);
    RUN(test_load_file_and_folder);
    RUN(test_folder_check);
    TEST_END();
}
