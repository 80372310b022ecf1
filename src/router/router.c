/*
 * router - `weld router`'s daemon: routing, auth, the body limit, the access log and the
 * start/stop sequence of router_run().
 *
 * Routes: GET /health (200 while at least one worker that can serve a request is healthy
 * and the router is not draining, else 503), GET /version, GET /metrics (the router's own,
 * metrics.c), GET /v1/models (from a healthy worker), and POST /v1/completions,
 * /v1/chat/completions, /v1/embeddings, /tokenize, /detokenize (proxy.c). With API keys
 * every route but /health, /version and /metrics needs "Authorization: Bearer KEY", checked
 * as `weld serve` checks it (httpd/keys.h); the header is passed on to the workers, so they
 * may check the same keys. The daemon is httpd's: the same accept gate and limits as the
 * server. Bodies over --max-body get 413 after being read to their end.
 *
 * Access log: one line per request on stderr (log_info; --disable-log-requests), printed
 * from MHD's completion callback:
 *   weld router: request id=rtr-00c0ffee00000001 client=127.0.0.1:40112 method=POST
 *     path=/v1/completions status=200 worker=http://127.0.0.1:8001 attempts=1 stream=1
 *     ttfb_s=0.012 total_s=0.105                                        (one line)
 * status 499: no answer was sent (the client left first).
 *
 * Start: keys, the worker table and one round of health checks, the socket, then the
 * health thread; "listening on http://HOST:PORT" goes to stderr once all that is up. Stop:
 * SIGHUP re-reads the worker file; SIGINT/SIGTERM (blocked in every thread, taken with
 * sigtimedwait) make /health and new requests 503 and close the listening socket, wait up
 * to --shutdown-timeout for the forwarded requests to end, then cut the rest (their
 * workers see the connection close and abort), stop the health thread and the daemon.
 */
#include "router/internal.h"

#include "core/alloc.h"
#include "core/log.h"
#include "core/progress.h"

#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

struct router_opts router_opts_default(void)
{
    struct router_opts o;
    memset(&o, 0, sizeof o);
    o.host = "127.0.0.1";
    o.port = 8000;
    o.policy = ROUTER_POLICY_CACHE_AWARE;
    o.prefill_policy = ROUTER_POLICY_CACHE_AWARE;
    o.decode_policy = ROUTER_POLICY_LEAST_LOAD;
    o.health_interval = 2;
    o.health_timeout = 1;
    o.health_failures = 3;
    o.max_retries = 2;
    o.cache_threshold = 0.5;
    o.balance_abs = 32;
    o.balance_rel = 1.5;
    o.max_tree_size = (size_t)1 << 24;
    o.connect_timeout = 5;
    o.request_timeout = 600;
    o.shutdown_timeout = 30;
    o.max_body = 8u << 20;
    o.send_timeout = 15;
    o.max_connections = 1000;
    o.max_connections_per_client = 256;
    o.stream_buffer = 256u << 10;
    o.log_requests = true;
    return o;
}

/* ---- answers ---------------------------------------------------------------------------- */

void router_count_http(struct router *r, int status)
{
    int k = status / 100;
    pthread_mutex_lock(&r->mu);
    if (k >= 1 && k <= 5)
        r->m.http[k]++;
    pthread_mutex_unlock(&r->mu);
}

enum MHD_Result router_send(struct router *r, struct MHD_Connection *c, int status,
                            const char *ctype, const char *body, size_t len)
{
    router_count_http(r, status);
    return httpd_send(c, status, ctype, body, len);
}

enum MHD_Result router_error(struct router *r, struct MHD_Connection *c, int status,
                             const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    json_t *j = httpd_error_json(status, NULL, NULL, status == 404 ? "" : NULL, msg);
    char *t = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    static const char oom[] = "{\"error\":{\"message\":\"out of memory\",\"type\":"
                              "\"server_error\",\"param\":null,\"code\":null}}";
    enum MHD_Result rc = t ? router_send(r, c, status, "application/json", t, strlen(t))
                           : router_send(r, c, 500, "application/json", oom, sizeof oom - 1);
    free(t);
    return rc;
}

