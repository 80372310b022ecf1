/*
 * team - persistent pinned workers, a job slot and a generation barrier (see team.h).
 *
 * Layout: the hot atomics each sit on their own 64-byte cache line so that workers
 * spinning on one do not take the line of another away from its writer:
 *   job_seq   bumped by team_run to publish a job (fn, ctx are plain fields written
 *             before it), and by team_free to publish "stop"
 *   n_done    workers 1..n-1 that finished the current job
 *   bar_count arrivals at the current barrier
 *   bar_gen   barrier generation, bumped by the last arrival
 * The struct is allocated 64-byte aligned by hand (the allocator only promises 16).
 *
 * Memory ordering (C11 atomics):
 * - Job start: team_run writes fn/ctx and resets n_done (relaxed), then increments job_seq
 *   with release; a worker that reads the new job_seq with acquire sees fn, ctx, n_done = 0
 *   and everything the caller wrote before team_run.
 * - Job end: a worker increments n_done with release after fn; the caller spins until an
 *   acquire load reads n - 1, so every worker's writes happen-before team_run returns, and
 *   the workers' reads of fn/ctx happen-before the next job overwrites them.
 * - Barrier (a sense-reversing barrier where the "sense" is a generation counter, so no
 *   per-worker sense flag is needed): a worker reads bar_gen (relaxed: it cannot advance
 *   before this worker arrives, and read-read coherence forbids an older value), then
 *   increments bar_count with acq_rel. The last arrival (count n - 1) has, through the
 *   release sequence of the count's read-modify-writes, acquired every other worker's
 *   writes; it resets bar_count (relaxed; the next barrier's arrivals are ordered after it
 *   by the release below) and increments bar_gen with release. The others spin until an
 *   acquire load of bar_gen differs from what they read, and so see everything written
 *   before the barrier by any worker.
 * - Sleep: a worker that spun TEAM_IDLE_SPIN_NS without a new job takes the mutex,
 *   registers in n_sleeping and waits on the condition variable while job_seq is
 *   unchanged; team_run bumps job_seq and reads n_sleeping under the same mutex, so a
 *   wake-up cannot be lost. An idle process therefore uses ~0% CPU after ~2 ms. team_park
 *   cuts the spin short: it stores the current job_seq in park_seq, and a worker waiting
 *   for a job after that one sleeps at once (so another team pinned to the same cores,
 *   run right after, does not share them with spinning workers for 2 ms).
 *
 * Waits (job end, barrier) spin with a pause instruction and fall back to sched_yield
 * after a bounded spin; they never sleep, since jobs and stages are short. With
 * TEAM_OVERSUBSCRIBE the spin bound is tiny so that more workers than cores still make
 * progress (slowly).
 *
 * Deliberately not here: work stealing, nested teams, per-worker queues (the megakernel
 * executor builds those on top), NUMA placement beyond one worker per physical core.
 */
#include "core/team.h"

#include "core/alloc.h"
#include "core/log.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdalign.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define team_pause() _mm_pause()
#elif defined(__aarch64__)
#define team_pause() __asm__ __volatile__("yield")
#else
#define team_pause() ((void)0)
#endif

#define TEAM_IDLE_SPIN_NS 2000000LL /* spin this long after a job before sleeping */
#define TEAM_WAIT_SPINS 4096        /* pauses before a wait starts yielding */
#define TEAM_WAIT_SPINS_OVER 16     /* the same when oversubscribed */
#define TEAM_MAX_CPUS 1024

struct team_worker {
    struct team *t;
    int id;
};

struct team {
    alignas(64) atomic_uint job_seq;
    alignas(64) atomic_int n_done;
    alignas(64) atomic_int bar_count;
    alignas(64) atomic_uint bar_gen;
    alignas(64) atomic_uint park_seq; /* job_seq after which waiting workers sleep at once */
    alignas(64) team_fn fn;
    void *ctx;
    bool stop;          /* written before the final job_seq bump */
    int n;
    int wait_spins;
    int n_threads;      /* threads actually started (n - 1 once created) */
    pthread_t *threads; /* (n - 1) */
    struct team_worker *workers; /* (n - 1) */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int n_sleeping;     /* guarded by mu */
    void *raw;          /* the unaligned allocation this struct lives in */
};

/* ---- topology ----------------------------------------------------------------------- */

static int read_int_file(const char *path, int *out)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    int ok = fscanf(f, "%d", out) == 1;
    fclose(f);
    return ok ? 0 : -1;
}

