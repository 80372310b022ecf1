/*
 * test_engine_batch_io - the `weld batch` JSONL line parser (engine/batch_io.h):
 *   - every field, read into the request_params field it names (values chosen so none is a
 *     default), and the defaults when a field is absent or JSON null;
 *   - OpenAI batch lines (custom_id + body), ids of every JSON kind;
 *   - each field given the wrong JSON type fails with "line N: ... 'field' ...";
 *   - integers that do not fit their C field, token ids outside [0, INT32_MAX], floats that
 *     do not fit a float, logprobs clamping;
 *   - unknown fields ignored; bad JSON reported with line and column;
 *   - chat messages, including list-of-parts content, passed through as given, and bad
 *     message shapes named by index;
 *   - request_params_check() accepts everything the parser produced from a valid line, so
 *     the two layers agree on what a good request is.
 */
#include "engine/batch_io.h"
#include "test.h"

#include <string.h>

static struct weld_err g_e;

/* Parse s as line 7; returns the status; the line is left for the caller to release. */
static int parse(const char *s, struct batch_line *l)
{
    memset(&g_e, 0, sizeof g_e);
    return batch_line_parse(s, strlen(s), 7, NULL, l, &g_e);
}

/* s must fail, with a message that starts with "line 7" and names want. */
static void expect_fail(const char *s, const char *want)
{
    struct batch_line l;
    int rc = parse(s, &l);
    CHECK(rc != WELD_OK);
    CHECK(!strncmp(g_e.msg, "line 7", 6));
    if (!strstr(g_e.msg, want)) {
        fprintf(stderr, "  for %s: message [%s] lacks [%s]\n", s, g_e.msg, want);
        CHECK(0);
    }
    batch_line_release(&l);
}

TEST(every_field)
{
    struct batch_line l;
    REQUIRE(parse("{\"prompt\": \"Once\", \"max_tokens\": 33, \"min_tokens\": 4, "
                  "\"temperature\": 0.25, \"top_p\": 0.5, \"top_k\": 9, \"min_p\": 0.125, "
                  "\"repetition_penalty\": 1.5, \"frequency_penalty\": -0.5, "
                  "\"presence_penalty\": 0.75, \"seed\": 12345678901, \"stop\": [\"a\", \"bc\"], "
                  "\"stop_token_ids\": [2, 0, 7], \"ignore_eos\": true, \"n\": 3, "
                  "\"logprobs\": 5, \"priority\": -4, \"cache_salt\": \"salt\", "
                  "\"include_stop_str_in_output\": true, \"skip_special_tokens\": false, "
                  "\"add_special_tokens\": false}", &l) == WELD_OK);
    const struct request_params *p = &l.p;
    CHECK_EQ_STR(p->prompt, "Once");
    CHECK(!p->prompt_ids && !p->messages);
    CHECK_EQ_INT(p->max_tokens, 33);
    CHECK_EQ_INT(p->min_tokens, 4);
    CHECK(p->sampling.temperature == 0.25f && p->sampling.top_p == 0.5f);
    CHECK_EQ_INT(p->sampling.top_k, 9);
    CHECK(p->sampling.min_p == 0.125f && p->sampling.repetition_penalty == 1.5f);
    CHECK(p->sampling.frequency_penalty == -0.5f && p->sampling.presence_penalty == 0.75f);
    CHECK(p->has_seed && p->sampling.seed == 12345678901ull);
    REQUIRE(p->n_stop == 2);
    CHECK_EQ_STR(p->stop[0], "a");
    CHECK_EQ_STR(p->stop[1], "bc");
    REQUIRE(p->n_stop_token_ids == 3);
    CHECK(p->stop_token_ids[0] == 2 && p->stop_token_ids[1] == 0 && p->stop_token_ids[2] == 7);
    CHECK(p->ignore_eos && p->include_stop_str_in_output);
    CHECK(!p->skip_special_tokens && !p->add_special_tokens);
    CHECK_EQ_INT(p->n, 3);
    CHECK_EQ_INT(p->logprobs, 5);
    CHECK_EQ_INT(p->priority, -4);
    CHECK_EQ_STR(p->cache_salt, "salt");
    CHECK(l.id == NULL);
    CHECK_EQ_INT(request_params_check(p, 0, &g_e), WELD_OK);
    batch_line_release(&l);
    CHECK(l.root == NULL && l.stops == NULL);
    batch_line_release(&l); /* twice is fine */
    batch_line_release(NULL);
}

