/*
 * program - the forward pass of a Llama-family model as an instruction list.
 *
 * The program builder turns (model config, batch shape, n_splits) into a flat list of
 * instructions, each a fused op over a slice of the work (a row range of a weight matrix,
 * one (sequence, KV head) of attention, a range of tokens). Every executor runs this same
 * list: the single-threaded reference executor (exec_ref.c) walks it in order; the later
 * persistent-team megakernel hands instructions to workers that synchronise only through
 * the counters named in each instruction; the later op-by-op executor runs each stage with
 * a barrier. The opcodes and their exact semantics are documented in ops.c.
 *
 * Shape, not data: a program depends on the number of sequences, each sequence's token
 * count and logits mode, never on token ids, positions or seq ids, which the executor
 * reads from the step's batch. A runner builds a program once per distinct shape and reuses
 * it (a steady decode step reuses one program forever).
 *
 * Dependencies: instructions are grouped in stages (EMBED; per layer QKV, ATTENTION,
 * O_PROJ, FFN, DOWN, or with K parts QKV, ATTENTION, O_PART, FFN_DOWN_PART; FINAL). In the default program stage k owns counter k; each of its
 * instructions signals counter k once when done and waits until counter k-1 has reached
 * the previous stage's instruction count (wait_count). With PROG_HEAD_DEPS (what the
 * megakernel asks for) the QKV stage is cut by KV-head groups instead: group g's Q, K and
 * V instructions signal a counter of their own, and an ATTENTION instruction waits only on
 * the counters of the groups holding its KV heads ([wait, wait + n_wait), each to
 * wait_count), so attention of one group starts while other groups' projections still
 * run. Every other stage waits for the whole previous stage (a product needs its whole
 * input). A megakernel with per-step epochs waits for wait_count * epoch, so counters
 * never need resetting. The list order is a valid serial schedule; exec_ref checks every
 * wait is met when it reaches an instruction.
 *
 * Buffers: activations live in one arena of planned buffers (PROG_BUF_*), placed once per
 * program by liveness (first writer to last reader in list order) so that buffers whose
 * lifetimes do not overlap share memory. The logits buffer is the caller's and is not in
 * the arena. K and V go straight to the paged KV cache (exec/kv.h).
 *
 * Token tables (flattened batch layout of batch.h): tok_seq[t] is the batch sequence of
 * token t, seq_tok0[s] / seq_ntok[s] its token span, logit_tok[r] the token of logit row r.
 */
#ifndef WELD_EXEC_PROGRAM_H
#define WELD_EXEC_PROGRAM_H

