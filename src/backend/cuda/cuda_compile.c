/* cuda_compile.c: NVRTC compilation of the embedded kernel sources and the
 * on-disk CUBIN cache (see cuda_compile.h). */
#include "backend/cuda/cuda_compile.h"

#include "backend/backend.h"
#include "core/file.h"
#include "core/log.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* gemm_wide.cu's gw_geom<FP8, MT>::SMEM: a ring of 4 stages of 64 k, each
 * 128 weight rows (bf16: 128 bytes a row, fp8: 64) and MT activation rows
 * split into hi/lo (256 bytes a row); the epilogue's [128][MT + 1] f32
 * totals fit in it. */
#define GW_SMEM(fp8, mt) (4 * (128 * ((fp8) ? 64 : 128) + (mt) * 256))

const dflash_cuda_kernel_info dflash_cuda_kernels[DFK_COUNT] = {
    [DFK_EMBED] = { "elementwise.cu", "dflash_embed" },
    [DFK_ADD] = { "elementwise.cu", "dflash_add" },
    [DFK_ADD_BIAS] = { "elementwise.cu", "dflash_add_bias" },
    [DFK_SWIGLU] = { "elementwise.cu", "dflash_swiglu" },
    [DFK_COPY_ROWS] = { "elementwise.cu", "dflash_copy_rows" },
    [DFK_COPY_IDS] = { "elementwise.cu", "dflash_copy_ids" },
    [DFK_GATHER_SUM] = { "elementwise.cu", "dflash_gather_sum" },
    [DFK_KV_WRITE] = { "elementwise.cu", "dflash_kv_write" },
    [DFK_ADD_RMSNORM] = { "norm.cu", "dflash_add_rmsnorm" },
    [DFK_GATHER_ADD_RMSNORM] = { "norm.cu", "dflash_gather_add_rmsnorm" },
    [DFK_SPLIT_ADD_RMSNORM] = { "norm.cu", "dflash_split_add_rmsnorm" },
    [DFK_NORM_ROPE] = { "norm.cu", "dflash_norm_rope" },
    [DFK_NORM_GATE] = { "norm.cu", "dflash_norm_gate" },
    [DFK_QK_NORM_ROPE] = { "norm.cu", "dflash_qk_norm_rope" },
    [DFK_LINEAR_BF16_V] = { "linear.cu", "dflash_linear_bf16_v" },
    [DFK_LINEAR_BF16_S] = { "linear.cu", "dflash_linear_bf16_s" },
    [DFK_LINEAR_F16_V] = { "linear.cu", "dflash_linear_f16_v" },
    [DFK_LINEAR_F16_S] = { "linear.cu", "dflash_linear_f16_s" },
    [DFK_LINEAR_F32_V] = { "linear.cu", "dflash_linear_f32_v" },
    [DFK_LINEAR_F32_S] = { "linear.cu", "dflash_linear_f32_s" },
    [DFK_LINEAR_FP8_V] = { "linear.cu", "dflash_linear_fp8_v" },
    [DFK_LINEAR_FP8_S] = { "linear.cu", "dflash_linear_fp8_s" },
    [DFK_GEMM_BF16_1] = { "gemm.cu", "dflash_gemm_bf16_1" },
    [DFK_GEMM_BF16_2] = { "gemm.cu", "dflash_gemm_bf16_2" },
    [DFK_GEMM_BF16_4] = { "gemm.cu", "dflash_gemm_bf16_4" },
    [DFK_GEMM_BF16_8] = { "gemm.cu", "dflash_gemm_bf16_8" },
    [DFK_GEMM_FP8_1] = { "gemm.cu", "dflash_gemm_fp8_1" },
    [DFK_GEMM_FP8_2] = { "gemm.cu", "dflash_gemm_fp8_2" },
    [DFK_GEMM_FP8_4] = { "gemm.cu", "dflash_gemm_fp8_4" },
    [DFK_GEMM_FP8_8] = { "gemm.cu", "dflash_gemm_fp8_8" },
    [DFK_GEMM_GROUP_BF16_1] = { "gemm.cu", "dflash_gemm_group_bf16_1" },
    [DFK_GEMM_GROUP_BF16_2] = { "gemm.cu", "dflash_gemm_group_bf16_2" },
    [DFK_GEMM_GROUP_BF16_4] = { "gemm.cu", "dflash_gemm_group_bf16_4" },
    [DFK_GEMM_GROUP_BF16_8] = { "gemm.cu", "dflash_gemm_group_bf16_8" },
    [DFK_GEMM_GROUP_FP8_1] = { "gemm.cu", "dflash_gemm_group_fp8_1" },
    [DFK_GEMM_GROUP_FP8_2] = { "gemm.cu", "dflash_gemm_group_fp8_2" },
    [DFK_GEMM_GROUP_FP8_4] = { "gemm.cu", "dflash_gemm_group_fp8_4" },
    [DFK_GEMM_GROUP_FP8_8] = { "gemm.cu", "dflash_gemm_group_fp8_8" },
    [DFK_GEMM_WIDE_BF16_32] = { "gemm_wide.cu", "dflash_gemm_wide_bf16_32", GW_SMEM(0, 32) },
    [DFK_GEMM_WIDE_BF16_64] = { "gemm_wide.cu", "dflash_gemm_wide_bf16_64", GW_SMEM(0, 64) },
    [DFK_GEMM_WIDE_BF16_128] = { "gemm_wide.cu", "dflash_gemm_wide_bf16_128", GW_SMEM(0, 128) },
    [DFK_GEMM_WIDE_FP8_32] = { "gemm_wide.cu", "dflash_gemm_wide_fp8_32", GW_SMEM(1, 32) },
    [DFK_GEMM_WIDE_FP8_64] = { "gemm_wide.cu", "dflash_gemm_wide_fp8_64", GW_SMEM(1, 64) },
    [DFK_GEMM_WIDE_FP8_128] = { "gemm_wide.cu", "dflash_gemm_wide_fp8_128", GW_SMEM(1, 128) },
    [DFK_GEMM_SPLIT_X] = { "gemm_wide.cu", "dflash_gemm_split_x" },
    [DFK_ATTENTION_F32] = { "attention.cu", "dflash_attention_f32" },
    [DFK_ATTENTION_BF16] = { "attention.cu", "dflash_attention_bf16" },
    [DFK_ATTENTION_TC_16] = { "attention_tc.cu", "dflash_attention_tc_16" },
    [DFK_ATTENTION_TC_32] = { "attention_tc.cu", "dflash_attention_tc_32" },
    [DFK_ATTENTION_TC_64] = { "attention_tc.cu", "dflash_attention_tc_64" },
    [DFK_ATTENTION_TC_128] = { "attention_tc.cu", "dflash_attention_tc_128" },
    [DFK_ATTENTION_TC_256] = { "attention_tc.cu", "dflash_attention_tc_256" },
    [DFK_ATTN_COMBINE] = { "attention_tc.cu", "dflash_attn_combine" },
    [DFK_ATTN_COMBINE_512] = { "attention_tc.cu", "dflash_attn_combine_512" },
    [DFK_ARGMAX] = { "argmax.cu", "dflash_argmax" },
    [DFK_ARGMAX_FINISH] = { "gemm.cu", "dflash_argmax_finish" },
    [DFK_CONV_SILU] = { "recurrent.cu", "dflash_conv_silu" },
    [DFK_DELTA_RULE] = { "recurrent.cu", "dflash_delta_rule" },
    [DFK_DELTA_RULE_FULL] = { "recurrent.cu", "dflash_delta_rule_full" },
    [DFK_SIGMOID_MUL] = { "recurrent.cu", "dflash_sigmoid_mul" },
    [DFK_MOE_ROUTE] = { "moe.cu", "dflash_moe_route" },
    [DFK_MOE_ROUTE_WIDE] = { "moe.cu", "dflash_moe_route_wide" },
    [DFK_SAMPLE_ROWS] = { "sample.cu", "dflash_sample_rows" },
    [DFK_PENALIZE_ROWS] = { "sample.cu", "dflash_penalize_rows" },
    [DFK_COUNT_TOKENS] = { "sample.cu", "dflash_count_tokens" },
};

