/*
 * fit.h — scale searches shared by the quantisers (q4_0.c, k_quants.c).
 *
 * Each fit chooses integer levels L for n values x so that the weighted squared error
 * Σ w·(x − value(L))² is small, by trying a grid of candidate scales, refitting the scale
 * (and min) by weighted least squares for the levels each candidate gives, and keeping the
 * best. The searches mirror the ideas of llama.cpp's make_qx_quants / make_qkx2_quants, with
 * a wider grid and one extra re-quantise-and-refit pass per candidate.
 */
#ifndef QWENRT_QUANT_FIT_H
#define QWENRT_QUANT_FIT_H

#include <stdint.h>

/* Symmetric fit: value = d·L with L in [qmin, qmax] (qmin < 0 < qmax). Writes L, returns d
 * (0 with all L = 0 when x is all zero). */
float fit_scale_sym(int n, const float *x, const float *w, int qmin, int qmax, int8_t *L);

/* Asymmetric fit: value = d·L − m with L in [0, nmax], d ≥ 0, m ≥ 0 (so that 0 is
 * representable when the values straddle it). Writes L, *d and *m. */
void fit_scale_min(int n, const float *x, const float *w, int nmax, uint8_t *L, float *d,
                   float *m);

/* Weighted squared error of value = d·L − m for the given levels. */
float fit_err_affine(int n, const float *x, const float *w, const uint8_t *L, float d, float m);

/* Levels for a fixed (d, m): L = clamp(round((x + m) / d), 0, nmax); all 0 when d == 0. */
void fit_levels_affine(int n, const float *x, int nmax, float d, float m, uint8_t *L);

/* Levels for a fixed d: L = clamp(round(x / d), qmin, qmax); all 0 when d == 0. */
void fit_levels_sym(int n, const float *x, int qmin, int qmax, float d, int8_t *L);

/* Weighted squared error of value = d·L. */
float fit_err_sym(int n, const float *x, const float *w, const int8_t *L, float d);

#endif
