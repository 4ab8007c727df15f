/* safetensors.c: owns reading safetensors checkpoints: mapping files,
 * parsing and validating each JSON header, resolving sharded folders
 * (model.safetensors.index.json), aligned copies of tensors the file leaves
 * misaligned, and the name-sorted tensor table a set exposes. Nothing
 * outside a validated [begin, end) range of a mapping (or its aligned copy)
 * is ever reachable through a dflash_tensor_info. */
#include "io/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>

#include "core/file.h"
#include "core/log.h"
#include "io/json_util.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* The reference implementation refuses headers above 100 MB; a real header
 * is a few hundred KB, so a larger length means a corrupt or hostile file. */
#define ST_MAX_HEADER ((uint64_t)100 * 1000 * 1000)
#define ST_INDEX_NAME "model.safetensors.index.json"
/* An index lists every tensor once: a few MB for the largest models. */
#define ST_INDEX_MAX_BYTES ((size_t)64 << 20)
#define ST_SINGLE_NAME "model.safetensors"

typedef struct st_file {
    char *path;
    const uint8_t *base; /* whole file image */
    size_t len;
    const uint8_t *region; /* data region: base + 8 + header length */
    size_t region_len;
    int mapped; /* 1: we munmap it; 0: the caller's memory */
    uint8_t *aligned; /* copies of the tensors misaligned in the image, or NULL */
} st_file;

struct dflash_st {
    char *path;
    st_file *files;
    size_t n_files, cap_files;
    dflash_tensor_info *tensors; /* sorted by name once the set is complete */
    size_t n_tensors, cap_tensors;
};

/* ---- small helpers ---------------------------------------------------- */


static void st_shape_str(char *buf, size_t n, int ndim, const int64_t *shape)
{
    size_t used = (size_t)snprintf(buf, n, "[");
    for (int i = 0; i < ndim && used < n; i++)
        used += (size_t)snprintf(buf + used, n - used, "%s%" PRId64, i ? ", " : "", shape[i]);
    if (used < n)
        snprintf(buf + used, n - used, "]");
}

static char *st_join(const char *dir, const char *name)
{
    size_t a = strlen(dir), b = strlen(name);
    char *p = malloc(a + b + 2);
    if (!p)
        return NULL;
    memcpy(p, dir, a);
    p[a] = '/';
    memcpy(p + a + 1, name, b + 1);
    return p;
}

/* Present at all: a FIFO or folder under the name is then refused by the
 * reader, naming what it is, rather than reported as missing. */
static int st_exists(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0;
}

static uint64_t st_read_le64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

/* ---- set bookkeeping --------------------------------------------------- */

static dflash_st *st_new(const char *path)
{
    dflash_st *st = calloc(1, sizeof *st);
    if (!st)
        return NULL;
    st->path = strdup(path);
    if (!st->path) {
        free(st);
        return NULL;
    }
    return st;
}

void dflash_st_close(dflash_st *st)
{
    if (!st)
        return;
    for (size_t i = 0; i < st->n_tensors; i++)
        free((char *)st->tensors[i].name);
    for (size_t i = 0; i < st->n_files; i++) {
        if (st->files[i].mapped)
            munmap((void *)st->files[i].base, st->files[i].len);
        free(st->files[i].aligned);
        free(st->files[i].path);
    }
    free(st->tensors);
    free(st->files);
    free(st->path);
    free(st);
}

/* Appends a file record; on success the set owns the mapping (if mapped). */
static dflash_status st_push_file(dflash_st *st, const char *path, const void *base, size_t len,
                                  int mapped, size_t *index)
{
    if (st->n_files == st->cap_files) {
        size_t cap = st->cap_files ? 2 * st->cap_files : 4;
        st_file *f = realloc(st->files, cap * sizeof *f);
        if (!f)
            return dflash_fail(DFLASH_ERR_OOM, "%s: out of memory", path);
        st->files = f;
        st->cap_files = cap;
    }
    char *copy = strdup(path);
    if (!copy)
        return dflash_fail(DFLASH_ERR_OOM, "%s: out of memory", path);
    st->files[st->n_files] = (st_file){ copy, base, len, NULL, 0, mapped, NULL };
    *index = st->n_files++;
    return DFLASH_OK;
}

