/*
 * attention_flash.cu — prefill attention as one kernel on tensor cores (head sizes 64, 128 and
 * 256), for the fast prefill
 * (cuda_options.prefill_bf16 on a 16-bit or quantised model; exact prefills keep the f32
 * GEMMs of attention_gemm.cu). FlashAttention-2's structure with mma.sync:
 *
 * fa_convert_kernel first rounds the operands to 16 bits into head-major scratch (Q scaled by
 * 1/sqrt(hd) as f16, the visible K rows as f16, V as bf16; rows padded with zeros to whole
 * tiles), so that the attention kernel's tiles are contiguous 16-byte copies (cp.async) with
 * nothing to convert. One block of FA_WARPS warps per (tile of FA_BQ queries, query head, key
 * split); warp w owns 16 query rows and keeps everything of them in registers: Q as A
 * fragments, the scores S, the output O and each row's running max m and sum l. The block's
 * Q and its first two K/V tiles are copied at once; each later tile is copied into the buffer
 * the tile two before it used, while the block computes. Per tile of FA_BK keys:
 *   S = Q K^T          f16 inputs (q and k are RMS-normalised: small range, 11-bit mantissa),
 *                      f32 accumulation (mma m16n8k16)
 *   causal mask (only on tiles that reach past a query of the warp), online softmax per row
 *                      (the quad of lanes holding a row reduces m and l)
 *   O = alpha O + P V  P straight from the S fragments (the accumulator layout of two 8-key
 *                      fragments is the A layout of one 16-key step), bf16 inputs (P in [0, 1];
 *                      V keeps bf16's range), f32 accumulation
 * then O / l (f32, or bf16 into out16 when only the fast products read it). A query tile's
 * key tiles are split over up to FA_SPLITS blocks (the last tile of a 512-token prompt sees 8
 * key tiles; one block walking them all was the critical path):
 * each writes its unnormalised O, m and l to a scratch record and the last of them to finish
 * (an arrival counter) merges. Head h reads KV head h / (n_head / n_head_kv). Keys are rows
 * 0 .. pos0 + T - 1 of the cache (already written). Error against f32 arithmetic: ~1e-3
 * relative (tests/test_cuda_ops.c). History (docs/perf-log.md, session 5): staging each
 * tile from the f32 cache with the conversion in the kernel took 45 us per Qwen3-0.6B layer at
 * T = 512 (255 registers, 2 blocks per SM, two dependent L2 round trips per tile).
 */
#include "backend/cuda/cuda_device.cuh"
#include "backend/cuda/cuda_matmul.cuh"

#ifndef FA_WARPS /* -D overrides: bench builds of other shapes */
#define FA_WARPS 4
#endif
#define FA_BQ (16 * FA_WARPS) /* queries per block: one 16-row strip per warp */
#define FA_BK 64              /* keys per tile */
#ifndef FA_SPLITS
#define FA_SPLITS 2           /* blocks a query tile's keys are split over (at most; 4 and 8 were slower) */
#endif
#define FA_QCHUNK 8           /* query tiles per launch (bounds the partials' scratch) */
#define FA_MERGE_U 4          /* float4 words per thread per merge round */
#ifndef FA_MINB
#define FA_MINB 2             /* blocks per SM the registers must allow (shared memory allows 2) */
#endif

/* Row pitches padded by 16 bytes: the fragment loads below (lane (g, c) reads 32 bits at row
 * g, column 2c; ldmatrix reads 8 rows of 16 bytes) then hit 32 different banks. V's B
 * fragments come transposed through ldmatrix.trans (storing V transposed cost 16-way bank
 * conflicts on every store). */
template <int HD>
struct fa_smem {
    __half q[FA_BQ][HD + 8];
    __half k[2][FA_BK][HD + 8];
    __nv_bfloat16 v[2][FA_BK][HD + 8];
};

/* The 16-bit operands (fa_convert_kernel): q [n_head][tp][hd] f16 scaled by 1/sqrt(hd), k
 * [n_head_kv][kp][hd] f16, v [n_head_kv][kp][hd] bf16; tp and kp are T and pos0 + T rounded
 * up to whole tiles, the padding rows zero. */
struct fa_ops {
    __half *q, *k;
    __nv_bfloat16 *v;
    int32_t tp, kp;
};

