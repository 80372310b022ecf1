/*
 * exec_mega - the megakernel executor: per-worker queues, dependency counters, no barriers.
 *
 * A step runs one program (PROG_HEAD_DEPS: attention waits only on the projections of its
 * own KV heads) on a persistent pinned team (core/team.h). Every worker runs its own
 * queue of instructions in list order: it claims an instruction, waits until each counter
 * the instruction names has reached wait_count * epoch, runs it (exec_op_run_tiles) and
 * adds one to its signal counter with release. There is no stage-wide barrier: a worker
 * waits only for the work it depends on.
 *
 * A plan (struct mega_plan, plan_create), made once per program and cached by program_id,
 * fixes each instruction's owner by a cost model, the queues, which waits need a check,
 * and the counters and claims: never reset, they count runs (epochs), so each instruction
 * runs once per step. A worker waiting on a late owner runs that owner's ready work
 * (steal_for); an instruction of several pieces is shared piece by piece (run_pieces), so
 * a stage ends within one piece of balanced. No deadlock (plan_fill_queues).
 *
 * Memory ordering: an instruction's writes happen-before its release fetch_add; a waiter's
 * acquire load of a value >= the target reads from every signaller's release sequence (all
 * increments are read-modify-writes). team_run orders the step's inputs before and its
 * outputs after (core/team.c). Each worker has its own scratch and stats line.
 *
 * Bit-identical to ref: the same instructions through exec_op_run_tiles, whose per-(row,
 * token) arithmetic does not depend on the worker, split, piece or order (ops.h).
 * Stats: a clock is read only when a wait is not met at once, and once per step; every
 * counter check counts as a sync. WELD_TRACE=FILE records the first steps (trace.h;
 * how many: --tune trace_steps=N).
 *
 * Deliberately not here: general work stealing, pieces of QKV and FINAL at decode,
 * sleeping inside a step, fusion across layers, re-planning from measured times.
 */
#include "exec/exec.h"

#include "core/alloc.h"
#include "core/log.h"
#include "core/team.h"
#include "exec/trace.h"

#include <sched.h>
#include <stdalign.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define mega_pause() _mm_pause()
#elif defined(__aarch64__)
#define mega_pause() __asm__ __volatile__("yield")
#else
#define mega_pause() ((void)0)
#endif

#define MEGA_SPLITS_PER_WORKER 1
#define MEGA_PLANS 8
#define MEGA_SPINS 16384          /* pauses (0.5-2 ms) before a wait starts yielding */
#define MEGA_SPINS_OVER 16        /* the same with more workers than cores */
#define MEGA_PREFETCH_LINES 16    /* lines of each matrix prefetched while waiting */
#define MEGA_STEAL_SPINS 64       /* pauses before a waiting worker helps late signallers */
#define MEGA_FLOP_COST 0.25       /* cost of one FLOP in bytes-read units */
#define MEGA_NOMINAL_CTX 256      /* cached positions assumed for attention costs */
#define MEGA_AFFINITY_SLACK 1.10  /* attention may go to its heads' worker up to this */
#define MEGA_TRACE_STEPS 4

struct mega_counter {
    alignas(64) _Atomic uint64_t v;
};

/* Pieces of one instruction with n_tiles > 1, both counts cumulative over steps like the
   counters: in run e pieces (e - 1) * n .. e * n - 1 are handed out. */
struct mega_tiles {
    _Atomic uint64_t next; /* pieces handed out */
    _Atomic uint64_t done; /* pieces finished */
};

struct mega_worker {
    alignas(64) uint64_t wait_ns; /* time in unmet waits */
    uint64_t syncs;               /* counter checks */
    uint64_t steals;              /* instructions run for another worker */
    uint64_t joins;               /* of those, shared with their running owner */
};

struct mega_plan {
    uint64_t prog_id, last_used;
    uint64_t epoch;          /* completed runs; the current run waits for count * (epoch+1) */
    int n_instr, n_counters;
    int *owner;              /* (n_instr) worker of each instruction */
    int *queue;              /* (n_instr) every worker's queue, worker 0 first */
    int *queue_first;        /* (n_workers + 1) */
    uint8_t *check;          /* (n_instr) 1: its waits must be checked at run time */
    int *pos;                /* (n_instr) queue position of each instruction */
    int *sig_first;          /* (n_counters + 1) counter c's signallers are instructions
                                [sig_first[c], sig_first[c + 1]) (check_program) */
    _Atomic uint64_t *claims; /* (n_instr) by queue position: last epoch it was claimed */
    int *n_tiles;            /* (n_instr) pieces of each instruction (exec_op_tiles) */
    struct mega_tiles *tiles; /* (n_instr) by queue position: piece claims, completions */
    struct mega_counter *counters; /* (n_counters), 64-byte aligned */
    void *counters_raw;
};

struct mega_state {
    struct team *team;
    int n_workers, spins;
    int lazy_us;             /* exec_params.test_lazy_us */
    int tail_us;             /* exec_params.test_late_tail_us */
    int slow_piece_us;       /* exec_params.test_slow_piece_us */
    float *scratch;          /* (n_workers, stride) */
    size_t stride;
    struct mega_worker *workers; /* (n_workers), 64-byte aligned */
    void *workers_raw;
    struct mega_plan *plans[MEGA_PLANS];
    uint64_t clock;          /* plan use counter (LRU) */
    struct exec_stats stats;
    struct trace *trace;
    /* the step being run (set before team_run) */
    const struct exec_step *st;
    struct mega_plan *cur;
    bool tracing;
};

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* ---- plans --------------------------------------------------------------------------- */

