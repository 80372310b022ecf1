/*
 * kv - the paged KV cache's pool, its row converters, engine-table checks and the internal
 * allocator (design in kv.h).
 *
 * The free list is a stack so the most recently freed (cache-warm) block is reused first.
 * Sizes are checked for overflow before anything is allocated. kv_check_tables marks
 * blocks with a per-call stamp (use_gen / write_gen) instead of clearing arrays, so a check
 * costs O(blocks the batch uses), not O(pool).
 */
#include "exec/kv.h"

#include "core/alloc.h"
#include "kernels/cpu/kernels.h"

#include <limits.h>
#include <string.h>

bool kv_type_supported(enum weld_dtype type, int head_dim)
{
    switch (type) {
    case DT_F32:
    case DT_F16:
    case DT_BF16:
        return head_dim >= 1;
    case DT_Q8_0:
        return head_dim >= 32 && head_dim % 32 == 0;
    default:
        return false;
    }
}

void kv_shape_for(const struct model_config *c, int *kv_dim, int *head_dim, bool *latent)
{
    *latent = c->kv_lora_rank > 0;
    *head_dim = *latent ? c->kv_lora_rank + c->rope_dim : c->head_dim;
    *kv_dim = *latent ? *head_dim : c->n_kv_head * c->head_dim;
}

size_t kv_block_bytes(int n_layer, int kv_dim, int head_dim, int block_size, enum weld_dtype type,
                      bool latent)
{
    if (n_layer < 1 || kv_dim < 1 || block_size < 1 || head_dim < 1 || kv_dim % head_dim ||
        !kv_type_supported(type, head_dim))
        return 0;
    size_t row = dtype_row_bytes(type, kv_dim), n = (latent ? 1 : 2) * (size_t)n_layer;
    if (!row || n > SIZE_MAX / (size_t)block_size || n * (size_t)block_size > SIZE_MAX / row)
        return 0;
    return n * (size_t)block_size * row;
}

static int check_config(const struct kv_config *c, int bs, struct weld_err *e)
{
    if (c->n_layer < 1 || c->kv_dim < 1 || c->max_seqs < 1 || c->max_ctx < 1)
        return err_set(e, WELD_ERR_INVALID_ARG,
                       "kv cache: n_layer %d, kv_dim %d, max_seqs %d, max_ctx %d must be >= 1",
                       c->n_layer, c->kv_dim, c->max_seqs, c->max_ctx);
    if (bs < 1 || bs > 4096)
        return err_set(e, WELD_ERR_INVALID_ARG, "kv cache: block_size %d not in [1, 4096]", bs);
    if (c->n_blocks < 0)
        return err_set(e, WELD_ERR_INVALID_ARG, "kv cache: n_blocks %d < 0", c->n_blocks);
    int hd = c->head_dim ? c->head_dim : c->kv_dim;
    if (hd < 1 || c->kv_dim % hd)
        return err_set(e, WELD_ERR_INVALID_ARG, "kv cache: kv_dim %d is not a multiple of "
                       "head_dim %d", c->kv_dim, hd);
    if (c->type != DT_F32 && c->type != DT_F16 && c->type != DT_BF16 && c->type != DT_Q8_0)
        return err_set(e, WELD_ERR_UNSUPPORTED, "kv cache: element type %s not supported "
                       "(f32, f16, bf16, q8_0)", dtype_name(c->type));
    if (!kv_type_supported(c->type, hd))
        return err_set(e, WELD_ERR_UNSUPPORTED, "kv cache: %s needs head_dim to be a "
                       "multiple of 32 (quantization blocks must not straddle heads); "
                       "head_dim is %d", dtype_name(c->type), hd);
    return WELD_OK;
}

/* Touch every page of [p, p + n) once (the kernel zeroes it then), so the steps that first
   write K/V there do not pay the page faults (measured: ~8% of a 16 x 640-token batch run,
   2 MiB huge-page faults being slow in a VM). */
static void prefault(uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i += 4096)
        ((volatile uint8_t *)p)[i] = 0;
    if (n)
        ((volatile uint8_t *)p)[n - 1] = 0;
}

/* Prefault the first n_pre blocks of every (layer, head group) run of a plane: the blocks
   handed out first (both block managers give out low ids first). Beyond them pages fault on
   first use, so a pool sized for the worst case costs start-up time and resident memory
   only as far as it is used (a 110M model's 2.3 GiB default pool took seconds to touch). */
