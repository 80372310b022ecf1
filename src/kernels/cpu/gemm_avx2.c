/*
 * gemm_avx2 - gemm.h kernels for AVX2 + FMA + F16C, under the numeric contract of gemm.h
 * (bit-identical to gemm_scalar.c).
 *
 * Register blocking: decode (one token) runs one weight row at a time (one stream for the
 * hardware prefetcher); prefill and batched decode run multi-row tiles: the repacked
 * Q8_0 / Q4_0 groups (8 rows x 8 tokens), repacked Q4_K half-groups (8 rows, one per ymm
 * lane, x 2 tokens: tile_r16k_a2), GGUF-layout Q6_K 2 rows x 4 tokens, the float path
 * 3 rows x 2 tokens; each weight block is loaded and unpacked once per token tile. GCC
 * keeps a register array in memory unless the loops over it are unrolled with constant
 * counts, hence the UNROLL pragmas and the switches on the token count. Integer dots use vpmaddubsw (unsigned x signed
 * bytes -> pairs of int16) then vpmaddwd: with ones for the 4-element lane sums of the
 * 32-blocks, with the sub-block scales for the K-quants (scale and pair-sum in one step).
 * Saturation cannot happen: activations are in [-127, 127] and the unsigned operand is
 * |q8| <= 128, a nibble (Q4_0, Q4_K) or a 6-bit code (Q6_K). Q8_0 uses the sign trick
 * (|w| against x with w's sign), so its activation correction terms go unused; Q4_0 adds
 * them (the -8 offset of the nibbles).
 * Float path: 16 lanes as two ymm accumulators (lanes 0-7, 8-15); the tail goes through
 * zero-padded copies of 16 elements.
 */
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/gemm_quant.h"
#include "kernels/cpu/gemm_x86.h"

#include "core/err.h"
#include "format/dtype.h"

#include <immintrin.h>
#include <math.h>
#include <string.h>

#define AI static inline __attribute__((always_inline))
/* Token loops run over a compile-time count; unrolled, the accumulators stay in registers. */
#define UNROLL _Pragma("GCC unroll 4")
#define UNROLL8 _Pragma("GCC unroll 8")

AI int32_t hsum_i32(__m256i v)
{
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
    return _mm_cvtsi128_si32(s);
}

/* ------------------------------------------------------------------------------------ */
/* activation quantization                                                              */

static float amax8(const float *x, int n)
{
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 m = _mm256_setzero_ps();
    for (int i = 0; i < n; i += 8)
        m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + i)));
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

AI __m256i quant8(const float *x, __m256 id)
{
    __m256i q = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x), id));
    return _mm256_max_epi32(_mm256_min_epi32(q, _mm256_set1_epi32(127)), _mm256_set1_epi32(-127));
}

/* 32 floats -> 32 int8 in order. */
AI __m256i quant32(const float *x, __m256 id)
{
    __m256i p01 = _mm256_packs_epi32(quant8(x, id), quant8(x + 8, id));
    __m256i p23 = _mm256_packs_epi32(quant8(x + 16, id), quant8(x + 24, id));
    __m256i p = _mm256_packs_epi16(p01, p23);
    return _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

/* Block 2i+h of x into half h of pair p (x NULL: a zero half). */
AI void quant_b32(const float *x, struct gemm_act_b64 *p, int h, int32_t off)
{
    float d = 0.0f, id = 0.0f;
    __m256i q = _mm256_setzero_si256();
    if (x) {
        gemm_quant_scale(amax8(x, 32), &d, &id);
        q = quant32(x, _mm256_set1_ps(id));
    }
    _mm256_storeu_si256((__m256i *)(p->q + 32 * h), q);
    __m256i s = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), q), _mm256_set1_epi16(1));
    _mm256_storeu_si256((__m256i *)(p->corr + 8 * h), _mm256_mullo_epi32(s, _mm256_set1_epi32(-off)));
    _mm256_storeu_ps(p->d + 8 * h, _mm256_set1_ps(d));
}

/* One block of 32 for the repacked types (gemm_scalar.c's quant_br, vectorized). */
static void quant_br(const float *x, struct gemm_act_br *b, int32_t off)
{
    float id;
    gemm_quant_scale(amax8(x, 32), &b->d, &id);
    const __m256i q = quant32(x, _mm256_set1_ps(id));
    _mm256_storeu_si256((__m256i *)b->q, q);
    /* sum of the 32 signed bytes: biased to unsigned, summed by vpsadbw, unbiased */
    __m256i s = _mm256_sad_epu8(_mm256_xor_si256(q, _mm256_set1_epi8((char)0x80)),
                                _mm256_setzero_si256());
    __m128i h = _mm_add_epi64(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
    h = _mm_add_epi64(h, _mm_unpackhi_epi64(h, h));
    b->corr = -off * ((int32_t)_mm_cvtsi128_si32(h) - 32 * 128);
}

static void quant_bk(const float *x, struct gemm_act_bk *b)
{
    float id;
    gemm_quant_scale(amax8(x, 256), &b->d, &id);
    const __m256 vid = _mm256_set1_ps(id);
    for (int c = 0; c < 8; c++) {
        __m256i q = quant32(x + 32 * c, vid);
        _mm256_storeu_si256((__m256i *)(b->q + 32 * c), q);
        __m256i s = _mm256_sad_epu8(_mm256_xor_si256(q, _mm256_set1_epi8((char)0x80)),
                                    _mm256_setzero_si256());
        b->bsums[2 * c] = (int16_t)(_mm256_extract_epi64(s, 0) + _mm256_extract_epi64(s, 1) - 2048);
        b->bsums[2 * c + 1] = (int16_t)(_mm256_extract_epi64(s, 2) + _mm256_extract_epi64(s, 3) - 2048);
    }
    memset(b->pad, 0, sizeof b->pad);
}

/* Blocks 2i and (if nblk == 2) 2i+1 of x into pair p; a missing second block is zero. */
static void quant_pair(const float *x, int nblk, struct gemm_act_b64 *p, int32_t off)
{
    quant_b32(x, p, 0, off);
    quant_b32(nblk == 2 ? x + 32 : NULL, p, 1, off);
}

static const struct gemm_act_quantizers avx2_quantizers = {quant_pair, quant_bk, quant_br,
                                                           gemm_bf16_act_avx2};

static void avx2_act_quant(int wtype, const float *x, size_t ldx, int64_t k, int n_tok, void *act,
                           size_t act_row_bytes)
{
    gemm_act_quant_rows(&avx2_quantizers, wtype, x, ldx, k, n_tok, act, act_row_bytes);
}

/* ------------------------------------------------------------------------------------ */
/* tiles                                                                                */

struct tile {
    const uint8_t *w;
    int64_t k;
    const uint8_t *act;
    size_t act_stride;
    const float *x;
    size_t ldx;
    float *y;
    size_t ldy;
    int64_t seg_k;    /* float path, repacked (GEMM_F*_R16): elements per segment, and */
    size_t seg_bytes; /* bytes from a row's segment to its next; seg_k 0: whole rows */
};

#define ACT(tl, T, t, b) ((const T *)((tl)->act + (size_t)(t) * (tl)->act_stride) + (b))

/* Block w (Q8_0 or Q4_0) against half h of activation pair a: the 8 exact lane sums. */
AI __m256i b32_lanes(__m256i wv, __m256i aw, const struct gemm_act_b64 *a, int h, const int is_q8)
{
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i xv = _mm256_loadu_si256((const __m256i *)(a->q + 32 * h));
    if (is_q8)
        return _mm256_madd_epi16(_mm256_maddubs_epi16(aw, _mm256_sign_epi8(xv, wv)), ones);
    __m256i l = _mm256_madd_epi16(_mm256_maddubs_epi16(aw, xv), ones);
    return _mm256_add_epi32(l, _mm256_loadu_si256((const __m256i *)(a->corr + 8 * h)));
}

/* Even blocks accumulate in ev, odd blocks in od (the 16 lanes of the contract). */
AI void tile_b32(const struct tile *tl, const int nt, const int is_q8)
{
    __m256 ev[GEMM_TILE_TOK], od[GEMM_TILE_TOK];
    UNROLL
    for (int t = 0; t < nt; t++)
        ev[t] = od[t] = _mm256_setzero_ps();
    const size_t bs = is_q8 ? 34 : 18;
    const uint8_t *w = tl->w;
    for (int64_t b = 0; b < tl->k / 32; b++, w += bs) {
        __m256i wv;
        if (is_q8) {
            wv = _mm256_loadu_si256((const __m256i *)(w + 2));
        } else {
            __m128i q = _mm_loadu_si128((const __m128i *)(w + 2));
            wv = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), _mm256_set1_epi8(0x0f));
        }
        const __m256i aw = is_q8 ? _mm256_abs_epi8(wv) : wv;
        const __m256 dw = _mm256_set1_ps(ld_h(w));
        const int h = (int)(b % 2);
        UNROLL
        for (int t = 0; t < nt; t++) {
            const struct gemm_act_b64 *a = ACT(tl, struct gemm_act_b64, t, b / 2);
            __m256 l = _mm256_cvtepi32_ps(b32_lanes(wv, aw, a, h, is_q8));
            __m256 s = _mm256_mul_ps(dw, _mm256_loadu_ps(a->d + 8 * h));
            if (h)
                od[t] = _mm256_fmadd_ps(l, s, od[t]);
            else
                ev[t] = _mm256_fmadd_ps(l, s, ev[t]);
        }
    }
    UNROLL
    for (int t = 0; t < nt; t++)
        tl->y[(size_t)t * tl->ldy] = fold8(_mm256_add_ps(ev[t], od[t]));
}

