/*
 * log - leveled messages on stderr.
 *
 * The level comes from WELD_LOG (error, warn, info, debug; default info) read once, or from
 * log_set_level(). Model output goes to stdout; everything from here goes to stderr.
 */
#ifndef WELD_CORE_LOG_H
#define WELD_CORE_LOG_H

#include "core/err.h"

enum log_level { LOG_ERROR = 0, LOG_WARN, LOG_INFO, LOG_DEBUG };

void log_set_level(enum log_level l);
enum log_level log_get_level(void);
void log_msg(enum log_level l, const char *fmt, ...) WELD_PRINTF(2, 3);

#define log_error(...) log_msg(LOG_ERROR, __VA_ARGS__)
#define log_warn(...) log_msg(LOG_WARN, __VA_ARGS__)
#define log_info(...) log_msg(LOG_INFO, __VA_ARGS__)
#define log_debug(...) log_msg(LOG_DEBUG, __VA_ARGS__)

#endif
