/*
 * router - `weld router`: an OpenAI-compatible HTTP front over a fleet of `weld serve`
 * workers (SGLang's sgl-router, vLLM's production-stack router), in the layer above server
 * and below cli. It links httpd/ (the same accept gate, keys, error shape and metric text as
 * the server) and libcurl, never the engine: a worker is a URL.
 *
 * Pieces (one file each):
 *   router.c     the daemon, routing of /health, /metrics, /version, /v1/models and the
 *                forwarded POST routes, the access log, signals (SIGHUP re-reads the worker
 *                file; SIGINT/SIGTERM drain), router_run
 *   proxy.c      forwarding one request: pick a worker, send, retry on another while nothing
 *                reached the client, relay the answer (a stream as it comes), P/D mode
 *   upstream.c   one HTTP exchange with a worker on libcurl, its keep-alive connections
 *   workers.c    the worker table: health checks, /metrics scrapes, the pick under the
 *                policy, the worker file
 *   metrics.c    the router's /metrics text (weld_router:...)
 *   tree.c       the cache-aware policy's approximate radix tree
 *   policy.c     the policies' decisions as pure functions
 *
 * Threads: the gate's accept thread and libmicrohttpd's thread per connection (each
 * forwarded request runs its libcurl transfer in its own connection thread, so no request
 * ever waits on another); one health thread (checks and scrapes every interval); the
 * caller of router_run waits for signals. One mutex (struct router.mu) guards the table,
 * the tree and the counters; no network I/O happens under it.
 */
#ifndef WELD_ROUTER_ROUTER_H
#define WELD_ROUTER_ROUTER_H

#include "core/err.h"
#include "router/policy.h"

#include <stdbool.h>
#include <stddef.h>

struct router_opts {
    const char *host;           /* "127.0.0.1" */
    int port;                   /* 8000; 0: any free port (printed) */
    const char *const *workers; /* (n_workers) --worker URLs */
    int n_workers;
    const char *worker_file;    /* NULL, or URLs one a line (# comments); re-read on
                                      SIGHUP. In P/D mode lines read "prefill URL" or
                                      "decode URL". */
    enum router_policy policy;  /* cache_aware */
    bool pd;                    /* prefill/decode disaggregation */
    const char *const *prefill; /* (n_prefill) --prefill URLs */
    int n_prefill;
    const char *const *decode; /* (n_decode) --decode URLs */
    int n_decode;
    enum router_policy prefill_policy; /* cache_aware */
    enum router_policy decode_policy;  /* least_load */
    double health_interval;            /* seconds between checks (2) */
    double health_timeout;             /* seconds a check may take (1) */
    int health_failures;               /* failed checks in a row that take a worker out (3) */
    int max_retries;                   /* further workers tried for one request (2) */
    double cache_threshold;            /* 0.5 */
    double balance_abs;                /* 32 */
    double balance_rel;                /* 1.5 */
    size_t max_tree_size;              /* bytes of text per worker in the tree (1 << 24) */
    double connect_timeout;            /* seconds to connect to a worker (5) */
    double request_timeout;            /* seconds a worker may take to start answering (600) */
    const char *const *api_keys;       /* (n_api_keys), checked as `weld serve` does */
    int n_api_keys;
    const char *api_key_file;
    double shutdown_timeout;        /* seconds in-flight requests get after SIGTERM (30) */
    size_t max_body;                /* request body limit (8 MiB; 413 beyond) */
    double send_timeout;            /* 15, as weld serve's */
    int max_connections;            /* 1000 */
    int max_connections_per_client; /* 256 */
    size_t stream_buffer;           /* bytes of a stream held for a slow client before the
                                      worker's transfer is paused (256 KiB) */
    bool log_requests;              /* one access-log line per request (on) */
};

struct router_opts router_opts_default(void);

/* Start (the workers are checked once first), print "listening on http://HOST:PORT" to
   stderr, serve until SIGINT/SIGTERM, drain for up to shutdown_timeout, stop. WELD_OK after
   a clean shutdown; a start-up failure (no worker, a bad URL or file, the socket) fills e
   with what to do. */
int router_run(const struct router_opts *o, struct weld_err *e);

#endif
