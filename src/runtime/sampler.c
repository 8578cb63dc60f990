/*
 * sampler.c — turning logits into a token: penalties over the recent tokens, temperature,
 * top-k, top-p, min-p, and a draw with the sampler's own RNG (splitmix64 seeded per sampler,
 * so runs with the same seed are identical and samplers never share state).
 *
 * Candidates are the whole vocabulary, partially sorted only as far as top-k needs; without
 * top-k, only candidates that can matter are sorted (filter_without_top_k).
 */
#include "runtime/sampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/error.h"

struct qwenrt_sampler {
    struct qwenrt_sampler_params p;
    int32_t n_vocab;
    uint64_t rng;
    struct qwenrt_logit_bias *bias; /* [p.n_logit_bias], a copy (p.logit_bias points here) */
    int32_t *recent;           /* ring of the last penalty_last_n accepted ids */
    int32_t n_recent, head;
    struct sampler_cand *cand; /* [n_vocab] */
};

struct qwenrt_sampler_params qwenrt_sampler_default_params(void)
{
    struct qwenrt_sampler_params p = {0};
    p.temperature = 0.0f;
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    p.repeat_penalty = 1.0f;
    p.presence_penalty = 0.0f;
    p.penalty_last_n = 64;
    p.seed = 0;
    return p;
}

qwenrt_status qwenrt_sampler_init(const struct qwenrt_sampler_params *params, int32_t n_vocab,
                                  struct qwenrt_sampler **out, struct qwenrt_error *err)
{
    *out = NULL;
    const struct qwenrt_sampler_params *p = params;
    if (n_vocab <= 0)
        return err_set(err, QWENRT_ERR_INVALID_ARG, "sampler: vocabulary size %d", n_vocab);
    if (!(p->temperature >= 0.0f) || !(p->top_p > 0.0f && p->top_p <= 1.0f) ||
        !(p->min_p >= 0.0f && p->min_p <= 1.0f) || !(p->repeat_penalty > 0.0f) ||
        p->penalty_last_n < 0 || p->penalty_last_n > (1 << 20) || !isfinite(p->presence_penalty))
        return err_set(err, QWENRT_ERR_INVALID_ARG,
                       "sampler: parameters out of range (temperature >= 0, 0 < top_p <= 1, 0 <= min_p <= 1, repeat_penalty > 0)");
    if (p->n_logit_bias < 0 || p->n_logit_bias > n_vocab || (p->n_logit_bias && !p->logit_bias))
        return err_set(err, QWENRT_ERR_INVALID_ARG, "sampler: %d logit bias entries for a vocabulary of %d",
                       p->n_logit_bias, n_vocab);
    for (int32_t i = 0; i < p->n_logit_bias; i++)
        if (p->logit_bias[i].id < 0 || p->logit_bias[i].id >= n_vocab || !isfinite(p->logit_bias[i].bias))
            return err_set(err, QWENRT_ERR_INVALID_ARG,
                           "sampler: logit bias entry %d (token %d, bias %g): the token must be below %d and the bias finite",
                           i, p->logit_bias[i].id, (double)p->logit_bias[i].bias, n_vocab);
    struct qwenrt_sampler *s = xcalloc(1, sizeof(*s));
    if (!s)
        return err_set(err, QWENRT_ERR_NOMEM, "sampler: out of memory");
    s->p = *p;
    s->n_vocab = n_vocab;
    s->recent = xcalloc((size_t)p->penalty_last_n + 1, sizeof(int32_t));
    s->cand = xcalloc((size_t)n_vocab, sizeof(*s->cand));
    s->bias = p->n_logit_bias ? xcalloc((size_t)p->n_logit_bias, sizeof(*s->bias)) : NULL;
    if (s->bias)
        memcpy(s->bias, p->logit_bias, (size_t)p->n_logit_bias * sizeof(*s->bias));
    s->p.logit_bias = s->bias; /* never the caller's array */
    if (!s->recent || !s->cand || (p->n_logit_bias && !s->bias)) {
        qwenrt_sampler_free(s);
        return err_set(err, QWENRT_ERR_NOMEM, "sampler: out of memory");
    }
    qwenrt_sampler_reset(s);
    *out = s;
    return QWENRT_OK;
}

void qwenrt_sampler_free(struct qwenrt_sampler *s)
{
    if (!s)
        return;
    xfree(s->recent);
    xfree(s->cand);
    xfree(s->bias);
    xfree(s);
}

void qwenrt_sampler_reset(struct qwenrt_sampler *s)
{
    s->rng = s->p.seed ^ 0x853c49e6748fea9bull;
    s->n_recent = s->head = 0;
}

