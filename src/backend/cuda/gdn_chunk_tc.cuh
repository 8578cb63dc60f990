/*
 * gdn_chunk_tc.cuh — the chunked DeltaNet prefill (gdn_chunked.cu) with its matrix products on
 * the tensor cores in 3xTF32, cuda_options.gdn_chunked = 2: the prep (a block per value head
 * and chunk: Qk, the WY form's Wk and Wv, G) and the scan (a block per value head and 16 state
 * columns, the chunks in order). gdn_chunked.cu launches them.
 *
 * 3xTF32: x = hi + lo, hi = tf32(x), lo = tf32(x - hi), a product as hi·hi + hi·lo + lo·hi, each
 * term in its own accumulator (three independent MMA chains per tile). Plain TF32 put Qwen3.5's
 * prompt logits 0.37 off with 88 argmax flips of 512; 3xTF32 sits on the recurrence's own floor
 * (0.0330 against 0.0329 from reordering alone: docs/perf-log.md, session 50).
 *
 * The FMA kernels this replaces took 51 us (prep) and 90 us (scan) a layer against ~15 and ~25
 * us of issue (session 6). On the H200 (session 52) these take 64 us (scan) and 36 us (prep): one
 * block of 8 warps a multiprocessor (shared memory) leaves 2 warps a scheduler, issuing at half
 * rate — latency, not the tensor pipes, is the limit; more warps a block is the next step
 * (docs/perf-log.md, session 52). This form was written in a session without a GPU (51), so both bodies
 * are templates over the lanes L that run them — gdn_gpu_lanes (gdn_chunked.cu) on the GPU, the
 * emulator of tests/simt_host.h in tests/test_gdn_chunk_tc_host.cu (CI) — and GCT_FN is
 * __device__ or __host__ accordingly.
 */
#ifndef QWENRT_BACKEND_CUDA_GDN_CHUNK_TC_CUH
#define QWENRT_BACKEND_CUDA_GDN_CHUNK_TC_CUH

#include <math.h>
#include <stdint.h>
#include <string.h>

#ifndef GCT_FN
#error "define GCT_FN (__device__ or __host__) before including gdn_chunk_tc.cuh"
#endif

#define GC 64          /* tokens per chunk */
#define GC_COLS 16     /* state columns per scan block */
#define GC_THREADS 256 /* threads per block of both kernels */
#define GCT_LS (GC_COLS + 8)

/* Floats of the scan's prep scratch (qn, kn, beta, decay, kq), rounded up to 16 bytes: the
 * chunk areas start after it. */
static inline __host__ __device__ int64_t gdn_prep_floats(int64_t T, int32_t Hk, int32_t Hv, int32_t dk)
{
    return (2 * T * Hk * dk + 2 * T * Hv + T * Hk + 3) & ~(int64_t)3;
}

/* Floats of one (head, chunk) area: Wk [GC][dk], Wv [GC][dv], Qk [GC][GC], G [GC]. */
static inline __host__ __device__ int64_t gdn_chunk_floats(int32_t dk, int32_t dv)
{
    return (int64_t)GC * (dk + dv + GC) + GC;
}

static inline __host__ __device__ float *gdn_chunk_area(const struct gdn_args &a, int j, int c)
{
    int64_t nc = (a.T + GC - 1) / GC;
    float *base = a.scratch + gdn_prep_floats(a.T, a.Hk, a.Hv, a.dk);
    return base + ((int64_t)j * nc + c) * gdn_chunk_floats(a.dk, a.dv);
}

/* Shared memory of the tensor-core scan, bytes. */
static inline __host__ __device__ size_t gdn_chunk_tc_smem(int32_t dk)
{
    return ((size_t)2 * GC * (dk + 4) + (size_t)2 * GC * (dk + 8) + (size_t)2 * GC * (GC + 4) +
            (size_t)dk * GCT_LS + (size_t)3 * GC * GCT_LS + 2 * GC) * 4;
}

static inline __host__ __device__ float gct_float(uint32_t u)
{
#ifdef __CUDA_ARCH__
    return __uint_as_float(u);
#else
    float f;
    memcpy(&f, &u, 4);
    return f;
#endif
}

