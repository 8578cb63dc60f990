/*
 * test_gdn_chunk_tc_host.cu — the tensor-core chunked DeltaNet kernels (gdn_chunk_tc.cuh: prep
 * and scan) run on the host, every block's threads emulated by tests/simt_host.h, so CI checks
 * them without a GPU.
 *
 * Three references in double: the scan's contract (U = Wv - Wk S, O = e^G (Qn S) + Qk U,
 * S = e^Glast S + Knᵀ (e^(Glast - G) U) per chunk), the prep's definitions (Qk, the WY form's
 * Wk and Wv by forward substitution, G), and both kernels together against the DeltaNet
 * recurrence token by token. Agreement to 3xTF32 accuracy (OUT_TOL: observed ~2e-7 of the
 * largest value; a one- or two-term TF32 product is ~5e-4 off). Everything the kernels must not
 * read is NaN (Qk's upper triangle and columns past a partial chunk, rows past its tokens, fresh
 * shared memory), and padding the kernels must not write must stay NaN. Scan cases run twice:
 * cp.async copies landing at once, and only at the wait. On a GPU, test_cuda_ops' DeltaNet
 * cases (par 3) check the same kernels end to end.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include <cmocka.h>
}

#include <algorithm>
#include <vector>

#include "backend/cuda/cuda_internal.cuh"
#define GCT_FN __host__
#include "backend/cuda/gdn_chunk_tc.cuh"
#include "simt_host.h"

#define OUT_TOL 2e-5 /* max |kernel - reference| over the largest |reference| of the case */

struct tc_case {
    int32_t Hk, Hv, dk, dv, T;
    bool tiled;
};

/* xorshift64*: the same inputs on every run */
static float urand(uint64_t *s, float lo, float hi)
{
    *s ^= *s >> 12, *s ^= *s << 25, *s ^= *s >> 27;
    uint64_t x = *s * 2685821657736338717ull;
    return lo + (hi - lo) * (float)((double)(x >> 40) / (double)(1ull << 24));
}

struct tc_inputs {
    std::vector<float> scratch, state, out;
    int32_t ldo;
};

/* qn, kn (rows of norm ~1), and per (head, chunk) Wk, Wv, Qk (lower triangle), G (a falling
 * cumulative log decay); NaN wherever the kernel must not look. */
static tc_inputs make_inputs(const tc_case &c, uint64_t seed)
{
    tc_inputs in;
    const int32_t nc = (c.T + GC - 1) / GC;
    const float nan = NAN, qs = 1.0f / sqrtf((float)c.dk);
    struct gdn_args a = {};
    a.T = c.T, a.Hk = c.Hk, a.Hv = c.Hv, a.dk = c.dk, a.dv = c.dv;
    int64_t prep = gdn_prep_floats(c.T, c.Hk, c.Hv, c.dk);
    in.scratch.assign(prep + (int64_t)c.Hv * nc * gdn_chunk_floats(c.dk, c.dv), nan);
    for (int64_t i = 0; i < 2 * (int64_t)c.T * c.Hk * c.dk; i++)
        in.scratch[i] = urand(&seed, -1.7f, 1.7f) * qs; /* qn then kn */
    a.scratch = in.scratch.data();
    for (int j = 0; j < c.Hv; j++)
        for (int ch = 0; ch < nc; ch++) {
            int n = c.T - ch * GC < GC ? c.T - ch * GC : GC;
            float *Wk = gdn_chunk_area(a, j, ch), *Wv = Wk + GC * c.dk, *Qk = Wv + GC * c.dv, *G = Qk + GC * GC;
            for (int i = 0; i < n * c.dk; i++)
                Wk[i] = urand(&seed, -1.0f, 1.0f) * qs;
            for (int i = 0; i < n * c.dv; i++)
                Wv[i] = urand(&seed, -1.0f, 1.0f);
            double g = 0.0;
            for (int i = 0; i < n; i++) {
                g += urand(&seed, -0.4f, -0.001f);
                G[i] = (float)g;
                for (int s = 0; s <= i; s++)
                    Qk[i * GC + s] = urand(&seed, -0.5f, 0.5f) * expf(G[i] - G[s]); /* D (q·k) */
            }
        }
    in.state.resize((size_t)c.Hv * c.dk * c.dv);
    for (float &v : in.state)
        v = urand(&seed, -1.0f, 1.0f);
    in.ldo = c.Hv * c.dv + 3; /* 3 padding columns that must stay NaN */
    in.out.assign((size_t)c.T * in.ldo, nan);
    return in;
}

