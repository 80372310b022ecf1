/*
 * blocks - a model proposer's KV under the engine's block ids (draft.c, mtp.c).
 *
 * A proposer that runs a model keeps its KV in a pool of its own, indexed by the engine's
 * block ids (spec_ask.blocks), so block X of the proposer holds its KV of the tokens block
 * X holds in the target, plus scratch blocks past the engine's ids for the partial tail
 * and the guesses. It writes only full blocks the target has computed: exactly the ones
 * the prefix cache, forks and readmission share. Each sequence state has two scratch blocks
 * (logical block j of its tail in scratch j % 2) that keep its tail between calls; when the
 * target has computed a block the tail holds, the block is copied into the engine's
 * (batch.copies_fill) instead of being fed again.
 *
 * What a block holds is its fingerprint: a hash chained over every token from the
 * sequence's start to the block's end, set when the proposer wrote the whole block (0:
 * nothing valid); and fpx, the same over one token more, for a proposer whose KV at a
 * position depends on the next token (MTP: it may take a block whose fp matches but whose
 * fpx does not when it has nothing better). A sequence's leading blocks whose fingerprint matches its own
 * need no feeding. Identical tokens give identical KV, so a block written again keeps its
 * content; within one forward pass a block one entry writes may appear in no other
 * entry's table (exec's kv_check_tables), which claim() enforces per pass.
 */
#ifndef WELD_SPEC_BLOCKS_H
#define WELD_SPEC_BLOCKS_H

#include "exec/batch.h"
#include "spec/spec.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct spec_blocks {
    int bsz, n_pool;         /* block size; the engine's block ids [0, n_pool) */
    uint64_t *fp, *fpx;      /* (n_pool) what each block holds (0: nothing valid) */
    uint32_t *wpass, *rpass; /* (n_pool) the pass that writes / reads each block */
    uint32_t pass;
};

/* What a proposer keeps of one sequence: the head of its own per-sequence struct. */
struct spec_seq {
    uint64_t key, last_use;
    bool used;               /* held by a live sequence */
    int ask;                 /* its ask in the current call, or -1 */
    int tail_from, tail_end; /* positions whose KV its scratch blocks hold */
    int w0;                  /* the first engine block this call writes (copies included) */
    int n_cp;                /* tail blocks to copy into the engine's before it first runs */
    struct kv_block_copy cp[2];
};

/* key's state among n states `stride` bytes apart, each starting with a struct spec_seq:
   its own, else a free one, else the least recently used outside the current call; a
   state taken for key sets *fresh (the caller resets its own fields). NULL: none. */
struct spec_seq *spec_seq_for(void *states, int n, size_t stride, uint64_t key, bool *fresh);
/* Ask q's next guess: the argmax of the logits lg (n_vocab), which go to q->logits when
   wanted. */
void spec_take_guess(struct spec_ask *q, const float *lg, int n_vocab);

/* false: out of memory. */
bool spec_blocks_init(struct spec_blocks *k, int n_pool, int bsz);
void spec_blocks_free(struct spec_blocks *k);
/* The next forward pass's claims begin. */
void spec_blocks_next_pass(struct spec_blocks *k);
/* fp[j] for j in [*n_fp, b): the chained hash of tokens [0, (j + 1) bsz + extra); then
   *n_fp = b (tokens must hold that many). */
void spec_blocks_fingerprints(const struct spec_blocks *k, const int32_t *tokens, int b, int extra,
                              uint64_t *fp, int *n_fp);
/* An ask's table for a call: blocks[0, b) (false: one is outside the engine's ids), then
   the two scratch blocks of state `slot` in the order its tail blocks b, b + 1 use them. */
bool spec_blocks_table(const struct spec_blocks *k, const int32_t *blocks, int b, int slot,
                       int32_t *tab);
/* Where s's call starts feeding, tab[0, ok) valid: the tail blocks the target has computed
   since are planned as copies into the engine's (s->cp), the call feeding on from the
   tail's end where it held only part of one; the scratch tail past b follows when every
   full block is valid. Sets s->w0. */
int spec_blocks_start(struct spec_seq *s, const int32_t *tab, int b, int ok, int bsz);
/* s's entry of positions [pos, pos + n) joins the current pass if spec_blocks_claim allows
   it (its copy targets counted as written); its copies then go to cps (*n_cps grows). */
bool spec_blocks_join(struct spec_blocks *k, struct spec_seq *s, const int32_t *tab, int b, int pos,
                      int n, struct kv_block_copy *cps, int *n_cps);
/* After a pass that ran s's entry [from, to): fingerprints of the blocks it completed or
   copied, and its scratch tail ([b * bsz, tail_to) holds true KV). */
void spec_blocks_ran(struct spec_blocks *k, struct spec_seq *s, const int32_t *tab,
                     const uint64_t *fp, const uint64_t *fpx, int b, int from, int to, int tail_to);
/* From block j on, the first of tab[0, b) whose content is not fp's (b: all are). */
int spec_blocks_valid_until(const struct spec_blocks *k, const int32_t *tab, const uint64_t *fp,
                            int j, int b);
/* Whether an entry of positions [pos, pos + n) over tab (its first b entries the engine's
   blocks) may join the current pass; if so its blocks are claimed and the engine blocks it
   writes marked invalid until set_written. */
bool spec_blocks_claim(struct spec_blocks *k, const int32_t *tab, int b, int pos, int n);
/* Positions [from, to) were written: the engine blocks they complete get fp and fpx (NULL:
   fp). */
void spec_blocks_written(struct spec_blocks *k, const int32_t *tab, const uint64_t *fp,
                         const uint64_t *fpx, int b, int from, int to);

#endif
