/*
 * trace - Chrome trace recording and writing (see trace.h for the design).
 *
 * Events stay in the per-worker buffers until the file is written in one go: the
 * workers never touch the file, and what a step costs to record is a clock read per
 * instruction boundary. The JSON is printed with stdio rather than built with Jansson
 * (thousands of small objects), with only numbers and fixed names in it, so nothing needs
 * escaping except the file name, which does not appear in the output.
 */
#include "exec/trace.h"

#include "core/alloc.h"
#include "core/log.h"
#include "exec/program.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

int64_t trace_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

int trace_create(struct trace **out, const char *path, int n_workers, int max_steps,
                 struct weld_err *e)
{
    *out = NULL;
    if (!path || !*path || n_workers < 1 || max_steps < 1)
        return err_set(e, WELD_ERR_INVALID_ARG, "trace: bad arguments (path '%s', %d workers, "
                       "%d steps)", path ? path : "", n_workers, max_steps);
    struct trace *t = wcalloc(1, sizeof *t);
    if (!t)
        return err_set(e, WELD_ERR_NOMEM, "trace: out of memory");
    t->n_workers = n_workers;
    t->max_steps = max_steps;
    t->path = wstrdup(path);
    t->bufs_raw = wcalloc((size_t)n_workers + 1, sizeof(struct trace_buf));
    if (!t->path || !t->bufs_raw) {
        trace_free(t);
        return err_set(e, WELD_ERR_NOMEM, "trace: out of memory for %d workers", n_workers);
    }
    t->bufs = (struct trace_buf *)(((uintptr_t)t->bufs_raw + 63) & ~(uintptr_t)63);
    FILE *f = fopen(path, "w"); /* fail now, not after the steps */
    if (!f) {
        int rc = err_set(e, WELD_ERR_IO, "WELD_TRACE=%s: cannot open for writing: %s", path,
                         strerror(errno));
        trace_free(t);
        return rc;
    }
    fclose(f);
    *out = t;
    return WELD_OK;
}

int trace_reserve(struct trace *t, int w, int n, struct weld_err *e)
{
    struct trace_buf *b = &t->bufs[w];
    if (n <= b->cap - b->n)
        return WELD_OK;
    long long want = (long long)b->n + n;
    if (want < 2LL * b->cap)
        want = 2LL * b->cap;
    if (want > (1 << 24))
        return err_set(e, WELD_ERR_LIMIT, "trace %s: more than %d events on worker %d",
                       t->path, 1 << 24, w);
    struct trace_event *ev = wrealloc(b->ev, (size_t)want * sizeof *ev);
    if (!ev)
        return err_set(e, WELD_ERR_NOMEM, "trace %s: out of memory for %lld events",
                       t->path, want);
    b->ev = ev;
    b->cap = (int)want;
    return WELD_OK;
}

static int64_t first_time(const struct trace *t)
{
    int64_t t0 = INT64_MAX;
    for (int w = 0; w < t->n_workers; w++)
        for (int i = 0; i < t->bufs[w].n; i++)
            if (t->bufs[w].ev[i].t_start < t0)
                t0 = t->bufs[w].ev[i].t_start;
    return t0 == INT64_MAX ? 0 : t0;
}

static void write_event(FILE *f, int w, const struct trace_event *ev, int64_t t0)
{
    double start = (double)(ev->t_start - t0) / 1e3, met = (double)(ev->t_met - t0) / 1e3;
    double end = (double)(ev->t_end - t0) / 1e3;
    if (ev->t_met > ev->t_start)
        fprintf(f, ",\n{\"name\":\"wait\",\"cat\":\"wait\",\"ph\":\"X\",\"pid\":1,\"tid\":%d,"
                "\"ts\":%.3f,\"dur\":%.3f,\"args\":{\"step\":%d,\"instr\":%d}}", w, start,
                met - start, ev->step, ev->instr);
    fprintf(f, ",\n{\"name\":\"%s\",\"cat\":\"instr\",\"ph\":\"X\",\"pid\":1,\"tid\":%d,"
            "\"ts\":%.3f,\"dur\":%.3f,\"args\":{\"step\":%d,\"instr\":%d,\"layer\":%d,"
            "\"seq\":%d,\"rows\":\"[%d, %d)\",\"wait_us\":%.3f}}", prog_op_name(ev->op), w, met,
            end - met, ev->step, ev->instr, ev->layer, ev->seq, ev->row0, ev->row1,
            met - start);
}

static int trace_write(struct trace *t, struct weld_err *e)
{
    t->written = true;
    FILE *f = fopen(t->path, "w");
    if (!f)
        return err_set(e, WELD_ERR_IO, "WELD_TRACE=%s: cannot open for writing: %s", t->path,
                       strerror(errno));
    int64_t t0 = first_time(t);
    fprintf(f, "{\"traceEvents\":[\n{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":1,"
            "\"args\":{\"name\":\"weld executor\"}}");
    for (int w = 0; w < t->n_workers; w++)
        fprintf(f, ",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":1,\"tid\":%d,"
                "\"args\":{\"name\":\"worker %d\"}}", w, w);
    for (int w = 0; w < t->n_workers; w++)
        for (int i = 0; i < t->bufs[w].n; i++)
            write_event(f, w, &t->bufs[w].ev[i], t0);
    fprintf(f, "\n],\"displayTimeUnit\":\"ns\"}\n");
    bool bad = ferror(f) != 0;
    if (fclose(f) != 0 || bad)
        return err_set(e, WELD_ERR_IO, "WELD_TRACE=%s: write failed: %s", t->path,
                       strerror(errno));
    return WELD_OK;
}

int trace_step_done(struct trace *t, struct weld_err *e)
{
    if (!trace_active(t))
        return WELD_OK;
    t->step++;
    return t->step == t->max_steps ? trace_write(t, e) : WELD_OK;
}

void trace_free(struct trace *t)
{
    if (!t)
        return;
    if (!t->written && t->step > 0 && t->path) {
        struct weld_err e;
        if (trace_write(t, &e))
            log_warn("%s", e.msg);
    }
    if (t->bufs)
        for (int w = 0; w < t->n_workers; w++)
            wfree(t->bufs[w].ev);
    wfree(t->bufs_raw);
    wfree(t->path);
    wfree(t);
}
