/*
 * Program builder and KV cache units: instruction counts and row ranges per n_splits, the
 * counter chain (every wait refers to the previous stage with its exact size), the buffer
 * plan (no two buffers alive at once overlap; memory is actually reused), shape matching;
 * the paged KV cache's block tables, free list, truncation and all-or-nothing reservation.
 */
#include "exec/kv.h"
#include "exec/program.h"
#include "test.h"

static struct model_config small_cfg(void)
{
    struct model_config c = {0};
    c.n_vocab = 100, c.dim = 64, c.n_layer = 3, c.n_head = 8, c.n_kv_head = 2;
    c.head_dim = 8, c.ffn_dim = 160, c.rope_dim = 8, c.max_ctx = 64;
    return c;
}

static int count_op(const struct program *p, int op, int layer)
{
    int n = 0;
    for (int i = 0; i < p->n_instr; i++)
        n += p->instrs[i].op == op && p->instrs[i].layer == layer;
    return n;
}

/* Rows of every (op, layer) group cover [0, total) exactly once, in order. */
static bool covers(const struct program *p, int op, int layer, int total)
{
    int next = 0;
    for (int i = 0; i < p->n_instr; i++) {
        const struct prog_instr *in = &p->instrs[i];
        if (in->op != op || in->layer != layer)
            continue;
        if (in->row0 != next || in->row1 <= in->row0)
            return false;
        next = in->row1;
    }
    return next == total;
}

TEST(splits_and_counts)
{
    struct model_config c = small_cfg();
    int32_t tok[7] = {0};
    struct batch_seq s[2] = {{0, tok, 4, 0, false, NULL, 0, NULL, false},
                             {3, tok, 3, 9, true, NULL, 0, NULL, false}};
    struct batch b = {.seqs = s, .n_seqs = 2};
    const int splits[] = {1, 3, 7, 1000};
    for (int k = 0; k < 4; k++) {
        struct program *p;
        struct weld_err e;
        REQUIRE(program_build(&p, &c, &b, splits[k], &e) == WELD_OK);
        int ns = splits[k];
        CHECK_EQ_INT(p->n_tokens, 7);
        CHECK_EQ_INT(p->n_logit_rows, 4);
        CHECK_EQ_INT(p->logit_tok[0], 3);
        CHECK_EQ_INT(p->logit_tok[3], 6);
        CHECK_EQ_INT(p->tok_seq[4], 1);
        CHECK_EQ_INT(count_op(p, OP_EMBED, -1), ns < 7 ? ns : 7);
        CHECK_EQ_INT(count_op(p, OP_ATTN_NORM_QKV_ROPE, 1), ns < 12 ? ns : 12);
        /* both sequences prefill: each cut into min(splits, n_kv_head = 2) head ranges */
        CHECK_EQ_INT(count_op(p, OP_ATTENTION, 2), ns < 2 ? 2 : 2 * 2);
        /* matrix row splits start at multiples of 16: 160 rows = 10 groups, 100 = 7 */
        CHECK_EQ_INT(count_op(p, OP_FFN_NORM_GATE_UP_SILU, 0), ns < 10 ? ns : 10);
        CHECK_EQ_INT(count_op(p, OP_FINAL_NORM_LOGITS, -1), ns < 7 ? ns : 7);
        CHECK_EQ_INT(count_op(p, OP_O_PROJ_RESIDUAL, 2), ns < 4 ? ns : 4);
        for (int i = 0; i < p->n_instr; i++) {
            const struct prog_instr *in = &p->instrs[i];
            if (in->op == OP_O_PROJ_RESIDUAL || in->op == OP_FFN_NORM_GATE_UP_SILU ||
                in->op == OP_DOWN_PROJ_RESIDUAL || in->op == OP_FINAL_NORM_LOGITS)
                CHECK(in->row0 % 16 == 0);
        }
        CHECK(covers(p, OP_EMBED, -1, 7));
        for (int l = 0; l < 3; l++) {
            CHECK(covers(p, OP_ATTN_NORM_QKV_ROPE, l, 8 + 2 * 2));
            CHECK(covers(p, OP_O_PROJ_RESIDUAL, l, 64));
            CHECK(covers(p, OP_FFN_NORM_GATE_UP_SILU, l, 160));
            CHECK(covers(p, OP_DOWN_PROJ_RESIDUAL, l, 64));
        }
        CHECK(covers(p, OP_FINAL_NORM_LOGITS, -1, 100));
        CHECK_EQ_INT(p->n_counters, 2 + 5 * 3);
        program_free(p);
    }
}

