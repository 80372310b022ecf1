/*
 * proxy - one client request forwarded to the fleet: choose a worker, send, retry, relay.
 *
 * Commit point: nothing reaches the client until the router knows which answer it passes
 * on: a whole answer (any status but 503; collected first) or a stream (200,
 * text/event-stream, first bytes in hand). Before it, a failure is retried on a worker not
 * yet tried, --max-retries times: no answer (refused, reset, empty or cut: the worker is
 * also taken out), no first byte within --request-timeout, or 503 (draining or full). So a
 * killed worker loses no non-streamed request, and a stream is retried only while its
 * client has seen nothing. Worker statuses and bodies pass through unchanged (a 503 too,
 * when every worker said so); the router's own errors are OpenAI's shape, 502/503/504,
 * naming the worker.
 *
 * A stream is relayed as curl delivers it: MHD's callback body reads the upstream buffer
 * and, when it is empty, lets curl work in 50 ms slices, checking between them whether the
 * client left. A client that stops reading stops the callbacks, so nothing drives curl,
 * and past --stream-buffer-size pending bytes the transfer pauses (upstream.c). A worker
 * failing mid-stream ends it with an error event (data: {"error": ...}); a client leaving
 * closes the worker's connection, which aborts the request there.
 *
 * The body goes to the worker byte for byte unless the router needs its text (cache_aware:
 * the prompt, the chat messages' roles and contents, the embedding input) or rewrites it
 * (P/D); only then is malformed JSON the router's 400.
 *
 * P/D (docs/DESIGN.md has the protocol): completions and chat go first to a prefill worker
 * as a copy with max_tokens 1, stream false, n 1, no max_completion_tokens or
 * stream_options, and kv_transfer_params {"do_remote_decode": true}; the client's body plus
 * the kv_transfer_params of that answer then goes to a decode worker, whose answer is the
 * client's. A prefill that fails or lacks them: the body goes to decode unchanged
 * (pd_fallbacks_total).
 */
#include "router/internal.h"

#include "core/alloc.h"
#include "core/log.h"
#include "core/progress.h"
#include "core/strbuf.h"

#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

#define MAX_TRIES 16

struct fwd {
    struct router *r;
    struct MHD_Connection *c;
    struct raccess *acc; /* until MHD's completion callback: never in fwd_free */
    const char *path;    /* on the worker */
    const char *method;
    const char *auth; /* the client's Authorization header (NULL: none) */
    const char *body; /* what the workers get: the client's or owned */
    size_t body_len;
    char *owned;
    char *text; /* cache_aware's key (NULL: none) */
    size_t text_len;
    enum worker_role role;
    enum router_policy pol;
    struct worker *tried[MAX_TRIES];
    int n_tried;
    struct worker *w; /* the attempt under way (a reference) */
    struct upstream u;
    double t_check;
    bool tail_sent; /* stream: the error event after a failure was queued */
    bool upstream_live;
};

static void fwd_free(struct fwd *f)
{
    if (!f)
        return;
    upstream_clear(&f->u);
    if (f->w)
        workers_done(f->r, f->w, ATTEMPT_ABORTED, NULL);
    wfree(f->owned);
    wfree(f->text);
    __atomic_sub_fetch(&f->r->n_open, 1, __ATOMIC_ACQ_REL);
    wfree(f);
}

static bool gone_check(struct fwd *f)
{
    double now = time_now();
    if (now - f->t_check < 0.05)
        return false;
    f->t_check = now;
    return httpd_client_gone(f->c);
}

static void count(struct router *r, uint64_t *field)
{
    pthread_mutex_lock(&r->mu);
    (*field)++;
    pthread_mutex_unlock(&r->mu);
}

/* ---- the text of a request (cache_aware's key) ------------------------------------------ */

static void put_value(struct strbuf *b, const json_t *v)
{
    if (json_is_string(v)) {
        strbuf_put(b, json_string_value(v), json_string_length(v));
    } else if (v) {
        char *t = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
        if (t)
            strbuf_put(b, t, strlen(t));
        free(t);
    }
}

