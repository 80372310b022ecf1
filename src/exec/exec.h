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
 *
 * Chosen at run time by WELD_EXEC (default "ref"); an unknown name is an error listing the
 * available ones. The megakernel ("mega") and op-by-op ("ops") executors of later issues
 * register here.
 */
#ifndef WELD_EXEC_EXEC_H
#define WELD_EXEC_EXEC_H

#include "exec/ops.h"

struct executor_impl {
    const char *name;
    const char *desc;
    /* Per-runner state for model config c (scratch sized for it). */
    int (*create)(void **state, const struct model_config *c, struct weld_err *e);
    void (*free)(void *state);
    /* Run every instruction of st->p. */
    int (*run)(void *state, const struct exec_step *st, struct weld_err *e);
};

extern const struct executor_impl exec_ref_impl;

/* Look up an executor by name; WELD_ERR_NOT_FOUND names the available ones. */
int executor_find(const struct executor_impl **out, const char *name, struct weld_err *e);
/* The executor WELD_EXEC names, "ref" when unset or empty. */
int executor_from_env(const struct executor_impl **out, struct weld_err *e);

#endif
