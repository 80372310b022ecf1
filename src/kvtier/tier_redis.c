/*
 * tier_redis - the shared store: entries as Redis strings, through hiredis.
 *
 * URL: redis://[:PASSWORD@]HOST[:PORT][/DB] (port 6379, db 0 by default) or
 * unix:///PATH[?db=DB]. Key: "weld:kv:<fingerprint hex>:<key hex>", value: the whole entry.
 * Two connections, one per thread that uses the store: `rd` for the engine's reads (a run
 * is one pipeline of GETs, so a run of n blocks costs one round trip, not n) and drops,
 * `wr` for the writer thread (EXISTS, then SET when missing, so an entry already stored by
 * any worker is not sent again). A connection that fails is freed and made again on its
 * next use (then at once when it had worked: a restarted server), else after a back-off of
 * 1 s doubling to 30 s; meanwhile a use counts as an error (a miss or a dropped write).
 * Connecting times out after 2 s and every command after 5 s, so a hung server cannot hang
 * the engine for longer. hiredis writes to its socket with write(), which raises SIGPIPE when the
 * server has gone: every use blocks SIGPIPE on its thread and consumes one it raised, so a
 * store that dies never kills the process (the library leaves the signal's disposition
 * alone).
 */
#include "core/alloc.h"
#include "core/progress.h"
#include "kvtier/tier.h"

#include <hiredis/hiredis.h>
#include <pthread.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define RUN_MAX 64

struct tredis {
    char host[256], path[512], password[256];
    int port, db;
    bool unix_sock;
    char url[512];
    uint8_t fp[16];
    size_t entry_bytes;
    redisContext *rd, *wr;
    double t_rd, t_wr;       /* last connection attempt */
    double wait_rd, wait_wr; /* seconds before the next attempt after a failed one */
};

/* Block SIGPIPE on this thread for a use of the store; pipe_end consumes one raised
   meanwhile (and not one that was pending before) and restores the mask. */
struct pipe_guard {
    sigset_t old;
    bool was_pending;
};

static void pipe_begin(struct pipe_guard *g)
{
    sigset_t set, pend;
    sigemptyset(&set);
    sigaddset(&set, SIGPIPE);
    sigpending(&pend);
    g->was_pending = sigismember(&pend, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &set, &g->old);
}

static void pipe_end(struct pipe_guard *g)
{
    sigset_t set, pend;
    sigemptyset(&set);
    sigaddset(&set, SIGPIPE);
    sigpending(&pend);
    if (!g->was_pending && sigismember(&pend, SIGPIPE)) {
        struct timespec zero = {0, 0};
        while (sigtimedwait(&set, NULL, &zero) < 0 && errno == EINTR) {
        }
    }
    pthread_sigmask(SIG_SETMASK, &g->old, NULL);
}

static redisContext *connect_one(struct tredis *r, char *why, size_t cap)
{
    struct timeval tv = {2, 0}, cmd = {5, 0};
    redisContext *c = r->unix_sock ? redisConnectUnixWithTimeout(r->path, tv)
                                   : redisConnectWithTimeout(r->host, r->port, tv);
    if (!c) {
        snprintf(why, cap, "out of memory");
        return NULL;
    }
    if (c->err) {
        snprintf(why, cap, "%s", c->errstr);
        redisFree(c);
        return NULL;
    }
    redisSetTimeout(c, cmd);
    if (r->password[0]) {
        redisReply *y = redisCommand(c, "AUTH %s", r->password);
        bool ok = y && y->type != REDIS_REPLY_ERROR;
        if (y)
            freeReplyObject(y);
        if (!ok) {
            snprintf(why, cap, "AUTH was refused");
            redisFree(c);
            return NULL;
        }
    }
    if (r->db) {
        redisReply *y = redisCommand(c, "SELECT %d", r->db);
        bool ok = y && y->type != REDIS_REPLY_ERROR;
        if (y)
            freeReplyObject(y);
        if (!ok) {
            snprintf(why, cap, "SELECT %d was refused", r->db);
            redisFree(c);
            return NULL;
        }
    }
    return c;
}

/* The connection in *slot, made again if it failed: a failed attempt waits 1 s before the
   next, doubling up to 30 s while they keep failing (a server that does not answer costs
   the engine one connect timeout per wait, not per step). */
static redisContext *conn(struct tredis *r, redisContext **slot, double *t_last, double *wait)
{
    if (*slot && (*slot)->err) {
        redisFree(*slot);
        *slot = NULL;
    }
    if (!*slot) {
        double now = time_now();
        if (now - *t_last < *wait)
            return NULL;
        *t_last = now;
        char why[256];
        *slot = connect_one(r, why, sizeof why);
        *wait = *slot ? 0 : *wait < 1 ? 1 : *wait * 2 > 30 ? 30 : *wait * 2;
    }
    return *slot;
}

