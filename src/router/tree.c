/*
 * tree - the approximate radix tree of the cache-aware policy (tree.h has the invariants).
 *
 * Layout: struct rnode owns its edge bytes and a sorted array of children (by first edge
 * byte); struct rtag links a (node, worker) pair into the node's tag list and into the
 * worker's LRU list (head oldest). struct rworker is per worker id: its LRU list, its chars
 * and tag count. Memory: a node is ~64 bytes plus its edge and 8 per child slot, a tag 48.
 *
 * Insert walks from the root; a text that leaves an edge part way splits it: the upper part
 * becomes a new node, given a copy of every tag of the lower one, each placed right after
 * the lower one's in its worker's list (its chars do not change: the edge bytes are only
 * shared out). Then the path is tagged leaf first, each tag moved to its list's tail. The
 * walk keeps the path in a small growable array (depth is bounded by the text length).
 */
#include "router/tree.h"

#include "core/alloc.h"

#include <stdbool.h>
#include <string.h>

struct rtag;

struct rnode {
    struct rnode *parent;
    struct rnode **kids; /* (n_kids) sorted by kids[i]->edge[0] */
    int n_kids, cap_kids;
    unsigned char *edge; /* (len) the bytes from the parent; root: none */
    size_t len;
    struct rtag *tags; /* workers holding this node */
};

struct rtag {
    struct rnode *node;
    int worker;
    struct rtag *next;          /* in node->tags */
    struct rtag *older, *newer; /* in the worker's LRU list */
    double t_access;
    size_t order; /* rtree_check's scratch: the place in the list */
};

struct rworker {
    struct rtag *oldest, *newest;
    size_t chars, n_tags;
};

struct rtree {
    struct rnode root;
    struct rworker *w; /* (n_w) by worker id */
    int n_w;
    size_t n_nodes; /* root included */
    size_t bytes;
};

struct rtree *rtree_create(void)
{
    struct rtree *t = wcalloc(1, sizeof *t);
    if (t) {
        t->n_nodes = 1;
        t->bytes = sizeof *t;
    }
    return t;
}

/* ---- small helpers ---------------------------------------------------------------------- */

static int kid_index(const struct rnode *n, unsigned char c, bool *found)
{
    int lo = 0, hi = n->n_kids;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        unsigned char m = n->kids[mid]->edge[0];
        if (m == c) {
            *found = true;
            return mid;
        }
        if (m < c)
            lo = mid + 1;
        else
            hi = mid;
    }
    *found = false;
    return lo;
}

static struct rnode *kid_find(const struct rnode *n, unsigned char c)
{
    bool found;
    int i = kid_index(n, c, &found);
    return found ? n->kids[i] : NULL;
}

static int kid_add(struct rtree *t, struct rnode *n, struct rnode *k)
{
    bool found;
    int i = kid_index(n, k->edge[0], &found);
    WELD_ASSERT(!found);
    if (n->n_kids == n->cap_kids) {
        int cap = n->cap_kids ? n->cap_kids * 2 : 2;
        struct rnode **nk = wrealloc(n->kids, (size_t)cap * sizeof *nk);
        if (!nk)
            return WELD_ERR_NOMEM;
        t->bytes += (size_t)(cap - n->cap_kids) * sizeof *nk;
        n->kids = nk;
        n->cap_kids = cap;
    }
    memmove(n->kids + i + 1, n->kids + i, (size_t)(n->n_kids - i) * sizeof *n->kids);
    n->kids[i] = k;
    n->n_kids++;
    k->parent = n;
    return WELD_OK;
}

static void kid_remove(struct rnode *n, struct rnode *k)
{
    bool found;
    int i = kid_index(n, k->edge[0], &found);
    WELD_ASSERT(found && n->kids[i] == k);
    memmove(n->kids + i, n->kids + i + 1, (size_t)(n->n_kids - i - 1) * sizeof *n->kids);
    n->n_kids--;
}

