/*
 * Tests of the scheduler: rejection, token budget, decodes first, chunked prefill,
 * max_num_seqs, FCFS and priority order, recompute preemption and the later recompute,
 * failure of a sequence that cannot fit alone, abort, fork with copy-on-write, prefix hits
 * across requests, and a randomized soak. The soak plays the exec side with a shadow KV
 * store (queued copies applied in order, then each entry's tokens written into its
 * blocks) and checks every step that each running sequence reads back exactly its own
 * tokens, that every block's refcount equals the number of tables holding it, that
 * free + cached + used = n_blocks and that no step exceeds its budget; it ends with every
 * block free.
 */
#include "engine/sched.h"

#include "core/alloc.h"
#include "core/log.h"
#include "core/rng.h"
#include "test.h"

static struct sched *mk(int n_blocks, int bs, int budget, int max_seqs, int max_len,
                        enum sched_policy pol)
{
    struct sched_config c = sched_config_default();
    c.kv.n_blocks = n_blocks;
    c.kv.block_size = bs;
    c.max_num_batched_tokens = budget;
    c.max_num_seqs = max_seqs;
    c.max_model_len = max_len;
    c.policy = pol;
    struct sched *s = NULL;
    struct weld_err e = {0};
    if (sched_create(&s, &c, &e))
        fprintf(stderr, "sched_create: %s\n", e.msg);
    return s;
}

static struct sched_seq *add(struct sched *s, uint64_t id, int n, int base, int prio)
{
    int32_t tok[4096];
    for (int i = 0; i < n && i < 4096; i++)
        tok[i] = base + i;
    struct sched_seq_params p = {.id = id, .priority = prio, .tokens = tok, .n_tokens = n};
    struct sched_seq *seq = NULL;
    struct weld_err e = {0};
    if (sched_add(s, &p, &seq, &e))
        fprintf(stderr, "sched_add: %s\n", e.msg);
    return seq;
}

static bool checked(struct sched *s)
{
    struct weld_err e = {0};
    if (sched_check(s, &e)) {
        fprintf(stderr, "sched_check: %s\n", e.msg);
        return false;
    }
    return true;
}

/* Step, mark done, and append token 7 to every sampling entry. */
static void cycle(struct sched *s, struct sched_plan *p)
{
    struct weld_err e = {0};
    CHECK_EQ_INT(sched_step(s, p, &e), WELD_OK);
    CHECK_EQ_INT(sched_step_done(s, &e), WELD_OK);
    for (int i = 0; i < p->n_entries; i++)
        if (p->entries[i].sample && p->entries[i].seq)
            CHECK_EQ_INT(sched_append_token(s, p->entries[i].seq, 7, NULL), WELD_OK);
    CHECK(checked(s));
}

static const struct sched_entry *entry_of(const struct sched_plan *p, const struct sched_seq *q)
{
    for (int i = 0; i < p->n_entries; i++)
        if (p->entries[i].seq == q)
            return &p->entries[i];
    return NULL;
}

TEST(config_and_rejection)
{
    struct sched_config c = sched_config_default();
    struct weld_err e = {0};
    CHECK_EQ_INT(sched_config_check(&c, &e), WELD_ERR_INVALID_ARG); /* no pool */
    c.kv.n_blocks = 4;
    CHECK_EQ_INT(sched_config_check(&c, &e), WELD_OK);
    c.max_num_seqs = 0;
    CHECK_EQ_INT(sched_config_check(&c, &e), WELD_ERR_INVALID_ARG);
    CHECK(strstr(e.msg, "max_num_seqs") != NULL);
    sched_free(NULL);

    struct sched *s = mk(4, 4, 64, 8, 20, SCHED_POLICY_FCFS);
    REQUIRE(s);
    struct sched_seq *q = NULL;
    int32_t tok[32] = {0};
    struct sched_seq_params p = {.id = 9, .tokens = tok, .n_tokens = 21};
    CHECK_EQ_INT(sched_add(s, &p, &q, &e), WELD_ERR_LIMIT);
    CHECK(strstr(e.msg, "max_model_len 20") != NULL && strstr(e.msg, "request 9") != NULL);
    CHECK(q == NULL);
    sched_free(s);
    s = mk(4, 4, 64, 8, 100, SCHED_POLICY_FCFS);
    REQUIRE(s);
    p.n_tokens = 17;
    CHECK_EQ_INT(sched_add(s, &p, &q, &e), WELD_ERR_LIMIT);
    CHECK(strstr(e.msg, "needs 5 KV blocks") != NULL && strstr(e.msg, "has 4") != NULL);
    p.n_tokens = 0;
    CHECK_EQ_INT(sched_add(s, &p, &q, &e), WELD_ERR_INVALID_ARG);
    p.n_tokens = 16;
    CHECK_EQ_INT(sched_add(s, &p, &q, &e), WELD_OK);
    struct sched_stats st;
    sched_stats_get(s, &st);
    CHECK_EQ_INT(st.n_rejected, 1); /* this instance refused the 17-token prompt */
    CHECK_EQ_INT(st.n_waiting, 1);
    CHECK(!sched_idle(s));
    sched_free(s); /* releases the waiting sequence */
}

TEST(budget_decodes_first_and_chunking)
{
    struct sched *s = mk(64, 4, 8, 8, 256, SCHED_POLICY_FCFS);
    REQUIRE(s);
    struct sched_plan p;
    struct sched_seq *a = add(s, 1, 3, 100, 0);
    REQUIRE(a);
    cycle(s, &p);
    REQUIRE(p.n_entries == 1);
    CHECK(p.entries[0].seq == a && p.entries[0].n_tokens == 3 && p.entries[0].sample);
    struct sched_seq *b = add(s, 2, 30, 500, 0);
    struct sched_seq *c = add(s, 3, 2, 900, 0);
    REQUIRE(b && c);
    int b_next = 0, steps = 0;
    while (b->n_computed < b->n_tokens - 1 && steps < 20) {
        cycle(s, &p);
        steps++;
        CHECK(p.n_tokens <= 8);
        REQUIRE(p.n_entries >= 1);
        CHECK(p.entries[0].seq == a); /* the decode first */
        CHECK_EQ_INT(p.entries[0].n_tokens, 1);
        CHECK(p.entries[0].sample);
        const struct sched_entry *eb = entry_of(&p, b);
        REQUIRE(eb);
        CHECK_EQ_INT(eb->first, b_next); /* contiguous chunks */
        CHECK_EQ_INT(eb->n_tokens, b_next + 7 <= 30 ? 7 : 30 - b_next); /* the rest: 2 */
        b_next += eb->n_tokens;
        CHECK_EQ_INT(eb->sample, b_next == 30);
        CHECK(eb->n_blocks * 4 >= eb->first + eb->n_tokens);
        /* c waits until b's prompt no longer takes the whole remaining budget */
        if (b_next < 28)
            CHECK(entry_of(&p, c) == NULL);
    }
    CHECK_EQ_INT(b_next, 30);
    CHECK_EQ_INT(steps, 5); /* 7 + 7 + 7 + 7 + 2 */
    /* The last step had room: c was admitted in it, after a's decode and b's chunk. */
    const struct sched_entry *ec = entry_of(&p, c);
    REQUIRE(ec);
    CHECK(ec == &p.entries[2] && ec->n_tokens == 2 && ec->sample);
    cycle(s, &p); /* three decodes */
    CHECK_EQ_INT(p.n_entries, 3);
    CHECK_EQ_INT(p.n_tokens, 3);
    sched_finish(s, a);
    sched_finish(s, b);
    sched_finish(s, c);
    CHECK(sched_idle(s));
    struct sched_stats st;
    sched_stats_get(s, &st);
    CHECK_EQ_INT(st.kv.n_used, 0);
    CHECK_EQ_INT(st.n_finished, 3);
    sched_free(s);
}

