/*
 * Scalar CPU kernels against independent references: a weight row of every supported type
 * dotted with an f32 vector (reference: double-precision dot over values decoded by hand
 * for F16/BF16/Q8_0/Q4_0, by dtype_dequantize_row for the rest), rmsnorm, rope layouts,
 * axpy, and the fixed-order reduction (same result for the same inputs, any alignment).
 */
#include "core/fp16.h"
#include "core/rng.h"
#include "kernels/cpu/kernels.h"
#include "test.h"

#include <stdint.h>

static void rand_vec(struct rng *r, float *v, int n, double scale)
{
    for (int i = 0; i < n; i++)
        v[i] = (float)(rng_normal(r) * scale);
}

static double dot_d(const float *a, const float *b, int n)
{
    double s = 0;
    for (int i = 0; i < n; i++)
        s += (double)a[i] * b[i];
    return s;
}

/* Hand decoders, written from the block layouts in dtype.h. */
static void decode_q8_0(const uint8_t *src, float *dst, int n)
{
    for (int b = 0; b < n / 32; b++, src += 34) {
        float d = fp16_to_f32((uint16_t)(src[0] | src[1] << 8));
        for (int i = 0; i < 32; i++)
            dst[b * 32 + i] = d * (float)(int8_t)src[2 + i];
    }
}

static void decode_q4_0(const uint8_t *src, float *dst, int n)
{
    for (int b = 0; b < n / 32; b++, src += 18) {
        float d = fp16_to_f32((uint16_t)(src[0] | src[1] << 8));
        for (int i = 0; i < 16; i++) {
            dst[b * 32 + i] = d * (float)((src[2 + i] & 15) - 8);
            dst[b * 32 + 16 + i] = d * (float)((src[2 + i] >> 4) - 8);
        }
    }
}

static void check_type(int t, int n)
{
    struct rng r;
    rng_seed(&r, 1000 + (uint64_t)t);
    float *w = malloc(sizeof(float) * (size_t)n), *x = malloc(sizeof(float) * (size_t)n);
    float *deq = malloc(sizeof(float) * (size_t)n), *scratch = malloc(sizeof(float) * (size_t)n);
    uint8_t *q = malloc(dtype_row_bytes(t, n));
    rand_vec(&r, w, n, 1.0);
    rand_vec(&r, x, n, 1.0);
    dtype_quantize_row(t, w, q, n);
    if (t == DT_F16)
        for (int i = 0; i < n; i++)
            deq[i] = fp16_to_f32(((uint16_t *)q)[i]);
    else if (t == DT_BF16)
        for (int i = 0; i < n; i++)
            deq[i] = bf16_to_f32(((uint16_t *)q)[i]);
    else if (t == DT_Q8_0)
        decode_q8_0(q, deq, n);
    else if (t == DT_Q4_0)
        decode_q4_0(q, deq, n);
    else
        dtype_dequantize_row(t, q, deq, n);
    double want = dot_d(deq, x, n);
    float got = kern_row_dot(t, t == DT_F32 ? (const void *)w : q, x, n, scratch);
    if (t == DT_F32)
        want = dot_d(w, x, n);
    if (!(fabs(got - want) <= 1e-5 * sqrt((double)n) * 4)) {
        fprintf(stderr, "type %s: got %.9g want %.9g\n", dtype_name(t), got, want);
        CHECK(0);
    }
    /* and the quantized value is close to the f32 one (the encoding round-trips) */
    double exact = dot_d(w, x, n);
    CHECK(fabs(want - exact) < 0.25 * sqrt((double)n));
    CHECK(kern_type_supported(t));
    free(w), free(x), free(deq), free(scratch), free(q);
}

TEST(row_dot_every_type)
{
    const int types[] = {DT_F32, DT_F16, DT_BF16, DT_Q8_0, DT_Q4_0, DT_Q4_1,
                         DT_Q5_0, DT_Q5_1, DT_Q4_K, DT_Q5_K, DT_Q6_K};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
        check_type(types[i], 512);
    CHECK(!kern_type_supported(DT_I32));
    CHECK(!kern_type_supported(77));
}

