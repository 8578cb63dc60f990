/*
 * gdn_chunked.cu — Gated DeltaNet prefill in chunks of GC tokens (the CPU's gdn_chunked.c form):
 * per token S ← d S; δ = β (v − Sᵀk); S ← S + k δᵀ; o = Sᵀq unrolls over a chunk (S0 before
 * it, G_i = Σ_{l<=i} g_l in double, D[i][s] = exp(G_i − G_s)) to
 *   U = Wv − Wk S0,  O = diag(e^G) Q S0 + Qk U,  S = e^{G_last} S0 + Kᵀ diag(e^{G_last − G}) U
 * with A[i][s] = β_i D[i][s] k_i·k_s (s < i), Wv = (I + A)⁻¹ diag(β) V, Wk = (I + A)⁻¹
 * diag(β e^G) K, Qk[i][s] = D[i][s] q_i·k_s (s <= i). The prep kernel makes Wv, Wk, Qk and G
 * for every (head, chunk) at once; the scan walks the chunks in order per (head, GC_COLS state
 * columns) with three small products per chunk. Decays are exps of differences of G, never
 * quotients. Scratch, after gdn_prep_kernel's: per (head, chunk) Wk [GC][dk], Wv [GC][dv],
 * Qk [GC][GC], G [GC]. Equal to the recurrence up to f32 rounding (test_cuda_ops, par 2 and 3).
 *
 * Two pairs of kernels: here with f32 FMA products (gdn_chunked = 1; correct, slower than the
 * column scan: 2.71 vs 2.02 ms of Qwen3.5's pp512, ncu prep 51 us and scan 90 us a layer against
 * ~15 and ~25 us of issue, latency-bound on shared memory and barriers: docs/perf-log.md,
 * session 6), and gdn_chunk_tc.cuh's on the tensor cores in 3xTF32 (gdn_chunked = 2, session
 * 51; on the H200 in session 52: correct, scan 64 us and prep 36 us a layer, pp512 88.6k against
 * the column scan's 91.4k). Off by default: the column scan (88 us a layer) is still faster.
 */
#include "backend/cuda/cuda_device.cuh"
#include "backend/cuda/cuda_internal.cuh"

#define GCT_FN __device__
#include "backend/cuda/gdn_chunk_tc.cuh"

int64_t gdn_chunked_scratch_floats(const struct gdn_args *a)
{
    int64_t nc = (a->T + GC - 1) / GC;
    return gdn_prep_floats(a->T, a->Hk, a->Hv, a->dk) + (int64_t)a->Hv * nc * gdn_chunk_floats(a->dk, a->dv);
}

/* Shared memory of the two kernels, bytes. */
static size_t prep_smem(int32_t dk, int32_t dv)
{
    return ((size_t)2 * GC * (dk + 1) + (size_t)GC * (dv + 1) + (size_t)GC * (GC + 4) + GC) * 4 +
           (size_t)GC * 8;
}

static size_t scan_smem(int32_t dk)
{
    return ((size_t)4 * GC * (dk + 4) + (size_t)GC * (GC + 4) + (size_t)dk * GC_COLS +
            3 * (size_t)GC * GC_COLS + GC) * 4;
}

/* The tensor-core kernels' shared memory at most: sm_90's opt-in per block (227 KB); a GPU with
 * less takes the column scan (launch_gdn_chunked). */
#define GDN_TC_SMEM_MAX (227 * 1024)

bool gdn_chunked_supports(int32_t dk, int32_t dv)
{
    return gdn_scan_supports(dk, dv) && dk % 16 == 0 && dk <= 128 && dv <= 256 &&
           prep_smem(dk, dv) <= 200 * 1024 && scan_smem(dk) <= 200 * 1024 &&
           gdn_chunk_tc_smem(dk, 16) <= GDN_TC_SMEM_MAX && gdn_chunk_prep_tc_smem(dk, dv) <= GDN_TC_SMEM_MAX;
}

