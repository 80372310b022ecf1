/*
 * kv_manager - see kv_manager.h for the block states, hash chain and copy-on-write rules.
 *
 * Data layout.
 *   blocks: (n_blocks) struct kvm_block, one per physical block: refcount, the links of
 *     whichever list the block is on (free or LRU; none while used), its bucket-chain link,
 *     and its chained hash once it is full of computed tokens.
 *   buckets: (bucket_mask + 1) heads of the hash map's chains, indexed by the low bits of
 *     hash.lo; the chains run through kvm_block.map_next. Power of two, >= 2 * n_blocks,
 *     so chains stay short; only registered blocks are in the map.
 *   free_list / lru: intrusive doubly linked lists with head, tail and length. Allocation
 *     pops the free head, else the LRU head; releases push at the tail.
 *   copies: the copy-on-write queue (kvm_copy), drained by the scheduler each step.
 *
 * Invariants (checked by kvm_check):
 *   ref > 0  <=> on no list, counted in n_used;
 *   ref == 0 and registered <=> on the LRU list; ref == 0 and not registered <=> free;
 *   registered => hashed and map_find(hash) == the block (one block per hash);
 *   free.n + lru.n + n_used == n_blocks; every queued copy's dst has ref > 0.
 *
 * Hashing: XXH3-128 streamed over (parent hash as two little-endian-in-memory uint64,
 * tokens as int32 in memory) - the keys live only in this process, so host byte order is
 * fine. Nothing here allocates per operation except growing a table's array and the copy
 * queue, and both happen before any state changes so failures leave nothing half done.
 */
#include "engine/kv_manager.h"

#include "core/alloc.h"

#include <limits.h>
#include <string.h>

#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

enum { KVM_LIST_NONE = 0, KVM_LIST_FREE, KVM_LIST_LRU };

struct kvm_block {
    int32_t ref;
    int32_t prev, next; /* list links, -1 at the ends */
    int32_t map_next;   /* bucket chain, -1 at the end */
    uint8_t list;       /* KVM_LIST_* */
    bool hashed;        /* hash is valid: the block is full of computed tokens */
    bool registered;    /* in the hash map (implies hashed) */
    bool in_tier;       /* its content is in the second tier already (not logged again) */
    struct kvm_hash hash;
};

struct kvm_list {
    int32_t head, tail;
    int n;
};

struct kvm {
    struct kvm_config cfg;
    struct kvm_block *blocks; /* (n_blocks) */
    int32_t *buckets;         /* (bucket_mask + 1) */
    uint32_t bucket_mask;
    struct kvm_list free_list, lru;
    int n_used;
    struct kvm_copy *copies; /* (cap_copies) */
    int n_copies, cap_copies;
    uint64_t lookups, query_tokens, hit_tokens, evictions, cow_copies;
    struct kvm_evicted *evicted; /* (n_blocks) with log_evictions */
    int n_evicted;
};

/* ---- lists ---------------------------------------------------------------------------- */

static void list_push_tail(struct kvm *m, struct kvm_list *l, int id, uint8_t which)
{
    struct kvm_block *b = &m->blocks[id];
    b->prev = l->tail;
    b->next = -1;
    b->list = which;
    if (l->tail >= 0)
        m->blocks[l->tail].next = id;
    else
        l->head = id;
    l->tail = id;
    l->n++;
}

static void list_remove(struct kvm *m, struct kvm_list *l, int id)
{
    struct kvm_block *b = &m->blocks[id];
    if (b->prev >= 0)
        m->blocks[b->prev].next = b->next;
    else
        l->head = b->next;
    if (b->next >= 0)
        m->blocks[b->next].prev = b->prev;
    else
        l->tail = b->prev;
    b->prev = b->next = -1;
    b->list = KVM_LIST_NONE;
    l->n--;
}

static struct kvm_list *list_of(struct kvm *m, int id)
{
    return m->blocks[id].list == KVM_LIST_LRU ? &m->lru : &m->free_list;
}

/* ---- hash map ------------------------------------------------------------------------- */

static bool hash_eq(struct kvm_hash a, struct kvm_hash b)
{
    return a.lo == b.lo && a.hi == b.hi;
}

static int map_find(const struct kvm *m, struct kvm_hash h)
{
    int id = m->buckets[h.lo & m->bucket_mask];
    while (id >= 0 && !hash_eq(m->blocks[id].hash, h))
        id = m->blocks[id].map_next;
    return id;
}

