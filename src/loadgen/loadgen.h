/*
 * loadgen - the library half of `weld bench serve`: a load generator for OpenAI-compatible
 * HTTP servers (weld serve, llama.cpp's llama-server, vLLM), in the shape of vLLM's
 * `vllm bench serve` (benchmark_serving.py). A client, not part of the server: it knows
 * only core/ and tokenizer/ (and libcurl), and only the CLI links it.
 *
 * Pieces, one file each:
 *   loadgen_sse.c    an incremental server-sent-events parser (WHATWG rules: CR, LF or CRLF
 *                    line ends split anywhere, ':' comments, multi-line data joined by LF)
 *                    and the per-request stream state that turns OpenAI stream chunks into
 *                    timings: TTFT, inter-token latencies, usage, [DONE], error objects.
 *   loadgen_data.c   datasets (random, shared-prefix, chat): prompts as plain text, built
 *                    from a seeded RNG so two runs against two servers send the same bytes;
 *                    with a tokenizer, prompts of exact token lengths made of random token
 *                    ids decoded to text, else text from a fixed word list.
 *   loadgen_stats.c  Poisson/gamma arrival times, percentiles (numpy's linear rule),
 *                    the summary (throughput, goodput, TTFT/TPOT/ITL/E2EL), its JSON and
 *                    the vLLM-style text report.
 *   loadgen_run.c    the driver: one thread, one curl multi handle, every transfer in
 *                    flight at once (no thread per request); requests start at their arrival
 *                    time once fewer than max_concurrency are in flight.
 *
 * Times in struct loadgen_result are seconds; the summary reports milliseconds, as vLLM
 * does. Definitions (vLLM's): TTFT = first chunk carrying non-empty text - send time;
 * ITL = gap between successive non-empty chunks; E2EL = end of stream - send time;
 * TPOT = (E2EL - TTFT) / (output tokens - 1), only for requests with > 1 output token;
 * output tokens = usage.completion_tokens, or the number of non-empty chunks when the
 * server sends no usage. A request succeeds when the server answered 200, streamed at
 * least one non-empty chunk and ended with `data: [DONE]`, and sent no error object.
 *
 * Nothing here prints except loadgen_summary_print (to the FILE given); errors go to
 * struct weld_err. Not thread-safe: one benchmark per thread.
 */
#ifndef WELD_LOADGEN_LOADGEN_H
#define WELD_LOADGEN_LOADGEN_H

#include "core/err.h"

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

struct tokenizer;

/* ---- server-sent events (loadgen_sse.c) ---- */

/* Called once per dispatched event: data (NUL-terminated, len bytes, lines joined by LF)
   and the event type ("message" unless an `event:` field set one). Return 0 to go on,
   nonzero to make loadgen_sse_feed stop and return that value. */
typedef int (*loadgen_sse_fn)(void *user, const char *event, const char *data, size_t len);

struct loadgen_sse {
    char *line;              /* (line_cap) the line being assembled, without its end */
    size_t line_len, line_cap;
    char *data;              /* (data_cap) data lines of the pending event, LF-joined */
    size_t data_len, data_cap;
    bool has_data;           /* a data field was seen since the last dispatch */
    bool last_cr;            /* the previous byte ended a line with CR: skip one LF */
    char event[32];          /* event type of the pending event (truncated) */
    size_t max_bytes;        /* limit on line_len and data_len */
    uint64_t offset;         /* bytes fed so far, for error messages */
    loadgen_sse_fn fn;
    void *user;
};

/* max_bytes: the largest line / event accepted (0: 16 MiB). */
void loadgen_sse_init(struct loadgen_sse *s, size_t max_bytes, loadgen_sse_fn fn, void *user);
/* Feed n bytes. Returns WELD_OK, the callback's nonzero value, or WELD_ERR_FORMAT /
   WELD_ERR_NOMEM (message names the stream offset). */
int loadgen_sse_feed(struct loadgen_sse *s, const char *buf, size_t n, struct weld_err *e);
/* Release buffers; the struct may be initialised again. An unterminated event at the end
   of a stream is discarded, as the SSE specification says. */
void loadgen_sse_release(struct loadgen_sse *s);

/* ---- one request's outcome ---- */

