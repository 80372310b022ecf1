/*
 * test_spec_proposers - speculative decoding's proposers and their configuration
 * (spec/spec.h): the ngram lookup against a brute-force search of the same rule (longest
 * suffix first, latest earlier occurrence, continuation cut at max_k and at the end), and
 * --speculative-config's JSON (vLLM's field names, defaults, every refusal naming its
 * field), and the MTP proposer against a reference built here: the target's hidden states
 * from a runner, the MTP input stage written out in double (eh_proj . [enorm(embed(t));
 * hnorm(h)]), the layer run on model_mtp_view, guesses chained on the layer's own output;
 * its KV under block tables of block size 4: through a rejected guess, a prefix-cache hit
 * continued differently, the next turn of a finished sequence, a fork, a repeated ask,
 * reused blocks that held other tokens, and positions with no rows (zeros). The engine-level equivalence with
 * and without speculation is in test_engine_engine.
 */
#include "core/alloc.h"
#include "core/rng.h"
#include "exec/runner.h"
#include "model/mkmodel.h"
#include "model/model.h"
#include "spec/spec.h"
#include "test.h"

#include <math.h>
#include <string.h>

/* The rule written the slow way: every L from lookup_max down, every start from the
   latest, compare element by element. */
static int brute(const int32_t *t, int n, int lo, int hi, int k, int32_t *out)
{
    for (int L = hi; L >= lo; L--) {
        if (L > n - 1)
            continue;
        for (int s = n - L - 1; s >= 0; s--) {
            bool eq = true;
            for (int i = 0; i < L; i++)
                eq = eq && t[s + i] == t[n - L + i];
            if (!eq)
                continue;
            int m = 0;
            for (int i = s + L; i < n && m < k; i++)
                out[m++] = t[i];
            return m;
        }
    }
    return 0;
}

TEST(ngram_matches_the_rule)
{
    struct rng r;
    rng_seed(&r, 7);
    int bad = 0;
    for (int it = 0; it < 3000; it++) {
        int n = 1 + (int)(rng_u64(&r) % 60), alpha = 2 + (int)(rng_u64(&r) % 6);
        int32_t t[64], a[16], b[16];
        for (int i = 0; i < n; i++)
            t[i] = (int32_t)(rng_u64(&r) % (uint64_t)alpha);
        int lo = 1 + (int)(rng_u64(&r) % 3), hi = lo + (int)(rng_u64(&r) % 4);
        int k = 1 + (int)(rng_u64(&r) % 8);
        int na = spec_ngram_propose(t, n, lo, hi, k, a), nb = brute(t, n, lo, hi, k, b);
        bad += na != nb || memcmp(a, b, sizeof(int32_t) * (size_t)na);
    }
    CHECK_EQ_INT(bad, 0);
    /* a copied span: the continuation of its latest earlier occurrence */
    const int32_t t[] = {1, 2, 3, 4, 5, 9, 1, 2, 3, 4, 6, 7, 1, 2, 3};
    int32_t out[8];
    CHECK_EQ_INT(spec_ngram_propose(t, 15, 1, 3, 4, out), 4);
    CHECK(out[0] == 4 && out[1] == 6 && out[2] == 7 && out[3] == 1);
    CHECK_EQ_INT(spec_ngram_propose(t, 1, 1, 3, 4, out), 0);
    const int32_t u[] = {5, 6, 7, 8};
    CHECK_EQ_INT(spec_ngram_propose(u, 4, 1, 3, 4, out), 0); /* no repeat: no guess */
}

