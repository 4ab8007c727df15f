/* test_slow_cli_limits.c: the dflash command against hostile input, as a
 * user runs it (through popen): standard input is read within a stated
 * limit, prompts and budgets are held to the model's context length, chat
 * reserves the block it uses and says the numbers it checks, write errors
 * and closed streams are reported with a non-zero exit, FIFOs where files
 * belong are refused without hanging, and integer options are decimal only.
 * Commands that could hang run under `timeout`. */
#include "harness.h"

#include <jansson.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static char g_bin[256];
static int g_asan; /* g_bin is a sanitizer build */
static char g_tmp[64] = "/tmp/dflash_cli_limits_XXXXXX";
static char g_cwd[1024];

#define M "models/qwen3-pystd"
#define D "models/qwen3-pystd-dflash"
/* 64 tokens as the first chat turn (message + template). */
#define MSG "def parse_header(line): split the line on colons and return a dict of the stripped keys and values " \
            "for every part"

/* Run `cmd` through the shell, stdout and stderr together into buf (the
 * rest of a long output is read and dropped, so the child never blocks).
 * Redirections inside `cmd` apply to the command itself. Returns the exit
 * status (timeout's 124 when a command hung). */
static int sh(const char *cmd, char *buf, size_t cap)
{
    static char full[32768];
    snprintf(full, sizeof full, "( %s ) 2>&1", cmd);
    FILE *p = popen(full, "r");
    if (!p)
        return -1;
    size_t n = 0;
    char sink[4096];
    for (;;) {
        size_t want = n + 1 < cap ? cap - 1 - n : sizeof sink;
        size_t got = fread(n + 1 < cap ? buf + n : sink, 1, want, p);
        if (got == 0)
            break;
        if (n + 1 < cap)
            n += got;
    }
    buf[n] = 0;
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* printf into a static command buffer. */
#define CMD(...) (snprintf(g_cmd, sizeof g_cmd, __VA_ARGS__), g_cmd)
static char g_cmd[16384];
static char g_out[65536];

/* The embedded tokenizer with the Qwen3 chat markup as added tokens, so
 * chat can run on the embedded model (what the model makes of them does
 * not matter here): its last four merges and the tokens they make give
 * their ids to the markup. Nothing merges those tokens further (merges
 * only use tokens made by earlier ones). */
static void write_chat_tokenizer(const char *path)
{
    static const char *markup[] = { "<|im_start|>", "<|im_end|>", "<think>", "</think>" };
    json_error_t err;
    json_t *root = json_load_file(M "/tokenizer.json", 0, &err);
    json_t *model = json_object_get(root, "model"), *vocab = json_object_get(model, "vocab");
    json_t *merges = json_object_get(model, "merges"), *added = json_object_get(root, "added_tokens");
    CHECK(json_is_array(added) && json_is_array(merges) && json_array_size(merges) > 4 && json_is_object(vocab));
    for (int i = 0; json_is_array(merges) && json_is_array(added) && i < 4; i++) {
        size_t last = json_array_size(merges) - 1;
        json_t *pair = json_array_get(merges, last);
        char spelling[256];
        snprintf(spelling, sizeof spelling, "%s%s", json_string_value(json_array_get(pair, 0)),
                 json_string_value(json_array_get(pair, 1)));
        json_int_t id = json_integer_value(json_object_get(vocab, spelling));
        CHECKF(id > 0 && json_object_del(vocab, spelling) == 0, "merge %s", spelling);
        json_array_remove(merges, last);
        json_array_append_new(added, json_pack("{s:I,s:s,s:b,s:b,s:b,s:b,s:b}", "id", id, "content", markup[i],
                                               "single_word", 0, "lstrip", 0, "rstrip", 0, "normalized", 0,
                                               "special", 1));
    }
    CHECK(root && json_dump_file(root, path, JSON_COMPACT) == 0);
    json_decref(root);
}

/* A copy of the embedded target's folder (links to its files, a tokenizer
 * that has the chat markup) under the temp dir, with config.json's
 * max_position_embeddings set to `ctx` and the file `fifo` (if any)
 * replaced by a FIFO. */
static void make_model(const char *name, int ctx, const char *fifo)
{
    static const char *files[] = { "model.safetensors", "tokenizer_config.json", "generation_config.json" };
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "mkdir -p %s/%s && sed 's/\"max_position_embeddings\": 2048/\"max_position_embeddings\": "
             "%d/' " M "/config.json > %s/%s/config.json", g_tmp, name, ctx, g_tmp, name);
    CHECK(system(cmd) == 0);
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        snprintf(cmd, sizeof cmd, "ln -sf %s/" M "/%s %s/%s/%s", g_cwd, files[i], g_tmp, name, files[i]);
        CHECK(system(cmd) == 0);
    }
    snprintf(cmd, sizeof cmd, "%s/%s/tokenizer.json", g_tmp, name);
    write_chat_tokenizer(cmd);
    if (fifo) {
        snprintf(cmd, sizeof cmd, "rm -f %s/%s/%s && mkfifo %s/%s/%s", g_tmp, name, fifo, g_tmp, name, fifo);
        CHECK(system(cmd) == 0);
    }
}

