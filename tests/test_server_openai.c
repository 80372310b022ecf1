/*
 * test_server_openai - request JSON -> struct server_req (openai_req.c, openai_chat.c),
 * OpenAI error objects, response/chunk shapes (openai_resp.c) and the /metrics text
 * (metrics.c). The tokenizer is stories260K's (GGUF), whose ids for "Once upon a time"
 * are llama.cpp's (1 403 407 261 378, the same literal the CLI tokenize test checks).
 */
#include "test.h"

#include "core/alloc.h"
#include "format/gguf.h"
#include "server/metrics.h"
#include "server/openai.h"
#include "template/chat_template.h"
#include "tokenizer/tokenizer.h"

static struct gguf_file *g_gguf;
static struct tokenizer *g_tok;
static struct server_model g_m;

static const int32_t once_ids[] = {1, 403, 407, 261, 378};

/* Parse body text for api; returns the http status (0 on success). */
static int parse(const char *txt, enum server_api api, struct server_req *r,
                 struct server_error *e)
{
    json_error_t je;
    json_t *b = json_loads(txt, 0, &je);
    if (!b) {
        fprintf(stderr, "bad test JSON: %s: %s\n", txt, je.text);
        return -1;
    }
    memset(e, 0, sizeof *e);
    int rc = server_req_parse(b, api, &g_m, r, e);
    json_decref(b);
    return rc;
}

static int expect_error(const char *txt, enum server_api api, int http, const char *param,
                        const char *in_msg)
{
    struct server_req r;
    struct server_error e;
    int rc = parse(txt, api, &r, &e);
    server_req_release(&r);
    int ok = rc == http && (!param || !strcmp(e.param, param)) &&
             (!in_msg || strstr(e.msg, in_msg));
    if (!ok)
        fprintf(stderr, "  body %s -> %d param '%s' msg '%s' (want %d '%s' '%s')\n", txt, rc,
                e.param, e.msg, http, param ? param : "", in_msg ? in_msg : "");
    return ok;
}

TEST(completion_string_prompt)
{
    struct server_req r;
    struct server_error e;
    REQUIRE(parse("{\"model\": \"m\", \"prompt\": \"Once upon a time\"}", SERVER_API_COMPLETIONS,
                  &r, &e) == 0);
    CHECK_EQ_INT(r.n_prompts, 1);
    CHECK_EQ_INT(r.prompts[0].n_ids, 5);
    CHECK(!memcmp(r.prompts[0].ids, once_ids, sizeof once_ids));
    CHECK_EQ_STR(r.prompts[0].text, "Once upon a time");
    CHECK_EQ_INT(r.bl.p.max_tokens, 16);
    CHECK_NEAR(r.bl.p.sampling.temperature, 1.0, 0);
    CHECK_EQ_INT(r.bl.p.n, 1);
    CHECK_EQ_INT(r.logprobs, -1);
    CHECK(!r.stream && !r.echo && !r.include_usage);
    CHECK_EQ_STR(r.model, "m");
    server_req_release(&r);
}

TEST(completion_prompt_lists)
{
    struct server_req r;
    struct server_error e;
    REQUIRE(parse("{\"prompt\": [\"Once upon a time\", \"Once\"], \"n\": 2}",
                  SERVER_API_COMPLETIONS, &r, &e) == 0);
    CHECK_EQ_INT(r.n_prompts, 2);
    CHECK_EQ_INT(r.prompts[1].n_ids, 2);
    CHECK_EQ_INT(r.prompts[1].ids[1], 403);
    CHECK_EQ_INT(r.bl.p.n, 2);
    server_req_release(&r);
    REQUIRE(parse("{\"prompt\": [1, 403, 407]}", SERVER_API_COMPLETIONS, &r, &e) == 0);
    CHECK_EQ_INT(r.n_prompts, 1);
    CHECK_EQ_INT(r.prompts[0].n_ids, 3);
    CHECK_EQ_STR(r.prompts[0].text, "<s> Once upon");
    server_req_release(&r);
    REQUIRE(parse("{\"prompt\": [[1, 403], [407]], \"echo\": true}", SERVER_API_COMPLETIONS,
                  &r, &e) == 0);
    CHECK_EQ_INT(r.n_prompts, 2);
    CHECK_EQ_INT(r.prompts[1].ids[0], 407);
    CHECK(r.echo);
    server_req_release(&r);
    CHECK(expect_error("{\"prompt\": [\"a\", 5]}", SERVER_API_COMPLETIONS, 400, "prompt",
                       "only strings"));
    CHECK(expect_error("{\"prompt\": []}", SERVER_API_COMPLETIONS, 400, "prompt", NULL));
    CHECK(expect_error("{\"prompt\": [1, 99999]}", SERVER_API_COMPLETIONS, 400, "prompt",
                       "prompt[1]"));
    CHECK(expect_error("{\"prompt\": [[1], [-1]]}", SERVER_API_COMPLETIONS, 400, "prompt",
                       "prompt[1][0]"));
    CHECK(expect_error("{\"max_tokens\": 3}", SERVER_API_COMPLETIONS, 400, "prompt",
                       "required"));
}