TEST(max_num_seqs)
{
    struct sched *s = mk(64, 4, 100, 2, 256, SCHED_POLICY_FCFS);
    REQUIRE(s);
    struct sched_seq *q[3];
    for (int i = 0; i < 3; i++)
        REQUIRE((q[i] = add(s, (uint64_t)i, 5, 10 * i, 0)));
    struct sched_plan p;
    cycle(s, &p);
    CHECK_EQ_INT(p.n_entries, 2);
    CHECK(entry_of(&p, q[2]) == NULL);
    cycle(s, &p);
    CHECK_EQ_INT(p.n_entries, 2);
    CHECK_EQ_INT(q[2]->state, SCHED_WAITING);
    sched_finish(s, q[0]);
    cycle(s, &p);
    CHECK_EQ_INT(p.n_entries, 2);
    CHECK(entry_of(&p, q[2]) != NULL && entry_of(&p, q[2])->n_tokens == 5);
    sched_finish(s, q[1]);
    sched_finish(s, q[2]);
    sched_free(s);
}

/* Admission order with a budget that lets exactly one 4-token prompt in per step. */
static void admission_order(enum sched_policy pol, const int *prio, const int *want)
{
    struct sched *s = mk(64, 4, 4, 8, 256, pol);
    REQUIRE(s);
    struct sched_seq *q[4];
    for (int i = 0; i < 4; i++)
        REQUIRE((q[i] = add(s, (uint64_t)i, 4, 10 * i, prio[i])));
    struct sched_plan p;
    struct weld_err e = {0};
    for (int k = 0; k < 4; k++) {
        CHECK_EQ_INT(sched_step(s, &p, &e), WELD_OK);
        REQUIRE(p.n_entries == 1);
        CHECK_EQ_INT(p.entries[0].seq->id, want[k]);
        CHECK_EQ_INT(sched_step_done(s, &e), WELD_OK);
        sched_finish(s, p.entries[0].seq); /* keep the budget for the next admission */
    }
    CHECK(sched_idle(s));
    sched_free(s);
}

TEST(fcfs_vs_priority)
{
    const int prio[4] = {5, 1, 3, 1};
    const int fcfs[4] = {0, 1, 2, 3};
    const int by_prio[4] = {1, 3, 2, 0};
    admission_order(SCHED_POLICY_FCFS, prio, fcfs);
    admission_order(SCHED_POLICY_PRIORITY, prio, by_prio);
}

TEST(preemption_and_recompute)
{
    /* 6 blocks of 4: two 8-token prompts take 4 blocks; decoding grows both. */
    struct sched *s = mk(6, 4, 64, 8, 256, SCHED_POLICY_FCFS);
    REQUIRE(s);
    struct sched_seq *a = add(s, 1, 8, 100, 0), *b = add(s, 2, 8, 200, 0);
    REQUIRE(a && b);
    struct sched_plan p;
    int preempt_step = -1;
    for (int step = 0; step < 12 && preempt_step < 0; step++) {
        cycle(s, &p);
        if (p.n_preempted > 0)
            preempt_step = step;
    }
    /* a: 12 tokens need 3 blocks, b: 9 need 3 -> 6; the step after, a needs a 4th. */
    REQUIRE(preempt_step >= 0);
    CHECK_EQ_INT(p.n_preempted, 1);
    CHECK(p.preempted[0] == b); /* the newest */
    CHECK_EQ_INT(b->state, SCHED_WAITING);
    CHECK_EQ_INT(b->n_computed, 0);
    CHECK_EQ_INT(b->table.n_blocks, 0);
    CHECK_EQ_INT(b->n_preemptions, 1);
    CHECK(entry_of(&p, b) == NULL);
    CHECK(entry_of(&p, a) != NULL);
    struct sched_stats st;
    sched_stats_get(s, &st);
    CHECK_EQ_INT(st.n_preemptions, 1);
    CHECK_EQ_INT(st.n_waiting, 1);
    int b_tokens = b->n_tokens;
    CHECK(b_tokens > 8);
    /* Nothing is admitted while a holds the pool; once a finishes, b recomputes its
       prompt and generated tokens, helped by whatever of its prefix is still cached. */
    for (int k = 0; k < 3; k++) {
        cycle(s, &p);
        CHECK(entry_of(&p, b) == NULL);
    }
    sched_finish(s, a);
    cycle(s, &p);
    const struct sched_entry *eb = entry_of(&p, b);
    REQUIRE(eb);
    CHECK(eb->first % 4 == 0 && eb->first < b_tokens);
    CHECK_EQ_INT(eb->first + eb->n_tokens, b_tokens);
    CHECK(eb->sample);
    CHECK_EQ_INT(b->n_tokens, b_tokens + 1);
    CHECK_EQ_INT(b->n_cached, 0); /* counted at its first admission only */
    sched_finish(s, b);
    sched_stats_get(s, &st);
    CHECK_EQ_INT(st.kv.n_used, 0);
    sched_free(s);
}

TEST(priority_preempts_lowest_priority)
{
    struct sched *s = mk(6, 4, 64, 8, 256, SCHED_POLICY_PRIORITY);
    REQUIRE(s);
    struct sched_seq *lo = add(s, 1, 8, 100, 9), *hi = add(s, 2, 8, 200, 0);
    REQUIRE(lo && hi);
    struct sched_plan p;
    for (int step = 0; step < 12; step++) {
        cycle(s, &p);
        if (p.n_preempted > 0)
            break;
    }
    REQUIRE(p.n_preempted == 1);
    CHECK(p.preempted[0] == lo); /* older, but lower priority */
    sched_free(s);
}