struct loadgen_result {
    bool success;
    bool failed;             /* a failure was recorded (error may be NULL if out of memory) */
    char *error;             /* heap text of the first failure, else NULL */
    int http_status;         /* 0 if no response */
    double t_send;           /* seconds since the benchmark start */
    double ttft, e2el;       /* seconds; ttft 0 if no chunk came */
    double *itl;             /* (n_itl) seconds between non-empty chunks */
    int n_itl, cap_itl;
    int64_t prompt_tokens;   /* usage.prompt_tokens, else the dataset's length */
    int64_t output_tokens;   /* usage.completion_tokens, else non-empty chunks */
    int n_chunks;            /* non-empty content chunks */
    size_t text_bytes;       /* generated text received */
    bool got_usage, got_done;
};

void loadgen_result_release(struct loadgen_result *r);
void loadgen_results_free(struct loadgen_result *r, int n);

/* The stream state of one request: an SSE parser feeding OpenAI chunks into a result. */
struct loadgen_stream {
    struct loadgen_sse sse;
    struct loadgen_result *res;
    double t_now;            /* arrival time of the bytes being fed */
    double t_last;           /* time of the last non-empty chunk */
};

void loadgen_stream_init(struct loadgen_stream *st, struct loadgen_result *res);
/* Bytes of the 200 response body that arrived at time `now` (same clock as res->t_send).
   A chunk that is not JSON or carries an error object marks the result failed (kept in
   res->error) and returns WELD_ERR_FORMAT so the caller can end the transfer. */
int loadgen_stream_feed(struct loadgen_stream *st, const char *buf, size_t n, double now,
                        struct weld_err *e);
/* The body ended at time `now`: sets e2el and decides success. */
void loadgen_stream_end(struct loadgen_stream *st, double now);
void loadgen_stream_release(struct loadgen_stream *st);

/* Record a failure (printf-style); keeps the first error. */
void loadgen_result_fail(struct loadgen_result *r, const char *fmt, ...) WELD_PRINTF(2, 3);

/* ---- datasets (loadgen_data.c) ---- */

enum loadgen_dataset_kind {
    LOADGEN_DATASET_RANDOM,         /* input_len tokens each */
    LOADGEN_DATASET_SHARED_PREFIX,  /* num_groups prefixes of prefix_len + input_len own */
    LOADGEN_DATASET_CHAT,           /* conversations: system prompt (prefix_len, shared per
                                       group) + 1-3 turns summing to ~input_len */
};

/* One class of a mixed workload (--mix INPUT:OUTPUT[:WEIGHT],...): its requests have these
   lengths, and it gets weight / (sum of weights) of the requests. */
struct loadgen_mix_class {
    int input_len, output_len, weight;
};
#define LOADGEN_MIX_MAX 16

struct loadgen_dataset_params {
    enum loadgen_dataset_kind kind;
    int num_prompts, input_len, output_len, prefix_len, num_groups;
    uint64_t seed;
    const struct tokenizer *tok;    /* NULL: word-list text, lengths approximate */
    const struct loadgen_mix_class *mix; /* (n_mix) classes in place of input_len and
                                            output_len; NULL: every request the same */
    int n_mix;
};

struct loadgen_msg {
    const char *role;        /* "system", "user", "assistant" (static strings) */
    char *content;
};

struct loadgen_prompt {
    char *text;              /* the whole prompt (chat: NULL) */
    struct loadgen_msg *msgs;/* (n_msgs) chat only */
    int n_msgs;
    int prompt_len;          /* tokens: exact (tokenizer, without BOS/template) or estimated */
    int output_len;
    int group;               /* shared-prefix / chat group, else -1 */
};

struct loadgen_dataset {
    struct loadgen_prompt *p;/* (n) in send order */
    int n;
    bool chat;               /* messages, not text */
};

int loadgen_dataset_kind_parse(const char *name, enum loadgen_dataset_kind *out);
/* "1536:16,64:512:3" into out[0..*n) (at most LOADGEN_MIX_MAX classes; weight 1 when
   absent); an error names the bad part. */
int loadgen_mix_parse(const char *spec, struct loadgen_mix_class *out, int *n, struct weld_err *e);
const char *loadgen_dataset_kind_name(enum loadgen_dataset_kind k);
int loadgen_dataset_build(const struct loadgen_dataset_params *p, struct loadgen_dataset **out,
                          struct weld_err *e);
void loadgen_dataset_free(struct loadgen_dataset *d);

/* The JSON request body for one prompt: a completion (prompt) or a chat completion
   (messages; a text prompt becomes one user message), streaming with usage, greedy,
   ignore_eos, max_tokens = output_len. Heap string (wfree), NULL with e set. */
