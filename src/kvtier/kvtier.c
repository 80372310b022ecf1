/*
 * kvtier - entries, the tier chain and the writer thread (design in kvtier.h).
 *
 * Header (little-endian, 64 bytes): "WELDKV01", fingerprint[16], key lo, key hi, payload
 * bytes, XXH3-64 of the payload, XXH3-64 of the 56 bytes before it. A reader checks all of
 * them against what it asked for before it copies a payload out.
 *
 * Queue: a singly linked FIFO of whole entries (header + payload, one allocation each)
 * under mu, bounded by queue_bytes; the writer takes one at a time, writes it to each
 * tier, frees it and bumps `written`; kvtier_flush waits until `written` reaches the
 * sequence number the queue had when it was called.
 */
#include "kvtier/kvtier.h"

#include "core/alloc.h"
#include "core/log.h"
#include "core/progress.h"
#include "kvtier/tier.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

/* Items a writer keeps for the next puts: a fresh allocation of an entry's size comes from
   pages the allocator has just given back (a fault and a zeroed page every 4 KiB, on the
   engine's thread), a reused one does not. */
#define SPARE_MAX 64

static const char MAGIC[8] = {'W', 'E', 'L', 'D', 'K', 'V', '0', '1'};

struct qitem {
    struct qitem *next;
    struct kvtier_key key;
    uint8_t entry[]; /* entry_bytes */
};

struct kvtier {
    struct kvtier_config c;
    size_t entry_bytes;
    void *b[KVTIER_N];
    const struct tier_ops *ops[KVTIER_N];
    uint8_t *scratch;   /* one entry, for get_run (engine thread) */
    size_t scratch_n;   /* entries scratch holds */
    pthread_mutex_t mu; /* everything below */
    pthread_cond_t cv;  /* queue changed / written moved */
    struct qitem *head, *tail;
    struct qitem *spare; /* written items kept for reuse (at most SPARE_MAX) */
    int n_spare;
    size_t queued;
    uint64_t enqueued, written; /* entries ever queued / done */
    bool quit, thread_on;
    pthread_t writer;
    struct kvtier_stats st;
    double t_warned[KVTIER_N];
};

const char *kvtier_name(enum kvtier_which w)
{
    return w == KVTIER_FILE ? "file" : "store";
}

void tier_hex16(char *out, const uint8_t b[16])
{
    static const char hx[] = "0123456789abcdef";
    for (int i = 0; i < 16; i++) {
        out[2 * i] = hx[b[i] >> 4];
        out[2 * i + 1] = hx[b[i] & 15];
    }
    out[32] = 0;
}

void tier_key_bytes(uint8_t out[16], struct kvtier_key k)
{
    memcpy(out, &k.hi, 8);
    memcpy(out + 8, &k.lo, 8);
}

void kvtier_entry_name(char *buf, size_t cap, const uint8_t fingerprint[16], struct kvtier_key key)
{
    char f[33], k[33];
    uint8_t kb[16];
    tier_hex16(f, fingerprint);
    tier_key_bytes(kb, key);
    tier_hex16(k, kb);
    snprintf(buf, cap, "%s/%s.kvb", f, k);
}

void kvtier_header_make(uint8_t hdr[KVTIER_HEADER_BYTES], const uint8_t fingerprint[16],
                        struct kvtier_key key, const void *payload, size_t payload_bytes)
{
    uint64_t n = payload_bytes, sum = XXH3_64bits(payload, payload_bytes);
    memcpy(hdr, MAGIC, 8);
    memcpy(hdr + 8, fingerprint, 16);
    memcpy(hdr + 24, &key.lo, 8);
    memcpy(hdr + 32, &key.hi, 8);
    memcpy(hdr + 40, &n, 8);
    memcpy(hdr + 48, &sum, 8);
    uint64_t hs = XXH3_64bits(hdr, 56);
    memcpy(hdr + 56, &hs, 8);
}

