/*
 * bench_model - `weld bench -m MODEL` (prefill and decode tokens/s of the executor and
 * kernels, against the memory roofline), `weld bench --bandwidth` (the probe alone),
 * `--handoff` (team_handoff_ns) and `--pair A,B` (two executors interleaved). What each
 * number means and the JSON each prints are in docs/bench-json.md: keep them in step.
 *
 * What is measured: the runner directly (runner_create_ex: one sequence, f16 KV cache,
 * -t workers), not the engine, so scheduling costs are left out, as in llama-bench.
 * Token ids are random (seeded, non-special when the model carries a tokenizer); their
 * values do not change the work. After an untimed warm-up, each of -r repetitions times
 * one prefill of -p tokens (pp) and -n single-token decode steps (tg); -d D prefills D
 * untimed tokens first, -b B decodes B sequences in lockstep. Positions must fit the
 * context; the default -p / -n shrink to fit a short one, with a note.
 *
 * Decode bandwidth: the bytes one decode step reads x decode steps/s, over the best pass
 * of the read probe (kernels/cpu/bandwidth.h) run in the same invocation with the same
 * threads; the paired share uses probe passes run right after each decode instead. A
 * model whose weights fit the last-level cache is read from cache: its shares are no
 * roofline, and the report says "cache-resident".
 *
 * --pair: two runners on the one loaded model and one copy of its weights
 * (exec/weights.h) decode in alternating blocks, each side's team parked while the other
 * runs; each B block is compared with the A blocks either side of it (linear drift
 * cancels), and the repetitions run in both creation orders, whose geometric mean
 * cancels a creation-order bias.
 *
 * Prefill compute: the operations one prefill of -p tokens does (2 per multiply-add of the
 * matrix products, the last token's logits included, and of attention's QK and PV over the
 * causal positions) x prefills/s, over the best pass of the compute probe
 * (kernels/cpu/peak.h) of the instruction the FFN weights' products run on, with the
 * same threads.
 *
 * Not here: the engine's scheduling (see `weld bench throughput`).
 */
#include "cli/cli.h"
#include "comm/comm.h"
#include "core/alloc.h"
#include "core/err.h"
#include "core/json.h"
#include "core/progress.h"
#include "core/rng.h"
#include "core/team.h"
#include "exec/runner.h"
#include "exec/weights.h"
#include "kernels/cpu/bandwidth.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/peak.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BENCH_MAX_TOKENS (1 << 20)
#define BENCH_MAX_REPS 1000

struct bm_opts {
    const char *model;
    const char *pair; /* --pair A,B: two executors interleaved (see the file comment) */
    struct cli_exec_opts exec;
    struct exec_tuning tuning; /* of --exec, --tune (with --pair: both sides' base) */
    int n_prompt, n_gen, reps, threads, depth, batch, block;
    uint64_t probe_size;
    bool json, bandwidth, handoff;
    bool p_default, n_default; /* -p / -n not given: shrunk to fit a short context */
};

struct bm_stat {
    int tokens;
    double median, min, max;
};

struct bm_run {
    struct model *m;
    struct tokenizer *tok; /* NULL: every id is fair game */
    struct runner *r;
    struct rng g;
    int n_vocab;
    int32_t *ids; /* (max(n_prompt, depth, 1) x batch) */
    float *logits; /* (batch, n_vocab) */
    struct batch_seq *seqs; /* (batch) */
    int batch;
    struct exec_stats tg_stats; /* summed over the timed decode steps */
    bool have_stats;            /* the executor keeps stats */
    /* several ranks (--tensor-parallel-size): rank 0's communication over the timed
       prefills and decodes, their tokens and seconds */
    bool have_comm;
    struct comm_stats pp_comm, tg_comm;
    double pp_tokens, tg_tokens, pp_s, tg_s;
};

/* Add the communication since the last reset to *acc (several ranks only). */
static void bm_comm_add(struct bm_run *b, struct comm_stats *acc, double tokens, double s,
                        double *acc_tokens, double *acc_s)
{
    struct comm_stats c;
    if (!runner_comm_stats(b->r, &c, true))
        return;
    b->have_comm = true;
    acc->bytes_sent += c.bytes_sent;
    acc->bytes_recv += c.bytes_recv;
    acc->calls += c.calls;
    acc->wait_s += c.wait_s;
    *acc_tokens += tokens;
    *acc_s += s;
}

static int32_t bm_token(struct bm_run *b)
{
    int32_t t = 0;
    for (int tries = 0; tries < 1000; tries++) {
        t = (int32_t)(rng_u64(&b->g) % (uint64_t)b->n_vocab);
        if (!b->tok || (!tokenizer_is_special(b->tok, t) && !tokenizer_is_eog(b->tok, t)))
            break;
    }
    return t;
}

/* Feed n tokens (random) at pos to each of sequences 0 .. nseq - 1 at once (last-token
   logits). */
static int bm_step_all(struct bm_run *b, int nseq, int pos, int n, struct weld_err *e)
{
    for (int q = 0; q < nseq; q++) {
        int32_t *ids = b->ids + (size_t)q * (size_t)n;
        for (int i = 0; i < n; i++)
            ids[i] = bm_token(b);
        b->seqs[q] = (struct batch_seq){.seq_id = q, .tokens = ids, .n_tokens = n, .pos = pos};
    }
    struct batch bt = {.seqs = b->seqs, .n_seqs = nseq};
    return runner_forward(b->r, &bt, b->logits, e);
}

static void bm_drop_all(struct bm_run *b)
{
    for (int q = 0; q < b->batch; q++)
        runner_drop_seq(b->r, q);
}

/* An untimed context of `depth` tokens (none for 0), then one timed prefill of n tokens;
   seconds in *dt. */
static int bm_prefill(struct bm_run *b, int depth, int n, double *dt, struct weld_err *e)
{
    runner_drop_seq(b->r, 0);
    int rc = depth > 0 ? bm_step_all(b, 1, 0, depth, e) : WELD_OK;
    if (rc)
        return rc;
    struct comm_stats skip;
    (void)runner_comm_stats(b->r, &skip, true);
    double t0 = time_now();
    rc = bm_step_all(b, 1, depth, n, e);
    *dt = time_now() - t0;
    bm_comm_add(b, &b->pp_comm, n, *dt, &b->pp_tokens, &b->pp_s);
    runner_drop_seq(b->r, 0);
    return rc;
}

/* Add r's executor stats of the steps since the last reset to *acc (and reset them);
   false when the executor keeps none. */
static bool bm_stats_add(struct runner *r, struct exec_stats *acc)
{
    struct exec_stats s;
    struct weld_err e;
    if (runner_exec_stats(r, &s, true, &e) != WELD_OK)
        return false;
    acc->executor = s.executor;
    acc->n_workers = s.n_workers;
    acc->steps += s.steps;
    acc->tokens += s.tokens;
    acc->syncs += s.syncs;
    acc->wait_s += s.wait_s;
    acc->step_s += s.step_s;
    return true;
}

