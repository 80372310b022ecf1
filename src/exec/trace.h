/*
 * trace - per-worker instruction timelines written as a Chrome trace (WELD_TRACE=FILE).
 *
 *     struct trace *t;
 *     trace_create(&t, "run.json", n_workers, 4, &err);  // the first 4 steps
 *     per step, single-threaded:  trace_reserve(t, w, n_instr_of_w, &err) for every w
 *     on worker w, no locks:      trace_add(t, w, &ev)  (start, dependency met, end)
 *     after the step:             trace_step_done(t, &err)  // writes FILE after the last
 *     trace_free(t);
 *
 * Layout: one buffer of events per worker, each on its own cache lines, grown only by
 * trace_reserve between steps, so adding an event in the hot path is a store and an
 * increment of the worker's own count. Timestamps are CLOCK_MONOTONIC nanoseconds
 * (trace_now_ns); the file shows them in microseconds from the first event.
 *
 * Output ("traceEvents" JSON, opens in chrome://tracing and ui.perfetto.dev): process 1,
 * one thread per worker ("worker N"); per instruction a complete event ("ph":"X") named
 * after its opcode spanning dependency-met to end, with args step, instr, layer, seq,
 * rows and wait_us, and, when the worker had to wait for its inputs, a "wait" event
 * spanning start to dependency-met. trace_create checks the file can be written (and
 * empties it); it is written once, when the last traced step is done (or by trace_free if
 * fewer steps ran; a failure there is logged, as free cannot return it).
 *
 * Threading: trace_add(t, w, ...) only from worker w during a step; everything else from
 * the one thread that runs steps, between them. Deliberately not here: sampling, counters,
 * flow arrows between signaller and waiter.
 */
#ifndef WELD_EXEC_TRACE_H
#define WELD_EXEC_TRACE_H

#include "core/err.h"

#include <stdalign.h>
#include <stdbool.h>
#include <stdint.h>

struct trace_event {
    int64_t t_start, t_met, t_end; /* ns: reached the instruction, inputs ready, done */
    int32_t step;                   /* traced step index, from 0 */
    int32_t instr;                  /* index in the program */
    int32_t row0, row1, seq;
    int16_t layer;
    uint8_t op;                     /* enum prog_op */
};

struct trace_buf {
    alignas(64) struct trace_event *ev; /* (cap) */
    int n, cap;
};

struct trace {
    char *path;
    int n_workers;
    int max_steps, step;  /* steps to record, steps recorded so far */
    bool written;
    struct trace_buf *bufs; /* (n_workers), 64-byte aligned */
    void *bufs_raw;
};

/* n_workers >= 1, max_steps >= 1. */
int trace_create(struct trace **out, const char *path, int n_workers, int max_steps,
                 struct weld_err *e);
/* Writes the file if steps were recorded and it was not written yet. */
void trace_free(struct trace *t);

/* Whether the next step should be recorded. */
static inline bool trace_active(const struct trace *t)
{
    return t && t->step < t->max_steps;
}

/* Room for n more events on worker w (call between steps). */
int trace_reserve(struct trace *t, int w, int n, struct weld_err *e);

static inline void trace_add(struct trace *t, int w, const struct trace_event *ev)
{
    struct trace_buf *b = &t->bufs[w];
    if (b->n < b->cap)
        b->ev[b->n++] = *ev;
}

/* The current step is complete; after the last traced one the file is written. */
int trace_step_done(struct trace *t, struct weld_err *e);

int64_t trace_now_ns(void);

#endif
