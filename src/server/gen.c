/*
 * gen - the engine thread and the job outboxes (design in gen.h).
 *
 * Locking: one mutex (g->mu) guards the inbox, the abort list, every job's shared fields
 * (state, outbox, n_done, refs, cancelled), the metrics and the stats snapshot. The engine
 * thread holds it only to move lists and to push events, never during engine_step or
 * engine_add_request; the engine callbacks take it per event. HTTP threads wait on their
 * job's own condition variable; the engine thread waits on g->cv. Fields of struct
 * server_sub and the active list belong to the engine thread alone.
 *
 * Streams: the outbox size (queued), the paused flag, the resume request and the socket of
 * a watched job are shared fields under g->mu. The engine thread pauses a job in on_delta
 * (engine_pause is safe inside a step) and resumes the jobs on the resume list at the start
 * of a round; it waits with a deadline while some job is paused so that a stall is noticed
 * even when nothing else happens. The socket is shut down (never closed) under g->mu, and
 * server_gen_release clears it under g->mu before the HTTP side lets MHD close it.
 *
 * Accounting: a job is over for the engine when n_done reaches n_choices. Choices are
 * counted done by on_finish (stop, length, abort, error), or in bulk when the job is
 * refused or cancelled before its requests were added.
 */
#include "server/gen.h"

#include "core/alloc.h"
#include "core/log.h"
#include "core/progress.h"

#include <errno.h>
#include <pthread.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

enum job_state { JOB_QUEUED, JOB_RUNNING, JOB_REFUSED, JOB_DONE };

struct server_sub {
    struct server_job *job;
    int prompt;
    uint64_t eng_id;
    bool added;
    int n_open;                   /* sequences not finished yet */
    double *t_last;               /* (n) time of each sequence's last token, 0: none */
};

struct server_job {
    struct server_gen *g;
    const struct request_params *p;       /* borrowed while QUEUED */
    const struct server_prompt *prompts;  /* borrowed while QUEUED, (n_prompts) */
    int n_prompts, n, n_choices;
    struct server_sub *subs;              /* (n_prompts) */
    pthread_cond_t cv;
    enum job_state state;
    struct server_error err;              /* JOB_REFUSED */
    struct server_event *head, *tail;
    int n_done, refs;
    bool cancelled, engine_ref;
    /* streams (server_gen_watch) */
    bool watched, paused, resume_queued, stalled;
    size_t queued;                        /* approximate bytes of the outbox's events */
    double t_paused;                      /* when it was paused (time_now) */
    int fd;                               /* the client's socket, -1: none */
    char id[64];
    struct server_job *next_in, *next_abort, *prev_act, *next_act, *next_fin;
    struct server_job *next_resume, *next_stall;
};

struct server_gen {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t thread;
    bool thread_started;
    struct engine_params ep;
    struct engine *eng;
    enum server_gen_state state;
    char load_err[1024];
    struct server_job *in_head, *in_tail, *abort_head;
    struct server_job *active;            /* engine thread only */
    struct server_job *finished;          /* all choices over, not yet marked done */
    bool go, closed, quit, busy;
    struct server_metrics m;
    uint64_t success_pending[5];          /* finished since the last snapshot */
    int tier_waiters;                     /* HTTP threads in server_gen_tier_wait */
    bool eng_gone;                        /* server_gen_free is freeing the engine */
    size_t stream_buffer;                 /* 0: no cap */
    double stall_timeout;                 /* 0: none */
    struct server_job *resume_head;       /* jobs whose HTTP side asked for a resume */
    int n_paused;                         /* jobs paused */
};

static void job_free(struct server_job *j)
{
    while (j->head) {
        struct server_event *n = j->head->next;
        wfree(j->head);
        j->head = n;
    }
    for (int i = 0; j->subs && i < j->n_prompts; i++)
        wfree(j->subs[i].t_last);
    wfree(j->subs);
    pthread_cond_destroy(&j->cv);
    wfree(j);
}

/* Drop one reference under g->mu; frees the job when it was the last. */
static void job_unref_locked(struct server_job *j)
{
    if (--j->refs == 0)
        job_free(j);
}

/* k more choices are over. When all are, the job goes on the finished list: it is marked
   done (and the engine's reference dropped) at the end of the round, after the stats were
   published, so a client that got its answer sees /metrics without it. Under g->mu. */