AI __m256i pair16(int lo, int hi)
{
    return _mm256_set_m128i(_mm_set1_epi16((short)hi), _mm_set1_epi16((short)lo));
}

AI void tile_q4_K(const struct tile *tl, const int nt)
{
    float acc[GEMM_TILE_TOK] = {0};
    const uint8_t *w = tl->w;
    for (int64_t b = 0; b < tl->k / 256; b++, w += 144) {
        int mn[8];
        __m256i sv[8], wv[8];
        const uint8_t *q = w + 4;
        UNROLL8
        for (int j = 0; j < 8; j++) {
            int sc;
            if (j < 4) {
                sc = q[j] & 63;
                mn[j] = q[j + 4] & 63;
            } else {
                sc = (q[j + 4] & 0xf) | ((q[j - 4] >> 6) << 4);
                mn[j] = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
            }
            sv[j] = _mm256_set1_epi16((short)sc);
        }
        UNROLL8
        for (int c = 0; c < 4; c++) {
            __m256i qb = _mm256_loadu_si256((const __m256i *)(w + 16 + 32 * c));
            wv[2 * c] = _mm256_and_si256(qb, _mm256_set1_epi8(0x0f));
            wv[2 * c + 1] = _mm256_and_si256(_mm256_srli_epi16(qb, 4), _mm256_set1_epi8(0x0f));
        }
        const float d = ld_h(w), dmin = ld_h(w + 2);
        UNROLL
        for (int t = 0; t < nt; t++) {
            const struct gemm_act_bk *a = ACT(tl, struct gemm_act_bk, t, b);
            __m256i s = _mm256_setzero_si256();
            UNROLL8
            for (int j = 0; j < 8; j++) {
                __m256i p = _mm256_maddubs_epi16(wv[j], _mm256_loadu_si256((const __m256i *)(a->q + 32 * j)));
                s = _mm256_add_epi32(s, _mm256_madd_epi16(p, sv[j]));
            }
            int32_t M = 0;
            UNROLL8
            for (int j = 0; j < 8; j++)
                M += mn[j] * (a->bsums[2 * j] + a->bsums[2 * j + 1]);
            acc[t] = fmaf(d * a->d, (float)hsum_i32(s), acc[t]);
            acc[t] = fmaf(-(dmin * a->d), (float)M, acc[t]);
        }
    }
    UNROLL
    for (int t = 0; t < nt; t++)
        tl->y[(size_t)t * tl->ldy] = acc[t];
}

AI void tile_q6_K(const struct tile *tl, const int nt)
{
    float acc[GEMM_TILE_TOK] = {0};
    const __m256i m4 = _mm256_set1_epi8(0x0f), m2 = _mm256_set1_epi8(3);
    const uint8_t *w = tl->w;
    for (int64_t b = 0; b < tl->k / 256; b++, w += 210) {
        __m256i wv[8], sv[8];
        const int8_t *sc = (const int8_t *)(w + 192);
        UNROLL8
        for (int h = 0; h < 2; h++) {
            __m256i ql0 = _mm256_loadu_si256((const __m256i *)(w + 64 * h));
            __m256i ql1 = _mm256_loadu_si256((const __m256i *)(w + 64 * h + 32));
            __m256i qh = _mm256_loadu_si256((const __m256i *)(w + 128 + 32 * h));
            UNROLL8
            for (int p = 0; p < 4; p++) {
                __m256i lo = p & 1 ? ql1 : ql0;
                lo = _mm256_and_si256(p & 2 ? _mm256_srli_epi16(lo, 4) : lo, m4);
                __m256i hi = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * p), m2);
                wv[4 * h + p] = _mm256_or_si256(lo, _mm256_slli_epi16(hi, 4));
                sv[4 * h + p] = pair16(sc[8 * h + 2 * p], sc[8 * h + 2 * p + 1]);
            }
        }
        const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)sc));
        const float d = ld_h(w + 208);
        UNROLL
        for (int t = 0; t < nt; t++) {
            const struct gemm_act_bk *a = ACT(tl, struct gemm_act_bk, t, b);
            __m256i corr = _mm256_madd_epi16(sc16, _mm256_loadu_si256((const __m256i *)a->bsums));
            __m256i s = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(corr, 5));
            UNROLL8
            for (int j = 0; j < 8; j++) {
                __m256i p = _mm256_maddubs_epi16(wv[j], _mm256_loadu_si256((const __m256i *)(a->q + 32 * j)));
                s = _mm256_add_epi32(s, _mm256_madd_epi16(p, sv[j]));
            }
            acc[t] = fmaf(d * a->d, (float)hsum_i32(s), acc[t]);
        }
    }
    UNROLL
    for (int t = 0; t < nt; t++)
        tl->y[(size_t)t * tl->ldy] = acc[t];
}

/* Prefetch distance of the float path's one-token products (bytes ahead in the row; the
   rows of a matrix are adjacent, so the stream runs on into the next row), as AVX-512's. */
#ifndef FLOAT_PREFETCH
#define FLOAT_PREFETCH 2048
#endif
/* The one-token products' second prefetch, into L2, this far ahead (0: none). Two Intel
   SPR-class cores under WELD_ISA=avx2, 2048 x 8192, one token: repacked Q8_0 14.9 ->
   16.1, Q4_0 15.0 -> 16.2 GB/s per core, F16 unchanged (17.3); not measured on Zen. */
#ifndef AVX2_PREFETCH_L2
#define AVX2_PREFETCH_L2 4096
#endif

