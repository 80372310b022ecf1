/*
 * test.h - the assert runner every test executable uses.
 *
 *   TEST(name) { CHECK(x == 1); CHECK_EQ_INT(a, b); CHECK_NEAR(a, b, tol); }
 *   int main(void) { RUN(name); return test_summary(); }
 *
 * A failed CHECK prints file:line and the expression and marks the current test failed,
 * then the test goes on (REQUIRE returns from the test instead). SKIP("why %s", x) returns
 * from a test whose prerequisite is missing here (the shared model, a CPU feature): it
 * counts as skipped, never as passed. test_summary() prints "N passed, N failed, N skipped"
 * and returns the exit status for ctest: 1 if any test failed, 77 (the SKIP_RETURN_CODE
 * every test has) if none passed, else 0. A program that finds nothing to run at all
 * returns test_skip_all("why") from main.
 * Tests read shared data through test_shared_path("models/stories260K.gguf"), under
 * $WELD_SHARED: ctest sets it from the CMake cache variable WELD_SHARED (default
 * ../shared beside the source tree), which is also the default when run by hand.
 */
#ifndef WELD_TEST_H
#define WELD_TEST_H

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <errno.h>
#include <ftw.h>
#include <sys/stat.h>
#include <unistd.h>

/* TEST_SANITIZED: 1 in the AddressSanitizer/UBSan build (-O0, several times slower). Tests
   that repeat one code path over many random cases or large vocabularies run a subset there
   (the release build runs them all); the subset still reaches every code path. */
#if defined(__SANITIZE_ADDRESS__)
#define TEST_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TEST_SANITIZED 1
#endif
#endif
#ifndef TEST_SANITIZED
#define TEST_SANITIZED 0
#endif

static int test_n_pass, test_n_fail, test_n_skip, test_cur_failed, test_cur_skipped;
static const char *test_cur_name;

#define TEST(name) static void test_##name(void)

