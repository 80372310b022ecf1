/*
 * test_engine_request - the stop-string matcher and the request output path.
 *
 * The matcher is checked on hand-made cases (stops spanning pushes, partial matches that
 * turn out not to be stops, multi-byte characters, several and overlapping stops, arming,
 * include_stop) and on random streams against an independent character-by-character
 * reference. The request path is driven with one-hot logits (greedy) so the sampled token
 * sequence is chosen by the test, on the stories260K tokenizer: EOS, ignore_eos, stop token
 * ids, min_tokens masking, max_tokens, stop strings across tokens, UTF-8 safety of deltas
 * (byte-fallback tokens), logprobs, n > 1 and validation messages.
 */
#include "core/alloc.h"
#include "core/rng.h"
#include "engine/request.h"
#include "engine/stop.h"
#include "format/gguf.h"
#include "tokenizer/tokenizer.h"
#include "test.h"

#include <stdint.h>

/* ---- matcher ----------------------------------------------------------------------- */

struct mres {
    char text[4096];
    size_t len;
    int n_deltas;
    bool matched;
    bool split_bad;   /* a delta was not valid UTF-8 */
};

/* Push pieces (NULL-terminated) through a matcher; flush at the end unless matched. */
static void run_pieces(struct stop_matcher *m, const char *const *pieces, struct mres *r)
{
    memset(r, 0, sizeof *r);
    struct weld_err e;
    for (int i = 0; pieces[i] && !r->matched; i++) {
        const char *o;
        size_t ol;
        bool mt;
        if (stop_push(m, pieces[i], strlen(pieces[i]), &o, &ol, &mt, &e) != WELD_OK)
            return;
        if (!stop_utf8_valid(o, ol))
            r->split_bad = true;
        memcpy(r->text + r->len, o, ol);
        r->len += ol;
        r->n_deltas += ol > 0;
        r->matched = mt;
    }
    if (!r->matched) {
        const char *o;
        size_t ol;
        stop_flush(m, &o, &ol);
        memcpy(r->text + r->len, o, ol);
        r->len += ol;
    }
    r->text[r->len] = 0;
}

static struct stop_matcher *mk(const char *const *stops, int n, bool incl)
{
    struct stop_matcher *m = NULL;
    struct weld_err e;
    if (stop_create(&m, stops, n, incl, &e) != WELD_OK)
        fprintf(stderr, "stop_create: %s\n", e.msg);
    return m;
}

TEST(stop_spanning_pushes)
{
    const char *stops[] = {"STOP"};
    struct stop_matcher *m = mk(stops, 1, false);
    REQUIRE(m);
    const char *o;
    size_t ol;
    bool mt;
    struct weld_err e;
    REQUIRE(stop_push(m, "abc ST", 6, &o, &ol, &mt, &e) == WELD_OK);
    CHECK(ol == 4 && !memcmp(o, "abc ", 4) && !mt);
    REQUIRE(stop_push(m, "O", 1, &o, &ol, &mt, &e) == WELD_OK);
    CHECK(ol == 0 && !mt);
    REQUIRE(stop_push(m, "P and more", 10, &o, &ol, &mt, &e) == WELD_OK);
    CHECK(ol == 0 && mt);
    CHECK_EQ_INT(stop_matched_index(m), 0);
    REQUIRE(stop_push(m, "x", 1, &o, &ol, &mt, &e) == WELD_OK);
    CHECK(ol == 0 && !mt);
    stop_free(m);
}

TEST(stop_partial_not_a_stop)
{
    const char *stops[] = {"STOP"};
    struct stop_matcher *m = mk(stops, 1, false);
    REQUIRE(m);
    const char *pieces[] = {"ST", "O", "NE", " age", NULL};
    struct mres r;
    run_pieces(m, pieces, &r);
    CHECK_EQ_STR(r.text, "STONE age");
    CHECK(!r.matched);
    stop_free(m);
    /* held text at the end of generation is flushed */
    m = mk(stops, 1, false);
    const char *p2[] = {"the ST", NULL};
    run_pieces(m, p2, &r);
    CHECK_EQ_STR(r.text, "the ST");
    stop_free(m);
}

