/*
 * gemm_avx512 - gemm.h kernels for AVX-512 (F/BW/VL/DQ) with VNNI, under the numeric
 * contract of gemm.h (bit-identical to gemm_scalar.c).
 *
 * Register blocking: one weight row x up to GEMM_TILE_TOK tokens; each weight block is
 * loaded and unpacked once per token tile. For the 32-blocks (Q8_0, Q4_0) one zmm holds two
 * consecutive blocks of the row (low / high 256 bits), so one vpdpbusd computes the eight
 * 4-element lane sums of both against the activation pair (struct gemm_act_b64), and the
 * even/odd-block lanes of the contract fall out of the register halves. Pairing two rows
 * in one zmm instead was tried and ran at half the bandwidth (two interleaved streams 1-2
 * KiB apart defeat the hardware prefetcher: 12 vs 25 GB/s on one core for Q8_0).
 * vpdpbusd takes the weights as unsigned bytes: Q8_0 bytes are biased by 128 (xor 0x80),
 * Q4_0 nibbles are already unsigned (value + 8); the activation's pre-multiplied lane
 * sums (gemm_act_b64.corr) start the accumulation, so each lane ends as the exact signed
 * integer dot. K-quants: one row x the token tile, 64 elements per vpdpbusd, scales
 * applied with vpmulld into an int32 accumulator reduced once per super-block.
 * Float path: FLOAT_TILE_ROW rows x FLOAT_TILE_TOK tokens (prefill) or, for one token,
 * the 16 rows of a repacked group side by side segment after segment (float_decode_r16,
 * gemm.h's GEMM_F*_R16), else one row after another in one loop (float_decode: a cache
 * line per step, prefetched FLOAT_PREFETCH ahead into L1 and, with GEMM_L2_PREFETCH,
 * GEMM_PREFETCH_L2 into L2; with GEMM_RESIDENT four rows at a time), 16 f32 lanes per
 * zmm, masked loads for the tail.
 *
 * Repacked Q8_0 / Q4_0 (GEMM_*_R16, gemm.h): one zmm lane per row of a 16-row group, so
 * a block costs eight vpdpbusd against broadcast 4-byte activation chunks and a single
 * convert / scale / FMA for 16 rows, instead of per-row lane sums and folds: 2x-2.5x the
 * prefill rate and 1.4x-2x the decode rate of the GGUF-layout kernels (numbers in gemm.h).
 *
 * BF16 weights have their own contract and kernels (gemm_bf16_avx512.c: vdpbf16ps).
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

/* Instantiate a tile function for each constant token count 1..GEMM_TILE_TOK. */
#define TILE_SWITCH(nt, call)                                                               \
    switch (nt) {                                                                           \
    case 1: { const int n_ = 1; call; break; }                                              \
    case 2: { const int n_ = 2; call; break; }                                              \
    case 3: { const int n_ = 3; call; break; }                                              \
    default: { const int n_ = 4; call; break; }                                             \
    }


/* Rows per register tile of the 32-block kernels when a call has several tokens (one
   token: one row, a single weight stream for the prefetcher). */
#define GEMM_TILE_ROW 4

/* A second software prefetch of the weight streams, into L2, this far ahead (bytes), when
   the call asks for it (GEMM_L2_PREFETCH, gemm.h). On an Intel SPR-class host, two cores
   streaming one token, the L1 prefetch alone left each core at 16.1-16.7 GB/s (F16, Q8_0,
   Q4_0) and 12.5-13.6 (Q6_K, Q4_K); with this one too, 17.7 (F16), 16.9 (Q8_0), 14.4
   (Q4_K), 13.8 (Q6_K), Q4_0 unchanged (2048 x 8192 matrices). On AMD Zen 5 it costs
   instead: up to 25% of a one-row F16 loop, 3-9% of decode (gemm_decode_flags). */
#ifndef GEMM_PREFETCH_L2
#define GEMM_PREFETCH_L2 4096
#endif
/* Prefetch distance of the repacked kernels (bytes ahead in the group's stream, into L1;
   4096 before: one core Q8_0 15.0-15.4 GB/s, 2048 16.3-16.7). */
#ifndef GEMM_PREFETCH_R16
#define GEMM_PREFETCH_R16 2048
#endif

/* Prefetch distance of the float path's one-token products (bytes ahead in the row; the
   rows of a matrix are adjacent, so the stream runs on into the next row). Hardware
   prefetch alone kept one core at ~16 GB/s and two at 87-89% of the read probe of the
   time (four streams, no prefetch) on the 1B F16 model (Intel SPR-class); 2 KiB ahead:
   17 GB/s and 97-98% of that probe. */
#ifndef FLOAT_PREFETCH
#define FLOAT_PREFETCH 2048
#endif

/* Software prefetch distance (bytes ahead in each weight row). */
#ifndef GEMM_PREFETCH
#define GEMM_PREFETCH 1024
#endif

AI float fold16(__m512 v)
{
    return fold8(_mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1)));
}

/* ------------------------------------------------------------------------------------ */
/* activation quantization                                                              */

/* max |x| over n (a multiple of 16) floats. */
static float amax16(const float *x, int n)
{
    __m512 m = _mm512_setzero_ps();
    for (int i = 0; i < n; i += 16)
        m = _mm512_max_ps(m, _mm512_abs_ps(_mm512_loadu_ps(x + i)));
    return _mm512_reduce_max_ps(m);
}

/* rne(x * id) clamped to [-127, 127] for 16 floats, as int8. NaN lanes: unspecified. */
AI __m128i quant16(const float *x, __m512 id)
{
    __m512i q = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x), id));
    q = _mm512_max_epi32(_mm512_min_epi32(q, _mm512_set1_epi32(127)), _mm512_set1_epi32(-127));
    return _mm512_cvtepi32_epi8(q);
}

/* Blocks 2i and (if nblk == 2) 2i+1 of x into pair p; a missing second block is zero. */
static void quant_pair(const float *x, int nblk, struct gemm_act_b64 *p, int32_t off)
{
    float d[2] = {0.0f, 0.0f}, id[2] = {0.0f, 0.0f};
    for (int h = 0; h < nblk; h++)
        gemm_quant_scale(amax16(x + 32 * h, 32), &d[h], &id[h]);
    __m128i q[4];
    for (int i = 0; i < 4; i++)
        q[i] = i / 2 < nblk ? quant16(x + 16 * i, _mm512_set1_ps(id[i / 2])) : _mm_setzero_si128();
    __m512i qv = _mm512_inserti64x4(
        _mm512_castsi256_si512(_mm256_set_m128i(q[1], q[0])), _mm256_set_m128i(q[3], q[2]), 1);
    _mm512_storeu_si512(p->q, qv);
    /* lane sums of 4 bytes: vpdpbusd with all-ones unsigned bytes. */
    __m512i s = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8(1), qv);
    _mm512_storeu_si512(p->corr, _mm512_mullo_epi32(s, _mm512_set1_epi32(-off)));
    _mm512_storeu_ps(p->d, _mm512_insertf32x8(_mm512_set1_ps(d[0]), _mm256_set1_ps(d[1]), 1));
}

static void quant_br(const float *x, struct gemm_act_br *b, int32_t off)
{
    float id;
    gemm_quant_scale(amax16(x, 32), &b->d, &id);
    const __m512 vid = _mm512_set1_ps(id);
    __m256i q = _mm256_set_m128i(quant16(x + 16, vid), quant16(x, vid));
    _mm256_storeu_si256((__m256i *)b->q, q);
    __m256i s = _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_set1_epi8(1), q);
    __m128i h = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
    h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0x4e));
    h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0xb1));
    b->corr = -off * _mm_cvtsi128_si32(h);
}

