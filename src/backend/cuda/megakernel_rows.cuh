/*
 * megakernel_rows.cuh — the megakernel's register-path GEMV phases, a fragment of
 * megakernel.cu (included once, after the weight ring's definitions; not a standalone header).
 *
 * Each function runs one GEMV phase of the block over its chunks in the ring: 16-bit rows
 * (mk_gemv_regs), Q8_0 rows (mk_gemv_q8), Q4_K / Q6_K rows (mk_gemv_kq). All keep x in
 * registers for the phase in the element order each lane's dot product walks (read once from
 * the block's staged x instead of once per row, without bank conflicts), read the weights with
 * ld.shared (the stage pointers live in structs, where the compiler cannot see they are
 * shared), and copy the ring's state into registers. mk_regs_kc / mk_q8_kb / mk_kq_kind say
 * which phases qualify; the rest take mk_gemv_chunks. The arithmetic order of each dot product
 * is the generic one's (mk_dot_float, mk_dot_q8_0, mk_dot_q4_k, mk_dot_q6_k), which
 * test_cuda_backend checks against the graph program at the real widths.
 */

/* One row's dot product with x held in registers: lane l has x[8 (l + 32 u) + j] in
 * x[8 u + j] and loads the row's 16-byte words l + 32 u from shared memory (consecutive lanes,
 * consecutive words: no bank conflicts). Two accumulators halve the FMA chain. */
template <int DT, int KC>
__device__ __forceinline__ float mk_dot_regs(uint32_t row, const float *x)
{
    /* the words of a row in groups of at most 4 (16 registers), loaded before use */
    const int G = KC < 4 ? KC : 4;
    uint32_t lane = threadIdx.x & 31;
    float a0 = 0.0f, a1 = 0.0f;
#pragma unroll
    for (int u0 = 0; u0 < KC; u0 += G) {
        uint4 v[G];
#pragma unroll
        for (int u = 0; u < G; u++)
            v[u] = mk_lds_u4(row + 16 * (lane + 32 * (u0 + u)));
#pragma unroll
        for (int u = 0; u < G; u++) {
            const float *xu = x + 8 * (u0 + u);
            a0 = mk_fma2(v[u].x, xu[0], xu[1], a0, DT);
            a1 = mk_fma2(v[u].y, xu[2], xu[3], a1, DT);
            a0 = mk_fma2(v[u].z, xu[4], xu[5], a0, DT);
            a1 = mk_fma2(v[u].w, xu[6], xu[7], a1, DT);
        }
    }
    return a0 + a1;
}

/* A GEMV phase of 16-bit rows with K = 256 KC: x is read from shared memory into registers
 * once per phase (not once per row), rows go two per warp iteration (SwiGLU: the gate/up
 * pair) so that two dot products are in flight. */
