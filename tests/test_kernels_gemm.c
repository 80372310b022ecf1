/*
 * gemm kernels (kernels/cpu/gemm.h) against references:
 *   - gemm_scalar against double-precision dots of dtype_dequantize_row's values: within
 *     f32 accumulation error for the float path; for the integer path, within f32 error of
 *     the dot with the quantized activations (d * q), and within the proven bound of the
 *     activation quantization (|x - d q| <= max|x of block| / 254) of the dot with x;
 *   - every ISA this CPU has (called directly, and through WELD_ISA when the ctest rule
 *     sets it) against gemm_scalar: activation bytes identical and outputs bit-identical
 *     (the numeric contract of gemm.h);
 *   - determinism: a token's output is the same alone (n_tok = 1), inside a tile, at the
 *     end of a ragged batch, and under any split of the rows;
 *   - weights both quantized from random floats and made of raw random bytes (every code,
 *     -128 in Q8_0, all 6-bit scales), odd shapes: K = one block .. many, rows not a
 *     multiple of the register tile, n_tok = 1, 3, 16, 17, padded row strides.
 */
#include "core/fp16.h"
#include "core/rng.h"
#include "format/dtype.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/kernels.h"
#include "test.h"

#include <math.h>
#include <stdint.h>

static const int all_types[] = {DT_F32, DT_F16, DT_BF16, DT_Q8_0, DT_Q4_0, DT_Q4_K, DT_Q6_K};
#define N_TYPES ((int)(sizeof all_types / sizeof all_types[0]))

static size_t row_bytes(int t, int64_t k)
{
    if (t == DT_F32)
        return (size_t)k * 4;
    if (t == DT_F16 || t == DT_BF16)
        return (size_t)k * 2;
    return dtype_row_bytes(t, k);
}

static void st16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

/* A random f16 scale in [lo, hi). */
static void rand_scale(struct rng *r, uint8_t *p, double lo, double hi)
{
    st16(p, fp16_from_f32((float)(lo + (hi - lo) * rng_uniform(r))));
}

/* Raw random blocks with sane f16 scales: every code value and scale byte occurs. */
static void raw_row(struct rng *r, int t, uint8_t *row, int64_t k)
{
    size_t n = row_bytes(t, k);
    for (size_t i = 0; i < n; i++)
        row[i] = (uint8_t)rng_u64(r);
    size_t bs = t == DT_Q8_0 ? 34 : t == DT_Q4_0 ? 18 : t == DT_Q4_K ? 144 : 210;
    for (size_t b = 0; b < n / bs; b++) {
        uint8_t *p = row + b * bs;
        if (t == DT_Q6_K) {
            rand_scale(r, p + 208, 1e-4, 1e-3);
        } else {
            rand_scale(r, p, 1e-3, 1e-2);
            if (t == DT_Q4_K)
                rand_scale(r, p + 2, 1e-3, 1e-2);
        }
    }
}

/* Weight matrix (rows, k) of type t, row stride stride bytes; raw: random blocks. */
static uint8_t *make_weights(struct rng *r, int t, int rows, int64_t k, size_t stride, int raw)
{
    uint8_t *w = calloc((size_t)rows, stride);
    float *f = malloc(sizeof(float) * (size_t)k);
    for (int i = 0; i < rows; i++) {
        uint8_t *row = w + (size_t)i * stride;
        if (raw && t != DT_F32 && t != DT_F16 && t != DT_BF16) {
            raw_row(r, t, row, k);
            continue;
        }
        for (int64_t j = 0; j < k; j++)
            f[j] = (float)(rng_normal(r) * 0.05);
        if (t == DT_F32)
            memcpy(row, f, (size_t)k * 4);
        else if (t == DT_F16)
            for (int64_t j = 0; j < k; j++)
                st16(row + 2 * j, fp16_from_f32(f[j]));
        else if (t == DT_BF16)
            for (int64_t j = 0; j < k; j++)
                st16(row + 2 * j, bf16_from_f32(f[j]));
        else
            dtype_quantize_row(t, f, row, k);
    }
    free(f);
    return w;
}

static float *make_x(struct rng *r, int n_tok, int64_t k, size_t ldx)
{
    float *x = calloc((size_t)n_tok * ldx, sizeof(float));
    for (int t = 0; t < n_tok; t++)
        for (int64_t j = 0; j < k; j++) /* heavy tails: a few large values per block */
            x[(size_t)t * ldx + j] = (float)(rng_normal(r) * (rng_uniform(r) < 0.02 ? 8.0 : 1.0));
    return x;
}

/* Everything one case needs. */
struct gcase {
    int t, rows, n_tok;
    int64_t k;
    size_t stride, ldx, ldy, arb;
    uint8_t *w;
    float *x;
};

static void case_make(struct gcase *c, struct rng *r, int t, int rows, int64_t k, int n_tok,
                      int raw, int pad)
{
    c->t = t;
    c->rows = rows;
    c->k = k;
    c->n_tok = n_tok;
    c->stride = row_bytes(t, k) + (pad ? 64 + 6 : 0);
    c->ldx = (size_t)k + (pad ? 3 : 0);
    c->ldy = (size_t)rows + (pad ? 5 : 0);
    c->arb = gemm_act_row_bytes(t, k) + (pad ? 96 * 2 : 0);
    c->w = make_weights(r, t, rows, k, c->stride, raw);
    c->x = make_x(r, n_tok, k, c->ldx);
}

static void case_free(struct gcase *c)
{
    free(c->w);
    free(c->x);
}

/* Run ops o on rows [r0, r1) and tokens [t0, t0 + nt) of c; y is (c->n_tok, ldy). act is
   (re)quantized by o. */
static unsigned g_flags; /* gemm_args.flags of run_ops */

