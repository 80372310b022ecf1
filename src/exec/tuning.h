/*
 * tuning (exec) - how a backend runs a model: which backend and executor, and the settings
 * of the executor and kernels that an A/B comparison or a debugging session may change.
 *
 * The struct is plain data passed down explicitly (backend_params.tuning, then
 * exec_weights_create and the executor's exec_params); nothing below cli/ reads the
 * environment for it. Zero-initialised, every field is the automatic choice, which is
 * also what a user gets without flags: exec_tuning_default() returns that. The CLI fills
 * it from --accelerator, --exec and --tune KEY=VALUE (cli/tuning.c holds the key names,
 * their checks and their help; docs/TUNING.md says when to change them).
 * The two names are read while a backend is made, not kept: the strings need only live
 * that long.
 *
 * Invariant: no field changes the numbers a step computes except k_parts (another
 * summation order, the same on every executor and thread count) and tp (the numbers of
 * k_parts equal to its size); executors are bit-identical, repacking and the kernels'
 * streaming choices are too.
 */
#ifndef WELD_EXEC_TUNING_H
#define WELD_EXEC_TUNING_H

#include <stdbool.h>

struct tp_group;

/* A setting with an automatic choice. */
enum tune_switch { TUNE_AUTO, TUNE_OFF, TUNE_ON };
/* How one-token products of repacked Q8_0 / Q4_0 weights stream them (AVX-512). */
enum tune_pairs { PAIRS_AUTO, PAIRS_OFF, PAIRS_ON, PAIRS_LONG };

struct exec_tuning {
    const char *accelerator; /* backend name; NULL or "": "cpu" */
    const char *executor;    /* "ref", "ops" or "mega"; NULL or "": mega when more than one
                                thread runs, else ref */
    int kv_groups;           /* KV cache head groups (exec/kv.h); 0: the program's splits */
    int k_parts;             /* O and down products in this many parts along K; 0 or 1:
                                none (program.h prog_kparts) */
    enum tune_pairs decode_pairs; /* AUTO: gemm_decode_flags (by CPU) */
    enum tune_switch l2_prefetch; /* AVX-512 weights also into L2; AUTO: by CPU */
    enum tune_switch repack;      /* weights into the kernels' layouts; AUTO: on */
    int trace_steps;         /* steps a WELD_TRACE trace covers; 0: 4 */
    bool dump_program;       /* print every program built to stderr */
    enum tune_switch tp_overlap; /* tensor parallelism: a prefill's O and down parts in two
                                    token groups, each group's exchange under the other's
                                    product; AUTO: on (program.h PROG_NO_OVERLAP) */
    struct tp_group *tp;     /* tensor parallelism (exec/backend_tp.h): the ranks the
                                group's model is sharded over; NULL: one process. Computes
                                the numbers of k_parts = the group's size */
};

/* Every automatic choice (the zero struct). */
static inline struct exec_tuning exec_tuning_default(void)
{
    return (struct exec_tuning){0};
}

#endif
