/*
 * cmd_bench - `weld bench throughput`: offline throughput of the engine on a synthetic
 * workload, in the shape of vLLM's benchmark_throughput.
 *
 * Datasets (prompts are random token ids drawn from the vocabulary minus special and
 * end-of-generation tokens, seeded by --seed; every request generates exactly
 * --output-len tokens: ignore_eos; greedy unless --temperature, --top-k, --top-p say
 * otherwise, with each request seeded by --seed and its index):
 *   random         --num-prompts prompts of --input-len tokens.
 *   shared-prefix  --num-groups groups; each group's prompts start with the same
 *                  --prefix-len tokens, then --input-len tokens of their own;
 *                  --num-prompts in all (num-prompts / num-groups per group).
 *   multi-turn     --num-groups conversations of num-prompts / num-groups turns; turn k+1's
 *                  prompt is turn k's prompt + its output + --input-len new tokens, sent
 *                  when turn k finishes, so later turns hit the prefix cache.
 * (`weld bench -m MODEL` and `weld bench --bandwidth`, the kernel benchmark, live in
 * bench_model.c; cmd_bench hands every invocation without "throughput" to it.)
 * Every request must fit the context whole (prompt and output; an error before running
 * otherwise, naming the lengths to lower).
 * The clock runs from the first request to the last token (model loading excluded).
 * Reported: requests, seconds, output tokens/s, total tokens/s ((prompt + output) / s),
 * prefix-cache hit rate (cached / prompt tokens), preemptions, mean TTFT; --json prints one
 * JSON object on stdout. --json-schema FILE constrains every request's output to a JSON
 * Schema (a request ends early when its document is complete). --compare
 * sequential|no-prefix-caching|unconstrained runs the same workload a second time with
 * --max-num-seqs 1, without prefix caching or without the constraint, in the same
 * invocation with the same loaded model, and prints the ratio of output tokens/s.
 */
#include "cli/cli.h"
#include "comm/comm.h"
#include "core/alloc.h"
#include "core/err.h"
#include "core/json.h"
#include "core/log.h"
#include "core/mfile.h"
#include "core/progress.h"
#include "core/rng.h"
#include "engine/engine.h"
#include "grammar/schema.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

#include <stdio.h>
#include <string.h>
#include <sys/resource.h>

struct bench_opts {
    const char *dataset, *compare;
    int num_prompts, input_len, output_len, prefix_len, num_groups;
    int64_t seed;
    bool json;
    float temperature, top_p; /* sampling of every request (default greedy) */
    int top_k;
    int spec_oracle; /* >= 0: --spec-oracle PCT (the speculation ceiling); -1 off */
    bool spec_always; /* --speculate-always: guess every step (a proposer's own cost) */
    const char *json_schema; /* --json-schema FILE: every request constrained by it */
    char *gbnf;              /* its grammar; NULL: unconstrained */
};

/* A conversation (multi-turn) or a single prompt: its tokens so far. */
struct bench_conv {
    int32_t *tokens;
    int n, cap;
    int turns_left;
    uint64_t cur_id;
};

/* --spec-oracle: a proposer replaying what the plain run generated (each sequence's
   prompt then output), every guess kept or, with probability pct / 100, made wrong: the
   speculation machinery's speed at an imposed acceptance, with no drafting cost, the
   engine's step-cost switch and per-sequence k deciding as they would for a real draft. */
struct oracle {
    struct spec_proposer base;
    int32_t **rec; /* (n) recorded token lists */
    int *n_rec, n, pct;
    struct rng g;
};

static int oracle_propose(struct spec_proposer *p, uint64_t key, const int32_t *t, int n, int max_k,
                          int32_t *out)
{
    (void)key;
    struct oracle *o = (struct oracle *)p;
    for (int i = 0; i < o->n; i++) {
        if (o->n_rec[i] <= n || memcmp(o->rec[i], t, sizeof(int32_t) * (size_t)n))
            continue;
        int k = o->n_rec[i] - n < max_k ? o->n_rec[i] - n : max_k;
        for (int j = 0; j < k; j++)
            out[j] = (int)(rng_u64(&o->g) % 100) < o->pct ? (o->rec[i][n + j] + 1) % 1000
                                                          : o->rec[i][n + j];
        return k;
    }
    return 0;
}

