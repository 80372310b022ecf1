/*
 * ops - one function per opcode, over the instruction's slice of work: the comment above
 * each op_* function is its opcode's exact meaning (ops.h: what each may touch).
 *
 * Products go through the gemm kernels of the ISA picked at start (kernels/cpu/gemm.h),
 * one call per (token tile, row range): the normalised or source rows of a tile of up to
 * exec_weights.tok_tile tokens (16; 64 for all-float models, whose prefill is bound by
 * reading the weights once per tile: 1B F16 pp256 +6.5% at 32 over 16, and 1B BF16 pp128
 * about +13% at 64 over 32 with the BF16 kernel's 6-token register tiles, which 32 cut
 * into 5 + a 2-token rest; the quantized ones lost 5% at 32, at 1B Q8_0) are quantized once (act_quant, integer paths) and each weight block is
 * read once per tile. Matrices of types without a gemm kernel fall back to
 * kern_row_dot-style loops (a row converted to f32 once per tile, kern_dot_f32). The gemm
 * contract makes every (row, token) result independent of the tile, of the row range and
 * of the ISA (for one weight layout), so a token's numbers still do not depend on the
 * batch, the split or the executor. Norms use go->rmsnorm and attention go->attn_chunk
 * (kernels/cpu/attn.h: chunks of 16 positions read in place, a tile of up to OPS_ATT_TOK
 * tokens per pass over the cache, online softmax with a polynomial exp), both exact
 * across ISAs.
 *
 * Pieces: those token tiles (OPS_ATT_TOK tokens for ATTENTION, tok_tile logit rows for
 * FINAL) are also the unit exec_op_run_tiles runs, so an executor can hand one
 * instruction's tiles to several workers (exec_mega.c); a tile writes only its own
 * tokens' outputs, and rope angles come from the step's table (exec_step.rope) when the
 * backend gives one.
 *
 * Row ranges: ops pass gemm whole heads (Q/K/V: r0 = head * head_dim) or chunks of
 * OPS_CHUNK rows starting at the instruction's row0; program.c starts every row-split
 * range at a multiple of 16, and exec/weights.c repacks Q/K/V only when head_dim is a
 * multiple of 16, so repacked matrices always see r0 % 16 == 0.
 *
 * Scratch layout (per worker; exec_scratch_floats floats, any 16-byte alignment):
 *   h     (OPS_TILE, dim)          normalised inputs of a tile of tokens
 *   row   (max matrix width)       a weight row converted to f32 (fallback path)
 *   y     (OPS_TILE, ywidth)       per-token outputs of one head, of a row chunk (proj),
 *                                  or gate then up values of a chunk (2 x OPS_TILE x CHUNK)
 *   cosv, sinv (OPS_TILE, rope_dim/2) rope angles of the tile's positions
 *   acc   (OPS_ATT_TOK, n_head, head_dim) attention accumulators of a tile of tokens x one
 *                                  KV head's query group
 *   mx, sum (OPS_ATT_TOK, n_head)  their running max and sum
 *   kc, vc (ATTN_CHUNK, head_dim)  a q8_0 cache's keys / values of a chunk, dequantized
 *   g     (OPS_TILE, max width)    MoE: one expert's tokens' hidden rows, gathered
 *   act, act2 (OPS_TILE, act_bound) bytes, 64-byte aligned: quantized activations (act2:
 *                                  the up projection when its type differs from gate's)
 * act_bound covers every weight type and width the config allows (act_bound_bytes), so
 * the size depends on the config only; ops assert the matrices fit.
 *
 * KV: K/V heads are stored with kv_write_head (converted to the cache type right after
 * rope) and read back in place by the attention kernel (f16/bf16/f32, widened exactly) or
 * dequantized (q8_0, kv_read_head), so attention sees exactly the stored values.
 */
#include "exec/ops.h"
#include "comm/comm.h"
#include "core/alloc.h"

#include "kernels/cpu/attn.h"
#include "kernels/cpu/kernels.h"

#include <math.h>
#include <stdatomic.h>
#include <string.h>

#define OPS_TILE EXEC_TILE_FLOAT /* the most tokens a tile has (scratch sizes) */
#define OPS_CHUNK 64   /* rows per gemm call of the row-split ops (a multiple of 16) */
#define OPS_ATT_TOK 32   /* tokens of one sequence whose queries share a widened K/V chunk
                            (8 -> 32: llama-110m Q8_0 pp512 2,130 -> 2,400 tok/s) */
#define OPS_ATT_ROWS 64   /* query rows per attention kernel call (rows of one KV head) */

/* What one op call covers (exec_op_run_tiles): tokens [t0, t1) of the instruction's
   tokens and, for the row-pieced ops, rows [r0, r1) of its rows (else the instruction's). */
struct span {
    int t0, t1;
    int r0, r1;
};

/* Row pieces: a matrix instruction over one token tile (decode, small batches) is cut
   into pieces of about exec_weights.piece_bytes (512 KiB) of weights, whole multiples of
   OPS_PIECE_ALIGN rows (so repacked groups and decode pairs are never cut), which the
   megakernel hands out like prefill's token tiles: a worker done with its own work joins
   a late one's instruction instead of waiting for it. Each row's numbers are the same
   whichever piece computes it (the gemm contract). The pieces of one instruction share
   their prepared input (normalised, quantized: prep_memo), so cutting costs a
   compare-and-swap per piece and nothing else. */
#define OPS_PIECE_ALIGN 32

struct scratch {
    float *h, *row, *y, *cosv, *sinv, *acc, *mx, *sum, *kc, *vc, *g;
    void *act, *act2;
    size_t act_bytes; /* of each */
    uint64_t *memo;   /* (3) step serial, instruction, first token whose prepared input h /
                         act / act2 hold (prep_memo); serial 0: nothing */
};

static int max_width(const struct model_config *c)
{
    int w = c->dim;
    if (c->n_head * c->head_dim > w)
        w = c->n_head * c->head_dim;
    if (c->ffn_dim > w)
        w = c->ffn_dim;
    if (c->kv_lora_rank > 0) {
        const int ws[] = {c->q_lora_rank, c->kv_lora_rank + c->rope_dim, c->n_head * c->v_head_dim,
                          c->qk_nope_dim};
        for (size_t i = 0; i < sizeof ws / sizeof ws[0]; i++)
            w = ws[i] > w ? ws[i] : w;
    }
    if (c->n_expert > 0) {
        if (c->moe_ffn_dim > w)
            w = c->moe_ffn_dim;
        if (c->shared_ffn_dim > w)
            w = c->shared_ffn_dim;
        if (2 * c->n_expert > w)
            w = 2 * c->n_expert;
    }
    return w;
}

/* Width of a cached head and of the attention accumulators: latent attention reads one
   row of kv_lora_rank + rope_dim per position. */
static int att_hd(const struct model_config *c)
{
    return c->kv_lora_rank > 0 ? c->kv_lora_rank + c->rope_dim : c->head_dim;
}

/* Width of a normalised input row in h: dim, or a latent layer's q_lora_rank. */
static int h_width(const struct model_config *c)
{
    return c->q_lora_rank > c->dim ? c->q_lora_rank : c->dim;
}

static int y_width(const struct model_config *c)
{
    int w = c->head_dim > 2 * OPS_CHUNK ? c->head_dim : 2 * OPS_CHUNK;
    if (att_hd(c) > w)
        w = att_hd(c);
    return c->n_expert > w ? c->n_expert : w;
}

/* MoE: rows of gathered expert inputs (OPS_TILE, max_width) */
static size_t gather_floats(const struct model_config *c)
{
    return c->n_expert > 0 ? (size_t)OPS_TILE * (size_t)max_width(c) : 0;
}

/* Quantized activation bytes per token that any gemm-capable matrix of config c needs
   (every integer layout and BF16's at the widest K, rounded up to a whole super-block). */
static size_t act_bound_bytes(const struct model_config *c)
{
    int64_t k = ((int64_t)max_width(c) + 255) / 256 * 256;
    const int types[] = {DT_Q8_0,       DT_Q4_0,       DT_Q4_K,       DT_Q6_K,      DT_BF16,
                         GEMM_Q8_0_R16, GEMM_Q4_0_R16, GEMM_Q4_K_R16, GEMM_Q6_K_R16};
    size_t best = 0;
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        size_t b = (gemm_act_row_bytes(types[i], k) + 63) / 64 * 64;
        if (b > best)
            best = b;
    }
    return best;
}

static size_t fixed_floats(const struct model_config *c)
{
    return (size_t)OPS_TILE * (size_t)h_width(c) + (size_t)max_width(c) +
           (size_t)OPS_TILE * (size_t)y_width(c) + (size_t)OPS_TILE * (size_t)c->rope_dim +
           (size_t)OPS_ATT_TOK * (size_t)c->n_head * ((size_t)att_hd(c) + 2) +
           2 * (size_t)ATTN_CHUNK * (size_t)att_hd(c) + gather_floats(c);
}

size_t exec_scratch_floats(const struct model_config *c)
{
    size_t act = 2 * (size_t)OPS_TILE * act_bound_bytes(c) + 128;
    return fixed_floats(c) + act / sizeof(float) + 64 + 8;
}

static struct scratch scratch_split(const struct model_config *c, float *base)
{
    struct scratch s;
    s.h = base;
    s.row = s.h + (size_t)OPS_TILE * h_width(c);
    s.y = s.row + max_width(c);
    s.cosv = s.y + (size_t)OPS_TILE * y_width(c);
    s.sinv = s.cosv + (size_t)OPS_TILE * (c->rope_dim / 2);
    s.acc = s.sinv + (size_t)OPS_TILE * (c->rope_dim / 2);
    s.mx = s.acc + (size_t)OPS_ATT_TOK * c->n_head * att_hd(c);
    s.sum = s.mx + (size_t)OPS_ATT_TOK * c->n_head;
    s.kc = s.sum + (size_t)OPS_ATT_TOK * c->n_head;
    s.vc = s.kc + (size_t)ATTN_CHUNK * att_hd(c);
    s.g = s.vc + (size_t)ATTN_CHUNK * c->head_dim;
    uintptr_t a = (uintptr_t)(s.g + gather_floats(c));
    s.act_bytes = (size_t)OPS_TILE * act_bound_bytes(c);
    s.act = (void *)((a + 63) / 64 * 64);
    s.act2 = (uint8_t *)s.act + s.act_bytes;
    s.memo = (uint64_t *)(void *)((uint8_t *)s.act2 + s.act_bytes);
    return s;
}

static float *buf_ptr(const struct exec_step *st, int id)
{
    if (id == st->p->buf_logits)
        return st->logits;
    return st->arena + st->p->bufs[id].offset;
}

/* The worker's scratch holds in h / act / act2 the prepared input of instruction in's
   token tile t0 in this step (a piece of it ran here before): true. Otherwise records that
   it is about to (the caller prepares it) and returns false. Every op that writes h or
   act passes through here (those that never share, with in NULL), so the record is never
   stale. */
static bool prep_memo(const struct exec_step *st, const struct prog_instr *in, int t0,
                      const struct scratch *sc)
{
    uint64_t key[3] = {in ? st->serial : 0,
                       in ? (uint64_t)(in - st->p->instrs) : 0, (uint64_t)(uint32_t)t0};
    if (key[0] && !memcmp(key, sc->memo, sizeof key))
        return true;
    memcpy(sc->memo, key, sizeof key);
    return false;
}

