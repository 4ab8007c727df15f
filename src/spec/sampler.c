/* sampler.c: see sampler.h. Owns the filter chain on one logits row, the
 * RNG, inverse-CDF sampling and the speculative accept/resample step. All
 * buffers are sized once in dflash_sampler_init; nothing here allocates per
 * token. Every sum runs in double in a fixed order (index order, or the
 * order a deterministic partition visits for top-p) so a seed reproduces a
 * run bit for bit. */
#include "spec/sampler.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

void dflash_sampler_default_opts(dflash_sampler_opts *o)
{
    memset(o, 0, sizeof *o);
    o->temperature = 0.0;
    o->top_k = 0;
    o->top_p = 1.0;
    o->min_p = 0.0;
    o->rep_penalty = 1.0;
    o->seed = 0;
    o->accept_rule = DFLASH_ACCEPT_EXACT;
}

dflash_status dflash_sampler_check_opts(const dflash_sampler_opts *o)
{
    if (!(o->temperature >= 0.0) || !isfinite(o->temperature))
        return dflash_fail(DFLASH_ERR_INVALID_ARG, "sampler: temperature %g must be finite and >= 0", o->temperature);
    if (o->top_k < 0)
        return dflash_fail(DFLASH_ERR_INVALID_ARG, "sampler: top_k %d must be >= 0 (0 = off)", o->top_k);
    if (!(o->top_p > 0.0 && o->top_p <= 1.0))
        return dflash_fail(DFLASH_ERR_INVALID_ARG, "sampler: top_p %g must be in (0, 1] (1 = off)", o->top_p);
    if (!(o->min_p >= 0.0 && o->min_p <= 1.0))
        return dflash_fail(DFLASH_ERR_INVALID_ARG, "sampler: min_p %g must be in [0, 1] (0 = off)", o->min_p);
    if (!(o->rep_penalty > 0.0) || !isfinite(o->rep_penalty))
        return dflash_fail(DFLASH_ERR_INVALID_ARG, "sampler: repetition penalty %g must be finite and > 0 (1 = off)",
                           o->rep_penalty);
    if (!(o->frequency_penalty >= -2.0 && o->frequency_penalty <= 2.0))
        return dflash_fail(DFLASH_ERR_INVALID_ARG, "sampler: frequency penalty %g must be in [-2, 2] (0 = off)",
                           o->frequency_penalty);
    if (!(o->presence_penalty >= -2.0 && o->presence_penalty <= 2.0))
        return dflash_fail(DFLASH_ERR_INVALID_ARG, "sampler: presence penalty %g must be in [-2, 2] (0 = off)",
                           o->presence_penalty);
    if (o->accept_rule < DFLASH_ACCEPT_EXACT || o->accept_rule > DFLASH_ACCEPT_TEST_ALWAYS)
        return dflash_fail(DFLASH_ERR_INVALID_ARG, "sampler: unknown accept rule %d", (int)o->accept_rule);
    return DFLASH_OK;
}

int dflash_sampler_has_penalty(const dflash_sampler_opts *o)
{
    return o->rep_penalty != 1.0 || o->frequency_penalty != 0.0 || o->presence_penalty != 0.0;
}

int dflash_sampler_is_greedy(const dflash_sampler_opts *o)
{
    return o->temperature == 0.0 && !dflash_sampler_has_penalty(o);
}

/* ---- RNG ----------------------------------------------------------------- */

/* splitmix64 (Steele, Lea, Flood): spreads any 64-bit seed, 0 included,
 * over a full xoshiro state that is never all zero. */
static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void dflash_rng_seed(dflash_rng *r, uint64_t seed)
{
    uint64_t x = seed;
    for (int i = 0; i < 4; i++)
        r->s[i] = splitmix64(&x);
}

static uint64_t rotl(uint64_t v, int k) { return (v << k) | (v >> (64 - k)); }

/* xoshiro256** (Blackman, Vigna): integer-only, so the stream is the same
 * on every platform and compiler. */
uint64_t dflash_rng_next(dflash_rng *r)
{
    uint64_t *s = r->s;
    const uint64_t out = rotl(s[1] * 5, 7) * 9;
    const uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return out;
}

double dflash_rng_uniform(dflash_rng *r)
{
    /* 53 integer bits scaled by a power of two: exact in IEEE double, no
     * rounding mode or libm involved. */
    return (double)(dflash_rng_next(r) >> 11) * 0x1.0p-53;
}