/* First logical CPU of each physical core in the affinity mask, ascending; returns the
   count (0 if the topology cannot be read). */
static int physical_core_cpus(int *cpus, int cap)
{
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) != 0)
        return 0;
    int n = 0;
    int core_of[TEAM_MAX_CPUS], pkg_of[TEAM_MAX_CPUS];
    for (int cpu = 0; cpu < CPU_SETSIZE && cpu < TEAM_MAX_CPUS && n < cap; cpu++) {
        if (!CPU_ISSET(cpu, &set))
            continue;
        char path[128];
        int core, pkg;
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu%d/topology/core_id", cpu);
        if (read_int_file(path, &core))
            return 0;
        snprintf(path, sizeof path,
                 "/sys/devices/system/cpu/cpu%d/topology/physical_package_id", cpu);
        if (read_int_file(path, &pkg))
            return 0;
        bool seen = false;
        for (int i = 0; i < n && !seen; i++)
            seen = core_of[i] == core && pkg_of[i] == pkg;
        if (seen)
            continue;
        core_of[n] = core;
        pkg_of[n] = pkg;
        cpus[n++] = cpu;
    }
    return n;
}

/* Fallback: every CPU of the affinity mask counts as a core. */
static int online_cpus(int *cpus, int cap)
{
    cpu_set_t set;
    int n = 0;
    if (sched_getaffinity(0, sizeof set, &set) == 0) {
        for (int cpu = 0; cpu < CPU_SETSIZE && n < cap; cpu++)
            if (CPU_ISSET(cpu, &set))
                cpus[n++] = cpu;
        if (n)
            return n;
    }
    long k = sysconf(_SC_NPROCESSORS_ONLN);
    for (long i = 0; i < k && n < cap; i++)
        cpus[n++] = (int)i;
    return n;
}

static int core_cpus(int *cpus, int cap)
{
    int n = physical_core_cpus(cpus, cap);
    if (n < 1)
        n = online_cpus(cpus, cap);
    if (n < 1) {
        cpus[0] = 0;
        n = 1;
    }
    return n;
}

int team_physical_cores(void)
{
    int cpus[TEAM_MAX_CPUS];
    return core_cpus(cpus, TEAM_MAX_CPUS);
}

int team_default_size(void) { return team_physical_cores(); }

/* ---- waiting ------------------------------------------------------------------------ */

static long long now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* Wait for job_seq to move past `seen`: spin, then sleep on the condition variable. */
static unsigned wait_job(struct team *t, unsigned seen)
{
    long long deadline = 0;
    for (int i = 0;; i++) {
        unsigned s = atomic_load_explicit(&t->job_seq, memory_order_acquire);
        if (s != seen)
            return s;
        if (t->wait_spins == TEAM_WAIT_SPINS_OVER && i >= TEAM_WAIT_SPINS_OVER)
            break;
        if (atomic_load_explicit(&t->park_seq, memory_order_relaxed) == seen)
            break;
        if ((i & 255) == 0) {
            long long now = now_ns();
            if (!deadline)
                deadline = now + TEAM_IDLE_SPIN_NS;
            else if (now > deadline)
                break;
        }
        team_pause();
    }
    pthread_mutex_lock(&t->mu);
    t->n_sleeping++;
    unsigned s;
    while ((s = atomic_load_explicit(&t->job_seq, memory_order_acquire)) == seen)
        pthread_cond_wait(&t->cv, &t->mu);
    t->n_sleeping--;
    pthread_mutex_unlock(&t->mu);
    return s;
}

static void *worker_main(void *arg)
{
    struct team_worker *w = arg;
    struct team *t = w->t;
    unsigned seen = 0;
    for (;;) {
        seen = wait_job(t, seen);
        if (t->stop)
            break;
        t->fn(t->ctx, w->id, t->n);
        atomic_fetch_add_explicit(&t->n_done, 1, memory_order_release);
    }
    return NULL;
}

/* Bump job_seq under the mutex and wake sleepers. */
static void publish_job(struct team *t)
{
    pthread_mutex_lock(&t->mu);
    atomic_fetch_add_explicit(&t->job_seq, 1, memory_order_release);
    if (t->n_sleeping)
        pthread_cond_broadcast(&t->cv);
    pthread_mutex_unlock(&t->mu);
}

/* ---- lifetime ----------------------------------------------------------------------- */

static void stop_threads(struct team *t)
{
    if (t->n_threads) {
        t->stop = true;
        publish_job(t);
        for (int i = 0; i < t->n_threads; i++)
            pthread_join(t->threads[i], NULL);
        t->n_threads = 0;
    }
}

