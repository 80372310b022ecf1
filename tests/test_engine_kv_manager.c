/*
 * Tests of the KV block manager: refcounts, hash chains (salt, parent), eviction order,
 * fork with copy-on-write, exhaustion, counters, allocation failures, and a randomized
 * run against a shadow KV store: every token written goes into a per-block content array
 * (after the queued copies are applied, in order), and every table must read back exactly
 * its own tokens, including blocks that came from the prefix cache or a fork.
 */
#include "engine/kv_manager.h"

#include "core/alloc.h"
#include "core/rng.h"
#include "test.h"

static uint64_t rbelow(struct rng *g, uint64_t n)
{
    return rng_u64(g) % n;
}

static struct kvm *mk(int n_blocks, int bs, bool caching)
{
    struct kvm_config c = kvm_config_default();
    c.n_blocks = n_blocks;
    c.block_size = bs;
    c.prefix_caching = caching;
    struct kvm *m = NULL;
    struct weld_err e = {0};
    if (kvm_create(&m, &c, &e))
        fprintf(stderr, "kvm_create: %s\n", e.msg);
    return m;
}

static void seq_tokens(int32_t *t, int n, int base)
{
    for (int i = 0; i < n; i++)
        t[i] = base + i;
}

static bool consistent(struct kvm *m)
{
    struct weld_err e = {0};
    if (kvm_check(m, &e)) {
        fprintf(stderr, "kvm_check: %s\n", e.msg);
        return false;
    }
    return true;
}

/* Reserve, write (no data here) and commit n tokens. */
static int run_tokens(struct kvm *m, struct kvm_table *t, const int32_t *tok, int n)
{
    int rc = kvm_table_reserve(m, t, n, NULL);
    return rc ? rc : kvm_table_commit(m, t, tok, n, NULL);
}

TEST(config_checks)
{
    struct kvm_config c = kvm_config_default();
    struct weld_err e = {0};
    CHECK_EQ_INT(c.block_size, 16);
    CHECK(c.prefix_caching);
    CHECK_EQ_INT(kvm_config_check(&c, &e), WELD_ERR_INVALID_ARG); /* n_blocks 0 */
    CHECK(strstr(e.msg, "n_blocks") != NULL);
    c.n_blocks = 4;
    c.block_size = 0;
    CHECK_EQ_INT(kvm_config_check(&c, &e), WELD_ERR_INVALID_ARG);
    CHECK(strstr(e.msg, "block_size") != NULL);
    c.block_size = 4096;
    c.n_blocks = 1 << 20;
    CHECK_EQ_INT(kvm_config_check(&c, &e), WELD_ERR_INVALID_ARG); /* slots overflow int */
    struct kvm *m = NULL;
    CHECK_EQ_INT(kvm_create(&m, &c, NULL), WELD_ERR_INVALID_ARG);
    CHECK(m == NULL);
    kvm_free(NULL);
}

TEST(refcounts_and_release)
{
    struct kvm *m = mk(8, 4, true);
    REQUIRE(m);
    int32_t tok[10];
    seq_tokens(tok, 10, 100);
    struct kvm_table a;
    kvm_table_init(&a, NULL, 0);
    CHECK_EQ_INT(kvm_blocks_for(m, 10), 3);
    CHECK_EQ_INT(kvm_blocks_for(m, 0), 0);
    CHECK_EQ_INT(kvm_table_blocks_needed(m, &a, 10), 3);
    CHECK_EQ_INT(run_tokens(m, &a, tok, 10), WELD_OK);
    CHECK_EQ_INT(a.n_blocks, 3);
    CHECK_EQ_INT(a.n_computed, 10);
    CHECK_EQ_INT(a.n_hashed, 2);
    struct kvm_stats st;
    kvm_stats_get(m, &st);
    CHECK_EQ_INT(st.n_used, 3);
    CHECK_EQ_INT(st.n_free, 5);
    CHECK_EQ_INT(st.n_cached, 0);
    CHECK_NEAR(st.usage, 3.0 / 8, 1e-12);
    for (int i = 0; i < 3; i++)
        CHECK_EQ_INT(kvm_block_ref(m, a.blocks[i]), 1);
    CHECK_EQ_INT(kvm_block_ref(m, -1), -1);
    CHECK_EQ_INT(kvm_block_ref(m, 8), -1);
    /* Committing backwards or past the table is refused. */
    CHECK_EQ_INT(kvm_table_commit(m, &a, tok, 9, NULL), WELD_ERR_INVALID_ARG);
    CHECK_EQ_INT(kvm_table_commit(m, &a, tok, 13, NULL), WELD_ERR_INVALID_ARG);
    /* A second table sharing the prefix: two full blocks hit, refcount 2. */
    struct kvm_table b;
    kvm_table_init(&b, NULL, 0);
    int cached = -1;
    CHECK_EQ_INT(kvm_prefix_take(m, &b, tok, 10, &cached, NULL), WELD_OK);
    CHECK_EQ_INT(cached, 8);
    CHECK_EQ_INT(b.n_blocks, 2);
    CHECK_EQ_INT(b.blocks[0], a.blocks[0]);
    CHECK_EQ_INT(b.blocks[1], a.blocks[1]);
    CHECK_EQ_INT(kvm_block_ref(m, a.blocks[0]), 2);
    CHECK_EQ_INT(kvm_block_ref(m, a.blocks[2]), 1);
    int32_t a_ids[3] = {a.blocks[0], a.blocks[1], a.blocks[2]};
    kvm_table_free(m, &a);
    CHECK(a.blocks == NULL && a.n_blocks == 0 && a.n_computed == 0);
    kvm_stats_get(m, &st);
    CHECK_EQ_INT(st.n_used, 2);  /* b's two */
    CHECK_EQ_INT(st.n_cached, 0);
    CHECK_EQ_INT(st.n_free, 6);  /* a's partial block has no reusable content */
    CHECK_EQ_INT(kvm_block_ref(m, a_ids[2]), 0);
    kvm_table_free(m, &b);
    kvm_stats_get(m, &st);
    CHECK_EQ_INT(st.n_used, 0);
    CHECK_EQ_INT(st.n_cached, 2);
    CHECK_EQ_INT(st.n_free, 6);
    CHECK_EQ_INT(st.lookups, 1);
    CHECK_EQ_INT(st.query_tokens, 10);
    CHECK_EQ_INT(st.hit_tokens, 8);
    CHECK(consistent(m));
    kvm_table_free(m, NULL);
    kvm_free(m);
}