/* One block per (value head j, chunk c): Wv, Wk (the forward substitution of the WY form),
 * Qk and G. Q, K, V rows padded by one float (column reads by consecutive rows: no bank
 * conflicts). */
__global__ void __launch_bounds__(GC_THREADS) gdn_chunk_prep_kernel(const __grid_constant__ struct gdn_args a)
{
    extern __shared__ __align__(16) float gsm[];
    griddep_launch();
    griddep_wait();
    const int dk = a.dk, dv = a.dv, Hk = a.Hk, j = blockIdx.x, c = blockIdx.y, tid = threadIdx.x;
    const int t0 = c * GC, n = a.T - t0 < GC ? a.T - t0 : GC, kh = a.tiled ? j % Hk : j / (a.Hv / Hk);
    const int lq = dk + 1, lv = dv + 1, la = GC + 4;
    /* At: A transposed (At[s][i]), rows on 16 bytes: the substitution reads 8 rows i at once */
    float *Q = gsm, *K = Q + GC * lq, *V = K + GC * lq, *At = V + GC * lv, *beta = At + GC * la;
    double *G = (double *)(beta + GC + (GC & 1)); /* 8-byte aligned: GC even */
    const float *qn = a.scratch, *kn = qn + (int64_t)a.T * Hk * dk;
    const float *betas = kn + (int64_t)a.T * Hk * dk;
    /* loads in batches of 8 per thread issued together (a load-store loop waited on L2 per
     * element: ncu measured the kernel at 61 us per layer) */
    const float *vsrc = a.qkv + 2 * (int64_t)Hk * dk + (int64_t)j * dv;
    for (int base = tid; base < n * dk; base += 8 * GC_THREADS) {
        float q[8], k[8], v[8];
#pragma unroll
        for (int u = 0; u < 8; u++) {
            int i = base + u * GC_THREADS, t = i / dk, r = i % dk;
            int64_t src = ((int64_t)(t0 + t) * Hk + kh) * dk + r;
            bool ok = i < n * dk;
            q[u] = ok ? qn[src] : 0.0f, k[u] = ok ? kn[src] : 0.0f;
            v[u] = i < n * dv ? vsrc[(int64_t)(t0 + i / dv) * a.ldi + i % dv] : 0.0f;
        }
#pragma unroll
        for (int u = 0; u < 8; u++) {
            int i = base + u * GC_THREADS;
            if (i < n * dk)
                Q[(i / dk) * lq + i % dk] = q[u], K[(i / dk) * lq + i % dk] = k[u];
            if (i < n * dv)
                V[(i / dv) * lv + i % dv] = v[u];
        }
    }
    for (int i = n * dk + tid; i < n * dv; i += GC_THREADS) /* dv > dk */
        V[(i / dv) * lv + i % dv] = vsrc[(int64_t)(t0 + i / dv) * a.ldi + i % dv];
    if (tid < n) {
        beta[tid] = betas[(int64_t)(t0 + tid) * a.Hv + j];
        G[tid] = (double)(a.ssm_a[j] * softplus_f(a.a[(int64_t)(t0 + tid) * a.lda + j] + a.dt[j]));
    }
    __syncthreads();
    if (tid == 0) /* cumulative log decay, in double as the CPU */
        for (int i = 1; i < n; i++)
            G[i] += G[i - 1];
    __syncthreads();
    float *out = gdn_chunk_area(a, j, c), *Wk = out, *Wv = Wk + GC * dk, *Qk = Wv + GC * dv, *Gf = Qk + GC * GC;
    /* A and Qk in 4 x 4 tiles (i0.., s0..) of the lower triangle */
    {
        int i0 = 4 * (tid / 16), s0 = 4 * (tid % 16);
        if (s0 <= i0 && i0 < n) {
            float kk[4][4] = {}, qk[4][4] = {};
            for (int r = 0; r < dk; r++) {
                float ki[4], qi[4], ks[4];
#pragma unroll
                for (int u = 0; u < 4; u++) {
                    int ii = i0 + u < n ? i0 + u : n - 1, ss = s0 + u < n ? s0 + u : n - 1;
                    ki[u] = K[ii * lq + r], qi[u] = Q[ii * lq + r], ks[u] = K[ss * lq + r];
                }
#pragma unroll
                for (int u = 0; u < 4; u++)
#pragma unroll
                    for (int w = 0; w < 4; w++) {
                        kk[u][w] = fmaf(ki[u], ks[w], kk[u][w]);
                        qk[u][w] = fmaf(qi[u], ks[w], qk[u][w]);
                    }
            }
#pragma unroll
            for (int u = 0; u < 4; u++)
#pragma unroll
                for (int w = 0; w < 4; w++) {
                    int i = i0 + u, s = s0 + w;
                    if (i >= n || s >= n)
                        continue;
                    float d = s <= i ? expf((float)(G[i] - G[s])) : 0.0f;
                    At[s * la + i] = s < i ? kk[u][w] * beta[i] * d : 0.0f;
                    Qk[i * GC + s] = qk[u][w] * d;
                }
        } else if (i0 < n) { /* tiles above the diagonal: Qk is zero there */
#pragma unroll
            for (int u = 0; u < 4; u++)
#pragma unroll
                for (int w = 0; w < 4; w++)
                    if (i0 + u < n && s0 + w < n)
                        Qk[(i0 + u) * GC + s0 + w] = 0.0f;
        }
    }
    /* the right-hand sides: diag(β) V and diag(β e^G) K */
    for (int i = tid; i < n * dv; i += GC_THREADS)
        V[(i / dv) * lv + i % dv] *= beta[i / dv];
    __syncthreads(); /* A complete; K no longer read as k */
    for (int i = tid; i < n * dk; i += GC_THREADS)
        K[(i / dk) * lq + i % dk] *= beta[i / dk] * expf((float)G[i / dk]);
    __syncthreads();
    /* forward substitution, one column per thread: x_i -= Σ_{s<i} A[i][s] x_s, s ascending
     * (the CPU's order), 8 rows at a time: first the rows before them (8 independent sums,
     * each x_s loaded once), then the 8 x 8 triangle */
    for (int col = tid; col < dv + dk; col += GC_THREADS) {
        float *X = col < dv ? V + col : K + (col - dv);
        int ld = col < dv ? lv : lq;
        for (int i0 = 0; i0 < n; i0 += 8) {
            float x[8];
#pragma unroll
            for (int u = 0; u < 8; u++)
                x[u] = i0 + u < n ? X[(i0 + u) * ld] : 0.0f;
            for (int s = 0; s < i0; s++) {
                float xs = X[s * ld];
                float4 a0 = *(const float4 *)(At + s * la + i0), a1 = *(const float4 *)(At + s * la + i0 + 4);
                x[0] = fmaf(-a0.x, xs, x[0]), x[1] = fmaf(-a0.y, xs, x[1]);
                x[2] = fmaf(-a0.z, xs, x[2]), x[3] = fmaf(-a0.w, xs, x[3]);
                x[4] = fmaf(-a1.x, xs, x[4]), x[5] = fmaf(-a1.y, xs, x[5]);
                x[6] = fmaf(-a1.z, xs, x[6]), x[7] = fmaf(-a1.w, xs, x[7]);
            }
#pragma unroll
            for (int u = 1; u < 8; u++)
#pragma unroll
                for (int w = 0; w < u; w++)
                    x[u] = fmaf(-At[(i0 + w) * la + i0 + u], x[w], x[u]);
#pragma unroll
            for (int u = 0; u < 8; u++)
                if (i0 + u < n)
                    X[(i0 + u) * ld] = x[u];
        }
    }
    __syncthreads();
    for (int i = tid; i < n * dk; i += GC_THREADS)
        Wk[i] = K[(i / dk) * lq + i % dk];
    for (int i = tid; i < n * dv; i += GC_THREADS)
        Wv[i] = V[(i / dv) * lv + i % dv];
    if (tid < n)
        Gf[tid] = (float)G[tid];
}