AI __m256 load_w8(const uint8_t *w, int64_t i, const int wt)
{
    if (wt == DT_F32)
        return _mm256_loadu_ps((const float *)(const void *)(w + 4 * i));
    __m128i h = _mm_loadu_si128((const __m128i *)(w + 2 * i));
    if (wt == DT_F16)
        return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* One row x nt tokens. Repacked rows (seg_k, a multiple of 16) run segment after
   segment, the accumulators carried over. */
AI void tile_float(const struct tile *tl, const int nt, const int wt)
{
    __m256 lo[GEMM_TILE_TOK], hi[GEMM_TILE_TOK];
    UNROLL
    for (int t = 0; t < nt; t++)
        lo[t] = hi[t] = _mm256_setzero_ps();
    const int64_t k = tl->k, k16 = k / 16 * 16, ks = tl->seg_k ? tl->seg_k : k16;
    const int64_t es = wt == DT_F32 ? 4 : 2;
    const uint8_t *w = tl->w;
    for (int64_t c0 = 0; c0 < k16; c0 += ks, w += tl->seg_bytes) {
        const int64_t ke = k16 - c0 < ks ? k16 - c0 : ks;
        for (int64_t i = 0; i < ke; i += 16) {
            if (nt == 1 && ((es * i) & 63) == 0) { /* decode: prefetches per cache line */
                _mm_prefetch((const char *)w + es * i + FLOAT_PREFETCH, _MM_HINT_T0);
                if (AVX2_PREFETCH_L2)
                    _mm_prefetch((const char *)w + es * i + AVX2_PREFETCH_L2, _MM_HINT_T1);
            }
            const __m256 w0 = load_w8(w, i, wt), w1 = load_w8(w, i + 8, wt);
            UNROLL
            for (int t = 0; t < nt; t++) {
                const float *x = tl->x + (size_t)t * tl->ldx + c0 + i;
                lo[t] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x), lo[t]);
                hi[t] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + 8), hi[t]);
            }
        }
    }
    if (k16 < k) { /* whole rows only (repacked segments are multiples of 32) */
        /* Zero-padded copies: the padding adds 0 * 0 to lanes the scalar path leaves alone. */
        uint8_t wb[64] = {0};
        float xb[16];
        memcpy(wb, tl->w + es * k16, (size_t)(es * (k - k16)));
        const __m256 w0 = load_w8(wb, 0, wt), w1 = load_w8(wb, 8, wt);
        UNROLL
        for (int t = 0; t < nt; t++) {
            memset(xb, 0, sizeof xb);
            memcpy(xb, tl->x + (size_t)t * tl->ldx + k16, sizeof(float) * (size_t)(k - k16));
            lo[t] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(xb), lo[t]);
            hi[t] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(xb + 8), hi[t]);
        }
    }
    UNROLL
    for (int t = 0; t < nt; t++)
        tl->y[(size_t)t * tl->ldy] = fold8(_mm256_add_ps(lo[t], hi[t]));
}

/* The float path's multi-row tile for several tokens: FT_ROW rows x FT_TOK tokens, so each
   weight vector (widened once) serves FT_TOK tokens and each activation vector FT_ROW
   rows, in 2 * FT_ROW * FT_TOK accumulators (the contract's 16 lanes are two ymm). Tokens
   go in blocks of FT_NC so their activations stay in L1 while every row pair streams
   past. Measured on one Zen 3 core (F16, 2048 x 768, 64 tokens; GCC 12): 1 x 4 (the
   one-row tile) 18 GMAC/s, 2 x 3 20, 3 x 2 26-33, 4 x 2 21 (the 16 ymm registers spill). */
#ifndef FT_ROW
#define FT_ROW 3
#endif
#ifndef FT_TOK
#define FT_TOK 2
#endif
#ifndef FT_NC
#define FT_NC 24
#endif

/* FT_ROW rows (w0, w0 + ws, ...) x nt tokens (nt <= FT_TOK), same lanes as tile_float;
   repacked rows (seg_k > 0) segment after segment, as tile_float. */
AI void tile_float_rows(const uint8_t *w0, size_t ws, int64_t seg_k, size_t seg_bytes,
                        const float *x, size_t ldx, int64_t k, float *y, size_t ldy,
                        const int nt, const int wt)
{
    __m256 acc[2][FT_ROW][FT_TOK];
    UNROLL
    for (int h = 0; h < 2; h++)
        UNROLL
        for (int r = 0; r < FT_ROW; r++)
            UNROLL
            for (int t = 0; t < nt; t++)
                acc[h][r][t] = _mm256_setzero_ps();
    const int64_t k16 = k / 16 * 16, ks = seg_k ? seg_k : k16;
    const uint8_t *wc = w0;
    for (int64_t c0 = 0; c0 < k16; c0 += ks, wc += seg_bytes) {
        const int64_t ke = k16 - c0 < ks ? k16 - c0 : ks;
        for (int64_t i = 0; i < ke; i += 16) {
            UNROLL
            for (int h = 0; h < 2; h++) {
                __m256 w[FT_ROW];
                UNROLL
                for (int r = 0; r < FT_ROW; r++)
                    w[r] = load_w8(wc + (size_t)r * ws, i + 8 * h, wt);
                UNROLL
                for (int t = 0; t < nt; t++) {
                    const __m256 xv = _mm256_loadu_ps(x + (size_t)t * ldx + c0 + i + 8 * h);
                    UNROLL
                    for (int r = 0; r < FT_ROW; r++)
                        acc[h][r][t] = _mm256_fmadd_ps(w[r], xv, acc[h][r][t]);
                }
            }
        }
    }
    if (k16 < k) {
        /* Zero-padded copies, as tile_float. */
        const size_t es = wt == DT_F32 ? 4 : 2;
        float xb[FT_TOK][16];
        UNROLL
        for (int t = 0; t < nt; t++) {
            memset(xb[t], 0, sizeof xb[t]);
            memcpy(xb[t], x + (size_t)t * ldx + k16, sizeof(float) * (size_t)(k - k16));
        }
        UNROLL
        for (int r = 0; r < FT_ROW; r++) {
            uint8_t wb[64] = {0};
            memcpy(wb, w0 + (size_t)r * ws + es * (size_t)k16, es * (size_t)(k - k16));
            UNROLL
            for (int h = 0; h < 2; h++) {
                const __m256 wv = load_w8(wb, 8 * h, wt);
                UNROLL
                for (int t = 0; t < nt; t++)
                    acc[h][r][t] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(xb[t] + 8 * h), acc[h][r][t]);
            }
        }
    }
    UNROLL
    for (int r = 0; r < FT_ROW; r++)
        UNROLL
        for (int t = 0; t < nt; t++)
            y[(size_t)t * ldy + r] = fold8(_mm256_add_ps(acc[0][r][t], acc[1][r][t]));
}

static void run_tile(int wt, const struct tile *tl, int nt);

/* Rows [r0, r1) x all tokens of a float-path product, FT_ROW rows at a time (the rest one
   row at a time through tile_float); row r at w + (r - r0) * ws, in segments of seg_k
   elements seg_bytes apart if seg_k > 0 (repacked: one 16-row group per call). */
AI void float_rows_at(const struct gemm_args *a, const uint8_t *w, size_t ws, int64_t seg_k,
                      size_t seg_bytes, int64_t r0, int64_t r1, const int wt)
{
    int64_t r = r0;
    for (int tb = 0; tb < a->n_tok; tb += FT_NC) /* a block of tokens stays in L1 / L2 */
    for (r = r0; r + FT_ROW <= r1; r += FT_ROW) {
        const uint8_t *w0 = w + (size_t)(r - r0) * ws;
        const int te = a->n_tok - tb < FT_NC ? a->n_tok : tb + FT_NC;
        for (int t0 = tb; t0 < te; t0 += FT_TOK) {
            const int nt = te - t0 < FT_TOK ? te - t0 : FT_TOK;
            const float *x = a->x + (size_t)t0 * a->ldx;
            float *y = a->y + (size_t)t0 * a->ldy + (size_t)(r - a->r0);
            if (nt == FT_TOK)
                tile_float_rows(w0, ws, seg_k, seg_bytes, x, a->ldx, a->k, y, a->ldy, FT_TOK, wt);
            else if (nt == 1)
                tile_float_rows(w0, ws, seg_k, seg_bytes, x, a->ldx, a->k, y, a->ldy, 1, wt);
            else
                tile_float_rows(w0, ws, seg_k, seg_bytes, x, a->ldx, a->k, y, a->ldy, 2, wt);
        }
    }
    for (; r < r1; r++) {
        struct tile tl = {
            .w = w + (size_t)(r - r0) * ws, .k = a->k, .ldx = a->ldx, .ldy = a->ldy,
            .seg_k = seg_k, .seg_bytes = seg_bytes,
        };
        for (int t0 = 0; t0 < a->n_tok; t0 += GEMM_TILE_TOK) {
            int nt = a->n_tok - t0 < GEMM_TILE_TOK ? a->n_tok - t0 : GEMM_TILE_TOK;
            tl.x = a->x + (size_t)t0 * a->ldx;
            tl.y = a->y + (size_t)t0 * a->ldy + (size_t)(r - a->r0);
            run_tile(wt, &tl, nt);
        }
    }
}

