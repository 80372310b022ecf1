/*
 * attn_avx512 - attn.h's chunk step with AVX-512F, bit-identical to attn_chunk_scalar.
 *
 * Three paths, the same numbers. A call with ATTN_MANY or more query rows (a tile of
 * prefill tokens, a large GQA group) transposes the chunk's keys once and runs every
 * row's 16 lanes of all 16 positions as 16 registers (see "many query rows" below): no
 * shuffles per row, value vectors loaded once per 8 rows. Fewer rows (decode: one row per
 * KV head, or a GQA group of 2-4) take the full-chunk kernel when every row sees all 16
 * positions (every chunk of a decode but the last; see "full chunks" below), else the
 * row kernel. weld_attn_bench, hd 64, f16, in L1, one Zen 4 core: one row 186-191 ns per
 * chunk with the row kernel, 163-166 with the full-chunk one; four rows 547-566 and
 * 327-340. On Zen 4 attn_chunk_avx512 hands one-row full chunks to attn_avx2.c's row
 * kernel instead (110 ns there; same bits), and on Zen 5 every one-row chunk (streamed
 * from memory, as decode reads them, the row kernel is ahead there): see
 * attn_avx512_pick at the end. attn_chunk_avx512_zmm never does. With heads of a multiple
 * of 64 (full chunks) or 16 (the row kernel), no load or store is masked (W below):
 * masked loads that miss the cache stall on Zen 5.
 * The row kernel:
 *
 * Scores: one zmm accumulator per position (element i in lane i % 16, fmadd in increasing
 * i, exactly the contract's lanes), then the 16 accumulators are folded together in a
 * transposed tree (8 + 4 + 2 + 1 vector adds, each adding lane i + w to lane i of every
 * position at once), which leaves the 16 scores in one register; a final permute puts
 * position j in lane j. The softmax runs on that register with attn.h's exp polynomial
 * lane by lane (same fmaf steps, same rounding), and the value rows are accumulated with
 * broadcast fmadds. Any hd: a partial last vector is masked (the dot's missing lanes are
 * kept untouched, as the contract's unused lanes stay +0).
 *
 * Register arrays are indexed by constants only (loops over rows, lanes and positions
 * unrolled): an accumulator array indexed by a loop variable lives on the stack, which
 * ran the chunk at half speed (one core, hd 64, 32 rows: 140 -> 64 ns per row and chunk). */
#include "kernels/cpu/attn.h"
#include "kernels/cpu/isa.h"

#include <immintrin.h>
#include <math.h>
#include <stdbool.h>

/* The contract's exp on 16 lanes (attn_exp, lane for lane). */
static inline __m512 exp16(__m512 x)
{
    const __mmask16 ok = _mm512_cmp_ps_mask(x, _mm512_set1_ps(ATTN_EXP_MIN), _CMP_GE_OQ);
    __m512 k = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(ATTN_LOG2E)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 nk = _mm512_sub_ps(_mm512_setzero_ps(), k);
    __m512 r = _mm512_fmadd_ps(nk, _mm512_set1_ps(ATTN_LN2_HI), x);
    r = _mm512_fmadd_ps(nk, _mm512_set1_ps(ATTN_LN2_LO), r);
    __m512 p = _mm512_fmadd_ps(_mm512_set1_ps(ATTN_P6), r, _mm512_set1_ps(ATTN_P5));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(ATTN_P4));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(ATTN_P3));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(ATTN_P2));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    /* k is integral and in [-124, 0] wherever ok; elsewhere the lane is zeroed below. */
    __m512i kb = _mm512_slli_epi32(_mm512_cvtps_epi32(k), 23);
    p = _mm512_castsi512_ps(_mm512_add_epi32(_mm512_castps_si512(p), kb));
    return _mm512_maskz_mov_ps(ok, p);
}

#define AI static inline __attribute__((always_inline))
#define UNROLL4 _Pragma("GCC unroll 4")
#define UNROLL _Pragma("GCC unroll 16")
#define UNROLL8 _Pragma("GCC unroll 8")

/* The transposed fold (see the file comment: lanes i + w added to lanes i of pairs of
   registers) of P position accumulators, as far as their positions reach: P = 16 runs
   every step (w = 8, 4, 2, 1), 8 stops after w = 2, 4 after w = 4. */