static void plan_free(struct mega_plan *pl)
{
    if (!pl)
        return;
    wfree(pl->owner);
    wfree(pl->queue);
    wfree(pl->queue_first);
    wfree(pl->check);
    wfree(pl->pos);
    wfree(pl->sig_first);
    wfree(pl->claims);
    wfree(pl->n_tiles);
    wfree(pl->tiles);
    wfree(pl->counters_raw);
    wfree(pl);
}

static double mat_bytes(const struct exec_mat *m, int rows)
{
    return (double)rows * (double)m->row_bytes;
}

/* Estimated cost of one instruction: bytes read from memory plus weighted FLOPs. */
static double instr_cost(const struct exec_step *st, const struct prog_instr *in)
{
    const struct model_config *c = &st->m->cfg;
    const struct program *p = st->p;
    double rows = in->row1 - in->row0, nt = p->n_tokens, bytes = 0, flops = 0;
    const struct exec_layer_mats *lm = in->layer >= 0 ? &st->w->mats[in->layer] : NULL;
    switch (in->op) {
    case OP_EMBED:
        bytes = rows * c->dim * 4.0;
        break;
    case OP_ATTN_NORM_QKV_ROPE:
        for (int u = in->row0; u < in->row1; u++) {
            const struct exec_mat *m = u < c->n_head ? &lm->wq
                                     : u < c->n_head + c->n_kv_head ? &lm->wk : &lm->wv;
            bytes += mat_bytes(m, c->head_dim);
        }
        flops = 2.0 * rows * c->head_dim * c->dim * nt + nt * c->dim * 4.0;
        break;
    case OP_ATTENTION: {
        double ntok = in->seq >= 0 && in->seq < p->n_seqs ? p->seq_ntok[in->seq] : 1;
        if (c->kv_lora_rank > 0) { /* rows = query heads over one latent row per position */
            double ctx = MEGA_NOMINAL_CTX + ntok, hk = c->kv_lora_rank + c->rope_dim;
            bytes = ctx * hk * 2.0 + mat_bytes(&lm->vb, (int)rows * c->v_head_dim);
            flops = 4.0 * ntok * rows * ctx * hk +
                    2.0 * ntok * rows * c->v_head_dim * c->kv_lora_rank;
            break;
        }
        double ctx = MEGA_NOMINAL_CTX + ntok, group = (double)c->n_head / c->n_kv_head;
        bytes = rows * ctx * c->head_dim * 2.0 * 2.0;
        flops = 4.0 * ntok * group * rows * ctx * c->head_dim;
        break;
    }
    case OP_O_PROJ_RESIDUAL:
        bytes = mat_bytes(&lm->wo, (int)rows);
        flops = 2.0 * rows * (double)lm->wo.k * nt;
        break;
    case OP_FFN_NORM_GATE_UP_SILU:
        bytes = mat_bytes(&lm->gate, (int)rows) + mat_bytes(&lm->up, (int)rows);
        flops = 4.0 * rows * c->dim * nt;
        break;
    case OP_DOWN_PROJ_RESIDUAL:
        bytes = mat_bytes(&lm->down, (int)rows);
        flops = 2.0 * rows * (double)lm->down.k * nt;
        break;
    case OP_O_PART: { /* rows of the part's columns */
        const struct exec_mat *m = &lm->wo_part[in->part];
        bytes = mat_bytes(m, (int)rows);
        flops = 2.0 * rows * (double)m->k * nt;
        break;
    }
    case OP_FFN_DOWN_PART: {
        const struct exec_mat *m = &lm->down_part[in->part];
        bytes = mat_bytes(&lm->gate, (int)rows) + mat_bytes(&lm->up, (int)rows) +
                mat_bytes(m, c->dim);
        flops = 4.0 * rows * c->dim * nt + 2.0 * c->dim * (double)m->k * nt;
        break;
    }
    case OP_FINAL_NORM_LOGITS:
        bytes = mat_bytes(&st->w->output, (int)rows);
        flops = 2.0 * rows * c->dim * p->n_logit_rows;
        break;
    case OP_MOE_ROUTE:
        bytes = mat_bytes(&lm->router, (int)lm->router.rows) + rows * c->dim * 8.0;
        flops = 2.0 * rows * c->dim * c->n_expert;
        break;
    case OP_MOE_GATE_UP:
    case OP_MOE_DOWN: { /* an expert's share of the step's (token, slot) pairs */
        const bool up = in->op == OP_MOE_GATE_UP, sh = in->part < 0;
        const struct exec_mat *a = sh ? (up ? &lm->sh_gate : &lm->sh_down)
                                      : (up ? &lm->egate[0] : &lm->edown[0]);
        double ranks = nt * c->n_expert_used < c->n_expert ? nt * c->n_expert_used : c->n_expert;
        double tok = sh ? nt : nt * c->n_expert_used / ranks;
        bytes = mat_bytes(a, (int)rows) * (up ? 2.0 : 1.0);
        flops = 2.0 * rows * (double)a->k * tok * (up ? 2.0 : 1.0);
        break;
    }
    case OP_MOE_COMBINE: bytes = rows * nt * (c->n_expert_used + 2) * 4.0; break;
    case OP_MLA_PROJ_A: {
        const struct exec_mat *a = in->row0 < c->q_lora_rank ? &lm->wq_a : &lm->wkv_a;
        bytes = mat_bytes(a, (int)rows);
        flops = 2.0 * rows * c->dim * nt;
        break;
    }
    case OP_MLA_Q_KV: { /* query heads: their q_b rows and the absorption; the latent unit */
        const int heads = (in->row1 > c->n_head ? c->n_head : in->row1) - in->row0;
        const struct exec_mat *q = c->q_lora_rank > 0 ? &lm->wq_b : &lm->wq;
        bytes = heads > 0 ? mat_bytes(q, heads * c->head_dim) +
                                mat_bytes(&lm->kbt, heads * c->kv_lora_rank)
                          : 0;
        flops = 2.0 * heads * nt *
                ((double)c->head_dim * (double)q->k + (double)c->kv_lora_rank * c->qk_nope_dim);
        break;
    }
    default:
        break;
    }
    return bytes + MEGA_FLOP_COST * flops + 1.0;
}