/* Add the executor stats of the steps since the last reset to b->tg_stats. */
static void bm_add_stats(struct bm_run *b)
{
    b->have_stats = bm_stats_add(b->r, &b->tg_stats);
}

/* An untimed prompt of max(depth, 1) tokens for each of the b->batch sequences, then n
   timed decode steps of all of them (whose executor stats go to b->tg_stats when
   `stats`). */
static int bm_decode(struct bm_run *b, int depth, int n, bool stats, double *dt,
                     struct weld_err *e)
{
    struct exec_stats skip;
    bm_drop_all(b);
    const int ctx = depth > 1 ? depth : 1;
    int rc = bm_step_all(b, b->batch, 0, ctx, e);
    (void)runner_exec_stats(b->r, &skip, true, e); /* the prompt's step is not counted */
    struct comm_stats cskip;
    (void)runner_comm_stats(b->r, &cskip, true);
    double t0 = time_now();
    for (int i = 0; rc == WELD_OK && i < n; i++)
        rc = bm_step_all(b, b->batch, ctx + i, 1, e);
    *dt = time_now() - t0;
    if (stats)
        bm_comm_add(b, &b->tg_comm, (double)n * b->batch, *dt, &b->tg_tokens, &b->tg_s);
    if (stats && rc == WELD_OK)
        bm_add_stats(b);
    bm_drop_all(b);
    return rc;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Median / min / max of v[0..n) (sorted in place). */
static struct bm_stat bm_stats(double *v, int n, int tokens)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    double med = n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
    return (struct bm_stat){tokens, med, v[0], v[n - 1]};
}

/* Bytes one decode step reads (see the file comment). */
static size_t bm_decode_bytes(const struct model *m)
{
    return exec_decode_bytes(m);
}

/* Positions a sequence of the benchmark reaches. */
static int bm_ctx(const struct bm_opts *o)
{
    return o->depth + (o->n_prompt > o->n_gen + 1 ? o->n_prompt : o->n_gen + 1);
}

/* Every position the benchmark reaches must be inside the model's context: an explicit
   -p / -n / -d beyond it is an error; the defaults (-p 512, -n 128) shrink to fit. */
static int bm_fit_context(struct bm_opts *o, int max_ctx, struct weld_err *e)
{
    if (max_ctx <= 0 || bm_ctx(o) <= max_ctx)
        return WELD_OK;
    int room = max_ctx - o->depth; /* positions left after -d */
    const int p0 = o->n_prompt, n0 = o->n_gen, need = bm_ctx(o);
    if (room >= 2 && o->p_default && o->n_prompt > room)
        o->n_prompt = room;
    if (room >= 2 && o->n_default && o->n_gen + 1 > room)
        o->n_gen = room - 1;
    if (bm_ctx(o) <= max_ctx) {
        fprintf(stderr, "weld bench: the model's context is %d tokens: running -p %d -n %d "
                        "(the defaults -p 512 -n 128 do not fit)\n", max_ctx, o->n_prompt,
                o->n_gen);
        return WELD_OK;
    }
    o->n_prompt = p0;
    o->n_gen = n0;
    return err_set(e, WELD_ERR_LIMIT, "-d %d -p %d -n %d reach position %d, beyond the model's "
                   "context of %d tokens: keep -d + max(-p, -n + 1) <= %d (e.g. -d %d -p %d -n %d)",
                   o->depth, p0, n0, need, max_ctx, max_ctx,
                   room >= 2 ? o->depth : 0, room >= 2 ? room : max_ctx,
                   room >= 2 ? room - 1 : max_ctx - 1);
}

static int bm_open(struct bm_run *b, struct bm_opts *o, struct weld_err *e)
{
    int rc = model_load(&b->m, o->model, e);
    if (rc == WELD_OK)
        rc = bm_fit_context(o, b->m->cfg.max_ctx, e);
    if (rc)
        return rc;
    b->n_vocab = b->m->cfg.n_vocab;
    if (b->n_vocab < 1)
        return err_set(e, WELD_ERR_FORMAT, "%s: model has no vocabulary", o->model);
    if (b->m->gguf && tokenizer_load_gguf(&b->tok, b->m->gguf, e) != WELD_OK) {
        b->tok = NULL; /* ids only: specials may be drawn, which costs the same */
        err_clear(e);
    }
    struct backend_params p;
    b->batch = o->batch;
    backend_params_init(&p, o->batch, bm_ctx(o));
    p.n_threads = o->threads;
    p.tuning = o->tuning;
    if (!o->pair && (rc = runner_create_ex(&b->r, b->m, &p, e)))
        return rc;
    size_t per_seq = (size_t)(o->n_prompt > o->depth ? o->n_prompt : o->depth);
    per_seq = per_seq > 1 ? per_seq : 1;
    b->ids = wmalloc(per_seq * (size_t)o->batch * sizeof *b->ids);
    b->logits = wmalloc((size_t)o->batch * (size_t)b->n_vocab * sizeof *b->logits);
    b->seqs = wcalloc((size_t)o->batch, sizeof *b->seqs);
    if (!b->ids || !b->logits || !b->seqs)
        return err_set(e, WELD_ERR_NOMEM, "bench: out of memory");
    rng_seed(&b->g, 1);
    return WELD_OK;
}

static void bm_close(struct bm_run *b)
{
    runner_free(b->r);
    tokenizer_free(b->tok);
    model_free(b->m);
    wfree(b->ids);
    wfree(b->logits);
    wfree(b->seqs);
}

#define BM_PROBE_PASSES 5 /* per read loop */
#define BM_PAIRED_MAX 64  /* probe passes after one repetition's decode, at most */

/* Warm-up, then -r repetitions of pp and tg; with a probe session, passes of `loop` right
   after each tg (for a quarter of its time), and in *paired the median over repetitions of
   that tg's weight GB/s over theirs. */