#define CHECK(cond)                                                                         \
    do {                                                                                    \
        if (!(cond)) {                                                                      \
            fprintf(stderr, "%s:%d: %s: CHECK failed: %s\n", __FILE__, __LINE__,            \
                    test_cur_name, #cond);                                                  \
            test_cur_failed = 1;                                                            \
        }                                                                                   \
    } while (0)

#define REQUIRE(cond)                                                                       \
    do {                                                                                    \
        if (!(cond)) {                                                                      \
            fprintf(stderr, "%s:%d: %s: REQUIRE failed: %s\n", __FILE__, __LINE__,          \
                    test_cur_name, #cond);                                                  \
            test_cur_failed = 1;                                                            \
            return;                                                                         \
        }                                                                                   \
    } while (0)

#define SKIP(...)                                                                           \
    do {                                                                                    \
        printf("%s: skipped: ", test_cur_name);                                             \
        printf(__VA_ARGS__);                                                                \
        printf("\n");                                                                       \
        test_cur_skipped = 1;                                                               \
        return;                                                                             \
    } while (0)

#define CHECK_EQ_INT(a, b)                                                                  \
    do {                                                                                    \
        long long a_ = (long long)(a), b_ = (long long)(b);                                 \
        if (a_ != b_) {                                                                     \
            fprintf(stderr, "%s:%d: %s: CHECK_EQ_INT failed: %s = %lld, %s = %lld\n",       \
                    __FILE__, __LINE__, test_cur_name, #a, a_, #b, b_);                     \
            test_cur_failed = 1;                                                            \
        }                                                                                   \
    } while (0)

#define CHECK_EQ_STR(a, b)                                                                  \
    do {                                                                                    \
        const char *a_ = (a), *b_ = (b);                                                    \
        if (!a_ || !b_ || strcmp(a_, b_) != 0) {                                            \
            fprintf(stderr, "%s:%d: %s: CHECK_EQ_STR failed: %s = \"%s\", %s = \"%s\"\n",   \
                    __FILE__, __LINE__, test_cur_name, #a, a_ ? a_ : "(null)", #b,          \
                    b_ ? b_ : "(null)");                                                    \
            test_cur_failed = 1;                                                            \
        }                                                                                   \
    } while (0)

#define CHECK_NEAR(a, b, tol)                                                               \
    do {                                                                                    \
        double a_ = (double)(a), b_ = (double)(b);                                          \
        if (!(fabs(a_ - b_) <= (tol))) {                                                    \
            fprintf(stderr, "%s:%d: %s: CHECK_NEAR failed: %s = %.9g, %s = %.9g\n",         \
                    __FILE__, __LINE__, test_cur_name, #a, a_, #b, b_);                     \
            test_cur_failed = 1;                                                            \
        }                                                                                   \
    } while (0)

/* Milliseconds on a monotonic clock (RUN prints each case's time: what to trim when the
   suite grows slow). */
static inline double test_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

#define RUN(name)                                                                                  \
    do {                                                                                           \
        test_cur_name = #name;                                                                     \
        test_cur_failed = 0;                                                                       \
        test_cur_skipped = 0;                                                                      \
        double t0_ = test_now_ms();                                                                \
        test_##name();                                                                             \
        const char *st_ = test_cur_skipped ? "  skipped" : "";                                     \
        printf("%-40s %8.0f ms%s\n", #name, test_now_ms() - t0_,                                   \
               test_cur_failed ? "  FAILED" : st_);                                                \
        if (test_cur_failed)                                                                       \
            test_n_fail++;                                                                         \
        else if (test_cur_skipped)                                                                 \
            test_n_skip++;                                                                         \
        else                                                                                       \
            test_n_pass++;                                                                         \
    } while (0)

static inline int test_summary(void)
{
    printf("%d passed, %d failed, %d skipped\n", test_n_pass, test_n_fail, test_n_skip);
    if (test_n_fail)
        return 1;
    return test_n_pass ? 0 : 77;
}

/* From main, when nothing can run here: says why (printf format), returns 77 (or 1 if a
   test failed). */
static inline int test_skip_all(const char *fmt, ...)
    __attribute__((format(printf, 1, 2)));
static inline int test_skip_all(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    printf("skipped: ");
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    test_n_skip++;
    return test_summary();
}

/* The shared data directory: $WELD_SHARED, else the WELD_SHARED the build was configured
   with. */
static inline const char *test_shared_dir(void)
{
    const char *env = getenv("WELD_SHARED");
    return env && env[0] ? env : WELD_SHARED_DEFAULT;
}

/* Path of a file under the shared directory (e.g. "models/stories260K.gguf"), or NULL if
   it is not there. The result lives in one of 8 buffers used in turn, so a test may hold
   several (a draft and its target) at once; copy it to keep it longer. */
static inline const char *test_shared_path(const char *rel)
{
    static char bufs[8][4096];
    static unsigned next;
    char *buf = bufs[next++ % 8];
    snprintf(buf, sizeof bufs[0], "%s/%s", test_shared_dir(), rel);
    return access(buf, R_OK) == 0 ? buf : NULL;
}

static inline int test_rm_entry(const char *path, const struct stat *sb, int flag,
                                struct FTW *ftw)
{
    (void)sb; (void)flag; (void)ftw;
    return remove(path);
}

static char test_tmpdir_path[4096];

static inline void test_tmpdir_remove(void)
{
    if (test_tmpdir_path[0])
        nftw(test_tmpdir_path, test_rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

/* A scratch directory for this test process, under the build tree: tmp-<program>-<pid>,
   removed at exit. Per process, not per program: ctest runs one executable several times
   at once (test_engine_engine and its _ref / _ops / _mega runs), and a shared directory
   let one run empty it under another. */
static inline const char *test_tmpdir(void)
{
    if (!test_tmpdir_path[0]) {
        snprintf(test_tmpdir_path, sizeof test_tmpdir_path, "%s/tmp-%s-%ld", WELD_BINARY_DIR,
                 program_invocation_short_name, (long)getpid());
        nftw(test_tmpdir_path, test_rm_entry, 16, FTW_DEPTH | FTW_PHYS);
        if (mkdir(test_tmpdir_path, 0700) != 0) {
            perror(test_tmpdir_path);
            exit(2);
        }
        atexit(test_tmpdir_remove);
    }
    return test_tmpdir_path;
}

/* The executor a test's forward passes run on: `--exec NAME` on its command line (the
   per-executor runs of tests/exec_executors.cmake and tests/mega.cmake); NULL: the
   default. Set by test_args(argc, argv) in main. */
static const char *test_exec;
static inline void test_args(int argc, char **argv)
{
    for (int i = 1; i + 1 < argc; i++)
        if (!strcmp(argv[i], "--exec"))
            test_exec = argv[i + 1];
}

#endif
