/*
 * strbuf - growable text (strbuf.h): capacity doubles; printf formats into a stack buffer
 * and goes through the heap only for long results.
 */
#include "core/strbuf.h"

#include "core/alloc.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

void strbuf_put(struct strbuf *b, const char *s, size_t n)
{
    if (b->oom)
        return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1)
            cap *= 2;
        char *p = wrealloc(b->p, cap);
        if (!p) {
            b->oom = true;
            return;
        }
        b->p = p, b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

void strbuf_vprintf(struct strbuf *b, const char *fmt, va_list ap)
{
    char buf[512];
    va_list again;
    va_copy(again, ap);
    int n = vsnprintf(buf, sizeof buf, fmt, ap);
    if (n >= 0 && (size_t)n < sizeof buf) {
        strbuf_put(b, buf, (size_t)n);
    } else if (n >= 0) {
        char *h = wmalloc((size_t)n + 1);
        if (h) {
            vsnprintf(h, (size_t)n + 1, fmt, again);
            strbuf_put(b, h, (size_t)n);
            wfree(h);
        } else {
            b->oom = true;
        }
    }
    va_end(again);
}

void strbuf_printf(struct strbuf *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    strbuf_vprintf(b, fmt, ap);
    va_end(ap);
}
