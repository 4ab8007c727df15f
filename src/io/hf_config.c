/* hf_config.c: owns reading a Hugging Face config.json of a target (Qwen3 or
 * Llama) or a DFlash drafter into dflash_model_config: which architectures
 * are run, field defaults as transformers applies them per family (an
 * omitted Qwen3 head_dim or num_key_value_heads whose transformers default
 * differs from the usual fallback is refused), type and range checks,
 * the drafter's default tap layers, and telling a file from the checkpoint
 * folder a loader expects. Every rejection names the source (file or
 * label), the field and the value. */
#include "io/hf_config.h"

#include "core/file.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>

#include "io/json_util.h"
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define CFG_MAX_FILE (64u << 20) /* a config.json is a few KB */

/* ---- typed field readers ----------------------------------------------- */


/* A field that is absent or JSON null counts as not given. */
static const json_t *cfg_field(const json_t *obj, const char *key)
{
    const json_t *v = obj ? json_object_get(obj, key) : NULL;
    return v && !json_is_null(v) ? v : NULL;
}

static dflash_status cfg_missing(const char *label, const char *field)
{
    return dflash_fail(DFLASH_ERR_FORMAT, "%s: required field '%s' is missing", label, field);
}

static dflash_status cfg_wrong_type(const char *label, const char *field, const json_t *v, const char *want)
{
    return dflash_fail(DFLASH_ERR_FORMAT, "%s: field '%s' is %s, expected %s", label, field, dflash_json_type_name(v),
                       want);
}

static dflash_status cfg_int_value(const char *label, const char *field, const json_t *v, int *out)
{
    if (!json_is_integer(v))
        return cfg_wrong_type(label, field, v, "an integer");
    json_int_t x = json_integer_value(v);
    if (x < INT_MIN || x > INT_MAX)
        return dflash_fail(DFLASH_ERR_FORMAT, "%s: field '%s' = %lld does not fit in an int", label, field,
                           (long long)x);
    *out = (int)x;
    return DFLASH_OK;
}

/* Integer `key` of `obj`; `field` is its printed name. When absent: error
 * if `required`, else `def`. */
static dflash_status cfg_int(const char *label, const json_t *obj, const char *key, const char *field,
                             int required, int def, int *out)
{
    const json_t *v = cfg_field(obj, key);
    if (!v) {
        if (required)
            return cfg_missing(label, field);
        *out = def;
        return DFLASH_OK;
    }
    return cfg_int_value(label, field, v, out);
}

static dflash_status cfg_positive_int(const char *label, const json_t *obj, const char *key, int required,
                                      int def, int *out)
{
    DFLASH_TRY(cfg_int(label, obj, key, key, required, def, out));
    if (*out <= 0)
        return dflash_fail(DFLASH_ERR_FORMAT, "%s: field '%s' = %d, expected > 0", label, key, *out);
    return DFLASH_OK;
}

static dflash_status cfg_number(const char *label, const json_t *obj, const char *key, const char *field,
                                double def, double *out)
{
    const json_t *v = cfg_field(obj, key);
    if (!v) {
        *out = def;
        return DFLASH_OK;
    }
    if (!json_is_number(v))
        return cfg_wrong_type(label, field, v, "a number");
    *out = json_number_value(v);
    return DFLASH_OK;
}

static dflash_status cfg_bool(const char *label, const json_t *obj, const char *key, int *out)
{
    const json_t *v = cfg_field(obj, key);
    if (!v) {
        *out = 0;
        return DFLASH_OK;
    }
    if (!json_is_boolean(v))
        return cfg_wrong_type(label, key, v, "a boolean");
    *out = json_is_true(v);
    return DFLASH_OK;
}

/* Copies a string field into `buf` ("" when absent). */
static dflash_status cfg_string(const char *label, const char *field, const json_t *v, char *buf, size_t n)
{
    buf[0] = 0;
    if (!v)
        return DFLASH_OK;
    if (!json_is_string(v))
        return cfg_wrong_type(label, field, v, "a string");
    const char *s = json_string_value(v);
    if (strlen(s) >= n)
        return dflash_fail(DFLASH_ERR_FORMAT, "%s: field '%s' = \"%s\" is longer than %zu characters", label,
                           field, s, n - 1);
    memcpy(buf, s, strlen(s) + 1);
    return DFLASH_OK;
}

static dflash_status cfg_token_id(const char *label, const char *field, int id, int vocab)
{
    if (id < 0 || id >= vocab)
        return dflash_fail(DFLASH_ERR_FORMAT, "%s: field '%s' = %d is outside [0, vocab_size %d)", label, field,
                           id, vocab);
    return DFLASH_OK;
}

/* ---- sections ----------------------------------------------------------- */

/* transformers' Qwen3Config defaults for fields a config.json may omit.
 * The fallbacks other tools use (num_attention_heads, hidden_size /
 * num_attention_heads) would run another model than transformers does, so
 * an omitted field is accepted only where both readings agree. LlamaConfig
 * defaults to exactly those fallbacks; Qwen3MoeConfig to 4 kv heads and,
 * having no head_dim field, hidden_size / num_attention_heads. */
#define CFG_HF_KV_HEADS 32
#define CFG_HF_HEAD_DIM 128
#define CFG_HF_MOE_KV_HEADS 4

/* An explicit null means num_attention_heads (transformers' backward
 * compatibility rule, and a Llama's default); absent means CFG_HF_KV_HEADS
 * for Qwen3, CFG_HF_MOE_KV_HEADS for Qwen3-MoE. */
