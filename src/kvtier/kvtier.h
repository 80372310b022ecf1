/*
 * kvtier - the second tier of the KV cache: blocks the pool lets go of, kept on local disk
 * and in a shared store, found again by their prefix hash.
 *
 * What it is. A block's key is its prefix-cache hash (engine/kv_manager.h: XXH3-128 of
 * its parent's hash and its token ids, from the cache salt), so a key names a whole
 * prefix, never a block alone. An entry is a 64-byte header (magic, the fingerprint of
 * model + shard + KV type + block size + layout, the key, the payload length and its
 * XXH3-64, a checksum of the header) and the block's bytes in the layout-independent order
 * of kv_block_save (exec/kv.h). Tiers, tried in this order:
 *   file   --kv-offload-dir: one file per entry under DIR/<fingerprint>/, written to a
 *          temporary name and renamed; bounded by a byte budget over the whole directory
 *          (every model's entries), least recently used first out; the index is rebuilt
 *          from the directory at start, so a restarted worker finds what it left.
 *   store  --kv-store redis://HOST[:PORT][/DB] or unix:///PATH: a Redis server shared by
 *          workers and machines (hiredis), key "weld:kv:<fingerprint>:<key>"; its size is
 *          Redis's business (maxmemory with an LRU policy).
 * A put goes to every tier that lacks the entry.
 *
 * Trust. Nothing read is used unless its header matches this engine's fingerprint and key
 * and both checksums hold: another model, another dtype or block size, a truncated or
 * corrupted file are counted as rejects (the file is deleted) and read as a miss. So a
 * tier can be shared, copied or damaged without ever changing an answer.
 *
 * Threads. kvtier_get_run runs on the caller's thread (the engine's: a read is what a
 * cache hit waits for). Puts are copied into a bounded queue and written by one writer
 * thread (the engine never waits for a disk or the network to spill); a put that finds
 * the queue full is dropped and counted. A read finds a block still in the queue there. kvtier_flush waits for the queue to drain.
 * Every call other than get_run is safe from any thread; get_run from one thread at a
 * time.
 *
 * Failure. A tier that cannot be opened at start is an error naming it and what to check;
 * later I/O errors (a full disk, Redis gone) are counted, logged at most every 10 s, and
 * read as misses; the store reconnects on the next use.
 */
#ifndef WELD_KVTIER_KVTIER_H
#define WELD_KVTIER_KVTIER_H

#include "core/err.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define KVTIER_HEADER_BYTES 64
#define KVTIER_DEFAULT_DIR_BYTES ((uint64_t)16 << 30)
#define KVTIER_DEFAULT_QUEUE_BYTES ((size_t)256 << 20)

struct kvtier_key {
    uint64_t lo, hi;
};

struct kvtier_config {
    const char *dir;         /* NULL: no file tier */
    uint64_t dir_max_bytes;  /* budget of dir; 0: KVTIER_DEFAULT_DIR_BYTES */
    const char *store_url;   /* NULL: no shared store */
    uint8_t fingerprint[16]; /* what the entries must match (the engine's) */
    size_t block_bytes;      /* payload bytes of one block (> 0) */
    size_t queue_bytes;      /* writes waiting for the writer; 0: KVTIER_DEFAULT_QUEUE_BYTES */
};

enum kvtier_which { KVTIER_FILE = 0, KVTIER_STORE, KVTIER_N };

struct kvtier_tier_stats {
    bool on;
    uint64_t hits, misses;  /* blocks found and valid / not found at this tier */
    uint64_t rejects;       /* entries found but refused (fingerprint, key, checksum) */
    uint64_t errors;        /* I/O or connection errors */
    uint64_t puts, present; /* entries written / not written because already there */
    uint64_t evictions;     /* file tier: entries deleted to stay under the budget */
    uint64_t bytes_read, bytes_written;
    double read_seconds;     /* time in reads that hit */
    uint64_t entries, bytes; /* file tier: what the directory holds now */
};

struct kvtier_stats {
    struct kvtier_tier_stats t[KVTIER_N];
    uint64_t dropped;      /* puts dropped because the queue was full */
    uint64_t queue_hits;   /* blocks read from the write queue (not yet written) */
    uint64_t queued_bytes; /* waiting for the writer now */
};

struct kvtier;

/* Open the configured tiers (at least one); the file tier scans its directory. */
int kvtier_open(struct kvtier **out, const struct kvtier_config *c, struct weld_err *e);
/* Drains the write queue, then closes. NULL-safe. */
void kvtier_close(struct kvtier *t);

/* The longest run keys[0, k) that some tier holds, each block's payload copied to
   dst + i * block_bytes (dst holds n blocks). Tiers are tried per block in order; a
   miss everywhere ends the run. Returns k in [0, n]; never fails (errors read as
   misses). */
int kvtier_get_run(struct kvtier *t, const struct kvtier_key *keys, int n, void *dst);
/* Queue n blocks (src + i * block_bytes) to be written to every tier; returns how many
   were queued (the rest dropped: queue full and !wait, or out of memory). With wait, a
   full queue is waited on instead. */
int kvtier_put(struct kvtier *t, const struct kvtier_key *keys, int n, const void *src, bool wait);
/* Return once every put queued before the call is written (or failed). */
void kvtier_flush(struct kvtier *t);
/* A ticket for the puts queued so far, and waiting (from any thread) until they are
   written: kvtier_flush for puts of one's own while others keep queueing. */
uint64_t kvtier_ticket(struct kvtier *t);
void kvtier_wait_ticket(struct kvtier *t, uint64_t ticket);
void kvtier_stats_get(struct kvtier *t, struct kvtier_stats *st);
/* "file" / "store". */
const char *kvtier_name(enum kvtier_which w);
/* One line for logs: "file /x (3.1 GiB of 16 GiB, 5400 entries), store redis://..." */
void kvtier_describe(struct kvtier *t, char *buf, size_t cap);

/* The header of an entry (exposed for tests that forge or damage entries). */
void kvtier_header_make(uint8_t hdr[KVTIER_HEADER_BYTES], const uint8_t fingerprint[16],
                        struct kvtier_key key, const void *payload, size_t payload_bytes);
/* The entry's file name under the file tier's directory (relative: "<fp>/<key>.kvb"). */
void kvtier_entry_name(char *buf, size_t cap, const uint8_t fingerprint[16], struct kvtier_key key);

#endif