static int key_name(const struct tredis *r, struct kvtier_key k, char *buf, size_t cap)
{
    char f[33], h[33];
    uint8_t kb[16];
    tier_hex16(f, r->fp);
    tier_key_bytes(kb, k);
    tier_hex16(h, kb);
    return snprintf(buf, cap, "weld:kv:%s:%s", f, h);
}

static int r_get_run_raw(void *b, const struct kvtier_key *keys, int n, uint8_t *entries, int *bad,
                         bool *error)
{
    struct tredis *r = b;
    *bad = -1;
    redisContext *c = conn(r, &r->rd, &r->t_rd, &r->wait_rd);
    if (!c) {
        *error = true;
        return 0;
    }
    if (n > RUN_MAX)
        n = RUN_MAX;
    for (int i = 0; i < n; i++) {
        char name[128];
        int len = key_name(r, keys[i], name, sizeof name);
        redisAppendCommand(c, "GET %b", name, (size_t)len);
    }
    int got = 0;
    bool run = true;
    for (int i = 0; i < n; i++) {
        void *v = NULL;
        if (redisGetReply(c, &v) != REDIS_OK || !v) {
            *error = true;
            return got; /* the connection is marked failed and made again next time */
        }
        redisReply *y = v;
        if (run) {
            if (y->type == REDIS_REPLY_STRING && (size_t)y->len == r->entry_bytes) {
                memcpy(entries + (size_t)got * r->entry_bytes, y->str, r->entry_bytes);
                got++;
            } else {
                run = false;
                if (y->type == REDIS_REPLY_STRING)
                    *bad = got;
                else if (y->type == REDIS_REPLY_ERROR)
                    *error = true;
            }
        }
        freeReplyObject(y);
    }
    return got;
}

static int r_put_raw(void *b, struct kvtier_key key, const uint8_t *entry)
{
    struct tredis *r = b;
    redisContext *c = conn(r, &r->wr, &r->t_wr, &r->wait_wr);
    if (!c)
        return -1;
    char name[128];
    int len = key_name(r, key, name, sizeof name);
    redisReply *y = redisCommand(c, "EXISTS %b", name, (size_t)len);
    if (!y)
        return -1;
    bool there = y->type == REDIS_REPLY_INTEGER && y->integer > 0;
    freeReplyObject(y);
    if (there)
        return 0;
    y = redisCommand(c, "SET %b %b", name, (size_t)len, entry, r->entry_bytes);
    if (!y)
        return -1;
    bool ok = y->type == REDIS_REPLY_STATUS;
    freeReplyObject(y);
    return ok ? 1 : -1;
}

static void r_drop_raw(void *b, struct kvtier_key key)
{
    struct tredis *r = b;
    redisContext *c = conn(r, &r->rd, &r->t_rd, &r->wait_rd);
    if (!c)
        return;
    char name[128];
    int len = key_name(r, key, name, sizeof name);
    redisReply *y = redisCommand(c, "DEL %b", name, (size_t)len);
    if (y)
        freeReplyObject(y);
}

/* A connection that worked before may have been cut (a restarted server): the first
   failure on it makes it again at once and tries once more. */
static int r_get_run(void *b, const struct kvtier_key *keys, int n, uint8_t *entries, int *bad,
                     bool *error)
{
    struct tredis *r = b;
    struct pipe_guard g;
    pipe_begin(&g);
    bool had = r->rd != NULL;
    int rc = r_get_run_raw(b, keys, n, entries, bad, error);
    if (*error && had && rc == 0 && *bad < 0) {
        r->t_rd = 0;
        r->wait_rd = 0;
        *error = false;
        rc = r_get_run_raw(b, keys, n, entries, bad, error);
    }
    pipe_end(&g);
    return rc;
}

static int r_put(void *b, struct kvtier_key key, const uint8_t *entry)
{
    struct tredis *r = b;
    struct pipe_guard g;
    pipe_begin(&g);
    bool had = r->wr != NULL;
    int rc = r_put_raw(b, key, entry);
    if (rc < 0 && had) {
        r->t_wr = 0;
        r->wait_wr = 0;
        rc = r_put_raw(b, key, entry);
    }
    pipe_end(&g);
    return rc;
}

static void r_drop(void *b, struct kvtier_key key)
{
    struct pipe_guard g;
    pipe_begin(&g);
    r_drop_raw(b, key);
    pipe_end(&g);
}

static void r_stats(void *b, struct kvtier_tier_stats *st)
{
    (void)b;
    (void)st;
}

