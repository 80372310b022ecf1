/*
 * upstream - one HTTP exchange between the router and a worker, on libcurl, driven by the
 * connection thread of the client's request (no shared event loop: a request never waits
 * on another's transfer).
 *
 * Each exchange uses a (multi, easy) pair: the easy handle is the transfer, the multi lets
 * the thread wait on it with a timeout (curl_multi_poll) and check its client between
 * waits. A pair whose exchange completed goes back to its worker's idle list (under
 * router.mu, at most IDLE_MAX per worker) with the keep-alive connection in the multi's
 * cache, so the next request to that worker skips the TCP handshake and the worker's
 * thread start; a pair whose exchange was cut (client gone, error, timeout) is destroyed
 * with its connection, which is also how the worker learns that its client left (weld
 * serve then aborts the request). A dead cached connection is retried once by curl itself.
 *
 * Bytes: the write callback appends to u->buf. Collecting (the default) keeps everything
 * up to `limit` (beyond: overflow, the exchange fails). Relaying (a stream being passed
 * on) holds at most pause_at pending bytes: past that the callback answers
 * CURL_WRITEFUNC_PAUSE (curl keeps the bytes and the worker's socket fills, so a slow
 * client slows its worker instead of growing the router), and upstream_took resumes the
 * transfer once the client took enough. Everything happens in one thread, as curl_easy_pause
 * requires.
 *
 * Headers sent: Content-Type: application/json (with a body), the client's Authorization,
 * X-Request-Id, and an empty "Expect:" (curl would otherwise wait for 100 Continue on bodies
 * over 1 KiB). HTTP/1.1, TCP_NODELAY, connect timeout --connect-timeout; the time to the
 * first byte is the caller's (proxy.c), since a stream may run for as long as it likes.
 */
#include "router/internal.h"

#include "core/alloc.h"
#include "core/progress.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#define IDLE_MAX 64
#define COLLECT_MAX ((size_t)64 << 20)

static size_t on_write(char *p, size_t size, size_t nmemb, void *ud)
{
    struct upstream *u = ud;
    size_t n = size * nmemb;
    if (!u->status)
        curl_easy_getinfo(u->uc->h, CURLINFO_RESPONSE_CODE, &u->status);
    if (u->relaying && u->len - u->off >= u->pause_at) {
        if (!u->paused) {
            pthread_mutex_lock(&u->r->mu);
            u->r->m.stream_pauses++;
            pthread_mutex_unlock(&u->r->mu);
        }
        u->paused = true;
        return CURL_WRITEFUNC_PAUSE;
    }
    if (!u->relaying && u->len + n > u->limit) {
        u->overflow = true;
        return 0; /* fails the transfer (CURLE_WRITE_ERROR) */
    }
    if (u->off && u->off == u->len)
        u->off = u->len = 0;
    if (u->len + n + 1 > u->cap) {
        size_t cap = u->cap ? u->cap : 4096;
        while (cap < u->len + n + 1)
            cap *= 2;
        char *nb = wrealloc(u->buf, cap);
        if (!nb)
            return 0;
        u->buf = nb;
        u->cap = cap;
    }
    memcpy(u->buf + u->len, p, n);
    u->len += n;
    u->buf[u->len] = 0;
    return n;
}

static struct upconn *conn_take(struct router *r, struct worker *w)
{
    pthread_mutex_lock(&r->mu);
    struct upconn *c = w->idle;
    if (c) {
        w->idle = c->next;
        w->n_idle--;
    }
    pthread_mutex_unlock(&r->mu);
    if (c) {
        curl_easy_reset(c->h);
        c->next = NULL;
        return c;
    }
    if (!(c = wcalloc(1, sizeof *c)))
        return NULL;
    c->m = curl_multi_init();
    c->h = curl_easy_init();
    if (!c->m || !c->h) {
        curl_easy_cleanup(c->h);
        if (c->m)
            curl_multi_cleanup(c->m);
        wfree(c);
        return NULL;
    }
    return c;
}

static void conn_destroy(struct upconn *c)
{
    if (!c)
        return;
    curl_easy_cleanup(c->h);
    curl_multi_cleanup(c->m);
    wfree(c);
}

static void conn_give_back(struct router *r, struct worker *w, struct upconn *c)
{
    pthread_mutex_lock(&r->mu);
    bool keep = w->listed && w->n_idle < IDLE_MAX;
    if (keep) {
        c->next = w->idle;
        w->idle = c;
        w->n_idle++;
    }
    pthread_mutex_unlock(&r->mu);
    if (!keep)
        conn_destroy(c);
}

void upstream_pool_free(struct worker *w)
{
    while (w->idle) {
        struct upconn *c = w->idle;
        w->idle = c->next;
        conn_destroy(c);
    }
    w->n_idle = 0;
}

