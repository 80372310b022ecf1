/*
 * loadgen_run - drive a benchmark over HTTP with libcurl's multi interface.
 *
 * One thread, one CURLM. The loop: start every request whose arrival time has come while
 * fewer than max_concurrency are in flight (a request that finds no free slot waits and
 * starts as soon as one frees, like vLLM's semaphore); let curl move bytes
 * (curl_multi_perform); finish completed transfers; then sleep in curl_multi_poll until
 * a socket is ready, curl's own timer fires, or the next arrival is due, whichever is
 * first. No thread per request and no busy wait.
 *
 * Per transfer (struct xfer, allocated when the request starts and freed when it ends, so
 * memory follows the requests in flight, not the dataset): the easy handle, its JSON body,
 * the stream state that parses SSE as bytes arrive (timestamped in the write callback, the moment curl hands them
 * over), and the first KiB of the body when the status is not 200 (the error text). The
 * clock of every result is seconds since t0, the moment the loop starts; a request's
 * latencies run from its own send time (after any wait for a slot), as in vLLM.
 *
 * HTTP details: HTTP/1.1, "Expect:" cleared (curl 7.x would otherwise wait up to a second
 * for "100 Continue" on bodies over 1 KiB, which lands in TTFT), TCP_NODELAY, connections
 * reused from curl's cache.
 *
 * Not done: retries, HTTP/2, TLS options (https URLs work with curl's defaults).
 */
#include "loadgen/loadgen.h"

#include "core/alloc.h"
#include "core/progress.h"

#include <curl/curl.h>
#include <math.h>
#include <string.h>

#define RAW_MAX 1024
#define MODELS_MAX ((size_t)1 << 20)

struct run;

struct xfer {
    CURL *h;
    char *body;
    struct loadgen_stream st;
    struct loadgen_result *res;
    struct run *run;
    char errbuf[CURL_ERROR_SIZE];
    char raw[RAW_MAX + 1];   /* the start of a non-200 body */
    size_t raw_len;
    long status;             /* 0 until the first body bytes */
};

struct run {
    const struct loadgen_config *c;
    const struct loadgen_dataset *d;
    struct loadgen_result *res; /* (d->n) */
    double *arrival;            /* (d->n) */
    struct xfer **x;            /* (d->n) the transfers in flight (NULL when not) */
    char *url;
    struct curl_slist *hdr;
    CURLM *m;
    double t0;
    int next, in_flight, done;
    struct progress prog;
};

char *loadgen_url(const char *base_url, const char *path)
{
    size_t bl = strlen(base_url);
    while (bl > 0 && base_url[bl - 1] == '/')
        bl--;
    while (*path == '/')
        path++;
    size_t pl = strlen(path);
    char *u = wmalloc(bl + pl + 2);
    if (!u)
        return NULL;
    memcpy(u, base_url, bl);
    u[bl] = '/';
    memcpy(u + bl + 1, path, pl + 1);
    return u;
}

static size_t on_write(char *p, size_t size, size_t nmemb, void *ud)
{
    struct xfer *x = ud;
    size_t n = size * nmemb;
    double now = time_now() - x->run->t0;
    if (x->status == 0)
        curl_easy_getinfo(x->h, CURLINFO_RESPONSE_CODE, &x->status);
    if (x->status != 200) {
        size_t k = RAW_MAX - x->raw_len < n ? RAW_MAX - x->raw_len : n;
        memcpy(x->raw + x->raw_len, p, k);
        x->raw_len += k;
        x->raw[x->raw_len] = 0;
        return n;
    }
    struct weld_err e;
    err_clear(&e);
    return loadgen_stream_feed(&x->st, p, n, now, &e) ? 0 : n; /* 0 ends the transfer */
}

static struct curl_slist *make_headers(const char *api_key)
{
    struct curl_slist *h = NULL, *t;
    const char *fixed[] = {"Content-Type: application/json", "Accept: text/event-stream",
                           "Expect:"};
    for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++) {
        if (!(t = curl_slist_append(h, fixed[i])))
            goto fail;
        h = t;
    }
    if (api_key) {
        size_t len = strlen(api_key) + 32;
        char *a = wmalloc(len);
        if (!a)
            goto fail;
        snprintf(a, len, "Authorization: Bearer %s", api_key);
        t = curl_slist_append(h, a);
        wfree(a);
        if (!t)
            goto fail;
        h = t;
    }
    return h;
