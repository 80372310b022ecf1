/*
 * internal - what the router's files share (router.h lists the files). Not an API.
 *
 * struct router lives on router_run()'s stack for the daemon's whole life. struct worker
 * is reference counted: the table holds one reference while the worker is listed, every
 * request using it one more, so a worker dropped by a SIGHUP reload stays valid until its
 * last request ends (then its idle connections close). Everything marked "mu" is read and
 * written under router.mu only; the curl handles of a request belong to its connection
 * thread.
 */
#ifndef WELD_ROUTER_INTERNAL_H
#define WELD_ROUTER_INTERNAL_H

#include "httpd/httpd.h"
#include "httpd/keys.h"
#include "httpd/prom.h"
#include "router/policy.h"
#include "router/router.h"
#include "router/tree.h"

#include <curl/curl.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

enum worker_role { WORKER_ANY, WORKER_PREFILL, WORKER_DECODE };

/* An idle keep-alive connection to a worker: the connection lives in the multi handle's
   cache, so a later request that takes this pair reuses it. */
struct upconn {
    CURLM *m;
    CURL *h;
    struct upconn *next;
};

struct worker {
    char *url; /* base URL, no trailing '/' */
    enum worker_role role;
    int slot; /* its id in the tree; unique among listed workers */
    int refs; /* __atomic */
    /* mu: */
    bool listed; /* in the table (false once a reload dropped it) */
    bool healthy;
    int fails;       /* failed checks in a row */
    int in_flight;   /* requests the router has on it now */
    double scraped;  /* running + waiting at the last /metrics scrape; -1: none */
    double kv_usage; /* kv_cache_usage_perc at the last scrape */
    int in_flight_at_scrape;
    uint64_t n_requests; /* attempts sent to it */
    uint64_t n_failures; /* attempts that got no usable answer */
    struct upconn *idle; /* (n_idle) */
    int n_idle;
};

struct rmetrics {     /* mu */
    uint64_t http[6]; /* answers by class: 1xx..5xx at [1..5] */
    uint64_t retries, client_gone, no_worker;
    uint64_t stream_pauses; /* relays paused for a slow client */
    uint64_t pd_requests, pd_fallbacks;
    uint64_t decisions[POLICY_REASON_COUNT];
    uint64_t match_chars, text_chars; /* cache_aware: sums over routed texts */
    struct prom_hist latency, ttfb, pd_prefill, match;
};

struct router {
    struct router_opts o;
    struct httpd *http;
    struct httpd_keys keys;
    pthread_mutex_t mu;
    struct worker **w; /* mu: (n_w) the listed workers */
    int n_w;
    struct rtree *tree; /* mu */
    unsigned long rr;   /* mu: round robin and tie rotation */
    struct policy_params pp;
    struct rmetrics m;     /* mu */
    bool draining;         /* __atomic: SIGTERM seen, new requests get 503 */
    bool stopping;         /* __atomic: grace over, running streams are cut */
    int n_open;            /* __atomic: forwarded requests not yet freed */
    unsigned long next_id; /* __atomic */
    unsigned long t_seed;  /* start time: request ids differ across restarts */
    /* health thread */
    pthread_t health;
    bool health_started;
    pthread_cond_t health_cv;      /* mu: wakes the thread early (reload, stop) */
    bool health_stop, health_kick; /* mu */
};

/* ---- workers.c -------------------------------------------------------------------------- */

/* The table from the options and the worker file; then one round of checks. */
int workers_init(struct router *r, struct weld_err *e);
/* SIGHUP: re-read the worker file; adds and drops workers, logs what changed. */
void workers_reload(struct router *r);
void workers_free(struct router *r);
int workers_health_start(struct router *r, struct weld_err *e);
void workers_health_stop(struct router *r);
/* A healthy worker of role for a request with key text (cache_aware; may be NULL), not
   one of the n_ex in ex; counted in flight and referenced. NULL: none is left. */
struct worker *workers_pick(struct router *r, enum worker_role role, enum router_policy pol,
                            const char *text, size_t len, struct worker *const *ex, int n_ex);
/* How an attempt ended, for workers_done. */
enum attempt_end { ATTEMPT_OK, ATTEMPT_FAILED, ATTEMPT_DOWN, ATTEMPT_ABORTED };
/* The attempt on w ended (DOWN: a connection failure, the worker is taken out at once);
   releases the reference of workers_pick. */
