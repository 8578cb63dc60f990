/*
 * gdn_step.cuh — one token of the Gated DeltaNet decode step, shared by the kernels that hold
 * the state in registers (gdn_core_kernel in gdn_ops.cu, the cluster-split gds_kernel in
 * gdn_decode.cu): the causal conv of one channel (gdn_conv_token, gdn_conv_store; its sum,
 * gdn_conv_dot, also serves the prefill conv's token loop) and the recurrence of one state
 * column (gdn_column_step).
 *
 * gdn_column_step: a thread owns rows sub, sub + TPC, ... (nr of them, at most MAXR) of a
 * column S[.][c] of the head's state; the TPC lanes of a column are adjacent in the warp. With
 * q and k L2-normalised in shared memory (qs, ks):
 *     S *= decay;  m = S^T k (column c);  delta = beta * (v - m);  S += k delta;  o = S^T q.
 * The row sums reduce over the column's lanes with shuffles; every lane returns o.
 */
#ifndef QWENRT_BACKEND_CUDA_GDN_STEP_CUH
#define QWENRT_BACKEND_CUDA_GDN_STEP_CUH

#include "backend/cuda/cuda_device.cuh"
#include "backend/cuda/cuda_internal.cuh"

#define GDN_CONV_MAX_K 8 /* conv taps the kernels take */

/* One conv output before its SiLU: the R = K - 1 window values times their taps, then the
 * new input times the last tap, in that order (the prefill's token loop and the decode step
 * sum alike). */
__device__ __forceinline__ float gdn_conv_dot(const float (&tap)[GDN_CONV_MAX_K], const float (&win)[GDN_CONV_MAX_K],
                                              float in, int R)
{
    float acc = 0.0f;
#pragma unroll
    for (int r = 0; r < GDN_CONV_MAX_K; r++)
        if (r < R)
            acc += tap[r] * win[r];
#pragma unroll
    for (int r = 0; r < GDN_CONV_MAX_K; r++)
        if (r == R)
            acc += tap[r] * in;
    return acc;
}

/* Channel ch's conv taps and window (the R = K - 1 inputs before this token, from the conv
 * state): everything of the conv but this token's input, so a kernel may load them before
 * its wait where the state is certainly written (gds_kernel with gdn_args.early). */
struct gdn_conv_in {
    float tap[GDN_CONV_MAX_K], win[GDN_CONV_MAX_K];
};

/* (conv_state: the window's rows, a.conv_state or another session's: gdn_args.seq) */
__device__ __forceinline__ void gdn_conv_load_at(const struct gdn_args &a, const float *conv_state, int ch,
                                                 struct gdn_conv_in &c)
{
    int C = a.conv_C, R = a.conv_k - 1;
    const float *tap = a.conv_taps + (int64_t)ch * a.conv_k;
#pragma unroll
    for (int r = 0; r < GDN_CONV_MAX_K; r++) {
        c.tap[r] = r <= R ? tap[r] : 0.0f;
        c.win[r] = r < R ? conv_state[(int64_t)r * C + ch] : 0.0f;
    }
}

__device__ __forceinline__ void gdn_conv_load(const struct gdn_args &a, int ch, struct gdn_conv_in &c)
{
    gdn_conv_load_at(a, a.conv_state, ch, c);
}

/* The conv output (silu after) of input in with c, and the channel's shifted window in
 * win[0 .. R-1] for gdn_conv_store. */
__device__ __forceinline__ float gdn_conv_finish(const struct gdn_args &a, const struct gdn_conv_in &c, float in,
                                                 float (&win)[GDN_CONV_MAX_K])
{
    int R = a.conv_k - 1;
    float acc = gdn_conv_dot(c.tap, c.win, in, R);
#pragma unroll
    for (int r = 0; r < GDN_CONV_MAX_K - 1; r++)
        win[r] = r < R - 1 ? c.win[r + 1] : r == R - 1 ? in : 0.0f;
    return silu_f(acc);
}

/* One token of the causal conv of channel ch on qkv (gdn_conv_kernel's order; silu after):
 * the output, and the channel's shifted window in win[0 .. R-1] for gdn_conv_store. */
__device__ __forceinline__ float gdn_conv_token(const struct gdn_args &a, int ch, float (&win)[GDN_CONV_MAX_K])
{
    struct gdn_conv_in c;
    gdn_conv_load(a, ch, c);
    return gdn_conv_finish(a, c, a.qkv[ch], win);
}

/* Stores channel ch's conv output y (in place on qkv) and its shifted window. */
/* (conv_state, qkv: a's or another session's, gdn_args.seq) */
__device__ __forceinline__ void gdn_conv_store_at(const struct gdn_args &a, float *conv_state, float *qkv, int ch,
                                                  float y, const float (&win)[GDN_CONV_MAX_K])
{
    int R = a.conv_k - 1;
#pragma unroll
    for (int r = 0; r < GDN_CONV_MAX_K - 1; r++)
        if (r < R)
            conv_state[(int64_t)r * a.conv_C + ch] = win[r];
    qkv[ch] = y;
}

__device__ __forceinline__ void gdn_conv_store(const struct gdn_args &a, int ch, float y, const float (&win)[GDN_CONV_MAX_K])
{
    gdn_conv_store_at(a, a.conv_state, (float *)a.qkv, ch, y, win);
}


template <int TPC, int MAXR>
__device__ __forceinline__ float gdn_column_step(float (&s)[MAXR], int nr, int sub, const float *ks, const float *qs,
                                                 float decay, float beta, float v)
{
    float mpart = 0.0f;
#pragma unroll
    for (int i = 0; i < MAXR; i++)
        if (i < nr) {
            s[i] *= decay;
            mpart += s[i] * ks[sub + TPC * i];
        }
#pragma unroll
    for (int o = 1; o < TPC; o <<= 1)
        mpart += __shfl_xor_sync(0xffffffffu, mpart, o);
    float delta = beta * (v - mpart), opart = 0.0f;
#pragma unroll
    for (int i = 0; i < MAXR; i++)
        if (i < nr) {
            s[i] += ks[sub + TPC * i] * delta;
            opart += s[i] * qs[sub + TPC * i];
        }
#pragma unroll
    for (int o = 1; o < TPC; o <<= 1)
        opart += __shfl_xor_sync(0xffffffffu, opart, o);
    return opart;
}

#endif