static void quant_bk(const float *x, struct gemm_act_bk *b)
{
    float id;
    gemm_quant_scale(amax16(x, 256), &b->d, &id);
    const __m512 vid = _mm512_set1_ps(id);
    for (int g = 0; g < 16; g++) {
        __m128i q = quant16(x + 16 * g, vid);
        _mm_storeu_si128((__m128i *)(b->q + 16 * g), q);
        __m128i s = _mm_sad_epu8(_mm_xor_si128(q, _mm_set1_epi8((char)0x80)), _mm_setzero_si128());
        /* sad of biased bytes: sum(q + 128) per 8; remove 16 * 128. */
        b->bsums[g] = (int16_t)(_mm_cvtsi128_si32(s) + _mm_extract_epi16(s, 4) - 16 * 128);
    }
    memset(b->pad, 0, sizeof b->pad);
}

static const struct gemm_act_quantizers avx512_quantizers = {quant_pair, quant_bk, quant_br,
                                                             gemm_bf16_act_avx512};

static void avx512_act_quant(int wtype, const float *x, size_t ldx, int64_t k, int n_tok,
                             void *act, size_t act_row_bytes)
{
    gemm_act_quant_rows(&avx512_quantizers, wtype, x, ldx, k, n_tok, act, act_row_bytes);
}

/* ------------------------------------------------------------------------------------ */
/* tiles                                                                                */

/* One register tile: row w0 x nt tokens. */
struct tile {
    const uint8_t *w0;  /* first row; row r of the tile at w0 + r * w_stride */
    size_t w_stride;
    int64_t k;
    const uint8_t *act; /* token 0 of the tile */
    size_t act_stride;
    const float *x;     /* float path */
    size_t ldx;
    float *y0;          /* y of token 0, row 0 (row r at y0 + r) */
    size_t ldy;
    int64_t seg_k;      /* float path, repacked (GEMM_F*_R16): elements per segment, and */
    size_t seg_bytes;   /* bytes from a row's segment to its next; seg_k 0: whole rows */
    size_t l2;          /* L2 prefetch distance in bytes, 0: none (l2_dist) */
};

/* The L2 prefetch distance a call asks for (GEMM_L2_PREFETCH), 0 for none. */
AI size_t l2_dist(const struct gemm_args *a)
{
    return (a->flags & GEMM_L2_PREFETCH) ? GEMM_PREFETCH_L2 : 0;
}

AI __m512 pair_scale(const uint8_t *w0, const uint8_t *w1)
{
    return _mm512_insertf32x8(_mm512_set1_ps(ld_h(w0)), w1 ? _mm256_set1_ps(ld_h(w1))
                                                             : _mm256_setzero_ps(), 1);
}

/* Weight blocks w0 and w1 (NULL: zero) as unsigned bytes [block w0 | block w1]: Q8_0
   biased by 128, Q4_0 nibbles (low 16 then high 16 = elements in order). */
AI __m512i load_pair(const uint8_t *w0, const uint8_t *w1, const int is_q8)
{
    if (is_q8) {
        __m256i lo = _mm256_loadu_si256((const __m256i *)(w0 + 2));
        __m256i hi = w1 ? _mm256_loadu_si256((const __m256i *)(w1 + 2)) : _mm256_set1_epi8((char)0x80);
        return _mm512_xor_si512(_mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1),
                                _mm512_set1_epi8((char)0x80));
    }
    const __m512i dup = _mm512_setr_epi64(0, 1, 0, 1, 2, 3, 2, 3);
    __m128i lo = _mm_loadu_si128((const __m128i *)(w0 + 2));
    __m128i hi = w1 ? _mm_loadu_si128((const __m128i *)(w1 + 2)) : _mm_setzero_si128();
    __m512i z = _mm512_permutexvar_epi64(dup, _mm512_castsi256_si512(_mm256_set_m128i(hi, lo)));
    z = _mm512_mask_blend_epi64(0xCC, z, _mm512_srli_epi16(z, 4));
    return _mm512_and_si512(z, _mm512_set1_epi8(0x0f));
}

/* Q8_0 / Q4_0: nr rows x nt tokens, two blocks of a row per zmm (lanes 0-7 the even
   block, 8-15 the odd one). Each activation load serves nr rows. */
AI void tile_b32(const struct tile *tl, const int nt, const int nr, const int is_q8)
{
    __m512 acc[GEMM_TILE_ROW][GEMM_TILE_TOK];
    UNROLL
    for (int r = 0; r < nr; r++)
        UNROLL
        for (int t = 0; t < nt; t++)
            acc[r][t] = _mm512_setzero_ps();
    const size_t bs = is_q8 ? 34 : 18;
    const int64_t nb = tl->k / 32;
    for (int64_t b = 0; b < nb; b += 2) {
        __m512i wv[GEMM_TILE_ROW];
        __m512 dw[GEMM_TILE_ROW];
        UNROLL
        for (int r = 0; r < nr; r++) {
            const uint8_t *w = tl->w0 + (size_t)r * tl->w_stride + (size_t)b * bs;
            const uint8_t *w1 = b + 1 < nb ? w + bs : NULL;
            _mm_prefetch((const char *)w + GEMM_PREFETCH, _MM_HINT_T0);
            wv[r] = load_pair(w, w1, is_q8);
            dw[r] = pair_scale(w, w1);
        }
        UNROLL
        for (int t = 0; t < nt; t++) {
            const struct gemm_act_b64 *a =
                (const struct gemm_act_b64 *)(tl->act + (size_t)t * tl->act_stride) + b / 2;
            const __m512i cv = _mm512_loadu_si512(a->corr), xv = _mm512_loadu_si512(a->q);
            const __m512 dx = _mm512_loadu_ps(a->d);
            UNROLL
            for (int r = 0; r < nr; r++) {
                __m512 l = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(cv, wv[r], xv));
                acc[r][t] = _mm512_fmadd_ps(l, _mm512_mul_ps(dw[r], dx), acc[r][t]);
            }
        }
    }
    UNROLL
    for (int r = 0; r < nr; r++)
        UNROLL
        for (int t = 0; t < nt; t++)
            tl->y0[(size_t)t * tl->ldy + r] = fold16(acc[r][t]);
}

#define R16_TILE_TOK_MAX 8 /* accumulators a repacked tile can hold (R16_TILE_TOK <= this) */

#define R16_GROUP_BYTES(is_q8) ((size_t)((is_q8) ? 16 * 34 : 16 * 18)) /* one block of a group */

/* One block of a repacked Q8_0 / Q4_0 group: the 16 rows' scales widened (returned) and
   their 32 weights per row as eight zmm of 4-byte chunks (Q4_0 unpacked to 0..15). */
AI __m512 r16_unpack(const uint8_t *blk, const int is_q8, __m512i wq[8])
{
    if (is_q8) {
        UNROLL8
        for (int c = 0; c < 8; c++)
            wq[c] = _mm512_loadu_si512(blk + 32 + 64 * c);
    } else {
        UNROLL
        for (int c = 0; c < 4; c++) {
            __m512i p = _mm512_loadu_si512(blk + 32 + 64 * c);
            wq[c] = _mm512_and_si512(p, _mm512_set1_epi8(0x0f));
            wq[c + 4] = _mm512_and_si512(_mm512_srli_epi16(p, 4), _mm512_set1_epi8(0x0f));
        }
    }
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)blk));
}

/* Prefetch one block's bytes at p into L1 and, unless p2 is NULL, at p2 into L2. */
AI void r16_prefetch(const uint8_t *p, const uint8_t *p2, const int is_q8)
{
    const size_t gbs = R16_GROUP_BYTES(is_q8);
    for (size_t off = 0; off < gbs; off += 64) {
        _mm_prefetch((const char *)p + off, _MM_HINT_T0);
        if (p2)
            _mm_prefetch((const char *)p2 + off, _MM_HINT_T1);
    }
}

/* r16_unpack with the stream's prefetches ahead of blk (l2: tile.l2). */
AI __m512 r16_load(const uint8_t *blk, const int is_q8, __m512i wq[8], size_t l2)
{
    r16_prefetch(blk + GEMM_PREFETCH_R16, l2 ? blk + l2 : NULL, is_q8);
    return r16_unpack(blk, is_q8, wq);
}

/* acc + the block's 16 row sums for one token's activation block a (the contract's
   fmaf((float)isum, dw * dx, acc) per lane). */