void qwenrt_sampler_accept(struct qwenrt_sampler *s, int32_t id)
{
    if (s->p.penalty_last_n == 0)
        return;
    s->recent[s->head] = id;
    s->head = (s->head + 1) % s->p.penalty_last_n;
    if (s->n_recent < s->p.penalty_last_n)
        s->n_recent++;
}

#define SAMPLER_GOLDEN 0x9e3779b97f4a7c15ull /* splitmix64's step (sample.cu repeats it) */

/* uniform in [0, 1) */
static double next_uniform(struct qwenrt_sampler *s)
{
    uint64_t z = (s->rng += SAMPLER_GOLDEN);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (double)(z >> 11) * 0x1.0p-53;
}

static int cmp_desc(const void *a, const void *b)
{
    float x = ((const struct sampler_cand *)a)->logit, y = ((const struct sampler_cand *)b)->logit;
    return (x < y) - (x > y);
}

int32_t sampler_top_k(struct sampler_cand *c, int32_t n, int32_t k)
{
    if (k <= 0 || k >= n) {
        qsort(c, (size_t)n, sizeof(*c), cmp_desc);
        return n;
    }
    /* selection by a bounded insertion into the first k slots (k is small in practice) */
    for (int32_t i = 1; i < k; i++) /* sort the first k */
        for (int32_t j = i; j > 0 && c[j].logit > c[j - 1].logit; j--) {
            struct sampler_cand t = c[j];
            c[j] = c[j - 1];
            c[j - 1] = t;
        }
    for (int32_t i = k; i < n; i++) {
        if (c[i].logit <= c[k - 1].logit)
            continue;
        int32_t j = k - 1;
        struct sampler_cand t = c[i];
        while (j > 0 && c[j - 1].logit < t.logit) {
            c[j] = c[j - 1];
            j--;
        }
        c[j] = t;
    }
    return k;
}

void sampler_softmax(struct sampler_cand *c, int32_t n)
{
    double sum = 0.0;
    float mx = c[0].logit;
    for (int32_t i = 0; i < n; i++) {
        c[i].p = expf(c[i].logit - mx);
        sum += c[i].p;
    }
    for (int32_t i = 0; i < n; i++)
        c[i].p = (float)(c[i].p / sum);
}

static void renormalise(struct sampler_cand *c, int32_t n)
{
    double sum = 0.0;
    for (int32_t i = 0; i < n; i++)
        sum += c[i].p;
    for (int32_t i = 0; i < n; i++)
        c[i].p = (float)(c[i].p / sum);
}

int32_t sampler_top_p(struct sampler_cand *c, int32_t n, float top_p)
{
    if (top_p >= 1.0f)
        return n;
    double cum = 0.0;
    int32_t keep = n;
    for (int32_t i = 0; i < n; i++) {
        cum += c[i].p;
        if (cum >= top_p) {
            keep = i + 1;
            break;
        }
    }
    renormalise(c, keep);
    return keep;
}

int32_t sampler_min_p(struct sampler_cand *c, int32_t n, float min_p)
{
    if (min_p <= 0.0f)
        return n;
    float cut = min_p * c[0].p;
    int32_t keep = 1;
    while (keep < n && c[keep].p >= cut)
        keep++;
    renormalise(c, keep);
    return keep;
}

static bool penalties_on(const struct qwenrt_sampler *s)
{
    return s->p.repeat_penalty != 1.0f || s->p.presence_penalty != 0.0f;
}

/* Whether recent[i] is a valid id seen for the first time at i (penalties count it once). */
static bool first_recent(const struct qwenrt_sampler *s, int32_t i)
{
    int32_t id = s->recent[i];
    if (id < 0 || id >= s->n_vocab)
        return false;
    for (int32_t j = 0; j < i; j++)
        if (s->recent[j] == id)
            return false;
    return true;
}

