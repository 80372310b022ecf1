/*
 * workers - the router's table of workers: who they are (--worker, --prefill, --decode,
 * --worker-file), whether they are healthy, how loaded, and which one a request goes to.
 *
 * Health: every --health-check-interval seconds the health thread sends GET /health to
 * every listed worker at once (one curl multi, each check bounded by
 * --health-check-timeout), and GET /metrics when a least_load policy needs the load. A
 * worker answering 200 is healthy; one failing --health-failure-threshold checks in a row
 * is taken out; a request that cannot reach a worker (connection refused or reset, empty
 * answer: workers_done with ATTEMPT_DOWN) takes it out at once. Either way it comes back
 * after its next good check. Transitions are logged once each, with the reason.
 *
 * Load (least_load): running + waiting requests from the worker's last scrape
 * (weld:num_requests_running / _waiting, or vllm: names), corrected by what the router
 * started or finished there since (in_flight - in_flight_at_scrape), never below the
 * router's own in_flight; kv_cache_usage_perc breaks ties. cache_aware's load is the
 * router's in_flight alone (SGLang's).
 *
 * Reload (SIGHUP): the worker file is read again; listed workers that are in neither the
 * flags nor the file are dropped (their tree entries go, their requests in flight finish
 * on them: the reference count keeps them), new ones are added unhealthy and checked at
 * once. A file that does not parse keeps the current table (the error is logged).
 *
 * Slots: each listed worker has the smallest tree id not in use, so the tree's per-worker
 * arrays stay as small as the table.
 */
#include "router/internal.h"

#include "core/alloc.h"
#include "core/log.h"
#include "core/progress.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define SCRAPE_MAX ((size_t)1 << 20)

static const char *role_name(enum worker_role r)
{
    return r == WORKER_PREFILL ? "prefill" : r == WORKER_DECODE ? "decode" : "worker";
}

enum worker_role workers_serving_role(const struct router *r)
{
    return r->o.pd ? WORKER_DECODE : WORKER_ANY;
}

void worker_unref(struct worker *w)
{
    if (!w || __atomic_sub_fetch(&w->refs, 1, __ATOMIC_ACQ_REL) > 0)
        return;
    upstream_pool_free(w);
    wfree(w->url);
    wfree(w);
}

/* ---- URLs and the worker file ----------------------------------------------------------- */

/* *out: a copy of url without trailing slashes; an error says what is expected. */
static int url_norm(const char *flag, const char *url, char **out, struct weld_err *e)
{
    *out = NULL;
    size_t n = strlen(url);
    while (n && url[n - 1] == '/')
        n--;
    bool scheme = !strncmp(url, "http://", 7) || !strncmp(url, "https://", 8);
    const char *host = scheme ? strstr(url, "//") + 2 : url;
    if (!scheme || (size_t)(host - url) >= n || strpbrk(url, " \t\r\n"))
        return err_set(e, WELD_ERR_INVALID_ARG,
                       "%s '%s': expected a URL such as "
                       "http://127.0.0.1:8001 (the worker's base URL, without /v1)",
                       flag, url);
    if (n >= 3 && !strncmp(url + n - 3, "/v1", 3))
        return err_set(e, WELD_ERR_INVALID_ARG,
                       "%s '%s': give the worker's base URL without "
                       "/v1 (the router adds each route's path)",
                       flag, url);
    if (!(*out = wstrndup(url, n)))
        return err_set(e, WELD_ERR_NOMEM, "out of memory");
    return WELD_OK;
}

struct wspec {
    char *url;
    enum worker_role role;
};

struct wlist {
    struct wspec *v;
    int n, cap;
};

static void wlist_free(struct wlist *l)
{
    for (int i = 0; i < l->n; i++)
        wfree(l->v[i].url);
    wfree(l->v);
    memset(l, 0, sizeof *l);
}

static int wlist_add(struct wlist *l, const char *flag, const char *url, enum worker_role role,
                     struct weld_err *e)
{
    char *u;
    int rc = url_norm(flag, url, &u, e);
    if (rc)
        return rc;
    for (int i = 0; i < l->n; i++)
        if (!strcmp(l->v[i].url, u) && l->v[i].role == role) {
            wfree(u); /* listed twice: once is enough */
            return WELD_OK;
        }
    if (l->n == l->cap) {
        int cap = l->cap ? l->cap * 2 : 8;
        struct wspec *nv = wrealloc(l->v, (size_t)cap * sizeof *nv);
        if (!nv) {
            wfree(u);
            return err_set(e, WELD_ERR_NOMEM, "out of memory");
        }
        l->v = nv;
        l->cap = cap;
    }
    l->v[l->n++] = (struct wspec){u, role};
    return WELD_OK;
}