TEST(lone_sequence_fails)
{
    struct sched *s = mk(2, 4, 64, 8, 100, SCHED_POLICY_FCFS);
    REQUIRE(s);
    struct sched_seq *a = add(s, 1, 6, 0, 0);
    REQUIRE(a);
    struct sched_plan p;
    for (int k = 0; k < 4; k++)
        cycle(s, &p); /* the 4th step computes position 8: a third block */
    CHECK_EQ_INT(p.n_failed, 1);
    CHECK(p.failed[0] == a);
    CHECK_EQ_INT(a->state, SCHED_FAILED);
    CHECK_EQ_INT(a->table.n_blocks, 0);
    CHECK(!sched_idle(s));
    struct sched_stats st;
    sched_stats_get(s, &st);
    CHECK_EQ_INT(st.n_failed, 1);
    CHECK_EQ_INT(st.kv.n_used, 0);
    CHECK_EQ_INT(st.n_preemptions, 0);
    sched_finish(s, a);
    CHECK(sched_idle(s));
    sched_free(s);

    /* A fork preempted after outgrowing a one-block pool fails when it reaches the head. */
    s = mk(1, 4, 64, 8, 100, SCHED_POLICY_FCFS);
    REQUIRE(s);
    a = add(s, 1, 4, 0, 0);
    REQUIRE(a);
    struct weld_err e = {0};
    CHECK_EQ_INT(sched_step(s, &p, &e), WELD_OK);
    CHECK_EQ_INT(sched_step_done(s, &e), WELD_OK);
    struct sched_seq *c = NULL;
    CHECK_EQ_INT(sched_fork(s, a, 2, NULL, &c, &e), WELD_OK);
    CHECK_EQ_INT(sched_append_token(s, a, 1, NULL), WELD_OK);
    CHECK_EQ_INT(sched_append_token(s, c, 2, NULL), WELD_OK);
    CHECK_EQ_INT(sched_step(s, &p, &e), WELD_OK);
    CHECK(p.n_preempted == 1 && p.preempted[0] == c);
    CHECK(p.n_failed == 1 && p.failed[0] == a);
    CHECK_EQ_INT(p.n_entries, 0);
    CHECK_EQ_INT(sched_step_done(s, &e), WELD_OK);
    sched_finish(s, a);
    CHECK_EQ_INT(sched_step(s, &p, &e), WELD_OK);
    CHECK(p.n_failed == 1 && p.failed[0] == c);
    CHECK_EQ_INT(sched_step_done(s, &e), WELD_OK);
    CHECK(checked(s));
    sched_finish(s, c);
    CHECK(sched_idle(s));
    sched_free(s);
}

TEST(abort_frees_at_once)
{
    struct sched *s = mk(16, 4, 64, 8, 100, SCHED_POLICY_FCFS);
    REQUIRE(s);
    struct sched_seq *a = add(s, 1, 10, 0, 0), *b = add(s, 2, 10, 50, 0);
    REQUIRE(a && b);
    struct sched_plan p;
    cycle(s, &p);
    struct sched_stats st;
    sched_stats_get(s, &st);
    CHECK_EQ_INT(st.kv.n_used, 6);
    sched_abort(s, a);
    sched_stats_get(s, &st);
    CHECK_EQ_INT(st.kv.n_used, 3);
    CHECK_EQ_INT(st.n_aborted, 1);
    /* Abort between sched_step and sched_step_done: the entry is cleared. */
    struct weld_err e = {0};
    CHECK_EQ_INT(sched_step(s, &p, &e), WELD_OK);
    REQUIRE(p.n_entries == 1);
    sched_abort(s, b);
    CHECK(p.entries[0].seq == NULL);
    CHECK_EQ_INT(sched_step_done(s, &e), WELD_OK);
    sched_stats_get(s, &st);
    CHECK_EQ_INT(st.kv.n_used, 0);
    /* A failed forward pass: cancel computes nothing and caches nothing. */
    struct sched_seq *d = add(s, 4, 9, 300, 0);
    REQUIRE(d);
    CHECK_EQ_INT(sched_step(s, &p, &e), WELD_OK);
    sched_step_cancel(s);
    CHECK_EQ_INT(d->n_computed, 0);
    CHECK_EQ_INT(d->table.n_blocks, 3);
    CHECK(checked(s));
    cycle(s, &p); /* planned again from token 0 */
    REQUIRE(p.n_entries == 1);
    CHECK_EQ_INT(p.entries[0].first, 0);
    CHECK_EQ_INT(p.entries[0].n_tokens, 9);
    sched_abort(s, d);
    sched_stats_get(s, &st);
    int cached_before = st.kv.n_cached;
    int32_t other[12];
    for (int i = 0; i < 12; i++)
        other[i] = 7000 + i;
    struct sched_seq_params sp = {.id = 5, .tokens = other, .n_tokens = 12};
    struct sched_seq *d2 = NULL;
    REQUIRE(sched_add(s, &sp, &d2, NULL) == WELD_OK);
    CHECK_EQ_INT(sched_step(s, &p, &e), WELD_OK);
    sched_step_cancel(s);
    sched_abort(s, d2); /* its blocks were never computed: nothing cached */
    sched_stats_get(s, &st);
    CHECK_EQ_INT(st.kv.n_cached, cached_before);
    /* Aborting a waiting sequence. */
    struct sched_seq *c = add(s, 3, 4, 0, 0);
    REQUIRE(c);
    sched_abort(s, c);
    sched_abort(s, NULL);
    CHECK(sched_idle(s));
    CHECK(checked(s));
    sched_free(s);
}

TEST(plan_stable_while_walked)
{
    /* Forks and releases after sched_step_done, while the entries are being walked: the
       arrays do not move and released sequences read as NULL. */
    struct sched *s = mk(256, 4, 1024, 64, 100, SCHED_POLICY_FCFS);
    REQUIRE(s);
    struct sched_seq *q[8];
    for (int i = 0; i < 8; i++)
        REQUIRE((q[i] = add(s, (uint64_t)i, 5, 100 * i, 0)));
    struct sched_plan p;
    struct weld_err e = {0};
    CHECK_EQ_INT(sched_step(s, &p, &e), WELD_OK);
    CHECK_EQ_INT(sched_step_done(s, &e), WELD_OK);
    const struct sched_entry *entries = p.entries;
    REQUIRE(p.n_entries == 8);
    for (int i = 0; i < p.n_entries; i++) {
        if (!p.entries[i].seq)
            continue;
        for (int k = 0; k < 5; k++) { /* 8 * 6 sequences: past the arrays' first size */
            struct sched_seq *c = NULL;
            CHECK_EQ_INT(sched_fork(s, p.entries[i].seq, 1000, NULL, &c, &e), WELD_OK);
        }
        if (i % 2 == 0)
            sched_finish(s, q[i + 1]);
    }
    CHECK(p.entries == entries);
    for (int i = 0; i < 8; i++)
        CHECK((p.entries[i].seq == NULL) == (i % 2 == 1));
    struct sched_stats st;
    sched_stats_get(s, &st);
    CHECK_EQ_INT(st.n_running, 4 + 4 * 5); /* the odd ones went before their turn */
    CHECK(checked(s));
    /* A step after that sizes the plan for everyone; out of memory there changes nothing. */
    alloc_fail_at(1);
    CHECK_EQ_INT(sched_step(s, &p, &e), WELD_ERR_NOMEM);
    alloc_fail_at(0);
    CHECK(checked(s));
    cycle(s, &p);
    CHECK_EQ_INT(p.n_entries, 0); /* everyone computed, nothing appended */
    sched_free(s);
}

