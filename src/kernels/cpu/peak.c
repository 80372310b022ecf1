/*
 * peak - the compute probe (design in peak.h): threads, barrier timing, best and median
 * of passes, and which instruction bounds which weight type.
 */
#include "kernels/cpu/peak.h"

#include "core/alloc.h"
#include "core/err.h"

#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Rounds per pass: about 10-30 ms of one core at the rates these loops reach. */
#define PEAK_ROUNDS (1u << 21)

enum peak_op peak_op_for(enum weld_dtype dt, enum isa_level l)
{
    if (l == ISA_SCALAR)
        return PEAK_NONE;
    switch (dt) {
    case DT_BF16: return l >= ISA_AVX512 ? PEAK_BF16_DOT : PEAK_F32_FMA;
    case DT_F16:
    case DT_F32: return PEAK_F32_FMA;
    default: /* quantized: int8 dot products (AVX-512 VNNI); AMX tiles have no probe */
        return l == ISA_AVX512 ? PEAK_I8_DOT : PEAK_NONE;
    }
}

const char *peak_instr(enum peak_op op, enum isa_level l)
{
#if defined(__x86_64__)
    if (l >= ISA_AVX512 && isa_cpu_has(ISA_AVX512)) {
        if (op == PEAK_BF16_DOT)
            return "vdpbf16ps zmm";
        if (op == PEAK_F32_FMA)
            return "vfmadd231ps zmm";
        if (op == PEAK_I8_DOT)
            return "vpdpbusd zmm";
    } else if (l == ISA_AVX2 && isa_cpu_has(ISA_AVX2) && op == PEAK_F32_FMA) {
        return "vfmadd231ps ymm";
    }
#else
    (void)op;
    (void)l;
#endif
    return NULL;
}

double peak_round_ops(enum peak_op op, enum isa_level l)
{
    if (l == ISA_AVX2)
        return op == PEAK_F32_FMA ? PEAK_ACC_AVX2 * 16.0 : 0;
    switch (op) {
    case PEAK_BF16_DOT: return PEAK_ACC * 64.0;
    case PEAK_F32_FMA: return PEAK_ACC * 32.0;
    case PEAK_I8_DOT: return PEAK_ACC * 128.0;
    default: return 0;
    }
}

struct peak_shared {
    enum peak_op op;
    int wide; /* 1: the 512-bit loops */
    int passes;
    int go; /* 0 wait, 1 run, -1 quit: set under mu once every thread exists */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_barrier_t bar;
    double sink[256];
};

struct peak_worker {
    struct peak_shared *sh;
    int id;
};

static void peak_pin(int id)
{
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(id % CPU_SETSIZE, &set);
    pthread_setaffinity_np(pthread_self(), sizeof set, &set); /* best effort */
}

static double peak_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double peak_loop(const struct peak_shared *sh)
{
#if defined(__x86_64__)
    return sh->wide ? peak_loop_avx512(sh->op, PEAK_ROUNDS) : peak_loop_avx2(sh->op, PEAK_ROUNDS);
#else
    (void)sh;
    return 0;
#endif
}

/* Each pass: barrier, loop, barrier (thread 0 times between the two). */
static void *peak_worker_main(void *arg)
{
    struct peak_worker *w = arg;
    struct peak_shared *sh = w->sh;
    peak_pin(w->id);
    pthread_mutex_lock(&sh->mu);
    while (sh->go == 0)
        pthread_cond_wait(&sh->cv, &sh->mu);
    int go = sh->go;
    pthread_mutex_unlock(&sh->mu);
    if (go < 0)
        return NULL;
    for (int i = 0; i < w->sh->passes; i++) {
        pthread_barrier_wait(&w->sh->bar);
        w->sh->sink[w->id] += peak_loop(w->sh);
        pthread_barrier_wait(&w->sh->bar);
    }
    return NULL;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int peak_probe(enum peak_op op, enum isa_level l, int n_threads, int passes,
               struct peak_result *out, struct weld_err *e)
{
    memset(out, 0, sizeof *out);
    if (n_threads < 1 || n_threads > 256 || passes < 1 || passes > 100)
        return err_set(e, WELD_ERR_INVALID_ARG,
                       "compute probe: threads %d (1..256), passes %d "
                       "(1..100): out of range",
                       n_threads, passes);
    const char *instr = peak_instr(op, l);
    if (!instr)
        return err_set(e, WELD_ERR_UNSUPPORTED,
                       "compute probe: no loop for this instruction "
                       "at ISA level %s",
                       isa_name(l));
    struct peak_shared sh = {.op = op, .wide = l >= ISA_AVX512, .passes = passes};
    if (pthread_barrier_init(&sh.bar, NULL, (unsigned)n_threads) != 0)
        return err_set(e, WELD_ERR_INTERNAL, "compute probe: pthread_barrier_init failed");
    pthread_mutex_init(&sh.mu, NULL);
    pthread_cond_init(&sh.cv, NULL);
    double *rate = wcalloc((size_t)passes, sizeof *rate);
    pthread_t th[256];
    struct peak_worker wk[256];
    int started = 0;
    for (int i = 1; rate && i < n_threads; i++, started++) {
        wk[i] = (struct peak_worker){&sh, i};
        if (pthread_create(&th[i], NULL, peak_worker_main, &wk[i]) != 0)
            break;
    }
    pthread_mutex_lock(&sh.mu);
    sh.go = rate && started == n_threads - 1 ? 1 : -1;
    pthread_cond_broadcast(&sh.cv);
    pthread_mutex_unlock(&sh.mu);
    if (sh.go < 0) {
        for (int i = 1; i <= started; i++)
            pthread_join(th[i], NULL);
        pthread_barrier_destroy(&sh.bar);
        pthread_cond_destroy(&sh.cv);
        pthread_mutex_destroy(&sh.mu);
        wfree(rate);
        return rate ? err_set(e, WELD_ERR_INTERNAL,
                              "compute probe: could not start thread %d "
                              "of %d",
                              started + 1, n_threads)
                    : err_set(e, WELD_ERR_NOMEM, "compute probe: out of memory");
    }
    cpu_set_t old;
    int have_old = pthread_getaffinity_np(pthread_self(), sizeof old, &old) == 0;
    peak_pin(0);
    const double ops = peak_round_ops(op, l) * PEAK_ROUNDS * n_threads;
    for (int i = 0; i < passes; i++) {
        pthread_barrier_wait(&sh.bar);
        double t0 = peak_now();
        sh.sink[0] += peak_loop(&sh);
        pthread_barrier_wait(&sh.bar);
        double dt = peak_now() - t0;
        rate[i] = ops / (dt > 0 ? dt : 1e-9) / 1e9;
    }
    for (int i = 1; i < n_threads; i++)
        pthread_join(th[i], NULL);
    if (have_old)
        pthread_setaffinity_np(pthread_self(), sizeof old, &old);
    pthread_barrier_destroy(&sh.bar);
    pthread_cond_destroy(&sh.cv);
    pthread_mutex_destroy(&sh.mu);
    qsort(rate, (size_t)passes, sizeof *rate, cmp_double);
    *out = (struct peak_result){.op = op,
                                .instr = instr,
                                .gops_best = rate[passes - 1],
                                .gops_median = rate[passes / 2],
                                .threads = n_threads,
                                .passes = passes};
    for (int i = 0; i < n_threads; i++)
        out->checksum += sh.sink[i];
    wfree(rate);
    return WELD_OK;
}