TEST(sampling_fields)
{
    struct server_req r;
    struct server_error e;
    REQUIRE(parse("{\"prompt\": \"Once\", \"max_completion_tokens\": 7, \"temperature\": 0.5, "
                  "\"top_p\": 0.9, \"top_k\": 40, \"min_p\": 0.05, \"n\": 3, \"stop\": "
                  "[\"a\", \"bc\"], \"stop_token_ids\": [2], \"seed\": 42, "
                  "\"presence_penalty\": 0.5, \"frequency_penalty\": 0.25, "
                  "\"repetition_penalty\": 1.1, \"ignore_eos\": true, \"logprobs\": 3, "
                  "\"stream\": true, \"stream_options\": {\"include_usage\": true}, "
                  "\"logit_bias\": {}, \"unknown_field\": [1, 2]}",
                  SERVER_API_COMPLETIONS, &r, &e) == 0);
    const struct request_params *p = &r.bl.p;
    CHECK_EQ_INT(p->max_tokens, 7);
    CHECK_NEAR(p->sampling.temperature, 0.5, 1e-7);
    CHECK_NEAR(p->sampling.top_p, 0.9, 1e-7);
    CHECK_EQ_INT(p->sampling.top_k, 40);
    CHECK_NEAR(p->sampling.min_p, 0.05, 1e-7);
    CHECK_EQ_INT(p->n, 3);
    REQUIRE(p->n_stop == 2);
    CHECK_EQ_STR(p->stop[1], "bc");
    CHECK_EQ_INT(p->n_stop_token_ids, 1);
    CHECK(p->has_seed && p->sampling.seed == 42);
    CHECK_NEAR(p->sampling.presence_penalty, 0.5, 1e-7);
    CHECK_NEAR(p->sampling.frequency_penalty, 0.25, 1e-7);
    CHECK_NEAR(p->sampling.repetition_penalty, 1.1, 1e-6);
    CHECK(p->ignore_eos);
    CHECK_EQ_INT(r.logprobs, 3);
    CHECK(r.stream && r.include_usage);
    CHECK_EQ_INT(p->n_logit_bias, 0);
    server_req_release(&r);
    REQUIRE(parse("{\"prompt\": \"Once\", \"logit_bias\": {\"5\": 3, \"403\": -100}}",
                  SERVER_API_COMPLETIONS, &r, &e) == 0);
    REQUIRE(r.bl.p.n_logit_bias == 2);
    CHECK(r.bl.p.logit_bias_ids[0] == 5 && r.bl.p.logit_bias[0] == 3.0f);
    CHECK(r.bl.p.logit_bias_ids[1] == 403 && r.bl.p.logit_bias[1] == -100.0f);
    server_req_release(&r);
    REQUIRE(parse("{\"prompt\": \"Once\", \"stop\": \"x\"}", SERVER_API_COMPLETIONS, &r, &e) == 0);
    CHECK(r.bl.p.n_stop == 1 && !strcmp(r.bl.p.stop[0], "x"));
    server_req_release(&r);
}

