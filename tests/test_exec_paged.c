/*
 * Engine block tables (the step plan of the KV block manager) through the cpu backend,
 * for every KV cache type (f32, f16, bf16, q8_0). The reference is always the same
 * sequence run alone through the internal allocator in one prefill with all logits; every
 * check below is bit-for-bit (memcmp), because a sequence's logits may not depend on where
 * its blocks are, who computed its prefix, what else is in the batch or its chunking:
 *
 *   - tables in scrambled physical order, chunked prefill, equal the internal allocator;
 *   - a second sequence whose table starts with the full prefix blocks a first one
 *     computed, starting at pos = prefix length, equals computing it alone (and the same
 *     run without the shared blocks' contents, i.e. zeroed blocks, does not);
 *   - copy-on-write fork: a shared partial last block copied before two children decode
 *     different tokens; without the copy the second child sees the first's token;
 *   - 18 sequences joining at different steps, mixing one-token decodes and prefill
 *     chunks of varying sizes, each step one batch, blocks handed out from a shuffled pool,
 *     matrix ops cut into 1-3 row slices;
 *   - the KV type is really used (f16 logits differ from f32, but little).
 * Then the checks on tables (ids, lengths, duplicates, write conflicts, copies, mixing
 * modes) and the block-size arithmetic the engine sizes its pool with.
 *
 * The model is tiny and random (llama with GQA, head_dim 32 so q8_0 applies; qwen2 with
 * biases for a second architecture), built in memory.
 */
#include "core/rng.h"
#include "exec/kv.h"
#include "exec/runner.h"
#include "test.h"

#include <limits.h>
#include <stdint.h>

#define NL 2

struct tmodel {
    struct model m;
    struct layer_weights layers[NL];
    void *mem[64];
    int n_mem;
};

static struct tensor rand_tensor(struct tmodel *tm, struct rng *r, int64_t ne0, int64_t ne1,
                                 double mean, double sd)
{
    size_t n = (size_t)(ne0 * ne1);
    float *f = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        f[i] = (float)(mean + sd * rng_normal(r));
    tm->mem[tm->n_mem++] = f;
    return (struct tensor){.type = DT_F32, .n_dims = ne1 > 1 ? 2 : 1,
                           .ne = {ne0, ne1, 1, 1}, .data = f, .nbytes = n * sizeof(float)};
}

/* dim 64, 4 query heads / 2 KV heads of 32, ffn 96, vocab 64. */
static struct tmodel *tm_build(enum model_arch arch, uint64_t seed)
{
    struct tmodel *tm = calloc(1, sizeof *tm);
    struct rng r;
    rng_seed(&r, seed);
    struct model_config *c = &tm->m.cfg;
    c->arch = arch, c->n_vocab = 64, c->dim = 64, c->n_layer = NL, c->n_head = 4;
    c->n_kv_head = 2, c->head_dim = 32, c->ffn_dim = 96, c->max_ctx = 64, c->rope_dim = 32;
    c->norm_eps = 1e-5f, c->rope_theta = 10000.0f, c->rope_neox = arch != ARCH_LLAMA;
    c->qkv_bias = arch == ARCH_QWEN2;
    const int qd = 128, kd = 64;
    tm->m.tok_embd = rand_tensor(tm, &r, 64, 64, 0, 1.0);
    tm->m.output_norm = rand_tensor(tm, &r, 64, 1, 1, 0.1);
    tm->m.output = rand_tensor(tm, &r, 64, 64, 0, 0.125);
    tm->m.layers = tm->layers;
    for (int l = 0; l < NL; l++) {
        struct layer_weights *L = &tm->layers[l];
        L->attn_norm = rand_tensor(tm, &r, 64, 1, 1, 0.1);
        L->wq = rand_tensor(tm, &r, 64, qd, 0, 0.25);
        L->wk = rand_tensor(tm, &r, 64, kd, 0, 0.25);
        L->wv = rand_tensor(tm, &r, 64, kd, 0, 0.125);
        if (c->qkv_bias) {
            L->bq = rand_tensor(tm, &r, qd, 1, 0, 0.2);
            L->bk = rand_tensor(tm, &r, kd, 1, 0, 0.2);
            L->bv = rand_tensor(tm, &r, kd, 1, 0, 0.2);
        }
        L->wo = rand_tensor(tm, &r, qd, 64, 0, 0.09);
        L->ffn_norm = rand_tensor(tm, &r, 64, 1, 1, 0.1);
        L->w_gate = rand_tensor(tm, &r, 64, 96, 0, 0.125);
        L->w_up = rand_tensor(tm, &r, 64, 96, 0, 0.125);
        L->w_down = rand_tensor(tm, &r, 96, 64, 0, 0.1);
    }
    return tm;
}

static void tm_free(struct tmodel *tm)
{
    for (int i = 0; i < tm->n_mem; i++)
        free(tm->mem[i]);
    free(tm);
}

static void rand_tokens(uint64_t seed, int32_t *t, int n)
{
    struct rng r;
    rng_seed(&r, seed);
    for (int i = 0; i < n; i++)
        t[i] = (int32_t)(rng_u64(&r) % 64);
}

