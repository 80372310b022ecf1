/*
 * The megakernel executor beyond plain equivalence (test_exec_executors covers that):
 *
 * - PROG_HEAD_DEPS programs: every ATTENTION instruction waits on exactly the QKV
 *   instructions that make its heads (computed independently from the unit ranges), and
 *   ref, ops and mega all run them to the same logits as ref on the default program.
 * - Stats: steps and tokens counted; at batch 1 mega checks fewer counters per step than
 *   a barrier executor has arrivals (workers x (stages - 1)); the bubble is a share;
 *   reset starts from zero; the ref executor reports "no stats".
 * - WELD_TRACE: the file parses as Chrome trace JSON with one instruction event per
 *   instruction of each of the trace_steps first steps, on workers [0, n), with
 *   start <= dependency met <= end; a bad trace_steps and an unwritable file are
 *   refused when the executor is made.
 * - Pieces: instructions over long prompts run in token tiles; with the last worker slow
 *   after every piece, the others join its running instructions and the logits stay ref's.
 * - Late owners: with one worker made 20 ms late to every step the others run its
 *   instructions (steals > 0) and the logits equal ref's; with more workers than cores
 *   (stealing happens by chance) every step's logits equal ref's.
 * - An idle engine uses ~0% CPU: /proc/self/stat utime + stime over 1 s without steps.
 * - A program whose waits point at later or miscounted counters is refused.
 * - Fault injection: every allocation of a mega runner with a trace and its first steps
 *   fails in turn (NOMEM, KV left as it was, no leaks under ASan).
 */
#include "core/alloc.h"
#include "core/json.h"
#include "core/team.h"
#include "exec/exec.h"
#include "exec/runner.h"
#include "exec/weights.h"
#include "model/model.h"
#include "test.h"
#include "test_models.h"

#include <stdint.h>
#include <time.h>

static const struct tspec spec_gqa = {ARCH_LLAMA, 64,    3,    8,    2,     8,        96,   50,
                                      8,          false, true, true, false, 10000.0f, NULL, NULL};
static const struct tspec spec_mqa = {ARCH_LLAMA, 64,    2,     4,     1,     16,       96,   40,
                                      16,         false, false, false, false, 10000.0f, NULL, NULL};
static const struct tspec spec_qwen3 = {ARCH_QWEN3, 64,         2,    6,    3,     16,
                                        96,         60,         16,   true, false, false,
                                        false,      1000000.0f, NULL, NULL};

static bool quiet; /* fault injection: failures are expected */

/* A runner of executor exec; trace_steps: steps a WELD_TRACE trace covers (0: default). */
static struct runner *make_runner_traced(const struct model *m, const char *exec, int n_threads,
                                         int trace_steps)
{
    struct backend_params bp;
    backend_params_init(&bp, 4, TM_CTX);
    bp.n_threads = n_threads;
    bp.oversubscribe = true;
    bp.tuning.executor = exec;
    bp.tuning.trace_steps = trace_steps;
    struct runner *r = NULL;
    struct weld_err e;
    if (runner_create_ex(&r, m, &bp, &e) && !quiet)
        fprintf(stderr, "runner_create_ex: %s\n", e.msg);
    return r;
}

static struct runner *make_runner(const struct model *m, const char *exec, int n_threads)
{
    return make_runner_traced(m, exec, n_threads, 0);
}

/* ---- head-grouped programs --------------------------------------------------------- */

/* Does QKV unit range [u0, u1) hold a Q, K or V head of KV heads [h0, h1)? */
static bool makes_heads(const struct model_config *c, int u0, int u1, int h0, int h1)
{
    int grp = c->n_head / c->n_kv_head;
    for (int u = u0; u < u1; u++) {
        int kv = u < c->n_head ? u / grp : u < c->n_head + c->n_kv_head ? u - c->n_head
                                                                         : u - c->n_head - c->n_kv_head;
        if (kv >= h0 && kv < h1)
            return true;
    }
    return false;
}

/* Every ATTENTION waits on exactly the QKV instructions of its heads (same layer). */
static void check_head_waits(const struct model_config *c, const struct program *p)
{
    int bad = 0, n_att = 0;
    for (int i = 0; i < p->n_instr; i++) {
        const struct prog_instr *a = &p->instrs[i];
        if (a->op != OP_ATTENTION)
            continue;
        n_att++;
        int count = 0;
        for (int j = 0; j < i; j++) {
            const struct prog_instr *q = &p->instrs[j];
            bool waited = q->signal >= a->wait && q->signal < a->wait + a->n_wait;
            bool needed = q->op == OP_ATTN_NORM_QKV_ROPE && q->layer == a->layer &&
                          makes_heads(c, q->row0, q->row1, a->row0, a->row1);
            bad += waited && q->op != OP_ATTN_NORM_QKV_ROPE;
            bad += needed && !waited;
            count += waited;
        }
        bad += count != a->wait_count * a->n_wait;
    }
    CHECK(n_att > 0);
    CHECK_EQ_INT(bad, 0);
}