/* ---- warp tiles on the tensor cores ----
 * What L gives:
 *   tid()                     the thread's index in its block of GC_THREADS;
 *   sync()                    __syncthreads;
 *   copy16(dst, src), copy4   cp.async of 16 / 4 bytes into shared memory; commit(), wait_all();
 *   mma(d, a, b)              mma.sync.m16n8k8.row.col.f32.tf32.tf32.f32, d += A B: lane
 *                             (g = lane / 4, t = lane % 4) holds a = {A(g, t), A(g + 8, t),
 *                             A(g, t + 4), A(g + 8, t + 4)}, b = {B(t, g), B(t + 4, g)} and
 *                             d = {D(g, 2t), D(g, 2t + 1), D(g + 8, 2t), D(g + 8, 2t + 1)}. */

/* A warp's 16 x 8 tile of sums, a lane's 4 elements (as L::mma's d) in one accumulator per
 * product term: hh (hi·hi), hl (hi·lo), lh (lo·hi). */
struct gct_acc {
    float hh[4], hl[4], lh[4];
};

/* the tile starting from v (zero: gct_acc c = {}) */
static inline GCT_FN void gct_acc_set(gct_acc &c, const float (&v)[4])
{
    for (int r = 0; r < 4; r++)
        c.hh[r] = v[r], c.hl[r] = c.lh[r] = 0.0f;
}

/* element r of the tile: the small terms first */
static inline GCT_FN float gct_acc_value(const gct_acc &c, int r) { return c.hh[r] + (c.hl[r] + c.lh[r]); }

/* x = hi + lo in TF32, element by element, in three instructions: hi is x rounded to TF32
 * by integer addition and mask (cvt.rna's value for finite x; cvt.rna itself is several
 * instructions, and the splits made the ALU the busiest pipe: gdn_chunk_scan_tc at 45%,
 * perf-log session 52), lo the f32 rest x - hi (exact), passed as it is: the tensor cores
 * read a .tf32 operand's top 19 bits, so lo is truncated, an error of 2^-10 of lo, under
 * 2^-21 of x. */
template <int N>
static inline GCT_FN void gct_split(const float (&x)[N], uint32_t (&hi)[N], uint32_t (&lo)[N])
{
    for (int r = 0; r < N; r++) {
        uint32_t u;
        memcpy(&u, &x[r], 4);
        hi[r] = (u + 0x1000u) & 0xffffe000u;
        float rest = x[r] - gct_float(hi[r]);
        memcpy(&lo[r], &rest, 4);
    }
}

/* c += A B for one 16 x 8 x 8 step in 3xTF32 (fragments as L::mma). */
template <class L>
static inline GCT_FN void gct_mma3(L &l, gct_acc &c, const float (&a)[4], const float (&b)[2])
{
    uint32_t ah[4], al[4], bh[2], bl[2];
    gct_split(a, ah, al);
    gct_split(b, bh, bl);
    l.mma(c.hh, ah, bh);
    l.mma(c.hl, ah, bl);
    l.mma(c.lh, al, bh);
}

/* The product loops over k, unrolled by 4 on the GPU so that a step's shared loads overlap
 * the previous step's MMAs (2 warps a scheduler hide nothing else: perf-log session 52);
 * registers are free here, since shared memory holds the kernels to one block a
 * multiprocessor. The host emulator runs them as written. */
#ifdef __CUDA_ARCH__
#define GCT_UNROLL4 _Pragma("unroll 4")
#else
#define GCT_UNROLL4
#endif

/* A 16 x 8 tile of a warp: c += A[16 rows][k in 0..k1) B[k][8 columns]. A(i, k) is
 * A[i ai + k ak] and read as zero where k >= kn, or k > row0 + i when causal (row0: the tile's
 * first row in the chunk); B(k, c) is B[k bk + c bc]. k1 is a multiple of 8. */
template <class L>
static inline GCT_FN void gct_tile(L &l, gct_acc &c, const float *A, int ai, int ak,
                                   const float *B, int bk, int bc, int k1, int kn, bool causal, int row0)
{
    const int lane = l.tid() & 31, g = lane >> 2, t = lane & 3;
    GCT_UNROLL4
    for (int k = 0; k < k1; k += 8) {
        const int ka = k + t, kb = k + t + 4;
        const bool a0 = ka < kn && (!causal || ka <= row0 + g), a1 = ka < kn && (!causal || ka <= row0 + g + 8);
        const bool a2 = kb < kn && (!causal || kb <= row0 + g), a3 = kb < kn && (!causal || kb <= row0 + g + 8);
        float a[4] = {a0 ? A[g * ai + ka * ak] : 0.0f, a1 ? A[(g + 8) * ai + ka * ak] : 0.0f,
                      a2 ? A[g * ai + kb * ak] : 0.0f, a3 ? A[(g + 8) * ai + kb * ak] : 0.0f};
        float b[2] = {B[ka * bk + g * bc], B[kb * bk + g * bc]};
        gct_mma3(l, c, a, b);
    }
}

