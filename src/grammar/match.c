/*
 * match - the stack-set matcher of a byte-level grammar (grammar.h) and token masks
 * (vocab.h).
 *
 * A node is (element index, parent node): "match el[element] onwards in its alternative,
 * then continue with parent" (-1: nothing left, the sentence may end). Nodes are interned
 * in an open-addressing table, so a stack is one int and equal stacks are equal ints.
 * Expanding a node replaces a rule reference by each of the rule's alternatives (their
 * parent: the reference's continuation, or the reference's own parent when the reference
 * ends its alternative, so right recursion does not deepen the stack) and an alternative's
 * end by its parent, until every stack's top is a byte range; the grammar has no left
 * recursion, so expansion ends. A matcher's state is the sorted list of those tops plus
 * whether the empty stack was reached (the input may end here).
 *
 * The nodes live in a space (struct gspace) that every matcher of one grammar may share
 * (one thread), so equal states of different matchers are equal lists. States are
 * interned too, each with a lazily filled transition table (256 next-state ids, computed
 * on first use), which turns the matcher into a DFA built as it is explored: within a JSON
 * string, "one more character" leads back to the same state, so walking the vocabulary
 * there is table lookups. And each state keeps the token mask computed for it (the mask
 * cache): a state met again, by this sequence or another of the same grammar, costs a
 * copy. States, tables and masks are bounded by the space's budget (dropped together
 * when it is spent, between two masks; nodes stay).
 *
 * The mask walk visits the vocabulary sorted by bytes as a trie (vocab.h): the state
 * after each prefix is kept by depth, a token sharing a prefix with the previous one
 * starts from that depth, and once a prefix is refused every token sharing it is skipped.
 */
#include "grammar/grammar.h"
#include "grammar/vocab.h"

#include "core/alloc.h"

#include <string.h>

#define DEAD (-1)   /* no stack left and the input may not end: refused */
#define NOMEM (-2)
#define UNKNOWN (-3) /* a transition not computed yet */

struct gstate {
    uint32_t off;   /* its tops at pool + off */
    int32_t n;
    bool end;
    uint32_t hash;
    int32_t *trans; /* (256) next state per byte, UNKNOWN until computed; NULL: none yet */
    uint32_t *mask; /* its token mask for the space's mask_v, or NULL */
};

struct gspace {
    const struct grammar *g;
    /* interned nodes */
    int32_t *n_el, *n_parent;
    int n_nodes, cap_nodes;
    int32_t *hash; /* (hcap) node + 1, 0: empty */
    int hcap;
    /* expansion scratch */
    int32_t *next;
    int n_next;
    bool next_end;
    uint32_t *seen; /* (cap_nodes) expansion stamps */
    uint32_t stamp;
    int32_t *work; /* (cap_work) expansion stack */
    int cap_work;
    /* interned states */
    struct gstate *st;
    int n_st, cap_st;
    int32_t *pool;
    size_t n_pool, cap_pool;
    int32_t *shash; /* (shcap) state + 1, 0: empty */
    int shcap;
    const struct gvocab *mask_v;
    size_t bytes, budget; /* of states, tables and masks */
    uint64_t hits, misses;
};

struct gmatch {
    struct gspace *sp;
    bool own;
    int32_t *top;
    int n_top, cap_top;
    bool can_end;
};

static uint32_t mix(int32_t a, int32_t b)
{
    uint64_t h = (uint64_t)(uint32_t)a * 0x9E3779B97F4A7C15ull ^
                 (uint64_t)(uint32_t)b * 0xC2B2AE3D27D4EB4Full;
    return (uint32_t)(h ^ h >> 29);
}

/* ---- nodes ------------------------------------------------------------------------------ */

static bool grow_nodes(struct gspace *m)
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
    int32_t *nx = wrealloc(m->next, sizeof *nx * (size_t)cap);
    if (nx)
        m->next = nx;
    if (!e || !p || !s || !nx)
        return false;
    m->cap_nodes = cap;
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
static int32_t node(struct gspace *m, int32_t el, int32_t parent)
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

static bool push_work(struct gspace *m, int *sp, int32_t x)
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
static bool expand(struct gspace *m, int32_t s)
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

static void sort_i32(int32_t *a, int n)
{
    for (int i = 1; i < n; i++) { /* insertion sort: sets are small */
        int32_t x = a[i];
        int j = i;
        for (; j > 0 && a[j - 1] > x; j--)
            a[j] = a[j - 1];
        a[j] = x;
    }
}

static void next_stamp(struct gspace *m)
{
    if (++m->stamp == 0) {
        memset(m->seen, 0, sizeof *m->seen * (size_t)m->cap_nodes);
        m->stamp = 1;
    }
}