/* Scratch of plan_assign: per instruction cost and unit order, per worker loads. */
struct assign_tmp {
    double *cost;     /* (n_instr) cost of each unit, indexed by its first instruction */
    int *order;       /* (n_instr) unit heads of the current stage */
    int *unit_next;   /* (n_instr) next instruction of the same unit, -1 at the end */
    int *sig_owner;   /* (n_counters) worker of every signaller, -1 none, -2 several */
    double *load;     /* (n_workers) this stage */
    double *total;    /* (n_workers) so far */
};

static int cmp_cost_desc(const void *a, const void *b, void *ctx)
{
    const double *cost = ctx;
    int i = *(const int *)a, j = *(const int *)b;
    if (cost[i] != cost[j])
        return cost[i] < cost[j] ? 1 : -1;
    return i - j;
}

/* The worker whose queue already signals every counter instruction i waits on, or -1. */
static int affinity(const struct program *p, const struct assign_tmp *t, int i)
{
    const struct prog_instr *in = &p->instrs[i];
    int w = -1;
    for (int c = in->wait; in->wait >= 0 && c < in->wait + in->n_wait; c++) {
        int o = t->sig_owner[c];
        if (o < 0 || (w >= 0 && o != w))
            return -1;
        w = o;
    }
    return w;
}

static int least_loaded(const struct assign_tmp *t, int n_workers)
{
    int best = 0;
    for (int w = 1; w < n_workers; w++)
        if (t->load[w] < t->load[best] ||
            (t->load[w] == t->load[best] && t->total[w] < t->total[best]))
            best = w;
    return best;
}

/* Group stage k's instructions into units (one per signal counter when the stage signals
   at least one counter per worker, else one per instruction); returns the number of unit
   heads put in order. */
static int stage_units(const struct program *p, struct assign_tmp *t, int k, int n_workers)
{
    int first = p->stage_first[k], end = p->stage_first[k + 1], n = 0;
    int n_sig = p->instrs[end - 1].signal - p->instrs[first].signal + 1;
    bool several = n_sig > 1 && n_sig >= n_workers;
    for (int i = first; i < end; i++) {
        t->unit_next[i] = -1;
        int head = i;
        if (several)
            for (int j = first; j < i; j++)
                if (p->instrs[j].signal == p->instrs[i].signal) {
                    head = j;
                    break;
                }
        if (head == i) {
            t->order[n++] = i;
        } else {
            int j = head;
            while (t->unit_next[j] >= 0)
                j = t->unit_next[j];
            t->unit_next[j] = i;
            t->cost[head] += t->cost[i];
        }
    }
    qsort_r(t->order, (size_t)n, sizeof(int), cmp_cost_desc, t->cost);
    return n;
}

/* Owners of stage k's instructions: longest unit first to the least loaded worker. */
static void assign_stage(const struct program *p, struct assign_tmp *t, int *owner, int k,
                         int n_workers)
{
    int n = stage_units(p, t, k, n_workers);
    double sum = 0;
    for (int u = 0; u < n; u++)
        sum += t->cost[t->order[u]];
    for (int w = 0; w < n_workers; w++)
        t->load[w] = 0;
    double fair = sum / n_workers * MEGA_AFFINITY_SLACK;
    for (int u = 0; u < n; u++) {
        int i = t->order[u], w = least_loaded(t, n_workers);
        int a = affinity(p, t, i);
        if (a >= 0 && a != w && t->load[a] + t->cost[i] <= fair)
            w = a;
        t->load[w] += t->cost[i];
        t->total[w] += t->cost[i];
        for (int j = i; j >= 0; j = t->unit_next[j])
            owner[j] = w;
    }
    for (int i = p->stage_first[k]; i < p->stage_first[k + 1]; i++) {
        int c = p->instrs[i].signal;
        t->sig_owner[c] = t->sig_owner[c] == -1 || t->sig_owner[c] == owner[i] ? owner[i] : -2;
    }
}

/* Owners, by a cost model: bytes of weights (or KV cache) read plus MEGA_FLOP_COST per
   FLOP (instr_cost). Each stage is assigned on its own, longest first, to the worker with
   the least work in that stage (ties: least work so far in the program), so every stage
   is balanced. The units of a stage are its instructions, or, where a stage signals a
   counter per worker or more (the QKV stage cut by KV-head groups), the group of
   instructions behind each counter, so one worker makes a head group's Q, K and V (with
   fewer groups than workers, e.g. a single KV head, the group's pieces are spread
   instead). An ATTENTION instruction goes to the worker that made its heads when that
   keeps the stage within MEGA_AFFINITY_SLACK of balanced: its wait is then on its own
   earlier work and disappears. With K parts (program.h) an O part waits only on the
   attention of its heads, so it goes the same way to the worker that ran that attention:
   a layer then waits on other workers twice (before the FFN parts and before the next
   layer's QKV). */