void team_free(struct team *t)
{
    if (!t)
        return;
    stop_threads(t);
    pthread_cond_destroy(&t->cv);
    pthread_mutex_destroy(&t->mu);
    wfree(t->threads);
    wfree(t->workers);
    wfree(t->raw);
}

static void pin(pthread_t th, int worker, int cpu)
{
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    int rc = pthread_setaffinity_np(th, sizeof set, &set);
    if (rc)
        log_debug("team: pinning worker %d to cpu %d failed: %s (ignored)", worker, cpu,
                  strerror(rc));
}

/* Start workers 1..n-1 with every signal blocked (the caller's thread handles signals). */
static int start_threads(struct team *t, bool do_pin, struct weld_err *e)
{
    int cpus[TEAM_MAX_CPUS];
    int n_cores = core_cpus(cpus, TEAM_MAX_CPUS);
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &old);
    int rc = 0;
    for (int i = 1; i < t->n; i++) {
        struct team_worker *w = &t->workers[i - 1];
        w->t = t;
        w->id = i;
        if ((rc = pthread_create(&t->threads[i - 1], NULL, worker_main, w)))
            break;
        t->n_threads++;
        if (do_pin)
            pin(t->threads[i - 1], i, cpus[i % n_cores]);
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc)
        return err_set(e, WELD_ERR_INTERNAL, "team: starting worker %d of %d failed: %s",
                       t->n_threads + 1, t->n, strerror(rc));
    return WELD_OK;
}

static int clamp_size(int n, unsigned flags)
{
    int cores = team_physical_cores();
    if (n <= 0)
        return cores;
    if (n > cores && !(flags & TEAM_OVERSUBSCRIBE)) {
        log_warn("team: %d threads asked for but this process has %d physical cores; "
                 "using %d (more spinning threads than cores would stall)", n, cores, cores);
        return cores;
    }
    return n;
}

int team_create(struct team **out, int n, unsigned flags, struct weld_err *e)
{
    *out = NULL;
    n = clamp_size(n, flags);
    if (n > TEAM_MAX_CPUS)
        return err_set(e, WELD_ERR_INVALID_ARG, "team: %d workers is more than %d", n,
                       TEAM_MAX_CPUS);
    void *raw = wmalloc(sizeof(struct team) + 64);
    if (!raw)
        return err_set(e, WELD_ERR_NOMEM, "team: out of memory");
    struct team *t = (struct team *)(((uintptr_t)raw + 63) & ~(uintptr_t)63);
    memset(t, 0, sizeof *t);
    t->raw = raw;
    t->n = n;
    t->wait_spins = n > team_physical_cores() ? TEAM_WAIT_SPINS_OVER : TEAM_WAIT_SPINS;
    atomic_init(&t->job_seq, 0);
    atomic_init(&t->n_done, 0);
    atomic_init(&t->bar_count, 0);
    atomic_init(&t->bar_gen, 0);
    atomic_init(&t->park_seq, UINT_MAX);
    pthread_mutex_init(&t->mu, NULL);
    pthread_cond_init(&t->cv, NULL);
    int rc = WELD_OK;
    if (n > 1) {
        t->threads = wcalloc((size_t)n - 1, sizeof *t->threads);
        t->workers = wcalloc((size_t)n - 1, sizeof *t->workers);
        if (!t->threads || !t->workers)
            rc = err_set(e, WELD_ERR_NOMEM, "team: out of memory for %d workers", n);
        else
            rc = start_threads(t, t->wait_spins == TEAM_WAIT_SPINS, e);
    }
    if (rc) {
        team_free(t);
        return rc;
    }
    *out = t;
    return WELD_OK;
}

int team_size(const struct team *t) { return t->n; }

void team_park(struct team *t)
{
    atomic_store_explicit(&t->park_seq,
                          atomic_load_explicit(&t->job_seq, memory_order_relaxed),
                          memory_order_relaxed);
}

/* ---- running ------------------------------------------------------------------------ */

static void spin_wait_step(int *i, int limit)
{
    if (*i < limit) {
        (*i)++;
        team_pause();
    } else {
        sched_yield();
    }
}