/* The file's workers appended to l. */
static int read_file(const struct router *r, struct wlist *l, struct weld_err *e)
{
    const char *path = r->o.worker_file;
    FILE *f = fopen(path, "r");
    if (!f)
        return err_set(e, WELD_ERR_IO, "--worker-file %s: %s", path, strerror(errno));
    char *line = NULL;
    size_t cap = 0;
    int rc = WELD_OK, no = 0;
    while (!rc && getline(&line, &cap, f) >= 0) {
        no++;
        char *h = strchr(line, '#');
        if (h)
            *h = 0;
        char *tok[3];
        int nt = 0;
        for (char *save = NULL, *t = strtok_r(line, " \t\r\n", &save); t;
             t = strtok_r(NULL, " \t\r\n", &save))
            if (nt < 3)
                tok[nt++] = t;
            else
                nt = 4;
        if (!nt)
            continue;
        char flag[512];
        snprintf(flag, sizeof flag, "--worker-file %s:%d:", path, no);
        enum worker_role role = WORKER_ANY;
        const char *url = tok[0];
        if (r->o.pd) {
            if (nt != 2 || (strcmp(tok[0], "prefill") && strcmp(tok[0], "decode"))) {
                rc = err_set(e, WELD_ERR_FORMAT,
                             "%s expected 'prefill URL' or 'decode URL' "
                             "(P/D mode)",
                             flag);
                break;
            }
            role = !strcmp(tok[0], "prefill") ? WORKER_PREFILL : WORKER_DECODE;
            url = tok[1];
        } else if (nt != 1) {
            rc = err_set(e, WELD_ERR_FORMAT, "%s expected one URL a line", flag);
            break;
        }
        rc = wlist_add(l, flag, url, role, e);
    }
    if (!rc && ferror(f))
        rc = err_set(e, WELD_ERR_IO, "--worker-file %s: read error", path);
    free(line);
    fclose(f);
    return rc;
}

/* Every worker the flags and the file name now. */
static int wanted(const struct router *r, struct wlist *l, struct weld_err *e)
{
    int rc = WELD_OK;
    for (int i = 0; !rc && i < r->o.n_workers; i++)
        rc = wlist_add(l, "--worker", r->o.workers[i], WORKER_ANY, e);
    for (int i = 0; !rc && i < r->o.n_prefill; i++)
        rc = wlist_add(l, "--prefill", r->o.prefill[i], WORKER_PREFILL, e);
    for (int i = 0; !rc && i < r->o.n_decode; i++)
        rc = wlist_add(l, "--decode", r->o.decode[i], WORKER_DECODE, e);
    if (!rc && r->o.worker_file)
        rc = read_file(r, l, e);
    return rc;
}

/* ---- the table (mu held) ---------------------------------------------------------------- */

static int free_slot(const struct router *r)
{
    for (int s = 0;; s++) {
        bool used = false;
        for (int i = 0; i < r->n_w && !used; i++)
            used = r->w[i]->slot == s;
        if (!used)
            return s;
    }
}

static int table_add(struct router *r, const struct wspec *s)
{
    struct worker *w = wcalloc(1, sizeof *w);
    struct worker **nv = wrealloc(r->w, (size_t)(r->n_w + 1) * sizeof *nv);
    if (nv)
        r->w = nv;
    if (!w || !nv || !(w->url = wstrdup(s->url))) {
        wfree(w);
        return WELD_ERR_NOMEM;
    }
    w->role = s->role;
    w->slot = free_slot(r);
    w->refs = 1;
    w->listed = true;
    w->scraped = -1;
    r->w[r->n_w++] = w;
    return WELD_OK;
}

static void table_drop(struct router *r, int i)
{
    struct worker *w = r->w[i];
    w->listed = false;
    rtree_remove_worker(r->tree, w->slot);
    memmove(r->w + i, r->w + i + 1, (size_t)(r->n_w - i - 1) * sizeof *r->w);
    r->n_w--;
}