static bool plan_assign(struct mega_plan *pl, const struct exec_step *st, int n_workers)
{
    const struct program *p = st->p;
    struct assign_tmp t = {
        .cost = wcalloc((size_t)p->n_instr, sizeof(double)),
        .order = wcalloc((size_t)p->n_instr, sizeof(int)),
        .unit_next = wcalloc((size_t)p->n_instr, sizeof(int)),
        .sig_owner = wcalloc((size_t)p->n_counters, sizeof(int)),
        .load = wcalloc((size_t)n_workers, sizeof(double)),
        .total = wcalloc((size_t)n_workers, sizeof(double)),
    };
    bool ok = t.cost && t.order && t.unit_next && t.sig_owner && t.load && t.total;
    if (ok) {
        for (int i = 0; i < p->n_instr; i++)
            t.cost[i] = instr_cost(st, &p->instrs[i]);
        for (int c = 0; c < p->n_counters; c++)
            t.sig_owner[c] = -1;
        for (int k = 0; k < p->n_stages; k++)
            assign_stage(p, &t, pl->owner, k, n_workers);
    }
    wfree(t.cost), wfree(t.order), wfree(t.unit_next), wfree(t.sig_owner);
    wfree(t.load), wfree(t.total);
    return ok;
}

/* Queues in list order (and each instruction's position), counters' signaller runs. The
   list order is a valid serial schedule and every dependency points to an earlier
   instruction, so the lowest-numbered unfinished instruction always heads its queue with
   its inputs done: no assignment can deadlock. Counters are one per 64-byte line; after e
   runs counter c holds (signallers of c) * e, so the e-th run waits for wait_count * e
   (uint64: no wrap in any realistic lifetime). Claims, one per instruction by queue
   position (a worker's own claims share its cache lines), hold the epoch that last
   claimed it, taken by compare-and-swap from e - 1 to e. */
static bool plan_fill_queues(struct mega_plan *pl, const struct program *p, int n_workers)
{
    int *fill = wcalloc((size_t)n_workers, sizeof(int));
    if (!fill)
        return false;
    for (int i = 0; i < p->n_instr; i++)
        pl->queue_first[pl->owner[i] + 1]++;
    for (int w = 0; w < n_workers; w++) {
        pl->queue_first[w + 1] += pl->queue_first[w];
        fill[w] = pl->queue_first[w];
    }
    for (int i = 0; i < p->n_instr; i++) {
        pl->pos[i] = fill[pl->owner[i]];
        pl->queue[fill[pl->owner[i]]++] = i;
    }
    for (int i = 0; i < p->n_instr; i++)
        pl->sig_first[p->instrs[i].signal + 1]++;
    for (int c = 0; c < p->n_counters; c++)
        pl->sig_first[c + 1] += pl->sig_first[c];
    wfree(fill);
    return true;
}

/* Which waits need a run-time check: not those on counters only the same worker signals
   (its own earlier work), nor a counter that worker already checked this step (counters
   only grow, and every waiter of a counter waits for the same count). */
static bool plan_prune_waits(struct mega_plan *pl, const struct program *p, int n_workers)
{
    int *sig_owner = wcalloc((size_t)p->n_counters, sizeof(int));
    uint8_t *seen = wcalloc((size_t)p->n_counters * (size_t)n_workers, 1);
    if (!sig_owner || !seen) {
        wfree(sig_owner), wfree(seen);
        return false;
    }
    for (int c = 0; c < p->n_counters; c++)
        sig_owner[c] = -1;
    for (int i = 0; i < p->n_instr; i++) {
        int c = p->instrs[i].signal, o = pl->owner[i];
        sig_owner[c] = sig_owner[c] == -1 || sig_owner[c] == o ? o : -2;
    }
    for (int i = 0; i < p->n_instr; i++) {
        const struct prog_instr *in = &p->instrs[i];
        int w = pl->owner[i];
        for (int c = in->wait; in->wait >= 0 && c < in->wait + in->n_wait; c++) {
            uint8_t *sn = &seen[(size_t)w * (size_t)p->n_counters + (size_t)c];
            if (sig_owner[c] != w && !*sn)
                pl->check[i] = 1;
            *sn = 1;
        }
    }
    wfree(sig_owner), wfree(seen);
    return true;
}

static int plan_create(struct mega_plan **out, const struct exec_step *st, int n_workers,
                       struct weld_err *e)
{
    const struct program *p = st->p;
    struct mega_plan *pl = wcalloc(1, sizeof *pl);
    if (!pl)
        goto nomem;
    pl->prog_id = program_id(p);
    pl->n_instr = p->n_instr;
    pl->n_counters = p->n_counters;
    pl->owner = wcalloc((size_t)p->n_instr, sizeof(int));
    pl->queue = wcalloc((size_t)p->n_instr, sizeof(int));
    pl->queue_first = wcalloc((size_t)n_workers + 1, sizeof(int));
    pl->check = wcalloc((size_t)p->n_instr, 1);
    pl->pos = wcalloc((size_t)p->n_instr, sizeof(int));
    pl->sig_first = wcalloc((size_t)p->n_counters + 1, sizeof(int));
    pl->claims = wcalloc((size_t)p->n_instr, sizeof *pl->claims);
    pl->n_tiles = wcalloc((size_t)p->n_instr, sizeof(int));
    pl->tiles = wcalloc((size_t)p->n_instr, sizeof *pl->tiles);
    pl->counters_raw = wcalloc((size_t)p->n_counters + 1, sizeof(struct mega_counter));
    if (!pl->owner || !pl->queue || !pl->queue_first || !pl->check || !pl->counters_raw ||
        !pl->pos || !pl->sig_first || !pl->claims || !pl->n_tiles || !pl->tiles)
        goto nomem;
    for (int i = 0; i < p->n_instr; i++) {
        atomic_init(&pl->claims[i], 0);
        atomic_init(&pl->tiles[i].next, 0);
        atomic_init(&pl->tiles[i].done, 0);
        pl->n_tiles[i] = exec_op_tiles(st, &p->instrs[i]);
    }
    pl->counters = (struct mega_counter *)(((uintptr_t)pl->counters_raw + 63) &
                                           ~(uintptr_t)63);
    for (int c = 0; c < p->n_counters; c++)
        atomic_init(&pl->counters[c].v, 0);
    if (!plan_assign(pl, st, n_workers) || !plan_fill_queues(pl, p, n_workers) ||
        !plan_prune_waits(pl, p, n_workers))
        goto nomem;
    *out = pl;
    return WELD_OK;
nomem:
    plan_free(pl);
    return err_set(e, WELD_ERR_NOMEM, "exec mega: out of memory planning %d instructions "
                   "for %d workers", p->n_instr, n_workers);
}