void team_run(struct team *t, team_fn fn, void *ctx)
{
    if (t->n == 1) {
        fn(ctx, 0, 1);
        return;
    }
    t->fn = fn;
    t->ctx = ctx;
    atomic_store_explicit(&t->n_done, 0, memory_order_relaxed);
    publish_job(t);
    fn(ctx, 0, t->n);
    int i = 0;
    while (atomic_load_explicit(&t->n_done, memory_order_acquire) != t->n - 1)
        spin_wait_step(&i, t->wait_spins);
}

/* ---- handoff probe ------------------------------------------------------------------ */

#define HANDOFF_MAX_LINES 64

struct handoff {
    struct team *t;
    alignas(64) _Atomic long turn;             /* 2i + 1: worker 1's turn of round i */
    alignas(64) float data[2][HANDOFF_MAX_LINES * 16];
    int n_lines, rounds;
    double ns;
    float sink[2];
};

/* Read the other side's lines, write this side's (dependent on what was read). */
static void handoff_touch(struct handoff *h, int me)
{
    const float *src = h->data[1 - me];
    float *dst = h->data[me];
    float acc[16] = {0}; /* a lane per float of a line: no long chain of adds */
    for (int l = 0; l < h->n_lines; l++)
        for (int j = 0; j < 16; j++)
            acc[j] += src[16 * l + j];
    for (int l = 0; l < h->n_lines; l++)
        for (int j = 0; j < 16; j++)
            dst[16 * l + j] = acc[j] + (float)l;
    h->sink[me] += acc[0];
}

static void handoff_fn(void *ctx, int w, int n)
{
    (void)n;
    struct handoff *h = ctx;
    if (w > 1)
        return;
    struct timespec a, b;
    if (w == 0)
        clock_gettime(CLOCK_MONOTONIC, &a);
    for (long i = 0; i < h->rounds; i++) {
        const long want = 2 * i + w; /* worker 0 goes at 2i, worker 1 at 2i + 1 */
        int k = 0;
        while (atomic_load_explicit(&h->turn, memory_order_acquire) != want)
            spin_wait_step(&k, h->t->wait_spins);
        handoff_touch(h, w);
        atomic_fetch_add_explicit(&h->turn, 1, memory_order_release);
    }
    if (w == 0) {
        int k = 0;
        while (atomic_load_explicit(&h->turn, memory_order_acquire) != 2L * h->rounds)
            spin_wait_step(&k, h->t->wait_spins);
        clock_gettime(CLOCK_MONOTONIC, &b);
        h->ns = ((double)(b.tv_sec - a.tv_sec) * 1e9 + (double)(b.tv_nsec - a.tv_nsec)) /
                h->rounds;
    }
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int team_handoff_ns(struct team *t, int n_lines, int rounds, int runs, double *ns,
                    struct weld_err *e)
{
    if (t->n < 2 || n_lines < 0 || n_lines > HANDOFF_MAX_LINES || rounds < 1 || runs < 1 ||
        runs > 64)
        return err_set(e, WELD_ERR_INVALID_ARG, "handoff probe: needs two workers (have %d), "
                       "0..%d lines (%d), rounds >= 1 (%d), 1..64 runs (%d)", t->n,
                       HANDOFF_MAX_LINES, n_lines, rounds, runs);
    void *raw = wcalloc(1, sizeof(struct handoff) + 64);
    if (!raw)
        return err_set(e, WELD_ERR_NOMEM, "handoff probe: out of memory");
    struct handoff *h = (struct handoff *)(((uintptr_t)raw + 63) & ~(uintptr_t)63);
    double v[64];
    for (int r = 0; r < runs; r++) {
        h->t = t;
        h->n_lines = n_lines;
        h->rounds = rounds;
        atomic_store_explicit(&h->turn, 0, memory_order_relaxed);
        team_run(t, handoff_fn, h);
        v[r] = h->ns;
    }
    qsort(v, (size_t)runs, sizeof v[0], cmp_double);
    *ns = v[runs / 2];
    wfree(raw);
    return WELD_OK;
}

void team_barrier(struct team *t)
{
    if (t->n == 1)
        return;
    unsigned gen = atomic_load_explicit(&t->bar_gen, memory_order_relaxed);
    if (atomic_fetch_add_explicit(&t->bar_count, 1, memory_order_acq_rel) == t->n - 1) {
        atomic_store_explicit(&t->bar_count, 0, memory_order_relaxed);
        atomic_fetch_add_explicit(&t->bar_gen, 1, memory_order_release);
        return;
    }
    int i = 0;
    while (atomic_load_explicit(&t->bar_gen, memory_order_acquire) == gen)
        spin_wait_step(&i, t->wait_spins);
}