/* The LM head at decode: up to 64 slices of ~2048 vocabulary rows when the step has at
   most 16 logit rows and more than one split, on 256-row chunks (logits_top.h) when the
   vocabulary allows; n_splits slices otherwise. */
TEST(final_slices)
{
    struct model_config c = small_cfg();
    int32_t tok[20] = {0};
    struct batch_seq s = {0, tok, 1, 5, false, NULL, 0, NULL, false};
    struct batch b = {.seqs = &s, .n_seqs = 1};
    const struct {
        int vocab, splits, n_tok;
        bool all;
        int want;
    } cases[] = {
        {128256, 2, 1, false, 62},  /* 1B-like decode: 128256 / 2048 */
        {32000, 2, 1, false, 15},   /* 110M-like decode */
        {300000, 2, 1, false, 64},  /* capped */
        {32000, 1, 1, false, 1},    /* one split: ref */
        {1000, 2, 1, false, 2},     /* small vocabulary: n_splits */
        {32000, 2, 20, true, 2},    /* 20 logit rows: n_splits */
        {32000, 2, 16, true, 15},   /* 16 logit rows: still decode-shaped */
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        c.n_vocab = cases[k].vocab;
        s.n_tokens = cases[k].n_tok, s.all_logits = cases[k].all;
        struct program *p;
        struct weld_err e;
        REQUIRE(program_build(&p, &c, &b, cases[k].splits, &e) == WELD_OK);
        CHECK_EQ_INT(count_op(p, OP_FINAL_NORM_LOGITS, -1), cases[k].want);
        CHECK(covers(p, OP_FINAL_NORM_LOGITS, -1, cases[k].vocab));
        const bool chunked = cases[k].vocab >= 256 * 8 * cases[k].want;
        for (int i = 0; i < p->n_instr; i++)
            if (p->instrs[i].op == OP_FINAL_NORM_LOGITS)
                CHECK(p->instrs[i].row0 % (chunked ? 256 : 16) == 0);
        program_free(p);
    }
}

TEST(counter_chain)
{
    struct model_config c = small_cfg();
    int32_t tok[5] = {0};
    struct batch_seq s = {0, tok, 5, 0, true, NULL, 0, NULL, false};
    struct batch b = {.seqs = &s, .n_seqs = 1};
    struct program *p;
    struct weld_err e;
    REQUIRE(program_build(&p, &c, &b, 3, &e) == WELD_OK);
    int *signals = calloc((size_t)p->n_counters, sizeof(int));
    for (int i = 0; i < p->n_instr; i++) {
        const struct prog_instr *in = &p->instrs[i];
        REQUIRE(in->signal >= 0 && in->signal < p->n_counters);
        if (i == 0 || p->instrs[i - 1].signal != in->signal) { /* first of a stage */
            CHECK_EQ_INT(in->signal, i == 0 ? 0 : p->instrs[i - 1].signal + 1);
        }
        if (in->signal == 0) {
            CHECK_EQ_INT(in->wait, -1);
        } else {
            /* waits for the whole previous stage, which is already complete in list order */
            CHECK_EQ_INT(in->wait, in->signal - 1);
            CHECK_EQ_INT(in->wait_count, signals[in->wait]);
            CHECK(in->wait_count > 0);
        }
        signals[in->signal]++;
    }
    free(signals);
    program_free(p);
}

TEST(buffer_plan)
{
    struct model_config c = small_cfg();
    int32_t tok[9] = {0};
    struct batch_seq s = {0, tok, 9, 0, false, NULL, 0, NULL, false};
    struct batch b = {.seqs = &s, .n_seqs = 1};
    struct program *p;
    struct weld_err e;
    REQUIRE(program_build(&p, &c, &b, 2, &e) == WELD_OK);
    size_t total = 0;
    for (int i = 0; i < p->n_bufs; i++) {
        const struct prog_buf *x = &p->bufs[i];
        CHECK(x->first >= 0 && x->last >= x->first);
        /* lifetimes cover whole stages (instructions of a stage may run concurrently) */
        CHECK(x->first == 0 || p->instrs[x->first - 1].signal != p->instrs[x->first].signal);
        CHECK(x->last == p->n_instr - 1 ||
              p->instrs[x->last + 1].signal != p->instrs[x->last].signal);
        if (x->external)
            continue;
        total += x->n_floats;
        CHECK(x->offset % 16 == 0);
        CHECK(x->offset + x->n_floats <= p->arena_floats);
        for (int j = 0; j < i; j++) {
            const struct prog_buf *y = &p->bufs[j];
            if (y->external || x->last < y->first || y->last < x->first)
                continue;
            bool disjoint = x->offset + x->n_floats <= y->offset ||
                            y->offset + y->n_floats <= x->offset;
            CHECK(disjoint);
        }
        /* every instruction's buffers are alive while it runs */
    }
    for (int i = 0; i < p->n_instr; i++) {
        const struct prog_instr *in = &p->instrs[i];
        if (in->in >= 0)
            CHECK(p->bufs[in->in].first <= i && i <= p->bufs[in->in].last);
        CHECK(p->bufs[in->out].first <= i && i <= p->bufs[in->out].last);
    }
    CHECK(p->arena_floats < total / 2); /* layers share memory */
    FILE *devnull = fopen("/dev/null", "w");
    program_dump(p, devnull);
    fclose(devnull);
    program_free(p);
    program_free(NULL);
}

