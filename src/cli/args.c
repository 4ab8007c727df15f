/* args.c: see args.h. */
#include "cli/args.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static const char *g_cmd;
static int g_std_closed[3];

void cli_set_command(const char *name) { g_cmd = name; }

const char *cli_command(void) { return g_cmd; }

/* "dflash <command>: " (or "dflash: " before a command is known). */
static void err_prefix(void) { fprintf(stderr, "dflash%s%s: ", g_cmd ? " " : "", g_cmd ? g_cmd : ""); }

void cli_guard_std_fds(void)
{
    for (int fd = 0; fd < 3; fd++) {
        if (fcntl(fd, F_GETFD) >= 0 || errno != EBADF)
            continue;
        g_std_closed[fd] = 1;
        /* Lower descriptors are open by now, so open() returns fd itself. */
        int nfd = open("/dev/null", fd == 0 ? O_WRONLY : O_RDONLY);
        if (nfd >= 0 && nfd != fd) {
            dup2(nfd, fd);
            close(nfd);
        }
    }
}

int cli_std_fd_closed(int fd) { return fd >= 0 && fd < 3 && g_std_closed[fd]; }

/* The one integer syntax: [-]digits, the '-' only if allowed. *end: past
 * the digits. Returns 0 without digits or beyond 2^64 - 1. */
static int scan_decimal(const char *s, int allow_minus, const char **end, int *neg, uint64_t *mag)
{
    *neg = allow_minus && *s == '-';
    s += *neg;
    if (*s < '0' || *s > '9')
        return 0;
    uint64_t v = 0;
    for (; *s >= '0' && *s <= '9'; s++) {
        unsigned d = (unsigned)(*s - '0');
        if (v > (UINT64_MAX - d) / 10)
            return 0;
        v = v * 10 + d;
    }
    *end = s;
    *mag = v;
    return 1;
}

/* A scanned value as a long within [lo, hi]. */
static int in_range(int neg, uint64_t mag, long lo, long hi, long *out)
{
    if (!neg || mag == 0) {
        if (mag > (uint64_t)LONG_MAX || (long)mag > hi || (long)mag < lo)
            return 0;
        *out = (long)mag;
        return 1;
    }
    if (lo >= 0 || mag - 1 > (uint64_t)(-(lo + 1)))
        return 0;
    *out = -(long)(mag - 1) - 1;
    return *out <= hi;
}

int cli_scan_int(const char *s, long lo, long hi, const char **end, long *out)
{
    int neg;
    uint64_t mag;
    return scan_decimal(s, lo < 0, end, &neg, &mag) && in_range(neg, mag, lo, hi, out);
}

int cli_parse_int_or(const char *opt, const char *s, const char *word, long lo, long hi, int *out)
{
    const char *end;
    long v;
    if (!cli_scan_int(s, lo, hi, &end, &v) || *end) {
        err_prefix();
        fprintf(stderr, "%s expects %s%sa decimal integer in [%ld, %ld], got '%s'\n", opt, word ? word : "",
                word ? " or " : "", lo, hi, s);
        return 0;
    }
    *out = (int)v;
    return 1;
}

int cli_parse_int(const char *opt, const char *s, long lo, long hi, int *out)
{
    return cli_parse_int_or(opt, s, NULL, lo, hi, out);
}

int cli_parse_u64(const char *opt, const char *s, uint64_t *out)
{
    const char *end;
    int neg;
    if (!scan_decimal(s, 0, &end, &neg, out) || *end) {
        err_prefix();
        fprintf(stderr, "%s expects a decimal integer in [0, %llu], got '%s'\n", opt, (unsigned long long)UINT64_MAX,
                s);
        return 0;
    }
    return 1;
}

/* Digits, '.', an exponent; a sign only after the 'e', or leading where
 * negatives are allowed: no spaces, hex, inf or nan. */
