/* step_log.h: a dflash_gen_opts.on_step callback that keeps what the loop
 * reports of each step (position, drafts, accepted count, next token), so
 * a test can hold every step against a reference's. */
#ifndef DFLASH_TEST_STEP_LOG_H
#define DFLASH_TEST_STEP_LOG_H

#include <string.h>

#include "spec/spec.h"

#define STEP_LOG_MAX 256

typedef struct step_rec {
    int32_t pos, drafts[DFLASH_MAX_BLOCK], next;
    int k, accepted;
} step_rec;

typedef struct step_log {
    step_rec steps[STEP_LOG_MAX];
    int n; /* steps reported; only the first STEP_LOG_MAX are kept */
} step_log;

static inline void step_log_add(void *user, int32_t pos, const int32_t *drafts, int k, int accepted, int32_t next)
{
    step_log *log = user;
    if (log->n < STEP_LOG_MAX && k >= 0 && k <= DFLASH_MAX_BLOCK) {
        step_rec *r = &log->steps[log->n];
        r->pos = pos;
        r->k = k;
        r->accepted = accepted;
        r->next = next;
        memcpy(r->drafts, drafts, (size_t)k * sizeof(int32_t));
    }
    log->n++;
}

/* Step i against a reference row (pos, accepted, drafts padded with -1 to
 * `max_drafts`): 1 when equal, drafts count included. */
static inline int step_log_matches(const step_log *log, int i, const int32_t *row, int max_drafts)
{
    if (i >= log->n || i >= STEP_LOG_MAX)
        return 0;
    const step_rec *r = &log->steps[i];
    int nd = 0;
    while (nd < max_drafts && row[2 + nd] >= 0)
        nd++;
    if (r->pos != row[0] || r->accepted != row[1] || r->k != nd)
        return 0;
    return memcmp(r->drafts, row + 2, (size_t)nd * sizeof(int32_t)) == 0;
}

#endif
