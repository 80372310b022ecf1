/*
 * The sampler's first pass fused into the LM head (exec/logits_top.h).
 *
 * Unit: logits_top_scan over random rows cut into random slices, then logits_top_merge,
 * against a brute-force reference (every non-NaN index sorted by larger value then lower
 * id, the first LOGITS_TOP_K kept): rows with many ties, NaN, +-inf, shorter than K, more
 * slices than the merge's cursors. End to end: runner_forward_top on tiny models, every
 * executor and several splits, prefill rows with every logit and decodes: each row's top
 * equals the reference computed from the logits the same step returned, so the executors
 * and splits agree with each other too; rows that ask for softmax statistics get, per
 * LOGITS_CHUNK chunk, the scalar kernel's bits on the returned logits, whether the LM
 * head's slices fall on chunk boundaries (a vocabulary of 8+ chunks per split) or cut
 * chunks (the backend computes those), and rows that do not ask get nothing written.
 */
#include "core/rng.h"
#include "exec/logits_top.h"
#include "kernels/cpu/gemm.h"
#include "exec/runner.h"
#include "test.h"
#include "test_models.h"

#include <stdint.h>

static const float *g_row;

static int cmp_ref(const void *a, const void *b)
{
    int32_t ia = *(const int32_t *)a, ib = *(const int32_t *)b;
    if (logits_top_better(g_row[ia], ia, g_row[ib], ib))
        return -1;
    return logits_top_better(g_row[ib], ib, g_row[ia], ia) ? 1 : 0;
}

/* The top of l[0, n) by sorting everything. */
static void reference_top(const float *l, int n, struct logits_top *t)
{
    int32_t *idx = malloc((size_t)(n ? n : 1) * sizeof *idx);
    int m = 0;
    t->n_nan = 0;
    for (int i = 0; i < n; i++) {
        if (isnan(l[i]))
            t->n_nan++;
        else
            idx[m++] = i;
    }
    g_row = l;
    qsort(idx, (size_t)m, sizeof *idx, cmp_ref);
    t->n = m < LOGITS_TOP_K ? m : LOGITS_TOP_K;
    for (int i = 0; i < t->n; i++) {
        t->ids[i] = idx[i];
        t->vals[i] = l[idx[i]];
    }
    free(idx);
}

static bool same_top(const struct logits_top *a, const struct logits_top *b)
{
    if (a->n != b->n || a->n_nan != b->n_nan)
        return false;
    for (int i = 0; i < a->n; i++)
        if (a->ids[i] != b->ids[i] || memcmp(&a->vals[i], &b->vals[i], sizeof(float)))
            return false;
    return true;
}

/* A random row: values from a small set (ties) or continuous, some NaN and infinities. */
static void random_row(struct rng *g, float *l, int n, int kind)
{
    for (int i = 0; i < n; i++) {
        uint64_t r = rng_u64(g);
        l[i] = kind == 0 ? (float)(r % 7) : (float)((double)(r % 1000003) / 1000.0 - 500.0);
        if (kind == 2 && r % 97 == 0)
            l[i] = NAN;
        if (kind == 2 && r % 89 == 0)
            l[i] = r % 2 ? INFINITY : -INFINITY;
    }
}

/* Cut [0, n) into n_parts slices (some empty), scan each, merge. */
static void sliced_top(const float *l, int n, int n_parts, struct rng *g, struct logits_top *out)
{
    int *cut = malloc((size_t)(n_parts + 1) * sizeof *cut);
    struct logits_top *parts = malloc((size_t)n_parts * sizeof *parts);
    cut[0] = 0;
    cut[n_parts] = n;
    for (int i = 1; i < n_parts; i++)
        cut[i] = (int)(rng_u64(g) % (uint64_t)(n + 1));
    for (int i = 1; i < n_parts; i++) /* insertion sort of the inner cuts */
        for (int j = i; j > 1 && cut[j - 1] > cut[j]; j--) {
            int t = cut[j];
            cut[j] = cut[j - 1];
            cut[j - 1] = t;
        }
    for (int i = 0; i < n_parts; i++)
        logits_top_scan(&parts[i], l + cut[i], cut[i + 1] - cut[i], cut[i]);
    logits_top_merge(out, parts, n_parts);
    free(cut);
    free(parts);
}

