/*
 * test_engine_pooling - engine requests that read the prompt rather than only sample after
 * it: embeddings (REQUEST_KIND_EMBED) and prompt logprobs (echo), on stories260K.
 *
 * Reference: the plain runner (internal KV), one sequence alone. Embeddings: the final
 * hidden state of the last prompt token from runner_forward_hidden (which
 * test_exec_forward checks against the naive double-precision forward pass, and
 * test_exec_executors across executors), normalised in double. Prompt logprobs: the prompt
 * fed token by token (a one-token step per position), log_softmax of each step's row at the
 * next prompt token.
 *
 * The engine runs them batched with generating requests under a small token budget
 * (chunked prefill), with a cached prefix present (an embedding may use it; prompt
 * logprobs must not skip it), and must agree within float rounding; repeated embeddings
 * are identical; mean pooling averages every prompt token's state (no prefix-cache hit);
 * max_tokens 0 with prompt logprobs scores the prompt and generates nothing.
 */
#include "core/alloc.h"
#include "core/log.h"
#include "engine/engine.h"
#include "engine/sampler.h"
#include "exec/runner.h"
#include "model/model.h"
#include "test.h"

#include <math.h>
#include <stdint.h>

#define NREQ 8

static struct model *g_m;

struct out {
    float emb[512];
    int n_emb;
    float plp[128];       /* prompt logprobs; [0] NAN */
    int plp_top[128];     /* best top id per position */
    int n_plp;
    int n_gen, n_finish;
    enum request_finish finish;
    int n_cached;
};

static struct out g_out[NREQ + 1];

static void on_delta(void *user, uint64_t id, int seq, const char *text, size_t len,
                     const int32_t *tokens, int n_tokens, const struct request_logprob *lp)
{
    (void)user, (void)seq, (void)text, (void)len, (void)tokens, (void)lp;
    if (id <= NREQ)
        g_out[id].n_gen += n_tokens;
}

static void on_finish(void *user, uint64_t id, int seq, const struct request_result *r)
{
    (void)user, (void)seq;
    if (id > NREQ)
        return;
    struct out *o = &g_out[id];
    o->n_finish++;
    o->finish = r->finish;
    o->n_cached = r->n_cached_tokens;
    for (int i = 0; i < r->n_embedding && i < 512; i++)
        o->emb[i] = r->embedding[i];
    o->n_emb = r->n_embedding;
    for (int i = 0; i < r->n_prompt_logprobs && i < 128; i++) {
        o->plp[i] = r->prompt_logprobs[i].logprob;
        o->plp_top[i] = r->prompt_logprobs[i].n_top ? r->prompt_logprobs[i].top_ids[0] : -1;
    }
    o->n_plp = r->n_prompt_logprobs;
}

/* Reference embedding: the normalised final hidden state of the last prompt token, or
   (mean) the normalised mean of every prompt token's. */
static void ref_embedding_pool(const int32_t *ids, int n, bool mean, double *out)
{
    struct runner *r;
    struct weld_err e;
    REQUIRE(runner_create(&r, g_m, 1, 128, &e) == WELD_OK);
    const int D = g_m->cfg.dim;
    float *lg = wmalloc(sizeof(float) * (size_t)g_m->cfg.n_vocab * (size_t)n);
    float *h = wmalloc(sizeof(float) * (size_t)D * (size_t)n);
    struct batch_seq s = {.seq_id = 0, .tokens = ids, .n_tokens = n, .all_logits = mean};
    struct batch b = {.seqs = &s, .n_seqs = 1};
    REQUIRE(runner_forward_hidden(r, &b, lg, NULL, h, &e) == WELD_OK);
    double ss = 0;
    for (int i = 0; i < D; i++) {
        out[i] = 0;
        for (int t = 0; t < (mean ? n : 1); t++)
            out[i] += h[(size_t)t * D + (size_t)i];
        out[i] /= mean ? n : 1;
        ss += out[i] * out[i];
    }
    for (int i = 0; i < D; i++)
        out[i] /= sqrt(ss);
    wfree(lg), wfree(h);
    runner_free(r);
}

static void ref_embedding(const int32_t *ids, int n, double *out)
{
    ref_embedding_pool(ids, n, false, out);
}

/* Reference prompt logprobs: the prompt one token per step. */
static void ref_prompt_logprobs(const int32_t *ids, int n, double *lp, int *top)
{
    struct runner *r;
    struct weld_err e;
    REQUIRE(runner_create(&r, g_m, 1, 128, &e) == WELD_OK);
    const int V = g_m->cfg.n_vocab;
    float *lg = wmalloc(sizeof(float) * (size_t)V);
    for (int p = 0; p + 1 < n; p++) {
        struct batch_seq s = {.seq_id = 0, .tokens = ids + p, .n_tokens = 1, .pos = p};
        struct batch b = {.seqs = &s, .n_seqs = 1};
        REQUIRE(runner_forward(r, &b, lg, &e) == WELD_OK);
        lp[p + 1] = sampler_logprob(lg, V, ids[p + 1]);
        float tl;
        int32_t ti;
        sampler_top_logprobs(lg, V, 1, &ti, &tl);
        top[p + 1] = ti;
    }
    wfree(lg);
    runner_free(r);
}