static const enum weld_dtype kv_types[4] = {DT_F32, DT_F16, DT_BF16, DT_Q8_0};
#define V 64
#define BS 4

static int n_splits;  /* for make_runner: 0 (one slice) unless a test sets it */
static int kv_groups; /* for make_runner: 0 (the backend's choice) unless a test sets it */

static struct runner *make_runner(const struct model *m, int max_seqs, int kv_blocks,
                                  enum weld_dtype kv_type)
{
    struct backend_params bp;
    backend_params_init(&bp, max_seqs, 64);
    bp.tuning.executor = test_exec;
    bp.n_splits = n_splits;
    bp.tuning.kv_groups = kv_groups;
    bp.kv_block_size = BS;
    bp.kv_blocks = kv_blocks;
    bp.kv_type = kv_type;
    struct runner *r = NULL;
    struct weld_err e;
    if (runner_create_ex(&r, m, &bp, &e))
        fprintf(stderr, "runner_create_ex: %s\n", e.msg);
    return r;
}

/* Logits (n, V) of toks run alone from position 0 by the internal allocator. */
static void run_alone(const struct model *m, enum weld_dtype kv, const int32_t *toks, int n,
                      float *out)
{
    struct runner *r = make_runner(m, 1, 0, kv);
    struct weld_err e;
    struct batch_seq s = {.seq_id = 0, .tokens = toks, .n_tokens = n, .all_logits = true};
    struct batch b = {.seqs = &s, .n_seqs = 1};
    if (!r || runner_forward(r, &b, out, &e)) {
        fprintf(stderr, "run_alone failed\n");
        memset(out, 0, sizeof(float) * (size_t)n * V);
    }
    runner_free(r);
}

/* A forward step with all logits that must succeed. */
static int step(struct runner *r, const struct batch *b, float *lg)
{
    struct weld_err e;
    int rc = runner_forward(r, b, lg, &e);
    if (rc)
        fprintf(stderr, "runner_forward: %s\n", e.msg);
    return rc;
}

/* ---- scrambled tables == internal allocator ------------------------------------------ */

static void shuffle(int32_t *a, int n, uint64_t seed)
{
    struct rng r;
    rng_seed(&r, seed);
    for (int i = n - 1; i > 0; i--) {
        int j = (int)(rng_u64(&r) % (uint64_t)(i + 1));
        int32_t t = a[i];
        a[i] = a[j];
        a[j] = t;
    }
}

TEST(scrambled_tables_match_internal)
{
    enum { N = 37, POOL = 40 };
    struct tmodel *tm = tm_build(ARCH_LLAMA, 1);
    int32_t toks[N], pool[POOL];
    rand_tokens(2, toks, N);
    for (int i = 0; i < POOL; i++)
        pool[i] = i;
    shuffle(pool, POOL, 3);
    float *want = malloc(sizeof(float) * N * V), *got = malloc(sizeof(float) * N * V);
    for (int k = 0; k < 4; k++) {
        run_alone(&tm->m, kv_types[k], toks, N, want);
        struct runner *r = make_runner(&tm->m, 2, POOL, kv_types[k]);
        REQUIRE(r != NULL);
        /* chunks of 7, seq id 1, table = the shuffled pool's first 10 ids */
        for (int p = 0; p < N; p += 7) {
            int n = N - p < 7 ? N - p : 7;
            struct batch_seq s = {.seq_id = 1, .tokens = toks + p, .n_tokens = n, .pos = p,
                                  .all_logits = true, .blocks = pool, .n_blocks = 10};
            struct batch b = {.seqs = &s, .n_seqs = 1};
            REQUIRE(step(r, &b, got + (size_t)p * V) == WELD_OK);
        }
        if (memcmp(want, got, sizeof(float) * N * V) != 0) {
            fprintf(stderr, "kv %s: scrambled tables differ\n", dtype_name(kv_types[k]));
            CHECK(0);
        }
        CHECK_EQ_INT(runner_seq_len(r, 1), 0); /* engine tables: nothing kept per seq */
        runner_free(r);
    }
    free(want), free(got);
    tm_free(tm);
}

/* ---- shared prefix blocks ------------------------------------------------------------ */

/* A computes P + its own tail; B's table starts with A's P / BS full blocks and B starts
   at pos P. B's logits at positions >= P equal B alone. zero_prefix: B reads fresh
   (zeroed) blocks instead, which must give different logits. */
