/*
 * dtype - the tensor type table and the scalar reference (de)quantizers.
 *
 * Table: indexed by the GGUF/ggml type id; entries with a NULL name are ids weld does not
 * know (removed ggml types such as 4 and 5, and the i-quants), so dtype_get() doubles as
 * the validator for type ids read from files.
 *
 * Block layouts (all little-endian, packed, ggml-common.h): blocks are read and written
 * byte by byte here (ld16/st16), never through C structs, so alignment and padding never
 * matter and the code is endian-independent.
 *   q4_0  {f16 d; u8 qs[16]}                 x = (nibble - 8) * d
 *   q4_1  {f16 d, m; u8 qs[16]}              x = nibble * d + m
 *   q5_0  {f16 d; u8 qh[4]; u8 qs[16]}       x = (nibble | bit << 4) - 16) * d
 *   q5_1  {f16 d, m; u8 qh[4]; u8 qs[16]}    x = (nibble | bit << 4) * d + m
 *   q8_0  {f16 d; i8 qs[32]}                 x = q * d
 *   In the 32-blocks, byte j holds element j (low nibble) and element j + 16 (high nibble);
 *   qh bit j is the fifth bit of element j.
 *   q4_K  {f16 d, dmin; u8 scales[12]; u8 qs[128]}: 8 sub-blocks of 32 with 6-bit scale and
 *         min (packed as get_scale_min_k4 below); x = d*sc*q - dmin*m; each 32 bytes of qs
 *         hold 64 elements: low nibbles the first 32, high nibbles the next 32.
 *   q5_K  q4_K plus u8 qh[32]: bit 2k / 2k+1 of qh[l] is the fifth bit of element l of the
 *         sub-blocks 2k / 2k+1.
 *   q6_K  {u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d}: 16 sub-blocks of 16, x = d*sc*(q-32).
 *
 * Quantizers reproduce llama.cpp's quantize_row_*_ref byte for byte, including the order of
 * float operations (this file must not be built with -ffast-math or FP contraction, which
 * the project's C11 mode keeps off). Non-finite inputs give unspecified (but memory-safe,
 * UB-free) blocks. Not here on purpose: SIMD paths (kernels/ has them, tested against these),
 * importance-matrix quantization, and the q2_K/q3_K/q8_K/i-quant codecs.
 */
#include "format/dtype.h"

#include "core/err.h"
#include "core/fp16.h"

#include <ctype.h>
#include <float.h>
#include <math.h>
#include <string.h>

#define QK 32
#define QK_K 256
#define GROUP_MAX_EPS 1e-15f

static const struct dtype_info dtype_table[DT_COUNT] = {
    [DT_F32] = {"f32", 1, 4, false, true, true},
    [DT_F16] = {"f16", 1, 2, false, true, true},
    [DT_Q4_0] = {"q4_0", 32, 18, true, true, true},
    [DT_Q4_1] = {"q4_1", 32, 20, true, true, true},
    [DT_Q5_0] = {"q5_0", 32, 22, true, true, true},
    [DT_Q5_1] = {"q5_1", 32, 24, true, true, true},
    [DT_Q8_0] = {"q8_0", 32, 34, true, true, true},
    [DT_Q8_1] = {"q8_1", 32, 36, true, false, false},
    [DT_Q2_K] = {"q2_K", 256, 84, true, false, false},
    [DT_Q3_K] = {"q3_K", 256, 110, true, false, false},
    [DT_Q4_K] = {"q4_K", 256, 144, true, true, true},
    [DT_Q5_K] = {"q5_K", 256, 176, true, true, true},
    [DT_Q6_K] = {"q6_K", 256, 210, true, true, true},
    [DT_Q8_K] = {"q8_K", 256, 292, true, false, false},
    [DT_I8] = {"i8", 1, 1, false, false, false},
    [DT_I16] = {"i16", 1, 2, false, false, false},
    [DT_I32] = {"i32", 1, 4, false, false, false},
    [DT_I64] = {"i64", 1, 8, false, false, false},
    [DT_F64] = {"f64", 1, 8, false, false, false},
    [DT_BF16] = {"bf16", 1, 2, false, true, true},
};

