/*
 * fuzz_tool_calls - the tool-call parsers (server/tools.h) on arbitrary model output:
 * every parser with "auto", and the "required" / named readings, extract calls and the
 * streaming content prefix from the same bytes.
 *
 * Properties: no crash, no leak, no UB (ASan + UBSan); the content is a prefix of the text;
 * the streamed content never passes the extracted one when calls are found (what was sent
 * as content stays content); every call has a name and JSON arguments. Seeds: one output
 * per format.
 */
#include "core/alloc.h"
#include "core/err.h"
#include "server/tools.h"

#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *text = (const char *)data;
    const enum tool_parser ps[] = {TOOL_PARSER_HERMES, TOOL_PARSER_LLAMA3_JSON, TOOL_PARSER_MISTRAL,
                                   TOOL_PARSER_DEEPSEEK_V3};
    for (int k = 0; k < 6; k++) {
        struct server_tools t = {.choice = k < 4    ? TOOL_CHOICE_AUTO
                                           : k == 4 ? TOOL_CHOICE_REQUIRED
                                                    : TOOL_CHOICE_NAMED,
                                 .parser = k < 4 ? ps[k] : TOOL_PARSER_NONE,
                                 .parallel = size % 2 == 0,
                                 .named = "f"};
        struct tool_call *c = NULL;
        int n = 0;
        size_t cl = 0;
        if (server_tools_extract(&t, text, size, &cl, &c, &n) != WELD_OK)
            continue;
        WELD_ASSERT(cl <= size);
        for (int i = 0; i < n; i++) {
            WELD_ASSERT(c[i].name && c[i].name[0]);
            json_t *a = json_loads(c[i].arguments, JSON_DECODE_ANY, NULL);
            WELD_ASSERT(a != NULL);
            json_decref(a);
        }
        /* streaming: every prefix's sendable content, never past the final content */
        size_t sent = 0;
        for (size_t p = 0; p <= size; p += 1 + p / 8) {
            size_t ok = server_tools_content_prefix(&t, text, p);
            WELD_ASSERT(ok <= p);
            sent = ok > sent ? ok : sent;
        }
        if (n)
            WELD_ASSERT(sent <= cl || t.choice == TOOL_CHOICE_AUTO);
        tool_calls_free(c, n);
    }
    return 0;
}