/* True when entry is a valid one for this engine and key. */
static bool entry_ok(const struct kvtier *t, const uint8_t *entry, struct kvtier_key key)
{
    uint64_t lo, hi, n, sum, hs;
    memcpy(&lo, entry + 24, 8);
    memcpy(&hi, entry + 32, 8);
    memcpy(&n, entry + 40, 8);
    memcpy(&sum, entry + 48, 8);
    memcpy(&hs, entry + 56, 8);
    return !memcmp(entry, MAGIC, 8) && !memcmp(entry + 8, t->c.fingerprint, 16) &&
           hs == XXH3_64bits(entry, 56) && lo == key.lo && hi == key.hi && n == t->c.block_bytes &&
           sum == XXH3_64bits(entry + KVTIER_HEADER_BYTES, t->c.block_bytes);
}

static void warn_io(struct kvtier *t, int w, const char *what)
{
    double now = time_now();
    pthread_mutex_lock(&t->mu);
    t->st.t[w].errors++;
    bool say = now - t->t_warned[w] >= 10.0;
    if (say)
        t->t_warned[w] = now;
    pthread_mutex_unlock(&t->mu);
    if (say)
        log_warn("kv tier %s: %s failed (counted in weld:kv_tier_errors_total; reads miss, "
                 "writes are dropped until it works again)",
                 kvtier_name(w), what);
}

static void *writer_main(void *arg)
{
    struct kvtier *t = arg;
    /* Lowering one's own priority needs no privilege; on Linux it applies to this thread. */
    if (t->c.writer_nice > 0 &&
        setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), t->c.writer_nice) != 0)
        log_warn("kv tier: cannot lower the writer thread's priority (nice %d): %s",
                 t->c.writer_nice, strerror(errno));
    pthread_mutex_lock(&t->mu);
    for (;;) {
        while (!t->head && !t->quit)
            pthread_cond_wait(&t->cv, &t->mu);
        struct qitem *q = t->head;
        if (!q)
            break; /* quit with nothing left */
        pthread_mutex_unlock(&t->mu);
        int rc[KVTIER_N];
        for (int w = 0; w < KVTIER_N; w++)
            rc[w] = t->b[w] ? t->ops[w]->put(t->b[w], q->key, q->entry) : 0;
        for (int w = 0; w < KVTIER_N; w++)
            if (rc[w] < 0)
                warn_io(t, w, "a write");
        pthread_mutex_lock(&t->mu);
        for (int w = 0; w < KVTIER_N; w++) {
            t->st.t[w].puts += rc[w] == 1;
            t->st.t[w].present += rc[w] == 0 && t->b[w];
            t->st.t[w].bytes_written += rc[w] == 1 ? t->entry_bytes : 0;
        }
        t->head = q->next;
        if (!t->head)
            t->tail = NULL;
        t->queued -= t->entry_bytes;
        t->written++;
        pthread_cond_broadcast(&t->cv);
        if (t->n_spare < SPARE_MAX) {
            q->next = t->spare;
            t->spare = q;
            t->n_spare++;
        } else {
            wfree(q);
        }
    }
    pthread_mutex_unlock(&t->mu);
    return NULL;
}