static void prefault_blocks(const struct kv_cache *kv, uint8_t *plane, int n_pre)
{
    if (n_pre >= kv->n_blocks) {
        prefault(plane, kv->plane_bytes);
        return;
    }
    size_t tile = (size_t)kv->block_size * kv->head_bytes;
    for (int l = 0; l < kv->n_layer; l++)
        for (int g = 0; g < kv->n_groups; g++) {
            int h0 = (int)((long long)g * kv->n_kv_head / kv->n_groups),
                h1 = (int)((long long)(g + 1) * kv->n_kv_head / kv->n_groups);
            size_t first = ((size_t)l * (size_t)kv->n_kv_head + (size_t)h0) *
                           (size_t)kv->n_blocks;
            prefault(plane + first * tile, (size_t)n_pre * (size_t)(h1 - h0) * tile);
        }
}

int kv_create(struct kv_cache **out, const struct kv_config *cfg, struct weld_err *e)
{
    *out = NULL;
    int bs = cfg->block_size ? cfg->block_size : KV_DEFAULT_BLOCK_SIZE;
    int rc = check_config(cfg, bs, e);
    if (rc)
        return rc;
    int per_seq = (int)(((long long)cfg->max_ctx + bs - 1) / bs);
    long long nb = cfg->n_blocks ? cfg->n_blocks : (long long)per_seq * cfg->max_seqs;
    if (nb > INT_MAX)
        return err_set(e, WELD_ERR_LIMIT, "kv cache: %lld blocks is too many", nb);
    int hd = cfg->head_dim ? cfg->head_dim : cfg->kv_dim;
    size_t row = dtype_row_bytes(cfg->type, cfg->kv_dim);
    /* bytes per plane = n_layer * nb * bs * row_bytes */
    size_t plane = (size_t)cfg->n_layer;
    size_t factors[3] = {(size_t)nb, (size_t)bs, row};
    for (int i = 0; i < 3; i++) {
        if (factors[i] && plane > SIZE_MAX / 2 / factors[i])
            return err_set(e, WELD_ERR_LIMIT, "kv cache: size overflows");
        plane *= factors[i];
    }
    struct kv_cache *kv = wcalloc(1, sizeof *kv);
    if (!kv)
        goto nomem;
    kv->n_layer = cfg->n_layer;
    kv->kv_dim = cfg->kv_dim;
    kv->max_seqs = cfg->max_seqs;
    kv->max_ctx = cfg->max_ctx;
    kv->block_size = bs;
    kv->n_blocks = (int)nb;
    kv->max_blocks_per_seq = per_seq;
    kv->head_dim = hd;
    kv->type = cfg->type;
    kv->row_bytes = row;
    kv->head_bytes = dtype_row_bytes(cfg->type, hd);
    kv->n_kv_head = cfg->kv_dim / hd;
    kv->head0 = cfg->head0;
    kv->layer0 = cfg->layer0;
    size_t nbs = nb ? (size_t)nb : 1;
    kv->plane_bytes = plane;
    int G = cfg->n_groups ? cfg->n_groups : cfg->max_seqs == 1 ? kv->n_kv_head : 1;
    kv->n_groups = G < 1 ? 1 : G > kv->n_kv_head ? kv->n_kv_head : G;
    kv->head_run0 = wcalloc((size_t)kv->n_kv_head, sizeof *kv->head_run0);
    kv->head_stride = wcalloc((size_t)kv->n_kv_head, sizeof *kv->head_stride);
    kv->head_group_end = wcalloc((size_t)kv->n_kv_head, sizeof *kv->head_group_end);
    if (!kv->head_run0 || !kv->head_stride || !kv->head_group_end)
        goto nomem;
    for (int g = 0; g < kv->n_groups; g++) {
        const int h0 = (int)((long long)g * kv->n_kv_head / kv->n_groups),
                  h1 = (int)((long long)(g + 1) * kv->n_kv_head / kv->n_groups);
        for (int h = h0; h < h1; h++) {
            kv->head_run0[h] = (size_t)h0 * (size_t)kv->n_blocks + (size_t)(h - h0);
            kv->head_stride[h] = h1 - h0;
            kv->head_group_end[h] = h1;
        }
    }
    kv->latent = cfg->latent;
    kv->k = wmap_huge(plane);
    kv->v = kv->latent ? kv->k : wmap_huge(plane);
    kv->free_ids = wcalloc(nbs, sizeof(int32_t));
    kv->table_mem = wcalloc((size_t)cfg->max_seqs * (size_t)per_seq, sizeof(int32_t));
    kv->seqs = wcalloc((size_t)cfg->max_seqs, sizeof *kv->seqs);
    kv->use_gen = wcalloc(nbs, sizeof(uint32_t));
    kv->write_gen = wcalloc(nbs, sizeof(uint32_t));
    kv->use_seq = wcalloc(nbs, sizeof(int32_t));
    kv->write_seq = wcalloc(nbs, sizeof(int32_t));
    if (!kv->k || !kv->v || !kv->free_ids || !kv->table_mem || !kv->seqs || !kv->use_gen ||
        !kv->write_gen || !kv->use_seq || !kv->write_seq)
        goto nomem;
    for (int i = 0; i < cfg->max_seqs; i++)
        kv->seqs[i].blocks = kv->table_mem + (size_t)i * (size_t)per_seq;
    size_t budget = cfg->prefault_bytes ? cfg->prefault_bytes : KV_PREFAULT_BYTES;
    size_t per_block = (kv->latent ? 1 : 2) * plane / (size_t)nbs; /* k + v, all layers */
    int n_pre = per_block ? (int)(budget / per_block < (size_t)nb ? budget / per_block
                                                                  : (size_t)nb) : 0;
    prefault_blocks(kv, kv->k, n_pre);
    if (!kv->latent)
        prefault_blocks(kv, kv->v, n_pre);
    kv_reset(kv);
    *out = kv;
    return WELD_OK;
nomem:
    kv_free(kv);
    return err_set(e, WELD_ERR_NOMEM, "kv cache: out of memory for %lld blocks of %d x %d "
                   "%s in %d layers", nb, bs, cfg->kv_dim, dtype_name(cfg->type),
                   cfg->n_layer);
}