struct bench_run {
    const struct bench_opts *o;
    struct oracle *rec; /* --spec-oracle's first run: record into it */
    struct engine *eng;
    struct rng g;
    int n_vocab;
    const struct tokenizer *tok;
    struct bench_conv *convs;    /* (n_convs) */
    int n_convs;
    int *pending;                /* (n_convs) conversations whose next turn is due */
    int n_pending;
    double ttft_sum;
    int n_done;
    struct progress prog;
};

struct bench_result {
    double seconds, out_tps, total_tps, hit_rate, mean_ttft;
    uint64_t requests, prompt_tokens, cached_tokens, generated_tokens, preemptions;
    uint64_t spec_drafts, spec_draft_tokens, spec_accepted; /* speculation's counters */
    uint64_t steps, spec_asked;
    double t_forward, t_propose;               /* seconds in the target's passes, in the proposer */
    uint64_t peak_rss, weight_bytes, kv_bytes; /* process peak resident set; budget parts */
    bool have_comm;                            /* several ranks: rank 0's exchanges */
    uint64_t comm_bytes;                       /* sent and received */
    double comm_wait_s;
};

/* Peak resident set size of this process since the last peak_rss_reset (VmHWM), in
   bytes; without /proc, getrusage's peak over the whole process. */
static uint64_t peak_rss_bytes(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    unsigned long long kb = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "VmHWM: %llu kB", &kb) == 1)
            break;
    if (f)
        fclose(f);
    if (kb)
        return (uint64_t)kb * 1024;
    struct rusage ru;
    return getrusage(RUSAGE_SELF, &ru) == 0 ? (uint64_t)ru.ru_maxrss * 1024 : 0;
}

/* Start a new peak (Linux: "5" to clear_refs resets VmHWM), so a --compare run reports its
   own peak rather than the first run's. Best effort. */
static void peak_rss_reset(void)
{
    FILE *f = fopen("/proc/self/clear_refs", "w");
    if (f) {
        fputs("5", f);
        fclose(f);
    }
}

static int32_t random_token(struct bench_run *br)
{
    int32_t t = 0;
    for (int tries = 0; tries < 1000; tries++) { /* a vocabulary of only specials: any id */
        t = (int32_t)(rng_u64(&br->g) % (uint64_t)br->n_vocab);
        if (!br->tok || (!tokenizer_is_special(br->tok, t) && !tokenizer_is_eog(br->tok, t)))
            break;
    }
    return t;
}

static bool conv_append(struct bench_conv *c, const int32_t *t, int n)
{
    if (c->n + n > c->cap) {
        int cap = c->cap ? c->cap : 64;
        while (cap < c->n + n)
            cap *= 2;
        int32_t *nt = wrealloc(c->tokens, (size_t)cap * sizeof *nt);
        if (!nt)
            return false;
        c->tokens = nt;
        c->cap = cap;
    }
    memcpy(c->tokens + c->n, t, (size_t)n * sizeof *t);
    c->n += n;
    return true;
}

static bool conv_append_random(struct bench_run *br, struct bench_conv *c, int n)
{
    for (int i = 0; i < n; i++) {
        int32_t t = random_token(br);
        if (!conv_append(c, &t, 1))
            return false;
    }
    return true;
}

