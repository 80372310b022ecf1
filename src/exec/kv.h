/*
 * kv - the paged key/value cache.
 *
 * Storage: a pool of n_blocks fixed-size blocks (block_size token slots, 16 by default),
 * shared by all sequences; each layer has its own K and V plane for every block:
 *     k, v: (n_layer, n_blocks, block_size, kv_dim) f32,  kv_dim = n_kv_head * head_dim
 * so one block of one layer is a contiguous (block_size, kv_dim) tile. Element type is f32
 * for now; `type` is recorded so f16/bf16/q8_0 blocks can come later without changing the
 * interface (rows would then be read through a converter, not as float *).
 *
 * Mapping: each sequence (seq id in [0, max_seqs)) has a block table: position p lives in
 * block table[p / block_size], slot p % block_size. Executors only ever see that mapping
 * (kv_k_row / kv_v_row), never how blocks are chosen, so the KV block manager of a later
 * issue (refcounts, prefix hashing, LRU) can take over allocation behind this interface.
 *
 * Allocation: a plain free list (a stack of block ids). kv_seq_prepare() makes room for a
 * step's tokens all-or-nothing: it fails with WELD_ERR_LIMIT, changing nothing, when the
 * pool is too small, so running out is a scheduler decision, never a crash.
 *
 * Invariants: every block is either on the free list or in exactly one block table;
 * seq->n_blocks == ceil(seq->n_pos / block_size).
 * Threading: none inside; executors write distinct (layer, position) rows concurrently.
 */
#ifndef WELD_EXEC_KV_H
#define WELD_EXEC_KV_H

#include "core/err.h"
#include "format/dtype.h"

#include <stddef.h>
#include <stdint.h>

#define KV_DEFAULT_BLOCK_SIZE 16

struct kv_config {
    int n_layer;
    int kv_dim;         /* n_kv_head * head_dim */
    int max_seqs;
    int max_ctx;        /* positions per sequence */
    int block_size;     /* 0: KV_DEFAULT_BLOCK_SIZE */
    int n_blocks;       /* 0: enough for max_seqs full sequences */
    enum weld_dtype type; /* DT_F32 only for now */
};

struct kv_seq {
    int *blocks;        /* (max_blocks_per_seq) block ids; first n_blocks used */
    int n_blocks;
    int n_pos;          /* positions [0, n_pos) hold keys/values */
};

struct kv_cache {
    int n_layer, kv_dim, max_seqs, max_ctx, block_size, n_blocks;
    int max_blocks_per_seq; /* ceil(max_ctx / block_size) */
    enum weld_dtype type;
    float *k, *v;       /* (n_layer, n_blocks, block_size, kv_dim) */
    int *free_ids;      /* (n_blocks) stack; first n_free are free */
    int n_free;
    int *table_mem;     /* (max_seqs, max_blocks_per_seq) backing for seqs[].blocks */
    struct kv_seq *seqs; /* (max_seqs) */
};

int kv_create(struct kv_cache **out, const struct kv_config *cfg, struct weld_err *e);
void kv_free(struct kv_cache *kv);

/* Positions held for seq (0 for an unknown seq id). */
int kv_seq_len(const struct kv_cache *kv, int seq);
/* Make seq hold positions [0, pos + n): truncate it to pos (pos must be <= its length),
   then take blocks for [pos, pos + n). All-or-nothing; WELD_ERR_LIMIT when out of blocks
   or past max_ctx. The new positions' contents are undefined until written. */
int kv_seq_prepare(struct kv_cache *kv, int seq, int pos, int n, struct weld_err *e);
/* Net blocks kv_seq_prepare(seq, pos, n) would take from the pool (negative: it frees
   some); seq must be a valid id and pos <= its length. For all-or-nothing batch checks. */
int kv_seq_blocks_needed(const struct kv_cache *kv, int seq, int pos, int n);
/* Keep only positions [0, n_pos) of seq, freeing blocks past it. */
void kv_seq_truncate(struct kv_cache *kv, int seq, int n_pos);
/* Forget seq entirely (its blocks return to the pool). Unknown ids are ignored. */
void kv_seq_drop(struct kv_cache *kv, int seq);
/* Drop every sequence. */
void kv_reset(struct kv_cache *kv);
int kv_n_free_blocks(const struct kv_cache *kv);

/* The K (or V) row (kv_dim floats) of seq at pos in layer; pos < kv_seq_len(seq). */
static inline float *kv_row(const struct kv_cache *kv, float *plane, int layer, int seq,
                            int pos)
{
    const struct kv_seq *s = &kv->seqs[seq];
    size_t blk = (size_t)s->blocks[pos / kv->block_size];
    size_t idx = ((size_t)layer * (size_t)kv->n_blocks + blk) * (size_t)kv->block_size +
                 (size_t)(pos % kv->block_size);
    return plane + idx * (size_t)kv->kv_dim;
}
static inline float *kv_k_row(const struct kv_cache *kv, int layer, int seq, int pos)
{
    return kv_row(kv, kv->k, layer, seq, pos);
}
static inline float *kv_v_row(const struct kv_cache *kv, int layer, int seq, int pos)
{
    return kv_row(kv, kv->v, layer, seq, pos);
}

#endif