static void map_insert(struct kvm *m, int id)
{
    struct kvm_block *b = &m->blocks[id];
    uint32_t k = (uint32_t)(b->hash.lo & m->bucket_mask);
    b->map_next = m->buckets[k];
    m->buckets[k] = id;
    b->registered = true;
}

static void map_remove(struct kvm *m, int id)
{
    struct kvm_block *b = &m->blocks[id];
    int32_t *link = &m->buckets[b->hash.lo & m->bucket_mask];
    while (*link >= 0 && *link != id)
        link = &m->blocks[*link].map_next;
    WELD_ASSERT(*link == id);
    *link = b->map_next;
    b->map_next = -1;
    b->registered = false;
}

static struct kvm_hash block_hash(struct kvm_hash parent, const int32_t *tokens, int n)
{
    XXH3_state_t st;
    uint64_t p[2] = {parent.lo, parent.hi};
    XXH3_128bits_reset(&st);
    XXH3_128bits_update(&st, p, sizeof p);
    XXH3_128bits_update(&st, tokens, (size_t)n * sizeof *tokens);
    XXH128_hash_t h = XXH3_128bits_digest(&st);
    return (struct kvm_hash){h.low64, h.high64};
}

static struct kvm_hash root_hash(const struct kvm_table *t)
{
    return t->has_salt ? t->salt : (struct kvm_hash){0, 0};
}

/* ---- config, create, free ------------------------------------------------------------- */

struct kvm_config kvm_config_default(void)
{
    return (struct kvm_config){.n_blocks = 0, .block_size = 16, .prefix_caching = true};
}

int kvm_config_check(const struct kvm_config *c, struct weld_err *e)
{
    if (c->block_size < 1 || c->block_size > KVM_MAX_BLOCK_SIZE)
        return err_set(e, WELD_ERR_INVALID_ARG, "KV cache: block_size %d is outside [1, %d]",
                       c->block_size, KVM_MAX_BLOCK_SIZE);
    if (c->n_blocks < 1)
        return err_set(e, WELD_ERR_INVALID_ARG,
                       "KV cache: n_blocks %d: the pool needs at least one block",
                       c->n_blocks);
    if ((int64_t)c->n_blocks * c->block_size > INT_MAX)
        return err_set(e, WELD_ERR_INVALID_ARG,
                       "KV cache: n_blocks %d x block_size %d exceeds %d token slots",
                       c->n_blocks, c->block_size, INT_MAX);
    return WELD_OK;
}

int kvm_create(struct kvm **out, const struct kvm_config *c, struct weld_err *e)
{
    *out = NULL;
    int rc = kvm_config_check(c, e);
    if (rc)
        return rc;
    struct kvm *m = wcalloc(1, sizeof *m);
    if (!m)
        goto nomem;
    m->cfg = *c;
    uint64_t nb = 16;
    while (nb < 2 * (uint64_t)c->n_blocks)
        nb <<= 1;
    m->bucket_mask = (uint32_t)(nb - 1);
    m->blocks = wcalloc((size_t)c->n_blocks, sizeof *m->blocks);
    m->buckets = wmalloc((size_t)nb * sizeof *m->buckets);
    if (c->log_evictions)
        m->evicted = wmalloc((size_t)c->n_blocks * sizeof *m->evicted);
    if (!m->blocks || !m->buckets || (c->log_evictions && !m->evicted))
        goto nomem;
    memset(m->buckets, 0xff, (size_t)nb * sizeof *m->buckets);
    m->free_list = m->lru = (struct kvm_list){-1, -1, 0};
    for (int i = 0; i < c->n_blocks; i++) {
        m->blocks[i].map_next = -1;
        list_push_tail(m, &m->free_list, i, KVM_LIST_FREE);
    }
    *out = m;
    return WELD_OK;
nomem:
    kvm_free(m);
    return err_set(e, WELD_ERR_NOMEM, "KV cache: out of memory for the metadata of %d blocks",
                   c->n_blocks);
}

void kvm_free(struct kvm *m)
{
    if (!m)
        return;
    wfree(m->blocks);
    wfree(m->buckets);
    wfree(m->copies);
    wfree(m->evicted);
    wfree(m);
}

int kvm_block_size(const struct kvm *m) { return m->cfg.block_size; }
int kvm_n_blocks(const struct kvm *m) { return m->cfg.n_blocks; }
int kvm_n_available(const struct kvm *m) { return m->free_list.n + m->lru.n; }

