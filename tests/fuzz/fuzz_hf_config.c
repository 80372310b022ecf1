/*
 * fuzz_hf_config - model_config_from_hf_json then model_config_validate on arbitrary bytes.
 *
 * Properties: no crash, no leak, no UB (ASan + UBSan); a config that parses also validates
 * (the reader validates before returning) and survives a to_hf_json -> from_hf_json round
 * trip with the same numbers. Seeds: real config.json files (llama, qwen2, qwen3, mistral).
 */
#include "core/err.h"
#include "model/config.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct model_config c, d;
    struct weld_err e;
    if (model_config_from_hf_json((const char *)data, size, "fuzz.json", &c, &e) != WELD_OK)
        return 0;
    WELD_ASSERT(model_config_validate(&c, "fuzz.json", &e) == WELD_OK);
    json_t *j = model_config_to_hf_json(&c, "float32");
    if (!j)
        return 0;
    char *s = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    if (!s)
        return 0;
    int rc = model_config_from_hf_json(s, strlen(s), "round-trip.json", &d, &e);
    free(s);
    WELD_ASSERT(rc == WELD_OK);
    WELD_ASSERT(d.arch == c.arch && d.dim == c.dim && d.n_layer == c.n_layer &&
                d.n_head == c.n_head && d.n_kv_head == c.n_kv_head &&
                d.head_dim == c.head_dim && d.n_vocab == c.n_vocab &&
                d.ffn_dim == c.ffn_dim && d.max_ctx == c.max_ctx &&
                d.rope_scaling == c.rope_scaling && d.rope_theta == c.rope_theta &&
                d.norm_eps == c.norm_eps && d.tied_embeddings == c.tied_embeddings);
    return 0;
}
