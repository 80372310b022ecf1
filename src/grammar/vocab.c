/*
 * vocab - building struct gvocab (vocab.h); the mask walk itself is in match.c, beside
 * the matcher's state.
 */
#include "grammar/vocab.h"

#include "core/alloc.h"
#include "tokenizer/tokenizer.h"

#include <stdlib.h>
#include <string.h>

static const struct gvocab *g_sort; /* qsort has no context argument */

static int by_bytes(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    uint32_t lx = g_sort->len[x], ly = g_sort->len[y], n = lx < ly ? lx : ly;
    int c = memcmp(g_sort->bytes[x], g_sort->bytes[y], n);
    if (c)
        return c;
    return lx != ly ? (lx < ly ? -1 : 1) : (x > y) - (x < y);
}

int gvocab_create(struct gvocab **out, const struct tokenizer *t, int n_vocab,
                  struct weld_err *e)
{
    *out = NULL;
    struct gvocab *v = wcalloc(1, sizeof *v);
    const int n_tok = tokenizer_n_vocab(t), n = n_vocab > n_tok ? n_vocab : n_tok;
    if (!v)
        return err_set(e, WELD_ERR_NOMEM, "grammar: out of memory");
    v->n_vocab = n;
    v->bytes = wcalloc((size_t)n + 1, sizeof *v->bytes);
    v->len = wcalloc((size_t)n + 1, sizeof *v->len);
    v->order = wmalloc(sizeof *v->order * ((size_t)n + 1));
    v->lcp = wmalloc(sizeof *v->lcp * ((size_t)n + 1));
    v->eog = wmalloc(sizeof *v->eog * ((size_t)n + 1));
    int rc = !v->bytes || !v->len || !v->order || !v->lcp || !v->eog ? WELD_ERR_NOMEM : WELD_OK;
    for (int32_t id = 0; rc == WELD_OK && id < n_tok; id++) {
        if (tokenizer_is_eog(t, id)) { /* ends the generation: never text */
            v->eog[v->n_eog++] = id;
            continue;
        }
        if (tokenizer_is_special(t, id))
            continue;
        size_t len = 0;
        char *b = NULL;
        if (tokenizer_token_bytes(t, id, &b, &len) != WELD_OK)
            continue; /* a hole in the vocabulary */
        if (!len) {
            wfree(b);
            continue;
        }
        v->bytes[id] = b, v->len[id] = (uint32_t)len;
        v->order[v->n_order++] = id;
        v->max_len = (uint32_t)len > v->max_len ? (uint32_t)len : v->max_len;
    }
    if (rc) {
        gvocab_free(v);
        return err_set(e, WELD_ERR_NOMEM, "grammar: out of memory");
    }
    g_sort = v;
    qsort(v->order, (size_t)v->n_order, sizeof *v->order, by_bytes);
    g_sort = NULL;
    for (int i = 0; i < v->n_order; i++) {
        uint32_t l = 0;
        if (i) {
            int32_t a = v->order[i - 1], b = v->order[i];
            while (l < v->len[a] && l < v->len[b] && v->bytes[a][l] == v->bytes[b][l])
                l++;
        }
        v->lcp[i] = l;
    }
    *out = v;
    return WELD_OK;
}

void gvocab_free(struct gvocab *v)
{
    if (!v)
        return;
    for (int i = 0; v->bytes && i < v->n_vocab; i++)
        wfree(v->bytes[i]);
    wfree(v->bytes);
    wfree(v->len);
    wfree(v->order);
    wfree(v->lcp);
    wfree(v->eog);
    wfree(v);
}

/* The token whose bytes are exactly s[0, n), or -1 (binary search in byte order). */
static int32_t find_exact(const struct gvocab *v, const uint8_t *s, uint32_t n)
{
    int lo = 0, hi = v->n_order - 1;
    while (lo <= hi) {
        const int mid = (lo + hi) / 2;
        const int32_t id = v->order[mid];
        const uint32_t l = v->len[id], k = l < n ? l : n;
        int c = memcmp(v->bytes[id], s, k);
        if (!c)
            c = l < n ? -1 : l > n ? 1 : 0;
        if (!c)
            return id;
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid - 1;
    }
    return -1;
}

int gvocab_greedy_tokens(const struct gvocab *v, const uint8_t *s, int n, int32_t *out, int max)
{
    int k = 0, p = 0;
    while (p < n && k < max) {
        int32_t best = -1;
        uint32_t bl = 0;
        for (uint32_t l = (uint32_t)(n - p) < v->max_len ? (uint32_t)(n - p) : v->max_len; l > 0;
             l--)
            if ((best = find_exact(v, s + p, l)) >= 0) {
                bl = l;
                break;
            }
        if (best < 0)
            break;
        out[k++] = best;
        p += (int)bl;
    }
    return k;
}
