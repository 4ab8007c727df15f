/* test_sampler.c: the sampler (src/spec/sampler.c) on its own: the RNG's
 * published first values and determinism, every filter against
 * distributions computed by hand (and their order), inverse-CDF edges, and
 * the speculative accept/resample rule (point-mass and general q) producing
 * exactly p, while the test-only wrong rules do not. */
#include "harness.h"

#include <float.h>

#include "spec/sampler.h"

static int near(double a, double b) { return fabs(a - b) < 1e-12; }

/* probs against expected[] (already normalized by hand). */
static int same_probs(const double *p, const double *want, int n)
{
    for (int j = 0; j < n; j++)
        if (!near(p[j], want[j])) {
            fprintf(stderr, "  probs[%d] = %.15g, want %.15g\n", j, p[j], want[j]);
            return 0;
        }
    return 1;
}

/* Filtered distribution of `logits` under opts (seen: tokens in the sequence). */
static int probs_of(const dflash_sampler_opts *o, const float *logits, int n, const int32_t *seen, int n_seen,
                    double *out)
{
    dflash_sampler s;
    if (dflash_sampler_init(&s, n, o) != DFLASH_OK)
        return 0;
    dflash_sampler_observe(&s, seen, n_seen);
    dflash_status st = dflash_sampler_probs(&s, logits, out);
    dflash_sampler_free(&s);
    return st == DFLASH_OK;
}

static void sampling_opts(dflash_sampler_opts *o, double temp)
{
    dflash_sampler_default_opts(o);
    o->temperature = temp;
}

static void test_rng_known_values(void)
{
    /* xoshiro256** reference outputs for the state {1, 2, 3, 4} */
    dflash_rng r = { { 1, 2, 3, 4 } };
    CHECK(dflash_rng_next(&r) == 11520ull);
    CHECK(dflash_rng_next(&r) == 0ull);
    CHECK(dflash_rng_next(&r) == 1509978240ull);
    CHECK(dflash_rng_next(&r) == 1215971899390074240ull);
    /* seeding: the state is splitmix64's first four outputs from the seed
     * (splitmix64(0) starts 0xe220a8397b1dcdaf, its published first value) */
    dflash_rng_seed(&r, 0);
    CHECK(r.s[0] == 0xe220a8397b1dcdafull);
    CHECK(r.s[1] == 0x6e789e6aa1b965f4ull);
    CHECK(r.s[2] == 0x06c45d188009454full);
    CHECK(r.s[3] == 0xf88bb8a8724c81ecull);
    CHECK(dflash_rng_next(&r) == 0x99ec5f36cb75f2b4ull);
    CHECK(dflash_rng_next(&r) == 0xbf6e1f784956452aull);
    dflash_rng_seed(&r, 42);
    CHECK(dflash_rng_next(&r) == 0x15780b2e0c2ec716ull);
    CHECK(dflash_rng_next(&r) == 0x6104d9866d113a7eull);
    /* uniform = top 53 bits * 2^-53 */
    dflash_rng_seed(&r, 42);
    CHECK(dflash_rng_uniform(&r) == (double)(0x15780b2e0c2ec716ull >> 11) / 9007199254740992.0);
}

static void test_rng_determinism(void)
{
    dflash_rng a, b, c;
    dflash_rng_seed(&a, 7);
    dflash_rng_seed(&b, 7);
    dflash_rng_seed(&c, 8);
    int same_ab = 1, same_ac = 0;
    double lo = 1, hi = 0, sum = 0;
    for (int i = 0; i < 100000; i++) {
        double x = dflash_rng_uniform(&a), y = dflash_rng_uniform(&b), z = dflash_rng_uniform(&c);
        same_ab &= x == y;
        same_ac += x == z;
        lo = x < lo ? x : lo;
        hi = x > hi ? x : hi;
        sum += x;
    }
    CHECK(same_ab);
    CHECK(same_ac == 0);
    CHECK(lo >= 0 && hi < 1);
    /* mean of 1e5 uniforms: sd 0.00091; 6 sd */
    CHECKF(fabs(sum / 100000 - 0.5) < 0.0055, "mean %g", sum / 100000);
}

