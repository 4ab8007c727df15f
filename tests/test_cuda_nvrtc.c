/* test_cuda_nvrtc.c: the CUDA backend's checks that need no GPU (they run
 * everywhere the CUDA toolkit's NVRTC is installed, GPU or not):
 * - the sources embedded in kernels_src.c equal src/backend/cuda/kernels/
 *   (tools/cuda/embed.sh regenerates them);
 * - every kernel file compiles for sm_90a with an empty compiler log, and
 *   every kernel the backend resolves is a symbol of its CUBIN;
 * - the CUBIN disk cache: a second get reads the cache, a corrupt entry is
 *   ignored with a warning and rebuilt;
 * - dflash_backend_cuda_create without a usable GPU fails cleanly with
 *   DFLASH_ERR_BACKEND and a message that says why.
 * NVRTC missing is a failure that says what to install, never a skip. */
#include <dirent.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_compile.h"
#include "harness.h"

static const char *kernel_dir(void)
{
    const char *d = getenv("DFLASH_CUDA_KERNEL_DIR");
    return d ? d : "src/backend/cuda/kernels";
}

static char *read_all(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)len + 1);
    if (buf && fread(buf, 1, (size_t)len, f) != (size_t)len) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    if (buf) {
        buf[len] = 0;
        *n = (size_t)len;
    }
    return buf;
}

static void test_embedded_matches_files(void)
{
    for (int i = 0; i < dflash_cuda_src_count; i++) {
        char path[512];
        snprintf(path, sizeof path, "%s/%s", kernel_dir(), dflash_cuda_srcs[i].name);
        size_t n = 0;
        char *text = read_all(path, &n);
        CHECKF(text != NULL, "cannot read %s (run from the repo root)", path);
        if (text)
            CHECKF(n == strlen(dflash_cuda_srcs[i].text) && memcmp(text, dflash_cuda_srcs[i].text, n) == 0,
                   "%s differs from its embedded copy: run `bash tools/cuda/embed.sh`", path);
        free(text);
    }
    /* And every kernel file on disk is embedded. */
    DIR *d = opendir(kernel_dir());
    CHECKF(d != NULL, "cannot open %s", kernel_dir());
    struct dirent *e;
    while (d && (e = readdir(d)) != NULL) {
        size_t len = strlen(e->d_name);
        int is_cu = (len > 3 && strcmp(e->d_name + len - 3, ".cu") == 0) ||
                    (len > 4 && strcmp(e->d_name + len - 4, ".cuh") == 0);
        if (is_cu)
            CHECKF(dflash_cuda_src_find(e->d_name) != NULL,
                   "%s is not embedded: run `bash tools/cuda/embed.sh`", e->d_name);
    }
    if (d)
        closedir(d);
}

static void test_arch_names(void)
{
    char b[16];
    dflash_cuda_arch_name(9, 0, b, sizeof b);
    CHECK(strcmp(b, "sm_90a") == 0);
    dflash_cuda_arch_name(8, 9, b, sizeof b);
    CHECK(strcmp(b, "sm_89") == 0);
    dflash_cuda_arch_name(10, 0, b, sizeof b);
    CHECK(strcmp(b, "sm_100") == 0);
}

/* Is `name` a whole NUL-terminated string inside the CUBIN (its ELF string
 * table holds every symbol name)? */
static int cubin_has_symbol(const char *bin, size_t n, const char *name)
{
    size_t len = strlen(name);
    for (size_t i = 1; i + len < n; i++)
        if (bin[i - 1] == 0 && bin[i + len] == 0 && memcmp(bin + i, name, len) == 0)
            return 1;
    return 0;
}

/* NVRTC for a test: 1 when loaded, else a failed check naming why. */
static int nvrtc_open(dflash_nvrtc_api *nv)
{
    const dflash_status s = dflash_nvrtc_api_load(nv);
    CHECKF(s == DFLASH_OK, "%s", dflash_last_error());
    return s == DFLASH_OK;
}