/* y[i * ldy + (r - r0)] = M[r] . x[i] for r in [r0, r1), i < nt. act holds the x rows
   quantized for M (mat_quant) when M is on an integer path. */
static void mat_gemm(const struct exec_step *st, const struct exec_mat *M, int64_t r0,
                     int64_t r1, int nt, const float *x, size_t ldx, const void *act, float *y,
                     size_t ldy, float *rowbuf)
{
    r0 -= M->row0, r1 -= M->row0; /* a shard's rows (weights.h) */
    WELD_ASSERT(r0 >= 0 && r1 <= M->rows);
    if (!M->gemm) {
        for (int64_t r = r0; r < r1; r++) {
            const float *wr = kern_row_f32(M->wtype, (const uint8_t *)M->data +
                                           (size_t)r * M->row_bytes, M->k, rowbuf);
            for (int i = 0; i < nt; i++)
                y[(size_t)i * ldy + (size_t)(r - r0)] = kern_dot_f32(wr, x + (size_t)i * ldx,
                                                                     M->k);
        }
        return;
    }
    WELD_ASSERT(!M->repacked || (r0 % 16 == 0 && (r1 % 16 == 0 || r1 == M->rows)));
    struct gemm_args a = {.wtype = M->wtype, .w = M->data, .w_row_bytes = M->row_bytes,
                          .r0 = r0, .r1 = r1, .k = M->k, .n_tok = nt, .x = x, .ldx = ldx,
                          .act = act, .act_row_bytes = M->act_row_bytes, .y = y, .ldy = ldy,
                          .flags = st->w->gemm_flags};
    st->w->go->gemm(&a);
}

/* Quantize nt rows of x (ldx apart) for M into act (no-op for float and fallback paths). */
static void mat_quant(const struct exec_step *st, const struct exec_mat *M, const float *x,
                      size_t ldx, int nt, void *act, const struct scratch *sc)
{
    if (!M->gemm || !M->act_row_bytes)
        return;
    WELD_ASSERT((size_t)nt * M->act_row_bytes <= sc->act_bytes);
    st->w->go->act_quant(M->wtype, x, ldx, M->k, nt, act, M->act_row_bytes);
}

/* True if activations quantized for a are valid for b. */
static bool same_act(const struct exec_mat *a, const struct exec_mat *b)
{
    return a && a->gemm == b->gemm && a->wtype == b->wtype && a->k == b->k;
}

static void comm_poke(const struct exec_step *st);
static bool expert_here(const struct exec_step *st, int e);

/* ---- opcodes ------------------------------------------------------------------------
   What each computes; every executor must give exactly these results. T = tokens of the
   batch, t one of them, pos(t) its position, tab(t) the block table of its sequence (the
   step's tables, exec/kv.h: engine-chosen or internal, the ops cannot tell); x = buffer
   X; W* the layer's weights; hd = head_dim; "rows r" = [row0, row1) of the instruction.
   Row-range instructions of one stage write disjoint outputs; each recomputes the
   (cheap) rmsnorm of its input instead of sharing it. */

/* EMBED: rows = tokens. x[t] = f32(tok_embd row token(t)). in -, out X. (A tied table
   is read from the weight pool when that holds its values: exec_weights.embed.) */
static void op_embed(const struct exec_step *st, const struct prog_instr *in)
{
    const struct tensor *emb = &st->m->tok_embd;
    const struct exec_mat *pe = st->w->embed;
    const int64_t dim = st->m->cfg.dim;
    size_t rb = kern_row_bytes(emb);
    float *x = buf_ptr(st, in->out);
    for (int t = in->row0; t < in->row1; t++) {
        const int32_t tok = st->tokens[t];
        if (st->embed_rows)
            memcpy(x + t * dim, st->embed_rows[t], (size_t)dim * sizeof(float));
        else if (pe && pe->wtype == GEMM_BF16_R16)
            gemm_bf16r_row_f32(pe->data, pe->row_bytes, tok, dim, x + t * dim);
        else if (pe)
            kern_to_f32(pe->wtype, (const uint8_t *)pe->data + (size_t)tok * pe->row_bytes,
                        x + t * dim, dim);
        else
            kern_to_f32(emb->type, kern_tensor_row(emb, rb, tok), x + t * dim, dim);
    }
}

/* Where a head unit's output goes and what is applied to it (see op_qkv). */
struct qkv_target {
    const struct exec_mat *w;
    const float *bias, *norm; /* bias already offset to the head; may be NULL */
    int head;
    int kind; /* 0 q, 1 k, 2 v */
};

static struct qkv_target qkv_select(const struct exec_step *st, int layer, int u)
{
    const struct model_config *c = &st->m->cfg;
    const struct exec_layer_mats *L = &st->w->mats[layer];
    const struct exec_layer_vecs *v = &st->w->layers[layer];
    struct qkv_target q = {0};
    if (u < c->n_head)
        q = (struct qkv_target){&L->wq, v->bq, v->q_norm, u, 0};
    else if (u < c->n_head + c->n_kv_head)
        q = (struct qkv_target){&L->wk, v->bk, v->k_norm, u - c->n_head, 1};
    else
        q = (struct qkv_target){&L->wv, v->bv, NULL, u - c->n_head - c->n_kv_head, 2};
    if (q.bias)
        q.bias += (size_t)q.head * c->head_dim;
    return q;
}

/* Head units [u, u + n) for tokens [t0, t0 + nt), all of one matrix (q, k or v) and so
   consecutive rows of it, whose normalised inputs are in sc->h and, if *quant is not this
   matrix's kind, are quantized for it into sc->act first: one product over their rows
   instead of one per 64-row head (110M Q4_0 decode 1-5% faster in --pair runs, the 1B and
   Q8_0 within 1%), then each head's bias, norm, rope and store. Row results do not depend on the row range
   (gemm.h), so the numbers are those of one head at a time. */
static void qkv_units(const struct exec_step *st, int layer, int u, int n, int t0, int nt,
                      float *qbuf, const struct exec_mat **quant, const struct scratch *sc)
{
    const struct model_config *c = &st->m->cfg;
    const int hd = c->head_dim, half = c->rope_dim / 2;
    const size_t ldy = (size_t)n * (size_t)hd;
    struct qkv_target q0 = qkv_select(st, layer, u);
    if (!same_act(*quant, q0.w)) {
        mat_quant(st, q0.w, sc->h, (size_t)c->dim, nt, sc->act, sc);
        *quant = q0.w;
    }
    mat_gemm(st, q0.w, (int64_t)q0.head * hd, (int64_t)(q0.head + n) * hd, nt, sc->h,
             (size_t)c->dim, sc->act, sc->y, ldy, sc->row);
    for (int j = 0; j < n; j++) {
        const struct qkv_target q = qkv_select(st, layer, u + j);
        for (int i = 0; i < nt; i++) {
            int t = t0 + i, pos = st->pos[t];
            const int32_t *table = st->tables[st->p->tok_seq[t]];
            float *y = sc->y + (size_t)i * ldy + (size_t)j * hd;
            if (q.bias)
                for (int k = 0; k < hd; k++)
                    y[k] += q.bias[k];
            if (q.norm)
                st->w->go->rmsnorm(y, q.norm, c->norm_eps, y, hd);
            if (q.kind != 2) {
                const float *cs = st->rope ? st->rope + (size_t)pos * c->rope_dim
                                           : sc->cosv + (size_t)i * half;
                const float *sn = st->rope ? cs + half : sc->sinv + (size_t)i * half;
                kern_rope_apply(y, c->rope_dim, c->rope_neox, cs, sn);
            }
            if (q.kind == 0)
                memcpy(qbuf + (size_t)t * c->n_head * hd + (size_t)q.head * hd, y,
                       sizeof(float) * (size_t)hd);
            else {
                uint8_t *dst = kv_pos_head(st->kv, q.kind == 1 ? st->kv->k : st->kv->v,
                                           layer, table, pos, q.head);
                if (st->kv->type == DT_F16) /* the default cache: SIMD, same bytes */
                    st->w->go->to_f16(y, dst, hd);
                else
                    kv_write_head(st->kv, dst, y);
            }
        }
    }
}

/* Token t's row of the residual stream as instruction in reads it: x[t] (x = its `in`),
   or with K parts x[t] + sums[0][t] + sums[1][t] + .. added in part order into dst, whose
   dims [x0, x1) are then stored to xout (op_qkv, op_ffn_down_part). Every reader adds the
   same terms in the same order, so all see the same numbers. */
static const float *residual_row(const struct exec_step *st, const struct prog_instr *in,
                                 const float *x, int t, float *dst)
{
    const int dim = st->m->cfg.dim;
    const float *src = x + (size_t)t * dim;
    if (in->sums < 0)
        return src;
    const size_t stride = (size_t)st->p->n_tokens * (size_t)dim;
    const float *s = buf_ptr(st, in->sums) + (size_t)t * dim;
    for (int j = 0; j < dim; j++)
        dst[j] = src[j] + s[j];
    for (int k = 1; k < st->p->kp.n; k++)
        for (int j = 0; j < dim; j++)
            dst[j] += s[(size_t)k * stride + (size_t)j];
    if (in->xout >= 0 && in->x1 > in->x0)
        memcpy(buf_ptr(st, in->xout) + (size_t)t * dim + in->x0, dst + in->x0,
               sizeof(float) * (size_t)(in->x1 - in->x0));
    return dst;
}

/* Normalise tokens' residual rows (residual_row of instruction in over x) into sc->h:
   tok[i] or, if tok is NULL, t0 + i. */
static void norm_tile(const struct exec_step *st, const struct prog_instr *in, const float *x,
                      const float *weight, const int *tok, int t0, int nt,
                      const struct scratch *sc)
{
    const struct model_config *c = &st->m->cfg;
    for (int i = 0; i < nt; i++) {
        int t = tok ? tok[i] : t0 + i;
        float *h = sc->h + (size_t)i * c->dim;
        st->w->go->rmsnorm(residual_row(st, in, x, t, h), weight, c->norm_eps, h, c->dim);
    }
}

void exec_rope_row(const struct model *m, const struct exec_weights *w, int pos, float *row)
{
    const struct model_config *c = &m->cfg;
    kern_rope_angles((double)pos * w->rope_pos_scale, c->rope_theta, c->rope_dim, w->rope_factors,
                     row, row + c->rope_dim / 2);
}

/* ATTN_NORM_QKV_ROPE: layer l; rows = head units over the concatenation
   [Q heads 0..n_head) [K heads 0..n_kv) [V heads 0..n_kv), so a split never cuts a head
   (rope and qk-norm work on whole heads). For every token t: h = rmsnorm(x[t]) *
   attn_norm; for each unit u: y = W[u*hd..+hd) h (+ bias); Q and K units: y = rmsnorm(y)
   * q_norm/k_norm (qwen3) then rope at pos(t) (linear scaling divides pos; llama3 divides
   frequencies); Q unit -> q[t][u*hd..], K/V unit -> head u of KV row (l, tab(t), pos(t)),
   converted to the cache's element type (kv_write_head). in X, out Q (and the KV cache).
   With K parts, layer l > 0 reads x = xmid[t] + sums_d[0][t] + .. and stores its dims
   [x0, x1) to X (residual_row). */
