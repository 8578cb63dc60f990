/*
 * quant_rows.cuh — dot products of one quantised weight row held in shared memory with x held
 * in registers, for a whole warp: Q8_0 (mk_dot_q8_regs), Q4_K and Q6_K (mk_dot_q4k_regs,
 * mk_dot_q6k_regs, mk_dot_kq for Q4_K_M's mixed rows), each with the gather that puts x in
 * the element order its lanes walk (read once per phase or row from staged x, without bank
 * conflicts), and the shared-memory loads by address they use. The decode megakernel's GEMV
 * phases (megakernel_rows.cuh) and the graph's quantised GEMV (gemv_quant.cu) share them, so
 * both sum in the same order; the functions keep the megakernel's mk_ prefix.
 *
 * Rows are addressed by their 32-bit shared-memory address; K = 1024 KB. The lane returns its
 * partial sum: the caller reduces over the warp.
 */
#ifndef QWENRT_BACKEND_CUDA_QUANT_ROWS_CUH
#define QWENRT_BACKEND_CUDA_QUANT_ROWS_CUH

#include <cuda_fp16.h>
#include <stdint.h>

extern "C" {
#include "format/dtype.h"
}

__device__ __forceinline__ float mk_f16(uint16_t u) { return __half2float(__ushort_as_half(u)); }

/* Byte i of the 12 scale bytes held in three words. */
__device__ __forceinline__ int mk_sbyte(uint32_t a, uint32_t b, uint32_t c, int i)
{
    uint32_t w = i < 4 ? a : i < 8 ? b : c;
    return (int)((w >> (8 * (i & 3))) & 0xffu);
}

__device__ __forceinline__ void mk_q4k_scale_min(uint32_t a, uint32_t b, uint32_t c, int sub, int *sc,
                                                 int *m)
{
#define s(i) mk_sbyte(a, b, c, i)
    if (sub < 4) {
        *sc = s(sub) & 63;
        *m = s(sub + 4) & 63;
    } else {
        *sc = (s(sub + 4) & 0xF) | ((s(sub - 4) >> 6) << 4);
        *m = (s(sub + 4) >> 4) | ((s(sub) >> 6) << 4);
    }
#undef s
}

__device__ __forceinline__ uint32_t mk_smem_addr(const void *p)
{
    return (uint32_t)__cvta_generic_to_shared(p);
}

/* 16-byte shared-memory loads by address: the stage and x pointers live in structs, so
 * the compiler cannot see they are shared and would emit generic loads (LD.E, measured in
 * the hot loop by ncu) instead of LDS. volatile: never moved above the mbarrier wait. */
__device__ __forceinline__ uint4 mk_lds_u4(uint32_t a)
{
    uint4 v;
    asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(a));
    return v;
}

__device__ __forceinline__ float4 mk_lds_f4(uint32_t a)
{
    float4 v;
    asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(a));
    return v;
}

/* 2-byte shared-memory load by address (Q8_0 blocks are 34 bytes: 2-byte aligned). */
__device__ __forceinline__ uint32_t mk_lds_u16(uint32_t a)
{
    unsigned short v;
    asm volatile("ld.shared.u16 %0, [%1];" : "=h"(v) : "r"(a));
    return v;
}

/* Q8_0 rows with K = 1024 KB (NB = K / 32 blocks; NB = 112, K = 3584, leaves lanes without
 * a block in the last round): lane l takes the 32-element blocks l + 32 u of the row, with
 * their x in registers (mk_gather_q8; reading x from shared memory per element, lanes 128
 * bytes apart, is one bank: a 32-way conflict per read). Same arithmetic order as the
 * megakernel's generic mk_dot_q8_0. */
