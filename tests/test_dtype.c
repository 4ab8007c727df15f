/* test_dtype.c: scalar dtype conversions (bf16 round to nearest even and NaN
 * handling, fp8 e4m3fn round trip and saturation, f16 decode) and the dtype
 * name/size table. */
#include <stdint.h>

#include "core/dtype.h"
#include "core/status.h"
#include "harness.h"

static float f32_from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static void test_bf16_exact_values(void)
{
    CHECK(dflash_f32_to_bf16(1.0f) == 0x3f80);
    CHECK(dflash_f32_to_bf16(-2.0f) == 0xc000);
    CHECK(dflash_f32_to_bf16(0.0f) == 0x0000);
    CHECK(dflash_f32_to_bf16(-0.0f) == 0x8000);
    CHECK(dflash_f32_to_bf16(INFINITY) == 0x7f80);
    CHECK(dflash_f32_to_bf16(-INFINITY) == 0xff80);
    CHECK(dflash_bf16_to_f32(0x3f80) == 1.0f);
    CHECK(dflash_bf16_to_f32(0xc040) == -3.0f);
    /* Every bf16 bit pattern that is not NaN survives a round trip. */
    int bad = 0;
    for (uint32_t h = 0; h < 0x10000; h++) {
        float f = dflash_bf16_to_f32((uint16_t)h);
        if (!isnan(f) && dflash_f32_to_bf16(f) != h)
            bad++;
    }
    CHECKF(bad == 0, "%d bf16 codes do not round-trip", bad);
}

static void test_bf16_round_nearest_even(void)
{
    /* Exactly halfway: ties go to the even bf16 mantissa. */
    CHECK(dflash_f32_to_bf16(f32_from_bits(0x3f808000u)) == 0x3f80); /* even below: down */
    CHECK(dflash_f32_to_bf16(f32_from_bits(0x3f818000u)) == 0x3f82); /* odd below: up */
    CHECK(dflash_f32_to_bf16(f32_from_bits(0xbf818000u)) == 0xbf82); /* sign symmetric */
    /* Off the tie: plain nearest. */
    CHECK(dflash_f32_to_bf16(f32_from_bits(0x3f808001u)) == 0x3f81);
    CHECK(dflash_f32_to_bf16(f32_from_bits(0x3f807fffu)) == 0x3f80);
    /* The largest finite float rounds up to infinity, as RNE requires. */
    CHECK(dflash_f32_to_bf16(f32_from_bits(0x7f7fffffu)) == 0x7f80);
    CHECK(dflash_round_bf16(1.00390625f) == 1.0f); /* 1 + 2^-8: tie, to even */
}

static void test_bf16_nan(void)
{
    /* A NaN whose payload lives only in the low 16 bits must stay NaN
     * (plain truncation would make it infinity), quiet, with its sign. */
    uint16_t h = dflash_f32_to_bf16(f32_from_bits(0x7f800001u));
    CHECK(isnan(dflash_bf16_to_f32(h)));
    CHECK((h & 0x0040) != 0);
    CHECK((h & 0x8000) == 0);
    h = dflash_f32_to_bf16(f32_from_bits(0xffc00000u));
    CHECK(isnan(dflash_bf16_to_f32(h)));
    CHECK((h & 0x8000) != 0);
    CHECK(isnan(dflash_round_bf16(NAN)));
}

static void test_fp8_round_trip_all_codes(void)
{
    int nan_codes = 0, bad = 0;
    for (int c = 0; c < 256; c++) {
        float f = dflash_fp8e4m3_to_f32((uint8_t)c);
        if (isnan(f)) {
            nan_codes++;
            CHECK(dflash_f32_to_fp8e4m3(f) == 0x7f);
            continue;
        }
        if (dflash_f32_to_fp8e4m3(f) != (uint8_t)c) {
            bad++;
            fprintf(stderr, "  fp8 code 0x%02x -> %g -> 0x%02x\n", c, f, dflash_f32_to_fp8e4m3(f));
        }
    }
    CHECK(nan_codes == 2); /* only 0x7f and 0xff */
    CHECK(bad == 0);
    CHECK(dflash_fp8e4m3_to_f32(0x7e) == 448.0f);
    CHECK(dflash_fp8e4m3_to_f32(0xfe) == -448.0f);
    CHECK(dflash_fp8e4m3_to_f32(0x01) == ldexpf(1.0f, -9)); /* smallest subnormal */
    CHECK(dflash_fp8e4m3_to_f32(0x08) == ldexpf(1.0f, -6)); /* smallest normal */
    CHECK(dflash_fp8e4m3_to_f32(0x38) == 1.0f);
}