template <int NT, int DT, int KC, bool SWIGLU>
__device__ __noinline__ void mk_gemv_regs(const struct mk_phase &P, struct mk_ring &rg, const float *xs,
                                          unsigned long long *best)
{
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int nw = NT / 32;
    /* x from shared memory (staged once per block) into registers. Tried: every warp reading
     * x from L2 and normalising it alone (no staging, no block barrier): 950 -> 731 tok/s,
     * 1,056 warps reading the same lines after each barrier. */
    float x[8 * KC];
    uint32_t xa = mk_smem_addr(xs);
#pragma unroll
    for (int u = 0; u < KC; u++) {
        float4 a = mk_lds_f4(xa + 32 * (lane + 32 * u)), b = mk_lds_f4(xa + 32 * (lane + 32 * u) + 16);
        x[8 * u + 0] = a.x, x[8 * u + 1] = a.y, x[8 * u + 2] = a.z, x[8 * u + 3] = a.w;
        x[8 * u + 4] = b.x, x[8 * u + 5] = b.y, x[8 * u + 6] = b.z, x[8 * u + 7] = b.w;
    }
    /* the ring's state in registers for the loop (rg itself is in local memory: its address
     * is taken) */
    const struct mk_ring ring = rg; /* a copy whose address is never taken: registers */
    const uint32_t base = mk_smem_addr(ring.base), bars = mk_smem_addr(ring.bar);
    const uint32_t sbytes = (uint32_t)ring.stage_bytes;
    unsigned long long *prof = ring.prof, top = 0;
    const struct mk_gdesc &D = ring.gt[P.gidx];
    const int32_t k0 = ring.gfirst[P.gidx], k1 = ring.gfirst[P.gidx + 1];
    const bool accum = P.mode == GEMV_ACCUM, argmax = P.argmax != 0;
    const uint32_t rb1 = (uint32_t)D.row_bytes[1];
    /* two rows per iteration unless x and two rows would not fit in the registers a thread
     * of an NT-thread block has */
    const int step = KC * 8 + 2 * 4 * (KC < 4 ? KC : 4) > (NT > 256 ? 96 : 200) ? 1 : 2;
    uint32_t next = rg.next;
    for (int32_t k = k0; k < k1; k++, next++) {
        const struct mk_chunk ch = ring.sched[k];
        uint32_t st = next % MK_STAGES;
        unsigned long long t1 = prof ? mk_globaltimer() : 0;
        mk_mbar_wait_at(bars + 8 * st, (next / MK_STAGES) & 1);
        if (prof)
            atomicAdd(&prof[1], mk_globaltimer() - t1);
        /* rows 16-byte aligned (mk_regs_kc): the copy starts at the stage, the up rows right
         * after the gate rows */
        const uint32_t rb0 = (uint32_t)D.row_bytes[ch.seg];
        const uint32_t b0 = base + st * sbytes, b1 = b0 + (uint32_t)ch.n * rb0;
        float *y = P.seg[ch.seg].y;
        for (int32_t i = warp; i < ch.n; i += step * nw) {
            int32_t i2 = step == 2 && i + nw < ch.n ? i + nw : i; /* the second row, or the first again */
            int64_t r = ch.r0 + i, r2 = ch.r0 + i2;
            if (SWIGLU) {
                float g = mk_dot_regs<DT, KC>(b0 + i * rb0, x), u = mk_dot_regs<DT, KC>(b1 + i * rb1, x);
                g = warp_sum(g), u = warp_sum(u);
                if (lane == 0)
                    y[r] = silu_f(g) * u;
                if (i2 == i)
                    continue;
                g = warp_sum(mk_dot_regs<DT, KC>(b0 + i2 * rb0, x));
                u = warp_sum(mk_dot_regs<DT, KC>(b1 + i2 * rb1, x));
                if (lane == 0)
                    y[r2] = silu_f(g) * u;
                continue;
            }
            float v = mk_dot_regs<DT, KC>(b0 + i * rb0, x);
            float v2 = i2 == i ? v : mk_dot_regs<DT, KC>(b0 + i2 * rb0, x);
            v = warp_sum(v), v2 = warp_sum(v2);
            if (lane == 0) {
                mk_store_row(y + r, v, accum);
                if (i2 != i)
                    mk_store_row(y + r2, v2, accum);
                if (argmax) {
                    if (v == v) {
                        unsigned long long key = mk_argmax_key(v, r);
                        top = key > top ? key : top;
                    }
                    if (v2 == v2) {
                        unsigned long long key = mk_argmax_key(v2, r2);
                        top = key > top ? key : top;
                    }
                }
            }
        }
        mk_release(ring, next);
    }
    rg.next = next;
    if (top > *best)
        *best = top;
}

/* 2-byte shared-memory load by address (Q8_0 blocks are 34 bytes: 2-byte aligned). */
__device__ __forceinline__ uint32_t mk_lds_u16(uint32_t a)
{
    unsigned short v;
    asm volatile("ld.shared.u16 %0, [%1];" : "=h"(v) : "r"(a));
    return v;
}

/* A GEMV phase of Q8_0 rows with K = 1024 KB (SwiGLU: gate and up both Q8_0): lane l takes
 * the 32-element blocks l + 32 u of every row and keeps their x in registers for the phase
 * (mk_dot_q8_0 read x from shared memory per element, lanes 128 bytes apart: one bank, a
 * 32-way conflict per read). Same arithmetic order as mk_dot_q8_0. */
