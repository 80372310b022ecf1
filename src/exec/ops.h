/*
 * ops - the implementation of each program opcode (semantics above each op_* in ops.c).
 *
 * Every executor calls exec_op_run() for each instruction; executors differ only in who
 * runs which instruction when, never in arithmetic, so their logits are bit-identical.
 * An op reads and writes only: the step's tables, the planned buffers named by the
 * instruction, the KV cache rows of its own (layer, position, head) in the blocks its
 * sequence's table names, and the caller's scratch (exec_scratch_floats() floats, private
 * to the worker). Ops see block tables only, never how they were chosen (kv.h).
 */
#ifndef WELD_EXEC_OPS_H
#define WELD_EXEC_OPS_H

#include "exec/kv.h"
#include "exec/logits_top.h"
#include "exec/program.h"
#include "exec/weights.h"

#include <stdatomic.h>

/* Everything one forward step's instructions need besides the instruction itself. */
struct exec_step {
    const struct model *m;
    const struct exec_weights *w;
    const struct program *p;
    struct kv_cache *kv;
    const int32_t *tokens;   /* (n_tokens) flattened token ids */
    const float *const *embed_rows; /* optional: (n_tokens) each token's input row (dim
                                       floats), which EMBED copies instead of looking the
                                       token up (batch_seq.embeds); NULL: the table */
    const int *pos;          /* (n_tokens) position of each token */
    const int32_t *const *tables; /* (n_seqs) block table of each batch sequence, covering
                                     positions [0, pos + n_tokens) */
    float *arena;            /* (p->arena_floats) planned activation buffers */
    float *logits;           /* (n_logit_rows, n_vocab) caller's output */
    const float *rope;       /* optional: (positions, rope_dim) exec_rope_row of every
                                position the step's tokens are at; NULL: computed per tile */
    uint64_t serial;         /* nonzero and new for every step run: ops share a prepared
                                input between pieces of an instruction within a step (0:
                                never) */
    struct logits_top *tops; /* optional: (n_logit_rows, exec_final_slices(p)) the top of
                                each logit row's slice, written by the FINAL instruction
                                that wrote the slice (logits_top.h); NULL: not wanted */
    struct logits_top *rows; /* optional: (n_logit_rows) the caller's structs; the FINAL
                                instructions fill the softmax statistics of the chunks
                                inside their slice for the rows whose inv_t > 0 */
    float *hidden;           /* optional: (n_logit_rows + n_hid_extra, dim) the final hidden
                                state of each logit row, rmsnorm(x[t]) * output_norm (the LM
                                head's input), then of each token of hid_extra_tok; written
                                by the FINAL instruction whose slice starts at vocab row 0;
                                NULL: not wanted */
    const int *hid_extra_tok; /* (n_hid_extra) tokens (not logit rows) whose hidden state is
                                 wanted too (batch_seq.all_hidden) */
    int n_hid_extra;
    struct exec_comm *comm; /* several processes: the ranks ALLGATHER, SEND_X and
                                 RECV_X exchange with; NULL in one process */
};

/* The communicator of a tensor-parallel step and the first failure of its exchanges: an
   ALLGATHER that fails records it, and every later one does nothing (the step's numbers
   are garbage; the backend returns the error). */
struct comm;
struct exec_comm {
    struct comm *c;    /* the stage's ranks (ALLGATHER), NULL: none */
    struct comm *pipe; /* every rank (SEND_X / RECV_X), NULL: one stage */
    int prev, next;    /* pipe ranks of the stages before and after */
    struct comm_req *slot[4]; /* AG_START's exchanges in flight, by instruction aux */
    _Atomic int n_pending;    /* of them */
    _Atomic int lock;         /* held to touch slot: AG_START, AG_WAIT and the ops' pokes
                                 (exec_comm_poke) may run on different workers */
    void *xbuf;               /* MOE_EXCHANGE's packed rows: this rank's, then everyone's */
    size_t xcap;
    _Atomic int failed;
    struct weld_err err;
};

/* FINAL_NORM_LOGITS instructions of program p (the last stage): the row slices of every
   logit row, numbered in list order (slice i = instruction stage_first[last] + i). */
int exec_final_slices(const struct program *p);

/* The rope angles of position pos: cos of each of the rope_dim / 2 frequencies, then
   their sin (kern_rope_angles with the model's frequency factors and position scale). */
void exec_rope_row(const struct model *m, const struct exec_weights *w, int pos, float *row);

/* Floats of per-worker scratch an op needs for model config c: f32 work buffers plus room
   for quantized activations of any weight type the config allows, aligned by the ops
   themselves (the scratch itself needs only float alignment). */
size_t exec_scratch_floats(const struct model_config *c);

/* Run one instruction. */
void exec_op_run(const struct exec_step *st, const struct prog_instr *in, float *scratch);

/* The pieces instruction in's work is cut into (>= 1): its tokens in tiles (QKV, the
   projections, FFN: exec_weights.tok_tile tokens; ATTENTION: OPS_ATT_TOK of its sequence's tokens;
   FINAL: tok_tile logit rows; EMBED: one piece); O, FFN and DOWN over a single token tile
   (decode) in row pieces of about 512 KiB of weights instead (ops.c). Pieces write disjoint outputs and read
   only the instruction's inputs, so any workers may run any of them in any order, each
   with its own scratch, and the numbers are those of exec_op_run (which runs them all). */
int exec_op_tiles(const struct exec_step *st, const struct prog_instr *in);

/* Run pieces [tile0, tile1) of instruction in. */
void exec_op_run_tiles(const struct exec_step *st, const struct prog_instr *in, float *scratch,
                       int tile0, int tile1);

#endif