TEST(defaults_and_nulls)
{
    struct request_params d = request_params_default();
    const char *lines[] = {
        "{\"prompt\": \"x\"}",
        "{\"prompt\": \"x\", \"max_tokens\": null, \"temperature\": null, \"stop\": null, "
        "\"stop_token_ids\": null, \"seed\": null, \"logprobs\": null, \"cache_salt\": null, "
        "\"ignore_eos\": null, \"messages\": null, \"prompt_token_ids\": null}",
        "{\"prompt\": \"x\", \"logprobs\": false}",
    };
    for (int i = 0; i < 3; i++) {
        struct batch_line l;
        REQUIRE(parse(lines[i], &l) == WELD_OK);
        CHECK_EQ_INT(l.p.max_tokens, d.max_tokens);
        CHECK(l.p.sampling.temperature == d.sampling.temperature);
        CHECK(l.p.sampling.top_p == d.sampling.top_p);
        CHECK_EQ_INT(l.p.sampling.top_k, d.sampling.top_k);
        CHECK(!l.p.has_seed && l.p.n_stop == 0 && !l.p.stop && !l.p.stop_token_ids);
        CHECK_EQ_INT(l.p.logprobs, -1);
        CHECK_EQ_INT(l.p.n, 1);
        CHECK(!l.p.cache_salt && !l.p.messages && !l.p.prompt_ids);
        CHECK(l.p.add_special_tokens && l.p.skip_special_tokens && !l.p.ignore_eos);
        batch_line_release(&l);
    }
}

TEST(prompt_forms)
{
    struct batch_line l;
    REQUIRE(parse("{\"prompt\": [1, 2, 2147483647]}", &l) == WELD_OK);
    CHECK(!l.p.prompt && l.p.n_prompt_ids == 3 && l.p.prompt_ids[2] == INT32_MAX);
    batch_line_release(&l);
    REQUIRE(parse("{\"prompt_token_ids\": [5, 6]}", &l) == WELD_OK);
    CHECK(l.p.n_prompt_ids == 2 && l.p.prompt_ids[0] == 5 && l.p.prompt_ids[1] == 6);
    batch_line_release(&l);
    REQUIRE(parse("{\"prompt_token_ids\": []}", &l) == WELD_OK);
    CHECK(l.p.prompt_ids && l.p.n_prompt_ids == 0);
    batch_line_release(&l);
    /* a single stop string; max_completion_tokens is max_tokens; an integral real */
    REQUIRE(parse("{\"prompt\": \"p\", \"stop\": \"\\n\\n\", \"max_completion_tokens\": 8.0}",
                  &l) == WELD_OK);
    CHECK(l.p.n_stop == 1 && !strcmp(l.p.stop[0], "\n\n") && l.p.max_tokens == 8);
    batch_line_release(&l);
    /* logprobs: true + top_logprobs; true alone is 0 (sampled token only) */
    REQUIRE(parse("{\"prompt\": \"p\", \"logprobs\": true, \"top_logprobs\": 3}", &l) == WELD_OK);
    CHECK_EQ_INT(l.p.logprobs, 3);
    batch_line_release(&l);
    REQUIRE(parse("{\"prompt\": \"p\", \"logprobs\": true}", &l) == WELD_OK);
    CHECK_EQ_INT(l.p.logprobs, 0);
    batch_line_release(&l);
}

