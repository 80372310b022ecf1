/*
 * gemm_bf16_avx2 - BF16 weight products for AVX2 under gemm.h's BF16 contract, which is
 * AVX512_BF16's vdpbf16ps: emulated here with two FMAs per element pair (the odd element
 * first) run with MXCSR's DAZ and FTZ set, which is exactly the contract's daz() on every
 * input and ftz() on every result. The caller's MXCSR is restored before returning.
 *
 * One ymm lane per row: a repacked group's pair p (64 bytes) is two ymm of 8 rows; a pair's
 * dword splits into its odd element (the high half, masked) and its even one (shifted up),
 * each exact as f32. Register tile: the 16 rows of a group x BF16_A_TOK tokens (8
 * accumulators). GGUF-layout rows (repacking off) gather a pair of 8 rows (vpgatherdd)
 * instead; an odd K's last pair is built lane by lane.
 *
 * Activations: vcvtneps2bf16 emulated (round to nearest even on the bits, denormal inputs
 * to signed zero, NaN quieted), so the same bytes as gemm_bf16_round.
 */
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/gemm_x86.h"

#include "core/err.h"

#include <immintrin.h>
#include <string.h>

#define AI static inline __attribute__((always_inline))

#ifndef BF16_A_TOK
#define BF16_A_TOK 4
#endif
#define MXCSR_DAZ_FTZ 0x8040u

/* 8 floats rounded as gemm_bf16_round, in the low 16 bits of each dword. */
AI __m256i round8(__m256 v)
{
    __m256i u = _mm256_castps_si256(v);
    const __m256i sign = _mm256_set1_epi32((int)0x80000000u);
    const __m256i expo = _mm256_and_si256(u, _mm256_set1_epi32(0x7f800000));
    const __m256i den = _mm256_cmpeq_epi32(expo, _mm256_setzero_si256());
    u = _mm256_blendv_epi8(u, _mm256_and_si256(u, sign), den);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    const __m256i r = _mm256_srli_epi32(
        _mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), lsb), 16);
    const __m256i q = _mm256_or_si256(_mm256_srli_epi32(_mm256_castps_si256(v), 16),
                                      _mm256_set1_epi32(0x40));
    const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    return _mm256_and_si256(_mm256_blendv_epi8(r, q, nan), _mm256_set1_epi32(0xffff));
}

void gemm_bf16_act_avx2(const float *x, int64_t k, uint16_t *dst)
{
    int64_t i = 0;
    for (; i + 16 <= k; i += 16) {
        const __m256i a = round8(_mm256_loadu_ps(x + i)), b = round8(_mm256_loadu_ps(x + i + 8));
        const __m256i p = _mm256_permute4x64_epi64(_mm256_packus_epi32(a, b), 0xd8);
        _mm256_storeu_si256((__m256i *)(dst + i), p);
    }
    for (; i < k; i++)
        dst[i] = gemm_bf16_round(x[i]);
    for (; i % 32; i++)
        dst[i] = 0;
}

/* The tile's weights: group g's half h (8 rows); repacked: pair p at w + 64 p + 32 h;
   GGUF: row i of the tile at w + i * rs (idx: lane i's i * rs, live: rows that exist). */
struct asrc {
    const uint8_t *w;
    size_t rs;
    __m256i idx[2];
    __m256i live[2];
    int n_live; /* GGUF: rows that exist, of the 16 */
    int64_t k;
};

AI __m256i ld_half(const struct asrc *s, int h, int64_t p, const int rp)
{
    if (rp)
        return _mm256_loadu_si256((const __m256i *)(s->w + 64 * (size_t)p + 32 * (size_t)h));
    return _mm256_mask_i32gather_epi32(_mm256_setzero_si256(), (const int *)(s->w + 4 * (size_t)p),
                                       s->idx[h], s->live[h], 1);
}

/* acc += pair (w) . pair (x): odd elements, then even (MXCSR: DAZ, FTZ). */
AI __m256 step(__m256 acc, __m256 wo, __m256 we, __m256 xo, __m256 xe)
{
    acc = _mm256_fmadd_ps(wo, xo, acc);
    return _mm256_fmadd_ps(we, xe, acc);
}

AI __m256 hi_half(__m256i v)
{
    return _mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32((int)0xffff0000u)));
}
AI __m256 lo_half(__m256i v)
{
    return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}