/* Buffer ids instruction in touches (in, out, sums, xout, aux), -1 padded. */
static void instr_bufs(const struct prog_instr *in, int out[5])
{
    out[0] = in->in, out[1] = in->out, out[2] = in->sums, out[3] = in->xout, out[4] = in->aux;
}

/* Instructions that may run at the same time (neither waits, through any chain, on the
   other) never touch two different buffers that share arena memory: the buffer plan
   respects what the counters allow, PROG_HEAD_DEPS' overlapping stages included. */
static void check_no_shared_memory_races(const struct program *p)
{
    const int n = p->n_instr;
    unsigned char *before = calloc((size_t)n * (size_t)n, 1); /* before[j * n + i]: i -> j */
    REQUIRE(before != NULL);
    for (int j = 0; j < n; j++) {
        const struct prog_instr *in = &p->instrs[j];
        for (int i = 0; i < j; i++) {
            const int c = p->instrs[i].signal;
            if (in->wait >= 0 && c >= in->wait && c < in->wait + in->n_wait) {
                before[(size_t)j * n + i] = 1;
                for (int k = 0; k < i; k++)
                    before[(size_t)j * n + k] |= before[(size_t)i * n + k];
            }
        }
    }
    int bad = 0;
    for (int j = 0; j < n; j++)
        for (int i = 0; i < j; i++) {
            if (before[(size_t)j * n + i])
                continue;
            int a[5], b[5];
            instr_bufs(&p->instrs[i], a);
            instr_bufs(&p->instrs[j], b);
            for (int x = 0; x < 5; x++)
                for (int y = 0; y < 5; y++) {
                    if (a[x] < 0 || b[y] < 0 || a[x] == b[y])
                        continue;
                    const struct prog_buf *u = &p->bufs[a[x]], *v = &p->bufs[b[y]];
                    if (u->external || v->external)
                        continue;
                    bad += u->offset < v->offset + v->n_floats &&
                           v->offset < u->offset + u->n_floats;
                }
        }
    CHECK_EQ_INT(bad, 0);
    free(before);
}

static void check_k_parts(int n_layer, int ffn, const struct prog_kparts kp)
{
    struct model_config c = small_cfg();
    c.n_layer = n_layer, c.ffn_dim = ffn;
    int32_t tok[9] = {0};
    struct batch_seq s[3] = {{0, tok, 1, 5, false, NULL, 0, NULL, false},
                             {1, tok, 6, 0, true, NULL, 0, NULL, false},
                             {2, tok, 1, 7, false, NULL, 0, NULL, false}};
    const struct batch shapes[2] = {{.seqs = s, .n_seqs = 1}, {.seqs = s, .n_seqs = 3}};
    for (int k = 0; k < 2; k++)
        for (int f = 0; f < 2; f++)
            for (int ns = 1; ns <= 3; ns++) {
                struct program *p;
                struct weld_err e;
                REQUIRE(program_build_kp(&p, &c, &shapes[k], ns, f ? PROG_HEAD_DEPS : 0, &kp,
                                         &e) == WELD_OK);
                CHECK_EQ_INT(p->kp.n, kp.n);
                for (int l = 0; l < c.n_layer; l++) {
                    CHECK_EQ_INT(count_op(p, OP_O_PART, l), kp.n);
                    CHECK_EQ_INT(count_op(p, OP_FFN_DOWN_PART, l), kp.n);
                    CHECK_EQ_INT(count_op(p, OP_O_PROJ_RESIDUAL, l) +
                                 count_op(p, OP_FFN_NORM_GATE_UP_SILU, l) +
                                 count_op(p, OP_DOWN_PROJ_RESIDUAL, l), 0);
                    CHECK(covers(p, OP_FFN_DOWN_PART, l, c.ffn_dim));
                }
                /* every stage that stores the residual stores all of it, once */
                for (int st = 0; st < p->n_stages; st++) {
                    int next = 0, stores = 0;
                    for (int i = p->stage_first[st]; i < p->stage_first[st + 1]; i++) {
                        const struct prog_instr *in = &p->instrs[i];
                        if (in->xout < 0)
                            continue;
                        stores++;
                        CHECK_EQ_INT(in->x0, next);
                        CHECK(in->x1 >= in->x0 && in->x0 % 16 == 0);
                        next = in->x1;
                    }
                    CHECK(!stores || next == c.dim);
                }
                check_no_shared_memory_races(p);
                program_free(p);
            }
}

