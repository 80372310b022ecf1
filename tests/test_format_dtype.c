/*
 * Tests for src/format/dtype.c: the type table, row sizes, hand-computed blocks, an
 * element-by-element decoder written here from the ggml-common.h layout descriptions (the
 * library's dequantizers must agree with it exactly on random blocks), quantization error
 * bounds, and golden hashes of llama.cpp's own output: the XXH64 of ggml_quantize_chunk()
 * bytes and of the dequantized floats for the deterministic rows gen_row() makes, computed
 * once with llama.cpp commit 81ff7abe's libggml-base (no imatrix, i.e. quantize_row_*_ref),
 * so the test pins bit-compatibility without needing llama.cpp at run time.
 */
#include "core/fp16.h"
#include "core/rng.h"
#include "format/dtype.h"
#include "test.h"

#include <stdint.h>
#include <xxhash.h>

/* ---- deterministic rows (the same generator was compiled against libggml-base) ---- */

static uint64_t gen_state;

static uint32_t gen_next(void)
{
    gen_state ^= gen_state << 13;
    gen_state ^= gen_state >> 7;
    gen_state ^= gen_state << 17;
    return (uint32_t)(gen_state >> 32);
}

/* Row `row` of n floats; each 256-block gets one of 8 patterns chosen to hit edge cases
   (all zero, constant, tiny, all positive, heavy outliers, few distinct values). */
static void gen_row(int row, float *x, int n)
{
    gen_state = 0x9E3779B97F4A7C15ull * (uint64_t)(row + 1);
    for (int b = 0; b < n / 256; b++) {
        int kind = (row * 7 + b) % 8;
        for (int i = 0; i < 256; i++) {
            float u = ((float)(int32_t)(gen_next() >> 8) - 8388608.0f) / 8388608.0f;
            float v;
            switch (kind) {
            case 0: v = u; break;
            case 1: v = u * u * u * 4.0f; break;
            case 2: v = (gen_next() % 97 == 0) ? u * 50.0f : u * 0.01f; break;
            case 3: v = 0.0f; break;
            case 4: v = 1.25f; break;
            case 5: v = u * 1e-20f; break;
            case 6: v = u + 3.0f; break;
            default: v = (float)((int)(u * 8)) * 0.5f; break;
            }
            x[b * 256 + i] = v;
        }
    }
}

TEST(quantize_and_dequantize_match_llama_cpp)
{
    static const struct {
        int type;
        size_t size;
        unsigned long long hq, hy;
    } golden[] = {
        {1, 32768, 0xf6d637696c1ef4f4ull, 0x4b401a56286ddb38ull},  /* f16 */
        {30, 32768, 0x7f6da3a1a606c4c8ull, 0xb175e98432e22e78ull}, /* bf16 */
        {2, 9216, 0x18bcf46e22ebaf31ull, 0x213f2349e20af4e4ull},   /* q4_0 */
        {3, 10240, 0x9dd6a85d46173c73ull, 0x69b11ac9bb801e72ull},  /* q4_1 */
        {6, 11264, 0x911d728931fd88adull, 0x7a77bc876bcac38bull},  /* q5_0 */
        {7, 12288, 0x2a1ea466d4e08134ull, 0xf10e7170742dd38bull},  /* q5_1 */
        {8, 17408, 0xadff07c3e6d57c60ull, 0x9bde29aff1babb3cull},  /* q8_0 */
        {12, 9216, 0xb4e383ae6c4dedecull, 0x606cc5735c013247ull},  /* q4_K */
        {13, 11264, 0xedc6700d3090257dull, 0xbd480456752ca341ull}, /* q5_K */
        {14, 13440, 0xff43e7457b906649ull, 0xd6019987e608dd17ull}, /* q6_K */
    };
    enum { N = 1024, ROWS = 16 };
    float *x = malloc(sizeof(float) * N * ROWS), *y = malloc(sizeof(float) * N * ROWS);
    uint8_t *q = malloc(N * ROWS * 4);
    REQUIRE(x && y && q);
    for (int r = 0; r < ROWS; r++)
        gen_row(r, x + r * N, N);
    for (size_t k = 0; k < sizeof golden / sizeof golden[0]; k++) {
        int t = golden[k].type;
        size_t rb = dtype_row_bytes(t, N);
        CHECK_EQ_INT(rb * ROWS, golden[k].size);
        for (int r = 0; r < ROWS; r++)
            dtype_quantize_row(t, x + r * N, q + r * rb, N);
        dtype_dequantize_row(t, q, y, (int64_t)N * ROWS);
        unsigned long long hq = XXH64(q, rb * ROWS, 0), hy = XXH64(y, sizeof(float) * N * ROWS, 0);
        if (hq != golden[k].hq || hy != golden[k].hy) {
            fprintf(stderr, "  %s: bytes %016llx (want %016llx), floats %016llx (want %016llx)\n",
                    dtype_name(t), hq, golden[k].hq, hy, golden[k].hy);
            CHECK(0);
        }
    }
    free(x);
    free(y);
    free(q);
}

