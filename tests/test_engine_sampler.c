/*
 * Tests for src/engine/sampler.c.
 *
 * References are computed here independently, in double precision and by brute force
 * (full sorts, direct softmax): the distribution sampler_probs reports, the top-p prefix,
 * the min-p set, hand-worked penalty arithmetic. Sampling itself is checked with a
 * chi-square test of many seeded draws against the reference distribution (df = 7,
 * threshold 24.3, p = 0.001; the seed is fixed, so the outcome is deterministic).
 */
#include "core/alloc.h"
#include "core/rng.h"
#include "engine/sampler.h"
#include "test.h"

#include <float.h>
#include <time.h>

static struct sampler *make(struct sampler_params p, int n_vocab)
{
    struct sampler *s = NULL;
    struct weld_err e;
    if (sampler_create(&s, &p, n_vocab, &e) != WELD_OK)
        fprintf(stderr, "sampler_create: %s\n", e.msg);
    return s;
}

/* softmax(l / t) in double */
static void ref_softmax(const float *l, int n, double t, double *out)
{
    double m = -INFINITY, z = 0;
    for (int i = 0; i < n; i++)
        m = fmax(m, l[i] / t);
    for (int i = 0; i < n; i++)
        z += out[i] = exp(l[i] / t - m);
    for (int i = 0; i < n; i++)
        out[i] /= z;
}

static int sample1(struct sampler *s, const float *l)
{
    int tok = -1;
    struct weld_err e;
    if (sampler_sample(s, l, &tok, &e) != WELD_OK)
        fprintf(stderr, "sampler_sample: %s\n", e.msg);
    return tok;
}

static void random_logits(float *l, int n, uint64_t seed, double scale)
{
    struct rng r;
    rng_seed(&r, seed);
    for (int i = 0; i < n; i++)
        l[i] = (float)(rng_normal(&r) * scale);
}

TEST(greedy_picks_argmax_lowest_index_on_ties)
{
    struct sampler_params p = sampler_params_default();
    p.temperature = 0;
    p.top_k = 1000;
    p.top_p = 0.01f;
    p.min_p = 0.9f;
    struct sampler *s = make(p, 6);
    REQUIRE(s);
    float l1[6] = {0.5f, 3.0f, -1.0f, 2.9f, 3.0f, -INFINITY};
    CHECK_EQ_INT(sample1(s, l1), 1);
    float l2[6] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -7.0f};
    CHECK_EQ_INT(sample1(s, l2), 5);
    float probs[6];
    CHECK_EQ_INT(sampler_probs(s, l1, probs, NULL), WELD_OK);
    CHECK(probs[1] == 1.0f && probs[4] == 0.0f && probs[0] == 0.0f);
    sampler_free(s);
    /* a large random row */
    float *l = malloc(50000 * sizeof *l);
    random_logits(l, 50000, 7, 3.0);
    int best = 0;
    for (int i = 1; i < 50000; i++)
        if (l[i] > l[best])
            best = i;
    s = make(p, 50000);
    CHECK_EQ_INT(sample1(s, l), best);
    sampler_free(s);
    free(l);
}

TEST(top_k_1_equals_greedy_at_any_temperature)
{
    float l[1000];
    const float temps[] = {0.05f, 0.7f, 1.0f, 3.0f, 100.0f};
    for (int row = 0; row < 20; row++) {
        random_logits(l, 1000, 100 + (uint64_t)row, 2.0);
        if (row == 3)
            l[17] = l[923] = 50.0f; /* a tie: the lower index wins */
        int best = 0;
        for (int i = 1; i < 1000; i++)
            if (l[i] > l[best])
                best = i;
        for (size_t t = 0; t < sizeof temps / sizeof temps[0]; t++) {
            struct sampler_params p = sampler_params_default();
            p.temperature = temps[t];
            p.top_k = 1;
            p.seed = (uint64_t)row;
            struct sampler *s = make(p, 1000);
            for (int k = 0; k < 5; k++)
                CHECK_EQ_INT(sample1(s, l), best);
            sampler_free(s);
        }
    }
}

/* chi-square of n_draws draws against expected probabilities (cells with p > 0) */
static double chi_square(struct sampler *s, const float *l, int n, const double *ref,
                         int n_draws, int *outside)
{
    long counts[64] = {0};
    *outside = 0;
    for (int d = 0; d < n_draws; d++) {
        int t = sample1(s, l);
        if (t < 0 || t >= n || ref[t] == 0.0)
            (*outside)++;
        else
            counts[t]++;
    }
    double chi = 0;
    for (int i = 0; i < n; i++)
        if (ref[i] > 0) {
            double ex = ref[i] * n_draws;
            chi += (counts[i] - ex) * (counts[i] - ex) / ex;
        }
    return chi;
}

TEST(empirical_distribution_matches_softmax)
{
    const float l[8] = {1.0f, 0.2f, -0.5f, 2.0f, 0.0f, 1.5f, -1.0f, 0.7f};
    const float temps[] = {0.7f, 1.0f, 1.8f};
    for (size_t t = 0; t < 3; t++) {
        struct sampler_params p = sampler_params_default();
        p.temperature = temps[t];
        p.seed = 1234 + t;
        struct sampler *s = make(p, 8);
        REQUIRE(s);
        double ref[8];
        ref_softmax(l, 8, temps[t], ref);
        float probs[8];
        CHECK_EQ_INT(sampler_probs(s, l, probs, NULL), WELD_OK);
        for (int i = 0; i < 8; i++)
            CHECK_NEAR(probs[i], ref[i], 1e-6);
        int outside;
        double chi = chi_square(s, l, 8, ref, 200000, &outside);
        CHECK_EQ_INT(outside, 0);
        CHECK(chi < 24.3); /* df 7, p = 0.001 */
        if (chi >= 24.3)
            fprintf(stderr, "  T=%g chi2=%g\n", (double)temps[t], chi);
        sampler_free(s);
    }
    /* top-k = 3 at T = 1: the renormalized top three */
    struct sampler_params p = sampler_params_default();
    p.top_k = 3;
    p.seed = 99;
    struct sampler *s = make(p, 8);
    double ref[8];
    ref_softmax(l, 8, 1.0, ref);
    double z = ref[3] + ref[5] + ref[0];
    for (int i = 0; i < 8; i++)
        ref[i] = (i == 3 || i == 5 || i == 0) ? ref[i] / z : 0.0;
    int outside;
    double chi = chi_square(s, l, 8, ref, 100000, &outside);
    CHECK_EQ_INT(outside, 0);
    CHECK(chi < 13.8); /* df 2, p = 0.001 */
    sampler_free(s);
}

