/*
 * kv_transfer - disaggregated prefill's server side, in vLLM's shapes (--kv-transfer-config,
 * kv_transfer_params).
 *
 * A router sends a request to a prefill server with "kv_transfer_params":
 * {"do_remote_decode": true}, max_tokens 1 and stream false. That server (kv_role
 * kv_producer or kv_both) computes the prompt, saves its full KV blocks to the KV tier it
 * shares with the decode servers (--kv-store, or a --kv-offload-dir they share) and waits
 * until they are written (engine request_params.kv_save), then answers as usual plus
 *   "kv_transfer_params": {"do_remote_prefill": true, "do_remote_decode": false,
 *       "remote_engine_id": "<this server>", "remote_num_tokens": N,
 *       "remote_block_hash": "<hex of the last saved block's prefix hash>"}
 * The router sends the original request with that object to a decode server (kv_consumer
 * or kv_both), whose engine finds the blocks in the tier at admission by their prefix
 * hashes, as it would any tier hit: it loads them, registers them in its prefix cache and
 * computes only the rest. Nothing else moves: the handle is what the router and the
 * metrics need, and the hashes make the transfer checkable (another prompt, model or
 * dtype cannot match). If the blocks are gone (evicted from the store), the decode server
 * computes them: same output, counted as kv_transfer tokens expected but not loaded.
 */
#include "server/server.h"

#include <jansson.h>
#include <string.h>

int server_kv_transfer_config(const char *text, enum server_kv_role *role, struct weld_err *e)
{
    *role = SERVER_KV_NONE;
    json_error_t je;
    json_t *j = json_loads(text, 0, &je);
    if (!j || !json_is_object(j)) {
        json_decref(j);
        return err_set(e, WELD_ERR_INVALID_ARG,
                       "--kv-transfer-config: expected a JSON object like "
                       "'{\"kv_role\": \"kv_producer\"}' (%s)",
                       j ? "not an object" : je.text);
    }
    int rc = WELD_OK;
    const char *key;
    json_t *v;
    json_object_foreach(j, key, v)
    {
        if (!strcmp(key, "kv_role")) {
            const char *s = json_string_value(v);
            if (s && !strcmp(s, "kv_producer"))
                *role = SERVER_KV_PRODUCER;
            else if (s && !strcmp(s, "kv_consumer"))
                *role = SERVER_KV_CONSUMER;
            else if (s && !strcmp(s, "kv_both"))
                *role = SERVER_KV_BOTH;
            else
                rc = err_set(e, WELD_ERR_INVALID_ARG,
                             "--kv-transfer-config: kv_role: expected "
                             "\"kv_producer\", \"kv_consumer\" or \"kv_both\"");
        } else if (!strcmp(key, "kv_connector")) {
            const char *s = json_string_value(v);
            if (!s || (strcmp(s, "weld") && strcmp(s, "WeldConnector")))
                rc = err_set(e, WELD_ERR_UNSUPPORTED,
                             "--kv-transfer-config: kv_connector "
                             "'%s': weld moves blocks through its KV tier (\"weld\", the "
                             "default); give --kv-store for a store the workers share",
                             s ? s : "?");
        } else if (strcmp(key, "kv_connector_extra_config") && strcmp(key, "engine_id") &&
                   strcmp(key, "kv_buffer_device") && strcmp(key, "kv_rank") &&
                   strcmp(key, "kv_parallel_size")) {
            rc = err_set(e, WELD_ERR_INVALID_ARG,
                         "--kv-transfer-config: unknown key '%s' "
                         "(known: kv_role, kv_connector)",
                         key);
        }
        if (rc)
            break;
    }
    if (!rc && *role == SERVER_KV_NONE)
        rc = err_set(e, WELD_ERR_INVALID_ARG, "--kv-transfer-config: kv_role is required");
    json_decref(j);
    return rc;
}
