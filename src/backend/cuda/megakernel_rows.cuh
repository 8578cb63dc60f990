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
 * which phases qualify; the rest take mk_gemv_chunks. The quantised row functions live in
 * quant_rows.cuh (shared with the graph's quantised GEMV). The arithmetic order of each dot product
 * is the generic one's (mk_dot_float, mk_dot_q8_0, mk_dot_q4_k, mk_dot_q6_k), which
 * test_cuda_graph checks against the graph program at the real widths.
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
        unsigned long long t1 = prof ? globaltimer_ns() : 0;
        mk_mbar_wait_at(bars + 8 * st, (next / MK_STAGES) & 1);
        if (prof)
            atomicAdd(&prof[1], globaltimer_ns() - t1);
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

/* A GEMV phase of Q8_0 rows with K = 1024 KB (SwiGLU: gate and up both Q8_0): x in registers
 * for the phase (mk_gather_q8), rows by mk_dot_q8_regs (quant_rows.cuh). */
template <int NT, int KB, bool SWIGLU>
__device__ __noinline__ void mk_gemv_q8(const struct mk_phase &P, struct mk_ring &rg, const float *xs,
                                        unsigned long long *best)
{
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int nw = NT / 32;
    float x[32 * KB];
    mk_gather_q8<KB>(mk_smem_addr(xs), x);
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
        unsigned long long t1 = prof ? globaltimer_ns() : 0;
        mk_mbar_wait_at(bars + 8 * st, (next / MK_STAGES) & 1);
        if (prof)
            atomicAdd(&prof[1], globaltimer_ns() - t1);
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

/* A GEMV phase of Q4_K / Q6_K rows (L4, L6: which layouts occur), K = 1024 KB: x gathered
 * in both layouts that occur, rows by mk_dot_kq (quant_rows.cuh). */
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
        unsigned long long t1 = prof ? globaltimer_ns() : 0;
        mk_mbar_wait_at(bars + 8 * st, (next / MK_STAGES) & 1);
        if (prof)
            atomicAdd(&prof[1], globaltimer_ns() - t1);
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

