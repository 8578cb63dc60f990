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
 * us of issue (session 6). On the H200 (session 52) the first form of these took 64 us (scan)
 * and 36 us (prep): one block of 8 warps a multiprocessor (shared memory) leaves 2 warps a
 * scheduler, and each step of six MMAs took ~64 instructions (every fragment element a scalar
 * shared load and a split). Session 53 cut the instructions: the k's of a step permuted so that
 * A's elements come in 8-byte loads (gct_frag_rows / gct_frag_cols), the block's own B operands
 * (S, U, Ud) stored split (gct_pair), units of 16 x 16 whose A split serves two tiles
 * (gct_unit), and the copies' and element loops' divisions gone (gct_for_rows); and the scan
 * became a template on its warps, 8 or 16 (the products' K split in halves): 4 warps a
 * scheduler. Measured so far only on a power-braked H100 (perf-log session 53); the decision
 * between the column scan and these waits for bench/gdn_chunked_ab.sh on a healthy GPU.
 *
 * This form was written in a session without a GPU (51), so both bodies are templates over the
 * lanes L that run them — gdn_gpu_lanes (gdn_chunked.cu) on the GPU, the emulator of
 * tests/simt_host.h in tests/test_gdn_chunk_tc_host.cu (CI) — and GCT_FN is __device__ or
 * __host__ accordingly.
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
#define GC_THREADS 256 /* threads per block of the prep (and of the scan on 8 warps) */
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
 *   tid()                     the thread's index in its block;
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

/* The product loops over k, unrolled by 4 on the GPU so that a step's shared loads overlap
 * the previous step's MMAs (2 warps a scheduler hide nothing else: perf-log session 52);
 * shared memory holds the kernels to one block a multiprocessor, so registers are free up to
 * the block's share (the 16-warp scan sits at its 128 without spills). The host emulator runs
 * them as written. */
#ifdef __CUDA_ARCH__
#define GCT_UNROLL4 _Pragma("unroll 4")
#else
#define GCT_UNROLL4
#endif

/* What gct_fetch copies: Wk's rows and Wv's columns, q rows, Qk's rows and G, k rows. */
enum { GCT_WK = 1, GCT_Q = 2, GCT_QKG = 4, GCT_K = 8 };

/* f(row, col) for every row < rows and col < w, spread over the block's threads. Where w
 * divides GC_THREADS (every power of two up to it: the shapes the models have) a thread keeps
 * one column and steps whole rows, so a step costs no division; by session 53's count the
 * copies' and element loops' divisions by a run-time width came near the products' own
 * instructions. */
template <int NT = GC_THREADS, class L, class F>
static inline GCT_FN void gct_for_rows(L &l, int rows, int w, F f)
{
    const int tid = l.tid();
    if (w <= 0)
        return;
    if (NT % w == 0) {
        const int col = tid % w, step = NT / w;
        for (int r = tid / w; r < rows; r += step)
            f(r, col);
    } else {
        for (int i = tid; i < rows * w; i += NT)
            f(i / w, i % w);
    }
}

/* n rows of `cols` floats (a multiple of 4), 16 bytes at a time */
template <int NT = GC_THREADS, class L>
static inline GCT_FN void gct_copy_rows(L &l, float *dst, int ldd, const float *src, int64_t lds, int n, int cols)
{
    gct_for_rows<NT>(l, n, cols / 4, [&](int t, int q) { l.copy16(dst + t * ldd + 4 * q, src + t * lds + 4 * q); });
}

/* Row strides (floats) of what gct_fetch copies into shared memory: Wk's and q's rows, k's,
 * Qk's and Wv's. */
struct gct_strides {
    int w, k, qk, wv;
};

/* Starts the copies of chunk c's parts named in `which` (GCT_*) into shared memory; one commit
 * per call. Both scans use it (the FMA scan with dk + 4, dk + 4, GC + 4 and GC_COLS; this one
 * with gct_scan_strides). */
template <int NT = GC_THREADS, class L>
static inline GCT_FN void gct_fetch(L &l, const struct gdn_args &a, int which, int c, int kh, int j, int c0,
                                    float *Wk, float *Qn, float *Kn, float *Qk, float *Wv, float *G,
                                    const gct_strides &ld)
{
    const int dk = a.dk, dv = a.dv, tid = l.tid();
    const int t0 = c * GC, n = a.T - t0 < GC ? a.T - t0 : GC;
    const float *area = gdn_chunk_area(a, j, c);
    const float *gWk = area, *gWv = gWk + GC * dk, *gQk = gWv + GC * dv, *gG = gQk + GC * GC;
    const int64_t rows = ((int64_t)t0 * a.Hk + kh) * dk, lds = (int64_t)a.Hk * dk; /* in qn, kn */
    const float *qn = a.scratch, *kn = qn + (int64_t)a.T * a.Hk * dk;
    if (which & GCT_WK) {
        gct_copy_rows<NT>(l, Wk, ld.w, gWk, dk, n, dk);
        for (int i = tid; i < n * GC_COLS; i += NT)
            if (c0 + i % GC_COLS < dv)
                l.copy4(Wv + (i / GC_COLS) * ld.wv + i % GC_COLS, gWv + (i / GC_COLS) * dv + c0 + i % GC_COLS);
    }
    if (which & GCT_Q)
        gct_copy_rows<NT>(l, Qn, ld.w, qn + rows, lds, n, dk);
    if (which & GCT_K)
        gct_copy_rows<NT>(l, Kn, ld.k, kn + rows, lds, n, dk);
    if (which & GCT_QKG) {
        gct_copy_rows<NT>(l, Qk, ld.qk, gQk, GC, n, GC);
        for (int i = tid; i < n; i += NT)
            l.copy4(G + i, gG + i);
    }
    l.commit();
}

/* ---- the scan's fragments: k permuted, the block's own operands split once ----
 * A product's sum over k does not depend on the order of the k's, so within a step of 8 a
 * lane's k = t and t + 4 stand for columns k0 + 2t and k0 + 2t + 1 of A and rows k0 + 2t and
 * k0 + 2t + 1 of B: a row's two elements of A are one 8-byte load. What the block writes
 * itself and reads as B (S, U, Ud) is kept as TF32 pairs (hi, lo) = (x, y) of a float2, split
 * once when written; A's operands (copied from the prep's areas) are split as they are loaded.
 * Session 52's scan split every fragment at every load (ALU 31-45% busy, ~64 instructions a
 * step of six MMAs); here a step is ~28 (PTX of the unrolled loop). */
typedef float2 gct_pair;

static inline GCT_FN gct_pair gct_pair_of(float x)
{
    const float v[1] = {x};
    uint32_t hi[1], lo[1];
    gct_split(v, hi, lo);
    return gct_pair{gct_float(hi[0]), gct_float(lo[0])};
}

static inline GCT_FN float gct_pair_value(const gct_pair &p) { return p.x + p.y; } /* exact: lo = x - hi */

static inline GCT_FN uint32_t gct_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* A's fragment of step k0 for A(i, k) = A[i lda + k]: rows g and g + 8, columns k0 + 2t and
 * k0 + 2t + 1. */
static inline GCT_FN void gct_frag_rows(const float *A, int lda, int k0, int g, int t, uint32_t (&hi)[4],
                                        uint32_t (&lo)[4])
{
    const float2 r0 = *(const float2 *)(A + g * lda + k0 + 2 * t), r1 = *(const float2 *)(A + (g + 8) * lda + k0 + 2 * t);
    const float v[4] = {r0.x, r1.x, r0.y, r1.y};
    gct_split(v, hi, lo);
}

/* A's fragment of step k0 for A = Mᵀ with its rows permuted: A(i, k) = M[k ldm + π(i)], π(g) =
 * 2g and π(g + 8) = 2g + 1, so that a lane's two rows are adjacent columns of M (D's rows g
 * and g + 8 are then M's columns 2g and 2g + 1). */
static inline GCT_FN void gct_frag_cols(const float *M, int ldm, int k0, int g, int t, uint32_t (&hi)[4],
                                        uint32_t (&lo)[4])
{
    const float2 r0 = *(const float2 *)(M + (k0 + 2 * t) * ldm + 2 * g);
    const float2 r1 = *(const float2 *)(M + (k0 + 2 * t + 1) * ldm + 2 * g);
    const float v[4] = {r0.x, r0.y, r1.x, r1.y};
    gct_split(v, hi, lo);
}

/* B's fragment of step k0 from pairs, B(k, c) = P[k ldp + c]: rows k0 + 2t, k0 + 2t + 1 of
 * column g. */
static inline GCT_FN void gct_frag_pairs(const gct_pair *P, int ldp, int k0, int g, int t, uint32_t (&hi)[2],
                                         uint32_t (&lo)[2])
{
    const gct_pair p0 = P[(k0 + 2 * t) * ldp + g], p1 = P[(k0 + 2 * t + 1) * ldp + g];
    hi[0] = gct_bits(p0.x), hi[1] = gct_bits(p1.x);
    lo[0] = gct_bits(p0.y), lo[1] = gct_bits(p1.y);
}

/* One 3xTF32 step of two tiles with the same A (split: ah + al) and their own B (bh0 + bl0,
 * bh1 + bl1): six independent MMAs, the two tiles' terms interleaved. */
template <class L>
static inline GCT_FN void gct_mma3_pair(L &l, gct_acc (&c)[2], const uint32_t (&ah)[4], const uint32_t (&al)[4],
                                        const uint32_t (&bh0)[2], const uint32_t (&bl0)[2], const uint32_t (&bh1)[2],
                                        const uint32_t (&bl1)[2])
{
    l.mma(c[0].hh, ah, bh0);
    l.mma(c[1].hh, ah, bh1);
    l.mma(c[0].hl, ah, bl0);
    l.mma(c[1].hl, ah, bl1);
    l.mma(c[0].lh, al, bh0);
    l.mma(c[1].lh, al, bh1);
}

/* A 16-row unit of the block's 16 state columns, two 16 x 8 tiles (c[0] columns 0-7, c[1]
 * 8-15): c += A B over k in [0, k1), k1 a multiple of 8, B as pairs. A by rows (gct_frag_rows)
 * or, COLS, as the transpose of M (gct_frag_cols). A's split serves both tiles: six
 * independent MMAs a step. */
template <bool COLS, class L>
static inline GCT_FN void gct_unit(L &l, gct_acc (&c)[2], const float *A, int lda, const gct_pair *B, int ldb,
                                   int k1)
{
    const int lane = l.tid() & 31, g = lane >> 2, t = lane & 3;
    GCT_UNROLL4
    for (int k0 = 0; k0 < k1; k0 += 8) {
        uint32_t ah[4], al[4], bh0[2], bl0[2], bh1[2], bl1[2];
        if (COLS)
            gct_frag_cols(A, lda, k0, g, t, ah, al);
        else
            gct_frag_rows(A, lda, k0, g, t, ah, al);
        gct_frag_pairs(B, ldb, k0, g, t, bh0, bl0);
        gct_frag_pairs(B + 8, ldb, k0, g, t, bh1, bl1);
        gct_mma3_pair(l, c, ah, al, bh0, bl0, bh1, bl1);
    }
}

/* Where element e (0-7) of a lane's unit lies: c[e / 4]'s element e % 4, in the unit's row
 * gct_unit_row (of 16) and column gct_unit_col (of 16). */
static inline GCT_FN int gct_unit_row(int e, int g, bool cols) { return cols ? 2 * g + ((e & 3) >> 1) : g + 8 * ((e & 3) >> 1); }
static inline GCT_FN int gct_unit_col(int e, int t) { return 8 * (e >> 2) + 2 * t + (e & 1); }

/* The scan's shared rows: Wk and q rows dk + 8 floats apart (8 or 24 mod 32: gct_frag_rows'
 * 8-byte loads free of bank conflicts), k rows dk + 4 (gct_frag_cols'), Qk rows GC + 8, Wv
 * rows GCT_LS; S, U and Ud rows GCT_LP pairs (gct_frag_pairs': rows 2t apart 4t mod 16 pairs). */
#define GCT_LP (GC_COLS + 2)
static inline __host__ __device__ gct_strides gct_scan_strides(int32_t dk) { return gct_strides{dk + 8, dk + 4, GC + 8, GCT_LS}; }

/* Shared memory of the tensor-core scan on nw warps, bytes (Qwen3.5's dk 128: 212.5 KB on 8,
 * 220.5 KB on 16: the halves' sums, Pt). */
static inline __host__ __device__ size_t gdn_chunk_tc_smem(int32_t dk, int nw)
{
    const gct_strides ld = gct_scan_strides(dk);
    return ((size_t)2 * GC * ld.w + (size_t)2 * GC * ld.k + (size_t)2 * GC * ld.qk + (size_t)GC * ld.wv + 2 * GC) * 4 +
           ((size_t)dk + 2 * GC) * GCT_LP * sizeof(gct_pair) + (nw == 16 ? (size_t)8 * 8 * 32 * 4 : 0);
}

/* The chunks in order for block (value head j, state column block cb), NW warps (8 or 16);
 * smem holds gdn_chunk_tc_smem(dk, NW) bytes. The next chunk's k rows, Qk and G are copied
 * (into the other buffers) from the start of a chunk, its Wk, Wv and q rows once the first
 * phase has read them; O and the state update run side by side.
 * Per chunk of n <= GC tokens, on units of 16 rows x the block's 16 columns (unit u of the
 * first phase: Qn S for rows 16 (3 - u) when u < 4, else U for rows 16 (u - 4)):
 *   NW = 8 (two barriers a chunk):
 *     phase 1, K = dk    warp w: unit w; the U warps write U = Wv - Wk S (rows past n zero)
 *                        and Ud = e^(Glast - G) U as pairs, the Qn S warps keep theirs
 *     phase 2            warps 0-3: O = e^G (Qn S) + Qk U for their rows, K causal (the
 *                        longest on warp 0)
 *     phase 3, K = n8    every warp: S = e^Glast S + Knᵀ Ud for state rows 16 w
 *   NW = 16 (three barriers; each warp's share of the products halved, 4 warps a scheduler
 *   where 8 leave 2, the limit session 52 measured):
 *     phase 1            warps w and w + 8: unit w & 7 over k < dk / 2 and k >= dk / 2; the
 *                        half that does not finish the unit leaves its sums in Pt (warps 0-3
 *                        for Qn S, 12-15 for U)
 *     barrier, then warps 4-7 finish U and Ud
 *     phase 2            warps 8-11: O, Qn S their own half + warps 0-3's
 *     phase 3            warps 0-7: the state update as with 8
 * Kn's rows from n to n8 (n rounded up to 8) are zeroed, and Qk's diagonal blocks above the
 * diagonal and past n (the prep's area holds nothing there): U and Ud rows past n are zero, so
 * no NaN reaches a sum. */
template <int NW, class L>
static GCT_FN void gdn_chunk_scan_tc(L &l, const struct gdn_args &a, int j, int cb, float *smem)
{
    static_assert(NW == 8 || NW == 16, "the scan runs on 8 or 16 warps");
    constexpr int NT = 32 * NW;
    const int dk = a.dk, dv = a.dv, Hk = a.Hk, c0 = cb * GC_COLS, tid = l.tid();
    const int warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const int kh = a.tiled ? j % Hk : j / (a.Hv / Hk);
    const int nc = (a.T + GC - 1) / GC;
    const gct_strides ld = gct_scan_strides(dk);
    /* k rows, Qk and G double-buffered (chunk c + 1's copied while chunk c runs); Wk, Wv and
     * q rows copied once chunk c's first phase has read them */
    float *Wk = smem, *Qn = Wk + GC * ld.w, *Kb = Qn + GC * ld.w, *Qkb = Kb + 2 * GC * ld.k;
    float *Wv = Qkb + 2 * GC * ld.qk, *Gb = Wv + GC * ld.wv;
    gct_pair *S = (gct_pair *)(Gb + 2 * GC), *U = S + dk * GCT_LP, *Ud = U + GC * GCT_LP;
    float *Pt = (float *)(Ud + GC * GCT_LP); /* NW = 16: [unit][element][lane] */
    float *St = a.state + (int64_t)j * dk * dv;
    for (int i = tid; i < dk * GC_COLS; i += NT) {
        int r = i / GC_COLS, c = i % GC_COLS;
        S[r * GCT_LP + c] = gct_pair_of(c0 + c < dv ? St[(int64_t)r * dv + c0 + c] : 0.0f);
    }
    for (int i = tid; i < GC * ld.wv; i += NT)
        Wv[i] = 0.0f; /* columns past dv stay zero */
    l.sync();
    gct_fetch<NT>(l, a, GCT_WK | GCT_Q | GCT_QKG | GCT_K, 0, kh, j, c0, Wk, Qn, Kb, Qkb, Wv, Gb, ld);
    const int unit = warp & 7, half = NW == 16 ? warp >> 3 : 0;
    const bool qs_unit = unit < 4;
    const int m0 = 16 * (qs_unit ? 3 - unit : unit - 4); /* the unit's rows */
    const int k_lo = half * (dk / 2), k_len = NW == 16 ? dk / 2 : dk;
    /* who finishes the unit (writes U, or computes O); the other half leaves its sums in Pt */
    const bool finisher = NW == 8 || (qs_unit ? half == 1 : half == 0);
    for (int c = 0; c < nc; c++) {
        const int t0 = c * GC, n = a.T - t0 < GC ? a.T - t0 : GC, n8 = (n + 7) & ~7, nb = (c + 1) & 1;
        const bool more = c + 1 < nc;
        float *Kn = Kb + (c & 1) * GC * ld.k, *Qk = Qkb + (c & 1) * GC * ld.qk, *G = Gb + (c & 1) * GC;
        l.wait_all();
        l.sync(); /* chunk c's copies landed; chunk c - 1 read its buffers and wrote S */
        if (more)
            gct_fetch<NT>(l, a, GCT_K | GCT_QKG, c + 1, kh, j, c0, Wk, Qn, Kb + nb * GC * ld.k, Qkb + nb * GC * ld.qk,
                          Wv, Gb + nb * GC, ld);
        gct_for_rows<NT>(l, n8 - n, dk, [&](int r, int col) { Kn[(n + r) * ld.k + col] = 0.0f; }); /* to n8 */
        for (int i = tid; i < 4 * 256; i += NT) { /* Qk's diagonal blocks */
            const int b = 16 * (i >> 8), r = b + ((i >> 4) & 15), s = b + (i & 15);
            if (s > r || s >= n)
                Qk[r * ld.qk + s] = 0.0f;
        }
        const float glast = G[n - 1];
        float sums[8] = {}; /* the unit's sums (a finisher's: both halves) */
        {
            gct_acc p[2] = {};
            if (m0 < n)
                gct_unit<false>(l, p, (qs_unit ? Qn : Wk) + m0 * ld.w + k_lo, ld.w, S + k_lo * GCT_LP, GCT_LP, k_len);
            for (int e = 0; e < 8; e++) {
                sums[e] = gct_acc_value(p[e >> 2], e & 3);
                if (!finisher)
                    Pt[(unit * 8 + e) * 32 + lane] = sums[e];
            }
        }
        if (NW == 16)
            l.sync(); /* the halves' sums in Pt */
        if (finisher && !qs_unit) { /* U = Wv - Wk S, Ud = e^(Glast - G) U */
            for (int e = 0; e < 8; e++) {
                const int i = m0 + gct_unit_row(e, g, false), cc = gct_unit_col(e, t);
                const float sum = NW == 16 ? sums[e] + Pt[(unit * 8 + e) * 32 + lane] : sums[e];
                const float v = i < n ? Wv[i * ld.wv + cc] - sum : 0.0f;
                U[i * GCT_LP + cc] = gct_pair_of(v);
                Ud[i * GCT_LP + cc] = gct_pair_of(i < n ? expf(glast - G[i]) * v : 0.0f);
            }
        }
        l.sync(); /* U and Ud complete; S, Wk, Wv and q read */
        if (more)
            gct_fetch<NT>(l, a, GCT_WK | GCT_Q, c + 1, kh, j, c0, Wk, Qn, Kn, Qk, Wv, G, ld);
        if (finisher && qs_unit && m0 < n) { /* O = e^G (Qn S) + Qk U */
            gct_acc p[2] = {};
            gct_unit<false>(l, p, Qk + m0 * ld.qk, ld.qk, U, GCT_LP, m0 + 16 < n8 ? m0 + 16 : n8);
            for (int e = 0; e < 8; e++) {
                const int i = m0 + gct_unit_row(e, g, false), cc = gct_unit_col(e, t);
                const float qs = NW == 16 ? Pt[(unit * 8 + e) * 32 + lane] + sums[e] : sums[e];
                if (i < n && c0 + cc < dv)
                    a.out[(int64_t)(t0 + i) * a.ldo + (int64_t)j * dv + c0 + cc] =
                        expf(G[i]) * qs + gct_acc_value(p[e >> 2], e & 3);
            }
        }
        /* S = e^Glast S + Knᵀ Ud (no barrier after O: O reads neither S nor Kn), warps 0-7 */
        const float el = expf(glast);
        for (int r0 = 16 * warp; warp < 8 && r0 < dk; r0 += 16 * 8) {
            gct_acc p[2] = {};
            gct_unit<true>(l, p, Kn + r0, ld.k, Ud, GCT_LP, n8);
            for (int e = 0; e < 8; e++) {
                gct_pair &x = S[(r0 + gct_unit_row(e, g, true)) * GCT_LP + gct_unit_col(e, t)];
                x = gct_pair_of(el * gct_pair_value(x) + gct_acc_value(p[e >> 2], e & 3));
            }
        }
    }
    l.wait_all();
    l.sync();
    for (int i = tid; i < dk * GC_COLS; i += NT) {
        int r = i / GC_COLS, c = i % GC_COLS;
        if (c0 + c < dv)
            St[(int64_t)r * dv + c0 + c] = gct_pair_value(S[r * GCT_LP + c]);
    }
}

/* ---- the prep: a block per (value head, chunk), before the scan ---- */

static inline __host__ __device__ float gct_softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

/* V's columns in shared memory: dv rounded up to 8 (zero past dv), and its row stride, 4 mod
 * 32 (the substitution reads V as B by rows, k permuted: rows 2t apart 8t mod 32 banks). */
static inline __host__ __device__ int gct_v_cols(int dv) { return (dv + 7) & ~7; }
static inline __host__ __device__ int gct_v_ld(int dv) { return gct_v_cols(dv) + (36 - gct_v_cols(dv) % 32) % 32; }

/* Row strides of the prep's Q and K (dk + 8: gct_frag_rows' 8-byte loads free of conflicts) and
 * of N (GC + 8). */
#define GCT_PREP_LN (GC + 8)
static inline __host__ __device__ int gct_prep_lk(int dk) { return dk + 8; }

/* Shared memory of the tensor-core prep, bytes: Q, K [GC][dk + 8], V [GC][gct_v_ld], N
 * [GC][GC + 8], beta and beta e^G [GC], then G [GC] in double. */
static inline __host__ __device__ size_t gdn_chunk_prep_tc_smem(int32_t dk, int32_t dv)
{
    return ((size_t)2 * GC * gct_prep_lk(dk) + (size_t)GC * gct_v_ld(dv) + (size_t)GC * GCT_PREP_LN + 2 * GC) * 4 +
           (size_t)GC * 8;
}

/* Starts copying GC rows of `width` columns into X [GC][ldx]: row r < n, column < cols from
 * src[r row_stride + column] by cp.async (16 bytes where src allows, else 4), zero elsewhere;
 * the caller commits. All of a block's copies are in flight at once (a load-store loop waits
 * on L2 each time: the FMA prep measured 61 us a layer so). */
template <class L>
static inline GCT_FN void gct_stage_rows(L &l, float *X, int ldx, const float *src, int64_t row_stride, int cols,
                                         int width, int n)
{
    if (cols % 4 == 0 && row_stride % 4 == 0 && ((uintptr_t)src & 15) == 0)
        gct_copy_rows(l, X, ldx, src, row_stride, n, cols);
    else
        gct_for_rows(l, n, cols, [&](int r, int col) { l.copy4(X + r * ldx + col, src + r * row_stride + col); });
    gct_for_rows(l, GC - n, width, [&](int r, int col) { X[(n + r) * ldx + col] = 0.0f; });
    gct_for_rows(l, n, width - cols, [&](int r, int col) { X[r * ldx + cols + col] = 0.0f; });
}

/* Q Kᵀ and K Kᵀ for a 16 x 16 unit: c1 += A1 Bᵀ and c2 += A2 Bᵀ with B's rows n0.. in
 * memory (B(k, c) = B[c ldb + k]), k permuted as gct_frag_rows; A1's and A2's splits serve
 * both tiles, B's both products: twelve MMAs a step. */
template <class L>
static inline GCT_FN void gct_unit_abt(L &l, gct_acc (&c1)[2], gct_acc (&c2)[2], const float *A1, const float *A2,
                                       int lda, const float *B, int ldb, int k1)
{
    const int lane = l.tid() & 31, g = lane >> 2, t = lane & 3;
    GCT_UNROLL4
    for (int k0 = 0; k0 < k1; k0 += 8) {
        uint32_t h1[4], l1[4], h2[4], l2[4];
        gct_frag_rows(A1, lda, k0, g, t, h1, l1);
        gct_frag_rows(A2, lda, k0, g, t, h2, l2);
        for (int nt = 0; nt < 2; nt++) {
            const float2 bv = *(const float2 *)(B + (8 * nt + g) * ldb + k0 + 2 * t);
            const float b[2] = {bv.x, bv.y};
            uint32_t bh[2], bl[2];
            gct_split(b, bh, bl);
            l.mma(c1[nt].hh, h1, bh);
            l.mma(c2[nt].hh, h2, bh);
            l.mma(c1[nt].hl, h1, bl);
            l.mma(c2[nt].hl, h2, bl);
            l.mma(c1[nt].lh, l1, bh);
            l.mma(c2[nt].lh, l2, bh);
        }
    }
}

/* c += A B for a 16 x 16 unit whose two 8-column tiles may lie in different arrays: B(k, c) =
 * B0[k ld0 + c] for c < 8, B1[k ld1 + c - 8] after; A by rows, k permuted (B's rows k0 + 2t
 * and k0 + 2t + 1: conflict-free for strides 4 mod 32). */
template <class L>
static inline GCT_FN void gct_unit_rows(L &l, gct_acc (&c)[2], const float *A, int lda, const float *B0, int ld0,
                                        const float *B1, int ld1, int k1)
{
    const int lane = l.tid() & 31, g = lane >> 2, t = lane & 3;
    GCT_UNROLL4
    for (int k0 = 0; k0 < k1; k0 += 8) {
        uint32_t ah[4], al[4];
        gct_frag_rows(A, lda, k0, g, t, ah, al);
        const float b[2][2] = {{B0[(k0 + 2 * t) * ld0 + g], B0[(k0 + 2 * t + 1) * ld0 + g]},
                               {B1[(k0 + 2 * t) * ld1 + g], B1[(k0 + 2 * t + 1) * ld1 + g]}};
        uint32_t bh0[2], bl0[2], bh1[2], bl1[2];
        gct_split(b[0], bh0, bl0);
        gct_split(b[1], bh1, bl1);
        gct_mma3_pair(l, c, ah, al, bh0, bl0, bh1, bl1);
    }
}

/* The state-free matrices of chunk c for value head j (gdn_chunk_prep_kernel's contract):
 * Qk = D ∘ (Q Kᵀ) on and below the diagonal, zero above; A = diag(β) D ∘ (K Kᵀ) below it;
 * Wv, Wk = (I + A)⁻¹ [diag(β) V | diag(β e^G) K]; G the cumulative log decay. The products
 * are the 10 units of 16 x 16 that touch the lower triangle, in 3xTF32; A is kept negated (N),
 * and the substitution goes by blocks of 16 rows: the rows before a block through the tensor
 * cores (X_b += N_b,<b X_<b, units of two 8-column tiles of X = [V | K]), then the 16 x 16
 * triangle a column per thread. */
template <class L>
static GCT_FN void gdn_chunk_prep_tc(L &l, const struct gdn_args &a, int j, int c, float *smem)
{
    const int dk = a.dk, dv = a.dv, Hk = a.Hk, tid = l.tid();
    const int warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const int t0 = c * GC, n = a.T - t0 < GC ? a.T - t0 : GC;
    const int kh = a.tiled ? j % Hk : j / (a.Hv / Hk);
    const int lk = gct_prep_lk(dk), dv8 = gct_v_cols(dv), lv = gct_v_ld(dv), ln = GCT_PREP_LN;
    float *Q = smem, *K = Q + GC * lk, *V = K + GC * lk, *N = V + GC * lv, *beta = N + GC * ln;
    float *kscale = beta + GC; /* beta e^G a row: K's scale */
    double *G = (double *)(kscale + GC);
    const float *qn = a.scratch, *kn = qn + (int64_t)a.T * Hk * dk, *betas = kn + (int64_t)a.T * Hk * dk;
    float *area = gdn_chunk_area(a, j, c), *Wk = area, *Wv = Wk + GC * dk, *Qk = Wv + GC * dv, *Gf = Qk + GC * GC;
    gct_stage_rows(l, Q, lk, qn + ((int64_t)t0 * Hk + kh) * dk, (int64_t)Hk * dk, dk, dk, n);
    gct_stage_rows(l, K, lk, kn + ((int64_t)t0 * Hk + kh) * dk, (int64_t)Hk * dk, dk, dk, n);
    gct_stage_rows(l, V, lv, a.qkv + (int64_t)t0 * a.ldi + 2 * (int64_t)Hk * dk + (int64_t)j * dv, a.ldi, dv, dv8, n);
    l.commit();
    if (tid < n) {
        beta[tid] = betas[(int64_t)(t0 + tid) * a.Hv + j];
        G[tid] = (double)(a.ssm_a[j] * gct_softplus(a.a[(int64_t)(t0 + tid) * a.lda + j] + a.dt[j]));
    }
    l.wait_all();
    l.sync();
    if (tid == 0) /* cumulative log decay, in double as the CPU */
        for (int i = 1; i < n; i++)
            G[i] += G[i - 1];
    l.sync();
    if (tid < n)
        kscale[tid] = beta[tid] * expf((float)G[tid]);
    for (int q = warp; q < 10; q += GC_THREADS / 32) { /* unit q: rows mt, columns u <= mt */
        const int mt = q < 1 ? 0 : q < 3 ? 1 : q < 6 ? 2 : 3, m0 = 16 * mt;
        const int n0 = 16 * (q - (mt == 0 ? 0 : mt == 1 ? 1 : mt == 2 ? 3 : 6));
        if (m0 >= n || n0 >= n)
            continue;
        gct_acc kk[2] = {}, qk[2] = {};
        gct_unit_abt(l, kk, qk, K + m0 * lk, Q + m0 * lk, lk, K + n0 * lk, lk, dk);
        for (int e = 0; e < 8; e++) {
            const int i = m0 + gct_unit_row(e, g, false), s = n0 + gct_unit_col(e, t);
            const bool in = i < n && s < n;
            const float d = in && s <= i ? expf((float)(G[i] - G[s])) : 0.0f;
            N[i * ln + s] = in && s < i ? -gct_acc_value(kk[e >> 2], e & 3) * beta[i] * d : 0.0f;
            if (in)
                Qk[i * GC + s] = gct_acc_value(qk[e >> 2], e & 3) * d;
        }
    }
    gct_for_rows(l, n, n, [&](int i, int s) { /* Qk above the units: zero */
        if (s >= (i & ~15) + 16)
            Qk[i * GC + s] = 0.0f;
    });
    l.sync(); /* N complete; K no longer read as k */
    gct_for_rows(l, n, dv8, [&](int r, int col) { V[r * lv + col] *= beta[r]; });
    gct_for_rows(l, n, dk, [&](int r, int col) { K[r * lk + col] *= kscale[r]; });
    l.sync();
    const int nq = dv8 / 8 + dk / 8; /* 8-column tiles of X = [V | K], in units of two */
    for (int i0 = 0; i0 < n; i0 += 16) {
        for (int q = 2 * warp; i0 > 0 && q < nq; q += 2 * (GC_THREADS / 32)) {
            const int q1 = q + 1 < nq ? q + 1 : q; /* an odd last tile: its pair is itself, discarded */
            float *X0 = q < dv8 / 8 ? V + 8 * q : K + 8 * (q - dv8 / 8);
            float *X1 = q1 < dv8 / 8 ? V + 8 * q1 : K + 8 * (q1 - dv8 / 8);
            const int ld0 = q < dv8 / 8 ? lv : lk, ld1 = q1 < dv8 / 8 ? lv : lk;
            gct_acc xb[2];
            for (int nt = 0; nt < 2; nt++) {
                float *X = nt ? X1 : X0;
                const int ld = nt ? ld1 : ld0;
                float x[4];
                for (int r = 0; r < 4; r++)
                    x[r] = X[(i0 + g + 8 * (r >> 1)) * ld + 2 * t + (r & 1)];
                gct_acc_set(xb[nt], x);
            }
            gct_unit_rows(l, xb, N + i0 * ln, ln, X0, ld0, X1, ld1, i0);
            for (int e = 0; e < 8; e++)
                if (e < 4 || q1 != q)
                    (e < 4 ? X0 : X1)[(i0 + gct_unit_row(e, g, false)) * (e < 4 ? ld0 : ld1) + 2 * t + (e & 1)] =
                        gct_acc_value(xb[e >> 2], e & 3);
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
    gct_for_rows(l, n, dk, [&](int r, int col) { Wk[r * dk + col] = K[r * lk + col]; });
    gct_for_rows(l, n, dv, [&](int r, int col) { Wv[r * dv + col] = V[r * lv + col]; });
    if (tid < n)
        Gf[tid] = (float)G[tid];
}

#endif