static dflash_tensor_info *st_reserve_tensor(dflash_st *st, const char *label)
{
    if (st->n_tensors == st->cap_tensors) {
        size_t cap = st->cap_tensors ? 2 * st->cap_tensors : 64;
        dflash_tensor_info *t = realloc(st->tensors, cap * sizeof *t);
        if (!t) {
            dflash_fail(DFLASH_ERR_OOM, "%s: out of memory", label);
            return NULL;
        }
        st->tensors = t;
        st->cap_tensors = cap;
    }
    dflash_tensor_info *t = &st->tensors[st->n_tensors];
    memset(t, 0, sizeof *t);
    return t;
}

/* ---- one header entry -------------------------------------------------- */

static dflash_status st_parse_dtype(const char *label, const char *name, const json_t *entry,
                                    dflash_dtype *out)
{
    const json_t *v = json_object_get(entry, "dtype");
    if (!v)
        return dflash_fail(DFLASH_ERR_FORMAT, "%s: tensor '%s' has no \"dtype\"", label, name);
    if (!json_is_string(v))
        return dflash_fail(DFLASH_ERR_FORMAT, "%s: tensor '%s': \"dtype\" is %s, expected a string",
                           label, name, dflash_json_type_name(v));
    *out = dflash_dtype_from_name(json_string_value(v));
    if (*out == DFLASH_DTYPE_INVALID)
        return dflash_fail(DFLASH_ERR_UNSUPPORTED,
                           "%s: tensor '%s': dtype '%s' is not supported (F32, F16, BF16, F8_E4M3, I32, I64)",
                           label, name, json_string_value(v));
    return DFLASH_OK;
}

static dflash_status st_parse_shape(const char *label, const char *name, const json_t *entry,
                                    dflash_tensor_info *t)
{
    const json_t *v = json_object_get(entry, "shape");
    if (!v)
        return dflash_fail(DFLASH_ERR_FORMAT, "%s: tensor '%s' has no \"shape\"", label, name);
    if (!json_is_array(v))
        return dflash_fail(DFLASH_ERR_FORMAT, "%s: tensor '%s': \"shape\" is %s, expected an array",
                           label, name, dflash_json_type_name(v));
    size_t nd = json_array_size(v);
    if (nd > DFLASH_ST_MAX_DIMS)
        return dflash_fail(DFLASH_ERR_UNSUPPORTED, "%s: tensor '%s' has %zu dims, at most %d are supported",
                           label, name, nd, DFLASH_ST_MAX_DIMS);
    t->ndim = (int)nd;
    t->numel = 1; /* a 0-dim tensor is a scalar */
    for (size_t i = 0; i < nd; i++) {
        const json_t *d = json_array_get(v, i);
        if (!json_is_integer(d))
            return dflash_fail(DFLASH_ERR_FORMAT, "%s: tensor '%s': shape[%zu] is %s, expected an integer",
                               label, name, i, dflash_json_type_name(d));
        json_int_t dim = json_integer_value(d);
        if (dim < 0)
            return dflash_fail(DFLASH_ERR_FORMAT, "%s: tensor '%s': shape[%zu] = %lld is negative", label,
                               name, i, (long long)dim);
        t->shape[i] = (int64_t)dim;
        if (__builtin_mul_overflow(t->numel, t->shape[i], &t->numel))
            return dflash_fail(DFLASH_ERR_FORMAT, "%s: tensor '%s': element count of its shape overflows",
                               label, name);
    }
    return DFLASH_OK;
}

static dflash_status st_parse_offsets(const char *label, const char *name, const json_t *entry,
                                      uint64_t *begin, uint64_t *end)
{
    const json_t *v = json_object_get(entry, "data_offsets");
    if (!v)
        return dflash_fail(DFLASH_ERR_FORMAT, "%s: tensor '%s' has no \"data_offsets\"", label, name);
    if (!json_is_array(v) || json_array_size(v) != 2)
        return dflash_fail(DFLASH_ERR_FORMAT, "%s: tensor '%s': \"data_offsets\" must be an array of 2 integers",
                           label, name);
    json_int_t o[2];
    for (size_t i = 0; i < 2; i++) {
        const json_t *d = json_array_get(v, i);
        if (!json_is_integer(d))
            return dflash_fail(DFLASH_ERR_FORMAT, "%s: tensor '%s': data_offsets[%zu] is %s, expected an integer",
                               label, name, i, dflash_json_type_name(d));
        o[i] = json_integer_value(d);
        if (o[i] < 0)
            return dflash_fail(DFLASH_ERR_FORMAT, "%s: tensor '%s': data_offsets[%zu] = %lld is negative",
                               label, name, i, (long long)o[i]);
    }
    *begin = (uint64_t)o[0];
    *end = (uint64_t)o[1];
    return DFLASH_OK;
}