static int add_header(struct curl_slist **l, const char *name, const char *value)
{
    char line[1024];
    snprintf(line, sizeof line, "%s: %s", name, value);
    struct curl_slist *t = curl_slist_append(*l, line);
    if (!t)
        return WELD_ERR_NOMEM;
    *l = t;
    return WELD_OK;
}

int upstream_start(struct upstream *u, struct router *r, struct worker *w, const char *method,
                   const char *path, const char *body, size_t len, const char *auth,
                   const char *request_id, struct weld_err *e)
{
    memset(u, 0, sizeof *u);
    u->r = r;
    u->w = w;
    u->limit = COLLECT_MAX;
    u->t_start = time_now();
    size_t ul = strlen(w->url) + strlen(path) + 1;
    char *url = wmalloc(ul);
    if (!url || !(u->uc = conn_take(r, w))) {
        wfree(url);
        return err_set(e, WELD_ERR_NOMEM, "out of memory");
    }
    snprintf(url, ul, "%s%s", w->url, path);
    int rc = add_header(&u->hdr, "Expect", "");
    if (!rc && body)
        rc = add_header(&u->hdr, "Content-Type", "application/json");
    if (!rc && auth)
        rc = add_header(&u->hdr, "Authorization", auth);
    if (!rc && request_id)
        rc = add_header(&u->hdr, "X-Request-Id", request_id);
    if (rc) {
        wfree(url);
        upstream_end(u);
        return err_set(e, WELD_ERR_NOMEM, "out of memory");
    }
    CURL *h = u->uc->h;
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, u->hdr);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_TCP_NODELAY, 1L);
    curl_easy_setopt(h, CURLOPT_HTTP_VERSION, (long)CURL_HTTP_VERSION_1_1);
    curl_easy_setopt(h, CURLOPT_ERRORBUFFER, u->errbuf);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS,
                     (long)fmax(1, fmin(r->o.connect_timeout * 1e3, 2e9)));
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_write);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, u);
    if (body) {
        curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)len);
        curl_easy_setopt(h, CURLOPT_COPYPOSTFIELDS, len ? body : "");
    } else if (strcmp(method, "GET")) {
        curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, method);
    }
    wfree(url); /* curl copied it */
    if (curl_multi_add_handle(u->uc->m, h) != CURLM_OK) {
        upstream_end(u);
        return err_set(e, WELD_ERR_INTERNAL, "curl_multi_add_handle failed");
    }
    return WELD_OK;
}

static void note_headers(struct upstream *u)
{
    if (!u->status)
        curl_easy_getinfo(u->uc->h, CURLINFO_RESPONSE_CODE, &u->status);
    if (!u->ctype[0]) {
        char *ct = NULL;
        if (curl_easy_getinfo(u->uc->h, CURLINFO_CONTENT_TYPE, &ct) == CURLE_OK && ct)
            snprintf(u->ctype, sizeof u->ctype, "%s", ct);
    }
}

bool upstream_step(struct upstream *u, int ms)
{
    if (u->done)
        return true;
    CURLM *m = u->uc->m;
    int running = 0;
    size_t had = u->len;
    curl_multi_perform(m, &running);
    CURLMsg *msg;
    int q;
    while ((msg = curl_multi_info_read(m, &q)))
        if (msg->msg == CURLMSG_DONE) {
            u->done = true;
            u->cc = msg->data.result;
        }
    note_headers(u);
    if (u->done || u->len > had || ms <= 0)
        return u->done;
    curl_multi_poll(m, NULL, 0, ms, NULL);
    curl_multi_perform(m, &running);
    while ((msg = curl_multi_info_read(m, &q)))
        if (msg->msg == CURLMSG_DONE) {
            u->done = true;
            u->cc = msg->data.result;
        }
    note_headers(u);
    return u->done;
}

void upstream_relay(struct upstream *u, size_t pause_at)
{
    u->relaying = true;
    u->pause_at = pause_at ? pause_at : 1;
}

void upstream_took(struct upstream *u, size_t n)
{
    u->off += n;
    if (u->off == u->len)
        u->off = u->len = 0;
    if (u->paused && u->uc && u->len - u->off < u->pause_at) {
        u->paused = false;
        /* may call on_write at once with the bytes curl held back */
        curl_easy_pause(u->uc->h, CURLPAUSE_CONT);
    }
}

bool upstream_is_sse(const struct upstream *u)
{
    return u->status == 200 && !strncmp(u->ctype, "text/event-stream", 17);
}

void upstream_end(struct upstream *u)
{
    if (u->uc) {
        bool complete = u->done && u->cc == CURLE_OK;
        curl_multi_remove_handle(u->uc->m, u->uc->h);
        if (complete && u->w)
            conn_give_back(u->r, u->w, u->uc);
        else
            conn_destroy(u->uc);
        u->uc = NULL;
    }
    curl_slist_free_all(u->hdr);
    u->hdr = NULL;
}

void upstream_clear(struct upstream *u)
{
    upstream_end(u);
    wfree(u->buf);
    u->buf = NULL;
    u->len = u->off = u->cap = 0;
}
