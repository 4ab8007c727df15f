/* test_safetensors.c: the safetensors reader on files built byte by byte
 * here: a valid file (memory and mmap), one case per kind of malformed
 * input, sharded folders (good, missing shard, tensor missing from its
 * shard, duplicate across shards), data left misaligned by the header
 * length or the offsets (accepted, read aligned) and dflash_st_get's
 * checks. Each failure case asserts the status and a distinctive part of
 * the message. */
#include <dirent.h>
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/status.h"
#include "harness.h"
#include "io/safetensors.h"

static char g_root[64]; /* mkdtemp folder, removed at the end */

/* ---- building files ---------------------------------------------------- */

typedef struct image {
    uint8_t *bytes;
    size_t len;
} image;

/* 8-byte little-endian `header_len` (normally strlen(header)), the header,
 * then `data_len` bytes counting 0, 1, 2, ... */
static image image_raw(uint64_t header_len, const char *header, size_t data_len)
{
    size_t hl = strlen(header);
    image im = { malloc(8 + hl + data_len + 1), 8 + hl + data_len };
    for (int i = 0; i < 8; i++)
        im.bytes[i] = (uint8_t)(header_len >> (8 * i));
    memcpy(im.bytes + 8, header, hl);
    for (size_t i = 0; i < data_len; i++)
        im.bytes[8 + hl + i] = (uint8_t)i;
    return im;
}

static image image_make(const char *header, size_t data_len)
{
    return image_raw(strlen(header), header, data_len);
}

static void write_file(const char *path, const void *bytes, size_t len)
{
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL);
    if (!f)
        return;
    CHECK(fwrite(bytes, 1, len, f) == len);
    fclose(f);
}

static void write_image(const char *path, const char *header, size_t data_len)
{
    image im = image_make(header, data_len);
    write_file(path, im.bytes, im.len);
    free(im.bytes);
}

static void make_dir(char *out, size_t n, const char *name)
{
    snprintf(out, n, "%s/%s", g_root, name);
    CHECK(mkdir(out, 0700) == 0);
}

static void remove_tree(const char *path)
{
    DIR *d = opendir(path);
    if (d) {
        struct dirent *e;
        while ((e = readdir(d)) != NULL) {
            if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
                continue;
            char sub[512];
            snprintf(sub, sizeof sub, "%s/%s", path, e->d_name);
            remove_tree(sub);
        }
        closedir(d);
        rmdir(path);
    } else {
        unlink(path);
    }
}

/* Parse a header (+ data bytes) from memory; returns the status. */
static dflash_status open_header(const char *header, size_t data_len)
{
    image im = image_make(header, data_len);
    dflash_st *st = NULL;
    dflash_status s = dflash_st_open_memory(im.bytes, im.len, "mem.safetensors", &st);
    if (s == DFLASH_OK)
        CHECK(st != NULL);
    else
        CHECK(st == NULL);
    dflash_st_close(st);
    free(im.bytes);
    return s;
}

static const char *k_good =
    "{\"__metadata__\":{\"format\":\"pt\"},"
    "\"w\":{\"dtype\":\"BF16\",\"shape\":[2,3],\"data_offsets\":[0,12]},"
    "\"s\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[12,16]},"
    "\"e\":{\"dtype\":\"I64\",\"shape\":[0,5],\"data_offsets\":[16,16]},"
    "\"q\":{\"dtype\":\"F8_E4M3\",\"shape\":[4],\"data_offsets\":[16,20]}}";

static void check_good_set(dflash_st *st, const char *file)
{
    CHECK(dflash_st_count(st) == 4);
    /* The table is in name order. */
    CHECK(strcmp(dflash_st_at(st, 0)->name, "e") == 0);
    CHECK(strcmp(dflash_st_at(st, 3)->name, "w") == 0);
    CHECK(dflash_st_at(st, 4) == NULL);
    const dflash_tensor_info *w = dflash_st_find(st, "w");
    CHECK(w && w->dtype == DFLASH_DTYPE_BF16 && w->ndim == 2 && w->shape[0] == 2 && w->shape[1] == 3);
    CHECK(w && w->numel == 6 && w->nbytes == 12 && strcmp(w->file, file) == 0);
    CHECK(w && ((const uint8_t *)w->data)[0] == 0 && ((const uint8_t *)w->data)[11] == 11);
    const dflash_tensor_info *s = dflash_st_find(st, "s");
    CHECK(s && s->ndim == 0 && s->numel == 1 && s->nbytes == 4 && ((const uint8_t *)s->data)[0] == 12);
    const dflash_tensor_info *e = dflash_st_find(st, "e");
    CHECK(e && e->numel == 0 && e->nbytes == 0);
    const dflash_tensor_info *q = dflash_st_find(st, "q");
    CHECK(q && q->dtype == DFLASH_DTYPE_F8_E4M3 && ((const uint8_t *)q->data)[3] == 19);
    CHECK(dflash_st_find(st, "__metadata__") == NULL);
    CHECK(dflash_st_find(st, "nope") == NULL);
}