/* Validates one header entry and fills `t` (all but the name). */
static dflash_status st_parse_entry(const st_file *f, const char *name, const json_t *entry,
                                    dflash_tensor_info *t)
{
    const char *label = f->path;
    if (!json_is_object(entry))
        return dflash_fail(DFLASH_ERR_FORMAT, "%s: tensor '%s' is %s, expected an object", label, name,
                           dflash_json_type_name(entry));
    uint64_t begin = 0, end = 0;
    DFLASH_TRY(st_parse_dtype(label, name, entry, &t->dtype));
    DFLASH_TRY(st_parse_shape(label, name, entry, t));
    DFLASH_TRY(st_parse_offsets(label, name, entry, &begin, &end));
    if (begin > end)
        return dflash_fail(DFLASH_ERR_FORMAT, "%s: tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64 "] begin > end",
                           label, name, begin, end);
    if (end > f->region_len)
        return dflash_fail(DFLASH_ERR_FORMAT,
                           "%s: tensor '%s': data_offsets end %" PRIu64 " is past the data region of %zu bytes",
                           label, name, end, f->region_len);
    char shape[200];
    st_shape_str(shape, sizeof shape, t->ndim, t->shape);
    uint64_t want;
    if (__builtin_mul_overflow((uint64_t)t->numel, (uint64_t)dflash_dtype_size(t->dtype), &want))
        return dflash_fail(DFLASH_ERR_FORMAT, "%s: tensor '%s': byte size of shape %s x %s overflows", label,
                           name, shape, dflash_dtype_name(t->dtype));
    if (end - begin != want)
        return dflash_fail(DFLASH_ERR_FORMAT,
                           "%s: tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64 "] hold %" PRIu64
                           " bytes, expected %" PRIu64 " (shape %s x %s)",
                           label, name, begin, end, end - begin, want, shape, dflash_dtype_name(t->dtype));
    t->file = f->path;
    t->data = f->region + begin;
    t->nbytes = (size_t)want;
    return DFLASH_OK;
}

/* ---- one header -------------------------------------------------------- */

static dflash_status st_check_metadata(const char *label, const json_t *meta)
{
    if (!json_is_object(meta))
        return dflash_fail(DFLASH_ERR_FORMAT, "%s: \"__metadata__\" is %s, expected an object", label,
                           dflash_json_type_name(meta));
    const char *key;
    const json_t *v;
    json_object_foreach((json_t *)meta, key, v) {
        if (!json_is_string(v))
            return dflash_fail(DFLASH_ERR_FORMAT, "%s: __metadata__ '%s' is %s, expected a string", label, key,
                               dflash_json_type_name(v));
    }
    return DFLASH_OK;
}

static int st_cmp_range(const void *a, const void *b)
{
    const dflash_tensor_info *x = *(const dflash_tensor_info *const *)a;
    const dflash_tensor_info *y = *(const dflash_tensor_info *const *)b;
    uintptr_t xa = (uintptr_t)x->data, ya = (uintptr_t)y->data;
    if (xa != ya)
        return xa < ya ? -1 : 1;
    return x->nbytes < y->nbytes ? -1 : x->nbytes > y->nbytes;
}