/* logits log(p) for p = 1/2, 1/4, 1/8, ... (the last two equal so they sum to 1) */
static void halving_logits(float *l, int n)
{
    for (int i = 0; i < n; i++)
        l[i] = (float)log(pow(0.5, i + 1 < n ? i + 1 : n - 1));
}

static int support(const float *probs, int n, int *set)
{
    int k = 0;
    for (int i = 0; i < n; i++)
        if (probs[i] > 0)
            set[k++] = i;
    return k;
}

TEST(top_p_keeps_smallest_set_reaching_p)
{
    float l[8], probs[8];
    int set[8];
    halving_logits(l, 8);
    /* shuffle positions so order is not index order */
    float sh[8] = {l[5], l[1], l[7], l[0], l[3], l[2], l[6], l[4]};
    struct { float top_p; int want; } cases[] = {
        {0.4f, 1}, {0.6f, 2}, {0.7f, 2}, {0.8f, 3}, {0.9f, 4}, {0.99f, 7}, {1.0f, 8}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        struct sampler_params p = sampler_params_default();
        p.top_p = cases[c].top_p;
        struct sampler *s = make(p, 8);
        CHECK_EQ_INT(sampler_probs(s, sh, probs, NULL), WELD_OK);
        int k = support(probs, 8, set);
        CHECK_EQ_INT(k, cases[c].want);
        /* the kept ones are the most probable, renormalized */
        double kept = 0;
        for (int i = 0; i < cases[c].want; i++)
            kept += pow(0.5, i + 1);
        if (cases[c].want == 8)
            kept = 1.0;
        CHECK_NEAR(probs[3], 0.5 / kept, 1e-6); /* position of p = 1/2 */
        if (cases[c].want >= 2)
            CHECK_NEAR(probs[1], 0.25 / kept, 1e-6);
        sampler_free(s);
    }
}

static int cmp_desc_double(const void *a, const void *b)
{
    const double *x = a, *y = b;
    return x[0] > y[0] ? -1 : x[0] < y[0] ? 1 : (x[1] < y[1] ? -1 : 1);
}

/* Large vocabularies: the support of sampler_probs equals a brute-force top-p prefix. */
TEST(top_p_large_vocab_matches_brute_force)
{
    const int n = 151936;
    float *l = malloc((size_t)n * sizeof *l), *probs = malloc((size_t)n * sizeof *probs);
    double *ref = malloc((size_t)n * sizeof *ref), *pairs = malloc((size_t)n * 2 * sizeof *pairs);
    const double scales[] = {1.0, 4.0, 12.0};
    const float top_ps[] = {0.9f, 0.5f, 0.95f};
    for (int c = 0; c < 3; c++) {
        random_logits(l, n, 500 + (uint64_t)c, scales[c]);
        ref_softmax(l, n, 1.0, ref);
        for (int i = 0; i < n; i++) {
            pairs[2 * i] = ref[i];
            pairs[2 * i + 1] = i;
        }
        qsort(pairs, (size_t)n, 2 * sizeof *pairs, cmp_desc_double);
        int want = 0;
        double cum = 0;
        while (want < n && cum < top_ps[c])
            cum += pairs[2 * want++];
        struct sampler_params p = sampler_params_default();
        p.top_p = top_ps[c];
        struct sampler *s = make(p, n);
        REQUIRE(s);
        CHECK_EQ_INT(sampler_probs(s, l, probs, NULL), WELD_OK);
        int k = 0, bad = 0;
        for (int i = 0; i < n; i++)
            k += probs[i] > 0;
        for (int j = 0; j < want; j++)
            bad += !(probs[(int)pairs[2 * j + 1]] > 0);
        /* cumulative sums in float vs double may differ on the one boundary token */
        CHECK(abs(k - want) <= 1);
        CHECK(bad <= 1);
        if (abs(k - want) > 1 || bad > 1)
            fprintf(stderr, "  scale %g: kept %d, brute force %d, missing %d\n", scales[c], k,
                    want, bad);
        int tok = sample1(s, l);
        CHECK(tok >= 0 && tok < n && probs[tok] > 0);
        sampler_free(s);
    }
    free(l);
    free(probs);
    free(ref);
    free(pairs);
}

TEST(min_p_drops_tokens_below_fraction_of_max)
{
    float l[8], probs[8];
    int set[8];
    halving_logits(l, 8);
    struct { float min_p; int want; } cases[] = {{0.6f, 1}, {0.3f, 2}, {0.2f, 3}, {0.1f, 4},
                                                 {0.001f, 8}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        struct sampler_params p = sampler_params_default();
        p.min_p = cases[c].min_p;
        struct sampler *s = make(p, 8);
        CHECK_EQ_INT(sampler_probs(s, l, probs, NULL), WELD_OK);
        CHECK_EQ_INT(support(probs, 8, set), cases[c].want);
        for (int i = 0; i < cases[c].want; i++)
            CHECK_EQ_INT(set[i], i);
        sampler_free(s);
    }
    /* min-p relative to the temperature-scaled distribution: at T = 2, p_i/p_0 = 2^(-i/2) */
    struct sampler_params p = sampler_params_default();
    p.temperature = 2.0f;
    p.min_p = 0.3f; /* keeps i with 2^(-i/2) >= 0.3: i <= 3 */
    struct sampler *s = make(p, 8);
    CHECK_EQ_INT(sampler_probs(s, l, probs, NULL), WELD_OK);
    CHECK_EQ_INT(support(probs, 8, set), 4);
    sampler_free(s);
}