static void job_done_locked(struct server_job *j, int k)
{
    j->n_done += k;
    if (j->n_done < j->n_choices)
        return;
    struct server_gen *g = j->g;
    j->next_fin = g->finished;
    g->finished = j;
}

/* Mark the finished list done. Under g->mu. */
static void finish_jobs_locked(struct server_gen *g)
{
    while (g->finished) {
        struct server_job *j = g->finished;
        g->finished = j->next_fin;
        if (j->state == JOB_RUNNING)
            j->state = JOB_DONE;
        pthread_cond_broadcast(&j->cv);
        if (j->engine_ref) {
            j->engine_ref = false;
            job_unref_locked(j);
        }
    }
}

/* What an event costs in the outbox (approximately: finish events have their strings). */
static size_t event_bytes(const struct server_event *ev)
{
    return sizeof *ev + ev->len + 1;
}

static void push_locked(struct server_job *j, struct server_event *ev)
{
    j->queued += event_bytes(ev);
    ev->next = NULL;
    if (j->tail)
        j->tail->next = ev;
    else
        j->head = ev;
    j->tail = ev;
    pthread_cond_broadcast(&j->cv);
}

/* ---- engine callbacks (engine thread, inside engine_step / engine_abort) ---------------- */

static void on_delta(void *user, uint64_t req_id, int seq, const char *text, size_t len,
                     const int32_t *tokens, int n_tokens, const struct request_logprob *lp)
{
    struct server_sub *s = user;
    struct server_gen *g = s->job->g;
    (void)req_id;
    double now = time_now(), itl = -1;
    if (n_tokens && seq >= 0 && seq < s->job->n) {
        if (s->t_last[seq] > 0)
            itl = now - s->t_last[seq];
        s->t_last[seq] = now;
    }
    struct server_event *ev = NULL;
    if (len || lp) {
        ev = wcalloc(1, sizeof *ev + len + 1);
        if (ev) {
            ev->choice = s->prompt * s->job->n + seq;
            ev->n_tokens = n_tokens;
            memcpy(ev->text, text, len);
            ev->len = len;
            if (lp) {
                ev->has_lp = true;
                ev->token = lp->token;
                ev->logprob = lp->logprob;
                ev->n_top = lp->n_top < REQUEST_MAX_LOGPROBS ? lp->n_top : REQUEST_MAX_LOGPROBS;
                memcpy(ev->top_ids, lp->top_ids, (size_t)ev->n_top * sizeof *ev->top_ids);
                memcpy(ev->top_lps, lp->top_logprobs, (size_t)ev->n_top * sizeof *ev->top_lps);
            }
        }
    }
    struct server_job *j = s->job;
    pthread_mutex_lock(&g->mu);
    if (itl >= 0)
        prom_hist_observe(&g->m.itl, itl);
    if (ev)
        push_locked(j, ev);
    bool pause = j->watched && !j->paused && !j->cancelled && g->stream_buffer &&
                 j->queued > g->stream_buffer;
    if (pause) {
        j->paused = true;
        j->t_paused = now;
        g->n_paused++;
    }
    pthread_mutex_unlock(&g->mu);
    for (int i = 0; pause && i < j->n_prompts; i++)
        if (j->subs[i].added && j->subs[i].n_open > 0)
            engine_pause(g->eng, j->subs[i].eng_id, NULL);
}

/* The result a choice carries besides its text, as one event (NULL: none): the prompt
   tokens' logprobs, the embedding. */
static struct server_event *result_event(const struct server_sub *s, int seq,
                                         const struct request_result *r)
{
    const size_t al = sizeof(double);
    size_t n_lp = (size_t)r->n_prompt_logprobs, n_emb = (size_t)r->n_embedding;
    if (!n_lp && !n_emb)
        return NULL;
    struct server_event *ev = wcalloc(1, sizeof *ev + 2 * al + n_lp * sizeof *ev->plp +
                                             n_emb * sizeof *ev->emb);
    if (!ev)
        return NULL;
    ev->choice = s->prompt * s->job->n + seq;
    uintptr_t at = ((uintptr_t)ev->text + al - 1) & ~(uintptr_t)(al - 1);
    if (n_lp) {
        ev->plp = (struct server_prompt_lp *)at;
        ev->n_plp = (int)n_lp;
        for (size_t i = 0; i < n_lp; i++) {
            const struct request_logprob *lp = &r->prompt_logprobs[i];
            struct server_prompt_lp *o = &ev->plp[i];
            o->token = lp->token;
            o->logprob = lp->logprob;
            o->n_top = lp->n_top < REQUEST_MAX_LOGPROBS ? lp->n_top : REQUEST_MAX_LOGPROBS;
            memcpy(o->top_ids, lp->top_ids, (size_t)o->n_top * sizeof *o->top_ids);
            memcpy(o->top_lps, lp->top_logprobs, (size_t)o->n_top * sizeof *o->top_lps);
        }
        at += n_lp * sizeof *ev->plp;
    }
    if (n_emb) {
        ev->emb = (float *)at;
        ev->n_emb = (int)n_emb;
        memcpy(ev->emb, r->embedding, n_emb * sizeof *ev->emb);
    }
    return ev;
}

