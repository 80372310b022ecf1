/*
 * engine - the offline serving loop: requests in, a scheduler step, one forward pass,
 * sampling, outputs through callbacks.
 *
 *     struct engine_params ep = engine_params_default();
 *     ep.model_path = "model.gguf";
 *     engine_create(&eng, &ep, &err);
 *     engine_add_request(eng, &req_params, &callbacks, &id, &err);   // any number
 *     while (engine_has_work(eng))
 *         engine_step(eng, &err);          // callbacks fire inside
 *     engine_free(eng);
 *
 * What it owns: the model (loaded from model_path, or borrowed), its tokenizer, a runner
 * (the backend engine_params.tuning names, exec/runner.h) whose KV pool has exactly the
 * scheduler's n_blocks blocks, and the scheduler (engine/sched.h) with its KV block
 * manager. The backend keeps no per-sequence state: every step's batch carries each
 * sequence's block table and the copy-on-write block copies the manager queued.
 *
 * A step: sched_step plans (decodes first, then prefill chunks; preemption, failures);
 * the plan's entries become one batch (seq_id = entry index, tokens from the sequence,
 * pos = first, its block table); runner_forward computes one logits row per entry;
 * sched_step_done marks the tokens computed (feeding the prefix cache); then each entry
 * whose chunk reached the end of its known tokens samples with its own sampler
 * (request_seq_step), and the token is appended (sched_append_token) or the sequence is
 * released (sched_finish). n > 1: the prompt runs once as sequence 0; when it first
 * samples, sequences 1..n-1 are forked from it (sched_fork: shared blocks, copy-on-write)
 * and each samples its first token from the same logits row with its own seed.
 * Requests that read the prompt (request.h): an embedding request asks the step that
 * reaches its last token for that row's final hidden state (runner_forward_hidden) and
 * finishes with it instead of sampling; one with prompt_logprobs runs its prompt chunks
 * with a logits row per token (at most ENGINE_PROMPT_LP_CHUNK tokens a step), never from
 * the prefix cache (sched no_prefix_hit), scoring each prompt token as its chunk ends; a
 * mean-pooled embedding runs its prompt the same way, adding up every row's hidden state.
 *
 * Determinism: at temperature 0 a request's tokens do not depend on what else runs, how
 * its prompt was chunked or whether its prefix came from the cache, because the backend
 * guarantees per-sequence logits independent of all three (exec/batch.h).
 *
 * Errors: engine_add_request refuses a bad request (the message names the field, or the
 * limit a prompt can never fit) and nothing is queued. A sequence the scheduler marks as
 * FAILED finishes with reason "error". A failed forward pass finishes every request of
 * that step with "error" and engine_step returns the status.
 *
 * Pausing: engine_pause leaves a request out of the steps (its sequences keep their KV
 * blocks, see "Pausing" in sched.h) until engine_resume; the server pauses a stream whose
 * client stopped reading. engine_has_work is false when every live request is paused.
 *
 * Not thread-safe: one thread calls everything; callbacks run inside engine_step (they may
 * call engine_abort, which takes effect at the end of the step, but not engine_add_request
 * or engine_step: queue new work and add it after engine_step returns).
 */
#ifndef WELD_ENGINE_ENGINE_H
#define WELD_ENGINE_ENGINE_H

#include "core/err.h"
#include "engine/request.h"
#include "engine/sched.h"
#include "kvtier/kvtier.h"
#include "spec/spec.h"
#include "exec/tuning.h"
#include "format/dtype.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct model;
struct tokenizer;
struct engine;