/* The candidate with this id among c[0..n) (sorted by id), or NULL. */
static struct sampler_cand *find_cand(struct sampler_cand *c, int32_t n, int32_t id)
{
    int32_t lo = 0, hi = n;
    while (lo < hi) {
        int32_t mid = lo + (hi - lo) / 2;
        if (c[mid].id < id)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < n && c[lo].id == id ? &c[lo] : NULL;
}

/* The logit bias, then the repetition penalty (each distinct recent token once) and the
 * presence penalty, on c[0..n) sorted by id (the whole vocabulary, or a subset holding every
 * token they touch). */
static void apply_bias_and_penalties(struct qwenrt_sampler *s, struct sampler_cand *c, int32_t n)
{
    for (int32_t i = 0; i < s->p.n_logit_bias; i++) {
        struct sampler_cand *t = find_cand(c, n, s->bias[i].id);
        if (t)
            t->logit += s->bias[i].bias;
    }
    if (!penalties_on(s))
        return;
    for (int32_t i = 0; i < s->n_recent; i++) {
        struct sampler_cand *t = first_recent(s, i) ? find_cand(c, n, s->recent[i]) : NULL;
        if (!t)
            continue;
        t->logit = t->logit > 0.0f ? t->logit / s->p.repeat_penalty : t->logit * s->p.repeat_penalty;
        t->logit -= s->p.presence_penalty;
    }
}

/* Softmax over all n candidates in place (unsorted); returns the index of the largest. */
static int32_t softmax_unsorted(struct sampler_cand *c, int32_t n)
{
    int32_t best = 0;
    for (int32_t i = 1; i < n; i++)
        if (c[i].logit > c[best].logit)
            best = i;
    double sum = 0.0;
    for (int32_t i = 0; i < n; i++)
        sum += c[i].p = expf(c[i].logit - c[best].logit);
    for (int32_t i = 0; i < n; i++)
        c[i].p = (float)(c[i].p / sum);
    return best;
}

/* Without top-k, sorting the whole vocabulary for every token costs ~10 ms at 250k tokens.
 * Exact shortcut: every candidate below 1e-9 is smaller than every candidate above it, so
 * sorting only those above gives the same top-p prefix whenever that prefix reaches top_p
 * (the rest holds at most n·1e-9 of the mass); otherwise fall back to sorting everything.
 * With top_p = 1 nothing needs sorting: min-p filters by value and the draw walks any order. */
static int32_t filter_without_top_k(struct qwenrt_sampler *s)
{
    struct sampler_cand *c = s->cand;
    int32_t n = s->n_vocab, best = softmax_unsorted(c, n);
    float pmax = c[best].p;
    if (s->p.top_p >= 1.0f) {
        int32_t keep = 0;
        for (int32_t i = 0; i < n; i++)
            if (c[i].p >= s->p.min_p * pmax)
                c[keep++] = c[i];
        renormalise(c, keep);
        return keep;
    }
    int32_t keep = 0;
    for (int32_t i = 0; i < n; i++)
        if (c[i].p >= 1e-9f)
            c[keep++] = c[i];
    qsort(c, (size_t)keep, sizeof(*c), cmp_desc);
    double cum = 0.0;
    for (int32_t i = 0; i < keep; i++)
        if ((cum += c[i].p) >= s->p.top_p) {
            keep = i + 1;
            renormalise(c, keep);
            return sampler_min_p(c, keep, s->p.min_p);
        }
    return -1; /* the prefix needs the tiny candidates too: caller sorts everything */
}

/* The candidates from the logits: every token in id order, logit bias and penalties applied. */
static void load_candidates(struct qwenrt_sampler *s, const float *logits)
{
    for (int32_t i = 0; i < s->n_vocab; i++) {
        s->cand[i].id = i;
        s->cand[i].logit = logits[i];
    }
    apply_bias_and_penalties(s, s->cand, s->n_vocab);
}

/* Greedy: the first candidate (lowest id) with the largest logit. */
static int32_t argmax_cand(const struct sampler_cand *c, int32_t n)
{
    int32_t best = 0;
    for (int32_t i = 1; i < n; i++)
        if (c[i].logit > c[best].logit)
            best = i;
    return c[best].id;
}

static void scale_by_temperature(struct qwenrt_sampler *s, int32_t n)
{
    for (int32_t i = 0; i < n; i++)
        s->cand[i].logit /= s->p.temperature;
}

/* top-k, softmax, top-p, min-p over the first n candidates (in id order); returns the count
 * kept. */
static int32_t filter_with_top_k(struct qwenrt_sampler *s, int32_t n)
{
    n = sampler_top_k(s->cand, n, s->p.top_k);
    sampler_softmax(s->cand, n);
    n = sampler_top_p(s->cand, n, s->p.top_p);
    return sampler_min_p(s->cand, n, s->p.min_p);
}

/* A draw from the n kept candidates (probabilities summing to 1). */
static int32_t draw(struct qwenrt_sampler *s, int32_t n)
{
    double u = next_uniform(s), cum = 0.0;
    for (int32_t i = 0; i < n; i++) {
        cum += s->cand[i].p;
        if (u < cum)
            return s->cand[i].id;
    }
    return s->cand[n - 1].id;
}

int32_t qwenrt_sampler_sample(struct qwenrt_sampler *s, const float *logits)
{
    load_candidates(s, logits);
    if (s->p.temperature <= 0.0f)
        return argmax_cand(s->cand, s->n_vocab);
    scale_by_temperature(s, s->n_vocab);
    int32_t n = s->p.top_k <= 0 ? filter_without_top_k(s) : -1;
    if (n < 0) {
        load_candidates(s, logits); /* again: the shortcut reordered them */
        scale_by_temperature(s, s->n_vocab);
        n = filter_with_top_k(s, s->n_vocab);
    }
    return draw(s, n);
}

/* ------------------------------------------------------------------ sampling from a subset
 * Why a subset is enough: the logit bias and the penalties touch only the "gathered" tokens
 * (the bias ids and the recent ids); every other token keeps its logit, and temperature keeps
 * the order. Rank tokens by (logit / temperature, then lower id), the order sampler_top_k and
 * the greedy argmax pick in. Take the m best by that order, with m = k + (gathered tokens) + 1.
 * At least m - gathered > k of them are untouched, and every untouched token outside the m
 * ranks below all of those. So the k best after bias and penalties lie among the m best plus
 * the gathered tokens, and the draw sees exactly the candidates and probabilities the whole
 * row would give (same floats, same order, same RNG step). Greedy is the k = 1 case (without
 * the + 1: the argmax does not sort). */

int32_t sampler_subset_plan(const struct qwenrt_sampler *s, int32_t *gather, int32_t cap, int32_t max_m,
                            int32_t *m, float *temperature)
{
    bool greedy = s->p.temperature <= 0.0f;
    if (!greedy && s->p.top_k <= 0)
        return -1; /* the whole distribution matters */
    int32_t n = 0;
    for (int32_t i = 0; i < s->p.n_logit_bias; i++) {
        bool dup = false;
        for (int32_t j = 0; j < i && !dup; j++)
            dup = s->bias[j].id == s->bias[i].id;
        if (dup)
            continue;
        if (n == cap)
            return -1;
        gather[n++] = s->bias[i].id;
    }
    for (int32_t i = 0; penalties_on(s) && i < s->n_recent; i++) {
        if (!first_recent(s, i))
            continue;
        bool dup = false;
        for (int32_t j = 0; j < n && !dup; j++)
            dup = gather[j] == s->recent[i];
        if (dup)
            continue;
        if (n == cap)
            return -1;
        gather[n++] = s->recent[i];
    }
    int64_t need = greedy ? 1 + (int64_t)n : (int64_t)s->p.top_k + n + 1;
    if (need > max_m || need + n > s->n_vocab) /* s->cand holds the m best and the gathered */
        return -1;
    *m = (int32_t)need;
    *temperature = greedy ? 1.0f : s->p.temperature;
    return n;
}

static int cmp_cand_id(const void *a, const void *b)
{
    int32_t x = ((const struct sampler_cand *)a)->id, y = ((const struct sampler_cand *)b)->id;
    return (x > y) - (x < y);
}

int32_t sampler_sample_subset(struct qwenrt_sampler *s, const int32_t *ids, const float *vals, int32_t m,
                              const int32_t *gather, const float *gather_vals, int32_t n_gather)
{
    struct sampler_cand *c = s->cand;
    int32_t n = 0;
    for (int32_t i = 0; i < m + n_gather; i++) {
        c[n].id = i < m ? ids[i] : gather[i - m];
        c[n].logit = i < m ? vals[i] : gather_vals[i - m];
        n++;
    }
    qsort(c, (size_t)n, sizeof(*c), cmp_cand_id);
    int32_t u = 0; /* drop repeated ids (a gathered token that is also among the best) */
    for (int32_t i = 0; i < n; i++)
        if (!u || c[i].id != c[u - 1].id)
            c[u++] = c[i];
    apply_bias_and_penalties(s, c, u);
    if (s->p.temperature <= 0.0f)
        return argmax_cand(c, u);
    scale_by_temperature(s, u);
    return draw(s, filter_with_top_k(s, u));
}

/* ------------------------------------------------------------------ draws made on the GPU */

bool sampler_device_plan(const struct qwenrt_sampler *s, int32_t max_k, struct cuda_sample_params *out)
{
    if (s->p.n_logit_bias > 0 || penalties_on(s))
        return false;
    bool greedy = s->p.temperature <= 0.0f;
    if (!greedy && (s->p.top_k < 1 || s->p.top_k >= max_k))
        return false;
    memset(out, 0, sizeof(*out));
    out->temperature = greedy ? 0.0f : s->p.temperature;
    out->top_k = greedy ? 1 : s->p.top_k;
    out->top_p = s->p.top_p;
    out->min_p = s->p.min_p;
    out->rng = s->rng;
    return true;
}

void sampler_skip_draws(struct qwenrt_sampler *s, int32_t n)
{
    s->rng += (uint64_t)(int64_t)n * SAMPLER_GOLDEN; /* modulo 2^64: n < 0 goes back */
}