static int bm_measure(struct bm_run *b, const struct bm_opts *o, struct bm_stat *pp,
                      struct bm_stat *tg, struct bw_session *ses, const char *loop,
                      double *paired, struct weld_err *e)
{
    double *v = wcalloc(3 * (size_t)o->reps, sizeof *v), dt;
    if (!v)
        return err_set(e, WELD_ERR_NOMEM, "bench: out of memory");
    double *share = v + 2 * (size_t)o->reps;
    const double bytes = (double)bm_decode_bytes(b->m);
    int rc = bm_prefill(b, 0, o->n_prompt, &dt, e);
    if (rc == WELD_OK)
        rc = bm_decode(b, 0, 1, false, &dt, e);
    for (int i = 0; rc == WELD_OK && i < o->reps; i++) {
        rc = bm_prefill(b, o->depth, o->n_prompt, &dt, e);
        v[i] = dt > 0 ? o->n_prompt / dt : 0;
        if (rc == WELD_OK)
            rc = bm_decode(b, o->depth, o->n_gen, true, &dt, e);
        v[o->reps + i] = dt > 0 ? (double)o->n_gen * o->batch / dt : 0;
        double probe = 0;
        if (rc == WELD_OK && ses) {
            runner_park(b->r); /* its spinning workers would share the cores with the pass */
            double t0 = time_now(), inv = 0; /* passes for a quarter of the decode's time */
            int k = 0;
            for (double r; rc == WELD_OK && k < BM_PAIRED_MAX &&
                           (k == 0 || time_now() - t0 < dt / 4); k++)
                if ((rc = bw_session_pass(ses, loop, &r, e)) == WELD_OK)
                    inv += 1 / r;
            probe = inv > 0 ? k / inv : 0; /* the rate of all k passes together */
        }
        share[i] = probe > 0 ? bytes * v[o->reps + i] / o->batch / 1e9 / probe : 0;
    }
    if (rc == WELD_OK) {
        *pp = bm_stats(v, o->reps, o->n_prompt);
        *tg = bm_stats(v + o->reps, o->reps, o->n_gen * o->batch);
        *paired = bm_stats(share, o->reps, 0).median;
    }
    wfree(v);
    return rc;
}

/* The workers the runner will have: -t, capped at the physical cores as the team caps it
   (so the probe runs with the same count and the report names it). */
static int bm_threads(const struct bm_opts *o)
{
    int cores = team_default_size();
    return o->threads > 0 && o->threads < cores ? o->threads : cores;
}


static int bm_probe(const struct bm_opts *o, int threads, struct bw_result *bw,
                    struct weld_err *e)
{
    return bw_probe((size_t)o->probe_size, threads, BM_PROBE_PASSES, bw, e);
}

static json_t *bm_stat_json(const struct bm_stat *s)
{
    return json_pack("{s:i, s:f, s:f, s:f}", "tokens", s->tokens, "tok_s_median", s->median,
                     "tok_s_min", s->min, "tok_s_max", s->max);
}

static void bm_print_json(json_t *j)
{
    char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
    if (s)
        printf("%s\n", s);
    free(s);
    json_decref(j);
}

/* The executor's bubble (share of worker time waiting) and syncs per token over the
   timed decode steps; false when it keeps no stats. */
static bool bm_exec_figures(const struct bm_run *b, double *bubble, double *syncs_per_token)
{
    const struct exec_stats *s = &b->tg_stats;
    if (!b->have_stats || s->tokens < 1 || s->step_s <= 0 || s->n_workers < 1)
        return false;
    *bubble = s->wait_s / (s->step_s * s->n_workers);
    *syncs_per_token = (double)s->syncs / (double)s->tokens;
    return true;
}

/* Multiply-adds of a matrix product's weight, per token. */
static double bm_mat(const struct tensor *t)
{
    return t->data ? (double)t->ne[0] * (double)t->ne[1] : 0;
}

/* Operations of one prefill of n tokens after `depth` (see the file comment); the matrix
   products' share in *mat. */
static double bm_prefill_ops(const struct model *m, int depth, int n, double *mat)
{
    double per_token = 0;
    for (int l = 0; l < m->cfg.n_layer; l++) {
        const struct layer_weights *w = &m->layers[l];
        per_token += bm_mat(&w->wq) + bm_mat(&w->wk) + bm_mat(&w->wv) + bm_mat(&w->wo) +
                     bm_mat(&w->w_gate) + bm_mat(&w->w_up) + bm_mat(&w->w_down) + bm_mat(&w->wq_a) +
                     bm_mat(&w->wq_b) + bm_mat(&w->wkv_a) + bm_mat(&w->router) +
                     bm_mat(&w->sh_gate) + bm_mat(&w->sh_up) + bm_mat(&w->sh_down);
        if (model_layer_moe(&m->cfg, l) && w->exp_gate) /* the experts a token is routed to */
            per_token += (double)m->cfg.n_expert_used *
                         (bm_mat(&w->exp_gate[0]) + bm_mat(&w->exp_up[0]) +
                          bm_mat(&w->exp_down[0]));
        if (m->cfg.kv_lora_rank > 0) /* absorbed queries and value up-projections */
            per_token += (double)m->cfg.n_head * m->cfg.kv_lora_rank *
                         (m->cfg.qk_nope_dim + m->cfg.v_head_dim);
    }
    *mat = 2 * (per_token * n + bm_mat(&m->output)); /* logits of the last token only */
    /* token i attends depth + i + 1 positions: QK and PV, head_dim multiply-adds each */
    double keys = (double)n * depth + (double)n * (n + 1) / 2;
    const int akd = m->cfg.kv_lora_rank > 0 ? m->cfg.kv_lora_rank + m->cfg.rope_dim
                                            : m->cfg.head_dim; /* latent: one wide row */
    double attn = 4.0 * m->cfg.n_layer * m->cfg.n_head * akd * keys;
    return *mat + attn;
}

struct bm_compute {
    struct peak_result peak; /* peak.op PEAK_NONE: no probe for the instruction */
    const char *why;         /* why there is no peak figure */
};

/* The compute probe for the instruction the FFN weights' products run on. */
static void bm_compute_probe(const struct bm_run *b, int threads, struct bm_compute *c)
{
    struct weld_err e;
    enum isa_level l = isa_active();
    /* the FFN's type: layer 0's dense up projection, or its first expert's */
    const struct layer_weights *L0 = b->m->cfg.n_layer > 0 ? &b->m->layers[0] : NULL;
    const struct tensor *up = !L0             ? NULL
                              : L0->w_up.data ? &L0->w_up
                              : L0->exp_up    ? &L0->exp_up[0]
                                              : &L0->wo;
    enum peak_op op = up ? peak_op_for(up->type, l) : PEAK_NONE;
    c->why = NULL;
    memset(&c->peak, 0, sizeof c->peak);
    if (op == PEAK_NONE)
        c->why = l == ISA_SCALAR ? "scalar code" : "no probe for AMX tiles yet";
    else if (peak_probe(op, l, threads, BM_PROBE_PASSES, &c->peak, &e) != WELD_OK)
        c->why = "the probe failed", c->peak.op = PEAK_NONE;
}

