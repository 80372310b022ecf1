/*
 * chat_builtin - well-known chat templates by name, for models that ship none
 * (`--chat-template chatml` on generate, batch, chat and serve), and the one loader the
 * commands share for "--chat-template FILE|NAME".
 *
 * The sources are the public Hugging Face templates, byte for byte:
 *   chatml   ChatML as transformers' default (<|im_start|>role\n...<|im_end|>\n)
 *   llama2   meta-llama/Llama-2-7b-chat-hf ([INST] ... [/INST], <<SYS>> block)
 *   llama3   meta-llama/Meta-Llama-3-8B-Instruct (<|start_header_id|>role<|end_header_id|>)
 *   mistral  mistralai/Mistral-7B-Instruct-v0.1 ([INST] ... [/INST], system message folded
 *            into the first user turn)
 *   qwen     Qwen/Qwen2.5-7B-Instruct (ChatML with Qwen's default system message, tools)
 *   gemma    google/gemma-2-2b-it (<start_of_turn>user / model; no system role)
 * Each is also in tests/data/chat_templates.json (under its reference name), where
 * tests/node/chat_template_ref.js renders it with @huggingface/jinja; the C test checks that
 * the two copies stay equal, so every builtin is covered by the reference renders.
 *
 * chat_template_load resolves an existing file first, then a builtin name (so a file that
 * happens to be called "chatml" still wins), and parses the result so that a broken
 * template fails when the command starts, not at the first request.
 */
#include "core/alloc.h"
#include "core/mfile.h"
#include "template/chat_template.h"

#include <errno.h>
#include <string.h>
#include <sys/stat.h>

