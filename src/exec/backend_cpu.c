/*
 * backend_cpu - the cpu backend: program builder + executor + scalar kernels + paged KV.
 *
 * A step: validate the batch; place its KV positions: with engine tables, check them
 * against the pool (kv_check_tables) and use them as given; without, check the internal
 * allocator can hold every sequence's new positions (all-or-nothing, before anything
 * changes) and reserve them; find or build the program for the batch's shape (a small
 * round-robin cache of PROG_CACHE programs, so alternating prefill/decode shapes do not
 * rebuild every step); flatten tokens, positions and per-sequence tables; grow the
 * activation arena to the program's plan; do the batch's block copies; run the executor;
 * when the caller wants each logit row's top (the sampler's first pass), merge the tops
 * the FINAL instructions kept of their slices (logits_top.h), a few hundred candidates a
 * row. If the executor fails, internally placed sequences are truncated back to where the
 * batch started.
 *
 * Memory: the matrices the kernels run live in exec_weights' pool (repacked or copied
 * once, shared with any other backend of the same model, exec/weights.h), the rest of
 * the weights stay the model's;
 * the KV cache is sized at creation; step tables and the arena grow to the largest step
 * seen and are reused. Rope angles (exec_rope_row: pow, cos, sin per frequency) are made
 * once per position into a table grown with the highest position seen (doubling, up to
 * max_ctx), which the QKV ops read instead of recomputing them per instruction and tile.
 * Threading: a context is used by one thread at a time; the executor may run a step on
 * its own thread team (n_threads workers, the calling thread being one of them).
 */
#include "exec/backend.h"

#include "exec/backend_tp.h"

#include "core/alloc.h"
#include "core/log.h"
#include "core/team.h"
#include "exec/exec.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PROG_CACHE 4

struct cpu_ctx {
    const struct model *m;
    struct backend_params params;
    struct exec_weights *w;
    struct kv_cache *kv;
    const struct executor_impl *ex;
    void *ex_state;
    struct program *progs[PROG_CACHE];
    int prog_next;
    int32_t *tokens;  /* (cap_tokens) */
    const float **embed_rows; /* (cap_tokens) batch_seq.embeds rows of the step, if given */
    int *hid_extra;   /* (cap_tokens) tokens of all_hidden sequences that are not logit rows */
    int *pos;         /* (cap_tokens) */
    int cap_tokens;
    const int32_t **tables; /* (max_seqs) block table of each batch sequence */
    float *arena;     /* (cap_arena) */
    size_t cap_arena;
    float *rope;      /* (cap_rope, rope_dim) exec_rope_row of positions [0, cap_rope): made
                         once per position, not per QKV instruction and tile (pow, cos, sin) */
    int cap_rope;
    uint64_t serial;  /* steps run (exec_step.serial) */
    struct logits_top *slices; /* (cap_slices) per (logit row, FINAL slice) tops of a step
                                  whose caller wants tops, merged per row after the run */
    size_t cap_slices;
    char desc[256];
    struct exec_part part; /* what of the model this context runs (tuning.tp's part) */
    struct exec_comm comm; /* tensor parallelism: tuning.tp's communicator (comm.c NULL:
                              one process) */
};

static void cpu_ctx_free(void *ctx)
{
    struct cpu_ctx *c = ctx;
    if (!c)
        return;
    if (c->ex && c->ex_state)
        c->ex->free(c->ex_state);
    for (int i = 0; i < PROG_CACHE; i++)
        program_free(c->progs[i]);
    kv_free(c->kv);
    exec_weights_free(c->w);
    wfree(c->tokens);
    wfree(c->embed_rows);
    wfree(c->hid_extra);
    wfree(c->pos);
    wfree(c->tables);
    wfree(c->arena);
    wfree(c->rope);
    wfree(c->slices);
    wfree(c->comm.xbuf);
    wfree(c);
}

int backend_cpu_default_threads(const struct model *m, const struct exec_tuning *t)
{
    /* an executor asked for by name gets its team */
    if ((t && t->executor && *t->executor) || exec_stage_bytes(m) >= EXEC_SMALL_STAGE_BYTES)
        return team_default_size();
    return 1;
}

