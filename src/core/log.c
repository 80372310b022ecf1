/* log - see log.h. */
#include "core/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static int level = -1;

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
    if (l <= LOG_WARN)
        fprintf(stderr, "weld: %s: %s\n", names[l], buf);
    else
        fprintf(stderr, "weld: %s\n", buf);
}