#include "core/err.h"
#include "exec/batch.h"
#include "model/config.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* Full semantics, unit of row0/row1 and buffers of each opcode: above its op_* in ops.c. */
enum prog_op {
    OP_EMBED = 0,             /* rows = tokens: x[t] = embedding of token t */
    OP_ATTN_NORM_QKV_ROPE,    /* rows = Q|K|V heads: rmsnorm, projections, bias, qk-norm,
                                 rope; Q to a buffer, K/V to the paged cache */
    OP_ATTENTION,             /* one batch sequence, rows = KV heads: causal online-softmax
                                 attention over the cache, all query heads of the group */
    OP_O_PROJ_RESIDUAL,       /* rows = model dims: x += Wo att */
    OP_FFN_NORM_GATE_UP_SILU, /* rows = ffn dims: hid = silu(Wgate h) * (Wup h) */
    OP_DOWN_PROJ_RESIDUAL,    /* rows = model dims: x += Wdown hid */
    OP_FINAL_NORM_LOGITS,     /* rows = vocab ids: logits = Woutput rmsnorm(x) */
    OP_O_PART,                /* K parts: one part of the query heads, rows = model dims:
                                 sums_o[part] = Wo[:, part] att[:, part] */
    OP_FFN_DOWN_PART,         /* K parts: rows = the part's ffn dims: hid = silu(Wgate h) *
                                 (Wup h), sums_d[part] = Wdown[:, part] hid */
    OP_MOE_ROUTE,             /* rows = tokens: h = rmsnorm(x), router logits, top-k
                                 experts and their weights */
    OP_MOE_GATE_UP,           /* one active expert (part = its rank) or the shared one
                                 (part -1), rows = its ffn dims, over its tokens */
    OP_MOE_DOWN,              /* the same expert, rows = model dims: its down product */
    OP_MOE_COMBINE,           /* rows = model dims: x += weighted sum of expert outputs */
    OP_MLA_PROJ_A,            /* rows = q_a rows then kv_a rows: the latent projections
                                 of h = rmsnorm(x) */
    OP_MLA_Q_KV,              /* rows = query heads, then one unit for the latent KV row:
                                 queries absorbed into the latent space; the cache row */
    OP_ALLGATHER,             /* tensor parallelism: rows [0, 1); the SUMS buffer's part
                                 `part` (this rank's) to every rank, every rank's to this
                                                                  one (exec_step.comm) */
    OP_SEND_X,                /* pipeline parallelism: rows [0, 1); the residual stream
                                 (in + sums) into X, sent to the next stage */
    OP_RECV_X,                /* rows [0, 1); X from the previous stage */
    OP_AG_START,              /* tensor parallelism, overlapped: rows [0, 1); starts the
                                 ALLGATHER of the SUMS buffer's tokens [tok0, tok1) (exchange
                                 slot aux) and returns */
    OP_AG_WAIT,               /* rows [0, 1); completes the exchange of slot aux */
    OP_MOE_EXCHANGE,          /* expert parallelism: rows [0, 1); every rank's experts'
                                 outputs (MOE_OUT rows) to every rank (aux: ROUTE) */
    OP_REDUCE,                /* tensor parallelism, more than 2 ranks: rows [0, 1); out =
                                 in + sums[0] + .. (every rank's part, in part order): each
                                 rank adds 1/N of the dims, then all are gathered */
    OP_COUNT
};

/* Kinds of planned buffers; each instance is one struct prog_buf. */
enum prog_buf_kind {
    PROG_BUF_X = 0,   /* residual stream (n_tokens, dim); lives the whole program */
    PROG_BUF_Q,       /* per layer: roped queries (n_tokens, n_head * head_dim) */
    PROG_BUF_ATT,     /* per layer: attention output (n_tokens, n_head * head_dim) */
    PROG_BUF_HID,     /* per layer: silu(gate) * up (n_tokens, ffn_dim) */
    PROG_BUF_LOGITS,  /* (n_logit_rows, n_vocab); external: the caller's buffer */
    PROG_BUF_XMID,    /* K parts: the residual stream after attention (n_tokens, dim) */
    PROG_BUF_SUMS,    /* K parts: one product's partial sums (k_parts, n_tokens, dim) */
    PROG_BUF_MOE_H,   /* MoE layer: normalised FFN inputs (n_tokens, dim) */
    PROG_BUF_ROUTE,   /* MoE layer: per token its experts, weights, shared gate
                         (n_tokens, 2 * n_expert_used + 1), ids as int32 bits */
    PROG_BUF_MOE_OUT, /* MoE layer: each (token, slot)'s expert output (n_tokens *
                         n_expert_used, dim), or the shared expert's (n_tokens, dim) */
    PROG_BUF_MLA_A,   /* latent layer: q_a (n_tokens, q_lora_rank) or kv_a (n_tokens,
                         kv_lora_rank + rope_dim) before their norms */
    PROG_BUF_LAT,     /* latent layer: attention in latent space (n_tokens, n_head *
                         kv_lora_rank) */
};

/* K parts (split-K, the tensor-parallel layout): the attention output projection and the
   FFN down projection are cut along their inner dimension into n parts, at KV-head
   boundaries (query heads [head_cut[i], head_cut[i + 1])) and at ffn rows ffn_cut[i]; each
   part's product is a vector of partial sums, and whoever needs the residual stream adds
   them up, in part order. A layer then needs its inputs from other workers twice (before
   the FFN, before the next layer) instead of four times. The cuts are the weights' (exec/
   weights.h), chosen from the model alone, so every executor and thread count computes the
   same numbers; n = 1: no parts. */