/* The lanes of gdn_chunk_tc.cuh's kernels on the GPU (and of gct_fetch in the FMA scan). */
struct gdn_gpu_lanes {
    __device__ int tid() const { return threadIdx.x; }
    __device__ void sync() const { __syncthreads(); }
    __device__ void copy16(float *dst, const float *src) const { cp_async16(smem_u32(dst), src); }
    __device__ void copy4(float *dst, const float *src) const { cp_async4(smem_u32(dst), src); }
    __device__ void commit() const { cp_async_commit(); }
    __device__ void wait_all() const { cp_async_wait<0>(); }
    __device__ void mma(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) const
    {
        asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    }
};

/* acc[m] = rows grp + 16 m (m < 4, clamped to n - 1) of A [GC][lk] times state column col
 * of S [dk][GC_COLS], two partial sums each: 4 rows per thread share each S load. */
__device__ __forceinline__ void gdn_rows_times_state(const float *A, int lk, const float *S, int dk, int n,
                                                     int grp, int col, float (&acc)[4][2])
{
#pragma unroll
    for (int m = 0; m < 4; m++)
        acc[m][0] = acc[m][1] = 0.0f;
    for (int r = 0; r < dk; r += 4) {
        float s0 = S[r * GC_COLS + col], s1 = S[(r + 1) * GC_COLS + col];
        float s2 = S[(r + 2) * GC_COLS + col], s3 = S[(r + 3) * GC_COLS + col];
#pragma unroll
        for (int m = 0; m < 4; m++) {
            int i = grp + 16 * m < n ? grp + 16 * m : n - 1;
            float4 w = *(const float4 *)(A + i * lk + r);
            acc[m][0] = fmaf(w.x, s0, acc[m][0]), acc[m][1] = fmaf(w.y, s1, acc[m][1]);
            acc[m][0] = fmaf(w.z, s2, acc[m][0]), acc[m][1] = fmaf(w.w, s3, acc[m][1]);
        }
    }
}

