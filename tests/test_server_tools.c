/*
 * test_server_tools - tool calling's request side and parsers (server/tools.h): every
 * parser on hand-written model outputs (content before the calls, several calls, broken
 * calls left as content, parallel_tool_calls false), the streaming content prefix, the
 * request checks, and the required / named grammars compiled and run over hand-written
 * outputs with the grammar matcher.
 */
#include "core/alloc.h"
#include "grammar/grammar.h"
#include "server/openai.h"
#include "server/tools.h"
#include "test.h"

#include <string.h>

static struct server_tools T(enum tool_choice c, enum tool_parser p)
{
    return (struct server_tools){.choice = c, .parser = p, .parallel = true};
}

/* Extract from text; want: "name|args;name|args" of the calls or "" for none; content: the
   expected content prefix. */
static int check(const struct server_tools *t, const char *text, const char *want,
                 const char *content)
{
    struct tool_call *c;
    int n;
    size_t cl;
    if (server_tools_extract(t, text, strlen(text), &cl, &c, &n) != WELD_OK)
        return 0;
    char got[1024] = "";
    for (int i = 0; i < n; i++)
        snprintf(got + strlen(got), sizeof got - strlen(got), "%s%s|%s", i ? ";" : "",
                 c[i].name, c[i].arguments);
    int ok = !strcmp(got, want) && cl == strlen(content) && !strncmp(text, content, cl);
    if (!ok)
        fprintf(stderr, "  [%s] -> [%s] content %zu (want [%s], content [%s])\n", text, got, cl,
                want, content);
    tool_calls_free(c, n);
    return ok;
}