template <int KB, int NB = 32 * KB>
__device__ __forceinline__ float mk_dot_q8_regs(uint32_t row, const float *x)
{
    int lane = threadIdx.x & 31;
    float acc = 0.0f;
#pragma unroll
    for (int u = 0; u < (NB + 31) / 32; u++) {
        if (NB % 32 && lane + 32 * u >= NB)
            break;
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

/* Q8_0's x for mk_dot_q8_regs: lane l gets the 32 elements of blocks l + 32 u (u < KB). */
template <int KB, int NB = 32 * KB>
__device__ __forceinline__ void mk_gather_q8(uint32_t xa, float *x)
{
    int lane = threadIdx.x & 31;
#pragma unroll
    for (int u = 0; u < (NB + 31) / 32; u++)
#pragma unroll
        for (int k = 0; k < 8; k++) {
            if (NB % 32 && lane + 32 * u >= NB)
                break;
            float4 v = mk_lds_f4(xa + 4 * (32 * (lane + 32 * u) + 4 * k));
            x[32 * u + 4 * k] = v.x, x[32 * u + 4 * k + 1] = v.y;
            x[32 * u + 4 * k + 2] = v.z, x[32 * u + 4 * k + 3] = v.w;
        }
}

/* 1-byte and 16-byte shared-memory loads by address for the K-quant rows. */
__device__ __forceinline__ uint32_t mk_lds_u8(uint32_t a)
{
    unsigned short v;
    asm volatile("ld.shared.u8 %0, [%1];" : "=h"(v) : "r"(a));
    return v;
}

/* K-quant rows (Q4_K, Q6_K; Q4_K_M mixes them) with K = 1024 KB: x gathered into registers
 * in the element order each lane's dot product walks, then every weight byte read with
 * ld.shared. The megakernel's generic mk_dot_q4_k / mk_dot_q6_k read x from shared memory per
 * element with lanes 256 floats apart (16-way bank conflicts). Same arithmetic order as
 * those functions. */

/* One lane's part of a Q4_K super-block with header hdr: its 16 bytes qv of chunk c (low
 * nibbles: sub-block 2c, against x0; high nibbles: sub-block 2c + 1, against x1; 16 elements
 * each). Every Q4_K dot product here sums in this order. */
__device__ __forceinline__ float mk_q4k_lane(uint4 hdr, uint4 qv, int c, const float *x0, const float *x1)
{
    float d = mk_f16((uint16_t)(hdr.x & 0xffff)), dmin = mk_f16((uint16_t)(hdr.x >> 16));
    int sc0, m0, sc1, m1;
    mk_q4k_scale_min(hdr.y, hdr.z, hdr.w, 2 * c, &sc0, &m0);
    mk_q4k_scale_min(hdr.y, hdr.z, hdr.w, 2 * c + 1, &sc1, &m1);
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
    return d * ((float)sc0 * s0 + (float)sc1 * s1) - dmin * ((float)m0 * x0s + (float)m1 * x1s);
}

/* Q4_K: lane (c, half) of super-block group lane / 8 takes super-blocks lane / 8 + 4 j: x[32 j
 * + i] = element 64 c + 16 half + i (i < 16) and, + 16, element 64 c + 16 half + 32 + i.
 * NSB = K / 256 super-blocks (14 for K = 3584: the last round has two groups). */
template <int KB, int NSB = 4 * KB>
__device__ __forceinline__ void mk_gather_q4k(uint32_t xa, float *x)
{
    int lane = threadIdx.x & 31, l8 = lane & 7, c = l8 >> 1, half = l8 & 1;
#pragma unroll
    for (int j = 0; j < (NSB + 3) / 4; j++) {
        if (NSB % 4 && (lane >> 3) + 4 * j >= NSB)
            break;
        uint32_t e = (uint32_t)(((lane >> 3) + 4 * j) * 256 + 64 * c + 16 * half);
#pragma unroll
        for (int k = 0; k < 4; k++) {
            float4 a = mk_lds_f4(xa + 4 * (e + 4 * k)), b = mk_lds_f4(xa + 4 * (e + 32 + 4 * k));
            x[32 * j + 4 * k] = a.x, x[32 * j + 4 * k + 1] = a.y, x[32 * j + 4 * k + 2] = a.z, x[32 * j + 4 * k + 3] = a.w;
            x[32 * j + 16 + 4 * k] = b.x, x[32 * j + 17 + 4 * k] = b.y, x[32 * j + 18 + 4 * k] = b.z, x[32 * j + 19 + 4 * k] = b.w;
        }
    }
}

/* Where a Q6_K lane reads its quarters' 8-bit scales (quarter qq at byte 2 qq): a shared-memory
 * address (gemvq, the megakernel's register paths) or a pointer (the generic path). */
struct q6k_sc_smem {
    uint32_t a;
    __device__ __forceinline__ float operator()(int qq) const { return (float)(int8_t)mk_lds_u8(a + 2 * qq); }
};
struct q6k_sc_ptr {
    const int8_t *p;
    __device__ __forceinline__ float operator()(int qq) const { return (float)p[2 * qq]; }
};

/* One lane's part of a Q6_K super-block (scale d) added to acc: its 4 low-bit bytes of each
 * quarter pair (lo0, lo1), its 4 high-bit bytes hb, the quarters' scales from sc; element i
 * of quarter qq is x[XS * qq + i]. Every Q6_K dot product here sums in this order. */
template <int XS, typename B, typename SC>
__device__ __forceinline__ float mk_q6k_lane(float d, const B (&lo0)[4], const B (&lo1)[4], const B (&hb)[4], SC sc,
                                             const float *x, float acc)
{
#pragma unroll
    for (int qq = 0; qq < 4; qq++) {
        float s = 0.0f;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            int lo = ((qq & 1) ? lo1[i] : lo0[i]) >> ((qq >> 1) * 4) & 0xF;
            int q = (lo | (((hb[i] >> (2 * qq)) & 3) << 4)) - 32;
            s = fmaf((float)q, x[XS * qq + i], s);
        }
        acc = fmaf(d * sc(qq), s, acc);
    }
    return acc;
}

template <int KB, int NSB = 4 * KB>
__device__ __forceinline__ float mk_dot_q4k_regs(uint32_t row, const float *x)
{
    int lane = threadIdx.x & 31, l8 = lane & 7, c = l8 >> 1, half = l8 & 1;
    float acc = 0.0f;
#pragma unroll
    for (int j = 0; j < (NSB + 3) / 4; j++) {
        if (NSB % 4 && (lane >> 3) + 4 * j >= NSB)
            break;
        uint32_t b = row + 144u * (uint32_t)((lane >> 3) + 4 * j);
        uint4 hdr = mk_lds_u4(b), qv = mk_lds_u4(b + 16 + 32 * c + 16 * half);
        acc += mk_q4k_lane(hdr, qv, c, x + 32 * j, x + 32 * j + 16);
    }
    return acc;
}

/* Q6_K: lane (h, g) of super-block group lane / 16 takes super-blocks lane / 16 + 2 j: x[16 j
 * + 4 qq + i] = element 128 h + 4 g + 32 qq + i (qq, i < 4). NSB = K / 256 super-blocks. */
template <int KB, int NSB = 4 * KB>
__device__ __forceinline__ void mk_gather_q6k(uint32_t xa, float *x)
{
    int lane = threadIdx.x & 31, s16 = lane & 15, h = s16 >> 3, g = s16 & 7;
#pragma unroll
    for (int j = 0; j < (NSB + 1) / 2; j++) {
        if (NSB % 2 && (lane >> 4) + 2 * j >= NSB)
            break;
        uint32_t e = (uint32_t)(((lane >> 4) + 2 * j) * 256 + 128 * h + 4 * g);
#pragma unroll
        for (int qq = 0; qq < 4; qq++) {
            float4 a = mk_lds_f4(xa + 4 * (e + 32 * qq));
            x[16 * j + 4 * qq] = a.x, x[16 * j + 4 * qq + 1] = a.y, x[16 * j + 4 * qq + 2] = a.z, x[16 * j + 4 * qq + 3] = a.w;
        }
    }
}

template <int KB, int NSB = 4 * KB>
__device__ __forceinline__ float mk_dot_q6k_regs(uint32_t row, const float *x)
{
    int lane = threadIdx.x & 31, s16 = lane & 15, h = s16 >> 3, g = s16 & 7;
    float acc = 0.0f;
#pragma unroll
    for (int j = 0; j < (NSB + 1) / 2; j++) {
        if (NSB % 2 && (lane >> 4) + 2 * j >= NSB)
            break;
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
        acc = mk_q6k_lane<4>(d, lo0, lo1, hb, q6k_sc_smem{sc}, x + 16 * j, acc);
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

#endif