static void op_qkv(const struct exec_step *st, const struct prog_instr *in,
                   const struct scratch *sc, struct span sp)
{
    const struct model_config *c = &st->m->cfg;
    const int half = c->rope_dim / 2;
    const float *x = buf_ptr(st, in->in);
    float *q = buf_ptr(st, in->out);
    const int T = st->w->tok_tile;
    for (int t0 = sp.t0; t0 < sp.t1; t0 += T) {
        int nt = sp.t1 - t0 < T ? sp.t1 - t0 : T;
        (void)prep_memo(st, NULL, t0, sc);
        norm_tile(st, in, x, st->w->layers[in->layer].attn_norm, NULL, t0, nt, sc);
        if (!st->rope && in->row0 < c->n_head + c->n_kv_head)
            for (int i = 0; i < nt; i++)
                kern_rope_angles((double)st->pos[t0 + i] * st->w->rope_pos_scale, c->rope_theta,
                                 c->rope_dim, st->w->rope_factors, sc->cosv + (size_t)i * half,
                                 sc->sinv + (size_t)i * half);
        const struct exec_mat *quant = NULL;
        /* runs of heads of one matrix, as many as sc->y holds for nt tokens */
        const int cap = (int)((size_t)OPS_TILE * (size_t)y_width(c) /
                              ((size_t)nt * (size_t)c->head_dim));
        for (int u = in->row0, n; u < in->row1; u += n) {
            const int kind = qkv_select(st, in->layer, u).kind;
            for (n = 1; n < cap && u + n < in->row1 &&
                        qkv_select(st, in->layer, u + n).kind == kind; n++)
                ;
            qkv_units(st, in->layer, u, n, t0, nt, q, &quant, sc);
        }
    }
}

/* The key and value rows of KV head h for the chunk's positions [c0, c0 + nc) into
   a->k / a->v. In place (f16/bf16/f32) when one query row reads them; when several do
   (a tile of prefill tokens, or a GQA group), f16/bf16 rows are widened once into
   sc->kc / sc->vc ((ATTN_CHUNK, hd) f32 each) so the kernel does not widen them per row
   (exact either way, so the numbers are the same); a q8_0 cache is always dequantized
   there (the reference dequantizer). */
static void attn_rows(const struct exec_step *st, int layer, const int32_t *table, int h,
                      int c0, int nc, bool shared, struct attn_chunk_args *a,
                      const struct scratch *sc)
{
    const struct kv_cache *kv = st->kv;
    const int hd = kv->head_dim;
    const bool in_place = kv->type == DT_F32 || (!shared && kv->type != DT_Q8_0);
    a->kv_type = in_place ? kv->type : DT_F32;
    /* a block's slots of one head are consecutive rows: one table lookup per block and
       two divisions per chunk, instead of both per position (32 divisions a chunk) */
    int b = c0 / kv->block_size, slot = c0 % kv->block_size;
    const uint8_t *kr = kv_slot_head(kv, kv->k, layer, table[b], slot, h);
    const uint8_t *vr = kv_slot_head(kv, kv->v, layer, table[b], slot, h);
    /* runs of a head's rows inside one block are adjacent: f16/bf16 rows are widened a
       run per call (a call per row of 8 elements was 7% of a stories260K decode) */
    for (int j = 0; j < nc;) {
        if (slot == kv->block_size) {
            b++, slot = 0;
            kr = kv_slot_head(kv, kv->k, layer, table[b], 0, h);
            vr = kv_slot_head(kv, kv->v, layer, table[b], 0, h);
        }
        const int run = nc - j < kv->block_size - slot ? nc - j : kv->block_size - slot;
        float *kd = sc->kc + (size_t)j * hd, *vd = sc->vc + (size_t)j * hd;
        if (!in_place && kv->type != DT_Q8_0) {
            st->w->go->to_f32(kv->type, kr, kd, (int64_t)run * hd);
            st->w->go->to_f32(kv->type, vr, vd, (int64_t)run * hd);
        }
        for (int i = 0; i < run; i++, kr += kv->head_bytes, vr += kv->head_bytes) {
            if (in_place) {
                a->k[j + i] = kr, a->v[j + i] = vr;
                continue;
            }
            if (kv->type == DT_Q8_0) {
                kv_read_head(kv, kr, kd + (size_t)i * hd);
                kv_read_head(kv, vr, vd + (size_t)i * hd);
            }
            a->k[j + i] = (const uint8_t *)(kd + (size_t)i * hd);
            a->v[j + i] = (const uint8_t *)(vd + (size_t)i * hd);
        }
        j += run, slot += run;
    }
}

/* Causal attention for the tokens [t0, t0 + nt) of one sequence (positions increasing)
   and the query heads of KV heads [h0, h1): keys in chunks of ATTN_CHUNK positions from
   position 0 (gemm_ops.attn_chunk, kernels/cpu/attn.h), each chunk widened once for the
   whole tile. A token at position p sees p + 1 keys; its numbers depend only on its
   query, p and the cache (the contract fixes the chunks by absolute position), so batch,
   prompt chunking, tiling and head ranges change nothing. */
/* Where one attend_tile call reads its queries and puts its outputs: query head
   (h, g) of KV head h is qh0 + h * group + g; its row of token t is at q + t * qd +
   qhead * qhd, its output (the first ohd of the hd accumulators, normalised) at out +
   t * od + qhead * ohd. */
struct att_io {
    int group, qh0;
    const float *q;
    size_t qd, qhd;
    float *out;
    size_t od, ohd;
};

static void attend_tile(const struct exec_step *st, int layer, const int32_t *table, int h0, int h1,
                        int t0, int nt, const struct att_io *io, const struct scratch *sc)
{
    const int hd = st->kv->head_dim, group = io->group;
    /* state rows head-major: row (h, i, g) at ((h - h0) * nt + i) * group + g, so one
       call covers every query row of head h in the tile */
    const int rows_h = nt * group;
    const size_t rows = (size_t)(h1 - h0) * (size_t)rows_h;
    for (size_t r = 0; r < rows; r++)
        sc->mx[r] = -INFINITY, sc->sum[r] = 0.0f;
    memset(sc->acc, 0, sizeof(float) * rows * (size_t)hd);
    int n_max = 0;
    for (int i = 0; i < nt; i++)
        if (st->pos[t0 + i] + 1 > n_max)
            n_max = st->pos[t0 + i] + 1;
    const float *qp[OPS_ATT_ROWS];
    int nvis[OPS_ATT_ROWS];
    struct attn_chunk_args a = {.hd = hd, .q = qp, .n = nvis, .scale = st->w->attn_scale};
    /* the order that streams the cache's layout (exec/kv.h): head group after head group,
       each chunk by chunk across its heads (per-head: one head over all its chunks, then
       the next; block-major: chunk by chunk across all heads) */
    const int nch = (n_max + ATTN_CHUNK - 1) / ATTN_CHUNK;
    for (int g0 = h0, g1; g0 < h1; g0 = g1) {
        g1 = kv_group_end(st->kv, g0) < h1 ? kv_group_end(st->kv, g0) : h1;
        for (int it = 0; it < (g1 - g0) * nch; it++) {
            const int h = g0 + it % (g1 - g0), c0 = it / (g1 - g0) * ATTN_CHUNK;
            const int nc = n_max - c0 < ATTN_CHUNK ? n_max - c0 : ATTN_CHUNK;
            attn_rows(st, layer, table, h, c0, nc, rows_h > 1, &a, sc);
            for (int r0 = 0; r0 < rows_h; r0 += OPS_ATT_ROWS) {
                const int nr = rows_h - r0 < OPS_ATT_ROWS ? rows_h - r0 : OPS_ATT_ROWS;
                for (int k = 0; k < nr; k++) {
                    const int i = (r0 + k) / group, g = (r0 + k) % group;
                    const int n = st->pos[t0 + i] + 1 - c0;
                    nvis[k] = n <= 0 ? 0 : n < ATTN_CHUNK ? n : ATTN_CHUNK;
                    qp[k] = io->q + (size_t)(t0 + i) * io->qd +
                            (size_t)(io->qh0 + h * group + g) * io->qhd;
                }
                const size_t base = (size_t)(h - h0) * rows_h + r0;
                a.nq = nr;
                a.m = sc->mx + base, a.l = sc->sum + base, a.acc = sc->acc + base * hd;
                st->w->go->attn_chunk(&a);
            }
        }
    }
    for (int h = h0; h < h1; h++)
        for (int r = 0; r < rows_h; r++) {
            const size_t s = (size_t)(h - h0) * rows_h + r;
            const int i = r / group, g = r % group;
            float *o = io->out + (size_t)(t0 + i) * io->od +
                       (size_t)(io->qh0 + h * group + g) * io->ohd;
            for (size_t k = 0; k < io->ohd; k++)
                o[k] = sc->acc[s * hd + k] / sc->sum[s];
        }
}

/* ---- latent attention (multi-head latent attention, model/config.h) -------------------
   hk = kv_lora_rank + rope_dim. The cache holds one row of hk per position: the
   normalised latent c = rmsnorm(kv_a[:kvl]) * kv_a_norm, then the roped shared key
   k_pe. A query head's row in Q is [kbt_h q_nope (kvl), roped q_pe (rope_dim)], so its
   score against a position is q_nope . (Wk_h c) + q_pe . k_pe, the expanded form's, and
   its softmax-weighted sum of cache rows gives, in the first kvl dims, the latent whose
   value up-projection Wv_h is the head's output. */

/* MLA_PROJ_A: layer l; rows = [0, q_lora_rank) of q_a then [q_lora_rank, + kv_lora_rank
   + rope_dim) of kv_a (an instruction never spans both). h = rmsnorm(x[t]) * attn_norm;
   qa[t][r] = Wq_a[r] . h, kva[t][r'] = Wkv_a[r'] . h. in X, out KVA (MLA_A), aux QA. */
static void op_mla_proj_a(const struct exec_step *st, const struct prog_instr *in,
                          const struct scratch *sc, struct span sp)
{
    const struct model_config *c = &st->m->cfg;
    const struct exec_layer_mats *L = &st->w->mats[in->layer];
    const int ql = c->q_lora_rank, kva = c->kv_lora_rank + c->rope_dim;
    const bool is_q = in->row0 < ql;
    const struct exec_mat *M = is_q ? &L->wq_a : &L->wkv_a;
    const int base = is_q ? 0 : ql, ld = is_q ? ql : kva;
    float *dst = buf_ptr(st, is_q ? in->aux : in->out);
    const float *x = buf_ptr(st, in->in);
    const int T = st->w->tok_tile;
    for (int t0 = sp.t0; t0 < sp.t1; t0 += T) {
        int nt = sp.t1 - t0 < T ? sp.t1 - t0 : T;
        (void)prep_memo(st, NULL, t0, sc);
        norm_tile(st, in, x, st->w->layers[in->layer].attn_norm, NULL, t0, nt, sc);
        mat_quant(st, M, sc->h, (size_t)c->dim, nt, sc->act, sc);
        mat_gemm(st, M, in->row0 - base, in->row1 - base, nt, sc->h, (size_t)c->dim, sc->act,
                 dst + (size_t)t0 * (size_t)ld + (in->row0 - base), (size_t)ld, sc->row);
    }
}

/* MLA_Q_KV: layer l; rows = query heads [0, n_head), then unit n_head: the latent row.
   Query head u of token t: cq = rmsnorm(qa[t]) * q_a_norm (without q_lora_rank: h =
   rmsnorm(x[t]) * attn_norm), y = Wq[u*hd..+hd) cq, y[nope..] roped at pos(t) (rope_dim
   dims); q[t][u*hk..] = [kbt_u . y[..nope] (kvl), y[nope..]]. Latent unit: r = kva[t];
   row = [rmsnorm(r[..kvl]) * kv_a_norm, rope(r[kvl..])] into the cache (head 0 of the
   position's slot, converted as kv_write_head). in X, aux QA (-1: none), in2 KVA, out Q. */