/* -lineinfo costs nothing at run time and lets compute-sanitizer and
 * profilers name source lines. Default IEEE division/sqrt and denormals are
 * kept (no fast math): the ops must match the CPU reference. The layout
 * constants the kernels share with the C code come from backend.h. */
#define STR_(x) #x
#define STR(x) STR_(x)
static const char *const k_opts_fixed[] = { "-default-device", "-std=c++17", "-lineinfo",
                                            "-DDFLASH_KV_PAGE=" STR(DFLASH_KV_PAGE),
                                            "-DDFLASH_SEQ_INFO_LEN=" STR(DFLASH_SEQ_INFO_LEN),
                                            "-DDFLASH_REC_INFO_LEN=" STR(DFLASH_REC_INFO_LEN),
                                            "-DDFLASH_CONV_MAX_KERNEL=" STR(DFLASH_CONV_MAX_KERNEL),
                                            "-DDFLASH_REC_ROWS=" STR(DFLASH_REC_ROWS),
                                            "-DDFLASH_REC_CHUNK=" STR(DFLASH_REC_CHUNK),
                                            "-DDFLASH_REC_CHUNK_STATES=" STR(DFLASH_REC_CHUNK_STATES),
                                            "-DDFLASH_ROUTE_MAX_EXPERTS=" STR(DFLASH_ROUTE_MAX_EXPERTS),
                                            "-DDFLASH_SAMPLE_GEN_MAX=" STR(DFLASH_SAMPLE_GEN_MAX) };