static int cpu_ctx_create(void **out, const struct model *m, const struct backend_params *p,
                          struct weld_err *e)
{
    *out = NULL;
    if (p->max_seqs < 1 || p->max_ctx < 1 || p->n_splits < 0 || p->n_threads < 0)
        return err_set(e, WELD_ERR_INVALID_ARG, "cpu backend: max_seqs %d, max_ctx %d must "
                       "be >= 1, n_splits %d and n_threads %d >= 0", p->max_seqs, p->max_ctx,
                       p->n_splits, p->n_threads);
    const struct exec_tuning *t = &p->tuning;
    if (t->kv_groups < 0 || t->k_parts < 0 || t->trace_steps < 0 ||
        (unsigned)t->decode_pairs > PAIRS_LONG || (unsigned)t->l2_prefetch > TUNE_ON ||
        (unsigned)t->repack > TUNE_ON)
        return err_set(e, WELD_ERR_INVALID_ARG, "cpu backend: tuning out of range (kv_groups "
                       "%d, k_parts %d, trace_steps %d must be >= 0)", t->kv_groups,
                       t->k_parts, t->trace_steps);
    struct cpu_ctx *c = wcalloc(1, sizeof *c);
    if (!c)
        return err_set(e, WELD_ERR_NOMEM, "cpu backend: out of memory");
    c->m = m;
    c->params = *p;
    struct tp_group *tp = p->tuning.tp;
    c->part = tp ? tp_group_part(tp, &m->cfg) : exec_part_whole(&m->cfg);
    int rc = tp ? exec_weights_create_shard(&c->w, m, &p->tuning, &c->part, e)
                : exec_weights_create(&c->w, m, &p->tuning, e);
    if (rc)
        goto fail;
    if (tp && c->part.tp_size > 1)
        c->comm.c = tp_group_tp_comm(tp);
    if (tp && tp_group_pp_size(tp) > 1) { /* stage to stage: the same TP rank's */
        c->comm.pipe = tp_group_comm(tp);
        c->comm.prev = tp_group_rank(tp) - c->part.tp_size;
        c->comm.next = tp_group_rank(tp) + c->part.tp_size;
    }
    struct kv_config kc = {
        .n_layer = c->part.layer1 - c->part.layer0, /* a stage's layers */
        .layer0 = c->part.layer0,
        .max_seqs = p->max_seqs,
        .max_ctx = p->max_ctx,
        .block_size = p->kv_block_size,
        .n_blocks = p->kv_blocks,
        .type = p->kv_type,
        .prefault_bytes = p->kv_prefault_bytes,
    };
    kv_shape_for(&m->cfg, &kc.kv_dim, &kc.head_dim, &kc.latent);
    if (c->part.tp_size > 1) { /* a shard's KV heads: its K part's */
        const int grp = m->cfg.n_head / m->cfg.n_kv_head, r = c->part.tp_rank;
        kc.head0 = c->w->kp.head_cut[r] / grp;
        kc.kv_dim = (c->w->kp.head_cut[r + 1] / grp - kc.head0) * kc.head_dim;
    }
    struct exec_params xp = {
        .n_threads = p->n_threads ? p->n_threads : backend_cpu_default_threads(m, &p->tuning),
        .team_flags = p->oversubscribe ? TEAM_OVERSUBSCRIBE : 0,
        .trace_steps = p->tuning.trace_steps,
    };
    if (!p->n_threads && xp.n_threads == 1 && team_default_size() > 1)
        log_debug("cpu: 1 thread: a step of this model streams %zu KB of weights per stage, "
                 "too little for a second worker to pay for its synchronisation (-t to choose)",
                 exec_stage_bytes(m) >> 10);
    if ((rc = executor_choose(&c->ex, p->tuning.executor, xp.n_threads, e)) ||
        (rc = c->ex->create(&c->ex_state, &m->cfg, &xp, e)))
        goto fail;
    int n_workers = c->ex->n_workers(c->ex_state);
    if (!c->params.n_splits)
        c->params.n_splits = c->ex->n_splits(c->ex_state);
    /* the layout's head groups: the programs' attention head ranges unless asked */
    kc.n_groups = p->tuning.kv_groups ? p->tuning.kv_groups : c->params.n_splits;
    if ((rc = kv_create(&c->kv, &kc, e)))
        goto fail;
    if (!(c->tables = wcalloc((size_t)p->max_seqs, sizeof *c->tables))) {
        rc = err_set(e, WELD_ERR_NOMEM, "cpu backend: out of memory");
        goto fail;
    }
    snprintf(c->desc, sizeof c->desc, "cpu: %s executor, %d thread%s, %d splits, kv %s %d "
             "blocks of %d in %d head group%s", c->ex->name, n_workers,
             n_workers == 1 ? "" : "s", c->params.n_splits, dtype_name(c->kv->type),
             c->kv->n_blocks, c->kv->block_size, c->kv->n_groups,
             c->kv->n_groups == 1 ? "" : "s");
    *out = c;
    return WELD_OK;
fail:
    cpu_ctx_free(c);
    return rc;
}