int kvm_blocks_for(const struct kvm *m, int n_tokens)
{
    if (n_tokens <= 0)
        return 0;
    int bs = m->cfg.block_size;
    return n_tokens / bs + (n_tokens % bs != 0);
}

/* ---- block alloc / release ------------------------------------------------------------ */

/* Take a block with no content for a table: the free head, else evict the LRU head.
   The caller has checked kvm_n_available(). */
static int block_alloc(struct kvm *m)
{
    int id;
    if (m->free_list.n > 0) {
        id = m->free_list.head;
        list_remove(m, &m->free_list, id);
    } else {
        WELD_ASSERT(m->lru.n > 0);
        id = m->lru.head;
        list_remove(m, &m->lru, id);
        if (m->evicted && m->blocks[id].registered && !m->blocks[id].in_tier &&
            m->n_evicted < m->cfg.n_blocks)
            m->evicted[m->n_evicted++] = (struct kvm_evicted){id, m->blocks[id].hash};
        map_remove(m, id);
        m->evictions++;
    }
    struct kvm_block *b = &m->blocks[id];
    b->hashed = false;
    b->in_tier = false;
    b->ref = 1;
    m->n_used++;
    return id;
}

static void copies_drop_dst(struct kvm *m, int id)
{
    int k = 0;
    for (int i = 0; i < m->n_copies; i++)
        if (m->copies[i].dst != id)
            m->copies[k++] = m->copies[i];
    m->n_copies = k;
}

static void block_release(struct kvm *m, int id)
{
    struct kvm_block *b = &m->blocks[id];
    WELD_ASSERT(b->ref > 0);
    if (--b->ref > 0)
        return;
    m->n_used--;
    copies_drop_dst(m, id);
    if (b->registered) {
        list_push_tail(m, &m->lru, id, KVM_LIST_LRU);
    } else {
        b->hashed = false;
        list_push_tail(m, &m->free_list, id, KVM_LIST_FREE);
    }
}

/* Take a block found in the cache: out of the LRU list if it was unreferenced. */
static void block_acquire(struct kvm *m, int id)
{
    struct kvm_block *b = &m->blocks[id];
    if (b->ref == 0) {
        list_remove(m, list_of(m, id), id);
        m->n_used++;
    }
    b->ref++;
}

/* ---- tables --------------------------------------------------------------------------- */

void kvm_table_init(struct kvm_table *t, const void *salt, size_t salt_len)
{
    memset(t, 0, sizeof *t);
    if (salt && salt_len > 0) {
        XXH128_hash_t h = XXH3_128bits(salt, salt_len);
        t->has_salt = true;
        t->salt = (struct kvm_hash){h.low64, h.high64};
    }
}

static int table_grow(struct kvm_table *t, int n_blocks)
{
    if (n_blocks <= t->cap)
        return WELD_OK;
    int cap = t->cap > 0 ? t->cap : 4;
    while (cap < n_blocks)
        cap = cap > INT_MAX / 2 ? n_blocks : cap * 2;
    int32_t *p = wrealloc(t->blocks, (size_t)cap * sizeof *p);
    if (!p)
        return WELD_ERR_NOMEM;
    t->blocks = p;
    t->cap = cap;
    return WELD_OK;
}

/* Walk the cached prefix of tokens for table t; stores the block ids in ids (if not NULL)
   and returns how many full blocks match. */
static int prefix_match(const struct kvm *m, const struct kvm_table *t, const int32_t *tokens,
                        int n_tokens, int32_t *ids, int *n_evictable)
{
    int bs = m->cfg.block_size, n = 0, evictable = 0;
    if (m->cfg.prefix_caching && n_tokens > 1 && tokens) {
        int max_blocks = (n_tokens - 1) / bs;
        struct kvm_hash parent = root_hash(t);
        for (; n < max_blocks; n++) {
            struct kvm_hash h = block_hash(parent, tokens + (size_t)n * bs, bs);
            int id = map_find(m, h);
            if (id < 0)
                break;
            if (ids)
                ids[n] = id;
            evictable += m->blocks[id].ref == 0;
            parent = h;
        }
    }
    if (n_evictable)
        *n_evictable = evictable;
    return n;
}

int kvm_prefix_peek(const struct kvm *m, const struct kvm_table *t, const int32_t *tokens,
                    int n_tokens, int *n_evictable)
{
    return prefix_match(m, t, tokens, n_tokens, NULL, n_evictable) * m->cfg.block_size;
}

