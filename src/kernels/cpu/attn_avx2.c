/*
 * attn_avx2 - attn.h's chunk step with AVX2 + FMA + F16C, bit-identical to
 * attn_chunk_scalar.
 *
 * The contract's 16 dot lanes live in two ymm per position (lanes 0-7 and 8-15), filled
 * with fmadd in increasing element order. Four positions run side by side (eight
 * independent FMA chains hide the FMA latency, and each query vector is loaded once for
 * the four); the fold's first step (w = 8: lane i += lane i + 8) is then one add per
 * position, and the rest (w = 4, 2, 1) is a transposed tree over eight positions at a
 * time (perm2f128 / shuffle adds that apply the same lane pairing to every position at
 * once), leaving eight scores in one ymm; a permute puts position j in lane j. The
 * softmax runs on two ymm with attn.h's exp polynomial lane by lane, and the value rows
 * are accumulated with broadcast fmadds in position order. Any hd: a partial last
 * vector goes through zero-padded copies, and the dot lanes it does not cover are kept
 * as they were (blend), as the contract's unused lanes stay untouched. (The executor widens a
 * chunk that several rows share to f32 once before the call, exec/ops.c attn_rows.)
 */
#include "kernels/cpu/attn.h"

#include <immintrin.h>
#include <math.h>
#include <string.h>

#define AI static inline __attribute__((always_inline))
/* Loops over register arrays are unrolled so the arrays stay in registers (GCC keeps a
   rolled loop's array in memory). */
#define UNROLL4 _Pragma("GCC unroll 4")
#define UNROLL8 _Pragma("GCC unroll 8")

/* The contract's exp on 8 lanes (attn_exp, lane for lane). */
AI __m256 exp8(__m256 x)
{
    const __m256 ok = _mm256_cmp_ps(x, _mm256_set1_ps(ATTN_EXP_MIN), _CMP_GE_OQ);
    __m256 k = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(ATTN_LOG2E)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 nk = _mm256_sub_ps(_mm256_setzero_ps(), k);
    __m256 r = _mm256_fmadd_ps(nk, _mm256_set1_ps(ATTN_LN2_HI), x);
    r = _mm256_fmadd_ps(nk, _mm256_set1_ps(ATTN_LN2_LO), r);
    __m256 p = _mm256_fmadd_ps(_mm256_set1_ps(ATTN_P6), r, _mm256_set1_ps(ATTN_P5));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(ATTN_P4));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(ATTN_P3));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(ATTN_P2));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    /* k is integral and in [-124, 0] wherever ok; elsewhere the lane is zeroed below. */
    __m256i kb = _mm256_slli_epi32(_mm256_cvtps_epi32(k), 23);
    p = _mm256_castsi256_ps(_mm256_add_epi32(_mm256_castps_si256(p), kb));
    return _mm256_and_ps(ok, p);
}

/* The fold's steps w = 4, 2, 1 of eight positions' 8-lane vectors a[0..7] at once.
   Returns the eight sums, position j in lane j. */