static void shared_prefix_case(enum model_arch arch, enum weld_dtype kv, bool zero_prefix)
{
    enum { P = 12, NA = 17, NB = 21, POOL = 32 };
    struct tmodel *tm = tm_build(arch, 5);
    int32_t a[NA], b[NB];
    rand_tokens(6, a, NA);
    memcpy(b, a, sizeof(int32_t) * P);
    rand_tokens(7, b + P, NB - P);
    float *want = malloc(sizeof(float) * NB * V), *lg = malloc(sizeof(float) * 32 * V);
    run_alone(&tm->m, kv, b, NB, want);
    struct runner *r = make_runner(&tm->m, 4, POOL, kv);
    REQUIRE(r != NULL);
    int32_t ta[8] = {9, 2, 30, 17, 5}, tb[8] = {9, 2, 30, 11, 25, 4};
    if (zero_prefix)
        tb[0] = 20, tb[1] = 21, tb[2] = 22;
    /* step 1: A prefills P + 1 tokens; step 2: A decodes one token while B prefills its
       suffix from pos P (reading A's three full blocks) in one chunk of 5; step 3: both
       go on in mixed chunks. */
    struct batch_seq s[2] = {
        {.seq_id = 0, .tokens = a, .n_tokens = P + 1, .pos = 0, .all_logits = true,
         .blocks = ta, .n_blocks = 5},
    };
    struct batch bt = {.seqs = s, .n_seqs = 1};
    REQUIRE(step(r, &bt, lg) == WELD_OK);
    s[0] = (struct batch_seq){.seq_id = 0, .tokens = a + P + 1, .n_tokens = 1, .pos = P + 1,
                              .all_logits = true, .blocks = ta, .n_blocks = 5};
    s[1] = (struct batch_seq){.seq_id = 3, .tokens = b + P, .n_tokens = 5, .pos = P,
                              .all_logits = true, .blocks = tb, .n_blocks = 6};
    bt.n_seqs = 2;
    REQUIRE(step(r, &bt, lg) == WELD_OK);
    bool same = memcmp(lg + V, want + (size_t)P * V, sizeof(float) * 5 * V) == 0;
    s[0] = (struct batch_seq){.seq_id = 0, .tokens = a + P + 2, .n_tokens = 3, .pos = P + 2,
                              .all_logits = true, .blocks = ta, .n_blocks = 5};
    s[1] = (struct batch_seq){.seq_id = 3, .tokens = b + P + 5, .n_tokens = NB - P - 5,
                              .pos = P + 5, .all_logits = true, .blocks = tb, .n_blocks = 6};
    REQUIRE(step(r, &bt, lg) == WELD_OK);
    same = same && memcmp(lg + 3 * V, want + (size_t)(P + 5) * V,
                          sizeof(float) * (NB - P - 5) * V) == 0;
    if (same == zero_prefix) {
        fprintf(stderr, "kv %s arch %d zero_prefix %d: prefix reuse %s\n", dtype_name(kv),
                (int)arch, zero_prefix, same ? "unexpectedly matches" : "differs");
        CHECK(0);
    }
    runner_free(r);
    free(want), free(lg);
    tm_free(tm);
}

TEST(shared_prefix_blocks)
{
    for (int k = 0; k < 4; k++) {
        shared_prefix_case(ARCH_LLAMA, kv_types[k], false);
        shared_prefix_case(ARCH_QWEN2, kv_types[k], false);
    }
    shared_prefix_case(ARCH_LLAMA, DT_F16, true);
}

/* ---- copy-on-write fork ---------------------------------------------------------------- */

/* Prompt of 10 (blocks 7, 3 full, block 12 holds positions 8..9); fork: child table
   {7, 3, 15} with copy 12 -> 15; parent decodes x, child decodes y in one batch, then one
   more token each. Compared with prompt+x+.. and prompt+y+.. alone. */
static void fork_case(enum weld_dtype kv, bool do_copy)
{
    enum { P = 10, N = 12, POOL = 16 };
    struct tmodel *tm = tm_build(ARCH_LLAMA, 8);
    int32_t pa[N], pb[N];
    rand_tokens(9, pa, N);
    memcpy(pb, pa, sizeof(int32_t) * P);
    pb[P] = (pa[P] + 1) % V, pb[P + 1] = (pa[P + 1] + 7) % V;
    float *wa = malloc(sizeof(float) * N * V), *wb = malloc(sizeof(float) * N * V);
    float *lg = malloc(sizeof(float) * 16 * V);
    run_alone(&tm->m, kv, pa, N, wa);
    run_alone(&tm->m, kv, pb, N, wb);
    struct runner *r = make_runner(&tm->m, 2, POOL, kv);
    REQUIRE(r != NULL);
    int32_t ta[3] = {7, 3, 12}, tb[3] = {7, 3, 15};
    struct batch_seq s[2] = {{.seq_id = 0, .tokens = pa, .n_tokens = P, .all_logits = true,
                              .blocks = ta, .n_blocks = 3}};
    struct batch bt = {.seqs = s, .n_seqs = 1};
    REQUIRE(step(r, &bt, lg) == WELD_OK);
    bool ok = memcmp(lg, wa, sizeof(float) * P * V) == 0;
    struct kv_block_copy cp = {12, 15};
    for (int i = 0; i < 2; i++) {
        s[0] = (struct batch_seq){.seq_id = 0, .tokens = pa + P + i, .n_tokens = 1,
                                  .pos = P + i, .all_logits = true, .blocks = ta,
                                  .n_blocks = 3};
        s[1] = (struct batch_seq){.seq_id = 1, .tokens = pb + P + i, .n_tokens = 1,
                                  .pos = P + i, .all_logits = true, .blocks = tb,
                                  .n_blocks = 3};
        bt = (struct batch){.seqs = s, .n_seqs = 2, .copies = &cp, .n_copies = i == 0 && do_copy};
        REQUIRE(step(r, &bt, lg) == WELD_OK);
        ok = ok && memcmp(lg, wa + (size_t)(P + i) * V, sizeof(float) * V) == 0;
        bool child = memcmp(lg + V, wb + (size_t)(P + i) * V, sizeof(float) * V) == 0;
        if (child != do_copy) {
            fprintf(stderr, "kv %s copy %d step %d: child %s\n", dtype_name(kv), do_copy, i,
                    child ? "unexpectedly matches" : "differs");
            CHECK(0);
        }
    }
    CHECK(ok);
    runner_free(r);
    free(wa), free(wb), free(lg);
    tm_free(tm);
}

