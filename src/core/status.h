/* status.h: internal error reporting. dflash_fail() records a formatted
 * message for dflash_last_error() and returns the code, so a failing path is
 * one line: `return dflash_fail(DFLASH_ERR_SHAPE, "%s: tensor %s ...", ...);`
 * DFLASH_TRY propagates a failure without touching the message. */
#ifndef DFLASH_CORE_STATUS_H
#define DFLASH_CORE_STATUS_H

#include "dflash.h"

#if defined(__GNUC__)
#define DFLASH_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define DFLASH_PRINTF(a, b)
#endif

dflash_status dflash_fail(dflash_status s, const char *fmt, ...) DFLASH_PRINTF(2, 3);
/* Prefix the current message with context ("loading X: " + old message). */
dflash_status dflash_fail_prefix(dflash_status s, const char *fmt, ...) DFLASH_PRINTF(2, 3);
void dflash_clear_error(void);

#define DFLASH_TRY(expr)                      \
    do {                                      \
        dflash_status dflash_try_s_ = (expr); \
        if (dflash_try_s_ != DFLASH_OK)       \
            return dflash_try_s_;             \
    } while (0)

#endif