/* Reserve KV positions for every sequence of b, all-or-nothing. */
static int reserve_kv(struct cpu_ctx *c, const struct batch *b, struct weld_err *e)
{
    if (c->kv->external)
        return err_set(e, WELD_ERR_INVALID_ARG, "batch: no block tables, but this backend "
                       "context runs on engine block tables (reset it first)");
    long long more = 0;
    for (int s = 0; s < b->n_seqs; s++) {
        const struct batch_seq *bs = &b->seqs[s];
        int have = kv_seq_len(c->kv, bs->seq_id);
        if (bs->pos > have)
            return err_set(e, WELD_ERR_INVALID_ARG, "batch seq %d (id %d): starts at pos %d "
                           "but only positions 0..%d are cached", s, bs->seq_id, bs->pos,
                           have - 1);
        more += kv_seq_blocks_needed(c->kv, bs->seq_id, bs->pos, bs->n_tokens);
    }
    if (more > kv_n_free_blocks(c->kv))
        return err_set(e, WELD_ERR_LIMIT, "kv cache: step needs %lld more blocks, %d free "
                       "(drop finished sequences or raise the block count)", more,
                       kv_n_free_blocks(c->kv));
    /* Rewinds first, so blocks they free are there for the sequences that grow. */
    for (int s = 0; s < b->n_seqs; s++)
        kv_seq_truncate(c->kv, b->seqs[s].seq_id, b->seqs[s].pos);
    for (int s = 0; s < b->n_seqs; s++) {
        int rc = kv_seq_prepare(c->kv, b->seqs[s].seq_id, b->seqs[s].pos,
                                b->seqs[s].n_tokens, e);
        WELD_ASSERT(rc == WELD_OK); /* checked above */
    }
    return WELD_OK;
}

static int get_program(struct cpu_ctx *c, const struct batch *b, struct program **out,
                       struct weld_err *e)
{
    for (int i = 0; i < PROG_CACHE; i++)
        if (program_matches(c->progs[i], b)) {
            *out = c->progs[i];
            return WELD_OK;
        }
    struct program *p;
    unsigned flags = c->ex->prog_flags ? c->ex->prog_flags(c->ex_state) : 0;
    if (c->params.tuning.tp_overlap == TUNE_OFF)
        flags |= PROG_NO_OVERLAP;
    int rc = program_build_tp(&p, &c->m->cfg, b, c->params.n_splits, flags, &c->w->kp, &c->part, e);
    if (rc)
        return rc;
    if (c->params.tuning.dump_program)
        program_dump(p, stderr);
    program_free(c->progs[c->prog_next]);
    c->progs[c->prog_next] = p;
    c->prog_next = (c->prog_next + 1) % PROG_CACHE;
    *out = p;
    return WELD_OK;
}

static int grow_tables(struct cpu_ctx *c, int n_tokens, size_t arena, struct weld_err *e)
{
    if (n_tokens > c->cap_tokens) {
        int32_t *t = wrealloc(c->tokens, (size_t)n_tokens * sizeof *t);
        if (t)
            c->tokens = t;
        int *p = wrealloc(c->pos, (size_t)n_tokens * sizeof *p);
        if (p)
            c->pos = p;
        const float **r = wrealloc(c->embed_rows, (size_t)n_tokens * sizeof *r);
        if (r)
            c->embed_rows = r;
        int *h = wrealloc(c->hid_extra, (size_t)n_tokens * sizeof *h);
        if (h)
            c->hid_extra = h;
        if (!t || !p || !r || !h)
            return err_set(e, WELD_ERR_NOMEM, "cpu backend: out of memory for %d tokens",
                           n_tokens);
        c->cap_tokens = n_tokens;
    }
    if (arena > c->cap_arena) {
        float *a = wrealloc(c->arena, arena * sizeof(float));
        if (!a)
            return err_set(e, WELD_ERR_NOMEM, "cpu backend: out of memory for %zu activation "
                           "floats", arena);
        c->arena = a;
        c->cap_arena = arena;
    }
    return WELD_OK;
}