AI __m512 fold_group(const __m512 *d, const int P)
{
    __m512 w1[8], w2[4], w3[2];
    UNROLL8
    for (int k = 0; k < P / 2; k++)
        w1[k] = _mm512_add_ps(_mm512_shuffle_f32x4(d[2 * k], d[2 * k + 1], 0x44),
                              _mm512_shuffle_f32x4(d[2 * k], d[2 * k + 1], 0xEE));
    UNROLL4
    for (int k = 0; k < P / 4; k++)
        w2[k] = _mm512_add_ps(_mm512_shuffle_f32x4(w1[2 * k], w1[2 * k + 1], 0x88),
                              _mm512_shuffle_f32x4(w1[2 * k], w1[2 * k + 1], 0xDD));
    if (P == 4)
        return w2[0];
    for (int k = 0; k < P / 8; k++)
        w3[k] = _mm512_add_ps(_mm512_shuffle_ps(w2[2 * k], w2[2 * k + 1], 0x44),
                              _mm512_shuffle_ps(w2[2 * k], w2[2 * k + 1], 0xEE));
    if (P == 8)
        return w3[0];
    return _mm512_add_ps(_mm512_shuffle_ps(w3[0], w3[1], 0x88),
                         _mm512_shuffle_ps(w3[0], w3[1], 0xDD));
}

/* The tree's last steps from the partial folds of 16 / P groups, then the permute that
   puts position j in lane j (after the tree, lane 4q + k holds position q + 4k). */
AI __m512 fold_finish(const __m512 *g, const int P)
{
    __m512 w3[2], f;
    if (P == 16) {
        f = g[0];
    } else {
        if (P == 4)
            for (int k = 0; k < 2; k++)
                w3[k] = _mm512_add_ps(_mm512_shuffle_ps(g[2 * k], g[2 * k + 1], 0x44),
                                      _mm512_shuffle_ps(g[2 * k], g[2 * k + 1], 0xEE));
        else
            w3[0] = g[0], w3[1] = g[1];
        f = _mm512_add_ps(_mm512_shuffle_ps(w3[0], w3[1], 0x88),
                          _mm512_shuffle_ps(w3[0], w3[1], 0xDD));
    }
    const __m512i idx = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    return _mm512_permutexvar_ps(idx, f);
}

/* The 16 folded values of 16 position accumulators, position j in lane j. */
AI __m512 fold16x16(const __m512 d[16])
{
    const __m512 g = fold_group(d, 16);
    return fold_finish(&g, 16);
}

/* The contract's fold of one register's 16 lanes (w = 8, 4, 2, 1). */
static inline float fold16(__m512 v)
{
    __m256 a8 = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
    __m128 a4 = _mm_add_ps(_mm256_castps256_ps128(a8), _mm256_extractf128_ps(a8, 1));
    __m128 a2 = _mm_add_ps(a4, _mm_movehl_ps(a4, a4));
    return _mm_cvtss_f32(_mm_add_ss(a2, _mm_shuffle_ps(a2, a2, 1)));
}

