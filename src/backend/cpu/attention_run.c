/*
 * attention_run.c — the op-level loop the vector attention kernels share (attention_avx512.c,
 * attention_avx2.c): the step's new K and V rows into the cache, then every (token, head)
 * through the kernel's head function — on the calling thread for a short decode (16 heads x a
 * few dozen positions is ~10 us of work, less than an OpenMP fork/join on a shared machine),
 * across threads once the work or the cache rows read grow (one core streams the cache at a
 * fraction of the machine's bandwidth). Each (token, head) sums in a fixed order, so the
 * thread count never shows in the results.
 */
#include <math.h>
#include <omp.h>

#include "backend/cpu/cpu_backend.h"

#define SERIAL_MAX_WORK 65536 /* T x positions x heads below which one thread does it all... */
#define SERIAL_MAX_BYTES (512 * 1024) /* ...unless it reads more of the cache than this: at ~10 GB/s
                                       * one core needs ~50 us for it, more than a fork/join */

/* Position p's K and V rows into layer l's cache: f32, or f16 bits through to_f16. */
static void store_kv(struct seq_state *s, int32_t l, int32_t p, const float *k, const float *v,
                     attention_store_fn to_f16)
{
    if (!s->kv_f16) {
        kv_store_row(s, l, false, p, k);
        kv_store_row(s, l, true, p, v);
        return;
    }
    size_t at = (size_t)p * (size_t)s->kv_width;
    to_f16(s->k_cache16[l] + at, k, s->kv_width);
    to_f16(s->v_cache16[l] + at, v, s->kv_width);
}

void attention_run(const struct plan_op *op, struct cpu_exec *ex, attention_store_fn to_f16,
                   attention_head_fn head)
{
    struct seq_state *s = ex->state;
    int32_t hd = op->head_dim, kvw = s->kv_width, group = op->n_head / op->n_head_kv;
    int32_t l = op->layer;
    const float *kc = s->kv_f16 ? NULL : s->k_cache[l], *vc = s->kv_f16 ? NULL : s->v_cache[l];
    const uint16_t *kh = s->kv_f16 ? s->k_cache16[l] : NULL, *vh = s->kv_f16 ? s->v_cache16[l] : NULL;
    const float *kin = ex->bufs[op->in2], *vin = ex->bufs[op->in3];
    int32_t wk = ex->plan->bufs[op->in2].width, wv = ex->plan->bufs[op->in3].width;
    for (int32_t t = 0; t < ex->T; t++)
        store_kv(s, l, ex->pos0 + t, kin + (size_t)t * wk, vin + (size_t)t * wv, to_f16);
    float scale = 1.0f / sqrtf((float)hd);
    int32_t n_pos = ex->pos0 + ex->T;
    int32_t wq = ex->plan->bufs[op->in].width, wo = ex->plan->bufs[op->out].width;
    const float *qb = ex->bufs[op->in];
    float *ob = ex->bufs[op->out];
    int64_t work = (int64_t)ex->T * n_pos * op->n_head;
    int64_t bytes = (int64_t)n_pos * kvw * 2 * (s->kv_f16 ? 2 : 4); /* K and V rows read */
#pragma omp parallel num_threads(ex->n_threads) if (work > SERIAL_MAX_WORK || bytes > SERIAL_MAX_BYTES)
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