TEST(never_the_whole_prompt)
{
    struct kvm *m = mk(8, 4, true);
    REQUIRE(m);
    int32_t tok[8];
    seq_tokens(tok, 8, 7);
    struct kvm_table a, b;
    kvm_table_init(&a, NULL, 0);
    kvm_table_init(&b, NULL, 0);
    CHECK_EQ_INT(run_tokens(m, &a, tok, 8), WELD_OK);
    kvm_table_free(m, &a);
    CHECK_EQ_INT(kvm_prefix_peek(m, &b, tok, 8, NULL), 4); /* 8 cached, 1 must be computed */
    CHECK_EQ_INT(kvm_prefix_peek(m, &b, tok, 9, NULL), 8); /* (a 9th token unknown here) */
    CHECK_EQ_INT(kvm_prefix_peek(m, &b, tok, 4, NULL), 0);
    CHECK_EQ_INT(kvm_prefix_peek(m, &b, tok, 1, NULL), 0);
    int ev = -1;
    CHECK_EQ_INT(kvm_prefix_peek(m, &b, tok, 7, &ev), 4);
    CHECK_EQ_INT(ev, 1);
    int cached = -1;
    CHECK_EQ_INT(kvm_prefix_take(m, &b, tok, 8, &cached, NULL), WELD_OK);
    CHECK_EQ_INT(cached, 4);
    CHECK_EQ_INT(b.n_computed, 4);
    /* The rest computes normally; blocks_needed counts just one more. */
    CHECK_EQ_INT(kvm_table_blocks_needed(m, &b, 8), 1);
    CHECK_EQ_INT(run_tokens(m, &b, tok, 8), WELD_OK);
    kvm_table_free(m, &b);
    CHECK(consistent(m));
    kvm_free(m);
}

TEST(hash_chain_salt_and_parent)
{
    struct kvm *m = mk(16, 4, true);
    REQUIRE(m);
    int32_t tok[9];
    seq_tokens(tok, 9, 50);
    struct kvm_table a, b;
    kvm_table_init(&a, "tenant-a", 8);
    CHECK(a.has_salt);
    CHECK_EQ_INT(run_tokens(m, &a, tok, 9), WELD_OK);
    kvm_table_init(&b, NULL, 0);
    CHECK_EQ_INT(kvm_prefix_peek(m, &b, tok, 9, NULL), 0); /* no salt != salt */
    kvm_table_init(&b, "tenant-b", 8);
    CHECK_EQ_INT(kvm_prefix_peek(m, &b, tok, 9, NULL), 0); /* other salt */
    kvm_table_init(&b, "tenant-a", 8);
    CHECK_EQ_INT(kvm_prefix_peek(m, &b, tok, 9, NULL), 8); /* same salt */
    kvm_table_free(m, &a);

    /* Same second block after a different first block: no hit on either. */
    int32_t p1[9], p2[9];
    seq_tokens(p1, 9, 1000);
    seq_tokens(p2, 9, 1000);
    p2[0] = 999; /* first block differs, second block tokens identical */
    struct kvm_table c, d;
    kvm_table_init(&c, NULL, 0);
    kvm_table_init(&d, NULL, 0);
    CHECK_EQ_INT(run_tokens(m, &c, p1, 8), WELD_OK);
    CHECK_EQ_INT(kvm_prefix_peek(m, &d, p2, 9, NULL), 0);
    CHECK_EQ_INT(run_tokens(m, &d, p2, 8), WELD_OK);
    /* Both second blocks got registered: they are distinct keys. */
    kvm_table_free(m, &c);
    kvm_table_free(m, &d);
    struct kvm_stats st;
    kvm_stats_get(m, &st);
    CHECK_EQ_INT(st.n_cached, 2 + 4);
    struct kvm_table q;
    kvm_table_init(&q, NULL, 0);
    CHECK_EQ_INT(kvm_prefix_peek(m, &q, p1, 9, NULL), 8);
    CHECK_EQ_INT(kvm_prefix_peek(m, &q, p2, 9, NULL), 8);
    /* A prompt that diverges inside block 1 hits block 0 only. */
    p1[6] = -5;
    CHECK_EQ_INT(kvm_prefix_peek(m, &q, p1, 9, NULL), 4);
    CHECK(consistent(m));
    kvm_free(m);
}

