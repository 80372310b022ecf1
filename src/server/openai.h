/*
 * openai - the OpenAI request and response shapes of `weld serve`.
 *
 * Requests: server_req_parse() turns the JSON body of POST /v1/completions or
 * /v1/chat/completions into a struct server_req: every prompt tokenized (a string, a list
 * of strings, token ids or a list of token-id lists; chat messages rendered with the chat
 * template, add_generation_prompt, and tokenized with no second BOS when the template
 * already wrote one), the sampling parameters read by engine/batch_io.h (so `weld batch`
 * and the server accept the same fields) and checked by request_params_check(), and the
 * prompt-length limit applied; the structured-output fields (response_format,
 * structured_outputs, guided_*) become the request's grammar (engine/structured.h). Values
 * outside the OpenAI / vLLM ranges and fields that would change the output but are not
 * implemented are a 400 naming the field; other
 * unknown fields are ignored with one warning line per request. A failure fills struct
 * server_error: HTTP status, OpenAI error type, the offending parameter and a message
 * naming the field and the limit.
 *
 * vLLM semantics: max_tokens (or max_completion_tokens) defaults to 16 for completions and
 * to what is left of max_model_len for chat; prompt + max_tokens above max_model_len is a
 * 400 naming both. Completions take logprobs as an integer; chat takes logprobs as a bool
 * with top_logprobs. Choices are numbered prompt * n + i.
 *
 * Responses (openai_resp.c): completion and chat bodies, their streaming chunks, usage,
 * and logprobs in the completions shape (tokens / token_logprobs / top_logprobs /
 * text_offset) or the chat shape (content: [{token, logprob, bytes, top_logprobs}]).
 *
 * Tool calling (chat): server/tools.h. Not supported (answered with 400 naming them,
 * never silently ignored): non-text content parts, echo on chat.
 *
 * Echo (completions) returns the prompt text; with logprobs also the prompt tokens'
 * logprobs before the completion's (vLLM's prompt_logprobs, the first token's null), and
 * max_tokens may then be 0: score the prompt only (lm-evaluation-harness's log-likelihood
 * requests). A stream carries the prompt text but not the prompt logprobs.
 */
#ifndef WELD_SERVER_OPENAI_H
#define WELD_SERVER_OPENAI_H

#include "engine/batch_io.h"
#include "engine/request.h"
#include "grammar/schema.h"
#include "server/tools.h"

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

struct tokenizer;
struct chat_template;

#define SERVER_MAX_CHOICES 1024  /* prompts * n of one request */

enum server_api { SERVER_API_COMPLETIONS, SERVER_API_CHAT };

/* What parsing needs to know about the served model. */
struct server_model {
    const char *name;                  /* served model name */
    const char *path;                  /* model path (also accepted as the model name) */
    const struct tokenizer *tok;       /* may be NULL: token-id prompts only */
    const struct chat_template *tmpl;  /* NULL: chat is refused */
    int n_vocab;
    int dim;                           /* hidden size: the embeddings' length */
    int max_model_len;
    enum tool_parser tool_parser; /* --tool-call-parser (NONE: not set) */
    struct schema_opts schema_opts; /* --structured-outputs-config */
    bool auto_tool_choice;        /* --enable-auto-tool-choice */
    int kv_role;                  /* enum server_kv_role */
};

struct server_error {
    int http;                  /* 400, 401, 404, 413, 500, 503 */
    const char *type;          /* "invalid_request_error", ... */
    const char *code;          /* NULL or e.g. "model_not_found" */
    char param[64];            /* "" or the offending parameter */
    char msg[1024];
};

struct server_prompt {
    int32_t *ids;              /* (n_ids) */
    int n_ids;
    char *text;                /* the prompt text (for echo), NUL-terminated */
    size_t text_len;
};

struct server_req {
    enum server_api api;
    json_t *fields;            /* the body without prompt/messages; bl's strings point in */
    struct batch_line bl;      /* sampling parameters (bl.p; prompt fields unset) */
    struct server_prompt *prompts; /* (n_prompts) */
    int n_prompts;
    bool stream, include_usage, echo;
    int logprobs;              /* -1 off, else top-N (0: the sampled token only) */
    char model[256];           /* the model name to report */
    struct server_tools tools; /* chat: tools and tool_choice (server/tools.h) */
    /* kv_transfer_params (vLLM's P/D shape): do_remote_decode asks this (prefill) server
       to save the prompt's blocks and answer with the handle (bl.p.kv_save);
       do_remote_prefill says a prefill server saved remote_num_tokens of them */
    bool kv_remote_decode, kv_remote_prefill;
    int kv_remote_tokens;
};