static void test_softmax_and_temperature(void)
{
    const float lg[4] = { 1, 2, 3, 0 };
    double p[4], want[4], z = 0;
    dflash_sampler_opts o;
    sampling_opts(&o, 1.0);
    for (int j = 0; j < 4; j++)
        z += exp(lg[j]);
    for (int j = 0; j < 4; j++)
        want[j] = exp(lg[j]) / z;
    CHECK(probs_of(&o, lg, 4, NULL, 0, p) && same_probs(p, want, 4));
    o.temperature = 2.0;
    z = 0;
    for (int j = 0; j < 4; j++)
        z += exp(lg[j] / 2.0);
    for (int j = 0; j < 4; j++)
        want[j] = exp(lg[j] / 2.0) / z;
    CHECK(probs_of(&o, lg, 4, NULL, 0, p) && same_probs(p, want, 4));
    /* -inf logits are impossible tokens, not errors */
    const float masked[3] = { 0, -INFINITY, 0 };
    const double half[3] = { 0.5, 0, 0.5 };
    CHECK(probs_of(&o, masked, 3, NULL, 0, p) && same_probs(p, half, 3));
}

static void test_top_k_keeps_ties(void)
{
    const float lg[5] = { 1, 3, 3, 2, 2 };
    double p[5];
    dflash_sampler_opts o;
    sampling_opts(&o, 1.0);
    o.top_k = 2; /* the 2nd largest is 3: both 3s */
    const double two[5] = { 0, 0.5, 0.5, 0, 0 };
    CHECK(probs_of(&o, lg, 5, NULL, 0, p) && same_probs(p, two, 5));
    o.top_k = 3; /* the 3rd largest is 2: ties with it stay, 4 tokens */
    double z = 2 * exp(3.0) + 2 * exp(2.0);
    const double four[5] = { 0, exp(3.0) / z, exp(3.0) / z, exp(2.0) / z, exp(2.0) / z };
    CHECK(probs_of(&o, lg, 5, NULL, 0, p) && same_probs(p, four, 5));
    o.top_k = 1;
    const float one_top[4] = { 0.5f, -1, 4, 3.9f };
    const double pm[4] = { 0, 0, 1, 0 };
    CHECK(probs_of(&o, one_top, 4, NULL, 0, p) && same_probs(p, pm, 4));
    o.top_k = 10; /* larger than the vocabulary: off */
    double all[4];
    z = 0;
    for (int j = 0; j < 4; j++)
        z += exp((double)one_top[j]);
    for (int j = 0; j < 4; j++)
        all[j] = exp((double)one_top[j]) / z;
    CHECK(probs_of(&o, one_top, 4, NULL, 0, p) && same_probs(p, all, 4));
}

/* logits whose softmax is exactly the given probabilities (up to rounding) */
static void logits_of(const double *pr, int n, float *lg)
{
    for (int j = 0; j < n; j++)
        lg[j] = (float)log(pr[j]);
}

static void renorm(const float *lg, const int *keep, int n, double *want)
{
    double z = 0;
    for (int j = 0; j < n; j++)
        z += keep[j] ? exp((double)lg[j]) : 0;
    for (int j = 0; j < n; j++)
        want[j] = keep[j] ? exp((double)lg[j]) / z : 0;
}

static void test_top_p(void)
{
    const double pr[4] = { 0.15, 0.5, 0.05, 0.3 };
    float lg[4];
    double p[4], want[4];
    logits_of(pr, 4, lg);
    dflash_sampler_opts o;
    sampling_opts(&o, 1.0);
    /* 1 - 0.75 = 0.25: ascending masses 0.05, 0.20 are <= 0.25 (dropped),
     * 0.50 is not: keep {0.5, 0.3} */
    o.top_p = 0.75;
    const int k1[4] = { 0, 1, 0, 1 };
    renorm(lg, k1, 4, want);
    CHECK(probs_of(&o, lg, 4, NULL, 0, p) && same_probs(p, want, 4));
    /* 1 - 0.9 = 0.1: only 0.05 goes */
    o.top_p = 0.9;
    const int k2[4] = { 1, 1, 0, 1 };
    renorm(lg, k2, 4, want);
    CHECK(probs_of(&o, lg, 4, NULL, 0, p) && same_probs(p, want, 4));
    /* a tiny top_p still keeps the most likely token */
    o.top_p = 1e-6;
    const double pm[4] = { 0, 1, 0, 0 };
    CHECK(probs_of(&o, lg, 4, NULL, 0, p) && same_probs(p, pm, 4));
}

