/*
 * probe_team - the probes' thread harness (design in probe_team.h).
 */
#include "kernels/cpu/probe_team.h"

#include "core/err.h"

#include <pthread.h>
#include <sched.h>
#include <time.h>

struct pt_shared {
    void (*body)(void *ctx, int id, int pass);
    void *ctx;
    int passes;
    int go; /* 0 wait, 1 run, -1 quit: set under mu once every thread exists */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_barrier_t bar;
};

struct pt_worker {
    struct pt_shared *sh;
    int id;
};

static void pt_pin(int id)
{
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(id % CPU_SETSIZE, &set);
    pthread_setaffinity_np(pthread_self(), sizeof set, &set); /* best effort */
}

static double pt_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void *pt_worker_main(void *arg)
{
    struct pt_worker *w = arg;
    struct pt_shared *sh = w->sh;
    pt_pin(w->id);
    pthread_mutex_lock(&sh->mu);
    while (sh->go == 0)
        pthread_cond_wait(&sh->cv, &sh->mu);
    int go = sh->go;
    pthread_mutex_unlock(&sh->mu);
    for (int i = 0; go > 0 && i < sh->passes; i++) {
        pthread_barrier_wait(&sh->bar);
        sh->body(sh->ctx, w->id, i);
        pthread_barrier_wait(&sh->bar);
    }
    return NULL;
}

int probe_team_run(int n_threads, int passes, void (*body)(void *ctx, int id, int pass), void *ctx,
                   double *seconds, const char *what, struct weld_err *e)
{
    WELD_ASSERT(n_threads >= 1 && n_threads <= 256 && passes >= 1);
    struct pt_shared sh = {.body = body, .ctx = ctx, .passes = passes};
    if (pthread_barrier_init(&sh.bar, NULL, (unsigned)n_threads) != 0)
        return err_set(e, WELD_ERR_INTERNAL, "%s: pthread_barrier_init failed", what);
    pthread_mutex_init(&sh.mu, NULL);
    pthread_cond_init(&sh.cv, NULL);
    pthread_t th[256];
    struct pt_worker wk[256];
    int started = 0;
    for (int i = 1; i < n_threads; i++, started++) {
        wk[i] = (struct pt_worker){&sh, i};
        if (pthread_create(&th[i], NULL, pt_worker_main, &wk[i]) != 0)
            break;
    }
    pthread_mutex_lock(&sh.mu);
    sh.go = started == n_threads - 1 ? 1 : -1;
    pthread_cond_broadcast(&sh.cv);
    pthread_mutex_unlock(&sh.mu);
    int st = WELD_OK;
    if (sh.go > 0) {
        cpu_set_t old;
        int have_old = pthread_getaffinity_np(pthread_self(), sizeof old, &old) == 0;
        pt_pin(0);
        for (int i = 0; i < passes; i++) {
            pthread_barrier_wait(&sh.bar);
            double t0 = pt_now();
            body(ctx, 0, i);
            pthread_barrier_wait(&sh.bar);
            seconds[i] = pt_now() - t0;
        }
        if (have_old) /* the caller's thread gets its affinity back */
            pthread_setaffinity_np(pthread_self(), sizeof old, &old);
    } else {
        st = err_set(e, WELD_ERR_INTERNAL, "%s: could not start thread %d of %d", what, started + 1,
                     n_threads);
    }
    for (int i = 1; i <= started; i++)
        pthread_join(th[i], NULL);
    pthread_cond_destroy(&sh.cv);
    pthread_mutex_destroy(&sh.mu);
    pthread_barrier_destroy(&sh.bar);
    return st;
}