/* 16 f16 or bf16 elements widened to f32 (exact). */
AI __m512 widen16h(int t, __m256i h)
{
    return t == DT_F16 ? _mm512_cvtph_ps(h)
                       : _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* The elements [i, i + 16) of a row of type t that mask m selects, widened to f32 (exact;
   the others 0). */
static inline __m512 load16(int t, const uint8_t *row, int i, __mmask16 m)
{
    if (t == DT_F32)
        return _mm512_maskz_loadu_ps(m, row + 4 * (size_t)i);
    return widen16h(t, _mm256_maskz_loadu_epi16(m, row + 2 * (size_t)i));
}

/* load16 of a whole vector (all 16 elements): a plain load, no mask. */
AI __m512 load16w(int t, const uint8_t *row, int i)
{
    if (t == DT_F32)
        return _mm512_loadu_ps(row + 4 * (size_t)i);
    return widen16h(t, _mm256_loadu_si256((const __m256i *)(row + 2 * (size_t)i)));
}


/* The contract's softmax step of row r given its 16 dots (position j in lane j): the
   running max and denominator updated, p_j into pj, corr returned. */
AI float softmax_row(const struct attn_chunk_args *a, int r, __m512 dots, float *pj)
{
    const __mmask16 valid = (__mmask16)((1u << a->n[r]) - 1u);
    __m512 s = _mm512_mul_ps(dots, _mm512_set1_ps(a->scale));
    s = _mm512_mask_mov_ps(_mm512_set1_ps(-INFINITY), valid, s);
    const float cm = _mm512_reduce_max_ps(s);
    const float m = a->m[r], mn = attn_fmax(m, cm);
    const float corr = attn_exp(m - mn);
    const __m512 p = exp16(_mm512_sub_ps(s, _mm512_set1_ps(mn)));
    a->l[r] = a->l[r] * corr + fold16(p);
    a->m[r] = mn;
    _mm512_storeu_ps(pj, p);
    return corr;
}

/* R query rows (R = 1 or 2) of one call against the chunk, interleaved: both rows' chains
   (dots, folds, exps, the value accumulation) are independent, so running them side by
   side hides the latency one row alone leaves exposed, and each key and value vector is
   loaded once for both. Every row's arithmetic is exactly the single-row contract.
   W = 16 (heads of a multiple of 16) drops the masks of the head's tail, as rows_full's
   W does (a decode's last chunk, streamed with 9 of 16 positions visible: 640 ns per
   chunk masked on Zen 5). */
AI void rows_typed(const struct attn_chunk_args *a, const int t, const int r0, const int R,
                   const int W)
{
    const int hd = a->hd, nv = (hd + 15) / 16;
    /* the last vector may be partial (hd % 16): its missing lanes are left untouched in
       the dot (mask3 fma keeps them +0, as the contract's unused lanes), never stored */
    const __mmask16 tail = hd % 16 ? (__mmask16)((1u << (hd % 16)) - 1u) : (__mmask16)0xffff;
    int n[2], n_max = 0;
    const float *q[2];
    for (int i = 0; i < R; i++) {
        n[i] = a->n[r0 + i];
        q[i] = a->q[r0 + i];
        n_max = n[i] > n_max ? n[i] : n_max;
    }
    __m512 d[2][ATTN_CHUNK];
    for (int i = 0; i < R; i++)
        for (int j = 0; j < ATTN_CHUNK; j++)
            d[i][j] = _mm512_setzero_ps();
    UNROLL /* d[i][j] must have constant indices to stay in registers */
    for (int j = 0; j < ATTN_CHUNK; j++) {
        if (j >= n_max)
            break;
        for (int v = 0; v < nv; v++) {
            const __mmask16 m = v == nv - 1 ? tail : (__mmask16)0xffff;
            const __m512 k = W ? load16w(t, a->k[j], 16 * v) : load16(t, a->k[j], 16 * v, m);
            for (int i = 0; i < R; i++)
                d[i][j] = W ? _mm512_fmadd_ps(_mm512_loadu_ps(q[i] + 16 * v), k, d[i][j])
                            : _mm512_mask3_fmadd_ps(_mm512_maskz_loadu_ps(m, q[i] + 16 * v), k,
                                                    d[i][j], m);
        }
    }
    float pj[2][ATTN_CHUNK], corr[2];
    for (int i = 0; i < R; i++)
        corr[i] = softmax_row(a, r0 + i, fold16x16(d[i]), pj[i]);
    for (int v = 0; v < nv; v++) {
        const __mmask16 m = v == nv - 1 ? tail : (__mmask16)0xffff;
        __m512 x[2];
        for (int i = 0; i < R; i++) {
            const float *ap = a->acc + (size_t)(r0 + i) * hd + 16 * v;
            x[i] = _mm512_mul_ps(W ? _mm512_loadu_ps(ap) : _mm512_maskz_loadu_ps(m, ap),
                                 _mm512_set1_ps(corr[i]));
        }
        for (int j = 0; j < n_max; j++) {
            const __m512 vv = W ? load16w(t, a->v[j], 16 * v) : load16(t, a->v[j], 16 * v, m);
            for (int i = 0; i < R; i++)
                if (j < n[i]) /* the contract stops at the row's count (0 * inf is NaN) */
                    x[i] = _mm512_fmadd_ps(_mm512_set1_ps(pj[i][j]), vv, x[i]);
        }
        for (int i = 0; i < R; i++) {
            float *ap = a->acc + (size_t)(r0 + i) * hd + 16 * v;
            if (W)
                _mm512_storeu_ps(ap, x[i]);
            else
                _mm512_mask_storeu_ps(ap, m, x[i]);
        }
    }
}

/* ---- full chunks, a few rows -------------------------------------------------------------

   The common decode case: every row sees all 16 positions (every chunk of a decode but
   its sequence's last). R rows (1-4: one query row per KV head, or a GQA group) run at
   once with every accumulator in a register: positions in groups of P = 16 (R = 1),
   8 (R = 2) or 4 (R = 3, 4), R x P score accumulators, each key vector loaded and widened
   once for the R rows; each group is folded as far as its positions go (the tree pairs
   positions 2k and 2k + 1 at w = 8, then runs of 4, then of 8: a group of 4 ends at
   w = 4, of 8 at w = 2), and the groups' partial folds meet in the remaining steps of
   the same tree, so the numbers are fold16x16's. The values run 4 vectors of the head at
   a time for every row (4R accumulator chains in flight, each key of the chain the
   contract's fmaf in increasing j). No position count checks: n = 16 for every row.
   W = 64 (heads of a multiple of 64: 64, 128, 256) drops every mask: plain loads, FMAs
   and stores, the same arithmetic. A masked load whose mask is only known at run time
   stays a masked load, and on Zen 5 those that miss the cache stall: one-row decode
   chunks streamed from memory took 430 ns with masks and ~240 without (weld_attn_bench,
   hd 64 f16; in L1 both ~100), and llama-110m Q8_0 decoded at depth 512 1.27-1.52x
   faster (`weld bench -p 16 -n 128 -d 512 -r 3`, alternated with the masked build). */
#define FULL_VB 4 /* head vectors per pass of the value accumulation */

AI void rows_full(const struct attn_chunk_args *a, const int t, const int r0, const int R,
                  const int W)
{
    /* with W, hd is written as a multiple of W (it is one), so the compiler sees nv as a
       multiple of FULL_VB: no partial pass of the value loop */
    const int hd = W ? W * (a->hd / W) : a->hd, nv = (hd + 15) / 16;
    const int P = R == 1 ? 16 : R == 2 ? 8 : 4;
    const __mmask16 tail = hd % 16 ? (__mmask16)((1u << (hd % 16)) - 1u) : (__mmask16)0xffff;
    const float *q[4];
    UNROLL4
    for (int i = 0; i < R; i++)
        q[i] = a->q[r0 + i];
    __m512 part[4][4]; /* [row][group]: the groups' partial folds */
    UNROLL4
    for (int g = 0; g < 16 / P; g++) {
        __m512 d[4][16];
        UNROLL4
        for (int i = 0; i < R; i++)
            UNROLL
            for (int j = 0; j < P; j++)
                d[i][j] = _mm512_setzero_ps();
        for (int v = 0; v < nv; v++) {
            const __mmask16 m = v == nv - 1 ? tail : (__mmask16)0xffff;
            __m512 qv[4];
            UNROLL4
            for (int i = 0; i < R; i++)
                qv[i] = W ? _mm512_loadu_ps(q[i] + 16 * v) : _mm512_maskz_loadu_ps(m, q[i] + 16 * v);
            UNROLL
            for (int j = 0; j < P; j++) {
                const __m512 k = W ? load16w(t, a->k[g * P + j], 16 * v)
                                   : load16(t, a->k[g * P + j], 16 * v, m);
                UNROLL4
                for (int i = 0; i < R; i++)
                    d[i][j] = W ? _mm512_fmadd_ps(qv[i], k, d[i][j])
                                : _mm512_mask3_fmadd_ps(qv[i], k, d[i][j], m);
            }
        }
        UNROLL4
        for (int i = 0; i < R; i++)
            part[i][g] = fold_group(d[i], P);
    }
    float pj[4][ATTN_CHUNK], corr[4];
    UNROLL4
    for (int i = 0; i < R; i++)
        corr[i] = softmax_row(a, r0 + i, fold_finish(part[i], P), pj[i]);
    for (int v0 = 0; v0 < nv; v0 += FULL_VB) {
        /* a pass past the head's end (nv not a multiple of FULL_VB) masks its vectors
           off entirely: no loads, no stores, zeros in between */
        __mmask16 mb[FULL_VB];
        __m512 x[4][FULL_VB];
        UNROLL4
        for (int b = 0; b < FULL_VB; b++) {
            mb[b] = v0 + b < nv - 1 ? (__mmask16)0xffff : v0 + b == nv - 1 ? tail : 0;
            UNROLL4
            for (int i = 0; i < R; i++) {
                const float *ap = a->acc + (size_t)(r0 + i) * hd + 16 * (v0 + b);
                x[i][b] = _mm512_mul_ps(W ? _mm512_loadu_ps(ap) : _mm512_maskz_loadu_ps(mb[b], ap),
                                        _mm512_set1_ps(corr[i]));
            }
        }
        UNROLL
        for (int j = 0; j < ATTN_CHUNK; j++)
            UNROLL4
            for (int b = 0; b < FULL_VB; b++) {
                const __m512 vv = W ? load16w(t, a->v[j], 16 * (v0 + b))
                                    : load16(t, a->v[j], 16 * (v0 + b), mb[b]);
                UNROLL4
                for (int i = 0; i < R; i++)
                    x[i][b] = _mm512_fmadd_ps(_mm512_set1_ps(pj[i][j]), vv, x[i][b]);
            }
        UNROLL4
        for (int b = 0; b < FULL_VB; b++)
            UNROLL4
            for (int i = 0; i < R; i++)
                if (W)
                    _mm512_storeu_ps(a->acc + (size_t)(r0 + i) * hd + 16 * (v0 + b), x[i][b]);
                else
                    _mm512_mask_storeu_ps(a->acc + (size_t)(r0 + i) * hd + 16 * (v0 + b),
                                          mb[b], x[i][b]);
    }
}

/* ---- many query rows against one chunk (a tile of prefill tokens, a GQA group) --------

   The keys are transposed once per call (kt[e][j] = element e of key j), so that for one
   row the contract's 16 lanes of all 16 positions are 16 registers D_L (lane L of every
   position at once): D_L = fma(q[e], kt[e], D_L) over e = L, L + 16, ... in increasing
   order is exactly the contract's lane chain, and its pairwise fold (lane i += lane i + w)
   becomes D_i + D_{i+w}: 15 vector adds, no shuffles, position j left in lane j. The even
   lanes (which fold into lane 0 of w = 2) and the odd lanes (lane 1) run as two passes of
   8 accumulators for 3 rows at once, each key vector loaded once for the three. Values
   are then accumulated 8 rows at a time per loaded value vector. Same bits as the
   contract; the transposition (16 x 16 blocks by four vpermt2ps butterflies) pays once a
   call has ATTN_MANY rows. */
#define ATTN_MANY 5
#define ATTN_KT_HD 256 /* largest head dimension the transposed path takes */
#define MANY_QROWS 3
#define MANY_VROWS 8
#define ATTN_MANY_MAXROWS 64 /* rows per pass over the transposed keys */

/* 16 x 16 transpose in place: butterflies at distance 8, 4, 2, 1, each swapping the
   off-diagonal d x d blocks of every 2d x 2d block. */
AI void transpose16(__m512 r[16])
{
    /* per distance d: row i takes lanes l (l & d == 0) from itself and l - d of row i + d;
       row i + d takes lanes l + d of row i and l (l & d) of itself (16 + l: the second
       operand of vpermt2ps) */
    static const int32_t lo[4][16] = {
        {0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23},
        {0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27},
        {0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29},
        {0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30}};
    static const int32_t hi[4][16] = {
        {8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31},
        {4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31},
        {2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31},
        {1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31}};
    UNROLL4
    for (int s = 0; s < 4; s++) {
        const int d = 8 >> s;
        const __m512i il = _mm512_loadu_si512(lo[s]), ih = _mm512_loadu_si512(hi[s]);
        UNROLL
        for (int i = 0; i < 16; i++)
            if (!(i & d)) {
                const __m512 a = r[i], b = r[i + d];
                r[i] = _mm512_permutex2var_ps(a, il, b);
                r[i + d] = _mm512_permutex2var_ps(a, ih, b);
            }
    }
}

/* kt[e * 16 + j] = element e of key j for j < n_max, 0 for the other positions. */
AI void keys_transposed(const struct attn_chunk_args *a, const int t, int n_max, float *kt)
{
    const int hd = a->hd;
    for (int v = 0; 16 * v < hd; v++) {
        const int ne = hd - 16 * v < 16 ? hd - 16 * v : 16;
        const __mmask16 m = ne == 16 ? (__mmask16)0xffff : (__mmask16)((1u << ne) - 1u);
        __m512 r[16]; /* every loop over r unrolled, so it stays in registers */
        UNROLL
        for (int j = 0; j < 16; j++)
            r[j] = j < n_max ? load16(t, a->k[j], 16 * v, m) : _mm512_setzero_ps();
        transpose16(r);
        UNROLL
        for (int e = 0; e < 16; e++)
            if (e < ne)
                _mm512_store_ps(kt + (size_t)(16 * v + e) * 16, r[e]);
    }
}

/* The 16 dots of R rows (row ids in rows[]) from kt: dots[i], position j in lane j. */
AI void dots_many(const float *kt, int hd, const float *const *q, const int *rows, const int R,
                  __m512 *dots)
{
    /* every register index below must be a constant: the loops over rows and lanes are
       unrolled, or the accumulators live on the stack */
    __m512 g[2][MANY_QROWS];
    UNROLL
    for (int p = 0; p < 2; p++) { /* even lanes, then odd lanes */
        __m512 d[MANY_QROWS][8];
        UNROLL
        for (int i = 0; i < R; i++)
            UNROLL8
            for (int u = 0; u < 8; u++)
                d[i][u] = _mm512_setzero_ps();
        const float *qr[MANY_QROWS];
        UNROLL
        for (int i = 0; i < R; i++)
            qr[i] = q[rows[i]];
        int base = 0;
        for (; base + 16 <= hd; base += 16)
            UNROLL8
            for (int u = 0; u < 8; u++) {
                const int e = base + 2 * u + p;
                const __m512 kv = _mm512_load_ps(kt + (size_t)e * 16);
                UNROLL
                for (int i = 0; i < R; i++)
                    d[i][u] = _mm512_fmadd_ps(_mm512_set1_ps(qr[i][e]), kv, d[i][u]);
            }
        UNROLL8
        for (int u = 0; u < 8; u++) { /* a partial last vector */
            const int e = base + 2 * u + p;
            if (e < hd) {
                const __m512 kv = _mm512_load_ps(kt + (size_t)e * 16);
                UNROLL
                for (int i = 0; i < R; i++)
                    d[i][u] = _mm512_fmadd_ps(_mm512_set1_ps(qr[i][e]), kv, d[i][u]);
            }
        }
        UNROLL
        for (int i = 0; i < R; i++) { /* lanes 2u + p: w = 8 (u, u + 4), w = 4 (u, u + 2) */
            const __m512 e0 = _mm512_add_ps(d[i][0], d[i][4]), e1 = _mm512_add_ps(d[i][1], d[i][5]);
            const __m512 e2 = _mm512_add_ps(d[i][2], d[i][6]), e3 = _mm512_add_ps(d[i][3], d[i][7]);
            g[p][i] = _mm512_add_ps(_mm512_add_ps(e0, e2), _mm512_add_ps(e1, e3));
        }
    }
    UNROLL
    for (int i = 0; i < R; i++) /* w = 1: lane 0 + lane 1 */
        dots[i] = _mm512_add_ps(g[0][i], g[1][i]);
}

/* acc = acc * corr + sum_j p_j v_j for R rows (row ids rows[], p_j of row i at
   pt[i + 16 * j]), each value vector loaded once for the R rows. */
AI void values_many(const struct attn_chunk_args *a, const int t, const int *rows,
                    const float *corr, const float *pt, const int R)
{
    const int hd = a->hd;
    const __mmask16 tail = hd % 16 ? (__mmask16)((1u << (hd % 16)) - 1u) : (__mmask16)0xffff;
    int gmax = 0, gmin = ATTN_CHUNK, n[MANY_VROWS];
    UNROLL8
    for (int i = 0; i < R; i++) {
        n[i] = a->n[rows[i]];
        gmax = n[i] > gmax ? n[i] : gmax;
        gmin = n[i] < gmin ? n[i] : gmin;
    }
    for (int v = 0; 16 * v < hd; v++) {
        const __mmask16 m = 16 * (v + 1) > hd ? tail : (__mmask16)0xffff;
        __m512 x[MANY_VROWS];
        UNROLL8
        for (int i = 0; i < R; i++)
            x[i] = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, a->acc + (size_t)rows[i] * hd + 16 * v),
                                 _mm512_set1_ps(corr[i]));
        int j = 0;
        for (; j < gmin; j++) { /* positions every row sees */
            const __m512 vv = load16(t, a->v[j], 16 * v, m);
            UNROLL8
            for (int i = 0; i < R; i++)
                x[i] = _mm512_fmadd_ps(_mm512_set1_ps(pt[i + 16 * j]), vv, x[i]);
        }
        for (; j < gmax; j++) {
            const __m512 vv = load16(t, a->v[j], 16 * v, m);
            UNROLL8
            for (int i = 0; i < R; i++)
                if (j < n[i]) /* the contract stops at the row's count */
                    x[i] = _mm512_fmadd_ps(_mm512_set1_ps(pt[i + 16 * j]), vv, x[i]);
        }
        UNROLL8
        for (int i = 0; i < R; i++)
            _mm512_mask_storeu_ps(a->acc + (size_t)rows[i] * hd + 16 * v, m, x[i]);
    }
}