/* The embedded target with a chat tokenizer (made once). */
static const char *chat_model(void)
{
    static char path[128];
    if (!path[0]) {
        make_model("chat", 2048, NULL);
        snprintf(path, sizeof path, "%s/chat", g_tmp);
    }
    return path;
}

/* "1,2,...,n" */
static const char *ids_upto(int n)
{
    static char s[16384];
    s[0] = 0;
    for (int i = 1; i <= n; i++)
        snprintf(s + strlen(s), sizeof s - strlen(s), "%s%d", i > 1 ? "," : "", i);
    return s;
}

/* One byte past each stream limit: refused with the stream and the limit
 * named, after reading no more than that (the pipe is not drained). */
static void test_stdin_is_bounded(void)
{
    int rc = sh(CMD("head -c 67108865 /dev/zero | timeout 60 %s tokenize --tokenizer " M " -", g_bin), g_out,
                sizeof g_out);
    CHECKF(rc == 1 && strstr(g_out, "standard input: more than 67108864 bytes"), "rc %d: %.300s", rc, g_out);
    rc = sh(CMD("head -c 67108865 /dev/zero | timeout 60 %s generate -m " M " -p - -n 4", g_bin), g_out,
            sizeof g_out);
    CHECKF(rc == 1 && strstr(g_out, "standard input: more than 67108864 bytes (the limit for a prompt)"),
           "rc %d: %.300s", rc, g_out);
    rc = sh(CMD("head -c 1048577 /dev/zero | timeout 60 %s chat -m " M " -n 4", g_bin), g_out, sizeof g_out);
    CHECKF(rc == 1 && strstr(g_out, "standard input: more than 1048576 bytes (the limit for a chat message)"),
           "rc %d: %.300s", rc, g_out);
    /* within the limit, as before */
    rc = sh(CMD("printf 'import os' | %s tokenize --tokenizer " M " -", g_bin), g_out, sizeof g_out);
    CHECKF(rc == 0 && g_out[0] >= '0' && g_out[0] <= '9', "rc %d: %.300s", rc, g_out);
}