const struct dtype_info *dtype_get(int t)
{
    if (t < 0 || t >= DT_COUNT || !dtype_table[t].name)
        return NULL;
    return &dtype_table[t];
}

const char *dtype_name(int t)
{
    const struct dtype_info *di = dtype_get(t);
    return di ? di->name : "unknown";
}

int dtype_from_name(const char *name)
{
    if (!name)
        return -1;
    for (int t = 0; t < DT_COUNT; t++) {
        const char *n = dtype_table[t].name;
        if (!n)
            continue;
        size_t i = 0;
        while (n[i] && name[i] && tolower((unsigned char)n[i]) == tolower((unsigned char)name[i]))
            i++;
        if (!n[i] && !name[i])
            return t;
    }
    return -1;
}

size_t dtype_row_bytes(int t, int64_t n)
{
    const struct dtype_info *di = dtype_get(t);
    if (!di || n < 0 || n % di->block_size != 0)
        return 0;
    uint64_t blocks = (uint64_t)(n / di->block_size);
    if (blocks > SIZE_MAX / di->type_size)
        return 0;
    return (size_t)blocks * di->type_size;
}

/* ------------------------------------------------------------------------------------ */
/* helpers                                                                               */

static inline float ld16(const uint8_t *p) { return fp16_to_f32((uint16_t)(p[0] | p[1] << 8)); }

static inline void st16(uint8_t *p, float f)
{
    uint16_t h = fp16_from_f32(f);
    p[0] = (uint8_t)h;
    p[1] = (uint8_t)(h >> 8);
}

/* llama.cpp's nearest_int: round half to even via the 1.5 * 2^23 trick, valid for
   |x| <= 2^22 - 1. Out-of-range and NaN inputs are clamped first so the result is defined. */
static inline int nearest_int(float fval)
{
    if (!(fval >= -4194303.f))
        fval = -4194303.f;
    if (fval > 4194303.f)
        fval = 4194303.f;
    float val = fval + 12582912.f;
    int32_t i;
    memcpy(&i, &val, sizeof i);
    return (i & 0x007fffff) - 0x00400000;
}

/* (int8_t)(v) for v in range; saturates instead of being undefined outside it. */
static inline int trunc_i8(float v)
{
    if (!(v > -129.f))
        return -128;
    if (!(v < 128.f))
        return 127;
    return (int)v;
}

static inline int imin(int a, int b) { return a < b ? a : b; }
static inline int imax(int a, int b) { return a > b ? a : b; }

/* ------------------------------------------------------------------------------------ */
/* dequantize                                                                            */

static void deq_q4_0(const uint8_t *b, float *y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, b += 18, y += QK) {
        const float d = ld16(b);
        for (int j = 0; j < QK / 2; j++) {
            y[j] = ((b[2 + j] & 0x0f) - 8) * d;
            y[j + QK / 2] = ((b[2 + j] >> 4) - 8) * d;
        }
    }
}

static void deq_q4_1(const uint8_t *b, float *y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, b += 20, y += QK) {
        const float d = ld16(b), m = ld16(b + 2);
        for (int j = 0; j < QK / 2; j++) {
            y[j] = (b[4 + j] & 0x0f) * d + m;
            y[j + QK / 2] = (b[4 + j] >> 4) * d + m;
        }
    }
}

static uint32_t ld32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* q5_0 (has_min 0: 22-byte blocks, offset -16) and q5_1 (24-byte blocks, + m). */
static void deq_q5(const uint8_t *b, float *y, int64_t nb, int has_min)
{
    const size_t bs = has_min ? 24 : 22, hoff = has_min ? 4 : 2;
    for (int64_t i = 0; i < nb; i++, b += bs, y += QK) {
        const float d = ld16(b);
        const uint32_t qh = ld32(b + hoff);
        const uint8_t *qs = b + hoff + 4;
        for (int j = 0; j < QK / 2; j++) {
            const int x0 = (qs[j] & 0x0f) | (int)(((qh >> j) << 4) & 0x10);
            const int x1 = (qs[j] >> 4) | (int)((qh >> (j + 12)) & 0x10);
            if (has_min) {
                const float m = ld16(b + 2);
                y[j] = x0 * d + m;
                y[j + QK / 2] = x1 * d + m;
            } else {
                y[j] = (x0 - 16) * d;
                y[j + QK / 2] = (x1 - 16) * d;
            }
        }
    }
}