/* The chunk formulas in double: outputs into out ([T][ldo]), the final state into state. */
static void reference(const tc_case &c, const tc_inputs &in, std::vector<double> &out, std::vector<double> &state)
{
    const int32_t nc = (c.T + GC - 1) / GC, dk = c.dk, dv = c.dv;
    struct gdn_args a = {};
    a.T = c.T, a.Hk = c.Hk, a.Hv = c.Hv, a.dk = dk, a.dv = dv, a.scratch = (float *)in.scratch.data();
    const float *qn = in.scratch.data(), *kn = qn + (int64_t)c.T * c.Hk * dk;
    out.assign((size_t)c.T * c.Hv * dv, 0.0);
    state.assign(in.state.begin(), in.state.end());
    std::vector<double> U((size_t)GC * dv), S2((size_t)dk * dv);
    for (int j = 0; j < c.Hv; j++) {
        int kh = c.tiled ? j % c.Hk : j / (c.Hv / c.Hk);
        double *S = &state[(size_t)j * dk * dv];
        for (int ch = 0; ch < nc; ch++) {
            int t0 = ch * GC, n = c.T - t0 < GC ? c.T - t0 : GC;
            const float *Wk = gdn_chunk_area(a, j, ch), *Wv = Wk + GC * dk, *Qk = Wv + GC * dv, *G = Qk + GC * GC;
            for (int i = 0; i < n; i++)
                for (int v = 0; v < dv; v++) {
                    double s = Wv[i * dv + v];
                    for (int r = 0; r < dk; r++)
                        s -= (double)Wk[i * dk + r] * S[r * dv + v];
                    U[i * dv + v] = s;
                }
            for (int i = 0; i < n; i++) {
                const float *q = qn + ((int64_t)(t0 + i) * c.Hk + kh) * dk;
                for (int v = 0; v < dv; v++) {
                    double qs = 0.0, qu = 0.0;
                    for (int r = 0; r < dk; r++)
                        qs += (double)q[r] * S[r * dv + v];
                    for (int s = 0; s <= i; s++)
                        qu += (double)Qk[i * GC + s] * U[s * dv + v];
                    out[((size_t)(t0 + i) * c.Hv + j) * dv + v] = exp((double)G[i]) * qs + qu;
                }
            }
            double glast = G[n - 1];
            for (int r = 0; r < dk; r++)
                for (int v = 0; v < dv; v++) {
                    double s = exp(glast) * S[r * dv + v];
                    for (int t = 0; t < n; t++)
                        s += (double)kn[((int64_t)(t0 + t) * c.Hk + kh) * dk + r] * exp(glast - G[t]) * U[t * dv + v];
                    S2[r * dv + v] = s;
                }
            std::copy(S2.begin(), S2.end(), S);
        }
    }
}

/* The scan's block on nw warps (8 or 16). */
static void run_scan(simt_lanes &l, int nw, const gdn_args &a, int j, int cb, float *smem)
{
    if (nw == 16)
        gdn_chunk_scan_tc<16>(l, a, j, cb, smem);
    else
        gdn_chunk_scan_tc<8>(l, a, j, cb, smem);
}

/* Runs the kernel's blocks one after another; returns "" or what the emulator reported. */
static std::string run_kernel(const tc_case &c, tc_inputs &in, bool copy_at_wait, int nw)
{
    struct gdn_args a = {};
    a.T = c.T, a.Hk = c.Hk, a.Hv = c.Hv, a.dk = c.dk, a.dv = c.dv, a.tiled = c.tiled;
    a.scratch = in.scratch.data(), a.state = in.state.data(), a.out = in.out.data(), a.ldo = in.ldo;
    std::vector<float> smem(gdn_chunk_tc_smem(c.dk, nw) / 4);
    simt_block block(32 * nw, copy_at_wait, 12345u);
    for (int j = 0; j < c.Hv; j++)
        for (int cb = 0; cb < (c.dv + GC_COLS - 1) / GC_COLS; cb++) {
            std::fill(smem.begin(), smem.end(), NAN); /* fresh shared memory */
            std::string e = block.run([&](simt_lanes &l) { run_scan(l, nw, a, j, cb, smem.data()); });
            if (!e.empty())
                return e;
        }
    return "";
}