static void bm_report(const struct bm_opts *o, const struct bm_run *b, int threads,
                      const struct bm_stat *pp, const struct bm_stat *tg,
                      const struct bw_result *bw, double paired, const struct bm_compute *c)
{
    double mat = 0, ops = bm_prefill_ops(b->m, o->depth, o->n_prompt, &mat);
    double gops = pp->median > 0 ? ops * pp->median / o->n_prompt / 1e9 : 0;
    double pshare = c->peak.gops_best > 0 ? gops / c->peak.gops_best : 0;
    size_t bytes = bm_decode_bytes(b->m);
    double gb_s = (double)bytes * tg->median / o->batch / 1e9;
    double share = bw->gb_s_best > 0 ? gb_s / bw->gb_s_best : 0;
    const char *isa = isa_name(isa_active());
    double bubble = 0, syncs = 0;
    bool ex = bm_exec_figures(b, &bubble, &syncs);
    /* weights that fit the last-level cache are read from it, not from memory: then the
       shares compare cache reads with a DRAM probe and may pass 100% */
    size_t llc = bw_llc_bytes();
    bool resident = llc > 0 && bytes <= llc;
    if (o->json) {
        json_t *j = json_pack("{s:s, s:i, s:s, s:o, s:o, s:{s:f, s:f, s:f, s:f, s:I, s:b}}",
                              "model", o->model, "threads", threads, "isa", isa, "pp",
                              bm_stat_json(pp), "tg", bm_stat_json(tg), "bandwidth",
                              "gb_s", gb_s, "probe_gb_s", bw->gb_s_best, "share", share,
                              "paired_share", paired, "llc_bytes", (json_int_t)llc,
                              "cache_resident", resident);
        if (j && o->batch > 1)
            json_object_set_new(j, "batch", json_integer(o->batch));
        if (j)
            json_object_set_new(j, "compute",
                                json_pack("{s:f, s:f, s:f, s:s?, s:f, s:f, s:s?}", "prefill_gop",
                                          ops / 1e9, "matmul_share", ops > 0 ? mat / ops : 0,
                                          "gops", gops, "instr", c->peak.instr, "peak_gops",
                                          c->peak.gops_best, "share", pshare, "no_peak", c->why));
        if (j && b->have_comm)
            json_object_set_new(
                j, "comm",
                json_pack(
                    "{s:f, s:f, s:f, s:f}", "pp_bytes_per_token",
                    b->pp_tokens > 0
                        ? (double)(b->pp_comm.bytes_sent + b->pp_comm.bytes_recv) / b->pp_tokens
                        : 0.0,
                    "tg_bytes_per_token",
                    b->tg_tokens > 0
                        ? (double)(b->tg_comm.bytes_sent + b->tg_comm.bytes_recv) / b->tg_tokens
                        : 0.0,
                    "pp_wait_share", b->pp_s > 0 ? b->pp_comm.wait_s / b->pp_s : 0.0,
                    "tg_wait_share", b->tg_s > 0 ? b->tg_comm.wait_s / b->tg_s : 0.0));
        if (j && ex) {
            json_object_set_new(j, "executor", json_string(b->tg_stats.executor));
            json_object_set_new(j, "bubble", json_real(bubble));
            json_object_set_new(j, "syncs_per_token", json_real(syncs));
        }
        bm_print_json(j);
        return;
    }
    printf("model %s\n%d threads, isa %s, %d repetitions; %s\n", o->model, threads, isa,
           o->reps, runner_describe(b->r));
    printf("%-8s %8s %12s %12s %12s\n", "test", "tokens", "median t/s", "min t/s", "max t/s");
    printf("%-8s %8d %12.2f %12.2f %12.2f\n", "pp", pp->tokens, pp->median, pp->min, pp->max);
    printf("%-8s %8d %12.2f %12.2f %12.2f%s\n", "tg", tg->tokens, tg->median, tg->min, tg->max,
           o->batch > 1 ? "  (all sequences)" : "");
    printf("decode bandwidth: %.2f GB/s (%.1f MB per token) = %.1f%% of the probe's "
           "%.2f GB/s (best of %d passes x %d read loops over %.2f GiB: %s)\n",
           gb_s, (double)bytes / 1e6, 100 * share, bw->gb_s_best, bw->passes, bw->loops,
           (double)bw->bytes / (1024.0 * 1024 * 1024), bw->loop);
    printf("                  %.1f%% of a pass of that loop run right after each repetition's "
           "decode (median of the ratios)\n", 100 * paired);
    if (resident)
        printf("                  cache-resident: the %.1f MB of weights fit in the %.1f MiB "
               "last-level cache, so decode reads them from cache; these shares are no memory "
               "roofline and may pass 100%%\n", (double)bytes / 1e6, (double)llc / 1048576.0);
    else if (share > 1 || paired > 1)
        printf("                  above 100%%: part of the weights is read from cache, not "
               "memory (a share of the memory probe is no bound then)\n");
    if (ex)
        printf("executor %s: bubble %.1f%% (batch %d), %.1f syncs/token\n",
               b->tg_stats.executor, 100 * bubble, o->batch, syncs);
    if (b->have_comm)
        printf("communication (rank 0): decode %.1f KB per token, %.1f%% of the time waiting "
               "in exchanges (%.1f per token); prefill %.1f KB per token, %.1f%% waiting\n",
               b->tg_tokens > 0
                   ? (double)(b->tg_comm.bytes_sent + b->tg_comm.bytes_recv) / b->tg_tokens / 1e3
                   : 0.0,
               b->tg_s > 0 ? 100 * b->tg_comm.wait_s / b->tg_s : 0.0,
               b->tg_tokens > 0 ? (double)b->tg_comm.calls / b->tg_tokens : 0.0,
               b->pp_tokens > 0
                   ? (double)(b->pp_comm.bytes_sent + b->pp_comm.bytes_recv) / b->pp_tokens / 1e3
                   : 0.0,
               b->pp_s > 0 ? 100 * b->pp_comm.wait_s / b->pp_s : 0.0);
    printf("prefill compute: %.1f GFLOP/s (%.2f GFLOP per prefill, %.0f%% in matrix products)",
           gops, ops / 1e9, ops > 0 ? 100 * mat / ops : 0);
    if (c->peak.op != PEAK_NONE)
        printf(" = %.1f%% of the %s peak %.1f GFLOP/s (best of %d passes)\n", 100 * pshare,
               c->peak.instr, c->peak.gops_best, c->peak.passes);
    else
        printf("; no peak figure (%s)\n", c->why);
}

static int bm_run_model(struct bm_opts *o, struct weld_err *e)
{
    struct bm_run b;
    memset(&b, 0, sizeof b);
    struct bm_stat pp = {0}, tg = {0};
    struct bw_result bw = {0};
    struct bw_session *ses = NULL;
    struct bm_compute cp = {0};
    double paired = 0;
    int threads = 0;
    int rc = isa_init(e);
    if (rc == WELD_OK)
        rc = bm_open(&b, o, e);
    if (rc == WELD_OK) /* the runner's count: -t, or its default for this model */
        threads = o->threads > 0 ? bm_threads(o) : backend_cpu_default_threads(b.m, &o->tuning);
    if (rc == WELD_OK)
        rc = bw_session_open(&ses, (size_t)o->probe_size, threads, e);
    if (rc == WELD_OK)
        rc = bw_session_probe(ses, BM_PROBE_PASSES, &bw, e);
    if (rc == WELD_OK)
        bm_compute_probe(&b, threads, &cp);
    if (rc == WELD_OK)
        rc = bm_measure(&b, o, &pp, &tg, ses, bw.loop, &paired, e);
    if (rc == WELD_OK)
        bm_report(o, &b, threads, &pp, &tg, &bw, paired, &cp);
    bw_session_close(ses);
    bm_close(&b);
    return rc;
}

