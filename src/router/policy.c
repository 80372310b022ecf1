/*
 * policy - the worker choice (policy.h). Loads are doubles so the least_load estimate may
 * carry a fractional KV term later without a new interface; comparisons are exact.
 */
#include "router/policy.h"

#include <string.h>

static const char *const names[] = {"round_robin", "least_load", "cache_aware"};
static const char *const reasons[] = {"balance", "match", "room"};

bool policy_from_name(const char *name, enum router_policy *p)
{
    for (int i = 0; i < 3; i++)
        if (!strcmp(name, names[i])) {
            *p = (enum router_policy)i;
            return true;
        }
    return false;
}

const char *policy_name(enum router_policy p)
{
    return (unsigned)p < 3 ? names[p] : "?";
}

const char *policy_reason_name(enum policy_reason r)
{
    return (unsigned)r < POLICY_REASON_COUNT ? reasons[r] : "?";
}

int policy_round_robin(int n, unsigned long *rr)
{
    return (int)((*rr)++ % (unsigned long)n);
}

int policy_least_load(const struct policy_cand *c, int n, unsigned long *rr)
{
    int start = (int)((*rr)++ % (unsigned long)n), best = start;
    for (int k = 1; k < n; k++) {
        int i = (start + k) % n;
        if (c[i].load < c[best].load ||
            (c[i].load == c[best].load && c[i].kv_usage < c[best].kv_usage))
            best = i;
    }
    return best;
}

enum filter { ALL, MATCH_IS, TREE_IS };

/* The least loaded of the candidates the filter keeps (match or tree_chars equal to v);
   the first wins a tie. */
static int least_loaded(const struct policy_cand *c, int n, enum filter f, size_t v)
{
    int best = -1;
    for (int i = 0; i < n; i++) {
        if ((f == MATCH_IS && c[i].match != v) || (f == TREE_IS && c[i].tree_chars != v))
            continue;
        if (best < 0 || c[i].load < c[best].load)
            best = i;
    }
    return best;
}

int policy_cache_aware(const struct policy_cand *c, int n, size_t text_len,
                       const struct policy_params *p, enum policy_reason *why)
{
    double lo = c[0].load, hi = c[0].load;
    size_t best_match = 0, least_tree = c[0].tree_chars;
    for (int i = 0; i < n; i++) {
        lo = c[i].load < lo ? c[i].load : lo;
        hi = c[i].load > hi ? c[i].load : hi;
        best_match = c[i].match > best_match ? c[i].match : best_match;
        least_tree = c[i].tree_chars < least_tree ? c[i].tree_chars : least_tree;
    }
    if (hi - lo > p->balance_abs && hi > p->balance_rel * lo) {
        *why = POLICY_REASON_BALANCE;
        return least_loaded(c, n, ALL, 0);
    }
    if (text_len > 0 && best_match > 0 &&
        (double)best_match / (double)text_len > p->cache_threshold) {
        *why = POLICY_REASON_MATCH;
        return least_loaded(c, n, MATCH_IS, best_match);
    }
    *why = POLICY_REASON_ROOM;
    return least_loaded(c, n, TREE_IS, least_tree);
}
