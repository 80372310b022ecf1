/* log - see log.h. */
#include "core/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int level = -1;
static char prefix[64] = "weld";
static bool stdout_open;

static enum log_level level_from_env(void)
{
    const char *s = getenv("WELD_LOG");
    if (!s)
        return LOG_INFO;
    if (!strcmp(s, "error")) return LOG_ERROR;
    if (!strcmp(s, "warn")) return LOG_WARN;
    if (!strcmp(s, "debug")) return LOG_DEBUG;
    return LOG_INFO;
}

void log_set_level(enum log_level l) { level = (int)l; }

enum log_level log_get_level(void)
{
    if (level < 0)
        level = (int)level_from_env();
    return (enum log_level)level;
}

void log_set_prefix(const char *p) { snprintf(prefix, sizeof prefix, "%s", p ? p : "weld"); }

const char *log_prefix(void) { return prefix; }

void log_stdout_open(bool open) { stdout_open = open; }

/* stdout and stderr are one file: the same terminal, pipe or regular file. */
static bool same_file(void)
{
    struct stat a, b;
    if (fstat(STDOUT_FILENO, &a) || fstat(STDERR_FILENO, &b))
        return false;
    return a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

void log_break_line(void)
{
    if (!stdout_open)
        return;
    fflush(stdout);
    if (same_file())
        fputc('\n', stderr);
    stdout_open = false;
}

void log_msg(enum log_level l, const char *fmt, ...)
{
    if ((int)l > (int)log_get_level())
        return;
    static const char *const names[] = {"error", "warning", "info", "debug"};
    char buf[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    const char *text = buf;
    size_t n = strlen(prefix);
    if (!strncmp(text, prefix, n) && text[n] == ':' && text[n + 1] == ' ')
        text += n + 2; /* already prefixed by its caller */
    log_break_line();
    if (l <= LOG_WARN)
        fprintf(stderr, "%s: %s: %s\n", prefix, names[l], text);
    else
        fprintf(stderr, "%s: %s\n", prefix, text);
}