TEST(repetition_penalty_hand_computed)
{
    struct sampler_params p = sampler_params_default();
    p.repetition_penalty = 2.0f;
    struct sampler *s = make(p, 5);
    const float l[5] = {2.0f, -2.0f, 1.0f, 0.5f, 3.0f};
    CHECK_EQ_INT(sampler_accept(s, 0, true), WELD_OK);  /* prompt: 2 -> 1 */
    CHECK_EQ_INT(sampler_accept(s, 1, false), WELD_OK); /* output: -2 -> -4 */
    CHECK_EQ_INT(sampler_accept(s, 4, false), WELD_OK); /* output: 3 -> 1.5 */
    CHECK_EQ_INT(sampler_accept(s, 4, false), WELD_OK); /* counted once */
    const float want[5] = {1.0f, -4.0f, 1.0f, 0.5f, 1.5f};
    double ref[5];
    float probs[5];
    ref_softmax(want, 5, 1.0, ref);
    CHECK_EQ_INT(sampler_probs(s, l, probs, NULL), WELD_OK);
    for (int i = 0; i < 5; i++)
        CHECK_NEAR(probs[i], ref[i], 1e-6);
    sampler_free(s);
    /* greedy after the penalty: 3 -> 1.5 still beats 1.0; with penalty 4: 0.75 loses */
    p.temperature = 0;
    p.repetition_penalty = 4.0f;
    s = make(p, 5);
    sampler_accept(s, 4, true);
    CHECK_EQ_INT(sample1(s, l), 0);
    sampler_free(s);
}

TEST(frequency_and_presence_penalties_hand_computed)
{
    struct sampler_params p = sampler_params_default();
    p.frequency_penalty = 0.5f;
    p.presence_penalty = 0.25f;
    p.temperature = 0.5f;
    struct sampler *s = make(p, 5);
    const float l[5] = {0, 0, 0, 0, 0};
    sampler_accept(s, 1, true); /* prompt only: untouched */
    sampler_accept(s, 2, false);
    sampler_accept(s, 2, false);
    sampler_accept(s, 3, false);
    sampler_accept(s, 1, true);
    /* 2: -(2 * 0.5 + 0.25) = -1.25; 3: -(0.5 + 0.25) = -0.75; then / T */
    const float want[5] = {0, 0, -1.25f, -0.75f, 0};
    double ref[5];
    float probs[5];
    ref_softmax(want, 5, 0.5, ref);
    CHECK_EQ_INT(sampler_probs(s, l, probs, NULL), WELD_OK);
    for (int i = 0; i < 5; i++)
        CHECK_NEAR(probs[i], ref[i], 1e-6);
    sampler_free(s);

    /* both kinds: repetition first (divide 1.0 by 2), then subtract 0.5 + 0.25 */
    p.repetition_penalty = 2.0f;
    p.temperature = 1.0f;
    s = make(p, 3);
    const float l2[3] = {1.0f, 1.0f, -1.0f};
    sampler_accept(s, 0, false);
    sampler_accept(s, 2, false);
    const float want2[3] = {0.5f - 0.75f, 1.0f, -2.0f - 0.75f};
    double ref2[3];
    ref_softmax(want2, 3, 1.0, ref2);
    CHECK_EQ_INT(sampler_probs(s, l2, probs, NULL), WELD_OK);
    for (int i = 0; i < 3; i++)
        CHECK_NEAR(probs[i], ref2[i], 1e-6);
    /* reset forgets the history */
    sampler_reset(s);
    ref_softmax(l2, 3, 1.0, ref2);
    CHECK_EQ_INT(sampler_probs(s, l2, probs, NULL), WELD_OK);
    for (int i = 0; i < 3; i++)
        CHECK_NEAR(probs[i], ref2[i], 1e-6);
    sampler_free(s);
}

TEST(long_history_grows_and_penalizes_every_token)
{
    const int n = 20000;
    struct sampler_params p = sampler_params_default();
    p.presence_penalty = 1.0f;
    struct sampler *s = make(p, n);
    float *l = calloc((size_t)n, sizeof *l), *probs = malloc((size_t)n * sizeof *probs);
    for (int t = 0; t < n; t += 2)
        CHECK_EQ_INT(sampler_accept(s, t, false), WELD_OK);
    CHECK_EQ_INT(sampler_probs(s, l, probs, NULL), WELD_OK);
    int ok = 1;
    for (int t = 2; t < n; t += 2)
        ok &= fabsf(probs[t] / probs[t + 1] - expf(-1.0f)) < 1e-5f && probs[t] == probs[0];
    CHECK(ok);
    CHECK_EQ_INT(sampler_accept(s, n, false), WELD_ERR_INVALID_ARG);
    CHECK_EQ_INT(sampler_accept(s, -1, true), WELD_ERR_INVALID_ARG);
    sampler_free(s);
    free(l);
    free(probs);
}

TEST(same_seed_same_tokens_different_seed_differs)
{
    float l[1000];
    random_logits(l, 1000, 42, 1.0);
    struct sampler_params p = sampler_params_default();
    p.temperature = 1.0f;
    p.top_p = 0.95f;
    p.top_k = 200;
    p.seed = 777;
    struct sampler *a = make(p, 1000), *b = make(p, 1000);
    p.seed = 778;
    struct sampler *c = make(p, 1000);
    int seq_a[100], same = 1, differ = 0;
    for (int i = 0; i < 100; i++) {
        seq_a[i] = sample1(a, l);
        int tb = sample1(b, l), tc = sample1(c, l);
        same &= seq_a[i] == tb;
        differ += seq_a[i] != tc;
    }
    CHECK(same);
    CHECK(differ > 50);
    sampler_reset(a);
    int again = 1;
    for (int i = 0; i < 100; i++)
        again &= sample1(a, l) == seq_a[i];
    CHECK(again);
    sampler_free(a);
    sampler_free(b);
    sampler_free(c);
}