TEST(caching_off)
{
    struct kvm *m = mk(8, 4, false);
    REQUIRE(m);
    int32_t tok[9];
    seq_tokens(tok, 9, 3);
    struct kvm_table a, b;
    kvm_table_init(&a, NULL, 0);
    kvm_table_init(&b, NULL, 0);
    CHECK_EQ_INT(run_tokens(m, &a, tok, 9), WELD_OK);
    kvm_table_free(m, &a);
    int cached = -1;
    CHECK_EQ_INT(kvm_prefix_take(m, &b, tok, 9, &cached, NULL), WELD_OK);
    CHECK_EQ_INT(cached, 0);
    struct kvm_stats st;
    kvm_stats_get(m, &st);
    CHECK_EQ_INT(st.n_cached, 0);
    CHECK_EQ_INT(st.n_free, 8);
    CHECK_EQ_INT(st.query_tokens, 9);
    CHECK_EQ_INT(st.hit_tokens, 0);
    kvm_free(m);
}

TEST(eviction_order)
{
    struct kvm *m = mk(4, 2, true);
    REQUIRE(m);
    int32_t tok[9];
    seq_tokens(tok, 9, 10);
    struct kvm_table a, c, q;
    kvm_table_init(&a, NULL, 0);
    kvm_table_init(&c, NULL, 0);
    kvm_table_init(&q, NULL, 0);
    CHECK_EQ_INT(run_tokens(m, &a, tok, 8), WELD_OK);
    kvm_table_free(m, &a); /* LRU: a3 a2 a1 a0 (last block first) */
    CHECK_EQ_INT(kvm_prefix_peek(m, &q, tok, 9, NULL), 8);
    CHECK_EQ_INT(kvm_table_reserve(m, &c, 2, NULL), WELD_OK);
    CHECK_EQ_INT(kvm_prefix_peek(m, &q, tok, 9, NULL), 6); /* the end went first */
    CHECK_EQ_INT(kvm_table_reserve(m, &c, 4, NULL), WELD_OK);
    CHECK_EQ_INT(kvm_prefix_peek(m, &q, tok, 9, NULL), 4);
    struct kvm_stats st;
    kvm_stats_get(m, &st);
    CHECK_EQ_INT(st.evictions, 2);
    CHECK_EQ_INT(st.n_cached, 2);
    kvm_table_free(m, &c); /* c's blocks had no computed content: free, not cached */
    kvm_stats_get(m, &st);
    CHECK_EQ_INT(st.n_free, 2);
    /* Free blocks go before cached ones. */
    CHECK_EQ_INT(kvm_table_reserve(m, &c, 4, NULL), WELD_OK);
    kvm_stats_get(m, &st);
    CHECK_EQ_INT(st.evictions, 2);
    CHECK_EQ_INT(st.n_cached, 2);
    kvm_table_free(m, &c);

    kvm_cache_reset(m);
    kvm_stats_get(m, &st);
    CHECK_EQ_INT(st.n_free, 4);
    CHECK_EQ_INT(kvm_prefix_peek(m, &q, tok, 9, NULL), 0);

    /* Recency: X then Y released (LRU: X Y); a hit on X moves it behind Y. */
    int32_t x[3] = {500, 501, 502}, y[3] = {600, 601, 602};
    CHECK_EQ_INT(run_tokens(m, &c, x, 2), WELD_OK);
    kvm_table_free(m, &c);
    CHECK_EQ_INT(run_tokens(m, &c, y, 2), WELD_OK);
    kvm_table_free(m, &c);
    int cached = 0;
    CHECK_EQ_INT(kvm_prefix_take(m, &q, x, 3, &cached, NULL), WELD_OK);
    CHECK_EQ_INT(cached, 2);
    kvm_table_free(m, &q);
    CHECK_EQ_INT(kvm_table_reserve(m, &c, 6, NULL), WELD_OK); /* 2 free + evict Y */
    CHECK_EQ_INT(kvm_prefix_peek(m, &q, x, 3, NULL), 2);
    CHECK_EQ_INT(kvm_prefix_peek(m, &q, y, 3, NULL), 0);
    kvm_stats_get(m, &st);
    CHECK_EQ_INT(st.evictions, 3);
    kvm_table_free(m, &c);
    CHECK(consistent(m));
    kvm_free(m);
}

