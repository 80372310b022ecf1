/*
 * http - libmicrohttpd glue for `weld serve`: routing, auth, the body limit, plain JSON
 * answers and the start/stop sequence of server_run().
 *
 * The daemon, its accept gate and the API keys are httpd/'s (shared with `weld router`):
 * MHD runs one thread per connection and has no listening socket; the gate accepts, refuses
 * garbage, silent clients, a client over its connection limit and, past the reserve, all
 * but the cheap GETs, and hands the rest over. MHD's connection timeout is the send
 * timeout (a client silent that long while sending, idle or not reading is closed); a
 * running request does not count: MHD_queue_response restarts the timer after a long
 * handler, and the stream callback calls http_touch before each piece. Generation requests
 * beyond max_connections minus the reserve get 503 here too. The access handler
 * collects the body (at most max_body bytes are kept; a longer body is read to its end and
 * answered 413), then routes. Generation (routes.c) blocks the connection's own thread
 * while the engine works, never the engine. A request that fails before it reaches the
 * engine gets OpenAI's error object.
 *
 * Routes: GET /health (200 when the model is loaded and the server is not draining, 503
 * otherwise), GET /version, GET /metrics, GET /v1/models, POST /v1/completions,
 * POST /v1/chat/completions, POST /v1/embeddings (embeddings.c), POST /tokenize,
 * POST /detokenize. With API keys (--api-key, --api-key-file) every route but /health,
 * /version and /metrics needs "Authorization: Bearer KEY", scheme in any case, compared in
 * constant time with every key (401 otherwise); no message or log line ever holds a key.
 *
 * Start: the keys and the chat template file (if any) are read, the socket bound (port 0:
 * any free port), then the engine thread loads the model (/health 503 meanwhile);
 * "listening on" with the bound port is printed once it is loaded, so a model that fails to
 * load ends the process (exit 1) without ever having announced a server. Stop: SIGINT or
 * SIGTERM (blocked in every thread, taken with sigtimedwait by the caller of server_run)
 * closes the engine to new work (503), waits up to shutdown_timeout for running requests,
 * aborts the rest, waits (up to 5 s) until their last bytes (streams: the "abort" chunk and
 * [DONE]) left, stops the gate, then the daemon (joining every connection thread), and frees
 * the engine. The completion callback prints each request's access-log line (access.c).
 */
#include "server/http.h"

#include "core/alloc.h"
#include "core/log.h"
#include "core/progress.h"
#include "model/model.h"
#include "template/chat_template.h"
#include "tokenizer/tokenizer.h"

#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

struct server_opts server_opts_default(void)
{
    struct server_opts o;
    memset(&o, 0, sizeof o);
    o.engine = engine_params_default();
    o.host = "127.0.0.1";
    o.port = 8000;
    o.shutdown_timeout = 30;
    o.max_body = 8u << 20;
    o.send_timeout = 15;
    o.max_connections = 1000;
    o.max_connections_per_client = 256;
    o.stream_buffer = 1u << 20;
    o.stream_stall_timeout = 60;
    o.log_requests = true;
    return o;
}

/* ---- answers ---------------------------------------------------------------------------- */

enum MHD_Result http_send(struct server *s, struct MHD_Connection *c, int status,
                          const char *ctype, const char *body, size_t len)
{
    enum MHD_Result rc = httpd_send(c, status, ctype, body, len);
    server_gen_count_http(s->gen, status);
    return rc;
}

enum MHD_Result http_send_json(struct server *s, struct MHD_Connection *c, int status, json_t *j)
{
    char *txt = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    static const char oom[] = "{\"error\":{\"message\":\"out of memory\",\"type\":"
                              "\"server_error\",\"param\":null,\"code\":null}}";
    if (!txt)
        return http_send(s, c, 500, "application/json", oom, sizeof oom - 1);
    enum MHD_Result rc = http_send(s, c, status, "application/json", txt, strlen(txt));
    free(txt);
    return rc;
}

enum MHD_Result http_send_error(struct server *s, struct MHD_Connection *c,
                                const struct server_error *e)
{
    return http_send_json(s, c, e->http, server_error_json(e));
}