/* The state after byte b from tops[0, n), sorted, in m->next / next_end; false: out of
   memory. tops must not point into m->next. */
static bool step_from(struct gspace *m, const int32_t *tops, int n, uint8_t b)
{
    next_stamp(m);
    m->n_next = 0, m->next_end = false;
    for (int i = 0; i < n; i++) {
        const int32_t x = tops[i];
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
    sort_i32(m->next, m->n_next);
    return true;
}

/* ---- states ----------------------------------------------------------------------------- */

static uint32_t state_hash(const int32_t *t, int n, bool end)
{
    uint64_t h = end ? 0x51ED27ull : 0x7F4A7Cull;
    for (int i = 0; i < n; i++)
        h = (h ^ (uint32_t)t[i]) * 0x100000001B3ull;
    return (uint32_t)(h ^ h >> 32);
}

static void states_drop(struct gspace *m)
{
    for (int i = 0; i < m->n_st; i++) {
        wfree(m->st[i].trans);
        wfree(m->st[i].mask);
    }
    m->n_st = 0, m->n_pool = 0, m->bytes = 0;
    if (m->shash)
        memset(m->shash, 0, sizeof *m->shash * (size_t)m->shcap);
}

/* The id of state (t[0, n), end); DEAD for the empty refusing one, NOMEM. */
static int32_t state_id(struct gspace *m, const int32_t *t, int n, bool end)
{
    if (!n && !end)
        return DEAD;
    const uint32_t h = state_hash(t, n, end);
    if (m->n_st * 2 >= m->shcap) {
        int cap = m->shcap ? 2 * m->shcap : 1024;
        int32_t *sh = wcalloc((size_t)cap, sizeof *sh);
        if (!sh)
            return NOMEM;
        wfree(m->shash);
        m->shash = sh, m->shcap = cap;
        for (int i = 0; i < m->n_st; i++) {
            uint32_t k = m->st[i].hash & (uint32_t)(cap - 1);
            while (sh[k])
                k = (k + 1) & (uint32_t)(cap - 1);
            sh[k] = i + 1;
        }
    }
    uint32_t k = h & (uint32_t)(m->shcap - 1);
    while (m->shash[k]) {
        const struct gstate *s = &m->st[m->shash[k] - 1];
        if (s->hash == h && s->n == n && s->end == end &&
            (!n || !memcmp(m->pool + s->off, t, sizeof *t * (size_t)n)))
            return m->shash[k] - 1;
        k = (k + 1) & (uint32_t)(m->shcap - 1);
    }
    if (m->n_st == m->cap_st) {
        int cap = m->cap_st ? 2 * m->cap_st : 64;
        struct gstate *ns = wrealloc(m->st, sizeof *ns * (size_t)cap);
        if (!ns)
            return NOMEM;
        m->st = ns, m->cap_st = cap;
    }
    if (m->n_pool + (size_t)n > m->cap_pool) {
        size_t cap = 2 * (m->n_pool + (size_t)n) + 256;
        int32_t *np = wrealloc(m->pool, sizeof *np * cap);
        if (!np)
            return NOMEM;
        m->pool = np, m->cap_pool = cap;
    }
    if (n)
        memcpy(m->pool + m->n_pool, t, sizeof *t * (size_t)n);
    m->st[m->n_st] = (struct gstate){(uint32_t)m->n_pool, n, end, h, NULL, NULL};
    m->n_pool += (size_t)n;
    m->bytes += sizeof(struct gstate) + sizeof *t * (size_t)n;
    m->shash[k] = m->n_st + 1;
    return m->n_st++;
}

/* The state after byte b from state s (DEAD, NOMEM). */
static int32_t state_step(struct gspace *m, int32_t s, uint8_t b)
{
    struct gstate *st = &m->st[s];
    if (st->trans && st->trans[b] != UNKNOWN)
        return st->trans[b];
    if (!st->trans) {
        if (!(st->trans = wmalloc(256 * sizeof *st->trans)))
            return NOMEM;
        for (int i = 0; i < 256; i++)
            st->trans[i] = UNKNOWN;
        m->bytes += 256 * sizeof *st->trans;
    }
    /* the tops are copied out: interning may move the pool */
    int32_t buf[64], *t = st->n <= 64 ? buf : wmalloc(sizeof *t * (size_t)st->n);
    if (!t)
        return NOMEM;
    const int n = st->n;
    if (n)
        memcpy(t, m->pool + st->off, sizeof *t * (size_t)n);
    int32_t r = step_from(m, t, n, b) ? state_id(m, m->next, m->n_next, m->next_end) : NOMEM;
    if (t != buf)
        wfree(t);
    if (r != NOMEM)
        m->st[s].trans[b] = r; /* st may have moved */
    return r;
}

/* ---- spaces and matchers ---------------------------------------------------------------- */

int gspace_create(struct gspace **out, const struct grammar *g, struct weld_err *e)
{
    *out = NULL;
    struct gspace *m = wcalloc(1, sizeof *m);
    if (m && (m->work = wmalloc(sizeof *m->work * 64)))
        m->cap_work = 64;
    if (!m || !m->work || !grow_nodes(m)) {
        gspace_free(m);
        return err_set(e, WELD_ERR_NOMEM, "grammar: out of memory");
    }
    m->g = g;
    m->budget = GSPACE_BUDGET;
    *out = m;
    return WELD_OK;
}

void gspace_free(struct gspace *m)
{
    if (!m)
        return;
    states_drop(m);
    wfree(m->st);
    wfree(m->pool);
    wfree(m->shash);
    wfree(m->n_el);
    wfree(m->n_parent);
    wfree(m->hash);
    wfree(m->next);
    wfree(m->seen);
    wfree(m->work);
    wfree(m);
}

void gspace_drop(struct gspace *m)
{
    states_drop(m);
}

void gspace_set_budget(struct gspace *m, size_t bytes)
{
    m->budget = bytes;
}

void gspace_counts(const struct gspace *m, struct gspace_counts *c)
{
    *c = (struct gspace_counts){m->hits, m->misses, m->n_st, m->bytes};
}

static bool set_top(struct gmatch *m, const int32_t *t, int n, bool end)
{
    if (n > m->cap_top) {
        int cap = n > 2 * m->cap_top ? n : 2 * m->cap_top;
        int32_t *nt = wrealloc(m->top, sizeof *nt * (size_t)cap);
        if (!nt)
            return false;
        m->top = nt, m->cap_top = cap;
    }
    if (n)
        memcpy(m->top, t, sizeof *t * (size_t)n);
    m->n_top = n, m->can_end = end;
    return true;
}

void gmatch_reset(struct gmatch *mm)
{
    struct gspace *m = mm->sp;
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
    sort_i32(m->next, m->n_next);
    if (!set_top(mm, m->next, m->n_next, m->next_end))
        mm->n_top = 0, mm->can_end = false;
}

int gmatch_create_in(struct gmatch **out, struct gspace *sp, struct weld_err *e)
{
    *out = NULL;
    struct gmatch *m = wcalloc(1, sizeof *m);
    if (!m)
        return err_set(e, WELD_ERR_NOMEM, "grammar: out of memory");
    m->sp = sp;
    gmatch_reset(m);
    *out = m;
    return WELD_OK;
}

int gmatch_create(struct gmatch **out, const struct grammar *g, struct weld_err *e)
{
    struct gspace *sp;
    int rc = gspace_create(&sp, g, e);
    if (rc)
        return rc;
    if ((rc = gmatch_create_in(out, sp, e))) {
        gspace_free(sp);
        return rc;
    }
    (*out)->own = true;
    return WELD_OK;
}

void gmatch_free(struct gmatch *m)
{
    if (!m)
        return;
    if (m->own)
        gspace_free(m->sp);
    wfree(m->top);
    wfree(m);
}

bool gmatch_accept(struct gmatch *mm, const uint8_t *s, size_t n)
{
    if (!n)
        return true;
    struct gspace *m = mm->sp;
    /* keep the current state to restore on rejection */
    int32_t buf[64], *save = mm->n_top <= 64 ? buf : wmalloc(sizeof *save * (size_t)mm->n_top);
    if (!save)
        return false;
    const int n0 = mm->n_top;
    const bool end0 = mm->can_end;
    if (n0)
        memcpy(save, mm->top, sizeof *save * (size_t)n0);
    bool ok = true;
    for (size_t i = 0; i < n && ok; i++) {
        ok = step_from(m, mm->top, mm->n_top, s[i]) &&
             (m->n_next > 0 || (i + 1 == n && m->next_end)) &&
             set_top(mm, m->next, m->n_next, m->next_end);
    }
    if (!ok)
        set_top(mm, save, n0, end0); /* fits: it was there */
    if (save != buf)
        wfree(save);
    return ok;
}

int gmatch_save(const struct gmatch *m, struct gmatch_state *st, struct weld_err *e)
{
    st->tops = wmalloc(sizeof *st->tops * ((size_t)m->n_top + 1));
    if (!st->tops)
        return err_set(e, WELD_ERR_NOMEM, "grammar: out of memory");
    if (m->n_top)
        memcpy(st->tops, m->top, sizeof *st->tops * (size_t)m->n_top);
    st->n = m->n_top, st->can_end = m->can_end;
    return WELD_OK;
}

void gmatch_restore(struct gmatch *m, const struct gmatch_state *st)
{
    if (!set_top(m, st->tops, st->n, st->can_end))
        m->n_top = 0, m->can_end = false;
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

/* ---- token masks ------------------------------------------------------------------------ */

static int mask_walk(struct gspace *m, int32_t s0, const struct gvocab *v, uint32_t *mask,
                     struct weld_err *e)
{
    const size_t D = (size_t)v->max_len + 1;
    int32_t sbuf[256], *sid = D <= 256 ? sbuf : wmalloc(sizeof *sid * D);
    if (!sid)
        return err_set(e, WELD_ERR_NOMEM, "grammar: out of memory for a token mask");
    sid[0] = s0;
    uint32_t have = 0;          /* depths [0, have] hold the states of the current path */
    uint32_t dead = UINT32_MAX; /* the previous path died after this many bytes */
    int rc = WELD_OK;
    for (int i = 0; i < v->n_order; i++) {
        const int32_t id = v->order[i];
        const uint8_t *b = (const uint8_t *)v->bytes[id];
        const uint32_t len = v->len[id], l = v->lcp[i];
        if (l >= dead)
            continue; /* shares the refused prefix */
        dead = UINT32_MAX;
        uint32_t d = l < have ? l : have;
        for (; d < len; d++) {
            const int32_t x = state_step(m, sid[d], b[d]);
            if (x == NOMEM) {
                rc = err_set(e, WELD_ERR_NOMEM, "grammar: out of memory for a token mask");
                break;
            }
            if (x == DEAD) {
                dead = d + 1;
                break;
            }
            sid[d + 1] = x;
        }
        if (rc)
            break;
        have = d < len ? d : len;
        if (d == len && dead == UINT32_MAX)
            mask[id / 32] |= 1u << (id % 32);
    }
    if (sid != sbuf)
        wfree(sid);
    return rc;
}

int gmatch_mask(struct gmatch *mm, const struct gvocab *v, uint32_t *mask, struct weld_err *e)
{
    struct gspace *m = mm->sp;
    const size_t words = ((size_t)v->n_vocab + 31) / 32;
    if (m->mask_v != v || m->bytes > m->budget) { /* another vocabulary, or spent */
        states_drop(m);
        m->mask_v = v;
    }
    const int32_t s0 = state_id(m, mm->top, mm->n_top, mm->can_end);
    if (s0 == NOMEM)
        return err_set(e, WELD_ERR_NOMEM, "grammar: out of memory for a token mask");
    if (s0 >= 0 && m->st[s0].mask) {
        memcpy(mask, m->st[s0].mask, sizeof *mask * words);
        m->hits++;
        return WELD_OK;
    }
    m->misses++;
    memset(mask, 0, sizeof *mask * words);
    if (mm->can_end)
        for (int i = 0; i < v->n_eog; i++)
            mask[v->eog[i] / 32] |= 1u << (v->eog[i] % 32);
    if (s0 < 0 || !mm->n_top)
        return WELD_OK;
    int rc = mask_walk(m, s0, v, mask, e);
    if (rc)
        return rc;
    uint32_t *keep = wmalloc(sizeof *keep * words); /* the walk may have moved st */
    if (keep) {
        memcpy(keep, mask, sizeof *keep * words);
        m->st[s0].mask = keep;
        m->bytes += sizeof *keep * words;
    }
    return WELD_OK;
}

int gmatch_forced(struct gmatch *mm, uint8_t *out, int max)
{
    struct gspace *m = mm->sp;
    int32_t s = state_id(m, mm->top, mm->n_top, mm->can_end);
    int k = 0;
    /* forced: every top (the next byte's ranges) the same single byte, and no end here */
    while (s >= 0 && k < max && !m->st[s].end && m->st[s].n > 0) {
        const struct gstate *st = &m->st[s];
        const struct gr_elem *e0 = &m->g->el[m->n_el[m->pool[st->off]]];
        bool one = e0->lo == e0->hi;
        for (int i = 1; one && i < st->n; i++) {
            const struct gr_elem *e = &m->g->el[m->n_el[m->pool[st->off + (uint32_t)i]]];
            one = e->lo == e0->lo && e->hi == e0->lo;
        }
        if (!one)
            break;
        const uint8_t b = e0->lo;
        const int32_t x = state_step(m, s, b);
        if (x < 0)
            break;
        out[k++] = b;
        s = x;
    }
    return k;
}