/* attn_fmax(x, y) lane by lane: vmaxps gives y when either is NaN or both are equal;
   a NaN y becomes x. */
AI __m512 fmax16(__m512 x, __m512 y)
{
    return _mm512_mask_mov_ps(_mm512_max_ps(x, y), _mm512_cmp_ps_mask(y, y, _CMP_UNORD_Q), x);
}

/* The softmax step of up to 16 rows at once (rows[i], i < R; sd[i] their 16 dots), lane
   i = row i: the scores are transposed (ST[j] = position j of every row), so the running
   max (attn_fmax over j in increasing order, as the scalar reference), the exp of each score,
   the correction and the pairwise fold of the p lanes (lane j += lane j + w, w = 8, 4, 2, 1)
   are all vector operations across rows instead of reductions within one. Writes p_j of
   row i at pt[i + 16 * j] and the rows' corrections at corr[i]. */
AI void softmax_many(const struct attn_chunk_args *a, const int *rows, int R,
                     const float (*sd)[ATTN_CHUNK], float *pt, float *corr)
{
    _Alignas(64) float mv[16], lv[16];
    _Alignas(64) int32_t nv[16];
    __m512 st[ATTN_CHUNK];
    UNROLL
    for (int i = 0; i < 16; i++)
        st[i] = i < R ? _mm512_load_ps(sd[i]) : _mm512_setzero_ps();
    for (int i = 0; i < 16; i++) {
        mv[i] = i < R ? a->m[rows[i]] : -INFINITY;
        lv[i] = i < R ? a->l[rows[i]] : 0.0f;
        nv[i] = i < R ? a->n[rows[i]] : 0;
    }
    transpose16(st);
    const __m512i n = _mm512_load_si512(nv);
    const __m512 scale = _mm512_set1_ps(a->scale);
    __m512 cm = _mm512_set1_ps(-INFINITY);
    UNROLL
    for (int j = 0; j < ATTN_CHUNK; j++) {
        const __mmask16 vj = _mm512_cmpgt_epi32_mask(n, _mm512_set1_epi32(j));
        st[j] = _mm512_mul_ps(st[j], scale);
        cm = _mm512_mask_mov_ps(cm, vj, fmax16(cm, st[j]));
    }
    const __m512 m = _mm512_load_ps(mv), mn = fmax16(m, cm);
    const __m512 c = exp16(_mm512_sub_ps(m, mn));
    UNROLL
    for (int j = 0; j < ATTN_CHUNK; j++) {
        const __mmask16 vj = _mm512_cmpgt_epi32_mask(n, _mm512_set1_epi32(j));
        st[j] = _mm512_maskz_mov_ps(vj, exp16(_mm512_sub_ps(st[j], mn)));
        _mm512_store_ps(pt + 16 * j, st[j]);
    }
    UNROLL
    for (int w = 8; w >= 1; w /= 2)
        UNROLL
        for (int j = 0; j < w; j++)
            st[j] = _mm512_add_ps(st[j], st[j + w]);
    _mm512_store_ps(lv, _mm512_add_ps(_mm512_mul_ps(_mm512_load_ps(lv), c), st[0]));
    _mm512_store_ps(mv, mn);
    _mm512_storeu_ps(corr, c);
    for (int i = 0; i < R; i++) {
        a->l[rows[i]] = lv[i];
        a->m[rows[i]] = mv[i];
    }
}