AI __m256 fold8x8(const __m256 a[8])
{
    __m256 b[4], c[2];
    for (int k = 0; k < 4; k++) /* w = 4: lanes 0-3 + lanes 4-7; pos 2k low, 2k+1 high */
        b[k] = _mm256_add_ps(_mm256_permute2f128_ps(a[2 * k], a[2 * k + 1], 0x20),
                             _mm256_permute2f128_ps(a[2 * k], a[2 * k + 1], 0x31));
    for (int k = 0; k < 2; k++) /* w = 2: elements 0, 1 + elements 2, 3 of each half */
        c[k] = _mm256_add_ps(_mm256_shuffle_ps(b[2 * k], b[2 * k + 1], 0x44),
                             _mm256_shuffle_ps(b[2 * k], b[2 * k + 1], 0xEE));
    /* w = 1: element 0 + element 1 */
    __m256 f = _mm256_add_ps(_mm256_shuffle_ps(c[0], c[1], 0x88),
                             _mm256_shuffle_ps(c[0], c[1], 0xDD));
    /* Lane 4h + e of f (half h, element e) holds position 2e + h. */
    return _mm256_permutevar8x32_ps(f, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

/* The contract's fold of 16 lanes held as lo (0-7) and hi (8-15). */
AI float fold16(__m256 lo, __m256 hi)
{
    __m256 a8 = _mm256_add_ps(lo, hi);
    __m128 a4 = _mm_add_ps(_mm256_castps256_ps128(a8), _mm256_extractf128_ps(a8, 1));
    __m128 a2 = _mm_add_ps(a4, _mm_movehl_ps(a4, a4));
    return _mm_cvtss_f32(_mm_add_ss(a2, _mm_shuffle_ps(a2, a2, 1)));
}

/* Elements [i, i + 8) of a row of type t widened to f32 (exact). */
AI __m256 load8(const int t, const uint8_t *row, int i)
{
    if (t == DT_F32)
        return _mm256_loadu_ps((const float *)(const void *)(row + 4 * (size_t)i));
    __m128i h = _mm_loadu_si128((const __m128i *)(row + 2 * (size_t)i));
    return t == DT_F16 ? _mm256_cvtph_ps(h)
                       : _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* Element i of a row of type t widened to f32 (exact). */
AI float elem(const int t, const uint8_t *row, int i)
{
    float f;
    if (t == DT_F32) {
        memcpy(&f, row + 4 * (size_t)i, sizeof f);
        return f;
    }
    uint16_t h;
    memcpy(&h, row + 2 * (size_t)i, sizeof h);
    if (t == DT_F16)
        return _cvtsh_ss(h);
    const uint32_t b = (uint32_t)h << 16;
    memcpy(&f, &b, sizeof f);
    return f;
}

/* Elements [i, i + n) (n < 16) of a row as a zero-padded 16-element copy in buf (the row
   type's element size), so load8 can read it whole. */
AI const uint8_t *pad16(const int t, const uint8_t *row, int i, int n, uint8_t *buf)
{
    const size_t es = t == DT_F32 ? 4 : 2;
    memset(buf, 0, 16 * es);
    memcpy(buf, row + es * (size_t)i, es * (size_t)n);
    return buf;
}

struct dot_args {
    const float *q, *qt;      /* the query row; its zero-padded tail (tail > 0) */
    const uint8_t *const *k;  /* the group's key rows */
    int h16, tail;
    __m256 mlo, mhi;          /* lanes of the tail vector that take part */
};

/* The dots of nj (1..4) positions with the query, each as its 16 contract lanes after the
   fold's first step (lo + hi), into s8[0 .. nj). */
AI void dot_group(const struct dot_args *d, const int t, const int nj, __m256 *s8)
{
    __m256 lo[4], hi[4];
    UNROLL4
    for (int u = 0; u < nj; u++)
        lo[u] = hi[u] = _mm256_setzero_ps();
    for (int i = 0; i < d->h16; i += 16) {
        const __m256 q0 = _mm256_loadu_ps(d->q + i), q1 = _mm256_loadu_ps(d->q + i + 8);
        UNROLL4
        for (int u = 0; u < nj; u++) {
            lo[u] = _mm256_fmadd_ps(q0, load8(t, d->k[u], i), lo[u]);
            hi[u] = _mm256_fmadd_ps(q1, load8(t, d->k[u], i + 8), hi[u]);
        }
    }
    if (d->tail) {
        const __m256 q0 = _mm256_loadu_ps(d->qt), q1 = _mm256_loadu_ps(d->qt + 8);
        UNROLL4
        for (int u = 0; u < nj; u++) {
            uint8_t buf[64];
            const uint8_t *kr = pad16(t, d->k[u], d->h16, d->tail, buf);
            lo[u] = _mm256_blendv_ps(lo[u], _mm256_fmadd_ps(q0, load8(t, kr, 0), lo[u]), d->mlo);
            hi[u] = _mm256_blendv_ps(hi[u], _mm256_fmadd_ps(q1, load8(t, kr, 8), hi[u]), d->mhi);
        }
    }
    UNROLL4
    for (int u = 0; u < nj; u++)
        s8[u] = _mm256_add_ps(lo[u], hi[u]);
}

/* One query row against the chunk. */
AI void row_typed(const struct attn_chunk_args *a, const int t, const int r)
{
    const int hd = a->hd, n = a->n[r], h16 = hd / 16 * 16, tail = hd - h16;
    const float *q = a->q[r];
    /* tail lanes: lanes [0, tail) of the 16 take part; the others keep their zeros */
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256 mlo = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(tail), lane));
    const __m256 mhi = _mm256_castsi256_ps(
        _mm256_cmpgt_epi32(_mm256_set1_epi32(tail - 8), lane));
    float qt[16];
    if (tail) {
        memset(qt, 0, sizeof qt);
        memcpy(qt, q + h16, sizeof(float) * (size_t)tail);
    }
    __m256 s8[ATTN_CHUNK]; /* each position's 16 lanes after the fold's first step */
    for (int j0 = 0; j0 < n; j0 += 4) {
        const int nj = n - j0 < 4 ? n - j0 : 4;
        const struct dot_args d = {.q = q, .qt = qt, .k = a->k + j0, .h16 = h16, .tail = tail,
                                   .mlo = mlo, .mhi = mhi};
        switch (nj) { /* a constant count keeps the accumulators in registers */
        case 1: dot_group(&d, t, 1, s8 + j0); break;
        case 2: dot_group(&d, t, 2, s8 + j0); break;
        case 3: dot_group(&d, t, 3, s8 + j0); break;
        default: dot_group(&d, t, 4, s8 + j0); break;
        }
    }
    for (int j = n; j < ATTN_CHUNK; j++)
        s8[j] = _mm256_setzero_ps();
    const __m256 sc = _mm256_set1_ps(a->scale), ninf = _mm256_set1_ps(-INFINITY);
    __m256 s0 = _mm256_mul_ps(fold8x8(s8), sc), s1 = _mm256_mul_ps(fold8x8(s8 + 8), sc);
    /* positions past n: -inf (their p is 0 and they never set the max) */
    s0 = _mm256_blendv_ps(ninf, s0, _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(n), lane)));
    s1 = _mm256_blendv_ps(ninf, s1, _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(n - 8), lane)));
    __m256 mx = _mm256_max_ps(s0, s1);
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    const float cm = _mm_cvtss_f32(m4);
    const float m = a->m[r], mn = attn_fmax(m, cm);
    const float corr = attn_exp(m - mn);
    const __m256 vmn = _mm256_set1_ps(mn);
    const __m256 p0 = exp8(_mm256_sub_ps(s0, vmn)), p1 = exp8(_mm256_sub_ps(s1, vmn));
    a->l[r] = a->l[r] * corr + fold16(p0, p1);
    a->m[r] = mn;
    float pj[ATTN_CHUNK];
    _mm256_storeu_ps(pj, p0);
    _mm256_storeu_ps(pj + 8, p1);
    float *acc = a->acc + (size_t)r * hd;
    const __m256 vc = _mm256_set1_ps(corr);
    int i = 0;
    for (; i + 64 <= hd; i += 64) { /* eight FMA chains: the latency stays hidden */
        __m256 x[8];
        UNROLL8
        for (int e = 0; e < 8; e++)
            x[e] = _mm256_mul_ps(_mm256_loadu_ps(acc + i + 8 * e), vc);
        for (int j = 0; j < n; j++) { /* the contract stops at n (0 * inf is NaN) */
            const __m256 p = _mm256_set1_ps(pj[j]);
            UNROLL8
            for (int e = 0; e < 8; e++)
                x[e] = _mm256_fmadd_ps(p, load8(t, a->v[j], i + 8 * e), x[e]);
        }
        UNROLL8
        for (int e = 0; e < 8; e++)
            _mm256_storeu_ps(acc + i + 8 * e, x[e]);
    }
    for (; i + 16 <= hd; i += 16) {
        __m256 x0 = _mm256_mul_ps(_mm256_loadu_ps(acc + i), vc);
        __m256 x1 = _mm256_mul_ps(_mm256_loadu_ps(acc + i + 8), vc);
        for (int j = 0; j < n; j++) { /* the contract stops at n (0 * inf is NaN) */
            const __m256 p = _mm256_set1_ps(pj[j]);
            x0 = _mm256_fmadd_ps(p, load8(t, a->v[j], i), x0);
            x1 = _mm256_fmadd_ps(p, load8(t, a->v[j], i + 8), x1);
        }
        _mm256_storeu_ps(acc + i, x0);
        _mm256_storeu_ps(acc + i + 8, x1);
    }
    for (; i + 8 <= hd; i += 8) {
        __m256 x0 = _mm256_mul_ps(_mm256_loadu_ps(acc + i), vc);
        for (int j = 0; j < n; j++)
            x0 = _mm256_fmadd_ps(_mm256_set1_ps(pj[j]), load8(t, a->v[j], i), x0);
        _mm256_storeu_ps(acc + i, x0);
    }
    for (; i < hd; i++) {
        float x = acc[i] * corr;
        for (int j = 0; j < n; j++)
            x = fmaf(pj[j], elem(t, a->v[j], i), x);
        acc[i] = x;
    }
}

