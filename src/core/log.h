/* log.h: the library's messages to the user (progress on long work,
 * warnings about ignored settings), on stderr, filtered by DFLASH_LOG
 * (0 quiet, 1 info: the default, 2 debug). Errors are not logged: they are
 * returned as dflash_status with a message (status.h). */
#ifndef DFLASH_CORE_LOG_H
#define DFLASH_CORE_LOG_H

#include "core/status.h"

typedef enum dflash_log_level {
    DFLASH_LOG_WARN = 0,  /* shown even when DFLASH_LOG=0 */
    DFLASH_LOG_INFO = 1,
    DFLASH_LOG_DEBUG = 2,
} dflash_log_level;

void dflash_log(dflash_log_level level, const char *fmt, ...) DFLASH_PRINTF(2, 3);

#endif