/* 16 rows x nt tokens over all pairs. */
AI void tile(const struct asrc *s, const uint8_t *act, size_t as, const int nt, const int rp,
             __m256 acc[2][BF16_A_TOK])
{
    for (int h = 0; h < 2; h++)
        for (int t = 0; t < nt; t++)
            acc[h][t] = _mm256_setzero_ps();
    const int64_t np = s->k / 2;
    for (int64_t p = 0; p < np; p++) {
        const __m256i w0 = ld_half(s, 0, p, rp), w1 = ld_half(s, 1, p, rp);
        const __m256 w0o = hi_half(w0), w0e = lo_half(w0), w1o = hi_half(w1), w1e = lo_half(w1);
        for (int t = 0; t < nt; t++) {
            int32_t xv;
            memcpy(&xv, act + (size_t)t * as + 4 * (size_t)p, 4);
            const __m256i xb = _mm256_set1_epi32(xv);
            const __m256 xo = hi_half(xb), xe = lo_half(xb);
            acc[0][t] = step(acc[0][t], w0o, w0e, xo, xe);
            acc[1][t] = step(acc[1][t], w1o, w1e, xo, xe);
        }
    }
    if (s->k % 2) { /* GGUF rows only: element K - 1 alone */
        uint32_t v[16] = {0};
        for (int i = 0; i < s->n_live; i++) {
            uint16_t e;
            memcpy(&e, s->w + (size_t)i * s->rs + 2 * (size_t)(s->k - 1), 2);
            v[i] = e;
        }
        const __m256i w0 = _mm256_loadu_si256((const __m256i *)v),
                      w1 = _mm256_loadu_si256((const __m256i *)(v + 8));
        for (int t = 0; t < nt; t++) {
            uint16_t xe16;
            memcpy(&xe16, act + (size_t)t * as + 4 * (size_t)np, 2);
            const __m256i xb = _mm256_set1_epi32(xe16);
            acc[0][t] = step(acc[0][t], hi_half(w0), lo_half(w0), hi_half(xb), lo_half(xb));
            acc[1][t] = step(acc[1][t], hi_half(w1), lo_half(w1), hi_half(xb), lo_half(xb));
        }
    }
}

/* Lanes [lo, hi) of the 16 in a[0], a[1] into y[0 .. hi - lo). */
static void store16(float *y, const __m256 a[2], int lo, int hi)
{
    if (lo == 0 && hi == 16) {
        _mm256_storeu_ps(y, a[0]);
        _mm256_storeu_ps(y + 8, a[1]);
        return;
    }
    float v[16];
    _mm256_storeu_ps(v, a[0]);
    _mm256_storeu_ps(v + 8, a[1]);
    memcpy(y, v + lo, sizeof(float) * (size_t)(hi - lo));
}

/* The group whose first row is b x nt tokens from t0. */
AI void run_group(const struct gemm_args *a, int64_t b, int64_t t0, const int nt, const int rp)
{
    struct asrc s = {.w = (const uint8_t *)a->w + (size_t)b * a->w_row_bytes,
                     .rs = a->w_row_bytes,
                     .k = a->k};
    const int64_t left = a->r1 - b;
    s.n_live = left < 16 ? (int)left : 16;
    for (int h = 0; h < 2; h++) {
        int32_t idx[8], live[8];
        for (int i = 0; i < 8; i++) {
            idx[i] = (int32_t)((size_t)(8 * h + i) * a->w_row_bytes);
            live[i] = 8 * h + i < left ? -1 : 0;
        }
        s.idx[h] = _mm256_loadu_si256((const __m256i *)idx);
        s.live[h] = _mm256_loadu_si256((const __m256i *)live);
    }
    __m256 acc[2][BF16_A_TOK];
    tile(&s, (const uint8_t *)a->act + (size_t)t0 * a->act_row_bytes, a->act_row_bytes, nt, rp,
         acc);
    const int lo = a->r0 > b ? (int)(a->r0 - b) : 0;
    const int hi = left < 16 ? (int)left : 16;
    for (int t = 0; t < nt; t++) {
        const __m256 v[2] = {acc[0][t], acc[1][t]};
        store16(a->y + (size_t)(t0 + t) * a->ldy + (size_t)(b + lo - a->r0), v, lo, hi);
    }
}

AI void bf16_rows(const struct gemm_args *a, const int rp)
{
    const int64_t b0 = rp ? a->r0 / 16 * 16 : a->r0;
    for (int64_t b = b0; b < a->r1; b += 16)
        for (int64_t t0 = 0; t0 < a->n_tok; t0 += BF16_A_TOK) {
            const int nt = a->n_tok - t0 < BF16_A_TOK ? (int)(a->n_tok - t0) : BF16_A_TOK;
            switch (nt) {
            case 1: run_group(a, b, t0, 1, rp); break;
            case 2: run_group(a, b, t0, 2, rp); break;
            case 3: run_group(a, b, t0, 3, rp); break;
            default: run_group(a, b, t0, BF16_A_TOK, rp); break;
            }
        }
}

void gemm_bf16_avx2(const struct gemm_args *a)
{
    WELD_ASSERT(a->n_tok >= 1 && a->r0 <= a->r1 && a->act_row_bytes % 4 == 0);
    WELD_ASSERT(a->wtype == GEMM_BF16_R16 || 15 * a->w_row_bytes < (size_t)1 << 31);
    const unsigned csr = _mm_getcsr();
    _mm_setcsr(csr | MXCSR_DAZ_FTZ);
    if (a->wtype == GEMM_BF16_R16)
        bf16_rows(a, 1);
    else
        bf16_rows(a, 0);
    _mm_setcsr(csr);
}