void http_touch(struct server *s, struct MHD_Connection *c)
{
    httpd_touch(c, s->http->timeout_s);
}

/* ---- the served model (built once the engine is ready) ---------------------------------- */

bool http_model(struct server *s, struct server_model *m)
{
    pthread_mutex_lock(&s->mu);
    if (!s->have_model) {
        const struct engine *eng = server_gen_engine(s->gen);
        if (eng) {
            const struct tokenizer *tok = engine_tokenizer(eng);
            s->model.name = s->name;
            s->model.path = s->o.engine.model_path;
            s->model.tok = tok;
            s->model.n_vocab = engine_model(eng)->cfg.n_vocab;
            s->model.dim = engine_model(eng)->cfg.dim;
            s->model.max_model_len = engine_sched_config(eng)->max_model_len;
            s->model.tool_parser = s->o.tool_parser;
            s->model.kv_role = (int)s->o.kv_role;
            s->model.auto_tool_choice = s->o.auto_tool_choice;
            s->model.schema_opts = s->o.schema_opts;
            const char *src = tok ? tokenizer_chat_template(tok) : NULL;
            struct weld_err we = {0};
            if (!s->tmpl && src && chat_template_parse(&s->tmpl, src, strlen(src), &we))
                log_warn("weld serve: the model's chat template does not parse (%s); chat "
                         "requests will be refused", we.msg);
            s->model.tmpl = s->tmpl;
            s->have_model = true;
        }
    }
    *m = s->model;
    bool ok = s->have_model;
    pthread_mutex_unlock(&s->mu);
    return ok;
}

/* ---- small routes ----------------------------------------------------------------------- */

static enum MHD_Result route_models(struct server *s, struct MHD_Connection *c)
{
    struct server_model m;
    bool ready = http_model(s, &m);
    json_t *card = json_pack("{s:s, s:s, s:I, s:s, s:s, s:n}", "id", s->name, "object", "model",
                             "created", (json_int_t)s->t_start, "owned_by", "weld", "root",
                             s->o.engine.model_path, "parent");
    if (ready)
        json_object_set_new(card, "max_model_len", json_integer(m.max_model_len));
    return http_send_json(s, c, 200, json_pack("{s:s, s:[o]}", "object", "list", "data", card));
}

static enum MHD_Result route_metrics(struct server *s, struct MHD_Connection *c)
{
    struct server_metrics m;
    server_gen_metrics(s->gen, &m);
    char *txt = server_metrics_text(&m, s->name);
    if (!txt)
        return http_send(s, c, 500, "text/plain", "out of memory\n", 14);
    enum MHD_Result rc = http_send(s, c, 200, "text/plain; version=0.0.4; charset=utf-8", txt,
                                   strlen(txt));
    wfree(txt);
    return rc;
}