static struct rworker *worker_get(struct rtree *t, int w)
{
    if (w < t->n_w)
        return &t->w[w];
    int n = t->n_w ? t->n_w : 8;
    while (n <= w)
        n *= 2;
    struct rworker *nw = wrealloc(t->w, (size_t)n * sizeof *nw);
    if (!nw)
        return NULL;
    memset(nw + t->n_w, 0, (size_t)(n - t->n_w) * sizeof *nw);
    t->bytes += (size_t)(n - t->n_w) * sizeof *nw;
    t->w = nw;
    t->n_w = n;
    return &t->w[w];
}

static void lru_unlink(struct rworker *rw, struct rtag *g)
{
    if (g->older)
        g->older->newer = g->newer;
    else
        rw->oldest = g->newer;
    if (g->newer)
        g->newer->older = g->older;
    else
        rw->newest = g->older;
    g->older = g->newer = NULL;
}

static void lru_push_newest(struct rworker *rw, struct rtag *g)
{
    g->older = rw->newest;
    g->newer = NULL;
    if (rw->newest)
        rw->newest->newer = g;
    else
        rw->oldest = g;
    rw->newest = g;
}

/* Put g right after (newer than) at in the list. */
static void lru_insert_after(struct rworker *rw, struct rtag *at, struct rtag *g)
{
    g->older = at;
    g->newer = at->newer;
    if (at->newer)
        at->newer->older = g;
    else
        rw->newest = g;
    at->newer = g;
}

static struct rtag *tag_of(const struct rnode *n, int w)
{
    for (struct rtag *g = n->tags; g; g = g->next)
        if (g->worker == w)
            return g;
    return NULL;
}

static void node_free(struct rtree *t, struct rnode *n)
{
    t->bytes -= sizeof *n + n->len + (size_t)n->cap_kids * sizeof *n->kids;
    t->n_nodes--;
    wfree(n->kids);
    wfree(n->edge);
    wfree(n);
}

/* Drop tag g (of worker w); a node left without tags (hence a leaf) goes too. */
static void tag_drop(struct rtree *t, struct rtag *g)
{
    struct rworker *rw = &t->w[g->worker];
    struct rnode *n = g->node;
    lru_unlink(rw, g);
    struct rtag **pp = &n->tags;
    while (*pp != g)
        pp = &(*pp)->next;
    *pp = g->next;
    rw->chars -= n->len;
    rw->n_tags--;
    t->bytes -= sizeof *g;
    wfree(g);
    if (!n->tags) {
        WELD_ASSERT(n->n_kids == 0);
        kid_remove(n->parent, n);
        node_free(t, n);
    }
}

/* ---- split and insert ------------------------------------------------------------------- */

/* Cut n's edge after k bytes (0 < k < len): a new upper node takes the first k bytes and
   n's tags; returns it (NULL: out of memory, nothing changed). */