/* Two 16 x 8 tiles with the same B: c1 += A1 B and c2 += A2 B over k in 0..k1 (a multiple of
 * 8), no masks; A1 and A2 as gct_tile's A with the same strides. B's fragments are loaded and
 * split once for both, and the six MMAs of a step are independent. */
template <class L>
static inline GCT_FN void gct_tile2(L &l, gct_acc &c1, const float *A1, gct_acc &c2, const float *A2, int ai,
                                    int ak, const float *B, int bk, int bc, int k1)
{
    const int lane = l.tid() & 31, g = lane >> 2, t = lane & 3;
    GCT_UNROLL4
    for (int k = 0; k < k1; k += 8) {
        const int ka = k + t, kb = k + t + 4;
        const int o0 = g * ai + ka * ak, o1 = (g + 8) * ai + ka * ak, o2 = g * ai + kb * ak, o3 = (g + 8) * ai + kb * ak;
        float a1[4] = {A1[o0], A1[o1], A1[o2], A1[o3]}, a2[4] = {A2[o0], A2[o1], A2[o2], A2[o3]};
        float b[2] = {B[ka * bk + g * bc], B[kb * bk + g * bc]};
        uint32_t h1[4], l1[4], h2[4], l2[4], bh[2], bl[2];
        gct_split(a1, h1, l1);
        gct_split(a2, h2, l2);
        gct_split(b, bh, bl);
        l.mma(c1.hh, h1, bh);
        l.mma(c2.hh, h2, bh);
        l.mma(c1.hl, h1, bl);
        l.mma(c2.hl, h2, bl);
        l.mma(c1.lh, l1, bh);
        l.mma(c2.lh, l2, bh);
    }
}

/* What gct_fetch copies: Wk's rows and Wv's columns, q rows, Qk's rows and G, k rows. */
enum { GCT_WK = 1, GCT_Q = 2, GCT_QKG = 4, GCT_K = 8 };

/* n rows of `cols` floats (a multiple of 4), 16 bytes at a time */
template <class L>
static inline GCT_FN void gct_copy_rows(L &l, float *dst, int ldd, const float *src, int64_t lds, int n, int cols)
{
    for (int i = l.tid(); i < n * (cols / 4); i += GC_THREADS) {
        int t = i / (cols / 4), r = 4 * (i % (cols / 4));
        l.copy16(dst + t * ldd + r, src + t * lds + r);
    }
}

/* Starts the copies of chunk c's parts named in `which` (GCT_*) into shared memory; one commit
 * per call. Rows of Wk and q are dk + 4 floats apart, of k lkk, of Wv lwv (both scans use it:
 * the FMA scan with dk + 4 and GC_COLS, this one with dk + 8 and GCT_LS). */
template <class L>
static inline GCT_FN void gct_fetch(L &l, const struct gdn_args &a, int which, int c, int kh, int j, int c0,
                                    float *Wk, float *Qn, float *Kn, float *Qk, float *Wv, float *G, int lkk,
                                    int lwv)
{
    const int dk = a.dk, dv = a.dv, lk = dk + 4, lq = GC + 4, tid = l.tid();
    const int t0 = c * GC, n = a.T - t0 < GC ? a.T - t0 : GC;
    const float *area = gdn_chunk_area(a, j, c);
    const float *gWk = area, *gWv = gWk + GC * dk, *gQk = gWv + GC * dv, *gG = gQk + GC * GC;
    const int64_t rows = ((int64_t)t0 * a.Hk + kh) * dk, lds = (int64_t)a.Hk * dk; /* in qn, kn */
    const float *qn = a.scratch, *kn = qn + (int64_t)a.T * a.Hk * dk;
    if (which & GCT_WK) {
        gct_copy_rows(l, Wk, lk, gWk, dk, n, dk);
        for (int i = tid; i < n * GC_COLS; i += GC_THREADS)
            if (c0 + i % GC_COLS < dv)
                l.copy4(Wv + (i / GC_COLS) * lwv + i % GC_COLS, gWv + (i / GC_COLS) * dv + c0 + i % GC_COLS);
    }
    if (which & GCT_Q)
        gct_copy_rows(l, Qn, lk, qn + rows, lds, n, dk);
    if (which & GCT_K)
        gct_copy_rows(l, Kn, lkk, kn + rows, lds, n, dk);
    if (which & GCT_QKG) {
        gct_copy_rows(l, Qk, lq, gQk, GC, n, GC);
        for (int i = tid; i < n; i += GC_THREADS)
            l.copy4(G + i, gG + i);
    }
    l.commit();
}

