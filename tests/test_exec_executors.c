/*
 * Executor equivalence: the `mega` executor (per-worker queues, dependency counters) and
 * the `ops` executor (thread team, barrier per stage) must give logits and final hidden
 * states (the embeddings' input) bit-identical (memcmp) to the single-threaded `ref`
 * executor, the oracle that test_exec_forward checks against a naive double-precision forward pass. ref also runs the head-grouped
 * (PROG_HEAD_DEPS) programs mega asks for, and ops runs them too.
 *
 * Models: tiny random ones built in memory for every architecture variant (llama with
 * GQA + llama3 factors + tied embeddings; llama neox + partial rope + linear scaling;
 * qwen2 with QKV biases; qwen3 with qk-norm; mixtures of experts: Qwen3-MoE and DeepSeek-V3's
 * router), F32 / F16 / Q8_0 weights, f16 and f32 KV.
 * Batches: one sequence (prefill then decodes), and mixed batches of several sequences
 * (decodes beside prefill chunks, some with every logit row), from a seeded random
 * schedule. Teams of 1, 2, 3 and 8 workers (above the core count with TEAM_OVERSUBSCRIBE),
 * with the executor's default n_splits (a few per worker) and with n_splits fixed small
 * (1, 5: more workers than instructions in a stage) so the same program runs on several
 * team sizes.
 *
 * Also: stories260K's golden greedy tokens (llama.cpp's, as in test_exec_golden) with
 * ops and mega; thousands of steps of random batch shapes run in lockstep on ref and
 * ops / mega (no deadlock, no drift: every step's logits equal); ops refuses a program
 * that is not stage-by-stage; the executor default and the name lookups. Mega-only behaviour (plans,
 * stats, trace, idle CPU) is in test_exec_mega.c.
 */
#include "core/alloc.h"
#include "core/rng.h"
#include "core/team.h"
#include "exec/exec.h"
#include "exec/runner.h"
#include "kernels/cpu/kernels.h"
#include "model/model.h"
#include "test.h"
#include "test_models.h"

#include <stdint.h>

#define MAX_SEQS 4
#define CTX TM_CTX

/* ---- tiny in-memory models (test_models.h) ------------------------------------------ */

static const struct tspec spec_llama = {ARCH_LLAMA, 64,    3,    8,    2,     8,        96,   50,
                                        8,          false, true, true, false, 10000.0f, NULL, NULL};
static const struct tspec spec_llama_neox = {ARCH_LLAMA, 64,       2,    4,    4,     16,
                                             64,         40,       8,    true, false, false,
                                             true,       10000.0f, NULL, NULL};
static const struct tspec spec_qwen2 = {ARCH_QWEN2, 64,         2,    4,    2,     16,
                                        128,        45,         16,   true, false, false,
                                        false,      1000000.0f, NULL, NULL};
static const struct tspec spec_qwen3 = {ARCH_QWEN3, 64,         2,    4,    2,     32,
                                        96,         60,         32,   true, false, false,
                                        false,      1000000.0f, NULL, NULL};

/* ---- runners and schedules ---------------------------------------------------------- */

struct exec_cfg {
    const char *exec;
    int n_threads;
    int n_splits; /* 0: one per worker */
    int kv_type;
};

/* The K parts every runner made is built in (0: none), as one comparison sets it. */
static int k_parts;

static struct runner *make_runner(const struct model *m, const struct exec_cfg *x)
{
    struct backend_params bp;
    backend_params_init(&bp, MAX_SEQS, CTX);
    bp.n_threads = x->n_threads;
    bp.n_splits = x->n_splits;
    bp.oversubscribe = true;
    if (x->kv_type >= 0)
        bp.kv_type = (enum weld_dtype)x->kv_type;
    bp.tuning.executor = x->exec;
    bp.tuning.k_parts = k_parts;
    struct runner *r = NULL;
    struct weld_err e;
    if (runner_create_ex(&r, m, &bp, &e))
        fprintf(stderr, "runner_create_ex: %s\n", e.msg);
    return r;
}

/* A random step: 1..MAX_SEQS sequences, each a decode (1 token), a prefill chunk (2..9)
   or, at position 0, a whole prompt; some with every logit row. Sequences that would run
   past CTX are dropped and restart at 0. len[] tracks each seq_id's cached positions. */