AI void chunk_many(const struct attn_chunk_args *a, const int t, const int *live, int nl)
{
    const int hd = a->hd;
    int n_max = 0;
    for (int k = 0; k < nl; k++)
        n_max = a->n[live[k]] > n_max ? a->n[live[k]] : n_max;
    _Alignas(64) float kt[ATTN_KT_HD * 16];
    _Alignas(64) float sd[ATTN_MANY_MAXROWS][ATTN_CHUNK];     /* dots, row by row */
    _Alignas(64) float pt[ATTN_MANY_MAXROWS / 16][16 * ATTN_CHUNK]; /* p, 16 rows a block */
    _Alignas(64) float corr[ATTN_MANY_MAXROWS];
    keys_transposed(a, t, n_max, kt);
    for (int k = 0; k < nl; k += MANY_QROWS) {
        __m512 dots[MANY_QROWS];
        const int R = nl - k < MANY_QROWS ? nl - k : MANY_QROWS;
        if (R == MANY_QROWS)
            dots_many(kt, hd, a->q, live + k, MANY_QROWS, dots);
        else if (R == 2)
            dots_many(kt, hd, a->q, live + k, 2, dots);
        else
            dots_many(kt, hd, a->q, live + k, 1, dots);
        for (int i = 0; i < R; i++)
            _mm512_store_ps(sd[k + i], dots[i]);
    }
    for (int k = 0; k < nl; k += 16)
        softmax_many(a, live + k, nl - k < 16 ? nl - k : 16, sd + k, pt[k / 16], corr + k);
    for (int k0 = 0; k0 < nl; k0 += MANY_VROWS) {
        const int *rows = live + k0;
        const float *pk = &pt[k0 / 16][k0 % 16]; /* row k0's p_0 */
        switch (nl - k0 < MANY_VROWS ? nl - k0 : MANY_VROWS) {
        case 1: values_many(a, t, rows, corr + k0, pk, 1); break;
        case 2: values_many(a, t, rows, corr + k0, pk, 2); break;
        case 3: values_many(a, t, rows, corr + k0, pk, 3); break;
        case 4: values_many(a, t, rows, corr + k0, pk, 4); break;
        case 5: values_many(a, t, rows, corr + k0, pk, 5); break;
        case 6: values_many(a, t, rows, corr + k0, pk, 6); break;
        case 7: values_many(a, t, rows, corr + k0, pk, 7); break;
        default: values_many(a, t, rows, corr + k0, pk, MANY_VROWS); break;
        }
    }
}

