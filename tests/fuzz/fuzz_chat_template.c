/*
 * fuzz_chat_template - parse the input as a Jinja chat template and render it with a small
 * fixed context (messages with system/user/assistant/tool roles, a tool call, tools,
 * bos/eos, add_generation_prompt) under tight limits, so any input finishes quickly.
 * Errors are expected and ignored; crashes, leaks and hangs are the findings.
 * Seeds: tests/fuzz/corpus/fuzz_chat_template/ (real templates, small).
 */
#include "core/alloc.h"
#include "template/chat_template.h"

#include <stdint.h>
#include <stdlib.h>

static const char *const fuzz_ctx_json =
    "{\"messages\": ["
    "{\"role\": \"system\", \"content\": \"sys\"},"
    "{\"role\": \"user\", \"content\": \"hi <think>x</think> \\u00e9\"},"
    "{\"role\": \"assistant\", \"content\": null, \"tool_calls\": [{\"type\": \"function\","
    " \"function\": {\"name\": \"f\", \"arguments\": {\"a\": 1}}}]},"
    "{\"role\": \"tool\", \"content\": \"42\"},"
    "{\"role\": \"assistant\", \"content\": \"done\", \"reasoning_content\": \"r\"}],"
    "\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": {}}}],"
    "\"add_generation_prompt\": true, \"bos_token\": \"<s>\", \"eos_token\": \"</s>\","
    "\"date_string\": \"26 Jul 2024\"}";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static json_t *ctx;
    if (!ctx)
        ctx = json_loads(fuzz_ctx_json, 0, NULL);
    if (!ctx)
        abort();
    struct chat_template *t = NULL;
    struct weld_err e = {0};
    if (chat_template_parse(&t, (const char *)data, size, &e) != WELD_OK)
        return 0;
    struct chat_template_opts lim = {
        .max_output = 1 << 16, .max_memory = 16 << 20, .max_steps = 200000, .max_depth = 64};
    char *out = NULL;
    if (chat_template_render_ex(t, ctx, &lim, &out, NULL, &e) == WELD_OK)
        wfree(out);
    chat_template_free(t);
    return 0;
}
