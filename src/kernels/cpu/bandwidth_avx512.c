/*
 * bandwidth_avx512 - the probe's read loop (see bandwidth.h): BW_STREAMS streams, two
 * 64-byte aligned loads per stream per step, folded into independent XOR accumulators so
 * the loads never wait on each other.
 */
#include "kernels/cpu/bandwidth.h"

#include <immintrin.h>

uint64_t bw_read_avx512(const void *p, size_t n)
{
    const size_t per = n / BW_STREAMS;
    const uint8_t *s[BW_STREAMS];
    for (int i = 0; i < BW_STREAMS; i++)
        s[i] = (const uint8_t *)p + (size_t)i * per;
    __m512i a[2 * BW_STREAMS];
    for (int i = 0; i < 2 * BW_STREAMS; i++)
        a[i] = _mm512_setzero_si512();
    for (size_t off = 0; off + 128 <= per; off += 128)
        for (int i = 0; i < BW_STREAMS; i++) {
            a[2 * i] = _mm512_xor_si512(a[2 * i], _mm512_load_si512(s[i] + off));
            a[2 * i + 1] = _mm512_xor_si512(a[2 * i + 1], _mm512_load_si512(s[i] + off + 64));
        }
    __m512i x = a[0];
    for (int i = 1; i < 2 * BW_STREAMS; i++)
        x = _mm512_xor_si512(x, a[i]);
    uint64_t v[8];
    _mm512_storeu_si512(v, x);
    return v[0] ^ v[1] ^ v[2] ^ v[3] ^ v[4] ^ v[5] ^ v[6] ^ v[7];
}
