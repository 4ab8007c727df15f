/* log.c: see log.h. The level is read once, through the levers. */
#include "core/log.h"

#include <stdarg.h>
#include <stdio.h>

#include "core/levers.h"

void dflash_log(dflash_log_level level, const char *fmt, ...)
{
    if (level != DFLASH_LOG_WARN && (int)level > dflash_levers_get()->log_level)
        return;
    va_list ap;
    va_start(ap, fmt);
    fputs(level == DFLASH_LOG_WARN ? "dflash: warning: " : "dflash: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}