static struct rnode *split(struct rtree *t, struct rnode *n, size_t k)
{
    struct rnode *up = wcalloc(1, sizeof *up);
    unsigned char *ue = wmalloc(k);
    unsigned char *le = wmalloc(n->len - k);
    int n_tags = 0;
    for (struct rtag *g = n->tags; g; g = g->next)
        n_tags++;
    struct rtag **ng = wcalloc((size_t)n_tags + 1, sizeof *ng);
    struct rnode **kids = wmalloc(2 * sizeof *kids);
    bool ok = up && ue && le && ng && kids;
    for (int i = 0; ok && i < n_tags; i++)
        ok = (ng[i] = wcalloc(1, sizeof **ng)) != NULL;
    if (!ok) {
        for (int i = 0; ng && i < n_tags; i++)
            wfree(ng[i]);
        wfree(ng);
        wfree(kids);
        wfree(up);
        wfree(ue);
        wfree(le);
        return NULL;
    }
    memcpy(ue, n->edge, k);
    memcpy(le, n->edge + k, n->len - k);
    struct rnode *parent = n->parent;
    /* up replaces n among parent's children (same first byte, same slot) */
    bool found;
    int i = kid_index(parent, n->edge[0], &found);
    WELD_ASSERT(found && parent->kids[i] == n);
    parent->kids[i] = up;
    up->parent = parent;
    up->edge = ue;
    up->len = k;
    wfree(n->edge);
    n->edge = le;
    n->len -= k;
    up->kids = kids;
    up->cap_kids = 2;
    up->kids[0] = n;
    up->n_kids = 1;
    n->parent = up;
    t->n_nodes++;
    t->bytes += sizeof *up + (size_t)up->cap_kids * sizeof *up->kids;
    /* tags: a copy of each, newer than the original in its worker's list */
    struct rtag **tail = &up->tags;
    int j = 0;
    for (struct rtag *g = n->tags; g; g = g->next, j++) {
        struct rtag *c = ng[j];
        c->node = up;
        c->worker = g->worker;
        c->t_access = g->t_access;
        lru_insert_after(&t->w[g->worker], g, c);
        t->w[g->worker].n_tags++;
        t->bytes += sizeof *c;
        *tail = c;
        tail = &c->next;
    }
    wfree(ng);
    return up;
}

/* Tag n for w (spare: a zeroed tag to use if n has none yet) as its newest; returns
   whether spare was used. */
static bool tag_touch(struct rtree *t, struct rnode *n, int w, double now, struct rtag *spare)
{
    struct rworker *rw = &t->w[w];
    struct rtag *g = tag_of(n, w);
    bool used = !g;
    if (g) {
        lru_unlink(rw, g);
    } else {
        g = spare;
        g->node = n;
        g->worker = w;
        g->next = n->tags;
        n->tags = g;
        rw->chars += n->len;
        rw->n_tags++;
        t->bytes += sizeof *g;
    }
    g->t_access = now;
    lru_push_newest(rw, g);
    return used;
}

/* Grow *path (stack-allocated at first) to hold one more entry. */
static bool path_room(struct rnode ***path, struct rnode **stack, size_t n, size_t *cap)
{
    if (n < *cap)
        return true;
    struct rnode **np = wmalloc(*cap * 2 * sizeof *np);
    if (!np)
        return false;
    memcpy(np, *path, n * sizeof *np);
    if (*path != stack)
        wfree(*path);
    *path = np;
    *cap *= 2;
    return true;
}

int rtree_insert(struct rtree *t, const char *text, size_t len, int worker, double now)
{
    if (worker < 0 || !worker_get(t, worker))
        return WELD_ERR_NOMEM;
    struct rnode *stack[64], **path = stack, *leaf = NULL;
    size_t n_path = 0, cap = 64;
    int rc = WELD_OK;
    struct rnode *n = &t->root;
    size_t pos = 0;
    /* walk, splitting and adding the new leaf; every step leaves a valid tree */
    while (pos < len && !rc) {
        if (!path_room(&path, stack, n_path, &cap)) {
            rc = WELD_ERR_NOMEM;
            break;
        }
        struct rnode *k = kid_find(n, (unsigned char)text[pos]);
        if (!k) {
            struct rnode *l = wcalloc(1, sizeof *l);
            unsigned char *e = wmalloc(len - pos);
            if (l && e) {
                memcpy(e, text + pos, len - pos);
                l->edge = e;
                l->len = len - pos;
            }
            if (!l || !e || kid_add(t, n, l)) {
                wfree(l);
                wfree(e);
                rc = WELD_ERR_NOMEM;
                break;
            }
            t->n_nodes++;
            t->bytes += sizeof *l + l->len;
            path[n_path++] = leaf = l;
            break;
        }
        size_t m = 0, rest = len - pos;
        while (m < k->len && m < rest && k->edge[m] == (unsigned char)text[pos + m])
            m++;
        if (m < k->len && !(k = split(t, k, m))) {
            rc = WELD_ERR_NOMEM;
            break;
        }
        path[n_path++] = k;
        n = k;
        pos += m;
    }
    /* the tags the path lacks, allocated before any is placed: all or none */
    size_t need = 0;
    for (size_t i = 0; !rc && i < n_path; i++)
        need += !tag_of(path[i], worker);
    struct rtag **spare = !rc && need ? wcalloc(need, sizeof *spare) : NULL;
    for (size_t i = 0; !rc && i < need; i++)
        if (!spare || !(spare[i] = wcalloc(1, sizeof **spare)))
            rc = WELD_ERR_NOMEM;
    if (rc) {
        for (size_t i = 0; spare && i < need; i++)
            wfree(spare[i]);
        if (leaf) { /* a leaf without tags may not stay */
            kid_remove(leaf->parent, leaf);
            node_free(t, leaf);
        }
    } else {
        /* leaf first, so that every ancestor ends newer than its descendants */
        size_t used = 0;
        for (size_t i = n_path; i-- > 0;)
            used += tag_touch(t, path[i], worker, now, used < need ? spare[used] : NULL);
    }
    wfree(spare);
    if (path != stack)
        wfree(path);
    return rc;
}