#define TILE_SWITCH(nt, call)                                                               \
    switch (nt) {                                                                           \
    case 1: { const int n_ = 1; call; break; }                                              \
    case 2: { const int n_ = 2; call; break; }                                              \
    case 3: { const int n_ = 3; call; break; }                                              \
    default: { const int n_ = 4; call; break; }                                             \
    }

AI void float_rows(const struct gemm_args *a, const int wt)
{
    float_rows_at(a, (const uint8_t *)a->w + (size_t)a->r0 * a->w_row_bytes, a->w_row_bytes, 0,
                  0, a->r0, a->r1, wt);
}

/* The repacked floats (GEMM_F*_R16) for several tokens: each 16-row group is rows of
   gemm_fseg(k)-element segments, row i of a segment i segments in. */
AI void float_rows_r16(const struct gemm_args *a, const int wt)
{
    const int64_t seg = gemm_fseg(a->k);
    const size_t sb = (size_t)seg * (wt == DT_F32 ? 4 : 2);
    for (int64_t g = a->r0; g < a->r1; g += 16)
        float_rows_at(a, (const uint8_t *)a->w + (size_t)g * a->w_row_bytes, sb, seg, 16 * sb,
                      g, a->r1 - g < 16 ? a->r1 : g + 16, wt);
}

/* One token x the repacked floats: segment c of a group's rows one after the other, as
   the bytes lie (AVX-512's float_decode_r16, in two ymm per row: tile_float's lanes). */
AI void float_decode_r16(const struct gemm_args *a, const int wt)
{
    const int64_t es = wt == DT_F32 ? 4 : 2, seg = gemm_fseg(a->k), nseg = a->k / seg;
    const size_t sb = (size_t)(seg * es);
    for (int64_t g0 = a->r0; g0 < a->r1; g0 += 16) {
        const int nr = a->r1 - g0 < 16 ? (int)(a->r1 - g0) : 16;
        const uint8_t *grp = (const uint8_t *)a->w + (size_t)g0 * a->w_row_bytes;
        __m256 lo[16], hi[16];
        for (int r = 0; r < nr; r++)
            lo[r] = hi[r] = _mm256_setzero_ps();
        for (int64_t c = 0; c < nseg; c++) {
            const float *x = a->x + c * seg;
            for (int r = 0; r < nr; r++) {
                const uint8_t *w = grp + (size_t)(16 * c + r) * sb;
                __m256 l = lo[r], h = hi[r];
                for (int64_t i = 0; i < seg; i += 16) {
                    if (((es * i) & 63) == 0) {
                        _mm_prefetch((const char *)w + es * i + FLOAT_PREFETCH, _MM_HINT_T0);
                        if (AVX2_PREFETCH_L2)
                            _mm_prefetch((const char *)w + es * i + AVX2_PREFETCH_L2, _MM_HINT_T1);
                    }
                    l = _mm256_fmadd_ps(load_w8(w, i, wt), _mm256_loadu_ps(x + i), l);
                    h = _mm256_fmadd_ps(load_w8(w, i + 8, wt), _mm256_loadu_ps(x + i + 8), h);
                }
                lo[r] = l;
                hi[r] = h;
            }
        }
        for (int r = 0; r < nr; r++)
            a->y[g0 + r - a->r0] = fold8(_mm256_add_ps(lo[r], hi[r]));
    }
}

static void run_tile(int wt, const struct tile *tl, int nt)
{
    switch (wt) {
    case DT_Q8_0: TILE_SWITCH(nt, tile_b32(tl, n_, 1)); break;
    case DT_Q4_0: TILE_SWITCH(nt, tile_b32(tl, n_, 0)); break;
    case DT_Q4_K: TILE_SWITCH(nt, tile_q4_K(tl, n_)); break;
    case DT_Q6_K: TILE_SWITCH(nt, tile_q6_K(tl, n_)); break;
    case DT_F32: TILE_SWITCH(nt, tile_float(tl, n_, DT_F32)); break;
    case DT_F16: TILE_SWITCH(nt, tile_float(tl, n_, DT_F16)); break;
    default: TILE_SWITCH(nt, tile_float(tl, n_, DT_BF16)); break;
    }
}

/* ------------------------------------------------------------------------------------ */
/* repacked Q8_0 / Q4_0 (groups of 16 rows, gemm.h)                                     */

/* One ymm holds 4 consecutive elements of 8 rows (a half group), so vpmaddubsw against
   the token's 4-byte chunk broadcast gives each row's two pair sums: no per-row
   horizontal reduction, one convert / scale / FMA per 8 rows and block. vpmaddubsw
   multiplies unsigned by signed bytes and saturates its int16 pair sums, which decides
   the two forms:
     Q4_0: codes are nibbles (value + 8), |pair| <= 2 * 15 * 127 = 3810, so a block's
       eight chunks add up in int16 (<= 30480) before one vpmaddwd by 1 makes the rows'
       int32 sums, plus the activation's correction -8 * sum(q);
     Q8_0: the codes (value + 128, up to 255) would saturate, so they are turned back into
       values w (xor 0x80) and multiplied as |w| by x with w's sign (vpsignb; |pair| <=
       2 * 128 * 127 = 32512), each chunk widened by vpmaddwd into int32 sums: the exact
       sum of w * q, which is the contract's isum_b (the code sum plus the correction).
       Splitting the codes into two nibble products instead needs two int16 sums per
       token and ran slower here (register pressure).
   All integer steps are exact, so each row's block sum is the contract's isum_b, and
   acc = fmaf((float)isum_b, dw_b * dx_b, acc) as in gemm.h. Zen 3 runs vpmaddubsw,
   vpmaddwd and vpsignb two per cycle: Q8_0 tops out at ~21 products per cycle and core,
   Q4_0 at ~32 (measured 42 and 45 GMAC/s on one 2.8 GHz core, K = 768, 64 tokens). */

/* Tokens per tile (one int32 or int16 sum register per token; the f32 accumulators live
   in a small array, touched once per block). */
#define R16A_TOK 8

/* The rows' int32 block sums of one 8-row half (codes at q: chunk c at q + 64 c) against
   nt tokens' activation blocks x4[t] (4-byte chunks), into s[t]. Q4_0 includes the
   correction (corr[t]); Q8_0 needs none. */