static void check_case(const tc_case &c, bool copy_at_wait, int nw)
{
    char what[128];
    snprintf(what, sizeof(what), "Hk=%d Hv=%d dk=%d dv=%d T=%d tiled=%d %d warps, copies %s", c.Hk, c.Hv, c.dk, c.dv,
             c.T, c.tiled, nw, copy_at_wait ? "at the wait" : "at once");
    tc_inputs in = make_inputs(c, 0x9e3779b97f4a7c15ull ^ (uint64_t)(c.dk * 131 + c.T));
    std::vector<double> want_out, want_state;
    reference(c, in, want_out, want_state);
    std::string e = run_kernel(c, in, copy_at_wait, nw);
    if (!e.empty())
        fail_msg("%s: %s", what, e.c_str());
    double scale = 0.0, worst = 0.0;
    size_t bad = 0;
    for (double v : want_out)
        scale = fmax(scale, fabs(v));
    for (int t = 0; t < c.T; t++) {
        for (int k = 0; k < c.Hv * c.dv; k++) {
            double d = fabs((double)in.out[(size_t)t * in.ldo + k] - want_out[(size_t)t * c.Hv * c.dv + k]);
            if (!(d <= OUT_TOL * scale))
                bad++;
            worst = isnan(d) ? INFINITY : fmax(worst, d);
        }
        for (int k = c.Hv * c.dv; k < in.ldo; k++)
            if (!isnan(in.out[(size_t)t * in.ldo + k]))
                fail_msg("%s: the output's padding column %d of token %d was written", what, k, t);
    }
    if (bad)
        fail_msg("%s: %zu outputs off, worst %.3g against %.3g allowed", what, bad, worst, OUT_TOL * scale);
    double sscale = 0.0, sworst = 0.0;
    for (double v : want_state)
        sscale = fmax(sscale, fabs(v));
    for (size_t i = 0; i < want_state.size(); i++) {
        double d = fabs((double)in.state[i] - want_state[i]);
        sworst = isnan(d) ? INFINITY : fmax(sworst, d);
    }
    if (!(sworst <= OUT_TOL * sscale))
        fail_msg("%s: final state off by %.3g against %.3g allowed", what, sworst, OUT_TOL * sscale);
    print_message("%s: worst output %.2g of %.3g, state %.2g of %.3g\n", what, worst, scale, sworst, sscale);
}

/* Awkward shapes: partial last chunks (2, 22 and 5 tokens), value columns that do not fill the
 * last block of 16, dk 16 (S update tiles for 2 of 8 warps) and Qwen3.5's 128 x 128 heads; on 8
 * warps and on 16 (the products' K split in halves). */
static void test_chunk_scan_tc(void **state)
{
    (void)state;
    const tc_case cases[] = {
        {2, 4, 32, 40, 150, false}, /* 3 chunks, the last 22 tokens */
        {1, 1, 128, 128, 130, false}, /* Qwen3.5-0.8B's head, 2 full chunks and 2 tokens */
        {2, 2, 16, 23, 64, true},   /* one whole chunk */
        {1, 2, 64, 16, 5, true},    /* one chunk of 5 tokens: rows past n inside the first 8 */
    };
    for (const tc_case &c : cases)
        for (int w = 0; w < 2; w++)
            for (int nw = 8; nw <= 16; nw += 8)
                check_case(c, w == 1, nw);
}

/* ---- the prep ---- */

struct prep_inputs {
    std::vector<float> scratch, qkv, a, dt, ssm_a;
    int32_t ldi, lda;
};

/* qn, kn of unit rows (q then scaled by dk^-1/2, as gdn_prep_kernel leaves them), β in (0, 1),
 * v and the gate's inputs at awkward strides, mild decays; chunk areas NaN. */