/* "role: content\n" per message; content parts contribute their "text". */
static void put_messages(struct strbuf *b, const json_t *msgs)
{
    size_t i;
    const json_t *m;
    json_array_foreach(msgs, i, m)
    {
        put_value(b, json_object_get(m, "role"));
        strbuf_put(b, ": ", 2);
        const json_t *ct = json_object_get(m, "content");
        if (json_is_array(ct)) {
            size_t j;
            const json_t *part;
            json_array_foreach(ct, j, part) put_value(b, json_object_get(part, "text"));
        } else if (!json_is_null(ct)) {
            put_value(b, ct);
        }
        strbuf_put(b, "\n", 1);
    }
}

/* A prompt or input: a string; a list's elements one a line (token ids as JSON text). */
static void put_prompt(struct strbuf *b, const json_t *p)
{
    if (json_is_array(p) && json_array_size(p) && !json_is_integer(json_array_get(p, 0))) {
        size_t i;
        const json_t *x;
        json_array_foreach(p, i, x)
        {
            put_value(b, x);
            strbuf_put(b, "\n", 1);
        }
    } else {
        put_value(b, p);
    }
}

static void request_text(struct fwd *f, enum rroute route, const json_t *body)
{
    struct strbuf b = {0};
    if (route == RROUTE_CHAT && json_is_array(json_object_get(body, "messages")))
        put_messages(&b, json_object_get(body, "messages"));
    else if (route == RROUTE_COMPLETIONS)
        put_prompt(&b, json_object_get(body, "prompt"));
    else if (route == RROUTE_EMBEDDINGS)
        put_prompt(&b, json_object_get(body, "input"));
    if (b.oom || !b.n) {
        wfree(b.p);
        return;
    }
    f->text = b.p;
    f->text_len = b.n;
}

/* ---- one attempt ------------------------------------------------------------------------ */

enum att { ATT_STREAM, ATT_WHOLE, ATT_RETRY, ATT_GONE };

/* Why an exchange failed, for the client's message; *down: the worker cannot be reached. */
static int failure(const struct upstream *u, const struct worker *w, char *msg, size_t cap,
                   bool *down)
{
    *down = false;
    const char *detail = u->errbuf[0] ? u->errbuf : curl_easy_strerror(u->cc);
    switch (u->cc) {
    case CURLE_COULDNT_CONNECT:
    case CURLE_COULDNT_RESOLVE_HOST:
        *down = true;
        snprintf(msg, cap, "worker %s refused the connection (%s): check that it runs", w->url,
                 detail);
        return 502;
    case CURLE_OPERATION_TIMEDOUT:
        snprintf(msg, cap,
                 "worker %s did not answer in time (%s); retry, or raise "
                 "--request-timeout / --connect-timeout",
                 w->url, detail);
        return 504;
    case CURLE_WRITE_ERROR:
        if (u->overflow) {
            snprintf(msg, cap,
                     "worker %s answered more than the router holds for one "
                     "non-streamed answer (64 MiB); ask with \"stream\": true",
                     w->url);
            return 502;
        }
        break;
    default: break;
    }
    *down = u->cc == CURLE_RECV_ERROR || u->cc == CURLE_SEND_ERROR || u->cc == CURLE_GOT_NOTHING ||
            u->cc == CURLE_PARTIAL_FILE;
    snprintf(msg, cap, "worker %s failed before answering (%s); retry later", w->url, detail);
    return 502;
}

/* Send the request to w and wait for the commit point (see the file comment). On
   ATT_RETRY, msg/status say why (for the client if no other worker answers). */
