/* width.c: the cost-aware block width (the model is described in width.h). */
#include "spec/width.h"

#include <math.h>
#include <string.h>

/* Per-step decay of the acceptance counts and of the time lines: about the
 * last 30 steps count. */
#define ACCEPT_DECAY 0.97
#define TIME_DECAY 0.95
/* Every this many steps, one tries another width than the chosen one;
 * less often while plain decoding wins (each try costs a propose). */
#define EXPLORE_EVERY 8
#define EXPLORE_EVERY_PLAIN 32
/* While drafting, every other try below the chosen width is a plain step
 * instead, when plain decoding's estimated rate is within this fraction
 * of the chosen width's: close calls are where a stale plain cost can keep
 * the wrong width, and where a plain try costs little. */
#define PLAIN_TRY_WITHIN 0.7
/* The first steps decode plainly and their times are not kept: caches,
 * clocks and the thread pool are still warming up (on a CPU the first
 * plain steps take up to three times what they settle at), and times
 * taken then would make what was measured first look dear against what
 * came after. */
#define WARMUP_STEPS 4

void dflash_width_init(dflash_width *m, int max_drafts)
{
    memset(m, 0, sizeof *m);
    if (max_drafts > DFLASH_WIDTH_MAX - 1)
        max_drafts = DFLASH_WIDTH_MAX - 1;
    m->max_drafts = max_drafts < 0 ? 0 : max_drafts;
}

static void line_add(dflash_width_line *l, double x, double y)
{
    l->w = l->w * TIME_DECAY + 1.0;
    l->sx = l->sx * TIME_DECAY + x;
    l->sy = l->sy * TIME_DECAY + y;
    l->sxx = l->sxx * TIME_DECAY + x * x;
    l->sxy = l->sxy * TIME_DECAY + x * y;
}

/* The line at x. With points at one x only, time is taken as proportional
 * to x (the pessimistic reading); with none, -1. */
static double line_at(const dflash_width_line *l, double x)
{
    if (l->w <= 0)
        return -1.0;
    const double mx = l->sx / l->w, my = l->sy / l->w;
    const double var = l->sxx / l->w - mx * mx;
    double t;
    if (var < 1e-6 * (mx * mx + 1.0))
        t = mx > 0 ? my * x / mx : my;
    else {
        const double b = (l->sxy / l->w - mx * my) / var;
        t = my + b * (x - mx);
    }
    /* a line fitted to noisy times can dip below zero far from its points */
    const double floor = 0.05 * (my > 0 ? my : 0);
    return t > floor ? t : floor;
}

/* E[tokens | k] with each alpha_j (decayed counts, Beta(1, 1) prior)
 * raised by one standard deviation of its posterior: optimism where
 * little was seen, so a width that might
 * pay gets tried and measured (where counts are many the bonus vanishes).
 * Acceptance in real text comes in stretches: deep in an accepted run a
 * draft is accepted more often than the first one is, which a model that
 * lends the last reached rate to deeper positions never finds out from
 * the narrow widths it chose. A position not reached lately although
 * drafts before it were accepted (the block stopped short of it) takes
 * the optimistic prior; one that could not be reached (the draft before it
 * is always rejected) lends as before. The bonus cannot make a width win
 * whose cost outweighs even an optimistic gain, so a device where rows
 * are dear still decodes plain. */
double dflash_width_expected_tokens(const dflash_width *m, int k)
{
    double e = 1.0, run = 1.0, prev = 0.5;
    for (int j = 1; j <= k && j <= m->max_drafts; j++) {
        const double r = m->reached[j - 1];
        if (r >= 0.5 || j == 1 || m->accepted[j - 2] >= 0.5) {
            const double p = (m->accepted[j - 1] + 1.0) / (r + 2.0), up = p + sqrt(p * (1.0 - p) / (r + 2.0));
            prev = up < 1.0 ? up : 1.0;
        }
        run *= prev;
        e += run;
    }
    return e;
}

double dflash_width_cost_ms(const dflash_width *m, int k)
{
    double v = line_at(&m->verify, k + 1.0);
    double p = k > 0 ? line_at(&m->propose, (double)k) : 0.0;
    if (v < 0)
        v = 1.0; /* nothing measured yet: only ratios matter, and the first steps explore */
    if (p < 0)
        p = v * k / (k + 1.0);
    return v + p;
}