static dflash_status cfg_parse_kv_heads(const char *label, const json_t *root, dflash_model_config *c)
{
    const json_t *v = json_object_get(root, "num_key_value_heads");
    if (!v && dflash_family_is_qwen35(c->family)) /* published configs give it; the two classes' defaults differ */
        return dflash_fail(DFLASH_ERR_FORMAT, "%s: num_key_value_heads is missing: set it explicitly", label);
    if ((v && json_is_null(v)) || (!v && c->family == DFLASH_FAMILY_LLAMA)) {
        c->num_key_value_heads = c->num_attention_heads;
        return DFLASH_OK;
    }
    if (!v && c->family == DFLASH_FAMILY_QWEN3_MOE) {
        c->num_key_value_heads = CFG_HF_MOE_KV_HEADS;
        return DFLASH_OK;
    }
    if (!v && c->num_attention_heads != CFG_HF_KV_HEADS)
        return dflash_fail(DFLASH_ERR_FORMAT,
                           "%s: num_key_value_heads is missing; transformers' default for Qwen3 (%d) differs from "
                           "num_attention_heads (%d): set it explicitly", label, CFG_HF_KV_HEADS,
                           c->num_attention_heads);
    return cfg_positive_int(label, root, "num_key_value_heads", 0, CFG_HF_KV_HEADS, &c->num_key_value_heads);
}

/* Absent means CFG_HF_HEAD_DIM for Qwen3 (an explicit null transformers
 * cannot run: its attention would size with None, so it is read the same
 * way), hidden_size / num_attention_heads for a Llama and a Qwen3-MoE. */
static dflash_status cfg_parse_head_dim(const char *label, const json_t *root, dflash_model_config *c)
{
    const json_t *v = json_object_get(root, "head_dim");
    if ((!v || json_is_null(v)) && dflash_family_is_qwen35(c->family))
        return dflash_fail(DFLASH_ERR_FORMAT, "%s: head_dim is %s: set it explicitly", label, v ? "null" : "missing");
    if (!v || json_is_null(v)) {
        int split = c->hidden_size % c->num_attention_heads == 0 ? c->hidden_size / c->num_attention_heads : -1;
        if (c->family == DFLASH_FAMILY_LLAMA || c->family == DFLASH_FAMILY_QWEN3_MOE) {
            if (split <= 0)
                return dflash_fail(DFLASH_ERR_FORMAT, "%s: head_dim is %s and hidden_size %d is not a multiple of "
                                   "num_attention_heads %d: set it explicitly", label, v ? "null" : "missing",
                                   c->hidden_size, c->num_attention_heads);
            c->head_dim = split;
            return DFLASH_OK;
        }
        if (split != CFG_HF_HEAD_DIM)
            return dflash_fail(DFLASH_ERR_FORMAT,
                               "%s: head_dim is %s; transformers' default for Qwen3 (%d) differs from hidden_size / "
                               "num_attention_heads (%g): set it explicitly", label, v ? "null" : "missing",
                               CFG_HF_HEAD_DIM, (double)c->hidden_size / c->num_attention_heads);
        c->head_dim = CFG_HF_HEAD_DIM;
        return DFLASH_OK;
    }
    return cfg_positive_int(label, root, "head_dim", 1, 0, &c->head_dim);
}

static dflash_status cfg_parse_sizes(const char *label, const json_t *root, dflash_model_config *c)
{
    DFLASH_TRY(cfg_positive_int(label, root, "hidden_size", 1, 0, &c->hidden_size));
    DFLASH_TRY(cfg_positive_int(label, root, "num_hidden_layers", 1, 0, &c->num_hidden_layers));
    if (c->num_hidden_layers > DFLASH_MAX_LAYERS)
        return dflash_fail(DFLASH_ERR_FORMAT, "%s: field 'num_hidden_layers' = %d, at most %d are supported", label,
                           c->num_hidden_layers, DFLASH_MAX_LAYERS);
    DFLASH_TRY(cfg_positive_int(label, root, "num_attention_heads", 1, 0, &c->num_attention_heads));
    DFLASH_TRY(cfg_parse_kv_heads(label, root, c));
    if (c->num_attention_heads % c->num_key_value_heads != 0)
        return dflash_fail(DFLASH_ERR_FORMAT,
                           "%s: num_attention_heads = %d is not divisible by num_key_value_heads = %d", label,
                           c->num_attention_heads, c->num_key_value_heads);
    DFLASH_TRY(cfg_parse_head_dim(label, root, c));
    /* a Qwen3.5-MoE has no dense MLP, hence no intermediate_size (0) */
    if (c->family != DFLASH_FAMILY_QWEN35_MOE || cfg_field(root, "intermediate_size"))
        DFLASH_TRY(cfg_positive_int(label, root, "intermediate_size", 1, 0, &c->intermediate_size));
    DFLASH_TRY(cfg_positive_int(label, root, "vocab_size", 1, 0, &c->vocab_size));
    /* transformers' defaults: Qwen3Config 32768, LlamaConfig 2048 */
    DFLASH_TRY(cfg_positive_int(label, root, "max_position_embeddings", 0,
                                c->family == DFLASH_FAMILY_LLAMA ? 2048 : 32768, &c->max_position_embeddings));
    double eps = 0;
    DFLASH_TRY(cfg_number(label, root, "rms_norm_eps", "rms_norm_eps", 1e-6, &eps));
    if (!(eps > 0))
        return dflash_fail(DFLASH_ERR_FORMAT, "%s: field 'rms_norm_eps' = %g, expected > 0", label, eps);
    c->rms_norm_eps = (float)eps;
    return DFLASH_OK;
}

/* A positive number of a RoPE object (`field` names the object): missing
 * is an error when `required`, else `def`. */
static dflash_status cfg_rope_positive(const char *label, const char *field, const json_t *obj, const char *key,
                                       int required, double def, double *out)
{
    char printed[96];
    snprintf(printed, sizeof printed, "%s.%s", field, key);
    if (required && !cfg_field(obj, key))
        return cfg_missing(label, printed);
    DFLASH_TRY(cfg_number(label, obj, key, printed, def, out));
    if (cfg_field(obj, key) && !(*out > 0))
        return dflash_fail(DFLASH_ERR_FORMAT, "%s: field '%s' = %g, expected > 0", label, printed, *out);
    return DFLASH_OK;
}