TEST(fork_copy_on_write)
{
    struct sched *s = mk(16, 4, 64, 8, 100, SCHED_POLICY_FCFS);
    REQUIRE(s);
    struct sched_seq *a = add(s, 1, 6, 0, 0);
    REQUIRE(a);
    struct sched_plan p;
    struct weld_err e = {0};
    CHECK_EQ_INT(sched_step(s, &p, &e), WELD_OK);
    CHECK_EQ_INT(sched_step_done(s, &e), WELD_OK);
    struct sched_seq *c1 = NULL, *c2 = NULL;
    CHECK_EQ_INT(sched_fork(s, a, 11, NULL, &c1, &e), WELD_OK);
    CHECK_EQ_INT(sched_fork(s, a, 12, NULL, &c2, &e), WELD_OK);
    REQUIRE(c1 && c2);
    CHECK_EQ_INT(c1->n_computed, 6);
    CHECK_EQ_INT(kvm_block_ref(sched_kvm(s), a->table.blocks[1]), 3);
    CHECK_EQ_INT(sched_append_token(s, a, 1, NULL), WELD_OK);
    CHECK_EQ_INT(sched_append_token(s, c1, 2, NULL), WELD_OK);
    CHECK_EQ_INT(sched_append_token(s, c2, 3, NULL), WELD_OK);
    CHECK_EQ_INT(sched_append_token(s, c2, 3, NULL), WELD_ERR_INVALID_ARG); /* not computed */
    CHECK(checked(s));
    CHECK_EQ_INT(sched_step(s, &p, &e), WELD_OK);
    CHECK_EQ_INT(p.n_entries, 3);
    CHECK_EQ_INT(p.n_copies, 2); /* a and c1 copy the shared partial block; c2 keeps it */
    int shared = c2->table.blocks[1];
    CHECK(a->table.blocks[1] != shared && c1->table.blocks[1] != shared);
    CHECK_EQ_INT(p.copies[0].src, shared);
    CHECK_EQ_INT(p.copies[1].src, shared);
    CHECK_EQ_INT(a->table.blocks[0], c2->table.blocks[0]); /* full block still shared */
    CHECK_EQ_INT(sched_step_done(s, &e), WELD_OK);
    CHECK(checked(s));
    /* Fork is refused for a sequence with uncomputed tokens. */
    CHECK_EQ_INT(sched_append_token(s, a, 1, NULL), WELD_OK);
    struct sched_seq *c3 = NULL;
    CHECK_EQ_INT(sched_fork(s, a, 13, NULL, &c3, &e), WELD_ERR_INVALID_ARG);
    sched_finish(s, a);
    sched_finish(s, c1);
    sched_finish(s, c2);
    struct sched_stats st;
    sched_stats_get(s, &st);
    CHECK_EQ_INT(st.kv.n_used, 0);
    CHECK_EQ_INT(st.kv.cow_copies, 2);
    sched_free(s);
}

/* Speculative entries: a decode with a draft is planned as 1 + k tokens (cut by the
   budget, by max_model_len, and to none when its blocks are not free); only its known
   token is committed, so rejected drafts never enter the prefix cache; accepted ones
   are committed when taken and can be hit afterwards. */
TEST(speculative_drafts)
{
    struct sched *s = mk(8, 4, 64, 8, 40, SCHED_POLICY_FCFS);
    REQUIRE(s);
    struct sched_seq *a = add(s, 1, 6, 100, 0);
    REQUIRE(a);
    struct sched_plan p;
    struct weld_err e;
    cycle(s, &p); /* prefill 6, append 7: 7 tokens, 6 computed */
    const int32_t draft[5] = {50, 51, 52, 53, 54};
    CHECK_EQ_INT(sched_set_draft(s, a, draft, 5, &e), WELD_OK);
    CHECK_EQ_INT(sched_step(s, &p, &e), WELD_OK);
    REQUIRE(p.n_entries == 1);
    CHECK_EQ_INT(p.entries[0].n_tokens, 6);
    CHECK_EQ_INT(p.entries[0].n_draft, 5);
    CHECK(p.entries[0].sample);
    CHECK(!memcmp(a->tokens + 7, draft, sizeof draft));
    CHECK_EQ_INT(sched_step_done(s, &e), WELD_OK);
    CHECK_EQ_INT(a->n_computed, 7);                                      /* the known token only */
    CHECK_EQ_INT(sched_accept_draft(s, a, 6, &e), WELD_ERR_INVALID_ARG); /* more than planned */
    CHECK_EQ_INT(sched_accept_draft(s, a, 2, &e), WELD_OK);              /* 50, 51 taken */
    CHECK_EQ_INT(a->n_tokens, 9);
    CHECK_EQ_INT(a->n_computed, 9);
    CHECK_EQ_INT(sched_append_token(s, a, 99, &e), WELD_OK); /* the sampled one: not 52 */
    CHECK_EQ_INT(a->n_draft, 0);
    CHECK(checked(s));
    /* a's blocks: tokens 100..106, 7, 50, 51 committed (two full blocks of 4 plus 2) */
    sched_finish(s, a);
    int32_t want[12] = {100, 101, 102, 103, 104, 105, 7, 50, 51, 99, 0, 0};
    int32_t rejected[12] = {100, 101, 102, 103, 104, 105, 7, 50, 51, 52, 53, 54};
    struct sched_seq_params sp = {.id = 2, .tokens = rejected, .n_tokens = 12};
    struct sched_seq *b = NULL;
    REQUIRE(sched_add(s, &sp, &b, &e) == WELD_OK);
    cycle(s, &p);
    CHECK_EQ_INT(b->n_cached, 8); /* 100..7, 50: the drafted 52.. never cached */
    sched_finish(s, b);
    (void)want;
    /* budget 3: one known token and two of the draft; max_model_len and blocks cut too */
    struct sched *t = mk(3, 4, 3, 8, 40, SCHED_POLICY_FCFS);
    REQUIRE(t);
    struct sched_seq *c = add(t, 3, 3, 0, 0);
    cycle(t, &p);
    CHECK_EQ_INT(sched_set_draft(t, c, draft, 5, &e), WELD_OK);
    CHECK_EQ_INT(sched_step(t, &p, &e), WELD_OK);
    CHECK_EQ_INT(p.entries[0].n_draft, 2);
    CHECK_EQ_INT(sched_step_done(t, &e), WELD_OK);
    CHECK_EQ_INT(sched_append_token(t, c, 1, &e), WELD_OK);
    /* c: 5 tokens, blocks 0 and 1 (its draft reached position 6); d takes block 2 */
    struct sched_seq *d = add(t, 4, 4, 200, 0);
    cycle(t, &p);
    REQUIRE(d && d->state == SCHED_RUNNING && c->state == SCHED_RUNNING);
    CHECK_EQ_INT(sched_set_draft(t, c, draft, 5, &e), WELD_OK);
    CHECK_EQ_INT(sched_step(t, &p, &e), WELD_OK);
    const struct sched_entry *en = entry_of(&p, c);
    REQUIRE(en);
    CHECK_EQ_INT(en->n_draft, 2); /* the budget again (d's decode comes after c's) */
    CHECK_EQ_INT(sched_step_done(t, &e), WELD_OK);
    CHECK_EQ_INT(sched_set_draft(t, c, draft, 5, &e), WELD_ERR_INVALID_ARG); /* not a decode */
    (void)d;
    /* blocks: 2 of 4 tokens, a 4-token sequence (3 computed) drafts 5: positions up to 7
       fit its two blocks, the fifth guess would need a third */
    struct sched *u = mk(2, 4, 64, 8, 40, SCHED_POLICY_FCFS);
    REQUIRE(u);
    struct sched_seq *f = add(u, 5, 3, 0, 0);
    cycle(u, &p);
    CHECK_EQ_INT(sched_set_draft(u, f, draft, 5, &e), WELD_OK);
    CHECK_EQ_INT(sched_step(u, &p, &e), WELD_OK);
    CHECK_EQ_INT(p.entries[0].n_draft, 4);
    CHECK_EQ_INT(sched_step_done(u, &e), WELD_OK);
    sched_free(u);
    sched_free(t);
    sched_free(s);
}