/* ---- table ---- */

TEST(type_table_and_names)
{
    CHECK_EQ_STR(dtype_name(DT_F32), "f32");
    CHECK_EQ_STR(dtype_name(DT_Q4_K), "q4_K");
    CHECK_EQ_STR(dtype_name(DT_BF16), "bf16");
    CHECK_EQ_STR(dtype_name(DT_I64), "i64");
    CHECK_EQ_STR(dtype_name(4), "unknown");
    CHECK_EQ_STR(dtype_name(-1), "unknown");
    CHECK_EQ_STR(dtype_name(DT_COUNT), "unknown");
    CHECK(dtype_get(4) == NULL && dtype_get(5) == NULL && dtype_get(16) == NULL);
    CHECK(dtype_get(29) == NULL && dtype_get(31) == NULL && dtype_get(-5) == NULL);
    CHECK_EQ_INT(dtype_from_name("Q4_k"), DT_Q4_K);
    CHECK_EQ_INT(dtype_from_name("q8_0"), DT_Q8_0);
    CHECK_EQ_INT(dtype_from_name("BF16"), DT_BF16);
    CHECK_EQ_INT(dtype_from_name("f16"), DT_F16);
    CHECK_EQ_INT(dtype_from_name("q8"), -1);
    CHECK_EQ_INT(dtype_from_name("q8_00"), -1);
    CHECK_EQ_INT(dtype_from_name(""), -1);
    CHECK_EQ_INT(dtype_from_name(NULL), -1);
    /* every known type round-trips by name; sizes as ggml's type traits */
    static const struct { int t; int bs; size_t ts; } sizes[] = {
        {DT_F32, 1, 4}, {DT_F16, 1, 2}, {DT_Q4_0, 32, 18}, {DT_Q4_1, 32, 20}, {DT_Q5_0, 32, 22},
        {DT_Q5_1, 32, 24}, {DT_Q8_0, 32, 34}, {DT_Q8_1, 32, 36}, {DT_Q2_K, 256, 84},
        {DT_Q3_K, 256, 110}, {DT_Q4_K, 256, 144}, {DT_Q5_K, 256, 176}, {DT_Q6_K, 256, 210},
        {DT_Q8_K, 256, 292}, {DT_I8, 1, 1}, {DT_I16, 1, 2}, {DT_I32, 1, 4}, {DT_I64, 1, 8},
        {DT_F64, 1, 8}, {DT_BF16, 1, 2},
    };
    int known = 0;
    for (int t = -2; t < DT_COUNT + 2; t++)
        if (dtype_get(t)) {
            known++;
            CHECK_EQ_INT(dtype_from_name(dtype_name(t)), t);
        }
    CHECK_EQ_INT(known, 20);
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        const struct dtype_info *di = dtype_get(sizes[i].t);
        REQUIRE(di != NULL);
        CHECK_EQ_INT(di->block_size, sizes[i].bs);
        CHECK_EQ_INT(di->type_size, sizes[i].ts);
        CHECK_EQ_INT(di->quantized, sizes[i].bs > 1);
    }
    CHECK(dtype_get(DT_Q6_K)->can_quantize && dtype_get(DT_Q6_K)->can_dequantize);
    CHECK(!dtype_get(DT_Q2_K)->can_dequantize && !dtype_get(DT_I32)->can_quantize);
}

