/*
 * gemm_bf16_avx512 - BF16 weight products with AVX512_BF16 (vdpbf16ps), under gemm.h's
 * BF16 contract, which is that instruction's arithmetic: bit-identical to gemm_scalar.c.
 *
 * Repacked weights (GEMM_BF16_R16): one zmm holds an element pair of 16 rows, so one
 * vdpbf16ps against a token's broadcast activation pair advances 16 rows' chains (32
 * products). A register tile of BF16_TILE_G groups (16 rows each) x BF16_TILE_T tokens
 * keeps its accumulators in 24 zmm (the loops are unrolled by pragma: a rolled loop leaves
 * the tile in memory, a load and store per instruction, at a third of the speed); each
 * weight vector serves BF16_TILE_T tokens and each broadcast pair BF16_TILE_G groups.
 * Prefill walks K in blocks of BF16_KC pairs: a row tile's block of weights (64 KiB) stays
 * in L1/L2 while every token tile passes over it, the chains' partial sums waiting in y
 * between blocks (stored and reloaded as f32, so the chain is unchanged), while the next
 * panel is prefetched into L2 a line per pair step (group j during token tile j), so its
 * first pass reads cache, not memory (1B shape, 2 threads, weld_kernel_bench --pp 64:
 * 201 -> 218 tok/s; weld bench pp128 +5%). On the 1B shape
 * this took one core from 38 to 122 prompt tokens/s of products (weld_kernel_bench --pp
 * 128: 77% of the vdpbf16ps peak). One token (decode) runs two groups side by side, two
 * chains to cover the instruction's latency, prefetching ahead in both streams.
 *
 * GGUF-layout weights (DT_BF16: repacking off, or rows the engine does not repack):
 * pair p of 16 rows is gathered into one zmm (vpgatherdd at row stride), then the same
 * tile; an odd K's last pair is built lane by lane. Slower than the repacked form (one
 * gather per vdpbf16ps for one token) but the same bits.
 *
 * Activations: vcvtneps2bf16, which is gemm_bf16_round (round to nearest even, denormal
 * inputs to zero, NaN quiet).
 *
 * Invariant: every (row, token) output is one chain of vdpbf16ps over its pairs in order,
 * from +0, whatever the tile, row range or token count, so outputs never depend on them.
 */
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/gemm_x86.h"

#include "core/err.h"

#include <immintrin.h>
#include <string.h>

#define AI static inline __attribute__((always_inline))

/* Register tile: BF16_TILE_G groups x BF16_TILE_T tokens = 24 accumulators, + 4 weight
   vectors. */
#ifndef BF16_TILE_G
#define BF16_TILE_G 4
#endif
#ifndef BF16_TILE_T
#define BF16_TILE_T 6
#endif
/* Pairs per K block of prefill: BF16_TILE_G x 16 rows x BF16_KC pairs x 4 bytes of weights
   stay in L1 (2 x 256: 32 KiB). */
#ifndef BF16_KC
#define BF16_KC 256
#endif
/* Software prefetch distance in each group's weight stream (bytes). */
#ifndef BF16_PREFETCH
#define BF16_PREFETCH 2048
#endif

/* ---- activations ---------------------------------------------------------------------- */

void gemm_bf16_act_avx512(const float *x, int64_t k, uint16_t *dst)
{
    int64_t i = 0;
    for (; i + 16 <= k; i += 16) {
        const __m256bh h = _mm512_cvtneps_pbh(_mm512_loadu_ps(x + i));
        _mm256_storeu_si256((__m256i *)(dst + i), (__m256i)h);
    }
    const int64_t end = (k + 31) / 32 * 32;
    for (; i < end; i += 16) {
        const int64_t n = k - i > 0 ? k - i : 0;
        const __mmask16 m = (__mmask16)((1u << n) - 1);
        const __m256bh h = _mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(m, x + i));
        _mm256_storeu_si256((__m256i *)(dst + i), (__m256i)h); /* zeros past k */
    }
}

/* ---- the tile ------------------------------------------------------------------------- */