TEST(copy_on_write_fork)
{
    for (int k = 0; k < 4; k++)
        fork_case(kv_types[k], true);
    fork_case(DT_F16, false);
}

/* ---- many sequences, mixed decode and prefill ------------------------------------------ */

#define NSEQ 18
#define MAXLEN 30

struct mseq {
    int32_t toks[MAXLEN];
    int n, start, cur, k;   /* length, first step, tokens fed, chunks taken */
    int chunks[4];          /* chunk sizes, cycled; 1 = decode-like */
    int32_t table[(MAXLEN + BS - 1) / BS];
    int n_table;
};

/* Sequences of 12..29 tokens joining at steps 0..2 with chunk patterns mixing one-token
   steps and chunks up to 5 (so all 18 run at step 2); blocks come from a shuffled pool as
   a sequence grows. */
static void mixed_case(enum model_arch arch, enum weld_dtype kv, uint64_t seed)
{
    enum { POOL = NSEQ * 8 + 5 };
    struct tmodel *tm = tm_build(arch, seed);
    struct mseq *q = calloc(NSEQ, sizeof *q);
    struct rng r;
    rng_seed(&r, seed);
    int32_t pool[POOL];
    for (int i = 0; i < POOL; i++)
        pool[i] = i;
    shuffle(pool, POOL, seed + 1);
    int next_block = 0;
    for (int i = 0; i < NSEQ; i++) {
        q[i].n = 12 + (int)(rng_u64(&r) % 18);
        q[i].start = (int)(rng_u64(&r) % 3);
        for (int c = 0; c < 4; c++)
            q[i].chunks[c] = rng_u64(&r) % 2 ? 1 : 2 + (int)(rng_u64(&r) % 4);
        rand_tokens(seed * 100 + (uint64_t)i, q[i].toks, q[i].n);
    }
    float *lg = malloc(sizeof(float) * NSEQ * MAXLEN * V);
    float *got = malloc(sizeof(float) * NSEQ * MAXLEN * V);
    n_splits = (int)(seed % 4); /* 0..3 row slices for the mixed runs, 0 for alone */
    struct runner *run = make_runner(&tm->m, NSEQ, POOL, kv);
    n_splits = 0;
    REQUIRE(run != NULL);
    int max_mix = 0;
    for (int st = 0;; st++) {
        struct batch_seq bs[NSEQ];
        int idx[NSEQ], n = 0, n_dec = 0;
        for (int i = 0; i < NSEQ; i++) {
            struct mseq *m = &q[i];
            if (st < m->start || m->cur >= m->n)
                continue;
            int c = m->chunks[m->k++ % 4];
            c = c < m->n - m->cur ? c : m->n - m->cur;
            while (m->n_table * BS < m->cur + c)
                m->table[m->n_table++] = pool[next_block++];
            bs[n] = (struct batch_seq){.seq_id = i, .tokens = m->toks + m->cur, .n_tokens = c,
                                       .pos = m->cur, .all_logits = true, .blocks = m->table,
                                       .n_blocks = m->n_table};
            n_dec += c == 1;
            idx[n++] = i;
        }
        if (n == 0) {
            bool left = false;
            for (int i = 0; i < NSEQ; i++)
                left |= q[i].cur < q[i].n;
            if (!left)
                break;
            continue;
        }
        if (n_dec > 0 && n_dec < n && n > max_mix)
            max_mix = n;
        struct batch b = {.seqs = bs, .n_seqs = n};
        REQUIRE(step(run, &b, lg) == WELD_OK);
        for (int j = 0, row = 0; j < n; j++) {
            struct mseq *m = &q[idx[j]];
            memcpy(got + ((size_t)idx[j] * MAXLEN + m->cur) * V, lg + (size_t)row * V,
                   sizeof(float) * (size_t)bs[j].n_tokens * V);
            row += bs[j].n_tokens;
            m->cur += bs[j].n_tokens;
        }
    }
    CHECK(max_mix >= 16); /* at least one step mixed decodes and prefills of 16+ seqs */
    float *want = malloc(sizeof(float) * MAXLEN * V);
    for (int i = 0; i < NSEQ; i++) {
        run_alone(&tm->m, kv, q[i].toks, q[i].n, want);
        if (memcmp(want, got + (size_t)i * MAXLEN * V, sizeof(float) * (size_t)q[i].n * V)) {
            fprintf(stderr, "kv %s: mixed batch seq %d (n %d) differs from alone\n",
                    dtype_name(kv), i, q[i].n);
            CHECK(0);
        }
    }
    runner_free(run);
    free(want), free(got), free(lg), free(q);
    tm_free(tm);
}