struct fixture {
    struct tmodel *tm;
    struct exec_weights *w;
    struct kv_cache *kv;
    int32_t toks[9];
    int pos[9];
    struct batch_seq seqs[2];
    struct batch b;
    const int32_t *tables[2];
};

/* Two sequences, prefill chunks of 5 and 4 tokens, the second with every logit row. */
static bool fixture_init(struct fixture *f, const struct tspec *sp, uint64_t seed)
{
    struct weld_err e;
    memset(f, 0, sizeof *f);
    f->tm = tm_build(sp, DT_F32, seed);
    for (int i = 0; i < 9; i++)
        f->toks[i] = (int32_t)((i * 7 + 1) % sp->vocab), f->pos[i] = i < 5 ? i : i - 5;
    f->seqs[0] = (struct batch_seq){0, f->toks, 5, 0, false, NULL, 0, NULL, false};
    f->seqs[1] = (struct batch_seq){1, f->toks + 5, 4, 0, true, NULL, 0, NULL, false};
    f->b = (struct batch){.seqs = f->seqs, .n_seqs = 2};
    struct kv_config kc = {.n_layer = sp->n_layer, .kv_dim = sp->n_kv * sp->head_dim,
                           .head_dim = sp->head_dim, .max_seqs = 2, .max_ctx = 16,
                           .type = DT_F32};
    if (exec_weights_create(&f->w, &f->tm->m, NULL, &e) || kv_create(&f->kv, &kc, &e) ||
        kv_seq_prepare(f->kv, 0, 0, 5, &e) || kv_seq_prepare(f->kv, 1, 0, 4, &e)) {
        fprintf(stderr, "fixture: %s\n", e.msg);
        return false;
    }
    f->tables[0] = f->kv->seqs[0].blocks;
    f->tables[1] = f->kv->seqs[1].blocks;
    return true;
}

static void fixture_free(struct fixture *f)
{
    kv_free(f->kv);
    exec_weights_free(f->w);
    tm_free(f->tm);
}

/* Run program p on executor x (n workers, the last one `lazy_us` late to every step, or
   -lazy_us late to its last stage when negative);
   logits into out (n_logit_rows x vocab); the executor's stats in *stats if asked. */
static int run_on_ex(struct fixture *f, const struct executor_impl *x, int n, int lazy_us,
                     const struct program *p, float *out, struct exec_stats *stats)
{
    struct weld_err e;
    void *state = NULL;
    struct exec_params xp = {.n_threads = n, .team_flags = TEAM_OVERSUBSCRIBE,
                             .trace_steps = 3, /* with WELD_TRACE set */
                             .test_lazy_us = lazy_us > 0 ? lazy_us : 0,
                             .test_late_tail_us = lazy_us < 0 ? -lazy_us : 0};
    int rc = x->create(&state, &f->tm->m.cfg, &xp, &e);
    float *arena = calloc(p->arena_floats + 1, sizeof(float));
    struct exec_step st = {.m = &f->tm->m, .w = f->w, .p = p, .kv = f->kv, .tokens = f->toks,
                           .pos = f->pos, .tables = f->tables, .arena = arena, .logits = out};
    for (int rep = 0; rc == WELD_OK && rep < 3; rep++) /* plans are reused across runs */
        rc = x->run(state, &st, &e);
    if (rc)
        fprintf(stderr, "%s, %d workers: %s\n", x->name, n, e.msg);
    if (stats && state)
        x->stats(state, stats, false);
    free(arena);
    x->free(state);
    return rc;
}

static int run_on(struct fixture *f, const struct executor_impl *x, int n,
                  const struct program *p, float *out)
{
    return run_on_ex(f, x, n, 0, p, out, NULL);
}

static void head_deps_with(const struct tspec *sp, uint64_t seed)
{
    struct fixture f;
    REQUIRE(fixture_init(&f, sp, seed));
    const struct model_config *c = &f.tm->m.cfg;
    struct weld_err e;
    struct program *p0 = NULL;
    REQUIRE(program_build(&p0, c, &f.b, 1, &e) == WELD_OK);
    size_t nf = (size_t)p0->n_logit_rows * (size_t)c->n_vocab;
    float *want = calloc(nf, sizeof(float)), *got = calloc(nf, sizeof(float));
    REQUIRE(run_on(&f, &exec_ref_impl, 1, p0, want) == WELD_OK);
    const int splits[] = {1, 2, 3, 4, 7};
    const struct {
        const struct executor_impl *x;
        int n;
    } runs[] = {{&exec_ref_impl, 1}, {&exec_ops_impl, 2}, {&exec_ops_impl, 3},
                {&exec_mega_impl, 1}, {&exec_mega_impl, 2}, {&exec_mega_impl, 3},
                {&exec_mega_impl, 8}};
    for (size_t k = 0; k < sizeof splits / sizeof splits[0]; k++) {
        struct program *p = NULL;
        REQUIRE(program_build_ex(&p, c, &f.b, splits[k], PROG_HEAD_DEPS, &e) == WELD_OK);
        CHECK(p->n_counters > p->n_stages || splits[k] == 1 || c->n_kv_head == 1);
        check_head_waits(c, p);
        for (size_t r = 0; r < sizeof runs / sizeof runs[0]; r++) {
            memset(got, 0, nf * sizeof(float));
            CHECK_EQ_INT(run_on(&f, runs[r].x, runs[r].n, p, got), WELD_OK);
            if (memcmp(got, want, nf * sizeof(float)) != 0) {
                fprintf(stderr, "  %s %d workers, %d splits: logits differ\n",
                        runs[r].x->name, runs[r].n, splits[k]);
                CHECK(!"bit-identical");
            }
        }
        program_free(p);
    }
    free(want), free(got);
    program_free(p0);
    fixture_free(&f);
}