TEST(invalid_values)
{
    const enum server_api C = SERVER_API_COMPLETIONS, H = SERVER_API_CHAT;
    CHECK(expect_error("{\"prompt\": \"a\", \"max_tokens\": 0}", C, 400, "max_tokens", "at least 1"));
    CHECK(expect_error("{\"prompt\": \"a\", \"temperature\": \"hot\"}", C, 400, "temperature", NULL));
    CHECK(expect_error("{\"prompt\": \"a\", \"temperature\": -1}", C, 400, "temperature", NULL));
    CHECK(expect_error("{\"prompt\": \"a\", \"top_p\": 0}", C, 400, "top_p", NULL));
    CHECK(expect_error("{\"prompt\": \"a\", \"n\": 0}", C, 400, "n", NULL));
    CHECK(expect_error("{\"prompt\": \"a\", \"stop\": [1]}", C, 400, "stop", "stop[0]"));
    CHECK(expect_error("{\"prompt\": \"a\", \"stop_token_ids\": [100000]}", C, 400,
                       "stop_token_ids", NULL));
    CHECK(expect_error("{\"prompt\": \"a\", \"logprobs\": 21}", C, 400, "logprobs", NULL));
    CHECK(expect_error("{\"prompt\": \"a\", \"logprobs\": true}", C, 400, "logprobs", "integer"));
    CHECK(expect_error("{\"prompt\": \"a\", \"stream\": 1}", C, 400, "stream", NULL));
    CHECK(expect_error("{\"prompt\": \"a\", \"stream_options\": 1}", C, 400, "stream_options", NULL));
    CHECK(expect_error("{\"prompt\": \"a\", \"logit_bias\": {\"x\": 3}}", C, 400, "logit_bias",
                       "not a token id"));
    CHECK(expect_error("{\"prompt\": \"a\", \"logit_bias\": {\"5\": 300}}", C, 400, "logit_bias",
                       "[-100, 100]"));
    CHECK(expect_error("{\"prompt\": \"a\", \"model\": \"other\"}", C, 404, "model", "`other`"));
    CHECK(expect_error("{\"prompt\": \"a\", \"model\": 5}", C, 400, "model", NULL));
    CHECK(expect_error("[1, 2]", C, 400, NULL, "JSON object"));
    CHECK(expect_error("{\"prompt\": \"a\", \"max_tokens\": 5000000000}", C, 400, "max_tokens", NULL));
    CHECK(expect_error("{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}], "
                       "\"logprobs\": 2}", H, 400, "logprobs", "boolean"));
    CHECK(expect_error("{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}], "
                       "\"top_logprobs\": 2}", H, 400, "top_logprobs", "logprobs: true"));
    /* the model path is accepted as the model name too */
    struct server_req r;
    struct server_error e;
    CHECK(parse("{\"prompt\": \"a\", \"model\": \"/models/x.gguf\"}", C, &r, &e) == 0);
    server_req_release(&r);
}

TEST(context_limit)
{
    /* max_model_len 128: "Once upon a time" is 5 tokens */
    CHECK(expect_error("{\"prompt\": \"Once upon a time\", \"max_tokens\": 124}",
                       SERVER_API_COMPLETIONS, 400, "max_tokens",
                       "maximum context length is 128 tokens. However, you requested 129 "
                       "tokens (5 in the prompt, 124 in the completion)"));
    struct server_req r;
    struct server_error e;
    CHECK(parse("{\"prompt\": \"Once upon a time\", \"max_tokens\": 123}",
                SERVER_API_COMPLETIONS, &r, &e) == 0);
    server_req_release(&r);
    char big[2000];
    strcpy(big, "{\"prompt\": [");
    for (int i = 0; i < 128; i++)
        strcat(big, i ? ", 403" : "403");
    strcat(big, "]}");
    CHECK(expect_error(big, SERVER_API_COMPLETIONS, 400, "prompt", "has 128 tokens"));
    /* completions default: 16, clamped to the room left */
    big[strlen(big) - 12] = 0; /* drop ", 403, 403]}" */
    strcat(big, "]}");
    REQUIRE(parse(big, SERVER_API_COMPLETIONS, &r, &e) == 0);
    CHECK_EQ_INT(r.prompts[0].n_ids, 126);
    CHECK_EQ_INT(r.bl.p.max_tokens, 2);
    server_req_release(&r);
}

static struct chat_template *g_bos_tmpl;

