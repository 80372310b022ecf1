/*
 * Tests for core/team: every worker runs every job exactly once with its own id; results
 * written inside a job are visible after team_run; the barrier separates phases (a
 * worker reading after barrier k sees every worker's phase-k writes, checked under
 * contention with many barriers per job); a team of one runs on the caller; sizes above
 * the physical core count are clamped (or kept with TEAM_OVERSUBSCRIBE); 10,000 short
 * jobs and idle sleeps between jobs do not deadlock; an idle team uses almost no CPU. Meant to be run under TSan too
 * (-DWELD_TSAN=ON), where plain (non-atomic) data written in one phase and read in the
 * next is reported if the barrier's ordering is wrong.
 */
#include "core/team.h"

#include "test.h"

#include <pthread.h>
#include <time.h>

#define MAXW 8

struct count_ctx {
    int hits[MAXW];     /* plain ints: each worker writes only its own slot */
    int n_seen[MAXW];
    pthread_t who[MAXW];
};

static void count_fn(void *ctx, int w, int n)
{
    struct count_ctx *c = ctx;
    c->hits[w]++;
    c->n_seen[w] = n;
    c->who[w] = pthread_self();
}

static void check_team_counts(int n, unsigned flags, int runs)
{
    struct team *t;
    struct weld_err e;
    REQUIRE(team_create(&t, n, flags, &e) == WELD_OK);
    CHECK_EQ_INT(team_size(t), n);
    struct count_ctx c;
    memset(&c, 0, sizeof c);
    for (int r = 0; r < runs; r++)
        team_run(t, count_fn, &c);
    for (int w = 0; w < n; w++) {
        CHECK_EQ_INT(c.hits[w], runs);
        CHECK_EQ_INT(c.n_seen[w], n);
    }
    for (int w = n; w < MAXW; w++)
        CHECK_EQ_INT(c.hits[w], 0);
    /* worker 0 is the caller; the others are distinct threads */
    CHECK(pthread_equal(c.who[0], pthread_self()));
    for (int a = 1; a < n; a++)
        for (int b = 0; b < a; b++)
            CHECK(!pthread_equal(c.who[a], c.who[b]));
    team_free(t);
}

TEST(team_of_one_runs_on_caller) { check_team_counts(1, 0, 100); }

TEST(every_worker_every_run)
{
    int cores = team_physical_cores();
    check_team_counts(cores < MAXW ? cores : MAXW, 0, 1000);
    check_team_counts(3, TEAM_OVERSUBSCRIBE, 200);
}

TEST(size_clamped_to_cores)
{
    int cores = team_physical_cores();
    CHECK(cores >= 1);
    CHECK_EQ_INT(team_default_size(), cores);
    struct team *t;
    struct weld_err e;
    REQUIRE(team_create(&t, cores + 3, 0, &e) == WELD_OK);
    CHECK_EQ_INT(team_size(t), cores);
    team_free(t);
    REQUIRE(team_create(&t, 0, 0, &e) == WELD_OK);
    CHECK_EQ_INT(team_size(t), cores);
    team_free(t);
    REQUIRE(team_create(&t, cores + 1, TEAM_OVERSUBSCRIBE, &e) == WELD_OK);
    CHECK_EQ_INT(team_size(t), cores + 1);
    team_free(t);
    team_free(NULL);
}

/* Phases: in phase k every worker writes cells[w] = k * 1000 + w; after the barrier every
   worker checks every cell holds phase k's value; a second barrier before the next write. */
#define PHASES 500
struct bar_ctx {
    struct team *t;
    int cells[MAXW];    /* plain: ordered only by the barrier */
    int errors[MAXW];
};

static void barrier_fn(void *ctx, int w, int n)
{
    struct bar_ctx *c = ctx;
    for (int k = 0; k < PHASES; k++) {
        c->cells[w] = k * 1000 + w;
        team_barrier(c->t);
        for (int j = 0; j < n; j++)
            if (c->cells[j] != k * 1000 + j)
                c->errors[w]++;
        team_barrier(c->t);
    }
}

static void check_barrier(int n, unsigned flags, int runs)
{
    struct bar_ctx c;
    memset(&c, 0, sizeof c);
    struct weld_err e;
    REQUIRE(team_create(&c.t, n, flags, &e) == WELD_OK);
    for (int r = 0; r < runs; r++)
        team_run(c.t, barrier_fn, &c);
    for (int w = 0; w < n; w++)
        CHECK_EQ_INT(c.errors[w], 0);
    team_free(c.t);
}

TEST(barrier_orders_phases)
{
    int cores = team_physical_cores();
    check_barrier(1, 0, 2);
    check_barrier(cores < MAXW ? cores : MAXW, 0, 4);
    check_barrier(3, TEAM_OVERSUBSCRIBE, 1);
}

/* Sum of per-worker partial sums after a barrier: a reduction through the barrier. */
struct sum_ctx {
    struct team *t;
    long long part[MAXW];
    long long total[MAXW];
    int len;
};

static void sum_fn(void *ctx, int w, int n)
{
    struct sum_ctx *c = ctx;
    long long s = 0;
    for (int i = w; i < c->len; i += n)
        s += i;
    c->part[w] = s;
    team_barrier(c->t);
    long long tot = 0;
    for (int j = 0; j < n; j++)
        tot += c->part[j];
    c->total[w] = tot;
    team_barrier(c->t);
}