/* Every wait names counters signalled only by earlier instructions, wait_count times. */
static int check_program(const struct program *p, struct weld_err *e)
{
    int *count = wcalloc((size_t)p->n_counters + 1, sizeof(int));
    if (!count)
        return err_set(e, WELD_ERR_NOMEM, "exec mega: out of memory");
    int *last = wcalloc((size_t)p->n_counters + 1, sizeof(int));
    if (!last) {
        wfree(count);
        return err_set(e, WELD_ERR_NOMEM, "exec mega: out of memory");
    }
    int rc = WELD_OK;
    for (int i = 0; i < p->n_instr && !rc; i++) {
        const struct prog_instr *in = &p->instrs[i];
        if (in->signal < 0 || in->signal >= p->n_counters ||
            (i && in->signal < p->instrs[i - 1].signal))
            rc = err_set(e, WELD_ERR_INTERNAL, "exec mega: instruction %d (%s) signals "
                         "counter %d of %d, out of list order", i, prog_op_name(in->op),
                         in->signal, p->n_counters);
        else
            count[in->signal]++, last[in->signal] = i;
    }
    for (int i = 0; i < p->n_instr && !rc; i++) {
        const struct prog_instr *in = &p->instrs[i];
        if (in->wait < 0)
            continue;
        bool ok = in->n_wait >= 1 && in->n_wait <= p->n_counters - in->wait;
        for (int c = in->wait; ok && c < in->wait + in->n_wait; c++)
            ok = count[c] == in->wait_count && last[c] < i;
        if (!ok)
            rc = err_set(e, WELD_ERR_INTERNAL, "exec mega: instruction %d (%s, layer %d) "
                         "waits on counters %d (+%d) for %d, which later or other "
                         "instructions signal", i, prog_op_name(in->op), in->layer,
                         in->wait, in->n_wait, in->wait_count);
    }
    wfree(count), wfree(last);
    return rc;
}

/* The plan for st->p: cached, or made (and checked) now, evicting the least recent. */
static int get_plan(struct mega_state *s, const struct exec_step *st, struct mega_plan **out,
                    struct weld_err *e)
{
    uint64_t id = program_id(st->p);
    int victim = 0;
    for (int i = 0; i < MEGA_PLANS; i++) {
        struct mega_plan *pl = s->plans[i];
        if (pl && pl->prog_id == id) {
            pl->last_used = ++s->clock;
            *out = pl;
            return WELD_OK;
        }
        if (!pl || (s->plans[victim] && pl->last_used < s->plans[victim]->last_used))
            victim = i;
    }
    int rc = check_program(st->p, e);
    struct mega_plan *pl = NULL;
    if (rc || (rc = plan_create(&pl, st, s->n_workers, e)))
        return rc;
    plan_free(s->plans[victim]);
    s->plans[victim] = pl;
    pl->last_used = ++s->clock;
    *out = pl;
    return WELD_OK;
}

/* ---- running ------------------------------------------------------------------------- */

/* Address of the first weight row instruction `in` reads (for prefetching), or NULL. */
static const char *first_weights(const struct exec_step *st, const struct prog_instr *in,
                                 const char **second)
{
    const struct model_config *c = &st->m->cfg;
    *second = NULL;
    if (in->layer < 0)
        return in->op == OP_FINAL_NORM_LOGITS
                   ? (const char *)st->w->output.data +
                         (size_t)(in->row0 - st->w->output.row0) * st->w->output.row_bytes
                   : NULL;
    const struct exec_layer_mats *lm = &st->w->mats[in->layer];
    const struct exec_mat *m = NULL;
    size_t row = (size_t)in->row0;
    switch (in->op) {
    case OP_ATTN_NORM_QKV_ROPE: {
        int u = in->row0, nh = c->n_head, nkv = c->n_kv_head;
        m = u < nh ? &lm->wq : u < nh + nkv ? &lm->wk : &lm->wv;
        row = (size_t)(u < nh ? u : u < nh + nkv ? u - nh : u - nh - nkv) * (size_t)c->head_dim;
        break;
    }
    case OP_O_PROJ_RESIDUAL: m = &lm->wo; break;
    case OP_FFN_NORM_GATE_UP_SILU:
        m = &lm->gate;
        *second = (const char *)lm->up.data + (row - (size_t)lm->up.row0) * lm->up.row_bytes;
        break;
    case OP_DOWN_PROJ_RESIDUAL: m = &lm->down; break;
    case OP_O_PART: m = &lm->wo_part[in->part]; row = 0; break;
    case OP_FFN_DOWN_PART:
        m = &lm->gate;
        *second = (const char *)lm->up.data + (row - (size_t)lm->up.row0) * lm->up.row_bytes;
        break;
    default: return NULL;
    }
    return (const char *)m->data + (row - (size_t)m->row0) * m->row_bytes;
}

