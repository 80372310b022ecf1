/*
 * cmd_serve - `weld serve MODEL`: the OpenAI-compatible HTTP server (src/server/).
 *
 * Flags follow vLLM's names: --host, --port, --served-model-name, --api-key (repeatable;
 * --api-key-file adds keys from a file), --chat-template, --shutdown-timeout, --pooling-type
 * (the embeddings' pooling, llama.cpp's --pooling and vLLM's pooling_type: last or mean),
 * --disable-log-requests; weld's own: --max-body, --send-timeout, --max-connections,
 * --max-connections-per-client, --stream-buffer-size, --stream-stall-timeout, --log-prompts;
 * tool calling as vLLM: --tool-call-parser NAME, --enable-auto-tool-choice; structured
 * outputs' --structured-outputs-config;
 * plus the engine flags every engine command shares
 * (cli_engine_opts: --max-model-len, --max-num-seqs, --max-num-batched-tokens,
 * --kv-cache-memory, --block-size, -t ...). The model may be given as the positional
 * argument or with -m. This file only maps options; server_run does the work and returns
 * after SIGINT/SIGTERM (exit 0) or a start-up failure (exit 1, message on stderr).
 */
#include "cli/cli.h"
#include "core/err.h"
#include "server/server.h"
#include "server/tools.h"

#include <stdio.h>
#include <string.h>

