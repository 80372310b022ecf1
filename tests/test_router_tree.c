/*
 * test_router_tree - the cache-aware policy's radix tree (router/tree.c) and the policy
 * decisions (router/policy.c).
 *
 * Tree: matches per worker over shared and split edges, LRU eviction per worker (the
 * least recently inserted leaf goes first, ancestors last), removing a worker, every
 * invariant of tree.h checked after random inserts, the memory bound (chars per worker,
 * nodes and bytes stay put however many texts go in), and allocation failures at every
 * point of an insert leaving a valid tree. Policy: each branch of cache_aware (balance,
 * match, room) and its tie-breaks, least_load's tie rotation and round robin.
 */
#include "core/alloc.h"
#include "router/policy.h"
#include "router/tree.h"
#include "test.h"

#include <stdint.h>

static size_t match1(struct rtree *t, const char *s, int w)
{
    size_t out[8];
    rtree_match(t, s, strlen(s), out, 8);
    return out[w];
}

static void ins(struct rtree *t, const char *s, int w, double now)
{
    CHECK_EQ_INT(rtree_insert(t, s, strlen(s), w, now), WELD_OK);
}

TEST(insert_match)
{
    struct rtree *t = rtree_create();
    REQUIRE(t);
    ins(t, "hello world", 0, 1);
    ins(t, "hello there", 1, 2);
    CHECK_EQ_INT(match1(t, "hello world, again", 0), 11);
    CHECK_EQ_INT(match1(t, "hello world, again", 1), 6); /* "hello " */
    CHECK_EQ_INT(match1(t, "hello th", 1), 8);           /* a partly matched edge */
    CHECK_EQ_INT(match1(t, "hello th", 0), 6);
    CHECK_EQ_INT(match1(t, "goodbye", 0), 0);
    CHECK_EQ_INT(match1(t, "", 0), 0);
    size_t out[4];
    CHECK_EQ_INT(rtree_match(t, "hello world", 11, out, 4), 11);
    CHECK_EQ_INT(out[2], 0);
    CHECK_EQ_INT(rtree_chars(t, 0), 11);
    CHECK_EQ_INT(rtree_chars(t, 1), 11); /* "hello " + "there" */
    CHECK_EQ_INT(rtree_nodes(t), 4);     /* root, "hello ", "world", "there" */
    /* the same text again changes nothing but times; a prefix of an edge splits it */
    ins(t, "hello world", 0, 3);
    CHECK_EQ_INT(rtree_nodes(t), 4);
    ins(t, "hello wo", 1, 4);
    CHECK_EQ_INT(rtree_nodes(t), 5);
    CHECK_EQ_INT(match1(t, "hello world", 1), 8);
    CHECK_EQ_INT(match1(t, "hello world", 0), 11);
    CHECK_EQ_INT(rtree_chars(t, 0), 11);
    CHECK_EQ_INT(rtree_chars(t, 1), 13);
    /* bytes past 0x7f sort and match like any */
    ins(t, "h\xc3\xa9llo", 2, 5);
    CHECK_EQ_INT(match1(t, "h\xc3\xa9llo!", 2), 6);
    CHECK_EQ_INT(match1(t, "h\xc3\xa9llo!", 0), 1);
    CHECK(rtree_check(t) == NULL);
    rtree_free(t);
}

TEST(evict_lru)
{
    struct rtree *t = rtree_create();
    ins(t, "system prompt A: the first document", 0, 1);
    ins(t, "system prompt B: the second document", 0, 2);
    ins(t, "system prompt A: the first document, question 2", 0, 3);
    CHECK(rtree_check(t) == NULL);
    size_t all = rtree_chars(t, 0);
    /* B is the least recently used leaf: it goes first; A's path stays */
    rtree_evict(t, 0, all - 1);
    CHECK(rtree_check(t) == NULL);
    CHECK_EQ_INT(match1(t, "system prompt B: the second document", 0), 14);
    CHECK_EQ_INT(match1(t, "system prompt A: the first document, question 2", 0), 47);
    CHECK(rtree_chars(t, 0) <= all - 1);
    /* down to 20: the leaves go one by one, the shared ancestor last */
    rtree_evict(t, 0, 20);
    CHECK(rtree_chars(t, 0) <= 20);
    CHECK(rtree_check(t) == NULL);
    CHECK_EQ_INT(match1(t, "system prompt A", 0), 14);
    rtree_evict(t, 0, 0);
    CHECK_EQ_INT(rtree_chars(t, 0), 0);
    CHECK_EQ_INT(rtree_nodes(t), 1);
    CHECK(rtree_check(t) == NULL);
    /* eviction of one worker leaves another's entries */
    ins(t, "shared prefix one", 0, 4);
    ins(t, "shared prefix two", 1, 5);
    rtree_evict(t, 0, 0);
    CHECK_EQ_INT(match1(t, "shared prefix two", 1), 17);
    CHECK_EQ_INT(match1(t, "shared prefix one", 0), 0);
    CHECK_EQ_INT(rtree_nodes(t), 3); /* root, "shared prefix ", "two": no merge needed */
    CHECK(rtree_check(t) == NULL);
    rtree_free(t);
}