#define N_OPTS_FIXED (sizeof k_opts_fixed / sizeof k_opts_fixed[0])

/* A measurement build: DFLASH_CUDA_STAMPS (a file the backend writes the
 * kernels' block stamps to at exit, see common.cuh) compiles them in. */
static const char k_opt_stamps[] = "-DDFLASH_STAMPS";
int dflash_cuda_stamps_on(void)
{
    const char *v = getenv("DFLASH_CUDA_STAMPS");
    return v && v[0];
}

/* A measurement build: DFLASH_CUDA_GEMM_SKIP=MASK compiles gemm.cu with
 * GM_SKIP=MASK (1 activations not loaded, 2 weights not loaded, 4 no chunk
 * loop): the time a forward takes without that work, its results wrong. */
int dflash_cuda_gemm_skip(void)
{
    const char *v = getenv("DFLASH_CUDA_GEMM_SKIP");
    if (!v || !v[0])
        return 0;
    char *end;
    const long m = strtol(v, &end, 10);
    return *end != 0 || m < 0 || m > 7 ? -1 : (int)m;
}

void dflash_cuda_arch_name(int major, int minor, char *buf, size_t len)
{
    snprintf(buf, len, "sm_%d%d%s", major, minor, major == 9 && minor == 0 ? "a" : "");
}

const dflash_cuda_src *dflash_cuda_src_find(const char *file)
{
    for (int i = 0; i < dflash_cuda_src_count; i++)
        if (strcmp(dflash_cuda_srcs[i].name, file) == 0)
            return &dflash_cuda_srcs[i];
    return NULL;
}

