/*
 * kv_manager - accounting of a fixed pool of paged KV-cache blocks, with a prefix cache.
 *
 * What it is. The pool holds n_blocks physical blocks of block_size token slots each; this
 * module only decides which physical block ids a sequence uses. It never touches KV data
 * and knows nothing of the model: the exec side owns the storage and follows the block
 * tables and the block copies emitted here.
 *
 * Block states (every block is in exactly one):
 *   used    refcount > 0: held by one or more block tables (shared after a prefix hit or
 *           a fork).
 *   cached  refcount 0 and registered in the prefix cache: its KV is still valid and a
 *           later request with the same prefix can take it back. Kept on an LRU list
 *           (head = least recently released = evicted first).
 *   free    refcount 0, no reusable content.
 * free + cached + used = n_blocks always. Allocation takes a free block first, then evicts
 * the LRU head of the cached list (unregistering it, counted as an eviction).
 *
 * Prefix cache keys. A block is keyed once it is full of computed tokens:
 *   hash(block i) = XXH3-128(hash(block i-1) as 16 bytes || block's token ids as int32)
 * with hash(block -1) = XXH3-128(salt) when the table has a cache salt, all zero
 * otherwise. So a hit needs the same tokens in the same block, the same whole prefix before
 * it and the same salt. Only full, computed blocks are ever shared through the cache; if
 * a full block's hash is already registered to another block, the new one stays
 * unregistered (it is still hashed so its children chain correctly) and becomes free, not
 * cached, when released. Keys are compared by hash only: two different prefixes with the
 * same 128-bit hash would share KV, which is taken as impossible in practice (vLLM makes
 * the same trade).
 *
 * Release order. kvm_table_free releases a table's blocks last to first, each appended to
 * the LRU tail, so the end of a prompt is evicted before its start.
 *
 * Copy-on-write. kvm_table_fork makes a second table sharing every block (refcount + 1).
 * Whenever kvm_table_reserve is asked to make room for tokens that will be written into a
 * block that is shared (refcount > 1), that block is replaced in this table by a fresh
 * one; if the shared block already held computed tokens a copy (src, dst) is queued. The
 * exec side must perform queued copies, in order, before the step's forward pass; the
 * scheduler hands them over in its plan (kvm_copies / kvm_copies_clear). A queued copy
 * whose dst block is released before it ran is dropped from the queue.
 *
 * Tables. A struct kvm_table is owned by the caller (embedded in its sequence), but its
 * fields are written only by this module: blocks[0, n_blocks) are the physical ids for
 * token slots [0, n_blocks * block_size); n_computed tokens have their KV written. Every
 * table must be released with kvm_table_free before the manager is freed.
 *
 * Cost. Every operation is O(1) per block touched: a chained hash map (bucket heads plus
 * an intrusive next index per block) from hash to block, intrusive doubly linked LRU and
 * free lists. Prefix matching hashes block_size tokens per full block of the prompt.
 *
 * Failure. Running out of blocks is a state, never a crash: kvm_table_reserve is
 * all-or-nothing and returns WELD_ERR_LIMIT with nothing changed. Single-threaded: the
 * caller (the scheduler) serializes all calls.
 *
 * Second tier. With log_evictions every eviction of a cached block is logged with its hash
 * (kvm_evictions), so the engine can save the block's KV to the KV tier (kvtier/) before
 * it is overwritten; blocks loaded back from that tier enter a table like computed ones
 * (kvm_table_reserve, then kvm_table_commit registers them).
 *
 * Deliberately not done: token-level (radix) sharing of partial blocks, and deduplicating a block that turns out identical to a cached one after it
 * was computed.
 */
#ifndef WELD_ENGINE_KV_MANAGER_H
#define WELD_ENGINE_KV_MANAGER_H

#include "core/err.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define KVM_MAX_BLOCK_SIZE 4096

struct kvm_config {
    int n_blocks;        /* >= 1: physical blocks in the pool */
    int block_size;      /* [1, KVM_MAX_BLOCK_SIZE] token slots per block; 16 by default */
    bool prefix_caching; /* false: nothing is registered, matches always miss */
    bool log_evictions;  /* keep the (block, hash) of every cached block evicted, for a
                            second tier to save before the block is written again */
};

struct kvm_hash {
    uint64_t lo, hi;
};

/* A cached block that was evicted: its KV is still in the pool until the next forward
   pass writes the block (kvm_evictions). */
struct kvm_evicted {
    int32_t block;
    struct kvm_hash hash;
};

/* One block copy to do before a step's forward pass: dst's slots get src's KV. */
struct kvm_copy {
    int32_t src, dst;
};

/* A sequence's block table. Zero-initialize or kvm_table_init; fields are read-only to
   callers. */
struct kvm_table {
    int32_t *blocks;       /* (cap) physical block ids; [0, n_blocks) in use */
    int n_blocks;          /* blocks held; covers n_blocks * block_size token slots */
    int cap;               /* allocated length of blocks */
    int n_computed;        /* tokens whose KV is written: slots [0, n_computed) */
    int n_hashed;          /* leading full blocks whose chained hash is known */
    bool has_salt;
    struct kvm_hash salt;  /* XXH3-128 of the cache salt when has_salt */
};

struct kvm_stats {
    int n_blocks, block_size;
    int n_free;             /* refcount 0, no content */
    int n_cached;           /* refcount 0, registered, on the LRU list */
    int n_used;             /* refcount > 0 */
    double usage;           /* n_used / n_blocks, in [0, 1] */
    uint64_t lookups;       /* prefix lookups taken (kvm_prefix_take calls) */
    uint64_t query_tokens;  /* tokens offered to those lookups */
    uint64_t hit_tokens;    /* of those, tokens served from the cache */
    uint64_t evictions;     /* cached blocks reused for new content */
    uint64_t cow_copies;    /* block copies queued by copy-on-write */
};