TEST(chat_messages)
{
    struct server_req r;
    struct server_error e;
    CHECK(expect_error("{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}",
                       SERVER_API_CHAT, 400, "messages", "no chat template"));
    g_m.tmpl = g_bos_tmpl;
    REQUIRE(parse("{\"messages\": [{\"role\": \"system\", \"content\": \"Once\"}, {\"role\": "
                  "\"user\", \"content\": [{\"type\": \"text\", \"text\": \"upon\"}, {\"type\": "
                  "\"text\", \"text\": \"a time\"}]}], \"logprobs\": true, \"top_logprobs\": 2}",
                  SERVER_API_CHAT, &r, &e) == 0);
    CHECK_EQ_STR(r.prompts[0].text, "<s>[system]Once[user]upon\na time[assistant]");
    /* one BOS: the template wrote it, the tokenizer must not add another */
    CHECK_EQ_INT(r.prompts[0].ids[0], 1);
    CHECK(r.prompts[0].ids[1] != 1);
    int32_t *ref = NULL;
    size_t n_ref = 0;
    const char *body = "<s>[system]Once[user]upon\na time[assistant]";
    REQUIRE(tokenizer_encode(g_tok, body, strlen(body), false, true, &ref, &n_ref, NULL) == 0);
    CHECK_EQ_INT(r.prompts[0].n_ids, (int)n_ref);
    CHECK(!memcmp(ref, r.prompts[0].ids, n_ref * sizeof *ref));
    wfree(ref);
    CHECK_EQ_INT(r.logprobs, 2);
    /* chat default max_tokens: what is left of max_model_len */
    CHECK_EQ_INT(r.bl.p.max_tokens, 128 - r.prompts[0].n_ids);
    server_req_release(&r);
    REQUIRE(parse("{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], "
                  "\"add_generation_prompt\": false}", SERVER_API_CHAT, &r, &e) == 0);
    CHECK_EQ_STR(r.prompts[0].text, "<s>[user]x");
    server_req_release(&r);
    CHECK(expect_error("{\"messages\": [{\"role\": \"wizard\", \"content\": \"a\"}]}",
                       SERVER_API_CHAT, 400, "messages", "messages[0].role"));
    CHECK(expect_error("{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": "
                       "\"image_url\"}]}]}", SERVER_API_CHAT, 400, "messages",
                       "messages[0].content[0]"));
    CHECK(expect_error("{\"messages\": []}", SERVER_API_CHAT, 400, "messages", NULL));
    CHECK(expect_error("{\"messages\": \"hi\"}", SERVER_API_CHAT, 400, "messages", NULL));
    CHECK(expect_error("{\"prompt\": \"hi\"}", SERVER_API_CHAT, 400, "messages", "required"));
    g_m.tmpl = NULL;
}

TEST(error_object)
{
    struct server_error e;
    CHECK_EQ_INT(server_error_set(&e, 404, "model", "The model `%s` does not exist.", "x"), 404);
    json_t *j = server_error_json(&e);
    json_t *o = json_object_get(j, "error");
    CHECK_EQ_STR(json_string_value(json_object_get(o, "message")), "The model `x` does not exist.");
    CHECK_EQ_STR(json_string_value(json_object_get(o, "type")), "invalid_request_error");
    CHECK_EQ_STR(json_string_value(json_object_get(o, "param")), "model");
    CHECK_EQ_STR(json_string_value(json_object_get(o, "code")), "model_not_found");
    json_decref(j);
    server_error_set(&e, 400, NULL, "bad");
    j = server_error_json(&e);
    o = json_object_get(j, "error");
    CHECK(json_is_null(json_object_get(o, "param")) && json_is_null(json_object_get(o, "code")));
    json_decref(j);
    server_error_set(&e, 401, NULL, "key");
    CHECK_EQ_STR(e.code, "invalid_api_key");
    server_error_set(&e, 413, NULL, "big");
    CHECK_EQ_STR(e.code, "request_too_large");
}