int kvtier_open(struct kvtier **out, const struct kvtier_config *c, struct weld_err *e)
{
    *out = NULL;
    if (!c->dir && !c->store_url)
        return err_set(e, WELD_ERR_INVALID_ARG, "KV tier: no tier configured");
    if (c->block_bytes == 0)
        return err_set(e, WELD_ERR_INVALID_ARG, "KV tier: block size of 0 bytes");
    struct kvtier *t = wcalloc(1, sizeof *t);
    if (!t)
        return err_set(e, WELD_ERR_NOMEM, "KV tier: out of memory");
    t->c = *c;
    t->c.dir = NULL;
    t->c.store_url = NULL;
    if (!t->c.dir_max_bytes)
        t->c.dir_max_bytes = KVTIER_DEFAULT_DIR_BYTES;
    if (!t->c.queue_bytes)
        t->c.queue_bytes = KVTIER_DEFAULT_QUEUE_BYTES;
    t->entry_bytes = KVTIER_HEADER_BYTES + c->block_bytes;
    pthread_mutex_init(&t->mu, NULL);
    pthread_cond_init(&t->cv, NULL);
    int rc = WELD_OK;
    if (c->dir)
        rc = tier_file_open(&t->b[KVTIER_FILE], &t->ops[KVTIER_FILE], c->dir, t->c.dir_max_bytes,
                            c->fingerprint, t->entry_bytes, e);
    if (!rc && c->store_url)
        rc = tier_redis_open(&t->b[KVTIER_STORE], &t->ops[KVTIER_STORE], c->store_url,
                             c->fingerprint, t->entry_bytes, e);
    if (!rc) {
        t->scratch_n = 8;
        t->scratch = wmalloc(t->scratch_n * t->entry_bytes);
        if (!t->scratch)
            rc = err_set(e, WELD_ERR_NOMEM,
                         "KV tier: out of memory for a read buffer of %zu "
                         "bytes",
                         t->scratch_n * t->entry_bytes);
    }
    if (!rc) {
        if (pthread_create(&t->writer, NULL, writer_main, t))
            rc = err_set(e, WELD_ERR_IO, "KV tier: cannot start the writer thread");
        else
            t->thread_on = true;
    }
    if (rc) {
        kvtier_close(t);
        return rc;
    }
    for (int w = 0; w < KVTIER_N; w++)
        t->st.t[w].on = t->b[w] != NULL;
    *out = t;
    return WELD_OK;
}

void kvtier_close(struct kvtier *t)
{
    if (!t)
        return;
    if (t->thread_on) {
        pthread_mutex_lock(&t->mu);
        t->quit = true;
        pthread_cond_broadcast(&t->cv);
        pthread_mutex_unlock(&t->mu);
        pthread_join(t->writer, NULL);
    }
    for (int w = 0; w < KVTIER_N; w++)
        if (t->b[w])
            t->ops[w]->close(t->b[w]);
    struct qitem *lists[2] = {t->head, t->spare};
    for (int k = 0; k < 2; k++)
        for (struct qitem *q = lists[k], *next; q; q = next) {
            next = q->next;
            wfree(q);
        }
    pthread_cond_destroy(&t->cv);
    pthread_mutex_destroy(&t->mu);
    wfree(t->scratch);
    wfree(t);
}

int kvtier_get_run(struct kvtier *t, const struct kvtier_key *keys, int n, void *dst)
{
    int done = 0, missed_at[KVTIER_N];
    const size_t bb = t->c.block_bytes;
    for (int w = 0; w < KVTIER_N; w++)
        missed_at[w] = -1;
    while (done < n) {
        /* a block still waiting for the writer is read from the queue (the writer frees an
           item only under mu, after it is unlinked) */
        pthread_mutex_lock(&t->mu);
        const struct qitem *q = t->head;
        while (q && (q->key.lo != keys[done].lo || q->key.hi != keys[done].hi))
            q = q->next;
        if (q) {
            memcpy((uint8_t *)dst + (size_t)done * bb, q->entry + KVTIER_HEADER_BYTES, bb);
            t->st.queue_hits++;
        }
        pthread_mutex_unlock(&t->mu);
        if (q) {
            done++;
            continue;
        }
        /* each block from the first tier that has it: a run in one tier, then the rest */
        int best = 0;
        for (int w = 0; w < KVTIER_N && best == 0; w++) {
            if (!t->b[w] || missed_at[w] == done)
                continue;
            int want = n - done < (int)t->scratch_n ? n - done : (int)t->scratch_n, bad = -1;
            bool error = false;
            double t0 = time_now();
            int got = t->ops[w]->get_run(t->b[w], keys + done, want, t->scratch, &bad, &error);
            double dt = time_now() - t0;
            if (error)
                warn_io(t, w, "a read");
            int ok = 0;
            while (ok < got &&
                   entry_ok(t, t->scratch + (size_t)ok * t->entry_bytes, keys[done + ok])) {
                memcpy((uint8_t *)dst + (size_t)(done + ok) * bb,
                       t->scratch + (size_t)ok * t->entry_bytes + KVTIER_HEADER_BYTES, bb);
                ok++;
            }
            int rejected = ok < got ? ok : bad;
            if (rejected >= 0)
                t->ops[w]->drop(t->b[w], keys[done + rejected]);
            pthread_mutex_lock(&t->mu);
            t->st.t[w].hits += (uint64_t)ok;
            t->st.t[w].misses += ok < want;
            t->st.t[w].rejects += rejected >= 0;
            t->st.t[w].bytes_read += (uint64_t)ok * t->entry_bytes;
            if (ok)
                t->st.t[w].read_seconds += dt;
            pthread_mutex_unlock(&t->mu);
            if (ok < want)
                missed_at[w] = done + ok;
            best = ok;
        }
        if (best == 0)
            break;
        done += best;
    }
    return done;
}