TEST(scan_and_merge_match_a_full_sort)
{
    struct rng g;
    rng_seed(&g, 7);
    const int sizes[] = {0, 1, 5, 63, 64, 65, 200, 5000};
    const int parts[] = {1, 2, 3, 7, 64, 65, 150};
    float *l = malloc(5000 * sizeof *l);
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++)
        for (int kind = 0; kind < 3; kind++)
            for (size_t pi = 0; pi < sizeof parts / sizeof parts[0]; pi++) {
                int n = sizes[si];
                random_row(&g, l, n, kind);
                struct logits_top want, got;
                reference_top(l, n, &want);
                sliced_top(l, n, parts[pi], &g, &got);
                if (!same_top(&want, &got)) {
                    fprintf(stderr, "  n %d, kind %d, %d parts: top differs\n", n, kind,
                            parts[pi]);
                    CHECK(!"top == reference");
                }
            }
    free(l);
}

TEST(all_nan_and_all_equal_rows)
{
    float l[100];
    struct logits_top t;
    for (int i = 0; i < 100; i++)
        l[i] = NAN;
    logits_top_scan(&t, l, 100, 0);
    CHECK_EQ_INT(t.n, 0);
    CHECK_EQ_INT(t.n_nan, 100);
    for (int i = 0; i < 100; i++)
        l[i] = -INFINITY;
    logits_top_scan(&t, l, 100, 1000);
    CHECK_EQ_INT(t.n, LOGITS_TOP_K);
    CHECK_EQ_INT(t.n_nan, 0);
    for (int i = 0; i < t.n; i++) /* equal values: lowest ids, in order */
        CHECK_EQ_INT(t.ids[i], 1000 + i);
}

/* Every instruction set's scan (gemm_ops.top_k where there is one, else the heap) on
   rows of every length around the kernel's 16-lane vectors and the 64 kept, with ties
   (also -0 against +0), NaN and infinities, rising and falling runs (every value enters,
   or none after the first 64), and all-NaN / all-(-inf) rows: the reference's top. */
TEST(every_isa_scans_like_the_reference)
{
    struct rng g;
    rng_seed(&g, 11);
    float *l = malloc(5000 * sizeof *l);
    const int sizes[] = {0, 1, 15, 16, 17, 63, 64, 65, 80, 255, 256, 257, 2048, 5000};
    int checked = 0;
    for (int lvl = ISA_SCALAR; lvl < ISA_COUNT; lvl++) {
        const struct gemm_ops *o = gemm_ops_for((enum isa_level)lvl);
        if (!o)
            continue;
        for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++)
            for (int kind = 0; kind < 8; kind++) {
                const int n = sizes[si];
                if (kind < 3)
                    random_row(&g, l, n, kind);
                for (int i = 0; kind >= 3 && i < n; i++) {
                    uint64_t r = rng_u64(&g);
                    l[i] = kind == 3 ? (r % 2 ? 0.0f : -0.0f)
                         : kind == 4 ? (float)i
                         : kind == 5 ? (float)-i
                         : kind == 6 ? NAN
                                     : (r % 5 ? -INFINITY : (float)(r % 3));
                }
                struct logits_top want, got;
                reference_top(l, n, &want);
                logits_top_scan_ops(&got, l, n, 77, o);
                for (int i = 0; i < want.n; i++)
                    want.ids[i] += 77;
                if (!same_top(&want, &got)) {
                    fprintf(stderr, "  %s: n %d, kind %d: top differs\n", isa_name(o->isa), n,
                            kind);
                    CHECK(!"top == reference");
                }
                checked++;
            }
    }
    CHECK(checked >= 112);
    free(l);
}

/* ---- end to end ---------------------------------------------------------------------- */

static const struct tspec spec_wide = {ARCH_LLAMA, 64,       2,    4,     2,     16,
                                       96,         700,      16,   false, false, false,
                                       false,      10000.0f, NULL, NULL};
static const struct tspec spec_big = {ARCH_LLAMA, 64,    1,     4,     2,     16,       96,   4100,
                                      16,         false, false, false, false, 10000.0f, NULL, NULL};
static const struct tspec spec_narrow = {ARCH_QWEN3, 64,         2,    4,     2,    16,
                                         96,         50,         16,   false, true, false,
                                         false,      1000000.0f, NULL, NULL};

struct cfg {
    const char *exec;
    int n_threads, n_splits;
};

