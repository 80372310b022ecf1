/*
 * test_server_gen - the engine thread of `weld serve` (server/gen.h) without HTTP: jobs in,
 * events out, on stories260K.
 *
 * Checks: a greedy job's text equals the golden continuation (the one cli_batch.sh and the
 * generate test hold weld to); prompts x n choices each finish exactly once, with usage
 * counts; logit_bias forces (+100) or forbids (-100) a token; a job cancelled in the
 * middle (held at the stream buffer, so it cannot finish first) ends aborted and gives its
 * blocks back; a prompt the engine refuses comes back as a 400 naming the limit; halting with a job running aborts it and the HTTP
 * side still drains its outbox; the metrics and stats snapshot end idle with no KV block
 * used; a watched (streamed) job whose outbox is not read is paused at the stream buffer,
 * resumes as it is read (same greedy text), and is aborted after the stall timeout with its
 * socket shut down.
 */
#include "test.h"

#include "core/alloc.h"
#include "server/gen.h"

#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static const char *golden = ", there was a little girl named Lily. She loved to play outside "
                            "in the park. One day, she saw";
static int32_t once[] = {1, 403, 407, 261, 378};
static const char *g_model;

struct result {
    char text[8][512];
    int finishes[8];
    enum request_finish reason[8];
    int n_events, n_prompt, n_generated;
};

/* Drain a job's outbox until it is over, or for at most max_wait seconds without an event
   (0: no limit). */
static void drain_for(struct server_job *j, struct result *r, int max_wait)
{
    memset(r, 0, sizeof *r);
    struct server_event *ev;
    int rc, idle = 0;
    while ((rc = server_gen_next(j, 1000, &ev)) >= 0) {
        if (rc == 0) {
            if (max_wait && ++idle >= max_wait)
                return;
            continue;
        }
        idle = 0;
        r->n_events++;
        if (ev->choice >= 0 && ev->choice < 8) {
            if (ev->finish) {
                r->finishes[ev->choice]++;
                r->reason[ev->choice] = ev->reason;
                r->n_prompt += ev->n_prompt;
                r->n_generated += ev->n_generated;
            } else {
                strncat(r->text[ev->choice], ev->text,
                        sizeof r->text[0] - strlen(r->text[ev->choice]) - 1);
            }
        }
        wfree(ev);
    }
}

static void drain(struct server_job *j, struct result *r)
{
    drain_for(j, r, 0);
}

static struct server_gen *start(int max_model_len)
{
    struct engine_params ep = engine_params_default();
    ep.model_path = g_model;
    ep.quiet = true;
    ep.max_model_len = max_model_len;
    struct server_gen *g = NULL;
    struct weld_err e = {0};
    if (server_gen_start(&g, &ep, &e))
        return NULL;
    server_gen_load(g);
    for (int i = 0; i < 2000 && server_gen_state(g, NULL, 0) == SERVER_GEN_LOADING; i++) {
        struct timespec ts = {0, 5000000L};
        nanosleep(&ts, NULL);
    }
    return g;
}

static struct server_prompt prompt_once(void)
{
    return (struct server_prompt){once, 5, "Once upon a time", 16};
}

TEST(greedy_and_choices)
{
    struct server_gen *g = start(0);
    REQUIRE(g && server_gen_state(g, NULL, 0) == SERVER_GEN_READY);
    struct request_params p = request_params_default();
    p.sampling.temperature = 0;
    p.max_tokens = 32;
    struct server_prompt pr[2] = {prompt_once(), prompt_once()};
    struct server_error e;
    struct server_job *j = server_gen_submit(g, &p, pr, 1, &e);
    REQUIRE(j);
    CHECK_EQ_INT(server_gen_wait_accepted(j, &e), 0);
    struct result r;
    drain(j, &r);
    server_gen_release(j);
    CHECK_EQ_STR(r.text[0], golden);
    CHECK_EQ_INT(r.finishes[0], 1);
    CHECK_EQ_INT(r.reason[0], REQUEST_FINISH_LENGTH);
    CHECK_EQ_INT(r.n_generated, 32);

    /* 2 prompts x n = 3: six choices, each finishing once, greedy so all equal */
    p.n = 3;
    p.max_tokens = 8;
    j = server_gen_submit(g, &p, pr, 2, &e);
    REQUIRE(j);
    CHECK_EQ_INT(server_gen_wait_accepted(j, &e), 0);
    drain(j, &r);
    server_gen_release(j);
    for (int i = 0; i < 6; i++) {
        CHECK_EQ_INT(r.finishes[i], 1);
        CHECK(!strncmp(r.text[i], golden, strlen(r.text[i])) && strlen(r.text[i]) > 10);
    }
    CHECK_EQ_INT(r.n_generated, 48);
    CHECK_EQ_INT(r.n_prompt, 30);

    /* logit_bias: +100 forces a token; -100 on the greedy first token (432, ",") moves
       the first token elsewhere */
    int32_t bias_ids[2] = {403, 432};
    float bias[2] = {100, 0};
    p.n = 1;
    p.max_tokens = 6;
    p.logprobs = 0;
    p.logit_bias_ids = bias_ids;
    p.logit_bias = bias;
    p.n_logit_bias = 1;
    j = server_gen_submit(g, &p, pr, 1, &e);
    REQUIRE(j);
    CHECK_EQ_INT(server_gen_wait_accepted(j, &e), 0);
    int n_forced = 0, first = -1;
    struct server_event *ev;
    int rc;
    while ((rc = server_gen_next(j, 1000, &ev)) >= 0) {
        if (rc == 1 && !ev->finish && ev->has_lp)
            n_forced += ev->token == 403;
        wfree(ev);
    }
    server_gen_release(j);
    CHECK_EQ_INT(n_forced, 6);
    bias[1] = -100;
    p.logit_bias_ids = bias_ids + 1;
    p.logit_bias = bias + 1;
    j = server_gen_submit(g, &p, pr, 1, &e);
    REQUIRE(j);
    CHECK_EQ_INT(server_gen_wait_accepted(j, &e), 0);
    while ((rc = server_gen_next(j, 1000, &ev)) >= 0) {
        if (rc == 1 && !ev->finish && ev->has_lp && first < 0)
            first = ev->token;
        wfree(ev);
    }
    server_gen_release(j);
    CHECK(first >= 0 && first != 432);

    struct server_metrics m;
    server_gen_metrics(g, &m);
    CHECK_EQ_INT(m.success[REQUEST_FINISH_LENGTH], 9);
    CHECK_EQ_INT(m.st.running, 0);
    CHECK_EQ_INT(m.st.kv_blocks_used, 0);
    CHECK_EQ_INT(m.ttft.n, 5); /* one per engine request: 1 + 2 prompts + 2 */
    CHECK(m.itl.n >= 31);
    server_gen_halt(g);
    server_gen_free(g);
}