TEST(response_shapes)
{
    struct server_req r;
    struct server_error e;
    REQUIRE(parse("{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}",
                  SERVER_API_CHAT, &r, &e) == 400); /* no template: build the req by hand */
    server_req_release(&r);
    memset(&r, 0, sizeof r);
    r.api = SERVER_API_CHAT;
    strcpy(r.model, "m");
    json_t *c = server_chunk_json(&r, "id1", 7, 0, "", 0, NULL, REQUEST_FINISH_NONE, NULL, -1, true);
    json_t *ch = json_array_get(json_object_get(c, "choices"), 0);
    CHECK_EQ_STR(json_string_value(json_object_get(c, "object")), "chat.completion.chunk");
    CHECK_EQ_STR(json_string_value(json_object_get(json_object_get(ch, "delta"), "role")), "assistant");
    CHECK(json_is_null(json_object_get(ch, "finish_reason")));
    json_decref(c);
    c = server_chunk_json(&r, "id1", 7, 2, "", 0, NULL, REQUEST_FINISH_LENGTH, NULL, -1, false);
    ch = json_array_get(json_object_get(c, "choices"), 0);
    CHECK_EQ_STR(json_string_value(json_object_get(ch, "finish_reason")), "length");
    CHECK_EQ_INT(json_integer_value(json_object_get(ch, "index")), 2);
    CHECK_EQ_INT(json_object_size(json_object_get(ch, "delta")), 0);
    json_decref(c);
    /* chat logprobs shape, with token bytes */
    json_t *lp = NULL;
    int32_t top[2] = {403, 407};
    float tlp[2] = {-0.5f, -1.5f};
    server_lp_append(SERVER_API_CHAT, g_tok, &lp, 403, -0.5f, 2, top, tlp, 0);
    json_t *ent = json_array_get(json_object_get(lp, "content"), 0);
    CHECK_NEAR(json_real_value(json_object_get(ent, "logprob")), -0.5, 1e-6);
    CHECK_EQ_INT(json_array_size(json_object_get(ent, "top_logprobs")), 2);
    CHECK_EQ_INT(json_array_size(json_object_get(ent, "bytes")),
                 strlen(json_string_value(json_object_get(ent, "token"))));
    json_decref(lp);
    lp = NULL;
    server_lp_append(SERVER_API_COMPLETIONS, g_tok, &lp, 403, -0.5f, 2, top, tlp, 16);
    CHECK_EQ_INT(json_integer_value(json_array_get(json_object_get(lp, "text_offset"), 0)), 16);
    CHECK_EQ_INT(json_object_size(json_array_get(json_object_get(lp, "top_logprobs"), 0)), 2);
    json_decref(lp);
    json_t *u = server_usage_json(5, 7, 3);
    CHECK_EQ_INT(json_integer_value(json_object_get(u, "total_tokens")), 12);
    CHECK_EQ_INT(json_integer_value(json_object_get(json_object_get(u, "prompt_tokens_details"),
                                                    "cached_tokens")), 3);
    json_decref(u);
    struct server_choice chs[2] = {{.text = "ab", .len = 2, .finish = REQUEST_FINISH_STOP,
                                    .stop_reason = "zz", .stop_token = -1, .n_generated = 3},
                                   {.text = "c", .len = 1, .finish = REQUEST_FINISH_LENGTH,
                                    .stop_token = 2, .n_generated = 4}};
    r.api = SERVER_API_COMPLETIONS;
    json_t *b = server_resp_json(&r, "cmpl-1", 9, chs, 2, 5, 0);
    json_t *c1 = json_array_get(json_object_get(b, "choices"), 1);
    CHECK_EQ_STR(json_string_value(json_object_get(c1, "text")), "c");
    CHECK_EQ_INT(json_integer_value(json_object_get(c1, "stop_reason")), 2);
    CHECK_EQ_STR(json_string_value(json_object_get(json_array_get(json_object_get(b, "choices"), 0),
                                                   "stop_reason")), "zz");
    CHECK_EQ_INT(json_integer_value(json_object_get(json_object_get(b, "usage"),
                                                    "completion_tokens")), 7);
    json_decref(b);
}

