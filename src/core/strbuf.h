/*
 * strbuf - a growable, always NUL-terminated text buffer for code that writes text
 * piecewise (grammar compilers). Out of memory is sticky: later writes do nothing and
 * `oom` says the text is incomplete, so a writer checks once at the end.
 */
#ifndef WELD_CORE_STRBUF_H
#define WELD_CORE_STRBUF_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>

struct strbuf {
    char *p; /* wfree it; NULL until the first write */
    size_t n, cap;
    bool oom;
};

void strbuf_put(struct strbuf *b, const char *s, size_t n);
void strbuf_printf(struct strbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void strbuf_vprintf(struct strbuf *b, const char *fmt, va_list ap)
    __attribute__((format(printf, 2, 0)));

#endif