static void test_context_length_is_enforced(void)
{
    /* prompt + -n past max_position_embeddings (2048) */
    int rc = sh(CMD("%s generate -m " M " --prompt-ids %s -n 16", g_bin, ids_upto(2040)), g_out, sizeof g_out);
    CHECKF(rc == 1 && strstr(g_out, "(2040 tokens) + -n 16 = 2056 positions exceed the model's context length 2048") &&
           strstr(g_out, "--allow-long-context"), "rc %d: %.400s", rc, g_out);
    /* an absurd -n fails at once, allocating nothing near its KV size: at
     * most 4 GB of address space (the sanitizer build reserves terabytes
     * of shadow memory, so there its allocator refuses any one allocation
     * over 4 GB instead) */
    rc = sh(CMD("%s timeout 20 %s generate -m " M " --prompt-ids 1,2 -n 10000000",
                g_asan ? "ASAN_OPTIONS=$ASAN_OPTIONS:max_allocation_size_mb=4000:allocator_may_return_null=1"
                       : "ulimit -v 4000000;",
                g_bin), g_out, sizeof g_out);
    CHECKF(rc == 1 && strstr(g_out, "10000002 positions exceed the model's context length 2048"), "rc %d: %.400s",
           rc, g_out);
    /* a long text prompt is measured in tokens before any prefill */
    rc = sh(CMD("yes 'import os' | head -c 40000 | timeout 20 %s generate -m " M " -p - -n 8", g_bin), g_out,
            sizeof g_out);
    CHECKF(rc == 1 && strstr(g_out, "exceed the model's context length 2048"), "rc %d: %.400s", rc, g_out);
    /* --max-ctx cannot exceed it silently either */
    rc = sh(CMD("%s generate -m " M " --prompt-ids 1 -n 2 --max-ctx 4096", g_bin), g_out, sizeof g_out);
    CHECKF(rc == 1 && strstr(g_out, "--max-ctx 4096 exceeds the model's context length 2048"), "rc %d: %.400s", rc,
           g_out);
    rc = sh(CMD("%s generate -m " M " --prompt-ids 1,2,3 -n 10 --max-ctx 8", g_bin), g_out, sizeof g_out);
    CHECKF(rc == 1 && strstr(g_out, "13 positions exceed --max-ctx 8"), "rc %d: %.400s", rc, g_out);

    /* A model with a context of 32: refused by default, allowed with a
     * warning; chat's default limit shrinks to it. */
    make_model("ctx32", 32, NULL);
    rc = sh(CMD("%s generate -m %s/ctx32 --prompt-ids %s -n 8", g_bin, g_tmp, ids_upto(30)), g_out, sizeof g_out);
    CHECKF(rc == 1 && strstr(g_out, "38 positions exceed the model's context length 32"), "rc %d: %.400s", rc, g_out);
    rc = sh(CMD("%s generate -m %s/ctx32 --prompt-ids %s -n 8 --allow-long-context", g_bin, g_tmp, ids_upto(30)),
            g_out, sizeof g_out);
    CHECKF(rc == 0 && strstr(g_out, "warning: --allow-long-context: up to 38 positions"), "rc %d: %.400s", rc, g_out);
    rc = sh(CMD("echo '" MSG "' | %s chat -m %s/ctx32 -n 8 --quiet", g_bin, g_tmp), g_out, sizeof g_out);
    CHECKF(rc == 1 && strstr(g_out, "past the model's context length 32"), "rc %d: %.400s", rc, g_out);
    rc = sh(CMD("echo '" MSG "' | %s chat -m %s/ctx32 -n 8 --quiet --allow-long-context", g_bin, g_tmp), g_out,
            sizeof g_out);
    CHECKF(rc == 0 && strstr(g_out, "warning: --allow-long-context"), "rc %d: %.400s", rc, g_out);
    for (int k = 0; k < 2; k++) {
        rc = sh(CMD("%s %s --help", g_bin, k ? "chat" : "generate"), g_out, sizeof g_out);
        CHECKF(rc == 0 && strstr(g_out, "--allow-long-context"), "%s --help", k ? "chat" : "generate");
    }
}

/* Chat reserves the block in use (1 plain, the drafter's, --block-size),
 * not the largest block, and its message adds up to what it checks. */