void kv_free(struct kv_cache *kv)
{
    if (!kv)
        return;
    if (kv->v != kv->k)
        wunmap(kv->v, kv->plane_bytes);
    wunmap(kv->k, kv->plane_bytes);
    wfree(kv->free_ids);
    wfree(kv->table_mem);
    wfree(kv->seqs);
    wfree(kv->use_gen);
    wfree(kv->write_gen);
    wfree(kv->use_seq);
    wfree(kv->write_seq);
    wfree(kv->head_run0);
    wfree(kv->head_stride);
    wfree(kv->head_group_end);
    wfree(kv);
}

void kv_reset(struct kv_cache *kv)
{
    /* Push in reverse so block 0 is handed out first (reproducible layouts in tests). */
    for (int i = 0; i < kv->n_blocks; i++)
        kv->free_ids[i] = kv->n_blocks - 1 - i;
    kv->n_free = kv->n_blocks;
    for (int i = 0; i < kv->max_seqs; i++) {
        kv->seqs[i].n_blocks = 0;
        kv->seqs[i].n_pos = 0;
    }
    kv->external = false;
}

int kv_n_free_blocks(const struct kv_cache *kv) { return kv->n_free; }

int kv_seq_len(const struct kv_cache *kv, int seq)
{
    if (seq < 0 || seq >= kv->max_seqs)
        return 0;
    return kv->seqs[seq].n_pos;
}

void kv_seq_truncate(struct kv_cache *kv, int seq, int n_pos)
{
    if (seq < 0 || seq >= kv->max_seqs || n_pos < 0)
        return;
    struct kv_seq *s = &kv->seqs[seq];
    if (n_pos >= s->n_pos)
        return;
    int keep = (n_pos + kv->block_size - 1) / kv->block_size;
    while (s->n_blocks > keep)
        kv->free_ids[kv->n_free++] = s->blocks[--s->n_blocks];
    s->n_pos = n_pos;
}

void kv_seq_drop(struct kv_cache *kv, int seq) { kv_seq_truncate(kv, seq, 0); }

int kv_seq_blocks_needed(const struct kv_cache *kv, int seq, int pos, int n)
{
    const struct kv_seq *s = &kv->seqs[seq];
    int need = (int)(((long long)pos + n + kv->block_size - 1) / kv->block_size);
    return need - s->n_blocks;
}