AI __m512 r16_dot(const __m512i wq[8], __m512 dw, const struct gemm_act_br *a, __m512 acc)
{
    const int32_t *xq = (const int32_t *)(const void *)a->q;
    __m512i s0 = _mm512_set1_epi32(a->corr), s1 = _mm512_setzero_si512();
    UNROLL
    for (int c = 0; c < 8; c += 2) {
        s0 = _mm512_dpbusd_epi32(s0, wq[c], _mm512_set1_epi32(xq[c]));
        s1 = _mm512_dpbusd_epi32(s1, wq[c + 1], _mm512_set1_epi32(xq[c + 1]));
    }
    __m512 f = _mm512_cvtepi32_ps(_mm512_add_epi32(s0, s1));
    return _mm512_fmadd_ps(f, _mm512_mul_ps(dw, _mm512_set1_ps(a->d)), acc);
}

/* Repacked Q8_0 / Q4_0, one group of 16 rows x nt tokens: lane i of every zmm is row i.
   Per block and token, eight vpdpbusd (two chains of four, joined: integer, exact) against
   the token's 4-byte chunks broadcast give the 16 rows' block sums. Rows at or past
   `valid` are computed (the group is padded with zero rows) but not stored. Blocks
   [b0, b1) only: the accumulators start at zero when b0 == 0, else from y, where the
   previous range left them (an f32 stored and reloaded is the same f32, so splitting K
   does not change a bit). */
AI void tile_r16(const struct tile *tl, const int nt, const int is_q8, int valid, int64_t b0,
                 int64_t b1)
{
    const __mmask16 m = valid >= 16 ? 0xffff : (__mmask16)((1u << valid) - 1);
    __m512 acc[R16_TILE_TOK_MAX];
    UNROLL8
    for (int t = 0; t < nt; t++)
        acc[t] = b0 ? _mm512_maskz_loadu_ps(m, tl->y0 + (size_t)t * tl->ldy) : _mm512_setzero_ps();
    const size_t gbs = R16_GROUP_BYTES(is_q8);
    const uint8_t *blk = tl->w0 + (size_t)b0 * gbs;
    for (int64_t b = b0; b < b1; b++, blk += gbs) {
        __m512i wq[8];
        const __m512 dw = r16_load(blk, is_q8, wq, tl->l2);
        UNROLL8
        for (int t = 0; t < nt; t++)
            acc[t] = r16_dot(wq, dw, (const struct gemm_act_br *)(tl->act + (size_t)t * tl->act_stride) + b,
                             acc[t]);
    }
    UNROLL8
    for (int t = 0; t < nt; t++)
        _mm512_mask_storeu_ps(tl->y0 + (size_t)t * tl->ldy, m, acc[t]);
}

/* Decode (one token) over two neighbouring 16-row groups, their blocks interleaved
   (GEMM_DECODE_PAIRS; without it decode runs tile_r16 one group after the other, one
   stream): the second group's loads and chains overlap the first's. One group at a time
   streamed Q4_0 at 9-13 GB/s from memory on one Intel core, two at 16 (the read probe on
   that core: 15.5); Q8_0 13.3 -> 15.2. On an AMD Zen 4 host the pairs' two streams per
   core were the slower way, by 10-19% (gemm.h gemm_decode_flags). Each group's operations are tile_r16's, in the same order:
   same bits. Prefetches: the second group's stream runs on into the next pair's first
   group; the first group's, once past its own group (the second, read already), goes on
   in the next pair's second group, which would otherwise start cold once per 32 rows
   (two cores, 2048 x 8192 Q8_0: 16.7-16.8 -> 17.2-17.7 GB/s each; 1B Q8_0 tg 24.6 / 24.9
   -> 25.3 / 25.8). Past the last pair of a call they touch rows of other calls or
   nothing at all: a prefetch never faults. */
AI void tile_r16_pair(const uint8_t *w0, size_t group_stride, const uint8_t *act, int64_t nb,
                      float *y, int valid, const int is_q8, size_t l2)
{
    const size_t gbs = R16_GROUP_BYTES(is_q8);
    const struct gemm_act_br *a = (const struct gemm_act_br *)act;
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    const uint8_t *blk0 = w0, *blk1 = w0 + group_stride, *end0 = w0 + group_stride;
    for (int64_t b = 0; b < nb; b++, blk0 += gbs, blk1 += gbs) {
        __m512i wq[8];
        const uint8_t *p0 = blk0 + GEMM_PREFETCH_R16, *q0 = l2 ? blk0 + l2 : NULL;
        if (p0 >= end0) /* into the next pair's second group */
            p0 += 2 * group_stride;
        if (q0 && q0 >= end0)
            q0 += 2 * group_stride;
        r16_prefetch(p0, q0, is_q8);
        r16_prefetch(blk1 + GEMM_PREFETCH_R16, l2 ? blk1 + l2 : NULL, is_q8);
        __m512 dw = r16_unpack(blk0, is_q8, wq);
        acc0 = r16_dot(wq, dw, a + b, acc0);
        dw = r16_unpack(blk1, is_q8, wq);
        acc1 = r16_dot(wq, dw, a + b, acc1);
    }
    _mm512_storeu_ps(y, acc0);
    _mm512_mask_storeu_ps(y + 16, valid >= 32 ? 0xffff : (__mmask16)((1u << (valid - 16)) - 1), acc1);
}

/* Blocks of K per pass over the token tiles of a 16-row group when there are several
   tiles: 64 blocks of Q8_0 are 34 KiB of weights, which then stay in L1 for every tile
   instead of streaming from L2 (1B shapes, K = 2048..8192). Measured neutral within this
   machine's noise at 1B (pp32: 182-221 tok/s either way); kept for larger K. */
#ifndef GEMM_R16_KBLOCKS
#define GEMM_R16_KBLOCKS 64
#endif

/* Tokens per repacked tile: each unpacked weight block (8 zmm) serves this many tokens. */
#ifndef R16_TILE_TOK
#define R16_TILE_TOK 8
#endif
#define R16_MIN(n) ((n) < R16_TILE_TOK ? (n) : R16_TILE_TOK)
#define R16_SWITCH(nt, q8)                                                                  \
    switch (nt) {                                                                           \
    case 1: tile_r16(&tl, R16_MIN(1), q8, valid, b0, b1); break;                            \
    case 2: tile_r16(&tl, R16_MIN(2), q8, valid, b0, b1); break;                            \
    case 3: tile_r16(&tl, R16_MIN(3), q8, valid, b0, b1); break;                            \
    case 4: tile_r16(&tl, R16_MIN(4), q8, valid, b0, b1); break;                            \
    case 5: tile_r16(&tl, R16_MIN(5), q8, valid, b0, b1); break;                            \
    case 6: tile_r16(&tl, R16_MIN(6), q8, valid, b0, b1); break;                            \
    case 7: tile_r16(&tl, R16_MIN(7), q8, valid, b0, b1); break;                            \
    default: tile_r16(&tl, R16_TILE_TOK, q8, valid, b0, b1); break;                         \
    }