static void test_compile_all_for_sm90a(void)
{
    dflash_nvrtc_api nv;
    if (!nvrtc_open(&nv))
        return;
    dflash_status s;
    int major = 0, minor = 0;
    CHECK_OK(DFLASH_NVRTC(&nv, nvrtcVersion(&major, &minor)));
    printf("# NVRTC %d.%d from %s\n", major, minor, nv.path);
    int compiled = 0;
    for (int i = 0; i < dflash_cuda_src_count; i++) {
        const dflash_cuda_src *src = &dflash_cuda_srcs[i];
        if (src->is_header)
            continue;
        void *bin = NULL;
        size_t n = 0;
        char *log = NULL;
        s = dflash_cuda_compile(&nv, src, "sm_90a", &bin, &n, &log);
        CHECKF(s == DFLASH_OK, "%s: %s", src->name, dflash_last_error());
        if (s == DFLASH_OK) {
            compiled++;
            CHECKF(log[0] == 0, "%s: compiler log not clean:\n%s", src->name, log);
            CHECKF(n > 4 && memcmp(bin, "\177ELF", 4) == 0, "%s: CUBIN is not an ELF image", src->name);
            for (int k = 0; k < DFK_COUNT; k++)
                if (strcmp(dflash_cuda_kernels[k].file, src->name) == 0)
                    CHECKF(cubin_has_symbol(bin, n, dflash_cuda_kernels[k].name), "%s: kernel %s not in the CUBIN",
                           src->name, dflash_cuda_kernels[k].name);
        }
        free(bin);
        free(log);
    }
    CHECK(compiled > 0);
    /* Every kernel's file is one of the embedded sources. */
    for (int k = 0; k < DFK_COUNT; k++)
        CHECKF(dflash_cuda_src_find(dflash_cuda_kernels[k].file) != NULL, "kernel %s names missing file %s",
               dflash_cuda_kernels[k].name, dflash_cuda_kernels[k].file);
    dflash_nvrtc_api_unload(&nv);
}

/* A test's own kernel cache: XDG_CACHE_HOME points at a fresh directory
 * from cache_begin to cache_end, which removes it and restores the
 * variable. */
typedef struct {
    char dir[64], sub[128]; /* the directory, and the backend's folder in it */
    char *saved;            /* XDG_CACHE_HOME before, or NULL */
} test_cache;

static void cache_begin(test_cache *tc, const char *name)
{
    snprintf(tc->dir, sizeof tc->dir, "/tmp/%s_XXXXXX", name);
    CHECK(mkdtemp(tc->dir) != NULL);
    snprintf(tc->sub, sizeof tc->sub, "%s/dflash", tc->dir);
    const char *old = getenv("XDG_CACHE_HOME");
    tc->saved = old ? strdup(old) : NULL;
    setenv("XDG_CACHE_HOME", tc->dir, 1);
}

/* Every entry of the cache truncated to `keep` bytes, or removed when
 * keep < 0; returns how many there were. */