/* ---- match, evict, remove --------------------------------------------------------------- */

size_t rtree_match(const struct rtree *t, const char *text, size_t len, size_t *out, int n_out)
{
    for (int i = 0; i < n_out; i++)
        out[i] = 0;
    const struct rnode *n = &t->root;
    size_t pos = 0, best = 0;
    while (pos < len) {
        const struct rnode *k = kid_find(n, (unsigned char)text[pos]);
        if (!k)
            break;
        size_t m = 0, rest = len - pos;
        while (m < k->len && m < rest && k->edge[m] == (unsigned char)text[pos + m])
            m++;
        for (const struct rtag *g = k->tags; g; g = g->next)
            if (g->worker < n_out)
                out[g->worker] = pos + m;
        if (k->tags && pos + m > best)
            best = pos + m;
        if (m < k->len)
            break;
        n = k;
        pos += m;
    }
    return best;
}

void rtree_evict(struct rtree *t, int worker, size_t max_chars)
{
    if (worker < 0 || worker >= t->n_w)
        return;
    struct rworker *rw = &t->w[worker];
    while (rw->chars > max_chars && rw->oldest)
        tag_drop(t, rw->oldest);
}

void rtree_remove_worker(struct rtree *t, int worker)
{
    if (worker < 0 || worker >= t->n_w)
        return;
    struct rworker *rw = &t->w[worker];
    while (rw->oldest)
        tag_drop(t, rw->oldest);
}

size_t rtree_chars(const struct rtree *t, int worker)
{
    return worker >= 0 && worker < t->n_w ? t->w[worker].chars : 0;
}

size_t rtree_nodes(const struct rtree *t)
{
    return t->n_nodes;
}

size_t rtree_bytes(const struct rtree *t)
{
    return t->bytes;
}

static void node_release(struct rnode *n)
{
    for (struct rtag *g = n->tags, *next; g; g = next) {
        next = g->next;
        wfree(g);
    }
    wfree(n->kids);
    wfree(n->edge);
    wfree(n);
}

void rtree_free(struct rtree *t)
{
    if (!t)
        return;
    /* a worklist, not recursion: the depth is bounded only by the longest text */
    struct rnode **work = NULL;
    size_t n_work = 0, cap = 0;
    for (int i = 0; i < t->root.n_kids; i++) {
        if (n_work == cap) {
            cap = cap ? cap * 2 : 64;
            struct rnode **nw = wrealloc(work, cap * sizeof *nw);
            WELD_ASSERT(nw);
            work = nw;
        }
        work[n_work++] = t->root.kids[i];
    }
    while (n_work) {
        struct rnode *n = work[--n_work];
        for (int i = 0; i < n->n_kids; i++) {
            if (n_work == cap) {
                cap = cap ? cap * 2 : 64;
                struct rnode **nw = wrealloc(work, cap * sizeof *nw);
                WELD_ASSERT(nw);
                work = nw;
            }
            work[n_work++] = n->kids[i];
        }
        node_release(n);
    }
    wfree(work);
    wfree(t->root.kids);
    wfree(t->w);
    wfree(t);
}