static void on_finish(void *user, uint64_t req_id, int seq, const struct request_result *r)
{
    struct server_sub *s = user;
    struct server_job *j = s->job;
    struct server_gen *g = j->g;
    (void)req_id;
    size_t ls = r->stop_reason ? strlen(r->stop_reason) + 1 : 0;
    size_t le = r->error ? strlen(r->error) + 1 : 0;
    struct server_event *ev = wcalloc(1, sizeof *ev + 1 + ls + le);
    if (ev) {
        ev->choice = s->prompt * j->n + seq;
        ev->finish = true;
        ev->reason = r->finish;
        ev->stop_token = r->stop_token;
        ev->n_prompt = r->n_prompt_tokens;
        ev->n_cached = r->n_cached_tokens;
        ev->n_tier = r->n_tier_tokens;
        ev->n_kv_saved = r->n_kv_saved_tokens;
        ev->kv_saved_hash[0] = r->kv_saved_hash[0];
        ev->kv_saved_hash[1] = r->kv_saved_hash[1];
        ev->kv_ticket = r->kv_ticket;
        ev->n_generated = r->n_generated_tokens;
        if (ls)
            ev->stop_reason = memcpy(ev->text + 1, r->stop_reason, ls);
        if (le)
            ev->error = memcpy(ev->text + 1 + ls, r->error, le);
    }
    s->n_open--;
    struct server_event *rev = result_event(s, seq, r);
    pthread_mutex_lock(&g->mu);
    if (rev)
        push_locked(j, rev);
    if (r->finish > 0 && r->finish < 5)
        g->success_pending[r->finish]++;
    if (seq == 0) {
        if (r->t_first_token > 0)
            prom_hist_observe(&g->m.ttft, r->t_first_token);
        if (r->t_queue > 0)
            prom_hist_observe(&g->m.queue, r->t_queue);
        prom_hist_observe(&g->m.e2e, r->t_total);
    }
    if (ev)
        push_locked(j, ev);
    int left = j->n_choices - j->n_done - 1;
    if (left == 0) {
        if (j->paused) {
            j->paused = false;
            g->n_paused--;
        }
        /* unlink from the engine thread's active list before the job can be freed */
        if (j->prev_act)
            j->prev_act->next_act = j->next_act;
        else if (g->active == j)
            g->active = j->next_act;
        if (j->next_act)
            j->next_act->prev_act = j->prev_act;
        j->prev_act = j->next_act = NULL;
    }
    job_done_locked(j, 1);
    pthread_mutex_unlock(&g->mu);
}

/* ---- the engine thread ------------------------------------------------------------------ */

static void refuse(struct server_gen *g, struct server_job *j, int added, int http,
                   const char *msg)
{
    pthread_mutex_lock(&g->mu);
    j->state = JOB_REFUSED;
    server_error_set(&j->err, http, http == 400 ? "prompt" : NULL, "%s", msg);
    job_done_locked(j, (j->n_prompts - added) * j->n);
    pthread_mutex_unlock(&g->mu);
    for (int i = 0; i < added; i++)
        engine_abort(g->eng, j->subs[i].eng_id, NULL);
}

static void abort_job(struct server_gen *g, struct server_job *j);

