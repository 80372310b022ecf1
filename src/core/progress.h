/*
 * progress - a progress bar on stderr for long operations (model loads, conversions).
 *
 * Nothing is drawn during the first second, so quick loads stay quiet; after that the bar
 * redraws at most 10 times a second, in place when stderr is a terminal and as a few
 * percentage lines otherwise. progress_end() finishes the line if anything was drawn.
 * WELD_NO_PROGRESS=1 disables it.
 */
#ifndef WELD_CORE_PROGRESS_H
#define WELD_CORE_PROGRESS_H

#include <stdint.h>

struct progress {
    const char *label;
    uint64_t total, done;
    double t_start, t_last_draw;
    int drawn, tty, last_pct, disabled;
};

void progress_start(struct progress *p, const char *label, uint64_t total);
void progress_update(struct progress *p, uint64_t done);
void progress_add(struct progress *p, uint64_t delta);
void progress_end(struct progress *p);

/* Monotonic time in seconds. */
double time_now(void);

#endif