/* The chunk for one KV type: t is a constant in each caller, so the widening folds away.
   Rows with nothing visible are skipped; the rest go two at a time. */
AI void chunk_typed(const struct attn_chunk_args *a, const int t)
{
    if (a->nq >= ATTN_MANY && a->hd <= ATTN_KT_HD) {
        int live[ATTN_MANY_MAXROWS], nl = 0;
        for (int r0 = 0; r0 < a->nq; r0 += ATTN_MANY_MAXROWS) {
            nl = 0;
            for (int r = r0; r < a->nq && r < r0 + ATTN_MANY_MAXROWS; r++)
                if (a->n[r] > 0)
                    live[nl++] = r;
            if (nl)
                chunk_many(a, t, live, nl);
        }
        return;
    }
    bool full = true;
    for (int r = 0; r < a->nq && full; r++)
        full = a->n[r] == ATTN_CHUNK;
    if (full) {
#define FULL_W(R) (a->hd % 64 == 0 ? rows_full(a, t, r0, R, 64) : rows_full(a, t, r0, R, 0))
        for (int r0 = 0; r0 < a->nq; r0 += 4)
            switch (a->nq - r0 < 4 ? a->nq - r0 : 4) {
            case 1: FULL_W(1); break;
            case 2: FULL_W(2); break;
            case 3: FULL_W(3); break;
            default: FULL_W(4); break;
            }
#undef FULL_W
        return;
    }
#define TYPED_W(r, R) (a->hd % 16 == 0 ? rows_typed(a, t, r, R, 16) : rows_typed(a, t, r, R, 0))
    int live[2], k = 0;
    for (int r = 0; r < a->nq; r++) {
        if (a->n[r] <= 0)
            continue;
        live[k++] = r;
        if (k == 2) {
            if (live[1] == live[0] + 1) {
                TYPED_W(live[0], 2);
            } else {
                TYPED_W(live[0], 1);
                TYPED_W(live[1], 1);
            }
            k = 0;
        }
    }
    if (k)
        TYPED_W(live[0], 1);
#undef TYPED_W
}