static void op_mla_q_kv(const struct exec_step *st, const struct prog_instr *in,
                        const struct scratch *sc, struct span sp)
{
    const struct model_config *c = &st->m->cfg;
    const struct exec_layer_mats *L = &st->w->mats[in->layer];
    const struct exec_layer_vecs *v = &st->w->layers[in->layer];
    const int hd = c->head_dim, nope = c->qk_nope_dim, kvl = c->kv_lora_rank;
    const int rope = c->rope_dim, half = rope / 2, hk = kvl + rope, ql = c->q_lora_rank;
    const size_t qd = (size_t)c->n_head * (size_t)hk;
    const struct exec_mat *Q = ql > 0 ? &L->wq_b : &L->wq;
    const float *x = buf_ptr(st, in->in), *kva = buf_ptr(st, in->in2);
    const float *qa = ql > 0 ? buf_ptr(st, in->aux) : NULL;
    float *q = buf_ptr(st, in->out);
    const int T = st->w->tok_tile, u1 = in->row1 < c->n_head ? in->row1 : c->n_head;
    const int hw = ql > 0 ? ql : c->dim;
    for (int t0 = sp.t0; t0 < sp.t1; t0 += T) {
        int nt = sp.t1 - t0 < T ? sp.t1 - t0 : T;
        (void)prep_memo(st, NULL, t0, sc);
        if (!st->rope)
            for (int i = 0; i < nt; i++)
                kern_rope_angles((double)st->pos[t0 + i] * st->w->rope_pos_scale, c->rope_theta,
                                 rope, st->w->rope_factors, sc->cosv + (size_t)i * half,
                                 sc->sinv + (size_t)i * half);
        if (in->row0 < u1) {
            if (ql > 0)
                for (int i = 0; i < nt; i++)
                    st->w->go->rmsnorm(qa + (size_t)(t0 + i) * ql, v->q_a_norm, c->norm_eps,
                                       sc->h + (size_t)i * ql, ql);
            else
                norm_tile(st, in, x, v->attn_norm, NULL, t0, nt, sc);
            mat_quant(st, Q, sc->h, (size_t)hw, nt, sc->act, sc);
        }
        for (int u = in->row0; u < u1; u++) {
            mat_gemm(st, Q, (int64_t)u * hd, (int64_t)(u + 1) * hd, nt, sc->h, (size_t)hw, sc->act,
                     sc->y, (size_t)hd, sc->row);
            for (int i = 0; i < nt; i++) {
                const int pos = st->pos[t0 + i];
                const float *cs = st->rope ? st->rope + (size_t)pos * rope
                                           : sc->cosv + (size_t)i * half;
                const float *sn = st->rope ? cs + half : sc->sinv + (size_t)i * half;
                float *y = sc->y + (size_t)i * hd;
                kern_rope_apply(y + nope, rope, c->rope_neox, cs, sn);
                memcpy(q + (size_t)(t0 + i) * qd + (size_t)u * hk + kvl, y + nope,
                       sizeof(float) * (size_t)rope);
            }
            /* into the latent space: kbt (f32 from wkv_b, or the file's attn_k_b) */
            if (L->kbt.gemm && L->kbt.act_row_bytes) {
                WELD_ASSERT((size_t)nt * L->kbt.act_row_bytes <= sc->act_bytes);
                st->w->go->act_quant(L->kbt.wtype, sc->y, (size_t)hd, L->kbt.k, nt, sc->act2,
                                     L->kbt.act_row_bytes);
            }
            mat_gemm(st, &L->kbt, (int64_t)u * kvl, (int64_t)(u + 1) * kvl, nt, sc->y, (size_t)hd,
                     sc->act2, q + (size_t)t0 * qd + (size_t)u * hk, qd, sc->row);
        }
        if (in->row1 <= c->n_head)
            continue;
        for (int i = 0; i < nt; i++) {
            const int t = t0 + i, pos = st->pos[t];
            const float *r = kva + (size_t)t * (size_t)hk;
            float *row = sc->y;
            st->w->go->rmsnorm(r, v->kv_a_norm, c->norm_eps, row, kvl);
            memcpy(row + kvl, r + kvl, sizeof(float) * (size_t)rope);
            const float *cs = st->rope ? st->rope + (size_t)pos * rope
                                       : sc->cosv + (size_t)i * half;
            const float *sn = st->rope ? cs + half : sc->sinv + (size_t)i * half;
            kern_rope_apply(row + kvl, rope, c->rope_neox, cs, sn);
            uint8_t *dst = kv_pos_head(st->kv, st->kv->k, in->layer, st->tables[st->p->tok_seq[t]],
                                       pos, 0);
            if (st->kv->type == DT_F16)
                st->w->go->to_f16(row, dst, hk);
            else
                kv_write_head(st->kv, dst, row);
        }
    }
}

/* Latent ATTENTION: one batch sequence s; rows = query heads. For every token t of s and
   head h in rows: lat[t][h*kvl..] = the first kvl dims of the causal softmax(q.row *
   attn_scale) weighted sum of the cache rows of positions 0..pos(t) (every head reads the
   same rows: one KV head), then att[t][h*v..] = Wv_h lat[t][h*kvl..] (v_head_dim rows of
   kvl: wkv_b's value rows of head h, or the file's attn_v_b). in Q, aux LAT, out ATT. */
static void op_attention_latent(const struct exec_step *st, const struct prog_instr *in,
                                const struct scratch *sc, struct span sp)
{
    const struct model_config *c = &st->m->cfg;
    const struct program *p = st->p;
    const struct exec_layer_mats *L = &st->w->mats[in->layer];
    const int s = in->seq, kvl = c->kv_lora_rank, hk = kvl + c->rope_dim, vd = c->v_head_dim;
    WELD_ASSERT(st->kv->n_kv_head == 1 && st->kv->head_dim == hk && st->kv->latent);
    const size_t ld_lat = (size_t)c->n_head * (size_t)kvl, ld_att = (size_t)c->n_head * vd;
    float *lat = buf_ptr(st, in->aux), *att = buf_ptr(st, in->out);
    const struct att_io io = {in->row1 - in->row0,
                              in->row0,
                              buf_ptr(st, in->in),
                              (size_t)c->n_head * (size_t)hk,
                              (size_t)hk,
                              lat,
                              ld_lat,
                              (size_t)kvl};
    const int32_t *table = st->tables[s];
    const int t_end = p->seq_tok0[s] + sp.t1, T = st->w->tok_tile;
    for (int t0 = p->seq_tok0[s] + sp.t0; t0 < t_end; t0 += OPS_ATT_TOK) {
        const int nt = t_end - t0 < OPS_ATT_TOK ? t_end - t0 : OPS_ATT_TOK;
        attend_tile(st, in->layer, table, 0, 1, t0, nt, &io, sc);
        for (int h = in->row0; h < in->row1; h++) {
            const float *xs = lat + (size_t)h * kvl;
            const int64_t r0 = (int64_t)h * L->vb_stride + L->vb_off;
            for (int tt = t0; tt < t0 + nt; tt += T) {
                const int n = t0 + nt - tt < T ? t0 + nt - tt : T;
                (void)prep_memo(st, NULL, tt, sc);
                mat_quant(st, &L->vb, xs + (size_t)tt * ld_lat, ld_lat, n, sc->act, sc);
                mat_gemm(st, &L->vb, r0, r0 + vd, n, xs + (size_t)tt * ld_lat, ld_lat, sc->act,
                         att + (size_t)tt * ld_att + (size_t)h * vd, ld_att, sc->row);
            }
        }
    }
}

/* ATTENTION: layer l; seq s; rows = a range of KV heads (program.c attn_pieces). For every
   token t of s and every query head hq with hq / (n_head / n_kv) in rows: causal attention
   over cache positions 0..pos(t) of tab(s) (keys/values widened to f32 exactly; positions
   below the sequence's pos may sit in blocks another sequence computed) with scores
   q.k / sqrt(hd), softmax computed online in chunks of 16 positions (kernels/cpu/attn.h);
   att[t][hq*hd..]. Waits for the QKV instructions of its heads: the batch's own keys are
   in the cache (default programs: the whole QKV stage; PROG_HEAD_DEPS: the counters of
   the KV-head groups holding rows). in Q, out ATT. */
static void op_attention(const struct exec_step *st, const struct prog_instr *in,
                         const struct scratch *sc, struct span sp)
{
    const struct program *p = st->p;
    const float *q = buf_ptr(st, in->in);
    float *att = buf_ptr(st, in->out);
    int s = in->seq;
    const struct model_config *c = &st->m->cfg;
    if (c->kv_lora_rank > 0) {
        op_attention_latent(st, in, sc, sp);
        return;
    }
    /* the cache's heads are the model's (its layout's head groups index by them), or a
       tensor-parallel shard's, which holds the instruction's */
    WELD_ASSERT(st->kv->head0 <= in->row0 && in->row1 <= st->kv->head0 + st->kv->n_kv_head &&
                st->kv->head_dim == c->head_dim && (st->comm || st->kv->n_kv_head == c->n_kv_head));
    const int32_t *table = st->tables[s];
    const int t_end = p->seq_tok0[s] + sp.t1;
    const size_t hd = (size_t)c->head_dim, qd = (size_t)c->n_head * hd;
    const struct att_io io = {c->n_head / c->n_kv_head, 0, q, qd, hd, att, qd, hd};
    for (int t0 = p->seq_tok0[s] + sp.t0; t0 < t_end; t0 += OPS_ATT_TOK) {
        int nt = t_end - t0 < OPS_ATT_TOK ? t_end - t0 : OPS_ATT_TOK;
        attend_tile(st, in->layer, table, in->row0, in->row1, t0, nt, &io, sc);
    }
}

/* x[t][r] += W[r] . in[t] for the instruction's rows, every token. */
/* Rows per product call of the row-split ops for nt tokens when the outputs may take
   cap_floats of scratch: OPS_CHUNK, or for one token (decode) as many as fit, so a decode
   piece is one call instead of one per 64 rows (each call restarts the weight stream:
   110M decode 1-4% faster in --pair runs, 1B within 1%; prefill measured the same). */
static int chunk_rows(int nt, size_t cap_floats)
{
    if (nt > 1)
        return OPS_CHUNK;
    size_t r = cap_floats / 16 * 16;
    return r > OPS_CHUNK ? (int)(r < 1u << 20 ? r : 1u << 20) : OPS_CHUNK;
}

/* dst[t][r] (+)= M[r] . src[t] for rows [r0, r1) and tokens [t0, t1) (rows ld_src and
   ld_dst floats apart): added with add, else stored. The quantized input is shared
   between row pieces of memo_in (prep_memo; NULL: never). */
