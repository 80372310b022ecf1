/*
 * cmd_router - `weld router`: the OpenAI-compatible front of a fleet of `weld serve`
 * workers (src/router/).
 *
 * Flags follow SGLang's router and vLLM's names where they have one: --worker URL
 * (repeatable, up to 16; more with --worker-file, re-read on SIGHUP), --policy
 * round_robin|least_load|cache_aware, --cache-threshold, --balance-abs-threshold,
 * --balance-rel-threshold, --max-tree-size, --health-check-interval,
 * --health-check-timeout, --health-failure-threshold, --max-retries, --pd with --prefill
 * URL and --decode URL (and --prefill-policy, --decode-policy); the HTTP flags are weld
 * serve's (--host, --port, --api-key, --api-key-file, --shutdown-timeout, --max-body,
 * --send-timeout, --max-connections, --max-connections-per-client, --stream-buffer-size,
 * --disable-log-requests). This file only maps options; router_run does the work and
 * returns after SIGINT/SIGTERM (exit 0) or a start-up failure (exit 1, message on stderr).
 */
#include "cli/cli.h"
#include "core/err.h"
#include "router/router.h"

#include <stdio.h>
#include <string.h>

static int policy_arg(const char *flag, const char *name, enum router_policy *p)
{
    if (name && !policy_from_name(name, p)) {
        fprintf(stderr, "weld router: %s %s: expected round_robin, least_load or cache_aware\n",
                flag, name);
        return 2;
    }
    return 0;
}