/* Where a tile's weights come from: group g (16 rows) at w + g * gs; repacked: pair p of
   it at + 64 p; GGUF rows: row i of it at + i * rs (idx: lane i's i * rs), live: the rows
   that exist (a partial last group). */
struct bsrc {
    const uint8_t *w;
    size_t gs, rs;
    __m512i idx;
    __mmask16 live;
    int64_t k;
    const uint8_t *nx; /* prefill, repacked: lines of the next panel to bring into L2, one
                          per pair step (NULL: none) */
};

/* Pair p of the tile's group g. */
AI __m512i ld_pair(const struct bsrc *s, int g, int64_t p, const int rp)
{
    const uint8_t *base = s->w + (size_t)g * s->gs;
    if (rp)
        return _mm512_loadu_si512(base + 64 * (size_t)p);
    return _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), s->live, s->idx,
                                       base + 4 * (size_t)p, 1);
}

/* An odd K's last pair of GGUF rows: element K - 1 alone in each lane's low half. */
static __m512i ld_last_odd(const struct bsrc *s, int g)
{
    uint32_t v[16] = {0};
    for (int i = 0; i < 16; i++)
        if (s->live >> i & 1) {
            uint16_t h;
            memcpy(&h, s->w + (size_t)g * s->gs + (size_t)i * s->rs + 2 * (size_t)(s->k - 1), 2);
            v[i] = h;
        }
    return _mm512_loadu_si512(v);
}

AI __m512 dp(__m512 acc, __m512i w, const uint8_t *xp)
{
    int32_t x;
    memcpy(&x, xp, 4);
    return _mm512_dpbf16_ps(acc, (__m512bh)w, (__m512bh)_mm512_set1_epi32(x));
}

/* ng groups x nt tokens over pairs [p0, p1) (and an odd K's last element when p1 is the
   last pair), continuing the chains in acc[g][t] (16 rows of token t). */
AI void bf16_tile(const struct bsrc *s, const uint8_t *act, size_t as, const int ng, const int nt,
                  const int rp, int64_t p0, int64_t p1, __m512 acc[BF16_TILE_G][BF16_TILE_T])
{
    for (int64_t p = p0; p < p1; p++) {
        if (s->nx)
            _mm_prefetch((const char *)s->nx + 64 * (size_t)(p - p0), _MM_HINT_T1);
        __m512i wv[BF16_TILE_G];
#pragma GCC unroll 4
        for (int g = 0; g < ng; g++) {
            if (rp && (p & 15) == 0)
                _mm_prefetch((const char *)s->w + (size_t)g * s->gs + 64 * (size_t)p +
                                 BF16_PREFETCH,
                             _MM_HINT_T0);
            wv[g] = ld_pair(s, g, p, rp);
        }
#pragma GCC unroll 24
        for (int t = 0; t < nt; t++)
#pragma GCC unroll 4
            for (int g = 0; g < ng; g++)
                acc[g][t] = dp(acc[g][t], wv[g], act + (size_t)t * as + 4 * (size_t)p);
    }
    if (s->k % 2 && p1 == s->k / 2) /* GGUF rows only (a repacked K is even) */
#pragma GCC unroll 4
        for (int g = 0; g < ng; g++) {
            const __m512i w = ld_last_odd(s, g);
#pragma GCC unroll 24
            for (int t = 0; t < nt; t++)
                acc[g][t] = dp(acc[g][t], w, act + (size_t)t * as + 4 * (size_t)p1);
        }
}

/* ---- the driver ----------------------------------------------------------------------- */

/* Lanes [lo, hi) of v into y[0 .. hi - lo). */
AI void store_lanes(float *y, __m512 v, int lo, int hi)
{
    if (lo == 0 && hi == 16) {
        _mm512_storeu_ps(y, v);
        return;
    }
    const __mmask16 m = (__mmask16)(((1u << hi) - 1) & ~((1u << lo) - 1));
    _mm512_mask_storeu_ps(y, (__mmask16)((1u << (hi - lo)) - 1), _mm512_maskz_compress_ps(m, v));
}

