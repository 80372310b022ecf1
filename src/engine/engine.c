/*
 * engine - requests, scheduler, forward pass, sampling (design at the top of engine.h).
 *
 * Data layout:
 *   struct engine_req   one per live request, on a doubly linked list in arrival order;
 *                       owns the struct request and an array of n struct engine_seq.
 *   struct engine_seq   sequence i of a request: its struct sched_seq while the scheduler
 *                       holds it (NULL before the fork for i > 0 and after release).
 *                       sched_seq.user points at it, which is how plan entries find their
 *                       request.
 * Scheduler ids are request ids (all n sequences of a request share one, so the
 * scheduler's log lines name the request the user knows).
 *
 * Invariants: a request is on the list until every sequence has finished (then it is freed
 * at once); a released sequence never stays in the scheduler; aborts asked for inside a
 * step (from a callback) are flagged and carried out when the step ends, so a step never
 * frees a request it is still iterating over.
 */
#include "engine/engine.h"

#include "engine/offload.h"

#include "exec/backend_tp.h"

#include "core/alloc.h"
#include "core/log.h"
#include "core/progress.h"
#include "engine/constraint.h"
#include "exec/runner.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* Tokens per step of a request that wants prompt logprobs (each is a logits row). */
#define ENGINE_PROMPT_LP_CHUNK 256

struct engine_req;

struct engine_seq {
    struct engine_req *er;
    int index;
    struct sched_seq *ss;
    int spec_k; /* its guesses per step now (0: not yet set) */
    bool forced;             /* its draft is what its grammar forces (jump-forward) */
    int forced_n, forced_ok; /* such drafted tokens verified, and taken */
};

struct engine_req {
    struct request *r;
    struct engine_seq *seqs;     /* (r->n_seqs) */
    bool forked, abort_pending, fail_pending, counted_cached;
    bool paused;                 /* engine_pause: every sequence paused in the scheduler */
    struct constraint *con;      /* its compiled grammar (a reference), or NULL */
    bool counted_con;            /* counted in engine.n_constrained */
    struct engine_req *prev, *next;
};

/* A least-squares line y ~ c0 + c1 x over decayed sums (each point's weight falls by
   SPEC_DECAY a point). */
struct fit {
    double n, x, y, xx, xy;
};

struct engine {
    struct model *own_model;
    const struct model *m;
    struct tokenizer *own_tok;
    const struct tokenizer *tok;
    struct runner *run;
    struct sched *s;
    struct sched_config sc;
    int n_vocab;
    uint64_t seed, next_id;
    struct engine_req *head, *tail;
    int n_reqs;
    struct constraints *cons;    /* compiled grammars, the vocabulary's bytes */
    int n_constrained;           /* requests on the list with a grammar */
    bool jump_forward;           /* engine_params.jump_forward */
    double forced_ok, forced_n;  /* forced tokens taken / drafted (decayed) */
    int n_paused;                /* requests on the list with paused set */
    bool in_step;
    float *logits;               /* (cap_rows, n_vocab) */
    struct logits_top *tops;     /* (cap_rows) each row's largest logits (the sampler's
                                    first pass, made by the LM head), and for rows that
                                    sample at a plain temperature its softmax statistics */
    float *chunk_stats;          /* (cap_rows, 2, logits_n_chunks(n_vocab)) their arrays */
    float *hidden;               /* (cap_hidden, dim) final hidden states (embedding steps):
                                    the logit rows', then the all_hidden entries' others */
    int cap_rows, cap_hidden;
    struct batch_seq *bseqs;     /* (cap_bseqs) */
    int cap_bseqs;
    int *row_entry;              /* (cap_bseqs) plan entry of each batch sequence */
    int *hrow0;                  /* (cap_bseqs) its first hidden row past the logit rows
                                    (entry_all_hidden: its tokens but the last) */
    int *row0;                   /* (cap_bseqs + 1) its first logits row (all_logits
                                    sequences have one per token); row0[n] = rows */
    struct kv_block_copy *copies; /* (cap_copies) */
    int cap_copies;
    size_t kv_bytes;
    struct offload *off;         /* the KV tier, or NULL */
    struct engine_stats st;      /* counters kept here; the rest filled by stats_get */
    struct spec_proposer *prop;  /* speculative decoding's proposer, or NULL: off */
    bool own_prop, spec_always;
    int spec_k; /* guesses per sequence and step at most */
    /* the step cost model: forward seconds ~ c0 + c1 * tokens, fitted to the steps run;
       the proposer's seconds per step ~ p0 + p1 * guesses asked for, fitted to the steps
       that asked it; and the guesses right / examined (decayed by SPEC_GUESS_DECAY a
       verify) */
    struct fit step_fit, prop_fit;
    struct fit prefill_fit; /* steps of >= 64 tokens only: the KV tier's compute cost */
    double spec_guess_ok, spec_guess_n;
    uint64_t spec_skipped; /* steps that did not speculate since the last probe */
    uint64_t spec_probe;   /* steps between probes now (SPEC_PROBE_MIN..MAX) */
    /* one step's questions to the proposer (spec_cap of them: max_num_seqs) */
    int spec_cap;
    struct spec_ask *spec_asks;
    struct sched_seq **spec_seqs;
    uint64_t *spec_reqs;
    int32_t *spec_out; /* (spec_cap, SPEC_MAX_TOKENS) */
};

#define SPEC_DECAY 0.97
#define SPEC_FIT_MIN 8.0 /* decayed steps before the model is trusted */
#define SPEC_GUESS_DECAY 0.99
#define SPEC_PROBE_MIN 64
#define SPEC_PROBE_MAX 4096

static void fit_add(struct fit *f, double x, double y)
{
    f->n = SPEC_DECAY * f->n + 1, f->x = SPEC_DECAY * f->x + x, f->y = SPEC_DECAY * f->y + y;
    f->xx = SPEC_DECAY * f->xx + x * x, f->xy = SPEC_DECAY * f->xy + x * y;
}

/* The fitted line's c0 + c1 x at x (c0, c1 clamped at 0; false: too few points yet). When
   every x was the same, the mean of y. */
static bool fit_at(const struct fit *f, double x, double *y)
{
    if (f->n < SPEC_FIT_MIN)
        return false;
    double mx = f->x / f->n, my = f->y / f->n, vx = f->xx / f->n - mx * mx;
    if (vx <= 1e-9) {
        *y = my;
        return true;
    }
    double c1 = (f->xy / f->n - mx * my) / vx, c0 = my - c1 * mx;
    *y = (c0 > 0 ? c0 : 0) + (c1 > 0 ? c1 : 0) * x;
    return true;
}

struct engine_params engine_params_default(void)
{
    struct engine_params p;
    memset(&p, 0, sizeof p);
    p.max_num_seqs = 64;
    p.max_num_batched_tokens = 2048;
    p.block_size = 16;
    p.kv_dtype = DT_F16;
    p.prefix_caching = true;
    p.policy = SCHED_POLICY_FCFS;
    p.jump_forward = true;
    return p;
}

int engine_parse_kv_dtype(const char *s, enum weld_dtype *out, struct weld_err *e)
{
    static const struct { const char *name; enum weld_dtype t; } names[] = {
        {"f16", DT_F16}, {"bf16", DT_BF16}, {"f32", DT_F32}, {"q8_0", DT_Q8_0}};
    for (size_t i = 0; s && i < sizeof names / sizeof names[0]; i++)
        if (!strcmp(s, names[i].name)) {
            *out = names[i].t;
            return WELD_OK;
        }
    return err_set(e, WELD_ERR_INVALID_ARG,
                   "--kv-cache-dtype '%s': expected f16, bf16, f32 or q8_0", s ? s : "");
}

static uint64_t splitmix64(uint64_t x)
{
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

/* MemAvailable from /proc/meminfo in bytes; 0 if unknown. */
static uint64_t mem_available(void)
{
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f)
        return 0;
    char line[256];
    unsigned long long kb = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1)
            break;
    fclose(f);
    return (uint64_t)kb * 1024;
}