template <int KB>
__device__ __forceinline__ float mk_dot_q8_regs(uint32_t row, const float *x)
{
    int lane = threadIdx.x & 31;
    float acc = 0.0f;
#pragma unroll
    for (int u = 0; u < KB; u++) {
        uint32_t b = row + 34u * (uint32_t)(lane + 32 * u);
        uint32_t q[17];
#pragma unroll
        for (int i = 0; i < 17; i++)
            q[i] = mk_lds_u16(b + 2 * i);
        const float *xu = x + 32 * u;
        float s = 0.0f;
#pragma unroll
        for (int i = 0; i < 16; i++) {
            s = fmaf((float)(int8_t)(q[1 + i] & 0xff), xu[2 * i], s);
            s = fmaf((float)(int8_t)(q[1 + i] >> 8), xu[2 * i + 1], s);
        }
        acc = fmaf(mk_f16((uint16_t)q[0]), s, acc);
    }
    return acc;
}

template <int NT, int KB, bool SWIGLU>
__device__ __noinline__ void mk_gemv_q8(const struct mk_phase &P, struct mk_ring &rg, const float *xs,
                                        unsigned long long *best)
{
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int nw = NT / 32;
    float x[32 * KB];
    uint32_t xa = mk_smem_addr(xs);
#pragma unroll
    for (int u = 0; u < KB; u++)
#pragma unroll
        for (int k = 0; k < 8; k++) {
            float4 v = mk_lds_f4(xa + 4 * (32 * (lane + 32 * u) + 4 * k));
            x[32 * u + 4 * k] = v.x, x[32 * u + 4 * k + 1] = v.y;
            x[32 * u + 4 * k + 2] = v.z, x[32 * u + 4 * k + 3] = v.w;
        }
    const struct mk_ring ring = rg; /* registers, as in mk_gemv_regs */
    const uint32_t base = mk_smem_addr(ring.base), bars = mk_smem_addr(ring.bar);
    const uint32_t sbytes = (uint32_t)ring.stage_bytes;
    unsigned long long *prof = ring.prof, top = 0;
    const struct mk_gdesc &D = ring.gt[P.gidx];
    const int32_t k0 = ring.gfirst[P.gidx], k1 = ring.gfirst[P.gidx + 1];
    const bool accum = P.mode == GEMV_ACCUM, argmax = P.argmax != 0;
    const uint32_t rb1 = (uint32_t)D.row_bytes[1];
    uint32_t next = ring.next;
    for (int32_t k = k0; k < k1; k++, next++) {
        const struct mk_chunk ch = ring.sched[k];
        uint32_t st = next % MK_STAGES;
        unsigned long long t1 = prof ? mk_globaltimer() : 0;
        mk_mbar_wait_at(bars + 8 * st, (next / MK_STAGES) & 1);
        if (prof)
            atomicAdd(&prof[1], mk_globaltimer() - t1);
        struct mk_copy cp;
        mk_chunk_copy(D, ch, cp);
        const uint32_t b0 = base + st * sbytes + cp.off[0], b1 = base + st * sbytes + cp.off[1];
        const uint32_t rb0 = (uint32_t)D.row_bytes[ch.seg];
        float *y = P.seg[ch.seg].y;
        for (int32_t i = warp; i < ch.n; i += nw) {
            int64_t r = ch.r0 + i;
            if (SWIGLU) {
                float g = warp_sum(mk_dot_q8_regs<KB>(b0 + i * rb0, x));
                float u = warp_sum(mk_dot_q8_regs<KB>(b1 + i * rb1, x));
                if (lane == 0)
                    y[r] = silu_f(g) * u;
                continue;
            }
            float v = warp_sum(mk_dot_q8_regs<KB>(b0 + i * rb0, x));
            if (lane == 0) {
                mk_store_row(y + r, v, accum);
                if (argmax && v == v) {
                    unsigned long long key = mk_argmax_key(v, r);
                    top = key > top ? key : top;
                }
            }
        }
        mk_release(ring, next);
    }
    rg.next = next;
    if (top > *best)
        *best = top;
}

/* The Q8_0 register path applies: every segment Q8_0, K of 1024, 2048 or 3072 (SwiGLU:
 * 1024). Returns K / 1024, or 0. */