static bool in_list(const struct wlist *l, const struct worker *w)
{
    for (int i = 0; i < l->n; i++)
        if (!strcmp(l->v[i].url, w->url) && l->v[i].role == w->role)
            return true;
    return false;
}

/* ---- health checks and scrapes ---------------------------------------------------------- */

struct check {
    struct worker *w;
    CURL *h, *hm; /* /health, /metrics (NULL: not scraped) */
    char err[CURL_ERROR_SIZE];
    char *txt; /* /metrics body */
    size_t len;
    bool big;
    CURLcode cc, ccm;
    bool done, donem;
};

static size_t on_drop(char *p, size_t size, size_t nmemb, void *ud)
{
    (void)p, (void)ud;
    return size * nmemb;
}

static size_t on_scrape(char *p, size_t size, size_t nmemb, void *ud)
{
    struct check *k = ud;
    size_t n = size * nmemb;
    if (k->len + n > SCRAPE_MAX) {
        k->big = true;
        return 0;
    }
    char *nt = wrealloc(k->txt, k->len + n + 1);
    if (!nt)
        return 0;
    memcpy(nt + k->len, p, n);
    k->len += n;
    nt[k->len] = 0;
    k->txt = nt;
    return n;
}

static CURL *check_handle(struct router *r, const char *base, const char *path, void *wd,
                          curl_write_callback cb, char *err)
{
    CURL *h = curl_easy_init();
    char url[1024];
    snprintf(url, sizeof url, "%s%s", base, path);
    if (!h)
        return NULL;
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_HTTP_VERSION, (long)CURL_HTTP_VERSION_1_1);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, (long)fmax(1, fmin(r->o.health_timeout * 1e3, 2e9)));
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS,
                     (long)fmax(1, fmin(r->o.health_timeout * 1e3, 2e9)));
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, cb);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, wd);
    if (err)
        curl_easy_setopt(h, CURLOPT_ERRORBUFFER, err);
    return h;
}

/* Sum of the samples of metric `name` (any labels) in a Prometheus text; -1: absent. */
static double scrape_value(const char *txt, const char *name)
{
    double sum = -1;
    size_t nl = strlen(name);
    for (const char *p = txt; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL) {
        if (strncmp(p, name, nl) || (p[nl] != '{' && p[nl] != ' '))
            continue;
        const char *v = p + nl;
        if (*v == '{' && !(v = strchr(v, '}')))
            continue;
        char *end;
        double x = strtod(v + 1, &end);
        if (end == v + 1 || !isfinite(x))
            continue;
        sum = (sum < 0 ? 0 : sum) + x;
    }
    return sum;
}

static bool scrape_needed(const struct router *r)
{
    if (r->o.pd)
        return r->o.decode_policy == ROUTER_POLICY_LEAST_LOAD ||
               r->o.prefill_policy == ROUTER_POLICY_LEAST_LOAD;
    return r->o.policy == ROUTER_POLICY_LEAST_LOAD;
}

/* Apply one worker's results (mu held). */
static void check_apply(struct router *r, struct check *k, bool first)
{
    struct worker *w = k->w;
    long st = 0;
    if (k->h)
        curl_easy_getinfo(k->h, CURLINFO_RESPONSE_CODE, &st);
    bool ok = k->done && k->cc == CURLE_OK && st == 200;
    char why[256];
    if (k->done && k->cc == CURLE_OK)
        snprintf(why, sizeof why, "GET /health answered %ld", st);
    else
        snprintf(why, sizeof why, "GET /health: %s",
                 k->err[0] ? k->err
                           : curl_easy_strerror(k->done ? k->cc : CURLE_OPERATION_TIMEDOUT));
    if (k->hm && k->donem && k->ccm == CURLE_OK && k->txt) {
        double run = scrape_value(k->txt, "weld:num_requests_running");
        double wait = scrape_value(k->txt, "weld:num_requests_waiting");
        double kv = scrape_value(k->txt, "weld:kv_cache_usage_perc");
        if (run < 0)
            run = scrape_value(k->txt, "vllm:num_requests_running");
        if (wait < 0)
            wait = scrape_value(k->txt, "vllm:num_requests_waiting");
        if (kv < 0)
            kv = scrape_value(k->txt, "vllm:kv_cache_usage_perc");
        if (run >= 0) {
            w->scraped = run + (wait > 0 ? wait : 0);
            w->kv_usage = kv > 0 ? kv : 0;
            w->in_flight_at_scrape = w->in_flight;
        }
    } else if (k->hm) {
        w->scraped = -1;
    }
    if (!w->listed)
        return;
    if (ok) {
        if (!w->healthy)
            log_info("%s %s is healthy%s", role_name(w->role), w->url,
                     first ? "" : ": back in rotation");
        w->healthy = true;
        w->fails = 0;
        return;
    }
    w->fails++;
    if (first) {
        log_warn("%s %s is not healthy yet (%s); it joins once GET /health answers 200",
                 role_name(w->role), w->url, why);
        w->healthy = false;
    } else if (w->healthy && w->fails >= r->o.health_failures) {
        log_warn("%s %s taken out of rotation after %d failed checks (%s); it comes back "
                 "once GET /health answers 200",
                 role_name(w->role), w->url, w->fails, why);
        w->healthy = false;
    }
}