static enum att attempt(struct fwd *f, struct worker *w, char *msg, size_t cap, int *status,
                        enum attempt_end *how)
{
    struct router *r = f->r;
    struct weld_err e = {0};
    *how = ATTEMPT_FAILED;
    if (upstream_start(&f->u, r, w, f->method, f->path, f->body, f->body_len, f->auth, f->acc->id,
                       &e)) {
        snprintf(msg, cap, "cannot send to worker %s: %s", w->url, e.msg);
        *status = 502;
        return ATT_RETRY;
    }
    f->upstream_live = true;
    for (;;) {
        bool done = upstream_step(&f->u, 50);
        if (!done && upstream_is_sse(&f->u) && f->u.len > f->u.off)
            return ATT_STREAM;
        if (done)
            break;
        if (gone_check(f))
            return ATT_GONE;
        double waited = time_now() - f->u.t_start;
        if (r->o.request_timeout > 0 && waited > r->o.request_timeout) {
            snprintf(msg, cap,
                     "worker %s sent no answer within --request-timeout %.0f s; "
                     "retry, or raise --request-timeout",
                     w->url, r->o.request_timeout);
            *status = 504;
            return ATT_RETRY;
        }
        if (__atomic_load_n(&r->stopping, __ATOMIC_ACQUIRE)) {
            snprintf(msg, cap,
                     "the router is shutting down: the request was cut before "
                     "worker %s answered; retry on another router",
                     w->url);
            *status = 503;
            return ATT_RETRY;
        }
    }
    if (f->u.cc == CURLE_OK) {
        if (f->u.status == 503) {
            *status = 503;
            snprintf(msg, cap, "worker %s answered 503", w->url);
            return ATT_RETRY;
        }
        *how = ATTEMPT_OK;
        return upstream_is_sse(&f->u) ? ATT_STREAM : ATT_WHOLE;
    }
    bool down;
    *status = failure(&f->u, w, msg, cap, &down);
    *how = down ? ATTEMPT_DOWN : ATTEMPT_FAILED;
    return ATT_RETRY;
}

/* ---- answers ---------------------------------------------------------------------------- */

static ssize_t relay_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    struct fwd *f = cls;
    struct upstream *u = &f->u;
    (void)pos;
    for (;;) {
        if (u->off < u->len) {
            size_t n = u->len - u->off < max ? u->len - u->off : max;
            memcpy(buf, u->buf + u->off, n);
            upstream_took(u, n);
            httpd_touch(f->c, f->r->http->timeout_s);
            return (ssize_t)n;
        }
        if (u->done) {
            if (u->cc == CURLE_OK || f->tail_sent)
                return MHD_CONTENT_READER_END_OF_STREAM;
            /* the worker failed mid-stream: say so in the stream, then end it */
            char msg[512];
            bool down;
            failure(u, f->w, msg, sizeof msg, &down);
            json_t *j = httpd_error_json(502, NULL, NULL, NULL, msg);
            char *t = j ? json_dumps(j, JSON_COMPACT) : NULL;
            json_decref(j);
            log_warn("request %s: %s (mid-stream)", f->acc->id, msg);
            f->tail_sent = true;
            u->off = u->len = 0;
            size_t need = t ? strlen(t) + 8 : 0;
            if (t && need + 1 <= u->cap) {
                u->len = (size_t)snprintf(u->buf, u->cap, "data: %s\n\n", t);
            } else if (t) {
                char *nb = wrealloc(u->buf, need + 1);
                if (nb) {
                    u->buf = nb;
                    u->cap = need + 1;
                    u->len = (size_t)snprintf(u->buf, u->cap, "data: %s\n\n", t);
                }
            }
            free(t);
            upstream_end(u);
            workers_done(f->r, f->w, down ? ATTEMPT_DOWN : ATTEMPT_FAILED, msg);
            f->w = NULL;
            continue;
        }
        if (__atomic_load_n(&f->r->stopping, __ATOMIC_ACQUIRE))
            return MHD_CONTENT_READER_END_WITH_ERROR;
        upstream_step(u, 50);
        if (u->off == u->len && !u->done && gone_check(f))
            return MHD_CONTENT_READER_END_WITH_ERROR;
    }
}

