/*
 * half.h — IEEE fp16 and bfloat16 <-> f32 conversion (exact, round-to-nearest-even).
 * Header-only so kernels inline them. Special values (inf, NaN, subnormals) are preserved.
 */
#ifndef QWENRT_BASE_HALF_H
#define QWENRT_BASE_HALF_H

#include <stdint.h>
#include <string.h>

static inline float f32_from_bits(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static inline uint32_t f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

static inline float bf16_to_f32(uint16_t h) { return f32_from_bits((uint32_t)h << 16); }

static inline uint16_t f32_to_bf16(float f)
{
    uint32_t u = f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) /* NaN: keep it a (quiet) NaN */
        return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* Without branches (masks), so that a loop of them vectorises, even with SSE2: kv_load's rows
 * of an f16 KV cache for the reference attention, which CPUs without AVX-512 run (+10% decode
 * at 1,024 tokens of context; docs/perf-log.md, session 17). Exponent and mantissa move up 13
 * bits as one field; the exponent is rebiased by 112 (15 -> 127), or by 224 for inf / NaN (31
 * -> 255, payload kept, signalling or not); subnormals and zero are man * 2^-24, exact in f32.
 * tests/test_half.c compares all 65,536 inputs with a plain case-by-case conversion. */
static inline float f16_to_f32(uint16_t h)
{
    uint32_t em = h & 0x7fffu, sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t special = 0u - (uint32_t)(em >= 0x7c00u), tiny = 0u - (uint32_t)(em < 0x400u); /* masks */
    uint32_t bits = (em << 13) + (112u << 23) + (special & (112u << 23));
    uint32_t small = f32_bits((float)(int32_t)em * (1.0f / 16777216.0f)); /* int: SSE2 converts it */
    return f32_from_bits(sign | (tiny & small) | (~tiny & bits));
}

static inline uint16_t f32_to_f16(float f)
{
    uint32_t u = f32_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t au = u & 0x7fffffffu;
    if (au >= 0x7f800000u) /* inf or NaN */
        return (uint16_t)(sign | 0x7c00u | (au > 0x7f800000u ? 0x200u : 0));
    if (au >= 0x477ff000u) /* rounds to >= 65520: overflow to inf */
        return (uint16_t)(sign | 0x7c00u);
    if (au < 0x38800000u) { /* below the smallest normal: subnormal or zero */
        float a = f32_from_bits(au);
        /* a * 2^24 rounded to nearest even integer gives the subnormal mantissa */
        float r = a * 16777216.0f;
        uint32_t m = (uint32_t)r;
        float frac = r - (float)m;
        if (frac > 0.5f || (frac == 0.5f && (m & 1u)))
            m++;
        return (uint16_t)(sign | m);
    }
    uint32_t mant = au & 0x7fffffu;
    uint32_t exp = (au >> 23) - 112u;
    uint32_t h = (exp << 10) | (mant >> 13);
    uint32_t rest = mant & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u)))
        h++;
    return (uint16_t)(sign | h);
}

#endif
