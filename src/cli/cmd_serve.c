/*
 * cmd_serve - `weld serve MODEL`: the OpenAI-compatible HTTP server (src/server/).
 *
 * Flags follow vLLM's names: --host, --port, --served-model-name, --api-key,
 * --chat-template, --shutdown-timeout, plus the engine flags every engine command shares
 * (cli_engine_opts: --max-model-len, --max-num-seqs, --max-num-batched-tokens,
 * --kv-cache-memory, --block-size, -t ...). The model may be given as the positional
 * argument or with -m. This file only maps options; server_run does the work and returns
 * after SIGINT/SIGTERM (exit 0) or a start-up failure (exit 1, message on stderr).
 */
#include "cli/cli.h"
#include "core/err.h"
#include "server/server.h"

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
    struct cli_opt opts[CLI_ENGINE_N_OPTS + 8];
    int n = cli_engine_opts_table(&eo, opts);
    const struct cli_opt extra[] = {
        {"host", 0, OPT_STR, &so.host, "ADDR", "IPv4 address to listen on (default 127.0.0.1)"},
        {"port", 0, OPT_INT, &port, "N", "TCP port (default 8000; 0: any free port, printed)"},
        {"served-model-name", 0, OPT_STR, &so.served_model_name, "NAME", "model name clients use (default: the model path)"},
        {"api-key", 0, OPT_STR, &so.api_key, "KEY", "require 'Authorization: Bearer KEY' (default: none)"},
        {"chat-template", 0, OPT_STR, &so.chat_template, "FILE|NAME", "Jinja chat template file or a builtin (chatml, llama2, llama3, mistral, qwen, gemma) overriding the model's"},
        {"shutdown-timeout", 0, OPT_FLOAT, &grace, "S", "seconds running requests get after SIGTERM (default 30)"},
        {"max-body", 0, OPT_SIZE, &max_body, "BYTES", "request body limit (default 8M; 413 beyond)"},
    };
    memcpy(opts + n, extra, sizeof extra);
    n += (int)(sizeof extra / sizeof extra[0]);
    const char *pos[1];
    int n_pos = 0;
    int rc = cli_parse(argc, argv, "serve MODEL [options]",
                       "Serve MODEL over HTTP with the OpenAI API (/v1/completions, "
                       "/v1/chat/completions, /v1/models),\n/tokenize, /detokenize, /health, "
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
    if (grace < 0) {
        fprintf(stderr, "weld serve: --shutdown-timeout must be >= 0\n");
        return 2;
    }
    struct weld_err e = {0};
    if (cli_engine_params(&eo, &so.engine, &e)) {
        fprintf(stderr, "weld serve: %s\n", e.msg);
        return 1;
    }
    so.port = port;
    so.shutdown_timeout = grace;
    so.max_body = (size_t)max_body;
    if (server_run(&so, &e)) {
        fprintf(stderr, "weld serve: %s\n", e.msg);
        return 1;
    }
    return 0;
}
