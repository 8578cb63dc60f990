/*
 * fit.c — candidate-scale grid searches with least-squares refits (see fit.h).
 *
 * Sym: for the signed extreme value xm (largest |x|), candidate inverse scales are
 * (qmin − δ)/xm and (qmax + δ)/xm for δ in a small grid, so the extreme maps to either end of
 * the level range. For levels L the best d is Σwxl/Σwl² and the error is Σwx² − (Σwxl)²/Σwl²,
 * so candidates are ranked by (Σwxl)²/Σwl². Affine: candidates (nmax + δ)/(max − min); for
 * levels L the 2x2 normal equations give (d, −m), clamped so that m ≥ 0.
 */
#include "quant/fit.h"

#include <math.h>
#include <string.h>

#define FIT_MAX_N 64 /* largest group any format fits at once (32 today) */

static inline int clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

void fit_levels_sym(int n, const float *x, int qmin, int qmax, float d, int8_t *L)
{
    float id = d != 0.0f ? 1.0f / d : 0.0f;
    for (int i = 0; i < n; i++)
        L[i] = (int8_t)clampi((int)lrintf(x[i] * id), qmin, qmax);
}

float fit_err_sym(int n, const float *x, const float *w, const int8_t *L, float d)
{
    float e = 0.0f;
    for (int i = 0; i < n; i++) {
        float r = x[i] - d * (float)L[i];
        e += w[i] * r * r;
    }
    return e;
}

/* Levels for inverse scale id, then the least-squares d; returns the ranking score. */
static float sym_try(int n, const float *x, const float *w, int qmin, int qmax, float id,
                     int8_t *L, float *d)
{
    double sxl = 0, sll = 0;
    for (int i = 0; i < n; i++) {
        int l = clampi((int)lrintf(x[i] * id), qmin, qmax);
        L[i] = (int8_t)l;
        sxl += (double)w[i] * x[i] * l;
        sll += (double)w[i] * l * l;
    }
    if (sll <= 0) {
        *d = 0.0f;
        return 0.0f;
    }
    *d = (float)(sxl / sll);
    return (float)(sxl * sxl / sll);
}

float fit_scale_sym(int n, const float *x, const float *w, int qmin, int qmax, int8_t *L)
{
    if (n <= 0 || n > FIT_MAX_N)
        return 0.0f; /* callers pass fixed group sizes; this keeps the buffers in bounds */
    float xm = 0.0f;
    for (int i = 0; i < n; i++)
        if (fabsf(x[i]) > fabsf(xm))
            xm = x[i];
    memset(L, 0, (size_t)n);
    if (fabsf(xm) < 1e-30f)
        return 0.0f;
    int8_t cand[FIT_MAX_N];
    float best = -1.0f, best_d = 0.0f;
    for (int end = 0; end < 2; end++) {
        float q = end == 0 ? (float)qmin : (float)qmax;
        float dir = end == 0 ? -1.0f : 1.0f;
        for (int s = -10; s <= 10; s++) {
            float d;
            float score = sym_try(n, x, w, qmin, qmax, (q + dir * 0.1f * (float)s) / xm, cand, &d);
            if (d != 0.0f) /* one Lloyd step: re-quantise with the fitted scale, refit */
                score = fmaxf(score, sym_try(n, x, w, qmin, qmax, 1.0f / d, cand + 0, &d));
            if (score > best) {
                best = score;
                best_d = d;
            }
        }
    }
    if (best_d == 0.0f)
        return 0.0f;
    /* Levels for the best d (optimal rounding for it), then the least-squares d for those
     * levels: each step can only lower the error. */
    float d;
    sym_try(n, x, w, qmin, qmax, 1.0f / best_d, L, &d);
    return d;
}

void fit_levels_affine(int n, const float *x, int nmax, float d, float m, uint8_t *L)
{
    float id = d > 0.0f ? 1.0f / d : 0.0f;
    for (int i = 0; i < n; i++)
        L[i] = (uint8_t)clampi((int)lrintf((x[i] + m) * id), 0, nmax);
}

float fit_err_affine(int n, const float *x, const float *w, const uint8_t *L, float d, float m)
{
    float e = 0.0f;
    for (int i = 0; i < n; i++) {
        float r = d * (float)L[i] - m - x[i];
        e += w[i] * r * r;
    }
    return e;
}

/* Least-squares (d, m) for fixed levels, with m ≥ 0 (d·L − m ≈ x). */
static void affine_refit(int n, const float *x, const float *w, const uint8_t *L, float *d,
                         float *m)
{
    double sw = 0, sl = 0, sll = 0, sx = 0, sxl = 0;
    for (int i = 0; i < n; i++) {
        sw += w[i];
        sl += (double)w[i] * L[i];
        sll += (double)w[i] * L[i] * L[i];
        sx += (double)w[i] * x[i];
        sxl += (double)w[i] * x[i] * L[i];
    }
    double det = sw * sll - sl * sl;
    double a = 0, b = 0; /* x ≈ a·L + b */
    if (det > 0) {
        a = (sw * sxl - sl * sx) / det;
        b = (sll * sx - sl * sxl) / det;
    }
    if (det <= 0 || b > 0) { /* min must be ≤ 0: fit a·L alone */
        b = 0;
        a = sll > 0 ? sxl / sll : 0;
    }
    *d = (float)a;
    *m = (float)-b;
}

void fit_scale_min(int n, const float *x, const float *w, int nmax, uint8_t *L, float *d,
                   float *m)
{
    if (n <= 0 || n > FIT_MAX_N) { /* callers pass fixed group sizes */
        *d = *m = 0.0f;
        return;
    }
    float lo = x[0], hi = x[0];
    for (int i = 1; i < n; i++) {
        lo = fminf(lo, x[i]);
        hi = fmaxf(hi, x[i]);
    }
    lo = fminf(lo, 0.0f);
    if (hi <= lo) { /* all equal and ≤ 0 */
        memset(L, 0, (size_t)n);
        *d = 0.0f;
        *m = -lo;
        return;
    }
    uint8_t cand[FIT_MAX_N];
    /* start: plain min/max mapping */
    *d = (hi - lo) / (float)nmax;
    *m = -lo;
    fit_levels_affine(n, x, nmax, *d, *m, L);
    float best = fit_err_affine(n, x, w, L, *d, *m);
    for (int s = -10; s <= 10; s++) {
        float cd = (hi - lo) / ((float)nmax + 0.1f * (float)s), cm = -lo;
        if (cd <= 0.0f)
            continue;
        for (int it = 0; it < 2; it++) { /* quantise, refit, quantise again, refit */
            fit_levels_affine(n, x, nmax, cd, cm, cand);
            affine_refit(n, x, w, cand, &cd, &cm);
            if (cd <= 0.0f)
                break;
            float e = fit_err_affine(n, x, w, cand, cd, cm);
            if (e < best) {
                best = e;
                *d = cd;
                *m = cm;
                memcpy(L, cand, (size_t)n);
            }
        }
    }
}
