/*
 * attention_avx512.c — attention.avx512: causal softmax attention over the f32 KV cache with
 * AVX-512 dot products; the same maths and layout as attention_ref (kernels_ref.c), which
 * stays the oracle (tests/test_attention_avx512.c).
 *
 * attention_ref's q·k loop is a serial f32 sum (no reassociation without -ffast-math), so it
 * runs at one multiply-add per 4 cycles: at prefill 128 that is most of the non-matmul time.
 * Here q·k uses 16-lane partial sums (a fixed order per (token, head), independent of the
 * thread split, so results are deterministic across thread counts); softmax and the weighted
 * sum of V are vectorised the same way. Decode (T = 1) with a short context runs on the
 * calling thread: 16 heads x a few hundred positions is ~10 µs of work, less than what an
 * OpenMP fork/join costs on this shared machine.
 * An f16 cache (seq_state.kv_f16) is read 16 elements at a time through vcvtph2ps (AVX-512F)
 * and written through vcvtps2ph (the same bits as kv_store_row's rounding); the sums run in the
 * same order as for f32.
 */
#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <string.h>

#include "backend/cpu/cpu_backend.h"

#define TARGET __attribute__((target("avx512f,avx2,fma")))
#define SERIAL_MAX_WORK 65536 /* T x positions x heads below which one thread does it all */

static TARGET float dot16(const float *a, const float *b, int32_t n)
{
    __m512 acc = _mm512_setzero_ps();
    int32_t d = 0;
    for (; d + 16 <= n; d += 16)
        acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + d), _mm512_loadu_ps(b + d), acc);
    if (d < n) {
        __mmask16 m = (__mmask16)((1u << (n - d)) - 1);
        acc =
            _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + d), _mm512_maskz_loadu_ps(m, b + d), acc);
    }
    return _mm512_reduce_add_ps(acc);
}

/* o[d] += w·v[d] */
static TARGET void axpy16(float *o, float w, const float *v, int32_t n)
{
    __m512 wv = _mm512_set1_ps(w);
    int32_t d = 0;
    for (; d + 16 <= n; d += 16)
        _mm512_storeu_ps(o + d,
                         _mm512_fmadd_ps(wv, _mm512_loadu_ps(v + d), _mm512_loadu_ps(o + d)));
    for (; d < n; d++)
        o[d] += w * v[d];
}

/* 16 f16 values as floats; n < 16: the first n, zeros after (read through a zeroed copy: no
 * byte past the row is touched) */
static TARGET __m512 load16h(const uint16_t *h, int32_t n)
{
    if (n >= 16)
        return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)h));
    uint16_t t[16] = {0};
    memcpy(t, h, (size_t)n * sizeof(uint16_t));
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)t));
}

/* dot16 with b an f16 row */
static TARGET float dot16h(const float *a, const uint16_t *b, int32_t n)
{
    __m512 acc = _mm512_setzero_ps();
    int32_t d = 0;
    for (; d + 16 <= n; d += 16)
        acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + d), load16h(b + d, 16), acc);
    if (d < n) {
        __mmask16 m = (__mmask16)((1u << (n - d)) - 1);
        acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + d), load16h(b + d, n - d), acc);
    }
    return _mm512_reduce_add_ps(acc);
}

/* axpy16 with v an f16 row */
static TARGET void axpy16h(float *o, float w, const uint16_t *v, int32_t n)
{
    __m512 wv = _mm512_set1_ps(w);
    int32_t d = 0;
    for (; d + 16 <= n; d += 16)
        _mm512_storeu_ps(o + d, _mm512_fmadd_ps(wv, load16h(v + d, 16), _mm512_loadu_ps(o + d)));
    for (; d < n; d++)
        o[d] += w * f16_to_f32(v[d]);
}

/* n floats into f16 bits, 16 at a time with vcvtps2ph (round to nearest even, as
 * f32_to_f16; NaN payloads aside), the tail one by one. kv_store_row converts one value at a
 * time: ~10% of a short prompt's time at Qwen3-0.6B's widths (docs/perf-log.md, session 16). */