TEST(stop_multibyte)
{
    const char *stops[] = {"\xc3\xa9!"}; /* "é!" */
    struct stop_matcher *m = mk(stops, 1, false);
    REQUIRE(m);
    const char *pieces[] = {"caf", "\xc3\xa9", "\xc3\xa9", "?", "\xe2\x98\x83", "\xc3\xa9!", "z",
                            NULL};
    struct mres r;
    run_pieces(m, pieces, &r);
    CHECK(r.matched);
    CHECK_EQ_STR(r.text, "caf\xc3\xa9\xc3\xa9?\xe2\x98\x83");
    CHECK(!r.split_bad);
    stop_free(m);
    const char *bad[] = {"ok", "\xc3"};
    struct weld_err e;
    CHECK(stop_create(&m, bad, 2, false, &e) == WELD_ERR_INVALID_ARG);
    CHECK(strstr(e.msg, "stop[1]") != NULL);
}

TEST(stop_several_and_overlapping)
{
    const char *stops[] = {"abcd", "bcx", "zz"};
    struct stop_matcher *m = mk(stops, 3, false);
    REQUIRE(m);
    const char *pieces[] = {"xabc", "x", NULL};
    struct mres r;
    run_pieces(m, pieces, &r);
    CHECK(r.matched);
    CHECK_EQ_STR(r.text, "xa");
    CHECK_EQ_INT(stop_matched_index(m), 1);
    stop_free(m);
    /* two matches complete in one push: the earlier start wins */
    m = mk(stops, 3, false);
    const char *p2[] = {"qq", "zzabcd", NULL};
    run_pieces(m, p2, &r);
    CHECK_EQ_STR(r.text, "qq");
    CHECK_EQ_INT(stop_matched_index(m), 2);
    stop_free(m);
    /* "abc" held for "abcd" then "abce": released in one delta */
    m = mk(stops, 3, false);
    const char *p3[] = {"ab", "c", "e", NULL};
    run_pieces(m, p3, &r);
    CHECK_EQ_STR(r.text, "abce");
    CHECK_EQ_INT(r.n_deltas, 1);
    stop_free(m);
}

TEST(stop_include_and_arm)
{
    const char *stops[] = {"END"};
    struct stop_matcher *m = mk(stops, 1, true);
    REQUIRE(m);
    const char *pieces[] = {"the E", "ND of it", NULL};
    struct mres r;
    run_pieces(m, pieces, &r);
    CHECK_EQ_STR(r.text, "the END");
    stop_free(m);
    m = mk(stops, 1, false);
    stop_arm(m, false);
    const char *o;
    size_t ol;
    bool mt;
    struct weld_err e;
    REQUIRE(stop_push(m, "END E", 5, &o, &ol, &mt, &e) == WELD_OK);
    CHECK(!mt && ol == 4 && !memcmp(o, "END ", 4));
    stop_arm(m, true);
    REQUIRE(stop_push(m, "ND!", 3, &o, &ol, &mt, &e) == WELD_OK);
    CHECK(mt && ol == 0);
    stop_free(m);
}

/* Reference: feed one character at a time; the first end position where some stop ends
   stops the text there, cut before the longest stop ending at it. */
static size_t ref_cut(const char *text, size_t n, const char *const *stops, int ns,
                      bool *matched)
{
    for (size_t j = 1; j <= n; j++) {
        size_t best = 0;
        for (int i = 0; i < ns; i++) {
            size_t l = strlen(stops[i]);
            if (l <= j && !memcmp(text + j - l, stops[i], l) && l > best)
                best = l;
        }
        if (best) {
            *matched = true;
            return j - best;
        }
    }
    *matched = false;
    return n;
}

