/*
 * sched - the continuous-batching scheduler: which sequences run in each step, how many
 * tokens each, and with which KV blocks.
 *
 * What it is. Plain C data structures with no model code. The scheduler owns a KV block
 * manager (kv_manager.h) and a set of sequences; sched_step turns their state into a step
 * plan (the entries of one forward pass plus the block copies to do before it); the
 * engine runs the forward pass, calls sched_step_done, samples, and reports back with
 * sched_append_token / sched_finish / sched_fork. One call sequence per step:
 *
 *   sched_step(s, &plan)          plan entries, copies, preempted and failed sequences
 *   (copies, then forward pass over plan.entries)
 *   sched_step_done(s)            the planned tokens are now computed (prefix cache fed);
 *                                 sched_step_cancel(s) instead if the forward pass failed
 *   for entries with sample: sample; sched_fork (n > 1) / sched_append_token / sched_finish
 *
 * Sequence. Its token list is prompt + generated so far; positions equal token indices.
 * n_computed tokens have KV in its block table. States: WAITING (no blocks; new, or
 * preempted and waiting to recompute), RUNNING (admitted, holds blocks), FAILED (can never
 * fit; blocks released, the engine must finish it). A sequence is released by
 * sched_finish or sched_abort, whatever its state; the pointer is invalid afterwards.
 *
 * Order. Both queues are kept sorted by the policy key: FCFS by arrival (the order of
 * sched_add; a fork inherits its parent's), priority by (priority, arrival), lower first.
 * A preempted sequence keeps its key, so under FCFS it goes back to the front of the
 * waiting queue. The last running sequence in key order is the "newest" (lowest priority).
 *
 * A step, with budget = max_num_batched_tokens:
 *   1. running sequences whose prompt is done decode one token each, in key order;
 *   2. running sequences in the middle of their prefill continue with a chunk of
 *      min(remaining, budget left) tokens;
 *   3. if nothing was preempted in this step, waiting sequences are admitted in key order
 *      while running < max_num_seqs and budget is left: a prefix-cache hit skips its full
 *      blocks (never the whole token list; none for a no_prefix_hit sequence), then a
 *      chunk of min(rest, budget left, its max_chunk) tokens. With a second tier
 * (sched_config.tier) the full blocks after the pool's hit are offered to it once
 *      the sequence is known to fit without them; the leading ones it holds are loaded
 * instead of computed (they take blocks but no token budget). While the tier reads
 *      them the sequence waits, first in line, and the tier starts reading for the next
 *      few in line.
 *      Admission stops at the first sequence whose chunk's blocks are not available (no
 *      preemption for admission: head-of-line order is kept), and at the first one whose
 *      next block after its cache hit is one that a running sequence is still to compute
 *      (same tokens from the start, same salt): it waits for that block to be cached
 *      rather than compute it a second time (counted in n_prefix_waits).
 *   When a running sequence in 1-2 cannot get its blocks, the newest running sequence is
 *   preempted by recompute (its blocks released to the prefix cache, n_computed reset, put
 *   back in the waiting queue, its plan entry if any removed and its tokens refunded,
 *   counted, and logged with log_info as a summary at most once a second, not per event)
 *   and the allocation is retried. If the sequence that
 *   needs blocks is itself the newest, it is preempted; if it is the only running one, it
 *   can never fit: it becomes FAILED and is listed in the plan's failed list. So does a
 *   waiting sequence that has outgrown the whole pool (a fork preempted after appending)
 *   when it reaches the head of the queue.
 * A step's total tokens never exceed max_num_batched_tokens, and a chunk never crosses
 * max_model_len. An entry samples when its chunk reaches the end of the known tokens.
 *
 * Pausing. sched_pause marks a sequence (any state) as paused: it keeps its state and its
 * blocks but takes no part in plans (no decode, no prefill chunk, no admission) and does
 * not count against max_num_seqs, until sched_pause(..., false). Its blocks are the first
 * to go when blocks run short: a running sequence that needs blocks, or a waiting one that
 * cannot be admitted for lack of them, preempts the newest paused running sequence before
 * anything else (it recomputes after it is resumed, helped by the prefix cache). The
 * server pauses a stream whose client stopped reading.
 *
 * Rejection. sched_add refuses (WELD_ERR_LIMIT, message naming the limit) a token list
 * longer than max_model_len or needing more blocks than the whole pool.
 *
 * Deliberately not done: swapping to host memory, preemption for admission, multi-step
 * lookahead, fairness between sequences beyond the key order
 * (if running decodes outnumber the token budget, the last ones in key order wait until
 * earlier ones finish: keep max_num_batched_tokens >= max_num_seqs, forks included).
 */
#ifndef WELD_ENGINE_SCHED_H
#define WELD_ENGINE_SCHED_H

#include "core/err.h"
#include "engine/kv_manager.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum sched_policy { SCHED_POLICY_FCFS = 0, SCHED_POLICY_PRIORITY };

enum sched_state { SCHED_WAITING = 0, SCHED_RUNNING, SCHED_FAILED };

