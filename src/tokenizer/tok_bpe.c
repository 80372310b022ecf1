/*
 * tok_bpe - the model stage: one pre-tokenized word -> ids.
 *
 * BPE by rank (Hugging Face models::bpe): the word starts as one symbol per character
 * (looked up with continuing_subword_prefix / end_of_word_suffix; unknown characters
 * become <0xXX> byte tokens with byte_fallback, else the unk token, fused when fuse_unk),
 * then the adjacent pair with the lowest merge rank (leftmost on ties) is merged until no
 * pair has a merge. A binary heap holds candidate merges; entries whose pair changed since
 * they were pushed are skipped when popped (the check HF makes: the pair still maps to the
 * same merged id). With ignore_merges a word that is itself in the vocabulary is one token.
 *
 * SentencePiece BPE by score (llama.cpp llm_tokenizer_spm, for GGUF "llama"): symbols are
 * characters; the adjacent pair whose concatenation is a token with the highest score
 * (leftmost on ties) is merged repeatedly; leftover symbols that are not tokens become
 * <0xXX> byte tokens.
 *
 * Cache: results for words up to TOK_CACHE_MAX_WORD bytes are kept in a direct-mapped table
 * (xxh3 of the word picks the slot; a collision replaces the old entry), under a mutex.
 */
#include "tokenizer/tok_internal.h"

#include "core/alloc.h"

#include <string.h>

#define TOK_CACHE_SLOTS 8192
#define TOK_CACHE_MAX_WORD 128

struct sym {
    int32_t id;
    int prev, next;
    uint32_t off, len; /* bytes of the word; len 0 = merged away */
};

struct cand {
    double key;   /* BPE: rank (smaller first); SPM: -score (smaller first) */
    int pos;      /* left symbol; ties: smaller first */
    int32_t id;   /* BPE: merged id; SPM: byte size of the pair */
};

struct heap {
    struct cand *v;
    size_t n, cap;
};

static bool cand_less(const struct cand *a, const struct cand *b)
{
    return a->key < b->key || (a->key == b->key && a->pos < b->pos);
}

static int heap_push(struct heap *h, struct cand c)
{
    if (h->n == h->cap) {
        size_t cap = h->cap ? h->cap * 2 : 64;
        struct cand *v = wrealloc(h->v, cap * sizeof *v);
        if (!v)
            return WELD_ERR_NOMEM;
        h->v = v;
        h->cap = cap;
    }
    size_t i = h->n++;
    while (i > 0 && cand_less(&c, &h->v[(i - 1) / 2])) {
        h->v[i] = h->v[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h->v[i] = c;
    return WELD_OK;
}

static struct cand heap_pop(struct heap *h)
{
    struct cand top = h->v[0], last = h->v[--h->n];
    size_t i = 0;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        const struct cand *best = &last;
        if (l < h->n && cand_less(&h->v[l], best)) {
            m = l;
            best = &h->v[l];
        }
        if (r < h->n && cand_less(&h->v[r], best))
            m = r;
        if (m == i)
            break;
        h->v[i] = h->v[m];
        i = m;
    }
    if (h->n)
        h->v[i] = last;
    return top;
}

struct syms {
    struct sym *v;
    size_t n, cap;
};

static int sym_push(struct syms *s, int32_t id, uint32_t off, uint32_t len)
{
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 64;
        struct sym *v = wrealloc(s->v, cap * sizeof *v);
        if (!v)
            return WELD_ERR_NOMEM;
        s->v = v;
        s->cap = cap;
    }
    struct sym *y = &s->v[s->n];
    y->id = id;
    y->off = off;
    y->len = len;
    y->prev = (int)s->n - 1;
    y->next = -1;
    if (s->n)
        s->v[s->n - 1].next = (int)s->n;
    s->n++;
    return WELD_OK;
}

/* Id of one character of the word, with the subword prefix / suffix applied. */
static int32_t char_id(const struct tokenizer *t, const char *c, size_t len, bool first,
                       bool last, struct tok_buf *tmp)
{
    if ((first || !t->cont_prefix) && (!last || !t->eow_suffix))
        return tok_map_get(t, c, len);
    tmp->n = 0;
    if (!first && t->cont_prefix && tok_buf_put(tmp, t->cont_prefix, strlen(t->cont_prefix)))
        return -2;
    if (tok_buf_put(tmp, c, len))
        return -2;
    if (last && t->eow_suffix && tok_buf_put(tmp, t->eow_suffix, strlen(t->eow_suffix)))
        return -2;
    return tok_map_get(t, tmp->p, tmp->n);
}