static enum MHD_Result route(struct server *s, struct MHD_Connection *c, struct http_conn *hc,
                             const char *url, const char *method)
{
    struct server_error e;
    bool get = !strcmp(method, "GET") || !strcmp(method, "HEAD");
    bool post = !strcmp(method, "POST");
    if (!strcmp(url, "/health") && get) {
        bool ok = server_gen_state(s->gen, NULL, 0) == SERVER_GEN_READY && !__atomic_load_n(&s->draining, __ATOMIC_ACQUIRE);
        return http_send(s, c, ok ? 200 : 503, "text/plain", "", 0);
    }
    if (!strcmp(url, "/version") && get)
        return http_send_json(s, c, 200, json_pack("{s:s}", "version", weld_version()));
    if (!strcmp(url, "/metrics") && get)
        return route_metrics(s, c);
    if (!httpd_keys_check(&s->keys, c)) {
        server_error_set(&e, 401, NULL, "Incorrect or missing API key: send the header "
                         "'Authorization: Bearer KEY'");
        return http_send_error(s, c, &e);
    }
    if (!strcmp(url, "/v1/models") && get)
        return route_models(s, c);
    enum http_post which;
    if (!strcmp(url, "/v1/completions"))
        which = HTTP_POST_COMPLETIONS;
    else if (!strcmp(url, "/v1/chat/completions"))
        which = HTTP_POST_CHAT;
    else if (!strcmp(url, "/tokenize"))
        which = HTTP_POST_TOKENIZE;
    else if (!strcmp(url, "/detokenize"))
        which = HTTP_POST_DETOKENIZE;
    else if (!strcmp(url, "/v1/embeddings"))
        which = HTTP_POST_EMBEDDINGS;
    else {
        server_error_set(&e, 404, NULL, "no route %s %s", method, url);
        e.code = NULL;
        return http_send_error(s, c, &e);
    }
    if (!post) {
        server_error_set(&e, 405, NULL, "%s needs POST", url);
        return http_send_error(s, c, &e);
    }
    if ((which == HTTP_POST_COMPLETIONS || which == HTTP_POST_CHAT) && !hc->gen) {
        /* the connections above max_gens stay free for /health, /metrics and the rest */
        if (__atomic_add_fetch(&s->gens, 1, __ATOMIC_ACQ_REL) > s->max_gens) {
            __atomic_sub_fetch(&s->gens, 1, __ATOMIC_ACQ_REL);
            server_error_set(&e, 503, NULL, "%d generation requests are already running, the "
                             "most this server takes at once; retry later", s->max_gens);
            return http_send_error(s, c, &e);
        }
        hc->gen = true;
    }
    if (hc->too_big) {
        server_error_set(&e, 413, NULL, "request body of %zu bytes is over the limit of %zu "
                         "bytes", hc->body_len, s->o.max_body);
        return http_send_error(s, c, &e);
    }
    json_error_t je;
    json_t *body = json_loadb(hc->body ? hc->body : "", hc->body_len, JSON_REJECT_DUPLICATES, &je);
    if (!body) {
        server_error_set(&e, 400, NULL, "malformed JSON body: line %d, column %d: %s", je.line,
                         je.column, je.text);
        return http_send_error(s, c, &e);
    }
    enum MHD_Result rc = http_post(s, c, which, body, &hc->acc);
    json_decref(body);
    return rc;
}

static enum MHD_Result on_access(void *cls, struct MHD_Connection *c, const char *url,
                                 const char *method, const char *version, const char *upload,
                                 size_t *upload_size, void **con_cls)
{
    struct server *s = cls;
    struct http_conn *hc = *con_cls;
    (void)version;
    if (!hc) {
        if (!(hc = wcalloc(1, sizeof *hc)))
            return MHD_NO;
        hc->acc.t_start = time_now();
        snprintf(hc->acc.method, sizeof hc->acc.method, "%s", method);
        snprintf(hc->acc.path, sizeof hc->acc.path, "%s", url);
        *con_cls = hc;
        return MHD_YES;
    }
    if (*upload_size) {
        size_t n = *upload_size;
        *upload_size = 0;
        if (hc->too_big || hc->body_len + n > s->o.max_body) {
            hc->too_big = true;
            hc->body_len += n;
            return MHD_YES;
        }
        if (hc->body_len + n + 1 > hc->cap) {
            size_t cap = hc->cap ? hc->cap : 4096;
            while (cap < hc->body_len + n + 1)
                cap *= 2;
            char *nb = wrealloc(hc->body, cap);
            if (!nb)
                return MHD_NO;
            hc->body = nb;
            hc->cap = cap;
        }
        memcpy(hc->body + hc->body_len, upload, n);
        hc->body_len += n;
        return MHD_YES;
    }
    return route(s, c, hc, url, method);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    struct server *s = cls;
    struct http_conn *hc = *con_cls;
    (void)c, (void)toe;
    if (hc && hc->gen)
        __atomic_sub_fetch(&s->gens, 1, __ATOMIC_ACQ_REL);
    if (hc) {
        const union MHD_ConnectionInfo *st =
            MHD_get_connection_info(c, MHD_CONNECTION_INFO_HTTP_STATUS);
        http_access_log(cls, c, &hc->acc, st ? st->http_status : 0);
        wfree(hc->acc.prompt);
        wfree(hc->body);
        wfree(hc);
    }
    *con_cls = NULL;
}

/* ---- start and stop --------------------------------------------------------------------- */