TEST(fork_copy_on_write)
{
    struct kvm *m = mk(8, 4, true);
    REQUIRE(m);
    int32_t tok[16];
    seq_tokens(tok, 16, 1);
    struct kvm_table p, ch;
    kvm_table_init(&p, NULL, 0);
    kvm_table_init(&ch, NULL, 0);
    CHECK_EQ_INT(run_tokens(m, &p, tok, 6), WELD_OK);
    CHECK_EQ_INT(kvm_table_fork(m, &ch, &p, NULL), WELD_OK);
    CHECK_EQ_INT(kvm_table_fork(m, &ch, &p, NULL), WELD_ERR_INVALID_ARG); /* not empty */
    CHECK_EQ_INT(ch.n_computed, 6);
    CHECK_EQ_INT(kvm_block_ref(m, p.blocks[0]), 2);
    CHECK_EQ_INT(kvm_block_ref(m, p.blocks[1]), 2);
    int shared_last = p.blocks[1];
    CHECK_EQ_INT(kvm_table_blocks_needed(m, &p, 7), 1);
    CHECK_EQ_INT(kvm_table_blocks_needed(m, &p, 6), 0); /* nothing written */
    CHECK_EQ_INT(kvm_table_reserve(m, &p, 7, NULL), WELD_OK);
    int n = 0;
    const struct kvm_copy *cp = kvm_copies(m, &n);
    REQUIRE(n == 1);
    CHECK_EQ_INT(cp[0].src, shared_last);
    CHECK_EQ_INT(cp[0].dst, p.blocks[1]);
    CHECK(p.blocks[1] != shared_last);
    CHECK_EQ_INT(kvm_block_ref(m, shared_last), 1);
    CHECK_EQ_INT(kvm_block_ref(m, p.blocks[1]), 1);
    CHECK_EQ_INT(kvm_block_ref(m, p.blocks[0]), 2);
    /* The child now owns the old block alone: no second copy. */
    CHECK_EQ_INT(kvm_table_reserve(m, &ch, 7, NULL), WELD_OK);
    CHECK_EQ_INT(ch.blocks[1], shared_last);
    kvm_copies(m, &n);
    CHECK_EQ_INT(n, 1);
    CHECK_EQ_INT(kvm_table_reserve(m, &p, 7, NULL), WELD_OK); /* repeated: no change */
    kvm_copies(m, &n);
    CHECK_EQ_INT(n, 1);
    struct kvm_stats st;
    kvm_stats_get(m, &st);
    CHECK_EQ_INT(st.cow_copies, 1);
    kvm_copies_clear(m);
    kvm_copies(m, &n);
    CHECK_EQ_INT(n, 0);

    /* Fork on a block boundary: the next block is new for both, no copy. */
    CHECK_EQ_INT(kvm_table_commit(m, &p, tok, 7, NULL), WELD_OK);
    CHECK_EQ_INT(kvm_table_reserve(m, &p, 8, NULL), WELD_OK);
    CHECK_EQ_INT(kvm_table_commit(m, &p, tok, 8, NULL), WELD_OK);
    struct kvm_table g;
    kvm_table_init(&g, NULL, 0);
    CHECK_EQ_INT(kvm_table_fork(m, &g, &p, NULL), WELD_OK);
    CHECK_EQ_INT(kvm_table_reserve(m, &g, 9, NULL), WELD_OK);
    kvm_copies(m, &n);
    CHECK_EQ_INT(n, 0);
    CHECK_EQ_INT(g.blocks[1], p.blocks[1]);
    CHECK_EQ_INT(kvm_block_ref(m, p.blocks[1]), 2);

    /* A queued copy whose destination is released is dropped. */
    struct kvm_table h;
    kvm_table_init(&h, NULL, 0);
    CHECK_EQ_INT(kvm_table_fork(m, &h, &ch, NULL), WELD_OK); /* ch: 6 computed, 2 blocks */
    CHECK_EQ_INT(kvm_table_reserve(m, &h, 7, NULL), WELD_OK);
    kvm_copies(m, &n);
    CHECK_EQ_INT(n, 1);
    kvm_table_free(m, &h);
    kvm_copies(m, &n);
    CHECK_EQ_INT(n, 0);
    CHECK(consistent(m));
    kvm_table_free(m, &p);
    kvm_table_free(m, &ch);
    kvm_table_free(m, &g);
    kvm_stats_get(m, &st);
    CHECK_EQ_INT(st.n_used, 0);
    CHECK(consistent(m));
    kvm_free(m);
}

TEST(exhaustion_changes_nothing)
{
    struct kvm *m = mk(4, 4, true);
    REQUIRE(m);
    int32_t tok[16];
    seq_tokens(tok, 16, 1);
    struct kvm_table a, b, c;
    kvm_table_init(&a, NULL, 0);
    kvm_table_init(&b, NULL, 0);
    kvm_table_init(&c, NULL, 0);
    CHECK_EQ_INT(run_tokens(m, &a, tok, 10), WELD_OK); /* 3 blocks */
    struct kvm_stats before, after;
    kvm_stats_get(m, &before);
    struct weld_err e = {0};
    CHECK_EQ_INT(kvm_table_reserve(m, &b, 8, &e), WELD_ERR_LIMIT);
    CHECK(strstr(e.msg, "available") != NULL);
    CHECK_EQ_INT(b.n_blocks, 0);
    CHECK(b.blocks == NULL);
    CHECK_EQ_INT(kvm_table_reserve(m, &b, 17, &e), WELD_ERR_LIMIT); /* can never fit */
    CHECK(strstr(e.msg, "never") != NULL);
    CHECK_EQ_INT(kvm_table_reserve(m, &b, -1, NULL), WELD_ERR_LIMIT);
    kvm_stats_get(m, &after);
    CHECK(memcmp(&before, &after, sizeof before) == 0);
    /* COW needs a block too: refused with the table and the copy queue untouched. */
    CHECK_EQ_INT(kvm_table_fork(m, &c, &a, NULL), WELD_OK);
    CHECK_EQ_INT(kvm_table_reserve(m, &b, 4, NULL), WELD_OK); /* pool now full */
    int last = c.blocks[2];
    CHECK_EQ_INT(kvm_table_reserve(m, &c, 11, NULL), WELD_ERR_LIMIT);
    CHECK_EQ_INT(c.blocks[2], last);
    int n = -1;
    kvm_copies(m, &n);
    CHECK_EQ_INT(n, 0);
    CHECK_EQ_INT(kvm_block_ref(m, last), 2);
    kvm_table_free(m, &b);
    CHECK_EQ_INT(kvm_table_reserve(m, &c, 11, NULL), WELD_OK);
    kvm_copies(m, &n);
    CHECK_EQ_INT(n, 1);
    kvm_table_free(m, &a);
    kvm_table_free(m, &c);
    CHECK(consistent(m));
    kvm_free(m);
}

