/*
 * weights (exec) - what an executor needs from a model: its checks, f32 vectors, matrices.
 *
 * exec_weights_create() checks, once, everything the kernels will trust: the config
 * numbers the forward pass relies on (head counts divide, rope_dim even and <= head_dim,
 * ...) and every tensor the config needs (present, the exact 2-d shape, a type the kernels
 * can read, enough bytes), with errors that name the model and the tensor. A hand-built or
 * foreign struct model cannot crash the executor once this passed.
 *
 * It also widens the small per-layer vectors (norm weights, biases, qk-norm weights) to
 * f32 once, so kernels never convert them per token. Every matrix the gemm kernels run is
 * moved, once, into one pool of anonymous memory (wmap_huge: 2 MiB aligned, huge pages
 * advised): Q8_0 / Q4_0 / Q4_K / Q6_K matrices on ISAs where the
 * 16-row interleaved form runs faster (gemm_repack_pays), and F32 / F16 / BF16 matrices of
 * rows that cut into two or more equal segments of 128, 64 or 32 (gemm_fseg; AVX-512 and
 * AVX2), are repacked into it (tuning repack=0 keeps every matrix as it is), the others
 * copied as they are. Streaming weights out of the file's page-cache pages decodes slower
 * than out of anonymous memory: 1B F16, 2 threads, 63-67% of the read probe mapped, 84%
 * copied (docs/bench-log/2026-12-02-weight-pool-decode-pairs-attention.md). The source
 * pages then leave the resident set, so resident
 * memory stays at about one copy of the weights; the file stays mapped for the embedding
 * lookup (a tied table whose pooled copy holds the same values is read from the pool:
 * exec_weights.embed). The pool is shared: a second exec_weights of the
 * same model and plan (another backend in the process: `weld bench --pair`, tests, a
 * server's runners) references the first's instead of filling its own, so two runners
 * cost one copy, skip the repacking, and stream the very same bytes. That last point
 * decides paired benchmarks on the VMs here: with a copy each, one runner's copy
 * streamed up to 15% faster than the other's for the life of the process (an A/A pair
 * of one executor: 0.84-1.12x over five processes; one shared copy: 0.98-0.99x), which
 * no interleaving can cancel.
 *
 * F16 matrices are computed as BF16 ones: each weight rounded to bf16 (round to nearest
 * even; every f16 value is a normal f32, so nothing flushes) when the pool is filled, then
 * gemm.h's BF16 contract (activations rounded to bf16, vdpbf16ps's chain), on every ISA,
 * executor and layout alike. That is the instruction this CPU class has for float
 * prefill (vdpbf16ps: twice the products of an f32 FMA); the cost is 3 of f16's 11
 * significant bits (relative 2^-9 per weight, the size of the activations' own rounding),
 * and nothing for an f16 file converted from a bf16 checkpoint, whose values are bf16
 * values already. Measured against llama.cpp (f16 activations, exact f16 weights) in
 * tests/test_exec_llamacpp_oracle.c.
 *
 * Each matrix the ops multiply is described by a struct exec_mat: the gemm weight type
 * (possibly a repacked id), its rows, and whether the gemm kernels run it at all (types
 * without a gemm kernel, e.g. Q5_K, fall back to kern_row_dot in ops.c). The choice
 * depends only on the model and the ISA picked at start (isa_init), never on the executor,
 * so every executor over the same exec_weights computes the same numbers. A matrix is
 * repacked only if every row range the ops hand it starts at a multiple of 16: always true
 * for the row-split ops (program.c aligns splits to 16), and for Q/K/V only when head_dim
 * is a multiple of 16 (one gemm per head).
 *
 * K parts (struct prog_kparts, program.h), asked for with tuning k_parts=N: the O and down
 * products run in N parts along K, cut at KV-head boundaries and at 16-row (and block)
 * boundaries near equal shares of the ffn, so a layer needs two exchanges between workers
 * instead of four. Each part's columns of wo and down are then a matrix of their own in
 * the pool (k = the part's width, repacked like any other), exactly what a
 * tensor-parallel shard holds of them (exec_weights_create_shard), so one process in N
 * parts and N ranks compute the same bits (repacked Q8_0 / Q4_0 have a numeric contract
 * of their own, gemm.h, so the layouts must match, not just the cuts). The cuts depend on
 * the model and N only, never on the executor or the thread count, so the contract above
 * holds: the same numbers everywhere (other numbers than without parts: another
 * summation order).
 */
#ifndef WELD_EXEC_WEIGHTS_H
#define WELD_EXEC_WEIGHTS_H

#include "core/err.h"
#include "exec/program.h"
#include "exec/tuning.h"
#include "kernels/cpu/gemm.h"
#include "model/model.h"

/* The type the products of a weight tensor of type t are computed in: F16 as BF16 (see
   above), every other type as itself. */
static inline int exec_compute_type(int t)
{
    return t == DT_F16 ? DT_BF16 : t;
}

/* The most routed experts a MoE layer may have (the ops keep a bitmap of them). */
#define EXEC_MAX_EXPERTS 1024