/* ---- routing ---------------------------------------------------------------------------- */

static enum MHD_Result route_metrics(struct router *r, struct MHD_Connection *c)
{
    char *txt = rmetrics_text(r);
    if (!txt)
        return router_send(r, c, 500, "text/plain", "out of memory\n", 14);
    enum MHD_Result rc = router_send(r, c, 200, "text/plain; version=0.0.4; charset=utf-8", txt,
                                     strlen(txt));
    wfree(txt);
    return rc;
}

static enum MHD_Result route(struct router *r, struct MHD_Connection *c, struct rreq *q,
                             const char *url, const char *method)
{
    bool get = !strcmp(method, "GET") || !strcmp(method, "HEAD");
    bool draining = __atomic_load_n(&r->draining, __ATOMIC_ACQUIRE);
    if (!strcmp(url, "/health") && get) {
        bool ok = !draining && workers_healthy(r, workers_serving_role(r)) > 0;
        return router_send(r, c, ok ? 200 : 503, "text/plain", "", 0);
    }
    if (!strcmp(url, "/version") && get) {
        char v[128];
        snprintf(v, sizeof v, "{\"version\":\"%s\"}", weld_version());
        return router_send(r, c, 200, "application/json", v, strlen(v));
    }
    if (!strcmp(url, "/metrics") && get)
        return route_metrics(r, c);
    if (!httpd_keys_check(&r->keys, c))
        return router_error(r, c, 401,
                            "Incorrect or missing API key: send the header "
                            "'Authorization: Bearer KEY'");
    static const struct {
        const char *url;
        enum rroute route;
    } routes[] = {{"/v1/completions", RROUTE_COMPLETIONS}, {"/v1/chat/completions", RROUTE_CHAT},
                  {"/v1/embeddings", RROUTE_EMBEDDINGS},   {"/tokenize", RROUTE_TOKENIZE},
                  {"/detokenize", RROUTE_DETOKENIZE},      {"/v1/models", RROUTE_MODELS}};
    int k = -1;
    for (int i = 0; i < (int)(sizeof routes / sizeof routes[0]); i++)
        if (!strcmp(url, routes[i].url))
            k = i;
    if (k < 0)
        return router_error(r, c, 404, "no route %s %s", method, url);
    bool want_get = routes[k].route == RROUTE_MODELS;
    if (want_get ? !get : strcmp(method, "POST"))
        return router_error(r, c, 405, "%s needs %s", url, want_get ? "GET" : "POST");
    if (draining)
        return router_error(r, c, 503,
                            "the router is shutting down; retry on another "
                            "instance");
    if (q->too_big)
        return router_error(r, c, 413,
                            "request body of %zu bytes is over the limit of %zu "
                            "bytes (--max-body)",
                            q->body_len, r->o.max_body);
    return proxy_forward(r, c, q, routes[k].route);
}