int kv_seq_prepare(struct kv_cache *kv, int seq, int pos, int n, struct weld_err *e)
{
    if (seq < 0 || seq >= kv->max_seqs)
        return err_set(e, WELD_ERR_INVALID_ARG, "kv cache: seq id %d out of range [0, %d)",
                       seq, kv->max_seqs);
    struct kv_seq *s = &kv->seqs[seq];
    if (pos < 0 || n < 0 || pos > s->n_pos)
        return err_set(e, WELD_ERR_INVALID_ARG,
                       "kv cache: seq %d holds %d positions; cannot continue at pos %d", seq,
                       s->n_pos, pos);
    if ((long long)pos + n > kv->max_ctx)
        return err_set(e, WELD_ERR_LIMIT, "kv cache: seq %d: position %lld past max_ctx %d",
                       seq, (long long)pos + n - 1, kv->max_ctx);
    int more = kv_seq_blocks_needed(kv, seq, pos, n);
    if (more > kv->n_free)
        return err_set(e, WELD_ERR_LIMIT,
                       "kv cache: seq %d needs %d more blocks for positions %d..%d, %d free",
                       seq, more, pos, pos + n - 1, kv->n_free);
    int need = s->n_blocks + more;
    kv_seq_truncate(kv, seq, pos);
    while (s->n_blocks < need)
        s->blocks[s->n_blocks++] = kv->free_ids[--kv->n_free];
    s->n_pos = pos + n;
    return WELD_OK;
}

/* ---- rows ------------------------------------------------------------------------------ */

void kv_write_head(const struct kv_cache *kv, uint8_t *dst, const float *src)
{
    dtype_quantize_row(kv->type, src, dst, kv->head_dim);
}

const float *kv_read_head(const struct kv_cache *kv, const uint8_t *src, float *buf)
{
    return kern_row_f32(kv->type, src, kv->head_dim, buf);
}

void kv_copy_block(struct kv_cache *kv, int32_t src, int32_t dst)
{
    /* a block's tiles of one head group are one run */
    for (int l = 0; l < kv->n_layer; l++)
        for (int h = 0; h < kv->n_kv_head; h = kv->head_group_end[h]) {
            const size_t run = (size_t)kv->block_size * kv->head_bytes *
                               (size_t)kv->head_stride[h];
            /* kv_slot_head takes the model's numbers */
            const int gh = kv->head0 + h, gl = kv->layer0 + l;
            memcpy(kv_slot_head(kv, kv->k, gl, dst, 0, gh), kv_slot_head(kv, kv->k, gl, src, 0, gh),
                   run);
            if (!kv->latent)
                memcpy(kv_slot_head(kv, kv->v, gl, dst, 0, gh),
                       kv_slot_head(kv, kv->v, gl, src, 0, gh), run);
        }
}

/* Canonical order of a block's bytes: layer, then K and V (K alone when latent), then head,
   slot. A head group's tiles of one block are one run in head order, so walking the groups
   visits the heads in order whatever the layout's n_groups. */
static void block_io(struct kv_cache *kv, int32_t block, uint8_t *buf, bool save)
{
    size_t off = 0;
    for (int l = 0; l < kv->n_layer; l++)
        for (int p = 0; p < (kv->latent ? 1 : 2); p++)
            for (int h = 0; h < kv->n_kv_head; h = kv->head_group_end[h]) {
                const size_t run = (size_t)kv->block_size * kv->head_bytes *
                                   (size_t)kv->head_stride[h];
                uint8_t *at = kv_slot_head(kv, p ? kv->v : kv->k, kv->layer0 + l, block, 0,
                                           kv->head0 + h);
                if (save)
                    memcpy(buf + off, at, run);
                else
                    memcpy(at, buf + off, run);
                off += run;
            }
}

size_t kv_block_io_bytes(const struct kv_cache *kv)
{
    return (size_t)kv->n_layer * (kv->latent ? 1u : 2u) * (size_t)kv->n_kv_head *
           (size_t)kv->block_size * kv->head_bytes;
}

void kv_block_save(struct kv_cache *kv, int32_t block, void *dst)
{
    block_io(kv, block, dst, true);
}

void kv_block_load(struct kv_cache *kv, int32_t block, const void *src)
{
    block_io(kv, block, (uint8_t *)(uintptr_t)src, false);
}

/* ---- engine tables --------------------------------------------------------------------- */

static int n_used_blocks(const struct kv_cache *kv, const struct batch_seq *s)
{
    return (int)(((long long)s->pos + s->n_tokens + kv->block_size - 1) / kv->block_size);
}