static int bpe_init(const struct tokenizer *t, const char *w, size_t n, struct syms *s)
{
    struct tok_buf tmp = {0};
    int32_t unk = -1;
    uint32_t unk_off = 0, unk_len = 0;
    int rc = WELD_OK;
    for (size_t i = 0; rc == WELD_OK && i < n;) {
        uint32_t cp;
        int cw = tok_utf8_next(w, n, i, &cp);
        if (cw <= 0)
            cw = 1;
        int32_t id = char_id(t, w + i, (size_t)cw, i == 0, i + (size_t)cw == n, &tmp);
        if (id == -2) {
            rc = WELD_ERR_NOMEM;
            break;
        }
        if (id >= 0) {
            if (unk >= 0 && (rc = sym_push(s, unk, unk_off, unk_len)) != WELD_OK)
                break;
            unk = -1;
            rc = sym_push(s, id, (uint32_t)i, (uint32_t)cw);
        } else {
            bool bytes_ok = t->byte_fallback;
            for (int k = 0; bytes_ok && k < cw; k++)
                bytes_ok = t->byte_id[(uint8_t)w[i + k]] >= 0;
            if (bytes_ok) {
                for (int k = 0; rc == WELD_OK && k < cw; k++)
                    rc = sym_push(s, t->byte_id[(uint8_t)w[i + k]], (uint32_t)i + k, 1);
            } else if (t->unk_id >= 0) {
                if (unk >= 0 && t->fuse_unk) {
                    unk_len += (uint32_t)cw;
                } else {
                    if (unk >= 0)
                        rc = sym_push(s, unk, unk_off, unk_len);
                    unk = t->unk_id;
                    unk_off = (uint32_t)i;
                    unk_len = (uint32_t)cw;
                }
            }
        }
        i += (size_t)cw;
    }
    if (rc == WELD_OK && unk >= 0)
        rc = sym_push(s, unk, unk_off, unk_len);
    wfree(tmp.p);
    return rc;
}

static int bpe_try(const struct tokenizer *t, struct syms *s, struct heap *h, int pos)
{
    if (pos < 0 || s->v[pos].next < 0)
        return WELD_OK;
    const struct tok_merge_slot *m = tok_merge_get(t, s->v[pos].id, s->v[s->v[pos].next].id);
    if (!m)
        return WELD_OK;
    struct cand c = {(double)m->rank, pos, m->id};
    return heap_push(h, c);
}

static int bpe_merge(const struct tokenizer *t, struct syms *s, struct heap *h)
{
    int rc = WELD_OK;
    for (int i = 0; rc == WELD_OK && i + 1 < (int)s->n; i++)
        rc = bpe_try(t, s, h, i);
    while (rc == WELD_OK && h->n) {
        struct cand c = heap_pop(h);
        struct sym *l = &s->v[c.pos];
        if (l->len == 0 || l->next < 0)
            continue;
        struct sym *r = &s->v[l->next];
        const struct tok_merge_slot *m = tok_merge_get(t, l->id, r->id);
        if (!m || m->id != c.id)
            continue;
        l->id = c.id;
        l->len += r->len;
        r->len = 0;
        l->next = r->next;
        if (r->next >= 0)
            s->v[r->next].prev = c.pos;
        rc = bpe_try(t, s, h, l->prev);
        if (rc == WELD_OK)
            rc = bpe_try(t, s, h, c.pos);
    }
    return rc;
}

static int spm_try(const struct tokenizer *t, const char *w, struct syms *s, struct heap *h,
                   int left)
{
    if (left < 0 || s->v[left].next < 0)
        return WELD_OK;
    const struct sym *l = &s->v[left], *r = &s->v[l->next];
    int32_t id = tok_map_get(t, w + l->off, l->len + r->len);
    if (id < 0)
        return WELD_OK;
    struct cand c = {-(double)t->scores[id], left, (int32_t)(l->len + r->len)};
    return heap_push(h, c);
}

static int spm_merge(const struct tokenizer *t, const char *w, struct syms *s, struct heap *h)
{
    int rc = WELD_OK;
    for (int i = 0; rc == WELD_OK && i + 1 < (int)s->n; i++)
        rc = spm_try(t, w, s, h, i);
    while (rc == WELD_OK && h->n) {
        struct cand c = heap_pop(h);
        struct sym *l = &s->v[c.pos];
        if (l->len == 0 || l->next < 0)
            continue;
        struct sym *r = &s->v[l->next];
        if (r->len == 0 || l->len + r->len != (uint32_t)c.id)
            continue;
        l->len += r->len;
        r->len = 0;
        l->next = r->next;
        if (r->next >= 0)
            s->v[r->next].prev = c.pos;
        rc = spm_try(t, w, s, h, l->prev);
        if (rc == WELD_OK)
            rc = spm_try(t, w, s, h, c.pos);
    }
    return rc;
}

static int spm_emit(const struct tokenizer *t, const char *w, const struct syms *s,
                    struct tok_ids *out)
{
    for (int i = s->n ? 0 : -1; i >= 0; i = s->v[i].next) {
        const struct sym *y = &s->v[i];
        int32_t id = tok_map_get(t, w + y->off, y->len);
        if (id >= 0) {
            if (tok_ids_push(out, id))
                return WELD_ERR_NOMEM;
            continue;
        }
        for (uint32_t k = 0; k < y->len; k++) {
            uint8_t b = (uint8_t)w[y->off + k];
            int32_t bid = t->byte_id[b] >= 0 ? t->byte_id[b] : tok_map_get(t, w + y->off + k, 1);
            if (tok_ids_push(out, bid >= 0 ? bid : t->unk_id >= 0 ? t->unk_id : 0))
                return WELD_ERR_NOMEM;
        }
    }
    return WELD_OK;
}