TEST(top_logprobs_match_brute_force)
{
    const int n = 5000;
    float *l = malloc((size_t)n * sizeof *l);
    random_logits(l, n, 9, 2.0);
    l[100] = l[200] = 20.0f; /* a tie at the top: lower index first */
    double lse, m = -INFINITY, z = 0;
    for (int i = 0; i < n; i++)
        m = fmax(m, l[i]);
    for (int i = 0; i < n; i++)
        z += exp(l[i] - m);
    lse = m + log(z);
    double *pairs = malloc((size_t)n * 2 * sizeof *pairs);
    for (int i = 0; i < n; i++) {
        pairs[2 * i] = l[i];
        pairs[2 * i + 1] = i;
    }
    qsort(pairs, (size_t)n, 2 * sizeof *pairs, cmp_desc_double);
    int32_t ids[20];
    float lp[20];
    CHECK_EQ_INT(sampler_top_logprobs(l, n, 20, ids, lp), 20);
    CHECK_EQ_INT(ids[0], 100);
    CHECK_EQ_INT(ids[1], 200);
    for (int i = 0; i < 20; i++) {
        CHECK_EQ_INT(ids[i], (int)pairs[2 * i + 1]);
        CHECK_NEAR(lp[i], pairs[2 * i] - lse, 1e-5);
    }
    CHECK_NEAR(sampler_logprob(l, n, 7), l[7] - lse, 1e-5);
    CHECK(isinf(sampler_logprob(l, n, n)));
    const float small[3] = {0.0f, 0.0f, log(2.0f)};
    CHECK_EQ_INT(sampler_top_logprobs(small, 3, 10, ids, lp), 3);
    CHECK(ids[0] == 2 && ids[1] == 0 && ids[2] == 1);
    CHECK_NEAR(lp[0], log(0.5), 1e-6);
    CHECK_NEAR(lp[2], log(0.25), 1e-6);
    CHECK_EQ_INT(sampler_top_logprobs(small, 3, 0, ids, lp), 0);
    /* from the first pass (the LM head's top and statistics at inv_t 1): the same bits */
    const int nch = logits_n_chunks(n);
    float *cmax = malloc((size_t)nch * sizeof *cmax), *csum = malloc((size_t)nch * sizeof *csum);
    struct logits_top top = {.inv_t = 1.0f, .chunk_max = cmax, .chunk_sum = csum};
    logits_top_scan(&top, l, n, 0);
    logits_stats_chunks(&top, l, n, 0, nch, NULL);
    const double lse_top = sampler_log_sum_exp(l, n, &top);
    CHECK(lse_top == sampler_log_sum_exp(l, n, NULL));
    CHECK_NEAR(lse_top, lse, 1e-6);
    int32_t ids2[20];
    float lp2[20];
    CHECK_EQ_INT(sampler_top_logprobs(l, n, 20, ids, lp), 20);
    CHECK_EQ_INT(sampler_top_logprobs_ex(l, n, 20, &top, lse_top, ids2, lp2), 20);
    CHECK(!memcmp(ids, ids2, sizeof ids) && !memcmp(lp, lp2, sizeof lp));
    csum[3] *= 2.0f; /* statistics that lie move the normalizer: they are used */
    CHECK(sampler_log_sum_exp(l, n, &top) != lse_top);
    top.inv_t = 0.5f; /* ... at inv_t 1 only */
    CHECK(sampler_log_sum_exp(l, n, &top) == lse_top);
    free(cmax), free(csum);
    free(l);
    free(pairs);
}