void attn_chunk_avx512_zmm(const struct attn_chunk_args *a)
{
    if (a->kv_type == DT_F16)
        chunk_typed(a, DT_F16);
    else if (a->kv_type == DT_BF16)
        chunk_typed(a, DT_BF16);
    else
        chunk_typed(a, DT_F32);
}

/* Which one-row chunks run faster through attn_avx2.c's row kernel (decode without GQA),
   decided once, at load:
   - AMD family 0x19 (Zen 4, the only one of that family with AVX-512), which executes a
     zmm operation as two 256-bit halves: full chunks. weld_attn_bench, one core, hd 64,
     f16: 110 ns per chunk in L1 against 163-166 here, 150-173 against 177-230 streamed.
   - AMD family 0x1A (Zen 5, full 512-bit units): every one-row chunk, because decode
     streams its keys and values from memory (the weights evicted them) and there the row
     kernel is ahead. weld_attn_bench, hd 64, f16, ns per chunk streamed / in L1: full
     chunks 134-150 / 98 against 288-294 / 89 here; 9 of 16 positions visible 262-275 /
     83 against 350-359 / 104.
   Intel parts keep this file's kernels. */
static int g_one_row_ymm; /* 0: never, 1: full chunks, 2: any one-row chunk */

__attribute__((constructor)) static void attn_avx512_pick(void)
{
    unsigned fam = isa_amd_family();
    g_one_row_ymm = fam == 0x19 ? 1 : fam == 0x1A ? 2 : 0;
}