TEST(prefix_hits_across_requests)
{
    struct sched *s = mk(32, 4, 64, 8, 100, SCHED_POLICY_FCFS);
    REQUIRE(s);
    struct sched_seq *a = add(s, 1, 18, 0, 0), *a2 = add(s, 2, 18, 0, 0);
    REQUIRE(a && a2);
    struct sched_plan p;
    cycle(s, &p);
    /* Same step: a2 cannot use blocks that a is only now computing; it waits for them
       rather than compute them too, and hits them in the next step. */
    CHECK_EQ_INT(p.n_entries, 1);
    CHECK_EQ_INT(a2->state, SCHED_WAITING);
    cycle(s, &p);
    REQUIRE(entry_of(&p, a2));
    CHECK_EQ_INT(a2->n_cached, 16);
    CHECK_EQ_INT(entry_of(&p, a2)->first, 16);
    struct sched_stats st;
    sched_stats_get(s, &st);
    CHECK_EQ_INT(st.n_prefix_waits, 1);
    sched_finish(s, a);
    sched_finish(s, a2);
    struct sched_seq *b = add(s, 3, 18, 0, 0);
    REQUIRE(b);
    cycle(s, &p);
    CHECK_EQ_INT(b->n_cached, 16);
    CHECK_EQ_INT(entry_of(&p, b)->first, 16);
    CHECK_EQ_INT(entry_of(&p, b)->n_tokens, 2);
    /* Same prompt with a salt: no hit. */
    int32_t tok[18];
    for (int i = 0; i < 18; i++)
        tok[i] = i;
    struct sched_seq_params sp = {.id = 4, .tokens = tok, .n_tokens = 18,
                                  .cache_salt = "x", .cache_salt_len = 1};
    struct sched_seq *c = NULL;
    CHECK_EQ_INT(sched_add(s, &sp, &c, NULL), WELD_OK);
    cycle(s, &p);
    CHECK_EQ_INT(c->n_cached, 0);
    sched_stats_get(s, &st);
    CHECK_EQ_INT(st.kv.hit_tokens, 2 * 16);
    CHECK_EQ_INT(st.kv.query_tokens, 4 * 18);
    CHECK_EQ_INT(st.n_prefix_waits, 1);
    sched_free(s);
}

TEST(waiting_for_an_inflight_prefix)
{
    /* A long prompt prefilled in chunks: a second prompt sharing its first 32 tokens waits
       until they are cached, then computes only its own tail. */
    struct sched *s = mk(64, 4, 12, 8, 200, SCHED_POLICY_FCFS);
    REQUIRE(s);
    int32_t t1[40], t2[36];
    for (int i = 0; i < 40; i++)
        t1[i] = i < 32 ? 500 + i : i;
    for (int i = 0; i < 36; i++)
        t2[i] = i < 32 ? 500 + i : -i;
    struct sched_seq_params p1 = {.id = 1, .tokens = t1, .n_tokens = 40};
    struct sched_seq_params p2 = {.id = 2, .tokens = t2, .n_tokens = 36};
    struct sched_seq *a = NULL, *b = NULL;
    REQUIRE(sched_add(s, &p1, &a, NULL) == WELD_OK && sched_add(s, &p2, &b, NULL) == WELD_OK);
    struct sched_plan p;
    int steps = 0;
    while (b->state == SCHED_WAITING && steps < 10) {
        cycle(s, &p);
        steps++;
    }
    CHECK_EQ_INT(steps, 4); /* a: 12, 12, 12 (b waits for each next block), then 4 */
    CHECK_EQ_INT(b->n_cached, 32);
    CHECK_EQ_INT(entry_of(&p, b)->first, 32);
    sched_finish(s, a);
    sched_finish(s, b);

    /* The wait ends if the sequence computing the prefix goes away. */
    REQUIRE(sched_add(s, &p1, &a, NULL) == WELD_OK);
    int32_t t3[40];
    for (int i = 0; i < 40; i++)
        t3[i] = 9000 + i; /* a new prefix, so nothing is cached yet */
    struct sched_seq_params p3 = {.id = 3, .tokens = t3, .n_tokens = 40};
    struct sched_seq *c = NULL, *d = NULL;
    REQUIRE(sched_add(s, &p3, &c, NULL) == WELD_OK && sched_add(s, &p3, &d, NULL) == WELD_OK);
    cycle(s, &p); /* a hits 36 and computes 4; c computes 8 of its 40; d waits */
    REQUIRE(entry_of(&p, c) != NULL);
    CHECK_EQ_INT(entry_of(&p, c)->n_tokens, 8);
    CHECK_EQ_INT(d->state, SCHED_WAITING);
    cycle(s, &p); /* a decodes, c 11 more, d still waits */
    CHECK_EQ_INT(d->state, SCHED_WAITING);
    sched_abort(s, c); /* c's 16 committed tokens stay cached */
    cycle(s, &p);
    REQUIRE(entry_of(&p, d));
    CHECK_EQ_INT(d->n_cached, 16);
    CHECK_EQ_INT(entry_of(&p, d)->first, 16);
    sched_free(s);

    /* Without prefix caching nobody waits. */
    struct sched_config cfg = sched_config_default();
    cfg.kv.n_blocks = 64;
    cfg.kv.block_size = 4;
    cfg.kv.prefix_caching = false;
    cfg.max_num_batched_tokens = 100;
    REQUIRE(sched_create(&s, &cfg, NULL) == WELD_OK);
    REQUIRE(sched_add(s, &p1, &a, NULL) == WELD_OK && sched_add(s, &p2, &b, NULL) == WELD_OK);
    cycle(s, &p);
    CHECK_EQ_INT(p.n_entries, 2);
    sched_free(s);
}

/* ---- soak ---------------------------------------------------------------------------- */

#define SOAK_MAX 64

struct soak_req {
    struct sched_seq *seq;
    int target; /* finish when n_tokens reaches this */
};

static uint64_t rbelow(struct rng *g, uint64_t n)
{
    return rng_u64(g) % n;
}