uint64_t engine_kv_auto_bytes(uint64_t seq_bytes, int max_num_seqs, uint64_t mem_available,
                              uint64_t weight_bytes)
{
    uint64_t n = max_num_seqs > 0 ? (uint64_t)max_num_seqs : 1;
    uint64_t need = seq_bytes > UINT64_MAX / n ? UINT64_MAX : seq_bytes * n;
    uint64_t share = mem_available > weight_bytes ? (mem_available - weight_bytes) / 2
                     : mem_available ? mem_available / 4 : (1ull << 30);
    uint64_t bytes = need < share ? need : share;
    return bytes > seq_bytes ? bytes : seq_bytes;
}

/* Pool size in blocks from the params (see engine_params_default); a proposer's pool takes
   spec_bytes per block beside it and its weights spec_weights. */
static int pool_blocks(const struct engine *eng, const struct engine_params *p, size_t block_bytes,
                       size_t spec_bytes, size_t spec_weights, struct weld_err *e)
{
    int per_seq = (eng->sc.max_model_len + p->block_size - 1) / p->block_size;
    if (p->kv_blocks > 0)
        return p->kv_blocks;
    const size_t both = block_bytes + spec_bytes;
    /* several ranks: this rank holds a share of every block and of the weights */
    const double share = p->tuning.tp ? tp_group_share(p->tuning.tp, &eng->m->cfg) : 1.0;
    uint64_t bytes = p->kv_cache_memory;
    if (!bytes)
        bytes = engine_kv_auto_bytes((uint64_t)per_seq * both, p->max_num_seqs, mem_available(),
                                     (uint64_t)((double)model_weight_bytes(eng->m) * share) +
                                         spec_weights);
    uint64_t n64 = bytes / both;
    int n = spec_bytes || share < 1.0 ? (int)(n64 < INT_MAX ? n64 : INT_MAX)
                                      : backend_kv_blocks_for_bytes(&eng->m->cfg, p->kv_dtype,
                                                                    p->block_size, (size_t)bytes);
    if (n < 1)
        err_set(e, WELD_ERR_LIMIT,
                "--kv-cache-memory %llu bytes: not even one KV block (%zu bytes) fits",
                (unsigned long long)bytes, both);
    return n;
}

static int check_params(const struct engine_params *p, struct weld_err *e)
{
    if (!p->model && !p->model_path)
        return err_set(e, WELD_ERR_INVALID_ARG, "engine: no model (model_path or model)");
    if (p->max_num_seqs < 1)
        return err_set(e, WELD_ERR_INVALID_ARG, "--max-num-seqs %d: must be >= 1",
                       p->max_num_seqs);
    if (p->max_num_batched_tokens < 1)
        return err_set(e, WELD_ERR_INVALID_ARG, "--max-num-batched-tokens %d: must be >= 1",
                       p->max_num_batched_tokens);
    if (p->block_size < 1 || p->block_size > KVM_MAX_BLOCK_SIZE)
        return err_set(e, WELD_ERR_INVALID_ARG, "--block-size %d: must be in [1, %d]",
                       p->block_size, KVM_MAX_BLOCK_SIZE);
    if (p->max_model_len < 0 || p->kv_blocks < 0)
        return err_set(e, WELD_ERR_INVALID_ARG, "engine: negative max_model_len/kv_blocks");
    if (p->n_threads < 0)
        return err_set(e, WELD_ERR_INVALID_ARG, "--threads %d: must be >= 1 (0: one per "
                       "physical core)", p->n_threads);
    return WELD_OK;
}

/* A GGUF without tokenizer.ggml.model or an HF directory without tokenizer.json has no
   tokenizer: such a model serves token-id prompts only. */
