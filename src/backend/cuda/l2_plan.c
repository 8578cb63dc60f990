/*
 * l2_plan.c — the spans of weights the decode launches ask the L2 for (l2_plan.h has the rule).
 */
#include "backend/cuda/l2_plan.h"

struct l2_span l2_stream_span(const struct l2_piece *pieces, int32_t n, int64_t lo, int64_t hi)
{
    struct l2_span r = {0, 0};
    uintptr_t a0 = 0, b0 = 0, first = UINTPTR_MAX, last = 0; /* the first piece; the envelope */
    int64_t off = 0;
    for (int32_t i = 0; i < n && off < hi; off += pieces[i].bytes, i++) {
        int64_t s = lo > off ? lo : off, e = off + pieces[i].bytes < hi ? off + pieces[i].bytes : hi;
        if (s >= e)
            continue;
        uintptr_t a = (uintptr_t)pieces[i].w + (uintptr_t)(s - off), b = (uintptr_t)pieces[i].w + (uintptr_t)(e - off);
        if (!b0)
            a0 = a, b0 = b;
        first = a < first ? a : first;
        last = b > last ? b : last;
    }
    if (!b0)
        return r;
    if (last - first > 2 * (uint64_t)(hi - lo))
        first = a0, last = b0;
    first = (first + 15) & ~(uintptr_t)15, last &= ~(uintptr_t)15;
    if (last > first && last - first <= UINT32_MAX)
        r.p = (const void *)first, r.bytes = (uint32_t)(last - first);
    return r;
}

void l2_plan_make(const struct l2_piece *pieces, const struct l2_step *steps, int32_t n_steps, int64_t window,
                  struct l2_span *out)
{
    int32_t n_pieces = 0;
    int64_t total = 0;
    for (int32_t i = 0; i < n_steps; i++)
        for (int32_t k = 0; k < steps[i].n_pieces; k++)
            total += pieces[n_pieces++].bytes;
    int64_t start = 0, done = 0; /* step i's first byte in the stream; the stream asked for up to done */
    for (int32_t i = 0, p = 0; i < n_steps; i++) {
        int64_t next = start;
        for (int32_t k = 0; k < steps[i].n_pieces; k++)
            next += pieces[p++].bytes;
        out[i].p = 0, out[i].bytes = 0;
        if (steps[i].issues && window > 0) {
            int64_t lo = done > next ? done : next, hi = start + window < total ? start + window : total;
            if (lo < hi)
                out[i] = l2_stream_span(pieces, n_pieces, lo, hi);
            if (hi > done)
                done = hi;
        }
        start = next;
    }
}