static void test_min_p(void)
{
    const double pr[4] = { 0.5, 0.3, 0.15, 0.05 };
    float lg[4];
    double p[4], want[4];
    logits_of(pr, 4, lg);
    dflash_sampler_opts o;
    sampling_opts(&o, 1.0);
    o.min_p = 0.2; /* threshold 0.1: 0.05 goes */
    const int k1[4] = { 1, 1, 1, 0 };
    renorm(lg, k1, 4, want);
    CHECK(probs_of(&o, lg, 4, NULL, 0, p) && same_probs(p, want, 4));
    o.min_p = 0.5; /* threshold 0.25 */
    const int k2[4] = { 1, 1, 0, 0 };
    renorm(lg, k2, 4, want);
    CHECK(probs_of(&o, lg, 4, NULL, 0, p) && same_probs(p, want, 4));
    /* after temperature 2 (min-p comes after it, as in HF) the ratios are
     * square roots: 0.15/0.5 -> sqrt(0.3) = 0.548 >= 0.5, 0.05/0.5 ->
     * sqrt(0.1) = 0.316 < 0.5 */
    o.temperature = 2.0;
    double z = sqrt(0.5) + sqrt(0.3) + sqrt(0.15);
    const double t2[4] = { sqrt(0.5) / z, sqrt(0.3) / z, sqrt(0.15) / z, 0 };
    CHECK(probs_of(&o, lg, 4, NULL, 0, p));
    for (int j = 0; j < 4; j++)
        CHECKF(fabs(p[j] - t2[j]) < 1e-7, "p[%d] = %g, want %g", j, p[j], t2[j]);
}

static void test_repetition_penalty(void)
{
    const float lg[4] = { 2, -1, 0.5f, 1 };
    const int32_t seen[3] = { 0, 1, 0 }; /* duplicates count once */
    double p[4], want[4];
    dflash_sampler_opts o;
    sampling_opts(&o, 1.0);
    o.rep_penalty = 2.0;
    const double pen[4] = { 1.0, -2.0, 0.5, 1.0 }; /* 2 / 2, -1 * 2 */
    double z = 0;
    for (int j = 0; j < 4; j++)
        z += exp(pen[j]);
    for (int j = 0; j < 4; j++)
        want[j] = exp(pen[j]) / z;
    CHECK(probs_of(&o, lg, 4, seen, 3, p) && same_probs(p, want, 4));
    /* greedy + penalty: a point mass on the penalized argmax; the tie
     * between tokens 0 and 3 (both 1.0) goes to the lower index */
    sampling_opts(&o, 0.0);
    o.rep_penalty = 2.0;
    CHECK(!dflash_sampler_is_greedy(&o));
    const double pm[4] = { 1, 0, 0, 0 };
    CHECK(probs_of(&o, lg, 4, seen, 3, p) && same_probs(p, pm, 4));
    const int32_t seen0[1] = { 0 };
    o.rep_penalty = 4.0; /* 2 / 4 = 0.5 < 1: token 3 wins */
    const double pm3[4] = { 0, 0, 0, 1 };
    CHECK(probs_of(&o, lg, 4, seen0, 1, p) && same_probs(p, pm3, 4));
}

/* OpenAI's penalties over the generated tokens only: token 0 generated
 * twice, token 1 once, token 2 in the prompt alone. Frequency 0.5 and
 * presence 0.25 make the logits {2 - 1 - 0.25, 1.5 - 0.5 - 0.25, 1, 0};
 * with a repetition penalty of 2 as well (over prompt and output, first)
 * {1 - 1.25, 0.75 - 0.75, 0.5, 0}. Greedy under them is a point mass on
 * the penalized argmax. */