/* One RoPE description (`rope_scaling` or `rope_parameters`), with the
 * keys transformers reads for its kind. A kind this project does not
 * implement would silently change the positions, so it is refused. */
static dflash_status cfg_parse_rope_kind(const char *label, const char *field, const json_t *obj,
                                         dflash_model_config *c)
{
    static const struct {
        const char *name;
        dflash_rope_kind kind;
    } kinds[] = { { "default", DFLASH_ROPE_DEFAULT },
                  { "linear", DFLASH_ROPE_LINEAR },
                  { "llama3", DFLASH_ROPE_LLAMA3 },
                  { "yarn", DFLASH_ROPE_YARN } };
    const char *type_key = cfg_field(obj, "rope_type") ? "rope_type" : "type";
    const json_t *t = cfg_field(obj, type_key);
    char name[64], printed[96];
    snprintf(printed, sizeof printed, "%s.%s", field, type_key);
    DFLASH_TRY(cfg_string(label, printed, t, name, sizeof name));
    double partial = 1;
    char partial_field[96];
    snprintf(partial_field, sizeof partial_field, "%s.partial_rotary_factor", field);
    DFLASH_TRY(cfg_number(label, obj, "partial_rotary_factor", partial_field, 1, &partial));
    if (partial != 1 && !dflash_family_is_qwen35(c->family)) /* Qwen3.5's is read by cfg_parse_rope */
        return dflash_fail(DFLASH_ERR_UNSUPPORTED, "%s: field '%s' = %g is not supported (only 1: every dimension "
                           "rotates)", label, partial_field, partial);
    size_t k = 0;
    while (k < sizeof kinds / sizeof kinds[0] && strcmp(name, kinds[k].name) != 0)
        k++;
    if (name[0] == 0 || k == 0)
        return DFLASH_OK;
    if (k == sizeof kinds / sizeof kinds[0])
        return dflash_fail(DFLASH_ERR_UNSUPPORTED,
                           "%s: field '%s' = \"%s\" is not supported (default, linear, llama3, yarn are)", label,
                           printed, name);
    dflash_rope_params *p = &c->rope;
    p->kind = kinds[k].kind;
    DFLASH_TRY(cfg_rope_positive(label, field, obj, "factor", 1, 1, &p->factor));
    if (p->kind == DFLASH_ROPE_LLAMA3) {
        DFLASH_TRY(cfg_rope_positive(label, field, obj, "low_freq_factor", 1, 1, &p->low_freq_factor));
        DFLASH_TRY(cfg_rope_positive(label, field, obj, "high_freq_factor", 1, 1, &p->high_freq_factor));
        if (!(p->high_freq_factor > p->low_freq_factor))
            return dflash_fail(DFLASH_ERR_FORMAT, "%s: field '%s.high_freq_factor' = %g, expected more than "
                               "low_freq_factor (%g)", label, field, p->high_freq_factor, p->low_freq_factor);
        DFLASH_TRY(cfg_rope_positive(label, field, obj, "original_max_position_embeddings", 1, 1,
                                     &p->original_max_pos));
    } else if (p->kind == DFLASH_ROPE_YARN) {
        /* absent: the context the model was configured for, as transformers does */
        DFLASH_TRY(cfg_rope_positive(label, field, obj, "original_max_position_embeddings", 0,
                                     c->max_position_embeddings, &p->original_max_pos));
        DFLASH_TRY(cfg_rope_positive(label, field, obj, "attention_factor", 0, 0, &p->attention_factor));
        DFLASH_TRY(cfg_rope_positive(label, field, obj, "mscale", 0, 0, &p->mscale));
        DFLASH_TRY(cfg_rope_positive(label, field, obj, "mscale_all_dim", 0, 0, &p->mscale_all_dim));
        DFLASH_TRY(cfg_rope_positive(label, field, obj, "beta_fast", 0, 32, &p->beta_fast));
        DFLASH_TRY(cfg_rope_positive(label, field, obj, "beta_slow", 0, 1, &p->beta_slow));
        p->truncate = 1;
        if (cfg_field(obj, "truncate")) {
            snprintf(printed, sizeof printed, "%s.truncate", field);
            if (!json_is_boolean(cfg_field(obj, "truncate")))
                return cfg_wrong_type(label, printed, cfg_field(obj, "truncate"), "a boolean");
            p->truncate = json_is_true(cfg_field(obj, "truncate"));
        }
    }
    return DFLASH_OK;
}

/* RoPE: rope_theta at the top level or in rope_parameters; the kind from
 * rope_scaling (published configs) or else rope_parameters (what
 * transformers 5 writes); then the frequency table for head_dim, or for a
 * Qwen3.5's rotary part: its first head_dim * partial_rotary_factor
 * dimensions (rope_parameters' value, else the top-level one, else 0.25;
 * the other families' transformers code rotates every dimension, so a
 * factor below 1 there is refused). */