#define PROG_KPARTS_MAX 4
struct prog_kparts {
    int n;
    int head_cut[PROG_KPARTS_MAX + 1]; /* query heads: 0 = head_cut[0] < .. < head_cut[n] */
    int ffn_cut[PROG_KPARTS_MAX + 1];  /* ffn dims: 0 = ffn_cut[0] < .. < ffn_cut[n] */
};

/* What of the model one rank of a multi-process engine runs (exec/backend_tp.h): its K
   part of the layers it holds (tensor parallelism) and its layers (pipeline parallelism).
   exec_part_whole(): everything. */
struct exec_part {
    int tp_rank, tp_size; /* K part tp_rank of tp_size; tp_size 1: whole layers */
    int layer0, layer1;   /* the layers held: [layer0, layer1) */
    int vocab0, vocab1;   /* the LM head rows held (last stage): [vocab0, vocab1) */
    bool first, last;     /* holds the embedding (first stage), the final norm and LM head
                             (last stage) */
    bool ep;              /* expert parallelism: routed experts placed whole, experts
                             [E tp_rank / tp_size, E (tp_rank + 1) / tp_size) here */
};

static inline struct exec_part exec_part_whole(const struct model_config *c)
{
    return (struct exec_part){0, 1, 0, c->n_layer, 0, c->n_vocab, true, true, false};
}

struct prog_instr {
    uint8_t op;         /* enum prog_op */
    int16_t layer;      /* -1 for EMBED and FINAL_NORM_LOGITS */
    int32_t seq;        /* batch sequence index (ATTENTION), else -1 */
    int32_t row0, row1; /* work range [row0, row1); unit depends on op (see ops.c) */
    int32_t in, out;    /* buffer ids (index into program.bufs), -1 if none */
    int32_t wait;       /* first counter waited on, -1: none */
    int32_t n_wait;     /* counters waited on: [wait, wait + n_wait) (0 when wait is -1) */
    int32_t wait_count; /* value (per epoch) each waited counter must reach */
    int32_t signal;     /* counter incremented by one when this instruction is done */
    int32_t stage;      /* stage index (program.stage_first) */
    /* K parts (see program.c): the residual input is in[t] + sums[0][t] + .. (sums: -1
       none); its dims [x0, x1) are stored to buffer xout (-1: none). */
    int32_t sums, xout, x0, x1;
    int32_t aux;  /* FFN_DOWN_PART: its HID buffer; MoE ops: the ROUTE buffer;
                     MLA_PROJ_A, MLA_Q_KV: the q_a buffer (-1 without q_lora_rank);
                     latent ATTENTION: its LAT buffer; else -1 */
    int32_t in2;  /* a second input: MOE_COMBINE the shared expert's output (-1: none),
                     MLA_Q_KV the kv_a buffer; else -1 */
    int32_t tok0, tok1; /* tokens [tok0, tok1) only (O_PART, FFN_DOWN_PART, AG_START,
                           AG_WAIT of a tensor-parallel prefill cut in token groups); tok1
                           0: every token */
    int32_t part; /* O_PART / FFN_DOWN_PART: the K part; MOE_GATE_UP / MOE_DOWN: the
                           expert's rank among the step's active experts (-1: the shared
                           expert); else -1 */
};

/* program_build_ex flags */
enum prog_flags {
    PROG_HEAD_DEPS = 1,  /* QKV cut by KV-head groups, one counter each; ATTENTION waits
                           only on its own groups (see above) */
    PROG_NO_OVERLAP = 2, /* tensor parallelism: no token groups in a prefill (each exchange
                            one ALLGATHER stage) */
};

struct prog_buf {
    enum prog_buf_kind kind;
    int layer;          /* -1 for X and LOGITS */
    size_t n_floats;
    size_t offset;      /* floats from the arena start (64-byte aligned); unused if external */
    int first, last;    /* instruction indices of first write and last read */
    bool external;      /* LOGITS: not in the arena */
};