/* A second tier of KV blocks (the engine's KV tier) asked at admission, after the pool's
   own prefix hit: lookup gets the keys of the blocks that follow the hit (up to the last
   full block before the last token) and returns how many leading ones it holds, ready
   to load (0: none, or loading them would cost more than computing them), or -1 while it
   is still reading them: then the sequence stays first in line, nothing behind it is
   admitted in this step (counted in n_tier_waits), and the tier is asked to start reading
   for the next few in line (take false: nothing is taken, the answer is ignored). When
   the sequence is admitted, place gets the physical blocks those loads must go to before
   the next forward pass. A lookup (take) not followed by place is forgotten. */
struct sched_tier {
    void *u;
    int (*lookup)(void *u, const struct kvm_hash *keys, int n, bool take);
    void (*place)(void *u, const int32_t *blocks, int n);
};

struct sched_config {
    struct kvm_config kv;       /* the block pool */
    struct sched_tier tier;     /* lookup NULL: no second tier */
    int max_num_batched_tokens; /* >= 1: tokens per step (default 2048) */
    int max_num_seqs;           /* >= 1: running sequences (default 256) */
    int max_model_len;          /* >= 1: tokens per sequence, prompt + generated */
    enum sched_policy policy;
};

/* Read-only to callers; written by the scheduler. */
struct sched_seq {
    uint64_t id;            /* the caller's id, reported back unchanged */
    void *user;             /* the caller's pointer (its request), never dereferenced */
    int priority;           /* lower runs first under SCHED_POLICY_PRIORITY */
    uint64_t arrival;       /* order of sched_add; forks inherit the parent's */
    enum sched_state state;
    int32_t *tokens;        /* (n_tokens) prompt then generated tokens */
    int n_tokens;
    int n_prompt;           /* tokens given to sched_add */
    int n_computed;         /* == table.n_computed once stepped: tokens with KV */
    int n_cached;           /* tokens served from the prefix cache at the first admission
                               (pool and second tier) */
    int n_tier_cached;      /* of them, loaded from the second tier */
    int n_preemptions;      /* times this sequence was preempted */
    int n_draft;            /* drafted tokens after tokens[n_tokens] (sched_set_draft) */
    int n_planned_draft;    /* of them, in the latest plan (sched_accept_draft may take
                               that many) */
    bool paused;            /* sched_pause: left out of plans, blocks kept */
    struct kvm_table table; /* its physical blocks */
    /* private */
    int cap_tokens;
    uint64_t serial;        /* creation order: the last tie-break of the key */
    int queue_index;        /* index in its state's array */
    bool admitted_once;
    bool no_prefix_hit;     /* sched_seq_params */
    int max_chunk;
};

struct sched_seq_params {
    uint64_t id;
    void *user;
    int priority;
    const int32_t *tokens;  /* (n_tokens) the prompt, copied; n_tokens >= 1 */
    int n_tokens;
    const void *cache_salt; /* optional (NULL/0): requests with different salts never share */
    size_t cache_salt_len;
    bool no_prefix_hit;     /* compute every token, never take a prefix-cache hit (its
                               blocks still feed the cache): the caller needs every
                               position's logits (prompt logprobs) */
    int max_chunk;          /* > 0: at most this many tokens of it per step (bounds the
                               logits rows of such a caller); 0: no limit */
};

/* One sequence's work in a step: tokens[first, first + n_tokens) at positions first... */
struct sched_entry {
    struct sched_seq *seq;  /* NULL if the sequence was aborted after sched_step */
    int first;              /* index of the first token == its position */
    int n_tokens;           /* >= 1 */
    bool sample;            /* first + n_tokens == seq->n_tokens: logits of the last token */
    int n_draft;            /* > 0: a speculative decode: its last known token then n_draft
                               drafted ones (seq->tokens[n_tokens ..], sched_set_draft),
                               every row sampled in order; sample is set */
    const int32_t *blocks;  /* (n_blocks) seq->table.blocks: covers the chunk */
    int n_blocks;
};

/* Arrays owned by the scheduler, valid until the next sched_step (and seq->tokens only
   until that sequence's next sched_append_token). */
struct sched_plan {
    struct sched_entry *entries; /* (n_entries) decodes first, then prefill chunks */
    int n_entries;
    int n_tokens;                /* sum of entries' n_tokens <= max_num_batched_tokens */
    const struct kvm_copy *copies; /* (n_copies) block copies to do, in order, first */
    int n_copies;
    struct sched_seq **preempted; /* (n_preempted) sent back to WAITING in this step */
    int n_preempted;
    struct sched_seq **failed;   /* (n_failed) now FAILED: cannot fit even alone */
    int n_failed;
};

struct sched_stats {
    int n_running, n_waiting, n_failed;
    int n_paused;               /* paused sequences, in any state */
    uint64_t n_steps;
    uint64_t n_preemptions;
    uint64_t n_added, n_finished, n_aborted, n_rejected;
    uint64_t n_prefix_waits;    /* steps admission waited for a prefix being computed */
    uint64_t tier_lookups;      /* admissions that asked the second tier */
    uint64_t tier_query_tokens; /* tokens past the pool's hit offered to it */
    uint64_t tier_hit_tokens;   /* of those, loaded from it */
    uint64_t n_tier_waits;      /* admissions put off while the tier read their blocks */
    struct kvm_stats kv;
};