TEST(stop_random_vs_reference)
{
    struct rng g;
    rng_seed(&g, 7);
    const char alpha[] = "ab\xc3\xa9 ";  /* 'a', 'b', 'é', ' ' */
    const char *chars[] = {"a", "b", "\xc3\xa9", " "};
    (void)alpha;
    for (int iter = 0; iter < 3000; iter++) {
        char sbuf[4][16];
        const char *stops[4];
        int ns = 1 + (int)(rng_u64(&g) % 3);
        for (int i = 0; i < ns; i++) {
            int l = 1 + (int)(rng_u64(&g) % 4);
            sbuf[i][0] = 0;
            for (int k = 0; k < l; k++)
                strcat(sbuf[i], chars[rng_u64(&g) % 4]);
            stops[i] = sbuf[i];
        }
        char text[256] = "";
        int nc = (int)(rng_u64(&g) % 40);
        for (int k = 0; k < nc; k++)
            strcat(text, chars[rng_u64(&g) % 4]);
        size_t n = strlen(text);
        /* one character per push: must equal the reference exactly */
        const char *pieces[64];
        char pbuf[64][4];
        int np = 0;
        for (size_t k = 0; k < n;) {
            size_t cl = ((unsigned char)text[k] >= 0xC0) ? 2 : 1;
            memcpy(pbuf[np], text + k, cl);
            pbuf[np][cl] = 0;
            pieces[np] = pbuf[np];
            np++;
            k += cl;
        }
        pieces[np] = NULL;
        struct stop_matcher *m = mk(stops, ns, false);
        REQUIRE(m);
        struct mres r;
        run_pieces(m, pieces, &r);
        bool rm;
        size_t cut = ref_cut(text, n, stops, ns, &rm);
        CHECK(r.matched == rm);
        CHECK(r.len == cut && !memcmp(r.text, text, cut));
        CHECK(!r.split_bad);
        stop_free(m);
        /* random multi-character pieces: a prefix of the text, no stop inside it, matched
           whenever the text has a stop, and never cut later than the reference */
        char qbuf[64][256];
        int nq = 0;
        for (size_t k = 0; k < n;) {
            size_t take = 0;
            int chars_take = 1 + (int)(rng_u64(&g) % 5);
            for (int c = 0; c < chars_take && k + take < n; c++)
                take += ((unsigned char)text[k + take] >= 0xC0) ? 2 : 1;
            memcpy(qbuf[nq], text + k, take);
            qbuf[nq][take] = 0;
            pieces[nq] = qbuf[nq];
            nq++;
            k += take;
        }
        pieces[nq] = NULL;
        m = mk(stops, ns, false);
        REQUIRE(m);
        run_pieces(m, pieces, &r);
        CHECK(r.matched == rm);
        CHECK(r.len <= n && !memcmp(r.text, text, r.len));
        CHECK(!rm || r.len <= cut);
        for (int i = 0; i < ns; i++)
            CHECK(strstr(r.text, stops[i]) == NULL);
        CHECK(!r.split_bad);
        stop_free(m);
        if (test_cur_failed) {
            fprintf(stderr, "iter %d text '%s'\n", iter, text);
            return;
        }
    }
}

/* ---- request output path -------------------------------------------------------------- */

static struct tokenizer *g_tok;
static struct gguf_file *g_gguf;
static int g_nv;

struct rec {
    char text[8192];
    size_t len;
    int n_deltas, n_finish;
    int32_t tokens[512];
    int n_tokens;
    bool bad_utf8;
    struct request_result res;
    float lp[512];
    int32_t top0[512];
};

static void rec_delta(void *user, uint64_t id, int seq, const char *text, size_t len,
                      const int32_t *tokens, int n_tokens, const struct request_logprob *lp)
{
    struct rec *r = (struct rec *)user + seq;
    (void)id;
    if (!stop_utf8_valid(text, len))
        r->bad_utf8 = true;
    if (r->len + len < sizeof r->text) {
        memcpy(r->text + r->len, text, len);
        r->len += len;
        r->text[r->len] = 0;
    }
    for (int i = 0; i < n_tokens && r->n_tokens < 512; i++) {
        if (lp) {
            r->lp[r->n_tokens] = lp->logprob;
            r->top0[r->n_tokens] = lp->n_top ? lp->top_ids[0] : -1;
        }
        r->tokens[r->n_tokens++] = tokens[i];
    }
    r->n_deltas++;
}

static void rec_finish(void *user, uint64_t id, int seq, const struct request_result *res)
{
    struct rec *r = (struct rec *)user + seq;
    (void)id;
    r->n_finish++;
    r->res = *res;
}

/* Drive sequence 0..n-1 of a request with one-hot logits choosing want[k] (second best
   second[k] when given) until it finishes or want runs out. */
static int drive(struct request *rq, const int32_t *want, const int32_t *second, int n_want)
{
    float *logits = wcalloc((size_t)g_nv, sizeof *logits);
    int steps = 0;
    struct weld_err e;
    for (int k = 0; k < n_want && !request_done(rq); k++) {
        memset(logits, 0, (size_t)g_nv * sizeof *logits);
        logits[want[k]] = 10.0f;
        if (second)
            logits[second[k]] = 5.0f;
        for (int i = 0; i < rq->n_seqs; i++) {
            if (rq->seqs[i].finish != REQUEST_FINISH_NONE)
                continue;
            bool fin;
            if (request_seq_step(rq, i, logits, NULL, false, &fin, &e) != WELD_OK) {
                fprintf(stderr, "step: %s\n", e.msg);
                wfree(logits);
                return -1;
            }
        }
        steps++;
    }
    wfree(logits);
    return steps;
}