static int cache_each(const test_cache *tc, long keep)
{
    DIR *d = opendir(tc->sub);
    struct dirent *e;
    int files = 0;
    while (d && (e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        char p[512];
        snprintf(p, sizeof p, "%s/%s", tc->sub, e->d_name);
        if (keep >= 0)
            CHECK(truncate(p, keep) == 0);
        else
            remove(p);
        files++;
    }
    if (d)
        closedir(d);
    return files;
}

static void cache_end(test_cache *tc)
{
    cache_each(tc, -1);
    rmdir(tc->sub);
    rmdir(tc->dir);
    if (tc->saved) {
        setenv("XDG_CACHE_HOME", tc->saved, 1);
        free(tc->saved);
    } else {
        unsetenv("XDG_CACHE_HOME");
    }
}

/* The measurement build (DFLASH_CUDA_STAMPS set: gemm.cu's phase stamps
 * compiled in) compiles cleanly and holds the records the backend reads
 * back at exit; without the variable they are not there. */
static void test_stamps_build(void)
{
    dflash_nvrtc_api nv;
    if (!nvrtc_open(&nv))
        return;
    dflash_status s;
    const dflash_cuda_src *src = dflash_cuda_src_find("gemm.cu");
    CHECK(src != NULL);
    for (int on = 0; src && on < 2; on++) {
        if (on)
            setenv("DFLASH_CUDA_STAMPS", "/nonexistent/stamps.bin", 1);
        CHECK(dflash_cuda_stamps_on() == on);
        void *bin = NULL;
        size_t n = 0;
        char *log = NULL;
        s = dflash_cuda_compile(&nv, src, "sm_90a", &bin, &n, &log);
        CHECKF(s == DFLASH_OK, "stamps %d: %s", on, dflash_last_error());
        if (s == DFLASH_OK) {
            CHECKF(log[0] == 0, "stamps %d: compiler log not clean:\n%s", on, log);
            CHECK(cubin_has_symbol(bin, n, "dflash_stamps") == on);
            CHECK(cubin_has_symbol(bin, n, "dflash_stamp_count") == on);
            CHECK(cubin_has_symbol(bin, n, "dflash_gemm_bf16_2"));
        }
        free(bin);
        free(log);
    }
    unsetenv("DFLASH_CUDA_STAMPS");
    dflash_nvrtc_api_unload(&nv);
}

/* The GEMM skip build (DFLASH_CUDA_GEMM_SKIP=1..7: parts of gemm.cu's
 * work taken away, for measurement) compiles cleanly into a different
 * CUBIN with the same kernels and is cached apart from the release build;
 * unset or 0 is no skip, any other value is reported (-1) and no skip. */
static void test_gemm_skip_build(void)
{
    static const struct {
        const char *v;
        int want;
    } cases[] = { { "7", 7 }, { "1", 1 }, { "0", 0 }, { "8", -1 }, { "-1", -1 }, { "2x", -1 }, { "", 0 } };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        setenv("DFLASH_CUDA_GEMM_SKIP", cases[i].v, 1);
        CHECKF(dflash_cuda_gemm_skip() == cases[i].want, "DFLASH_CUDA_GEMM_SKIP='%s': %d, expected %d", cases[i].v,
               dflash_cuda_gemm_skip(), cases[i].want);
    }
    unsetenv("DFLASH_CUDA_GEMM_SKIP");
    CHECK(dflash_cuda_gemm_skip() == 0);
    dflash_nvrtc_api nv;
    if (!nvrtc_open(&nv))
        return;
    const dflash_cuda_src *src = dflash_cuda_src_find("gemm.cu");
    CHECK(src != NULL);
    void *bin[2] = { NULL, NULL };
    size_t n[2] = { 0, 0 };
    for (int on = 0; src && on < 2; on++) {
        if (on)
            setenv("DFLASH_CUDA_GEMM_SKIP", "7", 1);
        char *log = NULL;
        const dflash_status s = dflash_cuda_compile(&nv, src, "sm_90a", &bin[on], &n[on], &log);
        CHECKF(s == DFLASH_OK, "skip %d: %s", on, dflash_last_error());
        if (s == DFLASH_OK) {
            CHECKF(log[0] == 0, "skip %d: compiler log not clean:\n%s", on, log);
            CHECK(cubin_has_symbol(bin[on], n[on], "dflash_gemm_bf16_1"));
            CHECK(cubin_has_symbol(bin[on], n[on], "dflash_gemm_group_fp8_8"));
        }
        free(log);
    }
    unsetenv("DFLASH_CUDA_GEMM_SKIP");
    CHECK(bin[0] && bin[1] && (n[0] != n[1] || memcmp(bin[0], bin[1], n[0]) != 0));
    free(bin[0]);
    free(bin[1]);

    /* cached apart: the same small source, with and without the skip,
     * leaves two entries in an empty cache */
    test_cache tc;
    cache_begin(&tc, "dflash_skip_cache");
    const dflash_cuda_src *small = dflash_cuda_src_find("argmax.cu");
    CHECK(small != NULL);
    for (int on = 0; small && on < 2; on++) {
        if (on)
            setenv("DFLASH_CUDA_GEMM_SKIP", "3", 1);
        void *b = NULL;
        size_t nb = 0;
        int announced = 0;
        CHECK_OK(dflash_cuda_cubin_get(&nv, small, "sm_90a", &announced, &b, &nb));
        CHECKF(announced == 1, "skip %d: not compiled (found in the cache)", on);
        free(b);
    }
    unsetenv("DFLASH_CUDA_GEMM_SKIP");
    CHECK(cache_each(&tc, -1) == 2);
    cache_end(&tc);
    dflash_nvrtc_api_unload(&nv);
}