static void gemm_r16(const struct gemm_args *a)
{
    const int is_q8 = a->wtype == GEMM_Q8_0_R16;
    const int64_t nb = a->k / 32;
    const int64_t kb = a->n_tok > R16_TILE_TOK ? GEMM_R16_KBLOCKS : nb;
    WELD_ASSERT(a->r0 % 16 == 0 || a->r0 == a->r1);
    int64_t r = a->r0;
    const bool pairs = (a->flags & GEMM_DECODE_PAIRS) ||
                       ((a->flags & GEMM_DECODE_PAIRS_LONG) && !is_q8 &&
                        16 * a->w_row_bytes >= GEMM_PAIRS_LONG_BYTES);
    if (a->n_tok == 1 && pairs) /* pairs of groups; an odd last one goes alone below */
        for (; a->r1 - r > 16; r += 32) {
            const int valid = a->r1 - r >= 32 ? 32 : (int)(a->r1 - r);
            const uint8_t *w0 = (const uint8_t *)a->w + (size_t)r * a->w_row_bytes;
            float *y = a->y + (size_t)(r - a->r0);
            if (is_q8)
                tile_r16_pair(w0, 16 * a->w_row_bytes, a->act, nb, y, valid, 1, l2_dist(a));
            else
                tile_r16_pair(w0, 16 * a->w_row_bytes, a->act, nb, y, valid, 0, l2_dist(a));
        }
    for (; r < a->r1; r += 16) {
        const int valid = a->r1 - r >= 16 ? 16 : (int)(a->r1 - r);
        struct tile tl = {
            .w0 = (const uint8_t *)a->w + (size_t)r * a->w_row_bytes,
            .k = a->k, .act_stride = a->act_row_bytes, .ldy = a->ldy, .l2 = l2_dist(a),
        };
        for (int64_t b0 = 0; b0 < nb; b0 += kb) {
            const int64_t b1 = nb - b0 < kb ? nb : b0 + kb;
            for (int t0 = 0; t0 < a->n_tok; t0 += R16_TILE_TOK) {
                int nt = a->n_tok - t0 < R16_TILE_TOK ? a->n_tok - t0 : R16_TILE_TOK;
                tl.act = (const uint8_t *)a->act + (size_t)t0 * a->act_row_bytes;
                tl.y0 = a->y + (size_t)t0 * a->ldy + (size_t)(r - a->r0);
                if (is_q8)
                    R16_SWITCH(nt, 1)
                else
                    R16_SWITCH(nt, 0)
            }
        }
    }
}

/* Repacked Q4_K (GEMM_Q4_K_R16, gemm.h): one group of 16 rows x nt tokens, lane i = row i.
   Per 64 elements (c), eight 64-byte loads give both sub-blocks' nibbles of 4 elements of
   the 16 rows; each feeds one vpdpbusd per token and sub-block against the token's 4-byte
   chunk broadcast; the sub-block sums are scaled per lane (vpmulld by the 6-bit scales,
   picked out of the packed words with vpshufb) into S, and M comes from vpdpwssd of the
   mins (duplicated into both 16-bit halves) against the activation's pairs of 16-sums. No
   horizontal reduction anywhere: S and M are already per row. */
#define R16K_TOK 4 /* tokens per repacked K-quant tile (Q4_K and Q6_K) */

AI __m512i ctl(const uint32_t *c) { return _mm512_load_si512((const void *)c); }

AI void tile_r16k(const uint8_t *w0, const uint8_t *act, size_t stride, int64_t nb, const int nt,
                  int valid, float *y, size_t ldy, size_t l2)
{
    const __mmask16 m = valid >= 16 ? 0xffff : (__mmask16)((1u << valid) - 1);
    const __m512i m4 = _mm512_set1_epi8(0x0f), lo6 = _mm512_set1_epi32(0x3f3f3f3f);
    const __m512i lo4 = _mm512_set1_epi32(0x0f0f0f0f), hi2 = _mm512_set1_epi32(0x30303030);
    __m512 acc[R16K_TOK];
    UNROLL
    for (int t = 0; t < nt; t++)
        acc[t] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *o = w0 + (size_t)b * 2304;
        for (size_t off = 0; off < 2304; off += 64) {
            _mm_prefetch((const char *)o + GEMM_PREFETCH_R16 + off, _MM_HINT_T0);
            if (l2)
                _mm_prefetch((const char *)o + l2 + off, _MM_HINT_T1);
        }
        const __m512i W0 = _mm512_loadu_si512(o + 64), W2 = _mm512_loadu_si512(o + 192);
        const __m512i sc03 = _mm512_and_si512(W0, lo6);
        const __m512i sc47 = _mm512_or_si512(_mm512_and_si512(W2, lo4),
                                             _mm512_and_si512(_mm512_srli_epi32(W0, 2), hi2));
        __m512i S[R16K_TOK];
        UNROLL
        for (int t = 0; t < nt; t++)
            S[t] = _mm512_setzero_si512();
        UNROLL
        for (int c = 0; c < 4; c++) {
            const __m512i scv = c < 2 ? sc03 : sc47;
            const __m512i sl = _mm512_shuffle_epi8(scv, ctl(kq_sc_ctl[(2 * c) % 4]));
            const __m512i sh = _mm512_shuffle_epi8(scv, ctl(kq_sc_ctl[(2 * c + 1) % 4]));
            __m512i dl[R16K_TOK], dh[R16K_TOK];
            UNROLL
            for (int t = 0; t < nt; t++)
                dl[t] = dh[t] = _mm512_setzero_si512();
            UNROLL8
            for (int e = 0; e < 8; e++) {
                const __m512i p = _mm512_loadu_si512(o + 256 + 64 * (8 * c + e));
                const __m512i lo = _mm512_and_si512(p, m4);
                const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(p, 4), m4);
                UNROLL
                for (int t = 0; t < nt; t++) {
                    const int32_t *xq = (const int32_t *)(const void *)((const struct gemm_act_bk *)(act + (size_t)t * stride) + b)->q;
                    dl[t] = _mm512_dpbusd_epi32(dl[t], lo, _mm512_set1_epi32(xq[16 * c + e]));
                    dh[t] = _mm512_dpbusd_epi32(dh[t], hi, _mm512_set1_epi32(xq[16 * c + 8 + e]));
                }
            }
            UNROLL
            for (int t = 0; t < nt; t++)
                S[t] = _mm512_add_epi32(S[t], _mm512_add_epi32(_mm512_mullo_epi32(dl[t], sl),
                                                               _mm512_mullo_epi32(dh[t], sh)));
        }
        const __m512i W1 = _mm512_loadu_si512(o + 128);
        const __m512i m03 = _mm512_and_si512(W1, lo6);
        const __m512i m47 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(W2, 4), lo4),
                                            _mm512_and_si512(_mm512_srli_epi32(W1, 2), hi2));
        const __m512 dv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)o));
        const __m512 dmv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(o + 32)));
        UNROLL
        for (int t = 0; t < nt; t++) {
            const struct gemm_act_bk *a = (const struct gemm_act_bk *)(act + (size_t)t * stride) + b;
            const int32_t *bs = (const int32_t *)(const void *)a->bsums;
            __m512i M = _mm512_setzero_si512();
            UNROLL8
            for (int j = 0; j < 8; j++)
                M = _mm512_dpwssd_epi32(M, _mm512_shuffle_epi8(j < 4 ? m03 : m47, ctl(kq_mn_ctl[j % 4])),
                                        _mm512_set1_epi32(bs[j]));
            const __m512 dx = _mm512_set1_ps(a->d);
            acc[t] = _mm512_fmadd_ps(_mm512_mul_ps(dv, dx), _mm512_cvtepi32_ps(S[t]), acc[t]);
            acc[t] = _mm512_fnmadd_ps(_mm512_mul_ps(dmv, dx), _mm512_cvtepi32_ps(M), acc[t]);
        }
    }
    UNROLL
    for (int t = 0; t < nt; t++)
        _mm512_mask_storeu_ps(y + (size_t)t * ldy, m, acc[t]);
}

/* Repacked Q6_K (GEMM_Q6_K_R16, gemm.h): one group of 16 rows x nt tokens, lane i = row
   i. Per k (0..15) one qh and two ql loads rebuild the 6-bit codes of chunks k, k+16,
   k+32, k+48 (sub-blocks k/4, 4+k/4, 8+k/4, 12+k/4) for the 16 rows; one vpdpbusd per
   chunk and token; every four k the four sub-block sums are scaled per lane (vpmulld by
   the int8 scales) into S, and the -32 * bsums part is a vpdpwssd of the scale pairs
   against the activation's pairs of 16-sums. */

/* The scale of sub-block g (0..15) of the 16 rows, one int32 per lane. */
AI __m512i q6_scale(const uint8_t *o, int g)
{
    const __m512i pv = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(o + 32 + 32 * (g / 2))));
    return g % 2 ? _mm512_srai_epi32(pv, 16) : _mm512_srai_epi32(_mm512_slli_epi32(pv, 16), 16);
}

