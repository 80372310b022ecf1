/*
 * kvtier - the second tier of the KV cache: blocks the pool lets go of, kept on local disk
 * and in a shared store, found again by their prefix hash.
 *
 * A block's key is its prefix-cache hash (engine/kv_manager.h), so a key names a whole
 * prefix, never a block alone. An entry is a 64-byte header (magic, the engine's
 * fingerprint, the key, the payload length and XXH3-64, the header's own XXH3-64) and the
 * block's bytes in kv_block_save's layout-independent order (exec/kv.h). Tiers, in order:
 *   file   --kv-offload-dir: a file per entry under DIR/<fingerprint>/, renamed into
 *          place; a byte budget over the whole directory, least recently used out first;
 *          the index is rebuilt from the directory at start (a restart finds it all).
 *   store  --kv-store redis://HOST[:PORT][/DB] or unix:///PATH: a Redis server shared by
 *          workers and machines, key "weld:kv:<fingerprint>:<key>"; its size is Redis's
 *          business (maxmemory with an LRU policy).
 * A put goes to every tier that lacks the entry.
 *
 * Trust. Nothing read is used unless its header matches the fingerprint and key and both
 * checksums hold; anything else (another model or dtype, a torn or damaged file) is a
 * reject, deleted, and reads as a miss: a tier can be shared or damaged without ever
 * changing an answer.
 *
 * Threads. kvtier_get_run runs on its caller's thread, one at a time. Puts are copied into
 * a bounded queue that one writer thread drains (a full queue drops them, counted), at a
 * lower priority where nobody waits for it (writer_nice), so writing never stretches the
 * engine's steps on a busy core; a read finds a block still queued there. Every other call
 * is safe from any thread.
 *
 * Failure. A tier that cannot be opened is an error naming it; later I/O errors are
 * counted, logged at most every 10 s and read as misses; the store reconnects.
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
    int writer_nice;         /* > 0: the writer thread lowers its priority to this nice value
                                (Linux: per thread); 0: it keeps the caller's */
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
