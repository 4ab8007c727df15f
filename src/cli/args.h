/* args.h: small helpers shared by the subcommands: strict number parsing
 * and JSON-ish printing of id lists. */
#ifndef DFLASH_CLI_ARGS_H
#define DFLASH_CLI_ARGS_H

#include <stdint.h>
#include <stdio.h>

/* Parse a whole string as an int in [lo, hi]; prints an error naming the
 * option and returns 0 on failure. */
int cli_parse_int(const char *opt, const char *s, long lo, long hi, int *out);
int cli_parse_double(const char *opt, const char *s, double lo, double hi, double *out);
/* Parse "1,2,3" (commas and/or spaces) into a malloc'd array. */
int cli_parse_ids(const char *opt, const char *s, int32_t **ids, int *n);
/* Print "[1,2,3]" */
void cli_print_ids(FILE *f, const int32_t *ids, int n);
/* The value of option argv[*i] (advancing *i), or NULL with an error. */
const char *cli_value(int argc, char **argv, int *i);



/* Print s[0..n) as a JSON string literal (quoted, escaped). */
void cli_print_json_string(FILE *f, const char *s, size_t n);
#endif
