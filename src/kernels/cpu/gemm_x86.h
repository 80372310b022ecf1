/*
 * gemm_x86 - helpers shared by the AVX2 and AVX-512 kernel files (both are built with at
 * least AVX2, FMA and F16C; see CMakeLists.txt), so the two ISAs fold and widen the same
 * way from one definition. Internal to kernels/cpu; include only from *_avx2.c and
 * *_avx512.c.
 */
#ifndef WELD_KERNELS_CPU_GEMM_X86_H
#define WELD_KERNELS_CPU_GEMM_X86_H

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

/* The f16 at p (unaligned) as f32, exact. */
static inline float ld_h(const uint8_t *p)
{
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

/* fold(8) of gemm_scalar.c on a ymm: lanes i += i+4, i += i+2, i += i+1. */
static inline __attribute__((always_inline)) float fold8(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* Bytes 0-7: the eight 6-bit scales, bytes 8-15: the eight mins of a q4_K block, from its
   12 packed bytes (four at a time: the layout of dtype.h's scale_min_k4). */
static inline __attribute__((always_inline)) __m128i q4k_scales_mins(const uint8_t *q)
{
    uint32_t u[3], o[4];
    memcpy(u, q, 12);
    o[0] = u[0] & 0x3f3f3f3fu;
    o[1] = (u[2] & 0x0f0f0f0fu) | (((u[0] >> 6) & 0x03030303u) << 4);
    o[2] = u[1] & 0x3f3f3f3fu;
    o[3] = ((u[2] >> 4) & 0x0f0f0f0fu) | (((u[1] >> 6) & 0x03030303u) << 4);
    return _mm_loadu_si128((const __m128i *)o);
}

#endif