static bool model_has_tokenizer(const struct model *m)
{
    if (m->source == MODEL_SRC_GGUF) {
        struct gguf_str s;
        return gguf_get_str(m->gguf, "tokenizer.ggml.model", &s, NULL) != WELD_ERR_NOT_FOUND;
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizer.json", m->dir);
    return access(path, R_OK) == 0;
}

/* Model, tokenizer and limits; the pool and runner come after. */
static int engine_open_model(struct engine *eng, const struct engine_params *p,
                             struct weld_err *e)
{
    int rc;
    if (p->model) {
        eng->m = p->model;
    } else {
        if ((rc = model_load(&eng->own_model, p->model_path, e)))
            return rc;
        eng->m = eng->own_model;
    }
    eng->tok = p->tokenizer;
    if (!eng->tok && model_has_tokenizer(eng->m)) {
        rc = eng->m->source == MODEL_SRC_GGUF ? tokenizer_load_gguf(&eng->own_tok, eng->m->gguf, e)
                                              : tokenizer_load_hf(&eng->own_tok, eng->m->dir, e);
        if (rc)
            return err_prefix(e, "%s: tokenizer", eng->m->path);
        eng->tok = eng->own_tok;
    }
    eng->n_vocab = eng->m->cfg.n_vocab;
    if ((rc = constraints_create(&eng->cons, eng->tok, eng->n_vocab, e)))
        return rc;
    eng->sc.max_model_len = p->max_model_len ? p->max_model_len : eng->m->cfg.max_ctx;
    if (eng->sc.max_model_len < 1)
        return err_set(e, WELD_ERR_INVALID_ARG, "max_model_len: %d", eng->sc.max_model_len);
    if (eng->m->cfg.max_ctx > 0 && eng->sc.max_model_len > eng->m->cfg.max_ctx)
        return err_set(e, WELD_ERR_INVALID_ARG,
                       "--max-model-len %d: longer than the model's context length %d",
                       eng->sc.max_model_len, eng->m->cfg.max_ctx);
    return WELD_OK;
}

static int engine_open_pool(struct engine *eng, const struct engine_params *p,
                            struct weld_err *e)
{
    size_t block_bytes = backend_kv_block_bytes(&eng->m->cfg, p->kv_dtype, p->block_size);
    if (!block_bytes)
        return err_set(e, WELD_ERR_UNSUPPORTED,
                       "--kv-cache-dtype %s cannot hold this model's attention heads "
                       "(head_dim %d; q8_0 needs a multiple of 32)",
                       dtype_name(p->kv_dtype), eng->m->cfg.head_dim);
    if (p->tuning.tp) /* a rank's KV heads and layers of each block (exec/backend_tp.h) */
        block_bytes = (size_t)((double)block_bytes * tp_group_share(p->tuning.tp, &eng->m->cfg) +
                               0.5);
    /* a proposer's KV pool is indexed by the same block ids: both share the budget */
    size_t spec_bytes = 0, spec_weights = 0;
    int rc;
    if (!p->proposer && p->spec.method != SPEC_NONE &&
        (rc = spec_proposer_cost(&p->spec, eng->m, p->block_size, &spec_bytes, &spec_weights, e)))
        return rc;
    int n_blocks = pool_blocks(eng, p, block_bytes, spec_bytes, spec_weights, e);
    if (n_blocks < 1)
        return WELD_ERR_LIMIT;
    eng->kv_bytes = (size_t)n_blocks * (block_bytes + spec_bytes);
    eng->sc.kv = kvm_config_default();
    eng->sc.kv.n_blocks = n_blocks;
    eng->sc.kv.block_size = p->block_size;
    eng->sc.kv.prefix_caching = p->prefix_caching;
    eng->sc.max_num_batched_tokens = p->max_num_batched_tokens;
    eng->sc.max_num_seqs = p->max_num_seqs;
    eng->sc.policy = p->policy;
    struct backend_params bp;
    backend_params_init(&bp, p->max_num_batched_tokens, eng->sc.max_model_len);
    bp.kv_block_size = p->block_size;
    bp.kv_blocks = n_blocks;
    bp.kv_type = p->kv_dtype;
    bp.kv_prefault_bytes = p->kv_prefault ? SIZE_MAX : 0;
    bp.n_threads = p->n_threads;
    bp.tuning = p->tuning;
    if ((rc = runner_create_ex(&eng->run, eng->m, &bp, e)))
        return rc;
    if (p->kv_offload_dir || p->kv_store) {
        if (p->proposer || p->spec.method != SPEC_NONE)
            return err_set(e, WELD_ERR_UNSUPPORTED,
                           "--kv-offload-dir / --kv-store cannot be combined with a draft "
                           "model or MTP speculation yet (its own KV would be missing for "
                           "loaded blocks); drop one of them (ngram speculation works)");
        if (!p->prefix_caching)
            return err_set(e, WELD_ERR_INVALID_ARG,
                           "--kv-offload-dir / --kv-store need prefix caching (blocks are "
                           "found by their prefix hash): drop --no-enable-prefix-caching");
        struct offload_params op = {.dir = p->kv_offload_dir,
                                    .dir_bytes = p->kv_offload_bytes,
                                    .store = p->kv_store,
                                    .writer_nice = p->kv_writes_urgent ? 0 : 10};
        if ((rc = offload_create(&eng->off, &op, eng->m, eng->run, p->kv_dtype, p->block_size, e)))
            return rc;
        eng->sc.kv.log_evictions = true;
        eng->sc.tier = (struct sched_tier){eng->off, offload_lookup, offload_place};
        if (!p->quiet) {
            char d[1024];
            offload_describe(eng->off, d, sizeof d);
            log_info("kv tier: %s", d);
        }
    }
    rc = sched_create(&eng->s, &eng->sc, e);
    if (rc)
        return rc;
    if (!p->quiet)
        log_info("kv cache: %d blocks x %d tokens, %s, %.1f MiB%s (%s); max_model_len %d, "
                 "max_num_seqs %d, max_num_batched_tokens %d, prefix caching %s",
                 n_blocks, p->block_size, dtype_name(p->kv_dtype),
                 (double)eng->kv_bytes / (1024.0 * 1024.0),
                 spec_bytes ? " with the proposer's" : "",
                 p->kv_blocks         ? "--kv-blocks"
                 : p->kv_cache_memory ? "--kv-cache-memory"
                                      : "automatic",
                 eng->sc.max_model_len, p->max_num_seqs, p->max_num_batched_tokens,
                 p->prefix_caching ? "on" : "off");
    return WELD_OK;
}

int engine_create(struct engine **out, const struct engine_params *p, struct weld_err *e)
{
    *out = NULL;
    int rc = check_params(p, e);
    if (rc)
        return rc;
    struct engine *eng = wcalloc(1, sizeof *eng);
    if (!eng)
        return err_set(e, WELD_ERR_NOMEM, "engine: out of memory");
    eng->seed = p->seed;
    eng->next_id = 1;
    if ((rc = engine_open_model(eng, p, e)) || (rc = engine_open_pool(eng, p, e))) {
        engine_free(eng);
        return rc;
    }
    eng->spec_always = p->spec_always;
    eng->jump_forward = p->jump_forward;
    eng->spec_probe = SPEC_PROBE_MIN;
    eng->spec_k = p->spec.num_tokens > 0 ? p->spec.num_tokens : 4;
    eng->spec_k = eng->spec_k > SPEC_MAX_TOKENS ? SPEC_MAX_TOKENS : eng->spec_k;
    if (p->proposer) {
        eng->prop = p->proposer;
    } else if (p->spec.method != SPEC_NONE) {
        struct spec_limits lim = {.target = eng->m,
                                  .max_ctx = eng->sc.max_model_len,
                                  .max_seqs = p->max_num_seqs,
                                  .kv_tokens = (int64_t)eng->sc.kv.n_blocks * eng->sc.kv.block_size,
                                  .block_size = eng->sc.kv.block_size};
        if ((rc = spec_proposer_create(&eng->prop, &p->spec, &lim, e))) {
            engine_free(eng);
            return rc;
        }
        eng->own_prop = true;
    }
    if (eng->prop && eng->prop->n_vocab && eng->prop->n_vocab != eng->n_vocab) {
        rc = err_set(e, WELD_ERR_INVALID_ARG,
                     "speculative decoding: the draft's vocabulary "
                     "has %d tokens, the model's %d: they must share one tokenizer",
                     eng->prop->n_vocab, eng->n_vocab);
        engine_free(eng);
        return rc;
    }
    if (eng->prop) {
        eng->spec_cap = p->max_num_seqs;
        eng->spec_asks = wcalloc((size_t)eng->spec_cap, sizeof *eng->spec_asks);
        eng->spec_seqs = wcalloc((size_t)eng->spec_cap, sizeof *eng->spec_seqs);
        eng->spec_reqs = wcalloc((size_t)eng->spec_cap, sizeof *eng->spec_reqs);
        eng->spec_out = wcalloc((size_t)eng->spec_cap * SPEC_MAX_TOKENS, sizeof *eng->spec_out);
        if (!eng->spec_asks || !eng->spec_seqs || !eng->spec_reqs || !eng->spec_out) {
            engine_free(eng);
            return err_set(e, WELD_ERR_NOMEM, "engine: out of memory");
        }
    }
    *out = eng;
    return WELD_OK;
}

static void req_free(struct engine *eng, struct engine_req *er)
{
    if (er->con && er->counted_con)
        eng->n_constrained--;
    eng->st.mask_count += (uint64_t)er->r->n_masks;
    eng->st.t_mask += er->r->t_masks;
    request_free(er->r);
    constraint_release(eng->cons, er->con);
    wfree(er->seqs);
    wfree(er);
}

static void req_unlink_free(struct engine *eng, struct engine_req *er)
{
    if (er->prev)
        er->prev->next = er->next;
    else
        eng->head = er->next;
    if (er->next)
        er->next->prev = er->prev;
    else
        eng->tail = er->prev;
    eng->n_reqs--;
    if (er->paused)
        eng->n_paused--;
    req_free(eng, er);
}

/* Save every block the pool holds with a known prefix to the KV tier, so a restarted
   engine finds them (at exit). */
static void save_pool(struct engine *eng)
{
    struct kvm *kvm = sched_kvm(eng->s);
    int n = kvm_hashed_blocks(kvm, NULL, 0);
    struct kvm_evicted *v = n > 0 ? wmalloc((size_t)n * sizeof *v) : NULL;
    if (!v)
        return;
    n = kvm_hashed_blocks(kvm, v, n);
    offload_apply(eng->off, kvm); /* evictions not saved yet come first */
    offload_save(eng->off, v, n);
    wfree(v);
}

void engine_free(struct engine *eng)
{
    if (!eng)
        return;
    while (eng->head) {
        struct engine_req *er = eng->head;
        for (int i = 0; i < er->r->n_seqs; i++)
            if (er->seqs[i].ss)
                sched_abort(eng->s, er->seqs[i].ss);
        req_unlink_free(eng, er);
    }
    if (eng->off && eng->s)
        save_pool(eng);
    offload_free(eng->off);
    sched_free(eng->s);
    constraints_free(eng->cons);
    if (eng->own_prop)
        spec_proposer_free(eng->prop);
    wfree(eng->spec_asks);
    wfree(eng->spec_seqs);
    wfree(eng->spec_reqs);
    wfree(eng->spec_out);
    runner_free(eng->run);
    tokenizer_free(eng->own_tok);
    model_free(eng->own_model);
    wfree(eng->logits);
    wfree(eng->tops);
    wfree(eng->chunk_stats);
    wfree(eng->hidden);
    wfree(eng->hrow0);
    wfree(eng->bseqs);
    wfree(eng->row_entry);
    wfree(eng->row0);
    wfree(eng->copies);
    wfree(eng);
}

/* A sequence leaves the scheduler (finished, or aborted: abort); the proposer forgets it. */
/* The proposer's key for a sequence: its request id and its index among the request's n
   (siblings share the scheduler id). */
_Static_assert(REQUEST_MAX_N <= 256, "spec_key packs the index in 8 bits");
static uint64_t spec_key(const struct sched_seq *ss)
{
    return ss->id << 8 | (uint64_t)((const struct engine_seq *)ss->user)->index;
}

static void seq_leave(struct engine *eng, struct sched_seq *ss, bool abort)
{
    if (eng->prop && eng->prop->forget)
        eng->prop->forget(eng->prop, spec_key(ss));
    if (abort)
        sched_abort(eng->s, ss);
    else
        sched_finish(eng->s, ss);
}

/* Release every sequence of a request still in the scheduler, finish the rest with f
   (abort / error) and free it. */
static void req_end(struct engine *eng, struct engine_req *er, enum request_finish f,
                    const char *msg)
{
    for (int i = 0; i < er->r->n_seqs; i++) {
        if (!er->seqs[i].ss)
            continue;
        seq_leave(eng, er->seqs[i].ss, f == REQUEST_FINISH_ABORT);
        er->seqs[i].ss = NULL;
    }
    request_finish_all(er->r, f, msg);
    if (f == REQUEST_FINISH_ABORT)
        eng->st.requests_aborted++;
    else
        eng->st.requests_failed++;
    req_unlink_free(eng, er);
}

static int req_build(struct engine *eng, const struct request_params *p,
                     const struct request_callbacks *cb, struct engine_req **out,
                     struct weld_err *e)
{
    int32_t *ids = NULL;
    int n_ids = 0, rc;
    *out = NULL;
    if ((rc = request_params_check(p, eng->n_vocab, e)) ||
        (rc = request_encode_prompt(eng->tok, p, &ids, &n_ids, e)))
        return rc;
    struct engine_req *er = wcalloc(1, sizeof *er);
    if (!er || !(er->seqs = wcalloc((size_t)p->n, sizeof *er->seqs))) {
        wfree(er);
        wfree(ids);
        return err_set(e, WELD_ERR_NOMEM, "engine: out of memory");
    }
    struct request_params q = *p;
    uint64_t id = eng->next_id;
    if (!q.has_seed)
        q.sampling.seed = splitmix64(eng->seed ^ splitmix64(id));
    rc = request_create(&er->r, id, &q, ids, n_ids, eng->tok, eng->n_vocab, cb, e);
    wfree(ids);
    if (rc) {
        wfree(er->seqs);
        wfree(er);
        return rc;
    }
    const struct gvocab *gv;
    if (p->grammar && ((rc = constraint_get(eng->cons, p->grammar, &er->con, &gv, e)) ||
                       (rc = request_constrain(er->r, constraint_space(er->con), gv, e)))) {
        req_free(eng, er);
        return rc;
    }
    for (int i = 0; i < p->n; i++) {
        er->seqs[i].er = er;
        er->seqs[i].index = i;
    }
    *out = er;
    return WELD_OK;
}

/* The request needs a row (logits, hidden state) for every prompt position. */
static bool req_every_row(const struct request *r)
{
    return r->p.prompt_logprobs >= 0 ||
           (r->p.kind == REQUEST_KIND_EMBED && r->p.pooling == REQUEST_POOLING_MEAN);
}

int engine_add_request(struct engine *eng, const struct request_params *p,
                       const struct request_callbacks *cb, uint64_t *id, struct weld_err *e)
{
    struct engine_req *er;
    if (p->kv_save && !eng->off) {
        eng->st.requests_rejected++;
        return err_set(e, WELD_ERR_INVALID_ARG,
                       "kv_transfer_params.do_remote_decode: this engine has no KV tier to "
                       "save the prompt's blocks to (start it with --kv-store or "
                       "--kv-offload-dir)");
    }
    int rc = req_build(eng, p, cb, &er, e);
    if (rc) {
        eng->st.requests_rejected++;
        return rc;
    }
    struct request *r = er->r;
    struct sched_seq_params sp = {
        .id = r->id,
        .user = &er->seqs[0],
        .priority = p->priority,
        .tokens = r->prompt,
        .n_tokens = r->n_prompt,
        .cache_salt = r->p.cache_salt,
        .cache_salt_len = r->p.cache_salt ? strlen(r->p.cache_salt) : 0,
        /* prompt logprobs and mean pooling need every prompt position's row: no cached
           prefix, and chunks that bound the rows one sequence takes */
        .no_prefix_hit = req_every_row(r),
        .max_chunk = req_every_row(r) ? ENGINE_PROMPT_LP_CHUNK : 0,
    };
    if ((rc = sched_add(eng->s, &sp, &er->seqs[0].ss, e))) {
        eng->st.requests_rejected++;
        req_free(eng, er);
        return rc;
    }
    eng->next_id++;
    if (er->con)
        er->counted_con = true, eng->n_constrained++;
    er->prev = eng->tail;
    if (eng->tail)
        eng->tail->next = er;
    else
        eng->head = er;
    eng->tail = er;
    eng->n_reqs++;
    eng->st.requests_added++;
    eng->st.prompt_tokens += (uint64_t)r->n_prompt;
    if (id)
        *id = r->id;
    return WELD_OK;
}

static struct engine_req *req_find(const struct engine *eng, uint64_t id)
{
    for (struct engine_req *er = eng->head; er; er = er->next)
        if (er->r->id == id)
            return er;
    return NULL;
}

int engine_abort(struct engine *eng, uint64_t id, struct weld_err *e)
{
    struct engine_req *er = req_find(eng, id);
    if (!er || er->abort_pending)
        return err_set(e, WELD_ERR_NOT_FOUND, "abort: no running request %llu",
                       (unsigned long long)id);
    if (eng->in_step)
        er->abort_pending = true;
    else
        req_end(eng, er, REQUEST_FINISH_ABORT, NULL);
    return WELD_OK;
}

static int req_set_paused(struct engine *eng, uint64_t id, bool paused, struct weld_err *e)
{
    struct engine_req *er = req_find(eng, id);
    if (!er || er->abort_pending)
        return err_set(e, WELD_ERR_NOT_FOUND, "%s: no running request %llu",
                       paused ? "pause" : "resume", (unsigned long long)id);
    if (er->paused == paused)
        return WELD_OK;
    er->paused = paused;
    eng->n_paused += paused ? 1 : -1;
    for (int i = 0; i < er->r->n_seqs; i++)
        if (er->seqs[i].ss)
            sched_pause(eng->s, er->seqs[i].ss, paused);
    return WELD_OK;
}

int engine_pause(struct engine *eng, uint64_t id, struct weld_err *e)
{
    return req_set_paused(eng, id, true, e);
}

int engine_resume(struct engine *eng, uint64_t id, struct weld_err *e)
{
    return req_set_paused(eng, id, false, e);
}

bool engine_has_work(const struct engine *eng) { return eng->n_reqs > eng->n_paused; }
const struct model *engine_model(const struct engine *eng) { return eng->m; }
const struct tokenizer *engine_tokenizer(const struct engine *eng) { return eng->tok; }
const struct sched_config *engine_sched_config(const struct engine *eng) { return &eng->sc; }

/* Grow the step buffers for n entries, n_rows logits rows and n_copies copies. */
static bool step_buffers(struct engine *eng, int n, int n_rows, int n_hidden, int n_copies)
{
    if (n > eng->cap_bseqs) {
        struct batch_seq *b = wrealloc(eng->bseqs, (size_t)n * sizeof *b);
        if (b)
            eng->bseqs = b;
        int *re = wrealloc(eng->row_entry, (size_t)n * sizeof *re);
        if (re)
            eng->row_entry = re;
        int *r0 = wrealloc(eng->row0, ((size_t)n + 1) * sizeof *r0);
        if (r0)
            eng->row0 = r0;
        int *h0 = wrealloc(eng->hrow0, (size_t)n * sizeof *h0);
        if (h0)
            eng->hrow0 = h0;
        if (!b || !re || !r0 || !h0)
            return false;
        eng->cap_bseqs = n;
    }
    if (n_hidden > eng->cap_hidden) {
        float *h = wrealloc(eng->hidden, (size_t)n_hidden * (size_t)eng->m->cfg.dim * sizeof *h);
        if (!h)
            return false;
        eng->hidden = h;
        eng->cap_hidden = n_hidden;
    }
    if (n_rows > eng->cap_rows) {
        n = n_rows;
        float *l = wrealloc(eng->logits, (size_t)n * (size_t)eng->n_vocab * sizeof *l);
        if (l)
            eng->logits = l;
        struct logits_top *tp = wrealloc(eng->tops, (size_t)n * sizeof *tp);
        if (tp)
            eng->tops = tp;
        float *cs = wrealloc(eng->chunk_stats, (size_t)n * 2 *
                             (size_t)logits_n_chunks(eng->n_vocab) * sizeof *cs);
        if (cs)
            eng->chunk_stats = cs;
        if (!l || !tp || !cs)
            return false;
        eng->cap_rows = n;
    }
    if (n_copies > eng->cap_copies) {
        struct kv_block_copy *c = wrealloc(eng->copies, (size_t)n_copies * sizeof *c);
        if (!c)
            return false;
        eng->copies = c;
        eng->cap_copies = n_copies;
    }
    return true;
}

/* A chunk of the prompt of a request that needs every row (req_every_row): a row per token. */
static bool entry_all_logits(const struct sched_entry *en)
{
    const struct request *rq = ((const struct engine_seq *)en->seq->user)->er->r;
    return en->n_draft > 0 ||
           (rq->p.prompt_logprobs >= 0 && en->n_tokens > 1 && en->first < rq->n_prompt);
}

/* The step returns the final hidden state of each of this entry's tokens (a mean-pooled
   embedding's prompt), its logits only for the last. */
static bool entry_all_hidden(const struct sched_entry *en)
{
    const struct request *rq = ((const struct engine_seq *)en->seq->user)->er->r;
    return rq->p.kind == REQUEST_KIND_EMBED && rq->p.pooling == REQUEST_POOLING_MEAN &&
           en->n_tokens > 1 && en->first < rq->n_prompt;
}

/* The proposer reads the target's hidden states (spec.h observe) and may be asked about
   this entry's sequence: every token's row goes to it after the step. */
static bool entry_observed(const struct engine *eng, const struct sched_entry *en)
{
    const struct request *rq = ((const struct engine_seq *)en->seq->user)->er->r;
    return eng->prop && eng->prop->observe && rq->p.kind != REQUEST_KIND_EMBED &&
           rq->p.prompt_logprobs < 0;
}

/* Hidden rows past the logit rows this entry's step gives (batch_n_hidden_rows). */
static int entry_extra_hidden(const struct engine *eng, const struct sched_entry *en)
{
    return (entry_all_hidden(en) || entry_observed(eng, en)) && !entry_all_logits(en)
               ? en->n_tokens - 1
               : 0;
}

/* The step must return hidden states for this entry: an embedding's last step, or any
   prompt step of a mean-pooled one. */
static bool entry_hidden(const struct sched_entry *en)
{
    const struct request *rq = ((const struct engine_seq *)en->seq->user)->er->r;
    return rq->p.kind == REQUEST_KIND_EMBED &&
           (en->sample || rq->p.pooling == REQUEST_POOLING_MEAN);
}

/* The plan as a batch: the live entries in order, batch sequence j's logits rows from
   row0[j] (one per token for entry_all_logits, else one: its last token). *hidden: some
   entry needs hidden states (entry_hidden). */
static int plan_to_batch(struct engine *eng, const struct sched_plan *pl, struct batch *b,
                         bool *hidden, struct weld_err *e)
{
    int n_rows = 0, n_extra = 0;
    *hidden = false;
    for (int k = 0; k < pl->n_entries; k++) {
        const struct sched_entry *en = &pl->entries[k];
        if (!en->seq)
            continue;
        n_rows += entry_all_logits(en) ? en->n_tokens : 1;
        n_extra += entry_extra_hidden(eng, en);
        *hidden |= entry_hidden(en) || entry_observed(eng, en);
    }
    if (!step_buffers(eng, pl->n_entries, n_rows, n_rows + n_extra, pl->n_copies))
        return err_set(e, WELD_ERR_NOMEM, "engine: out of memory for a step of %d entries "
                       "(%d logits rows)", pl->n_entries, n_rows);
    int n = 0, row = 0, hrow = 0;
    for (int k = 0; k < pl->n_entries; k++) {
        const struct sched_entry *en = &pl->entries[k];
        if (!en->seq)
            continue;
        struct engine_seq *es = en->seq->user;
        if (es->er->r->t_scheduled == 0)
            es->er->r->t_scheduled = time_now();
        /* a row that samples at a plain temperature asks the LM head for the weights'
           statistics (sampler.h's temperature path), one that reports logprobs for those
           of the raw row (inv_t 1: its normalizer; the sampler makes its own if it draws
           at another temperature, a fraction of the cost) */
        const size_t nch = (size_t)logits_n_chunks(eng->n_vocab);
        const struct request *rq = es->er->r;
        const bool all = entry_all_logits(en);
        const int rows = all ? en->n_tokens : 1;
        for (int i = 0; i < rows; i++) {
            struct logits_top *t = &eng->tops[row + i];
            t->inv_t = !en->sample || (i < rows - 1 && !en->n_draft) ? 0.0f
                       : rq->p.logprobs >= 0                         ? 1.0f
                                             : sampler_stats_inv_t(&rq->p.sampling, eng->n_vocab);
            t->chunk_max = eng->chunk_stats + (size_t)(row + i) * 2 * nch;
            t->chunk_sum = t->chunk_max + nch;
        }
        eng->row_entry[n] = k;
        eng->row0[n] = row;
        eng->hrow0[n] = hrow;
        row += rows;
        hrow += entry_extra_hidden(eng, en);
        eng->bseqs[n++] = (struct batch_seq){
            .seq_id = k,
            .tokens = en->seq->tokens + en->first,
            .n_tokens = en->n_tokens,
            .pos = en->first,
            .all_logits = all,
            .blocks = en->blocks,
            .n_blocks = en->n_blocks,
            .all_hidden = entry_all_hidden(en) || entry_observed(eng, en),
        };
    }
    eng->row0[n] = row;
    for (int c = 0; c < pl->n_copies; c++)
        eng->copies[c] = (struct kv_block_copy){pl->copies[c].src, pl->copies[c].dst};
    *b = (struct batch){.seqs = eng->bseqs, .n_seqs = n,
                        .copies = pl->n_copies ? eng->copies : NULL,
                        .n_copies = pl->n_copies};
    return WELD_OK;
}

/* Sequence i of er samples its next token from row. Returns true with the token in *tok
   when the sequence goes on (the caller hands the token to the scheduler); false when it
   finished (released, and er too once its last sequence is done) or its request ended
   with an error: er may be gone then. */
static bool seq_take(struct engine *eng, struct engine_req *er, int i, const float *row,
                     const struct logits_top *top, int32_t *tok)
{
    struct request *r = er->r;
    struct sched_seq *ss = er->seqs[i].ss;
    struct weld_err e;
    bool fin;
    bool at_limit = ss->n_tokens + 1 >= eng->sc.max_model_len;
    if (request_seq_step(r, i, row, top, at_limit, &fin, &e) != WELD_OK) {
        log_warn("request %llu: %s", (unsigned long long)r->id, e.msg);
        req_end(eng, er, REQUEST_FINISH_ERROR, e.msg);
        return false;
    }
    eng->st.generated_tokens++;
    if (fin) {
        seq_leave(eng, ss, false);
        er->seqs[i].ss = NULL;
        if (request_done(r)) {
            eng->st.requests_finished++;
            req_unlink_free(eng, er);
        }
        return false;
    }
    *tok = request_seq_last_token(r, i);
    return true;
}

/* A scheduler call about er's sequence failed: the request ends with the error. */
static void seq_failed(struct engine *eng, struct engine_req *er, const struct weld_err *e)
{
    log_warn("request %llu: %s", (unsigned long long)er->r->id, e->msg);
    req_end(eng, er, REQUEST_FINISH_ERROR, e->msg);
}

/* Sequence i of er samples from row; the token is appended or the sequence released. */
static void seq_sample(struct engine *eng, struct engine_req *er, int i, const float *row,
                       const struct logits_top *top)
{
    int32_t tok;
    struct weld_err e;
    if (seq_take(eng, er, i, row, top, &tok) &&
        sched_append_token(eng->s, er->seqs[i].ss, tok, &e) != WELD_OK)
        seq_failed(eng, er, &e);
}

/* A speculative entry (sched.h): its rows sampled in order from row r0, each token taken as
   a decode would take it (one sampler draw, the request's state advanced), then kept as
   computed when it equals the next draft, else appended as the next token to compute (the
   rest of the draft is dropped). So the tokens are those of decoding one at a time. */
static void entry_verify(struct engine *eng, struct engine_seq *es, const struct sched_entry *en,
                         int r0)
{
    struct engine_req *er = es->er;
    const int i = es->index;
    const size_t V = (size_t)eng->n_vocab;
    const bool forced = es->forced;
    es->forced = false;
    if (forced) {
        eng->st.forced_draft_tokens += (uint64_t)en->n_draft;
        es->forced_n += en->n_draft;
        eng->forced_ok *= SPEC_GUESS_DECAY;
        eng->forced_n = eng->forced_n * SPEC_GUESS_DECAY + en->n_draft;
    } else {
        eng->st.spec_drafts++;
        eng->st.spec_draft_tokens += (uint64_t)en->n_draft;
    }
    int taken = 0; /* guesses accepted in this entry */
    if (!es->spec_k)
        es->spec_k = eng->spec_k;
    for (int j = 0; j <= en->n_draft; j++) {
        int32_t tok;
        struct weld_err e;
        if (!seq_take(eng, er, i, eng->logits + (size_t)(r0 + j) * V, &eng->tops[r0 + j], &tok))
            return;
        struct sched_seq *ss = er->seqs[i].ss;
        int rc;
        if (j < en->n_draft && !forced)
            eng->spec_guess_n += 1;
        if (j < en->n_draft && ss->n_draft > 0 && tok == ss->tokens[ss->n_tokens]) {
            if (forced) {
                eng->st.forced_accepted_tokens++;
                es->forced_ok++;
                eng->forced_ok += 1;
            } else {
                eng->spec_guess_ok += 1;
                eng->st.spec_accepted_tokens++;
                eng->st.spec_accepted_at[j]++;
            }
            taken++;
            rc = sched_accept_draft(eng->s, ss, 1, &e);
            if (rc == WELD_OK)
                continue;
        } else {
            rc = sched_append_token(eng->s, ss, tok, &e);
            /* all taken: one more next time; else as many as were right, plus one */
            if (!forced) {
                es->spec_k = taken == en->n_draft ? es->spec_k + 1 : taken + 1;
                es->spec_k = es->spec_k > eng->spec_k ? eng->spec_k : es->spec_k;
                eng->spec_guess_ok *= SPEC_GUESS_DECAY, eng->spec_guess_n *= SPEC_GUESS_DECAY;
            }
        }
        if (rc != WELD_OK)
            seq_failed(eng, er, &e);
        return;
    }
}

/* The guesses per sequence that pay best in this step (0: none do), from the fitted step
   cost (c0 + c1 * tokens), the proposer's fitted cost P (per guess slot asked) and the rate
   r at which guesses were right (each given the ones before it): B sequences guessing k
   each take c0 + c1 B (1 + k) + P(B k) for B (1 + r + r^2 + ... + r^k) tokens, against
   c0 + c1 B for B. A memory-bound step (c1 small beside c0) pays at a modest r; once the
   batch makes the step compute-bound (vLLM's disable_by_batch_size, here measured) it
   does not, nor does a draft nearly as slow as the target. */
static int best_k(struct engine *eng, int b, int kmax, double r, bool prop_cost)
{
    const struct fit *f = &eng->step_fit;
    if (f->n < SPEC_FIT_MIN || b < 1)
        return kmax;
    double mx = f->x / f->n, my = f->y / f->n, vx = f->xx / f->n - mx * mx;
    if (vx <= 1e-9) /* every step the same size (one sequence always guessing): a plain
                       step now and then gives the fit a second size */
        return eng->st.steps % 16 ? kmax : 0;
    double c1 = (f->xy / f->n - mx * my) / vx, c0 = my - c1 * mx;
    c1 = c1 > 0 ? c1 : 0, c0 = c0 > 0 ? c0 : 0;
    double best_rate = b / (c0 + c1 * b), a = 0, rk = 1;
    int best = 0;
    for (int k = 1; k <= kmax; k++) {
        rk *= r, a += rk;
        double prop = 0; /* what asking for b * k guesses costs (0 until measured) */
        if (!prop_cost || !fit_at(&eng->prop_fit, (double)b * k, &prop))
            prop = 0;
        double rate = b * (1.0 + a) / (c0 + c1 * b * (1.0 + k) + prop);
        if (rate > best_rate)
            best_rate = rate, best = k;
    }
    return best;
}

static int spec_best_k(struct engine *eng, int b)
{
    const double r = eng->spec_guess_n > 0 ? eng->spec_guess_ok / eng->spec_guess_n : 0.5;
    return best_k(eng, b, eng->spec_k, r, true);
}

/* Jump-forward: before a step, each decoding sequence of a constrained request that has no
   draft gets, as one, the text its grammar forces next (request_seq_forced: the longest
   tokens that spell it). The step verifies them like any guesses, so the output is the
   same token for token; a model that writes the forced text as those tokens takes several
   tokens in one step. The step-cost model decides how many pay at this batch size and at
   the rate forced tokens have been taken (spec_best_k's reckoning, with no proposer
   cost); a sequence whose forced drafts were mostly refused (fewer than half taken after
   16) gets no more. */
static void forced_propose(struct engine *eng)
{
    int b = 0;
    for (struct engine_req *er = eng->head; er; er = er->next)
        for (int i = 0; i < er->r->n_seqs; i++)
            b += er->seqs[i].ss && er->seqs[i].ss->state == SCHED_RUNNING &&
                 er->seqs[i].ss->n_computed == er->seqs[i].ss->n_tokens - 1;
    if (eng->step_fit.n < SPEC_FIT_MIN && b > 8)
        return; /* until the step cost is known, only where a step is surely memory-bound */
    const double rate = eng->forced_n > 0 ? eng->forced_ok / eng->forced_n : 0.5;
    const int kstep = best_k(eng, b, SPEC_MAX_TOKENS, rate, false);
    if (!kstep)
        return;
    for (struct engine_req *er = eng->head; er; er = er->next) {
        struct request *r = er->r;
        if (!er->con || er->paused || er->abort_pending || r->p.prompt_logprobs >= 0)
            continue;
        for (int i = 0; i < r->n_seqs; i++) {
            struct engine_seq *es = &er->seqs[i];
            struct sched_seq *ss = es->ss;
            if (!ss || ss->state != SCHED_RUNNING || ss->n_computed != ss->n_tokens - 1 ||
                ss->n_draft > 0 || (es->forced_n >= 16 && 2 * es->forced_ok < es->forced_n))
                continue;
            int k = kstep;
            if (r->p.max_tokens > 0) {
                int left = r->p.max_tokens - (ss->n_tokens - ss->n_prompt) - 1;
                k = k < left ? k : left;
            }
            int32_t out[SPEC_MAX_TOKENS];
            int n = k > 0 ? request_seq_forced(r, i, out, k) : 0;
            struct weld_err e;
            if (n > 0 && sched_set_draft(eng->s, ss, out, n, &e) == WELD_OK)
                es->forced = true;
        }
    }
}

/* Before a step: each decoding sequence of a generate request gets the proposer's guesses
   (at most its own k and the step's best, and no more than its max_tokens leaves room for
   after the token the step samples anyway). Not for embeddings or prompt-logprob
   requests. */
static void spec_propose(struct engine *eng)
{
    int b = 0;
    for (struct engine_req *er = eng->head; er; er = er->next)
        for (int i = 0; i < er->r->n_seqs; i++)
            b += er->seqs[i].ss && er->seqs[i].ss->state == SCHED_RUNNING &&
                 er->seqs[i].ss->n_computed == er->seqs[i].ss->n_tokens - 1;
    int kstep = eng->spec_always ? eng->spec_k : spec_best_k(eng, b);
    if (!kstep) {
        /* now and then guess anyway, so the acceptance keeps being measured: after 64
           steps that did not, then twice as many after each probe that did not change
           the answer (a draft model catches up on every token it missed, at a cost) */
        if (++eng->spec_skipped < eng->spec_probe)
            return;
        eng->spec_skipped = 0;
        eng->spec_probe = eng->spec_probe < SPEC_PROBE_MAX ? 2 * eng->spec_probe : SPEC_PROBE_MAX;
        kstep = eng->spec_k;
    } else {
        eng->spec_probe = SPEC_PROBE_MIN;
    }
    /* the questions: every running sequence about to decode, with room for guesses */
    int n = 0;
    for (struct engine_req *er = eng->head; er; er = er->next) {
        const struct request *r = er->r;
        if (r->p.kind == REQUEST_KIND_EMBED || r->p.prompt_logprobs >= 0 || er->paused ||
            er->abort_pending)
            continue;
        for (int i = 0; i < r->n_seqs; i++) {
            struct sched_seq *ss = er->seqs[i].ss;
            if (!ss || ss->state != SCHED_RUNNING || ss->n_computed != ss->n_tokens - 1)
                continue;
            int k = er->seqs[i].spec_k ? er->seqs[i].spec_k : eng->spec_k;
            k = k < kstep ? k : kstep;
            if (r->p.max_tokens > 0) {
                int left = r->p.max_tokens - (ss->n_tokens - ss->n_prompt) - 1;
                k = k < left ? k : left;
            }
            if (k < 1 || n >= eng->spec_cap)
                continue;
            eng->spec_asks[n] = (struct spec_ask){.seq_key = spec_key(ss),
                                                  .tokens = ss->tokens,
                                                  .n = ss->n_tokens,
                                                  .max_k = k,
                                                  .out = eng->spec_out +
                                                         (size_t)n * SPEC_MAX_TOKENS,
                                                  .blocks = ss->table.blocks,
                                                  .n_blocks = ss->table.n_blocks};
            eng->spec_seqs[n] = ss;
            eng->spec_reqs[n++] = r->id;
        }
    }
    if (!n)
        return;
    if (eng->prop->runs_model)
        runner_park(eng->run); /* the draft runs on these cores now */
    double t0 = time_now();
    if (eng->prop->propose_batch) {
        eng->prop->propose_batch(eng->prop, eng->spec_asks, n);
    } else {
        for (int j = 0; j < n; j++) {
            struct spec_ask *q = &eng->spec_asks[j];
            q->n_out = eng->prop->propose(eng->prop, q->seq_key, q->tokens, q->n, q->max_k, q->out);
        }
    }
    int slots = 0;
    for (int j = 0; j < n; j++)
        slots += eng->spec_asks[j].max_k;
    double dt = time_now() - t0;
    fit_add(&eng->prop_fit, slots, dt);
    eng->st.t_propose += dt;
    eng->st.spec_asked += (uint64_t)slots;
    for (int j = 0; j < n; j++) {
        const struct spec_ask *q = &eng->spec_asks[j];
        int got = q->n_out < 0 ? 0 : q->n_out > q->max_k ? q->max_k : q->n_out;
        struct weld_err e;
        if (sched_set_draft(eng->s, eng->spec_seqs[j], q->out, got, &e) != WELD_OK)
            log_warn("request %llu: %s", (unsigned long long)eng->spec_reqs[j], e.msg);
    }
}


/* An entry that reached the end of its tokens: an embedding (hidden: its final hidden
   state) or a prompt-only request finishes; else fork (n > 1, first time), then sample. */
/* A prefill worker's request (kv_save) has its prompt computed: its full blocks are copied
   out of the pool into the KV tier's write queue now, under their prefix hashes, and the
   request's result carries the ticket its answer waits on (engine_tier_wait) until they
   are written, so a decode worker that gets the request next finds them. The engine goes
   on with its next step meanwhile. */
static void kv_handoff(struct engine *eng, const struct sched_seq *ss, struct request *r)
{
    const int bs = eng->sc.kv.block_size;
    int n = (ss->n_computed < ss->n_prompt ? ss->n_computed : ss->n_prompt) / bs;
    if (n > ss->table.n_blocks)
        n = ss->table.n_blocks;
    struct kvm_hash *h = n > 0 ? wmalloc((size_t)n * sizeof *h) : NULL;
    struct kvm_evicted *v = n > 0 ? wmalloc((size_t)n * sizeof *v) : NULL;
    if (h && v) {
        kvm_prefix_hashes(&ss->table, ss->tokens, bs, n, h);
        for (int i = 0; i < n; i++)
            v[i] = (struct kvm_evicted){ss->table.blocks[i], h[i]};
        kvm_mark_in_tier(sched_kvm(eng->s), ss->table.blocks, n);
        double t0 = time_now();
        r->kv_ticket = offload_save_async(eng->off, v, n);
        eng->st.kv_handoff_seconds += time_now() - t0;
        eng->st.kv_handoffs++;
        eng->st.kv_handoff_tokens += (uint64_t)n * (uint64_t)bs;
        r->n_kv_saved = n * bs;
        r->kv_saved_hash[0] = h[n - 1].lo;
        r->kv_saved_hash[1] = h[n - 1].hi;
    }
    wfree(h);
    wfree(v);
}

static void entry_sample(struct engine *eng, struct engine_seq *es, const float *row,
                         const struct logits_top *top, const float *hidden)
{
    struct engine_req *er = es->er;
    struct request *r = er->r;
    if (es->index == 0 && !er->counted_cached) {
        er->counted_cached = true;
        r->n_cached = es->ss->n_cached;
        r->n_tier = es->ss->n_tier_cached;
        eng->st.cached_tokens += (uint64_t)r->n_cached;
        if (r->p.kv_save && eng->off)
            kv_handoff(eng, es->ss, r);
        if (r->p.kv_remote_tokens >= 0) {
            eng->st.kv_remote_prefills++;
            eng->st.kv_remote_tokens += (uint64_t)r->p.kv_remote_tokens;
            eng->st.kv_remote_loaded_tokens += (uint64_t)r->n_tier;
        }
    }
    if (r->p.kind == REQUEST_KIND_EMBED || (r->p.max_tokens == 0 && !er->forked)) {
        struct weld_err e;
        if (r->p.kind == REQUEST_KIND_EMBED) {
            if (request_embed_done(r, hidden, eng->m->cfg.dim, &e) != WELD_OK) {
                req_end(eng, er, REQUEST_FINISH_ERROR, e.msg);
                return;
            }
        } else {
            request_finish_prompt_only(r);
        }
        for (int i = 0; i < r->n_seqs; i++)
            if (er->seqs[i].ss) {
                seq_leave(eng, er->seqs[i].ss, false);
                er->seqs[i].ss = NULL;
            }
        eng->st.requests_finished++;
        req_unlink_free(eng, er);
        return;
    }
    if (es->index != 0 || er->forked || r->n_seqs == 1) {
        seq_sample(eng, er, es->index, row, top);
        return;
    }
    er->forked = true;
    for (int i = 1; i < r->n_seqs; i++) {
        struct weld_err e;
        if (sched_fork(eng->s, es->ss, r->id, &er->seqs[i], &er->seqs[i].ss, &e) != WELD_OK) {
            req_end(eng, er, REQUEST_FINISH_ERROR, e.msg);
            return;
        }
        if (eng->prop && eng->prop->fork)
            eng->prop->fork(eng->prop, spec_key(es->ss), spec_key(er->seqs[i].ss));
        if (er->paused)
            sched_pause(eng->s, er->seqs[i].ss, true);
    }
    /* each sample may finish (and free) the request: stop when it is gone */
    uint64_t id = r->id;
    for (int i = 0; i < r->n_seqs; i++) {
        bool last = i == r->n_seqs - 1;
        seq_sample(eng, er, i, row, top);
        if (last || !req_find(eng, id))
            return;
    }
}

/* Finish the requests of sequences the scheduler gave up on (they can never fit). Two
   passes: ending one request may free another failed sequence of the same request. */
static void plan_failed(struct engine *eng, const struct sched_plan *pl)
{
    if (!pl->n_failed)
        return;
    char msg[256];
    snprintf(msg, sizeof msg,
             "sequence of %d tokens cannot fit in the KV pool (%d blocks of %d tokens) even "
             "alone", pl->failed[0]->n_tokens, eng->sc.kv.n_blocks, eng->sc.kv.block_size);
    for (int k = 0; k < pl->n_failed; k++)
        ((struct engine_seq *)pl->failed[k]->user)->er->fail_pending = true;
    struct engine_req *er = eng->head;
    while (er) {
        struct engine_req *next = er->next;
        if (er->fail_pending)
            req_end(eng, er, REQUEST_FINISH_ERROR, msg);
        er = next;
    }
}

static void step_aborts(struct engine *eng)
{
    struct engine_req *er = eng->head;
    while (er) {
        struct engine_req *next = er->next;
        if (er->abort_pending)
            req_end(eng, er, REQUEST_FINISH_ABORT, NULL);
        er = next;
    }
}

/* The forward pass failed: every request with a sequence in the step ends with "error". */
static void step_fail(struct engine *eng, const struct sched_plan *pl, const char *msg)
{
    for (int k = 0; k < pl->n_entries; k++)
        if (pl->entries[k].seq) {
            struct engine_seq *es = pl->entries[k].seq->user;
            req_end(eng, es->er, REQUEST_FINISH_ERROR, msg);
        }
}

static int step_run(struct engine *eng, struct sched_plan *pl, struct weld_err *e)
{
    plan_failed(eng, pl);
    struct batch b;
    bool hidden = false;
    int rc = plan_to_batch(eng, pl, &b, &hidden, e);
    if (rc == WELD_OK && b.n_seqs > 0) {
        double t0 = time_now();
        rc = runner_forward_hidden(eng->run, &b, eng->logits, eng->tops,
                                   hidden ? eng->hidden : NULL, e);
        double dt = time_now() - t0, x = pl->n_tokens;
        eng->st.t_forward += dt;
        fit_add(&eng->step_fit, x, dt);
        if (x >= 64) /* prefill-sized steps: what computing a prompt's blocks costs */
            fit_add(&eng->prefill_fit, x, dt);
    }
    if (rc) {
        /* Nothing of this plan was computed: keep its blocks out of the prefix cache. */
        sched_step_cancel(eng->s);
        step_fail(eng, pl, e->msg);
        return rc;
    }
    if ((rc = sched_step_done(eng->s, e)))
        return rc;
    eng->st.steps++;
    eng->st.computed_tokens += (uint64_t)pl->n_tokens;
    const size_t V = (size_t)eng->n_vocab, D = (size_t)eng->m->cfg.dim;
    for (int j = 0; j < b.n_seqs; j++) {
        const struct sched_entry *en = &pl->entries[eng->row_entry[j]];
        if (!en->seq)
            continue;
        struct engine_seq *es = en->seq->user;
        const int r0 = eng->row0[j], last = eng->row0[j + 1] - 1;
        if (es->er->r->p.prompt_logprobs >= 0 && es->index == 0)
            request_prompt_logprobs(es->er->r, en->first, eng->logits + (size_t)r0 * V,
                                    last - r0 + 1);
        struct weld_err re;
        if (es->er->r->p.kind == REQUEST_KIND_EMBED &&
            es->er->r->p.pooling == REQUEST_POOLING_MEAN) {
            /* the entry's tokens but the last past the logit rows, then its logit row */
            const int n_before = entry_all_hidden(en) ? en->n_tokens - 1 : 0;
            const float *hx = eng->hidden + (size_t)(eng->row0[b.n_seqs] + eng->hrow0[j]) * D;
            if (request_embed_rows(es->er->r, en->first, hx, n_before, (int)D, &re) ||
                request_embed_rows(es->er->r, en->first + n_before, eng->hidden + (size_t)last * D,
                                   1, (int)D, &re)) {
                req_end(eng, es->er, REQUEST_FINISH_ERROR, re.msg);
                continue;
            }
        }
        if (entry_observed(eng, en)) {
            /* the rows in position order: those past the logit rows, then the logit rows */
            const int n_before = entry_extra_hidden(eng, en);
            const float *hx = eng->hidden + (size_t)(eng->row0[b.n_seqs] + eng->hrow0[j]) * D;
            if (n_before)
                eng->prop->observe(eng->prop, spec_key(en->seq), en->first, n_before,
                                   en->seq->tokens, hx);
            eng->prop->observe(eng->prop, spec_key(en->seq), en->first + n_before,
                               en->n_tokens - n_before, en->seq->tokens,
                               eng->hidden + (size_t)r0 * D);
        }
        if (en->n_draft > 0)
            entry_verify(eng, es, en, r0);
        else if (en->sample)
            entry_sample(eng, es, eng->logits + (size_t)last * V, &eng->tops[last],
                         eng->hidden + (size_t)last * D);
    }
    return WELD_OK;
}

int engine_step(struct engine *eng, struct weld_err *e)
{
    if (!engine_has_work(eng))
        return WELD_OK;
    struct sched_plan pl;
    if (eng->prop)
        spec_propose(eng);
    if (eng->n_constrained && eng->jump_forward)
        forced_propose(eng);
    int rc = sched_step(eng->s, &pl, e);
    if (rc)
        return rc;
    if (eng->off) {
        /* evicted blocks out to the tier, then loaded ones in: before the forward pass */
        double t1;
        if (fit_at(&eng->prefill_fit, 1024, &t1))
            offload_set_token_cost(eng->off, t1 / 1024);
        offload_apply(eng->off, sched_kvm(eng->s));
    }
    if (pl.n_entries == 0 && pl.n_failed == 0 && pl.n_preempted == 0) {
        /* nothing runnable: the waiting sequences wait for the KV tier's reads */
        if (eng->off && offload_waiting(eng->off))
            offload_wait(eng->off, 0.01); /* sleep, not spin */
        rc = sched_step_done(eng->s, e);
        step_aborts(eng);
        return rc;
    }
    eng->in_step = true;
    rc = step_run(eng, &pl, e);
    eng->in_step = false;
    step_aborts(eng);
    return rc;
}

void engine_tier_wait(const struct engine *eng, uint64_t ticket)
{
    if (eng->off && ticket)
        offload_wait_saved(eng->off, ticket);
}

bool engine_broken(const struct engine *eng)
{
    return runner_broken(eng->run);
}

bool engine_comm_stats(const struct engine *eng, struct comm_stats *out, bool reset)
{
    return runner_comm_stats(eng->run, out, reset);
}

void engine_stats_get(const struct engine *eng, struct engine_stats *st)
{
    *st = eng->st;
    st->spec_computed = eng->prop ? eng->prop->computed : 0;
    st->spec_failures = eng->prop ? eng->prop->failures : 0;
    struct sched_stats ss;
    sched_stats_get(eng->s, &ss);
    st->preemptions = ss.n_preemptions;
    st->running = ss.n_running;
    st->waiting = ss.n_waiting;
    st->paused = eng->n_paused;
    st->cache_queries = ss.kv.lookups;
    st->cache_query_tokens = ss.kv.query_tokens;
    st->cache_hit_tokens = ss.kv.hit_tokens;
    st->evictions = ss.kv.evictions;
    st->cow_copies = ss.kv.cow_copies;
    st->kv_blocks = ss.kv.n_blocks;
    st->kv_blocks_used = ss.kv.n_used;
    st->kv_blocks_cached = ss.kv.n_cached;
    st->kv_blocks_free = ss.kv.n_free;
    st->block_size = ss.kv.block_size;
    st->kv_usage = ss.kv.usage;
    st->kv_bytes = eng->kv_bytes;
    st->tier_on = eng->off != NULL;
    st->tier_query_tokens = ss.tier_query_tokens;
    st->tier_hit_tokens = ss.tier_hit_tokens;
    if (eng->off)
        offload_stats(eng->off, &st->tier, &st->tier_blocks_loaded, &st->tier_blocks_saved,
                      &st->tier_load_seconds);
}

int engine_check(const struct engine *eng, struct weld_err *e)
{
    int rc = sched_check(eng->s, e);
    if (rc)
        return rc;
    int live = 0;
    for (const struct engine_req *er = eng->head; er; er = er->next)
        for (int i = 0; i < er->r->n_seqs; i++)
            live += er->seqs[i].ss != NULL;
    struct sched_stats ss;
    sched_stats_get(eng->s, &ss);
    if (live != ss.n_running + ss.n_waiting + ss.n_failed)
        return err_set(e, WELD_ERR_INTERNAL,
                       "engine: %d live sequences, scheduler holds %d running + %d waiting "
                       "+ %d failed", live, ss.n_running, ss.n_waiting, ss.n_failed);
    return WELD_OK;
}