struct sched {
    struct rng r;
    int len[MAX_SEQS];
    int32_t toks[MAX_SEQS][16];
    struct batch_seq seqs[MAX_SEQS];
    int drop[MAX_SEQS], n_drop;
};

static void sched_next(struct sched *s, int vocab, struct batch *b)
{
    int n = 1 + (int)(rng_u64(&s->r) % MAX_SEQS);
    int first = (int)(rng_u64(&s->r) % MAX_SEQS);
    s->n_drop = 0;
    for (int i = 0; i < n; i++) {
        int id = (first + i) % MAX_SEQS;
        int kind = (int)(rng_u64(&s->r) % 3);
        int nt = kind == 0 ? 1 : 2 + (int)(rng_u64(&s->r) % 8);
        if (s->len[id] + nt > CTX) {
            s->drop[s->n_drop++] = id;
            s->len[id] = 0;
        }
        for (int k = 0; k < nt; k++)
            s->toks[i][k] = (int32_t)(rng_u64(&s->r) % (uint64_t)vocab);
        s->seqs[i] = (struct batch_seq){.seq_id = id,
                                        .tokens = s->toks[i],
                                        .n_tokens = nt,
                                        .pos = s->len[id],
                                        .all_logits = rng_u64(&s->r) % 4 == 0};
        s->len[id] += nt;
    }
    *b = (struct batch){.seqs = s->seqs, .n_seqs = n};
}

/* Run `steps` random steps on r; append every logit row to out, then every row's final
   hidden state (embeddings: runner_forward_hidden) (returns floats written, -1 on error). */
static long run_random(struct runner *r, int dim, uint64_t seed, int steps, float *out,
                       long cap)
{
    struct sched s;
    memset(&s, 0, sizeof s);
    rng_seed(&s.r, seed);
    const int V = runner_n_vocab(r);
    long n = 0;
    struct weld_err e;
    for (int step = 0; step < steps; step++) {
        struct batch b;
        sched_next(&s, V, &b);
        for (int i = 0; i < s.n_drop; i++)
            runner_drop_seq(r, s.drop[i]);
        long rows = batch_n_logit_rows(&b);
        if (n + rows * (V + dim) > cap)
            return -1;
        if (runner_forward_hidden(r, &b, out + n, NULL, out + n + rows * V, &e)) {
            fprintf(stderr, "step %d: %s\n", step, e.msg);
            return -1;
        }
        n += rows * (V + dim);
    }
    return n;
}

#define OUT_CAP (1L << 20)

/* ref vs each executor config: bit-identical logits over the same random schedule, with
   the model in kp K parts (every runner of one comparison alike). */
static void check_equivalent_kp(const struct tspec *sp, int wtype, int kv_type, uint64_t seed,
                                int kp)
{
    k_parts = kp;
    struct tmodel *tm = tm_build(sp, wtype, seed);
    float *want = malloc(OUT_CAP * sizeof(float)), *got = malloc(OUT_CAP * sizeof(float));
    struct exec_cfg ref = {"ref", 1, 0, kv_type};
    struct runner *r = make_runner(&tm->m, &ref);
    REQUIRE(r != NULL);
    long n_want = run_random(r, sp->dim, seed * 7 + 1, 30, want, OUT_CAP);
    runner_free(r);
    CHECK(n_want > 0);
    const struct exec_cfg cfgs[] = {
        {"ops", 1, 0, kv_type}, {"ops", 2, 0, kv_type}, {"ops", 3, 0, kv_type},
        {"ops", 8, 0, kv_type}, {"ops", 2, 5, kv_type}, {"ops", 3, 1, kv_type},
        {"ops", 8, 5, kv_type},
        {"ref", 1, 3, kv_type},
        {"mega", 1, 0, kv_type}, {"mega", 2, 0, kv_type}, {"mega", 3, 0, kv_type},
        {"mega", 8, 0, kv_type}, {"mega", 2, 5, kv_type}, {"mega", 3, 1, kv_type},
        {"mega", 8, 5, kv_type}, {"mega", 8, 1, kv_type},
    };
    for (size_t i = 0; i < sizeof cfgs / sizeof cfgs[0] && n_want > 0; i++) {
        r = make_runner(&tm->m, &cfgs[i]);
        REQUIRE(r != NULL);
        long n_got = run_random(r, sp->dim, seed * 7 + 1, 30, got, OUT_CAP);
        runner_free(r);
        CHECK_EQ_INT(n_got, n_want);
        if (n_got == n_want && memcmp(got, want, (size_t)n_want * sizeof(float)) != 0) {
            fprintf(stderr, "  %s, %d threads, %d splits: logits differ from ref\n",
                    cfgs[i].exec, cfgs[i].n_threads, cfgs[i].n_splits);
            CHECK(!"bit-identical to ref");
        }
    }
    free(want), free(got);
    tm_free(tm);
    k_parts = 0;
}