TEST(remove_worker)
{
    struct rtree *t = rtree_create();
    ins(t, "abcdef", 0, 1);
    ins(t, "abcxyz", 1, 2);
    ins(t, "abc", 2, 3);
    ins(t, "qrs", 1, 4);
    rtree_remove_worker(t, 1);
    CHECK(rtree_check(t) == NULL);
    CHECK_EQ_INT(rtree_chars(t, 1), 0);
    CHECK_EQ_INT(match1(t, "abcxyz", 1), 0);
    CHECK_EQ_INT(match1(t, "qrs", 1), 0);
    CHECK_EQ_INT(match1(t, "abcdef", 0), 6);
    CHECK_EQ_INT(match1(t, "abcdef", 2), 3);
    CHECK_EQ_INT(rtree_nodes(t), 3); /* root, "abc", "def" */
    /* the id is free again */
    ins(t, "abcxy", 1, 5);
    CHECK_EQ_INT(match1(t, "abcxyz", 1), 5);
    rtree_remove_worker(t, 0);
    rtree_remove_worker(t, 1);
    rtree_remove_worker(t, 2);
    rtree_remove_worker(t, 7); /* unknown: nothing */
    CHECK_EQ_INT(rtree_nodes(t), 1);
    CHECK(rtree_check(t) == NULL);
    rtree_free(t);
}

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint32_t rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 11);
}

/* A text: one of 40 long "system prompts", then a random tail over a small alphabet (so
   tails share prefixes and edges split at every depth). */
static size_t random_text(char *out, size_t cap)
{
    size_t n = 0;
    int p = (int)(rnd() % 40);
    n += (size_t)snprintf(out, cap, "prompt %d: you are a helpful assistant number %d. ", p,
                          p * 7919);
    size_t tail = rnd() % 120;
    for (size_t i = 0; i < tail && n + 1 < cap; i++)
        out[n++] = "abcd efgh"[rnd() % 9];
    out[n] = 0;
    return n;
}

TEST(memory_bound)
{
    enum { W = 4, MAX = 4000 };
    const int n_ops = TEST_SANITIZED ? 6000 : 40000;
    struct rtree *t = rtree_create();
    char text[256];
    size_t bytes_mid = 0, nodes_max = 0, bytes_max = 0;
    for (int i = 0; i < n_ops; i++) {
        int w = (int)(rnd() % W);
        size_t n = random_text(text, sizeof text);
        REQUIRE(rtree_insert(t, text, n, w, i) == WELD_OK);
        rtree_evict(t, w, MAX);
        REQUIRE(rtree_chars(t, w) <= MAX);
        nodes_max = rtree_nodes(t) > nodes_max ? rtree_nodes(t) : nodes_max;
        bytes_max = rtree_bytes(t) > bytes_max ? rtree_bytes(t) : bytes_max;
        if (i == n_ops / 2)
            bytes_mid = rtree_bytes(t);
        if (i % 2000 == 0) {
            const char *bad = rtree_check(t);
            if (bad)
                fprintf(stderr, "after %d inserts: %s\n", i, bad);
            REQUIRE(bad == NULL);
        }
    }
    CHECK(rtree_check(t) == NULL);
    /* every node but the root has a tag and >= 1 byte: nodes <= sum of chars + 1 */
    CHECK(nodes_max <= W * MAX + 1);
    /* and the memory does not grow with the number of texts inserted */
    CHECK(rtree_bytes(t) < 2 * bytes_mid + 4096);
    /* a node ~ 64 bytes + edge + kids, a tag 56: a generous per-char bound */
    CHECK(bytes_max < (size_t)W * MAX * 200);
    /* a recent text still matches in full for its worker */
    size_t n = random_text(text, sizeof text);
    REQUIRE(rtree_insert(t, text, n, 3, n_ops) == WELD_OK);
    CHECK_EQ_INT(match1(t, text, 3), n);
    for (int w = 0; w < W; w++)
        rtree_remove_worker(t, w);
    CHECK_EQ_INT(rtree_nodes(t), 1);
    CHECK(rtree_check(t) == NULL);
    rtree_free(t);
}