static void proj_rows(const struct exec_step *st, const struct exec_mat *M, const float *src,
                      size_t ld_src, float *dst, size_t ld_dst, int r0, int r1, int t0, int t1,
                      bool add, const struct prog_instr *memo_in, const struct scratch *sc)
{
    const int T = st->w->tok_tile;
    for (int tt = t0; tt < t1; tt += T) {
        int nt = t1 - tt < T ? t1 - tt : T;
        comm_poke(st);
        const float *xs = src + (size_t)tt * ld_src;
        if (!prep_memo(st, memo_in, tt, sc))
            mat_quant(st, M, xs, ld_src, nt, sc->act, sc);
        if (!add) {
            mat_gemm(st, M, r0, r1, nt, xs, ld_src, sc->act, dst + (size_t)tt * ld_dst + r0,
                     ld_dst, sc->row);
            continue;
        }
        const int ch = chunk_rows(nt, (size_t)OPS_TILE * (size_t)y_width(&st->m->cfg));
        for (int r = r0; r < r1; r += ch) {
            int cw = r1 - r < ch ? r1 - r : ch;
            mat_gemm(st, M, r, r + cw, nt, xs, ld_src, sc->act, sc->y, (size_t)ch, sc->row);
            for (int i = 0; i < nt; i++) {
                float *xr = dst + (size_t)(tt + i) * ld_dst + r;
                const float *yr = sc->y + (size_t)i * ch;
                for (int j = 0; j < cw; j++)
                    xr[j] += yr[j];
            }
        }
    }
}

/* O_PROJ_RESIDUAL: layer l; rows = output dims. x[t][r] += Wo[r] . att[t]. in ATT, out X.
   DOWN_PROJ_RESIDUAL: layer l; rows = output dims. x[t][r] += Wdown[r] . hid[t]. in HID,
   out X. */
static void op_proj_residual(const struct exec_step *st, const struct prog_instr *in,
                             const struct exec_mat *M, const struct scratch *sc,
                             struct span sp)
{
    proj_rows(st, M, buf_ptr(st, in->in), (size_t)M->k, buf_ptr(st, in->out),
              (size_t)st->m->cfg.dim, sp.r0, sp.r1, sp.t0, sp.t1, true, in, sc);
}

/* O_PART (K parts): layer l; part i; rows = output dims (all of them). For every token t:
   sums_o[i][t][r] = Wo[r][cols] . att[t][cols], cols = the query heads
   [head_cut[i], head_cut[i + 1]) (whole KV-head groups). in ATT, out SUMS (sums_o:
   (k_parts, n_tokens, dim)). */
static void op_o_part(const struct exec_step *st, const struct prog_instr *in,
                      const struct scratch *sc, struct span sp)
{
    const struct model_config *c = &st->m->cfg;
    const struct prog_kparts *kp = &st->p->kp;
    WELD_ASSERT(in->part >= 0 && in->part < kp->n && kp->n == st->w->kp.n &&
                kp->head_cut[in->part] == st->w->kp.head_cut[in->part]);
    const size_t qd = (size_t)c->n_head * (size_t)c->head_dim;
    const float *src = buf_ptr(st, in->in) + (size_t)kp->head_cut[in->part] * c->head_dim;
    float *dst = buf_ptr(st, in->out) + (size_t)in->part * st->p->n_tokens * c->dim;
    proj_rows(st, &st->w->mats[in->layer].wo_part[in->part], src, qd, dst, (size_t)c->dim,
              in->row0, in->row1, sp.t0, sp.t1, false, NULL, sc);
}

/* hid[t][r] = silu(gate[r] . h[t]) * (up[r] . h[t]) for the span's rows and tokens. */
static void ffn_rows(const struct exec_step *st, const struct prog_instr *in, float *hid,
                     const struct scratch *sc, struct span sp)
{
    const struct model_config *c = &st->m->cfg;
    const struct exec_layer_mats *L = &st->w->mats[in->layer];
    const float *x = buf_ptr(st, in->in);
    float *g = sc->y, *u = sc->y + OPS_TILE * OPS_CHUNK;
    const size_t ld = (size_t)c->dim;
    const bool shared = same_act(&L->gate, &L->up);
    void *act_up = shared ? sc->act : sc->act2;
    const int T = st->w->tok_tile;
    for (int t0 = sp.t0; t0 < sp.t1; t0 += T) {
        int nt = sp.t1 - t0 < T ? sp.t1 - t0 : T;
        comm_poke(st);
        if (!prep_memo(st, in, t0, sc)) {
            norm_tile(st, in, x, st->w->layers[in->layer].ffn_norm, NULL, t0, nt, sc);
            mat_quant(st, &L->gate, sc->h, ld, nt, sc->act, sc);
            if (!shared)
                mat_quant(st, &L->up, sc->h, ld, nt, act_up, sc);
        }
        const int ch = chunk_rows(nt, (size_t)OPS_TILE * OPS_CHUNK);
        for (int r = sp.r0; r < sp.r1; r += ch) {
            int cw = sp.r1 - r < ch ? sp.r1 - r : ch;
            mat_gemm(st, &L->gate, r, r + cw, nt, sc->h, ld, sc->act, g, (size_t)ch, sc->row);
            mat_gemm(st, &L->up, r, r + cw, nt, sc->h, ld, act_up, u, (size_t)ch, sc->row);
            for (int i = 0; i < nt; i++)
                st->w->go->silu_mul(g + (size_t)i * ch, u + (size_t)i * ch,
                                    hid + (size_t)(t0 + i) * c->ffn_dim + r, cw);
        }
    }
}

/* FFN_NORM_GATE_UP_SILU: layer l; rows = ffn dims. h = rmsnorm(x[t]) * ffn_norm;
   hid[t][r] = silu(Wgate[r] . h) * (Wup[r] . h). in X, out HID. */
static void op_ffn(const struct exec_step *st, const struct prog_instr *in,
                   const struct scratch *sc, struct span sp)
{
    ffn_rows(st, in, buf_ptr(st, in->out), sc, sp);
}

/* FFN_DOWN_PART (K parts): layer l; part i; rows = ffn dims [ffn_cut[i], ffn_cut[i + 1]).
   For every token t: x' = x[t] + sums_o[0][t] + .. + sums_o[n-1][t] (in part order), its
   dims [x0, x1) stored to xmid[t]; h = rmsnorm(x') * ffn_norm; hid[t][r] =
   silu(Wgate[r] . h) * (Wup[r] . h) for the rows (into aux, a HID buffer);
   sums_d[i][t][d] = Wdown[d][rows] . hid[t][rows], every d. in X, sums SUMS (sums_o),
   xout XMID, aux HID, out SUMS (sums_d). */
static void op_ffn_down_part(const struct exec_step *st, const struct prog_instr *in,
                             const struct scratch *sc, struct span sp)
{
    const struct model_config *c = &st->m->cfg;
    const struct prog_kparts *kp = &st->p->kp;
    WELD_ASSERT(in->part >= 0 && in->part < kp->n && kp->n == st->w->kp.n &&
                in->row0 == st->w->kp.ffn_cut[in->part] &&
                in->row1 == st->w->kp.ffn_cut[in->part + 1]);
    float *hid = buf_ptr(st, in->aux);
    ffn_rows(st, in, hid, sc, sp);
    float *dst = buf_ptr(st, in->out) + (size_t)in->part * st->p->n_tokens * c->dim;
    proj_rows(st, &st->w->mats[in->layer].down_part[in->part], hid + in->row0,
              (size_t)c->ffn_dim, dst, (size_t)c->dim, 0, c->dim, sp.t0, sp.t1, false, NULL,
              sc);
}

/* ---- mixture of experts ----------------------------------------------------------
   A MoE layer's route row of token t (buffer ROUTE, 2K + 1 floats, K = n_expert_used):
   the ids of its K experts (int32 bits, in the order chosen), their weights, and the
   shared expert's gate (1 without shared_gate). An expert's (token, slot) pairs are
   visited in token order; "rank" j of a step is its j-th lowest active expert id. */

#define MOE_NORM_MIN 6.103515625e-5f /* 2^-14 */

static int32_t route_id(const float *row, int k)
{
    int32_t id;
    memcpy(&id, row + k, sizeof id);
    return id;
}

/* sigmoid under attn_exp's contract (its argument never positive) */
static float moe_sigmoid(float x)
{
    float e = attn_exp(-fabsf(x));
    return x >= 0.0f ? 1.0f / (1.0f + e) : e / (1.0f + e);
}

/* The best (largest; ties: lowest id; NaN never) of v[0..n) not yet taken; -1 if none. */
static int moe_argmax(const float *v, int n, const uint8_t *taken)
{
    int best = -1;
    for (int i = 0; i < n; i++)
        if (!taken[i] && v[i] == v[i] && (best < 0 || v[i] > v[best]))
            best = i;
    return best;
}

/* Token routing from its router logits l (n_expert): the K experts and weights into
   ids / wts. score = softmax(l) or sigmoid(l); choice = score + exp_bias; with groups,
   only experts of the topk_group groups with the best group scores (the sum of a group's
   two best choices, as llama.cpp scores them under either gating) stay; the K best
   choices win (ties: lower id; a row without finite choices takes the lowest ids), each
   weighted by its score, divided by their sum (at least MOE_NORM_MIN, llama.cpp's clamp)
   when expert_norm, times expert_scale.
   tmp: 2 * n_expert floats. */
static void moe_select(const struct model_config *c, const float *l, const float *bias, float *tmp,
                       int32_t *ids, float *wts)
{
    const int n = c->n_expert, K = c->n_expert_used;
    float *score = tmp, *choice = tmp + n;
    uint8_t taken[EXEC_MAX_EXPERTS];
    if (c->gating == MOE_GATING_SOFTMAX) {
        float m = -INFINITY, sum = 0.0f;
        for (int i = 0; i < n; i++)
            m = l[i] > m ? l[i] : m;
        for (int i = 0; i < n; i++) {
            score[i] = m == -INFINITY || !(l[i] == l[i]) ? 0.0f : attn_exp(l[i] - m);
            sum += score[i];
        }
        for (int i = 0; i < n; i++)
            score[i] = sum > 0.0f ? score[i] / sum : 0.0f;
    } else {
        for (int i = 0; i < n; i++)
            score[i] = moe_sigmoid(l[i]);
    }
    for (int i = 0; i < n; i++)
        choice[i] = bias ? score[i] + bias[i] : score[i];
    if (c->n_group > 1) {
        const int gs = n / c->n_group;
        float gscore[EXEC_MAX_EXPERTS];
        for (int g = 0; g < c->n_group; g++) {
            memset(taken, 0, (size_t)gs);
            int a = moe_argmax(choice + g * gs, gs, taken);
            float v = a < 0 ? -INFINITY : choice[g * gs + a];
            if (gs > 1 && a >= 0) {
                taken[a] = 1;
                int b = moe_argmax(choice + g * gs, gs, taken);
                v = b < 0 ? v : v + choice[g * gs + b];
            }
            gscore[g] = v;
        }
        memset(taken, 0, (size_t)c->n_group);
        for (int k = 0; k < c->topk_group; k++) {
            int g = moe_argmax(gscore, c->n_group, taken);
            if (g < 0)
                break;
            taken[g] = 1;
        }
        for (int g = 0; g < c->n_group; g++)
            for (int i = 0; !taken[g] && i < gs; i++)
                choice[g * gs + i] = -INFINITY;
    }
    memset(taken, 0, (size_t)n);
    float total = 0.0f;
    for (int k = 0; k < K; k++) {
        int best = moe_argmax(choice, n, taken);
        for (int i = 0; best < 0 && i < n; i++)
            best = taken[i] ? -1 : i;
        taken[best] = 1;
        ids[k] = best;
        wts[k] = score[best];
        total += wts[k];
    }
    for (int k = 0; k < K; k++) {
        if (c->expert_norm)
            wts[k] /= total > MOE_NORM_MIN ? total : MOE_NORM_MIN;
        wts[k] *= c->expert_scale;
    }
}

