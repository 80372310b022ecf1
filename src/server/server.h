/*
 * server - `weld serve`: an OpenAI-compatible HTTP server around the engine.
 *
 * Pieces (one file each):
 *   openai.h / openai_req.c   request JSON -> struct server_req (prompts tokenized, chat
 *                             template rendered, sampling params), OpenAI error objects
 *   openai_resp.c             response bodies, SSE chunks, logprobs shapes
 *   gen.h / gen.c             the engine thread: inbox, aborts, per-request outboxes
 *   embeddings.c              POST /v1/embeddings (engine requests of kind EMBED)
 *   metrics.h / metrics.c     what /metrics reports (the text: httpd/prom.h)
 *   http.c                    routing, auth, body limit, shutdown; the daemon, its accept
 *                             gate and the API keys are httpd/'s, shared with the router
 *   routes.c                  the POST routes: generation (whole or streamed), tokenize
 *   access.c                  the access log (one line per request)
 *
 * Threads: the gate's accept thread; libmicrohttpd's thread per connection (plus its own); a
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
#include "grammar/schema.h"
#include "server/tools.h"

#include <stdbool.h>
#include <stddef.h>

/* --kv-transfer-config's kv_role, vLLM's: a producer (prefill worker) saves a request's
   prompt blocks to the KV tier when asked (kv_transfer_params.do_remote_decode) and
   answers with the handle; a consumer (decode worker) takes requests that carry one
   (do_remote_prefill) and loads those blocks instead of computing them; both: either. */
enum server_kv_role { SERVER_KV_NONE = 0, SERVER_KV_PRODUCER, SERVER_KV_CONSUMER, SERVER_KV_BOTH };

/* Parse a --kv-transfer-config JSON ({"kv_connector": "weld" (default), "kv_role": ...}). */
int server_kv_transfer_config(const char *json, enum server_kv_role *role, struct weld_err *e);

struct server_opts {
    struct engine_params engine;   /* engine.model_path: the model to load */
    const char *host;              /* "127.0.0.1" */
    int port;                      /* 8000; 0: any free port (printed) */
    const char *served_model_name; /* NULL: the model path */
    const char *const *api_keys;   /* (n_api_keys) keys accepted as "Bearer KEY"; with none */
    int n_api_keys;                /* and no api_key_file, no auth */
    const char *api_key_file;      /* NULL or a file of more keys, one a line */
    const char *chat_template;     /* NULL, a file or a builtin name (chat_template_load)
                                      overriding the model's template */
    double shutdown_timeout;       /* seconds running requests get after SIGTERM */
    size_t max_body;               /* request body limit in bytes (413 beyond) */
    double send_timeout;           /* seconds a client may stay silent while it sends a request
                                      (or keeps an idle connection, or stops reading): 15 */
    int max_connections;           /* connections held at once (1000) */
    int max_connections_per_client; /* per client address (256; 0: no limit) */
    enum request_pooling pooling;  /* /v1/embeddings: last token (default) or mean */
    size_t stream_buffer;          /* output bytes queued for a stream whose client is not
                                      reading before its request is paused; 0: no cap */
    double stream_stall_timeout;   /* seconds a paused stream waits for its client before
                                      it is aborted; 0: forever */
    bool log_requests;             /* one access-log line per request (default on) */
    bool log_prompts;              /* ... with the prompt text (default off) */
    enum tool_parser tool_parser;  /* --tool-call-parser (server/tools.h); NONE: not set */
    enum server_kv_role kv_role;   /* --kv-transfer-config kv_role (prefill/decode split) */
    bool auto_tool_choice;         /* --enable-auto-tool-choice */
    struct schema_opts schema_opts; /* --structured-outputs-config (grammar/schema.h) */
};

struct server_opts server_opts_default(void);

/* Listen, load the model (health answers 503 meanwhile), serve until SIGINT/SIGTERM, drain
   for up to shutdown_timeout seconds, abort what still runs (each stream still ends with a
   last chunk, finish_reason "abort", and [DONE]; a non-streaming request gets a 503), stop. Returns WELD_OK after a clean shutdown; an
   error (socket, model, template) fills e. Prints "listening on http://HOST:PORT" to
   stderr once the socket is bound and the model loaded (never when the load fails). */
int server_run(const struct server_opts *o, struct weld_err *e);

#endif
