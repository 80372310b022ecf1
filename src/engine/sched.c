/*
 * sched - see sched.h for the step rules, the ordering key and the preemption policy.
 *
 * Data layout.
 *   running, waiting, failed: arrays of sequence pointers (struct seq_queue), running and
 *     waiting kept sorted by the policy key (priority if the policy uses it, then arrival,
 *     then serial), failed in the order sequences failed. Each sequence is in exactly the
 *     array of its state and knows its index there (queue_index), so removal is a memmove
 *     plus index fix-up: O(n) in the number of sequences, which is bounded by what fits in
 *     the pool and small next to a forward pass.
 *   Plan storage (entries, preempted, plan_failed): arrays sized to hold every sequence
 *     the scheduler has; they grow only at the start of sched_step, so a plan's arrays stay
 *     put while the caller walks them and forks or releases sequences. Apart from that,
 *     sched_step allocates only block-table arrays (inside the manager). The plan's copies
 *     point straight into the manager's copy queue, cleared at the start of the next step.
 *     The latest plan's entries stay known (n_plan_entries) until the next step, so a
 *     released sequence is cleared from them.
 *
 * Invariants (sched_check): a waiting sequence holds no blocks and has n_computed 0; a
 * running one holds blocks covering at least n_computed tokens; a failed one holds none;
 * every block's refcount equals the number of tables holding it; queues sorted.
 *
 * The per-step flow is in sched_step: plan_running (decodes, then prefill continuations,
 * with preemption) and plan_admit (waiting sequences). sched_step_done commits the planned
 * tokens to the block tables, which is when their full blocks enter the prefix cache:
 * never before their KV has been written, so a sequence admitted in the same step cannot
 * hit blocks that are only being computed in that step. Instead, admission waits for them
 * (prefix_in_flight): when the first block a waiting sequence would compute after its
 * cache hit is, token for token and with the same salt, a block that a running sequence
 * has not computed yet but will, the queue stops there until that block is cached. Without
 * this, requests sharing a long prefix that arrive together would each recompute it.
 */
#include "engine/sched.h"

#include "core/alloc.h"
#include "core/log.h"
#include "core/progress.h"

#include <limits.h>
#include <string.h>

struct seq_queue {
    struct sched_seq **v; /* (cap) */
    int n, cap;
};

struct sched {
    struct sched_config cfg;
    struct kvm *kvm;
    struct seq_queue running, waiting, failed;
    uint64_t next_arrival, next_serial;
    /* plan storage, each (cap_plan) */
    struct sched_entry *entries;
    struct sched_seq **preempted, **plan_failed;
    int cap_plan;
    int n_plan_entries;      /* entries of the latest plan, valid until the next step */
    struct sched_plan *plan; /* the caller's plan while it awaits sched_step_done */
    bool plan_pending;
    uint64_t n_steps, n_preemptions, n_added, n_finished, n_aborted, n_rejected;
    uint64_t n_prefix_waits;
    uint64_t tier_lookups, tier_query_tokens, tier_hit_tokens, n_tier_waits;
    bool tier_blocked;          /* this step's admission waits for the tier (plan_admit) */
    int tier_blocked_at;        /* at that waiting index */
    struct kvm_hash *tier_keys; /* (cap_tier_keys) admission scratch */
    int cap_tier_keys;
    int n_paused;            /* sequences with paused set, any state */
    /* preemption log (at most one line per SCHED_PREEMPT_LOG_S seconds) */
    double preempt_log_t;    /* time_now() of the last line; 0: none yet */
    uint64_t preempt_logged; /* n_preemptions when that line was written */
};

#define SCHED_PREEMPT_LOG_S 1.0
#define SCHED_TIER_LOOKAHEAD 8 /* sequences behind a waiting one whose reads start */
static void preempt_log(struct sched *s, const struct sched_seq *seq, int n_blocks, bool flush);

/* ---- queues --------------------------------------------------------------------------- */

static int seq_cmp(const struct sched *s, const struct sched_seq *a, const struct sched_seq *b)
{
    if (s->cfg.policy == SCHED_POLICY_PRIORITY && a->priority != b->priority)
        return a->priority < b->priority ? -1 : 1;
    if (a->arrival != b->arrival)
        return a->arrival < b->arrival ? -1 : 1;
    return a->serial < b->serial ? -1 : a->serial > b->serial;
}

static struct seq_queue *queue_of(struct sched *s, enum sched_state st)
{
    return st == SCHED_RUNNING ? &s->running : st == SCHED_WAITING ? &s->waiting : &s->failed;
}

static void queue_reindex(struct seq_queue *q, int from)
{
    for (int i = from; i < q->n; i++)
        q->v[i]->queue_index = i;
}