TEST(row_bytes)
{
    CHECK_EQ_INT(dtype_row_bytes(DT_F32, 64), 256);
    CHECK_EQ_INT(dtype_row_bytes(DT_F16, 3), 6);
    CHECK_EQ_INT(dtype_row_bytes(DT_BF16, 4096), 8192);
    CHECK_EQ_INT(dtype_row_bytes(DT_Q8_0, 64), 68);
    CHECK_EQ_INT(dtype_row_bytes(DT_Q4_0, 4096), 2304);
    CHECK_EQ_INT(dtype_row_bytes(DT_Q5_1, 96), 72);
    CHECK_EQ_INT(dtype_row_bytes(DT_Q4_K, 512), 288);
    CHECK_EQ_INT(dtype_row_bytes(DT_Q6_K, 256), 210);
    CHECK_EQ_INT(dtype_row_bytes(DT_Q8_K, 256), 292);
    CHECK_EQ_INT(dtype_row_bytes(DT_Q8_0, 0), 0);
    CHECK_EQ_INT(dtype_row_bytes(DT_Q8_0, 33), 0);
    CHECK_EQ_INT(dtype_row_bytes(DT_Q4_K, 128), 0);
    CHECK_EQ_INT(dtype_row_bytes(DT_F32, -4), 0);
    CHECK_EQ_INT(dtype_row_bytes(4, 32), 0);
    CHECK_EQ_INT(dtype_row_bytes(DT_F64, INT64_MAX), 0); /* overflows size_t */
}

/* ---- hand-computed blocks ---- */

TEST(known_blocks_32)
{
    uint8_t b[34];
    float y[32];
    /* q8_0: d = 0.5 (f16 0x3800), qs = -16..15 */
    b[0] = 0x00, b[1] = 0x38;
    for (int i = 0; i < 32; i++)
        b[2 + i] = (uint8_t)(int8_t)(i - 16);
    dtype_dequantize_row(DT_Q8_0, b, y, 32);
    for (int i = 0; i < 32; i++)
        CHECK(y[i] == (i - 16) * 0.5f);
    /* q4_0: d = 2 (0x4000); byte j = j | (15 - j) << 4 -> y[j] = (j - 8) * 2,
       y[j + 16] = (7 - j) * 2 */
    b[0] = 0x00, b[1] = 0x40;
    for (int j = 0; j < 16; j++)
        b[2 + j] = (uint8_t)(j | (15 - j) << 4);
    dtype_dequantize_row(DT_Q4_0, b, y, 32);
    for (int j = 0; j < 16; j++) {
        CHECK(y[j] == (j - 8) * 2.0f);
        CHECK(y[j + 16] == (7 - j) * 2.0f);
    }
    /* q4_1: d = 0.5, m = -1 (0xbc00); same nibbles -> j * 0.5 - 1 and (15 - j) * 0.5 - 1 */
    b[0] = 0x00, b[1] = 0x38, b[2] = 0x00, b[3] = 0xbc;
    for (int j = 0; j < 16; j++)
        b[4 + j] = (uint8_t)(j | (15 - j) << 4);
    dtype_dequantize_row(DT_Q4_1, b, y, 32);
    for (int j = 0; j < 16; j++) {
        CHECK(y[j] == j * 0.5f - 1);
        CHECK(y[j + 16] == (15 - j) * 0.5f - 1);
    }
    /* q5_0: d = 1, qh = 0x80000001 (fifth bit of elements 0 and 31), qs nibbles 0 and 15:
       y[0] = (0 | 16) - 16 = 0, y[1] = -16, y[16] = 15 - 16 = -1, y[31] = 31 - 16 = 15 */
    uint8_t q5[22] = {0x00, 0x3c, 0x01, 0x00, 0x00, 0x80};
    for (int j = 0; j < 16; j++)
        q5[6 + j] = 0xf0;
    dtype_dequantize_row(DT_Q5_0, q5, y, 32);
    CHECK(y[0] == 0 && y[1] == -16 && y[15] == -16 && y[16] == -1 && y[30] == -1 && y[31] == 15);
    /* quantizing: q8_0 of (i - 16) / 16 gives d = 1/127 and q = round((i - 16) * 127 / 16) */
    float x[32];
    for (int i = 0; i < 32; i++)
        x[i] = (float)(i - 16) / 16;
    dtype_quantize_row(DT_Q8_0, x, b, 32);
    CHECK_EQ_INT(b[0] | b[1] << 8, fp16_from_f32(1.0f / 127));
    CHECK_EQ_INT((int8_t)b[2], -127);
    CHECK_EQ_INT((int8_t)b[2 + 8], -64); /* -0.5 * 127 = -63.5 rounds away from zero */
    CHECK_EQ_INT((int8_t)b[2 + 16], 0);
    CHECK_EQ_INT((int8_t)b[2 + 31], 119); /* 15 / 16 * 127 = 119.06 */
    /* q4_0 of the same: the value of largest magnitude (-1) maps to -8, d = 1/8 */
    dtype_quantize_row(DT_Q4_0, x, b, 32);
    CHECK_EQ_INT(b[0] | b[1] << 8, 0x3000); /* 0.125 */
    CHECK_EQ_INT(b[2] & 0xf, 0);   /* -1 / 0.125 + 8 = 0 */
    CHECK_EQ_INT(b[2] >> 4, 8);    /* element 16: 0 -> 8 */
    CHECK_EQ_INT(b[17] >> 4, 15);  /* element 31: 15/16 / 0.125 + 8.5 = 16 -> clamped 15 */
}