static void relay_free(void *cls)
{
    struct fwd *f = cls;
    bool ok = f->u.done && f->u.cc == CURLE_OK;
    upstream_end(&f->u); /* a cut exchange closes the worker's connection: it aborts */
    if (f->w)
        workers_done(f->r, f->w, ok ? ATTEMPT_OK : ATTEMPT_ABORTED, NULL);
    f->w = NULL;
    fwd_free(f);
}

static void note_commit(struct fwd *f, bool stream)
{
    struct raccess *a = f->acc;
    a->t_first = time_now();
    a->stream = stream;
    snprintf(a->worker, sizeof a->worker, "%s", f->w->url);
    pthread_mutex_lock(&f->r->mu);
    prom_hist_observe(&f->r->m.ttfb, a->t_first - a->t_start);
    pthread_mutex_unlock(&f->r->mu);
}

static enum MHD_Result answer_stream(struct fwd *f)
{
    note_commit(f, true);
    /* the kernel's send buffer is capped too (Linux doubles the value), else a client that
       stops reading parks up to tcp_wmem's maximum (4 MiB) there, as in weld serve */
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(f->c,
                                                                 MHD_CONNECTION_INFO_CONNECTION_FD);
    size_t cap = f->r->o.stream_buffer;
    if (ci && cap > 0) {
        int sz = cap < (1u << 30) ? (int)cap : 1 << 30;
        setsockopt(ci->connect_fd, SOL_SOCKET, SO_SNDBUF, &sz, sizeof sz);
    }
    upstream_relay(&f->u, f->r->o.stream_buffer);
    struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384,
                                                                  relay_read, f, relay_free);
    if (!resp) {
        relay_free(f);
        return MHD_NO;
    }
    MHD_add_response_header(resp, "Content-Type", f->u.ctype);
    MHD_add_response_header(resp, "Cache-Control", "no-cache");
    MHD_add_response_header(resp, "X-Request-Id", f->acc->id);
    enum MHD_Result rc = MHD_queue_response(f->c, 200, resp);
    MHD_destroy_response(resp);
    router_count_http(f->r, 200);
    return rc;
}

static enum MHD_Result answer_whole(struct fwd *f, int status, const char *ctype, const char *body,
                                    size_t len)
{
    struct MHD_Response *resp = MHD_create_response_from_buffer(len, (void *)body,
                                                                MHD_RESPMEM_MUST_COPY);
    if (!resp)
        return MHD_NO;
    MHD_add_response_header(resp, "Content-Type", ctype && ctype[0] ? ctype : "application/json");
    MHD_add_response_header(resp, "X-Request-Id", f->acc->id);
    enum MHD_Result rc = MHD_queue_response(f->c, (unsigned)status, resp);
    MHD_destroy_response(resp);
    router_count_http(f->r, status);
    return rc;
}

/* ---- the attempts ----------------------------------------------------------------------- */

