/*
 * tuning (cli) - the one place the executor and kernel settings are parsed: the option
 * group --accelerator NAME, --exec NAME and --tune KEY=VALUE (repeatable) of every
 * command that runs a model (generate, chat, batch, serve, bench), and the same KEY=VALUE
 * settings of a `weld bench --pair` side. They fill a struct exec_tuning (exec/tuning.h),
 * which is passed down explicitly; the library reads no environment for it.
 *
 * Each key is one row of `keys` (name, values, meaning, default), which also writes the
 * error for an unknown key or a bad value, so the list a user sees is the list there is.
 * docs/TUNING.md says when to change them. "auto" gives any key its automatic choice back
 * (a later --tune, or a --pair side, overriding an earlier one).
 */
#include "cli/cli.h"

#include "exec/backend.h"
#include "exec/exec.h"
#include "exec/program.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum key_kind { KEY_COUNT, KEY_SWITCH, KEY_PAIRS, KEY_BOOL };

struct tune_key {
    const char *name;
    enum key_kind kind;
    long max;         /* KEY_COUNT: values 1..max */
    size_t off;       /* of the field in struct exec_tuning: int or enum, KEY_BOOL bool */
    const char *help; /* values and default */
};

#define F(field) offsetof(struct exec_tuning, field)
static const struct tune_key keys[] = {
    {"kv_groups", KEY_COUNT, 4096, F(kv_groups),
     "N: KV cache head groups, 1 block-major .. KV heads per-head (default: the executor's "
     "splits)"},
    {"k_parts", KEY_COUNT, PROG_KPARTS_MAX, F(k_parts),
     "N: O and down products in N parts along K (default 1: none)"},
    {"decode_pairs", KEY_PAIRS, 0, F(decode_pairs),
     "0, 1 or long: weight streams per core of one-token Q8_0 / Q4_0 products (default: by CPU)"},
    {"l2_prefetch", KEY_SWITCH, 0, F(l2_prefetch),
     "0 or 1: AVX-512 kernels also prefetch weights into L2 (default: by CPU)"},
    {"repack", KEY_SWITCH, 0, F(repack),
     "0 or 1: weights into the kernels' repacked layouts where faster (default 1)"},
    {"trace_steps", KEY_COUNT, 1000000, F(trace_steps),
     "N: steps a WELD_TRACE=FILE trace covers (default 4)"},
    {"dump_program", KEY_BOOL, 0, F(dump_program),
     "0 or 1: print every program built to stderr (default 0)"},
    {"tp_overlap", KEY_SWITCH, 0, F(tp_overlap),
     "0 or 1: tensor parallelism overlaps a prefill's exchanges with its products (default 1)"},
};
#undef F
#define N_KEYS (sizeof keys / sizeof keys[0])

static int key_value(const struct tune_key *k, const char *v, int *out)
{
    if (!strcmp(v, "auto")) {
        *out = 0;
        return 0;
    }
    if (k->kind == KEY_SWITCH || k->kind == KEY_BOOL) {
        if (strcmp(v, "0") && strcmp(v, "1"))
            return -1;
        *out = k->kind == KEY_BOOL ? v[0] == '1' : v[0] == '1' ? TUNE_ON : TUNE_OFF;
        return 0;
    }
    if (k->kind == KEY_PAIRS) {
        *out = !strcmp(v, "0") ? PAIRS_OFF : !strcmp(v, "1") ? PAIRS_ON
             : !strcmp(v, "long") ? PAIRS_LONG : -1;
        return *out < 0 ? -1 : 0;
    }
    char *end;
    long n = strtol(v, &end, 10);
    if (!*v || *end || n < 1 || n > k->max)
        return -1;
    *out = (int)n;
    return 0;
}

int cli_tune_set(struct exec_tuning *t, const char *kv, struct weld_err *e)
{
    const char *eq = strchr(kv, '=');
    size_t nl = eq ? (size_t)(eq - kv) : strlen(kv);
    for (size_t i = 0; i < N_KEYS; i++) {
        const struct tune_key *k = &keys[i];
        if (strlen(k->name) != nl || strncmp(k->name, kv, nl))
            continue;
        int v;
        if (!eq || key_value(k, eq + 1, &v)) {
            if (k->kind == KEY_COUNT)
                return err_set(e, WELD_ERR_INVALID_ARG, "%s: %s takes a number from 1 to %ld "
                               "or auto (%s)", kv, k->name, k->max, k->help);
            return err_set(e, WELD_ERR_INVALID_ARG, "%s: %s takes %s", kv, k->name, k->help);
        }
        if (k->kind == KEY_BOOL)
            *(bool *)((char *)t + k->off) = v;
        else
            *(int *)((char *)t + k->off) = v;
        return WELD_OK;
    }
    char list[256] = "";
    size_t n = 0;
    for (size_t i = 0; i < N_KEYS && n < sizeof list; i++)
        n += (size_t)snprintf(list + n, sizeof list - n, "%s%s", i ? ", " : "", keys[i].name);
    return err_set(e, WELD_ERR_INVALID_ARG, "%s: unknown key '%.*s' (keys: %s; "
                   "docs/TUNING.md)", kv, (int)nl, kv, list);
}