TEST(metrics_text)
{
    struct server_metrics m;
    server_metrics_init(&m);
    prom_hist_observe(&m.ttft, 0.002);
    prom_hist_observe(&m.ttft, 0.005);
    prom_hist_observe(&m.ttft, 100.0);
    prom_hist_observe(&m.ttft, 1e6);
    m.success[REQUEST_FINISH_LENGTH] = 4;
    m.st.generated_tokens = 77;
    m.st.kv_usage = 0.25;
    char *t = server_metrics_text(&m, "a\"b");
    REQUIRE(t);
    CHECK(strstr(t, "weld:time_to_first_token_seconds_bucket{model_name=\"a\\\"b\",le=\"0.001\"} 0\n"));
    CHECK(strstr(t, "weld:time_to_first_token_seconds_bucket{model_name=\"a\\\"b\",le=\"0.005\"} 2\n"));
    CHECK(strstr(t, "weld:time_to_first_token_seconds_bucket{model_name=\"a\\\"b\",le=\"160\"} 3\n"));
    CHECK(strstr(t, "weld:time_to_first_token_seconds_bucket{model_name=\"a\\\"b\",le=\"+Inf\"} 4\n"));
    CHECK(strstr(t, "weld:time_to_first_token_seconds_count{model_name=\"a\\\"b\"} 4\n"));
    CHECK(strstr(t, "weld:request_success_total{model_name=\"a\\\"b\",finished_reason=\"length\"} 4\n"));
    CHECK(strstr(t, "weld:generation_tokens_total{model_name=\"a\\\"b\"} 77\n"));
    CHECK(strstr(t, "weld:kv_cache_usage_perc{model_name=\"a\\\"b\"} 0.25\n"));
    CHECK(strstr(t, "# TYPE weld:e2e_request_latency_seconds histogram\n"));
    CHECK(strstr(t, "# TYPE weld:prompt_tokens_total counter\n"));
    wfree(t);
}


/* Random bodies built from the known keys with values of every JSON type and edge values:
   every answer is a success that the engine would accept, or a 400 / 404 with a message
   and never a crash (this runs under ASan/UBSan in the sanitizer build). */
/* issue 26: OpenAI / vLLM ranges and unimplemented output-changing fields, 400 naming the
   field (the same table `weld batch` uses) */