/* Without K parts and in two. */
static void check_equivalent(const struct tspec *sp, int wtype, int kv_type, uint64_t seed)
{
    check_equivalent_kp(sp, wtype, kv_type, seed, 1);
    check_equivalent_kp(sp, wtype, kv_type, seed, 2);
}

TEST(llama_gqa_llama3_tied_f32) { check_equivalent(&spec_llama, DT_F32, DT_F32, 101); }
TEST(llama_neox_linear_f16_kv_f16)
{
    check_equivalent(&spec_llama_neox, DT_F16, DT_F16, 102);
    check_equivalent_kp(&spec_llama_neox, DT_F16, DT_F16, 105, 4); /* 4 KV heads */
}
TEST(qwen2_bias_q8_0) { check_equivalent(&spec_qwen2, DT_Q8_0, DT_F16, 103); }
TEST(qwen3_qknorm_f32_kv_q8_0) { check_equivalent(&spec_qwen3, DT_F32, DT_Q8_0, 104); }

/* Mixtures of experts (no K parts): Qwen3-MoE's shape at Q8_0, and DeepSeek-V3's router
   (dense first layer, grouped sigmoid top-k with bias, shared expert) at F32. */
static const struct tmoe moe_qwen3 = {8, 2, 64, 0, 0, 0, 0, false, true, false, false, 0, 0};
static const struct tmoe moe_ds = {16, 3, 32, 64, 1, 4, 2, true, true, true, false, 2.5f, 0};
static const struct tspec spec_qwen3moe = {
    ARCH_QWEN3MOE, 64,    2,     4,     2,          32,         96,  60, 32,
    true,          false, false, false, 1000000.0f, &moe_qwen3, NULL};
static const struct tspec spec_dsmoe = {ARCH_LLAMA, 64,       3,       4,    2,     16,
                                        128,        50,       16,      true, false, false,
                                        false,      10000.0f, &moe_ds, NULL};
TEST(qwen3moe_q8_0)
{
    check_equivalent_kp(&spec_qwen3moe, DT_Q8_0, DT_F16, 106, 1);
}
TEST(deepseek_router_f32)
{
    check_equivalent_kp(&spec_dsmoe, DT_F32, DT_F32, 107, 1);
}

/* Latent attention (MLA): query compression, DeepSeek's router, Q8_0 weights and the
   default f16 latent cache; and the split up-projections (attn_k_b / attn_v_b), F32. */
static const struct tmla mla_q = {64, 32, 16, 24, false, 0};
static const struct tmla mla_split = {0, 32, 16, 16, true, 0};
static const struct tspec spec_mla_moe = {
    ARCH_DEEPSEEK2, 64,    3,     4,     4,        24,      128,   50, 8,
    false,          false, false, false, 10000.0f, &moe_ds, &mla_q};
static const struct tspec spec_mla_split = {
    ARCH_DEEPSEEK2, 64,    2,     4,     4,        24,   96,        50, 8,
    false,          false, false, false, 10000.0f, NULL, &mla_split};
TEST(mla_moe_q8_0)
{
    check_equivalent_kp(&spec_mla_moe, DT_Q8_0, DT_F16, 108, 1);
}
TEST(mla_split_f32)
{
    check_equivalent_kp(&spec_mla_split, DT_F32, DT_F32, 109, 1);
}

/* Batch of one: a 9-token prompt then 20 decode steps, ref vs ops and mega with 2 and 3
   workers. */