static bool g_quiet;

static struct request *mkreq(const struct request_params *p, struct rec *rec)
{
    static const int32_t prompt[] = {1, 100, 200};
    struct request_callbacks cb = {rec, rec_delta, rec_finish};
    struct request *rq = NULL;
    struct weld_err e;
    if (request_create(&rq, 42, p, prompt, 3, g_tok, g_nv, &cb, &e) != WELD_OK && !g_quiet)
        fprintf(stderr, "request_create: %s\n", e.msg);
    return rq;
}

static struct request_params greedy(void)
{
    struct request_params p = request_params_default();
    static const int32_t dummy = 1;
    p.prompt_ids = &dummy;
    p.n_prompt_ids = 1;
    p.sampling.temperature = 0;
    return p;
}

/* Token ids of a text without BOS. */
static int encode(const char *text, int32_t *out, int cap)
{
    int32_t *ids;
    size_t n;
    struct weld_err e;
    if (tokenizer_encode(g_tok, text, strlen(text), false, false, &ids, &n, &e) != WELD_OK)
        return -1;
    int k = (int)n < cap ? (int)n : cap;
    memcpy(out, ids, (size_t)k * sizeof *out);
    wfree(ids);
    return k;
}

static char *decode(const int32_t *ids, int n)
{
    char *s;
    size_t len;
    struct weld_err e;
    if (tokenizer_decode(g_tok, ids, (size_t)n, true, &s, &len, &e) != WELD_OK)
        return NULL;
    return s;
}

TEST(request_max_tokens_and_text)
{
    REQUIRE(g_tok);
    int32_t ids[64];
    int n = encode("Once upon a time there was a cat.", ids, 64);
    REQUIRE(n > 6);
    struct request_params p = greedy();
    p.max_tokens = 5;
    struct rec rec[1];
    memset(rec, 0, sizeof rec);
    struct request *rq = mkreq(&p, rec);
    REQUIRE(rq);
    CHECK_EQ_INT(drive(rq, ids, NULL, n), 5);
    CHECK_EQ_INT(rec[0].n_finish, 1);
    CHECK_EQ_INT(rec[0].res.finish, REQUEST_FINISH_LENGTH);
    CHECK_EQ_INT(rec[0].res.n_generated_tokens, 5);
    CHECK_EQ_INT(rec[0].res.n_prompt_tokens, 3);
    CHECK_EQ_INT(rec[0].n_tokens, 5);
    char *want = decode(ids, 5);
    CHECK_EQ_STR(rec[0].text, want);
    wfree(want);
    request_free(rq);
}

TEST(request_eos_ignore_eos_stop_ids)
{
    REQUIRE(g_tok);
    int eos = tokenizer_eos(g_tok);
    REQUIRE(eos >= 0);
    int32_t ids[8];
    int n = encode("Once upon", ids, 6);
    REQUIRE(n >= 2);
    int32_t seq[8] = {ids[0], ids[1], eos, ids[0], ids[1], ids[0]};
    struct request_params p = greedy();
    struct rec rec[1];
    memset(rec, 0, sizeof rec);
    struct request *rq = mkreq(&p, rec);
    REQUIRE(rq);
    CHECK_EQ_INT(drive(rq, seq, NULL, 6), 3);
    CHECK_EQ_INT(rec[0].res.finish, REQUEST_FINISH_STOP);
    CHECK_EQ_INT(rec[0].res.stop_token, eos);
    CHECK_EQ_INT(rec[0].res.n_generated_tokens, 3);
    char *want = decode(ids, 2);
    CHECK_EQ_STR(rec[0].text, want);
    wfree(want);
    request_free(rq);

    p.ignore_eos = true;
    p.max_tokens = 6;
    memset(rec, 0, sizeof rec);
    rq = mkreq(&p, rec);
    REQUIRE(rq);
    CHECK_EQ_INT(drive(rq, seq, NULL, 6), 6);
    CHECK_EQ_INT(rec[0].res.finish, REQUEST_FINISH_LENGTH);
    request_free(rq);

    /* a stop token id ends it; its text is not in the output */
    p = greedy();
    int32_t stop_ids[] = {ids[1]};
    p.stop_token_ids = stop_ids;
    p.n_stop_token_ids = 1;
    memset(rec, 0, sizeof rec);
    rq = mkreq(&p, rec);
    REQUIRE(rq);
    CHECK_EQ_INT(drive(rq, seq, NULL, 6), 2);
    CHECK_EQ_INT(rec[0].res.finish, REQUEST_FINISH_STOP);
    CHECK_EQ_INT(rec[0].res.stop_token, ids[1]);
    CHECK_EQ_INT(rec[0].n_tokens, 2);
    want = decode(ids, 1);
    CHECK_EQ_STR(rec[0].text, want);
    wfree(want);
    request_free(rq);
}