TEST(allocation_failures)
{
    struct kvm *m = mk(64, 2, true);
    REQUIRE(m);
    int32_t tok[64];
    seq_tokens(tok, 64, 1);
    struct kvm_table a, b;
    kvm_table_init(&a, NULL, 0);
    kvm_table_init(&b, NULL, 0);
    alloc_fail_at(1);
    CHECK_EQ_INT(kvm_table_reserve(m, &a, 20, NULL), WELD_ERR_NOMEM);
    alloc_fail_at(0);
    CHECK_EQ_INT(a.n_blocks, 0);
    CHECK(consistent(m));
    CHECK_EQ_INT(run_tokens(m, &a, tok, 20), WELD_OK);
    alloc_fail_at(1);
    CHECK_EQ_INT(kvm_table_fork(m, &b, &a, NULL), WELD_ERR_NOMEM);
    int cached = -1;
    alloc_fail_at(1);
    CHECK_EQ_INT(kvm_prefix_take(m, &b, tok, 30, &cached, NULL), WELD_ERR_NOMEM);
    alloc_fail_at(0);
    CHECK_EQ_INT(b.n_blocks, 0);
    CHECK_EQ_INT(kvm_block_ref(m, a.blocks[0]), 1);
    CHECK(consistent(m));
    /* Kvm creation under every failing allocation. */
    for (int k = 1; k <= 4; k++) {
        struct kvm *x = NULL;
        struct kvm_config c = kvm_config_default();
        c.n_blocks = 10;
        alloc_fail_at(k);
        int rc = kvm_create(&x, &c, NULL);
        alloc_fail_at(0);
        CHECK(rc == WELD_OK || rc == WELD_ERR_NOMEM);
        CHECK((rc == WELD_OK) == (x != NULL));
        kvm_free(x);
    }
    kvm_table_free(m, &a);
    kvm_free(m);
}

/* ---- randomized: shadow KV content --------------------------------------------------- */

#define R_TABLES 12
#define R_MAXTOK 40

struct rtab {
    struct kvm_table t;
    int32_t tok[R_MAXTOK];
    int n_tok; /* tokens known (the sequence's length so far) */
    int salt;  /* 0 none, 1 or 2 */
    bool live;
};

static const char *salt_str[3] = {NULL, "s1", "s2"};

/* Apply queued copies in order and write t's new slots [from, to). */
static void shadow_write(struct kvm *m, int32_t *content, int bs, struct rtab *r, int from,
                         int to)
{
    int n = 0;
    const struct kvm_copy *cp = kvm_copies(m, &n);
    for (int i = 0; i < n; i++)
        memcpy(content + (size_t)cp[i].dst * bs, content + (size_t)cp[i].src * bs,
               (size_t)bs * sizeof *content);
    kvm_copies_clear(m);
    for (int i = from; i < to; i++)
        content[(size_t)r->t.blocks[i / bs] * bs + i % bs] = r->tok[i];
}

static bool shadow_reads_back(const int32_t *content, int bs, const struct rtab *r)
{
    for (int i = 0; i < r->t.n_computed; i++)
        if (content[(size_t)r->t.blocks[i / bs] * bs + i % bs] != r->tok[i])
            return false;
    return true;
}

static void rtab_start(struct kvm *m, int32_t *content, int bs, struct rtab *r,
                       struct rng *g)
{
    /* Tokens from a tiny alphabet with shared starts so prefixes collide often. */
    r->n_tok = 1 + (int)rbelow(g, R_MAXTOK - 8);
    int family = (int)rbelow(g, 3);
    for (int i = 0; i < r->n_tok; i++)
        r->tok[i] = i < 12 ? family * 100 + i : (int32_t)rbelow(g, 3);
    r->salt = (int)rbelow(g, 3);
    kvm_table_init(&r->t, salt_str[r->salt], r->salt ? 2 : 0);
    int cached = 0;
    CHECK_EQ_INT(kvm_prefix_take(m, &r->t, r->tok, r->n_tok, &cached, NULL), WELD_OK);
    CHECK(cached < r->n_tok && cached % bs == 0);
    CHECK(shadow_reads_back(content, bs, r)); /* cache hits hold exactly these tokens */
    r->live = true;
    (void)content;
}