TEST(many_sequences_mixed)
{
    mixed_case(ARCH_LLAMA, DT_F16, 11);
    mixed_case(ARCH_QWEN2, DT_Q8_0, 12);
    mixed_case(ARCH_LLAMA, DT_BF16, 13);
    mixed_case(ARCH_QWEN2, DT_F32, 14);
    /* the same in the two other layouts (exec/kv.h): one head group, one per head */
    kv_groups = 1;
    mixed_case(ARCH_LLAMA, DT_F16, 15);
    kv_groups = 2;
    mixed_case(ARCH_QWEN2, DT_Q8_0, 16);
    kv_groups = 0;
}

/* ---- the KV layout changes no number ----------------------------------------------------- */

/* A prompt of 23 tokens (6 blocks of 4) in a cache of one head group (block-major), two
   (one per head here), more than the heads (clamped), and the backend's choice (the
   splits), with attention cut into 1 or 2 head ranges: the same logits to the bit. A bad
   kv_groups is refused by name. */
TEST(kv_layouts_agree)
{
    enum { N = 23 };
    struct tmodel *tm = tm_build(ARCH_LLAMA, 31);
    int32_t toks[N];
    rand_tokens(32, toks, N);
    static float want[N * V], got[N * V];
    static const int groups[4] = {0, 1, 2, 9};
    for (int ti = 0; ti < 4; ti++)
        for (int ns = 1; ns <= 2; ns++)
            for (int gi = 0; gi < 4; gi++) {
                n_splits = ns;
                kv_groups = groups[gi];
                run_alone(&tm->m, kv_types[ti], toks, N, gi ? got : want);
                kv_groups = 0;
                if (gi)
                    CHECK(memcmp(want, got, sizeof want) == 0);
            }
    n_splits = 0;
    for (int gi = 1; gi < 4; gi++) { /* the layout is what was asked for */
        kv_groups = groups[gi];
        struct runner *r = make_runner(&tm->m, 2, 0, DT_F16);
        REQUIRE(r != NULL);
        char in[40];
        snprintf(in, sizeof in, "in %d head group", gi == 1 ? 1 : 2);
        CHECK(strstr(runner_describe(r), in) != NULL);
        runner_free(r);
    }
    kv_groups = 0;
    struct backend_params bp;
    backend_params_init(&bp, 1, 64);
    bp.tuning.executor = test_exec;
    struct runner *r = NULL;
    struct weld_err e;
    bp.tuning.kv_groups = -2;
    CHECK_EQ_INT(runner_create_ex(&r, &tm->m, &bp, &e), WELD_ERR_INVALID_ARG);
    CHECK(r == NULL && strstr(e.msg, "kv_groups -2") != NULL);
    tm_free(tm);
}

/* ---- the KV type is used --------------------------------------------------------------- */

TEST(kv_type_is_used)
{
    enum { N = 20 };
    struct tmodel *tm = tm_build(ARCH_LLAMA, 15);
    int32_t toks[N];
    rand_tokens(16, toks, N);
    float *out[4];
    for (int k = 0; k < 4; k++) {
        out[k] = malloc(sizeof(float) * N * V);
        run_alone(&tm->m, kv_types[k], toks, N, out[k]);
    }
    for (int k = 1; k < 4; k++) {
        double md = 0, mx = 0;
        for (int i = 0; i < N * V; i++) {
            md = fmax(md, fabs((double)out[k][i] - out[0][i]));
            mx = fmax(mx, fabs((double)out[0][i]));
        }
        CHECK(md > 0);               /* stored in the type, not in f32 */
        CHECK(md / mx < 2e-2);       /* and read back correctly */
        if (k == 1)
            CHECK(md / mx < 2e-3);   /* f16 is close */
    }
    for (int k = 0; k < 4; k++)
        free(out[k]);
    tm_free(tm);
}

/* ---- rows: heads written independently, read back as the dtype converters say ------------ */