/* The exec side: copies in order, then every entry's tokens into its blocks. */
static void soak_write(int32_t *kv, int bs, const struct sched_plan *p)
{
    for (int i = 0; i < p->n_copies; i++)
        memcpy(kv + (size_t)p->copies[i].dst * bs, kv + (size_t)p->copies[i].src * bs,
               (size_t)bs * sizeof *kv);
    for (int i = 0; i < p->n_entries; i++) {
        const struct sched_entry *en = &p->entries[i];
        for (int t = en->first; t < en->first + en->n_tokens; t++)
            kv[(size_t)en->blocks[t / bs] * bs + t % bs] = en->seq->tokens[t];
    }
}

static bool soak_reads_back(const int32_t *kv, int bs, const struct sched_seq *q)
{
    for (int t = 0; t < q->n_computed; t++)
        if (kv[(size_t)q->table.blocks[t / bs] * bs + t % bs] != q->tokens[t])
            return false;
    return true;
}

static void soak_check_plan(const struct sched_plan *p, int budget, int max_len)
{
    CHECK(p->n_tokens <= budget);
    int sum = 0;
    for (int i = 0; i < p->n_entries; i++) {
        const struct sched_entry *en = &p->entries[i];
        sum += en->n_tokens;
        CHECK(en->n_tokens >= 1 && en->first == en->seq->n_computed);
        CHECK(en->first + en->n_tokens <= en->seq->n_tokens && en->seq->n_tokens <= max_len);
        CHECK(en->sample == (en->first + en->n_tokens == en->seq->n_tokens));
        for (int j = 0; j < i; j++)
            CHECK(p->entries[j].seq != en->seq);
    }
    CHECK_EQ_INT(sum, p->n_tokens);
}

static int soak_find(struct soak_req *r, const struct sched_seq *q)
{
    for (int i = 0; i < SOAK_MAX; i++)
        if (r[i].seq == q)
            return i;
    return -1;
}

static void soak_add(struct sched *s, struct soak_req *r, struct rng *g, uint64_t id)
{
    int slot = soak_find(r, NULL);
    if (slot < 0)
        return;
    int32_t tok[80];
    int n = 1 + (int)rbelow(g, 60), fam = (int)rbelow(g, 4);
    for (int i = 0; i < n; i++)
        tok[i] = i < 20 ? fam * 1000 + i : (int32_t)rbelow(g, 5);
    struct sched_seq_params sp = {.id = id, .priority = (int)rbelow(g, 4), .tokens = tok,
                                  .n_tokens = n};
    const struct sched_config *c = sched_get_config(s);
    bool fits = n <= c->max_model_len && (n + c->kv.block_size - 1) / c->kv.block_size <=
                                             c->kv.n_blocks;
    CHECK_EQ_INT(sched_add(s, &sp, &r[slot].seq, NULL), fits ? WELD_OK : WELD_ERR_LIMIT);
    r[slot].target = n + 1 + (int)rbelow(g, 30);
}

/* After the forward pass: sample, fork, finish, like the engine would. */
static void soak_after(struct sched *s, struct soak_req *r, struct rng *g,
                       const struct sched_plan *p, uint64_t *next_id)
{
    for (int i = 0; i < p->n_failed; i++) {
        int k = soak_find(r, p->failed[i]);
        REQUIRE(k >= 0);
        sched_finish(s, r[k].seq);
        r[k].seq = NULL;
    }
    for (int i = 0; i < p->n_entries; i++) {
        const struct sched_entry *en = &p->entries[i];
        if (!en->sample || !en->seq)
            continue;
        int k = soak_find(r, en->seq);
        REQUIRE(k >= 0);
        int slot = soak_find(r, NULL);
        if (slot >= 0 && rbelow(g, 20) == 0 &&
            en->seq->n_tokens < sched_get_config(s)->max_model_len) {
            CHECK_EQ_INT(sched_fork(s, en->seq, (*next_id)++, NULL, &r[slot].seq, NULL), 0);
            r[slot].target = r[k].target;
            CHECK_EQ_INT(sched_append_token(s, r[slot].seq, 77, NULL), WELD_OK);
        }
        if (en->seq->n_tokens + 1 >= r[k].target ||
            en->seq->n_tokens >= sched_get_config(s)->max_model_len) {
            sched_finish(s, en->seq);
            r[k].seq = NULL;
        } else {
            CHECK_EQ_INT(sched_append_token(s, en->seq, (int32_t)rbelow(g, 5), NULL), 0);
        }
    }
}

/* The step rules, checked from outside on each plan (before sched_step_done). was_* are
   the states and tokens left of the soak's sequences before sched_step. */
struct soak_snap {
    struct sched_seq *seq;
    enum sched_state state;
    int left;
};

static int key_cmp(enum sched_policy pol, const struct sched_seq *a, const struct sched_seq *b)
{
    if (pol == SCHED_POLICY_PRIORITY && a->priority != b->priority)
        return a->priority < b->priority ? -1 : 1;
    if (a->arrival != b->arrival)
        return a->arrival < b->arrival ? -1 : 1;
    return a->serial < b->serial ? -1 : a->serial > b->serial;
}

static const struct soak_snap *snap_of(const struct soak_snap *sn, const struct sched_seq *q)
{
    for (int i = 0; i < SOAK_MAX; i++)
        if (sn[i].seq == q)
            return &sn[i];
    return NULL;
}

static void soak_check_order(const struct sched_plan *p, const struct soak_snap *sn,
                             enum sched_policy pol, int budget)
{
    int prev_group = 0, sum = 0;
    for (int i = 0; i < p->n_entries; i++) {
        const struct sched_entry *en = &p->entries[i];
        const struct soak_snap *w = snap_of(sn, en->seq);
        REQUIRE(w);
        int group = w->state == SCHED_WAITING ? 2 : w->left == 1 ? 0 : 1;
        CHECK(w->state != SCHED_FAILED);
        CHECK(group >= prev_group); /* decodes, then continuations, then admissions */
        if (i > 0 && group == prev_group)
            CHECK(key_cmp(pol, p->entries[i - 1].seq, en->seq) < 0);
        sum += en->n_tokens;
        if (p->n_preempted == 0) /* a chunk is all that is left, or all the budget left */
            CHECK(en->first + en->n_tokens == en->seq->n_tokens || sum == budget);
        prev_group = group;
    }
}

/* A sequence running now (admitted earlier in this step counts too) holds head's tokens
   [0, end) but had not computed them all before this step, and head could hit them
   (end < its length). Salts are not used by the soak. */
static bool soak_block_in_flight(const struct soak_snap *sn, const struct sched_seq *head,
                                 int end)
{
    if (end >= head->n_tokens)
        return false;
    for (int i = 0; i < SOAK_MAX; i++) {
        const struct sched_seq *q = sn[i].seq;
        if (!q || q->state != SCHED_RUNNING ||
            q->n_tokens < end || q->n_computed >= end)
            continue;
        bool same = true;
        for (int t = 0; t < end && same; t++)
            same = q->tokens[t] == head->tokens[t];
        if (same)
            return true;
    }
    return false;
}

