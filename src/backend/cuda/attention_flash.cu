/*
 * attention_flash.cu — prefill attention as one kernel on tensor cores, for the fast prefill
 * (cuda_options.prefill_bf16 on a 16-bit or quantised model; exact prefills keep the f32
 * GEMMs of attention_gemm.cu). FlashAttention-2's structure with mma.sync:
 *
 * One block of FA_WARPS warps per (tile of FA_BQ queries, query head, key split); warp w owns
 * 16 query rows and keeps everything of them in registers: Q (scaled by 1/sqrt(hd), f16) as
 * A fragments, the scores S, the output O and each row's running max m and sum l. Per tile of
 * FA_BK keys (staged in shared memory by the block, converted from the f32 KV cache):
 *   S = Q K^T          f16 inputs (q and k are RMS-normalised: small range, 11-bit mantissa),
 *                      f32 accumulation (mma m16n8k16)
 *   causal mask, online softmax per row (the quad of lanes holding a row reduces m and l)
 *   O = alpha O + P V  P straight from the S fragments (the accumulator layout of two 8-key
 *                      fragments is the A layout of one 16-key step), bf16 inputs (P in [0, 1];
 *                      V keeps bf16's range), f32 accumulation
 * then O / l. A query tile's key tiles are split over up to FA_SPLITS blocks (the last tile of
 * a 512-token prompt sees 8 key tiles; one block walking them all was the critical path):
 * each writes its unnormalised O, m and l to a scratch record and the last of them to finish
 * (an arrival counter) merges. Head h reads KV head h / (n_head / n_head_kv). Keys are rows
 * 0 .. pos0 + T - 1 of the cache (already written). Error against f32 arithmetic: ~1e-3
 * relative (tests/test_cuda_backend.c).
 */
#include "backend/cuda/cuda_matmul.cuh"

#ifndef FA_WARPS /* -D overrides: bench builds of other shapes */
#define FA_WARPS 4
#endif
#define FA_BQ (16 * FA_WARPS) /* queries per block: one 16-row strip per warp */
#define FA_BK 64              /* keys per tile */
#ifndef FA_SPLITS
#define FA_SPLITS 4           /* blocks a query tile's keys are split over (at most) */
#endif
#define FA_QCHUNK 8           /* query tiles per launch (bounds the partials' scratch) */
#define FA_MERGE_U 16         /* output elements per thread per merge round */
#ifndef FA_MINB
#define FA_MINB 3             /* blocks per SM the registers must allow (1: 255 registers, 2 blocks) */
#endif

/* Row pitches padded by 16 bytes: the fragment loads below (lane (g, c) reads 32 bits at row
 * g, column 2c; ldmatrix reads 8 rows of 16 bytes) then hit 32 different banks. V's B
 * fragments come transposed through ldmatrix.trans (storing V transposed cost 16-way bank
 * conflicts on every store). */