/* One block per (value head j, state columns [c0, c0 + GC_COLS)): the chunks in order. Thread
 * (grp = tid / 16, col = tid % 16): U and O rows grp + 16 m, state rows 8 grp + m. The decay
 * factors are applied to the products' results (O row i by e^{G_i}, U row s by
 * e^{G_last − G_s} into Ud for the state update), so q, k and Wk are copied as they are, with
 * cp.async, each as soon as the previous chunk no longer reads its buffer. */
__global__ void __launch_bounds__(GC_THREADS) gdn_chunk_scan_kernel(const __grid_constant__ struct gdn_args a)
{
    extern __shared__ __align__(16) float gsm[];
    griddep_launch();
    griddep_wait();
    const int dk = a.dk, dv = a.dv, Hk = a.Hk, j = blockIdx.x, c0 = blockIdx.y * GC_COLS, tid = threadIdx.x;
    const int col = tid % GC_COLS, grp = tid / GC_COLS, kh = a.tiled ? j % Hk : j / (a.Hv / Hk);
    const int lk = dk + 4, lq = GC + 4, nc = (a.T + GC - 1) / GC;
    /* k rows double-buffered: chunk c + 1's are copied while chunk c runs */
    float *Wk = gsm, *Qn = Wk + GC * lk, *Kb = Qn + GC * lk, *Qk = Kb + 2 * GC * lk;
    float *S = Qk + GC * lq, *Wv = S + dk * GC_COLS, *U = Wv + GC * GC_COLS, *Ud = U + GC * GC_COLS;
    float *G = Ud + GC * GC_COLS;
    float *St = a.state + (int64_t)j * dk * dv;
    const bool col_ok = c0 + col < dv;
    for (int i = tid; i < dk * GC_COLS; i += GC_THREADS) /* state rows r, columns c0.. */
        S[i] = c0 + i % GC_COLS < dv ? St[(int64_t)(i / GC_COLS) * dv + c0 + i % GC_COLS] : 0.0f;
    for (int i = tid; i < GC * GC_COLS; i += GC_THREADS)
        Wv[i] = 0.0f; /* columns past dv stay zero */
    __syncthreads();
    gdn_gpu_lanes lanes;
    const gct_strides ld = {lk, lk, lq, GC_COLS};
    gct_fetch(lanes, a, GCT_WK, 0, kh, j, c0, Wk, Qn, Kb, Qk, Wv, G, ld);
    gct_fetch(lanes, a, GCT_Q | GCT_QKG, 0, kh, j, c0, Wk, Qn, Kb, Qk, Wv, G, ld);
    gct_fetch(lanes, a, GCT_K, 0, kh, j, c0, Wk, Qn, Kb, Qk, Wv, G, ld);
    for (int c = 0; c < nc; c++) {
        const int t0 = c * GC, n = a.T - t0 < GC ? a.T - t0 : GC;
        const bool more = c + 1 < nc;
        float *Kn = Kb + (c & 1) * GC * lk;
        cp_async_wait<0>();
        __syncthreads();
        if (more)
            gct_fetch(lanes, a, GCT_K, c + 1, kh, j, c0, Wk, Qn, Kb + ((c + 1) & 1) * GC * lk, Qk, Wv, G, ld);
        const float glast = G[n - 1];
        /* U = Wv − Wk S */
        {
            float u[4][2];
            gdn_rows_times_state(Wk, lk, S, dk, n, grp, col, u);
#pragma unroll
            for (int m = 0; m < 4; m++) {
                int i = grp + 16 * m;
                if (i < n) {
                    float v = Wv[i * GC_COLS + col] - (u[m][0] + u[m][1]);
                    U[i * GC_COLS + col] = v;
                    Ud[i * GC_COLS + col] = expf(glast - G[i]) * v;
                }
            }
        }
        __syncthreads(); /* U complete; Wk and Wv free */
        if (more)
            gct_fetch(lanes, a, GCT_WK, c + 1, kh, j, c0, Wk, Qn, Kn, Qk, Wv, G, ld);
        /* O = diag(e^G) Q S + Qk U */
        {
            float o[4][2];
            gdn_rows_times_state(Qn, lk, S, dk, n, grp, col, o);
#pragma unroll
            for (int m = 0; m < 4; m++) {
                int i = grp + 16 * m;
                if (i >= n)
                    continue;
                float v0 = 0.0f, v1 = 0.0f;
                int s = 0;
                for (; s + 1 <= i; s += 2) {
                    v0 = fmaf(Qk[i * lq + s], U[s * GC_COLS + col], v0);
                    v1 = fmaf(Qk[i * lq + s + 1], U[(s + 1) * GC_COLS + col], v1);
                }
                if (s == i)
                    v0 = fmaf(Qk[i * lq + s], U[s * GC_COLS + col], v0);
                float v = expf(G[i]) * (o[m][0] + o[m][1]) + (v0 + v1);
                if (col_ok)
                    a.out[(int64_t)(t0 + i) * a.ldo + (int64_t)j * dv + c0 + col] = v;
            }
        }
        __syncthreads(); /* O read the old state, q, Qk and G */
        if (more)
            gct_fetch(lanes, a, GCT_Q | GCT_QKG, c + 1, kh, j, c0, Wk, Qn, Kn, Qk, Wv, G, ld);
        /* S = e^{G_last} S + Kᵀ Ud */
        const float el = expf(glast);
        for (int r0 = 8 * grp; r0 < dk; r0 += 8 * 16) {
            float acc[8];
#pragma unroll
            for (int m = 0; m < 8; m++)
                acc[m] = el * S[(r0 + m) * GC_COLS + col];
            for (int s = 0; s < n; s++) {
                float4 k0 = *(const float4 *)(Kn + s * lk + r0), k1 = *(const float4 *)(Kn + s * lk + r0 + 4);
                float u = Ud[s * GC_COLS + col];
                acc[0] = fmaf(k0.x, u, acc[0]), acc[1] = fmaf(k0.y, u, acc[1]);
                acc[2] = fmaf(k0.z, u, acc[2]), acc[3] = fmaf(k0.w, u, acc[3]);
                acc[4] = fmaf(k1.x, u, acc[4]), acc[5] = fmaf(k1.y, u, acc[5]);
                acc[6] = fmaf(k1.z, u, acc[6]), acc[7] = fmaf(k1.w, u, acc[7]);
            }
#pragma unroll
            for (int m = 0; m < 8; m++)
                S[(r0 + m) * GC_COLS + col] = acc[m];
        }
    }
    cp_async_wait<0>();
    __syncthreads();
    for (int i = tid; i < dk * GC_COLS; i += GC_THREADS)
        if (c0 + i % GC_COLS < dv)
            St[(int64_t)(i / GC_COLS) * dv + c0 + i % GC_COLS] = S[i];
}