/* ---- invariants ------------------------------------------------------------------------- */

const char *rtree_check(struct rtree *t)
{
    for (int w = 0; w < t->n_w; w++) {
        size_t i = 0;
        for (struct rtag *g = t->w[w].oldest; g && i <= t->w[w].n_tags; g = g->newer)
            g->order = i++;
    }
    size_t *chars = wcalloc((size_t)t->n_w + 1, sizeof *chars);
    size_t *tags = wcalloc((size_t)t->n_w + 1, sizeof *tags);
    struct rnode **work = wmalloc(64 * sizeof *work);
    size_t n_work = 0, cap = 64, nodes = 1;
    const char *bad = NULL;
    if (!chars || !tags || !work) {
        bad = "out of memory checking";
        goto done;
    }
    for (int i = 0; i < t->root.n_kids; i++) {
        if (n_work == cap) {
            struct rnode **nw = wrealloc(work, cap * 2 * sizeof *nw);
            if (!nw) {
                bad = "out of memory checking";
                goto done;
            }
            work = nw;
            cap *= 2;
        }
        work[n_work++] = t->root.kids[i];
    }
    if (t->root.tags)
        bad = "the root has tags";
    while (!bad && n_work) {
        struct rnode *n = work[--n_work];
        nodes++;
        if (!n->len)
            bad = "a node with an empty edge";
        else if (!n->tags)
            bad = "a node without tags";
        for (int i = 0; !bad && i < n->n_kids; i++) {
            if (n->kids[i]->parent != n)
                bad = "a child's parent link is wrong";
            else if (i && n->kids[i - 1]->edge[0] >= n->kids[i]->edge[0])
                bad = "children not sorted by first byte";
        }
        for (struct rtag *g = n->tags; !bad && g; g = g->next) {
            if (g->node != n || g->worker < 0 || g->worker >= t->n_w)
                bad = "a tag points elsewhere";
            else if (n->parent != &t->root && !tag_of(n->parent, g->worker))
                bad = "tags not ancestor-closed";
            else {
                chars[g->worker] += n->len;
                tags[g->worker]++;
                /* the parent's tag must be newer than this one */
                const struct rtag *p = n->parent != &t->root ? tag_of(n->parent, g->worker) : NULL;
                if (p && p->order <= g->order)
                    bad = "an ancestor's tag is older than its descendant's";
            }
        }
        for (int i = 0; !bad && i < n->n_kids; i++) {
            if (n_work == cap) {
                struct rnode **nw = wrealloc(work, cap * 2 * sizeof *nw);
                if (!nw) {
                    bad = "out of memory checking";
                    break;
                }
                work = nw;
                cap *= 2;
            }
            work[n_work++] = n->kids[i];
        }
    }
    if (!bad && nodes != t->n_nodes)
        bad = "node count is wrong";
    for (int w = 0; !bad && w < t->n_w; w++) {
        size_t n = 0;
        const struct rtag *prev = NULL;
        for (const struct rtag *g = t->w[w].oldest; g; prev = g, g = g->newer) {
            n++;
            if (g->older != prev || g->worker != w)
                bad = "an LRU list is broken";
        }
        if (!bad && prev != t->w[w].newest)
            bad = "an LRU list's newest end is wrong";
        if (!bad && (n != tags[w] || n != t->w[w].n_tags))
            bad = "a worker's tag count is wrong";
        if (!bad && chars[w] != t->w[w].chars)
            bad = "a worker's chars are wrong";
    }
done:
    wfree(chars);
    wfree(tags);
    wfree(work);
    return bad;
}