TEST(bad_input_is_reported)
{
    struct weld_err e;
    struct sampler *s = NULL;
    struct sampler_params p = sampler_params_default();
    p.top_p = 0.0f;
    CHECK_EQ_INT(sampler_create(&s, &p, 10, &e), WELD_ERR_INVALID_ARG);
    CHECK(s == NULL && strstr(e.msg, "top_p"));
    p = sampler_params_default();
    p.temperature = -1.0f;
    CHECK_EQ_INT(sampler_create(&s, &p, 10, &e), WELD_ERR_INVALID_ARG);
    CHECK(strstr(e.msg, "temperature") != NULL);
    p = sampler_params_default();
    p.min_p = 1.5f;
    CHECK_EQ_INT(sampler_params_check(&p, &e), WELD_ERR_INVALID_ARG);
    CHECK(strstr(e.msg, "min_p") != NULL);
    p = sampler_params_default();
    p.repetition_penalty = 0.0f;
    CHECK_EQ_INT(sampler_params_check(&p, &e), WELD_ERR_INVALID_ARG);
    p = sampler_params_default();
    p.frequency_penalty = NAN;
    CHECK_EQ_INT(sampler_params_check(&p, &e), WELD_ERR_INVALID_ARG);
    p = sampler_params_default();
    CHECK_EQ_INT(sampler_create(&s, &p, 0, &e), WELD_ERR_INVALID_ARG);

    REQUIRE(sampler_create(&s, &p, 4, &e) == WELD_OK);
    int tok = -7;
    float nan_row[4] = {0, NAN, 1, 2};
    CHECK_EQ_INT(sampler_sample(s, nan_row, &tok, &e), WELD_ERR_INVALID_ARG);
    CHECK(strstr(e.msg, "logits[1]") && strstr(e.msg, "NaN"));
    float inf_row[4] = {0, 1, INFINITY, 2};
    CHECK_EQ_INT(sampler_sample(s, inf_row, &tok, &e), WELD_ERR_INVALID_ARG);
    CHECK(strstr(e.msg, "logits[2]") && strstr(e.msg, "+inf"));
    float ninf_row[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
    CHECK_EQ_INT(sampler_sample(s, ninf_row, &tok, &e), WELD_ERR_INVALID_ARG);
    CHECK(strstr(e.msg, "-inf") != NULL);
    float some_ninf[4] = {-INFINITY, 0.0f, -INFINITY, 0.0f};
    for (int i = 0; i < 50; i++) {
        CHECK_EQ_INT(sampler_sample(s, some_ninf, &tok, &e), WELD_OK);
        CHECK(tok == 1 || tok == 3);
    }
    sampler_free(s);
    sampler_free(NULL);

    /* allocation failures in create and on the first sample */
    for (long k = 1; k <= 3; k++) {
        alloc_fail_at(k);
        int rc = sampler_create(&s, &p, 4, &e);
        if (rc == WELD_OK) {
            rc = sampler_sample(s, some_ninf, &tok, &e);
            sampler_free(s);
        }
        long failed = alloc_failed_count();
        alloc_fail_at(0);
        CHECK(failed ? rc == WELD_ERR_NOMEM : rc == WELD_OK);
    }
}

TEST(speed_at_vocab_150k)
{
    const int n = 151936;
    float *l = malloc((size_t)n * sizeof *l);
    random_logits(l, n, 3, 3.0);
    struct sampler_params p = sampler_params_default();
    p.temperature = 0.8f;
    p.top_p = 0.9f;
    p.repetition_penalty = 1.1f;
    struct sampler *s = make(p, n);
    for (int t = 0; t < 500; t++)
        sampler_accept(s, (t * 7919) % n, t < 300);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int iters = 20, ok = 1;
    for (int i = 0; i < iters; i++)
        ok &= sample1(s, l) >= 0;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double ms = ((t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) * 1e-6) / iters;
    printf("sampler: %.2f ms per token at vocab %d (top_p 0.9, T 0.8)\n", ms, n);
    CHECK(ok);
    CHECK(ms < 200.0); /* generous: catches accidental quadratic behaviour, also under ASan */
    sampler_free(s);
    free(l);
}

/* ---- the first pass (sampler_sample_ex with the LM head's top) ----------------------- */

/* The row with edits applied, as the request used to hand the sampler a masked copy. */
static void apply_edits(const float *l, int n, const struct sampler_edits *ed, float *out)
{
    memcpy(out, l, (size_t)n * sizeof *l);
    for (int k = 0; ed && k < ed->n; k++)
        out[ed->ids[k]] = ed->vals[k];
    for (int i = 0; ed && ed->allow && i < n; i++)
        if (!(ed->allow[i / 32] >> (i % 32) & 1))
            out[i] = -INFINITY;
}

/* A constraint's mask over n tokens: 0 every token but a few, 1 about half, 2 about 1%,
   3 a handful (often the row's best), 4 whole chunks off and on; at least one allowed. */
static void random_mask(uint32_t *m, int n, struct rng *g, const struct logits_top *top)
{
    const int kind = (int)(rng_u64(g) % 5), W = (n + 31) / 32;
    for (int w = 0; w < W; w++)
        m[w] = kind == 0 ? ~0u : 0;
    for (int i = 0; i < n; i++) {
        const uint64_t r = rng_u64(g) % 1000;
        bool on = kind == 0 ? r >= 5 : kind == 1 ? r < 500 : kind == 2 ? r < 10
                : kind == 4 ? (i / 256) % 3 == 1 && r < 900 : false;
        if (kind != 0)
            m[i / 32] |= (uint32_t)on << (i % 32);
        else if (!on)
            m[i / 32] &= ~(1u << (i % 32));
    }
    for (int k = 0; kind == 3 && k < 6; k++) {
        int id = k % 2 && top->n ? top->ids[rng_u64(g) % (uint64_t)top->n]
                                 : (int)(rng_u64(g) % (uint64_t)n);
        m[id / 32] |= 1u << (id % 32);
    }
    const int any = (int)(rng_u64(g) % (uint64_t)n);
    m[any / 32] |= 1u << (any % 32);
}

/* One seeded case: the same params and history on three samplers, drawing 40 tokens each
   from the same row: (a) the first pass (top of the raw row + edits), (b) the full pass
   with the edits, (c) the full pass on an edited copy. All must give the same tokens and
   the same errors. */
static long long stats_hits; /* temperature-path draws on the top's statistics */

static int first_pass_case(const float *l, int n, struct sampler_params p,
                           const struct sampler_edits *ed, const int32_t *hist, int n_hist,
                           long long *hits)
{
    struct sampler *a = make(p, n), *b = make(p, n), *c = make(p, n);
    for (int i = 0; i < n_hist; i++) {
        sampler_accept(a, hist[i], i % 3 == 0);
        sampler_accept(b, hist[i], i % 3 == 0);
        sampler_accept(c, hist[i], i % 3 == 0);
    }
    struct logits_top top = {0};
    logits_top_scan(&top, l, n, 0);
    /* the temperature path's statistics, as the LM head makes them (of the raw row) */
    const int nch = logits_n_chunks(n);
    float *cmax = malloc((size_t)nch * sizeof *cmax), *csum = malloc((size_t)nch * sizeof *csum);
    top.inv_t = sampler_stats_inv_t(&p, n);
    top.chunk_max = cmax;
    top.chunk_sum = csum;
    if (top.inv_t > 0.0f)
        logits_stats_chunks(&top, l, n, 0, nch, NULL);
    float *edited = malloc((size_t)n * sizeof *edited);
    apply_edits(l, n, ed, edited);
    int bad = 0;
    for (int draw = 0; draw < 40; draw++) {
        int ta = -1, tb = -1, tc = -1;
        struct weld_err ea, eb, ec;
        int ra = sampler_sample_ex(a, l, &top, ed, &ta, &ea);
        int rb = sampler_sample_ex(b, l, NULL, ed, &tb, &eb);
        int rc = sampler_sample(c, edited, &tc, &ec);
        if (ra != rb || rb != rc || ta != tb || tb != tc ||
            (ra && (strcmp(ea.msg, eb.msg) || strcmp(eb.msg, ec.msg)))) {
            fprintf(stderr, "  draw %d: first pass %d (%d), full %d (%d), copy %d (%d)%s%s\n",
                    draw, ta, ra, tb, rb, tc, rc, ra ? ": " : "", ra ? ea.msg : "");
            bad++;
            break;
        }
        if (ra)
            break;
        if (draw % 4 == 3) { /* the history moves on */
            sampler_accept(a, ta, false);
            sampler_accept(b, ta, false);
            sampler_accept(c, ta, false);
        }
    }
    *hits += sampler_top_hits(a);
    stats_hits += sampler_stats_hits(a);
    CHECK_EQ_INT(sampler_top_hits(b), 0);
    CHECK_EQ_INT(sampler_stats_hits(b), 0);
    free(edited);
    free(cmax);
    free(csum);
    sampler_free(a);
    sampler_free(b);
    sampler_free(c);
    return bad;
}

TEST(first_pass_gives_the_full_pass_token)
{
    const int n = 3000;
    float *l = malloc((size_t)n * sizeof *l);
    struct rng g;
    rng_seed(&g, 99);
    int32_t ids[80], hist[200];
    float vals[80];
    int failures = 0, cases = 0, masked_cases = 0;
    long long hits = 0;
    for (int it = 0; it < 600; it++) {
        int kind = (int)(rng_u64(&g) % 4);
        for (int i = 0; i < n; i++) /* 0: normal; 1: few levels (ties); 2: sharp; 3: NaN/inf */
            l[i] = kind == 1 ? (float)(rng_u64(&g) % 5) : (float)(rng_normal(&g) * (kind == 2 ? 8 : 1));
        if (kind == 3) {
            uint64_t r = rng_u64(&g) % 3;
            l[rng_u64(&g) % (uint64_t)n] = r == 0 ? NAN : r == 1 ? INFINITY : -INFINITY;
        }
        struct sampler_params p = sampler_params_default();
        p.seed = rng_u64(&g);
        int mode = (int)(rng_u64(&g) % 7);
        p.temperature = mode == 0 ? 0.0f : 0.3f + (float)(rng_u64(&g) % 10) / 10.0f;
        const int ks[] = {0, 1, 2, 5, 40, 63, 64, 65, 200};
        p.top_k = ks[rng_u64(&g) % 9];
        if (mode >= 3 && mode <= 5)
            p.top_p = 0.5f + (float)(rng_u64(&g) % 50) / 100.0f;
        if (mode >= 4) /* 6: min-p alone */
            p.min_p = (float)(1 + rng_u64(&g) % 20) / 100.0f;
        if (rng_u64(&g) % 3 == 0)
            p.repetition_penalty = rng_u64(&g) % 2 ? 1.3f : 0.7f;
        if (rng_u64(&g) % 3 == 0) {
            p.frequency_penalty = 0.5f;
            p.presence_penalty = rng_u64(&g) % 2 ? 0.25f : -0.5f;
        }
        int n_hist = (int)(rng_u64(&g) % 200);
        for (int i = 0; i < n_hist; i++) /* often the row's best tokens */
            hist[i] = (int32_t)(rng_u64(&g) % (i % 2 ? 100 : (uint64_t)n));
        struct logits_top top;
        logits_top_scan(&top, l, n, 0);
        int n_ed = (int)(rng_u64(&g) % 4 == 0 ? rng_u64(&g) % 80 : 0);
        for (int k = 0; k < n_ed; k++) {
            int32_t id;
            bool dup;
            do { /* each id once: bans of the best tokens, biases anywhere */
                id = k % 2 && top.n ? top.ids[rng_u64(&g) % (uint64_t)top.n]
                                    : (int32_t)(rng_u64(&g) % (uint64_t)n);
                dup = false;
                for (int j = 0; j < k; j++)
                    dup |= ids[j] == id;
            } while (dup);
            ids[k] = id;
            vals[k] = k % 3 == 0 ? -INFINITY : l[id] + (float)(rng_normal(&g) * 5);
        }
        struct sampler_edits ed = {ids, vals, n_ed, NULL};
        uint32_t mask[(3000 + 31) / 32];
        if (rng_u64(&g) % 3 == 0) {
            random_mask(mask, n, &g, &top);
            ed.allow = mask;
            masked_cases++;
        }
        failures += first_pass_case(l, n, p, n_ed || ed.allow ? &ed : NULL, hist, n_hist, &hits);
        cases++;
        if (failures) {
            fprintf(stderr, "  case %d: kind %d, T %g, top_k %d, top_p %g, min_p %g, rep %g, "
                    "freq %g, pres %g, history %d, edits %d\n", it, kind,
                    (double)p.temperature, p.top_k, (double)p.top_p, (double)p.min_p,
                    (double)p.repetition_penalty, (double)p.frequency_penalty,
                    (double)p.presence_penalty, n_hist, n_ed);
            break;
        }
    }
    CHECK_EQ_INT(failures, 0);
    CHECK_EQ_INT(cases, 600);
    CHECK(masked_cases > 150);
    printf("first pass: %lld of %d draws from the LM head's top, %lld temperature draws "
           "on its statistics; %d cases under a mask\n", hits, 600 * 40, stats_hits,
           masked_cases);
    CHECK(hits > 600 * 40 / 5); /* greedy or top-k <= 64 without NaN: about half the cases */
    CHECK(stats_hits > 200); /* top_k 0, no top-p or min-p, no NaN: ~1/30 of the cases */
    free(l);
}

/* Draws of a (on top's first pass and statistics) and b (its own pass) from the same raw
   row that differ, out of n. */
static int draws_differ(struct sampler *a, struct sampler *b, const float *l,
                        const struct logits_top *top, int n)
{
    int differ = 0;
    for (int d = 0; d < n; d++) {
        int ta = -1, tb = -2;
        struct weld_err e;
        sampler_sample_ex(a, l, top, NULL, &ta, &e);
        sampler_sample_ex(b, l, NULL, NULL, &tb, &e);
        differ += ta != tb;
    }
    return differ;
}

/* Top-p without top-k on peaked rows (the prefix ends within the candidates) and on flat
   ones (it does not: the full pass), with and without min-p. */
TEST(first_pass_top_p)
{
    const int n = 5000;
    float *l = malloc((size_t)n * sizeof *l);
    struct rng g;
    rng_seed(&g, 17);
    int failures = 0;
    long long hits = 0;
    for (int it = 0; it < 120; it++) {
        double scale = it % 3 == 0 ? 1.0 : it % 3 == 1 ? 6.0 : 20.0;
        for (int i = 0; i < n; i++)
            l[i] = (float)(rng_normal(&g) * scale);
        if (it % 10 == 9) /* ties among the best */
            for (int i = 0; i < 8; i++)
                l[(i * 37) % n] = 90.0f;
        struct sampler_params p = sampler_params_default();
        p.temperature = 0.5f + (float)(it % 4) * 0.25f;
        p.top_p = 0.6f + (float)(it % 7) * 0.05f;
        p.min_p = it % 2 ? 0.02f : 0.0f;
        p.seed = (uint64_t)it;
        failures += first_pass_case(l, n, p, NULL, NULL, 0, &hits);
    }
    /* weights that tie although the logits differ (a high temperature flattens an ulp
       away): the full pass ranks the tokens outside the candidates (lower ids, logit 4)
       before the ones inside (logit 4 + ulp); the first pass must not cut there */
    for (int it = 0; it < 40; it++) {
        for (int i = 0; i < n; i++)
            l[i] = i < 300 ? 4.0f : i < 500 ? nextafterf(4.0f, 5.0f) : i < 510 ? 5.0f : -30.0f;
        struct sampler_params p = sampler_params_default();
        p.temperature = 1000.0f;
        p.top_p = 0.003f + (float)it * 0.0002f;
        p.seed = (uint64_t)it;
        long long h = 0;
        failures += first_pass_case(l, n, p, NULL, NULL, 0, &h);
    }
    /* the total weight comes from the LM head's chunk statistics: statistics that lie
       (every chunk's sum halved: the prefix is cut at half the mass) change the draws */
    {
        for (int i = 0; i < n; i++)
            l[i] = (float)(rng_normal(&g) * 8.0); /* peaked: the prefix within the top 64 */
        struct sampler_params p = sampler_params_default();
        p.top_p = 0.9f;
        p.seed = 5;
        const int nch = logits_n_chunks(n);
        float *cmax = malloc((size_t)nch * sizeof *cmax), *csum = malloc((size_t)nch * sizeof *csum);
        struct logits_top top = {.inv_t = sampler_stats_inv_t(&p, n), .chunk_max = cmax,
                                 .chunk_sum = csum};
        CHECK(top.inv_t == 1.0f);
        logits_top_scan(&top, l, n, 0);
        logits_stats_chunks(&top, l, n, 0, nch, NULL);
        struct sampler *a = make(p, n), *b = make(p, n);
        CHECK_EQ_INT(draws_differ(a, b, l, &top, 100), 0);
        printf("  peaked top-p rows: %lld of 100 draws on the statistics, %lld from the top\n",
               sampler_stats_hits(a), sampler_top_hits(a));
        CHECK(sampler_stats_hits(a) == 100 && sampler_top_hits(a) == 100);
        for (int c = 0; c < nch; c++)
            csum[c] *= 0.5f;
        CHECK(draws_differ(a, b, l, &top, 100) > 0);
        sampler_free(a), sampler_free(b);
        free(cmax), free(csum);
    }
    /* min-p alone: peaked rows take their survivors from the candidates, flat ones (the
       cut falls below the 64th) the full pass; the same tokens either way */
    long long mp_hits = 0;
    for (int it = 0; it < 40; it++) {
        for (int i = 0; i < n; i++)
            l[i] = (float)(rng_normal(&g) * (it % 2 ? 8.0 : 0.5));
        struct sampler_params p = sampler_params_default();
        p.temperature = 0.7f + (float)(it % 3) * 0.3f;
        p.min_p = 0.02f + (float)(it % 5) * 0.05f;
        p.seed = 900 + (uint64_t)it;
        failures += first_pass_case(l, n, p, NULL, NULL, 0, &mp_hits);
    }
    printf("first pass, min-p alone: %lld of %d draws\n", mp_hits, 40 * 40);
    CHECK(mp_hits >= 20 * 40 && mp_hits < 40 * 40); /* the peaked half, not the flat one */
    printf("first pass, top-p: %lld of %d draws\n", hits, 120 * 40);
    CHECK_EQ_INT(failures, 0);
    CHECK(hits > 120 * 40 / 3);
    CHECK(hits < 120 * 40); /* the flat rows take the full pass */
    free(l);
}

static double now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec * 1e-6;
}