/* store_lanes' inverse: y[0 .. hi - lo) into lanes [lo, hi) (the others 0). */
AI __m512 load_lanes(const float *y, int lo, int hi)
{
    if (lo == 0 && hi == 16)
        return _mm512_loadu_ps(y);
    const __mmask16 m = (__mmask16)(((1u << hi) - 1) & ~((1u << lo) - 1));
    return _mm512_maskz_expandloadu_ps(m, y);
}

/* The tile of ng groups whose first row is b x nt tokens from t0, pairs [p0, p1) (rp:
   repacked, b a multiple of 16; GGUF rows: b >= r0). The chains start from +0 at p0 == 0,
   else from the partial sums an earlier call left in y (exact: a chain stored and loaded
   as f32 goes on unchanged). */
AI void bf16_run(const struct gemm_args *a, int64_t b, int64_t t0, const int ng, const int nt,
                 const int rp, int64_t p0, int64_t p1, const uint8_t *nx)
{
    struct bsrc s = {.w = (const uint8_t *)a->w + (size_t)b * a->w_row_bytes,
                     .k = a->k,
                     .gs = 16 * a->w_row_bytes,
                     .rs = a->w_row_bytes,
                     .live = 0xffff,
                     .nx = nx};
    if (!rp) {
        s.idx = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13,
                                                     14, 15),
                                   _mm512_set1_epi32((int)a->w_row_bytes));
        if (a->r1 - b < 16) /* a partial group: ng == 1 */
            s.live = (__mmask16)((1u << (a->r1 - b)) - 1);
    }
    /* group g's rows in the call: lanes [lo, hi), token t's outputs at y[g] + t * ldy */
    int lo[BF16_TILE_G], hi[BF16_TILE_G];
    float *y[BF16_TILE_G];
    __m512 acc[BF16_TILE_G][BF16_TILE_T];
#pragma GCC unroll 4
    for (int g = 0; g < ng; g++) {
        const int64_t gb = b + 16 * g;
        lo[g] = a->r0 > gb ? (int)(a->r0 - gb) : 0;
        hi[g] = a->r1 - gb < 16 ? (int)(a->r1 - gb) : 16;
        y[g] = a->y + (size_t)t0 * a->ldy + (size_t)(gb + lo[g] - a->r0);
#pragma GCC unroll 24
        for (int t = 0; t < nt; t++)
            acc[g][t] = p0 == 0 ? _mm512_setzero_ps()
                                : load_lanes(y[g] + (size_t)t * a->ldy, lo[g], hi[g]);
    }
    bf16_tile(&s, (const uint8_t *)a->act + (size_t)t0 * a->act_row_bytes, a->act_row_bytes, ng, nt,
              rp, p0, p1, acc);
#pragma GCC unroll 4
    for (int g = 0; g < ng; g++)
#pragma GCC unroll 24
        for (int t = 0; t < nt; t++)
            store_lanes(y[g] + (size_t)t * a->ldy, acc[g][t], lo[g], hi[g]);
}

/* Token tiles of every count 1 .. BF16_TILE_T (at most 12) of ng groups. */
#define BF16_CASE(n, ng, rp)                                                                       \
    case n:                                                                                        \
        bf16_run(a, b, t0, ng, n < BF16_TILE_T ? n : BF16_TILE_T, rp, p0, p1, nx);                 \
        break;
#define BF16_NT(nt, ng, rp)                                                                        \
    switch (nt) {                                                                                  \
        BF16_CASE(1, ng, rp)                                                                       \
        BF16_CASE(2, ng, rp)                                                                       \
        BF16_CASE(3, ng, rp)                                                                       \
        BF16_CASE(4, ng, rp)                                                                       \
        BF16_CASE(5, ng, rp)                                                                       \
        BF16_CASE(6, ng, rp)                                                                       \
        BF16_CASE(7, ng, rp)                                                                       \
        BF16_CASE(8, ng, rp)                                                                       \
        BF16_CASE(9, ng, rp)                                                                       \
        BF16_CASE(10, ng, rp)                                                                      \
        BF16_CASE(11, ng, rp)                                                                      \
    default: bf16_run(a, b, t0, ng, BF16_TILE_T, rp, p0, p1, nx); break;                           \
    }