template <int HD>
struct fa_smem {
    __half q[FA_BQ][HD + 8];
    __half k[FA_BK][HD + 8];
    __nv_bfloat16 v[FA_BK][HD + 8];
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
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
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

/* Rows of HD f32 values (src + r * ld; rows >= n_valid read as 0) into a shared tile of
 * ROWS x (HD + 8) halves or bf16s, scaled: float4 loads, FA_LOADS of them per thread issued before any
 * is stored (a tile is one L2/HBM round trip, not one per element). */
#ifndef FA_LOADS
#define FA_LOADS 8
#endif

__device__ __forceinline__ void fa_put2(__half *d, float x, float y) { *(__half2 *)d = __floats2half2_rn(x, y); }

__device__ __forceinline__ void fa_put2(__nv_bfloat16 *d, float x, float y)
{
    *(__nv_bfloat162 *)d = __floats2bfloat162_rn(x, y);
}

template <int HD, int ROWS, typename T>
__device__ __forceinline__ void fa_stage(T (*dst)[HD + 8], const float *src, int64_t ld, int n_valid, float scale)
{
    constexpr int PER_ROW = HD / 4, TOTAL = ROWS * PER_ROW, NT = 32 * FA_WARPS;
#pragma unroll 1
    for (int base = 0; base < TOTAL; base += NT * FA_LOADS) {
        float4 v[FA_LOADS];
#pragma unroll
        for (int u = 0; u < FA_LOADS; u++) {
            int i = base + u * NT + threadIdx.x, r = i / PER_ROW, c = i % PER_ROW;
            v[u] = i < TOTAL && r < n_valid ? *(const float4 *)(src + (int64_t)r * ld + 4 * c)
                                            : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
#pragma unroll
        for (int u = 0; u < FA_LOADS; u++) {
            int i = base + u * NT + threadIdx.x, r = i / PER_ROW, c = i % PER_ROW;
            if (i < TOTAL) {
                fa_put2(&dst[r][4 * c], v[u].x * scale, v[u].y * scale);
                fa_put2(&dst[r][4 * c + 2], v[u].z * scale, v[u].w * scale);
            }
        }
    }
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
    /* FA_MERGE_U elements per thread per round, every load of a round issued before the
     * first store (a round is one L2 round trip; a loop of dependent load-store pairs was
     * ~20 us) */
    const int total = nq * HD, step = blockDim.x * FA_MERGE_U;
    for (int base = 0; base < total; base += step) {
        float acc[FA_MERGE_U];
#pragma unroll
        for (int u = 0; u < FA_MERGE_U; u++)
            acc[u] = 0.0f;
#pragma unroll
        for (int s = 0; s < FA_SPLITS; s++) {
            if (s >= n_split)
                break;
            const float *rec = fa_record<HD>(sp, h, qt, s);
#pragma unroll
            for (int u = 0; u < FA_MERGE_U; u++) {
                int i = base + u * blockDim.x + threadIdx.x;
                if (i < total)
                    acc[u] += f[s][i / HD] * __ldcg(rec + i);
            }
        }
#pragma unroll
        for (int u = 0; u < FA_MERGE_U; u++) {
            int i = base + u * blockDim.x + threadIdx.x;
            if (i < total)
                a.out[(int64_t)(t0 + i / HD) * a.ldo + (int64_t)h * HD + i % HD] = acc[u] * inv_l[i / HD];
        }
    }
}

/* Block (s, qt, h): split s of the key tiles seen by query tile sp.qt0 + qt of head h. Warp w
 * owns query rows 16w .. 16w+15; lane (g, c) holds rows 16w+g and 16w+g+8 of every fragment:
 * Q as A fragments, S and O as accumulators, the row statistics m, l. */
template <int HD>
__global__ void __launch_bounds__(32 * FA_WARPS, FA_MINB) flash_attn_kernel(const __grid_constant__ struct attn_gemm_args a,
                                                                   const __grid_constant__ struct fa_split sp)
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
    fa_stage<HD, FA_BQ>(sm.q, a.q + (int64_t)t0 * a.ldq + (int64_t)h * a.q_stride, a.ldq, nq,
                               rsqrtf((float)HD));
    __syncthreads();
    uint32_t qa[HD / 16][4];
#pragma unroll
    for (int kk = 0; kk < HD / 16; kk++) {
        const __half *q0 = &sm.q[r0 + g][kk * 16 + 2 * c];
        qa[kk][0] = fa_u32(q0), qa[kk][1] = fa_u32(q0 + 8 * (HD + 8));
        qa[kk][2] = fa_u32(q0 + 8), qa[kk][3] = fa_u32(q0 + 8 * (HD + 8) + 8);
    }
    float o[HD / 8][4];
#pragma unroll
    for (int n = 0; n < HD / 8; n++)
        o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
    int qpos[2] = {qpos0 + r0 + g, qpos0 + r0 + g + 8};
    for (int k0 = kt0 * FA_BK; k0 < kt1 * FA_BK; k0 += FA_BK) {
        int nk = min(FA_BK, kend - k0);
        __syncthreads(); /* the previous tile's K and V are no longer read */
        const int64_t kv_off = (int64_t)k0 * a.kvw + (int64_t)kvh * HD;
        fa_stage<HD, FA_BK>(sm.k, a.kc + kv_off, a.kvw, nk, 1.0f);
        fa_stage<HD, FA_BK>(sm.v, a.vc + kv_off, a.kvw, nk, 1.0f);
        __syncthreads();
        float sc[FA_BK / 8][4]; /* S = Q K^T: 8 key columns per fragment */
#pragma unroll
        for (int j = 0; j < FA_BK / 8; j++) {
            sc[j][0] = sc[j][1] = sc[j][2] = sc[j][3] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < HD / 16; kk++) {
                const __half *k0p = &sm.k[j * 8 + g][kk * 16 + 2 * c];
                fa_mma_f16(sc[j], qa[kk], fa_u32(k0p), fa_u32(k0p + 8));
            }
        }
        float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int j = 0; j < FA_BK / 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int key = k0 + j * 8 + 2 * c + (e & 1), row = e >> 1;
                if (key >= k0 + nk || key > qpos[row])
                    sc[j][e] = -INFINITY; /* causal mask (and keys past the tile) */
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
                fa_ldmatrix_t(b0, b1, &sm.v[kk * 16 + (lane & 15)][n * 8]);
                fa_mma_bf16(o[n], pa, b0, b1);
            }
        }
    }
    int rows[2] = {r0 + g, r0 + g + 8};
    if (n_split == 1) {
#pragma unroll
        for (int row = 0; row < 2; row++) {
            if (rows[row] >= nq)
                continue;
            float *op = a.out + (int64_t)(t0 + rows[row]) * a.ldo + (int64_t)h * HD + 2 * c;
            float inv = 1.0f / l[row];
#pragma unroll
            for (int n = 0; n < HD / 8; n++)
                *(float2 *)(op + n * 8) = make_float2(o[n][2 * row] * inv, o[n][2 * row + 1] * inv);
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
                                cudaStream_t s)
{
    size_t smem = sizeof(fa_smem<HD>);
    cudaError_t e = cudaFuncSetAttribute(flash_attn_kernel<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         (int)smem);
    if (e != cudaSuccess)
        return e;
    int n_qt = (a->T + FA_BQ - 1) / FA_BQ;
    for (int qt0 = 0; qt0 < n_qt; qt0 += FA_QCHUNK) {
        struct fa_split sp = {part, count, qt0};
        dim3 grid(FA_SPLITS, n_qt - qt0 < FA_QCHUNK ? n_qt - qt0 : FA_QCHUNK, a->n_head);
        flash_attn_kernel<HD><<<grid, 32 * FA_WARPS, smem, s>>>(*a, sp);
        if ((e = cudaGetLastError()) != cudaSuccess)
            return e;
    }
    return cudaSuccess;
}

/* Head sizes 64 and 128: a warp keeps hd/16 x 4 registers of Q and hd/8 x 4 of O (256 would
 * spill; Qwen3.5's 256 never runs the fast prefill anyway). */
static bool attention_flash_supports(int32_t hd) { return hd == 64 || hd == 128; }

bool attention_flash_applies(const struct attn_gemm_args *a)
{
    /* float4 staging: every row and head offset on 16 bytes */
    return attention_flash_supports(a->hd) && a->ldq % 4 == 0 && a->q_stride % 4 == 0 &&
           a->kvw % 4 == 0 && (uintptr_t)a->q % 16 == 0 && (uintptr_t)a->kc % 16 == 0 &&
           (uintptr_t)a->vc % 16 == 0;
}

qwenrt_status attention_flash(struct gemm_ctx *g, const struct attn_gemm_args *a, cudaStream_t s,
                              struct qwenrt_error *err)
{
    if (a->T < 1 || a->n_head_kv < 1 || a->n_head % a->n_head_kv || !attention_flash_applies(a))
        return err_set(err, QWENRT_ERR_INTERNAL, "cuda: flash attention called with bad arguments");
    int64_t part_bytes = (int64_t)a->n_head * FA_QCHUNK * FA_SPLITS * FA_BQ * (a->hd + 2) * 4;
    int64_t count_bytes = (int64_t)a->n_head * FA_QCHUNK * 4;
    if (part_bytes > g->fa_part_cap || count_bytes > g->fa_count_cap) {
        cudaFree(g->fa_part);
        cudaFree(g->fa_count);
        g->fa_part = NULL, g->fa_count = NULL, g->fa_part_cap = g->fa_count_cap = 0;
        CUDA_CHECK(cudaMalloc(&g->fa_part, (size_t)part_bytes));
        CUDA_CHECK(cudaMalloc(&g->fa_count, (size_t)count_bytes));
        CUDA_CHECK(cudaMemsetAsync(g->fa_count, 0, (size_t)count_bytes, s));
        g->fa_part_cap = part_bytes, g->fa_count_cap = count_bytes;
    }
    switch (a->hd) {
    case 64: CUDA_CHECK(flash_launch<64>(a, g->fa_part, g->fa_count, s)); break;
    default: CUDA_CHECK(flash_launch<128>(a, g->fa_part, g->fa_count, s)); break;
    }
    return QWENRT_OK;
}
