/*
 * peak_avx512 - the compute probe's 512-bit loops (see peak.h): PEAK_ACC accumulators, one
 * instruction each per round, operands in registers. Accumulator i of every lane starts at
 * i and grows by 2^-20 per product (int8: by -60 per round), so a count of rounds that
 * keeps it below 16 leaves it exact: the tests check the returned sums.
 */
#include "kernels/cpu/peak.h"

#include <immintrin.h>

/* Sixteen named accumulators (an array would be kept in memory and stored every round). */
#define PEAK_DECL(T, INIT)                                                                         \
    T a0 = INIT(0), a1 = INIT(1), a2 = INIT(2), a3 = INIT(3), a4 = INIT(4), a5 = INIT(5),          \
      a6 = INIT(6), a7 = INIT(7), a8 = INIT(8), a9 = INIT(9), a10 = INIT(10), a11 = INIT(11),      \
      a12 = INIT(12), a13 = INIT(13), a14 = INIT(14), a15 = INIT(15)
#define PEAK_ROUND(STEP)                                                                           \
    do {                                                                                           \
        STEP(a0);                                                                                  \
        STEP(a1);                                                                                  \
        STEP(a2);                                                                                  \
        STEP(a3);                                                                                  \
        STEP(a4);                                                                                  \
        STEP(a5);                                                                                  \
        STEP(a6);                                                                                  \
        STEP(a7);                                                                                  \
        STEP(a8);                                                                                  \
        STEP(a9);                                                                                  \
        STEP(a10);                                                                                 \
        STEP(a11);                                                                                 \
        STEP(a12);                                                                                 \
        STEP(a13);                                                                                 \
        STEP(a14);                                                                                 \
        STEP(a15);                                                                                 \
    } while (0)
#define PEAK_FOLD(OP)                                                                              \
    OP(OP(OP(OP(a0, a1), OP(a2, a3)), OP(OP(a4, a5), OP(a6, a7))),                                 \
       OP(OP(OP(a8, a9), OP(a10, a11)), OP(OP(a12, a13), OP(a14, a15))))

#define PS_INIT(i) _mm512_set1_ps((float)(i))
#define EPI_INIT(i) _mm512_set1_epi32(i)

double peak_loop_avx512(enum peak_op op, uint64_t iters)
{
    if (op == PEAK_BF16_DOT) {
        PEAK_DECL(__m512, PS_INIT);
        const __m512bh x = (__m512bh)_mm512_set1_epi16(0x3a80); /* 2^-10 */
#define STEP_BF16(a) a = _mm512_dpbf16_ps(a, x, x)
        for (uint64_t n = 0; n < iters; n++)
            PEAK_ROUND(STEP_BF16);
        return (double)_mm512_reduce_add_ps(PEAK_FOLD(_mm512_add_ps));
    }
    if (op == PEAK_F32_FMA) {
        PEAK_DECL(__m512, PS_INIT);
        const __m512 x = _mm512_set1_ps(1.0f), y = _mm512_set1_ps(0x1p-20f);
#define STEP_FMA(a) a = _mm512_fmadd_ps(x, y, a)
        for (uint64_t n = 0; n < iters; n++)
            PEAK_ROUND(STEP_FMA);
        return (double)_mm512_reduce_add_ps(PEAK_FOLD(_mm512_add_ps));
    }
    if (op == PEAK_I8_DOT) {
        PEAK_DECL(__m512i, EPI_INIT);
        const __m512i x = _mm512_set1_epi8(3), y = _mm512_set1_epi8(-5);
#define STEP_I8(a) a = _mm512_dpbusd_epi32(a, x, y)
        for (uint64_t n = 0; n < iters; n++)
            PEAK_ROUND(STEP_I8);
        return (double)_mm512_reduce_add_epi32(PEAK_FOLD(_mm512_xor_si512));
    }
    return 0;
}