/* Pass 1 for batch seq i: ranges, duplicates within the table, writers marked. */
static int mark_seq(struct kv_cache *kv, const struct batch *bt, int i, struct weld_err *e)
{
    const struct batch_seq *s = &bt->seqs[i];
    int used = n_used_blocks(kv, s), first_write = s->pos / kv->block_size;
    if (s->n_blocks < used)
        return err_set(e, WELD_ERR_INVALID_ARG, "batch seq %d (id %d): block table has %d "
                       "entries; positions up to %d need %d blocks of %d", i, s->seq_id,
                       s->n_blocks, s->pos + s->n_tokens - 1, used, kv->block_size);
    for (int j = 0; j < used; j++) {
        int32_t b = s->blocks[j];
        if (b < 0 || b >= kv->n_blocks)
            return err_set(e, WELD_ERR_INVALID_ARG, "batch seq %d (id %d): block table entry "
                           "%d = %d is not a block id in [0, %d)", i, s->seq_id, j, (int)b,
                           kv->n_blocks);
        if (kv->use_gen[b] == kv->gen && kv->use_seq[b] == i)
            return err_set(e, WELD_ERR_INVALID_ARG, "batch seq %d (id %d): block %d appears "
                           "twice in its table (entry %d)", i, s->seq_id, (int)b, j);
        kv->use_gen[b] = kv->gen;
        kv->use_seq[b] = i;
        if (j < first_write)
            continue;
        if (kv->write_gen[b] == kv->gen)
            return err_set(e, WELD_ERR_INVALID_ARG, "batch seqs %d and %d (ids %d, %d) both "
                           "write block %d this step", (int)kv->write_seq[b], i,
                           bt->seqs[kv->write_seq[b]].seq_id, s->seq_id, (int)b);
        kv->write_gen[b] = kv->gen;
        kv->write_seq[b] = i;
    }
    return WELD_OK;
}

static int check_copies(const struct kv_cache *kv, const struct batch *b, struct weld_err *e)
{
    for (int i = 0; i < b->n_copies; i++) {
        int32_t src = b->copies[i].src, dst = b->copies[i].dst;
        if (src < 0 || src >= kv->n_blocks || dst < 0 || dst >= kv->n_blocks || src == dst)
            return err_set(e, WELD_ERR_INVALID_ARG, "batch: block copy %d (%d -> %d) needs two "
                           "different block ids in [0, %d)", i, (int)src, (int)dst,
                           kv->n_blocks);
        /* A copy target is a block its sequence is about to write (copy-on-write); one
           that is only read this step would change under a sequence's cached prefix. */
        if (!b->copies_fill && kv->use_gen[dst] == kv->gen && kv->write_gen[dst] != kv->gen)
            return err_set(e, WELD_ERR_INVALID_ARG, "batch: block copy %d (%d -> %d) "
                           "overwrites a block batch seq %d only reads this step", i,
                           (int)src, (int)dst, (int)kv->use_seq[dst]);
    }
    return WELD_OK;
}

int kv_check_tables(struct kv_cache *kv, const struct batch *b, struct weld_err *e)
{
    if (kv->n_free != kv->n_blocks)
        return err_set(e, WELD_ERR_INVALID_ARG, "kv cache: the internal allocator holds %d "
                       "blocks; a backend context takes engine block tables or internal "
                       "placement, not both (reset it first)", kv->n_blocks - kv->n_free);
    if (++kv->gen == 0) { /* stamps wrapped: clear them once */
        memset(kv->use_gen, 0, (size_t)kv->n_blocks * sizeof(uint32_t));
        memset(kv->write_gen, 0, (size_t)kv->n_blocks * sizeof(uint32_t));
        kv->gen = 1;
    }
    int rc;
    for (int i = 0; i < b->n_seqs; i++)
        if ((rc = mark_seq(kv, b, i, e)))
            return rc;
    /* Pass 2: nobody reads a block another sequence writes. */
    for (int i = 0; i < b->n_seqs; i++) {
        const struct batch_seq *s = &b->seqs[i];
        for (int j = 0, used = n_used_blocks(kv, s); j < used; j++) {
            int32_t blk = s->blocks[j];
            if (kv->write_gen[blk] == kv->gen && kv->write_seq[blk] != i)
                return err_set(e, WELD_ERR_INVALID_ARG, "batch seq %d (id %d): table entry "
                               "%d = block %d, which batch seq %d writes this step (copy it "
                               "first)", i, s->seq_id, j, (int)blk, (int)kv->write_seq[blk]);
        }
    }
    return check_copies(kv, b, e);
}