static prep_inputs make_prep_inputs(const tc_case &c, uint64_t seed)
{
    prep_inputs in;
    const int32_t nc = (c.T + GC - 1) / GC;
    int64_t prep = gdn_prep_floats(c.T, c.Hk, c.Hv, c.dk);
    in.scratch.assign(prep + (int64_t)c.Hv * nc * gdn_chunk_floats(c.dk, c.dv), NAN);
    for (int m = 0; m < 2; m++)
        for (int64_t row = 0; row < (int64_t)c.T * c.Hk; row++) {
            float *x = &in.scratch[((int64_t)m * c.T * c.Hk + row) * c.dk];
            double ss = 0.0;
            for (int r = 0; r < c.dk; r++)
                x[r] = urand(&seed, -1.0f, 1.0f), ss += (double)x[r] * x[r];
            for (int r = 0; r < c.dk; r++)
                x[r] = (float)(x[r] / sqrt(ss) / (m == 0 ? sqrt((double)c.dk) : 1.0));
        }
    float *betas = &in.scratch[2 * (int64_t)c.T * c.Hk * c.dk];
    for (int64_t i = 0; i < (int64_t)c.T * c.Hv; i++)
        betas[i] = urand(&seed, 0.05f, 0.95f);
    in.ldi = 2 * c.Hk * c.dk + c.Hv * c.dv + 5, in.lda = c.Hv + 2;
    in.qkv.resize((size_t)c.T * in.ldi);
    for (float &v : in.qkv)
        v = urand(&seed, -1.0f, 1.0f);
    in.a.resize((size_t)c.T * in.lda);
    for (float &v : in.a)
        v = urand(&seed, -2.0f, 2.0f);
    in.dt.resize(c.Hv), in.ssm_a.resize(c.Hv);
    for (int j = 0; j < c.Hv; j++)
        in.dt[j] = urand(&seed, -0.5f, 0.5f), in.ssm_a[j] = -urand(&seed, 0.02f, 0.3f);
    return in;
}

static gdn_args prep_args(const tc_case &c, prep_inputs &in)
{
    struct gdn_args a = {};
    a.T = c.T, a.Hk = c.Hk, a.Hv = c.Hv, a.dk = c.dk, a.dv = c.dv, a.tiled = c.tiled;
    a.scratch = in.scratch.data(), a.qkv = in.qkv.data(), a.ldi = in.ldi;
    a.a = in.a.data(), a.lda = in.lda, a.dt = in.dt.data(), a.ssm_a = in.ssm_a.data();
    return a;
}

/* Chunk ch of head j in double: Wk [n][dk], Wv [n][dv], Qk [n][n], G [n], by the definitions
 * (forward substitution over rows in order). */
static void reference_prep(const tc_case &c, prep_inputs &in, int j, int ch, std::vector<double> &Wk,
                           std::vector<double> &Wv, std::vector<double> &Qk, std::vector<double> &G)
{
    const int dk = c.dk, dv = c.dv, t0 = ch * GC, n = c.T - t0 < GC ? c.T - t0 : GC;
    const int kh = c.tiled ? j % c.Hk : j / (c.Hv / c.Hk);
    const float *qn = in.scratch.data(), *kn = qn + (int64_t)c.T * c.Hk * dk, *betas = kn + (int64_t)c.T * c.Hk * dk;
    auto q = [&](int i, int r) { return (double)qn[((int64_t)(t0 + i) * c.Hk + kh) * dk + r]; };
    auto k = [&](int i, int r) { return (double)kn[((int64_t)(t0 + i) * c.Hk + kh) * dk + r]; };
    G.assign(n, 0.0);
    std::vector<double> beta(n);
    for (int i = 0; i < n; i++) {
        float x = in.a[(size_t)(t0 + i) * in.lda + j] + in.dt[j];
        G[i] = (i ? G[i - 1] : 0.0) + (double)(in.ssm_a[j] * (x > 20.0f ? x : log1pf(expf(x))));
        beta[i] = betas[(int64_t)(t0 + i) * c.Hv + j];
    }
    Qk.assign((size_t)n * n, 0.0), Wk.assign((size_t)n * dk, 0.0), Wv.assign((size_t)n * dv, 0.0);
    for (int i = 0; i < n; i++) {
        for (int s = 0; s <= i; s++) {
            double qk = 0.0, kk = 0.0;
            for (int r = 0; r < dk; r++)
                qk += q(i, r) * k(s, r), kk += k(i, r) * k(s, r);
            double d = exp(G[i] - G[s]), A = beta[i] * d * kk;
            Qk[(size_t)i * n + s] = d * qk;
            if (s == i)
                continue;
            for (int r = 0; r < dk; r++) /* rows s < i are final: x_i -= A[i][s] x_s */
                Wk[(size_t)i * dk + r] -= A * Wk[(size_t)s * dk + r];
            for (int v = 0; v < dv; v++)
                Wv[(size_t)i * dv + v] -= A * Wv[(size_t)s * dv + v];
        }
        for (int r = 0; r < dk; r++)
            Wk[(size_t)i * dk + r] += beta[i] * exp(G[i]) * k(i, r);
        for (int v = 0; v < dv; v++)
            Wv[(size_t)i * dv + v] += beta[i] * in.qkv[(size_t)(t0 + i) * in.ldi + 2 * c.Hk * dk + j * dv + v];
    }
}