__device__ __forceinline__ int mk_q8_kb(const struct mk_phase &P)
{
    int32_t n = P.mode == GEMV_SWIGLU ? 2 : P.n_seg;
    for (int32_t k = 0; k < n; k++)
        if (P.seg[k].dtype != QR_Q8_0)
            return 0;
    if (P.mode == GEMV_SWIGLU)
        return P.K == 1024 ? 1 : 0;
    return P.K == 1024 ? 1 : P.K == 2048 ? 2 : P.K == 3072 ? 3 : 0;
}

/* 1-byte and 16-byte shared-memory loads by address for the K-quant rows. */
__device__ __forceinline__ uint32_t mk_lds_u8(uint32_t a)
{
    unsigned short v;
    asm volatile("ld.shared.u8 %0, [%1];" : "=h"(v) : "r"(a));
    return v;
}

/* K-quant rows (Q4_K, Q6_K; Q4_K_M mixes them within a phase) with K = 1024 KB: x gathered
 * into registers once per phase in the element order each lane's dot product walks, then
 * every weight byte read with ld.shared. mk_dot_q4_k / mk_dot_q6_k read x from shared memory
 * per element with lanes 256 floats apart (16-way bank conflicts). Same arithmetic order as
 * those functions. */

/* Q4_K: lane (c, half) of super-block group lane / 8 takes super-blocks lane / 8 + 4 j: x[32 j
 * + i] = element 64 c + 16 half + i (i < 16) and, + 16, element 64 c + 16 half + 32 + i. */
template <int KB>
__device__ __forceinline__ void mk_gather_q4k(uint32_t xa, float *x)
{
    int lane = threadIdx.x & 31, l8 = lane & 7, c = l8 >> 1, half = l8 & 1;
#pragma unroll
    for (int j = 0; j < KB; j++) {
        uint32_t e = (uint32_t)(((lane >> 3) + 4 * j) * 256 + 64 * c + 16 * half);
#pragma unroll
        for (int k = 0; k < 4; k++) {
            float4 a = mk_lds_f4(xa + 4 * (e + 4 * k)), b = mk_lds_f4(xa + 4 * (e + 32 + 4 * k));
            x[32 * j + 4 * k] = a.x, x[32 * j + 4 * k + 1] = a.y, x[32 * j + 4 * k + 2] = a.z, x[32 * j + 4 * k + 3] = a.w;
            x[32 * j + 16 + 4 * k] = b.x, x[32 * j + 17 + 4 * k] = b.y, x[32 * j + 18 + 4 * k] = b.z, x[32 * j + 19 + 4 * k] = b.w;
        }
    }
}

template <int KB>
__device__ __forceinline__ float mk_dot_q4k_regs(uint32_t row, const float *x)
{
    int lane = threadIdx.x & 31, l8 = lane & 7, c = l8 >> 1, half = l8 & 1;
    float acc = 0.0f;
#pragma unroll
    for (int j = 0; j < KB; j++) {
        uint32_t b = row + 144u * (uint32_t)((lane >> 3) + 4 * j);
        uint4 hdr = mk_lds_u4(b), qv = mk_lds_u4(b + 16 + 32 * c + 16 * half);
        float d = mk_f16((uint16_t)(hdr.x & 0xffff)), dmin = mk_f16((uint16_t)(hdr.x >> 16));
        int sc0, m0, sc1, m1;
        mk_q4k_scale_min(hdr.y, hdr.z, hdr.w, 2 * c, &sc0, &m0);
        mk_q4k_scale_min(hdr.y, hdr.z, hdr.w, 2 * c + 1, &sc1, &m1);
        const float *x0 = x + 32 * j, *x1 = x0 + 16;
        float s0 = 0.0f, s1 = 0.0f, x0s = 0.0f, x1s = 0.0f;
#pragma unroll
        for (int i = 0; i < 16; i++) {
            uint32_t word = i < 4 ? qv.x : i < 8 ? qv.y : i < 12 ? qv.z : qv.w;
            uint32_t q = (word >> (8 * (i & 3))) & 0xffu;
            s0 = fmaf((float)(q & 0xF), x0[i], s0);
            s1 = fmaf((float)(q >> 4), x1[i], s1);
            x0s += x0[i];
            x1s += x1[i];
        }
        acc += d * ((float)sc0 * s0 + (float)sc1 * s1) - dmin * ((float)m0 * x0s + (float)m1 * x1s);
    }
    return acc;
}

