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
    int port;                      /* bound port */
    struct MHD_Daemon *d;
    struct gate *gate;             /* the accept loop in front of d (gate.c) */
    unsigned timeout_s;            /* send_timeout rounded up to whole seconds (MHD's unit) */
    int max_gens;                  /* generation requests allowed at once */
    int gens;                      /* __atomic: generation requests now running */
    char **keys;                   /* (n_keys) API keys: --api-key, then --api-key-file */
    size_t *key_len;
    int n_keys;
    struct server_gen *gen;
    struct chat_template *tmpl;    /* --chat-template, else the model's (parsed lazily) */
    pthread_mutex_t mu;
    bool have_model;
    struct server_model model;
    bool draining;                 /* __atomic: set once by the main thread, read by /health */
    unsigned long next_id;         /* response ids (atomic increments) */
};

/* Per-connection state (MHD's con_cls): the request body collected so far. */
struct http_conn {
    char *body;
    size_t body_len, cap;          /* body_len counts every byte received, kept or not */
    bool too_big;
    bool gen;                      /* counted in server.gens */
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
/* The peer closed its end of the connection. */
bool http_client_gone(struct MHD_Connection *c);
/* Restart the connection's send timeout, so that a stream that waited long for its next
   token is not cut by it: call before a body callback hands MHD data. (A whole answer needs
   no call: MHD_queue_response restarts the timer itself.) */
void http_touch(struct server *s, struct MHD_Connection *c);
/* The served model, once the engine is ready (false while loading). */
bool http_model(struct server *s, struct server_model *m);

/* routes.c */
enum MHD_Result http_post(struct server *s, struct MHD_Connection *c, enum http_post which,
                          const json_t *body);
/* embeddings.c: POST /v1/embeddings */
enum MHD_Result http_embeddings(struct server *s, struct MHD_Connection *c, const json_t *body);

#endif