static void run_ops(const struct gemm_ops *o, const struct gcase *c, int64_t r0, int64_t r1,
                    int t0, int nt, void *act, float *y)
{
    const float *x = c->x + (size_t)t0 * c->ldx;
    o->act_quant(c->t, x, c->ldx, c->k, nt, act, c->arb);
    struct gemm_args a = {
        .wtype = c->t, .w = c->w, .w_row_bytes = c->stride, .r0 = r0, .r1 = r1, .k = c->k,
        .n_tok = nt, .x = x, .ldx = c->ldx, .act = act, .act_row_bytes = c->arb,
        .y = y + (size_t)t0 * c->ldy + (size_t)r0, .ldy = c->ldy, .flags = g_flags,
    };
    o->gemm(&a);
}

static size_t act_bytes(const struct gcase *c) { return c->arb * (size_t)c->n_tok + 64; }

/* scalar vs double references (see the file comment). */
static void check_accuracy_as(const struct gcase *c, const float *y, const void *act, int act_t);

static void check_scalar_accuracy(const struct gcase *c, const float *y, const void *act)
{
    check_accuracy_as(c, y, act, c->t);
}

/* y and act computed for weight type act_t (c->t, or its repacked form). */
static void check_accuracy_as(const struct gcase *c, const float *y, const void *act, int act_t)
{
    float *deq = malloc(sizeof(float) * (size_t)c->k);
    const enum gemm_act_kind kind = gemm_act_kind(act_t);
    const int bs = kind == GEMM_ACT_Q8_K ? 256 : 32;
    int bad = 0;
    for (int r = 0; r < c->rows && !bad; r++) {
        dtype_dequantize_row(c->t, c->w + (size_t)r * c->stride, deq, c->k);
        for (int t = 0; t < c->n_tok && !bad; t++) {
            const float *x = c->x + (size_t)t * c->ldx;
            const uint8_t *at = (const uint8_t *)act + (size_t)t * c->arb;
            double ref = 0, mag = 0, qref = 0, qbound = 0;
            for (int64_t j = 0; j < c->k; j++) {
                ref += (double)deq[j] * x[j];
                mag += fabs((double)deq[j] * x[j]);
                if (kind == GEMM_ACT_F32)
                    continue;
                if (kind == GEMM_ACT_BF16) { /* x rounded to bf16: |x - xr| <= |x| 2^-8 */
                    uint16_t h;
                    memcpy(&h, at + 2 * j, 2);
                    qref += (double)deq[j] * bf16_to_f32(h);
                    qbound += fabs((double)deq[j] * x[j]) / 256.0;
                    continue;
                }
                double d, amax = 0;
                int q;
                if (kind == GEMM_ACT_Q8_R) {
                    const struct gemm_act_br *b = (const struct gemm_act_br *)at + j / 32;
                    d = b->d;
                    q = b->q[j % 32];
                } else if (kind == GEMM_ACT_Q8_32) {
                    const struct gemm_act_b64 *b = (const struct gemm_act_b64 *)at + j / 64;
                    d = b->d[8 * ((j / 32) % 2)];
                    q = b->q[j % 64];
                } else {
                    const struct gemm_act_bk *b = (const struct gemm_act_bk *)at + j / 256;
                    d = b->d;
                    q = b->q[j % 256];
                }
                for (int64_t i = j / bs * bs; i < j / bs * bs + bs; i++)
                    amax = fmax(amax, fabs(x[i]));
                qref += (double)deq[j] * d * q;
                qbound += fabs((double)deq[j]) * amax / 254.0;
            }
            const double v = y[(size_t)t * c->ldy + r];
            /* BF16: one chain of k FMAs, not 16 lanes */
            const double tol = (kind == GEMM_ACT_BF16 ? 8e-6 : 2e-6) * sqrt((double)c->k) * mag +
                               1e-30;
            if (kind == GEMM_ACT_F32) {
                if (!(fabs(v - ref) <= tol))
                    bad = 1;
            } else {
                if (!(fabs(v - qref) <= tol + 1e-6 * fabs(qref)))
                    bad = 2;
                if (!(fabs(v - ref) <= qbound * 1.001 + tol))
                    bad = 3;
            }
            if (bad)
                fprintf(stderr, "  %s k=%lld r=%d t=%d: y=%.9g ref=%.9g qref=%.9g mag=%.3g "
                        "qbound=%.3g (check %d)\n", dtype_name(c->t), (long long)c->k, r, t,
                        v, ref, qref, mag, qbound, bad);
        }
    }
    CHECK(!bad);
    free(deq);
}

static int count_diff(const float *a, const float *b, const struct gcase *c)
{
    int n = 0;
    for (int t = 0; t < c->n_tok; t++)
        for (int r = 0; r < c->rows; r++) {
            size_t i = (size_t)t * c->ldy + r;
            if (a[i] != b[i] || memcmp(&a[i], &b[i], 4) != 0) {
                if (n < 3)
                    fprintf(stderr, "  %s k=%lld r=%d t=%d: %.9g vs %.9g\n", dtype_name(c->t),
                            (long long)c->k, r, t, a[i], b[i]);
                n++;
            }
        }
    return n;
}