int kvtier_put(struct kvtier *t, const struct kvtier_key *keys, int n, const void *src, bool wait)
{
    const size_t bb = t->c.block_bytes;
    int queued = 0;
    for (int i = 0; i < n; i++) {
        pthread_mutex_lock(&t->mu);
        while (wait && t->queued > 0 && t->queued + t->entry_bytes > t->c.queue_bytes)
            pthread_cond_wait(&t->cv, &t->mu);
        bool room = t->queued == 0 || t->queued + t->entry_bytes <= t->c.queue_bytes;
        if (!room)
            t->st.dropped += (uint64_t)(n - i);
        struct qitem *q = room ? t->spare : NULL;
        if (q) {
            t->spare = q->next;
            t->n_spare--;
        }
        pthread_mutex_unlock(&t->mu);
        if (!room)
            break;
        if (!q)
            q = wmalloc(sizeof *q + t->entry_bytes);
        if (!q) {
            pthread_mutex_lock(&t->mu);
            t->st.dropped += (uint64_t)(n - i);
            pthread_mutex_unlock(&t->mu);
            break;
        }
        const uint8_t *p = (const uint8_t *)src + (size_t)i * bb;
        q->next = NULL;
        q->key = keys[i];
        kvtier_header_make(q->entry, t->c.fingerprint, keys[i], p, bb);
        memcpy(q->entry + KVTIER_HEADER_BYTES, p, bb);
        pthread_mutex_lock(&t->mu);
        if (t->tail)
            t->tail->next = q;
        else
            t->head = q;
        t->tail = q;
        t->queued += t->entry_bytes;
        t->enqueued++;
        pthread_cond_broadcast(&t->cv);
        pthread_mutex_unlock(&t->mu);
        queued++;
    }
    return queued;
}

void kvtier_flush(struct kvtier *t)
{
    pthread_mutex_lock(&t->mu);
    uint64_t want = t->enqueued;
    while (t->written < want)
        pthread_cond_wait(&t->cv, &t->mu);
    pthread_mutex_unlock(&t->mu);
}

uint64_t kvtier_ticket(struct kvtier *t)
{
    pthread_mutex_lock(&t->mu);
    uint64_t v = t->enqueued;
    pthread_mutex_unlock(&t->mu);
    return v;
}

void kvtier_wait_ticket(struct kvtier *t, uint64_t ticket)
{
    pthread_mutex_lock(&t->mu);
    while (t->written < ticket)
        pthread_cond_wait(&t->cv, &t->mu);
    pthread_mutex_unlock(&t->mu);
}

void kvtier_stats_get(struct kvtier *t, struct kvtier_stats *st)
{
    pthread_mutex_lock(&t->mu);
    *st = t->st;
    st->queued_bytes = t->queued;
    pthread_mutex_unlock(&t->mu);
    for (int w = 0; w < KVTIER_N; w++)
        if (t->b[w])
            t->ops[w]->stats(t->b[w], &st->t[w]);
}

void kvtier_describe(struct kvtier *t, char *buf, size_t cap)
{
    size_t at = 0;
    buf[0] = 0;
    for (int w = 0; w < KVTIER_N; w++) {
        if (!t->b[w] || at >= cap)
            continue;
        if (at) {
            at += (size_t)snprintf(buf + at, cap - at, ", ");
            if (at >= cap)
                break;
        }
        t->ops[w]->describe(t->b[w], buf + at, cap - at);
        at += strlen(buf + at);
    }
}
