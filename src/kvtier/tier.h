/*
 * tier - what kvtier.c asks of one tier (tier_file.c, tier_redis.c). Internal.
 *
 * An entry is KVTIER_HEADER_BYTES of header and then entry_bytes - KVTIER_HEADER_BYTES of
 * payload, stored as one value. A tier only moves and indexes bytes: kvtier.c checks
 * headers and checksums. get_run and drop run on the engine's thread, put on the writer
 * thread, stats and describe on any: each tier locks what those share.
 */
#ifndef WELD_KVTIER_TIER_H
#define WELD_KVTIER_TIER_H

#include "kvtier/kvtier.h"

struct tier_ops {
    /* Entries of keys[0, n) in order into entries (n * entry_bytes) until the first one
       missing; returns how many were read. An entry of the wrong size ends the run and is
       reported in *bad (its index, else -1); an I/O error ends it and sets *error. */
    int (*get_run)(void *b, const struct kvtier_key *keys, int n, uint8_t *entries, int *bad,
                   bool *error);
    /* 1 written, 0 already there, -1 error (logged by the caller). */
    int (*put)(void *b, struct kvtier_key key, const uint8_t *entry);
    /* Delete an entry found bad. */
    void (*drop)(void *b, struct kvtier_key key);
    /* entries, bytes, evictions (what the tier itself counts); others left alone. */
    void (*stats)(void *b, struct kvtier_tier_stats *st);
    void (*describe)(void *b, char *buf, size_t cap);
    void (*close)(void *b);
};

int tier_file_open(void **b, const struct tier_ops **ops, const char *dir, uint64_t max_bytes,
                   const uint8_t fingerprint[16], size_t entry_bytes, struct weld_err *e);
int tier_redis_open(void **b, const struct tier_ops **ops, const char *url,
                    const uint8_t fingerprint[16], size_t entry_bytes, struct weld_err *e);

/* 32 lowercase hex digits of 16 bytes, NUL-terminated (out: 33 bytes). */
void tier_hex16(char *out, const uint8_t b[16]);
void tier_key_bytes(uint8_t out[16], struct kvtier_key k);

#endif