/* The temperature path at a 128k vocabulary (not a whole number of chunks): drawing on
   the LM head's chunk statistics gives the tokens of the sampler's own pass and of a
   plain sampler on an edited copy, with edits and penalties (their chunks recomputed);
   statistics that lie (one chunk's sum changed) change the draws, so they are used. */
TEST(temperature_path_on_statistics)
{
    const int n = 128000 + 77, nch = logits_n_chunks(n);
    float *l = malloc((size_t)n * sizeof *l), *edited = malloc((size_t)n * sizeof *l);
    float *cmax = malloc((size_t)nch * sizeof *cmax), *csum = malloc((size_t)nch * sizeof *csum);
    struct rng g;
    rng_seed(&g, 4242);
    random_logits(l, n, 11, 3.0);
    int32_t ids[6] = {5, 300, 70000, 128076, 1000, 64};
    float vals[6] = {-INFINITY, 12.0f, 9.0f, 4.0f, -INFINITY, 2.0f};
    struct sampler_edits ed = {ids, vals, 6, NULL};
    apply_edits(l, n, &ed, edited);
    const float temps[] = {0.5f, 1.0f, 1.7f};
    double ms_top = 0.0, ms_full = 0.0;
    int draws = 0, mismatches = 0;
    for (int ti = 0; ti < 3; ti++) {
        struct sampler_params p = sampler_params_default();
        p.temperature = temps[ti];
        p.seed = 77 + (uint64_t)ti;
        p.repetition_penalty = ti == 1 ? 1.0f : 1.15f;
        p.presence_penalty = ti == 2 ? 0.5f : 0.0f;
        struct logits_top top = {0};
        logits_top_scan(&top, l, n, 0);
        top.inv_t = sampler_stats_inv_t(&p, n);
        top.chunk_max = cmax;
        top.chunk_sum = csum;
        CHECK(top.inv_t == 1.0f / temps[ti]);
        logits_stats_chunks(&top, l, n, 0, nch, NULL);
        struct sampler *a = make(p, n), *b = make(p, n), *c = make(p, n);
        for (int i = 0; i < 300; i++) {
            int32_t t = (int32_t)(rng_u64(&g) % (uint64_t)n);
            sampler_accept(a, t, true), sampler_accept(b, t, true), sampler_accept(c, t, true);
        }
        for (int d = 0; d < 200; d++, draws++) {
            int ta = -1, tb = -2, tc = -3;
            struct weld_err e;
            double t0 = now_ms();
            CHECK_EQ_INT(sampler_sample_ex(a, l, &top, &ed, &ta, &e), WELD_OK);
            double t1 = now_ms();
            CHECK_EQ_INT(sampler_sample_ex(b, l, NULL, &ed, &tb, &e), WELD_OK);
            ms_top += t1 - t0, ms_full += now_ms() - t1;
            CHECK_EQ_INT(sampler_sample(c, edited, &tc, &e), WELD_OK);
            mismatches += ta != tb || tb != tc;
            if (d % 8 == 7) {
                sampler_accept(a, ta, false), sampler_accept(b, ta, false);
                sampler_accept(c, ta, false);
            }
        }
        CHECK_EQ_INT(sampler_stats_hits(a), 200);
        CHECK_EQ_INT(sampler_stats_hits(b), 0);
        sampler_free(a), sampler_free(b), sampler_free(c);
        /* lying statistics: the sum of the chunk holding the best unmodified token x100 */
        int best = 0;
        for (int i = 1; i < n; i++)
            if (edited[i] > edited[best])
                best = i;
        csum[best / LOGITS_CHUNK] *= 100.0f;
        a = make(p, n), b = make(p, n);
        CHECK(draws_differ(a, b, l, &top, 200) > 0);
        sampler_free(a), sampler_free(b);
    }
    CHECK_EQ_INT(mismatches, 0);
    printf("temperature path at vocab %d: %.3f ms per token on the statistics, %.3f ms on "
           "its own pass (%d draws)\n", n, ms_top / draws, ms_full / draws, draws);
    free(l), free(edited), free(cmax), free(csum);
}

