/*
 * match - the stack-set matcher of a byte-level grammar (grammar.h).
 *
 * A node is (element index, parent node): "match el[element] onwards in its alternative,
 * then continue with parent" (-1: nothing left, the sentence may end). Nodes are interned
 * in an open-addressing table, so a stack is one int and equal stacks are equal ints.
 * Expanding a node replaces a rule reference by each of the rule's alternatives (their
 * parent: the reference's continuation, or the reference's own parent when the reference
 * ends its alternative, so right recursion does not deepen the stack) and an alternative's
 * end by its parent, until every stack's top is a byte range; the grammar has no left
 * recursion, so expansion ends. The state is the sorted list of those tops plus whether
 * the empty stack was reached (the input may end here).
 */
#include "grammar/grammar.h"
#include "grammar/vocab.h"

#include "core/alloc.h"

#include <string.h>

struct gmatch {
    const struct grammar *g;
    /* interned nodes */
    int32_t *n_el, *n_parent;
    int n_nodes, cap_nodes;
    int32_t *hash; /* (hcap) node + 1, 0: empty */
    int hcap;
    /* the state and a scratch one */
    int32_t *top, *next;
    int n_top, n_next, cap_top;
    bool can_end, next_end;
    uint32_t *seen; /* (cap_nodes) expansion stamps */
    uint32_t stamp;
    int32_t *work; /* (cap_work) expansion stack */
    int cap_work;
};

static uint32_t mix(int32_t a, int32_t b)
{
    uint64_t h = (uint64_t)(uint32_t)a * 0x9E3779B97F4A7C15ull ^
                 (uint64_t)(uint32_t)b * 0xC2B2AE3D27D4EB4Full;
    return (uint32_t)(h ^ h >> 29);
}

static bool grow_nodes(struct gmatch *m)
{
    int cap = m->cap_nodes ? 2 * m->cap_nodes : 256;
    int32_t *e = wrealloc(m->n_el, sizeof *e * (size_t)cap);
    if (e)
        m->n_el = e;
    int32_t *p = wrealloc(m->n_parent, sizeof *p * (size_t)cap);
    if (p)
        m->n_parent = p;
    uint32_t *s = wrealloc(m->seen, sizeof *s * (size_t)cap);
    if (s) {
        memset(s + m->cap_nodes, 0, sizeof *s * (size_t)(cap - m->cap_nodes));
        m->seen = s;
    }
    int32_t *t = wrealloc(m->top, sizeof *t * (size_t)cap);
    if (t)
        m->top = t;
    int32_t *nx = wrealloc(m->next, sizeof *nx * (size_t)cap);
    if (nx)
        m->next = nx;
    if (!e || !p || !s || !t || !nx)
        return false;
    m->cap_nodes = m->cap_top = cap;
    /* rehash into a table twice the node capacity */
    int32_t *h = wcalloc((size_t)cap * 2, sizeof *h);
    if (!h)
        return false;
    wfree(m->hash);
    m->hash = h, m->hcap = cap * 2;
    for (int i = 0; i < m->n_nodes; i++) {
        uint32_t k = mix(m->n_el[i], m->n_parent[i]) & (uint32_t)(m->hcap - 1);
        while (m->hash[k])
            k = (k + 1) & (uint32_t)(m->hcap - 1);
        m->hash[k] = i + 1;
    }
    return true;
}

/* The node (el, parent), made if new; -1: out of memory. */
static int32_t node(struct gmatch *m, int32_t el, int32_t parent)
{
    if (m->n_nodes >= m->cap_nodes && !grow_nodes(m))
        return -1;
    uint32_t k = mix(el, parent) & (uint32_t)(m->hcap - 1);
    while (m->hash[k]) {
        int32_t i = m->hash[k] - 1;
        if (m->n_el[i] == el && m->n_parent[i] == parent)
            return i;
        k = (k + 1) & (uint32_t)(m->hcap - 1);
    }
    int32_t i = m->n_nodes++;
    m->n_el[i] = el, m->n_parent[i] = parent;
    m->hash[k] = i + 1;
    return i;
}

static bool push_work(struct gmatch *m, int *sp, int32_t x)
{
    if (*sp >= m->cap_work) {
        int cap = 2 * m->cap_work;
        int32_t *w = wrealloc(m->work, sizeof *w * (size_t)cap);
        if (!w)
            return false;
        m->work = w, m->cap_work = cap;
    }
    m->work[(*sp)++] = x;
    return true;
}

