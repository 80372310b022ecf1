/*
 * bandwidth - the read-bandwidth probe (design in bandwidth.h): buffer, threads, barrier
 * timing, best and median of passes.
 */
#include "kernels/cpu/bandwidth.h"

#include "core/alloc.h"
#include "core/err.h"
#include "kernels/cpu/isa.h"

#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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

struct bw_shared {
    const uint8_t *buf;
    size_t slice;
    int passes, use_avx512;
    int go; /* 0 wait, 1 run, -1 quit: set under mu once every thread exists */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_barrier_t bar;
    uint64_t sums[256];
};

struct bw_worker {
    struct bw_shared *sh;
    int id;
};

static void bw_pin(int id)
{
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(id % CPU_SETSIZE, &set);
    pthread_setaffinity_np(pthread_self(), sizeof set, &set); /* best effort */
}

/* Each pass: barrier, read own slice, barrier (the caller times between the two). */
static void *bw_worker_main(void *arg)
{
    struct bw_worker *w = arg;
    struct bw_shared *sh = w->sh;
    bw_pin(w->id);
    pthread_mutex_lock(&sh->mu);
    while (sh->go == 0)
        pthread_cond_wait(&sh->cv, &sh->mu);
    int go = sh->go;
    pthread_mutex_unlock(&sh->mu);
    if (go < 0)
        return NULL;
    const uint8_t *p = sh->buf + (size_t)w->id * sh->slice;
    for (int i = 0; i < sh->passes; i++) {
        pthread_barrier_wait(&sh->bar);
#if defined(__x86_64__)
        uint64_t s = sh->use_avx512 ? bw_read_avx512(p, sh->slice) : bw_read_scalar(p, sh->slice);
#else
        uint64_t s = bw_read_scalar(p, sh->slice);
#endif
        sh->sums[w->id] = s;
        pthread_barrier_wait(&sh->bar);
    }
    return NULL;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Run the passes on threads 1..n-1 plus the caller as thread 0; fills rate[pass]. */
static int bw_run(struct bw_shared *sh, int n, double *rate, struct weld_err *e)
{
    pthread_t th[256];
    struct bw_worker wk[256];
    int started = 0;
    for (int i = 0; i < n; i++)
        wk[i] = (struct bw_worker){sh, i};
    for (int i = 1; i < n; i++, started++)
        if (pthread_create(&th[i], NULL, bw_worker_main, &wk[i]) != 0)
            break;
    pthread_mutex_lock(&sh->mu);
    sh->go = started == n - 1 ? 1 : -1;
    pthread_cond_broadcast(&sh->cv);
    pthread_mutex_unlock(&sh->mu);
    if (started != n - 1) {
        for (int i = 1; i <= started; i++)
            pthread_join(th[i], NULL);
        return err_set(e, WELD_ERR_INTERNAL, "bandwidth probe: could not start thread %d of %d",
                       started + 1, n);
    }
    cpu_set_t old;
    int have_old = pthread_getaffinity_np(pthread_self(), sizeof old, &old) == 0;
    bw_pin(0);
    const uint8_t *p = sh->buf;
    for (int i = 0; i < sh->passes; i++) {
        pthread_barrier_wait(&sh->bar);
        double t0 = now_s();
#if defined(__x86_64__)
        sh->sums[0] = sh->use_avx512 ? bw_read_avx512(p, sh->slice) : bw_read_scalar(p, sh->slice);
#else
        sh->sums[0] = bw_read_scalar(p, sh->slice);
#endif
        pthread_barrier_wait(&sh->bar);
        double dt = now_s() - t0;
        rate[i] = (double)sh->slice * n / (dt > 0 ? dt : 1e-9) / 1e9;
    }
    for (int i = 1; i < n; i++)
        pthread_join(th[i], NULL);
    if (have_old) /* the caller's thread gets its affinity back */
        pthread_setaffinity_np(pthread_self(), sizeof old, &old);
    return WELD_OK;
}

int bw_probe(size_t bytes, int n_threads, int passes, struct bw_result *out, struct weld_err *e)
{
    memset(out, 0, sizeof *out);
    if (n_threads < 1 || n_threads > 256 || passes < 1 || passes > 1000 || bytes < (1u << 20))
        return err_set(e, WELD_ERR_INVALID_ARG,
                       "bandwidth probe: bytes %zu (>= 1 MiB), threads %d (1..256), passes %d "
                       "(1..1000): out of range", bytes, n_threads, passes);
    struct bw_shared sh = {0};
    const size_t unit = (size_t)BW_STREAMS * 4096;
    sh.slice = bytes / (size_t)n_threads / unit * unit;
    if (sh.slice == 0)
        return err_set(e, WELD_ERR_INVALID_ARG, "bandwidth probe: %zu bytes is too small for "
                       "%d threads", bytes, n_threads);
    sh.passes = passes;
    sh.use_avx512 = isa_cpu_has(ISA_AVX512);
    const size_t total = sh.slice * (size_t)n_threads;
    uint8_t *raw = wmalloc(total + 64);
    double *rate = wcalloc((size_t)passes, sizeof(double));
    int st = WELD_OK;
    if (!raw || !rate) {
        st = err_set(e, WELD_ERR_NOMEM, "bandwidth probe: cannot allocate %zu bytes", total);
        goto free_bufs;
    }
    sh.buf = (const uint8_t *)(((uintptr_t)raw + 63) & ~(uintptr_t)63);
    for (size_t i = 0; i < total; i += 4096) /* back every page, vary the contents */
        memset((uint8_t *)sh.buf + i, (int)(i >> 12), 4096);
    if (pthread_barrier_init(&sh.bar, NULL, (unsigned)n_threads) != 0) {
        st = err_set(e, WELD_ERR_INTERNAL, "bandwidth probe: pthread_barrier_init failed");
        goto free_bufs;
    }
    pthread_mutex_init(&sh.mu, NULL);
    pthread_cond_init(&sh.cv, NULL);
    st = bw_run(&sh, n_threads, rate, e);
    pthread_cond_destroy(&sh.cv);
    pthread_mutex_destroy(&sh.mu);
    pthread_barrier_destroy(&sh.bar);
    if (st != WELD_OK)
        goto free_bufs;
    for (int i = 0; i < n_threads; i++)
        out->checksum ^= sh.sums[i];
    qsort(rate, (size_t)passes, sizeof(double), cmp_double);
    out->gb_s_best = rate[passes - 1];
    out->gb_s_median = rate[passes / 2];
    out->bytes = total;
    out->threads = n_threads;
    out->passes = passes;
    out->isa = sh.use_avx512 ? "avx512" : "scalar";
free_bufs:
    wfree(rate);
    wfree(raw);
    return st;
}