void attn_chunk_avx512(const struct attn_chunk_args *a)
{
    if (a->nq == 1 && (g_one_row_ymm == 2 || (g_one_row_ymm == 1 && a->n[0] == ATTN_CHUNK))) {
        attn_chunk_avx2(a);
        return;
    }
    attn_chunk_avx512_zmm(a);
}

/* attn.h's softmax statistics: one register of 16 lanes is the contract's lanes (lane j %
   16), the last partial vector masked (max: -inf, sum: 0 in the lanes it lacks). Max with
   the new value first: _mm512_max_ps returns its second operand when either is NaN, so a
   NaN is skipped as the scalar compare skips it. */
void attn_softmax_stats_avx512(const float *l, int n, float inv_t, float *m, float *s)
{
    __m512 mx = _mm512_set1_ps(-INFINITY);
    int j = 0;
    for (; j + 16 <= n; j += 16)
        mx = _mm512_max_ps(_mm512_loadu_ps(l + j), mx);
    const __mmask16 tail = (__mmask16)((1u << (n - j)) - 1);
    if (j < n)
        mx = _mm512_mask_max_ps(mx, tail, _mm512_maskz_loadu_ps(tail, l + j), mx);
    const float mf = _mm512_reduce_max_ps(mx) + 0.0f;
    const __m512 vm = _mm512_set1_ps(mf), vt = _mm512_set1_ps(inv_t);
    __m512 acc = _mm512_setzero_ps();
    for (j = 0; j + 16 <= n; j += 16)
        acc = _mm512_add_ps(acc, exp16(_mm512_mul_ps(_mm512_sub_ps(_mm512_loadu_ps(l + j), vm), vt)));
    if (j < n)
        acc = _mm512_mask_add_ps(acc, tail, acc,
                                 exp16(_mm512_mul_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(tail, l + j), vm), vt)));
    *m = mf;
    *s = fold16(acc);
}

/* attn_silu_mul1 on 16 lanes, the tail masked. */
void attn_silu_mul_avx512(const float *gate, const float *up, float *out, int64_t n)
{
    const __m512i sign = _mm512_set1_epi32((int)0x80000000u);
    const __m512 one = _mm512_set1_ps(1.0f);
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 m = n - i >= 16 ? 0xffff : (__mmask16)((1u << (n - i)) - 1);
        const __m512 g = _mm512_maskz_loadu_ps(m, gate + i), u = _mm512_maskz_loadu_ps(m, up + i);
        const __m512 e = exp16(_mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(g), sign)));
        const __mmask16 neg = _mm512_cmp_ps_mask(g, _mm512_setzero_ps(), _CMP_LT_OQ);
        const __m512 num = _mm512_mask_mul_ps(g, neg, g, e);
        _mm512_mask_storeu_ps(out + i, m, _mm512_mul_ps(_mm512_div_ps(num, _mm512_add_ps(one, e)), u));
    }
}
