/*
 * kv - the paged key/value cache: a pool of physical blocks, and who places sequences in it.
 *
 * Storage: a pool of n_blocks fixed-size blocks (block_size token slots, 16 by default),
 * indexed by physical block id in [0, n_blocks); each layer has its own K and V plane.
 * One KV head's keys (values) for a block's positions are one contiguous run of
 * block_size * head_bytes bytes (a tile: 2 KiB for f16 heads of 64), and the heads are cut
 * into n_groups head groups (group g: heads [g * n_kv_head / G, (g + 1) * n_kv_head / G)),
 * laid out as
 *     k, v: (n_layer, head group, n_blocks, head in group, block_size, head_bytes)
 * so a group's tiles of one block follow one another, and a group's blocks of consecutive
 * ids (the block managers hand them out in increasing order) follow one another too: a
 * group's keys over a sequence are one stream. The groups are the program's attention
 * head ranges (program.c attn_pieces: a sequence's attention is cut into up to
 * min(n_splits, n_kv_head) KV-head ranges with the same bounds; the backend makes the
 * cache with G = n_splits, clamped here), so:
 *   - one sequence's decode, its heads split across the workers: each worker streams its
 *     own group (block-major, G = 1, left each worker half of every block's tiles, 12 KiB
 *     islands of each 24 KiB on the 110M model, at a fraction of the streaming speed);
 *   - a batched decode, whose attention instruction takes all heads of a sequence: G
 *     streams, walked group after group (ops.c attend_tile), each as long as the
 *     sequence (per-head, G = n_kv_head, gave n_kv_head short streams: 16 sequences at a
 *     context of 512, 0.86-0.88x of block-major).
 * G = 1 is block-major (layer, block, head, slot), G = n_kv_head per-head (layer, head,
 * block, slot). Measured with `weld bench --pair` in both orders, 110M Q8_0, 2 workers
 * (G = 2) against tuning kv_groups (exec/backend_cpu.c): one sequence at a context of 1536,
 * 1.17-1.24x block-major and equal to per-head (0.985x, 1.003x); 16 sequences at 512,
 * 0.96x block-major (0.955-0.989x over four runs) and 1.12-1.15x per-head. Before, a
 * cache of one sequence was per-head and one of several block-major, so a server (several
 * slots) serving one long-context user read it block-major. A block copy (copy-on-write)
 * moves n_layer * G runs. A block id means the same slots in every layer. kv_dim =
 * n_kv_head * head_dim; row_bytes = bytes of kv_dim elements.
 *
 * Memory: the planes are anonymous mappings; creation touches the pages of the lowest
 * block ids (which both allocators hand out first) up to kv_config.prefault_bytes (256 MiB
 * by default, the whole pool when smaller), so a worst-case-sized pool starts in time and
 * resident memory proportional to that budget and grows with use beyond it.
 *
 * Latent caches (kv_config.latent, multi-head latent attention): one plane of one "head"
 * per position (the compressed KV row and the shared rope key), read as both key and
 * value; v aliases k and copies move it once.
 *
 * Element types (kv_config.type): f16 (the engine's default), bf16, f32, q8_0. Entries are
 * written one (position, head) at a time by kv_write_head() with the dtype
 * converters/quantizers (format/dtype.h, round to nearest even for f16/bf16, llama.cpp's
 * reference q8_0), and read by kv_read_head() into f32 (in place for f32) or in place by
 * the attention kernel. q8_0 uses ggml's block layout (32 elements: f16 scale + 32 int8)
 * along the head and needs head_dim to be a multiple of 32. A position's stored bytes
 * depend only on its own f32 values, so every KV type keeps the batch invariants
 * (kernels/cpu/kernels.h).
 *
 * Placement, two modes (one per cache at a time; kv_reset returns to neither):
 *   - engine tables (the primary design): the engine's KV block manager (refcounts, prefix
 *     hashing, LRU, copy-on-write) owns allocation; each step's batch carries every
 *     sequence's table of physical ids (batch.h) and the backend only reads and writes the
 *     slots those tables name, after kv_check_tables() proved them in range and free of
 *     write conflicts. Nothing about those sequences is remembered here between steps.
 *   - internal allocator (callers without a manager: the CLI, tests): each seq id in
 *     [0, max_seqs) has a table kept here, filled from a free-list stack by
 *     kv_seq_prepare(), which is all-or-nothing: WELD_ERR_LIMIT, changing nothing, when the
 *     pool is too small, so running out is a caller decision, never a crash.
 * Executors see only tables (kv_pos_head()), never how they were chosen.
 *
 * Invariants (internal mode): every block is either on the free list or in exactly one
 * seq table; seq->n_blocks == ceil(seq->n_pos / block_size).
 * Threading: none inside; executors write distinct (layer, position, head) rows
 * concurrently, which is safe because heads never share a q8_0 block.
 */
