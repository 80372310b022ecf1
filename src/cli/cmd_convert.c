/*
 * cmd_convert - `weld convert IN OUT`: GGUF <-> Hugging Face directory, quantization and
 * dtype changes (model/convert.h does the work, for every architecture weld loads, sparse
 * ones included). OUT ending in .gguf makes a GGUF file, anything else a directory.
 */
#include "cli/cli.h"
#include "core/err.h"
#include "format/dtype.h"
#include "model/convert.h"

#include <stdio.h>
#include <string.h>

int cmd_convert(int argc, char **argv)
{
    const char *dtype = NULL;
    uint64_t shard = 0;
    const struct cli_opt opts[] = {
        {"dtype", 0, OPT_STR, &dtype, "T",
         "f32|f16|bf16|q8_0|q4_0|q4_1|q5_0|q5_1|q4_K|q5_K|q6_K (default: keep; f32 for "
         "quantized GGUF -> HF)"},
        {"shard-size", 0, OPT_SIZE, &shard, "BYTES",
         "HF output: split safetensors into shards of at most BYTES (default: one file)"},
    };
    const char *pos[2];
    int n_pos = 0;
    int r = cli_parse(argc, argv, "convert IN OUT [--dtype T] [--shard-size BYTES]",
                      "Convert a model between GGUF (OUT ends in .gguf) and a Hugging Face "
                      "directory,\nor quantize / change its type, as llama.cpp's converter "
                      "writes GGUF: Llama Q/K rows permuted,\nexperts stacked per layer "
                      "(Qwen MoE, Mixtral, DeepSeek), MLA kv_b_proj split into attn_k_b / "
                      "attn_v_b,\nmulti-token-prediction layers dropped.",
                      opts, (int)(sizeof opts / sizeof opts[0]), pos, 2, &n_pos);
    if (r)
        return r == 1 ? 0 : 2;
    if (n_pos != 2) {
        fprintf(stderr, "weld convert: expected IN and OUT (see weld convert --help)\n");
        return 2;
    }
    struct convert_opts o = {-1, shard};
    if (dtype) {
        o.dtype = dtype_from_name(dtype);
        const struct dtype_info *di = o.dtype >= 0 ? dtype_get(o.dtype) : NULL;
        if (!di || (di->quantized && !di->can_quantize) ||
            (!di->quantized && o.dtype != DT_F32 && o.dtype != DT_F16 && o.dtype != DT_BF16)) {
            char list[256] = "f32, f16, bf16"; /* then every type weld can quantize to */
            for (int t = 0; t < DT_COUNT; t++) {
                const struct dtype_info *q = dtype_get(t);
                if (q && q->quantized && q->can_quantize)
                    snprintf(list + strlen(list), sizeof list - strlen(list), ", %s", q->name);
            }
            fprintf(stderr, "weld convert: --dtype '%s' is not a type weld can write; use one "
                            "of %s\n", dtype, list);
            return 2;
        }
    }
    struct weld_err e = {0};
    if (convert_model(pos[0], pos[1], &o, &e)) {
        const char *msg = !strncmp(e.msg, "convert: ", 9) ? e.msg + 9 : e.msg;
        fprintf(stderr, "weld convert: %s\n", msg);
        return 1;
    }
    fprintf(stderr, "wrote %s\n", pos[1]);
    return 0;
}