void cli_tune_help(FILE *f)
{
    fprintf(f, "--tune KEY=VALUE (repeatable; VALUE auto restores the default):\n");
    for (size_t i = 0; i < N_KEYS; i++)
        fprintf(f, "  %-13s %s\n", keys[i].name, keys[i].help);
}

int cli_exec_opts_table(struct cli_exec_opts *o, struct cli_opt *t)
{
    const struct cli_opt opts[CLI_EXEC_N_OPTS] = {
        {"exec", 0, OPT_STR, &o->exec, "NAME",
         "executor: mega, ops or ref (default: mega with more than one thread, else ref)"},
        {"tune", 0, OPT_STRS, &o->tune, "KEY=VALUE",
         "executor and kernel setting, repeatable: kv_groups, k_parts, decode_pairs, l2_prefetch, repack, trace_steps, dump_program, tp_overlap ('weld --help', docs/TUNING.md)"},
        {"accelerator", 0, OPT_STR, &o->accelerator, "NAME",
         "backend (default: cpu; an unknown name lists those built in)"},
        {"k-parts", 0, OPT_INT, &o->k_parts, "N",
         "cut the attention-output and down products in N parts along K, added in part order: the numbers of --tensor-parallel-size N in one process (default: 1)"},
        {"tensor-parallel-size", 0, OPT_INT, &o->tp_size, "N",
         "shard the model over N MPI ranks (-tp; start with mpirun -np N; rank 0 runs everything else)"},
        {"pipeline-parallel-size", 0, OPT_INT, &o->pp_size, "N",
         "cut the layers into N stages over MPI ranks (-pp; ranks = tp x pp; micro-batches of a step overlap across stages)"},
        {"enable-expert-parallel", 0, OPT_FLAG, &o->ep, NULL,
         "with -tp N, place a mixture of experts' routed experts whole over the N ranks (attention stays tensor-parallel)"},
        {"comm-timeout", 0, OPT_FLOAT, &o->comm_timeout, "SECONDS",
         "with several ranks: how long an exchange waits for a rank before failing (default: 60)"},
    };
    memcpy(t, opts, sizeof opts);
    return CLI_EXEC_N_OPTS;
}

int cli_exec_tuning(const struct cli_exec_opts *o, struct exec_tuning *t, struct weld_err *e)
{
    *t = exec_tuning_default();
    const struct backend_iface *be;
    const struct executor_impl *ex;
    int rc;
    if (o->accelerator && (rc = backend_find(&be, o->accelerator, e))) {
        err_prefix(e, "--accelerator");
        return rc;
    }
    if (o->exec && (rc = executor_find(&ex, o->exec, e))) {
        err_prefix(e, "--exec");
        return rc;
    }
    t->accelerator = o->accelerator;
    t->executor = o->exec;
    for (int i = 0; i < o->tune.n; i++)
        if ((rc = cli_tune_set(t, o->tune.v[i], e))) {
            err_prefix(e, "--tune");
            return rc;
        }
    if (o->k_parts < 0 || o->k_parts > PROG_KPARTS_MAX)
        return err_set(e, WELD_ERR_INVALID_ARG, "--k-parts %d: expected 1 to %d", o->k_parts,
                       PROG_KPARTS_MAX);
    if (o->k_parts)
        t->k_parts = o->k_parts;
    if (o->tp_size < 0 || o->tp_size > PROG_KPARTS_MAX || o->comm_timeout < 0)
        return err_set(e, WELD_ERR_INVALID_ARG, "--tensor-parallel-size %d: expected 1 to %d",
                       o->tp_size, PROG_KPARTS_MAX);
    if (o->tp_size > 1 && t->k_parts > 1 && t->k_parts != o->tp_size)
        return err_set(e, WELD_ERR_INVALID_ARG,
                       "--k-parts %d with --tensor-parallel-size %d: "
                       "tensor parallelism computes in %d parts",
                       t->k_parts, o->tp_size, o->tp_size);
    if (o->pp_size < 0 || o->pp_size > PROG_KPARTS_MAX)
        return err_set(e, WELD_ERR_INVALID_ARG, "--pipeline-parallel-size %d: expected 1 to %d",
                       o->pp_size, PROG_KPARTS_MAX);
    return cli_tp_start(o->tp_size, o->pp_size, o->ep, (double)o->comm_timeout, &t->tp, e);
}
