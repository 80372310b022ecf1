/*
 * bandwidth - the read-bandwidth probe (design in bandwidth.h): buffer, read loops, best and
 * median of passes (the threads and their timed passes: probe_team.h).
 */
#include "kernels/cpu/bandwidth.h"

#include "core/alloc.h"
#include "core/err.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/probe_team.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

size_t bw_llc_bytes(void)
{
    size_t best = 0;
    int best_level = 0;
    for (int i = 0; i < 16; i++) {
        char path[96], buf[64];
        int level = 0;
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/level", i);
        FILE *f = fopen(path, "r");
        if (!f)
            break;
        if (fscanf(f, "%d", &level) != 1)
            level = 0;
        fclose(f);
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/type", i);
        if ((f = fopen(path, "r"))) {
            bool instr = fgets(buf, sizeof buf, f) && !strncmp(buf, "Instruction", 11);
            fclose(f);
            if (instr)
                continue;
        }
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/size", i);
        unsigned long long v = 0;
        char unit = 0;
        if (!(f = fopen(path, "r")))
            continue;
        int n = fscanf(f, "%llu%c", &v, &unit);
        fclose(f);
        if (n < 1)
            continue;
        if (n == 2 && (unit == 'K' || unit == 'k'))
            v <<= 10;
        else if (n == 2 && (unit == 'M' || unit == 'm'))
            v <<= 20;
        if (level > best_level) {
            best_level = level;
            best = (size_t)v;
        }
    }
#ifdef _SC_LEVEL3_CACHE_SIZE
    if (!best) {
        long v = sysconf(_SC_LEVEL3_CACHE_SIZE);
        if (v <= 0)
            v = sysconf(_SC_LEVEL2_CACHE_SIZE);
        best = v > 0 ? (size_t)v : 0;
    }
#endif
    return best;
}

uint64_t bw_read_scalar(const void *p, size_t n)
{
    const size_t per = n / BW_STREAMS;
    uint64_t a[BW_STREAMS][4] = {{0}};
    for (size_t off = 0; off + 32 <= per; off += 32)
        for (int i = 0; i < BW_STREAMS; i++) {
            const uint64_t *q = (const uint64_t *)(const void *)((const uint8_t *)p + i * per + off);
            a[i][0] ^= q[0];
            a[i][1] ^= q[1];
            a[i][2] ^= q[2];
            a[i][3] ^= q[3];
        }
    uint64_t x = 0;
    for (int i = 0; i < BW_STREAMS; i++)
        x ^= a[i][0] ^ a[i][1] ^ a[i][2] ^ a[i][3];
    return x;
}

/* The read loops the probe tries, in order. */
struct bw_loop {
    const char *name;
    int avx512, streams;
    size_t pf, pf2; /* software prefetch into L1, L2: bytes ahead (0 none) */
    int pace;       /* dependent operations per line (bandwidth_avx512.c) */
};

static const struct bw_loop bw_loops[] = {
    {"avx512, 4 streams", 1, BW_STREAMS, 0, 0, 0},
    {"avx512, 4 streams, prefetch 2 KiB", 1, BW_STREAMS, 2048, 0, 0},
    {"avx512, 1 stream", 1, 1, 0, 0, 0},
    {"avx512, 1 stream, prefetch 1 KiB", 1, 1, 1024, 0, 0},
    {"avx512, 1 stream, prefetch 2 KiB + 4 KiB to L2", 1, 1, 2048, 4096, 0},
    {"avx512, 1 stream, prefetch 2 KiB + 4 KiB to L2, paced", 1, 1, 2048, 4096, 8},
    {"scalar, 4 streams", 0, BW_STREAMS, 0, 0, 0},
};
#define BW_N_LOOPS ((int)(sizeof bw_loops / sizeof bw_loops[0]))

static uint64_t bw_read(const struct bw_loop *l, const void *p, size_t n)
{
#if defined(__x86_64__)
    if (l->avx512)
        return bw_read_avx512(p, n, l->streams, l->pf, l->pf2, l->pace);
#endif
    return bw_read_scalar(p, n);
}

struct bw_shared {
    const uint8_t *buf;
    size_t slice;
    int passes;         /* per loop */
    int loop0, n_loops; /* bw_loops[loop0 .. loop0 + n_loops) */
    uint64_t sums[256];
};