TEST(request_min_tokens_masks_eos)
{
    REQUIRE(g_tok);
    int eos = tokenizer_eos(g_tok);
    int32_t x[1];
    REQUIRE(encode("cat", x, 1) == 1);
    int32_t want[8], second[8];
    for (int i = 0; i < 8; i++)
        want[i] = eos, second[i] = x[0];
    struct request_params p = greedy();
    p.min_tokens = 3;
    struct rec rec[1];
    memset(rec, 0, sizeof rec);
    struct request *rq = mkreq(&p, rec);
    REQUIRE(rq);
    CHECK_EQ_INT(drive(rq, want, second, 8), 4);
    CHECK_EQ_INT(rec[0].res.finish, REQUEST_FINISH_STOP);
    CHECK_EQ_INT(rec[0].n_tokens, 4);
    CHECK(rec[0].tokens[0] == x[0] && rec[0].tokens[2] == x[0] && rec[0].tokens[3] == eos);
    request_free(rq);
    /* stop strings are not matched before min_tokens either */
    int32_t ab[8];
    int nab = encode(" cat cat cat cat", ab, 8);
    REQUIRE(nab >= 4);
    p = greedy();
    const char *stops[] = {"cat"};
    p.stop = stops;
    p.n_stop = 1;
    int32_t one[8];
    p.min_tokens = encode(" cat", one, 8) + 1; /* past the first "cat" */
    memset(rec, 0, sizeof rec);
    rq = mkreq(&p, rec);
    REQUIRE(rq);
    drive(rq, ab, NULL, nab);
    CHECK_EQ_INT(rec[0].res.finish, REQUEST_FINISH_STOP);
    CHECK(rec[0].n_tokens >= p.min_tokens);
    CHECK(strstr(rec[0].text, "cat") != NULL); /* the first "cat" came before min_tokens */
    request_free(rq);
}

TEST(request_stop_string_across_tokens)
{
    REQUIRE(g_tok);
    int32_t ids[64];
    int n = encode("Once upon a time there was a little girl.", ids, 64);
    REQUIRE(n > 8);
    char *full = decode(ids, n);
    REQUIRE(full);
    const char *stop = "time there";
    const char *at = strstr(full, stop);
    REQUIRE(at);
    struct request_params p = greedy();
    p.max_tokens = 100;
    const char *stops[] = {"zebra", stop};
    p.stop = stops;
    p.n_stop = 2;
    struct rec rec[1];
    memset(rec, 0, sizeof rec);
    struct request *rq = mkreq(&p, rec);
    REQUIRE(rq);
    drive(rq, ids, NULL, n);
    CHECK_EQ_INT(rec[0].res.finish, REQUEST_FINISH_STOP);
    CHECK_EQ_STR(rec[0].res.stop_reason, stop);
    CHECK(rec[0].len == (size_t)(at - full) && !memcmp(rec[0].text, full, rec[0].len));
    CHECK(rec[0].n_tokens < n);
    request_free(rq);
    /* include_stop_str_in_output keeps it */
    p.include_stop_str_in_output = true;
    memset(rec, 0, sizeof rec);
    rq = mkreq(&p, rec);
    REQUIRE(rq);
    drive(rq, ids, NULL, n);
    CHECK(rec[0].len == (size_t)(at - full) + strlen(stop) &&
          !memcmp(rec[0].text, full, rec[0].len));
    request_free(rq);
    wfree(full);
}