/* Insert in key order (after equal keys); sorted = false appends. Capacity is ensured. */
static void queue_insert(struct sched *s, struct seq_queue *q, struct sched_seq *seq,
                         bool sorted)
{
    WELD_ASSERT(q->n < q->cap);
    int lo = 0, hi = q->n;
    if (!sorted)
        lo = q->n;
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        if (seq_cmp(s, q->v[mid], seq) <= 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    memmove(q->v + lo + 1, q->v + lo, (size_t)(q->n - lo) * sizeof *q->v);
    q->v[lo] = seq;
    q->n++;
    queue_reindex(q, lo);
}

static void queue_remove(struct seq_queue *q, struct sched_seq *seq)
{
    int i = seq->queue_index;
    WELD_ASSERT(i >= 0 && i < q->n && q->v[i] == seq);
    memmove(q->v + i, q->v + i + 1, (size_t)(q->n - i - 1) * sizeof *q->v);
    q->n--;
    queue_reindex(q, i);
    seq->queue_index = -1;
}

static void seq_move(struct sched *s, struct sched_seq *seq, enum sched_state to)
{
    queue_remove(queue_of(s, seq->state), seq);
    seq->state = to;
    queue_insert(s, queue_of(s, to), seq, to != SCHED_FAILED);
}

static int grow_ptrs(void *pp, int *cap, int want, size_t elem)
{
    if (want <= *cap)
        return WELD_OK;
    int c = *cap > 0 ? *cap : 16;
    while (c < want)
        c = c > INT_MAX / 2 ? want : c * 2;
    void *p = wrealloc(*(void **)pp, (size_t)c * elem);
    if (!p)
        return WELD_ERR_NOMEM;
    *(void **)pp = p;
    *cap = c;
    return WELD_OK;
}

/* Room for one more sequence in every queue. */
static int reserve_seq_slot(struct sched *s)
{
    int want = s->running.n + s->waiting.n + s->failed.n + 1;
    if (grow_ptrs(&s->running.v, &s->running.cap, want, sizeof(struct sched_seq *)) ||
        grow_ptrs(&s->waiting.v, &s->waiting.cap, want, sizeof(struct sched_seq *)) ||
        grow_ptrs(&s->failed.v, &s->failed.cap, want, sizeof(struct sched_seq *)))
        return WELD_ERR_NOMEM;
    return WELD_OK;
}

/* Plan arrays for every sequence held, grown only at the start of sched_step so that a
   plan's arrays never move while the caller walks them (sched_fork adds sequences then). */
static int reserve_plan(struct sched *s)
{
    int want = s->running.n + s->waiting.n + s->failed.n;
    int cap = s->cap_plan;
    if (want <= cap)
        return WELD_OK;
    int c1 = cap, c2 = cap, c3 = cap;
    if (grow_ptrs(&s->entries, &c1, want, sizeof *s->entries) ||
        grow_ptrs(&s->preempted, &c2, want, sizeof *s->preempted) ||
        grow_ptrs(&s->plan_failed, &c3, want, sizeof *s->plan_failed))
        return WELD_ERR_NOMEM;
    WELD_ASSERT(c1 == c2 && c2 == c3);
    s->cap_plan = c1;
    return WELD_OK;
}

/* ---- config, create, free ------------------------------------------------------------- */

struct sched_config sched_config_default(void)
{
    return (struct sched_config){.kv = kvm_config_default(),
                                 .max_num_batched_tokens = 2048,
                                 .max_num_seqs = 256,
                                 .max_model_len = 2048,
                                 .policy = SCHED_POLICY_FCFS};
}

int sched_config_check(const struct sched_config *c, struct weld_err *e)
{
    int rc = kvm_config_check(&c->kv, e);
    if (rc)
        return rc;
    if (c->max_num_batched_tokens < 1)
        return err_set(e, WELD_ERR_INVALID_ARG, "scheduler: max_num_batched_tokens %d < 1",
                       c->max_num_batched_tokens);
    if (c->max_num_seqs < 1)
        return err_set(e, WELD_ERR_INVALID_ARG, "scheduler: max_num_seqs %d < 1",
                       c->max_num_seqs);
    if (c->max_model_len < 1)
        return err_set(e, WELD_ERR_INVALID_ARG, "scheduler: max_model_len %d < 1",
                       c->max_model_len);
    if (c->policy != SCHED_POLICY_FCFS && c->policy != SCHED_POLICY_PRIORITY)
        return err_set(e, WELD_ERR_INVALID_ARG, "scheduler: unknown policy %d", (int)c->policy);
    return WELD_OK;
}

int sched_create(struct sched **out, const struct sched_config *c, struct weld_err *e)
{
    *out = NULL;
    int rc = sched_config_check(c, e);
    if (rc)
        return rc;
    struct sched *s = wcalloc(1, sizeof *s);
    if (!s)
        return err_set(e, WELD_ERR_NOMEM, "scheduler: out of memory");
    s->cfg = *c;
    rc = kvm_create(&s->kvm, &c->kv, e);
    if (rc) {
        wfree(s);
        return rc;
    }
    *out = s;
    return WELD_OK;
}

static void seq_destroy(struct sched *s, struct sched_seq *seq)
{
    kvm_table_free(s->kvm, &seq->table);
    wfree(seq->tokens);
    wfree(seq);
}

void sched_free(struct sched *s)
{
    if (!s)
        return;
    preempt_log(s, NULL, 0, true);
    struct seq_queue *qs[3] = {&s->running, &s->waiting, &s->failed};
    for (int k = 0; k < 3; k++) {
        for (int i = 0; i < qs[k]->n; i++)
            seq_destroy(s, qs[k]->v[i]);
        wfree(qs[k]->v);
    }
    wfree(s->entries);
    wfree(s->preempted);
    wfree(s->plan_failed);
    kvm_free(s->kvm);
    wfree(s->tier_keys);
    wfree(s);
}

/* ---- adding sequences ----------------------------------------------------------------- */

static int seq_tokens_reserve(struct sched_seq *seq, int n)
{
    return grow_ptrs(&seq->tokens, &seq->cap_tokens, n, sizeof *seq->tokens);
}

static int check_fits(struct sched *s, int n_tokens, struct weld_err *e)
{
    const struct sched_config *c = &s->cfg;
    if (n_tokens > c->max_model_len)
        return err_set(e, WELD_ERR_LIMIT,
                       "scheduler: prompt of %d tokens is longer than max_model_len %d",
                       n_tokens, c->max_model_len);
    int need = kvm_blocks_for(s->kvm, n_tokens);
    if (need > c->kv.n_blocks)
        return err_set(e, WELD_ERR_LIMIT,
                       "scheduler: prompt of %d tokens needs %d KV blocks of %d tokens but the "
                       "whole pool has %d (raise the KV cache memory or shorten the prompt)",
                       n_tokens, need, c->kv.block_size, c->kv.n_blocks);
    return WELD_OK;
}

int sched_add(struct sched *s, const struct sched_seq_params *p, struct sched_seq **out,
              struct weld_err *e)
{
    *out = NULL;
    if (p->n_tokens < 1 || !p->tokens)
        return err_set(e, WELD_ERR_INVALID_ARG, "scheduler: request %llu has %d prompt tokens",
                       (unsigned long long)p->id, p->n_tokens);
    int rc = check_fits(s, p->n_tokens, e);
    if (rc) {
        s->n_rejected++;
        err_prefix(e, "request %llu", (unsigned long long)p->id);
        return rc;
    }
    struct sched_seq *seq = wcalloc(1, sizeof *seq);
    if (!seq || reserve_seq_slot(s) || seq_tokens_reserve(seq, p->n_tokens)) {
        if (seq)
            wfree(seq->tokens);
        wfree(seq);
        return err_set(e, WELD_ERR_NOMEM, "scheduler: out of memory adding request %llu",
                       (unsigned long long)p->id);
    }
    memcpy(seq->tokens, p->tokens, (size_t)p->n_tokens * sizeof *seq->tokens);
    seq->n_tokens = seq->n_prompt = p->n_tokens;
    seq->id = p->id;
    seq->user = p->user;
    seq->priority = p->priority;
    seq->arrival = s->next_arrival++;
    seq->serial = s->next_serial++;
    seq->state = SCHED_WAITING;
    seq->no_prefix_hit = p->no_prefix_hit;
    seq->max_chunk = p->max_chunk > 0 ? p->max_chunk : INT_MAX;
    kvm_table_init(&seq->table, p->cache_salt, p->cache_salt_len);
    queue_insert(s, &s->waiting, seq, true);
    s->n_added++;
    *out = seq;
    return WELD_OK;
}

int sched_fork(struct sched *s, struct sched_seq *parent, uint64_t id, void *user,
               struct sched_seq **child, struct weld_err *e)
{
    *child = NULL;
    if (parent->state != SCHED_RUNNING || parent->n_computed != parent->n_tokens)
        return err_set(e, WELD_ERR_INVALID_ARG,
                       "scheduler: fork of request %llu: it must be running with every token "
                       "computed (%d of %d)",
                       (unsigned long long)parent->id, parent->n_computed, parent->n_tokens);
    struct sched_seq *seq = wcalloc(1, sizeof *seq);
    if (!seq || reserve_seq_slot(s) || seq_tokens_reserve(seq, parent->n_tokens))
        goto nomem;
    seq->table = (struct kvm_table){0};
    if (kvm_table_fork(s->kvm, &seq->table, &parent->table, e))
        goto nomem;
    memcpy(seq->tokens, parent->tokens, (size_t)parent->n_tokens * sizeof *seq->tokens);
    seq->n_tokens = parent->n_tokens;
    seq->n_prompt = parent->n_prompt;
    seq->n_computed = parent->n_computed;
    seq->n_cached = parent->n_cached;
    seq->admitted_once = true;
    seq->no_prefix_hit = parent->no_prefix_hit;
    seq->max_chunk = parent->max_chunk;
    seq->id = id;
    seq->user = user;
    seq->priority = parent->priority;
    seq->arrival = parent->arrival;
    seq->serial = s->next_serial++;
    seq->state = SCHED_RUNNING;
    queue_insert(s, &s->running, seq, true);
    s->n_added++;
    *child = seq;
    return WELD_OK;
nomem:
    if (seq)
        wfree(seq->tokens);
    wfree(seq);
    return err_set(e, WELD_ERR_NOMEM, "scheduler: out of memory forking request %llu",
                   (unsigned long long)parent->id);
}

int sched_append_token(struct sched *s, struct sched_seq *seq, int32_t token,
                       struct weld_err *e)
{
    if (seq->state != SCHED_RUNNING || seq->n_computed != seq->n_tokens)
        return err_set(e, WELD_ERR_INVALID_ARG,
                       "scheduler: append to request %llu: it must be running with every "
                       "token computed (%d of %d)",
                       (unsigned long long)seq->id, seq->n_computed, seq->n_tokens);
    if (seq->n_tokens >= s->cfg.max_model_len)
        return err_set(e, WELD_ERR_LIMIT,
                       "scheduler: request %llu already holds max_model_len %d tokens",
                       (unsigned long long)seq->id, s->cfg.max_model_len);
    if (seq_tokens_reserve(seq, seq->n_tokens + 1))
        return err_set(e, WELD_ERR_NOMEM, "scheduler: out of memory growing request %llu",
                       (unsigned long long)seq->id);
    seq->tokens[seq->n_tokens++] = token;
    seq->n_draft = seq->n_planned_draft = 0; /* what was drafted after it is stale */
    return WELD_OK;
}

int sched_set_draft(struct sched *s, struct sched_seq *seq, const int32_t *draft, int k,
                    struct weld_err *e)
{
    (void)s;
    seq->n_draft = 0;
    if (k <= 0)
        return WELD_OK;
    if (seq->state != SCHED_RUNNING || seq->n_computed != seq->n_tokens - 1)
        return err_set(e, WELD_ERR_INVALID_ARG,
                       "scheduler: draft for request %llu: it must "
                       "be a running decode (%d of %d tokens computed)",
                       (unsigned long long)seq->id, seq->n_computed, seq->n_tokens);
    if (seq_tokens_reserve(seq, seq->n_tokens + k))
        return err_set(e, WELD_ERR_NOMEM, "scheduler: out of memory for request %llu's draft",
                       (unsigned long long)seq->id);
    memcpy(seq->tokens + seq->n_tokens, draft, sizeof(int32_t) * (size_t)k);
    seq->n_draft = k;
    return WELD_OK;
}

int sched_accept_draft(struct sched *s, struct sched_seq *seq, int n, struct weld_err *e)
{
    if (n <= 0)
        return WELD_OK;
    if (seq->state != SCHED_RUNNING || seq->n_computed != seq->n_tokens ||
        n > seq->n_planned_draft || s->plan_pending)
        return err_set(e, WELD_ERR_INVALID_ARG,
                       "scheduler: accept %d drafted tokens of "
                       "request %llu: it holds %d from its last step",
                       n, (unsigned long long)seq->id, seq->n_planned_draft);
    int end = seq->n_tokens + n;
    int rc = kvm_table_commit(s->kvm, &seq->table, seq->tokens, end, e);
    if (rc)
        return rc;
    /* the drafts after the taken ones move up: a later call may take more of them */
    seq->n_tokens = seq->n_computed = end;
    seq->n_planned_draft -= n;
    seq->n_draft = seq->n_draft > n ? seq->n_draft - n : 0;
    return WELD_OK;
}

/* ---- releasing sequences -------------------------------------------------------------- */

/* Clear seq from the latest plan's entries (scheduler memory, so this is safe after
   sched_step_done too, while the caller still walks the entries). */
static void plan_forget(struct sched *s, struct sched_seq *seq)
{
    for (int i = 0; i < s->n_plan_entries; i++)
        if (s->entries[i].seq == seq)
            s->entries[i].seq = NULL;
}

static void seq_release(struct sched *s, struct sched_seq *seq)
{
    if (seq->paused)
        s->n_paused--;
    plan_forget(s, seq);
    queue_remove(queue_of(s, seq->state), seq);
    seq_destroy(s, seq);
    if (s->plan_pending)
        s->plan->copies = kvm_copies(s->kvm, &s->plan->n_copies);
}

void sched_finish(struct sched *s, struct sched_seq *seq)
{
    if (!seq)
        return;
    s->n_finished++;
    seq_release(s, seq);
}

void sched_abort(struct sched *s, struct sched_seq *seq)
{
    if (!seq)
        return;
    s->n_aborted++;
    seq_release(s, seq);
}

void sched_pause(struct sched *s, struct sched_seq *seq, bool paused)
{
    if (seq->paused == paused)
        return;
    seq->paused = paused;
    s->n_paused += paused ? 1 : -1;
}

/* ---- planning ------------------------------------------------------------------------- */

static void plan_add(struct sched *s, struct sched_plan *p, struct sched_seq *seq, int n)
{
    WELD_ASSERT(p->n_entries < s->cap_plan);
    struct sched_entry *en = &p->entries[p->n_entries++];
    en->seq = seq;
    en->first = seq->n_computed;
    en->n_tokens = n;
    en->n_draft = seq->n_computed + n > seq->n_tokens ? seq->n_computed + n - seq->n_tokens : 0;
    seq->n_planned_draft = en->n_draft;
    en->sample = seq->n_computed + n >= seq->n_tokens;
    en->blocks = seq->table.blocks;
    en->n_blocks = seq->table.n_blocks;
    p->n_tokens += n;
}

/* Drop seq's entry from the plan if it has one; returns the tokens refunded. */
static int plan_remove(struct sched_plan *p, struct sched_seq *seq)
{
    for (int i = 0; i < p->n_entries; i++) {
        if (p->entries[i].seq != seq)
            continue;
        int n = p->entries[i].n_tokens;
        memmove(p->entries + i, p->entries + i + 1,
                (size_t)(p->n_entries - i - 1) * sizeof *p->entries);
        p->n_entries--;
        p->n_tokens -= n;
        return n;
    }
    return 0;
}

/* One summary line for the preemptions since the last one: the first preemption is
   reported at once, later ones at most once per SCHED_PREEMPT_LOG_S (a run with n far above
   what the pool holds preempts thousands of times); flush: report what is pending now.
   seq / n_blocks: the sequence just preempted (named in the first line), or NULL. */
static void preempt_log(struct sched *s, const struct sched_seq *seq, int n_blocks, bool flush)
{
    uint64_t n = s->n_preemptions - s->preempt_logged;
    if (n == 0)
        return;
    double now = time_now();
    if (!flush && s->preempt_log_t > 0 && now - s->preempt_log_t < SCHED_PREEMPT_LOG_S)
        return;
    if (s->preempt_log_t > 0)
        log_info("scheduler: KV cache full: %llu more preemptions in the last %.1f s (%llu in "
                 "all; preempted sequences are recomputed); %d running, %d waiting",
                 (unsigned long long)n, now - s->preempt_log_t,
                 (unsigned long long)s->n_preemptions, s->running.n, s->waiting.n);
    else if (seq)
        log_info("scheduler: KV cache full: preempted request %llu (%d tokens, %d blocks "
                 "freed; it will be recomputed); %d running, %d waiting; further preemptions "
                 "are summarized at most once a second", (unsigned long long)seq->id,
                 seq->n_tokens, n_blocks, s->running.n, s->waiting.n);
    s->preempt_log_t = now;
    s->preempt_logged = s->n_preemptions;
}

/* Recompute preemption: blocks back to the cache, back to waiting. Returns the refund. */
static int preempt(struct sched *s, struct sched_plan *p, struct sched_seq *seq)
{
    int refund = plan_remove(p, seq);
    int n_blocks = seq->table.n_blocks;
    kvm_table_free(s->kvm, &seq->table);
    seq->n_computed = 0;
    seq->n_draft = seq->n_planned_draft = 0;
    seq_move(s, seq, SCHED_WAITING);
    seq->n_preemptions++;
    s->n_preemptions++;
    p->preempted[p->n_preempted++] = seq;
    preempt_log(s, seq, n_blocks, false);
    return refund;
}

static void fail(struct sched *s, struct sched_plan *p, struct sched_seq *seq)
{
    kvm_table_free(s->kvm, &seq->table);
    seq->n_computed = 0;
    seq_move(s, seq, SCHED_FAILED);
    p->failed[p->n_failed++] = seq;
    log_info("scheduler: request %llu (%d tokens) does not fit in the KV cache even alone "
             "(%d blocks of %d tokens)",
             (unsigned long long)seq->id, seq->n_tokens, s->cfg.kv.n_blocks,
             s->cfg.kv.block_size);
}

/* The newest paused running sequence other than seq, or NULL. */
static struct sched_seq *newest_paused(const struct sched *s, const struct sched_seq *seq)
{
    for (int i = s->running.n - 1; s->n_paused > 0 && i >= 0; i--)
        if (s->running.v[i]->paused && s->running.v[i] != seq)
            return s->running.v[i];
    return NULL;
}

/* Get blocks for n more tokens of running seq, preempting the newest paused running
   sequence, else the newest running one, while short. Returns 1 if seq got them, 0 if seq itself was preempted or failed, or an
   error status (negated) for anything but a shortage. *budget gets refunds. */
static int reserve_running(struct sched *s, struct sched_plan *p, struct sched_seq *seq, int n,
                           int *budget, struct weld_err *e)
{
    for (;;) {
        struct weld_err tmp = {0};
        int rc = kvm_table_reserve(s->kvm, &seq->table, seq->n_computed + n, &tmp);
        if (rc == WELD_OK)
            return 1;
        if (rc != WELD_ERR_LIMIT) {
            if (e)
                *e = tmp;
            return -rc;
        }
        struct sched_seq *victim = newest_paused(s, seq);
        if (!victim)
            victim = s->running.v[s->running.n - 1];
        if (victim == seq && s->running.n == 1) {
            fail(s, p, seq);
            return 0;
        }
        *budget += preempt(s, p, victim);
        if (victim == seq)
            return 0;
    }
}

/* How many of running decode seq's drafted tokens fit this step: the budget left after its
   own token, max_model_len, and KV blocks that are free now (a draft never preempts). */
static int draft_room(struct sched *s, struct sched_seq *seq, int budget)
{
    int k = seq->n_draft;
    seq->n_planned_draft = 0;
    k = k < budget ? k : budget;
    k = k < s->cfg.max_model_len - seq->n_tokens ? k : s->cfg.max_model_len - seq->n_tokens;
    while (k > 0 && kvm_table_blocks_needed(s->kvm, &seq->table, seq->n_tokens + k) >
                        kvm_n_available(s->kvm))
        k--;
    return k > 0 ? k : 0;
}

/* Steps 1 and 2: decodes (one token left), then prefill continuations. */
static int plan_running(struct sched *s, struct sched_plan *p, int *budget, struct weld_err *e)
{
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < s->running.n && *budget > 0; i++) {
            struct sched_seq *seq = s->running.v[i];
            int left = seq->n_tokens - seq->n_computed;
            if (seq->paused || left <= 0 || (pass == 0) != (left == 1))
                continue;
            int n = left < *budget ? left : *budget;
            n = n < seq->max_chunk ? n : seq->max_chunk;
            if (left == 1)
                n += draft_room(s, seq, *budget - 1);
            int rc = reserve_running(s, p, seq, n, budget, e);
            if (rc < 0)
                return -rc;
            if (rc == 1) {
                plan_add(s, p, seq, n);
                *budget -= n;
            }
        }
    }
    return WELD_OK;
}