static void test_fp8_saturation_and_ties(void)
{
    CHECK(dflash_f32_to_fp8e4m3(448.0f) == 0x7e);
    CHECK(dflash_f32_to_fp8e4m3(460.0f) == 0x7e);
    CHECK(dflash_f32_to_fp8e4m3(1e9f) == 0x7e);
    CHECK(dflash_f32_to_fp8e4m3(INFINITY) == 0x7e);
    CHECK(dflash_f32_to_fp8e4m3(-1e9f) == 0xfe);
    CHECK(dflash_f32_to_fp8e4m3(-INFINITY) == 0xfe);
    CHECK(dflash_f32_to_fp8e4m3(NAN) == 0x7f);
    /* 1.0625 lies halfway between 1.0 (0x38) and 1.125 (0x39): even wins. */
    CHECK(dflash_f32_to_fp8e4m3(1.0625f) == 0x38);
    /* 1.1875 lies halfway between 1.125 (0x39) and 1.25 (0x3a). */
    CHECK(dflash_f32_to_fp8e4m3(1.1875f) == 0x3a);
    CHECK(dflash_f32_to_fp8e4m3(1.07f) == 0x39);
    /* Half the smallest subnormal ties to zero; just above rounds up. */
    CHECK(dflash_f32_to_fp8e4m3(ldexpf(1.0f, -10)) == 0x00);
    CHECK(dflash_f32_to_fp8e4m3(ldexpf(1.1f, -10)) == 0x01);
    CHECK(dflash_f32_to_fp8e4m3(-0.0f) == 0x80);
}

static void test_f16_decode(void)
{
    CHECK(dflash_f16_to_f32(0x3c00) == 1.0f);
    CHECK(dflash_f16_to_f32(0xc000) == -2.0f);
    CHECK(dflash_f16_to_f32(0x3555) == 0x1.554p-2f);
    CHECK(dflash_f16_to_f32(0x7bff) == 65504.0f);
    CHECK(dflash_f16_to_f32(0x0001) == ldexpf(1.0f, -24));
    CHECK(dflash_f16_to_f32(0x0400) == ldexpf(1.0f, -14));
    CHECK(dflash_f16_to_f32(0x7c00) == INFINITY);
    CHECK(dflash_f16_to_f32(0xfc00) == -INFINITY);
    CHECK(isnan(dflash_f16_to_f32(0x7e00)));
    float z = dflash_f16_to_f32(0x8000);
    CHECK(z == 0.0f && signbit(z));
}

static void test_dtype_table(void)
{
    const dflash_dtype all[] = { DFLASH_DTYPE_F32, DFLASH_DTYPE_F16, DFLASH_DTYPE_BF16,
                                 DFLASH_DTYPE_F8_E4M3, DFLASH_DTYPE_I32, DFLASH_DTYPE_I64 };
    const size_t sizes[] = { 4, 2, 2, 1, 4, 8 };
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        CHECK(dflash_dtype_size(all[i]) == sizes[i]);
        CHECK(dflash_dtype_from_name(dflash_dtype_name(all[i])) == all[i]);
    }
    CHECK(dflash_dtype_size(DFLASH_DTYPE_INVALID) == 0);
    CHECK(dflash_dtype_from_name("F64") == DFLASH_DTYPE_INVALID);
    CHECK(dflash_dtype_from_name("bf16") == DFLASH_DTYPE_INVALID);
    CHECK(strcmp(dflash_dtype_name(DFLASH_DTYPE_BF16), "BF16") == 0);
}

/* The fast f32 -> e4m3 rounding equals the nearest code (ties to even)
 * found by brute force, on a spread of floats and on every midpoint. */
static uint8_t fp8_nearest(float f)
{
    if (isnan(f))
        return 0x7f;
    uint8_t sign = signbit(f) ? 0x80 : 0, best = 0;
    float a = fabsf(f), best_err = INFINITY;
    if (a >= 448.0f)
        return sign | 0x7e;
    for (uint8_t c = 0; c <= 0x7e; c++) {
        float err = fabsf(dflash_fp8e4m3_to_f32(c) - a);
        if (err < best_err || (err == best_err && (c & 1u) == 0)) {
            best = c;
            best_err = err;
        }
    }
    return sign | best;
}

static void test_fp8_rounding_matches_brute_force(void)
{
    long bad = 0;
    for (uint64_t x = 0; x < 0x100000000ull; x += 65521) {
        uint32_t u = (uint32_t)x;
        float f;
        memcpy(&f, &u, sizeof f);
        if (!isinf(f) && dflash_f32_to_fp8e4m3(f) != fp8_nearest(f))
            bad++;
    }
    for (int c = 0; c < 0x7e; c++) {
        float m = (dflash_fp8e4m3_to_f32((uint8_t)c) + dflash_fp8e4m3_to_f32((uint8_t)(c + 1))) / 2;
        bad += dflash_f32_to_fp8e4m3(m) != fp8_nearest(m);
        bad += dflash_f32_to_fp8e4m3(-m) != fp8_nearest(-m);
    }
    CHECKF(bad == 0, "%ld floats round to the wrong fp8 code", bad);
}

int main(void)
{
    RUN(test_bf16_exact_values);
    RUN(test_bf16_round_nearest_even);
    RUN(test_bf16_nan);
    RUN(test_fp8_round_trip_all_codes);
    RUN(test_fp8_saturation_and_ties);
    RUN(test_f16_decode);
    RUN(test_dtype_table);
    RUN(test_fp8_rounding_matches_brute_force);
    TEST_END();
}