static void deq_q8_0(const uint8_t *b, float *y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, b += 34, y += QK) {
        const float d = ld16(b);
        for (int j = 0; j < QK; j++)
            y[j] = (int8_t)b[2 + j] * d;
    }
}

/* 6-bit scale and min of sub-block j from the 12 packed bytes of q4_K / q5_K. */
static void scale_min_k4(int j, const uint8_t *q, uint8_t *d, uint8_t *m)
{
    if (j < 4) {
        *d = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *d = (uint8_t)((q[j + 4] & 0xf) | ((q[j - 4] >> 6) << 4));
        *m = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

/* q4_K (qh NULL) and q5_K: per 64 elements, two sub-blocks sharing 32 bytes of qs. */
static void deq_qk45(const uint8_t *b, float *y, int64_t nb, int is_q5)
{
    const size_t bs = is_q5 ? 176 : 144;
    for (int64_t i = 0; i < nb; i++, b += bs) {
        const float d = ld16(b), dmin = ld16(b + 2);
        const uint8_t *scales = b + 4;
        const uint8_t *qh = is_q5 ? b + 16 : NULL;
        const uint8_t *q = b + (is_q5 ? 48 : 16);
        for (int j = 0, is = 0; j < QK_K; j += 64, is += 2, q += 32) {
            uint8_t sc, m;
            scale_min_k4(is, scales, &sc, &m);
            const float d1 = d * sc, m1 = dmin * m;
            scale_min_k4(is + 1, scales, &sc, &m);
            const float d2 = d * sc, m2 = dmin * m;
            const int u1 = 1 << is, u2 = 2 << is;
            for (int l = 0; l < 32; l++)
                *y++ = d1 * ((q[l] & 0xf) + (qh && (qh[l] & u1) ? 16 : 0)) - m1;
            for (int l = 0; l < 32; l++)
                *y++ = d2 * ((q[l] >> 4) + (qh && (qh[l] & u2) ? 16 : 0)) - m2;
        }
    }
}

static void deq_q6_K(const uint8_t *b, float *y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, b += 210) {
        const float d = ld16(b + 208);
        const uint8_t *ql = b, *qh = b + 128;
        const int8_t *sc = (const int8_t *)(b + 192);
        for (int n = 0; n < QK_K; n += 128, y += 128, ql += 64, qh += 32, sc += 8) {
            for (int l = 0; l < 32; l++) {
                const int is = l / 16;
                const int q1 = ((ql[l] & 0xf) | (((qh[l] >> 0) & 3) << 4)) - 32;
                const int q2 = ((ql[l + 32] & 0xf) | (((qh[l] >> 2) & 3) << 4)) - 32;
                const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                y[l] = d * sc[is] * q1;
                y[l + 32] = d * sc[is + 2] * q2;
                y[l + 64] = d * sc[is + 4] * q3;
                y[l + 96] = d * sc[is + 6] * q4;
            }
        }
    }
}

void dtype_dequantize_row(int t, const void *src, float *dst, int64_t n)
{
    const struct dtype_info *di = dtype_get(t);
    WELD_ASSERT(di && di->can_dequantize && n >= 0 && n % di->block_size == 0);
    const uint8_t *s = src;
    const int64_t nb = n / di->block_size;
    switch (t) {
    case DT_F32: memcpy(dst, src, (size_t)n * 4); break;
    case DT_F16:
        for (int64_t i = 0; i < n; i++)
            dst[i] = ld16(s + 2 * i);
        break;
    case DT_BF16:
        for (int64_t i = 0; i < n; i++)
            dst[i] = bf16_to_f32((uint16_t)(s[2 * i] | s[2 * i + 1] << 8));
        break;
    case DT_Q4_0: deq_q4_0(s, dst, nb); break;
    case DT_Q4_1: deq_q4_1(s, dst, nb); break;
    case DT_Q5_0: deq_q5(s, dst, nb, 0); break;
    case DT_Q5_1: deq_q5(s, dst, nb, 1); break;
    case DT_Q8_0: deq_q8_0(s, dst, nb); break;
    case DT_Q4_K: deq_qk45(s, dst, nb, 0); break;
    case DT_Q5_K: deq_qk45(s, dst, nb, 1); break;
    case DT_Q6_K: deq_q6_K(s, dst, nb); break;
    default: WELD_ASSERT(!"unreachable");
    }
}

/* ------------------------------------------------------------------------------------ */
/* quantize (32-element blocks)                                                          */

/* Value of largest magnitude (the first one, on ties) and its magnitude. */
static float signed_absmax(const float *x, int n, float *amax_out)
{
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < n; j++)
        if (amax < fabsf(x[j])) {
            amax = fabsf(x[j]);
            max = x[j];
        }
    *amax_out = amax;
    return max;
}

