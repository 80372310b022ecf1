/*
 * exec_ref - the single-threaded reference executor.
 *
 * Walks the instruction list in order. Before each instruction it checks that every counter
 * the instruction waits on has reached wait_count (a program whose list order is not a
 * valid schedule is a builder bug: WELD_ERR_INTERNAL naming the instruction); after it, it
 * bumps the instruction's signal counter. Counters are reset at the start of each step:
 * the single thread has no need for epochs.
 *
 * State: one scratch area (exec_scratch_floats) and a counter array grown on demand.
 */
#include "exec/exec.h"

#include "core/alloc.h"

#include <stdlib.h>
#include <string.h>

struct ref_state {
    float *scratch;
    int *counters;
    int n_counters_cap;
};

static void ref_free(void *state)
{
    struct ref_state *s = state;
    if (!s)
        return;
    wfree(s->scratch);
    wfree(s->counters);
    wfree(s);
}

static int ref_create(void **out, const struct model_config *c, const struct exec_params *xp,
                      struct weld_err *e)
{
    *out = NULL;
    struct ref_state *s = wcalloc(1, sizeof *s);
    if (!s || !(s->scratch = wcalloc(exec_scratch_floats(c), sizeof(float)))) {
        ref_free(s);
        return err_set(e, WELD_ERR_NOMEM, "exec ref: out of memory for scratch");
    }
    *out = s;
    return WELD_OK;
}

static int ref_run(void *state, const struct exec_step *st, struct weld_err *e)
{
    struct ref_state *s = state;
    const struct program *p = st->p;
    if (p->n_counters > s->n_counters_cap) {
        int *c = wrealloc(s->counters, (size_t)p->n_counters * sizeof(int));
        if (!c)
            return err_set(e, WELD_ERR_NOMEM, "exec ref: out of memory for %d counters",
                           p->n_counters);
        s->counters = c;
        s->n_counters_cap = p->n_counters;
    }
    memset(s->counters, 0, (size_t)p->n_counters * sizeof(int));
    for (int i = 0; i < p->n_instr; i++) {
        const struct prog_instr *in = &p->instrs[i];
        for (int k = 0; in->wait >= 0 && k < in->n_wait; k++) {
            int c = in->wait + k;
            if (c >= p->n_counters || s->counters[c] < in->wait_count)
                return err_set(e, WELD_ERR_INTERNAL,
                               "exec ref: instruction %d (%s, layer %d) waits on counter %d "
                               "for %d but it is %d: program order is not a valid schedule",
                               i, prog_op_name(in->op), in->layer, c, in->wait_count,
                               c < p->n_counters ? s->counters[c] : -1);
        }
        exec_op_run(st, in, s->scratch);
        if (in->signal >= 0 && in->signal < p->n_counters)
            s->counters[in->signal]++;
    }
    return WELD_OK;
}

static int ref_n_workers(const void *state) { return 1; }

const struct executor_impl exec_ref_impl = {
    .name = "ref",
    .desc = "single-threaded reference interpreter",
    .create = ref_create,
    .free = ref_free,
    .run = ref_run,
    .n_workers = ref_n_workers,
    .n_splits = ref_n_workers,
};