/* A q4_K super-block built by hand: d = 1, dmin = 0.5, 6-bit scales and mins packed as
   ggml-common.h describes (sub-blocks 0-3 in the low 6 bits of bytes 0-3 / 4-7; sub-blocks
   4-7 in the nibbles of bytes 8-11 plus the top 2 bits of bytes 0-7). */
TEST(known_block_q4_K)
{
    static const uint8_t sc[8] = {1, 2, 3, 4, 17, 33, 50, 63};
    static const uint8_t mn[8] = {0, 1, 2, 63, 16, 5, 40, 9};
    uint8_t b[144] = {0x00, 0x3c, 0x00, 0x38};
    uint8_t *s = b + 4;
    for (int j = 0; j < 4; j++) {
        s[j] = (uint8_t)(sc[j] | (sc[j + 4] >> 4) << 6);
        s[j + 4] = (uint8_t)(mn[j] | (mn[j + 4] >> 4) << 6);
        s[j + 8] = (uint8_t)((sc[j + 4] & 15) | (mn[j + 4] & 15) << 4);
    }
    for (int i = 0; i < 128; i++)
        b[16 + i] = (uint8_t)(i * 37 + 5);
    float y[256];
    dtype_dequantize_row(DT_Q4_K, b, y, 256);
    for (int i = 0; i < 256; i++) {
        int sub = i / 32, byte = (i / 64) * 32 + i % 32;
        int q = sub % 2 ? b[16 + byte] >> 4 : b[16 + byte] & 15;
        float want = 1.0f * sc[sub] * q - 0.5f * mn[sub];
        if (y[i] != want) {
            fprintf(stderr, "  element %d: %g, want %g\n", i, y[i], want);
            CHECK(0);
            break;
        }
    }
}

/* ---- an independent element decoder, from the layout descriptions ---- */

static float h(const uint8_t *p) { return fp16_to_f32((uint16_t)(p[0] | p[1] << 8)); }
static int bit(const uint8_t *p, int i) { return p[i / 8] >> (i % 8) & 1; }

