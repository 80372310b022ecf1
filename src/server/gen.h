/*
 * gen - the engine thread of `weld serve` and the jobs HTTP threads hand it.
 *
 * One thread owns the engine (engine.h is not thread-safe). It loads the model first (the
 * server is listening meanwhile and /health answers 503), then loops:
 *   lock; take the inbox (new jobs) and the abort list; if there is nothing to add, abort
 *   or step: wait on the condition variable (no busy spin); unlock;
 *   add each new job's engine requests (one per prompt; a refusal fails the whole job);
 *   engine_abort the requests of cancelled jobs; engine_step (callbacks fire inside and
 *   push events into the jobs' outboxes, each push under the mutex followed by a signal of
 *   that job's condition variable); publish the engine's stats.
 * The engine thread never waits for an HTTP thread: outboxes are linked lists. A job gets
 * at most one event per generated token per choice plus one finish per choice. A streamed
 * job (server_gen_watch) whose client stops reading is also bounded in memory: once its
 * outbox holds more than the stream buffer (approximate bytes: event structs plus text),
 * the engine thread pauses its requests (engine_pause: KV kept, others keep running); the
 * HTTP thread asks for a resume once it has taken the outbox down to half the buffer. A job
 * paused for longer than the stall timeout is aborted with a warning naming it, and its
 * socket is shut down so that its connection ends.
 *
 * A job (one HTTP request: n_prompts prompts x n sequences = choices, numbered
 * prompt * n + i) is shared by its HTTP thread and the engine thread and freed by whoever
 * drops the last reference: the HTTP side's (server_gen_release), the engine's (dropped
 * when every choice has finished or the job was refused) and the abort list's. Its
 * parameters and prompts are borrowed from the caller until the engine thread has taken
 * the job (state leaves QUEUED); server_gen_release waits for that, so the caller may free
 * them right after it returns.
 *
 * Shutdown: server_gen_drain waits (up to a timeout) until the engine has nothing to do;
 * server_gen_halt aborts whatever still runs, refuses new jobs and joins the thread;
 * server_gen_free frees the engine once no HTTP thread holds a job.
 */
#ifndef WELD_SERVER_GEN_H
#define WELD_SERVER_GEN_H

#include "engine/engine.h"
#include "server/metrics.h"
#include "server/openai.h"

#include <stdbool.h>
#include <stdint.h>

struct server_gen;
struct server_job;

enum server_gen_state {
    SERVER_GEN_LOADING,
    SERVER_GEN_READY,
    SERVER_GEN_FAILED,
    SERVER_GEN_BROKEN /* the engine lost its backend (engine_broken):
                                             requests fail, the server stops */
};

/* One item of a job's outbox: a text delta (maybe with the token's logprobs), a choice's
   result (prompt logprobs, embedding) or its finish. */
struct server_event {
    struct server_event *next;
    int choice;
    bool finish;
    int n_tokens;                 /* tokens sampled with this delta (0 or 1) */
    bool has_lp;
    int32_t token;
    float logprob;
    int n_top;
    int32_t top_ids[REQUEST_MAX_LOGPROBS];
    float top_lps[REQUEST_MAX_LOGPROBS];
    /* finish */
    enum request_finish reason;
    int32_t stop_token;
    int n_prompt, n_cached, n_generated;
    int n_tier;                   /* of the cached tokens, loaded from the KV tier */
    int n_kv_saved;               /* kv_save: prompt tokens saved for a decode server */
    uint64_t kv_saved_hash[2];    /* ... the last saved block's prefix hash (lo, hi) */
    uint64_t kv_ticket;           /* ... written once server_gen_tier_wait(ticket) returns */
    char *stop_reason;            /* points into the event's own storage, or NULL */
    char *error;                  /* likewise */
    /* a result event (just before its choice's finish; points into its own storage):
       the prompt tokens' logprobs (echo) or the embedding */
    struct server_prompt_lp *plp; /* (n_plp) or NULL */
    int n_plp;
    float *emb;                   /* (n_emb) or NULL */
    int n_emb;
    size_t len;                   /* text bytes */
    char text[];                  /* (len + 1) */
};

/* Cap on a streamed job's outbox in bytes (0: none) and the seconds it may stay paused
   before it is aborted (0: forever); from the next event on. */
void server_gen_set_stream_limits(struct server_gen *g, size_t buffer, double stall_timeout);

/* Starts the engine thread, which waits for server_gen_load and then loads the model
   from p (copied; strings borrowed). */
int server_gen_start(struct server_gen **out, const struct engine_params *p,
                     struct weld_err *e);
void server_gen_load(struct server_gen *g);
/* Refuse new jobs, abort every queued and running one (their choices finish "abort"),
   join the engine thread. Jobs stay valid for their HTTP threads. NULL-safe. */
void server_gen_halt(struct server_gen *g);
/* Halt if needed, free the engine and g. No HTTP thread may hold a job. NULL-safe. */
void server_gen_free(struct server_gen *g);

enum server_gen_state server_gen_state(struct server_gen *g, char *msg, size_t cap);
/* The engine, for immutable things only (tokenizer, model, sched config), once READY. */
const struct engine *server_gen_engine(struct server_gen *g);

/* Queue a job. p and prompts are borrowed until server_gen_release returns. NULL with e
   filled (503) when the engine is not ready or is shutting down. */
struct server_job *server_gen_submit(struct server_gen *g, const struct request_params *p,
                                     const struct server_prompt *prompts, int n_prompts,
                                     struct server_error *e);
/* Block until the engine thread took the job: 0 when it runs, else e is filled (the engine
   refused it: 400 naming the limit, or 503 at shutdown). */
int server_gen_wait_accepted(struct server_job *j, struct server_error *e);
/* The next event (caller frees it with wfree), waiting at most timeout_ms. Returns 1 with
   *ev set, 0 on timeout, -1 when the job is over and its outbox empty. */
int server_gen_next(struct server_job *j, int timeout_ms, struct server_event **ev);
/* The job streams to socket fd: its outbox is capped (see above); id names it in logs.
   server_gen_release forgets fd, so the caller must release the job before the socket is
   closed. */
void server_gen_watch(struct server_job *j, int fd, const char *id);
/* Ask the engine thread to abort the job (a client went away). Idempotent. */
void server_gen_cancel(struct server_job *j);
/* Drop the caller's reference (waits until the job left the inbox). NULL-safe. */
void server_gen_release(struct server_job *j);

/* Copy of the metrics with the engine's last stats. */
void server_gen_metrics(struct server_gen *g, struct server_metrics *m);
void server_gen_count_http(struct server_gen *g, int status);
/* Refuse new jobs from now on (503). */
void server_gen_close(struct server_gen *g);
/* Wait until no job is queued or running, at most timeout seconds; true if idle. */
bool server_gen_drain(struct server_gen *g, double timeout);

/* Wait until the KV blocks of a finished kv_save request are written (its event's
   kv_ticket): from an HTTP thread, before it hands out the transfer handle. */
void server_gen_tier_wait(struct server_gen *g, uint64_t ticket);

#endif