static void on_delta(void *user, uint64_t id, int seq, const char *text, size_t len,
                     const int32_t *tokens, int n_tokens, const struct request_logprob *lp)
{
    struct bench_run *br = user;
    (void)seq, (void)text, (void)len, (void)lp;
    for (int c = 0; br->rec && c < br->n_convs; c++) /* prompt, then the output as it comes */
        if (br->convs[c].cur_id == id) {
            struct oracle *o = br->rec;
            if (!o->n_rec[c]) {
                memcpy(o->rec[c], br->convs[c].tokens, sizeof(int32_t) * (size_t)br->convs[c].n);
                o->n_rec[c] = br->convs[c].n;
            }
            for (int i = 0; i < n_tokens; i++)
                o->rec[c][o->n_rec[c]++] = tokens[i];
        }
    if (strcmp(br->o->dataset, "multi-turn"))
        return;
    for (int c = 0; c < br->n_convs; c++)
        if (br->convs[c].cur_id == id)
            conv_append(&br->convs[c], tokens, n_tokens);
}

static void on_finish(void *user, uint64_t id, int seq, const struct request_result *r)
{
    struct bench_run *br = user;
    (void)seq;
    br->ttft_sum += r->t_first_token;
    br->n_done++;
    progress_add(&br->prog, 1);
    for (int c = 0; c < br->n_convs; c++)
        if (br->convs[c].cur_id == id && br->convs[c].turns_left > 0)
            br->pending[br->n_pending++] = c;
}

/* Send conversation c's next turn (its tokens so far plus input_len new ones). */
static int send_turn(struct bench_run *br, int c, struct weld_err *e)
{
    struct bench_conv *cv = &br->convs[c];
    if (!conv_append_random(br, cv, br->o->input_len))
        return err_set(e, WELD_ERR_NOMEM, "bench: out of memory");
    struct request_params p = request_params_default();
    p.prompt_ids = cv->tokens;
    p.n_prompt_ids = cv->n;
    p.max_tokens = br->o->output_len;
    p.ignore_eos = true;
    p.sampling.temperature = br->o->temperature;
    p.sampling.top_p = br->o->top_p;
    p.sampling.top_k = br->o->top_k;
    p.sampling.seed = (uint64_t)br->o->seed * 1000003u + (uint64_t)c;
    p.grammar = br->o->gbnf;
    struct request_callbacks cb = {br, on_delta, on_finish};
    cv->turns_left--;
    return engine_add_request(br->eng, &p, &cb, &cv->cur_id, e);
}

/* Build the conversations: one per prompt, or per group / conversation. */
static int bench_setup(struct bench_run *br, struct weld_err *e)
{
    const struct bench_opts *o = br->o;
    bool multi = !strcmp(o->dataset, "multi-turn"), shared = !strcmp(o->dataset, "shared-prefix");
    int per_group = o->num_prompts / o->num_groups;
    br->n_convs = multi ? o->num_groups : (shared ? per_group * o->num_groups : o->num_prompts);
    br->convs = wcalloc((size_t)br->n_convs, sizeof *br->convs);
    br->pending = wcalloc((size_t)br->n_convs, sizeof *br->pending);
    if (!br->convs || !br->pending)
        return err_set(e, WELD_ERR_NOMEM, "bench: out of memory");
    struct bench_conv prefix = {0};
    for (int c = 0; c < br->n_convs; c++) {
        struct bench_conv *cv = &br->convs[c];
        cv->turns_left = multi ? per_group : 1;
        cv->cur_id = UINT64_MAX;
        if (shared && c % per_group == 0) {
            prefix.n = 0;
            if (!conv_append_random(br, &prefix, o->prefix_len))
                return err_set(e, WELD_ERR_NOMEM, "bench: out of memory");
        }
        if (shared && !conv_append(cv, prefix.tokens, prefix.n))
            return err_set(e, WELD_ERR_NOMEM, "bench: out of memory");
        br->pending[br->n_pending++] = c;
    }
    wfree(prefix.tokens);
    return WELD_OK;
}

