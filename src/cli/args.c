/* args.c: see args.h. */
#include "cli/args.h"

#include <errno.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

int cli_parse_int(const char *opt, const char *s, long lo, long hi, int *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) {
        fprintf(stderr, "dflash: %s expects an integer in [%ld, %ld], got '%s'\n", opt, lo, hi, s);
        return 0;
    }
    *out = (int)v;
    return 1;
}

int cli_parse_double(const char *opt, const char *s, double lo, double hi, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !(v >= lo && v <= hi)) {
        fprintf(stderr, "dflash: %s expects a number in [%g, %g], got '%s'\n", opt, lo, hi, s);
        return 0;
    }
    *out = v;
    return 1;
}

int cli_parse_ids(const char *opt, const char *s, int32_t **ids, int *n)
{
    size_t cap = strlen(s) / 2 + 1;
    int32_t *v = malloc(cap * sizeof *v);
    int k = 0;
    if (!v)
        return 0;
    const char *p = s;
    while (*p) {
        while (*p == ',' || *p == ' ' || *p == '\t' || *p == '\n')
            p++;
        if (!*p)
            break;
        char *end;
        errno = 0;
        long x = strtol(p, &end, 10);
        if (errno || end == p || x < 0 || x > INT32_MAX || (*end && *end != ',' && *end != ' ' && *end != '\n' && *end != '\t')) {
            fprintf(stderr, "dflash: %s expects comma-separated non-negative token ids, bad item at '%s'\n", opt, p);
            free(v);
            return 0;
        }
        v[k++] = (int32_t)x;
        p = end;
    }
    if (k == 0) {
        fprintf(stderr, "dflash: %s: no token ids given\n", opt);
        free(v);
        return 0;
    }
    *ids = v;
    *n = k;
    return 1;
}

void cli_print_ids(FILE *f, const int32_t *ids, int n)
{
    fputc('[', f);
    for (int i = 0; i < n; i++)
        fprintf(f, "%s%d", i ? "," : "", ids[i]);
    fputc(']', f);
}

const char *cli_value(int argc, char **argv, int *i)
{
    if (*i + 1 >= argc) {
        fprintf(stderr, "dflash: option %s needs a value\n", argv[*i]);
        return NULL;
    }
    return argv[++*i];
}

void cli_print_json_string(FILE *f, const char *s, size_t n)
{
    json_t *j = json_stringn(s, n);
    char *out = j ? json_dumps(j, JSON_ENCODE_ANY | JSON_COMPACT) : NULL;
    fputs(out ? out : "\"\"", f);
    free(out);
    json_decref(j);
}