/* The chunks in order for block (value head j, state column block cb); smem holds
 * gdn_chunk_tc_smem(dk) bytes. Two barriers a chunk: the next chunk's k rows, Qk and G are
 * copied (into the other buffers) from the start of a chunk, its Wk, Wv and q rows after the
 * first phase; O and the state update run side by side.
 * Per chunk of n <= GC tokens, 8 warps on 16 x 8 tiles:
 *   U = Wv - Wk S, and Qn S    64 x 16 each from K = dk (one set of S's fragments): tile
 *                              (w / 2, w % 2)
 *   O = e^G (Qn S) + Qk U      Qk U from K <= 16 (w / 2 + 1): the same tile
 *   S = e^Glast S + Knᵀ Ud     dk x 16 from K = n rounded up to 8: tiles w and w + 8 as a
 *                              pair (the same Ud fragments), then w + 16 and w + 24, ...
 * Rows past n of U and Ud are written zero, and so are Kn's rows from n to a multiple of 8;
 * Qk's entries past n (its global rows hold nothing there) are read as zero: no NaN reaches a
 * sum.
 * Shared rows are padded so that every fragment load is free of bank conflicts: Wk, Qn and
 * Qk rows (A, by rows) are 4 mod 32 floats, Kn rows (A, by columns) 8 or 24, and S, Wv, U, Ud
 * rows (B) GC_COLS + 8 = 24. */
