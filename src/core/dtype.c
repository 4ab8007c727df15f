/* dtype.c: dtype names and sizes, and the conversions that are too long to
 * inline (f16 and fp8 e4m3). */
#include "core/dtype.h"

#include <math.h>
#include <string.h>

static const struct {
    dflash_dtype t;
    const char *name;
    size_t size;
} k_dtypes[] = {
    { DFLASH_DTYPE_F32, "F32", 4 },     { DFLASH_DTYPE_F16, "F16", 2 },
    { DFLASH_DTYPE_BF16, "BF16", 2 },   { DFLASH_DTYPE_F8_E4M3, "F8_E4M3", 1 },
    { DFLASH_DTYPE_I32, "I32", 4 },     { DFLASH_DTYPE_I64, "I64", 8 },
};

size_t dflash_dtype_size(dflash_dtype t)
{
    for (size_t i = 0; i < sizeof k_dtypes / sizeof k_dtypes[0]; i++)
        if (k_dtypes[i].t == t)
            return k_dtypes[i].size;
    return 0;
}

const char *dflash_dtype_name(dflash_dtype t)
{
    for (size_t i = 0; i < sizeof k_dtypes / sizeof k_dtypes[0]; i++)
        if (k_dtypes[i].t == t)
            return k_dtypes[i].name;
    return "INVALID";
}

dflash_dtype dflash_dtype_from_name(const char *name)
{
    for (size_t i = 0; i < sizeof k_dtypes / sizeof k_dtypes[0]; i++)
        if (strcmp(k_dtypes[i].name, name) == 0)
            return k_dtypes[i].t;
    return DFLASH_DTYPE_INVALID;
}

float dflash_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h >> 15) & 1u, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    float v;
    if (exp == 0)
        v = ldexpf((float)man, -24); /* subnormal (or zero) */
    else if (exp == 31)
        v = man ? NAN : INFINITY;
    else
        v = ldexpf((float)(man | 0x400u), (int)exp - 25);
    return sign ? -v : v;
}

/* e4m3fn: 1 sign, 4 exponent (bias 7), 3 mantissa; no infinities; only
 * S.1111.111 is NaN, so the largest finite value is 1.75 * 2^8 = 448. */
float dflash_fp8e4m3_to_f32(uint8_t b)
{
    uint32_t sign = b >> 7, exp = (b >> 3) & 0xfu, man = b & 0x7u;
    float v;
    if (exp == 15 && man == 7)
        return NAN;
    if (exp == 0)
        v = ldexpf((float)man, -9); /* subnormal: man/8 * 2^-6 */
    else
        v = ldexpf((float)(man | 8u), (int)exp - 10);
    return sign ? -v : v;
}

uint8_t dflash_f32_to_fp8e4m3(float f)
{
    if (isnan(f))
        return 0x7f;
    uint8_t sign = signbit(f) ? 0x80 : 0;
    float a = fabsf(f);
    if (a >= 448.0f)
        return sign | 0x7e; /* saturate to the largest finite value */
    /* Quantize to a grid of 8 steps per binade: below 2^-6 (subnormals) the
     * step is 2^-9; above, 2^(e-3) for a in [2^e, 2^(e+1)). rintf rounds
     * half to even in the default mode; a mantissa that rounds up to 16
     * steps is the next binade's first code, which the arithmetic gives. */
    int e = 0;
    if (a >= 0x1p-6f)
        frexpf(a, &e); /* a = m * 2^e, m in [0.5, 1): binade 2^(e-1) */
    int binade = a >= 0x1p-6f ? e - 1 : -6;
    float q = rintf(ldexpf(a, 3 - binade)); /* steps of 2^(binade-3) */
    if (binade == -6 && q < 8.0f)
        return sign | (uint8_t)q; /* subnormal (or zero) */
    /* q in [8, 16]: exponent field binade + 7, mantissa q - 8 */
    int code = ((binade + 7) << 3) + ((int)q - 8);
    return sign | (uint8_t)(code > 0x7e ? 0x7e : code);
}