static int model_run(const struct tokenizer *t, const char *w, size_t n, struct tok_ids *out)
{
    struct syms s = {0};
    struct heap h = {0};
    int rc;
    if (t->model == TOK_MODEL_SPM) {
        for (size_t i = 0, rc2 = 0; i < n && rc2 == 0;) {
            uint32_t cp;
            int cw = tok_utf8_next(w, n, i, &cp);
            if (cw <= 0)
                cw = 1;
            rc2 = (size_t)sym_push(&s, -1, (uint32_t)i, (uint32_t)cw);
            if (rc2) {
                wfree(s.v);
                return WELD_ERR_NOMEM;
            }
            i += (size_t)cw;
        }
        rc = spm_merge(t, w, &s, &h);
        if (rc == WELD_OK)
            rc = spm_emit(t, w, &s, out);
    } else {
        rc = bpe_init(t, w, n, &s);
        if (rc == WELD_OK)
            rc = bpe_merge(t, &s, &h);
        for (size_t i = 0; rc == WELD_OK && i < s.n; i++)
            if (s.v[i].len)
                rc = tok_ids_push(out, s.v[i].id);
    }
    wfree(s.v);
    wfree(h.v);
    return rc;
}

struct tok_cache *tok_cache_create(void)
{
    struct tok_cache *c = wcalloc(1, sizeof *c);
    if (!c)
        return NULL;
    c->ents = wcalloc(TOK_CACHE_SLOTS, sizeof *c->ents);
    if (!c->ents) {
        wfree(c);
        return NULL;
    }
    c->cap = TOK_CACHE_SLOTS;
    pthread_mutex_init(&c->lock, NULL);
    return c;
}

void tok_cache_free(struct tok_cache *c)
{
    if (!c)
        return;
    for (size_t i = 0; i < c->cap; i++) {
        wfree(c->ents[i].word);
        wfree(c->ents[i].ids);
    }
    wfree(c->ents);
    pthread_mutex_destroy(&c->lock);
    wfree(c);
}

/* Look the word up; on a hit append its ids and return true. */
static bool cache_get(struct tok_cache *c, uint64_t h, const char *w, size_t n,
                      struct tok_ids *out, int *rc)
{
    bool hit = false;
    pthread_mutex_lock(&c->lock);
    struct tok_cache_ent *e = &c->ents[h & (c->cap - 1)];
    if (e->word && e->hash == h && e->len == n && memcmp(e->word, w, n) == 0) {
        hit = true;
        for (uint32_t i = 0; i < e->n_ids && *rc == WELD_OK; i++)
            *rc = tok_ids_push(out, e->ids[i]);
    }
    pthread_mutex_unlock(&c->lock);
    return hit;
}

static void cache_put(struct tok_cache *c, uint64_t h, const char *w, size_t n,
                      const int32_t *ids, size_t n_ids)
{
    char *wc = wmalloc(n + 1);
    int32_t *ic = wmalloc((n_ids ? n_ids : 1) * sizeof *ic);
    if (!wc || !ic) {
        wfree(wc);
        wfree(ic);
        return; /* the cache is only an optimisation */
    }
    memcpy(wc, w, n);
    if (n_ids)
        memcpy(ic, ids, n_ids * sizeof *ic);
    pthread_mutex_lock(&c->lock);
    struct tok_cache_ent *e = &c->ents[h & (c->cap - 1)];
    wfree(e->word);
    wfree(e->ids);
    e->hash = h;
    e->word = wc;
    e->len = (uint32_t)n;
    e->ids = ic;
    e->n_ids = (uint32_t)n_ids;
    pthread_mutex_unlock(&c->lock);
}

int tok_model_encode(const struct tokenizer *t, const char *w, size_t n, struct tok_ids *out)
{
    if (n == 0)
        return WELD_OK;
    if (t->ignore_merges && t->model == TOK_MODEL_BPE) {
        int32_t id = tok_map_get(t, w, n);
        if (id >= 0)
            return tok_ids_push(out, id);
    }
    uint64_t h = 0;
    int rc = WELD_OK;
    if (n <= TOK_CACHE_MAX_WORD) {
        h = tok_hash(w, n);
        if (cache_get(t->cache, h, w, n, out, &rc))
            return rc;
    }
    size_t start = out->n;
    rc = model_run(t, w, n, out);
    if (rc == WELD_OK && n <= TOK_CACHE_MAX_WORD)
        cache_put(t->cache, h, w, n, out->n > start ? out->v + start : NULL, out->n - start);
    return rc;
}