static void test_compile_error_is_reported(void)
{
    dflash_nvrtc_api nv;
    if (!nvrtc_open(&nv))
        return;
    dflash_cuda_src bad = { "bad.cu", "extern \"C\" __global__ void k() { undeclared_thing(); }\n", 0 };
    void *bin = NULL;
    size_t n = 0;
    char *log = NULL;
    CHECK_FAILS(dflash_cuda_compile(&nv, &bad, "sm_90a", &bin, &n, &log), DFLASH_ERR_BACKEND, "undeclared_thing");
    CHECK(bin == NULL && log == NULL);
    dflash_nvrtc_api_unload(&nv);
}

static void test_cubin_cache(void)
{
    dflash_nvrtc_api nv;
    if (!nvrtc_open(&nv))
        return;
    test_cache tc;
    cache_begin(&tc, "dflash_cache_test");
    const dflash_cuda_src *src = dflash_cuda_src_find("argmax.cu");
    CHECK(src != NULL);
    void *a = NULL, *b = NULL, *c = NULL;
    size_t na = 0, nb = 0, nc = 0;
    int announced = 0;
    CHECK_OK(dflash_cuda_cubin_get(&nv, src, "sm_90a", &announced, &a, &na));
    CHECK(announced == 1); /* compiled: nothing cached yet */
    announced = 0;
    CHECK_OK(dflash_cuda_cubin_get(&nv, src, "sm_90a", &announced, &b, &nb));
    CHECK(announced == 0); /* read back from the cache */
    CHECK(na == nb && a && b && memcmp(a, b, na) == 0);
    /* Corrupt the entry: truncate it; the next get warns and recompiles. */
    CHECK(cache_each(&tc, 40) == 1);
    announced = 0;
    CHECK_OK(dflash_cuda_cubin_get(&nv, src, "sm_90a", &announced, &c, &nc));
    CHECK(announced == 1);
    CHECK(na == nc && c && memcmp(a, c, na) == 0);
    free(a);
    free(b);
    free(c);
    cache_end(&tc);
    dflash_nvrtc_api_unload(&nv);
}

/* Without a driver the message must say so; with a driver but no usable
 * device it must name the driver's error. Where a GPU is present (a device
 * node, or DFLASH_EXPECT_GPU=1 as tools/gpu-test.sh sets it), creation must
 * succeed: a failure there is not "no GPU" (the GPU checker covers the
 * rest). */
static void test_create_without_gpu(void)
{
    void *probe = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    const char *expect = getenv("DFLASH_EXPECT_GPU");
    const int gpu_present = access("/dev/nvidia0", F_OK) == 0 || (expect && !strcmp(expect, "1"));
    dflash_backend *be = (dflash_backend *)0x1;
    dflash_status s = dflash_backend_cuda_create(0, &be);
    if (gpu_present) {
        CHECKF(probe != NULL, "a GPU is present but libcuda.so.1 does not load: %s", dlerror());
        CHECKF(s == DFLASH_OK, "a GPU is present but the CUDA backend failed: %s", dflash_last_error());
        if (s == DFLASH_OK)
            dflash_backend_destroy(be);
        if (probe)
            dlclose(probe);
    } else if (!probe) {
        CHECK_FAILS(s, DFLASH_ERR_BACKEND, "no NVIDIA driver (libcuda.so.1 not found");
        CHECK(be == NULL);
    } else {
        dlclose(probe);
        if (s == DFLASH_OK) {
            CHECK(be != NULL && strcmp(be->ops->name, "cuda") == 0);
            dflash_backend_destroy(be);
        } else {
            CHECKF(s == DFLASH_ERR_BACKEND, "got %s: %s", dflash_status_name(s), dflash_last_error());
            CHECKF(strlen(dflash_last_error()) > 10, "message too short: \"%s\"", dflash_last_error());
            CHECK(be == NULL);
        }
    }
    printf("# cuda create: %s%s\n", s == DFLASH_OK ? "ok" : "failed as expected: ",
           s == DFLASH_OK ? "" : dflash_last_error());
}

int main(void)
{
    RUN(test_embedded_matches_files);
    RUN(test_arch_names);
    RUN(test_compile_all_for_sm90a);
    RUN(test_stamps_build);
    RUN(test_gemm_skip_build);
    RUN(test_compile_error_is_reported);
    RUN(test_cubin_cache);
    RUN(test_create_without_gpu);
    TEST_END();
}