static int bm_run_bandwidth(const struct bm_opts *o, struct weld_err *e)
{
    struct bw_result bw;
    int threads = bm_threads(o);
    int rc = bm_probe(o, threads, &bw, e);
    if (rc)
        return rc;
    if (o->json)
        bm_print_json(json_pack("{s:i, s:s, s:s, s:I, s:i, s:f, s:f}", "threads", threads,
                                "isa", bw.isa, "loop", bw.loop, "bytes", (json_int_t)bw.bytes,
                                "passes", bw.passes, "probe_gb_s", bw.gb_s_best,
                                "probe_gb_s_median", bw.gb_s_median));
    else
        printf("read bandwidth: best %.2f GB/s, median %.2f GB/s (%d threads, %d passes x %d "
               "read loops over %.2f GiB; best loop: %s)\n",
               bw.gb_s_best, bw.gb_s_median, threads, bw.passes, bw.loops,
               (double)bw.bytes / (1024.0 * 1024 * 1024), bw.loop);
    return WELD_OK;
}

/* ---- --pair: two executors interleaved in one process ---------------------------------- */

#define BM_PAIR_BLOCK_S 0.05 /* default block: about this long of side A's decode */

struct bm_side {
    char exec[16];
    char spec[96];              /* as given, for the report */
    struct exec_tuning tuning;  /* --tune's, then the side's executor and settings */
    int threads;                /* 0: -t */
    struct runner *r;
    double pp_s, tg_s;          /* timed seconds */
    long long pp_tok, tg_tok;
    struct exec_stats st;       /* summed over the timed decode blocks */
    bool have_stats;
};

/* "EXEC[:THREADS][@KEY=VALUE]..." into sd: its tuning is base with that executor and
   those settings (cli_tune_set's keys). */
static int bm_side_parse(const char *s, size_t n, const struct exec_tuning *base,
                         struct bm_side *sd, struct weld_err *e)
{
    if (n == 0 || n >= sizeof sd->spec)
        return err_set(e, WELD_ERR_INVALID_ARG, "--pair: a side is empty or longer than %zu "
                       "characters", sizeof sd->spec - 1);
    memcpy(sd->spec, s, n);
    sd->spec[n] = '\0';
    sd->tuning = *base;
    sd->tuning.executor = sd->exec;
    char *at = strchr(sd->spec, '@');
    for (char *p = at; p;) { /* each setting runs to the next '@' or the end */
        char *q = strchr(p + 1, '@');
        if (q)
            *q = '\0';
        int rc = cli_tune_set(&sd->tuning, p + 1, e);
        if (q)
            *q = '@';
        if (rc) {
            err_prefix(e, "--pair side '%s'", sd->spec);
            return rc;
        }
        p = q;
    }
    if (at)
        n = (size_t)(at - sd->spec);
    const char *colon = memchr(s, ':', n);
    size_t nl = colon ? (size_t)(colon - s) : n;
    if (nl == 0 || nl >= sizeof sd->exec)
        return err_set(e, WELD_ERR_INVALID_ARG, "--pair side '%s': no executor", sd->spec);
    memcpy(sd->exec, s, nl);
    sd->exec[nl] = '\0';
    const struct executor_impl *ex;
    int rc = executor_find(&ex, sd->exec, e);
    if (rc) {
        err_prefix(e, "--pair side '%s'", sd->spec);
        return rc;
    }
    sd->threads = 0;
    if (colon) {
        char buf[8];
        size_t tl = n - nl - 1;
        char *end = buf;
        long t = 0;
        if (tl > 0 && tl < sizeof buf) {
            memcpy(buf, colon + 1, tl);
            buf[tl] = '\0';
            t = strtol(buf, &end, 10);
        }
        if (tl == 0 || tl >= sizeof buf || *end || t < 1 || t > 256)
            return err_set(e, WELD_ERR_INVALID_ARG, "--pair side '%s': threads after ':' must "
                           "be in [1, 256]", sd->spec);
        sd->threads = (int)t;
    }
    return WELD_OK;
}

static int bm_pair_parse(const char *s, const struct exec_tuning *base, struct bm_side sd[2],
                         struct weld_err *e)
{
    const char *comma = strchr(s, ',');
    if (!comma || strchr(comma + 1, ','))
        return err_set(e, WELD_ERR_INVALID_ARG, "--pair '%s': want two sides "
                       "EXEC[:THREADS][@KEY=VALUE]... separated by a comma, e.g. mega,ops or "
                       "mega:2,ref:1 or mega,mega@decode_pairs=1 (executors: ref, ops, mega; "
                       "keys: those of --tune)", s);
    int rc = bm_side_parse(s, (size_t)(comma - s), base, &sd[0], e);
    return rc ? rc : bm_side_parse(comma + 1, strlen(comma + 1), base, &sd[1], e);
}

/* A runner with sd's executor and settings. */
static int bm_side_open(const struct bm_run *b, const struct bm_opts *o, struct bm_side *sd,
                        struct weld_err *e)
{
    struct backend_params p;
    backend_params_init(&p, o->batch, bm_ctx(o));
    p.n_threads = sd->threads ? sd->threads : o->threads;
    p.tuning = sd->tuning;
    p.tuning.executor = sd->exec;
    return runner_create_ex(&sd->r, b->m, &p, e);
}

/* Switch the benchmark to side sd (the other side's team is parked already). */
static void bm_use(struct bm_run *b, struct bm_side *sd)
{
    b->r = sd->r;
}

/* n decode steps of side sd from position pos; seconds in *dt; then park its team. */
static int bm_side_block(struct bm_run *b, struct bm_side *sd, int pos, int n, double *dt,
                         struct weld_err *e)
{
    bm_use(b, sd);
    int rc = WELD_OK;
    double t0 = time_now();
    for (int i = 0; rc == WELD_OK && i < n; i++)
        rc = bm_step_all(b, b->batch, pos + i, 1, e);
    *dt = time_now() - t0;
    runner_park(sd->r);
    return rc;
}

/* The workers side sd runs on (ref: one; else as bm_threads, with the side's own count). */
static int bm_side_threads(const struct bm_opts *o, const struct bm_side *sd)
{
    if (!strcmp(sd->exec, "ref"))
        return 1;
    struct bm_opts so = *o;
    so.threads = sd->threads ? sd->threads : o->threads;
    return bm_threads(&so);
}

struct bm_ratios {
    double *v;
    int n, cap;
};

static bool bm_ratio_add(struct bm_ratios *r, double x)
{
    if (r->n == r->cap) {
        int cap = r->cap ? 2 * r->cap : 64;
        double *v = wrealloc(r->v, (size_t)cap * sizeof *v);
        if (!v)
            return false;
        r->v = v;
        r->cap = cap;
    }
    r->v[r->n++] = x;
    return true;
}

/* One repetition: pp of both sides (order by rep), then the interleaved decode blocks;
   each ratio is A's speed over B's. */