static void rtab_step(struct kvm *m, int32_t *content, int bs, struct rtab *r,
                      struct rng *g)
{
    if (r->t.n_computed == r->n_tok) {
        if (r->n_tok == R_MAXTOK)
            return;
        r->tok[r->n_tok++] = (int32_t)rbelow(g, 3);
    }
    int from = r->t.n_computed;
    int to = from + 1 + (int)rbelow(g, (uint64_t)(r->n_tok - from));
    struct kvm_stats before, after;
    kvm_stats_get(m, &before);
    int need = kvm_table_blocks_needed(m, &r->t, to);
    int rc = kvm_table_reserve(m, &r->t, to, NULL);
    kvm_stats_get(m, &after);
    if (rc == WELD_ERR_LIMIT) {
        CHECK(need > before.n_free + before.n_cached);
        CHECK(memcmp(&before, &after, sizeof before) == 0);
        return;
    }
    CHECK_EQ_INT(rc, WELD_OK);
    CHECK_EQ_INT(after.n_used - before.n_used, need);
    shadow_write(m, content, bs, r, from, to);
    CHECK_EQ_INT(kvm_table_commit(m, &r->t, r->tok, to, NULL), WELD_OK);
}

static void check_refs(struct kvm *m, struct rtab *rt, int n_blocks)
{
    for (int b = 0; b < n_blocks; b++) {
        int holders = 0;
        for (int i = 0; i < R_TABLES; i++)
            for (int k = 0; rt[i].live && k < rt[i].t.n_blocks; k++)
                holders += rt[i].t.blocks[k] == b;
        CHECK_EQ_INT(kvm_block_ref(m, b), holders);
    }
}

TEST(randomized_shadow)
{
    const int n_blocks = 24, bs = 3;
    struct kvm *m = mk(n_blocks, bs, true);
    REQUIRE(m);
    int32_t *content = calloc((size_t)n_blocks * bs, sizeof *content);
    REQUIRE(content);
    struct rtab rt[R_TABLES];
    memset(rt, 0, sizeof rt);
    struct rng g;
    rng_seed(&g, 1234);
    for (int it = 0; it < 200000; it++) {
        struct rtab *r = &rt[rbelow(&g, R_TABLES)];
        int op = (int)rbelow(&g, 10);
        if (!r->live) {
            rtab_start(m, content, bs, r, &g);
        } else if (op < 6) {
            rtab_step(m, content, bs, r, &g);
        } else if (op < 8) {
            kvm_table_free(m, &r->t);
            r->live = false;
        } else {
            struct rtab *d = &rt[rbelow(&g, R_TABLES)];
            if (!d->live) {
                *d = *r; /* the token list; the table is replaced below */
                kvm_table_init(&d->t, NULL, 0);
                CHECK_EQ_INT(kvm_table_fork(m, &d->t, &r->t, NULL), WELD_OK);
                d->n_tok = r->t.n_computed;
                d->live = true;
            }
        }
        for (int i = 0; i < R_TABLES; i++)
            if (rt[i].live)
                CHECK(shadow_reads_back(content, bs, &rt[i]));
        if (it % 16 == 0) {
            check_refs(m, rt, n_blocks);
            CHECK(consistent(m));
        }
        if (test_cur_failed)
            break;
    }
    for (int i = 0; i < R_TABLES; i++)
        if (rt[i].live)
            kvm_table_free(m, &rt[i].t);
    struct kvm_stats st;
    kvm_stats_get(m, &st);
    CHECK_EQ_INT(st.n_used, 0);
    CHECK(st.hit_tokens > 0 && st.evictions > 0 && st.cow_copies > 0);
    CHECK(consistent(m));
    free(content);
    kvm_free(m);
}

/* ---- differential: a naive reference manager ------------------------------------------
 * Written from the documented rules only, with no hashing: a block's key is its salt id
 * followed by every token from the start of the sequence to the end of the block, compared
 * in full, and list order is a release timestamp (the free list and the LRU list each give
 * out their oldest entry). Every operation is a linear scan. After each random operation
 * the real manager must agree exactly: the same physical block ids in every table, the
 * same refcounts, copies, counters and peeks. */

#define REF_NB 20
#define REF_KEY (1 + R_MAXTOK)

struct ref_blk {
    int ref;
    bool hashed, registered, on_free, on_lru;
    uint64_t stamp;
    int key_len;
    int32_t key[REF_KEY];
};

struct ref_kvm {
    struct ref_blk b[REF_NB];
    int bs;
    uint64_t clock, evictions, cow, hits, queries, lookups;
    struct kvm_copy copies[4 * REF_NB];
    int n_copies;
};

struct ref_tab {
    int blocks[REF_NB];
    int n_blocks, n_computed, n_hashed;
};

struct dtab {
    struct kvm_table t;
    struct ref_tab r;
    int32_t tok[R_MAXTOK];
    int n_tok, salt;
    bool live;
};

static int ref_key(const struct ref_kvm *k, const struct dtab *d, int b, int32_t *key)
{
    key[0] = d->salt;
    memcpy(key + 1, d->tok, (size_t)(b + 1) * k->bs * sizeof *key);
    return 1 + (b + 1) * k->bs;
}

static int ref_find(const struct ref_kvm *k, const int32_t *key, int len)
{
    for (int i = 0; i < REF_NB; i++)
        if (k->b[i].registered && k->b[i].key_len == len &&
            memcmp(k->b[i].key, key, (size_t)len * sizeof *key) == 0)
            return i;
    return -1;
}

static int ref_oldest(const struct ref_kvm *k, bool lru)
{
    int best = -1;
    for (int i = 0; i < REF_NB; i++)
        if ((lru ? k->b[i].on_lru : k->b[i].on_free) &&
            (best < 0 || k->b[i].stamp < k->b[best].stamp))
            best = i;
    return best;
}