TEST(head_deps_programs_gqa) { head_deps_with(&spec_gqa, 11); }

/* A worker 200 ms late to every step (long enough that the others reach its counters
   even on a loaded machine): the others run its instructions (steals) and the logits are
   still ref's. */
TEST(late_worker_is_stolen_from)
{
    struct fixture f;
    REQUIRE(fixture_init(&f, &spec_gqa, 14));
    const struct model_config *c = &f.tm->m.cfg;
    struct weld_err e;
    struct program *p0 = NULL, *p = NULL;
    REQUIRE(program_build(&p0, c, &f.b, 1, &e) == WELD_OK);
    REQUIRE(program_build_ex(&p, c, &f.b, 4, PROG_HEAD_DEPS, &e) == WELD_OK);
    size_t nf = (size_t)p0->n_logit_rows * (size_t)c->n_vocab;
    float *want = calloc(nf, sizeof(float)), *got = calloc(nf, sizeof(float));
    REQUIRE(run_on(&f, &exec_ref_impl, 1, p0, want) == WELD_OK);
    for (int n = 2; n <= 3; n++) {
        struct exec_stats st = {0};
        memset(got, 0, nf * sizeof(float));
        CHECK_EQ_INT(run_on_ex(&f, &exec_mega_impl, n, 200000, p, got, &st), WELD_OK);
        CHECK(memcmp(got, want, nf * sizeof(float)) == 0);
        CHECK_EQ_INT((int)st.steps, 3);
        CHECK(st.steals > 0);
    }
    free(want), free(got);
    program_free(p0), program_free(p);
    fixture_free(&f);
}
/* The end of a step is not left to a late worker: with the last of 2 workers 100 ms late
   to the last stage of every step, the other runs the LM head slices in the late one's
   queue (it waits on the last stage's counter and takes them instead of leaving); the
   trace shows every FINAL instruction on worker 0, and the logits are ref's. */
TEST(the_last_stage_is_not_left_to_a_late_worker)
{
    struct fixture f;
    REQUIRE(fixture_init(&f, &spec_gqa, 16));
    const struct model_config *c = &f.tm->m.cfg;
    struct weld_err e;
    struct program *p0 = NULL, *p = NULL;
    REQUIRE(program_build(&p0, c, &f.b, 1, &e) == WELD_OK);
    REQUIRE(program_build_ex(&p, c, &f.b, 2, PROG_HEAD_DEPS, &e) == WELD_OK);
    CHECK(exec_final_slices(p) >= 2);
    size_t nf = (size_t)p0->n_logit_rows * (size_t)c->n_vocab;
    float *want = calloc(nf, sizeof(float)), *got = calloc(nf, sizeof(float));
    REQUIRE(run_on(&f, &exec_ref_impl, 1, p0, want) == WELD_OK);
    char path[4200];
    snprintf(path, sizeof path, "%s/tail.json", test_tmpdir());
    setenv("WELD_TRACE", path, 1);
    struct exec_stats st = {0};
    CHECK_EQ_INT(run_on_ex(&f, &exec_mega_impl, 2, -100000, p, got, &st), WELD_OK);
    unsetenv("WELD_TRACE");
    CHECK(memcmp(got, want, nf * sizeof(float)) == 0);
    json_t *j = jload_file(path, &e);
    REQUIRE(j != NULL);
    int final_by[2] = {0, 0};
    size_t i;
    json_t *ev;
    json_array_foreach(json_object_get(j, "traceEvents"), i, ev) {
        const char *name = json_string_value(json_object_get(ev, "name"));
        int tid = (int)json_integer_value(json_object_get(ev, "tid"));
        if (name && !strcmp(name, "FINAL_NORM_LOGITS") && tid >= 0 && tid < 2)
            final_by[tid]++;
    }
    CHECK_EQ_INT(final_by[0], 3 * exec_final_slices(p));
    CHECK_EQ_INT(final_by[1], 0);
    json_decref(j);
    free(want), free(got);
    program_free(p0), program_free(p);
    fixture_free(&f);
}

