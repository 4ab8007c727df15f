/* main.c: `dflash <command> ...`: dispatch to the subcommands. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/args.h"
#include "cli/commands.h"

static const struct {
    const char *name;
    int (*fn)(int, char **);
    const char *help;
} k_cmds[] = {
    { "generate", dflash_cmd_generate, "generate tokens (plain or speculative)" },
    { "chat", dflash_cmd_chat, "interactive chat (Qwen3 or Llama 3 chat format), KV kept across turns" },
    { "info", dflash_cmd_info, "describe a checkpoint folder" },
    { "tokenize", dflash_cmd_tokenize, "encode text to token ids" },
    { "detokenize", dflash_cmd_detokenize, "decode token ids to text" },
    { "serve", dflash_cmd_serve, "OpenAI-compatible HTTP server, requests stepped together" },
    { "bench", dflash_cmd_bench, "time propose / verify / decode at real geometries against a bandwidth floor" },
};

static void usage(FILE *f)
{
    fprintf(f, "usage: dflash <command> [options]   (dflash <command> --help for details)\n\ncommands:\n");
    for (size_t i = 0; i < sizeof k_cmds / sizeof k_cmds[0]; i++)
        fprintf(f, "  %-12s %s\n", k_cmds[i].name, k_cmds[i].help);
}

int main(int argc, char **argv)
{
    /* OpenMP threads that spin between parallel regions steal the core the
     * main thread needs whenever the machine is busy (measured: 20x slower
     * decoding on a loaded 2-core machine). Sleep instead, unless the user
     * chose a policy. libgomp reads its environment when it is loaded,
     * before main, so the setting takes a re-exec of ourselves. */
    if (!getenv("OMP_WAIT_POLICY")) {
        setenv("OMP_WAIT_POLICY", "PASSIVE", 1);
        execv("/proc/self/exe", argv);
        /* If that fails we run on with the default policy. */
    }
    /* Before anything opens a file that could take a closed stream's place. */
    cli_guard_std_fds();
    /* A pipe or file is fully buffered anyway; a buffer larger than any help
     * text makes a failing write (a full disk) fail at the final flush,
     * where its errno is reported, not in the middle of a text. */
    static char out_buf[1 << 16];
    if (!isatty(STDOUT_FILENO))
        setvbuf(stdout, out_buf, _IOFBF, sizeof out_buf);
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : cli_finish_stdout(0);
    }
    for (size_t i = 0; i < sizeof k_cmds / sizeof k_cmds[0]; i++)
        if (!strcmp(argv[1], k_cmds[i].name)) {
            cli_set_command(k_cmds[i].name);
            return k_cmds[i].fn(argc - 1, argv + 1);
        }
    fprintf(stderr, "dflash: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