/* Rope rows for positions [0, need), grown by doubling up to max_ctx. */
static int grow_rope(struct cpu_ctx *c, int need, struct weld_err *e)
{
    const int rd = c->m->cfg.rope_dim;
    if (need <= c->cap_rope || rd <= 0)
        return WELD_OK;
    int cap = c->cap_rope ? 2 * c->cap_rope : 256;
    if (cap < need)
        cap = need;
    if (cap > c->params.max_ctx)
        cap = c->params.max_ctx;
    float *r = wrealloc(c->rope, (size_t)cap * (size_t)rd * sizeof *r);
    if (!r)
        return err_set(e, WELD_ERR_NOMEM, "cpu backend: out of memory for %d rope positions",
                       cap);
    for (int p = c->cap_rope; p < cap; p++)
        exec_rope_row(c->m, c->w, p, r + (size_t)p * rd);
    c->rope = r;
    c->cap_rope = cap;
    return WELD_OK;
}

/* Room for the per-slice tops of program p's logit rows. */
static int grow_slices(struct cpu_ctx *c, const struct program *p, struct weld_err *e)
{
    size_t need = (size_t)p->n_logit_rows * (size_t)exec_final_slices(p);
    if (need <= c->cap_slices)
        return WELD_OK;
    struct logits_top *s = wrealloc(c->slices, need * sizeof *s);
    if (!s)
        return err_set(e, WELD_ERR_NOMEM, "cpu backend: out of memory for %zu logit-row tops",
                       need);
    c->slices = s;
    c->cap_slices = need;
    return WELD_OK;
}

/* The softmax statistics of the chunks of row a FINAL slice boundary cuts (the FINAL
   instructions did the chunks inside their slices). */
static void stats_cut_chunks(const struct cpu_ctx *c, const struct program *p,
                             struct logits_top *t, const float *row)
{
    const int first = p->stage_first[p->n_stages - 1], V = c->m->cfg.n_vocab;
    int done = -1;
    for (int i = first + 1; i < p->n_instr; i++) {
        const int b = p->instrs[i].row0, ch = b / LOGITS_CHUNK;
        if (b % LOGITS_CHUNK && ch != done) {
            logits_stats_chunks(t, row, V, ch, ch + 1, c->w->go);
            done = ch;
        }
    }
}

static int cpu_forward(void *ctx, const struct batch *b, float *logits,
                       struct logits_top *tops, float *hidden, struct weld_err *e)
{
    struct cpu_ctx *c = ctx;
    int rc = batch_validate(b, c->params.max_seqs, c->params.max_ctx, c->m->cfg.n_vocab, e);
    if (rc)
        return rc;
    if (!logits)
        return err_set(e, WELD_ERR_INVALID_ARG, "forward: logits buffer is NULL");
    bool ext = batch_has_tables(b);
    if (ext && (rc = kv_check_tables(c->kv, b, e)))
        return rc;
    int need = 0; /* rope rows */
    for (int s = 0; s < b->n_seqs; s++)
        if (b->seqs[s].pos + b->seqs[s].n_tokens > need)
            need = b->seqs[s].pos + b->seqs[s].n_tokens;
    struct program *p;
    if ((rc = get_program(c, b, &p, e)) ||
        (rc = grow_tables(c, p->n_tokens, p->arena_floats, e)) ||
        (rc = grow_rope(c, need, e)) || (tops && (rc = grow_slices(c, p, e))) ||
        (!ext && (rc = reserve_kv(c, b, e))))
        return rc;
    c->kv->external |= ext;
    for (int i = 0; i < b->n_copies; i++)
        kv_copy_block(c->kv, b->copies[i].src, b->copies[i].dst);
    int n_extra = 0;
    for (int s = 0, t = 0; s < b->n_seqs; s++) {
        c->tables[s] = ext ? b->seqs[s].blocks : c->kv->seqs[b->seqs[s].seq_id].blocks;
        const bool extra = hidden && b->seqs[s].all_hidden && !b->seqs[s].all_logits;
        for (int i = 0; i < b->seqs[s].n_tokens; i++, t++) {
            if (extra && i < b->seqs[s].n_tokens - 1)
                c->hid_extra[n_extra++] = t;
            c->tokens[t] = b->seqs[s].tokens[i];
            c->pos[t] = b->seqs[s].pos + i;
            if (b->seqs[s].embeds)
                c->embed_rows[t] = b->seqs[s].embeds + (size_t)i * (size_t)c->m->cfg.dim;
        }
    }
    struct exec_step st = {
        .m = c->m,
        .w = c->w,
        .p = p,
        .kv = c->kv,
        .tokens = c->tokens,
        .pos = c->pos,
        .embed_rows = b->seqs[0].embeds ? c->embed_rows : NULL,
        .tables = c->tables,
        .arena = c->arena,
        .logits = logits,
        .rope = c->rope, /* NULL without rope (grow_rope makes none) */
        .tops = tops ? c->slices : NULL,
        .serial = ++c->serial,
        .rows = tops,
        .hidden = hidden,
        .hid_extra_tok = c->hid_extra,
        .n_hid_extra = n_extra,
        .comm = c->comm.c || c->comm.pipe ? &c->comm : NULL,
    };
    rc = c->ex->run(c->ex_state, &st, e);
    if (rc == WELD_OK && (c->comm.c || c->comm.pipe) && atomic_load(&c->comm.failed))
        rc = err_set(e, c->comm.err.status ? c->comm.err.status : WELD_ERR_IO, "%s",
                     c->comm.err.msg);
    if (rc == WELD_OK && tops) {
        const int n = exec_final_slices(p);
        for (int r = 0; r < p->n_logit_rows; r++) {
            /* a pipeline stage before the last has no slices: an empty top */
            logits_top_merge(&tops[r], n ? c->slices + (size_t)r * n : NULL, n);
            if (tops[r].inv_t > 0.0f)
                stats_cut_chunks(c, p, &tops[r], logits + (size_t)r * c->m->cfg.n_vocab);
        }
    }
    if (rc && !ext)
        for (int s = 0; s < b->n_seqs; s++)
            kv_seq_truncate(c->kv, b->seqs[s].seq_id, b->seqs[s].pos);
    return rc;
}

