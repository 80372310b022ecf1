/*
 * http - internal header shared by http.c (daemon, routing, start/stop) and routes.c (the
 * POST routes: completions, chat, tokenize, detokenize). Not part of any public API.
 *
 * struct server lives on server_run()'s stack for the whole life of the daemon; its fields
 * are set before MHD starts except the served-model description, which is built once,
 * under mu, the first time a request finds the engine ready.
 */
#ifndef WELD_SERVER_HTTP_H
#define WELD_SERVER_HTTP_H

#include "httpd/httpd.h"
#include "httpd/keys.h"
#include "server/gen.h"
#include "server/openai.h"
#include "server/server.h"

#include <jansson.h>
#include <microhttpd.h>
#include <pthread.h>
#include <stdbool.h>

struct server {
    struct server_opts o;
    const char *name;              /* served model name */
    long t_start;
    struct httpd *http;            /* the daemon behind its accept gate (httpd/httpd.h) */
    int max_gens;                  /* generation requests allowed at once */
    int gens;                      /* __atomic: generation requests now running */
    struct httpd_keys keys;        /* --api-key, then --api-key-file */
    struct server_gen *gen;
    struct chat_template *tmpl;    /* --chat-template, else the model's (parsed lazily) */
    pthread_mutex_t mu;
    bool have_model;
    struct server_model model;
    bool draining;                 /* __atomic: set once by the main thread, read by /health */
    unsigned long next_id;         /* response ids (atomic increments) */
    int n_gen_open;                /* __atomic: generation requests not yet freed (routes.c) */
};

/* What the access log line says about one request: http.c fills the method, path and
   start when the request arrives; a generation route adds its id, token counts, first
   token time and finish reasons while it runs (never after MHD's completion callback, which
   prints the line and frees the record). */
struct http_access {
    double t_start, t_first;       /* time_now of the headers / the first token (0: none) */
    char method[16], path[256];
    char id[64];                   /* response id; "" for routes without one */
    bool generation;               /* the fields below mean something */
    int prompt_tokens, completion_tokens, n_choices, n_finished;
    int delta_tokens;              /* tokens seen in deltas (choices that never finished) */
    unsigned finish_seen;          /* bit per enum request_finish seen */
    char *prompt;                  /* --log-prompts: the prompt(s) as JSON (wmalloc'd) */
};

/* Per-connection state (MHD's con_cls): the request body collected so far. */
struct http_conn {
    char *body;
    size_t body_len, cap;          /* body_len counts every byte received, kept or not */
    bool too_big;
    bool gen;                      /* counted in server.gens */
    struct http_access acc;
};

enum http_post { HTTP_POST_COMPLETIONS, HTTP_POST_CHAT, HTTP_POST_TOKENIZE, HTTP_POST_DETOKENIZE,
                 HTTP_POST_EMBEDDINGS };

enum MHD_Result http_send(struct server *s, struct MHD_Connection *c, int status,
                          const char *ctype, const char *body, size_t len);
/* Sends and releases j. */
enum MHD_Result http_send_json(struct server *s, struct MHD_Connection *c, int status,
                               json_t *j);
enum MHD_Result http_send_error(struct server *s, struct MHD_Connection *c,
                                const struct server_error *e);
/* Restart the connection's send timeout, so that a stream that waited long for its next
   token is not cut by it: call before a body callback hands MHD data. (A whole answer needs
   no call: MHD_queue_response restarts the timer itself.) */
void http_touch(struct server *s, struct MHD_Connection *c);
/* The served model, once the engine is ready (false while loading). */
bool http_model(struct server *s, struct server_model *m);

/* routes.c */
enum MHD_Result http_post(struct server *s, struct MHD_Connection *c, enum http_post which,
                          const json_t *body, struct http_access *acc);
/* embeddings.c: POST /v1/embeddings */
enum MHD_Result http_embeddings(struct server *s, struct MHD_Connection *c, const json_t *body);
/* After server_gen_halt: wait (at most timeout seconds) until every generation request has
   handed its last bytes to its connection, so that stopping the daemon cuts no stream. */
void http_wait_generations(struct server *s, double timeout);
/* access.c: keep the request's prompt text(s) in a for the access log (--log-prompts). */
void http_access_prompt(struct http_access *a, const struct server_req *r);
/* The access-log line of a finished request (status 0: no response was queued). */
void http_access_log(struct server *s, struct MHD_Connection *c, struct http_access *a,
                     unsigned status);

#endif