static int bm_pair_rep(struct bm_run *b, const struct bm_opts *o, struct bm_side sd[2],
                       int rep, int block, struct bm_ratios *pp, struct bm_ratios *tg,
                       struct weld_err *e)
{
    double pdt[2] = {0, 0};
    int rc = WELD_OK;
    for (int k = 0; rc == WELD_OK && k < 2; k++) {
        struct bm_side *s = &sd[(k + rep) % 2];
        bm_use(b, s);
        rc = bm_prefill(b, o->depth, o->n_prompt, &pdt[(k + rep) % 2], e);
        runner_park(s->r);
    }
    if (rc)
        return rc;
    for (int k = 0; k < 2; k++) {
        sd[k].pp_s += pdt[k];
        sd[k].pp_tok += o->n_prompt;
    }
    if (pdt[0] > 0 && !bm_ratio_add(pp, pdt[1] / pdt[0]))
        return err_set(e, WELD_ERR_NOMEM, "bench: out of memory");
    const int ctx = o->depth > 1 ? o->depth : 1;
    struct exec_stats skip;
    for (int k = 0; rc == WELD_OK && k < 2; k++) { /* untimed prompts, stats from zero */
        bm_use(b, &sd[k]);
        bm_drop_all(b);
        rc = bm_step_all(b, b->batch, 0, ctx, e);
        (void)runner_exec_stats(sd[k].r, &skip, true, e);
        runner_park(sd[k].r);
    }
    double dt;
    double *tb = wcalloc((size_t)o->n_gen / (size_t)block + 2, sizeof *tb);
    double *ta = wcalloc((size_t)o->n_gen / (size_t)block + 2, sizeof *ta);
    if (!tb || !ta)
        rc = err_set(e, WELD_ERR_NOMEM, "bench: out of memory");
    int nb = 0;
    for (int pos = ctx; rc == WELD_OK && pos < ctx + o->n_gen; pos += block, nb++) {
        int n = ctx + o->n_gen - pos < block ? ctx + o->n_gen - pos : block;
        for (int k = 0; rc == WELD_OK && k < 2; k++) {
            rc = bm_side_block(b, &sd[k], pos, n, &dt, e);
            sd[k].tg_s += dt;
            sd[k].tg_tok += (long long)n * b->batch;
            (k ? tb : ta)[nb] = dt / n;
        }
    }
    /* B block i against the mean of A blocks i and i + 1 (A block i alone for the last) */
    for (int i = 0; rc == WELD_OK && i < nb; i++) {
        double a = i + 1 < nb ? (ta[i] + ta[i + 1]) / 2 : ta[i];
        if (a > 0 && !bm_ratio_add(tg, tb[i] / a))
            rc = err_set(e, WELD_ERR_NOMEM, "bench: out of memory");
    }
    wfree(ta);
    wfree(tb);
    for (int k = 0; k < 2; k++) {
        sd[k].have_stats = bm_stats_add(sd[k].r, &sd[k].st);
        bm_use(b, &sd[k]);
        bm_drop_all(b);
    }
    return rc;
}

/* Steps per block: --block, else about BM_PAIR_BLOCK_S of side A's decode, at most n/8. */
static int bm_pair_block(struct bm_run *b, const struct bm_opts *o, struct bm_side *a,
                         int *block, struct weld_err *e)
{
    if (o->block > 0) {
        *block = o->block < o->n_gen ? o->block : o->n_gen;
        return WELD_OK;
    }
    bm_use(b, a);
    bm_drop_all(b);
    double dt;
    int n = o->n_gen < 8 ? o->n_gen : 8;
    int rc = bm_step_all(b, b->batch, 0, 1, e);
    if (rc == WELD_OK)
        rc = bm_side_block(b, a, 1, n, &dt, e);
    bm_drop_all(b);
    if (rc)
        return rc;
    double per = dt / n;
    int k = per > 0 ? (int)(BM_PAIR_BLOCK_S / per + 0.5) : 1;
    int most = o->n_gen / 8 > 1 ? o->n_gen / 8 : 1;
    *block = k < 1 ? 1 : k > most ? most : k;
    return WELD_OK;
}

static double bm_quantile(double *v, int n, double q)
{
    if (n < 1)
        return 0;
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    double x = q * (n - 1);
    int i = (int)x;
    return i + 1 < n ? v[i] + (x - i) * (v[i + 1] - v[i]) : v[n - 1];
}

/* The ratios of both creation orders r[0] (A made first) and r[1]: the bias-cancelled
   median sqrt(m0 * m1), each order's median, the bias sqrt(m0 / m1), and the pooled
   percentiles and counts (see the file comment). */
static json_t *bm_ratio_json(struct bm_ratios r[2], int *slower)
{
    struct bm_ratios all = {0};
    *slower = 0;
    for (int o = 0; o < 2; o++)
        for (int i = 0; i < r[o].n; i++) {
            *slower += r[o].v[i] < 1.0;
            if (!bm_ratio_add(&all, r[o].v[i])) {
                wfree(all.v);
                return NULL;
            }
        }
    double m0 = bm_quantile(r[0].v, r[0].n, 0.5), m1 = bm_quantile(r[1].v, r[1].n, 0.5);
    double med = m0 > 0 && m1 > 0 ? sqrt(m0 * m1) : m0 > 0 ? m0 : m1,
           bias = m0 > 0 && m1 > 0 ? sqrt(m0 / m1) : 1.0;
    double p10 = bm_quantile(all.v, all.n, 0.1), p90 = bm_quantile(all.v, all.n, 0.9);
    json_t *j = json_pack("{s:f, s:f, s:f, s:i, s:i, s:f, s:f, s:f}", "median", med, "p10",
                          p10, "p90", p90, "pairs", all.n, "a_slower", *slower, "a_first", m0,
                          "b_first", m1, "order_bias", bias);
    wfree(all.v);
    return j;
}