static enum MHD_Result run(struct fwd *f)
{
    struct router *r = f->r;
    char msg[512] = "", last503_ct[128] = "";
    int status = 503;
    char *last503 = NULL;
    size_t last503_len = 0;
    int tries = 1 + (r->o.max_retries > 0 ? r->o.max_retries : 0);
    for (int a = 0; a < tries && f->n_tried < MAX_TRIES; a++) {
        struct worker *w = workers_pick(r, f->role, f->pol, f->text, f->text_len, f->tried,
                                        f->n_tried);
        if (!w)
            break;
        if (a > 0)
            count(r, &r->m.retries);
        f->tried[f->n_tried++] = w;
        f->w = w;
        f->acc->attempts++;
        enum attempt_end how;
        enum att res = attempt(f, w, msg, sizeof msg, &status, &how);
        if (res == ATT_GONE) {
            count(r, &r->m.client_gone);
            upstream_end(&f->u);
            wfree(last503);
            fwd_free(f); /* releases w as aborted */
            return MHD_NO;
        }
        if (res == ATT_STREAM) {
            wfree(last503);
            return answer_stream(f);
        }
        if (res == ATT_WHOLE) {
            note_commit(f, false);
            upstream_end(&f->u);
            enum MHD_Result rc = answer_whole(f, (int)f->u.status, f->u.ctype,
                                              f->u.buf ? f->u.buf : "", f->u.len);
            workers_done(r, w, ATTEMPT_OK, NULL);
            f->w = NULL;
            wfree(last503);
            fwd_free(f);
            return rc;
        }
        /* retry: keep a 503's answer to pass on if no worker does better */
        if (f->u.status == 503 && f->u.done && f->u.cc == CURLE_OK) {
            wfree(last503);
            last503 = f->u.buf;
            last503_len = f->u.len;
            snprintf(last503_ct, sizeof last503_ct, "%s", f->u.ctype);
            f->u.buf = NULL;
            f->u.cap = 0;
        }
        upstream_clear(&f->u);
        log_warn("request %s: %s%s", f->acc->id, msg,
                 a + 1 < tries ? "; trying another worker" : "");
        workers_done(r, w, how, msg);
        f->w = NULL;
        if (__atomic_load_n(&r->stopping, __ATOMIC_ACQUIRE))
            break;
    }
    enum MHD_Result rc;
    if (last503) {
        rc = answer_whole(f, 503, last503_ct, last503, last503_len);
    } else if (!f->n_tried) {
        count(r, &r->m.no_worker);
        int listed = 0;
        pthread_mutex_lock(&r->mu);
        listed = r->n_w;
        pthread_mutex_unlock(&r->mu);
        rc = router_error(r, f->c, 503,
                          "no healthy %sworker to take the request (%d listed); "
                          "start workers or check the URLs given to --worker / --worker-file",
                          f->role == WORKER_DECODE ? "decode " : "", listed);
    } else {
        rc = router_error(r, f->c, status, "%s (%d attempt%s)", msg, f->n_tried,
                          f->n_tried == 1 ? "" : "s");
    }
    wfree(last503);
    fwd_free(f);
    return rc;
}

/* ---- P/D -------------------------------------------------------------------------------- */

/* The prefill step; returns the kv_transfer_params of its answer (a reference) or NULL
   (fall back); *gone: the client left meanwhile. */
static json_t *pd_prefill(struct fwd *f, const json_t *body, bool *gone)
{
    struct router *r = f->r;
    *gone = false;
    double t0 = time_now();
    json_t *pb = json_deep_copy(body);
    json_t *kv = NULL;
    char *txt = NULL;
    char why[600] = "";
    if (pb) {
        json_object_set_new(pb, "max_tokens", json_integer(1));
        json_object_del(pb, "max_completion_tokens");
        json_object_set_new(pb, "stream", json_false());
        json_object_del(pb, "stream_options");
        json_object_set_new(pb, "n", json_integer(1));
        json_object_set_new(pb, "kv_transfer_params", json_pack("{s:b}", "do_remote_decode", 1));
        txt = json_dumps(pb, JSON_COMPACT);
    }
    json_decref(pb);
    struct worker *w = txt ? workers_pick(r, WORKER_PREFILL, r->o.prefill_policy, f->text,
                                          f->text_len, NULL, 0)
                           : NULL;
    if (!txt)
        snprintf(why, sizeof why, "out of memory");
    else if (!w)
        snprintf(why, sizeof why, "no healthy prefill worker");
    struct upstream u;
    struct weld_err e = {0};
    enum attempt_end how = ATTEMPT_FAILED;
    if (w && upstream_start(&u, r, w, "POST", f->path, txt, strlen(txt), f->auth, f->acc->id, &e)) {
        snprintf(why, sizeof why, "prefill worker %s: %s", w->url, e.msg);
    } else if (w) {
        while (!upstream_step(&u, 50)) {
            if (gone_check(f)) {
                *gone = true;
                break;
            }
            if ((r->o.request_timeout > 0 && time_now() - t0 > r->o.request_timeout) ||
                __atomic_load_n(&r->stopping, __ATOMIC_ACQUIRE))
                break;
        }
        if (*gone) {
            how = ATTEMPT_ABORTED;
        } else if (!u.done) {
            snprintf(why, sizeof why, "prefill worker %s: no answer within %.0f s", w->url,
                     time_now() - t0);
        } else if (u.cc != CURLE_OK) {
            bool down;
            failure(&u, w, why, sizeof why, &down);
            how = down ? ATTEMPT_DOWN : ATTEMPT_FAILED;
        } else if (u.status != 200) {
            snprintf(why, sizeof why, "prefill worker %s answered %ld: %.200s", w->url, u.status,
                     u.buf ? u.buf : "");
        } else {
            json_t *resp = json_loadb(u.buf ? u.buf : "", u.len, 0, NULL);
            kv = json_object_get(resp, "kv_transfer_params");
            if (json_is_object(kv)) {
                json_incref(kv);
                how = ATTEMPT_OK;
            } else {
                kv = NULL;
                snprintf(why, sizeof why,
                         "prefill worker %s answered without a "
                         "kv_transfer_params object",
                         w->url);
            }
            json_decref(resp);
        }
        upstream_clear(&u);
    }
    if (w)
        workers_done(r, w, how, why);
    free(txt);
    pthread_mutex_lock(&r->mu);
    r->m.pd_requests++;
    prom_hist_observe(&r->m.pd_prefill, time_now() - t0);
    if (!kv && !*gone)
        r->m.pd_fallbacks++;
    pthread_mutex_unlock(&r->mu);
    if (!kv && !*gone)
        log_warn("request %s: %s; the decode worker computes the prompt itself", f->acc->id, why);
    return kv;
}