static int bench_once(struct bench_run *br, struct bench_result *res, struct weld_err *e)
{
    int rc = bench_setup(br, e);
    if (rc)
        return rc;
    int total = br->n_convs * br->convs[0].turns_left;
    progress_start(&br->prog, "bench", (uint64_t)total);
    struct comm_stats cs;
    (void)engine_comm_stats(br->eng, &cs, true);
    double t0 = time_now();
    while (rc == WELD_OK && (br->n_pending || engine_has_work(br->eng))) {
        int n = br->n_pending;
        br->n_pending = 0;
        for (int k = 0; k < n && rc == WELD_OK; k++)
            rc = send_turn(br, br->pending[k], e);
        if (rc == WELD_OK)
            rc = engine_step(br->eng, e);
    }
    double dt = time_now() - t0;
    progress_end(&br->prog);
    if (rc)
        return rc;
    struct engine_stats st;
    engine_stats_get(br->eng, &st);
    const bool comm = engine_comm_stats(br->eng, &cs, false);
    *res = (struct bench_result){
        .have_comm = comm,
        .comm_bytes = comm ? cs.bytes_sent + cs.bytes_recv : 0,
        .comm_wait_s = comm ? cs.wait_s : 0,
        .seconds = dt,
        .requests = st.requests_finished,
        .prompt_tokens = st.prompt_tokens,
        .cached_tokens = st.cached_tokens,
        .generated_tokens = st.generated_tokens,
        .preemptions = st.preemptions,
        .out_tps = dt > 0 ? (double)st.generated_tokens / dt : 0,
        .total_tps = dt > 0 ? (double)(st.prompt_tokens + st.generated_tokens) / dt : 0,
        .hit_rate = st.prompt_tokens ? (double)st.cached_tokens / (double)st.prompt_tokens : 0,
        .mean_ttft = br->n_done ? br->ttft_sum / br->n_done : 0,
        .peak_rss = peak_rss_bytes(),
        .weight_bytes = model_weight_bytes(engine_model(br->eng)),
        .kv_bytes = st.kv_bytes,
        .spec_drafts = st.spec_drafts,
        .spec_draft_tokens = st.spec_draft_tokens,
        .spec_accepted = st.spec_accepted_tokens,
        .steps = st.steps,
        .spec_asked = st.spec_asked,
        .t_forward = st.t_forward,
        .t_propose = st.t_propose,
    };
    return WELD_OK;
}

static void bench_run_free(struct bench_run *br)
{
    for (int c = 0; br->convs && c < br->n_convs; c++)
        wfree(br->convs[c].tokens);
    wfree(br->convs);
    wfree(br->pending);
    engine_free(br->eng);
}

/* One full run with engine params p on model m. */
static int bench_with(const struct bench_opts *o, const struct engine_params *p,
                      struct bench_result *res, struct oracle *rec, struct weld_err *e)
{
    struct bench_run br;
    memset(&br, 0, sizeof br);
    br.o = o;
    br.rec = rec;
    rng_seed(&br.g, (uint64_t)o->seed);
    peak_rss_reset();
    int rc = engine_create(&br.eng, p, e);
    if (rc == WELD_OK) {
        br.n_vocab = engine_model(br.eng)->cfg.n_vocab;
        br.tok = engine_tokenizer(br.eng);
        rc = bench_once(&br, res, e);
    }
    bench_run_free(&br);
    return rc;
}

static void print_result(const char *label, const struct bench_result *r)
{
    fprintf(stderr,
            "%s: %llu requests in %.2f s: %.2f output tok/s, %.2f total tok/s; prompt %llu "
            "tokens (cached %llu, hit rate %.1f%%), output %llu; %llu preemptions; mean TTFT "
            "%.3f s\n",
            label, (unsigned long long)r->requests, r->seconds, r->out_tps, r->total_tps,
            (unsigned long long)r->prompt_tokens, (unsigned long long)r->cached_tokens,
            100 * r->hit_rate, (unsigned long long)r->generated_tokens,
            (unsigned long long)r->preemptions, r->mean_ttft);
    double budget = (double)(r->weight_bytes + r->kv_bytes);
    fprintf(stderr,
            "%s: memory: peak RSS %.1f MiB = %.2fx (weights %.1f MiB + KV pool %.1f MiB)\n",
            label, (double)r->peak_rss / 1048576.0, budget > 0 ? (double)r->peak_rss / budget : 0,
            (double)r->weight_bytes / 1048576.0, (double)r->kv_bytes / 1048576.0);
    const double tok = (double)(r->prompt_tokens + r->generated_tokens);
    if (r->have_comm)
        fprintf(stderr,
                "%s: communication (rank 0): %.1f KB per token (prompt and output), "
                "%.1f%% of the run waiting in exchanges\n",
                label, tok > 0 ? (double)r->comm_bytes / tok / 1e3 : 0.0,
                r->seconds > 0 ? 100 * r->comm_wait_s / r->seconds : 0.0);
}