/* Context of one worker's run of a step. */
struct mega_ctx {
    struct mega_state *s;
    const struct exec_step *st;
    struct mega_plan *pl;
    struct mega_worker *mw;
    float *scratch;
    uint64_t epoch;
    int w;
};

/* Claim instruction i for this step (its owner or a thief); false if already taken. */
static bool claim(const struct mega_ctx *x, int i)
{
    uint64_t want = x->epoch - 1;
    return atomic_compare_exchange_strong_explicit(&x->pl->claims[x->pl->pos[i]], &want,
                                                   x->epoch, memory_order_relaxed,
                                                   memory_order_relaxed);
}

static bool waits_met(const struct mega_ctx *x, const struct prog_instr *in)
{
    uint64_t target = (uint64_t)in->wait_count * x->epoch;
    for (int c = in->wait; in->wait >= 0 && c < in->wait + in->n_wait; c++)
        if (atomic_load_explicit(&x->pl->counters[c].v, memory_order_acquire) < target)
            return false;
    return true;
}

/* The next piece of instruction i for this run, or -1 when all are handed out. */
static int claim_tile(const struct mega_ctx *x, int i)
{
    struct mega_tiles *t = &x->pl->tiles[x->pl->pos[i]];
    const uint64_t n = (uint64_t)x->pl->n_tiles[i], limit = n * x->epoch;
    uint64_t v = atomic_load_explicit(&t->next, memory_order_relaxed);
    while (v < limit)
        if (atomic_compare_exchange_weak_explicit(&t->next, &v, v + 1, memory_order_relaxed,
                                                  memory_order_relaxed))
            return (int)(v - (limit - n));
    return -1;
}

/* Run what is left of instruction i (all of it with one piece; else pieces claimed one at
   a time, shared with any worker that joins) and, if this worker finished its last
   piece, signal its counter (*signalled). Returns the pieces this worker ran.
   Pieces (exec_op_tiles > 1: a prefill's token tiles; in a decode-shaped step, O / FFN /
   DOWN in row pieces of ~512 KiB of weights, ops.c) are handed out by a compare-and-swap
   on a cumulative counter bounded by n_tiles * epoch (never reset, like the counters), and
   whoever finishes the last piece (acq_rel on a cumulative done count) signals. A waiting
   worker joins a running signaller that still has pieces left (its inputs are ready:
   checked, since an owner claims before it waits), so a stage ends within one piece of
   balanced even when a worker is slower or loses its core mid-slice; decode needs this
   too, since one core of a shared host can stream slower than another for seconds.
   Single-piece instructions take none of this (no extra atomics). */
static uint64_t run_pieces(const struct mega_ctx *x, int i, bool *signalled)
{
    const struct prog_instr *in = &x->st->p->instrs[i];
    const int n = x->pl->n_tiles[i];
    uint64_t k = 0;
    *signalled = false;
    if (n == 1) {
        exec_op_run(x->st, in, x->scratch);
        k = 1;
    } else {
        for (int t; (t = claim_tile(x, i)) >= 0; k++) {
            exec_op_run_tiles(x->st, in, x->scratch, t, t + 1);
            if (x->s->slow_piece_us && x->w == x->s->n_workers - 1) {
                struct timespec nap = {0, (long)x->s->slow_piece_us * 1000};
                nanosleep(&nap, NULL);
            }
        }
        /* acq_rel: the last finisher acquires every other piece's writes, and its release
           on the counter below passes them on */
        struct mega_tiles *tl = &x->pl->tiles[x->pl->pos[i]];
        if (!k || atomic_fetch_add_explicit(&tl->done, k, memory_order_acq_rel) + k !=
                      (uint64_t)n * x->epoch)
            return k;
    }
    atomic_fetch_add_explicit(&x->pl->counters[in->signal].v, 1, memory_order_release);
    *signalled = true;
    return k;
}

/* run_pieces, traced; returns the pieces run (0: every piece had gone to others). */
static uint64_t run_instr(const struct mega_ctx *x, int i, int64_t t_start, int64_t t_met,
                          bool *signalled)
{
    const struct prog_instr *in = &x->st->p->instrs[i];
    uint64_t k = run_pieces(x, i, signalled);
    if (x->s->tracing && k) {
        struct trace_event ev = {
            .t_start = t_start, .t_met = t_met, .t_end = now_ns(), .step = x->s->trace->step,
            .instr = i, .row0 = in->row0, .row1 = in->row1, .seq = in->seq,
            .layer = in->layer, .op = in->op,
        };
        trace_add(x->s->trace, x->w, &ev);
    }
    return k;
}

/* While waiting on counter c: run one of its unclaimed signallers whose inputs are ready
   (its owner is late: descheduled, or slower than planned), or join one that is running
   and still has pieces left. Returns the nanoseconds spent running (0: nothing ran).
   A thief only takes instructions that are ready, so it never blocks; the owner skips
   what was taken, and from then on, for the rest of the step, checks every wait the plan
   had pruned (its earlier work may now be another worker's, still running). An owner that
   did not finish its own instruction treats itself as robbed. No deadlock: the lowest
   unfinished instruction always has its inputs done and is either being run or will be
   claimed by its owner, whose earlier queue entries are all finished. Time running
   others' work inside a wait does not count as waiting. */