TEST(request_utf8_deltas)
{
    REQUIRE(g_tok);
    const char *text = "caf\xc3\xa9 \xe2\x98\x83 \xf0\x9f\x98\x80 na\xc3\xafve";
    int32_t ids[128];
    int n = encode(text, ids, 128);
    REQUIRE(n > 5);
    struct request_params p = greedy();
    p.max_tokens = n;
    const char *stops[] = {"\xf0\x9f\x98\x80 na\xc3\xaf"};
    p.stop = stops;
    p.n_stop = 1;
    struct rec rec[1];
    memset(rec, 0, sizeof rec);
    struct request *rq = mkreq(&p, rec);
    REQUIRE(rq);
    drive(rq, ids, NULL, n);
    CHECK(!rec[0].bad_utf8);
    CHECK_EQ_INT(rec[0].res.finish, REQUEST_FINISH_STOP);
    char *full = decode(ids, n);
    const char *at = strstr(full, stops[0]);
    REQUIRE(at);
    CHECK(rec[0].len == (size_t)(at - full) && !memcmp(rec[0].text, full, rec[0].len));
    wfree(full);
    request_free(rq);
}

TEST(request_logprobs_and_n)
{
    REQUIRE(g_tok);
    int32_t ids[16];
    int n = encode("Once upon a time", ids, 16);
    struct request_params p = greedy();
    p.logprobs = 3;
    p.n = 3;
    p.max_tokens = n;
    struct rec rec[3];
    memset(rec, 0, sizeof rec);
    struct request *rq = mkreq(&p, rec);
    REQUIRE(rq);
    CHECK_EQ_INT(drive(rq, ids, NULL, n), n);
    float *logits = wcalloc((size_t)g_nv, sizeof *logits);
    logits[ids[0]] = 10.0f;
    float want = sampler_logprob(logits, g_nv, ids[0]);
    for (int s = 0; s < 3; s++) {
        CHECK_EQ_INT(rec[s].n_finish, 1);
        CHECK_EQ_INT(rec[s].n_tokens, n);
        CHECK_EQ_INT(rec[s].top0[0], ids[0]);
        CHECK_NEAR(rec[s].lp[0], want, 1e-5);
        CHECK_EQ_INT(rec[s].res.seq_index, s);
    }
    CHECK_EQ_STR(rec[1].text, rec[0].text);
    wfree(logits);
    request_free(rq);
}

TEST(request_abort_and_validation)
{
    REQUIRE(g_tok);
    struct request_params p = greedy();
    p.n = 2;
    struct rec rec[2];
    memset(rec, 0, sizeof rec);
    struct request *rq = mkreq(&p, rec);
    REQUIRE(rq);
    request_finish_all(rq, REQUEST_FINISH_ABORT, NULL);
    CHECK(request_done(rq));
    CHECK_EQ_INT(rec[0].res.finish, REQUEST_FINISH_ABORT);
    CHECK_EQ_INT(rec[1].n_finish, 1);
    request_free(rq);

    struct weld_err e;
    p = greedy();
    p.max_tokens = 0;
    CHECK(request_params_check(&p, g_nv, &e) == WELD_ERR_INVALID_ARG);
    CHECK(strstr(e.msg, "max_tokens") != NULL);
    p = greedy();
    p.min_tokens = 20;
    CHECK(request_params_check(&p, g_nv, &e) == WELD_ERR_INVALID_ARG);
    CHECK(strstr(e.msg, "min_tokens") != NULL);
    p = greedy();
    const char *stops[] = {"a", ""};
    p.stop = stops;
    p.n_stop = 2;
    CHECK(request_params_check(&p, g_nv, &e) == WELD_ERR_INVALID_ARG);
    CHECK(strstr(e.msg, "stop[1]") != NULL);
    p = greedy();
    int32_t bad[] = {g_nv};
    p.stop_token_ids = bad;
    p.n_stop_token_ids = 1;
    CHECK(request_params_check(&p, g_nv, &e) == WELD_ERR_INVALID_ARG);
    CHECK(strstr(e.msg, "stop_token_ids[0]") != NULL);
    p = greedy();
    p.prompt = "x";
    CHECK(request_params_check(&p, g_nv, &e) == WELD_ERR_INVALID_ARG);
    CHECK(strstr(e.msg, "exactly one") != NULL);
    p = greedy();
    p.sampling.top_p = 2;
    CHECK(request_params_check(&p, g_nv, &e) == WELD_ERR_INVALID_ARG);
    p = greedy();
    p.logprobs = 21;
    CHECK(request_params_check(&p, g_nv, &e) == WELD_ERR_INVALID_ARG);
    CHECK(strstr(e.msg, "logprobs") != NULL);
}