/* Rows [r0, r1) x all tokens, for GEMM_BF16_R16 (rp) or DT_BF16 rows. Prefill: for each
   row tile, K in blocks of BF16_KC pairs whose weights (BF16_TILE_G x 16 rows) stay in L1
   while every token tile passes over them; the partial sums wait in y. */
AI void bf16_gemm(const struct gemm_args *a, const int rp)
{
    const int64_t b0 = rp ? a->r0 / 16 * 16 : a->r0; /* first group's first row */
    const int64_t n_full = (a->r1 - b0) / 16;        /* whole groups */
    const int64_t n_grp = (a->r1 - b0 + 15) / 16;    /* and a partial one */
    const int64_t np = a->k / 2;
    if (a->n_tok == 1) { /* decode: two groups' chains side by side */
        int64_t g = 0;
        const int64_t t0 = 0, p0 = 0, p1 = np;
        for (; g + 2 <= (rp ? n_grp : n_full); g += 2)
            bf16_run(a, b0 + 16 * g, t0, 2, 1, rp, p0, p1, NULL);
        for (; g < n_grp; g++)
            bf16_run(a, b0 + 16 * g, t0, 1, 1, rp, p0, p1, NULL);
        return;
    }
    const int64_t f1 = rp ? n_grp : n_full; /* tiles of whole groups end here */
    for (int64_t g = 0; g < n_grp;) {
        const int ng = g + BF16_TILE_G <= f1 ? BF16_TILE_G : 1;
        const int64_t b = b0 + 16 * g;
        for (int64_t p0 = 0; p0 < np || (p0 == 0 && np == 0); p0 += BF16_KC) {
            const int64_t p1 = p0 + BF16_KC < np ? p0 + BF16_KC : np;
            /* the next panel (this row tile's next K block, else the next row tile's
               first), group j by token tile j, so it comes from memory while this one
               is computed from cache */
            const int64_t nb_ = p1 < np ? b : b + 16 * ng, np0 = p1 < np ? p1 : 0;
            const int n_next = ng; /* past r1: most often the caller's next rows (a
                                      prefetch never faults) */
            const int64_t nlen = p1 < np ? (np - p1 < BF16_KC ? np - p1 : BF16_KC)
                                         : (np < BF16_KC ? np : BF16_KC);
            for (int64_t t0 = 0; t0 < a->n_tok; t0 += BF16_TILE_T) {
                const int nt = a->n_tok - t0 < BF16_TILE_T ? (int)(a->n_tok - t0) : BF16_TILE_T;
                const int j = (int)(t0 / BF16_TILE_T);
                const uint8_t *nx = rp && j < n_next && nlen == p1 - p0
                                        ? (const uint8_t *)a->w + (size_t)nb_ * a->w_row_bytes +
                                              (size_t)j * 16 * a->w_row_bytes + 64 * (size_t)np0
                                        : NULL;
                if (ng == BF16_TILE_G && rp)
                    BF16_NT(nt, BF16_TILE_G, 1)
                else if (ng == BF16_TILE_G)
                    BF16_NT(nt, BF16_TILE_G, 0)
                else if (rp)
                    BF16_NT(nt, 1, 1)
                else
                    BF16_NT(nt, 1, 0)
            }
        }
        g += ng;
    }
}

void gemm_bf16_avx512(const struct gemm_args *a)
{
    WELD_ASSERT(a->n_tok >= 1 && a->r0 <= a->r1 && a->act_row_bytes % 4 == 0);
    WELD_ASSERT(a->wtype == GEMM_BF16_R16 || 15 * a->w_row_bytes < (size_t)1 << 31); /* idx */
    if (a->wtype == GEMM_BF16_R16)
        bf16_gemm(a, 1);
    else
        bf16_gemm(a, 0);
}