static dflash_status cfg_parse_rope(const char *label, const json_t *root, dflash_model_config *c)
{
    c->rope = (dflash_rope_params){ .kind = DFLASH_ROPE_DEFAULT, .factor = 1 };
    const json_t *params = cfg_field(root, "rope_parameters");
    if (params && !json_is_object(params))
        return cfg_wrong_type(label, "rope_parameters", params, "an object");
    if (cfg_field(root, "rope_theta"))
        DFLASH_TRY(cfg_number(label, root, "rope_theta", "rope_theta", 10000, &c->rope.theta));
    else
        DFLASH_TRY(cfg_number(label, params, "rope_theta", "rope_parameters.rope_theta", 10000, &c->rope.theta));
    if (!(c->rope.theta > 0))
        return dflash_fail(DFLASH_ERR_FORMAT, "%s: field 'rope_theta' = %g, expected > 0", label, c->rope.theta);
    const json_t *scaling = cfg_field(root, "rope_scaling");
    if (scaling && !json_is_object(scaling))
        return cfg_wrong_type(label, "rope_scaling", scaling, "an object or null");
    if (scaling)
        DFLASH_TRY(cfg_parse_rope_kind(label, "rope_scaling", scaling, c));
    if (params && c->rope.kind == DFLASH_ROPE_DEFAULT)
        DFLASH_TRY(cfg_parse_rope_kind(label, "rope_parameters", params, c));
    const int q35 = dflash_family_is_qwen35(c->family);
    double partial = q35 ? 0.25 : 1;
    const char *partial_field = "partial_rotary_factor";
    if (q35 && cfg_field(params, "partial_rotary_factor"))
        partial_field = "rope_parameters.partial_rotary_factor";
    DFLASH_TRY(cfg_number(label, q35 && cfg_field(params, "partial_rotary_factor") ? params : root,
                          "partial_rotary_factor", partial_field, partial, &partial));
    if (partial != 1 && !q35)
        return dflash_fail(DFLASH_ERR_UNSUPPORTED, "%s: field 'partial_rotary_factor' = %g is not supported (only 1: "
                           "every dimension rotates)", label, partial);
    c->rotary_dim = (int)(c->head_dim * partial); /* transformers' int(): truncation */
    if (q35 && (!(partial > 0 && partial <= 1) || c->rotary_dim < 2 || c->rotary_dim % 2))
        return dflash_fail(DFLASH_ERR_FORMAT, "%s: field '%s' = %g gives %d rotary dimensions of head_dim %d, expected "
                           "an even count of at least 2", label, partial_field, partial, c->rotary_dim, c->head_dim);
    dflash_status s = dflash_rope_init(&c->rope, c->rotary_dim, &c->rope_freq);
    return s == DFLASH_OK ? s : dflash_fail_prefix(s, "%s: ", label);
}

static dflash_status cfg_parse_tokens(const char *label, const json_t *root, dflash_model_config *c)
{
    DFLASH_TRY(cfg_int(label, root, "bos_token_id", "bos_token_id", 0, -1, &c->bos_token_id));
    if (cfg_field(root, "bos_token_id"))
        DFLASH_TRY(cfg_token_id(label, "bos_token_id", c->bos_token_id, c->vocab_size));
    const json_t *eos = cfg_field(root, "eos_token_id");
    c->n_eos = 0;
    if (!eos)
        return DFLASH_OK;
    if (json_is_integer(eos)) {
        DFLASH_TRY(cfg_int_value(label, "eos_token_id", eos, &c->eos_token_ids[0]));
        c->n_eos = 1;
    } else if (json_is_array(eos)) {
        if (json_array_size(eos) > DFLASH_MAX_EOS)
            return dflash_fail(DFLASH_ERR_FORMAT, "%s: field 'eos_token_id' lists %zu ids, at most %d are supported",
                               label, json_array_size(eos), DFLASH_MAX_EOS);
        for (size_t i = 0; i < json_array_size(eos); i++) {
            char field[48];
            snprintf(field, sizeof field, "eos_token_id[%zu]", i);
            DFLASH_TRY(cfg_int_value(label, field, json_array_get(eos, i), &c->eos_token_ids[i]));
        }
        c->n_eos = (int)json_array_size(eos);
    } else
        return cfg_wrong_type(label, "eos_token_id", eos, "an integer, a list of integers or null");
    for (int i = 0; i < c->n_eos; i++)
        DFLASH_TRY(cfg_token_id(label, "eos_token_id", c->eos_token_ids[i], c->vocab_size));
    return DFLASH_OK;
}

static dflash_status cfg_parse_names(const char *label, const json_t *root, dflash_model_config *c)
{
    const json_t *arch = cfg_field(root, "architectures");
    if (arch && !json_is_array(arch))
        return cfg_wrong_type(label, "architectures", arch, "a list of strings");
    DFLASH_TRY(cfg_string(label, "architectures[0]", arch ? json_array_get(arch, 0) : NULL, c->architecture,
                          sizeof c->architecture));
    /* transformers >= 4.56 writes `dtype`; older ones `torch_dtype`. */
    const char *dtype_key = cfg_field(root, "torch_dtype") ? "torch_dtype" : "dtype";
    DFLASH_TRY(cfg_string(label, dtype_key, cfg_field(root, dtype_key), c->torch_dtype, sizeof c->torch_dtype));
    return cfg_bool(label, root, "tie_word_embeddings", &c->tie_word_embeddings);
}

/* What the file describes. architectures[0] names the class the checkpoint
 * was saved from (a drafter's is DFlashDraftModel); any other (or a
 * model_type other than qwen3) has weights or semantics dflash does not
 * implement, so it is refused by name instead of run as Qwen3. A config
 * without architectures (written by hand, or by Qwen3Config itself) is a
 * drafter when it has a dflash_config, else a target. */
static const struct {
    const char *model_type, *architecture;
    dflash_family family;
} k_families[] = {
    { "qwen3", "Qwen3ForCausalLM", DFLASH_FAMILY_QWEN3 },
    { "llama", "LlamaForCausalLM", DFLASH_FAMILY_LLAMA },
    { "qwen3_moe", "Qwen3MoeForCausalLM", DFLASH_FAMILY_QWEN3_MOE },
    { "qwen3_5_text", "Qwen3_5ForCausalLM", DFLASH_FAMILY_QWEN35 },
    { "qwen3_5", "Qwen3_5ForConditionalGeneration", DFLASH_FAMILY_QWEN35 },
    { "qwen3_5_moe_text", "Qwen3_5MoeForCausalLM", DFLASH_FAMILY_QWEN35_MOE },
    { "qwen3_5_moe", "Qwen3_5MoeForConditionalGeneration", DFLASH_FAMILY_QWEN35_MOE },
};
#define N_FAMILIES (sizeof k_families / sizeof k_families[0])
#define CFG_RUNS "dflash runs Qwen3ForCausalLM, Qwen3MoeForCausalLM, LlamaForCausalLM, Qwen3_5ForCausalLM, " \
                 "Qwen3_5MoeForCausalLM (or the Qwen3.5 ForConditionalGeneration forms) targets and " \
                 "DFlashDraftModel drafters"

