/*
 * offload - the engine's side of the KV tier (design in offload.h).
 *
 * Reads: offload_lookup queues the run in a slot for the prefetch thread (which alone calls
 * kvtier_get_run) and answers -1 until it is read; the lookup that finds the slot ready
 * takes its buffer as the tentative blocks (tent), offload_place turns them into a chunk
 * with their pool blocks, and offload_apply copies the chunks in and frees them. Slots and
 * quit are under mu; tent and chunks belong to the engine's thread.
 */
#include "engine/offload.h"

#include "core/alloc.h"
#include "core/log.h"
#include "core/progress.h"

#include <pthread.h>
#include <string.h>
#include <time.h>

#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

#define SAVE_CHUNK 64
#define PROBE_EVERY 32
#define PREFETCH_SLOTS 8
#define PREFETCH_KEEP_S 2.0
#define PREFETCH_WAIT_S 0.003 /* the first in line waits this long before the step goes on */

/* A read the prefetch thread does for one lookup: keys[0, n) into buf, got of them found. */
struct pslot {
    int state;               /* SLOT_* */
    struct kvtier_key *keys; /* (n) */
    int n, got;
    uint8_t *buf;          /* (n) blocks */
    double t_read, t_done; /* seconds reading; time_now when done */
};
enum { SLOT_EMPTY = 0, SLOT_QUEUED, SLOT_RUNNING, SLOT_READY };

/* Blocks read for a lookup and placed: buf's n blocks go to dst before the next step. */
struct chunk {
    uint8_t *buf;
    int32_t *dst;
    int n;
};

struct offload {
    struct kvtier *tier;
    struct runner *run;
    size_t bb; /* bytes of one block */
    int block_size;
    int max_blocks;       /* per lookup */
    struct chunk *chunks; /* (cap_chunks) placed, waiting for offload_apply */
    int n_chunks, cap_chunks;
    uint8_t *tent; /* the last lookup's blocks, waiting for offload_place */
    int n_tent;
    uint8_t *save_buf; /* (SAVE_CHUNK) blocks */
    struct kvtier_key keys[SAVE_CHUNK];
    double token_cost; /* seconds per computed token (engine's fit) */
    double load_cost;  /* seconds per read block (decayed mean; under mu); 0: unknown */
    uint64_t lookups_skipped;
    uint64_t loaded, saved;
    double t_load;
    /* the prefetch thread */
    pthread_t th;
    bool th_on, quit;
    pthread_mutex_t mu;     /* slots, quit */
    pthread_cond_t cv;      /* a slot was queued / quit */
    pthread_cond_t cv_done; /* a slot became ready */
    struct pslot slots[PREFETCH_SLOTS];
};

static void *prefetch_main(void *arg)
{
    struct offload *o = arg;
    pthread_mutex_lock(&o->mu);
    for (;;) {
        struct pslot *p = NULL;
        for (int i = 0; i < PREFETCH_SLOTS && !p; i++)
            if (o->slots[i].state == SLOT_QUEUED)
                p = &o->slots[i];
        if (!p) {
            if (o->quit)
                break;
            pthread_cond_wait(&o->cv, &o->mu);
            continue;
        }
        p->state = SLOT_RUNNING;
        pthread_mutex_unlock(&o->mu);
        double t0 = time_now();
        int got = 0;
        while (got < p->n) {
            int m = p->n - got < SAVE_CHUNK ? p->n - got : SAVE_CHUNK;
            int r = kvtier_get_run(o->tier, p->keys + got, m, p->buf + (size_t)got * o->bb);
            got += r;
            if (r < m)
                break;
        }
        double now = time_now();
        pthread_mutex_lock(&o->mu);
        if (got > 0) { /* every read, taken or not, keeps the measure fresh */
            double per = (now - t0) / got;
            o->load_cost = o->load_cost > 0 ? 0.8 * o->load_cost + 0.2 * per : per;
        }
        p->got = got;
        p->t_read = now - t0;
        p->t_done = now;
        p->state = SLOT_READY;
        pthread_cond_broadcast(&o->cv_done);
    }
    pthread_mutex_unlock(&o->mu);
    return NULL;
}

static void slot_clear(struct pslot *p)
{
    wfree(p->keys);
    wfree(p->buf);
    memset(p, 0, sizeof *p);
}