/* MOE_ROUTE: layer l; rows = tokens. h = rmsnorm(x[t]) * ffn_norm into MOE_H (aux);
   router logits = Wrouter h (the router's own type: gemm or the fallback); the experts and
   weights of moe_select, and the shared gate sigmoid(sh_gate_inp . h) (1 without one),
   into ROUTE[t]. in X, aux MOE_H, out ROUTE. */
static void op_moe_route(const struct exec_step *st, const struct prog_instr *in,
                         const struct scratch *sc, struct span sp)
{
    const struct model_config *c = &st->m->cfg;
    const struct exec_layer_mats *L = &st->w->mats[in->layer];
    const struct exec_layer_vecs *v = &st->w->layers[in->layer];
    const int K = c->n_expert_used, T = st->w->tok_tile;
    const float *x = buf_ptr(st, in->in);
    float *hn = buf_ptr(st, in->aux), *route = buf_ptr(st, in->out);
    for (int t0 = in->row0 + sp.t0; t0 < in->row0 + sp.t1 && t0 < in->row1; t0 += T) {
        int nt = in->row1 - t0 < T ? in->row1 - t0 : T;
        (void)prep_memo(st, NULL, t0, sc);
        norm_tile(st, in, x, v->ffn_norm, NULL, t0, nt, sc);
        memcpy(hn + (size_t)t0 * c->dim, sc->h, sizeof(float) * (size_t)nt * c->dim);
        mat_quant(st, &L->router, sc->h, (size_t)c->dim, nt, sc->act, sc);
        mat_gemm(st, &L->router, 0, c->n_expert, nt, sc->h, (size_t)c->dim, sc->act, sc->y,
                 (size_t)c->n_expert, sc->row);
        for (int i = 0; i < nt; i++) {
            float *r = route + (size_t)(t0 + i) * (size_t)(2 * K + 1);
            int32_t ids[EXEC_MAX_EXPERTS];
            moe_select(c, sc->y + (size_t)i * c->n_expert, v->exp_bias, sc->row, ids, r + K);
            memcpy(r, ids, sizeof(int32_t) * (size_t)K);
            r[2 * K] = v->sh_gate_inp
                           ? moe_sigmoid(
                                 kern_dot_f32(v->sh_gate_inp, sc->h + (size_t)i * c->dim, c->dim))
                           : 1.0f;
        }
    }
}

/* The expert of rank `rank` in this step (the rank-th lowest id any token chose), or -1
   when fewer are active. */
static int moe_rank_expert(const struct exec_step *st, const struct prog_instr *in)
{
    const struct model_config *c = &st->m->cfg;
    const int K = c->n_expert_used;
    const float *route = buf_ptr(st, in->aux);
    uint64_t bits[EXEC_MAX_EXPERTS / 64] = {0};
    for (int t = 0; t < st->p->n_tokens; t++)
        for (int k = 0; k < K; k++) {
            int32_t id = route_id(route + (size_t)t * (size_t)(2 * K + 1), k);
            WELD_ASSERT(id >= 0 && id < c->n_expert);
            bits[id / 64] |= 1ull << (id % 64);
        }
    int left = in->part;
    for (int w = 0; w < (c->n_expert + 63) / 64; w++) {
        int n = __builtin_popcountll(bits[w]);
        if (left >= n) {
            left -= n;
            continue;
        }
        uint64_t b = bits[w];
        for (; left > 0; left--)
            b &= b - 1;
        return w * 64 + __builtin_ctzll(b);
    }
    return -1;
}

/* The next up to `max` (token, slot) pairs routed to expert e from pair index *cur on (a
   pair index is t * K + k), into pr; returns how many. e < 0 (the shared expert): every
   token, slot 0. */
static int moe_next_pairs(const struct exec_step *st, const struct prog_instr *in, int e, int *cur,
                          int *pr, int max)
{
    const int K = st->m->cfg.n_expert_used, total = st->p->n_tokens * K;
    const float *route = buf_ptr(st, in->aux);
    int n = 0;
    for (; *cur < total && n < max; ++*cur)
        if (e < 0 ? *cur % K == 0
                  : route_id(route + (size_t)(*cur / K) * (size_t)(2 * K + 1), *cur % K) == e)
            pr[n++] = *cur;
    return n;
}

/* MOE_GATE_UP: layer l; the expert e of rank `part` (nothing when the step has fewer
   active experts) or, part -1, the shared expert; rows = its ffn dims. For every (token
   t, slot k) routed to e: hid[t * K + k][r] = silu(Wgate_e[r] . h[t]) * (Wup_e[r] . h[t]);
   the shared expert: shid[t][r] for every token. h = MOE_H (in); out HID; aux ROUTE. */
static void op_moe_gate_up(const struct exec_step *st, const struct prog_instr *in,
                           const struct scratch *sc, struct span sp)
{
    const struct model_config *c = &st->m->cfg;
    const struct exec_layer_mats *L = &st->w->mats[in->layer];
    const int e = in->part < 0 ? -1 : moe_rank_expert(st, in);
    if (in->part >= 0 && (e < 0 || !expert_here(st, e)))
        return;
    const struct exec_mat *G = e < 0 ? &L->sh_gate : &L->egate[e];
    const struct exec_mat *U = e < 0 ? &L->sh_up : &L->eup[e];
    const int K = c->n_expert_used, width = (int)G->rows;
    const size_t ld = (size_t)c->dim;
    const float *hn = buf_ptr(st, in->in);
    float *hid = buf_ptr(st, in->out);
    float *g = sc->y, *u = sc->y + OPS_TILE * OPS_CHUNK;
    const bool shared = same_act(G, U);
    void *act_up = shared ? sc->act : sc->act2;
    int pr[OPS_TILE], cur = 0, nt;
    while ((nt = moe_next_pairs(st, in, e, &cur, pr, st->w->tok_tile)) > 0) {
        if (!prep_memo(st, in, pr[0], sc)) {
            for (int i = 0; i < nt; i++)
                memcpy(sc->h + (size_t)i * ld, hn + (size_t)(pr[i] / K) * ld, sizeof(float) * ld);
            mat_quant(st, G, sc->h, ld, nt, sc->act, sc);
            if (!shared)
                mat_quant(st, U, sc->h, ld, nt, act_up, sc);
        }
        const int ch = chunk_rows(nt, (size_t)OPS_TILE * OPS_CHUNK);
        for (int r = sp.r0; r < sp.r1; r += ch) {
            int cw = sp.r1 - r < ch ? sp.r1 - r : ch;
            mat_gemm(st, G, r, r + cw, nt, sc->h, ld, sc->act, g, (size_t)ch, sc->row);
            mat_gemm(st, U, r, r + cw, nt, sc->h, ld, act_up, u, (size_t)ch, sc->row);
            for (int i = 0; i < nt; i++) {
                size_t row = e < 0 ? (size_t)(pr[i] / K) : (size_t)pr[i];
                st->w->go->silu_mul(g + (size_t)i * ch, u + (size_t)i * ch,
                                    hid + row * (size_t)width + r, cw);
            }
        }
    }
}

/* MOE_DOWN: layer l; the expert of MOE_GATE_UP's rank `part` (or the shared one); rows =
   model dims. For its (t, k): out[t * K + k][r] = Wdown_e[r] . hid[t * K + k]; the shared
   expert: sout[t][r] = Wsh_down[r] . shid[t]. in HID, out MOE_OUT, aux ROUTE. */
static void op_moe_down(const struct exec_step *st, const struct prog_instr *in,
                        const struct scratch *sc, struct span sp)
{
    const struct model_config *c = &st->m->cfg;
    const struct exec_layer_mats *L = &st->w->mats[in->layer];
    const int e = in->part < 0 ? -1 : moe_rank_expert(st, in);
    if (in->part >= 0 && (e < 0 || !expert_here(st, e)))
        return;
    const struct exec_mat *D = e < 0 ? &L->sh_down : &L->edown[e];
    const int K = c->n_expert_used;
    const size_t kw = (size_t)D->k, dim = (size_t)c->dim;
    const float *hid = buf_ptr(st, in->in);
    float *out = buf_ptr(st, in->out);
    int pr[OPS_TILE], cur = 0, nt;
    while ((nt = moe_next_pairs(st, in, e, &cur, pr, st->w->tok_tile)) > 0) {
        if (!prep_memo(st, in, pr[0], sc)) {
            for (int i = 0; i < nt; i++) {
                size_t row = e < 0 ? (size_t)(pr[i] / K) : (size_t)pr[i];
                memcpy(sc->g + (size_t)i * kw, hid + row * kw, sizeof(float) * kw);
            }
            mat_quant(st, D, sc->g, kw, nt, sc->act, sc);
        }
        const int ch = chunk_rows(nt, (size_t)OPS_TILE * (size_t)y_width(c));
        for (int r = sp.r0; r < sp.r1; r += ch) {
            int cw = sp.r1 - r < ch ? sp.r1 - r : ch;
            mat_gemm(st, D, r, r + cw, nt, sc->g, kw, sc->act, sc->y, (size_t)ch, sc->row);
            for (int i = 0; i < nt; i++) {
                size_t row = e < 0 ? (size_t)(pr[i] / K) : (size_t)pr[i];
                memcpy(out + row * dim + r, sc->y + (size_t)i * ch, sizeof(float) * (size_t)cw);
            }
        }
    }
}

/* MOE_COMBINE: layer l; rows = model dims. For every token t with route row (ids, w,
   sg): y = w[0] out[t * K] + w[1] out[t * K + 1] + .. (in slot order), then y += sg *
   sout[t] when the model has a shared expert; x[t][r] += y[r]. in MOE_OUT, sums the
   shared MOE_OUT (-1: none), aux ROUTE, out X. */
static void op_moe_combine(const struct exec_step *st, const struct prog_instr *in, struct span sp)
{
    const struct model_config *c = &st->m->cfg;
    const int K = c->n_expert_used;
    const size_t dim = (size_t)c->dim;
    const float *out = buf_ptr(st, in->in), *route = buf_ptr(st, in->aux);
    const float *sout = in->in2 >= 0 ? buf_ptr(st, in->in2) : NULL;
    float *x = buf_ptr(st, in->out);
    for (int t = sp.t0; t < sp.t1; t++) {
        const float *rt = route + (size_t)t * (size_t)(2 * K + 1);
        float *xr = x + (size_t)t * dim;
        for (int r = sp.r0; r < sp.r1; r++) {
            float y = rt[K] * out[(size_t)t * K * dim + r];
            for (int k = 1; k < K; k++)
                y += rt[K + k] * out[((size_t)t * K + (size_t)k) * dim + r];
            if (sout)
                y += rt[2 * K] * sout[(size_t)t * dim + r];
            xr[r] += y;
        }
    }
}

/* ALLGATHER (tensor parallelism): rows [0, 1); in = out = a SUMS buffer (k_parts,
   n_tokens, dim) whose part `part` this rank wrote: afterwards it holds every rank's part
   (comm_allgather, blocks in rank order). Nothing when an earlier exchange failed. */