TEST(openai_ranges_and_unsupported)
{
    const enum server_api C = SERVER_API_COMPLETIONS, H = SERVER_API_CHAT;
    static const char *const bad[][3] = {
        {"\"top_k\": -2", "top_k", "-1 or 0"},
        {"\"top_k\": -100", "top_k", NULL},
        {"\"presence_penalty\": 2.5", "presence_penalty", "[-2, 2]"},
        {"\"presence_penalty\": -2.01", "presence_penalty", NULL},
        {"\"frequency_penalty\": 3", "frequency_penalty", "[-2, 2]"},
        {"\"repetition_penalty\": 0", "repetition_penalty", "greater than 0"},
        {"\"repetition_penalty\": -1", "repetition_penalty", NULL},
        {"\"logprobs\": -1", "logprobs", "[0, 20]"},
        {"\"logprobs\": 21", "logprobs", NULL},
        {"\"logit_bias\": {\"512\": 1}", "logit_bias", "[0, 512)"},
        {"\"logit_bias\": {\"-1\": 1}", "logit_bias", NULL},
        {"\"logit_bias\": {\"5\": -101}", "logit_bias", "[-100, 100]"},
        {"\"temperature\": 2.01", "temperature", "[0, 2]"},
        {"\"temperature\": -0.5", "temperature", NULL},
        {"\"n\": 0", "n", NULL},
        {"\"n\": -3", "n", NULL},
        {"\"max_tokens\": 0", "max_tokens", "at least 1"},
        {"\"max_tokens\": -1", "max_tokens", NULL},
        {"\"response_format\": {\"type\": \"xml\"}", "response_format", "json_schema"},
        {"\"response_format\": {\"type\": \"json_schema\", \"json_schema\": {\"schema\": "
         "{\"type\": \"object\", \"propertyNames\": {}}}}",
         "response_format", "at /: \"propertyNames\""},
        {"\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\"}}]", "tools",
         "tool_choice"},
        {"\"tool_choice\": \"auto\"", "tool_choice", "\"none\""},
        {"\"tool_choice\": \"required\"", "tool_choice", NULL},
        {"\"guided_json\": {\"type\": \"object\", \"allOf\": []}", "guided_json", "allOf"},
        {"\"guided_regex\": \"[a-z\"", "guided_regex", "offset"},
        {"\"guided_choice\": [\"yes\", 1]", "guided_choice", "expected a non-empty string"},
        {"\"guided_grammar\": \"\"", "guided_grammar", NULL},
        {"\"structured_outputs\": {\"regex\": \"a\", \"choice\": [\"b\"]}", "structured_outputs",
         "give one"},
        {"\"suffix\": \"The end.\"", "suffix", NULL},
        {"\"best_of\": 4", "best_of", NULL},
        {"\"use_beam_search\": true", "use_beam_search", NULL},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char body[512];
        snprintf(body, sizeof body, "{\"prompt\": \"Once\", %s}", bad[i][0]);
        if (!expect_error(body, C, 400, bad[i][1], bad[i][2]))
            CHECK(0);
    }
    /* chat: top_logprobs 0-20, echo refused, a malformed tool refused, "auto" (the default
       with tools) refused without --enable-auto-tool-choice (server/tools.h has the rest) */
    g_m.tmpl = g_bos_tmpl;
    CHECK(expect_error("{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}], "
                       "\"logprobs\": true, \"top_logprobs\": 21}", H, 400, "top_logprobs", "[0, 20]"));
    CHECK(expect_error("{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}], "
                       "\"echo\": true}", H, 400, "echo", NULL));
    CHECK(expect_error("{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}], "
                       "\"tools\": [{\"type\": \"function\"}]}", H, 400, "tools",
                       "tools[0].function"));
    CHECK(expect_error("{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}], "
                       "\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\"}}]}",
                       H, 400, "tool_choice", "--enable-auto-tool-choice"));
    struct server_req r;
    struct server_error e;
    CHECK(parse("{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}], \"tools\": "
                "[{\"type\": \"function\", \"function\": {\"name\": \"f\"}}], \"tool_choice\": "
                "\"none\", \"top_logprobs\": 20, \"logprobs\": true, \"response_format\": "
                "{\"type\": \"text\"}}", H, &r, &e) == 0);
    server_req_release(&r);
    g_m.tmpl = NULL;
    /* the boundaries are accepted; temperatures below 1e-5 are greedy, as in vLLM */
    CHECK(parse("{\"prompt\": \"Once\", \"temperature\": 2, \"top_k\": -1, \"presence_penalty\": "
                "-2, \"frequency_penalty\": 2, \"logprobs\": 20, \"logit_bias\": {\"511\": 100}, "
                "\"repetition_penalty\": 0.001, \"best_of\": 1, \"tool_choice\": \"none\", "
                "\"guided_json\": null, \"some_new_field\": 1}", C, &r, &e) == 0);
    CHECK_EQ_STR(r.bl.unknown, "some_new_field");
    server_req_release(&r);
    CHECK(parse("{\"prompt\": \"Once\", \"temperature\": 1e-6}", C, &r, &e) == 0);
    CHECK(sampler_stats_inv_t(&r.bl.p.sampling, g_m.n_vocab) == 0.0f); /* greedy path */
    server_req_release(&r);
}