static int ref_available(const struct ref_kvm *k)
{
    int n = 0;
    for (int i = 0; i < REF_NB; i++)
        n += k->b[i].ref == 0;
    return n;
}

static int ref_alloc(struct ref_kvm *k)
{
    int id = ref_oldest(k, false);
    if (id < 0) {
        id = ref_oldest(k, true);
        k->b[id].registered = false;
        k->evictions++;
    }
    struct ref_blk *b = &k->b[id];
    b->on_free = b->on_lru = b->hashed = false;
    b->ref = 1;
    return id;
}

static void ref_release(struct ref_kvm *k, int id)
{
    struct ref_blk *b = &k->b[id];
    if (--b->ref > 0)
        return;
    int n = 0;
    for (int i = 0; i < k->n_copies; i++)
        if (k->copies[i].dst != id)
            k->copies[n++] = k->copies[i];
    k->n_copies = n;
    b->stamp = k->clock++;
    if (b->registered) {
        b->on_lru = true;
    } else {
        b->on_free = true;
        b->hashed = false;
    }
}

static void ref_acquire(struct ref_kvm *k, int id)
{
    k->b[id].on_lru = false;
    k->b[id].ref++;
}

static int ref_peek(const struct ref_kvm *k, const struct dtab *d, int *ids, int *evictable)
{
    int32_t key[REF_KEY];
    int n = 0, ev = 0;
    for (int max = d->n_tok > 1 ? (d->n_tok - 1) / k->bs : 0; n < max; n++) {
        int id = ref_find(k, key, ref_key(k, d, n, key));
        if (id < 0)
            break;
        if (ids)
            ids[n] = id;
        ev += k->b[id].ref == 0;
    }
    *evictable = ev;
    return n;
}

static void ref_take(struct ref_kvm *k, struct dtab *d)
{
    int ev;
    struct ref_tab *t = &d->r;
    int n = ref_peek(k, d, t->blocks, &ev);
    for (int i = 0; i < n; i++)
        ref_acquire(k, t->blocks[i]);
    t->n_blocks = t->n_hashed = n;
    t->n_computed = n * k->bs;
    k->lookups++;
    k->queries += (uint64_t)d->n_tok;
    k->hits += (uint64_t)t->n_computed;
}

static int ref_reserve(struct ref_kvm *k, struct ref_tab *t, int n)
{
    int want = (n + k->bs - 1) / k->bs, end = want < t->n_blocks ? want : t->n_blocks;
    int shared = 0;
    for (int b = t->n_computed / k->bs; n > t->n_computed && b < end; b++)
        shared += k->b[t->blocks[b]].ref > 1;
    int fresh = want > t->n_blocks ? want - t->n_blocks : 0;
    if (fresh + shared > ref_available(k))
        return WELD_ERR_LIMIT;
    for (int b = t->n_computed / k->bs; n > t->n_computed && b < end; b++) {
        int old = t->blocks[b];
        if (k->b[old].ref <= 1)
            continue;
        int id = ref_alloc(k);
        if (b * k->bs < t->n_computed) {
            k->copies[k->n_copies++] = (struct kvm_copy){old, id};
            k->cow++;
        }
        ref_release(k, old);
        t->blocks[b] = id;
    }
    while (t->n_blocks < want)
        t->blocks[t->n_blocks++] = ref_alloc(k);
    return WELD_OK;
}

static void ref_commit(struct ref_kvm *k, struct dtab *d, int n)
{
    struct ref_tab *t = &d->r;
    t->n_computed = n;
    for (int b = t->n_hashed; b < n / k->bs; b++) {
        struct ref_blk *blk = &k->b[t->blocks[b]];
        if (blk->hashed)
            continue;
        int32_t key[REF_KEY];
        int len = ref_key(k, d, b, key);
        blk->hashed = true;
        if (ref_find(k, key, len) < 0) {
            memcpy(blk->key, key, (size_t)len * sizeof *key);
            blk->key_len = len;
            blk->registered = true;
        }
    }
    if (n / k->bs > t->n_hashed)
        t->n_hashed = n / k->bs;
}

static void ref_free_table(struct ref_kvm *k, struct ref_tab *t)
{
    for (int i = t->n_blocks - 1; i >= 0; i--)
        ref_release(k, t->blocks[i]);
    t->n_blocks = t->n_computed = t->n_hashed = 0;
}

static bool diff_agree(struct kvm *m, const struct ref_kvm *k, const struct dtab *d)
{
    struct kvm_stats st;
    kvm_stats_get(m, &st);
    int n_free = 0, n_lru = 0, n_copies = 0;
    for (int i = 0; i < REF_NB; i++) {
        n_free += k->b[i].on_free;
        n_lru += k->b[i].on_lru;
        if (kvm_block_ref(m, i) != k->b[i].ref)
            return false;
    }
    const struct kvm_copy *cp = kvm_copies(m, &n_copies);
    if (n_copies != k->n_copies ||
        (n_copies && memcmp(cp, k->copies, (size_t)n_copies * sizeof *cp) != 0))
        return false;
    if (st.n_free != n_free || st.n_cached != n_lru || st.evictions != k->evictions ||
        st.cow_copies != k->cow || st.hit_tokens != k->hits || st.query_tokens != k->queries ||
        st.lookups != k->lookups)
        return false;
    for (int i = 0; i < R_TABLES; i++) {
        const struct dtab *x = &d[i];
        if (!x->live)
            continue;
        if (x->t.n_blocks != x->r.n_blocks || x->t.n_computed != x->r.n_computed ||
            x->t.n_hashed != x->r.n_hashed ||
            (x->r.n_blocks && memcmp(x->t.blocks, x->r.blocks,
                                     (size_t)x->r.n_blocks * sizeof(int32_t)) != 0))
            return false;
    }
    return true;
}