static const char tmpl_chatml[] =
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['con"
    "tent'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_star"
    "t|>assistant\\n' }}{% endif %}";

static const char tmpl_llama2[] =
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set s"
    "ystem_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}{"
    "% set system_message = false %}{% endif %}{% for message in loop_messages %}{% if (mes"
    "sage['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation r"
    "oles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if loop.index0"
    " == 0 and system_message != false %}{% set content = '<<SYS>>\\n' + system_message + '"
    "\\n<</SYS>>\\n\\n' + message['content'] %}{% else %}{% set content = message['content'"
    "] %}{% endif %}{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.st"
    "rip() + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip("
    ") + ' ' + eos_token }}{% endif %}{% endfor %}";

static const char tmpl_llama3[] =
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '"
    "<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content']"
    " | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content"
    " %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_heade"
    "r_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}";

static const char tmpl_mistral[] =
    "{%- if messages[0]['role'] == 'system' %}\n"
    "    {%- set system_message = messages[0]['content'] %}\n"
    "    {%- set loop_messages = messages[1:] %}\n"
    "{%- else %}\n"
    "    {%- set loop_messages = messages %}\n"
    "{%- endif %}\n"
    "\n"
    "{{- bos_token }}\n"
    "{%- for message in loop_messages %}\n"
    "    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}\n"
    "        {{- raise_exception('After the optional system message, conversation roles mus"
    "t alternate user/assistant/user/assistant/...') }}\n"
    "    {%- endif %}\n"
    "    {%- if message['role'] == 'user' %}\n"
    "        {%- if loop.first and system_message is defined %}\n"
    "            {{- ' [INST] ' + system_message + '\\n\\n' + message['content'] + ' [/INST"
    "]' }}\n"
    "        {%- else %}\n"
    "            {{- ' [INST] ' + message['content'] + ' [/INST]' }}\n"
    "        {%- endif %}\n"
    "    {%- elif message['role'] == 'assistant' %}\n"
    "        {{- ' ' + message['content'] + eos_token}}\n"
    "    {%- else %}\n"
    "        {{- raise_exception('Only user and assistant roles are supported, with the exc"
    "eption of an initial optional system message!') }}\n"
    "    {%- endif %}\n"
    "{%- endfor %}\n";

static const char tmpl_qwen[] =
    "{%- if tools %}\n"
    "    {{- '<|im_start|>system\\n' }}\n"
    "    {%- if messages[0]['role'] == 'system' %}\n"
    "        {{- messages[0]['content'] }}\n"
    "    {%- else %}\n"
    "        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}"
    "\n"
    "    {%- endif %}\n"
    "    {{- \"\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the use"
    "r query.\\n\\nYou are provided with function signatures within <tools></tools> XML tag"
    "s:\\n<tools>\" }}\n"
    "    {%- for tool in tools %}\n"
    "        {{- \"\\n\" }}\n"
    "        {{- tool | tojson }}\n"
    "    {%- endfor %}\n"
    "    {{- \"\\n</tools>\\n\\nFor each function call, return a json object with function "
    "name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\\"name"
    "\\\": <function-name>, \\\"arguments\\\": <args-json-object>}\\n</tool_call><|im_end|>"
    "\\n\" }}\n"
    "{%- else %}\n"
    "    {%- if messages[0]['role'] == 'system' %}\n"
    "        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}\n"
    "    {%- else %}\n"
    "        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a he"
    "lpful assistant.<|im_end|>\\n' }}\n"
    "    {%- endif %}\n"
    "{%- endif %}\n"
    "{%- for message in messages %}\n"
    "    {%- if (message.role == \"user\") or (message.role == \"system\" and not loop.firs"
    "t) or (message.role == \"assistant\" and not message.tool_calls) %}\n"
    "        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '"
    "\\n' }}\n"
    "    {%- elif message.role == \"assistant\" %}\n"
    "        {{- '<|im_start|>' + message.role }}\n"
    "        {%- if message.content %}\n"
    "            {{- '\\n' + message.content }}\n"
    "        {%- endif %}\n"
    "        {%- for tool_call in message.tool_calls %}\n"
    "            {%- if tool_call.function is defined %}\n"
    "                {%- set tool_call = tool_call.function %}\n"
    "            {%- endif %}\n"
    "            {{- '\\n<tool_call>\\n{\"name\": \"' }}\n"
    "            {{- tool_call.name }}\n"
    "            {{- '\", \"arguments\": ' }}\n"
    "            {{- tool_call.arguments | tojson }}\n"
    "            {{- '}\\n</tool_call>' }}\n"
    "        {%- endfor %}\n"
    "        {{- '<|im_end|>\\n' }}\n"
    "    {%- elif message.role == \"tool\" %}\n"
    "        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != \"tool\") %}\n"
    "            {{- '<|im_start|>user' }}\n"
    "        {%- endif %}\n"
    "        {{- '\\n<tool_response>\\n' }}\n"
    "        {{- message.content }}\n"
    "        {{- '\\n</tool_response>' }}\n"
    "        {%- if loop.last or (messages[loop.index0 + 1].role != \"tool\") %}\n"
    "            {{- '<|im_end|>\\n' }}\n"
    "        {%- endif %}\n"
    "    {%- endif %}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "    {{- '<|im_start|>assistant\\n' }}\n"
    "{%- endif %}\n";

static const char tmpl_gemma[] =
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role"
    " not supported') }}{% endif %}{% for message in messages %}{% if (message['role'] == '"
    "user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alterna"
    "te user/assistant/user/assistant/...') }}{% endif %}{% if (message['role'] == 'assista"
    "nt') %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}{% endif %}{{"
    " '<start_of_turn>' + role + '\n"
    "' + message['content'] | trim + '<end_of_turn>\n"
    "' }}{% endfor %}{% if add_generation_prompt %}{{'<start_of_turn>model\n"
    "'}}{% endif %}";

static const struct {
    const char *name, *src;
} builtins[] = {
    {"chatml", tmpl_chatml}, {"llama2", tmpl_llama2}, {"llama3", tmpl_llama3},
    {"mistral", tmpl_mistral}, {"qwen", tmpl_qwen},   {"gemma", tmpl_gemma},
};
#define N_BUILTINS (int)(sizeof builtins / sizeof builtins[0])

const char *chat_template_builtin(const char *name)
{
    for (int i = 0; name && i < N_BUILTINS; i++)
        if (!strcmp(builtins[i].name, name))
            return builtins[i].src;
    return NULL;
}

const char *chat_template_builtin_name(int i)
{
    return i >= 0 && i < N_BUILTINS ? builtins[i].name : NULL;
}

const char *chat_template_builtin_names(void)
{
    return "chatml, llama2, llama3, mistral, qwen, gemma";
}

int chat_template_load(const char *file_or_name, char **src, struct weld_err *e)
{
    *src = NULL;
    struct stat st;
    const char *b = chat_template_builtin(file_or_name);
    int rc;
    if (stat(file_or_name, &st) == 0) {
        size_t len = 0;
        if ((rc = file_read_all(file_or_name, src, &len, e)))
            return rc;
        if (strlen(*src) != len) {
            wfree(*src);
            *src = NULL;
            return err_set(e, WELD_ERR_FORMAT, "%s: not a text file (NUL byte)", file_or_name);
        }
    } else if (!b) {
        return err_set(e, WELD_ERR_NOT_FOUND,
                       "'%s': no such file (%s), nor a builtin template name (%s)",
                       file_or_name, strerror(errno), chat_template_builtin_names());
    } else if (!(*src = wstrdup(b))) {
        return err_set(e, WELD_ERR_NOMEM, "out of memory");
    }
    struct chat_template *t = NULL;
    if ((rc = chat_template_parse(&t, *src, strlen(*src), e))) {
        wfree(*src);
        *src = NULL;
        return err_prefix(e, "%s", file_or_name);
    }
    chat_template_free(t);
    return WELD_OK;
}