/* d += a b on the tensor cores: m16n8k16, A row-major 16x16, B col-major 16x8, f32 d. Lane
 * (g = lane / 4, c = lane % 4) holds a = {(g, 2c..), (g+8, 2c..), (g, 2c+8..), (g+8, 2c+8..)},
 * b = {(k 2c.., n g), (k 2c+8.., n g)}, d = {(g, 2c), (g, 2c+1), (g+8, 2c), (g+8, 2c+1)}. */
__device__ __forceinline__ void fa_mma_f16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void fa_mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1)
{
    mma_bf16_16816(d, a[0], a[1], a[2], a[3], b0, b1);
}

__device__ __forceinline__ uint32_t fa_u32(const void *p) { return *(const uint32_t *)p; }

/* The B fragment (k 16 x n 8) of rows p[0..15] (16 keys, 8 consecutive dims each, row-major in
 * shared memory): two 8x8 matrices loaded transposed; lane l gives the address of row l % 16. */
__device__ __forceinline__ void fa_ldmatrix_t(uint32_t &b0, uint32_t &b1, const void *row_of_lane)
{
    uint32_t a = (uint32_t)__cvta_generic_to_shared(row_of_lane);
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];" : "=r"(b0), "=r"(b1) : "r"(a));
}

__device__ __forceinline__ uint32_t fa_pack_bf16(float lo, float hi)
{
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *(uint32_t *)&v;
}

/* Eight consecutive values rounded to 16 bits, as one 16-byte word. */
__device__ __forceinline__ uint4 fa_pack8(const float (&v)[8], bool bf)
{
    uint4 w;
    uint32_t *u = &w.x;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        if (bf) {
            __nv_bfloat162 h = __floats2bfloat162_rn(v[2 * i], v[2 * i + 1]);
            u[i] = *(uint32_t *)&h;
        } else {
            __half2 h = __floats2half2_rn(v[2 * i], v[2 * i + 1]);
            u[i] = *(uint32_t *)&h;
        }
    }
    return w;
}

/* One thread per 8 values of a row of Q (n_head x tp rows), then K, then V (n_head_kv x kp
 * rows each): rows past T (Q) or pos0 + T (K, V) are zero. With a.kin, the prompt's K and V
 * rows come from kin / vin and are also stored into the cache (kv_write's job). */
