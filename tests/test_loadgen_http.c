/*
 * test_loadgen_http - the load generator against a real HTTP server: a tiny
 * libmicrohttpd server in this process that streams canned OpenAI completions with known
 * delays (this tests the client; `weld serve` has its own tests).
 *
 * The canned server: GET /v1/models lists "canned-model"; POST /v1/completions streams
 * max_tokens chunks "t0".."tN" (FIRST_MS before the first, GAP_MS between the others),
 * then a usage chunk (prompt_tokens = 1000 + words in the prompt) and [DONE]; POST
 * /v1/chat/completions streams delta chunks without usage. Prompts starting with FAIL400,
 * NODONE or MIDERR get a 400 error object, a stream without [DONE], or an error object
 * mid-stream. It checks each request body (stream, include_usage, ignore_eos,
 * temperature 0, model) and an optional API key, and records the most requests it ever
 * had in flight and each request's arrival time.
 *
 * Then, when ctest gives WELD_BIN, `weld bench serve --json --goodput ...` runs against the
 * same server and its JSON is checked.
 */
#include "test.h"

#include "core/alloc.h"
#include "core/progress.h"
#include "loadgen/loadgen.h"

#include <arpa/inet.h>
#include <jansson.h>
#include <microhttpd.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#define FIRST_MS 30
#define GAP_MS 20

static atomic_int in_flight, max_in_flight, n_bad_body, n_requests;
static const char *required_key; /* NULL: no auth */

struct conn {
    char *body;
    size_t len;
};

struct canned {
    int n_tokens, next;
    int prompt_words;
    bool chat, no_done, mid_error, sent_usage, sent_done;
    bool counted_down; /* in_flight already decremented */
};

/* A request stops counting as in flight when its last bytes are produced: before the client
   can see the end, so the client's next request never overlaps it in the count. */
static void count_down(struct canned *c)
{
    if (!c->counted_down)
        atomic_fetch_sub(&in_flight, 1);
    c->counted_down = true;
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static ssize_t canned_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    struct canned *c = cls;
    (void)pos;
    int n = 0;
    if (c->next < c->n_tokens) {
        sleep_ms(c->next == 0 ? FIRST_MS : GAP_MS);
        if (c->mid_error && c->next == 1)
            n = snprintf(buf, max, "data: {\"error\":{\"message\":\"canned failure\"}}\n\n");
        else if (c->chat)
            n = snprintf(buf, max, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":"
                                   "\"t%d\"}}]}\n\n", c->next);
        else /* with a comment line and CRLF ends, as some servers send */
            n = snprintf(buf, max, ": keep-alive\r\ndata: {\"choices\":[{\"index\":0,"
                                   "\"text\":\"t%d\"}]}\r\n\r\n", c->next);
        c->next++;
    } else if (!c->chat && !c->sent_usage) {
        n = snprintf(buf, max, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":%d,"
                               "\"completion_tokens\":%d}}\n\n", c->prompt_words, c->n_tokens);
        c->sent_usage = true;
    } else if (!c->no_done && !c->sent_done) {
        n = snprintf(buf, max, "data: [DONE]\n\n");
        c->sent_done = true;
        count_down(c); /* the client may start its next request once it reads these bytes,
                          before libmicrohttpd calls this reader again */
    } else {
        count_down(c);
        return MHD_CONTENT_READER_END_OF_STREAM;
    }
    return n > 0 && (size_t)n < max ? n : MHD_CONTENT_READER_END_WITH_ERROR;
}

static void canned_free(void *cls)
{
    count_down(cls);
    wfree(cls);
}

static enum MHD_Result send_text(struct MHD_Connection *c, unsigned code, const char *text)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(text), (void *)text,
                                                             MHD_RESPMEM_MUST_COPY);
    MHD_add_response_header(r, "Content-Type", "application/json");
    enum MHD_Result ret = MHD_queue_response(c, code, r);
    MHD_destroy_response(r);
    return ret;
}

static int count_words(const char *s)
{
    int n = 0;
    for (const char *p = s; *p; p++)
        n += (p == s || p[-1] == ' ') && *p != ' ';
    return n;
}