struct engine_params {
    const char *model_path;         /* loaded by the engine, or: */
    const struct model *model;      /* borrowed (must outlive the engine) */
    const struct tokenizer *tokenizer; /* borrowed; NULL: loaded from the model (a model
                                          without one still serves token-id prompts) */
    int max_num_seqs;               /* running sequences, default 64 */
    int max_num_batched_tokens;     /* tokens per step, default 2048 */
    int max_model_len;              /* prompt + output per sequence; 0: model's context */
    uint64_t kv_cache_memory;       /* bytes for the KV pool; 0: automatic (see below) */
    int kv_blocks;                  /* > 0: exact pool size in blocks (overrides memory) */
    int block_size;                 /* tokens per KV block, default 16 */
    enum weld_dtype kv_dtype;       /* DT_F16 (default), DT_BF16, DT_F32, DT_Q8_0 */
    bool prefix_caching;            /* default true */
    enum sched_policy policy;       /* default FCFS */
    uint64_t seed;                  /* mixed into the seed of requests without one */
    int n_threads;                  /* forward-pass workers; 0: backend_cpu_default_threads */
    struct exec_tuning tuning;      /* backend, executor, kernel settings; zero: automatic
                                       (exec/tuning.h) */
    bool quiet;                     /* do not log the pool size at start */
    struct spec_config spec;        /* speculative decoding (spec/spec.h); method SPEC_NONE:
                                       off (the default) */
    struct spec_proposer *proposer; /* borrowed: a proposer of the caller's instead of one
                                       made from spec (tests, benchmarks); spec.num_tokens
                                       still bounds its guesses */
    bool spec_always;               /* guess in every step, whatever the fitted step cost
                                       says (tests, benchmarks of the machinery) */
    bool jump_forward;              /* constrained requests draft the text their grammar
                                       forces, verified like guesses (default true) */
    /* the KV tier (engine/offload.h, kvtier/): blocks evicted from the pool are saved, and
       prompts load them back instead of computing them; at exit the pool's cached blocks
       are saved too */
    const char *kv_offload_dir; /* --kv-offload-dir: a local directory, or NULL */
    uint64_t kv_offload_bytes;  /* --kv-offload-size: its budget; 0: 16 GiB */
    const char *kv_store;       /* --kv-store: redis://HOST[:PORT][/DB] or unix:///PATH */
    bool kv_prefault;           /* touch every page of the KV pool at start (a decode
                                       server: loaded blocks land in pages never written,
                                       and a fault per page in the middle of a step stalls
                                       every running decode); default: the first 256 MiB */
    bool kv_writes_urgent;      /* answers wait for the tier's writes (a prefill server's
                                   handoffs): its writer keeps the engine's priority; else
                                   it runs at nice 10, so spills only take CPU the steps
                                   leave and do not stretch them */
};

struct engine_stats {
    uint64_t requests_added, requests_finished, requests_aborted, requests_rejected;
    uint64_t requests_failed;       /* finished with "error" */
    uint64_t prompt_tokens;         /* prompt tokens of added requests */
    uint64_t cached_tokens;         /* prompt tokens served from the prefix cache */
    uint64_t generated_tokens;      /* sampled tokens, all sequences */
    uint64_t computed_tokens;       /* tokens the forward passes computed (incl. recompute) */
    uint64_t steps, preemptions;
    uint64_t cache_queries;         /* prefix lookups (kvm lookups) */
    uint64_t cache_query_tokens, cache_hit_tokens;
    uint64_t evictions;
    uint64_t cow_copies;            /* block copies queued by copy-on-write (n > 1) */
    int kv_blocks, kv_blocks_used, kv_blocks_cached, kv_blocks_free, block_size;
    double kv_usage;                /* used / total blocks */
    size_t kv_bytes;                /* bytes of the KV pool */
    int running, waiting;           /* sequences (paused ones included) */
    int paused;                     /* requests paused (engine_pause) */
    double t_forward;               /* seconds inside forward passes */
    /* speculative decoding (vLLM's spec_decode_* counters) */
    uint64_t spec_drafts;                       /* speculative entries run */
    uint64_t spec_draft_tokens;                 /* tokens proposed and verified */
    uint64_t spec_accepted_tokens;              /* of them, accepted */
    uint64_t spec_accepted_at[SPEC_MAX_TOKENS]; /* accepted at draft position i */
    uint64_t spec_asked;                        /* guesses asked of the proposer */
    uint64_t spec_computed; /* positions a model proposer ran through its model */
    uint64_t spec_failures; /* its forward passes that failed */
    double t_propose;                           /* seconds inside the proposer */
    /* constrained decoding (request_params.grammar), of finished requests */
    uint64_t mask_count;                        /* token masks computed */
    double t_mask;                              /* seconds computing them */
    uint64_t forced_draft_tokens;               /* jump-forward: tokens drafted from forced text */
    uint64_t forced_accepted_tokens;            /* ... and taken by the step that verified them */
    /* the KV tier (kv_offload_dir / kv_store), tier = file, store */
    bool tier_on;
    uint64_t tier_query_tokens; /* prompt tokens past the pool's hit offered to it */
    uint64_t tier_hit_tokens;   /* of them, loaded instead of computed */
    uint64_t tier_blocks_loaded, tier_blocks_saved;
    double tier_load_seconds;         /* copying loaded blocks into the pool */
    uint64_t kv_handoffs;             /* kv_save requests whose blocks were saved */
    uint64_t kv_handoff_tokens;       /* their prompt tokens saved */
    double kv_handoff_seconds;        /* the engine's part of saving them (copied out of the
                                       pool and queued; the writes run on) */
    uint64_t kv_remote_prefills;      /* requests that came with a prefill worker's handle */
    uint64_t kv_remote_tokens;        /* the tokens those handles said were saved */
    uint64_t kv_remote_loaded_tokens; /* of their prompts, loaded from the tier */
    struct kvtier_stats tier;
};