#ifndef WELD_EXEC_KV_H
#define WELD_EXEC_KV_H

#include "core/err.h"
#include "exec/batch.h"
#include "format/dtype.h"
#include "model/config.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define KV_DEFAULT_BLOCK_SIZE 16
#define KV_DEFAULT_TYPE DT_F16
#define KV_PREFAULT_BYTES ((size_t)256 << 20)

struct kv_config {
    int n_layer;
    int kv_dim;         /* n_kv_head * head_dim */
    int head_dim;       /* 0: kv_dim (one head); q8_0 needs a multiple of 32 */
    int max_seqs;
    int max_ctx;        /* positions per sequence */
    int block_size;     /* 0: KV_DEFAULT_BLOCK_SIZE */
    int n_groups;       /* head groups of the layout, clamped to [1, n_kv_head]; 0: one
                           per head if max_seqs == 1, else 1 */
    int n_blocks;       /* 0: enough for max_seqs full sequences */
    enum weld_dtype type; /* DT_F32, DT_F16, DT_BF16 or DT_Q8_0 */
    size_t prefault_bytes; /* pages touched at creation, lowest block ids first; 0:
                              KV_PREFAULT_BYTES. The rest fault in on first use. */
    bool latent;           /* one plane: keys only, v aliases k (latent attention caches a
                           compressed row per position that is its key and its value) */
    int layer0;            /* the first layer held: a pipeline stage's cache holds layers
                              [layer0, layer0 + n_layer), addressed by the model's layer
                              numbers (0: from the first) */
    int head0;             /* the first KV head held: a tensor-parallel shard holds heads
                              [head0, head0 + kv_dim / head_dim) of the model and is
                              addressed by the model's head numbers (0: from the first) */
};

struct kv_seq {
    int32_t *blocks;    /* (max_blocks_per_seq) block ids; first n_blocks used */
    int n_blocks;
    int n_pos;          /* positions [0, n_pos) hold keys/values */
};

struct kv_cache {
    int n_layer, kv_dim, head_dim, max_seqs, max_ctx, block_size, n_blocks;
    int max_blocks_per_seq; /* ceil(max_ctx / block_size) */
    enum weld_dtype type;
    size_t row_bytes;   /* bytes of one kv_dim row */
    size_t head_bytes;  /* bytes of one head_dim slice of a row */
    int n_kv_head;      /* kv_dim / head_dim: the heads held */
    int layer0;         /* the model's number of the first layer held (kv_config.layer0) */
    int head0;          /* the model's number of the first (kv_config.head0); the arrays
                           below are indexed by head - head0 */
    int n_groups;       /* head groups of the layout, see above */
    size_t *head_run0;  /* (n_kv_head) per head: its tile's index in block 0 of layer 0 */
    int *head_stride;   /* (n_kv_head) tiles from one block to the next: its group's size */
    int *head_group_end; /* (n_kv_head) first head past its group (minus head0; use
                            kv_group_end) */
    uint8_t *k, *v;      /* per the layout (block_size, head_bytes innermost),
                           wmap_huge mappings; latent: v == k */
    bool latent;
    size_t plane_bytes; /* bytes of each */
    int32_t *free_ids;  /* (n_blocks) stack; first n_free are free */
    int n_free;
    int32_t *table_mem; /* (max_seqs, max_blocks_per_seq) backing for seqs[].blocks */
    struct kv_seq *seqs; /* (max_seqs) */
    bool external;      /* an engine-table batch ran since the last reset */
    uint32_t gen;       /* kv_check_tables: current stamp for the marks below */
    uint32_t *use_gen, *write_gen; /* (n_blocks) stamps */
    int32_t *use_seq, *write_seq;  /* (n_blocks) batch seq that last used / writes a block */
};

