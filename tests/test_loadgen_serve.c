/*
 * test_loadgen_serve - `weld bench serve` against `weld serve` on stories260K: the
 * two halves of issue 4 talking to each other over loopback.
 *
 * Starts `$WELD_BIN serve stories260K.gguf --port 0` (stderr to a file in the test's
 * tmpdir, where it prints the port it bound), waits for GET /health to answer 200, then
 * runs `$WELD_BIN bench serve ... --json` a few times and checks the JSON: every request
 * succeeds, exactly output_len tokens each (ignore_eos), and with --tokenizer the same
 * GGUF the server's prompt_tokens equal the dataset's exact lengths plus the BOS token. A
 * chat run against a model without a chat template must fail every request and exit 1.
 * The tables and errors weld bench serve prints go to bench.log in the tmpdir.
 * SIGTERM stops the server at the end. Skipped (exit 77, with the reason) without WELD_BIN
 * or the model.
 */
#include "test.h"

#include "core/alloc.h"

#include <curl/curl.h>
#include <jansson.h>
#include <signal.h>
#include <stdbool.h>
#include <sys/wait.h>
#include <time.h>

static pid_t server_pid;
static char base_url[64];
static const char *model_path;

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static size_t discard(char *p, size_t s, size_t n, void *u)
{
    (void)p, (void)u;
    return s * n;
}

static long health(void)
{
    char url[128];
    snprintf(url, sizeof url, "%s/health", base_url);
    CURL *h = curl_easy_init();
    long status = 0;
    if (!h)
        return 0;
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, discard);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, 2000L);
    if (curl_easy_perform(h) == CURLE_OK)
        curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
    curl_easy_cleanup(h);
    return status;
}

/* The port from "listening on http://127.0.0.1:PORT" in the server's log; 0 if not yet. */
static int logged_port(const char *log)
{
    FILE *f = fopen(log, "r");
    char line[1024];
    int port = 0;
    while (f && !port && fgets(line, sizeof line, f)) {
        const char *p = strstr(line, "listening on http://127.0.0.1:");
        if (p)
            port = atoi(p + strlen("listening on http://127.0.0.1:"));
    }
    if (f)
        fclose(f);
    return port;
}

static bool start_server(const char *weld)
{
    char log[4200];
    snprintf(log, sizeof log, "%s/serve.log", test_tmpdir());
    server_pid = fork();
    if (server_pid == 0) {
        if (!freopen(log, "w", stderr))
            _exit(127);
        execl(weld, weld, "serve", model_path, "--port", "0", "-t", "1", (char *)NULL);
        _exit(127);
    }
    if (server_pid < 0)
        return false;
    for (int i = 0; i < 600; i++) { /* 60 s: the sanitizer build starts slowly */
        int port = logged_port(log);
        if (port > 0 && !base_url[0])
            snprintf(base_url, sizeof base_url, "http://127.0.0.1:%d", port);
        if (base_url[0] && health() == 200)
            return true;
        if (waitpid(server_pid, NULL, WNOHANG) == server_pid) {
            fprintf(stderr, "weld serve exited; its log is in %s\n", log);
            server_pid = 0;
            return false;
        }
        sleep_ms(100);
    }
    return false;
}

static void stop_server(void)
{
    if (server_pid <= 0)
        return;
    kill(server_pid, SIGTERM);
    for (int i = 0; i < 100; i++) {
        if (waitpid(server_pid, NULL, WNOHANG) == server_pid)
            return;
        sleep_ms(100);
    }
    kill(server_pid, SIGKILL);
    waitpid(server_pid, NULL, 0);
}

static json_t *bench(const char *args, int *exit_code)
{
    char cmd[4096];
    static char out[1 << 20];
    snprintf(cmd, sizeof cmd, "'%s' bench serve --base-url %s %s --json "
             "2>>%s/bench.log", getenv("WELD_BIN"), base_url, args, test_tmpdir());
    FILE *f = popen(cmd, "r");
    if (!f)
        return NULL;
    size_t n = fread(out, 1, sizeof out - 1, f);
    out[n] = 0;
    int st = pclose(f);
    *exit_code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    return json_loads(out, 0, NULL);
}

