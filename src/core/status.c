/* status.c: the per-thread last-error message behind dflash_last_error(). */
#include "core/status.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static _Thread_local char g_msg[1024];

const char *dflash_last_error(void) { return g_msg; }

void dflash_clear_error(void) { g_msg[0] = 0; }

dflash_status dflash_fail(dflash_status s, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_msg, sizeof g_msg, fmt, ap);
    va_end(ap);
    return s;
}

dflash_status dflash_fail_prefix(dflash_status s, const char *fmt, ...)
{
    char prefix[512], old[sizeof g_msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, g_msg, sizeof old);
    /* Truncation is acceptable: the message is for humans. */
    size_t n = strlen(prefix);
    if (n >= sizeof g_msg)
        n = sizeof g_msg - 1;
    memcpy(g_msg, prefix, n);
    size_t rest = strlen(old);
    if (rest > sizeof g_msg - 1 - n)
        rest = sizeof g_msg - 1 - n;
    memcpy(g_msg + n, old, rest);
    g_msg[n + rest] = 0;
    return s;
}

const char *dflash_status_name(dflash_status s)
{
    switch (s) {
    case DFLASH_OK: return "DFLASH_OK";
    case DFLASH_ERR_INVALID_ARG: return "DFLASH_ERR_INVALID_ARG";
    case DFLASH_ERR_IO: return "DFLASH_ERR_IO";
    case DFLASH_ERR_FORMAT: return "DFLASH_ERR_FORMAT";
    case DFLASH_ERR_UNSUPPORTED: return "DFLASH_ERR_UNSUPPORTED";
    case DFLASH_ERR_NOT_FOUND: return "DFLASH_ERR_NOT_FOUND";
    case DFLASH_ERR_SHAPE: return "DFLASH_ERR_SHAPE";
    case DFLASH_ERR_OOM: return "DFLASH_ERR_OOM";
    case DFLASH_ERR_KV_FULL: return "DFLASH_ERR_KV_FULL";
    case DFLASH_ERR_BACKEND: return "DFLASH_ERR_BACKEND";
    case DFLASH_ERR_NUMERIC: return "DFLASH_ERR_NUMERIC";
    }
    return "DFLASH_ERR_UNKNOWN";
}
