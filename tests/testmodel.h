/* testmodel.h: tiny Qwen3 checkpoints written by the tests themselves, so a
 * test that needs a model runs without fixtures. Header-only (static
 * functions), for any tests/test_*.c.
 *
 * testmodel_build() draws every tensor the target binds (names and shapes
 * as src/target/qwen3.c and qwen3_layer.c bind them) as f32 in memory from
 * a seeded generator; a test may edit tensors (testmodel_find) to give the
 * model structure; testmodel_save() writes config.json and a bf16
 * model.safetensors into a folder (testmodel_tmpdir makes one under /tmp,
 * testmodel_rmdir removes what save wrote). Everything is deterministic:
 * the same geometry and seed give the same bytes. */
#ifndef DFLASH_TESTS_TESTMODEL_H
#define DFLASH_TESTS_TESTMODEL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/dtype.h"

typedef struct testmodel_geom {
    int vocab, hidden, layers, heads, kv_heads, head_dim, inter;
    int tied;        /* tie_word_embeddings: no lm_head.weight tensor */
    double theta;    /* rope_theta */
    uint64_t seed;
    float std;       /* std of the matrices; the embedding is drawn with std 1 */
} testmodel_geom;

typedef struct testmodel_tensor {
    char name[96];
    int64_t rows, cols; /* a vector has rows = 1 and is written 1-D */
    float *data;        /* [rows * cols] */
} testmodel_tensor;

typedef struct testmodel {
    testmodel_geom g;
    testmodel_tensor *t;
    int n;
} testmodel;

/* A sensible small default: V 64, H 32, 2 layers, 4:2 heads of 8, I 64. */
static inline void testmodel_default_geom(testmodel_geom *g)
{
    *g = (testmodel_geom){ .vocab = 64, .hidden = 32, .layers = 2, .heads = 4, .kv_heads = 2, .head_dim = 8,
                           .inter = 64, .tied = 0, .theta = 10000.0, .seed = 1, .std = 0.1f };
}

