/*
 * offload - the engine's side of the KV tier (kvtier/): what the pool evicts is saved
 * there, and what a new prompt finds there is loaded instead of computed.
 *
 * Save. The block manager logs each cached block it evicts (kv_manager.h); before the
 * next forward pass, which would overwrite them, offload_apply copies them out of the pool
 * (backend block_save) into the tier's write queue under their prefix hashes. Blocks the
 * tier holds already are skipped; a full queue drops saves (counted), never waits.
 *
 * Load. At admission the scheduler asks offload_lookup for the blocks past the pool's hit
 * (sched.h, struct sched_tier). A prefetch thread reads and checks the run the tier holds
 * (a damaged entry is a miss, never wrong KV). The lookup waits up to 3 ms (a miss or a
 * short run costs no step); past that the sequence waits and the other sequences' steps
 * go on. A later lookup takes what was read, offload_place names its pool blocks, and
 * offload_apply copies them in after the saves (a load may reuse a block being saved) and
 * before the forward pass.
 *
 * Cheaper only. A block's load costs the measured read time; its compute, block_size
 * tokens at the cost of prefill-sized steps (engine.c). While loading measures dearer,
 * lookups answer 0 but every 32nd. Reads in flight hold at most OFFLOAD_STAGING_BYTES.
 *
 * Fingerprint (what every entry must match): XXH3-128 of the layout version, the model's
 * shape, the KV dtype and block size, and samples of every layer's K/V projections and of
 * the embeddings: another model, quantization, dtype or block size never matches.
 *
 * Refused at start: a backend of several processes, a draft or MTP proposer (its own KV
 * would be missing for loaded blocks).
 */
#ifndef WELD_ENGINE_OFFLOAD_H
#define WELD_ENGINE_OFFLOAD_H

#include "engine/kv_manager.h"
#include "exec/runner.h"
#include "kvtier/kvtier.h"
#include "model/model.h"

#define OFFLOAD_STAGING_BYTES ((size_t)512 << 20)

struct offload_params {
    const char *dir;    /* --kv-offload-dir, or NULL */
    uint64_t dir_bytes; /* --kv-offload-size; 0: the tier's default */
    const char *store;  /* --kv-store URL, or NULL */
    int writer_nice;    /* the tier's writer thread (kvtier_config.writer_nice) */
};

struct offload;

int offload_create(struct offload **out, const struct offload_params *p, const struct model *m,
                   struct runner *run, enum weld_dtype kv_dtype, int block_size,
                   struct weld_err *e);
/* Waits for queued writes. NULL-safe. */
void offload_free(struct offload *o);

/* struct sched_tier's two calls (u = the offload). */
int offload_lookup(void *u, const struct kvm_hash *keys, int n, bool take);
void offload_place(void *u, const int32_t *blocks, int n);

/* True while the prefetch thread reads for a lookup; offload_wait sleeps until one
   finishes (at most seconds): an engine with nothing else to run waits there, not spins. */
bool offload_waiting(struct offload *o);
void offload_wait(struct offload *o, double seconds);
/* Before a forward pass: save the blocks kvm evicted (and clear its log), then load the
   placed ones. */
void offload_apply(struct offload *o, struct kvm *kvm);
/* Save blocks (ids with their hashes) now and wait until they are written: a prefill
   worker handing a prompt to a decode worker, a pool saved at shutdown. */
void offload_save(struct offload *o, const struct kvm_evicted *blocks, int n);
/* The same without the wait: the blocks are copied out of the pool now (waiting only for
   room in the write queue); returns the ticket offload_wait_saved waits on, from any
   thread, until they are written. */
uint64_t offload_save_async(struct offload *o, const struct kvm_evicted *blocks, int n);
void offload_wait_saved(struct offload *o, uint64_t ticket);
/* The engine's current estimate of the seconds one token costs to compute (0: none). */
void offload_set_token_cost(struct offload *o, double seconds);
void offload_stats(struct offload *o, struct kvtier_stats *st, uint64_t *blocks_loaded,
                   uint64_t *blocks_saved, double *load_seconds);
void offload_describe(struct offload *o, char *buf, size_t cap);

#endif
