/*
 * fuzz_loadgen_sse - libFuzzer target for the load generator's event-stream parser and
 * OpenAI chunk reader (src/loadgen/loadgen_sse.c, the code `weld bench serve` runs on every
 * byte a server sends). The first input byte picks a piece size; the rest is fed (1) to a
 * plain SSE parser in one go, (2) to another in pieces of that size, and (3) in pieces to
 * the stream layer that parses each event as JSON and records timings. (1) and (2) must
 * dispatch the same events (a hash of them), or the target aborts: split invariance is the
 * parser's contract. Crashes, leaks and sanitizer reports are the other findings.
 * Seeds: tests/fuzz/corpus/fuzz_loadgen_sse/ (small streams).
 */
#include "loadgen/loadgen.h"

#include <stdint.h>
#include <stdlib.h>

struct digest {
    uint64_t h;
    int n;
};

static int hash_event(void *user, const char *event, const char *data, size_t len)
{
    struct digest *d = user;
    uint64_t h = d->h ^ 0x9E3779B97F4A7C15ULL;
    for (const char *p = event; *p; p++)
        h = (h ^ (uint8_t)*p) * 0x100000001B3ULL;
    h = (h ^ 0xFF) * 0x100000001B3ULL;
    for (size_t i = 0; i < len; i++)
        h = (h ^ (uint8_t)data[i]) * 0x100000001B3ULL;
    d->h = h;
    d->n++;
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    size_t piece = 1 + data[0] % 17;
    const char *buf = (const char *)data + 1;
    size_t n = size - 1;

    struct digest whole = {0}, split = {0};
    struct loadgen_sse a, b;
    loadgen_sse_init(&a, 4096, hash_event, &whole);
    loadgen_sse_init(&b, 4096, hash_event, &split);
    struct weld_err e = {0};
    int ra = loadgen_sse_feed(&a, buf, n, &e), rb = 0;
    for (size_t i = 0; i < n && rb == 0; i += piece)
        rb = loadgen_sse_feed(&b, buf + i, n - i < piece ? n - i : piece, &e);
    /* over-limit errors may come at different events; compare only clean runs */
    if (ra == 0 && rb == 0 && (whole.h != split.h || whole.n != split.n))
        abort();
    loadgen_sse_release(&a);
    loadgen_sse_release(&b);

    struct loadgen_result r = {0};
    struct loadgen_stream st;
    loadgen_stream_init(&st, &r);
    double t = 1.0;
    for (size_t i = 0; i < n; i += piece, t += 0.001)
        if (loadgen_stream_feed(&st, buf + i, n - i < piece ? n - i : piece, t, NULL))
            break;
    loadgen_stream_end(&st, t);
    if (r.success && (r.n_chunks < 1 || !r.got_done || r.n_itl != r.n_chunks - 1))
        abort();
    loadgen_stream_release(&st);
    loadgen_result_release(&r);
    return 0;
}