static enum MHD_Result on_access(void *cls, struct MHD_Connection *c, const char *url,
                                 const char *method, const char *version, const char *upload,
                                 size_t *upload_size, void **con_cls)
{
    struct router *r = cls;
    struct rreq *q = *con_cls;
    (void)version;
    if (!q) {
        if (!(q = wcalloc(1, sizeof *q)))
            return MHD_NO;
        q->acc.t_start = time_now();
        snprintf(q->acc.method, sizeof q->acc.method, "%s", method);
        snprintf(q->acc.path, sizeof q->acc.path, "%s", url);
        const char *rid = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "X-Request-Id");
        bool ok = rid && rid[0] && strlen(rid) < sizeof q->acc.id;
        for (const char *p = rid; ok && *p; p++)
            ok = *p > ' ' && *p < 127;
        if (ok)
            snprintf(q->acc.id, sizeof q->acc.id, "%s", rid);
        else
            snprintf(q->acc.id, sizeof q->acc.id, "rtr-%08lx%08lx", (unsigned long)r->t_seed,
                     __atomic_add_fetch(&r->next_id, 1, __ATOMIC_RELAXED));
        *con_cls = q;
        return MHD_YES;
    }
    if (*upload_size) {
        size_t n = *upload_size;
        *upload_size = 0;
        if (q->too_big || q->body_len + n > r->o.max_body) {
            q->too_big = true;
            q->body_len += n;
            return MHD_YES;
        }
        if (q->body_len + n + 1 > q->cap) {
            size_t cap = q->cap ? q->cap : 4096;
            while (cap < q->body_len + n + 1)
                cap *= 2;
            char *nb = wrealloc(q->body, cap);
            if (!nb)
                return MHD_NO;
            q->body = nb;
            q->cap = cap;
        }
        memcpy(q->body + q->body_len, upload, n);
        q->body_len += n;
        q->body[q->body_len] = 0;
        return MHD_YES;
    }
    return route(r, c, q, url, method);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    struct router *r = cls;
    struct rreq *q = *con_cls;
    (void)toe;
    *con_cls = NULL;
    if (!q)
        return;
    const union MHD_ConnectionInfo *st = MHD_get_connection_info(c,
                                                                 MHD_CONNECTION_INFO_HTTP_STATUS);
    unsigned status = st ? st->http_status : 0;
    struct raccess *a = &q->acc;
    double total = time_now() - a->t_start;
    if (a->attempts) {
        pthread_mutex_lock(&r->mu);
        prom_hist_observe(&r->m.latency, total);
        pthread_mutex_unlock(&r->mu);
    }
    if (r->o.log_requests) {
        char addr[80], ttfb[32] = "-";
        httpd_client_addr(c, addr, sizeof addr);
        if (a->t_first > 0)
            snprintf(ttfb, sizeof ttfb, "%.3f", a->t_first - a->t_start);
        log_info("request id=%s client=%s method=%s path=%s status=%u worker=%s attempts=%d "
                 "stream=%d ttfb_s=%s total_s=%.3f",
                 a->attempts ? a->id : "-", addr, a->method, a->path, status ? status : 499,
                 a->worker[0] ? a->worker : "-", a->attempts, a->stream, ttfb, total);
    }
    wfree(q->body);
    wfree(q);
}

/* ---- start and stop --------------------------------------------------------------------- */

static int check_opts(const struct router_opts *o, struct weld_err *e)
{
    if (!(o->health_interval > 0) || !(o->health_timeout > 0) || o->health_failures < 1)
        return err_set(e, WELD_ERR_INVALID_ARG,
                       "--health-check-interval and "
                       "--health-check-timeout must be > 0, --health-failure-threshold >= 1");
    if (o->max_retries < 0 || !(o->cache_threshold >= 0 && o->cache_threshold <= 1) ||
        !(o->balance_abs >= 0) || !(o->balance_rel >= 1))
        return err_set(e, WELD_ERR_INVALID_ARG,
                       "--max-retries must be >= 0, "
                       "--cache-threshold in [0, 1], --balance-abs-threshold >= 0 and "
                       "--balance-rel-threshold >= 1");
    if (!(o->connect_timeout > 0) || !(o->request_timeout >= 0) || !(o->shutdown_timeout >= 0))
        return err_set(e, WELD_ERR_INVALID_ARG,
                       "--connect-timeout must be > 0, "
                       "--request-timeout and --shutdown-timeout >= 0");
    if (!o->pd && (o->n_prefill || o->n_decode))
        return err_set(e, WELD_ERR_INVALID_ARG,
                       "--prefill and --decode need --pd (P/D mode); "
                       "plain workers are --worker URL");
    if (o->pd && o->n_workers)
        return err_set(e, WELD_ERR_INVALID_ARG,
                       "--pd takes --prefill URL and --decode URL, "
                       "not --worker");
    return WELD_OK;
}