/* One round: check every listed worker at once. */
static void check_round(struct router *r, bool first)
{
    pthread_mutex_lock(&r->mu);
    int n = r->n_w;
    struct check *k = n ? wcalloc((size_t)n, sizeof *k) : NULL;
    for (int i = 0; k && i < n; i++) {
        k[i].w = r->w[i];
        __atomic_add_fetch(&k[i].w->refs, 1, __ATOMIC_ACQ_REL);
    }
    pthread_mutex_unlock(&r->mu);
    if (!k)
        return;
    bool scrape = scrape_needed(r);
    CURLM *m = curl_multi_init();
    for (int i = 0; m && i < n; i++) {
        k[i].h = check_handle(r, k[i].w->url, "/health", NULL, on_drop, k[i].err);
        if (k[i].h && curl_multi_add_handle(m, k[i].h) == CURLM_OK)
            curl_easy_setopt(k[i].h, CURLOPT_PRIVATE, &k[i]);
        if (scrape &&
            (k[i].hm = check_handle(r, k[i].w->url, "/metrics", &k[i], on_scrape, NULL)) &&
            curl_multi_add_handle(m, k[i].hm) == CURLM_OK)
            curl_easy_setopt(k[i].hm, CURLOPT_PRIVATE, &k[i]);
    }
    double t_end = time_now() + r->o.health_timeout + 0.5;
    int running = 1;
    while (m && running && time_now() < t_end) {
        curl_multi_perform(m, &running);
        CURLMsg *msg;
        int q;
        while ((msg = curl_multi_info_read(m, &q))) {
            if (msg->msg != CURLMSG_DONE)
                continue;
            struct check *c = NULL;
            curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, (char **)&c);
            if (!c)
                continue;
            if (msg->easy_handle == c->h)
                c->done = true, c->cc = msg->data.result;
            else
                c->donem = true, c->ccm = msg->data.result;
        }
        if (running)
            curl_multi_poll(m, NULL, 0, 100, NULL);
    }
    pthread_mutex_lock(&r->mu);
    for (int i = 0; i < n; i++)
        check_apply(r, &k[i], first);
    pthread_mutex_unlock(&r->mu);
    for (int i = 0; i < n; i++) {
        if (m && k[i].h)
            curl_multi_remove_handle(m, k[i].h);
        if (m && k[i].hm)
            curl_multi_remove_handle(m, k[i].hm);
        curl_easy_cleanup(k[i].h);
        curl_easy_cleanup(k[i].hm);
        wfree(k[i].txt);
        worker_unref(k[i].w);
    }
    if (m)
        curl_multi_cleanup(m);
    wfree(k);
}

static void *health_main(void *arg)
{
    struct router *r = arg;
    pthread_mutex_lock(&r->mu);
    while (!r->health_stop) {
        if (!r->health_kick) {
            struct timespec ts;
            clock_gettime(CLOCK_MONOTONIC, &ts);
            double t = ts.tv_sec + ts.tv_nsec * 1e-9 + r->o.health_interval;
            ts.tv_sec = (time_t)t;
            ts.tv_nsec = (long)((t - (double)ts.tv_sec) * 1e9);
            pthread_cond_timedwait(&r->health_cv, &r->mu, &ts);
        }
        if (r->health_stop)
            break;
        r->health_kick = false;
        pthread_mutex_unlock(&r->mu);
        check_round(r, false);
        pthread_mutex_lock(&r->mu);
    }
    pthread_mutex_unlock(&r->mu);
    return NULL;
}