/* Fill e and return its http status. param may be NULL. */
int server_error_set(struct server_error *e, int http, const char *param, const char *fmt,
                     ...) WELD_PRINTF(4, 5);
/* {"error": {"message", "type", "param", "code"}} (new reference). */
json_t *server_error_json(const struct server_error *e);

/* 0 on success; else e is filled and its http status returned. */
/* A JSON array of token ids checked against the vocabulary into *out (wmalloc'd, n_out
   ids); errors are 400s naming param, with where (e.g. "prompt[2]") in the message. */
int server_token_ids(const struct server_model *m, const json_t *a, const char *param,
                     const char *where, int32_t **out, size_t *n_out, struct server_error *e);
int server_req_parse(const json_t *body, enum server_api api, const struct server_model *m,
                     struct server_req *out, struct server_error *e);
void server_req_release(struct server_req *r);

/* Render chat messages (validated and normalized: text parts joined with "\n") with the
   template; extra: NULL or the request body (add_generation_prompt, tools,
   chat_template_kwargs). *out is wmalloc'd. */
int server_chat_render(const struct server_model *m, const json_t *messages,
                       const json_t *extra, char **out, struct server_error *e);
/* Tokenize rendered chat text: special tokens on unless it already starts with BOS. */
int server_chat_encode(const struct server_model *m, const char *text, int32_t **ids,
                       int *n_ids, struct server_error *e);

/* ---- responses (openai_resp.c) ---- */

/* One finished choice, accumulated from the engine's deltas. */
struct server_choice {
    char *text;
    size_t len, cap;
    size_t sent;             /* streaming with tools: text bytes sent as content */
    struct tool_call *calls; /* (n_calls) read out of the finished text, or NULL */
    int n_calls;
    size_t content_len;        /* with calls: the text before them, the content */
    json_t *lp;                /* logprobs being built (shape per api), or NULL */
    enum request_finish finish;
    char *stop_reason;         /* matched stop string or NULL */
    int32_t stop_token;        /* -1 or the stop token id */
    int n_generated;
    size_t text_offset;        /* completions logprobs: bytes of text so far */
    bool done, started;
};

/* One prompt token's logprobs (echo with logprobs); entry 0 has none (logprob NAN). */
struct server_prompt_lp {
    int32_t token;
    float logprob;
    int n_top;
    int32_t top_ids[REQUEST_MAX_LOGPROBS];
    float top_lps[REQUEST_MAX_LOGPROBS];
};

/* Echo with logprobs (completions): the prompt tokens' entries (n, from plp), the first
   with null token_logprobs and top_logprobs, put before the entries *lp holds (the
   generated tokens'); text offsets count each token's text (special tokens none), at most
   text_len (the echoed prompt's bytes). */
void server_lp_prepend_prompt(const struct tokenizer *tok, json_t **lp,
                              const struct server_prompt_lp *plp, int n, size_t text_len);
/* Token text for logprobs: the token's text as it reads after BOS (leading space kept;
   special tokens kept). */
char *server_token_str(const struct tokenizer *tok, int32_t id, size_t *len);
/* One token's logprobs entry in the api's shape, appended to *lp (created on first use);
   for completions text_offset is the byte offset of the token's text. */
void server_lp_append(enum server_api api, const struct tokenizer *tok, json_t **lp,
                      int32_t token, float logprob, int n_top, const int32_t *top_ids,
                      const float *top_lps, size_t text_offset);
json_t *server_usage_json(int prompt_tokens, int completion_tokens, int cached_tokens);
/* The whole non-streaming body. */
json_t *server_resp_json(const struct server_req *r, const char *id, long created,
                         const struct server_choice *choices, int n_choices,
                         int prompt_tokens, int cached_tokens);
/* One streaming chunk for choice `index`: text delta (may be empty), optional logprobs
   (stolen), finish (NONE while running), role: the chat opening chunk. */
json_t *server_chunk_json(const struct server_req *r, const char *id, long created, int index,
                          const char *text, size_t len, json_t *lp, enum request_finish fin,
                          const char *stop_reason, int32_t stop_token, bool role);
/* A streaming chunk carrying choice index's tool calls (delta.tool_calls, each with its
   index, id, type and the whole function {name, arguments}). */
json_t *server_tool_chunk_json(const struct server_req *r, const char *id, long created, int index,
                               const struct tool_call *calls, int n_calls);
/* The final usage chunk (choices: []). */
json_t *server_usage_chunk_json(const struct server_req *r, const char *id, long created,
                                json_t *usage);
const char *server_finish_str(enum request_finish f);

#endif