static void soak_check_rules(struct sched *s, const struct sched_plan *p,
                             const struct soak_snap *sn, int budget, int max_seqs)
{
    enum sched_policy pol = sched_get_config(s)->policy;
    soak_check_order(p, sn, pol, budget);
    const struct sched_seq *head = NULL;
    int n_admitted = 0, n_running = 0;
    for (int i = 0; i < SOAK_MAX; i++) {
        const struct sched_seq *q = sn[i].seq;
        if (!q)
            continue;
        bool has_entry = false;
        for (int j = 0; j < p->n_entries; j++)
            has_entry |= p->entries[j].seq == q;
        n_running += q->state == SCHED_RUNNING;
        n_admitted += sn[i].state == SCHED_WAITING && q->state == SCHED_RUNNING;
        /* the newest go first: everything still running is older than anything preempted */
        for (int j = 0; j < p->n_preempted && q->state == SCHED_RUNNING; j++)
            CHECK(key_cmp(pol, q, p->preempted[j]) < 0);
        if (p->n_preempted == 0 && sn[i].state == SCHED_RUNNING && sn[i].left > 0 &&
            q->state == SCHED_RUNNING && !has_entry)
            CHECK_EQ_INT(p->n_tokens, budget); /* skipped only when the budget ran out */
        if (q->state == SCHED_WAITING && (!head || key_cmp(pol, q, head) < 0))
            head = q;
    }
    CHECK(p->n_preempted == 0 || n_admitted == 0);
    if (n_admitted > 0)
        CHECK(n_running <= max_seqs);
    /* admissions are a prefix of the waiting queue: the head left behind is newer */
    for (int j = 0; j < p->n_entries && head; j++)
        if (snap_of(sn, p->entries[j].seq)->state == SCHED_WAITING)
            CHECK(key_cmp(pol, p->entries[j].seq, head) < 0);
    /* budget and seats left but the head stayed: its chunk's blocks were not there, or it
       waits for its next block, which a running sequence is still computing */
    if (head && p->n_preempted == 0 && p->n_tokens < budget && n_running < max_seqs) {
        struct kvm *m = sched_kvm(s);
        int ev = 0, bs = kvm_block_size(m);
        int hit = kvm_prefix_peek(m, &head->table, head->tokens, head->n_tokens, &ev);
        int n = head->n_tokens - hit;
        if (n > budget - p->n_tokens)
            n = budget - p->n_tokens;
        CHECK(kvm_blocks_for(m, hit + n) - hit / bs > kvm_n_available(m) - ev ||
              soak_block_in_flight(sn, head, hit + bs));
    }
}

struct soak_cfg {
    int n_blocks, bs, budget, max_seqs, max_len;
    enum sched_policy pol;
    bool caching;
    uint64_t seed;
    int n_steps; /* with random adds and aborts; then it runs until idle */
};

/* One step of the soak with every check; returns whether it ran or failed anything. */
static bool soak_step(struct sched *s, const struct soak_cfg *c, struct soak_req *r,
                      struct rng *g, int32_t *kv, uint64_t *next_id)
{
    struct soak_snap sn[SOAK_MAX];
    for (int k = 0; k < SOAK_MAX; k++) {
        sn[k].seq = r[k].seq;
        sn[k].state = r[k].seq ? r[k].seq->state : SCHED_WAITING;
        sn[k].left = r[k].seq ? r[k].seq->n_tokens - r[k].seq->n_computed : 0;
    }
    struct sched_plan p;
    struct weld_err e = {0};
    if (sched_step(s, &p, &e) != WELD_OK) {
        fprintf(stderr, "sched_step: %s\n", e.msg);
        CHECK(false);
        return false;
    }
    soak_check_plan(&p, c->budget, c->max_len);
    soak_check_rules(s, &p, sn, c->budget, c->max_seqs);
    soak_write(kv, c->bs, &p);
    CHECK_EQ_INT(sched_step_done(s, &e), WELD_OK);
    soak_after(s, r, g, &p, next_id);
    CHECK(checked(s));
    for (int k = 0; k < SOAK_MAX; k++)
        if (r[k].seq && r[k].seq->state == SCHED_RUNNING)
            CHECK(soak_reads_back(kv, c->bs, r[k].seq));
    return p.n_entries > 0 || p.n_failed > 0;
}

static void soak(const struct soak_cfg *c, struct sched_stats *st)
{
    struct sched_config sc = sched_config_default();
    sc.kv.n_blocks = c->n_blocks;
    sc.kv.block_size = c->bs;
    sc.kv.prefix_caching = c->caching;
    sc.max_num_batched_tokens = c->budget;
    sc.max_num_seqs = c->max_seqs;
    sc.max_model_len = c->max_len;
    sc.policy = c->pol;
    struct sched *s = NULL;
    REQUIRE(sched_create(&s, &sc, NULL) == WELD_OK);
    int32_t *kv = calloc((size_t)c->n_blocks * c->bs, sizeof *kv);
    struct soak_req r[SOAK_MAX];
    memset(r, 0, sizeof r);
    struct rng g;
    rng_seed(&g, c->seed);
    uint64_t next_id = 0;
    for (int step = 0; step < c->n_steps && !test_cur_failed; step++) {
        for (int k = 0; k < 2; k++)
            if (rbelow(&g, 3) == 0)
                soak_add(s, r, &g, next_id++);
        if (rbelow(&g, 25) == 0) {
            int k = (int)rbelow(&g, SOAK_MAX);
            if (r[k].seq) {
                sched_abort(s, r[k].seq);
                r[k].seq = NULL;
            }
        }
        soak_step(s, c, r, &g, kv, &next_id);
    }
    int idle_steps = 0;
    for (int step = 0; step < 200000 && !sched_idle(s) && !test_cur_failed; step++)
        idle_steps += !soak_step(s, c, r, &g, kv, &next_id);
    CHECK_EQ_INT(idle_steps, 0); /* work left always means something runs */
    sched_stats_get(s, st);
    CHECK(sched_idle(s));
    CHECK_EQ_INT(st->kv.n_used, 0);
    CHECK_EQ_INT(st->kv.n_free + st->kv.n_cached, c->n_blocks);
    free(kv);
    sched_free(s);
}

TEST(soak_fcfs)
{
    struct soak_cfg c = {24, 4, 32, 6, 100, SCHED_POLICY_FCFS, true, 7, 20000};
    struct sched_stats st;
    soak(&c, &st);
    CHECK(st.n_preemptions > 100 && st.kv.hit_tokens > 1000 && st.kv.cow_copies > 10);
    CHECK(st.n_aborted > 100 && st.n_finished > 1000);
}

TEST(soak_priority)
{
    struct soak_cfg c = {24, 4, 32, 6, 100, SCHED_POLICY_PRIORITY, true, 8, 20000};
    struct sched_stats st;
    soak(&c, &st);
    CHECK(st.n_preemptions > 100 && st.kv.hit_tokens > 1000 && st.kv.cow_copies > 10);
}

