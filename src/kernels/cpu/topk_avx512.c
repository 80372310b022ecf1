/*
 * topk_avx512 - the k largest of a logits slice with AVX-512 (gemm_ops.top_k, gemm.h).
 *
 * The kept values live sorted, best first, in four zmm registers (64 lanes, their
 * positions in four more), not in a heap: a value enters when it beats the k-th kept (the
 * threshold), at the place given by how many kept values are at least as large (an equal
 * one came earlier, so it ranks first), and the registers shift one lane past that place
 * (valignd with the register before) and take it in with two blends. No data-dependent
 * branch but "does this vector hold a value above the threshold", where the heap's
 * sift-downs mispredicted about half their compares. Per slice of 2,000 random-weight
 * logits (llama-110m, `weld generate`, 2 threads, Zen 5) the heap took 32,000-43,000 TSC
 * cycles next to the product's ~97,000, this 19,900; per 256 (stories260K) 15,000-24,000
 * against 12,700. Alone in a loop over varied rows: 4,900 (256) and 10,800 (2,048).
 * `weld generate -n 300` on llama-110m Q8_0 (sampling): 5 of 5 alternations faster,
 * median 1.02x.
 *
 * Semantics are exactly logits_top_scan's heap (exec/logits_top.c, the reference the
 * tests hold it to): the first k non-NaN values enter whatever they are (-inf too), then
 * only those above the threshold; ties rank by position; NaN never enters and is counted.
 */
#include "kernels/cpu/gemm.h"

#include <immintrin.h>
#include <math.h>
#include <string.h>

int kern_top_k_avx512(const float *l, int n, int k, float *vals, int32_t *pos, int *n_nan)
{
    const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    __m512 V[4];
    __m512i P[4];
    for (int q = 0; q < 4; q++) {
        V[q] = _mm512_setzero_ps();
        P[q] = _mm512_setzero_si512();
    }
    int c = 0, nn = 0;
    float thr = -INFINITY; /* the k-th kept value once c == k */
    for (int j = 0; j < n; j += 16) {
        const __mmask16 live = n - j >= 16 ? 0xffff : (__mmask16)((1u << (n - j)) - 1);
        const __m512 x = n - j >= 16 ? _mm512_loadu_ps(l + j) : _mm512_maskz_loadu_ps(live, l + j);
        const __mmask16 ord = _mm512_mask_cmp_ps_mask(live, x, x, _CMP_ORD_Q);
        nn += __builtin_popcount((unsigned)(live & ~ord));
        unsigned m = c < k ? ord : _mm512_mask_cmp_ps_mask(ord, x, _mm512_set1_ps(thr), _CMP_GT_OQ);
        while (m) {
            const int b = __builtin_ctz(m);
            m &= m - 1;
            const float v = l[j + b];
            if (c == k && !(v > thr))
                continue; /* the threshold rose within this vector */
            const __m512 vv = _mm512_set1_ps(v);
            int p = 0; /* kept values >= v: the new one's place */
            for (int q = 0; q < 4; q++) {
                const int f = c - 16 * q; /* filled lanes of register q */
                const __mmask16 filled = f >= 16 ? 0xffff : f <= 0 ? 0 : (__mmask16)((1u << f) - 1);
                p += __builtin_popcount(_mm512_mask_cmp_ps_mask(filled, V[q], vv, _CMP_GE_OQ));
            }
            const __m512i pp = _mm512_set1_epi32(p), pv = _mm512_set1_epi32(j + b);
            for (int q = 3; q >= 0; q--) {
                const __m512i at = _mm512_add_epi32(iota, _mm512_set1_epi32(16 * q));
                const __mmask16 after = _mm512_cmpgt_epi32_mask(at, pp);
                const __mmask16 here = _mm512_cmpeq_epi32_mask(at, pp);
                const __m512i vi = _mm512_castps_si512(V[q]);
                const __m512i prev_v = q ? _mm512_castps_si512(V[q - 1]) : vi;
                const __m512i prev_p = q ? P[q - 1] : P[q];
                /* lane i <- lane i - 1 (lane 0 <- the previous register's lane 15) */
                const __m512i sv = _mm512_alignr_epi32(vi, prev_v, 15);
                const __m512i sp = _mm512_alignr_epi32(P[q], prev_p, 15);
                V[q] = _mm512_mask_mov_ps(_mm512_mask_mov_ps(V[q], after, _mm512_castsi512_ps(sv)),
                                          here, vv);
                P[q] = _mm512_mask_mov_epi32(_mm512_mask_mov_epi32(P[q], after, sp), here, pv);
            }
            if (c < k)
                c++;
            if (c == k) {
                const __m512 t = _mm512_permutexvar_ps(_mm512_set1_epi32((k - 1) % 16),
                                                       V[(k - 1) / 16]);
                thr = _mm512_cvtss_f32(t);
            }
        }
    }
    float vbuf[64];
    int32_t pbuf[64];
    for (int q = 0; q < 4; q++) {
        _mm512_storeu_ps(vbuf + 16 * q, V[q]);
        _mm512_storeu_si512((void *)(pbuf + 16 * q), P[q]);
    }
    memcpy(vals, vbuf, (size_t)c * sizeof *vals);
    memcpy(pos, pbuf, (size_t)c * sizeof *pos);
    *n_nan = nn;
    return c;
}