AI void r16a_block(const uint8_t *q, const int32_t *const *x4, const int32_t *corr,
                   __m256i *s, const int nt, const int is_q8)
{
    if (is_q8) {
        UNROLL8
        for (int t = 0; t < nt; t++)
            s[t] = _mm256_setzero_si256();
        _Pragma("GCC unroll 2")
        for (int c = 0; c < 8; c++) {
            const __m256i w = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(q + 64 * c)),
                                               _mm256_set1_epi8((char)0x80));
            const __m256i aw = _mm256_abs_epi8(w);
            UNROLL8
            for (int t = 0; t < nt; t++) {
                const __m256i sx = _mm256_sign_epi8(_mm256_set1_epi32(x4[t][c]), w);
                s[t] = _mm256_add_epi32(s[t], _mm256_madd_epi16(_mm256_maddubs_epi16(aw, sx),
                                                                _mm256_set1_epi16(1)));
            }
        }
        return;
    }
    __m256i l[R16A_TOK];
    UNROLL8
    for (int t = 0; t < nt; t++)
        l[t] = _mm256_setzero_si256();
    UNROLL
    for (int c = 0; c < 4; c++) { /* low nibbles: chunk c; high nibbles: chunk c + 4 */
        const __m256i v = _mm256_loadu_si256((const __m256i *)(q + 64 * c));
        const __m256i wl = _mm256_and_si256(v, _mm256_set1_epi8(0x0f));
        const __m256i wh = _mm256_and_si256(_mm256_srli_epi16(v, 4), _mm256_set1_epi8(0x0f));
        UNROLL8
        for (int t = 0; t < nt; t++) {
            l[t] = _mm256_add_epi16(l[t], _mm256_maddubs_epi16(wl, _mm256_set1_epi32(x4[t][c])));
            l[t] = _mm256_add_epi16(l[t], _mm256_maddubs_epi16(wh, _mm256_set1_epi32(x4[t][c + 4])));
        }
    }
    UNROLL8
    for (int t = 0; t < nt; t++)
        s[t] = _mm256_add_epi32(_mm256_madd_epi16(l[t], _mm256_set1_epi16(1)),
                                _mm256_set1_epi32(corr[t]));
}

/* Half h (rows 8h .. 8h + 7) of a 16-row group x nt tokens over nblk blocks from blk0;
   acc[t * 16 + 8h + i] is row 8h + i of token t, updated in place. */
AI void r16a_half(const uint8_t *blk0, int64_t nblk, const uint8_t *act, size_t act_stride,
                  float *acc, const int nt, const int h, const int is_q8)
{
    const size_t gbs = is_q8 ? 16 * 34 : 16 * 18;
    const struct gemm_act_br *at[R16A_TOK];
    UNROLL8
    for (int t = 0; t < nt; t++)
        at[t] = (const struct gemm_act_br *)(act + (size_t)t * act_stride);
    const uint8_t *blk = blk0;
    for (int64_t b = 0; b < nblk; b++, blk += gbs) {
        const int32_t *x4[R16A_TOK];
        int32_t corr[R16A_TOK];
        UNROLL8
        for (int t = 0; t < nt; t++) {
            x4[t] = (const int32_t *)(const void *)at[t][b].q;
            corr[t] = at[t][b].corr;
        }
        __m256i s[R16A_TOK];
        r16a_block(blk + 32 + 32 * h, x4, corr, s, nt, is_q8);
        const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk + 16 * h)));
        UNROLL8
        for (int t = 0; t < nt; t++) {
            const __m256 sc = _mm256_mul_ps(dw, _mm256_set1_ps(at[t][b].d));
            float *a8 = acc + 16 * t + 8 * h;
            _mm256_storeu_ps(a8, _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[t]), sc, _mm256_loadu_ps(a8)));
        }
    }
}

/* Prefetch distance of r16a_both (bytes ahead in the group's stream). */
#ifndef R16A_PREFETCH
#define R16A_PREFETCH 1024
#endif

/* Both halves x nt (1 or 2) tokens: decode makes one pass over the group's weights, which
   stream from memory (one stream, prefetched R16A_PREFETCH ahead). acc[t * 16 + i]: row
   i, token t. */
AI void r16a_both(const uint8_t *blk0, int64_t nblk, const uint8_t *act, size_t act_stride,
                  float *acc, const int nt, const int is_q8)
{
    const size_t gbs = is_q8 ? 16 * 34 : 16 * 18;
    __m256 f[2][2];
    UNROLL
    for (int t = 0; t < nt; t++)
        for (int h = 0; h < 2; h++)
            f[t][h] = _mm256_loadu_ps(acc + 16 * t + 8 * h);
    const uint8_t *blk = blk0;
    for (int64_t b = 0; b < nblk; b++, blk += gbs) {
        for (size_t off = 0; off < gbs; off += 64) {
            _mm_prefetch((const char *)blk + R16A_PREFETCH + off, _MM_HINT_T0);
            if (AVX2_PREFETCH_L2)
                _mm_prefetch((const char *)blk + AVX2_PREFETCH_L2 + off, _MM_HINT_T1);
        }
        const int32_t *x4[2];
        int32_t corr[2];
        float dx[2];
        UNROLL
        for (int t = 0; t < nt; t++) {
            const struct gemm_act_br *a = (const struct gemm_act_br *)(act + (size_t)t * act_stride) + b;
            x4[t] = (const int32_t *)(const void *)a->q;
            corr[t] = a->corr;
            dx[t] = a->d;
        }
        UNROLL
        for (int h = 0; h < 2; h++) {
            __m256i s[2];
            r16a_block(blk + 32 + 32 * h, x4, corr, s, nt, is_q8);
            const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk + 16 * h)));
            UNROLL
            for (int t = 0; t < nt; t++)
                f[t][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[t]),
                                          _mm256_mul_ps(dw, _mm256_set1_ps(dx[t])), f[t][h]);
        }
    }
    UNROLL
    for (int t = 0; t < nt; t++)
        for (int h = 0; h < 2; h++)
            _mm256_storeu_ps(acc + 16 * t + 8 * h, f[t][h]);
}

/* Blocks of K per pass over the token tiles of a group when there are several tiles (32
   blocks of Q8_0 are 17 KiB of weights: they stay in L1 for every tile). */
#define R16A_KBLOCKS 32

/* nt tokens x the group's halves that hold rows below `valid`, blocks [b0, b1), into y0
   (row i of the group, token t at y0 + t * ldy + i; rows at or past `valid` are computed,
   the group being padded with zero rows, but neither read nor stored). The accumulators
   start at zero when b0 == 0, else from y0, where the previous range left them (an f32
   stored and reloaded is the same f32, so splitting K does not change a bit). */
static void r16a_tile(const uint8_t *w0, const uint8_t *act, size_t act_stride, float *y0,
                      size_t ldy, int valid, int nt, const int is_q8, int64_t b0, int64_t b1)
{
    const size_t gbs = is_q8 ? 16 * 34 : 16 * 18;
    const uint8_t *blk0 = w0 + (size_t)b0 * gbs;
    const int64_t nblk = b1 - b0;
    act += (size_t)b0 * sizeof(struct gemm_act_br);
    float acc[16 * R16A_TOK] = {0}; /* acc[t * 16 + i]: row i, token t */
    if (b0)
        for (int t = 0; t < nt; t++)
            memcpy(acc + 16 * t, y0 + (size_t)t * ldy, sizeof(float) * (size_t)valid);
    if (nt <= 2 && valid > 8) {
#define BOTH(n) (is_q8 ? r16a_both(blk0, nblk, act, act_stride, acc, n, 1) \
                       : r16a_both(blk0, nblk, act, act_stride, acc, n, 0))
        if (nt == 1)
            BOTH(1);
        else
            BOTH(2);
#undef BOTH
    } else {
        for (int h = 0; h < (valid > 8 ? 2 : 1); h++) {
#define HALF(n) (is_q8 ? r16a_half(blk0, nblk, act, act_stride, acc, n, h, 1) \
                       : r16a_half(blk0, nblk, act, act_stride, acc, n, h, 0))
            switch (nt) {
            case 1: HALF(1); break;
            case 2: HALF(2); break;
            case 3: HALF(3); break;
            case 4: HALF(4); break;
            case 5: HALF(5); break;
            case 6: HALF(6); break;
            case 7: HALF(7); break;
            default: HALF(8); break;
            }
#undef HALF
        }
    }
    for (int t = 0; t < nt; t++)
        memcpy(y0 + (size_t)t * ldy, acc + 16 * t, sizeof(float) * (size_t)valid);
}