/* ---- entry ------------------------------------------------------------------------------ */

static const char *const paths[] = {"/v1/completions", "/v1/chat/completions", "/v1/embeddings",
                                    "/tokenize",       "/detokenize",          "/v1/models"};

enum MHD_Result proxy_forward(struct router *r, struct MHD_Connection *c, struct rreq *q,
                              enum rroute route)
{
    struct fwd *f = wcalloc(1, sizeof *f);
    if (!f)
        return router_error(r, c, 500, "out of memory");
    __atomic_add_fetch(&r->n_open, 1, __ATOMIC_ACQ_REL);
    f->r = r;
    f->c = c;
    f->acc = &q->acc;
    f->path = paths[route];
    f->method = route == RROUTE_MODELS ? "GET" : "POST";
    f->auth = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    f->body = route == RROUTE_MODELS ? NULL : q->body ? q->body : "";
    f->body_len = q->body_len;
    f->role = workers_serving_role(r);
    f->pol = r->o.pd ? r->o.decode_policy : r->o.policy;
    bool gen = route == RROUTE_COMPLETIONS || route == RROUTE_CHAT;
    bool pd = r->o.pd && gen;
    bool keyed = gen || route == RROUTE_EMBEDDINGS;
    bool parse = pd || (keyed && f->pol == ROUTER_POLICY_CACHE_AWARE);
    if (!keyed)
        f->pol = f->pol == ROUTER_POLICY_LEAST_LOAD ? f->pol : ROUTER_POLICY_ROUND_ROBIN;
    if (!parse)
        return run(f);
    json_error_t je;
    json_t *body = json_loadb(f->body, f->body_len, JSON_REJECT_DUPLICATES, &je);
    if (!json_is_object(body)) {
        json_decref(body);
        fwd_free(f);
        if (!body)
            return router_error(r, c, 400, "malformed JSON body: line %d, column %d: %s", je.line,
                                je.column, je.text);
        return router_error(r, c, 400, "the body must be a JSON object");
    }
    request_text(f, route, body);
    if (pd) {
        bool gone;
        json_t *kv = pd_prefill(f, body, &gone);
        if (gone) {
            json_decref(body);
            count(r, &r->m.client_gone);
            fwd_free(f);
            return MHD_NO;
        }
        if (kv) {
            json_object_set_new(body, "kv_transfer_params", kv);
            f->owned = json_dumps(body, JSON_COMPACT);
            if (f->owned) {
                f->body = f->owned;
                f->body_len = strlen(f->owned);
            }
        }
    }
    json_decref(body);
    return run(f);
}