static struct engine *mk_engine(int budget)
{
    struct engine_params p = engine_params_default();
    p.model = g_m;
    p.max_num_seqs = 16;
    p.max_num_batched_tokens = budget;
    p.kv_blocks = 64;
    p.max_model_len = 128;
    p.quiet = true;
    struct engine *eng = NULL;
    struct weld_err e;
    if (engine_create(&eng, &p, &e) != WELD_OK)
        fprintf(stderr, "engine_create: %s\n", e.msg);
    return eng;
}

static enum request_pooling g_pooling;

static void add(struct engine *eng, const int32_t *ids, int n, enum request_kind kind,
                int prompt_lp, int max_tokens)
{
    struct request_params p = request_params_default();
    p.kind = kind;
    p.pooling = g_pooling;
    p.prompt_ids = ids;
    p.n_prompt_ids = n;
    p.sampling.temperature = 0;
    p.ignore_eos = true;
    p.max_tokens = max_tokens;
    p.prompt_logprobs = prompt_lp;
    struct request_callbacks cb = {.on_delta = on_delta, .on_finish = on_finish};
    struct weld_err e;
    int rc = engine_add_request(eng, &p, &cb, NULL, &e);
    if (rc)
        fprintf(stderr, "add: %s\n", e.msg);
    CHECK_EQ_INT(rc, WELD_OK);
}

static void run(struct engine *eng)
{
    struct weld_err e;
    for (int i = 0; i < 10000 && engine_has_work(eng); i++)
        REQUIRE(engine_step(eng, &e) == WELD_OK);
    CHECK(!engine_has_work(eng));
    struct engine_stats st;
    engine_stats_get(eng, &st);
    CHECK_EQ_INT(st.kv_blocks_used, 0);
}

static void prompt(int32_t *ids, int n, int salt)
{
    for (int i = 0; i < n; i++)
        ids[i] = (int32_t)(1 + (i * 37 + salt * 11 + (i * i) % 7) % (g_m->cfg.n_vocab - 1));
}

TEST(embeddings_batched_equal_reference)
{
    REQUIRE(g_m);
    const int D = g_m->cfg.dim;
    int32_t a[70], b[9], gen[40];
    prompt(a, 70, 1);
    prompt(b, 9, 2);
    prompt(gen, 40, 3);
    memcpy(gen, a, 33 * sizeof *gen); /* shares two full blocks with a */
    memset(g_out, 0, sizeof g_out);
    struct engine *eng = mk_engine(24); /* chunked prefill beside decodes */
    REQUIRE(eng);
    add(eng, gen, 40, REQUEST_KIND_GENERATE, -1, 20);  /* id 1 */
    add(eng, a, 70, REQUEST_KIND_EMBED, -1, 16);       /* id 2 */
    add(eng, b, 9, REQUEST_KIND_EMBED, -1, 16);        /* id 3 */
    run(eng);
    add(eng, a, 70, REQUEST_KIND_EMBED, -1, 16);       /* id 4: its prefix now cached */
    run(eng);
    double want_a[512], want_b[512];
    ref_embedding(a, 70, want_a);
    ref_embedding(b, 9, want_b);
    CHECK_EQ_INT(g_out[1].n_gen, 20);
    for (int id = 2; id <= 4; id++) {
        const struct out *o = &g_out[id];
        const double *w = id == 3 ? want_b : want_a;
        CHECK_EQ_INT(o->n_finish, 1);
        CHECK_EQ_INT(o->finish, REQUEST_FINISH_STOP);
        CHECK_EQ_INT(o->n_gen, 0);
        CHECK_EQ_INT(o->n_emb, D);
        double norm = 0, diff = 0;
        for (int i = 0; i < D; i++) {
            norm += (double)o->emb[i] * o->emb[i];
            diff = fmax(diff, fabs(o->emb[i] - w[i]));
        }
        CHECK(fabs(norm - 1) < 1e-5);
        if (!(diff < 1e-5))
            fprintf(stderr, "request %d: embedding differs by %g\n", id, diff);
        CHECK(diff < 1e-5);
    }
    CHECK(g_out[4].n_cached > 0); /* the prefix cache served the repeat */
    CHECK(memcmp(g_out[2].emb, g_out[4].emb, sizeof(float) * (size_t)D) == 0);
    engine_free(eng);
}