static void minmax(const float *x, int n, float *mn, float *mx)
{
    float min = FLT_MAX, max = -FLT_MAX;
    for (int j = 0; j < n; j++) {
        if (x[j] < min)
            min = x[j];
        if (x[j] > max)
            max = x[j];
    }
    *mn = min;
    *mx = max;
}

static void q_q4_0(const float *x, uint8_t *b, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, x += QK, b += 18) {
        float amax;
        const float d = signed_absmax(x, QK, &amax) / -8;
        const float id = d ? 1.0f / d : 0.0f;
        st16(b, d);
        for (int j = 0; j < QK / 2; j++) {
            const int x0 = imin(15, trunc_i8(x[j] * id + 8.5f));
            const int x1 = imin(15, trunc_i8(x[j + QK / 2] * id + 8.5f));
            b[2 + j] = (uint8_t)(x0 | x1 << 4);
        }
    }
}

static void q_q4_1(const float *x, uint8_t *b, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, x += QK, b += 20) {
        float min, max;
        minmax(x, QK, &min, &max);
        const float d = (max - min) / 15;
        const float id = d ? 1.0f / d : 0.0f;
        st16(b, d);
        st16(b + 2, min);
        for (int j = 0; j < QK / 2; j++) {
            const int x0 = imin(15, trunc_i8((x[j] - min) * id + 0.5f));
            const int x1 = imin(15, trunc_i8((x[j + QK / 2] - min) * id + 0.5f));
            b[4 + j] = (uint8_t)((x0 & 0xff) | (x1 & 0xff) << 4);
        }
    }
}

static void st32(uint8_t *p, uint32_t v)
{
    for (int k = 0; k < 4; k++)
        p[k] = (uint8_t)(v >> 8 * k);
}

/* (uint8_t)(v) for v in range; defined (saturating) outside it. */
static inline int trunc_u8(float v)
{
    if (!(v > -1.f))
        return 0;
    if (!(v < 256.f))
        return 255;
    return (int)v;
}

static void q_q5_0(const float *x, uint8_t *b, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, x += QK, b += 22) {
        float amax;
        const float d = signed_absmax(x, QK, &amax) / -16;
        const float id = d ? 1.0f / d : 0.0f;
        st16(b, d);
        uint32_t qh = 0;
        for (int j = 0; j < QK / 2; j++) {
            const int x0 = imin(31, trunc_i8(x[j] * id + 16.5f)) & 0xff;
            const int x1 = imin(31, trunc_i8(x[j + QK / 2] * id + 16.5f)) & 0xff;
            b[6 + j] = (uint8_t)((x0 & 0x0f) | (x1 & 0x0f) << 4);
            qh |= (uint32_t)((x0 & 0x10) >> 4) << j;
            qh |= (uint32_t)((x1 & 0x10) >> 4) << (j + QK / 2);
        }
        st32(b + 2, qh);
    }
}

static void q_q5_1(const float *x, uint8_t *b, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, x += QK, b += 24) {
        float min, max;
        minmax(x, QK, &min, &max);
        const float d = (max - min) / 31;
        const float id = d ? 1.0f / d : 0.0f;
        st16(b, d);
        st16(b + 2, min);
        uint32_t qh = 0;
        for (int j = 0; j < QK / 2; j++) {
            const int x0 = trunc_u8((x[j] - min) * id + 0.5f);
            const int x1 = trunc_u8((x[j + QK / 2] - min) * id + 0.5f);
            b[8 + j] = (uint8_t)((x0 & 0x0f) | (x1 & 0x0f) << 4);
            qh |= (uint32_t)((x0 & 0x10) >> 4) << j;
            qh |= (uint32_t)((x1 & 0x10) >> 4) << (j + QK / 2);
        }
        st32(b + 4, qh);
    }
}

