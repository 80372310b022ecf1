/*
 * exec_ops - the op-by-op executor: a persistent team, one barrier after every stage.
 *
 * Every worker walks the same program stage by stage (program.stage_first). Within a
 * stage, workers claim instructions one at a time from the stage's claim counter (an
 * atomic fetch-add, as ggml's mul_mat hands out chunks) until none are left, then wait at
 * the team barrier until the whole stage is done: llama.cpp's way of running a graph
 * (every thread walks every node and meets the others at a barrier after each). The
 * backend builds programs with OPS_SPLITS_PER_WORKER row slices per worker, so a worker
 * that the OS descheduled (a shared machine) or that got a slow slice leaves the rest to
 * the others instead of holding the whole stage up; ATTENTION stages have one
 * instruction per (sequence, KV head). With fewer instructions than workers the rest
 * just wait at the barrier.
 *
 * Why the results are bit-identical to `ref` whoever claims what: both call exec_op_run
 * on the same instructions with the same inputs; an op's arithmetic per (row, token) does
 * not depend on which worker runs it, its slice or the tile (ops.c), and the barrier makes
 * every stage see exactly the finished previous stage, as the serial order does.
 *
 * No data races: instructions of one stage write disjoint outputs (row ranges of a
 * buffer, KV cache rows of their own heads at their tokens' positions, attention outputs
 * of their own (sequence, KV head)) and read only what earlier stages wrote; the barrier
 * orders every write of stage k before every read in stage k + 1 (core/team.c documents
 * the C11 ordering), and team_run orders the step's inputs before and the logits after.
 * Claims are relaxed fetch-adds: they only need to hand each instruction out once; the
 * caller zeroes them before team_run, whose release publishes the zeroes. Each worker
 * has its own scratch, padded so no two share a cache line.
 *
 * The counters in the instructions are not used at run time: the barrier subsumes them.
 * The run checks once per step that the program has the shape the barrier relies on
 * (every counter an instruction waits on is signalled, wait_count times, only by earlier
 * stages; true of the default programs and of PROG_HEAD_DEPS ones); a program that is
 * not is a builder bug (WELD_ERR_INTERNAL naming the instruction).
 *
 * Stats (exec.h): barrier arrivals count as syncs and the time in team_barrier as wait,
 * two clock reads per barrier per worker, so the bubble compares with mega's.
 *
 * Deliberately not here: cost-model assignment, overlapping stages (that is the
 * megakernel's job), trace recording.
 */
#include "exec/exec.h"

#include "core/alloc.h"
#include "core/team.h"

#include <stdalign.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>

#define OPS_SPLITS_PER_WORKER 4

/* Per-worker stats, each on its own line. */
struct ops_worker_stats {
    alignas(64) uint64_t wait_ns; /* time in barriers */
    uint64_t syncs;               /* barrier arrivals */
};

struct ops_state {
    struct team *team;
    atomic_int *claims;         /* (cap_claims) next unclaimed instruction of each stage */
    int *check;                 /* (cap_claims) check_stages' tables */
    int cap_claims;
    float *scratch;             /* (n_workers, stride) */
    size_t stride;              /* floats per worker, a multiple of 16 (64 bytes) */
    const struct exec_step *st; /* the step being run (set before team_run) */
    struct ops_worker_stats *ws; /* (n_workers), 64-byte aligned */
    void *ws_raw;
    struct exec_stats stats;
};

static int64_t ops_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void ops_free(void *state)
{
    struct ops_state *s = state;
    if (!s)
        return;
    team_free(s->team);
    wfree(s->claims);
    wfree(s->check);
    wfree(s->scratch);
    wfree(s->ws_raw);
    wfree(s);
}

static int ops_create(void **out, const struct model_config *c, const struct exec_params *xp,
                      struct weld_err *e)
{
    *out = NULL;
    struct ops_state *s = wcalloc(1, sizeof *s);
    if (!s)
        return err_set(e, WELD_ERR_NOMEM, "exec ops: out of memory");
    int rc = team_create(&s->team, xp ? xp->n_threads : 0, xp ? xp->team_flags : 0, e);
    if (rc) {
        ops_free(s);
        return rc;
    }
    s->stride = (exec_scratch_floats(c) + 15) / 16 * 16;
    /* the scratch base is only 16-byte aligned, so pad one line between workers */
    s->stride += 16;
    int n = team_size(s->team);
    s->stats.n_workers = n;
    s->ws_raw = wcalloc((size_t)n + 1, sizeof(struct ops_worker_stats));
    if (s->ws_raw)
        s->ws = (struct ops_worker_stats *)(((uintptr_t)s->ws_raw + 63) & ~(uintptr_t)63);
    if (!s->ws_raw || !(s->scratch = wcalloc((size_t)n, s->stride * sizeof(float)))) {
        ops_free(s);
        return err_set(e, WELD_ERR_NOMEM, "exec ops: out of memory for %d workers' scratch",
                       n);
    }
    *out = s;
    return WELD_OK;
}

static int ops_n_workers(const void *state)
{
    const struct ops_state *s = state;
    return team_size(s->team);
}

static int ops_n_splits(const void *state)
{
    int n = ops_n_workers(state);
    return n > 1 ? OPS_SPLITS_PER_WORKER * n : 1;
}

/* The program shape the barrier schedule relies on: stages are non-empty runs of the list,
   and every counter an instruction waits on is signalled only by earlier stages, exactly
   wait_count times (so the barriers before its stage have already met the wait). */