/* Q6_K: lane (h, g) of super-block group lane / 16 takes super-blocks lane / 16 + 2 j: x[16 j
 * + 4 qq + i] = element 128 h + 4 g + 32 qq + i (qq, i < 4). */
template <int KB>
__device__ __forceinline__ void mk_gather_q6k(uint32_t xa, float *x)
{
    int lane = threadIdx.x & 31, s16 = lane & 15, h = s16 >> 3, g = s16 & 7;
#pragma unroll
    for (int j = 0; j < 2 * KB; j++) {
        uint32_t e = (uint32_t)(((lane >> 4) + 2 * j) * 256 + 128 * h + 4 * g);
#pragma unroll
        for (int qq = 0; qq < 4; qq++) {
            float4 a = mk_lds_f4(xa + 4 * (e + 32 * qq));
            x[16 * j + 4 * qq] = a.x, x[16 * j + 4 * qq + 1] = a.y, x[16 * j + 4 * qq + 2] = a.z, x[16 * j + 4 * qq + 3] = a.w;
        }
    }
}

template <int KB>
__device__ __forceinline__ float mk_dot_q6k_regs(uint32_t row, const float *x)
{
    int lane = threadIdx.x & 31, s16 = lane & 15, h = s16 >> 3, g = s16 & 7;
    float acc = 0.0f;
#pragma unroll
    for (int j = 0; j < 2 * KB; j++) {
        uint32_t b = row + 210u * (uint32_t)((lane >> 4) + 2 * j);
        uint32_t ql = b + 64 * h + 4 * g, qh = b + 128 + 32 * h + 4 * g, sc = b + 192 + 8 * h + g / 4;
        float d = mk_f16((uint16_t)(mk_lds_u8(b + 208) | (mk_lds_u8(b + 209) << 8)));
        uint32_t lo0[4], lo1[4], hb[4];
#pragma unroll
        for (int i = 0; i < 4; i++) {
            lo0[i] = mk_lds_u8(ql + i);
            lo1[i] = mk_lds_u8(ql + 32 + i);
            hb[i] = mk_lds_u8(qh + i);
        }
#pragma unroll
        for (int qq = 0; qq < 4; qq++) {
            float s = 0.0f;
#pragma unroll
            for (int i = 0; i < 4; i++) {
                int lo = ((qq & 1) ? lo1[i] : lo0[i]) >> ((qq >> 1) * 4) & 0xF;
                int q = (lo | (((hb[i] >> (2 * qq)) & 3) << 4)) - 32;
                s = fmaf((float)q, x[16 * j + 4 * qq + i], s);
            }
            acc = fmaf(d * (float)(int8_t)mk_lds_u8(sc + 2 * qq), s, acc);
        }
    }
    return acc;
}

/* One row of segment dtype dt (Q4_K or Q6_K) with the gathered x of its layout. */
template <int KB, bool L4, bool L6>
__device__ __forceinline__ float mk_dot_kq(int32_t dt, uint32_t row, const float *x4, const float *x6)
{
    if (L4 && (!L6 || dt == QR_Q4_K))
        return mk_dot_q4k_regs<KB>(row, x4);
    return mk_dot_q6k_regs<KB>(row, x6);
}