TEST(openai_batch_lines_and_ids)
{
    struct batch_line l;
    REQUIRE(parse("{\"custom_id\": \"req-1\", \"method\": \"POST\", \"url\": \"/v1/completions\","
                  " \"body\": {\"prompt\": \"b\", \"max_tokens\": 5}}", &l) == WELD_OK);
    CHECK(json_is_string(l.id) && !strcmp(json_string_value(l.id), "req-1"));
    CHECK_EQ_STR(l.p.prompt, "b");
    CHECK_EQ_INT(l.p.max_tokens, 5);
    batch_line_release(&l);
    /* the body's own id wins over custom_id */
    REQUIRE(parse("{\"custom_id\": \"c\", \"body\": {\"id\": 42, \"prompt\": \"b\"}}", &l) == WELD_OK);
    CHECK(json_is_integer(l.id) && json_integer_value(l.id) == 42);
    batch_line_release(&l);
    REQUIRE(parse("{\"id\": {\"k\": [1]}, \"prompt\": \"b\"}", &l) == WELD_OK);
    CHECK(json_is_object(l.id));
    batch_line_release(&l);
    /* a bad field still reports the id */
    CHECK(parse("{\"id\": \"bad\", \"prompt\": \"b\", \"n\": \"3\"}", &l) != WELD_OK);
    CHECK(json_is_string(l.id) && !strcmp(json_string_value(l.id), "bad"));
    batch_line_release(&l);
    /* a non-object body is not unwrapped: the line itself is the request */
    REQUIRE(parse("{\"body\": 3, \"prompt\": \"top\"}", &l) == WELD_OK);
    CHECK_EQ_STR(l.p.prompt, "top");
    batch_line_release(&l);
}

TEST(bad_types)
{
    expect_fail("{\"prompt\": 3}", "'prompt'");
    expect_fail("{\"prompt\": [1, \"2\"]}", "'prompt[1]'");
    expect_fail("{\"prompt_token_ids\": \"1 2\"}", "'prompt_token_ids'");
    expect_fail("{\"prompt\": \"p\", \"stop_token_ids\": [1.5]}", "'stop_token_ids[0]'");
    expect_fail("{\"prompt\": \"p\", \"stop\": 5}", "'stop'");
    expect_fail("{\"prompt\": \"p\", \"stop\": [\"a\", 1]}", "'stop[1]'");
    const char *fkeys[] = {"temperature", "top_p", "min_p", "repetition_penalty",
                           "frequency_penalty", "presence_penalty"};
    const char *ikeys[] = {"top_k", "max_tokens", "max_completion_tokens", "min_tokens", "n",
                           "priority", "seed", "top_logprobs"};
    const char *bkeys[] = {"ignore_eos", "include_stop_str_in_output", "skip_special_tokens",
                           "add_special_tokens"};
    char line[256], want[64];
    for (int i = 0; i < 6; i++) {
        snprintf(line, sizeof line, "{\"prompt\": \"p\", \"%s\": \"1\"}", fkeys[i]);
        snprintf(want, sizeof want, "'%s'", fkeys[i]);
        expect_fail(line, want);
    }
    for (int i = 0; i < 8; i++) {
        snprintf(line, sizeof line, "{\"prompt\": \"p\", \"logprobs\": true, \"%s\": 1.5}",
                 ikeys[i]);
        snprintf(want, sizeof want, "'%s'", ikeys[i]);
        expect_fail(line, want);
    }
    for (int i = 0; i < 4; i++) {
        snprintf(line, sizeof line, "{\"prompt\": \"p\", \"%s\": 1}", bkeys[i]);
        snprintf(want, sizeof want, "'%s'", bkeys[i]);
        expect_fail(line, want);
    }
    expect_fail("{\"prompt\": \"p\", \"logprobs\": \"5\"}", "'logprobs'");
    expect_fail("{\"prompt\": \"p\", \"cache_salt\": 1}", "'cache_salt'");
    expect_fail("[1, 2]", "expected a JSON object");
    expect_fail("\"just a string\"", "line 7, column"); /* jansson wants an array/object */
}

