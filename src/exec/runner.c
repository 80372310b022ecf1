/*
 * runner - a model bound to the backend its parameters name (see runner.h).
 *
 * A thin layer: it chooses the backend, fills in defaults and forwards calls, so the CLI
 * and engine never see backend interfaces or contexts.
 */
#include "exec/runner.h"

#include "exec/backend_tp.h"

#include "core/alloc.h"

#include <string.h>

struct runner {
    const struct model *m;
    const struct backend_iface *be;
    void *ctx;
    struct backend_params params;
};

int runner_create_ex(struct runner **out, const struct model *m,
                     const struct backend_params *params, struct weld_err *e)
{
    *out = NULL;
    if (!m)
        return err_set(e, WELD_ERR_INVALID_ARG, "runner: no model");
    const struct backend_iface *be;
    int rc = backend_find(&be, params->tuning.accelerator, e);
    if (rc)
        return rc;
    /* the group's model runs over its ranks; any other (a draft model) on this one */
    struct backend_params local;
    if (params->tuning.tp) {
        const struct model *gm = tp_group_model(params->tuning.tp);
        if (!gm || gm == m) {
            be = &backend_tp;
        } else {
            local = *params;
            local.tuning.tp = NULL;
            params = &local;
        }
    }
    struct runner *r = wcalloc(1, sizeof *r);
    if (!r)
        return err_set(e, WELD_ERR_NOMEM, "runner: out of memory");
    r->m = m;
    r->be = be;
    r->params = *params;
    if (r->params.max_ctx <= 0)
        r->params.max_ctx = m->cfg.max_ctx;
    if ((rc = be->ctx_create(&r->ctx, m, &r->params, e))) {
        wfree(r);
        return rc;
    }
    *out = r;
    return WELD_OK;
}

int runner_create(struct runner **out, const struct model *m, int max_seqs, int max_ctx,
                  struct weld_err *e)
{
    struct backend_params p;
    backend_params_init(&p, max_seqs, max_ctx);
    return runner_create_ex(out, m, &p, e);
}

int runner_forward(struct runner *r, const struct batch *b, float *logits,
                   struct weld_err *e)
{
    return r->be->forward(r->ctx, b, logits, NULL, NULL, e);
}

int runner_forward_top(struct runner *r, const struct batch *b, float *logits,
                       struct logits_top *tops, struct weld_err *e)
{
    return r->be->forward(r->ctx, b, logits, tops, NULL, e);
}

int runner_forward_hidden(struct runner *r, const struct batch *b, float *logits,
                          struct logits_top *tops, float *hidden, struct weld_err *e)
{
    return r->be->forward(r->ctx, b, logits, tops, hidden, e);
}

bool runner_comm_stats(const struct runner *r, struct comm_stats *out, bool reset)
{
    if (r->be != &backend_tp)
        return false;
    tp_group_stats(backend_tp_group(r->ctx), out, reset);
    return true;
}

bool runner_broken(const struct runner *r)
{
    return r->be->broken && r->be->broken(r->ctx);
}

void runner_park(struct runner *r)
{
    if (r->be->park)
        r->be->park(r->ctx);
}

size_t runner_block_bytes(const struct runner *r)
{
    return r->be->block_bytes ? r->be->block_bytes(r->ctx) : 0;
}

void runner_block_save(struct runner *r, const int32_t *blocks, int n, void *dst)
{
    r->be->block_save(r->ctx, blocks, n, dst);
}

void runner_block_load(struct runner *r, const int32_t *blocks, int n, const void *src)
{
    r->be->block_load(r->ctx, blocks, n, src);
}

void runner_drop_seq(struct runner *r, int seq_id)
{
    if (r)
        r->be->drop_seq(r->ctx, seq_id);
}

void runner_free(struct runner *r)
{
    if (!r)
        return;
    r->be->ctx_free(r->ctx);
    wfree(r);
}

int runner_n_vocab(const struct runner *r) { return r->m->cfg.n_vocab; }
int runner_max_ctx(const struct runner *r) { return r->params.max_ctx; }

int runner_seq_len(const struct runner *r, int seq_id)
{
    return r->be->seq_len ? r->be->seq_len(r->ctx, seq_id) : 0;
}

const char *runner_describe(const struct runner *r)
{
    return r->be->describe ? r->be->describe(r->ctx) : r->be->name;
}

int runner_exec_stats(struct runner *r, struct exec_stats *out, bool reset,
                      struct weld_err *e)
{
    /* only the cpu backend has executors (rank 0's, of a tensor-parallel group); a
       backend_iface member would generalise this */
    if (r->be == &backend_tp)
        return backend_cpu_exec_stats(backend_tp_local(r->ctx), out, reset, e);
    if (r->be != &backend_cpu) {
        memset(out, 0, sizeof *out);
        return err_set(e, WELD_ERR_UNSUPPORTED, "backend %s keeps no executor stats",
                       r->be->name);
    }
    return backend_cpu_exec_stats(r->ctx, out, reset, e);
}