/* The step st (one program built with 1 split in st->p) on ref, then on mega with 2 and 3
   workers, the last sleeping slow_us after every piece it runs: at least min_cut
   instructions are in pieces, the others take the slow worker's work (steals > 0 for
   each team, joins of running instructions > 0 over both), and the
   logits are bit-identical to ref on every one of `reps` runs (counters and piece claims
   carry over; odd runs with a step serial, so pieces share their prepared input). Whether
   a helper joins a running instruction or steals it whole is timing: enough runs make a
   join all but certain. */
static void check_pieces_shared(const struct model_config *c, const struct batch *b,
                                struct exec_step st, int min_cut, int slow_us, int reps,
                                const char *label)
{
    struct weld_err e;
    const struct program *p0 = st.p;
    long long joins = 0;
    size_t nf = (size_t)p0->n_logit_rows * (size_t)c->n_vocab;
    float *want = calloc(nf, sizeof(float)), *got = calloc(nf, sizeof(float));
    float *arena = calloc(p0->arena_floats + 1, sizeof(float));
    st.arena = arena, st.logits = want, st.serial = 0;
    void *state = NULL;
    REQUIRE(exec_ref_impl.create(&state, c, NULL, &e) == WELD_OK);
    REQUIRE(exec_ref_impl.run(state, &st, &e) == WELD_OK);
    exec_ref_impl.free(state);
    for (int n = 2; n <= 3; n++) {
        struct program *p = NULL;
        REQUIRE(program_build_ex(&p, c, b, n, PROG_HEAD_DEPS, &e) == WELD_OK);
        int cut = 0;
        st.p = p;
        for (int i = 0; i < p->n_instr; i++)
            cut += exec_op_tiles(&st, &p->instrs[i]) > 1;
        CHECK(cut >= min_cut);
        float *ar = calloc(p->arena_floats + 1, sizeof(float));
        struct exec_params xp = {.n_threads = n, .team_flags = TEAM_OVERSUBSCRIBE,
                                 .test_slow_piece_us = slow_us};
        REQUIRE(exec_mega_impl.create(&state, c, &xp, &e) == WELD_OK);
        st.arena = ar, st.logits = got;
        int bad = 0;
        for (int rep = 0; rep < reps; rep++) {
            memset(got, 0, nf * sizeof(float));
            st.serial = rep % 2 ? 100 + (uint64_t)rep : 0;
            CHECK_EQ_INT(exec_mega_impl.run(state, &st, &e), WELD_OK);
            bad += memcmp(got, want, nf * sizeof(float)) != 0;
        }
        struct exec_stats xs;
        exec_mega_impl.stats(state, &xs, false);
        fprintf(stderr, "  %s, %d workers: %lld steals, %lld joins in %lld steps\n", label, n,
                xs.steals, xs.joins, xs.steps);
        CHECK_EQ_INT(bad, 0);
        CHECK(xs.steals > 0);
        joins += xs.joins;
        exec_mega_impl.free(state);
        free(ar);
        program_free(p);
    }
    CHECK(joins > 0);
    free(want), free(got), free(arena);
}

/* One piece-sharing case: model sp (Q8_0, seed) with each of b's sequences prepared from
   position 0, weights cut in row pieces of piece_bytes (0: the default), then
   check_pieces_shared with the 1-split program of b (min_cut 0: half its instructions). */
static void pieces_case(const struct tspec *sp, uint64_t seed, const struct batch *b,
                        const int32_t *toks, const int *pos, size_t piece_bytes, int min_cut,
                        int slow_us, int reps, const char *label)
{
    struct tmodel *tm = tm_build(sp, DT_Q8_0, seed);
    struct weld_err e;
    struct exec_weights *w = NULL;
    struct kv_cache *kv = NULL;
    const int32_t *tables[8];
    struct program *p0 = NULL;
    struct kv_config kc = {.n_layer = sp->n_layer, .kv_dim = sp->n_kv * sp->head_dim,
                           .head_dim = sp->head_dim, .max_seqs = b->n_seqs, .max_ctx = TM_CTX,
                           .type = DT_F16};
    bool ok = b->n_seqs <= 8 && exec_weights_create(&w, &tm->m, NULL, &e) == WELD_OK &&
              kv_create(&kv, &kc, &e) == WELD_OK;
    for (int s = 0; ok && s < b->n_seqs; s++) {
        ok = kv_seq_prepare(kv, s, 0, b->seqs[s].n_tokens, &e) == WELD_OK;
        tables[s] = ok ? kv->seqs[s].blocks : NULL;
    }
    ok = ok && program_build(&p0, &tm->m.cfg, b, 1, &e) == WELD_OK;
    CHECK(ok);
    if (ok) {
        if (piece_bytes)
            w->piece_bytes = piece_bytes;
        struct exec_step st = {.m = &tm->m, .w = w, .p = p0, .kv = kv, .tokens = toks,
                               .pos = pos, .tables = tables};
        check_pieces_shared(&tm->m.cfg, b, st, min_cut ? min_cut : p0->n_instr / 2, slow_us,
                            reps, label);
    }
    program_free(p0);
    kv_free(kv);
    exec_weights_free(w);
    tm_free(tm);
}

