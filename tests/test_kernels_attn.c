/*
 * attention's chunk step (kernels/cpu/attn.h) against references:
 *   - attn_exp against libm's exp in double over [-86, 0] (relative error bound) and its
 *     edges (0 at -inf, NaN and below ATTN_EXP_MIN; 1 at 0);
 *   - a whole causal attention driven chunk by chunk through gemm_ops_scalar.attn_chunk
 *     against a double-precision softmax attention: within 1e-5 relative;
 *   - every ISA this CPU has against the scalar reference: m, l and acc bit-identical
 *     after every chunk, for f32, f16 and bf16 rows read in place, head dims in whole
 *     vectors (16, 64, 128) and with partial last vectors (8, 12, 40, 100: tails of 8, 12,
 *     8 and 4 lanes), visible counts 0..16 mixed across rows, scores with large
 *     spreads (the running max moves up and down across chunks);
 *   - the softmax statistics of logits chunks (attn_softmax_stats): the scalar reference
 *     against a double-precision max and sum of exp, and every ISA bit-identical to it
 *     for lengths 1..300 and 4096, temperatures from 0.05 to 20, rows holding -inf, NaN,
 *     +inf, signed zeros and all -inf;
 *   - SiLU under the same exp (attn_silu_mul): against double, and every ISA bit-identical
 *     to the scalar reference for every tail length and edge values.
 */
#include "core/fp16.h"
#include "core/rng.h"
#include "kernels/cpu/attn.h"
#include "kernels/cpu/gemm.h"
#include "test.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

TEST(exp_poly)
{
    double worst = 0.0;
    for (int i = 0; i <= 860000; i++) {
        float x = -86.0f + (float)i * 1e-4f;
        if (x > 0.0f)
            x = 0.0f;
        double want = exp((double)x), got = attn_exp(x);
        double rel = fabs(got - want) / want;
        if (rel > worst)
            worst = rel;
    }
    printf("  attn_exp worst relative error over [-86, 0]: %.3g\n", worst);
    CHECK(worst < 4e-7);
    CHECK(attn_exp(0.0f) == 1.0f);
    CHECK(attn_exp(-INFINITY) == 0.0f);
    CHECK(attn_exp(NAN) == 0.0f);
    CHECK(attn_exp(-86.5f) == 0.0f);
    CHECK(attn_exp(-86.0f) > 0.0f);
}

static void fill(struct rng *r, float *x, size_t n, double sd)
{
    for (size_t i = 0; i < n; i++)
        x[i] = (float)(rng_normal(r) * sd);
}

/* Causal attention of nq query rows at positions pos[r] over n_pos keys, chunk by chunk
   through o->attn_chunk; out (nq, hd). */
static void run_attn(const struct gemm_ops *o, const float *q, const float *k, const float *v,
                     int hd, int nq, const int *pos, float *out, float *m, float *l)
{
    float *acc = calloc((size_t)nq * hd, sizeof(float));
    int n_max = 0, nv[64];
    for (int r = 0; r < nq; r++) {
        m[r] = -INFINITY, l[r] = 0.0f;
        if (pos[r] + 1 > n_max)
            n_max = pos[r] + 1;
    }
    for (int c0 = 0; c0 < n_max; c0 += ATTN_CHUNK) {
        for (int r = 0; r < nq; r++) {
            int n = pos[r] + 1 - c0;
            nv[r] = n < 0 ? 0 : n > ATTN_CHUNK ? ATTN_CHUNK : n;
        }
        const float *qp[64];
        for (int r = 0; r < nq; r++)
            qp[r] = q + (size_t)r * hd;
        struct attn_chunk_args a = {.kv_type = DT_F32, .hd = hd, .nq = nq, .q = qp, .n = nv,
                                    .scale = 1.0f / sqrtf((float)hd), .m = m, .l = l,
                                    .acc = acc};
        for (int j = 0; j < ATTN_CHUNK && c0 + j < n_max; j++) {
            a.k[j] = (const uint8_t *)(k + (size_t)(c0 + j) * hd);
            a.v[j] = (const uint8_t *)(v + (size_t)(c0 + j) * hd);
        }
        o->attn_chunk(&a);
    }
    for (int r = 0; r < nq; r++)
        for (int i = 0; i < hd; i++)
            out[(size_t)r * hd + i] = acc[(size_t)r * hd + i] / l[r];
    free(acc);
}