int workers_health_start(struct router *r, struct weld_err *e)
{
    if (pthread_create(&r->health, NULL, health_main, r))
        return err_set(e, WELD_ERR_IO, "cannot start the health-check thread");
    r->health_started = true;
    return WELD_OK;
}

void workers_health_stop(struct router *r)
{
    if (!r->health_started)
        return;
    pthread_mutex_lock(&r->mu);
    r->health_stop = true;
    pthread_cond_signal(&r->health_cv);
    pthread_mutex_unlock(&r->mu);
    pthread_join(r->health, NULL);
    r->health_started = false;
}

/* ---- life ------------------------------------------------------------------------------- */

int workers_init(struct router *r, struct weld_err *e)
{
    struct wlist l = {0};
    int rc = wanted(r, &l, e);
    if (!rc && r->o.pd) {
        int np = 0, nd = 0;
        for (int i = 0; i < l.n; i++)
            np += l.v[i].role == WORKER_PREFILL, nd += l.v[i].role == WORKER_DECODE;
        if (!nd)
            rc = err_set(e, WELD_ERR_INVALID_ARG,
                         "P/D mode needs at least one decode worker: "
                         "--decode URL (repeatable) or 'decode URL' lines in --worker-file");
        else if (!np)
            log_warn("no prefill worker: every request goes to a decode worker whole (add "
                     "--prefill URL)");
    } else if (!rc && !l.n) {
        rc = err_set(e, WELD_ERR_INVALID_ARG,
                     "no workers: give --worker URL (repeatable, "
                     "e.g. --worker http://127.0.0.1:8001) or --worker-file FILE");
    }
    pthread_mutex_lock(&r->mu);
    for (int i = 0; !rc && i < l.n; i++)
        if (table_add(r, &l.v[i]))
            rc = err_set(e, WELD_ERR_NOMEM, "out of memory");
    pthread_mutex_unlock(&r->mu);
    wlist_free(&l);
    if (!rc)
        check_round(r, true);
    return rc;
}

void workers_reload(struct router *r)
{
    struct wlist l = {0};
    struct weld_err e = {0};
    if (wanted(r, &l, &e)) {
        log_error("SIGHUP: %s; the worker table stays as it was", e.msg);
        wlist_free(&l);
        return;
    }
    int added = 0, dropped = 0;
    pthread_mutex_lock(&r->mu);
    for (int i = r->n_w - 1; i >= 0; i--) {
        struct worker *w = r->w[i];
        if (in_list(&l, w))
            continue;
        log_info("SIGHUP: %s %s dropped (%d requests in flight finish on it)", role_name(w->role),
                 w->url, w->in_flight);
        table_drop(r, i);
        worker_unref(w);
        dropped++;
    }
    for (int i = 0; i < l.n; i++) {
        bool have = false;
        for (int j = 0; j < r->n_w && !have; j++)
            have = !strcmp(r->w[j]->url, l.v[i].url) && r->w[j]->role == l.v[i].role;
        if (have)
            continue;
        if (table_add(r, &l.v[i])) {
            log_error("SIGHUP: out of memory adding %s", l.v[i].url);
            continue;
        }
        log_info("SIGHUP: %s %s added; it joins once GET /health answers 200",
                 role_name(l.v[i].role), l.v[i].url);
        added++;
    }
    r->health_kick = true;
    pthread_cond_signal(&r->health_cv);
    int n = r->n_w;
    pthread_mutex_unlock(&r->mu);
    log_info("SIGHUP: re-read %s: %d workers (%d added, %d dropped)",
             r->o.worker_file ? r->o.worker_file : "(no --worker-file)", n, added, dropped);
    wlist_free(&l);
}

void workers_free(struct router *r)
{
    pthread_mutex_lock(&r->mu);
    while (r->n_w) {
        struct worker *w = r->w[r->n_w - 1];
        table_drop(r, r->n_w - 1);
        worker_unref(w);
    }
    pthread_mutex_unlock(&r->mu);
    wfree(r->w);
    r->w = NULL;
}