void workers_done(struct router *r, struct worker *w, enum attempt_end how, const char *why);
/* Healthy workers of role (WORKER_ANY: all). */
int workers_healthy(struct router *r, enum worker_role role);
void worker_unref(struct worker *w);
/* Role to serve a client's request from: decode workers in P/D mode, else any. */
enum worker_role workers_serving_role(const struct router *r);

/* ---- upstream.c ------------------------------------------------------------------------- */

struct upstream {
    struct router *r;
    struct worker *w;
    struct upconn *uc;
    struct curl_slist *hdr;
    char errbuf[CURL_ERROR_SIZE];
    long status;     /* 0 until the response's headers arrived */
    char ctype[128]; /* its Content-Type ("" when none) */
    char *buf;       /* (len) received, [off, len) not yet relayed */
    size_t len, off, cap;
    size_t limit;    /* collecting: more than this fails the exchange */
    size_t pause_at; /* relaying: pending bytes that pause the transfer */
    bool relaying, paused, overflow;
    bool done; /* the exchange ended: cc says how */
    CURLcode cc;
    double t_start;
};

/* Send method path (body: NULL for GET) to w; auth and request_id become the
   Authorization and X-Request-Id headers (NULL: none). */
int upstream_start(struct upstream *u, struct router *r, struct worker *w, const char *method,
                   const char *path, const char *body, size_t len, const char *auth,
                   const char *request_id, struct weld_err *e);
/* Let curl work for at most ms milliseconds (returns sooner when bytes came or the
   exchange ended); true once it ended. */
bool upstream_step(struct upstream *u, int ms);
/* Relay mode: bytes beyond pause_at pending pause the transfer; upstream_took resumes it
   once they drop below. */
void upstream_relay(struct upstream *u, size_t pause_at);
void upstream_took(struct upstream *u, size_t n);
/* The answer is a Server-Sent Events stream. */
bool upstream_is_sse(const struct upstream *u);
/* End the exchange (aborting it if still running; the connection is kept for reuse only
   after a complete exchange) and release the curl handles; buf stays until
   upstream_clear. */
void upstream_end(struct upstream *u);
void upstream_clear(struct upstream *u);
/* The idle connections of a worker being freed. */
void upstream_pool_free(struct worker *w);

/* ---- proxy.c ---------------------------------------------------------------------------- */

enum rroute {
    RROUTE_COMPLETIONS,
    RROUTE_CHAT,
    RROUTE_EMBEDDINGS,
    RROUTE_TOKENIZE,
    RROUTE_DETOKENIZE,
    RROUTE_MODELS
};

/* What the access log says about one request (router.c prints it in MHD's completion
   callback; proxy.c fills it while the request runs, never after that callback). */
struct raccess {
    double t_start, t_first; /* arrival / first byte to the client (0: none) */
    char method[16], path[256];
    char id[64];      /* the X-Request-Id sent to the workers */
    char worker[256]; /* the worker that answered ("" none) */
    int attempts;
    bool stream;
};

/* Per-request state (MHD's con_cls). */
struct rreq {
    char *body;
    size_t body_len, cap;
    bool too_big;
    struct raccess acc;
};

/* Forward the request in q to a worker and answer the client (any answer: the worker's,
   or the router's error). */
enum MHD_Result proxy_forward(struct router *r, struct MHD_Connection *c, struct rreq *q,
                              enum rroute route);

/* ---- router.c --------------------------------------------------------------------------- */

/* Count an answer of status and queue it (body copied). */
enum MHD_Result router_send(struct router *r, struct MHD_Connection *c, int status,
                            const char *ctype, const char *body, size_t len);
/* The router's own error: OpenAI's shape, status 4xx/5xx, a message saying what to do. */
enum MHD_Result router_error(struct router *r, struct MHD_Connection *c, int status,
                             const char *fmt, ...) __attribute__((format(printf, 4, 5)));
void router_count_http(struct router *r, int status);

/* ---- metrics.c -------------------------------------------------------------------------- */

void rmetrics_init(struct rmetrics *m);
/* The /metrics text (wmalloc'd; NULL: out of memory); takes mu. */
char *rmetrics_text(struct router *r);

#endif