/* Expand stack s (a node, or -1) into m->next / m->next_end. false: out of memory. */
static bool expand(struct gmatch *m, int32_t s)
{
    const struct grammar *g = m->g;
    int sp = 0;
    if (s < 0) {
        m->next_end = true;
        return true;
    }
    if (!push_work(m, &sp, s))
        return false;
    while (sp) {
        int32_t x = m->work[--sp];
        if (m->seen[x] == m->stamp)
            continue;
        m->seen[x] = m->stamp;
        const int32_t ex = m->n_el[x];
        const struct gr_elem *el = &g->el[ex];
        const int32_t up = m->n_parent[x];
        if (el->kind == GR_BYTES) {
            m->next[m->n_next++] = x;
            continue;
        }
        if (el->kind == GR_END) {
            if (up < 0)
                m->next_end = true;
            else if (!push_work(m, &sp, up))
                return false;
            continue;
        }
        /* a rule reference: each alternative on top of its continuation (the reference's
           parent itself when the reference ends its alternative) */
        int32_t cont = up;
        if (g->el[ex + 1].kind != GR_END && (cont = node(m, ex + 1, up)) < 0)
            return false;
        const int a0 = g->rule_alt0[el->rule], na = g->rule_n_alt[el->rule];
        for (int a = 0; a < na; a++) {
            const int32_t first = g->alt[a0 + a];
            int32_t y = cont;
            if (g->el[first].kind != GR_END && (y = node(m, first, cont)) < 0)
                return false;
            if (y < 0)
                m->next_end = true;
            else if (!push_work(m, &sp, y))
                return false;
        }
    }
    return true;
}