AI void chunk_typed(const struct attn_chunk_args *a, const int t)
{
    for (int r = 0; r < a->nq; r++)
        if (a->n[r] > 0)
            row_typed(a, t, r);
}

void attn_chunk_avx2(const struct attn_chunk_args *a)
{
    if (a->kv_type == DT_F16)
        chunk_typed(a, DT_F16);
    else if (a->kv_type == DT_BF16)
        chunk_typed(a, DT_BF16);
    else
        chunk_typed(a, DT_F32);
}

/* attn.h's softmax statistics: the contract's 16 lanes are two ymm (lanes 0-7, 8-15); a
   partial last 16 goes through a copy padded with -inf (max) whose exp lanes are 0.
   _mm256_max_ps returns its second operand when either is NaN, so the new value goes
   first and a NaN is skipped as the scalar compare skips it. */
void attn_softmax_stats_avx2(const float *l, int n, float inv_t, float *m, float *s)
{
    float pad[16];
    const int full = n / 16 * 16;
    for (int i = 0; i < 16; i++)
        pad[i] = full + i < n ? l[full + i] : -INFINITY;
    __m256 m0 = _mm256_set1_ps(-INFINITY), m1 = m0;
    for (int j = 0; j < full; j += 16) {
        m0 = _mm256_max_ps(_mm256_loadu_ps(l + j), m0);
        m1 = _mm256_max_ps(_mm256_loadu_ps(l + j + 8), m1);
    }
    if (full < n) {
        m0 = _mm256_max_ps(_mm256_loadu_ps(pad), m0);
        m1 = _mm256_max_ps(_mm256_loadu_ps(pad + 8), m1);
    }
    float lanes[16];
    _mm256_storeu_ps(lanes, _mm256_max_ps(m0, m1));
    float mf = -INFINITY;
    for (int i = 0; i < 8; i++)
        if (lanes[i] > mf)
            mf = lanes[i];
    mf += 0.0f;
    const __m256 vm = _mm256_set1_ps(mf), vt = _mm256_set1_ps(inv_t);
    __m256 a0 = _mm256_setzero_ps(), a1 = a0;
    for (int j = 0; j < full; j += 16) {
        a0 = _mm256_add_ps(a0, exp8(_mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(l + j), vm), vt)));
        a1 = _mm256_add_ps(a1, exp8(_mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(l + j + 8), vm), vt)));
    }
    if (full < n) {
        a0 = _mm256_add_ps(a0, exp8(_mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(pad), vm), vt)));
        a1 = _mm256_add_ps(a1, exp8(_mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(pad + 8), vm), vt)));
    }
    /* fold: w = 8 is lane i of a0 + lane i of a1, then w = 4, 2, 1 within the 8 */
    _mm256_storeu_ps(lanes, _mm256_add_ps(a0, a1));
    for (int w = 4; w >= 1; w /= 2)
        for (int i = 0; i < w; i++)
            lanes[i] += lanes[i + w];
    *m = mf;
    *s = lanes[0];
}

/* attn_silu_mul1 on 8 lanes; the tail goes through the scalar function itself. */
void attn_silu_mul_avx2(const float *gate, const float *up, float *out, int64_t n)
{
    const __m256 sign = _mm256_set1_ps(-0.0f), one = _mm256_set1_ps(1.0f);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 g = _mm256_loadu_ps(gate + i), u = _mm256_loadu_ps(up + i);
        const __m256 e = exp8(_mm256_or_ps(g, sign)); /* -|g| */
        const __m256 neg = _mm256_cmp_ps(g, _mm256_setzero_ps(), _CMP_LT_OQ);
        const __m256 num = _mm256_blendv_ps(g, _mm256_mul_ps(g, e), neg);
        _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_div_ps(num, _mm256_add_ps(one, e)), u));
    }
    for (; i < n; i++)
        out[i] = attn_silu_mul1(gate[i], up[i]);
}