TEST(k_parts)
{
    check_k_parts(3, 160, (struct prog_kparts){2, {0, 4, 8}, {0, 80, 160}});
    check_k_parts(2, 96, (struct prog_kparts){2, {0, 4, 8}, {0, 48, 96}});
    struct model_config c = small_cfg();
    int32_t tok[1] = {0};
    struct batch_seq s = {0, tok, 1, 0, false, NULL, 0, NULL, false};
    const struct batch shapes[1] = {{.seqs = &s, .n_seqs = 1}};
    /* a cut inside a KV head's query group, or off the 16-row grid, is refused */
    const struct prog_kparts bad1 = {2, {0, 3, 8}, {0, 80, 160}};
    const struct prog_kparts bad2 = {2, {0, 4, 8}, {0, 72, 160}};
    struct program *p = NULL;
    struct weld_err e;
    CHECK_EQ_INT(program_build_kp(&p, &c, &shapes[0], 2, 0, &bad1, &e), WELD_ERR_INVALID_ARG);
    CHECK_EQ_INT(program_build_kp(&p, &c, &shapes[0], 2, 0, &bad2, &e), WELD_ERR_INVALID_ARG);
    CHECK(p == NULL);
}

TEST(head_deps_buffers_never_race)
{
    struct model_config c = small_cfg();
    int32_t tok[9] = {0};
    struct batch_seq s[2] = {{0, tok, 1, 5, false, NULL, 0, NULL, false},
                             {1, tok, 6, 0, true, NULL, 0, NULL, false}};
    struct batch b = {.seqs = s, .n_seqs = 2};
    for (int ns = 1; ns <= 4; ns++) {
        struct program *p;
        struct weld_err e;
        REQUIRE(program_build_ex(&p, &c, &b, ns, PROG_HEAD_DEPS, &e) == WELD_OK);
        check_no_shared_memory_races(p);
        program_free(p);
    }
}

TEST(shape_matching)
{
    struct model_config c = small_cfg();
    int32_t tok[4] = {0};
    struct batch_seq s[2] = {{0, tok, 1, 5, false, NULL, 0, NULL, false},
                             {1, tok, 1, 9, false, NULL, 0, NULL, false}};
    struct batch b = {.seqs = s, .n_seqs = 2};
    struct program *p;
    struct weld_err e;
    REQUIRE(program_build(&p, &c, &b, 1, &e) == WELD_OK);
    s[0].pos = 6, s[1].seq_id = 4, s[1].tokens = tok + 2; /* data changes: same program */
    CHECK(program_matches(p, &b));
    s[1].all_logits = true;
    CHECK(!program_matches(p, &b));
    s[1].all_logits = false, s[0].n_tokens = 2;
    CHECK(!program_matches(p, &b));
    b.n_seqs = 1;
    CHECK(!program_matches(p, &b));
    CHECK(!program_matches(NULL, &b));
    struct program *p2 = (struct program *)&c;
    CHECK_EQ_INT(program_build(&p2, &c, &b, 0, &e), WELD_ERR_INVALID_ARG);
    CHECK(p2 == NULL);
    CHECK_EQ_STR(prog_op_name(OP_ATTENTION), "ATTENTION");
    CHECK_EQ_STR(prog_op_name(99), "?");
    program_free(p);
}