/* gdn_chunk_prep_kernel's and gdn_chunk_scan_kernel's work with the products on the tensor
 * cores (gdn_chunk_tc.cuh); two kernels by name, so that profiles tell them apart. */
__global__ void __launch_bounds__(GC_THREADS) gdn_chunk_prep_tc_kernel(const __grid_constant__ struct gdn_args a)
{
    extern __shared__ __align__(16) float gsm[];
    griddep_launch();
    griddep_wait();
    gdn_gpu_lanes lanes;
    gdn_chunk_prep_tc(lanes, a, blockIdx.x, blockIdx.y, gsm);
}

template <int NW>
__global__ void __launch_bounds__(32 * NW) gdn_chunk_scan_tc_kernel(const __grid_constant__ struct gdn_args a)
{
    extern __shared__ __align__(16) float gsm[];
    griddep_launch();
    griddep_wait();
    gdn_gpu_lanes lanes;
    gdn_chunk_scan_tc<NW>(lanes, a, blockIdx.x, blockIdx.y, gsm);
}

cudaError_t launch_gdn_chunked(const struct gdn_args *a, bool tensor_cores, int scan_warps, cudaStream_t s)
{
    if (!gdn_chunked_supports(a->dk, a->dv) || !a->scratch || (scan_warps != 8 && scan_warps != 16))
        return cudaErrorInvalidValue;
    const int nw = tensor_cores ? scan_warps : GC_THREADS / 32;
    size_t ps = tensor_cores ? gdn_chunk_prep_tc_smem(a->dk, a->dv) : prep_smem(a->dk, a->dv);
    size_t ss = tensor_cores ? gdn_chunk_tc_smem(a->dk, nw) : scan_smem(a->dk);
    int dev = 0, optin = 0;
    cudaError_t e;
    if ((e = cudaGetDevice(&dev)) || (e = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev)))
        return e;
    if ((size_t)optin < (ps > ss ? ps : ss)) /* less shared memory a block than sm_90's: the column scan */
        return launch_gdn_scan(a, s);
    if ((e = launch_gdn_prep(a, s)))
        return e;
    void (*prep)(const struct gdn_args) = tensor_cores ? gdn_chunk_prep_tc_kernel : gdn_chunk_prep_kernel;
    void (*scan)(const struct gdn_args) = !tensor_cores ? gdn_chunk_scan_kernel
                                          : nw == 16   ? gdn_chunk_scan_tc_kernel<16>
                                                       : gdn_chunk_scan_tc_kernel<8>;
    if ((e = cudaFuncSetAttribute(prep, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)ps)) ||
        (e = cudaFuncSetAttribute(scan, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)ss)))
        return e;
    unsigned nc = (unsigned)((a->T + GC - 1) / GC);
    if ((e = launch_k(a->pdl, prep, dim3(a->Hv, nc), dim3(GC_THREADS), ps, s, *a)))
        return e;
    return launch_k(a->pdl, scan, dim3(a->Hv, (a->dv + GC_COLS - 1) / GC_COLS), dim3(32 * nw), ss, s, *a);
}