TEST(kv_rows_per_head)
{
    enum { HD = 32, NH = 3, KD = HD * NH };
    float src[KD], back[HD], want[KD];
    struct rng r;
    rng_seed(&r, 20);
    for (int i = 0; i < KD; i++)
        src[i] = (float)rng_normal(&r) * (i < HD ? 0.01f : 3.0f);
    /* each type in four layouts: one sequence (per-head by default), two (block-major by
       default), two heads groups of unequal size ([0, 1) and [1, 3)), and 5 groups asked
       for (clamped to one per head) */
    static const int lay_seqs[4] = {1, 2, 2, 1}, lay_groups[4] = {0, 0, 2, 5},
                     lay_g[4] = {NH, 1, 2, NH};
    for (int k = 0; k < 16; k++) {
        const int ms = lay_seqs[k / 4], G = lay_g[k / 4];
        struct kv_config kc = {.n_layer = 2, .kv_dim = KD, .head_dim = HD, .max_seqs = ms,
                               .max_ctx = 8, .block_size = 4, .n_blocks = 3,
                               .n_groups = lay_groups[k / 4], .type = kv_types[k % 4]};
        struct kv_cache *kv = NULL;
        struct weld_err e;
        REQUIRE(kv_create(&kv, &kc, &e) == WELD_OK);
        CHECK_EQ_INT(kv->n_groups, G);
        CHECK(kv->row_bytes == dtype_row_bytes(kv_types[k % 4], KD));
        uint8_t *whole = malloc(kv->row_bytes);
        for (int h = NH - 1; h >= 0; h--) /* any order: heads share no quantization block */
            kv_write_head(kv, kv_slot_head(kv, kv->v, 1, 2, 3, h), src + h * HD);
        dtype_quantize_row(kv_types[k % 4], src, whole, KD);
        dtype_dequantize_row(kv_types[k % 4], whole, want, KD);
        for (int h = 0; h < NH; h++) {
            uint8_t *at = kv_slot_head(kv, kv->v, 1, 2, 3, h);
            /* each head's bytes equal that head's slice of the whole row quantized at once */
            CHECK(memcmp(at, whole + h * kv->head_bytes, kv->head_bytes) == 0);
            const float *got = kv_read_head(kv, at, back);
            CHECK(memcmp(got, want + h * HD, sizeof(float) * HD) == 0);
            CHECK((got == back) == (kv_types[k % 4] != DT_F32)); /* f32 is read in place */
            /* (layer 1, block 2, head h, slot 3) of V, nowhere in K: (layer, head group,
               block, head in group, slot), group g of G holding heads [g NH / G, (g + 1)
               NH / G) */
            int g = 0;
            while ((g + 1) * NH / G <= h)
                g++;
            const int g0 = g * NH / G, gn = (g + 1) * NH / G - g0;
            CHECK_EQ_INT(kv->head_group_end[h], g0 + gn);
            CHECK(at == kv->v + ((((size_t)1 * NH + g0) * 3 + 2 * gn + (h - g0)) * 4 + 3) *
                                    kv->head_bytes);
            /* the group's tiles of a block follow one another, and its blocks too */
            if (h + 1 < g0 + gn)
                CHECK(kv_slot_head(kv, kv->v, 1, 2, 0, h) + 4 * kv->head_bytes ==
                      kv_slot_head(kv, kv->v, 1, 2, 0, h + 1));
            CHECK(kv_slot_head(kv, kv->v, 1, 1, 0, g0 + gn - 1) + 4 * kv->head_bytes ==
                  kv_slot_head(kv, kv->v, 1, 2, 0, g0));
        }
        /* one head's positions of a block are contiguous */
        CHECK(kv_slot_head(kv, kv->v, 1, 2, 1, 1) + kv->head_bytes ==
              kv_slot_head(kv, kv->v, 1, 2, 2, 1));
        kv_copy_block(kv, 2, 0);
        for (int h = 0; h < NH; h++)
            CHECK(memcmp(kv_slot_head(kv, kv->v, 1, 0, 3, h), whole + h * kv->head_bytes,
                         kv->head_bytes) == 0);
        free(whole);
        kv_free(kv);
    }
}

/* ---- table checks ------------------------------------------------------------------------ */

static int fwd(struct runner *r, const struct batch_seq *s, int n,
               const struct kv_block_copy *cp, int n_cp, float *lg, struct weld_err *e)
{
    struct batch b = {.seqs = s, .n_seqs = n, .copies = cp, .n_copies = n_cp};
    return runner_forward(r, &b, lg, e);
}

/* copies_fill: a block completed elsewhere (a proposer's scratch) and copied into the block
   a sequence then reads gives the logits of that block computed in place. */
TEST(copy_fills_a_read_block)
{
    struct tmodel *tm = tm_build(ARCH_LLAMA, 19);
    int32_t t[12];
    rand_tokens(20, t, 12);
    float *a = malloc(sizeof(float) * V), *b = malloc(sizeof(float) * V);
    struct weld_err e;
    struct runner *r = make_runner(&tm->m, 2, 8, DT_F16);
    REQUIRE(r != NULL);
    /* in place: blocks 0, 1 hold positions 0..7, then position 8 in block 2 */
    int32_t ta[3] = {0, 1, 2}, tb[3] = {0, 5, 6};
    struct batch_seq s = {.seq_id = 0, .tokens = t, .n_tokens = 8, .blocks = ta, .n_blocks = 3};
    CHECK_EQ_INT(fwd(r, &s, 1, NULL, 0, a, &e), WELD_OK);
    s = (struct batch_seq){
        .seq_id = 0, .tokens = t + 8, .n_tokens = 1, .pos = 8, .blocks = ta, .n_blocks = 3};
    CHECK_EQ_INT(fwd(r, &s, 1, NULL, 0, a, &e), WELD_OK);
    /* block 1 copied to 5 in the step that reads it from 5 */
    struct kv_block_copy cp = {1, 5};
    s.blocks = tb;
    struct batch bt = {.seqs = &s, .n_seqs = 1, .copies = &cp, .n_copies = 1};
    CHECK_EQ_INT(runner_forward(r, &bt, b, &e), WELD_ERR_INVALID_ARG);
    bt.copies_fill = true;
    CHECK_EQ_INT(runner_forward(r, &bt, b, &e), WELD_OK);
    CHECK(memcmp(a, b, sizeof(float) * V) == 0);
    runner_free(r);
    free(a), free(b);
    tm_free(tm);
}