static void test_frequency_presence(void)
{
    const float lg[4] = { 2, 1.5f, 1, 0 };
    const int32_t prompt[1] = { 2 }, out[3] = { 0, 1, 0 };
    double p[4], want[4];
    dflash_sampler_opts o;
    sampling_opts(&o, 1.0);
    o.frequency_penalty = 0.5;
    o.presence_penalty = 0.25;
    CHECK(dflash_sampler_has_penalty(&o));
    const double x1[4] = { 0.75, 0.75, 1.0, 0.0 }, x2[4] = { -0.25, 0.0, 0.5, 0.0 };
    for (int rep = 0; rep <= 1; rep++) {
        o.rep_penalty = rep ? 2.0 : 1.0;
        const double *x = rep ? x2 : x1;
        double z = 0;
        for (int j = 0; j < 4; j++)
            z += exp(x[j]);
        for (int j = 0; j < 4; j++)
            want[j] = exp(x[j]) / z;
        dflash_sampler s;
        CHECK_OK(dflash_sampler_init(&s, 4, &o));
        dflash_sampler_observe(&s, prompt, 1);
        dflash_sampler_observe_output(&s, out, 3);
        CHECK_OK(dflash_sampler_probs(&s, lg, p));
        CHECKF(same_probs(p, want, 4), "repetition penalty %g", o.rep_penalty);
        /* a reset forgets the counts (the penalties stay on): the row is a
         * plain softmax again */
        dflash_sampler_reset(&s, 0);
        CHECK_OK(dflash_sampler_probs(&s, lg, p));
        z = exp(2.0) + exp(1.5) + exp(1.0) + 1.0;
        CHECK(near(p[0], exp(2.0) / z) && near(p[3], 1.0 / z));
        dflash_sampler_free(&s);
    }
    /* greedy: token 2 (1.0) beats tokens 0 and 1 (0.75 each) */
    sampling_opts(&o, 0.0);
    o.presence_penalty = 0.25;
    o.frequency_penalty = 0.5;
    CHECK(!dflash_sampler_is_greedy(&o));
    dflash_sampler s;
    CHECK_OK(dflash_sampler_init(&s, 4, &o));
    dflash_sampler_observe(&s, prompt, 1);
    dflash_sampler_observe_output(&s, out, 3);
    CHECK_OK(dflash_sampler_probs(&s, lg, p));
    const double pm2[4] = { 0, 0, 1, 0 };
    CHECK(same_probs(p, pm2, 4));
    dflash_sampler_free(&s);
    /* a finite logit stays finite under a penalty that would take it past
     * f32's range; -inf stays -inf; rounding to f32 after the double math */
    dflash_sampler_opts big;
    dflash_sampler_default_opts(&big);
    big.rep_penalty = 1e-6;
    CHECK(dflash_sampler_penalized(&big, 1e38f, 0) == FLT_MAX);
    CHECK(dflash_sampler_penalized(&big, -1e38f, 0) == (double)(float)((double)-1e38f * 1e-6));
    CHECK(dflash_sampler_penalized(&big, -INFINITY, 0) == -INFINITY);
    CHECK(dflash_sampler_penalized(&big, 3.0f, -1) == 3.0);
    big.rep_penalty = 3.0;
    CHECK(dflash_sampler_penalized(&big, 1.0f, 0) == (double)(float)(1.0 / 3.0));
    /* negative values favour what was generated: presence -1 lifts token 1,
     * generated once, from 1.5 to 2.5, above token 0's 2 */
    sampling_opts(&o, 0.0);
    o.presence_penalty = -1.0;
    CHECK_OK(dflash_sampler_init(&s, 4, &o));
    dflash_sampler_observe_output(&s, &out[1], 1);
    CHECK_OK(dflash_sampler_probs(&s, lg, p));
    const double pm1[4] = { 0, 1, 0, 0 };
    CHECK(same_probs(p, pm1, 4));
    dflash_sampler_free(&s);
}

/* HF order: temperature, top-k, top-p, min-p. Top-k first changes the mass
 * top-p sees: among {0.4, 0.3, 0.2, 0.1}, top-k 3 renormalizes to
 * {0.444, 0.333, 0.222}; top-p 0.75 (drop while the ascending mass <= 0.25)
 * then drops 0.222 and keeps {0.4, 0.3}. Top-p alone drops only 0.1 (0.1 +
 * 0.2 > 0.25) and keeps {0.4, 0.3, 0.2}. */