static void hash_tensor_sample(XXH3_state_t *st, const struct tensor *t)
{
    if (!t->data)
        return;
    uint64_t meta[2] = {(uint64_t)t->type, (uint64_t)t->nbytes};
    XXH3_128bits_update(st, meta, sizeof meta);
    size_t n = t->nbytes < 4096 ? t->nbytes : 4096;
    XXH3_128bits_update(st, t->data, n);
    XXH3_128bits_update(st, (const uint8_t *)t->data + t->nbytes - n, n);
}

static void fingerprint(uint8_t out[16], const struct model *m, enum weld_dtype kv_dtype,
                        int block_size, size_t block_bytes)
{
    const struct model_config *c = &m->cfg;
    XXH3_state_t st;
    XXH3_128bits_reset(&st);
    static const char version[] = "weld kv block layout 1";
    XXH3_128bits_update(&st, version, sizeof version);
    int64_t shape[] = {c->arch,    c->n_vocab,   c->dim,      c->n_layer,
                       c->n_head,  c->n_kv_head, c->head_dim, c->rope_dim,
                       c->ffn_dim, kv_dtype,     block_size,  (int64_t)block_bytes};
    XXH3_128bits_update(&st, shape, sizeof shape);
    hash_tensor_sample(&st, &m->tok_embd);
    for (int l = 0; l < c->n_layer; l++) {
        hash_tensor_sample(&st, &m->layers[l].wk);
        hash_tensor_sample(&st, &m->layers[l].wv);
        hash_tensor_sample(&st, &m->layers[l].attn_norm);
    }
    XXH128_hash_t h = XXH3_128bits_digest(&st);
    memcpy(out, &h.high64, 8);
    memcpy(out + 8, &h.low64, 8);
}

int offload_create(struct offload **out, const struct offload_params *p, const struct model *m,
                   struct runner *run, enum weld_dtype kv_dtype, int block_size, struct weld_err *e)
{
    *out = NULL;
    size_t bb = runner_block_bytes(run);
    if (!bb)
        return err_set(e, WELD_ERR_UNSUPPORTED,
                       "--kv-offload-dir / --kv-store: this backend cannot move KV blocks "
                       "(an engine over several processes); run one process");
    struct offload *o = wcalloc(1, sizeof *o);
    if (!o)
        return err_set(e, WELD_ERR_NOMEM, "KV tier: out of memory");
    o->run = run;
    o->bb = bb;
    o->block_size = block_size;
    o->max_blocks = (int)(OFFLOAD_STAGING_BYTES / PREFETCH_SLOTS / bb);
    o->max_blocks = o->max_blocks < 1 ? 1 : o->max_blocks;
    pthread_mutex_init(&o->mu, NULL);
    pthread_cond_init(&o->cv, NULL);
    pthread_cond_init(&o->cv_done, NULL);
    o->save_buf = wmalloc(SAVE_CHUNK * bb);
    if (!o->save_buf) {
        offload_free(o);
        return err_set(e, WELD_ERR_NOMEM, "KV tier: out of memory for %d blocks of %zu bytes",
                       SAVE_CHUNK, bb);
    }
    struct kvtier_config tc = {.dir = p->dir,
                               .dir_max_bytes = p->dir_bytes,
                               .store_url = p->store,
                               .block_bytes = bb,
                               .writer_nice = p->writer_nice};
    fingerprint(tc.fingerprint, m, kv_dtype, block_size, bb);
    int rc = kvtier_open(&o->tier, &tc, e);
    if (!rc && pthread_create(&o->th, NULL, prefetch_main, o))
        rc = err_set(e, WELD_ERR_IO, "KV tier: cannot start the prefetch thread");
    else if (!rc)
        o->th_on = true;
    if (rc) {
        offload_free(o);
        return rc;
    }
    *out = o;
    return WELD_OK;
}

void offload_free(struct offload *o)
{
    if (!o)
        return;
    if (o->th_on) {
        pthread_mutex_lock(&o->mu);
        o->quit = true;
        pthread_cond_broadcast(&o->cv);
        pthread_mutex_unlock(&o->mu);
        pthread_join(o->th, NULL);
    }
    for (int i = 0; i < PREFETCH_SLOTS; i++)
        slot_clear(&o->slots[i]);
    for (int i = 0; i < o->n_chunks; i++) {
        wfree(o->chunks[i].buf);
        wfree(o->chunks[i].dst);
    }
    wfree(o->chunks);
    wfree(o->tent);
    kvtier_close(o->tier);
    pthread_cond_destroy(&o->cv_done);
    pthread_cond_destroy(&o->cv);
    pthread_mutex_destroy(&o->mu);
    wfree(o->save_buf);
    wfree(o);
}