TEST(batch_of_one)
{
    struct tmodel *tm = tm_build(&spec_qwen3, DT_F16, 105);
    const int V = spec_qwen3.vocab;
    const struct exec_cfg cfgs[] = {{"ref", 1, 0, -1}, {"ops", 2, 0, -1}, {"ops", 3, 0, -1},
                                    {"mega", 2, 0, -1}, {"mega", 3, 0, -1}};
    float *out[5];
    for (int c = 0; c < 5; c++) {
        struct runner *r = make_runner(&tm->m, &cfgs[c]);
        REQUIRE(r != NULL);
        out[c] = calloc(21 * (size_t)V, sizeof(float));
        int32_t toks[32];
        for (int i = 0; i < 9; i++)
            toks[i] = (int32_t)((i * 13 + 3) % V);
        struct weld_err e;
        int n = 9;
        for (int step = 0; step < 21; step++) {
            struct batch_seq bs = {.tokens = step ? toks + n - 1 : toks,
                                   .n_tokens = step ? 1 : n,
                                   .pos = step ? n - 1 : 0};
            struct batch b = {.seqs = &bs, .n_seqs = 1};
            float *lg = out[c] + (size_t)step * V;
            REQUIRE(runner_forward(r, &b, lg, &e) == WELD_OK);
            int best = 0;
            for (int i = 1; i < V; i++)
                best = lg[i] > lg[best] ? i : best;
            toks[n++] = best;
        }
        runner_free(r);
    }
    for (int c = 1; c < 5; c++)
        CHECK(memcmp(out[0], out[c], 21 * (size_t)V * sizeof(float)) == 0);
    for (int c = 0; c < 5; c++)
        free(out[c]);
    tm_free(tm);
}

/* Input rows (batch_seq.embeds) equal to the tokens' own embedding rows give the logits
   the tokens give, bit for bit, on every executor: two sequences (a 7-token prompt beside
   a 3-token one, then 6 steps of one token each), Q8_0 weights (the table dequantized
   by the same conversion EMBED uses) on an MLA + MoE model and F32 on Qwen3. A batch with
   rows on some sequences only is refused. */
static void check_embeds(const struct tspec *sp, int wtype, uint64_t seed)
{
    struct tmodel *tm = tm_build(sp, wtype, seed);
    const struct model *m = &tm->m;
    const int V = sp->vocab, D = m->cfg.dim;
    const struct exec_cfg cfgs[] = {{"ref", 1, 0, -1}, {"ops", 2, 0, -1}, {"mega", 2, 0, -1}};
    int32_t toks[2][16];
    float *rows = malloc(sizeof(float) * 32 * (size_t)D);
    for (int q = 0; q < 2; q++)
        for (int i = 0; i < 16; i++)
            toks[q][i] = (int32_t)((i * 7 + q * 11 + 5) % V);
    const size_t rb = kern_row_bytes(&m->tok_embd);
    for (int q = 0; q < 2; q++)
        for (int i = 0; i < 16; i++)
            kern_to_f32(m->tok_embd.type, kern_tensor_row(&m->tok_embd, rb, toks[q][i]),
                        rows + ((size_t)q * 16 + i) * D, D);
    for (int c = 0; c < 3; c++) {
        float *out[2];
        for (int mode = 0; mode < 2; mode++) {
            struct runner *r = make_runner(m, &cfgs[c]);
            REQUIRE(r != NULL);
            out[mode] = calloc(7 * 2 * (size_t)V, sizeof(float));
            struct weld_err e;
            int len[2] = {0, 0};
            for (int step = 0; step < 7; step++) {
                struct batch_seq bs[2];
                for (int q = 0; q < 2; q++) {
                    int n = step ? 1 : q ? 3 : 7;
                    bs[q] = (struct batch_seq){.seq_id = q,
                                               .tokens = toks[q] + len[q],
                                               .n_tokens = n,
                                               .pos = len[q]};
                    if (mode)
                        bs[q].embeds = rows + ((size_t)q * 16 + len[q]) * D;
                    len[q] += n;
                }
                struct batch b = {.seqs = bs, .n_seqs = 2};
                REQUIRE(runner_forward(r, &b, out[mode] + (size_t)step * 2 * V, &e) == WELD_OK);
                if (mode && step == 6) { /* rows on one sequence only */
                    bs[0].pos = len[0], bs[1].pos = len[1], bs[1].embeds = NULL;
                    CHECK_EQ_INT(runner_forward(r, &b, out[mode], &e), WELD_ERR_INVALID_ARG);
                    CHECK(strstr(e.msg, "embeds") != NULL);
                }
            }
            runner_free(r);
        }
        if (memcmp(out[0], out[1], 7 * 2 * (size_t)V * sizeof(float)))
            fprintf(stderr, "  %s: input rows gave other logits than the tokens\n", cfgs[c].exec);
        CHECK(memcmp(out[0], out[1], 7 * 2 * (size_t)V * sizeof(float)) == 0);
        free(out[0]), free(out[1]);
    }
    free(rows);
    tm_free(tm);
}
TEST(embeds_equal_tokens)
{
    check_embeds(&spec_mla_moe, DT_Q8_0, 111);
    check_embeds(&spec_qwen3, DT_F32, 112);
}