/* Wait for the signals; SIGHUP reloads, SIGINT/SIGTERM return. */
static void wait_signals(struct router *r, const sigset_t *set)
{
    for (;;) {
        struct timespec ts = {0, 200 * 1000000L};
        int sig = sigtimedwait(set, NULL, &ts);
        if (sig == SIGHUP) {
            workers_reload(r);
        } else if (sig == SIGINT || sig == SIGTERM) {
            log_info("%s: draining (up to %.0f s), then stopping",
                     sig == SIGINT ? "SIGINT" : "SIGTERM", r->o.shutdown_timeout);
            return;
        }
    }
}

static bool wait_open(struct router *r, double timeout)
{
    double t_end = time_now() + timeout;
    while (__atomic_load_n(&r->n_open, __ATOMIC_ACQUIRE) > 0) {
        if (time_now() >= t_end)
            return false;
        struct timespec ts = {0, 20 * 1000000L};
        nanosleep(&ts, NULL);
    }
    return true;
}

int router_run(const struct router_opts *o, struct weld_err *e)
{
    int rc = check_opts(o, e);
    if (rc)
        return rc;
    struct router r;
    memset(&r, 0, sizeof r);
    r.o = *o;
    r.pp = (struct policy_params){o->cache_threshold, o->balance_abs, o->balance_rel};
    r.t_seed = (unsigned long)time(NULL);
    rmetrics_init(&r.m);
    pthread_mutex_init(&r.mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&r.health_cv, &ca);
    pthread_condattr_destroy(&ca);
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGHUP);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK)
        return err_set(e, WELD_ERR_INTERNAL, "curl_global_init failed");
    rc = httpd_keys_load(&r.keys, o->api_keys, o->n_api_keys, o->api_key_file, e);
    if (!rc && !(r.tree = rtree_create()))
        rc = err_set(e, WELD_ERR_NOMEM, "out of memory");
    if (!rc)
        rc = workers_init(&r, e);
    struct httpd_opts ho = {.host = o->host,
                            .port = o->port,
                            .send_timeout = o->send_timeout,
                            .max_connections = o->max_connections,
                            .max_connections_per_client = o->max_connections_per_client,
                            .access = on_access,
                            .completed = on_completed,
                            .cls = &r};
    if (!rc)
        rc = httpd_start(&r.http, &ho, e);
    if (!rc)
        rc = workers_health_start(&r, e);
    if (!rc) {
        fprintf(stderr, "weld router: listening on http://%s:%d\n", o->host, r.http->port);
        fflush(stderr);
        log_info("%d workers, %d healthy; policy %s%s%s", r.n_w,
                 workers_healthy(&r, WORKER_ANY) + workers_healthy(&r, WORKER_PREFILL) +
                     workers_healthy(&r, WORKER_DECODE),
                 policy_name(o->pd ? o->decode_policy : o->policy),
                 o->pd ? " (decode), prefill " : "", o->pd ? policy_name(o->prefill_policy) : "");
        wait_signals(&r, &set);
        __atomic_store_n(&r.draining, true, __ATOMIC_RELEASE);
        httpd_stop_accepting(r.http);
        if (!wait_open(&r, o->shutdown_timeout)) {
            log_warn("grace period over; cutting the %d requests still running",
                     __atomic_load_n(&r.n_open, __ATOMIC_ACQUIRE));
            __atomic_store_n(&r.stopping, true, __ATOMIC_RELEASE);
            wait_open(&r, 5.0);
        }
    }
    __atomic_store_n(&r.stopping, true, __ATOMIC_RELEASE);
    workers_health_stop(&r);
    httpd_free(r.http);
    workers_free(&r);
    rtree_free(r.tree);
    httpd_keys_free(&r.keys);
    curl_global_cleanup();
    pthread_cond_destroy(&r.health_cv);
    pthread_mutex_destroy(&r.mu);
    return rc;
}