int kvm_prefix_take(struct kvm *m, struct kvm_table *t, const int32_t *tokens, int n_tokens,
                    int *n_cached, struct weld_err *e)
{
    *n_cached = 0;
    if (t->n_blocks != 0)
        return err_set(e, WELD_ERR_INVALID_ARG,
                       "KV cache: prefix lookup into a table that already holds %d blocks",
                       t->n_blocks);
    if (n_tokens < 0)
        return err_set(e, WELD_ERR_INVALID_ARG, "KV cache: prefix lookup of %d tokens",
                       n_tokens);
    int max_blocks = n_tokens > 1 ? (n_tokens - 1) / m->cfg.block_size : 0;
    if (m->cfg.prefix_caching && table_grow(t, max_blocks))
        return err_set(e, WELD_ERR_NOMEM, "KV cache: out of memory for a %d-block table",
                       max_blocks);
    int n = prefix_match(m, t, tokens, n_tokens, t->blocks, NULL);
    for (int i = 0; i < n; i++)
        block_acquire(m, t->blocks[i]);
    t->n_blocks = n;
    t->n_hashed = n;
    t->n_computed = n * m->cfg.block_size;
    m->lookups++;
    m->query_tokens += (uint64_t)n_tokens;
    m->hit_tokens += (uint64_t)t->n_computed;
    *n_cached = t->n_computed;
    return WELD_OK;
}

/* Blocks in the write range [n_computed, n_tokens) that t shares with another table. */
static int table_n_shared(const struct kvm *m, const struct kvm_table *t, int n_tokens)
{
    if (n_tokens <= t->n_computed)
        return 0;
    int first = t->n_computed / m->cfg.block_size;
    int end = kvm_blocks_for(m, n_tokens);
    if (end > t->n_blocks)
        end = t->n_blocks;
    int n = 0;
    for (int b = first; b < end; b++)
        n += m->blocks[t->blocks[b]].ref > 1;
    return n;
}

int kvm_table_blocks_needed(const struct kvm *m, const struct kvm_table *t, int n_tokens)
{
    int want = kvm_blocks_for(m, n_tokens);
    int fresh = want > t->n_blocks ? want - t->n_blocks : 0;
    return fresh + table_n_shared(m, t, n_tokens);
}

static int copies_reserve(struct kvm *m, int extra)
{
    if (m->n_copies + extra <= m->cap_copies)
        return WELD_OK;
    int cap = m->cap_copies > 0 ? m->cap_copies : 16;
    while (cap < m->n_copies + extra)
        cap *= 2;
    struct kvm_copy *p = wrealloc(m->copies, (size_t)cap * sizeof *p);
    if (!p)
        return WELD_ERR_NOMEM;
    m->copies = p;
    m->cap_copies = cap;
    return WELD_OK;
}

/* Replace every shared block in t's write range by a private one (copying computed
   slots). Blocks are available: checked by the caller. */
static void table_unshare(struct kvm *m, struct kvm_table *t, int n_tokens)
{
    int bs = m->cfg.block_size;
    int end = kvm_blocks_for(m, n_tokens);
    if (end > t->n_blocks)
        end = t->n_blocks;
    for (int b = t->n_computed / bs; b < end; b++) {
        int old = t->blocks[b];
        if (m->blocks[old].ref <= 1)
            continue;
        int fresh = block_alloc(m);
        if ((int64_t)b * bs < t->n_computed) {
            m->copies[m->n_copies++] = (struct kvm_copy){old, fresh};
            m->cow_copies++;
        }
        block_release(m, old);
        t->blocks[b] = fresh;
    }
}

int kvm_table_reserve(struct kvm *m, struct kvm_table *t, int n_tokens, struct weld_err *e)
{
    int bs = m->cfg.block_size;
    if (n_tokens < 0 || (int64_t)n_tokens > (int64_t)m->cfg.n_blocks * bs)
        return err_set(e, WELD_ERR_LIMIT,
                       "KV cache: %d tokens can never fit in %d blocks of %d tokens",
                       n_tokens, m->cfg.n_blocks, bs);
    int want = kvm_blocks_for(m, n_tokens);
    int n_shared = table_n_shared(m, t, n_tokens);
    int fresh = want > t->n_blocks ? want - t->n_blocks : 0;
    int avail = kvm_n_available(m);
    if (fresh + n_shared > avail)
        return err_set(e, WELD_ERR_LIMIT,
                       "KV cache: %d tokens need %d more blocks but %d are available "
                       "(%d free + %d cached, %d in use of %d)",
                       n_tokens, fresh + n_shared, avail, m->free_list.n, m->lru.n,
                       m->n_used, m->cfg.n_blocks);
    if (table_grow(t, want) || copies_reserve(m, n_shared))
        return err_set(e, WELD_ERR_NOMEM, "KV cache: out of memory for a %d-block table",
                       want);
    if (n_shared > 0)
        table_unshare(m, t, n_tokens);
    while (t->n_blocks < want)
        t->blocks[t->n_blocks++] = block_alloc(m);
    return WELD_OK;
}

