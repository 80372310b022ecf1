/*
 * kv - the paged KV cache's pool and block tables (design in kv.h).
 *
 * The free list is a stack so the most recently freed (cache-warm) block is reused first.
 * Sizes are checked for overflow before anything is allocated.
 */
#include "exec/kv.h"

#include "core/alloc.h"

#include <limits.h>
#include <string.h>

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
    if (c->type != DT_F32)
        return err_set(e, WELD_ERR_UNSUPPORTED, "kv cache: element type %s not supported yet "
                       "(only f32)", dtype_name(c->type));
    return WELD_OK;
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
    /* floats per plane = n_layer * nb * bs * kv_dim, checked against SIZE_MAX / 4 */
    size_t plane = (size_t)cfg->n_layer;
    size_t factors[3] = {(size_t)nb, (size_t)bs, (size_t)cfg->kv_dim};
    for (int i = 0; i < 3; i++) {
        if (factors[i] && plane > SIZE_MAX / sizeof(float) / factors[i])
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
    kv->type = cfg->type;
    kv->k = wcalloc(plane ? plane : 1, sizeof(float));
    kv->v = wcalloc(plane ? plane : 1, sizeof(float));
    kv->free_ids = wcalloc(nb ? (size_t)nb : 1, sizeof(int));
    kv->table_mem = wcalloc((size_t)cfg->max_seqs * (size_t)per_seq, sizeof(int));
    kv->seqs = wcalloc((size_t)cfg->max_seqs, sizeof *kv->seqs);
    if (!kv->k || !kv->v || !kv->free_ids || !kv->table_mem || !kv->seqs)
        goto nomem;
    for (int i = 0; i < cfg->max_seqs; i++)
        kv->seqs[i].blocks = kv->table_mem + (size_t)i * (size_t)per_seq;
    kv_reset(kv);
    *out = kv;
    return WELD_OK;
nomem:
    kv_free(kv);
    return err_set(e, WELD_ERR_NOMEM, "kv cache: out of memory for %lld blocks of %d x %d "
                   "floats in %d layers", nb, bs, cfg->kv_dim, cfg->n_layer);
}

void kv_free(struct kv_cache *kv)
{
    if (!kv)
        return;
    wfree(kv->k);
    wfree(kv->v);
    wfree(kv->free_ids);
    wfree(kv->table_mem);
    wfree(kv->seqs);
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