static inline uint64_t testmodel_rand(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Approximately N(0, 1): the sum of 12 uniforms minus 6 (no libm, so the
 * weights are the same everywhere). */
static inline float testmodel_normal(uint64_t *x)
{
    double s = 0;
    for (int i = 0; i < 12; i++)
        s += (double)(testmodel_rand(x) >> 11) * 0x1.0p-53;
    return (float)(s - 6.0);
}

static inline int testmodel_add(testmodel *m, const char *name, int64_t rows, int64_t cols, float mean, float std,
                         uint64_t *rng)
{
    testmodel_tensor *t = &m->t[m->n];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->rows = rows;
    t->cols = cols;
    t->data = malloc((size_t)(rows * cols) * sizeof(float));
    if (!t->data)
        return 0;
    for (int64_t i = 0; i < rows * cols; i++)
        t->data[i] = mean + std * testmodel_normal(rng);
    m->n++;
    return 1;
}

static inline void testmodel_free(testmodel *m)
{
    for (int i = 0; i < m->n; i++)
        free(m->t[i].data);
    free(m->t);
    memset(m, 0, sizeof *m);
}

/* Returns 1 on success (0: out of memory, nothing left allocated). Norm
 * weights are 1 + noise, the embedding N(0, 1), matrices N(0, std). */
static inline int testmodel_build(testmodel *m, const testmodel_geom *g)
{
    memset(m, 0, sizeof *m);
    m->g = *g;
    m->t = calloc((size_t)(3 + 11 * g->layers), sizeof *m->t);
    if (!m->t)
        return 0;
    uint64_t rng = g->seed;
    const int64_t V = g->vocab, H = g->hidden, D = g->head_dim, I = g->inter;
    const int64_t Q = (int64_t)g->heads * D, KV = (int64_t)g->kv_heads * D;
    int ok = testmodel_add(m, "model.embed_tokens.weight", V, H, 0, 1.0f, &rng) &&
             testmodel_add(m, "model.norm.weight", 1, H, 1, 0.05f, &rng);
    if (ok && !g->tied)
        ok = testmodel_add(m, "lm_head.weight", V, H, 0, g->std, &rng);
    char name[96];
    static const struct { const char *suffix; int kind; } parts[] = {
        { "input_layernorm.weight", 0 }, { "post_attention_layernorm.weight", 0 },
        { "self_attn.q_norm.weight", 1 }, { "self_attn.k_norm.weight", 1 },
        { "self_attn.q_proj.weight", 2 }, { "self_attn.k_proj.weight", 3 },
        { "self_attn.v_proj.weight", 3 }, { "self_attn.o_proj.weight", 4 },
        { "mlp.gate_proj.weight", 5 }, { "mlp.up_proj.weight", 5 }, { "mlp.down_proj.weight", 6 },
    };
    for (int l = 0; ok && l < g->layers; l++)
        for (size_t k = 0; ok && k < sizeof parts / sizeof parts[0]; k++) {
            snprintf(name, sizeof name, "model.layers.%d.%s", l, parts[k].suffix);
            switch (parts[k].kind) {
            case 0: ok = testmodel_add(m, name, 1, H, 1, 0.05f, &rng); break;
            case 1: ok = testmodel_add(m, name, 1, D, 1, 0.05f, &rng); break;
            case 2: ok = testmodel_add(m, name, Q, H, 0, g->std, &rng); break;
            case 3: ok = testmodel_add(m, name, KV, H, 0, g->std, &rng); break;
            case 4: ok = testmodel_add(m, name, H, Q, 0, g->std, &rng); break;
            case 5: ok = testmodel_add(m, name, I, H, 0, g->std, &rng); break;
            default: ok = testmodel_add(m, name, H, I, 0, g->std, &rng); break;
            }
        }
    if (!ok)
        testmodel_free(m);
    return ok;
}

/* The tensor's f32 data, or NULL. */
static inline float *testmodel_find(testmodel *m, const char *name)
{
    for (int i = 0; i < m->n; i++)
        if (!strcmp(m->t[i].name, name))
            return m->t[i].data;
    return NULL;
}

/* Write dir/config.json and dir/model.safetensors (bf16). Returns 1 on
 * success. */
static inline int testmodel_save(const testmodel *m, const char *dir)
{
    const testmodel_geom *g = &m->g;
    char path[512];
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    if (!f)
        return 0;
    fprintf(f,
            "{\"architectures\": [\"Qwen3ForCausalLM\"], \"model_type\": \"qwen3\", \"vocab_size\": %d,"
            " \"hidden_size\": %d, \"intermediate_size\": %d, \"num_hidden_layers\": %d,"
            " \"num_attention_heads\": %d, \"num_key_value_heads\": %d, \"head_dim\": %d,"
            " \"rms_norm_eps\": 1e-06, \"rope_theta\": %.1f, \"max_position_embeddings\": 4096,"
            " \"tie_word_embeddings\": %s, \"torch_dtype\": \"bfloat16\"}\n",
            g->vocab, g->hidden, g->inter, g->layers, g->heads, g->kv_heads, g->head_dim, g->theta,
            g->tied ? "true" : "false");
    if (fclose(f) != 0)
        return 0;

    /* header: {"name": {"dtype": "BF16", "shape": [...], "data_offsets": [b, e]}, ...}
     * padded with spaces to a multiple of 8 so the data region is aligned */
    size_t cap = 256 + (size_t)m->n * 192, len = 0;
    char *hdr = malloc(cap);
    if (!hdr)
        return 0;
    uint64_t off = 0;
    len += (size_t)snprintf(hdr + len, cap - len, "{");
    for (int i = 0; i < m->n; i++) {
        const testmodel_tensor *t = &m->t[i];
        uint64_t bytes = (uint64_t)(t->rows * t->cols) * 2;
        char shape[64];
        if (t->rows == 1)
            snprintf(shape, sizeof shape, "[%lld]", (long long)t->cols);
        else
            snprintf(shape, sizeof shape, "[%lld, %lld]", (long long)t->rows, (long long)t->cols);
        len += (size_t)snprintf(hdr + len, cap - len, "%s\"%s\": {\"dtype\": \"BF16\", \"shape\": %s, "
                                "\"data_offsets\": [%llu, %llu]}", i ? ", " : "", t->name, shape,
                                (unsigned long long)off, (unsigned long long)(off + bytes));
        off += bytes;
    }
    len += (size_t)snprintf(hdr + len, cap - len, "}");
    while (len % 8)
        hdr[len++] = ' ';
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    f = fopen(path, "wb");
    int ok = f != NULL;
    uint8_t n8[8];
    for (int i = 0; i < 8; i++)
        n8[i] = (uint8_t)((uint64_t)len >> (8 * i));
    ok = ok && fwrite(n8, 1, 8, f) == 8 && fwrite(hdr, 1, len, f) == len;
    for (int i = 0; ok && i < m->n; i++) {
        const testmodel_tensor *t = &m->t[i];
        for (int64_t j = 0; ok && j < t->rows * t->cols; j++) {
            uint16_t b = dflash_f32_to_bf16(t->data[j]);
            uint8_t le[2] = { (uint8_t)(b & 0xff), (uint8_t)(b >> 8) };
            ok = fwrite(le, 1, 2, f) == 2;
        }
    }
    if (f && fclose(f) != 0)
        ok = 0;
    free(hdr);
    return ok;
}

/* A fresh folder /tmp/dflash-testmodel-XXXXXX into buf[64]; 1 on success. */
static inline int testmodel_tmpdir(char *buf)
{
    snprintf(buf, 64, "/tmp/dflash-testmodel-XXXXXX");
    return mkdtemp(buf) != NULL;
}

/* Remove what testmodel_save wrote, then the folder. */
static inline void testmodel_rmdir(const char *dir)
{
    char path[512];
    snprintf(path, sizeof path, "%s/config.json", dir);
    remove(path);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    remove(path);
    rmdir(dir);
}

#endif