static void avx2_gemm_r16(const struct gemm_args *a)
{
    const int is_q8 = a->wtype == GEMM_Q8_0_R16;
    const int tile_tok = R16A_TOK;
    const int64_t nb = a->k / 32;
    const int64_t kb = a->n_tok > tile_tok ? R16A_KBLOCKS : nb;
    WELD_ASSERT(a->r0 % 16 == 0 || a->r0 == a->r1);
    for (int64_t r = a->r0; r < a->r1; r += 16) {
        const int valid = a->r1 - r >= 16 ? 16 : (int)(a->r1 - r);
        const uint8_t *w0 = (const uint8_t *)a->w + (size_t)r * a->w_row_bytes;
        for (int64_t b0 = 0; b0 < nb; b0 += kb) {
            const int64_t b1 = nb - b0 < kb ? nb : b0 + kb;
            for (int t0 = 0; t0 < a->n_tok; t0 += tile_tok) {
                const int nt = a->n_tok - t0 < tile_tok ? a->n_tok - t0 : tile_tok;
                r16a_tile(w0, (const uint8_t *)a->act + (size_t)t0 * a->act_row_bytes,
                          a->act_row_bytes, a->y + (size_t)t0 * a->ldy + (size_t)(r - a->r0),
                          a->ldy, valid, nt, is_q8, b0, b1);
            }
        }
    }
}

/* ------------------------------------------------------------------------------------ */
/* K-quants, several rows per tile                                                      */

/* KQ_ROW rows x up to KQ_TOK tokens per tile. Each 32-byte weight load (two sub-blocks
   of a row) is unpacked once and serves every token; the loops keep one unpacked vector
   pair and its two scales live at a time, and the rows' int32 sums stay in registers
   (the one-row tile held all eight unpacked sub-blocks and their scales: 16 ymm, spilled).
   Integer sums are exact and the two (Q6_K: one) FMAs per super-block are the contract's,
   so the results are those of the one-row tile. */
#ifndef KQ_ROW
#define KQ_ROW 2
#endif
/* Decode (one token) keeps the one-row tile: two rows' streams at once ran Q6_K decode at
   half the rate when the weights come from memory (llama-110m, one Zen 3 core: 34 vs 70
   tok/s in weld_kernel_bench), as on AVX-512 (gemm_avx512.c). */
#ifndef KQ_MIN_TOK
#define KQ_MIN_TOK 2
#endif
#ifndef KQ_TOK
#define KQ_TOK 4
#endif

AI void tile_q4_K_rows(const uint8_t *w0, size_t ws, int64_t k, const uint8_t *act,
                       size_t act_stride, float *y, size_t ldy, const int nr, const int nt)
{
    float acc[KQ_ROW][KQ_TOK];
    UNROLL
    for (int r = 0; r < nr; r++)
        UNROLL
        for (int t = 0; t < nt; t++)
            acc[r][t] = 0.0f;
    const __m128i dup_mins = _mm_setr_epi8(8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15);
    for (int64_t b = 0; b < k / 256; b++) {
        const struct gemm_act_bk *a[KQ_TOK];
        UNROLL
        for (int t = 0; t < nt; t++)
            a[t] = (const struct gemm_act_bk *)(act + (size_t)t * act_stride) + b;
        __m256i s[KQ_ROW][KQ_TOK];
        uint8_t sc[KQ_ROW][16];
        UNROLL
        for (int r = 0; r < nr; r++) {
            _mm_storeu_si128((__m128i *)sc[r], q4k_scales_mins(w0 + (size_t)r * ws + 144 * (size_t)b + 4));
            UNROLL
            for (int t = 0; t < nt; t++)
                s[r][t] = _mm256_setzero_si256();
        }
        for (int c = 0; c < 4; c++) { /* sub-blocks 2c (low nibbles) and 2c + 1 (high) */
            UNROLL
            for (int r = 0; r < nr; r++) {
                const __m256i qb = _mm256_loadu_si256(
                    (const __m256i *)(w0 + (size_t)r * ws + 144 * (size_t)b + 16 + 32 * c));
                const __m256i wl = _mm256_and_si256(qb, _mm256_set1_epi8(0x0f));
                const __m256i wh = _mm256_and_si256(_mm256_srli_epi16(qb, 4), _mm256_set1_epi8(0x0f));
                const __m256i sl = _mm256_set1_epi16(sc[r][2 * c]), sh = _mm256_set1_epi16(sc[r][2 * c + 1]);
                UNROLL
                for (int t = 0; t < nt; t++) {
                    const __m256i xl = _mm256_loadu_si256((const __m256i *)(a[t]->q + 64 * c));
                    const __m256i xh = _mm256_loadu_si256((const __m256i *)(a[t]->q + 64 * c + 32));
                    s[r][t] = _mm256_add_epi32(s[r][t], _mm256_madd_epi16(_mm256_maddubs_epi16(wl, xl), sl));
                    s[r][t] = _mm256_add_epi32(s[r][t], _mm256_madd_epi16(_mm256_maddubs_epi16(wh, xh), sh));
                }
            }
        }
        UNROLL
        for (int r = 0; r < nr; r++) {
            const uint8_t *w = w0 + (size_t)r * ws + 144 * (size_t)b;
            const float d = ld_h(w), dmin = ld_h(w + 2);
            /* mins[j] twice each, against the 16 sums of 16: min_j * (bsum_2j + bsum_2j+1) */
            const __m256i mins16 = _mm256_cvtepu8_epi16(
                _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)sc[r]), dup_mins));
            UNROLL
            for (int t = 0; t < nt; t++) {
                const int32_t M = hsum_i32(_mm256_madd_epi16(
                    mins16, _mm256_loadu_si256((const __m256i *)a[t]->bsums)));
                acc[r][t] = fmaf(d * a[t]->d, (float)hsum_i32(s[r][t]), acc[r][t]);
                acc[r][t] = fmaf(-(dmin * a[t]->d), (float)M, acc[r][t]);
            }
        }
    }
    UNROLL
    for (int r = 0; r < nr; r++)
        UNROLL
        for (int t = 0; t < nt; t++)
            y[(size_t)t * ldy + r] = acc[r][t];
}

AI void tile_q6_K_rows(const uint8_t *w0, size_t ws, int64_t k, const uint8_t *act,
                       size_t act_stride, float *y, size_t ldy, const int nr, const int nt)
{
    float acc[KQ_ROW][KQ_TOK];
    UNROLL
    for (int r = 0; r < nr; r++)
        UNROLL
        for (int t = 0; t < nt; t++)
            acc[r][t] = 0.0f;
    const __m256i m4 = _mm256_set1_epi8(0x0f), m2 = _mm256_set1_epi8(3);
    for (int64_t b = 0; b < k / 256; b++) {
        const struct gemm_act_bk *a[KQ_TOK];
        UNROLL
        for (int t = 0; t < nt; t++)
            a[t] = (const struct gemm_act_bk *)(act + (size_t)t * act_stride) + b;
        __m256i s[KQ_ROW][KQ_TOK];
        UNROLL
        for (int r = 0; r < nr; r++) {
            /* the 32 * sum16 part of q - 32, from the activation's sums */
            const __m256i sc16 = _mm256_cvtepi8_epi16(
                _mm_loadu_si128((const __m128i *)(w0 + (size_t)r * ws + 210 * (size_t)b + 192)));
            UNROLL
            for (int t = 0; t < nt; t++) {
                __m256i corr = _mm256_madd_epi16(sc16, _mm256_loadu_si256((const __m256i *)a[t]->bsums));
                s[r][t] = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(corr, 5));
            }
        }
        for (int h = 0; h < 2; h++) {
            UNROLL
            for (int r = 0; r < nr; r++) {
                const uint8_t *w = w0 + (size_t)r * ws + 210 * (size_t)b;
                const int8_t *sc = (const int8_t *)(w + 192);
                const __m256i ql0 = _mm256_loadu_si256((const __m256i *)(w + 64 * h));
                const __m256i ql1 = _mm256_loadu_si256((const __m256i *)(w + 64 * h + 32));
                const __m256i qh = _mm256_loadu_si256((const __m256i *)(w + 128 + 32 * h));
                UNROLL
                for (int p = 0; p < 4; p++) {
                    __m256i lo = p & 1 ? ql1 : ql0;
                    lo = _mm256_and_si256(p & 2 ? _mm256_srli_epi16(lo, 4) : lo, m4);
                    const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * p), m2);
                    const __m256i wv = _mm256_or_si256(lo, _mm256_slli_epi16(hi, 4));
                    const __m256i sv = pair16(sc[8 * h + 2 * p], sc[8 * h + 2 * p + 1]);
                    UNROLL
                    for (int t = 0; t < nt; t++) {
                        const __m256i x = _mm256_loadu_si256((const __m256i *)(a[t]->q + 32 * (4 * h + p)));
                        s[r][t] = _mm256_add_epi32(s[r][t], _mm256_madd_epi16(_mm256_maddubs_epi16(wv, x), sv));
                    }
                }
            }
        }
        UNROLL
        for (int r = 0; r < nr; r++) {
            const float d = ld_h(w0 + (size_t)r * ws + 210 * (size_t)b + 208);
            UNROLL
            for (int t = 0; t < nt; t++)
                acc[r][t] = fmaf(d * a[t]->d, (float)hsum_i32(s[r][t]), acc[r][t]);
        }
    }
    UNROLL
    for (int r = 0; r < nr; r++)
        UNROLL
        for (int t = 0; t < nt; t++)
            y[(size_t)t * ldy + r] = acc[r][t];
}