/* Whether a running sequence will compute, but has not yet, the block that seq would
   compute first after its cache hit of hit tokens (same tokens from the start, same salt):
   then seq had better wait for that block to enter the cache. */
static bool prefix_in_flight(const struct sched *s, const struct sched_seq *seq, int hit)
{
    if (!s->cfg.kv.prefix_caching)
        return false;
    int64_t end = (int64_t)hit + s->cfg.kv.block_size;
    if (end > seq->n_tokens - 1) /* a block holding the last token is never a hit */
        return false;
    const struct kvm_table *t = &seq->table;
    for (int i = 0; i < s->running.n; i++) {
        const struct sched_seq *r = s->running.v[i];
        if (r->n_computed >= end || r->n_tokens < end || r->table.has_salt != t->has_salt ||
            (t->has_salt && (r->table.salt.lo != t->salt.lo || r->table.salt.hi != t->salt.hi)))
            continue;
        if (memcmp(r->tokens, seq->tokens, (size_t)end * sizeof *seq->tokens) == 0)
            return true;
    }
    return false;
}

/* The prefix keys of seq's full blocks [0, *last) into s->tier_keys, *first the first past
   a pool hit of `hit` tokens (the last block before the last token at most: one token is
   always computed). False when there is no tier, nothing past the hit, or no memory. */