dflash_status dflash_cuda_compile(const dflash_nvrtc_api *nv, const dflash_cuda_src *src, const char *arch,
                                  void **cubin, size_t *size, char **log)
{
    *cubin = NULL;
    *size = 0;
    *log = NULL;
    /* Every header goes to every program; there are only a few. */
    const char *hdr_text[8], *hdr_name[8];
    int n_hdr = 0;
    for (int i = 0; i < dflash_cuda_src_count && n_hdr < 8; i++)
        if (dflash_cuda_srcs[i].is_header) {
            hdr_text[n_hdr] = dflash_cuda_srcs[i].text;
            hdr_name[n_hdr++] = dflash_cuda_srcs[i].name;
        }
    char arch_opt[64];
    snprintf(arch_opt, sizeof arch_opt, "--gpu-architecture=%s", arch);
    const int skip = dflash_cuda_gemm_skip();
    char skip_opt[32];
    snprintf(skip_opt, sizeof skip_opt, "-DGM_SKIP=%d", skip);
    const char *opts[N_OPTS_FIXED + 3];
    int n_opts = 0;
    for (size_t i = 0; i < N_OPTS_FIXED; i++)
        opts[n_opts++] = k_opts_fixed[i];
    opts[n_opts++] = arch_opt;
    if (dflash_cuda_stamps_on())
        opts[n_opts++] = k_opt_stamps;
    if (skip > 0)
        opts[n_opts++] = skip_opt;

    nvrtcProgram prog = NULL;
    DFLASH_TRY(DFLASH_NVRTC(nv, nvrtcCreateProgram(&prog, src->text, src->name, n_hdr, hdr_text, hdr_name)));
    nvrtcResult cr = nv->nvrtcCompileProgram(prog, n_opts, opts);
    size_t log_size = 0;
    dflash_status s = DFLASH_NVRTC(nv, nvrtcGetProgramLogSize(prog, &log_size));
    char *text = NULL;
    if (s == DFLASH_OK) {
        text = malloc(log_size + 1);
        if (!text)
            s = dflash_fail(DFLASH_ERR_OOM, "nvrtc: out of memory for the log of %s", src->name);
    }
    if (s == DFLASH_OK) {
        text[0] = 0;
        s = DFLASH_NVRTC(nv, nvrtcGetProgramLog(prog, text));
        text[log_size] = 0;
    }
    if (s == DFLASH_OK && cr != 0) {
        const char *why = nv->nvrtcGetErrorString ? nv->nvrtcGetErrorString(cr) : "?";
        s = dflash_fail(DFLASH_ERR_BACKEND, "nvrtc: compiling %s for %s failed (%s):\n%s", src->name, arch, why,
                        text);
    }
    size_t n = 0;
    void *bin = NULL;
    if (s == DFLASH_OK)
        s = DFLASH_NVRTC(nv, nvrtcGetCUBINSize(prog, &n));
    if (s == DFLASH_OK && !(bin = malloc(n ? n : 1)))
        s = dflash_fail(DFLASH_ERR_OOM, "nvrtc: out of memory for the CUBIN of %s", src->name);
    if (s == DFLASH_OK)
        s = DFLASH_NVRTC(nv, nvrtcGetCUBIN(prog, bin));
    nv->nvrtcDestroyProgram(&prog);
    if (s != DFLASH_OK) {
        free(bin);
        free(text);
        return s;
    }
    *cubin = bin;
    *size = n;
    *log = text;
    return DFLASH_OK;
}

/* FNV-1a, 64-bit: a cache key, not a defence against tampering. */
static uint64_t fnv1a(uint64_t h, const void *data, size_t n)
{
    const unsigned char *p = data;
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 0x100000001b3ull;
    }
    return h;
}
#define FNV_INIT 0xcbf29ce484222325ull

static uint64_t cache_key(const dflash_nvrtc_api *nv, const dflash_cuda_src *src, const char *arch)
{
    uint64_t h = FNV_INIT;
    for (int i = 0; i < dflash_cuda_src_count; i++)
        if (dflash_cuda_srcs[i].is_header)
            h = fnv1a(h, dflash_cuda_srcs[i].text, strlen(dflash_cuda_srcs[i].text) + 1);
    h = fnv1a(h, src->name, strlen(src->name) + 1);
    h = fnv1a(h, src->text, strlen(src->text) + 1);
    h = fnv1a(h, arch, strlen(arch) + 1);
    for (size_t i = 0; i < N_OPTS_FIXED; i++)
        h = fnv1a(h, k_opts_fixed[i], strlen(k_opts_fixed[i]) + 1);
    if (dflash_cuda_stamps_on())
        h = fnv1a(h, k_opt_stamps, sizeof k_opt_stamps);
    const int skip = dflash_cuda_gemm_skip();
    if (skip > 0)
        h = fnv1a(h, &skip, sizeof skip);
    int v[2] = { 0, 0 };
    if (nv->nvrtcVersion(&v[0], &v[1]) != 0)
        v[0] = v[1] = -1;
    return fnv1a(h, v, sizeof v);
}

