/*
 * gate - the accept loop in front of libmicrohttpd (see gate.c). Used through httpd.h by
 * src/server and src/router.
 *
 * Order of use: gate_new (before MHD starts, so that gate_notify can be given to it as
 * MHD_OPTION_NOTIFY_CONNECTION), MHD_start_daemon with MHD_USE_NO_LISTEN_SOCKET |
 * MHD_USE_ITC, gate_start (the gate's thread accepts and hands connections over with
 * MHD_add_connection), gate_stop (before MHD_stop_daemon), gate_free (after it).
 */
#ifndef WELD_HTTPD_GATE_H
#define WELD_HTTPD_GATE_H

#include "core/err.h"

#include <microhttpd.h>

struct gate;

struct gate_opts {
    int listen_fd;       /* bound and listening; the gate owns it from gate_start */
    double send_timeout; /* seconds a new connection gets to send its first bytes */
    int max_connections; /* connections libmicrohttpd may hold */
    int reserve;         /* of those, kept for GET /health, /metrics, /version */
    int per_client;      /* connections one client address may hold (0: no limit) */
    void (*answered)(void *cls, int status); /* NULL, or told of each refusal's status */
    void *cls;
};

int gate_new(struct gate **g, const struct gate_opts *o, struct weld_err *e);
/* MHD_OPTION_NOTIFY_CONNECTION callback (cls: the gate): counts what MHD holds. */
void gate_notify(void *cls, struct MHD_Connection *c, void **socket_context,
                 enum MHD_ConnectionNotificationCode code);
int gate_start(struct gate *g, struct MHD_Daemon *d, struct weld_err *e);
/* Stops the thread, closes the listening socket and every connection not handed over. */
void gate_stop(struct gate *g);
void gate_free(struct gate *g);

#endif