/* One case under scalar (accuracy) and every available ISA (exact), plus determinism. */
static void check_case(struct gcase *c, const struct gemm_ops *only)
{
    const size_t ny = (size_t)c->n_tok * c->ldy;
    float *ys = malloc(ny * 4), *yo = malloc(ny * 4), *yd = malloc(ny * 4);
    uint8_t *acts = calloc(1, act_bytes(c)), *acto = calloc(1, act_bytes(c));
    for (size_t i = 0; i < ny; i++)
        ys[i] = yo[i] = yd[i] = -7.0f; /* padding must survive */
    run_ops(&gemm_ops_scalar, c, 0, c->rows, 0, c->n_tok, acts, ys);
    check_scalar_accuracy(c, ys, acts);
    for (int l = ISA_SCALAR; l < ISA_COUNT; l++) {
        const struct gemm_ops *o = only ? only : gemm_ops_for((enum isa_level)l);
        if (!o || (only && l > 0))
            continue;
        memset(acto, 0, act_bytes(c));
        run_ops(o, c, 0, c->rows, 0, c->n_tok, acto, yo);
        CHECK(memcmp(acts, acto, act_bytes(c)) == 0);
        int nd = count_diff(ys, yo, c);
        if (nd)
            fprintf(stderr, "  isa %s: %d differences\n", isa_name(o->isa), nd);
        CHECK_EQ_INT(nd, 0);
        /* Determinism: each token alone, rows split unevenly, padding untouched; with the
           L2 prefetch (the full run above goes without it), rows one at a time and (for
           resident weights) side by side. */
        for (int f = 0; f < 2; f++) {
            g_flags = GEMM_L2_PREFETCH | (f ? GEMM_RESIDENT : 0u);
            for (size_t i = 0; i < (size_t)c->n_tok * c->ldy; i++)
                yd[i] = -7.0f;
            for (int t = 0; t < c->n_tok; t++) {
                int64_t mid = c->rows / 3;
                run_ops(o, c, 0, mid, t, 1, acto, yd);
                run_ops(o, c, mid, c->rows, t, 1, acto, yd);
            }
            g_flags = 0;
            CHECK_EQ_INT(count_diff(yo, yd, c), 0);
        }
        for (int t = 0; t < c->n_tok; t++)
            for (size_t r = (size_t)c->rows; r < c->ldy; r++)
                CHECK(yo[(size_t)t * c->ldy + r] == -7.0f);
    }
    free(ys);
    free(yo);
    free(yd);
    free(acts);
    free(acto);
}

static const struct gemm_ops *forced_ops; /* set when WELD_ISA forces a level */

static void sweep(int t, const int64_t *ks, int nk, uint64_t seed)
{
    static const int rows_list[] = {1, 2, 3, 5, 17};
    /* 26 (float types only): past the AVX2 float tile's 24-token block */
    static const int tok_list[] = {1, 3, 16, 17, 26};
    const int n_tok_cases = gemm_act_kind(t) == GEMM_ACT_F32 ? 5 : 4;
    struct rng r;
    rng_seed(&r, seed);
    for (int ik = 0; ik < nk; ik++)
        for (int ir = 0; ir < 5; ir++)
            for (int it = 0; it < n_tok_cases; it++) {
                struct gcase c;
                int raw = (ir + it) % 2, pad = (ik + ir + it) % 3 == 0;
                case_make(&c, &r, t, rows_list[ir], ks[ik], tok_list[it], raw, pad);
                check_case(&c, forced_ops);
                case_free(&c);
            }
}

TEST(float_types)
{
    static const int64_t ks[] = {1, 7, 16, 33, 100, 512};
    sweep(DT_F32, ks, 6, 1);
    sweep(DT_F16, ks, 6, 2);
    sweep(DT_BF16, ks, 6, 3);
}

TEST(q8_0)
{
    static const int64_t ks[] = {32, 64, 32 * 37, 4096};
    sweep(DT_Q8_0, ks, 4, 4);
}

TEST(q4_0)
{
    static const int64_t ks[] = {32, 96, 32 * 37, 4096};
    sweep(DT_Q4_0, ks, 4, 5);
}

TEST(q4_K)
{
    static const int64_t ks[] = {256, 768, 256 * 11};
    sweep(DT_Q4_K, ks, 3, 6);
}

TEST(q6_K)
{
    static const int64_t ks[] = {256, 512, 256 * 11};
    sweep(DT_Q6_K, ks, 3, 7);
}

/* c's weights repacked into *rc: false (after a failed CHECK) unless gemm_repack takes
   exactly the 16-row rounded size and returns type rt. *rw: the repacked bytes, for the
   caller to free (also on failure). */
static bool repacked_case(const struct gcase *c, int rt, struct gcase *rc, uint8_t **rw)
{
    const size_t rbytes = gemm_repack_bytes(c->t, c->rows, c->k);
    const size_t want = (size_t)(c->rows + 15) / 16 * 16 * row_bytes(c->t, c->k);
    *rw = NULL;
    CHECK(rbytes == want);
    if (rbytes != want || !(*rw = malloc(rbytes)))
        return false;
    const int got = gemm_repack(c->t, c->w, c->stride, c->rows, c->k, *rw);
    CHECK_EQ_INT(got, rt);
    *rc = *c;
    rc->t = rt;
    rc->w = *rw;
    rc->stride = row_bytes(c->t, c->k);
    return got == rt;
}

/* Every ISA from level `from` on the repacked case rc against the reference outputs ys
   and activation bytes acts: same bytes, same bits, the same bits again when the rows are
   split at 16 and the tokens run one by one, and the rows past the matrix untouched (yo,
   yd, acto: scratch of ys's and acts's sizes, yo and yd filled with -7). */
static void check_repacked_isas(const struct gcase *rc, int from, const float *ys,
                                const uint8_t *acts, float *yo, float *yd, uint8_t *acto)
{
    for (int l = from; l < ISA_COUNT; l++) {
        const struct gemm_ops *o = gemm_ops_for((enum isa_level)l);
        if (!o)
            continue;
        memset(acto, 0, act_bytes(rc));
        run_ops(o, rc, 0, rc->rows, 0, rc->n_tok, acto, yo);
        CHECK(memcmp(acts, acto, act_bytes(rc)) == 0);
        CHECK_EQ_INT(count_diff(ys, yo, rc), 0);
        /* decode: one stream or two (always, or for long rows: K = 32 * 150 here), L2
           prefetch or not */
        for (unsigned f = 0; f < 8; f += TEST_SANITIZED ? 3 : 1) { /* 0, 3, 6: each bit */
            g_flags = (f & 1 ? GEMM_DECODE_PAIRS : 0u) | (f & 2 ? GEMM_L2_PREFETCH : 0u) |
                      (f & 4 ? GEMM_DECODE_PAIRS_LONG : 0u);
            for (size_t i = 0; i < (size_t)rc->n_tok * rc->ldy; i++)
                yd[i] = -7.0f;
            for (int t = 0; t < rc->n_tok; t++) {
                int64_t mid = rc->rows > 16 ? 16 : rc->rows;
                run_ops(o, rc, 0, mid, t, 1, acto, yd);
                run_ops(o, rc, mid, rc->rows, t, 1, acto, yd);
            }
            CHECK_EQ_INT(count_diff(yo, yd, rc), 0);
            g_flags = 0;
        }
        for (int t = 0; t < rc->n_tok; t++)
            for (size_t r = (size_t)rc->rows; r < rc->ldy; r++)
                CHECK(yo[(size_t)t * rc->ldy + r] == -7.0f);
    }
}