AI void tile_r16q6(const uint8_t *w0, const uint8_t *act, size_t stride, int64_t nb, const int nt,
                   int valid, float *y, size_t ldy, size_t l2)
{
    const __mmask16 m = valid >= 16 ? 0xffff : (__mmask16)((1u << valid) - 1);
    const __m512i m4 = _mm512_set1_epi8(0x0f), m30 = _mm512_set1_epi8(0x30);
    __m512 acc[R16K_TOK];
    UNROLL
    for (int t = 0; t < nt; t++)
        acc[t] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *o = w0 + (size_t)b * 3360;
        for (size_t off = 0; off < 3360; off += 64) {
            _mm_prefetch((const char *)o + GEMM_PREFETCH_R16 + off, _MM_HINT_T0);
            if (l2)
                _mm_prefetch((const char *)o + l2 + off, _MM_HINT_T1);
        }
        __m512i S[R16K_TOK];
        UNROLL
        for (int t = 0; t < nt; t++)
            S[t] = _mm512_setzero_si512();
        for (int mq = 0; mq < 4; mq++) {
            __m512i dt[R16K_TOK][4];
            UNROLL
            for (int t = 0; t < nt; t++)
                dt[t][0] = dt[t][1] = dt[t][2] = dt[t][3] = _mm512_setzero_si512();
            UNROLL
            for (int kk = 0; kk < 4; kk++) {
                const int k = 4 * mq + kk;
                const __m512i qh = _mm512_loadu_si512(o + 2336 + 64 * k);
                const __m512i qa = _mm512_loadu_si512(o + 288 + 64 * k);
                const __m512i qb = _mm512_loadu_si512(o + 288 + 64 * (k + 16));
                __m512i cv[4];
                cv[0] = _mm512_or_si512(_mm512_and_si512(qa, m4),
                                        _mm512_and_si512(_mm512_slli_epi16(qh, 4), m30));
                cv[1] = _mm512_or_si512(_mm512_and_si512(qb, m4),
                                        _mm512_and_si512(_mm512_slli_epi16(qh, 2), m30));
                cv[2] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(qa, 4), m4),
                                        _mm512_and_si512(qh, m30));
                cv[3] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(qb, 4), m4),
                                        _mm512_and_si512(_mm512_srli_epi16(qh, 2), m30));
                UNROLL
                for (int t = 0; t < nt; t++) {
                    const int32_t *xq = (const int32_t *)(const void *)((const struct gemm_act_bk *)(act + (size_t)t * stride) + b)->q;
                    UNROLL
                    for (int s4 = 0; s4 < 4; s4++)
                        dt[t][s4] = _mm512_dpbusd_epi32(dt[t][s4], cv[s4], _mm512_set1_epi32(xq[k + 16 * s4]));
                }
            }
            UNROLL
            for (int s4 = 0; s4 < 4; s4++) {
                const __m512i sc = q6_scale(o, 4 * s4 + mq);
                UNROLL
                for (int t = 0; t < nt; t++)
                    S[t] = _mm512_add_epi32(S[t], _mm512_mullo_epi32(dt[t][s4], sc));
            }
        }
        const __m512 dv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)o));
        UNROLL
        for (int t = 0; t < nt; t++) {
            const struct gemm_act_bk *a = (const struct gemm_act_bk *)(act + (size_t)t * stride) + b;
            const int32_t *bs = (const int32_t *)(const void *)a->bsums;
            __m512i B = _mm512_setzero_si512();
            UNROLL8
            for (int p = 0; p < 8; p++)
                B = _mm512_dpwssd_epi32(B, _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(o + 32 + 32 * p))),
                                        _mm512_set1_epi32(bs[p]));
            const __m512i St = _mm512_sub_epi32(S[t], _mm512_slli_epi32(B, 5));
            acc[t] = _mm512_fmadd_ps(_mm512_mul_ps(dv, _mm512_set1_ps(a->d)), _mm512_cvtepi32_ps(St), acc[t]);
        }
    }
    UNROLL
    for (int t = 0; t < nt; t++)
        _mm512_mask_storeu_ps(y + (size_t)t * ldy, m, acc[t]);
}

/* Repacked Q4_K (q6 = 0) or Q6_K (q6 = 1): groups of 16 rows x tiles of up to R16K_TOK
   tokens, each over all of K. */
static void gemm_r16kq(const struct gemm_args *a, const int q6)
{
    const int64_t nb = a->k / 256;
    const size_t l2 = l2_dist(a);
    WELD_ASSERT(a->r0 % 16 == 0 || a->r0 == a->r1);
    for (int64_t r = a->r0; r < a->r1; r += 16) {
        const int valid = a->r1 - r >= 16 ? 16 : (int)(a->r1 - r);
        const uint8_t *w0 = (const uint8_t *)a->w + (size_t)r * a->w_row_bytes;
        for (int t0 = 0; t0 < a->n_tok; t0 += R16K_TOK) {
            const int nt = a->n_tok - t0 < R16K_TOK ? a->n_tok - t0 : R16K_TOK;
            const uint8_t *act = (const uint8_t *)a->act + (size_t)t0 * a->act_row_bytes;
            float *y = a->y + (size_t)t0 * a->ldy + (size_t)(r - a->r0);
#define KQ_CALL(n) (q6 ? tile_r16q6(w0, act, a->act_row_bytes, nb, n, valid, y, a->ldy, l2)   \
                       : tile_r16k(w0, act, a->act_row_bytes, nb, n, valid, y, a->ldy, l2))
            switch (nt) {
            case 1: KQ_CALL(1); break;
            case 2: KQ_CALL(2); break;
            case 3: KQ_CALL(3); break;
            default: KQ_CALL(R16K_TOK); break;
            }
#undef KQ_CALL
        }
    }
}

/* Q4_K: per 64 elements, [low nibbles | high nibbles] of 32 bytes = elements in order. */
AI void tile_q4_K(const struct tile *tl, const int nt)
{
    float acc[GEMM_TILE_TOK] = {0};
    const int64_t nb = tl->k / 256;
    const uint8_t *w = tl->w0;
    const __m128i dup_mins = _mm_setr_epi8(8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15);
    for (int64_t b = 0; b < nb; b++, w += 144) {
        const __m128i sm = q4k_scales_mins(w + 4);
        const __m512i sc32 = _mm512_cvtepu8_epi32(sm);
        /* mins[j] twice each, against the 16 sums of 16: min_j * (bsum_2j + bsum_2j+1). */
        const __m256i mins16 = _mm256_cvtepu8_epi16(_mm_shuffle_epi8(sm, dup_mins));
        __m512i wv[4], sv[4];
        UNROLL8
        for (int c = 0; c < 4; c++) {
            __m256i qb = _mm256_loadu_si256((const __m256i *)(w + 16 + 32 * c));
            __m512i z = _mm512_inserti64x4(_mm512_castsi256_si512(qb), _mm256_srli_epi16(qb, 4), 1);
            wv[c] = _mm512_and_si512(z, _mm512_set1_epi8(0x0f));
            __m512i idx = _mm512_inserti64x4(_mm512_set1_epi32(2 * c), _mm256_set1_epi32(2 * c + 1), 1);
            sv[c] = _mm512_permutexvar_epi32(idx, sc32);
        }
        const float d = ld_h(w), dmin = ld_h(w + 2);
        UNROLL
        for (int t = 0; t < nt; t++) {
            const struct gemm_act_bk *a =
                (const struct gemm_act_bk *)(tl->act + (size_t)t * tl->act_stride) + b;
            __m512i s = _mm512_setzero_si512();
            UNROLL8
            for (int c = 0; c < 4; c++) {
                __m512i p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wv[c],
                                                _mm512_loadu_si512(a->q + 64 * c));
                s = _mm512_add_epi32(s, _mm512_mullo_epi32(p, sv[c]));
            }
            /* Reduce S (16 lanes) and M (8 lanes) together; integer, so exact. */
            __m256i s8 = _mm256_add_epi32(_mm512_castsi512_si256(s), _mm512_extracti64x4_epi64(s, 1));
            __m256i m8 = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)a->bsums), mins16);
            __m256i h = _mm256_hadd_epi32(s8, m8);
            h = _mm256_hadd_epi32(h, h);
            __m128i r = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
            const int32_t S = _mm_cvtsi128_si32(r), M = _mm_extract_epi32(r, 1);
            acc[t] = fmaf(d * a->d, (float)S, acc[t]);
            acc[t] = fmaf(-(dmin * a->d), (float)M, acc[t]);
        }
    }
    UNROLL
    for (int t = 0; t < nt; t++)
        tl->y0[(size_t)t * tl->ldy] = acc[t];
}