TEST(config_json)
{
    struct spec_config c;
    struct weld_err e;
    CHECK_EQ_INT(spec_config_parse("{\"method\": \"ngram\", \"num_speculative_tokens\": 5, "
                                   "\"prompt_lookup_max\": 3, \"prompt_lookup_min\": 2}",
                                   &c, &e),
                 WELD_OK);
    CHECK(c.method == SPEC_NGRAM && c.num_tokens == 5 && c.lookup_min == 2 && c.lookup_max == 3);
    CHECK_EQ_INT(spec_config_parse("{\"method\": \"ngram\"}", &c, &e), WELD_OK);
    CHECK(c.num_tokens == 4 && c.lookup_min == 1 && c.lookup_max == 4);
    CHECK_EQ_INT(spec_config_parse("{\"model\": \"d.gguf\", \"num_speculative_tokens\": 5}", &c,
                                   &e),
                 WELD_OK);
    CHECK(c.method == SPEC_DRAFT_MODEL && !strcmp(c.draft_model, "d.gguf") && c.num_tokens == 5);
    static const struct {
        const char *json, *names;
    } bad[] = {
        {"[1]", "not a JSON object"},
        {"{\"method\": \"eagle\"}", "\"eagle\""},
        {"{\"method\": \"ngram\", \"num_speculative_tokens\": 0}", "num_speculative_tokens"},
        {"{\"method\": \"ngram\", \"num_speculative_tokens\": 99}", "num_speculative_tokens"},
        {"{\"method\": \"ngram\", \"prompt_lookup_min\": 5, \"prompt_lookup_max\": 2}",
         "prompt_lookup_max"},
        {"{\"method\": \"ngram\", \"typo\": 1}", "typo"},
        {"{\"method\": \"draft_model\"}", "model"},
        {"{\"method\": \"medusa\"}", "mtp"},
        {"{}", "method"},
        {"{\"method\": 3}", "method"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        CHECK_EQ_INT(spec_config_parse(bad[i].json, &c, &e), WELD_ERR_INVALID_ARG);
        if (!strstr(e.msg, bad[i].names))
            fprintf(stderr, "  %s: %s\n", bad[i].json, e.msg);
        CHECK(strstr(e.msg, bad[i].names) != NULL);
    }
    /* a draft given apart (--model-draft / -md) fills in "model"; a conflict is an error */
    CHECK_EQ_INT(spec_config_parse_draft("{\"num_speculative_tokens\": 3}", "m.gguf", &c, &e),
                 WELD_OK);
    CHECK(c.method == SPEC_DRAFT_MODEL && !strcmp(c.draft_model, "m.gguf") && c.num_tokens == 3);
    CHECK_EQ_INT(spec_config_parse_draft("{\"method\": \"draft_model\"}", "m.gguf", &c, &e),
                 WELD_OK);
    CHECK(c.method == SPEC_DRAFT_MODEL && !strcmp(c.draft_model, "m.gguf"));
    CHECK_EQ_INT(spec_config_parse_draft("{\"method\": \"ngram\"}", "m.gguf", &c, &e),
                 WELD_ERR_INVALID_ARG);
    CHECK(strstr(e.msg, "ngram") && strstr(e.msg, "--model-draft"));
    CHECK_EQ_INT(spec_config_parse_draft("{\"model\": \"d.gguf\"}", "m.gguf", &c, &e),
                 WELD_ERR_INVALID_ARG);
    CHECK(strstr(e.msg, "give one") != NULL);
    struct spec_proposer *p = NULL;
    c = (struct spec_config){.method = SPEC_DRAFT_MODEL, .num_tokens = 4};
    strcpy(c.draft_model, "/nonexistent/draft.gguf");
    CHECK(spec_proposer_create(&p, &c, &(struct spec_limits){0}, &e) != WELD_OK);
    CHECK(strstr(e.msg, "/nonexistent/draft.gguf") != NULL);
    CHECK(p == NULL);
}

/* ---- mtp ------------------------------------------------------------------------------ */

enum { MV = 300, MK = 3, MAXT = 48 };

/* The target's final hidden rows of tokens[0, n) in position order into h (n, dim). */
static void target_rows(struct runner *rt, const int32_t *tokens, int n, int dim, float *h)
{
    struct weld_err e;
    float *lg = wmalloc(sizeof(float) * MV), *raw = wmalloc(sizeof(float) * (size_t)n * dim);
    struct batch_seq s = {.seq_id = 0, .tokens = tokens, .n_tokens = n, .all_hidden = true};
    struct batch b = {.seqs = &s, .n_seqs = 1};
    runner_drop_seq(rt, 0);
    CHECK_EQ_INT(runner_forward_hidden(rt, &b, lg, NULL, raw, &e), WELD_OK);
    /* the logit row (the last token) first, then the others */
    memcpy(h, raw + dim, sizeof(float) * (size_t)(n - 1) * dim);
    memcpy(h + (size_t)(n - 1) * dim, raw, sizeof(float) * (size_t)dim);
    wfree(lg), wfree(raw);
}

static void rms_d(const float *x, const float *w, int n, double eps, double *out)
{
    double ss = 0;
    for (int i = 0; i < n; i++)
        ss += (double)x[i] * x[i];
    double r = 1.0 / sqrt(ss / n + eps);
    for (int i = 0; i < n; i++)
        out[i] = x[i] * r * w[i];
}

/* x = eh_proj . [enorm(embed(tok)); hnorm(h)] in double (h NULL: zeros); f32 weights. */
static void mtp_input_ref(const struct model *m, int32_t tok, const float *h, float *x)
{
    const int D = m->cfg.dim;
    const struct nextn_weights *N = &m->nextn[0];
    double cat[1024];
    rms_d((const float *)m->tok_embd.data + (size_t)tok * D, N->enorm.data, D, m->cfg.norm_eps,
          cat);
    if (h)
        rms_d(h, N->hnorm.data, D, m->cfg.norm_eps, cat + D);
    else
        memset(cat + D, 0, sizeof(double) * (size_t)D);
    const float *W = N->eh_proj.data;
    for (int o = 0; o < D; o++) {
        double a = 0;
        for (int j = 0; j < 2 * D; j++)
            a += (double)W[(size_t)o * 2 * D + j] * cat[j];
        x[o] = (float)a;
    }
}

/* What the reference assumes of a sequence's inputs: positions [z0, z1) without the
   target's rows (zeros), and position swap_pos (-1: none) fed with token swap_tok as its
   next token (a block another sequence wrote, which continued differently). */
struct ref_in {
    int z0, z1, swap_pos;
    int32_t swap_tok;
};

/* The guesses for tokens[0, n) given ri, MK of them, into g and their logits into lgs (MK,
   MV); returns how many are sure (the best logit ahead of the second by more than the
   input stage's rounding can move it). */
static int mtp_ref(const struct model *m, struct runner *rt, const int32_t *tokens, int n,
                   struct ref_in ri, int32_t *g, float *lgs)
{
    const int D = m->cfg.dim;
    struct model view;
    model_mtp_view(m, 0, &view);
    struct runner *rv = NULL;
    struct weld_err e;
    if (runner_create(&rv, &view, 1, MAXT + 8, &e) != WELD_OK) {
        CHECK(false);
        return 0;
    }
    float *h = wmalloc(sizeof(float) * (size_t)n * D), *x = wmalloc(sizeof(float) * (size_t)n * D);
    float *hid = wmalloc(sizeof(float) * (size_t)D);
    target_rows(rt, tokens, n - 1, D, h);
    for (int i = 0; i < n - 1; i++)
        mtp_input_ref(m, i == ri.swap_pos ? ri.swap_tok : tokens[i + 1],
                      i >= ri.z0 && i < ri.z1 ? NULL : h + (size_t)i * D, x + (size_t)i * D);
    int sure = 0;
    for (int j = 0; j < MK; j++) {
        struct batch_seq s = {.seq_id = 0,
                              .tokens = j ? &g[j - 1] : tokens + 1,
                              .n_tokens = j ? 1 : n - 1,
                              .pos = j ? n - 2 + j : 0,
                              .embeds = x};
        struct batch b = {.seqs = &s, .n_seqs = 1};
        float *lg = lgs + (size_t)j * MV;
        CHECK_EQ_INT(runner_forward_hidden(rv, &b, lg, NULL, hid, &e), WELD_OK);
        int a = 0, c = -1;
        for (int v = 1; v < MV; v++)
            if (lg[v] > lg[a])
                c = a, a = v;
            else if (c < 0 || lg[v] > lg[c])
                c = v;
        g[j] = a;
        if (sure == j && lg[a] - lg[c] > 1e-3f)
            sure++;
        mtp_input_ref(m, g[j], hid, x);
    }
    runner_free(rv);
    wfree(h), wfree(x), wfree(hid);
    return sure;
}

/* Hand the proposer the target's rows of positions [from, n - 1) of tokens (as the
   engine does after the steps that computed them). */
static void feed(struct spec_proposer *p, uint64_t key, struct runner *rt, const int32_t *tokens,
                 int from, int n, int dim)
{
    float *h = wmalloc(sizeof(float) * (size_t)n * dim);
    target_rows(rt, tokens, n - 1, dim, h);
    p->observe(p, key, from, n - 1 - from, tokens, h + (size_t)from * dim);
    wfree(h);
}

static float g_worst; /* the largest logit difference seen */
static int32_t g_tabs[10][16]; /* each key's block table (block size 4) */

static const struct ref_in REF_PLAIN = {0, 0, -1, 0};

/* The proposer's answers to asks (n of them, MK guesses each, logits given, tables from
   g_tabs) against mtp_ref's for each ask's ref_in: the sure guesses equal, their logits
   within rounding of the input stage (f32 here, double there). Returns the sure guesses. */
static int mtp_check_batch(struct spec_proposer *p, const struct model *m, struct runner *rt,
                           struct spec_ask *asks, int n, const struct ref_in *ri)
{
    int32_t want[4][MK];
    float *lw = wmalloc(sizeof(float) * 4 * MK * MV);
    int sure[4], all = 0;
    for (int a = 0; a < n; a++) {
        sure[a] = mtp_ref(m, rt, asks[a].tokens, asks[a].n, ri[a], want[a],
                          lw + (size_t)a * MK * MV);
        asks[a].blocks = g_tabs[asks[a].seq_key], asks[a].n_blocks = 16;
    }
    p->propose_batch(p, asks, n);
    for (int a = 0; a < n; a++) {
        CHECK_EQ_INT(asks[a].n_out, MK);
        CHECK(sure[a] >= 1);
        for (int j = 0; j < sure[a] && j < asks[a].n_out; j++) {
            CHECK_EQ_INT(asks[a].out[j], want[a][j]);
            for (int v = 0; v < MV; v++) {
                float d = fabsf(asks[a].logits[(size_t)j * MV + v] -
                                lw[((size_t)a * MK + j) * MV + v]);
                g_worst = d > g_worst ? d : g_worst;
            }
        }
        all += sure[a];
    }
    wfree(lw);
    return all;
}

static int mtp_check(struct spec_proposer *p, const struct model *m, struct runner *rt,
                     uint64_t key, const int32_t *tokens, int n, struct ref_in ri, int32_t *got)
{
    float lg[MK * MV];
    struct spec_ask q = {
        .seq_key = key, .tokens = tokens, .n = n, .max_k = MK, .out = got, .logits = lg};
    return mtp_check_batch(p, m, rt, &q, 1, &ri);
}

/* Key k's table: its first `shared` blocks those of key `from`, then its own from `base`. */
static void table(int k, int from, int shared, int base)
{
    for (int j = 0; j < 16; j++)
        g_tabs[k][j] = j < shared ? g_tabs[from][j] : base + j - shared;
}

TEST(mtp_matches_reference)
{
    struct weld_err e;
    struct model_config c;
    REQUIRE(mkmodel_preset("tiny", ARCH_DEEPSEEK2, &c, &e) == WELD_OK);
    c.n_vocab = MV, c.n_nextn = 1;
    char dir[4200];
    snprintf(dir, sizeof dir, "%s/tiny-mtp", test_tmpdir());
    struct mkmodel_opts o = {.dtype = DT_F32, .seed = 9, .out = dir};
    struct model *m = NULL;
    REQUIRE(mkmodel_write(&c, &o, &e) == WELD_OK && model_load(&m, dir, &e) == WELD_OK);
    REQUIRE(m->cfg.n_nextn == 1 && m->cfg.dim <= 512);
    struct runner *rt = NULL;
    REQUIRE(runner_create(&rt, m, 1, MAXT + 8, &e) == WELD_OK);
    struct spec_proposer *p = NULL;
    struct spec_config sc = {.method = SPEC_MTP, .num_tokens = MK};
    /* blocks of 4 tokens, 128 of them: the engine's tables are g_tabs */
    struct spec_limits lim = {
        .target = m, .max_ctx = MAXT + 8, .max_seqs = 4, .kv_tokens = 160 * 4, .block_size = 4};
    REQUIRE(spec_proposer_create(&p, &sc, &lim, &e) == WELD_OK);
    CHECK(p->hidden_dim == m->cfg.dim && p->n_vocab == MV && p->observe && p->fork);
    const int D = m->cfg.dim;
    struct rng r;
    rng_seed(&r, 5);
    int32_t t[MAXT], u[MAXT], w[MAXT], g[MK];
    for (int i = 0; i < MAXT; i++)
        t[i] = (int32_t)(rng_u64(&r) % MV);
    int sure = 0;
    /* a prompt of 12: its rows, then guesses */
    table(1, 0, 0, 0);
    feed(p, 1, rt, t, 0, 12, D);
    sure += mtp_check(p, m, rt, 1, t, 12, REF_PLAIN, g);
    /* the step verified the guesses: rows of positions 11..14; the first guess taken, the
       second not (the sampled token differs) */
    memcpy(t + 12, g, sizeof g);
    float *h = wmalloc(sizeof(float) * MAXT * (size_t)D);
    target_rows(rt, t, 15, D, h);
    p->observe(p, 1, 11, 4, t, h + (size_t)11 * D);
    t[13] = (g[1] + 1) % MV;
    sure += mtp_check(p, m, rt, 1, t, 14, REF_PLAIN, g);
    /* a prefix-cache hit of two blocks (8 tokens) continued differently: the target hands
       over rows from 8 on; the layer's KV of block 0 is reused as is, block 1's too though
       its last position read t[8] (there is no row to recompute it with) */
    memcpy(u, t, sizeof(int32_t) * 8);
    for (int i = 8; i < 20; i++)
        u[i] = (int32_t)(rng_u64(&r) % MV);
    table(2, 1, 2, 20);
    feed(p, 2, rt, u, 8, 20, D);
    sure += mtp_check(p, m, rt, 2, u, 20, (struct ref_in){0, 0, 7, t[8]}, g);
    /* the first finishes; the next turn (its tokens and more) hits three of its blocks:
       exactly what the layer computed for them */
    p->forget(p, 1);
    for (int i = 14; i < 30; i++)
        t[i] = (int32_t)(rng_u64(&r) % MV);
    table(3, 1, 3, 40);
    feed(p, 3, rt, t, 12, 30, D);
    sure += mtp_check(p, m, rt, 3, t, 30, REF_PLAIN, g);
    /* n > 1: a prompt's rows, a fork (the child shares the full blocks), then each sibling
       its own first token; both in one batch (the child waits for the blocks its parent
       writes, then reuses them) */
    for (int i = 0; i < 16; i++)
        u[i] = (int32_t)(rng_u64(&r) % MV);
    table(4, 0, 0, 60);
    feed(p, 4, rt, u, 0, 16, D);
    p->forget(p, 2);
    p->fork(p, 4, 5);
    table(5, 4, 4, 80);
    memcpy(w, u, sizeof(int32_t) * 16);
    w[15] = (u[15] + 7) % MV;
    int32_t got4[MK], got5[MK];
    float *l2 = wmalloc(sizeof(float) * 2 * MK * MV);
    struct spec_ask asks[2] = {
        {.seq_key = 4, .tokens = u, .n = 16, .max_k = MK, .out = got4, .logits = l2},
        {.seq_key = 5, .tokens = w, .n = 16, .max_k = MK, .out = got5, .logits = l2 + MK * MV}};
    const uint64_t before = p->computed;
    sure += mtp_check_batch(p, m, rt, asks, 2, (const struct ref_in[]){REF_PLAIN, REF_PLAIN});
    /* the parent fed 15 positions and 2 guesses; the child its tail (12..14) and 2 */
    CHECK_EQ_INT((int)(p->computed - before), 15 + 2 + 3 + 2);
    /* asked again with nothing new (the sequence sat out a step): the same answer */
    sure += mtp_check(p, m, rt, 4, u, 16, REF_PLAIN, g);
    /* blocks that held other tokens (freed and reused): recomputed, with a recomputation
       (preemption) handing the same rows over twice */
    p->forget(p, 3), p->forget(p, 4), p->forget(p, 5);
    for (int i = 0; i < 11; i++)
        w[i] = (int32_t)(rng_u64(&r) % MV);
    table(6, 1, 3, 100);
    feed(p, 6, rt, w, 0, 11, D);
    feed(p, 6, rt, w, 0, 11, D);
    sure += mtp_check(p, m, rt, 6, w, 11, REF_PLAIN, g);
    /* blocks the layer never computed and no rows for them (fed as zeros) */
    for (int i = 0; i < 14; i++)
        w[i] = (int32_t)(rng_u64(&r) % MV);
    table(7, 0, 0, 110);
    feed(p, 7, rt, w, 8, 14, D);
    sure += mtp_check(p, m, rt, 7, w, 14, (struct ref_in){0, 8, -1, 0}, g);
    /* decoding across block boundaries: each step verifies the guesses (the rows of its
       positions come back), the first taken; the tail kept in scratch is copied into each
       block the target completes, so a call feeds only the two new positions and chains
       two guesses (the first call: the prompt's 5 positions) */
    p->forget(p, 6), p->forget(p, 7);
    for (int i = 0; i < 6; i++)
        w[i] = (int32_t)(rng_u64(&r) % MV);
    table(8, 0, 0, 140);
    feed(p, 8, rt, w, 0, 6, D);
    const uint64_t c0 = p->computed;
    for (int step = 0, n8 = 6; step < 8; step++, n8 += 2) {
        sure += mtp_check(p, m, rt, 8, w, n8, REF_PLAIN, g);
        memcpy(w + n8, g, sizeof g);
        target_rows(rt, w, n8 + MK, D, h);
        p->observe(p, 8, n8 - 1, MK + 1, w, h + (size_t)(n8 - 1) * D);
        w[n8 + 1] = (g[1] + 1) % MV;
    }
    CHECK_EQ_INT((int)(p->computed - c0), 7 + 7 * 4);
    CHECK_EQ_INT((int)p->failures, 0);
    wfree(l2);
    fprintf(stderr,
            "  %d guesses and their logits checked against the reference (largest "
            "difference %.2g)\n",
            sure, (double)g_worst);
    CHECK(sure >= 15);
    CHECK(g_worst < 1e-4f);
    wfree(h);
    spec_proposer_free(p);
    runner_free(rt);
    /* a model without MTP layers: a clear refusal */
    lim.target = m;
    m->cfg.n_nextn = 0;
    CHECK(spec_proposer_create(&p, &sc, &lim, &e) == WELD_ERR_UNSUPPORTED);
    CHECK(strstr(e.msg, "multi-token-prediction") != NULL);
    m->cfg.n_nextn = 1;
    model_free(m);
}

int main(int argc, char **argv)
{
    test_args(argc, argv);
    RUN(ngram_matches_the_rule);
    RUN(config_json);
    RUN(mtp_matches_reference);
    return test_summary();
}
