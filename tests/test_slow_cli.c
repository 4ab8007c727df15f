/* test_slow_cli.c: the dflash command as a user runs it (through popen):
 * --help tells the truth about the options, errors name what is wrong and
 * exit non-zero, text and id prompts agree, JSON is well formed, traces
 * have one line per step, chat keeps its conversation across turns,
 * generate --batch gives each line what the line's prompt gives alone and
 * names the line of a bad one, the public-API example (examples/simple.c)
 * prints what generate prints, bench prints its table. */
#include "harness.h"

#include <jansson.h>
#include <sys/wait.h>
#include <unistd.h>

static char g_bin[256];

/* Run a shell command; capture stdout (and stderr if merge) into buf. */
static int sh(const char *cmd, char *buf, size_t cap, int merge)
{
    char full[4096];
    snprintf(full, sizeof full, "%s%s", cmd, merge ? " 2>&1" : " 2>/dev/null");
    FILE *p = popen(full, "r");
    if (!p)
        return -1;
    size_t n = fread(buf, 1, cap - 1, p);
    buf[n] = 0;
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void test_help_lists_every_option(void)
{
    static char out[16384], cmd[512];
    const struct { const char *sub; const char *opts[32]; } cases[] = {
        { "generate", { "-m", "--draft", "--prompt ", "--prompt-ids", "--chat", "--system", "--think", "--n-new",
                        "--json", "--trace", "--batch", "--tokenizer", "--block-size", "--ctx-cap", "--drafter-quant",
                        "--max-ctx", "--ignore-eos", "--device", "--temp", "--top-k", "--top-p", "--min-p", "--rep-penalty",
                        "--frequency-penalty", "--presence-penalty", "--seed", NULL } },
        { "chat", { "-m", "--draft", "--system", "--think", "--n-new", "--quiet", "--block-size", "--temp", NULL } },
        { "serve", { "-m", "--draft", "--host", "--port", "--api-key", "--served-model-name", "--max-sessions",
                     "--max-queue", "--kv-pages", "--max-body-bytes", "--block-size", "--device", "--temp", "--seed",
                     "/v1/chat/completions", "/v1/completions", "/v1/models", "/v1/models/{id}", "/health", "/metrics",
                     "frequency_penalty", "presence_penalty", NULL } },
        { "tokenize", { "--tokenizer", "--json", "--special", NULL } },
        { "detokenize", { "--tokenizer", "--json", "--skip-special", NULL } },
        { "info", { "DIR", NULL } },
        { "bench", { "--preset", "seed-drafter", "qwen3-8b-drafter", "qwen3-8b-target", "llama31-8b-target",
                     "qwen3-30b-a3b-target", "qwen36-35b-a3b-target", "seed-pair", "tiny", "tiny-llama", "tiny-moe",
                     "tiny-q35", "--ctx", "--rows", "--sessions", "--reps",
                     "--device", "--json", "--profile", "--sample", "--penalties", NULL } },
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        snprintf(cmd, sizeof cmd, "%s %s --help", g_bin, cases[k].sub);
        CHECKF(sh(cmd, out, sizeof out, 0) == 0, "%s --help exit status", cases[k].sub);
        for (int i = 0; cases[k].opts[i]; i++)
            CHECKF(strstr(out, cases[k].opts[i]) != NULL, "%s --help lacks %s", cases[k].sub, cases[k].opts[i]);
    }
    snprintf(cmd, sizeof cmd, "%s --help", g_bin);
    CHECK(sh(cmd, out, sizeof out, 0) == 0 && strstr(out, "generate") && strstr(out, "chat") && strstr(out, "bench") &&
          strstr(out, "serve"));
}

static void test_errors_are_clear(void)
{
    static char out[8192], cmd[512];
    snprintf(cmd, sizeof cmd, "%s generate -m /nonexistent/model --prompt-ids 1,2", g_bin);
    CHECK(sh(cmd, out, sizeof out, 1) == 1);
    CHECKF(strstr(out, "/nonexistent/model") != NULL, "message: %s", out);
    snprintf(cmd, sizeof cmd, "%s generate -m models/qwen3-pystd --prompt-ids 1,x", g_bin);
    CHECK(sh(cmd, out, sizeof out, 1) == 2);
    CHECKF(strstr(out, "--prompt-ids") != NULL, "message: %s", out);
    snprintf(cmd, sizeof cmd, "%s generate -m models/qwen3-pystd --prompt-ids 1 --frobnicate", g_bin);
    CHECK(sh(cmd, out, sizeof out, 1) == 2 && strstr(out, "--frobnicate"));
    snprintf(cmd, sizeof cmd, "%s generate -m models/qwen3-pystd --prompt-ids 99999", g_bin);
    CHECK(sh(cmd, out, sizeof out, 1) == 1 && strstr(out, "99999"));
    snprintf(cmd, sizeof cmd, "%s generate -m models/qwen3-pystd -d models/qwen3-pystd --prompt-ids 1", g_bin);
    CHECK(sh(cmd, out, sizeof out, 1) == 1 && strstr(out, "not a DFlash drafter"));
}

static void test_text_and_ids_agree(void)
{
    static char a[65536], b[65536], cmd[1024];
    snprintf(cmd, sizeof cmd, "%s generate -m models/qwen3-pystd -d models/qwen3-pystd-dflash -p 'import os\n"
             "def main(' -n 48 --json", g_bin);
    CHECK(sh(cmd, a, sizeof a, 0) == 0);
    json_error_t err;
    json_t *ja = json_loads(a, 0, &err);
    CHECKF(ja != NULL, "generate --json output is not JSON: %s", a);
    if (!ja)
        return;
    json_t *pid = json_object_get(ja, "prompt_ids");
    CHECK(json_array_size(json_object_get(ja, "output_ids")) > 0);
    CHECK(json_is_string(json_object_get(ja, "text")));
    CHECK(json_is_number(json_object_get(json_object_get(ja, "stats"), "mean_accept")));
    /* the same ids through --prompt-ids, plainly: same output ids */
    char ids[2048] = "";
    for (size_t i = 0; i < json_array_size(pid); i++)
        snprintf(ids + strlen(ids), sizeof ids - strlen(ids), "%s%lld", i ? "," : "",
                 (long long)json_integer_value(json_array_get(pid, i)));
    snprintf(cmd, sizeof cmd, "%s generate -m models/qwen3-pystd --prompt-ids %s -n 48 --json", g_bin, ids);
    CHECK(sh(cmd, b, sizeof b, 0) == 0);
    json_t *jb = json_loads(b, 0, &err);
    CHECK(jb && json_equal(json_object_get(ja, "output_ids"), json_object_get(jb, "output_ids")));
    json_decref(ja);
    json_decref(jb);
}

static void test_trace_one_line_per_step(void)
{
    static char out[65536], cmd[1024];
    char path[] = "/tmp/dflash_cli_trace_XXXXXX";
    int fd = mkstemp(path);
    close(fd);
    snprintf(cmd, sizeof cmd, "%s generate -m models/qwen3-pystd --draft ngram --prompt-ids 1,2,3,1,2,3,1,2 -n 30 "
             "--json --trace %s", g_bin, path);
    CHECK(sh(cmd, out, sizeof out, 0) == 0);
    json_error_t err;
    json_t *j = json_loads(out, 0, &err);
    long steps = j ? (long)json_integer_value(json_object_get(json_object_get(j, "stats"), "steps")) : -1;
    json_t *ids = j ? json_object_get(j, "output_ids") : NULL;
    /* the steps' accepted drafts and next tokens, in order, are the output
     * after its first token (that one comes from the prompt) */
    long lines = 0, at = 1, n_out = (long)json_array_size(ids), mismatch = -1, drafted = 0;
    FILE *f = fopen(path, "r");
    char line[4096];
    while (f && fgets(line, sizeof line, f)) {
        json_t *l = json_loads(line, 0, &err);
        json_t *d = l ? json_object_get(l, "drafts") : NULL;
        const long a = l ? (long)json_integer_value(json_object_get(l, "accepted")) : -1;
        CHECK(l && json_object_get(l, "pos") && d && a >= 0 && a <= (long)json_array_size(d) &&
              json_object_get(l, "next"));
        drafted += (long)json_array_size(d);
        for (long i = 0; l && d && i <= a && at < n_out; i++, at++) {
            json_t *tok = i < a ? json_array_get(d, (size_t)i) : json_object_get(l, "next");
            if (mismatch < 0 && json_integer_value(tok) != json_integer_value(json_array_get(ids, (size_t)at)))
                mismatch = at;
        }
        json_decref(l);
        lines++;
    }
    if (f)
        fclose(f);
    unlink(path);
    json_decref(j);
    CHECKF(lines == steps && steps > 0, "%ld trace lines, %ld steps", lines, steps);
    CHECKF(at == n_out && mismatch < 0 && drafted > 0, "trace tokens cover %ld of %ld outputs, first mismatch %ld, "
           "%ld drafts", at, n_out, mismatch, drafted);
}

static void test_chat_two_turns(void)
{
    static char out[65536], cmd[1024];
    snprintf(cmd, sizeof cmd, "printf 'def add(a, b):\\nclass Foo:\\n' | %s chat -m models/qwen3-pystd "
             "-d models/qwen3-pystd-dflash -n 24", g_bin);
    CHECK(sh(cmd, out, sizeof out, 1) == 0);
    /* the demo tokenizer has no chat markup: chat still runs, with a warning
     * naming the missing token and the file */
    CHECKF(strstr(out, "dflash chat: warning: models/qwen3-pystd/tokenizer.json") && strstr(out, "<|im_start|>"),
           "chat output: %s", out);
    /* two statistics lines "[P prompt + G generated"; the second turn runs
     * only its own tokens, fewer than the conversation so far */
    int p[2] = { -1, -1 }, g[2] = { -1, -1 }, found = 0;
    for (const char *c = strchr(out, '['); c && found < 2; c = strchr(c + 1, '[')) /* '[' also occurs in code */
        if (sscanf(c, "[%d prompt + %d generated", &p[found], &g[found]) == 2)
            found++;
    CHECKF(found == 2, "chat output: %s", out);
    int p1 = p[0], g1 = g[0], p2 = p[1];
    CHECKF(p2 > 0 && p2 < p1 + g1, "second turn ran %d tokens; the conversation had %d", p2, p1 + g1);
}

/* Three lines (text, ids, seeded sampling) through --batch, each against
 * `generate --json` of the same prompt and options alone; then bad lines. */
static void test_batch(void)
{
    static char out[65536], one[16384], cmd[2048];
    const char *dir = "/tmp/dflash_cli_batch.jsonl";
    const char *lines[] = {
        "{\"prompt\": \"def add(a, b):\\n\", \"max_tokens\": 20}",
        "{\"prompt_ids\": [1, 2, 3, 4, 5], \"max_tokens\": 9}",
        "{\"prompt\": \"import os\\n\", \"max_tokens\": 24, \"temperature\": 0.8, \"top_k\": 50, \"seed\": 7}",
    };
    const char *alone[] = {
        "-p 'def add(a, b):\n' -n 20",
        "--prompt-ids 1,2,3,4,5 -n 9",
        "-p 'import os\n' -n 24 --temp 0.8 --top-k 50 --seed 7",
    };
    FILE *f = fopen(dir, "w");
    CHECK(f != NULL);
    if (!f)
        return;
    for (size_t i = 0; i < 3; i++)
        fprintf(f, "%s\n%s", lines[i], i == 0 ? "\n" : ""); /* a blank line is skipped */
    fclose(f);
    snprintf(cmd, sizeof cmd, "%s generate -m models/qwen3-pystd -d models/qwen3-pystd-dflash --batch %s", g_bin,
             dir);
    CHECK(sh(cmd, out, sizeof out, 0) == 0);
    char *line = out;
    for (int i = 0; i < 3; i++) {
        char *nl = strchr(line, '\n');
        CHECKF(nl != NULL, "batch output line %d missing: %s", i, out);
        if (!nl)
            break;
        *nl = 0;
        json_error_t e;
        json_t *jb = json_loads(line, 0, &e);
        snprintf(cmd, sizeof cmd, "%s generate -m models/qwen3-pystd -d models/qwen3-pystd-dflash --json %s", g_bin,
                 alone[i]);
        CHECK(sh(cmd, one, sizeof one, 0) == 0);
        json_t *ja = json_loads(one, 0, &e);
        CHECKF(jb && ja && json_equal(json_object_get(jb, "output_ids"), json_object_get(ja, "output_ids")) &&
                   json_equal(json_object_get(jb, "prompt_ids"), json_object_get(ja, "prompt_ids")),
               "line %d: batch %s\nalone %s", i, line, one);
        CHECK(jb && json_integer_value(json_object_get(jb, "line")) == (i == 0 ? 1 : i + 2));
        json_decref(jb);
        json_decref(ja);
        line = nl + 1;
    }
    /* bad lines are named by file and line */
    const struct { const char *line, *msg; } bad[] = {
        { "{\"prompt\": \"x\", \"n\": 3}", ":2: unknown field \"n\"" },
        { "{\"prompt\": \"x\", \"prompt_ids\": [1]}", ":2: give exactly one of \"prompt\" and \"prompt_ids\"" },
        { "{\"prompt\": \"x\", \"max_tokens\": 2.5}", ":2: \"max_tokens\" is 2.5; expected an integer" },
        { "{\"prompt\": \"x\", \"top_p\": \"0.9\"}", ":2: \"top_p\" must be a number, not a string" },
        { "[1, 2]", ":2: not a JSON object" },
        { "{\"prompt_ids\": [1, 999999]}", ":2: prompt_ids[1] = 999999 is outside the model's vocabulary [0, 4096)" },
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        f = fopen(dir, "w");
        CHECK(f != NULL);
        if (!f)
            return;
        fprintf(f, "%s\n%s\n", lines[1], bad[i].line);
        fclose(f);
        snprintf(cmd, sizeof cmd, "%s generate -m models/qwen3-pystd --batch %s", g_bin, dir);
        int rc = sh(cmd, out, sizeof out, 1);
        CHECKF(rc == 1 && strstr(out, dir) && strstr(out, bad[i].msg), "%s: rc %d: %s", bad[i].line, rc, out);
    }
    remove(dir);
}

/* examples/simple.c, built on include/dflash.h alone, continues a prompt
 * as `dflash generate` does (greedy: the same text). */
static void test_example(void)
{
    static char out[16384], gen[16384], cmd[1024];
    const char *b = getenv("B");
    snprintf(cmd, sizeof cmd, "%s/examples/simple models/qwen3-pystd models/qwen3-pystd-dflash 'import os\n'",
             b && *b ? b : "build");
    CHECK(sh(cmd, out, sizeof out, 0) == 0);
    snprintf(cmd, sizeof cmd, "%s generate -m models/qwen3-pystd -d models/qwen3-pystd-dflash -n 64 -p 'import os\n'",
             g_bin);
    CHECK(sh(cmd, gen, sizeof gen, 0) == 0);
    /* simple prints the prompt, the text and a statistics line */
    size_t n = strlen(gen);
    if (n > 0 && gen[n - 1] == '\n')
        gen[n - 1] = 0;
    CHECKF(!strncmp(out, "import os\n", 10) && strstr(out, gen) == out + 10 && strstr(out, " generated tokens in "),
           "simple: %s\ngenerate: %s", out, gen);
}

static void test_info(void)
{
    static char out[8192], cmd[512];
    snprintf(cmd, sizeof cmd, "%s info models/qwen3-pystd-dflash", g_bin);
    CHECK(sh(cmd, out, sizeof out, 0) == 0 && strstr(out, "DFlash drafter") && strstr(out, "taps [1, 3, 5]"));
}

/* The tiny preset: a bandwidth line, and one row per (op, sequences, ctx)
 * in order (contexts sorted, duplicates dropped; the drafter's propose
 * and the target's verify and decode each alone and for 2 sequences)
 * with positive times and floors. */
static void test_bench_tiny(void)
{
    static char out[16384], cmd[512];
    snprintf(cmd, sizeof cmd, "%s bench --preset tiny --reps 2 --ctx 32,8,32 --sessions 2", g_bin);
    CHECK(sh(cmd, out, sizeof out, 0) == 0);
    CHECKF(strstr(out, "bandwidth: ") && strstr(out, "GB/s"), "output: %s", out);
    const struct { const char *op; int seqs, rows, ctx; } want[] = {
        { "propose", 1, 8, 8 },  { "propose", 2, 16, 8 }, { "propose", 1, 8, 32 }, { "propose", 2, 16, 32 },
        { "verify", 1, 16, 8 },  { "decode", 1, 1, 8 },
        { "verify", 2, 32, 8 },  { "decode", 2, 2, 8 },   { "step", 1, 8, 8 },     { "verify", 1, 16, 32 },
        { "decode", 1, 1, 32 },  { "verify", 2, 32, 32 }, { "decode", 2, 2, 32 },  { "step", 1, 8, 32 },
    };
    const int n_want = (int)(sizeof want / sizeof want[0]);
    int n = 0;
    for (const char *line = out; line && *line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL) {
        char op[16];
        int seqs, rows, ctx;
        double med, min, mb, fl, pct;
        if (sscanf(line, "%15s %d %d %d %lf %lf %lf %lf %lf%%", op, &seqs, &rows, &ctx, &med, &min, &mb, &fl, &pct) !=
            9)
            continue;
        CHECKF(n < n_want && !strcmp(op, want[n].op) && seqs == want[n].seqs && rows == want[n].rows &&
                   ctx == want[n].ctx,
               "row %d: %s %d %d %d", n, op, seqs, rows, ctx);
        CHECKF(med > 0 && min > 0 && min <= med && mb > 0 && fl > 0 && pct > 0, "row %d: %s", n, line);
        n++;
    }
    CHECKF(n == n_want, "%d table rows, expected %d: %s", n, n_want, out);
    /* the Llama target (no q/k norm tensors, llama3 RoPE) loads and runs */
    snprintf(cmd, sizeof cmd, "%s bench --preset tiny-llama --reps 1 --ctx 8", g_bin);
    CHECK(sh(cmd, out, sizeof out, 0) == 0);
    CHECKF(strstr(out, "Llama target 4 layers") && strstr(out, "\nverify ") && strstr(out, "\ndecode "),
           "output: %s", out);
    /* a Qwen3-MoE target: more rows are routed to more experts, so the
     * verify's floor counts more bytes than the decode's */
    snprintf(cmd, sizeof cmd, "%s bench --preset tiny-moe --reps 1 --ctx 8 --json", g_bin);
    CHECK(sh(cmd, out, sizeof out, 0) == 0);
    json_t *j = json_loads(out, 0, NULL);
    json_t *rows = j ? json_object_get(j, "rows") : NULL;
    double mb[2] = { 0, 0 };
    for (size_t i = 0; i < json_array_size(rows); i++) {
        const char *op = json_string_value(json_object_get(json_array_get(rows, i), "op"));
        if (op)
            mb[strcmp(op, "verify") == 0] = json_number_value(json_object_get(json_array_get(rows, i), "bytes"));
    }
    CHECKF(mb[0] > 0 && mb[1] > mb[0], "tiny-moe: decode %g bytes, verify %g: %s", mb[0], mb[1], out);
    json_decref(j);
    /* a Qwen3.5-MoE hybrid target (checkpoint in its own layout, recurrent
     * state per sequence) loads and runs, for one and two sequences */
    snprintf(cmd, sizeof cmd, "%s bench --preset tiny-q35 --reps 1 --ctx 8 --sessions 2", g_bin);
    CHECK(sh(cmd, out, sizeof out, 0) == 0);
    CHECKF(strstr(out, "Qwen3.5-MoE hybrid target 4 layers") && strstr(out, "\nverify       1") &&
               strstr(out, "\ndecode       2"),
           "output: %s", out);
    /* --profile: a name that is no row is refused, naming it; on the CPU it
     * is said to be ignored */
    snprintf(cmd, sizeof cmd, "%s bench --preset tiny --reps 1 --ctx 8 --profile verify,prefill", g_bin);
    CHECK(sh(cmd, out, sizeof out, 1) == 2);
    CHECKF(strstr(out, "--profile") && strstr(out, "verify,prefill"), "output: %s", out);
    snprintf(cmd, sizeof cmd, "%s bench --preset tiny --reps 1 --ctx 8 --device cpu --profile verify,decode", g_bin);
    CHECK(sh(cmd, out, sizeof out, 1) == 0);
    CHECKF(strstr(out, "--profile verify,decode ignored") && strstr(out, "\nverify "), "output: %s", out);
}

int main(void)
{
    const char *b = getenv("B");
    snprintf(g_bin, sizeof g_bin, "%s/dflash", b ? b : "build");
    RUN(test_help_lists_every_option);
    RUN(test_errors_are_clear);
    RUN(test_text_and_ids_agree);
    RUN(test_trace_one_line_per_step);
    RUN(test_chat_two_turns);
    RUN(test_batch);
    RUN(test_example);
    RUN(test_info);
    RUN(test_bench_tiny);
    TEST_END();
}
