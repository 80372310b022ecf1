/*
 * tree - the cache-aware policy's approximate radix tree (SGLang's router): which worker
 * has seen which request text, so a request goes where its prefix is likely still in the
 * KV cache.
 *
 * Keys are bytes (request text as UTF-8; a cut inside a character costs nothing but a
 * slightly shorter match). Edges are compressed (a node holds the bytes from its parent),
 * children are kept sorted by first byte (binary search). Each node carries tags: one per
 * worker that holds it, with the worker's last access time. Inserting a text for a worker
 * tags every node on its path; matching a text reports, per worker, how many of its
 * leading bytes that worker's part of the tree holds (a partly matched edge counts its
 * matching bytes).
 *
 * Invariants (rtree_check tests them):
 *   - tags are ancestor-closed: a worker tagged on a node is tagged on its parent; so a
 *     node without tags has no children and is removed at once;
 *   - every worker's tags sit on one LRU list, and an ancestor's tag always comes after
 *     its descendants' (an insert touches its path leaf first, a split puts the new upper
 *     node right after the lower one): the list's head is always a leaf of that worker's
 *     part, which eviction can drop in O(1);
 *   - chars(w) is the sum of the edge lengths of the nodes tagged w; after rtree_evict(w,
 *     max) it is <= max. Every node but the root has a non-empty edge and a tag, so the
 *     nodes and the edge bytes are bounded by the sum of chars over the workers.
 * Costs: insert and match O(len x log 256); eviction and removal O(1) per tag. Not
 * thread-safe (the router's mutex guards it). Worker ids are the caller's small integers.
 */
#ifndef WELD_ROUTER_TREE_H
#define WELD_ROUTER_TREE_H

#include "core/err.h"

#include <stddef.h>

struct rtree;

struct rtree *rtree_create(void);
void rtree_free(struct rtree *t);

/* Per worker id < n_out: out[id] = bytes of text[0, len) its tags cover (0 for a worker the
   tree does not know). Returns the largest. */
size_t rtree_match(const struct rtree *t, const char *text, size_t len, size_t *out, int n_out);
/* Tag text's whole path for worker (>= 0) at time now (any monotonic clock). WELD_OK or
   WELD_ERR_NOMEM (the tree stays valid, the text perhaps partly inserted). */
int rtree_insert(struct rtree *t, const char *text, size_t len, int worker, double now);
/* Drop worker's least recently used leaves until chars(worker) <= max_chars. */
void rtree_evict(struct rtree *t, int worker, size_t max_chars);
/* Forget worker entirely (its id may then be reused). */
void rtree_remove_worker(struct rtree *t, int worker);
/* Bytes of edges tagged with worker (its share of the tree). */
size_t rtree_chars(const struct rtree *t, int worker);
/* Nodes, the root included; and the bytes the tree holds (nodes, edges, tags). */
size_t rtree_nodes(const struct rtree *t);
size_t rtree_bytes(const struct rtree *t);
/* Walk the whole tree and check every invariant above; NULL when all hold, else what broke
   (static text). For tests. */
const char *rtree_check(struct rtree *t);

#endif