/* ---- sampler --------------------------------------------------------------- */

dflash_status dflash_sampler_init(dflash_sampler *s, int vocab, const dflash_sampler_opts *o)
{
    memset(s, 0, sizeof *s);
    DFLASH_TRY(dflash_sampler_check_opts(o));
    if (vocab <= 0)
        return dflash_fail(DFLASH_ERR_INVALID_ARG, "sampler: vocabulary size %d", vocab);
    s->o = *o;
    s->vocab = vocab;
    const size_t V = (size_t)vocab;
    s->probs = malloc(V * sizeof *s->probs);
    s->x = malloc(V * sizeof *s->x);
    s->resid = malloc(V * sizeof *s->resid);
    s->order = malloc(V * sizeof *s->order);
    s->cand = malloc(V * sizeof *s->cand);
    s->seen = calloc(V, 1);
    s->count = calloc(V, sizeof *s->count);
    if (!s->probs || !s->x || !s->resid || !s->order || !s->cand || !s->seen || !s->count) {
        dflash_sampler_free(s);
        return dflash_fail(DFLASH_ERR_OOM, "sampler: out of memory for a vocabulary of %d", vocab);
    }
    dflash_rng_seed(&s->rng, o->seed);
    return DFLASH_OK;
}

void dflash_sampler_free(dflash_sampler *s)
{
    free(s->probs);
    free(s->x);
    free(s->resid);
    free(s->order);
    free(s->cand);
    free(s->seen);
    free(s->count);
    memset(s, 0, sizeof *s);
}

void dflash_sampler_reset(dflash_sampler *s, uint64_t seed)
{
    memset(s->seen, 0, (size_t)s->vocab);
    memset(s->count, 0, (size_t)s->vocab * sizeof *s->count);
    s->o.seed = seed;
    dflash_rng_seed(&s->rng, seed);
}

void dflash_sampler_observe(dflash_sampler *s, const int32_t *ids, int n)
{
    for (int i = 0; i < n; i++)
        if (ids[i] >= 0 && ids[i] < s->vocab)
            s->seen[ids[i]] = 1;
}

void dflash_sampler_observe_output(dflash_sampler *s, const int32_t *ids, int n)
{
    for (int i = 0; i < n; i++)
        if (ids[i] >= 0 && ids[i] < s->vocab) {
            s->seen[ids[i]] = 1;
            if (s->count[ids[i]] < INT32_MAX)
                s->count[ids[i]]++;
        }
}

/* The k-th largest (1 <= k <= the count) of the finite values of
 * x[0..n), counted with multiplicity (torch.topk's last value), through a
 * min-heap of the k largest so far in heap[0..k): a value that does not
 * beat the heap's least is one predictable comparison, so a row costs
 * about one pass for the small k samplers use. */
static double kth_largest(const double *x, int n, int k, double *heap)
{
    int h = 0;
    for (int j = 0; j < n; j++) {
        const double v = x[j];
        if (v == -INFINITY || (h == k && v <= heap[0]))
            continue;
        int i;
        if (h < k) { /* sift up from the new leaf */
            for (i = h++; i > 0 && heap[(i - 1) / 2] > v; i = (i - 1) / 2)
                heap[i] = heap[(i - 1) / 2];
        } else { /* replace the least and sift down */
            for (i = 0;;) {
                int c = 2 * i + 1;
                if (c >= k)
                    break;
                if (c + 1 < k && heap[c + 1] < heap[c])
                    c++;
                if (heap[c] >= v)
                    break;
                heap[i] = heap[c];
                i = c;
            }
        }
        heap[i] = v;
    }
    return heap[0];
}

/* Descending by value, ascending index on ties: a total order, so the
 * sorted order (and every sum taken in it) is the same on every machine. */
static int before(const double *x, int32_t a, int32_t b) { return x[a] > x[b] || (x[a] == x[b] && a < b); }

/* Heapsort of idx[0..n) by `before` (in place, no allocation, no
 * comparator context needed). */