/* Check the body the load generator sent; fill the canned stream from it. */
static bool parse_body(const char *body, size_t len, bool chat, struct canned *c,
                       const char **prompt)
{
    json_t *j = json_loadb(body, len, 0, NULL);
    bool ok = j && json_is_true(json_object_get(j, "stream")) &&
              json_is_true(json_object_get(json_object_get(j, "stream_options"),
                                           "include_usage")) &&
              json_is_true(json_object_get(j, "ignore_eos")) &&
              json_number_value(json_object_get(j, "temperature")) == 0 &&
              json_is_string(json_object_get(j, "model")) &&
              json_is_integer(json_object_get(j, "max_tokens"));
    static __thread char ptext[64];
    ptext[0] = 0;
    if (ok && chat) {
        json_t *msgs = json_object_get(j, "messages");
        json_t *last = json_array_get(msgs, json_array_size(msgs) - 1);
        ok = json_is_string(json_object_get(last, "content"));
    } else if (ok) {
        json_t *p = json_object_get(j, "prompt");
        ok = json_is_string(p);
        if (ok) {
            snprintf(ptext, sizeof ptext, "%s", json_string_value(p));
            c->prompt_words = 1000 + count_words(json_string_value(p));
        }
    }
    if (ok)
        c->n_tokens = (int)json_integer_value(json_object_get(j, "max_tokens"));
    json_decref(j);
    *prompt = ptext;
    return ok;
}

static enum MHD_Result stream_reply(struct MHD_Connection *mc, struct conn *cn, bool chat)
{
    struct canned *c = wcalloc(1, sizeof *c);
    const char *prompt = "";
    if (!parse_body(cn->body ? cn->body : "", cn->len, chat, c, &prompt)) {
        atomic_fetch_add(&n_bad_body, 1);
        wfree(c);
        return send_text(mc, 400, "{\"error\":{\"message\":\"bad body\"}}");
    }
    if (!strncmp(prompt, "FAIL400", 7)) {
        wfree(c);
        return send_text(mc, 400, "{\"error\":{\"message\":\"canned 400\",\"type\":\"x\"}}");
    }
    c->chat = chat;
    c->no_done = !strncmp(prompt, "NODONE", 6);
    c->mid_error = !strncmp(prompt, "MIDERR", 6);
    int now = atomic_fetch_add(&in_flight, 1) + 1, prev = atomic_load(&max_in_flight);
    while (now > prev && !atomic_compare_exchange_weak(&max_in_flight, &prev, now))
        ;
    struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 1024,
                                                               canned_read, c, canned_free);
    MHD_add_response_header(r, "Content-Type", "text/event-stream");
    enum MHD_Result ret = MHD_queue_response(mc, 200, r);
    MHD_destroy_response(r);
    return ret;
}

static enum MHD_Result handler(void *cls, struct MHD_Connection *mc, const char *url,
                               const char *method, const char *version, const char *upload,
                               size_t *upload_size, void **con_cls)
{
    (void)cls, (void)version;
    struct conn *cn = *con_cls;
    if (!cn) {
        *con_cls = wcalloc(1, sizeof *cn);
        return MHD_YES;
    }
    if (*upload_size) {
        char *nb = wrealloc(cn->body, cn->len + *upload_size + 1);
        memcpy(nb + cn->len, upload, *upload_size);
        cn->body = nb;
        cn->len += *upload_size;
        *upload_size = 0;
        return MHD_YES;
    }
    atomic_fetch_add(&n_requests, 1);
    if (required_key) {
        const char *auth = MHD_lookup_connection_value(mc, MHD_HEADER_KIND, "Authorization");
        char want[128];
        snprintf(want, sizeof want, "Bearer %s", required_key);
        if (!auth || strcmp(auth, want))
            return send_text(mc, 401, "{\"error\":{\"message\":\"bad key\"}}");
    }
    if (!strcmp(method, "GET") && !strcmp(url, "/v1/models"))
        return send_text(mc, 200, "{\"object\":\"list\",\"data\":[{\"id\":\"canned-model\"}]}");
    if (!strcmp(method, "POST") && !strcmp(url, "/v1/completions"))
        return stream_reply(mc, cn, false);
    if (!strcmp(method, "POST") && !strcmp(url, "/v1/chat/completions"))
        return stream_reply(mc, cn, true);
    return send_text(mc, 404, "{\"error\":{\"message\":\"not found\"}}");
}

static void completed(void *cls, struct MHD_Connection *c, void **con_cls,
                      enum MHD_RequestTerminationCode toe)
{
    (void)cls, (void)c, (void)toe;
    struct conn *cn = *con_cls;
    if (cn)
        wfree(cn->body);
    wfree(cn);
    *con_cls = NULL;
}

static struct MHD_Daemon *daemon_;
static char base_url[64];