fail:
    curl_slist_free_all(h);
    return NULL;
}

static void easy_common(CURL *h, const char *url, struct curl_slist *hdr, double timeout_s,
                        char *errbuf)
{
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdr);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_TCP_NODELAY, 1L);
    curl_easy_setopt(h, CURLOPT_HTTP_VERSION, (long)CURL_HTTP_VERSION_1_1);
    curl_easy_setopt(h, CURLOPT_ERRORBUFFER, errbuf);
    if (timeout_s > 0)
        curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, (long)fmin(timeout_s * 1e3, 2e9));
}

static void xfer_free(struct run *r, struct xfer *x)
{
    if (!x)
        return;
    if (x->h) {
        curl_multi_remove_handle(r->m, x->h);
        curl_easy_cleanup(x->h);
    }
    loadgen_stream_release(&x->st);
    wfree(x->body);
    wfree(x);
}

/* Start request i now; a request that cannot start is finished as failed. */
static void start_request(struct run *r, int i)
{
    struct loadgen_result *res = &r->res[i];
    struct xfer *x = wcalloc(1, sizeof *x);
    struct weld_err e;
    err_clear(&e);
    if (!x) {
        res->t_send = time_now() - r->t0;
        loadgen_result_fail(res, "out of memory starting the request");
        r->done++;
        progress_add(&r->prog, 1);
        return;
    }
    r->x[i] = x;
    x->run = r;
    x->res = res;
    res->t_send = time_now() - r->t0; /* again below, once the body is built */
    loadgen_stream_init(&x->st, res);
    bool chat = strstr(r->c->endpoint, "chat") != NULL;
    x->body = loadgen_request_body(&r->d->p[i], r->c->model, chat, &e);
    if (!x->body) {
        loadgen_result_fail(res, "%s", e.msg);
        goto failed;
    }
    if (!(x->h = curl_easy_init())) {
        loadgen_result_fail(res, "curl_easy_init failed");
        goto failed;
    }
    easy_common(x->h, r->url, r->hdr, r->c->timeout_s, x->errbuf);
    curl_easy_setopt(x->h, CURLOPT_POSTFIELDS, x->body);
    curl_easy_setopt(x->h, CURLOPT_POSTFIELDSIZE, (long)strlen(x->body));
    curl_easy_setopt(x->h, CURLOPT_WRITEFUNCTION, on_write);
    curl_easy_setopt(x->h, CURLOPT_WRITEDATA, x);
    curl_easy_setopt(x->h, CURLOPT_PRIVATE, x);
    res->t_send = time_now() - r->t0;
    if (curl_multi_add_handle(r->m, x->h) != CURLM_OK) {
        loadgen_result_fail(res, "curl_multi_add_handle failed");
        goto failed;
    }
    r->in_flight++;
    return;
failed:
    loadgen_stream_end(&x->st, time_now() - r->t0);
    curl_easy_cleanup(x->h);
    x->h = NULL;
    xfer_free(r, x);
    r->x[i] = NULL;
    r->done++;
    progress_add(&r->prog, 1);
}

static void finish_request(struct run *r, struct xfer *x, CURLcode cc)
{
    struct loadgen_result *res = x->res;
    double now = time_now() - r->t0;
    long status = 0;
    curl_easy_getinfo(x->h, CURLINFO_RESPONSE_CODE, &status);
    res->http_status = (int)status;
    if (res->failed) {
        /* the stream already explained it */
    } else if (cc != CURLE_OK) {
        loadgen_result_fail(res, "%s%s%s", curl_easy_strerror(cc), x->errbuf[0] ? ": " : "",
                            x->errbuf);
    } else if (status != 200) {
        loadgen_result_fail(res, "HTTP %ld: %s", status, x->raw_len ? x->raw : "(empty body)");
    }
    loadgen_stream_end(&x->st, now);
    r->x[res - r->res] = NULL;
    xfer_free(r, x);
    r->in_flight--;
    r->done++;
    progress_add(&r->prog, 1);
}

static bool slot_free(const struct run *r)
{
    return r->c->max_concurrency <= 0 || r->in_flight < r->c->max_concurrency;
}

