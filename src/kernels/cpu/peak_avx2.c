/*
 * peak_avx2 - the compute probe's 256-bit loop (see peak.h): FMA accumulators and their
 * operands in registers. AVX2 has 16 vector registers, so the loop runs PEAK_ACC_AVX2 (12)
 * chains, not PEAK_ACC: enough to cover the FMA latency of two ports (4 cycles x 2).
 */
#include "kernels/cpu/peak.h"

#include <immintrin.h>

double peak_loop_avx2(enum peak_op op, uint64_t iters)
{
    if (op != PEAK_F32_FMA)
        return 0;
    /* named chains (an array stays in memory); PEAK_ACC_AVX2 of them + 2 operands */
    __m256 a0 = _mm256_set1_ps(0), a1 = _mm256_set1_ps(1), a2 = _mm256_set1_ps(2),
           a3 = _mm256_set1_ps(3), a4 = _mm256_set1_ps(4), a5 = _mm256_set1_ps(5),
           a6 = _mm256_set1_ps(6), a7 = _mm256_set1_ps(7), a8 = _mm256_set1_ps(8),
           a9 = _mm256_set1_ps(9), a10 = _mm256_set1_ps(10), a11 = _mm256_set1_ps(11);
    const __m256 x = _mm256_set1_ps(1.0f), y = _mm256_set1_ps(0x1p-20f);
#define STEP(a) a = _mm256_fmadd_ps(x, y, a)
    for (uint64_t n = 0; n < iters; n++) {
        STEP(a0);
        STEP(a1);
        STEP(a2);
        STEP(a3);
        STEP(a4);
        STEP(a5);
        STEP(a6);
        STEP(a7);
        STEP(a8);
        STEP(a9);
        STEP(a10);
        STEP(a11);
    }
#undef STEP
    __m256 s = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)),
                             _mm256_add_ps(_mm256_add_ps(a4, a5), _mm256_add_ps(a6, a7)));
    s = _mm256_add_ps(s, _mm256_add_ps(_mm256_add_ps(a8, a9), _mm256_add_ps(a10, a11)));
    float v[8];
    _mm256_storeu_ps(v, s);
    return (double)(v[0] + v[1] + v[2] + v[3] + v[4] + v[5] + v[6] + v[7]);
}