struct sched;

/* max_num_batched_tokens 2048, max_num_seqs 256, max_model_len 2048, FCFS, kv defaults
   (n_blocks still 0: must be set). */
struct sched_config sched_config_default(void);
int sched_config_check(const struct sched_config *c, struct weld_err *e);

int sched_create(struct sched **out, const struct sched_config *c, struct weld_err *e);
/* NULL-safe; releases every sequence still held. */
void sched_free(struct sched *s);

/* Queue a new sequence (WAITING). WELD_ERR_LIMIT naming the limit when its prompt can never
   fit (longer than max_model_len, or more blocks than the pool); WELD_ERR_INVALID_ARG for
   n_tokens < 1; WELD_ERR_NOMEM. *out stays valid until sched_finish/sched_abort. */
int sched_add(struct sched *s, const struct sched_seq_params *p, struct sched_seq **out,
              struct weld_err *e);

/* Plan the next step (see the design above); plan may come back with no entries (nothing
   runnable). Clears the manager's copy queue into the plan. Must not be called while a
   previous plan awaits sched_step_done (WELD_ASSERT). */
int sched_step(struct sched *s, struct sched_plan *plan, struct weld_err *e);

/* The last plan's tokens are computed: advances n_computed and feeds the prefix cache. */
int sched_step_done(struct sched *s, struct weld_err *e);
/* The forward pass failed: nothing of the last plan counts as computed and nothing enters
   the prefix cache (blocks whose KV was never written must not be shared); the blocks the
   plan reserved stay with their sequences. Use instead of sched_step_done. */
void sched_step_cancel(struct sched *s);

/* Append a sampled token to a RUNNING sequence whose tokens are all computed. WELD_ERR_LIMIT
   when it already holds max_model_len tokens (the engine should finish it with reason
   "length" before that); WELD_ERR_INVALID_ARG in another state. */
int sched_append_token(struct sched *s, struct sched_seq *seq, int32_t token,
                       struct weld_err *e);

/* n > 1: a new RUNNING sequence with parent's tokens, n_prompt, priority and arrival, sharing
   all its blocks (copy-on-write). parent must be RUNNING with all tokens computed (right
   after the step that sampled it, before appending its own token). May take running above
   max_num_seqs. */
int sched_fork(struct sched *s, struct sched_seq *parent, uint64_t id, void *user,
               struct sched_seq **child, struct weld_err *e);

/* Speculative decoding. sched_set_draft gives a running sequence whose tokens are all
   computed but the last (a decode) k drafted continuations, kept after its tokens (not
   counted in n_tokens). The next sched_step plans it as one entry of 1 + k tokens (fewer
   when the budget or max_model_len is short, none when their KV blocks are not free: a
   draft never preempts anything) with n_draft set; sched_step_done commits only its known
   token, so no drafted position enters the prefix cache. After sampling its rows in order
   the caller takes the drafts that matched with sched_accept_draft (their KV is already
   computed and is committed now: full blocks enter the cache with the accepted tokens) and
   appends the first token that did not (sched_append_token). A draft not taken is
   forgotten at the next sched_step; its positions' KV is overwritten when computed again.
   k = 0 clears a draft. WELD_ERR_INVALID_ARG when seq is not such a decode. */
int sched_set_draft(struct sched *s, struct sched_seq *seq, const int32_t *draft, int k,
                    struct weld_err *e);
/* Append the first n drafted tokens of seq's last planned speculative entry as computed
   (n <= that entry's n_draft; the sequence's tokens all computed before). */
int sched_accept_draft(struct sched *s, struct sched_seq *seq, int n, struct weld_err *e);

/* Release a sequence: its blocks go to the prefix cache at once (last block first), the
   struct is freed. sched_finish counts a finished sequence, sched_abort an aborted one;
   either works in any state, and clears the sequence from the latest plan's entries
   (entry->seq = NULL) until the next sched_step, before or after sched_step_done, so a
   caller walking the entries never meets a released sequence. The plan's preempted and
   failed lists are not cleared. NULL-safe for seq. */
void sched_finish(struct sched *s, struct sched_seq *seq);
void sched_abort(struct sched *s, struct sched_seq *seq);

/* Pause (true) or resume (false) a sequence in any state; see "Pausing" above. Takes
   effect at the next sched_step. Idempotent. */
void sched_pause(struct sched *s, struct sched_seq *seq, bool paused);

struct kvm *sched_kvm(struct sched *s);
const struct sched_config *sched_get_config(const struct sched *s);
void sched_stats_get(const struct sched *s, struct sched_stats *st);
/* Nothing waiting or running (failed sequences not yet finished count as work). */
bool sched_idle(const struct sched *s);

/* For tests: full invariant check (every block's refcount equals the number of tables
   holding it, queue order and states, kvm_check). WELD_ERR_INTERNAL on the first
   violation. */
int sched_check(const struct sched *s, struct weld_err *e);

#endif
