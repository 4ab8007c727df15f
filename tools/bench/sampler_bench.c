/* sampler_bench.c: host time of the sampler on one logits row (what a
 * sampled decoding step pays per verified position on the CPU, whatever
 * the backend: the filtered distribution, dflash_sampler_probs, then the
 * draw, dflash_sampler_sample_at), at a real vocabulary size, for the
 * settings users pick.
 *
 * Rows: "peaked", logits falling with the log of a token's rank (25 -
 * 1.5 ln(1 + rank), ranks shuffled over the vocabulary, plus a little
 * noise): the top token holds about two thirds of the mass at T 0.7 and
 * the tail is long, the shape of a trained model's rows; "flat", normal
 * logits of deviation 2, as random weights give, where top-p keeps most
 * of the vocabulary (the worst case).
 *
 * Usage: sampler_bench [--vocab V (151936)] [--reps R (41)]
 * Prints, per row kind and setting, the median and the minimum of R timed
 * calls (each after one untimed) in ms. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <time.h>

#include "spec/sampler.h"

static double now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* A normal deviate from the sampler's own portable RNG. */
static double normal(dflash_rng *r)
{
    const double u = 1.0 - dflash_rng_uniform(r), v = dflash_rng_uniform(r);
    return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v);
}

static void make_row(float *row, int V, int peaked, dflash_rng *r)
{
    if (!peaked) {
        for (int j = 0; j < V; j++)
            row[j] = (float)(2.0 * normal(r));
        return;
    }
    for (int j = 0; j < V; j++)
        row[j] = (float)(25.0 - 1.5 * log(1.0 + j) + 0.1 * normal(r));
    for (int j = V - 1; j > 0; j--) { /* shuffle the ranks over the ids */
        const int k = (int)(dflash_rng_next(r) % (uint64_t)(j + 1));
        const float t = row[j];
        row[j] = row[k];
        row[k] = t;
    }
}

typedef struct setting {
    const char *name;
    double temperature, top_p, min_p, rep_penalty;
    int top_k;
} setting;

int main(int argc, char **argv)
{
    int V = 151936, reps = 41;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--vocab") && i + 1 < argc)
            V = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            reps = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: %s [--vocab V] [--reps R]\n", argv[0]);
            return 2;
        }
    }
    if (V < 2 || reps < 1) {
        fprintf(stderr, "sampler_bench: --vocab must be >= 2 and --reps >= 1\n");
        return 2;
    }
    const setting settings[] = {
        { "T 1", 1.0, 1.0, 0.0, 1.0, 0 },
        { "T 0.7, top-p 0.9", 0.7, 0.9, 0.0, 1.0, 0 },
        { "T 0.6, top-k 20, top-p 0.95", 0.6, 0.95, 0.0, 1.0, 20 },
        { "T 0.7, min-p 0.05", 0.7, 1.0, 0.05, 1.0, 0 },
        { "T 0.8, top-k 50, penalty 1.1", 0.8, 1.0, 0.0, 1.1, 50 },
    };
    float *row = malloc((size_t)V * sizeof *row);
    double *ms = malloc((size_t)reps * sizeof *ms);
    int32_t seen[64];
    if (!row || !ms)
        return 1;
    printf("vocab %d, %d timed calls each (median, min ms per row: probs + draw)\n", V, reps);
    printf("%-7s %-32s %10s %10s %8s\n", "row", "setting", "median", "min", "kept");
    for (int peaked = 1; peaked >= 0; peaked--) {
        dflash_rng r;
        dflash_rng_seed(&r, 7);
        make_row(row, V, peaked, &r);
        for (int i = 0; i < 64; i++)
            seen[i] = (int32_t)(dflash_rng_next(&r) % (uint64_t)V);
        for (size_t k = 0; k < sizeof settings / sizeof *settings; k++) {
            const setting *st = &settings[k];
            dflash_sampler_opts o;
            dflash_sampler_default_opts(&o);
            o.temperature = st->temperature;
            o.top_p = st->top_p;
            o.top_k = st->top_k;
            o.min_p = st->min_p;
            o.rep_penalty = st->rep_penalty;
            o.seed = 1;
            dflash_sampler s;
            if (dflash_sampler_init(&s, V, &o) != DFLASH_OK) {
                fprintf(stderr, "sampler_bench: %s\n", dflash_last_error());
                return 1;
            }
            dflash_sampler_observe(&s, seen, 64);
            int kept = 0;
            for (int i = -1; i < reps; i++) {
                const double t0 = now_ms();
                if (dflash_sampler_probs(&s, row, s.probs) != DFLASH_OK) {
                    fprintf(stderr, "sampler_bench: %s\n", dflash_last_error());
                    return 1;
                }
                volatile int32_t tok = dflash_sampler_sample_at(&s, s.probs, i + 1);
                (void)tok;
                if (i >= 0)
                    ms[i] = now_ms() - t0;
            }
            for (int j = 0; j < V; j++)
                kept += s.probs[j] > 0;
            qsort(ms, (size_t)reps, sizeof *ms, cmp_double);
            printf("%-7s %-32s %10.3f %10.3f %8d\n", peaked ? "peaked" : "flat", st->name, ms[reps / 2], ms[0],
                   kept);
            dflash_sampler_free(&s);
        }
    }
    free(row);
    free(ms);
    return 0;
}
