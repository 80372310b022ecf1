/*
 * exec - executors: strategies for running a program's instruction list.
 *
 * An executor owns its run-time state (worker scratch, dependency counters, later a
 * pinned thread team) and runs one step's program with exec_op_run() for every
 * instruction. All executors give bit-identical results; they differ in scheduling only.
 *
 *   ref   single thread, list order, checks every instruction's wait is already met
 *         (the correctness oracle, and a check that the program's order is a valid
 *         schedule)
 *   ops   a persistent pinned thread team (core/team.h); every worker walks the stages
 *         in order, claims instructions of the current stage until none are left and
 *         meets the others at a barrier after every stage (llama.cpp's way of running a
 *         graph); exec_ops.c
 *
 * Chosen at run time by WELD_EXEC; when unset or empty: "ops" when more than one thread
 * is asked for, else "ref". An unknown name is an error listing the available ones. The
 * megakernel ("mega") executor of a later issue registers here.
 */
#ifndef WELD_EXEC_EXEC_H
#define WELD_EXEC_EXEC_H

#include "exec/ops.h"

/* How an executor with workers is set up (NULL where a create takes it: the defaults). */
struct exec_params {
    int n_threads;        /* workers; <= 0: one per physical core (team_default_size) */
    unsigned team_flags;  /* enum team_flags: TEAM_OVERSUBSCRIBE for tests */
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
};

extern const struct executor_impl exec_ref_impl;
extern const struct executor_impl exec_ops_impl;

/* Look up an executor by name; WELD_ERR_NOT_FOUND names the available ones. */
int executor_find(const struct executor_impl **out, const char *name, struct weld_err *e);
/* The executor WELD_EXEC names; when unset or empty, "ops" if n_threads > 1 else "ref". */
int executor_from_env(const struct executor_impl **out, int n_threads, struct weld_err *e);

#endif