TEST(out_of_range)
{
    expect_fail("{\"prompt\": \"p\", \"max_tokens\": 2147483648}", "'max_tokens': 2147483648");
    expect_fail("{\"prompt\": \"p\", \"n\": -2147483649}", "'n'");
    expect_fail("{\"prompt\": \"p\", \"top_k\": 1e300}", "'top_k'");
    expect_fail("{\"prompt\": [-1]}", "'prompt[0]'");
    expect_fail("{\"prompt\": [2147483648]}", "'prompt[0]'");
    expect_fail("{\"prompt\": \"p\", \"stop_token_ids\": [0, -5]}", "'stop_token_ids[1]'");
    expect_fail("{\"prompt\": \"p\", \"temperature\": 1e39}", "'temperature'");
    expect_fail("{\"prompt\": \"p\", \"presence_penalty\": -1e300}", "'presence_penalty'");
    struct batch_line l;
    /* the OpenAI / vLLM ranges are checked here, so batch and the server agree */
    expect_fail("{\"prompt\": \"p\", \"max_tokens\": 0}", "'max_tokens': 0, must be at least 1");
    expect_fail("{\"prompt\": \"p\", \"temperature\": -1}", "'temperature'");
    expect_fail("{\"prompt\": \"p\", \"logprobs\": 9223372036854775807}", "'logprobs'");
    expect_fail("{\"prompt\": \"p\", \"logprobs\": -1}", "'logprobs': -1, must be in [0, 20]");
    expect_fail("{\"prompt\": \"p\", \"logprobs\": true, \"top_logprobs\": -3}",
                "'top_logprobs'");
    /* seed: any int64, as its two's-complement bits */
    REQUIRE(parse("{\"prompt\": \"p\", \"seed\": -1}", &l) == WELD_OK);
    CHECK(l.p.has_seed && l.p.sampling.seed == UINT64_MAX);
    batch_line_release(&l);
}

/* Every field but the prompt pointer (which points into each line's own document). */
static bool params_same(const struct request_params *a, const struct request_params *b)
{
    const struct sampler_params *x = &a->sampling, *y = &b->sampling;
    return x->temperature == y->temperature && x->top_p == y->top_p && x->top_k == y->top_k &&
           x->min_p == y->min_p && x->repetition_penalty == y->repetition_penalty &&
           x->frequency_penalty == y->frequency_penalty &&
           x->presence_penalty == y->presence_penalty && x->seed == y->seed &&
           a->has_seed == b->has_seed && a->max_tokens == b->max_tokens &&
           a->min_tokens == b->min_tokens && a->n_stop == b->n_stop &&
           a->n_stop_token_ids == b->n_stop_token_ids && a->ignore_eos == b->ignore_eos &&
           a->include_stop_str_in_output == b->include_stop_str_in_output &&
           a->skip_special_tokens == b->skip_special_tokens &&
           a->add_special_tokens == b->add_special_tokens && a->n == b->n &&
           a->logprobs == b->logprobs && a->priority == b->priority &&
           !a->cache_salt == !b->cache_salt && !a->messages == !b->messages &&
           a->n_prompt_ids == b->n_prompt_ids;
}