/* Pass i of thread id: read its own slice with loop loop0 + i / passes. */
static void bw_body(void *ctx, int id, int pass)
{
    struct bw_shared *sh = ctx;
    sh->sums[id] = bw_read(&bw_loops[sh->loop0 + pass / sh->passes],
                           sh->buf + (size_t)id * sh->slice, sh->slice);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

struct bw_session {
    uint8_t *raw;
    size_t total;
    int n_threads;
    size_t slice;
    int loop0, n_loops; /* the loops this CPU runs: bw_loops[loop0 .. loop0 + n_loops) */
};

int bw_session_open(struct bw_session **out, size_t bytes, int n_threads, struct weld_err *e)
{
    *out = NULL;
    if (n_threads < 1 || n_threads > 256 || bytes < (1u << 20))
        return err_set(e, WELD_ERR_INVALID_ARG,
                       "bandwidth probe: bytes %zu (>= 1 MiB), threads %d (1..256): out of range",
                       bytes, n_threads);
    const size_t unit = (size_t)BW_STREAMS * 4096; /* whole pages per stream */
    const size_t slice = bytes / (size_t)n_threads / unit * unit;
    if (slice == 0)
        return err_set(e, WELD_ERR_INVALID_ARG, "bandwidth probe: %zu bytes is too small for "
                       "%d threads", bytes, n_threads);
    struct bw_session *s = wcalloc(1, sizeof *s);
    if (!s)
        return err_set(e, WELD_ERR_NOMEM, "bandwidth probe: out of memory");
    s->n_threads = n_threads;
    s->slice = slice;
    s->total = slice * (size_t)n_threads;
    const int avx512 = isa_cpu_has(ISA_AVX512);
    s->loop0 = avx512 ? 0 : BW_N_LOOPS - 1;
    s->n_loops = avx512 ? BW_N_LOOPS - 1 : 1;
    if (!(s->raw = wmap_huge(s->total))) { /* page aligned */
        wfree(s);
        return err_set(e, WELD_ERR_NOMEM, "bandwidth probe: cannot allocate %zu bytes",
                       slice * (size_t)n_threads);
    }
    for (size_t i = 0; i < s->total; i += 4096) /* back every page, vary the contents */
        memset(s->raw + i, (int)(i >> 12), 4096);
    *out = s;
    return WELD_OK;
}

void bw_session_close(struct bw_session *s)
{
    if (!s)
        return;
    wunmap(s->raw, s->total);
    wfree(s);
}

/* `passes` passes of each of loops [loop0, loop0 + n_loops) into rate (loop-major);
   *checksum gets the XOR of the last pass's sums. */
static int session_passes(struct bw_session *s, int loop0, int n_loops, int passes,
                          double *rate, uint64_t *checksum, struct weld_err *e)
{
    struct bw_shared sh = {
        .buf = s->raw, .slice = s->slice, .passes = passes, .loop0 = loop0, .n_loops = n_loops};
    const int n = passes * n_loops;
    int st = probe_team_run(s->n_threads, n, bw_body, &sh, rate, "bandwidth probe", e);
    for (int i = 0; st == WELD_OK && i < n; i++) /* seconds -> GB/s */
        rate[i] = (double)s->slice * s->n_threads / (rate[i] > 0 ? rate[i] : 1e-9) / 1e9;
    *checksum = 0;
    for (int i = 0; st == WELD_OK && i < s->n_threads; i++)
        *checksum ^= sh.sums[i];
    return st;
}

int bw_session_probe(struct bw_session *s, int passes, struct bw_result *out,
                     struct weld_err *e)
{
    memset(out, 0, sizeof *out);
    if (passes < 1 || passes > 1000)
        return err_set(e, WELD_ERR_INVALID_ARG, "bandwidth probe: passes %d (1..1000): out of "
                       "range", passes);
    double *rate = wcalloc((size_t)passes * (size_t)s->n_loops, sizeof(double));
    if (!rate)
        return err_set(e, WELD_ERR_NOMEM, "bandwidth probe: out of memory");
    int st = session_passes(s, s->loop0, s->n_loops, passes, rate, &out->checksum, e);
    if (st == WELD_OK) {
        int best = 0; /* the loop with the best pass */
        for (int l = 0; l < s->n_loops; l++) {
            double *r = rate + (size_t)l * (size_t)passes;
            qsort(r, (size_t)passes, sizeof(double), cmp_double);
            if (r[passes - 1] > rate[(size_t)best * (size_t)passes + (size_t)passes - 1])
                best = l;
        }
        out->gb_s_best = rate[(size_t)best * (size_t)passes + (size_t)passes - 1];
        out->gb_s_median = rate[(size_t)best * (size_t)passes + (size_t)passes / 2];
        out->bytes = s->total;
        out->threads = s->n_threads;
        out->passes = passes;
        out->loops = s->n_loops;
        out->isa = s->loop0 == 0 ? "avx512" : "scalar";
        out->loop = bw_loops[s->loop0 + best].name;
    }
    wfree(rate);
    return st;
}

int bw_session_pass(struct bw_session *s, const char *loop, double *gb_s, struct weld_err *e)
{
    *gb_s = 0;
    for (int l = s->loop0; l < s->loop0 + s->n_loops; l++)
        if (loop && !strcmp(loop, bw_loops[l].name)) {
            uint64_t sum;
            return session_passes(s, l, 1, 1, gb_s, &sum, e);
        }
    return err_set(e, WELD_ERR_INVALID_ARG, "bandwidth probe: no read loop '%s' on this CPU",
                   loop ? loop : "(null)");
}

int bw_probe(size_t bytes, int n_threads, int passes, struct bw_result *out, struct weld_err *e)
{
    memset(out, 0, sizeof *out);
    if (n_threads < 1 || n_threads > 256 || passes < 1 || passes > 1000 || bytes < (1u << 20))
        return err_set(e, WELD_ERR_INVALID_ARG,
                       "bandwidth probe: bytes %zu (>= 1 MiB), threads %d (1..256), passes %d "
                       "(1..1000): out of range", bytes, n_threads, passes);
    struct bw_session *s;
    int st = bw_session_open(&s, bytes, n_threads, e);
    if (st == WELD_OK)
        st = bw_session_probe(s, passes, out, e);
    bw_session_close(s);
    return st;
}