static void diff_start(struct kvm *m, struct ref_kvm *k, struct dtab *d, struct rng *g)
{
    d->n_tok = 1 + (int)rbelow(g, R_MAXTOK - 8);
    int fam = (int)rbelow(g, 3);
    for (int i = 0; i < d->n_tok; i++)
        d->tok[i] = i < 9 ? fam * 100 + i : (int32_t)rbelow(g, 2);
    d->salt = (int)rbelow(g, 3);
    kvm_table_init(&d->t, salt_str[d->salt], d->salt ? 2 : 0);
    memset(&d->r, 0, sizeof d->r);
    int ev_m = -1, ev_r = -1;
    CHECK_EQ_INT(kvm_prefix_peek(m, &d->t, d->tok, d->n_tok, &ev_m),
                 ref_peek(k, d, NULL, &ev_r) * k->bs);
    CHECK_EQ_INT(ev_m, ev_r);
    int cached = 0;
    CHECK_EQ_INT(kvm_prefix_take(m, &d->t, d->tok, d->n_tok, &cached, NULL), WELD_OK);
    ref_take(k, d);
    d->live = true;
}

static void diff_step(struct kvm *m, struct ref_kvm *k, struct dtab *d, struct rng *g)
{
    if (d->t.n_computed == d->n_tok) {
        if (d->n_tok == R_MAXTOK)
            return;
        d->tok[d->n_tok++] = (int32_t)rbelow(g, 2);
    }
    int to = d->t.n_computed + 1 + (int)rbelow(g, (uint64_t)(d->n_tok - d->t.n_computed));
    int rc = kvm_table_reserve(m, &d->t, to, NULL);
    CHECK_EQ_INT(rc, ref_reserve(k, &d->r, to));
    if (rc)
        return;
    if (rbelow(g, 2)) { /* the copies ran: both queues empty */
        kvm_copies_clear(m);
        k->n_copies = 0;
    }
    CHECK_EQ_INT(kvm_table_commit(m, &d->t, d->tok, to, NULL), WELD_OK);
    ref_commit(k, d, to);
}

TEST(differential_vs_naive)
{
    const int bs = 2;
    struct kvm *m = mk(REF_NB, bs, true);
    REQUIRE(m);
    static struct ref_kvm k;
    memset(&k, 0, sizeof k);
    k.bs = bs;
    for (int i = 0; i < REF_NB; i++) {
        k.b[i].on_free = true;
        k.b[i].stamp = (uint64_t)i;
    }
    k.clock = REF_NB;
    static struct dtab d[R_TABLES];
    memset(d, 0, sizeof d);
    struct rng g;
    rng_seed(&g, 99);
    for (int it = 0; it < 100000 && !test_cur_failed; it++) {
        struct dtab *x = &d[rbelow(&g, R_TABLES)];
        int op = (int)rbelow(&g, 10);
        if (!x->live) {
            diff_start(m, &k, x, &g);
        } else if (op < 6) {
            diff_step(m, &k, x, &g);
        } else if (op < 8) {
            kvm_table_free(m, &x->t);
            ref_free_table(&k, &x->r);
            x->live = false;
        } else {
            struct dtab *y = &d[rbelow(&g, R_TABLES)];
            if (!y->live) {
                memcpy(y->tok, x->tok, sizeof y->tok);
                y->n_tok = x->t.n_computed;
                y->salt = x->salt;
                kvm_table_init(&y->t, NULL, 0);
                CHECK_EQ_INT(kvm_table_fork(m, &y->t, &x->t, NULL), WELD_OK);
                y->r = x->r;
                for (int i = 0; i < y->r.n_blocks; i++)
                    ref_acquire(&k, y->r.blocks[i]);
                y->live = true;
            }
        }
        if (!diff_agree(m, &k, d)) {
            fprintf(stderr, "differential: disagreement after operation %d (op %d)\n", it, op);
            CHECK(false);
        }
    }
    struct kvm_stats st;
    kvm_stats_get(m, &st);
    CHECK(st.evictions > 1000 && st.cow_copies > 100 && st.hit_tokens > 1000);
    for (int i = 0; i < R_TABLES; i++)
        if (d[i].live)
            kvm_table_free(m, &d[i].t);
    CHECK(consistent(m));
    kvm_free(m);
}

int main(void)
{
    RUN(config_checks);
    RUN(refcounts_and_release);
    RUN(never_the_whole_prompt);
    RUN(hash_chain_salt_and_parent);
    RUN(caching_off);
    RUN(eviction_order);
    RUN(fork_copy_on_write);
    RUN(exhaustion_changes_nothing);
    RUN(allocation_failures);
    RUN(randomized_shadow);
    RUN(differential_vs_naive);
    return test_summary();
}