static int bm_pair_report(const struct bm_opts *o, struct bm_side sd[2], int block,
                          struct bm_ratios pp[2], struct bm_ratios tg[2], struct weld_err *e)
{
    int pp_slow, tg_slow;
    json_t *jpp = bm_ratio_json(pp, &pp_slow), *jtg = bm_ratio_json(tg, &tg_slow);
    if (!jpp || !jtg) {
        json_decref(jpp);
        json_decref(jtg);
        return err_set(e, WELD_ERR_NOMEM, "bench: out of memory");
    }
    json_t *sides = json_array();
    for (int k = 0; k < 2; k++) {
        double pps = sd[k].pp_s > 0 ? sd[k].pp_tok / sd[k].pp_s : 0;
        double tgs = sd[k].tg_s > 0 ? sd[k].tg_tok / sd[k].tg_s : 0;
        json_t *js = json_pack("{s:s, s:s, s:i, s:f, s:f}", "side", sd[k].spec, "executor",
                               sd[k].exec, "threads", bm_side_threads(o, &sd[k]), "pp_tok_s",
                               pps, "tg_tok_s", tgs);
        const struct exec_stats *s = &sd[k].st;
        if (js && sd[k].have_stats && s->tokens > 0 && s->step_s > 0 && s->n_workers > 0) {
            json_object_set_new(js, "bubble", json_real(s->wait_s / (s->step_s * s->n_workers)));
            json_object_set_new(js, "syncs_per_token",
                                json_real((double)s->syncs / (double)s->tokens));
        }
        json_array_append_new(sides, js);
    }
    json_t *j = json_pack("{s:s, s:i, s:i, s:i, s:o, s:o, s:o}", "model", o->model, "batch",
                          o->batch, "block_steps", block, "repetitions", o->reps, "sides",
                          sides, "tg_ratio", jtg, "pp_ratio", jpp);
    if (o->json) {
        bm_print_json(j);
        return WELD_OK;
    }
    printf("model %s\n%s (%d threads) against %s (%d threads), interleaved: %d repetitions of "
           "pp%d, then tg%d in blocks of %d steps (batch %d), in each creation order\n",
           o->model, sd[0].spec, bm_side_threads(o, &sd[0]), sd[1].spec,
           bm_side_threads(o, &sd[1]), o->reps, o->n_prompt, o->n_gen, block, o->batch);
    for (int k = 0; k < 2; k++) {
        json_t *js = json_array_get(sides, (size_t)k);
        printf("  %-6s pp %10.2f tok/s   tg %10.2f tok/s", sd[k].spec,
               json_real_value(json_object_get(js, "pp_tok_s")),
               json_real_value(json_object_get(js, "tg_tok_s")));
        if (json_object_get(js, "bubble"))
            printf("   bubble %.1f%%, %.1f syncs/token",
                   100 * json_real_value(json_object_get(js, "bubble")),
                   json_real_value(json_object_get(js, "syncs_per_token")));
        printf("\n");
    }
    const char *lab[2] = {"tg", "pp"};
    json_t *jr[2] = {jtg, jpp};
    int slow[2] = {tg_slow, pp_slow};
    for (int k = 0; k < 2; k++) {
        printf("  %s %s / %s: %.3fx median over %d %s (p10 %.3fx, p90 %.3fx), %s slower in %d\n",
               lab[k], sd[0].spec, sd[1].spec,
               json_real_value(json_object_get(jr[k], "median")),
               (int)json_integer_value(json_object_get(jr[k], "pairs")),
               k ? "repetitions" : "block pairs",
               json_real_value(json_object_get(jr[k], "p10")),
               json_real_value(json_object_get(jr[k], "p90")), sd[0].spec, slow[k]);
        printf("     medians %.3fx with A's runner made first, %.3fx with B's: order bias "
               "%.3fx\n", json_real_value(json_object_get(jr[k], "a_first")),
               json_real_value(json_object_get(jr[k], "b_first")),
               json_real_value(json_object_get(jr[k], "order_bias")));
    }
    json_decref(j);
    return WELD_OK;
}

static int bm_run_pair(struct bm_opts *o, struct weld_err *e)
{
    struct bm_run b;
    memset(&b, 0, sizeof b);
    struct bm_side sd[2];
    memset(sd, 0, sizeof sd);
    struct bm_ratios pp[2] = {{0}}, tg[2] = {{0}};
    int rc = bm_pair_parse(o->pair, &o->tuning, sd, e);
    if (rc)
        return rc;
    int block = 1;
    rc = isa_init(e);
    if (rc == WELD_OK)
        rc = bm_open(&b, o, e);
    struct bm_opts od = *o; /* without -t, sides run the backend's default for the model */
    if (rc == WELD_OK && od.threads <= 0)
        od.threads = backend_cpu_default_threads(b.m, &o->tuning);
    o = &od;
    for (int ord = 0; rc == WELD_OK && ord < 2; ord++) { /* A made first, then B */
        for (int i = 0; rc == WELD_OK && i < 2; i++)
            if ((rc = bm_side_open(&b, o, &sd[i ^ ord], e)) == WELD_OK)
                runner_park(sd[i ^ ord].r);
        if (rc == WELD_OK) /* warm-up of both, then (once) the block size from A's decode */
            for (int k = 0; rc == WELD_OK && k < 2; k++) {
                double dt;
                bm_use(&b, &sd[k]);
                rc = bm_prefill(&b, 0, o->n_prompt, &dt, e);
                runner_park(sd[k].r);
            }
        if (rc == WELD_OK && ord == 0)
            rc = bm_pair_block(&b, o, &sd[0], &block, e);
        for (int i = 0; rc == WELD_OK && i < o->reps; i++)
            rc = bm_pair_rep(&b, o, sd, i, block, &pp[ord], &tg[ord], e);
        b.r = NULL;
        for (int k = 0; k < 2; k++) {
            runner_free(sd[k].r);
            sd[k].r = NULL;
        }
    }
    if (rc == WELD_OK)
        rc = bm_pair_report(o, sd, block, pp, tg, e);
    bm_close(&b);
    for (int k = 0; k < 2; k++) {
        wfree(pp[k].v);
        wfree(tg[k].v);
    }
    return rc;
}

/* --handoff: the cost of passing work between two workers of a team (team_handoff_ns)
   with 0, 1, 4 and 16 cache lines of data each way; what a megakernel pays at every
   dependency on another worker, and so what decides whether a tiny model's steps gain
   from a second thread. */
static int bm_run_handoff(const struct bm_opts *o, struct weld_err *e)
{
    static const int lines[] = {0, 1, 4, 16};
    enum { N_LINES = sizeof lines / sizeof lines[0], ROUNDS = 20000, RUNS = 5 };
    struct team *t = NULL;
    int rc = team_create(&t, 2, 0, e);
    if (rc)
        return rc;
    double ns[N_LINES];
    if (team_size(t) < 2)
        rc = err_set(e, WELD_ERR_UNSUPPORTED, "--handoff needs two physical cores, this "
                     "process may run on %d", team_physical_cores());
    for (int i = 0; rc == WELD_OK && i < N_LINES; i++)
        rc = team_handoff_ns(t, lines[i], ROUNDS, RUNS, &ns[i], e);
    team_free(t);
    if (rc)
        return rc;
    if (o->json) {
        json_t *a = json_array();
        for (int i = 0; a && i < N_LINES; i++)
            json_array_append_new(a, json_pack("{s:i, s:f}", "lines", lines[i], "round_trip_ns",
                                               ns[i]));
        bm_print_json(json_pack("{s:i, s:i, s:o}", "rounds", ROUNDS, "runs", RUNS,
                                "handoff", a));
        return WELD_OK;
    }
    printf("handoff between two workers (round trip, median of %d runs of %d):\n", RUNS,
           ROUNDS);
    for (int i = 0; i < N_LINES; i++)
        printf("  %2d line%s of data each way: %7.0f ns\n", lines[i], lines[i] == 1 ? " " : "s",
               ns[i]);
    return WELD_OK;
}