const char *dflash_family_name(dflash_family f)
{
    switch (f) {
    case DFLASH_FAMILY_LLAMA: return "Llama";
    case DFLASH_FAMILY_QWEN3_MOE: return "Qwen3-MoE";
    case DFLASH_FAMILY_QWEN35: return "Qwen3.5";
    case DFLASH_FAMILY_QWEN35_MOE: return "Qwen3.5-MoE";
    default: return "Qwen3";
    }
}

/* Which model: architectures[0] and model_type (each optional) name one
 * family, or a DFlash drafter (Qwen3 layers). */
static dflash_status cfg_parse_kind(const char *label, const json_t *root, dflash_model_config *c)
{
    char model_type[64];
    DFLASH_TRY(cfg_string(label, "model_type", cfg_field(root, "model_type"), model_type, sizeof model_type));
    size_t by_type = 0;
    while (by_type < N_FAMILIES && strcmp(model_type, k_families[by_type].model_type) != 0)
        by_type++;
    if (model_type[0] && by_type == N_FAMILIES)
        return dflash_fail(DFLASH_ERR_UNSUPPORTED,
                           "%s: model_type is '%s'; dflash runs Qwen3, Qwen3-MoE, Llama, Qwen3.5 and Qwen3.5-MoE "
                           "models (model_type 'qwen3', 'qwen3_moe', 'llama', 'qwen3_5', 'qwen3_5_text', "
                           "'qwen3_5_moe', 'qwen3_5_moe_text'): " CFG_RUNS,
                           label, model_type);
    const int has_dflash_config = cfg_field(root, "dflash_config") != NULL;
    const char *arch = c->architecture;
    c->family = DFLASH_FAMILY_QWEN3;
    if (arch[0] == 0 || strcmp(arch, "DFlashDraftModel") == 0) {
        c->is_dflash = arch[0] != 0 || has_dflash_config;
        if (c->is_dflash && model_type[0] && by_type != 0)
            return dflash_fail(DFLASH_ERR_UNSUPPORTED, "%s: a DFlash drafter with model_type '%s'; its layers are "
                               "Qwen3's (model_type 'qwen3')", label, model_type);
        if (!c->is_dflash && model_type[0])
            c->family = k_families[by_type].family;
        return DFLASH_OK;
    }
    size_t k = 0;
    while (k < N_FAMILIES && strcmp(arch, k_families[k].architecture) != 0)
        k++;
    if (k == N_FAMILIES)
        return dflash_fail(DFLASH_ERR_UNSUPPORTED, "%s: architectures[0] is '%s'; " CFG_RUNS, label, arch);
    if (model_type[0] && k_families[by_type].family != k_families[k].family)
        return dflash_fail(DFLASH_ERR_FORMAT, "%s: architectures[0] is '%s' but model_type is '%s' (expected '%s')",
                           label, arch, model_type, k_families[k].model_type);
    if (has_dflash_config)
        return dflash_fail(DFLASH_ERR_FORMAT, "%s: architectures[0] is '%s' but there is a dflash_config: a DFlash "
                           "drafter's architectures[0] is 'DFlashDraftModel'", label, arch);
    c->is_dflash = 0;
    c->family = k_families[k].family;
    return DFLASH_OK;
}

/* Biases on the projections: attention_bias for every target family,
 * mlp_bias for a Llama (transformers builds Qwen3's MLP without biases,
 * whatever the config says, so there it is read and ignored). A drafter's
 * context K/V is projected outside the shared layer, without biases, so a
 * drafter that has them is refused by name rather than run without. */
static dflash_status cfg_parse_biases(const char *label, const json_t *root, dflash_model_config *c)
{
    DFLASH_TRY(cfg_bool(label, root, "attention_bias", &c->attention_bias));
    DFLASH_TRY(cfg_bool(label, root, "mlp_bias", &c->mlp_bias));
    if (c->family != DFLASH_FAMILY_LLAMA)
        c->mlp_bias = 0;
    if (c->is_dflash && c->attention_bias)
        return dflash_fail(DFLASH_ERR_UNSUPPORTED, "%s: field 'attention_bias' = true is not supported for a DFlash "
                           "drafter (projections without biases only)", label);
    return DFLASH_OK;
}

static dflash_status cfg_parse_layer_types(const char *label, const json_t *root, dflash_model_config *c)
{
    DFLASH_TRY(cfg_int(label, root, "sliding_window", "sliding_window", 0, 0, &c->sliding_window));
    if (cfg_field(root, "sliding_window") && c->sliding_window <= 0)
        return dflash_fail(DFLASH_ERR_FORMAT, "%s: field 'sliding_window' = %d, expected > 0 or null", label,
                           c->sliding_window);
    const json_t *types = cfg_field(root, "layer_types");
    if (!types)
        return DFLASH_OK;
    if (!json_is_array(types))
        return cfg_wrong_type(label, "layer_types", types, "a list of strings");
    if (json_array_size(types) != (size_t)c->num_hidden_layers)
        return dflash_fail(DFLASH_ERR_FORMAT, "%s: field 'layer_types' has %zu entries, num_hidden_layers is %d",
                           label, json_array_size(types), c->num_hidden_layers);
    for (size_t i = 0; i < json_array_size(types); i++) {
        const json_t *t = json_array_get(types, i);
        const char *s = json_is_string(t) ? json_string_value(t) : NULL;
        if (s && strcmp(s, "full_attention") == 0)
            c->layer_sliding[i] = 0;
        else if (s && strcmp(s, "sliding_attention") == 0)
            c->layer_sliding[i] = 1;
        else if (s && strcmp(s, "linear_attention") == 0 && dflash_family_is_qwen35(c->family))
            c->layer_linear[i] = 1;
        else if (s)
            return dflash_fail(DFLASH_ERR_FORMAT, "%s: field 'layer_types[%zu]' = \"%s\", expected \"full_attention\" or "
                               "\"%s\"", label, i, s,
                               dflash_family_is_qwen35(c->family) ? "linear_attention" : "sliding_attention");
        else {
            char field[40];
            snprintf(field, sizeof field, "layer_types[%zu]", i);
            return cfg_wrong_type(label, field, t, "a string");
        }
        if (c->layer_sliding[i] && c->sliding_window <= 0)
            return dflash_fail(DFLASH_ERR_FORMAT,
                               "%s: field 'layer_types[%zu]' is \"sliding_attention\" but sliding_window is absent",
                               label, i);
    }
    return DFLASH_OK;
}

