/*
 * exec - executors: strategies for running a program's instruction list.
 *
 * An executor owns its run-time state (worker scratch, dependency counters, a pinned
 * thread team) and runs one step's program with exec_op_run() for every instruction. All
 * executors give bit-identical results; they differ in scheduling only.
 *
 *   mega  the megakernel (exec_mega.c): a persistent pinned team where every worker runs
 *         its own queue of instructions, fixed once per program by a cost model (weight
 *         bytes + FLOPs, longest-processing-time first, balanced per stage), and waits
 *         only on the counters its next instruction names (each on its own cache line,
 *         waited to expected * epoch so they are never reset), prefetching that
 *         instruction's first weight lines while it spins; no barriers. Asks for
 *         PROG_HEAD_DEPS programs (attention waits on its own heads' projections only).
 *         Spins then sleeps between steps (core/team.c): an idle engine uses ~0% CPU.
 *         Records stats (bubble, syncs) and, with WELD_TRACE=FILE, a Chrome trace of the
 *         first exec_params.trace_steps (default 4) steps (trace.h).
 *   ops   a persistent pinned thread team (core/team.h); every worker walks the stages
 *         in order, claims instructions of the current stage until none are left and
 *         meets the others at a barrier after every stage (llama.cpp's way of running a
 *         graph); exec_ops.c
 *   ref   single thread, list order, checks every instruction's waits are already met
 *         (the correctness oracle, and a check that the program's order is a valid
 *         schedule)
 *
 * Any executor runs any program (default or PROG_HEAD_DEPS). Chosen at run time by name
 * (exec_tuning.executor, `--exec`); without one: "mega" when more than one thread is
 * asked for, else "ref". An unknown name is an error listing the available ones.
 */
#ifndef WELD_EXEC_EXEC_H
#define WELD_EXEC_EXEC_H

#include "exec/ops.h"

/* How an executor with workers is set up (NULL where a create takes it: the defaults). */
struct exec_params {
    int n_threads;        /* workers; <= 0: one per physical core (team_default_size) */
    unsigned team_flags;  /* enum team_flags: TEAM_OVERSUBSCRIBE for tests */
    int test_lazy_us;     /* tests: the last worker sleeps this long at the start of every
                             step (mega: the others must run its instructions) */
    int test_late_tail_us; /* tests: the last worker sleeps this long before it starts on
                              the last stage (mega: the others must run that stage) */
    int test_slow_piece_us; /* tests: the last worker sleeps this long after each piece of
                               an instruction it runs in pieces (mega: others must join) */
    int trace_steps;      /* mega with WELD_TRACE=FILE: steps traced; <= 0: 4 */
};

/* What an executor measured over the steps since its creation or the last reset. The
   bubble is wait_s / (n_workers * step_s): the share of worker time spent waiting on
   dependency counters. */
struct exec_stats {
    const char *executor;    /* its name */
    long long steps, tokens; /* steps run and the tokens they carried */
    long long syncs;         /* waits: counter checks (mega), barrier arrivals (ops);
                                summed over workers */
    double wait_s;           /* worker time spent in those waits (summed) */
    long long steals;        /* mega: instructions a waiting worker ran for a late owner */
    long long joins;         /* mega: of those, running ones whose remaining pieces it
                                shared with the owner */
    double step_s;           /* wall time of the steps, from run start to end */
    int n_workers;
};

struct executor_impl {
    const char *name;
    const char *desc;
    /* Per-runner state for model config c (scratch sized for it); xp may be NULL. */
    int (*create)(void **state, const struct model_config *c, const struct exec_params *xp,
                  struct weld_err *e);
    void (*free)(void *state);
    /* Run every instruction of st->p. */
    int (*run)(void *state, const struct exec_step *st, struct weld_err *e);
    /* Workers the state runs on. */
    int (*n_workers)(const void *state);
    /* Row slices per stage its programs should be built with (backend n_splits 0). */
    int (*n_splits)(const void *state);
    /* optional: enum prog_flags its programs should be built with (NULL: 0) */
    unsigned (*prog_flags)(const void *state);
    /* optional: let the workers sleep now instead of spinning for the next step */
    void (*park)(void *state);
    /* optional: stats since creation or the last reset (reset: start again from zero) */
    void (*stats)(void *state, struct exec_stats *out, bool reset);
};

extern const struct executor_impl exec_ref_impl;
extern const struct executor_impl exec_ops_impl;
extern const struct executor_impl exec_mega_impl;

/* Look up an executor by name (backend.c); WELD_ERR_NOT_FOUND names the available ones. */
int executor_find(const struct executor_impl **out, const char *name, struct weld_err *e);
/* The executor called name; NULL or "": "mega" if n_threads > 1, else "ref". */
int executor_choose(const struct executor_impl **out, const char *name, int n_threads,
                    struct weld_err *e);

/* The cpu backend context's executor stats (backend_cpu.c; WELD_ERR_UNSUPPORTED when its
   executor keeps none). ctx is a backend_cpu context. */
int backend_cpu_exec_stats(void *ctx, struct exec_stats *out, bool reset, struct weld_err *e);

#endif