/* Token tiles of the ops (exec_weights.tok_tile). */
#define EXEC_TILE 16
#define EXEC_TILE_FLOAT 64
/* Weight bytes of one row piece of a decode-shaped matrix op (exec_weights.piece_bytes). */
#define EXEC_PIECE_BYTES (512u << 10)

/* One weight matrix as the ops multiply it: rows [0, rows) of k elements. */
struct exec_mat {
    int wtype;            /* gemm weight type (a GGUF type or GEMM_*_R16); the tensor's
                             type when !gemm */
    bool gemm;            /* false: no gemm kernel for this type, ops use kern_row_dot */
    bool repacked;        /* data is the 16-row interleaved form (row ranges start at
                             multiples of 16) */
    bool from_f16;        /* an F16 tensor computed as BF16 (rounded when pooled) */
    const void *data;     /* row row0 + r at data + r * row_bytes (repacked: see gemm.h) */
    int64_t row0;         /* the first row held: a tensor-parallel shard holds rows [row0,
                             row0 + rows) of the model's matrix and the ops name rows by
                             their number in the whole matrix (0: all of it) */
    size_t row_bytes;     /* dtype row bytes of k */
    size_t act_row_bytes; /* quantized activation bytes per token (multiple of 64; 0 for
                             the float path and for !gemm) */
    int64_t rows, k;
};

struct exec_layer_mats {
    struct exec_mat wq, wk, wv, wo, gate, up, down; /* gate/up/down: dense FFN layers */
    /* mixture-of-experts layers (model_layer_moe): the router (n_expert rows of dim),
       each routed expert's matrices (n_expert each, NULL on dense layers) and the shared
       expert's (rows 0 when the model has none) */
    struct exec_mat router;
    struct exec_mat *egate, *eup, *edown;
    struct exec_mat sh_gate, sh_up, sh_down;
    /* latent attention layers: wq (no q_lora_rank) or wq_a and wq_b, wkv_a, wkv_b, and
       kbt: every head's key up-projection transposed (n_head * kv_lora_rank rows of
       qk_nope_dim, F32 from wkv_b's values), which takes a query's nope part into the
       latent space: q_lat = kbt_h q_nope (exec_weights.mla_mem) */
    struct exec_mat wq_a, wq_b, wkv_a, wkv_b, kbt;
    /* and the value up-projection: head h's v_head_dim rows of vb start at row h *
       vb_stride + vb_off (wkv_b: stride qk_nope_dim + v_head_dim, offset qk_nope_dim; a
       file's attn_v_b: stride v_head_dim, offset 0) */
    struct exec_mat vb;
    int vb_stride, vb_off;
    /* with K parts (exec_weights.kp): each part's columns of wo and down, matrices of
       their own (k = the part's width; wo and down themselves then unset); a
       tensor-parallel shard holds its part's only */
    struct exec_mat wo_part[PROG_KPARTS_MAX], down_part[PROG_KPARTS_MAX];
};

struct exec_layer_vecs {
    float *attn_norm, *ffn_norm; /* (dim) */
    float *bq;                   /* (n_head*head_dim) or NULL */
    float *bk, *bv;              /* (n_kv_head*head_dim) or NULL */
    float *q_norm, *k_norm;      /* (head_dim) or NULL */
    float *exp_bias;             /* MoE: (n_expert) router choice bias, or NULL */
    float *sh_gate_inp;          /* MoE: (dim) shared expert gate (qwen2moe), or NULL */
    float *q_a_norm;             /* MLA: (q_lora_rank) or NULL */
    float *kv_a_norm;            /* MLA: (kv_lora_rank) */
};

/* One pooled matrix and the tensor it comes from (weights.c's list of every matrix). */
struct exec_mat_ref {
    struct exec_mat *x;
    const struct tensor *t;
    bool aligned;           /* every row range the ops multiply starts at a multiple of 16 (Q/K/V:
                      when head_dim is one), so it may be repacked */
    int64_t r0, r1, k0, k1; /* the rows and columns held ([0, rows) x [0, k): all; a
                               K part or a tensor-parallel shard holds fewer: pooled as a
                               matrix of its own, or for a type without a product kernel
                               read in place, its rows the file's row bytes apart) */
};

struct weight_pool;