/* Instructions in pieces (exec_op_tiles > 1): a long prompt (40 tokens: 3 token tiles, 5
   attention tiles) and a second one with every logit row (23: 2 tiles of FINAL). */
TEST(pieces_are_shared_with_a_slow_owner)
{
    enum { N0 = 40, N1 = 23 };
    int32_t toks[N0 + N1];
    int pos[N0 + N1];
    for (int i = 0; i < N0 + N1; i++)
        toks[i] = (int32_t)((i * 13 + 5) % spec_gqa.vocab), pos[i] = i < N0 ? i : i - N0;
    struct batch_seq seqs[2] = {{0, toks, N0, 0, false, NULL, 0, NULL, false},
                                {1, toks + N0, N1, 0, true, NULL, 0, NULL, false}};
    struct batch b = {.seqs = seqs, .n_seqs = 2};
    pieces_case(&spec_gqa, 21, &b, toks, pos, 0, 0, 3000, 4, "prefill");
}

/* Decode-shaped steps in row pieces (exec_weights.piece_bytes made tiny: 32-row pieces of
   O, FFN, DOWN): three sequences of one token each. */
TEST(decode_row_pieces_are_shared)
{
    static const struct tspec sp = {ARCH_LLAMA, 96,    2,     6,     2,     16,       160,  70,
                                    16,         false, false, false, false, 10000.0f, NULL, NULL};
    int32_t toks[3] = {5, 17, 42};
    int pos[3] = {0, 0, 0};
    struct batch_seq seqs[3] = {{0, toks, 1, 0, false, NULL, 0, NULL, false},
                                {1, toks + 1, 1, 0, false, NULL, 0, NULL, false},
                                {2, toks + 2, 1, 0, false, NULL, 0, NULL, false}};
    struct batch b = {.seqs = seqs, .n_seqs = 3};
    pieces_case(&sp, 23, &b, toks, pos, 1, 3 * sp.n_layer, 2000, 16, "decode");
}

/* The same with experts: each active expert's GATE_UP (128 rows) and DOWN (96) in 32-row
   pieces, the ranks' experts found when they run. 48 runs: a join is timing, and on a
   loaded host (other tests beside it) 16 once gave none with either team. */
TEST(moe_row_pieces_are_shared)
{
    static const struct tmoe moe = {8, 2, 128, 64, 0, 0, 0, false, true, false, false, 0, 0};
    static const struct tspec sp = {ARCH_QWEN3MOE, 96,    2,     6,     2,        16,   160, 70, 16,
                                    true,          false, false, false, 10000.0f, &moe, NULL};
    int32_t toks[3] = {5, 17, 42};
    int pos[3] = {0, 0, 0};
    struct batch_seq seqs[3] = {{0, toks, 1, 0, false, NULL, 0, NULL, false},
                                {1, toks + 1, 1, 0, false, NULL, 0, NULL, false},
                                {2, toks + 2, 1, 0, false, NULL, 0, NULL, false}};
    struct batch b = {.seqs = seqs, .n_seqs = 3};
    pieces_case(&sp, 24, &b, toks, pos, 1, 6 * sp.n_layer, 2000, 48, "moe decode");
}

TEST(head_deps_programs_qwen3) { head_deps_with(&spec_qwen3, 12); }
TEST(head_deps_programs_mqa) { head_deps_with(&spec_mqa, 15); } /* one group, spread */