template <class L>
static GCT_FN void gdn_chunk_scan_tc(L &l, const struct gdn_args &a, int j, int cb, float *smem)
{
    const int dk = a.dk, dv = a.dv, Hk = a.Hk, c0 = cb * GC_COLS, tid = l.tid();
    const int warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const int kh = a.tiled ? j % Hk : j / (a.Hv / Hk);
    const int lk = dk + 4, lkk = dk + 8, lq = GC + 4, nc = (a.T + GC - 1) / GC;
    /* k rows, Qk and G double-buffered (chunk c + 1's copied while chunk c runs); Wk, Wv and
     * q rows copied once chunk c's first phase has read them */
    float *Wk = smem, *Qn = Wk + GC * lk, *Kb = Qn + GC * lk, *Qkb = Kb + 2 * GC * lkk;
    float *S = Qkb + 2 * GC * lq, *Wv = S + dk * GCT_LS, *U = Wv + GC * GCT_LS, *Ud = U + GC * GCT_LS;
    float *Gb = Ud + GC * GCT_LS;
    float *St = a.state + (int64_t)j * dk * dv;
    for (int i = tid; i < dk * GC_COLS; i += GC_THREADS) {
        int r = i / GC_COLS, c = i % GC_COLS;
        S[r * GCT_LS + c] = c0 + c < dv ? St[(int64_t)r * dv + c0 + c] : 0.0f;
    }
    for (int i = tid; i < GC * GCT_LS; i += GC_THREADS)
        Wv[i] = 0.0f; /* columns past dv stay zero */
    l.sync();
    gct_fetch(l, a, GCT_WK | GCT_Q | GCT_QKG | GCT_K, 0, kh, j, c0, Wk, Qn, Kb, Qkb, Wv, Gb, lkk, GCT_LS);
    /* the tile of U and O: rows m0 + g (+ 8), columns n0 + 2t (+ 1) */
    const int m0 = 16 * (warp >> 1), n0 = 8 * (warp & 1);
    for (int c = 0; c < nc; c++) {
        const int t0 = c * GC, n = a.T - t0 < GC ? a.T - t0 : GC, n8 = (n + 7) & ~7, nb = (c + 1) & 1;
        const bool more = c + 1 < nc;
        float *Kn = Kb + (c & 1) * GC * lkk, *Qk = Qkb + (c & 1) * GC * lq, *G = Gb + (c & 1) * GC;
        l.wait_all();
        l.sync(); /* chunk c's copies landed; chunk c - 1 read its buffers and wrote S */
        if (more)
            gct_fetch(l, a, GCT_K | GCT_QKG, c + 1, kh, j, c0, Wk, Qn, Kb + nb * GC * lkk, Qkb + nb * GC * lq, Wv,
                      Gb + nb * GC, lkk, GCT_LS);
        for (int i = tid; i < (n8 - n) * dk; i += GC_THREADS) /* Kn's rows to a multiple of 8: zero */
            Kn[(n + i / dk) * lkk + i % dk] = 0.0f;
        const float glast = G[n - 1];
        gct_acc u = {}, qs = {}; /* Wk S and Qn S: the same fragments of S */
        { /* U = Wv - Wk S; rows past n zero */
            if (m0 < n)
                gct_tile2(l, u, Wk + m0 * lk, qs, Qn + m0 * lk, lk, 1, S + n0, GCT_LS, 1, dk);
            for (int r = 0; r < 4; r++) {
                int i = m0 + g + 8 * (r >> 1), cc = n0 + 2 * t + (r & 1);
                float v = i < n ? Wv[i * GCT_LS + cc] - gct_acc_value(u, r) : 0.0f;
                U[i * GCT_LS + cc] = v;
                Ud[i * GCT_LS + cc] = i < n ? expf(glast - G[i]) * v : 0.0f;
            }
        }
        l.sync(); /* U and Ud complete; S, Wk, Wv and q read */
        if (more)
            gct_fetch(l, a, GCT_WK | GCT_Q, c + 1, kh, j, c0, Wk, Qn, Kn, Qk, Wv, G, lkk, GCT_LS);
        if (m0 < n) { /* O = e^G (Qn S) + Qk U, Qn S from the first phase */
            gct_acc qu = {};
            gct_tile(l, qu, Qk + m0 * lq, lq, 1, U + n0, GCT_LS, 1, m0 + 16 < n8 ? m0 + 16 : n8, n, true, m0);
            for (int r = 0; r < 4; r++) {
                int i = m0 + g + 8 * (r >> 1), cc = n0 + 2 * t + (r & 1);
                if (i < n && c0 + cc < dv)
                    a.out[(int64_t)(t0 + i) * a.ldo + (int64_t)j * dv + c0 + cc] =
                        expf(G[i]) * gct_acc_value(qs, r) + gct_acc_value(qu, r);
            }
        }
        /* S = e^Glast S + Knᵀ Ud (no barrier after O: O reads neither S nor Kn); A(r, s) =
         * Kn[s][r]; tiles w and w + 8 (rows 64 apart, the same columns) as a pair */
        const float el = expf(glast);
        for (int tile = warp; tile < dk / 8; tile += 2 * (GC_THREADS / 32)) {
            const int r0 = 16 * (tile >> 1), cn = 8 * (tile & 1);
            const bool pair = tile + GC_THREADS / 32 < dk / 8;
            gct_acc k0 = {}, k1 = {};
            if (pair)
                gct_tile2(l, k0, Kn + r0, k1, Kn + r0 + 64, 1, lkk, Ud + cn, GCT_LS, 1, n8);
            else
                gct_tile(l, k0, Kn + r0, 1, lkk, Ud + cn, GCT_LS, 1, n8, n8, false, 0);
            for (int r = 0; r < 4; r++) {
                float *p = S + (r0 + g + 8 * (r >> 1)) * GCT_LS + cn + 2 * t + (r & 1);
                *p = el * *p + gct_acc_value(k0, r);
                if (pair)
                    p[64 * GCT_LS] = el * p[64 * GCT_LS] + gct_acc_value(k1, r);
            }
        }
    }
    l.wait_all();
    l.sync();
    for (int i = tid; i < dk * GC_COLS; i += GC_THREADS) {
        int r = i / GC_COLS, c = i % GC_COLS;
        if (c0 + c < dv)
            St[(int64_t)r * dv + c0 + c] = S[r * GCT_LS + c];
    }
}

/* ---- the prep: a block per (value head, chunk), before the scan ---- */