static json_t *result_json(const struct bench_result *r)
{
    return json_pack("{s:I, s:f, s:f, s:f, s:I, s:I, s:I, s:f, s:I, s:f, s:I, s:I, s:I}", "requests",
                     (json_int_t)r->requests, "seconds", r->seconds, "output_tok_s", r->out_tps,
                     "total_tok_s", r->total_tps, "prompt_tokens", (json_int_t)r->prompt_tokens,
                     "cached_tokens", (json_int_t)r->cached_tokens, "output_tokens",
                     (json_int_t)r->generated_tokens, "hit_rate", r->hit_rate, "preemptions",
                     (json_int_t)r->preemptions, "mean_ttft_s", r->mean_ttft, "peak_rss_bytes",
                     (json_int_t)r->peak_rss, "weight_bytes", (json_int_t)r->weight_bytes,
                     "kv_pool_bytes", (json_int_t)r->kv_bytes);
}

static int check_opts(const struct bench_opts *o, struct weld_err *e)
{
    if (strcmp(o->dataset, "random") && strcmp(o->dataset, "shared-prefix") &&
        strcmp(o->dataset, "multi-turn"))
        return err_set(e, WELD_ERR_INVALID_ARG,
                       "--dataset '%s': expected random, shared-prefix or multi-turn",
                       o->dataset);
    if (o->compare && strcmp(o->compare, "sequential") && strcmp(o->compare, "no-prefix-caching") &&
        strcmp(o->compare, "unconstrained"))
        return err_set(e, WELD_ERR_INVALID_ARG,
                       "--compare '%s': expected sequential, no-prefix-caching or unconstrained",
                       o->compare);
    if (o->compare && !strcmp(o->compare, "unconstrained") && !o->json_schema)
        return err_set(e, WELD_ERR_INVALID_ARG, "--compare unconstrained needs --json-schema");
    if (o->num_prompts < 1 || o->input_len < 0 || o->output_len < 1 || o->prefix_len < 0 ||
        o->num_groups < 1)
        return err_set(e, WELD_ERR_INVALID_ARG,
                       "--num-prompts, --output-len and --num-groups must be >= 1, "
                       "--input-len and --prefix-len >= 0");
    if (strcmp(o->dataset, "random") && o->num_prompts % o->num_groups)
        return err_set(e, WELD_ERR_INVALID_ARG,
                       "--num-prompts %d is not a multiple of --num-groups %d",
                       o->num_prompts, o->num_groups);
    if (!(o->temperature >= 0) || !(o->top_p > 0 && o->top_p <= 1) || o->top_k < 0)
        return err_set(e, WELD_ERR_INVALID_ARG, "--temperature must be >= 0, --top-p in "
                       "(0, 1], --top-k >= 0");
    if (!strcmp(o->dataset, "random") && o->input_len < 1)
        return err_set(e, WELD_ERR_INVALID_ARG, "--input-len must be >= 1 for random");
    if (!strcmp(o->dataset, "shared-prefix") && o->prefix_len + o->input_len < 1)
        return err_set(e, WELD_ERR_INVALID_ARG, "--prefix-len + --input-len must be >= 1");
    return WELD_OK;
}

/* Every request must fit the context whole (prompt and all --output-len tokens), else it
   would be refused or cut short and the figures would not be the workload asked for. */