TEST(dot_is_order_fixed)
{
    struct rng r;
    rng_seed(&r, 7);
    float a[203], b[203], a2[204], b2[204];
    rand_vec(&r, a, 203, 1.0);
    rand_vec(&r, b, 203, 1.0);
    memcpy(a2 + 1, a, sizeof a);
    memcpy(b2 + 1, b, sizeof b);
    for (int n = 0; n <= 203; n += 29) {
        float d1 = kern_dot_f32(a, b, n), d2 = kern_dot_f32(a2 + 1, b2 + 1, n);
        CHECK(memcmp(&d1, &d2, sizeof d1) == 0); /* misalignment does not change bits */
        CHECK_NEAR(d1, dot_d(a, b, n), 1e-4);
    }
}

TEST(rmsnorm_matches_double)
{
    struct rng r;
    rng_seed(&r, 8);
    float x[100], w[100], out[100];
    rand_vec(&r, x, 100, 3.0);
    rand_vec(&r, w, 100, 1.0);
    double ss = 0;
    for (int i = 0; i < 100; i++)
        ss += (double)x[i] * x[i];
    double inv = 1.0 / sqrt(ss / 100 + 1e-5);
    kern_rmsnorm(x, w, 1e-5f, out, 100);
    for (int i = 0; i < 100; i++)
        CHECK_NEAR(out[i], x[i] * inv * w[i], 1e-5 * (1 + fabs(x[i] * inv * w[i])));
    kern_rmsnorm(x, NULL, 1e-5f, x, 100); /* in place, no weight */
    CHECK_NEAR(x[3] * w[3], out[3], 1e-5);
}

TEST(rope_layouts)
{
    /* head of 8 with rope_dim 6: pairs neox (0,3)(1,4)(2,5), adjacent (0,1)(2,3)(4,5) */
    float c[3], s[3];
    float factors[3] = {1.0f, 2.0f, 4.0f};
    kern_rope_angles(5.0, 10000.0f, 6, factors, c, s);
    for (int i = 0; i < 3; i++) {
        double ang = 5.0 * pow(10000.0, -2.0 * i / 6) / factors[i];
        CHECK_NEAR(c[i], cos(ang), 1e-6);
        CHECK_NEAR(s[i], sin(ang), 1e-6);
    }
    float v[8] = {1, 2, 3, 4, 5, 6, 7, 8}, u[8];
    memcpy(u, v, sizeof v);
    kern_rope_apply(v, 6, true, c, s);
    kern_rope_apply(u, 6, false, c, s);
    CHECK_NEAR(v[0], 1 * c[0] - 4 * s[0], 1e-6);
    CHECK_NEAR(v[3], 1 * s[0] + 4 * c[0], 1e-6);
    CHECK_NEAR(v[2], 3 * c[2] - 6 * s[2], 1e-6);
    CHECK_NEAR(u[0], 1 * c[0] - 2 * s[0], 1e-6);
    CHECK_NEAR(u[1], 1 * s[0] + 2 * c[0], 1e-6);
    CHECK_NEAR(u[5], 5 * s[2] + 6 * c[2], 1e-6);
    CHECK(v[6] == 7 && v[7] == 8 && u[6] == 7 && u[7] == 8);
}

TEST(axpy_scale)
{
    float g[3] = {-2, 0, 3};
    float y[3] = {1, 1, 1};
    kern_axpy(2, g, y, 3);
    kern_scale(0.5f, y, 3);
    CHECK_NEAR(y[0], -1.5, 1e-7);
    CHECK_NEAR(y[2], 3.5, 1e-7);
}

TEST(matvec_rows)
{
    struct rng r;
    rng_seed(&r, 9);
    float w[5 * 64], x[64], y[3], scratch[64];
    rand_vec(&r, w, 5 * 64, 1);
    rand_vec(&r, x, 64, 1);
    struct tensor t = {.type = DT_F32, .n_dims = 2, .ne = {64, 5, 1, 1}, .data = w,
                       .nbytes = sizeof w};
    kern_matvec(&t, 1, 4, x, y, scratch);
    for (int i = 0; i < 3; i++)
        CHECK_NEAR(y[i], dot_d(w + (i + 1) * 64, x, 64), 1e-4);
    CHECK_EQ_INT(kern_row_bytes(&t), 256);
}

int main(void)
{
    RUN(row_dot_every_type);
    RUN(dot_is_order_fixed);
    RUN(rmsnorm_matches_double);
    RUN(rope_layouts);
    RUN(axpy_scale);
    RUN(matvec_rows);
    return test_summary();
}
