/*
 * policy - how the router picks a worker: pure functions from what it knows of the
 * candidates (healthy workers not yet tried for the request) to an index among them.
 *
 *   round_robin   the next candidate after the last one picked (a shared counter).
 *   least_load    the smallest estimated load: running + waiting requests from the worker's
 *                 last /metrics scrape, plus the requests the router started on it since
 *                 then minus those that ended (never below what the router has in flight
 *                 there); ties go to the lower KV-cache usage, then round robin.
 *   cache_aware   SGLang's: if the loads are imbalanced (max - min > balance_abs and
 *                 max > balance_rel x min, load = requests the router has in flight on the
 *                 worker) the least loaded wins; else the candidate whose part of the radix
 *                 tree (tree.h) matches the longest prefix of the request text wins when
 *                 match / text length > cache_threshold (ties: least loaded); else the one
 *                 with the smallest part of the tree, the most room (ties: least loaded).
 *
 * Everything here is deterministic for given inputs; the router supplies the counters and
 * the tree's numbers under its lock (router/workers.c).
 */
#ifndef WELD_ROUTER_POLICY_H
#define WELD_ROUTER_POLICY_H

#include <stdbool.h>
#include <stddef.h>

enum router_policy {
    ROUTER_POLICY_ROUND_ROBIN,
    ROUTER_POLICY_LEAST_LOAD,
    ROUTER_POLICY_CACHE_AWARE
};

/* Why cache_aware picked what it picked (counted in /metrics). */
enum policy_reason {
    POLICY_REASON_BALANCE,
    POLICY_REASON_MATCH,
    POLICY_REASON_ROOM,
    POLICY_REASON_COUNT
};

struct policy_cand {
    double load;       /* least_load: the estimate; cache_aware: router in flight */
    double kv_usage;   /* least_load's tie-break (0..1; 0 when unknown) */
    size_t match;      /* cache_aware: bytes of the text its tree part matches */
    size_t tree_chars; /* cache_aware: bytes its tree part holds */
};

struct policy_params {
    double cache_threshold; /* 0.5 */
    double balance_abs;     /* 32 */
    double balance_rel;     /* 1.5 */
};

/* The names of the command line ("round_robin", ...); false for an unknown one. */
bool policy_from_name(const char *name, enum router_policy *p);
const char *policy_name(enum router_policy p);
const char *policy_reason_name(enum policy_reason r);

/* rr: the caller's counter, advanced. n > 0. */
int policy_round_robin(int n, unsigned long *rr);
int policy_least_load(const struct policy_cand *c, int n, unsigned long *rr);
int policy_cache_aware(const struct policy_cand *c, int n, size_t text_len,
                       const struct policy_params *p, enum policy_reason *why);

#endif