int kv_create(struct kv_cache **out, const struct kv_config *cfg, struct weld_err *e);
void kv_free(struct kv_cache *kv);

/* Bytes one block takes in the pool (K and V, or K alone when latent, every layer) for
   this shape and type; 0 if the type is not a KV type or head_dim does not suit it, or
   on overflow. */
size_t kv_block_bytes(int n_layer, int kv_dim, int head_dim, int block_size, enum weld_dtype type,
                      bool latent);
/* The cache shape model config c needs: kv_dim and head_dim of a position's row, and
   whether it is latent (MLA: one head of kv_lora_rank + rope_dim, keys only). */
void kv_shape_for(const struct model_config *c, int *kv_dim, int *head_dim, bool *latent);

/* True if type can hold KV entries of heads of head_dim elements. */
bool kv_type_supported(enum weld_dtype type, int head_dim);

/* ---- engine tables --------------------------------------------------------------------- */

/* Check a validated batch with engine tables against this pool: every used block id in
   [0, n_blocks), enough entries for pos + n_tokens, no block listed twice in one table,
   no block written by one sequence (positions >= pos) and used by another, copies in
   range with src != dst. Also the mode rule: fails if the internal allocator holds
   blocks. WELD_ERR_INVALID_ARG naming the batch seq, table index and block. */
int kv_check_tables(struct kv_cache *kv, const struct batch *b, struct weld_err *e);
/* Copy block src to dst in every layer, K and V (ids already checked). */
void kv_copy_block(struct kv_cache *kv, int32_t src, int32_t dst);
/* A block's whole contents (every layer held, K then V, each head's block_size slots) in
   an order that does not depend on the layout's head groups, so a block saved from one
   cache loads into any cache of the same model, shard and type: kv_block_io_bytes bytes
   (equal to kv_block_bytes of the shape). The KV tier (kvtier/) stores these. */
size_t kv_block_io_bytes(const struct kv_cache *kv);
void kv_block_save(struct kv_cache *kv, int32_t block, void *dst);
void kv_block_load(struct kv_cache *kv, int32_t block, const void *src);

/* ---- internal allocator ---------------------------------------------------------------- */

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
/* Drop every sequence and leave engine-table mode. */
void kv_reset(struct kv_cache *kv);
int kv_n_free_blocks(const struct kv_cache *kv);

/* ---- rows ------------------------------------------------------------------------------ */

/* Start of head `head` (head_bytes bytes) of (layer, physical block, slot) in plane k
   or v. */
static inline uint8_t *kv_slot_head(const struct kv_cache *kv, uint8_t *plane, int layer,
                                    int32_t block, int slot, int head)
{
    head -= kv->head0;
    layer -= kv->layer0;
    const size_t tiles = (size_t)layer * (size_t)kv->n_kv_head * (size_t)kv->n_blocks +
                         kv->head_run0[head] + (size_t)block * (size_t)kv->head_stride[head];
    size_t idx = tiles * (size_t)kv->block_size + (size_t)slot;
    return plane + idx * kv->head_bytes;
}
/* The model's number of the first head past head's group. */
static inline int kv_group_end(const struct kv_cache *kv, int head)
{
    return kv->head0 + kv->head_group_end[head - kv->head0];
}
/* Head `head` of position pos of a sequence whose block table is `table`. */
static inline uint8_t *kv_pos_head(const struct kv_cache *kv, uint8_t *plane, int layer,
                                   const int32_t *table, int pos, int head)
{
    return kv_slot_head(kv, plane, layer, table[pos / kv->block_size], pos % kv->block_size,
                        head);
}
/* Store head_dim f32 values at dst (from kv_pos_head), converting to the cache type. */
void kv_write_head(const struct kv_cache *kv, uint8_t *dst, const float *src);
/* The head_dim values at src (from kv_pos_head) as f32: in place for f32, else converted
   into buf (head_dim). */
const float *kv_read_head(const struct kv_cache *kv, const uint8_t *src, float *buf);

#endif
