/*
 * tools - OpenAI tool calling on /v1/chat/completions: the request's tools and
 * tool_choice, the grammar that makes a required or named call valid, and the calls read
 * back out of the model's text.
 *
 * tool_choice (OpenAI's default "auto" when tools are given, else "none"):
 *   "none"      tools are shown to the chat template; the answer is text.
 *   "auto"      the model decides; its text is read by the server's --tool-call-parser
 *               (vLLM's names and formats, which needs --enable-auto-tool-choice):
 *                 hermes (also qwen)   <tool_call>{"name": .., "arguments": {..}}</tool_call>
 *                 llama3_json          {"name": .., "parameters": {..}} (optionally after
 *                                      <|python_tag|>, several separated by ';')
 *                 mistral              [TOOL_CALLS] [{"name": .., "arguments": {..}}, ..]
 *                                      or [TOOL_CALLS]name[ARGS]{..} (newer tokenizers)
 *                 deepseek_v3          <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function
 *                                      <｜tool▁sep｜>NAME\n```json\n{..}\n```<｜tool▁call▁end｜>
 *                                      ...<｜tool▁calls▁end｜> (and V3.1's NAME<｜tool▁sep｜>{..})
 *               Text before the first call is the message's content; a call that does not
 *               parse, or whose name is not a function name (1-64 of [A-Za-z0-9_.-]),
 *               leaves the whole text as content. Special tokens are kept in the
 *               text (markers are often special tokens).
 *   "required"  the output is constrained to a JSON array of one or more
 *               {"name": NAME, "parameters": {..}} (one only with parallel_tool_calls
 *               false), each valid against its function's parameter schema (vLLM's way);
 *   {"type": "function", "function": {"name": NAME}}  the output is constrained to that
 *               function's arguments.
 * A finished choice with calls reports them as message.tool_calls (id, type "function",
 * function {name, arguments: JSON text}) with finish_reason "tool_calls".
 */
#ifndef WELD_SERVER_TOOLS_H
#define WELD_SERVER_TOOLS_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

struct server_error;

enum tool_parser {
    TOOL_PARSER_NONE = 0,
    TOOL_PARSER_HERMES,
    TOOL_PARSER_LLAMA3_JSON,
    TOOL_PARSER_MISTRAL,
    TOOL_PARSER_DEEPSEEK_V3,
};

enum tool_choice {
    TOOL_CHOICE_NONE = 0,
    TOOL_CHOICE_AUTO,
    TOOL_CHOICE_REQUIRED,
    TOOL_CHOICE_NAMED
};

/* "hermes", "qwen", "llama3_json", "mistral", "deepseek_v3" -> *p; false if unknown. */
bool tool_parser_from_name(const char *name, enum tool_parser *p);
/* The names, for messages ("hermes, qwen, ..."). */
const char *tool_parser_names(void);

struct server_tools {
    enum tool_choice choice;
    enum tool_parser parser; /* AUTO: how the text is read */
    bool parallel;           /* parallel_tool_calls (default true) */
    char *named;             /* NAMED: the function's name */
    char *gbnf;              /* REQUIRED, NAMED: the output's grammar */
};

/* tools / tool_choice / parallel_tool_calls of a chat body (none given: choice NONE).
   parser and auto_ok: the server's --tool-call-parser and --enable-auto-tool-choice.
   Errors are 400s naming the field. */
struct schema_opts;
int server_tools_parse(const json_t *body, enum tool_parser parser, bool auto_ok,
                       const struct schema_opts *opts, struct server_tools *t,
                       struct server_error *e);
void server_tools_release(struct server_tools *t);

struct tool_call {
    char *name;
    char *arguments; /* compact JSON */
};

/* The calls in a finished choice's text[0, len): *n_calls of them in *calls (NULL when
   none), and *content_len, the length of the text before them that is the content (len
   when there are none). */
int server_tools_extract(const struct server_tools *t, const char *text, size_t len,
                         size_t *content_len, struct tool_call **calls, int *n_calls);
/* Streaming, choice AUTO: how much of text[0, len) may go out as content now: up to the
   first call's marker, or, while none is seen, up to the longest tail that could begin
   one. REQUIRED and NAMED: 0 (the text is the call). */
size_t server_tools_content_prefix(const struct server_tools *t, const char *text, size_t len);
void tool_calls_free(struct tool_call *c, int n);
/* The OpenAI tool_calls array (ids "call_<the response id's hex><choice><i>"), new
   reference. */
json_t *tool_calls_json(const struct tool_call *c, int n, const char *id, int choice);

#endif
