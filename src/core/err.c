/*
 * err - see err.h. Plain formatted strings in a caller-owned buffer; no allocation, so an
 * out-of-memory error can always be reported.
 */
#include "core/err.h"

#include <stdarg.h>
#include <string.h>

int err_set(struct weld_err *e, enum weld_status s, const char *fmt, ...)
{
    if (!e)
        return s;
    e->status = s;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
    return s;
}

int err_prefix(struct weld_err *e, const char *fmt, ...)
{
    if (!e)
        return WELD_ERR_INTERNAL;
    char prefix[512], old[sizeof e->msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, e->msg, sizeof old);
    snprintf(e->msg, sizeof e->msg, "%s: %s", prefix, old);
    return e->status;
}

void err_clear(struct weld_err *e)
{
    if (!e)
        return;
    e->status = WELD_OK;
    e->msg[0] = '\0';
}

const char *weld_status_str(enum weld_status s)
{
    switch (s) {
    case WELD_OK: return "ok";
    case WELD_ERR_IO: return "i/o error";
    case WELD_ERR_FORMAT: return "format error";
    case WELD_ERR_UNSUPPORTED: return "unsupported";
    case WELD_ERR_NOMEM: return "out of memory";
    case WELD_ERR_INVALID_ARG: return "invalid argument";
    case WELD_ERR_NOT_FOUND: return "not found";
    case WELD_ERR_LIMIT: return "limit exceeded";
    case WELD_ERR_INTERNAL: return "internal error";
    }
    return "unknown status";
}

const char *weld_version(void)
{
    return WELD_VERSION_STRING;
}