TEST(hermes)
{
    struct server_tools t = T(TOOL_CHOICE_AUTO, TOOL_PARSER_HERMES);
    CHECK(check(&t, "Let me look.<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
                    "{\"city\": \"Paris\"}}\n</tool_call>", "get_weather|{\"city\":\"Paris\"}",
                "Let me look."));
    CHECK(check(&t, "<tool_call>{\"name\": \"a\", \"arguments\": {}}</tool_call>\n<tool_call>"
                    "{\"name\": \"b\", \"arguments\": {\"x\": [1, 2]}}</tool_call>",
                "a|{};b|{\"x\":[1,2]}", ""));
    /* unterminated at the end of the text (max_tokens after the JSON): still a call */
    CHECK(check(&t, "<tool_call>{\"name\": \"a\", \"arguments\": {\"k\": 1}}", "a|{\"k\":1}", ""));
    /* arguments given as JSON text */
    CHECK(check(&t, "<tool_call>{\"name\": \"a\", \"arguments\": \"{\\\"k\\\": 2}\"}</tool_call>",
                "a|{\"k\":2}", ""));
    /* broken: the whole text is content */
    const char *bad[] = {"no calls here",
                         "<tool_call>{\"name\": \"a\", \"arguments\": {",
                         "<tool_call>{\"name\": \"two words\", \"arguments\": {}}</tool_call>",
                         "<tool_call>{\"arguments\": {}}</tool_call>",
                         "<tool_call>[1, 2]</tool_call>",
                         "<tool_call>{\"name\": \"a\"} junk"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        CHECK(check(&t, bad[i], "", bad[i]));
    t.parallel = false;
    CHECK(check(&t, "<tool_call>{\"name\": \"a\", \"arguments\": {}}</tool_call><tool_call>"
                    "{\"name\": \"b\", \"arguments\": {}}</tool_call>", "a|{}", ""));
}

TEST(llama3_json)
{
    struct server_tools t = T(TOOL_CHOICE_AUTO, TOOL_PARSER_LLAMA3_JSON);
    CHECK(check(&t, "{\"name\": \"f\", \"parameters\": {\"a\": \"b\"}}", "f|{\"a\":\"b\"}", ""));
    CHECK(check(&t, "  <|python_tag|>{\"name\": \"f\", \"parameters\": {}}; "
                    "{\"name\": \"g\", \"parameters\": {\"n\": 1}}", "f|{};g|{\"n\":1}", ""));
    CHECK(check(&t, "The answer is 4.", "", "The answer is 4."));
    CHECK(check(&t, "{\"name\": \"f\", \"parameters\": {}} and more", "",
                "{\"name\": \"f\", \"parameters\": {}} and more"));
    CHECK(check(&t, "{\"not\": \"a call\"}", "", "{\"not\": \"a call\"}"));
}

TEST(mistral)
{
    struct server_tools t = T(TOOL_CHOICE_AUTO, TOOL_PARSER_MISTRAL);
    CHECK(check(&t, "[TOOL_CALLS] [{\"name\": \"f\", \"arguments\": {\"x\": 1}}, {\"name\": "
                    "\"g\", \"arguments\": {}}]", "f|{\"x\":1};g|{}", ""));
    CHECK(check(&t, "Sure.[TOOL_CALLS]f[ARGS]{\"x\": true}[TOOL_CALLS]g[ARGS]{}",
                "f|{\"x\":true};g|{}", "Sure."));
    CHECK(check(&t, "[TOOL_CALLS] [", "", "[TOOL_CALLS] ["));
    /* a name that is not a function name: not a call (the fuzzer's find) */
    CHECK(check(&t, "[TOOL_CALLS]a b[ARGS]{}", "", "[TOOL_CALLS]a b[ARGS]{}"));
}

#define CB "<\xef\xbd\x9ctool\xe2\x96\x81" "calls\xe2\x96\x81" "begin\xef\xbd\x9c>"
#define CE "<\xef\xbd\x9ctool\xe2\x96\x81" "calls\xe2\x96\x81" "end\xef\xbd\x9c>"
#define B "<\xef\xbd\x9ctool\xe2\x96\x81" "call\xe2\x96\x81" "begin\xef\xbd\x9c>"
#define E "<\xef\xbd\x9ctool\xe2\x96\x81" "call\xe2\x96\x81" "end\xef\xbd\x9c>"
#define S "<\xef\xbd\x9ctool\xe2\x96\x81" "sep\xef\xbd\x9c>"

TEST(deepseek_v3)
{
    struct server_tools t = T(TOOL_CHOICE_AUTO, TOOL_PARSER_DEEPSEEK_V3);
    CHECK(check(&t, "Checking." CB B "function" S "get_weather\n```json\n{\"city\": \"Oslo\"}\n```"
                    E B "function" S "f\n```json\n{}\n```" E CE,
                "get_weather|{\"city\":\"Oslo\"};f|{}", "Checking."));
    CHECK(check(&t, CB B "f" S "{\"a\": 1}" E CE, "f|{\"a\":1}", "")); /* V3.1 */
    CHECK(check(&t, CB B "function" S "f\n```json\n{\"a\":", "", CB B "function" S "f\n```json\n{\"a\":"));
}

TEST(required_and_named_outputs)
{
    struct server_tools t = T(TOOL_CHOICE_REQUIRED, TOOL_PARSER_NONE);
    CHECK(check(&t, " [{\"name\": \"f\", \"parameters\": {\"a\": 1}}, {\"name\": \"g\", "
                    "\"parameters\": {}}]", "f|{\"a\":1};g|{}", ""));
    CHECK(check(&t, "[", "", "["));
    t = T(TOOL_CHOICE_NAMED, TOOL_PARSER_NONE);
    t.named = "f";
    CHECK(check(&t, "{\"a\": [1, {\"b\": null}]}", "f|{\"a\":[1,{\"b\":null}]}", ""));
}

TEST(streaming_content_prefix)
{
    struct server_tools t = T(TOOL_CHOICE_AUTO, TOOL_PARSER_HERMES);
    const char *s = "Hello <tool_c";
    CHECK_EQ_INT((int)server_tools_content_prefix(&t, s, strlen(s)), 6); /* "<tool_c" held */
    s = "Hello <tool_call>{";
    CHECK_EQ_INT((int)server_tools_content_prefix(&t, s, strlen(s)), 6);
    s = "Hello <b>";
    CHECK_EQ_INT((int)server_tools_content_prefix(&t, s, strlen(s)), (int)strlen(s));
    t.parser = TOOL_PARSER_LLAMA3_JSON;
    CHECK_EQ_INT((int)server_tools_content_prefix(&t, "  ", 2), 0);
    CHECK_EQ_INT((int)server_tools_content_prefix(&t, " {\"na", 5), 0);
    CHECK_EQ_INT((int)server_tools_content_prefix(&t, " <|pyt", 6), 0);
    CHECK_EQ_INT((int)server_tools_content_prefix(&t, " Sure", 5), 5);
    t.parser = TOOL_PARSER_MISTRAL;
    CHECK_EQ_INT((int)server_tools_content_prefix(&t, "ok [TOOL", 8), 3);
    t = T(TOOL_CHOICE_REQUIRED, TOOL_PARSER_NONE);
    CHECK_EQ_INT((int)server_tools_content_prefix(&t, "[{", 2), 0);
    t = T(TOOL_CHOICE_NONE, TOOL_PARSER_NONE);
    CHECK_EQ_INT((int)server_tools_content_prefix(&t, "<tool_call>", 11), 11);
}

static int parse_body(const char *body, enum tool_parser p, bool auto_ok, struct server_tools *t,
                      struct server_error *e)
{
    json_t *j = json_loads(body, 0, NULL);
    if (!j)
        return -1;
    int rc = server_tools_parse(j, p, auto_ok, NULL, t, e);
    json_decref(j);
    return rc;
}

#define WEATHER "{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", " \
                "\"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": " \
                "\"string\"}, \"days\": {\"type\": \"integer\"}}, \"required\": [\"city\"], " \
                "\"additionalProperties\": false}}}"
#define TREE "{\"type\": \"function\", \"function\": {\"name\": \"tree\", \"parameters\": " \
             "{\"$ref\": \"#/$defs/node\", \"$defs\": {\"node\": {\"type\": \"object\", " \
             "\"properties\": {\"kids\": {\"type\": \"array\", \"items\": {\"$ref\": " \
             "\"#/$defs/node\"}, \"maxItems\": 2}}, \"required\": [\"kids\"], " \
             "\"additionalProperties\": false}}}}}"

/* Does the compiled grammar accept s whole? */
static bool accepts(const char *gbnf, const char *s)
{
    struct grammar *g;
    struct weld_err e;
    if (grammar_parse_gbnf(&g, gbnf, strlen(gbnf), NULL, &e) != WELD_OK) {
        fprintf(stderr, "  %s\n", e.msg);
        return false;
    }
    struct gmatch *m;
    gmatch_create(&m, g, &e);
    bool ok = gmatch_accept(m, (const uint8_t *)s, strlen(s)) && gmatch_can_end(m);
    gmatch_free(m);
    grammar_free(g);
    return ok;
}

TEST(request_fields_and_grammars)
{
    struct server_tools t;
    struct server_error e;
    /* required: an array of calls, each valid against its function's schema; $refs of a
       function resolve inside the combined grammar */
    REQUIRE(parse_body("{\"tools\": [" WEATHER ", " TREE "], \"tool_choice\": \"required\"}",
                       TOOL_PARSER_NONE, false, &t, &e) == 0);
    CHECK(t.choice == TOOL_CHOICE_REQUIRED && t.gbnf);
    CHECK(accepts(t.gbnf, "[{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\"}}]"));
    CHECK(accepts(t.gbnf, "[{\"name\": \"tree\", \"parameters\": {\"kids\": [{\"kids\": []}]}}, "
                          "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"x\", "
                          "\"days\": 3}}]"));
    CHECK(!accepts(t.gbnf, "[]"));
    CHECK(!accepts(t.gbnf, "[{\"name\": \"get_weather\", \"parameters\": {\"days\": 3}}]"));
    CHECK(!accepts(t.gbnf, "[{\"name\": \"nope\", \"parameters\": {}}]"));
    CHECK(!accepts(t.gbnf, "[{\"name\": \"tree\", \"parameters\": {\"kids\": [{}]}}]"));
    server_tools_release(&t);
    REQUIRE(parse_body("{\"tools\": [" WEATHER "], \"tool_choice\": \"required\", "
                       "\"parallel_tool_calls\": false}", TOOL_PARSER_NONE, false, &t, &e) == 0);
    CHECK(!accepts(t.gbnf, "[{\"name\": \"get_weather\", \"parameters\": {\"city\": \"a\"}}, "
                           "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"b\"}}]"));
    server_tools_release(&t);
    /* named: the arguments themselves */
    REQUIRE(parse_body("{\"tools\": [" WEATHER ", " TREE "], \"tool_choice\": {\"type\": "
                       "\"function\", \"function\": {\"name\": \"tree\"}}}", TOOL_PARSER_NONE,
                       false, &t, &e) == 0);
    CHECK(t.choice == TOOL_CHOICE_NAMED && !strcmp(t.named, "tree"));
    CHECK(accepts(t.gbnf, "{\"kids\": [{\"kids\": []}, {\"kids\": []}]}"));
    CHECK(!accepts(t.gbnf, "{\"kids\": [{\"kids\": []}, {\"kids\": []}, {\"kids\": []}]}"));
    server_tools_release(&t);
    /* auto needs the server's flags; none renders tools and reads nothing */
    CHECK(parse_body("{\"tools\": [" WEATHER "]}", TOOL_PARSER_HERMES, false, &t, &e) == 400);
    CHECK(strstr(e.msg, "--enable-auto-tool-choice") != NULL);
    REQUIRE(parse_body("{\"tools\": [" WEATHER "]}", TOOL_PARSER_HERMES, true, &t, &e) == 0);
    CHECK(t.choice == TOOL_CHOICE_AUTO && !t.gbnf);
    server_tools_release(&t);
    REQUIRE(parse_body("{\"tools\": [" WEATHER "], \"tool_choice\": \"none\"}", TOOL_PARSER_NONE,
                       false, &t, &e) == 0);
    CHECK(t.choice == TOOL_CHOICE_NONE);
    server_tools_release(&t);
    const char *const bad[][2] = {
        {"{\"tools\": {}}", "'tools'"},
        {"{\"tools\": [{\"type\": \"retrieval\"}]}", "'tools[0].type'"},
        {"{\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"a b\"}}]}",
         "'tools[0].function.name'"},
        {"{\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": "
         "[]}}], \"tool_choice\": \"required\"}", "'tools[0].function.parameters'"},
        {"{\"tools\": [" WEATHER ", {\"type\": \"function\", \"function\": {\"name\": \"g\", "
         "\"parameters\": {\"type\": \"object\", \"patternProperties\": {}}}}], "
         "\"tool_choice\": \"required\"}", "'tools[1].function.parameters': json_schema: at /: "
         "\"patternProperties\""},
        {"{\"tool_choice\": \"required\"}", "needs 'tools'"},
        {"{\"tools\": [" WEATHER "], \"tool_choice\": \"sometimes\"}", "'tool_choice'"},
        {"{\"tools\": [" WEATHER "], \"tool_choice\": {\"type\": \"function\", \"function\": "
         "{\"name\": \"nope\"}}}", "no tool named 'nope'"},
        {"{\"tools\": [" WEATHER "], \"parallel_tool_calls\": 1}", "'parallel_tool_calls'"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int rc = parse_body(bad[i][0], TOOL_PARSER_HERMES, true, &t, &e);
        if (rc != 400 || !strstr(e.msg, bad[i][1])) {
            fprintf(stderr, "  %s -> %d [%s], want [%s]\n", bad[i][0], rc, e.msg, bad[i][1]);
            CHECK(0);
        }
        server_tools_release(&t);
    }
    enum tool_parser p;
    CHECK(tool_parser_from_name("qwen", &p) && p == TOOL_PARSER_HERMES);
    CHECK(!tool_parser_from_name("pythonic", &p));
}

TEST(tool_calls_json_shape)
{
    struct tool_call c[2] = {{"f", "{\"a\":1}"}, {"g", "{}"}};
    json_t *a = tool_calls_json(c, 2, "chatcmpl-abc12", 3);
    REQUIRE(json_array_size(a) == 2);
    const json_t *x = json_array_get(a, 1);
    CHECK_EQ_STR(json_string_value(json_object_get(x, "id")), "call_abc1231");
    CHECK_EQ_STR(json_string_value(json_object_get(x, "type")), "function");
    CHECK_EQ_STR(json_string_value(json_object_get(json_object_get(x, "function"), "name")), "g");
    CHECK_EQ_STR(json_string_value(json_object_get(json_object_get(x, "function"), "arguments")),
                 "{}");
    json_decref(a);
}

int main(void)
{
    RUN(hermes);
    RUN(llama3_json);
    RUN(mistral);
    RUN(deepseek_v3);
    RUN(required_and_named_outputs);
    RUN(streaming_content_prefix);
    RUN(request_fields_and_grammars);
    RUN(tool_calls_json_shape);
    return test_summary();
}