static void op_allgather(const struct exec_step *st, const struct prog_instr *in)
{
    struct exec_comm *ec = st->comm;
    WELD_ASSERT(ec && in->part == comm_rank(ec->c) && comm_size(ec->c) == st->p->kp.n);
    if (atomic_load_explicit(&ec->failed, memory_order_acquire))
        return;
    const size_t n = (size_t)st->p->n_tokens * (size_t)st->m->cfg.dim * sizeof(float);
    struct weld_err e = {0};
    if (comm_allgather(ec->c, buf_ptr(st, in->out), n, &e)) {
        ec->err = e;
        atomic_store_explicit(&ec->failed, 1, memory_order_release);
    }
}

/* SEND_X (pipeline parallelism): rows [0, 1). X[t] = in[t] + sums[0][t] + .. (residual_row:
   with K parts xmid + sums_d; without, X as it is) for every token, then X (n_tokens,
   dim) to the next stage. RECV_X: X from the previous stage. Nothing when an earlier
   exchange failed. */
static void op_pipe(const struct exec_step *st, const struct prog_instr *in,
                    const struct scratch *sc)
{
    struct exec_comm *ec = st->comm;
    WELD_ASSERT(ec && ec->pipe);
    if (atomic_load_explicit(&ec->failed, memory_order_acquire))
        return;
    const int dim = st->m->cfg.dim;
    float *x = buf_ptr(st, in->out);
    if (in->op == OP_SEND_X && in->sums >= 0)
        for (int t = 0; t < st->p->n_tokens; t++)
            (void)residual_row(st, in, buf_ptr(st, in->in), t, sc->h);
    const size_t n = (size_t)st->p->n_tokens * (size_t)dim * sizeof(float);
    struct weld_err e = {0};
    int rc = in->op == OP_SEND_X ? comm_send(ec->pipe, x, n, ec->next, 21, &e)
                                 : comm_recv(ec->pipe, x, n, ec->prev, 21, &e);
    if (rc) {
        ec->err = e;
        atomic_store_explicit(&ec->failed, 1, memory_order_release);
    }
}

static void comm_lock(struct exec_comm *ec)
{
    int expect = 0;
    while (!atomic_compare_exchange_weak_explicit(&ec->lock, &expect, 1, memory_order_acquire,
                                                  memory_order_relaxed))
        expect = 0;
}

static void comm_unlock(struct exec_comm *ec)
{
    atomic_store_explicit(&ec->lock, 0, memory_order_release);
}

/* Between token tiles of a product: let exchanges in flight progress (MPI moves bytes only
   inside its calls), if no other worker is doing it now. */
static void comm_poke(const struct exec_step *st)
{
    struct exec_comm *ec = st->comm;
    if (!ec || !atomic_load_explicit(&ec->n_pending, memory_order_relaxed))
        return;
    int expect = 0;
    if (!atomic_compare_exchange_strong_explicit(&ec->lock, &expect, 1, memory_order_acquire,
                                                 memory_order_relaxed))
        return;
    for (int i = 0; i < 4; i++)
        if (ec->slot[i])
            comm_test(ec->c, ec->slot[i]);
    comm_unlock(ec);
}

/* AG_START (tensor parallelism, a step in token groups): rows [0, 1); starts the exchange
   of tokens [tok0, tok1) of every part of the SUMS buffer out (this rank's part `part` to
   every rank, theirs here) in slot aux, and returns. AG_WAIT: completes slot aux's
   exchange. Nothing when an earlier exchange failed. */
static void op_ag(const struct exec_step *st, const struct prog_instr *in)
{
    struct exec_comm *ec = st->comm;
    WELD_ASSERT(ec && ec->c && in->aux >= 0 && in->aux < 4 && in->tok1 > in->tok0);
    if (atomic_load_explicit(&ec->failed, memory_order_acquire))
        return;
    const size_t row = (size_t)st->m->cfg.dim * sizeof(float);
    struct weld_err e = {0};
    int rc;
    comm_lock(ec);
    if (in->op == OP_AG_START) {
        WELD_ASSERT(!ec->slot[in->aux]);
        rc = comm_iallgather_rows(ec->c, buf_ptr(st, in->out), (size_t)st->p->n_tokens * row,
                                  (size_t)in->tok0 * row, (size_t)(in->tok1 - in->tok0) * row,
                                  &ec->slot[in->aux], &e);
        if (!rc)
            atomic_fetch_add_explicit(&ec->n_pending, 1, memory_order_relaxed);
    } else {
        rc = comm_wait(ec->c, ec->slot[in->aux], &e);
        if (ec->slot[in->aux])
            atomic_fetch_sub_explicit(&ec->n_pending, 1, memory_order_relaxed);
        ec->slot[in->aux] = NULL;
    }
    comm_unlock(ec);
    if (rc) {
        ec->err = e;
        atomic_store_explicit(&ec->failed, 1, memory_order_release);
    }
}

/* Expert parallelism: does this rank hold routed expert e (weights.h: experts [E r / N,
   E (r + 1) / N) of rank r of N)? Always in one process. */
static bool expert_here(const struct exec_step *st, int e)
{
    const struct exec_part *pt = &st->w->part;
    const int E = st->m->cfg.n_expert;
    return !pt->ep || pt->tp_size < 2 ||
           (e >= E * pt->tp_rank / pt->tp_size && e < E * (pt->tp_rank + 1) / pt->tp_size);
}

/* MOE_EXCHANGE (expert parallelism): rows [0, 1); in = out = MOE_OUT (n_tokens * K, dim),
   aux = ROUTE. Each (token, slot) row was written by the rank holding its expert; every
   rank packs its rows in (token, slot) order, an allgather in rank order hands every rank
   every rank's, and each row is put back in its place. The route is the same on every rank
   (ROUTE ran on every rank from the same residual), so every rank knows who sends what. */
static void op_moe_exchange(const struct exec_step *st, const struct prog_instr *in)
{
    struct exec_comm *ec = st->comm;
    WELD_ASSERT(ec && ec->c);
    if (atomic_load_explicit(&ec->failed, memory_order_acquire))
        return;
    const struct model_config *c = &st->m->cfg;
    const struct exec_part *pt = &st->w->part;
    const int K = c->n_expert_used, N = pt->tp_size, E = c->n_expert;
    const int rows = st->p->n_tokens * K;
    const size_t rb = (size_t)c->dim * sizeof(float);
    const float *route = buf_ptr(st, in->aux);
    float *out = buf_ptr(st, in->out);
    size_t counts[PROG_KPARTS_MAX] = {0}, displs[PROG_KPARTS_MAX] = {0};
    for (int i = 0; i < rows; i++) {
        const int e = route_id(route + (size_t)(i / K) * (size_t)(2 * K + 1), i % K);
        counts[(int)((long long)e * N / E)] += rb;
    }
    for (int r = 1; r < N; r++)
        displs[r] = displs[r - 1] + counts[r - 1];
    struct weld_err err = {0};
    const size_t need = (size_t)rows * rb * 2;
    if (need > ec->xcap) {
        void *p = wrealloc(ec->xbuf, need);
        if (!p) {
            err_set(&err, WELD_ERR_NOMEM, "expert exchange: out of memory for %d rows", rows);
            goto fail;
        }
        ec->xbuf = p, ec->xcap = need;
    }
    uint8_t *mine = ec->xbuf, *all = (uint8_t *)ec->xbuf + (size_t)rows * rb, *w = mine;
    for (int i = 0; i < rows; i++) {
        const int e = route_id(route + (size_t)(i / K) * (size_t)(2 * K + 1), i % K);
        if ((int)((long long)e * N / E) == pt->tp_rank)
            memcpy(w, out + (size_t)i * c->dim, rb), w += rb;
    }
    if (comm_allgatherv(ec->c, mine, all, counts, displs, &err))
        goto fail;
    size_t next[PROG_KPARTS_MAX];
    memcpy(next, displs, sizeof next);
    for (int i = 0; i < rows; i++) {
        const int e = route_id(route + (size_t)(i / K) * (size_t)(2 * K + 1), i % K);
        const int r = (int)((long long)e * N / E);
        memcpy(out + (size_t)i * c->dim, all + next[r], rb);
        next[r] += rb;
    }
    return;
fail:
    ec->err = err;
    atomic_store_explicit(&ec->failed, 1, memory_order_release);
}

/* REDUCE (tensor parallelism over more than 2 ranks): rows [0, 1). out[t] = in[t] +
   sums[0][t] + sums[1][t] + .. in part order, for every token, by a reduce-scatter and a
   gather: rank q is sent every rank's part for its dims [dim q / N, dim (q + 1) / N)
   (all-to-all), adds them to in over those dims in part order (the very additions
   residual_row makes), and the sums of every rank's dims are gathered into out. in may be
   out. Nothing when an earlier exchange failed. */
static void op_reduce(const struct exec_step *st, const struct prog_instr *in)
{
    struct exec_comm *ec = st->comm;
    WELD_ASSERT(ec && ec->c && in->sums >= 0);
    if (atomic_load_explicit(&ec->failed, memory_order_acquire))
        return;
    const int N = comm_size(ec->c), r = comm_rank(ec->c), T = st->p->n_tokens;
    const int dim = st->m->cfg.dim;
    WELD_ASSERT(N <= PROG_KPARTS_MAX && N == st->p->kp.n);
    int d[PROG_KPARTS_MAX + 1];
    for (int q = 0; q <= N; q++)
        d[q] = (int)((long long)dim * q / N);
    const size_t all = (size_t)T * (size_t)dim;
    struct weld_err err = {0};
    if (3 * all * sizeof(float) > ec->xcap) {
        void *p = wrealloc(ec->xbuf, 3 * all * sizeof(float));
        if (!p) {
            err_set(&err, WELD_ERR_NOMEM, "reduce: out of memory for %d tokens", T);
            goto fail;
        }
        ec->xbuf = p, ec->xcap = 3 * all * sizeof(float);
    }
    float *snd = ec->xbuf, *rcv = snd + all, *gat = rcv + all;
    const float *mine = buf_ptr(st, in->sums) + (size_t)r * all;
    size_t sc[PROG_KPARTS_MAX], sd[PROG_KPARTS_MAX], rc_[PROG_KPARTS_MAX], rd[PROG_KPARTS_MAX];
    const int w = d[r + 1] - d[r]; /* this rank's dims */
    for (int q = 0; q < N; q++) {  /* my part, dims of rank q, token-major */
        float *o = snd + (size_t)T * (size_t)d[q];
        for (int t = 0; t < T; t++)
            memcpy(o + (size_t)t * (d[q + 1] - d[q]), mine + (size_t)t * dim + d[q],
                   sizeof(float) * (size_t)(d[q + 1] - d[q]));
        sc[q] = sizeof(float) * (size_t)T * (size_t)(d[q + 1] - d[q]);
        sd[q] = sizeof(float) * (size_t)T * (size_t)d[q];
        rc_[q] = sizeof(float) * (size_t)T * (size_t)w;
        rd[q] = rc_[q] * (size_t)q;
    }
    if (comm_alltoallv(ec->c, snd, sc, sd, rcv, rc_, rd, &err))
        goto fail;
    const float *x = buf_ptr(st, in->in);
    float *y = gat + (size_t)T * (size_t)d[r]; /* my dims of every token, token-major */
    for (int t = 0; t < T; t++)
        for (int j = 0; j < w; j++) {
            float v = x[(size_t)t * dim + d[r] + j] + rcv[(size_t)t * w + j];
            for (int q = 1; q < N; q++)
                v += rcv[((size_t)q * T + t) * w + j];
            y[(size_t)t * w + j] = v;
        }
    size_t gc[PROG_KPARTS_MAX], gd[PROG_KPARTS_MAX];
    for (int q = 0; q < N; q++)
        gc[q] = sc[q], gd[q] = sd[q];
    if (comm_allgatherv(ec->c, NULL, gat, gc, gd, &err)) /* y is already in place */
        goto fail;
    float *out = buf_ptr(st, in->out);
    for (int q = 0; q < N; q++)
        for (int t = 0; t < T; t++)
            memcpy(out + (size_t)t * dim + d[q],
                   gat + (size_t)T * d[q] + (size_t)t * (d[q + 1] - d[q]),
                   sizeof(float) * (size_t)(d[q + 1] - d[q]));
    return;
fail:
    ec->err = err;
    atomic_store_explicit(&ec->failed, 1, memory_order_release);
}