static void sort_desc(const double *x, int32_t *idx, int n)
{
    /* max-heap under "after" so the root is the last element of the order */
    for (int start = n / 2 - 1, end = n;; ) {
        int root;
        if (start >= 0) {
            root = start--;
        } else {
            if (--end <= 0)
                break;
            int32_t t = idx[0];
            idx[0] = idx[end];
            idx[end] = t;
            root = 0;
        }
        for (;;) {
            int c = 2 * root + 1;
            if (c >= end)
                break;
            if (c + 1 < end && before(x, idx[c], idx[c + 1]))
                c++;
            if (!before(x, idx[root], idx[c]))
                break;
            int32_t t = idx[root];
            idx[root] = idx[c];
            idx[c] = t;
            root = c;
        }
    }
}

/* Top-p over the survivors cand[0..n) (index order), whose exp(x - m)
 * are in probs[]: drops the tokens HF's rule drops. In the descending
 * order (`before`), walked from the bottom, a token goes while the mass
 * of it and every token below it is <= limit * z; the top token always
 * stays. The dropped set is therefore the largest bottom part of the order
 * whose mass is <= limit * z, and a weighted quickselect finds its edge in
 * O(n) on average instead of sorting every survivor: partition around a
 * pivot; if the part below it fits (with what is already dropped), it
 * goes, and the pivot with it if that fits too, else the edge lies in the
 * part below. Masses are summed in the partitions' order, so they can
 * differ from a sorted walk's in the last bits: a token exactly at the
 * edge may fall the other way, as rounding anywhere would have it. Dropped
 * tokens get x = -inf and probs = 0. `work` has room for n indices. */
static void top_p_drop(double *x, double *probs, const int32_t *cand, int n, int32_t top, double limit, int32_t *work)
{
    double z = 0;
    for (int i = 0; i < n; i++)
        z += probs[cand[i]];
    const double cap = limit * z;
    /* A token under half of cap / n goes at once: all such tokens lie at
     * the bottom of the order and together weigh under half of cap. In a
     * peaked row that is nearly all of them, in one predictable pass. */
    const double sure = 0.5 * cap / n;
    double below = 0; /* mass of the tokens dropped so far: all below work[lo..hi) */
    int lo = 0, hi = 0;
    for (int i = 0; i < n; i++) {
        const int32_t j = cand[i];
        if (j == top)
            continue;
        if (probs[j] < sure) {
            below += probs[j];
            x[j] = -INFINITY;
            probs[j] = 0;
        } else {
            work[hi++] = j;
        }
    }
    for (int round = 0; lo < hi; round++) {
        if (hi - lo <= 32 || round == 64) {
            /* a few left (or a pathological order): sort them and walk */
            sort_desc(x, work + lo, hi - lo);
            for (int r = hi - 1; r >= lo; r--) {
                const int32_t j = work[r];
                if (below + probs[j] > cap)
                    break;
                below += probs[j];
                x[j] = -INFINITY;
                probs[j] = 0;
            }
            return;
        }
        /* pivot: the median of three under `before`; then work[lo..mid)
         * comes before it (higher), work[mid + 1..hi) after it (lower) */
        int32_t a = work[lo], b = work[lo + (hi - lo) / 2], c = work[hi - 1], piv;
        if (before(x, a, b))
            piv = before(x, b, c) ? b : before(x, a, c) ? c : a;
        else
            piv = before(x, a, c) ? a : before(x, b, c) ? c : b;
        int mid = lo;
        for (int i = lo; i < hi; i++)
            if (work[i] != piv && before(x, work[i], piv)) {
                const int32_t t = work[i];
                work[i] = work[mid];
                work[mid++] = t;
            }
        /* work[mid..hi) holds the pivot and the lower part, in some order */
        double lower = 0;
        for (int i = mid; i < hi; i++)
            if (work[i] != piv)
                lower += probs[work[i]];
        if (below + lower > cap) { /* the edge is below the pivot: drop nothing yet */
            int w = mid;
            for (int i = mid; i < hi; i++)
                if (work[i] != piv)
                    work[w++] = work[i];
            lo = mid;
            hi = w;
            continue;
        }
        const double e_piv = probs[piv];
        const int with_pivot = below + lower + e_piv <= cap;
        for (int i = mid; i < hi; i++) {
            const int32_t j = work[i];
            if (j != piv || with_pivot) {
                x[j] = -INFINITY;
                probs[j] = 0;
            }
        }
        if (!with_pivot)
            return;
        below += lower + e_piv;
        hi = mid;
    }
}