struct exec_weights {
    const struct model *m;
    float *output_norm;              /* (dim) */
    struct exec_layer_vecs *layers;  /* (n_layer) */
    float rope_pos_scale;            /* 1 / linear rope factor, else 1 */
    float *mem;                      /* backing of every vector above */
    const struct gemm_ops *go;       /* kernels of the ISA picked at start */
    unsigned gemm_flags;             /* gemm_args.flags of every product: the CPU's
                                        gemm_decode_flags, or the tuning's
                                        decode_pairs and l2_prefetch */
    bool repack;                     /* repack where it pays (tuning repack, default on) */
    struct exec_layer_mats *mats;    /* (n_layer) */
    struct exec_mat *expert_mats;    /* backing of every layer's egate / eup / edown */
    float *mla_mem;                  /* backing of every latent layer's kbt */
    struct tensor *mla_views;        /* (2 n_layer) attn_k_b / attn_v_b seen as 2-d */
    float attn_scale;                /* softmax scale of attention scores: 1 / sqrt(head_dim)
                                        (times YaRN's mscale squared) */
    const float *rope_factors;       /* (rope_dim / 2) divisors of the rope frequencies: the
                                        model's llama3 ones, YaRN's (weights.c), or NULL */
    float *yarn_factors;             /* backing of YaRN's */
    struct exec_mat_ref *list;       /* (n_list) every matrix, in pool order */
    int n_list;
    struct prog_kparts kp;           /* the K parts programs of this model are built in
                                        (kp.n == 1: none, the default; tuning
                                        k_parts=2..4 asks for more where the model's
                                        cuts fit) */
    struct exec_mat output;          /* (n_vocab rows of dim; a shard: rows [vocab0,
                                        vocab1)) */
    struct exec_part part;           /* what of the model it holds (exec_part_whole, or
                                        exec_weights_create_shard's): layers outside
                                        [layer0, layer1) and, unless last, the LM head
                                        are left unset */
    int tp_rank, tp_size;            /* part's K part (0, 1: whole layers) */
    int vocab0, vocab1;              /* the LM head rows held: [0, n_vocab) unsharded */
    const struct exec_mat *embed;    /* a tied embedding table's rows read from the pool's
                                        output matrix (the same values: rows copied, or
                                        GEMM_BF16_R16), not from the file, whose pages were
                                        released (a page fault per new token: 1B BF16,
                                        6 ms of a 405 ms pp128); NULL: from the file */
    size_t max_act_row_bytes;        /* max act_row_bytes over every matrix */
    size_t piece_bytes;              /* O / FFN / DOWN over one token tile run in row
                                        pieces of about this many weight bytes (ops.c):
                                        EXEC_PIECE_BYTES (tests set it small) */
    int tok_tile;                    /* tokens per op tile (ops.c): EXEC_TILE_FLOAT when
                                        every layer matrix takes the float path (F16 /
                                        BF16 / F32: weights are the bytes that bound a
                                        prefill, so each pass serves more tokens), else
                                        EXEC_TILE */
    struct weight_pool *pool;        /* anonymous (huge-page advised) memory holding every
                                        gemm matrix, repacked or copied, shared with the
                                        model's other exec_weights of the same plan
                                        (weights.c); NULL if none */
};

/* Weight bytes a decode step of model m streams per stage (its matrices over the stages
   of a default program: five per layer, the embedding and the LM head). Under
   EXEC_SMALL_STAGE_BYTES a second worker costs more in synchronisation than it saves
   (stories260K, 38 KB a stage: two threads decode at 0.7x of one on the 2-vCPU hosts
   here; a 4 MB model of 170 KB a stage at 1.18x), so the cpu backend's default thread
   count is then 1 (docs/bench-log/2026-12-04-k-parts-tiny-models.md). */
#define EXEC_SMALL_STAGE_BYTES (64u << 10)
size_t exec_stage_bytes(const struct model *m);

/* Weight bytes one decode token reads: every layer's matrices (of a mixture of experts the
   router, the shared expert and n_expert_used experts' worth) and the LM head. */
size_t exec_decode_bytes(const struct model *m);

/* Fails with isa_init's message if WELD_ISA asks for an instruction set the CPU lacks, and
   when t (NULL: every automatic choice) asks for K parts the model cannot be cut in. Only
   t's decode_pairs, l2_prefetch, repack and k_parts matter here. */
int exec_weights_create(struct exec_weights **out, const struct model *m,
                        const struct exec_tuning *t, struct weld_err *e);
/* One rank's part of the model (exec/backend_tp.c, struct exec_part). Tensor parallelism
   (part->tp_size >= 2): K part tp_rank of tp_size (t's k_parts is ignored): Q rows of the
   part's query heads, K and V rows of its KV heads, gate and up rows of its ffn rows, wo
   and down columns of the same (wo_part / down_part of the part alone, the others
   zero), LM head rows [vocab0, vocab1) (exec_tp_vocab_cut). Pipeline parallelism: the
   matrices of layers [layer0, layer1) only, and the LM head only on the last stage.
   Every vector is held whole; only the held matrices are read from the file and pooled.
   Fails naming the reason when the model cannot be cut so (heads that do not divide,
   a mixture of experts, latent attention). */
int exec_weights_create_shard(struct exec_weights **out, const struct model *m,
                              const struct exec_tuning *t, const struct exec_part *part,
                              struct weld_err *e);
/* The LM head rows of rank r of n: [cut(r), cut(r + 1)), near equal shares on
   LOGITS_CHUNK boundaries (the softmax statistics' chunks) when every rank gets two or
   more of them, else on 16-row boundaries. */
int exec_tp_vocab_cut(int n_vocab, int r, int n);
/* The ffn row where K part i of n starts when the down matrices' blocks are `block`
   elements (the largest over the layers is the model's cut): near the equal share, on a
   multiple of 16 and of the block. */
int exec_kparts_ffn_cut(int ffn_dim, int block, int i, int n);
void exec_weights_free(struct exec_weights *w);

#endif
