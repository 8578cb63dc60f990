/*
 * sampler.h — internal parts of the sampler (the public API is in qwenrt.h): the candidate
 * filters, exposed so tests can check each one on its own.
 */
#ifndef QWENRT_RUNTIME_SAMPLER_H
#define QWENRT_RUNTIME_SAMPLER_H

#include <stdint.h>

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

#endif
