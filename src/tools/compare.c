/*
 * compare.c — KL divergence and top-1 agreement of two models over one sequence (compare.h).
 *
 * Both sessions process the same ids in chunks of up to 64 tokens with all logits; per
 * position the softmaxes are computed in double. KL(P_ref || P_cand) = Σ p_ref (log p_ref -
 * log p_cand), so a candidate that puts too little mass where the reference puts a lot pays.
 */
#include "tools/compare.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/error.h"

#define CHUNK 64

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* log-softmax normaliser: max and log Σ exp(x - max) */
static void log_norm(const float *x, int32_t n, double *mx, double *lse)
{
    double m = x[0], s = 0.0;
    for (int32_t i = 1; i < n; i++)
        m = x[i] > m ? x[i] : m;
    for (int32_t i = 0; i < n; i++)
        s += exp((double)x[i] - m);
    *mx = m;
    *lse = log(s);
}

static double kl_divergence(const float *ref, const float *cand, int32_t n)
{
    double mr, lr, mc, lc, kl = 0.0;
    log_norm(ref, n, &mr, &lr);
    log_norm(cand, n, &mc, &lc);
    for (int32_t i = 0; i < n; i++) {
        double lp = (double)ref[i] - mr - lr, lq = (double)cand[i] - mc - lc;
        kl += exp(lp) * (lp - lq);
    }
    return kl > 0.0 ? kl : 0.0;
}

qwenrt_status compare_models(struct qwenrt_model *cand, struct qwenrt_model *ref,
                             const int32_t *ids, int32_t n, int n_threads, int32_t precision,
                             struct compare_result *out, struct qwenrt_error *err)
{
    struct qwenrt_model_info ic, ir;
    qwenrt_model_get_info(cand, &ic);
    qwenrt_model_get_info(ref, &ir);
    if (ic.n_vocab != ir.n_vocab || strcmp(ic.arch, ir.arch))
        return err_set(err, QWENRT_ERR_INVALID_ARG, "compare: models differ in architecture or vocabulary (%s/%d vs %s/%d)",
                       ic.arch, ic.n_vocab, ir.arch, ir.n_vocab);
    int32_t V = ic.n_vocab;
    struct qwenrt_session_params sp = qwenrt_session_default_params();
    sp.n_ctx = n;
    sp.n_threads = n_threads;
    sp.kv_type = QWENRT_KV_F32; /* both sessions alike: the weights are what is compared */
    struct qwenrt_session *sc = NULL, *sr = NULL;
    float *lc = xmalloc((size_t)CHUNK * V, sizeof(float)), *lr = xmalloc((size_t)CHUNK * V, sizeof(float));
    double *kls = xmalloc((size_t)n, sizeof(double)), num = 0.0, den = 0.0;
    int32_t agree = 0;
    qwenrt_status st = QWENRT_OK;
    if (!lc || !lr || !kls) {
        st = err_set(err, QWENRT_ERR_NOMEM, "compare: out of memory");
        goto out;
    }
    struct qwenrt_session_params spc = sp;
    spc.precision = precision;
    if ((st = qwenrt_session_init(cand, &spc, &sc, err)) || (st = qwenrt_session_init(ref, &sp, &sr, err)))
        goto out;
    for (int32_t p0 = 0; p0 < n; p0 += CHUNK) {
        int32_t m = n - p0 < CHUNK ? n - p0 : CHUNK;
        if ((st = qwenrt_session_prefill(sc, ids + p0, m, lc, err)) ||
            (st = qwenrt_session_prefill(sr, ids + p0, m, lr, err)))
            goto out;
        for (int32_t t = 0; t < m; t++) {
            const float *a = lc + (size_t)t * V, *b = lr + (size_t)t * V;
            kls[p0 + t] = kl_divergence(b, a, V);
            agree += qwenrt_argmax(a, V) == qwenrt_argmax(b, V);
            for (int32_t i = 0; i < V; i++) {
                double d = (double)a[i] - b[i];
                num += d * d;
                den += (double)b[i] * b[i];
            }
        }
    }
    memset(out, 0, sizeof(*out));
    out->n_positions = n;
    for (int32_t i = 0; i < n; i++) {
        out->kl_mean += kls[i] / n;
        out->kl_max = kls[i] > out->kl_max ? kls[i] : out->kl_max;
    }
    qsort(kls, (size_t)n, sizeof(double), cmp_double);
    out->kl_p99 = kls[(size_t)((n - 1) * 0.99)];
    out->top1_agreement = (double)agree / n;
    out->logits_rel_err = sqrt(num / (den > 0 ? den : 1e-300));
out:
    qwenrt_session_free(sc);
    qwenrt_session_free(sr);
    xfree(lc);
    xfree(lr);
    xfree(kls);
    return st;
}