static int cmp_i32(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

static void next_stamp(struct gmatch *m)
{
    if (++m->stamp == 0) {
        memset(m->seen, 0, sizeof *m->seen * (size_t)m->cap_nodes);
        m->stamp = 1;
    }
}

/* The state after byte b from the current one, in next; false: out of memory. */
static bool step_from(struct gmatch *m, const int32_t *tops, int n, uint8_t b)
{
    next_stamp(m);
    m->n_next = 0, m->next_end = false;
    for (int i = 0; i < n; i++) {
        int32_t x = tops ? tops[i] : m->top[i];
        const struct gr_elem *el = &m->g->el[m->n_el[x]];
        if (b < el->lo || b > el->hi)
            continue;
        const int32_t up = m->n_parent[x];
        int32_t after = up;
        if (el[1].kind != GR_END && (after = node(m, m->n_el[x] + 1, up)) < 0)
            return false;
        if (!expand(m, after))
            return false;
    }
    qsort(m->next, (size_t)m->n_next, sizeof *m->next, cmp_i32);
    return true;
}

static bool step(struct gmatch *m, uint8_t b)
{
    return step_from(m, NULL, m->n_top, b);
}

static void swap_state(struct gmatch *m)
{
    int32_t *t = m->top;
    m->top = m->next, m->next = t;
    m->n_top = m->n_next, m->can_end = m->next_end;
}

void gmatch_reset(struct gmatch *m)
{
    next_stamp(m);
    m->n_next = 0, m->next_end = false;
    const struct grammar *g = m->g;
    for (int a = 0; a < g->rule_n_alt[g->root]; a++) {
        int32_t el = g->alt[g->rule_alt0[g->root] + a];
        if (g->el[el].kind == GR_END) {
            m->next_end = true;
            continue;
        }
        int32_t x = node(m, el, -1);
        if (x < 0 || !expand(m, x))
            break;
    }
    qsort(m->next, (size_t)m->n_next, sizeof *m->next, cmp_i32);
    swap_state(m);
}

int gmatch_create(struct gmatch **out, const struct grammar *g, struct weld_err *e)
{
    *out = NULL;
    struct gmatch *m = wcalloc(1, sizeof *m);
    if (m && (m->work = wmalloc(sizeof *m->work * 64)))
        m->cap_work = 64;
    if (!m || !m->work || !grow_nodes(m)) {
        gmatch_free(m);
        return err_set(e, WELD_ERR_NOMEM, "grammar: out of memory");
    }
    m->g = g;
    gmatch_reset(m);
    *out = m;
    return WELD_OK;
}

void gmatch_free(struct gmatch *m)
{
    if (!m)
        return;
    wfree(m->n_el);
    wfree(m->n_parent);
    wfree(m->hash);
    wfree(m->top);
    wfree(m->next);
    wfree(m->seen);
    wfree(m->work);
    wfree(m);
}

bool gmatch_accept(struct gmatch *m, const uint8_t *s, size_t n)
{
    if (!n)
        return true;
    /* keep the current state to restore on rejection */
    int32_t buf[64], *save = m->n_top <= 64 ? buf : wmalloc(sizeof *save * (size_t)m->n_top);
    if (!save)
        return false;
    const int n0 = m->n_top;
    const bool end0 = m->can_end;
    memcpy(save, m->top, sizeof *save * (size_t)n0);
    bool ok = true;
    for (size_t i = 0; i < n && ok; i++) {
        ok = step(m, s[i]) && (m->n_next > 0 || (i + 1 == n && m->next_end));
        if (ok)
            swap_state(m);
    }
    if (!ok) {
        memcpy(m->top, save, sizeof *save * (size_t)n0);
        m->n_top = n0, m->can_end = end0;
    }
    if (save != buf)
        wfree(save);
    return ok;
}

int gmatch_save(const struct gmatch *m, struct gmatch_state *st, struct weld_err *e)
{
    st->tops = wmalloc(sizeof *st->tops * ((size_t)m->n_top + 1));
    if (!st->tops)
        return err_set(e, WELD_ERR_NOMEM, "grammar: out of memory");
    memcpy(st->tops, m->top, sizeof *st->tops * (size_t)m->n_top);
    st->n = m->n_top, st->can_end = m->can_end;
    return WELD_OK;
}

void gmatch_restore(struct gmatch *m, const struct gmatch_state *st)
{
    memcpy(m->top, st->tops, sizeof *st->tops * (size_t)st->n); /* n <= the node count */
    m->n_top = st->n, m->can_end = st->can_end;
}

void gmatch_state_free(struct gmatch_state *st)
{
    wfree(st->tops);
    st->tops = NULL, st->n = 0;
}

bool gmatch_can_end(const struct gmatch *m)
{
    return m->can_end;
}

int gmatch_mask(struct gmatch *m, const struct gvocab *v, uint32_t *mask, struct weld_err *e)
{
    memset(mask, 0, sizeof *mask * (((size_t)v->n_vocab + 31) / 32));
    if (m->can_end)
        for (int i = 0; i < v->n_eog; i++)
            mask[v->eog[i] / 32] |= 1u << (v->eog[i] % 32);
    if (!m->n_top)
        return WELD_OK;
    /* the states by depth: depth d's tops at buf + off[d], n[d] of them, end[d] */
    const size_t D = (size_t)v->max_len + 1;
    size_t cap = (size_t)m->n_top * 4 + 64, used = 0;
    int32_t *buf = wmalloc(sizeof *buf * cap);
    size_t *off = wmalloc(sizeof *off * D);
    int *cnt = wmalloc(sizeof *cnt * D);
    if (!buf || !off || !cnt) {
        wfree(buf), wfree(off), wfree(cnt);
        return err_set(e, WELD_ERR_NOMEM, "grammar: out of memory for a token mask");
    }
    memcpy(buf, m->top, sizeof *buf * (size_t)m->n_top);
    off[0] = 0, cnt[0] = m->n_top, used = (size_t)m->n_top;
    uint32_t have = 0;          /* depths [0, have] hold the states of the current path */
    uint32_t dead = UINT32_MAX; /* the previous path died after this many bytes */
    int rc = WELD_OK;
    for (int i = 0; i < v->n_order && rc == WELD_OK; i++) {
        const int32_t id = v->order[i];
        const uint8_t *b = (const uint8_t *)v->bytes[id];
        const uint32_t len = v->len[id], l = v->lcp[i];
        if (l >= dead)
            continue; /* shares the refused prefix */
        dead = UINT32_MAX;
        uint32_t d = l < have ? l : have;
        used = off[d] + (size_t)cnt[d];
        for (; d < len; d++) {
            if (!step_from(m, buf + off[d], cnt[d], b[d])) {
                rc = err_set(e, WELD_ERR_NOMEM, "grammar: out of memory for a token mask");
                break;
            }
            if (!m->n_next && !(d + 1 == len && m->next_end)) {
                dead = d + 1;
                break;
            }
            if (used + (size_t)m->n_next > cap) {
                size_t nc = 2 * (used + (size_t)m->n_next);
                int32_t *nb = wrealloc(buf, sizeof *nb * nc);
                if (!nb) {
                    rc = err_set(e, WELD_ERR_NOMEM, "grammar: out of memory for a token mask");
                    break;
                }
                buf = nb, cap = nc;
            }
            memcpy(buf + used, m->next, sizeof *buf * (size_t)m->n_next);
            off[d + 1] = used, cnt[d + 1] = m->n_next;
            used += (size_t)m->n_next;
        }
        have = d < len ? d : len;
        if (d == len && dead == UINT32_MAX)
            mask[id / 32] |= 1u << (id % 32);
    }
    wfree(buf), wfree(off), wfree(cnt);
    return rc;
}