int cmd_serve(int argc, char **argv)
{
    struct server_opts so = server_opts_default();
    struct cli_engine_opts eo;
    cli_engine_opts_init(&eo);
    int port = so.port;
    float grace = (float)so.shutdown_timeout;
    uint64_t max_body = so.max_body;
    float send_timeout = (float)so.send_timeout;
    struct cli_strs keys = {.n = 0};
    const char *pooling = "last";
    uint64_t stream_buffer = so.stream_buffer;
    float stall = (float)so.stream_stall_timeout;
    bool no_log = false;
    const char *tool_parser = NULL, *so_config = NULL, *kv_transfer = NULL;
    const struct cli_opt extra[] = {
        {"host", 0, OPT_STR, &so.host, "ADDR", "IPv4 address to listen on (default 127.0.0.1)"},
        {"port", 0, OPT_INT, &port, "N", "TCP port (default 8000; 0: any free port, printed)"},
        {"served-model-name", 0, OPT_STR, &so.served_model_name, "NAME",
         "model name clients use (default: the model path)"},
        {"api-key", 0, OPT_STRS, &keys, "KEY",
         "require 'Authorization: Bearer KEY' (repeat for more keys; default: none)"},
        {"api-key-file", 0, OPT_STR, &so.api_key_file, "FILE",
         "more API keys, one a line (keeps them out of ps)"},
        {"chat-template", 0, OPT_STR, &so.chat_template, "FILE|NAME",
         "Jinja chat template file or a builtin (chatml, llama2, llama3, mistral, qwen, gemma) overriding the model's"},
        {"shutdown-timeout", 0, OPT_FLOAT, &grace, "S",
         "seconds running requests get after SIGTERM (default 30)"},
        {"max-body", 0, OPT_SIZE, &max_body, "BYTES",
         "request body limit (default 8M; 413 beyond)"},
        {"send-timeout", 0, OPT_FLOAT, &send_timeout, "S",
         "drop a client silent S s while sending, idle or not reading (default 15; never cuts a running request)"},
        {"max-connections", 0, OPT_INT, &so.max_connections, "N",
         "connections held at once (default 1000; 1/16 kept for /health and /metrics)"},
        {"max-connections-per-client", 0, OPT_INT, &so.max_connections_per_client, "N",
         "connections one client address may hold (default 256; 0: no limit; 429 beyond)"},
        {"pooling-type", 0, OPT_STR, &pooling, "TYPE",
         "/v1/embeddings pooling: last (default) or mean"},
        {"stream-buffer-size", 0, OPT_SIZE, &stream_buffer, "BYTES",
         "bytes queued for a client that stops reading before its stream is paused (default 1M; 0: no cap)"},
        {"stream-stall-timeout", 0, OPT_FLOAT, &stall, "S",
         "seconds a paused stream waits for its client before it is aborted (default 60; 0: forever)"},
        {"disable-log-requests", 0, OPT_FLAG, &no_log, NULL,
         "no access-log line per request on stderr"},
        {"log-prompts", 0, OPT_FLAG, &so.log_prompts, NULL,
         "add the prompt text to each access-log line (default: never logged)"},
        {"tool-call-parser", 0, OPT_STR, &tool_parser, "NAME",
         "read tool calls out of chat answers: hermes (qwen), llama3_json, mistral or deepseek_v3"},
        {"structured-outputs-config", 0, OPT_STR, &so_config, "JSON",
         "structured outputs, as vLLM: '{\"disable_any_whitespace\": true, \"disable_additional_properties\": true}'"},
        {"enable-auto-tool-choice", 0, OPT_FLAG, &so.auto_tool_choice, NULL,
         "let the model decide when to call tools (tool_choice \"auto\"; needs --tool-call-parser)"},
        {"kv-transfer-config", 0, OPT_STR, &kv_transfer, "JSON",
         "prefill/decode split, as vLLM: '{\"kv_role\": \"kv_producer\"}' (a prefill server), \"kv_consumer\" (decode) or \"kv_both\"; blocks move through the --kv-store both share"},
    };
    struct cli_opt opts[CLI_ENGINE_N_OPTS + sizeof extra / sizeof extra[0]];
    int n = cli_engine_opts_table(&eo, opts);
    memcpy(opts + n, extra, sizeof extra);
    n += (int)(sizeof extra / sizeof extra[0]);
    const char *pos[1];
    int n_pos = 0;
    int rc = cli_parse(argc, argv, "serve MODEL [options]",
                       "Serve MODEL over HTTP with the OpenAI API (/v1/completions, "
                       "/v1/chat/completions, /v1/embeddings,\n/v1/models), /tokenize, "
                       "/detokenize, /health, "
                       "/version and /metrics (Prometheus). SIGTERM drains, then exits.",
                       opts, n, pos, 1, &n_pos);
    if (rc)
        return rc == 1 ? 0 : 2;
    if (n_pos == 1)
        eo.model = pos[0];
    if (!eo.model) {
        fprintf(stderr, "weld serve: a model is required (weld serve MODEL; see --help)\n");
        return 2;
    }
    if (!(send_timeout > 0) || so.max_connections < 2 || so.max_connections_per_client < 0) {
        fprintf(stderr, "weld serve: --send-timeout must be > 0, --max-connections >= 2 and "
                "--max-connections-per-client >= 0\n");
        return 2;
    }
    if (grace < 0) {
        fprintf(stderr, "weld serve: --shutdown-timeout must be >= 0\n");
        return 2;
    }
    if (strcmp(pooling, "last") && strcmp(pooling, "mean")) {
        fprintf(stderr, "weld serve: --pooling-type %s: expected last or mean\n", pooling);
        return 2;
    }
    so.pooling = strcmp(pooling, "mean") ? REQUEST_POOLING_LAST : REQUEST_POOLING_MEAN;
    if (tool_parser && !tool_parser_from_name(tool_parser, &so.tool_parser)) {
        fprintf(stderr, "weld serve: --tool-call-parser %s: expected one of %s\n", tool_parser,
                tool_parser_names());
        return 2;
    }
    struct weld_err se = {0};
    if (so_config && cli_structured_outputs_config(so_config, &so.schema_opts, &se)) {
        fprintf(stderr, "weld serve: %s\n", se.msg);
        return 2;
    }
    if (so.auto_tool_choice && so.tool_parser == TOOL_PARSER_NONE) {
        fprintf(stderr,
                "weld serve: --enable-auto-tool-choice needs --tool-call-parser NAME "
                "(%s)\n",
                tool_parser_names());
        return 2;
    }
    if (kv_transfer && server_kv_transfer_config(kv_transfer, &so.kv_role, &se)) {
        fprintf(stderr, "weld serve: %s\n", se.msg);
        return 2;
    }
    if (so.kv_role != SERVER_KV_NONE && !eo.kv_store && !eo.kv_offload_dir) {
        fprintf(stderr, "weld serve: --kv-transfer-config: the prefill and decode servers move "
                        "KV blocks through a tier they share: give --kv-store redis://HOST[:PORT] "
                        "(or a --kv-offload-dir on a file system both see)\n");
        return 2;
    }
    if (!(stall >= 0)) {
        fprintf(stderr, "weld serve: --stream-stall-timeout must be >= 0 (0: wait forever)\n");
        return 2;
    }
    struct weld_err e = {0};
    if (cli_engine_params(&eo, &so.engine, &e)) {
        fprintf(stderr, "weld serve: %s\n", e.msg);
        return 1;
    }
    /* a decode server's loads land in pool pages never touched: fault them in at start */
    so.engine.kv_prefault = so.kv_role == SERVER_KV_CONSUMER || so.kv_role == SERVER_KV_BOTH;
    /* a prefill server's answers wait for its writes (the handoff) */
    so.engine.kv_writes_urgent = so.kv_role == SERVER_KV_PRODUCER || so.kv_role == SERVER_KV_BOTH;
    so.port = port;
    so.shutdown_timeout = grace;
    so.max_body = (size_t)max_body;
    so.send_timeout = send_timeout;
    so.api_keys = keys.v;
    so.n_api_keys = keys.n;
    so.stream_buffer = (size_t)stream_buffer;
    so.stream_stall_timeout = stall;
    so.log_requests = !no_log;
    if (server_run(&so, &e)) {
        fprintf(stderr, "weld serve: %s\n", e.msg);
        return 1;
    }
    return 0;
}