/* Q4_K / Q6_K rows [r0, r1) x all tokens, KQ_ROW rows and KQ_TOK tokens at a time. */
AI void kquant_rows(const struct gemm_args *a, const int is_q4)
{
    for (int64_t r = a->r0; r < a->r1; r += KQ_ROW) {
        const int nr = a->r1 - r >= KQ_ROW ? KQ_ROW : (int)(a->r1 - r);
        const uint8_t *w0 = (const uint8_t *)a->w + (size_t)r * a->w_row_bytes;
        for (int t0 = 0; t0 < a->n_tok; t0 += KQ_TOK) {
            const int nt = a->n_tok - t0 < KQ_TOK ? a->n_tok - t0 : KQ_TOK;
            const uint8_t *act = (const uint8_t *)a->act + (size_t)t0 * a->act_row_bytes;
            float *y = a->y + (size_t)t0 * a->ldy + (size_t)(r - a->r0);
#define KQ(R, T) (is_q4 ? tile_q4_K_rows(w0, a->w_row_bytes, a->k, act, a->act_row_bytes, y, a->ldy, R, T) \
                        : tile_q6_K_rows(w0, a->w_row_bytes, a->k, act, a->act_row_bytes, y, a->ldy, R, T))
            if (nr == KQ_ROW) {
                switch (nt) {
                case 1: KQ(KQ_ROW, 1); break;
                case 2: KQ(KQ_ROW, 2); break;
                case 3: KQ(KQ_ROW, 3); break;
                default: KQ(KQ_ROW, KQ_TOK); break;
                }
            } else {
                switch (nt) {
                case 1: KQ(1, 1); break;
                case 2: KQ(1, 2); break;
                case 3: KQ(1, 3); break;
                default: KQ(1, KQ_TOK); break;
                }
            }
#undef KQ
        }
    }
}

/* Repacked Q4_K (GEMM_Q4_K_R16, gemm.h) on AVX2: one half of a 16-row group (8 rows, one
   ymm lane each) x nt tokens. As the AVX-512 kernel, but vpmaddubsw (unsigned nibble x
   signed activation, two products per int16: |sum| <= 2 x 15 x 127) summed in int16 over
   the 8 chunks of a sub-block (<= 30,480: no saturation), then vpmaddwd by ones into the
   int32 sub-block sum; the mins through vpmaddwd against the pairs of 16-sums. */
#define R16KA_TOK 2
#define R16_PREFETCH_A2 4096 /* bytes ahead in the group stream */

AI __m256i a2_ctl(const uint32_t *c) { return _mm256_load_si256((const __m256i *)(const void *)c); }

AI void tile_r16k_a2(const uint8_t *w0, const uint8_t *act, size_t stride, int64_t nb, const int nt,
                     int half, int valid, float *y, size_t ldy)
{
    const __m256i m4 = _mm256_set1_epi8(0x0f), ones = _mm256_set1_epi16(1);
    const __m256i lo6 = _mm256_set1_epi32(0x3f3f3f3f), lo4 = _mm256_set1_epi32(0x0f0f0f0f);
    const __m256i hi2 = _mm256_set1_epi32(0x30303030);
    const size_t h = 32 * (size_t)half;
    __m256 acc[R16KA_TOK];
    for (int t = 0; t < nt; t++)
        acc[t] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *o = w0 + (size_t)b * 2304;
        for (size_t off = 0; off < 2304; off += 64)
            _mm_prefetch((const char *)o + R16_PREFETCH_A2 + off, _MM_HINT_T0);
        const __m256i W0 = _mm256_loadu_si256((const __m256i *)(o + 64 + h));
        const __m256i W2 = _mm256_loadu_si256((const __m256i *)(o + 192 + h));
        const __m256i sc03 = _mm256_and_si256(W0, lo6);
        const __m256i sc47 = _mm256_or_si256(_mm256_and_si256(W2, lo4),
                                             _mm256_and_si256(_mm256_srli_epi32(W0, 2), hi2));
        __m256i S[R16KA_TOK];
        for (int t = 0; t < nt; t++)
            S[t] = _mm256_setzero_si256();
        UNROLL
        for (int c = 0; c < 4; c++) {
            const __m256i scv = c < 2 ? sc03 : sc47;
            __m256i dl[R16KA_TOK], dh[R16KA_TOK];
            for (int t = 0; t < nt; t++)
                dl[t] = dh[t] = _mm256_setzero_si256();
            UNROLL8
            for (int e = 0; e < 8; e++) {
                const __m256i p = _mm256_loadu_si256((const __m256i *)(o + 256 + 64 * (8 * c + e) + h));
                const __m256i lo = _mm256_and_si256(p, m4);
                const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(p, 4), m4);
                for (int t = 0; t < nt; t++) {
                    const int32_t *xq = (const int32_t *)(const void *)((const struct gemm_act_bk *)(act + (size_t)t * stride) + b)->q;
                    dl[t] = _mm256_add_epi16(dl[t], _mm256_maddubs_epi16(lo, _mm256_set1_epi32(xq[16 * c + e])));
                    dh[t] = _mm256_add_epi16(dh[t], _mm256_maddubs_epi16(hi, _mm256_set1_epi32(xq[16 * c + 8 + e])));
                }
            }
            const __m256i sl = _mm256_shuffle_epi8(scv, a2_ctl(kq_sc_ctl[(2 * c) % 4]));
            const __m256i sh = _mm256_shuffle_epi8(scv, a2_ctl(kq_sc_ctl[(2 * c + 1) % 4]));
            for (int t = 0; t < nt; t++)
                S[t] = _mm256_add_epi32(
                    S[t], _mm256_add_epi32(_mm256_mullo_epi32(_mm256_madd_epi16(dl[t], ones), sl),
                                           _mm256_mullo_epi32(_mm256_madd_epi16(dh[t], ones), sh)));
        }
        const __m256i W1 = _mm256_loadu_si256((const __m256i *)(o + 128 + h));
        const __m256i m03 = _mm256_and_si256(W1, lo6);
        const __m256i m47 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(W2, 4), lo4),
                                            _mm256_and_si256(_mm256_srli_epi32(W1, 2), hi2));
        const __m256 dv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(o + 16 * (size_t)half)));
        const __m256 dmv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(o + 32 + 16 * (size_t)half)));
        for (int t = 0; t < nt; t++) {
            const struct gemm_act_bk *a = (const struct gemm_act_bk *)(act + (size_t)t * stride) + b;
            const int32_t *bs = (const int32_t *)(const void *)a->bsums;
            __m256i M = _mm256_setzero_si256();
            UNROLL8
            for (int j = 0; j < 8; j++)
                M = _mm256_add_epi32(M, _mm256_madd_epi16(_mm256_shuffle_epi8(j < 4 ? m03 : m47,
                                                                              a2_ctl(kq_mn_ctl[j % 4])),
                                                          _mm256_set1_epi32(bs[j])));
            const __m256 dx = _mm256_set1_ps(a->d);
            acc[t] = _mm256_fmadd_ps(_mm256_mul_ps(dv, dx), _mm256_cvtepi32_ps(S[t]), acc[t]);
            acc[t] = _mm256_fnmadd_ps(_mm256_mul_ps(dmv, dx), _mm256_cvtepi32_ps(M), acc[t]);
        }
    }
    const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(valid), lanes);
    for (int t = 0; t < nt; t++)
        _mm256_maskstore_ps(y + (size_t)t * ldy, mask, acc[t]);
}

