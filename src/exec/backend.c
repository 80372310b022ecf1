/*
 * backend - the registries of built-in backends and executors, and backend parameters.
 *
 * Backends compiled into this build are listed in `backends` (a CUDA backend, a later
 * issue, adds itself under #ifdef WELD_HAVE_CUDA), executors in `executors`; both are
 * looked up by name the one way (registry_find), an unknown name being an error that
 * lists the names there are.
 */
#include "exec/backend.h"

#include "exec/exec.h"
#include "exec/kv.h"

#include <limits.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const struct backend_iface *const backends[] = {&backend_cpu};
static const struct executor_impl *const executors[] = {&exec_ref_impl, &exec_ops_impl,
                                                         &exec_mega_impl};
#define N_OF(a) (sizeof a / sizeof a[0])
_Static_assert(offsetof(struct backend_iface, name) == 0, "registry_find reads the name first");
_Static_assert(offsetof(struct executor_impl, name) == 0, "registry_find reads the name first");

/* The entry called name of a table of n structs whose first member is their name
   (`const char *name`, so a pointer to the struct is one to its name); else
   WELD_ERR_NOT_FOUND: "unknown <what> 'name' (available: a, b)". */
static int registry_find(const void *const *table, size_t n, const char *what, const char *name,
                         const void **out, struct weld_err *e)
{
    *out = NULL;
    for (size_t i = 0; i < n; i++)
        if (strcmp(*(const char *const *)table[i], name) == 0) {
            *out = table[i];
            return WELD_OK;
        }
    char list[256] = "";
    size_t len = 0;
    for (size_t i = 0; i < n && len < sizeof list; i++)
        len += (size_t)snprintf(list + len, sizeof list - len, "%s%s", i ? ", " : "",
                                *(const char *const *)table[i]);
    return err_set(e, WELD_ERR_NOT_FOUND, "unknown %s '%s' (available: %s)", what, name, list);
}

int backend_find(const struct backend_iface **out, const char *name, struct weld_err *e)
{
    const void *p;
    int rc = registry_find((const void *const *)backends, N_OF(backends), "accelerator",
                           name && *name ? name : "cpu", &p, e);
    *out = p;
    return rc;
}

int executor_find(const struct executor_impl **out, const char *name, struct weld_err *e)
{
    const void *p;
    int rc = registry_find((const void *const *)executors, N_OF(executors), "executor", name,
                           &p, e);
    *out = p;
    return rc;
}

int executor_choose(const struct executor_impl **out, const char *name, int n_threads,
                    struct weld_err *e)
{
    if (!name || !*name)
        name = n_threads > 1 ? "mega" : "ref";
    return executor_find(out, name, e);
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
    int kv_dim, hd;
    bool latent;
    kv_shape_for(c, &kv_dim, &hd, &latent);
    return kv_block_bytes(c->n_layer, kv_dim, hd, block_size ? block_size : KV_DEFAULT_BLOCK_SIZE,
                          kv_type, latent);
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
