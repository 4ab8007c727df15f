/* commands.h: the `dflash` subcommands. Each returns a process exit code
 * (0 ok, 1 failure, 2 usage error) and prints its own --help. */
#ifndef DFLASH_CLI_COMMANDS_H
#define DFLASH_CLI_COMMANDS_H

int dflash_cmd_generate(int argc, char **argv);
int dflash_cmd_info(int argc, char **argv);
int dflash_cmd_chat(int argc, char **argv);
int dflash_cmd_tokenize(int argc, char **argv);
int dflash_cmd_detokenize(int argc, char **argv);
int dflash_cmd_bench(int argc, char **argv);
int dflash_cmd_serve(int argc, char **argv);

#endif