/* Q6_K: per 128 elements, ql[0..63] and qh[0..31] give codes for elements 0..63 (low
   nibbles, qh bits 0-1 / 2-3) and 64..127 (high nibbles, qh bits 4-5 / 6-7). */
AI void tile_q6_K(const struct tile *tl, const int nt)
{
    float acc[GEMM_TILE_TOK] = {0};
    const int64_t nb = tl->k / 256;
    const uint8_t *w = tl->w0;
    const __m512i m4 = _mm512_set1_epi8(0x0f), m2 = _mm512_set1_epi8(3);
    const __m512i shA = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(2), 1);
    const __m512i shB = _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(6), 1);
    for (int64_t b = 0; b < nb; b++, w += 210) {
        __m512i wv[4], sv[4];
        const __m512i sc = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(w + 192)));
        UNROLL8
        for (int h = 0; h < 2; h++) {
            __m512i ql = _mm512_loadu_si512(w + 64 * h);
            __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(w + 128 + 32 * h)));
            __m512i hA = _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(qh, shA), m2), 4);
            __m512i hB = _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(qh, shB), m2), 4);
            wv[2 * h] = _mm512_or_si512(_mm512_and_si512(ql, m4), hA);
            wv[2 * h + 1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), m4), hB);
        }
        UNROLL8
        for (int c = 0; c < 4; c++) {
            const __m512i idx = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
            sv[c] = _mm512_permutexvar_epi32(_mm512_add_epi32(idx, _mm512_set1_epi32(4 * c)), sc);
        }
        const float d = ld_h(w + 208);
        UNROLL
        for (int t = 0; t < nt; t++) {
            const struct gemm_act_bk *a =
                (const struct gemm_act_bk *)(tl->act + (size_t)t * tl->act_stride) + b;
            __m512i bs = _mm512_cvtepi16_epi32(_mm256_loadu_si256((const __m256i *)a->bsums));
            __m512i s = _mm512_sub_epi32(_mm512_setzero_si512(),
                                         _mm512_slli_epi32(_mm512_mullo_epi32(sc, bs), 5));
            UNROLL8
            for (int c = 0; c < 4; c++) {
                __m512i p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wv[c],
                                                _mm512_loadu_si512(a->q + 64 * c));
                s = _mm512_add_epi32(s, _mm512_mullo_epi32(p, sv[c]));
            }
            acc[t] = fmaf(d * a->d, (float)_mm512_reduce_add_epi32(s), acc[t]);
        }
    }
    UNROLL
    for (int t = 0; t < nt; t++)
        tl->y0[(size_t)t * tl->ldy] = acc[t];
}

