/*
 * httpd - the HTTP plumbing that `weld serve` (server/) and `weld router` (router/) share:
 * a listening libmicrohttpd daemon behind the accept gate, the client-gone check, the send
 * timer, and OpenAI's error object. Keys (keys.h) and the Prometheus text (prom.h) are
 * beside it; the gate itself is gate.h.
 *
 * Why a module of its own: the router must answer HTTP exactly as the server does (the same
 * gate against hostile clients, the same error shape, the same metric text) without linking
 * the engine, which server/ cannot avoid. httpd links core and libmicrohttpd only.
 *
 * The daemon: MHD runs one thread per connection (poll(), so descriptors above FD_SETSIZE
 * work) and has no listening socket of its own; the gate accepts, refuses garbage, silent
 * clients, a client over its connection limit and, past the reserve (a sixteenth of
 * max_connections), everything but GET /health, /metrics and /version, and hands the rest to
 * MHD. MHD's connection timeout is the send timeout rounded up to whole seconds. Order of
 * use: httpd_start (bound and serving when it returns), httpd_stop_accepting (the gate
 * closes the listening socket), httpd_free (joins every connection thread).
 */
#ifndef WELD_HTTPD_HTTPD_H
#define WELD_HTTPD_HTTPD_H

#include "core/err.h"

#include <jansson.h>
#include <microhttpd.h>
#include <stdbool.h>

struct gate;

struct httpd_opts {
    const char *host;               /* IPv4 address or "localhost" */
    int port;                       /* 0: any free port (httpd.port says which) */
    double send_timeout;            /* seconds (> 0) */
    int max_connections;            /* >= 2 */
    int max_connections_per_client; /* 0: no limit */
    MHD_AccessHandlerCallback access;
    MHD_RequestCompletedCallback completed;
    void *cls;                               /* for access and completed */
    void (*answered)(void *cls, int status); /* NULL, or told of each gate refusal */
};

struct httpd {
    struct MHD_Daemon *d;
    struct gate *gate;
    int port;           /* the bound port */
    unsigned timeout_s; /* send_timeout rounded up to whole seconds */
    int reserve;        /* connections kept for the cheap GETs */
};

/* Validate the options, bind, start the gate and the daemon. On failure nothing is left
   running and e names the flag (--host, --port, ...) or the socket error. */
int httpd_start(struct httpd **out, const struct httpd_opts *o, struct weld_err *e);
/* Close the listening socket (and connections still in the gate); MHD's keep running. */
void httpd_stop_accepting(struct httpd *h);
/* Stop accepting, stop the daemon (joining its connection threads), free. NULL: no-op. */
void httpd_free(struct httpd *h);

/* The peer closed its end of the connection (a poll() and a peek; never blocks). */
bool httpd_client_gone(struct MHD_Connection *c);
/* The client's address as "1.2.3.4:port" or "[::1]:port" ("-" when unknown). */
void httpd_client_addr(struct MHD_Connection *c, char *out, size_t cap);
/* Restart the connection's send timeout, so that a stream that waited long for its next
   piece is not cut by it: call before a body callback hands MHD data. */
void httpd_touch(struct MHD_Connection *c, unsigned timeout_s);

/* OpenAI's error object {"error": {"message", "type", "param", "code"}}; type and code
   NULL: the ones status implies (httpd_error_type / httpd_error_code); param or code NULL
   or "": null. */
json_t *httpd_error_json(int status, const char *type, const char *param, const char *code,
                         const char *msg);
/* "invalid_request_error", "authentication_error", "server_error", "service_unavailable" */
const char *httpd_error_type(int status);
/* "model_not_found" (404), "request_too_large" (413), "invalid_api_key" (401) or NULL */
const char *httpd_error_code(int status);
/* The whole answer queued: status, Content-Type, body copied. */
enum MHD_Result httpd_send(struct MHD_Connection *c, int status, const char *ctype,
                           const char *body, size_t len);

#endif