/* ---- Qwen3-MoE ---------------------------------------------------------- */

/* The sparse MLP's fields, with Qwen3MoeConfig's defaults where absent
 * (128 experts, 8 per token, 768 wide, renormalisation off, every layer
 * sparse). The expert count may be spelled num_experts or
 * num_local_experts (transformers maps one onto the other); given both,
 * they must agree. */
static dflash_status cfg_parse_moe(const char *label, const json_t *root, dflash_model_config *c)
{
    if (c->family != DFLASH_FAMILY_QWEN3_MOE)
        return DFLASH_OK;
    int a = 128, b = 128;
    const int has_a = cfg_field(root, "num_experts") != NULL, has_b = cfg_field(root, "num_local_experts") != NULL;
    DFLASH_TRY(cfg_int(label, root, "num_experts", "num_experts", 0, 128, &a));
    DFLASH_TRY(cfg_int(label, root, "num_local_experts", "num_local_experts", 0, 128, &b));
    if (has_a && has_b && a != b)
        return dflash_fail(DFLASH_ERR_FORMAT, "%s: field 'num_experts' = %d but 'num_local_experts' = %d", label, a,
                           b);
    c->num_experts = has_b ? b : a;
    const char *experts_field = has_b ? "num_local_experts" : "num_experts";
    if (c->num_experts < 1 || c->num_experts > DFLASH_MAX_EXPERTS)
        return dflash_fail(DFLASH_ERR_FORMAT, "%s: field '%s' = %d, expected 1..%d", label, experts_field,
                           c->num_experts, DFLASH_MAX_EXPERTS);
    DFLASH_TRY(cfg_positive_int(label, root, "num_experts_per_tok", 0, 8, &c->num_experts_per_tok));
    if (c->num_experts_per_tok > c->num_experts)
        return dflash_fail(DFLASH_ERR_FORMAT, "%s: field 'num_experts_per_tok' = %d, more than the %d experts (%s)",
                           label, c->num_experts_per_tok, c->num_experts, experts_field);
    DFLASH_TRY(cfg_positive_int(label, root, "moe_intermediate_size", 0, 768, &c->moe_intermediate_size));
    DFLASH_TRY(cfg_bool(label, root, "norm_topk_prob", &c->norm_topk_prob));
    int step = 1;
    DFLASH_TRY(cfg_positive_int(label, root, "decoder_sparse_step", 0, 1, &step));
    unsigned char dense[DFLASH_MAX_LAYERS] = { 0 };
    const json_t *only = cfg_field(root, "mlp_only_layers");
    if (only && !json_is_array(only))
        return cfg_wrong_type(label, "mlp_only_layers", only, "a list of layer indices");
    for (size_t i = 0; only && i < json_array_size(only); i++) {
        char field[48];
        int id = 0;
        snprintf(field, sizeof field, "mlp_only_layers[%zu]", i);
        DFLASH_TRY(cfg_int_value(label, field, json_array_get(only, i), &id));
        if (id < 0 || id >= c->num_hidden_layers)
            return dflash_fail(DFLASH_ERR_FORMAT, "%s: field '%s' = %d is outside [0, num_hidden_layers %d)", label,
                               field, id, c->num_hidden_layers);
        dense[id] = 1;
    }
    for (int i = 0; i < c->num_hidden_layers; i++)
        c->layer_moe[i] = !dense[i] && (i + 1) % step == 0;
    return DFLASH_OK;
}

/* ---- Qwen3.5 ------------------------------------------------------------ */

/* The hybrid's own fields, with Qwen3_5TextConfig / Qwen3_5MoeTextConfig's
 * defaults where absent: without layer_types, every
 * full_attention_interval-th layer (default 4) is full attention and the
 * rest linear; a MoE always renormalises its top-k weights and every
 * layer's MLP is sparse. */
static dflash_status cfg_parse_qwen35(const char *label, const json_t *root, dflash_model_config *c)
{
    if (!dflash_family_is_qwen35(c->family))
        return DFLASH_OK;
    const struct {
        const char *key;
        int def, *out;
    } ints[] = { { "linear_conv_kernel_dim", 4, &c->linear_conv_kernel },
                 { "linear_key_head_dim", 128, &c->linear_key_head_dim },
                 { "linear_value_head_dim", 128, &c->linear_value_head_dim },
                 { "linear_num_key_heads", 16, &c->linear_num_key_heads },
                 { "linear_num_value_heads", 32, &c->linear_num_value_heads } };
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++)
        DFLASH_TRY(cfg_positive_int(label, root, ints[i].key, 0, ints[i].def, ints[i].out));
    if (c->linear_num_value_heads % c->linear_num_key_heads)
        return dflash_fail(DFLASH_ERR_FORMAT, "%s: linear_num_value_heads = %d is not a multiple of "
                           "linear_num_key_heads = %d", label, c->linear_num_value_heads, c->linear_num_key_heads);
    if (!cfg_field(root, "layer_types")) {
        int every = 4;
        DFLASH_TRY(cfg_positive_int(label, root, "full_attention_interval", 0, 4, &every));
        for (int i = 0; i < c->num_hidden_layers; i++)
            c->layer_linear[i] = (i + 1) % every != 0;
    }
    if (c->family != DFLASH_FAMILY_QWEN35_MOE)
        return DFLASH_OK;
    DFLASH_TRY(cfg_positive_int(label, root, "num_experts", 0, 256, &c->num_experts));
    if (c->num_experts > DFLASH_MAX_EXPERTS)
        return dflash_fail(DFLASH_ERR_FORMAT, "%s: field 'num_experts' = %d, expected 1..%d", label, c->num_experts,
                           DFLASH_MAX_EXPERTS);
    DFLASH_TRY(cfg_positive_int(label, root, "num_experts_per_tok", 0, 8, &c->num_experts_per_tok));
    if (c->num_experts_per_tok > c->num_experts)
        return dflash_fail(DFLASH_ERR_FORMAT, "%s: field 'num_experts_per_tok' = %d, more than the %d experts "
                           "(num_experts)", label, c->num_experts_per_tok, c->num_experts);
    DFLASH_TRY(cfg_positive_int(label, root, "moe_intermediate_size", 0, 512, &c->moe_intermediate_size));
    DFLASH_TRY(cfg_positive_int(label, root, "shared_expert_intermediate_size", 0, 512,
                                &c->shared_expert_intermediate_size));
    c->norm_topk_prob = 1;
    for (int i = 0; i < c->num_hidden_layers; i++)
        c->layer_moe[i] = 1;
    return DFLASH_OK;
}