struct program {
    /* shape */
    int n_seqs, n_tokens, n_logit_rows;
    int *seq_ntok;       /* (n_seqs) */
    bool *seq_all_logits; /* (n_seqs) */
    int *seq_tok0;       /* (n_seqs) first token index */
    int *tok_seq;        /* (n_tokens) batch sequence of each token */
    int *logit_tok;      /* (n_logit_rows) token index of each logit row */
    int n_splits;
    unsigned flags;      /* enum prog_flags it was built with */
    struct prog_kparts kp; /* K parts it was built with (kp.n == 1: none) */
    int tp_rank;           /* tensor parallelism: the K part (rank) this program runs, -1:
                            every part (program_build_tp) */
    struct exec_part part; /* what of the model it runs: exec_part_whole, or a rank's
                              (layers, LM head rows, first / last stage) */
    /* instructions */
    struct prog_instr *instrs; /* (n_instr) */
    int n_instr;
    int n_counters;      /* counters signalled (== n_stages without PROG_HEAD_DEPS) */
    int n_stages;
    int *stage_first;    /* (n_stages + 1) first instruction of each stage; stage k is
                            instructions [stage_first[k], stage_first[k + 1]) (the op-by-op
                            executor's unit of work); without PROG_HEAD_DEPS they all
                            signal counter k */
    /* buffers */
    struct prog_buf *bufs; /* (n_bufs) */
    int n_bufs;
    int buf_x, buf_logits;     /* ids of the two program-wide buffers */
    int buf_xmid, buf_sums_o, buf_sums_d; /* K parts: the residual stream after attention,
                                             the O and down partial sums; -1 without */
    size_t arena_floats;       /* arena size the executor must provide */
    uint64_t id;               /* program_id */
};

/* Build the program for model config c and the shape of batch b (which must be valid).
   n_splits >= 1: row-range ops are cut into that many slices (fewer when there are fewer
   rows or heads than that). Matrix ops (O, FFN, DOWN, FINAL) start every slice at a
   multiple of 16 rows, so repacked 16-row weight groups (kernels/cpu/gemm.h) are never cut. */
int program_build(struct program **out, const struct model_config *c, const struct batch *b,
                  int n_splits, struct weld_err *e);
/* The same with enum prog_flags. */
int program_build_ex(struct program **out, const struct model_config *c,
                     const struct batch *b, int n_splits, unsigned flags, struct weld_err *e);
/* The same in K parts kp (NULL or kp->n == 1: none; else checked against c). */
int program_build_kp(struct program **out, const struct model_config *c,
                     const struct batch *b, int n_splits, unsigned flags,
                     const struct prog_kparts *kp, struct weld_err *e);
/* The program of one rank of a multi-process engine (part; NULL: exec_part_whole, as
   program_build_kp). With part->tp_size > 1 (kp->n must equal it), its K part's query and
   KV heads, attention, O part and FFN / down part, an ALLGATHER stage after each O and
   down part (every rank then adds every part's sums in part order: the numbers of the
   whole K-parts program). Layers [layer0, layer1) only: the first stage starts with
   EMBED, the others with RECV_X (the residual stream from the stage before); the last
   stage ends with the LM head over vocabulary rows [vocab0, vocab1), the others with
   SEND_X (the residual stream to the stage after). */
int program_build_tp(struct program **out, const struct model_config *c, const struct batch *b,
                     int n_splits, unsigned flags, const struct prog_kparts *kp,
                     const struct exec_part *part, struct weld_err *e);
void program_free(struct program *p);

/* True if p was built for the same shape as b (so it can run b). */
bool program_matches(const struct program *p, const struct batch *b);

/* A number no other program built in this process has (executors key per-program plans
   by it: a freed program's address may come back, its id never does). */
uint64_t program_id(const struct program *p);

const char *prog_op_name(int op);

/* One line per instruction and buffer, for debugging ("weld ... --dump-program"). */
void program_dump(const struct program *p, FILE *f);

#endif
