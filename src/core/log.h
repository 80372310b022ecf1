/*
 * log - leveled messages on stderr.
 *
 * The level comes from WELD_LOG (error, warn, info, debug; default info) read once, or from
 * log_set_level(). Model output goes to stdout; everything from here goes to stderr.
 *
 * Every line starts with one prefix naming the command ("weld" until the CLI sets
 * "weld generate", "weld serve", ...): "PREFIX: warning: text", "PREFIX: text". A message
 * that already starts with "PREFIX: " does not get it twice.
 *
 * Output discipline: while stdout holds an unfinished line of generated text
 * (log_stdout_open(true)) and stdout and stderr are the same file (one terminal, or
 * `>out 2>&1`), a message first ends that line on stderr, so it never gets glued to the
 * text; log_break_line() does the same for callers that print to stderr themselves.
 */
#ifndef WELD_CORE_LOG_H
#define WELD_CORE_LOG_H

#include "core/err.h"

#include <stdbool.h>

enum log_level { LOG_ERROR = 0, LOG_WARN, LOG_INFO, LOG_DEBUG };

void log_set_level(enum log_level l);
enum log_level log_get_level(void);
void log_msg(enum log_level l, const char *fmt, ...) WELD_PRINTF(2, 3);

/* The prefix of every line (copied; at most 63 bytes); log_prefix() returns it. */
void log_set_prefix(const char *prefix);
const char *log_prefix(void);
/* Whether stdout now ends inside a line (the caller writes stdout; not thread-safe: only
   the single-threaded CLI commands set it). */
void log_stdout_open(bool open);
/* If stdout's line is open and stdout and stderr share a file, end it (on stderr). */
void log_break_line(void);

#define log_error(...) log_msg(LOG_ERROR, __VA_ARGS__)
#define log_warn(...) log_msg(LOG_WARN, __VA_ARGS__)
#define log_info(...) log_msg(LOG_INFO, __VA_ARGS__)
#define log_debug(...) log_msg(LOG_DEBUG, __VA_ARGS__)

#endif