/* ---- DFlash drafter ----------------------------------------------------- */

/* Python 3 round(): nearest integer, exact halves to the even neighbour.
 * Done by hand so the result never depends on the FP rounding mode. */
static int cfg_round_half_even(double v)
{
    double f = floor(v), frac = v - f; /* exact for the small values used */
    if (frac > 0.5 || (frac == 0.5 && fmod(f, 2.0) != 0.0))
        f += 1.0;
    return (int)f;
}

void dflash_default_target_layer_ids(int n_target, int n_draft, int *out)
{
    if (n_draft <= 0)
        return;
    if (n_draft == 1) {
        out[0] = n_target / 2;
        return;
    }
    /* Same expression order as the reference: start + (i * span) / (n - 1). */
    int span = n_target - 4;
    for (int i = 0; i < n_draft; i++)
        out[i] = cfg_round_half_even(1.0 + (double)(i * span) / (double)(n_draft - 1));
}

static dflash_status cfg_parse_taps(const char *label, const json_t *dcfg, dflash_model_config *c)
{
    const json_t *ids = cfg_field(dcfg, "target_layer_ids");
    const char *origin = "dflash_config.target_layer_ids";
    if (ids) {
        if (!json_is_array(ids))
            return cfg_wrong_type(label, origin, ids, "a list of integers");
        size_t n = json_array_size(ids);
        if (n == 0 || n > DFLASH_MAX_TAPS)
            return dflash_fail(DFLASH_ERR_FORMAT, "%s: field '%s' has %zu entries, expected 1..%d", label, origin, n,
                               DFLASH_MAX_TAPS);
        for (size_t i = 0; i < n; i++) {
            char field[64];
            snprintf(field, sizeof field, "%s[%zu]", origin, i);
            DFLASH_TRY(cfg_int_value(label, field, json_array_get(ids, i), &c->target_layer_ids[i]));
        }
        c->n_target_layer_ids = (int)n;
    } else {
        origin = "default target_layer_ids";
        if (c->num_hidden_layers > DFLASH_MAX_TAPS)
            return dflash_fail(DFLASH_ERR_FORMAT, "%s: %d draft layers need more than %d default taps; give %s",
                               label, c->num_hidden_layers, DFLASH_MAX_TAPS, "dflash_config.target_layer_ids");
        dflash_default_target_layer_ids(c->num_target_layers, c->num_hidden_layers, c->target_layer_ids);
        c->n_target_layer_ids = c->num_hidden_layers;
    }
    for (int i = 0; i < c->n_target_layer_ids; i++) {
        int id = c->target_layer_ids[i];
        if (id < 0 || id >= c->num_target_layers)
            return dflash_fail(DFLASH_ERR_FORMAT, "%s: %s[%d] = %d is outside [0, num_target_layers %d)", label,
                               origin, i, id, c->num_target_layers);
    }
    return DFLASH_OK;
}

static dflash_status cfg_parse_dflash(const char *label, const json_t *root, dflash_model_config *c)
{
    const json_t *dcfg = cfg_field(root, "dflash_config");
    if (!c->is_dflash)
        return DFLASH_OK;
    if (dcfg && !json_is_object(dcfg))
        return cfg_wrong_type(label, "dflash_config", dcfg, "an object");
    /* block_size: top level (the first published drafters) or inside
     * dflash_config (newer ones); where both are given they must agree. */
    int top = 16, inner = 16;
    const int has_top = cfg_field(root, "block_size") != NULL, has_inner = cfg_field(dcfg, "block_size") != NULL;
    DFLASH_TRY(cfg_int(label, root, "block_size", "block_size", 0, 16, &top));
    DFLASH_TRY(cfg_int(label, dcfg, "block_size", "dflash_config.block_size", 0, 16, &inner));
    if (has_top && has_inner && top != inner)
        return dflash_fail(DFLASH_ERR_FORMAT, "%s: field 'block_size' = %d but 'dflash_config.block_size' = %d", label,
                           top, inner);
    c->block_size = has_inner ? inner : top;
    if (c->block_size < 2 || c->block_size > 64)
        return dflash_fail(DFLASH_ERR_FORMAT, "%s: field '%s' = %d, expected 2..64", label,
                           has_inner ? "dflash_config.block_size" : "block_size", c->block_size);
    /* Causal drafters: is_causal (top level) or dflash_config.causal. */
    int causal_top = 0, causal_inner = 0;
    DFLASH_TRY(cfg_bool(label, root, "is_causal", &causal_top));
    DFLASH_TRY(cfg_bool(label, dcfg, "causal", &causal_inner));
    if (cfg_field(root, "is_causal") && cfg_field(dcfg, "causal") && causal_top != causal_inner)
        return dflash_fail(DFLASH_ERR_FORMAT, "%s: field 'is_causal' = %s but 'dflash_config.causal' = %s", label,
                           causal_top ? "true" : "false", causal_inner ? "true" : "false");
    c->drafter_causal = causal_top || causal_inner;
    DFLASH_TRY(cfg_positive_int(label, root, "num_target_layers", 1, 0, &c->num_target_layers));
    if (c->num_target_layers > DFLASH_MAX_LAYERS)
        return dflash_fail(DFLASH_ERR_FORMAT, "%s: field 'num_target_layers' = %d, at most %d are supported", label,
                           c->num_target_layers, DFLASH_MAX_LAYERS);
    /* Only dflash_config is read, as the reference drafter does; say so when
     * a top-level copy suggests the writer expected otherwise. */
    if (!cfg_field(dcfg, "mask_token_id"))
        return dflash_fail(DFLASH_ERR_FORMAT, "%s: required field 'dflash_config.mask_token_id' is missing%s", label,
                           cfg_field(root, "mask_token_id") ? " (a top-level mask_token_id is not read; it belongs in dflash_config)"
                                                            : "");
    DFLASH_TRY(cfg_int(label, dcfg, "mask_token_id", "dflash_config.mask_token_id", 1, 0, &c->mask_token_id));
    DFLASH_TRY(cfg_token_id(label, "dflash_config.mask_token_id", c->mask_token_id, c->vocab_size));
    return cfg_parse_taps(label, dcfg, c);
}