static void avx2_gemm_r16k(const struct gemm_args *a)
{
    const int64_t nb = a->k / 256;
    WELD_ASSERT(a->r0 % 16 == 0 || a->r0 == a->r1);
    for (int64_t r = a->r0; r < a->r1; r += 16) {
        const uint8_t *w0 = (const uint8_t *)a->w + (size_t)r * a->w_row_bytes;
        for (int half = 0; half < 2 && r + 8 * half < a->r1; half++) {
            const int64_t left = a->r1 - (r + 8 * half);
            const int valid = left >= 8 ? 8 : (int)left;
            for (int t0 = 0; t0 < a->n_tok; t0 += R16KA_TOK) {
                const int nt = a->n_tok - t0 < R16KA_TOK ? a->n_tok - t0 : R16KA_TOK;
                const uint8_t *act = (const uint8_t *)a->act + (size_t)t0 * a->act_row_bytes;
                float *y = a->y + (size_t)t0 * a->ldy + (size_t)(r + 8 * half - a->r0);
                if (nt == 1)
                    tile_r16k_a2(w0, act, a->act_row_bytes, nb, 1, half, valid, y, a->ldy);
                else
                    tile_r16k_a2(w0, act, a->act_row_bytes, nb, R16KA_TOK, half, valid, y, a->ldy);
            }
        }
    }
}

static void avx2_gemm(const struct gemm_args *a)
{
    WELD_ASSERT(gemm_act_kind(a->wtype) != GEMM_ACT_NONE && a->n_tok >= 1 && a->r0 <= a->r1);
    if (gemm_act_kind(a->wtype) == GEMM_ACT_Q8_R) {
        avx2_gemm_r16(a);
        return;
    }
    if (a->wtype == GEMM_Q4_K_R16) {
        avx2_gemm_r16k(a);
        return;
    }
    if (a->wtype == GEMM_Q6_K_R16) { /* not repacked for AVX2 (gemm_repack_pays) */
        gemm_scalar_r16q6(a);
        return;
    }
    if (gemm_act_kind(a->wtype) == GEMM_ACT_BF16) {
        gemm_bf16_avx2(a);
        return;
    }
    if (gemm_base_type(a->wtype) != a->wtype) { /* the floats */
        const int bt = gemm_base_type(a->wtype);
        WELD_ASSERT((a->r0 % 16 == 0 || a->r0 == a->r1) && gemm_fseg(a->k) > 0);
        if (a->n_tok == 1 && bt == DT_F16)
            float_decode_r16(a, DT_F16);
        else if (a->n_tok == 1)
            float_decode_r16(a, DT_F32);
        else if (bt == DT_F16)
            float_rows_r16(a, DT_F16);
        else
            float_rows_r16(a, DT_F32);
        return;
    }
    if (KQ_MIN_TOK <= a->n_tok && (a->wtype == DT_Q4_K || a->wtype == DT_Q6_K)) {
        if (a->wtype == DT_Q4_K)
            kquant_rows(a, 1);
        else
            kquant_rows(a, 0);
        return;
    }
    if (a->n_tok > 1 && gemm_act_kind(a->wtype) == GEMM_ACT_F32) {
        if (a->wtype == DT_F16)
            float_rows(a, DT_F16);
        else if (a->wtype == DT_BF16)
            float_rows(a, DT_BF16);
        else
            float_rows(a, DT_F32);
        return;
    }
    for (int64_t r = a->r0; r < a->r1; r++) {
        struct tile tl = {
            .w = (const uint8_t *)a->w + (size_t)r * a->w_row_bytes,
            .k = a->k, .act_stride = a->act_row_bytes, .ldx = a->ldx, .ldy = a->ldy,
        };
        for (int t0 = 0; t0 < a->n_tok; t0 += GEMM_TILE_TOK) {
            int nt = a->n_tok - t0 < GEMM_TILE_TOK ? a->n_tok - t0 : GEMM_TILE_TOK;
            tl.act = a->act ? (const uint8_t *)a->act + (size_t)t0 * a->act_row_bytes : NULL;
            tl.x = a->x ? a->x + (size_t)t0 * a->ldx : NULL;
            tl.y = a->y + (size_t)t0 * a->ldy + (size_t)(r - a->r0);
            run_tile(a->wtype, &tl, nt);
        }
    }
}

static float avx2_row_dot(int t, const void *row, const float *x, int64_t n)
{
    float y;
    struct tile tl = {.w = row, .k = n, .x = x, .y = &y};
    if (t == DT_F32)
        tile_float(&tl, 1, DT_F32);
    else if (t == DT_F16)
        tile_float(&tl, 1, DT_F16);
    else
        tile_float(&tl, 1, DT_BF16);
    return y;
}

static void avx2_to_f32(int t, const void *row, float *dst, int64_t n)
{
    const uint16_t *h = row;
    if (t == DT_F32) {
        memcpy(dst, row, (size_t)n * sizeof(float));
        return;
    }
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m128i v = _mm_loadu_si128((const __m128i *)(h + i));
        __m256 f = t == DT_F16
                       ? _mm256_cvtph_ps(v)
                       : _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(v), 16));
        _mm256_storeu_ps(dst + i, f);
    }
    if (i < n)
        gemm_ops_scalar.to_f32(t, h + i, dst + i, n - i);
}

static void avx2_rmsnorm(const float *x, const float *w, float eps, float *out, int64_t n)
{
    const float ss = avx2_row_dot(DT_F32, x, x, n);
    const float inv = 1.0f / sqrtf(ss / (float)n + eps);
    const __m256 vinv = _mm256_set1_ps(inv);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_mul_ps(_mm256_loadu_ps(x + i), vinv);
        if (w)
            v = _mm256_mul_ps(v, _mm256_loadu_ps(w + i));
        _mm256_storeu_ps(out + i, v);
    }
    for (; i < n; i++)
        out[i] = w ? x[i] * inv * w[i] : x[i] * inv;
}

/* F16C, 8 lanes; an 8-lane group holding a NaN goes through the scalar converter (whose
   NaN is 0x7E00 | sign, where the hardware would keep payload bits). */
static void avx2_to_f16(const float *x, void *dst, int64_t n)
{
    uint8_t *d = dst;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 v = _mm256_loadu_ps(x + i);
        if (_mm256_movemask_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)))
            dtype_quantize_row(DT_F16, x + i, d + 2 * i, 8);
        else
            _mm_storeu_si128((__m128i *)(d + 2 * i),
                             _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    }
    if (i < n)
        dtype_quantize_row(DT_F16, x + i, d + 2 * i, n - i);
}

const struct gemm_ops gemm_ops_avx2 = {
    .isa = ISA_AVX2,
    .act_quant = avx2_act_quant,
    .gemm = avx2_gemm,
    .row_dot = avx2_row_dot,
    .to_f32 = avx2_to_f32,
    .rmsnorm = avx2_rmsnorm,
    .attn_chunk = attn_chunk_avx2,
    .softmax_stats = attn_softmax_stats_avx2,
    .silu_mul = attn_silu_mul_avx2,
    .to_f16 = avx2_to_f16,
};