TEST(cancel_refuse_halt)
{
    struct server_gen *g = start(64);
    REQUIRE(g && server_gen_state(g, NULL, 0) == SERVER_GEN_READY);
    struct request_params p = request_params_default();
    p.max_tokens = 50;
    p.ignore_eos = true;
    struct server_prompt pr = prompt_once();
    struct server_error e;

    /* cancelled at once: it ends, once (aborted, refused before it was added, or done
       first: a race on a fast machine, so not what proves the cancel works) */
    for (int k = 0; k < 20; k++) {
        struct server_job *j = server_gen_submit(g, &p, &pr, 1, &e);
        REQUIRE(j);
        server_gen_cancel(j);
        struct result r;
        drain(j, &r);
        CHECK(r.finishes[0] == 0 || (r.finishes[0] == 1 && (r.reason[0] == REQUEST_FINISH_ABORT ||
                                                            r.reason[0] == REQUEST_FINISH_LENGTH)));
        server_gen_release(j);
    }
    /* cancelled in the middle: a streamed job nobody reads stops at the stream buffer (no
       stall timeout), so it cannot finish by itself; the cancel must end it, aborted,
       with its blocks given back */
    server_gen_set_stream_limits(g, 2048, 0);
    {
        struct server_job *j = server_gen_submit(g, &p, &pr, 1, &e);
        REQUIRE(j);
        server_gen_watch(j, -1, "c1");
        CHECK_EQ_INT(server_gen_wait_accepted(j, &e), 0);
        struct server_metrics m;
        server_gen_metrics(g, &m);
        for (int i = 0; i < 500 && m.st.paused == 0; i++) {
            struct timespec ts = {0, 10000000L};
            nanosleep(&ts, NULL);
            server_gen_metrics(g, &m);
        }
        REQUIRE(m.st.paused == 1);
        server_gen_cancel(j);
        struct result r;
        drain_for(j, &r, 10);
        server_gen_release(j);
        CHECK_EQ_INT(r.finishes[0], 1);
        CHECK_EQ_INT(r.reason[0], REQUEST_FINISH_ABORT);
        CHECK(r.n_generated > 0 && r.n_generated < p.max_tokens);
        server_gen_metrics(g, &m);
        CHECK_EQ_INT(m.st.paused + m.st.running + m.st.kv_blocks_used, 0);
    }
    server_gen_set_stream_limits(g, 0, 0);
    /* a prompt longer than max_model_len: refused by the engine, 400 naming the limit */
    int32_t big[100];
    for (int i = 0; i < 100; i++)
        big[i] = 403;
    struct server_prompt bp = {big, 100, "", 0};
    struct server_job *j = server_gen_submit(g, &p, &bp, 1, &e);
    REQUIRE(j);
    CHECK_EQ_INT(server_gen_wait_accepted(j, &e), 400);
    CHECK(strstr(e.msg, "max_model_len") != NULL);
    struct result r;
    drain(j, &r);
    CHECK_EQ_INT(r.n_events, 0);
    server_gen_release(j);

    /* halted with jobs running: they end (abort, or length if they were quick) */
    struct server_job *run[4];
    for (int i = 0; i < 4; i++)
        REQUIRE((run[i] = server_gen_submit(g, &p, &pr, 1, &e)));
    for (int i = 0; i < 4; i++)
        CHECK_EQ_INT(server_gen_wait_accepted(run[i], &e), 0);
    server_gen_close(g);
    CHECK(server_gen_submit(g, &p, &pr, 1, &e) == NULL && e.http == 503);
    server_gen_halt(g);
    for (int i = 0; i < 4; i++) {
        drain(run[i], &r);
        CHECK_EQ_INT(r.finishes[0], 1);
        server_gen_release(run[i]);
    }
    struct server_metrics m;
    server_gen_metrics(g, &m);
    CHECK_EQ_INT(m.st.running + m.st.waiting, 0);
    CHECK_EQ_INT(m.st.kv_blocks_used, 0);
    server_gen_free(g);
}