TEST(unknown_fields_ignored)
{
    struct batch_line a, b;
    REQUIRE(parse("{\"prompt\": \"p\", \"max_tokens\": 3}", &a) == WELD_OK);
    REQUIRE(parse("{\"model\": \"gpt\", \"prompt\": \"p\", \"stream\": true, \"max_tokens\": 3, "
                  "\"user\": {\"x\": [1, null]}, \"best_of\": 1, \"echo\": 1, \"top_a\": 0.5, "
                  "\"mirostat\": 2, \"response_format\": {\"type\": \"text\"}, "
                  "\"tool_choice\": \"none\", \"guided_json\": null}",
                  &b) == WELD_OK);
    CHECK_EQ_STR(a.p.prompt, b.p.prompt);
    CHECK(params_same(&a.p, &b.p));
    CHECK_EQ_STR(a.unknown, "");
    CHECK_EQ_STR(b.unknown, "top_a, mirostat"); /* for the caller's warning line */
    batch_line_release(&a);
    batch_line_release(&b);
}

/* OpenAI / vLLM ranges, each failure naming its field */
TEST(api_ranges)
{
    const char *const bad[][2] = {
        {"\"temperature\": 2.5", "'temperature': 2.5, must be in [0, 2]"},
        {"\"temperature\": -0.1", "'temperature'"},
        {"\"top_k\": -2", "'top_k': -2"},
        {"\"presence_penalty\": 2.5", "'presence_penalty': 2.5, must be in [-2, 2]"},
        {"\"frequency_penalty\": -3", "'frequency_penalty'"},
        {"\"repetition_penalty\": 0", "'repetition_penalty': 0, must be greater than 0"},
        {"\"logprobs\": 21", "'logprobs': 21"},
        {"\"logprobs\": true, \"top_logprobs\": 21", "'top_logprobs': 21"},
        {"\"logit_bias\": {\"5\": 100.5}", "'logit_bias[5]': expected a number in [-100, 100]"},
        {"\"n\": 0", "'n': 0, must be at least 1"},
        {"\"max_tokens\": -4", "'max_tokens': -4"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char line[256];
        snprintf(line, sizeof line, "{\"prompt\": \"p\", %s}", bad[i][0]);
        expect_fail(line, bad[i][1]);
    }
    const char *const good[] = {"\"temperature\": 2", "\"temperature\": 0", "\"top_k\": -1",
                                "\"top_k\": 0", "\"top_k\": 1", "\"presence_penalty\": -2",
                                "\"frequency_penalty\": 2", "\"logprobs\": 20",
                                "\"logprobs\": 0", "\"logit_bias\": {\"5\": -100}",
                                "\"repetition_penalty\": 0.01"};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        char line[256];
        snprintf(line, sizeof line, "{\"prompt\": \"p\", %s}", good[i]);
        struct batch_line l;
        if (parse(line, &l) != WELD_OK) {
            fprintf(stderr, "  %s: %s\n", line, g_e.msg);
            CHECK(0);
        }
        batch_line_release(&l);
    }
}

