/*
 * cmd_mkmodel - `weld mkmodel`: write a random-weight model at a preset or explicit shape,
 * with a real tokenizer, as a GGUF file or a Hugging Face directory (model/mkmodel.h does
 * the work; this file only maps options onto a struct model_config).
 *
 * Explicit dimensions override the preset's; without a preset, --dim, --layers and
 * --heads are required and the vocabulary comes from the tokenizer (or --vocab).
 */
#include "cli/cli.h"
#include "core/err.h"
#include "format/dtype.h"
#include "model/config.h"
#include "model/mkmodel.h"

#include <stdio.h>
#include <string.h>

struct mk_args {
    const char *arch, *preset, *tokenizer, *dtype, *out, *name, *rope_scaling;
    int dim, layers, heads, kv_heads, head_dim, ffn, vocab, ctx, rope_orig_ctx, nextn;
    bool tied, untied;
    float theta, eps, rope_factor, rope_low, rope_high;
    uint64_t seed;
};

static void apply_dims(const struct mk_args *a, struct model_config *c)
{
    if (a->dim) c->dim = a->dim;
    if (a->layers) c->n_layer = a->layers;
    if (a->heads) c->n_head = a->heads;
    if (a->kv_heads) c->n_kv_head = a->kv_heads;
    if (a->head_dim) c->head_dim = a->head_dim, c->rope_dim = a->head_dim;
    if (a->ffn) c->ffn_dim = a->ffn;
    if (a->vocab) c->n_vocab = a->vocab;
    if (a->ctx) c->max_ctx = a->ctx;
    if (a->theta > 0) c->rope_theta = a->theta;
    if (a->eps > 0) c->norm_eps = a->eps;
    if (a->tied) c->tied_embeddings = true;
    if (a->untied) c->tied_embeddings = false;
    if (a->name) snprintf(c->name, sizeof c->name, "%s", a->name);
    if (a->rope_factor > 0) c->rope_factor = a->rope_factor;
    if (a->rope_low > 0) c->rope_low_freq_factor = a->rope_low;
    if (a->rope_high > 0) c->rope_high_freq_factor = a->rope_high;
    if (a->rope_orig_ctx) c->rope_orig_ctx = a->rope_orig_ctx;
}

/* --rope-scaling: none, or llama3 with Llama 3.2's factors unless given. */
static int apply_rope_scaling(const struct mk_args *a, struct model_config *c)
{
    if (!a->rope_scaling)
        return 0;
    if (!strcmp(a->rope_scaling, "none")) {
        c->rope_scaling = ROPE_SCALING_NONE;
        return 0;
    }
    if (strcmp(a->rope_scaling, "llama3") != 0) {
        fprintf(stderr, "weld mkmodel: --rope-scaling '%s' is not one of none, llama3\n",
                a->rope_scaling);
        return 2;
    }
    if (c->arch != ARCH_LLAMA) {
        fprintf(stderr, "weld mkmodel: --rope-scaling llama3 needs --arch llama\n");
        return 2;
    }
    c->rope_scaling = ROPE_SCALING_LLAMA3;
    c->rope_factor = a->rope_factor > 0 ? a->rope_factor : 32.0f;
    c->rope_low_freq_factor = a->rope_low > 0 ? a->rope_low : 1.0f;
    c->rope_high_freq_factor = a->rope_high > 0 ? a->rope_high : 4.0f;
    c->rope_orig_ctx = a->rope_orig_ctx ? a->rope_orig_ctx : 8192;
    return 0;
}

/* --arch: GGUF arch names plus the family names people type. */
static int parse_arch(const char *name, bool *mixtral)
{
    static const struct {
        const char *name;
        enum model_arch arch;
    } alias[] = {{"qwen3-moe", ARCH_QWEN3MOE},
                 {"qwen2-moe", ARCH_QWEN2MOE},
                 {"deepseek-v3", ARCH_DEEPSEEK2},
                 {"deepseek", ARCH_DEEPSEEK2},
                 {"mixtral", ARCH_LLAMA}};
    *mixtral = !strcmp(name, "mixtral");
    for (size_t i = 0; i < sizeof alias / sizeof alias[0]; i++)
        if (!strcmp(name, alias[i].name))
            return (int)alias[i].arch;
    return model_arch_from_name(name);
}