char *loadgen_request_body(const struct loadgen_prompt *p, const char *model, bool chat,
                           struct weld_err *e);

/* ---- arrivals and statistics (loadgen_stats.c) ---- */

/* n send offsets in seconds, from 0: gamma-distributed gaps with mean 1/rate and shape
   `burstiness` (1 = Poisson: exponential gaps), seeded. rate <= 0 or infinite: all 0. */
int loadgen_arrivals(double rate, double burstiness, uint64_t seed, int n, double *out,
                     struct weld_err *e);

/* numpy.percentile(x, p) with linear interpolation over sorted x (n >= 1), p in [0, 100]. */
double loadgen_percentile_sorted(const double *x, size_t n, double p);

struct loadgen_dist {        /* milliseconds; all 0 when no samples */
    double mean, std, median, p90, p99, min, max;
    size_t n;
};

/* Service-level objectives for goodput, in ms; <= 0 means not set. */
struct loadgen_slo {
    double ttft_ms, tpot_ms, e2el_ms;
};

/* Parse vLLM's goodput spec: "ttft:MS", "tpot:MS", "e2el:MS" separated by spaces or
   commas, each at most once, MS > 0. */
int loadgen_slo_parse(const char *spec, struct loadgen_slo *out, struct weld_err *e);
bool loadgen_slo_any(const struct loadgen_slo *s);

struct loadgen_summary {
    int completed, failed;
    double duration;         /* seconds from the first send to the last response */
    int64_t total_input, total_output;
    double request_throughput, output_throughput, total_token_throughput; /* per second */
    int good;                /* successful requests meeting every SLO set */
    double request_goodput;  /* good / duration; 0 when no SLO set */
    struct loadgen_dist ttft, tpot, itl, e2el;
};

int loadgen_summarize(const struct loadgen_result *r, int n, double duration,
                      const struct loadgen_slo *slo, struct loadgen_summary *s,
                      struct weld_err *e);
/* The summary's fields (vLLM's names: mean_ttft_ms, p99_itl_ms, ...) plus the per-request
   arrays input_lens, output_lens, ttfts, tpots, e2els (seconds), itls (lists), send_times,
   errors. NULL on out of memory. */
json_t *loadgen_summary_json(const struct loadgen_summary *s, const struct loadgen_slo *slo,
                             const struct loadgen_result *r, int n);
/* vLLM's "Serving Benchmark Result" table. */
void loadgen_summary_print(FILE *f, const struct loadgen_summary *s,
                           const struct loadgen_slo *slo, const char *title);

/* ---- the driver (loadgen_run.c) ---- */

struct loadgen_config {
    const char *base_url;    /* "http://127.0.0.1:8000" (a trailing '/' is fine) */
    const char *endpoint;    /* "/v1/completions" or "/v1/chat/completions" */
    const char *model;       /* sent as "model" */
    const char *api_key;     /* Authorization: Bearer KEY; NULL for none */
    double request_rate;     /* requests/s; <= 0 or infinite: all at once */
    double burstiness;       /* gamma shape of the gaps (1: Poisson) */
    int max_concurrency;     /* at most this many in flight; <= 0: no limit */
    double timeout_s;        /* per request; <= 0: none */
    uint64_t seed;           /* arrival times */
    bool progress;           /* a progress bar on stderr */
};

/* Send every prompt of d (in order) as streaming requests; *results gets d->n results
   (loadgen_results_free), *duration the benchmark's wall time. Failed requests are
   results, not errors: the return value is non-OK only when nothing could be run
   (out of memory, curl cannot start, a bad config). */
int loadgen_run(const struct loadgen_config *c, const struct loadgen_dataset *d,
                struct loadgen_result **results, double *duration, struct weld_err *e);

/* GET base_url/v1/models and return data[0].id (heap, wfree): how vLLM picks the model
   when none is given. */
int loadgen_fetch_model(const char *base_url, const char *api_key, double timeout_s,
                        char **model, struct weld_err *e);
/* GET base_url + path (e.g. "/metrics"): the body, NUL-terminated (heap, wfree); an
   error naming the URL for anything but 200. */
int loadgen_fetch_text(const char *base_url, const char *path, const char *api_key,
                       double timeout_s, char **text, struct weld_err *e);

/* base_url + path without a doubled '/'; heap (wfree), NULL on out of memory. */
char *loadgen_url(const char *base_url, const char *path);

#endif