TEST(ten_thousand_short_jobs)
{
    struct sum_ctx c;
    memset(&c, 0, sizeof c);
    struct weld_err e;
    int cores = team_physical_cores();
    REQUIRE(team_create(&c.t, cores < MAXW ? cores : MAXW, 0, &e) == WELD_OK);
    int n = team_size(c.t), bad = 0;
    for (int r = 0; r < 10000; r++) {
        c.len = r % 97;
        team_run(c.t, sum_fn, &c);
        long long want = (long long)c.len * (c.len - 1) / 2;
        for (int w = 0; w < n; w++)
            bad += c.total[w] != want;
    }
    CHECK_EQ_INT(bad, 0);
    team_free(c.t);
}

TEST(jobs_after_idle_sleep)
{
    /* Longer than the idle spin, so workers are asleep on the condition variable when the
       next job comes: it must wake them. */
    struct team *t;
    struct weld_err e;
    int cores = team_physical_cores();
    REQUIRE(team_create(&t, cores < MAXW ? cores : MAXW, 0, &e) == WELD_OK);
    struct count_ctx c;
    memset(&c, 0, sizeof c);
    for (int r = 0; r < 5; r++) {
        struct timespec ts = {0, 20 * 1000 * 1000};
        nanosleep(&ts, NULL);
        team_run(t, count_fn, &c);
    }
    for (int w = 0; w < team_size(t); w++)
        CHECK_EQ_INT(c.hits[w], 5);
    team_free(t);
    /* created and freed without ever running a job */
    REQUIRE(team_create(&t, 2, TEAM_OVERSUBSCRIBE, &e) == WELD_OK);
    team_free(t);
}

static double cpu_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

TEST(idle_team_sleeps)
{
    /* After a job, workers spin ~2 ms and then sleep: over 300 ms idle the whole process
       must use far less CPU than one spinning worker would (300 ms). */
    struct team *t;
    struct weld_err e;
    int cores = team_physical_cores();
    REQUIRE(team_create(&t, cores < MAXW ? cores : MAXW, 0, &e) == WELD_OK);
    struct count_ctx c;
    memset(&c, 0, sizeof c);
    team_run(t, count_fn, &c);
    double c0 = cpu_seconds();
    struct timespec ts = {0, 300 * 1000 * 1000};
    nanosleep(&ts, NULL);
    double used = cpu_seconds() - c0;
    if (team_size(t) > 1)
        fprintf(stderr, "  idle team of %d: %.1f ms CPU over 300 ms\n", team_size(t),
                used * 1e3);
    CHECK(used < 0.06);
    team_run(t, count_fn, &c);
    CHECK_EQ_INT(c.hits[team_size(t) - 1], 2);
    team_free(t);
}

TEST(parked_team_sleeps_at_once)
{
    /* team_park: the workers sleep now instead of spinning ~2 ms. 50 idle gaps of 5 ms
       would cost 100 ms of CPU per extra worker unparked; parked, next to none. */
    struct team *t;
    struct weld_err e;
    int cores = team_physical_cores();
    REQUIRE(team_create(&t, cores < MAXW ? cores : MAXW, 0, &e) == WELD_OK);
    if (team_size(t) < 2) {
        team_free(t);
        return;
    }
    struct count_ctx c;
    memset(&c, 0, sizeof c);
    double used = 0;
    for (int i = 0; i < 50; i++) {
        team_run(t, count_fn, &c);
        team_park(t);
        double c0 = cpu_seconds();
        struct timespec ts = {0, 5 * 1000 * 1000};
        nanosleep(&ts, NULL);
        used += cpu_seconds() - c0;
    }
    fprintf(stderr, "  parked team of %d: %.1f ms CPU over 50 gaps of 5 ms\n", team_size(t),
            used * 1e3);
    CHECK(used < 0.025 * (team_size(t) - 1));
    CHECK_EQ_INT(c.hits[team_size(t) - 1], 50);
    team_free(t);
}

/* The handoff probe: a time per round trip that more data does not shrink (medians, so
   only a loose order is asked of a noisy host), and refusals of what it cannot measure. */
TEST(handoff_probe)
{
    struct team *t;
    struct weld_err e;
    REQUIRE(team_create(&t, 2, TEAM_OVERSUBSCRIBE, &e) == WELD_OK);
    double ns0 = 0, ns16 = 0;
    CHECK_EQ_INT(team_handoff_ns(t, 0, 300, 3, &ns0, &e), WELD_OK);
    CHECK_EQ_INT(team_handoff_ns(t, 16, 300, 3, &ns16, &e), WELD_OK);
    fprintf(stderr, "  handoff round trip: %.0f ns, %.0f ns with 16 lines\n", ns0, ns16);
    CHECK(ns0 > 0 && ns0 < 1e8 && ns16 > 0 && ns16 < 1e8);
    CHECK_EQ_INT(team_handoff_ns(t, 65, 300, 3, &ns0, &e), WELD_ERR_INVALID_ARG);
    CHECK_EQ_INT(team_handoff_ns(t, 1, 0, 3, &ns0, &e), WELD_ERR_INVALID_ARG);
    team_free(t);
    REQUIRE(team_create(&t, 1, 0, &e) == WELD_OK);
    CHECK_EQ_INT(team_handoff_ns(t, 1, 10, 1, &ns0, &e), WELD_ERR_INVALID_ARG);
    CHECK(strstr(e.msg, "two workers") != NULL);
    team_free(t);
}

int main(void)
{
    RUN(team_of_one_runs_on_caller);
    RUN(every_worker_every_run);
    RUN(size_clamped_to_cores);
    RUN(barrier_orders_phases);
    RUN(ten_thousand_short_jobs);
    RUN(jobs_after_idle_sleep);
    RUN(idle_team_sleeps);
    RUN(parked_team_sleeps_at_once);
    RUN(handoff_probe);
    return test_summary();
}