static bool tier_keys(struct sched *s, const struct sched_seq *seq, int hit, int *first, int *last)
{
    const int bs = s->cfg.kv.block_size;
    if (!s->cfg.tier.lookup || !s->cfg.kv.prefix_caching)
        return false;
    *first = hit / bs;
    *last = (seq->n_tokens - 1) / bs;
    if (*last <= *first)
        return false;
    if (*last > s->cap_tier_keys) {
        struct kvm_hash *k = wrealloc(s->tier_keys, (size_t)*last * sizeof *k);
        if (!k)
            return false;
        s->tier_keys = k;
        s->cap_tier_keys = *last;
    }
    kvm_prefix_hashes(&seq->table, seq->tokens, bs, *last, s->tier_keys);
    return true;
}

/* The second tier's part of seq's admission after a pool hit of `hit` tokens, with n
   tokens planned to compute (which fit): asks the tier for the full blocks after the hit
   and keeps the leading ones that still fit with the chunk that then follows (less to
   compute, maybe a longer chunk within *budget), updating *n. Returns the tokens to load,
   or -1 when the tier is still reading them (ask again in a later step). */
static int tier_lookup(struct sched *s, struct sched_seq *seq, int hit, const int *budget, int *n,
                       int evictable)
{
    const int bs = s->cfg.kv.block_size;
    int first, last;
    if (!tier_keys(s, seq, hit, &first, &last))
        return 0; /* nothing to ask, or no memory for the keys: compute */
    s->tier_lookups++;
    int k = s->cfg.tier.lookup(s->cfg.tier.u, s->tier_keys + first, last - first, true);
    if (k < 0)
        return -1;
    for (; k > 0; k--) {
        int from = hit + k * bs, m = seq->n_tokens - from;
        m = m < *budget ? m : *budget;
        m = m < seq->max_chunk ? m : seq->max_chunk;
        int need = kvm_blocks_for(s->kvm, from + m) - first;
        if (need <= kvm_n_available(s->kvm) - evictable) {
            *n = m;
            break;
        }
    }
    s->tier_query_tokens += (uint64_t)(last - first) * (uint64_t)bs;
    s->tier_hit_tokens += (uint64_t)k * (uint64_t)bs;
    return k * bs;
}