static void test_chat_reserves_the_block_in_use(void)
{
    const char *modes[] = { "", "-d " D, "-d " D " --block-size 4", "--draft ngram" };
    for (size_t i = 0; i < sizeof modes / sizeof modes[0]; i++) {
        int rc = sh(CMD("echo '" MSG "' | %s chat -m %s %s -n 100 --max-ctx 200 --quiet", g_bin, chat_model(),
                        modes[i]), g_out, sizeof g_out);
        CHECKF(rc == 0, "mode '%s': rc %d: %.400s", modes[i], rc, g_out);
        /* this tokenizer has the chat markup: no warning about it */
        CHECKF(!strstr(g_out, "warning"), "mode '%s': %.400s", modes[i], g_out);
    }
    int rc = sh(CMD("echo '" MSG "' | %s chat -m %s -d " D " -n 100 --max-ctx 120 --quiet", g_bin, chat_model()),
                g_out, sizeof g_out);
    long long total = -1;
    int so_far = -1, msg = -1, n = -1, limit = -1;
    const char *p = strstr(g_out, "conversation to ");
    int got = p ? sscanf(p, "conversation to %lld positions (%d so far + %d for this message + -n %d), past "
                            "--max-ctx %d", &total, &so_far, &msg, &n, &limit) : 0;
    CHECKF(rc == 1 && got == 5, "rc %d: %.400s", rc, g_out);
    CHECKF(total == (long long)so_far + msg + n && total > limit && n == 100 && limit == 120, "%.400s", g_out);
    /* exactly at the limit fits, with or without a drafter */
    if (got == 5) {
        for (int k = 0; k < 2; k++) {
            rc = sh(CMD("echo '" MSG "' | %s chat -m %s %s -n 100 --max-ctx %lld --quiet", g_bin, chat_model(),
                        k ? "-d " D : "", total), g_out, sizeof g_out);
            CHECKF(rc == 0, "--max-ctx %lld%s: rc %d: %.400s", total, k ? " with a drafter" : "", rc, g_out);
        }
    }
}

static void expect_write_error(const char *cmd, const char *needle)
{
    int rc = sh(cmd, g_out, sizeof g_out);
    CHECKF(rc == 1 && strstr(g_out, needle), "%s: rc %d: %.400s", cmd, rc, g_out);
}

static void test_write_errors_are_reported(void)
{
    const char *full = "standard output: write error: No space left on device";
    const char *closed = "standard output: cannot be written: it is closed";
    expect_write_error(CMD("%s generate -m " M " --prompt-ids 1,2,3 -n 4 > /dev/full", g_bin), full);
    expect_write_error(CMD("%s generate -m " M " -p 'import os' -n 4 > /dev/full", g_bin), full);
    expect_write_error(CMD("%s generate -m " M " --prompt-ids 1,2,3 -n 4 --json > /dev/full", g_bin), full);
    expect_write_error(CMD("%s generate -m " M " -p 'import os' -n 4 >&-", g_bin), closed);
    expect_write_error(CMD("%s generate -m " M " --prompt-ids 1,2,3 -n 4 --json >&-", g_bin), closed);
    expect_write_error(CMD("%s generate -m " M " --prompt-ids 1,2,3 -n 4 --trace /dev/full", g_bin),
                       "--trace /dev/full: write error: No space left on device");
    expect_write_error(CMD("echo 'def f():' | %s chat -m %s -n 4 > /dev/full", g_bin, chat_model()), full);
    expect_write_error(CMD("%s tokenize --tokenizer " M " hello > /dev/full", g_bin), full);
    expect_write_error(CMD("%s detokenize --tokenizer " M " 1 2 > /dev/full", g_bin), full);
    expect_write_error(CMD("%s generate --help > /dev/full", g_bin), full);
    expect_write_error(CMD("%s info " M " > /dev/full", g_bin), full);
    expect_write_error(CMD("%s bench --preset tiny --reps 1 --ctx 8 > /dev/full", g_bin), full);
    /* A closed stdout is not handed to the trace file: stdout's ids never
     * land in it. */
    char trace[300];
    snprintf(trace, sizeof trace, "%s/trace.jsonl", g_tmp);
    expect_write_error(CMD("%s generate -m " M " --prompt-ids 1,2,3 -n 4 --trace %s >&-", g_bin, trace), closed);
    FILE *f = fopen(trace, "r");
    char line[4096];
    int lines = 0, json = 0;
    while (f && fgets(line, sizeof line, f)) {
        lines++;
        json += line[0] == '{';
    }
    if (f)
        fclose(f);
    CHECKF(lines > 0 && json == lines, "%d trace lines, %d of them JSON", lines, json);
}