/* Milliseconds to sleep in curl_multi_poll. */
static int poll_ms(struct run *r)
{
    long ms = 1000, ct = -1;
    if (r->next < r->d->n && slot_free(r)) {
        double wait = r->arrival[r->next] - (time_now() - r->t0);
        long w = wait <= 0 ? 0 : (long)ceil(wait * 1e3);
        ms = w < ms ? w : ms;
    }
    if (curl_multi_timeout(r->m, &ct) == CURLM_OK && ct >= 0 && ct < ms)
        ms = ct;
    return (int)ms;
}

static int run_loop(struct run *r, struct weld_err *e)
{
    int n = r->d->n;
    while (r->done < n) {
        double now = time_now() - r->t0;
        while (r->next < n && r->arrival[r->next] <= now && slot_free(r))
            start_request(r, r->next++);
        int running = 0;
        CURLMcode mc = curl_multi_perform(r->m, &running);
        if (mc != CURLM_OK)
            return err_set(e, WELD_ERR_IO, "curl_multi_perform: %s", curl_multi_strerror(mc));
        CURLMsg *msg;
        int q, finished = 0;
        while ((msg = curl_multi_info_read(r->m, &q))) {
            if (msg->msg != CURLMSG_DONE)
                continue;
            char *priv = NULL;
            curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, &priv);
            finish_request(r, (struct xfer *)priv, msg->data.result);
            finished++;
        }
        if (finished || r->done >= n)
            continue; /* start waiting requests at once */
        int ms = poll_ms(r);
        if (ms > 0 && (mc = curl_multi_poll(r->m, NULL, 0, ms, NULL)) != CURLM_OK)
            return err_set(e, WELD_ERR_IO, "curl_multi_poll: %s", curl_multi_strerror(mc));
    }
    return WELD_OK;
}

static int check_config(const struct loadgen_config *c, const struct loadgen_dataset *d,
                        struct weld_err *e)
{
    if (!c->base_url || !*c->base_url)
        return err_set(e, WELD_ERR_INVALID_ARG, "loadgen: no base URL");
    if (!c->endpoint || !*c->endpoint)
        return err_set(e, WELD_ERR_INVALID_ARG, "loadgen: no endpoint");
    if (d->chat && !strstr(c->endpoint, "chat"))
        return err_set(e, WELD_ERR_INVALID_ARG,
                       "loadgen: the chat dataset sends messages; endpoint '%s' takes a prompt "
                       "(use /v1/chat/completions)", c->endpoint);
    if (d->n < 1)
        return err_set(e, WELD_ERR_INVALID_ARG, "loadgen: empty dataset");
    return WELD_OK;
}

static void run_free(struct run *r)
{
    for (int i = 0; r->x && i < r->d->n; i++)
        xfer_free(r, r->x[i]);
    if (r->m)
        curl_multi_cleanup(r->m);
    curl_slist_free_all(r->hdr);
    wfree(r->x);
    wfree(r->arrival);
    wfree(r->url);
}

int loadgen_run(const struct loadgen_config *c, const struct loadgen_dataset *d,
                struct loadgen_result **results, double *duration, struct weld_err *e)
{
    *results = NULL;
    *duration = 0;
    int rc = check_config(c, d, e);
    if (rc)
        return rc;
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK)
        return err_set(e, WELD_ERR_INTERNAL, "curl_global_init failed");
    struct run r = {.c = c, .d = d};
    r.res = wcalloc((size_t)d->n, sizeof *r.res);
    r.arrival = wcalloc((size_t)d->n, sizeof *r.arrival);
    r.x = wcalloc((size_t)d->n, sizeof *r.x);
    r.url = loadgen_url(c->base_url, c->endpoint);
    r.hdr = make_headers(c->api_key);
    r.m = curl_multi_init();
    if (!r.res || !r.arrival || !r.x || !r.url || !r.hdr || !r.m) {
        rc = err_set(e, WELD_ERR_NOMEM, "loadgen: out of memory");
        goto done;
    }
    if ((rc = loadgen_arrivals(c->request_rate, c->burstiness > 0 ? c->burstiness : 1.0,
                               c->seed, d->n, r.arrival, e)))
        goto done;
    for (int i = 0; i < d->n; i++)
        r.res[i].prompt_tokens = d->p[i].prompt_len;
    r.prog.disabled = 1;
    if (c->progress)
        progress_start(&r.prog, "requests", (uint64_t)d->n);
    r.t0 = time_now();
    rc = run_loop(&r, e);
    *duration = time_now() - r.t0;
    if (c->progress)
        progress_end(&r.prog);