int exec_final_slices(const struct program *p)
{
    if (p->instrs[p->stage_first[p->n_stages - 1]].op != OP_FINAL_NORM_LOGITS)
        return 0; /* a pipeline stage before the last */
    return p->n_instr - p->stage_first[p->n_stages - 1];
}

/* FINAL_NORM_LOGITS: rows = vocab ids. For each logit row k (token t = logit_tok[k]):
   h = rmsnorm(x[t]) * output_norm (with K parts x = xmid + sums_d); logits[k][r] =
   Woutput[r] . h; when the step asks (exec_step.tops), also the LOGITS_TOP_K largest of
   logits[k][rows] into the slot of (k, this instruction's place in the stage), and the
   softmax statistics of the LOGITS_CHUNK chunks inside its rows for the rows that ask
   (exec_step.rows): the sampler's first pass (exec/logits_top.h), done while the row is
   still in cache. When the step asks (exec_step.hidden), the slice starting at vocab
   row 0 also stores h of each logit row there (embeddings: the final hidden state), and
   its piece of the first rows the h of the tokens that want only that
   (exec_step.hid_extra_tok). in X, out LOGITS. */
static void op_final(const struct exec_step *st, const struct prog_instr *in,
                     const struct scratch *sc, struct span sp)
{
    const struct model_config *c = &st->m->cfg;
    const struct program *p = st->p;
    const struct exec_mat *M = &st->w->output;
    const float *x = buf_ptr(st, in->in);
    float *logits = buf_ptr(st, in->out);
    const int T = st->w->tok_tile;
    const int n_slices = exec_final_slices(p);
    const int slice = (int)(in - p->instrs) - p->stage_first[p->n_stages - 1];
    WELD_ASSERT(!st->tops || (slice >= 0 && slice < n_slices));
    if (st->hidden && in->row0 == 0 && sp.t0 == 0) /* the rows without logits */
        for (int k0 = 0; k0 < st->n_hid_extra; k0 += T) {
            int nk = st->n_hid_extra - k0 < T ? st->n_hid_extra - k0 : T;
            norm_tile(st, in, x, st->w->output_norm, st->hid_extra_tok + k0, 0, nk, sc);
            memcpy(st->hidden + (size_t)(p->n_logit_rows + k0) * c->dim, sc->h,
                   (size_t)nk * c->dim * sizeof(float));
        }
    for (int k0 = sp.t0; k0 < sp.t1; k0 += T) {
        int nk = sp.t1 - k0 < T ? sp.t1 - k0 : T;
        (void)prep_memo(st, NULL, k0, sc);
        norm_tile(st, in, x, st->w->output_norm, p->logit_tok + k0, 0, nk, sc);
        if (st->hidden && in->row0 == 0)
            memcpy(st->hidden + (size_t)k0 * c->dim, sc->h, (size_t)nk * c->dim * sizeof(float));
        mat_quant(st, M, sc->h, (size_t)c->dim, nk, sc->act, sc);
        mat_gemm(st, M, in->row0, in->row1, nk, sc->h, (size_t)c->dim, sc->act,
                 logits + (size_t)k0 * c->n_vocab + in->row0, (size_t)c->n_vocab, sc->row);
        for (int k = k0; st->tops && k < k0 + nk; k++)
            logits_top_scan(&st->tops[(size_t)k * n_slices + slice],
                            logits + (size_t)k * c->n_vocab + in->row0, in->row1 - in->row0,
                            in->row0);
        /* the chunks wholly inside the slice (the backend does those a boundary cuts) */
        const int cs0 = (in->row0 + LOGITS_CHUNK - 1) / LOGITS_CHUNK;
        const int cs1 = in->row1 == c->n_vocab ? logits_n_chunks(c->n_vocab)
                                               : in->row1 / LOGITS_CHUNK;
        for (int k = k0; st->rows && cs0 < cs1 && k < k0 + nk; k++)
            if (st->rows[k].inv_t > 0.0f)
                logits_stats_chunks(&st->rows[k], logits + (size_t)k * c->n_vocab,
                                    c->n_vocab, cs0, cs1, st->w->go);
    }
}

/* Tokens (or logit rows, or a sequence's tokens for ATTENTION) of instruction in, and the
   tile they are cut into: the unit exec_op_run_tiles hands out. */
static int op_extent(const struct exec_step *st, const struct prog_instr *in, int *tile)
{
    *tile = st->w->tok_tile;
    switch (in->op) {
    case OP_ATTENTION:
        *tile = OPS_ATT_TOK;
        return st->p->seq_ntok[in->seq];
    case OP_FINAL_NORM_LOGITS:
        return st->p->n_logit_rows;
    case OP_EMBED:
    case OP_MOE_ROUTE:
    case OP_ALLGATHER:
    case OP_SEND_X:
    case OP_RECV_X:
    case OP_AG_START:
    case OP_AG_WAIT:
    case OP_MOE_EXCHANGE:
    case OP_REDUCE:
        *tile = 1 << 30; /* rows are tokens already; one piece */
        return st->p->n_tokens;
    case OP_MOE_GATE_UP:
    case OP_MOE_DOWN: /* an expert's tokens are known only when it runs: one piece, or row
                         pieces when every token fits one tile */
        if (st->p->n_tokens > *tile)
            *tile = 1 << 30;
        return st->p->n_tokens;
    default: /* a token group's instruction: its tokens */
        return in->tok1 > 0 ? in->tok1 - in->tok0 : st->p->n_tokens;
    }
}

/* Rows per row piece of instruction in (0: not cut by rows): the matrix ops, when their
   tokens fit one tile, in whole OPS_PIECE_ALIGN rows of about w->piece_bytes. */
static int piece_rows(const struct exec_step *st, const struct prog_instr *in, int n_tok_tiles)
{
    if (n_tok_tiles != 1 || in->layer < 0)
        return 0;
    const struct exec_layer_mats *L = &st->w->mats[in->layer];
    size_t rb;
    switch (in->op) {
    case OP_O_PROJ_RESIDUAL: rb = L->wo.row_bytes; break;
    case OP_FFN_NORM_GATE_UP_SILU: rb = L->gate.row_bytes + L->up.row_bytes; break;
    case OP_DOWN_PROJ_RESIDUAL: rb = L->down.row_bytes; break;
    case OP_MOE_GATE_UP:
        rb = in->part < 0 ? L->sh_gate.row_bytes + L->sh_up.row_bytes
                          : L->egate[0].row_bytes + L->eup[0].row_bytes;
        break;
    case OP_MOE_DOWN: rb = in->part < 0 ? L->sh_down.row_bytes : L->edown[0].row_bytes; break;
    default: return 0;
    }
    size_t n = rb ? st->w->piece_bytes / rb / OPS_PIECE_ALIGN * OPS_PIECE_ALIGN : 0;
    n = n < OPS_PIECE_ALIGN ? OPS_PIECE_ALIGN : n;
    return in->row1 - in->row0 > (int)n ? (int)n : 0;
}

int exec_op_tiles(const struct exec_step *st, const struct prog_instr *in)
{
    int tile, n = op_extent(st, in, &tile);
    int tiles = n <= tile ? 1 : (n + tile - 1) / tile;
    int pr = piece_rows(st, in, tiles);
    return pr ? (in->row1 - in->row0 + pr - 1) / pr : tiles;
}

void exec_op_run_tiles(const struct exec_step *st, const struct prog_instr *in, float *scratch,
                       int tile0, int tile1)
{
    struct scratch sc = scratch_split(&st->m->cfg, scratch);
    int tile, n = op_extent(st, in, &tile);
    WELD_ASSERT(tile0 >= 0 && tile0 < tile1 && tile1 <= exec_op_tiles(st, in));
    int tiles = n <= tile ? 1 : (n + tile - 1) / tile;
    int pr = piece_rows(st, in, tiles);
    struct span sp = {0, n, in->row0, in->row1};
    if (pr) { /* row pieces [tile0, tile1) of the one token tile */
        sp.r0 = in->row0 + tile0 * pr;
        sp.r1 = (int64_t)in->row0 + (int64_t)tile1 * pr < in->row1 ? in->row0 + tile1 * pr
                                                                    : in->row1;
    } else {
        sp.t0 = (int)((int64_t)tile0 * tile > n ? n : (int64_t)tile0 * tile);
        sp.t1 = (int)((int64_t)tile1 * tile > n ? n : (int64_t)tile1 * tile);
    }
    if (in->tok1 > 0) /* a token group: the span's tokens count from tok0 */
        sp.t0 += in->tok0, sp.t1 += in->tok0;
    switch (in->op) {
    case OP_EMBED:
        op_embed(st, in);
        break;
    case OP_ATTN_NORM_QKV_ROPE:
        op_qkv(st, in, &sc, sp);
        break;
    case OP_ATTENTION:
        op_attention(st, in, &sc, sp);
        break;
    case OP_O_PROJ_RESIDUAL:
        op_proj_residual(st, in, &st->w->mats[in->layer].wo, &sc, sp);
        break;
    case OP_FFN_NORM_GATE_UP_SILU:
        op_ffn(st, in, &sc, sp);
        break;
    case OP_DOWN_PROJ_RESIDUAL:
        op_proj_residual(st, in, &st->w->mats[in->layer].down, &sc, sp);
        break;
    case OP_FINAL_NORM_LOGITS:
        op_final(st, in, &sc, sp);
        break;
    case OP_O_PART:
        op_o_part(st, in, &sc, sp);
        break;
    case OP_FFN_DOWN_PART:
        op_ffn_down_part(st, in, &sc, sp);
        break;
    case OP_MOE_ROUTE: op_moe_route(st, in, &sc, sp); break;
    case OP_MOE_GATE_UP: op_moe_gate_up(st, in, &sc, sp); break;
    case OP_MOE_DOWN: op_moe_down(st, in, &sc, sp); break;
    case OP_MOE_COMBINE: op_moe_combine(st, in, sp); break;
    case OP_MLA_PROJ_A: op_mla_proj_a(st, in, &sc, sp); break;
    case OP_MLA_Q_KV: op_mla_q_kv(st, in, &sc, sp); break;
    case OP_ALLGATHER: op_allgather(st, in); break;
    case OP_SEND_X:
    case OP_RECV_X: op_pipe(st, in, &sc); break;
    case OP_AG_START:
    case OP_AG_WAIT: op_ag(st, in); break;
    case OP_MOE_EXCHANGE: op_moe_exchange(st, in); break;
    case OP_REDUCE: op_reduce(st, in); break;
    default:
        WELD_ASSERT(!"unknown opcode");
    }
}

void exec_op_run(const struct exec_step *st, const struct prog_instr *in, float *scratch)
{
    exec_op_run_tiles(st, in, scratch, 0, exec_op_tiles(st, in));
}