static int build_config(const struct mk_args *a, struct model_config *c)
{
    bool mixtral;
    int arch = parse_arch(a->arch, &mixtral);
    struct weld_err e = {0};
    if (arch < 0) {
        fprintf(stderr,
                "weld mkmodel: --arch '%s' is not one of llama, qwen2, qwen3, "
                "qwen3-moe, qwen2-moe, mixtral, deepseek-v3\n",
                a->arch);
        return 2;
    }
    if (mixtral && !a->preset) {
        fprintf(stderr, "weld mkmodel: --arch mixtral needs --preset tiny\n");
        return 2;
    }
    if (a->preset) {
        const char *preset = mixtral && !strcmp(a->preset, "tiny") ? "mixtral-tiny" : a->preset;
        if (mkmodel_preset(preset, (enum model_arch)arch, c, &e)) {
            fprintf(stderr, "weld mkmodel: %s\n", e.msg);
            return 2;
        }
    } else {
        if (!a->dim || !a->layers || !a->heads) {
            fprintf(stderr, "weld mkmodel: give --preset NAME, or at least --dim, --layers and "
                            "--heads\n");
            return 2;
        }
        memset(c, 0, sizeof *c);
        c->arch = (enum model_arch)arch;
        snprintf(c->name, sizeof c->name, "weld-mkmodel");
    }
    apply_dims(a, c);
    if (apply_rope_scaling(a, c))
        return 2;
    /* Recomputed as dim / heads; MLA's head and rope sizes do not follow dim. */
    if (a->preset && (a->dim || a->heads) && !a->head_dim && c->arch != ARCH_DEEPSEEK2)
        c->head_dim = 0, c->rope_dim = 0;
    if (a->preset && a->heads && !a->kv_heads)
        c->n_kv_head = 0;
    if (a->nextn) {
        if (c->arch != ARCH_DEEPSEEK2 || a->nextn < 0 || a->nextn > 16) {
            fprintf(stderr,
                    "weld mkmodel: --nextn %d: multi-token-prediction layers are "
                    "DeepSeek's (--arch deepseek-v3), 1 to 16 of them\n",
                    a->nextn);
            return 2;
        }
        c->n_nextn = a->nextn;
    }
    mkmodel_config_defaults(c);
    return 0;
}