/* A sequence behind one waiting for the tier: have the tier start reading its blocks
   (lookup without taking them), so that reads overlap while the order is kept. */
static void tier_prefetch(struct sched *s, struct sched_seq *seq)
{
    int first, last;
    int hit = kvm_prefix_peek(s->kvm, &seq->table, seq->tokens, seq->n_tokens, NULL);
    if (tier_keys(s, seq, hit, &first, &last))
        (void)s->cfg.tier.lookup(s->cfg.tier.u, s->tier_keys + first, last - first, false);
}

/* Step 3: admit waiting sequences in key order while they fit; paused ones are passed
   over and do not count against max_num_seqs. Blocks held by paused running sequences are
   taken (by preempting them) when a sequence cannot be admitted without them. */
static int plan_admit(struct sched *s, struct sched_plan *p, int *budget, struct weld_err *e)
{
    s->tier_blocked = false;
    int active = s->running.n;
    for (int i = 0; s->n_paused > 0 && i < s->running.n; i++)
        active -= s->running.v[i]->paused;
    int w = 0;
    while (w < s->waiting.n && active < s->cfg.max_num_seqs && *budget > 0) {
        struct sched_seq *seq = s->waiting.v[w];
        if (seq->paused) {
            w++;
            continue;
        }
        if (s->tier_blocked) { /* the head waits for its reads: start the next ones' */
            if (w - s->tier_blocked_at <= SCHED_TIER_LOOKAHEAD && !seq->no_prefix_hit)
                tier_prefetch(s, seq);
            w++;
            continue;
        }
        if (kvm_blocks_for(s->kvm, seq->n_tokens) > s->cfg.kv.n_blocks) {
            fail(s, p, seq); /* preempted after it outgrew the whole pool */
            continue;
        }
        int evictable = 0, hit = 0;
        if (!seq->no_prefix_hit) {
            hit = kvm_prefix_peek(s->kvm, &seq->table, seq->tokens, seq->n_tokens, &evictable);
            if (prefix_in_flight(s, seq, hit)) {
                s->n_prefix_waits++;
                break;
            }
        }
        int n = seq->n_tokens - hit < *budget ? seq->n_tokens - hit : *budget;
        n = n < seq->max_chunk ? n : seq->max_chunk;
        int need = kvm_blocks_for(s->kvm, hit + n) - hit / s->cfg.kv.block_size;
        if (need > kvm_n_available(s->kvm) - evictable) {
            struct sched_seq *victim = newest_paused(s, NULL);
            if (!victim)
                break;
            preempt(s, p, victim); /* not in the plan: nothing to refund */
            continue;
        }
        int loaded = seq->no_prefix_hit ? 0 : tier_lookup(s, seq, hit, budget, &n, evictable);
        if (loaded < 0) { /* its blocks are being read: it stays first in line */
            s->n_tier_waits++;
            s->tier_blocked = true;
            s->tier_blocked_at = w;
            w++;
            continue;
        }
        int cached = 0;
        int rc = seq->no_prefix_hit ? WELD_OK
                 : kvm_prefix_take(s->kvm, &seq->table, seq->tokens, seq->n_tokens, &cached, e);
        if (!rc)
            rc = kvm_table_reserve(s->kvm, &seq->table, cached + loaded + n, e);
        if (!rc && loaded) {
            rc = kvm_table_commit(s->kvm, &seq->table, seq->tokens, cached + loaded, e);
            if (!rc) {
                const int32_t *b = seq->table.blocks + cached / s->cfg.kv.block_size;
                s->cfg.tier.place(s->cfg.tier.u, b, loaded / s->cfg.kv.block_size);
                kvm_mark_in_tier(s->kvm, b, loaded / s->cfg.kv.block_size);
            }
        }
        if (rc) {
            kvm_table_free(s->kvm, &seq->table);
            if (rc == WELD_ERR_LIMIT)
                return err_set(e, WELD_ERR_INTERNAL,
                               "scheduler: request %llu: admission found blocks short",
                               (unsigned long long)seq->id);
            return rc;
        }
        WELD_ASSERT(cached == hit);
        seq->n_computed = cached + loaded;
        if (!seq->admitted_once) {
            seq->n_cached = cached + loaded;
            seq->n_tier_cached = loaded;
            seq->admitted_once = true;
        }
        seq_move(s, seq, SCHED_RUNNING);
        plan_add(s, p, seq, n);
        *budget -= n;
        active++;
    }
    return WELD_OK;
}