/* Mean pooling: every prompt row, never from the prefix cache, chunked beside a decode. */
TEST(mean_pooling_equals_reference)
{
    REQUIRE(g_m);
    const int D = g_m->cfg.dim;
    int32_t a[70], gen[40];
    prompt(a, 70, 5);
    prompt(gen, 40, 6);
    memset(g_out, 0, sizeof g_out);
    struct engine *eng = mk_engine(24);
    REQUIRE(eng);
    add(eng, gen, 40, REQUEST_KIND_GENERATE, -1, 20); /* id 1 */
    g_pooling = REQUEST_POOLING_MEAN;
    add(eng, a, 70, REQUEST_KIND_EMBED, -1, 16);      /* id 2 */
    run(eng);
    add(eng, a, 70, REQUEST_KIND_EMBED, -1, 16);      /* id 3: prefix cached, not used */
    run(eng);
    g_pooling = REQUEST_POOLING_LAST;
    double want[512], last[512];
    ref_embedding_pool(a, 70, true, want);
    ref_embedding_pool(a, 70, false, last);
    double diff = 0, off = 0;
    for (int i = 0; i < D; i++) {
        diff = fmax(diff, fabs(g_out[2].emb[i] - want[i]));
        off = fmax(off, fabs(g_out[2].emb[i] - last[i]));
    }
    CHECK_EQ_INT(g_out[2].n_emb, D);
    CHECK_EQ_INT(g_out[2].finish, REQUEST_FINISH_STOP);
    if (!(diff < 1e-5))
        fprintf(stderr, "mean embedding differs by %g\n", diff);
    CHECK(diff < 1e-5);
    CHECK(off > 1e-2); /* not the last token's */
    CHECK_EQ_INT(g_out[3].n_cached, 0);
    CHECK(memcmp(g_out[2].emb, g_out[3].emb, sizeof(float) * (size_t)D) == 0);
    CHECK_EQ_INT(g_out[1].n_gen, 20);
    engine_free(eng);
}

TEST(prompt_logprobs_equal_token_by_token)
{
    REQUIRE(g_m);
    enum { N = 50 };
    int32_t a[N];
    prompt(a, N, 4);
    double want[N];
    int top[N];
    ref_prompt_logprobs(a, N, want, top);
    memset(g_out, 0, sizeof g_out);
    struct engine *eng = mk_engine(20);
    REQUIRE(eng);
    add(eng, a, N, REQUEST_KIND_GENERATE, -1, 4);  /* id 1: fills the prefix cache */
    run(eng);
    add(eng, a, N, REQUEST_KIND_GENERATE, 1, 0);   /* id 2: score only */
    add(eng, a, N, REQUEST_KIND_GENERATE, 0, 5);   /* id 3: score and generate */
    add(eng, a, N, REQUEST_KIND_GENERATE, -1, 16); /* id 4: off */
    run(eng);
    for (int id = 2; id <= 3; id++) {
        const struct out *o = &g_out[id];
        CHECK_EQ_INT(o->n_finish, 1);
        CHECK_EQ_INT(o->n_plp, N);
        CHECK_EQ_INT(o->n_cached, 0); /* every position computed */
        CHECK(isnan(o->plp[0]));
        double diff = 0;
        for (int i = 1; i < N && o->n_plp == N; i++)
            diff = fmax(diff, fabs(o->plp[i] - want[i]));
        if (!(diff < 1e-4))
            fprintf(stderr, "request %d: prompt logprobs differ by %g\n", id, diff);
        CHECK(diff < 1e-4);
    }
    CHECK_EQ_INT(g_out[2].finish, REQUEST_FINISH_LENGTH);
    CHECK_EQ_INT(g_out[2].n_gen, 0);
    for (int i = 1; i < N; i++)
        CHECK_EQ_INT(g_out[2].plp_top[i], top[i]);
    CHECK_EQ_INT(g_out[3].n_gen, 5);
    CHECK_EQ_INT(g_out[4].n_plp, 0);
    CHECK(g_out[4].n_cached > 0);
    /* max_tokens 0 without prompt logprobs is refused, naming the field */
    struct request_params p = request_params_default();
    p.prompt_ids = a;
    p.n_prompt_ids = N;
    p.max_tokens = 0;
    struct request_callbacks cb = {.on_finish = on_finish};
    struct weld_err e;
    CHECK_EQ_INT(engine_add_request(eng, &p, &cb, NULL, &e), WELD_ERR_INVALID_ARG);
    CHECK(strstr(e.msg, "max_tokens") != NULL);
    engine_free(eng);
}

int main(void)
{
    const char *path = test_shared_path("models/stories260K.gguf");
    struct weld_err e;
    log_set_level(LOG_WARN);
    if (!path || model_load(&g_m, path, &e) != WELD_OK)
        fprintf(stderr, "stories260K.gguf not available: its tests fail\n");
    RUN(embeddings_batched_equal_reference);
    RUN(mean_pooling_equals_reference);
    RUN(prompt_logprobs_equal_token_by_token);
    model_free(g_m);
    return test_summary();
}