static void add_job(struct server_gen *g, struct server_job *j, bool quit)
{
    pthread_mutex_lock(&g->mu);
    bool cancelled = j->cancelled;
    pthread_mutex_unlock(&g->mu);
    if (cancelled || quit) {
        refuse(g, j, 0, 503, cancelled ? "request cancelled" : "the server is shutting down");
        return;
    }
    for (int i = 0; i < j->n_prompts; i++) {
        struct request_params q = *j->p;
        q.prompt_ids = j->prompts[i].ids;
        q.n_prompt_ids = j->prompts[i].n_ids;
        struct request_callbacks cb = {&j->subs[i], on_delta, on_finish};
        struct weld_err we = {0};
        j->subs[i].n_open = j->n;
        if (engine_add_request(g->eng, &q, &cb, &j->subs[i].eng_id, &we)) {
            char msg[1100];
            if (j->n_prompts > 1)
                snprintf(msg, sizeof msg, "prompt[%d]: %s", i, we.msg);
            else
                snprintf(msg, sizeof msg, "%s", we.msg);
            refuse(g, j, i, we.status == WELD_ERR_NOMEM ? 500 : 400, msg);
            return;
        }
        j->subs[i].added = true;
    }
    pthread_mutex_lock(&g->mu);
    j->state = JOB_RUNNING;
    j->p = NULL;
    j->prompts = NULL;
    j->next_act = g->active;
    if (g->active)
        g->active->prev_act = j;
    g->active = j;
    cancelled = j->cancelled; /* cancelled while its requests were being added */
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&g->mu);
    if (cancelled)
        abort_job(g, j);
}

static void abort_job(struct server_gen *g, struct server_job *j)
{
    for (int i = 0; i < j->n_prompts; i++)
        if (j->subs[i].added && j->subs[i].n_open > 0)
            engine_abort(g->eng, j->subs[i].eng_id, NULL);
}

/* Resume the jobs whose HTTP side took their outbox down (the list taken from g). */
static void resume_jobs(struct server_gen *g, struct server_job *list)
{
    while (list) {
        struct server_job *j = list, *next = j->next_resume;
        pthread_mutex_lock(&g->mu);
        bool go = j->paused && j->resume_queued;
        j->resume_queued = false;
        if (go) {
            j->paused = false;
            g->n_paused--;
        }
        pthread_mutex_unlock(&g->mu);
        for (int i = 0; go && i < j->n_prompts; i++)
            if (j->subs[i].added && j->subs[i].n_open > 0)
                engine_resume(g->eng, j->subs[i].eng_id, NULL);
        pthread_mutex_lock(&g->mu);
        job_unref_locked(j);
        pthread_mutex_unlock(&g->mu);
        list = next;
    }
}

/* The earliest time a paused job stalls (0: none). Under g->mu, engine thread. */
static double stall_deadline_locked(const struct server_gen *g)
{
    double d = 0;
    if (g->n_paused == 0 || g->stall_timeout <= 0)
        return 0;
    for (const struct server_job *j = g->active; j; j = j->next_act)
        if (j->paused && !j->stalled && (d == 0 || j->t_paused + g->stall_timeout < d))
            d = j->t_paused + g->stall_timeout;
    return d;
}

/* Abort the jobs paused for longer than the stall timeout and shut their sockets down. */
static void abort_stalled(struct server_gen *g)
{
    struct server_job *list = NULL;
    double now = time_now();
    pthread_mutex_lock(&g->mu);
    if (g->n_paused > 0 && g->stall_timeout > 0)
        for (struct server_job *j = g->active; j; j = j->next_act)
            if (j->paused && !j->stalled && now - j->t_paused >= g->stall_timeout) {
                j->stalled = true;
                j->next_stall = list;
                list = j;
                log_warn("weld serve: %s: aborted: its client stopped reading (paused %.1f s "
                         "with %zu bytes queued, over --stream-buffer-size %zu; "
                         "--stream-stall-timeout %g s)", j->id[0] ? j->id : "stream",
                         now - j->t_paused, j->queued, g->stream_buffer, g->stall_timeout);
                g->m.stream_stalls++;
                if (j->fd >= 0)
                    shutdown(j->fd, SHUT_RDWR);
            }
    pthread_mutex_unlock(&g->mu);
    /* abort_job may finish a job (on_finish unlinks it) but never frees it: the HTTP side
       holds a reference until its connection ends */
    for (struct server_job *j = list; j; j = j->next_stall)
        abort_job(g, j);
}