int backend_cpu_exec_stats(void *ctx, struct exec_stats *out, bool reset, struct weld_err *e)
{
    struct cpu_ctx *c = ctx;
    memset(out, 0, sizeof *out);
    if (!c->ex->stats)
        return err_set(e, WELD_ERR_UNSUPPORTED, "the %s executor keeps no stats", c->ex->name);
    c->ex->stats(c->ex_state, out, reset);
    out->executor = c->ex->name;
    return WELD_OK;
}

static void cpu_drop_seq(void *ctx, int seq_id)
{
    struct cpu_ctx *c = ctx;
    kv_seq_drop(c->kv, seq_id);
}

static int cpu_seq_len(void *ctx, int seq_id)
{
    struct cpu_ctx *c = ctx;
    return kv_seq_len(c->kv, seq_id);
}

static void cpu_reset(void *ctx)
{
    struct cpu_ctx *c = ctx;
    kv_reset(c->kv);
}

static void cpu_park(void *ctx)
{
    struct cpu_ctx *c = ctx;
    if (c->ex->park)
        c->ex->park(c->ex_state);
}

static size_t cpu_block_bytes(void *ctx)
{
    struct cpu_ctx *c = ctx;
    return kv_block_io_bytes(c->kv);
}

static void cpu_block_save(void *ctx, const int32_t *blocks, int n, void *dst)
{
    struct cpu_ctx *c = ctx;
    const size_t bb = kv_block_io_bytes(c->kv);
    for (int i = 0; i < n; i++)
        kv_block_save(c->kv, blocks[i], (uint8_t *)dst + (size_t)i * bb);
}

static void cpu_block_load(void *ctx, const int32_t *blocks, int n, const void *src)
{
    struct cpu_ctx *c = ctx;
    const size_t bb = kv_block_io_bytes(c->kv);
    for (int i = 0; i < n; i++)
        kv_block_load(c->kv, blocks[i], (const uint8_t *)src + (size_t)i * bb);
}

static const char *cpu_describe(void *ctx)
{
    struct cpu_ctx *c = ctx;
    return c->desc;
}

const struct backend_iface backend_cpu = {
    .name = "cpu",
    .ctx_create = cpu_ctx_create,
    .ctx_free = cpu_ctx_free,
    .forward = cpu_forward,
    .drop_seq = cpu_drop_seq,
    .seq_len = cpu_seq_len,
    .reset = cpu_reset,
    .buffer_alloc = NULL,
    .buffer_free = NULL,
    .park = cpu_park,
    .describe = cpu_describe,
    .block_bytes = cpu_block_bytes,
    .block_save = cpu_block_save,
    .block_load = cpu_block_load,
};
