/*
 * backend - the registry of built-in backends and WELD_ACCELERATOR handling.
 *
 * Backends compiled into this build are listed in `backends`; a CUDA backend (a later
 * issue) adds itself under #ifdef WELD_HAVE_CUDA.
 */
#include "exec/backend.h"

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