/* all_hidden: a 7-token prompt that wants every token's hidden state beside a 3-token one
   that wants its last; the rows are bit-identical to the ones all_logits gives (whose
   logit rows carry them), logit rows first then the others in token order, on every
   executor, with and without K parts. */
static void check_all_hidden(const struct tspec *sp, int wtype, uint64_t seed)
{
    struct tmodel *tm = tm_build(sp, wtype, seed);
    const struct model *m = &tm->m;
    const int V = sp->vocab, D = m->cfg.dim;
    const struct exec_cfg cfgs[] = {{"ref", 1, 0, -1}, {"ops", 2, 0, -1}, {"mega", 2, 0, -1}};
    int32_t toks[2][8];
    for (int q = 0; q < 2; q++)
        for (int i = 0; i < 8; i++)
            toks[q][i] = (int32_t)((i * 5 + q * 13 + 1) % V);
    for (int kp = 0; kp < (sp->moe || sp->mla ? 1 : 2); kp++) { /* K parts: dense only */
        k_parts = kp ? 2 : 0;
        for (int c = 0; c < 3; c++) {
            float *lg[2], *hd[2];
            for (int mode = 0; mode < 2; mode++) { /* 0: all_logits, 1: all_hidden */
                struct runner *r = make_runner(m, &cfgs[c]);
                REQUIRE(r != NULL);
                struct batch_seq bs[2] = {
                    {.seq_id = 0,
                     .tokens = toks[0],
                     .n_tokens = 7,
                     .all_logits = !mode,
                     .all_hidden = mode},
                    {.seq_id = 1, .tokens = toks[1], .n_tokens = 3},
                };
                struct batch b = {.seqs = bs, .n_seqs = 2};
                CHECK_EQ_INT(batch_n_hidden_rows(&b), 8);
                lg[mode] = calloc(8 * (size_t)V, sizeof(float));
                hd[mode] = calloc(8 * (size_t)D, sizeof(float));
                struct weld_err e;
                REQUIRE(runner_forward_hidden(r, &b, lg[mode], NULL, hd[mode], &e) == WELD_OK);
                runner_free(r);
            }
            const size_t rowb = (size_t)D * sizeof(float);
            bool same = !memcmp(hd[1] + 2 * (size_t)D, hd[0], 6 * rowb) && /* tokens 0..5 */
                        !memcmp(hd[1], hd[0] + 6 * (size_t)D, 2 * rowb) && /* the last ones */
                        !memcmp(lg[1], lg[0] + 6 * (size_t)V, 2 * (size_t)V * sizeof(float));
            if (!same)
                fprintf(stderr, "  %s, K parts %d: all_hidden rows differ\n", cfgs[c].exec,
                        k_parts);
            CHECK(same);
            for (int mode = 0; mode < 2; mode++)
                free(lg[mode]), free(hd[mode]);
        }
    }
    k_parts = 0;
    tm_free(tm);
}
TEST(all_hidden_rows)
{
    check_all_hidden(&spec_mla_moe, DT_Q8_0, 113);
    check_all_hidden(&spec_llama, DT_F16, 114);
}

/* ---- stories260K golden tokens ------------------------------------------------------ */

static const int32_t prompt[5] = {1, 403, 407, 261, 378};
static const int32_t golden[32] = {432, 383, 286, 261, 376, 298, 315, 421, 395, 317, 426,
                                   338, 401, 396, 267, 337, 410, 408, 419, 292, 411, 322,
                                   265, 282, 295, 433, 426, 385, 328, 432, 358, 394};