/* ---- the pick --------------------------------------------------------------------------- */

static bool role_fits(enum worker_role want, enum worker_role have)
{
    return want == WORKER_ANY ? have == WORKER_ANY : have == want;
}

int workers_healthy(struct router *r, enum worker_role role)
{
    pthread_mutex_lock(&r->mu);
    int n = 0;
    for (int i = 0; i < r->n_w; i++)
        n += r->w[i]->healthy && role_fits(role, r->w[i]->role);
    pthread_mutex_unlock(&r->mu);
    return n;
}

struct worker *workers_pick(struct router *r, enum worker_role role, enum router_policy pol,
                            const char *text, size_t len, struct worker *const *ex, int n_ex)
{
    pthread_mutex_lock(&r->mu);
    int n_slots = 0;
    for (int i = 0; i < r->n_w; i++)
        n_slots = r->w[i]->slot + 1 > n_slots ? r->w[i]->slot + 1 : n_slots;
    struct worker **cw = wmalloc((size_t)(r->n_w + 1) * sizeof *cw);
    struct policy_cand *c = wcalloc((size_t)r->n_w + 1, sizeof *c);
    size_t *match = wcalloc((size_t)n_slots + 1, sizeof *match);
    struct worker *w = NULL;
    int n = 0;
    for (int i = 0; cw && c && i < r->n_w; i++) {
        struct worker *x = r->w[i];
        bool tried = false;
        for (int j = 0; j < n_ex && !tried; j++)
            tried = ex[j] == x;
        if (x->healthy && role_fits(role, x->role) && !tried)
            cw[n++] = x;
    }
    if (!n || !match)
        goto done;
    bool cache = pol == ROUTER_POLICY_CACHE_AWARE && text;
    if (cache)
        rtree_match(r->tree, text, len, match, n_slots);
    for (int i = 0; i < n; i++) {
        struct worker *x = cw[i];
        c[i].load = x->in_flight;
        if (pol == ROUTER_POLICY_LEAST_LOAD && x->scraped >= 0) {
            double est = x->scraped + (x->in_flight - x->in_flight_at_scrape);
            c[i].load = est > x->in_flight ? est : x->in_flight;
            c[i].kv_usage = x->kv_usage;
        }
        c[i].match = match[x->slot];
        c[i].tree_chars = rtree_chars(r->tree, x->slot);
    }
    int k;
    if (pol == ROUTER_POLICY_ROUND_ROBIN || (pol == ROUTER_POLICY_CACHE_AWARE && !cache)) {
        k = policy_round_robin(n, &r->rr);
    } else if (pol == ROUTER_POLICY_LEAST_LOAD) {
        k = policy_least_load(c, n, &r->rr);
    } else {
        enum policy_reason why;
        k = policy_cache_aware(c, n, len, &r->pp, &why);
        r->m.decisions[why]++;
        r->m.match_chars += c[k].match;
        r->m.text_chars += len;
        prom_hist_observe(&r->m.match, (double)c[k].match);
        if (rtree_insert(r->tree, text, len, cw[k]->slot, time_now()) == WELD_OK)
            rtree_evict(r->tree, cw[k]->slot, r->o.max_tree_size);
    }
    w = cw[k];
    w->in_flight++;
    w->n_requests++;
    __atomic_add_fetch(&w->refs, 1, __ATOMIC_ACQ_REL);
done:
    pthread_mutex_unlock(&r->mu);
    wfree(cw);
    wfree(c);
    wfree(match);
    return w;
}

void workers_done(struct router *r, struct worker *w, enum attempt_end how, const char *why)
{
    pthread_mutex_lock(&r->mu);
    w->in_flight--;
    if (how == ATTEMPT_FAILED || how == ATTEMPT_DOWN)
        w->n_failures++;
    if (how == ATTEMPT_DOWN && w->healthy && w->listed) {
        w->healthy = false;
        w->fails = r->o.health_failures;
        log_warn("%s %s taken out of rotation: %s; it comes back once GET /health answers 200",
                 role_name(w->role), w->url, why ? why : "it cannot be reached");
    }
    pthread_mutex_unlock(&r->mu);
    worker_unref(w);
}