/* A program whose attention waits on a counter signalled later, or for the wrong count. */
TEST(bad_program_refused)
{
    struct fixture f;
    REQUIRE(fixture_init(&f, &spec_gqa, 13));
    struct weld_err e;
    struct program *p = NULL;
    REQUIRE(program_build_ex(&p, &f.tm->m.cfg, &f.b, 2, PROG_HEAD_DEPS, &e) == WELD_OK);
    int a = 0;
    while (p->instrs[a].op != OP_ATTENTION)
        a++;
    void *state = NULL;
    struct exec_params xp = {.n_threads = 2, .team_flags = TEAM_OVERSUBSCRIBE};
    REQUIRE(exec_mega_impl.create(&state, &f.tm->m.cfg, &xp, &e) == WELD_OK);
    float *arena = calloc(p->arena_floats, sizeof(float));
    float *lg = calloc((size_t)p->n_logit_rows * 50, sizeof(float));
    struct exec_step st = {.m = &f.tm->m, .w = f.w, .p = p, .kv = f.kv, .tokens = f.toks,
                           .pos = f.pos, .tables = f.tables, .arena = arena, .logits = lg};
    p->instrs[a].wait = p->instrs[a].signal; /* its own stage's counter: would deadlock */
    p->instrs[a].n_wait = 1;
    CHECK_EQ_INT(exec_mega_impl.run(state, &st, &e), WELD_ERR_INTERNAL);
    CHECK(strstr(e.msg, "(ATTENTION, layer 0) waits on counters") != NULL);
    program_free(p);
    REQUIRE(program_build_ex(&p, &f.tm->m.cfg, &f.b, 2, PROG_HEAD_DEPS, &e) == WELD_OK);
    st.p = p;
    p->instrs[a].wait_count++; /* more than are ever signalled: would spin forever */
    CHECK_EQ_INT(exec_mega_impl.run(state, &st, &e), WELD_ERR_INTERNAL);
    p->instrs[a].wait_count--;
    CHECK_EQ_INT(exec_mega_impl.run(state, &st, &e), WELD_OK); /* a fresh program is fine */
    exec_mega_impl.free(state);
    exec_mega_impl.free(NULL);
    free(arena), free(lg);
    program_free(p);
    fixture_free(&f);
}

/* ---- stats ------------------------------------------------------------------------- */

/* A 6-token prompt then `decodes` single-token steps on sequence 0. */
static bool run_decodes(struct runner *r, int vocab, int decodes)
{
    int32_t toks[64];
    float *lg = malloc(sizeof(float) * (size_t)vocab);
    struct weld_err e;
    bool ok = true;
    for (int i = 0; i < 6; i++)
        toks[i] = (int32_t)(i * 5 % vocab);
    runner_drop_seq(r, 0);
    for (int step = 0; ok && step <= decodes && 6 + step < TM_CTX; step++) {
        struct batch_seq bs = {.tokens = step ? toks + 5 + step : toks,
                               .n_tokens = step ? 1 : 6,
                               .pos = step ? 5 + step : 0};
        struct batch b = {.seqs = &bs, .n_seqs = 1};
        ok = runner_forward(r, &b, lg, &e) == WELD_OK;
        toks[6 + step] = (int32_t)(step % vocab);
    }
    free(lg);
    return ok;
}

TEST(stats)
{
    struct tmodel *tm = tm_build(&spec_gqa, DT_F32, 21);
    struct runner *r = make_runner(&tm->m, "mega", 2);
    REQUIRE(r != NULL);
    struct exec_stats s;
    struct weld_err e;
    REQUIRE(run_decodes(r, spec_gqa.vocab, 1));
    REQUIRE(runner_exec_stats(r, &s, true, &e) == WELD_OK);
    CHECK_EQ_INT((int)s.steps, 2);
    CHECK_EQ_INT((int)s.tokens, 7);
    CHECK_EQ_INT(s.n_workers, 2);
    REQUIRE(runner_exec_stats(r, &s, false, &e) == WELD_OK);
    CHECK_EQ_INT((int)s.steps, 0);
    CHECK_EQ_INT((int)s.syncs, 0);
    REQUIRE(run_decodes(r, spec_gqa.vocab, 20));
    REQUIRE(runner_exec_stats(r, &s, true, &e) == WELD_OK);
    CHECK_EQ_INT((int)s.steps, 21);
    /* the stages of a decode step's program, as the backend builds it for mega */
    struct program *p = NULL;
    int32_t t = 1;
    struct batch_seq bs = {0, &t, 1, 6, false, NULL, 0, NULL, false};
    struct batch b = {.seqs = &bs, .n_seqs = 1};
    REQUIRE(program_build_ex(&p, &tm->m.cfg, &b, 2, PROG_HEAD_DEPS, &e) == WELD_OK);
    long long barrier_arrivals = 2LL * (p->n_stages - 1) * 20;
    long long syncs_decode = s.syncs; /* prompt step included: compare loosely */
    CHECK(syncs_decode > 0);
    CHECK(syncs_decode < barrier_arrivals);
    CHECK(s.wait_s >= 0 && s.step_s > 0 && s.wait_s <= 2 * s.step_s);
    program_free(p);
    runner_free(r);
    /* executors without stats say so */
    r = make_runner(&tm->m, "ref", 1);
    REQUIRE(r != NULL);
    CHECK_EQ_INT(runner_exec_stats(r, &s, false, &e), WELD_ERR_UNSUPPORTED);
    CHECK(strstr(e.msg, "ref executor keeps no stats") != NULL);
    runner_free(r);
    tm_free(tm);
}

/* More workers than cores: descheduled owners get their ready instructions run by the
   workers waiting on them (steals), and the logits stay those of ref step by step. */