/* The cache directory, created if needed; 0 if there is none to use. */
static int cache_dir(char *buf, size_t len)
{
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    char base[512];
    if (xdg && xdg[0])
        snprintf(base, sizeof base, "%s", xdg);
    else if (home && home[0])
        snprintf(base, sizeof base, "%s/.cache", home);
    else
        return 0;
    if (mkdir(base, 0755) != 0 && errno != EEXIST)
        return 0;
    if ((size_t)snprintf(buf, len, "%s/dflash", base) >= len)
        return 0;
    if (mkdir(buf, 0755) != 0 && errno != EEXIST)
        return 0;
    return 1;
}

/* Entry format: "DFLCUBIN", u64 size, u64 fnv1a(cubin), cubin. */
static const char k_magic[8] = { 'D', 'F', 'L', 'C', 'U', 'B', 'I', 'N' };

static int cache_read(const char *path, void **cubin, size_t *size)
{
    /* The reader refuses a FIFO or device in the entry's place instead of
     * blocking on it; anything wrong only means recompiling. */
    char *data = NULL;
    size_t len = 0;
    dflash_status s = dflash_read_file(path, (size_t)1 << 31, &data, &len);
    if (s == DFLASH_ERR_NOT_FOUND)
        return 0; /* absent: the normal first run */
    uint64_t n = 0, sum = 0;
    int ok = s == DFLASH_OK && len > 24 && memcmp(data, k_magic, 8) == 0;
    if (ok) {
        memcpy(&n, data + 8, sizeof n);
        memcpy(&sum, data + 16, sizeof sum);
        ok = n == len - 24 && fnv1a(FNV_INIT, data + 24, n) == sum;
    }
    if (!ok) {
        free(data);
        dflash_log(DFLASH_LOG_WARN, "ignoring unusable kernel cache entry %s (%s); recompiling", path,
                   s == DFLASH_OK ? "corrupt" : dflash_last_error());
        return 0;
    }
    memmove(data, data + 24, n);
    *cubin = data;
    *size = n;
    return 1;
}

static void cache_write(const char *path, const void *cubin, size_t size)
{
    char tmp[640];
    if ((size_t)snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid()) >= sizeof tmp)
        return;
    FILE *f = fopen(tmp, "wb");
    uint64_t n = size, sum = fnv1a(FNV_INIT, cubin, size);
    int ok = f && fwrite(k_magic, 1, 8, f) == 8 && fwrite(&n, sizeof n, 1, f) == 1 &&
             fwrite(&sum, sizeof sum, 1, f) == 1 && fwrite(cubin, 1, size, f) == size;
    if (f && fclose(f) != 0)
        ok = 0;
    /* rename: a concurrent reader sees the old entry or the whole new one. */
    if (ok && rename(tmp, path) != 0)
        ok = 0;
    if (!ok) {
        if (f)
            remove(tmp);
        dflash_log(DFLASH_LOG_WARN, "cannot write kernel cache %s (%s); compiling again next run", path,
                strerror(errno));
    }
}

dflash_status dflash_cuda_cubin_get(const dflash_nvrtc_api *nv, const dflash_cuda_src *src, const char *arch,
                                    int *announced, void **cubin, size_t *size)
{
    char dir[520], path[600];
    int have_dir = cache_dir(dir, sizeof dir);
    if (have_dir && (size_t)snprintf(path, sizeof path, "%s/%s-%s-%016llx.cubin", dir, src->name, arch,
                                     (unsigned long long)cache_key(nv, src, arch)) >= sizeof path)
        have_dir = 0;
    if (have_dir) {
        if (cache_read(path, cubin, size))
            return DFLASH_OK;
    }
    if (!*announced) {
        dflash_log(DFLASH_LOG_INFO, "compiling CUDA kernels for %s (first run only)...", arch);
        *announced = 1;
    }
    char *log = NULL;
    DFLASH_TRY(dflash_cuda_compile(nv, src, arch, cubin, size, &log));
    if (log[0])
        dflash_log(DFLASH_LOG_INFO, "nvrtc said about %s:\n%s", src->name, log);
    free(log);
    if (have_dir)
        cache_write(path, *cubin, *size);
    return DFLASH_OK;
}