/* ---- valid input ------------------------------------------------------- */

static void test_good_memory(void)
{
    image im = image_make(k_good, 20);
    dflash_st *st = NULL;
    CHECK_OK(dflash_st_open_memory(im.bytes, im.len, "mem.safetensors", &st));
    if (st) {
        check_good_set(st, "mem.safetensors");
        CHECK(strcmp(dflash_st_path(st), "mem.safetensors") == 0);
    }
    dflash_st_close(st);
    free(im.bytes);
}

static void test_good_file_and_folder(void)
{
    char dir[256], path[512];
    make_dir(dir, sizeof dir, "single");
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    write_image(path, k_good, 20);
    dflash_st *st = NULL;
    CHECK_OK(dflash_st_open(path, &st));
    if (st)
        check_good_set(st, path);
    dflash_st_close(st);
    st = NULL;
    CHECK_OK(dflash_st_open(dir, &st)); /* folder -> model.safetensors */
    if (st) {
        check_good_set(st, path);
        CHECK(strcmp(dflash_st_path(st), dir) == 0);
    }
    dflash_st_close(st);
}

static void test_header_padding_and_holes(void)
{
    /* Writers pad the header with spaces; unused bytes between tensors are
     * tolerated (only overlap is an error). */
    CHECK_OK(open_header("{\"a\":{\"dtype\":\"I32\",\"shape\":[1],\"data_offsets\":[0,4]}}    ", 4));
    CHECK_OK(open_header("{\"a\":{\"dtype\":\"I32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 16));
    CHECK_OK(open_header("{}", 0));
}

/* ---- misaligned data ----------------------------------------------------- */

/* Every tensor of `st` is aligned to its element size and holds the bytes
 * the image has at its offsets (image bytes count up from 0 in the data
 * region, so byte k of a tensor at offset b is b + k). */
static void check_aligned_set(const dflash_st *st, size_t count)
{
    CHECK(dflash_st_count(st) == count);
    static const struct { const char *name; int begin; } want[] = {
        { "b", 0 }, { "f", 8 }, { "i", 16 }, { "q", 24 }, { "g", 27 }, { "z", 35 },
    };
    for (size_t k = 0; k < sizeof want / sizeof want[0]; k++) {
        const dflash_tensor_info *t = dflash_st_find(st, want[k].name);
        CHECKF(t != NULL, "tensor %s", want[k].name);
        if (!t)
            continue;
        CHECKF((uintptr_t)t->data % dflash_dtype_size(t->dtype) == 0, "tensor %s at %p is not aligned to %zu",
               t->name, t->data, dflash_dtype_size(t->dtype));
        for (size_t j = 0; j < t->nbytes; j++)
            CHECKF(((const uint8_t *)t->data)[j] == (uint8_t)(want[k].begin + (int)j), "tensor %s byte %zu",
                   t->name, j);
    }
    /* Read as elements (UBSan checks the alignment of these loads). */
    const char *floats[] = { "f", "g" };
    for (int k = 0; k < 2; k++) {
        const dflash_tensor_info *t = dflash_st_find(st, floats[k]);
        if (!t)
            continue;
        float elem = ((const float *)t->data)[1], bytes;
        memcpy(&bytes, (const uint8_t *)t->data + 4, 4);
        CHECKF(memcmp(&elem, &bytes, 4) == 0, "tensor %s element 1", floats[k]);
    }
}

/* The format allows any header length and any offsets: a header of 8n + 1
 * bytes leaves every tensor misaligned in the image, and "g" (F32 at 27) is
 * misaligned by its offset alone. Both are accepted and read aligned. */
static void test_misaligned_data(void)
{
    const char *tensors = "{\"b\":{\"dtype\":\"BF16\",\"shape\":[3],\"data_offsets\":[0,6]},"
                          "\"f\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]},"
                          "\"i\":{\"dtype\":\"I64\",\"shape\":[1],\"data_offsets\":[16,24]},"
                          "\"q\":{\"dtype\":\"F8_E4M3\",\"shape\":[3],\"data_offsets\":[24,27]},"
                          "\"g\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[27,35]},"
                          "\"z\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[35,35]}}";
    for (size_t rem = 0; rem < 8; rem++) {
        char header[1024];
        size_t n = strlen(tensors);
        memcpy(header, tensors, n);
        while (n % 8 != rem)
            header[n++] = ' '; /* header length = rem mod 8: each misalignment of the region */
        header[n] = 0;
        image im = image_make(header, 40);
        dflash_st *st = NULL;
        CHECK_OK(dflash_st_open_memory(im.bytes, im.len, "mem.safetensors", &st));
        if (st)
            check_aligned_set(st, 6);
        dflash_st_close(st);
        char path[512];
        snprintf(path, sizeof path, "%s/misaligned-%zu.safetensors", g_root, rem);
        write_file(path, im.bytes, im.len);
        st = NULL;
        CHECK_OK(dflash_st_open(path, &st));
        if (st)
            check_aligned_set(st, 6);
        dflash_st_close(st);
        free(im.bytes);
    }
}

/* ---- malformed single files -------------------------------------------- */

static void test_short_file(void)
{
    dflash_st *st = NULL;
    uint8_t four[4] = { 1, 0, 0, 0 };
    CHECK_FAILS(dflash_st_open_memory(four, 4, "tiny.safetensors", &st), DFLASH_ERR_FORMAT,
                "tiny.safetensors: file is 4 bytes, shorter than the 8-byte");
    CHECK_FAILS(dflash_st_open_memory(NULL, 0, "empty.safetensors", &st), DFLASH_ERR_FORMAT, "empty.safetensors");
    char path[512];
    snprintf(path, sizeof path, "%s/short.safetensors", g_root);
    write_file(path, four, 3);
    CHECK_FAILS(dflash_st_open(path, &st), DFLASH_ERR_FORMAT, "3 bytes, shorter than");
    CHECK(st == NULL);
}

static void test_header_length(void)
{
    const char *h = "{}";
    image im = image_raw(1000, h, 0);
    dflash_st *st = NULL;
    CHECK_FAILS(dflash_st_open_memory(im.bytes, im.len, "m", &st), DFLASH_ERR_FORMAT,
                "header length 1000 is past the end of the 10-byte file");
    free(im.bytes);
    im = image_raw(UINT64_MAX, h, 0);
    CHECK_FAILS(dflash_st_open_memory(im.bytes, im.len, "m", &st), DFLASH_ERR_FORMAT, "-byte limit");
    free(im.bytes);
    im = image_raw(1ull << 40, h, 0);
    CHECK_FAILS(dflash_st_open_memory(im.bytes, im.len, "m", &st), DFLASH_ERR_FORMAT, "header length 1099511627776");
    free(im.bytes);
    im = image_raw(0, h, 0);
    CHECK_FAILS(dflash_st_open_memory(im.bytes, im.len, "m", &st), DFLASH_ERR_FORMAT, "not valid JSON");
    free(im.bytes);
}

static void test_bad_json(void)
{
    CHECK_FAILS(open_header("{\"a\":", 0), DFLASH_ERR_FORMAT, "mem.safetensors: header is not valid JSON");
    CHECK_FAILS(open_header("[1,2]", 0), DFLASH_ERR_FORMAT, "header is an array, expected a JSON object");
    CHECK_FAILS(open_header("\"x\"", 0), DFLASH_ERR_FORMAT, "not valid JSON"); /* jansson wants [ or { */
    CHECK_FAILS(open_header("{\"a\":{\"dtype\":\"I32\",\"shape\":[1],\"data_offsets\":[0,4]}} x", 4),
                DFLASH_ERR_FORMAT, "not valid JSON");
    CHECK_FAILS(open_header("{\"__metadata__\":[1]}", 0), DFLASH_ERR_FORMAT, "\"__metadata__\" is an array");
    CHECK_FAILS(open_header("{\"__metadata__\":{\"k\":3}}", 0), DFLASH_ERR_FORMAT, "__metadata__ 'k' is an integer");
}

static void test_duplicate_in_file(void)
{
    CHECK_FAILS(open_header("{\"a\":{\"dtype\":\"I32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                            "\"a\":{\"dtype\":\"I32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
                            8),
                DFLASH_ERR_FORMAT, "duplicate");
}

static void test_missing_fields(void)
{
    CHECK_FAILS(open_header("{\"t1\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4), DFLASH_ERR_FORMAT,
                "tensor 't1' has no \"dtype\"");
    CHECK_FAILS(open_header("{\"t2\":{\"dtype\":\"I32\",\"data_offsets\":[0,4]}}", 4), DFLASH_ERR_FORMAT,
                "tensor 't2' has no \"shape\"");
    CHECK_FAILS(open_header("{\"t3\":{\"dtype\":\"I32\",\"shape\":[1]}}", 4), DFLASH_ERR_FORMAT,
                "tensor 't3' has no \"data_offsets\"");
}

static void test_wrong_types(void)
{
    CHECK_FAILS(open_header("{\"t\":[1]}", 0), DFLASH_ERR_FORMAT, "tensor 't' is an array, expected an object");
    CHECK_FAILS(open_header("{\"t\":{\"dtype\":7,\"shape\":[1],\"data_offsets\":[0,4]}}", 4), DFLASH_ERR_FORMAT,
                "tensor 't': \"dtype\" is an integer");
    CHECK_FAILS(open_header("{\"t\":{\"dtype\":\"I32\",\"shape\":\"1\",\"data_offsets\":[0,4]}}", 4),
                DFLASH_ERR_FORMAT, "\"shape\" is a string");
    CHECK_FAILS(open_header("{\"t\":{\"dtype\":\"I32\",\"shape\":[1],\"data_offsets\":[0]}}", 4),
                DFLASH_ERR_FORMAT, "tensor 't': \"data_offsets\" must be an array of 2");
    CHECK_FAILS(open_header("{\"t\":{\"dtype\":\"I32\",\"shape\":[1],\"data_offsets\":[0,\"4\"]}}", 4),
                DFLASH_ERR_FORMAT, "data_offsets[1] is a string");
    CHECK_FAILS(open_header("{\"t\":{\"dtype\":\"I32\",\"shape\":[1],\"data_offsets\":[-4,4]}}", 4),
                DFLASH_ERR_FORMAT, "data_offsets[0] = -4 is negative");
}

static void test_bad_dims(void)
{
    CHECK_FAILS(open_header("{\"neg\":{\"dtype\":\"I32\",\"shape\":[1,-2],\"data_offsets\":[0,4]}}", 4),
                DFLASH_ERR_FORMAT, "tensor 'neg': shape[1] = -2 is negative");
    CHECK_FAILS(open_header("{\"frac\":{\"dtype\":\"I32\",\"shape\":[2.5],\"data_offsets\":[0,4]}}", 4),
                DFLASH_ERR_FORMAT, "tensor 'frac': shape[0] is a real number");
    CHECK_FAILS(open_header("{\"nine\":{\"dtype\":\"I32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}", 4),
                DFLASH_ERR_UNSUPPORTED, "tensor 'nine' has 9 dims, at most 8");
    CHECK_OK(open_header("{\"eight\":{\"dtype\":\"I32\",\"shape\":[1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}", 4));
}

static void test_bad_offsets(void)
{
    CHECK_FAILS(open_header("{\"r\":{\"dtype\":\"I32\",\"shape\":[0],\"data_offsets\":[8,4]}}", 8),
                DFLASH_ERR_FORMAT, "tensor 'r': data_offsets [8, 4] begin > end");
    CHECK_FAILS(open_header("{\"p\":{\"dtype\":\"I32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 8),
                DFLASH_ERR_FORMAT, "tensor 'p': data_offsets end 12 is past the data region of 8 bytes");
    CHECK_FAILS(open_header("{\"c\":{\"dtype\":\"BF16\",\"shape\":[2,3],\"data_offsets\":[0,8]}}", 16),
                DFLASH_ERR_FORMAT, "tensor 'c': data_offsets [0, 8] hold 8 bytes, expected 12 (shape [2, 3] x BF16)");
}

static void test_size_overflow(void)
{
    /* 2^62 * 4 elements overflows int64 numel. */
    CHECK_FAILS(open_header("{\"o1\":{\"dtype\":\"I32\",\"shape\":[4611686018427387904,4],\"data_offsets\":[0,4]}}", 4),
                DFLASH_ERR_FORMAT, "tensor 'o1': element count of its shape overflows");
    /* 2^62 elements fit, but times 8 bytes does not fit in 64 bits. */
    CHECK_FAILS(open_header("{\"o2\":{\"dtype\":\"I64\",\"shape\":[2305843009213693952,2],\"data_offsets\":[0,8]}}", 8),
                DFLASH_ERR_FORMAT, "tensor 'o2': byte size of shape");
    /* A zero dim makes any other dim harmless. */
    CHECK_OK(open_header("{\"z\":{\"dtype\":\"I64\",\"shape\":[0,9223372036854775807],\"data_offsets\":[0,0]}}", 0));
}

static void test_overlap(void)
{
    CHECK_FAILS(open_header("{\"a\":{\"dtype\":\"I32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                            "\"b\":{\"dtype\":\"I32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
                            12),
                DFLASH_ERR_FORMAT, "tensors 'a' [0, 8) and 'b' [4, 12) overlap");
    CHECK_FAILS(open_header("{\"x\":{\"dtype\":\"I32\",\"shape\":[1],\"data_offsets\":[4,8]},"
                            "\"y\":{\"dtype\":\"I32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
                            8),
                DFLASH_ERR_FORMAT, "overlap");
    /* Touching ranges are fine. */
    CHECK_OK(open_header("{\"a\":{\"dtype\":\"I32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                         "\"b\":{\"dtype\":\"I32\",\"shape\":[1],\"data_offsets\":[8,12]}}",
                         12));
}

static void test_unknown_dtype(void)
{
    CHECK_FAILS(open_header("{\"d\":{\"dtype\":\"F64\",\"shape\":[1],\"data_offsets\":[0,8]}}", 8),
                DFLASH_ERR_UNSUPPORTED, "tensor 'd': dtype 'F64' is not supported");
    CHECK_FAILS(open_header("{\"u\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1),
                DFLASH_ERR_UNSUPPORTED, "tensor 'u': dtype 'U8'");
}

static void test_open_errors(void)
{
    dflash_st *st = NULL;
    char path[512];
    snprintf(path, sizeof path, "%s/does-not-exist.safetensors", g_root);
    CHECK_FAILS(dflash_st_open(path, &st), DFLASH_ERR_IO, "No such file");
    CHECK_FAILS(dflash_st_open(path, &st), DFLASH_ERR_IO, "does-not-exist.safetensors");
    char dir[256];
    make_dir(dir, sizeof dir, "empty");
    CHECK_FAILS(dflash_st_open(dir, &st), DFLASH_ERR_NOT_FOUND,
                "neither model.safetensors.index.json nor model.safetensors");
    CHECK_FAILS(dflash_st_open(dir, &st), DFLASH_ERR_NOT_FOUND, dir);
    CHECK(st == NULL);
}

/* ---- sharded folders --------------------------------------------------- */

static const char *k_shard1 = "{\"a\":{\"dtype\":\"I32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                              "\"b\":{\"dtype\":\"BF16\",\"shape\":[2,2],\"data_offsets\":[8,16]}}";
static const char *k_shard2 = "{\"c\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,12]}}";

static void make_sharded(char *dir, size_t n, const char *name, const char *index, const char *shard2)
{
    char path[512];
    make_dir(dir, n, name);
    snprintf(path, sizeof path, "%s/model-00001-of-00002.safetensors", dir);
    write_image(path, k_shard1, 16);
    snprintf(path, sizeof path, "%s/model-00002-of-00002.safetensors", dir);
    write_image(path, shard2, 12);
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    write_file(path, index, strlen(index));
}

static const char *k_index_good = "{\"metadata\":{\"total_size\":36},\"weight_map\":{"
                                  "\"a\":\"model-00001-of-00002.safetensors\","
                                  "\"b\":\"model-00001-of-00002.safetensors\","
                                  "\"c\":\"model-00002-of-00002.safetensors\"}}";

static void test_sharded_good(void)
{
    char dir[256], shard2[512];
    make_sharded(dir, sizeof dir, "sharded", k_index_good, k_shard2);
    dflash_st *st = NULL;
    CHECK_OK(dflash_st_open(dir, &st));
    if (!st)
        return;
    CHECK(dflash_st_count(st) == 3);
    snprintf(shard2, sizeof shard2, "%s/model-00002-of-00002.safetensors", dir);
    const dflash_tensor_info *c = NULL;
    int64_t shape[1] = { 3 };
    CHECK_OK(dflash_st_get(st, "c", DFLASH_DTYPE_F32, 1, shape, &c));
    CHECK(c && strcmp(c->file, shard2) == 0 && ((const uint8_t *)c->data)[11] == 11);
    const dflash_tensor_info *b = dflash_st_find(st, "b");
    CHECK(b && ((const uint8_t *)b->data)[0] == 8);
    dflash_st_close(st);
}

static void test_sharded_missing_shard(void)
{
    char dir[256];
    const char *index = "{\"weight_map\":{\"a\":\"model-00001-of-00002.safetensors\","
                        "\"z\":\"model-00003-of-00002.safetensors\"}}";
    make_sharded(dir, sizeof dir, "missing_shard", index, k_shard2);
    dflash_st *st = NULL;
    CHECK_FAILS(dflash_st_open(dir, &st), DFLASH_ERR_NOT_FOUND, "shard 'model-00003-of-00002.safetensors'");
    CHECK_FAILS(dflash_st_open(dir, &st), DFLASH_ERR_NOT_FOUND, "model.safetensors.index.json");
    CHECK_FAILS(dflash_st_open(dir, &st), DFLASH_ERR_NOT_FOUND, "No such file");
    CHECK(st == NULL);
}

static void test_sharded_path_outside_folder(void)
{
    char dir[256];
    const char *index = "{\"weight_map\":{\"a\":\"model-00001-of-00002.safetensors\","
                        "\"z\":\"../../../etc/passwd\"}}";
    make_sharded(dir, sizeof dir, "escaping_shard", index, k_shard2);
    dflash_st *st = NULL;
    CHECK_FAILS(dflash_st_open(dir, &st), DFLASH_ERR_FORMAT, "names '../../../etc/passwd'");
    CHECK(st == NULL);
}

static void test_sharded_name_not_in_shard(void)
{
    char dir[256];
    /* "c" is listed under shard 1, which does not hold it. */
    const char *index = "{\"weight_map\":{\"a\":\"model-00001-of-00002.safetensors\","
                        "\"c\":\"model-00001-of-00002.safetensors\","
                        "\"x\":\"model-00002-of-00002.safetensors\"}}";
    make_sharded(dir, sizeof dir, "wrong_shard", index, k_shard2);
    dflash_st *st = NULL;
    CHECK_FAILS(dflash_st_open(dir, &st), DFLASH_ERR_FORMAT,
                "weight_map puts tensor 'c' in shard 'model-00001-of-00002.safetensors', which does not hold it");
    const char *index2 = "{\"weight_map\":{\"ghost\":\"model-00002-of-00002.safetensors\"}}";
    make_sharded(dir, sizeof dir, "ghost", index2, k_shard2);
    CHECK_FAILS(dflash_st_open(dir, &st), DFLASH_ERR_FORMAT, "tensor 'ghost'");
}

static void test_sharded_duplicate(void)
{
    char dir[256];
    /* Shard 2 also holds "a". */
    const char *dup2 = "{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,12]}}";
    const char *index = "{\"weight_map\":{\"a\":\"model-00001-of-00002.safetensors\","
                        "\"b\":\"model-00002-of-00002.safetensors\"}}";
    make_sharded(dir, sizeof dir, "dup", index, dup2);
    dflash_st *st = NULL;
    CHECK_FAILS(dflash_st_open(dir, &st), DFLASH_ERR_FORMAT, "tensor 'a' appears twice");
}

static void test_sharded_bad_index(void)
{
    char dir[256];
    dflash_st *st = NULL;
    make_sharded(dir, sizeof dir, "badidx1", "{\"weight_map\":", k_shard2);
    CHECK_FAILS(dflash_st_open(dir, &st), DFLASH_ERR_FORMAT, "model.safetensors.index.json: not valid JSON");
    make_sharded(dir, sizeof dir, "badidx2", "{\"metadata\":{}}", k_shard2);
    CHECK_FAILS(dflash_st_open(dir, &st), DFLASH_ERR_FORMAT, "has no \"weight_map\"");
    make_sharded(dir, sizeof dir, "badidx3", "{\"weight_map\":{\"a\":1}}", k_shard2);
    CHECK_FAILS(dflash_st_open(dir, &st), DFLASH_ERR_FORMAT, "weight_map entry for tensor 'a' is an integer");
    /* A malformed shard is reported with the shard's own message. */
    make_sharded(dir, sizeof dir, "badshard", k_index_good, "{\"c\":{\"dtype\":\"F64\",\"shape\":[1],\"data_offsets\":[0,8]}}");
    CHECK_FAILS(dflash_st_open(dir, &st), DFLASH_ERR_UNSUPPORTED, "dtype 'F64'");
}

/* ---- dflash_st_get ----------------------------------------------------- */

static void test_get_checks(void)
{
    image im = image_make(k_good, 20);
    dflash_st *st = NULL;
    CHECK_OK(dflash_st_open_memory(im.bytes, im.len, "g.safetensors", &st));
    if (!st) {
        free(im.bytes);
        return;
    }
    const dflash_tensor_info *t = NULL;
    int64_t good[2] = { 2, 3 }, swapped[2] = { 3, 2 };
    CHECK_OK(dflash_st_get(st, "w", DFLASH_DTYPE_BF16, 2, good, &t));
    CHECK(t && t->numel == 6);
    CHECK_OK(dflash_st_get(st, "w", DFLASH_DTYPE_INVALID, -1, NULL, &t));
    CHECK_OK(dflash_st_get(st, "s", DFLASH_DTYPE_F32, 0, NULL, &t));
    CHECK_FAILS(dflash_st_get(st, "zz", DFLASH_DTYPE_BF16, 2, good, &t), DFLASH_ERR_NOT_FOUND,
                "tensor 'zz' not found in g.safetensors");
    CHECK(t == NULL);
    CHECK_FAILS(dflash_st_get(st, "w", DFLASH_DTYPE_F32, 2, good, &t), DFLASH_ERR_SHAPE,
                "g.safetensors: tensor 'w' has dtype BF16, expected F32");
    CHECK_FAILS(dflash_st_get(st, "w", DFLASH_DTYPE_BF16, 2, swapped, &t), DFLASH_ERR_SHAPE,
                "tensor 'w' has shape [2, 3], expected [3, 2]");
    CHECK_FAILS(dflash_st_get(st, "w", DFLASH_DTYPE_BF16, 1, good, &t), DFLASH_ERR_SHAPE, "expected [2]");
    CHECK_FAILS(dflash_st_get(st, "s", DFLASH_DTYPE_INVALID, 1, good, &t), DFLASH_ERR_SHAPE,
                "has shape [], expected [2]");
    dflash_st_close(st);
    free(im.bytes);
}

int main(void)
{
    snprintf(g_root, sizeof g_root, "/tmp/dflash-st-XXXXXX");
    if (!mkdtemp(g_root)) {
        perror("mkdtemp");
        return 1;
    }
    RUN(test_good_memory);
    RUN(test_good_file_and_folder);
    RUN(test_header_padding_and_holes);
    RUN(test_misaligned_data);
    RUN(test_short_file);
    RUN(test_header_length);
    RUN(test_bad_json);
    RUN(test_duplicate_in_file);
    RUN(test_missing_fields);
    RUN(test_wrong_types);
    RUN(test_bad_dims);
    RUN(test_bad_offsets);
    RUN(test_size_overflow);
    RUN(test_overlap);
    RUN(test_unknown_dtype);
    RUN(test_open_errors);
    RUN(test_sharded_good);
    RUN(test_sharded_missing_shard);
    RUN(test_sharded_name_not_in_shard);
    RUN(test_sharded_path_outside_folder);
    RUN(test_sharded_duplicate);
    RUN(test_sharded_bad_index);
    RUN(test_get_checks);
    remove_tree(g_root);
    TEST_END();
}
