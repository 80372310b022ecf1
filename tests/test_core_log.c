/*
 * test_core_log - core/log.h's output discipline: one prefix per line (never doubled), and
 * a message never glued to an unfinished line of stdout when stdout and stderr are one
 * file (the terminal case), while a separate stderr gets no stray newline.
 */
#include "core/log.h"
#include "test.h"

#include <fcntl.h>

/* Run fn with stdout into file `out` and stderr into `err` (the same path: one file). */
static void capture(const char *out, const char *err, void (*fn)(void))
{
    fflush(stdout);
    fflush(stderr);
    int so = dup(STDOUT_FILENO), se = dup(STDERR_FILENO);
    int fo = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    int fe = strcmp(out, err) ? open(err, O_WRONLY | O_CREAT | O_TRUNC, 0600) : dup(fo);
    dup2(fo, STDOUT_FILENO);
    dup2(fe, STDERR_FILENO);
    close(fo);
    close(fe);
    fn();
    fflush(stdout);
    fflush(stderr);
    dup2(so, STDOUT_FILENO);
    dup2(se, STDERR_FILENO);
    close(so);
    close(se);
}

static char *slurp(const char *path)
{
    static char buf[4096];
    FILE *f = fopen(path, "rb");
    size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
    if (f)
        fclose(f);
    buf[n] = 0;
    return buf;
}

static void write_text_and_logs(void)
{
    log_set_level(LOG_INFO);
    log_set_prefix("weld generate");
    fputs("Once upon", stdout);
    fflush(stdout);
    log_stdout_open(true);
    log_warn("late %d", 1);          /* the open line is ended first */
    fputs(" a time\n", stdout);      /* the text goes on, on the next line */
    fflush(stdout);
    log_stdout_open(false);
    log_info("weld generate: ready"); /* already prefixed: not twice */
    log_info("weld: other");          /* another prefix is text */
    log_set_prefix(NULL);
}

TEST(one_file)
{
    char path[64];
    snprintf(path, sizeof path, "test_core_log_%d.txt", (int)getpid());
    capture(path, path, write_text_and_logs);
    CHECK_EQ_STR(slurp(path), "Once upon\nweld generate: warning: late 1\n a time\n"
                              "weld generate: ready\nweld generate: weld: other\n");
    unlink(path);
}

TEST(two_files)
{
    char out[64], err[64];
    snprintf(out, sizeof out, "test_core_log_%d.out", (int)getpid());
    snprintf(err, sizeof err, "test_core_log_%d.err", (int)getpid());
    capture(out, err, write_text_and_logs);
    CHECK_EQ_STR(slurp(out), "Once upon a time\n");
    CHECK_EQ_STR(slurp(err), "weld generate: warning: late 1\nweld generate: ready\n"
                             "weld generate: weld: other\n");
    CHECK_EQ_STR(log_prefix(), "weld");
    unlink(out);
    unlink(err);
}

int main(void)
{
    RUN(one_file);
    RUN(two_files);
    return test_summary();
}