/* Byte ranges of one file's tensors [first, n) must not overlap. */
static dflash_status st_check_overlap(const dflash_st *st, const st_file *f, size_t first)
{
    size_t n = st->n_tensors - first;
    if (n < 2)
        return DFLASH_OK;
    const dflash_tensor_info **order = malloc(n * sizeof *order);
    if (!order)
        return dflash_fail(DFLASH_ERR_OOM, "%s: out of memory", f->path);
    for (size_t i = 0; i < n; i++)
        order[i] = &st->tensors[first + i];
    qsort(order, n, sizeof *order, st_cmp_range);
    dflash_status s = DFLASH_OK;
    for (size_t i = 1; i < n && s == DFLASH_OK; i++) {
        const dflash_tensor_info *a = order[i - 1], *b = order[i];
        size_t a0 = (size_t)((const uint8_t *)a->data - f->region), b0 = (size_t)((const uint8_t *)b->data - f->region);
        if (b0 < a0 + a->nbytes)
            s = dflash_fail(DFLASH_ERR_FORMAT, "%s: tensors '%s' [%zu, %zu) and '%s' [%zu, %zu) overlap", f->path,
                            a->name, a0, a0 + a->nbytes, b->name, b0, b0 + b->nbytes);
    }
    free(order);
    return s;
}

/* ---- alignment ---------------------------------------------------------- */

static int st_misaligned(const dflash_tensor_info *t)
{
    return (uintptr_t)t->data % dflash_dtype_size(t->dtype) != 0;
}

/* The format allows a header of any length and any offsets, so a tensor's
 * bytes may sit at an address that is not a multiple of its element size;
 * its elements are read as uint16_t, float, ... which must be aligned. Such
 * tensors of file `f` (its tensors are [first, n)) get one aligned copy,
 * made once here; the others stay in the mapping. */
static dflash_status st_align_tensors(dflash_st *st, st_file *f, size_t first)
{
    static const max_align_t k_empty; /* where a misaligned 0-byte tensor points */
    size_t total = 0, count = 0;
    for (size_t i = first; i < st->n_tensors; i++)
        if (st_misaligned(&st->tensors[i])) {
            total += (st->tensors[i].nbytes + 7) / 8 * 8; /* cannot overflow: within the region, plus padding */
            count++;
        }
    if (count == 0)
        return DFLASH_OK;
    f->aligned = total ? malloc(total) : NULL; /* malloc's alignment suits every element type */
    if (total && !f->aligned)
        return dflash_fail(DFLASH_ERR_OOM, "%s: out of memory copying %zu bytes of misaligned tensor data", f->path,
                           total);
    size_t off = 0;
    for (size_t i = first; i < st->n_tensors; i++) {
        dflash_tensor_info *t = &st->tensors[i];
        if (!st_misaligned(t))
            continue;
        if (t->nbytes == 0) {
            t->data = &k_empty;
            continue;
        }
        memcpy(f->aligned + off, t->data, t->nbytes);
        t->data = f->aligned + off;
        off += (t->nbytes + 7) / 8 * 8;
    }
    /* Said for files where it matters: the copy costs memory the mapping
     * would not, avoided by rewriting the file with its header padded to 8. */
    if (f->mapped && total >= ((size_t)1 << 20))
        dflash_log(DFLASH_LOG_INFO, "%s: %zu tensors are not aligned to their elements in the file (header of "
                   "%zu bytes); copied them into aligned memory (%.1f MB)", f->path, count,
                   (size_t)(f->region - f->base) - 8, total / 1e6);
    return DFLASH_OK;
}

static dflash_status st_parse_header_json(dflash_st *st, st_file *f, const json_t *root)
{
    if (!json_is_object(root))
        return dflash_fail(DFLASH_ERR_FORMAT, "%s: header is %s, expected a JSON object", f->path,
                           dflash_json_type_name(root));
    size_t first = st->n_tensors;
    const char *key;
    const json_t *v;
    json_object_foreach((json_t *)root, key, v) {
        if (strcmp(key, "__metadata__") == 0) {
            DFLASH_TRY(st_check_metadata(f->path, v));
            continue;
        }
        dflash_tensor_info *t = st_reserve_tensor(st, f->path);
        if (!t)
            return DFLASH_ERR_OOM;
        DFLASH_TRY(st_parse_entry(f, key, v, t));
        t->name = strdup(key);
        if (!t->name)
            return dflash_fail(DFLASH_ERR_OOM, "%s: out of memory", f->path);
        st->n_tensors++;
    }
    DFLASH_TRY(st_check_overlap(st, f, first)); /* on offsets in the image: before any copy */
    return st_align_tensors(st, f, first);
}