TEST(table_errors)
{
    struct tmodel *tm = tm_build(ARCH_LLAMA, 17);
    int32_t t[16];
    rand_tokens(18, t, 16);
    float *lg = malloc(sizeof(float) * 32 * V);
    struct weld_err e;
    struct runner *r = make_runner(&tm->m, 4, 8, DT_F16);
    REQUIRE(r != NULL);
    int32_t ta[4] = {0, 1, 2, 3}, tb[4] = {4, 5, 6, 7}, bad[2] = {0, 8}, dup[2] = {5, 5};
    int32_t rd[2] = {0, 5};
    struct batch_seq s[2] = {{.seq_id = 0, .tokens = t, .n_tokens = 6, .blocks = ta,
                              .n_blocks = 1}};
    CHECK_EQ_INT(fwd(r, s, 1, NULL, 0, lg, &e), WELD_ERR_INVALID_ARG); /* 6 need 2 blocks */
    CHECK(strstr(e.msg, "has 1 entries") != NULL && strstr(e.msg, "need 2 blocks") != NULL);
    s[0].blocks = bad, s[0].n_blocks = 2;
    CHECK_EQ_INT(fwd(r, s, 1, NULL, 0, lg, &e), WELD_ERR_INVALID_ARG);
    CHECK(strstr(e.msg, "entry 1 = 8 is not a block id in [0, 8)") != NULL);
    s[0].blocks = dup;
    CHECK_EQ_INT(fwd(r, s, 1, NULL, 0, lg, &e), WELD_ERR_INVALID_ARG);
    CHECK(strstr(e.msg, "block 5 appears twice") != NULL);
    s[0].blocks = ta, s[0].n_blocks = 4;
    s[1] = (struct batch_seq){.seq_id = 1, .tokens = t, .n_tokens = 2, .blocks = ta + 1,
                              .n_blocks = 1};
    CHECK_EQ_INT(fwd(r, s, 2, NULL, 0, lg, &e), WELD_ERR_INVALID_ARG); /* both write 1 */
    CHECK(strstr(e.msg, "both write block 1") != NULL);
    s[1] = (struct batch_seq){.seq_id = 1, .tokens = t, .n_tokens = 1, .pos = 4,
                              .blocks = rd, .n_blocks = 2}; /* reads block 0, A writes it */
    CHECK_EQ_INT(fwd(r, s, 2, NULL, 0, lg, &e), WELD_ERR_INVALID_ARG);
    CHECK(strstr(e.msg, "block 0, which batch seq 0 writes") != NULL);
    s[1] = (struct batch_seq){.seq_id = 1, .tokens = t, .n_tokens = 1};
    CHECK_EQ_INT(fwd(r, s, 2, NULL, 0, lg, &e), WELD_ERR_INVALID_ARG); /* tables mixed */
    CHECK(strstr(e.msg, "every sequence or on none") != NULL);
    s[1] = (struct batch_seq){.seq_id = 1, .tokens = t, .n_tokens = 2, .blocks = tb,
                              .n_blocks = 4};
    struct kv_block_copy cp[2] = {{6, 6}, {2, 8}};
    CHECK_EQ_INT(fwd(r, s, 2, cp, 1, lg, &e), WELD_ERR_INVALID_ARG);
    CHECK(strstr(e.msg, "block copy 0 (6 -> 6)") != NULL);
    CHECK_EQ_INT(fwd(r, s, 2, cp + 1, 1, lg, &e), WELD_ERR_INVALID_ARG);
    struct kv_block_copy onto_read = {7, 0}; /* seq 1 below reads block 0, writes 5 */
    s[1] = (struct batch_seq){.seq_id = 1, .tokens = t, .n_tokens = 1, .pos = 4,
                              .blocks = rd, .n_blocks = 2};
    s[0].blocks = tb, s[0].n_tokens = 4; /* seq 0 writes block 4 only */
    CHECK_EQ_INT(fwd(r, s, 2, &onto_read, 1, lg, &e), WELD_ERR_INVALID_ARG);
    CHECK(strstr(e.msg, "overwrites a block batch seq 1 only reads") != NULL);
    struct batch fill = {.seqs = s,
                         .n_seqs = 2,
                         .copies = &onto_read,
                         .n_copies = 1,
                         .copies_fill = true}; /* the caller says the copy is what it reads */
    CHECK_EQ_INT(runner_forward(r, &fill, lg, &e), WELD_OK);
    s[0].blocks = ta, s[0].n_tokens = 6;
    s[1] = (struct batch_seq){.seq_id = 1, .tokens = t, .n_tokens = 2, .blocks = tb,
                              .n_blocks = 4};
    CHECK_EQ_INT(fwd(r, s, 2, NULL, 1, lg, &e), WELD_ERR_INVALID_ARG);
    /* a good step; then internal placement is refused until a reset */
    CHECK_EQ_INT(fwd(r, s, 2, NULL, 0, lg, &e), WELD_OK);
    struct batch_seq plain = {.seq_id = 2, .tokens = t, .n_tokens = 3};
    CHECK_EQ_INT(fwd(r, &plain, 1, NULL, 0, lg, &e), WELD_ERR_INVALID_ARG);
    CHECK(strstr(e.msg, "engine block tables") != NULL);
    CHECK_EQ_INT(fwd(r, &plain, 1, cp, 1, lg, &e), WELD_ERR_INVALID_ARG); /* copies, no tables */
    CHECK(strstr(e.msg, "no block tables") != NULL);
    runner_free(r);
    /* internal blocks held: engine tables refused */
    r = make_runner(&tm->m, 4, 8, DT_F16);
    REQUIRE(r != NULL);
    CHECK_EQ_INT(fwd(r, &plain, 1, NULL, 0, lg, &e), WELD_OK);
    CHECK_EQ_INT(fwd(r, s, 1, NULL, 0, lg, &e), WELD_ERR_INVALID_ARG);
    CHECK(strstr(e.msg, "internal allocator holds 1 blocks") != NULL);
    runner_drop_seq(r, 2);
    CHECK_EQ_INT(fwd(r, s, 1, NULL, 0, lg, &e), WELD_OK);
    runner_free(r);
    free(lg);
    tm_free(tm);
}