static void check_forward(const struct tspec *sp, int wtype, const struct cfg *x)
{
    struct tmodel *tm = tm_build(sp, wtype, 31);
    struct backend_params bp;
    backend_params_init(&bp, 3, TM_CTX);
    bp.n_threads = x->n_threads;
    bp.n_splits = x->n_splits;
    bp.oversubscribe = true;
    bp.tuning.executor = x->exec;
    struct runner *r = NULL;
    struct weld_err e;
    int rc = runner_create_ex(&r, &tm->m, &bp, &e);
    REQUIRE(rc == WELD_OK);
    const int V = sp->vocab;
    int32_t prompt[3][9];
    struct rng g;
    rng_seed(&g, 5);
    for (int s = 0; s < 3; s++)
        for (int i = 0; i < 9; i++)
            prompt[s][i] = (int32_t)(rng_u64(&g) % (uint64_t)V);
    float *logits = malloc((size_t)27 * V * sizeof *logits);
    struct logits_top *tops = calloc(27, sizeof *tops);
    const int nch = logits_n_chunks(V);
    float *stats = malloc((size_t)27 * 2 * nch * sizeof *stats);
    float *cmax = malloc((size_t)nch * sizeof *cmax), *csum = malloc((size_t)nch * sizeof *csum);
    int len[3] = {0, 0, 0};
    for (int step = 0; step < 6; step++) {
        struct batch_seq seqs[3];
        for (int s = 0; s < 3; s++) {
            int nt = step == 0 ? 9 - 2 * s : 1;
            seqs[s] = (struct batch_seq){.seq_id = s, .tokens = prompt[s] + (step ? s : 0),
                                         .n_tokens = nt, .pos = len[s],
                                         .all_logits = step == 0 && s != 1};
            len[s] += nt;
        }
        struct batch b = {.seqs = seqs, .n_seqs = 3};
        int rows = batch_n_logit_rows(&b);
        for (int k = 0; k < rows; k++) { /* two rows in three ask, at two temperatures */
            tops[k].inv_t = k % 3 == 2 ? 0.0f : k % 3 ? 1.0f : 1.0f / 0.7f;
            tops[k].chunk_max = stats + (size_t)k * 2 * nch;
            tops[k].chunk_sum = tops[k].chunk_max + nch;
            for (int c = 0; c < 2 * nch; c++)
                tops[k].chunk_max[c] = -1234.5f; /* must be overwritten, or kept (k % 3 == 2) */
        }
        REQUIRE(runner_forward_top(r, &b, logits, tops, &e) == WELD_OK);
        for (int k = 0; k < rows; k++) {
            struct logits_top want = tops[k];
            want.chunk_max = cmax, want.chunk_sum = csum;
            bool ok = true;
            if (tops[k].inv_t > 0.0f) {
                logits_stats_chunks(&want, logits + (size_t)k * V, V, 0, nch, &gemm_ops_scalar);
                ok = !memcmp(cmax, tops[k].chunk_max, nch * sizeof *cmax) &&
                     !memcmp(csum, tops[k].chunk_sum, nch * sizeof *csum);
            } else {
                for (int c = 0; c < 2 * nch; c++)
                    ok &= tops[k].chunk_max[c] == -1234.5f;
            }
            if (!ok) {
                fprintf(stderr, "  %s, %d threads, %d splits, vocab %d: step %d row %d stats\n",
                        x->exec, x->n_threads, x->n_splits, V, step, k);
                CHECK(!"softmax statistics == the scalar kernel's");
            }
        }
        for (int k = 0; k < rows; k++) {
            struct logits_top want;
            reference_top(logits + (size_t)k * V, V, &want);
            if (!same_top(&want, &tops[k])) {
                fprintf(stderr, "  %s, %d threads, %d splits, vocab %d: step %d row %d\n",
                        x->exec, x->n_threads, x->n_splits, V, step, k);
                CHECK(!"top of the row == reference");
            }
        }
    }
    free(logits);
    free(tops);
    free(stats), free(cmax), free(csum);
    runner_free(r);
    tm_free(tm);
}

TEST(forward_tops_every_executor_and_split)
{
    const struct cfg cfgs[] = {
        {"ref", 1, 0}, {"ref", 1, 3}, {"ref", 1, 40}, {"ops", 2, 0}, {"ops", 3, 5},
        {"mega", 2, 0}, {"mega", 3, 1}, {"mega", 8, 5},
    };
    for (size_t i = 0; i < sizeof cfgs / sizeof cfgs[0]; i++) {
        check_forward(&spec_wide, DT_F32, &cfgs[i]);
        check_forward(&spec_wide, DT_Q8_0, &cfgs[i]);
        check_forward(&spec_narrow, DT_F16, &cfgs[i]);
    }
    /* 4100 ids = 16 chunks + 4: with 2 splits the LM head's slices fall on chunks, with 3
       or more they cut them */
    const struct cfg big[] = {{"ref", 1, 2}, {"mega", 2, 2}, {"ops", 2, 3}, {"mega", 3, 5}};
    for (size_t i = 0; i < sizeof big / sizeof big[0]; i++)
        check_forward(&spec_big, DT_Q8_0, &big[i]);
}

int main(void)
{
    RUN(scan_and_merge_match_a_full_sort);
    RUN(all_nan_and_all_equal_rows);
    RUN(every_isa_scans_like_the_reference);
    RUN(forward_tops_every_executor_and_split);
    return test_summary();
}