/* max |got - want| against OUT_TOL of the largest |want|; a NaN counts as infinitely off.
 * Returns the worst difference over the scale. */
static double compare(const char *what, const char *name, const float *got, int64_t ld, const std::vector<double> &want,
                    int rows, int cols)
{
    double scale = 0.0, worst = 0.0;
    for (double v : want)
        scale = fmax(scale, fabs(v));
    for (int i = 0; i < rows; i++)
        for (int k = 0; k < cols; k++) {
            double d = fabs((double)got[i * ld + k] - want[(size_t)i * cols + k]);
            worst = isnan(d) ? INFINITY : fmax(worst, d);
        }
    if (!(worst <= OUT_TOL * scale))
        fail_msg("%s: %s off by %.3g against %.3g allowed", what, name, worst, OUT_TOL * scale);
    return scale > 0.0 ? worst / scale : worst;
}

static void check_prep_case(const tc_case &c)
{
    char what[128];
    snprintf(what, sizeof(what), "prep Hk=%d Hv=%d dk=%d dv=%d T=%d tiled=%d", c.Hk, c.Hv, c.dk, c.dv, c.T, c.tiled);
    prep_inputs in = make_prep_inputs(c, 0x2545f4914f6cdd1dull ^ (uint64_t)(c.dv * 977 + c.T));
    gdn_args a = prep_args(c, in);
    const int nc = (c.T + GC - 1) / GC;
    std::vector<float> smem(gdn_chunk_prep_tc_smem(c.dk, c.dv) / 4);
    simt_block block(GC_THREADS, true, 99u); /* copies land at the wait */
    for (int j = 0; j < c.Hv; j++)
        for (int ch = 0; ch < nc; ch++) {
            std::fill(smem.begin(), smem.end(), NAN);
            std::string e = block.run([&](simt_lanes &l) { gdn_chunk_prep_tc(l, a, j, ch, smem.data()); });
            if (!e.empty())
                fail_msg("%s: %s", what, e.c_str());
        }
    double worst = 0.0;
    for (int j = 0; j < c.Hv; j++)
        for (int ch = 0; ch < nc; ch++) {
            const int n = c.T - ch * GC < GC ? c.T - ch * GC : GC;
            std::vector<double> Wk, Wv, Qk, G;
            reference_prep(c, in, j, ch, Wk, Wv, Qk, G);
            const float *area = gdn_chunk_area(a, j, ch), *gWv = area + GC * c.dk, *gQk = gWv + GC * c.dv;
            worst = fmax(worst, compare(what, "Wk", area, c.dk, Wk, n, c.dk));
            worst = fmax(worst, compare(what, "Wv", gWv, c.dv, Wv, n, c.dv));
            worst = fmax(worst, compare(what, "Qk", gQk, GC, Qk, n, n));
            for (int i = 0; i < n; i++)
                if (gQk[GC * GC + i] != (float)G[i])
                    fail_msg("%s: G[%d] %.9g, want %.9g", what, i, gQk[GC * GC + i], G[i]);
            for (int i = n * c.dk; i < GC * c.dk; i++) /* nothing past the chunk's rows */
                if (!isnan(area[i]))
                    fail_msg("%s: Wk element %d past the chunk's %d rows was written", what, i, n);
        }
    print_message("%s: worst %.2g of the largest value\n", what, worst);
}