TEST(random_bodies)
{
    static const char *const keys[] = {
        "model", "prompt", "messages", "max_tokens", "max_completion_tokens", "temperature",
        "top_p", "top_k", "min_p", "n", "stop", "stop_token_ids", "seed", "presence_penalty",
        "frequency_penalty", "repetition_penalty", "logit_bias", "logprobs", "top_logprobs",
        "ignore_eos", "echo", "stream", "stream_options", "min_tokens", "add_generation_prompt",
        "chat_template_kwargs", "tools", "skip_special_tokens", "add_special_tokens"};
    static const char *const vals[] = {
        "null", "true", "false", "0", "1", "-1", "2", "7", "127", "128", "2147483648",
        "-9223372036854775808", "9223372036854775807", "0.5", "-0.0", "1e308", "-1e308",
        "1e-300", "\"\"", "\"Once upon a time\"", "\"m\"", "\"\\u00ff\\ud83d\\ude00\"",
        "[]", "[1, 2, 3]", "[0]", "[-5]", "[\"a\", \"b\"]", "[[1, 403], [407]]", "[[]]",
        "[\"\"]", "{}", "{\"include_usage\": true}", "{\"5\": 1}", "{\"a\": []}",
        "[{\"role\": \"user\", \"content\": \"hi\"}]",
        "[{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"x\"}]}]",
        "[{\"role\": \"user\"}]", "[{\"role\": 5, \"content\": null}]",
        "[{\"role\": \"assistant\", \"content\": [{\"type\": \"text\"}]}]", "[null]"};
    const int nk = (int)(sizeof keys / sizeof keys[0]), nv = (int)(sizeof vals / sizeof vals[0]);
    uint64_t x = 0x9e3779b97f4a7c15ull;
    int ok = 0, bad = 0;
    g_m.tmpl = g_bos_tmpl;
    for (int it = 0; it < 4000; it++) {
        char body[4096];
        /* half the bodies start from a valid prompt and messages (later keys override) */
        size_t w = (size_t)snprintf(body, sizeof body, "{%s", (x >> 3) & 1 ? "\"prompt\": "
                                    "\"Once\", \"messages\": [{\"role\": \"user\", "
                                    "\"content\": \"hi\"}], " : "");
        int n = 1 + (int)((x >> 7) % 4);
        for (int k = 0; k < n; k++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            const char *key = keys[x % (uint64_t)nk];
            const char *val = vals[(x >> 20) % (uint64_t)nv];
            w += (size_t)snprintf(body + w, sizeof body - w, "%s\"%s\": %s", k ? ", " : "", key, val);
        }
        snprintf(body + w, sizeof body - w, "}");
        json_t *b = json_loads(body, 0, NULL);
        if (!b)
            continue; /* duplicate keys etc. */
        for (int api = 0; api < 2; api++) {
            struct server_req r;
            struct server_error e;
            memset(&e, 0, sizeof e);
            int rc = server_req_parse(b, api ? SERVER_API_CHAT : SERVER_API_COMPLETIONS, &g_m, &r, &e);
            if (rc == 0) {
                ok++;
                CHECK(r.n_prompts >= 1);
                for (int i = 0; i < r.n_prompts; i++)
                    CHECK(r.prompts[i].n_ids >= 1 &&
                          r.prompts[i].n_ids + r.bl.p.max_tokens <= g_m.max_model_len);
                CHECK(request_params_check(&r.bl.p, g_m.n_vocab, NULL) == WELD_OK);
            } else {
                bad++;
                if (!(rc == 400 || rc == 404) || !e.msg[0])
                    fprintf(stderr, "  body %s -> %d '%s'\n", body, rc, e.msg);
                CHECK((rc == 400 || rc == 404) && e.msg[0]);
            }
            server_req_release(&r);
        }
        json_decref(b);
    }
    g_m.tmpl = NULL;
    printf("random bodies: %d accepted, %d refused\n", ok, bad);
    CHECK(ok > 100 && bad > 100);
}

int main(void)
{
    struct weld_err e = {0};
    const char *path = test_shared_path("models/stories260K.gguf");
    if (!path)
        return test_skip_all("stories260K.gguf not found under %s/models", test_shared_dir());
    if (gguf_open(&g_gguf, path, &e) || tokenizer_load_gguf(&g_tok, g_gguf, &e)) {
        fprintf(stderr, "%s: %s\n", path, e.msg);
        return 1;
    }
    const char *src = "{{ bos_token }}{% for m in messages %}[{{ m.role }}]{{ m.content }}"
                      "{% endfor %}{% if add_generation_prompt %}[assistant]{% endif %}";
    if (chat_template_parse(&g_bos_tmpl, src, strlen(src), &e)) {
        fprintf(stderr, "template: %s\n", e.msg);
        return 1;
    }
    g_m = (struct server_model){.name = "m", .path = "/models/x.gguf", .tok = g_tok,
                                .n_vocab = tokenizer_n_vocab(g_tok), .max_model_len = 128};
    RUN(completion_string_prompt);
    RUN(completion_prompt_lists);
    RUN(sampling_fields);
    RUN(invalid_values);
    RUN(context_limit);
    RUN(chat_messages);
    RUN(error_object);
    RUN(response_shapes);
    RUN(metrics_text);
    RUN(openai_ranges_and_unsupported);
    RUN(random_bodies);
    chat_template_free(g_bos_tmpl);
    tokenizer_free(g_tok);
    gguf_close(g_gguf);
    return test_summary();
}
