/* progress - see progress.h. */
#include "core/progress.h"

#include "core/log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

double time_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void progress_start(struct progress *p, const char *label, uint64_t total)
{
    memset(p, 0, sizeof *p);
    p->label = label;
    p->total = total ? total : 1;
    p->t_start = time_now();
    /* a bar for a person watching: not in pipes, logs and files, nor under WELD_LOG=warn */
    p->disabled = !isatty(2) || log_get_level() < LOG_INFO;
}

static void draw(struct progress *p, double now)
{
    int pct = (int)(100.0 * (double)p->done / (double)p->total);
    if (pct > 100)
        pct = 100;
    double el = now - p->t_start;
    char bar[31];
    int fill = pct * 30 / 100;
    for (int i = 0; i < 30; i++)
        bar[i] = i < fill ? '#' : '.';
    bar[30] = '\0';
    double eta = p->done ? el * (double)(p->total - p->done) / (double)p->done : 0;
    fprintf(stderr, "\r%s [%s] %3d%% %5.1fs eta %5.1fs", p->label, bar, pct, el, eta);
    p->drawn = 1;
    p->t_last_draw = now;
}

void progress_update(struct progress *p, uint64_t done)
{
    p->done = done;
    if (p->disabled)
        return;
    double now = time_now();
    if (now - p->t_start < 1.0 || now - p->t_last_draw < 0.1)
        return;
    draw(p, now);
}

void progress_add(struct progress *p, uint64_t delta)
{
    progress_update(p, p->done + delta);
}

void progress_end(struct progress *p)
{
    if (!p->drawn || p->disabled)
        return;
    p->done = p->total;
    draw(p, time_now());
    fputc('\n', stderr);
}