TEST(oversubscribed_steals_stay_exact)
{
    struct tmodel *tm = tm_build(&spec_gqa, DT_Q8_0, 51);
    const int V = spec_gqa.vocab;
    struct runner *ref = make_runner(&tm->m, "ref", 1), *mega = make_runner(&tm->m, "mega", 8);
    REQUIRE(ref && mega);
    float *a = malloc(sizeof(float) * 6 * (size_t)V), *b = malloc(sizeof(float) * 6 * (size_t)V);
    int32_t toks[TM_CTX];
    for (int i = 0; i < TM_CTX; i++)
        toks[i] = (int32_t)((i * 11 + 2) % V);
    struct weld_err e;
    int bad = 0, failed = 0;
    long long steals = 0;
    for (int round = 0; round < 20 && !failed; round++) {
        runner_drop_seq(ref, 0), runner_drop_seq(mega, 0);
        for (int pos = 0; pos + 6 <= TM_CTX && !failed;) {
            int n = pos ? 1 : 6;
            struct batch_seq bs = {0, toks + pos, n, pos, pos == 0, NULL, 0, NULL, false};
            struct batch bt = {.seqs = &bs, .n_seqs = 1};
            failed = runner_forward(ref, &bt, a, &e) || runner_forward(mega, &bt, b, &e);
            bad += !failed && memcmp(a, b, sizeof(float) * (size_t)(pos ? 1 : 6) * V) != 0;
            pos += n;
        }
    }
    struct exec_stats st;
    REQUIRE(runner_exec_stats(mega, &st, false, &e) == WELD_OK);
    steals = st.steals;
    fprintf(stderr, "  8 workers on %d cores: %lld steals in %lld steps\n",
            team_physical_cores(), steals, st.steps);
    CHECK(!failed);
    CHECK_EQ_INT(bad, 0);
    free(a), free(b);
    runner_free(ref), runner_free(mega);
    tm_free(tm);
}

/* ---- trace ------------------------------------------------------------------------- */

TEST(trace_file)
{
    struct tmodel *tm = tm_build(&spec_gqa, DT_F32, 31);
    char path[4200];
    snprintf(path, sizeof path, "%s/trace.json", test_tmpdir());
    setenv("WELD_TRACE", path, 1);
    struct runner *r = make_runner_traced(&tm->m, "mega", 3, 3);
    unsetenv("WELD_TRACE");
    REQUIRE(r != NULL);
    REQUIRE(run_decodes(r, spec_gqa.vocab, 4)); /* 5 steps, the first 3 traced */
    runner_free(r);
    /* instructions of the 3 traced steps: the prompt's program, then two decodes */
    int32_t t[6] = {0};
    struct batch_seq bs = {0, t, 6, 0, false, NULL, 0, NULL, false};
    struct batch b = {.seqs = &bs, .n_seqs = 1};
    struct program *p = NULL;
    struct weld_err e;
    REQUIRE(program_build_ex(&p, &tm->m.cfg, &b, 3, PROG_HEAD_DEPS, &e) == WELD_OK);
    int want = p->n_instr;
    program_free(p);
    bs.n_tokens = 1, bs.pos = 6;
    REQUIRE(program_build_ex(&p, &tm->m.cfg, &b, 3, PROG_HEAD_DEPS, &e) == WELD_OK);
    want += 2 * p->n_instr;
    program_free(p);
    json_t *j = jload_file(path, &e);
    REQUIRE(j != NULL);
    json_t *evs = json_object_get(j, "traceEvents");
    REQUIRE(json_is_array(evs));
    int n_instr = 0, bad = 0, steps_seen = 0;
    size_t i;
    json_t *ev;
    json_array_foreach(evs, i, ev) {
        const char *cat = json_string_value(json_object_get(ev, "cat"));
        if (!cat || strcmp(cat, "instr") != 0)
            continue;
        n_instr++;
        json_t *args = json_object_get(ev, "args");
        int tid = (int)json_integer_value(json_object_get(ev, "tid"));
        int step = (int)json_integer_value(json_object_get(args, "step"));
        double ts = json_number_value(json_object_get(ev, "ts"));
        double dur = json_number_value(json_object_get(ev, "dur"));
        double wait = json_number_value(json_object_get(args, "wait_us"));
        bad += tid < 0 || tid >= 3 || step < 0 || step >= 3 || ts < 0 || dur < 0 || wait < 0;
        bad += !json_is_string(json_object_get(args, "rows")) ||
               !json_is_integer(json_object_get(args, "layer"));
        steps_seen |= 1 << (step & 7);
    }
    CHECK_EQ_INT(n_instr, want);
    CHECK_EQ_INT(bad, 0);
    CHECK_EQ_INT(steps_seen, 7);
    json_decref(j);
    /* a bad step count is refused when the executor is made */
    setenv("WELD_TRACE", path, 1);
    struct backend_params bp;
    backend_params_init(&bp, 1, TM_CTX);
    bp.n_threads = 2, bp.oversubscribe = true;
    bp.tuning.executor = "mega";
    bp.tuning.trace_steps = -1;
    CHECK_EQ_INT(runner_create_ex(&r, &tm->m, &bp, &e), WELD_ERR_INVALID_ARG);
    CHECK(strstr(e.msg, "trace_steps -1") != NULL);
    /* so is a file that cannot be written, before any step runs */
    bp.tuning.trace_steps = 2;
    setenv("WELD_TRACE", "/nonexistent-dir/trace.json", 1);
    CHECK_EQ_INT(runner_create_ex(&r, &tm->m, &bp, &e), WELD_ERR_IO);
    CHECK(strstr(e.msg, "WELD_TRACE=/nonexistent-dir/trace.json: cannot open") != NULL);
    unsetenv("WELD_TRACE");
    tm_free(tm);
}

