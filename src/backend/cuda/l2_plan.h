/*
 * l2_plan.h — which weights each decode launch of the CUDA backend asks the L2 for
 * (cuda_options.l2_prefetch_mb). Host code, C, built with or without CUDA so that its rules are
 * tested on any machine (tests/test_l2_plan.c); decode_program.cu hands the spans to the kernels,
 * whose blocks share them out (l2_prefetch_share in cuda_internal.cuh).
 *
 * The weight stream is every step's own matrices back to back in program order (the LM head is
 * not in it: decode_program.cu leaves it out). With a window of W bytes, each step whose launch
 * can issue a prefetch asks for the stream up to W past its own start, from where the last such
 * step stopped, and never its own bytes (its launch streams those itself): in steady state each
 * step asks for as many bytes as the step before it streamed, W ahead. A span is one stretch of
 * memory: the arena holds the layers in program order, so a part of the stream is the memory
 * from its first byte to its last (with the small vectors between matrices); where that
 * stretch is more than twice the part (matrices not in order), only the part's first matrix's
 * piece. Starts are rounded up and ends down to 16 bytes (the bulk prefetch's unit).
 */
#ifndef QWENRT_BACKEND_CUDA_L2_PLAN_H
#define QWENRT_BACKEND_CUDA_L2_PLAN_H

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* One weight matrix of the stream: its first byte and its size. */
struct l2_piece {
    const void *w;
    int64_t bytes;
};

/* One decode step: its own matrices (the next n_pieces of the stream) and whether its launch
 * issues a prefetch. */
struct l2_step {
    int32_t n_pieces;
    bool issues;
};

/* What a step's launch asks for: bytes from p (0: nothing). */
struct l2_span {
    const void *p;
    uint32_t bytes;
};

/* out[i] for each of the n_steps steps (pieces: the steps' matrices in order), window W bytes
 * (0 or less: nothing anywhere). */
void l2_plan_make(const struct l2_piece *pieces, const struct l2_step *steps, int32_t n_steps, int64_t window,
                  struct l2_span *out);

/* The span of the part [lo, hi) of the stream of n pieces. */
struct l2_span l2_stream_span(const struct l2_piece *pieces, int32_t n, int64_t lo, int64_t hi);

#ifdef __cplusplus
}
#endif

#endif