static void test_filter_order(void)
{
    const double pr[4] = { 0.4, 0.3, 0.2, 0.1 };
    float lg[4];
    double p[4], want[4];
    logits_of(pr, 4, lg);
    dflash_sampler_opts o;
    sampling_opts(&o, 1.0);
    o.top_k = 3;
    o.top_p = 0.75;
    const int k1[4] = { 1, 1, 0, 0 };
    renorm(lg, k1, 4, want);
    CHECK(probs_of(&o, lg, 4, NULL, 0, p) && same_probs(p, want, 4));
    o.top_k = 0;
    const int k2[4] = { 1, 1, 1, 0 };
    renorm(lg, k2, 4, want);
    CHECK(probs_of(&o, lg, 4, NULL, 0, p) && same_probs(p, want, 4));
}

static void test_bad_rows_and_opts(void)
{
    dflash_sampler_opts o;
    sampling_opts(&o, 1.0);
    dflash_sampler s;
    CHECK_OK(dflash_sampler_init(&s, 3, &o));
    double p[3];
    const float nan_row[3] = { 0, NAN, 1 }, inf_row[3] = { 0, INFINITY, 1 };
    const float dead[3] = { -INFINITY, -INFINITY, -INFINITY };
    CHECK_FAILS(dflash_sampler_probs(&s, nan_row, p), DFLASH_ERR_NUMERIC, "NaN");
    CHECK_FAILS(dflash_sampler_probs(&s, inf_row, p), DFLASH_ERR_NUMERIC, "+inf");
    CHECK_FAILS(dflash_sampler_probs(&s, dead, p), DFLASH_ERR_NUMERIC, "-inf");
    dflash_sampler_free(&s);
    o.top_p = 0;
    CHECK_FAILS(dflash_sampler_init(&s, 3, &o), DFLASH_ERR_INVALID_ARG, "top_p");
    sampling_opts(&o, -1);
    CHECK_FAILS(dflash_sampler_check_opts(&o), DFLASH_ERR_INVALID_ARG, "temperature");
    sampling_opts(&o, 1);
    o.min_p = 2;
    CHECK_FAILS(dflash_sampler_check_opts(&o), DFLASH_ERR_INVALID_ARG, "min_p");
    sampling_opts(&o, 1);
    o.rep_penalty = 0;
    CHECK_FAILS(dflash_sampler_check_opts(&o), DFLASH_ERR_INVALID_ARG, "penalty");
    sampling_opts(&o, 1);
    o.frequency_penalty = 2.5;
    CHECK_FAILS(dflash_sampler_check_opts(&o), DFLASH_ERR_INVALID_ARG, "frequency penalty 2.5");
    sampling_opts(&o, 1);
    o.presence_penalty = NAN;
    CHECK_FAILS(dflash_sampler_check_opts(&o), DFLASH_ERR_INVALID_ARG, "presence penalty");
    sampling_opts(&o, 1);
    o.top_k = -1;
    CHECK_FAILS(dflash_sampler_check_opts(&o), DFLASH_ERR_INVALID_ARG, "top_k");
    dflash_sampler_default_opts(&o);
    CHECK(dflash_sampler_is_greedy(&o));
}

static void test_cdf_edges(void)
{
    const double p[4] = { 0.25, 0, 0.5, 0.25 };
    CHECK(dflash_sample_cdf(p, 4, 0.0) == 0);
    CHECK(dflash_sample_cdf(p, 4, 0.2499) == 0);
    CHECK(dflash_sample_cdf(p, 4, 0.25) == 2); /* zero-mass token 1 never comes out */
    CHECK(dflash_sample_cdf(p, 4, 0.7499) == 2);
    CHECK(dflash_sample_cdf(p, 4, 0.75) == 3);
    CHECK(dflash_sample_cdf(p, 4, 1.0 - 0x1.0p-53) == 3);
    const double q[4] = { 0, 0.5, 0.5, 0 };
    CHECK(dflash_sample_cdf(q, 4, 1.0 - 0x1.0p-53) == 2); /* never the trailing zero */
}

/* Frequencies of n draws against p: every |count - n p| within 6 sd
 * (a per-cell false failure below 2e-9). */
static int freq_ok_v(const int64_t *count, const double *p, int V, int64_t n, int verbose)
{
    int ok = 1;
    for (int j = 0; j < V; j++) {
        double e = n * p[j], sd = sqrt(n * p[j] * (1 - p[j]));
        if (fabs(count[j] - e) > 6 * sd + 1e-9) {
            if (verbose)
                fprintf(stderr, "  token %d: %lld draws, expected %.1f (sd %.1f)\n", j, (long long)count[j], e, sd);
            ok = 0;
        }
    }
    return ok;
}