/* --chat-template: a file, or a builtin name (chat_template_load). */
static int read_template(struct server *s, struct weld_err *e)
{
    if (!s->o.chat_template)
        return WELD_OK;
    char *src = NULL;
    int rc = chat_template_load(s->o.chat_template, &src, e);
    if (!rc && (rc = chat_template_parse(&s->tmpl, src, strlen(src), e)))
        err_prefix(e, "%s", s->o.chat_template);
    wfree(src);
    return rc;
}

/* The gate's refusals count in /metrics like every other answer. */
static void gate_answered(void *cls, int status)
{
    struct server *s = cls;
    server_gen_count_http(s->gen, status);
}

static int start_daemon(struct server *s, struct weld_err *e)
{
    struct httpd_opts ho = {.host = s->o.host,
                            .port = s->o.port,
                            .send_timeout = s->o.send_timeout,
                            .max_connections = s->o.max_connections,
                            .max_connections_per_client = s->o.max_connections_per_client,
                            .access = on_access,
                            .completed = on_completed,
                            .cls = s,
                            .answered = gate_answered};
    int rc = httpd_start(&s->http, &ho, e);
    if (!rc)
        s->max_gens = s->o.max_connections - s->http->reserve;
    return rc;
}

/* Wait for SIGINT/SIGTERM (or a failed model load). */
static int wait_signal(struct server *s, const sigset_t *set, struct weld_err *e)
{
    bool announced = false;
    for (;;) {
        struct timespec ts = {0, 200 * 1000000L};
        int sig = sigtimedwait(set, NULL, &ts);
        if (sig == SIGINT || sig == SIGTERM) {
            log_info("weld serve: %s: draining (up to %.0f s), then stopping",
                     sig == SIGINT ? "SIGINT" : "SIGTERM", s->o.shutdown_timeout);
            return WELD_OK;
        }
        char msg[1024];
        enum server_gen_state st = server_gen_state(s->gen, msg, sizeof msg);
        if (st == SERVER_GEN_FAILED)
            return err_set(e, WELD_ERR_FORMAT, "loading the model failed: %s", msg);
        if (st == SERVER_GEN_BROKEN)
            return err_set(e, WELD_ERR_IO, "the engine lost its backend (%s): stopping", msg);
        if (st == SERVER_GEN_READY && !announced) {
            /* only now: a model that fails to load never shows a "listening" line */
            fprintf(stderr, "weld serve: listening on http://%s:%d\n", s->o.host, s->http->port);
            fflush(stderr);
            struct server_model m;
            http_model(s, &m);
            log_info("weld serve: model '%s' ready (max_model_len %d%s)", s->name,
                     m.max_model_len, m.tmpl ? ", chat template" : ", no chat template");
            announced = true;
        }
    }
}

int server_run(const struct server_opts *o, struct weld_err *e)
{
    struct server s;
    memset(&s, 0, sizeof s);
    s.o = *o;
    s.name = o->served_model_name ? o->served_model_name : o->engine.model_path;
    s.t_start = (long)time(NULL);
    pthread_mutex_init(&s.mu, NULL);
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);
    int rc = httpd_keys_load(&s.keys, o->api_keys, o->n_api_keys, o->api_key_file, e);
    if (!rc)
        rc = read_template(&s, e);
    if (!rc && (rc = server_gen_start(&s.gen, &o->engine, e)) == WELD_OK)
        server_gen_set_stream_limits(s.gen, o->stream_buffer, o->stream_stall_timeout);
    if (!rc && (rc = start_daemon(&s, e)) == WELD_OK) {
        server_gen_load(s.gen);
        rc = wait_signal(&s, &set, e);
        __atomic_store_n(&s.draining, true, __ATOMIC_RELEASE);
        server_gen_close(s.gen);
        if (!server_gen_drain(s.gen, o->shutdown_timeout))
            log_warn("weld serve: grace period over; aborting the requests still running");
    }
    server_gen_halt(s.gen);
    if (s.http)
        http_wait_generations(&s, 5.0);
    httpd_free(s.http);
    server_gen_free(s.gen);
    httpd_keys_free(&s.keys);
    chat_template_free(s.tmpl);
    pthread_mutex_destroy(&s.mu);
    return rc;
}
