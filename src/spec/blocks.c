/*
 * blocks - fingerprints and per-pass claims of a model proposer's KV blocks (blocks.h).
 *
 * Claims use a pass stamp per block (wpass: written by an entry of this pass, rpass: in
 * some entry's table) instead of clearing arrays, so a claim costs O(the entry's blocks).
 * The first entry of a pass always claims: every pass makes progress.
 */
#include "spec/blocks.h"

#include "core/alloc.h"

#include <string.h>
#include <xxhash.h>

struct spec_seq *spec_seq_for(void *states, int n, size_t stride, uint64_t key, bool *fresh)
{
    struct spec_seq *pick = NULL;
    *fresh = false;
    for (int i = 0; i < n; i++) {
        struct spec_seq *s = (struct spec_seq *)((char *)states + (size_t)i * stride);
        if (s->used && s->key == key)
            return s;
        if (s->ask >= 0)
            continue;
        if (!pick || (pick->used && (!s->used || s->last_use < pick->last_use)))
            pick = s;
    }
    if (pick) {
        pick->used = true, pick->key = key;
        pick->tail_from = pick->tail_end = pick->n_cp = 0;
        *fresh = true;
    }
    return pick;
}

void spec_take_guess(struct spec_ask *q, const float *lg, int n_vocab)
{
    int b = 0;
    for (int i = 1; i < n_vocab; i++)
        if (lg[i] > lg[b])
            b = i;
    if (q->logits)
        memcpy(q->logits + (size_t)q->n_out * (size_t)n_vocab, lg, sizeof(float) * (size_t)n_vocab);
    q->out[q->n_out++] = b;
}

bool spec_blocks_init(struct spec_blocks *k, int n_pool, int bsz)
{
    memset(k, 0, sizeof *k);
    k->bsz = bsz, k->n_pool = n_pool;
    k->fp = wcalloc((size_t)n_pool + 1, sizeof *k->fp);
    k->fpx = wcalloc((size_t)n_pool + 1, sizeof *k->fpx);
    k->wpass = wcalloc((size_t)n_pool + 1, sizeof *k->wpass);
    k->rpass = wcalloc((size_t)n_pool + 1, sizeof *k->rpass);
    return k->fp && k->fpx && k->wpass && k->rpass;
}

void spec_blocks_free(struct spec_blocks *k)
{
    wfree(k->fp);
    wfree(k->fpx);
    wfree(k->wpass);
    wfree(k->rpass);
    memset(k, 0, sizeof *k);
}

void spec_blocks_next_pass(struct spec_blocks *k)
{
    if (++k->pass == 0) { /* stamps wrapped */
        memset(k->wpass, 0, sizeof(uint32_t) * (size_t)k->n_pool);
        memset(k->rpass, 0, sizeof(uint32_t) * (size_t)k->n_pool);
        k->pass = 1;
    }
}

void spec_blocks_fingerprints(const struct spec_blocks *k, const int32_t *tokens, int b, int extra,
                              uint64_t *fp, int *n_fp)
{
    for (int j = *n_fp; j < b; j++) {
        uint64_t h = XXH3_64bits_withSeed(tokens + (size_t)j * k->bsz,
                                          sizeof(int32_t) * (size_t)(k->bsz + extra),
                                          j ? fp[j - 1] : 0x5eedULL + (uint64_t)extra);
        fp[j] = h ? h : 1;
    }
    *n_fp = b > *n_fp ? b : *n_fp;
}

bool spec_blocks_table(const struct spec_blocks *k, const int32_t *blocks, int b, int slot,
                       int32_t *tab)
{
    for (int j = 0; j < b; j++) {
        if (blocks[j] < 0 || blocks[j] >= k->n_pool)
            return false;
        tab[j] = blocks[j];
    }
    for (int i = 0; i < 2; i++)
        tab[b + i] = k->n_pool + 2 * slot + (b + i) % 2;
    return true;
}

int spec_blocks_start(struct spec_seq *s, const int32_t *tab, int b, int ok, int bsz)
{
    const int32_t scratch0 = tab[b] - b % 2; /* the state's scratch pair */
    s->n_cp = 0, s->w0 = ok;
    /* tail blocks the target has computed since: copied in (a part the tail holds is then
       fed on from its end) */
    for (int j = ok; j < b && s->n_cp < 2 && j * bsz >= s->tail_from && j * bsz < s->tail_end;
         j++) {
        s->cp[s->n_cp++] = (struct kv_block_copy){scratch0 + j % 2, tab[j]};
        if ((j + 1) * bsz > s->tail_end)
            return s->tail_end;
        ok = j + 1;
    }
    if (ok == b && s->tail_from <= b * bsz && s->tail_end > b * bsz)
        return s->tail_end;
    return ok * bsz;
}

bool spec_blocks_join(struct spec_blocks *k, struct spec_seq *s, const int32_t *tab, int b, int pos,
                      int n, struct kv_block_copy *cps, int *n_cps)
{
    int from = s->n_cp && s->w0 * k->bsz < pos ? s->w0 * k->bsz : pos;
    if (!spec_blocks_claim(k, tab, b, from, pos + n - from))
        return false;
    for (int i = 0; i < s->n_cp; i++)
        cps[(*n_cps)++] = s->cp[i];
    return true;
}

void spec_blocks_ran(struct spec_blocks *k, struct spec_seq *s, const int32_t *tab,
                     const uint64_t *fp, const uint64_t *fpx, int b, int from, int to, int tail_to)
{
    if (s->n_cp && s->w0 * k->bsz < from)
        from = s->w0 * k->bsz;
    s->n_cp = 0, s->w0 = b;
    spec_blocks_written(k, tab, fp, fpx, b, from, to);
    if (tail_to > b * k->bsz)
        s->tail_from = b * k->bsz, s->tail_end = tail_to;
}

int spec_blocks_valid_until(const struct spec_blocks *k, const int32_t *tab, const uint64_t *fp,
                            int j, int b)
{
    while (j < b && tab[j] >= 0 && tab[j] < k->n_pool && k->fp[tab[j]] == fp[j])
        j++;
    return j;
}

bool spec_blocks_claim(struct spec_blocks *k, const int32_t *tab, int b, int pos, int n)
{
    const int used = (pos + n + k->bsz - 1) / k->bsz, eng = used < b ? used : b;
    const int w0 = pos / k->bsz;
    for (int j = 0; j < eng; j++) {
        int32_t x = tab[j];
        if (k->wpass[x] == k->pass || (j >= w0 && k->rpass[x] == k->pass))
            return false;
    }
    for (int j = 0; j < eng; j++) {
        k->rpass[tab[j]] = k->pass;
        if (j >= w0) {
            k->wpass[tab[j]] = k->pass;
            k->fp[tab[j]] = k->fpx[tab[j]] = 0; /* until the pass has written it */
        }
    }
    return true;
}

void spec_blocks_written(struct spec_blocks *k, const int32_t *tab, const uint64_t *fp,
                         const uint64_t *fpx, int b, int from, int to)
{
    for (int j = from / k->bsz; j < b && (j + 1) * k->bsz <= to; j++)
        if ((j + 1) * k->bsz > from) {
            k->fp[tab[j]] = fp[j];
            k->fpx[tab[j]] = fpx ? fpx[j] : fp[j];
        }
}