TEST(random_exact_lengths)
{
    char args[4096];
    snprintf(args, sizeof args, "--dataset random --num-prompts 8 --max-concurrency 4 "
             "--input-len 16 --output-len 8 --seed 2 --tokenizer '%s'", model_path);
    int code = -1;
    json_t *j = bench(args, &code);
    CHECK_EQ_INT(code, 0);
    REQUIRE(j);
    CHECK_EQ_INT(json_integer_value(json_object_get(j, "completed")), 8);
    CHECK_EQ_INT(json_integer_value(json_object_get(j, "failed")), 0);
    CHECK_EQ_INT(json_integer_value(json_object_get(j, "total_output_tokens")), 64);
    json_t *in = json_object_get(j, "input_lens"), *out = json_object_get(j, "output_lens");
    CHECK_EQ_INT(json_array_size(in), 8);
    for (size_t i = 0; i < json_array_size(in); i++) {
        CHECK_EQ_INT(json_integer_value(json_array_get(in, i)), 17); /* 16 + BOS */
        CHECK_EQ_INT(json_integer_value(json_array_get(out, i)), 8);
    }
    CHECK(json_real_value(json_object_get(j, "p99_ttft_ms")) > 0);
    CHECK(json_real_value(json_object_get(j, "mean_tpot_ms")) > 0);
    CHECK(json_real_value(json_object_get(j, "request_throughput")) > 0);
    json_decref(j);
}

/* --mix: each request has one class's lengths (input with BOS, output exactly), each class
   its share; the config echoes the mix; a bad mix is a usage error before any request. */
TEST(random_mix)
{
    char args[4096];
    snprintf(args, sizeof args,
             "--num-prompts 8 --max-concurrency 4 --mix 40:2,6:12:3 "
             "--seed 1 --tokenizer '%s'",
             model_path);
    int code = -1;
    json_t *j = bench(args, &code);
    CHECK_EQ_INT(code, 0);
    REQUIRE(j);
    CHECK_EQ_INT(json_integer_value(json_object_get(j, "completed")), 8);
    CHECK_EQ_STR(json_string_value(json_object_get(j, "mix")), "40:2,6:12:3");
    json_t *in = json_object_get(j, "input_lens"), *out = json_object_get(j, "output_lens");
    int n_long = 0;
    for (size_t i = 0; i < json_array_size(in); i++) {
        json_int_t il = json_integer_value(json_array_get(in, i));
        json_int_t ol = json_integer_value(json_array_get(out, i));
        CHECK((il == 41 && ol == 2) || (il == 7 && ol == 12));
        n_long += il == 41;
    }
    CHECK_EQ_INT(n_long, 2);
    CHECK_EQ_INT(json_integer_value(json_object_get(j, "total_output_tokens")), 2 * 2 + 6 * 12);
    json_decref(j);
    j = bench("--mix 40:2,6", &code);
    CHECK_EQ_INT(code, 2);
    json_decref(j);
}

TEST(shared_prefix_paced)
{
    int code = -1;
    json_t *j = bench("--dataset shared-prefix --num-prompts 8 --num-groups 2 --prefix-len 20 "
                      "--input-len 8 --output-len 4 --request-rate 50 --max-concurrency 8",
                      &code);
    CHECK_EQ_INT(code, 0);
    REQUIRE(j);
    CHECK_EQ_INT(json_integer_value(json_object_get(j, "completed")), 8);
    CHECK_EQ_INT(json_integer_value(json_object_get(j, "total_output_tokens")), 32);
    CHECK_EQ_STR(json_string_value(json_object_get(j, "model_id")), model_path);
    json_decref(j);
}

TEST(chat_without_template_fails_cleanly)
{
    int code = -1;
    json_t *j = bench("--dataset chat --num-prompts 2 --num-groups 1 --input-len 8 "
                      "--output-len 4", &code);
    CHECK_EQ_INT(code, 1); /* no request succeeded */
    json_decref(j);
}

int main(void)
{
    const char *weld = getenv("WELD_BIN");
    model_path = test_shared_path("models/stories260K.gguf");
    if (!weld || access(weld, X_OK) || !model_path) {
        return test_skip_all("needs WELD_BIN (run through ctest) and stories260K.gguf under "
                             "%s/models", test_shared_dir());
    }
    static char model_copy[4096];
    snprintf(model_copy, sizeof model_copy, "%s", model_path);
    model_path = model_copy;
    curl_global_init(CURL_GLOBAL_DEFAULT);
    if (!start_server(weld)) {
        fprintf(stderr, "weld serve did not become healthy\n");
        stop_server();
        return 1;
    }
    RUN(random_exact_lengths);
    RUN(random_mix);
    RUN(shared_prefix_paced);
    RUN(chat_without_template_fails_cleanly);
    stop_server();
    curl_global_cleanup();
    return test_summary();
}