int cmd_router(int argc, char **argv)
{
    struct router_opts ro = router_opts_default();
    struct cli_strs workers = {.n = 0}, prefill = {.n = 0}, decode = {.n = 0}, keys = {.n = 0};
    const char *policy = NULL, *prefill_policy = NULL, *decode_policy = NULL;
    float interval = (float)ro.health_interval, htimeout = (float)ro.health_timeout;
    float threshold = (float)ro.cache_threshold, bal_abs = (float)ro.balance_abs;
    float bal_rel = (float)ro.balance_rel, grace = (float)ro.shutdown_timeout;
    float connect = (float)ro.connect_timeout, req_timeout = (float)ro.request_timeout;
    float send_timeout = (float)ro.send_timeout;
    uint64_t tree = ro.max_tree_size, max_body = ro.max_body, stream_buffer = ro.stream_buffer;
    bool no_log = false;
    const struct cli_opt opts[] = {
        {"worker", 0, OPT_STRS, &workers, "URL",
         "a `weld serve` worker, e.g. http://127.0.0.1:8001 (repeat for more, up to 16)"},
        {"worker-file", 0, OPT_STR, &ro.worker_file, "FILE",
         "more workers, one URL a line ('#' comments); re-read on SIGHUP"},
        {"policy", 0, OPT_STR, &policy, "NAME",
         "round_robin, least_load or cache_aware (default: cache_aware)"},
        {"cache-threshold", 0, OPT_FLOAT, &threshold, "F",
         "cache_aware: go to the worker with the longest prefix when it covers more than F of the text (default 0.5)"},
        {"balance-abs-threshold", 0, OPT_FLOAT, &bal_abs, "N",
         "cache_aware: loads are imbalanced when max - min > N requests ... (default 32)"},
        {"balance-rel-threshold", 0, OPT_FLOAT, &bal_rel, "F",
         "... and max > F x min; then the least loaded wins (default 1.5)"},
        {"max-tree-size", 0, OPT_SIZE, &tree, "CHARS",
         "cache_aware: bytes of request text remembered per worker, LRU beyond (default 16M)"},
        {"health-check-interval", 0, OPT_FLOAT, &interval, "S",
         "seconds between GET /health checks of each worker (default 2)"},
        {"health-check-timeout", 0, OPT_FLOAT, &htimeout, "S",
         "seconds a check may take (default 1)"},
        {"health-failure-threshold", 0, OPT_INT, &ro.health_failures, "N",
         "failed checks in a row that take a worker out of rotation (default 3)"},
        {"max-retries", 0, OPT_INT, &ro.max_retries, "N",
         "other workers tried when one fails before answering (default 2)"},
        {"connect-timeout", 0, OPT_FLOAT, &connect, "S",
         "seconds to connect to a worker (default 5)"},
        {"request-timeout", 0, OPT_FLOAT, &req_timeout, "S",
         "seconds a worker may take to answer (a stream: its first bytes) before another is tried (default 600; 0: none)"},
        {"pd", 0, OPT_FLAG, &ro.pd, NULL,
         "prefill/decode disaggregation: --prefill and --decode workers"},
        {"prefill", 0, OPT_STRS, &prefill, "URL", "--pd: a prefill worker (repeatable)"},
        {"decode", 0, OPT_STRS, &decode, "URL", "--pd: a decode worker (repeatable)"},
        {"prefill-policy", 0, OPT_STR, &prefill_policy, "NAME",
         "--pd: how prefill workers are picked (default: cache_aware)"},
        {"decode-policy", 0, OPT_STR, &decode_policy, "NAME",
         "--pd: how decode workers are picked (default: least_load)"},
        {"host", 0, OPT_STR, &ro.host, "ADDR", "IPv4 address to listen on (default 127.0.0.1)"},
        {"port", 0, OPT_INT, &ro.port, "N", "TCP port (default 8000; 0: any free port, printed)"},
        {"api-key", 0, OPT_STRS, &keys, "KEY",
         "require 'Authorization: Bearer KEY' (repeatable); the header is passed on to the workers"},
        {"api-key-file", 0, OPT_STR, &ro.api_key_file, "FILE", "more API keys, one a line"},
        {"shutdown-timeout", 0, OPT_FLOAT, &grace, "S",
         "seconds running requests get after SIGTERM (default 30)"},
        {"max-body", 0, OPT_SIZE, &max_body, "BYTES",
         "request body limit (default 8M; 413 beyond)"},
        {"send-timeout", 0, OPT_FLOAT, &send_timeout, "S",
         "drop a client silent S s while sending, idle or not reading (default 15)"},
        {"max-connections", 0, OPT_INT, &ro.max_connections, "N",
         "client connections held at once (default 1000; 1/16 kept for /health and /metrics)"},
        {"max-connections-per-client", 0, OPT_INT, &ro.max_connections_per_client, "N",
         "connections one client address may hold (default 256; 0: no limit)"},
        {"stream-buffer-size", 0, OPT_SIZE, &stream_buffer, "BYTES",
         "bytes of a stream held for a slow client before the worker's transfer pauses (default 256K)"},
        {"disable-log-requests", 0, OPT_FLAG, &no_log, NULL,
         "no access-log line per request on stderr"},
    };
    const char *pos[1];
    int n_pos = 0;
    int rc =
        cli_parse(argc, argv, "router --worker URL [--worker URL ...] [options]",
                  "An OpenAI-compatible front over `weld serve` workers: /v1/completions, "
                  "/v1/chat/completions,\n/v1/embeddings, /tokenize and /detokenize are "
                  "forwarded (streams relayed as they come), /v1/models\ncomes from a "
                  "healthy worker, /health, /version and /metrics (weld_router:...) are "
                  "the router's.\nUnhealthy workers leave the rotation; a request whose "
                  "worker fails before answering is retried\non another. SIGHUP re-reads "
                  "--worker-file; SIGTERM drains, then exits.\n\n"
                  "  weld serve model.gguf --port 8001 &  weld serve model.gguf --port 8002 &\n"
                  "  weld router --worker http://127.0.0.1:8001 --worker http://127.0.0.1:8002"
                  " --port 8000\n\n"
                  "P/D mode: weld router --pd --prefill URL --decode URL sends each "
                  "completion first to a\nprefill worker (max_tokens 1, "
                  "\"kv_transfer_params\": {\"do_remote_decode\": true}), then the "
                  "request\nwith the kv_transfer_params it answered to a decode worker "
                  "(docs/DESIGN.md).",
                  opts, (int)(sizeof opts / sizeof opts[0]), pos, 0, &n_pos);
    if (rc)
        return rc == 1 ? 0 : 2;
    if ((rc = policy_arg("--policy", policy, &ro.policy)) ||
        (rc = policy_arg("--prefill-policy", prefill_policy, &ro.prefill_policy)) ||
        (rc = policy_arg("--decode-policy", decode_policy, &ro.decode_policy)))
        return rc;
    if (!ro.pd && !workers.n && !ro.worker_file) {
        fprintf(stderr,
                "weld router: no workers: give --worker URL for each `weld serve` "
                "(e.g. --worker http://127.0.0.1:8001) or --worker-file FILE; see --help\n");
        return 2;
    }
    if (ro.pd && !decode.n && !ro.worker_file) {
        fprintf(stderr, "weld router: --pd needs at least one --decode URL (and --prefill URL "
                        "for the prefill side); see --help\n");
        return 2;
    }
    ro.workers = workers.v;
    ro.n_workers = workers.n;
    ro.prefill = prefill.v;
    ro.n_prefill = prefill.n;
    ro.decode = decode.v;
    ro.n_decode = decode.n;
    ro.api_keys = keys.v;
    ro.n_api_keys = keys.n;
    ro.health_interval = interval;
    ro.health_timeout = htimeout;
    ro.cache_threshold = threshold;
    ro.balance_abs = bal_abs;
    ro.balance_rel = bal_rel;
    ro.max_tree_size = (size_t)tree;
    ro.connect_timeout = connect;
    ro.request_timeout = req_timeout;
    ro.shutdown_timeout = grace;
    ro.send_timeout = send_timeout;
    ro.max_body = (size_t)max_body;
    ro.stream_buffer = (size_t)stream_buffer;
    ro.log_requests = !no_log;
    struct weld_err e = {0};
    if (router_run(&ro, &e)) {
        fprintf(stderr, "weld router: %s\n", e.msg);
        return e.status == WELD_ERR_INVALID_ARG ? 2 : 1;
    }
    return 0;
}
