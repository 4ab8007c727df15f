/* width.h: the cost-aware block width. Each speculative step may draft any
 * number of tokens k in 0..B-1 (k = 0 is plain decoding). Drafting more
 * costs more (a propose of k drafts, a verify of k + 1 rows) and gains
 * less per extra draft (draft i counts only if drafts 1..i were all
 * accepted). This model learns both as the loop runs and picks, before
 * each step, the k with the most expected committed tokens per second:
 *
 *   E[tokens | k] = 1 + sum_{i=1..k} prod_{j=1..i} alpha_j
 *   cost(k)       = verify(k + 1 rows) + propose(k)   (no propose for k = 0)
 *
 * alpha_j: the acceptance of draft j given drafts 1..j-1 were accepted,
 * counted over the steps that reached j, with counts that decay so the
 * estimate follows the text (a Beta(1, 1) prior), taken optimistically:
 * one standard deviation of its posterior above the estimate, so widths
 * whose deep positions were rarely reached get tried until the counts say
 * otherwise (acceptance comes in stretches, and deep drafts of an
 * accepted stretch are accepted more often than the first draft is); a
 * position that could not be reached (the draft before it is always
 * rejected) takes the rate of the one before it. verify and propose
 * times: decayed least-squares lines in the row count, fed by the loop's
 * own clock (handing the committed rows to the drafter is in them, with
 * the propose: after a step that drafted nothing they wait for the next
 * drafting step, which hands them over). The first four steps decode plainly
 * while the machine warms up and their times are dropped; the next three
 * try two drafts, one and none so both lines have points; later, a step
 * now and then tries a width next to the chosen one (or plain decoding,
 * when its rate comes close), or while plain decoding wins the widest
 * block that costs at most three plain steps, so no estimate goes stale.
 *
 * The width never changes what is generated: greedy output is the
 * target's argmax sequence and sampled output depends only on the seed
 * and the position (sampler.h) for any k. Timing noise can change the
 * widths chosen, never the tokens. */
#ifndef DFLASH_SPEC_WIDTH_H
#define DFLASH_SPEC_WIDTH_H

#define DFLASH_WIDTH_MAX 64

/* A decayed least-squares line t = a + b * x. */
typedef struct dflash_width_line {
    double w, sx, sy, sxx, sxy;
} dflash_width_line;

typedef struct dflash_width {
    int max_drafts;                        /* B - 1 */
    double reached[DFLASH_WIDTH_MAX];      /* [j-1]: decayed count of steps that drafted j with 1..j-1 accepted */
    double accepted[DFLASH_WIDTH_MAX];     /* [j-1]: ... and accepted j */
    dflash_width_line verify, propose;     /* ms against rows (k + 1) / drafts (k) */
    long steps;
} dflash_width;

void dflash_width_init(dflash_width *m, int max_drafts);
/* Drafts for the next step: at most `limit` (tokens left to generate). */
int dflash_width_choose(dflash_width *m, int limit);
/* What a step did: k drafts, a of them accepted, and its times (ms). */
void dflash_width_observe(dflash_width *m, int k, int a, double verify_ms, double propose_ms);
/* What a step of n sequences stepped together did: sequence i drafted k[i]
 * (the chosen width, or fewer near its budget) and had a[i] accepted; the
 * step chose `width` and took verify_ms and propose_ms for all of them.
 * The acceptance counts take every sequence; the time lines take one
 * point, the step's time per sequence at the chosen width, so the rate
 * compared is tokens per second per sequence at this batch size. */
void dflash_width_observe_many(dflash_width *m, const int *k, const int *a, int n, int width, double verify_ms,
                               double propose_ms);

/* The estimates the choice weighs (for tests): E[tokens | k] as above,
 * and cost(k) in ms. */
double dflash_width_expected_tokens(const dflash_width *m, int k);
double dflash_width_cost_ms(const dflash_width *m, int k);

#endif