TEST(request_encode_prompt_paths)
{
    REQUIRE(g_tok);
    struct request_params p = request_params_default();
    p.prompt = "Once upon a time";
    int32_t *ids;
    int n;
    struct weld_err e;
    REQUIRE(request_encode_prompt(g_tok, &p, &ids, &n, &e) == WELD_OK);
    CHECK(n > 1 && ids[0] == tokenizer_bos(g_tok));
    wfree(ids);
    p.add_special_tokens = false;
    REQUIRE(request_encode_prompt(g_tok, &p, &ids, &n, &e) == WELD_OK);
    CHECK(n >= 1 && ids[0] != tokenizer_bos(g_tok));
    wfree(ids);
    /* stories260K has no chat template: the error names messages */
    p = request_params_default();
    json_t *msgs = json_pack("[{s:s, s:s}]", "role", "user", "content", "hi");
    p.messages = msgs;
    int rc = request_encode_prompt(g_tok, &p, &ids, &n, &e);
    if (tokenizer_chat_template(g_tok) == NULL) {
        CHECK(rc == WELD_ERR_NOT_FOUND);
        CHECK(strstr(e.msg, "messages") != NULL);
    } else {
        CHECK(rc == WELD_OK);
        if (rc == WELD_OK)
            wfree(ids);
    }
    /* an explicit chat_template renders the messages whatever the model ships; the text
       starts with BOS, so no second BOS is added */
    p.chat_template = "{{ bos_token }}{% for m in messages %}<{{ m.role }}>{{ m.content }}"
                      "{% endfor %}{% if add_generation_prompt %}<a>{% endif %}";
    REQUIRE(request_encode_prompt(g_tok, &p, &ids, &n, &e) == WELD_OK);
    int32_t *want;
    size_t n_want;
    REQUIRE(tokenizer_encode(g_tok, "<s><user>hi<a>", 14, false, true, &want, &n_want, &e) ==
            WELD_OK);
    CHECK_EQ_INT(n, (int)n_want);
    CHECK(n == (int)n_want && !memcmp(ids, want, n_want * sizeof *ids));
    CHECK(tokenizer_bos(g_tok) >= 0 && ids[0] == tokenizer_bos(g_tok) &&
          (n < 2 || ids[1] != tokenizer_bos(g_tok)));
    wfree(want);
    wfree(ids);
    json_decref(msgs);
}

/* Cleanup paths: every allocation in request_create failing in turn. */
TEST(request_create_alloc_failures)
{
    REQUIRE(g_tok);
    struct request_params p = greedy();
    const char *stops[] = {"ab", "cd"};
    p.stop = stops;
    p.n_stop = 2;
    p.n = 2;
    p.min_tokens = 1;
    int ok = 0;
    g_quiet = true;
    for (long k = 1; k < 200; k++) {
        struct rec rec[2];
        memset(rec, 0, sizeof rec);
        alloc_fail_at(k);
        struct request *rq = mkreq(&p, rec);
        long failed = alloc_failed_count();
        alloc_fail_at(0);
        if (rq) {
            request_free(rq);
            if (!failed) {
                ok = 1;
                break;
            }
        }
    }
    g_quiet = false;
    CHECK(ok);
}

int main(void)
{
    RUN(stop_spanning_pushes);
    RUN(stop_partial_not_a_stop);
    RUN(stop_multibyte);
    RUN(stop_several_and_overlapping);
    RUN(stop_include_and_arm);
    RUN(stop_random_vs_reference);
    const char *path = test_shared_path("models/stories260K.gguf");
    struct weld_err e;
    if (!path || gguf_open(&g_gguf, path, &e) != WELD_OK ||
        tokenizer_load_gguf(&g_tok, g_gguf, &e) != WELD_OK) {
        fprintf(stderr, "stories260K.gguf not available: request tests fail\n");
    } else {
        g_nv = tokenizer_n_vocab(g_tok);
    }
    RUN(request_max_tokens_and_text);
    RUN(request_eos_ignore_eos_stop_ids);
    RUN(request_min_tokens_masks_eos);
    RUN(request_stop_string_across_tokens);
    RUN(request_utf8_deltas);
    RUN(request_logprobs_and_n);
    RUN(request_abort_and_validation);
    RUN(request_encode_prompt_paths);
    RUN(request_create_alloc_failures);
    tokenizer_free(g_tok);
    gguf_close(g_gguf);
    return test_summary();
}