static bool start_server(void)
{
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = 0};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    daemon_ = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION,
                               0, NULL, NULL, handler, NULL, MHD_OPTION_SOCK_ADDR, &sa,
                               MHD_OPTION_NOTIFY_COMPLETED, completed, NULL, MHD_OPTION_END);
    if (!daemon_)
        return false;
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(daemon_, MHD_DAEMON_INFO_BIND_PORT);
    snprintf(base_url, sizeof base_url, "http://127.0.0.1:%u", (unsigned)info->port);
    return true;
}

/* Each test starts with nothing in flight: a request the client gave up on (MIDERR: the
   client stops at the error) stays counted until the server's reader notices the closed
   connection, which can be after the next test has started. */
static void reset_counters(void)
{
    for (int i = 0; i < 500 && atomic_load(&in_flight) > 0; i++)
        sleep_ms(10);
    atomic_store(&max_in_flight, 0);
    atomic_store(&n_bad_body, 0);
    atomic_store(&n_requests, 0);
}

static struct loadgen_config config(const char *endpoint)
{
    struct loadgen_config c = {.base_url = base_url, .endpoint = endpoint,
                               .model = "canned-model", .burstiness = 1.0, .timeout_s = 30};
    return c;
}

static struct loadgen_dataset *words_dataset(enum loadgen_dataset_kind kind, int n, int out)
{
    struct loadgen_dataset_params p = {.kind = kind, .num_prompts = n, .input_len = 12,
                                       .output_len = out, .prefix_len = 5, .num_groups = 2,
                                       .seed = 5};
    struct loadgen_dataset *d = NULL;
    loadgen_dataset_build(&p, &d, NULL);
    return d;
}

TEST(concurrency_and_timings)
{
    reset_counters();
    struct loadgen_dataset *d = words_dataset(LOADGEN_DATASET_RANDOM, 12, 5);
    REQUIRE(d);
    struct loadgen_config c = config("/v1/completions");
    c.request_rate = INFINITY;
    c.max_concurrency = 3;
    struct loadgen_result *r = NULL;
    double dur = 0;
    struct weld_err e;
    REQUIRE(loadgen_run(&c, d, &r, &dur, &e) == WELD_OK);
    CHECK_EQ_INT(atomic_load(&max_in_flight), 3);
    CHECK_EQ_INT(atomic_load(&n_bad_body), 0);
    for (int i = 0; i < d->n; i++) {
        CHECK(r[i].success);
        if (!r[i].success)
            fprintf(stderr, "  request %d: %s\n", i, r[i].error ? r[i].error : "?");
        CHECK_EQ_INT(r[i].http_status, 200);
        CHECK_EQ_INT(r[i].output_tokens, 5);
        CHECK_EQ_INT(r[i].prompt_tokens, 1012); /* from usage, not the dataset's 12 */
        CHECK(r[i].ttft >= FIRST_MS * 0.9e-3 && r[i].ttft < 5);
        CHECK_EQ_INT(r[i].n_itl, 4); /* chunks count one by one even if read together */
        double sum = 0;
        for (int k = 0; k < r[i].n_itl; k++)
            sum += r[i].itl[k];
        CHECK(sum <= r[i].e2el - r[i].ttft + 1e-9);
        CHECK(r[i].e2el >= (FIRST_MS + 4 * GAP_MS) * 0.9e-3); /* the server's sleeps */
    }
    CHECK(dur >= 4 * (FIRST_MS + 4 * GAP_MS) * 0.9e-3); /* 12 requests, 3 at a time */
    struct loadgen_summary s;
    REQUIRE(loadgen_summarize(r, d->n, dur, NULL, &s, NULL) == WELD_OK);
    CHECK_EQ_INT(s.completed, 12);
    CHECK_EQ_INT(s.total_output, 60);
    /* gaps are measured, not invented: the median of 48 ITLs sees the server's 20 ms (a
       client starved for CPU may read two chunks at once, hence not every one) */
    CHECK(s.itl.median >= GAP_MS * 0.5 && s.itl.median < 1000);
    CHECK(s.tpot.median >= GAP_MS * 0.5);
    CHECK(s.ttft.min >= FIRST_MS * 0.9);
    loadgen_results_free(r, d->n);
    loadgen_dataset_free(d);
}