static int freq_ok(const int64_t *count, const double *p, int V, int64_t n) { return freq_ok_v(count, p, V, n, 1); }

static void test_sample_frequencies_and_seed(void)
{
    const double p[5] = { 0.1, 0.4, 0, 0.3, 0.2 };
    dflash_sampler_opts o;
    sampling_opts(&o, 1.0);
    o.seed = 123;
    dflash_sampler s, t;
    CHECK_OK(dflash_sampler_init(&s, 5, &o));
    CHECK_OK(dflash_sampler_init(&t, 5, &o));
    int64_t count[5] = { 0 };
    int same = 1;
    for (int i = 0; i < 200000; i++) {
        int32_t a = dflash_sampler_sample(&s, p);
        same &= a == dflash_sampler_sample(&t, p);
        count[a]++;
    }
    CHECK(same);
    CHECK(count[2] == 0);
    CHECK(freq_ok(count, p, 5, 200000));
    /* another seed: a different sequence */
    dflash_sampler_reset(&t, 124);
    dflash_sampler_reset(&s, 123);
    int differ = 0;
    for (int i = 0; i < 64; i++)
        differ += dflash_sampler_sample(&s, p) != dflash_sampler_sample(&t, p);
    CHECK(differ > 0);
    dflash_sampler_free(&s);
    dflash_sampler_free(&t);
}

/* Run the accept step n times: the draft comes from q (or is fixed, for a
 * point mass), the emitted token is the draft if accepted else the
 * resample. Its distribution must be p for the exact rule. */
static void accept_counts(dflash_accept_rule rule, const double *p, const double *q, int32_t fixed_draft, int V,
                          int64_t n, int64_t *count, double *accept_rate)
{
    dflash_sampler_opts o;
    sampling_opts(&o, 1.0);
    o.seed = 99;
    o.accept_rule = rule;
    dflash_sampler s;
    if (dflash_sampler_init(&s, V, &o) != DFLASH_OK)
        return;
    dflash_rng draw;
    dflash_rng_seed(&draw, 5);
    int64_t acc = 0;
    memset(count, 0, (size_t)V * sizeof *count);
    for (int64_t i = 0; i < n; i++) {
        int32_t d = q ? dflash_sample_cdf(q, V, dflash_rng_uniform(&draw)) : fixed_draft, next;
        if (dflash_sampler_accept(&s, p, q, d, &next)) {
            count[d]++;
            acc++;
        } else {
            count[next]++;
        }
    }
    *accept_rate = (double)acc / n;
    dflash_sampler_free(&s);
}

static void test_accept_rule(void)
{
    enum { V = 5, N = 200000 };
    const double p[V] = { 0.2, 0.3, 0.4, 0.1, 0 };
    int64_t count[V];
    double rate;
    /* point mass on token 1: accepted with p(1) = 0.3; output ~ p */
    accept_counts(DFLASH_ACCEPT_EXACT, p, NULL, 1, V, N, count, &rate);
    CHECKF(fabs(rate - 0.3) < 6 * sqrt(0.3 * 0.7 / N), "accept rate %g", rate);
    CHECK(freq_ok(count, p, V, N));
    /* a draft with p = 0 is always rejected */
    accept_counts(DFLASH_ACCEPT_EXACT, p, NULL, 4, V, N, count, &rate);
    CHECK(rate == 0 && count[4] == 0);
    CHECK(freq_ok(count, p, V, N));
    /* general q: min(1, p/q) and the residual max(0, p - q) */
    const double q[V] = { 0.5, 0.1, 0.1, 0.1, 0.2 };
    accept_counts(DFLASH_ACCEPT_EXACT, p, q, -1, V, N, count, &rate);
    /* acceptance = sum min(p, q) = 0.2 + 0.1 + 0.1 + 0.1 + 0 = 0.5 */
    CHECKF(fabs(rate - 0.5) < 6 * sqrt(0.25 / N), "accept rate %g", rate);
    CHECK(freq_ok(count, p, V, N));
    /* the test-only wrong rules must visibly distort the output */
    accept_counts(DFLASH_ACCEPT_TEST_SQRT, p, NULL, 1, V, N, count, &rate);
    CHECKF(fabs(rate - sqrt(0.3)) < 0.01, "sqrt rule accept rate %g", rate);
    CHECK(!freq_ok_v(count, p, V, N, 0));
    accept_counts(DFLASH_ACCEPT_TEST_ALWAYS, p, NULL, 1, V, N, count, &rate);
    CHECK(rate == 1 && count[1] == N);
}