static void publish_stats(struct server_gen *g)
{
    struct engine_stats st;
    engine_stats_get(g->eng, &st);
    pthread_mutex_lock(&g->mu);
    g->m.st = st;
    /* finish counts join the snapshot that no longer holds their requests' blocks */
    for (int i = 0; i < 5; i++) {
        g->m.success[i] += g->success_pending[i];
        g->success_pending[i] = 0;
    }
    finish_jobs_locked(g);
    pthread_mutex_unlock(&g->mu);
}

/* Wait on g->cv until the deadline (time_now seconds; 0: none). Under g->mu. */
static void wait_locked(struct server_gen *g, double deadline)
{
    if (deadline <= 0) {
        pthread_cond_wait(&g->cv, &g->mu);
        return;
    }
    double left = deadline - time_now();
    if (left <= 0)
        return;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    long ns = ts.tv_nsec + (long)((left - (double)(long)left) * 1e9);
    ts.tv_sec += (time_t)left + ns / 1000000000L;
    ts.tv_nsec = ns % 1000000000L;
    pthread_cond_timedwait(&g->cv, &g->mu, &ts);
}

/* One round: take the lists, add, abort, resume, step. Returns false when the thread
   should end. */
static bool gen_round(struct server_gen *g)
{
    pthread_mutex_lock(&g->mu);
    while (!g->in_head && !g->abort_head && !g->resume_head && !engine_has_work(g->eng) &&
           !g->quit) {
        g->busy = false;
        double d = stall_deadline_locked(g);
        if (d > 0 && time_now() >= d)
            break;
        wait_locked(g, d);
    }
    g->busy = true;
    struct server_job *in = g->in_head, *ab = g->abort_head, *re = g->resume_head;
    g->in_head = g->in_tail = g->abort_head = g->resume_head = NULL;
    bool quit = g->quit;
    pthread_mutex_unlock(&g->mu);
    while (in) {
        struct server_job *next = in->next_in;
        add_job(g, in, quit);
        in = next;
    }
    while (ab) {
        struct server_job *next = ab->next_abort;
        abort_job(g, ab);
        pthread_mutex_lock(&g->mu);
        job_unref_locked(ab);
        pthread_mutex_unlock(&g->mu);
        ab = next;
    }
    resume_jobs(g, re);
    abort_stalled(g);
    if (quit)
        while (g->active)
            abort_job(g, g->active);
    if (engine_has_work(g->eng)) {
        struct weld_err we = {0};
        if (engine_step(g->eng, &we)) {
            log_error("weld serve: step failed: %s", we.msg);
            if (engine_broken(g->eng)) {
                pthread_mutex_lock(&g->mu);
                if (g->state == SERVER_GEN_READY) {
                    g->state = SERVER_GEN_BROKEN;
                    snprintf(g->load_err, sizeof g->load_err, "%s", we.msg);
                }
                pthread_mutex_unlock(&g->mu);
            }
        }
    }
    publish_stats(g);
    if (!quit)
        return true;
    pthread_mutex_lock(&g->mu);
    bool more = g->in_head || g->abort_head || g->resume_head || engine_has_work(g->eng);
    if (!more)
        g->busy = false;
    pthread_mutex_unlock(&g->mu);
    return more;
}

static void *gen_main(void *arg)
{
    struct server_gen *g = arg;
    struct weld_err we = {0};
    struct engine *eng = NULL;
    pthread_mutex_lock(&g->mu);
    while (!g->go && !g->quit)
        pthread_cond_wait(&g->cv, &g->mu);
    bool quit = g->quit;
    pthread_mutex_unlock(&g->mu);
    if (quit)
        return NULL;
    int rc = engine_create(&eng, &g->ep, &we);
    pthread_mutex_lock(&g->mu);
    if (rc) {
        g->state = SERVER_GEN_FAILED;
        snprintf(g->load_err, sizeof g->load_err, "%s", we.msg);
    } else {
        g->eng = eng;
        g->state = SERVER_GEN_READY;
    }
    pthread_mutex_unlock(&g->mu);
    if (rc)
        return NULL;
    publish_stats(g);
    while (gen_round(g))
        ;
    return NULL;
}

/* ---- API for HTTP threads --------------------------------------------------------------- */