/* Under mu: wait until p is read or `seconds` passed. */
static void wait_ready(struct offload *o, struct pslot *p, double seconds)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    long ns = ts.tv_nsec + (long)(seconds * 1e9);
    ts.tv_sec += ns / 1000000000L;
    ts.tv_nsec = ns % 1000000000L;
    while (p->state != SLOT_READY && p->state != SLOT_EMPTY)
        if (pthread_cond_timedwait(&o->cv_done, &o->mu, &ts))
            break;
}

static bool same_keys(const struct pslot *p, const struct kvm_hash *keys, int n)
{
    return p->n == n && p->keys[0].lo == keys[0].lo && p->keys[0].hi == keys[0].hi &&
           p->keys[n - 1].lo == keys[n - 1].lo && p->keys[n - 1].hi == keys[n - 1].hi;
}

/* The lookup asks the prefetch thread for the run and answers -1 (wait) until it has read
   it; the next lookup of the same keys then takes the blocks it found. A slot nobody
   claims within PREFETCH_KEEP_S (its sequence was aborted, or admitted without it) is
   dropped when a slot is needed. */
static int slots_lookup(struct offload *o, const struct kvm_hash *keys, int n, bool take,
                        bool first_try)
{
    pthread_mutex_lock(&o->mu);
    struct pslot *p = NULL, *free_slot = NULL, *oldest = NULL;
    double now = time_now();
    for (int i = 0; i < PREFETCH_SLOTS; i++) {
        struct pslot *x = &o->slots[i];
        if (x->state != SLOT_EMPTY && same_keys(x, keys, n))
            p = x;
        else if (!free_slot && (x->state == SLOT_EMPTY ||
                                (x->state == SLOT_READY && now - x->t_done > PREFETCH_KEEP_S)))
            free_slot = x;
        if (x->state == SLOT_READY && (!oldest || x->t_done < oldest->t_done))
            oldest = x;
    }
    if (p && take && p->state != SLOT_READY) /* a quick answer (a miss, a few blocks) */
        wait_ready(o, p, PREFETCH_WAIT_S);
    if (p && (p->state != SLOT_READY || !take)) {
        pthread_mutex_unlock(&o->mu);
        return -1; /* reading, or read for a sequence not yet first in line */
    }
    if (!p && !free_slot && take && oldest != NULL)
        free_slot = oldest; /* the sequence first in line comes before the lookahead's */
    if (p) {                /* read: take its blocks */
        int got = p->got;
        o->tent = p->buf;
        o->n_tent = got;
        p->buf = NULL;
        slot_clear(p);
        pthread_mutex_unlock(&o->mu);
        if (!got) {
            wfree(o->tent);
            o->tent = NULL;
        }
        return got;
    }
    if (!free_slot) { /* every slot reading: the first in line waits for one */
        pthread_mutex_unlock(&o->mu);
        return take ? -1 : 0;
    }
    slot_clear(free_slot);
    free_slot->keys = wmalloc((size_t)n * sizeof *free_slot->keys);
    free_slot->buf = wmalloc((size_t)n * o->bb);
    if (!free_slot->keys || !free_slot->buf) {
        slot_clear(free_slot);
        pthread_mutex_unlock(&o->mu);
        return 0;
    }
    for (int i = 0; i < n; i++)
        free_slot->keys[i] = (struct kvtier_key){keys[i].lo, keys[i].hi};
    free_slot->n = n;
    free_slot->state = SLOT_QUEUED;
    pthread_cond_signal(&o->cv);
    pthread_mutex_unlock(&o->mu);
    /* the first in line waits a moment: a miss or a short run is answered in well under
       that, and the step does not go without it */
    return take && first_try ? slots_lookup(o, keys, n, true, false) : -1;
}

int offload_lookup(void *u, const struct kvm_hash *keys, int n, bool take)
{
    struct offload *o = u;
    if (take) {
        wfree(o->tent);
        o->tent = NULL;
        o->n_tent = 0;
    }
    pthread_mutex_lock(&o->mu);
    bool dearer = o->load_cost > 0 && o->token_cost > 0 &&
                  o->load_cost > o->token_cost * o->block_size;
    pthread_mutex_unlock(&o->mu);
    if (dearer && ++o->lookups_skipped % PROBE_EVERY != 0)
        return 0;
    n = n < o->max_blocks ? n : o->max_blocks;
    return n > 0 ? slots_lookup(o, keys, n, take, true) : 0;
}

