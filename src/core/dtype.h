/* dtype.h: the element types dflash stores (as safetensors names them) and
 * scalar conversions: bf16 <-> f32 (round to nearest even, NaN kept quiet),
 * fp8 e4m3fn <-> f32 (saturating to +-448, NaN kept). */
#ifndef DFLASH_CORE_DTYPE_H
#define DFLASH_CORE_DTYPE_H

#include <stddef.h>
#include <stdint.h>

typedef enum dflash_dtype {
    DFLASH_DTYPE_INVALID = 0,
    DFLASH_DTYPE_F32,
    DFLASH_DTYPE_F16,
    DFLASH_DTYPE_BF16,
    DFLASH_DTYPE_F8_E4M3,
    DFLASH_DTYPE_I32,
    DFLASH_DTYPE_I64,
} dflash_dtype;

/* Bytes per element (0 for INVALID). */
size_t dflash_dtype_size(dflash_dtype t);
/* Safetensors name ("BF16", "F8_E4M3", ...), and back (INVALID if unknown). */
const char *dflash_dtype_name(dflash_dtype t);
dflash_dtype dflash_dtype_from_name(const char *name);

static inline float dflash_bf16_to_f32(uint16_t h)
{
    union { uint32_t u; float f; } v = { (uint32_t)h << 16 };
    return v.f;
}

static inline uint16_t dflash_f32_to_bf16(float f)
{
    union { float f; uint32_t u; } v = { f };
    if ((v.u & 0x7fffffffu) > 0x7f800000u) /* NaN: keep sign, force quiet */
        return (uint16_t)((v.u >> 16) | 0x0040u);
    uint32_t rounding = 0x7fffu + ((v.u >> 16) & 1u);
    return (uint16_t)((v.u + rounding) >> 16);
}

/* Round f32 to the nearest bf16 value, returned as f32. */
static inline float dflash_round_bf16(float f) { return dflash_bf16_to_f32(dflash_f32_to_bf16(f)); }

float dflash_f16_to_f32(uint16_t h);
float dflash_fp8e4m3_to_f32(uint8_t b);
/* Round to nearest even; |f| beyond 448 saturates to +-448; NaN -> 0x7f. */
uint8_t dflash_f32_to_fp8e4m3(float f);

#endif