/* Defaults above; the automatic pool size is min(50% of (MemAvailable - weights), what
   max_num_seqs sequences of max_model_len need), at least one full sequence. A draft
   model's or MTP layer's KV pool has a block per engine block: its bytes per block and
   its weights count in the same budget (--kv-cache-memory too). */
struct engine_params engine_params_default(void);
/* That automatic size in bytes: seq_bytes (the blocks of one max_model_len sequence) times
   max_num_seqs, capped by half of what MemAvailable leaves beside the weights (a quarter
   of MemAvailable when the weights exceed it; 1 GiB when it is unknown, 0), never below
   seq_bytes. The pool's pages beyond the first 256 MiB fault in on first use (exec/kv.h),
   so a worst-case size costs start-up time and memory only as far as it is used. */
uint64_t engine_kv_auto_bytes(uint64_t seq_bytes, int max_num_seqs, uint64_t mem_available,
                              uint64_t weight_bytes);

int engine_create(struct engine **out, const struct engine_params *p, struct weld_err *e);
/* Wait until the KV blocks a kv_save request handed to the tier (request_result.kv_ticket)
   are written. The one call safe from any thread while the engine runs (it touches only
   the tier's queue). */
void engine_tier_wait(const struct engine *eng, uint64_t ticket);
/* NULL-safe. Unfinished requests are dropped without callbacks. */
void engine_free(struct engine *eng);

/* Queue a request; *id (may be NULL) gets its id. Errors leave nothing queued. */
int engine_add_request(struct engine *eng, const struct request_params *p,
                       const struct request_callbacks *cb, uint64_t *id, struct weld_err *e);
/* Abort a request at any time: its blocks are freed at once (at the end of the current
   step when called from a callback) and each unfinished sequence gets on_finish "abort".
   WELD_ERR_NOT_FOUND for an unknown or finished id. */
int engine_abort(struct engine *eng, uint64_t id, struct weld_err *e);
/* Pause a request: its sequences (and any it forks later) take no part in steps until
   engine_resume; they keep their KV blocks unless others need them (then they are
   preempted and recomputed after the resume). Callable from a callback (it takes effect at
   the next step). Idempotent. WELD_ERR_NOT_FOUND for an unknown, finished or aborted id. */
int engine_pause(struct engine *eng, uint64_t id, struct weld_err *e);
int engine_resume(struct engine *eng, uint64_t id, struct weld_err *e);
/* One scheduler step + forward pass + sampling. Does nothing when idle. */
int engine_step(struct engine *eng, struct weld_err *e);
/* Some live request is not paused. */
bool engine_has_work(const struct engine *eng);
/* True once the backend is lost for good (a rank of a tensor-parallel engine died or
   hung): every later step fails its sequences at once; the caller should stop. */
bool engine_broken(const struct engine *eng);
/* Several processes: this rank's communication counters (comm.h), reset if asked; false
   in one process. */
struct comm_stats;
bool engine_comm_stats(const struct engine *eng, struct comm_stats *out, bool reset);
void engine_stats_get(const struct engine *eng, struct engine_stats *st);

const struct model *engine_model(const struct engine *eng);
const struct tokenizer *engine_tokenizer(const struct engine *eng);
const struct sched_config *engine_sched_config(const struct engine *eng);
/* For tests: sched_check plus "the engine's sequence count matches the scheduler's". */
int engine_check(const struct engine *eng, struct weld_err *e);

/* "f16" / "bf16" / "f32" / "q8_0" -> dtype; WELD_ERR_INVALID_ARG naming the value. */
int engine_parse_kv_dtype(const char *s, enum weld_dtype *out, struct weld_err *e);

#endif