int server_gen_start(struct server_gen **out, const struct engine_params *p, struct weld_err *e)
{
    struct server_gen *g = wcalloc(1, sizeof *g);
    if (!g)
        return err_set(e, WELD_ERR_NOMEM, "server: out of memory");
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, NULL);
    g->ep = *p;
    g->state = SERVER_GEN_LOADING;
    server_metrics_init(&g->m);
    if (pthread_create(&g->thread, NULL, gen_main, g) != 0) {
        server_gen_free(g);
        return err_set(e, WELD_ERR_INTERNAL, "server: cannot start the engine thread");
    }
    g->thread_started = true;
    *out = g;
    return WELD_OK;
}

void server_gen_set_stream_limits(struct server_gen *g, size_t buffer, double stall_timeout)
{
    pthread_mutex_lock(&g->mu);
    g->stream_buffer = buffer;
    g->stall_timeout = stall_timeout;
    pthread_mutex_unlock(&g->mu);
}

void server_gen_halt(struct server_gen *g)
{
    if (!g)
        return;
    pthread_mutex_lock(&g->mu);
    g->quit = g->closed = true;
    pthread_cond_signal(&g->cv);
    pthread_mutex_unlock(&g->mu);
    if (g->thread_started)
        pthread_join(g->thread, NULL);
    g->thread_started = false;
}

void server_gen_free(struct server_gen *g)
{
    if (!g)
        return;
    server_gen_halt(g);
    pthread_mutex_lock(&g->mu); /* HTTP threads waiting for the tier's writes first */
    g->eng_gone = true;
    while (g->tier_waiters > 0)
        pthread_cond_wait(&g->cv, &g->mu);
    pthread_mutex_unlock(&g->mu);
    engine_free(g->eng);
    pthread_cond_destroy(&g->cv);
    pthread_mutex_destroy(&g->mu);
    wfree(g);
}

void server_gen_load(struct server_gen *g)
{
    pthread_mutex_lock(&g->mu);
    g->go = true;
    pthread_cond_signal(&g->cv);
    pthread_mutex_unlock(&g->mu);
}

enum server_gen_state server_gen_state(struct server_gen *g, char *msg, size_t cap)
{
    pthread_mutex_lock(&g->mu);
    enum server_gen_state s = g->state;
    if (msg && cap)
        snprintf(msg, cap, "%s", g->load_err);
    pthread_mutex_unlock(&g->mu);
    return s;
}

const struct engine *server_gen_engine(struct server_gen *g)
{
    return server_gen_state(g, NULL, 0) == SERVER_GEN_READY ? g->eng : NULL;
}

struct server_job *server_gen_submit(struct server_gen *g, const struct request_params *p,
                                     const struct server_prompt *prompts, int n_prompts,
                                     struct server_error *e)
{
    struct server_job *j = wcalloc(1, sizeof *j);
    if (!j || !(j->subs = wcalloc((size_t)n_prompts, sizeof *j->subs))) {
        wfree(j);
        server_error_set(e, 500, NULL, "out of memory");
        return NULL;
    }
    j->g = g;
    j->fd = -1;
    j->p = p;
    j->prompts = prompts;
    j->n_prompts = n_prompts;
    j->n = p->n;
    j->n_choices = n_prompts * p->n;
    pthread_cond_init(&j->cv, NULL);
    for (int i = 0; i < n_prompts; i++) {
        j->subs[i].job = j;
        j->subs[i].prompt = i;
        if (!(j->subs[i].t_last = wcalloc((size_t)p->n, sizeof(double)))) {
            job_free(j);
            server_error_set(e, 500, NULL, "out of memory");
            return NULL;
        }
    }
    pthread_mutex_lock(&g->mu);
    if (g->closed || g->state != SERVER_GEN_READY) {
        pthread_mutex_unlock(&g->mu);
        job_free(j);
        server_error_set(e, 503, NULL, g->closed ? "the server is shutting down"
                                                 : "the model is still loading");
        return NULL;
    }
    j->refs = 2;
    j->engine_ref = true;
    if (g->in_tail)
        g->in_tail->next_in = j;
    else
        g->in_head = j;
    g->in_tail = j;
    pthread_cond_signal(&g->cv);
    pthread_mutex_unlock(&g->mu);
    return j;
}

int server_gen_wait_accepted(struct server_job *j, struct server_error *e)
{
    struct server_gen *g = j->g;
    pthread_mutex_lock(&g->mu);
    while (j->state == JOB_QUEUED)
        pthread_cond_wait(&j->cv, &g->mu);
    int rc = 0;
    if (j->state == JOB_REFUSED) {
        *e = j->err;
        rc = e->http;
    }
    pthread_mutex_unlock(&g->mu);
    return rc;
}