int sched_step(struct sched *s, struct sched_plan *plan, struct weld_err *e)
{
    WELD_ASSERT(!s->plan_pending);
    kvm_copies_clear(s->kvm);
    memset(plan, 0, sizeof *plan);
    s->n_plan_entries = 0;
    if (reserve_plan(s))
        return err_set(e, WELD_ERR_NOMEM, "scheduler: out of memory planning %d sequences",
                       s->running.n + s->waiting.n + s->failed.n);
    plan->entries = s->entries;
    plan->preempted = s->preempted;
    plan->failed = s->plan_failed;
    s->n_steps++;
    preempt_log(s, NULL, 0, false); /* what piled up since the last line, once a second has passed */
    int budget = s->cfg.max_num_batched_tokens;
    int rc = plan_running(s, plan, &budget, e);
    if (!rc && plan->n_preempted == 0)
        rc = plan_admit(s, plan, &budget, e);
    plan->copies = kvm_copies(s->kvm, &plan->n_copies);
    if (rc)
        return rc;
    WELD_ASSERT(plan->n_tokens + budget == s->cfg.max_num_batched_tokens);
    s->n_plan_entries = plan->n_entries;
    s->plan = plan;
    s->plan_pending = true;
    return WELD_OK;
}

int sched_step_done(struct sched *s, struct weld_err *e)
{
    if (!s->plan_pending)
        return err_set(e, WELD_ERR_INVALID_ARG, "scheduler: step done without a planned step");
    struct sched_plan *p = s->plan;
    s->plan_pending = false;
    s->plan = NULL;
    for (int i = 0; i < p->n_entries; i++) {
        struct sched_seq *seq = p->entries[i].seq;
        if (!seq)
            continue;
        int end = p->entries[i].first + p->entries[i].n_tokens - p->entries[i].n_draft;
        int rc = kvm_table_commit(s->kvm, &seq->table, seq->tokens, end, e);
        if (rc) {
            err_prefix(e, "request %llu", (unsigned long long)seq->id);
            return rc;
        }
        seq->n_computed = end;
    }
    return WELD_OK;
}