static void golden_with(const struct model *m, const char *exec, int n_threads)
{
    const int V = m->cfg.n_vocab;
    struct exec_cfg x = {exec, n_threads, 0, -1};
    struct runner *r = make_runner(m, &x);
    REQUIRE(r != NULL);
    float *lg = malloc(sizeof(float) * (size_t)V);
    int32_t toks[40];
    memcpy(toks, prompt, sizeof prompt);
    int n = 5, ok = 1;
    struct weld_err e;
    for (int step = 0; step < 32 && ok; step++) {
        struct batch_seq bs = {
            0,    step ? toks + n - 1 : toks, step ? 1 : n, step ? n - 1 : 0, false, NULL, 0, NULL,
            false};
        struct batch b = {.seqs = &bs, .n_seqs = 1};
        ok = runner_forward(r, &b, lg, &e) == WELD_OK;
        int best = 0;
        for (int i = 1; i < V; i++)
            best = lg[i] > lg[best] ? i : best;
        if (best != golden[step])
            fprintf(stderr, "  %s %d threads: step %d token %d, want %d\n", exec, n_threads,
                    step, best, golden[step]);
        ok = ok && best == golden[step];
        toks[n++] = best;
    }
    CHECK(ok);
    free(lg);
    runner_free(r);
}

TEST(stories260k_golden_ops_mega)
{
    const char *path = test_shared_path("models/stories260K.gguf");
    REQUIRE(path != NULL);
    struct model *m = NULL;
    struct weld_err e;
    REQUIRE(model_load(&m, path, &e) == WELD_OK);
    const char *ex[2] = {"ops", "mega"};
    for (int i = 0; i < 2; i++)
        for (int n = 1; n <= 3; n++)
            golden_with(m, ex[i], n);
    model_free(m);
}

/* ---- lockstep stress ---------------------------------------------------------------- */

/* Random shapes step after step on ref and ops or mega side by side: every step's logits
   equal. */
static void lockstep_with(const struct tspec *sp, const char *exec, int n_threads, int steps,
                          uint64_t seed)
{
    struct tmodel *tm = tm_build(sp, DT_Q8_0, seed);
    const int V = sp->vocab;
    struct exec_cfg xr = {"ref", 1, 0, -1}, xo = {exec, n_threads, 0, -1};
    struct runner *ref = make_runner(&tm->m, &xr), *ops = make_runner(&tm->m, &xo);
    REQUIRE(ref && ops);
    struct sched s;
    memset(&s, 0, sizeof s);
    rng_seed(&s.r, seed);
    float *a = malloc(sizeof(float) * (size_t)V * MAX_SEQS * 10);
    float *b2 = malloc(sizeof(float) * (size_t)V * MAX_SEQS * 10);
    int bad = 0, failed = 0;
    struct weld_err e;
    for (int step = 0; step < steps && !failed; step++) {
        struct batch b;
        sched_next(&s, V, &b);
        for (int i = 0; i < s.n_drop; i++) {
            runner_drop_seq(ref, s.drop[i]);
            runner_drop_seq(ops, s.drop[i]);
        }
        size_t nf = (size_t)batch_n_logit_rows(&b) * V;
        failed = runner_forward(ref, &b, a, &e) || runner_forward(ops, &b, b2, &e);
        bad += !failed && memcmp(a, b2, nf * sizeof(float)) != 0;
    }
    CHECK(!failed);
    CHECK_EQ_INT(bad, 0);
    free(a), free(b2);
    runner_free(ref);
    runner_free(ops);
    tm_free(tm);
}

static void lockstep(const char *exec, int n_threads, int steps, uint64_t seed)
{
    lockstep_with(&spec_llama, exec, n_threads, steps, seed);
}

TEST(thousands_of_random_steps)
{
    lockstep_with(&spec_qwen3moe, "mega", 2, 1000, 208);
    lockstep_with(&spec_dsmoe, "ops", 3, 300, 209);
    lockstep_with(&spec_mla_moe, "mega", 3, 300, 210);
    lockstep("ops", 2, 2000, 201);
    lockstep("ops", 3, 500, 202);
    lockstep("mega", 2, 3000, 203);
    lockstep("mega", 3, 500, 204);
    lockstep("mega", 8, 300, 205);
    k_parts = 2; /* both runners in two K parts */
    lockstep("mega", 2, 1500, 206);
    lockstep("ops", 3, 300, 207);
    k_parts = 0;
}

/* ---- errors and selection ----------------------------------------------------------- */