static void expect_fifo_refused(const char *cmd, const char *path)
{
    int rc = sh(cmd, g_out, sizeof g_out);
    CHECKF(rc == 1 && strstr(g_out, path) && strstr(g_out, "is a FIFO (named pipe), not a regular file"),
           "%s: rc %d (124: it hung): %.400s", cmd, rc, g_out);
}

static void test_fifos_are_refused(void)
{
    char path[512];
    snprintf(path, sizeof path, "%s/fifo", g_tmp);
    CHECK(mkfifo(path, 0600) == 0);
    expect_fifo_refused(CMD("timeout 10 %s tokenize --tokenizer %s hello", g_bin, path), path);
    expect_fifo_refused(CMD("timeout 10 %s generate -m " M " --tokenizer %s -p hello -n 2", g_bin, path), path);
    const char *names[] = { "tokenizer.json", "tokenizer_config.json", "generation_config.json", "config.json",
                            "model.safetensors" };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        char dir[64];
        snprintf(dir, sizeof dir, "fifo%zu", i);
        make_model(dir, 2048, names[i]);
        snprintf(path, sizeof path, "%s/%s/%s", g_tmp, dir, names[i]);
        expect_fifo_refused(CMD("timeout 10 %s generate -m %s/%s -p hello -n 2", g_bin, g_tmp, dir), path);
    }
    snprintf(path, sizeof path, "%s/fifo0", g_tmp);
    expect_fifo_refused(CMD("timeout 10 %s tokenize --tokenizer %s hello", g_bin, path), "tokenizer.json");
}

static void test_integer_options_are_strict_decimal(void)
{
    int rc = sh(CMD("%s generate -m " M " --prompt-ids 1 -n 2 --seed 010 --json", g_bin), g_out, sizeof g_out);
    CHECKF(rc == 0 && strstr(g_out, "\"seed\":10,"), "--seed 010: rc %d: %.300s", rc, g_out);
    const char *bad[][2] = {
        { "generate -m " M " --prompt-ids 1 -n 2 --seed ' -1'", "--seed" },
        { "generate -m " M " --prompt-ids 1 -n 2 --seed 0x10", "--seed" },
        { "generate -m " M " --prompt-ids 1 -n 2 --seed -1", "--seed" },
        { "generate -m " M " --prompt-ids 1 -n ' 2'", "-n" },
        { "generate -m " M " --prompt-ids 1 -n +2", "-n" },
        { "generate -m " M " --prompt-ids +1 -n 2", "--prompt-ids" },
        { "generate -m " M " --prompt-ids 1 -n 2 --max-ctx ' 100'", "--max-ctx" },
        { "generate -m " M " --prompt-ids 1 -n 2 --top-k 0x10", "--top-k" },
        { "generate -m " M " --prompt-ids 1 -n 2 --temp ' 1'", "--temp" },
        { "generate -m " M " -d " D " --prompt-ids 1 -n 2 --block-size +4", "--block-size expects auto or a" },
        { "generate -m " M " -d " D " --prompt-ids 1 -n 2 --block-size Auto", "--block-size expects auto or a" },
        { "chat -m " M " -n ' 5'", "-n" },
        { "chat -m " M " --ctx-cap -1", "--ctx-cap" },
        { "bench --preset tiny --reps ' 3'", "--reps" },
        { "bench --preset tiny --ctx 0x8", "--ctx" },
        { "generate -m " M " --prompt-ids 1 -n 2 --presence-penalty 2.5", "--presence-penalty" },
        { "generate -m " M " --prompt-ids 1 -n 2 --frequency-penalty ' 1'", "--frequency-penalty" },
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        rc = sh(CMD("%s %s < /dev/null", g_bin, bad[i][0]), g_out, sizeof g_out);
        CHECKF(rc == 2 && strstr(g_out, bad[i][1]) && strstr(g_out, "decimal"), "%s: rc %d: %.300s", bad[i][0], rc,
               g_out);
    }
    /* a served model name goes into JSON answers: UTF-8 text, not empty */
    rc = sh(CMD("%s serve -m " M " --served-model-name \"$(printf 'a\\377b')\" < /dev/null", g_bin), g_out,
            sizeof g_out);
    CHECKF(rc == 2 && strstr(g_out, "--served-model-name must be non-empty UTF-8 text"), "bad name: rc %d: %.300s", rc,
           g_out);
    rc = sh(CMD("%s detokenize --tokenizer " M " 1,+2", g_bin), g_out, sizeof g_out);
    CHECKF(rc == 2 && strstr(g_out, "decimal"), "detokenize 1,+2: rc %d: %.300s", rc, g_out);
    /* an id past the model's vocabulary is named with its position */
    rc = sh(CMD("%s generate -m " M " --prompt-ids 1,99999 -n 2", g_bin), g_out, sizeof g_out);
    CHECKF(rc == 1 && strstr(g_out, "--prompt-ids: token 99999 (position 1) is outside the model's vocabulary "
                                    "[0, 4096)"), "--prompt-ids 1,99999: rc %d: %.300s", rc, g_out);
}