static int64_t steal_for(const struct mega_ctx *x, int c)
{
    const struct mega_plan *pl = x->pl;
    for (int i = pl->sig_first[c]; i < pl->sig_first[c + 1]; i++) {
        const struct prog_instr *in = &x->st->p->instrs[i];
        const bool taken =
            atomic_load_explicit(&pl->claims[pl->pos[i]], memory_order_relaxed) >= x->epoch;
        if (taken && (pl->n_tiles[i] == 1 ||
                      atomic_load_explicit(&pl->tiles[pl->pos[i]].next, memory_order_relaxed) >=
                          (uint64_t)pl->n_tiles[i] * x->epoch))
            continue; /* running in one piece, or every piece handed out */
        if (!waits_met(x, in) || (!taken && !claim(x, i)))
            continue;
        int64_t t = now_ns();
        bool signalled;
        if (!run_instr(x, i, t, t, &signalled))
            continue;
        x->mw->steals++;
        x->mw->joins += taken;
        int64_t d = now_ns() - t;
        return d > 0 ? d : 1;
    }
    return 0;
}

/* Spin until counter c reaches target: prefetch the waiting instruction's first weight
   lines (one line per spin, MEGA_PREFETCH_LINES per matrix), after MEGA_STEAL_SPINS
   pauses help the counter's late signallers, after s->spins (MEGA_SPINS, or
   MEGA_SPINS_OVER with more workers than cores, so those still progress) yield the CPU
   between checks. With no more workers than cores a yield cannot help the worker waited
   on (it has a core of its own; if it lost it, stealing runs its ready work), so the bound
   is long: a yield is a system call that also evicts the waiter's cache lines. Between
   steps the team's workers spin briefly and then sleep (core/team.c), so an idle engine
   uses ~0% CPU. */
static void wait_counter(const struct mega_ctx *x, int c, uint64_t target,
                         const struct prog_instr *in)
{
    _Atomic uint64_t *v = &x->pl->counters[c].v;
    x->mw->syncs++;
    if (atomic_load_explicit(v, memory_order_acquire) >= target)
        return;
    int64_t t0 = now_ns(), worked = 0; /* time running others' work is not waiting */
    const char *w2 = NULL, *w1 = in ? first_weights(x->st, in, &w2) : NULL;
    for (int i = 0; atomic_load_explicit(v, memory_order_acquire) < target; i++) {
        if (i < MEGA_PREFETCH_LINES) {
            if (w1)
                __builtin_prefetch(w1 + 64 * i, 0, 3);
            if (w2)
                __builtin_prefetch(w2 + 64 * i, 0, 3);
        }
        /* help late signallers every 16 pauses once MEGA_STEAL_SPINS have gone, and on
           every round once yielding (a yield can take a whole time slice on a busy core,
           so counting rounds alone would wait for a late worker for milliseconds) */
        const bool yielding = i >= x->s->spins;
        if (yielding || (i >= MEGA_STEAL_SPINS && (i & 15) == 0)) {
            int64_t d = steal_for(x, c);
            worked += d;
            if (d)
                continue;
        }
        if (i < x->s->spins)
            mega_pause();
        else
            sched_yield();
    }
    int64_t waited = now_ns() - t0 - worked;
    x->mw->wait_ns += waited > 0 ? (uint64_t)waited : 0;
}

/* Worker w's step: its queue in order. A worker done with its queue waits on the last
   stage's counter, and so runs the LM head's slices its late owner has not started (the
   program cuts the head into slices of ~2048 rows when a step has few logit rows) instead
   of leaving the step's tail to one worker. */
static void mega_worker_run(void *ctx, int w, int n)
{
    struct mega_state *s = ctx;
    struct mega_ctx x = {
        .s = s, .st = s->st, .pl = s->cur, .mw = &s->workers[w],
        .scratch = s->scratch + (size_t)w * s->stride, .epoch = s->cur->epoch + 1, .w = w,
    };
    const struct program *p = x.st->p;
    if (s->lazy_us && w == n - 1 && n > 1) {
        struct timespec nap = {0, (long)s->lazy_us * 1000};
        nanosleep(&nap, NULL);
    }
    bool robbed = false; /* once an instruction of ours ran elsewhere, the plan's pruned
                            waits (own earlier work, counters checked before) are unsafe */
    bool napped = false;
    for (int q = x.pl->queue_first[w]; q < x.pl->queue_first[w + 1]; q++) {
        int i = x.pl->queue[q];
        const struct prog_instr *in = &p->instrs[i];
        if (s->tail_us && w == n - 1 && n > 1 && !napped && in->stage == p->n_stages - 1) {
            struct timespec nap = {0, (long)s->tail_us * 1000};
            nanosleep(&nap, NULL);
            napped = true;
        }
        if (!claim(&x, i)) {
            robbed = true;
            continue;
        }
        int64_t t_start = s->tracing ? now_ns() : 0, t_met = t_start;
        if (in->wait >= 0 && (x.pl->check[i] || robbed)) {
            uint64_t target = (uint64_t)in->wait_count * x.epoch;
            for (int c = in->wait; c < in->wait + in->n_wait; c++)
                wait_counter(&x, c, target, in);
            t_met = s->tracing ? now_ns() : 0;
        }
        /* with pieces, another worker may finish it: what follows must check its waits */
        bool signalled;
        run_instr(&x, i, t_start, t_met, &signalled);
        if (!signalled)
            robbed = true;
    }
    /* Done with the queue: rather than leave while the last stage (the LM head, a few
       dozen slices at decode) runs late elsewhere, help it (its unclaimed slices, its
       pieces) until it is complete. Counts as waiting (the bubble). */
    const int last = p->instrs[p->n_instr - 1].signal;
    if (n > 1 && last >= 0)
        wait_counter(&x, last,
                     (uint64_t)(x.pl->sig_first[last + 1] - x.pl->sig_first[last]) * x.epoch,
                     NULL);
}