static inline __host__ __device__ float gct_softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

/* V's columns in shared memory: dv rounded up to 8 (zero past dv), and its row stride, 8 or 24
 * mod 32 (conflict-free B fragments by rows). */
static inline __host__ __device__ int gct_v_cols(int dv) { return (dv + 7) & ~7; }
static inline __host__ __device__ int gct_v_ld(int dv) { return gct_v_cols(dv) + (gct_v_cols(dv) % 16 == 0 ? 8 : 16); }

/* Shared memory of the tensor-core prep, bytes: Q, K [GC][dk + 4], V [GC][gct_v_ld], N
 * [GC][GC + 4], beta [GC], then G [GC] in double. */
static inline __host__ __device__ size_t gdn_chunk_prep_tc_smem(int32_t dk, int32_t dv)
{
    return ((size_t)2 * GC * (dk + 4) + (size_t)GC * gct_v_ld(dv) + (size_t)GC * (GC + 4) + GC) * 4 +
           (size_t)GC * 8;
}

/* GC rows of `width` columns into X [GC][ldx]: row r < n, column < cols from src[r row_stride +
 * column], zero elsewhere; 8 loads per thread issued before their stores (a load-store loop
 * waits on L2 each time: gdn_chunk_prep_kernel measured 61 us a layer so) */
template <class L>
static inline GCT_FN void gct_load_rows(L &l, float *X, int ldx, const float *src, int64_t row_stride, int cols,
                                        int width, int n)
{
    const int tid = l.tid();
    for (int base = tid; base < GC * width; base += 8 * GC_THREADS) {
        float v[8];
        for (int u = 0; u < 8; u++) {
            int i = base + u * GC_THREADS, r = i / width, col = i % width;
            v[u] = i < GC * width && r < n && col < cols ? src[(int64_t)r * row_stride + col] : 0.0f;
        }
        for (int u = 0; u < 8; u++) {
            int i = base + u * GC_THREADS;
            if (i < GC * width)
                X[(i / width) * ldx + i % width] = v[u];
        }
    }
}

/* The state-free matrices of chunk c for value head j (gdn_chunk_prep_kernel's contract):
 * Qk = D ∘ (Q Kᵀ) on and below the diagonal, zero above; A = diag(β) D ∘ (K Kᵀ) below it;
 * Wv, Wk = (I + A)⁻¹ [diag(β) V | diag(β e^G) K]; G the cumulative log decay. The products
 * are the 20 tiles of 16 x 8 that touch the lower triangle, in 3xTF32; A is kept negated (N),
 * and the substitution goes by blocks of 16 rows: the rows before a block through the tensor
 * cores (X_b += N_b,<b X_<b), then the 16 x 16 triangle a column per thread. */
