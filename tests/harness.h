/* harness.h: the project's minimal test harness. Each tests/test_*.c is one
 * executable: it RUN()s its cases; a case fails if any CHECK in it failed.
 * It prints "RESULT <passed> <failed>" last, which tests/run.sh adds up into
 * the suite's closing "N passed, N failed" line. */
#ifndef DFLASH_TESTS_HARNESS_H
#define DFLASH_TESTS_HARNESS_H

#include <math.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

static int h_passed, h_failed, h_case_failed;
static const char *h_case;

#define CHECK(cond)                                                              \
    do {                                                                         \
        if (!(cond)) {                                                           \
            fprintf(stderr, "  FAIL %s (%s:%d): %s\n", h_case, __FILE__, __LINE__, #cond); \
            h_case_failed = 1;                                                   \
        }                                                                        \
    } while (0)

#define CHECKF(cond, ...)                                                        \
    do {                                                                         \
        if (!(cond)) {                                                           \
            fprintf(stderr, "  FAIL %s (%s:%d): %s: ", h_case, __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                        \
            fprintf(stderr, "\n");                                               \
            h_case_failed = 1;                                                   \
        }                                                                        \
    } while (0)

/* The status is OK; on failure print dflash_last_error(). */
#define CHECK_OK(expr)                                                           \
    do {                                                                         \
        dflash_status h_s_ = (expr);                                             \
        CHECKF(h_s_ == DFLASH_OK, "%s: %s", dflash_status_name(h_s_), dflash_last_error()); \
    } while (0)

/* The call fails with `code` and the message contains `needle`. */
#define CHECK_FAILS(expr, code, needle)                                          \
    do {                                                                         \
        dflash_status h_s_ = (expr);                                             \
        CHECKF(h_s_ == (code), "got %s, want %s (msg: %s)", dflash_status_name(h_s_), \
               dflash_status_name(code), dflash_last_error());                   \
        CHECKF(strstr(dflash_last_error(), (needle)) != NULL, "message \"%s\" lacks \"%s\"", \
               dflash_last_error(), (needle));                                   \
    } while (0)

#define RUN(fn)                                                                  \
    do {                                                                         \
        h_case = #fn;                                                            \
        h_case_failed = 0;                                                       \
        fn();                                                                    \
        if (h_case_failed) {                                                     \
            h_failed++;                                                          \
            fprintf(stderr, "not ok %s\n", #fn);                                 \
        } else {                                                                 \
            h_passed++;                                                          \
            printf("ok %s\n", #fn);                                              \
        }                                                                        \
        fflush(stdout);                                                          \
    } while (0)

#define TEST_END()                                                               \
    do {                                                                         \
        printf("RESULT %d %d\n", h_passed, h_failed);                            \
        return h_failed ? 1 : 0;                                                 \
    } while (0)

/* Directory of committed test data (tests/data unless DFLASH_TEST_DATA). */
static inline const char *test_data_dir(void)
{
    const char *d = getenv("DFLASH_TEST_DATA");
    return d ? d : "tests/data";
}

/* Write `content` to dir/name (a failure fails the case). */
static inline void test_write_file(const char *dir, const char *name, const char *content)
{
    char p[600];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "w");
    CHECKF(f != NULL, "cannot write %s", p);
    if (f) {
        fputs(content, f);
        fclose(f);
    }
}

static inline void test_remove_file(const char *dir, const char *name)
{
    char p[600];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    remove(p);
}

#endif