/* The prep on the same awkward shapes, and dv 256 (V's 16-column row padding). */
static void test_chunk_prep_tc(void **state)
{
    (void)state;
    const tc_case cases[] = {
        {2, 4, 32, 40, 150, false}, {1, 1, 128, 128, 130, false}, {2, 2, 16, 23, 64, true},
        {1, 2, 64, 16, 5, true},    {1, 1, 16, 256, 70, false},
    };
    for (const tc_case &c : cases)
        check_prep_case(c);
}

/* ---- both kernels against the recurrence ---- */

/* The prep's blocks, then the scan's, on the same scratch; state and out as the scan takes them. */
static std::string run_both(const tc_case &c, gdn_args a, int nw)
{
    const int nc = (c.T + GC - 1) / GC;
    std::vector<float> smem(std::max(gdn_chunk_prep_tc_smem(c.dk, c.dv), gdn_chunk_tc_smem(c.dk, nw)) / 4);
    simt_block block(GC_THREADS, true, 2024u), scan_block(32 * nw, true, 2025u);
    for (int j = 0; j < c.Hv; j++)
        for (int ch = 0; ch < nc; ch++) {
            std::fill(smem.begin(), smem.end(), NAN);
            std::string e = block.run([&](simt_lanes &l) { gdn_chunk_prep_tc(l, a, j, ch, smem.data()); });
            if (!e.empty())
                return e;
        }
    for (int j = 0; j < c.Hv; j++)
        for (int cb = 0; cb < (c.dv + GC_COLS - 1) / GC_COLS; cb++) {
            std::fill(smem.begin(), smem.end(), NAN);
            std::string e = scan_block.run([&](simt_lanes &l) { run_scan(l, nw, a, j, cb, smem.data()); });
            if (!e.empty())
                return e;
        }
    return "";
}

/* The Gated DeltaNet recurrence token by token in double (gdn_core_ref's order: S <- d S;
 * δ = β (v - Sᵀk); S <- S + k δᵀ; o = Sᵀq), from the same normalised q and k. */
static void recurrence(const tc_case &c, const prep_inputs &in, const std::vector<float> &S0,
                       std::vector<double> &out, std::vector<double> &state)
{
    const int dk = c.dk, dv = c.dv;
    const float *qn = in.scratch.data(), *kn = qn + (int64_t)c.T * c.Hk * dk, *betas = kn + (int64_t)c.T * c.Hk * dk;
    out.assign((size_t)c.T * c.Hv * dv, 0.0);
    state.assign(S0.begin(), S0.end());
    std::vector<double> delta(dv);
    for (int j = 0; j < c.Hv; j++) {
        int kh = c.tiled ? j % c.Hk : j / (c.Hv / c.Hk);
        double *S = &state[(size_t)j * dk * dv];
        for (int t = 0; t < c.T; t++) {
            const float *q = qn + ((int64_t)t * c.Hk + kh) * dk, *k = kn + ((int64_t)t * c.Hk + kh) * dk;
            const float *v = &in.qkv[(size_t)t * in.ldi + 2 * c.Hk * dk + j * dv];
            float x = in.a[(size_t)t * in.lda + j] + in.dt[j];
            double d = exp((double)(in.ssm_a[j] * (x > 20.0f ? x : log1pf(expf(x))))), beta = betas[(int64_t)t * c.Hv + j];
            for (int i = 0; i < dk * dv; i++)
                S[i] *= d;
            for (int e = 0; e < dv; e++) {
                double sk = 0.0;
                for (int r = 0; r < dk; r++)
                    sk += S[r * dv + e] * k[r];
                delta[e] = beta * (v[e] - sk);
            }
            for (int r = 0; r < dk; r++)
                for (int e = 0; e < dv; e++)
                    S[r * dv + e] += k[r] * delta[e];
            for (int e = 0; e < dv; e++) {
                double o = 0.0;
                for (int r = 0; r < dk; r++)
                    o += S[r * dv + e] * q[r];
                out[((size_t)t * c.Hv + j) * dv + e] = o;
            }
        }
    }
}

/* Prep then scan give the recurrence's outputs and final state: the two kernels' contract
 * with each other (chunk areas, G, Qk's layout) checked against the definition, not against
 * the formulas they were written from. */
