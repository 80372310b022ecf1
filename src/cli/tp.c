/*
 * tp (cli) - starting the ranks of a multi-process engine.
 *
 * `mpirun -np N weld CMD MODEL --tensor-parallel-size N ...` starts N copies of the same
 * command. Each parses its arguments as usual; cli_exec_tuning (every command that runs a
 * model calls it before loading anything) then calls cli_tp_start, which makes the group
 * (exec/backend_tp.h). Rank 0 goes on to run the command, its backend spanning the
 * ranks. Every other rank serves rank 0's steps (tp_worker_run) and exits the process
 * when rank 0 says stop, so only rank 0 ever writes the command's output. Rank 0 stops
 * the others at exit (atexit); if the group broke (a rank died or hung past
 * --comm-timeout), it aborts the job instead (MPI_Abort), so mpirun returns non-zero
 * and no rank is left waiting.
 *
 * A process started by mpirun without --tensor-parallel-size is refused when the job has
 * several ranks (N copies of a whole engine are not what anyone means).
 */
#include "cli/cli.h"

#include "comm/comm.h"
#include "core/log.h"
#include "exec/backend_tp.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static struct tp_group *group;

static void tp_atexit(void)
{
    if (!group)
        return;
    if (tp_group_broken(group)) {
        fflush(stdout);
        fprintf(stderr, "weld: the tensor-parallel ranks lost each other; ending the job\n");
        comm_abort(1);
    }
    tp_group_free(group);
    group = NULL;
    comm_finalize();
}

int cli_tp_start(int tp_size, int pp_size, bool ep, double timeout_s, struct tp_group **out,
                 struct weld_err *e)
{
    *out = NULL;
    if (group) { /* a second command in one process (tests): the same group */
        *out = group;
        return WELD_OK;
    }
    tp_size = tp_size < 1 ? 1 : tp_size;
    pp_size = pp_size < 1 ? 1 : pp_size;
    if (tp_size * pp_size == 1 && !comm_launched())
        return WELD_OK;
    int rc = comm_init(e);
    if (rc)
        return rc;
    if (tp_size * pp_size == 1) {
        if (comm_world_size() > 1)
            return err_set(e, WELD_ERR_INVALID_ARG,
                           "started as %d MPI ranks: pass "
                           "--tensor-parallel-size %d (or a pipeline of --pipeline-parallel-size "
                           "stages) to spread the model over them",
                           comm_world_size(), comm_world_size());
        return WELD_OK;
    }
    struct tp_group *g;
    if ((rc = tp_group_create(&g, tp_size, pp_size, ep, timeout_s, e)))
        return rc;
    if (tp_group_rank(g) != 0) {
        struct weld_err we = {0};
        rc = tp_worker_run(g, &we);
        if (rc)
            fprintf(stderr, "weld: tensor parallel rank %d (%s): %s\n", tp_group_rank(g),
                    comm_node_name(), we.msg);
        bool broken = tp_group_broken(g);
        tp_group_free(g);
        if (broken)
            comm_abort(1);
        comm_finalize();
        exit(rc ? 1 : 0);
    }
    group = g;
    atexit(tp_atexit);
    log_debug("%d ranks (tensor parallel %d x pipeline %d), rank 0 on %s", tp_size * pp_size,
              tp_size, pp_size, comm_node_name());
    *out = g;
    return WELD_OK;
}

/* The value of option `name` (or its alias) in argv: "--name V", "--name=V", "-alias V". */
static const char *arg_value(int argc, char **argv, const char *name, const char *alias)
{
    const size_t n = strlen(name);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--"))
            break;
        if (a[0] == '-' && a[1] == '-' && !strncmp(a + 2, name, n) && a[2 + n] == '=')
            return a + 3 + n;
        if (((a[0] == '-' && a[1] == '-' && !strcmp(a + 2, name)) ||
             (alias && a[0] == '-' && !strcmp(a + 1, alias))) &&
            i + 1 < argc)
            return argv[i + 1];
    }
    return NULL;
}

void cli_tp_early(int argc, char **argv)
{
    if (!comm_launched())
        return;
    const char *tp = arg_value(argc, argv, "tensor-parallel-size", "tp");
    const char *pp = arg_value(argc, argv, "pipeline-parallel-size", "pp");
    const char *to = arg_value(argc, argv, "comm-timeout", NULL);
    bool ep = false;
    for (int i = 1; i < argc && !ep; i++)
        ep = !strcmp(argv[i], "--enable-expert-parallel");
    const int t = tp ? atoi(tp) : 1, p = pp ? atoi(pp) : 1;
    if (t < 1 || p < 1 || t > 64 || p > 64 || t * p == 1)
        return; /* the command's own parser says what is wrong, or runs one process */
    struct tp_group *g;
    struct weld_err e = {0};
    if (cli_tp_start(t, p, ep, to ? atof(to) : 0.0, &g, &e)) {
        fprintf(stderr, "weld: %s\n", e.msg);
        comm_finalize();
        exit(1);
    }
}