TEST(scalar_vs_double)
{
    struct rng rg;
    rng_seed(&rg, 7);
    const int hds[] = {8, 40, 64, 128};
    for (size_t h = 0; h < sizeof hds / sizeof hds[0]; h++) {
        const int hd = hds[h], nq = 5, n_pos = 203;
        /* keys padded to whole chunks: the kernel never reads rows past a visible count */
        size_t kn = (size_t)(n_pos + ATTN_CHUNK) * hd;
        float *q = malloc(sizeof(float) * nq * hd), *k = calloc(kn, sizeof(float)),
              *v = calloc(kn, sizeof(float)), *out = malloc(sizeof(float) * nq * hd);
        float m[8], l[8];
        fill(&rg, q, (size_t)nq * hd, 1.0);
        fill(&rg, k, (size_t)n_pos * hd, 1.0);
        fill(&rg, v, (size_t)n_pos * hd, 1.0);
        const int pos[5] = {0, 15, 16, 100, 202};
        run_attn(&gemm_ops_scalar, q, k, v, hd, nq, pos, out, m, l);
        double worst = 0.0;
        for (int r = 0; r < nq; r++) {
            double *s = malloc(sizeof(double) * (pos[r] + 1)), mx = -INFINITY, sum = 0.0;
            for (int j = 0; j <= pos[r]; j++) {
                double d = 0.0;
                for (int i = 0; i < hd; i++)
                    d += (double)q[r * hd + i] * k[(size_t)j * hd + i];
                s[j] = d / sqrt((double)hd);
                if (s[j] > mx)
                    mx = s[j];
            }
            for (int j = 0; j <= pos[r]; j++)
                sum += (s[j] = exp(s[j] - mx));
            for (int i = 0; i < hd; i++) {
                double want = 0.0;
                for (int j = 0; j <= pos[r]; j++)
                    want += s[j] * v[(size_t)j * hd + i];
                want /= sum;
                double err = fabs(want - out[r * hd + i]) / (fabs(want) + 0.05);
                if (err > worst)
                    worst = err;
            }
            free(s);
        }
        printf("  hd %d: worst error vs double %.3g\n", hd, worst);
        CHECK(worst < 1e-5);
        free(q), free(k), free(v), free(out);
    }
}

/* n floats stored as type t (f32 as is, f16/bf16 rounded to nearest even) into dst. */
static void store_rows(int t, const float *x, size_t n, uint8_t *dst)
{
    for (size_t i = 0; i < n; i++) {
        if (t == DT_F32) {
            memcpy(dst + 4 * i, &x[i], 4);
            continue;
        }
        uint16_t h = t == DT_F16 ? fp16_from_f32(x[i]) : bf16_from_f32(x[i]);
        memcpy(dst + 2 * i, &h, 2);
    }
}

/* Every ISA against the scalar reference for every KV row type, state compared after
   every chunk; 1-4 rows (decode: the full-chunk kernels on even chunks, where every row
   sees 16 positions, and the row-pair kernel on odd ones, where counts are random), 9 and
   70 (the transposed-keys kernel: two passes of up to 64 rows, groups of 3 and 8 with
   remainders, rows with nothing visible). On AVX-512 also attn_chunk_avx512_zmm, the
   kernels a Zen 4 host does not pick for one row. */