static void nap_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static struct server_metrics metrics_of(struct server_gen *g)
{
    struct server_metrics m;
    server_gen_metrics(g, &m);
    return m;
}

TEST(stream_pause_and_stall)
{
    struct server_gen *g = start(0);
    REQUIRE(g && server_gen_state(g, NULL, 0) == SERVER_GEN_READY);
    server_gen_set_stream_limits(g, 2048, 0);
    struct request_params p = request_params_default();
    p.sampling.temperature = 0;
    p.max_tokens = 32;
    struct server_prompt pr = prompt_once();
    struct server_error e;
    struct server_job *j = server_gen_submit(g, &p, &pr, 1, &e);
    REQUIRE(j);
    server_gen_watch(j, -1, "t1");
    CHECK_EQ_INT(server_gen_wait_accepted(j, &e), 0);
    struct server_metrics m = metrics_of(g);
    for (int i = 0; i < 500 && m.st.paused == 0; i++, m = metrics_of(g))
        nap_ms(10);
    CHECK_EQ_INT(m.st.paused, 1);
    uint64_t gen0 = m.st.generated_tokens;
    CHECK(gen0 > 0 && gen0 < 32);
    nap_ms(100);
    CHECK_EQ_INT((int)metrics_of(g).st.generated_tokens, (int)gen0);
    struct result r;
    drain(j, &r); /* reading resumes it */
    server_gen_release(j);
    CHECK_EQ_STR(r.text[0], golden);
    CHECK_EQ_INT(r.reason[0], REQUEST_FINISH_LENGTH);
    CHECK_EQ_INT(metrics_of(g).st.paused, 0);

    /* paused past the stall timeout: aborted, its socket shut down. The job is watched
       only after it is submitted (as the HTTP side does), and this prompt's blocks are
       cached now, so its first 32 tokens may all come before the watch: ask for more */
    server_gen_set_stream_limits(g, 2048, 0.2);
    int sv[2];
    REQUIRE(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
    p.max_tokens = 120;
    j = server_gen_submit(g, &p, &pr, 1, &e);
    REQUIRE(j);
    server_gen_watch(j, sv[0], "t2");
    CHECK_EQ_INT(server_gen_wait_accepted(j, &e), 0);
    m = metrics_of(g);
    for (int i = 0; i < 500 && m.stream_stalls == 0; i++, m = metrics_of(g))
        nap_ms(10);
    CHECK_EQ_INT((int)m.stream_stalls, 1);
    char b;
    CHECK(recv(sv[1], &b, 1, MSG_DONTWAIT) == 0); /* the peer sees the shutdown */
    drain(j, &r);
    server_gen_release(j);
    CHECK_EQ_INT(r.reason[0], REQUEST_FINISH_ABORT);
    CHECK(strlen(r.text[0]) < strlen(golden));
    close(sv[0]);
    close(sv[1]);
    m = metrics_of(g);
    CHECK_EQ_INT(m.st.paused + m.st.running + m.st.kv_blocks_used, 0);
    server_gen_free(g);
}

TEST(load_failure)
{
    struct engine_params ep = engine_params_default();
    ep.model_path = "/nonexistent/model.gguf";
    ep.quiet = true;
    struct server_gen *g = NULL;
    struct weld_err e = {0};
    REQUIRE(server_gen_start(&g, &ep, &e) == WELD_OK);
    struct server_error se;
    CHECK(server_gen_submit(g, &(struct request_params){.n = 1}, NULL, 0, &se) == NULL);
    CHECK_EQ_INT(se.http, 503);
    server_gen_load(g);
    char msg[1024];
    for (int i = 0; i < 2000 && server_gen_state(g, msg, sizeof msg) == SERVER_GEN_LOADING; i++) {
        struct timespec ts = {0, 1000000L};
        nanosleep(&ts, NULL);
    }
    CHECK_EQ_INT(server_gen_state(g, msg, sizeof msg), SERVER_GEN_FAILED);
    CHECK(strstr(msg, "nonexistent") != NULL);
    server_gen_free(g);
    /* freed without ever loading */
    REQUIRE(server_gen_start(&g, &ep, &e) == WELD_OK);
    server_gen_free(g);
}

int main(void)
{
    g_model = test_shared_path("models/stories260K.gguf");
    if (!g_model)
        return test_skip_all("stories260K.gguf not found under %s/models", test_shared_dir());
    RUN(greedy_and_choices);
    RUN(cancel_refuse_halt);
    RUN(stream_pause_and_stall);
    RUN(load_failure);
    return test_summary();
}