done:
    run_free(&r);
    if (rc)
        loadgen_results_free(r.res, d->n);
    else
        *results = r.res;
    curl_global_cleanup();
    return rc;
}

struct membuf {
    char *p;
    size_t len;
    bool overflow;
};

static size_t on_mem_write(char *p, size_t size, size_t nmemb, void *ud)
{
    struct membuf *b = ud;
    size_t n = size * nmemb;
    if (b->len + n > MODELS_MAX) {
        b->overflow = true;
        return 0;
    }
    char *np = wrealloc(b->p, b->len + n + 1);
    if (!np)
        return 0;
    memcpy(np + b->len, p, n);
    b->len += n;
    np[b->len] = 0;
    b->p = np;
    return n;
}

/* data[0].id of a /v1/models answer. */
static int models_first_id(const char *url, const struct membuf *b, char **model,
                           struct weld_err *e)
{
    json_error_t je;
    json_t *j = json_loadb(b->p ? b->p : "", b->len, 0, &je);
    json_t *data = json_object_get(j, "data");
    json_t *id = json_object_get(json_array_get(data, 0), "id");
    int rc = WELD_OK;
    if (!j)
        rc = err_set(e, WELD_ERR_FORMAT, "%s: answer is not JSON (byte %d: %s)", url,
                     je.position, je.text);
    else if (!json_is_string(id))
        rc = err_set(e, WELD_ERR_FORMAT, "%s: no data[0].id string in the answer", url);
    else if (!(*model = wstrdup(json_string_value(id))))
        rc = err_set(e, WELD_ERR_NOMEM, "out of memory");
    json_decref(j);
    return rc;
}

/* GET base_url + path into *b (200 only). */
static int fetch(const char *base_url, const char *path, const char *api_key, double timeout_s,
                 struct membuf *b, char **url_out, struct weld_err *e)
{
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK)
        return err_set(e, WELD_ERR_INTERNAL, "curl_global_init failed");
    char errbuf[CURL_ERROR_SIZE] = "";
    char *url = loadgen_url(base_url, path);
    struct curl_slist *hdr = make_headers(api_key);
    CURL *h = curl_easy_init();
    int rc = WELD_OK;
    if (!url || !hdr || !h) {
        rc = err_set(e, WELD_ERR_NOMEM, "out of memory");
        goto done;
    }
    easy_common(h, url, hdr, timeout_s > 0 ? timeout_s : 30, errbuf);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_mem_write);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, b);
    CURLcode cc = curl_easy_perform(h);
    long status = 0;
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
    if (cc != CURLE_OK)
        rc = err_set(e, WELD_ERR_IO, "%s: %s%s%s", url,
                     b->overflow ? "answer over 1 MiB" : curl_easy_strerror(cc),
                     errbuf[0] ? ": " : "", errbuf);
    else if (status != 200)
        rc = err_set(e, WELD_ERR_IO, "%s: HTTP %ld: %.200s", url, status, b->p ? b->p : "");
done:
    curl_easy_cleanup(h);
    curl_slist_free_all(hdr);
    curl_global_cleanup();
    if (url_out && !rc)
        *url_out = url;
    else
        wfree(url);
    return rc;
}

int loadgen_fetch_text(const char *base_url, const char *path, const char *api_key,
                       double timeout_s, char **text, struct weld_err *e)
{
    struct membuf b = {0};
    int rc = fetch(base_url, path, api_key, timeout_s, &b, NULL, e);
    if (rc || !b.p) {
        wfree(b.p);
        *text = NULL;
        return rc ? rc : err_set(e, WELD_ERR_IO, "%s%s: empty answer", base_url, path);
    }
    *text = b.p;
    return WELD_OK;
}

int loadgen_fetch_model(const char *base_url, const char *api_key, double timeout_s, char **model,
                        struct weld_err *e)
{
    *model = NULL;
    struct membuf b = {0};
    char *url = NULL;
    int rc = fetch(base_url, "/v1/models", api_key, timeout_s, &b, &url, e);
    if (!rc)
        rc = models_first_id(url, &b, model, e);
    wfree(b.p);
    wfree(url);
    return rc;
}