/* Repacked Q8_0 / Q4_0: scalar on the repacked form against the double references, every
   ISA against it bit for bit, determinism, row ranges starting at multiples of 16. */
static void check_r16(struct gcase *c)
{
    const int rt = c->t == DT_Q8_0 ? GEMM_Q8_0_R16 : GEMM_Q4_0_R16;
    uint8_t *rw;
    struct gcase rc;
    if (!repacked_case(c, rt, &rc, &rw)) {
        free(rw);
        return;
    }
    rc.arb = gemm_act_row_bytes(rt, c->k) + 8;
    const size_t ny = (size_t)c->n_tok * c->ldy;
    float *ys = malloc(ny * 4), *yo = malloc(ny * 4), *yd = malloc(ny * 4);
    uint8_t *acts = calloc(1, act_bytes(&rc)), *acto = calloc(1, act_bytes(&rc));
    for (size_t i = 0; i < ny; i++)
        ys[i] = yo[i] = yd[i] = -7.0f;
    run_ops(&gemm_ops_scalar, &rc, 0, c->rows, 0, c->n_tok, acts, ys);
    struct gcase cc = *c; /* GGUF weights for the reference, the repacked act stride */
    cc.arb = rc.arb;
    check_accuracy_as(&cc, ys, acts, rt);
    check_repacked_isas(&rc, ISA_AVX2, ys, acts, yo, yd, acto);
    free(rw);
    free(ys);
    free(yo);
    free(yd);
    free(acts);
    free(acto);
}

TEST(repacked)
{
    /* 17, 40, 48: decode's pairs of 16-row groups, partial, then a lone partial or whole
       group */
    static const int rows_list[] = {1, 5, 16, 17, 40, 48};
    /* 150 blocks: K split in 64, 64, 22 (AVX-512) or 32 x 4, 22 (AVX2) */
    static const int64_t ks[] = {32, 96, 32 * 150};
    /* 1, 2: both halves of a group in one pass (AVX2); 3, 17: token tiles and remainders;
       33: two AMX tiles of 16 and an AVX-512 remainder */
    static const int tok_list[] = {1, 2, 3, 17, 33};
    struct rng r;
    rng_seed(&r, 11);
    CHECK_EQ_INT(gemm_repack_bytes(DT_Q4_1, 16, 256), 0);
    CHECK_EQ_INT(gemm_repack(DT_F16, NULL, 0, 16, 172, NULL), -1);
    CHECK(gemm_repack_pays(gemm_ops_for(ISA_AVX512), DT_Q8_0) == isa_cpu_has(ISA_AVX512));
    CHECK(gemm_repack_pays(gemm_ops_for(ISA_AVX2), DT_Q4_0) == isa_cpu_has(ISA_AVX2));
    CHECK(!gemm_repack_pays(&gemm_ops_scalar, DT_Q8_0));
    for (int ti = 0; ti < 2; ti++)
        for (int ir = 0; ir < 6; ir++)
            for (int ik = 0; ik < 3; ik++)
                for (int it = 0; it < 5; it++) {
                    if (TEST_SANITIZED && ik == 2 && it >= 3)
                        continue; /* the token tiles of 17 and 33 run on the short rows */
                    struct gcase c;
                    case_make(&c, &r, ti ? DT_Q4_0 : DT_Q8_0, rows_list[ir], ks[ik], tok_list[it],
                              (ir + it) % 2, (ir + ik) % 2);
                    check_r16(&c);
                    case_free(&c);
                }
}

/* Repacked Q4_K / Q6_K (and floats): the same contract as the GGUF layout, so every ISA on
   the repacked form must give exactly the scalar kernel's bits on the GGUF form; plus row
   splits at multiples of 16 and rows past the matrix left alone. */
static void check_r16k(struct gcase *c)
{
    uint8_t *rw;
    struct gcase rc;
    if (!repacked_case(c, c->t + 0x100, &rc, &rw)) {
        free(rw);
        return;
    }
    const size_t ny = (size_t)c->n_tok * c->ldy;
    float *ys = malloc(ny * 4), *yo = malloc(ny * 4), *yd = malloc(ny * 4);
    uint8_t *acts = calloc(1, act_bytes(c)), *acto = calloc(1, act_bytes(c));
    for (size_t i = 0; i < ny; i++)
        ys[i] = yo[i] = yd[i] = -7.0f;
    run_ops(&gemm_ops_scalar, c, 0, c->rows, 0, c->n_tok, acts, ys); /* GGUF layout */
    check_repacked_isas(&rc, ISA_SCALAR, ys, acts, yo, yd, acto);
    free(rw);
    free(ys);
    free(yo);
    free(yd);
    free(acts);
    free(acto);
}