TEST(isa_bit_identical)
{
    struct rng rg;
    rng_seed(&rg, 11);
    const int hds[] = {16, 64, 128, 8, 40, 12, 100, 256, 264, 288, 576}; /* MLA: 288, 576 */
    const int types[] = {DT_F32, DT_F16, DT_BF16};
    for (int lvl = ISA_SCALAR + 1; lvl < ISA_COUNT; lvl++) {
        const struct gemm_ops *o = gemm_ops_for((enum isa_level)lvl);
        if (!o)
            continue;
        int diffs = 0, calls = 0;
        static const int nqs[] = {1, 2, 3, 4, 9, 70};
        for (size_t qi = 0; qi < sizeof nqs / sizeof nqs[0]; qi++)
        for (size_t ti = 0; ti < 3; ti++)
            for (size_t h = 0; h < sizeof hds / sizeof hds[0]; h++) {
                const int t = types[ti], hd = hds[h], nq = nqs[qi];
                float *q = malloc(sizeof(float) * nq * hd), *kf = malloc(sizeof(float) * 16 * hd),
                      *vf = malloc(sizeof(float) * 16 * hd);
                uint8_t *kb = malloc(4 * 16 * (size_t)hd), *vb = malloc(4 * 16 * (size_t)hd);
                float *acc0 = calloc((size_t)nq * hd, sizeof(float)),
                      *acc1 = calloc((size_t)nq * hd, sizeof(float)),
                      *acc2 = calloc((size_t)nq * hd, sizeof(float));
                float m0[70], l0[70], m1[70], l1[70], m2[70], l2[70];
                for (int r = 0; r < nq; r++)
                    m0[r] = m1[r] = m2[r] = -INFINITY, l0[r] = l1[r] = l2[r] = 0.0f;
                fill(&rg, q, (size_t)nq * hd, 1.0);
                const size_t esz = t == DT_F32 ? 4 : 2;
                for (int c = 0; c < 12; c++) {
                    /* scores spread up and down across chunks */
                    double sd = (c % 3 == 0) ? 4.0 : (c % 3 == 1) ? 0.3 : 2.0;
                    fill(&rg, kf, (size_t)16 * hd, sd);
                    fill(&rg, vf, (size_t)16 * hd, 1.0);
                    store_rows(t, kf, (size_t)16 * hd, kb);
                    store_rows(t, vf, (size_t)16 * hd, vb);
                    int nv[70];
                    for (int r = 0; r < nq; r++)
                        nv[r] = c % 2 == 0 ? 16 : (int)(rng_u64(&rg) % 17);
                    nv[0] = 16;
                    const float *qp[70];
                    for (int r = 0; r < nq; r++) /* rows in any order and place */
                        qp[r] = q + (size_t)((r * 4) % nq) * hd;
                    struct attn_chunk_args a = {.kv_type = t, .hd = hd, .nq = nq, .q = qp,
                                                .n = nv,
                                                .scale = 1.0f / sqrtf((float)hd)};
                    for (int j = 0; j < 16; j++) { /* rows in reverse: any addresses work */
                        a.k[j] = kb + (size_t)(15 - j) * hd * esz;
                        a.v[j] = vb + (size_t)(15 - j) * hd * esz;
                    }
                    a.m = m0, a.l = l0, a.acc = acc0;
                    attn_chunk_scalar(&a);
                    a.m = m1, a.l = l1, a.acc = acc1;
                    o->attn_chunk(&a);
                    calls++;
                    if (memcmp(m0, m1, sizeof(float) * nq) || memcmp(l0, l1, sizeof(float) * nq) ||
                        memcmp(acc0, acc1, sizeof(float) * nq * hd))
                        diffs++;
#if defined(__x86_64__)
                    if (lvl >= ISA_AVX512) { /* also without the per-CPU one-row choice */
                        a.m = m2, a.l = l2, a.acc = acc2;
                        attn_chunk_avx512_zmm(&a);
                        if (memcmp(m0, m2, sizeof(float) * nq) ||
                            memcmp(l0, l2, sizeof(float) * nq) ||
                            memcmp(acc0, acc2, sizeof(float) * nq * hd))
                            diffs++;
                    }
#endif
                }
                free(q), free(kf), free(vf), free(kb), free(vb), free(acc0), free(acc1),
                    free(acc2);
            }
        printf("  isa %s: %d of %d chunk calls differ from the scalar reference\n",
               isa_name(o->isa), diffs, calls);
        CHECK(diffs == 0);
    }
}

/* One chunk's statistics through every ISA, compared with the scalar bits; returns the
   number of ISAs that differ. */
static int stats_diffs(const float *l, int n, float inv_t)
{
    float m0, s0;
    int d = 0;
    attn_softmax_stats_scalar(l, n, inv_t, &m0, &s0);
    for (int lvl = ISA_SCALAR + 1; lvl < ISA_COUNT; lvl++) {
        const struct gemm_ops *o = gemm_ops_for((enum isa_level)lvl);
        if (!o)
            continue;
        float m1, s1;
        o->softmax_stats(l, n, inv_t, &m1, &s1);
        if (memcmp(&m0, &m1, sizeof m0) || memcmp(&s0, &s1, sizeof s0)) {
            printf("  isa %s, n %d, inv_t %g: m %a / %a, s %a / %a\n", isa_name(o->isa), n,
                   (double)inv_t, (double)m0, (double)m1, (double)s0, (double)s1);
            d++;
        }
    }
    return d;
}