/* Fields that would change the output but are not implemented: refused, naming them */
TEST(unimplemented_fields_refused)
{
    const char *const bad[][2] = {
        {"\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\"}}]", "'tools'"},
        {"\"tool_choice\": \"auto\"", "'tool_choice'"},
        {"\"tool_choice\": {\"type\": \"function\"}", "'tool_choice'"},
        {"\"suffix\": \"end\"", "'suffix'"},
        {"\"best_of\": 3", "'best_of'"},
        {"\"use_beam_search\": true", "'use_beam_search'"},
        {"\"functions\": [{\"name\": \"f\"}]", "'functions'"},
        {"\"echo\": true", "'echo'"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char line[256];
        snprintf(line, sizeof line, "{\"prompt\": \"p\", %s}", bad[i][0]);
        expect_fail(line, bad[i][1]);
    }
    /* tools shown by the template with tool_choice "none" are fine; so is best_of = n */
    struct batch_line l;
    REQUIRE(parse("{\"prompt\": \"p\", \"tools\": [{\"type\": \"function\"}], "
                  "\"tool_choice\": \"none\", \"best_of\": 2, \"n\": 2}", &l) ==
            WELD_OK);
    batch_line_release(&l);
}

/* The structured-output fields become p.grammar; bad ones are refused naming the field
   and where in it the problem is */
TEST(structured_output_fields)
{
    const char *const good[][2] = {
        {"\"response_format\": {\"type\": \"json_object\"}", "root ::="},
        {"\"response_format\": {\"type\": \"json_schema\", \"json_schema\": {\"name\": "
         "\"x\", \"schema\": {\"type\": \"object\", \"properties\": {\"a\": {\"type\": "
         "\"integer\"}}}, \"strict\": true}}",
         "integer"},
        {"\"guided_json\": \"{\\\"enum\\\": [1, 2]}\"", "root ::="},
        {"\"guided_regex\": \"a+b\"", "root ::="},
        {"\"guided_choice\": [\"yes\", \"no \\\"way\\\"\"]", "\"no \\\"way\\\"\""},
        {"\"guided_grammar\": \"root ::= [a-z]+\"", "root ::= [a-z]+"},
        {"\"structured_outputs\": {\"choice\": [\"a\"], \"backend\": \"auto\"}", "\"a\""},
        {"\"structured_outputs\": {\"json_object\": true}", "root ::="},
        {"\"grammar\": \"root ::= \\\"x\\\"\"", "root ::= \"x\""},
        {"\"json_schema\": {\"type\": \"boolean\"}", "root ::="},
        {"\"response_format\": {\"type\": \"text\"}, \"guided_regex\": \"x\"", "root ::="},
    };
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        char line[512];
        snprintf(line, sizeof line, "{\"prompt\": \"p\", %s}", good[i][0]);
        struct batch_line l;
        if (parse(line, &l) != WELD_OK || !l.p.grammar || !strstr(l.p.grammar, good[i][1])) {
            fprintf(stderr, "  %s: %s\n", good[i][0], l.p.grammar ? l.p.grammar : "(none)");
            CHECK(0);
        }
        batch_line_release(&l);
    }
    struct batch_line l;
    REQUIRE(parse("{\"prompt\": \"p\", \"response_format\": {\"type\": \"text\"}}", &l) == WELD_OK);
    CHECK(l.p.grammar == NULL);
    batch_line_release(&l);
    const char *const bad[][2] = {
        {"\"response_format\": {\"type\": \"yaml\"}", "'response_format.type'"},
        {"\"response_format\": {\"type\": \"json_schema\"}", "'response_format.json_schema'"},
        {"\"response_format\": {\"type\": \"json_schema\", \"json_schema\": {\"schema\": "
         "{\"properties\": {\"a\": {\"not\": {}}}}}}",
         "at /properties/a: \"not\" is not supported"},
        {"\"guided_json\": 3", "'guided_json': expected a JSON Schema"},
        {"\"guided_json\": \"{\\\"type\\\": \"", "not JSON"},
        {"\"guided_regex\": \"a(b\"", "'guided_regex'"},
        {"\"guided_regex\": \"(?<=a)b\"", "offset"},
        {"\"guided_choice\": []", "non-empty array"},
        {"\"guided_choice\": [\"a\", 2]", "'guided_choice[1]'"},
        {"\"guided_grammar\": 5", "GBNF"},
        {"\"guided_json\": {}, \"guided_regex\": \"a\"", "give one"},
        {"\"structured_outputs\": {\"json\": {}, \"regex\": \"a\"}", "give one"},
        {"\"structured_outputs\": {\"structural_tag\": {}}", "structural_tag"},
        {"\"guided_whitespace_pattern\": \" \"", "guided_whitespace_pattern"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char line[512];
        snprintf(line, sizeof line, "{\"prompt\": \"p\", %s}", bad[i][0]);
        expect_fail(line, bad[i][1]);
    }
}

TEST(bad_json)
{
    struct batch_line l;
    CHECK(parse("this is not json", &l) == WELD_ERR_FORMAT);
    CHECK(!strncmp(g_e.msg, "line 7, column ", 15));
    CHECK(l.id == NULL && l.root == NULL);
    batch_line_release(&l);
    CHECK(parse("{\"prompt\": \"p\"", &l) == WELD_ERR_FORMAT);
    CHECK(!strncmp(g_e.msg, "line 7, column ", 15));
    batch_line_release(&l);
    /* an empty line and a NUL inside the text */
    CHECK(parse("", &l) != WELD_OK);
    batch_line_release(&l);
    memset(&g_e, 0, sizeof g_e);
    CHECK(batch_line_parse("{\"prompt\": \"a\0b\"}", 17, 1, NULL, &l, &g_e) != WELD_OK);
    batch_line_release(&l);
}

TEST(messages)
{
    struct batch_line l;
    REQUIRE(parse("{\"messages\": [{\"role\": \"system\", \"content\": \"be brief\"}, "
                  "{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"hi \"}, "
                  "{\"type\": \"text\", \"text\": \"there\"}]}, "
                  "{\"role\": \"assistant\", \"content\": null, \"tool_calls\": []}], "
                  "\"max_tokens\": 4}", &l) == WELD_OK);
    REQUIRE(json_is_array(l.p.messages) && json_array_size(l.p.messages) == 3);
    CHECK(!l.p.prompt && !l.p.prompt_ids);
    const json_t *parts = json_object_get(json_array_get(l.p.messages, 1), "content");
    REQUIRE(json_is_array(parts) && json_array_size(parts) == 2);
    CHECK_EQ_STR(json_string_value(json_object_get(json_array_get(parts, 1), "text")), "there");
    CHECK_EQ_INT(request_params_check(&l.p, 0, &g_e), WELD_OK);
    batch_line_release(&l);
    /* in an OpenAI chat batch line */
    REQUIRE(parse("{\"custom_id\": \"c1\", \"body\": {\"messages\": [{\"role\": \"user\", "
                  "\"content\": \"x\"}]}}", &l) == WELD_OK);
    CHECK(json_array_size(l.p.messages) == 1);
    batch_line_release(&l);
    expect_fail("{\"messages\": {\"role\": \"user\"}}", "'messages'");
    expect_fail("{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}, 3]}", "'messages[1]'");
    expect_fail("{\"messages\": [{\"content\": \"a\"}]}", "'messages[0].role'");
    expect_fail("{\"messages\": [{\"role\": \"user\", \"content\": 5}]}",
                "'messages[0].content'");
    expect_fail("{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"text\"}, \"s\"]}]}",
                "'messages[0].content[1]'");
}

TEST(request_parse_object)
{
    json_t *o = json_loads("{\"prompt\": \"q\", \"top_k\": 2}", 0, NULL);
    REQUIRE(o);
    struct batch_line l;
    memset(&g_e, 0, sizeof g_e);
    REQUIRE(batch_request_parse(o, 3, NULL, &l, &g_e) == WELD_OK);
    CHECK_EQ_STR(l.p.prompt, "q");
    CHECK_EQ_INT(l.p.sampling.top_k, 2);
    CHECK(l.root == NULL);
    batch_line_release(&l);
    json_object_set_new(o, "top_k", json_string("x"));
    CHECK(batch_request_parse(o, 3, NULL, &l, &g_e) != WELD_OK);
    CHECK(!strncmp(g_e.msg, "line 3: ", 8) && strstr(g_e.msg, "'top_k'"));
    batch_line_release(&l);
    json_decref(o);
}

int main(void)
{
    RUN(every_field);
    RUN(defaults_and_nulls);
    RUN(prompt_forms);
    RUN(openai_batch_lines_and_ids);
    RUN(bad_types);
    RUN(out_of_range);
    RUN(unknown_fields_ignored);
    RUN(api_ranges);
    RUN(unimplemented_fields_refused);
    RUN(structured_output_fields);
    RUN(bad_json);
    RUN(messages);
    RUN(request_parse_object);
    return test_summary();
}