static void q_q8_0(const float *x, uint8_t *b, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, x += QK, b += 34) {
        float amax = 0.0f;
        for (int j = 0; j < QK; j++)
            amax = amax > fabsf(x[j]) ? amax : fabsf(x[j]);
        const float d = amax / 127;
        const float id = d ? 1.0f / d : 0.0f;
        st16(b, d);
        for (int j = 0; j < QK; j++) {
            const float r = roundf(x[j] * id);
            b[2 + j] = (uint8_t)(int8_t)(r >= -128.f && r <= 127.f ? (int)r : 0);
        }
    }
}

/* ------------------------------------------------------------------------------------ */
/* quantize (K-quants, 256-element super-blocks)                                         */

/* llama.cpp's make_qkx2_quants: scale and min for n values with levels 0..nmax, weighted
   least squares over nstep+1 candidate scales; L gets the levels, *the_min = -min. */
static float qkx2_scale_min(int n, int nmax, const float *x, const float *w, uint8_t *L,
                            float *the_min, uint8_t *Laux, float rmin, float rdelta, int nstep)
{
    float min = x[0], max = x[0], sum_w = w[0], sum_x = sum_w * x[0];
    for (int i = 1; i < n; i++) {
        if (x[i] < min)
            min = x[i];
        if (x[i] > max)
            max = x[i];
        sum_w += w[i];
        sum_x += w[i] * x[i];
    }
    if (min > 0)
        min = 0;
    if (max == min) {
        memset(L, 0, (size_t)n);
        *the_min = -min;
        return 0.f;
    }
    float iscale = nmax / (max - min), scale = 1 / iscale, best_error = 0;
    for (int i = 0; i < n; i++) {
        L[i] = (uint8_t)imax(0, imin(nmax, nearest_int(iscale * (x[i] - min))));
        const float diff = scale * L[i] + min - x[i];
        best_error += w[i] * (diff * diff);
    }
    for (int is = 0; is <= nstep; is++) {
        iscale = (rmin + rdelta * is + nmax) / (max - min);
        float sum_l = 0, sum_l2 = 0, sum_xl = 0;
        for (int i = 0; i < n; i++) {
            const int l = imax(0, imin(nmax, nearest_int(iscale * (x[i] - min))));
            Laux[i] = (uint8_t)l;
            sum_l += w[i] * l;
            sum_l2 += w[i] * l * l;
            sum_xl += w[i] * l * x[i];
        }
        const float D = sum_w * sum_l2 - sum_l * sum_l;
        if (!(D > 0))
            continue;
        float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
        float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
        if (this_min > 0) {
            this_min = 0;
            this_scale = sum_xl / sum_l2;
        }
        float cur_error = 0;
        for (int i = 0; i < n; i++) {
            const float diff = this_scale * Laux[i] + this_min - x[i];
            cur_error += w[i] * (diff * diff);
        }
        if (cur_error < best_error) {
            memcpy(L, Laux, (size_t)n);
            best_error = cur_error;
            scale = this_scale;
            min = this_min;
        }
    }
    *the_min = -min;
    return scale;
}

/* Shared by q4_K (nmax 15) and q5_K (nmax 31): sub-block scales/mins, 6-bit packing, the
   final levels L[256] against the rounded scales. Writes d, dmin, scales[12]. */