TEST(softmax_stats)
{
    struct rng r;
    rng_seed(&r, 7);
    float *l = malloc(sizeof(float) * ATTN_STATS_MAX);
    const float inv_ts[] = {1.0f, 1.0f / 0.05f, 1.0f / 0.7f, 1.0f / 20.0f};
    int diffs = 0, calls = 0;
    double worst = 0.0;
    for (int n = 1; n <= ATTN_STATS_MAX; n = n < 300 ? n + 1 : ATTN_STATS_MAX + 1)
        for (int ti = 0; ti < 4; ti++) {
            fill(&r, l, (size_t)n, 4.0);
            float m, s;
            attn_softmax_stats_scalar(l, n, inv_ts[ti], &m, &s);
            double dm = -INFINITY, ds = 0.0;
            for (int j = 0; j < n; j++)
                dm = l[j] > dm ? l[j] : dm;
            for (int j = 0; j < n; j++)
                ds += exp(((double)l[j] - dm) * inv_ts[ti]);
            CHECK(m == (float)dm);
            double rel = fabs(s - ds) / ds;
            worst = rel > worst ? rel : worst;
            diffs += stats_diffs(l, n, inv_ts[ti]);
            calls++;
        }
    printf("  softmax stats: worst relative error of the sum %.3g over %d chunks\n", worst,
           calls);
    CHECK(worst < 2e-6);
    /* edges: -inf and NaN entries count 0 (the max skips NaN), +inf makes every finite
       entry 0 and itself NaN - NaN = 0; all -inf: max -inf, sum 0; zero max is +0 */
    const int n = 37;
    for (int j = 0; j < n; j++)
        l[j] = (float)(j % 5) - 10.0f;
    l[3] = -INFINITY;
    l[20] = NAN;
    float m, s;
    attn_softmax_stats_scalar(l, n, 1.0f, &m, &s);
    CHECK(m == -6.0f && s > 1.0f && isfinite(s));
    diffs += stats_diffs(l, n, 1.0f);
    l[30] = INFINITY;
    attn_softmax_stats_scalar(l, n, 1.0f, &m, &s);
    CHECK(isinf(m) && m > 0 && s == 0.0f);
    diffs += stats_diffs(l, n, 1.0f);
    for (int j = 0; j < n; j++)
        l[j] = j % 2 ? -0.0f : -INFINITY;
    attn_softmax_stats_scalar(l, n, 1.0f, &m, &s);
    CHECK(m == 0.0f && !signbit(m) && s == 18.0f);
    diffs += stats_diffs(l, n, 1.0f);
    for (int j = 0; j < n; j++)
        l[j] = -INFINITY;
    attn_softmax_stats_scalar(l, n, 1.0f, &m, &s);
    CHECK(isinf(m) && m < 0 && s == 0.0f);
    diffs += stats_diffs(l, n, 1.0f);
    CHECK(diffs == 0);
    free(l);
}

/* SiLU under the exp contract: against silu in double (relative error of the product
   bounded), and every ISA bit-identical to the scalar reference for lengths 1..100 (every
   tail) at scales from 1e-3 to 60, past exp's cut at -86 and with signed zeros, +-inf,
   NaN and subnormals; out aliasing gate. */
TEST(silu_mul)
{
    struct rng r;
    rng_seed(&r, 11);
    enum { N = 100 };
    float g[N], u[N], o0[N], o1[N];
    const double scales[] = {1e-3, 1.0, 4.0, 60.0};
    double worst = 0.0;
    int diffs = 0;
    for (int si = 0; si < 4; si++)
        for (int n = 1; n <= N; n++) {
            fill(&r, g, N, scales[si]);
            fill(&r, u, N, 1.0);
            if (si == 3 && n == N) {
                const float edge[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 1e-40f,
                                      -1e-40f, -86.0f, -86.5f, 86.5f, -200.0f, 200.0f};
                memcpy(g, edge, sizeof edge);
            }
            attn_silu_mul_scalar(g, u, o0, n);
            for (int i = 0; i < n; i++) {
                if (!isfinite(g[i]) || fabsf(g[i]) < 1e-30f || fabs(o0[i]) < 1e-30)
                    continue;
                const double want = (double)g[i] / (1.0 + exp(-(double)g[i])) * u[i];
                const double rel = fabs(o0[i] - want) / fabs(want);
                worst = rel > worst ? rel : worst;
            }
            for (int lvl = ISA_SCALAR + 1; lvl < ISA_COUNT; lvl++) {
                const struct gemm_ops *o = gemm_ops_for((enum isa_level)lvl);
                if (!o)
                    continue;
                memcpy(o1, g, sizeof g);
                o->silu_mul(o1, u, o1, n); /* in place */
                if (memcmp(o0, o1, sizeof(float) * (size_t)n)) {
                    printf("  isa %s, n %d, scale %g differs\n", isa_name(o->isa), n, scales[si]);
                    diffs++;
                }
            }
        }
    printf("  silu: worst relative error %.3g\n", worst);
    CHECK(worst < 1e-6);
    CHECK(diffs == 0);
    /* the edges' values: silu(0) = 0, silu(+inf) = +inf, silu(-inf) = NaN (-inf * 0),
       silu(-200) = -0 */
    const float eg[] = {0.0f, INFINITY, -200.0f, 3.0f}, eu[] = {1.0f, 1.0f, 1.0f, 2.0f};
    float eo[4];
    attn_silu_mul_scalar(eg, eu, eo, 4);
    CHECK(eo[0] == 0.0f && isinf(eo[1]) && eo[2] == 0.0f && signbit(eo[2]));
    CHECK(fabs(eo[3] - 3.0 / (1.0 + exp(-3.0)) * 2.0) < 1e-6);
}

int main(void)
{
    RUN(exp_poly);
    RUN(scalar_vs_double);
    RUN(isa_bit_identical);
    RUN(softmax_stats);
    RUN(silu_mul);
    return test_summary();
}