static int decimal_number_syntax(const char *s, int allow_minus)
{
    if (allow_minus && *s == '-')
        s++;
    if (!((*s >= '0' && *s <= '9') || *s == '.'))
        return 0;
    for (const char *c = s; *c; c++)
        if (!strchr("0123456789.eE", *c) && !((*c == '+' || *c == '-') && (c[-1] == 'e' || c[-1] == 'E')))
            return 0;
    return 1;
}

int cli_parse_double(const char *opt, const char *s, double lo, double hi, double *out)
{
    double v = 0;
    int ok = decimal_number_syntax(s, lo < 0);
    if (ok) {
        char *end;
        errno = 0;
        v = strtod(s, &end);
        ok = !errno && end != s && !*end && v >= lo && v <= hi;
    }
    if (!ok) {
        err_prefix();
        fprintf(stderr, "%s expects a decimal number in [%g, %g], got '%s'\n", opt, lo, hi, s);
        return 0;
    }
    *out = v;
    return 1;
}

int cli_is_list_sep(char c) { return c == ',' || c == ' ' || c == '\t' || c == '\n'; }

int cli_parse_list(const char *opt, const char *s, long lo, long hi, const char *what, int32_t **vals, int *n)
{
    size_t cap = strlen(s) / 2 + 1;
    int32_t *v = malloc(cap * sizeof *v);
    int k = 0;
    if (!v) {
        err_prefix();
        fprintf(stderr, "%s: out of memory\n", opt);
        return 0;
    }
    const char *p = s;
    while (*p) {
        while (cli_is_list_sep(*p))
            p++;
        if (!*p)
            break;
        const char *end;
        long x;
        if (!cli_scan_int(p, lo, hi, &end, &x) || (*end && !cli_is_list_sep(*end))) {
            err_prefix();
            fprintf(stderr, "%s expects comma-separated decimal %s in [%ld, %ld], bad item at '%s'\n", opt, what,
                    lo, hi, p);
            free(v);
            return 0;
        }
        v[k++] = (int32_t)x;
        p = end;
    }
    if (k == 0) {
        err_prefix();
        fprintf(stderr, "%s: no %s given\n", opt, what);
        free(v);
        return 0;
    }
    *vals = v;
    *n = k;
    return 1;
}

int cli_parse_ids(const char *opt, const char *s, int32_t **ids, int *n)
{
    return cli_parse_list(opt, s, 0, INT32_MAX, "token ids", ids, n);
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
        err_prefix();
        fprintf(stderr, "option %s needs a value\n", argv[*i]);
        return NULL;
    }
    return argv[++*i];
}

static dflash_status write_failed(const char *label, int err)
{
    if (err == EBADF)
        return dflash_fail(DFLASH_ERR_IO, "%s: cannot be written: it is closed (or not open for writing)", label);
    return dflash_fail(DFLASH_ERR_IO, "%s: write error: %s", label, err ? strerror(err) : "an earlier write failed");
}

dflash_status cli_check_output(FILE *f, const char *label)
{
    errno = 0;
    if (fflush(f) == 0 && !ferror(f))
        return DFLASH_OK;
    return write_failed(label, errno);
}

dflash_status cli_close_output(FILE *f, const char *label)
{
    dflash_status s = cli_check_output(f, label);
    errno = 0;
    if (fclose(f) != 0 && s == DFLASH_OK)
        s = write_failed(label, errno);
    return s;
}

int cli_finish_stdout(int rc)
{
    if (cli_close_output(stdout, "standard output") == DFLASH_OK)
        return rc;
    err_prefix();
    fprintf(stderr, "%s\n", dflash_last_error());
    return rc ? rc : 1;
}

void cli_print_json_string(FILE *f, const char *s, size_t n)
{
    json_t *j = json_stringn(s, n);
    char *out = j ? json_dumps(j, JSON_ENCODE_ANY | JSON_COMPACT) : NULL;
    fputs(out ? out : "\"\"", f);
    free(out);
    json_decref(j);
}

double cli_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