/* ---- allocation failures ----------------------------------------------------------- */

/* Every allocation of creating a mega runner (with a trace) and running two steps fails
   in turn: NOMEM, the sequence left empty, nothing leaked (ASan), then one clean run. */
TEST(allocation_failures)
{
    struct tmodel *tm = tm_build(&spec_gqa, DT_F32, 61);
    int32_t t[5] = {1, 2, 3, 4, 5};
    float *lg = malloc(sizeof(float) * 5 * spec_gqa.vocab);
    char path[4200];
    snprintf(path, sizeof path, "%s/alloc-trace.json", test_tmpdir());
    setenv("WELD_TRACE", path, 1);
    quiet = true;
    int saw_ok = 0, bad = 0;
    for (long n = 1; n < 400 && !saw_ok; n++) {
        struct weld_err e;
        alloc_fail_at(n);
        struct runner *r = make_runner(&tm->m, "mega", 2);
        int rc = r ? WELD_OK : WELD_ERR_NOMEM;
        for (int step = 0; r && rc == WELD_OK && step < 2; step++) {
            struct batch_seq bs = {.seq_id = 1,
                                   .tokens = t + step * 4,
                                   .n_tokens = step ? 1 : 4,
                                   .pos = step ? 4 : 0,
                                   .all_logits = true};
            struct batch b = {.seqs = &bs, .n_seqs = 1};
            rc = runner_forward(r, &b, lg, &e);
            if (rc != WELD_OK) {
                bad += rc != WELD_ERR_NOMEM;
                bad += runner_seq_len(r, 1) != (step ? 4 : 0);
            }
        }
        saw_ok = rc == WELD_OK && alloc_failed_count() == 0;
        alloc_fail_at(0);
        runner_free(r);
    }
    unsetenv("WELD_TRACE");
    quiet = false;
    CHECK(saw_ok);
    CHECK_EQ_INT(bad, 0);
    free(lg);
    tm_free(tm);
}

/* ---- idle CPU ---------------------------------------------------------------------- */

/* utime + stime of this process in clock ticks (/proc/self/stat fields 14 and 15). */
static long cpu_ticks(void)
{
    FILE *f = fopen("/proc/self/stat", "r");
    if (!f)
        return -1;
    char buf[2048];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    char *p = strrchr(buf, ')');
    unsigned long ut = 0, st = 0;
    if (!p || sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st) != 2)
        return -1;
    return (long)(ut + st);
}

TEST(idle_uses_no_cpu)
{
    struct tmodel *tm = tm_build(&spec_gqa, DT_F32, 41);
    struct runner *r = make_runner(&tm->m, "mega", 2);
    REQUIRE(r != NULL);
    REQUIRE(run_decodes(r, spec_gqa.vocab, 10));
    struct timespec nap = {0, 50 * 1000 * 1000}; /* let the workers fall asleep */
    nanosleep(&nap, NULL);
    long t0 = cpu_ticks();
    struct timespec sec = {1, 0};
    nanosleep(&sec, NULL);
    long t1 = cpu_ticks();
    REQUIRE(t0 >= 0 && t1 >= 0);
    long hz = sysconf(_SC_CLK_TCK);
    fprintf(stderr, "  idle 1 s: %ld ticks of %ld\n", t1 - t0, hz);
    CHECK(t1 - t0 <= hz / 50); /* at most 2% of one CPU */
    REQUIRE(run_decodes(r, spec_gqa.vocab, 3)); /* and it wakes up again */
    runner_free(r);
    tm_free(tm);
}

int main(void)
{
    RUN(head_deps_programs_gqa);
    RUN(head_deps_programs_qwen3);
    RUN(head_deps_programs_mqa);
    RUN(late_worker_is_stolen_from);
    RUN(the_last_stage_is_not_left_to_a_late_worker);
    RUN(pieces_are_shared_with_a_slow_owner);
    RUN(decode_row_pieces_are_shared);
    RUN(moe_row_pieces_are_shared);
    RUN(bad_program_refused);
    RUN(stats);
    RUN(oversubscribed_steals_stay_exact);
    RUN(trace_file);
    RUN(allocation_failures);
    RUN(idle_uses_no_cpu);
    return test_summary();
}
