/* args.h: what the subcommands share about the command line and the
 * standard streams: the one strict number syntax (decimal only: no spaces,
 * no '+', no 0x or octal, a '-' only where negatives are allowed), lists of
 * integers, checked output (write and close errors name the stream),
 * closed standard streams, JSON-ish printing of id lists, the clock for
 * elapsed times. Parse
 * errors are printed as "dflash <command>: ..." and return 0. */
#ifndef DFLASH_CLI_ARGS_H
#define DFLASH_CLI_ARGS_H

#include <stdint.h>
#include <stdio.h>

#include "core/status.h"

/* The running subcommand, for messages ("generate"); set by main. */
void cli_set_command(const char *name);
const char *cli_command(void);

/* A standard stream closed at start (`<&-`, `>&-`) would be handed to the
 * next open() (a model file, the trace) and read or written by mistake.
 * This puts /dev/null opened the wrong way round in its place, so reads of
 * a closed stdin and writes to a closed stdout fail with EBADF and are
 * reported; cli_std_fd_closed() remembers which ones were closed. */
void cli_guard_std_fds(void);
int cli_std_fd_closed(int fd);

/* The one integer syntax: [-]digits (the '-' only when lo < 0) at s, in
 * [lo, hi]; *end: past the digits. Returns 0 otherwise; prints nothing. */
int cli_scan_int(const char *s, long lo, long hi, const char **end, long *out);
/* ',', ' ', '\t' or '\n': what separates the items of a list. */
int cli_is_list_sep(char c);
/* Parse a whole string as an int in [lo, hi]; prints an error naming the
 * option and returns 0 on failure. */
int cli_parse_int(const char *opt, const char *s, long lo, long hi, int *out);
/* As cli_parse_int, for an option that also takes a word (the caller
 * checks for it first): the message says "expects WORD or a decimal ...". */
int cli_parse_int_or(const char *opt, const char *s, const char *word, long lo, long hi, int *out);
/* Any unsigned 64-bit value, decimal. */
int cli_parse_u64(const char *opt, const char *s, uint64_t *out);
/* A decimal number (digits, '.', an exponent) in [lo, hi]. */
int cli_parse_double(const char *opt, const char *s, double lo, double hi, double *out);
/* "1,2,3" (commas and/or spaces) of integers in [lo, hi] into a malloc'd
 * array; `what` names them in the error ("token ids"). Empty is an error. */
int cli_parse_list(const char *opt, const char *s, long lo, long hi, const char *what, int32_t **vals, int *n);
/* cli_parse_list of token ids in [0, INT32_MAX]. */
int cli_parse_ids(const char *opt, const char *s, int32_t **ids, int *n);
/* Print "[1,2,3]" */
void cli_print_ids(FILE *f, const int32_t *ids, int n);
/* The value of option argv[*i] (advancing *i), or NULL with an error. */
const char *cli_value(int argc, char **argv, int *i);

/* Flush f and check its error flag: DFLASH_ERR_IO naming `label`
 * ("standard output: write error: No space left on device"). */
dflash_status cli_check_output(FILE *f, const char *label);
/* cli_check_output, then fclose (whose failure is a lost write too). */
dflash_status cli_close_output(FILE *f, const char *label);
/* The end of a command that wrote to stdout: close it; on failure print
 * "dflash <command>: standard output: ..." and return 1, else `rc`. */
int cli_finish_stdout(int rc);

/* Monotonic seconds (for elapsed times). */
double cli_now_s(void);

/* Print s[0..n) as a JSON string literal (quoted, escaped). */
void cli_print_json_string(FILE *f, const char *s, size_t n);
#endif