template <class L>
static GCT_FN void gdn_chunk_prep_tc(L &l, const struct gdn_args &a, int j, int c, float *smem)
{
    const int dk = a.dk, dv = a.dv, Hk = a.Hk, tid = l.tid();
    const int warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const int t0 = c * GC, n = a.T - t0 < GC ? a.T - t0 : GC;
    const int kh = a.tiled ? j % Hk : j / (a.Hv / Hk);
    const int lk = dk + 4, dv8 = gct_v_cols(dv), lv = gct_v_ld(dv), ln = GC + 4;
    float *Q = smem, *K = Q + GC * lk, *V = K + GC * lk, *N = V + GC * lv, *beta = N + GC * ln;
    double *G = (double *)(beta + GC);
    const float *qn = a.scratch, *kn = qn + (int64_t)a.T * Hk * dk, *betas = kn + (int64_t)a.T * Hk * dk;
    float *area = gdn_chunk_area(a, j, c), *Wk = area, *Wv = Wk + GC * dk, *Qk = Wv + GC * dv, *Gf = Qk + GC * GC;
    gct_load_rows(l, Q, lk, qn + ((int64_t)t0 * Hk + kh) * dk, (int64_t)Hk * dk, dk, dk, n);
    gct_load_rows(l, K, lk, kn + ((int64_t)t0 * Hk + kh) * dk, (int64_t)Hk * dk, dk, dk, n);
    gct_load_rows(l, V, lv, a.qkv + (int64_t)t0 * a.ldi + 2 * (int64_t)Hk * dk + (int64_t)j * dv, a.ldi, dv, dv8, n);
    if (tid < n) {
        beta[tid] = betas[(int64_t)(t0 + tid) * a.Hv + j];
        G[tid] = (double)(a.ssm_a[j] * gct_softplus(a.a[(int64_t)(t0 + tid) * a.lda + j] + a.dt[j]));
    }
    l.sync();
    if (tid == 0) /* cumulative log decay, in double as the CPU */
        for (int i = 1; i < n; i++)
            G[i] += G[i - 1];
    l.sync();
    for (int q = warp; q < 20; q += GC_THREADS / 32) { /* tile q: rows mt, columns nt <= 2 mt + 1 */
        const int mt = q < 2 ? 0 : q < 6 ? 1 : q < 12 ? 2 : 3, m0 = 16 * mt;
        const int n0 = 8 * (q - (mt == 0 ? 0 : mt == 1 ? 2 : mt == 2 ? 6 : 12));
        if (m0 >= n || n0 >= n)
            continue;
        gct_acc kk = {}, qk = {};
        gct_tile2(l, kk, K + m0 * lk, qk, Q + m0 * lk, lk, 1, K + n0 * lk, 1, lk, dk);
        for (int r = 0; r < 4; r++) {
            int i = m0 + g + 8 * (r >> 1), s = n0 + 2 * t + (r & 1);
            bool in = i < n && s < n;
            float d = in && s <= i ? expf((float)(G[i] - G[s])) : 0.0f;
            N[i * ln + s] = in && s < i ? -gct_acc_value(kk, r) * beta[i] * d : 0.0f;
            if (in)
                Qk[i * GC + s] = gct_acc_value(qk, r) * d;
        }
    }
    for (int i = tid; i < n * n; i += GC_THREADS) /* Qk above the tiles: zero */
        if (i % n >= ((i / n) & ~15) + 16)
            Qk[(i / n) * GC + i % n] = 0.0f;
    l.sync(); /* N complete; K no longer read as k */
    for (int i = tid; i < n * dv8; i += GC_THREADS)
        V[(i / dv8) * lv + i % dv8] *= beta[i / dv8];
    for (int i = tid; i < n * dk; i += GC_THREADS)
        K[(i / dk) * lk + i % dk] *= beta[i / dk] * expf((float)G[i / dk]);
    l.sync();
    const int nq = dv8 / 8 + dk / 8; /* 8-column tiles of X = [V | K] */
    for (int i0 = 0; i0 < n; i0 += 16) {
        for (int q = warp; i0 > 0 && q < nq; q += GC_THREADS / 32) {
            float *X = q < dv8 / 8 ? V + 8 * q : K + 8 * (q - dv8 / 8);
            const int ld = q < dv8 / 8 ? lv : lk;
            float x[4];
            for (int r = 0; r < 4; r++)
                x[r] = X[(i0 + g + 8 * (r >> 1)) * ld + 2 * t + (r & 1)];
            gct_acc xb;
            gct_acc_set(xb, x);
            gct_tile(l, xb, N + i0 * ln, ln, 1, X, ld, 1, i0, i0, false, 0);
            for (int r = 0; r < 4; r++)
                X[(i0 + g + 8 * (r >> 1)) * ld + 2 * t + (r & 1)] = gct_acc_value(xb, r);
        }
        if (i0 > 0)
            l.sync();
        for (int col = tid; col < dv8 + dk; col += GC_THREADS) {
            float *X = col < dv8 ? V + col : K + (col - dv8);
            const int ld = col < dv8 ? lv : lk;
            float x[16];
            for (int u = 0; u < 16; u++)
                x[u] = X[(i0 + u) * ld];
            for (int u = 1; u < 16; u++)
                for (int w = 0; w < u; w++)
                    x[u] = fmaf(N[(i0 + u) * ln + i0 + w], x[w], x[u]);
            for (int u = 0; u < 16; u++)
                if (i0 + u < n)
                    X[(i0 + u) * ld] = x[u];
        }
        l.sync();
    }
    for (int i = tid; i < n * dk; i += GC_THREADS)
        Wk[i] = K[(i / dk) * lk + i % dk];
    for (int i = tid; i < n * dv; i += GC_THREADS)
        Wv[i] = V[(i / dv) * lv + i % dv];
    if (tid < n)
        Gf[tid] = (float)G[tid];
}

#endif