/* Parses the image of file `fi` and appends its tensors to the set. */
static dflash_status st_parse_image(dflash_st *st, size_t fi)
{
    st_file *f = &st->files[fi];
    if (f->len < 8)
        return dflash_fail(DFLASH_ERR_FORMAT, "%s: file is %zu bytes, shorter than the 8-byte header length",
                           f->path, f->len);
    uint64_t n = st_read_le64(f->base);
    if (n > ST_MAX_HEADER)
        return dflash_fail(DFLASH_ERR_FORMAT, "%s: header length %" PRIu64 " is over the %" PRIu64 "-byte limit",
                           f->path, n, ST_MAX_HEADER);
    if (n > f->len - 8)
        return dflash_fail(DFLASH_ERR_FORMAT, "%s: header length %" PRIu64 " is past the end of the %zu-byte file",
                           f->path, n, f->len);
    f->region = f->base + 8 + n;
    f->region_len = f->len - 8 - (size_t)n;
    json_error_t err;
    json_t *root = json_loadb((const char *)f->base + 8, (size_t)n, JSON_REJECT_DUPLICATES, &err);
    if (!root)
        return dflash_fail(DFLASH_ERR_FORMAT, "%s: header is not valid JSON: %s (line %d, column %d)", f->path,
                           err.text, err.line, err.column);
    dflash_status s = st_parse_header_json(st, f, root);
    json_decref(root);
    return s;
}

/* Maps `path` read-only and adds its tensors; returns the file index. */
static dflash_status st_add_file(dflash_st *st, const char *path, size_t *index)
{
    int fd;
    uint64_t size;
    DFLASH_TRY(dflash_open_regular(path, &fd, &size));
    size_t len = (size_t)size;
    if (len < 8) { /* mmap of an empty file fails; report the format problem */
        close(fd);
        return dflash_fail(DFLASH_ERR_FORMAT, "%s: file is %zu bytes, shorter than the 8-byte header length",
                           path, len);
    }
    void *base = mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd);
    if (base == MAP_FAILED)
        return dflash_fail(DFLASH_ERR_IO, "%s: mmap of %zu bytes failed: %s", path, len, strerror(e));
    dflash_status s = st_push_file(st, path, base, len, 1, index);
    if (s != DFLASH_OK) {
        munmap(base, len);
        return s;
    }
    return st_parse_image(st, *index);
}

/* ---- completing a set -------------------------------------------------- */

static int st_cmp_name(const void *a, const void *b)
{
    return strcmp(((const dflash_tensor_info *)a)->name, ((const dflash_tensor_info *)b)->name);
}

/* Sorts the table by name (for bsearch) and rejects names seen twice, which
 * within one file jansson already refuses, so here means across shards. */
static dflash_status st_finish(dflash_st *st)
{
    if (st->n_tensors > 1)
        qsort(st->tensors, st->n_tensors, sizeof *st->tensors, st_cmp_name);
    for (size_t i = 1; i < st->n_tensors; i++) {
        const dflash_tensor_info *a = &st->tensors[i - 1], *b = &st->tensors[i];
        if (strcmp(a->name, b->name) == 0)
            return dflash_fail(DFLASH_ERR_FORMAT, "%s: tensor '%s' appears twice, in %s and in %s", st->path,
                               a->name, a->file, b->file);
    }
    return DFLASH_OK;
}

/* ---- sharded folders --------------------------------------------------- */