TEST(poisson_pacing)
{
    reset_counters();
    struct loadgen_dataset *d = words_dataset(LOADGEN_DATASET_SHARED_PREFIX, 15, 2);
    REQUIRE(d);
    struct loadgen_config c = config("/v1/completions");
    c.request_rate = 40;
    c.seed = 3;
    double arr[15];
    REQUIRE(loadgen_arrivals(40, 1.0, 3, 15, arr, NULL) == WELD_OK);
    struct loadgen_result *r = NULL;
    double dur = 0;
    REQUIRE(loadgen_run(&c, d, &r, &dur, NULL) == WELD_OK);
    for (int i = 0; i < 15; i++) {
        CHECK(r[i].success);
        CHECK(r[i].t_send >= arr[i] - 1e-3);
        CHECK(r[i].t_send - arr[i] < 0.25);
    }
    CHECK(dur >= arr[14]);
    CHECK(arr[14] > 0.1); /* 14 gaps of mean 25 ms: really paced */
    loadgen_results_free(r, d->n);
    loadgen_dataset_free(d);
}

static void set_text(struct loadgen_prompt *p, const char *t)
{
    wfree(p->text);
    p->text = wstrdup(t);
}

TEST(failures_are_results)
{
    reset_counters();
    struct loadgen_dataset *d = words_dataset(LOADGEN_DATASET_RANDOM, 5, 3);
    REQUIRE(d);
    set_text(&d->p[0], "FAIL400 please");
    set_text(&d->p[1], "NODONE please");
    set_text(&d->p[2], "MIDERR please");
    struct loadgen_config c = config("/v1/completions");
    c.request_rate = INFINITY;
    struct loadgen_result *r = NULL;
    double dur = 0;
    REQUIRE(loadgen_run(&c, d, &r, &dur, NULL) == WELD_OK);
    const char *want[] = {"canned 400", "[DONE]", "canned failure"};
    for (int i = 0; i < 3; i++) {
        CHECK(!r[i].success);
        CHECK(r[i].error && strstr(r[i].error, want[i]));
        if (r[i].error && !strstr(r[i].error, want[i]))
            fprintf(stderr, "  request %d: %s\n", i, r[i].error);
    }
    CHECK_EQ_INT(r[0].http_status, 400);
    CHECK(r[0].error && strstr(r[0].error, "HTTP 400"));
    CHECK(r[3].success && r[4].success);
    struct loadgen_summary s;
    loadgen_summarize(r, 5, dur, NULL, &s, NULL);
    CHECK_EQ_INT(s.completed, 2);
    CHECK_EQ_INT(s.failed, 3);
    loadgen_results_free(r, d->n);
    loadgen_dataset_free(d);
}

TEST(chat_counts_chunks)
{
    reset_counters();
    struct loadgen_dataset *d = words_dataset(LOADGEN_DATASET_CHAT, 4, 4);
    REQUIRE(d);
    struct loadgen_config c = config("/v1/completions");
    struct loadgen_result *r = NULL;
    double dur = 0;
    struct weld_err e;
    CHECK(loadgen_run(&c, d, &r, &dur, &e) == WELD_ERR_INVALID_ARG); /* messages, not prompt */
    CHECK(strstr(e.msg, "chat") != NULL);
    c = config("/v1/chat/completions");
    c.max_concurrency = 2;
    REQUIRE(loadgen_run(&c, d, &r, &dur, NULL) == WELD_OK);
    CHECK_EQ_INT(atomic_load(&n_bad_body), 0);
    CHECK_EQ_INT(atomic_load(&max_in_flight), 2);
    for (int i = 0; i < 4; i++) {
        CHECK(r[i].success);
        CHECK(!r[i].got_usage);
        CHECK_EQ_INT(r[i].output_tokens, 4);
        CHECK_EQ_INT(r[i].prompt_tokens, d->p[i].prompt_len);
    }
    loadgen_results_free(r, d->n);
    loadgen_dataset_free(d);
}

TEST(api_key_and_model_discovery)
{
    reset_counters();
    required_key = "sekrit";
    char *model = NULL;
    struct weld_err e;
    CHECK_EQ_INT(loadgen_fetch_model(base_url, "sekrit", 10, &model, &e), WELD_OK);
    CHECK_EQ_STR(model, "canned-model");
    wfree(model);
    err_clear(&e);
    CHECK(loadgen_fetch_model(base_url, NULL, 10, &model, &e) != WELD_OK);
    CHECK(strstr(e.msg, "401") && strstr(e.msg, "/v1/models"));
    struct loadgen_dataset *d = words_dataset(LOADGEN_DATASET_RANDOM, 2, 2);
    REQUIRE(d);
    struct loadgen_config c = config("/v1/completions");
    c.api_key = "wrong";
    struct loadgen_result *r = NULL;
    double dur = 0;
    REQUIRE(loadgen_run(&c, d, &r, &dur, NULL) == WELD_OK);
    CHECK(!r[0].success && r[0].error && strstr(r[0].error, "HTTP 401"));
    loadgen_results_free(r, d->n);
    c.api_key = "sekrit";
    REQUIRE(loadgen_run(&c, d, &r, &dur, NULL) == WELD_OK);
    CHECK(r[0].success && r[1].success);
    loadgen_results_free(r, d->n);
    loadgen_dataset_free(d);
    required_key = NULL;
}