struct kvm;

/* Default config: block_size 16, prefix caching on; n_blocks must still be set. */
struct kvm_config kvm_config_default(void);
/* WELD_ERR_INVALID_ARG naming the field when a value is out of range. */
int kvm_config_check(const struct kvm_config *c, struct weld_err *e);

int kvm_create(struct kvm **out, const struct kvm_config *c, struct weld_err *e);
/* NULL-safe. Tables still holding blocks must have been freed first (their blocks are
   simply forgotten otherwise). */
void kvm_free(struct kvm *m);

int kvm_block_size(const struct kvm *m);
int kvm_n_blocks(const struct kvm *m);
/* Blocks a table covering n_tokens slots needs: ceil(n_tokens / block_size). */
int kvm_blocks_for(const struct kvm *m, int n_tokens);
/* free + cached: how many blocks an allocation can get right now. */
int kvm_n_available(const struct kvm *m);

/* Start an empty table, with an optional cache salt (salt_len 0: none). Never fails. */
void kvm_table_init(struct kvm_table *t, const void *salt, size_t salt_len);

/* Prefix lookup without side effects, for an empty table t (only its salt is used):
   returns how many leading tokens of tokens[0, n_tokens) are cached, a multiple of
   block_size and always < n_tokens (at least one token is left to compute so there are
   logits). *n_evictable (may be NULL) gets how many of the matching blocks are cached with
   refcount 0, i.e. would no longer be available to allocations once taken. */
int kvm_prefix_peek(const struct kvm *m, const struct kvm_table *t, const int32_t *tokens,
                    int n_tokens, int *n_evictable);

/* Same match, and t (which must be empty) takes the matching blocks (refcount + 1, out of
   the LRU list); t->n_computed becomes the returned token count. Counts one lookup of
   n_tokens query tokens. WELD_ERR_NOMEM (nothing changed) if the table cannot grow. */
int kvm_prefix_take(struct kvm *m, struct kvm_table *t, const int32_t *tokens, int n_tokens,
                    int *n_cached, struct weld_err *e);

/* Blocks kvm_table_reserve(t, n_tokens) would have to allocate (new blocks plus
   copy-on-write replacements). */
int kvm_table_blocks_needed(const struct kvm *m, const struct kvm_table *t, int n_tokens);

/* Make t cover token slots [0, n_tokens) and make every block that slots
   [t->n_computed, n_tokens) fall in private to t (copy-on-write, see above). Takes free
   blocks first, then evicts LRU cached blocks. All or nothing: WELD_ERR_LIMIT when the
   pool (free + cached) is short, WELD_ERR_NOMEM when the table cannot grow; in both cases
   nothing changed. A table never shrinks here. */
int kvm_table_reserve(struct kvm *m, struct kvm_table *t, int n_tokens, struct weld_err *e);

/* Record that slots [0, n_computed) of t hold tokens[0, n_computed)'s KV
   (t->n_computed <= n_computed <= n_blocks * block_size). Newly full blocks are hashed,
   chained from their parent, and registered in the prefix cache when caching is on.
   WELD_ERR_INVALID_ARG if n_computed is out of range. */
int kvm_table_commit(struct kvm *m, struct kvm_table *t, const int32_t *tokens,
                     int n_computed, struct weld_err *e);

/* dst (empty) shares every block of src: refcounts + 1, same n_computed, hashes and salt.
   WELD_ERR_NOMEM (nothing changed) if dst's array cannot be allocated. */
int kvm_table_fork(struct kvm *m, struct kvm_table *dst, const struct kvm_table *src,
                   struct weld_err *e);

/* Release every block of t, last block first (refcount - 1; at 0 a registered block goes
   to the LRU tail, others to the free list), and reset t to empty (salt kept). NULL-safe
   for t. */
void kvm_table_free(struct kvm *m, struct kvm_table *t);

/* The queued copy-on-write copies, oldest first (valid until the next manager call that
   allocates), and emptying that queue once the exec side has them. */
const struct kvm_copy *kvm_copies(const struct kvm *m, int *n);
void kvm_copies_clear(struct kvm *m);

/* Cached blocks evicted since the last kvm_evictions_clear, oldest first (with
   log_evictions; otherwise none). The caller saves their KV before the next forward pass
   and clears the log. */
const struct kvm_evicted *kvm_evictions(const struct kvm *m, int *n);
void kvm_evictions_clear(struct kvm *m);
/* These blocks' content is in the second tier already (loaded from it, or saved to it):
   their eviction is not logged, until they are allocated for new content. */
void kvm_mark_in_tier(struct kvm *m, const int32_t *blocks, int n);
/* The chained hashes of the first n_blocks full blocks of tokens for table t (only its
   salt is used): the prefix-cache keys those blocks have or would have. */
void kvm_prefix_hashes(const struct kvm_table *t, const int32_t *tokens, int block_size,
                       int n_blocks, struct kvm_hash *out);
/* Every block whose hash is known (full of computed tokens), used or cached, into out
   (up to max); returns how many there are. For saving what the pool holds at shutdown. */
int kvm_hashed_blocks(const struct kvm *m, struct kvm_evicted *out, int max);

void kvm_stats_get(const struct kvm *m, struct kvm_stats *st);
/* Drop every cached block from the prefix cache (they become free). Used blocks keep their
   registration. */
void kvm_cache_reset(struct kvm *m);

/* For tests and debugging: a block's refcount (-1 for an id out of range), and a full
   consistency check of lists, map and counters (WELD_ERR_INTERNAL describing the first
   violation). */
int kvm_block_ref(const struct kvm *m, int block);
int kvm_check(const struct kvm *m, struct weld_err *e);

#endif