static TARGET void store16h(uint16_t *dst, const float *src, int32_t n)
{
    int32_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm256_storeu_si256((__m256i *)(dst + i),
                            _mm512_cvtps_ph(_mm512_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    for (; i < n; i++)
        dst[i] = f32_to_f16(src[i]);
}

/* Position p's K and V rows into layer l's cache (f32, or f16 bits with kv_f16). */
static TARGET void store_kv(struct seq_state *s, int32_t l, int32_t p, const float *k, const float *v)
{
    if (!s->kv_f16) {
        kv_store_row(s, l, false, p, k);
        kv_store_row(s, l, true, p, v);
        return;
    }
    size_t at = (size_t)p * (size_t)s->kv_width;
    store16h(s->k_cache16[l] + at, k, s->kv_width);
    store16h(s->v_cache16[l] + at, v, s->kv_width);
}

/* One (token, head): scores over positions 0..last, softmax, weighted sum of V; the cache's
 * rows are f32 (kc, vc) or f16 (kh, vh: the others NULL). */
static TARGET void head(const float *q, float *o, const float *kc, const float *vc, const uint16_t *kh,
                        const uint16_t *vh, int32_t kvw, int32_t off, int32_t hd, int32_t last, float scale,
                        float *scores)
{
    float mx = -INFINITY, sum = 0.0f;
    for (int32_t p = 0; p <= last; p++) {
        size_t at = (size_t)p * kvw + off;
        scores[p] = (kh ? dot16h(q, kh + at, hd) : dot16(q, kc + at, hd)) * scale;
        mx = scores[p] > mx ? scores[p] : mx;
    }
    for (int32_t p = 0; p <= last; p++) {
        scores[p] = expf(scores[p] - mx);
        sum += scores[p];
    }
    memset(o, 0, (size_t)hd * sizeof(float));
    for (int32_t p = 0; p <= last; p++) {
        size_t at = (size_t)p * kvw + off;
        if (vh)
            axpy16h(o, scores[p] / sum, vh + at, hd);
        else
            axpy16(o, scores[p] / sum, vc + at, hd);
    }
}

void attention_avx512(const struct plan_op *op, struct cpu_exec *ex)
{
    struct seq_state *s = ex->state;
    int32_t hd = op->head_dim, kvw = s->kv_width, group = op->n_head / op->n_head_kv;
    int32_t l = op->layer;
    const float *kc = s->kv_f16 ? NULL : s->k_cache[l], *vc = s->kv_f16 ? NULL : s->v_cache[l];
    const uint16_t *kh = s->kv_f16 ? s->k_cache16[l] : NULL, *vh = s->kv_f16 ? s->v_cache16[l] : NULL;
    const float *kin = ex->bufs[op->in2], *vin = ex->bufs[op->in3];
    int32_t wk = ex->plan->bufs[op->in2].width, wv = ex->plan->bufs[op->in3].width;
    for (int32_t t = 0; t < ex->T; t++)
        store_kv(s, l, ex->pos0 + t, kin + (size_t)t * wk, vin + (size_t)t * wv);
    float scale = 1.0f / sqrtf((float)hd);
    int32_t n_pos = ex->pos0 + ex->T;
    int32_t wq = ex->plan->bufs[op->in].width, wo = ex->plan->bufs[op->out].width;
    const float *qb = ex->bufs[op->in];
    float *ob = ex->bufs[op->out];
    int64_t work = (int64_t)ex->T * n_pos * op->n_head;
#pragma omp parallel num_threads(ex->n_threads) if (work > SERIAL_MAX_WORK)
    {
        float *scores = ex->scratch + (size_t)n_pos * (size_t)omp_get_thread_num();
#pragma omp for collapse(2) schedule(dynamic, 1)
        for (int32_t t = 0; t < ex->T; t++)
            for (int32_t h = 0; h < op->n_head; h++)
                head(qb + (size_t)t * wq + (size_t)h * op->q_stride,
                     ob + (size_t)t * wo + (size_t)h * hd, kc, vc, kh, vh, kvw, (h / group) * hd, hd,
                     ex->pos0 + t, scale, scores);
    }
}