TEST(repacked_kquants)
{
    static const int rows_list[] = {1, 16, 17, 40};
    static const int64_t ks[] = {256, 768, 256 * 11};
    static const int tok_list[] = {1, 3, 4, 9}; /* token tiles of 4 and remainders */
    struct rng r;
    rng_seed(&r, 12);
    CHECK_EQ_INT(gemm_repack_bytes(DT_Q4_K, 16, 96), 0);
    CHECK(gemm_repack_pays(gemm_ops_for(ISA_AVX512), DT_Q4_K) == isa_cpu_has(ISA_AVX512));
    CHECK(gemm_repack_pays(gemm_ops_for(ISA_AVX512), DT_Q6_K) == isa_cpu_has(ISA_AVX512));
    CHECK(gemm_repack_pays(gemm_ops_for(ISA_AVX2), DT_Q4_K) == isa_cpu_has(ISA_AVX2));
    CHECK(!gemm_repack_pays(gemm_ops_for(ISA_AVX2), DT_Q6_K));
    for (int ti = 0; ti < 2; ti++)
        for (int ir = 0; ir < 4; ir++)
            for (int ik = 0; ik < 3; ik++)
                for (int it = 0; it < 4; it++) {
                    struct gcase c;
                    case_make(&c, &r, ti ? DT_Q6_K : DT_Q4_K, rows_list[ir], ks[ik], tok_list[it],
                              (ir + it) % 2, (ir + ik) % 2);
                    check_r16k(&c);
                    case_free(&c);
                }
}

/* Repacked floats (GEMM_F*_R16: rows in segments of gemm_fseg(K)): the float contract, so
   every ISA on the repacked form gives the scalar kernel's bits on the GGUF rows; row
   splits at 16; token tiles of 6 (AVX-512) and their remainders; segments of 128 and of
   the shorter lengths (64, and 32 = half an AVX-512 F16 step over a line). */
TEST(repacked_floats)
{
    static const int rows_list[] = {1, 16, 17, 40};
    static const int64_t ks[] = {2 * GEMM_FSEG, 3 * GEMM_FSEG, 1152, 192, 2080};
    static const int tok_list[] = {1, 3, 7, 13};
    static const int types[] = {DT_F32, DT_F16, DT_BF16};
    struct rng r;
    rng_seed(&r, 13);
    CHECK_EQ_INT(gemm_repack_bytes(DT_F16, 16, GEMM_FSEG), 0);     /* one segment */
    CHECK_EQ_INT(gemm_repack_bytes(DT_F16, 16, 2 * GEMM_FSEG + 16), 0);
    CHECK_EQ_INT(gemm_fseg(8192), 128);
    CHECK_EQ_INT(gemm_fseg(14336), 128);
    CHECK_EQ_INT(gemm_fseg(11008), 128); /* Llama-2-7B's FFN */
    CHECK_EQ_INT(gemm_fseg(768), 128);   /* llama-110m's dim */
    CHECK_EQ_INT(gemm_fseg(192), 64);
    CHECK_EQ_INT(gemm_fseg(4512), 32);   /* 141 x 32 */
    CHECK_EQ_INT(gemm_fseg(2080), 32);   /* 65 x 32 */
    CHECK_EQ_INT(gemm_fseg(64), 0);      /* one segment of 64 */
    CHECK_EQ_INT(gemm_fseg(172), 0);     /* no multiple of 32 divides it */
    CHECK_EQ_INT(gemm_repack_bytes(DT_F32, 3, 172), 0);
    CHECK(gemm_repack_bytes(DT_F16, 3, 11008) == 16 * 2 * 11008);
    CHECK(gemm_repack_bytes(DT_BF16, 17, 2 * GEMM_FSEG) == 32 * 2 * 2 * GEMM_FSEG);
    CHECK(gemm_repack_pays(gemm_ops_for(ISA_AVX512), DT_F16) == isa_cpu_has(ISA_AVX512));
    CHECK(gemm_repack_pays(gemm_ops_for(ISA_AVX2), DT_BF16) == isa_cpu_has(ISA_AVX2));
    CHECK(!gemm_repack_pays(&gemm_ops_scalar, DT_F32));
    for (int ti = 0; ti < 3; ti++)
        for (int ir = 0; ir < 4; ir++)
            for (int ik = 0; ik < 4; ik++)
                for (int it = 0; it < 4; it++) {
                    struct gcase c;
                    case_make(&c, &r, types[ti], rows_list[ir], ks[ik], tok_list[it],
                              (ir + it) % 2, (ir + ik + ti) % 2);
                    check_r16k(&c);
                    case_free(&c);
                }
}

/* gemm.h's BF16 contract at its edges, on every ISA against the scalar reference:
   activations rounded as vcvtneps2bf16 (ties to even, denormals to zero, NaN quiet);
   values whose products and partial sums pass through the denormal range (where daz()
   and ftz() decide the bits); the repacked form over row ranges that start anywhere and
   over column views (gemm_view_offset), each equal to the GGUF rows' chains; K long
   enough for prefill's K blocks, whose partial sums wait in y. */