template <int HD, typename KV>
__global__ void fa_convert_kernel(const __grid_constant__ struct attn_gemm_args a, const __grid_constant__ struct fa_ops op)
{
    constexpr int PER = HD / 8;
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    int64_t nq = (int64_t)a.n_head * op.tp * PER, nk = (int64_t)a.n_head_kv * op.kp * PER;
    if (i >= nq + 2 * nk)
        return;
    const float *src;
    const KV *cached = NULL; /* a K or V row read from the cache (else src) */
    uint4 *dst;
    bool valid, bf = false;
    float scale = 1.0f;
    int c = (int)(i % PER) * 8;
    if (i < nq) {
        int64_t row = i / PER; /* h * tp + r */
        int h = (int)(row / op.tp), r = (int)(row % op.tp);
        valid = r < a.T;
        src = a.q + (int64_t)r * a.ldq + (int64_t)h * a.q_stride + c;
        dst = (uint4 *)(op.q + row * HD + c);
        scale = rsqrtf((float)HD);
    } else {
        int64_t j = i - nq;
        bf = j >= nk;
        j -= bf ? nk : 0;
        int64_t row = j / PER; /* kvh * kp + r */
        int kvh = (int)(row / op.kp), r = (int)(row % op.kp);
        valid = r < a.pos0 + a.T;
        int64_t at = (int64_t)r * a.kvw + (int64_t)kvh * HD + c;
        cached = (const KV *)(bf ? a.vc : a.kc) + at;
        dst = bf ? (uint4 *)(op.v + row * HD + c) : (uint4 *)(op.k + row * HD + c);
        if (a.kin && valid && r >= a.pos0) { /* a prompt row: into the cache as well */
            src = bf ? a.vin + (int64_t)(r - a.pos0) * a.ldv + (int64_t)kvh * HD + c
                     : a.kin + (int64_t)(r - a.pos0) * a.ldk + (int64_t)kvh * HD + c;
            KV *cache = (KV *)cached; /* the session's cache: writable */
            cached = NULL;
            float4 x0 = *(const float4 *)src, x1 = *(const float4 *)(src + 4);
            if constexpr (sizeof(KV) == 4) {
                *(float4 *)cache = x0;
                *(float4 *)(cache + 4) = x1;
            } else {
                const float w[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
                *(uint4 *)cache = fa_pack8(w, false);
            }
        }
    }
    float v[8];
    if (valid && cached) {
        kv_get<8>(cached, v);
    } else {
        float4 x0 = valid ? *(const float4 *)src : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        float4 x1 = valid ? *(const float4 *)(src + 4) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        v[0] = x0.x, v[1] = x0.y, v[2] = x0.z, v[3] = x0.w, v[4] = x1.x, v[5] = x1.y, v[6] = x1.z, v[7] = x1.w;
    }
#pragma unroll
    for (int e = 0; e < 8; e++)
        v[e] *= scale;
    *dst = fa_pack8(v, bf);
}

/* ROWS contiguous rows of HD 16-bit values into a padded shared tile (no commit). Thread t
 * copies 16-byte word t % PER of rows t / PER, t / PER + NT / PER, ... (the offsets are
 * computed once: the generic index arithmetic was most of the copy loop's instructions). */
template <int HD, int ROWS, typename T>
__device__ __forceinline__ void fa_copy_tile(T (*dst)[HD + 8], const T *src)
{
    constexpr int PER = HD / 8, NT = 32 * FA_WARPS, STEP = NT / PER;
    static_assert(NT % PER == 0 && ROWS % STEP == 0, "tile shape");
    int r = threadIdx.x / PER, c = (threadIdx.x % PER) * 8;
    uint32_t d = smem_u32(&dst[r][c]);
    const T *g = src + r * HD + c;
#pragma unroll
    for (int k = 0; k < ROWS / STEP; k++)
        cp_async16(d + k * STEP * (HD + 8) * 2, g + k * STEP * HD);
}

/* Max (or sum) over the four lanes of a quad: the lanes holding one row of a fragment. */
__device__ __forceinline__ float fa_quad_max(float v)
{
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
    return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}

__device__ __forceinline__ float fa_quad_sum(float v)
{
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

/* Where a split's partial result goes: [n_head][FA_QCHUNK][FA_SPLITS] records of FA_BQ rows
 * of HD floats (unnormalised O), then FA_BQ maxima and FA_BQ sums. */
struct fa_split {
    float *part;      /* the records */
    unsigned *count;  /* [n_head][FA_QCHUNK] arrivals, kept zeroed */
    int32_t qt0;      /* first query tile of this launch */
};

template <int HD>
__device__ __forceinline__ float *fa_record(const struct fa_split &sp, int h, int qt, int s)
{
    return sp.part + (((int64_t)h * FA_QCHUNK + qt) * FA_SPLITS + s) * (int64_t)FA_BQ * (HD + 2);
}

/* The last split of a (query tile, head) to finish: O = sum_s e^(m_s - M) O_s / sum_s e^(m_s
 * - M) l_s per row, written to out. */
template <int HD>
__device__ void fa_merge(const struct attn_gemm_args &a, const struct fa_split &sp, int h, int qt,
                         int n_split, int t0, int nq)
{
    __shared__ float f[FA_SPLITS][FA_BQ], inv_l[FA_BQ];
    for (int r = threadIdx.x; r < FA_BQ; r += blockDim.x) {
        float ms[FA_SPLITS], M = -INFINITY, L = 0.0f;
#pragma unroll
        for (int s = 0; s < FA_SPLITS; s++) {
            ms[s] = s < n_split ? __ldcg(fa_record<HD>(sp, h, qt, s) + FA_BQ * HD + r) : -INFINITY;
            M = fmaxf(M, ms[s]);
        }
#pragma unroll
        for (int s = 0; s < FA_SPLITS; s++) {
            f[s][r] = ms[s] == -INFINITY ? 0.0f : __expf(ms[s] - M);
            if (s < n_split)
                L += f[s][r] * __ldcg(fa_record<HD>(sp, h, qt, s) + FA_BQ * HD + FA_BQ + r);
        }
        inv_l[r] = 1.0f / L;
    }
    __syncthreads();
    /* float4 words: FA_MERGE_U per thread per round, every load of a round issued before the
     * first store (a round is one L2 round trip). Session 5's ncu: the merge by element (an
     * index division and a 64-bit address per value) was ~40% of the kernel's samples. */
    constexpr int C4 = HD / 4;
    const int total = nq * C4, step = blockDim.x * FA_MERGE_U;
    float *out = a.out + (int64_t)t0 * a.ldo + (int64_t)h * HD;
    __nv_bfloat16 *out16 = a.out16 ? a.out16 + (int64_t)t0 * a.ldo + (int64_t)h * HD : NULL;
    for (int base = 0; base < total; base += step) {
        float4 acc[FA_MERGE_U];
#pragma unroll
        for (int u = 0; u < FA_MERGE_U; u++)
            acc[u] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
        for (int s = 0; s < FA_SPLITS; s++) {
            if (s >= n_split)
                break;
            const float4 *rec = (const float4 *)fa_record<HD>(sp, h, qt, s);
#pragma unroll
            for (int u = 0; u < FA_MERGE_U; u++) {
                int i = base + u * blockDim.x + threadIdx.x;
                if (i < total) {
                    float4 v = __ldcg(rec + i);
                    float w = f[s][i / C4];
                    acc[u].x += w * v.x, acc[u].y += w * v.y, acc[u].z += w * v.z, acc[u].w += w * v.w;
                }
            }
        }
#pragma unroll
        for (int u = 0; u < FA_MERGE_U; u++) {
            int i = base + u * blockDim.x + threadIdx.x;
            if (i < total) {
                float iv = inv_l[i / C4];
                int64_t at = (int64_t)(i / C4) * a.ldo + (i % C4) * 4;
                if (out16) {
                    __nv_bfloat162 lo = __floats2bfloat162_rn(acc[u].x * iv, acc[u].y * iv);
                    __nv_bfloat162 hi = __floats2bfloat162_rn(acc[u].z * iv, acc[u].w * iv);
                    *(uint2 *)(out16 + at) = make_uint2(*(uint32_t *)&lo, *(uint32_t *)&hi);
                } else {
                    *(float4 *)(out + at) = make_float4(acc[u].x * iv, acc[u].y * iv, acc[u].z * iv, acc[u].w * iv);
                }
            }
        }
    }
}

/* Block (s, qt, h): split s of the key tiles seen by query tile sp.qt0 + qt of head h. Warp w
 * owns query rows 16w .. 16w+15; lane (g, c) holds rows 16w+g and 16w+g+8 of every fragment:
 * Q as A fragments (head size 256: read from shared memory at each step instead, the 128
 * registers of O leave no room for them; one block per multiprocessor), S and O as
 * accumulators, the row statistics m, l. */
template <int HD>
__global__ void __launch_bounds__(32 * FA_WARPS, HD > 128 ? 1 : FA_MINB)
    flash_attn_kernel(const __grid_constant__ struct attn_gemm_args a, const __grid_constant__ struct fa_split sp,
                      const __grid_constant__ struct fa_ops op)
{
    extern __shared__ __align__(128) unsigned char fa_raw[];
    __shared__ bool s_last;
    fa_smem<HD> &sm = *reinterpret_cast<fa_smem<HD> *>(fa_raw);
    int h = blockIdx.z, qt = blockIdx.y, tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    int g = lane >> 2, c = lane & 3, r0 = warp * 16;
    int kvh = h / (a.n_head / a.n_head_kv);
    int t0 = (sp.qt0 + qt) * FA_BQ, nq = min(FA_BQ, a.T - t0);
    int qpos0 = a.pos0 + t0, kend = qpos0 + nq; /* keys 0 .. kend-1 are visible to the tile */
    /* this block's key tiles: split blockIdx.x of n_split nearly equal runs (maybe empty) */
    int n_kt = (kend + FA_BK - 1) / FA_BK, n_split = min((int)gridDim.x, n_kt);
    if ((int)blockIdx.x >= n_split)
        return;
    int per = (n_kt + n_split - 1) / n_split, kt0 = blockIdx.x * per, kt1 = min(n_kt, kt0 + per);
    /* Q and the first two K/V tiles in flight together (one commit group per tile) */
    const __half *kg = op.k + (int64_t)kvh * op.kp * HD;
    const __nv_bfloat16 *vg = op.v + (int64_t)kvh * op.kp * HD;
    int n_t = kt1 - kt0;
    fa_copy_tile<HD, FA_BQ>(sm.q, op.q + ((int64_t)h * op.tp + t0) * HD);
    for (int i = 0; i < 2 && i < n_t; i++) {
        fa_copy_tile<HD, FA_BK>(sm.k[i], kg + (int64_t)(kt0 + i) * FA_BK * HD);
        fa_copy_tile<HD, FA_BK>(sm.v[i], vg + (int64_t)(kt0 + i) * FA_BK * HD);
        cp_async_commit();
    }
    constexpr bool QREG = HD <= 128; /* Q's fragments kept in registers */
    uint32_t qa[QREG ? HD / 16 : 1][4];
    float o[HD / 8][4];
#pragma unroll
    for (int n = 0; n < HD / 8; n++)
        o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
    int qpos[2] = {qpos0 + r0 + g, qpos0 + r0 + g + 8};
    for (int it = 0; it < n_t; it++) {
        int k0 = (kt0 + it) * FA_BK, b = it & 1;
        if (it + 1 < n_t)
            cp_async_wait<1>();
        else
            cp_async_wait<0>();
        __syncthreads(); /* tile it (and Q) landed for every thread's copies */
        if (QREG && it == 0) {
#pragma unroll
            for (int kk = 0; kk < (QREG ? HD / 16 : 0); kk++) {
                const __half *q0 = &sm.q[r0 + g][kk * 16 + 2 * c];
                qa[kk][0] = fa_u32(q0), qa[kk][1] = fa_u32(q0 + 8 * (HD + 8));
                qa[kk][2] = fa_u32(q0 + 8), qa[kk][3] = fa_u32(q0 + 8 * (HD + 8) + 8);
            }
        }
        float sc[FA_BK / 8][4]; /* S = Q K^T: 8 key columns per fragment */
#pragma unroll
        for (int j = 0; j < FA_BK / 8; j++)
            sc[j][0] = sc[j][1] = sc[j][2] = sc[j][3] = 0.0f;
        if constexpr (QREG) {
#pragma unroll
            for (int j = 0; j < FA_BK / 8; j++)
#pragma unroll
                for (int kk = 0; kk < HD / 16; kk++) {
                    const __half *k0p = &sm.k[b][j * 8 + g][kk * 16 + 2 * c];
                    fa_mma_f16(sc[j], qa[kk], fa_u32(k0p), fa_u32(k0p + 8));
                }
        } else {
#pragma unroll 4
            for (int kk = 0; kk < HD / 16; kk++) { /* a step of Q at a time, every key column */
                const __half *q0 = &sm.q[r0 + g][kk * 16 + 2 * c];
                uint32_t q4[4] = {fa_u32(q0), fa_u32(q0 + 8 * (HD + 8)), fa_u32(q0 + 8),
                                  fa_u32(q0 + 8 * (HD + 8) + 8)};
#pragma unroll
                for (int j = 0; j < FA_BK / 8; j++) {
                    const __half *k0p = &sm.k[b][j * 8 + g][kk * 16 + 2 * c];
                    fa_mma_f16(sc[j], q4, fa_u32(k0p), fa_u32(k0p + 8));
                }
            }
        }
        float mx[2] = {-INFINITY, -INFINITY};
        /* the mask only where a key of the tile lies past one of the warp's queries (those
         * are also the only tiles with keys past kend: kend - 1 is the block's last query) */
        bool masked = k0 + FA_BK - 1 > qpos0 + r0;
#pragma unroll
        for (int j = 0; j < FA_BK / 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int key = k0 + j * 8 + 2 * c + (e & 1), row = e >> 1;
                if (masked && (key >= kend || key > qpos[row]))
                    sc[j][e] = -INFINITY; /* causal mask (and keys past the prompt) */
                mx[row] = fmaxf(mx[row], sc[j][e]);
            }
        float alpha[2], sum[2] = {0.0f, 0.0f};
#pragma unroll
        for (int row = 0; row < 2; row++) {
            float mn = fmaxf(m[row], fa_quad_max(mx[row]));
            alpha[row] = m[row] == -INFINITY ? 0.0f : __expf(m[row] - mn);
            m[row] = mn;
        }
#pragma unroll
        for (int j = 0; j < FA_BK / 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int row = e >> 1;
                float p = m[row] == -INFINITY ? 0.0f : __expf(sc[j][e] - m[row]);
                sc[j][e] = p;
                sum[row] += p;
            }
#pragma unroll
        for (int row = 0; row < 2; row++)
            l[row] = l[row] * alpha[row] + fa_quad_sum(sum[row]);
#pragma unroll
        for (int n = 0; n < HD / 8; n++) {
            o[n][0] *= alpha[0], o[n][1] *= alpha[0];
            o[n][2] *= alpha[1], o[n][3] *= alpha[1];
        }
#pragma unroll
        for (int kk = 0; kk < FA_BK / 16; kk++) { /* O += P V: P from the S fragments */
            uint32_t pa[4] = {fa_pack_bf16(sc[2 * kk][0], sc[2 * kk][1]),
                              fa_pack_bf16(sc[2 * kk][2], sc[2 * kk][3]),
                              fa_pack_bf16(sc[2 * kk + 1][0], sc[2 * kk + 1][1]),
                              fa_pack_bf16(sc[2 * kk + 1][2], sc[2 * kk + 1][3])};
#pragma unroll
            for (int n = 0; n < HD / 8; n++) {
                uint32_t b0, b1;
                fa_ldmatrix_t(b0, b1, &sm.v[b][kk * 16 + (lane & 15)][n * 8]);
                fa_mma_bf16(o[n], pa, b0, b1);
            }
        }
        if (it + 2 < n_t) {
            __syncthreads(); /* every warp is done with buffer b */
            fa_copy_tile<HD, FA_BK>(sm.k[b], kg + (int64_t)(kt0 + it + 2) * FA_BK * HD);
            fa_copy_tile<HD, FA_BK>(sm.v[b], vg + (int64_t)(kt0 + it + 2) * FA_BK * HD);
            cp_async_commit();
        }
    }
    int rows[2] = {r0 + g, r0 + g + 8};
    if (n_split == 1) {
#pragma unroll
        for (int row = 0; row < 2; row++) {
            if (rows[row] >= nq)
                continue;
            int64_t at = (int64_t)(t0 + rows[row]) * a.ldo + (int64_t)h * HD + 2 * c;
            float inv = 1.0f / l[row];
#pragma unroll
            for (int n = 0; n < HD / 8; n++) {
                if (a.out16)
                    *(__nv_bfloat162 *)(a.out16 + at + n * 8) =
                        __floats2bfloat162_rn(o[n][2 * row] * inv, o[n][2 * row + 1] * inv);
                else
                    *(float2 *)(a.out + at + n * 8) = make_float2(o[n][2 * row] * inv, o[n][2 * row + 1] * inv);
            }
        }
        return;
    }
    float *rec = fa_record<HD>(sp, h, qt, blockIdx.x);
#pragma unroll
    for (int row = 0; row < 2; row++) {
#pragma unroll
        for (int n = 0; n < HD / 8; n++)
            *(float2 *)(rec + rows[row] * HD + n * 8 + 2 * c) = make_float2(o[n][2 * row], o[n][2 * row + 1]);
        if (c == 0)
            rec[FA_BQ * HD + rows[row]] = m[row], rec[FA_BQ * HD + FA_BQ + rows[row]] = l[row];
    }
    __threadfence();
    __syncthreads();
    if (tid == 0) {
        unsigned *cnt = sp.count + h * FA_QCHUNK + qt;
        s_last = atomicAdd(cnt, 1u) == (unsigned)n_split - 1;
        if (s_last)
            *cnt = 0; /* every split has arrived: ready for the next launch */
    }
    __syncthreads();
    if (!s_last)
        return;
    __threadfence();
    fa_merge<HD>(a, sp, h, qt, n_split, t0, nq);
}

template <int HD>
static cudaError_t flash_launch(const struct attn_gemm_args *a, float *part, unsigned *count,
                                const struct fa_ops *op, cudaStream_t s)
{
    int64_t items = ((int64_t)a->n_head * op->tp + 2 * (int64_t)a->n_head_kv * op->kp) * (HD / 8);
    if (a->kv_f16)
        fa_convert_kernel<HD, __half><<<(unsigned)((items + 255) / 256), 256, 0, s>>>(*a, *op);
    else
        fa_convert_kernel<HD, float><<<(unsigned)((items + 255) / 256), 256, 0, s>>>(*a, *op);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess)
        return e;
    size_t smem = sizeof(fa_smem<HD>);
    e = cudaFuncSetAttribute(flash_attn_kernel<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess)
        return e;
    int n_qt = (a->T + FA_BQ - 1) / FA_BQ;
    for (int qt0 = 0; qt0 < n_qt; qt0 += FA_QCHUNK) {
        struct fa_split sp = {part, count, qt0};
        dim3 grid(FA_SPLITS, n_qt - qt0 < FA_QCHUNK ? n_qt - qt0 : FA_QCHUNK, a->n_head);
        flash_attn_kernel<HD><<<grid, 32 * FA_WARPS, smem, s>>>(*a, sp, *op);
        if ((e = cudaGetLastError()) != cudaSuccess)
            return e;
    }
    return cudaSuccess;
}

/* Head sizes 64 and 128 (Q's fragments in registers) and 256 (Q read from shared memory). */
static bool attention_flash_supports(int32_t hd) { return hd == 64 || hd == 128 || hd == 256; }

/* Whether a block on this device gets the kernel's shared memory: Hopper's 227 KB holds every
 * head size, but head size 256's tiles (169 KB) do not fit an A100 (163 KB) or the ~99 KB of
 * most other GPUs the PTX runs on; those prompts take the TF32 GEMMs instead. */
static bool attention_flash_fits(int32_t hd)
{
    int dev = 0, optin = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess)
        return false;
    size_t need = hd == 64 ? sizeof(fa_smem<64>) : hd == 128 ? sizeof(fa_smem<128>) : sizeof(fa_smem<256>);
    return need <= (size_t)optin;
}