/* A GEMV phase of Q4_K / Q6_K rows (L4, L6: which layouts occur), K = 1024 KB. */
template <int NT, int KB, bool L4, bool L6>
__device__ __noinline__ void mk_gemv_kq(const struct mk_phase &P, struct mk_ring &rg, const float *xs,
                                        unsigned long long *best)
{
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int nw = NT / 32;
    float x4[L4 ? 32 * KB : 1], x6[L6 ? 32 * KB : 1];
    uint32_t xa = mk_smem_addr(xs);
    if (L4)
        mk_gather_q4k<KB>(xa, x4);
    if (L6)
        mk_gather_q6k<KB>(xa, x6);
    const struct mk_ring ring = rg; /* registers, as in mk_gemv_regs */
    const uint32_t base = mk_smem_addr(ring.base), bars = mk_smem_addr(ring.bar);
    const uint32_t sbytes = (uint32_t)ring.stage_bytes;
    unsigned long long *prof = ring.prof, top = 0;
    const struct mk_gdesc &D = ring.gt[P.gidx];
    const int32_t k0 = ring.gfirst[P.gidx], k1 = ring.gfirst[P.gidx + 1];
    const bool accum = P.mode == GEMV_ACCUM, argmax = P.argmax != 0, sw = P.mode == GEMV_SWIGLU;
    const uint32_t rb1 = (uint32_t)D.row_bytes[1];
    const int32_t dt1 = P.seg[1].dtype;
    uint32_t next = ring.next;
    for (int32_t k = k0; k < k1; k++, next++) {
        const struct mk_chunk ch = ring.sched[k];
        uint32_t st = next % MK_STAGES;
        unsigned long long t1 = prof ? mk_globaltimer() : 0;
        mk_mbar_wait_at(bars + 8 * st, (next / MK_STAGES) & 1);
        if (prof)
            atomicAdd(&prof[1], mk_globaltimer() - t1);
        struct mk_copy cp;
        mk_chunk_copy(D, ch, cp);
        const uint32_t b0 = base + st * sbytes + cp.off[0], b1 = base + st * sbytes + cp.off[1];
        const uint32_t rb0 = (uint32_t)D.row_bytes[ch.seg];
        const int32_t dt0 = P.seg[ch.seg].dtype;
        float *y = P.seg[ch.seg].y;
        for (int32_t i = warp; i < ch.n; i += nw) {
            int64_t r = ch.r0 + i;
            if (sw) {
                float g = warp_sum(mk_dot_kq<KB, L4, L6>(dt0, b0 + i * rb0, x4, x6));
                float u = warp_sum(mk_dot_kq<KB, L4, L6>(dt1, b1 + i * rb1, x4, x6));
                if (lane == 0)
                    y[r] = silu_f(g) * u;
                continue;
            }
            float v = warp_sum(mk_dot_kq<KB, L4, L6>(dt0, b0 + i * rb0, x4, x6));
            if (lane == 0) {
                mk_store_row(y + r, v, accum);
                if (argmax && v == v) {
                    unsigned long long key = mk_argmax_key(v, r);
                    top = key > top ? key : top;
                }
            }
        }
        mk_release(ring, next);
    }
    rg.next = next;
    if (top > *best)
        *best = top;
}

/* The K-quant register path: every segment Q4_K or Q6_K with 16-byte aligned rows (Q4_K's
 * loads are 16 bytes wide), K = 1024 (both layouts may occur) or 2048 / 3072 (one). Returns
 * KB * 4 + (Q4_K present) * 1 + (Q6_K present) * 2, or 0. */
__device__ __forceinline__ int mk_kq_kind(const struct mk_phase &P)
{
    int32_t n = P.mode == GEMV_SWIGLU ? 2 : P.n_seg, l4 = 0, l6 = 0;
    for (int32_t k = 0; k < n; k++) {
        if (P.seg[k].dtype == QR_Q4_K && P.seg[k].row_bytes % 16 == 0 && ((uintptr_t)P.seg[k].w & 15) == 0)
            l4 = 1;
        else if (P.seg[k].dtype == QR_Q6_K)
            l6 = 2;
        else
            return 0;
    }
    int kb = P.K == 1024 ? 1 : P.K == 2048 ? 2 : P.K == 3072 ? 3 : 0;
    if (kb == 0 || (kb > 1 && l4 && l6))
        return 0;
    return kb * 4 + l4 + l6;
}

/* The register path applies: every segment 16-bit of one dtype, K of 1024, 2048, 3072 or
 * 3584 (SwiGLU: 1024), rows 16-byte aligned. */
__device__ __forceinline__ int mk_regs_kc(const struct mk_phase &P)
{
    int32_t dt = P.seg[0].dtype, n = P.mode == GEMV_SWIGLU ? 2 : P.n_seg;
    if (dt != QR_BF16 && dt != QR_F16)
        return 0;
    for (int32_t k = 0; k < n; k++)
        if (P.seg[k].dtype != dt || !mk_float_fast(P.seg[k], P.K))
            return 0;
    if (P.mode == GEMV_SWIGLU)
        return P.K == 1024 ? 4 : 0;
    return P.K == 1024 ? 4 : P.K == 2048 ? 8 : P.K == 3072 ? 12 : P.K == 3584 ? 14 : 0; /* 3584: Qwen3.5's down */
}