/* Vocabularies up to LOGITS_TOP_K: top holds every token. */
TEST(first_pass_small_vocab)
{
    float l[40];
    struct rng g;
    rng_seed(&g, 5);
    int32_t hist[30], ids[3] = {3, 7, 11};
    float vals[3] = {-INFINITY, 9.0f, -INFINITY};
    for (int i = 0; i < 30; i++)
        hist[i] = (int32_t)(rng_u64(&g) % 40);
    int failures = 0;
    long long hits = 0;
    for (int it = 0; it < 50; it++) {
        for (int i = 0; i < 40; i++)
            l[i] = (float)rng_normal(&g);
        struct sampler_params p = sampler_params_default();
        p.temperature = it % 2 ? 0.7f : 0.0f;
        p.top_k = 1 + it % 45;
        p.repetition_penalty = it % 4 ? 1.0f : 1.2f; /* with penalties: the full pass */
        p.seed = (uint64_t)it;
        struct sampler_edits ed = {ids, vals, 3, NULL};
        failures += first_pass_case(l, 40, p, it % 3 ? &ed : NULL, hist, 30, &hits);
    }
    CHECK_EQ_INT(failures, 0);
    CHECK(hits > 0);
}

int main(void)
{
    RUN(greedy_picks_argmax_lowest_index_on_ties);
    RUN(top_k_1_equals_greedy_at_any_temperature);
    RUN(empirical_distribution_matches_softmax);
    RUN(top_p_keeps_smallest_set_reaching_p);
    RUN(top_p_large_vocab_matches_brute_force);
    RUN(min_p_drops_tokens_below_fraction_of_max);
    RUN(repetition_penalty_hand_computed);
    RUN(frequency_and_presence_penalties_hand_computed);
    RUN(long_history_grows_and_penalizes_every_token);
    RUN(same_seed_same_tokens_different_seed_differs);
    RUN(top_logprobs_match_brute_force);
    RUN(bad_input_is_reported);
    RUN(temperature_path_on_statistics);
    RUN(speed_at_vocab_150k);
    RUN(first_pass_gives_the_full_pass_token);
    RUN(first_pass_small_vocab);
    RUN(first_pass_top_p);
    return test_summary();
}