static void test_chunked_tc_is_the_recurrence(void **state)
{
    (void)state;
    const tc_case cases[] = {{2, 4, 32, 40, 150, false}, {1, 2, 128, 128, 130, true}, {2, 2, 16, 23, 5, false}};
    for (int i = 0; i < 6; i++) {
        const tc_case &c = cases[i % 3];
        const int nw = i < 3 ? 8 : 16;
        char what[128];
        snprintf(what, sizeof(what), "prep + scan Hk=%d Hv=%d dk=%d dv=%d T=%d tiled=%d, %d warps", c.Hk, c.Hv, c.dk,
                 c.dv, c.T, c.tiled, nw);
        prep_inputs in = make_prep_inputs(c, 0xd1b54a32d192ed03ull ^ (uint64_t)c.T);
        gdn_args a = prep_args(c, in);
        uint64_t seed = 77;
        std::vector<float> S((size_t)c.Hv * c.dk * c.dv), out((size_t)c.T * c.Hv * c.dv, NAN);
        for (float &v : S)
            v = urand(&seed, -0.5f, 0.5f);
        std::vector<double> want_out, want_state;
        recurrence(c, in, S, want_out, want_state);
        a.state = S.data(), a.out = out.data(), a.ldo = c.Hv * c.dv;
        std::string e = run_both(c, a, nw);
        if (!e.empty())
            fail_msg("%s: %s", what, e.c_str());
        double wo = compare(what, "outputs", out.data(), c.Hv * c.dv, want_out, c.T, c.Hv * c.dv);
        double ws = compare(what, "final state", S.data(), c.dk * c.dv, want_state, c.Hv, c.dk * c.dv);
        print_message("%s: worst output %.2g, state %.2g of the largest value\n", what, wo, ws);
    }
}

/* The emulator itself refuses a warp split between an mma and a barrier, rather than hang. */
static void test_emulator_reports_divergence(void **state)
{
    (void)state;
    simt_block block(64, false, 1u);
    std::string e = block.run([](simt_lanes &l) {
        if (l.tid() == 3) {
            l.sync();
            return;
        }
        float d[4] = {0, 0, 0, 0};
        uint32_t a[4] = {0, 0, 0, 0}, b[2] = {0, 0};
        l.mma(d, a, b);
    });
    assert_true(e.find("stuck") != std::string::npos);
}

/* And an mma on the documented fragments computes the product: A = row-major i + 16 k,
 * B = k - c, small integers, exact in TF32. */
static void test_emulator_mma_layout(void **state)
{
    (void)state;
    simt_block block(32, false, 7u);
    float got[16][8];
    std::string e = block.run([&](simt_lanes &l) {
        int g = l.tid() >> 2, t = l.tid() & 3;
        auto A = [](int i, int k) { return (float)(i + 16 * k); };
        auto B = [](int k, int c) { return (float)(k - c); };
        float af[4] = {A(g, t), A(g + 8, t), A(g, t + 4), A(g + 8, t + 4)}, bf[2] = {B(t, g), B(t + 4, g)};
        uint32_t a[4], b[2];
        for (int r = 0; r < 4; r++)
            memcpy(&a[r], &af[r], 4);
        for (int r = 0; r < 2; r++)
            memcpy(&b[r], &bf[r], 4);
        float d[4] = {1, 1, 1, 1};
        l.mma(d, a, b);
        got[g][2 * t] = d[0], got[g][2 * t + 1] = d[1], got[g + 8][2 * t] = d[2], got[g + 8][2 * t + 1] = d[3];
    });
    assert_true(e.empty());
    for (int i = 0; i < 16; i++)
        for (int c = 0; c < 8; c++) {
            double want = 1.0;
            for (int k = 0; k < 8; k++)
                want += (double)(i + 16 * k) * (k - c);
            assert_float_equal(got[i][c], want, 0.0);
        }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_emulator_mma_layout),
        cmocka_unit_test(test_emulator_reports_divergence),
        cmocka_unit_test(test_chunk_scan_tc),
        cmocka_unit_test(test_chunk_prep_tc),
        cmocka_unit_test(test_chunked_tc_is_the_recurrence),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