static void qk45_scales(const float *x, uint8_t *b, uint8_t *L, int nmax)
{
    float mins[8], scales[8], w[32], max_scale = 0, max_min = 0;
    uint8_t Laux[32];
    for (int j = 0; j < 8; j++) {
        float sum_x2 = 0;
        for (int l = 0; l < 32; l++)
            sum_x2 += x[32 * j + l] * x[32 * j + l];
        const float av_x = sqrtf(sum_x2 / 32);
        for (int l = 0; l < 32; l++)
            w[l] = av_x + fabsf(x[32 * j + l]);
        scales[j] = nmax == 15
            ? qkx2_scale_min(32, 15, x + 32 * j, w, L + 32 * j, &mins[j], Laux, -1.f, 0.1f, 20)
            : qkx2_scale_min(32, 31, x + 32 * j, w, L + 32 * j, &mins[j], Laux, -0.5f, 0.1f, 15);
        if (scales[j] > max_scale)
            max_scale = scales[j];
        if (mins[j] > max_min)
            max_min = mins[j];
    }
    const float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
    const float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
    uint8_t *sc = b + 4;
    memset(sc, 0, 12);
    for (int j = 0; j < 8; j++) {
        const uint8_t ls = (uint8_t)imin(63, (uint8_t)nearest_int(inv_scale * scales[j]));
        const uint8_t lm = (uint8_t)imin(63, (uint8_t)nearest_int(inv_min * mins[j]));
        if (j < 4) {
            sc[j] = ls;
            sc[j + 4] = lm;
        } else {
            sc[j + 4] = (uint8_t)((ls & 0xf) | (lm & 0xf) << 4);
            sc[j - 4] |= (uint8_t)((ls >> 4) << 6);
            sc[j] |= (uint8_t)((lm >> 4) << 6);
        }
    }
    st16(b, max_scale / 63.f);
    st16(b + 2, max_min / 63.f);
    for (int j = 0; j < 8; j++) {
        uint8_t s, m;
        scale_min_k4(j, sc, &s, &m);
        const float d = ld16(b) * s;
        if (!d)
            continue;
        const float dm = ld16(b + 2) * m;
        for (int ii = 0; ii < 32; ii++)
            L[32 * j + ii] = (uint8_t)imax(0, imin(nmax, nearest_int((x[32 * j + ii] + dm) / d)));
    }
}

static void q_q4_K(const float *x, uint8_t *b, int64_t nb)
{
    uint8_t L[QK_K];
    for (int64_t i = 0; i < nb; i++, x += QK_K, b += 144) {
        qk45_scales(x, b, L, 15);
        uint8_t *q = b + 16;
        for (int j = 0; j < QK_K; j += 64, q += 32)
            for (int l = 0; l < 32; l++)
                q[l] = (uint8_t)(L[j + l] | L[j + l + 32] << 4);
    }
}

static void q_q5_K(const float *x, uint8_t *b, int64_t nb)
{
    uint8_t L[QK_K];
    for (int64_t i = 0; i < nb; i++, x += QK_K, b += 176) {
        qk45_scales(x, b, L, 31);
        uint8_t *qh = b + 16, *ql = b + 48;
        memset(qh, 0, 32);
        uint8_t m1 = 1, m2 = 2;
        for (int n = 0; n < QK_K; n += 64, ql += 32, m1 <<= 2, m2 <<= 2) {
            for (int j = 0; j < 32; j++) {
                int l1 = L[n + j], l2 = L[n + j + 32];
                if (l1 > 15) {
                    l1 -= 16;
                    qh[j] |= m1;
                }
                if (l2 > 15) {
                    l2 -= 16;
                    qh[j] |= m2;
                }
                ql[j] = (uint8_t)(l1 | l2 << 4);
            }
        }
    }
}

/* llama.cpp's make_qx_quants with rmse_type 1 and no weights (w = x^2): signed levels
   -nmax..nmax-1 stored as L + nmax; scale refined over 18 candidate iscales. */