static dflash_status st_load_index(const char *index, json_t **weight_map, json_t **root)
{
    char *text;
    size_t len;
    DFLASH_TRY(dflash_read_file(index, ST_INDEX_MAX_BYTES, &text, &len));
    json_error_t err;
    *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &err);
    free(text);
    if (!*root)
        return dflash_fail(DFLASH_ERR_FORMAT, "%s: not valid JSON: %s (line %d, column %d)", index, err.text,
                           err.line, err.column);
    if (!json_is_object(*root))
        return dflash_fail(DFLASH_ERR_FORMAT, "%s: is %s, expected a JSON object", index, dflash_json_type_name(*root));
    *weight_map = json_object_get(*root, "weight_map");
    if (!*weight_map)
        return dflash_fail(DFLASH_ERR_FORMAT, "%s: has no \"weight_map\"", index);
    if (!json_is_object(*weight_map))
        return dflash_fail(DFLASH_ERR_FORMAT, "%s: \"weight_map\" is %s, expected an object", index,
                           dflash_json_type_name(*weight_map));
    const char *key;
    json_t *v;
    json_object_foreach(*weight_map, key, v) {
        if (!json_is_string(v) || json_string_length(v) == 0)
            return dflash_fail(DFLASH_ERR_FORMAT, "%s: weight_map entry for tensor '%s' is %s, expected a shard file name",
                               index, key, json_is_string(v) ? "an empty string" : dflash_json_type_name(v));
        /* Shards live beside the index: no paths that leave the folder. */
        const char *f = json_string_value(v);
        if (strchr(f, '/') || f[0] == '.')
            return dflash_fail(DFLASH_ERR_FORMAT, "%s: weight_map entry for tensor '%s' names '%s', expected a file "
                               "name in the same folder", index, key, f);
    }
    return DFLASH_OK;
}

/* Opens the shard `shard` (relative to `dir`) unless already open. */
static dflash_status st_open_shard(dflash_st *st, const char *index, const char *dir, const char *shard)
{
    char *path = st_join(dir, shard);
    if (!path)
        return dflash_fail(DFLASH_ERR_OOM, "%s: out of memory", index);
    for (size_t i = 0; i < st->n_files; i++) {
        if (strcmp(st->files[i].path, path) == 0) {
            free(path);
            return DFLASH_OK;
        }
    }
    size_t fi;
    dflash_status s = st_add_file(st, path, &fi);
    free(path);
    if (s != DFLASH_OK)
        return dflash_fail_prefix(s, "%s: shard '%s': ", index, shard);
    return DFLASH_OK;
}

/* Every weight_map entry must name a tensor its shard really holds. */
static dflash_status st_check_weight_map(const dflash_st *st, const char *index, const char *dir,
                                         json_t *weight_map)
{
    const char *key;
    json_t *v;
    json_object_foreach(weight_map, key, v) {
        const char *shard = json_string_value(v);
        const dflash_tensor_info *t = dflash_st_find(st, key);
        char *path = st_join(dir, shard);
        if (!path)
            return dflash_fail(DFLASH_ERR_OOM, "%s: out of memory", index);
        int ok = t && strcmp(t->file, path) == 0;
        free(path);
        if (!ok)
            return dflash_fail(DFLASH_ERR_FORMAT, "%s: weight_map puts tensor '%s' in shard '%s', which does not hold it%s%s",
                               index, key, shard, t ? "; it is in " : "", t ? t->file : "");
    }
    return DFLASH_OK;
}

static dflash_status st_open_sharded(dflash_st *st, const char *dir, const char *index)
{
    json_t *root = NULL, *weight_map = NULL;
    dflash_status s = st_load_index(index, &weight_map, &root);
    const char *key;
    json_t *v;
    if (s == DFLASH_OK) {
        json_object_foreach(weight_map, key, v) {
            s = st_open_shard(st, index, dir, json_string_value(v));
            if (s != DFLASH_OK)
                break;
        }
    }
    if (s == DFLASH_OK)
        s = st_finish(st);
    if (s == DFLASH_OK)
        s = st_check_weight_map(st, index, dir, weight_map);
    json_decref(root);
    return s;
}

static dflash_status st_open_folder(dflash_st *st, const char *dir)
{
    char *index = st_join(dir, ST_INDEX_NAME);
    char *single = st_join(dir, ST_SINGLE_NAME);
    dflash_status s;
    size_t fi;
    if (!index || !single)
        s = dflash_fail(DFLASH_ERR_OOM, "%s: out of memory", dir);
    else if (st_exists(index))
        s = st_open_sharded(st, dir, index);
    else if (st_exists(single)) {
        s = st_add_file(st, single, &fi);
        if (s == DFLASH_OK)
            s = st_finish(st);
    } else
        s = dflash_fail(DFLASH_ERR_NOT_FOUND, "%s: folder holds neither %s nor %s", dir, ST_INDEX_NAME,
                        ST_SINGLE_NAME);
    free(index);
    free(single);
    return s;
}