/* Element i (0 <= i < block size) of one block of type t. */
static float ref_elem(int t, const uint8_t *b, int i)
{
    int l = i % 16, hi = i >= 16; /* 32-blocks: element l / l + 16 share byte l */
    switch (t) {
    case DT_Q4_0: return (float)(((b[2 + l] >> 4 * hi) & 15) - 8) * h(b);
    case DT_Q4_1: return (float)((b[4 + l] >> 4 * hi) & 15) * h(b) + h(b + 2);
    case DT_Q5_0: return (float)((((b[6 + l] >> 4 * hi) & 15) | bit(b + 2, i) << 4) - 16) * h(b);
    case DT_Q5_1: return (float)(((b[8 + l] >> 4 * hi) & 15) | bit(b + 4, i) << 4) * h(b) + h(b + 2);
    case DT_Q8_0: return (float)(int8_t)b[2 + i] * h(b);
    }
    /* K-quants: sub-block j of 32 (q4_K/q5_K) or of 16 (q6_K) */
    if (t == DT_Q4_K || t == DT_Q5_K) {
        int j = i / 32, pos = (i / 64) * 32 + i % 32;
        const uint8_t *s = b + 4;
        int sc = j < 4 ? s[j] & 63 : (s[j + 4] & 15) | (s[j - 4] >> 6) << 4;
        int m = j < 4 ? s[j + 4] & 63 : (s[j + 4] >> 4) | (s[j] >> 6) << 4;
        const uint8_t *qs = b + (t == DT_Q5_K ? 48 : 16);
        int q = (qs[pos] >> 4 * (j % 2)) & 15;
        if (t == DT_Q5_K)
            q |= (b[16 + i % 32] >> j & 1) << 4;
        return h(b) * (float)sc * (float)q - h(b + 2) * (float)m;
    }
    /* q6_K: 128-element halves; within one, quarter k = (i % 128) / 32 takes the low (k < 2)
       or high nibble of ql[half * 64 + (k % 2) * 32 + l] and bits 2k..2k+1 of qh[half*32+l] */
    int half = i / 128, k = (i % 128) / 32, ll = i % 32;
    int lo = (b[half * 64 + (k % 2) * 32 + ll] >> 4 * (k / 2)) & 15;
    int hb = (b[128 + half * 32 + ll] >> 2 * k) & 3;
    int8_t sc = (int8_t)b[192 + i / 16];
    return h(b + 208) * sc * (float)((lo | hb << 4) - 32);
}

TEST(dequantize_matches_independent_decoder)
{
    static const int types[] = {DT_Q4_0, DT_Q4_1, DT_Q5_0, DT_Q5_1, DT_Q8_0,
                                DT_Q4_K, DT_Q5_K, DT_Q6_K};
    struct rng r;
    rng_seed(&r, 42);
    uint8_t blk[4 * 210];
    float y[4 * 256];
    for (size_t k = 0; k < sizeof types / sizeof types[0]; k++) {
        int t = types[k];
        const struct dtype_info *di = dtype_get(t);
        for (int iter = 0; iter < 50; iter++) {
            for (size_t i = 0; i < 4 * di->type_size; i++)
                blk[i] = (uint8_t)rng_u64(&r);
            /* keep the f16 scales finite and moderate: exponent bits from a small range */
            for (int bi = 0; bi < 4; bi++) {
                uint8_t *p = blk + bi * di->type_size;
                size_t offs[2] = {t == DT_Q6_K ? 208 : 0, t == DT_Q6_K ? 208 : 2};
                for (int o = 0; o < 2; o++)
                    p[offs[o] + 1] = (uint8_t)((p[offs[o] + 1] & 0x83) | 0x30);
            }
            dtype_dequantize_row(t, blk, y, 4 * di->block_size);
            for (int i = 0; i < 4 * di->block_size; i++) {
                float want = ref_elem(t, blk + (i / di->block_size) * di->type_size,
                                      i % di->block_size);
                if (y[i] != want) {
                    fprintf(stderr, "  %s element %d: %g, want %g\n", dtype_name(t), i, y[i], want);
                    CHECK(0);
                    iter = 50;
                    break;
                }
            }
        }
    }
}

/* ---- round trips ---- */

