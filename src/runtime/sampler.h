/*
 * sampler.h — internal parts of the sampler (the public API is in qwenrt.h): the candidate
 * filters, exposed so tests can check each one on its own.
 */
#ifndef QWENRT_RUNTIME_SAMPLER_H
#define QWENRT_RUNTIME_SAMPLER_H

#include <stdint.h>

#include "backend/cuda/cuda_backend.h"
#include "qwenrt.h"

struct sampler_cand {
    int32_t id;
    float logit; /* after penalties and temperature */
    float p;     /* probability after softmax over the kept candidates */
};

/* Keeps the k highest logits (sorted descending); returns the new count. k <= 0: keeps all,
 * sorted. */
int32_t sampler_top_k(struct sampler_cand *c, int32_t n, int32_t k);
/* softmax over c[0..n) (sorted descending) into c[i].p */
void sampler_softmax(struct sampler_cand *c, int32_t n);
/* Keeps the smallest prefix whose probability reaches top_p (at least one); renormalises. */
int32_t sampler_top_p(struct sampler_cand *c, int32_t n, float top_p);
/* Keeps candidates with p >= min_p * p_max; renormalises. */
int32_t sampler_min_p(struct sampler_cand *c, int32_t n, float min_p);

/* Sampling when only part of the logits row is at hand (a GPU session: sampling from the
 * whole row would copy 151,936 floats per token). sampler_subset_plan says what the next
 * draw needs: the ids whose raw logits must be gathered (logit bias and penalty targets:
 * returned count, written to gather, at most cap) and *m, how many best tokens by
 * (logit / *temperature, lower id first) — *temperature is 1 for greedy. -1: a subset cannot give
 * the same draw (no top-k with temperature > 0, m above max_m or the vocabulary, more than cap
 * ids to gather); sample from the whole row. sampler_sample_subset then draws from those m
 * best (ids, raw logits) and the gathered logits: the same token, RNG step and all, as
 * qwenrt_sampler_sample on the whole row. */
int32_t sampler_subset_plan(const struct qwenrt_sampler *s, int32_t *gather, int32_t cap, int32_t max_m,
                            int32_t *m, float *temperature);
int32_t sampler_sample_subset(struct qwenrt_sampler *s, const int32_t *ids, const float *vals, int32_t m,
                              const int32_t *gather, const float *gather_vals, int32_t n_gather);

/* Whether the GPU can make this sampler's next draws itself (cuda_session_generate_sampled):
 * temperature > 0, 1 <= top_k < max_k, no logit bias, penalties off; then *out holds the
 * parameters and the RNG state before the next draw. Greedy samplers (temperature <= 0)
 * without bias or penalties: true with out->temperature 0 (the GPU's argmax picks the same
 * token). */
bool sampler_device_plan(const struct qwenrt_sampler *s, int32_t max_k, struct cuda_sample_params *out);
/* Moves the RNG n draws on (n < 0: back), as if n draws were made or undone elsewhere. */
void sampler_skip_draws(struct qwenrt_sampler *s, int32_t n);
#endif
