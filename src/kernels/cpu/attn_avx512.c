/*
 * attn_avx512 - attn.h's chunk step with AVX-512F, bit-identical to attn_chunk_scalar.
 *
 * Scores: one zmm accumulator per position (element i in lane i % 16, fmadd in increasing
 * i, exactly the contract's lanes), then the 16 accumulators are folded together in a
 * transposed tree (8 + 4 + 2 + 1 vector adds, each adding lane i + w to lane i of every
 * position at once), which leaves the 16 scores in one register; a final permute puts
 * position j in lane j. The softmax runs on that register with attn.h's exp polynomial
 * lane by lane (same fmaf steps, same rounding), and the value rows are accumulated with
 * broadcast fmadds. Any hd: a partial last vector is masked (the dot's missing lanes are
 * kept untouched, as the contract's unused lanes stay +0).
 */
#include "kernels/cpu/attn.h"

#include <immintrin.h>
#include <math.h>

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

/* Lanes i + w added to lanes i of pairs of registers, the transposed fold: see the file
   comment. Returns the 16 folded values, position j in lane j. */
static inline __m512 fold16x16(__m512 d[16])
{
    __m512 w1[8], w2[4], w3[2];
    for (int k = 0; k < 8; k++) /* w = 8: low halves + high halves of positions 2k, 2k+1 */
        w1[k] = _mm512_add_ps(_mm512_shuffle_f32x4(d[2 * k], d[2 * k + 1], 0x44),
                              _mm512_shuffle_f32x4(d[2 * k], d[2 * k + 1], 0xEE));
    for (int k = 0; k < 4; k++) /* w = 4: quarters 0, 2 + quarters 1, 3 */
        w2[k] = _mm512_add_ps(_mm512_shuffle_f32x4(w1[2 * k], w1[2 * k + 1], 0x88),
                              _mm512_shuffle_f32x4(w1[2 * k], w1[2 * k + 1], 0xDD));
    for (int k = 0; k < 2; k++) /* w = 2: elements 0, 1 + elements 2, 3 of each quarter */
        w3[k] = _mm512_add_ps(_mm512_shuffle_ps(w2[2 * k], w2[2 * k + 1], 0x44),
                              _mm512_shuffle_ps(w2[2 * k], w2[2 * k + 1], 0xEE));
    /* w = 1: element 0 + element 1 */
    __m512 f = _mm512_add_ps(_mm512_shuffle_ps(w3[0], w3[1], 0x88),
                             _mm512_shuffle_ps(w3[0], w3[1], 0xDD));
    /* Lane 4q + k now holds position q + 4k; position p comes from lane 4 (p % 4) + p / 4. */
    const __m512i idx = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    return _mm512_permutexvar_ps(idx, f);
}

/* The contract's fold of one register's 16 lanes (w = 8, 4, 2, 1). */
static inline float fold16(__m512 v)
{
    __m256 a8 = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
    __m128 a4 = _mm_add_ps(_mm256_castps256_ps128(a8), _mm256_extractf128_ps(a8, 1));
    __m128 a2 = _mm_add_ps(a4, _mm_movehl_ps(a4, a4));
    return _mm_cvtss_f32(_mm_add_ss(a2, _mm_shuffle_ps(a2, a2, 1)));
}

/* The elements [i, i + 16) of a row of type t that mask m selects, widened to f32 (exact;
   the others 0). */
static inline __m512 load16(int t, const uint8_t *row, int i, __mmask16 m)
{
    if (t == DT_F32)
        return _mm512_maskz_loadu_ps(m, row + 4 * (size_t)i);
    __m256i h = _mm256_maskz_loadu_epi16(m, row + 2 * (size_t)i);
    return t == DT_F16 ? _mm512_cvtph_ps(h)
                       : _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

#define AI static inline __attribute__((always_inline))

/* R query rows (R = 1 or 2) of one call against the chunk, interleaved: both rows' chains
   (dots, folds, exps, the value accumulation) are independent, so running them side by
   side hides the latency one row alone leaves exposed, and each key and value vector is
   loaded once for both. Every row's arithmetic is exactly the single-row contract. */
AI void rows_typed(const struct attn_chunk_args *a, const int t, const int r0, const int R)
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
    for (int j = 0; j < n_max; j++)
        for (int v = 0; v < nv; v++) {
            const __mmask16 m = v == nv - 1 ? tail : (__mmask16)0xffff;
            const __m512 k = load16(t, a->k[j], 16 * v, m);
            for (int i = 0; i < R; i++)
                d[i][j] = _mm512_mask3_fmadd_ps(_mm512_maskz_loadu_ps(m, q[i] + 16 * v), k,
                                                d[i][j], m);
        }
    float pj[2][ATTN_CHUNK], corr[2];
    for (int i = 0; i < R; i++) {
        const __mmask16 valid = (__mmask16)((1u << n[i]) - 1u);
        __m512 s = _mm512_mul_ps(fold16x16(d[i]), _mm512_set1_ps(a->scale));
        s = _mm512_mask_mov_ps(_mm512_set1_ps(-INFINITY), valid, s);
        const float cm = _mm512_reduce_max_ps(s);
        const float m = a->m[r0 + i], mn = fmaxf(m, cm);
        corr[i] = attn_exp(m - mn);
        const __m512 p = exp16(_mm512_sub_ps(s, _mm512_set1_ps(mn)));
        a->l[r0 + i] = a->l[r0 + i] * corr[i] + fold16(p);
        a->m[r0 + i] = mn;
        _mm512_storeu_ps(pj[i], p);
    }
    for (int v = 0; v < nv; v++) {
        const __mmask16 m = v == nv - 1 ? tail : (__mmask16)0xffff;
        __m512 x[2];
        for (int i = 0; i < R; i++)
            x[i] = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, a->acc + (size_t)(r0 + i) * hd + 16 * v),
                                 _mm512_set1_ps(corr[i]));
        for (int j = 0; j < n_max; j++) {
            const __m512 vv = load16(t, a->v[j], 16 * v, m);
            for (int i = 0; i < R; i++)
                if (j < n[i]) /* the contract stops at the row's count (0 * inf is NaN) */
                    x[i] = _mm512_fmadd_ps(_mm512_set1_ps(pj[i][j]), vv, x[i]);
        }
        for (int i = 0; i < R; i++)
            _mm512_mask_storeu_ps(a->acc + (size_t)(r0 + i) * hd + 16 * v, m, x[i]);
    }
}

/* The chunk for one KV type: t is a constant in each caller, so the widening folds away.
   Rows with nothing visible are skipped; the rest go two at a time. */
AI void chunk_typed(const struct attn_chunk_args *a, const int t)
{
    int live[2], k = 0;
    for (int r = 0; r < a->nq; r++) {
        if (a->n[r] <= 0)
            continue;
        live[k++] = r;
        if (k == 2) {
            if (live[1] == live[0] + 1) {
                rows_typed(a, t, live[0], 2);
            } else {
                rows_typed(a, t, live[0], 1);
                rows_typed(a, t, live[1], 1);
            }
            k = 0;
        }
    }
    if (k)
        rows_typed(a, t, live[0], 1);
}

void attn_chunk_avx512(const struct attn_chunk_args *a)
{
    if (a->kv_type == DT_F16)
        chunk_typed(a, DT_F16);
    else if (a->kv_type == DT_BF16)
        chunk_typed(a, DT_BF16);
    else
        chunk_typed(a, DT_F32);
}