/* ---- sizing ------------------------------------------------------------------------------ */

TEST(block_bytes_and_pool_sizing)
{
    struct tmodel *tm = tm_build(ARCH_LLAMA, 19);
    const struct model_config *c = &tm->m.cfg; /* 2 layers, kv_dim 64, head_dim 32 */
    CHECK(backend_kv_block_bytes(c, DT_F32, 16) == 2u * 2 * 16 * 64 * 4);
    CHECK(backend_kv_block_bytes(c, DT_F16, 0) == 2u * 2 * 16 * 64 * 2); /* default 16 */
    CHECK(backend_kv_block_bytes(c, DT_BF16, 4) == 2u * 2 * 4 * 64 * 2);
    CHECK(backend_kv_block_bytes(c, DT_Q8_0, 16) == 2u * 2 * 16 * (64 / 32) * 34);
    CHECK(backend_kv_block_bytes(c, DT_Q4_0, 16) == 0);
    size_t per = backend_kv_block_bytes(c, DT_F16, BS);
    CHECK_EQ_INT(backend_kv_blocks_for_bytes(c, DT_F16, BS, 10 * per + per - 1), 10);
    CHECK_EQ_INT(backend_kv_blocks_for_bytes(c, DT_F16, BS, per - 1), 0);
    CHECK_EQ_INT(backend_kv_blocks_for_bytes(c, DT_Q4_0, BS, 1 << 20), 0);
    CHECK_EQ_INT(backend_kv_blocks_for_bytes(c, DT_F32, 1, SIZE_MAX), INT_MAX);
    /* a pool of exactly that many blocks: ids 0..9 work, 10 does not */
    struct runner *r = make_runner(&tm->m, 2, 10, DT_F16);
    REQUIRE(r != NULL);
    CHECK(strstr(runner_describe(r), "kv f16 10 blocks of 4") != NULL);
    int32_t t[2] = {1, 2}, ok[1] = {9}, no[1] = {10};
    float lg[2 * V];
    struct weld_err e;
    struct batch_seq s = {.seq_id = 0, .tokens = t, .n_tokens = 2, .blocks = ok,
                          .n_blocks = 1};
    CHECK_EQ_INT(fwd(r, &s, 1, NULL, 0, lg, &e), WELD_OK);
    s.blocks = no;
    CHECK_EQ_INT(fwd(r, &s, 1, NULL, 0, lg, &e), WELD_ERR_INVALID_ARG);
    runner_free(r);
    /* kv_create: q8_0 needs head_dim % 32, unknown types refused */
    struct kv_cache *kv = NULL;
    struct kv_config kc = {.n_layer = 1, .kv_dim = 48, .head_dim = 16, .max_seqs = 1,
                           .max_ctx = 8, .type = DT_Q8_0};
    CHECK_EQ_INT(kv_create(&kv, &kc, &e), WELD_ERR_UNSUPPORTED);
    CHECK(strstr(e.msg, "head_dim is 16") != NULL);
    kc.type = DT_Q4_K;
    CHECK_EQ_INT(kv_create(&kv, &kc, &e), WELD_ERR_UNSUPPORTED);
    kc.type = DT_F16, kc.head_dim = 20;
    CHECK_EQ_INT(kv_create(&kv, &kc, &e), WELD_ERR_INVALID_ARG);
    CHECK(kv == NULL);
    tm_free(tm);
}

int main(int argc, char **argv)
{
    test_args(argc, argv);
    RUN(scrambled_tables_match_internal);
    RUN(shared_prefix_blocks);
    RUN(copy_on_write_fork);
    RUN(many_sequences_mixed);
    RUN(kv_layouts_agree);
    RUN(kv_type_is_used);
    RUN(kv_rows_per_head);
    RUN(copy_fills_a_read_block);
    RUN(table_errors);
    RUN(block_bytes_and_pool_sizing);
    return test_summary();
}