static int trace_prepare(struct mega_state *s, const struct mega_plan *pl, struct weld_err *e)
{
    for (int w = 0; w < s->n_workers; w++) {
        int rc = trace_reserve(s->trace, w, pl->n_instr, e); /* stealing: any of them */
        if (rc)
            return rc;
    }
    return WELD_OK;
}

static int mega_run(void *state, const struct exec_step *st, struct weld_err *e)
{
    struct mega_state *s = state;
    struct mega_plan *pl;
    int rc = get_plan(s, st, &pl, e);
    if (rc)
        return rc;
    s->tracing = trace_active(s->trace);
    if (s->tracing && (rc = trace_prepare(s, pl, e)))
        return rc;
    s->st = st;
    s->cur = pl;
    int64_t t0 = now_ns();
    team_run(s->team, mega_worker_run, s);
    s->stats.step_s += (double)(now_ns() - t0) * 1e-9;
    s->stats.steps++;
    s->stats.tokens += st->p->n_tokens;
    pl->epoch++;
    s->st = NULL;
    s->cur = NULL;
    /* the step itself succeeded: a trace that cannot be written must not undo it */
    struct weld_err te;
    if (s->tracing && trace_step_done(s->trace, &te))
        log_warn("exec mega: %s", te.msg);
    return WELD_OK;
}

/* ---- lifetime and queries ------------------------------------------------------------ */

static void mega_free(void *state)
{
    struct mega_state *s = state;
    if (!s)
        return;
    team_free(s->team);
    for (int i = 0; i < MEGA_PLANS; i++)
        plan_free(s->plans[i]);
    trace_free(s->trace);
    wfree(s->scratch);
    wfree(s->workers_raw);
    wfree(s);
}

/* WELD_TRACE=FILE (a debugging variable, docs/TUNING.md): trace the first steps. */
static int trace_from_env(struct mega_state *s, int steps, struct weld_err *e)
{
    const char *path = getenv("WELD_TRACE");
    if (!path || !*path)
        return WELD_OK;
    return trace_create(&s->trace, path, s->n_workers, steps > 0 ? steps : MEGA_TRACE_STEPS, e);
}

static int mega_create(void **out, const struct model_config *c, const struct exec_params *xp,
                       struct weld_err *e)
{
    *out = NULL;
    struct mega_state *s = wcalloc(1, sizeof *s);
    if (!s)
        return err_set(e, WELD_ERR_NOMEM, "exec mega: out of memory");
    int rc = team_create(&s->team, xp ? xp->n_threads : 0, xp ? xp->team_flags : 0, e);
    if (rc)
        goto fail;
    s->n_workers = team_size(s->team);
    s->lazy_us = xp && xp->test_lazy_us > 0 ? xp->test_lazy_us : 0;
    s->tail_us = xp && xp->test_late_tail_us > 0 ? xp->test_late_tail_us : 0;
    s->slow_piece_us = xp && xp->test_slow_piece_us > 0 ? xp->test_slow_piece_us : 0;
    s->spins = s->n_workers > team_physical_cores() ? MEGA_SPINS_OVER : MEGA_SPINS;
    s->stats.n_workers = s->n_workers;
    /* the scratch base is only 16-byte aligned, so pad one line between workers */
    s->stride = (exec_scratch_floats(c) + 15) / 16 * 16 + 16;
    s->scratch = wcalloc((size_t)s->n_workers, s->stride * sizeof(float));
    s->workers_raw = wcalloc((size_t)s->n_workers + 1, sizeof(struct mega_worker));
    if (!s->scratch || !s->workers_raw) {
        rc = err_set(e, WELD_ERR_NOMEM, "exec mega: out of memory for %d workers",
                     s->n_workers);
        goto fail;
    }
    s->workers = (struct mega_worker *)(((uintptr_t)s->workers_raw + 63) & ~(uintptr_t)63);
    if ((rc = trace_from_env(s, xp ? xp->trace_steps : 0, e)))
        goto fail;
    *out = s;
    return WELD_OK;
fail:
    mega_free(s);
    return rc;
}

static int mega_n_workers(const void *state)
{
    const struct mega_state *s = state;
    return s->n_workers;
}

static int mega_n_splits(const void *state)
{
    int n = mega_n_workers(state);
    return n > 1 ? MEGA_SPLITS_PER_WORKER * n : 1;
}

static unsigned mega_prog_flags(const void *state)
{
    (void)state;
    return PROG_HEAD_DEPS;
}

static void mega_stats(void *state, struct exec_stats *out, bool reset)
{
    struct mega_state *s = state;
    *out = s->stats;
    for (int w = 0; w < s->n_workers; w++) {
        out->syncs += (long long)s->workers[w].syncs;
        out->wait_s += (double)s->workers[w].wait_ns * 1e-9;
        out->steals += (long long)s->workers[w].steals;
        out->joins += (long long)s->workers[w].joins;
    }
    if (reset) {
        memset(&s->stats, 0, sizeof s->stats);
        s->stats.n_workers = s->n_workers;
        for (int w = 0; w < s->n_workers; w++)
            s->workers[w].syncs = s->workers[w].wait_ns = s->workers[w].steals =
                s->workers[w].joins = 0;
    }
}

static void mega_park(void *state)
{
    struct mega_state *s = state;
    team_park(s->team);
}

const struct executor_impl exec_mega_impl = {
    .name = "mega",
    .desc = "megakernel: per-worker queues, dependency counters, no barriers",
    .create = mega_create,
    .free = mega_free,
    .run = mega_run,
    .n_workers = mega_n_workers,
    .n_splits = mega_n_splits,
    .prog_flags = mega_prog_flags,
    .park = mega_park,
    .stats = mega_stats,
};