int kvm_table_commit(struct kvm *m, struct kvm_table *t, const int32_t *tokens,
                     int n_computed, struct weld_err *e)
{
    int bs = m->cfg.block_size;
    if (n_computed < t->n_computed || (int64_t)n_computed > (int64_t)t->n_blocks * bs)
        return err_set(e, WELD_ERR_INVALID_ARG,
                       "KV cache: commit of %d computed tokens: the table has %d computed "
                       "and room for %d",
                       n_computed, t->n_computed, t->n_blocks * bs);
    t->n_computed = n_computed;
    if (!m->cfg.prefix_caching)
        return WELD_OK;
    int full = n_computed / bs;
    for (int b = t->n_hashed; b < full; b++) {
        struct kvm_block *blk = &m->blocks[t->blocks[b]];
        if (!blk->hashed) {
            struct kvm_hash parent = b == 0 ? root_hash(t) : m->blocks[t->blocks[b - 1]].hash;
            blk->hash = block_hash(parent, tokens + (size_t)b * bs, bs);
            blk->hashed = true;
            if (map_find(m, blk->hash) < 0)
                map_insert(m, t->blocks[b]);
        }
    }
    if (full > t->n_hashed)
        t->n_hashed = full;
    return WELD_OK;
}

int kvm_table_fork(struct kvm *m, struct kvm_table *dst, const struct kvm_table *src,
                   struct weld_err *e)
{
    if (dst->n_blocks != 0)
        return err_set(e, WELD_ERR_INVALID_ARG,
                       "KV cache: fork into a table that already holds %d blocks",
                       dst->n_blocks);
    if (table_grow(dst, src->n_blocks > 0 ? src->n_blocks : 1))
        return err_set(e, WELD_ERR_NOMEM, "KV cache: out of memory for a %d-block table",
                       src->n_blocks);
    for (int i = 0; i < src->n_blocks; i++) {
        dst->blocks[i] = src->blocks[i];
        block_acquire(m, src->blocks[i]);
    }
    dst->n_blocks = src->n_blocks;
    dst->n_computed = src->n_computed;
    dst->n_hashed = src->n_hashed;
    dst->has_salt = src->has_salt;
    dst->salt = src->salt;
    return WELD_OK;
}

void kvm_table_free(struct kvm *m, struct kvm_table *t)
{
    if (!t)
        return;
    for (int i = t->n_blocks - 1; i >= 0; i--)
        block_release(m, t->blocks[i]);
    wfree(t->blocks);
    t->blocks = NULL;
    t->cap = t->n_blocks = t->n_computed = t->n_hashed = 0;
}

/* ---- copies, stats, checks ------------------------------------------------------------ */

const struct kvm_copy *kvm_copies(const struct kvm *m, int *n)
{
    *n = m->n_copies;
    return m->copies;
}

void kvm_copies_clear(struct kvm *m) { m->n_copies = 0; }

const struct kvm_evicted *kvm_evictions(const struct kvm *m, int *n)
{
    *n = m->n_evicted;
    return m->evicted;
}

void kvm_evictions_clear(struct kvm *m)
{
    m->n_evicted = 0;
}

void kvm_mark_in_tier(struct kvm *m, const int32_t *blocks, int n)
{
    for (int i = 0; i < n; i++)
        if (blocks[i] >= 0 && blocks[i] < m->cfg.n_blocks)
            m->blocks[blocks[i]].in_tier = true;
}

void kvm_prefix_hashes(const struct kvm_table *t, const int32_t *tokens, int block_size,
                       int n_blocks, struct kvm_hash *out)
{
    struct kvm_hash parent = root_hash(t);
    for (int b = 0; b < n_blocks; b++)
        parent = out[b] = block_hash(parent, tokens + (size_t)b * block_size, block_size);
}

int kvm_hashed_blocks(const struct kvm *m, struct kvm_evicted *out, int max)
{
    int n = 0;
    for (int i = 0; i < m->cfg.n_blocks; i++)
        if (m->blocks[i].hashed && m->blocks[i].registered) {
            if (n < max)
                out[n] = (struct kvm_evicted){i, m->blocks[i].hash};
            n++;
        }
    return n;
}

