/*
 * backend - the registry of built-in backends and WELD_ACCELERATOR handling.
 *
 * Backends compiled into this build are listed in `backends`; a CUDA backend (a later
 * issue) adds itself under #ifdef WELD_HAVE_CUDA.
 */
#include "exec/backend.h"

#include "exec/kv.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const struct backend_iface *const backends[] = {&backend_cpu};
#define N_BACKENDS (sizeof backends / sizeof backends[0])

int backend_find(const struct backend_iface **out, const char *name, struct weld_err *e)
{
    *out = NULL;
    for (size_t i = 0; i < N_BACKENDS; i++)
        if (strcmp(backends[i]->name, name) == 0) {
            *out = backends[i];
            return WELD_OK;
        }
    char list[256] = "";
    size_t n = 0;
    for (size_t i = 0; i < N_BACKENDS && n < sizeof list; i++)
        n += (size_t)snprintf(list + n, sizeof list - n, "%s%s", i ? ", " : "",
                              backends[i]->name);
    return err_set(e, WELD_ERR_NOT_FOUND,
                   "WELD_ACCELERATOR=%s: backend not built in; available: %s", name, list);
}

int backend_from_env(const struct backend_iface **out, struct weld_err *e)
{
    const char *name = getenv("WELD_ACCELERATOR");
    return backend_find(out, name && *name ? name : "cpu", e);
}

void backend_params_init(struct backend_params *p, int max_seqs, int max_ctx)
{
    *p = (struct backend_params){.max_seqs = max_seqs, .max_ctx = max_ctx,
                                 .kv_type = KV_DEFAULT_TYPE};
}

size_t backend_kv_block_bytes(const struct model_config *c, enum weld_dtype kv_type,
                              int block_size)
{
    if ((long long)c->n_kv_head * c->head_dim > INT_MAX)
        return 0;
    return kv_block_bytes(c->n_layer, c->n_kv_head * c->head_dim, c->head_dim,
                          block_size ? block_size : KV_DEFAULT_BLOCK_SIZE, kv_type);
}

int backend_kv_blocks_for_bytes(const struct model_config *c, enum weld_dtype kv_type,
                                int block_size, size_t bytes)
{
    size_t per = backend_kv_block_bytes(c, kv_type, block_size);
    if (!per)
        return 0;
    size_t n = bytes / per;
    return n > INT_MAX ? INT_MAX : (int)n;
}