static int check_stages(const struct program *p, int *sig_stage, int *sig_count,
                        struct weld_err *e)
{
    if (!p->stage_first || p->stage_first[0] != 0 || p->stage_first[p->n_stages] != p->n_instr)
        return err_set(e, WELD_ERR_INTERNAL, "exec ops: program has no valid stage table");
    for (int c = 0; c < p->n_counters; c++)
        sig_stage[c] = -1, sig_count[c] = 0;
    for (int k = 0; k < p->n_stages; k++) {
        int first = p->stage_first[k], end = p->stage_first[k + 1];
        if (end <= first)
            return err_set(e, WELD_ERR_INTERNAL, "exec ops: stage %d is empty", k);
        for (int i = first; i < end; i++) {
            const struct prog_instr *in = &p->instrs[i];
            bool ok = in->stage == k && in->signal >= 0 && in->signal < p->n_counters &&
                      (in->wait < 0 || (in->n_wait >= 1 &&
                                        in->n_wait <= p->n_counters - in->wait));
            for (int c = in->wait; ok && in->wait >= 0 && c < in->wait + in->n_wait; c++)
                ok = sig_stage[c] >= 0 && sig_stage[c] < k && sig_count[c] == in->wait_count;
            if (!ok)
                return err_set(e, WELD_ERR_INTERNAL, "exec ops: instruction %d (%s, layer "
                               "%d) in stage %d signals %d and waits on %d (+%d) for %d: not "
                               "a stage-by-stage program", i, prog_op_name(in->op),
                               in->layer, k, in->signal, in->wait, in->n_wait,
                               in->wait_count);
        }
        for (int i = first; i < end; i++) {
            const struct prog_instr *in = &p->instrs[i];
            if (sig_stage[in->signal] >= 0 && sig_stage[in->signal] != k)
                return err_set(e, WELD_ERR_INTERNAL, "exec ops: counter %d is signalled "
                               "by stages %d and %d", in->signal, sig_stage[in->signal], k);
            sig_stage[in->signal] = k;
            sig_count[in->signal]++;
        }
    }
    return WELD_OK;
}

static void ops_worker(void *ctx, int w, int n)
{
    struct ops_state *s = ctx;
    const struct exec_step *st = s->st;
    const struct program *p = st->p;
    float *scratch = s->scratch + (size_t)w * s->stride;
    for (int k = 0; k < p->n_stages; k++) {
        int first = p->stage_first[k], count = p->stage_first[k + 1] - first;
        if (count == 1 && w == 0) {
            exec_op_run(st, &p->instrs[first], scratch); /* no claim needed */
        } else if (count > 1) {
            int j;
            while ((j = atomic_fetch_add_explicit(&s->claims[k], 1,
                                                  memory_order_relaxed)) < count)
                exec_op_run(st, &p->instrs[first + j], scratch);
        }
        if (k + 1 < p->n_stages) {
            int64_t t0 = ops_now_ns();
            team_barrier(s->team);
            s->ws[w].wait_ns += (uint64_t)(ops_now_ns() - t0);
            s->ws[w].syncs++;
        }
    }
}

/* Grow the claim counters (one per stage) and the check's tables (two per counter). */
static int ops_grow(struct ops_state *s, const struct program *p, struct weld_err *e)
{
    int need = p->n_stages > 2 * p->n_counters ? p->n_stages : 2 * p->n_counters;
    if (need <= s->cap_claims)
        return WELD_OK;
    atomic_int *c = wrealloc(s->claims, (size_t)need * sizeof *c);
    int *t = wrealloc(s->check, (size_t)need * sizeof *t);
    if (c)
        s->claims = c;
    if (t)
        s->check = t;
    if (!c || !t)
        return err_set(e, WELD_ERR_NOMEM, "exec ops: out of memory for %d stages", need);
    s->cap_claims = need;
    return WELD_OK;
}

static int ops_run(void *state, const struct exec_step *st, struct weld_err *e)
{
    struct ops_state *s = state;
    const struct program *p = st->p;
    int rc = ops_grow(s, p, e);
    if (rc || (rc = check_stages(p, s->check, s->check + p->n_counters, e)))
        return rc;
    for (int k = 0; k < p->n_stages; k++)
        atomic_store_explicit(&s->claims[k], 0, memory_order_relaxed);
    s->st = st;
    int64_t t0 = ops_now_ns();
    team_run(s->team, ops_worker, s);
    s->stats.step_s += (double)(ops_now_ns() - t0) * 1e-9;
    s->stats.steps++;
    s->stats.tokens += p->n_tokens;
    s->st = NULL;
    return WELD_OK;
}

static void ops_stats(void *state, struct exec_stats *out, bool reset)
{
    struct ops_state *s = state;
    *out = s->stats;
    for (int w = 0; w < s->stats.n_workers; w++) {
        out->syncs += (long long)s->ws[w].syncs;
        out->wait_s += (double)s->ws[w].wait_ns * 1e-9;
    }
    if (reset) {
        int n = s->stats.n_workers;
        memset(&s->stats, 0, sizeof s->stats);
        s->stats.n_workers = n;
        for (int w = 0; w < n; w++)
            s->ws[w].wait_ns = s->ws[w].syncs = 0;
    }
}

static void ops_park(void *state)
{
    struct ops_state *s = state;
    team_park(s->team);
}

const struct executor_impl exec_ops_impl = {
    .name = "ops",
    .desc = "thread team, one barrier after every stage",
    .create = ops_create,
    .free = ops_free,
    .run = ops_run,
    .n_workers = ops_n_workers,
    .n_splits = ops_n_splits,
    .park = ops_park,
    .stats = ops_stats,
};