/* 16 weights of type wt at element i as f32 (mask: which of the 16 exist). */
AI __m512 load_w16(const uint8_t *w, int64_t i, __mmask16 m, const int wt)
{
    if (wt == DT_F32)
        return _mm512_maskz_loadu_ps(m, w + 4 * i);
    __m256i h = _mm256_maskz_loadu_epi16(m, w + 2 * i);
    if (wt == DT_F16)
        return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* Float-path register tile when a call has many tokens: FLOAT_TILE_ROW rows x
   FLOAT_TILE_TOK tokens = 24 accumulators (+ 4 weight vectors and 1 activation vector: 29
   of the 32 zmm), so FMAs outnumber loads and conversions 24 : 14 (the 4 x 4 tile: 16 :
   12). Measured on llama-110m F16 pp512, 2 threads: 4 x 4 1,430 tok/s, 4 x 6 1,466,
   3 x 8 1,315, 5 x 4 and 6 x 4 far slower (spills). */
#ifndef FLOAT_TILE_ROW
#define FLOAT_TILE_ROW 4
#endif
#ifndef FLOAT_TILE_TOK
#define FLOAT_TILE_TOK 6
#endif

/* One 16-element step of a float tile (mask m: which elements exist). */
AI void float_step(const struct tile *tl, __m512 acc[FLOAT_TILE_ROW][FLOAT_TILE_TOK], int64_t i,
                   __mmask16 m, const int nt, const int nr, const int wt)
{
    __m512 wv[FLOAT_TILE_ROW];
    UNROLL
    for (int r = 0; r < nr; r++)
        wv[r] = load_w16(tl->w0 + (size_t)r * tl->w_stride, i, m, wt);
    UNROLL8
    for (int t = 0; t < nt; t++) {
        const __m512 xv = _mm512_maskz_loadu_ps(m, tl->x + (size_t)t * tl->ldx + i);
        UNROLL
        for (int r = 0; r < nr; r++)
            acc[r][t] = _mm512_fmadd_ps(wv[r], xv, acc[r][t]);
    }
}

/* nr rows x nt tokens: each x load serves nr rows, each widened weight vector nt tokens.
   Repacked rows (seg_k) run segment after segment, the accumulators carried over. */
AI void tile_float(const struct tile *tl, const int nt, const int nr, const int wt)
{
    __m512 acc[FLOAT_TILE_ROW][FLOAT_TILE_TOK];
    UNROLL
    for (int r = 0; r < nr; r++)
        UNROLL8
        for (int t = 0; t < nt; t++)
            acc[r][t] = _mm512_setzero_ps();
    const int64_t kseg = tl->seg_k ? tl->seg_k : tl->k;
    struct tile ts = *tl;
    for (int64_t c0 = 0; c0 < tl->k; c0 += kseg, ts.w0 += tl->seg_bytes, ts.x += kseg) {
        const int64_t k = tl->k - c0 < kseg ? tl->k - c0 : kseg;
        int64_t i = 0;
        if (nt > 1 && tl->seg_k) { /* prefill: the tile's rows in the next segment */
            const int64_t es = wt == DT_F32 ? 4 : 2;
            UNROLL
            for (int r = 0; r < nr; r++)
                for (int64_t b = 0; b < kseg * es; b += 64)
                    _mm_prefetch((const char *)ts.w0 + tl->seg_bytes + (size_t)r * ts.w_stride + b,
                                 _MM_HINT_T0);
        }
        if (nt == 1) { /* decode: one line of each row per step, prefetched ahead */
            const int64_t es = wt == DT_F32 ? 4 : 2, step = 64 / es;
            for (; i + step <= k; i += step) {
                UNROLL
                for (int r = 0; r < nr; r++) {
                    const char *wr = (const char *)ts.w0 + (size_t)r * ts.w_stride + es * i;
                    _mm_prefetch(wr + FLOAT_PREFETCH, _MM_HINT_T0);
                    if (ts.l2)
                        _mm_prefetch(wr + ts.l2, _MM_HINT_T1);
                }
                UNROLL
                for (int64_t j = 0; j < step; j += 16)
                    float_step(&ts, acc, i + j, 0xffff, nt, nr, wt);
            }
        }
        for (; i + 16 <= k; i += 16)
            float_step(&ts, acc, i, 0xffff, nt, nr, wt);
        if (i < k)
            float_step(&ts, acc, i, (__mmask16)((1u << (k - i)) - 1), nt, nr, wt);
    }
    UNROLL
    for (int r = 0; r < nr; r++)
        UNROLL8
        for (int t = 0; t < nt; t++)
            tl->y0[(size_t)t * tl->ldy + r] = fold16(acc[r][t]);
}

/* Float tiles for every constant token count 1..FLOAT_TILE_TOK (at most 8) and rows nr
   (1 or FLOAT_TILE_ROW). */
#define FT_MIN(n) ((n) < FLOAT_TILE_TOK ? (n) : FLOAT_TILE_TOK)
#define FLOAT_SWITCH(nt, nr, wt)                                                            \
    switch (nt) {                                                                           \
    case 1: tile_float(tl, FT_MIN(1), nr, wt); break;                                       \
    case 2: tile_float(tl, FT_MIN(2), nr, wt); break;                                       \
    case 3: tile_float(tl, FT_MIN(3), nr, wt); break;                                       \
    case 4: tile_float(tl, FT_MIN(4), nr, wt); break;                                       \
    case 5: tile_float(tl, FT_MIN(5), nr, wt); break;                                       \
    case 6: tile_float(tl, FT_MIN(6), nr, wt); break;                                       \
    case 7: tile_float(tl, FT_MIN(7), nr, wt); break;                                       \
    default: tile_float(tl, FLOAT_TILE_TOK, nr, wt); break;                                              \
    }

static void run_float_tile(int wt, const struct tile *tl, int nt, int nr)
{
    if (nr == FLOAT_TILE_ROW) {
        if (wt == DT_F32)
            FLOAT_SWITCH(nt, FLOAT_TILE_ROW, DT_F32)
        else if (wt == DT_F16)
            FLOAT_SWITCH(nt, FLOAT_TILE_ROW, DT_F16)
        else
            FLOAT_SWITCH(nt, FLOAT_TILE_ROW, DT_BF16)
    } else {
        if (wt == DT_F32)
            FLOAT_SWITCH(nt, 1, DT_F32)
        else if (wt == DT_F16)
            FLOAT_SWITCH(nt, 1, DT_F16)
        else
            FLOAT_SWITCH(nt, 1, DT_BF16)
    }
}

static void run_tile(int wt, const struct tile *tl, int nt, int nr)
{
    switch (wt) {
    case DT_Q8_0:
        if (nr == GEMM_TILE_ROW)
            TILE_SWITCH(nt, tile_b32(tl, n_, GEMM_TILE_ROW, 1))
        else
            TILE_SWITCH(nt, tile_b32(tl, n_, 1, 1))
        break;
    case DT_Q4_0:
        if (nr == GEMM_TILE_ROW)
            TILE_SWITCH(nt, tile_b32(tl, n_, GEMM_TILE_ROW, 0))
        else
            TILE_SWITCH(nt, tile_b32(tl, n_, 1, 0))
        break;
    case DT_Q4_K: TILE_SWITCH(nt, tile_q4_K(tl, n_)); break;
    case DT_Q6_K: TILE_SWITCH(nt, tile_q6_K(tl, n_)); break;
    default:
        run_float_tile(wt, tl, nt, nr);
        break;
    }
}

/* Rows [r0, r1) x all tokens. Integer path: row tile outside, token tile inside (the row
   tile's weights stay in registers' reach in L1 while the tokens' quantized activations,
   a quarter of f32's bytes, stream by). Float path: token tile outside, row tile inside:
   FLOAT_TILE_TOK tokens' f32 activations (6 x 3 KB at K = 768) stay in L1 while the row
   block's weights (L2, GEMM_ROW_BLOCK_BYTES) stream by, a third of the L2 bytes per FMA
   of the other order (llama-110m F16 pp512, 2 threads: 770 -> 815 and 746 -> 830 tok/s). */
static void gemm_tile_at(const struct gemm_args *a, int64_t r, int64_t t0, int nr, int nt, bool flt,
                         int64_t seg)
{
    const int bt = gemm_base_type(a->wtype);
    const size_t sb = (size_t)seg * (bt == DT_F32 ? 4 : 2); /* seg > 0: repacked floats only */
    struct tile tl = {
        .w0 = (const uint8_t *)a->w + (size_t)r * a->w_row_bytes, .w_stride = a->w_row_bytes,
        .seg_k = seg, .seg_bytes = 16 * sb,
        .k = a->k, .act_stride = a->act_row_bytes, .ldx = a->ldx, .ldy = a->ldy,
        .act = a->act ? (const uint8_t *)a->act + (size_t)t0 * a->act_row_bytes : NULL,
        .x = a->x ? a->x + (size_t)t0 * a->ldx : NULL,
        .y0 = a->y + (size_t)t0 * a->ldy + (size_t)(r - a->r0), .l2 = l2_dist(a),
    };
    if (sb) { /* repacked floats: the tile's rows lie in one group (r0 % 16 == 0, nr | 16) */
        tl.w0 = (const uint8_t *)a->w + (size_t)(r / 16) * 16 * a->w_row_bytes +
                (size_t)(r % 16) * sb;
        tl.w_stride = sb;
    }
    if (flt)
        run_float_tile(bt, &tl, nt, nr);
    else
        run_tile(a->wtype, &tl, nt, nr);
}

static void gemm_rows(const struct gemm_args *a, int64_t r0, int64_t r1, int multi)
{
    const bool flt = gemm_act_kind(a->wtype) == GEMM_ACT_F32;
    const int tile_tok = flt ? FLOAT_TILE_TOK : GEMM_TILE_TOK;
    const int tile_row = flt ? FLOAT_TILE_ROW : GEMM_TILE_ROW;
    const int64_t seg = gemm_base_type(a->wtype) != a->wtype ? gemm_fseg(a->k) : 0;
#define NR_AT(r) (multi && r1 - (r) >= tile_row ? tile_row : 1)
#define NT_AT(t0) (a->n_tok - (t0) < tile_tok ? (int)(a->n_tok - (t0)) : tile_tok)
    if (flt) {
        for (int64_t t0 = 0; t0 < a->n_tok; t0 += tile_tok)
            for (int64_t r = r0; r < r1; r += NR_AT(r))
                gemm_tile_at(a, r, t0, NR_AT(r), NT_AT(t0), true, seg);
    } else {
        for (int64_t r = r0; r < r1; r += NR_AT(r))
            for (int64_t t0 = 0; t0 < a->n_tok; t0 += tile_tok)
                gemm_tile_at(a, r, t0, NR_AT(r), NT_AT(t0), false, seg);
    }
#undef NR_AT
#undef NT_AT
}

/* Cache blocking: rows go in blocks of about GEMM_ROW_BLOCK_BYTES of weights, so a block
   stays in L2 while every token tile passes over it and the activations are streamed once
   per block instead of once per row tile. (Order of work only: numbers do not change.) */
#ifndef GEMM_ROW_BLOCK_BYTES
#define GEMM_ROW_BLOCK_BYTES (256u << 10)
#endif

/* One token x rows [r0, r1) of a float matrix, row after row in one loop: the rows are
   adjacent, so the prefetches run on from one row into the next; per row only the fold
   and the store (the tile path's per-row set-up and dispatch cost 5% at K = 2048). Each
   row is tile_float(1, 1): same operations, same bits.
   With GEMM_RESIDENT (weights that stay in cache), FLOAT_TILE_ROW rows at a time instead,
   tile_float(1, FLOAT_TILE_ROW), still each row's own operations: a row's lane sums are
   one chain of k / 16 dependent FMAs, which one row at a time waits on where the data
   is in cache. One core (Zen 5), one-token products over 1-8 MiB of matrices, GB/s one
   row / four rows: K = 64 f32 60-67 / 86-102, K = 256 f32 84-90 / 93-105, K = 768 f16
   52-57 / 74-108. From memory (128 MiB) four streams lose to one: 29-38 / 20-32. */
AI void float_decode(const struct gemm_args *a, const int wt)
{
    const uint8_t *w = (const uint8_t *)a->w + (size_t)a->r0 * a->w_row_bytes;
    struct tile tl = {.k = a->k, .x = a->x, .ldx = a->ldx, .ldy = a->ldy, .l2 = l2_dist(a),
                      .w_stride = a->w_row_bytes};
    int64_t r = a->r0;
    if (a->flags & GEMM_RESIDENT)
        for (; r + FLOAT_TILE_ROW <= a->r1;
             r += FLOAT_TILE_ROW, w += FLOAT_TILE_ROW * a->w_row_bytes) {
            tl.w0 = w;
            tl.y0 = a->y + (r - a->r0);
            tile_float(&tl, 1, FLOAT_TILE_ROW, wt);
        }
    for (; r < a->r1; r++, w += a->w_row_bytes) {
        tl.w0 = w;
        tl.y0 = a->y + (r - a->r0);
        tile_float(&tl, 1, 1, wt);
    }
}

/* One token x rows [r0, r1) of a repacked float matrix (GEMM_F*_R16): per group of 16
   rows, segment c of each row in turn, then segment c + 1, which is the order of the
   bytes, so the weights stream in one line with the prefetches simply ahead of it, and
   the activations of a segment stay in L1 for the group's 16 rows. Each row's
   accumulator carries over from one segment to its next: tile_float(1, 1)'s operations
   on each row, so the same bits. */
AI void float_decode_r16(const struct gemm_args *a, const int wt)
{
    const int64_t es = wt == DT_F32 ? 4 : 2, step = 64 / es, seg = gemm_fseg(a->k);
    WELD_ASSERT((a->r0 % 16 == 0 || a->r0 == a->r1) && seg > 0);
    const int64_t nseg = a->k / seg;
    const size_t sb = (size_t)(seg * es), l2 = l2_dist(a);
    for (int64_t g0 = a->r0; g0 < a->r1; g0 += 16) {
        const int nr = a->r1 - g0 < 16 ? (int)(a->r1 - g0) : 16;
        const uint8_t *grp = (const uint8_t *)a->w + (size_t)g0 * a->w_row_bytes;
        __m512 acc[16];
        for (int r = 0; r < nr; r++)
            acc[r] = _mm512_setzero_ps();
        for (int64_t c = 0; c < nseg; c++) {
            const float *x = a->x + c * seg;
            for (int r = 0; r < nr; r++) {
                const uint8_t *w = grp + (size_t)(16 * c + r) * sb;
                __m512 s = acc[r];
                for (int64_t i = 0; i < seg; i += step) {
                    _mm_prefetch((const char *)w + es * i + FLOAT_PREFETCH, _MM_HINT_T0);
                    if (l2)
                        _mm_prefetch((const char *)w + es * i + l2, _MM_HINT_T1);
                    UNROLL
                    for (int64_t j = 0; j < step; j += 16)
                        s = _mm512_fmadd_ps(load_w16(w, i + j, 0xffff, wt),
                                            _mm512_loadu_ps(x + i + j), s);
                }
                acc[r] = s;
            }
        }
        for (int r = 0; r < nr; r++)
            a->y[g0 + r - a->r0] = fold16(acc[r]);
    }
}

static void avx512_gemm(const struct gemm_args *a)
{
    WELD_ASSERT(gemm_act_kind(a->wtype) != GEMM_ACT_NONE && a->n_tok >= 1 && a->r0 <= a->r1);
    if (gemm_act_kind(a->wtype) == GEMM_ACT_Q8_R) {
        gemm_r16(a);
        return;
    }
    if (a->wtype == GEMM_Q4_K_R16 || a->wtype == GEMM_Q6_K_R16) {
        gemm_r16kq(a, a->wtype == GEMM_Q6_K_R16);
        return;
    }
    if (gemm_act_kind(a->wtype) == GEMM_ACT_BF16) {
        gemm_bf16_avx512(a);
        return;
    }
    if (a->n_tok == 1 && gemm_base_type(a->wtype) != a->wtype) {
        if (a->wtype == GEMM_F16_R16)
            float_decode_r16(a, DT_F16);
        else
            float_decode_r16(a, DT_F32);
        return;
    }
    if (a->n_tok == 1 && gemm_act_kind(a->wtype) == GEMM_ACT_F32) {
        if (a->wtype == DT_F16)
            float_decode(a, DT_F16);
        else
            float_decode(a, DT_F32);
        return;
    }
    const int multi = a->wtype != DT_Q4_K && a->wtype != DT_Q6_K && a->n_tok > 1;
    int64_t rb = a->n_tok > GEMM_TILE_TOK ? (int64_t)(GEMM_ROW_BLOCK_BYTES / (a->w_row_bytes + 1))
                                          : a->r1 - a->r0;
    const int tr = gemm_act_kind(a->wtype) == GEMM_ACT_F32 ? FLOAT_TILE_ROW : GEMM_TILE_ROW;
    rb = rb < tr ? tr : rb / tr * tr;
    if (gemm_base_type(a->wtype) != a->wtype) /* repacked floats: whole 16-row groups, whose */
        rb = rb < 16 ? 16 : rb / 16 * 16;     /* bytes are contiguous (a part of one is not) */
    for (int64_t r = a->r0; r < a->r1; r += rb)
        gemm_rows(a, r, a->r1 - r < rb ? a->r1 : r + rb, multi);
}

static float avx512_row_dot(int t, const void *row, const float *x, int64_t n)
{
    float y;
    struct tile tl = {.w0 = row, .k = n, .x = x, .ldx = 0, .y0 = &y, .ldy = 0};
    if (t == DT_F32)
        tile_float(&tl, 1, 1, DT_F32);
    else if (t == DT_F16)
        tile_float(&tl, 1, 1, DT_F16);
    else
        tile_float(&tl, 1, 1, DT_BF16);
    return y;
}

static __m512 widen16(int t, __m256i v)
{
    return t == DT_F16 ? _mm512_cvtph_ps(v)
                       : _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(v), 16));
}