static void test_bench_ctx_message(void)
{
    int rc = sh(CMD("%s bench --preset tiny --ctx -5", g_bin), g_out, sizeof g_out);
    CHECKF(rc == 2 && strstr(g_out, "--ctx expects comma-separated decimal context lengths") &&
           !strstr(g_out, "token ids"), "rc %d: %.300s", rc, g_out);
}

static void test_closed_stdin(void)
{
    int rc = sh(CMD("%s chat -m " M " -n 4 <&-", g_bin), g_out, sizeof g_out);
    CHECKF(rc == 1 && strstr(g_out, "standard input is closed"), "chat: rc %d: %.300s", rc, g_out);
    rc = sh(CMD("%s generate -m " M " -p - -n 4 <&-", g_bin), g_out, sizeof g_out);
    CHECKF(rc == 1 && strstr(g_out, "standard input: cannot be read: it is closed"), "generate: rc %d: %.300s", rc,
           g_out);
    rc = sh(CMD("%s tokenize --tokenizer " M " - <&-", g_bin), g_out, sizeof g_out);
    CHECKF(rc == 1 && strstr(g_out, "standard input: cannot be read: it is closed"), "tokenize: rc %d: %.300s", rc,
           g_out);
}

int main(void)
{
    /* DFLASH_BIN: another build of the CLI (tests/run.sh passes the
     * sanitizer build with DFLASH_BIN_ASAN=1) */
    const char *b = getenv("B"), *bin = getenv("DFLASH_BIN"), *asan = getenv("DFLASH_BIN_ASAN");
    if (bin)
        snprintf(g_bin, sizeof g_bin, "%s", bin);
    else
        snprintf(g_bin, sizeof g_bin, "%s/dflash", b ? b : "build");
    g_asan = asan && !strcmp(asan, "1");
    if (!mkdtemp(g_tmp) || !getcwd(g_cwd, sizeof g_cwd)) {
        fprintf(stderr, "cannot make a temp dir or read the working directory\n");
        return 1;
    }
    RUN(test_stdin_is_bounded);
    RUN(test_context_length_is_enforced);
    RUN(test_chat_reserves_the_block_in_use);
    RUN(test_write_errors_are_reported);
    RUN(test_fifos_are_refused);
    RUN(test_integer_options_are_strict_decimal);
    RUN(test_bench_ctx_message);
    RUN(test_closed_stdin);
    char rm[128];
    snprintf(rm, sizeof rm, "rm -rf %s", g_tmp);
    if (system(rm) != 0)
        fprintf(stderr, "could not remove %s\n", g_tmp);
    TEST_END();
}