TEST(bf16_contract)
{
    static const float xs[] = {1.0f,
                               1.00390625f /* tie: stays */,
                               1.01171875f /* tie: up */,
                               -3.5e-39f /* denormal: -0 */,
                               1e-45f,
                               -0.0f,
                               3.4e38f,
                               INFINITY};
    static const uint16_t want[] = {0x3f80, 0x3f80, 0x3f82, 0x8000, 0x0000, 0x8000, 0x7f80, 0x7f80};
    for (size_t i = 0; i < sizeof xs / sizeof xs[0]; i++)
        CHECK_EQ_INT(gemm_bf16_round(xs[i]), want[i]);
    CHECK_EQ_INT(gemm_bf16_round(NAN) & 0x7fc0, 0x7fc0);
    CHECK_EQ_INT(gemm_bf16_round(f32_from_bits(0x7f800001u)), 0x7fc0); /* signalling: quiet */
    struct rng r;
    rng_seed(&r, 21);
    /* shapes: one K block; K blocks of prefill (256 pairs) with a 4-group tile and token
       tiles of 6 and a remainder; an odd K (GGUF rows only) whose last element ends the
       last block */
    static const struct {
        int rows, n_tok;
        int64_t k, cuts[4]; /* row ranges; none but the first starts on a group */
    } shapes[] = {{45, 7, 96, {0, 5, 16, 45}},
                  {83, 13, 1026, {0, 5, 70, 83}},
                  {70, 9, 1027, {0, 3, 68, 70}}};
    for (int sh = 0; sh < 3; sh++)
        for (int tiny = 0; tiny < 2; tiny++) {
            const int rows = shapes[sh].rows, n_tok = shapes[sh].n_tok;
            const int64_t k = shapes[sh].k;
            const bool even = k % 2 == 0;
            struct gcase c;
            case_make(&c, &r, DT_BF16, rows, k, n_tok, 0, 1);
            if (tiny) { /* magnitudes around 2^-63: products near and below FLT_MIN */
                for (int i = 0; i < rows; i++)
                    for (int64_t j = 0; j < k; j++) {
                        uint16_t h =
                            (uint16_t)((rng_u64(&r) & 0x807f) |
                                       (uint16_t)(rng_u64(&r) % 8 == 0 ? 0 : 60 + rng_u64(&r) % 10)
                                           << 7);
                        st16(c.w + (size_t)i * c.stride + 2 * j, h);
                    }
                for (int t = 0; t < n_tok; t++)
                    for (int64_t j = 0; j < k; j++)
                        c.x[(size_t)t * c.ldx + j] = ldexpf((float)(rng_normal(&r)),
                                                            -60 - (int)(rng_u64(&r) % 10));
            }
            const size_t ny = (size_t)n_tok * c.ldy;
            float *ys = malloc(ny * 4), *yo = malloc(ny * 4);
            uint8_t *acts = calloc(1, act_bytes(&c)), *acto = calloc(1, act_bytes(&c));
            for (size_t i = 0; i < ny; i++)
                ys[i] = -7.0f;
            run_ops(&gemm_ops_scalar, &c, 0, rows, 0, n_tok, acts, ys);
            int n_tiny = 0;
            for (size_t i = 0; i < ny; i++)
                n_tiny += ys[i] != -7.0f && fabsf(ys[i]) < 1e-30f;
            if (tiny)
                CHECK(n_tiny > 0); /* the denormal range was reached */
            uint8_t *rw = NULL;
            struct gcase rc = c;
            if (even)
                REQUIRE(repacked_case(&c, GEMM_BF16_R16, &rc, &rw));
            for (int l = ISA_SCALAR; l < ISA_COUNT; l++) {
                const struct gemm_ops *o = gemm_ops_for((enum isa_level)l);
                if (!o)
                    continue;
                const struct gcase *forms[2] = {&c, &rc};
                for (int f = 0; f < (even ? 2 : 1); f++) {
                    for (size_t i = 0; i < ny; i++)
                        yo[i] = -7.0f;
                    const int64_t *cuts = shapes[sh].cuts;
                    for (int q = 0; q < 3; q++)
                        run_ops(o, forms[f], cuts[q], cuts[q + 1], 0, n_tok, acto, yo);
                    CHECK(memcmp(acts, acto, (size_t)n_tok * c.arb) == 0);
                    const int nd = count_diff(ys, yo, &c);
                    if (nd)
                        fprintf(stderr, "  bf16 isa %s shape %d form %d tiny %d: %d differences\n",
                                isa_name(o->isa), sh, f, tiny, nd);
                    CHECK_EQ_INT(nd, 0);
                }
                if (!even)
                    continue;
                /* columns [32, 96) of the repacked form = those of the GGUF rows */
                struct gcase v = c, rv = rc;
                v.k = rv.k = 64;
                v.w = c.w + 64;
                rv.w = rw + gemm_view_offset(GEMM_BF16_R16, 32);
                v.x = rv.x = c.x + 32;
                v.arb = rv.arb = gemm_act_row_bytes(DT_BF16, 64);
                for (size_t i = 0; i < ny; i++)
                    ys[i] = yo[i] = -7.0f;
                run_ops(&gemm_ops_scalar, &v, 0, rows, 0, n_tok, acts, ys);
                run_ops(o, &rv, 3, rows, 0, n_tok, acto, yo);
                run_ops(o, &rv, 0, 3, 0, n_tok, acto, yo);
                CHECK_EQ_INT(count_diff(ys, yo, &c), 0);
                run_ops(&gemm_ops_scalar, &c, 0, rows, 0, n_tok, acts, ys); /* back to all of k */
            }
            free(rw);
            free(ys);
            free(yo);
            free(acts);
            free(acto);
            case_free(&c);
        }
}

/* Activations of constant, zero and extreme values quantize identically on every ISA, for
   the GGUF and the repacked layouts. */