static void r_describe(void *b, char *buf, size_t cap)
{
    struct tredis *r = b;
    snprintf(buf, cap, "store %s", r->url);
}

static void r_close(void *b)
{
    struct tredis *r = b;
    if (r->rd)
        redisFree(r->rd);
    if (r->wr)
        redisFree(r->wr);
    wfree(r);
}

static const struct tier_ops redis_ops = {r_get_run, r_put, r_drop, r_stats, r_describe, r_close};

/* Parse the URL into r; a message in why on failure. */
static bool parse_url(struct tredis *r, const char *url, char *why, size_t cap)
{
    r->port = 6379;
    if (!strncmp(url, "unix://", 7)) {
        const char *p = url + 7, *q = strchr(p, '?');
        size_t n = q ? (size_t)(q - p) : strlen(p);
        if (n == 0 || n >= sizeof r->path) {
            snprintf(why, cap, "expected unix:///PATH[?db=N]");
            return false;
        }
        memcpy(r->path, p, n);
        r->path[n] = 0;
        r->unix_sock = true;
        if (q) {
            char *end;
            if (strncmp(q, "?db=", 4) || (r->db = (int)strtol(q + 4, &end, 10)) < 0 || *end) {
                snprintf(why, cap, "expected ?db=N after the path");
                return false;
            }
        }
        return true;
    }
    if (strncmp(url, "redis://", 8)) {
        snprintf(why, cap, "expected redis://HOST[:PORT][/DB] or unix:///PATH");
        return false;
    }
    const char *p = url + 8, *at = strrchr(p, '@');
    if (at) {
        const char *colon = memchr(p, ':', (size_t)(at - p));
        const char *pw = colon ? colon + 1 : p;
        size_t n = (size_t)(at - pw);
        if (n >= sizeof r->password) {
            snprintf(why, cap, "password too long");
            return false;
        }
        memcpy(r->password, pw, n);
        r->password[n] = 0;
        p = at + 1;
    }
    const char *slash = strchr(p, '/');
    const char *colon = strchr(p, ':');
    if (colon && slash && colon > slash)
        colon = NULL;
    size_t hn = colon ? (size_t)(colon - p) : slash ? (size_t)(slash - p) : strlen(p);
    if (hn == 0 || hn >= sizeof r->host) {
        snprintf(why, cap, "no host");
        return false;
    }
    memcpy(r->host, p, hn);
    r->host[hn] = 0;
    char *end;
    if (colon) {
        long port = strtol(colon + 1, &end, 10);
        if (port < 1 || port > 65535 || (*end && *end != '/')) {
            snprintf(why, cap, "bad port");
            return false;
        }
        r->port = (int)port;
    }
    if (slash && slash[1]) {
        long db = strtol(slash + 1, &end, 10);
        if (db < 0 || db > 1000000 || *end) {
            snprintf(why, cap, "bad database number");
            return false;
        }
        r->db = (int)db;
    }
    return true;
}

int tier_redis_open(void **b, const struct tier_ops **ops, const char *url,
                    const uint8_t fingerprint[16], size_t entry_bytes, struct weld_err *e)
{
    *b = NULL;
    struct tredis *r = wcalloc(1, sizeof *r);
    if (!r)
        return err_set(e, WELD_ERR_NOMEM, "--kv-store: out of memory");
    char why[256];
    if (!parse_url(r, url, why, sizeof why)) {
        wfree(r);
        return err_set(e, WELD_ERR_INVALID_ARG, "--kv-store '%s': %s", url, why);
    }
    snprintf(r->url, sizeof r->url, "%s", url);
    char *pw = strchr(r->url + 8, '@'); /* never print a password */
    if (pw && !r->unix_sock)
        memmove(r->url + 8, pw + 1, strlen(pw + 1) + 1);
    memcpy(r->fp, fingerprint, 16);
    r->entry_bytes = entry_bytes;
    r->rd = connect_one(r, why, sizeof why);
    if (r->rd)
        r->wr = connect_one(r, why, sizeof why);
    if (!r->rd || !r->wr) {
        int rc = err_set(e, WELD_ERR_IO,
                         "--kv-store %s: cannot connect: %s (is redis-server "
                         "running there?)",
                         r->url, why);
        r_close(r);
        return rc;
    }
    redisReply *y = redisCommand(r->rd, "PING");
    bool ok = y && y->type != REDIS_REPLY_ERROR;
    if (y)
        freeReplyObject(y);
    if (!ok) {
        int rc = err_set(e, WELD_ERR_IO, "--kv-store %s: PING failed", r->url);
        r_close(r);
        return rc;
    }
    *b = r;
    *ops = &redis_ops;
    return WELD_OK;
}