/* Temperatures or penalties small enough to overflow the scaled logits
 * give the argmax as a point mass (the limit), never NaN or a hang. */
static void test_extreme_scaling(void)
{
    const float logits[4] = { 2, -2, -3, -4 };
    const struct { double temp, pen; int top_k; } cases[] = {
        { 1e-308, 1.0, 0 }, { 1e-308, 1.0, 2 }, { 1e-40, 1.0, 3 }, { 1.0, 1e-300, 2 },
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        dflash_sampler_opts o;
        dflash_sampler_default_opts(&o);
        o.temperature = cases[k].temp;
        o.rep_penalty = cases[k].pen;
        o.top_k = cases[k].top_k;
        dflash_sampler smp;
        CHECK_OK(dflash_sampler_init(&smp, 4, &o));
        int32_t seen = 0;
        dflash_sampler_observe(&smp, &seen, 1);
        double p[4];
        CHECK_OK(dflash_sampler_probs(&smp, logits, p));
        CHECKF(p[0] == 1.0 && p[1] == 0.0 && p[2] == 0.0 && p[3] == 0.0, "case %zu: %g %g %g %g", k, p[0], p[1],
               p[2], p[3]);
        dflash_sampler_free(&smp);
    }
}

/* ---- large rows against the filters written out plainly ---------------- */

static const double *g_ref_x; /* for ref_cmp */
/* descending value, ascending index on ties */
static int ref_cmp(const void *a, const void *b)
{
    const int i = *(const int *)a, j = *(const int *)b;
    if (g_ref_x[i] != g_ref_x[j])
        return g_ref_x[i] > g_ref_x[j] ? -1 : 1;
    return (i > j) - (i < j);
}

/* The filtered distribution by the textbook route: penalties (seen: in
 * the prompt, count: times generated) and temperature, a full sort, top-k
 * as the k-th sorted value, top-p walking the sorted survivors from the
 * bottom, min-p, softmax in index order. */
static void ref_probs(const float *lg, int V, const uint8_t *seen, const int *count, const dflash_sampler_opts *o,
                      double *p)
{
    double *x = malloc((size_t)V * sizeof *x), m = -INFINITY;
    int *ord = malloc((size_t)V * sizeof *ord), n = 0;
    for (int j = 0; j < V; j++) {
        double v = lg[j];
        const int rep = (seen[j] || count[j] > 0) && o->rep_penalty != 1.0;
        const int counted = count[j] > 0 && (o->frequency_penalty != 0.0 || o->presence_penalty != 0.0);
        if (rep)
            v = v < 0 ? v * o->rep_penalty : v / o->rep_penalty;
        if (counted)
            v = v - o->frequency_penalty * count[j] - o->presence_penalty;
        if (rep || counted)
            v = (float)v; /* a penalized logit is rounded to f32 */
        x[j] = v / o->temperature;
        m = x[j] > m ? x[j] : m;
        ord[n++] = j;
    }
    g_ref_x = x;
    qsort(ord, (size_t)n, sizeof *ord, ref_cmp);
    if (o->top_k > 0 && o->top_k < n) {
        const double kth = x[ord[o->top_k - 1]];
        while (n > 0 && x[ord[n - 1]] < kth)
            x[ord[--n]] = -INFINITY;
    }
    if (o->top_p < 1.0) {
        double z = 0, cum = 0;
        for (int r = n - 1; r >= 0; r--)
            z += exp(x[ord[r]] - m);
        while (n > 1) {
            cum += exp(x[ord[n - 1]] - m) / z;
            if (cum > 1.0 - o->top_p)
                break;
            x[ord[--n]] = -INFINITY;
        }
    }
    double z = 0;
    for (int j = 0; j < V; j++) {
        const int keep = x[j] != -INFINITY && !(o->min_p > 0 && exp(x[j] - m) < o->min_p);
        p[j] = keep ? exp(x[j] - m) : 0.0;
        z += p[j];
    }
    for (int j = 0; j < V; j++)
        p[j] /= z;
    free(x);
    free(ord);
}

