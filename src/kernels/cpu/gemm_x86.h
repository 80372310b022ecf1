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
struct gemm_args;
/* BF16 products and activations (gemm.h's BF16 contract) of AVX-512 (gemm_bf16_avx512.c)
   and AVX2 (gemm_bf16_avx2.c). */
void gemm_bf16_avx512(const struct gemm_args *a);
void gemm_bf16_act_avx512(const float *x, int64_t k, uint16_t *dst);
void gemm_bf16_avx2(const struct gemm_args *a);
void gemm_bf16_act_avx2(const float *x, int64_t k, uint16_t *dst);

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
   12 packed bytes at q (the layout of dtype.h's scale_min_k4), four at a time in 32-bit
   lanes, with u0..u2 the packed words:
     scales 0-3 = u0 & 0x3f..,  scales 4-7 = (u2 & 0x0f..) | ((u0 >> 6) & 0x03..) << 4,
     mins 0-3   = u1 & 0x3f..,  mins 4-7   = ((u2 >> 4) & 0x0f..) | ((u1 >> 6) & 0x03..) << 4
   (((v >> 6) & 3) << 4 per byte is (v >> 2) & 0x30). Reads 16 bytes at q: the caller's
   block continues past the scales. All in registers: building the result in memory and
   reloading it as a vector stalls on store forwarding, which cost the GGUF-layout Q4_K
   decode half its speed on a Sapphire-Rapids-class core. */
static inline __attribute__((always_inline)) __m128i q4k_scales_mins(const uint8_t *q)
{
    const __m128i u = _mm_loadu_si128((const __m128i *)q);
    const __m128i x = _mm_shuffle_epi32(u, _MM_SHUFFLE(2, 1, 2, 0)); /* u0 u2 u1 u2 */
    const __m128i y = _mm_shuffle_epi32(u, _MM_SHUFFLE(1, 1, 0, 0)); /* u0 u0 u1 u1 */
    const __m128i lo = _mm_and_si128(_mm_srlv_epi32(x, _mm_setr_epi32(0, 0, 0, 4)),
                                     _mm_setr_epi32(0x3f3f3f3f, 0x0f0f0f0f, 0x3f3f3f3f, 0x0f0f0f0f));
    const __m128i hi = _mm_and_si128(_mm_srli_epi32(y, 2), _mm_setr_epi32(0, 0x30303030, 0, 0x30303030));
    return _mm_or_si128(lo, hi);
}

/* vpshufb controls of the repacked K-quant kernels (AVX2 loads the first 8 dwords, the
   pattern repeats per 128-bit lane): byte k of every dword zero-extended to 32 bits
   (kq_sc_ctl[k]), or duplicated into both 16-bit halves (kq_mn_ctl[k]). */
#define KQ_C4(f, k)                                                                         \
    {f(0 + (k)), f(4 + (k)), f(8 + (k)), f(12 + (k)), f(0 + (k)), f(4 + (k)), f(8 + (k)),   \
     f(12 + (k)), f(0 + (k)), f(4 + (k)), f(8 + (k)), f(12 + (k)), f(0 + (k)), f(4 + (k)),  \
     f(8 + (k)), f(12 + (k))}
#define KQ_ZX(b) (0x80808000u | (uint32_t)(b))
#define KQ_DUP(b) (0x80008000u | (uint32_t)(b) | (uint32_t)(b) << 16)
static const uint32_t kq_sc_ctl[4][16] __attribute__((aligned(64), unused)) = {
    KQ_C4(KQ_ZX, 0), KQ_C4(KQ_ZX, 1), KQ_C4(KQ_ZX, 2), KQ_C4(KQ_ZX, 3)};
static const uint32_t kq_mn_ctl[4][16] __attribute__((aligned(64), unused)) = {
    KQ_C4(KQ_DUP, 0), KQ_C4(KQ_DUP, 1), KQ_C4(KQ_DUP, 2), KQ_C4(KQ_DUP, 3)};
#undef KQ_C4
#undef KQ_ZX
#undef KQ_DUP

#endif