int cmd_mkmodel(int argc, char **argv)
{
    struct mk_args a = {.arch = "llama", .dtype = "f32"};
    const struct cli_opt opts[] = {
        {"arch", 0, OPT_STR, &a.arch, "NAME",
         "llama, qwen2, qwen3, qwen3-moe, qwen2-moe, mixtral or deepseek-v3 (default llama)"},
        {"preset", 0, OPT_STR, &a.preset, "NAME",
         "tiny, llama-110m, llama-3.2-1b, qwen3-0.6b, qwen2-0.5b, qwen3-moe-1b, "
         "deepseek-moe-1b"},
        {"dim", 0, OPT_INT, &a.dim, "N", "hidden size"},
        {"layers", 0, OPT_INT, &a.layers, "N", "number of layers"},
        {"heads", 0, OPT_INT, &a.heads, "N", "attention heads"},
        {"kv-heads", 0, OPT_INT, &a.kv_heads, "N", "key/value heads (default = heads)"},
        {"head-dim", 0, OPT_INT, &a.head_dim, "N", "per-head size (default dim/heads)"},
        {"ffn", 0, OPT_INT, &a.ffn, "N", "feed-forward size (default 4*dim)"},
        {"vocab", 0, OPT_INT, &a.vocab, "N", "vocabulary size (default: the tokenizer's)"},
        {"ctx", 0, OPT_INT, &a.ctx, "N", "context length (default 2048)"},
        {"rope-theta", 0, OPT_FLOAT, &a.theta, "F", "rope base (default 1e4 llama, 1e6 qwen)"},
        {"rope-scaling", 0, OPT_STR, &a.rope_scaling, "NAME",
         "none or llama3 (factors default to Llama 3.2's: 32, 1, 4, 8192)"},
        {"rope-factor", 0, OPT_FLOAT, &a.rope_factor, "F", "llama3 rope scaling factor"},
        {"rope-low-freq", 0, OPT_FLOAT, &a.rope_low, "F", "llama3 low_freq_factor"},
        {"rope-high-freq", 0, OPT_FLOAT, &a.rope_high, "F", "llama3 high_freq_factor"},
        {"rope-orig-ctx", 0, OPT_INT, &a.rope_orig_ctx, "N",
         "llama3 original_max_position_embeddings"},
        {"eps", 0, OPT_FLOAT, &a.eps, "F", "RMSNorm epsilon"},
        {"nextn", 0, OPT_INT, &a.nextn, "N",
         "deepseek-v3: N multi-token-prediction (MTP) layers after the others; HF output "
         "only (a GGUF gets none, as from llama.cpp's converter)"},
        {"tied", 0, OPT_FLAG, &a.tied, NULL, "tie output and embedding weights"},
        {"untied", 0, OPT_FLAG, &a.untied, NULL, "separate output weights"},
        {"tokenizer", 't', OPT_STR, &a.tokenizer, "PATH", "tokenizer.json or its directory"},
        {"dtype", 0, OPT_STR, &a.dtype, "T",
         "f32, f16, bf16, q4_0, q4_1, q5_0, q5_1, q8_0, q4_K, q5_K, q6_K (default f32)"},
        {"seed", 0, OPT_U64, &a.seed, "S", "random seed (default 0)"},
        {"name", 0, OPT_STR, &a.name, "NAME", "general.name / _name_or_path"},
        {"out", 'o', OPT_STR, &a.out, "PATH", "output: FILE.gguf or an HF directory"},
    };
    int n_pos = 0;
    int r = cli_parse(argc, argv, "mkmodel --preset NAME | --dim N --layers N --heads N ... "
                      "--tokenizer PATH --out PATH",
                      "Write a model with random weights (N(0, 0.02), norms 1) at a real "
                      "model's shape.\nThe same --seed gives the same weights in GGUF and HF "
                      "output.", opts, (int)(sizeof opts / sizeof opts[0]), NULL, 0, &n_pos);
    if (r)
        return r == 1 ? 0 : 2;
    if (!a.out) {
        fprintf(stderr, "weld mkmodel: --out PATH is required (FILE.gguf or a directory)\n");
        return 2;
    }
    struct model_config c;
    if ((r = build_config(&a, &c)))
        return r;
    if (!a.tokenizer && c.n_vocab <= 0) {
        fprintf(stderr, "weld mkmodel: no vocabulary: give --tokenizer PATH (a tokenizer.json "
                        "or its directory; the model takes its vocabulary), or --vocab N for "
                        "a model without a tokenizer\n");
        return 2;
    }
    int dt = dtype_from_name(a.dtype);
    if (dt < 0) {
        fprintf(stderr, "weld mkmodel: --dtype '%s' is not a known type\n", a.dtype);
        return 2;
    }
    struct mkmodel_opts o = {a.tokenizer, dt, a.seed, a.out};
    struct weld_err e = {0};
    if (mkmodel_write(&c, &o, &e)) {
        const char *msg = !strncmp(e.msg, "mkmodel: ", 9) ? e.msg + 9 : e.msg;
        fprintf(stderr, "weld mkmodel: %s\n", msg);
        return 1;
    }
    fprintf(stderr, "wrote %s (%s, dim %d, %d layers, %d heads, %d kv heads, ffn %d", a.out,
            model_arch_name(c.arch), c.dim, c.n_layer, c.n_head, c.n_kv_head, c.ffn_dim);
    if (c.n_expert)
        fprintf(stderr, ", %d experts (%d used) of %d", c.n_expert, c.n_expert_used, c.moe_ffn_dim);
    fprintf(stderr, ")\n");
    return 0;
}
