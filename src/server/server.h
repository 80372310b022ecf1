/*
 * server - `weld serve`: an OpenAI-compatible HTTP server around the engine.
 *
 * Pieces (one file each):
 *   openai.h / openai_req.c   request JSON -> struct server_req (prompts tokenized, chat
 *                             template rendered, sampling params), OpenAI error objects
 *   openai_resp.c             response bodies, SSE chunks, logprobs shapes
 *   gen.h / gen.c             the engine thread: inbox, aborts, per-request outboxes
 *   metrics.h / metrics.c     Prometheus histograms and the /metrics text
 *   http.c                    libmicrohttpd glue, routing, auth, body limit, shutdown
 *
 * Threads: libmicrohttpd runs one thread per connection (plus its listening thread); a
 * connection thread parses and tokenizes its request, hands a job to the engine thread and
 * then blocks on that job's condition variable (never on the engine), checking its socket
 * for a disconnect between waits. The engine thread alone calls engine_* (engine.h is not
 * thread-safe). server_run() blocks SIGINT/SIGTERM in every thread and waits for them in
 * the calling thread.
 */
#ifndef WELD_SERVER_SERVER_H
#define WELD_SERVER_SERVER_H

#include "core/err.h"
#include "engine/engine.h"

#include <stdbool.h>
#include <stddef.h>

struct server_opts {
    struct engine_params engine;   /* engine.model_path: the model to load */
    const char *host;              /* "127.0.0.1" */
    int port;                      /* 8000; 0: any free port (printed) */
    const char *served_model_name; /* NULL: the model path */
    const char *api_key;           /* NULL: no auth */
    const char *chat_template;     /* NULL, a file or a builtin name (chat_template_load)
                                      overriding the model's template */
    double shutdown_timeout;       /* seconds running requests get after SIGTERM */
    size_t max_body;               /* request body limit in bytes (413 beyond) */
};

struct server_opts server_opts_default(void);

/* Listen, load the model (health answers 503 meanwhile), serve until SIGINT/SIGTERM, drain
   for up to shutdown_timeout seconds, stop. Returns WELD_OK after a clean shutdown; an
   error (socket, model, template) fills e. Prints "listening on http://HOST:PORT" to
   stderr once the socket is bound. */
int server_run(const struct server_opts *o, struct weld_err *e);

#endif
