/*
 * team - a persistent team of pinned worker threads with a spin barrier.
 *
 *     struct team *t;
 *     team_create(&t, 0, 0, &err);             // 0: one worker per physical core
 *     team_run(t, fn, ctx);                     // fn(ctx, worker, n_workers) on every
 *                                               // worker; returns when all are done
 *     ... inside fn: team_barrier(t) ...        // every worker of the run must call it
 *     team_free(t);
 *
 * The calling thread is worker 0, so a team of n has n - 1 threads of its own (a team of
 * one has none and team_run just calls fn). Workers 1..n-1 are pinned to the physical
 * cores after the first one (one logical CPU per core, from sysfs topology within the
 * process's affinity mask); the caller is left unpinned (its affinity is the caller's
 * business) and the scheduler keeps it on the remaining core. Pinning failures are logged
 * at debug level and ignored.
 *
 * Size: never more workers than physical cores (spinning barriers on shared cores are
 * catastrophic): a larger n is clamped with a warning unless TEAM_OVERSUBSCRIBE is given
 * (tests only: it also skips pinning, and waits yield early so they stay correct).
 *
 * Threading: one thread (the creator or any single thread at a time) calls team_run and
 * team_free; fn runs concurrently on every worker; team_barrier may only be called from
 * inside fn, by all n workers the same number of times. team_run is not reentrant.
 */
#ifndef WELD_CORE_TEAM_H
#define WELD_CORE_TEAM_H

#include "core/err.h"

struct team;

typedef void (*team_fn)(void *ctx, int worker, int n_workers);

enum team_flags {
    TEAM_OVERSUBSCRIBE = 1, /* allow more workers than physical cores (tests) */
};

/* n <= 0: team_default_size(). */
int team_create(struct team **out, int n, unsigned flags, struct weld_err *e);
void team_free(struct team *t);

int team_size(const struct team *t);

/* Run fn(ctx, w, n) for every worker w in [0, n) (w = 0 on the calling thread); returns
   when every worker has returned from fn. Everything a worker wrote in fn happens-before
   team_run returns; everything the caller wrote before team_run happens-before fn. */
void team_run(struct team *t, team_fn fn, void *ctx);

/* Wait until every worker of the current run has reached this barrier. Everything any
   worker wrote before it happens-before what every worker does after it. */
void team_barrier(struct team *t);

/* The workers stop spinning for a next job and sleep now (they wake on the next team_run
   as usual). For a caller that is about to idle, or to run another team on the same
   cores. Call between runs, from the thread that runs them. */
void team_park(struct team *t);

/* How long workers 0 and 1 of t (at least two) take to hand work back and forth: the
   median over `runs` runs of `rounds` round trips, in ns, where each side waits for the
   other's release-increment of a shared counter, then reads the n_lines (0..64) cache
   lines the other wrote and writes its own n_lines, as a megakernel's dependent
   instructions do. Worker 0 and 1 as the executors pin them, so it measures the host
   under the engine (on the 2-vCPU VMs here, 455 ns with no data, ~1 us with one line:
   the data is a second transfer after the counter's). WELD_ERR_INVALID_ARG for bad
   arguments, NOMEM. */
int team_handoff_ns(struct team *t, int n_lines, int rounds, int runs, double *ns,
                    struct weld_err *e);

/* Physical cores this process may run on (sysfs core_id x physical_package_id over the
   affinity mask; falls back to the online CPU count); at least 1. */
int team_physical_cores(void);
/* Default team size: team_physical_cores(). */
int team_default_size(void);

#endif