double dflash_sampler_penalized(const dflash_sampler_opts *o, float logit, int32_t c)
{
    double v = logit;
    int changed = 0;
    if (c >= 0 && o->rep_penalty != 1.0) {
        v = v < 0 ? v * o->rep_penalty : v / o->rep_penalty;
        changed = 1;
    }
    if (c > 0 && (o->frequency_penalty != 0.0 || o->presence_penalty != 0.0)) {
        /* the product apart: no compiler may fuse it into the subtraction
         * (the device rounds both, kernels/sample.cu) */
        const double f = o->frequency_penalty * c;
        v -= f;
        v -= o->presence_penalty;
        changed = 1;
    }
    if (!changed)
        return v;
    /* a finite logit stays finite: one past f32's range becomes its largest */
    const float r = (float)v;
    return isinf(r) && isfinite(v) ? (v > 0 ? FLT_MAX : -FLT_MAX) : r;
}

/* Rows at least this long take their exponentials on every thread. */
#define SAMPLER_PAR_MIN 16384

dflash_status dflash_sampler_probs(dflash_sampler *s, const float *logits, double *probs)
{
    const int V = s->vocab;
    const dflash_sampler_opts *o = &s->o;
    const double T = o->temperature;
    double *x = s->x;
    int n_finite = 0, bad = 0;
    double m = -INFINITY;
    int32_t top = -1;
    /* 1 repetition penalty (HF: score < 0 ? score * r : score / r), over
     * the set of tokens in the sequence, each once however often it occurs;
     * then frequency and presence (vLLM's order) over the generated ones,
     * in double, a penalized logit rounded to f32 (a logit's type, and
     * what the device's draw computes too: backend.h's dflash_sample_row);
     * 2 temperature, in the same pass: scaling keeps the order, so the
     * first maximum of the penalized logits is the scaled row's too, and
     * x holds the scaled values (the penalized ones when T = 0) */
    const int penalize = dflash_sampler_has_penalty(o);
    for (int j = 0; j < V; j++) {
        double v = logits[j];
        bad |= isnan(v) || v == INFINITY;
        if (penalize)
            v = dflash_sampler_penalized(o, logits[j], s->count[j] > 0 ? s->count[j] : s->seen[j] ? 0 : -1);
        if (v > m) {
            m = v;
            top = j;
        }
        x[j] = T > 0.0 ? v / T : v;
        /* scaling can send tiny values to -inf: count the scaled survivors */
        n_finite += x[j] != -INFINITY;
    }
    if (bad)
        for (int j = 0; j < V; j++)
            if (isnan(logits[j]) || logits[j] == INFINITY)
                return dflash_fail(DFLASH_ERR_NUMERIC, "sampler: logit %d is %s", j,
                                   isnan(logits[j]) ? "NaN" : "+inf");
    if (top < 0)
        return dflash_fail(DFLASH_ERR_NUMERIC, "sampler: every logit of the row is -inf");
    m = x[top];
    if (T == 0.0 || isinf(m)) {
        /* greedy with a penalty, or a temperature (or penalty) so small
         * that scaling overflowed, whose limit it is: a point mass on the
         * first maximum */
        memset(probs, 0, (size_t)V * sizeof *probs);
        probs[top] = 1.0;
        return DFLASH_OK;
    }
    /* 3 top-k: drop everything below the k-th largest (ties with it stay,
     * as torch's `scores < topk(...)[..., -1]` keeps them) */
    double kth = -INFINITY;
    const int top_k = o->top_k > 0 && o->top_k < n_finite;
    if (top_k)
        kth = kth_largest(x, V, o->top_k, s->resid);
    /* The survivors from here on, in index order: later filters and the
     * softmax touch only them (a few dozen after a top-k, not the whole
     * vocabulary). probs[] holds exp(x - m) of each meanwhile: taken for
     * the survivors alone after a top-k, else for the whole row at once,
     * on every thread (each element on its own: the same bits however
     * many threads). */
    int32_t *cand = s->cand;
    int n = 0;
    if (top_k) {
        memset(probs, 0, (size_t)V * sizeof *probs);
        for (int j = 0; j < V; j++) {
            if (x[j] < kth)
                x[j] = -INFINITY;
            if (x[j] != -INFINITY) {
                cand[n++] = j;
                probs[j] = exp(x[j] - m);
            }
        }
    } else {
#pragma omp parallel for schedule(static) if (V >= SAMPLER_PAR_MIN)
        for (int j = 0; j < V; j++)
            probs[j] = x[j] == -INFINITY ? 0.0 : exp(x[j] - m);
        for (int j = 0; j < V; j++)
            if (x[j] != -INFINITY)
                cand[n++] = j;
    }
    /* 4 top-p, as HF computes it (sort ascending, cumulative softmax from
     * the smallest, drop while the cumulative mass <= 1 - top_p; the top
     * token always stays) */
    if (o->top_p < 1.0)
        top_p_drop(x, probs, cand, n, top, 1.0 - o->top_p, s->order);
    /* 5 min-p: p_j < min_p * p_max  <=>  exp(x_j - m) < min_p (the top
     * token, which carries m, survives every filter) */
    if (o->min_p > 0.0)
        for (int i = 0; i < n; i++)
            if (x[cand[i]] != -INFINITY && probs[cand[i]] < o->min_p) {
                x[cand[i]] = -INFINITY;
                probs[cand[i]] = 0;
            }
    /* softmax over the survivors, summed in index order (dropped ones
     * hold 0 and add nothing) */
    double z = 0;
    for (int i = 0; i < n; i++)
        z += probs[cand[i]];
    for (int i = 0; i < n; i++)
        probs[cand[i]] /= z;
    return DFLASH_OK;
}