TEST(quantize_error_bounds)
{
    /* relative RMS error bound per type on N(0,1) data (measured values are ~2/3 of these) */
    static const struct { int t; double rel_rms; } bounds[] = {
        {DT_F16, 4e-4}, {DT_BF16, 3e-3}, {DT_Q8_0, 8e-3}, {DT_Q6_K, 2.2e-2}, {DT_Q5_1, 4.5e-2},
        {DT_Q5_K, 4.5e-2}, {DT_Q5_0, 5e-2}, {DT_Q4_1, 9e-2}, {DT_Q4_K, 9e-2}, {DT_Q4_0, 1.1e-1},
    };
    enum { N = 4096 };
    static float x[N], y[N];
    static uint8_t q[N * 4];
    struct rng r;
    rng_seed(&r, 7);
    for (int i = 0; i < N; i++)
        x[i] = (float)rng_normal(&r);
    for (size_t k = 0; k < sizeof bounds / sizeof bounds[0]; k++) {
        int t = bounds[k].t, bs = dtype_get(t)->block_size;
        dtype_quantize_row(t, x, q, N);
        dtype_dequantize_row(t, q, y, N);
        double se = 0, sx = 0, worst = 0;
        for (int i = 0; i < N; i++) {
            se += (double)(x[i] - y[i]) * (x[i] - y[i]);
            sx += (double)x[i] * x[i];
        }
        /* per block of 32: no element is further off than the block's step size allows */
        for (int b0 = 0; b0 < N; b0 += 32) {
            float amax = 0, mn = x[b0], mx = x[b0];
            for (int i = b0; i < b0 + 32; i++) {
                amax = fmaxf(amax, fabsf(x[i]));
                mn = fminf(mn, x[i]);
                mx = fmaxf(mx, x[i]);
            }
            double step = t == DT_Q8_0 ? amax / 127.0 : t == DT_Q4_0 ? amax / 8.0
                        : t == DT_Q5_0 ? amax / 16.0 : t == DT_Q4_1 ? (mx - mn) / 15.0
                        : t == DT_Q5_1 ? (mx - mn) / 31.0 : 0;
            for (int i = b0; i < b0 + 32 && step > 0; i++) {
                /* half a step from rounding, a full step where the top level is clamped,
                   plus the f16 rounding of the scale applied to up to 16 steps */
                double lim = (t == DT_Q4_0 || t == DT_Q5_0 ? 1.0 : 0.5) * step + 0.01 * step * 16 + 1e-6;
                double err = fabs((double)x[i] - y[i]);
                worst = err / lim > worst ? err / lim : worst;
            }
        }
        double rel = sqrt(se / sx);
        if (rel > bounds[k].rel_rms || worst > 1.0) {
            fprintf(stderr, "  %s: relative rms %.4g (bound %.3g), worst/limit %.3g (block %d)\n",
                    dtype_name(t), rel, bounds[k].rel_rms, worst, bs);
            CHECK(0);
        }
    }
}

TEST(plain_types_exact)
{
    float x[6] = {1.0f, -2.0f, 0.5f, 65504.0f, 3.140625f, -0.0f}, y[6];
    uint8_t q[24];
    dtype_quantize_row(DT_F16, x, q, 6);
    CHECK(q[0] == 0x00 && q[1] == 0x3c && q[2] == 0x00 && q[3] == 0xc0);
    dtype_dequantize_row(DT_F16, q, y, 6);
    CHECK(memcmp(x, y, sizeof x) == 0);
    dtype_quantize_row(DT_BF16, x, q, 6);
    CHECK(q[0] == 0x80 && q[1] == 0x3f);
    dtype_dequantize_row(DT_BF16, q, y, 6);
    CHECK(y[0] == 1.0f && y[1] == -2.0f && y[4] == 3.140625f && signbit(y[5]));
    dtype_quantize_row(DT_F32, x, q, 6);
    dtype_dequantize_row(DT_F32, q, y, 6);
    CHECK(memcmp(x, y, sizeof x) == 0);
    /* zero and constant blocks survive every quantizer */
    static const int types[] = {DT_Q4_0, DT_Q4_1, DT_Q5_0, DT_Q5_1, DT_Q8_0,
                                DT_Q4_K, DT_Q5_K, DT_Q6_K};
    float z[256], c[256], out[256];
    uint8_t qb[512];
    for (int i = 0; i < 256; i++)
        z[i] = 0.0f, c[i] = -0.75f;
    for (size_t k = 0; k < sizeof types / sizeof types[0]; k++) {
        dtype_quantize_row(types[k], z, qb, 256);
        dtype_dequantize_row(types[k], qb, out, 256);
        for (int i = 0; i < 256; i++)
            CHECK(out[i] == 0.0f);
        dtype_quantize_row(types[k], c, qb, 256);
        dtype_dequantize_row(types[k], qb, out, 256);
        for (int i = 0; i < 256; i++)
            CHECK_NEAR(out[i], -0.75, 0.01);
    }
}

int main(void)
{
    RUN(type_table_and_names);
    RUN(row_bytes);
    RUN(known_blocks_32);
    RUN(known_block_q4_K);
    RUN(dequantize_matches_independent_decoder);
    RUN(quantize_error_bounds);
    RUN(plain_types_exact);
    RUN(quantize_and_dequantize_match_llama_cpp);
    return test_summary();
}