TEST(alloc_failures)
{
    /* fail each allocation of an insert in turn: the tree stays valid, and the insert then
       succeeds */
    long failed_somewhere = 0;
    for (long k = 1; k < 40; k++) {
        struct rtree *t = rtree_create();
        REQUIRE(t);
        ins(t, "the quick brown fox", 0, 1);
        ins(t, "the quick red fox", 1, 2);
        alloc_fail_at(k);
        int rc = rtree_insert(t, "the quick brown dog jumps", 25, 2, 3);
        long f = alloc_failed_count();
        alloc_fail_at(0);
        failed_somewhere += f;
        CHECK(f ? rc == WELD_ERR_NOMEM : rc == WELD_OK);
        const char *bad = rtree_check(t);
        if (bad)
            fprintf(stderr, "failing allocation %ld: %s\n", k, bad);
        CHECK(bad == NULL);
        ins(t, "the quick brown dog jumps", 2, 4);
        CHECK_EQ_INT(match1(t, "the quick brown dog jumps", 2), 25);
        CHECK_EQ_INT(match1(t, "the quick brown fox", 0), 19);
        CHECK(rtree_check(t) == NULL);
        rtree_free(t);
    }
    CHECK(failed_somewhere > 3);
}

static const struct policy_params params = {.cache_threshold = 0.5,
                                            .balance_abs = 32,
                                            .balance_rel = 1.5};

TEST(policy_cache_aware)
{
    enum policy_reason why;
    /* a match over the threshold wins */
    struct policy_cand c[3] = {{.load = 1, .match = 10, .tree_chars = 100},
                               {.load = 0, .match = 80, .tree_chars = 500},
                               {.load = 0, .match = 0, .tree_chars = 0}};
    CHECK_EQ_INT(policy_cache_aware(c, 3, 100, &params, &why), 1);
    CHECK_EQ_INT(why, POLICY_REASON_MATCH);
    /* at or under the threshold: the smallest tree (most room) */
    c[1].match = 50;
    CHECK_EQ_INT(policy_cache_aware(c, 3, 100, &params, &why), 2);
    CHECK_EQ_INT(why, POLICY_REASON_ROOM);
    /* equal matches: the less loaded */
    c[0].match = c[1].match = 90;
    CHECK_EQ_INT(policy_cache_aware(c, 3, 100, &params, &why), 1);
    c[1].load = 2;
    CHECK_EQ_INT(policy_cache_aware(c, 3, 100, &params, &why), 0);
    /* imbalance: max - min > 32 and max > 1.5 min: least load, whatever matches */
    c[0].load = 40, c[1].load = 40, c[2].load = 7;
    CHECK_EQ_INT(policy_cache_aware(c, 3, 100, &params, &why), 2);
    CHECK_EQ_INT(why, POLICY_REASON_BALANCE);
    /* a difference over 32 but a ratio under 1.5 is balanced */
    c[0].load = 100, c[1].load = 100, c[2].load = 67;
    CHECK_EQ_INT(policy_cache_aware(c, 3, 100, &params, &why), 0);
    CHECK_EQ_INT(why, POLICY_REASON_MATCH);
    /* a ratio over 1.5 but a difference of 32 or less is balanced */
    c[0].load = 33, c[1].load = 33, c[2].load = 1;
    CHECK_EQ_INT(policy_cache_aware(c, 3, 100, &params, &why), 0);
    /* equal trees: the less loaded; an empty text never matches */
    struct policy_cand d[2] = {{.load = 3, .tree_chars = 0}, {.load = 1, .tree_chars = 0}};
    CHECK_EQ_INT(policy_cache_aware(d, 2, 0, &params, &why), 1);
    CHECK_EQ_INT(why, POLICY_REASON_ROOM);
    CHECK_EQ_INT(policy_cache_aware(d, 1, 10, &params, &why), 0);
}

TEST(policy_least_load_round_robin)
{
    unsigned long rr = 0;
    CHECK_EQ_INT(policy_round_robin(3, &rr), 0);
    CHECK_EQ_INT(policy_round_robin(3, &rr), 1);
    CHECK_EQ_INT(policy_round_robin(3, &rr), 2);
    CHECK_EQ_INT(policy_round_robin(3, &rr), 0);
    struct policy_cand c[3] = {{.load = 4}, {.load = 2}, {.load = 9}};
    rr = 0;
    for (int i = 0; i < 5; i++)
        CHECK_EQ_INT(policy_least_load(c, 3, &rr), 1);
    /* equal loads alternate; the KV usage breaks a tie first */
    struct policy_cand e[2] = {{.load = 1}, {.load = 1}};
    int a = policy_least_load(e, 2, &rr), b = policy_least_load(e, 2, &rr);
    CHECK(a != b);
    e[0].kv_usage = 0.5;
    CHECK_EQ_INT(policy_least_load(e, 2, &rr), 1);
    CHECK_EQ_INT(policy_least_load(e, 2, &rr), 1);
    enum router_policy p;
    CHECK(policy_from_name("cache_aware", &p) && p == ROUTER_POLICY_CACHE_AWARE);
    CHECK(!policy_from_name("random", &p));
    CHECK_EQ_STR(policy_name(ROUTER_POLICY_LEAST_LOAD), "least_load");
}

int main(void)
{
    RUN(insert_match);
    RUN(evict_lru);
    RUN(remove_worker);
    RUN(memory_bound);
    RUN(alloc_failures);
    RUN(policy_cache_aware);
    RUN(policy_least_load_round_robin);
    return test_summary();
}