/* Plain loads and stores in the body (a masked store cannot forward to the caller's next
   loads of dst), masks only for the tail. */
static void avx512_to_f32(int t, const void *row, float *dst, int64_t n)
{
    const uint16_t *h = row;
    if (t == DT_F32) {
        memcpy(dst, row, (size_t)n * sizeof(float));
        return;
    }
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(dst + i, widen16(t, _mm256_loadu_si256((const __m256i *)(h + i))));
    if (i < n) {
        const __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        _mm512_mask_storeu_ps(dst + i, m, widen16(t, _mm256_maskz_loadu_epi16(m, h + i)));
    }
}

static void avx512_rmsnorm(const float *x, const float *w, float eps, float *out, int64_t n)
{
    const float ss = avx512_row_dot(DT_F32, x, x, n);
    const __m512 inv = _mm512_set1_ps(1.0f / sqrtf(ss / (float)n + eps));
    int64_t i = 0;
    for (; i < n; i += 16) {
        const __mmask16 m = n - i >= 16 ? 0xffff : (__mmask16)((1u << (n - i)) - 1);
        __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), inv);
        if (w)
            v = _mm512_mul_ps(v, _mm512_maskz_loadu_ps(m, w + i));
        _mm512_mask_storeu_ps(out + i, m, v);
    }
}

/* vcvtps2ph, 16 lanes; a group holding a NaN goes through the scalar converter (whose
   NaN is 0x7E00 | sign, where the hardware would keep payload bits). */
static void avx512_to_f16(const float *x, void *dst, int64_t n)
{
    uint8_t *d = dst;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m512 v = _mm512_loadu_ps(x + i);
        if (_mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q))
            dtype_quantize_row(DT_F16, x + i, d + 2 * i, 16);
        else
            _mm256_storeu_si256((__m256i *)(d + 2 * i),
                                _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    }
    if (i < n)
        dtype_quantize_row(DT_F16, x + i, d + 2 * i, n - i);
}

const struct gemm_ops gemm_ops_avx512 = {
    .isa = ISA_AVX512,
    .act_quant = avx512_act_quant,
    .gemm = avx512_gemm,
    .row_dot = avx512_row_dot,
    .to_f32 = avx512_to_f32,
    .rmsnorm = avx512_rmsnorm,
    .attn_chunk = attn_chunk_avx512,
    .softmax_stats = attn_softmax_stats_avx512,
    .top_k = kern_top_k_avx512,
    .silu_mul = attn_silu_mul_avx512,
    .to_f16 = avx512_to_f16,
};