void sched_step_cancel(struct sched *s)
{
    s->plan_pending = false;
    s->plan = NULL;
}

/* ---- queries -------------------------------------------------------------------------- */

struct kvm *sched_kvm(struct sched *s) { return s->kvm; }
const struct sched_config *sched_get_config(const struct sched *s) { return &s->cfg; }

bool sched_idle(const struct sched *s)
{
    return s->running.n == 0 && s->waiting.n == 0 && s->failed.n == 0;
}

void sched_stats_get(const struct sched *s, struct sched_stats *st)
{
    memset(st, 0, sizeof *st);
    st->n_running = s->running.n;
    st->n_waiting = s->waiting.n;
    st->n_failed = s->failed.n;
    st->n_paused = s->n_paused;
    st->n_steps = s->n_steps;
    st->tier_lookups = s->tier_lookups;
    st->tier_query_tokens = s->tier_query_tokens;
    st->tier_hit_tokens = s->tier_hit_tokens;
    st->n_tier_waits = s->n_tier_waits;
    st->n_preemptions = s->n_preemptions;
    st->n_added = s->n_added;
    st->n_finished = s->n_finished;
    st->n_aborted = s->n_aborted;
    st->n_rejected = s->n_rejected;
    st->n_prefix_waits = s->n_prefix_waits;
    kvm_stats_get(s->kvm, &st->kv);
}