void offload_place(void *u, const int32_t *blocks, int n)
{
    struct offload *o = u;
    WELD_ASSERT(n <= o->n_tent && o->tent);
    if (o->n_chunks == o->cap_chunks) {
        int cap = o->cap_chunks ? 2 * o->cap_chunks : 8;
        struct chunk *c = wrealloc(o->chunks, (size_t)cap * sizeof *c);
        WELD_ASSERT(c); /* a few bytes; the scheduler has no way back from here */
        o->chunks = c;
        o->cap_chunks = cap;
    }
    int32_t *dst = wmalloc((size_t)n * sizeof *dst);
    WELD_ASSERT(dst);
    memcpy(dst, blocks, (size_t)n * sizeof *blocks);
    o->chunks[o->n_chunks++] = (struct chunk){o->tent, dst, n};
    o->tent = NULL;
    o->n_tent = 0;
}

bool offload_waiting(struct offload *o)
{
    pthread_mutex_lock(&o->mu);
    bool busy = false;
    for (int i = 0; i < PREFETCH_SLOTS && !busy; i++)
        busy = o->slots[i].state == SLOT_QUEUED || o->slots[i].state == SLOT_RUNNING;
    pthread_mutex_unlock(&o->mu);
    return busy;
}

void offload_wait(struct offload *o, double seconds)
{
    pthread_mutex_lock(&o->mu);
    bool busy = false;
    for (int i = 0; i < PREFETCH_SLOTS && !busy; i++)
        busy = o->slots[i].state == SLOT_QUEUED || o->slots[i].state == SLOT_RUNNING;
    if (busy) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        long ns = ts.tv_nsec + (long)(seconds * 1e9);
        ts.tv_sec += ns / 1000000000L;
        ts.tv_nsec = ns % 1000000000L;
        pthread_cond_timedwait(&o->cv_done, &o->mu, &ts);
    }
    pthread_mutex_unlock(&o->mu);
}

static void save_now(struct offload *o, const struct kvm_evicted *ev, int n, bool wait)
{
    for (int at = 0; at < n; at += SAVE_CHUNK) {
        int m = n - at < SAVE_CHUNK ? n - at : SAVE_CHUNK;
        int32_t ids[SAVE_CHUNK];
        for (int i = 0; i < m; i++) {
            ids[i] = ev[at + i].block;
            o->keys[i] = (struct kvtier_key){ev[at + i].hash.lo, ev[at + i].hash.hi};
        }
        runner_block_save(o->run, ids, m, o->save_buf);
        o->saved += (uint64_t)kvtier_put(o->tier, o->keys, m, o->save_buf, wait);
    }
}

void offload_apply(struct offload *o, struct kvm *kvm)
{
    int n;
    const struct kvm_evicted *ev = kvm_evictions(kvm, &n);
    if (n > 0)
        save_now(o, ev, n, false);
    kvm_evictions_clear(kvm);
    double t0 = time_now();
    for (int i = 0; i < o->n_chunks; i++) {
        struct chunk *c = &o->chunks[i];
        runner_block_load(o->run, c->dst, c->n, c->buf);
        o->loaded += (uint64_t)c->n;
        wfree(c->buf);
        wfree(c->dst);
    }
    if (o->n_chunks)
        o->t_load += time_now() - t0;
    o->n_chunks = 0;
    wfree(o->tent);
    o->tent = NULL;
    o->n_tent = 0;
}

void offload_save(struct offload *o, const struct kvm_evicted *blocks, int n)
{
    save_now(o, blocks, n, true);
    kvtier_flush(o->tier);
}

uint64_t offload_save_async(struct offload *o, const struct kvm_evicted *blocks, int n)
{
    save_now(o, blocks, n, true);
    return kvtier_ticket(o->tier);
}

void offload_wait_saved(struct offload *o, uint64_t ticket)
{
    kvtier_wait_ticket(o->tier, ticket);
}

void offload_set_token_cost(struct offload *o, double seconds)
{
    o->token_cost = seconds;
}

void offload_stats(struct offload *o, struct kvtier_stats *st, uint64_t *blocks_loaded,
                   uint64_t *blocks_saved, double *load_seconds)
{
    kvtier_stats_get(o->tier, st);
    *blocks_loaded = o->loaded;
    *blocks_saved = o->saved;
    *load_seconds = o->t_load;
}

void offload_describe(struct offload *o, char *buf, size_t cap)
{
    kvtier_describe(o->tier, buf, cap);
}