TEST(ops_refuses_non_stage_program)
{
    struct tmodel *tm = tm_build(&spec_llama, DT_F32, 301);
    struct weld_err e;
    struct program *p = NULL;
    int32_t toks[3] = {1, 2, 3};
    struct batch_seq bs = {0, toks, 3, 0, false, NULL, 0, NULL, false};
    struct batch b = {.seqs = &bs, .n_seqs = 1};
    REQUIRE(program_build(&p, &tm->m.cfg, &b, 2, &e) == WELD_OK);
    void *state = NULL;
    struct exec_params xp = {.n_threads = 2, .team_flags = TEAM_OVERSUBSCRIBE};
    REQUIRE(exec_ops_impl.create(&state, &tm->m.cfg, &xp, &e) == WELD_OK);
    CHECK_EQ_INT(exec_ops_impl.n_workers(state), 2);
    CHECK_EQ_INT(exec_ops_impl.n_splits(state), 8);
    /* move the first ATTENTION of layer 0 into the EMBED stage: nothing runs */
    int a = 0;
    while (p->instrs[a].op != OP_ATTENTION)
        a++;
    struct prog_instr tmp = p->instrs[a];
    p->instrs[a] = p->instrs[1];
    p->instrs[1] = tmp;
    struct exec_step st = {.m = &tm->m, .p = p, .tokens = toks};
    CHECK_EQ_INT(exec_ops_impl.run(state, &st, &e), WELD_ERR_INTERNAL);
    CHECK(strstr(e.msg, "instruction 1 (ATTENTION, layer 0) in stage 0") != NULL);
    exec_ops_impl.free(state);
    exec_ops_impl.free(NULL);
    program_free(p);
    tm_free(tm);
}

TEST(selection)
{
    const struct executor_impl *x;
    struct weld_err e;
    REQUIRE(executor_choose(&x, NULL, 1, &e) == WELD_OK);
    CHECK_EQ_STR(x->name, "ref");
    REQUIRE(executor_choose(&x, "", 2, &e) == WELD_OK);
    CHECK_EQ_STR(x->name, "mega");
    REQUIRE(executor_choose(&x, "ref", 4, &e) == WELD_OK);
    CHECK_EQ_STR(x->name, "ref");
    REQUIRE(executor_choose(&x, "ops", 1, &e) == WELD_OK);
    CHECK_EQ_STR(x->name, "ops");
    REQUIRE(executor_choose(&x, "mega", 1, &e) == WELD_OK);
    CHECK_EQ_STR(x->name, "mega");
    CHECK_EQ_INT(executor_choose(&x, "megakernel", 2, &e), WELD_ERR_NOT_FOUND);
    CHECK(x == NULL);
    CHECK_EQ_STR(e.msg, "unknown executor 'megakernel' (available: ref, ops, mega)");
    /* the backend registry is looked up the same way */
    const struct backend_iface *be;
    REQUIRE(backend_find(&be, NULL, &e) == WELD_OK);
    CHECK_EQ_STR(be->name, "cpu");
    REQUIRE(backend_find(&be, "cpu", &e) == WELD_OK);
    CHECK(be == &backend_cpu);
    CHECK_EQ_INT(backend_find(&be, "cuda", &e), WELD_ERR_NOT_FOUND);
    CHECK(be == NULL);
    CHECK_EQ_STR(e.msg, "unknown accelerator 'cuda' (available: cpu)");
    /* the runner describes the executor and its threads */
    struct tmodel *tm = tm_build(&spec_qwen2, DT_F32, 302);
    struct exec_cfg c3 = {"ops", 3, 0, -1};
    struct runner *r = make_runner(&tm->m, &c3);
    REQUIRE(r != NULL);
    CHECK(strncmp(runner_describe(r), "cpu: ops executor, 3 threads, 12 splits", 39) == 0);
    runner_free(r);
    tm_free(tm);
}

int main(void)
{
    RUN(llama_gqa_llama3_tied_f32);
    RUN(llama_neox_linear_f16_kv_f16);
    RUN(qwen2_bias_q8_0);
    RUN(qwen3_qknorm_f32_kv_q8_0);
    RUN(qwen3moe_q8_0);
    RUN(deepseek_router_f32);
    RUN(mla_moe_q8_0);
    RUN(mla_split_f32);
    RUN(batch_of_one);
    RUN(embeds_equal_tokens);
    RUN(all_hidden_rows);
    RUN(stories260k_golden_ops_mega);
    RUN(thousands_of_random_steps);
    RUN(ops_refuses_non_stage_program);
    RUN(selection);
    return test_summary();
}