TEST(kv_blocks)
{
    struct kv_config kc = {.n_layer = 2, .kv_dim = 4, .max_seqs = 3, .max_ctx = 10,
                           .block_size = 4, .n_blocks = 6, .type = DT_F32};
    struct kv_cache *kv;
    struct weld_err e;
    REQUIRE(kv_create(&kv, &kc, &e) == WELD_OK);
    CHECK_EQ_INT(kv->max_blocks_per_seq, 3);
    CHECK_EQ_INT(kv_n_free_blocks(kv), 6);
    CHECK_EQ_INT(kv_seq_prepare(kv, 0, 0, 5, &e), WELD_OK); /* 2 blocks */
    CHECK_EQ_INT(kv_seq_prepare(kv, 1, 0, 9, &e), WELD_OK); /* 3 blocks */
    CHECK_EQ_INT(kv_n_free_blocks(kv), 1);
    CHECK_EQ_INT(kv_seq_blocks_needed(kv, 0, 5, 4), 1);
    CHECK_EQ_INT(kv_seq_prepare(kv, 2, 0, 5, &e), WELD_ERR_LIMIT); /* needs 2, 1 free */
    CHECK_EQ_INT(kv_seq_len(kv, 2), 0);
    CHECK_EQ_INT(kv_n_free_blocks(kv), 1);
    CHECK_EQ_INT(kv_seq_prepare(kv, 0, 7, 1, &e), WELD_ERR_INVALID_ARG); /* gap */
    CHECK_EQ_INT(kv_seq_prepare(kv, 0, 0, 11, &e), WELD_ERR_LIMIT);     /* past max_ctx */
    CHECK_EQ_INT(kv_seq_prepare(kv, 3, 0, 1, &e), WELD_ERR_INVALID_ARG);
    /* rows are distinct per (layer, seq, pos) and stable across table growth */
    float *r0 = (float *)kv_pos_head(kv, kv->k, 1, kv->seqs[0].blocks, 4, 0);
    r0[0] = 42;
    CHECK((float *)kv_pos_head(kv, kv->k, 0, kv->seqs[0].blocks, 4, 0) != r0 &&
          (float *)kv_pos_head(kv, kv->v, 1, kv->seqs[0].blocks, 4, 0) != r0);
    CHECK((float *)kv_pos_head(kv, kv->k, 1, kv->seqs[1].blocks, 4, 0) != r0);
    CHECK_EQ_INT(kv_seq_prepare(kv, 0, 5, 3, &e), WELD_OK);
    CHECK(((float *)kv_pos_head(kv, kv->k, 1, kv->seqs[0].blocks, 4, 0))[0] == 42);
    /* truncating to a block boundary frees the blocks after it */
    kv_seq_truncate(kv, 1, 4);
    CHECK_EQ_INT(kv_seq_len(kv, 1), 4);
    CHECK_EQ_INT(kv_n_free_blocks(kv), 3);
    CHECK_EQ_INT(kv_seq_prepare(kv, 1, 2, 1, &e), WELD_OK); /* rewind inside a block */
    CHECK_EQ_INT(kv_seq_len(kv, 1), 3);
    CHECK_EQ_INT(kv_n_free_blocks(kv), 3);
    kv_seq_drop(kv, 0);
    kv_seq_drop(kv, 99);
    CHECK_EQ_INT(kv_n_free_blocks(kv), 5);
    /* every block is owned once: free + tables == n_blocks, no duplicates */
    int seen[6] = {0};
    for (int i = 0; i < kv->n_free; i++)
        seen[kv->free_ids[i]]++;
    for (int s = 0; s < 3; s++)
        for (int i = 0; i < kv->seqs[s].n_blocks; i++)
            seen[kv->seqs[s].blocks[i]]++;
    for (int i = 0; i < 6; i++)
        CHECK_EQ_INT(seen[i], 1);
    kv_reset(kv);
    CHECK_EQ_INT(kv_n_free_blocks(kv), 6);
    kv_free(kv);
    kv_free(NULL);
    kc.type = DT_Q4_0;
    CHECK_EQ_INT(kv_create(&kv, &kc, &e), WELD_ERR_UNSUPPORTED);
    kc.type = DT_F32, kc.kv_dim = 0;
    CHECK_EQ_INT(kv_create(&kv, &kc, &e), WELD_ERR_INVALID_ARG);
    kc.kv_dim = 1 << 30, kc.n_layer = 1 << 30;
    CHECK_EQ_INT(kv_create(&kv, &kc, &e), WELD_ERR_LIMIT);
}

int main(void)
{
    RUN(splits_and_counts);
    RUN(final_slices);
    RUN(counter_chain);
    RUN(buffer_plan);
    RUN(k_parts);
    RUN(head_deps_buffers_never_race);
    RUN(shape_matching);
    RUN(kv_blocks);
    return test_summary();
}