/* Rows of thousands of tokens, peaked (mass falling with the log of the
 * rank) and flat (normal logits), with repeated values, through every
 * filter at settings that keep a handful to most of the row: the same
 * tokens survive as in the reference and their probabilities agree. This
 * is what exercises top-p's partitioning and top-k's heap, which the small
 * hand-made rows above barely enter. */
static void test_large_rows_match_reference(void)
{
    enum { V = 6000 };
    float *lg = malloc(V * sizeof *lg);
    double *p = malloc(V * sizeof *p), *want = malloc(V * sizeof *want);
    uint8_t *seen = calloc(V, 1);
    int *count = calloc(V, sizeof *count);
    const double temps[3] = { 1.0, 0.7, 0.3 }, tops[4] = { 0.5, 0.9, 0.95, 0.999 };
    const int ks[3] = { 0, 40, 3000 };
    int cases = 0, bad = 0;
    for (int kind = 0; kind < 2; kind++) {
        dflash_rng r;
        dflash_rng_seed(&r, 11 + (uint64_t)kind);
        for (int j = 0; j < V; j++) {
            const double u = dflash_rng_uniform(&r);
            lg[j] = kind ? (float)(4.0 * u - 2.0) : (float)(20.0 - 1.5 * log(1.0 + j * u));
            if (j % 97 == 5)
                lg[j] = lg[j - 3]; /* ties */
        }
        for (int j = 0; j < V; j += 13)
            seen[j] = 1;
        for (int j = 3; j < V; j += 29)
            count[j] = 1 + (j / 29) % 3;
        for (int t = 0; t < 3; t++)
            for (int q = 0; q < 4; q++)
                for (int k = 0; k < 3; k++) {
                    dflash_sampler_opts o;
                    sampling_opts(&o, temps[t]);
                    o.top_p = tops[q];
                    o.top_k = ks[k];
                    o.min_p = k == 2 ? 0.01 : 0.0;
                    o.rep_penalty = t == 1 ? 1.3 : 1.0;
                    o.frequency_penalty = t == 2 ? 0.2 : 0.0;
                    o.presence_penalty = t >= 1 ? 0.1 : 0.0;
                    dflash_sampler s;
                    if (dflash_sampler_init(&s, V, &o) != DFLASH_OK) {
                        bad++;
                        continue;
                    }
                    for (int j = 0; j < V; j++) {
                        if (seen[j])
                            dflash_sampler_observe(&s, (const int32_t[]){ j }, 1);
                        for (int c = 0; c < count[j]; c++)
                            dflash_sampler_observe_output(&s, (const int32_t[]){ j }, 1);
                    }
                    const dflash_status st = dflash_sampler_probs(&s, lg, p);
                    dflash_sampler_free(&s);
                    ref_probs(lg, V, seen, count, &o, want);
                    cases++;
                    for (int j = 0; j < V; j++)
                        if ((p[j] > 0) != (want[j] > 0) || fabs(p[j] - want[j]) > 1e-12 * (want[j] + 1e-300) + 1e-300 ||
                            st != DFLASH_OK) {
                            fprintf(stderr, "  kind %d T %g top-p %g top-k %d: token %d p %.17g want %.17g\n", kind,
                                    temps[t], tops[q], ks[k], j, p[j], want[j]);
                            bad++;
                            break;
                        }
                }
    }
    CHECKF(bad == 0 && cases == 72, "%d of %d settings differ from the reference", bad, cases);
    free(lg);
    free(p);
    free(want);
    free(seen);
    free(count);
}

int main(void)
{
    RUN(test_rng_known_values);
    RUN(test_rng_determinism);
    RUN(test_softmax_and_temperature);
    RUN(test_top_k_keeps_ties);
    RUN(test_top_p);
    RUN(test_min_p);
    RUN(test_repetition_penalty);
    RUN(test_frequency_presence);
    RUN(test_filter_order);
    RUN(test_bad_rows_and_opts);
    RUN(test_cdf_edges);
    RUN(test_sample_frequencies_and_seed);
    RUN(test_accept_rule);
    RUN(test_extreme_scaling);
    RUN(test_large_rows_match_reference);
    TEST_END();
}