static int bm_check(const struct bm_opts *o)
{
    const char *what = NULL;
    struct weld_err e;
    err_clear(&e);
    if (!o->bandwidth && !o->handoff && !o->model)
        what = "-m MODEL (or --bandwidth, or --handoff) is required";
    else if (o->handoff && (o->model || o->bandwidth || o->pair))
        what = "--handoff goes alone (with --json at most)";
    else if (o->n_prompt < 1 || o->n_prompt > BENCH_MAX_TOKENS)
        what = "-p must be in [1, 1048576]";
    else if (o->n_gen < 1 || o->n_gen > BENCH_MAX_TOKENS)
        what = "-n must be in [1, 1048576]";
    else if (o->depth < 0 || o->depth > BENCH_MAX_TOKENS)
        what = "-d must be in [0, 1048576]";
    else if (o->batch < 1 || o->batch > 256)
        what = "-b must be in [1, 256]";
    else if ((uint64_t)o->batch * (uint64_t)(o->n_prompt > o->depth ? o->n_prompt : o->depth) >
             BENCH_MAX_TOKENS)
        what = "-b x max(-p, -d) must be at most 1048576";
    else if (o->reps < 1 || o->reps > BENCH_MAX_REPS)
        what = "-r must be in [1, 1000]";
    else if (o->threads < 0 || o->threads > 256)
        what = "-t must be in [0, 256]";
    else if (o->probe_size < (1u << 20) || o->probe_size > ((uint64_t)1 << 40))
        what = "--probe-size must be in [1M, 1T]";
    else if (o->block < 0 || o->block > BENCH_MAX_TOKENS)
        what = "--block must be in [1, 1048576]";
    else if (o->block && !o->pair)
        what = "--block only applies to --pair";
    else if (o->pair && o->exec.exec)
        what = "--exec does not go with --pair (each side names its executor)";
    else if (o->pair && bm_pair_parse(o->pair, &o->tuning, (struct bm_side[2]){0}, &e))
        what = e.msg;
    else if (o->pair && o->bandwidth)
        what = "--pair and --bandwidth do not go together";
    if (what)
        fprintf(stderr, "weld bench: %s (see weld bench --help)\n", what);
    return what ? 2 : 0;
}

int cmd_bench_model(int argc, char **argv)
{
    struct bm_opts o = {.n_prompt = INT_MIN, .n_gen = INT_MIN, .reps = 5, .batch = 1,
                        .probe_size = (uint64_t)2 << 30}; /* INT_MIN: not given */
    const struct cli_opt base[] = {
        {"model", 'm', OPT_STR, &o.model, "MODEL", "GGUF file or HF directory to benchmark"},
        {"n-prompt", 'p', OPT_INT, &o.n_prompt, "P", "prefill tokens (default 512)"},
        {"n-gen", 'n', OPT_INT, &o.n_gen, "N", "decode steps (default 128)"},
        {"n-depth", 'd', OPT_INT, &o.depth, "D", "tokens already in the context before pp and tg (default 0; as llama-bench -d)"},
        {"batch", 'b', OPT_INT, &o.batch, "B", "decode B sequences at once (tg counts all their tokens; default 1)"},
        {"repetitions", 'r', OPT_INT, &o.reps, "R", "repetitions; median/min/max over them (default 5)"},
        {"threads", 't', OPT_INT, &o.threads, "T", "workers (default 0: one per physical core, one for models of tiny steps)"},
        {"bandwidth", 0, OPT_FLAG, &o.bandwidth, NULL, "only run the read-bandwidth probe"},
        {"handoff", 0, OPT_FLAG, &o.handoff, NULL, "only measure how long two workers take to pass work back and forth (with 0-16 cache lines of data)"},
        {"probe-size", 0, OPT_SIZE, &o.probe_size, "S", "bytes the probe reads per pass (default 2G)"},
        {"pair", 0, OPT_STR, &o.pair, "A,B", "two sides EXEC[:THREADS][@KEY=VALUE]... (e.g. mega,ops or mega,mega@repack=0; keys as --tune's) measured interleaved in one process, in both creation orders; ratios A / B"},
        {"block", 0, OPT_INT, &o.block, "N", "--pair: decode steps per block (default: ~50 ms of A)"},
        {"json", 0, OPT_FLAG, &o.json, NULL, "print one JSON object on stdout"},
    };
    enum { N_BASE = sizeof base / sizeof base[0] };
    struct cli_opt opts[N_BASE + CLI_EXEC_N_OPTS];
    memcpy(opts, base, sizeof base);
    int n_opts = N_BASE + cli_exec_opts_table(&o.exec, opts + N_BASE);
    const char *pos[1];
    int n_pos;
    int prc = cli_parse(argc, argv, "bench -m MODEL [-p 512] [-n 128] [-d 0] [-b 1] [-r 5] [-t N] [--json]\n"
                        "       weld bench -m MODEL --pair A,B [--block N] [-p P] [-n N] [-r R] [--json]\n"
                        "       weld bench --bandwidth [-t N] [--json]\n"
                        "       weld bench --handoff [--json]\n"
                        "       weld bench throughput -m MODEL [options]  (see weld bench throughput --help)",
                        "Prefill (pp) and decode (tg) tokens/s of the CPU executor and kernels on\n"
                        "random token ids, and decode bandwidth against a read-bandwidth probe run\n"
                        "in the same invocation. With a threaded executor (--exec mega, the\n"
                        "default, or ops) also its bubble (share of worker time spent waiting)\n"
                        "and synchronizations per token during decode. With --pair, two executors\n"
                        "(e.g. mega,ops or mega:2,ref:1) on the same model, interleaved in blocks\n"
                        "of decode steps so both see the same moments of a noisy machine, -r\n"
                        "repetitions with A's runner made first and -r with B's (the order can\n"
                        "bias a few %); prints each one's tok/s and the median A / B ratio of\n"
                        "the block pairs, the two orders' medians combined so their bias cancels.",
                        opts, n_opts, pos, 0, &n_pos);
    if (prc)
        return prc == 1 ? 0 : 2;
    struct weld_err e;
    err_clear(&e);
    if (cli_exec_tuning(&o.exec, &o.tuning, &e)) {
        fprintf(stderr, "weld bench: %s\n", e.msg);
        return 2;
    }
    if ((o.p_default = o.n_prompt == INT_MIN))
        o.n_prompt = 512;
    if ((o.n_default = o.n_gen == INT_MIN))
        o.n_gen = 128;
    if (bm_check(&o))
        return 2;
    int rc = o.handoff                ? bm_run_handoff(&o, &e)
             : o.bandwidth && !o.model ? bm_run_bandwidth(&o, &e)
             : o.pair                ? bm_run_pair(&o, &e)
                                     : bm_run_model(&o, &e);
    if (rc) {
        fprintf(stderr, "weld bench: %s\n", e.msg);
        return 1;
    }
    return 0;
}