TEST(act_quant_edges)
{
    const int64_t k = 512;
    float *x = calloc((size_t)k, sizeof(float));
    for (int64_t i = 256; i < k; i++)
        x[i] = (i % 7 == 0) ? -3e30f : (float)(i % 5) * 1e-30f;
    for (int64_t i = 32; i < 64; i++)
        x[i] = 1.0f;
    x[32] = 127.0f; /* d = 1: exact ties below round to even */
    x[33] = 2.5f;
    x[34] = 3.5f;
    x[35] = -2.5f;
    for (int ti = 3; ti < N_TYPES; ti++) {
        const int t = all_types[ti];
        size_t n = gemm_act_row_bytes(t, k);
        uint8_t *a0 = calloc(1, n), *a1 = calloc(1, n);
        gemm_ops_scalar.act_quant(t, x, (size_t)k, k, 1, a0, n);
        for (int l = ISA_AVX2; l < ISA_COUNT; l++) {
            const struct gemm_ops *o = gemm_ops_for((enum isa_level)l);
            if (!o)
                continue;
            memset(a1, 0, n);
            o->act_quant(t, x, (size_t)k, k, 1, a1, n);
            CHECK(memcmp(a0, a1, n) == 0);
        }
        if (gemm_act_kind(t) == GEMM_ACT_Q8_32) {
            const struct gemm_act_b64 *b = (const struct gemm_act_b64 *)a0;
            CHECK(b[0].d[0] == 0.0f && b[0].q[5] == 0 && b[0].corr[0] == 0);
            CHECK(b[0].d[8] == 1.0f && b[0].d[15] == 1.0f && b[0].q[63] == 1);
            CHECK(b[0].q[32] == 127 && b[0].q[33] == 2 && b[0].q[34] == 4 && b[0].q[35] == -2);
            CHECK_EQ_INT(b[0].corr[8], (t == DT_Q8_0 ? -128 : -8) * 131);
        } else {
            const struct gemm_act_bk *b = (const struct gemm_act_bk *)a0;
            CHECK(b[0].q[33] == 2 && b[0].q[34] == 4 && b[0].q[35] == -2);
            CHECK(b[0].bsums[2] == 127 + 2 + 4 - 2 + 12 && b[0].bsums[0] == 0);
            CHECK(b[1].q[3] == -127 && b[1].q[0] == 0);
        }
        free(a0);
        free(a1);
    }
    static const int rtypes[] = {GEMM_Q8_0_R16, GEMM_Q4_0_R16}; /* the repacked layout */
    for (int ti = 0; ti < 2; ti++) {
        size_t n = gemm_act_row_bytes(rtypes[ti], k);
        uint8_t *a0 = calloc(1, n), *a1 = calloc(1, n);
        gemm_ops_scalar.act_quant(rtypes[ti], x, (size_t)k, k, 1, a0, n);
        for (int l = ISA_AVX2; l < ISA_COUNT; l++) {
            const struct gemm_ops *o = gemm_ops_for((enum isa_level)l);
            if (!o)
                continue;
            memset(a1, 0, n);
            o->act_quant(rtypes[ti], x, (size_t)k, k, 1, a1, n);
            CHECK(memcmp(a0, a1, n) == 0);
        }
        const struct gemm_act_br *b = (const struct gemm_act_br *)a0;
        CHECK(b[0].d == 0.0f && b[0].corr == 0 && b[1].d == 1.0f);
        CHECK(b[1].q[0] == 127 && b[1].q[1] == 2 && b[1].q[2] == 4 && b[1].q[3] == -2);
        CHECK_EQ_INT(b[1].corr, (ti == 0 ? -128 : -8) * 159); /* 127 + 2 + 4 - 2 + 28 ones */
        CHECK(b[8].q[3] == -127 && b[8].q[0] == 0); /* x[259] = -3e30, x[256] = 1e-30 */
        free(a0);
        free(a1);
    }
    free(x);
}

TEST(row_dot_and_rmsnorm)
{
    struct rng r;
    rng_seed(&r, 99);
    static const int ns[] = {1, 15, 64, 128, 131};
    for (int in = 0; in < 5; in++) {
        const int n = ns[in];
        float *x = make_x(&r, 1, n, (size_t)n), *g = make_x(&r, 1, n, (size_t)n);
        float *o0 = malloc(sizeof(float) * n), *o1 = malloc(sizeof(float) * n);
        for (int ti = 0; ti < 3; ti++) {
            const int t = all_types[ti];
            uint8_t *w = make_weights(&r, t, 1, n, row_bytes(t, n), 0);
            const float s = gemm_ops_scalar.row_dot(t, w, x, n);
            for (int l = ISA_AVX2; l < ISA_COUNT; l++) {
                const struct gemm_ops *o = gemm_ops_for((enum isa_level)l);
                if (o)
                    CHECK(o->row_dot(t, w, x, n) == s);
            }
            free(w);
        }
        double ss = 0;
        for (int i = 0; i < n; i++)
            ss += (double)x[i] * x[i];
        const double inv = 1.0 / sqrt(ss / n + 1e-5);
        gemm_ops_scalar.rmsnorm(x, g, 1e-5f, o0, n);
        for (int i = 0; i < n; i++)
            CHECK_NEAR(o0[i], x[i] * inv * g[i], 1e-5 * fabs(x[i] * inv * g[i]) + 1e-7);
        for (int l = ISA_AVX2; l < ISA_COUNT; l++) {
            const struct gemm_ops *o = gemm_ops_for((enum isa_level)l);
            if (!o)
                continue;
            o->rmsnorm(x, g, 1e-5f, o1, n);
            CHECK(memcmp(o0, o1, sizeof(float) * n) == 0);
            memcpy(o1, x, sizeof(float) * n); /* in place, no weight */
            o->rmsnorm(o1, NULL, 1e-5f, o1, n);
            gemm_ops_scalar.rmsnorm(x, NULL, 1e-5f, o0, n);
            CHECK(memcmp(o0, o1, sizeof(float) * n) == 0);
            gemm_ops_scalar.rmsnorm(x, g, 1e-5f, o0, n);
        }
        free(x);
        free(g);
        free(o0);
        free(o1);
    }
}

/* to_f32 widens every non-NaN f16 and bf16 bit pattern exactly as the format code does
   (kern_to_f32), at lengths that leave every tail size; F32 is a copy. */
/* to_f16 (the KV cache's writes) against format/dtype.c's scalar f16 quantizer, byte for
   byte, for every ISA: random values at every magnitude f16 has (subnormals, overflow to
   inf), exact halfway cases, signed zeros, infinities and NaNs with payloads (the SIMD
   paths must not keep the hardware's NaN payload), and lengths that leave tails. */
