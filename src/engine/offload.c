/*
 * offload - the engine's side of the KV tier (design in offload.h).
 *
 * Staging: blocks [0, n_placed) of `staging` are read and have their pool block in
 * `dst`; the n_tent after them are the last lookup's, waiting for offload_place (or for
 * the next lookup, which reuses the space). offload_apply loads the placed ones in one
 * backend call.
 */
#include "engine/offload.h"

#include "core/alloc.h"
#include "core/log.h"
#include "core/progress.h"

#include <string.h>

#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

#define SAVE_CHUNK 64
#define PROBE_EVERY 32

struct offload {
    struct kvtier *tier;
    struct runner *run;
    size_t bb; /* bytes of one block */
    int block_size;
    uint8_t *staging; /* (cap) blocks */
    int32_t *dst;     /* (cap) pool block of each placed one */
    int cap, max_blocks, n_placed, n_tent;
    uint8_t *save_buf; /* (SAVE_CHUNK) blocks */
    struct kvtier_key keys[SAVE_CHUNK];
    double token_cost; /* seconds per computed token (engine's fit) */
    double load_cost;  /* seconds per loaded block (decayed mean); 0: unknown */
    uint64_t lookups_skipped;
    uint64_t loaded, saved;
    double t_load;
};

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
    o->max_blocks = (int)(OFFLOAD_STAGING_BYTES / bb);
    o->max_blocks = o->max_blocks < 1 ? 1 : o->max_blocks;
    o->save_buf = wmalloc(SAVE_CHUNK * bb);
    if (!o->save_buf) {
        wfree(o);
        return err_set(e, WELD_ERR_NOMEM, "KV tier: out of memory for %d blocks of %zu bytes",
                       SAVE_CHUNK, bb);
    }
    struct kvtier_config tc = {.dir = p->dir,
                               .dir_max_bytes = p->dir_bytes,
                               .store_url = p->store,
                               .block_bytes = bb};
    fingerprint(tc.fingerprint, m, kv_dtype, block_size, bb);
    int rc = kvtier_open(&o->tier, &tc, e);
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
    kvtier_close(o->tier);
    wfree(o->staging);
    wfree(o->dst);
    wfree(o->save_buf);
    wfree(o);
}

/* Room for n more staged blocks past the placed ones; false when out of memory. */
static bool staging_room(struct offload *o, int n)
{
    int want = o->n_placed + n;
    if (want <= o->cap)
        return true;
    int cap = o->cap ? o->cap : 16;
    while (cap < want)
        cap *= 2;
    cap = cap > o->max_blocks ? o->max_blocks : cap;
    if (cap < want)
        return false;
    uint8_t *s = wrealloc(o->staging, (size_t)cap * o->bb);
    if (!s)
        return false;
    o->staging = s;
    int32_t *d = wrealloc(o->dst, (size_t)cap * sizeof *d);
    if (!d)
        return false;
    o->dst = d;
    o->cap = cap;
    return true;
}

int offload_lookup(void *u, const struct kvm_hash *keys, int n)
{
    struct offload *o = u;
    o->n_tent = 0;
    if (o->load_cost > 0 && o->token_cost > 0 && o->load_cost > o->token_cost * o->block_size &&
        ++o->lookups_skipped % PROBE_EVERY != 0)
        return 0;
    if (n > o->max_blocks - o->n_placed)
        n = o->max_blocks - o->n_placed;
    if (n <= 0 || !staging_room(o, n))
        return 0;
    int got = 0;
    double t0 = time_now();
    while (got < n) {
        struct kvtier_key k[SAVE_CHUNK];
        int m = n - got < SAVE_CHUNK ? n - got : SAVE_CHUNK;
        for (int i = 0; i < m; i++)
            k[i] = (struct kvtier_key){keys[got + i].lo, keys[got + i].hi};
        int r = kvtier_get_run(o->tier, k, m, o->staging + (size_t)(o->n_placed + got) * o->bb);
        got += r;
        if (r < m)
            break;
    }
    if (got > 0) {
        double per = (time_now() - t0) / got;
        o->load_cost = o->load_cost > 0 ? 0.8 * o->load_cost + 0.2 * per : per;
    }
    o->n_tent = got;
    return got;
}

void offload_place(void *u, const int32_t *blocks, int n)
{
    struct offload *o = u;
    WELD_ASSERT(n <= o->n_tent);
    memcpy(o->dst + o->n_placed, blocks, (size_t)n * sizeof *blocks);
    o->n_placed += n;
    o->n_tent = 0;
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
    if (o->n_placed > 0) {
        double t0 = time_now();
        runner_block_load(o->run, o->dst, o->n_placed, o->staging);
        o->t_load += time_now() - t0;
        o->loaded += (uint64_t)o->n_placed;
        o->n_placed = 0;
    }
    o->n_tent = 0;
}

void offload_save(struct offload *o, const struct kvm_evicted *blocks, int n)
{
    save_now(o, blocks, n, true);
    kvtier_flush(o->tier);
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