void kvm_stats_get(const struct kvm *m, struct kvm_stats *st)
{
    memset(st, 0, sizeof *st);
    st->n_blocks = m->cfg.n_blocks;
    st->block_size = m->cfg.block_size;
    st->n_free = m->free_list.n;
    st->n_cached = m->lru.n;
    st->n_used = m->n_used;
    st->usage = (double)m->n_used / m->cfg.n_blocks;
    st->lookups = m->lookups;
    st->query_tokens = m->query_tokens;
    st->hit_tokens = m->hit_tokens;
    st->evictions = m->evictions;
    st->cow_copies = m->cow_copies;
}

void kvm_cache_reset(struct kvm *m)
{
    while (m->lru.n > 0) {
        int id = m->lru.head;
        list_remove(m, &m->lru, id);
        map_remove(m, id);
        m->blocks[id].hashed = false;
        list_push_tail(m, &m->free_list, id, KVM_LIST_FREE);
    }
}

int kvm_block_ref(const struct kvm *m, int block)
{
    if (block < 0 || block >= m->cfg.n_blocks)
        return -1;
    return m->blocks[block].ref;
}

static int check_list(const struct kvm *m, const struct kvm_list *l, uint8_t which,
                      const char *name, struct weld_err *e)
{
    int n = 0, prev = -1;
    for (int id = l->head; id >= 0; id = m->blocks[id].next) {
        const struct kvm_block *b = &m->blocks[id];
        if (++n > m->cfg.n_blocks || b->list != which || b->prev != prev || b->ref != 0)
            return err_set(e, WELD_ERR_INTERNAL, "KV cache: %s list broken at block %d",
                           name, id);
        if ((which == KVM_LIST_LRU) != b->registered)
            return err_set(e, WELD_ERR_INTERNAL,
                           "KV cache: block %d on the %s list is %sregistered", id, name,
                           b->registered ? "" : "not ");
        prev = id;
    }
    if (n != l->n || prev != l->tail)
        return err_set(e, WELD_ERR_INTERNAL, "KV cache: %s list holds %d blocks, counted %d",
                       name, n, l->n);
    return WELD_OK;
}

int kvm_check(const struct kvm *m, struct weld_err *e)
{
    int rc = check_list(m, &m->free_list, KVM_LIST_FREE, "free", e);
    if (!rc)
        rc = check_list(m, &m->lru, KVM_LIST_LRU, "LRU", e);
    if (rc)
        return rc;
    int used = 0, registered = 0, in_map = 0;
    for (int id = 0; id < m->cfg.n_blocks; id++) {
        const struct kvm_block *b = &m->blocks[id];
        if (b->ref < 0 || (b->ref > 0) != (b->list == KVM_LIST_NONE))
            return err_set(e, WELD_ERR_INTERNAL, "KV cache: block %d has refcount %d on list %d",
                           id, b->ref, b->list);
        used += b->ref > 0;
        if (b->registered && (!b->hashed || map_find(m, b->hash) != id))
            return err_set(e, WELD_ERR_INTERNAL, "KV cache: block %d registered but not found",
                           id);
        registered += b->registered;
    }
    for (uint32_t k = 0; k <= m->bucket_mask; k++)
        for (int id = m->buckets[k]; id >= 0; id = m->blocks[id].map_next)
            if (++in_map > m->cfg.n_blocks || !m->blocks[id].registered)
                return err_set(e, WELD_ERR_INTERNAL, "KV cache: hash bucket %u broken", k);
    if (used != m->n_used || in_map != registered ||
        m->free_list.n + m->lru.n + m->n_used != m->cfg.n_blocks)
        return err_set(e, WELD_ERR_INTERNAL,
                       "KV cache: counts disagree: used %d/%d, map %d/%d, %d+%d+%d != %d",
                       used, m->n_used, in_map, registered, m->free_list.n, m->lru.n,
                       m->n_used, m->cfg.n_blocks);
    for (int i = 0; i < m->n_copies; i++)
        if (kvm_block_ref(m, m->copies[i].dst) <= 0 || kvm_block_ref(m, m->copies[i].src) < 0)
            return err_set(e, WELD_ERR_INTERNAL, "KV cache: copy %d -> %d targets a free block",
                           m->copies[i].src, m->copies[i].dst);
    return WELD_OK;
}