static int check_fits(const struct bench_opts *o, int ctx, struct weld_err *e)
{
    long long need;
    char what[160];
    if (!strcmp(o->dataset, "random")) {
        need = (long long)o->input_len + o->output_len;
        snprintf(what, sizeof what, "--input-len %d + --output-len %d", o->input_len,
                 o->output_len);
    } else if (!strcmp(o->dataset, "shared-prefix")) {
        need = (long long)o->prefix_len + o->input_len + o->output_len;
        snprintf(what, sizeof what, "--prefix-len %d + --input-len %d + --output-len %d",
                 o->prefix_len, o->input_len, o->output_len);
    } else {
        int turns = o->num_prompts / o->num_groups;
        need = (long long)turns * ((long long)o->input_len + o->output_len);
        snprintf(what, sizeof what, "%d turns x (--input-len %d + --output-len %d)", turns,
                 o->input_len, o->output_len);
    }
    if (ctx <= 0 || need <= ctx)
        return WELD_OK;
    return err_set(e, WELD_ERR_LIMIT, "--dataset %s: a request needs %s = %lld tokens, more "
                   "than the context of %d (--max-model-len, at most the model's): lower those "
                   "lengths", o->dataset, what, need, ctx);
}

static int throughput(const struct cli_engine_opts *eo, struct bench_opts *o, struct weld_err *e)
{
    struct engine_params p;
    struct model *m = NULL;
    int rc = check_opts(o, e);
    if (rc == WELD_OK && o->json_schema) {
        char *text = NULL;
        size_t len = 0;
        if ((rc = file_read_all(o->json_schema, &text, &len, e)) == WELD_OK &&
            (rc = grammar_gbnf_from_json_schema(text, len, &o->gbnf, e)))
            err_prefix(e, "--json-schema %s", o->json_schema);
        wfree(text);
    }
    if (rc == WELD_OK)
        rc = cli_engine_params(eo, &p, e);
    if (rc == WELD_OK)
        rc = model_load(&m, eo->model, e);
    if (rc)
        return rc;
    int ctx = p.max_model_len > 0 ? p.max_model_len : m->cfg.max_ctx;
    if ((rc = check_fits(o, ctx, e))) {
        model_free(m);
        return rc;
    }
    p.model = m;
    p.model_path = NULL;
    p.seed = (uint64_t)o->seed;
    struct bench_result a, b;
    struct oracle orc;
    memset(&orc, 0, sizeof orc);
    if (o->spec_oracle >= 0 && o->dataset[0] == 'r') { /* random: one prompt per request */
        orc.n = o->num_prompts, orc.pct = o->spec_oracle;
        orc.rec = wcalloc((size_t)orc.n, sizeof *orc.rec);
        orc.n_rec = wcalloc((size_t)orc.n, sizeof *orc.n_rec);
        for (int i = 0; orc.rec && i < orc.n; i++)
            orc.rec[i] = wmalloc(sizeof(int32_t) * (size_t)(o->input_len + o->output_len + 1));
        orc.base.propose = oracle_propose;
        rng_seed(&orc.g, (uint64_t)o->seed + 77);
    } else if (o->spec_oracle >= 0) {
        rc = err_set(e, WELD_ERR_INVALID_ARG, "--spec-oracle needs --dataset random");
    }
    p.spec_always = o->spec_always;
    struct engine_params plain = p;
    plain.spec.method = SPEC_NONE;
    if (rc == WELD_OK)
        rc = bench_with(o, o->spec_oracle >= 0 ? &plain : &p, &a, orc.n ? &orc : NULL, e);
    if (rc == WELD_OK)
        print_result("weld bench throughput", &a);
    if (rc == WELD_OK && o->spec_oracle >= 0) {
        struct engine_params sp = p;
        sp.proposer = &orc.base;
        sp.spec_always = false; /* the engine's own switch decides, as it would for a draft */
        sp.spec.num_tokens = p.spec.num_tokens > 0 ? p.spec.num_tokens : 4;
        sp.quiet = true;
        rc = bench_with(o, &sp, &b, NULL, e);
        if (rc == WELD_OK) {
            print_result("with the oracle proposer", &b);
            fprintf(stderr,
                    "speculation ceiling: k = %d, %d%% of guesses made wrong: %llu of "
                    "%llu accepted (%.1f%%), %.2f per verify step; output tok/s %.2fx of plain\n",
                    sp.spec.num_tokens, o->spec_oracle, (unsigned long long)b.spec_accepted,
                    (unsigned long long)b.spec_draft_tokens,
                    b.spec_draft_tokens
                        ? 100.0 * (double)b.spec_accepted / (double)b.spec_draft_tokens
                        : 0,
                    b.spec_drafts ? (double)b.spec_accepted / (double)b.spec_drafts : 0,
                    a.out_tps > 0 ? b.out_tps / a.out_tps : 0);
        }
    }
    for (int i = 0; orc.rec && i < orc.n; i++)
        wfree(orc.rec[i]);
    wfree(orc.rec), wfree(orc.n_rec);
    const char *cmp_label = NULL;
    if (rc == WELD_OK && o->compare) {
        char *kept = o->gbnf;
        if (!strcmp(o->compare, "sequential")) {
            p.max_num_seqs = 1;
            cmp_label = "same requests one at a time (--max-num-seqs 1)";
        } else if (!strcmp(o->compare, "unconstrained")) {
            o->gbnf = NULL;
            cmp_label = "same requests without the constraint";
        } else {
            p.prefix_caching = false;
            cmp_label = "same requests without prefix caching";
        }
        p.quiet = true;
        rc = bench_with(o, &p, &b, NULL, e);
        o->gbnf = kept;
        if (rc == WELD_OK) {
            print_result(cmp_label, &b);
            fprintf(stderr, "ratio (output tok/s): %.2fx\n", b.out_tps > 0 ? a.out_tps / b.out_tps : 0);
        }
    }
    if (rc == WELD_OK && a.spec_drafts)
        fprintf(stderr,
                "speculative: %llu of %llu drafted tokens accepted (%.1f%%), %.2f per "
                "verify step\n",
                (unsigned long long)a.spec_accepted, (unsigned long long)a.spec_draft_tokens,
                100.0 * (double)a.spec_accepted / (double)a.spec_draft_tokens,
                (double)a.spec_accepted / (double)a.spec_drafts);
    if (rc == WELD_OK && a.spec_asked)
        fprintf(stderr,
                "speculative: the proposer took %.2f ms per guess asked (%llu), %.1f%% of the "
                "time; the target %.2f ms per step (%llu)\n",
                1e3 * a.t_propose / (double)a.spec_asked, (unsigned long long)a.spec_asked,
                a.seconds > 0 ? 100.0 * a.t_propose / a.seconds : 0,
                a.steps ? 1e3 * a.t_forward / (double)a.steps : 0, (unsigned long long)a.steps);
    if (rc == WELD_OK && o->json) {
        json_t *j = json_pack("{s:s, s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:o}", "model",
                              eo->model, "dataset", o->dataset, "num_prompts", o->num_prompts,
                              "input_len", o->input_len, "output_len", o->output_len,
                              "prefix_len", o->prefix_len, "num_groups", o->num_groups,
                              "max_num_seqs", eo->max_num_seqs, "result", result_json(&a));
        if (o->compare) {
            json_object_set_new(j, "compare", json_string(o->compare));
            json_object_set_new(j, "compare_result", result_json(&b));
            json_object_set_new(j, "ratio", json_real(b.out_tps > 0 ? a.out_tps / b.out_tps : 0));
        }
        char *s = json_dumps(j, JSON_COMPACT);
        if (s)
            printf("%s\n", s);
        free(s);
        json_decref(j);
    }
    model_free(m);
    wfree(o->gbnf);
    return rc;
}