/* ---- public API --------------------------------------------------------- */

static dflash_status cfg_parse_root(const char *label, const json_t *root, dflash_model_config *c)
{
    if (!json_is_object(root))
        return dflash_fail(DFLASH_ERR_FORMAT, "%s: config is %s, expected a JSON object", label,
                           dflash_json_type_name(root));
    DFLASH_TRY(cfg_parse_names(label, root, c));
    DFLASH_TRY(cfg_parse_kind(label, root, c)); /* first: another model is named before its fields are judged */
    /* A multimodal Qwen3.5 folder keeps the text model under text_config
     * (its top-level tie_word_embeddings, read above, is the one
     * transformers applies); every field below is read from there. */
    char text_label[600];
    const json_t *text = cfg_field(root, "text_config");
    if (text && dflash_family_is_qwen35(c->family)) {
        if (!json_is_object(text))
            return cfg_wrong_type(label, "text_config", text, "an object");
        snprintf(text_label, sizeof text_label, "%s (text_config)", label);
        label = text_label;
        root = text;
        c->multimodal = 1;
    }
    DFLASH_TRY(cfg_parse_sizes(label, root, c));
    DFLASH_TRY(cfg_parse_biases(label, root, c));
    DFLASH_TRY(cfg_parse_rope(label, root, c));
    DFLASH_TRY(cfg_parse_tokens(label, root, c));
    DFLASH_TRY(cfg_parse_layer_types(label, root, c));
    DFLASH_TRY(cfg_parse_moe(label, root, c));
    DFLASH_TRY(cfg_parse_qwen35(label, root, c));
    DFLASH_TRY(cfg_parse_dflash(label, root, c));
    int sliding = 0;
    DFLASH_TRY(cfg_bool(label, root, "use_sliding_window", &sliding));
    if (sliding && !c->is_dflash)
        return dflash_fail(DFLASH_ERR_UNSUPPORTED,
                           "%s: field 'use_sliding_window' = true is not supported for a target model", label);
    return DFLASH_OK;
}

dflash_status dflash_config_parse(const char *json, size_t len, const char *label, dflash_model_config *out)
{
    if (!out || (!json && len))
        return dflash_fail(DFLASH_ERR_INVALID_ARG, "dflash_config_parse: json and out must not be NULL");
    if (!label)
        label = "config";
    memset(out, 0, sizeof *out);
    json_error_t err;
    json_t *root = json_loadb(json ? json : "", len, JSON_REJECT_DUPLICATES, &err);
    if (!root)
        return dflash_fail(DFLASH_ERR_FORMAT, "%s: not valid JSON: %s (line %d, column %d)", label, err.text,
                           err.line, err.column);
    dflash_status s = cfg_parse_root(label, root, out);
    json_decref(root);
    return s;
}


dflash_status dflash_config_check_folder(const char *path, const char *who)
{
    struct stat sb;
    if (!path || stat(path, &sb) != 0 || S_ISDIR(sb.st_mode))
        return DFLASH_OK; /* a missing path is reported by whatever opens it */
    const char *slash = strrchr(path, '/');
    int dir_len = slash ? (int)(slash - path) : 1;
    const char *dir = slash ? path : ".";
    if (slash == path)
        dir_len = 1; /* "/config.json": the root */
    return dflash_fail(DFLASH_ERR_INVALID_ARG, "%s is a file, but %s takes the checkpoint folder (the one holding "
                       "config.json and the *.safetensors files): give %.*s", path, who, dir_len, dir);
}

dflash_status dflash_config_load(const char *path, dflash_model_config *out)
{
    if (!path || !out)
        return dflash_fail(DFLASH_ERR_INVALID_ARG, "dflash_config_load: path and out must not be NULL");
    struct stat sb;
    char *file = NULL;
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) {
        size_t n = strlen(path) + sizeof "/config.json";
        file = malloc(n);
        if (!file)
            return dflash_fail(DFLASH_ERR_OOM, "%s: out of memory", path);
        snprintf(file, n, "%s/config.json", path);
    }
    char *text = NULL;
    size_t len = 0;
    dflash_status s = dflash_read_file(file ? file : path, CFG_MAX_FILE, &text, &len);
    if (s == DFLASH_OK)
        s = dflash_config_parse(text, len, file ? file : path, out);
    free(text);
    free(file);
    return s;
}