TEST(connection_refused)
{
    struct loadgen_dataset *d = words_dataset(LOADGEN_DATASET_RANDOM, 3, 2);
    REQUIRE(d);
    struct loadgen_config c = config("/v1/completions");
    c.base_url = "http://127.0.0.1:1";
    struct loadgen_result *r = NULL;
    double dur = 0;
    REQUIRE(loadgen_run(&c, d, &r, &dur, NULL) == WELD_OK);
    for (int i = 0; i < 3; i++) {
        CHECK(!r[i].success);
        CHECK(r[i].error && strstr(r[i].error, "onnect"));
    }
    loadgen_results_free(r, d->n);
    loadgen_dataset_free(d);
}

/* Run the weld binary; its stdout (at most cap bytes) goes to out. Returns the exit code. */
static int run_weld(const char *args, char *out, size_t cap)
{
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "'%s' bench serve --base-url %s %s 2>/dev/null",
             getenv("WELD_BIN"), base_url, args);
    FILE *f = popen(cmd, "r");
    if (!f)
        return -1;
    size_t n = fread(out, 1, cap - 1, f);
    out[n] = 0;
    int st = pclose(f);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

TEST(cli_json_and_goodput)
{
    if (!getenv("WELD_BIN") || access(getenv("WELD_BIN"), X_OK))
        SKIP("WELD_BIN not set (run through ctest)");
    static char out[1 << 20];
    char args[1024];
    snprintf(args, sizeof args, "--num-prompts 6 --max-concurrency 2 --input-len 8 "
             "--output-len 3 --goodput ttft:5000 tpot:5000 --json --save-result %s/r.json",
             test_tmpdir());
    CHECK_EQ_INT(run_weld(args, out, sizeof out), 0);
    json_t *j = json_loads(out, 0, NULL);
    REQUIRE(j);
    CHECK_EQ_INT(json_integer_value(json_object_get(j, "completed")), 6);
    CHECK_EQ_INT(json_integer_value(json_object_get(j, "good_requests")), 6);
    CHECK_EQ_STR(json_string_value(json_object_get(j, "model_id")), "canned-model");
    CHECK_EQ_INT(json_integer_value(json_object_get(j, "max_concurrency")), 2);
    CHECK_EQ_INT(json_integer_value(json_object_get(j, "total_output_tokens")), 18);
    CHECK(json_real_value(json_object_get(j, "mean_ttft_ms")) >= FIRST_MS * 0.9);
    CHECK(json_real_value(json_object_get(j, "request_goodput")) > 0);
    CHECK_EQ_INT(json_array_size(json_object_get(j, "itls")), 6);
    json_decref(j);
    char path[4200];
    snprintf(path, sizeof path, "%s/r.json", test_tmpdir());
    j = json_load_file(path, 0, NULL);
    CHECK(j && json_integer_value(json_object_get(j, "completed")) == 6);
    json_decref(j);
    /* an SLO nobody meets: TTFT under 1 ms against a 30 ms first token */
    CHECK_EQ_INT(run_weld("--model canned-model --num-prompts 2 --output-len 2 "
                          "--goodput ttft:1 --json", out, sizeof out), 0);
    j = json_loads(out, 0, NULL);
    CHECK(j && json_integer_value(json_object_get(j, "good_requests")) == 0);
    json_decref(j);
    CHECK_EQ_INT(run_weld("--request-rate fast", out, sizeof out), 2);
    CHECK_EQ_INT(run_weld("--goodput ttft:x", out, sizeof out), 2);
    CHECK_EQ_INT(run_weld("--dataset nope", out, sizeof out), 2);
    CHECK_EQ_INT(run_weld("--num-prompts 0", out, sizeof out), 2);
}

int main(void)
{
    if (!start_server()) {
        fprintf(stderr, "cannot start the canned HTTP server\n");
        return 1;
    }
    RUN(concurrency_and_timings);
    RUN(poisson_pacing);
    RUN(failures_are_results);
    RUN(chat_counts_chunks);
    RUN(api_key_and_model_discovery);
    RUN(connection_refused);
    RUN(cli_json_and_goodput);
    MHD_stop_daemon(daemon_);
    return test_summary();
}