bool attention_flash_applies(const struct attn_gemm_args *a)
{
    if (a->kin && (a->ldk % 4 || a->ldv % 4 || (uintptr_t)a->kin % 16 || (uintptr_t)a->vin % 16))
        return false;
    if (!attention_flash_supports(a->hd) || !attention_flash_fits(a->hd))
        return false;
    /* float4 loads and stores: every row and head offset on 16 bytes */
    return attention_flash_supports(a->hd) && a->ldq % 4 == 0 && a->q_stride % 4 == 0 &&
           a->kvw % 4 == 0 && a->ldo % 4 == 0 && (uintptr_t)a->q % 16 == 0 &&
           (uintptr_t)a->kc % 16 == 0 && (uintptr_t)a->vc % 16 == 0 && (uintptr_t)a->out % 16 == 0;
}

qwenrt_status attention_flash(struct gemm_ctx *g, const struct attn_gemm_args *a, cudaStream_t s,
                              struct qwenrt_error *err)
{
    if (a->T < 1 || a->n_head_kv < 1 || a->n_head % a->n_head_kv || !attention_flash_applies(a))
        return err_set(err, QWENRT_ERR_INTERNAL, "cuda: flash attention called with bad arguments");
    int64_t part_bytes = (int64_t)a->n_head * FA_QCHUNK * FA_SPLITS * FA_BQ * (a->hd + 2) * 4;
    int64_t count_bytes = (int64_t)a->n_head * FA_QCHUNK * 4;
    qwenrt_status st = scratch_grow_to(g, g->allocs, (void **)&g->fa_part, &g->fa_part_cap, part_bytes, false, s, err);
    if (!st) /* the arrival counters start zeroed, and each launch leaves them so */
        st = scratch_grow_to(g, g->allocs, (void **)&g->fa_count, &g->fa_count_cap, count_bytes, true, s, err);
    struct fa_ops op;
    op.tp = (a->T + FA_BQ - 1) / FA_BQ * FA_BQ;
    op.kp = (a->pos0 + a->T + FA_BK - 1) / FA_BK * FA_BK;
    int64_t qe = (int64_t)a->n_head * op.tp * a->hd, ke = (int64_t)a->n_head_kv * op.kp * a->hd;
    if (!st)
        st = scratch_grow_to(g, g->allocs, &g->fa_ops, &g->fa_ops_cap, (qe + 2 * ke) * 2, false, s, err);
    if (st)
        return st;
    op.q = (__half *)g->fa_ops, op.k = op.q + qe, op.v = (__nv_bfloat16 *)(op.k + ke);
    switch (a->hd) {
    case 64: CUDA_CHECK(flash_launch<64>(a, g->fa_part, g->fa_count, &op, s)); break;
    case 256: CUDA_CHECK(flash_launch<256>(a, g->fa_part, g->fa_count, &op, s)); break;
    default: CUDA_CHECK(flash_launch<128>(a, g->fa_part, g->fa_count, &op, s)); break;
    }
    return QWENRT_OK;
}
