/*
 * scalar - the reference implementation of kernels.h.
 *
 * Clear loops over f32. Reductions use KERN_LANES partial sums combined pairwise in a
 * fixed order (see kernels.h for why the order matters). Transcendentals use libm in
 * double where the result is a per-position constant (rope angles); SiLU's exp is attn.h's
 * polynomial (gemm_ops.silu_mul), the same bits on every ISA.
 */
#include "kernels/cpu/kernels.h"

#include "core/fp16.h"

#include <math.h>
#include <string.h>

bool kern_type_supported(int t)
{
    if (t == DT_F32 || t == DT_F16 || t == DT_BF16)
        return true;
    const struct dtype_info *di = dtype_get(t);
    return di && di->can_dequantize;
}

static float lanes_sum(float s[KERN_LANES])
{
    for (int w = KERN_LANES / 2; w > 0; w /= 2)
        for (int i = 0; i < w; i++)
            s[i] += s[i + w];
    return s[0];
}

float kern_dot_f32(const float *a, const float *b, int64_t n)
{
    float s[KERN_LANES] = {0};
    int64_t i = 0;
    for (; i + KERN_LANES <= n; i += KERN_LANES)
        for (int j = 0; j < KERN_LANES; j++)
            s[j] += a[i + j] * b[i + j];
    for (int j = 0; i < n; i++, j++)
        s[j] += a[i] * b[i];
    return lanes_sum(s);
}

void kern_to_f32(int t, const void *src, float *dst, int64_t n)
{
    switch (t) {
    case DT_F32:
        memcpy(dst, src, (size_t)n * sizeof(float));
        return;
    case DT_F16: {
        const uint16_t *h = src;
        for (int64_t i = 0; i < n; i++)
            dst[i] = fp16_to_f32(h[i]);
        return;
    }
    case DT_BF16: {
        const uint16_t *h = src;
        for (int64_t i = 0; i < n; i++)
            dst[i] = bf16_to_f32(h[i]);
        return;
    }
    default:
        dtype_dequantize_row(t, src, dst, n);
    }
}

const float *kern_row_f32(int t, const void *row, int64_t n, float *scratch)
{
    if (t == DT_F32)
        return row;
    kern_to_f32(t, row, scratch, n);
    return scratch;
}

float kern_row_dot(int t, const void *row, const float *x, int64_t n, float *scratch)
{
    return kern_dot_f32(kern_row_f32(t, row, n, scratch), x, n);
}

static size_t row_bytes(int t, int64_t n)
{
    switch (t) {
    case DT_F32:
        return (size_t)n * 4;
    case DT_F16:
    case DT_BF16:
        return (size_t)n * 2;
    default:
        return dtype_row_bytes(t, n);
    }
}

size_t kern_row_bytes(const struct tensor *w) { return row_bytes(w->type, w->ne[0]); }

void kern_matvec(const struct tensor *w, int64_t row0, int64_t row1, const float *x,
                 float *y, float *scratch)
{
    const int64_t n = w->ne[0];
    const size_t rb = row_bytes(w->type, n);
    for (int64_t r = row0; r < row1; r++)
        y[r - row0] = kern_row_dot(w->type, kern_tensor_row(w, rb, r), x, n, scratch);
}

void kern_rmsnorm(const float *x, const float *weight, float eps, float *out, int64_t n)
{
    float ss = kern_dot_f32(x, x, n);
    float inv = 1.0f / sqrtf(ss / (float)n + eps);
    if (weight)
        for (int64_t i = 0; i < n; i++)
            out[i] = x[i] * inv * weight[i];
    else
        for (int64_t i = 0; i < n; i++)
            out[i] = x[i] * inv;
}

void kern_rope_angles(double pos, float theta, int rope_dim, const float *factors,
                      float *cos_out, float *sin_out)
{
    for (int i = 0; i < rope_dim / 2; i++) {
        double freq = pow((double)theta, -2.0 * i / rope_dim);
        if (factors)
            freq /= factors[i];
        double a = pos * freq;
        cos_out[i] = (float)cos(a);
        sin_out[i] = (float)sin(a);
    }
}

void kern_rope_apply(float *v, int rope_dim, bool neox, const float *cosv, const float *sinv)
{
    const int half = rope_dim / 2;
    for (int i = 0; i < half; i++) {
        int a = neox ? i : 2 * i;
        int b = neox ? i + half : 2 * i + 1;
        float x0 = v[a], x1 = v[b];
        v[a] = x0 * cosv[i] - x1 * sinv[i];
        v[b] = x0 * sinv[i] + x1 * cosv[i];
    }
}

void kern_axpy(float a, const float *x, float *y, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        y[i] += a * x[i];
}

void kern_scale(float a, float *y, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        y[i] *= a;
}
