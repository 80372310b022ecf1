/*
 * progress - a progress bar on stderr for long operations (model loads, conversions).
 *
 * Drawn only when stderr is a terminal and the log level shows info (so never into pipes,
 * log files or tests; WELD_LOG=warn hides it). Nothing is drawn during the first second,
 * so quick loads stay quiet; after that the bar redraws in place at most 10 times a
 * second. progress_end() finishes the line if anything was drawn.
 */
#ifndef WELD_CORE_PROGRESS_H
#define WELD_CORE_PROGRESS_H

#include <stdint.h>

struct progress {
    const char *label;
    uint64_t total, done;
    double t_start, t_last_draw;
    int drawn, disabled;
};

void progress_start(struct progress *p, const char *label, uint64_t total);
void progress_update(struct progress *p, uint64_t done);
void progress_add(struct progress *p, uint64_t delta);
void progress_end(struct progress *p);

/* Monotonic time in seconds. */
double time_now(void);

#endif
