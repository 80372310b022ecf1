/*
 * stop - stop-string matcher (design at the top of stop.h).
 *
 * Layout: buf[0..emit) is what the previous call handed out (dropped at the start of the
 * next call), buf[emit..len) is held text. Held text never contains a full stop string
 * while armed, and is at most (longest stop - 1) bytes after a call returns, so searching
 * it with memmem for every stop string stays cheap.
 */
#include "engine/stop.h"

#include "core/alloc.h"

#include <stdint.h>
#include <string.h>

struct stop_matcher {
    char **stops;       /* (n) NUL-terminated copies */
    size_t *lens;       /* (n) */
    int n;
    size_t max_len;
    bool include_stop, armed, done;
    int matched;        /* index into stops, or -1 */
    char *buf;          /* (cap) */
    size_t cap, len, emit;
};

bool stop_utf8_valid(const char *s, size_t len)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0;
    while (i < len) {
        unsigned c = p[i];
        size_t n;
        uint32_t cp, min;
        if (c < 0x80) {
            i++;
            continue;
        } else if ((c & 0xE0) == 0xC0) {
            n = 1, cp = c & 0x1F, min = 0x80;
        } else if ((c & 0xF0) == 0xE0) {
            n = 2, cp = c & 0x0F, min = 0x800;
        } else if ((c & 0xF8) == 0xF0) {
            n = 3, cp = c & 0x07, min = 0x10000;
        } else {
            return false;
        }
        if (len - i <= n)
            return false;
        for (size_t k = 1; k <= n; k++) {
            if ((p[i + k] & 0xC0) != 0x80)
                return false;
            cp = (cp << 6) | (p[i + k] & 0x3F);
        }
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
            return false;
        i += n + 1;
    }
    return true;
}

void stop_free(struct stop_matcher *m)
{
    if (!m)
        return;
    for (int i = 0; i < m->n; i++)
        wfree(m->stops[i]);
    wfree(m->stops);
    wfree(m->lens);
    wfree(m->buf);
    wfree(m);
}

int stop_create(struct stop_matcher **out, const char *const *stops, int n, bool include_stop,
                struct weld_err *e)
{
    *out = NULL;
    if (n < 0 || (n > 0 && !stops))
        return err_set(e, WELD_ERR_INVALID_ARG, "stop: %d stop strings", n);
    struct stop_matcher *m = wcalloc(1, sizeof *m);
    if (!m)
        return err_set(e, WELD_ERR_NOMEM, "stop: out of memory");
    m->include_stop = include_stop;
    m->armed = true;
    m->matched = -1;
    if (n > 0) {
        m->stops = wcalloc((size_t)n, sizeof *m->stops);
        m->lens = wcalloc((size_t)n, sizeof *m->lens);
        if (!m->stops || !m->lens)
            goto nomem;
    }
    for (int i = 0; i < n; i++) {
        size_t l = stops[i] ? strlen(stops[i]) : 0;
        if (l == 0 || !stop_utf8_valid(stops[i], l)) {
            stop_free(m);
            return err_set(e, WELD_ERR_INVALID_ARG, "stop[%d]: %s", i,
                           l == 0 ? "empty stop string" : "not valid UTF-8");
        }
        if (!(m->stops[i] = wstrdup(stops[i])))
            goto nomem;
        m->lens[i] = l;
        m->n = i + 1;
        if (l > m->max_len)
            m->max_len = l;
    }
    *out = m;
    return WELD_OK;
nomem:
    stop_free(m);
    return err_set(e, WELD_ERR_NOMEM, "stop: out of memory");
}

void stop_arm(struct stop_matcher *m, bool armed) { m->armed = armed; }
int stop_matched_index(const struct stop_matcher *m) { return m->matched; }
size_t stop_max_len(const struct stop_matcher *m) { return m->max_len; }

const char *stop_string(const struct stop_matcher *m, int i)
{
    return i >= 0 && i < m->n ? m->stops[i] : NULL;
}

/* Drop what the previous call emitted and append text; false when out of memory. */
static bool stop_append(struct stop_matcher *m, const char *text, size_t len)
{
    if (m->emit) {
        memmove(m->buf, m->buf + m->emit, m->len - m->emit);
        m->len -= m->emit;
        m->emit = 0;
    }
    if (len > SIZE_MAX / 2 - m->len)
        return false;
    if (m->len + len > m->cap) {
        size_t cap = m->cap ? m->cap : 64;
        while (cap < m->len + len)
            cap *= 2;
        char *nb = wrealloc(m->buf, cap);
        if (!nb)
            return false;
        m->buf = nb;
        m->cap = cap;
    }
    if (len)
        memcpy(m->buf + m->len, text, len);
    m->len += len;
    return true;
}

/* Earliest full match in buf: its position and stop index; false if none. */
static bool stop_find(const struct stop_matcher *m, size_t *pos, int *idx)
{
    bool found = false;
    if (!m->buf)
        return false;
    for (int i = 0; i < m->n; i++) {
        const char *hit = memmem(m->buf, m->len, m->stops[i], m->lens[i]);
        if (hit && (!found || (size_t)(hit - m->buf) < *pos)) {
            *pos = (size_t)(hit - m->buf);
            *idx = i;
            found = true;
        }
    }
    return found;
}

/* Length of the longest suffix of buf that is a proper prefix of some stop string. */
static size_t stop_hold_len(const struct stop_matcher *m)
{
    size_t kmax = m->max_len ? m->max_len - 1 : 0;
    if (kmax > m->len)
        kmax = m->len;
    for (size_t k = kmax; k > 0; k--) {
        const char *suf = m->buf + m->len - k;
        for (int i = 0; i < m->n; i++)
            if (m->lens[i] > k && !memcmp(m->stops[i], suf, k))
                return k;
    }
    return 0;
}

/* Move a cut point back onto a UTF-8 character boundary. */
static size_t utf8_floor(const char *s, size_t cut)
{
    while (cut > 0 && ((unsigned char)s[cut] & 0xC0) == 0x80)
        cut--;
    return cut;
}

int stop_push(struct stop_matcher *m, const char *text, size_t len, const char **out,
              size_t *out_len, bool *matched, struct weld_err *e)
{
    *out = "";
    *out_len = 0;
    *matched = false;
    if (m->done)
        return WELD_OK;
    if (!stop_append(m, text, len))
        return err_set(e, WELD_ERR_NOMEM, "stop: out of memory holding %zu bytes", len);
    size_t pos = 0;
    int idx = -1;
    if (m->armed && stop_find(m, &pos, &idx)) {
        m->done = true;
        m->matched = idx;
        *matched = true;
        *out = m->buf;
        *out_len = m->include_stop ? pos + m->lens[idx] : pos;
        m->emit = m->len; /* the rest is discarded */
        return WELD_OK;
    }
    size_t cut = m->len - stop_hold_len(m);
    if (cut < m->len)
        cut = utf8_floor(m->buf, cut);
    *out = m->buf ? m->buf : "";
    *out_len = cut;
    m->emit = cut;
    return WELD_OK;
}

void stop_flush(struct stop_matcher *m, const char **out, size_t *out_len)
{
    *out = "";
    *out_len = 0;
    if (m->done || !m->buf)
        return;
    *out = m->buf + m->emit;
    *out_len = m->len - m->emit;
    m->emit = m->len;
    m->done = true;
}