TEST(soak_edge_configs)
{
    /* blocks of one token, a budget of one token, one seat, a one-block pool (most
       prompts rejected, the rest fail once they outgrow it), no prefix caching, a short
       max_model_len, a pool far larger than needed. */
    const struct soak_cfg cs[] = {
        {64, 1, 16, 4, 100, SCHED_POLICY_FCFS, true, 11, 3000},
        {40, 4, 1, 6, 100, SCHED_POLICY_PRIORITY, true, 12, 3000},
        {24, 4, 32, 1, 100, SCHED_POLICY_FCFS, true, 13, 3000},
        {1, 16, 32, 4, 100, SCHED_POLICY_FCFS, true, 14, 3000},
        {24, 4, 32, 6, 100, SCHED_POLICY_FCFS, false, 15, 3000},
        {24, 4, 32, 6, 24, SCHED_POLICY_PRIORITY, true, 16, 3000},
        {4096, 16, 64, 64, 100, SCHED_POLICY_FCFS, true, 17, 3000},
    };
    for (size_t i = 0; i < sizeof cs / sizeof cs[0] && !test_cur_failed; i++) {
        struct sched_stats st;
        soak(&cs[i], &st);
        if (test_cur_failed)
            fprintf(stderr, "soak_edge_configs: config %zu\n", i);
        if (i == 3)
            CHECK(st.n_rejected > 0 && st.n_finished > 0);
        if (i == 4)
            CHECK_EQ_INT(st.kv.hit_tokens, 0);
    }
}

TEST(soak_random_configs)
{
    /* 40 configurations around the edges: pools of 8-47 blocks of 1-7 tokens, budgets of
       1-50, 1-9 seats, max_model_len 30-119, both policies, caching mostly on. */
    for (int sd = 100; sd < 140 && !test_cur_failed; sd++) {
        struct soak_cfg c = {8 + sd % 40, 1 + sd % 7, 1 + sd % 50, 1 + sd % 9, 30 + sd % 90,
                             (enum sched_policy)(sd % 2), sd % 5 != 0, (uint64_t)sd, 2000};
        struct sched_stats st;
        soak(&c, &st);
        if (test_cur_failed)
            fprintf(stderr, "soak_random_configs: seed %d\n", sd);
    }
}

TEST(allocation_failures)
{
    struct sched *s = mk(16, 4, 64, 8, 100, SCHED_POLICY_FCFS);
    REQUIRE(s);
    int32_t tok[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    struct sched_seq_params sp = {.id = 1, .tokens = tok, .n_tokens = 8};
    struct sched_seq *q = NULL;
    int n_fail = 0;
    for (int k = 1; k <= 6; k++) {
        alloc_fail_at(k);
        int rc = sched_add(s, &sp, &q, NULL);
        alloc_fail_at(0);
        CHECK(rc == WELD_OK || rc == WELD_ERR_NOMEM);
        n_fail += rc != WELD_OK;
        CHECK(checked(s));
    }
    CHECK(n_fail > 0);
    struct sched_stats st;
    sched_stats_get(s, &st);
    CHECK_EQ_INT(st.n_waiting, 6 - n_fail);
    sched_free(s);
}

TEST(allocation_failures_mid_run)
{
    /* Random steps, adds, forks and appends with an allocation failing now and then
       (table growth inside sched_step included): every call reports WELD_ERR_NOMEM or
       succeeds, and the scheduler stays consistent and drains. */
    struct sched *s = mk(40, 2, 24, 8, 200, SCHED_POLICY_FCFS);
    REQUIRE(s);
    struct soak_req r[SOAK_MAX];
    memset(r, 0, sizeof r);
    struct rng g;
    rng_seed(&g, 5);
    int n_nomem = 0;
    for (int step = 0; step < 6000 && !test_cur_failed; step++) {
        bool adding = step < 4000;
        if (adding && rbelow(&g, 2) == 0) {
            int slot = soak_find(r, NULL);
            int32_t tok[40];
            int n = 1 + (int)rbelow(&g, 30);
            for (int i = 0; i < n; i++)
                tok[i] = i < 10 ? (int32_t)i : (int32_t)rbelow(&g, 4);
            struct sched_seq_params sp = {.id = (uint64_t)step, .tokens = tok, .n_tokens = n};
            if (slot >= 0) {
                alloc_fail_at(rbelow(&g, 4) == 0 ? 1 + (long)rbelow(&g, 4) : 0);
                int rc = sched_add(s, &sp, &r[slot].seq, NULL);
                alloc_fail_at(0);
                CHECK(rc == WELD_OK || rc == WELD_ERR_NOMEM);
                n_nomem += rc == WELD_ERR_NOMEM;
                r[slot].target = n + 1 + (int)rbelow(&g, 20);
            }
        }
        struct sched_plan p;
        alloc_fail_at(rbelow(&g, 3) == 0 ? 1 + (long)rbelow(&g, 3) : 0);
        int rc = sched_step(s, &p, NULL);
        alloc_fail_at(0);
        CHECK(rc == WELD_OK || rc == WELD_ERR_NOMEM);
        CHECK(checked(s));
        if (rc) {
            n_nomem++;
            continue;
        }
        CHECK_EQ_INT(sched_step_done(s, NULL), WELD_OK);
        for (int i = 0; i < p.n_entries; i++) {
            struct sched_seq *q = p.entries[i].seq;
            int k = q ? soak_find(r, q) : -1;
            if (!q || !p.entries[i].sample || k < 0)
                continue;
            int slot = soak_find(r, NULL);
            if (slot >= 0 && adding && rbelow(&g, 10) == 0) {
                alloc_fail_at(1 + (long)rbelow(&g, 3));
                int frc = sched_fork(s, q, 1, NULL, &r[slot].seq, NULL);
                alloc_fail_at(0);
                CHECK(frc == WELD_OK || frc == WELD_ERR_NOMEM);
                r[slot].target = r[k].target;
            }
            if (q->n_tokens + 1 >= r[k].target) {
                sched_finish(s, q);
                r[k].seq = NULL;
                continue;
            }
            alloc_fail_at(rbelow(&g, 4) == 0 ? 1 : 0);
            int arc = sched_append_token(s, q, 3, NULL);
            alloc_fail_at(0);
            CHECK(arc == WELD_OK || arc == WELD_ERR_NOMEM);
            if (arc) { /* what an engine would do: end the sequence */
                sched_abort(s, q);
                r[k].seq = NULL;
            }
        }
        CHECK(checked(s));
    }
    CHECK(n_nomem > 100);
    CHECK(sched_idle(s));
    struct sched_stats st;
    sched_stats_get(s, &st);
    CHECK_EQ_INT(st.kv.n_used, 0);
    sched_free(s);
}

int main(void)
{
    log_set_level(LOG_WARN);
    RUN(config_and_rejection);
    RUN(budget_decodes_first_and_chunking);
    RUN(max_num_seqs);
    RUN(fcfs_vs_priority);
    RUN(preemption_and_recompute);
    RUN(priority_preempts_lowest_priority);
    RUN(lone_sequence_fails);
    RUN(abort_frees_at_once);
    RUN(plan_stable_while_walked);
    RUN(fork_copy_on_write);
    RUN(speculative_drafts);
    RUN(prefix_hits_across_requests);
    RUN(waiting_for_an_inflight_prefix);
    RUN(soak_fcfs);
    RUN(soak_priority);
    RUN(soak_edge_configs);
    RUN(soak_random_configs);
    RUN(allocation_failures);
    RUN(allocation_failures_mid_run);
    return test_summary();
}