static float qx_scale(int n, int nmax, const float *x, int8_t *L)
{
    float amax;
    const float max = signed_absmax(x, n, &amax);
    if (amax < GROUP_MAX_EPS) {
        memset(L, 0, (size_t)n);
        return 0.f;
    }
    float iscale = -nmax / max, sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; i++) {
        const int l = imax(-nmax, imin(nmax - 1, nearest_int(iscale * x[i])));
        L[i] = (int8_t)(l + nmax);
        const float w = x[i] * x[i];
        sumlx += w * x[i] * l;
        suml2 += w * l * l;
    }
    float scale = suml2 ? sumlx / suml2 : 0.0f, best = scale * sumlx;
    for (int is = -9; is <= 9; is++) {
        if (is == 0)
            continue;
        iscale = -(nmax + 0.1f * is) / max;
        sumlx = suml2 = 0;
        for (int i = 0; i < n; i++) {
            const int l = imax(-nmax, imin(nmax - 1, nearest_int(iscale * x[i])));
            const float w = x[i] * x[i];
            sumlx += w * x[i] * l;
            suml2 += w * l * l;
        }
        if (suml2 > 0 && sumlx * sumlx > best * suml2) {
            for (int i = 0; i < n; i++)
                L[i] = (int8_t)(nmax + imax(-nmax, imin(nmax - 1, nearest_int(iscale * x[i]))));
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    return scale;
}

static void q6_K_pack(const int8_t *L, uint8_t *b)
{
    uint8_t *ql = b, *qh = b + 128;
    for (int j = 0; j < QK_K; j += 128, ql += 64, qh += 32) {
        for (int l = 0; l < 32; l++) {
            const uint8_t q1 = L[j + l] & 0xf, q2 = L[j + l + 32] & 0xf;
            const uint8_t q3 = L[j + l + 64] & 0xf, q4 = L[j + l + 96] & 0xf;
            ql[l] = (uint8_t)(q1 | q3 << 4);
            ql[l + 32] = (uint8_t)(q2 | q4 << 4);
            qh[l] = (uint8_t)((L[j + l] >> 4) | (L[j + l + 32] >> 4) << 2 |
                              (L[j + l + 64] >> 4) << 4 | (L[j + l + 96] >> 4) << 6);
        }
    }
}

static void q_q6_K(const float *x, uint8_t *b, int64_t nb)
{
    int8_t L[QK_K];
    float scales[QK_K / 16];
    for (int64_t i = 0; i < nb; i++, x += QK_K, b += 210) {
        float max_scale = 0, max_abs_scale = 0;
        for (int ib = 0; ib < QK_K / 16; ib++) {
            scales[ib] = qx_scale(16, 32, x + 16 * ib, L + 16 * ib);
            if (fabsf(scales[ib]) > max_abs_scale) {
                max_abs_scale = fabsf(scales[ib]);
                max_scale = scales[ib];
            }
        }
        memset(b, 0, 210);
        if (max_abs_scale < GROUP_MAX_EPS)
            continue;
        const float iscale = -128.f / max_scale;
        st16(b + 208, 1 / iscale);
        int8_t *sc = (int8_t *)(b + 192);
        for (int ib = 0; ib < QK_K / 16; ib++)
            sc[ib] = (int8_t)imin(127, nearest_int(iscale * scales[ib]));
        for (int j = 0; j < QK_K / 16; j++) {
            const float d = ld16(b + 208) * sc[j];
            if (!d)
                continue;
            for (int ii = 0; ii < 16; ii++)
                L[16 * j + ii] = (int8_t)(imax(-32, imin(31, nearest_int(x[16 * j + ii] / d))) + 32);
        }
        q6_K_pack(L, b);
    }
}

void dtype_quantize_row(int t, const float *src, void *dst, int64_t n)
{
    const struct dtype_info *di = dtype_get(t);
    WELD_ASSERT(di && di->can_quantize && n >= 0 && n % di->block_size == 0);
    uint8_t *d = dst;
    const int64_t nb = n / di->block_size;
    switch (t) {
    case DT_F32: memcpy(dst, src, (size_t)n * 4); break;
    case DT_F16:
        for (int64_t i = 0; i < n; i++)
            st16(d + 2 * i, src[i]);
        break;
    case DT_BF16:
        for (int64_t i = 0; i < n; i++) {
            const uint16_t h = bf16_from_f32(src[i]);
            d[2 * i] = (uint8_t)h;
            d[2 * i + 1] = (uint8_t)(h >> 8);
        }
        break;
    case DT_Q4_0: q_q4_0(src, d, nb); break;
    case DT_Q4_1: q_q4_1(src, d, nb); break;
    case DT_Q5_0: q_q5_0(src, d, nb); break;
    case DT_Q5_1: q_q5_1(src, d, nb); break;
    case DT_Q8_0: q_q8_0(src, d, nb); break;
    case DT_Q4_K: q_q4_K(src, d, nb); break;
    case DT_Q5_K: q_q5_K(src, d, nb); break;
    case DT_Q6_K: q_q6_K(src, d, nb); break;
    default: WELD_ASSERT(!"unreachable");
    }
}