TEST(to_f16)
{
    enum { N = 4099 };
    float *x = malloc(sizeof(float) * N);
    uint8_t *want = malloc(2 * N), *got = malloc(2 * N);
    struct rng r;
    rng_seed(&r, 5);
    for (int i = 0; i < N; i++) {
        double mag = pow(2.0, -30.0 + 48.0 * rng_uniform(&r)); /* 2^-30 .. 2^18 */
        x[i] = (float)((rng_uniform(&r) < 0.5 ? -1 : 1) * mag * (1.0 + rng_uniform(&r)));
    }
    const uint32_t special[] = {0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u,
                                0x7fc00000u, 0xffc00000u, 0x7f800001u, 0x7fc12345u,
                                0xffa5a5a5u, 0x477fe000u /* 65504 */, 0x477ff000u /* 65520 */,
                                0x33800000u /* 2^-24 */, 0x33000000u /* 2^-25: halfway */,
                                0x3f801000u /* 1 + 2^-11: halfway, even down */,
                                0x3f803000u /* 1 + 3*2^-11: halfway, even up */};
    for (size_t k = 0; k < sizeof special / sizeof special[0]; k++)
        for (int rep = 0; rep < 3; rep++) {
            float f;
            memcpy(&f, &special[k], 4);
            x[(int)(rng_u64(&r) % N)] = f;
        }
    dtype_quantize_row(DT_F16, x, want, N);
    for (int l = ISA_SCALAR; l < ISA_COUNT; l++) {
        const struct gemm_ops *o = forced_ops ? forced_ops : gemm_ops_for((enum isa_level)l);
        if (!o)
            continue;
        const int lens[] = {N, 16, 15, 1, 40};
        for (size_t k = 0; k < sizeof lens / sizeof lens[0]; k++) {
            memset(got, 0xAB, 2 * N);
            o->to_f16(x, got, lens[k]);
            CHECK(memcmp(got, want, 2 * (size_t)lens[k]) == 0);
            CHECK(lens[k] == N || got[2 * lens[k]] == 0xAB); /* nothing written past n */
        }
        if (forced_ops)
            break;
    }
    free(x), free(want), free(got);
}

TEST(to_f32)
{
    enum { N = 65536 };
    uint16_t *h = malloc(sizeof(uint16_t) * N);
    float *want = malloc(sizeof(float) * N), *got = malloc(sizeof(float) * N);
    int n = 0;
    for (int t = 0; t < 2; t++) {
        const int type = t ? DT_BF16 : DT_F16;
        n = 0;
        for (uint32_t b = 0; b < N; b++) {
            const bool nan = t ? (b & 0x7f80) == 0x7f80 && (b & 0x7f)
                               : (b & 0x7c00) == 0x7c00 && (b & 0x3ff);
            if (!nan)
                h[n++] = (uint16_t)b;
        }
        kern_to_f32(type, h, want, n);
        for (int l = ISA_SCALAR; l < ISA_COUNT; l++) {
            const struct gemm_ops *o = gemm_ops_for((enum isa_level)l);
            if (!o)
                continue;
            for (int len = 0; len <= 33; len++) { /* every tail, from odd offsets */
                memset(got, 0xff, sizeof(float) * 64);
                o->to_f32(type, h + 7 * len, got, len);
                CHECK(memcmp(got, want + 7 * len, sizeof(float) * (size_t)len) == 0);
                CHECK(got[len] != got[len]); /* nothing past len written (still NaN) */
            }
            memset(got, 0, sizeof(float) * N);
            o->to_f32(type, h, got, n);
            CHECK(memcmp(got, want, sizeof(float) * (size_t)n) == 0);
            o->to_f32(DT_F32, want, got, 100);
            CHECK(memcmp(got, want, sizeof(float) * 100) == 0);
        }
    }
    free(h);
    free(want);
    free(got);
}

TEST(check_shapes)
{
    struct weld_err e = {0};
    CHECK_EQ_INT(gemm_check(DT_Q8_0, 64, "blk.0.attn_q.weight", &e), WELD_OK);
    CHECK_EQ_INT(gemm_check(DT_Q4_K, 300, "blk.0.ffn_up.weight", &e), WELD_ERR_INVALID_ARG);
    CHECK(strstr(e.msg, "blk.0.ffn_up.weight") && strstr(e.msg, "300") && strstr(e.msg, "256"));
    CHECK_EQ_INT(gemm_check(DT_Q5_1, 64, "w", &e), WELD_ERR_UNSUPPORTED);
    CHECK(strstr(e.msg, "q5_1") != NULL);
    CHECK_EQ_INT(gemm_check(DT_F32, 0, "w", &e), WELD_ERR_INVALID_ARG);
    CHECK_EQ_INT(gemm_act_row_bytes(DT_Q4_0, 64), sizeof(struct gemm_act_b64));
    CHECK_EQ_INT(gemm_act_row_bytes(DT_Q8_0, 96), 2 * sizeof(struct gemm_act_b64));
    CHECK_EQ_INT(gemm_act_row_bytes(DT_Q6_K, 512), 2 * sizeof(struct gemm_act_bk));
    CHECK_EQ_INT(gemm_act_row_bytes(DT_F16, 512), 0);
    CHECK_EQ_INT(gemm_act_row_bytes(DT_BF16, 512), 1024);
    CHECK_EQ_INT(gemm_act_row_bytes(DT_BF16, 33), 128); /* zeros up to a multiple of 32 */
}

int main(void)
{
    const char *forced = getenv("WELD_ISA");
    if (forced && *forced) {
        struct weld_err e = {0};
        enum isa_level want;
        int st = isa_init(&e);
        if (isa_resolve(forced, &want, NULL) != WELD_OK) {
            /* The CPU lacks it: the kernels cannot be tested here (Skipped), and the
               refusal must name what is missing. */
            if (st != WELD_ERR_UNSUPPORTED || !strstr(e.msg, "lacks")) {
                fprintf(stderr, "WELD_ISA=%s: isa_init gave %d \"%s\", want a refusal "
                        "naming what this CPU lacks\n", forced, st, e.msg);
                return 1;
            }
            return test_skip_all("%s", e.msg);
        }
        forced_ops = gemm_ops_get();
        printf("WELD_ISA=%s: running every case on %s only\n", forced, isa_name(forced_ops->isa));
        if (forced_ops->isa != want) {
            fprintf(stderr, "gemm_ops_get() gave %s\n", isa_name(forced_ops->isa));
            return 1;
        }
    }
    RUN(check_shapes);
    RUN(act_quant_edges);
    RUN(row_dot_and_rmsnorm);
    RUN(to_f32);
    RUN(to_f16);
    RUN(float_types);
    RUN(q8_0);
    RUN(q4_0);
    RUN(q4_K);
    RUN(q6_K);
    RUN(repacked);
    RUN(repacked_kquants);
    RUN(repacked_floats);
    RUN(bf16_contract);
    return test_summary();
}