int server_gen_next(struct server_job *j, int timeout_ms, struct server_event **ev)
{
    struct server_gen *g = j->g;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += timeout_ms / 1000;
    ts.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    int rc = 0;
    bool timed_out = false;
    pthread_mutex_lock(&g->mu);
    for (;;) {
        if (j->head) {
            *ev = j->head;
            j->head = j->head->next;
            if (!j->head)
                j->tail = NULL;
            j->queued -= event_bytes(*ev);
            if (j->paused && !j->resume_queued && j->queued <= g->stream_buffer / 2) {
                j->resume_queued = true;
                j->refs++;
                j->next_resume = g->resume_head;
                g->resume_head = j;
                pthread_cond_signal(&g->cv);
            }
            rc = 1;
            break;
        }
        if (j->state == JOB_DONE || j->state == JOB_REFUSED) {
            rc = -1;
            break;
        }
        if (timed_out)
            break;
        if (pthread_cond_timedwait(&j->cv, &g->mu, &ts) == ETIMEDOUT)
            timed_out = true;
    }
    pthread_mutex_unlock(&g->mu);
    return rc;
}

void server_gen_watch(struct server_job *j, int fd, const char *id)
{
    struct server_gen *g = j->g;
    pthread_mutex_lock(&g->mu);
    j->watched = true;
    j->fd = fd;
    snprintf(j->id, sizeof j->id, "%s", id ? id : "");
    pthread_mutex_unlock(&g->mu);
}

void server_gen_cancel(struct server_job *j)
{
    struct server_gen *g = j->g;
    pthread_mutex_lock(&g->mu);
    if (!j->cancelled && j->state != JOB_DONE && j->state != JOB_REFUSED) {
        j->cancelled = true;
        if (j->state == JOB_RUNNING) {
            j->refs++;
            j->next_abort = g->abort_head;
            g->abort_head = j;
            pthread_cond_signal(&g->cv);
        }
    }
    pthread_mutex_unlock(&g->mu);
}

void server_gen_release(struct server_job *j)
{
    if (!j)
        return;
    struct server_gen *g = j->g;
    pthread_mutex_lock(&g->mu);
    while (j->state == JOB_QUEUED)
        pthread_cond_wait(&j->cv, &g->mu);
    j->fd = -1;
    job_unref_locked(j);
    pthread_mutex_unlock(&g->mu);
}

void server_gen_metrics(struct server_gen *g, struct server_metrics *m)
{
    pthread_mutex_lock(&g->mu);
    *m = g->m;
    pthread_mutex_unlock(&g->mu);
}

void server_gen_count_http(struct server_gen *g, int status)
{
    pthread_mutex_lock(&g->mu);
    g->m.http_requests++;
    if (status >= 400)
        g->m.http_errors++;
    pthread_mutex_unlock(&g->mu);
}

void server_gen_close(struct server_gen *g)
{
    pthread_mutex_lock(&g->mu);
    g->closed = true;
    pthread_mutex_unlock(&g->mu);
}

bool server_gen_drain(struct server_gen *g, double timeout)
{
    double t_end = time_now() + timeout;
    for (;;) {
        pthread_mutex_lock(&g->mu);
        bool idle = (g->state != SERVER_GEN_READY && g->state != SERVER_GEN_BROKEN) ||
                    (!g->busy && !g->in_head && !g->active);
        pthread_mutex_unlock(&g->mu);
        if (idle)
            return true;
        if (time_now() >= t_end)
            return false;
        struct timespec ts = {0, 20 * 1000000L};
        nanosleep(&ts, NULL);
    }
}

void server_gen_tier_wait(struct server_gen *g, uint64_t ticket)
{
    pthread_mutex_lock(&g->mu);
    const struct engine *eng = g->eng_gone ? NULL : g->eng;
    g->tier_waiters += eng != NULL;
    pthread_mutex_unlock(&g->mu);
    if (!eng)
        return;
    double t0 = time_now();
    engine_tier_wait(eng, ticket); /* thread-safe: only the tier's write queue */
    double waited = time_now() - t0;
    pthread_mutex_lock(&g->mu);
    g->m.kv_save_wait_seconds += waited;
    g->tier_waiters--;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
}