/* ---- public API -------------------------------------------------------- */

dflash_status dflash_st_open(const char *path, dflash_st **out)
{
    if (!path || !out)
        return dflash_fail(DFLASH_ERR_INVALID_ARG, "dflash_st_open: path and out must not be NULL");
    *out = NULL;
    struct stat sb;
    if (stat(path, &sb) != 0)
        return dflash_fail(DFLASH_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    dflash_st *st = st_new(path);
    if (!st)
        return dflash_fail(DFLASH_ERR_OOM, "%s: out of memory", path);
    dflash_status s;
    size_t fi;
    if (S_ISDIR(sb.st_mode))
        s = st_open_folder(st, path);
    else {
        s = st_add_file(st, path, &fi);
        if (s == DFLASH_OK)
            s = st_finish(st);
    }
    if (s != DFLASH_OK) {
        dflash_st_close(st);
        return s;
    }
    *out = st;
    return DFLASH_OK;
}

dflash_status dflash_st_open_memory(const void *data, size_t len, const char *label, dflash_st **out)
{
    if (!out || (!data && len) || !label)
        return dflash_fail(DFLASH_ERR_INVALID_ARG, "dflash_st_open_memory: data, label and out must not be NULL");
    *out = NULL;
    dflash_st *st = st_new(label);
    if (!st)
        return dflash_fail(DFLASH_ERR_OOM, "%s: out of memory", label);
    size_t fi;
    dflash_status s = st_push_file(st, label, data, len, 0, &fi);
    if (s == DFLASH_OK)
        s = st_parse_image(st, fi);
    if (s == DFLASH_OK)
        s = st_finish(st);
    if (s != DFLASH_OK) {
        dflash_st_close(st);
        return s;
    }
    *out = st;
    return DFLASH_OK;
}

size_t dflash_st_count(const dflash_st *st) { return st ? st->n_tensors : 0; }

const dflash_tensor_info *dflash_st_at(const dflash_st *st, size_t i)
{
    return st && i < st->n_tensors ? &st->tensors[i] : NULL;
}

const dflash_tensor_info *dflash_st_find(const dflash_st *st, const char *name)
{
    if (!st || !name || st->n_tensors == 0)
        return NULL;
    dflash_tensor_info key = { .name = name };
    return bsearch(&key, st->tensors, st->n_tensors, sizeof *st->tensors, st_cmp_name);
}

size_t dflash_st_index_of(const dflash_st *st, const dflash_tensor_info *t) { return (size_t)(t - st->tensors); }

const char *dflash_st_path(const dflash_st *st) { return st ? st->path : ""; }

dflash_status dflash_st_get(const dflash_st *st, const char *name, dflash_dtype dtype, int ndim,
                            const int64_t *shape, const dflash_tensor_info **out)
{
    if (!st || !name || ndim > DFLASH_ST_MAX_DIMS || (ndim > 0 && !shape))
        return dflash_fail(DFLASH_ERR_INVALID_ARG, "dflash_st_get: bad arguments for tensor '%s'", name ? name : "(null)");
    if (out)
        *out = NULL;
    const dflash_tensor_info *t = dflash_st_find(st, name);
    if (!t)
        return dflash_fail(DFLASH_ERR_NOT_FOUND, "safetensors: tensor '%s' not found in %s", name, st->path);
    if (dtype != DFLASH_DTYPE_INVALID && t->dtype != dtype)
        return dflash_fail(DFLASH_ERR_SHAPE, "%s: tensor '%s' has dtype %s, expected %s", st->path, name,
                           dflash_dtype_name(t->dtype), dflash_dtype_name(dtype));
    if (ndim >= 0) {
        int same = t->ndim == ndim;
        for (int i = 0; same && i < ndim; i++)
            same = t->shape[i] == shape[i];
        if (!same) {
            char want[200], got[200];
            st_shape_str(want, sizeof want, ndim, shape);
            st_shape_str(got, sizeof got, t->ndim, t->shape);
            return dflash_fail(DFLASH_ERR_SHAPE, "%s: tensor '%s' has shape %s, expected %s", st->path, name, got,
                               want);
        }
    }
    if (out)
        *out = t;
    return DFLASH_OK;
}