int32_t dflash_sample_cdf(const double *probs, int n, double u)
{
    double total = 0;
    for (int j = 0; j < n; j++)
        total += probs[j];
    double target = u * total, cum = 0;
    int32_t last = 0;
    for (int j = 0; j < n; j++) {
        if (probs[j] <= 0)
            continue;
        cum += probs[j];
        last = j;
        if (cum > target)
            return j;
    }
    /* rounding left the running sum a hair short of u * total: the last
     * token with mass is the right answer (never a zero-probability one) */
    return last;
}

int32_t dflash_sampler_sample(dflash_sampler *s, const double *probs)
{
    return dflash_sample_cdf(probs, s->vocab, dflash_rng_uniform(&s->rng));
}

double dflash_sampler_uniform_at(const dflash_sampler *s, int64_t pos)
{
    /* Element pos of the splitmix64 stream whose start is the seed mixed
     * once (so nearby seeds give unrelated streams): random access, no
     * state to carry between calls. */
    uint64_t seed = s->o.seed;
    uint64_t x = splitmix64(&seed) + (uint64_t)pos * 0x9e3779b97f4a7c15ull;
    return (double)(splitmix64(&x) >> 11) * 0x1.0p-53;
}

int32_t dflash_sampler_sample_at(const dflash_sampler *s, const double *probs, int64_t pos)
{
    return dflash_sample_cdf(probs, s->vocab, dflash_sampler_uniform_at(s, pos));
}

int dflash_sampler_accept(dflash_sampler *s, const double *p, const double *q, int32_t draft, int32_t *next)
{
    const int V = s->vocab;
    const int in_vocab = draft >= 0 && draft < V;
    const double pd = in_vocab ? p[draft] : 0.0;
    const double qd = !in_vocab ? 1.0 : q ? q[draft] : 1.0;
    const double u = dflash_rng_uniform(&s->rng);
    int accept;
    switch (s->o.accept_rule) {
    case DFLASH_ACCEPT_TEST_SQRT:
        accept = pd > 0 && (qd <= 0 || u < sqrt(pd / qd));
        break;
    case DFLASH_ACCEPT_TEST_ALWAYS:
        accept = 1;
        break;
    default:
        /* u < p/q written without the division; q(d) = 0 (a draft the
         * proposer gave no mass) accepts whenever p(d) > 0 */
        accept = pd > 0 && u * qd < pd;
        break;
    }
    if (accept)
        return 1;
    /* residual max(0, p - q), renormalized by sampling it as weights */
    double z = 0;
    for (int j = 0; j < V; j++) {
        double r = q ? p[j] - q[j] : (j == draft ? 0.0 : p[j]);
        r = r > 0 ? r : 0.0;
        s->resid[j] = r;
        z += r;
    }
    /* z == 0 only if p <= q everywhere, i.e. p == q, where rejection has
     * probability 0; falling back to p keeps the function total */
    *next = dflash_sampler_sample(s, z > 0 ? s->resid : p);
    return 0;
}