int dflash_width_choose(dflash_width *m, int limit)
{
    int hi = limit < m->max_drafts ? limit : m->max_drafts;
    if (hi <= 0)
        return 0;
    int k;
    /* After the warm-up, three steps place points on both lines, cheaply:
     * two drafts, one, none. Wider blocks are reached from there when the
     * lines and the acceptance say they pay. */
    if (m->steps < WARMUP_STEPS)
        k = 0;
    else if (m->steps == WARMUP_STEPS)
        k = hi < 2 ? hi : 2;
    else if (m->steps == WARMUP_STEPS + 1)
        k = 1;
    else if (m->steps == WARMUP_STEPS + 2)
        k = 0;
    else {
        double best = -1, plain_rate = 0;
        k = 0;
        for (int c = 0; c <= hi; c++) {
            double rate = dflash_width_expected_tokens(m, c) / dflash_width_cost_ms(m, c);
            if (c == 0)
                plain_rate = rate;
            if (rate > best) {
                best = rate;
                k = c;
            }
        }
        /* Now and then another width, so the acceptance of the next
         * position and the time lines stay current. While drafting: a
         * neighbour above, one below (or, when plain decoding comes
         * close, a plain step), above, below. The plain tries keep the
         * cost of a plain step measured where the choice depends on it;
         * without them it is only extrapolated from the widths drafted,
         * and times taken long ago (when everything ran slower) can keep
         * a width that no longer pays. While plain decoding wins, the try
         * is the widest block that costs at most three plain steps: where
         * rows are cheap a wide block may pay although a narrow one does
         * not (acceptance comes in stretches), and one-draft tries would
         * never show it; where rows are dear the bound keeps the try
         * small. */
        const int every = k == 0 ? EXPLORE_EVERY_PLAIN : EXPLORE_EVERY;
        if (m->steps % every == 0) {
            if (k == 0) {
                const double plain = dflash_width_cost_ms(m, 0);
                k = 1;
                for (int c = 2; c <= hi; c++)
                    if (dflash_width_cost_ms(m, c) <= 3.0 * plain)
                        k = c;
            } else {
                const int turn = (int)((m->steps / every) % 4);
                if (turn == 1 && plain_rate >= PLAIN_TRY_WITHIN * best)
                    k = 0;
                else
                    k = turn % 2 == 0 ? (k < hi ? k + 1 : k - 1) : k - 1;
            }
        }
    }
    if (k < 0)
        k = 0;
    if (k > hi)
        k = hi;
    return k;
}

void dflash_width_observe_many(dflash_width *m, const int *k, const int *a, int n, int width, double verify_ms,
                               double propose_ms)
{
    /* Old counts fade as new ones come; a step that drafted nothing brings
     * none and fades none (else a run of plain steps would wash the
     * estimates out to the prior). */
    int drafted = 0;
    for (int i = 0; i < n; i++)
        drafted |= k[i] > 0;
    if (drafted)
        for (int j = 0; j < m->max_drafts; j++) {
            m->reached[j] *= ACCEPT_DECAY;
            m->accepted[j] *= ACCEPT_DECAY;
        }
    for (int i = 0; i < n; i++)
        for (int j = 1; j <= k[i] && j <= m->max_drafts; j++) {
            if (j - 1 > a[i])
                break; /* draft j - 1 was rejected: j was not reached */
            m->reached[j - 1] += 1.0;
            m->accepted[j - 1] += j <= a[i];
        }
    const double per = n > 0 ? 1.0 / n : 1.0;
    if (m->steps >= WARMUP_STEPS) {
        line_add(&m->verify, width + 1.0, verify_ms * per);
        if (width > 0)
            line_add(&m->propose, (double)width, propose_ms * per);
    }
    m->steps++;
}

void dflash_width_observe(dflash_width *m, int k, int a, double verify_ms, double propose_ms)
{
    dflash_width_observe_many(m, &k, &a, 1, k, verify_ms, propose_ms);
}