static int check_queue(const struct sched *s, const struct seq_queue *q, enum sched_state st,
                       int *refs, struct weld_err *e)
{
    for (int i = 0; i < q->n; i++) {
        const struct sched_seq *seq = q->v[i];
        const struct kvm_table *t = &seq->table;
        if (seq->state != st || seq->queue_index != i)
            return err_set(e, WELD_ERR_INTERNAL, "scheduler: request %llu misfiled",
                           (unsigned long long)seq->id);
        if (st != SCHED_FAILED && i > 0 && seq_cmp(s, q->v[i - 1], seq) > 0)
            return err_set(e, WELD_ERR_INTERNAL, "scheduler: queue %d out of order at %d",
                           (int)st, i);
        bool ok = st == SCHED_RUNNING
                      ? (s->plan_pending || t->n_computed == seq->n_computed) &&
                            seq->n_computed <= seq->n_tokens &&
                            (int64_t)t->n_blocks * s->cfg.kv.block_size >= seq->n_computed &&
                            t->n_blocks > 0
                      : t->n_blocks == 0 && seq->n_computed == 0;
        if (!ok || seq->n_tokens > s->cfg.max_model_len)
            return err_set(e, WELD_ERR_INTERNAL,
                           "scheduler: request %llu in state %d: %d blocks, %d/%d computed",
                           (unsigned long long)seq->id, (int)st, t->n_blocks,
                           seq->n_computed, seq->n_tokens);
        for (int b = 0; b < t->n_blocks; b++) {
            if (kvm_block_ref(s->kvm, t->blocks[b]) < 0)
                return err_set(e, WELD_ERR_INTERNAL, "scheduler: block id %d out of range",
                               t->blocks[b]);
            refs[t->blocks[b]]++;
        }
    }
    return WELD_OK;
}

int sched_check(const struct sched *s, struct weld_err *e)
{
    int rc = kvm_check(s->kvm, e);
    if (rc)
        return rc;
    int nb = s->cfg.kv.n_blocks;
    int *refs = wcalloc((size_t)nb, sizeof *refs);
    if (!refs)
        return err_set(e, WELD_ERR_NOMEM, "scheduler: out of memory checking");
    rc = check_queue(s, &s->running, SCHED_RUNNING, refs, e);
    if (!rc)
        rc = check_queue(s, &s->waiting, SCHED_WAITING, refs, e);
    if (!rc)
        rc = check_queue(s, &s->failed, SCHED_FAILED, refs, e);
    for (int b = 0; !rc && b < nb; b++)
        if (refs[b] != kvm_block_ref(s->kvm, b))
            rc = err_set(e, WELD_ERR_INTERNAL,
                         "scheduler: block %d has refcount %d but %d tables hold it", b,
                         kvm_block_ref(s->kvm, b), refs[b]);
    wfree(refs);
    return rc;
}