int cmd_bench(int argc, char **argv)
{
    if (argc >= 2 && !strcmp(argv[1], "serve")) {
        log_set_prefix("weld bench serve");
        return cmd_bench_serve(argc, argv); /* load generator over HTTP: bench_serve.c */
    }
    if (argc >= 2 && !strcmp(argv[1], "masks")) {
        log_set_prefix("weld bench masks");
        return cmd_bench_masks(argc, argv);
    }
    if (argc < 2 || strcmp(argv[1], "throughput"))
        return cmd_bench_model(argc, argv); /* -m MODEL, --bandwidth, --help: bench_model.c */
    log_set_prefix("weld bench throughput");
    struct cli_engine_opts eo;
    cli_engine_opts_init(&eo);
    struct bench_opts o = {.dataset = "random",
                           .num_prompts = 64,
                           .input_len = 512,
                           .output_len = 128,
                           .prefix_len = 1024,
                           .num_groups = 16,
                           .seed = 0,
                           .temperature = 0,
                           .top_p = 1,
                           .top_k = 0,
                           .spec_oracle = -1};
    const struct cli_opt more[] = {
        {"dataset", 0, OPT_STR, &o.dataset, "D", "random (default), shared-prefix or multi-turn"},
        {"num-prompts", 'n', OPT_INT, &o.num_prompts, "N", "requests (default 64)"},
        {"input-len", 0, OPT_INT, &o.input_len, "I",
         "prompt tokens; shared-prefix/multi-turn: tokens after the prefix / per turn (default 512)"},
        {"output-len", 0, OPT_INT, &o.output_len, "O",
         "generated tokens per request (default 128)"},
        {"prefix-len", 0, OPT_INT, &o.prefix_len, "P",
         "shared-prefix: tokens shared within a group (default 1024)"},
        {"num-groups", 0, OPT_INT, &o.num_groups, "G",
         "shared-prefix groups / multi-turn conversations (default 16)"},
        {"seed", 's', OPT_I64, &o.seed, "S", "seed of the random prompts (default 0)"},
        {"compare", 0, OPT_STR, &o.compare, "C",
         "also run with sequential (--max-num-seqs 1), no-prefix-caching or unconstrained (with --json-schema) and print the ratio"},
        {"json-schema", 0, OPT_STR, &o.json_schema, "FILE",
         "constrain every request's output to the JSON Schema in FILE"},
        {"temperature", 0, OPT_FLOAT, &o.temperature, "T",
         "sampling temperature of every request (default 0: greedy)"},
        {"top-k", 0, OPT_INT, &o.top_k, "K", "top-k of every request (default 0: off)"},
        {"top-p", 0, OPT_FLOAT, &o.top_p, "P", "top-p of every request (default 1: off)"},
        {"json", 0, OPT_FLAG, &o.json, NULL, "print the results as one JSON object on stdout"},
        {"spec-oracle", 0, OPT_INT, &o.spec_oracle, "PCT",
         "run again with a proposer that replays the first run's output, PCT% of its guesses made wrong: speculative decoding's ceiling (k from --speculative-config, default 4)"},
        {"speculate-always", 0, OPT_FLAG, &o.spec_always, NULL,
         "guess in every step whatever the measured costs say (to measure what a proposer costs)"},
    };
    struct cli_opt opts[CLI_ENGINE_N_OPTS + sizeof more / sizeof more[0]];
    int n = cli_engine_opts_table(&eo, opts);
    memcpy(opts + n, more, sizeof more);
    n += (int)(sizeof more / sizeof more[0]);
    const char *pos[1];
    int n_pos;
    int prc = cli_parse(argc - 1, argv + 1, "bench throughput -m MODEL [options]",
                        "Offline throughput on a synthetic workload (random token prompts, exactly\n"
                        "--output-len tokens each, greedy unless --temperature / --top-k / --top-p).\n"
                        "Reports output and total tokens/s,\n"
                        "prefix-cache hit rate and preemptions.",
                        opts, n, pos, 0, &n_pos);
    if (prc)
        return prc == 1 ? 0 : 2;
    if (!eo.model) {
        fprintf(stderr, "weld bench throughput: -m MODEL is required (see --help)\n");
        return 2;
    }
    struct weld_err e;
    err_clear(&e);
    int rc = throughput(&eo, &o, &e);
    if (rc) {
        fprintf(stderr, "weld bench throughput: %s\n", e.msg);
        return 1;
    }
    return 0;
}
